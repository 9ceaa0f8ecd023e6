// Solana `exact` verify through routerd (svm.md §1-3) against the Solana test node: /supported
// names the fee payer, @x402/svm 2.27.0's client payments verify in v2 and (re-wrapped) in v1,
// each refusal answers its version's reason, and no verify costs the fee payer a lamport. A node
// of another cluster is refused at start.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { ExactSvmScheme as ExactSvmClient } from '@x402/svm/exact/client';
import {
  startSvmNode, newSolanaKeypair, svmFacilitatorConfig, newFeePayer, testWithLogs, postTo, SOLANA_DEVNET_CAIP2, DEVNET_USDC_MINT,
} from './lib/svm.mjs';
import { startRouterd, routerdBin, freePort } from './lib/routerd.mjs';
import { makeTempDir } from './lib/util.mjs';
import { spawnSync } from 'node:child_process';

let tmp;
let node;
let routerd;
let feePayer;
let feePayerFile;

function config(port, rpcUrl) {
  return svmFacilitatorConfig({ port, storePath: join(tmp.dir, `store-${port}`), rpcUrl, feePayerFile });
}

before(async () => {
  tmp = makeTempDir('routerd-svm-verify-');
  node = await startSvmNode({ slotMs: 100, logFile: join(tmp.dir, 'svm-node.log') });
  ({ feePayer, feePayerFile } = await newFeePayer(node, tmp.dir));
  await node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  routerd = await startRouterd({ configToml: config(await freePort(), node.url), dir: tmp.dir });
});

after(async () => {
  await routerd?.stop();
  await node?.stop();
  tmp?.cleanup();
});

const it = testWithLogs(test, () => tmp.dir);

const post = (path, body) => postTo(routerd.url, path, body);

/** A payer holding `amount` USDC and no SOL; a payee with a token account unless `noAccount`. */
async function parties(amount, { noAccount = false } = {}) {
  const payer = await newSolanaKeypair();
  const payee = await newSolanaKeypair();
  await node.mintTo(DEVNET_USDC_MINT, payer.address, amount);
  if (!noAccount) await node.createTokenAccount(DEVNET_USDC_MINT, payee.address);
  return { payer, payee };
}

const requirements = (payee, amount, extra = {}) => ({
  scheme: 'exact', network: SOLANA_DEVNET_CAIP2, asset: DEVNET_USDC_MINT, amount: String(amount), payTo: payee.address,
  maxTimeoutSeconds: 60, extra: { feePayer: feePayer.address, ...extra },
});

/** The official client's payment for `required`, as a v2 body (with `asked` as the requirements). */
async function v2Body(payer, required, asked = required) {
  const client = new ExactSvmClient(payer.signer, { rpcUrl: node.url });
  const partial = await client.createPaymentPayload(2, required);
  const paymentPayload = { ...partial, accepted: asked, resource: { url: 'http://shop.test/report' } };
  return { x402Version: 2, paymentPayload, paymentRequirements: asked };
}

/** The same transaction in v1's shape. */
function v1Body(v2, { amount } = {}) {
  const r = v2.paymentRequirements;
  const required = {
    scheme: 'exact', network: 'solana-devnet', maxAmountRequired: amount ?? r.amount, resource: 'http://shop.test/report',
    description: '', mimeType: '', payTo: r.payTo, maxTimeoutSeconds: 60, asset: r.asset, extra: r.extra,
  };
  return {
    x402Version: 1,
    paymentPayload: { x402Version: 1, scheme: 'exact', network: 'solana-devnet', payload: v2.paymentPayload.payload },
    paymentRequirements: required,
  };
}

it('/supported lists the v1 and v2 kinds with the fee payer, and signers["solana:*"]', async () => {
  const res = await fetch(`${routerd.url}/supported`);
  const body = await res.json();
  const extra = { feePayer: feePayer.address };
  assert.deepEqual(body.kinds, [
    { x402Version: 1, scheme: 'exact', network: 'solana-devnet', extra },
    { x402Version: 2, scheme: 'exact', network: SOLANA_DEVNET_CAIP2, extra },
  ]);
  assert.deepEqual(body.signers, { 'solana:*': [feePayer.address] });
});

it('an @x402/svm payment verifies in v2 and in v1, payer named, no lamport spent', async () => {
  const { payer, payee } = await parties(1_000_000n);
  const before = await node.balance(feePayer.address);
  const body = await v2Body(payer, requirements(payee, 12_345));
  assert.deepEqual(await post('/verify', body), { status: 200, body: { isValid: true, payer: payer.address } });
  assert.deepEqual(await post('/verify', v1Body(body)), { status: 200, body: { isValid: true, payer: payer.address } });
  assert.equal(await node.balance(feePayer.address), before);
});

it('each refusal answers its v2 and v1 reason, and costs the fee payer nothing', async () => {
  const before = await node.balance(feePayer.address);
  const { payer, payee } = await parties(1_000_000n);
  const paid = await v2Body(payer, requirements(payee, 5_000));
  const cases = [];
  // Another amount asked than the transaction moves.
  const asked = requirements(payee, 6_000);
  cases.push(['amount', { ...paid, paymentPayload: { ...paid.paymentPayload, accepted: asked }, paymentRequirements: asked },
    'invalid_exact_svm_payload_amount_mismatch', 'invalid_exact_svm_payload_transaction_amount_mismatch', '6000']);
  // A payee with no token account.
  const bare = await parties(1_000_000n, { noAccount: true });
  cases.push(['no payee account', await v2Body(bare.payer, requirements(bare.payee, 5_000)),
    'invalid_exact_svm_payload_recipient_mismatch', 'invalid_exact_svm_payload_transaction_receiver_ata_not_found']);
  // A payer short of the amount.
  const poor = await parties(100n);
  cases.push(['balance', await v2Body(poor.payer, requirements(poor.payee, 5_000)), 'insufficient_funds', 'insufficient_funds']);
  // A memo the requirements ask that the transaction does not carry (@x402/svm's client writes its own).
  const memoAsked = requirements(payee, 5_000, { memo: 'order-1' });
  cases.push(['memo', { ...paid, paymentPayload: { ...paid.paymentPayload, accepted: memoAsked }, paymentRequirements: memoAsked },
    'invalid_exact_svm_payload_memo_mismatch', 'invalid_exact_svm_payload_transaction_instructions']);
  // A fee payer that is not routerd's.
  const stranger = requirements(payee, 5_000, { feePayer: (await newSolanaKeypair()).address });
  cases.push(['fee payer', { ...paid, paymentPayload: { ...paid.paymentPayload, accepted: stranger }, paymentRequirements: stranger },
    'invalid_exact_svm_fee_payer_not_managed_by_facilitator', 'invalid_payment_requirements']);
  // Not a transaction.
  cases.push(['garbage', { ...paid, paymentPayload: { ...paid.paymentPayload, payload: { transaction: 'AAAA' } } },
    'invalid_exact_svm_payload_transaction_could_not_be_decoded', 'invalid_exact_svm_payload_transaction']);
  for (const [what, body, v2Reason, v1Reason, v1Amount] of cases) {
    const two = await post('/verify', body);
    assert.equal(two.body.isValid, false, what);
    assert.equal(two.body.invalidReason, v2Reason, `${what}: ${JSON.stringify(two.body)}`);
    const one = await post('/verify', v1Body(body, { amount: v1Amount }));
    assert.equal(one.body.invalidReason, v1Reason, `${what} (v1): ${JSON.stringify(one.body)}`);
  }
  assert.equal(await node.balance(feePayer.address), before, 'no refusal costs the fee payer a lamport');
});

it('a node of another cluster is refused at start (getGenesisHash)', async () => {
  const other = await startSvmNode({ genesisHash: '4uhcVJyU9pJkvQyS88uRDiswHXSCkY3zQawwpjk2NsNY' });
  try {
    const configFile = join(tmp.dir, 'other.toml');
    const { writeFileSync } = await import('node:fs');
    writeFileSync(configFile, config(await freePort(), other.url));
    const run = spawnSync(routerdBin(), ['--config', configFile], { encoding: 'utf8', timeout: 30_000 });
    assert.equal(run.status, 2, run.stderr);
    assert.match(run.stderr, /genesis hash is 4uhcVJyU9pJkvQyS88uRDiswHXSCkY3zQawwpjk2NsNY/);
  } finally {
    await other.stop();
  }
});
