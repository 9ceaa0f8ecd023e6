// Every way a Permit2 payment's money moves is in the exposure (spec/access.md section 2), and
// verify says valid only for what settle would send. The chain mines only when told
// (--no-mining), so every settlement of a burst is in flight at once:
// - a payer who approved Permit2 for exactly one price settles 6 Permit2 payments at once: one is
//   sent, the 5 others answer permit2_allowance_required with nothing sent (without the rule all 6
//   were sent and 5 reverted TRANSFER_FROM_FAILED);
// - a payer who never approved Permit2 settles 4 payments at once, each with an EIP-2612 permit
//   (the official client signs them all with the token's one permit nonce): one is sent, the 3
//   others answer invalid_payload with nothing sent (without the rule 3 reverted);
// - two payments of different tokens under one Permit2 nonce (Permit2's nonces are the owner's
//   across tokens): one is sent, the other refused;
// - `upto` from a smart wallet whose signature is ERC-6492 wrapped, before and after the wallet is
//   deployed: the settlement would go through Multicall3, which the upto proxy refuses, so verify
//   answers invalid (it answered valid) and settle sends nothing.
// After each burst the signer's transactions are all mined and none reverted.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress, erc20Abi, keccak256, encodeAbiParameters, pad, toHex } from 'viem';
import { ExactEvmScheme as ExactEvmClientScheme } from '@x402/evm/exact/client';
import { UptoEvmScheme as UptoEvmClientScheme } from '@x402/evm/upto/client';
import { permit2WitnessTypes } from '@x402/evm';
import { declareEip2612GasSponsoringExtension } from '@x402/extensions';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { anvilAccount, freshAccount, ROLE } from './lib/accounts.mjs';
import { expectValid, expectInvalid, expectSettled, expectSettleFailed } from './lib/expect.mjs';
import { waitFor } from './lib/util.mjs';
import { chainMark, minedFrom, pooledFrom } from './lib/chain-audit.mjs';
import { mining } from './lib/settling.mjs';
import { PERMIT2, TEST_TOKEN_EIP712, deployTestToken, mintTestToken, placePermit2 } from './lib/permit2.mjs';
import { SOLADY_FACTORY, placeSmartWalletFactory, smartAccountFor } from './lib/smart-wallet.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = 10_000n;
const FUNDS = 1_000_000n;

let stack;
let token;
let other;
const payTo = anvilAccount(ROLE.payee).address;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

const tokenConfig = (name, address) => `[chains.${stack.network}.tokens.${name}]\naddress = "${address}"\n`
  + `eip712_name = "${TEST_TOKEN_EIP712.name}"\neip712_version = "${TEST_TOKEN_EIP712.version}"\ntransfer_methods = ["permit2"]\n`;

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { noMining: true },
    routerd: { x402Versions: [1, 2], allowHttpResource: true, settleTimeoutSecs: 30, erc6492Factories: [SOLADY_FACTORY] },
  });
  await automined(async () => {
    await placePermit2(stack.client);
    await placeSmartWalletFactory(stack.client);
    token = await deployTestToken(stack.client);
    other = await deployTestToken(stack.client);
  });
  stack.reconfigure({ chainExtra: tokenConfig('TT', token) + tokenConfig('TT2', other) });
  await stack.routerd.restart();
});

after(() => stack?.stop());

/** `fn` with the chain mining each transaction at once (setup), then --no-mining again. */
async function automined(fn) {
  await stack.anvil.setAutomine(true);
  try {
    return await fn();
  } finally {
    await stack.anvil.setAutomine(false);
  }
}

const requirements = (asset = token) => ({
  scheme: 'exact', network: NETWORK, amount: String(PRICE), asset: getAddress(asset), payTo, maxTimeoutSeconds: 60,
  extra: { assetTransferMethod: 'permit2', ...TEST_TOKEN_EIP712 },
});
const resource = { url: 'https://example.com/r', description: 'e2e', mimeType: 'application/json' };
const bodyOf = (partial, reqs) => ({ x402Version: 2, paymentPayload: { ...partial, x402Version: 2, resource, accepted: reqs }, paymentRequirements: reqs });

/** A payer holding FUNDS of `asset` (and ETH); `allowance`: what it approves Permit2 for. */
async function newPayer({ allowance, assets = [token] } = {}) {
  const payer = freshAccount();
  await automined(async () => {
    await stack.anvil.rpc('anvil_setBalance', [payer.address, '0xde0b6b3a7640000']);
    for (const asset of assets) {
      await mintTestToken(stack.client, asset, payer.address, FUNDS);
      if (allowance === undefined) continue;
      const hash = await stack.client.writeContract({ account: payer, address: asset, abi: erc20Abi, functionName: 'approve', args: [PERMIT2, allowance], gas: 100_000n });
      await stack.client.waitForTransactionReceipt({ hash });
    }
  });
  return payer;
}

/**
 * Settles `bodies` at once with nothing mined: `refused` of them answer at once, each failing
 * with `reason` (and a message matching `message`) before any block; the others are mined and
 * succeed. The signer's transactions since the start are exactly the successes, none reverted.
 */
async function burst(bodies, { refused, reason, message, payer }) {
  const mark = await chainMark(stack.anvil, stack.signer);
  const answered = [];
  const promises = bodies.map((body, i) => stack.settle(body).then((res) => { answered.push(i); return res; }));
  await waitFor(() => answered.length >= refused, { timeoutMs: 20_000, intervalMs: 50, what: `${refused} refusals without a block mined` });
  assert.equal(Number(await stack.anvil.rpc('eth_blockNumber')), mark.block, 'no block was mined while the refusals were answered');
  const sent = bodies.length - refused;
  await waitFor(async () => Object.keys(await pooledFrom(stack.anvil, stack.signer)).length >= sent, { timeoutMs: 10_000, what: 'the settlements in the pool' });
  const results = await mining(stack.anvil, Promise.all(promises));
  const failed = results.filter((res) => res.body?.success !== true);
  assert.equal(failed.length, refused, JSON.stringify(results.map((r) => r.body)));
  for (const res of failed) {
    expectSettleFailed(res, reason, { network: NETWORK, payer: getAddress(payer.address) });
    assert.match(res.body.errorMessage, message);
  }
  for (const res of results.filter((r) => r.body?.success === true)) expectSettled(res, { network: NETWORK, payer: payer.address });
  const mined = await minedFrom(stack.anvil, [stack.signer], { fromBlock: mark.block });
  assert.equal(mined.length, sent, `the signer sent ${sent} transaction(s)`);
  for (const tx of mined) assert.equal(tx.status, 'success', `signer transaction ${tx.hash} reverted`);
  return results;
}

it('a payer who approved Permit2 for one price settles 6 Permit2 payments at once: one is sent, 5 permit2_allowance_required, none reverts', async () => {
  const payer = await newPayer({ allowance: PRICE });
  const scheme = new ExactEvmClientScheme(payer);
  const bodies = await Promise.all(Array.from({ length: 6 }, async () => bodyOf(await scheme.createPaymentPayload(2, requirements()), requirements())));
  await burst(bodies, { refused: 5, reason: 'permit2_allowance_required', message: /Permit2 allowance 10000 does not cover/, payer });
  assert.equal(await balanceOf(payer.address), FUNDS - PRICE, 'the payer paid once');
});

const balanceOf = (address, asset = token) => stack.client.readContract({ address: asset, abi: erc20Abi, functionName: 'balanceOf', args: [address] });

it('a payer who never approved Permit2 settles 4 payments with EIP-2612 permits at once (one permit nonce): one is sent, 3 invalid_payload, none reverts', async () => {
  const payer = freshAccount();
  await automined(() => mintTestToken(stack.client, token, payer.address, FUNDS));
  const scheme = new ExactEvmClientScheme(payer, { rpcUrl: stack.anvil.url });
  const bodies = await Promise.all(Array.from({ length: 4 }, async () => {
    const partial = await scheme.createPaymentPayload(2, requirements(), { extensions: declareEip2612GasSponsoringExtension() });
    assert.ok(partial.extensions?.eip2612GasSponsoring?.info, 'the client signed an EIP-2612 permit');
    return bodyOf(partial, requirements());
  }));
  await burst(bodies, { refused: 3, reason: 'invalid_payload', message: /EIP-2612 permit approving Permit2/, payer });
  assert.equal(await balanceOf(payer.address), FUNDS - PRICE, 'the payer paid once');
  assert.equal(await stack.client.getBalance({ address: payer.address }), 0n, 'the payer spent no gas');
});

/** `payer`'s exact Permit2 body for `asset` under Permit2 nonce `nonce`, signed by hand. */
async function signedWithNonce(payer, asset, nonce) {
  const body = bodyOf(await new ExactEvmClientScheme(payer).createPaymentPayload(2, requirements(asset)), requirements(asset));
  const a = body.paymentPayload.payload.permit2Authorization;
  a.nonce = nonce.toString();
  body.paymentPayload.payload.signature = await payer.signTypedData({
    domain: { name: 'Permit2', chainId: CHAIN_ID, verifyingContract: PERMIT2 },
    types: permit2WitnessTypes,
    primaryType: 'PermitWitnessTransferFrom',
    message: {
      permitted: { token: a.permitted.token, amount: BigInt(a.permitted.amount) }, spender: a.spender, nonce,
      deadline: BigInt(a.deadline), witness: { to: a.witness.to, validAfter: BigInt(a.witness.validAfter) },
    },
  });
  return body;
}

it('two payments of different tokens under one Permit2 nonce, settled at once: one is sent, the other invalid_payload, none reverts', async () => {
  const payer = await newPayer({ allowance: FUNDS, assets: [token, other] });
  const nonce = BigInt(`0x${Buffer.from(crypto.getRandomValues(new Uint8Array(31))).toString('hex')}`);
  const bodies = [await signedWithNonce(payer, token, nonce), await signedWithNonce(payer, other, nonce)];
  for (const body of bodies) expectValid(await stack.verify(body), { payer: getAddress(payer.address) });
  await burst(bodies, { refused: 1, reason: 'invalid_payload', message: /same Permit2 nonce/, payer });
  assert.equal((await balanceOf(payer.address)) + (await balanceOf(payer.address, other)), 2n * FUNDS - PRICE, 'one of the two paid');
});

/** The upto client's v2 body for PRICE from `account`, naming routerd's signer. */
async function uptoBody(account) {
  const reqs = { ...requirements(), scheme: 'upto', extra: { ...TEST_TOKEN_EIP712, facilitatorAddress: getAddress(stack.signer) } };
  return bodyOf(await new UptoEvmClientScheme(account).createPaymentPayload(2, reqs), reqs);
}

/** The storage slot of `allowance(owner, spender)` in the test token (OpenZeppelin's ERC20: slot 1). */
function allowanceSlot(owner, spender) {
  const inner = keccak256(encodeAbiParameters([{ type: 'address' }, { type: 'uint256' }], [owner, 1n]));
  return keccak256(encodeAbiParameters([{ type: 'address' }, { type: 'bytes32' }], [spender, inner]));
}

/** verify and settle refuse `body` as an upto payment with an ERC-6492 deployment; nothing is sent. */
async function expectUptoDeploymentRefused(body, wallet) {
  const verified = await stack.verify(body);
  expectInvalid(verified, 'invalid_payload', { payer: getAddress(wallet.address) });
  assert.match(verified.body.invalidMessage, /upto proxy, which cannot carry the ERC-6492 deployment/);
  const nonce = await stack.signerNonce('pending');
  expectSettleFailed(await stack.settle(body), 'invalid_payload', { network: NETWORK, payer: getAddress(wallet.address) });
  assert.equal(await stack.signerNonce('pending'), nonce, 'nothing was sent');
}

it('upto from a smart wallet whose signature is ERC-6492 wrapped: invalid at verify before and after the wallet is deployed, and settle sends nothing', async () => {
  const wallet = await smartAccountFor(stack.client, freshAccount());
  // The wallet holds the funds and has approved Permit2 (written into the token's allowance
  // slot: a transaction from its address would take the nonce its deployment needs): only the
  // deployment stands between it and a settlement.
  await automined(() => mintTestToken(stack.client, token, wallet.address, FUNDS));
  await stack.anvil.rpc('anvil_setStorageAt', [token, allowanceSlot(wallet.address, PERMIT2), pad(toHex(FUNDS))]);
  assert.equal(await stack.client.readContract({ address: token, abi: erc20Abi, functionName: 'allowance', args: [wallet.address, PERMIT2] }), FUNDS);
  const body = await uptoBody(wallet);
  assert.match(body.paymentPayload.payload.signature, /6492649264926492$/, 'precondition: viem wrapped the signature (ERC-6492)');
  await expectUptoDeploymentRefused(body, wallet);
  const { factory, factoryData } = await wallet.getFactoryArgs();
  await automined(async () => {
    const hash = await stack.client.sendTransaction({ to: factory, data: factoryData, gas: 1_000_000n });
    await stack.client.waitForTransactionReceipt({ hash });
  });
  assert.ok(await stack.client.getCode({ address: wallet.address }), 'precondition: the wallet is deployed');
  await expectUptoDeploymentRefused(body, wallet);
  assert.equal(await balanceOf(wallet.address), FUNDS);
});
