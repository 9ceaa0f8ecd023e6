// Exposure per payer (spec/access.md section 2): the values of a payer's settlements still under
// way on one (network, asset), plus the new payment, may not exceed the payer's token balance read
// in the settle's own chain request; the rest answer HTTP 200 {success: false, errorReason:
// "insufficient_funds", transaction: ""} and nothing is sent.
//
// The chain mines only when told (--no-mining), so every settlement of a burst is in flight at
// once and the payer's balance on chain still covers each payment on its own when the refusals are
// answered: only the payments under way can have refused them. Without the rule, each of the
// payments would be sent (the balance read covers it) and all but the affordable ones would revert
// on chain at the operator's expense.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { waitFor } from './lib/util.mjs';
import { expectSettled, expectSettleFailed } from './lib/expect.mjs';
import { chainMark, expectCleanSignerHistory, expectTransfersAuthorization, pooledFrom } from './lib/chain-audit.mjs';
import { mining } from './lib/settling.mjs';

const PRICE = 1000n;
const BURST = 8;

let stack;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({ anvil: { noMining: true }, routerd: { settleTimeoutSecs: 30 } });
});

after(() => stack?.stop());

/** Mint on the --no-mining chain: automine on for the mint, then off again. */
async function fund(address, amount) {
  await stack.anvil.setAutomine(true);
  try {
    await stack.mint(address, amount);
  } finally {
    await stack.anvil.setAutomine(false);
  }
}

/**
 * Settle every body at once; resolves when `count` answers are in (no block is mined meanwhile)
 * with {answered: [{i, res}], pending: [{i, promise}]}.
 */
async function settleBurst(bodies, count) {
  const answered = [];
  const promises = bodies.map((body, i) => stack.settle(body).then((res) => {
    answered.push({ i, res });
    return res;
  }));
  await waitFor(() => answered.length >= count, { timeoutMs: 20_000, intervalMs: 50, what: `${count} of ${bodies.length} settle answers without a block mined` });
  const done = new Set(answered.map((a) => a.i));
  return { answered: [...answered], pending: promises.map((promise, i) => ({ i, promise })).filter((x) => !done.has(x.i)) };
}

/**
 * A payer holding `held` prices signs BURST authorizations of one price each (distinct nonces)
 * and all are settled at once: exactly `held` succeed, the others answer insufficient_funds with
 * no transaction, and the chain holds exactly `held` signer transactions, none reverted.
 */
async function burstFromOnePayer(held) {
  const payer = freshAccount();
  await fund(payer.address, held * PRICE);
  const ps = await Promise.all(Array.from({ length: BURST }, () => stack.pay({ account: payer, amount: PRICE })));
  const mark = await chainMark(stack.anvil, stack.signer);
  const head = mark.block;

  const refusals = BURST - Number(held);
  const { answered, pending } = await settleBurst(ps.map((p) => p.body), refusals);
  assert.equal(Number(await stack.anvil.rpc('eth_blockNumber')), head, 'no block was mined while the refusals were answered');
  assert.equal(await stack.balanceOf(payer.address), held * PRICE, 'the balance on chain still covers each payment on its own');
  for (const { i, res } of answered) {
    expectSettleFailed(res, 'insufficient_funds', { network: NETWORK, payer: getAddress(payer.address) });
    console.log(`payment ${i}: ${res.body.errorMessage}`);
  }
  assert.equal(pending.length, Number(held), `${held} settlement(s) still under way`);

  // What is under way is in the pool: one transaction per affordable payment, nothing else.
  await waitFor(async () => Object.keys(await pooledFrom(stack.anvil, stack.signer)).length >= pending.length, {
    timeoutMs: 10_000, what: 'the affordable settlements in the pool',
  });
  const pooled = Object.values(await pooledFrom(stack.anvil, stack.signer));
  assert.equal(pooled.length, pending.length, `exactly ${pending.length} signer transaction(s) in the pool: ${JSON.stringify(pooled.map((t) => t.nonce))}`);

  const results = await mining(stack.anvil, Promise.all(pending.map((x) => x.promise)));
  const hashes = results.map((res, k) => expectSettled(res, { network: NETWORK, payer: ps[pending[k].i].authorization.from }));
  assert.equal(new Set(hashes).size, hashes.length, 'one transaction per successful payment');

  // The chain: exactly `held` signer transactions, none reverted, each the transfer its answer names.
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.equal(history.all.length, Number(held), `the signer sent exactly ${held} transaction(s)`);
  assert.equal(history.settlements.length, Number(held));
  assert.equal(await stack.signerNonce(), mark.nonce + Number(held), `signer nonce +${held}`);
  for (const [k, x] of pending.entries()) {
    const receipt = await stack.receipt(hashes[k]);
    expectTransfersAuthorization(receipt.logs, stack.usdc, ps[x.i].authorization, hashes[k]);
  }
  assert.equal(await stack.balanceOf(payer.address), 0n, 'the payer paid what it held, once per success');
  for (const { i } of answered) assert.equal(await stack.balanceOf(ps[i].authorization.to), 0n, `refused payment ${i} moved nothing`);
  return { payer, ps };
}

it('a payer holding one price settles 8 authorizations of that price at once: 1 success, 7 insufficient_funds, one transaction', async () => {
  await burstFromOnePayer(1n);
});

it('a payer holding three prices: 3 successes, 5 insufficient_funds, three transactions', async () => {
  await burstFromOnePayer(3n);
});

it('a settlement that finished no longer counts: the payer settles again up to its balance', async () => {
  const payer = freshAccount();
  await fund(payer.address, 2n * PRICE);
  const first = await stack.pay({ account: payer, amount: PRICE });
  expectSettled(await mining(stack.anvil, stack.settle(first.body)), { network: NETWORK, payer: payer.address });
  const second = await stack.pay({ account: payer, amount: PRICE });
  expectSettled(await mining(stack.anvil, stack.settle(second.body)), { network: NETWORK, payer: payer.address });
  assert.equal(await stack.balanceOf(payer.address), 0n);
  // Nothing left: the balance itself refuses the next one.
  const third = await stack.pay({ account: payer, amount: PRICE });
  expectSettleFailed(await stack.settle(third.body), 'insufficient_funds', { network: NETWORK, payer: getAddress(payer.address) });
});

it('another payer is not held back by a payer at its limit', async () => {
  const busy = freshAccount();
  const other = freshAccount();
  await fund(busy.address, PRICE);
  await fund(other.address, PRICE);
  const mark = await chainMark(stack.anvil, stack.signer);
  const a = await stack.pay({ account: busy, amount: PRICE });
  const b = await stack.pay({ account: busy, amount: PRICE });
  const c = await stack.pay({ account: other, amount: PRICE });
  const first = stack.settle(a.body);
  await waitFor(async () => Object.keys(await pooledFrom(stack.anvil, stack.signer)).length === 1, { timeoutMs: 10_000, what: "the busy payer's settlement in the pool" });
  expectSettleFailed(await stack.settle(b.body), 'insufficient_funds', { network: NETWORK, payer: getAddress(busy.address) });
  const [ra, rc] = await mining(stack.anvil, Promise.all([first, stack.settle(c.body)]));
  expectSettled(ra, { network: NETWORK, payer: busy.address });
  expectSettled(rc, { network: NETWORK, payer: other.address });
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.equal(history.settlements.length, 2);
});
