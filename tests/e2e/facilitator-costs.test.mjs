// The operator pays only for payments that can succeed (spec/access.md section 2), against
// hostile smart-wallet payers placed with anvil_setCode (lib/hostile.mjs), on anvil --block-time 1:
// - bounded cost per settlement: a signature longer than facilitator.max_signature_bytes (2048)
//   answers invalid_payload naming the key, unsent, at once (the bound itself still settles); a
//   wallet whose isValidSignature burns gas past chains.<name>.max_settlement_gas (300000) answers
//   invalid_payload naming that key, unsent; the lane goes on settling honest payments promptly;
// - the trial matches the chain: a wallet that says yes only to a free call (gas price 0) or to a
//   call from nobody (tx.origin 0) is refused by the trial, which runs from the signer's address
//   at a real gas price: nothing is sent, nobody is put on a cooldown;
// - a wallet that says yes only where routerd's verify lens has code (inside routerd's own
//   eth_call) passes the trial and reverts on chain, once, at a cost bounded by
//   max_settlement_gas; its payer is then refused for facilitator.revert_cooldown_secs (3600) with
//   the from-address KYT reason, in verify and settle, unsent, and
//   routerd_payer_revert_cooldowns_total counts it; other payers settle as before.
// Without these rules each hostile payment would cost a transaction: a huge or gas-burning one
// that succeeds at the operator's expense, or a revert per attempt.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { mutate } from './lib/x402.mjs';
import { ERC1271_ALWAYS_VALID } from './lib/wallets.mjs';
import { expectSettled, expectSettleFailed, expectInvalid, expectValid, TX_HASH } from './lib/expect.mjs';
import { chainMark, minedFrom, expectTransfersAuthorization } from './lib/chain-audit.mjs';
import {
  ERC1271_VALID_WHERE_THE_LENS_IS, ERC1271_VALID_WHEN_FREE, ERC1271_VALID_FROM_NOBODY, burnerWallet, placeCode, metricValue,
} from './lib/hostile.mjs';

const PRICE = 1000n;
const MAX_SIGNATURE_BYTES = 2048; // facilitator.max_signature_bytes, default
const MAX_SETTLEMENT_GAS = 300_000n; // chains.<name>.max_settlement_gas, default
const REVERT_COOLDOWN_SECS = 3600; // facilitator.revert_cooldown_secs, default
const COOLDOWN_METRIC = 'routerd_payer_revert_cooldowns_total';
const KYT = 'invalid_exact_evm_payload_authorization_from_address_kyt';
const PROMPT_BLOCKS = 4; // "within a few blocks" on a 1 s chain

let stack;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    anvil: { blockTime: 1 },
    // A 30 KB signature must reach the signature rule, not the body limit.
    routerd: { settleTimeoutSecs: 30, maxBodyBytes: 256 * 1024 },
  });
  // One honest settlement first: routerd learns from it where a settlement's gas comes from (its
  // first settlement is also estimated, which a wallet that answers the lens only would fail).
  await expectHonestPaymentSettlesPromptly();
});

after(() => stack?.stop());

/** A fresh address holding `code` and `funds` USDC. */
async function hostileWallet(code, funds = 10n * PRICE) {
  const address = freshAccount().address;
  await placeCode(stack.anvil, address, code);
  await stack.mint(address, funds);
  return address;
}

/** A payment of PRICE from smart wallet `wallet`, signed by some key (its wallet decides). */
function walletPayment(wallet) {
  return stack.pay({ account: freshAccount(), auth: { from: wallet }, amount: PRICE });
}

const withSignature = (p, signature) => mutate(p.body, (b) => { b.paymentPayload.payload.signature = signature; });
const blockNumber = async () => Number(await stack.anvil.rpc('eth_blockNumber'));
const blocks = (n) => new Promise((resolve) => { setTimeout(resolve, n * 1000 + 200); });

async function metric(name) {
  const res = await fetch(`${stack.url}/metrics`);
  assert.equal(res.status, 200);
  const text = await res.text();
  const value = metricValue(text, name);
  assert.notEqual(value, undefined, `no "${name} <value>" line in /metrics:\n${text.split('\n').filter((l) => l.includes('revert')).join('\n')}`);
  return value;
}

/**
 * Settle `body` and expect the failure `reason` with no transaction: the answer names none, the
 * signer's pending nonce did not move, the payer's balance did not move. Returns the answer.
 */
async function expectRefusedUnsent(body, reason, { payer, messageIncludes } = {}) {
  const nonce = await stack.signerNonce('pending');
  const balance = await stack.balanceOf(payer);
  const res = await stack.settle(body);
  expectSettleFailed(res, reason, { network: NETWORK, payer: getAddress(payer) });
  if (messageIncludes) assert.ok(String(res.body.errorMessage).includes(messageIncludes), `errorMessage names ${messageIncludes}: ${res.text}`);
  assert.equal(await stack.signerNonce('pending'), nonce, `nothing sent: ${res.text}`);
  assert.equal(await stack.balanceOf(payer), balance, 'nothing moved');
  return res;
}

/** An honest EOA payment is answered success within PROMPT_BLOCKS blocks, by its transfer. */
async function expectHonestPaymentSettlesPromptly() {
  const payer = await stack.newPayer(PRICE);
  const p = await stack.pay({ account: payer, amount: PRICE });
  const from = await blockNumber();
  const hash = expectSettled(await stack.settle(p.body), { network: NETWORK, payer: payer.address });
  const took = (await blockNumber()) - from;
  assert.ok(took <= PROMPT_BLOCKS, `the honest payment was answered ${took} blocks after it was sent`);
  const receipt = await stack.receipt(hash);
  assert.equal(receipt.status, 'success');
  expectTransfersAuthorization(receipt.logs, stack.usdc, p.authorization, hash);
}

// ---------------------------------------------------------------------------------------------
// Bounds

it('a 30 KB signature -> invalid_payload naming max_signature_bytes, nothing sent; the lane settles the next honest payment promptly', async () => {
  const wallet = await hostileWallet(ERC1271_ALWAYS_VALID);
  const p = await walletPayment(wallet);
  const huge = withSignature(p, `0x${'c0ffee'.repeat(10_000)}`); // 30 000 bytes, every one accepted by the wallet

  const verified = await stack.verify(huge);
  expectInvalid(verified, 'invalid_payload', { payer: wallet });
  assert.match(verified.body.invalidMessage, /max_signature_bytes/, verified.text);
  await expectRefusedUnsent(huge, 'invalid_payload', { payer: wallet, messageIncludes: 'max_signature_bytes' });

  // One byte over the bound is refused the same way; the bound itself is a signature like any.
  const over = withSignature(p, `0x${'ab'.repeat(MAX_SIGNATURE_BYTES + 1)}`);
  await expectRefusedUnsent(over, 'invalid_payload', { payer: wallet, messageIncludes: 'max_signature_bytes' });
  const atBound = withSignature(p, `0x${'ab'.repeat(MAX_SIGNATURE_BYTES)}`);
  const hash = expectSettled(await stack.settle(atBound), { network: NETWORK, payer: wallet });
  const tx = await stack.client.getTransaction({ hash });
  assert.ok(tx.gas <= MAX_SETTLEMENT_GAS, `gas limit ${tx.gas} within max_settlement_gas`);
  assert.equal(await stack.balanceOf(wallet), 9n * PRICE, 'the signature at the bound paid once');

  await expectHonestPaymentSettlesPromptly();
});

it('a wallet that burns 250 000 gas in isValidSignature -> invalid_payload naming max_settlement_gas, nothing sent; one that burns 100 000 settles', async () => {
  // 250 000 in the wallet plus the token's own work is over the 300 000 bound, and well within
  // what routerd's trial gives a settlement (twice the bound), so the trial measures it.
  const burner = await hostileWallet(burnerWallet(250_000));
  const p = await walletPayment(burner);
  const res = await expectRefusedUnsent(p.body, 'invalid_payload', { payer: burner, messageIncludes: 'max_settlement_gas' });
  console.log(`burner 250k: ${res.body.errorMessage}`);
  // Asked again later: still refused, still nothing sent (the refusal claimed nothing).
  await blocks(1);
  await expectRefusedUnsent(p.body, 'invalid_payload', { payer: burner, messageIncludes: 'max_settlement_gas' });

  // A wallet that burns more than the trial grants at all is refused too, unsent.
  const hog = await hostileWallet(burnerWallet(1_000_000));
  const h = await walletPayment(hog);
  const nonce = await stack.signerNonce('pending');
  const refused = await stack.settle(h.body);
  assert.equal(refused.status, 200, refused.text);
  assert.equal(refused.body.success, false, refused.text);
  assert.equal(refused.body.transaction, '', refused.text);
  assert.equal(await stack.signerNonce('pending'), nonce, `nothing sent: ${refused.text}`);
  console.log(`burner 1M: ${refused.text}`);

  // The same wallet burning less than the bound is an ordinary (if costly) smart wallet.
  const modest = await hostileWallet(burnerWallet(100_000));
  const q = await walletPayment(modest);
  const hash = expectSettled(await stack.settle(q.body), { network: NETWORK, payer: modest });
  const [tx, receipt] = await Promise.all([stack.client.getTransaction({ hash }), stack.receipt(hash)]);
  assert.equal(receipt.status, 'success');
  assert.ok(tx.gas <= MAX_SETTLEMENT_GAS, `gas limit ${tx.gas} within max_settlement_gas`);
  assert.ok(receipt.gasUsed > 100_000n, `the wallet did burn its gas on chain (${receipt.gasUsed})`);

  await expectHonestPaymentSettlesPromptly();
});

// ---------------------------------------------------------------------------------------------
// The trial matches the chain

it('wallets that say yes only to a free call or to a call from nobody: the trial (from the signer, at a real gas price) refuses them, nothing sent, no cooldown', async () => {
  assert.equal(await metric(COOLDOWN_METRIC), 0, 'no cooldown yet');
  for (const [name, code] of [['gas price 0', ERC1271_VALID_WHEN_FREE], ['tx.origin 0', ERC1271_VALID_FROM_NOBODY]]) {
    const wallet = await hostileWallet(code);
    // Precondition: the wallet really is two-faced on anvil (a free call from nobody says yes).
    const answer = await stack.anvil.rpc('eth_call', [{ to: wallet, data: '0x1626ba7e' }, 'latest']);
    assert.ok(answer.startsWith('0x1626ba7e'), `${name}: a plain eth_call is told yes (${answer})`);
    const p = await walletPayment(wallet);
    const verified = await stack.verify(p.body);
    console.log(`${name}: verify answers ${verified.text}`);
    const res = await expectRefusedUnsent(p.body, 'invalid_exact_evm_payload_signature_address', { payer: wallet });
    console.log(`${name}: settle answers ${res.body.errorMessage}`);
    // Not a revert on chain: the payer is not on a cooldown, it is simply refused each time.
    await expectRefusedUnsent(p.body, 'invalid_exact_evm_payload_signature_address', { payer: wallet });
  }
  assert.equal(await metric(COOLDOWN_METRIC), 0, 'a refusal by the trial puts nobody on a cooldown');
});

it('a wallet valid only where the lens is: one revert on chain at bounded cost, then its payer is refused for revert_cooldown_secs (verify and settle, unsent), counted in /metrics; others unaffected', async () => {
  assert.equal(await metric(COOLDOWN_METRIC), 0, 'no cooldown yet');
  const wallet = await hostileWallet(ERC1271_VALID_WHERE_THE_LENS_IS);
  // Precondition: on chain (no lens) the wallet says no; inside routerd's eth_call it says yes.
  const plain = await stack.anvil.rpc('eth_call', [{ to: wallet, data: '0x1626ba7e' }, 'latest']);
  assert.equal(BigInt(plain), 0n, `without the lens the wallet says no (${plain})`);
  const p = await walletPayment(wallet);
  expectValid(await stack.verify(p.body), { payer: wallet }); // routerd's verify reads through the lens

  const mark = await chainMark(stack.anvil, stack.signer);
  const res = await stack.settle(p.body);
  assert.equal(res.status, 200, res.text);
  assert.equal(res.body.success, false, `the settlement reverted on chain: ${res.text}`);
  assert.match(res.body.transaction, TX_HASH, res.text);
  console.log(`two-faced: settle answers ${res.text}`);
  const hash = res.body.transaction;
  const [tx, receipt] = await Promise.all([stack.client.getTransaction({ hash }), stack.receipt(hash)]);
  assert.equal(receipt.status, 'reverted', 'it reverted on chain');
  assert.ok(tx.gas <= MAX_SETTLEMENT_GAS, `gas limit ${tx.gas} within max_settlement_gas`);
  assert.ok(receipt.gasUsed * receipt.effectiveGasPrice <= MAX_SETTLEMENT_GAS * receipt.effectiveGasPrice,
    `the revert cost ${receipt.gasUsed} gas x ${receipt.effectiveGasPrice}, at most max_settlement_gas x the price`);
  assert.equal(await stack.balanceOf(wallet), 10n * PRICE, 'the revert moved nothing');

  // The payer is on its cooldown: verify and settle refuse it with the KYT reason, unsent.
  for (let round = 0; round < 2; round += 1) {
    const q = await walletPayment(wallet);
    const v = await stack.verify(q.body);
    expectInvalid(v, KYT, { payer: wallet });
    assert.match(v.body.invalidMessage, /revert_cooldown_secs/, v.text);
    const left = Number(v.body.invalidMessage.match(/refused for (\d+) s/)?.[1]);
    assert.ok(left > REVERT_COOLDOWN_SECS - 60 && left <= REVERT_COOLDOWN_SECS, `refused for about revert_cooldown_secs (${REVERT_COOLDOWN_SECS}): ${v.text}`);
    await expectRefusedUnsent(q.body, KYT, { payer: wallet });
    // The payment that reverted, asked again, is told what happened to it, and sends nothing.
    const again = await stack.settle(p.body);
    assert.equal(again.body?.success, false, again.text);
    assert.equal(await stack.signerNonce('pending'), mark.nonce + 1, `still one transaction: ${again.text}`);
    if (round === 0) await blocks(2);
  }
  assert.equal(await metric(COOLDOWN_METRIC), 1, 'the cooldown is counted once');

  // Others settle as before: an EOA payer, and a smart wallet that says yes everywhere.
  await expectHonestPaymentSettlesPromptly();
  const honestWallet = await hostileWallet(ERC1271_ALWAYS_VALID);
  const w = await walletPayment(honestWallet);
  expectSettled(await stack.settle(w.body), { network: NETWORK, payer: honestWallet });

  // The chain: one reverted signer transaction since the mark, the one answered; the rest succeeded.
  const mined = await minedFrom(stack.anvil, [stack.signer], { fromBlock: mark.block });
  const reverted = mined.filter((t) => t.status === 'reverted');
  assert.deepEqual(reverted.map((t) => t.hash), [hash], `exactly one reverted settlement: ${JSON.stringify(mined.map((t) => [t.nonce, t.status]))}`);
  assert.equal(mined.length, 3, 'the revert and the two honest settlements');
  assert.equal(await metric(COOLDOWN_METRIC), 1);
});

// A smart wallet settles one payment at a time: a wallet valid only where the lens is can make
// one settlement revert before its cooldown, not one per payment in flight.
test('concurrent settlements of a wallet valid only where the lens is: at most one reverts, the rest wait their turn', {
  timeout: 60_000,
}, async () => {
  const wallet = await hostileWallet(ERC1271_VALID_WHERE_THE_LENS_IS, 4n * PRICE);
  const ps = await Promise.all([0, 1, 2, 3].map(() => walletPayment(wallet)));
  const mark = await chainMark(stack.anvil, stack.signer);
  const answers = await Promise.all(ps.map((p) => stack.settle(p.body)));
  const mined = await minedFrom(stack.anvil, [stack.signer], { fromBlock: mark.block });
  const reverted = mined.filter((t) => t.status === 'reverted');
  assert.ok(reverted.length <= 1, `${reverted.length} settlements of one payer reverted: ${answers.map((a) => a.text).join('\n')}`);
  const oneAtATime = answers.filter((a) => a.body?.errorMessage?.includes('one payment at a time'));
  assert.equal(oneAtATime.length, 3, `three wait their turn: ${answers.map((a) => a.text).join('\n')}`);
});
