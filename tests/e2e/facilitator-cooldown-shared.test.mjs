// Revert cooldowns are kept in the store (spec/access.md sections 2 and 3, "Cooldowns are shared"):
// a payer whose settlement reverted on chain (a smart wallet valid only where routerd's lens is,
// as in facilitator-costs) is refused with the KYT reason, nothing sent,
// - by the same daemon after a restart (SIGTERM) and after a crash (SIGKILL) on its sled store;
// - by a second instance sharing one PostgreSQL, at once on settle and within a second on verify,
//   and by both instances after they restart.
// Without the store every restarted or other instance would try the wallet again, and the
// operator would pay a second reverted settlement.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { getAddress } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { startRouterd } from './lib/routerd.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { expectSettled, expectSettleFailed, expectInvalid, expectValid, TX_HASH } from './lib/expect.mjs';
import { minedFrom, chainMark } from './lib/chain-audit.mjs';
import { ERC1271_VALID_WHERE_THE_LENS_IS, placeCode, metricValue } from './lib/hostile.mjs';
import { freePort, makeTempDir, readAnswer, sleep } from './lib/util.mjs';

const repo = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const pgCluster = join(repo, 'scripts', 'pg-cluster');
const PRICE = 1000n;
const KYT = 'invalid_exact_evm_payload_authorization_from_address_kyt';
const COOLDOWN_METRIC = 'routerd_payer_revert_cooldowns_total';
const SHARED_REFRESH_MS = 1000; // how often an instance reloads the cooldowns of a shared store

let stack;
let pgDir;
const instances = [];
const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({ anvil: { blockTime: 1 }, routerd: { settleTimeoutSecs: 30 } });
});

after(async () => {
  await Promise.all(instances.map((r) => r.stop()));
  await stack?.stop();
  if (pgDir) {
    spawnSync(pgCluster, ['stop', pgDir], { stdio: 'ignore' });
    rmSync(pgDir, { recursive: true, force: true });
  }
});

/** A fresh address holding the two-faced wallet's code and 10 prices of USDC. */
async function twoFacedWallet() {
  const address = freshAccount().address;
  await placeCode(stack.anvil, address, ERC1271_VALID_WHERE_THE_LENS_IS);
  await stack.mint(address, 10n * PRICE);
  return address;
}

const walletPayment = (wallet) => stack.pay({ account: freshAccount(), auth: { from: wallet }, amount: PRICE });

/** POST `path` to a daemon at `url`. */
async function post(url, path, body) {
  return readAnswer(await fetch(`${url}${path}`, {
    method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json' },
  }));
}

async function metric(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  return metricValue(text, COOLDOWN_METRIC);
}

/** An honest payment settles through the daemon at `url` (the lane works, and learns its gas). */
async function honestSettles(url) {
  const payer = await stack.newPayer(PRICE);
  const p = await stack.pay({ account: payer, amount: PRICE });
  expectSettled(await post(url, '/settle', p.body), { network: NETWORK, payer: payer.address });
}

/** Settles a payment of `wallet` through `url`: it reverts on chain, once. Returns its hash. */
async function revertOnce(url, wallet) {
  const p = await walletPayment(wallet);
  expectValid(await post(url, '/verify', p.body), { payer: wallet });
  const res = await post(url, '/settle', p.body);
  assert.equal(res.body?.success, false, `the settlement reverted on chain: ${res.text}`);
  assert.match(res.body.transaction, TX_HASH, res.text);
  assert.equal((await stack.receipt(res.body.transaction)).status, 'reverted');
  return res.body.transaction;
}

/** A new payment of `wallet` is refused on verify and settle at `url` with the KYT reason, unsent. */
async function expectCooledDown(url, wallet, where) {
  const q = await walletPayment(wallet);
  const nonce = await stack.signerNonce('pending');
  const v = await post(url, '/verify', q.body);
  expectInvalid(v, KYT, { payer: wallet });
  assert.match(v.body.invalidMessage, /revert_cooldown_secs/, `${where}: ${v.text}`);
  const s = await post(url, '/settle', q.body);
  expectSettleFailed(s, KYT, { network: NETWORK, payer: getAddress(wallet) });
  assert.equal(await stack.signerNonce('pending'), nonce, `${where}: nothing sent: ${s.text}`);
}

/** The signer's reverted transactions since `mark`: exactly `hashes`. */
async function expectRevertsOnly(mark, hashes) {
  const mined = await minedFrom(stack.anvil, [stack.signer], { fromBlock: mark.block });
  const reverted = mined.filter((t) => t.status === 'reverted').map((t) => t.hash);
  assert.deepEqual(reverted, hashes, `reverted settlements: ${JSON.stringify(mined.map((t) => [t.nonce, t.status]))}`);
}

it('sled: a cooled-down payer stays refused after a restart and after a crash, nothing sent', async () => {
  await honestSettles(stack.url);
  const mark = await chainMark(stack.anvil, stack.signer);
  const wallet = await twoFacedWallet();
  const hash = await revertOnce(stack.url, wallet);
  await expectCooledDown(stack.url, wallet, 'before the restart');
  assert.equal(await metric(stack.url), 1);

  await stack.routerd.restart();
  await expectCooledDown(stack.url, wallet, 'after a restart');
  await stack.routerd.kill();
  await stack.routerd.start();
  await expectCooledDown(stack.url, wallet, 'after a crash');
  assert.equal(await metric(stack.url), 0, 'the metric counts what this run imposed');

  await honestSettles(stack.url);
  await expectRevertsOnly(mark, [hash]);
});

/** The stack's config with the shared database instead of sled. */
function instanceConfig(port, id) {
  const sled = /\[storage\]\npath = "[^"]*"\n/;
  const toml = stack.configToml({ port });
  assert.match(toml, sled);
  return toml.replace(sled, `[storage]\nbackend = "postgres"\nlease_ttl_secs = 2\ninstance_id = "${id}"\n`);
}

async function startInstance(i, url) {
  const port = await freePort();
  return startRouterd({
    configToml: instanceConfig(port, `instance-${i}`),
    dir: makeTempDir(`routerd-cooldown-${i}-`).dir,
    port,
    env: { ROUTERD_SIGNER_KEY: stack.signerKey, ROUTERD__STORAGE__POSTGRES_URL: url },
  });
}

it('PostgreSQL: a payer cooled down through one instance is refused by the other, and by both after they restart', async () => {
  pgDir = mkdtempSync(join(tmpdir(), 'routerd-pg-'));
  const url = execFileSync(pgCluster, ['start', pgDir], { encoding: 'utf8', timeout: 300_000 }).trim();
  // The stack's own (sled) daemon holds the same key: it must not run beside the instances.
  await stack.routerd.stop();
  // One after another: the first holds the lane, the second stands by.
  for (let i = 0; i < 2; i += 1) instances.push(await startInstance(i, url));
  const [first, second] = instances;
  await honestSettles(first.url);
  const mark = await chainMark(stack.anvil, stack.signer);

  const wallet = await twoFacedWallet();
  const hash = await revertOnce(first.url, wallet);
  assert.equal(await metric(first.url), 1);
  // Settle on the other instance asks the store at once (no wait for its reload).
  const q = await walletPayment(wallet);
  const nonce = await stack.signerNonce('pending');
  expectSettleFailed(await post(second.url, '/settle', q.body), KYT, { network: NETWORK, payer: getAddress(wallet) });
  assert.equal(await stack.signerNonce('pending'), nonce, 'nothing sent');
  await sleep(SHARED_REFRESH_MS + 500);
  await expectCooledDown(second.url, wallet, 'on the other instance');

  for (const instance of instances) await instance.restart();
  for (const instance of instances) await expectCooledDown(instance.url, wallet, `after a restart of ${instance.url}`);
  await honestSettles(second.url);
  await expectRevertsOnly(mark, [hash]);
});
