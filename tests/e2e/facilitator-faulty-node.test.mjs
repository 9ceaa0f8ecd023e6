// A misbehaving node cannot silence routerd (spec/access.md section 7). The facilitator's only RPC
// URL is a proxy in front of anvil (--block-time 1; lib/node-proxy.mjs) that, on command, for
// about 3 s each with about 2 s of good behaviour between:
//   (a) answers every JSON-RPC batch one entry short (every other one, one entry long);
//   (b) answers garbage: text that is not JSON, "0xzz" results, JSON of the wrong shape, null;
//   (c) answers eth_getBlockByNumber with number and timestamp 0xffffffffffffffff and
//       baseFeePerGas 2^256-1 (and eth_blockNumber 0xffffffffffffffff);
//   (d) stalls: holds each request 2.5 s, longer than request_timeout_ms (1 s).
// The proxy forwards every request to anvil before it corrupts the answer (a stalled request is
// forwarded too, late): a transaction "lost" in a bad answer was really sent, as with a real
// broken node, so a failure answered for it would be a lie the chain shows.
//
// Meanwhile a payment is sent every 300 ms, each settled with its own Idempotency-Key and asked
// again with that key on the retry answers ({error: 502, 503 or 504}) until final. Without the
// protections (a short batch panicked the head watcher, after which every settlement hung until
// settle_timeout_secs and never settled), payments stop being settled and the final checks fail.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { startFacilitatorStack, throughProxy, withLogTail, NETWORK } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { usdcAbi } from './lib/deploy-usdc.mjs';
import { chainMark, expectCleanSignerHistory, expectTransfersAuthorization, waitPoolEmpty } from './lib/chain-audit.mjs';
import { startNodeProxy, FAULTS } from './lib/node-proxy.mjs';
import { sleep, waitFor, idempotencyKey, readAnswer } from './lib/util.mjs';

const PRICE = 1000n;
const FAULT_MS = 3000;
const GOOD_MS = 2000;
const EVERY_MS = 300;
const REQUEST_TIMEOUT_MS = 1000;
const STALL_MS = 2500; // > REQUEST_TIMEOUT_MS
const SETTLE_TIMEOUT_SECS = 10;
const PROMPT_BLOCKS = 5; // "within a few blocks" on a 1 s chain
const FINAL_WITHIN_MS = 45_000; // each payment's retries give up after this (the test then fails)

let stack;
let proxy;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  proxy = await startNodeProxy({ stallMs: STALL_MS });
  stack = await startFacilitatorStack({
    anvil: { blockTime: 1 },
    fundedPayers: 10,
    routerd: { settleTimeoutSecs: SETTLE_TIMEOUT_SECS },
    chainExtra: `request_timeout_ms = ${REQUEST_TIMEOUT_MS}\n`,
    rpcUrlFor: throughProxy(proxy),
  });
});

after(async () => {
  await stack?.stop();
  await proxy?.close();
});

let nextPayer = 0;
function payment() {
  const account = stack.payers[nextPayer % stack.payers.length];
  nextPayer += 1;
  return stack.pay({ account, payTo: freshAccount().address, amount: PRICE });
}

const isRetry = (res) => res.status === 0 || res.status >= 500 || (res.status === 400 && [502, 503, 504].includes(res.body?.error));

/**
 * Settle `p` as a resource server would: one Idempotency-Key, the same bytes every time, asked
 * again on the retry answers until a final one (HTTP 200 with success true or false).
 */
async function settleToTheEnd(p, phase) {
  const key = idempotencyKey();
  const raw = JSON.stringify(p.body);
  const started = Date.now();
  const attempts = [];
  for (;;) {
    let res;
    try {
      res = await stack.settle(raw, { key });
    } catch (err) {
      res = { status: 0, text: `no answer: ${err.message}` };
    }
    attempts.push(`HTTP ${res.status} ${res.text.slice(0, 240)}`);
    if (!isRetry(res)) return { p, phase, res, attempts, ms: Date.now() - started };
    if (Date.now() - started > FINAL_WITHIN_MS) return { p, phase, res, attempts, ms: Date.now() - started, gaveUp: true };
    await sleep(300);
  }
}

async function ready() {
  try {
    return await readAnswer(await fetch(`${stack.url}/ready`, { signal: AbortSignal.timeout(5000) }));
  } catch (err) {
    return { status: 0, text: `no answer: ${err.message}` };
  }
}

const blockNumber = async () => Number(await stack.anvil.rpc('eth_blockNumber'));

/** routerd's head of the chain as /metrics shows it (routerd_chain_head_block), or undefined. */
async function headOnMetrics() {
  try {
    const text = await (await fetch(`${stack.url}/metrics`, { signal: AbortSignal.timeout(5000) })).text();
    const m = text.match(new RegExp(`^routerd_chain_head_block\\{chain="${NETWORK}"\\} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}
const authorizationUsed = (auth) => stack.client.readContract({
  address: stack.usdc, abi: usdcAbi, functionName: 'authorizationState', args: [getAddress(auth.from), auth.nonce],
});

it('a payment settles through the proxy while it behaves', async () => {
  await waitFor(async () => (await ready()).status === 200, { timeoutMs: 15_000, what: '/ready = 200' });
  const r = await settleToTheEnd(await payment(), 'good');
  assert.equal(r.res.status, 200, r.attempts.join('\n'));
  assert.equal(r.res.body?.success, true, r.attempts.join('\n'));
});

it('short batches, garbage, impossible heads and stalls: routerd lives, every payment ends true to the chain, the lane recovers', async (t) => {
  const mark = await chainMark(stack.anvil, stack.signer);
  const pending = [];
  const readyLog = [];
  const heads = []; // [fault, routerd's head, the chain's block] sampled while each fault lasts
  let phase = 'good';
  let sending = true;
  const sender = (async () => {
    while (sending) {
      const p = await payment();
      pending.push(settleToTheEnd(p, phase));
      await sleep(EVERY_MS);
    }
  })();

  const hitsBefore = { ...proxy.state.hits };
  for (const fault of FAULTS) {
    phase = fault;
    proxy.state.fault = fault;
    const end = Date.now() + FAULT_MS;
    while (Date.now() < end) {
      const r = await ready();
      readyLog.push({ fault, status: r.status, text: r.text });
      heads.push([fault, await headOnMetrics(), await blockNumber()]);
      await sleep(500);
    }
    phase = 'good';
    proxy.state.fault = null;
    await sleep(GOOD_MS);
  }
  sending = false;
  await sender;

  // Every fault reached routerd.
  for (const fault of FAULTS) {
    assert.ok(proxy.state.hits[fault] > hitsBefore[fault], `fault ${fault} changed no answer: ${JSON.stringify(proxy.state.hits)}`);
  }
  t.diagnostic(`answers changed by each fault: ${JSON.stringify(proxy.state.hits)}`);
  // What /ready said while each fault lasted (503 is allowed then).
  for (const fault of FAULTS) {
    const seen = readyLog.filter((r) => r.fault === fault);
    const summary = [...new Set(seen.map((r) => `${r.status} ${r.text.slice(0, 300)}`))];
    t.diagnostic(`/ready during ${fault}: ${summary.join(' | ')}`);
  }

  // Impossible heads were never taken: routerd's head stayed a block the chain has.
  const impossible = heads.filter(([, head, block]) => head !== undefined && !(head >= 1 && head <= block));
  assert.deepEqual(impossible, [], 'routerd\'s head (routerd_chain_head_block) left the chain');
  assert.ok(heads.some(([fault, head]) => fault === 'huge' && head !== undefined), 'no head sampled during the impossible heads');

  const results = await Promise.all(pending);
  assert.ok(stack.routerd.running, 'routerd exited');
  const unfinished = results.filter((r) => r.res.status !== 200 || typeof r.res.body?.success !== 'boolean');
  assert.deepEqual(unfinished.map((r) => `${r.phase}: ${r.attempts.slice(-3).join(' / ')}`), [], 'payments without a final answer');

  // /ready is 200 again once the node behaves.
  let last;
  await waitFor(async () => {
    last = await ready();
    return last.status === 200;
  }, { timeoutMs: 20_000, intervalMs: 250, what: '/ready = 200 after the faults' }).catch((err) => {
    err.message += `\nlast /ready: HTTP ${last?.status} ${last?.text}`;
    throw err;
  });

  t.diagnostic(`/ready after the faults: ${last.text}`);

  // A new payment settles within a few blocks.
  const from = await blockNumber();
  const fresh = await settleToTheEnd(await payment(), 'after');
  const to = await blockNumber();
  assert.equal(fresh.res.body?.success, true, fresh.attempts.join('\n'));
  assert.ok(to - from <= PROMPT_BLOCKS, `the payment after the faults took blocks ${from}..${to}: ${fresh.attempts.join('\n')}`);

  // The chain agrees with every answer: a success moved the funds by its transaction, a failure
  // moved nothing (not even later: the pool is empty and a few more blocks are mined).
  await waitPoolEmpty(stack.anvil, { timeoutMs: 30_000 });
  const settledBlock = await blockNumber();
  await waitFor(async () => (await blockNumber()) >= settledBlock + 2, { timeoutMs: 10_000, what: 'two more blocks' });
  const hashes = new Map();
  const failures = {};
  for (const r of results) {
    const { p, res } = r;
    const where = `${r.phase} payment ${p.authorization.nonce.slice(0, 10)}: ${r.attempts.join(' / ')}`;
    const balance = await stack.balanceOf(p.authorization.to);
    if (res.body.success) {
      const hash = res.body.transaction;
      assert.ok(!hashes.has(hash), `${where}: transaction ${hash} also answered for ${hashes.get(hash)}`);
      hashes.set(hash, p.authorization.nonce);
      const receipt = await stack.receipt(hash);
      assert.equal(receipt.status, 'success', `${where}: receipt ${receipt.status}`);
      expectTransfersAuthorization(receipt.logs, stack.usdc, p.authorization, where);
      assert.equal(balance, PRICE, `${where}: the payee got ${balance}`);
    } else {
      assert.equal(balance, 0n, `${where}: answered failed, but the payee got ${balance}`);
      assert.equal(await authorizationUsed(p.authorization), false, `${where}: answered failed, but its authorization was used`);
      const reason = `${r.phase}: ${res.body.errorReason} ${res.body.errorMessage ?? ''}`.trim();
      failures[reason] = (failures[reason] ?? 0) + 1;
    }
  }
  const byPhase = {};
  for (const r of results) {
    const k = r.phase;
    byPhase[k] ??= { sent: 0, success: 0, failed: 0, retries: 0, slowestMs: 0 };
    byPhase[k].sent += 1;
    byPhase[k][r.res.body.success ? 'success' : 'failed'] += 1;
    byPhase[k].retries += r.attempts.length - 1;
    byPhase[k].slowestMs = Math.max(byPhase[k].slowestMs, r.ms);
  }
  t.diagnostic(`payments by the phase they were sent in: ${JSON.stringify(byPhase)}`);
  t.diagnostic(`failures: ${JSON.stringify(failures)}`);
  assert.ok(hashes.size > 0, 'some payment sent during the faults settled');

  // No signer transaction reverted, no nonce gap or waste.
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  t.diagnostic(`signer transactions: ${history.settlements.length} settlements, ${history.selfTransfers.length} self-transfers, ${history.other.length} other`);
  assert.equal(history.other.length, 0, `unexpected signer transactions: ${JSON.stringify(history.other.map((x) => x.hash))}`);
  for (const hash of hashes.keys()) {
    assert.ok(history.settlements.some((x) => x.hash === hash), `answered transaction ${hash} is not among the signer's mined settlements`);
  }

  // Nothing panicked: not even a step a guard would have caught (Rust's panic hook writes
  // "thread '<name>' panicked at ..." for every panic, caught or not).
  const log = stack.routerd.tail(1_000_000);
  const panics = log.split('\n').filter((l) => /thread '.*' panicked/.test(l) || l.includes('a background step panicked'));
  assert.deepEqual(panics.slice(0, 5), [], `${panics.length} panic lines in routerd's log`);
  assert.ok(stack.routerd.running, 'routerd exited');
});
