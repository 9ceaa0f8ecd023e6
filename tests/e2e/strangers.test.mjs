// Strangers cannot starve honest callers (spec/access.md section 3b), without API keys:
// - limits count what is done: an array settle under server.client_rate_per_sec is charged one
//   token per element, and elements beyond the tokens answer {error: 429} in their slots, unsent;
// - behind a reverse proxy listed in server.trusted_proxies the client is the address it
//   forwarded (X-Forwarded-For, Forwarded); the same headers from any other peer are ignored;
// - keys are the caller's: another client address cannot occupy a merchant's Idempotency-Key.
// Clients are told apart by their loopback source address (127.0.0.1, 127.0.0.2, 127.0.0.3).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { expectSettled, show } from './lib/expect.mjs';
import { idempotencyKey } from './lib/util.mjs';

const PROXY = '127.0.0.2';
const STRANGER = '127.0.0.3';
const BURST = 3;

let stack;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    routerd: {
      serverExtra: `client_rate_per_sec = 1\nclient_burst = ${BURST}\ntrusted_proxies = ["${PROXY}/32"]\n`,
    },
  });
});

after(() => stack?.stop());

/** One request to routerd from the loopback address `localAddress`: {status, body, text}. */
function requestFrom(localAddress, path, { method = 'GET', body, headers = {} } = {}) {
  const url = new URL(stack.url);
  const raw = body === undefined ? undefined : (typeof body === 'string' ? body : JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: url.hostname, port: url.port, path, method, localAddress, agent: false,
      headers: { ...(raw ? { 'content-type': 'application/json' } : {}), ...headers },
    }, (res) => {
      let text = '';
      res.on('data', (c) => { text += c; });
      res.on('end', () => {
        let parsed;
        try { parsed = JSON.parse(text); } catch { parsed = undefined; }
        resolve({ status: res.statusCode, body: parsed, text, headers: res.headers });
      });
    });
    req.on('error', reject);
    req.end(raw);
  });
}

/** `n` quick GET /supported from `localAddress` with `headers`: their statuses. */
async function statuses(localAddress, n, headers = {}) {
  const out = [];
  for (let i = 0; i < n; i += 1) out.push((await requestFrom(localAddress, '/supported', { headers })).status);
  return out;
}

it('an array settle is charged one token per element: beyond the burst, elements answer {error: 429} in their slots and nothing is sent for them', async () => {
  const payer = await stack.newPayer(10_000n);
  const payments = [];
  for (let i = 0; i < BURST + 2; i += 1) payments.push(await stack.pay({ account: payer, amount: 1000n }));
  const nonce = await stack.signerNonce('pending');
  // A client of its own, with a full bucket.
  const res = await requestFrom('127.0.0.4', '/settle', { method: 'POST', body: payments.map((p) => p.body) });
  assert.equal(res.status, 200, show(res));
  assert.equal(res.body.length, BURST + 2, show(res));
  for (let i = 0; i < BURST; i += 1) expectSettled({ status: 200, body: res.body[i] }, { network: NETWORK, payer: payer.address });
  for (const slot of res.body.slice(BURST)) assert.equal(slot.error, 429, show(res));
  assert.equal(await stack.signerNonce('pending'), nonce + BURST, 'only the admitted elements were sent');
  assert.equal(await stack.balanceOf(payer.address), 10_000n - BigInt(BURST) * 1000n);
  for (const p of payments.slice(BURST)) assert.equal((await stack.settlementStatus(p)).status, 404, 'refused elements claim nothing');
});

it('through a trusted proxy the forwarded address is the client; the same header from another peer is ignored', async () => {
  // The proxy forwards for 198.51.100.7 until that client is over its rate ...
  const a = await statuses(PROXY, BURST + 2, { 'x-forwarded-for': '198.51.100.7' });
  assert.ok(a.includes(429), `the forwarded client is limited: ${a}`);
  // ... which leaves another client behind the same proxy its own bucket (Forwarded: for= too).
  assert.deepEqual(await statuses(PROXY, 1, { 'x-forwarded-for': '198.51.100.8' }), [200]);
  assert.deepEqual(await statuses(PROXY, 1, { forwarded: 'for="[2001:db8::9]:4711"' }), [200]);
  // A stranger's own forwarding header changes nothing: it is counted by its own address.
  const s = await statuses(STRANGER, BURST + 2, { 'x-forwarded-for': '203.0.113.1' });
  assert.ok(s.includes(429), `the stranger is limited: ${s}`);
  assert.deepEqual(await statuses(STRANGER, 1, { 'x-forwarded-for': '203.0.113.2' }), [429], 'a made-up address buys no fresh bucket');
});

it("another client cannot occupy a merchant's Idempotency-Key", async () => {
  const key = idempotencyKey();
  const stranger = await stack.pay({ account: await stack.newPayer(1000n), amount: 1000n });
  const mine = await stack.pay({ account: await stack.newPayer(1000n), amount: 1000n });
  const who = (p) => ({ network: NETWORK, payer: p.authorization.from });
  // The stranger settles its own payment first, under the merchant's key (from 127.0.0.5).
  expectSettled(await requestFrom('127.0.0.5', '/settle', { method: 'POST', body: stranger.body, headers: { 'idempotency-key': key } }), who(stranger));
  // The merchant's settle under that key is its own: settled, and its retry gets its answer.
  const hash = expectSettled(await requestFrom('127.0.0.6', '/settle', { method: 'POST', body: mine.body, headers: { 'idempotency-key': key } }), who(mine));
  const retry = await requestFrom('127.0.0.6', '/settle', { method: 'POST', body: mine.body, headers: { 'idempotency-key': key } });
  assert.equal(expectSettled(retry, who(mine)), hash);
});

it('oversized bodies are refused clearly and routerd stays up: JSON nested 10,000 deep, a settle array over max_batch, a JSON-RPC batch over 100 calls', async () => {
  const post = (path, body) => requestFrom('127.0.0.7', path, { method: 'POST', body });
  const deep = `${'['.repeat(10_000)}${']'.repeat(10_000)}`;
  for (const path of ['/verify', '/settle']) {
    const res = await post(path, deep);
    assert.equal(res.status, 400, show(res));
    assert.match(res.body?.message ?? '', /recursion limit/, show(res));
  }
  const array = await post('/settle', JSON.stringify(Array.from({ length: 101 }, () => ({}))));
  assert.equal(array.status, 400, show(array));
  assert.match(array.body?.message ?? '', /facilitator\.max_batch/, show(array));
  // Another client address: the first one spent its tokens above.
  const batch = await requestFrom('127.0.0.8', '/', { method: 'POST', body: Array.from({ length: 101 }, (_, i) => ({ jsonrpc: '2.0', id: i, method: 'router_chains' })) });
  assert.ok(batch.status === 429 || batch.body?.error?.message === 'The batch request was too large', show(batch));
  assert.equal((await requestFrom('127.0.0.9', '/health')).status, 200, 'routerd is up');
});
