// The batch phase's payer burst (bench/batch.mjs): payers who each deposit once and then pay by
// voucher through the official resource server (bench/batch-shop.mjs, an @x402/express shop with
// @x402/evm's batch-settlement server scheme, in a process of its own), each with the official
// @x402/fetch client and @x402/evm's batch-settlement client scheme.
//
// Every payer pays its requests one after another; all payers at once. A payer's first request
// deposits (the shop asks its facilitator to verify and settle it); the next ones are vouchers,
// which the official server verifies and charges itself against the channel state the deposit's
// answer gave it (it asks the facilitator again only once that state is older than its TTL, at
// least 30 s). The burst runs four times, each time with a new shop and new payers, two on each
// side (routerd, the instrument, the instrument, routerd):
// - with routerd as the shop's facilitator (the deposits settle on chain, 1 s blocks);
// - with an instrument in place of a facilitator (bench/batch-instant.mjs, in a process of its own
//   so that the payers' work does not delay its answers): it answers at once, without a chain, so
//   that these runs measure the shop's own ceiling.
import { spawn } from 'node:child_process';
import { Agent, request as httpRequest } from 'node:http';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { getAddress } from 'viem';
import { generatePrivateKey } from 'viem/accounts';
import { toClientEvmSigner } from '@x402/evm';
import { BatchSettlementEvmScheme as BatchClient, InMemoryClientChannelStorage } from '@x402/evm/batch-settlement/client';
import { wrapFetchWithPayment, x402Client, decodePaymentResponseHeader } from '@x402/fetch';
import { freshAccount } from '../tests/e2e/lib/accounts.mjs';
import { BATCH_SETTLEMENT } from '../tests/e2e/lib/batch-settlement.mjs';
import { trackChild } from '../tests/e2e/lib/util.mjs';
import { nowMs, summarize, cpuSeconds } from './lib.mjs';

const here = dirname(fileURLToPath(import.meta.url));

/** `script` (in bench/) in a process of its own, serving on the port it prints first. */
async function startServer(script, args, env) {
  const child = trackChild(spawn(process.execPath, [join(here, script), ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'inherit'] }));
  const port = await new Promise((resolve, reject) => {
    child.stdout.once('data', (line) => resolve(Number(String(line).trim())));
    child.once('exit', (code) => reject(new Error(`${script} exited with ${code}`)));
  });
  return {
    child,
    url: `http://127.0.0.1:${port}`,
    stop: () => new Promise((done) => {
      if (child.exitCode !== null || child.signalCode !== null) return done();
      child.once('exit', done);
      return child.kill('SIGTERM');
    }),
  };
}

/** The shop, its facilitator at `facilitatorUrl`, with its own receiver authorizer key. */
async function startShop({ facilitatorUrl, network, asset, payTo, price, minDeposit, apiKey }) {
  const env = { BENCH_AUTHORIZER_KEY: generatePrivateKey(), ...(apiKey && { BENCH_API_KEY: apiKey }) };
  const shop = await startServer('batch-shop.mjs', [facilitatorUrl, network, asset, payTo, String(price), String(minDeposit)], env);
  return { ...shop, stats: async () => (await fetch(`${shop.url}/stats`)).json() };
}

/**
 * A payer's own fetch: its requests on one keep-alive connection of its own (node:http), one at a
 * time, as a wallet sends them. With the global fetch, the 250 payers shared one pool, which kept
 * opening new connections during the burst; the busy shop accepted them a few a second, and the
 * requests sent on them waited up to 20 s (the shop answered every request it read within 2.5 s).
 */
function ownConnectionFetch() {
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  return (input, init) => new Promise((resolve, reject) => {
    const request = new Request(input, init);
    if (request.body) throw new Error('a paid GET has no body');
    const req = httpRequest(request.url, { method: request.method, headers: Object.fromEntries(request.headers), agent }, (res) => {
      const chunks = [];
      res.on('data', (chunk) => chunks.push(chunk));
      res.on('end', () => {
        const headers = new Headers();
        for (const [name, value] of Object.entries(res.headers)) headers.set(name, Array.isArray(value) ? value.join(', ') : value);
        resolve(new Response(res.statusCode === 204 ? null : Buffer.concat(chunks), { status: res.statusCode, headers }));
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/**
 * One payer's @x402/fetch (`pay`), its deposit covering its first request and `vouchers` more, and
 * its own fetch beneath (`plain`).
 */
function payingFetch({ account, client, network, asset, price, vouchers }) {
  const scheme = new BatchClient(toClientEvmSigner(account, client), {
    storage: new InMemoryClientChannelStorage(), depositPolicy: { depositMultiplier: vouchers + 1 },
  });
  const x402 = new x402Client().register(network, scheme);
  x402.setSpendControls({ allowedAssets: [{ network, asset, maxAmountPerPayment: String(price) }] });
  const plain = ownConnectionFetch();
  return { pay: wrapFetchWithPayment(plain, x402), plain };
}

/**
 * A paid answer: 200 and a successful PAYMENT-RESPONSE charging one price. Answers its kind
 * (`deposit` when it names a transaction, `voucher` when none) or throws what went wrong.
 */
async function paidAnswer(res, price) {
  const text = await res.text();
  if (res.status !== 200) throw new Error(`HTTP ${res.status} ${text.slice(0, 300)}`);
  const header = res.headers.get('payment-response');
  const receipt = header && decodePaymentResponseHeader(header);
  if (receipt?.success !== true || receipt.extra?.chargedAmount !== String(price)) {
    throw new Error(`not a paid answer: ${JSON.stringify(receipt)}`);
  }
  return receipt.transaction ? 'deposit' : 'voucher';
}

/**
 * The burst: every payer in `accounts` pays `vouchers` + 1 requests to `url`, one after another,
 * all payers at once; a payer stops early at `maxMs`. Answers paid requests/s over the whole burst,
 * the deposits' and vouchers' latencies, how long the last deposit took, and the failures.
 */
async function burst({ url, accounts, vouchers, maxMs, ...shape }) {
  const latency = { deposit: [], voucher: [] };
  let failed = 0;
  let firstError;
  let depositsDoneMs = 0;
  // Every payer's connection open before the burst (a busy shop accepts new ones a few a second).
  const payers = accounts.map((account) => ({ account, ...payingFetch({ ...shape, account, vouchers }) }));
  await Promise.all(payers.map(async ({ plain }) => (await plain(`${url}/stats`)).text()));
  const t0 = nowMs();
  const deadline = t0 + maxMs;
  await Promise.all(payers.map(async ({ account, pay }) => {
    for (let i = 0; i <= vouchers && nowMs() < deadline; i += 1) {
      const sent = nowMs();
      try {
        const kind = await paidAnswer(await pay(`${url}/weather`), shape.price);
        latency[kind].push(nowMs() - sent);
        if (kind === 'deposit') depositsDoneMs = Math.max(depositsDoneMs, nowMs() - t0);
      } catch (err) {
        failed += 1;
        firstError ??= `payer ${account.address} request ${i}: ${err.message}`;
      }
    }
  }));
  return { payers: accounts.length, seconds: (nowMs() - t0) / 1000, depositsDoneSeconds: depositsDoneMs / 1000, latency, failed, firstError };
}

/** One run: a new shop on `facilitatorUrl`, the burst, the shop's CPU and its facilitator calls. */
async function run({ facilitatorUrl, apiKey, payTo, accounts, bounds, shape }) {
  const minDeposit = BigInt(bounds.vouchers + 1) * shape.price;
  const shop = await startShop({ ...shape, facilitatorUrl, apiKey, payTo, minDeposit });
  try {
    const cpu0 = cpuSeconds(shop.child.pid);
    const own0 = process.cpuUsage();
    const result = await burst({ ...shape, url: shop.url, accounts, vouchers: bounds.vouchers, maxMs: bounds.maxMs });
    const cpu1 = cpuSeconds(shop.child.pid);
    const own = process.cpuUsage(own0);
    return {
      ...result, shopCpuSeconds: cpu1.user - cpu0.user + cpu1.system - cpu0.system, clientCpuSeconds: (own.user + own.system) / 1e6,
      facilitatorCalls: await shop.stats(),
    };
  } finally {
    await shop.stop();
  }
}

/** One side's runs as one: rates over their summed time, latencies over all their requests. */
function combine(runs) {
  const sum = (key) => runs.reduce((total, r) => total + r[key], 0);
  const deposits = runs.flatMap((r) => r.latency.deposit);
  const vouchers = runs.flatMap((r) => r.latency.voucher);
  const paid = deposits.length + vouchers.length;
  const facilitatorCalls = {};
  for (const [op, types] of runs.flatMap((r) => Object.entries(r.facilitatorCalls))) {
    for (const [type, k] of Object.entries(types)) {
      facilitatorCalls[op] ??= {};
      facilitatorCalls[op][type] = (facilitatorCalls[op][type] ?? 0) + k;
    }
  }
  return {
    runs: runs.length, payers: runs[0].payers, paid, seconds: sum('seconds'), rps: paid / sum('seconds'),
    rpsEach: runs.map((r) => (r.latency.deposit.length + r.latency.voucher.length) / r.seconds),
    deposits: deposits.length, vouchers: vouchers.length, failed: sum('failed'), firstError: runs.find((r) => r.firstError)?.firstError,
    depositsDoneSeconds: Math.max(...runs.map((r) => r.depositsDoneSeconds)), deposit: summarize(deposits), voucher: summarize(vouchers),
    shopCpuMicrosPerPaid: (sum('shopCpuSeconds') * 1e6) / paid, clientCpuMicrosPerPaid: (sum('clientCpuSeconds') * 1e6) / paid,
    facilitatorCalls,
  };
}

/**
 * The burst four times, each with a new shop and new payers, in the order routerd, the
 * instrument, the instrument, routerd, so that a machine that gets busier or quieter over the
 * minute weighs on both sides alike. `stack`: routerd's; `accounts`: twice `bounds.payers` payers
 * holding USDC (routerd's two runs); `payTo`: the shop's receiver, `apiKey` its key at routerd.
 * `bounds`: {payers, vouchers, maxMs (each run), price}.
 */
export async function payerBurst({ stack, accounts, payTo, apiKey, bounds, log }) {
  const network = `eip155:${stack.chainId}`;
  const shape = { network, asset: getAddress(stack.usdc), price: bounds.price, client: stack.client };
  const viaRouterd = (payers) => () => run({ facilitatorUrl: stack.url, apiKey, payTo, accounts: payers, bounds, shape });
  const viaInstrument = async () => {
    const instant = await startServer('batch-instant.mjs', [network], {});
    try {
      return await run({ facilitatorUrl: instant.url, payTo, accounts: Array.from({ length: bounds.payers }, () => freshAccount()), bounds, shape });
    } finally {
      await instant.stop();
    }
  };
  const order = [
    ['routerd', viaRouterd(accounts.slice(0, bounds.payers))], ['instant', viaInstrument],
    ['instant', viaInstrument], ['routerd', viaRouterd(accounts.slice(bounds.payers, 2 * bounds.payers))],
  ];
  const escrow0 = await stack.balanceOf(BATCH_SETTLEMENT);
  const runs = { routerd: [], instant: [] };
  for (const [side, go] of order) {
    log(`batch: burst, ${bounds.payers} payers at once, each a deposit then ${bounds.vouchers} vouchers, through the shop on `
      + `${side === 'routerd' ? 'routerd' : 'an instrument that answers at once'}`);
    runs[side].push(await go());
  }
  const routerd = combine(runs.routerd);
  const instant = combine(runs.instant);
  // Each deposit is the shop's minimum deposit: the first request and every voucher after it.
  const escrowed = await stack.balanceOf(BATCH_SETTLEMENT) - escrow0;
  const expected = BigInt(routerd.deposits) * BigInt(bounds.vouchers + 1) * bounds.price;
  return {
    routerd: { ...routerd, escrowedOk: escrowed === expected, escrowed: String(escrowed) },
    instant,
    rpsOverInstant: routerd.rps / instant.rps,
  };
}
