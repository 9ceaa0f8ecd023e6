// Network presets (README "Network presets"): a facilitator configured with nothing but
// `networks = ["base-sepolia"]` and the chain's RPC URL serves Base Sepolia's USDC, and a preset
// overridden field by field serves the override.
//
// The chain is an anvil started with Base Sepolia's chain id (84532), with Circle's FiatTokenV2_2
// placed at Base Sepolia's USDC address under its EIP-712 name "USDC" (lib/deploy-usdc.mjs's
// placeUsdc): to every signer and to routerd it is Base Sepolia's USDC. The official resource
// servers (x402-express, @x402/express) are given only a dollar price, so the asset they ask for
// is their own package's default for the network; the official clients pay it through routerd.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import express from 'express';
import { getAddress } from 'viem';
import { paymentMiddleware as paymentMiddlewareV1 } from 'x402-express';
import { wrapFetchWithPayment as wrapFetchV1, decodeXPaymentResponse } from 'x402-fetch';
import { paymentMiddleware as paymentMiddlewareV2, x402ResourceServer } from '@x402/express';
import { HTTPFacilitatorClient } from '@x402/core/server';
import { ExactEvmScheme as ExactEvmServerScheme } from '@x402/evm/exact/server';
import { ExactEvmScheme as ExactEvmClientScheme } from '@x402/evm/exact/client';
import { wrapFetchWithPayment as wrapFetchV2, x402Client, decodePaymentResponseHeader } from '@x402/fetch';
import { createWalletClient, defineChain, http } from 'viem';
import { startAnvil } from './lib/anvil.mjs';
import { anvilAccount, anvilKey, freshAccount, ROLE } from './lib/accounts.mjs';
import { deployUsdc, placeUsdc, walletFor, mintUsdc, usdcAbi } from './lib/deploy-usdc.mjs';
import { startRouterd, routerdBin } from './lib/routerd.mjs';
import { buildPayment, toV2 } from './lib/x402.mjs';
import { expectValid, expectInvalid, expectSettled } from './lib/expect.mjs';
import { listenShop, expectDelivered } from './lib/interop.mjs';
import { freePort, makeTempDir, readAnswer } from './lib/util.mjs';

const NETWORK = 'base-sepolia';
const CHAIN_ID = 84532;
const CAIP2 = `eip155:${CHAIN_ID}`;
// Base Sepolia's USDC, as both official packages list it (x402 1.2.0, @x402/evm 2.27.0).
const USDC = getAddress('0x036CbD53842c5426634e7929541eC2318f3dCF7e');
const PRESET_DOMAIN = Object.freeze({ name: 'USDC', version: '2' });
const PRICE = 10_000n; // '$0.01' in USDC's 6 decimals
const payTo = anvilAccount(ROLE.payee).address;

let anvil;
let deployer; // wallet client of the token's owner and minter
let routerd; // the daemon of the describe block running
let shops = [];

const it = (name, fn) => test(name, { timeout: 90_000 }, async (t) => {
  try {
    await fn(t);
  } catch (err) {
    const tail = routerd?.tail(60);
    if (tail) console.error(`--- routerd log tail (${t.name}) ---\n${tail}\n--- end ---`);
    throw err;
  }
});

before(async () => {
  anvil = await startAnvil({ chainId: CHAIN_ID });
  deployer = await walletFor(anvil.url, anvilKey(ROLE.deployer));
  await placeUsdc(deployer, { address: USDC, eip712Name: PRESET_DOMAIN.name });
});

after(async () => {
  await anvil?.stop();
});

/**
 * routerd's configuration: the chain has its RPC URL and `tokens` (raw TOML, after it) only;
 * everything else about base-sepolia is left to its preset.
 */
function presetConfig({ port, dir, tokens = '' }) {
  return `[server]
listen = "127.0.0.1:${port}"
shutdown_grace_secs = 5
[storage]
path = ${JSON.stringify(join(dir, 'routerd.db'))}
[chains.${NETWORK}]
rpc_urls = [${JSON.stringify(anvil.url)}]
${tokens}
[facilitator]
networks = ["${NETWORK}"]
x402_versions = [1, 2]
allow_http_resource = true
`;
}

/** routerd on `presetConfig`, with `env` added to the signer key. */
async function startPresetDaemon({ tokens, env = {} } = {}) {
  const { dir } = makeTempDir();
  const port = await freePort();
  const configToml = presetConfig({ port, dir, tokens });
  return startRouterd({ dir, port, configToml, env: { ROUTERD_SIGNER_KEY: anvilKey(ROLE.signer), ...env } });
}

/** `routerd check-config` on the running daemon's file and environment: {status, stdout, stderr}. */
function checkConfig(daemon) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('ROUTERD')));
  const r = spawnSync(routerdBin(), ['check-config', '--config', daemon.configFile], {
    env: { ...env, ...daemon.env }, encoding: 'utf8', timeout: 30_000,
  });
  if (r.error) throw r.error;
  return r;
}

/** The lines of `[table]` in check-config's output, up to the next table. */
function tableLines(stdout, table) {
  const start = stdout.indexOf(`[${table}]\n`);
  assert.ok(start >= 0, `no [${table}] in:\n${stdout}`);
  return stdout.slice(start).split('\n\n')[0].split('\n');
}

const get = (path) => fetch(`${routerd.url}${path}`).then(readAnswer);
const post = (path, body) => fetch(`${routerd.url}${path}`, {
  method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
}).then(readAnswer);

const balanceOf = (token, address) => deployer.readContract({ address: token, abi: usdcAbi, functionName: 'balanceOf', args: [address] });

async function fundedPayer(token) {
  const payer = freshAccount();
  await mintUsdc(deployer, token, payer.address, 1_000_000n);
  return payer;
}

/** A v1 payment of PRICE signed for `token`'s domain, its requirements naming that domain. */
async function payment(account, token) {
  const p = await buildPayment({ account, token, network: NETWORK, chainId: CHAIN_ID, payTo, amount: PRICE });
  p.body.paymentRequirements.extra = { name: token.name, version: token.version };
  return p;
}

async function stopShops() {
  await Promise.all(shops.map((server) => new Promise((resolve) => server.close(resolve))));
  shops = [];
}

describe('a network named only: networks = ["base-sepolia"] and the chain\'s rpc_urls', () => {
  before(async () => {
    routerd = await startPresetDaemon();
  });

  after(async () => {
    await stopShops();
    await routerd?.stop();
  });

  it('/supported serves base-sepolia in v1 and eip155:84532 in v2 (exact and upto)', async () => {
    const res = await get('/supported');
    assert.equal(res.status, 200, res.text);
    const kinds = res.body.kinds.map(({ x402Version, scheme, network }) => ({ x402Version, scheme, network }));
    assert.deepEqual(kinds, [
      { x402Version: 1, scheme: 'exact', network: NETWORK },
      { x402Version: 2, scheme: 'exact', network: CAIP2 },
      // The preset USDC is also paid through Permit2, so x402's upto is served there too.
      { x402Version: 2, scheme: 'upto', network: CAIP2 },
    ]);
  });

  it('check-config shows the preset values and says they are the preset\'s', () => {
    const r = checkConfig(routerd);
    assert.equal(r.status, 0, r.stderr);
    const chain = tableLines(r.stdout, `chains.${NETWORK}`);
    assert.match(r.stdout, /^# base-sepolia: a known network \(eip155:84532\); .*\n\[chains\.base-sepolia\]$/m);
    // The default max_fee_per_gas of Base Sepolia: 10 gwei (access.md section 2).
    for (const line of ['chain_id = 84532  # preset', 'kind = "l2"  # preset', 'fee_model = "op-stack"  # preset', 'max_fee_per_gas = "10000000000"  # preset']) {
      assert.ok(chain.includes(line), `${line} in:\n${chain.join('\n')}`);
    }
    const usdc = tableLines(r.stdout, `chains.${NETWORK}.tokens.USDC`);
    assert.deepEqual(usdc.slice(1), [
      `address = "${USDC}"  # preset`, 'eip712_name = "USDC"  # preset', 'eip712_version = "2"  # preset',
      'transfer_methods = ["eip3009","permit2"]  # preset',
    ]);
  });

  it('x402-fetch pays an x402-express server asking for its default base-sepolia asset; routerd settles it and USDC moves', async () => {
    const app = express();
    app.use(paymentMiddlewareV1(payTo, { 'GET /weather': { price: '$0.01', network: NETWORK } }, { url: routerd.url }));
    app.get('/weather', (req, res) => res.json({ report: 'sunny' }));
    const shop = await listenShop(app);
    shops.push(shop.server);

    const unpaid = await fetch(`${shop.url}/weather`);
    assert.equal(unpaid.status, 402);
    const [accepted] = (await unpaid.json()).accepts;
    assert.equal(getAddress(accepted.asset), USDC, 'x402 1.2.0 asks for Base Sepolia\'s USDC');
    assert.deepEqual(accepted.extra, PRESET_DOMAIN);
    assert.equal(accepted.maxAmountRequired, String(PRICE));

    const payer = await fundedPayer(USDC);
    const payeeBefore = await balanceOf(USDC, payTo);
    const chain = defineChain({
      id: CHAIN_ID, name: 'Base Sepolia on anvil', nativeCurrency: { name: 'Ether', symbol: 'ETH', decimals: 18 },
      rpcUrls: { default: { http: [anvil.url] } },
    });
    const wallet = createWalletClient({ account: payer, chain, transport: http(anvil.url) });
    const res = await wrapFetchV1(fetch, wallet)(`${shop.url}/weather`);
    const wire = { receiptHeader: 'x-payment-response', decodeReceipt: decodeXPaymentResponse };
    const receipt = await expectDelivered(res, { wire, network: NETWORK, payer });
    assert.equal((await deployer.getTransactionReceipt({ hash: receipt.transaction })).status, 'success');
    assert.equal(await balanceOf(USDC, payer.address), 1_000_000n - PRICE);
    assert.equal(await balanceOf(USDC, payTo), payeeBefore + PRICE);
  });

  it('@x402/fetch pays an @x402/express server asking for its default eip155:84532 asset; routerd settles it and USDC moves', async () => {
    const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: routerd.url }))
      .register(CAIP2, new ExactEvmServerScheme());
    const app = express();
    app.use(paymentMiddlewareV2({
      'GET /weather': { accepts: { scheme: 'exact', network: CAIP2, payTo, price: '$0.01' }, description: 'weather' },
    }, resourceServer));
    app.get('/weather', (req, res) => res.json({ report: 'sunny' }));
    const shop = await listenShop(app);
    shops.push(shop.server);

    const unpaid = await fetch(`${shop.url}/weather`);
    assert.equal(unpaid.status, 402);
    const required = JSON.parse(Buffer.from(unpaid.headers.get('payment-required'), 'base64').toString());
    assert.equal(getAddress(required.accepts[0].asset), USDC, '@x402/evm asks for Base Sepolia\'s USDC');
    assert.equal(required.accepts[0].extra?.name, PRESET_DOMAIN.name);

    const payer = await fundedPayer(USDC);
    const payeeBefore = await balanceOf(USDC, payTo);
    // Spend controls left as they are: the package pays its own default assets.
    const client = new x402Client().register(CAIP2, new ExactEvmClientScheme(payer));
    const res = await wrapFetchV2(fetch, client)(`${shop.url}/weather`);
    const wire = { receiptHeader: 'payment-response', decodeReceipt: decodePaymentResponseHeader };
    const receipt = await expectDelivered(res, { wire, network: CAIP2, payer });
    assert.equal((await deployer.getTransactionReceipt({ hash: receipt.transaction })).status, 'success');
    assert.equal(await balanceOf(USDC, payer.address), 1_000_000n - PRICE);
    assert.equal(await balanceOf(USDC, payTo), payeeBefore + PRICE);
  });
});

describe('a preset overridden field by field: the address from the environment, the EIP-712 name from the file', () => {
  let other; // another FiatTokenV2_2 on the chain, EIP-712 name "USD Coin"

  before(async () => {
    other = getAddress(await deployUsdc(deployer));
    routerd = await startPresetDaemon({
      tokens: `[chains.${NETWORK}.tokens.USDC]\neip712_name = "USD Coin"\n`,
      env: { ROUTERD__CHAINS__BASE_SEPOLIA__TOKENS__USDC__ADDRESS: other },
    });
  });

  after(async () => {
    await routerd?.stop();
  });

  it('check-config says which value came from where', () => {
    const r = checkConfig(routerd);
    assert.equal(r.status, 0, r.stderr);
    assert.ok(tableLines(r.stdout, `chains.${NETWORK}`).includes('chain_id = 84532  # preset'), r.stdout);
    assert.deepEqual(tableLines(r.stdout, `chains.${NETWORK}.tokens.USDC`).slice(1), [
      `address = "${other}"  # environment`, 'eip712_name = "USD Coin"  # file', 'eip712_version = "2"  # preset',
      'transfer_methods = ["eip3009","permit2"]  # preset',
    ]);
  });

  it('a payment signed for the preset\'s token is refused: that token is not served any more', async () => {
    const payer = await fundedPayer(USDC);
    const p = await payment(payer, { address: USDC, ...PRESET_DOMAIN });
    expectInvalid(await post('/verify', p.body), 'invalid_payment_requirements', { payer: payer.address });
    const settled = await post('/settle', p.body);
    assert.equal(settled.body?.success, false, settled.text);
    assert.equal(await balanceOf(USDC, payer.address), 1_000_000n);
  });

  it('a payment signed for the override (its address, its name, the preset\'s version) verifies and settles, and the funds move on that token', async () => {
    const payer = await fundedPayer(other);
    const payeeBefore = await balanceOf(other, payTo);
    const p = await payment(payer, { address: other, name: 'USD Coin', version: PRESET_DOMAIN.version });
    expectValid(await post('/verify', p.body), { payer: payer.address });
    const hash = expectSettled(await post('/settle', p.body), { network: NETWORK, payer: payer.address });
    assert.equal((await deployer.getTransactionReceipt({ hash })).status, 'success');
    assert.equal(await balanceOf(other, payer.address), 1_000_000n - PRICE);
    assert.equal(await balanceOf(other, payTo), payeeBefore + PRICE);
  });

  it('the same in v2, named eip155:84532: the override is served there too', async () => {
    const res = await get('/supported');
    assert.ok(res.body.kinds.some((k) => k.x402Version === 2 && k.network === CAIP2), res.text);
    const payer = await fundedPayer(other);
    const p = await payment(payer, { address: other, name: 'USD Coin', version: '2' });
    const body = toV2(p, CHAIN_ID);
    const settled = await post('/settle', body);
    expectSettled(settled, { network: CAIP2, payer: payer.address });
    assert.equal(await balanceOf(other, payer.address), 1_000_000n - PRICE);
  });
});
