// Payments through Uniswap's Permit2, as x402 v2 clients make them for any ERC-20, on an anvil chain:
//  - Permit2 at its canonical address, with the code OP Stack chains preinstall (the pinned
//    @eth-optimism/contracts-bedrock), its cached chain id and domain separator set for the chain;
//  - the x402 Permit2 proxies of the `exact` and `upto` schemes (contracts/test/X402Permit2Proxies.sol),
//    the spenders the official clients sign for, at the addresses @x402/evm names;
//  - a plain ERC-20 with EIP-2612 but no ERC-3009 (contracts/test/TestToken.sol), which such
//    clients can pay with only through Permit2.
// The contracts are compiled with the pinned npm `solc` (contracts/package.json, installed by
// scripts/install-solc). Shared by the end-to-end tests and scripts/dev-stack (CLI: see main()).
import { createRequire } from 'node:module';
import { parseArgs } from 'node:util';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, realpathSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import {
  concat, encodeAbiParameters, encodeDeployData, getContractAddress, keccak256, size, slice, toHex,
} from 'viem';
import {
  PERMIT2_ADDRESS, x402ExactPermit2ProxyAddress, x402UptoPermit2ProxyAddress,
} from '@x402/evm';
import { privateKeyToAccount } from 'viem/accounts';
import { createPermit2ApprovalTx } from '@x402/evm/exact/client';
import { anvilKey, ROLE } from './accounts.mjs';
import { walletFor } from './deploy-usdc.mjs';

const repo = join(dirname(fileURLToPath(import.meta.url)), '../../..');
const contracts = join(repo, 'contracts');
const fromContracts = createRequire(join(contracts, 'package.json'));
const fromTests = createRequire(import.meta.url);

export const PERMIT2 = PERMIT2_ADDRESS;
export const EXACT_PROXY = x402ExactPermit2ProxyAddress;
export const UPTO_PROXY = x402UptoPermit2ProxyAddress;

/** The test token's EIP-712 domain name and version, as x402 requirements' `extra` gives them. */
export const TEST_TOKEN_EIP712 = Object.freeze({ name: 'Test Token', version: '1' });

const PROXIES_SOURCE = 'test/X402Permit2Proxies.sol';
const TOKEN_SOURCE = 'test/TestToken.sol';

// Explicit gas limits, as in deploy-usdc.mjs: nothing here needs an estimate to go through.
const DEPLOY_GAS = 3_000_000n;
const CALL_GAS = 100_000n;

/** Reads an import of our sources: `@openzeppelin/...` from the pinned package. */
function findImport(path) {
  const file = path.startsWith('@openzeppelin/contracts/')
    ? fromContracts.resolve(path)
    : join(contracts, path);
  return existsSync(file) ? { contents: readFileSync(file, 'utf8') } : { error: `not found: ${path}` };
}

/**
 * The proxies and the token as compiled: {exactProxy, uptoProxy} each {abi, runtime} (placed, not
 * deployed), and {token: {abi, bytecode}}. Kept in ~/.cache/routerd/compiled, keyed by the sources
 * and the pinned packages, since compiling takes a while.
 */
export function compileX402Contracts() {
  const sources = Object.fromEntries(
    [PROXIES_SOURCE, TOKEN_SOURCE].map((file) => [file, { content: readFileSync(join(contracts, file), 'utf8') }]),
  );
  const lock = readFileSync(join(contracts, 'package-lock.json'), 'utf8');
  const key = createHash('sha256').update(JSON.stringify(sources)).update(lock).digest('hex').slice(0, 16);
  const dir = join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'routerd', 'compiled');
  const cached = join(dir, `x402-permit2-${key}.json`);
  if (existsSync(cached)) return JSON.parse(readFileSync(cached, 'utf8'));

  const solc = fromContracts('solc');
  const input = {
    language: 'Solidity',
    sources,
    settings: {
      // No PUSH0 nor MCOPY, so that the code runs on the older-hardfork test chains too (berlin, for
      // legacy fees): why @openzeppelin/contracts is pinned to 5.4.0, the last that builds for paris.
      evmVersion: 'paris',
      optimizer: { enabled: true, runs: 200 },
      outputSelection: { '*': { '*': ['abi', 'evm.bytecode.object', 'evm.deployedBytecode.object'] } },
    },
  };
  const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImport }));
  const errors = (output.errors ?? []).filter((e) => e.severity === 'error');
  if (errors.length) throw new Error(errors.map((e) => e.formattedMessage).join('\n'));
  const contract = (file, name) => output.contracts[file][name];
  const placed = (name) => {
    const c = contract(PROXIES_SOURCE, name);
    return { abi: c.abi, runtime: `0x${c.evm.deployedBytecode.object}` };
  };
  const token = contract(TOKEN_SOURCE, 'TestToken');
  const compiled = {
    exactProxy: placed('x402ExactPermit2Proxy'),
    uptoProxy: placed('x402UptoPermit2Proxy'),
    token: { abi: token.abi, bytecode: `0x${token.evm.bytecode.object}` },
  };
  mkdirSync(dir, { recursive: true });
  writeFileSync(cached, JSON.stringify(compiled));
  return compiled;
}

/** Permit2's EIP-712 domain separator on chain `chainId`: what its DOMAIN_SEPARATOR() must return. */
export function permit2DomainSeparator(chainId) {
  const typeHash = keccak256(toHex('EIP712Domain(string name,uint256 chainId,address verifyingContract)'));
  return keccak256(encodeAbiParameters(
    [{ type: 'bytes32' }, { type: 'bytes32' }, { type: 'uint256' }, { type: 'address' }],
    [typeHash, keccak256(toHex('Permit2')), BigInt(chainId), PERMIT2],
  ));
}

// Where Permit2's immutables _CACHED_CHAIN_ID and _CACHED_DOMAIN_SEPARATOR sit in its runtime
// code (byte offsets of 32-byte words), as contracts-bedrock's getPermit2Code(chainId) writes them.
const CACHED_CHAIN_ID_AT = 6945;
const CACHED_DOMAIN_SEPARATOR_AT = 6983;

/**
 * Permit2's runtime code for chain `chainId`: contracts-bedrock's template (Ethereum mainnet's
 * deployment) with the cached chain id and domain separator replaced, as its getPermit2Code does.
 * Permit2 returns the cached separator whenever the chain id is the cached one, so both must agree.
 */
export function permit2Code(chainId) {
  const file = fromTests.resolve('@eth-optimism/contracts-bedrock/src/libraries/Preinstalls.sol');
  const match = readFileSync(file, 'utf8').match(/bytes internal constant Permit2TemplateCode =\s*hex"([0-9a-fA-F]+)"/);
  if (!match) throw new Error('no Permit2TemplateCode in contracts-bedrock Preinstalls.sol');
  const template = `0x${match[1]}`;
  // The words replaced must be mainnet's: otherwise the template changed and the offsets are stale.
  const word = (at) => slice(template, at, at + 32);
  if (BigInt(word(CACHED_CHAIN_ID_AT)) !== 1n || word(CACHED_DOMAIN_SEPARATOR_AT) !== permit2DomainSeparator(1)) {
    throw new Error("contracts-bedrock's Permit2 template does not hold mainnet's immutables where expected");
  }
  const put = (code, at, value) => concat([slice(code, 0, at), value, slice(code, at + 32, size(code))]);
  const withChainId = put(template, CACHED_CHAIN_ID_AT, toHex(BigInt(chainId), { size: 32 }));
  return put(withChainId, CACHED_DOMAIN_SEPARATOR_AT, permit2DomainSeparator(chainId));
}

/**
 * Places Permit2 and both x402 proxies at their canonical addresses on the anvil chain of `client`
 * (a wallet client with public actions, as walletFor makes): {permit2, exactProxy, uptoProxy}.
 */
export async function placePermit2(client) {
  const { exactProxy, uptoProxy } = compileX402Contracts();
  const setCode = (address, code) => client.request({ method: 'anvil_setCode', params: [address, code] });
  await setCode(PERMIT2, permit2Code(await client.getChainId()));
  await setCode(EXACT_PROXY, exactProxy.runtime);
  await setCode(UPTO_PROXY, uptoProxy.runtime);
  return { permit2: PERMIT2, exactProxy: EXACT_PROXY, uptoProxy: UPTO_PROXY };
}

/** Deploys the test token from `client`'s account: its address. */
export async function deployTestToken(client) {
  const { token } = compileX402Contracts();
  const nonce = await client.getTransactionCount({ address: client.account.address, blockTag: 'pending' });
  const hash = await client.sendTransaction({
    data: encodeDeployData({ abi: token.abi, bytecode: token.bytecode }), gas: DEPLOY_GAS, nonce,
  });
  await confirm(client, hash, 'deploying the test token');
  return getContractAddress({ from: client.account.address, nonce: BigInt(nonce) });
}

/** Mints `amount` atomic units of the test token to `to` (anyone may) and waits for it. */
export async function mintTestToken(client, token, to, amount) {
  const { abi } = compileX402Contracts().token;
  const hash = await client.writeContract({
    address: token, abi, functionName: 'mint', args: [to, BigInt(amount)], gas: CALL_GAS,
  });
  await confirm(client, hash, 'minting the test token');
}

/**
 * `account` (a viem local account, with ETH for the gas) approves Permit2 for the most it can on
 * `token`, with the transaction @x402/evm's client asks a payer to send; sent through `client`.
 */
export async function approvePermit2(account, client, token) {
  const hash = await client.sendTransaction({ account, ...createPermit2ApprovalTx(token), gas: CALL_GAS });
  await confirm(client, hash, 'approving Permit2');
}

async function confirm(client, hash, what) {
  const receipt = await client.waitForTransactionReceipt({ hash, pollingInterval: 50, timeout: 60_000 });
  if (receipt.status !== 'success') throw new Error(`${what} reverted (${hash})`);
}

/**
 * CLI: node tests/e2e/lib/permit2.mjs --rpc URL [--fund ADDR=ATOMIC]... [--approve-key KEY]...
 * places Permit2 and the proxies on that anvil chain, deploys the test token, mints to each ADDR,
 * has each KEY's account (which pays the gas) approve Permit2 on it, and prints
 * {"token", "permit2", "exactProxy", "uptoProxy"}.
 */
async function main() {
  const { values } = parseArgs({
    options: {
      rpc: { type: 'string' },
      fund: { type: 'string', multiple: true, default: [] },
      'approve-key': { type: 'string', multiple: true, default: [] },
    },
  });
  if (!values.rpc) throw new Error('usage: permit2.mjs --rpc URL [--fund ADDR=ATOMIC]... [--approve-key KEY]...');
  const client = await walletFor(values.rpc, anvilKey(ROLE.deployer));
  const placed = await placePermit2(client);
  const token = await deployTestToken(client);
  for (const spec of values.fund) {
    const [address, amount] = spec.split('=');
    await mintTestToken(client, token, address, BigInt(amount));
  }
  for (const key of values['approve-key']) {
    await approvePermit2(privateKeyToAccount(key), client, token);
  }
  console.log(JSON.stringify({ token, ...placed }));
}

if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  main().catch((err) => {
    console.error(`permit2: ${err.message}`);
    process.exit(1);
  });
}
