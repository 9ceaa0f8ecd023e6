// A batch-settlement deposit (spec/batch-settlement.md: one success per deposit authorization,
// write-ahead before every broadcast) when routerd dies between the deposit's broadcast and its
// answer. The chain mines only on request (anvil --no-mining + evm_mine), so the deposit's
// transaction waits in the mempool while routerd is SIGKILLed; routerd's escrow and collectors are
// at the canonical addresses (lib/batch-settlement.mjs), the payload is signed by @x402/evm 2.27.0's
// batch-settlement client scheme. After the restart the chain mines:
// - exactly one deposit on chain (one signer transaction, the escrow holds exactly the deposit);
// - the same settle retried with its Idempotency-Key is answered the success, naming the
//   transaction broadcast before the crash, with the channel after it;
// - a keyless settle of the same deposit is told that transaction as a failure, nothing sent.
// Also: SIGKILL, the block mined while routerd is down, restart: the same outcome; and SIGKILL with
// the chain losing the deposit's transaction meanwhile: the restart re-broadcasts the stored one
// (the same hash), and the outcome is the same.
// Before any crash: a deposit still in the mempool after settle_timeout_secs is answered pending
// with its hash, a keyless settle meanwhile `already being settled by` it, and once mined the key
// retry its success; meanwhile the deposit is answered v2's settlement_pending with its hash.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { toClientEvmSigner } from '@x402/evm';
import { BatchSettlementEvmScheme as BatchClient } from '@x402/evm/batch-settlement/client';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { anvilAccount, freshAccount, ROLE } from './lib/accounts.mjs';
import { USDC_EIP712 } from './lib/deploy-usdc.mjs';
import { BATCH_SETTLEMENT, placeBatchSettlement, readChannel } from './lib/batch-settlement.mjs';
import { waitFor, idempotencyKey } from './lib/util.mjs';
import { isPending } from './lib/settling.mjs';
import { TX_HASH, show } from './lib/expect.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = 1000n;
const SETTLE_TIMEOUT_SECS = 3;
const receiver = anvilAccount(ROLE.payee).address;
const authorizer = freshAccount();

let stack;
let nextPayer = 0;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { noMining: true },
    fundedPayers: 5, // minting needs blocks: fund everyone during setup
    routerd: {
      x402Versions: [1, 2], allowHttpResource: true, settleTimeoutSecs: SETTLE_TIMEOUT_SECS, extra: 'batch_settlement = true\n',
    },
    beforeRouterd: (s) => placeBatchSettlement(s.client),
  });
});

after(() => stack?.stop());

function requirements() {
  return {
    scheme: 'batch-settlement', network: NETWORK, amount: String(PRICE), asset: getAddress(stack.usdc), payTo: receiver,
    maxTimeoutSeconds: 3600,
    extra: { receiverAuthorizer: authorizer.address, withdrawDelay: 900, ...USDC_EIP712 },
  };
}

/** A deposit signed by the official client for a payer no other test uses: {payload, body, payer}. */
async function newDeposit() {
  const account = stack.payers[nextPayer];
  nextPayer += 1;
  const client = new BatchClient(toClientEvmSigner(account, stack.client));
  const reqs = requirements();
  const { payload } = await client.createPaymentPayload(2, reqs);
  assert.equal(payload.type, 'deposit');
  const paymentPayload = { x402Version: 2, accepted: reqs, payload };
  return { payload, payer: account.address, body: { x402Version: 2, paymentPayload, paymentRequirements: structuredClone(reqs) } };
}

/** Hash of the signer's transaction with `nonce` waiting in anvil's mempool (undefined if none). */
async function pendingSignerTx(nonce) {
  const pool = await stack.anvil.rpc('txpool_content');
  const bySender = Object.entries(pool.pending ?? {}).find(([from]) => getAddress(from) === getAddress(stack.signer));
  return bySender?.[1]?.[String(nonce)]?.hash;
}

/** v2's pending answer (`settlement_pending` with the hash), or the error body's 504. */
const pending = (res) => isPending(res) || (res.status === 200 && res.body?.errorReason === 'settlement_pending');

/** The first request retried (its Idempotency-Key, the same bytes), again while it is pending. */
async function settleAgain(raw, key) {
  let res;
  for (let i = 0; i < 5; i += 1) {
    res = await stack.settle(raw, { key });
    if (!pending(res)) return res;
  }
  return res;
}

/**
 * A fresh deposit settled with its own Idempotency-Key, once routerd has broadcast its
 * transaction: {deposit, raw (the body's bytes), key, nonce, inflight (the open request), hash}.
 */
async function depositInFlight() {
  const deposit = await newDeposit();
  const raw = JSON.stringify(deposit.body);
  const nonce = await stack.signerNonce('pending');
  const key = idempotencyKey();
  const inflight = stack.settle(raw, { key }).catch((err) => err);
  const hash = await waitFor(() => pendingSignerTx(nonce), { timeoutMs: 15_000, what: `signer transaction #${nonce} in the mempool` });
  return { deposit, raw, key, nonce, inflight, hash };
}

/**
 * After the crash: the key retry gets the success by `hash`, a keyless settle is told `hash` as a
 * failure, and the chain holds one deposit: one signer transaction, the escrow up by exactly it.
 */
async function expectOneDeposit({ deposit, raw, key, nonce, hash }, escrowBefore) {
  const amount = BigInt(deposit.payload.deposit.amount);
  const res = await settleAgain(raw, key);
  assert.equal(res.status, 200, show(res));
  assert.equal(res.body.success, true, `the key retry is told the success: ${show(res)}`);
  assert.equal(res.body.transaction, hash, `the success names the transaction broadcast before the crash: ${show(res)}`);
  assert.equal(res.body.network, NETWORK, show(res));
  assert.equal(getAddress(res.body.payer), deposit.payer, show(res));
  assert.equal(res.body.amount, String(amount), show(res));
  assert.equal(res.body.extra?.channelState?.balance, String(amount), show(res));

  const again = await stack.settle(raw);
  assert.equal(again.status, 200, show(again));
  assert.equal(again.body.success, false, `a keyless settle of a settled deposit is never told success: ${show(again)}`);
  assert.equal(again.body.transaction, hash, `the duplicate is told the deposit's transaction: ${show(again)}`);
  assert.equal(again.body.errorReason, 'invalid_batch_settlement_evm_deposit_payload', show(again));
  assert.equal(again.body.errorMessage, `already settled by ${hash}`, show(again));

  const receipt = await stack.receipt(hash);
  assert.equal(receipt.status, 'success');
  assert.equal(getAddress(receipt.to), BATCH_SETTLEMENT);
  assert.equal(await stack.signerNonce(), nonce + 1, 'one signer transaction');
  assert.equal(await stack.signerNonce('pending'), nonce + 1, 'nothing re-sent after the restart');
  assert.equal(await stack.balanceOf(BATCH_SETTLEMENT), escrowBefore + amount, 'the escrow holds exactly one deposit more');
  assert.equal((await readChannel(stack.client, deposit.payload.voucher.channelId)).balance, amount);
}

/** Mine until the signer's transaction with `nonce` is in a block (a test's leftovers stall the next). */
async function mineOut(nonce) {
  while ((await stack.signerNonce()) <= nonce && (await stack.signerNonce('pending')) > nonce) await stack.anvil.mine();
}

it(`a deposit still pending after settle_timeout_secs (${SETTLE_TIMEOUT_SECS}): a keyless settle told it is being settled; mined, the key retry told the success`, async () => {
  const escrowBefore = await stack.balanceOf(BATCH_SETTLEMENT);
  const inFlight = await depositInFlight();
  try {
    const [first, duplicate] = await Promise.all([inFlight.inflight, stack.settle(inFlight.raw)]);
    assert.ok(pending(first), `the first request is answered pending: ${show(first)}`);
    assert.ok(first.text.includes(inFlight.hash), `the pending answer names the broadcast transaction: ${show(first)}`);
    assert.equal(duplicate.body?.success, false, show(duplicate));
    assert.equal(duplicate.body.transaction, inFlight.hash, show(duplicate));
    assert.equal(duplicate.body.errorMessage, `already being settled by ${inFlight.hash}`, show(duplicate));
    assert.equal(await stack.signerNonce('pending'), inFlight.nonce + 1, 'nothing more sent');
    await stack.anvil.mine();
    await expectOneDeposit(inFlight, escrowBefore);
  } finally {
    await mineOut(inFlight.nonce);
  }
});

// x402 v2 answers a settlement whose outcome is unknown after broadcast with `settlement_pending`
// and its hash (HTTP 200), which @x402/core's resource server asks again on (v1's error body,
// HTTP 400 {error: 504}, makes @x402/core's HTTPFacilitatorClient throw).
test(`a deposit still pending after settle_timeout_secs is answered v2's settlement_pending with its hash`, {
  timeout: 90_000,
}, withLogTail(() => stack, async () => {
  const inFlight = await depositInFlight();
  try {
    const first = await inFlight.inflight;
    assert.equal(first.status, 200, show(first));
    assert.equal(first.body?.success, false, show(first));
    assert.equal(first.body.errorReason, 'settlement_pending', show(first));
    assert.equal(first.body.transaction, inFlight.hash, show(first));
  } finally {
    await mineOut(inFlight.nonce);
  }
}));

it('SIGKILL with the deposit in the mempool; restart; mine: one deposit, the key retry told the success, a keyless settle the transaction', async () => {
  const escrowBefore = await stack.balanceOf(BATCH_SETTLEMENT);
  const inFlight = await depositInFlight();
  await stack.routerd.kill();
  const lost = await inFlight.inflight;
  assert.ok(lost instanceof Error, `the request open at the crash got no answer: ${JSON.stringify(lost?.body)}`);
  await stack.routerd.restart();
  await stack.anvil.mine();
  await expectOneDeposit(inFlight, escrowBefore);
});

it('SIGKILL with the deposit in the mempool, mined while routerd is down: the same after the restart', async () => {
  const escrowBefore = await stack.balanceOf(BATCH_SETTLEMENT);
  const inFlight = await depositInFlight();
  await stack.routerd.kill();
  await inFlight.inflight;
  await stack.anvil.mine();
  await stack.routerd.restart();
  await expectOneDeposit(inFlight, escrowBefore);
});

it('SIGKILL, and the chain loses the deposit meanwhile: the restart re-broadcasts the stored transaction, one deposit', async () => {
  const escrowBefore = await stack.balanceOf(BATCH_SETTLEMENT);
  const inFlight = await depositInFlight();
  const { hash, nonce } = inFlight;
  const raw = await stack.anvil.rpc('eth_getRawTransactionByHash', [hash]);
  await stack.routerd.kill();
  await inFlight.inflight;
  await stack.anvil.rpc('anvil_dropTransaction', [hash]);
  assert.equal(await stack.signerNonce('pending'), nonce, 'precondition: the chain forgot the transaction');
  try {
    await stack.routerd.restart();
    const answer = stack.settle(inFlight.raw, { key: inFlight.key }); // resumes the stored record, at the latest now
    await waitFor(async () => (await pendingSignerTx(nonce)) === hash, { timeoutMs: 15_000, what: 're-broadcast of the stored deposit' });
    await stack.anvil.mine();
    await answer;
    await expectOneDeposit(inFlight, escrowBefore);
  } finally {
    // Without the re-broadcast the signer's nonce has a gap: put the transaction back and mine it.
    if ((await stack.signerNonce()) === nonce) {
      await stack.anvil.rpc('eth_sendRawTransaction', [raw]).catch(() => {});
      await stack.anvil.mine();
    }
  }
});
