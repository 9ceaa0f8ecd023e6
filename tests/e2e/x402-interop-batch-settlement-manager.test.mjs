// Interop of x402's `batch-settlement` scheme with the official v2 packages, the server side: the
// merchant setup of a shop behind routerd with API keys ([auth] api_keys_file). The shop's key is
// scoped `pay_to = [<the shop's payTo>]`, and the shop's @x402/core HTTP facilitator client sends
// `Authorization: Bearer <key>` on every call (its `createAuthHeaders`). An @x402/express shop with
// @x402/evm's batch-settlement server scheme is paid by two payers through @x402/fetch (a deposit,
// then vouchers), and then the official channel manager (BatchSettlementChannelManager) of that
// shop claims, sweeps and refunds through routerd. Two runs:
// - the shop's own receiver authorizer (a test key): the manager signs claims and refunds itself,
//   routerd relays the signatures;
// - routerd's authorizer (facilitator.receiver_authorizer_key_file): the shop holds no key, takes the
//   receiverAuthorizer routerd's /supported advertises, and sends no signatures: routerd signs.
// In each: the manager's claim lands both payers' charges in one transaction and its sweep pays the
// receiver exactly the charged sum; the first payer's own refund (@x402/evm's client `refund`,
// through the shop) and the manager's refund of the second payer's channel give each payer back
// exactly the unclaimed rest; every transaction is routerd's, the payers never hold ETH. With
// routerd's authorizer, a refund sent with an API key not scoped to the receiver is refused
// (`invalid_batch_settlement_evm_authorizer_not_configured`) and nothing moves.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import express from 'express';
import { paymentMiddleware, x402ResourceServer } from '@x402/express';
import { HTTPFacilitatorClient } from '@x402/core/server';
import { toClientEvmSigner } from '@x402/evm';
import {
  BatchSettlementEvmScheme as BatchServer, BatchSettlementChannelManager,
} from '@x402/evm/batch-settlement/server';
import {
  BatchSettlementEvmScheme as BatchClient, InMemoryClientChannelStorage, getChannel,
} from '@x402/evm/batch-settlement/client';
import { wrapFetchWithPayment, x402Client, decodePaymentResponseHeader } from '@x402/fetch';
import { getAddress } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { USDC_EIP712 } from './lib/deploy-usdc.mjs';
import { BATCH_SETTLEMENT, placeBatchSettlement, readChannel, readReceiver } from './lib/batch-settlement.mjs';
import { listenShop } from './lib/interop.mjs';
import { TX_HASH } from './lib/expect.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = 1000n; // 0.001 USDC a request
const DEPOSIT = 30n * PRICE; // the deposit the shop asks for (minDeposit), well over every charge
const FUNDS = 1_000_000n;
// Requests each payer makes: the deposit's, then vouchers.
const REQUESTS = { first: 5, second: 3 };
const sha = (text) => createHash('sha256').update(text).digest('hex');

describe("the shop's own receiver authorizer: the manager signs, routerd relays", () => {
  merchantRun({ routerdAuthorizer: false });
});

describe("routerd's receiver authorizer: the shop sends no signatures, routerd signs", () => {
  merchantRun({ routerdAuthorizer: true });
});

/** One merchant's run: routerd with API keys, the shop, two payers and the shop's manager. */
function merchantRun({ routerdAuthorizer }) {
  const payTo = freshAccount().address;
  const shopKey = `key-shop-${'s'.repeat(24)}`;
  const openKey = `key-open-${'o'.repeat(24)}`; // a valid key, scoped to no receiver
  const routerdKey = generatePrivateKey();
  const shopAuthorizer = routerdAuthorizer ? undefined : freshAccount();
  const authorizerAddress = routerdAuthorizer ? privateKeyToAccount(routerdKey).address : shopAuthorizer.address;
  const calls = []; // {op, type, signed}: every call the shop's facilitator client made to routerd
  // The shop signs claims and refunds only as its own authorizer.
  const shopSigns = !routerdAuthorizer;
  const payers = {};
  let stack;
  let server;
  let shopUrl;
  let serverScheme;
  let manager;
  const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

  before(async () => {
    stack = await startFacilitatorStack({
      routerd: { x402Versions: [1, 2], allowHttpResource: true },
      beforeRouterd: (s) => routerdSetup(s, { routerdAuthorizer, routerdKey, payTo, shopKey, openKey }),
    });
    serverScheme = new BatchServer(payTo, shopAuthorizer ? { receiverAuthorizerSigner: shopAuthorizer } : {});
    const facilitator = recordingFacilitator(stack.url, shopKey, calls);
    const shop = await startShop(stack, facilitator, serverScheme, payTo);
    server = shop.server;
    shopUrl = shop.url;
    manager = new BatchSettlementChannelManager({
      scheme: serverScheme, facilitator, receiver: payTo, token: getAddress(stack.usdc), network: NETWORK,
    });
  });

  after(async () => {
    await new Promise((resolve) => (server ? server.close(resolve) : resolve()));
    await stack?.stop();
  });

  it(`the 402 names the ${routerdAuthorizer ? "receiver authorizer routerd's /supported advertises" : "shop's own authorizer"}`, async () => {
    const { body: supported } = await stack.request('/supported');
    const kind = supported.kinds.find((k) => k.scheme === 'batch-settlement');
    assert.deepEqual(kind.extra ?? {}, routerdAuthorizer ? { receiverAuthorizer: authorizerAddress } : {});
    const res = await fetch(`${shopUrl}/weather`);
    assert.equal(res.status, 402);
    const required = JSON.parse(Buffer.from(res.headers.get('payment-required'), 'base64').toString());
    assert.equal(required.accepts[0].extra.receiverAuthorizer, authorizerAddress);
    // routerd serves only callers with a key: every answer the shop gets below came with its key.
    for (const path of ['/verify', '/settle']) {
      assert.equal((await stack.post(path, {})).status, 401, `${path} without a key`);
    }
  });

  it('two payers deposit through routerd, then pay by voucher; the shop charged every request', async () => {
    for (const [name, requests] of Object.entries(REQUESTS)) {
      payers[name] = await payerPays(stack, shopUrl, serverScheme, requests);
    }
    for (const p of Object.values(payers)) {
      assert.equal(await stack.balanceOf(p.account.address), FUNDS - DEPOSIT);
      assert.equal((await readChannel(stack.client, p.channelId)).balance, DEPOSIT);
    }
    assert.deepEqual(calls, Object.keys(REQUESTS).flatMap(() => [
      { op: 'verify', type: 'deposit', signed: false }, { op: 'settle', type: 'deposit', signed: false },
    ]),
      'one deposit each through routerd; the vouchers asked routerd nothing');
  });

  it("the manager's claim lands both charges in one transaction; its sweep pays the receiver exactly the charged sum", async () => {
    const charged = Object.values(payers).reduce((sum, p) => sum + p.charged, 0n);
    const escrowBefore = await stack.balanceOf(BATCH_SETTLEMENT);
    const nonce = await stack.signerNonce('pending');
    calls.length = 0;
    const { claims, settle } = await manager.claimAndSettle();
    assert.equal(claims.length, 1, JSON.stringify(claims));
    assert.equal(claims[0].vouchers, 2);
    await assertRouterdSent(stack, claims[0].transaction);
    await assertRouterdSent(stack, settle.transaction);
    assert.equal(await stack.signerNonce('pending'), nonce + 2, 'two transactions: the claim and the sweep');
    assert.deepEqual(calls, [{ op: 'settle', type: 'claim', signed: shopSigns }, { op: 'settle', type: 'settle', signed: false }]);
    for (const p of Object.values(payers)) {
      assert.equal((await readChannel(stack.client, p.channelId)).totalClaimed, p.charged);
      assert.equal((await serverScheme.getStorage().get(p.channelId)).totalClaimed, String(p.charged), "the shop's record follows the claim");
    }
    assert.equal(await stack.balanceOf(payTo), charged, 'the receiver got exactly the charged sum');
    assert.equal(await stack.balanceOf(BATCH_SETTLEMENT), escrowBefore - charged);
    assert.deepEqual(await readReceiver(stack.client, payTo, getAddress(stack.usdc)), { totalClaimed: charged, totalSettled: charged });
    await assertNoGas(stack, payers);
  });

  if (routerdAuthorizer) {
    it('a refund sent with an API key not scoped to the receiver is refused and nothing moves', async () => {
      const p = payers.second;
      const openManager = new BatchSettlementChannelManager({
        scheme: serverScheme, facilitator: recordingFacilitator(stack.url, openKey, []), receiver: payTo,
        token: getAddress(stack.usdc), network: NETWORK,
      });
      const state = await readChannel(stack.client, p.channelId);
      const nonce = await stack.signerNonce('pending');
      await assert.rejects(openManager.refund([p.channelId]), /invalid_batch_settlement_evm_authorizer_not_configured/);
      assert.deepEqual(await readChannel(stack.client, p.channelId), state);
      assert.equal(await stack.signerNonce('pending'), nonce, 'nothing sent');
      assert.equal(await stack.balanceOf(p.account.address), FUNDS - DEPOSIT);
      assert.equal(await stack.balanceOf(payTo), payers.first.charged + payers.second.charged);
      assert.ok(await serverScheme.getStorage().get(p.channelId), 'the shop keeps the channel');
    });
  }

  it("the first payer's own refund, through the shop, gives it back exactly the unclaimed rest", async () => {
    const p = payers.first;
    const escrowBefore = await stack.balanceOf(BATCH_SETTLEMENT);
    calls.length = 0;
    const answer = await p.scheme.refund(`${shopUrl}/weather`);
    assert.equal(answer.success, true, JSON.stringify(answer));
    await assertRouterdSent(stack, answer.transaction);
    const rest = DEPOSIT - p.charged;
    assert.equal(await stack.balanceOf(p.account.address), FUNDS - p.charged, 'the payer got exactly the unclaimed rest');
    assert.equal(await stack.balanceOf(BATCH_SETTLEMENT), escrowBefore - rest);
    assert.equal(await stack.balanceOf(payTo), payers.first.charged + payers.second.charged, "the receiver's sum stays");
    const state = await readChannel(stack.client, p.channelId);
    assert.equal(state.refundNonce, 1n);
    assert.equal(state.balance - state.totalClaimed, 0n, 'nothing left to refund');
    assert.deepEqual(calls, [{ op: 'verify', type: 'refund', signed: false }, { op: 'settle', type: 'refund', signed: shopSigns }]);
    await assertNoGas(stack, payers);
  });

  it("the manager's refund of the second payer's channel gives it back exactly the unclaimed rest", async () => {
    const p = payers.second;
    const escrowBefore = await stack.balanceOf(BATCH_SETTLEMENT);
    calls.length = 0;
    const results = await manager.refund([p.channelId]);
    assert.equal(results.length, 1, JSON.stringify(results));
    await assertRouterdSent(stack, results[0].transaction);
    const rest = DEPOSIT - p.charged;
    assert.equal(await stack.balanceOf(p.account.address), FUNDS - p.charged, 'the payer got exactly the unclaimed rest');
    assert.equal(await stack.balanceOf(BATCH_SETTLEMENT), escrowBefore - rest);
    assert.equal(await stack.balanceOf(payTo), payers.first.charged + payers.second.charged, "the receiver's sum stays");
    assert.equal((await readChannel(stack.client, p.channelId)).refundNonce, 1n);
    assert.equal(await serverScheme.getStorage().get(p.channelId), undefined, 'the shop forgot the refunded channel');
    assert.deepEqual(calls, [{ op: 'settle', type: 'refund', signed: shopSigns }]);
    await assertNoGas(stack, payers);
  });
}

/**
 * routerd's extra config: batch-settlement on, the API keys file (the shop's key scoped to its payTo,
 * and a key scoped to nothing), and, when routerd is the authorizer, its key file.
 */
function routerdSetup(s, { routerdAuthorizer, routerdKey, payTo, shopKey, openKey }) {
  return placeBatchSettlement(s.client).then(() => {
    const keysFile = join(s.tmp.dir, 'api-keys.toml');
    writeFileSync(keysFile, `[keys.shop]\nsha256 = "${sha(shopKey)}"\npay_to = ["${payTo}"]\n\n[keys.open]\nsha256 = "${sha(openKey)}"\n`);
    let facilitator = 'batch_settlement = true\n';
    if (routerdAuthorizer) {
      const keyFile = join(s.tmp.dir, 'authorizer.key');
      writeFileSync(keyFile, `${routerdKey}\n`);
      facilitator += `receiver_authorizer_key_file = ${JSON.stringify(keyFile)}\n`;
    }
    return `${facilitator}[auth]\napi_keys_file = ${JSON.stringify(keysFile)}\n`;
  });
}

/**
 * @x402/core's HTTP facilitator client for routerd at `url`, sending `Bearer <token>` on every call
 * (its createAuthHeaders), recording each verify and settle as {op, type, signed} in `calls`
 * (`signed`: the payload carries a receiver authorizer's signature).
 */
function recordingFacilitator(url, token, calls) {
  const headers = { Authorization: `Bearer ${token}` };
  const client = new HTTPFacilitatorClient({
    url,
    createAuthHeaders: async () => ({ verify: headers, settle: headers, supported: headers }),
  });
  for (const op of ['verify', 'settle']) {
    const call = client[op].bind(client);
    client[op] = (paymentPayload, requirements) => {
      const { type, claimAuthorizerSignature, refundAuthorizerSignature } = paymentPayload.payload ?? {};
      calls.push({ op, type, signed: Boolean(claimAuthorizerSignature || refundAuthorizerSignature) });
      return call(paymentPayload, requirements);
    };
  }
  return client;
}

/** The @x402/express shop selling GET /weather for PRICE by batch-settlement through `facilitator`. */
async function startShop(stack, facilitator, serverScheme, payTo) {
  const resourceServer = new x402ResourceServer(facilitator).register(NETWORK, serverScheme);
  const app = express();
  app.use(paymentMiddleware({
    'GET /weather': {
      accepts: {
        scheme: 'batch-settlement',
        network: NETWORK,
        payTo,
        price: { amount: String(PRICE), asset: getAddress(stack.usdc), extra: { ...USDC_EIP712, minDeposit: String(DEPOSIT) } },
      },
      description: 'weather report',
      mimeType: 'application/json',
    },
  }, resourceServer));
  app.get('/weather', (req, res) => res.json({ report: 'sunny' }));
  return listenShop(app);
}

/**
 * A fresh payer (USDC, no ETH) pays `requests` requests with @x402/fetch: the first deposits, the
 * rest are vouchers. Returns {account, scheme, storage, channelId, charged}.
 */
async function payerPays(stack, shopUrl, serverScheme, requests) {
  const account = freshAccount();
  await stack.mint(account.address, FUNDS);
  const storage = new InMemoryClientChannelStorage();
  const scheme = new BatchClient(toClientEvmSigner(account, stack.client), { storage, depositPolicy: { depositMultiplier: 30 } });
  const client = new x402Client().register(NETWORK, scheme);
  client.setSpendControls({
    allowedAssets: [{ network: NETWORK, asset: getAddress(stack.usdc), maxAmountPerPayment: String(PRICE) }],
  });
  const pay = wrapFetchWithPayment(fetch, client);
  for (let i = 1; i <= requests; i += 1) {
    const res = await pay(`${shopUrl}/weather`);
    const text = await res.text();
    assert.equal(res.status, 200, text);
    const receipt = decodePaymentResponseHeader(res.headers.get('payment-response'));
    assert.equal(receipt.success, true, JSON.stringify(receipt));
    assert.equal(receipt.extra?.chargedAmount, String(PRICE), JSON.stringify(receipt));
    if (i === 1) await assertRouterdSent(stack, receipt.transaction);
    else assert.equal(receipt.transaction, '', `request ${i} sent no transaction`);
  }
  const channelId = (await serverScheme.getStorage().list()).find((c) => getAddress(c.channelConfig.payer) === account.address)?.channelId;
  assert.ok(channelId, 'the shop keeps a channel record for the payer');
  const charged = BigInt(requests) * PRICE;
  assert.equal((await serverScheme.getStorage().get(channelId)).chargedCumulativeAmount, String(charged));
  assert.equal((await getChannel(storage, channelId))?.chargedCumulativeAmount, String(charged));
  return { account, scheme, storage, channelId, charged };
}

/** `hash` is a successful transaction routerd's signer sent to the escrow. */
async function assertRouterdSent(stack, hash) {
  assert.match(hash, TX_HASH);
  const mined = await stack.receipt(hash);
  assert.equal(mined.status, 'success');
  assert.equal(getAddress(mined.from), getAddress(stack.signer), 'routerd sent it');
  assert.equal(getAddress(mined.to), BATCH_SETTLEMENT);
}

async function assertNoGas(stack, payers) {
  for (const p of Object.values(payers)) {
    assert.equal(await stack.client.getBalance({ address: p.account.address }), 0n, 'the payer holds no ETH');
  }
}
