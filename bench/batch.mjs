// The batch phase of bench/run.mjs: x402's `batch-settlement` scheme (spec/batch-settlement.md),
// routerd beside the official @x402/evm 2.27.0 facilitator (bench/batch-reference.mjs) on the same
// anvil, with the scheme's contracts at their canonical addresses (tests/e2e/lib/batch-settlement.mjs).
//
// Setup, on an auto-mining anvil: one merchant per channel (its receiver, and an API key scoped
// to it), one payer per channel, each depositing once through routerd with the official client
// (routerd is the receiver authorizer). The chain then mines a block every second, as the issue's
// reference figures were taken.
// - voucher verifies: distinct voucher payloads (each channel's payer signs ceilings that differ;
//   a verify changes nothing, so each stays valid), sent round-robin over the channels: first
//   through a counting proxy in front of anvil (JSON-RPC calls and HTTP requests per verify, less
//   what the proxy sees over as long idle), then straight, from 64 closed-loop callers for a fixed
//   time; the same for the reference, in its own process;
// - claims: one one-row claim per merchant (each with its own key), all sent at once; the rows
//   claimed on chain, the transactions that carried them, rows and gas per transaction. Twice, on
//   two sets of as many channels: with routerd's default `batch_max_calls_per_tx` (100), then
//   with room for every row in one transaction; then the second set's merchants claim again (a
//   channel's later claims, the steady state, cost less gas than its first).
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { getAddress } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { toClientEvmSigner } from '@x402/evm';
import { BatchSettlementEvmScheme as BatchClient } from '@x402/evm/batch-settlement/client';
import { startFilteringProxy } from '../tests/e2e/lib/bad-upstreams.mjs';
import { startFacilitatorStack, CHAIN_ID } from '../tests/e2e/lib/stack.mjs';
import { anvilKey, freshAccount } from '../tests/e2e/lib/accounts.mjs';
import { USDC_EIP712 } from '../tests/e2e/lib/deploy-usdc.mjs';
import { BATCH_SETTLEMENT, batchSettlementAbi, placeBatchSettlement, signVoucher } from '../tests/e2e/lib/batch-settlement.mjs';
import { readAnswer, sleep, trackChild } from '../tests/e2e/lib/util.mjs';
import { nowMs, summarize, load, cpuSeconds, procMemory } from './lib.mjs';
import { payerBurst } from './batch-burst.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const NETWORK = `eip155:${CHAIN_ID}`;
/** The price of a request; the official client deposits 5 prices, so a channel holds 5,000. */
const PRICE = 1000n;
/** Ceilings of the verify pool: each channel's k-th voucher is PRICE + k (at most its balance). */
const MAX_VOUCHERS_PER_CHANNEL = 4 * Number(PRICE);
/** The anvil account the reference's viem signer holds (it sends nothing while verifying). */
const REFERENCE_SIGNER = 5;
const sha = (text) => createHash('sha256').update(text).digest('hex');

/** The requirements a merchant's server announces (as the official server scheme does). */
function requirements(stack, receiver, authorizer) {
  return {
    scheme: 'batch-settlement', network: NETWORK, amount: String(PRICE), asset: getAddress(stack.usdc), payTo: receiver,
    maxTimeoutSeconds: 3600, extra: { receiverAuthorizer: authorizer, withdrawDelay: 900, ...USDC_EIP712 },
  };
}

/** The requirements the official channel manager sends with its claim payloads. */
const managerRequirements = (stack, receiver) => ({
  scheme: 'batch-settlement', network: NETWORK, asset: getAddress(stack.usdc), amount: '0', payTo: receiver, maxTimeoutSeconds: 0, extra: {},
});

const wire = (payload, reqs) => ({ x402Version: 2, paymentPayload: { x402Version: 2, accepted: reqs, payload }, paymentRequirements: reqs });

async function post(url, raw, token) {
  const headers = { 'content-type': 'application/json', authorization: `Bearer ${token}` };
  return readAnswer(await fetch(url, { method: 'POST', body: raw, headers }));
}

/**
 * routerd's [facilitator] lines and its API keys: the scheme on, routerd's receiver authorizer
 * key, and `maxCalls` (undefined: routerd's default) calls per packed transaction.
 */
function facilitatorToml(files, maxCalls) {
  return `batch_settlement = true\nreceiver_authorizer_key_file = ${JSON.stringify(files.authorizer)}\n`
    + (maxCalls === undefined ? '' : `batch_max_calls_per_tx = ${maxCalls}\n`)
    + `[auth]\napi_keys_file = ${JSON.stringify(files.keys)}\n`;
}

/**
 * The stack (anvil with USDC and the contracts, routerd through `rpcUrlFor`), its merchants (one
 * per channel, then the burst's shop, the last) and `burstPayers` more funded payers.
 */
async function startStack({ channels, burstPayers, authorizerKey, rpcUrlFor }) {
  const merchants = Array.from({ length: channels + 1 }, (_, i) => ({
    name: `m${i}`, receiver: freshAccount().address, token: `key-m${i}-${'x'.repeat(24)}`,
  }));
  let files;
  const stack = await startFacilitatorStack({
    fundedPayers: channels + burstPayers,
    routerd: { x402Versions: [1, 2], allowHttpResource: true },
    rpcUrlFor,
    beforeRouterd: async (s) => {
      await placeBatchSettlement(s.client);
      files = { authorizer: join(s.tmp.dir, 'authorizer.key'), keys: join(s.tmp.dir, 'api-keys.toml') };
      writeFileSync(files.authorizer, `${authorizerKey}\n`);
      writeFileSync(files.keys, merchants.map((m) => `[keys.${m.name}]\nsha256 = "${sha(m.token)}"\npay_to = ["${m.receiver}"]\n`).join('\n'));
      return facilitatorToml(files, undefined);
    },
  });
  return { stack, merchants, files };
}

/**
 * Each payer's first payment with the official client: a deposit routerd settles (`concurrency`
 * at a time). Answers the channels: {merchant, account, config, channelId, reqs}.
 */
async function openChannels(stack, merchants, authorizer, concurrency) {
  const channels = [];
  const failures = [];
  let next = 0;
  const worker = async () => {
    while (next < merchants.length) {
      const i = next;
      next += 1;
      const merchant = merchants[i];
      const account = stack.payers[i];
      const reqs = requirements(stack, merchant.receiver, authorizer);
      const client = new BatchClient(toClientEvmSigner(account, stack.client));
      const { payload } = await client.createPaymentPayload(2, reqs);
      const settled = await post(`${stack.url}/settle`, JSON.stringify(wire(payload, reqs)), merchant.token);
      if (settled.body?.success !== true) failures.push(`deposit ${i}: ${settled.text.slice(0, 300)}`);
      channels[i] = { merchant, account, config: payload.channelConfig, channelId: payload.voucher.channelId, reqs };
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  if (failures.length) throw new Error(`batch: ${failures.length} deposits failed; first: ${failures[0]}`);
  return channels;
}

/**
 * `count` distinct voucher bodies, round-robin over the channels (concurrent verifies fall on
 * different channels), each signed by its payer with the official client's signVoucher. `from`
 * is the first pool index, so that pools signed one after another never share a voucher.
 */
async function voucherPool(channels, count, from) {
  const pool = [];
  for (let start = 0; start < count; start += 256) {
    const batch = Math.min(256, count - start);
    pool.push(...await Promise.all(Array.from({ length: batch }, async (_, j) => {
      const k = from + start + j;
      const c = channels[k % channels.length];
      const nth = Math.floor(k / channels.length);
      if (nth >= MAX_VOUCHERS_PER_CHANNEL) throw new Error('batch: more vouchers than a channel balance allows');
      const voucher = await signVoucher(c.account, c.channelId, String(PRICE + BigInt(nth)), NETWORK);
      const payload = { type: 'voucher', channelConfig: c.config, voucher };
      return { raw: JSON.stringify(wire(payload, c.reqs)), token: c.merchant.token };
    })));
  }
  return pool;
}

const verifier = (url, pool) => async (i) => {
  const res = await post(url, pool[i].raw, pool[i].token);
  return res.status === 200 && res.body?.isValid === true;
};

/**
 * JSON-RPC calls and HTTP requests per verify, counted at `proxy` while `pool` is verified at
 * concurrency 8, less what it counts idle (routerd's head polling and its reads of each new
 * block), scaled to the run's length.
 */
async function countUpstream(proxy, url, pool) {
  const byMethod = (from) => {
    const counts = {};
    for (const call of proxy.state.requests.slice(from).flat()) counts[call] = (counts[call] ?? 0) + 1;
    return counts;
  };
  const sum = (counts) => Object.values(counts).reduce((a, b) => a + b, 0);
  let mark = proxy.state.requests.length;
  let t0 = nowMs();
  const run = await load({ concurrency: 8, total: pool.length, maxMs: 30_000, call: verifier(url, pool) });
  const runMs = nowMs() - t0;
  const during = { methods: byMethod(mark), requests: proxy.state.requests.length - mark };
  mark = proxy.state.requests.length;
  t0 = nowMs();
  // At least 3 s: the chain mines a block a second, and routerd reads each new head.
  await sleep(Math.max(runMs, 3000));
  const scale = runMs / (nowMs() - t0);
  const idle = { methods: byMethod(mark), requests: (proxy.state.requests.length - mark) * scale };
  const n = run.latencies.length;
  const perVerify = Object.fromEntries(Object.entries(during.methods)
    .map(([method, count]) => [method, (count - (idle.methods[method] ?? 0) * scale) / n]));
  return {
    verifies: n, failed: run.failed, firstError: run.firstError, calls: sum(during.methods), requests: during.requests,
    idleCalls: sum(idle.methods) * scale, idleRequests: idle.requests, perVerify,
    callsPerVerify: (sum(during.methods) - sum(idle.methods) * scale) / n, requestsPerVerify: (during.requests - idle.requests) / n,
  };
}

/** The timed run: warm-up, then `bounds` from 64 callers; req/s, latencies and CPU per verify. */
async function timedVerify(url, pid, warm, pool, bounds) {
  await load({ concurrency: 4, total: warm.length, maxMs: 10_000, call: verifier(url, warm) });
  const cpu0 = cpuSeconds(pid);
  const run = await load({ ...bounds, total: pool.length, call: verifier(url, pool) });
  const cpu1 = cpuSeconds(pid);
  const cpu = cpu1.user - cpu0.user + cpu1.system - cpu0.system;
  return {
    ...summarize(run.latencies), rps: run.rps, failed: run.failed, firstError: run.firstError, concurrency: bounds.concurrency,
    seconds: run.elapsedMs / 1000, cpuMicrosPerVerify: (cpu * 1e6) / run.latencies.length, rssMiB: procMemory(pid).rssMiB,
  };
}

/** The reference facilitator in a process of its own, reading the chain at `rpcUrl`. */
async function startReference(rpcUrl, authorizerKey) {
  const env = { ...process.env, BENCH_SIGNER_KEY: anvilKey(REFERENCE_SIGNER), BENCH_AUTHORIZER_KEY: authorizerKey };
  const child = trackChild(spawn(process.execPath, [join(here, 'batch-reference.mjs'), rpcUrl, NETWORK], { env, stdio: ['ignore', 'pipe', 'inherit'] }));
  const port = await new Promise((resolve, reject) => {
    child.stdout.once('data', (line) => resolve(Number(String(line).trim())));
    child.once('exit', (code) => reject(new Error(`batch-reference exited with ${code}`)));
  });
  return {
    child,
    url: `http://127.0.0.1:${port}/verify`,
    stop: () => new Promise((done) => {
      if (child.exitCode !== null || child.signalCode !== null) return done();
      child.once('exit', done);
      return child.kill('SIGTERM');
    }),
  };
}

/**
 * One one-row claim per channel, all sent at once, each by its merchant: the latest voucher at
 * `amount` (above what is claimed). Reads back every channel's totalClaimed and each carrying
 * transaction's receipt.
 */
async function claimBurst(stack, channels, amount) {
  const bodies = await Promise.all(channels.map(async (c) => {
    const voucher = await signVoucher(c.account, c.channelId, String(amount), NETWORK);
    const row = { voucher: { channel: c.config, maxClaimableAmount: voucher.maxClaimableAmount }, signature: voucher.signature, totalClaimed: String(amount) };
    return JSON.stringify(wire({ type: 'claim', claims: [row] }, managerRequirements(stack, c.merchant.receiver)));
  }));
  const t0 = nowMs();
  const answers = await Promise.all(bodies.map(async (raw, i) => {
    const sent = nowMs();
    const res = await post(`${stack.url}/settle`, raw, channels[i].merchant.token);
    return { ...res, ms: nowMs() - sent };
  }));
  const wallMs = nowMs() - t0;
  const rowsByTx = new Map();
  for (const a of answers.filter((x) => x.body?.success === true)) {
    rowsByTx.set(a.body.transaction, (rowsByTx.get(a.body.transaction) ?? 0) + 1);
  }
  const transactions = [];
  for (const [hash, rows] of rowsByTx) {
    const receipt = await stack.client.getTransactionReceipt({ hash });
    transactions.push({ hash, rows, gasUsed: Number(receipt.gasUsed), block: Number(receipt.blockNumber), status: receipt.status });
  }
  transactions.sort((a, b) => b.rows - a.rows);
  const abi = batchSettlementAbi();
  const claimed = await Promise.all(channels.map(async (c) => {
    const [, totalClaimed] = await stack.client.readContract({ address: BATCH_SETTLEMENT, abi, functionName: 'channels', args: [c.channelId] });
    return totalClaimed === amount;
  }));
  const failedAnswer = answers.find((a) => a.body?.success !== true);
  const rows = transactions.reduce((sum, t) => sum + t.rows, 0);
  return {
    claims: channels.length, answeredSuccess: answers.length - answers.filter((a) => a.body?.success !== true).length,
    claimedOnChain: claimed.filter(Boolean).length, transactions, wallMs, answer: summarize(answers.map((a) => a.ms)),
    gasPerChannel: rows ? transactions.reduce((sum, t) => sum + t.gasUsed, 0) / rows : NaN,
    firstError: failedAnswer && `HTTP ${failedAnswer.status} ${failedAnswer.text.slice(0, 300)}`,
  };
}

/** The verify pools, signed before any timed run: counted, warm-up and timed, for each side. */
async function signPools(channels, bounds) {
  const sizes = [bounds.counted, bounds.warmup, bounds.routerd.total, bounds.counted, bounds.warmup, bounds.reference.total];
  const pools = [];
  let from = 0;
  for (const size of sizes) {
    pools.push(await voucherPool(channels, size, from));
    from += size;
  }
  const [countedR, warmR, poolR, countedF, warmF, poolF] = pools;
  return { routerd: { counted: countedR, warm: warmR, pool: poolR }, reference: { counted: countedF, warm: warmF, pool: poolF }, signed: from };
}

/**
 * routerd's voucher verifies, then the reference's, each counted through `proxy` and then timed
 * straight on anvil. `straight()` turns routerd's next start away from the proxy.
 */
async function compareVerifies({ stack, proxy, straight, pools, bounds, authorizerKey, log }) {
  const { routerd: r, reference: ref } = bounds;
  log(`batch: routerd, ${bounds.counted} voucher verifies through the counting proxy`);
  const routerdUpstream = await countUpstream(proxy, `${stack.url}/verify`, pools.routerd.counted);
  log(`batch: routerd restarted straight on anvil; ${r.concurrency} callers for at most ${r.maxMs / 1000} s`);
  straight();
  await stack.routerd.restart();
  const routerdRun = await timedVerify(`${stack.url}/verify`, stack.routerd.child.pid, pools.routerd.warm, pools.routerd.pool, r);

  log(`batch: the reference (@x402/evm's facilitator), ${bounds.counted} verifies through the counting proxy`);
  proxy.target = stack.anvil.url;
  let reference = await startReference(proxy.url, authorizerKey);
  let referenceUpstream;
  let referenceRun;
  try {
    referenceUpstream = await countUpstream(proxy, reference.url, pools.reference.counted);
    await reference.stop();
    log(`batch: the reference straight on anvil; ${ref.concurrency} callers for at most ${ref.maxMs / 1000} s`);
    reference = await startReference(stack.anvil.url, authorizerKey);
    referenceRun = await timedVerify(reference.url, reference.child.pid, pools.reference.warm, pools.reference.pool, ref);
  } finally {
    await reference.stop();
  }
  return {
    verify: { routerd: { ...routerdRun, upstream: routerdUpstream }, reference: { ...referenceRun, upstream: referenceUpstream } },
    rpsOverReference: routerdRun.rps / referenceRun.rps,
  };
}

/**
 * The claim bursts: the first set's merchants with routerd's default room per transaction; the
 * second's with room for all (routerd restarted), then the second's again.
 */
async function claimRounds({ stack, files, first, second, wideMaxCalls, log }) {
  log(`batch: ${first.length} one-row claims of as many merchants at once (default batch_max_calls_per_tx)`);
  const claimsDefault = await claimBurst(stack, first, 2n * PRICE);
  log(`batch: ${second.length} more of other merchants, with batch_max_calls_per_tx = ${wideMaxCalls}`);
  stack.reconfigure({ routerdOpts: { ...stack.config.routerdOpts, extra: facilitatorToml(files, wideMaxCalls) } });
  await stack.routerd.restart();
  const claimsWide = await claimBurst(stack, second, 2n * PRICE);
  log(`batch: the same ${second.length} merchants claim again (a later voucher of each channel)`);
  const claimsAgain = await claimBurst(stack, second, 3n * PRICE);
  return {
    default: claimsDefault, wide: { ...claimsWide, maxCallsPerTx: wideMaxCalls }, again: { ...claimsAgain, maxCallsPerTx: wideMaxCalls },
  };
}

/**
 * The batch phase. `bounds`: {channels, depositConcurrency, counted, warmup, routerd: {concurrency,
 * total, maxMs}, reference: {...}, wideMaxCalls}.
 */
export async function benchBatch(bounds, log) {
  const authorizerKey = generatePrivateKey();
  const authorizer = privateKeyToAccount(authorizerKey).address;
  const proxy = await startFilteringProxy();
  let throughProxy = true;
  const rpcUrlFor = (name, url) => {
    proxy.target = url;
    return throughProxy ? proxy.url : url;
  };
  // Two sets of channels: the verifies and the first claim burst on one, the second burst on the
  // other, so that both bursts are each merchant's first claim (it writes the receiver's claimed
  // total from zero, a fresh storage slot, and costs more gas than a later claim).
  const total = 2 * bounds.channels;
  log(`batch: anvil with USDC and the batch-settlement contracts, routerd, ${total} merchants`);
  const { stack, merchants: keyed, files } = await startStack({ channels: total, burstPayers: 2 * bounds.burst.payers, authorizerKey, rpcUrlFor });
  const merchants = keyed.slice(0, total);
  const shop = keyed[total];
  try {
    log(`batch: ${total} deposits through routerd (official client), ${bounds.depositConcurrency} at a time`);
    let t0 = nowMs();
    const all = await openChannels(stack, merchants, authorizer, bounds.depositConcurrency);
    const setupSeconds = (nowMs() - t0) / 1000;
    const [first, second] = [all.slice(0, bounds.channels), all.slice(bounds.channels)];
    // From here on a block every second, as the reference figures of the issue were taken.
    await stack.anvil.rpc('evm_setIntervalMining', [1]);
    // Let routerd finish what follows the deposits' settlements (its reads after each inclusion)
    // before its upstream calls are counted.
    await sleep(2000);

    t0 = nowMs();
    const pools = await signPools(first, bounds);
    const signSeconds = (nowMs() - t0) / 1000;
    log(`batch: signed ${pools.signed} distinct vouchers in ${signSeconds.toFixed(1)} s`);
    const straight = () => {
      throughProxy = false;
      stack.reconfigure({});
    };
    const verifies = await compareVerifies({ stack, proxy, straight, pools, bounds, authorizerKey, log });
    const claims = await claimRounds({ stack, files, first, second, wideMaxCalls: bounds.wideMaxCalls, log });
    const burst = await payerBurst({
      stack, accounts: stack.payers.slice(total), payTo: shop.receiver, apiKey: shop.token, bounds: { ...bounds.burst, price: PRICE }, log,
    });
    return { channels: first.length, setupSeconds, signSeconds, vouchersSigned: pools.signed, ...verifies, claims, burst };
  } finally {
    await stack.stop();
    await proxy.close();
  }
}

const f = (x, digits = 2) => (Number.isFinite(x) ? x.toFixed(digits) : '-');

/** Calls per verify by method, the most first, those below 0.005 left out. */
const methods = (perVerify) => Object.entries(perVerify).filter(([, x]) => x >= 0.005).sort((a, b) => b[1] - a[1])
  .map(([method, x]) => `${method} ${f(x, 2)}`).join(', ') || 'none';

/** The phase's figures as lines of text (the table's `h` section, and `--only batch`). */
export function batchLines(b) {
  const out = [];
  const { routerd: vr, reference: vf } = b.verify;
  const verifyLine = (name, x) => `h ${name}: ${f(x.rps, 0)} voucher verifies/s at ${x.concurrency} callers `
    + `(p50 ${f(x.p50, 1)} ms, p99 ${f(x.p99, 1)} ms, ${x.n} in ${f(x.seconds, 1)} s, ${x.failed} failed); `
    + `CPU ${f(x.cpuMicrosPerVerify, 0)} µs per verify; upstream ${f(x.upstream.callsPerVerify, 3)} JSON-RPC calls and `
    + `${f(x.upstream.requestsPerVerify, 3)} HTTP requests per verify (${methods(x.upstream.perVerify)})`;
  out.push(verifyLine('routerd', vr));
  out.push(verifyLine('reference (@x402/evm 2.27.0 facilitator)', vf));
  out.push(`h voucher verify/s, routerd / reference: ${f(b.rpsOverReference, 2)} (goal: 5); routerd's upstream calls per verify `
    + `${f(vr.upstream.callsPerVerify, 3)} (goal: at most 1)`);
  for (const [name, c] of Object.entries(b.claims)) {
    const room = name === 'default' ? 'default batch_max_calls_per_tx (100)' : `batch_max_calls_per_tx = ${c.maxCallsPerTx}`
      + (name === 'again' ? ', the same channels again' : '');
    const txs = c.transactions.map((t) => `${t.rows} rows ${t.gasUsed} gas (${f(t.gasUsed / t.rows, 0)}/row)`).join(' + ');
    out.push(`h claims, ${room}: ${c.claimedOnChain} of ${c.claims} claimed on chain (${c.answeredSuccess} answered success) `
      + `in ${c.transactions.length} transactions [${txs || 'none'}]; most rows in one: ${c.transactions[0]?.rows ?? 0} (goal: >= 100); `
      + `gas per claimed channel ${f(c.gasPerChannel, 0)}; all answered in ${f(c.wallMs, 0)} ms (p50 ${f(c.answer.p50, 0)} ms, 1 s blocks)`);
    if (c.firstError) out.push(`  first error: ${c.firstError}`);
  }
  for (const x of [vr, vf, vr.upstream, vf.upstream]) if (x.firstError) out.push(`  first error: ${x.firstError}`);
  out.push(...burstLines(b.burst));
  return out;
}

/** The payer burst's lines: through routerd, through the instrument, and their ratio. */
function burstLines(burst) {
  const calls = (x) => Object.entries(x.facilitatorCalls).map(([op, types]) => `${op} ${Object.entries(types)
    .map(([type, k]) => `${k} ${type}`).join(' + ') || 'none'}`).join(', ');
  const line = (name, x) => `h burst, ${name}: ${f(x.rps, 0)} paid requests/s (runs: ${x.rpsEach.map((r) => f(r, 0)).join(', ')}; `
    + `${x.paid} paid in ${f(x.seconds, 1)} s: `
    + `${x.deposits} deposits, ${x.vouchers} vouchers; ${x.failed} failed) from ${x.payers} payers at once each run; `
    + `deposit p50 ${f(x.deposit.p50, 0)} ms, all deposits answered by ${f(x.depositsDoneSeconds, 1)} s; voucher p50 ${f(x.voucher.p50, 1)} ms, `
    + `p99 ${f(x.voucher.p99, 1)} ms; CPU per paid request: shop ${f(x.shopCpuMicrosPerPaid, 0)} µs, payers `
    + `(the load generator) ${f(x.clientCpuMicrosPerPaid, 0)} µs; the shop asked its facilitator: ${calls(x)}`;
  const out = [
    line('the official shop on routerd', burst.routerd) + `; escrowed ${burst.routerd.escrowedOk ? 'as deposited' : `${burst.routerd.escrowed}, NOT the deposits`}`,
    line('the same shop on an instrument that answers at once (no chain; its ceiling)', burst.instant),
    `h burst paid requests/s, routerd / the shop's ceiling: ${f(burst.rpsOverInstant, 2)} (goal: 0.8)`,
  ];
  for (const x of [burst.routerd, burst.instant]) if (x.firstError) out.push(`  first error: ${x.firstError}`);
  return out;
}

/** Failures of the phase: verifies not valid, claims not claimed, burst requests not paid. */
export function batchFailures(b) {
  const { routerd: vr, reference: vf } = b.verify;
  return vr.failed + vf.failed + vr.upstream.failed + vf.upstream.failed
    + Object.values(b.claims).reduce((sum, c) => sum + (c.claims - c.claimedOnChain), 0)
    + b.burst.routerd.failed + b.burst.instant.failed + (b.burst.routerd.escrowedOk ? 0 : 1);
}
