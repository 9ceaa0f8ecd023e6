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
import { TX_HASH } from './lib/expect.mjs';

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
  server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  return `http://127.0.0.1:${server.address().port}`;
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
async function capturePaymentHeader(account, url) {
  let header;
  const inner = async (input, init) => {
    const value = init?.headers?.['X-PAYMENT'];
    if (value) {
      header = value;
      return new Response(null, { status: 204 });
    }
    return fetch(input, init);
  };
  const res = await payingFetch(account, inner)(url);
  assert.equal(res.status, 204, 'the paid request was caught');
  assert.ok(typeof header === 'string' && header.length > 0, 'x402-fetch made an X-PAYMENT header');
  return header;
}

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

  const text = await res.text();
  assert.equal(res.status, 200, text);
  assert.deepEqual(JSON.parse(text), { report: 'sunny' });
  const receipt = decodeXPaymentResponse(res.headers.get('x-payment-response'));
  assert.equal(receipt.success, true);
  assert.match(receipt.transaction, TX_HASH);
  assert.equal(receipt.network, NETWORK);
  assert.equal(receipt.payer, payer.address);

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
  const payer = await stack.newPayer(1_000_000n);
  const url = `${shopUrl}/weather`;
  const header = await capturePaymentHeader(payer, url);
  const payeeBefore = await stack.balanceOf(payTo);
  const signerNonce = await stack.signerNonce('pending');

  const answers = await Promise.all(Array.from({ length: 5 }, async () => {
    const res = await fetch(url, { headers: { 'X-PAYMENT': header } });
    return { status: res.status, text: await res.text(), receipt: res.headers.get('x-payment-response') };
  }));

  const shown = answers.map((a) => `${a.status} ${a.text.slice(0, 200)}`).join(' | ');
  console.log(`# statuses ${answers.map((a) => a.status).join(', ')}; refusals: ${answers.filter((a) => a.status !== 200).map((a) => { try { return JSON.parse(a.text).error; } catch { return a.text.slice(0, 80); } }).join(', ')}`);
  const delivered = answers.filter((a) => a.status === 200);
  assert.equal(delivered.length, 1, `exactly one delivery: ${shown}`);
  assert.deepEqual(JSON.parse(delivered[0].text), { report: 'sunny' });
  const receipt = decodeXPaymentResponse(delivered[0].receipt);
  assert.equal(receipt.success, true);
  assert.match(receipt.transaction, TX_HASH);
  for (const refused of answers.filter((a) => a !== delivered[0])) {
    assert.equal(refused.status, 402, `refused with 402: ${shown}`);
    assert.ok(!refused.text.includes('sunny'), `a refused request got the resource: ${shown}`);
    assert.equal(refused.receipt, null, `a refused request got a payment receipt: ${shown}`);
  }
  assert.equal((await stack.receipt(receipt.transaction)).status, 'success');
  assert.equal(await stack.balanceOf(payTo), payeeBefore + BigInt(PRICE), 'the payee received one price');
  assert.equal(await stack.balanceOf(payer.address), 1_000_000n - BigInt(PRICE), 'the payer paid once');
  assert.equal(await stack.signerNonce('pending'), signerNonce + 1, 'one settlement transaction');

  // Later, the same header once more: refused, nothing moves.
  const late = await fetch(url, { headers: { 'X-PAYMENT': header } });
  assert.equal(late.status, 402, await late.text());
  assert.equal(await stack.balanceOf(payTo), payeeBefore + BigInt(PRICE));
});
