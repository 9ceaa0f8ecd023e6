// Broadcasts the node must accept (spec/x402-facilitator.md section 3, Fees and Signer nonces), on a
// chain that mines only when told with its base fee pinned at 1 gwei, and two signer keys:
// - chains.<name>.max_fee_per_gas just above the base fee: settlements still mine, no transaction
//   offers more than the cap, and the tip is kept (a tip cut to nothing may wait forever);
// - one signer with no ETH for gas (the node refuses its broadcasts): every settle still succeeds,
//   through the funded signer, and none answers an error.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { anvilAccount, anvilKey, freshAccount } from './lib/accounts.mjs';
import { expectSettled, show } from './lib/expect.mjs';
import { sleep } from './lib/util.mjs';
import {
  chainMark, expectCleanSignerHistory, expectTransfersAuthorization, minedFrom, waitPoolEmpty,
} from './lib/chain-audit.mjs';
import { mining, settleUntilDone, assertSameAddress } from './lib/settling.mjs';

const GWEI = 1_000_000_000n;
const BASE_FEE = GWEI;
const CAP = (BASE_FEE * 3n) / 2n; // 1.5 gwei: room for a tip of at most 0.5 gwei above the base fee
const SECOND_SIGNER = 7; // an anvil account no role uses
const COUNT = 8;

let stack;
const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

/** Every block this file mines has the same base fee, so "just above the base fee" stays true. */
const pinBaseFee = () => stack.anvil.rpc('anvil_setNextBlockBaseFeePerGas', [`0x${BASE_FEE.toString(16)}`]);

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { noMining: true, baseFee: BASE_FEE },
    fundedPayers: 2 * COUNT,
    extraSignerKeys: [anvilKey(SECOND_SIGNER)],
    chainExtra: `max_fee_per_gas = "${CAP}"\n`,
    routerd: { settleTimeoutSecs: 30 },
  });
  await pinBaseFee();
  await stack.anvil.mine(); // the latest block routerd prices from has the pinned base fee
  await sleep(2_000); // routerd polls the head every 500 ms: let it see that block before pricing
});

after(() => stack?.stop());

let nextPayer = 0;
async function payments(n) {
  const out = [];
  for (let i = 0; i < n; i += 1) {
    out.push(await stack.pay({ account: stack.payers[nextPayer], payTo: freshAccount().address }));
    nextPayer += 1;
  }
  return out;
}

/** Settle all `ps` concurrently (asking again on 504) while mining pinned blocks; returns the answers. */
function settleAll(ps) {
  return mining(stack.anvil, Promise.all(ps.map((p) => settleUntilDone(stack, p.body, { mine: false }))), { beforeMine: pinBaseFee });
}

/** Answers are successes whose transactions moved each payment's funds once. Returns the hashes. */
async function expectAllSettled(ps, answers) {
  const hashes = answers.map((res, i) => expectSettled(res, { network: NETWORK, payer: ps[i].authorization.from }));
  assert.equal(new Set(hashes).size, ps.length, 'one transaction per payment');
  for (const [i, hash] of hashes.entries()) {
    const receipt = await stack.receipt(hash);
    assert.equal(receipt.status, 'success', hash);
    expectTransfersAuthorization(receipt.logs, stack.usdc, ps[i].authorization, hash);
    assert.equal(await stack.balanceOf(ps[i].authorization.to), 1000n, `payment ${i} paid once`);
  }
  return hashes;
}

it(`max_fee_per_gas ${CAP} wei, base fee ${BASE_FEE}: settlements mine, none offers more than the cap, the tip is kept`, async () => {
  const tip = BigInt(await stack.anvil.rpc('eth_maxPriorityFeePerGas'));
  assert.ok(tip > 0n, 'precondition: the node suggests a tip');
  const marks = await Promise.all(stack.signers.map((s) => chainMark(stack.anvil, s)));
  const ps = await payments(COUNT);

  const hashes = await expectAllSettled(ps, await settleAll(ps));

  const txs = await minedFrom(stack.anvil, stack.signers, { fromBlock: Math.min(...marks.map((m) => m.block)) });
  assert.deepEqual(txs.map((t) => t.hash).sort(), [...hashes].sort(), 'the mined signer transactions are the answered ones');
  // What a transaction can pay its block producer under the cap: the suggested tip, or all the room there is.
  const keptTip = tip < CAP - BASE_FEE ? tip : CAP - BASE_FEE;
  for (const t of txs) {
    assert.equal(t.baseFee, BASE_FEE, `precondition: block ${t.blockNumber} has the pinned base fee`);
    const offered = t.maxFeePerGas ?? t.gasPrice;
    assert.ok(offered <= CAP, `${t.hash} offers ${offered} wei per gas, above the cap ${CAP}`);
    assert.ok(offered >= BASE_FEE, `${t.hash} offers ${offered}, below the base fee`);
    const paidTip = t.effectiveGasPrice - t.baseFee;
    assert.ok(paidTip >= keptTip, `${t.hash} paid a tip of ${paidTip} wei per gas; the cap leaves room for ${keptTip} (maxPriorityFeePerGas ${t.maxPriorityFeePerGas}, maxFeePerGas ${t.maxFeePerGas})`);
  }
  for (const [i, s] of stack.signers.entries()) {
    await expectCleanSignerHistory(stack.anvil, { signer: s, usdc: stack.usdc, mark: marks[i] });
  }
});

it(`a signer with no ETH for gas: all ${COUNT} concurrent settles succeed through the funded one, none answers an error`, async () => {
  const broke = anvilAccount(SECOND_SIGNER).address;
  assertSameAddress(stack.signers[1], broke, 'the second signer');
  await stack.anvil.rpc('anvil_setBalance', [broke, '0x0']);
  const brokeNonce = await stack.client.getTransactionCount({ address: broke });
  const mark = await chainMark(stack.anvil, stack.signer);
  const ps = await payments(COUNT);

  const answers = await settleAll(ps);
  for (const [i, res] of answers.entries()) {
    assert.ok(res.status === 200 && res.body?.success === true, `payment ${i} did not settle: ${show(res)}`);
  }
  const hashes = await expectAllSettled(ps, answers);
  for (const hash of hashes) {
    assertSameAddress((await stack.client.getTransaction({ hash })).from, stack.signer, `${hash} is sent by the funded signer`);
  }
  await mining(stack.anvil, waitPoolEmpty(stack.anvil), { beforeMine: pinBaseFee });
  assert.equal(await stack.client.getTransactionCount({ address: broke }), brokeNonce, 'the broke signer sent nothing');
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.deepEqual(history.settlements.map((t) => t.hash).sort(), [...hashes].sort());
});
