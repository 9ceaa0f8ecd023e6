// A settlement that lingers unmined (its fees fell below the base fee) is replaced after
// facilitator.bump_after_blocks blocks with higher fees and the same signer nonce; the payment
// settles once, with the replacement's hash (x402-facilitator.md §3, Fees).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { waitFor } from './lib/util.mjs';
import { expectSettled } from './lib/expect.mjs';

const BASE_FEE = 1_000_000_000n; // 1 gwei
let stack;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { noMining: true, baseFee: BASE_FEE },
    fundedPayers: 1,
    routerd: { settleTimeoutSecs: 60 },
  });
});

after(() => stack?.stop());

/** The signer's transactions waiting in anvil's pool, by nonce. */
async function pooled() {
  const pool = await stack.anvil.rpc('txpool_content');
  const entry = Object.entries(pool.pending ?? {}).find(([from]) => getAddress(from) === getAddress(stack.signer));
  return entry?.[1] ?? {};
}

/** Mine one block whose base fee is above every fee routerd offered so far: nothing is included. */
async function mineTooExpensiveBlock(baseFee) {
  await stack.anvil.rpc('anvil_setNextBlockBaseFeePerGas', [`0x${baseFee.toString(16)}`]);
  await stack.anvil.mine();
}

it('a settlement priced out for bump_after_blocks blocks is replaced with higher fees, same nonce, and settles once', async () => {
  const p = await stack.pay({ account: stack.payers[0] });
  const nonce = await stack.signerNonce();
  const payerBefore = await stack.balanceOf(p.authorization.from);

  const answer = stack.settle(p.body);
  const first = await waitFor(async () => (await pooled())[String(nonce)], { timeoutMs: 15_000, what: 'the first broadcast' });
  const firstMaxFee = BigInt(first.maxFeePerGas);

  // Blocks the first transaction cannot enter; routerd must notice and re-price after three of them.
  const expensive = firstMaxFee + firstMaxFee / 10n;
  let replacement;
  for (let i = 0; i < 12 && !replacement; i += 1) {
    await mineTooExpensiveBlock(expensive);
    replacement = await waitFor(async () => {
      const tx = (await pooled())[String(nonce)];
      return tx && tx.hash !== first.hash ? tx : undefined;
    }, { timeoutMs: 1_500, what: 'a replacement' }).catch(() => undefined);
  }
  assert.ok(replacement, 'routerd replaced the lingering transaction');
  assert.equal(BigInt(replacement.nonce), BigInt(nonce), 'same signer nonce');
  assert.ok(BigInt(replacement.maxFeePerGas) > expensive, 'the replacement outbids the blocks that kept the first one out');
  assert.ok(BigInt(replacement.maxPriorityFeePerGas) > BigInt(first.maxPriorityFeePerGas), 'tip raised too');

  await stack.anvil.mine();
  const hash = expectSettled(await answer, { network: NETWORK, payer: p.authorization.from });
  assert.equal(hash, replacement.hash, 'the answer carries the mined replacement');
  assert.equal(await stack.balanceOf(p.authorization.from), payerBefore - 1000n, 'paid once');
  assert.equal(await stack.signerNonce(), nonce + 1, 'one transaction mined');
});
