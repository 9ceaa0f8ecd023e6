// Backpressure: a node that saturates (the proxy refuses requests beyond its capacity with HTTP 503)
// must slow routerd's answers down, not turn payments into 502s. With
// chains.<name>.max_concurrent_requests at the node's capacity, requests beyond it wait their turn
// inside routerd, and a burst of verifies and settles is all answered. Small batches that wait
// together share one HTTP request, and each caller still gets its own answers. A node with a batch
// limit gets no larger batch from routerd's own work either (a block's receipts, broadcasts). A
// connection the node closes with a request on it and no answer is tried again on a new one.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFacilitatorStack, throughProxy, withLogTail } from './lib/stack.mjs';
import { startFilteringProxy } from './lib/bad-upstreams.mjs';
import { TX_HASH, expectValid, expectInvalid } from './lib/expect.mjs';
import { freshAccount } from './lib/accounts.mjs';

const CAPACITY = 2;
const MAX_BATCH_CALLS = 8;
let stack;
let proxy;
const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

before(async () => {
  proxy = await startFilteringProxy({ capacity: CAPACITY, delayMs: 20 });
  stack = await startFacilitatorStack({
    fundedPayers: 12,
    chainExtra: `max_concurrent_requests = ${CAPACITY}\nmax_batch_calls = ${MAX_BATCH_CALLS}\n`,
    rpcUrlFor: throughProxy(proxy),
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

it(`48 concurrent verifies, funded and unfunded payers interleaved, share HTTP requests of at most ${MAX_BATCH_CALLS} calls and lens calls, and each gets its own answer`, async () => {
  const funded = await Promise.all(stack.payers.map((account) => stack.pay({ account, amount: 7n })));
  const unfunded = await Promise.all(Array.from({ length: 24 }, () => stack.pay({ account: freshAccount() })));
  const payments = Array.from({ length: 48 }, (_, i) => (i % 2 === 0 ? { p: funded[(i / 2) % funded.length], ok: true } : { p: unfunded[(i - 1) / 2], ok: false }));
  const sentBefore = proxy.state.requests.length;
  const answers = await Promise.all(payments.map(({ p }) => stack.verify(p.body)));
  answers.forEach((res, i) => {
    const { p, ok } = payments[i];
    if (ok) expectValid(res, { payer: p.authorization.from });
    else expectInvalid(res, 'insufficient_funds', { payer: p.authorization.from });
  });
  const requests = proxy.state.requests.slice(sentBefore);
  // Verifies that go out together share their lens read too: one factsEach eth_call for several.
  const lensCalls = requests.flat().filter((m) => m === 'eth_call').length;
  assert.ok(lensCalls < 48, `${lensCalls} eth_calls for 48 verifies: ${JSON.stringify(requests)}`);
  // The node serves two requests at once for 20 ms each: the verifies that arrive meanwhile wait
  // in routerd and go out together.
  const carrying = requests.filter((methods) => methods.includes('eth_call'));
  assert.ok(carrying.length <= 24, `48 verifies took ${carrying.length} HTTP requests`);
  for (const methods of carrying) assert.ok(methods.length <= MAX_BATCH_CALLS, `${methods.length} calls in one request, over max_batch_calls`);
});

it(`12 settlements in one block through a node that refuses batches of more than ${MAX_BATCH_CALLS} calls: the block's receipts are read in requests of at most ${MAX_BATCH_CALLS}, and all 12 are answered`, async () => {
  const payments = await Promise.all(stack.payers.map((account) => stack.pay({ account, amount: 3n })));
  const mine = (method, params) => stack.anvil.rpc(method, params);
  const sentBefore = proxy.state.requests.length;
  proxy.state.maxBatch = MAX_BATCH_CALLS;
  proxy.state.capacity = Infinity;
  await mine('evm_setAutomine', [false]);
  try {
    const settles = payments.map((p) => stack.settle(p.body));
    // Every settlement broadcast before the block that takes them all.
    await waitForPending(mine, payments.length);
    await mine('evm_mine', []);
    const answers = await Promise.all(settles);
    for (const res of answers) {
      assert.equal(res.body?.success, true, res.text);
      assert.match(res.body.transaction, TX_HASH);
    }
    const blocks = new Set(await Promise.all(answers.map(async (res) => (await stack.receipt(res.body.transaction)).blockNumber)));
    assert.equal(blocks.size, 1, 'the 12 settlements share one block');
    assert.equal(proxy.state.tooLarge, 0, 'routerd sent the node a batch over its limit');
    const largest = Math.max(...proxy.state.requests.slice(sentBefore).map((methods) => methods.length));
    assert.ok(largest <= MAX_BATCH_CALLS, `a request of ${largest} calls`);
  } finally {
    proxy.state.maxBatch = null;
    proxy.state.capacity = CAPACITY;
    await mine('evm_setAutomine', [true]);
  }
});

async function waitForPending(mine, n) {
  for (let i = 0; i < 200; i += 1) {
    const pool = await mine('txpool_status', []);
    if (Number(pool.pending) >= n) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`fewer than ${n} transactions reached the pool`);
}

it('a connection closed by the node with the request on it and no answer: the request is sent again on a new connection, and the verify and the settle are answered', async () => {
  const [payment] = await Promise.all([stack.pay({ account: stack.payers[0], amount: 5n })]);
  proxy.state.dropNext = 1;
  const verified = await stack.verify(payment.body);
  expectValid(verified);
  assert.equal(proxy.state.dropped, 1, 'the node closed one connection without answering');
  proxy.state.dropNext = 1;
  const settled = await stack.settle(payment.body);
  assert.equal(settled.body?.success, true, settled.text);
  assert.match(settled.body.transaction, TX_HASH);
  assert.equal(proxy.state.dropped, 2);
});
