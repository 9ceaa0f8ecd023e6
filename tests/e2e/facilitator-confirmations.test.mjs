// chains.<name>.confirmations and finality_depth (spec/x402-facilitator.md section 3, States): on a
// chain that mines only when told, with confirmations = 3, settle answers success only once the
// transaction is 3 blocks deep; a reorganisation before that re-broadcasts the same transaction and
// the answer waits for it; the status route shows the depth, and "final" past finality_depth.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { sleep, waitFor, idempotencyKey } from './lib/util.mjs';
import { expectSettled, expectDuplicate, show } from './lib/expect.mjs';
import { chainMark, expectCleanSignerHistory, pooledFrom } from './lib/chain-audit.mjs';
import { waitInPool, frozen } from './lib/settling.mjs';

const CONFIRMATIONS = 3;
const FINALITY_DEPTH = 6;
// routerd polls the head every 500 ms (poll_interval_ms): this is several polls, enough for it to
// have seen a block and to have answered if it (wrongly) would.
const SEEN_MS = 2_000;

let stack;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { noMining: true },
    fundedPayers: 3,
    chainExtra: `confirmations = ${CONFIRMATIONS}\nfinality_depth = ${FINALITY_DEPTH}\n`,
    routerd: { settleTimeoutSecs: 60 },
  });
});

after(() => stack?.stop());

/** A settle call (with its own Idempotency-Key, `watch.key`) whose answer can be looked at without waiting for it. */
function watchedSettle(body) {
  const watch = { res: null, key: idempotencyKey() };
  watch.answer = stack.settle(body, { key: watch.key }).then((res) => { watch.res = res; return res; });
  return watch;
}

const head = async () => Number(await stack.client.getBlockNumber());

/** The status route's view once it has caught up with `depth` confirmations (or its last view). */
async function statusAtDepth(p, depth) {
  let body;
  await waitFor(async () => {
    body = (await stack.settlementStatus(p)).body;
    return body?.confirmations === depth;
  }, { timeoutMs: 5_000, what: `status confirmations ${depth}` }).catch(() => {});
  assert.equal(body?.confirmations, depth, `status route: ${JSON.stringify(body)}`);
  return body;
}

it(`with confirmations = ${CONFIRMATIONS}, settle answers success only when the transaction is ${CONFIRMATIONS} blocks deep`, async () => {
  const p = await stack.pay({ account: stack.payers[0] });
  const payerBefore = await stack.balanceOf(p.authorization.from);
  const watch = watchedSettle(p.body);
  const tx = await waitInPool(stack, p);

  await stack.anvil.mine();
  const receipt = await stack.receipt(tx.hash);
  assert.equal(receipt.status, 'success', 'precondition: the settlement is mined');
  for (let depth = 1; depth < CONFIRMATIONS; depth += 1) {
    await sleep(SEEN_MS);
    assert.equal(watch.res, null, `settle answered at ${depth} confirmation(s): ${watch.res && show(watch.res)}`);
    const s = await statusAtDepth(p, depth);
    assert.equal(s.state, 'included', JSON.stringify(s));
    assert.equal(s.transaction, tx.hash);
    assert.notEqual(s.outcome?.success, true, `status shows success at ${depth} confirmation(s): ${JSON.stringify(s)}`);
    await stack.anvil.mine();
  }

  const res = await Promise.race([watch.answer, sleep(15_000).then(() => null)]);
  assert.ok(res, `no answer once the transaction is ${CONFIRMATIONS} blocks deep (head ${await head()}, block ${receipt.blockNumber})`);
  assert.equal(expectSettled(res, { network: NETWORK, payer: p.authorization.from }), tx.hash);
  assert.equal(await head() - Number(receipt.blockNumber) + 1, CONFIRMATIONS, 'answered with no block mined past the required depth');
  const s = await statusAtDepth(p, CONFIRMATIONS);
  assert.deepEqual({ success: s.outcome?.success, transaction: s.outcome?.transaction }, { success: true, transaction: tx.hash });
  assert.equal(await stack.balanceOf(p.authorization.from), payerBefore - 1000n);
});

it(`the status route shows "included" until finality_depth (${FINALITY_DEPTH}) blocks past inclusion, then "final"`, async () => {
  const p = await stack.pay({ account: stack.payers[1] });
  const watch = watchedSettle(p.body);
  const tx = await waitInPool(stack, p);
  await stack.anvil.mine(CONFIRMATIONS);
  const hash = expectSettled(await watch.answer, { network: NETWORK, payer: p.authorization.from });
  assert.equal(hash, tx.hash);
  const block = Number((await stack.receipt(hash)).blockNumber);

  await stack.anvil.mine(FINALITY_DEPTH - 1 - CONFIRMATIONS);
  const depth = await head() - block + 1;
  const s = await statusAtDepth(p, depth);
  assert.equal(s.state, 'included', `at ${depth} confirmations, below finality_depth: ${JSON.stringify(s)}`);

  await stack.anvil.mine(2); // past finality_depth
  await waitFor(async () => (await stack.settlementStatus(p)).body?.state === 'final', { timeoutMs: 10_000, what: 'state "final"' })
    .catch(async () => assert.fail(`not final ${await head() - block + 1} blocks deep: ${(await stack.settlementStatus(p)).text}`));
  const fin = (await stack.settlementStatus(p)).body;
  assert.equal(fin.transaction, hash);
  assert.equal(fin.block, block);
  assert.equal(fin.outcome?.success, true);
  assert.equal(expectSettled(await stack.settle(p.body, { key: watch.key }), { network: NETWORK, payer: p.authorization.from }), hash, 'the first request of a final payment, retried');
  expectDuplicate(await stack.settle(p.body), { transaction: hash, network: NETWORK, payer: p.authorization.from });
});

it('a reorganisation before the required depth: the same transaction is re-broadcast and the answer waits for its new depth', async () => {
  const p = await stack.pay({ account: stack.payers[2] });
  const mark = await chainMark(stack.anvil, stack.signer);
  const watch = watchedSettle(p.body);
  const tx = await waitInPool(stack, p);
  await stack.anvil.mine();
  assert.equal((await stack.receipt(tx.hash)).status, 'success', 'precondition: included');
  await sleep(SEEN_MS); // routerd sees the inclusion

  // The including block is replaced by an empty one; anvil does not put the transaction back.
  await frozen(stack.routerd, async () => {
    await stack.anvil.rpc('anvil_rollback', [1]);
    assert.equal(await stack.anvil.rpc('eth_getTransactionReceipt', [tx.hash]), null, 'precondition: the reorg removed the transaction');
    assert.equal((await pooledFrom(stack.anvil, stack.signer))[String(Number(tx.nonce))], undefined, 'precondition: the node did not keep it');
    await stack.anvil.mine();
  });
  await waitFor(async () => (await pooledFrom(stack.anvil, stack.signer))[String(Number(tx.nonce))]?.hash === tx.hash, {
    timeoutMs: 15_000, what: 'the stored transaction re-broadcast (same hash)',
  });
  assert.equal(watch.res, null, `settle answered while its transaction was out of the chain: ${watch.res && show(watch.res)}`);

  await stack.anvil.mine();
  const receipt = await stack.receipt(tx.hash);
  for (let depth = 1; depth < CONFIRMATIONS; depth += 1) {
    await sleep(SEEN_MS);
    assert.equal(watch.res, null, `answered at ${depth} confirmation(s) after the reorg`);
    await stack.anvil.mine();
  }
  const res = await Promise.race([watch.answer, sleep(15_000).then(() => null)]);
  assert.ok(res, 'no answer after the re-broadcast transaction is deep enough');
  assert.equal(expectSettled(res, { network: NETWORK, payer: p.authorization.from }), tx.hash);
  const s = await statusAtDepth(p, await head() - Number(receipt.blockNumber) + 1);
  assert.equal(s.blockHash, receipt.blockHash, 'the status route names the new including block');
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.deepEqual(history.all.map((t) => t.hash), [tx.hash], 'one transaction, mined once');
});
