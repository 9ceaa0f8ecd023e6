#!/usr/bin/env node
// The resource server of the batch phase's burst (bench/batch-burst.mjs): an @x402/express shop
// with the official @x402/evm 2.27.0 batch-settlement server scheme, as a merchant runs it, with
// its own receiver authorizer key, in a process of its own so that it does not share the load
// generator's event loop. Its facilitator is reached through @x402/core's HTTP facilitator client
// (with the merchant's API key when one is given).
//
//   BENCH_AUTHORIZER_KEY=0x.. [BENCH_API_KEY=..] node bench/batch-shop.mjs FACILITATOR_URL NETWORK ASSET PAY_TO PRICE MIN_DEPOSIT
//
// Prints the port it listens on (127.0.0.1), then serves until it is killed:
// - GET /weather: paid, one PRICE of ASSET a request (the asset's EIP-712 domain is USDC's);
// - GET /stats: what the shop asked its facilitator, {verify: {deposit: n, ...}, settle: {...}}.
import express from 'express';
import { getAddress } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { paymentMiddleware, x402ResourceServer } from '@x402/express';
import { HTTPFacilitatorClient } from '@x402/core/server';
import { BatchSettlementEvmScheme } from '@x402/evm/batch-settlement/server';
import { USDC_EIP712 } from '../tests/e2e/lib/deploy-usdc.mjs';

const [facilitatorUrl, network, asset, payTo, price, minDeposit] = process.argv.slice(2);
if (!minDeposit) throw new Error('usage: batch-shop.mjs FACILITATOR_URL NETWORK ASSET PAY_TO PRICE MIN_DEPOSIT');

const stats = { verify: {}, settle: {} };
const count = (op, payload) => {
  const type = payload.payload?.type ?? 'unknown';
  stats[op][type] = (stats[op][type] ?? 0) + 1;
};

/** @x402/core's facilitator client, counting what the shop asks (the vouchers should ask nothing). */
class CountingFacilitator extends HTTPFacilitatorClient {
  async verify(paymentPayload, requirements) {
    count('verify', paymentPayload);
    return super.verify(paymentPayload, requirements);
  }

  async settle(paymentPayload, requirements) {
    count('settle', paymentPayload);
    return super.settle(paymentPayload, requirements);
  }
}

const apiKey = process.env.BENCH_API_KEY;
const auth = apiKey && { Authorization: `Bearer ${apiKey}` };
const facilitator = new CountingFacilitator({
  url: facilitatorUrl,
  ...(auth && { createAuthHeaders: async () => ({ verify: auth, settle: auth, supported: auth }) }),
});
const scheme = new BatchSettlementEvmScheme(getAddress(payTo), {
  receiverAuthorizerSigner: privateKeyToAccount(process.env.BENCH_AUTHORIZER_KEY),
});
const resourceServer = new x402ResourceServer(facilitator).register(network, scheme);

const app = express();
app.get('/stats', (req, res) => res.json(stats));
app.use(paymentMiddleware({
  'GET /weather': {
    accepts: {
      scheme: 'batch-settlement',
      network,
      payTo: getAddress(payTo),
      price: { amount: price, asset: getAddress(asset), extra: { ...USDC_EIP712, minDeposit } },
    },
    description: 'weather report',
    mimeType: 'application/json',
  },
}, resourceServer));
app.get('/weather', (req, res) => res.json({ report: 'sunny' }));
const server = app.listen(0, '127.0.0.1', () => console.log(server.address().port));
server.keepAliveTimeout = 60_000;
