// Router reservations belong to their caller (spec/access.md section 6) and slow clients are cut
// off (section 7). Without API keys a caller is its client address: these tests speak from
// 127.0.0.1 and 127.0.0.2, both loopback.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { startRouterStack, routerTx, withRouterLogTail } from './lib/router-stack.mjs';
import { freshAccount } from './lib/accounts.mjs';

const MAX_AHEAD = 5;
const READ_TIMEOUT_MS = 1000;
const IDLE_TIMEOUT_SECS = 4;

let stack;
const it = (name, fn) => test(name, { timeout: 60_000 }, withRouterLogTail(() => stack, fn));

before(async () => {
  stack = await startRouterStack({ router: { maxReservationsAhead: MAX_AHEAD, requestReadTimeoutMs: READ_TIMEOUT_MS, idleTimeoutSecs: IDLE_TIMEOUT_SECS } });
});
after(() => stack?.stop());

/** eth_routerTransaction sent from `localAddress`; answers the JSON-RPC envelope. */
function routeFrom(localAddress, tx) {
  const url = new URL(stack.routerd.url);
  const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'eth_routerTransaction', params: [tx] });
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: url.hostname, port: url.port, path: '/', method: 'POST', localAddress, agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    }, (res) => {
      let text = '';
      res.on('data', (chunk) => { text += chunk; });
      res.on('end', () => resolve(JSON.parse(text)));
    });
    req.on('error', reject);
    req.end(body);
  });
}

const nonceOf = (envelope) => {
  assert.ok(envelope.result, JSON.stringify(envelope));
  return Number(BigInt(envelope.result.nonce));
};

it('another caller\'s 20 calls naming my address do not move the nonce I am told', async () => {
  const sender = await stack.newSender();
  const tx = () => routerTx({ from: sender.address, to: freshAccount().address });
  for (let i = 0; i < 20; i += 1) await routeFrom('127.0.0.2', tx());
  const mine = [await routeFrom('127.0.0.1', tx()), await routeFrom('127.0.0.1', tx())];
  assert.deepEqual(mine.map(nonceOf), [0, 1], 'my answers start from the chain\'s pending nonce, consecutive');
});

it('one caller runs at most max_reservations_ahead past the pending nonce; the next call says so', async () => {
  const sender = await stack.newSender();
  const tx = () => routerTx({ from: sender.address, to: freshAccount().address });
  const handed = [];
  for (let i = 0; i < MAX_AHEAD; i += 1) handed.push(nonceOf(await routeFrom('127.0.0.1', tx())));
  assert.deepEqual(handed, [0, 1, 2, 3, 4]);
  const refused = await routeFrom('127.0.0.1', tx());
  assert.equal(refused.error?.code, -32005, JSON.stringify(refused));
  assert.match(refused.error.message, /max_reservations_ahead/);
  // Another caller is not held back by it.
  assert.equal(nonceOf(await routeFrom('127.0.0.2', tx())), 0);
});

/** Opens a connection, writes `prefix`, and waits until the server closes it (or `limitMs`). */
function stallAfter(prefix, limitMs) {
  const url = new URL(stack.routerd.url);
  return new Promise((resolve) => {
    const socket = net.connect(Number(url.port), url.hostname, () => socket.write(prefix));
    let answer = '';
    socket.on('data', (chunk) => { answer += chunk; });
    const timer = setTimeout(() => { socket.destroy(); resolve({ closed: false, answer }); }, limitMs);
    socket.on('close', () => { clearTimeout(timer); resolve({ closed: true, answer }); });
    socket.on('error', () => {});
  });
}

it('a client that stalls its body, or its headers, is cut off while others are served', async () => {
  const sender = await stack.newSender();
  const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'router_chains' });
  const stalls = [
    stallAfter(`POST / HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length + 50}\r\n\r\n${body}`, 15_000),
    stallAfter('POST / HTTP/1.1\r\nhost: x\r\ncontent-', 15_000),
    stallAfter('', 15_000),
  ];
  // Meanwhile the daemon answers others.
  assert.equal(nonceOf(await routeFrom('127.0.0.1', routerTx({ from: sender.address, to: freshAccount().address }))), 0);
  const [bodyStall, headerStall, silent] = await Promise.all(stalls);
  assert.ok(bodyStall.closed, 'a stalled body keeps its connection');
  assert.match(bodyStall.answer, /^HTTP\/1\.1 408/, bodyStall.answer);
  assert.ok(headerStall.closed, 'stalled headers keep their connection');
  assert.ok(silent.closed, 'a connection that never sends a request is kept');
});

/** Sends `GET /health` on `socket` and resolves with the answer's status line. */
function health(socket) {
  return new Promise((resolve, reject) => {
    socket.once('data', (chunk) => resolve(String(chunk).split('\r\n')[0]));
    socket.once('error', reject);
    socket.write('GET /health HTTP/1.1\r\nhost: x\r\n\r\n');
  });
}

it('a keep-alive connection outlives the read timeout between requests, then closes when idle', async () => {
  const url = new URL(stack.routerd.url);
  const socket = net.connect(Number(url.port), url.hostname);
  await new Promise((resolve) => socket.once('connect', resolve));
  const closed = new Promise((resolve) => socket.once('close', () => resolve(true)));
  assert.match(await health(socket), /^HTTP\/1\.1 200/);
  // Quiet for three read timeouts: a quiet client is not a slow one.
  await new Promise((resolve) => setTimeout(resolve, 3 * READ_TIMEOUT_MS));
  assert.match(await health(socket), /^HTTP\/1\.1 200/, 'closed before server.idle_timeout_secs');
  const limit = new Promise((resolve) => setTimeout(() => resolve(false), 15_000));
  assert.ok(await Promise.race([closed, limit]), 'an idle connection is never closed');
  socket.destroy();
});
