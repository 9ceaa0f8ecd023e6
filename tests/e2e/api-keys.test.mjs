// API keys (spec/access.md section 5): with [auth] api_keys_file, every route but GET /supported
// and GET /health needs a known bearer token (401), a key scoped to payTo addresses is refused
// others (403, in an array's slot), a key over its rate gets 429 with Retry-After and is served
// again once the bucket refills, SIGHUP reads the file again, and a bad file stops the start.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { startFacilitatorStack, withLogTail } from './lib/stack.mjs';
import { routerdBin } from './lib/routerd.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { sleep } from './lib/util.mjs';

const SHOP = 'token-of-shop-a';
const LIMITED = 'token-of-limited';
const OPEN = 'token-of-any-payto';
const sha = (token) => createHash('sha256').update(token).digest('hex');
const bearer = (token) => ({ authorization: `Bearer ${token}` });

let stack;
let keysFile;
let shopPayTo;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

function keysToml(extra = '') {
  return `[keys.shop-a]\nsha256 = "${sha(SHOP)}"\npay_to = ["${shopPayTo}"]\n\n`
    + `[keys.limited]\nsha256 = "${sha(LIMITED)}"\nrate_per_sec = 1\nburst = 3\n\n`
    + `[keys.open]\nsha256 = "${sha(OPEN)}"\n${extra}`;
}

before(async () => {
  shopPayTo = freshAccount().address;
  stack = await startFacilitatorStack({ fundedPayers: 4 });
  keysFile = join(stack.tmp.dir, 'api-keys.toml');
  writeFileSync(keysFile, keysToml());
  stack.reconfigure({ routerdOpts: { extra: `[auth]\napi_keys_file = ${JSON.stringify(keysFile)}\n` } });
  await stack.routerd.restart();
});

after(() => stack?.stop());

/** A payment to `payTo` from one of the funded payers. */
async function payment(payTo, i = 0) {
  return stack.pay({ account: stack.payers[i], payTo });
}

it('open routes answer without a key; every other route answers 401 without one or with an unknown one', async () => {
  assert.equal((await stack.request('/health')).status, 200);
  assert.equal((await stack.request('/supported')).status, 200);
  const p = await payment(shopPayTo);
  for (const headers of [{}, bearer('not-a-key'), { authorization: `Basic ${SHOP}` }]) {
    for (const [path, body] of [['/verify', p.body], ['/settle', p.body], ['/', { jsonrpc: '2.0', id: 1, method: 'router_chains' }]]) {
      const res = await stack.post(path, body, { headers });
      assert.equal(res.status, 401, `${path} with ${JSON.stringify(headers)}: ${res.text}`);
      assert.equal(res.body.error, 401);
    }
    for (const path of ['/ready', '/metrics', `/settlements/${p.payload.network}/${p.requirements.asset}/${p.authorization.from}/${p.authorization.nonce}`]) {
      assert.equal((await stack.request(path, { headers })).status, 401, path);
    }
  }
  assert.equal((await stack.request('/metrics', { headers: bearer(OPEN) })).status, 200);
});

it('a key verifies and settles for its payTo; another payTo is 403, and in an array only that slot', async () => {
  const mine = await payment(shopPayTo, 1);
  const verified = await stack.post('/verify', mine.body, { headers: bearer(SHOP) });
  assert.equal(verified.status, 200, verified.text);
  assert.equal(verified.body.isValid, true, verified.text);
  const other = await payment(freshAccount().address, 1);
  const refused = await stack.post('/verify', other.body, { headers: bearer(SHOP) });
  assert.deepEqual([refused.status, refused.body.error], [403, 403], refused.text);
  const nonce = await stack.signerNonce('pending');
  const single = await stack.post('/settle', other.body, { headers: bearer(SHOP) });
  assert.deepEqual([single.status, single.body.error], [403, 403], single.text);
  assert.equal(await stack.signerNonce('pending'), nonce, 'nothing sent for a refused payTo');

  const array = await stack.post('/settle', [mine.body, other.body], { headers: bearer(SHOP) });
  assert.equal(array.status, 200, array.text);
  assert.equal(array.body[0].success, true, array.text);
  assert.equal(array.body[1].error, 403, array.text);
  // A key without a payTo list settles for anyone.
  const open = await stack.post('/settle', other.body, { headers: bearer(OPEN) });
  assert.equal(open.body.success, true, open.text);
});

it('a burst over a key\'s rate gets 429 with Retry-After; a second later the key is served again', async () => {
  const call = () => stack.post('/', { jsonrpc: '2.0', id: 1, method: 'router_chains' }, { headers: bearer(LIMITED) });
  const answers = await Promise.all(Array.from({ length: 6 }, call));
  const limited = answers.filter((a) => a.status === 429);
  // Burst 3 of 6 at once: 3 refused (2 if a second passed meanwhile and a token came back).
  assert.ok(limited.length === 3 || limited.length === 2, `burst 3 of 6: ${answers.map((a) => a.status)}`);
  for (const a of limited) {
    assert.equal(a.body.error, 429);
    assert.ok(Number(a.headers.get('retry-after')) >= 1, 'Retry-After in seconds');
  }
  // A JSON-RPC batch counts each entry: four entries are over a burst of three.
  await sleep(3_500);
  const batch = Array.from({ length: 4 }, (_, i) => ({ jsonrpc: '2.0', id: i, method: 'router_chains' }));
  assert.equal((await stack.post('/', batch, { headers: bearer(LIMITED) })).status, 429);
  await sleep(1_100);
  assert.notEqual((await call()).status, 429, 'the bucket refilled');
  // Other keys have buckets of their own.
  assert.notEqual((await stack.post('/', { jsonrpc: '2.0', id: 1, method: 'router_chains' }, { headers: bearer(OPEN) })).status, 429);
});

it('the key\'s name, never its token, is in the request log and the metric label', async () => {
  const p = await payment(shopPayTo, 2);
  await stack.post('/verify', p.body, { headers: bearer(SHOP) });
  const log = stack.routerd.tail(400);
  assert.match(log, /key="?shop-a/);
  for (const token of [SHOP, LIMITED, OPEN]) assert.ok(!log.includes(token), 'a token in the log');
  const metrics = (await stack.request('/metrics', { headers: bearer(OPEN) })).text;
  assert.match(metrics, /routerd_http_requests_total\{[^}]*key="shop-a"[^}]*\} \d+/);
  for (const token of [SHOP, LIMITED, OPEN]) assert.ok(!metrics.includes(token), 'a token in /metrics');
});

it('SIGHUP reads the keys file again; a bad file then keeps the keys in use', async () => {
  const NEW = 'token-added-later';
  writeFileSync(keysFile, keysToml(`\n[keys.later]\nsha256 = "${sha(NEW)}"\n`));
  const chains = () => stack.post('/', { jsonrpc: '2.0', id: 1, method: 'router_chains' }, { headers: bearer(NEW) });
  assert.equal((await chains()).status, 401);
  stack.routerd.child.kill('SIGHUP');
  await waitStatus(chains, 200);
  writeFileSync(keysFile, 'this is [not toml');
  stack.routerd.child.kill('SIGHUP');
  await sleep(500);
  assert.equal((await chains()).status, 200, 'the keys in use stay');
  assert.ok(stack.routerd.running);
});

it('a bad keys file stops the start with exit 2, naming the entry', async () => {
  const bad = join(stack.tmp.dir, 'bad-keys.toml');
  writeFileSync(bad, '[keys.broken]\nsha256 = "abc"\n');
  const config = join(stack.tmp.dir, 'bad.toml');
  writeFileSync(config, stack.configToml({ routerdOpts: { extra: `[auth]\napi_keys_file = ${JSON.stringify(bad)}\n` } })
    .replace(/listen = "127\.0\.0\.1:\d+"/, 'listen = "127.0.0.1:0"'));
  const run = spawnSync(routerdBin(), ['--config', config], {
    env: { ...process.env, ROUTERD_SIGNER_KEY: stack.signerKey }, encoding: 'utf8', timeout: 30_000,
  });
  assert.equal(run.status, 2, run.stderr + run.stdout);
  assert.match(run.stderr + run.stdout, /keys\.broken\.sha256/);
});

async function waitStatus(call, status) {
  for (let i = 0; i < 50; i += 1) {
    if ((await call()).status === status) return;
    await sleep(100);
  }
  assert.fail(`no ${status} after SIGHUP`);
}
