// The configuration of the `batch-settlement` scheme (spec: batch-settlement.md "Configuration"):
// with `facilitator.batch_settlement = true`, routerd starts only where every served EVM network
// has code at the scheme's three contracts (exit 2 naming the chain and the contract's key
// otherwise); `check-config` shows the receiver authorizer's address, never its key; a bad
// `facilitator.batch_max_calls_per_tx` or authorizer key file stops the start naming the key.
//
// One anvil, with no contract at the presets' addresses at first; `anvil_setCode` places code
// there (any code: routerd checks only that some is there) as the cases go.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { startAnvil } from './lib/anvil.mjs';
import { anvilKey, ROLE } from './lib/accounts.mjs';
import { routerdConfig, routerdBin, startRouterd } from './lib/routerd.mjs';
import { freePort, makeTempDir } from './lib/util.mjs';

// The presets: the x402 foundation's CREATE2 deployment, the same on every chain.
const CONTRACTS = Object.freeze({
  batch_settlement: '0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003',
  erc3009_deposit_collector: '0x4020806089470a89826cB9fB1f4059150b550004',
  permit2_deposit_collector: '0x4020425FAf3B746C082C2f942b4E5159887B0005',
});
// The token is never called here: any address does.
const TOKEN = '0x5FbDB2315678afecb367f032d93F642f64180aa3';
const AUTHORIZER_KEY = generatePrivateKey();
const AUTHORIZER = privateKeyToAccount(AUTHORIZER_KEY).address;

let anvil;
let tmp;
let authorizerFile;
let routerd;

before(async () => {
  anvil = await startAnvil();
  tmp = makeTempDir();
  authorizerFile = join(tmp.dir, 'authorizer.key');
  writeFileSync(authorizerFile, `${AUTHORIZER_KEY}\n`);
});

after(async () => {
  await routerd?.stop();
  await anvil?.stop();
});

/** A facilitator on one anvil chain, with `facilitatorLines` added to `[facilitator]`. */
function config(facilitatorLines, port = 0) {
  return routerdConfig({
    port,
    storePath: join(tmp.dir, `store-${Math.random().toString(36).slice(2)}`),
    chains: [{ name: 'chainX', chainId: anvil.chainId, rpcUrl: anvil.url, token: TOKEN }],
    networks: ['chainX'],
    denyListFile: '',
    x402Versions: [1, 2],
    extra: facilitatorLines,
  });
}

/** routerd (or `check-config`) on `toml` until it exits: {status, out}. */
function run(toml, args = []) {
  const file = join(tmp.dir, `routerd-${Math.random().toString(36).slice(2)}.toml`);
  writeFileSync(file, toml);
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('ROUTERD')));
  const r = spawnSync(routerdBin(), [...args, '--config', file], {
    env: { ...env, ROUTERD_SIGNER_KEY: anvilKey(ROLE.signer) }, encoding: 'utf8', timeout: 30_000,
  });
  if (r.error) throw r.error;
  return { status: r.status, out: `${r.stdout}\n${r.stderr}` };
}

const ON = `batch_settlement = true\nreceiver_authorizer_key_file = ${JSON.stringify('')}\n`;
const onWithKey = () => `batch_settlement = true\nreceiver_authorizer_key_file = ${JSON.stringify(authorizerFile)}\n`;

const setCode = (address, code) => anvil.rpc('anvil_setCode', [address, code]);

test('with the scheme on and no contract code, routerd exits 2 naming the chain and the contract', () => {
  const { status, out } = run(config(ON));
  assert.equal(status, 2, out);
  assert.match(out, /chains\.chainX\.contracts\.batch_settlement: no contract code at 0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003/);
});

test('with the scheme off, the missing contracts do not matter', async () => {
  const port = await freePort();
  const { dir } = makeTempDir();
  routerd = await startRouterd({
    dir, port, configToml: config('', port), env: { ROUTERD_SIGNER_KEY: anvilKey(ROLE.signer) },
  });
  assert.equal((await fetch(`${routerd.url}/health`)).status, 200);
  await routerd.stop();
  routerd = undefined;
});

test('check-config prints the receiver authorizer address and never its key', () => {
  const { status, out } = run(config(onWithKey()), ['check-config']);
  assert.equal(status, 0, out);
  assert.match(out, new RegExp(`receiver authorizer address: ${AUTHORIZER}`, 'i'));
  assert.ok(!out.toLowerCase().includes(AUTHORIZER_KEY.slice(2).toLowerCase()), out);
  assert.ok(out.includes(`receiver_authorizer_key_file = ${JSON.stringify(authorizerFile)}`), out);
  assert.match(out, /^batch_settlement = true$/m);
  assert.match(out, /^batch_settlement = "0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003"  # preset$/m);
});

test('batch_max_calls_per_tx = 0 exits 2 naming the key', () => {
  for (const args of [[], ['check-config']]) {
    const { status, out } = run(config(`${ON}batch_max_calls_per_tx = 0\n`), args);
    assert.equal(status, 2, out);
    assert.match(out, /facilitator\.batch_max_calls_per_tx: must be at least 1/);
  }
});

test('a malformed authorizer key file exits 2 naming the key, never its content', () => {
  const bad = join(tmp.dir, 'bad-authorizer.key');
  const almost = `${AUTHORIZER_KEY.slice(0, 60)}`;
  writeFileSync(bad, `${almost}\n`);
  const lines = `batch_settlement = true\nreceiver_authorizer_key_file = ${JSON.stringify(bad)}\n`;
  for (const args of [[], ['check-config']]) {
    const { status, out } = run(config(lines), args);
    assert.equal(status, 2, out);
    assert.match(out, /facilitator\.receiver_authorizer_key_file: .* does not hold one 32-byte 0x-hex private key/);
    assert.ok(!out.includes(almost.slice(2)), out);
  }
});

test('one contract still missing is named; with all three placed routerd starts', async () => {
  await setCode(CONTRACTS.batch_settlement, '0x00');
  await setCode(CONTRACTS.erc3009_deposit_collector, '0x00');
  const { status, out } = run(config(ON));
  assert.equal(status, 2, out);
  assert.match(out, /chains\.chainX\.contracts\.permit2_deposit_collector: no contract code at 0x4020425FAf3B746C082C2f942b4E5159887B0005/);

  await setCode(CONTRACTS.permit2_deposit_collector, '0x00');
  const port = await freePort();
  const { dir } = makeTempDir();
  routerd = await startRouterd({
    dir, port, configToml: config(onWithKey(), port), env: { ROUTERD_SIGNER_KEY: anvilKey(ROLE.signer) },
  });
  assert.equal((await fetch(`${routerd.url}/health`)).status, 200);
  assert.match(routerd.tail(200), new RegExp(`receiver_authorizer=${AUTHORIZER}`, 'i'));
  assert.ok(!routerd.tail(400).toLowerCase().includes(AUTHORIZER_KEY.slice(2).toLowerCase()));
});

test('a contract moved elsewhere by the file is the one checked', () => {
  const moved = '0x00000000000000000000000000000000000b0a7c';
  const lines = `${ON}[chains.chainX.contracts]\nbatch_settlement = ${JSON.stringify(moved)}\n`;
  const { status, out } = run(config(lines));
  assert.equal(status, 2, out);
  assert.match(out, /chains\.chainX\.contracts\.batch_settlement: no contract code at 0x00000000000000000000000000000000000B0A7C/i);
});
