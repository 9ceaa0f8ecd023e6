// Start the Solana test node (tests/svm-node/server.mjs: LiteSVM behind Solana JSON-RPC) on a free
// port, as anvil.mjs does for anvil; throwaway Solana keypairs; and the dev stack's Solana setup.
import { spawn } from 'node:child_process';
import { openSync, closeSync, writeFileSync, realpathSync } from 'node:fs';
import { generateKeyPairSync } from 'node:crypto';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { createKeyPairSignerFromBytes } from '@solana/kit';
import { freePort, waitFor, trackChild, exited, tailFile } from './util.mjs';

export const SERVER = fileURLToPath(new URL('../../svm-node/server.mjs', import.meta.url));
export {
  DEVNET_GENESIS_HASH, DEVNET_USDC_MINT, TOKEN_PROGRAM, TOKEN_2022_PROGRAM, MEMO_PROGRAM, associatedTokenAddress,
} from '../../svm-node/chain.mjs';
export const SOLANA_DEVNET_CAIP2 = 'solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1';

/** A JSON-RPC call; a JSON-RPC error is thrown with its code and data. */
export async function svmRpc(url, method, params = []) {
  const res = await fetch(url, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
  });
  const body = await res.json();
  if (body.error) throw Object.assign(new Error(`${method}: ${body.error.message}`), { code: body.error.code, data: body.error.data });
  return body.result;
}

/** A JSON-RPC batch: the raw answers array. */
export async function svmBatch(url, calls) {
  const res = await fetch(url, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify(calls.map(([method, params = []], i) => ({ jsonrpc: '2.0', id: i + 1, method, params }))),
  });
  return res.json();
}

/**
 * A throwaway ed25519 keypair: {address, secretKey (64 bytes, solana-keygen's layout: secret then
 * public), signer (a @solana/kit KeyPairSigner)}. Generated here, never a literal.
 */
export async function newSolanaKeypair() {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const secret = privateKey.export({ format: 'der', type: 'pkcs8' }).subarray(-32);
  const pub = publicKey.export({ format: 'der', type: 'spki' }).subarray(-32);
  const secretKey = new Uint8Array(Buffer.concat([secret, pub]));
  const signer = await createKeyPairSignerFromBytes(secretKey);
  return { address: signer.address, secretKey, signer };
}

/** Write a keypair as solana-keygen's JSON (an array of 64 numbers), mode 0600. */
export function writeKeypairFile(path, keypair) {
  writeFileSync(path, `${JSON.stringify([...keypair.secretKey])}\n`, { mode: 0o600 });
}

/**
 * Start the Solana test node and wait until it answers getHealth.
 * @param {object} [o]
 * @param {number} [o.slotMs=400]           slot time
 * @param {number} [o.blockhashExpiry=150]  blocks a blockhash stays valid
 * @param {number} [o.confirmedDepth=1]
 * @param {number} [o.finalizedDepth=32]
 * @param {string} [o.genesisHash]          default: devnet's (DEVNET_GENESIS_HASH)
 * @param {string} [o.logFile]              the node's stderr (what lands, what is dropped)
 */
export async function startSvmNode({ slotMs = 400, blockhashExpiry = 150, confirmedDepth = 1, finalizedDepth = 32, genesisHash, logFile } = {}) {
  const port = await freePort();
  const args = [SERVER, '--port', String(port), '--slot-ms', String(slotMs), '--blockhash-expiry', String(blockhashExpiry),
    '--confirmed-depth', String(confirmedDepth), '--finalized-depth', String(finalizedDepth)];
  if (genesisHash) args.push('--genesis-hash', genesisHash);
  const out = logFile ? openSync(logFile, 'a') : 'ignore';
  const child = trackChild(spawn(process.execPath, args, { stdio: ['ignore', 'ignore', out] }));
  if (logFile) closeSync(out);

  const url = `http://127.0.0.1:${port}`;
  const early = exited(child).then(({ code, signal }) => {
    throw new Error(`svm node exited early (code ${code}, signal ${signal})\n${logFile ? tailFile(logFile, 20) : ''}`);
  });
  await Promise.race([waitFor(async () => (await svmRpc(url, 'getHealth')) === 'ok', { what: `svm node on ${url}` }), early]);
  early.catch(() => {});
  const rpc = (method, params) => svmRpc(url, method, params);
  const status = await rpc('litesvm_status');

  return {
    url, port, child, genesisHash: status.genesisHash, caip2: `solana:${status.genesisHash.slice(0, 32)}`,
    rpc,
    batch: (calls) => svmBatch(url, calls),
    status: () => rpc('litesvm_status'),
    airdrop: (address, lamports = 10_000_000_000) => rpc('requestAirdrop', [address, lamports]),
    /** {mint, tokenProgram, decimals}; tokenProgram 'token' (default) or 'token-2022'. */
    createMint: ({ decimals = 6, tokenProgram = 'token', address, mintAuthority } = {}) => rpc('litesvm_createMint', [{ decimals, tokenProgram, address, mintAuthority }]),
    createTokenAccount: (mint, owner) => rpc('litesvm_createTokenAccount', [{ mint, owner }]),
    mintTo: (mint, owner, amount) => rpc('litesvm_mintTo', [{ mint, owner, amount: String(amount) }]),
    async tokenBalance(tokenAccount) {
      return BigInt((await rpc('getTokenAccountBalance', [tokenAccount])).value.amount);
    },
    async balance(address) {
      return BigInt((await rpc('getBalance', [address])).value);
    },
    pause: () => rpc('litesvm_pause'),
    resume: () => rpc('litesvm_resume'),
    advanceSlots: (n = 1) => rpc('litesvm_advanceSlots', [n]),
    setSlotInterval: (ms) => rpc('litesvm_setSlotInterval', [ms]),
    dropPending: () => rpc('litesvm_dropPending'),
    /** Resolves once the status of `signature` reaches `commitment` ('processed' | 'confirmed' | 'finalized'). */
    async waitForStatus(signature, commitment = 'confirmed', { timeoutMs = 10_000 } = {}) {
      const rank = { processed: 0, confirmed: 1, finalized: 2 };
      return waitFor(async () => {
        const { value: [s] } = await rpc('getSignatureStatuses', [[signature]]);
        return s && rank[s.confirmationStatus] >= rank[commitment] ? s : null;
      }, { timeoutMs, what: `${signature} ${commitment}` });
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited(child);
      clearTimeout(timer);
    },
  };
}

// CLI for scripts/dev-stack, against a running node:
//   node tests/e2e/lib/svm.mjs --rpc URL --dir DIR [--usdc 1000000000]
// makes throwaway keypairs (written to DIR as solana-keygen JSON: svm-payer.json, svm-payee.json,
// svm-fee-payer.json), airdrops SOL to the payer and the fee payer, places a 6-decimal SPL Token
// mint at devnet's USDC address (what routerd's solana-devnet preset names), gives the payee its
// token account and the payer `--usdc` atomic units. Prints {mint, payer, payee, feePayer, ...} as JSON.
if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  const { values } = parseArgs({ options: { rpc: { type: 'string' }, dir: { type: 'string' }, usdc: { type: 'string', default: '1000000000' } } });
  if (!values.rpc || !values.dir) {
    console.error('usage: node tests/e2e/lib/svm.mjs --rpc URL --dir DIR [--usdc ATOMIC]');
    process.exit(2);
  }
  const rpc = (method, params) => svmRpc(values.rpc, method, params);
  const { DEVNET_USDC_MINT: mintAddress } = await import('../../svm-node/chain.mjs');
  const [payer, payee, feePayer] = [await newSolanaKeypair(), await newSolanaKeypair(), await newSolanaKeypair()];
  const files = {};
  for (const [name, kp] of Object.entries({ 'svm-payer': payer, 'svm-payee': payee, 'svm-fee-payer': feePayer })) {
    files[name] = join(values.dir, `${name}.json`);
    writeKeypairFile(files[name], kp);
  }
  await rpc('requestAirdrop', [payer.address, 10_000_000_000]);
  await rpc('requestAirdrop', [feePayer.address, 10_000_000_000]);
  const { mint } = await rpc('litesvm_createMint', [{ decimals: 6, tokenProgram: 'token', address: mintAddress }]);
  const payeeAccount = await rpc('litesvm_createTokenAccount', [{ mint, owner: payee.address }]);
  const payerAccount = await rpc('litesvm_mintTo', [{ mint, owner: payer.address, amount: values.usdc }]);
  const genesisHash = await rpc('getGenesisHash');
  console.log(JSON.stringify({
    rpc: values.rpc, genesisHash, caip2: `solana:${genesisHash.slice(0, 32)}`, mint, decimals: 6,
    payer: payer.address, payerTokenAccount: payerAccount.tokenAccount, payerKeyFile: files['svm-payer'],
    payee: payee.address, payeeTokenAccount: payeeAccount.tokenAccount, payeeKeyFile: files['svm-payee'],
    feePayer: feePayer.address, feePayerKeyFile: files['svm-fee-payer'],
  }, null, 2));
}

/**
 * routerd's configuration for a Solana facilitator on the test node: a listener on `port`, the
 * store at `storePath`, `solana-devnet` at `rpcUrl`, x402 v1 and v2, and the fee payer's key file.
 * `chain` adds tables after `[chains.solana-devnet]` (its tokens), `facilitator` keys to
 * `[facilitator]`, and `extra` whole sections at the end.
 */
export function svmFacilitatorConfig({ port, storePath, rpcUrl, feePayerFile, chain = '', facilitator = '', extra = '' }) {
  return `[server]\nlisten = "127.0.0.1:${port}"\n[storage]\npath = "${storePath}"\n`
    + `[chains.solana-devnet]\nrpc_urls = ["${rpcUrl}"]\n${chain}`
    + `[facilitator]\nnetworks = ["solana-devnet"]\nx402_versions = [1, 2]\nallow_http_resource = true\n`
    + `${facilitator}svm_fee_payer_key_file = "${feePayerFile}"\n${extra}`;
}

/**
 * A fee payer for routerd: a throwaway keypair written to `dir`/fee-payer.json, given `lamports`
 * on `node` (none with 0). Answers {feePayer, feePayerFile}.
 */
export async function newFeePayer(node, dir, lamports = 5_000_000_000) {
  const feePayer = await newSolanaKeypair();
  const feePayerFile = join(dir, 'fee-payer.json');
  writeKeypairFile(feePayerFile, feePayer);
  if (lamports > 0) await node.airdrop(feePayer.address, lamports);
  return { feePayer, feePayerFile };
}

/**
 * node:test's `test` with a minute's timeout, whose failures carry the tail of routerd's log in
 * `dir` (and the Solana test node's with `nodeLog`); `first` runs before each test.
 */
export function testWithLogs(test, dir, { nodeLog = false, first = async () => {} } = {}) {
  return (name, fn) => test(name, { timeout: 60_000 }, async () => {
    try {
      await first();
      await fn();
    } catch (err) {
      err.message += `\n--- routerd log ---\n${tailFile(join(dir(), 'routerd.log'), 30)}`
        + (nodeLog ? `\n--- svm node log ---\n${tailFile(join(dir(), 'svm-node.log'), 15)}` : '');
      throw err;
    }
  });
}

/** POST `body` as JSON to `base` + `path`: {status, body}. */
export async function postTo(base, path, body) {
  const res = await fetch(`${base}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}
