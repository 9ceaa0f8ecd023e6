// Solana settle across routerd instances sharing one PostgreSQL (storage.backend = "postgres"):
// the same payment sent to every instance at once is claimed once in the database, so one request
// is told the success, every other one the signature as a duplicate, and one transaction lands; an
// instance started later answers the status route and a duplicate from the shared record.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ExactSvmScheme as ExactSvmClient } from '@x402/svm/exact/client';
import {
  startSvmNode, newSolanaKeypair, writeKeypairFile, SOLANA_DEVNET_CAIP2, DEVNET_USDC_MINT,
} from './lib/svm.mjs';
import { startRouterd, freePort } from './lib/routerd.mjs';
import { makeTempDir, tailFile } from './lib/util.mjs';

const pgCluster = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'scripts', 'pg-cluster');
const PRICE = 10_000n;

let tmp;
let pgDir;
let url;
let node;
let feePayerFile;
let feePayer;
const instances = [];

async function startInstance(i) {
  const port = await freePort();
  const config = `[server]\nlisten = "127.0.0.1:${port}"\n[storage]\nbackend = "postgres"\ninstance_id = "svm-${i}"\n`
    + `[chains.solana-devnet]\nrpc_urls = ["${node.url}"]\n`
    + `[facilitator]\nnetworks = ["solana-devnet"]\nx402_versions = [1, 2]\nallow_http_resource = true\n`
    + `settle_timeout_secs = 10\nsvm_fee_payer_key_file = "${feePayerFile}"\n`;
  const dir = join(tmp.dir, `instance-${i}`);
  mkdirSync(dir);
  return startRouterd({ configToml: config, dir, port, env: { ROUTERD__STORAGE__POSTGRES_URL: url } });
}

before(async () => {
  tmp = makeTempDir('routerd-svm-instances-');
  pgDir = mkdtempSync(join(tmpdir(), 'routerd-pg-'));
  url = execFileSync(pgCluster, ['start', pgDir], { encoding: 'utf8', timeout: 300_000 }).trim();
  node = await startSvmNode({ slotMs: 100, logFile: join(tmp.dir, 'svm-node.log') });
  feePayer = await newSolanaKeypair();
  feePayerFile = join(tmp.dir, 'fee-payer.json');
  writeKeypairFile(feePayerFile, feePayer);
  await node.airdrop(feePayer.address, 5_000_000_000);
  await node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  for (let i = 0; i < 3; i += 1) instances.push(await startInstance(i));
});

after(async () => {
  await Promise.all(instances.map((r) => r.stop()));
  await node?.stop();
  if (pgDir) {
    spawnSync(pgCluster, ['stop', pgDir], { stdio: 'ignore' });
    rmSync(pgDir, { recursive: true, force: true });
  }
  tmp?.cleanup();
});

async function settle(instance, body) {
  const res = await fetch(`${instance.url}/settle`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  return res.json();
}

test('one payment sent to three instances on one PostgreSQL, three times each, at once: one success, one transaction', { timeout: 120_000 }, async () => {
  try {
    const payer = await newSolanaKeypair();
    const payee = await newSolanaKeypair();
    await node.mintTo(DEVNET_USDC_MINT, payer.address, 1_000_000n);
    const { tokenAccount } = await node.createTokenAccount(DEVNET_USDC_MINT, payee.address);
    const required = {
      scheme: 'exact', network: SOLANA_DEVNET_CAIP2, asset: DEVNET_USDC_MINT, amount: String(PRICE), payTo: payee.address,
      maxTimeoutSeconds: 60, extra: { feePayer: feePayer.address },
    };
    const partial = await new ExactSvmClient(payer.signer, { rpcUrl: node.url }).createPaymentPayload(2, required);
    const body = { x402Version: 2, paymentPayload: { ...partial, accepted: required, resource: { url: 'http://shop.test/r' } }, paymentRequirements: required };
    const transactions = (await node.status()).transactionCount;

    const answers = await Promise.all(instances.flatMap((instance) => [0, 1, 2].map(() => settle(instance, body))));

    const shown = JSON.stringify(answers);
    const successes = answers.filter((a) => a.success);
    assert.equal(successes.length, 1, shown);
    const signature = successes[0].transaction;
    for (const a of answers.filter((x) => !x.success)) {
      assert.deepEqual({ errorReason: a.errorReason, transaction: a.transaction }, { errorReason: 'duplicate_settlement', transaction: signature }, shown);
    }
    assert.equal(await node.tokenBalance(tokenAccount), PRICE);
    assert.equal((await node.status()).transactionCount, transactions + 1);

    const late = await startInstance(3);
    instances.push(late);
    const status = await (await fetch(`${late.url}/settlements/solana-devnet/${signature}`)).json();
    assert.equal(status.state, 'final', JSON.stringify(status));
    const again = await settle(late, body);
    assert.deepEqual({ success: again.success, errorReason: again.errorReason }, { success: false, errorReason: 'duplicate_settlement' });
  } catch (err) {
    err.message += instances.map((r, i) => `\n--- instance ${i} log ---\n${r.tail(15)}`).join('')
      + `\n--- svm node log ---\n${tailFile(join(tmp.dir, 'svm-node.log'), 15)}`;
    throw err;
  }
});
