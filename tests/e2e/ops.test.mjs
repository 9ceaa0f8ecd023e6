// Operating routerd (spec/config.md: Command line, Endpoints, Deployment): /health, /ready and what
// a 503 names (a stopped chain, a signer without gas), the Prometheus metrics, `check-config`
// (exit 0 or 2 naming the key, env overrides, keys never shown), `--log-format json`, and the
// systemd environment (STATE_DIRECTORY, CREDENTIALS_DIRECTORY) without systemd.
//
// One anvil chain (base-sepolia) with USDC and one daemon for the whole file; the test that stops
// the chain runs last.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync, mkdirSync, existsSync, chmodSync } from 'node:fs';
import { join } from 'node:path';
import { startFacilitatorStack, withLogTail, NETWORK, CHAIN_ID } from './lib/stack.mjs';
import { Routerd, routerdBin, SHUTDOWN_GRACE_SECS } from './lib/routerd.mjs';
import { freePort, waitFor, makeTempDir, readAnswer } from './lib/util.mjs';
import { expectSettled } from './lib/expect.mjs';

// Short chain polling for this file's daemon, so that a stopped chain shows in /ready within
// about poll_interval_ms * 5 + request_timeout_ms (2.25 s) instead of the default 7.5 s.
const POLL_MS = 250;
const REQUEST_TIMEOUT_MS = 1000;

let stack;
let jsonDaemon; // the second daemon, with --log-format json
let tmp;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack();
  tmp = makeTempDir('routerd-ops-');
  // The stack writes its chain tables itself: add the short polling and start again.
  const file = stack.routerd.configFile;
  const text = readFileSync(file, 'utf8');
  const header = `[chains.${NETWORK}]\n`;
  assert.ok(text.includes(header), `no ${header.trim()} in ${file}`);
  writeFileSync(file, text.replace(header, `${header}poll_interval_ms = ${POLL_MS}\nrequest_timeout_ms = ${REQUEST_TIMEOUT_MS}\n`));
  await stack.routerd.restart();
});

after(async () => {
  await jsonDaemon?.stop();
  await stack?.stop();
  tmp?.cleanup();
});

/** The signer key as it could leak: hex digits without 0x, lowercase. */
const keyHex = () => stack.signerKey.slice(2).toLowerCase();

async function getJson(url) {
  return readAnswer(await fetch(url));
}

// ---------------------------------------------------------------------------------------------
// Prometheus text, parsed just enough: samples as {name, labels, value}.

function parseMetrics(text) {
  const samples = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/);
    assert.ok(m, `not a sample line: ${JSON.stringify(line)}`);
    const labels = {};
    for (const [, k, v] of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v;
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

/** Samples named `name` whose labels include `labels`. */
function find(samples, name, labels = {}) {
  return samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
}

/** The one sample named `name` with `labels`; fails listing what there is. */
function one(samples, name, labels = {}) {
  const hits = find(samples, name, labels);
  assert.equal(hits.length, 1, `${name}${JSON.stringify(labels)}: expected one sample, got ${hits.length}; `
    + `samples of that name: ${JSON.stringify(find(samples, name))}`);
  return hits[0];
}

async function scrape(url = stack.url) {
  const res = await fetch(`${url}/metrics`);
  const text = await res.text();
  assert.equal(res.status, 200, text);
  return { text, samples: parseMetrics(text), contentType: res.headers.get('content-type') };
}

// ---------------------------------------------------------------------------------------------
// /health and /ready

it('GET /health answers 200 {"status":"ok"}', async () => {
  const res = await getJson(`${stack.url}/health`);
  assert.equal(res.status, 200, res.text);
  assert.deepEqual(res.body, { status: 'ok' });
});

it('GET /ready answers 200 {"ready":true} when the chain answers and the signer has gas', async () => {
  // The read mode is probed in the background at start; readiness does not wait for it.
  const res = await waitFor(async () => {
    const r = await getJson(`${stack.url}/ready`);
    return r.status === 200 && r.body?.readModes?.[stack.network] !== 'unknown' ? r : null;
  }, { timeoutMs: 10_000, what: '/ready = 200' });
  assert.deepEqual(res.body, { ready: true, readModes: { [stack.network]: 'lens' } });
  assert.match(res.headers.get('content-type') ?? '', /application\/json/);
});

it('a signer with zero ETH makes /ready 503 naming the signer; funding it makes it 200 again', async () => {
  const balance = await stack.client.getBalance({ address: stack.signer });
  // Funds are read again at a new head, never per request (access.md §3c): a block follows.
  await stack.anvil.rpc('anvil_setBalance', [stack.signer, '0x0']);
  await stack.anvil.rpc('evm_mine', []);
  try {
    const res = await waitFor(async () => {
      const r = await getJson(`${stack.url}/ready`);
      return r.status === 503 ? r : null;
    }, { timeoutMs: 10_000, what: '/ready = 503 at the next head' });
    assert.equal(res.status, 503, res.text);
    assert.equal(res.body?.ready, false, res.text);
    assert.ok(Array.isArray(res.body.problems), res.text);
    const signerProblems = res.body.problems.filter((p) => p.signer !== undefined);
    assert.equal(signerProblems.length, 1, res.text);
    const [p] = signerProblems;
    assert.equal(p.signer.toLowerCase(), stack.signer.toLowerCase(), res.text);
    assert.equal(p.network, NETWORK, res.text);
    assert.match(p.problem, /balance 0 wei is below \d+ wei/, res.text);
    assert.ok(!res.body.problems.some((q) => q.chain !== undefined), `the chain itself is fine: ${res.text}`);
    assert.ok(!res.text.toLowerCase().includes(keyHex()), 'the /ready body shows the signer key');
  } finally {
    await stack.anvil.rpc('anvil_setBalance', [stack.signer, `0x${balance.toString(16)}`]);
    await stack.anvil.rpc('evm_mine', []);
  }
  const res = await waitFor(async () => {
    const r = await getJson(`${stack.url}/ready`);
    return r.status === 200 ? r : null;
  }, { timeoutMs: 10_000, what: '/ready = 200 at the next head' });
  assert.equal(res.status, 200, res.text);
});

// ---------------------------------------------------------------------------------------------
// /metrics

it('GET /metrics is Prometheus text with requests, latency, settlements, upstream, signer and chain metrics', async () => {
  for (let i = 0; i < 3; i++) assert.equal((await fetch(`${stack.url}/health`)).status, 200);
  assert.equal((await fetch(`${stack.url}/nope`)).status, 404);
  const payer = await stack.newPayer(5000n);
  const p = await stack.pay({ account: payer, amount: 1000n });
  expectSettled(await stack.settle(p.body), { network: NETWORK, payer: payer.address });

  const { text, samples, contentType } = await scrape();
  assert.match(contentType ?? '', /^(application\/openmetrics-text|text\/plain)/, contentType);
  assert.match(text, /# EOF\n?$/, 'OpenMetrics text ends with # EOF');
  assert.match(text, /^# TYPE routerd_http_requests counter$/m);
  assert.match(text, /^# TYPE routerd_http_request_duration_seconds histogram$/m);

  // Requests by route and status (counters carry the _total suffix).
  assert.ok(one(samples, 'routerd_http_requests_total', { route: '/health', status: '200' }).value >= 3);
  assert.equal(one(samples, 'routerd_http_requests_total', { route: '/settle', status: '200' }).value, 1);
  assert.ok(one(samples, 'routerd_http_requests_total', { route: 'other', status: '404' }).value >= 1,
    'unknown paths share one label');

  // Latency histogram for a route: increasing buckets up to +Inf, which equals _count.
  const buckets = find(samples, 'routerd_http_request_duration_seconds_bucket', { route: '/health' });
  assert.ok(buckets.length >= 2, `histogram buckets for /health: ${JSON.stringify(buckets)}`);
  const count = one(samples, 'routerd_http_request_duration_seconds_count', { route: '/health' }).value;
  assert.ok(count >= 3);
  assert.equal(one(samples, 'routerd_http_request_duration_seconds_bucket', { route: '/health', le: '+Inf' }).value, count);
  const values = buckets.map((b) => b.value);
  assert.deepEqual(values, [...values].sort((a, b) => a - b), 'cumulative buckets never decrease');
  assert.ok(one(samples, 'routerd_http_request_duration_seconds_sum', { route: '/settle' }).value > 0);

  // Settlements by outcome.
  assert.equal(one(samples, 'routerd_settlements_total', { family: 'evm', outcome: 'success' }).value, 1);

  // Upstream calls by chain and upstream, named by its place in rpc_urls (never its URL).
  const upstream = { chain: NETWORK, upstream: `${NETWORK}#0` };
  assert.ok(one(samples, 'routerd_upstream_requests_total', upstream).value > 0);
  assert.equal(one(samples, 'routerd_upstream_errors_total', upstream).value, 0);

  // Signer balance and nonce, read from the chain at scrape time.
  const signer = { network: NETWORK, signer: stack.signer.toLowerCase() };
  const balance = await stack.client.getBalance({ address: stack.signer });
  const reported = one(samples, 'routerd_signer_balance_wei', signer).value;
  assert.ok(Math.abs(reported - Number(balance)) <= Number(balance) * 1e-9, `balance ${reported} vs ${balance}`);
  assert.equal(one(samples, 'routerd_signer_nonce', signer).value, await stack.signerNonce('pending'));

  // Nothing waits for a receipt once the settle answered; the head follows the chain.
  assert.equal(one(samples, 'routerd_pending_settlements').value, 0);
  const head = one(samples, 'routerd_chain_head_block', { chain: NETWORK }).value;
  const block = Number(await stack.client.getBlockNumber());
  assert.ok(head >= 1 && head <= block, `head ${head}, chain at ${block}`);
});

// ---------------------------------------------------------------------------------------------
// check-config

/** The environment without the caller's ROUTERD_* variables, plus `extra`. */
function cleanEnv(extra = {}) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('ROUTERD')
    && k !== 'CREDENTIALS_DIRECTORY' && k !== 'STATE_DIRECTORY'));
  return { ...env, ...extra };
}

/** Run the routerd binary to completion: {status, stdout, stderr}. */
function runRouterd(args, env = {}) {
  const r = spawnSync(routerdBin(), args, { env: cleanEnv(env), encoding: 'utf8', timeout: 30_000 });
  if (r.error) throw r.error;
  return { status: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr };
}

/**
 * A facilitator config on a network with a mixed-case name (`chainX`, as in the spec); the listen
 * address, RPC URL and USDC address are fixed placeholders unless given.
 */
function chainXConfig({
  listen = '127.0.0.1:18080', chainId = 84532, rpcUrl = 'http://127.0.0.1:18545',
  usdc = '0x5FbDB2315678afecb367f032d93F642f64180aa3', extraServer = '', facilitatorExtra = '',
} = {}) {
  return `[server]
listen = "${listen}"
${extraServer}
[chains.chainX]
chain_id = ${chainId}
kind = "l2"
rpc_urls = ["${rpcUrl}"]

[chains.chainX.tokens.USDC]
address = "${usdc}"
eip712_name = "USD Coin"
eip712_version = "2"

[facilitator]
networks = ["chainX"]
${facilitatorExtra}`;
}

function writeConfig(name, text) {
  const file = join(tmp.dir, name);
  writeFileSync(file, text);
  return file;
}

const show = (r) => `exit ${r.status}\n--- stdout ---\n${r.stdout}\n--- stderr ---\n${r.stderr}`;

it('check-config prints the effective configuration, the signer address and no key, and exits 0', async () => {
  const file = writeConfig('good.toml', chainXConfig());
  const r = runRouterd(['check-config', '--config', file], { ROUTERD_SIGNER_KEY: stack.signerKey });
  assert.equal(r.status, 0, show(r));
  assert.match(r.stdout, /^\[chains\.chainX\]$/m, show(r));
  assert.match(r.stdout, /^rpc_urls = \["http:\/\/127\.0\.0\.1:18545"\]$/m, show(r));
  assert.match(r.stdout, /^listen = "127\.0\.0\.1:18080"$/m, show(r));
  // Defaults are filled in: the effective configuration, not the file.
  assert.match(r.stdout, /^shutdown_grace_secs = 30$/m, show(r));
  assert.match(r.stdout, /^settle_timeout_secs = 60$/m, show(r));
  // chainX is no known network and sets no max_fee_per_gas: one is derived at start (access.md section 2).
  assert.match(r.stdout, /^# max_fee_per_gas: derived at start from the fees of the chain's recent blocks$/m, show(r));
  assert.ok(r.stdout.toLowerCase().includes(stack.signer.toLowerCase()), `signer address missing: ${show(r)}`);
  assert.ok(!(r.stdout + r.stderr).toLowerCase().includes(keyHex()), 'check-config printed the signer key');
});

it('check-config reads the key from signer_key_file or $CREDENTIALS_DIRECTORY/signer-key and shows neither key', async () => {
  const keyFile = join(tmp.dir, 'keys.txt');
  writeFileSync(keyFile, `# the facilitator key\n${stack.signerKey}\n`);
  chmodSync(keyFile, 0o600);
  const withFile = writeConfig('keyfile.toml', chainXConfig({ facilitatorExtra: `signer_key_file = ${JSON.stringify(keyFile)}\n` }));
  let r = runRouterd(['check-config', '--config', withFile]);
  assert.equal(r.status, 0, show(r));
  assert.ok(r.stdout.includes(`signer_key_file = ${JSON.stringify(keyFile)}`), `the path is shown: ${show(r)}`);
  assert.ok(r.stdout.toLowerCase().includes(stack.signer.toLowerCase()), show(r));
  assert.ok(!(r.stdout + r.stderr).toLowerCase().includes(keyHex()), 'check-config printed the key from the file');

  const creds = join(tmp.dir, 'credentials');
  mkdirSync(creds, { recursive: true });
  writeFileSync(join(creds, 'signer-key'), `${stack.signerKey}\n`);
  const plain = writeConfig('creds.toml', chainXConfig());
  r = runRouterd(['check-config', '--config', plain], { CREDENTIALS_DIRECTORY: creds });
  assert.equal(r.status, 0, show(r));
  assert.ok(r.stdout.toLowerCase().includes(stack.signer.toLowerCase()), show(r));
  assert.ok(!(r.stdout + r.stderr).toLowerCase().includes(keyHex()), 'check-config printed the credential');
});

it('check-config: [storage] path defaults to $STATE_DIRECTORY/routerd.db (systemd StateDirectory)', async () => {
  const file = writeConfig('state.toml', chainXConfig());
  const r = runRouterd(['check-config', '--config', file], { ROUTERD_SIGNER_KEY: stack.signerKey, STATE_DIRECTORY: '/var/lib/routerd' });
  assert.equal(r.status, 0, show(r));
  assert.match(r.stdout, /^\[storage\]\nbackend = "sled"\n(?:\w+ = .*\n)*path = "\/var\/lib\/routerd\/routerd\.db"$/m, show(r));
});

it('ROUTERD__CHAINS__CHAINX__RPC_URLS overrides the file (comma-separated list), as check-config shows', async () => {
  const file = writeConfig('env.toml', chainXConfig());
  const r = runRouterd(['check-config', '--config', file], {
    ROUTERD_SIGNER_KEY: stack.signerKey,
    ROUTERD__CHAINS__CHAINX__RPC_URLS: 'http://127.0.0.1:18601, http://127.0.0.1:18602',
    ROUTERD__SERVER__SHUTDOWN_GRACE_SECS: '7',
  });
  assert.equal(r.status, 0, show(r));
  assert.match(r.stdout, /^rpc_urls = \["http:\/\/127\.0\.0\.1:18601","http:\/\/127\.0\.0\.1:18602"\]$/m, show(r));
  assert.ok(!r.stdout.includes('18545'), `the file's URL is replaced: ${show(r)}`);
  assert.match(r.stdout, /^shutdown_grace_secs = 7$/m, show(r));
});

// Network names may contain '-' (chainX-testnet, base-sepolia), which no shell or systemd
// Environment= line accepts in a variable name (systemd: "Invalid environment assignment,
// ignoring"). Under systemd the only spelling available is '_', and routerd reads it as '-'.
test('ROUTERD__CHAINS__CHAINX_TESTNET__RPC_URLS reaches [chains.chainX-testnet]', () => {
  const file = writeConfig('dash.toml', chainXConfig().replaceAll('chainX', 'chainX-testnet'));
  const r = runRouterd(['check-config', '--config', file], {
    ROUTERD_SIGNER_KEY: stack.signerKey,
    ROUTERD__CHAINS__CHAINX_TESTNET__RPC_URLS: 'http://127.0.0.1:18603',
  });
  assert.equal(r.status, 0, show(r));
  assert.match(r.stdout, /^rpc_urls = \["http:\/\/127\.0\.0\.1:18603"\]$/m, show(r));
});

it('a later --config file overrides an earlier one', async () => {
  const base = writeConfig('base.toml', chainXConfig());
  const over = writeConfig('over.toml', '[server]\nlisten = "127.0.0.1:18099"\n');
  const r = runRouterd(['check-config', '--config', base, '--config', over], { ROUTERD_SIGNER_KEY: stack.signerKey });
  assert.equal(r.status, 0, show(r));
  assert.match(r.stdout, /^listen = "127\.0\.0\.1:18099"$/m, show(r));
});

/** check-config (and the daemon itself) exit 2 with the key at fault named on stderr. */
function expectBadConfig(args, env, key, { alsoDaemon = true } = {}) {
  const r = runRouterd(['check-config', ...args], { ROUTERD_SIGNER_KEY: stack.signerKey, ...env });
  assert.equal(r.status, 2, show(r));
  assert.ok(r.stderr.includes(key), `stderr should name ${key}: ${show(r)}`);
  if (alsoDaemon) {
    // A bad configuration never starts a half-working daemon: it exits 2 before listening.
    const d = runRouterd(args, { ROUTERD_SIGNER_KEY: stack.signerKey, ...env });
    assert.equal(d.status, 2, `daemon: ${show(d)}`);
    assert.ok(d.stderr.includes(key), `daemon stderr should name ${key}: ${show(d)}`);
  }
  return r;
}

it('chain_id = 0 exits 2 naming chains.chainX.chain_id', async () => {
  const file = writeConfig('zero.toml', chainXConfig({ chainId: 0 }));
  expectBadConfig(['--config', file], {}, 'chains.chainX.chain_id');
});

it('an unknown key exits 2 naming it', async () => {
  const file = writeConfig('unknown.toml', chainXConfig({ extraServer: 'listen_adress = "127.0.0.1:1"\n' }));
  expectBadConfig(['--config', file], {}, 'listen_adress');
});

it('ROUTERD__SERVER__LISTEN=garbage exits 2 naming server.listen', async () => {
  const file = writeConfig('garbage.toml', chainXConfig());
  expectBadConfig(['--config', file], { ROUTERD__SERVER__LISTEN: 'garbage' }, 'server.listen');
});

it('a bad value from the environment for a mixed-case network is named with the file\'s spelling', async () => {
  const file = writeConfig('envzero.toml', chainXConfig());
  expectBadConfig(['--config', file], { ROUTERD__CHAINS__CHAINX__CHAIN_ID: '0' }, 'chains.chainX.chain_id');
});

it('a facilitator without a usable key exits 2 and never echoes the bad key', async () => {
  const file = writeConfig('nokey.toml', chainXConfig());
  const r = runRouterd(['check-config', '--config', file]);
  assert.equal(r.status, 2, show(r));
  assert.match(r.stderr, /signer/i, show(r));
  const bad = `${stack.signerKey.slice(0, 40)}zz`; // key-shaped, not hex
  const m = runRouterd(['check-config', '--config', file], { ROUTERD_SIGNER_KEY: bad });
  assert.equal(m.status, 2, show(m));
  assert.ok(m.stderr.includes('ROUTERD_SIGNER_KEY'), `names the source: ${show(m)}`);
  assert.ok(!(m.stdout + m.stderr).includes(bad.slice(2, 30)), `echoed the bad key: ${show(m)}`);
});

// ---------------------------------------------------------------------------------------------
// --log-format json, and the systemd environment without systemd

it('--log-format json: one JSON object per line; request lines carry route, status and latency_ms', async () => {
  const dir = join(tmp.dir, 'json');
  const state = join(dir, 'state');
  const creds = join(dir, 'credentials');
  mkdirSync(state, { recursive: true });
  mkdirSync(creds, { recursive: true });
  writeFileSync(join(creds, 'signer-key'), `${stack.signerKey}\n`);
  // The file's RPC URL answers nothing: the environment's (the real chain) must win for /ready to pass.
  const deadPort = await freePort();
  const port = await freePort();
  const configFile = join(dir, 'routerd.toml');
  // The network is called chainX here (the spec's example of a mixed-case name) so that its
  // override, ROUTERD__CHAINS__CHAINX__RPC_URLS, is a variable name a shell and systemd accept.
  writeFileSync(configFile, chainXConfig({
    listen: `127.0.0.1:${port}`,
    extraServer: `shutdown_grace_secs = ${SHUTDOWN_GRACE_SECS}\n`,
    chainId: CHAIN_ID,
    rpcUrl: `http://127.0.0.1:${deadPort}`,
    usdc: stack.usdc,
  }));
  // routerd takes its arguments in any order; a wrapper adds --log-format json to the harness's.
  const wrapper = join(dir, 'routerd-json');
  writeFileSync(wrapper, `#!/bin/sh\nexec ${JSON.stringify(routerdBin())} --log-format json "$@"\n`);
  chmodSync(wrapper, 0o755);
  jsonDaemon = new Routerd({
    bin: wrapper,
    configFile,
    logFile: join(dir, 'routerd.log'),
    port,
    env: {
      RUST_LOG: 'info',
      // What systemd sets: StateDirectory= and LoadCredential=signer-key:...
      STATE_DIRECTORY: state,
      CREDENTIALS_DIRECTORY: creds,
      ROUTERD__CHAINS__CHAINX__RPC_URLS: stack.anvil.url,
      ROUTERD_SIGNER_KEY: undefined,
    },
  });
  // The harness passes the test process's environment on; none of it may configure this daemon.
  for (const k of Object.keys(process.env)) if (k.startsWith('ROUTERD__')) jsonDaemon.env[k] = undefined;
  await jsonDaemon.start();

  let last;
  const ready = await waitFor(async () => {
    last = await getJson(`${jsonDaemon.url}/ready`);
    return last.status === 200 && last.body?.readModes?.chainX !== 'unknown' ? last : null;
  }, { timeoutMs: 10_000, what: '/ready = 200 on the env-configured daemon' }).catch((err) => {
    err.message += `\nlast /ready: HTTP ${last?.status} ${last?.text}\n--- JSON daemon log ---\n${jsonDaemon.tail(30)}`;
    throw err;
  });
  assert.deepEqual(ready.body, { ready: true, readModes: { chainX: 'lens' } });
  assert.equal((await fetch(`${jsonDaemon.url}/health`)).status, 200);
  assert.equal((await fetch(`${jsonDaemon.url}/supported`)).status, 200);
  const bad = await fetch(`${jsonDaemon.url}/verify`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{' });
  assert.equal(bad.status, 400);
  const { samples } = await scrape(jsonDaemon.url);
  // The file's URL is a dead port: no errors means the environment's URL is the one used.
  assert.ok(one(samples, 'routerd_upstream_requests_total', { chain: 'chainX', upstream: 'chainX#0' }).value > 0);
  assert.equal(one(samples, 'routerd_upstream_errors_total', { chain: 'chainX', upstream: 'chainX#0' }).value, 0,
    'the environment\'s RPC URL is the one used');
  assert.ok(existsSync(join(state, 'routerd.db')), 'the store is created in $STATE_DIRECTORY');

  const lines = await waitFor(() => {
    const ls = readFileSync(jsonDaemon.logFile, 'utf8').split('\n')
      .filter((l) => l !== '' && !l.startsWith('===== ')); // the harness's start markers
    return ls.some((l) => l.includes('"/verify"')) ? ls : null;
  }, { timeoutMs: 5_000, what: 'the /verify request line in the JSON log' });
  const events = lines.map((l, i) => {
    try {
      const v = JSON.parse(l);
      assert.equal(typeof v, 'object');
      assert.ok(v !== null && !Array.isArray(v));
      return v;
    } catch (err) {
      assert.fail(`log line ${i + 1} is not one JSON object: ${JSON.stringify(l)} (${err.message})`);
    }
  });
  for (const e of events) {
    assert.equal(typeof e.timestamp, 'string', JSON.stringify(e));
    assert.equal(typeof e.level, 'string', JSON.stringify(e));
  }
  const banner = events.find((e) => e.message === 'routerd listening');
  assert.ok(banner, 'the start banner is logged');
  assert.ok(String(banner.signers).toLowerCase().includes(stack.signer.toLowerCase()), JSON.stringify(banner));
  assert.equal(banner.store, join(state, 'routerd.db'), JSON.stringify(banner));

  const requests = events.filter((e) => e.route !== undefined);
  const health = requests.find((e) => e.route === '/health' && e.status === 200);
  assert.ok(health, `no /health request line: ${JSON.stringify(requests)}`);
  assert.equal(typeof health.latency_ms, 'number', JSON.stringify(health));
  assert.ok(health.latency_ms >= 0);
  const verify = requests.find((e) => e.route === '/verify');
  assert.ok(verify, `no /verify request line: ${JSON.stringify(requests)}`);
  assert.equal(verify.status, 400, JSON.stringify(verify));
  assert.equal(typeof verify.latency_ms, 'number', JSON.stringify(verify));
  for (const e of requests) {
    assert.equal(typeof e.status, 'number', JSON.stringify(e));
    assert.equal(typeof e.latency_ms, 'number', JSON.stringify(e));
  }

  const exit = await jsonDaemon.stop();
  assert.deepEqual({ code: exit.code, hung: exit.hung }, { code: 0, hung: undefined });
  const log = readFileSync(jsonDaemon.logFile, 'utf8');
  assert.ok(!log.toLowerCase().includes(keyHex()), 'the JSON log contains the signer key');
  for (const l of log.split('\n').filter((x) => x !== '' && !x.startsWith('===== '))) JSON.parse(l);
});

// ---------------------------------------------------------------------------------------------
// A stopped chain (last: the chain does not come back)

it('stopping the chain turns /ready to 503 naming the chain within seconds; /health stays 200', async () => {
  const before = await getJson(`${stack.url}/ready`);
  assert.equal(before.status, 200, before.text);
  await stack.anvil.stop();
  const started = Date.now();
  const res = await waitFor(async () => {
    const r = await getJson(`${stack.url}/ready`);
    return r.status === 503 && r.body?.problems?.some((p) => p.chain === NETWORK) ? r : null;
  }, { timeoutMs: 15_000, intervalMs: 200, what: `/ready = 503 naming ${NETWORK}` });
  const elapsed = Date.now() - started;
  // poll_interval_ms * 5 + request_timeout_ms, plus one poll and the probe's own time.
  assert.ok(elapsed < 8_000, `took ${elapsed} ms`);
  assert.equal(res.body.ready, false, res.text);
  for (const p of res.body.problems) assert.equal(typeof p.problem, 'string', res.text);
  const chainProblem = res.body.problems.find((p) => p.chain === NETWORK);
  assert.match(chainProblem.problem, /no answer|never answered/, res.text);
  // The signer's balance cannot be read either: the body says so for that signer.
  const signerProblem = res.body.problems.find((p) => p.signer !== undefined);
  assert.ok(signerProblem, res.text);
  assert.equal(signerProblem.signer.toLowerCase(), stack.signer.toLowerCase(), res.text);
  assert.equal(signerProblem.network, NETWORK, res.text);

  const health = await getJson(`${stack.url}/health`);
  assert.equal(health.status, 200, 'the process still serves');
  const { samples } = await scrape();
  assert.ok(one(samples, 'routerd_upstream_errors_total', { chain: NETWORK, upstream: `${NETWORK}#0` }).value > 0,
    'failed upstream calls are counted');
});

it('the daemon log never contains the signer key', async () => {
  const log = readFileSync(stack.routerd.logFile, 'utf8').toLowerCase();
  assert.ok(log.includes('routerd listening'), 'routerd wrote its log');
  assert.ok(!log.includes(keyHex()), 'the signer key appears in the log');
});
