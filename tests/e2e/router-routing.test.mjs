// Choosing the chain (spec/router.md §3, §4, §5) against three real anvil chains with different fee
// settings: an OP-stack L2 with a real GasPriceOracle (cheapest for small calldata, dearest per
// calldata byte), a legacy-fee (berlin) chain and an expensive EIP-1559 L1. Every routed answer is
// signed by viem with exactly the answered fields and must get mined on the chosen chain.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { serializeTransaction, toHex, getAddress } from 'viem';
import {
  startRouterStack, routerTx, withRouterLogTail, DEFAULT_CHAINS, ROUTER_DEFAULTS, GWEI,
} from './lib/router-stack.mjs';
import {
  expectAnswer, expectMinedAsAnswered, expectRpcError, expectRestError, expectChainEntries, show,
} from './lib/router-expect.mjs';
import { getL1Fee, readOracle, incompressibleHex, CONTRACTS_BEDROCK_VERSION } from './lib/op-stack.mjs';
import { REVERT_NOPE_RUNTIME, STOP_RUNTIME, initCodeFor } from './lib/evm-code.mjs';
import { freshAccount } from './lib/accounts.mjs';

let stack;
const it = (name, fn) => test(name, { timeout: 90_000 }, withRouterLogTail(() => stack, fn));
const ALL = DEFAULT_CHAINS.map((c) => c.name); // ['op', 'legacy', 'l1']
const CHAIN_ID = Object.fromEntries(DEFAULT_CHAINS.map((c) => [c.name, c.chainId]));

// Contracts at the same address on every chain where they are installed.
const SINK = getAddress('0x5151515151515151515151515151515151515151'); // STOP: accepts any call
const SINK_NOT_ON_OP = getAddress('0x5252525252525252525252525252525252525252');
const REVERTER = getAddress('0x6e6f70656e6f70656e6f70656e6f70656e6f7065'); // reverts Error("nope")
const FAIL_SELECTOR = '0xa9cc4718'; // fail()

before(async () => {
  stack = await startRouterStack();
  await stack.setCode(SINK, STOP_RUNTIME);
  await stack.setCode(SINK_NOT_ON_OP, STOP_RUNTIME, { on: ['legacy', 'l1'] });
  await stack.setCode(REVERTER, REVERT_NOPE_RUNTIME);
});

after(() => stack?.stop());

const base = (hex) => BigInt(hex);

/** Balance of `address` on chain `name`. */
const balanceOf = async (name, address) => BigInt(await stack.chain(name).anvil.rpc('eth_getBalance', [address, 'latest']));

// ---------------------------------------------------------------------------------------------
// The OP-stack chain itself

it('OP-stack chain: GasPriceOracle.getL1Fee answers a non-zero L1 fee that grows with calldata size', async () => {
  const op = stack.chain('op');
  assert.equal(await readOracle(op.anvil, 'version'), '1.3.0', `contracts-bedrock ${CONTRACTS_BEDROCK_VERSION}`);
  assert.equal(await readOracle(op.anvil, 'isEcotone'), true);
  assert.equal(await readOracle(op.anvil, 'isFjord'), true);
  assert.equal(await readOracle(op.anvil, 'l1BaseFee'), op.opStack.l1BaseFee);
  let previous = 0n;
  for (const size of [0, 300, 1000, 4000]) {
    const unsigned = serializeTransaction({
      chainId: op.chainId, type: 'eip1559', nonce: 0, gas: 100_000n, maxFeePerGas: GWEI, maxPriorityFeePerGas: GWEI,
      to: SINK, data: incompressibleHex(size), value: 0n,
    });
    const fee = await getL1Fee(op.anvil, unsigned);
    assert.ok(fee > previous, `getL1Fee(${size} bytes) = ${fee}, not above ${previous}`);
    previous = fee;
  }
});

it('OP-stack chain: the routed transaction is charged the L1 fee router_quote named', async () => {
  const sender = await stack.newSender({ on: ['op'] });
  for (const data of ['0x01', incompressibleHex(1000, 7)]) {
    const request = routerTx({ from: sender.address, to: SINK, data });
    const quoted = (await stack.quote(request)).find((q) => q.chain === 'op');
    assert.ok(quoted?.feasible && quoted.l1Fee, show(quoted));
    const answer = await stack.route(request);
    expectAnswer(answer, { chainId: CHAIN_ID.op });
    const before = await balanceOf('op', sender.address);
    const mined = await stack.signSendAndMine(sender, request, answer);
    expectMinedAsAnswered(mined, answer);
    const charged = before - (await balanceOf('op', sender.address)) - BigInt(mined.receipt.gasUsed) * BigInt(mined.receipt.effectiveGasPrice);
    // The quote prices the unsigned transaction; the chain the signed one: a few bytes apart.
    const diff = charged > base(quoted.l1Fee) ? charged - base(quoted.l1Fee) : base(quoted.l1Fee) - charged;
    assert.ok(charged > 0n && diff * 100n <= charged, `charged L1 fee ${charged}, quoted ${base(quoted.l1Fee)} (${data.length} hex chars)`);
  }
});

it('router_chains lists every chain with its kind, chain id, fee model, health and read mode', async () => {
  // The read mode is probed in the background at start: give the probes a moment.
  let chains = await stack.routerChains();
  for (let i = 0; i < 50 && chains.some((c) => c.readMode === 'unknown'); i++) {
    await new Promise((r) => setTimeout(r, 100));
    chains = await stack.routerChains();
  }
  assert.equal(chains.length, 3, show(chains));
  for (const c of DEFAULT_CHAINS) {
    const entry = chains.find((x) => x.chain === c.name);
    assert.ok(entry, `${c.name} missing: ${show(chains)}`);
    assert.equal(entry.kind, c.kind, show(entry));
    assert.equal(entry.chainId, toHex(c.chainId), show(entry));
    assert.equal(entry.feeModel, c.feeModel, show(entry));
    assert.equal(entry.healthy, true, show(entry));
    assert.ok(Number.isInteger(entry.headBlock), show(entry));
    assert.equal(entry.readMode, 'lens', show(entry)); // anvil runs eth_call state overrides
  }
});

// ---------------------------------------------------------------------------------------------
// The cheapest feasible chain wins, and its answer mines as is

it('a plain transfer goes to the cheapest chain (OP), and viem signing exactly the answer gets it mined there', async () => {
  const sender = await stack.newSender();
  const recipient = freshAccount().address;
  const request = routerTx({ from: sender.address, to: recipient, value: '12345' });

  const ranked = await stack.quote(request);
  assert.deepEqual(ranked.map((q) => q.chain), ['op', 'legacy', 'l1'], `expected cost order: ${show(ranked)}`);

  const answer = await stack.routeWithViem(request); // viem client.request, as a wallet calls it
  expectAnswer(answer, { chainId: CHAIN_ID.op, type: 'eip1559' });
  const op = stack.chain('op');
  assert.equal(Number(BigInt(answer.nonce)), await stack.pendingNonce('op', sender.address));

  // gasLimit = estimate * (1 + gas_headroom), rounded up.
  const estimate = Number(await op.anvil.rpc('eth_estimateGas', [{ from: sender.address, to: recipient, value: toHex(12345n), data: '0x' }]));
  assert.equal(Number(BigInt(answer.gasLimit)), Math.ceil(estimate * (1 + ROUTER_DEFAULTS.gasHeadroom)), show(answer));
  // maxPriorityFeePerGas from eth_maxPriorityFeePerGas; maxFeePerGas = 2 * baseFee + priority.
  assert.equal(base(answer.maxPriorityFeePerGas), base(await op.anvil.rpc('eth_maxPriorityFeePerGas', [])), show(answer));
  const latest = await op.anvil.rpc('eth_getBlockByNumber', ['latest', false]);
  const answeredBaseFee = (base(answer.maxFeePerGas) - base(answer.maxPriorityFeePerGas)) / 2n;
  assert.equal(base(answer.maxFeePerGas), 2n * answeredBaseFee + base(answer.maxPriorityFeePerGas), show(answer));
  assert.ok(answeredBaseFee >= base(latest.baseFeePerGas), `base fee ${answeredBaseFee} below the chain's ${latest.baseFeePerGas}`);

  const mined = await stack.signSendAndMine(sender, request, answer);
  assert.equal(mined.chain.name, 'op');
  expectMinedAsAnswered(mined, answer);
  assert.equal(await balanceOf('op', recipient), 12345n);
});

for (const winner of ALL) {
  const type = winner === 'legacy' ? 'legacy' : 'eip1559';
  it(`a sender funded only on ${winner} is routed there, and the ${type} answer mines`, async () => {
    const sender = await stack.newSender({ on: [winner] });
    const recipient = freshAccount().address;
    const request = routerTx({ from: sender.address, to: recipient, value: '0x3e8' });
    const answer = await stack.route(request);
    expectAnswer(answer, { chainId: CHAIN_ID[winner], type });
    if (type === 'legacy') {
      assert.equal(base(answer.gasPrice), base(await stack.chain(winner).anvil.rpc('eth_gasPrice', [])), show(answer));
    }
    const mined = await stack.signSendAndMine(sender, request, answer);
    assert.equal(mined.chain.name, winner);
    expectMinedAsAnswered(mined, answer);
    assert.equal(await balanceOf(winner, recipient), 1000n);
  });
}

for (const name of ALL) {
  it(`on ${name}, a sender is feasible exactly when the balance covers value + gasLimit * maxFee (+ L1 fee)`, async () => {
    const value = 1000n;
    const to = freshAccount().address; // one recipient: the L1 fee depends on the transaction's bytes
    const entry = async (sender) => (await stack.quote(routerTx({ from: sender.address, to, value: String(value) })))
      .find((q) => q.chain === name);
    const prices = (q) => [q.gasLimit, q.maxFeePerGas, q.gasPrice, q.l1Fee];
    // Quotes follow routerd's head cache: let it catch up with the chain, so the three quotes
    // below price against the same block.
    await stack.waitHeadSynced(name);
    const rich = await entry(await stack.newSender({ on: [name] }));
    assert.equal(rich.feasible, true, show(rich));
    const price = base(rich.maxFeePerGas ?? rich.gasPrice);
    const need = value + base(rich.gasLimit) * price + (rich.l1Fee ? base(rich.l1Fee) : 0n);

    const short = await entry(await stack.newSender({ on: [name], amount: need - 1n }));
    assert.equal(short.feasible, false, `balance ${need - 1n} < ${need} accepted: ${show(short)}`);
    assert.match(short.reason, /insufficient/i, show(short));

    const exactSender = await stack.newSender({ on: [name], amount: need });
    const exact = await entry(exactSender);
    assert.deepEqual(prices(exact), prices(rich), `prices moved between quotes: ${show([rich, exact])}`);
    assert.equal(exact.feasible, true, `balance ${need} refused: ${show(exact)}`);

    // And the chain agrees: the exactly funded sender's transaction is accepted and mined.
    const request = routerTx({ from: exactSender.address, to, value: String(value) });
    const answer = await stack.route(request);
    expectAnswer(answer, { chainId: CHAIN_ID[name] });
    expectMinedAsAnswered(await stack.signSendAndMine(exactSender, request, answer), answer);
  });
}

// ---------------------------------------------------------------------------------------------
// Infeasible on the cheapest chain -> the next best

it('a sender without funds on the cheapest chain is routed to the next best (legacy) and it mines', async () => {
  const sender = await stack.newSender({ on: ['legacy', 'l1'] });
  const request = routerTx({ from: sender.address, to: freshAccount().address, value: '1' });

  const ranked = await stack.quote(request);
  expectChainEntries(ranked, ALL);
  assert.deepEqual(ranked.map((q) => [q.chain, q.feasible]), [['legacy', true], ['l1', true], ['op', false]], show(ranked));
  assert.match(ranked[2].reason, /insufficient/i, show(ranked[2]));

  const answer = await stack.route(request);
  expectAnswer(answer, { chainId: CHAIN_ID.legacy, type: 'legacy' });
  expectMinedAsAnswered(await stack.signSendAndMine(sender, request, answer), answer);
});

it('a call whose `to` has no code on the cheapest chain (non-empty data) is routed to the next best and mines', async () => {
  const sender = await stack.newSender();
  const request = routerTx({ from: sender.address, to: SINK_NOT_ON_OP, data: '0x01' });

  const ranked = await stack.quote(request);
  expectChainEntries(ranked, ALL);
  assert.deepEqual(ranked.map((q) => [q.chain, q.feasible]), [['legacy', true], ['l1', true], ['op', false]], show(ranked));
  assert.match(ranked[2].reason, /code/i, show(ranked[2]));

  const answer = await stack.route(request);
  expectAnswer(answer, { chainId: CHAIN_ID.legacy, type: 'legacy' });
  expectMinedAsAnswered(await stack.signSendAndMine(sender, request, answer), answer);

  // Without data the same address is a plain transfer: no code needed, the cheapest chain wins.
  const transfer = routerTx({ from: sender.address, to: SINK_NOT_ON_OP, data: '0x' });
  expectAnswer(await stack.route(transfer), { chainId: CHAIN_ID.op });
});

it('a call that reverts everywhere -> -32000 with every chain and its decoded revert reason in error.data', async () => {
  const sender = await stack.newSender();
  const request = routerTx({ from: sender.address, to: REVERTER, data: FAIL_SELECTOR });

  const error = expectRpcError(await stack.rpc('eth_routerTransaction', [request], { id: 42 }), { code: -32000, id: 42 });
  expectChainEntries(error.data, ALL);
  for (const entry of error.data) {
    assert.equal(entry.feasible, false, show(entry));
    assert.equal(entry.chainId, toHex(CHAIN_ID[entry.chain]), show(entry));
    assert.match(entry.reason, /revert/i, show(entry));
    assert.match(entry.reason, /nope/, `revert reason not decoded: ${show(entry)}`);
    assert.doesNotMatch(entry.reason, /08c379a0/i, `raw revert data instead of the reason: ${show(entry)}`);
  }

  // REST: the same refusal as HTTP 400 {error: -32000, message, data}.
  const rest = expectRestError(await stack.post('/', request), { status: 400, code: -32000 });
  expectChainEntries(rest.data, ALL);
  for (const entry of rest.data) assert.match(entry.reason, /nope/, show(entry));
});

it('contract creation (`to` "" or "0x") is routed, and the signed answer deploys the code on the chosen chain', async () => {
  const sender = await stack.newSender();
  const initCode = initCodeFor(REVERT_NOPE_RUNTIME);
  const viaHexPrefix = await stack.quote(routerTx({ from: sender.address, to: '0x', data: initCode }));
  assert.equal(viaHexPrefix[0].chain, 'op', show(viaHexPrefix));
  assert.ok(viaHexPrefix.every((q) => q.feasible), show(viaHexPrefix));

  const request = routerTx({ from: sender.address, to: '', data: initCode });
  const answer = await stack.route(request);
  expectAnswer(answer, { chainId: CHAIN_ID.op, type: 'eip1559' });
  const mined = await stack.signSendAndMine(sender, request, answer);
  expectMinedAsAnswered(mined, answer);
  const deployed = mined.receipt.contractAddress;
  assert.equal(await stack.chain('op').anvil.rpc('eth_getCode', [deployed, 'latest']), REVERT_NOPE_RUNTIME);

  // Calling it: reverts on op, no code elsewhere -> -32000 with both kinds of reason.
  const call = routerTx({ from: sender.address, to: getAddress(deployed), data: FAIL_SELECTOR });
  const error = expectRpcError(await stack.rpc('eth_routerTransaction', [call]), { code: -32000 });
  expectChainEntries(error.data, ALL);
  const reason = Object.fromEntries(error.data.map((e) => [e.chain, e.reason]));
  assert.match(reason.op, /nope/, show(error.data));
  assert.match(reason.legacy, /code/i, show(error.data));
  assert.match(reason.l1, /code/i, show(error.data));
});

// ---------------------------------------------------------------------------------------------
// The L1 data fee

it('large calldata moves the choice away from the OP chain, whose L1 data fee makes it dearer', async () => {
  const sender = await stack.newSender();
  const small = routerTx({ from: sender.address, to: SINK, data: '0x01' });
  const large = routerTx({ from: sender.address, to: SINK, data: incompressibleHex(4000) });

  const smallRanked = await stack.quote(small);
  assert.equal(smallRanked[0].chain, 'op', `small calldata: OP should be cheapest: ${show(smallRanked)}`);
  const largeRanked = await stack.quote(large);
  expectChainEntries(largeRanked, ALL);
  assert.ok(largeRanked.every((q) => q.feasible), show(largeRanked));
  assert.notEqual(largeRanked[0].chain, 'op', `large calldata: OP should not be cheapest: ${show(largeRanked)}`);

  // The L1 fee is what moved it: without it OP would still be the cheapest.
  const opSmall = smallRanked.find((q) => q.chain === 'op');
  const opLarge = largeRanked.find((q) => q.chain === 'op');
  assert.ok(opSmall.l1Fee && opLarge.l1Fee, `OP quote without l1Fee: ${show([opSmall, opLarge])}`);
  assert.ok(base(opLarge.l1Fee) > base(opSmall.l1Fee), show([opSmall, opLarge]));
  const winner = largeRanked[0];
  assert.ok(BigInt(opLarge.costWei) - base(opLarge.l1Fee) < BigInt(winner.costWei),
    `OP's execution cost alone should beat ${winner.chain}: ${show(largeRanked)}`);
  for (const q of largeRanked.filter((x) => x.chain !== 'op')) assert.equal(q.l1Fee, undefined, show(q));

  // routerd's l1Fee is the oracle's price of the transaction (same size, so within a few percent).
  const op = stack.chain('op');
  const unsigned = serializeTransaction({
    chainId: op.chainId, type: 'eip1559', nonce: 0, gas: BigInt(opLarge.gasLimit),
    maxFeePerGas: base(opLarge.maxFeePerGas), maxPriorityFeePerGas: base(opLarge.maxPriorityFeePerGas), to: SINK, data: large.data, value: 0n,
  });
  const oracle = await getL1Fee(op.anvil, unsigned);
  const diff = base(opLarge.l1Fee) > oracle ? base(opLarge.l1Fee) - oracle : oracle - base(opLarge.l1Fee);
  assert.ok(diff * 100n <= oracle * 3n, `l1Fee ${base(opLarge.l1Fee)} vs the oracle's ${oracle} for the same transaction`);

  // And the routed answers agree with the quotes; the large one mines where it was sent.
  expectAnswer(await stack.route(small), { chainId: CHAIN_ID.op });
  const answer = await stack.route(large);
  expectAnswer(answer, { chainId: CHAIN_ID[winner.chain] });
  // The small answer reserved nonce 0 on op; the large one is on another chain, so it starts at 0 there.
  expectMinedAsAnswered(await stack.signSendAndMine(sender, large, answer), answer);
});

// ---------------------------------------------------------------------------------------------
// Nonces

it('five back-to-back calls for one sender return consecutive nonces, and all five mine when sent in order', async () => {
  const sender = await stack.newSender();
  const requests = Array.from({ length: 5 }, (_, i) => routerTx({ from: sender.address, to: freshAccount().address, value: String(i + 1) }));
  const first = await stack.pendingNonce('op', sender.address);
  const answers = [];
  for (const request of requests) answers.push(await stack.route(request));
  for (const [i, answer] of answers.entries()) {
    expectAnswer(answer, { chainId: CHAIN_ID.op });
    assert.equal(Number(BigInt(answer.nonce)), first + i, `call ${i}: ${show(answers)}`);
  }
  for (const [i, answer] of answers.entries()) {
    expectMinedAsAnswered(await stack.signSendAndMine(sender, requests[i], answer), answer);
  }
  assert.equal(await stack.pendingNonce('op', sender.address), first + 5);
});

it('concurrent calls for one sender each get their own nonce (consecutive, no duplicates)', async () => {
  const sender = await stack.newSender();
  const first = await stack.pendingNonce('op', sender.address);
  const answers = await Promise.all(Array.from({ length: 5 }, () => stack.route(routerTx({ from: sender.address, to: freshAccount().address }))));
  const nonces = answers.map((a) => Number(BigInt(a.nonce))).sort((a, b) => a - b);
  assert.deepEqual(nonces, [first, first + 1, first + 2, first + 3, first + 4], show(answers));
});

// ---------------------------------------------------------------------------------------------
// router_quote

it('router_quote (and POST /quote) ranks every chain with feasible/reason/cost, and reserves no nonce', async () => {
  const sender = await stack.newSender({ on: ['op', 'l1'] }); // nothing on legacy
  const request = routerTx({ from: sender.address, to: freshAccount().address, value: '7' });

  const viaRpc = await stack.quote(request);
  const viaRest = await stack.post('/quote', request);
  assert.equal(viaRest.status, 200, viaRest.text);
  for (const ranked of [viaRpc, viaRest.body]) {
    expectChainEntries(ranked, ALL);
    assert.deepEqual(ranked.map((q) => [q.chain, q.feasible]), [['op', true], ['l1', true], ['legacy', false]], show(ranked));
    assert.match(ranked[2].reason, /insufficient/i, show(ranked[2]));
    assert.equal(ranked[2].costWei, undefined, show(ranked[2]));
    const feasible = ranked.filter((q) => q.feasible);
    assert.ok(Number(feasible[0].cost) <= Number(feasible[1].cost), `not ranked by cost: ${show(ranked)}`);
    for (const q of feasible) {
      assert.equal(q.reason, undefined, show(q));
      // cost = gasLimit * (baseFee + priority) + L1 fee, times native_price (1.0 here).
      const gasLimit = base(q.gasLimit);
      const priority = base(q.maxPriorityFeePerGas);
      const baseFee = (base(q.maxFeePerGas) - priority) / 2n;
      const l1Fee = q.l1Fee ? base(q.l1Fee) : 0n;
      assert.equal(BigInt(q.costWei), gasLimit * (baseFee + priority) + l1Fee, show(q));
      assert.ok(Math.abs(q.cost - Number(BigInt(q.costWei))) <= Number(BigInt(q.costWei)) * 1e-9, show(q));
    }
    assert.ok(base(ranked[0].l1Fee) > 0n, `op quote without l1Fee: ${show(ranked[0])}`);
  }
  // Quoting again does not move anything either.
  await stack.quote(request);
  await stack.post('/quote', request);

  const pending = await stack.pendingNonce('op', sender.address);
  const answer = await stack.route(request);
  expectAnswer(answer, { chainId: CHAIN_ID.op });
  assert.equal(Number(BigInt(answer.nonce)), pending, `quotes reserved a nonce: ${show(answer)}`);
  expectMinedAsAnswered(await stack.signSendAndMine(sender, request, answer), answer);
});

it('a legacy chain quote prices gasLimit * gasPrice', async () => {
  const sender = await stack.newSender({ on: ['legacy'] });
  const ranked = await stack.quote(routerTx({ from: sender.address, to: freshAccount().address }));
  const legacy = ranked.find((q) => q.chain === 'legacy');
  assert.equal(legacy.feasible, true, show(ranked));
  assert.equal(legacy.maxFeePerGas, undefined, show(legacy));
  assert.equal(BigInt(legacy.costWei), base(legacy.gasLimit) * base(legacy.gasPrice), show(legacy));
  assert.equal(base(legacy.gasPrice), 10n * GWEI, show(legacy));
});

