// Settled transactions taken away, and a crash between storing a transaction and broadcasting it
// (spec/x402-facilitator.md section 3, States and Write-ahead), on anvil --block-time 1 with routerd
// talking to it through a JSON-RPC proxy (lib/bad-upstreams.mjs) that can swallow a method:
// - anvil_rollback removes the blocks holding answered settlements: routerd re-broadcasts the
//   stored raw transactions, so each payment is mined on the canonical chain by exactly the hash its
//   success answer named, once; the status route shows the new including block;
// - the proxy fails the lens call (which tries the settlement) and refuses eth_estimateGas, as a
//   node does that no longer has the block it is asked about: the settle answers the chain
//   unreachable (502), claims nothing, and settles when asked again, instead of failing the
//   payment as if its transfer would revert;
// - a settlement's inclusion is read from its block's logs, with no receipt asked; when the node
//   fails the logs, from the receipt;
// - the proxy fails every receipt and log lookup while a settlement is mined and for heads after:
//   the settlement is not taken for one whose nonce went to another transaction, and answers its
//   hash;
// - routerd restarted reads one head: a rollback below it, of a settlement mined before the
//   restart, is seen from the signer's nonce at the new head, and the settlement is sent again;
// - the proxy swallows eth_sendRawTransaction, routerd is SIGKILLed with the settlement signed and
//   stored but never broadcast, and restarted straight on the node with the same store: the
//   payment settles by the transaction stored before the kill.
// A client asks again for the outcome with its first request's Idempotency-Key and body
// (spec/access.md section 1); a replay without that key is told the transaction as a failure.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { keccak256 } from 'viem';
import { startFacilitatorStack, throughProxy, withLogTail, NETWORK } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { startFilteringProxy } from './lib/bad-upstreams.mjs';
import { waitFor, sleep, idempotencyKey } from './lib/util.mjs';
import { expectSettled, expectDuplicate } from './lib/expect.mjs';
import {
  chainMark, expectCleanSignerHistory, expectTransfersAuthorization, waitPoolEmpty,
} from './lib/chain-audit.mjs';
import { settleUntilDone, frozen } from './lib/settling.mjs';

const PRICE = 1000n;

let stack;
let proxy;
const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

before(async () => {
  proxy = await startFilteringProxy();
  stack = await startFacilitatorStack({
    anvil: { blockTime: 1 },
    fundedPayers: 12,
    rpcUrlFor: throughProxy(proxy),
    routerd: { settleTimeoutSecs: 20 },
  });
});

after(async () => {
  await stack?.stop();
  await proxy?.close();
});

let nextPayer = 0;
async function newPayment() {
  const account = stack.payers[nextPayer];
  nextPayer += 1;
  return stack.pay({ account, payTo: freshAccount().address, amount: PRICE });
}

const rpc = (method, params) => stack.anvil.rpc(method, params);

/** Wait until every hash has a receipt on the canonical chain; returns the receipts. */
async function waitMined(hashes, what) {
  await waitFor(async () => {
    const receipts = await Promise.all(hashes.map((h) => rpc('eth_getTransactionReceipt', [h])));
    return receipts.every(Boolean);
  }, { timeoutMs: 30_000, intervalMs: 250, what });
  return Promise.all(hashes.map((hash) => stack.receipt(hash)));
}

/**
 * Run `fn`; afterwards put back any of `hashes` (raw transactions read now) that is neither mined
 * nor pooled. If routerd failed to re-broadcast them, the signer's nonces would have a gap that
 * stalls every later test; this way each test checks its own rule.
 */
async function repairingGaps(hashes, fn) {
  const raws = await Promise.all(hashes.map((h) => rpc('eth_getRawTransactionByHash', [h])));
  try {
    return await fn();
  } finally {
    for (const [i, hash] of hashes.entries()) {
      if (raws[i] && !(await rpc('eth_getTransactionByHash', [hash]))) await rpc('eth_sendRawTransaction', [raws[i]]).catch(() => {});
    }
  }
}

/** Each payment was paid once, by the transaction its answer named. */
async function expectPaidOnceBy(ps, hashes, receipts) {
  for (const [i, p] of ps.entries()) {
    assert.equal(receipts[i].status, 'success', `${hashes[i]} succeeded`);
    expectTransfersAuthorization(receipts[i].logs, stack.usdc, p.authorization, hashes[i]);
    assert.equal(await stack.balanceOf(p.authorization.to), PRICE, `payment ${i}: payee paid once`);
    assert.equal(await stack.balanceOf(p.authorization.from), 1_000_000_000n - PRICE, `payment ${i}: payer paid once`);
  }
}

/** The status route names `hash`, mined in the block `receipt` says (routerd may lag a block). */
async function expectStatusIncluded(p, hash, receipt) {
  let s;
  await waitFor(async () => {
    s = (await stack.settlementStatus(p)).body;
    return s?.blockHash === receipt.blockHash;
  }, { timeoutMs: 10_000, what: 'the status route naming the including block' }).catch(() => {});
  assert.ok(['included', 'final'].includes(s?.state), `state: ${JSON.stringify(s)}`);
  assert.equal(s.transaction, hash, JSON.stringify(s));
  assert.equal(s.block, Number(receipt.blockNumber), JSON.stringify(s));
  assert.equal(s.blockHash, receipt.blockHash, `the canonical including block: ${JSON.stringify(s)}`);
  assert.equal(s.outcome?.success, true, JSON.stringify(s));
  assert.equal(s.lost, false, JSON.stringify(s));
}

it('a reorganisation takes answered settlements away: the stored transactions are re-broadcast and mined once, by the answered hashes', async () => {
  const ps = [await newPayment(), await newPayment(), await newPayment(), await newPayment()];
  const mark = await chainMark(stack.anvil, stack.signer);
  const keys = ps.map(() => idempotencyKey());
  const answers = await Promise.all(ps.map((p, i) => settleUntilDone(stack, p.body, { key: keys[i], mine: false })));
  const hashes = answers.map((res, i) => expectSettled(res, { network: NETWORK, payer: ps[i].authorization.from }));
  const before = await Promise.all(hashes.map((hash) => stack.receipt(hash)));
  await repairingGaps(hashes, async () => {
    // With the chain and routerd held still, take away every block from the lowest including one.
    let depth;
    await frozen(stack.routerd, async () => {
      await rpc('evm_setIntervalMining', [0]);
      try {
        const head = Number(await rpc('eth_blockNumber'));
        depth = head - Math.min(...before.map((r) => Number(r.blockNumber))) + 1;
        await rpc('anvil_rollback', [depth]);
        for (const hash of hashes) {
          assert.equal(await rpc('eth_getTransactionReceipt', [hash]), null, `precondition: the reorg removed ${hash}`);
          assert.equal(await rpc('eth_getTransactionByHash', [hash]), null, `precondition: the node did not keep ${hash} in its pool`);
        }
      } finally {
        await rpc('evm_setIntervalMining', [1]);
      }
    });
    console.log(`# rolled back ${depth} block(s) holding ${hashes.length} answered settlements`);

    const receipts = await waitMined(hashes, 'every answered transaction mined again on the canonical chain');
    await expectPaidOnceBy(ps, hashes, receipts);
    for (const [i, p] of ps.entries()) {
      await expectStatusIncluded(p, hashes[i], receipts[i]);
      assert.equal(expectSettled(await stack.settle(p.body, { key: keys[i] }), { network: NETWORK, payer: p.authorization.from }), hashes[i], 'the first request retried names the same transaction');
      expectDuplicate(await stack.settle(p.body), { transaction: hashes[i], network: NETWORK, payer: p.authorization.from });
    }
    await waitPoolEmpty(stack.anvil);
    const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
    assert.deepEqual(history.settlements.map((t) => t.hash).sort(), [...hashes].sort(), 'the mined settlements are exactly the answered ones');
  });
});

/** Roll back every block from the lowest one including `hashes` (the miner held for those few ms). */
async function rollBackBlocksOf(hashes) {
  await rpc('evm_setIntervalMining', [0]);
  try {
    const receipts = await Promise.all(hashes.map((h) => stack.receipt(h)));
    const depth = Number(await rpc('eth_blockNumber')) - Math.min(...receipts.map((r) => Number(r.blockNumber))) + 1;
    await rpc('anvil_rollback', [depth]);
    const gone = await Promise.all(hashes.map(async (h) => (await rpc('eth_getTransactionReceipt', [h])) === null));
    return { depth, removed: gone.filter(Boolean).length };
  } finally {
    await rpc('evm_setIntervalMining', [1]);
  }
}

it('two reorganisations in a row with routerd running: the re-broadcast transactions are taken away again, and still mine once', async () => {
  const ps = [await newPayment(), await newPayment()];
  const mark = await chainMark(stack.anvil, stack.signer);
  const answers = await Promise.all(ps.map((p) => settleUntilDone(stack, p.body, { mine: false })));
  const hashes = answers.map((res, i) => expectSettled(res, { network: NETWORK, payer: ps[i].authorization.from }));
  await repairingGaps(hashes, async () => {
    for (const round of [1, 2]) {
      await waitMined(hashes, `the settlements on the canonical chain before reorg ${round}`);
      const { depth, removed } = await rollBackBlocksOf(hashes);
      assert.equal(removed, hashes.length, `precondition: reorg ${round} (${depth} block(s)) removed the settlements`);
      console.log(`# reorg ${round}: ${depth} block(s)`);
    }
    const receipts = await waitMined(hashes, 'every answered transaction on the canonical chain');
    await expectPaidOnceBy(ps, hashes, receipts);
    for (const [i, p] of ps.entries()) await expectStatusIncluded(p, hashes[i], receipts[i]);
    await waitPoolEmpty(stack.anvil);
    const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
    assert.deepEqual(history.settlements.map((t) => t.hash).sort(), [...hashes].sort());
  });
});

it('a settlement the node cannot try (as mid-reorganisation, asked for a block it no longer has) is no answer about the payment: 502, nothing stored, and it settles once the node answers', async () => {
  const p = await newPayment();
  // The lens call (which tries the settlement) gets anvil's mid-reorganisation error, so routerd
  // reads in a batch instead, whose eth_estimateGas is refused: neither is a revert.
  proxy.state.failing = (c) => c?.method === 'eth_call' && c.params?.length > 2;
  proxy.state.blocked = ['eth_estimateGas'];
  let res;
  try {
    res = await stack.settle(p.body);
  } finally {
    proxy.state.failing = null;
    proxy.state.blocked = [];
  }
  assert.equal(res.status, 400, res.text);
  assert.equal(res.body?.error, 502, `an unreachable chain, not a failed payment: ${res.text}`);
  assert.match(res.body?.message ?? '', /eth_estimateGas/, res.text);
  assert.equal((await stack.settlementStatus(p)).status, 404, 'nothing was claimed');
  const hash = expectSettled(await settleUntilDone(stack, p.body, { mine: false }), { network: NETWORK, payer: p.authorization.from });
  const [receipt] = await waitMined([hash], 'the settlement mined');
  await expectPaidOnceBy([p], [hash], [receipt]);
});

/** The methods routerd sent through the proxy while `fn` ran, with how often each. */
async function methodsDuring(fn) {
  const from = proxy.state.requests.length;
  const result = await fn();
  const counts = {};
  for (const method of proxy.state.requests.slice(from).flat()) counts[method] = (counts[method] ?? 0) + 1;
  return { result, counts };
}

it('a settlement\'s inclusion is read from its block\'s logs: no receipt is asked, and the status route names the block', async () => {
  const p = await newPayment();
  const { result: res, counts } = await methodsDuring(() => settleUntilDone(stack, p.body, { mine: false }));
  const hash = expectSettled(res, { network: NETWORK, payer: p.authorization.from });
  assert.ok(counts.eth_getLogs >= 1, `the block's logs read: ${JSON.stringify(counts)}`);
  assert.equal(counts.eth_getTransactionReceipt, undefined, `no receipt asked: ${JSON.stringify(counts)}`);
  const [receipt] = await waitMined([hash], 'the settlement mined');
  await expectStatusIncluded(p, hash, receipt);
  await expectPaidOnceBy([p], [hash], [receipt]);
});

it('logs the node fails to answer: the inclusion is read from the receipt, and the payment settles once', async () => {
  const p = await newPayment();
  proxy.state.failing = (c) => c?.method === 'eth_getLogs';
  let outcome;
  try {
    outcome = await methodsDuring(() => settleUntilDone(stack, p.body, { mine: false }));
  } finally {
    proxy.state.failing = null;
  }
  const hash = expectSettled(outcome.result, { network: NETWORK, payer: p.authorization.from });
  assert.ok(outcome.counts.eth_getTransactionReceipt >= 1, `the receipt read instead: ${JSON.stringify(outcome.counts)}`);
  const [receipt] = await waitMined([hash], 'the settlement mined');
  await expectStatusIncluded(p, hash, receipt);
  await expectPaidOnceBy([p], [hash], [receipt]);
});

it('receipts the node fails to look up are no news: a mined settlement is not taken for one that lost its nonce, and answers its own hash', async () => {
  const p = await newPayment();
  const nonceBefore = Number(await rpc('eth_getTransactionCount', [stack.signer, 'latest']));
  proxy.state.failing = (c) => ['eth_getTransactionReceipt', 'eth_getLogs'].includes(c?.method);
  const answer = stack.settle(p.body);
  try {
    // Mined while every receipt lookup fails, and then several heads more.
    await waitFor(async () => Number(await rpc('eth_getTransactionCount', [stack.signer, 'latest'])) > nonceBefore, {
      timeoutMs: 15_000, intervalMs: 200, what: 'the settlement mined',
    });
    await sleep(4_000);
  } finally {
    proxy.state.failing = null;
  }
  const hash = expectSettled(await answer, { network: NETWORK, payer: p.authorization.from });
  const [receipt] = await waitMined([hash], 'the answered transaction on the chain');
  await expectPaidOnceBy([p], [hash], [receipt]);
});

it('SIGKILL with the settlement stored but never broadcast: restarted on the node directly, it settles by the stored transaction', async () => {
  const p = await newPayment();
  const mark = await chainMark(stack.anvil, stack.signer);
  proxy.state.hanging = ['eth_sendRawTransaction'];
  const key = idempotencyKey();
  const inflight = stack.settle(p.body, { key }).catch((err) => err); // its connection dies with the daemon

  // routerd tried to broadcast: the raw transaction it signed is in the swallowed request.
  await waitFor(() => proxy.state.hung.length > 0, { timeoutMs: 15_000, what: 'a broadcast attempt (swallowed by the proxy)' });
  const raw = [proxy.state.hung[0]].flat().find((c) => c.method === 'eth_sendRawTransaction').params[0];
  const signed = keccak256(raw);
  const before = (await stack.settlementStatus(p)).body; // looked at below, after the settlement checks
  assert.equal(await rpc('eth_getTransactionByHash', [signed]), null, 'precondition: the node never got the transaction');
  await stack.routerd.kill();
  await inflight;

  proxy.state.hanging = [];
  stack.reconfigure({ rpcUrlFor: (name, url) => url }); // straight to the node from now on
  await stack.routerd.restart();

  const res = await settleUntilDone(stack, p.body, { key, mine: false }); // the killed request, asked again
  const hash = expectSettled(res, { network: NETWORK, payer: p.authorization.from });
  assert.equal(hash, signed, 'the payment settles by the transaction signed and stored before the kill');
  const [receipt] = await waitMined([hash], 'the settlement mined');
  await expectPaidOnceBy([p], [hash], [receipt]);
  assert.equal(expectSettled(await stack.settle(p.body, { key }), { network: NETWORK, payer: p.authorization.from }), hash, 'the first request retried answers the same hash');
  expectDuplicate(await stack.settle(p.body), { transaction: hash, network: NETWORK, payer: p.authorization.from });
  await waitPoolEmpty(stack.anvil);
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.deepEqual(history.all.map((t) => t.hash), [hash], 'one transaction, no other nonce used');

  assert.equal(before?.transaction, signed, `before the kill, the status route named the stored transaction: ${JSON.stringify(before)}`);
  assert.equal(before.state, 'signed', `stored, never broadcast: ${JSON.stringify(before)}`);
  await expectStatusIncluded(p, hash, receipt);
});

it('a reorganisation just after a restart takes away a settlement mined before it: the restarted routerd, which never saw that block, sends it again', async () => {
  const p = await newPayment();
  const mark = await chainMark(stack.anvil, stack.signer);
  const key = idempotencyKey();
  const hash = expectSettled(await settleUntilDone(stack, p.body, { key, mine: false }), { network: NETWORK, payer: p.authorization.from });
  const [mined] = await waitMined([hash], 'the settlement mined');
  const included = Number(mined.blockNumber);
  // Two blocks on top, so the including block is below the first head the restarted routerd reads.
  await waitFor(async () => Number(await rpc('eth_blockNumber')) >= included + 2, { timeoutMs: 10_000, what: 'two blocks past the settlement' });
  await rpc('evm_setIntervalMining', [0]);
  try {
    await stack.routerd.kill();
    await stack.routerd.restart();
    await sleep(1500); // its head watcher reads the head once: that block is all it knows
    const head = Number(await rpc('eth_blockNumber'));
    // The including block and all above it go, and one block fewer comes back: the head moves down,
    // to a height the watcher never knew the parent of.
    await frozen(stack.routerd, async () => {
      await rpc('anvil_rollback', [head - included + 1]);
      assert.equal(await rpc('eth_getTransactionByHash', [hash]), null, 'precondition: the rollback took the settlement away, pool included');
      await rpc('anvil_mine', [`0x${(head - included).toString(16)}`]);
    });
    await sleep(3000); // routerd follows the lower head before any block is added on top
  } finally {
    await rpc('evm_setIntervalMining', [1]);
  }
  const [receipt] = await waitMined([hash], 'the answered transaction mined again on the canonical chain');
  await expectPaidOnceBy([p], [hash], [receipt]);
  assert.equal(expectSettled(await stack.settle(p.body, { key }), { network: NETWORK, payer: p.authorization.from }), hash, 'the first request retried answers the same hash');
  await waitPoolEmpty(stack.anvil);
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.deepEqual(history.all.map((t) => t.hash), [hash], 'one transaction, no other nonce used');
  await expectStatusIncluded(p, hash, receipt);
});
