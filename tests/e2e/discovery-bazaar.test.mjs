// The discovery catalogue (x402 v2 `bazaar`, issue 31): an @x402/express shop declares its paid
// routes with @x402/extensions' declareDiscoveryExtension, @x402/fetch pays them through routerd,
// and @x402/extensions' withBazaar client lists and searches what routerd catalogued. Only what
// settled is listed: a declared route nobody paid, or a payer turned away, lists nothing; a
// declaration whose info breaks its own schema is paid and delivered all the same, and not listed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import express from 'express';
import { paymentMiddleware, x402ResourceServer } from '@x402/express';
import { HTTPFacilitatorClient } from '@x402/core/server';
import { ExactEvmScheme as ExactEvmServerScheme } from '@x402/evm/exact/server';
import { ExactEvmScheme as ExactEvmClientScheme } from '@x402/evm/exact/client';
import { wrapFetchWithPayment, x402Client, decodePaymentResponseHeader } from '@x402/fetch';
import { declareDiscoveryExtension, bazaarResourceServerExtension, withBazaar } from '@x402/extensions/bazaar';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { anvilAccount, freshAccount, ROLE } from './lib/accounts.mjs';
import { USDC_EIP712 } from './lib/deploy-usdc.mjs';
import { listenShop } from './lib/interop.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = '10000'; // 0.01 USDC

let stack;
let server;
let shopUrl;
let bazaar;
const weatherPayTo = anvilAccount(ROLE.payee).address;
const translatePayTo = freshAccount().address;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({ routerd: { x402Versions: [1, 2], allowHttpResource: true } });
  shopUrl = await startShop();
  bazaar = withBazaar(new HTTPFacilitatorClient({ url: stack.url })).extensions.bazaar;
});

after(async () => {
  await new Promise((resolve) => (server ? server.close(resolve) : resolve()));
  await stack?.stop();
});

const accepts = (payTo) => ({
  scheme: 'exact',
  network: NETWORK,
  payTo,
  price: { amount: PRICE, asset: getAddress(stack.usdc), extra: { ...USDC_EIP712 } },
});

/** A query declaration whose info breaks its own schema: `city` is declared a number. */
function brokenDeclaration() {
  const declared = declareDiscoveryExtension({
    input: { city: 'Paris' },
    inputSchema: { properties: { city: { type: 'number' } }, required: ['city'] },
  });
  return declared;
}

async function startShop() {
  const facilitator = new HTTPFacilitatorClient({ url: stack.url });
  const resourceServer = new x402ResourceServer(facilitator)
    .register(NETWORK, new ExactEvmServerScheme())
    .registerExtension(bazaarResourceServerExtension);
  const app = express();
  app.use(express.json());
  app.use(paymentMiddleware({
    'GET /weather': {
      accepts: accepts(weatherPayTo),
      description: 'Weather report for a city',
      mimeType: 'application/json',
      serviceName: 'Sky Co',
      tags: ['weather', 'Weather', 'forecast'],
      // Loopback: an agent must not be pointed at its own network; dropped from the listing.
      iconUrl: 'http://127.0.0.1/icon.png',
      extensions: declareDiscoveryExtension({
        input: { city: 'Paris' },
        inputSchema: { properties: { city: { type: 'string' } }, required: ['city'] },
        output: { example: { report: 'sunny' } },
      }),
    },
    'POST /translate': {
      accepts: accepts(translatePayTo),
      description: 'Translate English text into French',
      mimeType: 'application/json',
      extensions: declareDiscoveryExtension({
        bodyType: 'json',
        input: { text: 'hello' },
        inputSchema: { properties: { text: { type: 'string' } }, required: ['text'] },
        output: { example: { french: 'bonjour' } },
      }),
    },
    'GET /quotes': {
      accepts: accepts(weatherPayTo),
      description: 'Stock quotes nobody paid for',
      extensions: declareDiscoveryExtension({ input: { symbol: 'ACME' } }),
    },
    'GET /broken': {
      accepts: accepts(weatherPayTo),
      description: 'A broken declaration',
      extensions: brokenDeclaration(),
    },
  }, resourceServer));
  app.get('/weather', (req, res) => res.json({ report: 'sunny' }));
  app.post('/translate', (req, res) => res.json({ french: 'bonjour' }));
  app.get('/quotes', (req, res) => res.json({ ACME: 1 }));
  app.get('/broken', (req, res) => res.json({ ok: true }));
  const shop = await listenShop(app);
  server = shop.server;
  return shop.url;
}

function payingFetch(account) {
  const client = new x402Client().register(NETWORK, new ExactEvmClientScheme(account));
  client.setSpendControls({
    allowedAssets: [{ network: NETWORK, asset: getAddress(stack.usdc), maxAmountPerPayment: PRICE }],
  });
  return wrapFetchWithPayment(fetch, client);
}

/** Pays `path` on the shop and expects the delivery and a successful settlement receipt. */
async function buy(path, init) {
  const payer = await stack.newPayer(1_000_000n);
  const res = await payingFetch(payer)(`${shopUrl}${path}`, init);
  assert.equal(res.status, 200, `${path}: ${await res.clone().text()}`);
  const receipt = decodePaymentResponseHeader(res.headers.get('payment-response'));
  assert.equal(receipt.success, true, JSON.stringify(receipt));
  return receipt;
}

const names = (items) => items.map((r) => `${r.method ?? r.toolName} ${new URL(r.resource).pathname}`);

it('routerd advertises bazaar and lists nothing before anything settled', async () => {
  const supported = await new HTTPFacilitatorClient({ url: stack.url }).getSupported();
  assert.ok(supported.extensions.includes('bazaar'), JSON.stringify(supported.extensions));
  const listed = await bazaar.listResources();
  assert.deepEqual(listed, { x402Version: 2, items: [], pagination: { limit: 100, offset: 0, total: 0 } });
});

it('a paid @x402/express route is listed with its requirements, metadata and declaration; an unpaid one is not', async () => {
  // Declared, asked for, not paid: a 402 and a payer without funds list nothing.
  assert.equal((await fetch(`${shopUrl}/quotes`)).status, 402);
  assert.equal((await payingFetch(freshAccount())(`${shopUrl}/quotes`)).status, 402);
  assert.equal((await bazaar.listResources()).pagination.total, 0);

  const before = Math.floor(Date.now() / 1000);
  await buy('/weather?city=Paris');
  const listed = await bazaar.listResources();
  assert.equal(listed.pagination.total, 1);
  const [weather] = listed.items;
  assert.equal(weather.resource, `${shopUrl}/weather`, 'origin and path: no query string');
  assert.equal(weather.type, 'http');
  assert.equal(weather.method, 'GET');
  assert.equal(weather.x402Version, 2);
  assert.equal(weather.description, 'Weather report for a city');
  assert.equal(weather.mimeType, 'application/json');
  assert.equal(weather.serviceName, 'Sky Co');
  assert.deepEqual(weather.tags, ['weather', 'forecast'], 'deduplicated case-insensitively');
  assert.equal(weather.iconUrl, undefined, 'a loopback icon is dropped');
  assert.equal(weather.accepts.length, 1);
  const [accepted] = weather.accepts;
  assert.equal(accepted.scheme, 'exact');
  assert.equal(accepted.network, NETWORK);
  assert.equal(accepted.amount, PRICE);
  assert.equal(getAddress(accepted.asset), getAddress(stack.usdc));
  assert.equal(accepted.payTo, getAddress(weatherPayTo));
  assert.deepEqual(weather.extensions.bazaar.info.input, { type: 'http', method: 'GET', queryParams: { city: 'Paris' } });
  assert.deepEqual(Object.keys(weather.extensions), ['bazaar']);
  const updated = Date.parse(weather.lastUpdated) / 1000;
  assert.ok(updated >= before - 1 && updated <= Date.now() / 1000 + 1, weather.lastUpdated);
});

it('a declaration whose info breaks its schema is paid and delivered, and not listed', async () => {
  await buy('/broken');
  assert.deepEqual(names((await bazaar.listResources()).items), ['GET /weather']);
});

it("filters and paging follow @x402/extensions' parameters, newest first", async () => {
  await buy('/translate', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ text: 'hello' }) });
  const all = await bazaar.listResources();
  assert.deepEqual(names(all.items), ['POST /translate', 'GET /weather']);
  assert.equal(all.items[0].extensions.bazaar.info.input.bodyType, 'json');

  const page = (params) => bazaar.listResources(params).then((r) => [names(r.items), r.pagination]);
  assert.deepEqual(await page({ limit: 1 }), [['POST /translate'], { limit: 1, offset: 0, total: 2 }]);
  assert.deepEqual(await page({ limit: 1, offset: 1 }), [['GET /weather'], { limit: 1, offset: 1, total: 2 }]);
  assert.deepEqual(await page({ offset: 2 }), [[], { limit: 100, offset: 2, total: 2 }]);
  assert.deepEqual(await page({ payTo: translatePayTo.toLowerCase() }), [['POST /translate'], { limit: 100, offset: 0, total: 1 }]);
  assert.deepEqual((await page({ type: 'http', scheme: 'exact', network: NETWORK, extensions: 'bazaar' }))[0], ['POST /translate', 'GET /weather']);
  for (const params of [{ type: 'mcp' }, { scheme: 'upto' }, { network: 'eip155:1' }, { extensions: 'sign-in-with-x' }]) {
    assert.deepEqual(await page(params), [[], { limit: 100, offset: 0, total: 0 }], JSON.stringify(params));
  }
  await assert.rejects(bazaar.listResources({ limit: 0 }), /\(400\).*limit: must be at least 1/);
  await assert.rejects(bazaar.listResources({ payTo: 'shop' }), /\(400\).*payTo: not a 0x address/);
});

it('search finds resources by their words, most matching first, with a cursor', async () => {
  const search = (params) => bazaar.search(params);
  const weather = await search({ query: 'weather forecast' });
  assert.equal(weather.x402Version, 2);
  assert.deepEqual(names(weather.resources), ['GET /weather']);
  assert.equal(weather.partialResults, false);
  assert.deepEqual(weather.pagination, { limit: 100, cursor: null });
  assert.deepEqual(names((await search({ query: 'French translation' })).resources), ['POST /translate']);
  assert.deepEqual(names((await search({ query: 'Sky' })).resources), ['GET /weather']);
  assert.deepEqual((await search({ query: 'stock quotes' })).resources, [], 'never paid: never found');
  assert.deepEqual(names((await search({ query: 'weather text', payTo: translatePayTo })).resources), ['POST /translate']);

  // Both match "city" or "text"; the weather report matches both words and comes first.
  const first = await search({ query: 'city report', limit: 1 });
  assert.deepEqual(names(first.resources), ['GET /weather']);
  assert.equal(first.partialResults, false);
  const both = await search({ query: 'english weather', limit: 1 });
  assert.equal(both.partialResults, true);
  assert.equal(both.pagination.cursor, '1');
  const next = await search({ query: 'english weather', limit: 1, cursor: both.pagination.cursor });
  assert.equal(next.resources.length, 1);
  assert.equal(next.partialResults, false);
  assert.notDeepEqual(names(next.resources), names(both.resources));
  await assert.rejects(search({ query: 'the of' }), /\(400\).*query: needs at least one search word/);
});

// access.md §3c: a search's work is bounded by its query (32 words, 64 characters each, 1 KiB),
// and within the bounds it ranks as a short query does.
it('search takes at most 32 words of at most 64 characters, 1 KiB in all: 400 naming query beyond, the same ranking at the bounds', async () => {
  const search = (params) => bazaar.search(params);
  const short = names((await search({ query: 'english city report' })).resources);
  assert.deepEqual(short, ['GET /weather', 'POST /translate'], 'the weather report matches two words, the translation one');
  const filler = Array.from({ length: 28 }, (_, i) => `zz${String(i).padStart(2, '0')}`);
  let query = ['english', 'city', 'report', 'q'.repeat(64), ...filler].join(' ');
  query += ' '.repeat(1024 - Buffer.byteLength(query));
  assert.equal(Buffer.byteLength(query), 1024);
  assert.equal(query.trim().split(/\s+/).length, 32);
  assert.deepEqual(names((await search({ query })).resources), short, 'at the bounds: the same ranking');

  await assert.rejects(search({ query: `${query.trim()} zz99` }), /\(400\).*query: at most 32 words/);
  await assert.rejects(search({ query: `weather ${'q'.repeat(65)}` }), /\(400\).*query: words of at most 64 characters/);
  await assert.rejects(search({ query: `${query}x` }), /\(400\).*query: at most 1024 bytes/);

  // The shape of every 400 of the route; the flood of distinct short words is refused unread.
  const raw = async (query) => {
    const res = await fetch(`${stack.url}/discovery/search?query=${query}`);
    return { status: res.status, body: await res.json() };
  };
  const known = await raw('the+of');
  // The request: 15,800 distinct short words, within the HTTP server's URI bound.
  const flood = await raw(Array.from({ length: 15_800 }, (_, i) => i.toString(36)).join('+'));
  assert.equal(flood.status, 400, JSON.stringify(flood.body));
  assert.deepEqual(Object.keys(flood.body).sort(), Object.keys(known.body).sort());
  assert.equal(flood.body.error, known.body.error);
  assert.match(JSON.stringify(flood.body), /query: at most 1024 bytes/);
});
