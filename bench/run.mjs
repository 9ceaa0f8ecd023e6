#!/usr/bin/env node
// routerd benchmark: facilitator verify/settle and router latency, throughput, memory and upstream
// requests, against local anvil chains, the Solana test node and the release binary. Run it through scripts/bench, which
// builds the binary and installs the npm packages. See bench/README.md for how to read the table.
//
//   ROUTERD_BIN=.../release/routerd node bench/run.mjs [--json PATH] [--quick] [--heads ws|poll] [--store sled|postgres]
//
// All traffic goes to 127.0.0.1. Every phase is bounded by a request count and a duration.
import { execFileSync, spawn } from 'node:child_process';
import { readFileSync, writeFileSync, existsSync } from 'node:fs';
import { createServer } from 'node:http';
import { cpus, availableParallelism } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { encodeFunctionData } from 'viem';
import { startFilteringProxy } from '../tests/e2e/lib/bad-upstreams.mjs';
import { startFacilitatorStack } from '../tests/e2e/lib/stack.mjs';
import { startAnvil, anvilBin } from '../tests/e2e/lib/anvil.mjs';
import { startRouterd, routerdBin, SHUTDOWN_GRACE_SECS } from '../tests/e2e/lib/routerd.mjs';
import { privateKeyToAccount } from 'viem/accounts';
import { anvilAccount, anvilKey, freshAccount } from '../tests/e2e/lib/accounts.mjs';
import { usdcAbi } from '../tests/e2e/lib/deploy-usdc.mjs';
import { LENS_ABI, erc3009Ask, lensEthCall } from '../tests/e2e/lib/lens.mjs';
import { freePort, makeTempDir, sleep, trackChild, waitFor } from '../tests/e2e/lib/util.mjs';
import { nowMs, percentile, summarize, load, burst, compiledLoad, answerError, postJson, procMemory, watchPeak, metricSum, cpuSeconds } from './lib.mjs';
import { benchSvm as svmPhase } from './svm.mjs';
import { x402rsBin, x402rsSettle, x402rsVerify } from './x402rs.mjs';
import { benchBatch as batchPhase, batchLines, batchFailures } from './batch.mjs';

const repo = join(dirname(fileURLToPath(import.meta.url)), '..');
const { values: opts } = parseArgs({
  options: {
    json: { type: 'string' }, quick: { type: 'boolean', default: false }, only: { type: 'string' },
    // How `--only settle`'s routerd learns of new blocks: polling over HTTP at the default
    // interval (poll, the default configuration), or a newHeads subscription (ws). The whole run
    // measures the burst both ways, and on PostgreSQL with polled heads.
    heads: { type: 'string', default: 'poll' },
    // The settle phase's store: the embedded default (sled), or a throwaway PostgreSQL cluster.
    store: { type: 'string', default: 'sled' },
  },
});
if (!['sled', 'postgres'].includes(opts.store)) throw new Error(`--store: sled or postgres, not ${opts.store}`);
if (!['ws', 'poll'].includes(opts.heads)) throw new Error(`--heads: ws or poll, not ${opts.heads}`);
// --quick: a smoke run of the script itself (small counts); its numbers are not for comparison.
const Q = opts.quick ? 0.1 : 1;
const n = (x) => Math.max(5, Math.round(x * Q));

// The production log level: the harness default (routerd=debug) would measure log formatting.
process.env.RUST_LOG = process.env.BENCH_RUST_LOG ?? 'info';

/**
 * Rounds of verifies at concurrency 64, routerd's and the same read straight to anvil in turns,
 * each on payments of its own: a run lasts about a second, and one run of each swung their ratio
 * by a tenth from one bench to the next. The median round of each is reported.
 */
const VERIFY_ROUNDS = 3;

/** routerd's count of the HTTP requests it has sent its nodes. */
const UPSTREAM_REQUESTS = 'routerd_upstream_requests_total';

/** The run of median throughput. */
const median = (runs) => [...runs].sort((a, b) => a.rps - b.rps)[Math.floor(runs.length / 2)];

const BOUNDS = {
  verifyWarmup: n(100),
  verifyCount: n(256),
  verifySerial: { total: n(1000), maxMs: 10_000 },
  // Distinct bodies, each sent once: a verify cached per body would measure the cache. Sent by
  // the compiled client (compiledLoad), as wrk would: enough of them for a few seconds of load.
  verifyConcurrent: { concurrency: 64, total: n(8192), maxMs: 20_000 },
  settleSerial: n(20),
  settleLoad: { total: n(2000), payers: n(250), concurrency: n(1000), maxMs: 60_000 },
  routerWarmup: n(50),
  routerSerial: { total: n(1000), maxMs: 10_000 },
  routerConcurrent: { concurrency: 64, total: n(2000), maxMs: 20_000 },
  upstreamBatch: { total: n(1000), maxMs: 5_000 },
  // Signed transfers sent one at a time, alternately through routerd and straight to the node.
  sends: n(200),
  idleWindowCapMs: 30_000,
  startupRecords: n(100_000),
  // A stranger's no-key flood of failing verifies while a merchant settles one payment at a time.
  flood: { concurrency: 64, honest: n(20), maxMs: 60_000 },
  startupRuns: 3,
  // Solana: verifies against the test node (one process running the SVM), settles at 400 ms slots.
  svm: {
    upstreamVerifies: n(100),
    warmup: n(50),
    serial: { total: n(300), maxMs: 10_000 },
    concurrent: { concurrency: 64, total: n(2000), maxMs: 20_000 },
    settleSerial: n(20),
    settleConcurrent: { concurrency: 64, total: n(200) },
    settleCalls: { concurrency: 50, total: n(200) },
  },
  // batch-settlement: vouchers verified by routerd and by the official facilitator on as many
  // channels, then one-row claims of every channel's merchant sent at once.
  batch: {
    channels: n(128),
    depositConcurrency: 16,
    counted: n(256),
    warmup: n(100),
    // Distinct bodies, each sent once: the pool bounds the run as much as the time does.
    routerd: { concurrency: 64, total: n(12_288), maxMs: 8_000 },
    reference: { concurrency: 64, total: n(4096), maxMs: 8_000 },
    // The second claim burst: room for every row in one transaction.
    wideMaxCalls: n(128),
    // Payers at once through the official shop, each a deposit then `vouchers` vouchers; each of
    // the four runs (two on routerd, two on the instrument) stops at maxMs.
    burst: { payers: n(250), vouchers: opts.quick ? 5 : 20, maxMs: 12_000 },
  },
};

const results = { machine: {}, verify: {}, settle: {}, flood: {}, memory: {}, router: {}, startup: {}, svm: {}, batch: {}, ratios: {} };
const log = (msg) => console.error(`bench: ${msg}`);

// ---------------------------------------------------------------------------------------------
// machine and versions

function machine() {
  let model = cpus()[0]?.model ?? 'unknown';
  try {
    const m = readFileSync('/proc/cpuinfo', 'utf8').match(/^model name\s*:\s*(.+)$/m);
    if (m) model = m[1].trim();
  } catch { /* not Linux */ }
  const tryRun = (cmd, args) => {
    try {
      return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim().split('\n')[0];
    } catch {
      return 'unknown';
    }
  };
  let nproc = availableParallelism();
  const nprocOut = tryRun('nproc', []);
  if (/^\d+$/.test(nprocOut)) nproc = Number(nprocOut);
  const commit = tryRun('git', ['rev-parse', '--short', 'HEAD']);
  const dirty = tryRun('git', ['status', '--porcelain', '--untracked-files=no']) !== '' ? '+dirty' : '';
  return {
    nproc,
    model,
    node: process.version,
    anvil: tryRun(anvilBin(), ['--version']),
    routerd: tryRun(routerdBin(), ['--version']),
    routerdBin: routerdBin(),
    rustc: tryRun('rustc', ['--version']),
    commit: commit === 'unknown' ? commit : `${commit}${dirty}`,
    rustLog: process.env.RUST_LOG,
  };
}

// ---------------------------------------------------------------------------------------------
// a+b+c: facilitator

/** The lens call routerd's verify sends for an ERC-3009 payment from an EOA. */
function lensCall(token, authorization, payTo, id = 1) {
  const ask = erc3009Ask({ token, from: authorization.from, payTo, nonce: authorization.nonce });
  return lensEthCall(encodeFunctionData({ abi: LENS_ABI, functionName: 'facts', args: [ask] }), id);
}

/** Signs `count` distinct payments (each body is sent once), 256 at a time. */
async function signPayments(stack, count, payTo) {
  const out = [];
  while (out.length < count) {
    const batch = Math.min(256, count - out.length);
    out.push(...await Promise.all(Array.from({ length: batch }, (_, i) => stack.pay({
      account: stack.payers[(out.length + i) % stack.payers.length], payTo, amount: 1000n,
    }))));
  }
  return out;
}

/** A verify answered valid, as the compiled client read it. */
const validAnswer = (a) => a.status === 200 && a.body?.isValid === true;

/** `payments`' bodies verified at `url` once each by the compiled client (compiledLoad). */
const compiledVerifies = (url, payments, { concurrency, maxMs }) => compiledLoad({
  bin: settleBurstBin(), url, bodies: payments.map((p) => JSON.stringify(p.body)), concurrency, maxMs, good: validAnswer,
});

async function benchVerify() {
  log('verify: starting an auto-mining anvil with USDC, a counting proxy and routerd');
  const proxy = await startFilteringProxy();
  let throughProxy = true;
  const stack = await startFacilitatorStack({
    fundedPayers: 16,
    rpcUrlFor: (name, url) => {
      proxy.target = url;
      return throughProxy ? proxy.url : url;
    },
  });
  try {
    const payTo = freshAccount().address;
    const { verifyCount, verifySerial, verifyConcurrent, verifyWarmup } = BOUNDS;
    const rounds = VERIFY_ROUNDS;
    log(`verify: signing ${verifyCount + verifySerial.total + verifyConcurrent.total * rounds + verifyWarmup} distinct payments`);
    const counted = await signPayments(stack, verifyCount, payTo);
    const warm = await signPayments(stack, verifyWarmup, payTo);
    const serialPool = await signPayments(stack, verifySerial.total, payTo);
    const pools = [];
    for (let r = 0; r < rounds; r++) pools.push(await signPayments(stack, verifyConcurrent.total, payTo));
    const pool = pools[0];
    const url = () => `${stack.url}/verify`;
    const verifier = (payments) => async (i) => {
      const res = await postJson(url(), JSON.stringify(payments[i % payments.length].body));
      return res.status === 200 && res.body?.isValid === true;
    };
    const compiled = (payments, bounds) => compiledVerifies(url(), payments, bounds);

    // Upstream calls and HTTP requests per verify, counted at the proxy: every JSON-RPC call and
    // request that reached the node while the verifies ran, less the head polling seen over an
    // idle window of the same length.
    log(`verify: ${verifyCount} verifies through the counting proxy`);
    const callsSince = (from) => proxy.state.requests.slice(from).reduce((n, methods) => n + methods.length, 0);
    const requestsSince = (from) => proxy.state.requests.length - from;
    await waitFor(async () => (await stack.request('/ready')).body?.readModes?.[stack.network] === 'lens', { what: 'lens read mode' });
    let mark = proxy.state.requests.length;
    let t0 = nowMs();
    const countRun = await load({ concurrency: 8, total: verifyCount, maxMs: 30_000, call: verifier(counted) });
    const countMs = nowMs() - t0;
    const during = callsSince(mark);
    const requestsDuring = requestsSince(mark);
    mark = proxy.state.requests.length;
    t0 = nowMs();
    await sleep(countMs);
    const idleMs = nowMs() - t0;
    const idle = (callsSince(mark) * countMs) / idleMs;
    const idleRequests = (requestsSince(mark) * countMs) / idleMs;
    const readMode = (await stack.request('/ready')).body?.readModes?.[stack.network];

    log('verify: routerd restarted straight on anvil; warm-up, then concurrency 1 and 64');
    throughProxy = false;
    stack.reconfigure({});
    await stack.routerd.stop();
    await stack.routerd.start();
    const pid = stack.routerd.child.pid;
    await waitFor(async () => (await stack.request('/ready')).body?.readModes?.[stack.network] === 'lens', { what: 'lens read mode' });
    results.memory.facilitator = { idle: procMemory(pid) };
    await load({ concurrency: 4, total: verifyWarmup, maxMs: 10_000, call: verifier(warm) });
    const c1 = await compiled(serialPool, { concurrency: 1, maxMs: verifySerial.maxMs });

    // The same read posted straight to anvil: its warm-up and concurrency 1 first, then at 64
    // in turns with routerd's (a machine's spells of other work fall on both alike).
    const directOf = (payments) => payments.map((p) => JSON.stringify(lensCall(stack.usdc, p.authorization, payTo)));
    const direct = directOf(pool);
    const anvilOnce = async (i) => {
      const res = await postJson(stack.anvil.url, direct[i % direct.length]);
      return res.status === 200 && typeof res.body?.result === 'string' && res.body.result.length > 2;
    };
    const anvilRun = (bodies, bounds) => compiledLoad({
      bin: settleBurstBin(), url: stack.anvil.url, bodies, ...bounds,
      good: (a) => a.status === 200 && typeof a.body?.result === 'string' && a.body.result.length > 2,
    });
    await load({ concurrency: 4, total: verifyWarmup, maxMs: 10_000, call: anvilOnce });
    const a1 = await anvilRun(direct.slice(0, verifySerial.total), { concurrency: 1, maxMs: verifySerial.maxMs });

    log(`verify: routerd and the same read straight to anvil at concurrency 64, in turns, ${rounds} rounds of distinct payments`);
    const cpu = { user: 0, system: 0 };
    let requestsAt64 = 0;
    const c64Runs = [];
    const a64Runs = [];
    for (const [r, payments] of pools.entries()) {
      const cpu0 = cpuSeconds(pid);
      const requests0 = await metricSum(stack.url, UPSTREAM_REQUESTS);
      c64Runs.push(await compiled(payments, verifyConcurrent));
      requestsAt64 += (await metricSum(stack.url, UPSTREAM_REQUESTS)) - requests0;
      const cpu1 = cpuSeconds(pid);
      cpu.user += cpu1.user - cpu0.user;
      cpu.system += cpu1.system - cpu0.system;
      a64Runs.push(await anvilRun(r === 0 ? direct : directOf(payments), verifyConcurrent));
    }
    const c64 = median(c64Runs);
    const a64 = median(a64Runs);
    const verified64 = c64Runs.reduce((n, run) => n + run.latencies.length, 0);
    results.memory.facilitator.afterVerify = procMemory(pid);
    const traced = await benchTraced(stack, payTo, verifier, compiled);
    const floor = await benchFloor(stack.anvil.url, warm, pool);
    // Last: x402-rs puts stand-in code on the chain (bench/x402rs.mjs says why).
    const x402rs = await x402rsVerify({ stack, pool, warm, ...verifyConcurrent, signerKey: anvilKey(9), burstBin: settleBurstBin() });

    const stats = (r) => ({ ...summarize(r.latencies), rps: r.rps, failed: r.failed, firstError: r.firstError });
    results.verify = {
      readMode,
      c1: stats(c1),
      c64: stats(c64),
      c64Runs: c64Runs.map((run) => run.rps),
      anvil1: stats(a1),
      anvil64: stats(a64),
      anvil64Runs: a64Runs.map((run) => run.rps),
      x402rs,
      upstream: { verifies: countRun.latencies.length, failed: countRun.failed, calls: during, background: idle,
        perVerify: (during - idle) / countRun.latencies.length, requests: requestsDuring,
        requestsPerVerify: (requestsDuring - idleRequests) / countRun.latencies.length },
      cpuMicrosPerVerify: ((cpu.user + cpu.system) * 1e6) / verified64,
      requestsPerVerifyAt64: requestsAt64 / verified64,
      cpuSeconds: cpu.user + cpu.system,
      userMicrosPerVerify: (cpu.user * 1e6) / verified64,
      systemMicrosPerVerify: (cpu.system * 1e6) / verified64,
      floor,
      traced,
    };
  } finally {
    await stack.stop();
    await proxy.close();
  }
}

/** A local OTLP/HTTP collector that takes every export and keeps only its count and size. */
function startSink() {
  const state = { exports: 0, bytes: 0 };
  const server = createServer((req, res) => {
    req.on('data', (c) => { state.bytes += c.length; });
    req.on('end', () => {
      state.exports += 1;
      res.writeHead(200, { 'content-type': 'application/x-protobuf' });
      res.end();
    });
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => resolve({
      state, url: `http://127.0.0.1:${server.address().port}`, close: () => new Promise((done) => server.close(done)),
    }));
  });
}

/**
 * The cost of tracing: the same verifies (fresh bodies) with `[telemetry]` on, every trace kept
 * (the default ratio) and exported over OTLP/HTTP protobuf to a sink on this machine; routerd's
 * CPU per verify at concurrency 64 beside the untraced run's. Leaves routerd as it found it.
 */
async function benchTraced(stack, payTo, verifier, compiled) {
  const { verifySerial, verifyConcurrent, verifyWarmup } = BOUNDS;
  log(`verify: telemetry on (OTLP/HTTP to a local sink); signing ${verifySerial.total + verifyConcurrent.total + verifyWarmup} more payments`);
  const warm = await signPayments(stack, verifyWarmup, payTo);
  const serialPool = await signPayments(stack, verifySerial.total, payTo);
  const pool = await signPayments(stack, verifyConcurrent.total, payTo);
  const sink = await startSink();
  const untraced = stack.config.routerdOpts;
  try {
    stack.reconfigure({ routerdOpts: { ...untraced, extra: `${untraced.extra ?? ''}\n[telemetry]\notlp_endpoint = "${sink.url}"\n` } });
    await stack.routerd.restart();
    const pid = stack.routerd.child.pid;
    await waitFor(async () => (await stack.request('/ready')).body?.readModes?.[stack.network] === 'lens', { what: 'lens read mode' });
    await load({ concurrency: 4, total: verifyWarmup, maxMs: 10_000, call: verifier(warm) });
    const c1 = await compiled(serialPool, { concurrency: 1, maxMs: verifySerial.maxMs });
    const cpu0 = cpuSeconds(pid);
    const c64 = await compiled(pool, verifyConcurrent);
    const cpu1 = cpuSeconds(pid);
    // Stopping exports what is still queued: the sink's count is then the whole run's.
    await stack.routerd.stop();
    const cpu = cpu1.user - cpu0.user + cpu1.system - cpu0.system;
    const stats = (r) => ({ ...summarize(r.latencies), rps: r.rps, failed: r.failed, firstError: r.firstError });
    return {
      c1: stats(c1), c64: stats(c64), cpuMicrosPerVerify: (cpu * 1e6) / c64.latencies.length,
      exports: sink.state.exports, exportedKiB: sink.state.bytes / 1024,
    };
  } finally {
    stack.reconfigure({ routerdOpts: untraced });
    if (!stack.routerd.running) await stack.routerd.start();
    await sink.close();
  }
}

/**
 * The transport floor (bench/transport_floor.rs): routerd's HTTP server and upstream client as
 * routerd uses them, one upstream batch per request, and no payment work. Sent the same bodies as
 * verify, its CPU per request is the least a verify can cost on this stack. Holding every request
 * 1 s (a settlement waiting for its block) at the settle phase's concurrency, its peak RSS is the
 * least that many waiting requests can take.
 */
async function benchFloor(upstreamUrl, warm, pool) {
  const bin = process.env.TRANSPORT_FLOOR_BIN;
  if (!bin || !existsSync(bin)) {
    log('verify: TRANSPORT_FLOOR_BIN is not set (scripts/bench builds the transport-floor example); floor skipped');
    return null;
  }
  const start = async (holdMs) => {
    const child = trackChild(spawn(bin, [upstreamUrl, String(holdMs)], { stdio: ['ignore', 'pipe', 'inherit'] }));
    const port = await new Promise((resolve, reject) => {
      child.stdout.once('data', (line) => resolve(Number(String(line).trim())));
      child.once('exit', (code) => reject(new Error(`transport-floor exited with ${code}`)));
    });
    return { child, url: `http://127.0.0.1:${port}/verify` };
  };
  const answered = (url, payments) => async (i) => {
    const res = await postJson(url, JSON.stringify(payments[i % payments.length].body));
    return res.status === 200 && res.body?.isValid === true;
  };
  log('verify: the transport floor, the same bodies at concurrency 64, then held 1 s at the settle concurrency');
  const quick = await start(0);
  let c64;
  let cpu;
  try {
    await load({ concurrency: 4, total: BOUNDS.verifyWarmup, maxMs: 10_000, call: answered(quick.url, warm) });
    const cpu0 = cpuSeconds(quick.child.pid);
    c64 = await compiledVerifies(quick.url, pool, BOUNDS.verifyConcurrent);
    const cpu1 = cpuSeconds(quick.child.pid);
    cpu = { user: cpu1.user - cpu0.user, system: cpu1.system - cpu0.system };
  } finally {
    quick.child.kill('SIGKILL');
  }
  const held = await start(1000);
  try {
    await sleep(1000);
    results.memory.floor = { idle: procMemory(held.child.pid) };
    const { concurrency, total } = BOUNDS.settleLoad;
    const bodies = Array.from({ length: total }, (_, i) => JSON.stringify(pool[i % pool.length].body));
    const peak = watchPeak(held.child.pid);
    // The settle burst's own load generator, so that both peaks hold the same client's
    // connections (Node's client, used before, gave the same peak within 0.2 MiB).
    const sent = await burst({ bin: settleBurstBin(), url: held.url, bodies, concurrency, maxMs: 60_000 });
    results.memory.floor.peak = peak.stop();
    results.memory.floor.afterHeld = procMemory(held.child.pid);
    const failedHeld = sent.filter((res) => !(res.status === 200 && res.body?.isValid === true));
    const n = c64.latencies.length;
    return {
      c64: { ...summarize(c64.latencies), rps: c64.rps, failed: c64.failed, firstError: c64.firstError },
      held: {
        n: sent.length - failedHeld.length, concurrency, failed: failedHeld.length,
        firstError: failedHeld[0] && answerError(failedHeld[0]),
      },
      cpuMicrosPerRequest: ((cpu.user + cpu.system) * 1e6) / n,
      userMicrosPerRequest: (cpu.user * 1e6) / n,
      systemMicrosPerRequest: (cpu.system * 1e6) / n,
    };
  } finally {
    held.child.kill('SIGKILL');
  }
}

/**
 * Records when each block number was first seen, in epoch milliseconds. The polling runs in a
 * child process: the load generator's own event loop, busy with a thousand requests, would
 * notice blocks late.
 */
function watchBlocks(url) {
  const arrivals = new Map();
  const script = `
    const seen = new Set();
    const body = '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}';
    (async () => {
      for (;;) {
        try {
          const res = await fetch(${JSON.stringify(url)}, { method: 'POST', body, headers: { 'content-type': 'application/json' } });
          const n = Number(BigInt((await res.json()).result));
          if (!seen.has(n)) { seen.add(n); console.log(n + ' ' + (performance.timeOrigin + performance.now())); }
        } catch {}
        await new Promise((r) => setTimeout(r, 2));
      }
    })();`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  let rest = '';
  child.stdout.on('data', (chunk) => {
    const lines = (rest + chunk).split('\n');
    rest = lines.pop();
    for (const line of lines) {
      const [n, at] = line.split(' ').map(Number);
      arrivals.set(n, at);
    }
  });
  return { arrivals, async stop() { child.kill(); await new Promise((r) => child.once('exit', r)); } };
}

/**
 * Settlements per block: the counts of the blocks between the first and the last (the first is
 * filled only as far as the burst had reached when it sealed, the last with what was left), and
 * the first block's phase: how far into the 1 s block interval the burst started, and how many it
 * took. A burst that starts just before a block seals loses most of that block, which is why the
 * settles/s figure is read together with this phase.
 */
function byBlockCounts(receipts, arrivals, loadStartEpoch) {
  const counts = new Map();
  for (const r of receipts) {
    const b = Number(r.blockNumber);
    counts.set(b, (counts.get(b) ?? 0) + 1);
  }
  const numbers = [...counts.keys()].sort((a, b) => a - b);
  const middle = numbers.slice(1, -1).map((b) => counts.get(b));
  const first = numbers[0];
  // The first block sealed after the burst began, and the one before it: the burst's phase is
  // where its start fell between the two.
  const [next, nextAt] = [...arrivals.entries()].filter(([, at]) => at > loadStartEpoch).sort((x, y) => x[0] - y[0])[0] ?? [];
  const previous = arrivals.get(next - 1);
  return {
    perBlockMiddle: middle,
    firstBlock: {
      settlements: counts.get(first) ?? 0,
      // Blocks sealed after the burst began that held none of its settlements.
      emptyBefore: Number.isFinite(next) ? first - next : NaN,
      // The burst's start within the interval of the first block sealed after it (0 = just after a block).
      phase: Number.isFinite(previous) && Number.isFinite(nextAt) ? (loadStartEpoch - previous) / (nextAt - previous) : NaN,
    },
    lastBlockSettlements: numbers.length > 1 ? counts.get(numbers.at(-1)) : 0,
  };
}

/**
 * Block-to-answer as routerd gives it: for each settle answered, the time of routerd's request
 * log line (written as the answer leaves it) minus its block's arrival. The load generator's
 * own figure adds the time its one thread takes to read hundreds of answers arriving at once.
 */
function answersWritten(log, answers, receipts, arrivals) {
  const blockOf = new Map(answers.map((a, i) => [a.tx.toLowerCase(), Number(receipts[i].blockNumber)]));
  const written = [];
  const line = /^(\S+Z) .*route="\/settle" status=200 .*outcome="settled (0x[0-9a-fA-F]{64})"/;
  for (const text of log.split('\n')) {
    const m = line.exec(text);
    const block = m ? blockOf.get(m[2].toLowerCase()) : undefined;
    if (block !== undefined) written.push(Date.parse(m[1]) - arrivals.get(block));
  }
  return written.filter(Number.isFinite);
}

/** Epoch milliseconds, comparable with watchBlocks' child process. */
const epochMs = () => performance.timeOrigin + performance.now();

/** A throwaway PostgreSQL cluster (scripts/pg-cluster) for `--store postgres`. */
function startPostgres() {
  const dir = makeTempDir();
  const url = execFileSync(join(repo, 'scripts', 'pg-cluster'), ['start', dir.dir], { encoding: 'utf8' }).trim();
  return {
    url,
    stop() {
      execFileSync(join(repo, 'scripts', 'pg-cluster'), ['stop', dir.dir], { stdio: 'ignore' });
      dir.cleanup();
    },
  };
}

/** The stack's routerd on `pg` from its next start (the URL by environment, as operators pass it). */
function usePostgres(stack, pg) {
  process.env.ROUTERD__STORAGE__POSTGRES_URL = pg.url;
  const toml = readFileSync(stack.routerd.configFile, 'utf8');
  writeFileSync(stack.routerd.configFile, toml.replace(/\[storage\]\npath = "[^"]*"\n/, '[storage]\nbackend = "postgres"\n'));
}

/** The settle burst's load generator (scripts/bench builds the settle-burst example). */
function settleBurstBin() {
  const bin = process.env.SETTLE_BURST_BIN;
  if (!bin || !existsSync(bin)) throw new Error('SETTLE_BURST_BIN is not set (scripts/bench builds the settle-burst example)');
  return bin;
}

/** The settle phases of a whole run: the default configuration first (its sequential settles too). */
const SETTLE_RUNS = [
  { key: 'settle', heads: 'poll', store: 'sled', serial: true },
  { key: 'settleWs', heads: 'ws', store: 'sled', serial: false },
  { key: 'settlePg', heads: 'poll', store: 'postgres', serial: false },
];

/** How a settle run's routerd follows heads and stores its records, as the table names it. */
const settleSetup = (x) => `${x.heads === 'ws' ? 'newHeads' : 'polled heads'}, ${x.store}`;

/**
 * The settle burst on a routerd following heads by `heads` (`poll` or `ws`) and storing in
 * `store` (`sled` or `postgres`); with `serial`, first the sequential settles. Its figures go
 * to `results[key]` and its memory to `results.memory[key]`.
 */
async function benchSettle({ key, heads, store, serial: withSerial }) {
  const { settleLoad } = BOUNDS;
  const settleSerial = withSerial ? BOUNDS.settleSerial : 0;
  const pg = store === 'postgres' ? startPostgres() : undefined;
  log(`settle (${settleSetup({ heads, store })}): anvil with USDC and ${settleLoad.payers} funded payers, then 1 s interval mining; routerd`);
  const stack = await startFacilitatorStack({ fundedPayers: settleLoad.payers, payerFunds: 1_000_000_000n });
  try {
    await postJson(stack.anvil.url, '{"jsonrpc":"2.0","id":1,"method":"evm_setIntervalMining","params":[1]}');
    // New heads by subscription, as an operator with a WebSocket URL runs it (--heads ws), or
    // by polling alone (--heads poll).
    if (heads === 'ws') stack.reconfigure({ chainExtra: `ws_urls = ["${stack.anvil.url.replace(/^http/, 'ws')}"]\n` });
    if (store === 'postgres') usePostgres(stack, pg);
    await stack.routerd.stop();
    await stack.routerd.start();
    const pid = stack.routerd.child.pid;
    await sleep(1000);
    const memory = { idle: procMemory(pid) };
    results.memory[key] = memory;
    const payTo = freshAccount().address;
    const serialPayments = await signPayments(stack, settleSerial, payTo);
    const loadPayments = await signPayments(stack, settleLoad.total, payTo);
    const url = `${stack.url}/settle`;
    const settled = (res) => res.status === 200 && res.body?.success === true && /^0x[0-9a-f]{64}$/i.test(res.body.transaction ?? '');

    if (settleSerial) log(`settle: ${settleSerial} sequential`);
    const serial = [];
    let serialFailed = 0;
    let firstError;
    for (const p of serialPayments) {
      const t0 = nowMs();
      const res = await postJson(url, JSON.stringify(p.body));
      serial.push(nowMs() - t0);
      if (!settled(res)) {
        serialFailed += 1;
        firstError ??= answerError(res);
      }
    }

    log(`settle: ${settleLoad.total} distinct payments from ${settleLoad.payers} payers at concurrency ${settleLoad.concurrency}`);
    const loadBodies = loadPayments.map((p) => JSON.stringify(p.body));
    const blocks = watchBlocks(stack.anvil.url);
    await sleep(1100); // a block boundary seen before the load starts
    const answers = [];
    const loadStart = nowMs();
    const loadStartEpoch = epochMs();
    const peak = watchPeak(pid);
    const sent = await burst({
      bin: settleBurstBin(), url, bodies: loadBodies, concurrency: settleLoad.concurrency, maxMs: settleLoad.maxMs,
    });
    let loadFailed = 0;
    for (const res of sent) {
      if (settled(res)) answers.push({ at: res.at, tx: res.body.transaction });
      else {
        loadFailed += 1;
        firstError ??= answerError(res);
      }
    }
    const latencies = sent.filter((res) => res.error === undefined).map((res) => res.ms);
    const wallMs = nowMs() - loadStart;
    await sleep(1500);
    await blocks.stop();
    memory.peak = peak.stop();
    memory.afterSettle = procMemory(pid);

    log('settle: reading every receipt back from the chain');
    const receipts = [];
    for (let i = 0; i < answers.length; i += 200) {
      receipts.push(...await Promise.all(answers.slice(i, i + 200).map((a) => stack.receipt(a.tx))));
    }
    const confirmed = receipts.filter((r) => r.status === 'success').length;
    const blockToAnswer = answers.map((a, i) => a.at - blocks.arrivals.get(Number(receipts[i].blockNumber))).filter(Number.isFinite);
    const routerdLog = readFileSync(stack.routerd.logFile, 'utf8');
    const blockToWritten = answersWritten(routerdLog, answers, receipts, blocks.arrivals);
    const gas = receipts.map((r) => Number(r.gasUsed)).sort((a, b) => a - b);
    if (process.env.BENCH_TRACE) {
      const byBlock = {};
      receipts.forEach((r, i) => {
        const b = Number(r.blockNumber);
        // `at`: the block's arrival in epoch ms, to set beside routerd's log lines.
        byBlock[b] ??= { n: 0, at: blocks.arrivals.get(b), arrived: blocks.arrivals.get(b) - loadStartEpoch, firstAnswer: Infinity, lastAnswer: 0 };
        byBlock[b].n += 1;
        byBlock[b].firstAnswer = Math.min(byBlock[b].firstAnswer, answers[i].at - loadStartEpoch);
        byBlock[b].lastAnswer = Math.max(byBlock[b].lastAnswer, answers[i].at - loadStartEpoch);
      });
      console.error(JSON.stringify(byBlock));
      // routerd's own steps per head and per signed batch, when its log has them
      // (BENCH_RUST_LOG=info,routerd::facilitator::settlement=debug).
      for (const line of routerdLog.split('\n')) {
        if (line.includes('head followed') || line.includes('batch signed')) console.error(line);
      }
    }
    const block = await stack.client.getBlock();
    // A node takes a transaction into a block while the gas left covers its gas limit (not the
    // gas it will use): the block is full once the gas left is below one settlement's limit.
    const txGas = answers.length ? Number((await stack.client.getTransaction({ hash: answers[0].tx })).gas) : 0;
    const medianGas = gas[Math.floor(gas.length / 2)];
    const perBlock = Math.floor((Number(block.gasLimit) - txGas) / medianGas) + 1;
    const blocksOf = byBlockCounts(receipts, blocks.arrivals, loadStartEpoch);

    results[key] = {
      key,
      heads,
      store,
      serial: settleSerial ? { ...summarize(serial), failed: serialFailed } : undefined,
      load: {
        ...summarize(latencies), failed: loadFailed, wallMs, rps: (answers.length / wallMs) * 1000,
        confirmed, concurrency: settleLoad.concurrency, payers: settleLoad.payers,
        blockToAnswer: summarize(blockToAnswer),
        blockToWritten: summarize(blockToWritten),
        medianGas, txGas, gasLimit: Number(block.gasLimit), capacityPerSecond: perBlock,
        blocksUsed: new Set(receipts.map((r) => r.blockNumber)).size,
        ...blocksOf,
      },
      firstError,
    };
    if (key === 'settle') {
      // The same burst of fresh payments through x402-rs on the same chain, for its peak RSS.
      const bodies = (await signPayments(stack, settleLoad.total, payTo)).map((p) => JSON.stringify(p.body));
      if (x402rsBin()) log(`settle: the same burst through x402-rs (X402RS_BIN)`);
      results.x402rsSettle = await x402rsSettle({
        stack, bodies, concurrency: settleLoad.concurrency, maxMs: settleLoad.maxMs, signerKey: anvilKey(9), burst, burstBin: settleBurstBin(),
      });
    }
  } finally {
    await stack.stop();
    if (pg) {
      delete process.env.ROUTERD__STORAGE__POSTGRES_URL;
      pg.stop();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// f: an honest merchant's settles while a stranger floods /verify (access.md section 3b)

/**
 * A stranger without an API key sends failing verifies (payers without funds: each one reads the
 * chain) at concurrency 64 from the start to the end of the phase, while a merchant settles its
 * payments one at a time on a chain mining every second. The merchant's settle latencies, the
 * flood's answered rate (and how many it was told 503, busy) and routerd's peak RSS.
 */
async function benchFlood() {
  const { concurrency, honest, maxMs } = BOUNDS.flood;
  log(`flood: ${honest} sequential settles while ${concurrency} workers flood /verify with failing payments`);
  const stack = await startFacilitatorStack({ fundedPayers: 1, payerFunds: 1_000_000_000n });
  try {
    await postJson(stack.anvil.url, '{"jsonrpc":"2.0","id":1,"method":"evm_setIntervalMining","params":[1]}');
    const pid = stack.routerd.child.pid;
    const payTo = freshAccount().address;
    const payments = [];
    for (let i = 0; i < honest; i += 1) payments.push(await stack.pay({ account: stack.payers[0], payTo, amount: 1000n }));
    const failing = await Promise.all(Array.from({ length: 256 }, () => stack.pay({ account: freshAccount(), payTo, amount: 1000n })));
    let over = false;
    const flood = { answered: 0, busy: 0, failed: 0 };
    const floodStart = nowMs();
    const workers = Array.from({ length: concurrency }, async (_, w) => {
      for (let i = w; !over && nowMs() - floodStart < maxMs; i += concurrency) {
        const res = await postJson(`${stack.url}/verify`, JSON.stringify(failing[i % failing.length].body)).catch(() => null);
        if (!res) flood.failed += 1;
        else if (res.status === 503) flood.busy += 1;
        else flood.answered += 1;
      }
    });
    const latencies = [];
    let failed = 0;
    let firstError;
    for (const p of payments) {
      const t0 = nowMs();
      const res = await postJson(`${stack.url}/settle`, JSON.stringify(p.body));
      latencies.push(nowMs() - t0);
      if (res.status !== 200 || res.body?.success !== true) {
        failed += 1;
        firstError ??= answerError(res);
      }
    }
    over = true;
    await Promise.all(workers);
    const floodMs = nowMs() - floodStart;
    results.flood = {
      settle: { ...summarize(latencies), failed },
      flood: { ...flood, rps: (flood.answered / floodMs) * 1000, seconds: floodMs / 1000 },
      memory: procMemory(pid),
      firstError,
    };
  } finally {
    await stack.stop();
  }
}

// ---------------------------------------------------------------------------------------------
// e: start-up time against the ledger's history

/**
 * Start-up reads only the unfinished-settlement index, so it must not grow with finished records:
 * the daemon is restarted on an empty store, then on the same store holding 100,000 finished
 * records (written by the seed-ledger example), and each start is timed until /health answers.
 */
async function benchStartup() {
  const seed = process.env.SEED_LEDGER_BIN;
  if (!seed || !existsSync(seed)) throw new Error('SEED_LEDGER_BIN is not set (scripts/bench builds the seed-ledger example)');
  log(`startup: restarts on an empty store, then with ${BOUNDS.startupRecords} finished records`);
  const stack = await startFacilitatorStack({});
  try {
    const restarts = async () => {
      const times = [];
      for (let i = 0; i < BOUNDS.startupRuns; i += 1) {
        await stack.routerd.stop();
        const t0 = nowMs();
        await stack.routerd.start();
        times.push(nowMs() - t0);
      }
      return summarize(times);
    };
    const empty = await restarts();
    await stack.routerd.stop();
    execFileSync(seed, [join(stack.tmp.dir, 'routerd.db'), String(BOUNDS.startupRecords)], { stdio: ['ignore', 'ignore', 'inherit'] });
    const seeded = await restarts();
    results.startup = { records: BOUNDS.startupRecords, empty, seeded };
  } finally {
    await stack.stop();
  }
}

/**
 * The embedded store alone with the settle burst's records (bench/store_memory.rs): as many
 * records as the burst settles, written in the steps and blocks a lane writes them, in a process
 * that does nothing else. Its anonymous memory is part of the settle peak that no request path
 * holds and none can give back.
 */
function benchStore() {
  const bin = process.env.STORE_MEMORY_BIN;
  if (!bin || !existsSync(bin)) throw new Error('STORE_MEMORY_BIN is not set (scripts/bench builds the store-memory example)');
  const { total } = BOUNDS.settleLoad;
  log(`store: ${total} settlement records written to a new sled store, a block of 381 at a time, nothing else in the process`);
  const tmp = makeTempDir('routerd-bench-');
  try {
    const out = execFileSync(bin, [join(tmp.dir, 'routerd.db'), String(total)], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
    results.store = JSON.parse(out.trim().split('\n').pop());
  } finally {
    tmp.cleanup();
  }
}

// ---------------------------------------------------------------------------------------------
// d: router

const ROUTER_CHAINS = [
  { name: 'bench-l1', chainId: 900, kind: 'l1', anvil: { baseFee: 20_000_000_000n } },
  { name: 'bench-l2', chainId: 902, kind: 'l2', anvil: {} },
  { name: 'bench-l3', chainId: 901, kind: 'l3', anvil: { hardfork: 'berlin' } },
];
// Anvil's default accounts 2..9 are funded on every chain; 0 and 1 are left alone.
const SENDERS = Array.from({ length: 8 }, (_, i) => anvilAccount(i + 2).address);
const RECIPIENT = anvilAccount(0).address;

function routerToml({ port, dir, chains }) {
  const q = JSON.stringify;
  const parts = [
    `[server]\nlisten = ${q(`127.0.0.1:${port}`)}\nmax_body_bytes = 65536\nshutdown_grace_secs = ${SHUTDOWN_GRACE_SECS}\n`,
    `[storage]\npath = ${q(join(dir, 'routerd.db'))}\n`,
  ];
  for (const c of chains) {
    parts.push(`[chains.${c.name}]\nchain_id = ${c.chainId}\nkind = ${q(c.kind)}\nrpc_urls = [${q(c.anvil.url)}]\nnative_price = 1.0\n`);
  }
  // Thousands of calls for eight senders whose transactions are never sent: far more
  // reservations ahead of the pending nonce than a wallet would hold (the default bound is 16).
  parts.push(`[router]\nchains = [${chains.map((c) => q(c.name)).join(', ')}]\nprefer = ["l2", "l1", "l3"]\n`
    + 'max_reservations_ahead = 1000000\n');
  return parts.join('\n');
}

const routerBody = (i) => JSON.stringify({
  jsonrpc: '2.0', id: i, method: 'eth_routerTransaction',
  params: [{ from: SENDERS[i % SENDERS.length], to: RECIPIENT, data: '0x', value: '1000' }],
});

const batchOk = (res, size) => res.status === 200 && Array.isArray(res.body) && res.body.length === size
  && res.body.every((a) => a.error === undefined && a.result !== undefined);

/** The per-chain batch routerd's probe sends for a plain ETH transfer (src/router/probe.rs ask). */
const upstreamShapedBatch = (i) => {
  const from = SENDERS[i % SENDERS.length];
  return JSON.stringify([
    { jsonrpc: '2.0', id: 1, method: 'eth_estimateGas', params: [{ from, to: RECIPIENT, data: '0x', value: '0x3e8' }] },
    { jsonrpc: '2.0', id: 2, method: 'eth_getTransactionCount', params: [from, 'pending'] },
    { jsonrpc: '2.0', id: 3, method: 'eth_getBalance', params: [from, 'latest'] },
  ]);
};

/**
 * A wallet's send: signed transfers of anvil's account 1 (no other phase uses it) on `chain`, one
 * at a time, alternately `eth_sendRawTransaction` through routerd and straight to the node, so
 * that both see the same chain. What routerd adds is the decode, the chain lookup, the durable
 * record of the hash and the reservation's confirmation.
 */
async function benchSends(routerd, chain) {
  log(`router: ${BOUNDS.sends} signed transfers, alternately through routerd and straight to ${chain.name}`);
  const account = privateKeyToAccount(anvilKey(1));
  const base = Number(BigInt((await postJson(chain.anvil.url, JSON.stringify({
    jsonrpc: '2.0', id: 1, method: 'eth_getTransactionCount', params: [account.address, 'pending'],
  }))).body.result));
  const raws = [];
  for (let i = 0; i < BOUNDS.sends; i += 1) {
    raws.push(await account.signTransaction({
      chainId: chain.chainId, nonce: base + i, to: RECIPIENT, value: 1n, gas: 21_000n,
      maxFeePerGas: 100_000_000_000n, maxPriorityFeePerGas: 1_000_000_000n, type: 'eip1559',
    }));
  }
  const through = [];
  const straight = [];
  let failed = 0;
  for (const [i, raw] of raws.entries()) {
    const url = i % 2 === 0 ? routerd.url : chain.anvil.url;
    const t0 = nowMs();
    const res = await postJson(url, JSON.stringify({ jsonrpc: '2.0', id: i, method: 'eth_sendRawTransaction', params: [raw] }));
    (i % 2 === 0 ? through : straight).push(nowMs() - t0);
    if (!/^0x[0-9a-f]{64}$/i.test(res.body?.result ?? '')) failed += 1;
  }
  return { through: { ...summarize(through), failed }, straight: summarize(straight) };
}

async function benchRouter() {
  log('router: starting three anvil chains (l1 EIP-1559 20 gwei base fee, l2 EIP-1559, l3 legacy berlin)');
  const tmp = makeTempDir('routerd-bench-');
  const chains = [];
  let routerd;
  try {
    for (const c of ROUTER_CHAINS) {
      const anvil = await startAnvil({ chainId: c.chainId, ...c.anvil, logFile: join(tmp.dir, `anvil-${c.name}.log`) });
      chains.push({ ...c, anvil });
    }
    const port = await freePort();
    routerd = await startRouterd({ configToml: routerToml({ port, dir: tmp.dir, chains }), dir: tmp.dir, port });
    const pid = routerd.child.pid;
    await sleep(1000);
    results.memory.router = { idle: procMemory(pid) };

    const chosen = {};
    const routeOnce = async (i) => {
      const res = await postJson(routerd.url, routerBody(i));
      const chainId = res.body?.result?.chainId;
      if (res.status !== 200 || !chainId) return false;
      chosen[chainId] = (chosen[chainId] ?? 0) + 1;
      return true;
    };
    const first = await postJson(routerd.url, routerBody(0));
    if (!first.body?.result?.chainId) throw new Error(`eth_routerTransaction failed: HTTP ${first.status} ${first.text}\n${routerd.tail(30)}`);

    log('router: direct batched upstream round trips per chain');
    const upstream = {};
    for (const c of chains) {
      const once = async (i) => batchOk(await postJson(c.anvil.url, upstreamShapedBatch(i)), 3);
      await load({ concurrency: 1, total: 50, maxMs: 5_000, call: once });
      const r = await load({ concurrency: 1, ...BOUNDS.upstreamBatch, call: once });
      upstream[c.name] = { ...summarize(r.latencies), failed: r.failed };
    }
    // What routerd's probe does: the three batches at once. On a small machine the three nodes
    // share its cores, so this is slower than any one alone; it is the floor for a routed call.
    const allAtOnce = async (i) => (await Promise.all(chains.map(async (c) => batchOk(await postJson(c.anvil.url, upstreamShapedBatch(i)), 3)))).every(Boolean);
    await load({ concurrency: 1, total: 50, maxMs: 5_000, call: allAtOnce });
    const together = await load({ concurrency: 1, ...BOUNDS.upstreamBatch, call: allAtOnce });
    const upstreamTogether = { ...summarize(together.latencies), failed: together.failed };

    log(`router: warm-up (${BOUNDS.routerWarmup}), then sequential and 64 concurrent callers`);
    await load({ concurrency: 4, total: BOUNDS.routerWarmup, maxMs: 10_000, call: routeOnce });
    for (const k of Object.keys(chosen)) delete chosen[k];
    const metric = UPSTREAM_REQUESTS;
    const m0 = await metricSum(routerd.url, metric);
    const t0 = nowMs();
    const serial = await load({ concurrency: 1, ...BOUNDS.routerSerial, call: routeOnce });
    const conc = await load({ ...BOUNDS.routerConcurrent, call: routeOnce });
    const m1 = await metricSum(routerd.url, metric);
    const loadMs = nowMs() - t0;
    const calls = serial.latencies.length + conc.latencies.length;
    results.memory.router.afterLoad = procMemory(pid);

    // Background head polling: the same counter over an idle window as long as the load window
    // (capped), scaled to the load window's length.
    const idleMs = Math.min(loadMs, BOUNDS.idleWindowCapMs);
    log(`router: idle window of ${(idleMs / 1000).toFixed(1)} s for background upstream requests`);
    const i0 = await metricSum(routerd.url, metric);
    const it0 = nowMs();
    await sleep(idleMs);
    const i1 = await metricSum(routerd.url, metric);
    const idleMeasuredMs = nowMs() - it0;
    const background = ((i1 - i0) * loadMs) / idleMeasuredMs;

    const slowest = Object.entries(upstream).reduce((a, b) => (b[1].p50 > a[1].p50 ? b : a));
    results.router = {
      serial: { ...summarize(serial.latencies), rps: serial.rps, failed: serial.failed, firstError: serial.firstError },
      concurrent: { ...summarize(conc.latencies), rps: conc.rps, failed: conc.failed, firstError: conc.firstError },
      upstream,
      upstreamTogether,
      slowestChain: slowest[0],
      chosen: Object.fromEntries(Object.entries(chosen).map(([id, count]) => [
        chains.find((c) => c.chainId === Number(id))?.name ?? id, count,
      ])),
      upstreamRequests: {
        calls,
        loadMs,
        raw: m1 - m0,
        idleWindowMs: idleMeasuredMs,
        idleCount: i1 - i0,
        background,
        rawPerCall: (m1 - m0) / calls,
        netPerCall: (m1 - m0 - background) / calls,
      },
      sends: await benchSends(routerd, chains.find((c) => c.name === 'bench-l2')),
    };
  } catch (err) {
    if (routerd) err.message += `\n--- routerd log tail ---\n${routerd.tail(30)}`;
    throw err;
  } finally {
    if (routerd) await routerd.stop();
    await Promise.all(chains.map((c) => c.anvil.stop()));
    tmp.cleanup();
  }
}

// ---------------------------------------------------------------------------------------------
// the table

const f = (x, d = 2) => (Number.isFinite(x) ? x.toFixed(d) : '-');
const pad = (s, w) => String(s).padEnd(w);
const lpad = (s, w) => String(s).padStart(w);

/**
 * How far one process's peak is above another's, in MiB: in total (VmHWM), and in the anonymous
 * and file-backed parts of each one's sampled peak; `idleFile`: the file-backed difference at idle.
 */
function peakAbove(x, after, floor, floorAfter) {
  return {
    total: x[after].hwmMiB - floor[floorAfter].hwmMiB,
    anon: x.peak.anonMiB - floor.peak.anonMiB,
    file: x.peak.fileMiB - floor.peak.fileMiB,
    idleFile: x.idle.fileMiB - floor.idle.fileMiB,
  };
}

/** A settle run's chain figures, and its goals (the issue's round three) met or not. */
function settleLines(x, memory) {
  const l = x.load;
  const setup = settleSetup(x);
  const mid = l.perBlockMiddle ?? [];
  const midMin = mid.length ? Math.min(...mid) : NaN;
  const met = (ok) => (ok ? 'met' : 'NOT met');
  const peak = memory.afterSettle.hwmMiB;
  return [
    `settle (${setup}): ${l.confirmed} of ${l.n} confirmed on chain in ${l.blocksUsed} blocks; ${f(l.rps, 1)} settles/s over ${f(l.wallMs / 1000, 2)} s; `
      + `capacity ${l.capacityPerSecond}/s (1 s blocks of ${l.gasLimit} gas, the last one taken with ${l.txGas} of gas limit left, `
      + `the others at the median ${l.medianGas} gas used); `
      + `settlements per block: first ${l.firstBlock?.settlements} (the burst began at ${f(l.firstBlock?.phase, 2)} of a block interval; `
      + `${l.firstBlock?.emptyBefore} blocks sealed without its settlements before), then ${mid.join(' ') || '-'}, last ${l.lastBlockSettlements}`,
    `settle (${setup}) goals: block-to-answer p50 ${f(l.blockToAnswer.p50, 0)} ms (<= 100: ${met(l.blockToAnswer.p50 <= 100)}), `
      + `p99 ${f(l.blockToAnswer.p99, 0)} ms (<= 250: ${met(l.blockToAnswer.p99 <= 250)}); `
      + `middle blocks min ${f(midMin, 0)} of the ${l.capacityPerSecond} that fit (every one full: ${met(midMin >= l.capacityPerSecond)}); peak RSS ${f(peak, 1)} MiB`,
    rssGoal(peak, x.key === 'settle' ? results.x402rsSettle : null, met),
  ];
}

/** The peak RSS goal: half of x402-rs's over the same burst when X402RS_BIN ran it, else half of
 * the issue's 102 MiB. */
function rssGoal(peak, x402rs, met) {
  if (!x402rs) {
    return `settle goal: peak RSS ${f(peak, 1)} MiB <= 51 (half of x402-rs 2.0.1's 102 MiB in the issue's run; `
      + `x402-rs not run here: set X402RS_BIN): ${met(peak <= 51)}`;
  }
  const half = x402rs.peak.hwmMiB / 2;
  return `settle goal: peak RSS ${f(peak, 1)} MiB <= half of x402-rs's ${f(x402rs.peak.hwmMiB, 1)} MiB over the same burst `
    + `(X402RS_BIN; it answered ${x402rs.settled} of ${x402rs.sent} settled): ${f(peak / x402rs.peak.hwmMiB, 2)}x, ${met(peak <= half)}`;
}

function table() {
  const { machine: m, verify: v, settle: s, memory: mem, router: r } = results;
  const out = [];
  out.push('routerd bench');
  out.push(`machine  ${m.nproc} CPUs, ${m.model}`);
  out.push(`versions ${m.routerd} (${m.commit}), ${m.anvil}, node ${m.node}, ${m.rustc}; RUST_LOG=${m.rustLog}`);
  out.push(`binary   ${m.routerdBin}${opts.quick ? '   [--quick: smoke run, not comparable]' : ''}`);
  out.push('');
  const W = [44, 9, 9, 9, 9, 7, 6];
  const head = ['figure', 'p50 ms', 'p99 ms', 'max ms', 'req/s', 'n', 'fail'];
  const row = (cells) => cells.map((c, i) => (i === 0 ? pad(c, W[i]) : lpad(c, W[i]))).join(' ');
  out.push(row(head));
  out.push(row(W.map((w) => '-'.repeat(w))));
  const lat = (name, x, { rps = true } = {}) => out.push(row([
    name, f(x.p50), f(x.p99), f(x.max), rps && x.rps !== undefined ? f(x.rps, 0) : '', x.n, x.failed ?? '',
  ]));
  lat(`a verify (${v.readMode} mode), concurrency 1`, v.c1);
  lat(`a verify (${v.readMode} mode), conc 64, median of ${v.c64Runs.length}`, v.c64);
  lat('a verify, telemetry on (OTLP to a sink), conc 1', v.traced.c1);
  lat('a verify, telemetry on (OTLP to a sink), conc 64', v.traced.c64);
  if (v.floor) lat('a transport floor (no verify work), conc 64', v.floor.c64);
  lat('a the same read straight to anvil, conc 1', v.anvil1);
  lat(`a the same read straight to anvil, conc 64, median`, v.anvil64);
  if (v.x402rs) lat('a x402-rs (X402RS_BIN), the same payments, conc 64', v.x402rs);
  lat(`b settle, ${s.serial.n} sequential (block time 1 s)`, s.serial, { rps: false });
  const sl = s.load;
  for (const run of SETTLE_RUNS) {
    const x = results[run.key].load;
    lat(`b settle, ${x.n} at conc ${x.concurrency} (${settleSetup(run)})`, x);
    lat('b   block-to-answer', x.blockToAnswer, { rps: false });
    if (x.blockToWritten?.n) lat('b   the same, at routerd (its answer\'s log line)', x.blockToWritten, { rps: false });
  }
  const fl = results.flood;
  lat(`f settle, ${fl.settle.n} sequential, under a /verify flood`, fl.settle, { rps: false });
  lat('d eth_routerTransaction, concurrency 1', r.serial);
  lat('d eth_routerTransaction, concurrency 64', r.concurrent);
  for (const [name, x] of Object.entries(r.upstream)) lat(`d upstream batch ${name} (3 calls), conc 1`, x, { rps: false });
  lat('d the three batches at once, straight, conc 1', r.upstreamTogether, { rps: false });
  lat('d a send through routerd, conc 1', r.sends.through, { rps: false });
  lat('d   the same send straight to the node, conc 1', r.sends.straight, { rps: false });
  const sv = results.svm;
  lat('g Solana verify, concurrency 1', sv.c1);
  lat('g Solana verify, concurrency 64', sv.c64);
  lat(`g Solana settle, ${sv.settleSerial.n} sequential (slot ${sv.slotMs} ms)`, sv.settleSerial, { rps: false });
  lat(`g Solana settle, ${sv.settleConcurrent.n} distinct at concurrency 64`, sv.settleConcurrent);
  out.push('');
  out.push(pad('memory (MiB)', 44) + lpad('idle RSS', 10) + lpad('idle anon / file', 18) + lpad('peak (VmHWM)', 14) + lpad('RSS after', 11) + lpad('peak anon / file', 21));
  // The peak's parts when it was sampled during the load; else the parts after it.
  const parts = (x) => `${f(x.anonMiB, 1)} / ${f(x.fileMiB, 1)}`;
  const memRow = (name, x, after) => out.push(pad(name, 44) + lpad(f(x.idle.rssMiB, 1), 10) + lpad(parts(x.idle), 18) + lpad(f(x[after].hwmMiB, 1), 14)
    + lpad(f(x[after].rssMiB, 1), 11) + lpad(x.peak ? parts(x.peak) : `${parts(x[after])} (after)`, 21));
  memRow('c routerd facilitator (after verify load)', mem.facilitator, 'afterVerify');
  memRow('c routerd facilitator (after settle load)', mem.settle, 'afterSettle');
  memRow('c routerd router (after routing load)', mem.router, 'afterLoad');
  if (mem.floor) memRow(`c transport floor (${v.floor.held.n} held 1 s, conc ${v.floor.held.concurrency})`, mem.floor, 'afterHeld');
  const so = results.store;
  out.push(`c the store alone, ${so.records} records (${f(so.jsonMiB, 2)} MiB of JSON): anonymous RSS +${f(so.anonPeakMiB - so.anonStartMiB, 1)} at its peak, `
    + `+${f(so.anonAfterMiB - so.anonStartMiB, 1)} once the records are dropped, +${f(so.anonTrimmedMiB - so.anonStartMiB, 1)} once glibc gave back its free pages (bench/store_memory.rs)`);
  out.push('');
  const st = results.startup;
  lat('e start-up to /health, empty store', st.empty, { rps: false });
  lat(`e start-up to /health, ${st.records} finished records`, st.seeded, { rps: false });
  out.push('');
  const vu = v.upstream;
  out.push(`verify: upstream JSON-RPC calls per verify ${f(vu.perVerify, 3)}, HTTP requests per verify `
    + `${f(vu.requestsPerVerify, 3)} (counted at a proxy: ${vu.calls} calls in ${vu.requests} requests for `
    + `${vu.verifies} verifies at concurrency 8, less ${f(vu.background, 1)} calls of head polling over as long idle)`);
  out.push(`verify: routerd CPU per verify ${f(v.cpuMicrosPerVerify, 1)} µs at concurrency 64 `
    + `(user ${f(v.userMicrosPerVerify, 1)} + system ${f(v.systemMicrosPerVerify, 1)}; `
    + `${f(v.cpuSeconds, 2)} CPU s over ${v.c64Runs.length} rounds of ${v.c64.n} verifies, /proc/<pid>/stat); `
    + `${f(v.requestsPerVerifyAt64, 3)} upstream HTTP requests per verify (${f(1 / v.requestsPerVerifyAt64, 1)} verifies each, routerd_upstream_requests_total)`);
  out.push(`verify: concurrency 64 in ${v.c64Runs.length} rounds, in turns: routerd ${v.c64Runs.map((x) => f(x, 0)).join(', ')} verifies/s; `
    + `the same read straight to anvil ${v.anvil64Runs.map((x) => f(x, 0)).join(', ')} req/s (each figure above is its median round)`);
  out.push(`verify: with telemetry on, routerd CPU per verify ${f(v.traced.cpuMicrosPerVerify, 1)} µs at concurrency 64 `
    + `(every trace kept; ${v.traced.exports} OTLP exports, ${f(v.traced.exportedKiB, 0)} KiB, to a local sink)`);
  out.push(v.x402rs
    ? `verify: x402-rs (X402RS_BIN) ${f(v.x402rs.rps, 0)} verifies/s at concurrency 64 on the same payments: routerd ${f(v.c64.rps / v.x402rs.rps, 2)}x; `
      + `x402-rs peak RSS over its verifies ${f(v.x402rs.peak.rssMiB, 1)} MiB${v.x402rs.failed ? ` (${v.x402rs.failed} failed: ${v.x402rs.firstError})` : ''}`
    : 'verify: x402-rs not measured (set X402RS_BIN to its release binary, built outside this repository)');
  if (v.floor) {
    out.push(`verify: transport floor CPU per request ${f(v.floor.cpuMicrosPerRequest, 1)} µs at concurrency 64 `
      + `(user ${f(v.floor.userMicrosPerRequest, 1)} + system ${f(v.floor.systemMicrosPerRequest, 1)}; `
      + 'the same HTTP server and upstream client with no payment work: bench/transport_floor.rs)');
  }
  out.push(`flood: ${fl.flood.answered} failing verifies answered at ${f(fl.flood.rps, 0)}/s over ${f(fl.flood.seconds, 1)} s `
    + `(${fl.flood.busy} told 503 busy, ${fl.flood.failed} unanswered) while the settles above ran; routerd peak RSS ${f(fl.memory.hwmMiB, 1)} MiB`);
  out.push(`svm: upstream requests per verify ${f(sv.upstream.requestsPerVerify, 3)}, JSON-RPC calls per verify ${f(sv.upstream.callsPerVerify, 3)} `
    + `(one at a time through a counting proxy: ${sv.upstream.during.requests} requests, ${sv.upstream.during.calls} calls for ${sv.upstream.verifies} verifies; `
    + `methods ${sv.upstream.methods.join(', ')})`);
  out.push(`svm: node calls per settle ${f(sv.settleCalls.callsPerSettle, 2)} (${sv.settleCalls.settles} settles at concurrency 50 through the counting proxy: `
    + `${sv.settleCalls.calls} calls in ${sv.settleCalls.requests} requests; ${Object.entries(sv.settleCalls.methods).map(([m, c]) => `${m} ${c}`).join(', ')}); `
    + `commitment-to-answer p50 ${f(sv.settleSerial.commitmentToAnswer.p50, 0)} ms sequential, ${f(sv.settleConcurrent.commitmentToAnswer.p50, 0)} ms at concurrency 64 `
    + `(p99 ${f(sv.settleConcurrent.commitmentToAnswer.p99, 0)}); peak RSS ${f(sv.memory.afterSettle.hwmMiB, 1)} MiB`);
  for (const run of SETTLE_RUNS) {
    const lines = settleLines(results[run.key], results.memory[run.key]);
    out.push(...(run.key === 'settle' ? lines : lines.slice(0, 2)));
  }
  out.push(...batchLines(results.batch));
  out.push('');
  const u = r.upstreamRequests;
  out.push('upstream requests (routerd_upstream_requests_total, all chains)');
  out.push(`  routed calls ${u.calls} in ${f(u.loadMs / 1000, 1)} s; raw delta ${u.raw}; idle ${u.idleCount} in ${f(u.idleWindowMs / 1000, 1)} s `
    + `-> background ${f(u.background, 1)} over the load window`);
  out.push(`  per routed call: raw ${f(u.rawPerCall, 3)}, net of background polling ${f(u.netPerCall, 3)}`);
  out.push(`  chosen chain: ${Object.entries(r.chosen).map(([k, c]) => `${k} ${c}`).join(', ')}`);
  out.push('');
  const ratios = results.ratios;
  out.push('ratios (comparable run to run; see bench/README.md)');
  const ratio = (name, x) => out.push(`  ${pad(name, 52)}${lpad(f(x), 8)}`);
  ratio('verify_p50 / same read straight to anvil p50 (conc 1)', ratios.verifyOverAnvil);
  ratio('verify req/s / same read straight to anvil req/s (conc 64)', ratios.verifyRpsOverAnvil);
  ratio('verify req/s at 64 / at 1', ratios.verifyScaling);
  ratio('verify CPU per request, telemetry on / off', ratios.tracedCpuOverUntraced);
  ratio('verify p50 at conc 1, telemetry on / off', ratios.tracedP50OverUntraced);
  if (ratios.verifyCpuOverFloor) ratio('verify CPU per request / transport floor', ratios.verifyCpuOverFloor);
  if (ratios.settlePeakOverFloor) ratio('settle peak RSS / transport floor held peak', ratios.settlePeakOverFloor);
  if (ratios.settlePeakAboveFloor) {
    const above = ratios.settlePeakAboveFloor;
    out.push(`  settle peak RSS above the transport floor's: ${f(above.total, 1)} MiB (goal: 16 or less): `
      + `${f(above.anon, 1)} anonymous (the process's own memory) and ${f(above.file, 1)} file-backed (code) at the sampled peaks; `
      + `${f(above.idleFile, 1)} of the file-backed is there at idle, before any request; `
      + `the store alone holds ${f(results.store.anonTrimmedMiB - results.store.anonStartMiB, 1)} for the burst's records`);
  }
  ratio(`routing_p50 / slowest_chain_p50 (${r.slowestChain})`, ratios.routingOverSlowest);
  ratio('routing_p50 / the three batches at once p50', ratios.routingOverTogether);
  ratio('routing req/s at 64 / at 1', ratios.routingScaling);
  ratio('send through routerd p50 / straight to the node p50', ratios.sendOverStraight);
  ratio('settle sequential p50 / block time (1 s)', ratios.settleOverBlock);
  ratio(`settle/s at concurrency ${sl.concurrency} / chain capacity`, ratios.settleOverCapacity);
  ratio('settle p50 under a /verify flood / block time (1 s)', ratios.floodSettleOverBlock);
  ratio('net upstream requests per routed call / chains', ratios.upstreamPerChain);
  ratio('start-up p50 with finished records / empty store', ratios.startupGrowth);
  ratio(`Solana settle sequential p50 / slot time (${sv.slotMs} ms)`, ratios.svmSettleOverSlot);
  ratio('Solana verify req/s at 64 / at 1', ratios.svmVerifyScaling);
  ratio('batch voucher verify/s at 64, routerd / reference', ratios.batchVerifyOverReference);
  ratio('batch burst paid req/s, routerd / shop\'s ceiling', ratios.batchBurstOverCeiling);
  const unconfirmed = SETTLE_RUNS.map((x) => results[x.key].load).reduce((sum, x) => sum + x.n - x.failed - x.confirmed, 0);
  const failures = [v.c1, v.c64, v.traced.c1, v.traced.c64, v.anvil1, v.anvil64, ...(v.floor ? [v.floor.c64, v.floor.held] : []), s.serial, ...SETTLE_RUNS.map((x) => results[x.key].load), fl.settle, r.sends.through, r.serial, r.concurrent, ...Object.values(r.upstream),
    sv.upstream, sv.c1, sv.c64, sv.settleSerial, sv.settleConcurrent]
    .reduce((sum, x) => sum + (x.failed ?? 0), unconfirmed + batchFailures(results.batch));
  out.push('');
  out.push(`failures: ${failures}`);
  for (const e of [v.c1.firstError, v.c64.firstError, ...SETTLE_RUNS.map((x) => results[x.key].firstError), fl.firstError, r.serial.firstError, r.concurrent.firstError,
    sv.upstream.firstError, sv.c64.firstError, sv.settleSerial.firstError, sv.settleConcurrent.firstError]) {
    if (e) out.push(`  first error: ${e}`);
  }
  return { text: out.join('\n'), failures };
}

// ---------------------------------------------------------------------------------------------
// g: Solana (bench/svm.mjs)

async function benchSvm() {
  results.svm = await svmPhase({ ...BOUNDS.svm, burstBin: settleBurstBin() }, log);
}

// ---------------------------------------------------------------------------------------------
// h: batch-settlement (bench/batch.mjs)

async function benchBatch() {
  results.batch = await batchPhase(BOUNDS.batch, log);
}

async function main() {
  if (!existsSync(routerdBin())) throw new Error(`routerd binary not found at ${routerdBin()} (scripts/bench builds it; or set ROUTERD_BIN)`);
  if (!process.env.ROUTERD_BIN?.includes('release')) log(`warning: ROUTERD_BIN=${routerdBin()} does not look like a release build`);
  results.machine = machine();
  const started = nowMs();
  if (opts.only) {
    // One phase, for working on it: prints its raw figures, not the table (batch: and its lines).
    const settle = () => benchSettle({ key: 'settle', heads: opts.heads, store: opts.store, serial: true });
    const phases = { verify: benchVerify, settle, store: benchStore, flood: benchFlood, router: benchRouter, startup: benchStartup, svm: benchSvm, batch: benchBatch };
    if (!phases[opts.only]) throw new Error(`--only: one of ${Object.keys(phases).join(', ')}, not ${opts.only}`);
    await phases[opts.only]();
    console.log(JSON.stringify({ [opts.only]: results[opts.only], memory: results.memory }, null, 2));
    if (opts.only === 'settle') console.log(settleLines(results.settle, results.memory.settle).join('\n'));
    if (opts.only === 'batch') {
      console.log(batchLines(results.batch).join('\n'));
      if (batchFailures(results.batch) > 0) process.exitCode = 1;
    }
    return;
  }
  await benchVerify();
  for (const run of SETTLE_RUNS) await benchSettle(run);
  benchStore();
  await benchFlood();
  await benchRouter();
  await benchStartup();
  await benchSvm();
  await benchBatch();
  const { verify: v, settle: s, router: r, startup: st } = results;
  results.ratios = {
    verifyOverAnvil: v.c1.p50 / v.anvil1.p50,
    verifyRpsOverAnvil: v.c64.rps / v.anvil64.rps,
    verifyScaling: v.c64.rps / v.c1.rps,
    tracedCpuOverUntraced: v.traced.cpuMicrosPerVerify / v.cpuMicrosPerVerify,
    tracedP50OverUntraced: v.traced.c1.p50 / v.c1.p50,
    verifyCpuOverFloor: v.floor && v.cpuMicrosPerVerify / v.floor.cpuMicrosPerRequest,
    settlePeakOverFloor: results.memory.floor && results.memory.settle.afterSettle.hwmMiB / results.memory.floor.afterHeld.hwmMiB,
    settlePeakAboveFloor: results.memory.floor && peakAbove(results.memory.settle, 'afterSettle', results.memory.floor, 'afterHeld'),
    routingOverSlowest: r.serial.p50 / r.upstream[r.slowestChain].p50,
    routingOverTogether: r.serial.p50 / r.upstreamTogether.p50,
    routingScaling: r.concurrent.rps / r.serial.rps,
    sendOverStraight: r.sends.through.p50 / r.sends.straight.p50,
    settleOverBlock: s.serial.p50 / 1000,
    settleOverCapacity: s.load.rps / s.load.capacityPerSecond,
    floodSettleOverBlock: results.flood.settle.p50 / 1000,
    upstreamPerChain: r.upstreamRequests.netPerCall / ROUTER_CHAINS.length,
    startupGrowth: st.seeded.p50 / st.empty.p50,
    svmSettleOverSlot: results.svm.settleSerialOverSlot,
    svmVerifyScaling: results.svm.c64.rps / results.svm.c1.rps,
    batchVerifyOverReference: results.batch.rpsOverReference,
    batchBurstOverCeiling: results.batch.burst.rpsOverInstant,
  };
  results.totalSeconds = (nowMs() - started) / 1000;
  const { text, failures } = table();
  console.log(text);
  console.log(`(bench took ${f(results.totalSeconds, 0)} s)`);
  if (opts.json) writeFileSync(opts.json, `${JSON.stringify(results, null, 2)}\n`);
  if (failures > 0) process.exitCode = 1;
}

main().catch((err) => {
  console.error(`bench: ${err.stack ?? err.message}`);
  process.exit(1);
});
