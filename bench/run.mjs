#!/usr/bin/env node
// routerd benchmark: facilitator verify/settle and router latency, throughput, memory and upstream
// requests, against local anvil chains and the release binary. Run it through scripts/bench, which
// builds the binary and installs the npm packages. See bench/README.md for how to read the table.
//
//   ROUTERD_BIN=.../release/routerd node bench/run.mjs [--json PATH] [--quick]
//
// All traffic goes to 127.0.0.1. Every phase is bounded by a request count and a duration.
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync, existsSync } from 'node:fs';
import { cpus, availableParallelism } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { encodeFunctionData, getAddress } from 'viem';
import { startFacilitatorStack } from '../tests/e2e/lib/stack.mjs';
import { startAnvil, anvilBin } from '../tests/e2e/lib/anvil.mjs';
import { startRouterd, routerdBin, SHUTDOWN_GRACE_SECS } from '../tests/e2e/lib/routerd.mjs';
import { anvilAccount, freshAccount } from '../tests/e2e/lib/accounts.mjs';
import { usdcAbi } from '../tests/e2e/lib/deploy-usdc.mjs';
import { freePort, makeTempDir, sleep } from '../tests/e2e/lib/util.mjs';
import { nowMs, percentile, summarize, load, postJson, procMemory, metricSum } from './lib.mjs';

const { values: opts } = parseArgs({
  options: { json: { type: 'string' }, quick: { type: 'boolean', default: false } },
});
// --quick: a smoke run of the script itself (small counts); its numbers are not for comparison.
const Q = opts.quick ? 0.1 : 1;
const n = (x) => Math.max(5, Math.round(x * Q));

// The production log level: the harness default (routerd=debug) would measure log formatting.
process.env.RUST_LOG = process.env.BENCH_RUST_LOG ?? 'info';

const BOUNDS = {
  verifyWarmup: n(100),
  verifySerial: { total: n(2000), maxMs: 10_000 },
  verifyConcurrent: { concurrency: 32, total: n(6000), maxMs: 10_000 },
  anvilBatch: { total: n(2000), maxMs: 10_000 },
  settleSerial: n(20),
  settleBurst: n(50),
  routerWarmup: n(50),
  routerSerial: { total: n(1000), maxMs: 10_000 },
  routerConcurrent: { concurrency: 64, total: n(2000), maxMs: 20_000 },
  upstreamBatch: { total: n(1000), maxMs: 5_000 },
  idleWindowCapMs: 30_000,
  startupRecords: n(100_000),
  startupRuns: 3,
};

const results = { machine: {}, verify: {}, settle: {}, memory: {}, router: {}, startup: {}, ratios: {} };
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

/** The batch routerd's verify sends for a valid EOA payment (src/facilitator/verify.rs read_chain). */
function verifyShapedBatch(token, authorization, payTo) {
  const call = (functionName, args) => ({
    to: token, data: encodeFunctionData({ abi: usdcAbi, functionName, args }),
  });
  const from = getAddress(authorization.from);
  const calls = [
    ['eth_getBlockByNumber', ['latest', false]],
    ['eth_getCode', [from, 'latest']],
    ['eth_call', [call('balanceOf', [from]), 'latest']],
    ['eth_call', [call('authorizationState', [from, authorization.nonce]), 'latest']],
    ['eth_call', [call('isBlacklisted', [from]), 'latest']],
    ['eth_call', [call('isBlacklisted', [getAddress(payTo)]), 'latest']],
  ];
  return calls.map(([method, params], i) => ({ jsonrpc: '2.0', id: i + 1, method, params }));
}

const batchOk = (res, size) => res.status === 200 && Array.isArray(res.body) && res.body.length === size
  && res.body.every((a) => a.error === undefined && a.result !== undefined);

async function benchVerify() {
  log('verify: starting an auto-mining anvil with USDC and routerd');
  const stack = await startFacilitatorStack({ fundedPayers: 4 });
  try {
    const pid = stack.routerd.child.pid;
    await sleep(1000);
    results.memory.facilitator = { idle: procMemory(pid) };

    // verify is read-only: a handful of signed bodies, reused round-robin.
    const payTo = freshAccount().address;
    const payments = [];
    for (let i = 0; i < 8; i += 1) payments.push(await stack.pay({ account: stack.payers[i % 4], payTo, amount: 1000n }));
    const bodies = payments.map((p) => JSON.stringify(p.body));
    const url = `${stack.url}/verify`;
    const verifyOnce = async (i) => {
      const res = await postJson(url, bodies[i % bodies.length]);
      return res.status === 200 && res.body?.isValid === true;
    };
    const first = await postJson(url, bodies[0]);
    if (first.body?.isValid !== true) throw new Error(`verify of a valid payment failed: HTTP ${first.status} ${first.text}`);

    log(`verify: warm-up (${BOUNDS.verifyWarmup}), then concurrency 1 and 32`);
    await load({ concurrency: 4, total: BOUNDS.verifyWarmup, maxMs: 10_000, call: verifyOnce });
    const c1 = await load({ concurrency: 1, ...BOUNDS.verifySerial, call: verifyOnce });
    const c32 = await load({ ...BOUNDS.verifyConcurrent, call: verifyOnce });

    log('verify: direct batched round trips to anvil of the same shape');
    const batches = payments.map((p) => JSON.stringify(verifyShapedBatch(stack.usdc, p.authorization, payTo)));
    const size = JSON.parse(batches[0]).length;
    const anvilOnce = async (i) => batchOk(await postJson(stack.anvil.url, batches[i % batches.length]), size);
    await load({ concurrency: 1, total: BOUNDS.verifyWarmup, maxMs: 10_000, call: anvilOnce });
    const direct = await load({ concurrency: 1, ...BOUNDS.anvilBatch, call: anvilOnce });

    results.verify = {
      c1: { ...summarize(c1.latencies), rps: c1.rps, failed: c1.failed, firstError: c1.firstError },
      c32: { ...summarize(c32.latencies), rps: c32.rps, failed: c32.failed, firstError: c32.firstError },
      anvilBatch: { ...summarize(direct.latencies), rps: direct.rps, failed: direct.failed, calls: size },
    };
    results.memory.facilitator.afterVerify = procMemory(pid);
  } finally {
    await stack.stop();
  }
}

async function benchSettle() {
  const total = BOUNDS.settleSerial + BOUNDS.settleBurst;
  log('settle: starting an anvil with --block-time 1, USDC and routerd');
  const payers = 5;
  const stack = await startFacilitatorStack({ anvil: { blockTime: 1 }, fundedPayers: payers, payerFunds: 1_000_000_000n });
  try {
    const pid = stack.routerd.child.pid;
    await sleep(1000);
    results.memory.settle = { idle: procMemory(pid) };
    const payTo = freshAccount().address;
    const payments = [];
    for (let i = 0; i < total; i += 1) payments.push(await stack.pay({ account: stack.payers[i % payers], payTo, amount: 1000n }));
    const bodies = payments.map((p) => JSON.stringify(p.body));
    const url = `${stack.url}/settle`;
    const settled = (res) => res.status === 200 && res.body?.success === true && /^0x[0-9a-f]{64}$/i.test(res.body.transaction ?? '');

    log(`settle: ${BOUNDS.settleSerial} sequential`);
    const serial = [];
    let serialFailed = 0;
    let firstError;
    for (let i = 0; i < BOUNDS.settleSerial; i += 1) {
      const t0 = nowMs();
      const res = await postJson(url, bodies[i]);
      serial.push(nowMs() - t0);
      if (!settled(res)) {
        serialFailed += 1;
        firstError ??= `HTTP ${res.status} ${res.text.slice(0, 300)}`;
      }
    }

    log(`settle: ${BOUNDS.settleBurst} concurrent distinct payments`);
    const burstStart = nowMs();
    const burst = await Promise.all(bodies.slice(BOUNDS.settleSerial).map(async (raw) => {
      const t0 = nowMs();
      try {
        const res = await postJson(url, raw);
        return { ms: nowMs() - t0, ok: settled(res), text: `HTTP ${res.status} ${res.text.slice(0, 300)}` };
      } catch (err) {
        return { ms: nowMs() - t0, ok: false, text: err.message };
      }
    }));
    const burstWall = nowMs() - burstStart;
    const burstFailed = burst.filter((r) => !r.ok);
    firstError ??= burstFailed[0]?.text;

    results.settle = {
      serial: { ...summarize(serial), failed: serialFailed },
      burst: { ...summarize(burst.map((r) => r.ms)), failed: burstFailed.length, wallMs: burstWall },
      firstError,
    };
    results.memory.settle.afterSettle = procMemory(pid);
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
  parts.push(`[router]\nchains = [${chains.map((c) => q(c.name)).join(', ')}]\nprefer = ["l2", "l1", "l3"]\n`);
  return parts.join('\n');
}

const routerBody = (i) => JSON.stringify({
  jsonrpc: '2.0', id: i, method: 'eth_routerTransaction',
  params: [{ from: SENDERS[i % SENDERS.length], to: RECIPIENT, data: '0x', value: '1000' }],
});

/** The per-chain batch routerd's probe sends for a plain ETH transfer (src/router/probe.rs ask). */
const upstreamShapedBatch = (i) => {
  const from = SENDERS[i % SENDERS.length];
  return JSON.stringify([
    { jsonrpc: '2.0', id: 1, method: 'eth_estimateGas', params: [{ from, to: RECIPIENT, data: '0x', value: '0x3e8' }] },
    { jsonrpc: '2.0', id: 2, method: 'eth_getTransactionCount', params: [from, 'pending'] },
    { jsonrpc: '2.0', id: 3, method: 'eth_getBalance', params: [from, 'latest'] },
  ]);
};

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

    log(`router: warm-up (${BOUNDS.routerWarmup}), then sequential and 64 concurrent callers`);
    await load({ concurrency: 4, total: BOUNDS.routerWarmup, maxMs: 10_000, call: routeOnce });
    for (const k of Object.keys(chosen)) delete chosen[k];
    const metric = 'routerd_upstream_requests_total';
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
  lat('a verify, concurrency 1', v.c1);
  lat('a verify, concurrency 32', v.c32);
  lat(`a anvil batch (${v.anvilBatch.calls} calls, verify shape), conc 1`, v.anvilBatch);
  lat(`b settle, ${s.serial.n} sequential (block time 1 s)`, s.serial, { rps: false });
  out.push(row([
    `b settle, ${s.burst.n} concurrent distinct`, f(s.burst.p50), f(s.burst.p99), f(s.burst.max),
    f((s.burst.n / s.burst.wallMs) * 1000, 1), s.burst.n, s.burst.failed,
  ]));
  lat('d eth_routerTransaction, concurrency 1', r.serial);
  lat('d eth_routerTransaction, concurrency 64', r.concurrent);
  for (const [name, x] of Object.entries(r.upstream)) lat(`d upstream batch ${name} (3 calls), conc 1`, x, { rps: false });
  out.push('');
  out.push(pad('memory (MiB)', 44) + lpad('idle RSS', 10) + lpad('peak (VmHWM)', 14) + lpad('RSS after', 11));
  const memRow = (name, x, after) => out.push(pad(name, 44) + lpad(f(x.idle.rssMiB, 1), 10) + lpad(f(x[after].hwmMiB, 1), 14) + lpad(f(x[after].rssMiB, 1), 11));
  memRow('c routerd facilitator (after verify load)', mem.facilitator, 'afterVerify');
  memRow('c routerd facilitator (after settle load)', mem.settle, 'afterSettle');
  memRow('c routerd router (after routing load)', mem.router, 'afterLoad');
  out.push('');
  const st = results.startup;
  lat('e start-up to /health, empty store', st.empty, { rps: false });
  lat(`e start-up to /health, ${st.records} finished records`, st.seeded, { rps: false });
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
  ratio('verify_p50 / anvil_batch_p50', ratios.verifyOverAnvil);
  ratio('verify req/s at 32 / at 1', ratios.verifyScaling);
  ratio(`routing_p50 / slowest_chain_p50 (${r.slowestChain})`, ratios.routingOverSlowest);
  ratio('routing req/s at 64 / at 1', ratios.routingScaling);
  ratio('settle sequential p50 / block time (1 s)', ratios.settleOverBlock);
  ratio('settle concurrent max / block time (1 s)', ratios.burstMaxOverBlock);
  ratio('net upstream requests per routed call / chains', ratios.upstreamPerChain);
  ratio('start-up p50 with finished records / empty store', ratios.startupGrowth);
  const failures = [v.c1, v.c32, v.anvilBatch, s.serial, s.burst, r.serial, r.concurrent, ...Object.values(r.upstream)]
    .reduce((sum, x) => sum + (x.failed ?? 0), 0);
  out.push('');
  out.push(`failures: ${failures}`);
  for (const e of [v.c1.firstError, v.c32.firstError, s.firstError, r.serial.firstError, r.concurrent.firstError]) {
    if (e) out.push(`  first error: ${e}`);
  }
  return { text: out.join('\n'), failures };
}

async function main() {
  if (!existsSync(routerdBin())) throw new Error(`routerd binary not found at ${routerdBin()} (scripts/bench builds it; or set ROUTERD_BIN)`);
  if (!process.env.ROUTERD_BIN?.includes('release')) log(`warning: ROUTERD_BIN=${routerdBin()} does not look like a release build`);
  results.machine = machine();
  const started = nowMs();
  await benchVerify();
  await benchSettle();
  await benchRouter();
  await benchStartup();
  const { verify: v, settle: s, router: r, startup: st } = results;
  results.ratios = {
    verifyOverAnvil: v.c1.p50 / v.anvilBatch.p50,
    verifyScaling: v.c32.rps / v.c1.rps,
    routingOverSlowest: r.serial.p50 / r.upstream[r.slowestChain].p50,
    routingScaling: r.concurrent.rps / r.serial.rps,
    settleOverBlock: s.serial.p50 / 1000,
    burstMaxOverBlock: s.burst.max / 1000,
    upstreamPerChain: r.upstreamRequests.netPerCall / ROUTER_CHAINS.length,
    startupGrowth: st.seeded.p50 / st.empty.p50,
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
