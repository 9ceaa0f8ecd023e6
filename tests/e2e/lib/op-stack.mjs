// Turn an anvil started with `--network optimism` into an OP-stack chain whose GasPriceOracle
// prices the L1 data fee, the way a real OP-stack L2 does:
//  - the predeploys' runtime code comes from the pinned npm @eth-optimism/contracts-bedrock forge
//    artifacts (GasPriceOracle 1.3.0, L1Block 1.4.1-beta.1) and is placed with anvil_setCode at
//    their predeploy addresses (no proxy: the code is called directly, storage lives there);
//  - the oracle is switched to the chain's fee rules and L1 values are fed the way the sequencer
//    does it, from the depositor account (0xDeaD...0001, impersonated): GasPriceOracle.setEcotone()
//    and setFjord() (the upgrade transactions), then L1Block.setL1BlockValuesEcotone() with the
//    packed calldata of the sequencer's L1-info deposit.
//
// Why Fjord: anvil 1.7.1 `--network optimism` runs the Jovian hardfork and really charges every
// transaction an L1 data fee computed by op-revm from L1Block's storage with the Fjord (FastLZ)
// formula. With the oracle in Fjord mode, getL1Fee() prices exactly what the chain charges (the
// tests check that against balances). Fjord compresses calldata, so tests that need the fee to grow
// use incompressible calldata (incompressibleHex).
import { createRequire } from 'node:module';
import { encodeFunctionData, decodeFunctionResult, encodePacked, toHex, pad } from 'viem';

const require = createRequire(import.meta.url);

export const GAS_PRICE_ORACLE = '0x420000000000000000000000000000000000000F';
export const L1_BLOCK = '0x4200000000000000000000000000000000000015';
export const DEPOSITOR = '0xDeaDDEaDDeAdDeAdDEAdDEaddeAddEAdDEAd0001';

const ARTIFACTS = '@eth-optimism/contracts-bedrock/forge-artifacts';
export const gasPriceOracleArtifact = require(`${ARTIFACTS}/GasPriceOracle.sol/GasPriceOracle.json`);
export const l1BlockArtifact = require(`${ARTIFACTS}/L1Block.sol/L1Block.json`);

/** The contracts-bedrock package version the artifacts come from (for reports). */
export const CONTRACTS_BEDROCK_VERSION = require('@eth-optimism/contracts-bedrock/package.json').version;

/**
 * The sequencer's Ecotone L1-info calldata for L1Block.setL1BlockValuesEcotone():
 * selector, then packed baseFeeScalar (u32), blobBaseFeeScalar (u32), sequenceNumber (u64),
 * timestamp (u64), number (u64), basefee (u256), blobBaseFee (u256), hash (bytes32),
 * batcherHash (bytes32). See L1Block.sol.
 */
export function ecotoneL1InfoCalldata({
  baseFeeScalar, blobBaseFeeScalar, sequenceNumber = 0n, l1Timestamp, l1Number, l1BaseFee, blobBaseFee,
  l1Hash = pad('0x01'), batcherHash = pad('0x02'),
}) {
  const selector = encodeFunctionData({ abi: l1BlockArtifact.abi, functionName: 'setL1BlockValuesEcotone' });
  const packed = encodePacked(
    ['uint32', 'uint32', 'uint64', 'uint64', 'uint64', 'uint256', 'uint256', 'bytes32', 'bytes32'],
    [Number(baseFeeScalar), Number(blobBaseFeeScalar), BigInt(sequenceNumber), BigInt(l1Timestamp), BigInt(l1Number),
      BigInt(l1BaseFee), BigInt(blobBaseFee), l1Hash, batcherHash],
  );
  return `${selector}${packed.slice(2)}`;
}

/**
 * Install GasPriceOracle and L1Block on `anvil` (a startAnvil() handle) and feed L1 values.
 * The defaults make the L1 fee the dominant cost of calldata, as on a real L2 when L1 is busy.
 * @param {object} anvil
 * @param {object} [o]
 * @param {bigint} [o.l1BaseFee=40 gwei]       L1 base fee (wei)
 * @param {number} [o.baseFeeScalar=1_000_000]  Ecotone base-fee scalar (6 decimals: 1e6 = x1)
 * @param {bigint} [o.blobBaseFee=1n]            L1 blob base fee (wei)
 * @param {number} [o.blobBaseFeeScalar=0]
 * @param {boolean} [o.fjord=true]  also activate Fjord (what anvil's op-revm charges); false: Ecotone rules
 * @returns {Promise<{l1Values: object}>}
 */
export async function installOpStackPredeploys(anvil, {
  l1BaseFee = 40_000_000_000n, baseFeeScalar = 1_000_000, blobBaseFee = 1n, blobBaseFeeScalar = 0, fjord = true,
} = {}) {
  await anvil.rpc('anvil_setCode', [GAS_PRICE_ORACLE, gasPriceOracleArtifact.deployedBytecode.object]);
  await anvil.rpc('anvil_setCode', [L1_BLOCK, l1BlockArtifact.deployedBytecode.object]);

  await anvil.rpc('anvil_impersonateAccount', [DEPOSITOR]);
  await anvil.rpc('anvil_setBalance', [DEPOSITOR, toHex(10n ** 18n)]);
  try {
    // GasPriceOracle 1.3.0 prices with the Bedrock formula until the depositor switches it to Ecotone.
    if (!(await readOracle(anvil, 'isEcotone'))) {
      await depositorCall(anvil, GAS_PRICE_ORACLE,
        encodeFunctionData({ abi: gasPriceOracleArtifact.abi, functionName: 'setEcotone' }));
    }
    if (fjord && !(await readOracle(anvil, 'isFjord'))) {
      await depositorCall(anvil, GAS_PRICE_ORACLE,
        encodeFunctionData({ abi: gasPriceOracleArtifact.abi, functionName: 'setFjord' }));
    }
    const head = await anvil.rpc('eth_getBlockByNumber', ['latest', false]);
    const l1Values = {
      baseFeeScalar, blobBaseFeeScalar, sequenceNumber: 0n, l1Timestamp: BigInt(head.timestamp),
      l1Number: 1000n, l1BaseFee, blobBaseFee,
    };
    await depositorCall(anvil, L1_BLOCK, ecotoneL1InfoCalldata(l1Values));
    return { l1Values };
  } finally {
    await anvil.rpc('anvil_stopImpersonatingAccount', [DEPOSITOR]);
  }
}

/** A transaction from the impersonated depositor; throws unless it is mined with status 1. */
async function depositorCall(anvil, to, data) {
  const hash = await anvil.rpc('eth_sendTransaction', [{ from: DEPOSITOR, to, data, gas: toHex(1_000_000n) }]);
  let receipt = null;
  for (let i = 0; i < 100 && !receipt; i += 1) {
    receipt = await anvil.rpc('eth_getTransactionReceipt', [hash]);
    if (!receipt) await new Promise((r) => setTimeout(r, 50));
  }
  if (!receipt || receipt.status !== '0x1') {
    throw new Error(`depositor call to ${to} failed: ${JSON.stringify(receipt)}`);
  }
}

/**
 * `n` bytes of deterministic pseudo-random calldata (0x-hex) that FastLZ cannot compress, so that
 * the Fjord L1 fee grows with its size. xorshift32 from `seed`.
 */
export function incompressibleHex(n, seed = 0x9e3779b9) {
  let x = seed >>> 0 || 1;
  let out = '0x';
  for (let i = 0; i < n; i += 1) {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    out += (x & 0xff).toString(16).padStart(2, '0');
  }
  return out;
}

/** GasPriceOracle.getL1Fee(unsignedTx) by eth_call. */
export async function getL1Fee(anvil, unsignedTx) {
  const data = encodeFunctionData({ abi: gasPriceOracleArtifact.abi, functionName: 'getL1Fee', args: [unsignedTx] });
  const out = await anvil.rpc('eth_call', [{ to: GAS_PRICE_ORACLE, data }, 'latest']);
  return decodeFunctionResult({ abi: gasPriceOracleArtifact.abi, functionName: 'getL1Fee', data: out });
}

/** Reads a view function of the oracle (isEcotone, l1BaseFee, baseFeeScalar, version...). */
export async function readOracle(anvil, functionName) {
  const data = encodeFunctionData({ abi: gasPriceOracleArtifact.abi, functionName });
  const out = await anvil.rpc('eth_call', [{ to: GAS_PRICE_ORACLE, data }, 'latest']);
  return decodeFunctionResult({ abi: gasPriceOracleArtifact.abi, functionName, data: out });
}
