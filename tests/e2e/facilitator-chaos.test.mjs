// The settlement guarantees all at once (spec/x402-facilitator.md section 3): a burst of distinct
// payments from many payers on anvil --block-time 1, settled by clients that behave like resource
// servers (on an error, a pending answer or a refused connection they send the same body again
// with the same Idempotency-Key, until a definite answer or a deadline), while at seeded-random moments routerd is SIGKILLed and
// restarted on the same store, the node forgets its pool (anvil_dropAllTransactions), and the chain
// reorganises 1-2 blocks away (anvil_rollback).
//
// At the end, from the chain itself: every payment settled exactly once (payer and payee balances),
// by the transaction its success answer named (receipt status 1, its logs use that authorization and
// move that value); every transaction the signer mined succeeded; the signer's nonces have no gap and
// none is wasted (chain nonce = transactions mined, all settlements or 0-value self-transfers); the
// pool is empty.
//
// CHAOS_SEED=<n> replays a run's fault schedule (the seed is printed); CHAOS_PAYMENTS and
// CHAOS_CONCURRENCY change the size (defaults 600 and 150).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { getAddress, toHex } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { now } from './lib/x402.mjs';
import { readAnswer, sleep, waitFor, idempotencyKey, IDEMPOTENCY_KEY } from './lib/util.mjs';
import { TX_HASH } from './lib/expect.mjs';
import {
  chainMark, expectCleanSignerHistory, expectTransfersAuthorization, minedFrom, poolStatus, waitPoolEmpty,
} from './lib/chain-audit.mjs';

const COUNT = Number(process.env.CHAOS_PAYMENTS ?? 600);
const CONCURRENCY = Number(process.env.CHAOS_CONCURRENCY ?? 150);
const PAYERS = 60;
const PRICE = 1000n;
const PER_PAYER = BigInt(Math.ceil(COUNT / PAYERS));
const FUNDS = PRICE * PER_PAYER;
const SEED = Number(process.env.CHAOS_SEED ?? Math.floor(Math.random() * 2 ** 31));
const FAULTS = { kill: 3, drop: 3, rollback: 3 };
const BURST_DEADLINE_MS = 6 * 60_000; // every payment has a definite answer by then, or the test fails
const STALL_MS = 120_000; // ... and the burst is given up sooner when no payment got an answer for this long
const CLIENT_TIMEOUT_MS = 30_000; // one HTTP exchange; settle_timeout_secs is 10

let stack;
const it = (name, fn) => test(name, { timeout: 10 * 60_000 }, withLogTail(() => stack, fn));
const log = (line) => console.log(`# chaos: ${line}`);

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { blockTime: 1 },
    fundedPayers: PAYERS,
    payerFunds: FUNDS,
    routerd: { settleTimeoutSecs: 10 },
  });
});

after(() => stack?.stop());

/** mulberry32: a small seeded PRNG, so a failing run's fault schedule can be replayed. */
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * The fault schedule: each fault fires at a random moment in the first FAULT_WINDOW_MS of the burst
 * (at least a block apart). Payments arrive at a steady pace over a little longer than that window
 * (at most CONCURRENCY in flight), as a resource server's traffic would: the burst is running at
 * every fault, and keeps running after the last one.
 */
const FAULT_WINDOW_MS = 11_000;
const ARRIVALS_MS = 16_000;
function schedule(rand) {
  const kinds = Object.entries(FAULTS).flatMap(([kind, n]) => Array(n).fill(kind));
  for (let i = kinds.length - 1; i > 0; i -= 1) {
    const j = Math.floor(rand() * (i + 1));
    [kinds[i], kinds[j]] = [kinds[j], kinds[i]];
  }
  const times = kinds.map(() => 500 + Math.floor(rand() * (FAULT_WINDOW_MS - 500))).sort((x, y) => x - y);
  return kinds.map((kind, i) => ({ kind, atMs: times[i], restartAfterMs: Math.floor(rand() * 1000), depth: 1 + Math.floor(rand() * 2) }));
}

/**
 * One settle exchange as a resource server makes it, under the payment's request key (the same on
 * every attempt, so a retry is told the first attempt's outcome); a network error is an answer of
 * its own kind.
 */
async function settleOnce(body, key) {
  try {
    const res = await fetch(`${stack.url}/settle`, {
      method: 'POST', headers: { 'content-type': 'application/json', [IDEMPOTENCY_KEY]: key }, body, signal: AbortSignal.timeout(CLIENT_TIMEOUT_MS),
    });
    return await readAnswer(res);
  } catch (err) {
    return { status: 0, error: err.cause?.code ?? err.name ?? String(err), text: String(err.message) };
  }
}

const definite = (res) => res.status === 200 && typeof res.body?.success === 'boolean';
const kindOf = (res) => (res.status === 0 ? `network ${res.error}` : `HTTP ${res.status}${res.body?.error ? ` error ${res.body.error}` : ''}`);

it(`${COUNT} payments at concurrency ${CONCURRENCY} through ${FAULTS.kill} SIGKILLs, ${FAULTS.drop} pool drops and ${FAULTS.rollback} reorgs: each settled once, by its answer's hash`, async () => {
  log(`seed ${SEED} (CHAOS_SEED=${SEED} replays this schedule)`);
  const rand = prng(SEED);
  const faults = schedule(rand);
  log(`schedule ${faults.map((f) => `${f.kind}${f.kind === 'rollback' ? `(${f.depth})` : ''}@${(f.atMs / 1000).toFixed(1)}s`).join(' ')}`);

  // ---- payments: distinct (payer, nonce), a distinct payee each, valid for an hour
  const payments = [];
  for (let i = 0; i < COUNT; i += 1) {
    const account = stack.payers[i % PAYERS];
    const payTo = getAddress(toHex(randomBytes(20)));
    const p = await stack.pay({ account, payTo, amount: PRICE, auth: { validBefore: BigInt(now() + 3600) } });
    payments.push({ ...p, json: JSON.stringify(p.body), key: idempotencyKey() });
  }
  // The setup's mints must be deeper than any reorg of this test: the rollbacks together remove
  // at most 2 * FAULTS.rollback blocks.
  const maxRollback = 2 * FAULTS.rollback;
  const setupHead = Number(await stack.anvil.rpc('eth_blockNumber'));
  await waitFor(async () => Number(await stack.anvil.rpc('eth_blockNumber')) >= setupHead + maxRollback + 2, {
    timeoutMs: 30_000, what: `${maxRollback + 2} blocks past setup`,
  });
  // The chain is read from below the deepest point a rollback can reach: a settlement mined in
  // the burst's first block and rolled back may land again below the head seen here. The signer
  // sends nothing before the burst, so its nonce there is the same.
  const mark = await chainMark(stack.anvil, stack.signer);
  mark.block -= maxRollback + 1;

  // ---- the burst
  const results = new Array(COUNT);
  const retries = {}; // answer kind -> count of exchanges that were not definite
  let answered = 0;
  const started = Date.now();
  const deadline = started + BURST_DEADLINE_MS;
  let lastAnswerAt = started;
  async function payUntilAnswered(i) {
    for (let attempts = 1; ; attempts += 1) {
      const res = await settleOnce(payments[i].json, payments[i].key);
      if (definite(res)) return { res, attempts };
      retries[kindOf(res)] = (retries[kindOf(res)] ?? 0) + 1;
      if (Date.now() > deadline || Date.now() - lastAnswerAt > STALL_MS) return { res, attempts, timedOut: true };
      await sleep(200 + Math.floor(Math.random() * 800));
    }
  }
  const queue = [];
  let arrived = false;
  let taken = 0;
  let peak = 0; // most payments in flight at once
  const arrivals = (async () => {
    for (let i = 0; i < COUNT; i += 1) {
      queue.push(i);
      const due = started + ((i + 1) * ARRIVALS_MS) / COUNT - Date.now();
      if (due > 0) await sleep(due);
    }
    arrived = true;
  })();
  const workers = Array.from({ length: CONCURRENCY }, async () => {
    for (;;) {
      while (!queue.length && !arrived) await sleep(20);
      if (!queue.length) return;
      const i = queue.shift();
      taken += 1;
      peak = Math.max(peak, taken - answered);
      results[i] = await payUntilAnswered(i);
      answered += 1;
      if (!results[i].timedOut) lastAnswerAt = Date.now();
    }
  });
  const burst = Promise.all([arrivals, ...workers]);

  // ---- the faults, while the burst runs
  const fired = [];
  async function inject(f) {
    const inFlight = taken - answered;
    if (f.kind === 'kill') {
      await stack.routerd.kill();
      await sleep(f.restartAfterMs);
      await stack.routerd.restart();
    } else if (f.kind === 'drop') {
      await stack.anvil.rpc('anvil_dropAllTransactions');
    } else {
      await stack.anvil.rpc('anvil_rollback', [f.depth]);
    }
    fired.push({ ...f, inFlight, t: ((Date.now() - started) / 1000).toFixed(1) });
    log(`t=${fired.at(-1).t}s ${f.kind}${f.kind === 'rollback' ? ` depth ${f.depth}` : ''} with ${inFlight} payments in flight, ${answered}/${COUNT} answered`);
  }
  const progress = setInterval(() => log(`t=${((Date.now() - started) / 1000).toFixed(0)}s ${answered}/${COUNT} answered`), 15_000);
  try {
    for (const f of faults) {
      const wait = started + f.atMs - Date.now();
      if (wait > 0) await sleep(wait);
      await inject(f);
      await sleep(1000); // faults at least a block apart
    }
    await burst;
  } finally {
    clearInterval(progress);
  }
  log(`burst done in ${((Date.now() - started) / 1000).toFixed(1)}s; at most ${peak} payments in flight; in flight at each fault: ${fired.map((f) => f.inFlight).join(', ')}`);
  log(`retried exchanges by kind: ${JSON.stringify(retries)}`);
  const attempts = results.map((r) => r.attempts);
  log(`attempts per payment: max ${Math.max(...attempts)}, mean ${(attempts.reduce((a, b) => a + b, 0) / COUNT).toFixed(2)}`);

  const idle = fired.filter((f) => f.inFlight === 0);
  assert.equal(idle.length, 0, `precondition: every fault hits payments in flight (${idle.map((f) => `${f.kind} at ${f.t}s`).join(', ')} did not)`);

  // ---- every payment got a definite success
  const timedOut = results.map((r, i) => [i, r]).filter(([, r]) => r.timedOut);
  assert.equal(timedOut.length, 0, `payments without a definite answer (deadline ${BURST_DEADLINE_MS / 1000}s, or ${STALL_MS / 1000}s without any answer): ${timedOut.slice(0, 5).map(([i, r]) => `#${i} ${kindOf(r.res)} ${r.res.text.slice(0, 160)}`).join(' | ')}`);
  const failed = results.map((r, i) => [i, r]).filter(([, r]) => r.res.body.success !== true);
  assert.equal(failed.length, 0, `valid payments answered success:false: ${failed.slice(0, 5).map(([i, r]) => `#${i} ${r.res.text.slice(0, 200)}`).join(' | ')}`);
  const hashes = results.map((r) => r.res.body.transaction);
  for (const [i, h] of hashes.entries()) {
    assert.match(h, TX_HASH, `payment ${i}`);
    assert.equal(results[i].res.body.network, NETWORK);
  }
  assert.equal(new Set(hashes).size, COUNT, 'one distinct transaction per payment');

  // ---- the chain settles down: every answered transaction on the canonical chain, nothing pending
  const notMined = async () => {
    const missing = [];
    for (let i = 0; i < hashes.length; i += 25) {
      const rs = await Promise.all(hashes.slice(i, i + 25).map((h) => stack.anvil.rpc('eth_getTransactionReceipt', [h])));
      rs.forEach((r, k) => { if (!r) missing.push(hashes[i + k]); });
    }
    return missing;
  };
  let missing = [];
  await waitFor(async () => {
    missing = await notMined();
    const pool = await poolStatus(stack.anvil);
    return missing.length === 0 && pool.pending === 0 && pool.queued === 0;
  }, { timeoutMs: 90_000, intervalMs: 1000, what: 'every answered transaction mined and an empty pool' }).catch((err) => {
    err.message += `; ${missing.length} answered transaction(s) not on the canonical chain, e.g. ${missing.slice(0, 3).join(', ')}`;
    throw err;
  });

  // ---- each payment settled once, by the transaction its answer named
  const mined = await minedFrom(stack.anvil, [stack.signer], { fromBlock: mark.block });
  const byHash = new Map(mined.map((t) => [t.hash, t]));
  for (const [i, p] of payments.entries()) {
    const tx = byHash.get(hashes[i]);
    assert.ok(tx, `payment ${i}: its answered transaction ${hashes[i]} is not a signer transaction on the canonical chain`);
    assert.equal(tx.status, 'success', `payment ${i}: ${hashes[i]} reverted`);
    expectTransfersAuthorization(tx.logs, stack.usdc, p.authorization, `payment ${i} (${hashes[i]})`);
  }
  const balances = async (addresses) => {
    const out = [];
    for (let i = 0; i < addresses.length; i += 25) out.push(...await Promise.all(addresses.slice(i, i + 25).map((a) => stack.balanceOf(a))));
    return out;
  };
  const payeeBalances = await balances(payments.map((p) => p.authorization.to));
  payeeBalances.forEach((b, i) => assert.equal(b, PRICE, `payee of payment ${i} received ${b}, not ${PRICE} once`));
  const paid = new Map();
  for (const p of payments) paid.set(p.authorization.from, (paid.get(p.authorization.from) ?? 0n) + PRICE);
  const payerBalances = await balances(stack.payers.map((a) => a.address));
  payerBalances.forEach((b, i) => assert.equal(b, FUNDS - (paid.get(stack.payers[i].address) ?? 0n), `payer ${i} balance`));

  // ---- the signer's account: nothing reverted, no gap, nothing wasted, the pool empty
  await waitPoolEmpty(stack.anvil);
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.equal(history.settlements.length, COUNT, `settlement transactions mined: ${history.settlements.length}, payments: ${COUNT}`);
  assert.deepEqual(history.other.map((t) => `${t.hash} to ${t.to} value ${t.value}`), [], 'signer transactions that are neither settlements nor 0-value self-transfers');
  log(`signer: ${history.all.length} transactions from nonce ${mark.nonce}: ${history.settlements.length} settlements, ${history.selfTransfers.length} 0-value self-transfers; ${fired.length} faults fired`);
  assert.equal(fired.length, FAULTS.kill + FAULTS.drop + FAULTS.rollback, 'every fault fired');
});
