// Faults (spec/router.md §3: "one chain down never fails a request that another chain can serve"):
// a chain killed mid-test, every chain down, and upstreams that hang, answer garbage or refuse
// connections (with a second URL to fail over to). Timings are never asserted: only that routerd
// answers, and answers correctly.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  startRouterStack, routerTx, withRouterLogTail, DEFAULT_CHAINS, ROUTER_DEFAULTS, GWEI,
} from './lib/router-stack.mjs';
import {
  expectAnswer, expectMinedAsAnswered, expectRpcError, expectRestError, expectChainEntries, show,
} from './lib/router-expect.mjs';
import {
  startHangingUpstream, startGarbageUpstream, deadUpstreamUrl, startFilteringProxy,
} from './lib/bad-upstreams.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { sleep } from './lib/util.mjs';

const CHAIN_ID = Object.fromEntries(DEFAULT_CHAINS.map((c) => [c.name, c.chainId]));
const ALL = DEFAULT_CHAINS.map((c) => c.name);

/** Poll router_chains until `predicate(chains)` holds (health follows the poller, not requests). */
async function waitChains(stack, predicate, what, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  let chains;
  for (;;) {
    chains = await stack.routerChains();
    if (predicate(chains)) return chains;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${show(chains)}`);
    await sleep(100);
  }
}
const byName = (chains) => Object.fromEntries(chains.map((c) => [c.chain, c]));

describe('a chain killed mid-test', () => {
  let stack;
  const it = (name, fn) => test(name, { timeout: 90_000 }, withRouterLogTail(() => stack, fn));

  before(async () => {
    stack = await startRouterStack();
  });
  after(() => stack?.stop());

  it('while every chain is up, a plain transfer goes to the cheapest chain (op)', async () => {
    const sender = await stack.newSender();
    const request = routerTx({ from: sender.address, to: freshAccount().address, value: '1' });
    const answer = await stack.route(request);
    expectAnswer(answer, { chainId: CHAIN_ID.op });
    expectMinedAsAnswered(await stack.signSendAndMine(sender, request, answer), answer);
  });

  it('op stopped: the next call is answered from the others (and mines there); router_chains shows op unhealthy', async () => {
    await stack.chain('op').anvil.stop();

    const sender = await stack.newSender({ on: ['legacy', 'l1'] });
    const request = routerTx({ from: sender.address, to: freshAccount().address, value: '2' });
    const answer = await stack.route(request);
    expectAnswer(answer, { chainId: CHAIN_ID.legacy, type: 'legacy' });
    const mined = await stack.signSendAndMine(sender, request, answer);
    expectMinedAsAnswered(mined, answer);

    const ranked = await stack.quote(request);
    expectChainEntries(ranked, ALL);
    assert.deepEqual(ranked.map((q) => [q.chain, q.feasible]), [['legacy', true], ['l1', true], ['op', false]], show(ranked));
    assert.match(ranked[2].reason, /unreachable/i, show(ranked[2]));

    const chains = byName(await waitChains(stack, (cs) => byName(cs).op?.healthy === false, 'op unhealthy'));
    assert.equal(chains.legacy.healthy, true, show(chains));
    assert.equal(chains.l1.healthy, true, show(chains));
  });

  it('with op down, a sender without funds gets -32000 (not -32603): op unreachable, the others insufficient balance', async () => {
    const sender = freshAccount();
    const error = expectRpcError(
      await stack.rpc('eth_routerTransaction', [routerTx({ from: sender.address, to: freshAccount().address, value: '1' })]),
      { code: -32000 },
    );
    expectChainEntries(error.data, ALL);
    const reasons = Object.fromEntries(error.data.map((e) => [e.chain, e.reason]));
    assert.match(reasons.op, /unreachable/i, show(error.data));
    assert.match(reasons.legacy, /insufficient/i, show(error.data));
    assert.match(reasons.l1, /insufficient/i, show(error.data));
  });

  it('every chain down: -32603 with every chain unreachable in error.data (REST: 400), and routerd keeps serving', async () => {
    await Promise.all(['legacy', 'l1'].map((n) => stack.chain(n).anvil.stop()));
    const request = routerTx({ from: freshAccount().address, to: freshAccount().address });
    const error = expectRpcError(await stack.rpc('eth_routerTransaction', [request]), { code: -32603 });
    expectChainEntries(error.data, ALL);
    for (const entry of error.data) {
      assert.equal(entry.feasible, false, show(entry));
      assert.match(entry.reason, /unreachable/i, show(entry));
    }
    const rest = expectRestError(await stack.post('/', request), { status: 400, code: -32603 });
    expectChainEntries(rest.data, ALL);
    // router_quote still answers (every chain infeasible), and so do the operator routes.
    const ranked = await stack.quote(request);
    assert.ok(ranked.every((q) => !q.feasible), show(ranked));
    assert.equal((await fetch(`${stack.url}/health`)).status, 200);
    await waitChains(stack, (cs) => cs.every((c) => c.healthy === false), 'every chain unhealthy');
    assert.ok(stack.routerd.running);
  });
});

describe('upstreams that hang, answer garbage or refuse connections', () => {
  let stack;
  let hanging;
  let garbage;
  const it = (name, fn) => test(name, { timeout: 90_000 }, withRouterLogTail(() => stack, fn));

  before(async () => {
    hanging = await startHangingUpstream();
    garbage = await startGarbageUpstream();
    const dead = await deadUpstreamUrl();
    const [op, legacy, l1] = DEFAULT_CHAINS;
    stack = await startRouterStack({
      chains: [
        // The cheapest chain is reached through its second URL: the first refuses connections.
        { ...op, rpcUrlsFor: (url) => [dead, url] },
        // The second chain's first URL hangs: its request timeout (well under chain_timeout_ms)
        // moves on to the second URL.
        { ...legacy, rpcUrlsFor: (url) => [hanging.url, url], requestTimeoutMs: 400 },
        l1,
        // Preferred kind (l2) chains that never answer usefully. The hung one's request timeout is
        // above chain_timeout_ms, so the router's own bound is what cuts it off.
        { name: 'stuck', chainId: 903, kind: 'l2', feeModel: 'auto', rpcUrls: [hanging.url], requestTimeoutMs: 4000 },
        { name: 'garbage', chainId: 904, kind: 'l2', feeModel: 'auto', rpcUrls: [garbage.url] },
      ],
      router: { chainTimeoutMs: ROUTER_DEFAULTS.chainTimeoutMs },
    });
  });
  after(async () => {
    await stack?.stop();
    await hanging?.close();
    await garbage?.close();
  });

  it('a call is answered from the working chains (op and legacy through their second URLs); hung and garbage chains unreachable', async () => {
    const sender = await stack.newSender({ on: ['op', 'legacy', 'l1'] });
    const request = routerTx({ from: sender.address, to: freshAccount().address, value: '3' });
    const answer = await stack.route(request);
    expectAnswer(answer, { chainId: CHAIN_ID.op, type: 'eip1559' });
    expectMinedAsAnswered(await stack.signSendAndMine(sender, request, answer), answer);

    const ranked = await stack.quote(request);
    expectChainEntries(ranked, [...ALL, 'stuck', 'garbage']);
    assert.deepEqual(ranked.slice(0, 3).map((q) => [q.chain, q.feasible]), [['op', true], ['legacy', true], ['l1', true]], show(ranked));
    const reasons = Object.fromEntries(ranked.map((q) => [q.chain, q]));
    for (const name of ['stuck', 'garbage']) {
      assert.equal(reasons[name].feasible, false, show(reasons[name]));
      assert.match(reasons[name].reason, /unreachable/i, show(reasons[name]));
    }
  });

  it('router_chains: the failed-over chains are healthy, the hung and garbage ones are not', async () => {
    const chains = byName(await stack.routerChains());
    assert.equal(chains.op.healthy, true, show(chains));
    assert.equal(chains.legacy.healthy, true, show(chains));
    assert.equal(chains.stuck.healthy, false, show(chains));
    assert.equal(chains.garbage.healthy, false, show(chains));
  });

  it('repeated calls keep being answered (the refused URL cools down, the hung chain never blocks)', async () => {
    const sender = await stack.newSender({ on: ['op', 'legacy', 'l1'] });
    for (let i = 0; i < 4; i += 1) {
      const answer = await stack.route(routerTx({ from: sender.address, to: freshAccount().address }));
      expectAnswer(answer, { chainId: CHAIN_ID.op });
      assert.equal(Number(BigInt(answer.nonce)), i, show(answer));
    }
    // ...and so does the chain behind the hanging URL.
    const legacyOnly = await stack.newSender({ on: ['legacy'] });
    const request = routerTx({ from: legacyOnly.address, to: freshAccount().address });
    const answer = await stack.route(request);
    expectAnswer(answer, { chainId: CHAIN_ID.legacy, type: 'legacy' });
    expectMinedAsAnswered(await stack.signSendAndMine(legacyOnly, request, answer), answer);
  });
});

describe('an upstream without eth_maxPriorityFeePerGas', () => {
  const TIP = 5n * GWEI; // what every recent block paid its proposer
  let stack;
  let proxy;
  const it = (name, fn) => test(name, { timeout: 90_000 }, withRouterLogTail(() => stack, fn));

  before(async () => {
    proxy = await startFilteringProxy({ blocked: ['eth_maxPriorityFeePerGas'] });
    const l1 = DEFAULT_CHAINS.find((c) => c.name === 'l1');
    stack = await startRouterStack({
      chains: [{ ...l1, rpcUrlsFor: (url) => { proxy.target = url; return [proxy.url]; } }],
    });
  });
  after(async () => {
    await stack?.stop();
    await proxy?.close();
  });

  it('the priority fee comes from eth_feeHistory, and the answer mines', async () => {
    // Five blocks whose transactions all tip TIP: any fee-history summary of them is TIP.
    const tipper = await stack.newSender({ on: ['l1'] });
    const l1 = stack.chain('l1');
    for (let nonce = 0; nonce < 5; nonce += 1) {
      const raw = await tipper.signTransaction({
        chainId: l1.chainId, type: 'eip1559', nonce, gas: 21_000n, maxFeePerGas: 500n * GWEI, maxPriorityFeePerGas: TIP,
        to: freshAccount().address, value: 1n,
      });
      const hash = await l1.anvil.rpc('eth_sendRawTransaction', [raw]);
      assert.equal((await stack.waitReceipt('l1', hash)).status, '0x1');
    }
    const history = await l1.anvil.rpc('eth_feeHistory', ['0x5', 'latest', [50]]);
    assert.ok(history.reward.every(([r]) => BigInt(r) === TIP), `fee history: ${show(history)}`);
    await stack.waitHeadSynced('l1');

    const sender = await stack.newSender({ on: ['l1'] });
    const request = routerTx({ from: sender.address, to: freshAccount().address, value: '1' });
    const answer = await stack.route(request);
    expectAnswer(answer, { chainId: CHAIN_ID.l1, type: 'eip1559' });
    assert.ok(proxy.state.blockedCalls > 0, 'routerd never asked eth_maxPriorityFeePerGas');
    assert.equal(BigInt(answer.maxPriorityFeePerGas), TIP, `priority fee not from fee history: ${show(answer)}`);
    const baseFee = BigInt((await l1.anvil.rpc('eth_getBlockByNumber', ['latest', false])).baseFeePerGas);
    assert.equal(BigInt(answer.maxFeePerGas), 2n * baseFee + TIP, show(answer));
    expectMinedAsAnswered(await stack.signSendAndMine(sender, request, answer), answer);
  });
});

// A node that cannot run a call (anvil mid-reorganisation, a rate-limited provider) answers an
// error that says nothing about the transaction. It must read as that chain being unreachable:
// neither as a revert (a wallet told "it would fail") nor as a zero L1 fee (a chain priced below
// its cost, with a balance check that leaves the L1 fee out).
describe('a node that fails a call without running it', () => {
  const ORACLE = '0x420000000000000000000000000000000000000f';
  const estimates = (call) => call?.method === 'eth_estimateGas';
  const l1FeeReads = (call) => call?.method === 'eth_call' && call.params?.[0]?.to?.toLowerCase() === ORACLE;
  let stack;
  const proxies = {};
  const it = (name, fn) => test(name, { timeout: 90_000 }, withRouterLogTail(() => stack, async () => {
    try {
      await fn();
    } finally {
      for (const proxy of Object.values(proxies)) proxy.state.failing = null;
    }
  }));

  before(async () => {
    for (const chain of DEFAULT_CHAINS) proxies[chain.name] = await startFilteringProxy();
    stack = await startRouterStack({
      chains: DEFAULT_CHAINS.map((chain) => ({
        ...chain,
        rpcUrlsFor: (url) => { proxies[chain.name].target = url; return [proxies[chain.name].url]; },
      })),
    });
  });
  after(async () => {
    await stack?.stop();
    await Promise.all(Object.values(proxies).map((p) => p.close()));
  });

  /** Routes a transfer that op (the cheapest) cannot be asked about: it must go to legacy and mine. */
  async function routedPastOp(what) {
    const sender = await stack.newSender();
    const request = routerTx({ from: sender.address, to: freshAccount().address, value: '1' });
    const answer = await stack.route(request);
    expectAnswer(answer, { chainId: CHAIN_ID.legacy, type: 'legacy' });
    const ranked = await stack.quote(request);
    expectChainEntries(ranked, ALL);
    const op = ranked.find((q) => q.chain === 'op');
    assert.equal(op.feasible, false, show(ranked));
    assert.match(op.reason, /unreachable/i, show(op));
    assert.match(op.reason, what, show(op));
    assert.doesNotMatch(op.reason, /revert/i, show(op));
    expectMinedAsAnswered(await stack.signSendAndMine(sender, request, answer), answer);
  }

  it("op's eth_estimateGas fails: op is unreachable, not reverted, and the call goes to the next cheapest", async () => {
    proxies.op.state.failing = estimates;
    await routedPastOp(/eth_estimateGas/);
  });

  it("op's GasPriceOracle.getL1Fee fails: op is unreachable, not priced without its L1 fee", async () => {
    proxies.op.state.failing = l1FeeReads;
    await routedPastOp(/getL1Fee/);
  });

  it('every estimate fails: -32603 with every chain unreachable; once they answer, a real revert and an out-of-gas halt are -32000', async () => {
    for (const proxy of Object.values(proxies)) proxy.state.failing = estimates;
    const sender = await stack.newSender();
    const transfer = routerTx({ from: sender.address, to: freshAccount().address, value: '1' });
    const error = expectRpcError(await stack.rpc('eth_routerTransaction', [transfer]), { code: -32603 });
    expectChainEntries(error.data, ALL);
    for (const entry of error.data) assert.match(entry.reason, /unreachable: eth_estimateGas/i, show(entry));

    for (const proxy of Object.values(proxies)) proxy.state.failing = null;
    // Creation code that reverts (PUSH1 0 PUSH1 0 REVERT), and creation code that loops until
    // it runs out of gas (JUMPDEST PUSH1 0 JUMP): the nodes ran both, and both fail everywhere.
    for (const [data, reason] of [['0x60006000fd', /revert/i], ['0x5b600056', /gas/i]]) {
      const request = routerTx({ from: sender.address, to: '', data });
      const failed = expectRpcError(await stack.rpc('eth_routerTransaction', [request]), { code: -32000 });
      expectChainEntries(failed.data, ALL);
      for (const entry of failed.data) {
        assert.match(entry.reason, /^reverted/i, show(entry));
        assert.match(entry.reason, reason, show(entry));
      }
    }
  });
});
