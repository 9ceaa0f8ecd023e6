// POST /settle on an anvil chain that mines each transaction at once: funds really move, failures
// are mapped into the settle reasons without a transaction, a payment is settled and answered
// success once (a replay, sequential or concurrent, is told the transaction as a failure; a retry
// with the first request's Idempotency-Key gets its success), and array bodies are answered in
// order (spec/x402-facilitator.md section 3, spec/access.md section 1).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { mutate } from './lib/x402.mjs';
import {
  expectSettled, expectSettledResult, expectSettleFailed, expectSettleFailedResult, expectErrorBody, show,
  expectDuplicate, expectDuplicateResult,
} from './lib/expect.mjs';
import { idempotencyKey } from './lib/util.mjs';

const MAX_BATCH = 5;

let stack;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({ routerd: { maxBatch: MAX_BATCH } });
});

after(() => stack?.stop());

/** Balances of payer and payee, to compare before and after. */
async function balances(p) {
  const [payer, payee] = await Promise.all([
    stack.balanceOf(p.authorization.from), stack.balanceOf(p.authorization.to),
  ]);
  return { payer, payee };
}

/** The settlement transaction is mined, succeeded, was sent by the signer and called USDC. */
async function expectMinedTransfer(hash) {
  const receipt = await stack.receipt(hash);
  assert.equal(receipt.status, 'success', `receipt of ${hash}`);
  assert.equal(getAddress(receipt.to), getAddress(stack.usdc), 'the transaction calls the configured USDC');
  assert.equal(getAddress(receipt.from), getAddress(stack.signer), 'the facilitator signer pays the gas');
}

// ---------------------------------------------------------------------------------------------
// Success

it('settle moves exactly value from payer to payTo in one mined USDC transaction', async () => {
  const payer = await stack.newPayer(5000n);
  const p = await stack.pay({ account: payer, amount: 1234n });
  const before = await balances(p);
  const nonce = await stack.signerNonce();

  const hash = expectSettled(await stack.settle(p.body), { network: NETWORK, payer: payer.address });

  await expectMinedTransfer(hash);
  const after = await balances(p);
  assert.equal(after.payer, before.payer - 1234n);
  assert.equal(after.payee, before.payee + 1234n);
  assert.equal(await stack.signerNonce(), nonce + 1);
});

it('settle for a smart-wallet payer (ERC-1271) moves the funds', async () => {
  const wallet = await stack.smartWallet({ valid: true });
  await stack.mint(wallet, 1000n);
  const p = await stack.pay({ account: freshAccount(), auth: { from: wallet } });
  const hash = expectSettled(await stack.settle(p.body), { network: NETWORK, payer: wallet });
  await expectMinedTransfer(hash);
  assert.equal(await stack.balanceOf(wallet), 0n);
  assert.equal(await stack.balanceOf(p.authorization.to), 1000n);
});

// ---------------------------------------------------------------------------------------------
// Failures: mapped reason, transaction "", no transaction sent

/** Settle `body`, expect the failure, and check that nothing was sent and nothing moved. */
async function expectRefused(p, body, reason, { network = NETWORK } = {}) {
  const nonce = await stack.signerNonce('pending');
  const before = await balances(p);
  expectSettleFailed(await stack.settle(body), reason, { network, payer: getAddress(p.authorization.from) });
  assert.equal(await stack.signerNonce('pending'), nonce, 'no transaction may be sent');
  assert.deepEqual(await balances(p), before);
}

it('value too low -> invalid_exact_evm_payload_authorization_value (mapped), no transaction', async () => {
  const payer = await stack.newPayer();
  const p = await stack.pay({ account: payer, amount: 1000n, auth: { value: 999n } });
  await expectRefused(p, p.body, 'invalid_exact_evm_payload_authorization_value');
});

it('malformed signature -> invalid_exact_evm_payload_signature_address (mapped), no transaction', async () => {
  const payer = await stack.newPayer();
  const p = await stack.pay({ account: payer });
  const body = mutate(p.body, (b) => { b.paymentPayload.payload.signature = p.signature.slice(0, 130); });
  await expectRefused(p, body, 'invalid_exact_evm_payload_signature_address');
});

it('signature by another key -> invalid_exact_evm_payload_signature_address, no transaction', async () => {
  const payer = await stack.newPayer();
  const p = await stack.pay({ account: freshAccount(), auth: { from: payer.address } });
  await expectRefused(p, p.body, 'invalid_exact_evm_payload_signature_address');
});

it('other reasons keep their name: insufficient_funds, invalid_payload, value too high', async () => {
  const poor = await stack.newPayer(10n);
  const p1 = await stack.pay({ account: poor, amount: 1000n });
  await expectRefused(p1, p1.body, 'insufficient_funds');

  const payer = await stack.newPayer();
  const p2 = await stack.pay({ account: payer });
  const badNonce = mutate(p2.body, (b) => { b.paymentPayload.payload.authorization.nonce = '0x12'; });
  await expectRefused(p2, badNonce, 'invalid_payload');

  const p3 = await stack.pay({ account: payer, amount: 1000n, auth: { value: 1001n } });
  await expectRefused(p3, p3.body, 'invalid_exact_evm_payload_authorization_value');
});

it('a failed settle reports the requirements network', async () => {
  const payer = await stack.newPayer();
  const p = await stack.pay({ account: payer, network: 'base' });
  await expectRefused(p, p.body, 'invalid_network', { network: 'base' });
});

// ---------------------------------------------------------------------------------------------
// One success per payment

it('settling the same payment twice: the replay is told the same transaction as a failure, the funds move once; a retry with the key gets the success', async () => {
  const payer = await stack.newPayer(5000n);
  const p = await stack.pay({ account: payer });
  const before = await balances(p);
  const nonce = await stack.signerNonce();
  const key = idempotencyKey();

  const first = expectSettled(await stack.settle(p.body, { key }), { network: NETWORK, payer: payer.address });
  expectDuplicate(await stack.settle(p.body), { transaction: first, network: NETWORK, payer: payer.address });
  expectDuplicate(await stack.settle(p.body, { key: idempotencyKey() }), { transaction: first, network: NETWORK, payer: payer.address });
  assert.equal(expectSettled(await stack.settle(p.body, { key }), { network: NETWORK, payer: payer.address }), first, 'the first request retried');

  const after = await balances(p);
  assert.equal(after.payer, before.payer - 1000n);
  assert.equal(after.payee, before.payee + 1000n);
  assert.equal(await stack.signerNonce('pending'), nonce + 1);
});

it('ten concurrent settles of one payment: one success, nine told the same transaction, one transaction', async () => {
  const payer = await stack.newPayer(5000n);
  const p = await stack.pay({ account: payer });
  const before = await balances(p);
  const nonce = await stack.signerNonce();

  const answers = await Promise.all(Array.from({ length: 10 }, () => stack.settle(p.body)));

  const winners = answers.filter((res) => res.body?.success === true);
  assert.equal(winners.length, 1, `exactly one success: ${answers.map(show).join(' | ')}`);
  const hash = expectSettled(winners[0], { network: NETWORK, payer: payer.address });
  for (const res of answers.filter((r) => r !== winners[0])) {
    expectDuplicate(res, { transaction: hash, network: NETWORK, payer: payer.address });
  }
  await expectMinedTransfer(hash);
  const after = await balances(p);
  assert.equal(after.payer, before.payer - 1000n);
  assert.equal(after.payee, before.payee + 1000n);
  assert.equal(await stack.signerNonce('pending'), nonce + 1);
});

// ---------------------------------------------------------------------------------------------
// Array bodies

it('an array body is answered with an array of results in order', async () => {
  const payer = await stack.newPayer(10_000n);
  const a = await stack.pay({ account: payer, amount: 1000n });
  const b = await stack.pay({ account: payer, amount: 1000n, auth: { value: 999n } });
  const c = await stack.pay({ account: payer, amount: 2000n });
  const nonce = await stack.signerNonce();

  const res = await stack.settle([a.body, b.body, c.body]);

  assert.equal(res.status, 200, show(res));
  assert.ok(Array.isArray(res.body) && res.body.length === 3, show(res));
  const ha = expectSettledResult(res.body[0], { network: NETWORK, payer: payer.address }, res);
  expectSettleFailedResult(res.body[1], 'invalid_exact_evm_payload_authorization_value', { network: NETWORK, payer: payer.address }, res);
  const hc = expectSettledResult(res.body[2], { network: NETWORK, payer: payer.address }, res);
  assert.notEqual(ha, hc);
  await expectMinedTransfer(ha);
  await expectMinedTransfer(hc);
  assert.equal(await stack.balanceOf(a.authorization.to), 1000n);
  assert.equal(await stack.balanceOf(b.authorization.to), 0n);
  assert.equal(await stack.balanceOf(c.authorization.to), 2000n);
  assert.equal(await stack.balanceOf(payer.address), 7000n);
  assert.equal(await stack.signerNonce('pending'), nonce + 2);
});

it('an array of one is answered with an array of one', async () => {
  const payer = await stack.newPayer();
  const p = await stack.pay({ account: payer });
  const res = await stack.settle([p.body]);
  assert.equal(res.status, 200, show(res));
  assert.ok(Array.isArray(res.body) && res.body.length === 1, show(res));
  expectSettledResult(res.body[0], { network: NETWORK, payer: payer.address }, res);
});

it('the same payment twice in one array settles once: one entry gets the success, the other the same transaction as a failure', async () => {
  const payer = await stack.newPayer(5000n);
  const p = await stack.pay({ account: payer });
  const nonce = await stack.signerNonce();
  const res = await stack.settle([p.body, p.body]);
  assert.equal(res.status, 200, show(res));
  assert.ok(Array.isArray(res.body) && res.body.length === 2, show(res));
  const win = res.body.findIndex((r) => r?.success === true);
  assert.ok(win >= 0 && res.body.filter((r) => r?.success === true).length === 1, `exactly one success: ${show(res)}`);
  const hash = expectSettledResult(res.body[win], { network: NETWORK, payer: payer.address }, res);
  expectDuplicateResult(res.body[1 - win], { transaction: hash, network: NETWORK, payer: payer.address }, res);
  assert.equal(await stack.balanceOf(payer.address), 4000n);
  assert.equal(await stack.signerNonce('pending'), nonce + 1);
});

it(`an array longer than max_batch (${MAX_BATCH}) is refused whole with an Error body, nothing sent`, async () => {
  const payer = await stack.newPayer(100_000n);
  const bodies = [];
  for (let i = 0; i <= MAX_BATCH; i += 1) bodies.push((await stack.pay({ account: payer })).body);
  const nonce = await stack.signerNonce('pending');
  const res = await stack.settle(bodies);
  // The spec caps the batch but names no status: a client error either way (400, or 413 as a size limit).
  assert.ok([400, 413].includes(res.status), show(res));
  expectErrorBody(res, res.status);
  assert.equal(await stack.signerNonce('pending'), nonce);
  assert.equal(await stack.balanceOf(payer.address), 100_000n);
});
