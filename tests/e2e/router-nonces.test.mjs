// Nonce reservations (spec/router.md §4): the chain's pending nonce unless this daemon recently
// handed one out for the same (chain, from), then the next; reservations are durable (flushed
// before the answer: they survive SIGKILL), per chain, give way when the chain moves past them, and
// expire after router.nonce_reservation_ttl_secs so an unused one never blocks a sender for long.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startRouterStack, routerTx, withRouterLogTail, DEFAULT_CHAINS } from './lib/router-stack.mjs';
import { expectAnswer, expectMinedAsAnswered, show } from './lib/router-expect.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { sleep } from './lib/util.mjs';

const CHAIN_ID = Object.fromEntries(DEFAULT_CHAINS.map((c) => [c.name, c.chainId]));
const nonceOf = (answer) => Number(BigInt(answer.nonce));

describe('reservations', () => {
  let stack;
  const it = (name, fn) => test(name, { timeout: 90_000 }, withRouterLogTail(() => stack, fn));
  before(async () => {
    stack = await startRouterStack();
  });
  after(() => stack?.stop());

  it('survive routerd being SIGKILLed: the restarted daemon hands out the next nonce, and all of them mine', async () => {
    const sender = await stack.newSender();
    const requests = Array.from({ length: 3 }, (_, i) => routerTx({ from: sender.address, to: freshAccount().address, value: String(i + 1) }));
    const answers = [await stack.route(requests[0]), await stack.route(requests[1])];
    await stack.routerd.kill();
    await stack.routerd.start();
    await stack.waitHealthy(DEFAULT_CHAINS.map((c) => c.name));
    answers.push(await stack.route(requests[2]));
    assert.deepEqual(answers.map(nonceOf), [0, 1, 2], show(answers));
    for (const [i, answer] of answers.entries()) {
      expectAnswer(answer, { chainId: CHAIN_ID.op });
      expectMinedAsAnswered(await stack.signSendAndMine(sender, requests[i], answer), answer);
    }
  });

  it('give way to the chain: when the sender\'s pending nonce moves past the reservation, the chain\'s nonce is answered', async () => {
    const sender = await stack.newSender();
    const first = await stack.route(routerTx({ from: sender.address, to: freshAccount().address }));
    assert.equal(nonceOf(first), 0, show(first));
    // The sender sends three transactions on op without asking routerd (nonces 0, 1, 2).
    for (let nonce = 0; nonce < 3; nonce += 1) {
      const answer = { ...first, nonce: `0x${nonce.toString(16)}` };
      expectMinedAsAnswered(await stack.signSendAndMine(sender, routerTx({ from: sender.address, to: freshAccount().address }), answer), answer);
    }
    assert.equal(await stack.pendingNonce('op', sender.address), 3);
    const next = await stack.route(routerTx({ from: sender.address, to: freshAccount().address }));
    assert.equal(nonceOf(next), 3, `expected the chain's pending nonce: ${show(next)}`);
  });

  it('are per chain: a reservation on op does not move the nonce answered on legacy', async () => {
    const sender = await stack.newSender({ on: ['op', 'legacy'] });
    const onOp = [await stack.route(routerTx({ from: sender.address, to: freshAccount().address })),
      await stack.route(routerTx({ from: sender.address, to: freshAccount().address }))];
    assert.deepEqual(onOp.map((a) => [Number(BigInt(a.chainId)), nonceOf(a)]), [[CHAIN_ID.op, 0], [CHAIN_ID.op, 1]], show(onOp));
    // Take the sender's funds on op away: the next call goes to legacy, where nothing is reserved.
    await stack.fund(sender.address, { on: ['op'], amount: 0n });
    const request = routerTx({ from: sender.address, to: freshAccount().address });
    const onLegacy = await stack.route(request);
    expectAnswer(onLegacy, { chainId: CHAIN_ID.legacy, type: 'legacy' });
    assert.equal(nonceOf(onLegacy), 0, show(onLegacy));
    expectMinedAsAnswered(await stack.signSendAndMine(sender, request, onLegacy), onLegacy);
  });

  it('are per sender: another sender\'s calls do not move this sender\'s nonce', async () => {
    const a = await stack.newSender();
    const b = await stack.newSender();
    const answers = [];
    for (const s of [a, b, a, b, a]) answers.push(await stack.route(routerTx({ from: s.address, to: freshAccount().address })));
    assert.deepEqual(answers.map(nonceOf), [0, 0, 1, 1, 2], show(answers));
  });
});

describe('an unused reservation expires after nonce_reservation_ttl_secs', () => {
  const TTL_SECS = 2;
  let stack;
  const it = (name, fn) => test(name, { timeout: 90_000 }, withRouterLogTail(() => stack, fn));
  before(async () => {
    stack = await startRouterStack({ router: { nonceReservationTtlSecs: TTL_SECS } });
  });
  after(() => stack?.stop());

  it('after the TTL the chain\'s pending nonce is answered again, and that answer mines', async () => {
    const sender = await stack.newSender();
    const unused = [await stack.route(routerTx({ from: sender.address, to: freshAccount().address })),
      await stack.route(routerTx({ from: sender.address, to: freshAccount().address }))];
    assert.deepEqual(unused.map(nonceOf), [0, 1], show(unused));
    // Never sent. Wait out the TTL (whole seconds, plus a margin for the second boundary).
    await sleep((TTL_SECS + 1.5) * 1000);
    const request = routerTx({ from: sender.address, to: freshAccount().address });
    const answer = await stack.route(request);
    assert.equal(nonceOf(answer), 0, `an expired reservation still blocks the sender: ${show(answer)}`);
    expectMinedAsAnswered(await stack.signSendAndMine(sender, request, answer), answer);
  });
});
