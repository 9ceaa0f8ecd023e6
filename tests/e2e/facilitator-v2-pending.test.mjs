// x402 v2's settlement_pending: on a chain that mines only when told, a v2 settle whose outcome is
// still unknown at facilitator.settle_timeout_secs answers 200 {success: false, errorReason:
// "settlement_pending", transaction: <the broadcast hash>} (v1 keeps its 400 {error: 504}); asked
// again once mined, either version answers that same transaction.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFacilitatorStack, withLogTail, NETWORK, CHAIN_ID } from './lib/stack.mjs';
import { expectSettled, expectSettleFailed } from './lib/expect.mjs';
import { waitInPool, isPending, hashInMessage } from './lib/settling.mjs';

const CAIP2 = `eip155:${CHAIN_ID}`;

let stack;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { noMining: true },
    fundedPayers: 2,
    routerd: { x402Versions: [1, 2], settleTimeoutSecs: 2 },
  });
});

after(() => stack?.stop());

it('a v2 settle still unmined at the deadline answers settlement_pending with the hash; once mined, the same transaction', async () => {
  const payer = stack.payers[0];
  const p = await stack.payV2({ account: payer });
  const nonce = await stack.signerNonce('pending');

  const res = await stack.settle(p.v2);
  const tx = await waitInPool(stack, p);
  expectSettleFailed(res, 'settlement_pending', { network: CAIP2, payer: payer.address, transaction: tx.hash });

  // v1 answers its own pending shape for the same payment, naming the same hash.
  const v1 = await stack.settle(p.body);
  assert.ok(isPending(v1), `v1 pending answer: HTTP ${v1.status} ${v1.text}`);
  assert.equal(hashInMessage(v1.body.message), tx.hash);

  await stack.anvil.mine();
  assert.equal(expectSettled(await stack.settle(p.v2), { network: CAIP2, payer: payer.address }), tx.hash);
  assert.equal(expectSettled(await stack.settle(p.body), { network: NETWORK, payer: payer.address }), tx.hash);
  assert.equal(await stack.signerNonce('pending'), nonce + 1, 'one transaction');
});

it('a v1 settlement still pending is answered settlement_pending to its v2 replay', async () => {
  const payer = stack.payers[1];
  const p = await stack.payV2({ account: payer });
  const v1 = await stack.settle(p.body);
  assert.ok(isPending(v1), `v1 pending answer: HTTP ${v1.status} ${v1.text}`);
  const tx = await waitInPool(stack, p);
  expectSettleFailed(await stack.settle(p.v2), 'settlement_pending', { network: CAIP2, payer: payer.address, transaction: tx.hash });
  await stack.anvil.mine();
  assert.equal(expectSettled(await stack.settle(p.v2), { network: CAIP2, payer: payer.address }), tx.hash);
});
