// POST /verify and GET /supported against real USDC on anvil: every row of the verify table in
// spec/x402-facilitator.md section 2, the order in which the rows apply, and the `payer` rule.
//
// This file runs twice. On its own, its nodes run eth_call state overrides, and verify reads the
// chain with one lens call. Imported by facilitator-verify-batch.test.mjs, its nodes ignore
// overrides, and verify reads with a batch of plain calls. Every rule must hold both ways.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { mintUsdc, usdcAbi } from './lib/deploy-usdc.mjs';
import { mutate, withV, highS, now, randomNonce } from './lib/x402.mjs';
import { expectValid, expectInvalid, expectSettled, expectSettleFailed, expectErrorBody } from './lib/expect.mjs';
import { startFilteringProxy } from './lib/bad-upstreams.mjs';

const READS = globalThis.VERIFY_READS ?? 'lens';

// A second served chain (its USDC lands at the same address: same deployer, same nonces) and a
// configured chain the facilitator does not serve.
const OTHER = { name: 'anvil-b', chainId: 31337, served: true, usdc: true };
const UNSERVED = { name: 'anvil-c', chainId: 31338, served: false, usdc: false };

const deniedPayer = freshAccount();
const deniedPayee = freshAccount().address;
const UINT256_OVERFLOW = (2n ** 256n).toString();

let stack;
let alice; // a funded payer shared by tests that only verify (verify never moves funds)
let signerNonceAtStart;
let settlements = 0; // settlements this file makes on purpose; verify itself must make none

const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

// Every chain is reached through a proxy that plays the node's support for state overrides and
// lists the upstream requests.
const proxies = {};

before(async () => {
  for (const name of [NETWORK, OTHER.name, UNSERVED.name]) {
    proxies[name] = await startFilteringProxy({ overrides: READS === 'lens' ? 'run' : 'ignore' });
  }
  stack = await startFacilitatorStack({
    extraChains: [OTHER, UNSERVED],
    // One entry in lower case: the deny list compares addresses, not spellings.
    denyList: [deniedPayer.address.toLowerCase(), deniedPayee],
    rpcUrlFor: (name, url) => {
      proxies[name].target = url;
      return proxies[name].url;
    },
  });
  alice = await stack.newPayer(1_000_000_000n);
  await stack.mint(deniedPayer.address, 1_000_000n);
  signerNonceAtStart = await stack.signerNonce();
});

after(async () => {
  await stack?.stop();
  await Promise.all(Object.values(proxies).map((p) => p.close()));
});

/** A valid payment from alice (or `account`) for 1000 atomic units; `auth` overrides signed fields. */
const payment = (opts = {}) => stack.pay({ account: alice, ...opts });
const verify = (body) => stack.verify(body);

// ---------------------------------------------------------------------------------------------
// GET /supported

it('GET /supported lists exactly one exact/v1 kind per served network', async () => {
  const res = await stack.request('/supported');
  assert.equal(res.status, 200, res.text);
  assert.ok(Array.isArray(res.body?.kinds), res.text);
  const kinds = res.body.kinds.map(({ x402Version, scheme, network }) => ({ x402Version, scheme, network }));
  const want = stack.servedNetworks.map((network) => ({ x402Version: 1, scheme: 'exact', network }));
  const byNetwork = (a, b) => a.network.localeCompare(b.network);
  assert.deepEqual(kinds.sort(byNetwork), want.sort(byNetwork));
});

// ---------------------------------------------------------------------------------------------
// The happy path and the things that must not make a payment invalid

it('a valid payment verifies, with the checksummed payer', async () => {
  const p = await payment();
  expectValid(await verify(p.body), { payer: alice.address });
});

it('verify is repeatable: the same payment verifies again', async () => {
  const p = await payment();
  expectValid(await verify(p.body), { payer: alice.address });
  expectValid(await verify(p.body), { payer: alice.address });
});

it('a lower-case from still verifies and payer comes back checksummed', async () => {
  const p = await payment();
  const body = mutate(p.body, (b) => { b.paymentPayload.payload.authorization.from = alice.address.toLowerCase(); });
  expectValid(await verify(body), { payer: alice.address });
});

it('authorization.to matches payTo case-insensitively', async () => {
  const p = await payment();
  const body = mutate(p.body, (b) => { b.paymentPayload.payload.authorization.to = p.authorization.to.toLowerCase(); });
  expectValid(await verify(body), { payer: alice.address });
});

it('extra may be omitted or empty: the configured EIP-712 domain applies', async () => {
  const p = await payment();
  expectValid(await verify(mutate(p.body, (b) => { delete b.paymentRequirements.extra; })));
  expectValid(await verify(mutate(p.body, (b) => { b.paymentRequirements.extra = {}; })));
});

it('validBefore well beyond the margin verifies', async () => {
  const p = await payment({ auth: { validBefore: BigInt(now() + 30) } });
  expectValid(await verify(p.body));
});

// ---------------------------------------------------------------------------------------------
// Row 1: x402Version

it('row 1: top-level x402Version 2 -> invalid_x402_version', async () => {
  const p = await payment();
  expectInvalid(await verify(mutate(p.body, (b) => { b.x402Version = 2; })), 'invalid_x402_version', { payer: alice.address });
});

it('row 1: paymentPayload.x402Version 2 -> invalid_x402_version', async () => {
  const p = await payment();
  expectInvalid(await verify(mutate(p.body, (b) => { b.paymentPayload.x402Version = 2; })), 'invalid_x402_version');
});

it('row 1: x402Version 0 -> invalid_x402_version', async () => {
  const p = await payment();
  expectInvalid(await verify(mutate(p.body, (b) => { b.x402Version = 0; b.paymentPayload.x402Version = 0; })), 'invalid_x402_version');
});

it('with the default x402_versions = [1], a v2 body is read as v1 as before: 400 naming its first v1 field', async () => {
  const p = await stack.payV2({ account: alice });
  for (const route of ['/verify', '/settle']) {
    expectErrorBody(await stack.post(route, p.v2), 400, { error: 400, messageIncludes: 'paymentPayload.scheme: missing' });
  }
  // Even a body that says x402Version 2 in v1's shapes is refused by rule 1, on settle too.
  const res = await stack.settle(mutate(p.body, (b) => { b.x402Version = 2; }));
  expectSettleFailed(res, 'invalid_x402_version', { network: NETWORK, payer: alice.address });
});

it('with the default x402_versions = [1], /supported has no v2 fields', async () => {
  const res = await stack.request('/supported');
  assert.deepEqual(Object.keys(res.body), ['kinds'], res.text);
});

it('order 1 before 2: wrong version and wrong scheme -> invalid_x402_version', async () => {
  const p = await payment();
  const body = mutate(p.body, (b) => {
    b.x402Version = 2;
    b.paymentPayload.scheme = 'upto';
    b.paymentRequirements.scheme = 'upto';
  });
  expectInvalid(await verify(body), 'invalid_x402_version');
});

// ---------------------------------------------------------------------------------------------
// Row 2: scheme

it('row 2: scheme "upto" on both sides -> invalid_scheme', async () => {
  const p = await payment();
  const body = mutate(p.body, (b) => { b.paymentPayload.scheme = 'upto'; b.paymentRequirements.scheme = 'upto'; });
  expectInvalid(await verify(body), 'invalid_scheme', { payer: alice.address });
});

it('row 2: schemes that differ -> invalid_scheme', async () => {
  const p = await payment();
  expectInvalid(await verify(mutate(p.body, (b) => { b.paymentRequirements.scheme = 'upto'; })), 'invalid_scheme');
  expectInvalid(await verify(mutate(p.body, (b) => { b.paymentPayload.scheme = 'EXACT'; })), 'invalid_scheme');
});

it('order 2 before 3: wrong scheme and unknown network -> invalid_scheme', async () => {
  const p = await payment();
  const body = mutate(p.body, (b) => {
    b.paymentPayload.scheme = 'upto';
    b.paymentRequirements.scheme = 'upto';
    b.paymentPayload.network = 'base';
    b.paymentRequirements.network = 'base';
  });
  expectInvalid(await verify(body), 'invalid_scheme');
});

// ---------------------------------------------------------------------------------------------
// Row 3: network

it('row 3: a network this daemon does not know -> invalid_network', async () => {
  const p = await payment({ network: 'base' });
  expectInvalid(await verify(p.body), 'invalid_network', { payer: alice.address });
});

it('row 3: a Solana payment on a cluster of no served family -> invalid_network, verify and settle', async () => {
  // No Solana cluster is configured here: a Solana-shaped v1 body naming one is refused as an
  // unserved network in Solana's words, not read in EVM shape and refused as a malformed body.
  const p = await payment();
  const body = mutate(p.body, (b) => {
    for (const part of [b.paymentPayload, b.paymentRequirements]) part.network = 'solana-testnet';
    b.paymentPayload.payload = { transaction: 'AA==' };
  });
  expectInvalid(await verify(body), 'invalid_network', { payer: '' });
  expectSettleFailed(await stack.settle(body), 'invalid_network', { network: 'solana-testnet', payer: '' });
});

it('row 3: payload and requirements networks differ -> invalid_network', async () => {
  const p = await payment();
  expectInvalid(await verify(mutate(p.body, (b) => { b.paymentRequirements.network = OTHER.name; })), 'invalid_network');
  expectInvalid(await verify(mutate(p.body, (b) => { b.paymentPayload.network = OTHER.name; })), 'invalid_network');
});

it('row 3: a configured chain that the facilitator does not serve -> invalid_network', async () => {
  const p = await payment({ network: UNSERVED.name, chainId: UNSERVED.chainId });
  expectInvalid(await verify(p.body), 'invalid_network');
});

it('order 3 before 4: unknown network and maxAmountRequired "0" -> invalid_network', async () => {
  const p = await payment({ network: 'base' });
  expectInvalid(await verify(mutate(p.body, (b) => { b.paymentRequirements.maxAmountRequired = '0'; })), 'invalid_network');
});

// ---------------------------------------------------------------------------------------------
// Row 4: requirements values

const badRequirements = {
  'maxAmountRequired "0"': (r) => { r.maxAmountRequired = '0'; },
  'maxAmountRequired in hex': (r) => { r.maxAmountRequired = '0x3e8'; },
  'maxAmountRequired negative': (r) => { r.maxAmountRequired = '-1000'; },
  'maxAmountRequired with a fraction': (r) => { r.maxAmountRequired = '1000.0'; },
  'maxAmountRequired above uint256': (r) => { r.maxAmountRequired = UINT256_OVERFLOW; },
  'resource over http': (r) => { r.resource = 'http://example.com/r'; },
  'resource shorter than 11 characters': (r) => { r.resource = 'https://a'; },
  'resource longer than 2048 characters': (r) => { r.resource = `https://example.com/${'a'.repeat(2030)}`; },
  'payTo not a 0x address': (r) => { r.payTo = 'not-an-address'; },
  'payTo too short': (r) => { r.payTo = '0x1234'; },
  'asset not a 0x address': (r) => { r.asset = 'usdc'; },
  'asset not a token configured for the network': (r) => { r.asset = freshAccount().address; },
  'maxTimeoutSeconds 0': (r) => { r.maxTimeoutSeconds = 0; },
  'maxTimeoutSeconds negative': (r) => { r.maxTimeoutSeconds = -5; },
  'extra.name differs from the token EIP-712 name': (r) => { r.extra.name = 'USDC'; },
  'extra.version differs from the token EIP-712 version': (r) => { r.extra.version = '1'; },
};

for (const [what, edit] of Object.entries(badRequirements)) {
  it(`row 4: ${what} -> invalid_payment_requirements`, async () => {
    const p = await payment();
    expectInvalid(await verify(mutate(p.body, (b) => edit(b.paymentRequirements))), 'invalid_payment_requirements', {
      payer: alice.address,
    });
  });
}

it('order 4 before 5: unconfigured asset and malformed nonce -> invalid_payment_requirements', async () => {
  const p = await payment();
  const body = mutate(p.body, (b) => {
    b.paymentRequirements.asset = freshAccount().address;
    b.paymentPayload.payload.authorization.nonce = '0x1234';
  });
  expectInvalid(await verify(body), 'invalid_payment_requirements');
});

// ---------------------------------------------------------------------------------------------
// Row 5: payload values

const badPayloads = {
  'signature not hex': (pl) => { pl.signature = `0x${'zz'.repeat(65)}`; },
  'signature without 0x': (pl) => { pl.signature = pl.signature.slice(2); },
  'to not an address': (pl) => { pl.authorization.to = '0xnot-an-address'; },
  'to without 0x': (pl) => { pl.authorization.to = pl.authorization.to.slice(2); },
  'value in hex': (pl) => { pl.authorization.value = '0x3e8'; },
  'value negative': (pl) => { pl.authorization.value = '-1000'; },
  'value with a plus sign': (pl) => { pl.authorization.value = '+1000'; },
  'value with a space': (pl) => { pl.authorization.value = ' 1000'; },
  'value empty': (pl) => { pl.authorization.value = ''; },
  'value above uint256': (pl) => { pl.authorization.value = UINT256_OVERFLOW; },
  'validAfter with a fraction': (pl) => { pl.authorization.validAfter = '1.5'; },
  'validBefore not a number': (pl) => { pl.authorization.validBefore = 'soon'; },
  'nonce too short': (pl) => { pl.authorization.nonce = '0x1234'; },
  'nonce without 0x': (pl) => { pl.authorization.nonce = `${pl.authorization.nonce.slice(2)}00`; },
  'nonce not hex': (pl) => { pl.authorization.nonce = `0x${'g'.repeat(64)}`; },
};

for (const [what, edit] of Object.entries(badPayloads)) {
  it(`row 5: ${what} -> invalid_payload`, async () => {
    const p = await payment();
    expectInvalid(await verify(mutate(p.body, (b) => edit(b.paymentPayload.payload))), 'invalid_payload', {
      payer: alice.address,
    });
  });
}

it('row 5: from not an address -> invalid_payload, payer is the string as sent', async () => {
  const p = await payment();
  for (const from of ['0x1234', alice.address.slice(2)]) {
    const body = mutate(p.body, (b) => { b.paymentPayload.payload.authorization.from = from; });
    expectInvalid(await verify(body), 'invalid_payload', { payer: from });
  }
});

it('order 5 before 6: malformed nonce from a denied payer -> invalid_payload', async () => {
  const p = await payment({ account: deniedPayer });
  expectInvalid(await verify(mutate(p.body, (b) => { b.paymentPayload.payload.authorization.nonce = '0x1234'; })), 'invalid_payload');
});

// ---------------------------------------------------------------------------------------------
// Rows 6-7: KYT (deny list, and the token's own blacklist)

it('row 6: from on the deny list -> ..._from_address_kyt', async () => {
  const p = await payment({ account: deniedPayer });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_from_address_kyt', {
    payer: deniedPayer.address,
  });
});

it('row 7: payTo on the deny list -> ..._to_address_kyt', async () => {
  const p = await payment({ payTo: deniedPayee });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_to_address_kyt');
});

it('order 6 before 7: from and payTo both denied -> ..._from_address_kyt', async () => {
  const p = await payment({ account: deniedPayer, payTo: deniedPayee });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_from_address_kyt');
});

it('order 7 before 9: denied payTo and a value too low -> ..._to_address_kyt', async () => {
  const p = await payment({ payTo: deniedPayee, auth: { value: 999n } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_to_address_kyt');
});

it('a self-payment (from = payTo) -> ..._typed_data_message at verify; three settles refused, no transaction, no gas', async () => {
  const reason = 'invalid_exact_evm_payload_authorization_typed_data_message';
  const p = await payment({ payTo: alice.address });
  const res = await verify(p.body);
  expectInvalid(res, reason, { payer: alice.address });
  assert.match(res.body.invalidMessage, /self-payment/);
  const nonce = await stack.signerNonce('pending');
  const gas = await stack.client.getBalance({ address: stack.signer });
  const usdc = await stack.balanceOf(alice.address);
  for (let i = 0; i < 3; i += 1) {
    expectSettleFailed(await stack.settle(p.body), reason, { network: NETWORK, payer: alice.address });
  }
  assert.equal(await stack.signerNonce('pending'), nonce, 'no transaction may be sent');
  assert.equal(await stack.client.getBalance({ address: stack.signer }), gas, 'the signer spends no gas');
  assert.equal(await stack.balanceOf(alice.address), usdc);
});

it('a read the node cannot run (not a revert) is no verdict: 400 {error: 502}, then valid once the node answers', async () => {
  const p = await payment();
  // Lens mode: the one lens call. Batch mode: only isBlacklisted, which a token without a
  // blacklist reverts (nobody blacklisted); a node error there must not read as "not blacklisted".
  const IS_BLACKLISTED = '0xfe575a87';
  proxies[NETWORK].state.failing = (c) => c?.method === 'eth_call'
    && (c.params.length > 2 || String(c.params[0]?.data).startsWith(IS_BLACKLISTED));
  let res;
  try {
    res = await verify(p.body);
  } finally {
    proxies[NETWORK].state.failing = null;
  }
  expectErrorBody(res, 400, { error: 502, messageIncludes: 'BlockOutOfRangeError' });
  expectValid(await verify(p.body), { payer: alice.address });
});

it('row 6: from blacklisted by the token -> ..._from_address_kyt', async () => {
  const payer = await stack.newPayer();
  const p = await stack.pay({ account: payer });
  expectValid(await verify(p.body)); // only the blacklist changes below
  await stack.blacklist(payer.address);
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_from_address_kyt', { payer: payer.address });
});

it('row 7: payTo blacklisted by the token -> ..._to_address_kyt', async () => {
  const payee = freshAccount().address;
  const p = await payment({ payTo: payee });
  expectValid(await verify(p.body));
  await stack.blacklist(payee);
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_to_address_kyt');
});

// ---------------------------------------------------------------------------------------------
// Row 8: authorization.to is payTo

it('row 8: authorization.to is not payTo -> ..._typed_data_message', async () => {
  const p = await payment({ auth: { to: freshAccount().address } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_typed_data_message', { payer: alice.address });
});

it('order 8 before 9: wrong recipient and a value too low -> ..._typed_data_message', async () => {
  const p = await payment({ auth: { to: freshAccount().address, value: 1n } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_typed_data_message');
});

// ---------------------------------------------------------------------------------------------
// Rows 9-10: exact means exact

it('row 9: value below maxAmountRequired -> ..._value_too_low', async () => {
  const p = await payment({ amount: 1000n, auth: { value: 999n } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_value_too_low', { payer: alice.address });
});

it('row 10: value above maxAmountRequired -> ..._authorization_value', async () => {
  const p = await payment({ amount: 1000n, auth: { value: 1001n } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_value');
});

it('order 9 before 11: value too low and validAfter in the future -> ..._value_too_low', async () => {
  const p = await payment({ auth: { value: 999n, validAfter: BigInt(now() + 300) } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_value_too_low');
});

it('order 10 before 11: value too high and already expired -> ..._authorization_value', async () => {
  const p = await payment({ auth: { value: 1001n, validBefore: BigInt(now() - 10) } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_value');
});

// ---------------------------------------------------------------------------------------------
// Row 11: time window

it('row 11a: validAfter in the future -> ..._valid_after', async () => {
  const p = await payment({ auth: { validAfter: BigInt(now() + 300) } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_valid_after', { payer: alice.address });
});

it('row 11b: validBefore within the 6 s margin -> ..._valid_before', async () => {
  const p = await payment({ auth: { validBefore: BigInt(now() + 2) } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_valid_before');
});

it('row 11b: validBefore in the past -> ..._valid_before', async () => {
  const p = await payment({ auth: { validBefore: BigInt(now() - 60) } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_valid_before');
});

it('order 11a before 11b: not yet valid and already expired -> ..._valid_after', async () => {
  const p = await payment({ auth: { validAfter: BigInt(now() + 300), validBefore: BigInt(now() - 60) } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_authorization_valid_after');
});

it('order 11 before 12: expired with a malformed signature -> ..._valid_before', async () => {
  const p = await payment({ auth: { validBefore: BigInt(now() - 60) } });
  const body = mutate(p.body, (b) => { b.paymentPayload.payload.signature = p.signature.slice(0, 130); });
  expectInvalid(await verify(body), 'invalid_exact_evm_payload_authorization_valid_before');
});

// ---------------------------------------------------------------------------------------------
// Row 12: signatures that are not a recoverable 65-byte ECDSA signature (EOA payer)

const badSignatures = {
  '64 bytes': (sig) => sig.slice(0, 130),
  '66 bytes': (sig) => `${sig}00`,
  'v = 29': (sig) => withV(sig, 0x1d),
  'high s (the malleable twin)': (sig) => highS(sig),
  'r = 0': (sig) => `0x${'0'.repeat(64)}${sig.slice(66)}`,
};

for (const [what, edit] of Object.entries(badSignatures)) {
  it(`row 12: signature ${what} -> invalid_exact_evm_payload_signature`, async () => {
    const p = await payment();
    const body = mutate(p.body, (b) => { b.paymentPayload.payload.signature = edit(p.signature); });
    expectInvalid(await verify(body), 'invalid_exact_evm_payload_signature', { payer: alice.address });
  });
}

it('order 12 before 16: malformed signature from an unfunded payer -> ..._signature', async () => {
  const p = await stack.pay({ account: freshAccount() });
  const body = mutate(p.body, (b) => { b.paymentPayload.payload.signature = p.signature.slice(0, 130); });
  expectInvalid(await verify(body), 'invalid_exact_evm_payload_signature');
});

// ---------------------------------------------------------------------------------------------
// Row 13: a valid signature by someone else (EOA payer)

it('row 13: signed by another key -> ..._signature_address, payer is from', async () => {
  const p = await payment({ account: freshAccount(), auth: { from: alice.address } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_signature_address', { payer: alice.address });
});

it('row 13: signed for another chain id -> ..._signature_address', async () => {
  const p = await payment({ chainId: 1 });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_signature_address');
});

it('row 13: signed under another EIP-712 name -> ..._signature_address', async () => {
  const p = await payment({ token: { ...stack.token, name: 'USDC' } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_signature_address');
});

it('row 13: authorization fields changed after signing -> ..._signature_address', async () => {
  const p = await payment();
  const edits = [
    (a) => { a.nonce = randomNonce(); },
    (a) => { a.validBefore = String(BigInt(a.validBefore) + 1n); },
    (a) => { a.validAfter = String(BigInt(a.validAfter) - 1n); },
  ];
  for (const edit of edits) {
    expectInvalid(await verify(mutate(p.body, (b) => edit(b.paymentPayload.payload.authorization))),
      'invalid_exact_evm_payload_signature_address');
  }
  const pricier = mutate(p.body, (b) => {
    b.paymentPayload.payload.authorization.value = '2000';
    b.paymentRequirements.maxAmountRequired = '2000';
  });
  expectInvalid(await verify(pricier), 'invalid_exact_evm_payload_signature_address');
});

it('row 13: a base-sepolia signature replayed on another network -> ..._signature_address', async () => {
  assert.equal(stack.chains[OTHER.name].usdc, stack.usdc, 'precondition: same USDC address on both chains');
  // Funded there too, so a daemon that ignored the chain id would answer isValid: true.
  await mintUsdc(stack.chains[OTHER.name].client, stack.usdc, alice.address, 1_000_000n);
  const p = await payment();
  const body = mutate(p.body, (b) => {
    b.paymentPayload.network = OTHER.name;
    b.paymentRequirements.network = OTHER.name;
  });
  expectInvalid(await verify(body), 'invalid_exact_evm_payload_signature_address');
});

it('order 13 before 16: signed by another key for an unfunded payer -> ..._signature_address', async () => {
  const p = await payment({ account: freshAccount(), auth: { from: freshAccount().address } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_signature_address');
});

// ---------------------------------------------------------------------------------------------
// Row 14: smart-wallet payers (ERC-1271)

it('row 14: smart wallet whose isValidSignature says yes passes the signature checks', async () => {
  const wallet = await stack.smartWallet({ valid: true });
  const owner = freshAccount(); // a 65-byte signature that recovers to someone else than the wallet
  const p = await payment({ account: owner, auth: { from: wallet } });
  expectInvalid(await verify(p.body), 'insufficient_funds', { payer: wallet }); // passes 12-15, stops at 16

  await stack.mint(wallet, 1_000_000n);
  expectValid(await verify(p.body), { payer: wallet });
  const shortSig = mutate(p.body, (b) => { b.paymentPayload.payload.signature = '0xc0ffee'; });
  expectValid(await verify(shortSig), { payer: wallet }); // no 65-byte rule for contracts
});

it('row 14: smart wallet whose isValidSignature says no -> invalid_exact_evm_payload_signature', async () => {
  const wallet = await stack.smartWallet({ valid: false });
  await stack.mint(wallet, 1_000_000n);
  const p = await payment({ account: freshAccount(), auth: { from: wallet } });
  expectInvalid(await verify(p.body), 'invalid_exact_evm_payload_signature', { payer: wallet });
});

// ---------------------------------------------------------------------------------------------
// Rows 15-16: on-chain state

it('row 15: a settled authorization -> invalid_payload; verify before it reserved nothing', async () => {
  const payer = await stack.newPayer(1000n); // exactly the price: after settling the balance is 0
  const p = await stack.pay({ account: payer, amount: 1000n });
  expectValid(await verify(p.body));
  expectValid(await verify(p.body));
  expectSettled(await stack.settle(p.body), { network: NETWORK, payer: payer.address });
  settlements += 1;
  // Nonce used and balance now 0: row 15 comes before row 16.
  const res = await verify(p.body);
  expectInvalid(res, 'invalid_payload', { payer: payer.address });
  assert.equal(res.body.invalidMessage, 'authorization already settled', 'the nonce is claimed by its settlement (spec/access.md section 1)');
});

it('row 15: an authorization cancelled on chain -> invalid_payload', async () => {
  const p = await payment();
  expectValid(await verify(p.body));
  await stack.cancelAuthorization(alice, p.authorization.nonce);
  expectInvalid(await verify(p.body), 'invalid_payload', { payer: alice.address });
});

it('row 16: balance one unit short -> insufficient_funds', async () => {
  const payer = await stack.newPayer(999n);
  const p = await stack.pay({ account: payer, amount: 1000n });
  expectInvalid(await verify(p.body), 'insufficient_funds', { payer: payer.address });
});

it('row 16: no balance at all -> insufficient_funds', async () => {
  const payer = freshAccount();
  const p = await stack.pay({ account: payer });
  expectInvalid(await verify(p.body), 'insufficient_funds', { payer: getAddress(payer.address) });
});

// ---------------------------------------------------------------------------------------------

it('verify never sent a transaction (signer nonce moved only for the deliberate settlement)', async () => {
  assert.equal(await stack.signerNonce('pending'), signerNonceAtStart + settlements);
});

// ---------------------------------------------------------------------------------------------
// Upstream reads: how many, and in which mode

/** The upstream requests verify made while `fn` ran (head polls and lane reads left out). */
async function verifyReads(fn) {
  const log = proxies[NETWORK].state.requests;
  const from = log.length;
  await fn();
  return log.slice(from).filter((methods) => methods.some((m) => m === 'eth_call' || m === 'eth_getCode'));
}

it(`/ready names the read mode of every chain (${READS})`, async () => {
  const res = await stack.request('/ready');
  assert.equal(res.status, 200, res.text);
  // The unserved chain is configured but used by nothing, so routerd never connects to it.
  assert.deepEqual(res.body.readModes, { [NETWORK]: READS, [OTHER.name]: READS });
});

it(`each verify is one upstream request: ${READS === 'lens' ? 'one eth_call' : 'five plain reads, no block read'}`, async () => {
  const bodies = await Promise.all(Array.from({ length: 4 }, () => payment()));
  const wallet = await stack.smartWallet({ valid: true });
  await stack.mint(wallet, 1_000_000n);
  const smart = await payment({ account: freshAccount(), auth: { from: wallet } });
  const reads = await verifyReads(async () => {
    for (const p of bodies) expectValid(await verify(p.body));
    expectValid(await verify(smart.body), { payer: wallet }); // ERC-1271 rides in the same request
  });
  const want = READS === 'lens'
    ? [...bodies.map(() => ['eth_call']), ['eth_call']]
    : [...bodies.map(() => ['eth_getCode', 'eth_call', 'eth_call', 'eth_call', 'eth_call']),
      ['eth_getCode', 'eth_call', 'eth_call', 'eth_call', 'eth_call', 'eth_call']];
  assert.deepEqual(reads, want);
});

it(`verifies ready at the same moment each get their own verdict${READS === 'lens' ? ', several of them in one lens eth_call' : ''}`, async () => {
  const poor = await stack.newPayer(999n);
  const cancelled = await payment();
  await stack.cancelAuthorization(alice, cancelled.authorization.nonce);
  const yes = await stack.smartWallet({ valid: true });
  const no = await stack.smartWallet({ valid: false });
  await stack.mint(yes, 1_000_000n);
  await stack.mint(no, 1_000_000n);
  const cases = [
    ...(await Promise.all(Array.from({ length: 6 }, () => payment()))).map((p) => [p, null, alice.address]),
    [await stack.pay({ account: poor, amount: 1000n }), 'insufficient_funds', poor.address],
    [cancelled, 'invalid_payload', alice.address],
    [await payment({ account: freshAccount(), auth: { from: yes } }), null, yes],
    [await payment({ account: freshAccount(), auth: { from: no } }), 'invalid_exact_evm_payload_signature', no],
  ];
  // The node answers slowly, so that the verifies after the first wait for company while it
  // is under way.
  proxies[NETWORK].state.delayMs = 300;
  let answers;
  const reads = await verifyReads(async () => {
    answers = await Promise.all(cases.map(([p]) => verify(p.body)));
  }).finally(() => { proxies[NETWORK].state.delayMs = 0; });
  cases.forEach(([, reason, payer], i) => {
    if (reason) expectInvalid(answers[i], reason, { payer });
    else expectValid(answers[i], { payer });
  });
  const calls = reads.flat().filter((m) => m === 'eth_call').length;
  if (READS === 'lens') {
    // One eth_call each would be as many calls as verifies: several went in one factsEach.
    assert.ok(calls < cases.length, `${calls} eth_calls for ${cases.length} verifies: ${JSON.stringify(reads)}`);
  }
});

it('a payer\'s wallet that burns its gas does not starve the verifies read in the same call', async () => {
  // Two "wallets" whose code loops until its gas is gone: ERC-1271 asks them, and each takes
  // what its frame has. Read in one call after them, the others still get their facts there.
  const burners = [freshAccount().address, freshAccount().address];
  for (const burner of burners) await stack.anvil.rpc('anvil_setCode', [burner, '0x5b600056']);
  const honest = await Promise.all(Array.from({ length: 6 }, () => payment()));
  const burning = await Promise.all(burners.map((from) => payment({ account: freshAccount(), auth: { from } })));
  const bodies = [honest[0], ...burning, ...honest.slice(1)];
  const proxy = proxies[NETWORK].state;
  proxy.delayMs = 300;
  const lensCallsBefore = proxy.overridden;
  let answers;
  const reads = await verifyReads(async () => {
    answers = await Promise.all(bodies.map((p) => verify(p.body)));
  }).finally(() => { proxy.delayMs = 0; });
  bodies.forEach((p, i) => {
    // A burner's wallet did not accept the signature: in the shared call its frame ran out, and
    // read again in plain reads (as in batch mode) its isValidSignature call halted. The payer
    // wrote that code, so a halt is its wallet's answer, not a node failing (no 502).
    if (burning.includes(p)) expectInvalid(answers[i], 'invalid_exact_evm_payload_signature', { payer: getAddress(p.authorization.from) });
    else expectValid(answers[i], { payer: alice.address });
  });
  if (READS === 'lens') {
    // Each burner's wallet used its share up: only those two verifies are read again, in plain
    // reads (eth_getCode first). Starved asks after them would be read again too, or the
    // shared call would fail as a whole and every verify in it be asked again on its own.
    const again = reads.flat().filter((m) => m === 'eth_getCode').length;
    assert.ok(again <= burners.length, `${again} verifies read again: ${JSON.stringify(reads)}`);
    const lensCalls = proxy.overridden - lensCallsBefore;
    assert.ok(lensCalls < bodies.length, `${lensCalls} lens calls for ${bodies.length} verifies: ${JSON.stringify(reads)}`);
  }
});

// ---------------------------------------------------------------------------------------------
// Settle's chain read: the same read, and the settlement transaction tried in the same request

/** The upstream requests a settle made for its chain read and trial while `fn` ran. */
async function settleReads(fn) {
  const log = proxies[NETWORK].state.requests;
  const from = log.length;
  await fn();
  const read = new Set(['eth_call', 'eth_getCode', 'eth_estimateGas']);
  return log.slice(from).filter((methods) => methods.some((m) => read.has(m)));
}

it(`settle reads and tries the settlement in one upstream request: ${READS === 'lens' ? 'the one lens eth_call, no eth_estimateGas once the trial is known to give the gas' : 'the plain reads and eth_estimateGas'}`, async () => {
  // The first settlement on a network also asks eth_estimateGas, in the same request, to learn
  // whether the lens's trial gives this chain's gas; anvil's is plain EVM gas, so it does.
  for (const round of [1, 2]) {
    const p = await payment();
    const reads = await settleReads(async () => {
      expectSettled(await stack.settle(p.body), { network: NETWORK, payer: alice.address });
    });
    settlements += 1;
    if (round === 1) continue;
    const want = READS === 'lens'
      ? [['eth_call']]
      : [['eth_getCode', 'eth_call', 'eth_call', 'eth_call', 'eth_call', 'eth_estimateGas']];
    assert.deepEqual(reads, want);
  }
  if (READS === 'lens') {
    const log = readFileSync(stack.routerd.logFile, 'utf8');
    assert.match(log, new RegExp(`settlement gas source network=${NETWORK} tried=\\d+ estimated=\\d+ source=Trial`), 'the calibration line');
  }
});

it('the gas limit routerd signs covers what anvil estimates for the same call at the block before, for an EOA and a smart-wallet payer', async () => {
  const wallet = await stack.smartWallet({ valid: true });
  await stack.mint(wallet, 1_000_000n);
  // A payee that holds nothing yet: its balance slot goes from zero, the dearest transfer.
  for (const p of [await payment({ payTo: freshAccount().address }), await payment({ account: freshAccount(), auth: { from: wallet } })]) {
    const hash = expectSettled(await stack.settle(p.body), { network: NETWORK, payer: getAddress(p.authorization.from) });
    settlements += 1;
    const rpc = (method, params) => stack.anvil.rpc(method, params);
    const tx = await rpc('eth_getTransactionByHash', [hash]);
    const receipt = await stack.receipt(hash);
    assert.equal(receipt.status, 'success', hash);
    const before = `0x${(BigInt(tx.blockNumber) - 1n).toString(16)}`;
    const estimate = BigInt(await rpc('eth_estimateGas', [{ from: tx.from, to: tx.to, data: tx.input }, before]));
    const limit = BigInt(tx.gas);
    assert.ok(limit >= estimate, `gas limit ${limit} below anvil's estimate ${estimate}`);
    assert.ok(limit <= (estimate * 3n) / 2n, `gas limit ${limit} far above anvil's estimate ${estimate}`);
    assert.ok(receipt.gasUsed <= limit, `gas used ${receipt.gasUsed} above the limit ${limit}`);
  }
});

it('a settlement the token would revert though every read passes (USDC paused): invalid_payload naming the revert, nothing sent; it settles once unpaused', async () => {
  const p = await payment();
  const pause = async (functionName) => {
    const hash = await stack.client.writeContract({ address: stack.usdc, abi: usdcAbi, functionName, gas: 200_000n });
    assert.equal((await stack.client.waitForTransactionReceipt({ hash })).status, 'success', functionName);
  };
  const nonce = await stack.signerNonce('pending');
  await pause('pause');
  try {
    const res = await stack.settle(p.body);
    expectSettleFailed(res, 'invalid_payload', { network: NETWORK, payer: alice.address });
    assert.match(res.body.errorMessage, /would revert: (execution reverted: )?Pausable: paused/, res.text);
    assert.equal(await stack.signerNonce('pending'), nonce, 'no transaction may be sent');
  } finally {
    await pause('unpause');
  }
  expectSettled(await stack.settle(p.body), { network: NETWORK, payer: alice.address });
  settlements += 1;
});

if (READS === 'lens') {
  it('a node that stops running overrides: verify still answers right, then reads in batch mode', async () => {
    proxies[NETWORK].state.overrides = 'ignore';
    try {
      expectValid(await verify((await payment()).body));
      const short = await stack.pay({ account: await stack.newPayer(999n), amount: 1000n });
      expectInvalid(await verify(short.body), 'insufficient_funds');
      const res = await stack.request('/ready');
      assert.equal(res.body.readModes[NETWORK], 'batch', res.text);
      assert.equal(res.body.readModes[OTHER.name], 'lens', res.text);
    } finally {
      proxies[NETWORK].state.overrides = 'run';
    }
  });
}
