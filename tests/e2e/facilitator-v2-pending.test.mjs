// x402 v2's settlement_pending: on a chain that mines only when told, a v2 settle whose outcome is
// still unknown at facilitator.settle_timeout_secs answers 200 {success: false, errorReason:
// "settlement_pending", transaction: <the broadcast hash>} (v1 keeps its 400 {error: 504}). The
// first request, asked again with its Idempotency-Key and body, gets the same pending answer and,
// once mined, its success with that transaction. Any other settle of the payment, in either
// version, is told that transaction as a failure in its own version's names: "already being
// settled by" while its own wait ends first, "already settled by" after (spec/access.md section 1).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFacilitatorStack, withLogTail, NETWORK, CHAIN_ID } from './lib/stack.mjs';
import { expectSettled, expectSettleFailed, expectDuplicate } from './lib/expect.mjs';
import { waitInPool, isPending, hashInMessage } from './lib/settling.mjs';
import { idempotencyKey } from './lib/util.mjs';

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

it('a v2 settle still unmined at the deadline answers settlement_pending with the hash; retried with its key, once mined, success with the same transaction', async () => {
  const payer = stack.payers[0];
  const p = await stack.payV2({ account: payer });
  const nonce = await stack.signerNonce('pending');
  const key = idempotencyKey();
  const v1Of = { network: NETWORK, payer: payer.address, version: 1 };
  const v2Of = { network: CAIP2, payer: payer.address, version: 2 };

  const res = await stack.settle(p.v2, { key });
  const tx = await waitInPool(stack, p);
  expectSettleFailed(res, 'settlement_pending', { network: CAIP2, payer: payer.address, transaction: tx.hash });
  // The first request retried while still unmined: the same pending answer.
  expectSettleFailed(await stack.settle(p.v2, { key }), 'settlement_pending', { network: CAIP2, payer: payer.address, transaction: tx.hash });

  // Other settles of the payment, in either version, are told the transaction they waited for.
  expectDuplicate(await stack.settle(p.body), { ...v1Of, transaction: tx.hash, being: true });
  expectDuplicate(await stack.settle(p.v2), { ...v2Of, transaction: tx.hash, being: true });

  await stack.anvil.mine();
  assert.equal(expectSettled(await stack.settle(p.v2, { key }), { network: CAIP2, payer: payer.address }), tx.hash);
  expectDuplicate(await stack.settle(p.v2), { ...v2Of, transaction: tx.hash });
  expectDuplicate(await stack.settle(p.body), { ...v1Of, transaction: tx.hash });
  assert.equal(await stack.signerNonce('pending'), nonce + 1, 'one transaction');
});

it('a v1 settlement still pending: its v2 replay is told the transaction in v2 names; the v1 request retried with its key succeeds', async () => {
  const payer = stack.payers[1];
  const p = await stack.payV2({ account: payer });
  const nonce = await stack.signerNonce('pending');
  const key = idempotencyKey();
  const v1 = await stack.settle(p.body, { key });
  assert.ok(isPending(v1), `v1 pending answer: HTTP ${v1.status} ${v1.text}`);
  const tx = await waitInPool(stack, p);
  assert.equal(hashInMessage(v1.body.message), tx.hash);
  const again = await stack.settle(p.body, { key });
  assert.ok(isPending(again), `the v1 request retried while unmined: HTTP ${again.status} ${again.text}`);
  expectDuplicate(await stack.settle(p.v2), { network: CAIP2, payer: payer.address, version: 2, transaction: tx.hash, being: true });
  await stack.anvil.mine();
  assert.equal(expectSettled(await stack.settle(p.body, { key }), { network: NETWORK, payer: payer.address }), tx.hash);
  expectDuplicate(await stack.settle(p.v2), { network: CAIP2, payer: payer.address, version: 2, transaction: tx.hash });
  assert.equal(await stack.signerNonce('pending'), nonce + 1, 'one transaction');
});
