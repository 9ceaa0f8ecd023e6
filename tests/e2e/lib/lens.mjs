// The verify lens as routerd calls it (src/facilitator/evm/lens.rs, src/chain/read_mode.rs): its code,
// where the state override places it, its ABI, and an ask for an ERC-3009 payment. Shared by the
// lens's own tests and the bench's "same read straight to anvil".
import { readFileSync } from 'node:fs';
import { encodeFunctionData, getAddress, keccak256, parseAbi, toHex } from 'viem';

export const LENS_CODE = readFileSync(new URL('../../../src/facilitator/evm/lens.hex', import.meta.url), 'utf8').trim();
export const LENS_AT = getAddress(`0x${keccak256(toHex('routerd.lens')).slice(-40)}`);
export const LENS_ABI = parseAbi([
  'struct Ask { address token; address from; address payTo; address stateTarget; bytes stateCall; uint256 stateMask; address allowanceSpender; address factory; bytes factoryCall; bytes erc1271Call; address trialTarget; bytes trialCall; bytes permitCall; }',
  'function facts(Ask ask)',
  'function factsEach(Ask[] asks) returns (bytes[])',
]);
const AUTHORIZATION_STATE_ABI = parseAbi(['function authorizationState(address authorizer, bytes32 nonce)']);
const ZERO = '0x0000000000000000000000000000000000000000';

/**
 * The ask routerd writes for an ERC-3009 payment: the nonce read is the token's
 * authorizationState; no allowance or permit, and a deployment, an ERC-1271 question or a trial
 * only when given.
 */
export function erc3009Ask({ token, from, payTo, nonce, factory = ZERO, factoryCall = '0x', erc1271Call = '0x', trialTarget = ZERO, trialCall = '0x' }) {
  const stateCall = encodeFunctionData({ abi: AUTHORIZATION_STATE_ABI, functionName: 'authorizationState', args: [getAddress(from), nonce] });
  return {
    token, from: getAddress(from), payTo: getAddress(payTo), stateTarget: token, stateCall, stateMask: 2n ** 256n - 1n,
    allowanceSpender: ZERO, factory, factoryCall, erc1271Call, trialTarget, trialCall, permitCall: '0x',
  };
}

/** The JSON-RPC `eth_call` of `data` on the lens, with its state override, as routerd sends it. */
export function lensEthCall(data, id = 1) {
  return { jsonrpc: '2.0', id, method: 'eth_call', params: [{ to: LENS_AT, data }, 'latest', { [LENS_AT]: { code: LENS_CODE } }] };
}
