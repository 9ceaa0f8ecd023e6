// The on-chain side of the x402 `batch-settlement` scheme on an anvil chain: routerd's own escrow
// contract and its two deposit collectors (contracts/test/batch/, written from the scheme's EVM
// binding with the ABI and EIP-712 types @x402/evm 2.27.0 uses), placed at the canonical addresses
// the official client, server and facilitator name, plus Multicall3, through which @x402/evm reads a
// channel. Compiled with the pinned npm `solc` (contracts/package.json, installed by
// scripts/install-solc) for cancun: the escrow's reentrancy guard is transient storage, so the
// chain must run cancun or later (anvil's default; not the `berlin` chains of the router tests).
// Also: reading a channel's state, computing a channel id and signing vouchers, claim batches and
// refunds as @x402/evm does. Shared by the end-to-end tests and scripts (CLI: see main()).
import { createRequire } from 'node:module';
import { parseArgs } from 'node:util';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { getAddress } from 'viem';
import {
  BATCH_SETTLEMENT_ADDRESS, BATCH_SETTLEMENT_DOMAIN, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, claimBatchTypes, refundTypes,
} from '@x402/evm';
import { computeChannelId, signVoucher } from '@x402/evm/batch-settlement/client';
import { anvilKey, ROLE } from './accounts.mjs';
import { walletFor } from './deploy-usdc.mjs';
import { MULTICALL3, multicall3Code } from './smart-wallet.mjs';

const repo = join(dirname(fileURLToPath(import.meta.url)), '../../..');
const contracts = join(repo, 'contracts');
const fromContracts = createRequire(join(contracts, 'package.json'));

export const BATCH_SETTLEMENT = getAddress(BATCH_SETTLEMENT_ADDRESS);
export const ERC3009_COLLECTOR = getAddress(ERC3009_DEPOSIT_COLLECTOR_ADDRESS);
// @x402/evm's root exports no constant for it; its batch-settlement code names this address.
export const PERMIT2_COLLECTOR = getAddress('0x4020425FAf3B746C082C2f942b4E5159887B0005');

/** The withdraw delay bounds, in seconds, the contract enforces at deposit. */
export const MIN_WITHDRAW_DELAY = 900;
export const MAX_WITHDRAW_DELAY = 30 * 24 * 3600;

export { computeChannelId, signVoucher };

const SOURCES = ['test/batch/BatchSettlement.sol', 'test/batch/DepositCollectors.sol'];

/** Reads an import of our sources: `@openzeppelin/...` from the pinned package. */
function findImport(path) {
  const file = path.startsWith('@openzeppelin/contracts/') ? fromContracts.resolve(path) : join(contracts, path);
  return existsSync(file) ? { contents: readFileSync(file, 'utf8') } : { error: `not found: ${path}` };
}

/**
 * The three contracts as compiled: {settlement, erc3009Collector, permit2Collector}, each
 * {abi, runtime} (runtime code, placed rather than deployed). Kept in ~/.cache/routerd/compiled,
 * keyed by the sources and the pinned packages, since compiling takes a while.
 */
export function compileBatchSettlement() {
  const sources = Object.fromEntries(
    SOURCES.map((file) => [file, { content: readFileSync(join(contracts, file), 'utf8') }]),
  );
  const lock = readFileSync(join(contracts, 'package-lock.json'), 'utf8');
  const key = createHash('sha256').update(JSON.stringify(sources)).update(lock).digest('hex').slice(0, 16);
  const dir = join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'routerd', 'compiled');
  const cached = join(dir, `batch-settlement-${key}.json`);
  if (existsSync(cached)) return JSON.parse(readFileSync(cached, 'utf8'));

  const solc = fromContracts('solc');
  const input = {
    language: 'Solidity',
    sources,
    settings: {
      // cancun for the transient-storage reentrancy guard (as the scheme's deployed contract uses):
      // a storage guard would cost every claim and sweep more gas than the real contract does.
      evmVersion: 'cancun',
      optimizer: { enabled: true, runs: 200 },
      outputSelection: { '*': { '*': ['abi', 'evm.deployedBytecode.object'] } },
    },
  };
  const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImport }));
  const errors = (output.errors ?? []).filter((e) => e.severity === 'error');
  if (errors.length) throw new Error(errors.map((e) => e.formattedMessage).join('\n'));
  const placed = (file, name) => {
    const c = output.contracts[file][name];
    return { abi: c.abi, runtime: `0x${c.evm.deployedBytecode.object}` };
  };
  const compiled = {
    settlement: placed(SOURCES[0], 'x402BatchSettlement'),
    erc3009Collector: placed(SOURCES[1], 'ERC3009DepositCollector'),
    permit2Collector: placed(SOURCES[1], 'Permit2DepositCollector'),
  };
  mkdirSync(dir, { recursive: true });
  writeFileSync(cached, JSON.stringify(compiled));
  return compiled;
}

/** The escrow's ABI, as compiled. */
export const batchSettlementAbi = () => compileBatchSettlement().settlement.abi;

/**
 * The batch-settlement ABI @x402/evm 2.27.0 calls (its `batchSettlementABI`), which the package
 * does not export: read from the bundled module that defines it.
 */
export async function officialBatchSettlementAbi() {
  const dist = dirname(fileURLToPath(import.meta.resolve('@x402/evm')));
  const file = readdirSync(dist)
    .filter((name) => name.endsWith('.mjs'))
    .find((name) => readFileSync(join(dist, name), 'utf8').includes('// src/batch-settlement/abi.ts'));
  if (!file) throw new Error(`no batch-settlement ABI module in ${dist}`);
  const { batchSettlementABI } = await import(pathToFileURL(join(dist, file)).href);
  if (!Array.isArray(batchSettlementABI)) throw new Error(`${file} exports no batchSettlementABI`);
  return batchSettlementABI;
}

/**
 * Places the escrow and both collectors at their canonical addresses, and Multicall3 at its own
 * when nothing is there yet, on the anvil chain of `target`: an RPC URL or a viem client. A Permit2
 * deposit also needs Permit2 itself (permit2.mjs's placePermit2).
 * Returns {settlement, erc3009Collector, permit2Collector, multicall3}.
 */
export async function placeBatchSettlement(target) {
  const request = typeof target === 'string' ? rpcAt(target) : (args) => target.request(args);
  const { settlement, erc3009Collector, permit2Collector } = compileBatchSettlement();
  const setCode = (address, code) => request({ method: 'anvil_setCode', params: [address, code] });
  await setCode(BATCH_SETTLEMENT, settlement.runtime);
  await setCode(ERC3009_COLLECTOR, erc3009Collector.runtime);
  await setCode(PERMIT2_COLLECTOR, permit2Collector.runtime);
  const existing = await request({ method: 'eth_getCode', params: [MULTICALL3, 'latest'] });
  if (!existing || existing === '0x') await setCode(MULTICALL3, multicall3Code());
  return {
    settlement: BATCH_SETTLEMENT, erc3009Collector: ERC3009_COLLECTOR, permit2Collector: PERMIT2_COLLECTOR,
    multicall3: MULTICALL3,
  };
}

function rpcAt(url) {
  return async ({ method, params }) => {
    const res = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
    });
    const body = await res.json();
    if (body.error) throw new Error(`${method}: ${body.error.message}`);
    return body.result;
  };
}

/**
 * A channel's on-chain state, as the binding's channel snapshot names it:
 * {balance, totalClaimed, withdrawRequestedAt, withdrawAmount, refundNonce} (bigints but
 * withdrawRequestedAt, a number of seconds, 0 when no withdrawal is pending).
 */
export async function readChannel(client, channelId) {
  const abi = batchSettlementAbi();
  const read = (functionName) => client.readContract({ address: BATCH_SETTLEMENT, abi, functionName, args: [channelId] });
  const [[balance, totalClaimed], [withdrawAmount, initiatedAt], refundNonce] = await Promise.all([
    read('channels'), read('pendingWithdrawals'), read('refundNonce'),
  ]);
  return { balance, totalClaimed, withdrawRequestedAt: Number(initiatedAt), withdrawAmount, refundNonce };
}

/** A receiver's totals in `token`: {totalClaimed, totalSettled}; a sweep sends the difference. */
export async function readReceiver(client, receiver, token) {
  const [totalClaimed, totalSettled] = await client.readContract({
    address: BATCH_SETTLEMENT, abi: batchSettlementAbi(), functionName: 'receivers', args: [receiver, token],
  });
  return { totalClaimed, totalSettled };
}

/** The escrow's EIP-712 domain on chain `chainId`. */
export function batchSettlementDomain(chainId) {
  return { ...BATCH_SETTLEMENT_DOMAIN, chainId, verifyingContract: BATCH_SETTLEMENT };
}

/**
 * A channel config with the binding's field order; `withdrawDelay` defaults to the minimum and
 * `salt` to zero, as @x402/evm's client does.
 */
export function channelConfig({
  payer, payerAuthorizer = payer, receiver, receiverAuthorizer, token, withdrawDelay = MIN_WITHDRAW_DELAY,
  salt = `0x${'00'.repeat(32)}`,
}) {
  return {
    payer: getAddress(payer), payerAuthorizer: getAddress(payerAuthorizer), receiver: getAddress(receiver),
    receiverAuthorizer: getAddress(receiverAuthorizer), token: getAddress(token), withdrawDelay, salt,
  };
}

/**
 * The receiver authorizer's ClaimBatch signature over `claims` (rows as the `claim` payload carries
 * them: {voucher: {channel, maxClaimableAmount}, signature, totalClaimed}), as @x402/evm signs it.
 */
export function signClaimBatch(account, chainId, claims) {
  return account.signTypedData({
    domain: batchSettlementDomain(chainId),
    types: claimBatchTypes,
    primaryType: 'ClaimBatch',
    message: {
      claims: claims.map((row) => ({
        channelId: computeChannelId(row.voucher.channel, chainId),
        maxClaimableAmount: BigInt(row.voucher.maxClaimableAmount),
        totalClaimed: BigInt(row.totalClaimed),
      })),
    },
  });
}

/** The receiver authorizer's Refund signature, as @x402/evm signs it. */
export function signRefund(account, chainId, channelId, nonce, amount) {
  return account.signTypedData({
    domain: batchSettlementDomain(chainId),
    types: refundTypes,
    primaryType: 'Refund',
    message: { channelId, nonce: BigInt(nonce), amount: BigInt(amount) },
  });
}

/** Claim rows as the contract takes them (amounts as bigints), from the `claim` payload's rows. */
export function claimArgs(claims) {
  return claims.map((row) => ({
    voucher: { channel: row.voucher.channel, maxClaimableAmount: BigInt(row.voucher.maxClaimableAmount) },
    signature: row.signature,
    totalClaimed: BigInt(row.totalClaimed),
  }));
}

/**
 * CLI: node tests/e2e/lib/batch-settlement.mjs --rpc URL places the three contracts (and Multicall3)
 * on that anvil chain and prints {"settlement", "erc3009Collector", "permit2Collector", "multicall3"}.
 */
async function main() {
  const { values } = parseArgs({ options: { rpc: { type: 'string' } } });
  if (!values.rpc) throw new Error('usage: batch-settlement.mjs --rpc URL');
  const client = await walletFor(values.rpc, anvilKey(ROLE.deployer));
  console.log(JSON.stringify(await placeBatchSettlement(client)));
}

if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  main().catch((err) => {
    console.error(`batch-settlement: ${err.message}`);
    process.exit(1);
  });
}
