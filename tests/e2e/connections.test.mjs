// Connections are bounded (spec/access.md section 3b), with the default configuration and routerd
// under an open-file limit of 1,024 (a shell's default): a stranger at 127.0.0.3 holds 1,000 idle
// connections and floods /verify with failing payments while a merchant settles 20 payments from
// 127.0.0.1 and /health is probed. Every honest settle succeeds, every /health probe is answered,
// and routerd's store never runs out of descriptors. All traffic stays on loopback, bounded in
// count and time.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { readFileSync } from 'node:fs';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { expectSettled } from './lib/expect.mjs';
import { sleep } from './lib/util.mjs';

const STRANGER = '127.0.0.3';
const IDLE_CONNECTIONS = 1000;
const FLOOD_CONCURRENCY = 16;
const HONEST_SETTLES = 20;
const HEALTH_EVERY_MS = 100;
const PROBE_TIMEOUT_MS = 5_000;

let stack;
const it = (name, fn) => test(name, { timeout: 180_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    fundedPayers: HONEST_SETTLES,
    // Silent connections stay for the whole test: the read timeout does not clean them up.
    routerd: { openFiles: 1024, serverExtra: 'request_read_timeout_ms = 120000\n' },
  });
});

after(() => stack?.stop());

/** Opens `n` TCP connections from `localAddress` that never send a byte; resolves to the sockets. */
async function idleConnections(n, localAddress) {
  const url = new URL(stack.url);
  const sockets = [];
  for (let i = 0; i < n; i += 1) {
    const socket = net.connect({ host: url.hostname, port: Number(url.port), localAddress });
    socket.on('error', () => {}); // closed by routerd to make room: expected
    sockets.push(socket);
    if (i % 100 === 99) await sleep(20);
  }
  return sockets;
}

/** A /verify flood from `localAddress` until `stopped()`: counts of answers and failures. */
function verifyFlood(localAddress, body, stopped) {
  const counts = { answered: 0, failed: 0 };
  const url = new URL(`${stack.url}/verify`);
  const one = () => new Promise((resolve) => {
    const options = { host: url.hostname, port: url.port, path: url.pathname, method: 'POST', localAddress, agent: false, headers: { 'content-type': 'application/json' } };
    const req = http.request(options, (res) => {
      res.resume();
      res.on('end', () => { counts.answered += 1; resolve(); });
    });
    req.setTimeout(PROBE_TIMEOUT_MS, () => req.destroy());
    req.on('error', () => { counts.failed += 1; resolve(); });
    req.end(JSON.stringify(body));
  });
  const workers = Array.from({ length: FLOOD_CONCURRENCY }, async () => {
    while (!stopped()) await one();
  });
  return { counts, done: Promise.all(workers) };
}

/** GET /health every HEALTH_EVERY_MS until `stopped()`: each probe's status (or 'timeout'). */
function healthProbes(stopped) {
  const seen = [];
  const done = (async () => {
    while (!stopped()) {
      const status = await fetch(`${stack.url}/health`, { signal: AbortSignal.timeout(PROBE_TIMEOUT_MS) })
        .then((res) => res.status, () => 'timeout');
      seen.push(status);
      await sleep(HEALTH_EVERY_MS);
    }
  })();
  return { seen, done };
}

it(`${IDLE_CONNECTIONS} idle connections and a /verify flood from a stranger, open-file limit 1,024: ${HONEST_SETTLES} honest settles succeed, /health answers throughout, no store error`, async () => {
  const idle = await idleConnections(IDLE_CONNECTIONS, STRANGER);
  // A payment of a payer without funds: each verify reads the chain and fails.
  const failing = (await stack.pay({ account: freshAccount(), amount: 1000n })).body;
  let over = false;
  const stopped = () => over;
  const flood = verifyFlood(STRANGER, failing, stopped);
  const health = healthProbes(stopped);
  try {
    for (let i = 0; i < HONEST_SETTLES; i += 1) {
      const p = await stack.pay({ account: stack.payers[i], amount: 1000n });
      expectSettled(await stack.settle(p.body), { network: NETWORK, payer: p.authorization.from });
    }
  } finally {
    over = true;
    await Promise.all([flood.done, health.done]);
    for (const socket of idle) socket.destroy();
  }
  console.log(`# flood answered ${flood.counts.answered}, failed ${flood.counts.failed}; health probes ${health.seen.length}`);
  assert.ok(health.seen.length > 0);
  assert.deepEqual(health.seen.filter((s) => s !== 200), [], '/health answered 200 throughout');
  assert.ok(flood.counts.answered > 0, 'the flood was served too, within the bounds');
  const log = readFileSync(stack.routerd.logFile, 'utf8');
  assert.doesNotMatch(log, /Too many open files|store failure|could not (save|store)/i, 'no descriptor or store failure in the log');
  assert.equal((await fetch(`${stack.url}/health`)).status, 200, 'routerd is up');
});
