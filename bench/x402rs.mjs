// x402-rs beside routerd: when X402RS_BIN names an x402-rs facilitator binary (its release build,
// made outside this repository), the verify and settle phases run the same payments through it
// on the same chain, so that the figures the issue compares against (verify/s, peak RSS) come
// from one run. Without X402RS_BIN those figures are reported as not measured.
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { rpc } from '../tests/e2e/lib/anvil.mjs';
import { freePort, trackChild, waitFor } from '../tests/e2e/lib/util.mjs';
import { compiledLoad, load, postJson, summarize, watchPeak } from './lib.mjs';

/** The binary, when given. */
export const x402rsBin = () => process.env.X402RS_BIN || null;

// x402-rs refuses to start unless these hold code: the EIP-6492 validator, Permit2 and x402's
// exact Permit2 proxy. Its verify of an EOA's ERC-3009 payment (all the bench sends) calls none
// of them, so a STOP byte stands in for each: the figures are of the work x402-rs does for these
// payments.
const REQUIRED_CODE = [
  '0xdAcD51A54883eb67D95FAEb2BBfdC4a9a6BD2a3B',
  '0x000000000022D473030F116dDEE9F6B43aC78BA3',
  '0x402085c248EeA27D92E8b30b2C58ed07f9E20001',
];

/** Places the stand-in code on the chain at `rpcUrl`. */
async function placeRequiredCode(rpcUrl) {
  for (const address of REQUIRED_CODE) {
    const code = await rpc(rpcUrl, 'eth_getCode', [address, 'latest']);
    if (code === '0x') await rpc(rpcUrl, 'anvil_setCode', [address, '0x00']);
  }
}

/**
 * Starts x402-rs serving x402 v1 and v2 `exact` on one EVM chain (`chainId`, its node at
 * `rpcUrl`), settling from `signerKey` (0x hex). Answers { url, pid, stop }.
 */
export async function startX402rs({ bin, chainId, rpcUrl, signerKey, dir }) {
  await placeRequiredCode(rpcUrl);
  const port = await freePort();
  const chain = `eip155:${chainId}`;
  const config = {
    port,
    host: '127.0.0.1',
    chains: { [chain]: { eip1559: true, signers: [signerKey], rpc: [{ http: rpcUrl }] } },
    schemes: [
      { id: 'v1-eip155-exact', chains: chain },
      { id: 'v2-eip155-exact', chains: chain },
    ],
  };
  const path = join(dir, 'x402rs.json');
  writeFileSync(path, JSON.stringify(config));
  const child = trackChild(spawn(bin, ['--config', path], {
    env: { PATH: process.env.PATH, RUST_LOG: 'warn', HOST: '127.0.0.1', PORT: String(port) },
    stdio: ['ignore', 'ignore', 'pipe'],
  }));
  let stderr = '';
  child.stderr.on('data', (d) => { stderr = (stderr + d).slice(-4000); });
  const url = `http://127.0.0.1:${port}`;
  await waitFor(async () => {
    if (child.exitCode !== null) throw new Error(`x402-rs exited ${child.exitCode}: ${stderr}`);
    const res = await fetch(`${url}/supported`).catch(() => null);
    return res?.ok === true;
  }, { timeoutMs: 20_000, what: 'x402-rs /supported' });
  return {
    url,
    pid: child.pid,
    stop: async () => {
      if (child.exitCode !== null) return;
      child.kill('SIGTERM');
      await new Promise((resolve) => child.once('exit', resolve));
    },
  };
}

/**
 * x402-rs's verify/s at `concurrency` on `pool` (bodies of valid payments, each sent once), on
 * `stack`'s chain, sent by the compiled client as routerd's are (`burstBin`), with its peak RSS
 * over the run; null without X402RS_BIN. `signerKey` is a key routerd does not send from.
 */
export async function x402rsVerify({ stack, pool, warm, concurrency, maxMs, signerKey, burstBin }) {
  const bin = x402rsBin();
  if (!bin) return null;
  const x = await startX402rs({ bin, chainId: stack.chainId, rpcUrl: stack.anvil.url, signerKey, dir: stack.tmp.dir });
  try {
    const verify = (payments) => async (i) => {
      const res = await postJson(`${x.url}/verify`, JSON.stringify(payments[i % payments.length].body));
      return res.status === 200 && res.body?.isValid === true;
    };
    await load({ concurrency: 4, total: warm.length, maxMs: 10_000, call: verify(warm) });
    const peak = watchPeak(x.pid);
    const run = await compiledLoad({
      bin: burstBin, url: `${x.url}/verify`, bodies: pool.map((p) => JSON.stringify(p.body)), concurrency, maxMs,
      good: (a) => a.status === 200 && a.body?.isValid === true,
    });
    return { ...summarize(run.latencies), rps: run.rps, failed: run.failed, firstError: run.firstError, peak: peak.stop() };
  } finally {
    await x.stop();
  }
}

/**
 * x402-rs settling `bodies` (distinct payments) at `concurrency`, sent by `burst` as routerd's
 * burst is: how many it answered settled, and its peak RSS over the burst; null without
 * X402RS_BIN. `signerKey` is a key routerd does not send from.
 */
export async function x402rsSettle({ stack, bodies, concurrency, maxMs, signerKey, burst, burstBin }) {
  const bin = x402rsBin();
  if (!bin) return null;
  const x = await startX402rs({ bin, chainId: stack.chainId, rpcUrl: stack.anvil.url, signerKey, dir: stack.tmp.dir });
  try {
    const peak = watchPeak(x.pid);
    const sent = await burst({ bin: burstBin, url: `${x.url}/settle`, bodies, concurrency, maxMs });
    const settled = sent.filter((res) => res.status === 200 && res.body?.success === true).length;
    return { sent: bodies.length, settled, peak: peak.stop() };
  } finally {
    await x.stop();
  }
}
