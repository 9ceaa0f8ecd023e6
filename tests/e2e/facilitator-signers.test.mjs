// Several signer keys serve one network: a burst of settlements spreads over them (the key with
// the fewest settlements under way signs), each key keeps its own nonce sequence, all land.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { anvilAccount, anvilKey, freshAccount } from './lib/accounts.mjs';
import { expectSettled } from './lib/expect.mjs';

const SECOND_SIGNER = 7; // an anvil account no role uses
const COUNT = 12;
let stack;
const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { blockTime: 1 },
    fundedPayers: 3,
    payerFunds: 1000n * BigInt(COUNT),
    extraSignerKeys: [anvilKey(SECOND_SIGNER)],
  });
});

after(() => stack?.stop());

it(`${COUNT} concurrent settles are signed by both keys, and all land`, async () => {
  const second = anvilAccount(SECOND_SIGNER).address;
  const nonceOf = (address) => stack.client.getTransactionCount({ address });
  const before = [await nonceOf(stack.signer), await nonceOf(second)];
  const payee = freshAccount().address;
  const payments = [];
  for (let i = 0; i < COUNT; i += 1) {
    payments.push(await stack.pay({ account: stack.payers[i % stack.payers.length], payTo: payee }));
  }
  const answers = await Promise.all(payments.map((p) => stack.settle(p.body)));
  const hashes = answers.map((res, i) => expectSettled(res, { network: NETWORK, payer: payments[i].authorization.from }));
  assert.equal(new Set(hashes).size, COUNT);

  const senders = await Promise.all(hashes.map(async (hash) => (await stack.client.getTransaction({ hash })).from.toLowerCase()));
  assert.deepEqual([...new Set(senders)].sort(), [stack.signer.toLowerCase(), second.toLowerCase()].sort(), 'both keys signed');
  const after = [await nonceOf(stack.signer), await nonceOf(second)];
  assert.equal(after[0] - before[0] + (after[1] - before[1]), COUNT, 'one transaction per payment in all');
  assert.equal(await stack.balanceOf(payee), 1000n * BigInt(COUNT));
});
