// A front-run of a Permit2 settlement is still one payment (spec/access.md section 1), as an
// ERC-3009 one is (facilitator-front-run.test.mjs): somebody copies the calldata of the settlement
// routerd has broadcast (x402's exact proxy's settle, with the payer's permit) and mines it from
// another account first. Permit2 marks the nonce used without a log, so routerd finds the copy
// among the payer's transfers: a transaction that is not its own, to the same contract with the
// same calldata, that moved the signed value out of the payer.
//
// anvil --no-mining + evm_mine, so the front-run can be ordered:
// - the node forgets routerd's transaction and the copy is mined alone: success once by the copy,
//   and routerd's own transaction is replaced by a self-transfer at its nonce, so nothing reverts;
// - the copy outbids routerd's transaction in the same block: routerd's reverts (unavoidably), and
//   the payment is still success once by the copy, its payer not cooled down.
// Without the rule, the first is answered a failure (the authorization used elsewhere) and the
// second a revert, its payer cooled down, while the value reached payTo. A transfer of the same
// value to payTo that is not the permit's call (the payer invalidates the nonce and pays payTo
// itself, outbidding routerd's transaction) is no copy: success: false, as before.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress, erc20Abi, parseAbi, toHex } from 'viem';
import { ExactEvmScheme as ExactEvmClientScheme } from '@x402/evm/exact/client';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { anvilAccount, anvilKey, freshAccount, ROLE } from './lib/accounts.mjs';
import { walletFor } from './lib/deploy-usdc.mjs';
import { expectSettled, expectDuplicate } from './lib/expect.mjs';
import { chainMark, minedFrom, pooledFrom, waitPoolEmpty } from './lib/chain-audit.mjs';
import { mining } from './lib/settling.mjs';
import { metricValue } from './lib/hostile.mjs';
import { idempotencyKey, waitFor } from './lib/util.mjs';
import { PERMIT2, EXACT_PROXY, approvePermit2, placePermit2 } from './lib/permit2.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = 10_000n;
const FUNDS = 1_000_000n;
const FRONT_RUNNER = 5; // an anvil account with ETH, no role in the stack
const COOLDOWN_METRIC = 'routerd_payer_revert_cooldowns_total';
const USDC_EIP712 = { name: 'USD Coin', version: '2' };
const PERMIT2_ABI = parseAbi(['function invalidateUnorderedNonces(uint256 wordPos, uint256 mask)']);

let stack;
let frontRunner;
const payTo = anvilAccount(ROLE.payee).address;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { noMining: true },
    routerd: { x402Versions: [1, 2], settleTimeoutSecs: 30 },
    usdcExtra: 'transfer_methods = ["eip3009", "permit2"]\n',
    beforeRouterd: async (s) => { await placePermit2(s.client); },
  });
  frontRunner = await walletFor(stack.anvil.url, anvilKey(FRONT_RUNNER));
});

after(() => stack?.stop());

const balanceOf = (address) => stack.balanceOf(address);

/** A payer holding FUNDS of USDC and some ETH, Permit2 approved. */
async function newPayer() {
  const payer = freshAccount();
  await stack.anvil.rpc('anvil_setBalance', [payer.address, '0xde0b6b3a7640000']);
  await mining(stack.anvil, stack.mint(payer.address, FUNDS));
  await mining(stack.anvil, approvePermit2(payer, stack.client, stack.usdc));
  return payer;
}

/** The official client's v2 Permit2 body for PRICE to payTo, and its permit's nonce. */
async function permit2Payment(payer) {
  const reqs = {
    scheme: 'exact', network: NETWORK, amount: String(PRICE), asset: getAddress(stack.usdc), payTo, maxTimeoutSeconds: 60,
    extra: { assetTransferMethod: 'permit2', ...USDC_EIP712 },
  };
  const partial = await new ExactEvmClientScheme(payer).createPaymentPayload(2, reqs);
  const paymentPayload = { ...partial, x402Version: 2, resource: { url: 'https://example.com/r', description: 'e2e', mimeType: 'application/json' }, accepted: reqs };
  const nonce = BigInt(paymentPayload.payload.permit2Authorization.nonce);
  return { body: { x402Version: 2, paymentPayload, paymentRequirements: reqs }, nonce };
}

/** routerd's settlement of the permit with `nonce`, once it is in the pool. */
function inPool(nonce) {
  const needle = toHex(nonce, { size: 32 }).slice(2);
  return waitFor(async () => Object.values(await pooledFrom(stack.anvil, stack.signer))
    .find((t) => (t.input ?? '').toLowerCase().includes(needle)), { timeoutMs: 15_000, intervalMs: 100, what: 'the Permit2 settlement in the pool' });
}

/** The front-runner sends routerd's settlement calldata `tx.input` to the same contract from its own account. */
function copy(tx, { tip }) {
  return frontRunner.sendTransaction({
    to: tx.to, data: tx.input, gas: 300_000n, maxPriorityFeePerGas: tip, maxFeePerGas: tip + 10n ** 10n,
  });
}

async function cooldowns() {
  const value = metricValue(await (await fetch(`${stack.url}/metrics`)).text(), COOLDOWN_METRIC);
  assert.notEqual(value, undefined, `no ${COOLDOWN_METRIC} in /metrics`);
  return value;
}

/** Settled once by `by`: the key retry gets the success, any other settle the duplicate naming it. */
async function expectSettledOnceBy(body, key, payer, by) {
  assert.equal(expectSettled(await stack.settle(body, { key }), { network: NETWORK, payer }), by, 'the key retry: the same success');
  expectDuplicate(await stack.settle(body), { network: NETWORK, payer, transaction: by, version: 2 });
}

/** The payer's next Permit2 payment settles, from routerd's signer. */
async function expectNextPaymentSettles(payer) {
  const { body } = await permit2Payment(payer);
  const hash = expectSettled(await mining(stack.anvil, stack.settle(body)), { network: NETWORK, payer: getAddress(payer.address) });
  const receipt = await stack.receipt(hash);
  assert.equal(receipt.status, 'success');
  assert.equal(getAddress(receipt.from), getAddress(stack.signer));
}

/** A new payer's Permit2 payment sent to /settle (with an Idempotency-Key), once its transaction is in the pool. */
async function settling() {
  const payer = await newPayer();
  const { body, nonce } = await permit2Payment(payer);
  const payeeBefore = await balanceOf(payTo);
  const mark = await chainMark(stack.anvil, stack.signer);
  const key = idempotencyKey();
  const first = stack.settle(body, { key });
  return { payer, body, payeeBefore, mark, key, first, tx: await inPool(nonce) };
}

/** Answered success once by the copy `by`: the value moved once, nobody cooled down, the payer's next payment settles. */
async function expectAnsweredByTheCopy({ payer, body, payeeBefore, key }, res, by) {
  assert.equal(expectSettled(res, { network: NETWORK, payer: getAddress(payer.address) }), by, 'the success names the transaction that moved the funds');
  assert.equal(await balanceOf(payTo), payeeBefore + PRICE, 'the payee was paid once');
  await expectSettledOnceBy(body, key, getAddress(payer.address), by);
  assert.equal(await cooldowns(), 0, 'nobody was cooled down');
  await expectNextPaymentSettles(payer);
}

it('the copy is mined alone while routerd\'s transaction is unmined: success once by the copy, routerd\'s replaced by a self-transfer, nothing reverted', async () => {
  const payment = await settling();
  const { mark, first, tx } = payment;
  assert.equal(getAddress(tx.to), getAddress(EXACT_PROXY), 'settled through the exact proxy');
  await stack.anvil.rpc('anvil_dropTransaction', [tx.hash]);
  const by = await copy(tx, { tip: BigInt(tx.maxPriorityFeePerGas) });
  const res = await mining(stack.anvil, first);
  assert.equal((await stack.receipt(by)).status, 'success');
  await mining(stack.anvil, waitPoolEmpty(stack.anvil));
  const ours = await minedFrom(stack.anvil, [stack.signer], { fromBlock: mark.block });
  assert.deepEqual(ours.map((t) => [t.nonce, getAddress(t.to), t.status]), [[mark.nonce, getAddress(stack.signer), 'success']],
    'routerd\'s settlement was never mined: a self-transfer took its nonce');
  await expectAnsweredByTheCopy(payment, res, by);
});

it('the copy outbids routerd\'s transaction in the same block: routerd\'s reverts, the payment is still success once by the copy, its payer is not cooled down', async () => {
  const payment = await settling();
  const { mark, first, tx } = payment;
  const by = await copy(tx, { tip: BigInt(tx.maxPriorityFeePerGas) * 10n + 10n ** 9n });
  const res = await mining(stack.anvil, first);
  const mined = await minedFrom(stack.anvil, [stack.signer, frontRunner.account.address], { fromBlock: mark.block });
  const theirs = mined.find((t) => t.hash === by);
  const ours = mined.find((t) => t.hash === tx.hash);
  assert.equal(theirs?.status, 'success', 'the copy executed the permit');
  assert.equal(ours?.status, 'reverted', 'routerd\'s transaction came after it in the block');
  assert.equal(theirs.blockNumber, ours.blockNumber, 'in one block');
  await expectAnsweredByTheCopy(payment, res, by);
});

it('the payer invalidates the nonce and pays payTo the same value itself, outbidding routerd: no copy, so no payment: success: false with routerd\'s transaction', async () => {
  const payer = await newPayer();
  const { body, nonce } = await permit2Payment(payer);
  const payeeBefore = await balanceOf(payTo);

  const first = stack.settle(body);
  const tx = await inPool(nonce);
  const tip = BigInt(tx.maxPriorityFeePerGas) * 10n + 10n ** 9n;
  const fees = { gas: 200_000n, maxPriorityFeePerGas: tip, maxFeePerGas: tip + 10n ** 10n };
  const invalidated = await stack.client.writeContract({
    account: payer, address: PERMIT2, abi: PERMIT2_ABI, functionName: 'invalidateUnorderedNonces', args: [nonce >> 8n, 1n << (nonce & 0xffn)], ...fees,
  });
  const paid = await stack.client.writeContract({ account: payer, address: stack.usdc, abi: erc20Abi, functionName: 'transfer', args: [payTo, PRICE], ...fees });
  const res = await mining(stack.anvil, first);
  assert.equal((await stack.receipt(invalidated)).status, 'success', 'the invalidation came first');
  assert.equal((await stack.receipt(paid)).status, 'success');
  assert.equal((await stack.receipt(tx.hash)).status, 'reverted');
  assert.equal(res.status, 200, JSON.stringify(res.body));
  assert.equal(res.body.success, false, JSON.stringify(res.body));
  assert.equal(res.body.transaction, tx.hash, JSON.stringify(res.body));
  assert.equal(await balanceOf(payTo), payeeBefore + PRICE, 'only the payer\'s own transfer moved');
});
