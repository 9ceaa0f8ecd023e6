// routerd's channel mirror of x402's `batch-settlement` (spec/batch-settlement.md): the last state
// routerd read or caused per channel, in its store. A node that lags behind a claim routerd
// settled (it answers the channel's read with the state from before the claim, as a node behind
// the chain or rolled back does) must not make verify accept a voucher at or below the claimed
// amount; a voucher above it is still accepted, and its answer carries the claimed total.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import { getAddress } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { toClientEvmSigner } from '@x402/evm';
import { BatchSettlementEvmScheme as BatchClient } from '@x402/evm/batch-settlement/client';
import { startFacilitatorStack, throughProxy, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { mintUsdc, USDC_EIP712 } from './lib/deploy-usdc.mjs';
import { placeBatchSettlement, readChannel } from './lib/batch-settlement.mjs';
import { startRefusingProxy } from './lib/hostile.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = 1000n;
const FUNDS = 1_000_000n;
const authorizerKey = generatePrivateKey();
const authorizer = privateKeyToAccount(authorizerKey);
const merchant = { receiver: freshAccount().address, token: `key-m-${'x'.repeat(24)}` };
const sha = (text) => createHash('sha256').update(text).digest('hex');
const bearer = { authorization: `Bearer ${merchant.token}` };

/**
 * The lagging node: every `eth_call` that reads a watched channel is answered by the node and
 * its answer remembered, until `lagging`; from then on each such call is answered what the node
 * last answered it before (`staleAnswers` counts them).
 */
const node = { watched: null, lagging: false, remembered: new Map(), staleAnswers: 0 };
function lag(call, answer) {
  const data = call.method === 'eth_call' ? String(call.params?.[0]?.data ?? '').toLowerCase() : '';
  if (!node.watched || !data.includes(node.watched) || answer?.result === undefined) return answer;
  if (!node.lagging) {
    node.remembered.set(data, answer.result);
    return answer;
  }
  if (!node.remembered.has(data)) return answer;
  node.staleAnswers += 1;
  return { ...answer, result: node.remembered.get(data) };
}

let stack;
let proxy;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  proxy = await startRefusingProxy({ rewrite: lag });
  stack = await startFacilitatorStack({
    routerd: { x402Versions: [1, 2], allowHttpResource: true },
    rpcUrlFor: throughProxy(proxy),
    beforeRouterd: async (s) => {
      await placeBatchSettlement(s.client);
      const keyFile = join(s.tmp.dir, 'authorizer.key');
      writeFileSync(keyFile, `${authorizerKey}\n`);
      const keysFile = join(s.tmp.dir, 'api-keys.toml');
      writeFileSync(keysFile, `[keys.m]\nsha256 = "${sha(merchant.token)}"\npay_to = ["${merchant.receiver}"]\n`);
      return `batch_settlement = true\nreceiver_authorizer_key_file = ${JSON.stringify(keyFile)}\n`
        + `[auth]\napi_keys_file = ${JSON.stringify(keysFile)}\n`;
    },
  });
});

after(async () => {
  await stack?.stop();
  await proxy?.close();
});

const requirements = () => ({
  scheme: 'batch-settlement', network: NETWORK, amount: String(PRICE), asset: getAddress(stack.usdc), payTo: merchant.receiver,
  maxTimeoutSeconds: 3600,
  extra: { receiverAuthorizer: authorizer.address, withdrawDelay: 900, ...USDC_EIP712 },
});
const managerRequirements = () => ({
  scheme: 'batch-settlement', network: NETWORK, asset: getAddress(stack.usdc), amount: '0', payTo: merchant.receiver, maxTimeoutSeconds: 0, extra: {},
});
const body = (payload, reqs) => ({ x402Version: 2, paymentPayload: { x402Version: 2, accepted: reqs, payload }, paymentRequirements: structuredClone(reqs) });

it('a node answering the state from before a claim routerd settled does not pass a voucher at the claimed amount', async () => {
  const account = freshAccount();
  await mintUsdc(stack.client, stack.usdc, account.address, FUNDS);
  const client = new BatchClient(toClientEvmSigner(account, stack.client));
  const reqs = requirements();
  // A deposit, then two paid requests: the channel's reads before the claim are remembered.
  let last;
  for (let i = 0; i < 3; i += 1) {
    const { payload } = await client.createPaymentPayload(2, reqs);
    node.watched ??= payload.voucher.channelId.slice(2).toLowerCase();
    const path = payload.type === 'deposit' ? '/settle' : '/verify';
    const answer = await stack.post(path, body(payload, reqs), { headers: bearer });
    assert.equal(answer.body.success ?? answer.body.isValid, true, answer.text);
    await client.schemeHooks.onPaymentResponse({
      settleResponse: { success: true, extra: { chargedAmount: String(PRICE) } }, paymentPayload: { x402Version: 2, accepted: reqs, payload }, requirements: reqs,
    });
    last = payload;
  }
  assert.ok(node.remembered.size > 0, 'the channel was read through the node');
  const claimed = BigInt(last.voucher.maxClaimableAmount);
  assert.equal(claimed, 3n * PRICE);
  const row = {
    voucher: { channel: last.channelConfig, maxClaimableAmount: last.voucher.maxClaimableAmount },
    signature: last.voucher.signature,
    totalClaimed: last.voucher.maxClaimableAmount,
  };
  const claim = await stack.post('/settle', body({ type: 'claim', claims: [row] }, managerRequirements()), { headers: bearer });
  assert.equal(claim.body.success, true, claim.text);
  assert.equal((await readChannel(stack.client, last.voucher.channelId)).totalClaimed, claimed);

  // The node now lags: it answers the channel's read with the state before the claim.
  node.lagging = true;
  const replayed = await stack.post('/verify', body(last, reqs), { headers: bearer });
  assert.ok(node.staleAnswers > 0, 'routerd read the channel from the lagging node');
  assert.equal(replayed.body.isValid, false, replayed.text);
  assert.equal(replayed.body.invalidReason, 'invalid_batch_settlement_evm_cumulative_below_claimed', replayed.text);

  // A voucher above the claim is accepted, and its snapshot says what routerd claimed.
  const { payload: next } = await client.createPaymentPayload(2, reqs);
  assert.equal(BigInt(next.voucher.maxClaimableAmount), claimed + PRICE);
  const stale = node.staleAnswers;
  const verified = await stack.post('/verify', body(next, reqs), { headers: bearer });
  assert.ok(node.staleAnswers > stale, 'the lagging node answered again');
  assert.equal(verified.body.isValid, true, verified.text);
  assert.equal(verified.body.extra.totalClaimed, String(claimed), verified.text);
});
