// A front-run is still one payment (spec/access.md section 1): somebody copies the calldata of a
// settlement routerd has broadcast (transferWithAuthorization, the payer's signed authorization)
// and mines it from another account first. The value reached payTo by that transaction, so the
// payment is answered success: true once, naming that transaction; every other settle of it is
// the duplicate, told that transaction; the payer is not cooled down and its next payment settles.
//
// anvil --no-mining + evm_mine, so the front-run can be ordered:
// - the node forgets routerd's transaction (anvil_dropTransaction) and the copy is mined alone:
//   routerd sees the authorization used while its own transaction is unmined, answers the
//   success by the copy, and replaces its own transaction with a self-transfer: no signer
//   transaction reverts, no nonce is wasted;
// - the copy outbids routerd's transaction in the same block: routerd's reverts (unavoidably),
//   and the payment is still answered the success by the copy, with no cooldown for its payer.
// Without the rule, routerd's transaction is mined after the copy and reverts, the merchant is told
// success: false, and the payer is refused for revert_cooldown_secs. A transaction that used the
// nonce with another effect (the payer's cancelAuthorization, outbidding routerd's) is no payment:
// success: false, as before.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK, CHAIN_ID } from './lib/stack.mjs';
import { anvilKey } from './lib/accounts.mjs';
import { walletFor, usdcAbi } from './lib/deploy-usdc.mjs';
import { expectSettled, expectSettleFailed, expectDuplicate, expectValid } from './lib/expect.mjs';
import { chainMark, expectCleanSignerHistory, expectTransfersAuthorization, minedFrom, waitPoolEmpty } from './lib/chain-audit.mjs';
import { waitInPool, mining } from './lib/settling.mjs';
import { metricValue } from './lib/hostile.mjs';
import { idempotencyKey } from './lib/util.mjs';

const PRICE = 1000n;
const FRONT_RUNNER = 5; // an anvil account with ETH, no role in the stack
const COOLDOWN_METRIC = 'routerd_payer_revert_cooldowns_total';

let stack;
let frontRunner;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { noMining: true },
    fundedPayers: 3,
    routerd: { settleTimeoutSecs: 30 },
  });
  frontRunner = await walletFor(stack.anvil.url, anvilKey(FRONT_RUNNER));
});

after(() => stack?.stop());

/** The front-runner sends routerd's settlement calldata `tx.input` from its own account. */
function copy(tx, { tip }) {
  return frontRunner.sendTransaction({
    to: stack.usdc, data: tx.input, gas: 200_000n, maxPriorityFeePerGas: tip, maxFeePerGas: tip + 10n ** 10n,
  });
}

async function cooldowns() {
  const value = metricValue(await (await fetch(`${stack.url}/metrics`)).text(), COOLDOWN_METRIC);
  assert.notEqual(value, undefined, `no ${COOLDOWN_METRIC} in /metrics`);
  return value;
}

/** Once settled by `by`: the key retry gets the success, any other settle the duplicate, the status route names it. */
async function expectSettledOnceBy(p, key, by) {
  const payer = p.authorization.from;
  assert.equal(expectSettled(await stack.settle(p.body, { key }), { network: NETWORK, payer }), by, 'the key retry: the same success');
  expectDuplicate(await stack.settle(p.body), { network: NETWORK, payer, transaction: by });
  const status = (await stack.settlementStatus(p)).body;
  assert.equal(status.state, 'front_run', JSON.stringify(status));
  assert.equal(status.transaction, by, JSON.stringify(status));
  assert.equal(status.outcome?.success, true, JSON.stringify(status));
  assert.equal(status.outcome?.transaction, by, JSON.stringify(status));
  assert.equal(status.lost, false, JSON.stringify(status));
}

/** The payer's next payment is valid and settles. */
async function expectNextPaymentSettles(account) {
  const q = await stack.pay({ account, amount: PRICE });
  expectValid(await stack.verify(q.body), { payer: getAddress(account.address) });
  const hash = expectSettled(await mining(stack.anvil, stack.settle(q.body)), { network: NETWORK, payer: account.address });
  expectTransfersAuthorization((await stack.receipt(hash)).logs, stack.usdc, q.authorization, hash);
}

it('the copy is mined alone while routerd\'s transaction is unmined: success once by the copy, routerd\'s replaced by a self-transfer, nothing reverted', async () => {
  const account = stack.payers[0];
  const p = await stack.pay({ account, amount: PRICE });
  const payeeBefore = await stack.balanceOf(p.authorization.to);
  const mark = await chainMark(stack.anvil, stack.signer);
  const key = idempotencyKey();

  const first = stack.settle(p.body, { key });
  const tx = await waitInPool(stack, p);
  // The node forgets routerd's transaction; the copy is mined in a block without it.
  await stack.anvil.rpc('anvil_dropTransaction', [tx.hash]);
  const by = await copy(tx, { tip: BigInt(tx.maxPriorityFeePerGas) });
  const res = await mining(stack.anvil, first);
  const hash = expectSettled(res, { network: NETWORK, payer: account.address });
  assert.equal(hash, by, 'the success names the transaction that moved the funds');
  const receipt = await stack.receipt(by);
  assert.equal(receipt.status, 'success');
  expectTransfersAuthorization(receipt.logs, stack.usdc, p.authorization, by);
  assert.equal(await stack.balanceOf(p.authorization.to), payeeBefore + PRICE, 'the payee was paid once');

  await mining(stack.anvil, waitPoolEmpty(stack.anvil));
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.deepEqual(history.settlements, [], 'routerd\'s own settlement was never mined');
  assert.deepEqual(history.selfTransfers.map((t) => t.nonce), [mark.nonce], 'a self-transfer took its nonce');
  await expectSettledOnceBy(p, key, by);
  assert.equal(await cooldowns(), 0, 'nobody was cooled down');
  await expectNextPaymentSettles(account);
});

it('the copy outbids routerd\'s transaction in the same block: routerd\'s reverts, the payment is still success once by the copy, its payer is not cooled down', async () => {
  const account = stack.payers[1];
  const p = await stack.pay({ account, amount: PRICE });
  const payeeBefore = await stack.balanceOf(p.authorization.to);
  const mark = await chainMark(stack.anvil, stack.signer);
  const key = idempotencyKey();

  const first = stack.settle(p.body, { key });
  const tx = await waitInPool(stack, p);
  const by = await copy(tx, { tip: BigInt(tx.maxPriorityFeePerGas) * 10n + 10n ** 9n });
  const res = await mining(stack.anvil, first);
  const mined = await minedFrom(stack.anvil, [stack.signer, frontRunner.account.address], { fromBlock: mark.block });
  const theirs = mined.find((t) => t.hash === by);
  const ours = mined.find((t) => t.hash === tx.hash);
  assert.equal(mined.length, 2, JSON.stringify(mined.map((t) => t.hash)));
  assert.equal(theirs?.status, 'success', 'the copy executed the authorization');
  assert.equal(ours?.status, 'reverted', 'routerd\'s transaction came after it in the block');
  assert.equal(theirs.blockNumber, ours.blockNumber, 'in one block');

  assert.equal(expectSettled(res, { network: NETWORK, payer: account.address }), by, 'the success names the transaction that moved the funds');
  assert.equal(await stack.balanceOf(p.authorization.to), payeeBefore + PRICE, 'the payee was paid once');
  await expectSettledOnceBy(p, key, by);
  assert.equal(await cooldowns(), 0, 'the payer was not cooled down');
  await expectNextPaymentSettles(account);
});

it('the nonce used by another effect first (the payer cancels the authorization, outbidding routerd\'s transaction): no payment, success: false with routerd\'s transaction', async () => {
  const account = stack.payers[2];
  const p = await stack.pay({ account, amount: PRICE });
  const payeeBefore = await stack.balanceOf(p.authorization.to);
  const first = stack.settle(p.body);
  const tx = await waitInPool(stack, p);
  const signature = await account.signTypedData({
    domain: { name: stack.token.name, version: stack.token.version, chainId: CHAIN_ID, verifyingContract: stack.usdc },
    types: { CancelAuthorization: [{ name: 'authorizer', type: 'address' }, { name: 'nonce', type: 'bytes32' }] },
    primaryType: 'CancelAuthorization',
    message: { authorizer: account.address, nonce: p.authorization.nonce },
  });
  const tip = BigInt(tx.maxPriorityFeePerGas) * 10n + 10n ** 9n;
  const cancel = await frontRunner.writeContract({
    address: stack.usdc, abi: usdcAbi, functionName: 'cancelAuthorization', args: [account.address, p.authorization.nonce, signature],
    gas: 200_000n, maxPriorityFeePerGas: tip, maxFeePerGas: tip + 10n ** 10n,
  });
  const res = await mining(stack.anvil, first);
  assert.equal((await stack.receipt(cancel)).status, 'success', 'the cancellation came first');
  assert.equal((await stack.receipt(tx.hash)).status, 'reverted');
  expectSettleFailed(res, 'invalid_payload', { network: NETWORK, payer: getAddress(account.address), transaction: tx.hash });
  assert.equal(await stack.balanceOf(p.authorization.to), payeeBefore, 'nothing moved');
  assert.equal((await stack.settlementStatus(p)).body.outcome?.success, false);
});
