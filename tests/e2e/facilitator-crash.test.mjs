// Settlement under a chain that mines only on request (anvil --no-mining + evm_mine): the pending
// answer (HTTP 400 {error: 504}), crash safety (SIGKILL with a transaction in the mempool, the chain
// losing it meanwhile), graceful SIGTERM, and what routerd must never write to its log. A client
// that lost its answer asks again with the same Idempotency-Key and body (spec/access.md section 1)
// and is told the first request's outcome; a replay without that key is told the transaction as a
// failure.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { waitFor, idempotencyKey } from './lib/util.mjs';
import { expectSettled, expectErrorBody, expectDuplicate, TX_HASH } from './lib/expect.mjs';

const SETTLE_TIMEOUT_SECS = 3;

let stack;
const signatures = []; // every payment signature sent in this file, to check the log for leaks
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { noMining: true },
    fundedPayers: 6, // minting needs blocks: fund everyone during setup
    routerd: { settleTimeoutSecs: SETTLE_TIMEOUT_SECS },
  });
});

after(() => stack?.stop());

let nextPayer = 0;
/** A valid payment from a payer no other test uses, so balance checks are exact. */
async function newPayment() {
  const account = stack.payers[nextPayer];
  nextPayer += 1;
  const p = await stack.pay({ account });
  signatures.push(p.signature);
  return p;
}

/** Hash of the signer's transaction with `nonce` waiting in anvil's mempool (undefined if none). */
async function pendingSignerTx(nonce) {
  const pool = await stack.anvil.rpc('txpool_content');
  const bySender = Object.entries(pool.pending ?? {}).find(([from]) => getAddress(from) === getAddress(stack.signer));
  return bySender?.[1]?.[String(nonce)]?.hash;
}

/** Wait until routerd has broadcast the settlement transaction with signer nonce `nonce`. */
function waitForBroadcast(nonce) {
  return waitFor(() => pendingSignerTx(nonce), { timeoutMs: 15_000, what: `signer transaction #${nonce} in the mempool` });
}

/**
 * A fresh payment settled with its own Idempotency-Key, once routerd has broadcast its transaction:
 * {p, payerBefore, nonce (the signer's pending nonce before), key, inflight (the request, still
 * open; an error if its connection dies with the daemon), hash (the broadcast transaction)}.
 */
async function settlementInFlight() {
  const p = await newPayment();
  const payerBefore = await stack.balanceOf(p.authorization.from);
  const nonce = await stack.signerNonce('pending');

  const key = idempotencyKey();
  const inflight = stack.settle(p.body, { key }).catch((err) => err);
  const hash = await waitForBroadcast(nonce);
  return { p, payerBefore, nonce, key, inflight, hash };
}

/** Funds moved exactly once, by a transaction that is mined and succeeded. */
async function expectPaidOnce(p, hash, payerBefore) {
  const receipt = await stack.receipt(hash);
  assert.equal(receipt.status, 'success');
  assert.equal(getAddress(receipt.to), getAddress(stack.usdc));
  assert.equal(await stack.balanceOf(p.authorization.from), payerBefore - 1000n);
  assert.equal(await stack.balanceOf(p.authorization.to), 1000n);
}

/** The 504 pending answer: HTTP 400 {error: 504, message: "settlement pending: 0x<hash> ..."}. */
function pendingHash(res) {
  expectErrorBody(res, 400, { error: 504 });
  const hash = res.body.message.match(/0x[0-9a-fA-F]{64}/)?.[0];
  assert.match(hash ?? '', TX_HASH, `no transaction hash in: ${res.body.message}`);
  return hash;
}

/** SIGTERM must end the daemon with exit code 0 within shutdown_grace_secs. */
async function expectGracefulStop() {
  const exit = await stack.routerd.stop();
  assert.deepEqual(exit, { code: 0, signal: null }, `routerd did not exit 0 on SIGTERM: ${JSON.stringify(exit)}`);
}

/**
 * The first request retried (its Idempotency-Key `key`, the same body), asking once more if it
 * answers "pending" because the block came too late, as a client would.
 */
async function settleAgain(body, key) {
  let res = await stack.settle(body, { key });
  if (res.status === 400 && res.body?.error === 504) res = await stack.settle(body, { key });
  return res;
}

// ---------------------------------------------------------------------------------------------

it(`a settlement still pending after settle_timeout_secs (${SETTLE_TIMEOUT_SECS}) answers 400 {error: 504} with its hash`, async () => {
  const p = await newPayment();
  const payerBefore = await stack.balanceOf(p.authorization.from);
  const nonce = await stack.signerNonce('pending');

  const key = idempotencyKey();
  const hash = pendingHash(await stack.settle(p.body, { key }));
  assert.equal(await pendingSignerTx(nonce), hash, 'the hash in the message is the broadcast transaction');

  // Still pending: the first request retried gets the same answer; another settle of the payment
  // is told the transaction it waits for, as a failure; no second transaction.
  assert.equal(pendingHash(await stack.settle(p.body, { key })), hash);
  expectDuplicate(await stack.settle(p.body), { transaction: hash, network: NETWORK, payer: p.authorization.from, being: true });
  assert.equal(await stack.signerNonce('pending'), nonce + 1);

  await stack.anvil.mine();
  const final = expectSettled(await settleAgain(p.body, key), { network: NETWORK, payer: p.authorization.from });
  assert.equal(final, hash, 'the first request retried gets the outcome of its transaction');
  expectDuplicate(await stack.settle(p.body), { transaction: hash, network: NETWORK, payer: p.authorization.from });
  await expectPaidOnce(p, hash, payerBefore);
  assert.equal(await stack.signerNonce(), nonce + 1);
});

it('SIGKILL with the transaction in the mempool: after restart the same payment settles with the same hash', async () => {
  const { p, payerBefore, nonce, key, inflight, hash } = await settlementInFlight();
  await stack.routerd.kill();
  await inflight;
  await stack.anvil.mine();
  await stack.routerd.restart();

  const res = await settleAgain(p.body, key);
  assert.equal(expectSettled(res, { network: NETWORK, payer: p.authorization.from }), hash);
  await expectPaidOnce(p, hash, payerBefore);
  assert.equal(await stack.signerNonce(), nonce + 1, 'exactly one facilitator transaction');
  assert.equal(await stack.signerNonce('pending'), nonce + 1, 'nothing re-sent after the restart');
});

it('SIGKILL, and the chain loses the transaction meanwhile: restart re-broadcasts the stored one', async () => {
  const { p, payerBefore, nonce, key, inflight, hash } = await settlementInFlight();
  const raw = await stack.anvil.rpc('eth_getRawTransactionByHash', [hash]);
  await stack.routerd.kill();
  await inflight;
  await stack.anvil.rpc('anvil_dropTransaction', [hash]);
  assert.equal(await stack.signerNonce('pending'), nonce, 'precondition: the chain forgot the transaction');

  try {
    await stack.routerd.restart();
    const answer = stack.settle(p.body, { key }); // resumes the stored record (at startup, or at the latest now)
    // The write-ahead record holds the signed raw transaction: re-broadcasting it gives the same hash.
    await waitFor(async () => (await pendingSignerTx(nonce)) === hash, { timeoutMs: 15_000, what: 're-broadcast of the stored transaction' });
    await stack.anvil.mine();
    let res = await answer;
    if (res.status === 400 && res.body?.error === 504) res = await stack.settle(p.body, { key });

    assert.equal(expectSettled(res, { network: NETWORK, payer: p.authorization.from }), hash);
    await expectPaidOnce(p, hash, payerBefore);
    assert.equal(await stack.signerNonce(), nonce + 1);
    assert.equal(await stack.signerNonce('pending'), nonce + 1);
  } finally {
    // If routerd never re-broadcast, the signer's nonce has a gap that would stall every later
    // test: put the transaction back and mine it, so the remaining tests check their own rules.
    if ((await stack.signerNonce()) === nonce) {
      await stack.anvil.rpc('eth_sendRawTransaction', [raw]).catch(() => {});
      await stack.anvil.mine();
    }
  }
});

it('SIGTERM exits 0; after restart the settled payment\'s first request, retried, gets its success, a replay the same hash as a failure', async () => {
  const p = await newPayment();
  const payerBefore = await stack.balanceOf(p.authorization.from);
  const nonce = await stack.signerNonce('pending');

  const key = idempotencyKey();
  const answer = stack.settle(p.body, { key });
  await waitForBroadcast(nonce);
  await stack.anvil.mine();
  let res = await answer;
  if (res.status === 400 && res.body?.error === 504) res = await stack.settle(p.body, { key }); // the block came late
  const hash = expectSettled(res, { network: NETWORK, payer: p.authorization.from });

  await expectGracefulStop();
  await stack.routerd.restart();
  assert.equal(expectSettled(await stack.settle(p.body, { key }), { network: NETWORK, payer: p.authorization.from }), hash);
  expectDuplicate(await stack.settle(p.body), { transaction: hash, network: NETWORK, payer: p.authorization.from });
  await expectPaidOnce(p, hash, payerBefore);
  assert.equal(await stack.signerNonce('pending'), nonce + 1);
});

it('SIGTERM during a settlement exits 0 and keeps it: after restart it completes with the same hash', async () => {
  const { p, payerBefore, nonce, key, inflight, hash } = await settlementInFlight();
  await expectGracefulStop();
  await inflight;
  await stack.anvil.mine();
  await stack.routerd.restart();

  assert.equal(expectSettled(await settleAgain(p.body, key), { network: NETWORK, payer: p.authorization.from }), hash);
  await expectPaidOnce(p, hash, payerBefore);
  assert.equal(await stack.signerNonce('pending'), nonce + 1);
});

it('the log never contains the signer key or a payment signature', async () => {
  const log = readFileSync(stack.routerd.logFile, 'utf8').toLowerCase();
  assert.ok(log.length > 0, 'routerd wrote a log');
  const key = stack.signerKey.toLowerCase().slice(2);
  assert.ok(!log.includes(key), 'the signer private key appears in the log');
  for (const sig of signatures) {
    // r alone is enough to recognise a signature, whatever the formatting around it.
    assert.ok(!log.includes(sig.toLowerCase().slice(2, 66)), `payment signature ${sig.slice(0, 12)}... appears in the log`);
  }
});
