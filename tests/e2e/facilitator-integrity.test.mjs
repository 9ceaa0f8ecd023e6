// Settlement integrity on a chain that mines only when told (anvil --no-mining + evm_mine),
// spec/x402-facilitator.md section 3:
// - answers are bound to the request: another authorization under a claimed or used nonce, or
//   requirements the authorization does not meet, never get the first settlement's answer (single
//   and array bodies, while the first settlement is in flight and after it);
// - GET /settlements/{network}/{asset}/{from}/{nonce}: states, fields, 404, 400 naming the field;
// - the node forgetting its pool; a signer nonce used outside routerd; an authorization expiring
//   before its transaction is mined (state "expired", the signer nonce is not wasted);
// - an array settle whose one element is still pending gets {error: 504} in that slot only.
// A request waiting for its outcome asks again with its Idempotency-Key and the same body (the
// first answer); the same authorization without that key is told the transaction as a failure.
// Every test ends with the chain's own account: no signer transaction reverted, no nonce gap.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress, hashTypedData } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { usdcAbi, walletFor } from './lib/deploy-usdc.mjs';
import { mutate, now, randomNonce, TRANSFER_WITH_AUTHORIZATION_TYPES } from './lib/x402.mjs';
import { sleep, waitFor, idempotencyKey } from './lib/util.mjs';
import {
  expectInvalid, expectSettled, expectSettledResult, expectSettleFailedResult, expectErrorBody, show, TX_HASH,
  expectDuplicate, expectDuplicateResult,
} from './lib/expect.mjs';
import {
  chainMark, expectCleanSignerHistory, expectTransfersAuthorization, pooledFrom, poolStatus, waitPoolEmpty,
} from './lib/chain-audit.mjs';
import {
  isPending, mining, settleUntilDone, waitInPool, frozen, hashInMessage, assertSameAddress,
} from './lib/settling.mjs';

const SETTLE_TIMEOUT_SECS = 3;
const PRICE = 1000n;

let stack;
const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { noMining: true },
    fundedPayers: 24, // minting needs blocks: fund every payer of this file during setup
    routerd: { settleTimeoutSecs: SETTLE_TIMEOUT_SECS },
  });
});

after(() => stack?.stop());

let nextPayer = 0;
/** A funded payer no other test uses, so balance checks are exact. */
function newPayer() {
  const account = stack.payers[nextPayer];
  nextPayer += 1;
  assert.ok(account, 'not enough funded payers: raise fundedPayers');
  return account;
}

/** A payment of PRICE from a fresh payer to a fresh merchant (overrides as in stack.pay). */
const newPayment = (opts = {}) => stack.pay({ account: opts.account ?? newPayer(), amount: PRICE, ...opts });

const usdcBalance = (address) => stack.balanceOf(address);

/** Whether the token has recorded the authorization (from, nonce) as used (or cancelled). */
function authorizationUsed(auth) {
  return stack.client.readContract({
    address: stack.usdc, abi: usdcAbi, functionName: 'authorizationState', args: [auth.from, auth.nonce],
  });
}

/** The signer's transactions in the pool right now, by nonce. */
const signerPool = () => pooledFrom(stack.anvil, stack.signer);

/**
 * A settle answer that is the request's own failure, never the answer of the settlement `firstHash`
 * belongs to: HTTP 200, success false, the reason, transaction "" (nothing was sent for it).
 */
function expectOwnFailure(res, p, reason, firstHash, { messageMatches } = {}) {
  assert.ok(!res.text.toLowerCase().includes(firstHash.toLowerCase().slice(2)), `the answer carries the first settlement's hash ${firstHash}: ${show(res)}`);
  assert.equal(res.status, 200, show(res));
  expectSettleFailedResult(res.body, reason, { network: NETWORK, payer: getAddress(p.authorization.from) }, res);
  if (messageMatches) assert.match(res.body.errorMessage ?? '', messageMatches, `errorMessage: ${show(res)}`);
}

/**
 * A settle sent now and answered later: `{answer, key, body}`, the request carrying a fresh
 * Idempotency-Key so that `finish` can ask again for its outcome.
 */
function startSettle(body) {
  const key = idempotencyKey();
  return { answer: stack.settle(body, { key }), key, body };
}

/** Wait for the answer of an in-flight settle, mining and asking again (its key) while it is pending. */
async function finish({ answer, key, body }) {
  let res = await mining(stack.anvil, answer);
  if (isPending(res)) res = await settleUntilDone(stack, body, { key });
  return res;
}

// ---------------------------------------------------------------------------------------------
// Answers bound to the request: another authorization under the same nonce

/**
 * Two authorizations of one payer under the same ERC-3009 nonce: a1 moves 1 unit to the payer's own
 * other address, a2 the full price to a merchant.
 */
async function conflictingPair() {
  const account = newPayer();
  const nonce = randomNonce();
  const own = freshAccount().address;
  const merchant = freshAccount().address;
  const a1 = await stack.pay({ account, payTo: own, amount: 1n, auth: { nonce } });
  const a2 = await stack.pay({ account, payTo: merchant, amount: PRICE, auth: { nonce } });
  return { account, own, merchant, a1, a2 };
}

it('another authorization under a nonce whose settlement is in flight: verify and settle say invalid_payload, never the first hash', async () => {
  const { account, own, merchant, a1, a2 } = await conflictingPair();
  const mark = await chainMark(stack.anvil, stack.signer);

  const first = startSettle(a1.body);
  const tx1 = await waitInPool(stack, a1);

  expectInvalid(await stack.verify(a2.body), 'invalid_payload', { payer: account.address });
  const res = await stack.settle(a2.body);
  expectOwnFailure(res, a2, 'invalid_payload', tx1.hash, { messageMatches: /already claimed/i });
  const merchantInCalldata = Object.values(await signerPool()).filter((t) => t.input.toLowerCase().includes(merchant.slice(2).toLowerCase()));
  assert.deepEqual(merchantInCalldata, [], 'no transaction was sent for the second authorization');

  const res1 = await finish(first);
  assert.equal(expectSettled(res1, { network: NETWORK, payer: account.address }), tx1.hash, 'the first authorization settles as itself');
  assert.equal(await usdcBalance(own), 1n, 'the first authorization moved its 1 unit');
  assert.equal(await usdcBalance(merchant), 0n, 'the merchant of the second authorization got nothing');
  await waitPoolEmpty(stack.anvil);
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.equal(history.settlements.length, 1, 'one settlement transaction');
});

it('another authorization under a nonce already settled: invalid_payload, not the first one\'s success', async () => {
  const { account, own, merchant, a1, a2 } = await conflictingPair();

  const done = await settleUntilDone(stack, a1.body);
  const h1 = expectSettled(done, { network: NETWORK, payer: account.address });
  const sent = await stack.signerNonce('pending');

  expectInvalid(await stack.verify(a2.body), 'invalid_payload', { payer: account.address });
  expectOwnFailure(await stack.settle(a2.body), a2, 'invalid_payload', h1, { messageMatches: /already (claimed|used)/i });
  // The exact first request (its key, its body) still gets its own answer; the same
  // authorization without that key is told the transaction, not success.
  assert.equal(expectSettled(await stack.settle(a1.body, { key: done.key }), { network: NETWORK, payer: account.address }), h1);
  expectDuplicate(await stack.settle(a1.body), { transaction: h1, network: NETWORK, payer: account.address });
  // The conflicting authorization under the first one's key: another body under a used key.
  expectErrorBody(await stack.settle(a2.body, { key: done.key }), 400, { error: 409 });
  assert.equal(await stack.signerNonce('pending'), sent, 'nothing sent for the second authorization');
  assert.equal(await usdcBalance(merchant), 0n);
  assert.equal(await usdcBalance(own), 1n);
});

it('array bodies: a conflicting authorization gets invalid_payload in its own slot, the others their own results', async () => {
  const { account, own, merchant, a1, a2 } = await conflictingPair();
  const b = await newPayment();
  const mark = await chainMark(stack.anvil, stack.signer);

  // a1 in flight, then [a2, b] in one body.
  const first = startSettle(a1.body);
  const tx1 = await waitInPool(stack, a1);
  const arrayKey = idempotencyKey();
  const arrayAnswer = stack.settle([a2.body, b.body], { key: arrayKey });
  await waitInPool(stack, b);
  let res = await mining(stack.anvil, arrayAnswer);
  // b still pending: the same array asked again, with its key (a2's slot is judged again: still refused).
  if (res.body?.[1]?.error === 504) res = await settleUntilDone(stack, [a2.body, b.body], { key: arrayKey });
  assert.equal(res.status, 200, show(res));
  assert.ok(Array.isArray(res.body) && res.body.length === 2, `an array of 2 results: ${show(res)}`);
  assert.ok(!res.text.toLowerCase().includes(tx1.hash.slice(2).toLowerCase()), `the array answer carries a1's hash: ${show(res)}`);
  expectSettleFailedResult(res.body[0], 'invalid_payload', { network: NETWORK, payer: account.address }, res);
  const hb = expectSettledResult(res.body[1], { network: NETWORK, payer: b.authorization.from }, res);
  assert.equal(expectSettled(await finish(first), { network: NETWORK, payer: account.address }), tx1.hash);

  // Two authorizations under one nonce in the same array: exactly one of them settles.
  const c = freshAccount().address;
  const d = freshAccount().address;
  const n2 = randomNonce();
  const c1 = await stack.pay({ account, payTo: c, amount: 7n, auth: { nonce: n2 } });
  const c2 = await stack.pay({ account, payTo: d, amount: 9n, auth: { nonce: n2 } });
  const both = await settleUntilDone(stack, [c1.body, c2.body]);
  assert.equal(both.status, 200, show(both));
  assert.ok(Array.isArray(both.body) && both.body.length === 2, show(both));
  const winners = both.body.map((r) => r?.success === true);
  assert.equal(winners.filter(Boolean).length, 1, `exactly one of two authorizations under one nonce settles: ${show(both)}`);
  const [win, lose] = winners[0] ? [0, 1] : [1, 0];
  const hw = expectSettledResult(both.body[win], { network: NETWORK, payer: account.address }, both);
  expectSettleFailedResult(both.body[lose], 'invalid_payload', { network: NETWORK, payer: account.address }, both);
  assert.equal(await usdcBalance(c), win === 0 ? 7n : 0n, 'only the winner moved funds');
  assert.equal(await usdcBalance(d), win === 1 ? 9n : 0n, 'only the winner moved funds');

  await waitPoolEmpty(stack.anvil);
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.deepEqual(history.settlements.map((t) => t.hash).sort(), [tx1.hash, hb, hw].sort(), 'one transaction per settled authorization');
  assert.equal(await usdcBalance(merchant), 0n);
});

// ---------------------------------------------------------------------------------------------
// Answers bound to the request: requirements the authorization does not meet

it('a payment replayed with requirements it does not meet (other payTo, 10x price) gets the verify reason, in flight and after', async () => {
  const account = newPayer();
  const p = await newPayment({ account });
  const otherMerchant = freshAccount().address;
  const otherPayTo = mutate(p.body, (b) => { b.paymentRequirements.payTo = otherMerchant; });
  const tenfold = mutate(p.body, (b) => { b.paymentRequirements.maxAmountRequired = (PRICE * 10n).toString(); });
  const payerBefore = await usdcBalance(account.address);

  const first = startSettle(p.body);
  const tx = await waitInPool(stack, p);
  const checkReplays = async (when) => {
    for (const [body, reason, what] of [
      [otherPayTo, 'invalid_exact_evm_payload_authorization_typed_data_message', 'another payTo'],
      [tenfold, 'invalid_exact_evm_payload_authorization_value', 'maxAmountRequired 10x the value'],
    ]) {
      const res = await stack.settle(body);
      try {
        expectOwnFailure(res, p, reason, tx.hash);
      } catch (err) {
        err.message = `${what}, ${when}: ${err.message}`;
        throw err;
      }
    }
  };
  await checkReplays('while the settlement is in flight');

  const hash = expectSettled(await finish(first), { network: NETWORK, payer: account.address });
  assert.equal(hash, tx.hash);
  const sent = await stack.signerNonce('pending');
  await checkReplays('after it settled');
  assert.equal(expectSettled(await stack.settle(p.body, { key: first.key }), { network: NETWORK, payer: account.address }), hash, 'the exact request retried (its key) gets the first answer');
  expectDuplicate(await stack.settle(p.body), { transaction: hash, network: NETWORK, payer: account.address });
  // The requirements it does not meet, under the first request's key: another body under a used key.
  expectErrorBody(await stack.settle(otherPayTo, { key: first.key }), 400, { error: 409 });
  assert.equal(await stack.signerNonce('pending'), sent, 'no transaction for the replays');
  assert.equal(await usdcBalance(account.address), payerBefore - PRICE, 'paid once');
  assert.equal(await usdcBalance(p.authorization.to), PRICE);
  assert.equal(await usdcBalance(otherMerchant), 0n);
});

// ---------------------------------------------------------------------------------------------
// GET /settlements/{network}/{asset}/{from}/{nonce}

const STATES = ['claimed', 'signed', 'sent', 'included', 'final', 'reverted', 'expired'];

/** The EIP-712 digest of payment `p`'s ERC-3009 authorization, as the token computes it. */
function authorizationDigest(p) {
  const a = p.authorization;
  return hashTypedData({
    domain: { name: stack.token.name ?? 'USD Coin', version: stack.token.version ?? '2', chainId: stack.chainId, verifyingContract: getAddress(stack.usdc) },
    types: TRANSFER_WITH_AUTHORIZATION_TYPES,
    primaryType: 'TransferWithAuthorization',
    message: {
      from: getAddress(a.from), to: getAddress(a.to), value: BigInt(a.value),
      validAfter: BigInt(a.validAfter), validBefore: BigInt(a.validBefore), nonce: a.nonce,
    },
  });
}

/** A 200 status answer with every field of the route; returns the body. */
function expectStatus(res, p) {
  assert.equal(res.status, 200, show(res));
  const s = res.body;
  for (const field of ['network', 'asset', 'payer', 'nonce', 'payTo', 'value', 'digest', 'state', 'transaction', 'signer', 'signerNonce', 'block', 'blockHash', 'confirmations', 'outcome', 'lost']) {
    assert.ok(s && field in s, `status answer without "${field}": ${show(res)}`);
  }
  assert.equal(s.network, NETWORK, show(res));
  assertSameAddress(s.asset, stack.usdc, 'asset');
  assertSameAddress(s.payer, p.authorization.from, 'payer');
  assert.equal(s.nonce.toLowerCase(), p.authorization.nonce.toLowerCase(), show(res));
  assert.ok(STATES.includes(s.state), `unknown state: ${show(res)}`);
  // What tells a merchant that the success is its own payment (x402-facilitator.md section 3).
  assertSameAddress(s.payTo, p.authorization.to, 'payTo');
  assert.equal(s.value, p.authorization.value, show(res));
  assert.equal(s.digest, authorizationDigest(p), `the EIP-712 digest the payer signed: ${show(res)}`);
  assert.equal(typeof s.lost, 'boolean', show(res));
  assert.ok(Number.isInteger(s.confirmations) && s.confirmations >= 0, show(res));
  return s;
}

it('GET /settlements of a broadcast, unmined settlement: state sent, its hash, signer and signer nonce, no block, no outcome', async () => {
  const p = await newPayment();
  const status = () => stack.settlementStatus(p);

  const inflight = startSettle(p.body);
  const tx = await waitInPool(stack, p);
  try {
    // The node has the transaction: routerd's broadcast is done. Give the route a moment anyway.
    await waitFor(async () => (await status()).body?.state === 'sent', { timeoutMs: 3_000, what: 'state "sent"' }).catch(() => {});
    const sent = expectStatus(await status(), p);
    assert.equal(sent.state, 'sent', `a broadcast, unmined settlement (its transaction is in the node's pool): ${JSON.stringify(sent)}`);
    assert.equal(sent.transaction, tx.hash);
    assertSameAddress(sent.signer, stack.signer, 'signer');
    assert.equal(sent.signerNonce, Number(tx.nonce));
    assert.equal(sent.block, null);
    assert.equal(sent.blockHash, null);
    assert.equal(sent.confirmations, 0);
    assert.equal(sent.outcome, null, 'no outcome before the transaction is mined');
    assert.equal(sent.lost, false);
  } finally {
    await finish(inflight);
  }
});

it('GET /settlements of a mined settlement: state included, block, blockHash, confirmations = head - block + 1, outcome success', async () => {
  const p = await newPayment();
  const status = () => stack.settlementStatus(p);
  const hash = expectSettled(await settleUntilDone(stack, p.body), { network: NETWORK, payer: p.authorization.from });
  const receipt = await stack.receipt(hash);
  const check = async (confirmations) => {
    const s = expectStatus(await status(), p);
    assert.equal(s.state, 'included', JSON.stringify(s));
    assert.equal(s.transaction, hash);
    assertSameAddress(s.signer, stack.signer, 'signer');
    assert.equal(s.block, Number(receipt.blockNumber));
    assert.equal(s.blockHash, receipt.blockHash);
    assert.equal(s.confirmations, confirmations, `confirmations = head - block + 1: ${JSON.stringify(s)}`);
    assert.deepEqual({ success: s.outcome?.success, transaction: s.outcome?.transaction }, { success: true, transaction: hash }, JSON.stringify(s));
    assert.equal(s.lost, false);
  };
  // routerd reads the head at block cadence: give it a moment to see the latest block.
  const depthNow = async () => Number(await stack.client.getBlockNumber()) - Number(receipt.blockNumber) + 1;
  const caughtUp = async (depth) => waitFor(async () => (await status()).body?.confirmations === depth, { timeoutMs: 5_000, what: `confirmations ${depth}` }).catch(() => {});
  let depth = await depthNow();
  await caughtUp(depth);
  await check(depth);

  await stack.anvil.mine(2);
  depth = await depthNow();
  await caughtUp(depth);
  await check(depth);
});

it('GET /settlements: unknown payment 404; malformed network/asset/from/nonce 400 naming it; addresses in any case', async () => {
  const p = await newPayment();
  const hash = expectSettled(await settleUntilDone(stack, p.body), { network: NETWORK, payer: p.authorization.from });

  const unknown = await stack.settlementStatus(p, { nonce: randomNonce() });
  expectErrorBody(unknown, 404, { error: 404 });

  for (const [field, override] of [
    ['network', { network: '' }],
    ['asset', { asset: '0x1234' }],
    ['from', { from: 'not-an-address' }],
    ['from', { from: `${p.authorization.from}00` }],
    ['nonce', { nonce: '0x12' }],
    ['nonce', { nonce: `0x${'zz'.repeat(32)}` }],
  ]) {
    const res = await stack.settlementStatus(p, override);
    expectErrorBody(res, 400, { error: 400, messageIncludes: field });
  }

  const lower = (a) => a.toLowerCase();
  const upper = (a) => `0x${a.slice(2).toUpperCase()}`;
  for (const spell of [lower, upper, getAddress]) {
    const nonce = spell === upper ? upper(p.authorization.nonce) : lower(p.authorization.nonce);
    const res = await stack.settlementStatus(p, { asset: spell(stack.usdc), from: spell(p.authorization.from), nonce });
    const s = expectStatus(res, p);
    assert.equal(s.transaction, hash, `spelled ${spell.name}: ${show(res)}`);
  }
});

// ---------------------------------------------------------------------------------------------
// The chain misbehaving while settlements are pending

it('the node forgets its pool while settlements are pending: each settles once, the pool ends empty', async () => {
  const payments = [await newPayment(), await newPayment(), await newPayment()];
  const mark = await chainMark(stack.anvil, stack.signer);
  const answers = payments.map((p) => startSettle(p.body));
  for (const p of payments) await waitInPool(stack, p);

  await frozen(stack.routerd, async () => {
    await stack.anvil.rpc('anvil_dropAllTransactions');
    assert.deepEqual(await poolStatus(stack.anvil), { pending: 0, queued: 0 }, 'precondition: the node forgot every transaction');
  });

  const results = await Promise.all(answers.map((inflight) => finish(inflight)));
  const hashes = results.map((res, i) => expectSettled(res, { network: NETWORK, payer: payments[i].authorization.from }));
  assert.equal(new Set(hashes).size, payments.length);
  for (const [i, hash] of hashes.entries()) {
    const receipt = await stack.receipt(hash);
    assert.equal(receipt.status, 'success', hash);
    expectTransfersAuthorization(receipt.logs, stack.usdc, payments[i].authorization, `payment ${i}`);
    assert.equal(await usdcBalance(payments[i].authorization.to), PRICE, `payment ${i} paid once`);
  }
  await mining(stack.anvil, waitPoolEmpty(stack.anvil));
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.deepEqual(history.settlements.map((t) => t.hash).sort(), [...hashes].sort(), 'the mined settlements are the answered ones');
});

it('the signer key used outside routerd (its next nonce, and the nonce of a pending settlement): every payment settles once, no revert, no gap', async () => {
  const wallet = await walletFor(stack.anvil.url, stack.signerKey);
  const sink = freshAccount().address;
  const mark = await chainMark(stack.anvil, stack.signer);

  // 1. Another program takes the nonce routerd would use next, and it is mined.
  const next = await stack.signerNonce('pending');
  const outside1 = await wallet.sendTransaction({ to: sink, value: 0n, nonce: next, gas: 21_000n });
  await stack.anvil.mine();
  assert.equal((await stack.receipt(outside1)).status, 'success', 'precondition: the outside transaction is mined');
  const p1 = await newPayment();
  const h1 = expectSettled(await settleUntilDone(stack, p1.body), { network: NETWORK, payer: p1.authorization.from });

  // 2. Another program replaces a settlement routerd has broadcast (same nonce, higher fees).
  const p2 = await newPayment();
  const inflight = startSettle(p2.body);
  const tx2 = await waitInPool(stack, p2);
  const bump = (v) => BigInt(v) * 3n + 1_000_000_000n;
  const outside2 = await wallet.sendTransaction({
    to: sink, value: 0n, nonce: Number(tx2.nonce), gas: 21_000n,
    maxFeePerGas: bump(tx2.maxFeePerGas), maxPriorityFeePerGas: bump(tx2.maxPriorityFeePerGas),
  });
  assert.equal((await signerPool())[String(Number(tx2.nonce))]?.hash, outside2, 'precondition: the outside transaction replaced the settlement in the pool');
  await stack.anvil.mine();
  assert.equal((await stack.receipt(outside2)).status, 'success', 'precondition: the outside transaction took the nonce');

  const h2 = expectSettled(await finish(inflight), { network: NETWORK, payer: p2.authorization.from });
  assert.notEqual(h2, tx2.hash, 'the replaced transaction can never be mined: the answer names the one that was');
  for (const [p, hash] of [[p1, h1], [p2, h2]]) {
    const receipt = await stack.receipt(hash);
    assert.equal(receipt.status, 'success', hash);
    expectTransfersAuthorization(receipt.logs, stack.usdc, p.authorization, hash);
    assert.equal(await usdcBalance(p.authorization.to), PRICE, 'paid once');
  }
  await mining(stack.anvil, waitPoolEmpty(stack.anvil));
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.deepEqual(history.other.map((t) => t.hash).sort(), [outside1, outside2].sort(), 'the only other transactions are the outside ones');
  assert.deepEqual(history.settlements.map((t) => t.hash).sort(), [h1, h2].sort(), 'one settlement transaction per payment');
  if (history.selfTransfers.length) console.log(`# nonce filled by ${history.selfTransfers.length} self-transfer(s)`);
});

it('an authorization that expires before its transaction is mined: state expired, not success, authorization unused, signer nonce not wasted', async () => {
  const validBefore = BigInt(now() + 14); // verify needs >= now + 6 (valid_before_margin_secs)
  const p = await newPayment({ auth: { validBefore } });
  const payerBefore = await usdcBalance(p.authorization.from);
  const mark = await chainMark(stack.anvil, stack.signer);

  const inflight = stack.settle(p.body).catch((err) => err);
  await waitInPool(stack, p);
  // The node keeps forgetting its pool and mines nothing until the authorization has expired.
  while (now() <= Number(validBefore) + 1) {
    await stack.anvil.rpc('anvil_dropAllTransactions');
    await sleep(200);
  }
  const first = await inflight;
  assert.ok(!(first?.body?.success === true), `the in-flight settle did not answer success: ${first?.text ?? first}`);

  // From here on blocks come, all past validBefore: the settlement can no longer land, and must not
  // be tried. The signer's nonce is not lost: a later payment settles and the lane has no gap.
  const later = await newPayment();
  const hash = expectSettled(await settleUntilDone(stack, later.body), { network: NETWORK, payer: later.authorization.from });
  await mining(stack.anvil, waitPoolEmpty(stack.anvil));
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.deepEqual(history.settlements.map((t) => t.hash), [hash], 'the expired settlement was never mined');
  assert.deepEqual(history.other, [], 'nothing but settlements and self-transfers');
  assert.equal(await authorizationUsed(p.authorization), false, 'the authorization was never used on chain');
  assert.equal(await usdcBalance(p.authorization.from), payerBefore, 'the payer paid nothing');

  // routerd's own account of it: expired, and a definite failure for a replay.
  await waitFor(async () => {
    await stack.anvil.mine();
    return (await stack.settlementStatus(p)).body?.state === 'expired';
  }, { timeoutMs: 10_000, intervalMs: 500, what: 'state "expired"' }).catch(() => {});
  const s = expectStatus(await stack.settlementStatus(p), p);
  assert.equal(s.state, 'expired', JSON.stringify(s));
  assert.equal(s.block, null);
  assert.equal(s.outcome?.success ?? false, false, JSON.stringify(s));
  assert.equal(s.lost, false, 'no success was answered, so nothing is lost');
  const replay = await stack.settle(p.body);
  assert.equal(replay.status, 200, `a definite answer after expiry: ${show(replay)}`);
  assert.equal(replay.body?.success, false, show(replay));
  if (history.selfTransfers.length) console.log(`# nonce filled by ${history.selfTransfers.length} self-transfer(s)`);
});

// ---------------------------------------------------------------------------------------------
// Array settle with one element still pending

it(`an array whose new element is still pending after settle_timeout_secs: HTTP 200, {error: 504} in that slot, the other its result`, async () => {
  const done = await newPayment();
  const h0 = expectSettled(await settleUntilDone(stack, done.body), { network: NETWORK, payer: done.authorization.from });
  const fresh = await newPayment();

  const key = idempotencyKey();
  const res = await stack.settle([done.body, fresh.body], { key }); // nothing is mined meanwhile
  assert.equal(res.status, 200, show(res));
  assert.ok(Array.isArray(res.body) && res.body.length === 2, `an array of 2: ${show(res)}`);
  // The settled payment, sent again by another request: told its transaction, not success.
  expectDuplicateResult(res.body[0], { transaction: h0, network: NETWORK, payer: done.authorization.from }, res);
  const slot = res.body[1];
  assert.ok(slot && slot.error === 504 && typeof slot.message === 'string', `slot 1 is {error: 504, message}: ${show(res)}`);
  const pendingHash = hashInMessage(slot.message);
  assert.ok(pendingHash || /not yet broadcast/i.test(slot.message), `the message names the hash or says "not yet broadcast": ${slot.message}`);
  if (pendingHash) assert.equal((await waitInPool(stack, fresh)).hash, pendingHash, 'the hash in the message is the broadcast transaction');

  // The same array asked again with its key: the pending element's answer is its own success.
  const again = await settleUntilDone(stack, [done.body, fresh.body], { key });
  assert.equal(again.status, 200, show(again));
  expectDuplicateResult(again.body[0], { transaction: h0, network: NETWORK, payer: done.authorization.from }, again);
  const hash = expectSettledResult(again.body[1], { network: NETWORK, payer: fresh.authorization.from }, again);
  if (pendingHash) assert.equal(hash, pendingHash, 'the pending transaction is the one that settles');
  assert.match(hash, TX_HASH);
  assert.equal(await usdcBalance(fresh.authorization.to), PRICE);
  await mining(stack.anvil, waitPoolEmpty(stack.anvil));
});
