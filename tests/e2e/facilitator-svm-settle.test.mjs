// Solana `exact` settle through routerd (svm.md §4) against the Solana test node: @x402/fetch pays
// an @x402/express server with @x402/svm's client and routerd settles (v2); one payment header
// sent 5 times at once buys one delivery and one transaction; a settlement still unconfirmed when
// routerd is killed is followed again at restart and its claimant told the outcome; a pending
// answer passes the outcome on to the identical retry; a payer's settlements under way count
// against its source account at verify and settle; a transaction that fails on chain is a failure and cools its source
// down; a blockhash that expires before landing is
// a failure answered with certainty; GET /settlements/{network}/{signature} tells each.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import express from 'express';
import { paymentMiddleware, x402ResourceServer } from '@x402/express';
import { HTTPFacilitatorClient } from '@x402/core/server';
import { wrapFetchWithPayment, x402Client, decodePaymentResponseHeader } from '@x402/fetch';
import { ExactSvmScheme as ExactSvmClient } from '@x402/svm/exact/client';
import { ExactSvmScheme as ExactSvmServer } from '@x402/svm/exact/server';
import {
  startSvmNode, newSolanaKeypair, svmFacilitatorConfig, newFeePayer, testWithLogs, associatedTokenAddress, SOLANA_DEVNET_CAIP2, DEVNET_USDC_MINT,
} from './lib/svm.mjs';
import { startRouterd, freePort } from './lib/routerd.mjs';
import { listenShop, catchPaymentHeader } from './lib/interop.mjs';
import { makeTempDir, waitFor } from './lib/util.mjs';

const PRICE = 10_000n;
const SIGNATURE = /^[1-9A-HJ-NP-Za-km-z]{64,88}$/;

let tmp;
let node;
let routerd;
let feePayer;
let shop;
let shopUrl;
let payee;
let payeeAccount;

before(async () => {
  tmp = makeTempDir('routerd-svm-settle-');
  node = await startSvmNode({ slotMs: 100, blockhashExpiry: 30, logFile: join(tmp.dir, 'svm-node.log') });
  let feePayerFile;
  ({ feePayer, feePayerFile } = await newFeePayer(node, tmp.dir));
  await node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  payee = await newSolanaKeypair();
  ({ tokenAccount: payeeAccount } = await node.createTokenAccount(DEVNET_USDC_MINT, payee.address));
  const config = svmFacilitatorConfig({
    port: await freePort(), storePath: join(tmp.dir, 'store'), rpcUrl: node.url, feePayerFile,
    facilitator: 'settle_timeout_secs = 2\n',
  });
  routerd = await startRouterd({ configToml: config, dir: tmp.dir });
  ({ server: shop, url: shopUrl } = await listenShop(shopApp()));
});

after(async () => {
  await new Promise((resolve) => (shop ? shop.close(resolve) : resolve()));
  await routerd?.stop();
  await node?.stop();
  tmp?.cleanup();
});

const it = testWithLogs(test, () => tmp.dir, { nodeLog: true, first: () => node.resume() });

/** The resource server: @x402/express with @x402/svm's server scheme, routerd as its facilitator. */
function shopApp() {
  const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: routerd.url }))
    .register(SOLANA_DEVNET_CAIP2, new ExactSvmServer());
  const app = express();
  app.use(paymentMiddleware({
    'GET /report': {
      accepts: {
        scheme: 'exact', network: SOLANA_DEVNET_CAIP2, payTo: payee.address,
        price: { amount: String(PRICE), asset: DEVNET_USDC_MINT, extra: { feePayer: feePayer.address } },
      },
      description: 'report',
      mimeType: 'application/json',
    },
  }, resourceServer));
  app.get('/report', (req, res) => res.json({ report: 'sunny' }));
  return app;
}

function payingFetch(payer, inner = fetch) {
  const client = new x402Client().register(SOLANA_DEVNET_CAIP2, new ExactSvmClient(payer.signer, { rpcUrl: node.url }));
  return wrapFetchWithPayment(inner, client);
}

/** A payer holding `amount` USDC and no SOL. */
async function newPayer(amount = 1_000_000n) {
  const payer = await newSolanaKeypair();
  await node.mintTo(DEVNET_USDC_MINT, payer.address, amount);
  return payer;
}

const balances = async (payer) => ({
  payee: await node.tokenBalance(payeeAccount),
  payer: await node.tokenBalance(await associatedTokenAddress(payer.address, DEVNET_USDC_MINT)),
  payerSol: await node.balance(payer.address),
  feePayer: await node.balance(feePayer.address),
  transactions: (await node.status()).transactionCount,
});

/** A v2 /settle body: @x402/svm's client payment of PRICE to the payee. */
async function settleBody(payer) {
  const required = {
    scheme: 'exact', network: SOLANA_DEVNET_CAIP2, asset: DEVNET_USDC_MINT, amount: String(PRICE), payTo: payee.address,
    maxTimeoutSeconds: 60, extra: { feePayer: feePayer.address },
  };
  const partial = await new ExactSvmClient(payer.signer, { rpcUrl: node.url }).createPaymentPayload(2, required);
  const paymentPayload = { ...partial, accepted: required, resource: { url: 'http://shop.test/report' } };
  return { x402Version: 2, paymentPayload, paymentRequirements: required };
}

/** The same transaction in v1's shape. */
function v1Body(v2) {
  const r = v2.paymentRequirements;
  return {
    x402Version: 1,
    paymentPayload: { x402Version: 1, scheme: 'exact', network: 'solana-devnet', payload: v2.paymentPayload.payload },
    paymentRequirements: {
      scheme: 'exact', network: 'solana-devnet', maxAmountRequired: r.amount, resource: 'http://shop.test/report',
      description: '', mimeType: '', payTo: r.payTo, maxTimeoutSeconds: 60, asset: r.asset, extra: r.extra,
    },
  };
}

async function settle(body, headers = {}, path = '/settle') {
  const res = await fetch(`${routerd.url}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

const verify = (body) => settle(body, {}, '/verify');

/** The fee of a transaction with the payer's and the fee payer's signatures: fees only, no rent. */
function assertFeeOnly(spent) {
  assert.ok(spent >= 10_000n && spent < 20_000n, `the fee payer paid only the fee (${spent} lamports)`);
}

it('@x402/fetch pays the @x402/express server through routerd: the payee gets the price, the payer spends no SOL, the fee payer only the fee', async () => {
  const payer = await newPayer();
  const before = await balances(payer);
  const res = await payingFetch(payer)(`${shopUrl}/report`);
  const text = await res.text();
  assert.equal(res.status, 200, text);
  assert.deepEqual(JSON.parse(text), { report: 'sunny' });
  const receipt = decodePaymentResponseHeader(res.headers.get('payment-response'));
  assert.equal(receipt.success, true);
  assert.match(receipt.transaction, SIGNATURE);
  assert.equal(receipt.network, SOLANA_DEVNET_CAIP2);
  assert.equal(receipt.payer, payer.address);
  const after = await balances(payer);
  assert.equal(after.payee, before.payee + PRICE);
  assert.equal(after.payer, before.payer - PRICE);
  assert.equal(after.payerSol, 0n);
  assertFeeOnly(before.feePayer - after.feePayer);
  assert.equal(after.transactions, before.transactions + 1);
});

it('one payment header sent 5 times at once: one delivery, one transaction, the others refused with 402', async () => {
  const payer = await newPayer();
  const header = await catchPaymentHeader({
    pay: (inner) => payingFetch(payer, inner)(`${shopUrl}/report`),
    headerOf: (input, init) => new Request(input, init).headers.get('payment-signature'),
    made: '@x402/fetch made a PAYMENT-SIGNATURE header',
  });
  const before = await balances(payer);
  const answers = await Promise.all(Array.from({ length: 5 }, async () => {
    const res = await fetch(`${shopUrl}/report`, { headers: { 'PAYMENT-SIGNATURE': header } });
    return { status: res.status, text: await res.text() };
  }));
  assert.deepEqual(answers.map((a) => a.status).sort(), [200, 402, 402, 402, 402], answers.map((a) => a.text).join(' | '));
  const after = await balances(payer);
  assert.equal(after.payee, before.payee + PRICE);
  assert.equal(after.transactions, before.transactions + 1);
  assertFeeOnly(before.feePayer - after.feePayer);
});

it('a settle answered pending passes the outcome on to its identical retry; another settle of the transaction is a duplicate naming the signature', async () => {
  const payer = await newPayer();
  const body = await settleBody(payer);
  const before = await balances(payer);
  await node.pause();
  const pending = await settle(body);
  assert.equal(pending.body.success, false);
  assert.equal(pending.body.errorReason, 'settlement_pending', JSON.stringify(pending.body));
  assert.match(pending.body.transaction, SIGNATURE);
  await node.resume();
  const told = await settle(body);
  assert.deepEqual({ success: told.body.success, transaction: told.body.transaction, payer: told.body.payer },
    { success: true, transaction: pending.body.transaction, payer: payer.address }, JSON.stringify(told.body));
  const status = await (await fetch(`${routerd.url}/settlements/${SOLANA_DEVNET_CAIP2}/${told.body.transaction}`)).json();
  assert.equal(typeof status.slot, 'number');
  assert.ok(Number.isInteger(status.confirmations) && status.confirmations >= 1, JSON.stringify(status));
  assert.deepEqual({ ...status, slot: 0, confirmations: 0 }, {
    network: 'solana-devnet', signature: told.body.transaction, state: 'final', slot: 0, confirmations: 0, payer: payer.address,
    payTo: payee.address, amount: String(PRICE), mint: DEVNET_USDC_MINT, outcome: { success: true, transaction: told.body.transaction },
  });
  const again = await settle(body);
  assert.deepEqual({ success: again.body.success, errorReason: again.body.errorReason, transaction: again.body.transaction },
    { success: false, errorReason: 'duplicate_settlement', transaction: pending.body.transaction });
  const verified = await (await fetch(`${routerd.url}/verify`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  })).json();
  assert.deepEqual(verified, {
    isValid: false, invalidReason: 'invalid_payload', invalidMessage: `transaction already settled by ${pending.body.transaction}`, payer: payer.address,
  });
  const v1 = await settle(v1Body(body));
  assert.deepEqual({ success: v1.body.success, errorReason: v1.body.errorReason, errorMessage: v1.body.errorMessage },
    { success: false, errorReason: 'invalid_payload', errorMessage: `already settled by ${pending.body.transaction}` });
  const after = await balances(payer);
  assert.equal(after.payee, before.payee + PRICE);
  assert.equal(after.transactions, before.transactions + 1);
});

it('v1: a settle still unconfirmed at the deadline answers the pending error (400, error 504) naming the signature', async () => {
  const payer = await newPayer();
  const body = v1Body(await settleBody(payer));
  await node.pause();
  const pending = await settle(body);
  assert.equal(pending.status, 400);
  assert.equal(pending.body.error, 504);
  assert.match(pending.body.message, /^settlement pending: [1-9A-HJ-NP-Za-km-z]{64,88}; settle the same payment again/);
  await node.resume();
  const told = await settle(body);
  assert.equal(told.body.success, true, JSON.stringify(told.body));
  assert.equal(told.body.network, 'solana-devnet');
});

it('settlements under way count against the source: a second payment beyond what the payer holds besides them is refused (insufficient_funds) at verify and settle', async () => {
  const payer = await newPayer(15_000n);
  const first = await settleBody(payer);
  const second = await settleBody(payer);
  assert.notEqual(first.paymentPayload.payload.transaction, second.paymentPayload.payload.transaction);
  const before = await balances(payer);
  assert.equal((await verify(second)).body.isValid, true, 'valid while nothing is under way');
  await node.pause();
  const pending = await settle(first);
  assert.equal(pending.body.errorReason, 'settlement_pending', JSON.stringify(pending.body));
  // Verify counts it too, with the same one upstream request (the store is read beside it).
  for (const body of [second, v1Body(second)]) {
    const verified = await verify(body);
    assert.deepEqual({ isValid: verified.body.isValid, invalidReason: verified.body.invalidReason },
      { isValid: false, invalidReason: 'insufficient_funds' }, JSON.stringify(verified.body));
    assert.match(verified.body.invalidMessage ?? '', /holds 15000, 10000 of it in settlements under way/, JSON.stringify(verified.body));
  }
  const refused = await settle(second);
  assert.deepEqual({ success: refused.body.success, errorReason: refused.body.errorReason, transaction: refused.body.transaction },
    { success: false, errorReason: 'insufficient_funds', transaction: '' }, JSON.stringify(refused.body));
  assert.match(refused.body.errorMessage, /holds 15000, 10000 of it in settlements under way/);
  await node.resume();
  assert.equal((await settle(first)).body.success, true);
  const after = await balances(payer);
  assert.equal(after.payer, before.payer - PRICE);
  assert.equal(after.transactions, before.transactions + 1);
  assertFeeOnly(before.feePayer - after.feePayer);
});

it('routerd killed after sending: at restart it follows the transaction again, and the same settle (Idempotency-Key) gets the outcome; one transaction', async () => {
  const payer = await newPayer();
  const body = await settleBody(payer);
  const before = await balances(payer);
  await node.pause();
  const first = settle(body, { 'Idempotency-Key': 'kill-after-send' }).catch(() => null);
  await waitFor(async () => (await node.status()).pending > 0, { what: 'the settlement sent to the node' });
  await routerd.kill();
  await first;
  await node.resume();
  await routerd.restart();
  const told = await settle(body, { 'Idempotency-Key': 'kill-after-send' });
  assert.equal(told.body.success, true, JSON.stringify(told.body));
  assert.match(told.body.transaction, SIGNATURE);
  const after = await balances(payer);
  assert.equal(after.payee, before.payee + PRICE);
  assert.equal(after.transactions, before.transactions + 1);
  assertFeeOnly(before.feePayer - after.feePayer);
});

it('a blockhash that expires before the transaction lands: failure answered with certainty, nothing moves', async () => {
  const payer = await newPayer();
  const body = await settleBody(payer);
  const before = await balances(payer);
  await node.pause();
  const pending = await settle(body);
  assert.equal(pending.body.errorReason, 'settlement_pending', JSON.stringify(pending.body));
  // Dropped and past its blockhash's lifetime in one request: routerd's next send lands nowhere.
  const answers = await node.batch([['litesvm_dropPending'], ['litesvm_advanceSlots', [100]]]);
  assert.ok(answers.every((a) => !a.error), JSON.stringify(answers));
  await node.resume();
  const told = await settle(body);
  assert.deepEqual({ success: told.body.success, errorReason: told.body.errorReason, transaction: told.body.transaction },
    { success: false, errorReason: 'transaction_failed', transaction: pending.body.transaction }, JSON.stringify(told.body));
  assert.match(told.body.errorMessage, /expired/);
  const status = await (await fetch(`${routerd.url}/settlements/solana-devnet/${told.body.transaction}`)).json();
  assert.deepEqual({ state: status.state, slot: status.slot, confirmations: status.confirmations, outcome: status.outcome }, {
    state: 'expired', slot: null, confirmations: null,
    outcome: { success: false, transaction: null, errorReason: 'settle_exact_svm_block_height_exceeded', errorMessage: told.body.errorMessage },
  });
  const other = await settle(body, { 'Idempotency-Key': 'another-caller' });
  assert.deepEqual({ success: other.body.success, errorReason: other.body.errorReason }, { success: false, errorReason: 'transaction_failed' },
    'a failure is told to every caller');
  const unknown = await fetch(`${routerd.url}/settlements/solana-devnet/${'1'.repeat(64)}`);
  assert.equal(unknown.status, 404);
  const after = await balances(payer);
  assert.equal(after.payee, before.payee);
  assert.equal(after.payer, before.payer);
  assert.equal(after.feePayer, before.feePayer);
  assert.equal(after.transactions, before.transactions);
});

it('a transaction that fails on chain: failure naming the signature (transaction_failed, status failed), and its source token account refused for the revert cooldown', async () => {
  const payer = await newPayer();
  const body = await settleBody(payer);
  const source = await associatedTokenAddress(payer.address, DEVNET_USDC_MINT);
  await node.pause();
  const pending = await settle(body);
  assert.equal(pending.body.errorReason, 'settlement_pending', JSON.stringify(pending.body));
  // The source emptied while the transaction waits: it lands, and fails.
  const { value: account } = await node.rpc('getAccountInfo', [source, { encoding: 'base64' }]);
  const data = Buffer.from(account.data[0], 'base64');
  data.fill(0, 64, 72);
  await node.rpc('litesvm_setAccount', [{ address: source, lamports: account.lamports, owner: account.owner, data: data.toString('base64') }]);
  await node.resume();
  const told = await settle(body);
  assert.deepEqual({ success: told.body.success, errorReason: told.body.errorReason, transaction: told.body.transaction },
    { success: false, errorReason: 'transaction_failed', transaction: pending.body.transaction }, JSON.stringify(told.body));
  assert.match(told.body.errorMessage, /failed on chain/);
  const status = await (await fetch(`${routerd.url}/settlements/solana-devnet/${told.body.transaction}`)).json();
  assert.equal(status.state, 'failed');
  assert.equal(typeof status.slot, 'number');
  assert.equal(status.outcome.errorReason, 'settle_exact_svm_transaction_failed');
  // Funded again, the same source is refused for the cooldown.
  await node.mintTo(DEVNET_USDC_MINT, payer.address, 1_000_000n);
  const next = await settleBody(payer);
  const verified = await (await fetch(`${routerd.url}/verify`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(next),
  })).json();
  assert.equal(verified.isValid, false);
  assert.equal(verified.invalidReason, 'invalid_payload');
  assert.match(verified.invalidMessage, /refused for \d+ s more: a settlement from it failed on chain/);
  const refused = await settle(next);
  assert.deepEqual({ success: refused.body.success, errorReason: refused.body.errorReason }, { success: false, errorReason: 'invalid_payload' });
});
