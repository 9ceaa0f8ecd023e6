// A pending answer passes the success on (spec/access.md section 1), with the official v2 packages
// unchanged: an @x402/express shop settles through routerd on a chain that mines only when told,
// with facilitator.settle_timeout_secs = 2. routerd answers the shop's first settle
// `settlement_pending`; @x402/core's resource server retries once, at once, with the identical
// payload and no header of its own (settleWithPendingRetry). The block is mined only while that
// retry is waiting, so the retry must be told the success for the shop to deliver. The payment is
// delivered once, the price moves once, in one transaction; a replay of the same header later is
// refused and nothing more moves.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import express from 'express';
import { paymentMiddleware, x402ResourceServer } from '@x402/express';
import { HTTPFacilitatorClient } from '@x402/core/server';
import { ExactEvmScheme as ExactEvmServerScheme } from '@x402/evm/exact/server';
import { ExactEvmScheme as ExactEvmClientScheme } from '@x402/evm/exact/client';
import { wrapFetchWithPayment, x402Client } from '@x402/fetch';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { anvilAccount, ROLE } from './lib/accounts.mjs';
import { USDC_EIP712 } from './lib/deploy-usdc.mjs';
import { listenShop } from './lib/interop.mjs';
import { sleep } from './lib/util.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = '10000';
/** How long the retry waits before the block comes: it is under way at routerd by then. */
const RETRY_HEAD_START_MS = 500;

let stack;
let shop;
let watcher;
const payTo = anvilAccount(ROLE.payee).address;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { noMining: true },
    fundedPayers: 1, // minting needs blocks: fund the payer during setup
    routerd: { x402Versions: [1, 2], allowHttpResource: true, settleTimeoutSecs: 2 },
  });
  watcher = await startSettleWatcher(stack.url);
  shop = await startShop(watcher.url);
});

after(async () => {
  await new Promise((resolve) => (shop ? shop.server.close(resolve) : resolve()));
  await new Promise((resolve) => (watcher ? watcher.server.close(resolve) : resolve()));
  await stack?.stop();
});

/**
 * A pass-through in front of routerd that records each /settle body and its answer, and calls
 * `onSettle(n)` as the n-th /settle starts (n from 1).
 */
async function startSettleWatcher(target) {
  const state = { settles: [], onSettle: () => {} };
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const body = Buffer.concat(chunks);
    let entry;
    if (req.url === '/settle') {
      entry = { body: body.toString() };
      state.settles.push(entry);
      state.onSettle(state.settles.length);
    }
    const upstream = await fetch(`${target}${req.url}`, {
      method: req.method,
      headers: { 'content-type': req.headers['content-type'] ?? 'application/json' },
      body: req.method === 'GET' ? undefined : body,
    });
    const text = await upstream.text();
    if (entry) entry.answer = text;
    res.writeHead(upstream.status, { 'content-type': upstream.headers.get('content-type') ?? 'application/json' });
    res.end(text);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, state, url: `http://127.0.0.1:${server.address().port}` };
}

async function startShop(facilitatorUrl) {
  const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: facilitatorUrl }))
    .register(NETWORK, new ExactEvmServerScheme());
  const app = express();
  app.use(paymentMiddleware({
    'GET /weather': {
      accepts: {
        scheme: 'exact',
        network: NETWORK,
        payTo,
        price: { amount: PRICE, asset: getAddress(stack.usdc), extra: { ...USDC_EIP712 } },
      },
      description: 'weather report',
      mimeType: 'application/json',
    },
  }, resourceServer));
  app.get('/weather', (req, res) => res.json({ report: 'sunny' }));
  return listenShop(app);
}

function payingFetch(account) {
  const client = new x402Client().register(NETWORK, new ExactEvmClientScheme(account));
  client.setSpendControls({
    allowedAssets: [{ network: NETWORK, asset: getAddress(stack.usdc), maxAmountPerPayment: PRICE }],
  });
  return wrapFetchWithPayment(fetch, client);
}

it("a settlement pending at the deadline: @x402/core's identical retry is told the success, the shop delivers once, the price moves once", async () => {
  const payer = stack.payers[0];
  const payerBefore = await stack.balanceOf(payer.address);
  const payeeBefore = await stack.balanceOf(payTo);
  const signerNonce = await stack.signerNonce('pending');
  // The block comes only once the retry is under way at routerd.
  const mined = new Promise((resolve, reject) => {
    watcher.state.onSettle = (n) => {
      if (n === 2) sleep(RETRY_HEAD_START_MS).then(() => stack.anvil.mine()).then(resolve, reject);
    };
  });

  const res = await payingFetch(payer)(`${shop.url}/weather`);
  const text = await res.text();
  await mined;

  const [first, retry] = watcher.state.settles;
  assert.equal(watcher.state.settles.length, 2, 'the shop settled twice: the pending answer and its retry');
  assert.equal(JSON.parse(first.answer).errorReason, 'settlement_pending', first.answer);
  assert.equal(retry.body, first.body, 'the retry is byte-identical');
  assert.equal(JSON.parse(retry.answer).success, true, `the retry is told the success: ${retry.answer}`);
  assert.equal(res.status, 200, text);
  assert.deepEqual(JSON.parse(text), { report: 'sunny' });
  assert.equal(await stack.balanceOf(payTo), payeeBefore + BigInt(PRICE), 'one price');
  assert.equal(await stack.balanceOf(payer.address), payerBefore - BigInt(PRICE));
  assert.equal(await stack.signerNonce('pending'), signerNonce + 1, 'one settlement transaction');

  // The identical settle once more: the pass is spent, it is a duplicate.
  const again = await stack.settle(first.body);
  assert.equal(again.body?.success, false, JSON.stringify(again.body));
  assert.match(again.body?.errorMessage ?? '', /already settled by/);
});
