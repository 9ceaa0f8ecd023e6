// The Solana phase of bench/run.mjs: routerd's `exact` verify and settle on solana-devnet against
// the Solana test node (tests/svm-node: LiteSVM behind Solana JSON-RPC, one Node.js process) with
// the real cluster's 400 ms slots. Payments are built by hand (tests/e2e/lib/svm-tx.mjs: local
// signing, no client round trips), each distinct (its compute unit limit differs), so that nothing
// is measured twice.
//
// - upstream requests per verify: counted at a proxy in front of the node (HTTP requests and
//   JSON-RPC calls), verifies one at a time, less what the proxy sees over as long idle;
// - verifies/s at concurrency 1 and 64, routerd straight on the node;
// - settle latency, one at a time and at concurrency 64, against the slot time, and from the slot
//   that made each transaction `confirmed` to its answer (commitment-to-answer);
// - node calls per settle (each entry of a batch, as a hosted RPC bills them), 200 settles at
//   concurrency 50 through the counting proxy.
import { join } from 'node:path';
import { startFilteringProxy } from '../tests/e2e/lib/bad-upstreams.mjs';
import { startRouterd, freePort } from '../tests/e2e/lib/routerd.mjs';
import { startSvmNode, newSolanaKeypair, writeKeypairFile, DEVNET_USDC_MINT } from '../tests/e2e/lib/svm.mjs';
import { v2Requirements } from '../tests/e2e/lib/svm-payment.mjs';
import { paymentInstructions, compileMessage, wireTransaction } from '../tests/e2e/lib/svm-tx.mjs';
import { makeTempDir, sleep } from '../tests/e2e/lib/util.mjs';
import { nowMs, summarize, load, compiledLoad, postJson, procMemory } from './lib.mjs';

/** The real cluster's slot time: settle latency is read against it. */
export const SLOT_MS = 400;
const AMOUNT = 1000;
const SIGNATURE = /^[1-9A-HJ-NP-Za-km-z]{64,88}$/;

/** The parties: a fee payer, `payers` payers holding USDC and no SOL, one payee. */
async function parties(node, dir, payers) {
  const feePayer = await newSolanaKeypair();
  const feePayerFile = join(dir, 'fee-payer.json');
  writeKeypairFile(feePayerFile, feePayer);
  await node.airdrop(feePayer.address, 1_000_000_000_000);
  await node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  const payee = await newSolanaKeypair();
  await node.createTokenAccount(DEVNET_USDC_MINT, payee.address);
  const funded = [];
  for (let i = 0; i < payers; i += 1) {
    const payer = await newSolanaKeypair();
    await node.mintTo(DEVNET_USDC_MINT, payer.address, 1_000_000_000_000n);
    funded.push(payer);
  }
  return { feePayer, feePayerFile, payee, payers: funded };
}

/**
 * `count` distinct v2 bodies as JSON strings, on the node's latest blockhash (valid 150 slots:
 * build them just before they are sent). Each body of the phase is apart from every other: its
 * compute unit limit is 20,000 + the bodies built before it, below routerd's default cap of 40,000
 * (`chains.<name>.max_compute_units`).
 */
let built = 0;
async function payments(node, { feePayer, payee, payers }, count) {
  const { value: { blockhash } } = await node.rpc('getLatestBlockhash', []);
  const requirements = v2Requirements({ payTo: payee.address, amount: AMOUNT, feePayer: feePayer.address });
  const bodies = [];
  for (let i = 0; i < count; i += 1) {
    const payer = payers[i % payers.length];
    const instructions = await paymentInstructions({
      payer: payer.address, payTo: payee.address, mint: DEVNET_USDC_MINT, amount: AMOUNT, units: 20_000 + built++,
    });
    const transaction = wireTransaction(compileMessage({ feePayer: feePayer.address, instructions, blockhash }), [payer]);
    bodies.push(JSON.stringify({
      x402Version: 2, paymentRequirements: requirements,
      paymentPayload: { x402Version: 2, accepted: requirements, resource: { url: 'http://shop.test/report' }, payload: { transaction } },
    }));
  }
  return bodies;
}

function config({ port, dir, rpcUrl, feePayerFile }) {
  return `[server]\nlisten = "127.0.0.1:${port}"\n[storage]\npath = "${join(dir, `store-${port}`)}"\n`
    + `[chains.solana-devnet]\nrpc_urls = ["${rpcUrl}"]\n`
    + `[facilitator]\nnetworks = ["solana-devnet"]\nx402_versions = [1, 2]\nallow_http_resource = true\n`
    + `svm_fee_payer_key_file = "${feePayerFile}"\n`;
}

/** Upstream HTTP requests and JSON-RPC calls per verify, verifies one at a time through a counting proxy. */
async function upstreamPerVerify(node, tmp, people, count, log) {
  const proxy = await startFilteringProxy({ target: node.url });
  const routerd = await startRouterd({
    configToml: config({ port: await freePort(), dir: tmp.dir, rpcUrl: proxy.url, feePayerFile: people.feePayerFile }), dir: tmp.dir,
  });
  try {
    const bodies = await payments(node, people, count);
    log(`svm: ${count} verifies, one at a time, through the counting proxy`);
    const calls = (from) => proxy.state.requests.slice(from).reduce((n, methods) => n + methods.length, 0);
    let mark = proxy.state.requests.length;
    let t0 = nowMs();
    const run = await load({
      concurrency: 1, total: count, maxMs: 30_000,
      call: async (i) => (await postJson(`${routerd.url}/verify`, bodies[i])).body?.isValid === true,
    });
    const ms = nowMs() - t0;
    const during = { requests: proxy.state.requests.length - mark, calls: calls(mark) };
    mark = proxy.state.requests.length;
    t0 = nowMs();
    await sleep(ms);
    const scale = ms / (nowMs() - t0);
    const idle = { requests: (proxy.state.requests.length - mark) * scale, calls: calls(mark) * scale };
    const verifies = run.latencies.length;
    return {
      verifies, failed: run.failed, firstError: run.firstError, during, idle,
      requestsPerVerify: (during.requests - idle.requests) / verifies,
      callsPerVerify: (during.calls - idle.calls) / verifies,
      methods: [...new Set(proxy.state.requests.flat())].sort(),
    };
  } finally {
    await routerd.stop();
    await proxy.close();
  }
}

/**
 * Settles `bodies` at `concurrency`, sent by the compiled client (`bin`: each answer stamped as
 * its last byte is read; Node's one thread stamped answers at 64 tens of milliseconds late); the
 * latencies of those answered success with a signature.
 */
async function settleRun(url, bodies, concurrency, bin, node) {
  const answered = []; // [signature, when (ms since the epoch)]
  const settled = (a) => a.status === 200 && a.body?.success === true && SIGNATURE.test(a.body.transaction ?? '');
  const run = await compiledLoad({
    bin, url: `${url}/settle`, bodies, concurrency, maxMs: 120_000,
    good: (a) => {
      if (settled(a)) answered.push([a.body.transaction, a.at]);
      return settled(a);
    },
  });
  const commitmentToAnswer = node ? summarize(await commitmentToAnswerMs(node, answered)) : undefined;
  return { ...summarize(run.latencies), rps: run.rps, failed: run.failed, firstError: run.firstError, commitmentToAnswer };
}

/** Per answered settle: ms from the slot that made its transaction `confirmed` to its answer. */
async function commitmentToAnswerMs(node, answered) {
  const { confirmedDepth } = await node.status();
  const out = [];
  for (let i = 0; i < answered.length; i += 256) {
    const part = answered.slice(i, i + 256);
    const { value } = await node.rpc('getSignatureStatuses', [part.map(([s]) => s), { searchTransactionHistory: true }]);
    for (const [j, status] of value.entries()) {
      const at = status && await node.rpc('litesvm_slotTime', [status.slot + confirmedDepth]);
      if (at) out.push(part[j][1] - at);
    }
  }
  return out;
}

/** Node calls per settle: `count` distinct settles at `concurrency` through a counting proxy. */
async function callsPerSettle(node, tmp, people, { concurrency, total }, bin, log) {
  const proxy = await startFilteringProxy({ target: node.url });
  const routerd = await startRouterd({
    configToml: config({ port: await freePort(), dir: tmp.dir, rpcUrl: proxy.url, feePayerFile: people.feePayerFile }), dir: tmp.dir,
  });
  try {
    const bodies = await payments(node, people, total);
    log(`svm: ${total} settles at concurrency ${concurrency} through the counting proxy`);
    const mark = proxy.state.requests.length;
    const run = await settleRun(routerd.url, bodies, concurrency, bin);
    const requests = proxy.state.requests.slice(mark);
    const methods = {};
    for (const m of requests.flat()) methods[m] = (methods[m] ?? 0) + 1;
    const calls = requests.reduce((n, r) => n + r.length, 0);
    return { settles: run.n, failed: run.failed, calls, requests: requests.length, callsPerSettle: calls / run.n, methods };
  } finally {
    await routerd.stop();
    await proxy.close();
  }
}

/**
 * The phase. `bounds`: {upstreamVerifies, warmup, serial: {total, maxMs}, concurrent: {concurrency,
 * total, maxMs}, settleSerial, settleConcurrent: {concurrency, total}}.
 */
export async function benchSvm(bounds, log) {
  const tmp = makeTempDir('routerd-bench-svm-');
  log(`svm: the Solana test node (${SLOT_MS} ms slots, blockhashes valid 150 slots) and routerd on solana-devnet`);
  const node = await startSvmNode({ slotMs: SLOT_MS, logFile: join(tmp.dir, 'svm-node.log') });
  try {
    const people = await parties(node, tmp.dir, 16);
    const upstream = await upstreamPerVerify(node, tmp, people, bounds.upstreamVerifies, log);
    const settleCalls = await callsPerSettle(node, tmp, people, bounds.settleCalls, bounds.burstBin, log);

    const routerd = await startRouterd({
      configToml: config({ port: await freePort(), dir: tmp.dir, rpcUrl: node.url, feePayerFile: people.feePayerFile }), dir: tmp.dir,
    });
    try {
      const pid = routerd.child.pid;
      const memory = { idle: procMemory(pid) };
      const verifier = (bodies) => async (i) => (await postJson(`${routerd.url}/verify`, bodies[i])).body?.isValid === true;
      const stats = (r) => ({ ...summarize(r.latencies), rps: r.rps, failed: r.failed, firstError: r.firstError });
      const { warmup, serial, concurrent } = bounds;
      await load({ concurrency: 4, total: warmup, maxMs: 10_000, call: verifier(await payments(node, people, warmup)) });
      log(`svm: ${serial.total} verifies at concurrency 1, then ${concurrent.total} at ${concurrent.concurrency}`);
      // Sent by the compiled client, as wrk would: Node's one thread was a limit at 64.
      const compiled = async ({ concurrency, total, maxMs }) => compiledLoad({
        bin: bounds.burstBin, url: `${routerd.url}/verify`, bodies: await payments(node, people, total), concurrency, maxMs,
        good: (a) => a.status === 200 && a.body?.isValid === true,
      });
      const c1 = stats(await compiled({ concurrency: 1, ...serial }));
      const c64 = stats(await compiled(concurrent));
      memory.afterVerify = procMemory(pid);

      log(`svm: ${bounds.settleSerial} settles one at a time, then ${bounds.settleConcurrent.total} at concurrency ${bounds.settleConcurrent.concurrency}`);
      const settleSerial = await settleRun(routerd.url, await payments(node, people, bounds.settleSerial), 1, bounds.burstBin, node);
      const { concurrency, total } = bounds.settleConcurrent;
      const settleConcurrent = await settleRun(routerd.url, await payments(node, people, total), concurrency, bounds.burstBin, node);
      memory.afterSettle = procMemory(pid);
      return {
        slotMs: SLOT_MS, upstream, settleCalls, c1, c64, settleSerial, settleConcurrent, memory,
        settleSerialOverSlot: settleSerial.p50 / SLOT_MS,
        settleConcurrentOverSlot: settleConcurrent.p50 / SLOT_MS,
      };
    } finally {
      await routerd.stop();
    }
  } finally {
    await node.stop();
    tmp.cleanup();
  }
}
