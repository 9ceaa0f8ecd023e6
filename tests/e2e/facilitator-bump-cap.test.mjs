// Defaults that cap spending (spec/access.md section 2): with no max_fee_per_gas and no
// max_settlement_cost_wei configured, a settlement kept out of the blocks is replaced with higher
// fees every bump_after_blocks blocks (default 3), but never above 4 times the max fee per gas it
// was first signed with; at that ceiling it is not replaced by a dearer settlement again. And
// nobody stalls a lane (section 3): still unmined at the ceiling bump_after_blocks later, the
// payment is answered success: false ("could not be mined under the fee caps"), a 0-value
// self-transfer takes its nonce, and the next payment settles.
//
// anvil --no-mining: every block is mined by the test with a base fee just above the dearest fee
// routerd has offered so far, so no settlement transaction can enter (anvil drops such a
// transaction from its pool when it mines the block, and refuses it when it is sent again: "max
// fee per gas less than block base fee"). routerd talks to anvil through a proxy that records every
// transaction it broadcasts, so each attempt is read as it was signed. Without the ceiling,
// routerd would outbid such a market without end.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress, keccak256, parseTransaction } from 'viem';
import { startFacilitatorStack, throughProxy, withLogTail, NETWORK } from './lib/stack.mjs';
import { sleep, waitFor } from './lib/util.mjs';
import { expectSettled, expectSettleFailed } from './lib/expect.mjs';
import { chainMark, expectCleanSignerHistory } from './lib/chain-audit.mjs';
import { mining } from './lib/settling.mjs';
import { startRefusingProxy } from './lib/hostile.mjs';

const BASE_FEE = 1_000_000_000n; // 1 gwei
const BUMP_AFTER_BLOCKS = 3; // facilitator.bump_after_blocks, default
const CEILING_MULTIPLE = 4n; // the default ceiling: 4 x the first max fee per gas
const PRICE = 1000n;
const hex = (n) => `0x${BigInt(n).toString(16)}`;

let stack;
let proxy;
/** Every transaction routerd broadcast, in order: {hash, tx (parsed), afterBlocks (the test's count then)}. */
const broadcasts = [];
let blocksMined = 0;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  // The proxy refuses nothing: it only watches the transactions go by.
  proxy = await startRefusingProxy({
    refuse: (call) => {
      if (call.method === 'eth_sendRawTransaction') {
        const raw = call.params[0];
        broadcasts.push({ hash: keccak256(raw), tx: parseTransaction(raw), afterBlocks: blocksMined });
      }
      return null;
    },
  });
  stack = await startFacilitatorStack({
    anvil: { noMining: true, baseFee: BASE_FEE },
    fundedPayers: 2,
    routerd: { settleTimeoutSecs: 50 },
    rpcUrlFor: throughProxy(proxy),
  });
});

after(async () => {
  await stack?.stop();
  await proxy?.close();
});

/**
 * Mine one block whose base fee is `baseFee`, then give routerd a moment to see it and act (what
 * it broadcasts meanwhile is counted after this block).
 */
async function mineAt(baseFee) {
  await stack.anvil.rpc('anvil_setNextBlockBaseFeePerGas', [hex(baseFee)]);
  await stack.anvil.mine();
  blocksMined += 1;
  await sleep(500);
}

const isSelfTransfer = (tx) => getAddress(tx.to) === getAddress(stack.signer) && (tx.value ?? 0n) === 0n && (tx.data ?? '0x') === '0x';

/** The distinct transactions routerd broadcast at signer nonce `nonce`, first broadcast first. */
function attemptsAt(nonce) {
  const seen = new Map();
  for (const b of broadcasts) if (b.tx.nonce === nonce && !seen.has(b.hash)) seen.set(b.hash, b);
  return [...seen.values()];
}

it('a settlement priced out by the market is bumped every bump_after_blocks blocks up to 4x its first max fee, never above; then a self-transfer takes its nonce and the lane goes on', async () => {
  const [payer, next] = stack.payers;
  const p = await stack.pay({ account: payer, amount: PRICE });
  const mark = await chainMark(stack.anvil, stack.signer);
  const payerBefore = await stack.balanceOf(payer.address);

  let answered = null;
  const answer = stack.settle(p.body).then((res) => { answered = res; return res; });
  const first = await waitFor(() => attemptsAt(mark.nonce)[0], { timeoutMs: 15_000, what: 'the settlement broadcast' });
  const nonce = mark.nonce;
  const firstMaxFee = first.tx.maxFeePerGas;
  const ceiling = CEILING_MULTIPLE * firstMaxFee;
  console.log(`first max fee ${firstMaxFee}, ceiling ${ceiling}`);

  const settlementAttempts = () => attemptsAt(nonce).filter((a) => !isSelfTransfer(a.tx));
  const dearest = () => settlementAttempts().reduce((m, a) => (a.tx.maxFeePerGas > m ? a.tx.maxFeePerGas : m), 0n);
  const selfTransfer = () => attemptsAt(nonce).find((a) => isSelfTransfer(a.tx));

  // Keep every settlement attempt out of the blocks until routerd gives the nonce up (or 10 bump
  // periods pass, which fails below).
  const start = blocksMined;
  while (!selfTransfer() && blocksMined - start < 10 * BUMP_AFTER_BLOCKS) {
    await mineAt(dearest() + dearest() / 10n + 1n);
  }
  for (const a of attemptsAt(nonce)) {
    console.log(`after block ${a.afterBlocks - start}: ${isSelfTransfer(a.tx) ? 'self-transfer' : 'settlement'} ${a.hash} max fee ${a.tx.maxFeePerGas} tip ${a.tx.maxPriorityFeePerGas} gas ${a.tx.gas}`);
  }

  // The settlement's attempts: dearer each time, bump_after_blocks apart, never above the ceiling.
  const settled = settlementAttempts();
  assert.ok(settled.length >= 2, `the priced-out settlement was replaced at least once (${settled.length} attempt(s))`);
  for (const [i, a] of settled.entries()) {
    const maxFee = a.tx.maxFeePerGas;
    assert.ok(maxFee <= ceiling, `attempt ${i} max fee ${maxFee} is above 4 x the first (${ceiling})`);
    assert.ok(a.tx.maxPriorityFeePerGas <= maxFee, `attempt ${i}: tip within the max fee`);
    assert.equal(a.tx.data, first.tx.data, `attempt ${i} is the same settlement`);
    if (i > 0) {
      assert.ok(maxFee > settled[i - 1].tx.maxFeePerGas, `attempt ${i} outbids the one before`);
      // routerd counts blocks as it sees them; a broadcast seen a block late here shifts by one.
      const apart = a.afterBlocks - settled[i - 1].afterBlocks;
      assert.ok(apart >= BUMP_AFTER_BLOCKS - 1, `attempt ${i} came ${apart} blocks after the one before (bump_after_blocks = ${BUMP_AFTER_BLOCKS})`);
    }
  }
  const top = settled.at(-1);
  // At the ceiling: the next replacement would need 10% more, which the ceiling does not allow.
  assert.ok(top.tx.maxFeePerGas * 11n / 10n > ceiling, `the bumps went up to the ceiling: last ${top.tx.maxFeePerGas}, ceiling ${ceiling}`);

  // No dearer settlement after the ceiling; the lane is given up to a self-transfer instead.
  const filler = selfTransfer();
  assert.ok(filler, `no self-transfer took nonce ${nonce} within ${blocksMined - start} blocks of keeping the settlement out (answer so far: ${answered?.text})`);
  const waited = filler.afterBlocks - top.afterBlocks;
  assert.ok(waited >= BUMP_AFTER_BLOCKS, `the settlement waited bump_after_blocks at its ceiling before giving its nonce up (${waited} blocks)`);
  assert.ok(waited <= 3 * BUMP_AFTER_BLOCKS, `nor much longer (${waited} blocks)`);
  // The self-transfer costs no more than the settlement was allowed to.
  assert.ok(filler.tx.gas * filler.tx.maxFeePerGas <= top.tx.gas * ceiling,
    `self-transfer ${filler.tx.gas} gas x ${filler.tx.maxFeePerGas} within the settlement's ${top.tx.gas} x ${ceiling}`);

  // The market comes back: the self-transfer is mined at the nonce, the payment is a failure.
  const res = await mining(stack.anvil, answer, { beforeMine: () => stack.anvil.rpc('anvil_setNextBlockBaseFeePerGas', [hex(BASE_FEE)]) });
  expectSettleFailed(res, 'invalid_payload', { network: NETWORK, payer: getAddress(payer.address) });
  assert.match(res.body.errorMessage, /fee caps/, res.text);
  assert.equal(await stack.balanceOf(payer.address), payerBefore, 'the payer paid nothing');

  // The lane goes on: the next payment settles at the next nonce.
  const q = await stack.pay({ account: next, amount: PRICE });
  const hash = expectSettled(await mining(stack.anvil, stack.settle(q.body), { beforeMine: () => stack.anvil.rpc('anvil_setNextBlockBaseFeePerGas', [hex(BASE_FEE)]) }), { network: NETWORK, payer: next.address });

  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.deepEqual(history.selfTransfers.map((t) => t.nonce), [nonce], 'the self-transfer was mined at the given-up nonce');
  assert.equal(history.selfTransfers[0].hash, filler.hash, 'the self-transfer routerd broadcast');
  assert.deepEqual(history.settlements.map((t) => t.hash), [hash], 'only the next payment was settled');
});
