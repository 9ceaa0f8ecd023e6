// What a Solana facilitator costs its operator in node calls (a hosted RPC bills each entry of a
// batch), against the Solana test node at the real cluster's 400 ms slots behind a counting proxy:
// - a verify is one call: the simulation, answering the accounts it leaves;
// - settles at once take no more calls each than the official facilitator's 3.96: one
//   simulation, one send, one getTransaction, and their share of one follower's reads;
// - the claimants of one settlement wait on one follower: the signature's status is asked as
//   often with two claimants waiting as with none.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import {
  startSvmNode, newSolanaKeypair, svmFacilitatorConfig, newFeePayer, testWithLogs, DEVNET_USDC_MINT,
} from './lib/svm.mjs';
import { svmPaymentBody } from './lib/svm-payment.mjs';
import { startRouterd, freePort } from './lib/routerd.mjs';
import { startNodeProxy } from './lib/node-proxy.mjs';
import { makeTempDir, sleep } from './lib/util.mjs';

const PRICE = 10_000n;
// The official facilitator (@x402/svm 2.27.0) took 3.96 calls per settle measured the same way.
const REFERENCE_CALLS_PER_SETTLE = 3.96;

let tmp;
let node;
let proxy;
let routerd;
let feePayer;
let feePayerFile;
let payee;

before(async () => {
  tmp = makeTempDir('routerd-svm-follower-');
  node = await startSvmNode({ slotMs: 400, logFile: join(tmp.dir, 'svm-node.log') });
  ({ feePayer, feePayerFile } = await newFeePayer(node, tmp.dir));
  await node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  payee = await newSolanaKeypair();
  await node.createTokenAccount(DEVNET_USDC_MINT, payee.address);
  proxy = await startNodeProxy({ target: node.url });
  const config = svmFacilitatorConfig({
    port: await freePort(), storePath: join(tmp.dir, 'store'), rpcUrl: proxy.url, feePayerFile,
    facilitator: 'settle_timeout_secs = 2\n',
  });
  routerd = await startRouterd({ configToml: config, dir: tmp.dir });
});

after(async () => {
  await routerd?.stop();
  await proxy?.close();
  await node?.stop();
  tmp?.cleanup();
});

const it = testWithLogs(test, () => tmp.dir, { nodeLog: true, first: async () => node.resume() });

async function post(path, body, headers = {}) {
  const res = await fetch(`${routerd.url}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

/** `count` payments of PRICE, each from a payer of its own holding USDC and no SOL. */
async function bodies(count) {
  const out = [];
  for (let i = 0; i < count; i += 1) {
    const payer = await newSolanaKeypair();
    await node.mintTo(DEVNET_USDC_MINT, payer.address, 1_000_000n);
    out.push(await svmPaymentBody({
      rpc: node.url, signer: payer.signer, payTo: payee.address, mint: DEVNET_USDC_MINT, amount: PRICE, feePayer: feePayer.address,
    }));
  }
  return out;
}

/** The calls the proxy counts while `run` runs: {calls, methods}. */
async function counted(run) {
  const [calls, methods] = [proxy.state.calls, { ...proxy.state.methods }];
  await run();
  const more = Object.fromEntries(Object.entries(proxy.state.methods).map(([m, n]) => [m, n - (methods[m] ?? 0)]).filter(([, n]) => n > 0));
  return { calls: proxy.state.calls - calls, methods: more };
}

it('a verify is one node call: the simulation answers the accounts', async () => {
  const payments = await bodies(6);
  const used = await counted(async () => {
    for (const body of payments) {
      const verified = await post('/verify', body);
      assert.equal(verified.body.isValid, true, JSON.stringify(verified.body));
    }
  });
  console.log(`Solana verify: ${used.calls / payments.length} node calls each (${JSON.stringify(used.methods)})`);
  assert.deepEqual(used.methods, { simulateTransaction: payments.length });
});

it('settles at once cost no more node calls each than the official facilitator', async () => {
  const payments = await bodies(32);
  const used = await counted(async () => {
    const settled = await Promise.all(payments.map((body) => post('/settle', body)));
    for (const s of settled) assert.equal(s.body.success, true, JSON.stringify(s.body));
  });
  const each = used.calls / payments.length;
  console.log(`Solana settle at concurrency ${payments.length}: ${each.toFixed(2)} node calls each (${JSON.stringify(used.methods)})`);
  for (const method of ['simulateTransaction', 'sendTransaction', 'getTransaction']) {
    assert.equal(used.methods[method], payments.length, `${method}: ${JSON.stringify(used.methods)}`);
  }
  assert.equal(used.methods.getMultipleAccounts, undefined, JSON.stringify(used.methods));
  assert.ok(each <= REFERENCE_CALLS_PER_SETTLE, `${each} calls per settle: ${JSON.stringify(used.methods)}`);
});

it('two claimants waiting on one settlement: its status is asked no more often than with none', async () => {
  const [body] = await bodies(1);
  await node.pause();
  const pending = await post('/settle', body, { 'Idempotency-Key': 'one-stream' });
  assert.equal(pending.body.errorReason, 'settlement_pending', JSON.stringify(pending.body));
  const signature = pending.body.transaction;
  let asks = 0;
  proxy.state.onCall = (call) => {
    if (call?.method === 'getSignatureStatuses' && JSON.stringify(call.params?.[0]).includes(signature)) asks += 1;
  };
  try {
    const rate = async () => {
      const from = asks;
      await sleep(1500);
      return asks - from;
    };
    const alone = await rate();
    const claimants = [1, 2].map(() => post('/settle', body, { 'Idempotency-Key': 'one-stream' }));
    await sleep(100);
    const waited = await rate();
    console.log(`asks for the signature in 1.5 s: ${alone} followed alone, ${waited} with two claimants waiting`);
    assert.ok(alone > 0, 'the follower asks while the settlement is under way');
    assert.ok(waited <= alone + 2, `one stream: ${alone} alone, ${waited} with two claimants`);
    for (const told of await Promise.all(claimants)) {
      assert.equal(told.body.errorReason, 'settlement_pending', JSON.stringify(told.body));
    }
  } finally {
    proxy.state.onCall = null;
    await node.resume();
  }
  const told = await post('/settle', body, { 'Idempotency-Key': 'one-stream' });
  assert.equal(told.body.success, true, JSON.stringify(told.body));
});
