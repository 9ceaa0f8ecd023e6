// A batch-settlement deposit on several routerd instances sharing one PostgreSQL store
// (storage.backend = "postgres", scripts/pg-cluster), all loading the same signer key: one success
// per deposit authorization, however often and wherever it is sent (spec/batch-settlement.md).
// routerd's escrow and collectors are at the canonical addresses (lib/batch-settlement.mjs), the
// deposits are signed by @x402/evm 2.27.0's batch-settlement client scheme, the chain mines a
// block every second.
// - one deposit sent four times to each of three instances at once, no keys: exactly one success,
//   every other answer names its transaction as a failure, one deposit on chain;
// - the same with each request under its own Idempotency-Key (asked again on the next instance
//   while pending): one success, the claiming request retried on the other instances is told the
//   success again, another key the failure;
// - later, the deposit sent once more to each instance: the transaction as a failure, nothing sent;
// - three cooperative refunds of one channel (three amounts), one to each instance at once: one
//   refund transaction, none reverted (each instance alone would send its own at the channel's
//   one refund nonce); the others are refused with nothing sent.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { getAddress } from 'viem';
import { toClientEvmSigner } from '@x402/evm';
import { BatchSettlementEvmScheme as BatchClient } from '@x402/evm/batch-settlement/client';
import { startFacilitatorStack, CHAIN_ID } from './lib/stack.mjs';
import { startRouterd } from './lib/routerd.mjs';
import { anvilAccount, freshAccount, ROLE } from './lib/accounts.mjs';
import { USDC_EIP712 } from './lib/deploy-usdc.mjs';
import { BATCH_SETTLEMENT, placeBatchSettlement, readChannel, signRefund } from './lib/batch-settlement.mjs';
import { isPending } from './lib/settling.mjs';
import { TX_HASH, show } from './lib/expect.mjs';
import {
  freePort, makeTempDir, readAnswer, sleep, idempotencyKey, IDEMPOTENCY_KEY,
} from './lib/util.mjs';

const repo = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const pgCluster = join(repo, 'scripts', 'pg-cluster');
const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = 1000n;
const LEASE_TTL_SECS = 2;
const EACH = 4; // requests of one deposit per instance, all at once
const receiver = anvilAccount(ROLE.payee).address;
const authorizer = freshAccount();

let stack;
let pgDir;
let url;
let nextPayer = 0;
const instances = [];
const instanceDirs = [];

/** The stack's config with the shared database instead of sled. */
function instanceConfig(port, id) {
  const sled = /\[storage\]\npath = "[^"]*"\n/;
  const toml = stack.configToml({ port });
  assert.match(toml, sled);
  assert.match(toml, /batch_settlement = true/);
  return toml.replace(sled, `[storage]\nbackend = "postgres"\nlease_ttl_secs = ${LEASE_TTL_SECS}\ninstance_id = "${id}"\n`);
}

async function startInstance(i) {
  const port = await freePort();
  const tmp = makeTempDir(`routerd-instance-${i}-`);
  instanceDirs.push(tmp);
  const { dir } = tmp;
  return startRouterd({
    configToml: instanceConfig(port, `instance-${i}`),
    dir,
    port,
    env: { ROUTERD_SIGNER_KEY: stack.signerKey, ROUTERD__STORAGE__POSTGRES_URL: url },
  });
}

before(async () => {
  pgDir = mkdtempSync(join(tmpdir(), 'routerd-pg-'));
  url = execFileSync(pgCluster, ['start', pgDir], { encoding: 'utf8', timeout: 300_000 }).trim();
  stack = await startFacilitatorStack({
    anvil: { blockTime: 1 },
    fundedPayers: 3,
    routerd: {
      x402Versions: [1, 2], allowHttpResource: true, settleTimeoutSecs: 10, extra: 'batch_settlement = true\n',
    },
    beforeRouterd: (s) => placeBatchSettlement(s.client),
  });
  // The stack's own (sled) daemon holds the same key: it must not run beside the instances.
  await stack.routerd.stop();
  for (let i = 0; i < 3; i += 1) instances.push(await startInstance(i));
});

after(async () => {
  await Promise.all(instances.map((r) => r.stop()));
  await stack?.stop();
  for (const tmp of instanceDirs) tmp.cleanup();
  if (pgDir) {
    spawnSync(pgCluster, ['stop', pgDir], { stdio: 'ignore' });
    rmSync(pgDir, { recursive: true, force: true });
  }
});

function requirements() {
  return {
    scheme: 'batch-settlement', network: NETWORK, amount: String(PRICE), asset: getAddress(stack.usdc), payTo: receiver,
    maxTimeoutSeconds: 3600,
    extra: { receiverAuthorizer: authorizer.address, withdrawDelay: 900, ...USDC_EIP712 },
  };
}

/** A deposit signed by the official client for a payer no other test uses: {payload, raw, payer, amount}. */
async function newDeposit() {
  const account = stack.payers[nextPayer];
  nextPayer += 1;
  const client = new BatchClient(toClientEvmSigner(account, stack.client));
  const reqs = requirements();
  const { payload } = await client.createPaymentPayload(2, reqs);
  assert.equal(payload.type, 'deposit');
  const body = { x402Version: 2, paymentPayload: { x402Version: 2, accepted: reqs, payload }, paymentRequirements: structuredClone(reqs) };
  return { payload, raw: JSON.stringify(body), payer: account.address, amount: BigInt(payload.deposit.amount) };
}

/** POST /settle of the bytes `raw` to one instance, with `key` as the Idempotency-Key when given. */
async function post(instance, raw, key) {
  return readAnswer(await fetch(`${instance.url}/settle`, {
    method: 'POST',
    body: raw,
    headers: { 'content-type': 'application/json', ...(key === undefined ? {} : { [IDEMPOTENCY_KEY]: key }) },
  }));
}

/** v2's pending answer (`settlement_pending` with the hash), or the error body's 504. */
const pending = (res) => isPending(res) || (res.status === 200 && res.body?.errorReason === 'settlement_pending');

/**
 * Settle as a resource server with several facilitator addresses would: ask `order[0]`; on a
 * pending answer ask the next one, every time with the same key and bytes.
 */
async function settleSomewhere(order, raw, key, tries = 20) {
  let res;
  for (let i = 0; i < tries; i += 1) {
    res = await post(order[i % order.length], raw, key);
    if (!pending(res)) return res;
    await sleep(200);
  }
  return res;
}

/** The success among `answers`, exactly one; every other names its transaction as a failure. */
function oneSuccess(answers, deposit) {
  const shown = answers.map((r) => show(r)).join(' | ');
  const wins = answers.filter((res) => res.body?.success === true);
  assert.equal(wins.length, 1, `exactly one success: ${shown}`);
  const [won] = wins;
  assert.equal(won.status, 200, show(won));
  assert.match(won.body.transaction, TX_HASH, show(won));
  assert.equal(getAddress(won.body.payer), deposit.payer, show(won));
  assert.equal(won.body.amount, String(deposit.amount), show(won));
  const hash = won.body.transaction;
  const told = answers.filter((r) => r !== won).map((r) => r.body?.errorMessage?.replace(hash, '<hash>'));
  console.log(`# ${answers.length} answers: one success; ${[...new Set(told)].map((m) => `${told.filter((t) => t === m).length} "${m}"`).join(', ')}`);
  for (const res of answers.filter((r) => r !== won)) expectDuplicate(res, hash);
  return { won, hash };
}

/** A settle of a deposit another request settled: success false, its transaction named. */
function expectDuplicate(res, hash) {
  assert.equal(res.status, 200, show(res));
  assert.equal(res.body.success, false, `a duplicate is never told success: ${show(res)}`);
  assert.equal(res.body.transaction, hash, `the duplicate names the deposit's transaction: ${show(res)}`);
  assert.equal(res.body.errorReason, 'invalid_batch_settlement_evm_deposit_payload', show(res));
  assert.ok([`already settled by ${hash}`, `already being settled by ${hash}`].includes(res.body.errorMessage), show(res));
}

/** One deposit on chain: one signer transaction since `nonce`, mined, the escrow up by the amount. */
async function expectOneDeposit(deposit, hash, { nonce, escrow }) {
  const receipt = await stack.client.waitForTransactionReceipt({ hash });
  assert.equal(receipt.status, 'success');
  assert.equal(getAddress(receipt.to), BATCH_SETTLEMENT);
  assert.equal(await stack.signerNonce('pending'), nonce + 1, 'one signer transaction');
  assert.equal(await stack.balanceOf(BATCH_SETTLEMENT), escrow + deposit.amount, 'the escrow holds exactly one deposit more');
  assert.equal((await readChannel(stack.client, deposit.payload.voucher.channelId)).balance, deposit.amount);
}

/**
 * A cooperative refund of `amount` from the deposit's channel at its refund nonce now, signed by
 * its receiver authorizer.
 */
async function refundOf(deposit, amount) {
  const { channelId } = deposit.payload.voucher;
  const { refundNonce } = await readChannel(stack.client, channelId);
  const refundAuthorizerSignature = await signRefund(authorizer, CHAIN_ID, channelId, refundNonce, amount);
  const payload = {
    type: 'refund', channelConfig: deposit.payload.channelConfig, voucher: deposit.payload.voucher, claims: [],
    amount: String(amount), refundNonce: String(refundNonce), refundAuthorizerSignature,
  };
  // The requirements the official channel manager sends with a refund.
  const reqs = {
    scheme: 'batch-settlement', network: NETWORK, asset: getAddress(stack.usdc), amount: '0', payTo: receiver, maxTimeoutSeconds: 0, extra: {},
  };
  return JSON.stringify({ x402Version: 2, paymentPayload: { x402Version: 2, accepted: reqs, payload }, paymentRequirements: structuredClone(reqs) });
}

const chainNow = async () => ({ nonce: await stack.signerNonce('pending'), escrow: await stack.balanceOf(BATCH_SETTLEMENT) });

describe('three instances, one key, one PostgreSQL: batch-settlement deposits', () => {
  const it = (name, fn) => test(name, { timeout: 120_000 }, async () => {
    try {
      await fn();
    } catch (err) {
      for (const [i, r] of instances.entries()) err.message += `\n--- instance ${i} log tail ---\n${r.tail(30)}`;
      throw err;
    }
  });

  it(`one deposit sent ${EACH} times to each of three instances at once, no keys: one success, one deposit`, async () => {
    const deposit = await newDeposit();
    const before = await chainNow();
    const answers = await Promise.all(instances.flatMap((r) => Array.from({ length: EACH }, () => post(r, deposit.raw))));
    const { hash } = oneSuccess(answers, deposit);
    await expectOneDeposit(deposit, hash, before);
    for (const r of instances) expectDuplicate(await post(r, deposit.raw), hash);
    assert.equal(await stack.signerNonce('pending'), before.nonce + 1, 'nothing sent by the later settles');
  });

  it(`one deposit sent ${EACH} times to each instance at once, each under its own key: one success, told again to its key on every instance`, async () => {
    const deposit = await newDeposit();
    const before = await chainNow();
    const keys = Array.from({ length: 3 * EACH }, () => idempotencyKey());
    const answers = await Promise.all(keys.map((key, k) => {
      const order = [0, 1, 2].map((j) => instances[(k + j) % 3]);
      return settleSomewhere(order, deposit.raw, key);
    }));
    const { won, hash } = oneSuccess(answers, deposit);
    await expectOneDeposit(deposit, hash, before);
    const wonKey = keys[answers.indexOf(won)];
    for (const r of instances) {
      const again = await post(r, deposit.raw, wonKey);
      assert.equal(again.body?.success, true, `the claiming request retried is told the success: ${show(again)}`);
      assert.equal(again.body.transaction, hash, show(again));
      expectDuplicate(await post(r, deposit.raw, keys[(answers.indexOf(won) + 1) % keys.length]), hash);
      expectDuplicate(await post(r, deposit.raw, idempotencyKey()), hash);
    }
    assert.equal(await stack.signerNonce('pending'), before.nonce + 1, 'nothing sent by the later settles');
  });

  it('three refunds of one channel, one to each instance at once: one refund transaction, none reverted, the others refused with nothing sent', async () => {
    const deposit = await newDeposit();
    const deposited = await post(instances[0], deposit.raw);
    assert.equal(deposited.body?.success, true, show(deposited));
    // Three refunds the channel's authorizer signed at its one refund nonce, of three amounts:
    // each instance alone would send its own, and all but the first to land would revert.
    const amounts = [deposit.amount, deposit.amount - 1n, deposit.amount - 2n];
    const raws = await Promise.all(amounts.map((amount) => refundOf(deposit, amount)));
    const nonce = await stack.signerNonce('pending');
    const payerBefore = await stack.balanceOf(deposit.payer);
    const answers = await Promise.all(instances.map((r, i) => post(r, raws[i])));
    const shown = answers.map((r) => show(r)).join(' | ');
    const wins = answers.filter((res) => res.body?.success === true);
    assert.equal(wins.length, 1, `exactly one refund: ${shown}`);
    const [won] = wins;
    const receipt = await stack.client.waitForTransactionReceipt({ hash: won.body.transaction });
    assert.equal(receipt.status, 'success');
    assert.equal(won.body.amount, String(amounts[answers.indexOf(won)]), show(won));
    for (const res of answers.filter((r) => r !== won)) {
      assert.equal(res.status, 200, show(res));
      assert.equal(res.body.success, false, show(res));
      assert.equal(res.body.transaction, '', `refused with nothing sent: ${show(res)}`);
      assert.match(res.body.errorReason, /^invalid_batch_settlement_evm_/, show(res));
    }
    console.log(`# refused: ${answers.filter((r) => r !== won).map((r) => r.body.errorReason).join(', ')}`);
    assert.equal(await stack.signerNonce('pending'), nonce + 1, `one signer transaction, none reverted: ${shown}`);
    assert.equal(await stack.balanceOf(deposit.payer), payerBefore + BigInt(won.body.amount), 'one refund reached the payer');
    assert.equal((await readChannel(stack.client, deposit.payload.voucher.channelId)).refundNonce, 1n);
  });
});
