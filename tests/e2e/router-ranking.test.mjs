// Ranking rules (spec/router.md §3.3-3.4): cost converted with each chain's native_price; ties go to
// router.prefer's order of kinds. Three identical legacy-fee chains (same gas price, so the same wei
// cost for the same call) of kinds l1, l3 and l2, the l2 one with native_price 3.0.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startRouterStack, routerTx, withRouterLogTail, GWEI } from './lib/router-stack.mjs';
import { expectAnswer, expectMinedAsAnswered, show } from './lib/router-expect.mjs';
import { freshAccount } from './lib/accounts.mjs';

const legacyAnvil = { hardfork: 'berlin', extraArgs: ['--gas-price', String(10n * GWEI)] };
const CHAINS = [
  { name: 'alpha', chainId: 910, kind: 'l1', feeModel: 'auto', anvil: legacyAnvil },
  { name: 'beta', chainId: 911, kind: 'l3', feeModel: 'auto', anvil: legacyAnvil },
  { name: 'gamma', chainId: 912, kind: 'l2', feeModel: 'auto', anvil: legacyAnvil, nativePrice: 3.0 },
];

let stack;
let sender;
const it = (name, fn) => test(name, { timeout: 90_000 }, withRouterLogTail(() => stack, fn));

before(async () => {
  stack = await startRouterStack({ chains: CHAINS }); // prefer = ["l2", "l1", "l3"]
  sender = await stack.newSender();
});
after(() => stack?.stop());

const request = () => routerTx({ from: sender.address, to: freshAccount().address });
const byChain = (ranked) => Object.fromEntries(ranked.map((q) => [q.chain, q]));

it('cost is the wei cost times native_price: the same call costs 3x on the chain whose native token is worth 3x', async () => {
  const q = byChain(await stack.quote(request()));
  assert.equal(q.alpha.costWei, q.gamma.costWei, show(q));
  assert.equal(q.gamma.cost, q.alpha.cost * 3, show(q));
  assert.equal(q.alpha.cost, Number(BigInt(q.alpha.costWei)), show(q));
});

it('equal costs go to router.prefer order of kinds (l1 before l3), on every call, whatever the latencies', async () => {
  for (let i = 0; i < 8; i += 1) {
    const ranked = await stack.quote(request());
    assert.deepEqual(ranked.map((q) => q.chain), ['alpha', 'beta', 'gamma'], show(ranked));
    assert.equal(ranked[0].cost, ranked[1].cost, show(ranked));
  }
  const req = routerTx({ from: (await stack.newSender()).address, to: freshAccount().address });
  const answer = await stack.route(req);
  expectAnswer(answer, { chainId: 910, type: 'legacy' });
});

it('a preferred kind does not beat a cheaper chain: l2 (gamma) loses on cost', async () => {
  const ranked = await stack.quote(request());
  assert.equal(ranked[2].chain, 'gamma', show(ranked));
  assert.ok(ranked[2].cost > ranked[0].cost, show(ranked));
});

it('another prefer order (l3, l1, l2) breaks the same tie the other way', async () => {
  const other = await stack.extraRouterd({ router: { prefer: ['l3', 'l1', 'l2'] } });
  const ranked = await other.quote(request());
  assert.deepEqual(ranked.map((q) => q.chain), ['beta', 'alpha', 'gamma'], show(ranked));
  const s = await stack.newSender();
  const req = routerTx({ from: s.address, to: freshAccount().address });
  const answer = await other.route(req);
  expectAnswer(answer, { chainId: 911, type: 'legacy' });
  expectMinedAsAnswered(await stack.signSendAndMine(s, req, answer), answer);
});

it('a lower native_price makes the least preferred kind the cheapest, and it wins', async () => {
  const other = await stack.extraRouterd({ chains: { beta: { nativePrice: 0.5 } } });
  const ranked = await other.quote(request());
  assert.equal(ranked[0].chain, 'beta', show(ranked));
  assert.equal(ranked[0].cost * 2, byChain(ranked).alpha.cost, show(ranked));
  // With every native_price equal, the l2 chain is preferred on the tie.
  const equal = await stack.extraRouterd({ chains: { gamma: { nativePrice: 1.0 } } });
  assert.deepEqual((await equal.quote(request())).map((q) => q.chain), ['gamma', 'alpha', 'beta']);
});
