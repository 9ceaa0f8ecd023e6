#!/usr/bin/env node
// The reference for the batch phase (bench/batch.mjs): the official @x402/evm 2.27.0
// batch-settlement facilitator scheme, registered with @x402/core's x402Facilitator as the
// official facilitator serves it, behind the least HTTP server that answers POST /verify
// (node:http, one process of its own so that it does not share the load generator's event loop).
// Its viem client reads the chain over HTTP, as the official examples set it up.
//
//   BENCH_SIGNER_KEY=0x.. BENCH_AUTHORIZER_KEY=0x.. node bench/batch-reference.mjs RPC_URL NETWORK
//
// Prints the port it listens on (127.0.0.1), then serves until it is killed. A request that is not
// POST /verify is answered 404; a body that is not JSON 400.
import { createServer } from 'node:http';
import { privateKeyToAccount } from 'viem/accounts';
import { x402Facilitator } from '@x402/core/facilitator';
import { toFacilitatorEvmSigner } from '@x402/evm';
import { BatchSettlementEvmScheme } from '@x402/evm/batch-settlement/facilitator';
import { walletFor } from '../tests/e2e/lib/deploy-usdc.mjs';

const [rpcUrl, network] = process.argv.slice(2);
if (!rpcUrl || !network) throw new Error('usage: batch-reference.mjs RPC_URL NETWORK');
const signer = await walletFor(rpcUrl, process.env.BENCH_SIGNER_KEY);
const authorizer = privateKeyToAccount(process.env.BENCH_AUTHORIZER_KEY);
const facilitator = new x402Facilitator().register(
  network,
  new BatchSettlementEvmScheme(toFacilitatorEvmSigner({ ...signer, address: signer.account.address }), authorizer),
);

const answer = (res, status, body) => {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
};

const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', async () => {
    if (req.method !== 'POST' || req.url !== '/verify') {
      answer(res, 404, { error: 'only POST /verify' });
      return;
    }
    let body;
    try {
      body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    } catch {
      answer(res, 400, { error: 'the body is not JSON' });
      return;
    }
    try {
      answer(res, 200, await facilitator.verify(body.paymentPayload, body.paymentRequirements));
    } catch (err) {
      answer(res, 500, { error: err.message });
    }
  });
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => console.log(server.address().port));
