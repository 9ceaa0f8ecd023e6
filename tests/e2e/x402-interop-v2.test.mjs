// Interop with the official x402 v2 packages, unchanged: an @x402/express resource server uses
// routerd (x402_versions = [1, 2]) as its facilitator through @x402/core's HTTP facilitator client,
// and @x402/fetch pays it with @x402/evm's exact scheme on the anvil chain eip155:84532.
// allow_http_resource = true: the middleware states its own http://127.0.0.1 URL as the resource.
// The duplicate-settlement attack (spec/access.md section 1): one PAYMENT-SIGNATURE header signed
// by @x402/fetch, sent in several concurrent requests, buys one delivery and moves one price.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import express from 'express';
import { paymentMiddleware, x402ResourceServer } from '@x402/express';
import { HTTPFacilitatorClient } from '@x402/core/server';
import { ExactEvmScheme as ExactEvmServerScheme } from '@x402/evm/exact/server';
import { ExactEvmScheme as ExactEvmClientScheme } from '@x402/evm/exact/client';
import { wrapFetchWithPayment, x402Client, decodePaymentResponseHeader } from '@x402/fetch';
import { getAddress } from 'viem';
import { randomUUID } from 'node:crypto';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { anvilAccount, freshAccount, ROLE } from './lib/accounts.mjs';
import { USDC_EIP712 } from './lib/deploy-usdc.mjs';
import { listenShop, catchPaymentHeader, expectDelivered, expectReplayedHeaderBuysOnce } from './lib/interop.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = '10000'; // 0.01 USDC

let stack;
let server;
let shopUrl;
const payTo = anvilAccount(ROLE.payee).address;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({ routerd: { x402Versions: [1, 2], allowHttpResource: true } });
  shopUrl = await startShop();
});

after(async () => {
  await new Promise((resolve) => (server ? server.close(resolve) : resolve()));
  await stack?.stop();
});

/**
 * The resource server. The `price: {amount, asset, extra}` form names the USDC deployed on anvil
 * (the package's default asset for 84532 is Circle's real one) and its EIP-712 domain.
 */
async function startShop() {
  const facilitator = new HTTPFacilitatorClient({ url: stack.url });
  const resourceServer = new x402ResourceServer(facilitator).register(NETWORK, new ExactEvmServerScheme());
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
  const shop = await listenShop(app);
  server = shop.server;
  return shop.url;
}

/**
 * @x402/fetch with @x402/evm's exact scheme signing for `account` (a viem local account). The
 * client pays only tokens it knows unless told: the anvil USDC is allowed, capped at the price.
 */
function payingFetch(account, inner = fetch) {
  const client = new x402Client().register(NETWORK, new ExactEvmClientScheme(account));
  client.setSpendControls({
    allowedAssets: [{ network: NETWORK, asset: getAddress(stack.usdc), maxAmountPerPayment: PRICE }],
  });
  return wrapFetchWithPayment(inner, client);
}

/**
 * The PAYMENT-SIGNATURE header @x402/fetch signs for `url` when paying as `account`: its paid
 * request is caught before it reaches the server (and answered 204 here), so the header is unused.
 */
function capturePaymentHeader(account, url) {
  return catchPaymentHeader({
    pay: (inner) => payingFetch(account, inner)(url),
    headerOf: (input, init) => new Request(input, init).headers.get('payment-signature'),
    made: '@x402/fetch made a PAYMENT-SIGNATURE header',
  });
}

/**
 * x402 v2 on the wire, for lib/interop.mjs: PAYMENT-SIGNATURE in, PAYMENT-RESPONSE out (a refused
 * settle may carry one, with success false), a refused verify's reason in PAYMENT-REQUIRED.
 */
const V2_WIRE = {
  paymentHeader: 'PAYMENT-SIGNATURE',
  receiptHeader: 'payment-response',
  decodeReceipt: decodePaymentResponseHeader,
  reasonOf: (a) => {
    if (a.receipt) return `settle: ${decodePaymentResponseHeader(a.receipt).errorReason}`;
    try { return `verify: ${JSON.parse(Buffer.from(a.required, 'base64').toString()).error}`; } catch { return a.text.slice(0, 80); }
  },
  expectRefusedReceipt: (refused, shown) => {
    if (refused.receipt) assert.equal(decodePaymentResponseHeader(refused.receipt).success, false, `a refused request's PAYMENT-RESPONSE: ${shown}`);
  },
};

it("@x402/core's facilitator client reads routerd's /supported", async () => {
  const supported = await new HTTPFacilitatorClient({ url: stack.url }).getSupported();
  const v2 = supported.kinds.filter((k) => k.x402Version === 2).map(({ scheme, network }) => ({ scheme, network }));
  assert.deepEqual(v2, [{ scheme: 'exact', network: NETWORK }]);
  assert.deepEqual(supported.extensions, ['payment-identifier', 'bazaar']);
  assert.deepEqual(supported.signers, { 'eip155:*': [getAddress(stack.signer)] });
});

it('an unpaid request gets 402 with v2 requirements naming the anvil USDC', async () => {
  const res = await fetch(`${shopUrl}/weather`);
  assert.equal(res.status, 402);
  const required = JSON.parse(Buffer.from(res.headers.get('payment-required'), 'base64').toString());
  assert.equal(required.x402Version, 2);
  assert.equal(required.accepts.length, 1);
  assert.equal(required.accepts[0].network, NETWORK);
  assert.equal(required.accepts[0].amount, PRICE);
  assert.equal(getAddress(required.accepts[0].asset), getAddress(stack.usdc));
  assert.match(required.resource.url, /^http:\/\/127\.0\.0\.1:\d+\/weather$/);
});

it('@x402/fetch pays the @x402/express server through routerd and USDC moves on chain', async () => {
  const payer = await stack.newPayer(1_000_000n);
  const payeeBefore = await stack.balanceOf(payTo);
  const signerNonce = await stack.signerNonce('pending');

  const res = await payingFetch(payer)(`${shopUrl}/weather`);

  const receipt = await expectDelivered(res, { wire: V2_WIRE, network: NETWORK, payer });

  const mined = await stack.receipt(receipt.transaction);
  assert.equal(mined.status, 'success');
  assert.equal(await stack.signerNonce('pending'), signerNonce + 1, 'one transaction');
  assert.equal(await stack.balanceOf(payer.address), 1_000_000n - BigInt(PRICE));
  assert.equal(await stack.balanceOf(payTo), payeeBefore + BigInt(PRICE));
});

it('a payer without funds is turned away (insufficient_funds) and nothing moves', async () => {
  const payer = freshAccount();
  const payeeBefore = await stack.balanceOf(payTo);
  const signerNonce = await stack.signerNonce('pending');
  const res = await payingFetch(payer)(`${shopUrl}/weather`);
  assert.equal(res.status, 402);
  const required = JSON.parse(Buffer.from(res.headers.get('payment-required'), 'base64').toString());
  assert.match(required.error ?? '', /insufficient_funds/);
  assert.equal(await stack.balanceOf(payTo), payeeBefore);
  assert.equal(await stack.signerNonce('pending'), signerNonce);
});

it('one PAYMENT-SIGNATURE header replayed in 5 concurrent requests: exactly one is delivered, the others are refused with 402, the payee gets one price', async () => {
  await expectReplayedHeaderBuysOnce({ stack, url: `${shopUrl}/weather`, payTo, price: PRICE, capture: capturePaymentHeader, wire: V2_WIRE });
});

/**
 * The header @x402/fetch signs for `account`, with a payment-identifier id the payer added after
 * signing: the extension sits in the payload, outside the signature, and @x402/express forwards it
 * to the facilitator whether or not the shop declared the extension.
 */
async function captureWithOwnPaymentId(account, url) {
  const header = await capturePaymentHeader(account, url);
  const payload = JSON.parse(Buffer.from(header, 'base64').toString());
  payload.extensions = { ...payload.extensions, 'payment-identifier': { info: { required: false, id: `pay_${randomUUID().replaceAll('-', '')}` } } };
  return Buffer.from(JSON.stringify(payload)).toString('base64');
}

it("the payer's own payment-identifier id in a header replayed in 5 concurrent requests buys one delivery and one price (access.md section 1)", async () => {
  await expectReplayedHeaderBuysOnce({ stack, url: `${shopUrl}/weather`, payTo, price: PRICE, capture: captureWithOwnPaymentId, wire: V2_WIRE });
});
