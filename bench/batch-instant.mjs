#!/usr/bin/env node
// A measuring instrument of the batch phase's burst (bench/batch-burst.mjs), not a facilitator: it
// answers the shop's /supported, /verify and /settle at once, without a chain and without checking
// any signature, with as much as the official batch-settlement server needs to accept the answer:
// - GET /supported: the scheme on NETWORK, x402 version 2;
// - POST /verify: isValid, the payer, and the channel's snapshot (its balance the deposits the
//   payloads carried, nothing claimed, no withdrawal, refund nonce 0);
// - POST /settle: success, a made-up transaction hash, and the same snapshot under `channelState`
//   (what the official server records as the channel's on-chain state).
// In a process of its own, so that the load generator's event loop does not delay its answers.
//
//   node bench/batch-instant.mjs NETWORK
//
// Prints the port it listens on (127.0.0.1), then serves until it is killed. Any other request is
// answered 404; a body that is not a payment 400.
import { createHash } from 'node:crypto';
import { createServer } from 'node:http';

const [network] = process.argv.slice(2);
if (!network) throw new Error('usage: batch-instant.mjs NETWORK');

const balances = new Map(); // channelId -> deposited, from the settled deposits' payloads
const snapshot = (payload) => {
  const channelId = payload.voucher.channelId;
  const deposited = payload.deposit ? BigInt(payload.deposit.amount) : 0n;
  const balance = (balances.get(channelId) ?? 0n) + deposited;
  return { channelId, balance: String(balance), totalClaimed: '0', withdrawRequestedAt: 0, refundNonce: '0' };
};

const answers = {
  'GET /supported': () => ({ kinds: [{ x402Version: 2, scheme: 'batch-settlement', network }], extensions: [], signers: {} }),
  'POST /verify': ({ paymentPayload: { payload } }) => ({ isValid: true, payer: payload.channelConfig.payer, extra: snapshot(payload) }),
  'POST /settle': ({ paymentPayload: { payload } }) => {
    const state = snapshot(payload);
    if (payload.deposit) balances.set(state.channelId, BigInt(state.balance));
    return {
      success: true, payer: payload.channelConfig.payer, network, amount: payload.deposit?.amount ?? '',
      transaction: `0x${createHash('sha256').update(`${state.channelId}:${state.balance}`).digest('hex')}`,
      extra: { channelState: state },
    };
  },
};

const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    const answer = answers[`${req.method} ${req.url}`];
    let status = answer ? 200 : 404;
    let body = { error: 'only GET /supported, POST /verify, POST /settle' };
    if (answer) {
      try {
        body = answer(chunks.length ? JSON.parse(Buffer.concat(chunks).toString('utf8')) : {});
      } catch (err) {
        status = 400;
        body = { error: `not a payment: ${err.message}` };
      }
    }
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
  });
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => console.log(server.address().port));
