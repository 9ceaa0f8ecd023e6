// OpenTelemetry traces of a Solana settle (issue 31): the `request` span continues the caller's
// `traceparent`, the `settlement` span (fee payer, signature, slot) is its child, and the
// follower's sendTransaction runs under it although the follower is a task of its own. No export
// holds the fee payer's secret key. The cluster is the Solana test node (lib/svm.mjs).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { ExactSvmScheme as ExactSvmClient } from '@x402/svm/exact/client';
import {
  startSvmNode, newSolanaKeypair, writeKeypairFile, SOLANA_DEVNET_CAIP2, DEVNET_USDC_MINT,
} from './lib/svm.mjs';
import { startRouterd, freePort } from './lib/routerd.mjs';
import { startOtlpReceiver } from './lib/otlp.mjs';
import { makeTempDir, tailFile } from './lib/util.mjs';

const TRACE_ID = '0af7651916cd43dd8448eb211c80319c';
const CALLER_SPAN = 'b7ad6b7169203331';
const PRICE = 10_000n;

let tmp;
let node;
let routerd;
let receiver;
let feePayer;
let payee;

before(async () => {
  tmp = makeTempDir('routerd-telemetry-svm-');
  receiver = await startOtlpReceiver();
  node = await startSvmNode({ slotMs: 100, blockhashExpiry: 30, logFile: join(tmp.dir, 'svm-node.log') });
  feePayer = await newSolanaKeypair();
  const feePayerFile = join(tmp.dir, 'fee-payer.json');
  writeKeypairFile(feePayerFile, feePayer);
  await node.airdrop(feePayer.address, 5_000_000_000);
  await node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  payee = await newSolanaKeypair();
  await node.createTokenAccount(DEVNET_USDC_MINT, payee.address);
  const port = await freePort();
  const config = `[server]\nlisten = "127.0.0.1:${port}"\n[storage]\npath = "${join(tmp.dir, 'store')}"\n`
    + `[chains.solana-devnet]\nrpc_urls = ["${node.url}"]\n`
    + `[facilitator]\nnetworks = ["solana-devnet"]\nx402_versions = [1, 2]\n`
    + `settle_timeout_secs = 10\nsvm_fee_payer_key_file = "${feePayerFile}"\n`
    + `[telemetry]\notlp_endpoint = "${receiver.url}"\notlp_protocol = "http/json"\n`;
  routerd = await startRouterd({ configToml: config, dir: tmp.dir });
});

after(async () => {
  await routerd?.stop();
  await node?.stop();
  await receiver?.close();
  tmp?.cleanup();
});

/** A v2 /settle body: @x402/svm's client payment of PRICE to the payee. */
async function settleBody(payer) {
  const required = {
    scheme: 'exact', network: SOLANA_DEVNET_CAIP2, asset: DEVNET_USDC_MINT, amount: String(PRICE), payTo: payee.address,
    maxTimeoutSeconds: 60, extra: { feePayer: feePayer.address },
  };
  const partial = await new ExactSvmClient(payer.signer, { rpcUrl: node.url }).createPaymentPayload(2, required);
  const paymentPayload = { ...partial, accepted: required, resource: { url: 'https://shop.test/report' } };
  return { x402Version: 2, paymentPayload, paymentRequirements: required };
}

test('a Solana settle is one trace: request, its reads, and the settlement with the follower\'s send', { timeout: 60_000 }, async () => {
  try {
    const payer = await newSolanaKeypair();
    await node.mintTo(DEVNET_USDC_MINT, payer.address, 1_000_000n);
    const res = await fetch(`${routerd.url}/settle`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', traceparent: `00-${TRACE_ID}-${CALLER_SPAN}-01` },
      body: JSON.stringify(await settleBody(payer)),
    });
    const answer = await res.json();
    assert.equal(answer.success, true, JSON.stringify(answer));
    // Stopping sends what the exporter still holds.
    await routerd.stop();

    const trace = receiver.spans().filter((s) => s.traceId === TRACE_ID);
    const request = trace.find((s) => s.name === 'POST /settle');
    assert.ok(request, `a request span in the caller's trace: ${JSON.stringify(trace.map((s) => s.name))}`);
    assert.equal(request.parentSpanId, CALLER_SPAN);
    const settlement = trace.find((s) => s.name === 'settlement');
    assert.ok(settlement, 'a settlement span');
    assert.equal(settlement.parentSpanId, request.spanId);
    assert.equal(settlement.attributes.signer, feePayer.address);
    assert.equal(settlement.attributes.transaction, answer.transaction);
    assert.ok(Number(settlement.attributes.block) > 0, 'the slot it landed in');
    assert.equal(String(settlement.attributes.success), 'true');
    const batches = trace.filter((s) => s.name === 'upstream batch');
    const send = batches.find((s) => s.attributes['rpc.methods'] === 'sendTransaction');
    assert.ok(send, `the send: ${JSON.stringify(batches.map((s) => s.attributes['rpc.methods']))}`);
    assert.equal(send.parentSpanId, settlement.spanId, 'the follower sends within the settlement');
    assert.ok(batches.some((s) => s.attributes['rpc.methods'].includes('simulateTransaction')), 'the verify read');
    for (const b of batches) assert.equal(b.attributes.upstream, 'solana-devnet#0');

    const exported = receiver.exports.map((e) => e.text).join('\n');
    assert.ok(!exported.includes(Buffer.from(feePayer.secretKey.subarray(0, 32)).toString('hex')), 'the fee payer key (hex)');
    assert.ok(!exported.includes(JSON.stringify([...feePayer.secretKey.subarray(0, 32)]).slice(1, -1)), 'the fee payer key (bytes)');
  } catch (err) {
    err.message += `\n--- routerd log ---\n${tailFile(join(tmp.dir, 'routerd.log'), 30)}`;
    throw err;
  }
});
