// Interop with the official x402 v1 packages, unchanged: an x402-express resource server uses
// routerd as its facilitator, and x402-fetch pays it with a viem wallet on the anvil "base-sepolia".
// The duplicate-settlement attack (spec/access.md section 1): one payment header signed by
// x402-fetch, sent in several concurrent requests, buys one delivery and moves one price.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import express from 'express';
import { paymentMiddleware } from 'x402-express';
import { wrapFetchWithPayment, decodeXPaymentResponse } from 'x402-fetch';
import { useFacilitator } from 'x402/verify';
import { createWalletClient, defineChain, getAddress, http } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK, CHAIN_ID } from './lib/stack.mjs';
import { anvilAccount, freshAccount, ROLE } from './lib/accounts.mjs';
import { USDC_EIP712 } from './lib/deploy-usdc.mjs';
import { listenShop, catchPaymentHeader, expectDelivered, expectReplayedHeaderBuysOnce } from './lib/interop.mjs';

const PRICE = '10000'; // 0.01 USDC, under x402-fetch's default 0.1 USDC ceiling

let stack;
let server;
let shopUrl;
const payTo = anvilAccount(ROLE.payee).address;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack();
  shopUrl = await startShop();
});

after(async () => {
  await new Promise((resolve) => (server ? server.close(resolve) : resolve()));
  await stack?.stop();
});

/**
 * The resource server. x402 1.2.0 would default to Circle's real base-sepolia USDC address; the
 * `price: {amount, asset}` form names the token deployed on anvil instead. `resource` is given as
 * https because the middleware would otherwise state this server's own http:// URL, which the
 * facilitator's requirement checks refuse (resource must be https).
 */
async function startShop() {
  const asset = { address: stack.usdc, decimals: 6, eip712: { ...USDC_EIP712 } };
  const route = (extraConfig = {}) => ({
    price: { amount: PRICE, asset },
    network: NETWORK,
    config: { description: 'weather report', mimeType: 'application/json', ...extraConfig },
  });
  const app = express();
  app.use(paymentMiddleware(payTo, {
    'GET /weather': route({ resource: 'https://shop.example/weather' }),
    'GET /plain-http': route(),
  }, { url: stack.url }));
  app.get('/weather', (req, res) => res.json({ report: 'sunny' }));
  app.get('/plain-http', (req, res) => res.json({ report: 'never served' }));
  const shop = await listenShop(app);
  server = shop.server;
  return shop.url;
}

/**
 * x402-fetch around a viem wallet on chain 84532 (which the x402 client maps to base-sepolia),
 * sending its requests through `inner` (default: the global fetch).
 */
function payingFetch(account, inner = fetch) {
  const chain = defineChain({
    id: CHAIN_ID,
    name: 'base-sepolia on anvil',
    nativeCurrency: { name: 'Ether', symbol: 'ETH', decimals: 18 },
    rpcUrls: { default: { http: [stack.anvil.url] } },
  });
  const wallet = createWalletClient({ account, chain, transport: http(stack.anvil.url) });
  return wrapFetchWithPayment(inner, wallet);
}

/**
 * The X-PAYMENT header x402-fetch signs for `url` when paying as `account`: its paid request is
 * caught before it reaches the server (and answered 204 here), so the header is still unused.
 */
function capturePaymentHeader(account, url) {
  return catchPaymentHeader({
    pay: (inner) => payingFetch(account, inner)(url),
    headerOf: (input, init) => init?.headers?.['X-PAYMENT'],
    made: 'x402-fetch made an X-PAYMENT header',
  });
}

/** x402 v1 on the wire, for lib/interop.mjs: X-PAYMENT in, X-PAYMENT-RESPONSE out, refusals in the JSON body. */
const V1_WIRE = {
  paymentHeader: 'X-PAYMENT',
  receiptHeader: 'x-payment-response',
  decodeReceipt: decodeXPaymentResponse,
  reasonOf: (a) => { try { return JSON.parse(a.text).error; } catch { return a.text.slice(0, 80); } },
  expectRefusedReceipt: (refused, shown) => assert.equal(refused.receipt, null, `a refused request got a payment receipt: ${shown}`),
};

it("x402's facilitator client reads routerd's /supported", async () => {
  const { kinds } = await useFacilitator({ url: stack.url }).supported();
  assert.deepEqual(kinds.map(({ x402Version, scheme, network }) => ({ x402Version, scheme, network })), [
    { x402Version: 1, scheme: 'exact', network: NETWORK },
  ]);
});

it('an unpaid request gets 402 with requirements naming the anvil USDC', async () => {
  const res = await fetch(`${shopUrl}/weather`);
  assert.equal(res.status, 402);
  const { accepts } = await res.json();
  assert.equal(accepts.length, 1);
  assert.equal(accepts[0].asset, getAddress(stack.usdc));
  assert.equal(accepts[0].maxAmountRequired, PRICE);
  assert.equal(accepts[0].network, NETWORK);
});

it('x402-fetch pays the x402-express server through routerd and USDC moves on chain', async () => {
  const payer = await stack.newPayer(1_000_000n);
  const payeeBefore = await stack.balanceOf(payTo);

  const res = await payingFetch(payer)(`${shopUrl}/weather`);

  const receipt = await expectDelivered(res, { wire: V1_WIRE, network: NETWORK, payer });

  const mined = await stack.receipt(receipt.transaction);
  assert.equal(mined.status, 'success');
  assert.equal(await stack.balanceOf(payer.address), 1_000_000n - BigInt(PRICE));
  assert.equal(await stack.balanceOf(payTo), payeeBefore + BigInt(PRICE));
});

it('a payer without funds is turned away with insufficient_funds and nothing moves', async () => {
  const payer = freshAccount();
  const payeeBefore = await stack.balanceOf(payTo);
  const res = await payingFetch(payer)(`${shopUrl}/weather`);
  assert.equal(res.status, 402);
  const body = await res.json();
  assert.equal(body.error, 'insufficient_funds');
  assert.equal(body.payer, payer.address);
  assert.equal(await stack.balanceOf(payTo), payeeBefore);
});

it("a route left with the middleware's default http:// resource is refused: invalid_payment_requirements", async () => {
  const payer = await stack.newPayer(1_000_000n);
  const res = await payingFetch(payer)(`${shopUrl}/plain-http`);
  assert.equal(res.status, 402);
  assert.equal((await res.json()).error, 'invalid_payment_requirements');
  assert.equal(await stack.balanceOf(payer.address), 1_000_000n);
});

it('one X-PAYMENT header replayed in 5 concurrent requests: exactly one is delivered, the others are refused with 402, the payee gets one price', async () => {
  await expectReplayedHeaderBuysOnce({ stack, url: `${shopUrl}/weather`, payTo, price: PRICE, capture: capturePaymentHeader, wire: V1_WIRE });
});
