// Nobody stalls a lane (spec/access.md section 3): a settlement transaction that the node refuses
// at broadcast for a reason other than its nonce ("nonce too low"), "already known", its price
// ("underpriced") or the signer's funds ("insufficient funds") does not hold its signer nonce: the
// payment is answered HTTP 200 {success: false, errorReason: "invalid_payload", errorMessage: "the
// node refused the settlement transaction", transaction: ""}, a 0-value self-transfer from the
// signer to itself takes that nonce, and the next honest payment on the lane settles within a few
// blocks.
//
// anvil --block-time 1 behind a proxy (lib/hostile.mjs) whose policy refuses chosen
// eth_sendRawTransaction calls with {code: -32000, message: "transaction rejected by policy"},
// unforwarded, alone or inside a JSON-RPC batch (each element answered on its own), and refuses the
// same raw transaction every time it is sent again. Without the rule, the refused settlement
// would keep its nonce: it is sent again and again, every later settlement of the lane waits
// behind it, and the callers get the 504 pending answer at settle_timeout_secs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress, keccak256, parseTransaction } from 'viem';
import { startFacilitatorStack, throughProxy, withLogTail, NETWORK } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { expectSettled, expectSettleFailed } from './lib/expect.mjs';
import { chainMark, expectCleanSignerHistory, expectTransfersAuthorization, waitPoolEmpty } from './lib/chain-audit.mjs';
import { waitFor } from './lib/util.mjs';
import { startRefusingProxy } from './lib/hostile.mjs';

const PRICE = 1000n;
const SETTLE_TIMEOUT_SECS = 20;
const PROMPT_BLOCKS = 4; // "within a few blocks" on a 1 s chain
const POLICY = { code: -32000, message: 'transaction rejected by policy' };
const REFUSED_MESSAGE = 'the node refused the settlement transaction';

let stack;
let proxy;
/** Raw transactions the policy refuses (by hash): refused every time they are sent. */
const banned = new Set();
/** Decides, for a raw transaction not banned yet, whether to ban it now. */
let ban = () => false;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  proxy = await startRefusingProxy({
    refuse: (call) => {
      if (call.method !== 'eth_sendRawTransaction') return null;
      const raw = call.params[0];
      const hash = keccak256(raw);
      if (!banned.has(hash) && ban(raw)) banned.add(hash);
      return banned.has(hash) ? POLICY : null;
    },
  });
  stack = await startFacilitatorStack({
    anvil: { blockTime: 1 },
    fundedPayers: 8,
    routerd: { settleTimeoutSecs: SETTLE_TIMEOUT_SECS },
    rpcUrlFor: throughProxy(proxy),
  });
});

after(async () => {
  await stack?.stop();
  await proxy?.close();
});

let nextPayer = 0;
const payment = () => {
  const account = stack.payers[nextPayer];
  nextPayer += 1;
  return stack.pay({ account, payTo: freshAccount().address, amount: PRICE });
};
const blockNumber = async () => Number(await stack.anvil.rpc('eth_blockNumber'));
/** The refused calls' transactions, parsed, with their hashes. */
const refusedTxs = () => proxy.state.refused.map((c) => ({ hash: keccak256(c.params[0]), ...parseTransaction(c.params[0]) }));
/** Whether raw transaction `raw` carries payment `p` (its authorization nonce is in the calldata). */
const carries = (raw, p) => (parseTransaction(raw).data ?? '').toLowerCase().includes(p.authorization.nonce.slice(2).toLowerCase());

/** Settle `p` and expect the refusal answer, promptly (long before settle_timeout_secs). */
async function expectRefusedByTheNode(res, p, startedAt) {
  expectSettleFailed(res, 'invalid_payload', { network: NETWORK, payer: getAddress(p.authorization.from) });
  assert.equal(res.body.errorMessage, REFUSED_MESSAGE, res.text);
  const took = Date.now() - startedAt;
  assert.ok(took < (SETTLE_TIMEOUT_SECS * 1000) / 2, `answered after ${took} ms, not held until settle_timeout_secs`);
}

/** An honest payment is answered success within PROMPT_BLOCKS blocks; returns its hash. */
async function expectSettlesPromptly(p) {
  const from = await blockNumber();
  const hash = expectSettled(await stack.settle(p.body), { network: NETWORK, payer: p.authorization.from });
  const took = (await blockNumber()) - from;
  assert.ok(took <= PROMPT_BLOCKS, `the next payment was answered ${took} blocks after it was sent`);
  return hash;
}

it('the first settlement broadcast is refused by the node: answered as failed at once, a self-transfer takes its nonce, the next payment settles promptly', async () => {
  const p = await payment();
  const mark = await chainMark(stack.anvil, stack.signer);
  const payerBefore = await stack.balanceOf(p.authorization.from);
  ban = (raw) => carries(raw, p);

  const startedAt = Date.now();
  const res = await stack.settle(p.body);
  await expectRefusedByTheNode(res, p, startedAt);
  const [refused] = refusedTxs();
  assert.ok(refused, 'the node was asked to take the settlement and refused it');
  assert.equal(refused.nonce, mark.nonce, 'the refused settlement held the next signer nonce');
  assert.equal(await stack.balanceOf(p.authorization.from), payerBefore, 'the payer paid nothing');

  // The lane goes on: the next payment settles within a few blocks, after the filled nonce.
  const q = await payment();
  const hash = await expectSettlesPromptly(q);
  await waitFor(async () => Number(await stack.anvil.rpc('eth_getTransactionCount', [stack.signer, 'latest'])) >= mark.nonce + 2, {
    timeoutMs: 10_000, what: 'the self-transfer and the next settlement mined',
  });
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.equal(history.selfTransfers.length, 1, `one self-transfer: ${JSON.stringify(history.all.map((t) => [t.nonce, t.to, String(t.value)]))}`);
  const filler = history.selfTransfers[0];
  assert.equal(filler.nonce, refused.nonce, 'the self-transfer was mined at the refused nonce');
  assert.equal(filler.from, getAddress(stack.signer));
  assert.equal(filler.to, getAddress(stack.signer));
  assert.equal(filler.value, 0n);
  assert.deepEqual(history.settlements.map((t) => t.hash), [hash], 'the refused settlement was never mined; the next one was');
  expectTransfersAuthorization((await stack.receipt(hash)).logs, stack.usdc, q.authorization, hash);
  assert.equal(history.all.length, 2);

  // Asked again, the refused payment sends nothing more: it never reaches the chain.
  const again = await stack.settle(p.body);
  console.log(`the refused payment asked again: ${again.text}`);
  assert.equal(again.body?.success, false, again.text);
  assert.equal(await stack.balanceOf(p.authorization.from), payerBefore);
  await waitPoolEmpty(stack.anvil);
  assert.equal(await stack.signerNonce('pending'), mark.nonce + 2, 'nothing else was sent');
  ban = () => false;
});

it('one settlement of a concurrent burst refused inside the broadcast batch: only it fails, the others settle, its nonce is filled, no gap', async () => {
  const ps = [];
  for (let i = 0; i < 5; i += 1) ps.push(await payment());
  const victim = ps[2];
  const mark = await chainMark(stack.anvil, stack.signer);
  const refusedBefore = proxy.state.refused.length;
  ban = (raw) => carries(raw, victim);

  const startedAt = Date.now();
  const answers = await Promise.all(ps.map((p) => stack.settle(p.body)));
  const hashes = [];
  for (const [i, res] of answers.entries()) {
    if (ps[i] === victim) await expectRefusedByTheNode(res, victim, startedAt);
    else hashes.push(expectSettled(res, { network: NETWORK, payer: ps[i].authorization.from }));
  }
  const refused = refusedTxs().slice(refusedBefore);
  assert.ok(refused.length >= 1, 'the node refused the victim');
  console.log(`the refused broadcast came in request(s) of ${proxy.state.refusedIn.slice(refusedBefore).join(', ')} call(s)`);

  await waitFor(async () => Number(await stack.anvil.rpc('eth_getTransactionCount', [stack.signer, 'latest'])) >= mark.nonce + ps.length, {
    timeoutMs: 10_000, what: 'every nonce of the burst mined',
  });
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.deepEqual(history.selfTransfers.map((t) => t.nonce), [refused[0].nonce], 'the refused nonce went to a self-transfer');
  assert.deepEqual(history.settlements.map((t) => t.hash).sort(), [...hashes].sort(), 'the other payments settled, each by its answer');
  assert.equal(history.all.length, ps.length);

  const q = await payment();
  await expectSettlesPromptly(q);
  ban = () => false;
});
