// Many settlements in flight at once on a chain with real block cadence (anvil --block-time 1):
// signer nonces are allocated so that all of them land, one transaction each.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { expectSettled } from './lib/expect.mjs';

const COUNT = 50;
const PRICE = 1000n;
const PAYERS = 5; // several payers, several payments each: distinct (from, nonce) keys

let stack;
const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { blockTime: 1 },
    fundedPayers: PAYERS,
    payerFunds: PRICE * BigInt(COUNT),
  });
});

after(() => stack?.stop());

it(`${COUNT} concurrent settles of distinct payments all land, one transaction each`, async () => {
  const payee = freshAccount().address;
  const payments = [];
  for (let i = 0; i < COUNT; i += 1) {
    payments.push(await stack.pay({ account: stack.payers[i % PAYERS], payTo: payee, amount: PRICE }));
  }
  const nonce = await stack.signerNonce();
  const payerBefore = await Promise.all(stack.payers.map((p) => stack.balanceOf(p.address)));

  const answers = await Promise.all(payments.map((p) => stack.settle(p.body)));

  const hashes = answers.map((res, i) => expectSettled(res, { network: NETWORK, payer: payments[i].authorization.from }));
  assert.equal(new Set(hashes).size, COUNT, 'one distinct transaction per payment');
  const receipts = await Promise.all(hashes.map((hash) => stack.receipt(hash)));
  for (const r of receipts) {
    assert.equal(r.status, 'success', r.transactionHash);
    assert.equal(getAddress(r.to), getAddress(stack.usdc));
  }
  assert.equal(await stack.balanceOf(payee), PRICE * BigInt(COUNT));
  const perPayer = PRICE * BigInt(COUNT / PAYERS);
  for (const [i, p] of stack.payers.entries()) {
    assert.equal(await stack.balanceOf(p.address), payerBefore[i] - perPayer, `payer ${i}`);
  }
  assert.equal(await stack.signerNonce(), nonce + COUNT);
  assert.equal(await stack.signerNonce('pending'), nonce + COUNT, 'no stray transactions left pending');
});
