// What a stranger can still make a Solana facilitator pay for (spec/access.md §3c), against the
// Solana test node behind a counting proxy, judged by the fee payer's lamports, token balances,
// the upstream requests and calls the proxy counts, and the answers:
// - a source the payer drains between /verify and /settle (the node's confirmed reads trailing what
//   it processed) is refused unsent, and the same payment settles once funded again;
// - a settlement that fails on chain cools down its owner (the transfer authority) on every token
//   account and mint, not the one source account;
// - a node that answers `confirmed` for a transaction that never landed makes no success: the
//   transaction's own record (getTransaction) decides;
// - Solana /verify reads take the cluster's caller budget (503 beyond it) while the settlement
//   engine keeps following a settlement;
// - GET /settlements/<network>/<signature> answers from the store: 200 GETs cost a constant
//   number of upstream requests;
// - an RPC URL on another cluster is never used, also when failover reaches it after start.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  startSvmNode, newSolanaKeypair, svmFacilitatorConfig, newFeePayer, testWithLogs, associatedTokenAddress, DEVNET_USDC_MINT,
} from './lib/svm.mjs';
import { svmPaymentBody } from './lib/svm-payment.mjs';
import { paymentInstructions, compileMessage, wireTransaction } from './lib/svm-tx.mjs';
import { startRouterd, freePort } from './lib/routerd.mjs';
import { startNodeProxy } from './lib/node-proxy.mjs';
import { makeTempDir, waitFor } from './lib/util.mjs';

const PRICE = 10_000n;
const FUNDS = 1_000_000n;
// A second configured mint: a fresh token account of the same owner.
const EURC = 'HzwqbKZw8HxMN6bF2yFZNrht3c2iXXzpKcFu7uBEDKtr';
// One settlement costs the fee payer at most two signature fees and a small priority fee.
const MAX_FEE = 20_000n;
// A provider key in the second URL's path: never in a log.
const KEY = 'key-of-the-other-cluster';

let tmp;
let node;
let proxy;
let routerd;
let feePayer;
let feePayerFile;
let payee;

before(async () => {
  tmp = makeTempDir('routerd-svm-levers-');
  node = await startSvmNode({ slotMs: 100, blockhashExpiry: 150, logFile: join(tmp.dir, 'svm-node.log') });
  ({ feePayer, feePayerFile } = await newFeePayer(node, tmp.dir));
  await node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  await node.createMint({ decimals: 6, address: EURC });
  payee = await newSolanaKeypair();
  for (const mint of [DEVNET_USDC_MINT, EURC]) await node.createTokenAccount(mint, payee.address);
  proxy = await startNodeProxy({ target: node.url });
  const config = svmFacilitatorConfig({
    port: await freePort(), storePath: join(tmp.dir, 'store'), rpcUrl: proxy.url, feePayerFile,
    chain: `[chains.solana-devnet.tokens.USDC]\nmint = "${DEVNET_USDC_MINT}"\ndecimals = 6\n`
      + `[chains.solana-devnet.tokens.EURC]\nmint = "${EURC}"\ndecimals = 6\n`,
    facilitator: 'settle_timeout_secs = 2\nrevert_cooldown_secs = 600\n',
  });
  routerd = await startRouterd({ configToml: config, dir: tmp.dir });
});

after(async () => {
  await routerd?.stop();
  await proxy?.close();
  await node?.stop();
  tmp?.cleanup();
});

const it = testWithLogs(test, () => tmp.dir, {
  nodeLog: true,
  first: async () => {
    proxy.state.fault = null;
    await node.rpc('litesvm_setFaults', [{ lagConfirmed: false, fakeConfirmed: false }]);
    await node.resume();
  },
});

async function post(path, body, base = routerd.url) {
  const res = await fetch(`${base}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, body: await res.json() };
}

/** A payer holding FUNDS of each mint (its associated token accounts) and no SOL. */
async function newPayer() {
  const payer = await newSolanaKeypair();
  for (const mint of [DEVNET_USDC_MINT, EURC]) await node.mintTo(mint, payer.address, FUNDS);
  return payer;
}

/** @x402/svm's v2 payment of PRICE of `mint` to the payee. */
const paymentBody = (payer, mint = DEVNET_USDC_MINT) => svmPaymentBody({
  rpc: node.url, signer: payer.signer, payTo: payee.address, mint, amount: PRICE, feePayer: feePayer.address,
});

const tokens = async (owner, mint = DEVNET_USDC_MINT, commitment = 'processed') => BigInt(
  (await node.rpc('getTokenAccountBalance', [await associatedTokenAddress(owner, mint), { commitment }])).value.amount,
);
const lamports = async (address) => BigInt((await node.rpc('getBalance', [address, { commitment: 'processed' }])).value);

/** The payer moves everything it holds of `mint` to a sink of its own choosing, paying its own fee. */
async function drain(payer, mint = DEVNET_USDC_MINT) {
  await node.airdrop(payer.address, 1_000_000_000);
  const sink = await newSolanaKeypair();
  await node.createTokenAccount(mint, sink.address);
  const { value: { blockhash } } = await node.rpc('getLatestBlockhash', [{ commitment: 'processed' }]);
  const instructions = await paymentInstructions({ payer: payer.address, payTo: sink.address, mint, amount: FUNDS });
  const message = compileMessage({ feePayer: payer.address, instructions, blockhash });
  return node.rpc('sendTransaction', [wireTransaction(message, [payer]), { encoding: 'base64', skipPreflight: true }]);
}

it('a source drained between /verify and /settle is refused unsent; funded again, the same payment settles', async () => {
  const payer = await newPayer();
  const body = await paymentBody(payer);
  const verified = await post('/verify', body);
  assert.equal(verified.body.isValid, true, JSON.stringify(verified.body));
  // The node's confirmed state trails what its leader processed by a slot, as a cluster's does.
  await node.rpc('litesvm_setFaults', [{ lagConfirmed: true }]);
  await node.pause();
  await drain(payer);
  await node.advanceSlots(1);
  assert.equal(await tokens(payer.address), 0n, 'processed: drained');
  assert.equal(await tokens(payer.address, DEVNET_USDC_MINT, 'confirmed'), FUNDS, 'confirmed: not yet');
  const feePayerBefore = await lamports(feePayer.address);
  const sent = proxy.state.methods.sendTransaction ?? 0;
  const refused = await post('/settle', body);
  assert.deepEqual({ success: refused.body.success, errorReason: refused.body.errorReason }, { success: false, errorReason: 'insufficient_funds' },
    JSON.stringify(refused.body));
  assert.equal(proxy.state.methods.sendTransaction ?? 0, sent, 'nothing was sent');
  await node.resume();
  await node.advanceSlots(3);
  await node.rpc('litesvm_setFaults', [{ lagConfirmed: false }]);
  assert.equal(await lamports(feePayer.address), feePayerBefore, 'the fee payer paid nothing');
  // Nothing was claimed: the payment, funded again, is judged afresh and settles once.
  await node.mintTo(DEVNET_USDC_MINT, payer.address, FUNDS);
  const payeeBefore = await tokens(payee.address);
  const settled = await post('/settle', body);
  assert.equal(settled.body.success, true, JSON.stringify(settled.body));
  assert.equal(await tokens(payee.address), payeeBefore + PRICE);
});

it('a settlement that fails on chain cools its owner down on a fresh token account of another mint', async () => {
  const payer = await newPayer();
  const body = await paymentBody(payer);
  const source = await associatedTokenAddress(payer.address, DEVNET_USDC_MINT);
  await node.pause();
  const pending = await post('/settle', body);
  assert.equal(pending.body.errorReason, 'settlement_pending', JSON.stringify(pending.body));
  // Emptied after routerd's last look, before its transaction lands: it lands, and fails.
  const { value: account } = await node.rpc('getAccountInfo', [source, { encoding: 'base64' }]);
  const data = Buffer.from(account.data[0], 'base64');
  data.fill(0, 64, 72);
  await node.rpc('litesvm_setAccount', [{ address: source, lamports: account.lamports, owner: account.owner, data: data.toString('base64') }]);
  const feePayerBefore = await lamports(feePayer.address);
  await node.resume();
  const failed = await post('/settle', body);
  assert.deepEqual({ success: failed.body.success, errorReason: failed.body.errorReason }, { success: false, errorReason: 'transaction_failed' },
    JSON.stringify(failed.body));
  const paid = feePayerBefore - await lamports(feePayer.address);
  console.log(`a settlement failed on chain: ${paid} lamports paid by the fee payer`);
  assert.ok(paid > 0n && paid <= MAX_FEE, `the one failed settlement cost ${paid} lamports`);
  // The same owner from its token account of the other configured mint: refused at verify and
  // settle, nothing sent.
  const other = await paymentBody(payer, EURC);
  const verified = await post('/verify', other);
  assert.equal(verified.body.isValid, false, JSON.stringify(verified.body));
  assert.equal(verified.body.invalidReason, 'invalid_payload');
  assert.match(verified.body.invalidMessage, /payer \(the transfer's authority\) is refused for \d+ s more/);
  const sent = proxy.state.methods.sendTransaction ?? 0;
  const refused = await post('/settle', other);
  assert.deepEqual({ success: refused.body.success, errorReason: refused.body.errorReason }, { success: false, errorReason: 'invalid_payload' },
    JSON.stringify(refused.body));
  assert.equal(proxy.state.methods.sendTransaction ?? 0, sent, 'nothing was sent');
  await node.advanceSlots(2);
  assert.equal(feePayerBefore - await lamports(feePayer.address), paid, 'one fee, never a second');
  assert.equal(await tokens(payer.address, EURC), FUNDS);
});

it('a node that answers confirmed for a transaction that never landed makes no success', async () => {
  const payer = await newPayer();
  const body = await paymentBody(payer);
  const payeeBefore = await tokens(payee.address);
  const feePayerBefore = await lamports(feePayer.address);
  await node.rpc('litesvm_setFaults', [{ fakeConfirmed: true }]);
  const pending = await post('/settle', body);
  assert.deepEqual({ success: pending.body.success, errorReason: pending.body.errorReason }, { success: false, errorReason: 'settlement_pending' },
    JSON.stringify(pending.body));
  assert.ok((proxy.state.methods.getTransaction ?? 0) > 0, 'the record was asked for');
  // Past the blockhash's lifetime, never landed: a failure, with certainty.
  await node.advanceSlots(200);
  const told = await post('/settle', body);
  assert.deepEqual({ success: told.body.success, errorReason: told.body.errorReason, transaction: told.body.transaction },
    { success: false, errorReason: 'transaction_failed', transaction: pending.body.transaction }, JSON.stringify(told.body));
  assert.match(told.body.errorMessage, /expired/);
  await node.rpc('litesvm_setFaults', [{ fakeConfirmed: false }]);
  assert.equal(await tokens(payee.address), payeeBefore, 'the payee got nothing');
  assert.equal(await lamports(feePayer.address), feePayerBefore);
});

it('honest settles: their upstream requests and calls, one getTransaction each', async () => {
  const SETTLES = 5;
  const bodies = [];
  for (let i = 0; i < SETTLES; i += 1) bodies.push(await paymentBody(await newPayer()));
  const slot = async () => Number(await node.rpc('getSlot', [{ commitment: 'processed' }]));
  const [requests, calls, methods] = [proxy.state.requests, proxy.state.calls, { ...proxy.state.methods }];
  const firstSlot = await slot();
  for (const body of bodies) {
    const settled = await post('/settle', body);
    assert.equal(settled.body.success, true, JSON.stringify(settled.body));
  }
  const slots = await slot() - firstSlot;
  const per = (n) => (n / SETTLES).toFixed(2);
  const used = { requests: proxy.state.requests - requests, calls: proxy.state.calls - calls };
  const more = (method) => (proxy.state.methods[method] ?? 0) - (methods[method] ?? 0);
  const reads = more('getSignatureStatuses');
  console.log(`honest Solana settle: ${per(used.requests)} upstream requests, ${per(used.calls)} calls each; ${reads} status reads over ${slots} slots`);
  // The last look is one simulation answering the accounts, no second verify; the blockhash bound
  // is read by the cluster's follower, once for all the settlements sent since its last tick.
  for (const method of ['simulateTransaction', 'sendTransaction', 'getTransaction']) {
    assert.equal(more(method), SETTLES, `${method}: ${JSON.stringify(proxy.state.methods)}`);
  }
  assert.equal(more('getMultipleAccounts'), 0, JSON.stringify(proxy.state.methods));
  assert.ok(more('getLatestBlockhash') <= SETTLES, JSON.stringify(proxy.state.methods));
  // The follower's status reads (each one request, the blockhash bound or the block height
  // batched in) are paced by the slots, not by the settlements or their waiters: one look a tick,
  // and while a slot is due one every 10 ms from 40 ms before it until it comes
  // (src/chain/cadence.rs): about 2 a slot here, at most 5 for a slot on time, more only for a
  // late one. Ten a slot holds the pace on a busy machine; a follower reading every millisecond
  // makes more than 15 a slot even in a debug build. Every other request is one of the three above.
  assert.ok(reads <= 10 * slots + SETTLES, `${reads} status reads over ${slots} slots`);
  assert.ok(used.requests <= 3 * SETTLES + reads, JSON.stringify({ used, reads }));
});

it('GET /settlements/<network>/<signature> 200 times: a constant number of upstream requests', async () => {
  const payer = await newPayer();
  const settled = await post('/settle', await paymentBody(payer));
  assert.equal(settled.body.success, true, JSON.stringify(settled.body));
  const requests = proxy.state.requests;
  const answers = await Promise.all(Array.from({ length: 200 }, async () => {
    const res = await fetch(`${routerd.url}/settlements/solana-devnet/${settled.body.transaction}`);
    return { status: res.status, body: await res.json() };
  }));
  assert.ok(answers.every((a) => a.status === 200 && a.body.state === 'final'), JSON.stringify(answers[0]));
  assert.ok(answers.every((a) => Number.isInteger(a.body.confirmations)), JSON.stringify(answers[0]));
  const used = proxy.state.requests - requests;
  console.log(`200 status GETs: ${used} upstream requests`);
  assert.ok(used <= 3, `${used} upstream requests for 200 GETs`);
});

it('Solana /verify reads take the caller budget: a flood answers 503 beyond it while a settlement is followed', async () => {
  const dir = join(tmp.dir, 'busy');
  mkdirSync(dir, { recursive: true });
  const slow = await startNodeProxy({ target: node.url, slowMs: 400 });
  const busy = await startRouterd({
    dir: dir,
    configToml: svmFacilitatorConfig({
      port: await freePort(), storePath: join(dir, 'store'), rpcUrl: slow.url, feePayerFile,
      chain: 'max_caller_reads = 2\n', facilitator: 'settle_timeout_secs = 3\n',
    }),
  });
  try {
    const payer = await newPayer();
    const body = await paymentBody(payer);
    await node.pause();
    const pending = await post('/settle', body, busy.url);
    assert.equal(pending.body.errorReason, 'settlement_pending', JSON.stringify(pending.body));
    await node.resume();
    const bodies = await Promise.all(Array.from({ length: 12 }, () => paymentBody(payer)));
    slow.state.fault = 'slow';
    const strangers = await Promise.all(bodies.map((b) => post('/verify', b, busy.url)));
    slow.state.fault = null;
    const busyAnswers = strangers.filter((a) => a.status === 503);
    assert.ok(busyAnswers.length > 0 && busyAnswers.length < 12, strangers.map((a) => a.status).join(','));
    for (const a of busyAnswers) {
      assert.equal(a.body.error, 503);
      assert.match(a.body.message, /max_caller_reads/);
      assert.equal(a.headers.get('retry-after'), '1');
    }
    const told = await post('/settle', body, busy.url);
    assert.equal(told.body.success, true, JSON.stringify(told.body));
  } finally {
    await busy.stop();
    await slow.close();
  }
});

it('an RPC URL on another cluster is never used, also when failover first reaches it after start', async () => {
  const dir = join(tmp.dir, 'failover');
  mkdirSync(dir, { recursive: true });
  const other = await startSvmNode({ slotMs: 100, genesisHash: '4uhcVJyU9pJkvQyS88uRDiswHXSCkY3zQawwpjk2NsNY' });
  const first = await startNodeProxy({ target: node.url });
  const second = await startNodeProxy({ target: other.url });
  await second.down();
  const configToml = svmFacilitatorConfig({
    port: await freePort(), storePath: join(dir, 'store'), rpcUrl: first.url, feePayerFile,
  }).replace(`rpc_urls = ["${first.url}"]`, `rpc_urls = ["${first.url}", "${second.url}/v2/${KEY}"]`);
  const failover = await startRouterd({ dir: dir, configToml });
  try {
    const payer = await newPayer();
    const body = await paymentBody(payer);
    // The first URL goes away; the second answers, on another cluster.
    await first.down();
    await second.up();
    const feePayerBefore = await lamports(feePayer.address);
    const refused = await post('/settle', body, failover.url);
    assert.deepEqual({ status: refused.status, error: refused.body.error }, { status: 400, error: 502 }, JSON.stringify(refused.body));
    assert.match(refused.body.message, /solana-devnet#1: on another chain/);
    const asked = Object.keys(second.state.methods);
    assert.deepEqual(asked, ['getGenesisHash'], `the other cluster was asked only for its genesis hash: ${JSON.stringify(second.state.methods)}`);
    await post('/verify', body, failover.url);
    assert.equal(second.state.methods.getGenesisHash, 1, 'asked once, then never used');
    assert.deepEqual(Object.keys(second.state.methods), ['getGenesisHash']);
    const log = readFileSync(join(dir, 'routerd.log'), 'utf8');
    assert.match(log, /solana-devnet#1/);
    assert.ok(!log.includes(KEY), 'the URL itself is never logged');
    assert.equal(await lamports(feePayer.address), feePayerBefore);
  } finally {
    await failover.stop();
    await first.close();
    await second.close();
    await other.stop();
  }
});
