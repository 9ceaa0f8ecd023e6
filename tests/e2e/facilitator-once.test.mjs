// One payment, one success (spec/access.md section 1, spec/x402-facilitator.md section 3): the
// same signed authorization sent again and again, at once or later, in v1 and v2, is settled by one
// transaction and answered `success: true` once. Every other settle is told that transaction as a
// failure: errorReason invalid_payload (v1) / invalid_exact_evm_nonce_already_used (v2), message
// "already settled by 0x<hash>" (or "already being settled by 0x<hash>" when its own wait ends
// first). The request that claimed the payment, asked again with its Idempotency-Key header and
// the byte-identical body, gets its answer again, also after a restart (the payer's own v2
// payment-identifier id never does: it names the payment, and another payment under it is 409); another body under that key answers HTTP 400 {error: 409}; a
// malformed key answers 400. In an array settle each element has its own key (`<key>#<i>`).
// Verify answers a payment whose nonce is claimed invalid, whatever the digest: "authorization
// already being settled" while it is in flight, "authorization already settled" after.
//
// Two stacks, both with x402_versions = [1, 2]: one on an auto-mining chain, one on a chain that
// mines only when told (anvil --no-mining, settle_timeout_secs = 3) for payments held in flight.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK, CHAIN_ID } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { mutate } from './lib/x402.mjs';
import { idempotencyKey } from './lib/util.mjs';
import {
  expectSettled, expectSettledResult, expectSettleFailed, expectErrorBody, expectDuplicate, expectDuplicateResult,
  expectClaimedOnVerify, expectValid, show, TX_HASH,
} from './lib/expect.mjs';
import { chainMark, expectCleanSignerHistory, expectTransfersAuthorization, waitPoolEmpty } from './lib/chain-audit.mjs';
import { mining, settleUntilDone, waitInPool, isPending } from './lib/settling.mjs';

const CAIP2 = `eip155:${CHAIN_ID}`;
const PRICE = 1000n;
const ID_FIELD = 'paymentPayload.extensions.payment-identifier.info.id';

/** A payment-identifier id as @x402/extensions makes one: "pay_" and 32 hex digits. */
const paymentId = () => `pay_${randomUUID().replaceAll('-', '')}`;
/** The v2 body `body` with the payment-identifier extension carrying `id` (as the official client echoes it). */
const withPaymentId = (body, id) => mutate(body, (b) => {
  b.paymentPayload.extensions = { 'payment-identifier': { info: { required: false, id } } };
});

/**
 * Exactly one of `answers` is a success; every other one is the duplicate answer naming its
 * transaction. Returns the success's index and hash.
 */
function expectOneSuccess(answers, { network, payer, version = 1, being = false }) {
  const wins = answers.map((res, i) => [i, res]).filter(([, res]) => res.body?.success === true);
  assert.equal(wins.length, 1, `exactly one success among ${answers.length} answers: ${answers.map(show).join(' | ')}`);
  const [[win, res]] = wins;
  const hash = expectSettled(res, { network, payer });
  for (const [i, other] of answers.entries()) {
    if (i !== win) expectDuplicate(other, { transaction: hash, network, payer, version, being });
  }
  return { win, hash };
}

/** The signer sent exactly `hashes`, since `mark`, each a clean USDC settlement of its authorization. */
async function expectOnlyTransactions(stack, mark, settled) {
  await waitPoolEmpty(stack.anvil);
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.deepEqual(history.all.map((t) => t.hash).sort(), settled.map((s) => s.hash).sort(), 'the signer sent exactly one transaction per payment');
  for (const { hash, authorization } of settled) {
    const tx = history.all.find((t) => t.hash === hash);
    expectTransfersAuthorization(tx.logs, stack.usdc, authorization, hash);
  }
}

// =============================================================================================

describe('auto-mining chain', () => {
  let stack;
  const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

  before(async () => {
    stack = await startFacilitatorStack({ routerd: { x402Versions: [1, 2] } });
  });
  after(() => stack?.stop());

  const balances = async (p) => ({
    payer: await stack.balanceOf(p.authorization.from), payee: await stack.balanceOf(p.authorization.to),
  });

  it('5 concurrent identical settles without a key: exactly one success, all five name its transaction, one transaction sent; a later replay is told "already settled by"', async () => {
    const payer = await stack.newPayer(5000n);
    const p = await stack.pay({ account: payer, amount: PRICE });
    const mark = await chainMark(stack.anvil, stack.signer);
    const raw = JSON.stringify(p.body);

    const answers = await Promise.all(Array.from({ length: 5 }, () => stack.settle(raw)));

    const { hash } = expectOneSuccess(answers, { network: NETWORK, payer: payer.address });
    await expectOnlyTransactions(stack, mark, [{ hash, authorization: p.authorization }]);
    assert.deepEqual(await balances(p), { payer: 5000n - PRICE, payee: PRICE }, 'paid once');

    const replay = await stack.settle(raw);
    expectDuplicate(replay, { transaction: hash, network: NETWORK, payer: payer.address });
    assert.equal(replay.body.errorReason, 'invalid_payload');
    assert.equal(replay.body.errorMessage, `already settled by ${hash}`);
    assert.equal(await stack.signerNonce('pending'), mark.nonce + 1, 'no second transaction');
  });

  it('the first request retried with its Idempotency-Key and the same bytes gets its success again, also after a restart; another body under the key answers 409', async () => {
    const payer = await stack.newPayer(5000n);
    const p = await stack.pay({ account: payer, amount: PRICE });
    const mark = await chainMark(stack.anvil, stack.signer);
    const key = idempotencyKey();
    const raw = JSON.stringify(p.body);
    const who = { network: NETWORK, payer: payer.address };

    const hash = expectSettled(await stack.settle(raw, { key }), who);
    assert.equal(expectSettled(await stack.settle(raw, { key }), who), hash, 'the retry gets the first answer');
    // Other requests of the same payment: without a key, or with their own key.
    expectDuplicate(await stack.settle(raw), { ...who, transaction: hash });
    expectDuplicate(await stack.settle(raw, { key: idempotencyKey() }), { ...who, transaction: hash });

    await stack.routerd.restart();
    assert.equal(expectSettled(await stack.settle(raw, { key }), who), hash, 'the retry after a restart gets the first answer');
    expectDuplicate(await stack.settle(raw), { ...who, transaction: hash });

    // The key is bound to the body it came with: any other body of this payment under it is refused.
    for (const [what, body] of [
      ['another description', JSON.stringify(mutate(p.body, (b) => { b.paymentRequirements.description = 'another description'; }))],
      ['another resource', JSON.stringify(mutate(p.body, (b) => { b.paymentRequirements.resource = 'https://example.com/other'; }))],
      ['the same JSON with other whitespace', JSON.stringify(p.body, null, 2)],
    ]) {
      const res = await stack.settle(body, { key });
      assert.equal(res.status, 400, `${what}: ${show(res)}`);
      expectErrorBody(res, 400, { error: 409 });
    }
    assert.equal(expectSettled(await stack.settle(raw, { key }), who), hash, 'the refused bodies changed nothing for the key');
    await expectOnlyTransactions(stack, mark, [{ hash, authorization: p.authorization }]);
    assert.deepEqual(await balances(p), { payer: 5000n - PRICE, payee: PRICE });
  });

  it('a malformed Idempotency-Key answers HTTP 400 naming the header and claims nothing; a 128-character key of every allowed character works', async () => {
    const payer = await stack.newPayer(5000n);
    const p = await stack.pay({ account: payer, amount: PRICE });
    const nonce = await stack.signerNonce('pending');
    for (const bad of ['', 'has space', 'slash/', 'element#0', 'semi;colon', 'caf\u00e9', 'k'.repeat(129)]) {
      const res = await stack.settle(p.body, { key: bad });
      expectErrorBody(res, 400, { error: 400 });
      assert.ok(res.body.message.startsWith('Idempotency-Key'), `the message starts with "Idempotency-Key" for ${JSON.stringify(bad)}: ${show(res)}`);
    }
    assert.equal(await stack.signerNonce('pending'), nonce, 'nothing sent');
    assert.equal((await stack.settlementStatus(p)).status, 404, 'nothing claimed');

    const key = `aZ09_.:-${randomUUID()}`.padEnd(128, 'x');
    assert.equal(key.length, 128);
    const hash = expectSettled(await stack.settle(p.body, { key }), { network: NETWORK, payer: payer.address });
    assert.equal(expectSettled(await stack.settle(p.body, { key }), { network: NETWORK, payer: payer.address }), hash);
    assert.equal(await stack.signerNonce('pending'), nonce + 1);
  });

  it('v2: /supported lists the payment-identifier extension', async () => {
    const res = await stack.request('/supported');
    assert.equal(res.status, 200, show(res));
    assert.deepEqual(res.body.extensions, ['payment-identifier', 'bazaar']);
    assert.ok(res.body.kinds.some((k) => k.x402Version === 2 && k.network === CAIP2), show(res));
  });

  it('v2: 5 concurrent identical settles: one success, the others told the transaction as invalid_exact_evm_nonce_already_used; the key retry gets the success, also after a restart', async () => {
    const payer = await stack.newPayer(5000n);
    const p = await stack.payV2({ account: payer, amount: PRICE });
    const mark = await chainMark(stack.anvil, stack.signer);
    const raw = JSON.stringify(p.v2);
    const who = { network: CAIP2, payer: payer.address, version: 2 };

    const answers = await Promise.all(Array.from({ length: 5 }, () => stack.settle(raw)));
    const { hash } = expectOneSuccess(answers, who);
    const replay = await stack.settle(raw);
    expectDuplicate(replay, { ...who, transaction: hash });
    assert.equal(replay.body.errorReason, 'invalid_exact_evm_nonce_already_used');
    // The v1 body of the same authorization: told in v1's names.
    expectDuplicate(await stack.settle(p.body), { network: NETWORK, payer: payer.address, version: 1, transaction: hash });

    // A v2 request with a key: its retry gets its success.
    const q = await stack.payV2({ account: payer, amount: PRICE });
    const key = idempotencyKey();
    const qRaw = JSON.stringify(q.v2);
    const qHash = expectSettled(await stack.settle(qRaw, { key }), { network: CAIP2, payer: payer.address });
    assert.equal(expectSettled(await stack.settle(qRaw, { key }), { network: CAIP2, payer: payer.address }), qHash);
    expectDuplicate(await stack.settle(qRaw), { ...who, transaction: qHash });
    await stack.routerd.restart();
    assert.equal(expectSettled(await stack.settle(qRaw, { key }), { network: CAIP2, payer: payer.address }), qHash, 'after a restart');
    expectErrorBody(await stack.settle(mutate(q.v2, (b) => { b.paymentPayload.resource.description = 'other'; }), { key }), 400, { error: 409 });
    await expectOnlyTransactions(stack, mark, [{ hash, authorization: p.authorization }, { hash: qHash, authorization: q.authorization }]);
  });

  it("v2: the payer's payment-identifier id is never a retry key: the identical body with it is a duplicate (also after a restart), another payment under the id 409, the id shown by the status route", async () => {
    const payer = await stack.newPayer(5000n);
    const p = await stack.payV2({ account: payer, amount: PRICE });
    const mark = await chainMark(stack.anvil, stack.signer);
    const id = paymentId();
    const raw = JSON.stringify(withPaymentId(p.v2, id));
    const who = { network: CAIP2, payer: payer.address };

    const hash = expectSettled(await stack.settle(raw), who);
    // The payer wrote the id and did not sign it (access.md section 1): the identical body with
    // the id, without it, with another id or under a header is another request for one payment.
    const dup = { ...who, version: 2, transaction: hash };
    expectDuplicate(await stack.settle(raw), dup);
    expectDuplicate(await stack.settle(p.v2), dup);
    expectDuplicate(await stack.settle(withPaymentId(p.v2, paymentId())), dup);
    expectDuplicate(await stack.settle(raw, { key: idempotencyKey() }), dup);
    // The same payment in another body under the id is still the same payment: a duplicate.
    const described = withPaymentId(mutate(p.v2, (b) => { b.paymentPayload.resource.description = 'another description'; }), id);
    expectDuplicate(await stack.settle(described), dup);
    // Another payment under the used id: 409, nothing claimed or sent.
    const q = await stack.payV2({ account: payer, amount: PRICE });
    const reused = await stack.settle(withPaymentId(q.v2, id));
    expectErrorBody(reused, 400, { error: 409, messageIncludes: ID_FIELD });
    assert.equal((await stack.settlementStatus(q)).status, 404, 'the other payment is not claimed');
    // Stored with the record and shown.
    const status = await stack.settlementStatus(p);
    assert.equal(status.body?.paymentIdentifier, id, show(status));

    await stack.routerd.restart();
    expectDuplicate(await stack.settle(raw), dup);
    await expectOnlyTransactions(stack, mark, [{ hash, authorization: p.authorization }]);
  });

  it(`v2: a malformed payment-identifier id answers HTTP 400 naming ${ID_FIELD}, and claims nothing`, async () => {
    const payer = await stack.newPayer(5000n);
    const p = await stack.payV2({ account: payer, amount: PRICE });
    const nonce = await stack.signerNonce('pending');
    for (const bad of ['pay_0123456789a' /* 15 */, 'p'.repeat(129), 'pay.0123456789abcdef', 'pay 0123456789abcdef', 1234567890123456789]) {
      const res = await stack.settle(withPaymentId(p.v2, bad));
      expectErrorBody(res, 400, { error: 400, messageIncludes: ID_FIELD });
    }
    assert.equal(await stack.signerNonce('pending'), nonce, 'nothing sent');
    assert.equal((await stack.settlementStatus(p)).status, 404, 'nothing claimed');
    // The bounds: 16 and 128 characters of [A-Za-z0-9_-] are ids.
    const sixteen = `Az09_-${randomUUID().replaceAll('-', '')}`.slice(0, 16);
    expectSettled(await stack.settle(withPaymentId(p.v2, sixteen)), { network: CAIP2, payer: payer.address });
    const q = await stack.payV2({ account: payer, amount: PRICE });
    expectSettled(await stack.settle(withPaymentId(q.v2, paymentId().padEnd(128, '_'))), { network: CAIP2, payer: payer.address });
  });

  it('an array settle with a key: each element is bound to its own key (<key>#<i>), the array retried gets every answer again', async () => {
    const payer = await stack.newPayer(10_000n);
    const [a, b] = [await stack.pay({ account: payer, amount: PRICE }), await stack.pay({ account: payer, amount: 2n * PRICE })];
    const mark = await chainMark(stack.anvil, stack.signer);
    const key = idempotencyKey();
    const who = { network: NETWORK, payer: payer.address };
    const slots = (res, n = 2) => {
      assert.equal(res.status, 200, show(res));
      assert.ok(Array.isArray(res.body) && res.body.length === n, `an array of ${n}: ${show(res)}`);
      return res.body;
    };

    const first = await stack.settle([a.body, b.body], { key });
    const [ha, hb] = slots(first).map((slot) => expectSettledResult(slot, who, first));
    assert.notEqual(ha, hb);

    const again = await stack.settle([a.body, b.body], { key });
    assert.deepEqual(slots(again).map((slot) => expectSettledResult(slot, who, again)), [ha, hb], 'the array retried: every element its own success');

    // The array's key names no element on its own: a single body under it is another request.
    expectDuplicate(await stack.settle(a.body, { key }), { ...who, transaction: ha });
    // Without the key, the array is another request for both payments.
    const keyless = await stack.settle([a.body, b.body]);
    slots(keyless).forEach((slot, i) => expectDuplicateResult(slot, { ...who, transaction: [ha, hb][i] }, keyless));

    // Element keys are bound to their elements: swapped, neither element is told success.
    const swapped = await stack.settle([b.body, a.body], { key });
    console.log(`# swapped array under the key answered: ${swapped.text}`);
    for (const [i, slot] of slots(swapped).entries()) {
      assert.notEqual(slot?.success, true, `slot ${i} of the swapped array is told success: ${show(swapped)}`);
      const own = [hb, ha][i];
      assert.ok(slot?.error === 409 || (slot?.success === false && slot.transaction === own),
        `slot ${i}: {error: 409} or the duplicate naming ${own}: ${show(swapped)}`);
    }
    // Another body for element 1's payment under its key: {error: 409} in that slot only.
    const changed = mutate(b.body, (x) => { x.paymentRequirements.description = 'another description'; });
    const mixed = await stack.settle([a.body, changed], { key });
    const [s0, s1] = slots(mixed);
    assert.equal(expectSettledResult(s0, who, mixed), ha, 'slot 0 is still element 0 of the first request');
    assert.ok(s1 && s1.error === 409 && typeof s1.message === 'string', `slot 1 is {error: 409, message}: ${show(mixed)}`);

    await expectOnlyTransactions(stack, mark, [{ hash: ha, authorization: a.authorization }, { hash: hb, authorization: b.authorization }]);
  });
});

// =============================================================================================

describe('chain that mines only when told', () => {
  let stack;
  const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

  before(async () => {
    stack = await startFacilitatorStack({
      anvil: { noMining: true },
      fundedPayers: 4,
      routerd: { x402Versions: [1, 2], settleTimeoutSecs: 3 },
    });
  });
  after(() => stack?.stop());

  it('verify of a payment being settled, and of another authorization under its nonce: "authorization already being settled", then "already settled", in both versions; duplicate settles meanwhile are told "already being settled by"', async () => {
    const account = stack.payers[0];
    const p = await stack.payV2({ account, amount: PRICE });
    // Another authorization of the payer under the same nonce: another digest, the same payment key.
    const other = await stack.payV2({ account, payTo: freshAccount().address, amount: 7n, auth: { nonce: p.authorization.nonce } });
    const payer = getAddress(account.address);
    expectValid(await stack.verify(p.body), { payer });
    expectValid(await stack.verify(other.v2), { payer });
    const mark = await chainMark(stack.anvil, stack.signer);

    const key = idempotencyKey();
    const inflight = stack.settle(p.body, { key });
    const tx = await waitInPool(stack, p);
    for (const [what, res, version] of [
      ['v1, the payment', await stack.verify(p.body), 1],
      ['v2, the payment', await stack.verify(p.v2), 2],
      ['v1, another authorization under its nonce', await stack.verify(other.body), 1],
      ['v2, another authorization under its nonce', await stack.verify(other.v2), 2],
    ]) {
      try {
        expectClaimedOnVerify(res, { version, being: true, payer });
      } catch (err) {
        err.message = `${what}: ${err.message}`;
        throw err;
      }
    }

    // Other settles of the same authorization while it is in flight wait, then are told the transaction.
    const [d1, d2] = await Promise.all([stack.settle(p.body), stack.settle(p.v2)]);
    expectDuplicate(d1, { transaction: tx.hash, network: NETWORK, payer, version: 1, being: true });
    expectDuplicate(d2, { transaction: tx.hash, network: CAIP2, payer, version: 2, being: true });

    let res = await mining(stack.anvil, inflight);
    if (isPending(res)) res = await settleUntilDone(stack, p.body, { key });
    assert.equal(expectSettled(res, { network: NETWORK, payer }), tx.hash, 'the first request, with its key, gets its success');

    for (const [what, verified, version] of [
      ['v1, the payment', await stack.verify(p.body), 1],
      ['v2, the payment', await stack.verify(p.v2), 2],
      ['v1, another authorization under its nonce', await stack.verify(other.body), 1],
      ['v2, another authorization under its nonce', await stack.verify(other.v2), 2],
    ]) {
      try {
        expectClaimedOnVerify(verified, { version, being: false, payer });
      } catch (err) {
        err.message = `${what}: ${err.message}`;
        throw err;
      }
    }
    expectDuplicate(await stack.settle(p.body), { transaction: tx.hash, network: NETWORK, payer, version: 1 });
    await expectOnlyTransactions(stack, mark, [{ hash: tx.hash, authorization: p.authorization }]);
    assert.equal(await stack.balanceOf(other.authorization.to), 0n, 'the other authorization moved nothing');
  });

  it('v2: 5 concurrent identical settles unmined at the deadline: one settlement_pending (the claimant), four "already being settled by", all naming one transaction; once mined, the identical next request is told the success once, later replays "already settled by"', async () => {
    const account = stack.payers[1];
    const payer = getAddress(account.address);
    const p = await stack.payV2({ account, amount: PRICE });
    const mark = await chainMark(stack.anvil, stack.signer);
    const raw = JSON.stringify(p.v2);

    const answers = await Promise.all(Array.from({ length: 5 }, () => stack.settle(raw)));
    const tx = await waitInPool(stack, p);
    const claimant = answers.filter((res) => res.body?.errorReason === 'settlement_pending');
    assert.equal(claimant.length, 1, `one settlement_pending answer: ${answers.map(show).join(' | ')}`);
    expectSettleFailed(claimant[0], 'settlement_pending', { network: CAIP2, payer, transaction: tx.hash });
    for (const res of answers.filter((r) => r !== claimant[0])) {
      expectDuplicate(res, { transaction: tx.hash, network: CAIP2, payer, version: 2, being: true });
    }
    assert.ok(answers.every((res) => res.body?.success === false), 'nobody told success before the outcome');

    await stack.anvil.mine();
    await waitPoolEmpty(stack.anvil);
    assert.equal((await stack.receipt(tx.hash)).status, 'success');
    // The claimant was told "pending": its identical next request from the same caller (as
    // @x402/core's settleWithPendingRetry sends it) is told the outcome, success included, once
    // (access.md section 1). Every later one is told "already settled by".
    assert.equal(expectSettled(await stack.settle(raw), { network: CAIP2, payer }), tx.hash, 'the pending answer passes the success on');
    expectDuplicate(await stack.settle(raw), { transaction: tx.hash, network: CAIP2, payer, version: 2 });
    await expectOnlyTransactions(stack, mark, [{ hash: tx.hash, authorization: p.authorization }]);
    assert.match(tx.hash, TX_HASH);
  });
});
