// x402 v2 beside v1 (facilitator.x402_versions = [1, 2]) against real USDC on anvil: /supported,
// every v2 verify and settle rule in v2's names, v2 shape errors, and v1 and v2 traffic on one
// daemon sharing one ledger (a payment settled in one version is told the same transaction in the
// other, as a failure in that version's names: one success per payment, spec/access.md section 1).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK, CHAIN_ID } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { mutate, now, randomNonce } from './lib/x402.mjs';
import {
  expectValid, expectInvalid, expectSettled, expectSettledResult, expectSettleFailed, expectErrorBody,
  expectDuplicate, expectClaimedOnVerify, show,
} from './lib/expect.mjs';

const CAIP2 = `eip155:${CHAIN_ID}`;
// A second served chain, so that a v2 name must pick the right one by chain id.
const OTHER = { name: 'anvil-b', chainId: 31337, served: true, usdc: true };

const deniedPayer = freshAccount();
const deniedPayee = freshAccount().address;

let stack;
let alice; // a funded payer for payments that are only verified
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    extraChains: [OTHER],
    denyList: [deniedPayer.address, deniedPayee],
    routerd: { x402Versions: [1, 2] },
  });
  alice = await stack.newPayer(1_000_000_000n);
  await stack.mint(deniedPayer.address, 1_000_000n);
});

after(() => stack?.stop());

/** A valid payment from alice (or `account`); `.v2` is its v2 body, `.body` its v1 body. */
const payment = (opts = {}) => stack.payV2({ account: alice, ...opts });
/** The v2 body of a valid payment with `edit` applied. */
const v2With = async (edit, opts) => mutate((await payment(opts)).v2, edit);
const both = (b, f) => { f(b.paymentPayload.accepted); f(b.paymentRequirements); };

// ---------------------------------------------------------------------------------------------
// GET /supported

it('GET /supported lists v1 kinds by name and v2 kinds by CAIP-2 id, with extensions and signers', async () => {
  const res = await stack.request('/supported');
  assert.equal(res.status, 200, res.text);
  const kinds = res.body.kinds.map(({ x402Version, scheme, network }) => `${x402Version} ${scheme} ${network}`);
  assert.deepEqual(kinds.sort(), [
    `1 exact ${NETWORK}`, `1 exact ${OTHER.name}`, `2 exact ${CAIP2}`, `2 exact eip155:${OTHER.chainId}`,
  ].sort());
  assert.deepEqual(res.body.extensions, ['payment-identifier', 'bazaar']);
  assert.deepEqual(res.body.signers, { 'eip155:*': [getAddress(stack.signer)] });
});

// ---------------------------------------------------------------------------------------------
// Verify: v2's rules, then the engine's, in v2's reason names

it('a valid v2 payment verifies, with the checksummed payer', async () => {
  const p = await payment();
  expectValid(await stack.verify(p.v2), { payer: alice.address });
});

it('the top-level x402Version may be left out (as in the spec examples)', async () => {
  const p = await payment();
  expectValid(await stack.verify(mutate(p.v2, (b) => { delete b.x402Version; })), { payer: alice.address });
});

it('a v2 payment on the second chain is judged on that chain (eip155:31337)', async () => {
  const p = await stack.payV2({ account: alice, network: OTHER.name, chainId: OTHER.chainId });
  // alice has no funds on the second chain: the chain read happened there.
  expectInvalid(await stack.verify(p.v2), 'insufficient_funds', { payer: alice.address });
});

it('v2 rule 1: paymentPayload.x402Version 1 inside a v2 body -> invalid_x402_version', async () => {
  expectInvalid(await stack.verify(await v2With((b) => { b.paymentPayload.x402Version = 1; })), 'invalid_x402_version');
});

it('v2 rule 1: paymentPayload.x402Version 3 -> invalid_x402_version', async () => {
  expectInvalid(await stack.verify(await v2With((b) => { b.paymentPayload.x402Version = 3; })), 'invalid_x402_version');
});

it('v2 rule 1 before 2: wrong payload version and scheme -> invalid_x402_version', async () => {
  const body = await v2With((b) => { b.paymentPayload.x402Version = 3; both(b, (r) => { r.scheme = 'upto'; }); });
  expectInvalid(await stack.verify(body), 'invalid_x402_version');
});

it('v2 rule 2: a scheme routerd does not serve ("deferred") -> invalid_scheme', async () => {
  expectInvalid(await stack.verify(await v2With((b) => both(b, (r) => { r.scheme = 'deferred'; }))), 'invalid_scheme');
});

it('v2: scheme "upto" with an ERC-3009 payload -> invalid_payload (upto is paid through Permit2)', async () => {
  const res = await stack.verify(await v2With((b) => both(b, (r) => { r.scheme = 'upto'; })));
  expectInvalid(res, 'invalid_payload');
  assert.match(res.body.invalidMessage, /Permit2/);
});

it('v2 rule 2: accepted and requirements schemes differ -> invalid_scheme', async () => {
  expectInvalid(await stack.verify(await v2With((b) => { b.paymentPayload.accepted.scheme = 'upto'; })), 'invalid_scheme');
});

it('v2 rule 2 before 3: wrong scheme and unknown network -> invalid_scheme', async () => {
  const body = await v2With((b) => both(b, (r) => { r.scheme = 'deferred'; r.network = 'eip155:1'; }));
  expectInvalid(await stack.verify(body), 'invalid_scheme');
});

it('v2 rule 3: a chain id not served -> invalid_network', async () => {
  expectInvalid(await stack.verify(await v2With((b) => both(b, (r) => { r.network = 'eip155:1'; }))), 'invalid_network');
});

it('v2 rule 3: the configured v1 name is not a v2 network -> invalid_network', async () => {
  expectInvalid(await stack.verify(await v2With((b) => both(b, (r) => { r.network = NETWORK; }))), 'invalid_network');
});

it('v2 rule 3: a CAIP-2 id with a leading zero -> invalid_network', async () => {
  const body = await v2With((b) => both(b, (r) => { r.network = `eip155:0${CHAIN_ID}`; }));
  expectInvalid(await stack.verify(body), 'invalid_network');
});

it('v2 rule 3: accepted and requirements networks differ -> invalid_network', async () => {
  const body = await v2With((b) => { b.paymentPayload.accepted.network = `eip155:${OTHER.chainId}`; });
  expectInvalid(await stack.verify(body), 'invalid_network');
});

it('v2 rule 3 before 4: unknown network and accepted amount differing -> invalid_network', async () => {
  const body = await v2With((b) => { both(b, (r) => { r.network = 'eip155:1'; }); b.paymentPayload.accepted.amount = '1'; });
  expectInvalid(await stack.verify(body), 'invalid_network');
});

for (const [field, value] of [['amount', '999'], ['asset', () => freshAccount().address], ['payTo', () => freshAccount().address]]) {
  it(`v2 rule 4: accepted.${field} differs from the requirements -> invalid_payment_requirements`, async () => {
    const body = await v2With((b) => { b.paymentPayload.accepted[field] = typeof value === 'function' ? value() : value; });
    const res = await stack.verify(body);
    expectInvalid(res, 'invalid_payment_requirements');
    assert.match(res.body.invalidMessage, new RegExp(`accepted\\.${field}`));
  });
}

it('v2 rule 4: accepted may spell addresses in another case and carry other extra fields', async () => {
  const body = await v2With((b) => {
    const a = b.paymentPayload.accepted;
    a.payTo = a.payTo.toLowerCase();
    a.asset = a.asset.toLowerCase();
    a.extra = { ...a.extra, somethingDynamic: 1 };
  });
  expectValid(await stack.verify(body), { payer: alice.address });
});

it('v2 rule 4: no paymentPayload.resource -> invalid_payment_requirements', async () => {
  expectInvalid(await stack.verify(await v2With((b) => { delete b.paymentPayload.resource; })), 'invalid_payment_requirements');
});

it('v2 rule 4: an http:// resource is refused by default -> invalid_payment_requirements naming resource.url', async () => {
  const body = await v2With((b) => { b.paymentPayload.resource.url = 'http://127.0.0.1:4021/weather'; });
  const res = await stack.verify(body);
  expectInvalid(res, 'invalid_payment_requirements');
  assert.match(res.body.invalidMessage, /paymentPayload\.resource\.url/);
});

it('engine rule 4: an asset not configured for the network -> invalid_payment_requirements', async () => {
  const asset = freshAccount().address;
  const body = await v2With((b) => both(b, (r) => { r.asset = asset; }));
  expectInvalid(await stack.verify(body), 'invalid_payment_requirements');
});

it('engine rule 4: amount "0" -> invalid_payment_requirements', async () => {
  expectInvalid(await stack.verify(await v2With((b) => both(b, (r) => { r.amount = '0'; }))), 'invalid_payment_requirements');
});

it('engine rule 5: a malformed nonce -> invalid_payload', async () => {
  const body = await v2With((b) => { b.paymentPayload.payload.authorization.nonce = '0x1234'; });
  expectInvalid(await stack.verify(body), 'invalid_payload');
});

it('engine rule 6: payer on the deny list -> invalid_payload (v2 has no KYT reason)', async () => {
  const p = await stack.payV2({ account: deniedPayer });
  const res = await stack.verify(p.v2);
  expectInvalid(res, 'invalid_payload', { payer: deniedPayer.address });
  assert.match(res.body.invalidMessage, /deny list/);
});

it('engine rule 7: payTo on the deny list -> invalid_payment_requirements', async () => {
  const p = await payment({ payTo: deniedPayee });
  expectInvalid(await stack.verify(p.v2), 'invalid_payment_requirements');
});

it('engine rule 8: authorization.to is not payTo -> invalid_exact_evm_payload_recipient_mismatch', async () => {
  const p = await payment({ auth: { to: freshAccount().address } });
  expectInvalid(await stack.verify(p.v2), 'invalid_exact_evm_payload_recipient_mismatch');
});

it('a self-payment (from = payTo) -> invalid_exact_evm_payload_recipient_mismatch; settles refused unsent, kept out of the catalogue', async () => {
  const reason = 'invalid_exact_evm_payload_recipient_mismatch';
  const p = await payment({ payTo: alice.address });
  const res = await stack.verify(p.v2);
  expectInvalid(res, reason, { payer: alice.address });
  assert.match(res.body.invalidMessage, /authorization\.from is paymentRequirements\.payTo: a self-payment/);
  const nonce = await stack.signerNonce('pending');
  const gas = await stack.client.getBalance({ address: stack.signer });
  for (let i = 0; i < 3; i += 1) {
    expectSettleFailed(await stack.settle(p.v2), reason, { network: CAIP2, payer: alice.address });
  }
  assert.equal(await stack.signerNonce('pending'), nonce, 'no transaction may be sent');
  assert.equal(await stack.client.getBalance({ address: stack.signer }), gas, 'the signer spends no gas');
  const catalogue = await stack.request('/discovery/resources');
  assert.equal(catalogue.status, 200, catalogue.text);
  assert.ok(!catalogue.text.toLowerCase().includes(alice.address.toLowerCase()), catalogue.text);
});

it('engine rules 9 and 10: value below or above the amount -> invalid_exact_evm_payload_authorization_value', async () => {
  for (const value of [999n, 1001n]) {
    const p = await payment({ amount: 1000n, auth: { value } });
    expectInvalid(await stack.verify(p.v2), 'invalid_exact_evm_payload_authorization_value');
  }
});

it('engine rule 11a: validAfter in the future -> invalid_exact_evm_payload_authorization_valid_after', async () => {
  const p = await payment({ auth: { validAfter: BigInt(now() + 600) } });
  expectInvalid(await stack.verify(p.v2), 'invalid_exact_evm_payload_authorization_valid_after');
});

it('engine rule 11b: validBefore in the past -> invalid_exact_evm_payload_authorization_valid_before', async () => {
  const p = await payment({ auth: { validBefore: BigInt(now() - 1) } });
  expectInvalid(await stack.verify(p.v2), 'invalid_exact_evm_payload_authorization_valid_before');
});

it('engine rules 12 and 13: malformed or foreign signature -> invalid_exact_evm_payload_signature', async () => {
  const p = await payment();
  const short = mutate(p.v2, (b) => { b.paymentPayload.payload.signature = p.signature.slice(0, 130); });
  expectInvalid(await stack.verify(short), 'invalid_exact_evm_payload_signature');
  const foreign = await stack.payV2({ account: freshAccount(), auth: { from: alice.address } });
  expectInvalid(await stack.verify(foreign.v2), 'invalid_exact_evm_payload_signature', { payer: alice.address });
});

it('engine rule 16: no balance -> insufficient_funds', async () => {
  const broke = freshAccount();
  const p = await stack.payV2({ account: broke });
  expectInvalid(await stack.verify(p.v2), 'insufficient_funds', { payer: broke.address });
});

// ---------------------------------------------------------------------------------------------
// Shapes: HTTP 400 with the Error body naming the field

for (const [what, edit, field] of [
  ['requirements without amount', (b) => { delete b.paymentRequirements.amount; }, 'paymentRequirements.amount: missing'],
  ['payload without accepted', (b) => { delete b.paymentPayload.accepted; }, 'paymentPayload.accepted: missing'],
  ['accepted as an array', (b) => { b.paymentPayload.accepted = [b.paymentPayload.accepted]; }, 'paymentPayload.accepted: invalid type'],
  ['resource as a string', (b) => { b.paymentPayload.resource = 'https://x.example'; }, 'paymentPayload.resource: invalid type'],
  ['resource without url', (b) => { delete b.paymentPayload.resource.url; }, 'paymentPayload.resource.url: missing'],
  ['amount as a number', (b) => { b.paymentRequirements.amount = 1000; }, 'paymentRequirements.amount: invalid type'],
  ['nonce missing', (b) => { delete b.paymentPayload.payload.authorization.nonce; }, 'paymentPayload.payload.authorization.nonce: missing'],
  ['extensions as an array', (b) => { b.paymentPayload.extensions = []; }, 'paymentPayload.extensions: invalid type'],
]) {
  it(`v2 shape: ${what} -> 400 naming ${field.split(':')[0]}`, async () => {
    const body = await v2With(edit);
    expectErrorBody(await stack.verify(body), 400, { error: 400, messageIncludes: field });
    expectErrorBody(await stack.settle(body), 400, { error: 400, messageIncludes: field });
  });
}

// ---------------------------------------------------------------------------------------------
// Settle: v2 names and network, one ledger for both versions

/** `n` payers with 5000 units each (one mint after another: the deployer's nonce is shared). */
async function newPayers(n) {
  const payers = [];
  for (let i = 0; i < n; i += 1) payers.push(await stack.newPayer(5000n));
  return payers;
}

async function expectNothingSent(fn) {
  const nonce = await stack.signerNonce('pending');
  await fn();
  assert.equal(await stack.signerNonce('pending'), nonce, 'no transaction may be sent');
}

it('settle refuses in v2 names with the CAIP-2 network, sending nothing (one rule of each layer)', async () => {
  const payer = await stack.newPayer();
  const cases = [
    ['invalid_x402_version', (b) => { b.paymentPayload.x402Version = 1; }, CAIP2],
    ['invalid_network', (b) => both(b, (r) => { r.network = 'eip155:1'; }), 'eip155:1'],
    ['invalid_payment_requirements', (b) => { b.paymentPayload.accepted.amount = '1'; }, CAIP2],
    ['invalid_exact_evm_payload_signature', (b) => { b.paymentPayload.payload.signature = '0x1234'; }, CAIP2],
  ];
  await expectNothingSent(async () => {
    for (const [reason, edit, network] of cases) {
      const res = await stack.settle(await v2With(edit, { account: payer }));
      expectSettleFailed(res, reason, { network, payer: payer.address });
    }
    const low = await stack.payV2({ account: payer, amount: 1000n, auth: { value: 999n } });
    expectSettleFailed(await stack.settle(low.v2), 'invalid_exact_evm_payload_authorization_value', { network: CAIP2, payer: payer.address });
    const broke = freshAccount();
    const poor = await stack.payV2({ account: broke });
    expectSettleFailed(await stack.settle(poor.v2), 'insufficient_funds', { network: CAIP2, payer: broke.address });
  });
});

it('a v2 settle moves the funds and answers the CAIP-2 network; a v2 replay is told the same transaction as invalid_exact_evm_nonce_already_used', async () => {
  const payer = await stack.newPayer(5000n);
  const p = await stack.payV2({ account: payer });
  const nonce = await stack.signerNonce('pending');
  const hash = expectSettled(await stack.settle(p.v2), { network: CAIP2, payer: payer.address });
  assert.equal((await stack.receipt(hash)).status, 'success');
  assert.equal(await stack.balanceOf(payer.address), 4000n);
  expectDuplicate(await stack.settle(p.v2), { transaction: hash, network: CAIP2, payer: payer.address, version: 2 });
  assert.equal(await stack.signerNonce('pending'), nonce + 1, 'one transaction');
});

it('a v1 replay of a v2 payment is told the same transaction, in v1 shape and names', async () => {
  const payer = await stack.newPayer(5000n);
  const p = await stack.payV2({ account: payer });
  const nonce = await stack.signerNonce('pending');
  const hash = expectSettled(await stack.settle(p.v2), { network: CAIP2, payer: payer.address });
  expectDuplicate(await stack.settle(p.body), { transaction: hash, network: NETWORK, payer: payer.address, version: 1 });
  const status = await stack.settlementStatus(p);
  assert.equal(status.body?.transaction, hash, status.text);
  // The status route also takes the network's CAIP-2 name; another chain id names nothing.
  const byCaip2 = await stack.settlementStatus(p, { network: CAIP2 });
  assert.equal(byCaip2.status, 200, byCaip2.text);
  assert.deepEqual(byCaip2.body, status.body);
  assert.equal((await stack.settlementStatus(p, { network: 'eip155:1' })).status, 404);
  assert.equal(await stack.signerNonce('pending'), nonce + 1, 'one transaction');
  assert.equal(await stack.balanceOf(payer.address), 4000n);
  // Verify now sees the authorization settled, in either version's names.
  expectClaimedOnVerify(await stack.verify(p.v2), { version: 2, payer: payer.address });
  expectClaimedOnVerify(await stack.verify(p.body), { version: 1, payer: payer.address });
});

it('a v2 replay of a v1 payment is told the same transaction, in v2 shape and names', async () => {
  const payer = await stack.newPayer(5000n);
  const p = await stack.payV2({ account: payer });
  const hash = expectSettled(await stack.settle(p.body), { network: NETWORK, payer: payer.address });
  expectDuplicate(await stack.settle(p.v2), { transaction: hash, network: CAIP2, payer: payer.address, version: 2 });
});

it('a replay in the other version is bound: a raised amount or another payTo is refused, not told success', async () => {
  const payer = await stack.newPayer(5000n);
  const p = await stack.payV2({ account: payer });
  expectSettled(await stack.settle(p.body), { network: NETWORK, payer: payer.address });
  await expectNothingSent(async () => {
    const more = mutate(p.v2, (b) => both(b, (r) => { r.amount = '2000'; }));
    expectSettleFailed(await stack.settle(more), 'invalid_exact_evm_payload_authorization_value', { network: CAIP2, payer: payer.address });
    const elsewhere = freshAccount().address;
    const other = mutate(p.v2, (b) => both(b, (r) => { r.payTo = elsewhere; }));
    expectSettleFailed(await stack.settle(other), 'invalid_exact_evm_payload_recipient_mismatch', { network: CAIP2, payer: payer.address });
  });
});

it('another authorization under a nonce a v1 settlement claimed is refused in v2: invalid_payload', async () => {
  const payer = await stack.newPayer(5000n);
  const first = await stack.payV2({ account: payer });
  expectSettled(await stack.settle(first.body), { network: NETWORK, payer: payer.address });
  const second = await stack.payV2({ account: payer, amount: 2000n, auth: { nonce: first.authorization.nonce } });
  await expectNothingSent(async () => {
    const res = await stack.settle(second.v2);
    expectSettleFailed(res, 'invalid_payload', { network: CAIP2, payer: payer.address });
  });
});

it('mixed traffic: concurrent v1 and v2 settles of one payment and of others: one transaction and one success each, the other version told it', async () => {
  const payers = await newPayers(4);
  const payments = await Promise.all(payers.map((account) => stack.payV2({ account })));
  const nonce = await stack.signerNonce('pending');
  // Each payment is sent twice, once per version, all at the same time.
  const calls = payments.map((p) => Promise.all([
    stack.settle(p.v2).then((res) => ({ res, network: CAIP2, version: 2 })),
    stack.settle(p.body).then((res) => ({ res, network: NETWORK, version: 1 })),
  ]).then((pair) => ({ p, pair })));
  const hashes = new Map();
  for (const { p, pair } of await Promise.all(calls)) {
    const wins = pair.filter(({ res }) => res.body?.success === true);
    assert.equal(wins.length, 1, `exactly one success per payment: ${pair.map(({ res }) => show(res)).join(' | ')}`);
    const [win] = wins;
    const [lose] = pair.filter((a) => a !== win);
    const hash = expectSettled(win.res, { network: win.network, payer: p.authorization.from });
    expectDuplicate(lose.res, { transaction: hash, network: lose.network, payer: p.authorization.from, version: lose.version });
    hashes.set(p.authorization.nonce, hash);
  }
  assert.equal(new Set(hashes.values()).size, payments.length);
  assert.equal(await stack.signerNonce('pending'), nonce + payments.length, 'one transaction per payment');
  for (const account of payers) assert.equal(await stack.balanceOf(account.address), 4000n);
});

it('an array settle may mix v1 and v2 elements; each slot answers in its own version', async () => {
  const payers = await newPayers(2);
  const [a, b] = await Promise.all(payers.map((account) => stack.payV2({ account })));
  const res = await stack.settle([a.v2, b.body]);
  assert.equal(res.status, 200, res.text);
  expectSettledResult(res.body[0], { network: CAIP2, payer: a.authorization.from }, res);
  expectSettledResult(res.body[1], { network: NETWORK, payer: b.authorization.from }, res);
});

it('verify in either version reserves nothing: a verified v2 payment still settles in v1', async () => {
  const payer = await stack.newPayer(5000n);
  const p = await stack.payV2({ account: payer, auth: { nonce: randomNonce() } });
  expectValid(await stack.verify(p.v2), { payer: payer.address });
  expectValid(await stack.verify(p.body), { payer: payer.address });
  expectSettled(await stack.settle(p.body), { network: NETWORK, payer: payer.address });
});
