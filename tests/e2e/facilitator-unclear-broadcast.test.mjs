// An unclear broadcast is not a failure (spec/access.md section 2): when the node answers
// eth_sendRawTransaction with an error that is not a clear refusal (a JSON-RPC "internal error",
// an HTTP 502) it may have taken the transaction all the same. The payment stays `sent` and is
// answered by what the chain shows: v2 `settlement_pending` with the hash (v1 HTTP 400
// {error: 504}) while unmined, then success with the hash that moved the funds; its signer nonce
// is not handed to a self-transfer meanwhile.
//
// anvil --no-mining behind a proxy (lib/hostile.mjs startUnclearProxy) that forwards every
// request to the node, and answers the broadcasts of chosen payments with an error after the node
// took them. Without the rule, the error would be read as a refusal: the payment answered
// "the node refused the settlement transaction" at once, while its transaction, still in the
// pool, moves the funds at the next block.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { keccak256, parseTransaction } from 'viem';
import { startFacilitatorStack, throughProxy, withLogTail, NETWORK, CHAIN_ID } from './lib/stack.mjs';
import { expectSettled, expectSettleFailed, expectDuplicate } from './lib/expect.mjs';
import { chainMark, expectCleanSignerHistory, expectTransfersAuthorization, waitPoolEmpty } from './lib/chain-audit.mjs';
import { waitInPool, isPending, hashInMessage } from './lib/settling.mjs';
import { startUnclearProxy } from './lib/hostile.mjs';
import { idempotencyKey, sleep } from './lib/util.mjs';

const CAIP2 = `eip155:${CHAIN_ID}`;
const PRICE = 1000n;
const INTERNAL_ERROR = { rpc: { code: -32603, message: 'internal error' } };
const BAD_GATEWAY = { http: 502 };

let stack;
let proxy;
/** What the proxy answers, after forwarding it, to a broadcast of the current payment. */
let fault = () => null;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  proxy = await startUnclearProxy({
    fail: (call) => (call.method === 'eth_sendRawTransaction' ? fault(call.params[0]) : null),
  });
  stack = await startFacilitatorStack({
    anvil: { noMining: true },
    fundedPayers: 2,
    routerd: { x402Versions: [1, 2], settleTimeoutSecs: 2 },
    rpcUrlFor: throughProxy(proxy),
  });
});

after(async () => {
  await stack?.stop();
  await proxy?.close();
});

/** Whether raw transaction `raw` carries payment `p` (its authorization nonce is in the calldata). */
const carries = (raw, p) => (parseTransaction(raw).data ?? '').toLowerCase().includes(p.authorization.nonce.slice(2).toLowerCase());

/**
 * The broadcast of payment `p` answered with `answer` after the node took it; `settle(key)` is
 * asked while the block is held back (the pending answer, naming the transaction in the pool),
 * and again with the same key once a block is mined: the success, by that transaction. One
 * transaction, no self-transfer, nothing else sent.
 */
async function expectAnsweredByTheChain(p, answer, { settle, expectPending, wire }) {
  const mark = await chainMark(stack.anvil, stack.signer);
  const payeeBefore = await stack.balanceOf(p.authorization.to);
  const failedBefore = proxy.state.failed.length;
  fault = (raw) => (carries(raw, p) ? answer : null);
  const key = idempotencyKey();
  try {
    const first = await settle(key);
    const tx = await waitInPool(stack, p);
    assert.ok(proxy.state.failed.length > failedBefore, 'the node took the broadcast and answered an error');
    expectPending(first, tx.hash);
    const status = (await stack.settlementStatus(p)).body;
    assert.equal(status.state, 'sent', `still followed, not given up: ${JSON.stringify(status)}`);
    assert.equal(status.outcome ?? null, null, JSON.stringify(status));

    // Blocks come (the first mines the settlement), and routerd follows them.
    for (let i = 0; i < 3; i += 1) {
      await stack.anvil.mine();
      await sleep(300);
    }
    const hash = expectSettled(await settle(key), { network: wire, payer: p.authorization.from });
    assert.equal(hash, tx.hash, 'the success names the transaction the node took');
    expectTransfersAuthorization((await stack.receipt(hash)).logs, stack.usdc, p.authorization, hash);
    assert.equal(await stack.balanceOf(p.authorization.to), payeeBefore + PRICE, 'the payee was paid once');
    await waitPoolEmpty(stack.anvil);
    const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
    assert.deepEqual(history.all.map((t) => t.hash), [hash], 'one transaction, no self-transfer');
    return hash;
  } finally {
    fault = () => null;
  }
}

it('v2: the node takes the settlement and answers "internal error": settlement_pending with the hash, then success by it', async () => {
  const p = await stack.payV2({ account: stack.payers[0], amount: PRICE });
  const payer = p.authorization.from;
  const hash = await expectAnsweredByTheChain(p, INTERNAL_ERROR, {
    settle: (key) => stack.settle(p.v2, { key }),
    expectPending: (res, hash) => expectSettleFailed(res, 'settlement_pending', { network: CAIP2, payer, transaction: hash }),
    wire: CAIP2,
  });
  expectDuplicate(await stack.settle(p.v2), { network: CAIP2, payer, version: 2, transaction: hash });
});

it('v1: the node takes the settlement and answers HTTP 502: {error: 504} with the hash, then success by it', async () => {
  const p = await stack.pay({ account: stack.payers[1], amount: PRICE });
  const hash = await expectAnsweredByTheChain(p, BAD_GATEWAY, {
    settle: (key) => stack.settle(p.body, { key }),
    expectPending: (res, hash) => {
      assert.ok(isPending(res), `the pending answer: HTTP ${res.status} ${res.text}`);
      assert.equal(hashInMessage(res.body.message), hash);
    },
    wire: NETWORK,
  });
  expectDuplicate(await stack.settle(p.body), { network: NETWORK, payer: p.authorization.from, transaction: hash });
  assert.equal(keccak256(proxy.state.failed.at(-1).params[0]), hash, 'the broadcast answered 502 was that transaction');
});
