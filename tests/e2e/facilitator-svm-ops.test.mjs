// Operating a Solana facilitator (svm.md §4, access.md §5): /ready answers not ready while a fee
// payer's lamports cannot pay for one settlement, naming its public key (never its key file), and
// ready once funded; /metrics shows each fee payer's lamports, counts settlements by network
// family and the cluster's upstream requests; an API key scoped to a Solana payee (base58) verifies and settles to it and to no other.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ExactSvmScheme as ExactSvmClient } from '@x402/svm/exact/client';
import {
  startSvmNode, newSolanaKeypair, svmFacilitatorConfig, newFeePayer, testWithLogs, SOLANA_DEVNET_CAIP2, DEVNET_USDC_MINT,
} from './lib/svm.mjs';
import { startRouterd, freePort } from './lib/routerd.mjs';
import { makeTempDir, readAnswer, waitFor } from './lib/util.mjs';

const SHOP = 'token-of-the-solana-shop';
const EVM_SHOP = 'token-of-an-evm-shop';
const OPEN = 'token-of-any-payee';
const EVM_PAYEE = '0x90F79bf6EB2c4f870365E785982E1f101E93b906';
const sha = (token) => createHash('sha256').update(token).digest('hex');
const bearer = (token) => ({ authorization: `Bearer ${token}` });

let tmp;
let node;
let routerd;
let feePayer;
let feePayerFile;
let payee;
let stranger;

before(async () => {
  tmp = makeTempDir('routerd-svm-ops-');
  node = await startSvmNode({ slotMs: 100, logFile: join(tmp.dir, 'svm-node.log') });
  // Not funded yet: the first test reads /ready before and after the airdrop.
  ({ feePayer, feePayerFile } = await newFeePayer(node, tmp.dir, 0));
  await node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  [payee, stranger] = [await newSolanaKeypair(), await newSolanaKeypair()];
  for (const owner of [payee, stranger]) await node.createTokenAccount(DEVNET_USDC_MINT, owner.address);
  const keysFile = join(tmp.dir, 'api-keys.toml');
  writeFileSync(keysFile, `[keys.solana-shop]\nsha256 = "${sha(SHOP)}"\npay_to = ["${payee.address}"]\n\n`
    + `[keys.evm-shop]\nsha256 = "${sha(EVM_SHOP)}"\npay_to = ["${EVM_PAYEE}"]\n\n`
    + `[keys.open]\nsha256 = "${sha(OPEN)}"\n`);
  const config = svmFacilitatorConfig({
    port: await freePort(), storePath: join(tmp.dir, 'store'), rpcUrl: node.url, feePayerFile,
    extra: `[auth]\napi_keys_file = "${keysFile}"\n`,
  });
  routerd = await startRouterd({ configToml: config, dir: tmp.dir });
});

after(async () => {
  await routerd?.stop();
  await node?.stop();
  tmp?.cleanup();
});

const it = testWithLogs(test, () => tmp.dir);

async function request(path, { token = OPEN, body } = {}) {
  return readAnswer(await fetch(`${routerd.url}${path}`, {
    method: body ? 'POST' : 'GET',
    headers: { 'content-type': 'application/json', ...bearer(token) },
    body: body ? JSON.stringify(body) : undefined,
  }));
}

/** A payer holding USDC and no SOL, and @x402/svm's v2 payment of `amount` to `to`. */
async function payment(to, amount = 10_000) {
  const payer = await newSolanaKeypair();
  await node.mintTo(DEVNET_USDC_MINT, payer.address, 1_000_000n);
  const required = {
    scheme: 'exact', network: SOLANA_DEVNET_CAIP2, asset: DEVNET_USDC_MINT, amount: String(amount), payTo: to.address,
    maxTimeoutSeconds: 60, extra: { feePayer: feePayer.address },
  };
  const partial = await new ExactSvmClient(payer.signer, { rpcUrl: node.url }).createPaymentPayload(2, required);
  const paymentPayload = { ...partial, accepted: required, resource: { url: 'http://shop.test/report' } };
  return { x402Version: 2, paymentPayload, paymentRequirements: required };
}

/** The value of the one sample of `name` whose labels include `labels`, or undefined. */
function sample(text, name, labels) {
  const wanted = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  for (const line of text.split('\n')) {
    const m = line.match(/^([a-z_]+)\{([^}]*)\} (\S+)$/);
    if (m && m[1] === name && wanted.every((l) => m[2].split(',').includes(l))) return Number(m[3]);
  }
  return undefined;
}

it('/ready names an unfunded fee payer by its public key, never its key file, and is ready once it is funded', async () => {
  const res = await request('/ready');
  assert.equal(res.status, 503, res.text);
  const problem = res.body.problems.find((p) => p.signer === feePayer.address);
  assert.ok(problem, res.text);
  assert.equal(problem.network, 'solana-devnet');
  assert.match(problem.problem, /^balance 0 lamports is below \d+ lamports needed/);
  assert.ok(!res.text.includes(feePayerFile) && !res.text.includes('fee-payer.json'), res.text);
  assert.ok(!res.text.includes(node.url), 'no RPC URL in /ready');

  // Above the rent-exempt minimum it must keep, below it and one settlement's fees: still not ready.
  // Lamports are read again after a slot time, never per request (access.md §3c).
  await node.airdrop(feePayer.address, 900_000);
  const short = await waitFor(async () => {
    const r = await request('/ready');
    return r.body?.problems?.find((p) => p.signer === feePayer.address)?.problem.startsWith('balance 900000') ? r : null;
  }, { what: '/ready naming 900000 lamports after a slot time' });
  assert.equal(short.status, 503, short.text);
  assert.match(short.body.problems.find((p) => p.signer === feePayer.address).problem, /^balance 900000 lamports is below 910880 lamports/);
  // What the packaged fee payer alerts read (under 500, under 50): the settlements the lamports
  // above the rent-exempt minimum (890880) pay for, at the most one costs (20000).
  const left = (text) => sample(text, 'routerd_fee_payer_settlements_left', { network: 'solana-devnet', signer: feePayer.address });
  assert.equal(left((await request('/metrics')).text), 0);

  await node.airdrop(feePayer.address, 5_000_000_000);
  const ready = await waitFor(async () => {
    const r = await request('/ready');
    return r.status === 200 ? r : null;
  }, { what: '/ready 200 once the fee payer is funded' });
  assert.equal(ready.body.ready, true);
  const metrics = await request('/metrics');
  assert.equal(sample(metrics.text, 'routerd_fee_payer_balance_lamports', { network: 'solana-devnet', signer: feePayer.address }),
    5_000_900_000, metrics.text);
  assert.equal(left(metrics.text), 250_000, metrics.text);
});

it('a key scoped to a Solana payee verifies and settles to it, and to no other payee; an EVM-scoped key to none', async () => {
  const toPayee = await payment(payee);
  const toStranger = await payment(stranger);
  for (const path of ['/verify', '/settle']) {
    const refused = await request(path, { token: SHOP, body: toStranger });
    assert.equal(refused.status, 403, `${path}: ${refused.text}`);
    assert.equal(refused.body.error, 403);
    const evm = await request(path, { token: EVM_SHOP, body: toPayee });
    assert.equal(evm.status, 403, `${path} (EVM-scoped key): ${evm.text}`);
  }
  const verified = await request('/verify', { token: SHOP, body: toPayee });
  assert.equal(verified.body.isValid, true, verified.text);
  const settled = await request('/settle', { token: SHOP, body: toPayee });
  assert.equal(settled.body.success, true, settled.text);
  // An array settle refuses the stranger's element in its slot, and settles the payee's.
  const array = await request('/settle', { token: SHOP, body: [toStranger, await payment(payee)] });
  assert.equal(array.status, 200, array.text);
  assert.equal(array.body[0].error, 403, array.text);
  assert.equal(array.body[1].success, true, array.text);
});

it('/metrics counts Solana settlements under family="svm", and the cluster\'s upstream requests by <chain>#<index>', async () => {
  const { text } = await request('/metrics');
  assert.equal(sample(text, 'routerd_settlements_total', { family: 'svm', outcome: 'success' }), 2, text);
  assert.equal(sample(text, 'routerd_settlements_total', { family: 'evm', outcome: 'success' }), undefined, text);
  const upstream = { chain: 'solana-devnet', upstream: 'solana-devnet#0' };
  assert.ok(sample(text, 'routerd_upstream_requests_total', upstream) > 0, text);
  assert.equal(sample(text, 'routerd_upstream_errors_total', upstream), 0, text);
  assert.ok(!text.includes(node.url), 'no RPC URL in /metrics');
});
