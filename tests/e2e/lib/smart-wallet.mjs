// Smart wallets not yet deployed (ERC-6492), on an anvil chain:
//  - Solady's ERC-4337 account and its factory, compiled from the pinned npm `solady` with the
//    pinned npm `solc` (contracts/package.json, installed by scripts/install-solc); the factory
//    is placed at the address viem's `toSoladySmartAccount` uses, so the official clients, given
//    that viem account, sign ERC-6492 wrapped signatures naming it;
//  - Multicall3, which a settlement that deploys the wallet goes through, at its canonical
//    address, with the code OP Stack chains preinstall (the pinned @eth-optimism/contracts-bedrock).
// Shared by the end-to-end tests and scripts/dev-stack (CLI: see main()).
import { createRequire } from 'node:module';
import { parseArgs } from 'node:util';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, realpathSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { encodeDeployData, getContractAddress } from 'viem';
import { toSoladySmartAccount } from 'viem/account-abstraction';
import { privateKeyToAccount } from 'viem/accounts';
import { anvilKey, ROLE } from './accounts.mjs';
import { walletFor, mintUsdc } from './deploy-usdc.mjs';

const repo = join(dirname(fileURLToPath(import.meta.url)), '../../..');
const contracts = join(repo, 'contracts');
const fromContracts = createRequire(join(contracts, 'package.json'));
const fromTests = createRequire(import.meta.url);

/** Where viem's toSoladySmartAccount looks for the factory. */
export const SOLADY_FACTORY = '0x5d82735936c6Cd5DE57cC3c1A799f6B2E6F933Df';
/** Multicall3's canonical address. */
export const MULTICALL3 = '0xcA11bde05977b3631167028862bE2a173976CA11';

const WALLET_SOURCE = 'test/SmartWallet.sol';

/** Reads an import of the wallet source: `solady/...` from the pinned package. */
function findImport(path) {
  const file = path.startsWith('solady/')
    ? join(dirname(fromContracts.resolve('solady/package.json')), 'src', path.slice('solady/'.length))
    : join(contracts, path);
  return existsSync(file) ? { contents: readFileSync(file, 'utf8') } : { error: `not found: ${path}` };
}

/**
 * The wallet and its factory as compiled: {wallet, factory}, each {abi, bytecode}. Compiling takes
 * a while, so the output is kept in ~/.cache/routerd/compiled, keyed by the source and the pinned
 * packages.
 */
export function compileSmartWallet() {
  const source = readFileSync(join(contracts, WALLET_SOURCE), 'utf8');
  const lock = readFileSync(join(contracts, 'package-lock.json'), 'utf8');
  const key = createHash('sha256').update(source).update(lock).digest('hex').slice(0, 16);
  const dir = join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'routerd', 'compiled');
  const cached = join(dir, `smart-wallet-${key}.json`);
  if (existsSync(cached)) return JSON.parse(readFileSync(cached, 'utf8'));

  const solc = fromContracts('solc');
  const input = {
    language: 'Solidity',
    sources: { [WALLET_SOURCE]: { content: source } },
    settings: {
      evmVersion: 'paris',
      optimizer: { enabled: true, runs: 200 },
      outputSelection: { '*': { '*': ['abi', 'evm.bytecode.object'] } },
    },
  };
  const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImport }));
  const errors = (output.errors ?? []).filter((e) => e.severity === 'error');
  if (errors.length) throw new Error(errors.map((e) => e.formattedMessage).join('\n'));
  const pick = (file, name) => {
    const c = output.contracts[file][name];
    return { abi: c.abi, bytecode: `0x${c.evm.bytecode.object}` };
  };
  const compiled = {
    wallet: pick(WALLET_SOURCE, 'SmartWallet'),
    factory: pick('solady/accounts/ERC4337Factory.sol', 'ERC4337Factory'),
  };
  mkdirSync(dir, { recursive: true });
  writeFileSync(cached, JSON.stringify(compiled));
  return compiled;
}

/** Multicall3's runtime code, as OP Stack chains preinstall it. */
export function multicall3Code() {
  const file = fromTests.resolve('@eth-optimism/contracts-bedrock/src/libraries/Preinstalls.sol');
  const match = readFileSync(file, 'utf8').match(/bytes internal constant MultiCall3Code =\s*hex"([0-9a-fA-F]+)"/);
  if (!match) throw new Error('no MultiCall3Code in contracts-bedrock Preinstalls.sol');
  return `0x${match[1]}`;
}

/**
 * Deploys the wallet implementation and a factory for it from `client` (a wallet client with
 * public actions, on an anvil chain that mines), then places the factory's code at
 * SOLADY_FACTORY and Multicall3's at MULTICALL3. The factory keeps the implementation's address
 * in its code, so it works where it is placed.
 */
export async function placeSmartWalletFactory(client) {
  const { wallet, factory } = compileSmartWallet();
  const me = client.account.address;
  const deploy = async (artifact, args = []) => {
    const nonce = await client.getTransactionCount({ address: me, blockTag: 'pending' });
    const address = getContractAddress({ from: me, nonce: BigInt(nonce) });
    const hash = await client.sendTransaction({
      data: encodeDeployData({ abi: artifact.abi, bytecode: artifact.bytecode, args }), gas: 8_000_000n, nonce,
    });
    const receipt = await client.waitForTransactionReceipt({ hash });
    if (receipt.status !== 'success') throw new Error('deploying the smart wallet failed');
    return address;
  };
  const implementation = await deploy(wallet);
  const built = await deploy(factory, [implementation]);
  const setCode = (address, code) => client.request({ method: 'anvil_setCode', params: [address, code] });
  await setCode(SOLADY_FACTORY, await client.getCode({ address: built }));
  await setCode(MULTICALL3, multicall3Code());
  return { implementation };
}

/**
 * The Solady smart account of `owner` (a viem local account), not deployed until it pays;
 * `factoryAddress` another factory of the same wallet (default SOLADY_FACTORY). The salt starts
 * with the owner, as Solady's factory allows: one wallet per owner, which only that owner's
 * wallet can be deployed at.
 */
export function smartAccountFor(client, owner, { factoryAddress = SOLADY_FACTORY } = {}) {
  const salt = `${owner.address}${'0'.repeat(24)}`;
  return toSoladySmartAccount({ client, owner, factoryAddress, salt });
}

/**
 * CLI: node tests/e2e/lib/smart-wallet.mjs --rpc URL --usdc ADDR --owner-key KEY [--fund ATOMIC]
 * places the factory and Multicall3 on that anvil chain, mints USDC (the deployer is its minter)
 * to KEY's smart wallet, not deployed, and prints {"factory", "wallet"}.
 */
async function main() {
  const { values } = parseArgs({
    options: {
      rpc: { type: 'string' },
      usdc: { type: 'string' },
      'owner-key': { type: 'string' },
      fund: { type: 'string', default: '0' },
    },
  });
  if (!values.rpc || !values.usdc || !values['owner-key']) {
    throw new Error('usage: smart-wallet.mjs --rpc URL --usdc ADDR --owner-key KEY [--fund ATOMIC]');
  }
  const client = await walletFor(values.rpc, anvilKey(ROLE.deployer));
  await placeSmartWalletFactory(client);
  const wallet = await smartAccountFor(client, privateKeyToAccount(values['owner-key']));
  if (BigInt(values.fund) > 0n) await mintUsdc(client, values.usdc, wallet.address, BigInt(values.fund));
  console.log(JSON.stringify({ factory: SOLADY_FACTORY, wallet: wallet.address }));
}

if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  main().catch((err) => {
    console.error(`smart-wallet: ${err.message}`);
    process.exit(1);
  });
}
