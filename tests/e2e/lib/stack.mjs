// One facilitator test environment: anvil chain(s) with real USDC, and routerd serving them.
// Set up once per test file (before/after hooks) because chains and the daemon take a moment to start.
import { writeFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { getAddress } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { startAnvil } from './anvil.mjs';
import { anvilKey, anvilAccount, freshAccount, ROLE } from './accounts.mjs';
import { deployUsdc, walletFor, usdcAbi, mintUsdc, blacklistUsdc, USDC_EIP712 } from './deploy-usdc.mjs';
import { routerdConfig, startRouterd, routerdBin } from './routerd.mjs';
import { buildPayment, toV2 } from './x402.mjs';
import { ERC1271_ALWAYS_VALID, ERC1271_ALWAYS_INVALID } from './wallets.mjs';
import { freePort, makeTempDir, readAnswer, IDEMPOTENCY_KEY } from './util.mjs';

export const NETWORK = 'base-sepolia'; // the official x402 v1 client maps it to chain id 84532
export const CHAIN_ID = 84532;
// base-sepolia is a known network, whose preset gives its USDC both transfer methods (ERC-3009
// and Permit2); the stack's USDC is ERC-3009 only unless a test says otherwise (usdcExtra), so
// that /supported is the exact scheme alone.
const USDC_ERC3009_ONLY = 'transfer_methods = ["eip3009"]\n';
// base-sepolia is a known network, whose preset fee model is op-stack (Base's L1 data fee). This
// anvil has no GasPriceOracle predeploy, so the router could not price that fee: EIP-1559 only.
const ANVIL_FEE_MODEL = 'fee_model = "eip1559"\n';

/**
 * @param {object} [o]
 * @param {object} [o.anvil]          startAnvil options for the base-sepolia chain (chainId is fixed)
 * @param {{name: string, chainId: number, served?: boolean, usdc?: boolean}[]} [o.extraChains]
 * @param {number} [o.fundedPayers=0] payers funded during setup (needed where blocks are not automatic)
 * @param {bigint} [o.payerFunds=1_000_000_000n]  atomic USDC per pre-funded payer
 * @param {string[]} [o.denyList]     addresses written to the KYT deny-list file
 * @param {object} [o.routerd]        routerdConfig options (settleTimeoutSecs, maxBatch, maxBodyBytes, serverExtra), and
 *   openFiles: the open-file limit routerd runs under (prlimit)
 * @param {string[]} [o.extraSignerKeys] more facilitator keys, after the signer role's
 * @param {string} [o.chainExtra]     raw TOML added to the base-sepolia chain table (e.g. "confirmations = 3\n")
 * @param {string} [o.usdcExtra]      raw TOML added to its USDC table (default: ERC-3009 only)
 * @param {(name: string, anvilUrl: string) => string} [o.rpcUrlFor]  the RPC URL routerd is given for a
 *   chain (default: the anvil URL itself; e.g. a lib/bad-upstreams.mjs proxy in front of it)
 * @param {(stack: Stack) => Promise<string|void>} [o.beforeRouterd]  run once the chains are up, before
 *   routerd starts (e.g. placing contracts routerd checks at start); TOML it returns is added to
 *   routerd's config after the [facilitator] table (as routerd.extra is)
 */
export async function startFacilitatorStack({
  anvil: anvilOpts = {}, extraChains = [], fundedPayers = 0, payerFunds = 1_000_000_000n, denyList = [], routerd: routerdOpts = {},
  extraSignerKeys = [], chainExtra = '', usdcExtra = USDC_ERC3009_ONLY, rpcUrlFor = (name, url) => url,
  beforeRouterd = async () => {},
} = {}) {
  // Fail before starting chains when there is no daemon to test.
  if (!existsSync(routerdBin())) {
    throw new Error(`routerd binary not found at ${routerdBin()}: build it (cargo build) or set ROUTERD_BIN`);
  }
  const tmp = makeTempDir();
  const stack = new Stack(tmp);
  stack.signerKeys = [stack.signerKey, ...extraSignerKeys];
  stack.signers = stack.signerKeys.map((key) => privateKeyToAccount(key).address); // every signer address, in key order
  try {
    await stack.setup({
      anvilOpts, extraChains, fundedPayers, payerFunds, denyList, routerdOpts, chainExtra, usdcExtra, rpcUrlFor, beforeRouterd,
    });
  } catch (err) {
    await stack.stop();
    throw err;
  }
  return stack;
}

/**
 * An `rpcUrlFor` that puts `proxy` (any lib proxy with `url` and a settable `target`) between
 * routerd and the chain: the proxy forwards to the chain's anvil URL, routerd is given the proxy's.
 */
export const throughProxy = (proxy) => (name, url) => {
  proxy.target = url;
  return proxy.url;
};

class Stack {
  constructor(tmp) {
    this.tmp = tmp;
    this.network = NETWORK;
    this.chainId = CHAIN_ID;
    this.chains = {}; // name -> {anvil, usdc, client}
    this.signer = anvilAccount(ROLE.signer).address;
    this.signerKey = anvilKey(ROLE.signer);
    this.payers = [];
  }

  async setup({
    anvilOpts, extraChains, fundedPayers, payerFunds, denyList, routerdOpts, chainExtra, usdcExtra, rpcUrlFor, beforeRouterd,
  }) {
    this.payers = Array.from({ length: fundedPayers }, () => freshAccount());
    const fund = this.payers.map((p) => ({ address: p.address, amount: payerFunds }));
    await this.addChain({ name: NETWORK, chainId: CHAIN_ID, anvilOpts, usdc: true, fund });
    for (const c of extraChains) await this.addChain({ ...c, anvilOpts: {}, fund: [] });

    const main = this.chains[NETWORK];
    Object.assign(this, { anvil: main.anvil, client: main.client, usdc: main.usdc });
    this.token = { address: main.usdc, ...USDC_EIP712 };

    const served = [NETWORK, ...extraChains.filter((c) => c.served).map((c) => c.name)];
    this.servedNetworks = served;
    const denyListFile = join(this.tmp.dir, 'deny.txt');
    writeFileSync(denyListFile, denyList.map((a) => `${a}\n`).join(''));
    const added = await beforeRouterd(this);
    if (typeof added === 'string') routerdOpts = { ...routerdOpts, extra: `${routerdOpts.extra ?? ''}${added}` };
    const port = await freePort();
    this.config = { port, served, denyListFile, routerdOpts, chainExtra, usdcExtra, rpcUrlFor };
    this.routerd = await startRouterd({
      configToml: this.configToml(), dir: this.tmp.dir, port, env: { ROUTERD_SIGNER_KEY: this.signerKeys.join(',') },
      openFiles: routerdOpts.openFiles,
    });
    this.url = this.routerd.url;
  }

  /** routerd's TOML config for this stack (same port and store), with `changes` to the setup options. */
  configToml(changes = {}) {
    const { port, served, denyListFile, routerdOpts, chainExtra, usdcExtra, rpcUrlFor } = { ...this.config, ...changes };
    return routerdConfig({
      port,
      storePath: join(this.tmp.dir, 'routerd.db'),
      chains: Object.entries(this.chains).map(([name, c]) => ({
        name, chainId: c.anvil.chainId, rpcUrl: rpcUrlFor(name, c.anvil.url), token: c.usdc,
        extra: name === NETWORK ? ANVIL_FEE_MODEL + chainExtra : '',
        tokenExtra: name === NETWORK ? usdcExtra : '',
      })),
      networks: served,
      denyListFile,
      ...routerdOpts,
    });
  }

  /**
   * Rewrite routerd's config file with `changes` (e.g. {rpcUrlFor}) for its next (re)start; the
   * running daemon is not touched. Later calls to configToml() keep the changes.
   */
  reconfigure(changes) {
    this.config = { ...this.config, ...changes };
    writeFileSync(this.routerd.configFile, this.configToml());
  }

  // A --no-mining chain is set up with automine on (deploys confirm at once), then switched off.
  async addChain({ name, chainId, anvilOpts = {}, usdc, fund }) {
    const anvil = await startAnvil({ ...anvilOpts, chainId, logFile: join(this.tmp.dir, `anvil-${name}.log`) });
    this.chains[name] = { anvil };
    if (anvilOpts.noMining) await anvil.setAutomine(true);
    const client = await walletFor(anvil.url, anvilKey(ROLE.deployer));
    this.chains[name].client = client;
    if (usdc) this.chains[name].usdc = await deployUsdc(client, { fund });
    if (anvilOpts.noMining) await anvil.setAutomine(false);
  }

  async stop() {
    const exit = this.routerd ? await this.routerd.stop() : null;
    await Promise.all(Object.values(this.chains).map((c) => c.anvil.stop()));
    this.tmp.cleanup();
    return exit;
  }

  // ---- chain helpers (all on the base-sepolia chain) ----

  /** A fresh payer with `amount` USDC (mints; needs a chain that mines by itself). */
  async newPayer(amount = 1_000_000n) {
    const account = freshAccount();
    if (amount > 0n) await this.mint(account.address, amount);
    return account;
  }

  /** Mint USDC to `address` and wait for it (needs a chain that mines by itself). */
  mint(address, amount) {
    return mintUsdc(this.client, this.usdc, address, amount);
  }

  balanceOf(address) {
    return this.client.readContract({ address: this.usdc, abi: usdcAbi, functionName: 'balanceOf', args: [address] });
  }

  blacklist(address) {
    return blacklistUsdc(this.client, this.usdc, address);
  }

  /** A smart-wallet address whose ERC-1271 isValidSignature accepts (valid) or rejects everything. */
  async smartWallet({ valid }) {
    const address = freshAccount().address;
    await this.anvil.rpc('anvil_setCode', [address, valid ? ERC1271_ALWAYS_VALID : ERC1271_ALWAYS_INVALID]);
    return address;
  }

  /** The payer cancels an unused authorization nonce on chain (ERC-3009 cancelAuthorization). */
  async cancelAuthorization(account, nonce) {
    const signature = await account.signTypedData({
      domain: { name: this.token.name, version: this.token.version, chainId: this.chainId, verifyingContract: this.usdc },
      types: { CancelAuthorization: [{ name: 'authorizer', type: 'address' }, { name: 'nonce', type: 'bytes32' }] },
      primaryType: 'CancelAuthorization',
      message: { authorizer: account.address, nonce },
    });
    const hash = await this.client.writeContract({
      address: this.usdc, abi: usdcAbi, functionName: 'cancelAuthorization', args: [account.address, nonce, signature], gas: 200_000n,
    });
    const receipt = await this.client.waitForTransactionReceipt({ hash });
    if (receipt.status !== 'success') throw new Error('cancelAuthorization reverted');
  }

  /** The facilitator signer's transaction count: every settlement transaction raises it by one. */
  signerNonce(blockTag = 'latest') {
    return this.client.getTransactionCount({ address: this.signer, blockTag });
  }

  receipt(hash) {
    return this.client.getTransactionReceipt({ hash });
  }

  // ---- payments ----

  /** A valid payment on base-sepolia from `account` to a fresh payee (see buildPayment for overrides). */
  pay({ account, payTo = freshAccount().address, amount = 1000n, auth, network = NETWORK, chainId = CHAIN_ID, token = this.token }) {
    return buildPayment({ account, token, network, chainId, payTo: getAddress(payTo), amount, auth });
  }

  /** pay() with its body also in x402 v2's shapes (`v2`): one signed authorization, two wire formats. */
  async payV2(opts) {
    const p = await this.pay(opts);
    return { ...p, v2: toV2(p, opts?.chainId ?? CHAIN_ID) };
  }

  // ---- HTTP ----

  verify(body) {
    return this.post('/verify', body);
  }

  /**
   * POST /settle. `key` is sent as the `Idempotency-Key` header: the first settle of a payment
   * that carries it is the one a retry with the same key and the byte-identical body is answered
   * like (success included); any other settle of a claimed payment is told the transaction as a
   * failure (spec/access.md section 1). `headers` are added as they are (e.g. a malformed key).
   */
  settle(body, { key, headers = {} } = {}) {
    return this.post('/settle', body, { headers: key === undefined ? headers : { [IDEMPOTENCY_KEY]: key, ...headers } });
  }

  /**
   * GET /settlements/{network}/{asset}/{from}/{nonce} for payment `p` (as built by pay()); any
   * part can be overridden, e.g. to change its case or to make it malformed.
   */
  settlementStatus(p, { network = p.payload.network, asset = p.requirements.asset, from = p.authorization.from, nonce = p.authorization.nonce } = {}) {
    return this.request(`/settlements/${network}/${asset}/${from}/${nonce}`);
  }

  /** POST JSON (or a raw string) and return {status, body, text}; body is parsed JSON or undefined. */
  async post(path, body, { headers = {} } = {}) {
    const raw = typeof body === 'string' ? body : JSON.stringify(body);
    return this.request(path, { method: 'POST', body: raw, headers: { 'content-type': 'application/json', ...headers } });
  }

  async request(path, init = {}) {
    return readAnswer(await fetch(`${this.url}${path}`, init));
  }
}

/**
 * Wrap a test body so that a failure prints the tail of routerd's log: the daemon's side of the
 * story is usually what explains a wrong answer.
 */
export function withLogTail(getStack, fn) {
  return async (t) => {
    try {
      await fn(t);
    } catch (err) {
      const stack = getStack();
      const tail = stack?.routerd?.tail(60);
      if (tail) console.error(`--- routerd log tail (${t.name}) ---\n${tail}\n--- end ---`);
      throw err;
    }
  };
}
