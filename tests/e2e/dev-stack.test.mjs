// The README's first command, scripts/dev-stack, run as a developer runs it (on free ports, its
// data and configuration in a temporary directory): routerd serves solana-devnet beside
// base-sepolia, and the Solana payment its banner prints verifies and settles, in v2 and (--v1)
// with x402@1.2.0; the payee's token account receives both.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { openSync, closeSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { routerdBin } from './lib/routerd.mjs';
import { svmRpc } from './lib/svm.mjs';
import { freePort, makeTempDir, waitFor, trackChild, exited, tailFile } from './lib/util.mjs';

const REPO = fileURLToPath(new URL('../..', import.meta.url));
const AMOUNT = 10_000n;

let tmp;
let stack;
let logFile;
let banner;

before(async () => {
  tmp = makeTempDir('routerd-dev-stack-');
  logFile = join(tmp.dir, 'dev-stack.log');
  const [l1, l2, l3, svm, api] = [await freePort(), await freePort(), await freePort(), await freePort(), await freePort()];
  const out = openSync(logFile, 'a');
  stack = trackChild(spawn(join(REPO, 'scripts/dev-stack'), [], {
    cwd: REPO, detached: true, stdio: ['ignore', out, out],
    env: {
      ...process.env, ROUTERD_BIN: routerdBin(), DEV_DATA: join(tmp.dir, 'data'), DEV_CONFIG: join(tmp.dir, 'dev.toml'),
      DEV_L1_PORT: String(l1), DEV_L2_PORT: String(l2), DEV_L3_PORT: String(l3), DEV_SVM_PORT: String(svm), DEV_ROUTERD_PORT: String(api),
    },
  }));
  closeSync(out);
  const early = exited(stack).then(({ code }) => { throw new Error(`dev-stack exited (${code})\n${tailFile(logFile, 30)}`); });
  banner = await Promise.race([
    waitFor(() => {
      const text = readFileSync(logFile, 'utf8');
      return text.includes('routerd is up on') && text.includes('getTokenAccountBalance') ? text : null;
    }, { timeoutMs: 240_000, intervalMs: 250, what: 'dev-stack banner' }),
    early,
  ]);
  early.catch(() => {});
}, { timeout: 300_000 });

after(async () => {
  if (stack && stack.exitCode === null && stack.signalCode === null) {
    process.kill(-stack.pid, 'SIGTERM');
    await exited(stack);
  }
  tmp?.cleanup();
});

const it = (name, fn) => test(name, { timeout: 60_000 }, async () => {
  try {
    await fn();
  } catch (err) {
    err.message += `\n--- dev-stack log ---\n${tailFile(logFile, 40)}`;
    throw err;
  }
});

/** The printed Solana command's arguments, and the API's address. */
function printed() {
  const [, rpc, key] = banner.match(/svm-payment\.mjs --rpc (\S+) --key (\S+)/);
  const [, payTo, feePayer] = banner.match(/--pay-to (\S+) --fee-payer (\S+)/);
  const [, api] = banner.match(/routerd is up on (\S+)/);
  const [, payeeAccount] = banner.match(/payee \S+ \(token account (\S+)\)/);
  return { rpc, key, payTo, feePayer, api, payeeAccount };
}

async function post(url, body) {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  return { status: res.status, body: await res.json() };
}

it('conf/dev.toml serves solana-devnet with the generated fee payer, and /supported lists it', async () => {
  const config = readFileSync(join(tmp.dir, 'dev.toml'), 'utf8');
  assert.match(config, /^\[chains\.solana-devnet\]$/m);
  assert.match(config, /^networks = \["base-sepolia", "solana-devnet"\]$/m);
  assert.match(config, /^svm_fee_payer_key_file = ".*svm-fee-payer\.json"$/m);
  const { api, feePayer } = printed();
  const { kinds } = await (await fetch(`${api}/supported`)).json();
  assert.ok(kinds.some((k) => k.x402Version === 1 && k.network === 'solana-devnet' && k.extra?.feePayer === feePayer), JSON.stringify(kinds));
});

it('the Solana payment the banner prints verifies and settles, in v2 and in v1', async () => {
  const { rpc, key, payTo, feePayer, api, payeeAccount } = printed();
  const balance = async () => BigInt((await svmRpc(rpc, 'getTokenAccountBalance', [payeeAccount])).value.amount);
  const before = await balance();
  const command = (...extra) => execFileSync(process.execPath, ['tests/e2e/lib/svm-payment.mjs', '--rpc', rpc, '--key', key,
    '--pay-to', payTo, '--fee-payer', feePayer, '--amount', String(AMOUNT), ...extra], { cwd: REPO, encoding: 'utf8' });
  const verified = await post(`${api}/verify`, command());
  assert.equal(verified.body.isValid, true, JSON.stringify(verified.body));
  for (const extra of [[], ['--v1']]) {
    const settled = await post(`${api}/settle`, command(...extra));
    assert.equal(settled.body.success, true, `${extra}: ${JSON.stringify(settled.body)}`);
  }
  assert.equal(await balance(), before + 2n * AMOUNT);
});
