// routerd on PostgreSQL (storage.backend = "postgres"): a throwaway cluster (scripts/pg-cluster,
// Debian's postgresql package, initdb in a temp dir as the postgres user). check-config connects
// and says whether it could, never showing the URL's password; the daemon creates its schema at
// start (versioned migrations) and serves; router nonce reservations are shared, so back-to-back
// calls that reach different instances get consecutive nonces.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { writeFileSync, readFileSync, rmSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startAnvil } from './lib/anvil.mjs';
import { startRouterd, routerdBin } from './lib/routerd.mjs';
import { freePort, makeTempDir, waitFor } from './lib/util.mjs';
import { anvilAccount, freshAccount } from './lib/accounts.mjs';

const repo = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const pgCluster = join(repo, 'scripts', 'pg-cluster');
const PASSWORD = 'hunter2-do-not-print';

let tmp;
let pgDir;
let url; // postgres://postgres@127.0.0.1:PORT/postgres (the cluster trusts local users)
let anvil;

before(async () => {
  tmp = makeTempDir('routerd-pg-e2e-');
  // Its own directory under /tmp: the postgres user must reach it (the test's is root's only).
  pgDir = mkdtempSync(join(tmpdir(), 'routerd-pg-'));
  url = execFileSync(pgCluster, ['start', pgDir], { encoding: 'utf8', timeout: 300_000 }).trim();
  anvil = await startAnvil({ chainId: 31337 });
});

after(async () => {
  await anvil?.stop?.();
  if (pgDir) {
    spawnSync(pgCluster, ['stop', pgDir], { stdio: 'ignore' });
    rmSync(pgDir, { recursive: true, force: true });
  }
  if (tmp) rmSync(tmp.dir, { recursive: true, force: true });
});

/** The URL with a password in it (trust authentication ignores it): it must never be shown. */
const withPassword = (u) => u.replace('postgres@', `postgres:${PASSWORD}@`);

function routerConfig(port) {
  return `[server]
listen = "127.0.0.1:${port}"
shutdown_grace_secs = 5

[storage]
backend = "postgres"

[chains.local]
chain_id = 31337
kind = "l1"
rpc_urls = ["${anvil.url}"]

[router]
chains = ["local"]
# 26 reservations of one caller in the test below; the 27th is one too many on either instance.
max_reservations_ahead = 26
`;
}

function cleanEnv(extra) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('ROUTERD')
    && k !== 'CREDENTIALS_DIRECTORY' && k !== 'STATE_DIRECTORY'));
  return { ...env, ...extra };
}

function checkConfig(postgresUrl) {
  const file = join(tmp.dir, 'check.toml');
  writeFileSync(file, routerConfig(18999));
  const r = spawnSync(routerdBin(), ['check-config', '--config', file], {
    env: cleanEnv({ ROUTERD__STORAGE__POSTGRES_URL: postgresUrl }), encoding: 'utf8', timeout: 60_000,
  });
  return { ...r, all: `exit ${r.status}\n--- stdout ---\n${r.stdout}\n--- stderr ---\n${r.stderr}` };
}

test('check-config connects to PostgreSQL, shows no password, and says the schema is not created yet', () => {
  const r = checkConfig(withPassword(url));
  assert.equal(r.status, 0, r.all);
  assert.match(r.stdout, /^# storage: connected to postgres:127\.0\.0\.1:\d+\/postgres \(PostgreSQL [\d.]+.*\); schema version 0, this routerd migrates to [1-9]\d*$/m, r.all);
  assert.match(r.stdout, /^postgres_url = "<redacted>"$/m, r.all);
  assert.ok(!r.all.includes(PASSWORD), r.all);
});

test('check-config against a server that is not there exits 1 naming storage.postgres_url, without the password', async () => {
  const closed = await freePort();
  const r = checkConfig(`postgres://postgres:${PASSWORD}@127.0.0.1:${closed}/postgres`);
  assert.equal(r.status, 1, r.all);
  assert.match(r.stderr, /storage\.postgres_url: cannot connect/, r.all);
  assert.ok(!r.all.includes(PASSWORD), r.all);
});

test('the daemon creates its schema at start, serves, and logs no password; a second start migrates nothing', async () => {
  const port = await freePort();
  const env = { ROUTERD__STORAGE__POSTGRES_URL: withPassword(url) };
  const routerd = await startRouterd({ configToml: routerConfig(port), env });
  try {
    const health = await fetch(`http://127.0.0.1:${port}/health`);
    assert.equal(health.status, 200);
  } finally {
    await routerd.stop();
  }
  const r = checkConfig(url);
  assert.equal(r.status, 0, r.all);
  const [, found, latest] = r.stdout.match(/schema version (\d+), this routerd migrates to (\d+)$/m) ?? [];
  assert.ok(found && found === latest, `the schema is at the latest version: ${r.all}`);
  const again = await startRouterd({ configToml: routerConfig(port), env });
  await again.stop();
  for (const daemon of [routerd, again]) {
    const log = readFileSync(daemon.logFile, 'utf8');
    assert.match(log, /routerd listening/);
    assert.ok(!log.includes(PASSWORD), 'the log shows the password');
    assert.doesNotMatch(log, /NOTICE/, 'the server\'s notices about existing relations reach the log');
  }
  assert.match(readFileSync(routerd.logFile, 'utf8'), /database schema migrated/);
  assert.doesNotMatch(readFileSync(again.logFile, 'utf8'), /database schema migrated/);
});

async function routerCall(port, from) {
  const res = await fetch(`http://127.0.0.1:${port}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      jsonrpc: '2.0', id: 1, method: 'eth_routerTransaction',
      params: [{ from, to: '0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC', data: '0x', value: '1000' }],
    }),
  });
  return res.json();
}

async function routerTransaction(port, from) {
  const body = await routerCall(port, from);
  assert.ok(body.result, JSON.stringify(body));
  return Number(BigInt(body.result.nonce));
}

test('router: back-to-back and concurrent calls reaching two instances get consecutive nonces', async () => {
  const env = { ROUTERD__STORAGE__POSTGRES_URL: url };
  const ports = [await freePort(), await freePort()];
  const daemons = [];
  for (const port of ports) daemons.push(await startRouterd({ configToml: routerConfig(port), env }));
  try {
    const from = '0x90F79bf6EB2c4f870365E785982E1f101E93b906';
    const sequential = [];
    for (let i = 0; i < 6; i += 1) sequential.push(await routerTransaction(ports[i % 2], from));
    assert.deepEqual(sequential, [0, 1, 2, 3, 4, 5]);
    const concurrent = await Promise.all(Array.from({ length: 20 }, (_, i) => routerTransaction(ports[i % 2], from)));
    assert.deepEqual([...concurrent].sort((a, b) => a - b), Array.from({ length: 20 }, (_, i) => 6 + i));
    // The bound ahead of the pending nonce is shared too: the 27th is refused on both.
    for (const port of ports) {
      const refused = await routerCall(port, from);
      assert.equal(refused.error?.code, -32005, JSON.stringify(refused));
    }
  } finally {
    await Promise.all(daemons.map((d) => d.stop()));
  }
});

test('router: what strangers can create is bounded: an infeasible route stores nothing, and reservations are deleted once expired', async () => {
  const env = { ROUTERD__STORAGE__POSTGRES_URL: url };
  const port = await freePort();
  const config = routerConfig(port).replace('[router]\n', '[router]\nnonce_reservation_ttl_secs = 2\n');
  const daemon = await startRouterd({ configToml: config, env });
  const count = () => Number(execFileSync('psql', [url, '-tAc', 'SELECT count(*) FROM router_nonces'], { encoding: 'utf8' }).trim());
  try {
    // Reservations left by the test above expire under this TTL too.
    await waitFor(async () => count() === 0, { timeoutMs: 15_000, what: 'earlier reservations deleted' });
    const before = count();
    // 40 senders without funds: no chain can execute their transactions, nothing is reserved.
    for (let i = 0; i < 40; i += 1) {
      const refused = await routerCall(port, freshAccount().address);
      assert.ok(refused.error, JSON.stringify(refused));
    }
    assert.equal(count(), before, 'an infeasible route stores nothing');
    // Three funded senders: three reservations, gone once their TTL has passed.
    const funded = [1, 2, 3].map((i) => anvilAccount(i).address);
    for (const from of funded) await routerTransaction(port, from);
    assert.equal(count(), before + 3);
    await waitFor(async () => count() === 0, { timeoutMs: 15_000, what: 'expired reservations deleted' });
  } finally {
    await daemon.stop();
  }
});
