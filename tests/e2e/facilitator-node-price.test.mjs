// No single answer sets the price (spec/access.md section 2): routerd reaches an auto-mining anvil
// (base fee 0.02 gwei, as in issue 26's report) only through a proxy that answers
// eth_maxPriorityFeePerGas and eth_gasPrice 10,000 times higher than the node does. The operator's
// max_fee_per_gas is set far above any real price, so only the check against the chain's own
// recent blocks (eth_feeHistory, read with each head) stands between that answer and the price:
// the settlement's effective gas price stays within ten times what the recent blocks paid per gas,
// or nothing is sent.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFacilitatorStack, throughProxy, withLogTail, NETWORK } from './lib/stack.mjs';
import { startRefusingProxy } from './lib/hostile.mjs';
import { expectSettled } from './lib/expect.mjs';
import { sleep } from './lib/util.mjs';

const GWEI = 1_000_000_000n;
const BASE_FEE = GWEI / 50n; // 0.02 gwei
const INFLATION = 10_000n;
const BELIEVED_MULTIPLE = 10n; // a fee answer above 10 x what recent blocks paid is not believed
const HISTORY_BLOCKS = 20; // the window routerd reads with each head
const OPERATOR_CAP = 1_000_000n * GWEI; // no cap in practice: the blocks are the bound
const INFLATED = new Set(['eth_maxPriorityFeePerGas', 'eth_gasPrice']);
const hex = (n) => `0x${BigInt(n).toString(16)}`;

let stack;
let proxy;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  proxy = await startRefusingProxy({
    rewrite: (call, answer) => (INFLATED.has(call.method) && answer?.result
      ? { ...answer, result: hex(BigInt(answer.result) * INFLATION) }
      : answer),
  });
  stack = await startFacilitatorStack({
    anvil: { baseFee: BASE_FEE },
    fundedPayers: 1,
    chainExtra: `max_fee_per_gas = "${OPERATOR_CAP}"\n`,
    rpcUrlFor: throughProxy(proxy),
  });
});

after(async () => {
  await stack?.stop();
  await proxy?.close();
});

/** The most any of the `count` blocks up to `newest` paid per gas: base fee plus median tip. */
async function mostPaidPerGas(newest, count) {
  const history = await stack.anvil.rpc('eth_feeHistory', [hex(count), hex(newest), [50]]);
  return history.reward.reduce((most, [tip], i) => {
    const paid = BigInt(history.baseFeePerGas[i]) + BigInt(tip);
    return paid > most ? paid : most;
  }, BigInt(history.baseFeePerGas.at(-1)));
}

it('a node answering 10,000 x the tip and gas price: the settlement pays what recent blocks paid, not the answer', async () => {
  const honest = BigInt(await stack.anvil.rpc('eth_maxPriorityFeePerGas'));
  const told = await fetch(proxy.url, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'eth_maxPriorityFeePerGas', params: [] }),
  }).then((r) => r.json());
  assert.equal(BigInt(told.result), honest * INFLATION, 'precondition: the proxy inflates the tip');
  await sleep(1_000); // a head read through the proxy since setup's last block

  const p = await stack.pay({ account: stack.payers[0] });
  const res = await stack.settle(p.body);
  if (res.body?.success !== true) {
    // The other acceptable outcome: nothing sent at that price.
    assert.equal(res.body?.transaction ?? '', '', `a failure must not name a transaction: ${res.text}`);
    return;
  }
  const hash = expectSettled(res, { network: NETWORK, payer: p.authorization.from });
  const receipt = await stack.receipt(hash);
  const tx = await stack.client.getTransaction({ hash });
  const paid = await mostPaidPerGas(Number(receipt.blockNumber) - 1, HISTORY_BLOCKS);
  const bound = BELIEVED_MULTIPLE * paid;
  const inflated = honest * INFLATION;
  console.log(`recent blocks paid at most ${paid} wei per gas; bound ${bound}; tip ${tx.maxPriorityFeePerGas}, max fee ${tx.maxFeePerGas}, effective ${receipt.effectiveGasPrice}; the node said ${inflated}`);
  assert.ok(tx.maxPriorityFeePerGas <= bound, `tip ${tx.maxPriorityFeePerGas} above ${bound}, 10 x what recent blocks paid (the node said ${inflated})`);
  assert.ok(receipt.effectiveGasPrice <= bound, `effective gas price ${receipt.effectiveGasPrice} above ${bound}, 10 x what recent blocks paid`);
  assert.equal(receipt.status, 'success');
});
