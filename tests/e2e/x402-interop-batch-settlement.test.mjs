// Interop of x402's `batch-settlement` scheme with the official v2 packages, unchanged: an
// @x402/express resource server with @x402/evm's batch-settlement server scheme uses routerd
// (x402_versions = [1, 2], batch_settlement = true, allow_http_resource = true) as its facilitator
// through @x402/core's HTTP facilitator client, and @x402/fetch pays it with @x402/evm's
// batch-settlement client scheme on the anvil chain eip155:84532, with routerd's escrow and deposit
// collectors at the canonical addresses (lib/batch-settlement.mjs) and Circle's USDC.
// The server signs as its own receiver authorizer (a test key): routerd holds none here.
// - the first request deposits once through routerd: the escrow holds exactly the deposit, the
//   payer (who has no ETH at all) pays no gas, one transaction from routerd's signer;
// - twenty more requests are paid by voucher and delivered with no transaction each: no block, no
//   signer transaction, the escrow's balance and the payer's USDC unchanged;
// - the server's channel record charged exactly 21 prices, and every paid answer carries the
//   PAYMENT-RESPONSE header the client reads (its own channel record follows it, price by price).
// The official channel manager's claim, sweep and refund through routerd, behind API keys, are in
// x402-interop-batch-settlement-manager.test.mjs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import express from 'express';
import { paymentMiddleware, x402ResourceServer } from '@x402/express';
import { HTTPFacilitatorClient } from '@x402/core/server';
import { toClientEvmSigner } from '@x402/evm';
import { BatchSettlementEvmScheme as BatchServer } from '@x402/evm/batch-settlement/server';
import {
  BatchSettlementEvmScheme as BatchClient, InMemoryClientChannelStorage, getChannel,
} from '@x402/evm/batch-settlement/client';
import { wrapFetchWithPayment, x402Client, decodePaymentResponseHeader } from '@x402/fetch';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { anvilAccount, freshAccount, ROLE } from './lib/accounts.mjs';
import { USDC_EIP712 } from './lib/deploy-usdc.mjs';
import { BATCH_SETTLEMENT, placeBatchSettlement, readChannel } from './lib/batch-settlement.mjs';
import { listenShop } from './lib/interop.mjs';
import { TX_HASH } from './lib/expect.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = 1000n; // 0.001 USDC a request
const VOUCHERS = 20; // requests after the deposit's
// One deposit covers the deposit's request and every voucher after it, with room to spare.
const DEPOSIT = 30n * PRICE;
const FUNDS = 1_000_000n;
const payTo = anvilAccount(ROLE.payee).address;
const authorizer = freshAccount(); // the server's own receiver authorizer

let stack;
let server;
let shopUrl;
let serverScheme;
const facilitatorCalls = []; // {op, type}: every call the shop made to routerd
const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    routerd: { x402Versions: [1, 2], allowHttpResource: true, extra: 'batch_settlement = true\n' },
    beforeRouterd: (s) => placeBatchSettlement(s.client),
  });
  shopUrl = await startShop();
});

after(async () => {
  await new Promise((resolve) => (server ? server.close(resolve) : resolve()));
  await stack?.stop();
});

/** @x402/core's facilitator client, recording what the shop asks routerd. */
class RecordingFacilitator extends HTTPFacilitatorClient {
  async verify(paymentPayload, requirements) {
    facilitatorCalls.push({ op: 'verify', type: paymentPayload.payload?.type });
    return super.verify(paymentPayload, requirements);
  }

  async settle(paymentPayload, requirements) {
    facilitatorCalls.push({ op: 'settle', type: paymentPayload.payload?.type });
    return super.settle(paymentPayload, requirements);
  }
}

/**
 * The resource server. The `price: {amount, asset, extra}` form names the USDC deployed on anvil
 * and its EIP-712 domain; `minDeposit` asks for a deposit that covers every request of this file.
 */
async function startShop() {
  serverScheme = new BatchServer(payTo, { receiverAuthorizerSigner: authorizer });
  const facilitator = new RecordingFacilitator({ url: stack.url });
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
  const shop = await listenShop(app);
  server = shop.server;
  return shop.url;
}

/**
 * @x402/fetch with @x402/evm's batch-settlement client scheme for `account` (viem local account),
 * its channel records in `storage`. The anvil USDC is allowed, capped at the price a request; the
 * deposit may be up to 30 prices (the scheme's deposit multiplier over that cap).
 */
function payingFetch(account, storage) {
  const scheme = new BatchClient(toClientEvmSigner(account, stack.client), { storage, depositPolicy: { depositMultiplier: 30 } });
  const client = new x402Client().register(NETWORK, scheme);
  client.setSpendControls({
    allowedAssets: [{ network: NETWORK, asset: getAddress(stack.usdc), maxAmountPerPayment: String(PRICE) }],
  });
  return wrapFetchWithPayment(fetch, client);
}

/** The shop's answer to a paid request: 200 with the report, and its decoded PAYMENT-RESPONSE. */
async function delivered(res) {
  const text = await res.text();
  assert.equal(res.status, 200, text);
  assert.deepEqual(JSON.parse(text), { report: 'sunny' });
  const header = res.headers.get('payment-response');
  assert.ok(header, 'the paid answer carries PAYMENT-RESPONSE');
  const receipt = decodePaymentResponseHeader(header);
  assert.equal(receipt.success, true, JSON.stringify(receipt));
  assert.equal(receipt.network, NETWORK, JSON.stringify(receipt));
  assert.equal(receipt.extra?.chargedAmount, String(PRICE), `charged one price: ${JSON.stringify(receipt)}`);
  return receipt;
}

/** Transactions in the blocks after `from` up to the head. */
async function transactionsSince(from) {
  const head = await stack.client.getBlockNumber();
  let count = 0;
  for (let n = from + 1n; n <= head; n += 1n) {
    count += (await stack.client.getBlock({ blockNumber: n })).transactions.length;
  }
  return count;
}

it("@x402/core's facilitator client reads batch-settlement in routerd's /supported", async () => {
  const supported = await new HTTPFacilitatorClient({ url: stack.url }).getSupported();
  const kinds = supported.kinds.filter((k) => k.scheme === 'batch-settlement');
  assert.deepEqual(kinds.map(({ x402Version, scheme, network }) => ({ x402Version, scheme, network })),
    [{ x402Version: 2, scheme: 'batch-settlement', network: NETWORK }]);
});

it('an unpaid request gets 402 with batch-settlement requirements naming the server\'s authorizer', async () => {
  const res = await fetch(`${shopUrl}/weather`);
  assert.equal(res.status, 402);
  const required = JSON.parse(Buffer.from(res.headers.get('payment-required'), 'base64').toString());
  assert.equal(required.x402Version, 2);
  const [accept] = required.accepts;
  assert.equal(accept.scheme, 'batch-settlement');
  assert.equal(accept.amount, String(PRICE));
  assert.equal(getAddress(accept.asset), getAddress(stack.usdc));
  assert.equal(accept.extra.receiverAuthorizer, authorizer.address);
  assert.equal(accept.extra.minDeposit, String(DEPOSIT));
});

it('@x402/fetch deposits once through routerd, then pays twenty requests by voucher with no transaction; the shop charged 21 prices', async () => {
  const payer = freshAccount();
  await stack.mint(payer.address, FUNDS);
  assert.equal(await stack.client.getBalance({ address: payer.address }), 0n, 'the payer holds no ETH');
  const storage = new InMemoryClientChannelStorage();
  const pay = payingFetch(payer, storage);
  const escrowBefore = await stack.balanceOf(BATCH_SETTLEMENT);
  const signerNonce = await stack.signerNonce('pending');
  facilitatorCalls.length = 0;

  // The first request: a deposit, settled by routerd.
  const first = await delivered(await pay(`${shopUrl}/weather`));
  assert.match(first.transaction, TX_HASH, JSON.stringify(first));
  assert.equal(getAddress(first.payer), payer.address);
  const mined = await stack.receipt(first.transaction);
  assert.equal(mined.status, 'success');
  assert.equal(getAddress(mined.from), getAddress(stack.signer), 'routerd sent the deposit');
  assert.equal(getAddress(mined.to), BATCH_SETTLEMENT);
  assert.equal(await stack.signerNonce('pending'), signerNonce + 1, 'one transaction');
  assert.equal(await stack.balanceOf(BATCH_SETTLEMENT), escrowBefore + DEPOSIT, 'the escrow holds exactly the deposit');
  assert.equal(await stack.balanceOf(payer.address), FUNDS - DEPOSIT);
  assert.equal(await stack.client.getBalance({ address: payer.address }), 0n, 'the payer paid no gas');
  assert.deepEqual(facilitatorCalls, [{ op: 'verify', type: 'deposit' }, { op: 'settle', type: 'deposit' }]);

  const channelId = (await serverScheme.getStorage().list()).find((c) => getAddress(c.channelConfig.payer) === payer.address)?.channelId;
  assert.ok(channelId, 'the shop keeps a channel record for the payer');
  assert.equal((await readChannel(stack.client, channelId)).balance, DEPOSIT);
  assert.equal((await getChannel(storage, channelId))?.chargedCumulativeAmount, String(PRICE), 'the client read the deposit\'s PAYMENT-RESPONSE');

  // Twenty more: vouchers, no transaction.
  const block = await stack.client.getBlockNumber();
  for (let i = 2; i <= VOUCHERS + 1; i += 1) {
    const receipt = await delivered(await pay(`${shopUrl}/weather`));
    assert.equal(receipt.transaction, '', `request ${i} sent no transaction: ${JSON.stringify(receipt)}`);
    assert.equal(receipt.extra?.channelState?.chargedCumulativeAmount, String(BigInt(i) * PRICE), JSON.stringify(receipt));
    assert.equal((await getChannel(storage, channelId))?.chargedCumulativeAmount, String(BigInt(i) * PRICE),
      `the client read request ${i}'s PAYMENT-RESPONSE`);
  }
  assert.equal(await transactionsSince(block), 0, 'no transaction for the vouchers');
  assert.equal(await stack.client.getBlockNumber(), block, 'no block mined');
  assert.equal(await stack.signerNonce('pending'), signerNonce + 1);
  assert.equal(await stack.balanceOf(BATCH_SETTLEMENT), escrowBefore + DEPOSIT, 'the escrow\'s balance stays');
  assert.equal(await stack.balanceOf(payer.address), FUNDS - DEPOSIT);
  assert.deepEqual(await readChannel(stack.client, channelId), {
    balance: DEPOSIT, totalClaimed: 0n, withdrawRequestedAt: 0, withdrawAmount: 0n, refundNonce: 0n,
  });
  // The shop verifies vouchers itself against the channel state routerd's deposit answer gave it.
  assert.deepEqual(facilitatorCalls, [{ op: 'verify', type: 'deposit' }, { op: 'settle', type: 'deposit' }], 'the vouchers asked routerd nothing');

  const record = await serverScheme.getStorage().get(channelId);
  assert.equal(record.chargedCumulativeAmount, String(BigInt(VOUCHERS + 1) * PRICE), 'the shop charged exactly 21 prices');
  assert.equal(record.signedMaxClaimable, String(BigInt(VOUCHERS + 1) * PRICE));
  assert.equal(record.balance, String(DEPOSIT));
  assert.equal(record.totalClaimed, '0');
});
