// Settlement has its own upstream capacity (spec/access.md section 3b): callers' reads count
// against a bound per kind on each chain (chains.<name>.max_caller_reads, here 2), /verify's apart
// from /settle's, and the settlement engine's own requests go over connections of their own. Behind
// a node that takes 400 ms per request, a burst of verifies beyond the bound is answered at once
// HTTP 503 {error: 503} with Retry-After, never a slow timeout; the ones within it are answered;
// and settlements made during the burst succeed, their reads being another budget.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFacilitatorStack, throughProxy, withLogTail, NETWORK } from './lib/stack.mjs';
import { startFilteringProxy } from './lib/bad-upstreams.mjs';
import { expectSettled, expectErrorBody, show } from './lib/expect.mjs';

const BUDGET = 2;
const BURST = 12;
let stack;
let proxy;
const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

before(async () => {
  proxy = await startFilteringProxy({ delayMs: 400 });
  stack = await startFacilitatorStack({
    fundedPayers: 3,
    chainExtra: `max_caller_reads = ${BUDGET}\n`,
    rpcUrlFor: throughProxy(proxy),
  });
});

after(async () => {
  await stack?.stop();
  await proxy?.close();
});

it(`${BURST} concurrent verifies over a budget of ${BUDGET}: the rest answered 503 with Retry-After, and settlements during the burst succeed`, async () => {
  const [a, b, c] = await Promise.all(stack.payers.map((account) => stack.pay({ account })));
  const [verifies, settles] = await Promise.all([
    Promise.all(Array.from({ length: BURST }, () => stack.verify(a.body))),
    Promise.all([b, c].map((p) => stack.settle(p.body))),
  ]);
  const valid = verifies.filter((res) => res.status === 200);
  const busy = verifies.filter((res) => res.status === 503);
  assert.equal(valid.length + busy.length, BURST, `every verify is answered 200 or 503: ${verifies.map(show).join(' | ')}`);
  assert.ok(valid.length >= 1 && valid.length <= BURST - 1, `some within the budget, some over it: ${valid.length} answered`);
  for (const res of valid) assert.equal(res.body?.isValid, true, show(res));
  for (const res of busy) {
    expectErrorBody(res, 503, { error: 503, messageIncludes: ['max_caller_reads'] });
    assert.ok(Number(res.headers.get('retry-after')) >= 1, `Retry-After: ${show(res)}`);
  }
  for (const [res, p] of [[settles[0], b], [settles[1], c]]) {
    expectSettled(res, { network: NETWORK, payer: p.authorization.from });
  }
});
