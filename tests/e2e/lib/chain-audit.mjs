// What the chain itself says about the facilitator's transactions: the tests that must prove
// "settled exactly once, by the transaction its answer named; no signer transaction reverted; no
// signer nonce wasted; nothing left in the pool" read it here, never from routerd.
import assert from 'node:assert/strict';
import { getAddress, decodeEventLog } from 'viem';
import { usdcAbi } from './deploy-usdc.mjs';
import { waitFor } from './util.mjs';

const hex = (n) => `0x${BigInt(n).toString(16)}`;
const same = (a, b) => a != null && b != null && getAddress(a) === getAddress(b);

/** anvil's txpool_status as numbers {pending, queued}. */
export async function poolStatus(anvil) {
  const s = await anvil.rpc('txpool_status');
  return { pending: Number(s.pending), queued: Number(s.queued) };
}

/** Wait until anvil's pool holds no transaction at all (pending or queued). */
export async function waitPoolEmpty(anvil, { timeoutMs = 20_000, what = 'an empty transaction pool' } = {}) {
  let last;
  try {
    await waitFor(async () => {
      last = await poolStatus(anvil);
      return last.pending === 0 && last.queued === 0;
    }, { timeoutMs, intervalMs: 200, what });
  } catch (err) {
    err.message += ` (last txpool_status: ${JSON.stringify(last)})`;
    throw err;
  }
}

/** The pool's transactions (pending and queued) sent by `address`, keyed by decimal nonce. */
export async function pooledFrom(anvil, address) {
  const pool = await anvil.rpc('txpool_content');
  const out = {};
  for (const part of ['queued', 'pending']) {
    for (const [from, byNonce] of Object.entries(pool[part] ?? {})) {
      if (same(from, address)) Object.assign(out, byNonce);
    }
  }
  return out;
}

/** The chain's head block number and the nonce `address` has at that block: a starting mark. */
export async function chainMark(anvil, address) {
  const block = Number(await anvil.rpc('eth_blockNumber'));
  const nonce = Number(await anvil.rpc('eth_getTransactionCount', [address, hex(block)]));
  return { block, nonce };
}

/**
 * Every transaction sent by one of `senders` and mined in blocks (fromBlock, toBlock] of the
 * canonical chain, with its receipt: [{hash, from, to, nonce, value, maxFeePerGas,
 * maxPriorityFeePerGas, gasPrice, blockNumber, blockHash, baseFee, status, effectiveGasPrice, logs}].
 */
export async function minedFrom(anvil, senders, { fromBlock, toBlock } = {}) {
  const head = toBlock ?? Number(await anvil.rpc('eth_blockNumber'));
  const numbers = [];
  for (let n = fromBlock + 1; n <= head; n += 1) numbers.push(n);
  const out = [];
  // The canonical chain by parent hashes from the head, read once if a number lookup fails. The
  // walk starts at `latest`, which anvil resolves by its best hash (after rollbacks its number
  // index may miss the head too), and is read again until it reaches `fromBlock`: a parent that a
  // node mining at that moment briefly misses does not end it early.
  let byParents = null;
  const walkFromLatest = async () => {
    const chain = new Map();
    let block = await anvil.rpc('eth_getBlockByNumber', ['latest', true]);
    while (block && Number(block.number) > fromBlock) {
      if (Number(block.number) <= head) chain.set(Number(block.number), block);
      block = await anvil.rpc('eth_getBlockByHash', [block.parentHash, true]);
    }
    return { chain, whole: block !== null };
  };
  const readByParents = async () => {
    // A try that throws keeps the last walk that answered, whole or not.
    let walk = { chain: new Map(), whole: false };
    await waitFor(async () => {
      walk = await walkFromLatest();
      return walk.whole;
    }, { timeoutMs: 15_000, intervalMs: 500, what: `the chain from the head down to block ${fromBlock} by parent hashes` }).catch(() => {});
    return walk.chain;
  };
  const readBlock = async (n) => {
    // A busy anvil that is mining at that moment may briefly answer null for a block at or under
    // the head it reported: ask again rather than misread the history. After several rollbacks
    // anvil may keep answering null for a number it has a block at: then the block is found
    // from the head down, by parent hashes.
    let block = null;
    await waitFor(async () => {
      block = await anvil.rpc('eth_getBlockByNumber', [hex(n), true]);
      return block !== null;
    }, { timeoutMs: 3_000, intervalMs: 100, what: `block ${n} (head ${head}) from the node` }).catch(async () => {
      byParents ??= readByParents();
      block = (await byParents).get(n) ?? null;
      assert.ok(block, `block ${n} (head ${head}): neither by number nor from the head by parent hashes`);
    });
    const mine = block.transactions.filter((tx) => senders.some((s) => same(tx.from, s)));
    if (mine.length === 0) return;
    let receipts = null;
    await waitFor(async () => {
      receipts = await anvil.rpc('eth_getBlockReceipts', [block.hash]); // this very block's
      return receipts !== null;
    }, { timeoutMs: 10_000, intervalMs: 100, what: `receipts of block ${n} from the node` });
    const byHash = new Map(receipts.map((r) => [r.transactionHash, r]));
    for (const tx of mine) {
      const r = byHash.get(tx.hash);
      out.push({
        hash: tx.hash,
        from: getAddress(tx.from),
        to: tx.to ? getAddress(tx.to) : null,
        nonce: Number(tx.nonce),
        value: BigInt(tx.value),
        maxFeePerGas: tx.maxFeePerGas != null ? BigInt(tx.maxFeePerGas) : null,
        maxPriorityFeePerGas: tx.maxPriorityFeePerGas != null ? BigInt(tx.maxPriorityFeePerGas) : null,
        gasPrice: tx.gasPrice != null ? BigInt(tx.gasPrice) : null,
        blockNumber: n,
        blockHash: block.hash,
        baseFee: block.baseFeePerGas != null ? BigInt(block.baseFeePerGas) : null,
        status: r && Number(r.status) === 1 ? 'success' : 'reverted',
        effectiveGasPrice: r ? BigInt(r.effectiveGasPrice) : null,
        logs: r ? r.logs : [],
      });
    }
  };
  // A few blocks at a time: quick, and gentle with a node that is mining meanwhile.
  for (let i = 0; i < numbers.length; i += 8) await Promise.all(numbers.slice(i, i + 8).map(readBlock));
  return out.sort((a, b) => a.blockNumber - b.blockNumber || a.nonce - b.nonce);
}

/** The USDC events (Transfer, AuthorizationUsed, ...) among `logs`, decoded: [{eventName, args}]. */
export function usdcEvents(logs, usdc) {
  const events = [];
  for (const log of logs) {
    if (!same(log.address, usdc)) continue;
    try {
      events.push(decodeEventLog({ abi: usdcAbi, data: log.data, topics: log.topics }));
    } catch {
      // not an event of the token's ABI
    }
  }
  return events;
}

/**
 * The token events of a settlement transaction are exactly one authorization `auth` being used and
 * its value moving from `auth.from` to `auth.to`.
 */
export function expectTransfersAuthorization(logs, usdc, auth, where = '') {
  const events = usdcEvents(logs, usdc);
  const used = events.filter((e) => e.eventName === 'AuthorizationUsed');
  const transfers = events.filter((e) => e.eventName === 'Transfer');
  assert.equal(used.length, 1, `${where}: one AuthorizationUsed event`);
  assert.ok(same(used[0].args.authorizer, auth.from), `${where}: authorizer`);
  assert.equal(used[0].args.nonce.toLowerCase(), auth.nonce.toLowerCase(), `${where}: authorization nonce`);
  assert.equal(transfers.length, 1, `${where}: one Transfer event`);
  assert.ok(same(transfers[0].args.from, auth.from) && same(transfers[0].args.to, auth.to), `${where}: transfer from payer to payTo`);
  assert.equal(transfers[0].args.value, BigInt(auth.value), `${where}: transfer value`);
}

/**
 * The signer's nonces from `mark.nonce` on were each used once, in order, by a transaction that
 * succeeded, and the chain's nonce for the signer is right after the last of them: no revert, no
 * gap, no nonce wasted. Returns the transactions sorted by nonce, split into `settlements` (calls
 * to the token), `selfTransfers` (0-value transfers to itself, which fill nonces) and `other`.
 */
export async function expectCleanSignerHistory(anvil, { signer, usdc, mark }) {
  const txs = (await minedFrom(anvil, [signer], { fromBlock: mark.block })).sort((a, b) => a.nonce - b.nonce);
  for (const tx of txs) {
    assert.equal(tx.status, 'success', `signer ${signer} transaction ${tx.hash} (nonce ${tx.nonce}, to ${tx.to}, block ${tx.blockNumber}) reverted`);
  }
  assert.deepEqual(
    txs.map((t) => t.nonce),
    txs.map((_, i) => mark.nonce + i),
    `signer ${signer}: the mined nonces are consecutive from ${mark.nonce}`,
  );
  const chainNonce = Number(await anvil.rpc('eth_getTransactionCount', [signer, 'latest']));
  assert.equal(chainNonce, mark.nonce + txs.length, `signer ${signer}: the chain nonce follows the last mined transaction`);
  return {
    all: txs,
    settlements: txs.filter((t) => same(t.to, usdc)),
    selfTransfers: txs.filter((t) => same(t.to, signer) && t.value === 0n),
    other: txs.filter((t) => !same(t.to, usdc) && !(same(t.to, signer) && t.value === 0n)),
  };
}
