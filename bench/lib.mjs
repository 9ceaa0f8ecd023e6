// Small helpers for bench/run.mjs: timing, percentiles, bounded load loops, /proc and /metrics readers.
import { readFileSync } from 'node:fs';
import { execFileSync, spawn } from 'node:child_process';
import { readAnswer } from '../tests/e2e/lib/util.mjs';

/** Milliseconds since an arbitrary origin, sub-microsecond resolution. */
export const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

/**
 * Nearest-rank percentile of an array of numbers (p in 0..100). NaN for an empty array.
 * p50 of [1,2,3,4] is 2, p99 of 100 samples is the 99th smallest, p100 the maximum.
 */
export function percentile(values, p) {
  if (values.length === 0) return NaN;
  const sorted = values.slice().sort((a, b) => a - b);
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[Math.min(rank, sorted.length) - 1];
}

export function summarize(latencies) {
  return {
    n: latencies.length,
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
    max: latencies.length ? Math.max(...latencies) : NaN,
  };
}

/**
 * Run `call(i)` `total` times (or until `maxMs` has passed) from `concurrency` workers, each issuing
 * its next request as soon as the previous one answers (closed loop). `call` resolves to true on a
 * good answer, false on a bad one; a throw counts as a failure too.
 * @returns {Promise<{latencies: number[], ok: number, failed: number, elapsedMs: number, rps: number, firstError?: string}>}
 */
export async function load({ concurrency, total, maxMs, call }) {
  const latencies = [];
  let next = 0;
  let ok = 0;
  let failed = 0;
  let firstError;
  const start = nowMs();
  const deadline = start + maxMs;
  const worker = async () => {
    while (next < total && nowMs() < deadline) {
      const i = next;
      next += 1;
      const t0 = nowMs();
      let good = false;
      try {
        good = await call(i);
        if (!good && firstError === undefined) firstError = `call ${i}: bad answer`;
      } catch (err) {
        if (firstError === undefined) firstError = `call ${i}: ${err.message}`;
      }
      latencies.push(nowMs() - t0);
      if (good) ok += 1;
      else failed += 1;
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  const elapsedMs = nowMs() - start;
  return { latencies, ok, failed, elapsedMs, rps: (latencies.length / elapsedMs) * 1000, firstError };
}

/**
 * POST a JSON string and parse the answer. Node's global fetch is undici with a keep-alive pool,
 * so connections are reused across calls to the same origin.
 */
export async function postJson(url, raw) {
  return readAnswer(await fetch(url, { method: 'POST', body: raw, headers: { 'content-type': 'application/json' } }));
}

/** What a failed answer was, for a run's first error: the client's error, else status and body. */
export function answerError(res) {
  return res.error ?? `HTTP ${res.status} ${res.text.slice(0, 300)}`;
}

/**
 * The settle burst, sent by the `settle-burst` example (bench/settle_burst.rs): `bodies` (JSON
 * strings) POSTed to `url` once each by `concurrency` closed-loop connections, for at most
 * `maxMs`. A full block's answers leave routerd within a few milliseconds of each other; Node's one
 * thread would stamp the last of them tens of milliseconds late, the compiled client does not.
 * Answers one result per request sent: `{status, body, text, at, ms}` (`at`: the epoch
 * milliseconds at which the answer's last byte was read; `ms`: its latency), or `{error}`.
 * @returns {Promise<object[]>}
 */
export async function burst({ bin, url, bodies, concurrency, maxMs }) {
  const child = spawn(bin, [url, String(concurrency), String(maxMs)], { stdio: ['pipe', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (chunk) => {
    out += chunk;
  });
  child.stdin.end(`${bodies.join('\n')}\n`);
  const code = await new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', resolve);
  });
  if (code !== 0) throw new Error(`settle-burst exited with ${code}`);
  return out.split('\n').filter(Boolean).map((line) => {
    const r = JSON.parse(line);
    if (r.error !== undefined) return { error: r.error };
    let body;
    try {
      body = JSON.parse(r.body);
    } catch {
      body = undefined;
    }
    return { status: r.status, body, text: r.body, at: r.at, ms: r.ms };
  });
}

/**
 * VmRSS and VmHWM (peak RSS) of a process, in MiB, from /proc/<pid>/status, and VmRSS's anonymous
 * and file-backed parts (RssAnon, RssFile: the latter mostly the binary's code).
 */
export function procMemory(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (field) => {
    const m = status.match(new RegExp(`^${field}:\\s+(\\d+)\\s+kB`, 'm'));
    return m ? Number(m[1]) / 1024 : NaN;
  };
  return { rssMiB: kib('VmRSS'), hwmMiB: kib('VmHWM'), anonMiB: kib('RssAnon'), fileMiB: kib('RssFile') };
}

/**
 * Samples a process's memory every `everyMs` while a load runs; `stop()` answers the sample of
 * the highest RSS, so that the peak's anonymous and file-backed parts are known (VmHWM is only a
 * total).
 */
export function watchPeak(pid, everyMs = 10) {
  let peak = procMemory(pid);
  const timer = setInterval(() => {
    try {
      const now = procMemory(pid);
      if (now.rssMiB > peak.rssMiB) peak = now;
    } catch {
      // the process is gone: the last sample stands
    }
  }, everyMs);
  return {
    stop() {
      clearInterval(timer);
      return peak;
    },
  };
}

/** User and system CPU seconds a process has used so far (/proc/<pid>/stat, in clock ticks). */
export function cpuSeconds(pid) {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return { user: Number(fields[11]) / CLK_TCK, system: Number(fields[12]) / CLK_TCK };
}
const CLK_TCK = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;

/** Sum of all samples of one Prometheus counter (any labels) in GET /metrics text. */
export async function metricSum(baseUrl, name) {
  const res = await fetch(`${baseUrl}/metrics`);
  const text = await res.text();
  if (res.status !== 200) throw new Error(`GET /metrics: HTTP ${res.status}`);
  let sum = 0;
  let seen = false;
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([0-9.eE+-]+)/);
    if (m && m[1] === name) {
      sum += Number(m[3]);
      seen = true;
    }
  }
  if (!seen) throw new Error(`GET /metrics has no ${name}`);
  return sum;
}

/**
 * `load()` at a concurrency where Node's one thread would be the limit: `bodies` (JSON strings)
 * POSTed once each by the compiled client (`burst`), `concurrency` closed-loop connections as wrk
 * sends them. At concurrency 64 Node read and sent about 1,500 requests a second, whatever was
 * behind the port (the transport floor's figure was Node's); this client does ten times that on
 * one thread. `good(answer)` tells a good answer. Answers `load()`'s shape, the elapsed time from
 * the first request sent to the last answer read.
 */
export async function compiledLoad({ bin, url, bodies, concurrency, maxMs, good }) {
  const answers = await burst({ bin, url, bodies, concurrency, maxMs });
  const latencies = [];
  let ok = 0;
  let firstError;
  let first = Infinity;
  let last = -Infinity;
  for (const [i, a] of answers.entries()) {
    if (a.error !== undefined) {
      firstError ??= `request ${i}: ${a.error}`;
      continue;
    }
    latencies.push(a.ms);
    first = Math.min(first, a.at - a.ms);
    last = Math.max(last, a.at);
    if (good(a)) ok += 1;
    else firstError ??= `request ${i}: HTTP ${a.status} ${String(a.text).slice(0, 300)}`;
  }
  const elapsedMs = last - first;
  return { latencies, ok, failed: answers.length - ok, elapsedMs, rps: (latencies.length / elapsedMs) * 1000, firstError };
}
