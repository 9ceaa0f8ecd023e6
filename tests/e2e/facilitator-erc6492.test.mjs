// Payers whose smart wallet is not deployed yet (ERC-6492). The wallet is viem's Solady smart
// account (lib/smart-wallet.mjs), and the official clients sign for it unchanged: x402 v1's
// createPaymentHeader through a viem wallet client, @x402/evm's exact scheme in v2. The wallet
// signs through ERC-1271, and while it has no code viem wraps that signature in ERC-6492 with the
// factory call that deploys it. routerd serves facilitator.erc6492_factories = [that factory]:
// - verify deploys the wallet inside its one eth_call (the lens) and asks it the signature;
// - settle deploys it and moves the funds in one transaction (Multicall3's aggregate3);
// - a replay sends nothing; a factory not on the list, or a wrong inner signature, sends nothing;
// - without Multicall3 on the chain, nothing is sent (the trial checks the authorization is used);
// - a rollback of the block that deployed and paid is survived: the settlement mines again, once.
// The chain is reached through a proxy that plays the node's support for eth_call state
// overrides: facilitator-erc6492-batch.test.mjs runs every case again on a node without them,
// where verify deploys the wallet through Multicall3 inside its eth_call instead of the lens.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createWalletClient, http, getAddress, parseErc6492Signature, serializeErc6492Signature, isErc6492Signature } from 'viem';
import { createPaymentHeader } from 'x402/client';
import { ExactEvmScheme as ExactEvmClientScheme } from '@x402/evm/exact/client';
import { startFacilitatorStack, throughProxy, withLogTail, NETWORK, CHAIN_ID } from './lib/stack.mjs';
import { startFilteringProxy } from './lib/bad-upstreams.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { paymentRequirements, toV2 } from './lib/x402.mjs';
import { expectValid, expectInvalid, expectSettled, expectSettleFailed, expectDuplicate } from './lib/expect.mjs';
import { rolledBackAndMinedAgain } from './lib/settling.mjs';
import { SOLADY_FACTORY, MULTICALL3, placeSmartWalletFactory, compileSmartWallet, smartAccountFor } from './lib/smart-wallet.mjs';

const READS = globalThis.ERC6492_READS ?? 'lens';
const PRICE = 1000n;
const V2_NETWORK = `eip155:${CHAIN_ID}`;

let stack;
let proxy;
/** A second Solady factory for the same wallet, at an address that is not on the allowlist. */
let unlistedFactory;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  proxy = await startFilteringProxy({ overrides: READS === 'lens' ? 'run' : 'ignore' });
  stack = await startFacilitatorStack({
    anvil: { blockTime: 1 },
    rpcUrlFor: throughProxy(proxy),
    routerd: { x402Versions: [1, 2], erc6492Factories: [SOLADY_FACTORY], settleTimeoutSecs: 30 },
  });
  const { implementation } = await placeSmartWalletFactory(stack.client);
  unlistedFactory = await deployFactory(implementation);
});

after(async () => {
  await stack?.stop();
  await proxy?.close();
});

async function deployFactory(implementation) {
  const { factory } = compileSmartWallet();
  const hash = await stack.client.deployContract({ abi: factory.abi, bytecode: factory.bytecode, args: [implementation], gas: 3_000_000n });
  const receipt = await stack.client.waitForTransactionReceipt({ hash });
  return receipt.contractAddress;
}

/** A smart account not deployed yet, funded with `funds` USDC; `factoryAddress` deploys it. */
async function newWallet({ funds = 1_000_000n, factoryAddress } = {}) {
  const owner = freshAccount();
  const account = await smartAccountFor(stack.client, owner, { factoryAddress });
  assert.equal(await code(account.address), undefined, 'precondition: the wallet has no code');
  await stack.mint(account.address, funds);
  return account;
}

const code = (address) => stack.client.getCode({ address });

/** The requirements a resource server states for PRICE to a fresh payee, in v1's shape. */
function requirementsV1() {
  return paymentRequirements({ network: NETWORK, amount: PRICE, payTo: freshAccount().address, asset: getAddress(stack.usdc) });
}

/** x402 v1's own client signs: its header decoded is the payment payload. */
async function payV1(account) {
  const requirements = requirementsV1();
  const wallet = createWalletClient({ account, chain: stack.client.chain, transport: http(stack.anvil.url) });
  const header = await createPaymentHeader(wallet, 1, requirements);
  const paymentPayload = JSON.parse(Buffer.from(header, 'base64').toString('utf8'));
  return { body: { x402Version: 1, paymentPayload, paymentRequirements: requirements }, payTo: requirements.payTo, version: 1 };
}

/** @x402/evm's exact client signs the v2 payload for the same kind of requirements. */
async function payV2(account) {
  const requirements = toV2({ requirements: requirementsV1(), authorization: {}, signature: '0x' }, CHAIN_ID).paymentRequirements;
  const scheme = new ExactEvmClientScheme(account);
  const partial = await scheme.createPaymentPayload(2, requirements);
  const paymentPayload = { ...partial, x402Version: 2, resource: { url: 'https://example.com/r', description: 'e2e', mimeType: 'application/json' }, accepted: requirements };
  return { body: { x402Version: 2, paymentPayload, paymentRequirements: requirements }, payTo: requirements.payTo, version: 2 };
}

const signatureOf = (p) => p.body.paymentPayload.payload.signature;
const networkOf = (p) => (p.version === 1 ? NETWORK : V2_NETWORK);

/** Settles `p` and checks that one transaction, through Multicall3, deployed the wallet and paid. */
async function expectDeployedAndPaid(p, account) {
  assert.ok(isErc6492Signature(signatureOf(p)), 'the client wrapped its signature in ERC-6492');
  expectValid(await stack.verify(p.body), { payer: account.address });
  assert.equal(await code(account.address), undefined, 'verify deployed nothing');
  const nonceBefore = await stack.signerNonce();
  const res = await stack.settle(p.body);
  const hash = expectSettled(res, { network: networkOf(p), payer: account.address });
  const receipt = await stack.receipt(hash);
  assert.equal(receipt.status, 'success');
  assert.equal(getAddress(receipt.to), getAddress(MULTICALL3), 'the settlement went through Multicall3');
  assert.ok((await code(account.address))?.length > 2, 'the settlement deployed the wallet');
  assert.equal(await stack.balanceOf(p.payTo), PRICE, 'the payee was paid');
  assert.equal(await stack.balanceOf(account.address), 1_000_000n - PRICE, 'the wallet paid');
  assert.equal(await stack.signerNonce(), nonceBefore + 1, 'one transaction');
  return hash;
}

/** A replay of a settled payment: told the transaction, nothing sent, nothing moved. */
async function expectReplayInert(p, account, hash) {
  const nonce = await stack.signerNonce('pending');
  expectDuplicate(await stack.settle(p.body), { transaction: hash, network: networkOf(p), payer: account.address, version: p.version });
  assert.equal(await stack.signerNonce('pending'), nonce, 'the replay sent nothing');
  assert.equal(await stack.balanceOf(p.payTo), PRICE, 'the payee was paid once');
}

it('v2: @x402/evm signs for a wallet not deployed yet; verify is valid, settle deploys it and pays in one transaction, a replay sends nothing', async () => {
  const account = await newWallet();
  const p = await payV2(account);
  const hash = await expectDeployedAndPaid(p, account);
  await expectReplayInert(p, account, hash);
});

it('v1: x402\'s client signs through a viem wallet client; the same, in v1', async () => {
  const account = await newWallet();
  const p = await payV1(account);
  const hash = await expectDeployedAndPaid(p, account);
  await expectReplayInert(p, account, hash);
});

it('a factory not on facilitator.erc6492_factories is refused, and nothing is sent', async () => {
  const account = await newWallet({ factoryAddress: unlistedFactory });
  for (const p of [await payV1(account), await payV2(account)]) {
    const reason = p.version === 1 ? 'invalid_payload' : 'eip6492_factory_not_allowed';
    const verified = await stack.verify(p.body);
    expectInvalid(verified, reason, { payer: account.address });
    assert.match(verified.body.invalidMessage ?? verified.text, /erc6492_factories/);
    const nonce = await stack.signerNonce('pending');
    expectSettleFailed(await stack.settle(p.body), reason, { network: networkOf(p), payer: account.address });
    assert.equal(await stack.signerNonce('pending'), nonce, 'nothing was sent');
  }
  assert.equal(await code(account.address), undefined, 'the wallet was not deployed');
});

it('an ERC-6492 signature whose inner signature is wrong is refused, and nothing is sent', async () => {
  const account = await newWallet();
  for (const p of [await payV1(account), await payV2(account)]) {
    const { address, data, signature } = parseErc6492Signature(signatureOf(p));
    // Flip one bit of the owner's ECDSA signature, at the front of the wallet's nested signature.
    const flipped = `0x${(parseInt(signature.slice(2, 4), 16) ^ 1).toString(16).padStart(2, '0')}${signature.slice(4)}`;
    p.body.paymentPayload.payload.signature = serializeErc6492Signature({ address, data, signature: flipped });
    expectInvalid(await stack.verify(p.body), 'invalid_exact_evm_payload_signature', { payer: account.address });
    const nonce = await stack.signerNonce('pending');
    const settleReason = p.version === 1 ? 'invalid_exact_evm_payload_signature_address' : 'invalid_exact_evm_payload_signature';
    expectSettleFailed(await stack.settle(p.body), settleReason, { network: networkOf(p), payer: account.address });
    assert.equal(await stack.signerNonce('pending'), nonce, 'nothing was sent');
  }
  assert.equal(await code(account.address), undefined, 'the wallet was not deployed');
});

it(`on a chain without Multicall3 the deploying settlement is refused unsent (${READS === 'lens' ? 'the trial: a call that succeeds without using the authorization is no success' : 'verify\'s Multicall3 read gets no answer'})`, async () => {
  const account = await newWallet();
  const p = await payV2(account);
  const multicall3 = await code(MULTICALL3);
  await stack.anvil.rpc('anvil_setCode', [MULTICALL3, '0x']);
  try {
    const nonce = await stack.signerNonce('pending');
    const res = await stack.settle(p.body);
    expectSettleFailed(res, 'invalid_payload', { network: V2_NETWORK, payer: account.address });
    assert.match(res.body.errorMessage, READS === 'lens' ? /did not use the authorization/ : /Multicall3 .* did not answer/);
    assert.equal(await stack.signerNonce('pending'), nonce, 'nothing was sent');
  } finally {
    await stack.anvil.rpc('anvil_setCode', [MULTICALL3, multicall3]);
  }
  assert.equal(await stack.balanceOf(account.address), 1_000_000n, 'the wallet paid nothing');
});

it('a rollback of the block that deployed the wallet and paid is survived: the settlement mines again, once', async () => {
  const account = await newWallet();
  const p = await payV2(account);
  const hash = await expectDeployedAndPaid(p, account);
  await rolledBackAndMinedAgain(stack, hash, async () => {
    assert.equal(await code(account.address), undefined, 'precondition: the rollback removed the wallet');
  });
  assert.ok((await code(account.address))?.length > 2, 'the wallet is deployed again');
  assert.equal(await stack.balanceOf(p.payTo), PRICE, 'the payee is paid once');
  assert.equal(await stack.balanceOf(account.address), 1_000_000n - PRICE, 'the wallet paid once');
  await expectReplayInert(p, account, hash);
});
