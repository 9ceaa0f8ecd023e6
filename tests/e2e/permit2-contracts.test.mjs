// The on-chain parts of x402 payments through Permit2 (lib/permit2.mjs), on their own, with no
// routerd: the official @x402/evm clients sign for them, and this file settles as @x402/evm's
// facilitator does (the same proxy functions, with the same arguments from the payload):
// - our proxies have the ABI @x402/evm calls, and Permit2 has the chain's domain separator;
// - exact: the payee gets exactly the amount; the same payload again, or with its destination
//   changed, moves nothing;
// - upto: only the facilitator named in the witness settles, at most the permitted amount;
// - EIP-2612 sponsoring: a payer who never approved Permit2 pays in one settleWithPermit, even
//   when someone submitted the payer's permit first.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { BaseError, ContractFunctionRevertedError, parseSignature } from 'viem';
import { x402ExactPermit2ProxyABI, x402UptoPermit2ProxyABI } from '@x402/evm';
import { ExactEvmScheme } from '@x402/evm/exact/client';
import { UptoEvmScheme } from '@x402/evm/upto/client';
import { startAnvil } from './lib/anvil.mjs';
import { anvilKey, freshAccount, ROLE } from './lib/accounts.mjs';
import { walletFor } from './lib/deploy-usdc.mjs';
import {
  PERMIT2, EXACT_PROXY, UPTO_PROXY, TEST_TOKEN_EIP712, approvePermit2, compileX402Contracts, deployTestToken,
  mintTestToken, permit2DomainSeparator, placePermit2,
} from './lib/permit2.mjs';

const CHAIN_ID = 84532;
const NETWORK = `eip155:${CHAIN_ID}`;
const FUNDS = 1_000_000n;

// Permit2's own errors, so that a revert inside it is named rather than shown as a selector.
const PERMIT2_ERRORS = [
  { type: 'error', name: 'InvalidNonce', inputs: [] },
  { type: 'error', name: 'InvalidSigner', inputs: [] },
  { type: 'error', name: 'SignatureExpired', inputs: [{ name: 'signatureDeadline', type: 'uint256' }] },
];
const EXACT_ABI = [...x402ExactPermit2ProxyABI, ...PERMIT2_ERRORS];
const UPTO_ABI = [...x402UptoPermit2ProxyABI, ...PERMIT2_ERRORS];

let anvil;
let deployer;
let facilitator;
let token;
const payee = freshAccount().address;

before(async () => {
  anvil = await startAnvil({ chainId: CHAIN_ID });
  deployer = await walletFor(anvil.url, anvilKey(ROLE.deployer));
  facilitator = await walletFor(anvil.url, anvilKey(ROLE.signer));
  await placePermit2(deployer);
  token = await deployTestToken(deployer);
});

after(async () => {
  await anvil?.stop();
});

/** A fresh payer holding FUNDS of the token; with `approved`, it has approved Permit2 (and had ETH for it). */
async function newPayer({ approved }) {
  const payer = freshAccount();
  await mintTestToken(deployer, token, payer.address, FUNDS);
  if (approved) {
    await anvil.rpc('anvil_setBalance', [payer.address, '0xde0b6b3a7640000']);
    await approvePermit2(payer, deployer, token);
  }
  return payer;
}

function requirements(scheme, amount, extra) {
  return { scheme, network: NETWORK, amount: String(amount), asset: token, payTo: payee, maxTimeoutSeconds: 60, extra };
}

const balanceOf = (address) => deployer.readContract({
  address: token, abi: compileX402Contracts().token.abi, functionName: 'balanceOf', args: [address],
});

/** The exact proxy's settle arguments from a payload, as @x402/evm's facilitator builds them. */
function exactArgs({ permit2Authorization: auth, signature }) {
  return [
    { permitted: { token: auth.permitted.token, amount: BigInt(auth.permitted.amount) }, nonce: BigInt(auth.nonce), deadline: BigInt(auth.deadline) },
    auth.from,
    { to: auth.witness.to, validAfter: BigInt(auth.witness.validAfter) },
    signature,
  ];
}

/** The upto proxy's settle arguments, settling `amount`. */
function uptoArgs({ permit2Authorization: auth, signature }, amount) {
  const [permit, owner, , sig] = exactArgs({ permit2Authorization: auth, signature });
  const witness = { to: auth.witness.to, facilitator: auth.witness.facilitator, validAfter: BigInt(auth.witness.validAfter) };
  return [permit, amount, owner, witness, sig];
}

/** The EIP-2612 permit of the eip2612GasSponsoring extension, as settleWithPermit takes it. */
function permit2612(info) {
  const { r, s, v } = parseSignature(info.signature);
  return { value: BigInt(info.amount), deadline: BigInt(info.deadline), r, s, v: Number(v) };
}

async function send(client, address, abi, functionName, args) {
  const hash = await client.writeContract({ address, abi, functionName, args });
  const receipt = await client.waitForTransactionReceipt({ hash });
  assert.equal(receipt.status, 'success');
  return receipt;
}

/** The name of the error the call reverts with (it must revert), or its message for a require. */
async function revertName(client, address, abi, functionName, args) {
  try {
    await client.simulateContract({ address, abi, functionName, args });
  } catch (err) {
    const reverted = err instanceof BaseError && err.walk((e) => e instanceof ContractFunctionRevertedError);
    if (!reverted) throw err;
    if (!reverted.data) return reverted.signature;
    return reverted.data.errorName === 'Error' ? reverted.data.args[0] : reverted.data.errorName;
  }
  assert.fail(`${functionName} did not revert`);
}

/**
 * An ABI entry as comparable text: keys sorted, without Solidity's internalType names, which the
 * encoding ignores.
 */
function abiShape(entry) {
  const canonical = (value) => {
    if (Array.isArray(value)) return value.map(canonical);
    if (value === null || typeof value !== 'object') return value;
    const keys = Object.keys(value).filter((key) => key !== 'internalType').sort();
    return Object.fromEntries(keys.map((key) => [key, canonical(value[key])]));
  };
  return JSON.stringify(canonical(entry));
}

test('the proxies have the ABI @x402/evm calls, Permit2 the chain\'s domain separator', async () => {
  const { exactProxy, uptoProxy } = compileX402Contracts();
  for (const [ours, theirs] of [[exactProxy.abi, x402ExactPermit2ProxyABI], [uptoProxy.abi, x402UptoPermit2ProxyABI]]) {
    assert.deepEqual(ours.map(abiShape).sort(), theirs.map(abiShape).sort());
  }
  for (const address of [EXACT_PROXY, UPTO_PROXY]) {
    assert.equal(await deployer.readContract({ address, abi: x402ExactPermit2ProxyABI, functionName: 'PERMIT2' }), PERMIT2);
  }
  const domainSeparator = await deployer.readContract({
    address: PERMIT2, abi: [{ type: 'function', name: 'DOMAIN_SEPARATOR', inputs: [], outputs: [{ type: 'bytes32' }], stateMutability: 'view' }],
    functionName: 'DOMAIN_SEPARATOR',
  });
  assert.equal(domainSeparator, permit2DomainSeparator(CHAIN_ID));
});

test('exact: the payee gets exactly the amount, once, and only at the signed destination', async () => {
  const payer = await newPayer({ approved: true });
  const client = new ExactEvmScheme(payer);
  const reqs = requirements('exact', 1000n, { assetTransferMethod: 'permit2', ...TEST_TOKEN_EIP712 });
  const { payload } = await client.createPaymentPayload(2, reqs);
  assert.equal(payload.permit2Authorization.spender, EXACT_PROXY);

  await send(facilitator, EXACT_PROXY, EXACT_ABI, 'settle', exactArgs(payload));
  assert.equal(await balanceOf(payee), 1000n);
  assert.equal(await balanceOf(payer.address), FUNDS - 1000n);
  assert.equal(await revertName(facilitator, EXACT_PROXY, EXACT_ABI, 'settle', exactArgs(payload)), 'InvalidNonce');

  const another = (await client.createPaymentPayload(2, reqs)).payload;
  const redirected = { ...another, permit2Authorization: { ...another.permit2Authorization, witness: { ...another.permit2Authorization.witness, to: facilitator.account.address } } };
  assert.equal(await revertName(facilitator, EXACT_PROXY, EXACT_ABI, 'settle', exactArgs(redirected)), 'InvalidSigner');
  assert.equal(await balanceOf(payer.address), FUNDS - 1000n);
});

test('upto: only the facilitator in the witness settles, up to the permitted amount', async () => {
  const before = await balanceOf(payee);
  const payer = await newPayer({ approved: true });
  const client = new UptoEvmScheme(payer);
  const { payload } = await client.createPaymentPayload(2, requirements('upto', 5000n, { facilitatorAddress: facilitator.account.address }));
  assert.equal(payload.permit2Authorization.spender, UPTO_PROXY);

  assert.equal(await revertName(deployer, UPTO_PROXY, UPTO_ABI, 'settle', uptoArgs(payload, 1234n)), 'UnauthorizedFacilitator');
  assert.equal(await revertName(facilitator, UPTO_PROXY, UPTO_ABI, 'settle', uptoArgs(payload, 5001n)), 'AmountExceedsPermitted');
  await send(facilitator, UPTO_PROXY, UPTO_ABI, 'settle', uptoArgs(payload, 1234n));
  assert.equal(await balanceOf(payee), before + 1234n);
  assert.equal(await balanceOf(payer.address), FUNDS - 1234n);
});

/** An exact payload with the client's eip2612GasSponsoring extension, from a payer who never approved Permit2. */
async function sponsoredPayload(payer) {
  // The client reads the payer's token nonce and Permit2 allowance through the RPC.
  const client = new ExactEvmScheme(payer, { rpcUrl: anvil.url });
  const declared = { extensions: { eip2612GasSponsoring: { info: { version: '1' } } } };
  const reqs = requirements('exact', 1000n, { assetTransferMethod: 'permit2', ...TEST_TOKEN_EIP712 });
  const paid = await client.createPaymentPayload(2, reqs, declared);
  const info = paid.extensions?.eip2612GasSponsoring?.info;
  assert.ok(info, 'the client signed no EIP-2612 permit');
  assert.equal(info.spender, PERMIT2);
  return { payload: paid.payload, info };
}

test('EIP-2612 sponsoring: a payer who never approved Permit2 pays in one transaction', async () => {
  const before = await balanceOf(payee);
  const payer = await newPayer({ approved: false });
  const { payload, info } = await sponsoredPayload(payer);

  const inflated = { ...permit2612(info), value: BigInt(info.amount) + 1n };
  assert.equal(await revertName(facilitator, EXACT_PROXY, EXACT_ABI, 'settleWithPermit', [inflated, ...exactArgs(payload)]), 'Permit2612AmountMismatch');
  assert.equal(await revertName(facilitator, EXACT_PROXY, EXACT_ABI, 'settle', exactArgs(payload)), 'TRANSFER_FROM_FAILED');

  const receipt = await send(facilitator, EXACT_PROXY, EXACT_ABI, 'settleWithPermit', [permit2612(info), ...exactArgs(payload)]);
  assert.equal(receipt.from, facilitator.account.address.toLowerCase());
  assert.equal(await balanceOf(payee), before + 1000n);
  assert.equal(await balanceOf(payer.address), FUNDS - 1000n);
});

test('EIP-2612 sponsoring: a permit someone submitted first does not stop the settlement', async () => {
  const before = await balanceOf(payee);
  const payer = await newPayer({ approved: false });
  const { payload, info } = await sponsoredPayload(payer);
  const p = permit2612(info);
  await send(deployer, token, compileX402Contracts().token.abi, 'permit', [payer.address, PERMIT2, p.value, p.deadline, p.v, p.r, p.s]);

  await send(facilitator, EXACT_PROXY, EXACT_ABI, 'settleWithPermit', [p, ...exactArgs(payload)]);
  assert.equal(await balanceOf(payee), before + 1000n);
});
