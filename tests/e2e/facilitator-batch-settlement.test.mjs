// routerd as the facilitator of x402's `batch-settlement` scheme (spec/batch-settlement.md) on
// anvil, with routerd's own escrow and deposit collectors at the canonical addresses
// (lib/batch-settlement.mjs) and Circle's USDC. Payloads are signed by the official @x402/evm
// 2.27.0 client scheme; routerd is spoken to over HTTP:
// - /supported lists the scheme on the served network;
// - verify of a deposit, of vouchers and of a refund, with the channel snapshot in `extra`, and
//   every channel rule refused with the binding's reason (forged, over-balance, below-claimed,
//   mismatched config);
// - a deposit settled once: escrow holds exactly the deposit and the payer paid no gas; the same
//   deposit sent five times at once moves it once and is told one transaction;
// - a deposit's Idempotency-Key retry, once the channel's totalClaimed has reached the deposit
//   voucher, is still told the success, a keyless settle the transaction as a failure (the ledger
//   is asked before the channel's rules).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { toClientEvmSigner } from '@x402/evm';
import { BatchSettlementEvmScheme as BatchClient } from '@x402/evm/batch-settlement/client';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { anvilAccount, freshAccount, ROLE } from './lib/accounts.mjs';
import { mintUsdc, usdcAbi, USDC_EIP712 } from './lib/deploy-usdc.mjs';
import {
  BATCH_SETTLEMENT, placeBatchSettlement, readChannel, batchSettlementAbi, signClaimBatch, claimArgs,
} from './lib/batch-settlement.mjs';
import { idempotencyKey } from './lib/util.mjs';

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
    beforeRouterd: (s) => placeBatchSettlement(s.client),
  });
});

after(async () => {
  await stack?.stop();
});

function requirements(extra = {}) {
  return {
    scheme: 'batch-settlement', network: NETWORK, amount: String(PRICE), asset: getAddress(stack.usdc), payTo: receiver,
    maxTimeoutSeconds: 3600,
    extra: { receiverAuthorizer: authorizer.address, withdrawDelay: 900, ...USDC_EIP712, ...extra },
  };
}

async function newPayer() {
  const account = freshAccount();
  await mintUsdc(stack.client, stack.usdc, account.address, FUNDS);
  return { account, client: new BatchClient(toClientEvmSigner(account, stack.client)) };
}

/** The client's next payload; `charged()` tells the client the request was charged the price. */
async function pay(client, reqs = requirements()) {
  const { payload } = await client.createPaymentPayload(2, reqs);
  const paymentPayload = { x402Version: 2, accepted: reqs, payload };
  const charged = () => client.schemeHooks.onPaymentResponse({
    settleResponse: { success: true, extra: { chargedAmount: String(PRICE) } }, paymentPayload, requirements: reqs,
  });
  return { paymentPayload, payload, charged, body: { x402Version: 2, paymentPayload, paymentRequirements: structuredClone(reqs) } };
}

const verify = (body) => stack.post('/verify', body);
const settle = (body) => stack.post('/settle', body);
const balanceOf = (address) => stack.client.readContract({ address: stack.usdc, abi: usdcAbi, functionName: 'balanceOf', args: [address] });

it('/supported lists batch-settlement on the served network', async () => {
  const { status, body } = await stack.request('/supported');
  assert.equal(status, 200);
  const kind = body.kinds.find((k) => k.scheme === 'batch-settlement');
  assert.deepEqual(kind, { x402Version: 2, scheme: 'batch-settlement', network: NETWORK });
});

it('a deposit verifies, settles once, and vouchers verify against the channel it funded', async () => {
  const { account, client } = await newPayer();
  const deposit = await pay(client);
  assert.equal(deposit.payload.type, 'deposit');
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
  }
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

it('vouchers that break a channel rule are refused with the binding reason', async () => {
  const { client } = await newPayer();
  const deposit = await pay(client);
  assert.equal((await settle(deposit.body)).body.success, true);
  await deposit.charged();
  const voucher = await pay(client);
  const refused = async (mutate, reason) => {
    const body = structuredClone(voucher.body);
    mutate(body.paymentPayload.payload, body);
    const { status, body: answer } = await verify(body);
    assert.equal(status, 200, `${reason}: ${JSON.stringify(answer)}`);
    assert.equal(answer.isValid, false);
    assert.equal(answer.invalidReason, reason, JSON.stringify(answer));
  };
  await refused((p) => { p.voucher.maxClaimableAmount = String(BigInt(p.voucher.maxClaimableAmount) + 1n); },
    'invalid_batch_settlement_evm_voucher_signature');
  await refused((p) => { p.channelConfig.salt = `0x${'11'.repeat(32)}`; }, 'invalid_batch_settlement_evm_channel_id_mismatch');
  await refused((p, b) => { b.paymentRequirements.payTo = freshAccount().address; b.paymentPayload.accepted.payTo = b.paymentRequirements.payTo; },
    'invalid_batch_settlement_evm_receiver_mismatch');
  await refused((p, b) => { b.paymentRequirements.extra.withdrawDelay = 901; }, 'invalid_batch_settlement_evm_withdraw_delay_mismatch');
  await refused((p, b) => { b.paymentPayload.accepted.scheme = 'exact'; }, 'invalid_batch_settlement_evm_scheme');
  // A payload that does not read is a 400 naming its field, however deep.
  const malformed = structuredClone(voucher.body);
  malformed.paymentPayload.payload.voucher.signature = { r: 1 };
  const shape = await verify(malformed);
  assert.equal(shape.status, 400, shape.text);
  assert.match(shape.body.message, /^paymentPayload\.payload\.voucher\.signature: invalid type: map/, shape.text);
  delete malformed.paymentPayload.payload.channelConfig.salt;
  malformed.paymentPayload.payload.voucher.signature = voucher.payload.voucher.signature;
  const missing = await settle(malformed);
  assert.equal(missing.status, 400, missing.text);
  assert.equal(missing.body.message, 'paymentPayload.payload.channelConfig.salt: missing', missing.text);
});

// One success per deposit authorization (spec/batch-settlement.md, spec/access.md section 1): the
// request that settled a deposit, asked again with its Idempotency-Key, is told its success, and
// any other settle of it the transaction, whatever the channel did since: a deposit the ledger
// knows is not judged again by the channel's rules (a claim has taken totalClaimed to the
// deposit voucher's amount, which they would refuse).
it('a settled deposit asked again after a claim reached its voucher: the key retry told the success, a keyless settle the transaction', async () => {
  const { client } = await newPayer();
  const deposit = await pay(client);
  const key = idempotencyKey();
  const raw = JSON.stringify(deposit.body);
  const first = await stack.post('/settle', raw, { headers: { 'Idempotency-Key': key } });
  assert.equal(first.body.success, true, first.text);
  const hash = first.body.transaction;

  // The receiver claims the deposit's voucher on chain, signed by its authorizer.
  const rows = [{
    voucher: { channel: deposit.payload.channelConfig, maxClaimableAmount: deposit.payload.voucher.maxClaimableAmount },
    signature: deposit.payload.voucher.signature,
    totalClaimed: deposit.payload.voucher.maxClaimableAmount,
  }];
  const claim = await stack.client.writeContract({
    address: BATCH_SETTLEMENT, abi: batchSettlementAbi(), functionName: 'claimWithSignature',
    args: [claimArgs(rows), await signClaimBatch(authorizer, CHAIN_ID, rows)], gas: 500_000n,
  });
  assert.equal((await stack.client.waitForTransactionReceipt({ hash: claim })).status, 'success');
  assert.equal((await readChannel(stack.client, deposit.payload.voucher.channelId)).totalClaimed, PRICE);

  const retried = await stack.post('/settle', raw, { headers: { 'Idempotency-Key': key } });
  assert.equal(retried.status, 200, retried.text);
  assert.equal(retried.body.success, true, `the key retry is told the success: ${retried.text}`);
  assert.equal(retried.body.transaction, hash, retried.text);
  const keyless = await settle(deposit.body);
  assert.equal(keyless.body.success, false, keyless.text);
  assert.equal(keyless.body.transaction, hash, `a keyless settle is told the deposit's transaction: ${keyless.text}`);
});
