// Driving settlements on chains that mine only when told (anvil --no-mining): mine while a client
// waits, ask again on the 504 pending answer as a resource server would (the same Idempotency-Key
// and body), find a payment's transaction in the pool, and hold routerd still (SIGSTOP) while the
// chain is changed under it.
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { pooledFrom } from './chain-audit.mjs';
import { sleep, waitFor, idempotencyKey } from './util.mjs';
import { TX_HASH } from './expect.mjs';

/** The pending answer of a settlement: HTTP 400 {error: 504, message}. */
export const isPending = (res) => res.status === 400 && res.body?.error === 504;

/**
 * Await `promise` while mining a block every `everyMs` (after `beforeMine()`, e.g. to pin the next
 * base fee): the chain a client waits on keeps moving. Resolves or rejects as `promise` does.
 */
export async function mining(anvil, promise, { everyMs = 300, beforeMine = async () => {} } = {}) {
  let done = false;
  const settled = promise.then(() => { done = true; }, () => { done = true; });
  while (!done) {
    await beforeMine();
    await anvil.mine();
    await Promise.race([settled, sleep(everyMs)]);
  }
  return promise;
}

/**
 * Settle `body` (an object or an array) as a resource server would: while the answer is the 504
 * pending one, ask again with the same `Idempotency-Key` and the same bytes (a fresh key unless
 * `key` is given, e.g. the key of an earlier attempt of this same request), so that the retry is
 * told the first attempt's answer rather than the duplicate one. With `mine`, blocks are mined
 * meanwhile. Returns the first other answer, with the key it used as `res.key`.
 */
export async function settleUntilDone(stack, body, { key = idempotencyKey(), mine = true, tries = 30, everyMs, beforeMine } = {}) {
  let res;
  const raw = typeof body === 'string' ? body : JSON.stringify(body); // byte-identical on every try
  for (let i = 0; i < tries; i += 1) {
    const answer = stack.settle(raw, { key });
    res = mine ? await mining(stack.anvil, answer, { everyMs, beforeMine }) : await answer;
    res.key = key;
    const pending = Array.isArray(res.body) ? res.body.some((slot) => slot?.error === 504) : isPending(res);
    if (!pending) return res;
  }
  return res;
}

/**
 * Wait until a signer's transaction carrying payment `p` (its authorization nonce is in the
 * calldata) is in anvil's pool; returns that pool entry ({hash, nonce, from, maxFeePerGas, ...}).
 */
export async function waitInPool(stack, p, { signers = stack.signers, timeoutMs = 15_000 } = {}) {
  const needle = p.authorization.nonce.slice(2).toLowerCase();
  return waitFor(async () => {
    for (const address of signers) {
      const txs = Object.values(await pooledFrom(stack.anvil, address));
      const tx = txs.find((t) => (t.input ?? t.data ?? '').toLowerCase().includes(needle));
      if (tx) return tx;
    }
    return undefined;
  }, { timeoutMs, intervalMs: 100, what: `the settlement of nonce ${p.authorization.nonce.slice(0, 10)}... in the pool` });
}

/** Run `fn` while routerd is stopped with SIGSTOP (it sees nothing of what happens meanwhile). */
export async function frozen(routerd, fn) {
  process.kill(routerd.child.pid, 'SIGSTOP');
  try {
    return await fn();
  } finally {
    process.kill(routerd.child.pid, 'SIGCONT');
  }
}

/** The transaction hash in a 504 pending message ("settlement pending: 0x<hash> ..."), or null. */
export function hashInMessage(message) {
  const hash = String(message ?? '').match(/0x[0-9a-fA-F]{64}/)?.[0] ?? null;
  if (hash) assert.match(hash, TX_HASH);
  return hash;
}

/** Case-insensitive address equality that names both sides on failure. */
export function assertSameAddress(actual, expected, message) {
  assert.ok(typeof actual === 'string' && /^0x[0-9a-fA-F]{40}$/.test(actual), `${message}: not an address: ${actual}`);
  assert.equal(getAddress(actual), getAddress(expected), message);
}

/**
 * Rolls back every block from the one that includes `hash` on an interval-mining chain (the
 * miner held meanwhile), runs `check()` on the rolled-back chain, then waits until routerd's
 * transaction `hash` is mined again (re-broadcast, or still in the pool) and succeeded.
 */
export async function rolledBackAndMinedAgain(stack, hash, check = async () => {}) {
  const rpc = (method, params) => stack.anvil.rpc(method, params);
  await waitFor(async () => (await rpc('eth_getTransactionReceipt', [hash])) !== null, { timeoutMs: 15_000, what: 'the settlement mined' });
  await rpc('evm_setIntervalMining', [0]);
  try {
    const included = Number((await stack.receipt(hash)).blockNumber);
    await rpc('anvil_rollback', [Number(await rpc('eth_blockNumber')) - included + 1]);
    assert.equal(await rpc('eth_getTransactionReceipt', [hash]), null, 'precondition: the rollback removed the settlement');
    await check();
  } finally {
    await rpc('evm_setIntervalMining', [1]);
  }
  await waitFor(async () => (await rpc('eth_getTransactionReceipt', [hash])) !== null, {
    timeoutMs: 30_000, intervalMs: 250, what: 'the settlement mined again',
  });
  assert.equal((await stack.receipt(hash)).status, 'success');
}
