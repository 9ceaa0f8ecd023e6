// routerd as the facilitator of x402's `batch-settlement` scheme (spec/batch-settlement.md) taking
// deposits through Permit2: the requirements say `assetTransferMethod: "permit2"`, and the official
// @x402/evm 2.27.0 client signs a PermitWitnessTransferFrom whose spender is the Permit2 deposit
// collector and whose witness names the channel. On anvil, with routerd's own escrow and collectors
// (lib/batch-settlement.mjs), Permit2 (lib/permit2.mjs) and Circle's USDC served by Permit2 only:
// - /supported lists the scheme on the network (its only token takes Permit2 deposits);
// - verify of a Permit2 deposit is valid with the channel snapshot; the same deposit settled five
//   times at once moves it once, in one transaction: escrow holds exactly the deposit, the payer
//   paid no gas; the channel's vouchers then verify;
// - a payer that has not approved Permit2 is refused with permit2_allowance_required, at verify and
//   at settle, and nothing is sent;
// - a forged signature, a spender other than the collector, an amount other than the deposit's and
//   an expired deadline are refused with their Permit2 reasons;
// - `eip2612GasSponsoring`: a payer that never approved Permit2 and holds no ETH deposits with the
//   EIP-2612 permit the client signs, which the collector submits in the deposit's transaction; a
//   permit for another amount is refused with the binding's reason.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress, erc20Abi } from 'viem';
import { declareEip2612GasSponsoringExtension } from '@x402/extensions';
import { toClientEvmSigner } from '@x402/evm';
import { BatchSettlementEvmScheme as BatchClient } from '@x402/evm/batch-settlement/client';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { anvilAccount, freshAccount, ROLE } from './lib/accounts.mjs';
import { mintUsdc, usdcAbi, USDC_EIP712 } from './lib/deploy-usdc.mjs';
import { BATCH_SETTLEMENT, PERMIT2_COLLECTOR, placeBatchSettlement, readChannel } from './lib/batch-settlement.mjs';
import { PERMIT2, approvePermit2, placePermit2 } from './lib/permit2.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = 1000n;
const FUNDS = 1_000_000n;
const receiver = anvilAccount(ROLE.payee).address;
const authorizer = freshAccount();

let stack;
const it = (name, fn, opts = {}) => test(name, { timeout: 60_000, ...opts }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    routerd: { x402Versions: [1, 2], allowHttpResource: true, extra: 'batch_settlement = true\n' },
    usdcExtra: 'transfer_methods = ["permit2"]\n',
    beforeRouterd: async (s) => {
      await placeBatchSettlement(s.client);
      await placePermit2(s.client);
    },
  });
});

after(async () => {
  await stack?.stop();
});

function requirements() {
  return {
    scheme: 'batch-settlement', network: NETWORK, amount: String(PRICE), asset: getAddress(stack.usdc), payTo: receiver,
    maxTimeoutSeconds: 3600,
    extra: {
      receiverAuthorizer: authorizer.address, withdrawDelay: 900, assetTransferMethod: 'permit2', ...USDC_EIP712,
    },
  };
}

/** A payer holding USDC (and ETH for its one approval), that approved Permit2 when `approve`. */
async function newPayer({ approve = true } = {}) {
  const account = freshAccount();
  await mintUsdc(stack.client, stack.usdc, account.address, FUNDS);
  if (approve) {
    await stack.anvil.rpc('anvil_setBalance', [account.address, '0xde0b6b3a7640000']);
    await approvePermit2(account, stack.client, stack.usdc);
  }
  return { account, client: new BatchClient(toClientEvmSigner(account, stack.client)) };
}

/**
 * The client's next payload (with the extensions `context` declares); `charged()` tells the client
 * the request was charged the price.
 */
async function pay(client, reqs = requirements(), context = undefined) {
  const { payload, extensions } = await client.createPaymentPayload(2, reqs, context);
  const paymentPayload = { x402Version: 2, accepted: reqs, payload, ...(extensions ? { extensions } : {}) };
  const charged = () => client.schemeHooks.onPaymentResponse({
    settleResponse: { success: true, extra: { chargedAmount: String(PRICE) } }, paymentPayload, requirements: reqs,
  });
  return { paymentPayload, payload, charged, body: { x402Version: 2, paymentPayload, paymentRequirements: structuredClone(reqs) } };
}

const verify = (body) => stack.post('/verify', body);
const settle = (body) => stack.post('/settle', body);
const balanceOf = (address) => stack.client.readContract({ address: stack.usdc, abi: usdcAbi, functionName: 'balanceOf', args: [address] });

it('/supported lists batch-settlement on a network whose token takes Permit2 deposits only', async () => {
  const { status, body } = await stack.request('/supported');
  assert.equal(status, 200);
  const kind = body.kinds.find((k) => k.scheme === 'batch-settlement');
  assert.deepEqual(kind, { x402Version: 2, scheme: 'batch-settlement', network: NETWORK });
});

it('a Permit2 deposit verifies, settles once in one transaction, and vouchers verify against its channel', async () => {
  const { account, client } = await newPayer();
  const deposit = await pay(client);
  assert.equal(deposit.payload.type, 'deposit');
  const permit = deposit.payload.deposit.authorization.permit2Authorization;
  assert.ok(permit, JSON.stringify(deposit.payload));
  assert.equal(getAddress(permit.spender), PERMIT2_COLLECTOR);
  const verified = await verify(deposit.body);
  assert.equal(verified.status, 200);
  assert.equal(verified.body.isValid, true, JSON.stringify(verified.body));
  assert.equal(verified.body.payer, account.address);
  const channelId = deposit.payload.voucher.channelId;
  assert.deepEqual(verified.body.extra, { channelId, balance: '0', totalClaimed: '0', withdrawRequestedAt: 0, refundNonce: '0' });

  const escrowBefore = await balanceOf(BATCH_SETTLEMENT);
  const ethBefore = await stack.client.getBalance({ address: account.address });
  const answers = await Promise.all(Array.from({ length: 5 }, () => settle(deposit.body)));
  const successes = answers.filter((a) => a.body.success);
  assert.equal(successes.length, 1, JSON.stringify(answers.map((a) => a.body)));
  const [won] = successes;
  assert.equal(won.body.amount, deposit.payload.deposit.amount);
  assert.match(won.body.transaction, /^0x[0-9a-f]{64}$/);
  for (const other of answers.filter((a) => !a.body.success)) {
    assert.equal(other.status, 200);
    assert.ok(other.body.errorReason, JSON.stringify(other.body));
    if (other.body.transaction) assert.equal(other.body.transaction, won.body.transaction, JSON.stringify(other.body));
  }
  const receipt = await stack.client.getTransactionReceipt({ hash: won.body.transaction });
  assert.equal(receipt.status, 'success');
  const amount = BigInt(deposit.payload.deposit.amount);
  assert.equal(await balanceOf(BATCH_SETTLEMENT), escrowBefore + amount);
  assert.equal(await stack.client.getBalance({ address: account.address }), ethBefore);
  assert.equal(won.body.extra.channelState.balance, String(amount));
  assert.equal((await readChannel(stack.client, channelId)).balance, amount);

  await deposit.charged();
  const voucher = await pay(client);
  assert.equal(voucher.payload.type, 'voucher');
  const ok = await verify(voucher.body);
  assert.equal(ok.body.isValid, true, JSON.stringify(ok.body));
  assert.equal(ok.body.extra.balance, String(amount));
});

it('a Permit2 deposit of a payer that has not approved Permit2 is refused, and nothing is sent', async () => {
  const { client } = await newPayer({ approve: false });
  const deposit = await pay(client);
  assert.ok(deposit.payload.deposit.authorization.permit2Authorization);
  const reason = 'invalid_batch_settlement_evm_permit2_allowance_required';
  const verified = await verify(deposit.body);
  assert.equal(verified.status, 200, verified.text);
  assert.equal(verified.body.isValid, false);
  assert.equal(verified.body.invalidReason, reason, verified.text);

  const escrowBefore = await balanceOf(BATCH_SETTLEMENT);
  const blockBefore = await stack.client.getBlockNumber();
  const settled = await settle(deposit.body);
  assert.equal(settled.status, 200, settled.text);
  assert.equal(settled.body.success, false, settled.text);
  assert.equal(settled.body.errorReason, reason, settled.text);
  assert.equal(settled.body.transaction, '', settled.text);
  assert.equal(await balanceOf(BATCH_SETTLEMENT), escrowBefore);
  const latest = await stack.client.getBlockNumber();
  for (let n = blockBefore + 1n; n <= latest; n += 1n) {
    const block = await stack.client.getBlock({ blockNumber: n, includeTransactions: true });
    assert.ok(!block.transactions.some((t) => t.to && getAddress(t.to) === BATCH_SETTLEMENT), `block ${n} calls the escrow`);
  }
});

it('a Permit2 deposit with a forged signature, another spender or amount, or an expired deadline is refused with its reason', async () => {
  const { client } = await newPayer();
  const deposit = await pay(client);
  const refused = async (mutate, reason) => {
    const body = structuredClone(deposit.body);
    mutate(body.paymentPayload.payload.deposit.authorization.permit2Authorization, body.paymentPayload.payload);
    const { status, body: answer } = await verify(body);
    assert.equal(status, 200, `${reason}: ${JSON.stringify(answer)}`);
    assert.equal(answer.isValid, false, reason);
    assert.equal(answer.invalidReason, reason, JSON.stringify(answer));
    return body;
  };
  const other = freshAccount();
  const forgedBody = await refused((p) => {
    // One digit of r changed: the signature recovers to someone else, or to nobody.
    p.signature = `${p.signature.slice(0, 10)}${p.signature[10] === 'a' ? 'b' : 'a'}${p.signature.slice(11)}`;
  }, 'invalid_batch_settlement_evm_permit2_invalid_signature');
  const settled = await settle(forgedBody);
  assert.equal(settled.body.success, false, settled.text);
  assert.equal(settled.body.errorReason, 'invalid_batch_settlement_evm_permit2_invalid_signature', settled.text);
  assert.equal(settled.body.transaction, '', settled.text);
  await refused((p) => { p.spender = other.address; }, 'invalid_batch_settlement_evm_permit2_invalid_spender');
  await refused((p) => { p.permitted.amount = String(BigInt(p.permitted.amount) + 1n); },
    'invalid_batch_settlement_evm_permit2_amount_mismatch');
  await refused((p) => { p.deadline = String(Math.floor(Date.now() / 1000) - 60); },
    'invalid_batch_settlement_evm_permit2_deadline_expired');
  // The deposit itself is still valid: nothing above used it.
  const ok = await verify(deposit.body);
  assert.equal(ok.body.isValid, true, JSON.stringify(ok.body));
});

it('eip2612GasSponsoring: a payer that never approved Permit2 deposits through the permit it signs, in one transaction', async () => {
  const { account, client } = await newPayer({ approve: false });
  const deposit = await pay(client, requirements(), { extensions: declareEip2612GasSponsoringExtension() });
  const info = deposit.paymentPayload.extensions?.eip2612GasSponsoring?.info;
  assert.ok(info, 'the client signed an EIP-2612 permit');
  const refused = structuredClone(deposit.body);
  refused.paymentPayload.extensions.eip2612GasSponsoring.info.amount = String(BigInt(info.amount) + 1n);
  const wrong = await verify(refused);
  assert.equal(wrong.body.invalidReason, 'invalid_batch_settlement_evm_eip2612_amount_mismatch', wrong.text);

  const verified = await verify(deposit.body);
  assert.equal(verified.body.isValid, true, verified.text);
  const escrowBefore = await balanceOf(BATCH_SETTLEMENT);
  const settled = await settle(deposit.body);
  assert.equal(settled.body.success, true, settled.text);
  const amount = BigInt(deposit.payload.deposit.amount);
  assert.equal(await balanceOf(BATCH_SETTLEMENT), escrowBefore + amount);
  assert.equal(await stack.client.getBalance({ address: account.address }), 0n);
  const allowance = await stack.client.readContract({
    address: stack.usdc, abi: erc20Abi, functionName: 'allowance', args: [account.address, PERMIT2],
  });
  assert.equal(allowance, BigInt(info.amount) - amount, 'the permit approved Permit2, and the deposit spent it');
  assert.equal(settled.body.extra.channelState.balance, String(amount));
});
