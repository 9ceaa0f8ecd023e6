// x402 v2 `exact` through Permit2, for an ERC-20 without ERC-3009 (lib/permit2.mjs: a plain
// OpenZeppelin token, Permit2 and x402's exact proxy at their canonical addresses). routerd
// serves the token with transfer_methods = ["permit2"], and USDC with both methods.
// - @x402/fetch pays an @x402/express server through routerd: the settlement calls the proxy's
//   settle, and the token moves from the payer to the payee exactly as asked;
// - one PAYMENT-SIGNATURE header sent five times at once buys one delivery;
// - every Permit2 rule has a case, refused with no transaction: the proxy as spender, the token,
//   the witness's payee, the deadline, the amount, Permit2's domain, the payer's approval of
//   Permit2, and the token's transfer methods;
// - a payer's ERC-3009 and Permit2 payments of one token count against one balance;
// - a rollback of the settling block is survived: it mines again, once; a SIGKILL with the
//   settlement in the pool, which the chain then loses, is survived: it is sent again, once;
// - `upto` (@x402/evm's upto client and server): /supported names the facilitator address, the
//   server charges less than the permit and exactly that moves, from the advertised signer; a
//   zero charge sends nothing; a charge over the permit, or a witness naming another
//   facilitator, is refused with no transaction;
// - a self-payment (payTo is the payer), exact or upto, is refused with no transaction;
// - `eip2612GasSponsoring`: a payer who never approved Permit2 (and holds no ETH) pays with an
//   EIP-2612 permit carried by the payload; one settleWithPermit approves and pays; a permit not
//   for Permit2 or not for the amount is refused at verify, a bad one by the settle's trial.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import express from 'express';
import { paymentMiddleware, x402ResourceServer, setSettlementOverrides } from '@x402/express';
import { HTTPFacilitatorClient } from '@x402/core/server';
import { ExactEvmScheme as ExactEvmServerScheme } from '@x402/evm/exact/server';
import { ExactEvmScheme as ExactEvmClientScheme } from '@x402/evm/exact/client';
import { UptoEvmScheme as UptoEvmServerScheme } from '@x402/evm/upto/server';
import { UptoEvmScheme as UptoEvmClientScheme } from '@x402/evm/upto/client';
import { wrapFetchWithPayment, x402Client, decodePaymentResponseHeader } from '@x402/fetch';
import { permit2WitnessTypes } from '@x402/evm';
import { declareEip2612GasSponsoringExtension } from '@x402/extensions';
import { getAddress, erc20Abi } from 'viem';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { anvilAccount, freshAccount, ROLE } from './lib/accounts.mjs';
import { listenShop, catchPaymentHeader, expectDelivered, expectReplayedHeaderBuysOnce } from './lib/interop.mjs';
import { expectValid, expectInvalid, expectSettled, expectSettleFailed } from './lib/expect.mjs';
import { waitFor, idempotencyKey } from './lib/util.mjs';
import { pooledFrom } from './lib/chain-audit.mjs';
import { rolledBackAndMinedAgain } from './lib/settling.mjs';
import { toV2 } from './lib/x402.mjs';
import {
  PERMIT2, EXACT_PROXY, UPTO_PROXY, TEST_TOKEN_EIP712, approvePermit2, deployTestToken, mintTestToken, placePermit2,
} from './lib/permit2.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = '10000';
const USED = 4000n;
const FUNDS = 1_000_000n;

let stack;
let token;
let server;
let shopUrl;
const payTo = anvilAccount(ROLE.payee).address;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { blockTime: 1 },
    routerd: { x402Versions: [1, 2], allowHttpResource: true },
    usdcExtra: 'transfer_methods = ["eip3009", "permit2"]\n',
  });
  await placePermit2(stack.client);
  token = await deployTestToken(stack.client);
  // The token joins the served network: Permit2 only (it has no ERC-3009).
  stack.reconfigure({
    chainExtra: `[chains.${stack.network}.tokens.TT]\naddress = "${token}"\neip712_name = "${TEST_TOKEN_EIP712.name}"\n`
      + `eip712_version = "${TEST_TOKEN_EIP712.version}"\ntransfer_methods = ["permit2"]\n`,
  });
  await stack.routerd.restart();
  shopUrl = await startShop();
});

after(async () => {
  await new Promise((resolve) => (server ? server.close(resolve) : resolve()));
  await stack?.stop();
});

const USDC_EIP712 = { name: 'USD Coin', version: '2' };
const requirements = (asset = token, domain = TEST_TOKEN_EIP712) => ({
  scheme: 'exact', network: NETWORK, amount: PRICE, asset: getAddress(asset), payTo, maxTimeoutSeconds: 60,
  extra: { assetTransferMethod: 'permit2', ...domain },
});

async function startShop() {
  const facilitator = new HTTPFacilitatorClient({ url: stack.url });
  const resourceServer = new x402ResourceServer(facilitator)
    .register(NETWORK, new ExactEvmServerScheme())
    .register(NETWORK, new UptoEvmServerScheme());
  const app = express();
  const { amount, asset, extra } = requirements();
  const metered = { scheme: 'upto', network: NETWORK, payTo, price: { amount, asset, extra: { ...TEST_TOKEN_EIP712 } } };
  app.use(paymentMiddleware({
    'GET /weather': {
      accepts: { scheme: 'exact', network: NETWORK, payTo, price: { amount, asset, extra } },
      description: 'weather report',
      mimeType: 'application/json',
    },
    'GET /compute': { accepts: metered, description: 'metered compute', mimeType: 'application/json' },
    'GET /idle': { accepts: metered, description: 'metered, unused', mimeType: 'application/json' },
    'GET /sponsored': {
      accepts: { scheme: 'exact', network: NETWORK, payTo, price: { amount, asset, extra } },
      description: 'weather report, Permit2 approval sponsored',
      mimeType: 'application/json',
      extensions: declareEip2612GasSponsoringExtension(),
    },
  }, resourceServer));
  app.get('/sponsored', (req, res) => res.json({ report: 'sunny' }));
  app.get('/weather', (req, res) => res.json({ report: 'sunny' }));
  // The server charges what was used: less than the permit, or nothing.
  app.get('/compute', (req, res) => {
    setSettlementOverrides(res, { amount: String(USED) });
    res.json({ report: 'sunny' });
  });
  app.get('/idle', (req, res) => {
    setSettlementOverrides(res, { amount: '0' });
    res.json({ report: 'sunny' });
  });
  const shop = await listenShop(app);
  server = shop.server;
  return shop.url;
}

function payingFetch(account, inner = fetch) {
  const client = new x402Client().register(NETWORK, new ExactEvmClientScheme(account));
  client.setSpendControls({ allowedAssets: [{ network: NETWORK, asset: getAddress(token), maxAmountPerPayment: PRICE }] });
  return wrapFetchWithPayment(inner, client);
}

const V2_WIRE = {
  paymentHeader: 'PAYMENT-SIGNATURE',
  receiptHeader: 'payment-response',
  decodeReceipt: decodePaymentResponseHeader,
  reasonOf: (a) => (a.receipt ? decodePaymentResponseHeader(a.receipt).errorReason : a.text.slice(0, 80)),
  expectRefusedReceipt: (refused, shown) => {
    if (refused.receipt) assert.equal(decodePaymentResponseHeader(refused.receipt).success, false, shown);
  },
};

const balanceOf = (address, asset = token) => stack.client.readContract({ address: asset, abi: erc20Abi, functionName: 'balanceOf', args: [address] });

/** A payer holding FUNDS of the token (and ETH for its one approval), Permit2 approved unless told. */
async function newPayer({ approve = true, asset = token } = {}) {
  const payer = freshAccount();
  await stack.anvil.rpc('anvil_setBalance', [payer.address, '0xde0b6b3a7640000']);
  if (asset === token) await mintTestToken(stack.client, token, payer.address, FUNDS);
  else await stack.mint(payer.address, FUNDS);
  if (approve) await approvePermit2(payer, stack.client, asset);
  return payer;
}

/** The official client's v2 body for `reqs`, as a resource server would send it to routerd. */
async function signedBody(payer, reqs = requirements()) {
  const partial = await new ExactEvmClientScheme(payer).createPaymentPayload(2, reqs);
  const paymentPayload = { ...partial, x402Version: 2, resource: { url: 'https://example.com/r', description: 'e2e', mimeType: 'application/json' }, accepted: reqs };
  return { x402Version: 2, paymentPayload, paymentRequirements: reqs };
}

it('@x402/fetch pays the @x402/express server through routerd with Permit2, and the token moves on chain', async () => {
  const payer = await newPayer();
  const payeeBefore = await balanceOf(payTo);
  const nonce = await stack.signerNonce('pending');
  const res = await payingFetch(payer)(`${shopUrl}/weather`);
  const receipt = await expectDelivered(res, { wire: V2_WIRE, network: NETWORK, payer });
  const mined = await stack.receipt(receipt.transaction);
  assert.equal(mined.status, 'success');
  assert.equal(getAddress(mined.to), getAddress(EXACT_PROXY), 'settled through the exact proxy');
  assert.equal(await stack.signerNonce('pending'), nonce + 1, 'one transaction');
  assert.equal(await balanceOf(payer.address), FUNDS - BigInt(PRICE));
  assert.equal(await balanceOf(payTo), payeeBefore + BigInt(PRICE));
});

it('one PAYMENT-SIGNATURE header sent five times at once buys one delivery', async () => {
  await expectReplayedHeaderBuysOnce({
    stack: { ...stack, newPayer: () => newPayer(), balanceOf: (a) => balanceOf(a), signerNonce: (t) => stack.signerNonce(t), receipt: (h) => stack.receipt(h) },
    url: `${shopUrl}/weather`,
    payTo,
    price: BigInt(PRICE),
    capture: (account, url) => catchPaymentHeader({
      pay: (inner) => payingFetch(account, inner)(url),
      headerOf: (input, init) => new Request(input, init).headers.get('payment-signature'),
      made: '@x402/fetch made a PAYMENT-SIGNATURE header',
    }),
    wire: V2_WIRE,
  });
});

/** verify and settle both refuse `body` with `reason`, and nothing is sent. */
async function expectRefused(body, reason, payer, message) {
  const verified = await stack.verify(body);
  expectInvalid(verified, reason, { payer: getAddress(payer.address) });
  if (message) assert.match(verified.body.invalidMessage, message);
  const nonce = await stack.signerNonce('pending');
  expectSettleFailed(await stack.settle(body), reason, { network: NETWORK, payer: getAddress(payer.address) });
  assert.equal(await stack.signerNonce('pending'), nonce, 'nothing was sent');
}

const edit = (body, change) => {
  const copy = structuredClone(body);
  change(copy.paymentPayload.payload.permit2Authorization, copy);
  return copy;
};

it('each Permit2 rule refuses with no transaction: spender, token, payee, deadline, amount, domain, approval, transfer methods', async () => {
  const payer = await newPayer();
  const body = await signedBody(payer);
  expectValid(await stack.verify(body), { payer: getAddress(payer.address) });
  await expectRefused(edit(body, (a) => { a.spender = payer.address; }), 'invalid_permit2_spender', payer, /spender/);
  await expectRefused(edit(body, (a) => { a.permitted.token = stack.usdc; }), 'permit2_token_mismatch', payer, /permitted\.token/);
  await expectRefused(edit(body, (a) => { a.witness.to = freshAccount().address; }), 'invalid_exact_evm_payload_recipient_mismatch', payer);
  await expectRefused(edit(body, (a) => { a.permitted.amount = '9999'; }), 'invalid_exact_evm_payload_authorization_value', payer);
  // Changed after signing: the signature no longer covers them.
  await expectRefused(edit(body, (a) => { a.nonce = (BigInt(a.nonce) + 1n).toString(); }), 'invalid_exact_evm_payload_signature', payer);
  const soon = Math.floor(Date.now() / 1000) + 2;
  await expectRefused(edit(body, (a) => { a.deadline = String(soon); }), 'invalid_exact_evm_payload_authorization_valid_before', payer);
  await expectRefused(edit(body, (a) => { a.witness.validAfter = String(soon + 600); }), 'invalid_exact_evm_payload_authorization_valid_after', payer);
  // Signed for Permit2 on another chain: another domain.
  const a = body.paymentPayload.payload.permit2Authorization;
  const otherDomain = await payer.signTypedData({
    domain: { name: 'Permit2', chainId: 1, verifyingContract: PERMIT2 },
    types: permit2WitnessTypes,
    primaryType: 'PermitWitnessTransferFrom',
    message: {
      permitted: { token: a.permitted.token, amount: BigInt(a.permitted.amount) }, spender: a.spender, nonce: BigInt(a.nonce),
      deadline: BigInt(a.deadline), witness: { to: a.witness.to, validAfter: BigInt(a.witness.validAfter) },
    },
  });
  await expectRefused(edit(body, (_, copy) => { copy.paymentPayload.payload.signature = otherDomain; }), 'invalid_exact_evm_payload_signature', payer);
  // A payer who never approved Permit2.
  const unapproved = await newPayer({ approve: false });
  await expectRefused(await signedBody(unapproved), 'permit2_allowance_required', unapproved, /approve/);
  // The token is served by Permit2 only: an ERC-3009 payload for it is refused.
  const eip3009 = toV2(await stack.pay({ account: payer, payTo, amount: BigInt(PRICE), token: { address: token, ...TEST_TOKEN_EIP712 } }), CHAIN_ID);
  for (const reqs of [eip3009.paymentRequirements, eip3009.paymentPayload.accepted]) reqs.extra = { ...TEST_TOKEN_EIP712 };
  await expectRefused(eip3009, 'invalid_payment_requirements', payer, /transfer_methods/);
  // Nothing of this moved the payer's funds, and the valid body still settles.
  assert.equal(await balanceOf(payer.address), FUNDS);
  expectSettled(await stack.settle(body), { network: NETWORK, payer: payer.address });
});

it("a payer's ERC-3009 and Permit2 payments of one token count against one balance", async () => {
  const payer = await newPayer({ asset: stack.usdc });
  const viaPermit2 = await signedBody(payer, { ...requirements(stack.usdc, USDC_EIP712), amount: String(FUNDS) });
  const viaEip3009 = (await stack.payV2({ account: payer, payTo, amount: FUNDS })).v2;
  const answers = await Promise.all([stack.settle(viaPermit2), stack.settle(viaEip3009)]);
  const succeeded = answers.filter((r) => r.body?.success === true);
  assert.equal(succeeded.length, 1, JSON.stringify(answers.map((r) => r.body)));
  const refused = answers.find((r) => r.body?.success !== true);
  assert.equal(refused.body.errorReason, 'insufficient_funds', JSON.stringify(refused.body));
  await waitFor(async () => (await balanceOf(payer.address, stack.usdc)) === 0n, { timeoutMs: 15_000, what: 'the one settlement mined' });
  assert.equal(await balanceOf(payTo, stack.usdc) >= FUNDS, true);
});

it('a rollback of the block that settled through Permit2 is survived: it mines again, once', async () => {
  const payer = await newPayer();
  const body = await signedBody(payer);
  const payeeBefore = await balanceOf(payTo);
  const hash = expectSettled(await stack.settle(body), { network: NETWORK, payer: payer.address });
  await rolledBackAndMinedAgain(stack, hash, async () => {
    assert.equal(await balanceOf(payer.address), FUNDS, 'precondition: the rollback gave the funds back');
  });
  assert.equal(await balanceOf(payer.address), FUNDS - BigInt(PRICE), 'the payer paid once');
  assert.equal(await balanceOf(payTo), payeeBefore + BigInt(PRICE), 'the payee was paid once');
  const nonce = await stack.signerNonce('pending');
  const again = await stack.settle(body);
  assert.equal(again.body.success, false, 'a replay is never a second success');
  assert.equal(again.body.transaction, hash);
  assert.equal(await stack.signerNonce('pending'), nonce, 'the replay sent nothing');
});

function uptoFetch(account) {
  const client = new x402Client().register(NETWORK, new UptoEvmClientScheme(account));
  client.setSpendControls({ allowedAssets: [{ network: NETWORK, asset: getAddress(token), maxAmountPerPayment: PRICE }] });
  return wrapFetchWithPayment(fetch, client);
}

it('upto: /supported names the facilitator address; @x402/fetch pays a metered @x402/express route, the server charges less than the permit, and exactly that moves', async () => {
  const supported = (await stack.request('/supported')).body;
  const upto = supported.kinds.filter((k) => k.scheme === 'upto');
  assert.deepEqual(upto, [{ x402Version: 2, scheme: 'upto', network: NETWORK, extra: { facilitatorAddress: getAddress(stack.signer) } }]);
  const payer = await newPayer();
  const payeeBefore = await balanceOf(payTo);
  const nonce = await stack.signerNonce('pending');
  const res = await uptoFetch(payer)(`${shopUrl}/compute`);
  const receipt = await expectDelivered(res, { wire: V2_WIRE, network: NETWORK, payer });
  assert.equal(receipt.amount, String(USED), 'the answer says what was charged');
  const mined = await stack.receipt(receipt.transaction);
  assert.equal(mined.status, 'success');
  assert.equal(getAddress(mined.to), getAddress(UPTO_PROXY));
  assert.equal(getAddress(mined.from), getAddress(stack.signer), 'sent from the advertised signer');
  assert.equal(await stack.signerNonce('pending'), nonce + 1, 'one transaction');
  assert.equal(await balanceOf(payer.address), FUNDS - USED, 'the payer paid what was used');
  assert.equal(await balanceOf(payTo), payeeBefore + USED);
});

it('upto: a zero charge is a success that sends nothing', async () => {
  const payer = await newPayer();
  const nonce = await stack.signerNonce('pending');
  const res = await uptoFetch(payer)(`${shopUrl}/idle`);
  const text = await res.text();
  assert.equal(res.status, 200, text);
  const receipt = decodePaymentResponseHeader(res.headers.get('payment-response'));
  assert.equal(receipt.success, true, JSON.stringify(receipt));
  assert.equal(receipt.transaction, '');
  assert.equal(await stack.signerNonce('pending'), nonce, 'nothing was sent');
  assert.equal(await balanceOf(payer.address), FUNDS);
});

/** The upto client's v2 body for a PRICE permit naming `facilitatorAddress`, charging `charge`. */
async function uptoBody(payer, { charge = PRICE, facilitatorAddress = stack.signer } = {}) {
  const reqs = { ...requirements(), scheme: 'upto', extra: { ...TEST_TOKEN_EIP712, facilitatorAddress: getAddress(facilitatorAddress) } };
  const partial = await new UptoEvmClientScheme(payer).createPaymentPayload(2, reqs);
  const charged = { ...reqs, amount: String(charge) };
  const paymentPayload = { ...partial, x402Version: 2, resource: { url: 'https://example.com/r', description: 'e2e', mimeType: 'application/json' }, accepted: charged };
  return { x402Version: 2, paymentPayload, paymentRequirements: charged };
}

it('upto: a charge over the permit, or a witness naming another facilitator, is refused with no transaction; verify wants the permit to be the maximum', async () => {
  const payer = await newPayer();
  // Verify checks the permit against the requirements' amount, the maximum (as @x402/evm does):
  // above it or below it, the permit is not the one asked for. Settle charges at most the permit.
  const over = await uptoBody(payer, { charge: BigInt(PRICE) + 1n });
  expectInvalid(await stack.verify(over), 'permit2_amount_mismatch', { payer: getAddress(payer.address) });
  const nonce = await stack.signerNonce('pending');
  expectSettleFailed(await stack.settle(over), 'invalid_upto_evm_payload_settlement_exceeds_amount', { network: NETWORK, payer: getAddress(payer.address) });
  assert.equal(await stack.signerNonce('pending'), nonce, 'nothing was sent');
  const under = await uptoBody(payer, { charge: USED });
  const verified = await stack.verify(under);
  expectInvalid(verified, 'permit2_amount_mismatch', { payer: getAddress(payer.address) });
  assert.match(verified.body.invalidMessage, /permitted\.amount is not paymentRequirements\.amount/);
  await expectRefused(await uptoBody(payer, { facilitatorAddress: freshAccount().address }), 'upto_facilitator_mismatch', payer, /facilitator/);
  const exact = await uptoBody(payer);
  exact.paymentPayload.payload.permit2Authorization.spender = EXACT_PROXY;
  await expectRefused(exact, 'invalid_permit2_spender', payer, /upto Permit2 proxy/);
  assert.equal(await balanceOf(payer.address), FUNDS);
});

it('a self-payment through Permit2 (from = payTo), exact or upto, is refused at verify and settle with no transaction', async () => {
  const payer = await newPayer();
  const own = getAddress(payer.address);
  const reason = 'invalid_exact_evm_payload_recipient_mismatch';
  await expectRefused(await signedBody(payer, { ...requirements(), payTo: own }), reason, payer, /self-payment/);
  const reqs = { ...requirements(), payTo: own, scheme: 'upto', extra: { ...TEST_TOKEN_EIP712, facilitatorAddress: getAddress(stack.signer) } };
  const partial = await new UptoEvmClientScheme(payer).createPaymentPayload(2, reqs);
  const paymentPayload = { ...partial, x402Version: 2, resource: { url: 'https://example.com/r', description: 'e2e', mimeType: 'application/json' }, accepted: reqs };
  await expectRefused({ x402Version: 2, paymentPayload, paymentRequirements: reqs }, reason, payer, /self-payment/);
  assert.equal(await balanceOf(payer.address), FUNDS);
});

/** @x402/evm's exact client reading the chain, so that it offers an EIP-2612 permit when needed. */
function sponsoredFetch(account) {
  const client = new x402Client().register(NETWORK, new ExactEvmClientScheme(account, { rpcUrl: stack.anvil.url }));
  client.setSpendControls({ allowedAssets: [{ network: NETWORK, asset: getAddress(token), maxAmountPerPayment: PRICE }] });
  return wrapFetchWithPayment(fetch, client);
}

/** A payer holding FUNDS of the token and no ETH, who never approved Permit2. */
async function gaslessPayer() {
  const payer = freshAccount();
  await mintTestToken(stack.client, token, payer.address, FUNDS);
  return payer;
}

it('eip2612GasSponsoring: /supported lists it, and a payer who never approved Permit2 pays through one settleWithPermit', async () => {
  const supported = (await stack.request('/supported')).body;
  assert.deepEqual(supported.extensions, ['payment-identifier', 'eip2612GasSponsoring', 'bazaar']);
  const payer = await gaslessPayer();
  const payeeBefore = await balanceOf(payTo);
  const nonce = await stack.signerNonce('pending');
  const res = await sponsoredFetch(payer)(`${shopUrl}/sponsored`);
  const receipt = await expectDelivered(res, { wire: V2_WIRE, network: NETWORK, payer });
  const mined = await stack.receipt(receipt.transaction);
  assert.equal(getAddress(mined.to), getAddress(EXACT_PROXY));
  assert.equal(await stack.signerNonce('pending'), nonce + 1, 'one transaction approves and pays');
  assert.equal(await stack.client.getBalance({ address: payer.address }), 0n, 'the payer spent no gas');
  assert.equal(await balanceOf(payer.address), FUNDS - BigInt(PRICE));
  assert.equal(await balanceOf(payTo), payeeBefore + BigInt(PRICE));
});

/** The official client's v2 body with its eip2612GasSponsoring extension, for a gasless payer. */
async function sponsoredBody(payer) {
  const reqs = requirements();
  const scheme = new ExactEvmClientScheme(payer, { rpcUrl: stack.anvil.url });
  const partial = await scheme.createPaymentPayload(2, reqs, { extensions: declareEip2612GasSponsoringExtension() });
  assert.ok(partial.extensions?.eip2612GasSponsoring?.info, 'the client signed an EIP-2612 permit');
  const paymentPayload = { ...partial, x402Version: 2, resource: { url: 'https://example.com/r', description: 'e2e', mimeType: 'application/json' }, accepted: reqs };
  return { x402Version: 2, paymentPayload, paymentRequirements: reqs };
}

it('eip2612GasSponsoring: a permit not for Permit2, not for the amount, or forged is refused at verify and settle, and nothing is sent', async () => {
  const payer = await gaslessPayer();
  const body = await sponsoredBody(payer);
  expectValid(await stack.verify(body), { payer: getAddress(payer.address) });
  const info = (b) => b.paymentPayload.extensions.eip2612GasSponsoring.info;
  const changed = (change) => { const copy = structuredClone(body); change(info(copy)); return copy; };
  await expectRefused(changed((i) => { i.spender = EXACT_PROXY; }), 'eip2612_spender_not_permit2', payer, /Permit2/);
  await expectRefused(changed((i) => { i.amount = '1'; }), 'permit2_2612_amount_mismatch', payer, /amount/);
  await expectRefused(changed((i) => { i.from = freshAccount().address; }), 'eip2612_from_mismatch', payer, /payer/);
  // A forged permit: verify tries it on the token in its one read (undone), as settle would submit it.
  const forged = changed((i) => { i.signature = `${i.signature.slice(0, 4)}${i.signature[4] === '0' ? '1' : '0'}${i.signature.slice(5)}`; });
  await expectRefused(forged, 'permit2_allowance_required', payer, /refuses the payment's EIP-2612 permit/);
  assert.equal(await balanceOf(payer.address), FUNDS);
  expectValid(await stack.verify(body), { payer: getAddress(payer.address) });
});

it('SIGKILL with the Permit2 settlement in the pool, and the chain losing it: after restart the stored transaction is sent again and pays once', async () => {
  const payer = await newPayer();
  const body = await signedBody(payer);
  const payeeBefore = await balanceOf(payTo);
  const key = idempotencyKey();
  const rpc = (method, params) => stack.anvil.rpc(method, params);
  let hash;
  await rpc('evm_setIntervalMining', [0]);
  try {
    const inflight = stack.settle(body, { key }).catch(() => null);
    const pooled = await waitFor(async () => Object.values(await pooledFrom(stack.anvil, stack.signer))[0], { timeoutMs: 15_000, what: 'the settlement in the pool' });
    hash = pooled.hash;
    await stack.routerd.kill();
    await inflight;
    await rpc('anvil_dropTransaction', [hash]);
    assert.equal(Object.keys(await pooledFrom(stack.anvil, stack.signer)).length, 0, 'precondition: the chain forgot it');
    await stack.routerd.restart();
    // The stored record holds the signed transaction: sending it again gives the same hash.
    await waitFor(async () => Object.values(await pooledFrom(stack.anvil, stack.signer)).some((t) => t.hash === hash), {
      timeoutMs: 15_000, what: 'the stored transaction sent again',
    });
  } finally {
    await rpc('evm_setIntervalMining', [1]);
  }
  let res = await stack.settle(body, { key });
  if (res.status === 400 && res.body?.error === 504) res = await stack.settle(body, { key });
  assert.equal(expectSettled(res, { network: NETWORK, payer: payer.address }), hash);
  assert.equal(await balanceOf(payer.address), FUNDS - BigInt(PRICE), 'the payer paid once');
  assert.equal(await balanceOf(payTo), payeeBefore + BigInt(PRICE));
});
