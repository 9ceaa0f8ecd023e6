// routerd settling the server side of x402's `batch-settlement` (spec/batch-settlement.md): claims,
// sweeps and cooperative refunds, with routerd as the receiver authorizer
// (facilitator.receiver_authorizer_key_file) and merchants behind API keys scoped to their payTo.
// Payers deposit through routerd and pay by vouchers the official @x402/evm client signs:
// - claims of several merchants sent at once land in one transaction, each answered its own
//   success; a bad row is answered its reason and the others land; a claim that claims nothing
//   more, or of another merchant's channel, is refused with nothing sent; a server's own
//   authorizer signature is relayed, a forged one refused;
// - a sweep moves exactly what was claimed to the receiver, and a second one is
//   `nothing_to_settle` with nothing sent; after newer claims the same sweep is sent again, a
//   transaction of its own;
// - a refund routerd signs only for a key scoped to the receiver: exactly the unclaimed rest
//   goes back to the payer; an unscoped key is refused and nothing moves;
// - a voucher above the channel's balance, or not above what routerd has claimed of it, is
//   refused with its reason, and one above both is valid;
// - a channel of a token routerd does not serve (funded by a deposit its payer sent on chain) is
//   never claimed, swept or refunded: each is refused with nothing sent;
// - a deposit into a channel whose receiver is its payer (payTo is the payer) is refused at
//   verify and settle with nothing sent.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import { encodeAbiParameters, getAddress, keccak256 } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { toClientEvmSigner } from '@x402/evm';
import { BatchSettlementEvmScheme as BatchClient } from '@x402/evm/batch-settlement/client';
import { startFacilitatorStack, withLogTail, CHAIN_ID } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { deployUsdc, mintUsdc, usdcAbi, USDC_EIP712 } from './lib/deploy-usdc.mjs';
import {
  BATCH_SETTLEMENT, ERC3009_COLLECTOR, batchSettlementAbi, channelConfig, computeChannelId, placeBatchSettlement, readChannel, readReceiver,
  signClaimBatch, signVoucher,
} from './lib/batch-settlement.mjs';

const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = 1000n;
const FUNDS = 1_000_000n;
const authorizerKey = generatePrivateKey();
const authorizer = privateKeyToAccount(authorizerKey);
const merchants = ['a', 'b', 'c'].map((name) => ({ name, receiver: freshAccount().address, token: `key-${name}-${'x'.repeat(24)}` }));
const OPEN = `key-open-${'y'.repeat(24)}`;
const sha = (text) => createHash('sha256').update(text).digest('hex');
const bearer = (token) => ({ authorization: `Bearer ${token}` });

let stack;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    routerd: { x402Versions: [1, 2], allowHttpResource: true },
    beforeRouterd: async (s) => {
      await placeBatchSettlement(s.client);
      const keyFile = join(s.tmp.dir, 'authorizer.key');
      writeFileSync(keyFile, `${authorizerKey}\n`);
      const keysFile = join(s.tmp.dir, 'api-keys.toml');
      writeFileSync(keysFile, merchants.map((m) => `[keys.${m.name}]\nsha256 = "${sha(m.token)}"\npay_to = ["${m.receiver}"]\n`).join('\n')
        + `\n[keys.open]\nsha256 = "${sha(OPEN)}"\n`);
      return `batch_settlement = true\nreceiver_authorizer_key_file = ${JSON.stringify(keyFile)}\n`
        + `[auth]\napi_keys_file = ${JSON.stringify(keysFile)}\n`;
    },
  });
});

after(async () => {
  await stack?.stop();
});

function requirements(receiver, extra = {}) {
  return {
    scheme: 'batch-settlement', network: NETWORK, amount: String(PRICE), asset: getAddress(stack.usdc), payTo: receiver,
    maxTimeoutSeconds: 3600,
    extra: { receiverAuthorizer: authorizer.address, withdrawDelay: 900, ...USDC_EIP712, ...extra },
  };
}

/** The requirements the official channel manager sends with claim, settle and refund payloads. */
const managerRequirements = (receiver) => ({
  scheme: 'batch-settlement', network: NETWORK, asset: getAddress(stack.usdc), amount: '0', payTo: receiver, maxTimeoutSeconds: 0, extra: {},
});

const body = (payload, reqs) => ({ x402Version: 2, paymentPayload: { x402Version: 2, accepted: reqs, payload }, paymentRequirements: structuredClone(reqs) });
const balanceOf = (address) => stack.client.readContract({ address: stack.usdc, abi: usdcAbi, functionName: 'balanceOf', args: [address] });

/**
 * A payer with a channel to `merchant`, funded by a deposit routerd settles, and `charges` paid
 * requests: the latest voucher, as a claim row.
 */
async function channelWith(merchant, charges, extra = {}) {
  const account = freshAccount();
  await mintUsdc(stack.client, stack.usdc, account.address, FUNDS);
  const client = new BatchClient(toClientEvmSigner(account, stack.client));
  const reqs = requirements(merchant.receiver, extra);
  let last;
  for (let i = 0; i < charges; i += 1) {
    const { payload } = await client.createPaymentPayload(2, reqs);
    const paymentPayload = { x402Version: 2, accepted: reqs, payload };
    if (payload.type === 'deposit') {
      const settled = await stack.post('/settle', body(payload, reqs), { headers: bearer(merchant.token) });
      assert.equal(settled.body.success, true, settled.text);
    } else {
      const verified = await stack.post('/verify', body(payload, reqs), { headers: bearer(merchant.token) });
      assert.equal(verified.body.isValid, true, verified.text);
    }
    await client.schemeHooks.onPaymentResponse({
      settleResponse: { success: true, extra: { chargedAmount: String(PRICE) } }, paymentPayload, requirements: reqs,
    });
    last = payload;
  }
  const row = {
    voucher: { channel: last.channelConfig, maxClaimableAmount: last.voucher.maxClaimableAmount },
    signature: last.voucher.signature,
    totalClaimed: last.voucher.maxClaimableAmount,
  };
  return { account, client, reqs, channelId: last.voucher.channelId, row, last };
}

const claim = (merchant, rows, extra = {}) => stack.post('/settle', body({ type: 'claim', claims: rows, ...extra }, managerRequirements(merchant.receiver)), { headers: bearer(merchant.token) });

it('/supported offers routerd as receiver authorizer', async () => {
  const { body: supported } = await stack.request('/supported');
  const kind = supported.kinds.find((k) => k.scheme === 'batch-settlement');
  assert.deepEqual(kind.extra, { receiverAuthorizer: authorizer.address });
});

it('claims of several merchants sent together land in one transaction; a bad row is refused alone', async () => {
  const channels = [];
  for (const m of merchants) channels.push(await channelWith(m, 3));
  const bad = structuredClone(channels[2].row);
  bad.totalClaimed = String(BigInt(bad.voucher.maxClaimableAmount) + 1n);
  const answers = await Promise.all([
    claim(merchants[0], [channels[0].row]),
    claim(merchants[1], [channels[1].row]),
    claim(merchants[2], [bad]),
  ]);
  assert.equal(answers[0].body.success, true, answers[0].text);
  assert.equal(answers[1].body.success, true, answers[1].text);
  assert.equal(answers[0].body.transaction, answers[1].body.transaction);
  assert.equal(answers[2].body.success, false);
  assert.equal(answers[2].body.errorReason, 'invalid_batch_settlement_evm_claim_payload', answers[2].text);
  assert.equal(answers[2].body.transaction, '');
  for (const [i, c] of channels.entries()) {
    const state = await readChannel(stack.client, c.channelId);
    assert.equal(state.totalClaimed, i < 2 ? 3n * PRICE : 0n);
  }
  const again = await claim(merchants[2], [channels[2].row]);
  assert.equal(again.body.success, true, again.text);

  // A claim that claims nothing more would cost the operator gas and move nothing: refused, and
  // nothing sent. A merchant's key claims its own receiver's channels only.
  const blockBefore = await stack.client.getBlockNumber();
  const nothing = await claim(merchants[0], [channels[0].row]);
  assert.equal(nothing.body.success, false, nothing.text);
  assert.equal(nothing.body.errorReason, 'invalid_batch_settlement_evm_claim_payload', nothing.text);
  assert.match(nothing.body.errorMessage, /nothing to claim/, nothing.text);
  const other = await claim(merchants[1], [channels[0].row]);
  assert.equal(other.body.errorReason, 'invalid_batch_settlement_evm_receiver_mismatch', other.text);
  assert.equal(await stack.client.getBlockNumber(), blockBefore);
});

it('a sweep moves exactly what was claimed; a second one has nothing to settle and sends nothing; one after newer claims is a transaction of its own', async () => {
  const m = merchants[0];
  const before = await balanceOf(m.receiver);
  const { totalClaimed, totalSettled } = await readReceiver(stack.client, m.receiver, getAddress(stack.usdc));
  const owed = totalClaimed - totalSettled;
  assert.ok(owed > 0n);
  const sweep = () => stack.post('/settle', body({ type: 'settle', receiver: m.receiver, token: getAddress(stack.usdc) }, managerRequirements(m.receiver)), { headers: bearer(m.token) });
  const first = await sweep();
  assert.equal(first.body.success, true, first.text);
  assert.equal(first.body.amount, String(owed));
  assert.equal(await balanceOf(m.receiver), before + owed);
  const blockBefore = await stack.client.getBlockNumber();
  const second = await sweep();
  assert.equal(second.body.success, false);
  assert.equal(second.body.errorReason, 'invalid_batch_settlement_evm_nothing_to_settle', second.text);
  assert.equal(await stack.client.getBlockNumber(), blockBefore);

  // Newer claims: the same sweep call again, answered by a transaction of its own, not the first's.
  const c = await channelWith(m, 2);
  const claimed = await claim(m, [c.row]);
  assert.equal(claimed.body.success, true, claimed.text);
  const third = await sweep();
  assert.equal(third.body.success, true, third.text);
  assert.notEqual(third.body.transaction, first.body.transaction, 'a transaction of its own');
  assert.equal(third.body.amount, String(2n * PRICE));
  assert.equal(await balanceOf(m.receiver), before + owed + 2n * PRICE);
});

it("a server's own authorizer signature is relayed; one of another key is refused", async () => {
  const own = privateKeyToAccount(generatePrivateKey());
  const m = merchants[1];
  const c = await channelWith(m, 2, { receiverAuthorizer: own.address });
  const forged = await signClaimBatch(freshAccount(), CHAIN_ID, [c.row]);
  const refused = await claim(m, [c.row], { claimAuthorizerSignature: forged });
  assert.equal(refused.body.errorReason, 'invalid_batch_settlement_evm_authorizer_address_mismatch', refused.text);
  const unsigned = await claim(m, [c.row]);
  assert.equal(unsigned.body.errorReason, 'invalid_batch_settlement_evm_authorizer_address_mismatch', unsigned.text);
  const signature = await signClaimBatch(own, CHAIN_ID, [c.row]);
  const relayed = await claim(m, [c.row], { claimAuthorizerSignature: signature });
  assert.equal(relayed.body.success, true, relayed.text);
  assert.equal((await readChannel(stack.client, c.channelId)).totalClaimed, 2n * PRICE);
});

it('routerd signs a refund only for a key scoped to the receiver; the unclaimed rest goes back exactly', async () => {
  const m = merchants[2];
  const c = await channelWith(m, 2);
  // The payer's zero-charge refund voucher: the cumulative charge so far, nothing more (the last
  // voucher it signed carries exactly that).
  const voucher = { channelId: c.channelId, maxClaimableAmount: c.row.voucher.maxClaimableAmount, signature: c.row.signature };
  const refundPayload = { type: 'refund', channelConfig: c.last.channelConfig, voucher, claims: [c.row] };
  const state = await readChannel(stack.client, c.channelId);
  const payerBefore = await balanceOf(c.account.address);
  const send = (token) => stack.post('/settle', body(refundPayload, managerRequirements(m.receiver)), { headers: bearer(token) });
  const unscoped = await send(OPEN);
  assert.equal(unscoped.body.success, false);
  assert.equal(unscoped.body.errorReason, 'invalid_batch_settlement_evm_authorizer_not_configured', unscoped.text);
  assert.deepEqual(await readChannel(stack.client, c.channelId), state);
  const refunded = await send(m.token);
  assert.equal(refunded.body.success, true, refunded.text);
  const rest = state.balance - 2n * PRICE;
  assert.equal(refunded.body.amount, String(rest));
  assert.equal(await balanceOf(c.account.address), payerBefore + rest);
  assert.equal(refunded.body.extra.channelState.refundNonce, '1');
});

it('a voucher above the balance, or not above what is claimed, is refused; one between is valid', async () => {
  const m = merchants[0];
  const c = await channelWith(m, 2);
  const state = await readChannel(stack.client, c.channelId);
  const voucher = async (max) => {
    const signed = await signVoucher(c.account, c.channelId, String(max), NETWORK);
    const payload = { type: 'voucher', channelConfig: c.last.channelConfig, voucher: signed };
    const answer = await stack.post('/verify', body(payload, c.reqs), { headers: bearer(m.token) });
    assert.equal(answer.status, 200, answer.text);
    return answer.body;
  };
  const over = await voucher(state.balance + 1n);
  assert.equal(over.invalidReason, 'invalid_batch_settlement_evm_cumulative_exceeds_balance', JSON.stringify(over));
  const claimed = await claim(m, [c.row]);
  assert.equal(claimed.body.success, true, claimed.text);
  const at = await voucher(2n * PRICE);
  assert.equal(at.invalidReason, 'invalid_batch_settlement_evm_cumulative_below_claimed', JSON.stringify(at));
  const between = await voucher(3n * PRICE);
  assert.equal(between.isValid, true, JSON.stringify(between));
  assert.equal(between.extra.totalClaimed, String(2n * PRICE));
});

/** A channel of `token` to `merchant` (routerd its receiver authorizer), funded by its payer's own deposit on chain. */
async function depositedOnChain(merchant, token, amount) {
  const payer = freshAccount();
  await stack.anvil.rpc('anvil_setBalance', [payer.address, '0xde0b6b3a7640000']);
  await mintUsdc(stack.client, token, payer.address, amount);
  const config = channelConfig({ payer: payer.address, receiver: merchant.receiver, receiverAuthorizer: authorizer.address, token });
  const channelId = computeChannelId(config, NETWORK);
  const [salt, validBefore] = [1n, BigInt(Math.floor(Date.now() / 1000) + 3600)];
  const signature = await payer.signTypedData({
    domain: { ...USDC_EIP712, chainId: CHAIN_ID, verifyingContract: token },
    types: {
      ReceiveWithAuthorization: ['from:address', 'to:address', 'value:uint256', 'validAfter:uint256', 'validBefore:uint256', 'nonce:bytes32']
        .map((f) => ({ name: f.split(':')[0], type: f.split(':')[1] })),
    },
    primaryType: 'ReceiveWithAuthorization',
    message: {
      from: payer.address, to: ERC3009_COLLECTOR, value: amount, validAfter: 0n, validBefore,
      nonce: keccak256(encodeAbiParameters([{ type: 'bytes32' }, { type: 'uint256' }], [channelId, salt])),
    },
  });
  const data = encodeAbiParameters([{ type: 'uint256' }, { type: 'uint256' }, { type: 'uint256' }, { type: 'bytes' }], [0n, validBefore, salt, signature]);
  const hash = await stack.client.writeContract({
    account: payer, address: BATCH_SETTLEMENT, abi: batchSettlementAbi(), functionName: 'deposit', args: [config, amount, ERC3009_COLLECTOR, data],
  });
  assert.equal((await stack.client.waitForTransactionReceipt({ hash })).status, 'success', 'the payer\'s own deposit');
  return { payer, config, channelId };
}

it('a channel of a token routerd does not serve is never claimed, swept or refunded: refused, nothing sent', async () => {
  const m = merchants[1];
  const other = await deployUsdc(stack.client, { symbol: 'OTHER' });
  const { payer, config, channelId } = await depositedOnChain(m, other, FUNDS);
  assert.equal((await readChannel(stack.client, channelId)).balance, FUNDS);
  const voucher = await signVoucher(payer, channelId, String(2n * PRICE), NETWORK);
  const row = { voucher: { channel: config, maxClaimableAmount: voucher.maxClaimableAmount }, signature: voucher.signature, totalClaimed: voucher.maxClaimableAmount };
  const reqs = { ...managerRequirements(m.receiver), asset: getAddress(other) };
  const send = (payload) => stack.post('/settle', body(payload, reqs), { headers: bearer(m.token) });
  const blockBefore = await stack.client.getBlockNumber();
  const answers = {
    claim: await send({ type: 'claim', claims: [row] }),
    sweep: await send({ type: 'settle', receiver: m.receiver, token: getAddress(other) }),
    refund: await send({ type: 'refund', channelConfig: config, voucher, claims: [row] }),
  };
  for (const [what, answer] of Object.entries(answers)) {
    assert.equal(answer.body.success, false, `${what}: ${answer.text}`);
    assert.equal(answer.body.errorReason, 'invalid_batch_settlement_evm_token_mismatch', `${what}: ${answer.text}`);
    assert.match(answer.body.errorMessage, /not a token routerd serves/, `${what}: ${answer.text}`);
  }
  assert.equal(await stack.client.getBlockNumber(), blockBefore, 'nothing was sent');
  const payReqs = { ...requirements(m.receiver), asset: getAddress(other) };
  const verified = await stack.post('/verify', body({ type: 'voucher', channelConfig: config, voucher }, payReqs), { headers: bearer(m.token) });
  assert.equal(verified.body.isValid, false, verified.text);
  assert.equal(verified.body.invalidReason, 'invalid_batch_settlement_evm_token_mismatch', verified.text);
  const state = await readChannel(stack.client, channelId);
  assert.equal(state.totalClaimed, 0n);
  assert.equal(state.balance, FUNDS);
});

it('a deposit into a channel to its own payer is refused at verify and settle: nothing is sent', async () => {
  const account = freshAccount();
  await mintUsdc(stack.client, stack.usdc, account.address, FUNDS);
  const client = new BatchClient(toClientEvmSigner(account, stack.client));
  const reqs = requirements(account.address);
  const { payload } = await client.createPaymentPayload(2, reqs);
  assert.equal(payload.type, 'deposit');
  const blockBefore = await stack.client.getBlockNumber();
  for (const path of ['/verify', '/settle']) {
    const answer = await stack.post(path, body(payload, reqs), { headers: bearer(OPEN) });
    const [valid, reason] = path === '/verify' ? [answer.body.isValid, answer.body.invalidReason] : [answer.body.success, answer.body.errorReason];
    assert.deepEqual([valid, reason], [false, 'invalid_batch_settlement_evm_receiver_mismatch'], `${path}: ${answer.text}`);
  }
  assert.equal(await stack.client.getBlockNumber(), blockBefore, 'nothing was sent');
  assert.equal(await balanceOf(account.address), FUNDS);
});
