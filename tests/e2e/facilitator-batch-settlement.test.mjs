// routerd as the facilitator of x402's `batch-settlement` scheme (spec/batch-settlement.md) on
// anvil, with routerd's own escrow and deposit collectors at the canonical addresses
// (lib/batch-settlement.mjs) and Circle's USDC. Payloads are signed by the official @x402/evm
// 2.27.0 client scheme; routerd is spoken to over HTTP:
// - /supported lists the scheme on the served network;
// - verify of a deposit, of vouchers and of a refund, with the channel snapshot in `extra`, and
//   every channel rule refused with the binding's reason (forged, over-balance, below-claimed,
//   mismatched config);
// - a deposit settled once: escrow holds exactly the deposit and the payer paid no gas; the same
//   deposit sent five times at once moves it once and is told one transaction.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { toClientEvmSigner } from '@x402/evm';
import { BatchSettlementEvmScheme as BatchClient } from '@x402/evm/batch-settlement/client';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { anvilAccount, freshAccount, ROLE } from './lib/accounts.mjs';
import { mintUsdc, usdcAbi, USDC_EIP712 } from './lib/deploy-usdc.mjs';
import { BATCH_SETTLEMENT, placeBatchSettlement, readChannel } from './lib/batch-settlement.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = 1000n;
const FUNDS = 1_000_000n;
const receiver = anvilAccount(ROLE.payee).address;
const authorizer = freshAccount();

let stack;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

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
});
