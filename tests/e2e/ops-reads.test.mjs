// Ops reads cost no upstream call per request (access.md §3c): /metrics and /ready answer the
// signers' and fee payers' funds as routerd last read them, read again once per block on an EVM
// chain (at a new head) and at most once per slot time (400 ms) on a Solana cluster, whoever
// asks and how often. One daemon serves both families: anvil (base-sepolia) and the Solana test
// node (solana-devnet), each behind a node proxy that counts the requests carrying each method.
// The funds still follow the chain: after a settlement of each family, the next head's (the next
// slot time's) scrape shows what the signer and the fee payer paid. The same daemon's /metrics
// serves every metric the packaged alert rules and Grafana dashboard name.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ExactSvmScheme as ExactSvmClient } from '@x402/svm/exact/client';
import { startFacilitatorStack, throughProxy, withLogTail, NETWORK } from './lib/stack.mjs';
import { startNodeProxy } from './lib/node-proxy.mjs';
import { startSvmNode, newSolanaKeypair, newFeePayer, SOLANA_DEVNET_CAIP2, DEVNET_USDC_MINT } from './lib/svm.mjs';
import { expectSettled } from './lib/expect.mjs';
import { readAnswer, waitFor } from './lib/util.mjs';

const SOLANA = 'solana-devnet';
const SLOT_TIME_MS = 400; // routerd's SOLANA_BLOCK_TIME

let stack;
let evmProxy;
let svmProxy;
let node;
let feePayer;
let payee;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  evmProxy = await startNodeProxy();
  stack = await startFacilitatorStack({ rpcUrlFor: throughProxy(evmProxy), routerd: { x402Versions: [1, 2] } });
  node = await startSvmNode({ logFile: join(stack.tmp.dir, 'svm-node.log') });
  svmProxy = await startNodeProxy({ target: node.url });
  let feePayerFile;
  ({ feePayer, feePayerFile } = await newFeePayer(node, stack.tmp.dir));
  await node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  payee = await newSolanaKeypair();
  await node.createTokenAccount(DEVNET_USDC_MINT, payee.address);
  // The stack's config with the Solana cluster served too: `extra` follows the [facilitator]
  // table, so its first line is one of that table's.
  stack.reconfigure({
    served: [NETWORK, SOLANA],
    routerdOpts: {
      x402Versions: [1, 2],
      extra: `svm_fee_payer_key_file = ${JSON.stringify(feePayerFile)}\n\n[chains.${SOLANA}]\nrpc_urls = [${JSON.stringify(svmProxy.url)}]\n`,
    },
  });
  await stack.routerd.restart();
  await waitFor(async () => ((await fetch(`${stack.url}/ready`)).status === 200 ? true : null), { timeoutMs: 15_000, what: '/ready = 200' });
});

after(async () => {
  await stack?.stop();
  await node?.stop();
  await evmProxy?.close();
  await svmProxy?.close();
});

/** The value of the one sample of `name` whose labels include `labels`, or undefined. */
async function metric(name, labels) {
  const text = await (await fetch(`${stack.url}/metrics`)).text();
  const wanted = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  for (const line of text.split('\n')) {
    const m = line.match(/^([a-z_]+)\{([^}]*)\} (\S+)$/);
    if (m && m[1] === name && wanted.every((l) => m[2].split(',').includes(l))) return Number(m[3]);
  }
  return undefined;
}

/** The `_sum` or `_count` of `routerd_<histogram>_seconds` for `family`. */
const histogramPart = (text, histogram, part, family) =>
  Number(text.match(new RegExp(`^routerd_${histogram}_seconds_${part}\\{family="${family}"\\} (\\S+)$`, 'm'))?.[1]);

/** `routerd_<histogram>_seconds` has counted at least one answer of `family`. */
function assertCounted(text, histogram, family) {
  const count = histogramPart(text, histogram, 'count', family);
  assert.ok(count >= 1, `routerd_${histogram}_seconds counts the ${family} answer: ${count}`);
}

const signerBalance = () => metric('routerd_signer_balance_wei', { network: NETWORK, signer: stack.signer.toLowerCase() });
const feePayerBalance = () => metric('routerd_fee_payer_balance_lamports', { network: SOLANA, signer: feePayer.address });
const reads = () => ({ evm: evmProxy.state.methods.eth_getBalance ?? 0, svm: svmProxy.state.methods.getBalance ?? 0 });

it('50 /metrics and 50 /ready read the funds once per block and once per slot time, not once each', async () => {
  await signerBalance(); // the current head's read, if it was not made yet
  const before = { reads: reads(), block: await stack.client.getBlockNumber(), at: Date.now() };
  for (let i = 0; i < 50; i++) {
    assert.equal((await fetch(`${stack.url}/metrics`)).status, 200);
    const ready = await readAnswer(await fetch(`${stack.url}/ready`));
    assert.equal(ready.status, 200, ready.text);
  }
  const after = { reads: reads(), blocks: Number((await stack.client.getBlockNumber()) - before.block), ms: Date.now() - before.at };
  const evm = after.reads.evm - before.reads.evm;
  const svm = after.reads.svm - before.reads.svm;
  assert.ok(evm <= after.blocks, `${evm} EVM balance reads for 100 ops requests over ${after.blocks} new blocks`);
  const slots = Math.floor(after.ms / SLOT_TIME_MS) + 1;
  assert.ok(svm <= slots, `${svm} Solana balance reads for 100 ops requests in ${after.ms} ms (${slots} slot times)`);
  assert.ok(svm < 50, `${svm} Solana balance reads: one per request or more`);
});

it('the signer\'s balance follows an EVM settlement at its head', async () => {
  const before = await signerBalance();
  const payer = await stack.newPayer(5000n);
  const p = await stack.pay({ account: payer, amount: 1000n });
  expectSettled(await stack.settle(p.body), { network: NETWORK, payer: payer.address });
  const onChain = Number(await stack.client.getBalance({ address: stack.signer }));
  assert.ok(onChain < before, 'the signer paid the settlement\'s gas');
  const reported = await waitFor(async () => {
    const v = await signerBalance();
    return Math.abs(v - onChain) <= onChain * 1e-9 ? v : null;
  }, { timeoutMs: 10_000, what: `routerd_signer_balance_wei = ${onChain}` });
  assert.notEqual(reported, before);
});

it('the fee payer\'s lamports follow a Solana settlement within a slot time', async () => {
  const before = await feePayerBalance();
  assert.equal(before, Number(await node.balance(feePayer.address)));
  const payer = await newSolanaKeypair();
  await node.mintTo(DEVNET_USDC_MINT, payer.address, 1_000_000n);
  const required = {
    scheme: 'exact', network: SOLANA_DEVNET_CAIP2, asset: DEVNET_USDC_MINT, amount: '10000', payTo: payee.address,
    maxTimeoutSeconds: 60, extra: { feePayer: feePayer.address },
  };
  const partial = await new ExactSvmClient(payer.signer, { rpcUrl: node.url }).createPaymentPayload(2, required);
  const body = { x402Version: 2, paymentPayload: { ...partial, accepted: required, resource: { url: 'http://shop.test/report' } }, paymentRequirements: required };
  const settled = await stack.post('/settle', body);
  assert.equal(settled.body?.success, true, settled.text);
  const onChain = Number(await node.balance(feePayer.address));
  assert.ok(onChain < before, 'the fee payer paid the transaction fee');
  await waitFor(async () => ((await feePayerBalance()) === onChain ? true : null),
    { timeoutMs: 5_000, what: `routerd_fee_payer_balance_lamports = ${onChain}` });
});

// Issue 48: the alert rules and the dashboard in packaging/ name only metrics routerd serves. With
// both families configured and a settlement of each made above, every `routerd_*` name in either
// file (queries, and the metrics their descriptions point operators at) is a sample of /metrics.
it('every metric named by packaging/prometheus/routerd-alerts.yml and packaging/grafana/routerd.json is served', async () => {
  const p = await stack.pay({ account: await stack.newPayer(5000n), amount: 1000n });
  assert.equal((await stack.verify(p.body)).body?.isValid, true, 'a verify, for its latency histogram');
  assert.equal((await stack.verify({})).body?.error, 400, 'an error answer, for routerd_error_answers_total');
  const text = await (await fetch(`${stack.url}/metrics`)).text();
  const served = new Set(text.split('\n').filter((l) => l && !l.startsWith('#')).map((l) => l.match(/^[a-zA-Z_:][a-zA-Z0-9_:]*/)[0]));
  for (const family of ['evm', 'svm']) {
    assert.match(text, new RegExp(`^routerd_settlements_total\\{family="${family}",outcome="success"\\} 1$`, 'm'), `a ${family} settlement`);
    // Each settle answer is timed from its block as routerd first saw it, and from the request.
    for (const histogram of ['block_to_answer', 'settle_duration']) assertCounted(text, histogram, family);
    // The block came after the request: the wait after it is a part of the settle's.
    const [blockToAnswer, settle] = ['block_to_answer', 'settle_duration'].map((h) => histogramPart(text, h, 'sum', family));
    assert.ok(blockToAnswer <= settle, `${family}: ${blockToAnswer} s from the blocks to the answers, ${settle} s from the requests`);
  }
  assertCounted(text, 'verify_duration', 'evm');
  const root = new URL('../../packaging/', import.meta.url);
  const rules = readFileSync(new URL('prometheus/routerd-alerts.yml', root), 'utf8');
  const dashboard = readFileSync(new URL('grafana/routerd.json', root), 'utf8');
  const exprs = JSON.parse(dashboard).panels.flatMap((panel) => (panel.targets ?? []).map((t) => t.expr));
  assert.ok(exprs.length >= 10, `the dashboard's queries: ${exprs.length}`);
  for (const [file, content] of [['routerd-alerts.yml', rules], ['routerd.json', dashboard]]) {
    const named = new Set(content.match(/routerd_[a-z0-9_]+/g));
    assert.ok(named.size >= 8, `${file} names ${named.size} metrics`);
    const missing = [...named].filter((name) => !served.has(name));
    assert.deepEqual(missing, [], `${file} names metrics /metrics does not serve`);
  }
});
