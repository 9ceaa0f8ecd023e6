// Backpressure: a node that saturates (the proxy refuses requests beyond its capacity with HTTP 503)
// must slow routerd's answers down, not turn payments into 502s. With
// chains.<name>.max_concurrent_requests at the node's capacity, requests beyond it wait their turn
// inside routerd, and a burst of verifies and settles is all answered.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFacilitatorStack, withLogTail } from './lib/stack.mjs';
import { startFilteringProxy } from './lib/bad-upstreams.mjs';
import { TX_HASH } from './lib/expect.mjs';

const CAPACITY = 2;
let stack;
let proxy;
const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

before(async () => {
  proxy = await startFilteringProxy({ capacity: CAPACITY, delayMs: 20 });
  stack = await startFacilitatorStack({
    fundedPayers: 12,
    chainExtra: `max_concurrent_requests = ${CAPACITY}\n`,
    rpcUrlFor: (name, url) => {
      proxy.target = url;
      return proxy.url;
    },
  });
});

after(async () => {
  await stack?.stop();
  await proxy?.close();
});

it(`40 concurrent verifies and 12 concurrent settles through a node that serves ${CAPACITY} requests at once: every one answered, none refused by the node`, async () => {
  const payments = await Promise.all(stack.payers.map((account) => stack.pay({ account })));
  const before = proxy.state.overloaded;
  const verifies = await Promise.all(Array.from({ length: 40 }, (_, i) => stack.verify(payments[i % payments.length].body)));
  for (const res of verifies) assert.equal(res.body?.isValid, true, res.text);
  const settles = await Promise.all(payments.map((p) => stack.settle(p.body)));
  for (const res of settles) {
    assert.equal(res.body?.success, true, res.text);
    assert.match(res.body.transaction, TX_HASH);
  }
  assert.equal(proxy.state.overloaded - before, 0, 'routerd sent the node more requests at once than it allows');
  assert.ok(proxy.state.peak <= CAPACITY, `peak ${proxy.state.peak} requests in flight`);
});
