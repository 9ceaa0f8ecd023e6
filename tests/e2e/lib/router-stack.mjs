// One transaction-router test environment: three real anvil chains with different fee settings
// and a router-only routerd (no signer key) routing among them.
//
//   op      chain 901, kind l2, `--network optimism`, EIP-1559 with a low base fee, plus the L1 data
//           fee of the real GasPriceOracle/L1Block predeploys (lib/op-stack.mjs, Fjord rules, which
//           is also what anvil charges): cheapest for small calldata, dearest per (incompressible)
//           calldata byte.
//   legacy  chain 902, kind l3, `--hardfork berlin` (no baseFeePerGas: legacy gasPrice), 10 gwei.
//   l1      chain 900, kind l1, EIP-1559 with a 50 gwei base fee: the dearest for everything.
//
// So a plain transfer costs op < legacy < l1, and large incompressible calldata moves the choice
// to legacy (op's execution cost alone would still be the lowest: the L1 fee is what moves it).
import { join } from 'node:path';
import { existsSync, mkdirSync } from 'node:fs';
import { createPublicClient, http, toHex, hexToBigInt } from 'viem';
import { startAnvil } from './anvil.mjs';
import { startRouterd, routerdBin } from './routerd.mjs';
import { installOpStackPredeploys } from './op-stack.mjs';
import { freshAccount } from './accounts.mjs';
import { freePort, makeTempDir, sleep } from './util.mjs';

export const GWEI = 1_000_000_000n;
export const ETHER = 10n ** 18n;

/** The three chains of the default stack, cheapest first for a plain transfer. */
export const DEFAULT_CHAINS = Object.freeze([
  {
    name: 'op', chainId: 901, kind: 'l2', feeModel: 'op-stack',
    anvil: { baseFee: GWEI / 10n, extraArgs: ['--network', 'optimism'] },
    opStack: { l1BaseFee: 40n * GWEI, baseFeeScalar: 1_000_000, blobBaseFee: 1n, blobBaseFeeScalar: 0 },
  },
  {
    name: 'legacy', chainId: 902, kind: 'l3', feeModel: 'auto',
    anvil: { hardfork: 'berlin', extraArgs: ['--gas-price', String(10n * GWEI)] },
  },
  {
    name: 'l1', chainId: 900, kind: 'l1', feeModel: 'auto',
    anvil: { baseFee: 50n * GWEI },
  },
]);

export const ROUTER_DEFAULTS = Object.freeze({
  chainTimeoutMs: 1500,
  nonceReservationTtlSecs: 120,
  gasHeadroom: 0.2,
  prefer: ['l2', 'l1', 'l3'],
  pollIntervalMs: 200,
  requestTimeoutMs: 2000,
});

const q = (s) => JSON.stringify(String(s));
const tomlFloat = (x) => (Number.isInteger(x) ? x.toFixed(1) : String(x));

/**
 * A router-only routerd config (no [facilitator], so no signer key). Each chain: {name, chainId,
 * kind, rpcUrls, feeModel?, nativePrice?, pollIntervalMs?, requestTimeoutMs?, extra?}; `router` overrides
 * ROUTER_DEFAULTS (whose pollIntervalMs/requestTimeoutMs are the chains' defaults). `extra` (a
 * chain's), `router.extra` and `router.serverExtra` are TOML lines added to their sections.
 */
export function routerOnlyConfig({ port, storePath, chains, router = {} }) {
  const r = { ...ROUTER_DEFAULTS, ...router };
  const parts = [
    `[server]\nlisten = ${q(`127.0.0.1:${port}`)}\nshutdown_grace_secs = 5\n`
      + (r.requestReadTimeoutMs ? `request_read_timeout_ms = ${r.requestReadTimeoutMs}\n` : '')
      + (r.idleTimeoutSecs ? `idle_timeout_secs = ${r.idleTimeoutSecs}\n` : '')
      + (r.serverExtra ?? ''),
    `[storage]\npath = ${q(storePath)}\n`,
  ];
  for (const c of chains) {
    parts.push(
      `[chains.${c.name}]\nchain_id = ${c.chainId}\nkind = ${q(c.kind)}\n`
      + `rpc_urls = [${c.rpcUrls.map(q).join(', ')}]\n`
      + `fee_model = ${q(c.feeModel ?? 'auto')}\nnative_price = ${tomlFloat(c.nativePrice ?? 1)}\n`
      + `poll_interval_ms = ${c.pollIntervalMs ?? r.pollIntervalMs}\n`
      + `request_timeout_ms = ${c.requestTimeoutMs ?? r.requestTimeoutMs}\n`
      + (c.extra ?? ''),
    );
  }
  parts.push(
    `[router]\nchains = [${chains.map((c) => q(c.name)).join(', ')}]\n`
    + `prefer = [${r.prefer.map(q).join(', ')}]\n`
    + `chain_timeout_ms = ${r.chainTimeoutMs}\nnonce_reservation_ttl_secs = ${r.nonceReservationTtlSecs}\n`
    + `gas_headroom = ${r.gasHeadroom}\n`
    + (r.maxReservationsAhead ? `max_reservations_ahead = ${r.maxReservationsAhead}\n` : '')
    + (r.extra ?? ''),
  );
  return parts.join('\n');
}

/**
 * Start the chains and routerd.
 * @param {object} [o]
 * @param {typeof DEFAULT_CHAINS} [o.chains]
 * @param {Partial<typeof ROUTER_DEFAULTS>} [o.router]
 */
export async function startRouterStack({ chains = DEFAULT_CHAINS, router = {} } = {}) {
  if (!existsSync(routerdBin())) {
    throw new Error(`routerd binary not found at ${routerdBin()}: build it (cargo build) or set ROUTERD_BIN`);
  }
  const stack = new RouterStack(makeTempDir('routerd-router-e2e-'), { ...ROUTER_DEFAULTS, ...router });
  try {
    await stack.setup(chains);
  } catch (err) {
    await stack.stop();
    throw err;
  }
  return stack;
}

/** Talks to one routerd over HTTP: JSON-RPC calls, REST posts, and viem's client.request. */
export class RouterdClient {
  /** @param {string} url  routerd's base URL */
  constructor(url) {
    this.attach(url);
  }

  attach(url) {
    this.url = url;
    // viem as a wallet library would use it: client.request({method: 'eth_routerTransaction', ...}).
    this.viem = url ? createPublicClient({ transport: http(url, { retryCount: 0, timeout: 30_000 }) }) : null;
  }

  /** JSON-RPC call to routerd; returns {status, body, text}. `body` is the raw envelope. */
  async rpc(method, params, { id = 1 } = {}) {
    const envelope = { jsonrpc: '2.0', id, method };
    if (params !== undefined) envelope.params = params;
    return this.post('/', envelope);
  }

  /** eth_routerTransaction through viem's client.request (throws viem's RpcRequestError on error). */
  routeWithViem(tx) {
    return this.viem.request({ method: 'eth_routerTransaction', params: [tx] });
  }

  /** eth_routerTransaction that must succeed; returns the result. */
  async route(tx) {
    const res = await this.rpc('eth_routerTransaction', [tx]);
    if (res.status !== 200 || !res.body || res.body.error || !res.body.result) {
      throw new Error(`eth_routerTransaction failed: HTTP ${res.status} ${res.text}`);
    }
    return res.body.result;
  }

  /** router_quote that must succeed; returns the ranked array. */
  async quote(tx) {
    const res = await this.rpc('router_quote', [tx]);
    if (res.status !== 200 || !Array.isArray(res.body?.result)) {
      throw new Error(`router_quote failed: HTTP ${res.status} ${res.text}`);
    }
    return res.body.result;
  }

  async routerChains() {
    const res = await this.rpc('router_chains', []);
    if (res.status !== 200 || !Array.isArray(res.body?.result)) {
      throw new Error(`router_chains failed: HTTP ${res.status} ${res.text}`);
    }
    return res.body.result;
  }

  /** Wait until router_chains reports each named chain healthy (with a head block). */
  async waitHealthy(names, { timeoutMs = 20_000 } = {}) {
    const deadline = Date.now() + timeoutMs;
    let last;
    for (;;) {
      try {
        last = await this.routerChains();
        if (names.every((n) => last.find((c) => c.chain === n)?.healthy === true)) return last;
      } catch (err) {
        last = err.message;
      }
      if (Date.now() > deadline) throw new Error(`chains ${names} not healthy: ${JSON.stringify(last)}`);
      await sleep(100);
    }
  }

  /** POST JSON (or a raw string) to routerd; returns {status, body, text}. */
  async post(path, body, { headers = {} } = {}) {
    const raw = typeof body === 'string' ? body : JSON.stringify(body);
    const res = await fetch(`${this.url}${path}`, {
      method: 'POST', body: raw, headers: { 'content-type': 'application/json', ...headers },
    });
    const text = await res.text();
    let parsed;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    return { status: res.status, body: parsed, text };
  }
}

class RouterStack extends RouterdClient {
  constructor(tmp, router) {
    super(null);
    this.tmp = tmp;
    this.router = router;
    /** name -> {name, chainId, kind, feeModel, anvil, l1Values?} */
    this.chains = {};
  }

  /**
   * Chain specs as DEFAULT_CHAINS; besides, `rpcUrls: [...]` without `anvil` configures a chain
   * served by no anvil (a hung or broken upstream), and `rpcUrlsFor: (anvilUrl) => [...]` lists
   * several URLs for an anvil chain (failover).
   */
  async setup(chains) {
    // One after the other: parallel freePort() calls could race for a port.
    for (const c of chains) {
      if (!c.anvil) {
        this.chains[c.name] = { ...c };
        continue;
      }
      const anvil = await startAnvil({ ...c.anvil, chainId: c.chainId, logFile: join(this.tmp.dir, `anvil-${c.name}.log`) });
      const chain = { ...c, anvil, url: anvil.url, rpcUrls: c.rpcUrlsFor ? c.rpcUrlsFor(anvil.url) : [anvil.url] };
      this.chains[c.name] = chain;
      if (c.opStack) chain.l1Values = (await installOpStackPredeploys(anvil, c.opStack)).l1Values;
    }
    const port = await freePort();
    this.configToml = routerOnlyConfig({
      port,
      storePath: join(this.tmp.dir, 'routerd.db'),
      chains: chains.map((c) => this.chains[c.name]),
      router: this.router,
    });
    this.routerd = await startRouterd({ configToml: this.configToml, dir: this.tmp.dir, port });
    this.attach(this.routerd.url);
    // Wait until routerd has a head for every anvil chain, so the first routed call sees all of them.
    await this.waitHealthy(Object.values(this.chains).filter((c) => c.anvil).map((c) => c.name));
  }

  /**
   * Another routerd on the same chains, with its own store and config: `router` overrides this
   * stack's router settings, `chains` overrides chain settings by name (e.g. {op: {nativePrice: 2}}).
   * Stopped by stop(). Returns a RouterdClient with `.routerd`.
   */
  async extraRouterd({ router = {}, chains: overrides = {} } = {}) {
    this.extras ??= [];
    const n = this.extras.length + 1;
    const dir = join(this.tmp.dir, `extra-${n}`);
    mkdirSync(dir);
    const port = await freePort();
    const configToml = routerOnlyConfig({
      port,
      storePath: join(dir, 'routerd.db'),
      chains: Object.values(this.chains).map((c) => ({ ...c, ...(overrides[c.name] ?? {}) })),
      router: { ...this.router, ...router },
    });
    const routerd = await startRouterd({ configToml, dir, port });
    const client = new RouterdClient(routerd.url);
    client.routerd = routerd;
    this.extras.push(client);
    await client.waitHealthy(Object.values(this.chains).filter((c) => c.anvil).map((c) => c.name));
    return client;
  }

  async stop() {
    await Promise.all((this.extras ?? []).map((x) => x.routerd.stop()));
    const exit = this.routerd ? await this.routerd.stop() : null;
    await Promise.all(Object.values(this.chains).filter((c) => c.anvil).map((c) => c.anvil.stop()));
    this.tmp.cleanup();
    return exit;
  }

  // ---------------------------------------------------------------------------------------------
  // chains

  chain(name) {
    const c = this.chains[name];
    if (!c) throw new Error(`no chain ${name}`);
    return c;
  }

  /** The chain whose id is `chainId` (number, bigint or hex string). */
  chainById(chainId) {
    const id = Number(BigInt(chainId));
    const c = Object.values(this.chains).find((x) => x.chainId === id);
    if (!c) throw new Error(`no chain with id ${chainId}`);
    return c;
  }

  /** A fresh account with `amount` wei on each chain in `on` (the others: nothing). */
  async newSender({ on = Object.keys(this.chains), amount = 100n * ETHER } = {}) {
    const account = freshAccount();
    await this.fund(account.address, { on, amount });
    return account;
  }

  async fund(address, { on = Object.keys(this.chains), amount = 100n * ETHER } = {}) {
    await Promise.all(on.map((name) => this.chain(name).anvil.rpc('anvil_setBalance', [address, toHex(amount)])));
  }

  /** Put `code` at `address` on the named chains (anvil_setCode). */
  async setCode(address, code, { on = Object.keys(this.chains) } = {}) {
    await Promise.all(on.map((name) => this.chain(name).anvil.rpc('anvil_setCode', [address, code])));
  }

  /** Wait until routerd's cached head of chain `name` is the chain's latest block. */
  async waitHeadSynced(name, { timeoutMs = 10_000 } = {}) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const latest = Number(await this.chain(name).anvil.rpc('eth_blockNumber', []));
      const entry = (await this.routerChains()).find((c) => c.chain === name);
      if (entry?.headBlock === latest) return latest;
      if (Date.now() > deadline) throw new Error(`routerd's head of ${name} stuck at ${entry?.headBlock}, chain at ${latest}`);
      await sleep(50);
    }
  }

  pendingNonce(name, address) {
    return this.chain(name).anvil.rpc('eth_getTransactionCount', [address, 'pending']).then(Number);
  }

  // ---------------------------------------------------------------------------------------------
  // signing and sending exactly what routerd answered

  /**
   * The transaction a wallet signs from routerd's answer: the caller's {to, data, value} plus
   * exactly the returned chainId, nonce, gas (= gasLimit) and fee fields; the type follows the
   * fee fields (maxFeePerGas -> eip1559, gasPrice -> legacy).
   */
  static txFromAnswer(request, answer) {
    const tx = {
      chainId: Number(hexToBigInt(answer.chainId)),
      nonce: Number(hexToBigInt(answer.nonce)),
      gas: hexToBigInt(answer.gasLimit),
      data: request.data,
      value: parseValue(request.value),
    };
    if (request.to !== '' && request.to !== '0x') tx.to = request.to;
    if (answer.maxFeePerGas !== undefined) {
      Object.assign(tx, {
        type: 'eip1559',
        maxFeePerGas: hexToBigInt(answer.maxFeePerGas),
        maxPriorityFeePerGas: hexToBigInt(answer.maxPriorityFeePerGas),
      });
    } else {
      Object.assign(tx, { type: 'legacy', gasPrice: hexToBigInt(answer.gasPrice) });
    }
    return tx;
  }

  /** Sign with `account` and send to the chain of `answer.chainId`; returns the raw-tx hash. */
  async signAndSend(account, request, answer) {
    const tx = RouterStack.txFromAnswer(request, answer);
    const raw = await account.signTransaction(tx);
    const chain = this.chainById(answer.chainId);
    const hash = await chain.anvil.rpc('eth_sendRawTransaction', [raw]);
    return { hash, tx, chain };
  }

  /** Sign, send, wait for the receipt; returns {receipt, onChain (eth_getTransactionByHash), tx, chain}. */
  async signSendAndMine(account, request, answer) {
    const sent = await this.signAndSend(account, request, answer);
    const receipt = await this.waitReceipt(sent.chain.name, sent.hash);
    const onChain = await sent.chain.anvil.rpc('eth_getTransactionByHash', [sent.hash]);
    return { ...sent, receipt, onChain };
  }

  async waitReceipt(name, hash, { timeoutMs = 20_000 } = {}) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const receipt = await this.chain(name).anvil.rpc('eth_getTransactionReceipt', [hash]);
      if (receipt) return receipt;
      if (Date.now() > deadline) throw new Error(`no receipt for ${hash} on ${name} after ${timeoutMs} ms`);
      await sleep(50);
    }
  }
}

export function parseValue(value) {
  return BigInt(value); // BigInt parses both decimal and 0x-hex strings
}

/** The request shape routerd takes, with defaults: a plain 0-value call to `to`. */
export function routerTx({ from, to, data = '0x', value = '0' }) {
  return { from, to, data, value };
}

/**
 * Wrap a test body so that a failure prints the tail of routerd's log.
 */
export function withRouterLogTail(getStack, fn) {
  return async (t) => {
    try {
      await fn(t);
    } catch (err) {
      const tail = getStack()?.routerd?.tail(60);
      if (tail) console.error(`--- routerd log tail (${t.name}) ---\n${tail}\n--- end ---`);
      throw err;
    }
  };
}

export { RouterStack };
