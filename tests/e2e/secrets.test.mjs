// Secrets stay inside (spec/access.md section 4). RPC and WebSocket URLs carry provider keys, in
// their path or query: routerd names each upstream `<chain>#<index>` (its place in rpc_urls) in
// answers, errors, logs and the metric labels, and `check-config` shows a URL only as
// `scheme://host[:port]/…`. `server.ops_listen` moves /metrics and /ready to their own address.
//
// One anvil chain (base-sepolia, auto-mining, real USDC) reached only through a proxy that
// answers on any path (lib/node-proxy.mjs), so routerd's RPC URL can be
// `http://127.0.0.1:<port>/v2/PATHSECRET123?apikey=QUERYSECRET456`, and a ws_urls entry whose
// path and query carry other secrets (the proxy refuses the upgrade, so routerd keeps failing to
// subscribe and keeps logging why). The daemon serves both the router (on that chain) and the
// facilitator, with debug logs. The proxy records the paths it is asked on: every test first
// proves routerd used the URL with the secret, so no "nothing leaked" can pass by never using it.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync, execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { toHex } from 'viem';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { startAnvil } from './lib/anvil.mjs';
import { startRouterd, routerdBin } from './lib/routerd.mjs';
import { startNodeProxy } from './lib/node-proxy.mjs';
import { freshAccount, anvilKey, ROLE } from './lib/accounts.mjs';
import { expectSettled, expectValid, expectErrorBody } from './lib/expect.mjs';
import { freePort, makeTempDir, waitFor, readAnswer } from './lib/util.mjs';

const PATH_SECRET = 'PATHSECRET123';
const QUERY_SECRET = 'QUERYSECRET456';
const WS_PATH_SECRET = 'WSPATHSECRET789';
const WS_QUERY_SECRET = 'WSQUERYSECRET012';
const USER_SECRET = 'USERSECRET345';
const RPC_PATH = `/v2/${PATH_SECRET}?apikey=${QUERY_SECRET}`;
const WS_PATH = `/ws/${WS_PATH_SECRET}?key=${WS_QUERY_SECRET}`;
/** What must never be shown: the secrets, and the parts of the URLs' paths and queries around them. */
const NEEDLES = [PATH_SECRET, QUERY_SECRET, WS_PATH_SECRET, WS_QUERY_SECRET, USER_SECRET, 'apikey=', 'key=WS', '/v2/PATH', '/ws/WS'];
const UPSTREAM = `${NETWORK}#0`;
const PG_PASSWORD = 'PGSECRET678';
const pgCluster = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'scripts', 'pg-cluster');

/** The needles found in `text` (case-insensitive, also URL-encoded). */
function leaks(text) {
  const hay = String(text).toLowerCase();
  const decoded = (() => {
    try {
      return decodeURIComponent(hay);
    } catch {
      return hay;
    }
  })();
  return NEEDLES.filter((n) => hay.includes(n.toLowerCase()) || decoded.includes(n.toLowerCase()));
}

function assertNoSecret(text, where) {
  const found = leaks(text);
  assert.deepEqual(found, [], `${where} shows ${found.join(', ')}:\n${String(text).slice(0, 3000)}`);
}

// The whole file logs at debug level for every crate: what an operator chasing a problem turns on.
process.env.RUST_LOG = 'debug';

let proxy;
let stack;
let rpcUrl;
let wsUrl;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

const get = async (path, base = stack.url) => readAnswer(await fetch(`${base}${path}`));
const rpc = (method, params = []) => stack.post('/', { jsonrpc: '2.0', id: 1, method, params });
const tx = (from) => ({ from, to: freshAccount().address, data: '0x', value: '1' });

/** Run the routerd binary to completion with the ROUTERD_* variables of this process removed. */
function runRouterd(args, env = {}) {
  const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('ROUTERD')
    && k !== 'CREDENTIALS_DIRECTORY' && k !== 'STATE_DIRECTORY'));
  const r = spawnSync(routerdBin(), args, { env: { ...clean, ...env }, encoding: 'utf8', timeout: 30_000 });
  if (r.error) throw r.error;
  return { ...r, all: `exit ${r.status}\n--- stdout ---\n${r.stdout}\n--- stderr ---\n${r.stderr}` };
}

describe('provider keys in rpc_urls and ws_urls', () => {
  before(async () => {
    proxy = await startNodeProxy();
    rpcUrl = `${proxy.url}${RPC_PATH}`;
    wsUrl = `ws://127.0.0.1:${proxy.port}${WS_PATH}`;
    stack = await startFacilitatorStack({
      rpcUrlFor: (name, url) => {
        proxy.target = url;
        return rpcUrl;
      },
      chainExtra: `ws_urls = [${JSON.stringify(wsUrl)}]\npoll_interval_ms = 200\nrequest_timeout_ms = 1000\n`,
      routerd: { extra: `[router]\nchains = [${JSON.stringify(NETWORK)}]\n` },
    });
  });

  after(async () => {
    await stack?.stop();
    await proxy?.close();
  });

  it('routerd reaches the chain through the URL with the key, and tries the ws URL', async () => {
    assert.ok(proxy.state.paths.has(RPC_PATH), `the proxy saw ${JSON.stringify([...proxy.state.paths])}`);
    await waitFor(() => proxy.state.paths.has(WS_PATH), { timeoutMs: 10_000, what: 'a newHeads subscription attempt on the ws URL' });
    // The refused subscription is logged (by its position), so the log test below reads real failures.
    await waitFor(() => stack.routerd.tail(400).includes('newHeads subscription failed'), { timeoutMs: 10_000, what: 'the failed subscription in the log' });
  });

  it('/ready, /metrics (upstreams labelled base-sepolia#0), router_chains, router_quote, verify and settle show no key', async () => {
    const ready = await waitFor(async () => {
      const r = await get('/ready');
      return r.status === 200 ? r : null;
    }, { timeoutMs: 15_000, what: '/ready = 200' });
    assertNoSecret(ready.text, '/ready');

    const payer = await stack.newPayer();
    const p = await stack.pay({ account: payer });
    const verified = await stack.verify(p.body);
    expectValid(verified, { payer: payer.address });
    assertNoSecret(verified.text, '/verify');
    const settled = await stack.settle(p.body);
    expectSettled(settled, { network: NETWORK, payer: payer.address });
    assertNoSecret(settled.text, '/settle');

    const chains = await rpc('router_chains');
    assert.equal(chains.body?.result?.[0]?.chain, NETWORK, chains.text);
    assertNoSecret(chains.text, 'router_chains');
    const sender = freshAccount();
    await stack.anvil.rpc('anvil_setBalance', [sender.address, toHex(10n ** 18n)]);
    const quote = await rpc('router_quote', [tx(sender.address)]);
    assert.equal(quote.body?.result?.[0]?.feasible, true, quote.text);
    assertNoSecret(quote.text, 'router_quote');
    const routed = await rpc('eth_routerTransaction', [tx(sender.address)]);
    assert.ok(routed.body?.result?.nonce, routed.text);
    assertNoSecret(routed.text, 'eth_routerTransaction');

    const metrics = await get('/metrics');
    assert.equal(metrics.status, 200, metrics.text);
    assertNoSecret(metrics.text, '/metrics');
    const requests = metrics.text.match(new RegExp(`^routerd_upstream_requests_total\\{chain="${NETWORK}",upstream="${NETWORK}#0"\\} (\\d+)$`, 'm'));
    assert.ok(requests && Number(requests[1]) > 0, `no routerd_upstream_requests_total for ${UPSTREAM}:\n${metrics.text}`);
    assert.match(metrics.text, new RegExp(`^routerd_upstream_errors_total\\{chain="${NETWORK}",upstream="${NETWORK}#0"\\} \\d+$`, 'm'));
    assert.ok(!/127\.0\.0\.1:\d+/.test(metrics.text.split('\n').filter((l) => l.startsWith('routerd_upstream')).join('\n')),
      'the upstream metrics name the URL');
  });

  /** With the chain out of reach: every answer names base-sepolia#0 and no key. */
  async function expectUnreachableAnswers(t, what) {
    const payer = freshAccount();
    const p = await stack.pay({ account: payer });
    const settled = await stack.settle(p.body);
    expectErrorBody(settled, 400, { error: 502, messageIncludes: UPSTREAM });
    assertNoSecret(settled.text, `/settle (${what})`);
    const verified = await stack.verify(p.body);
    assertNoSecret(verified.text, `/verify (${what})`);
    assert.ok(verified.status === 200 || verified.text.includes(UPSTREAM), `verify: HTTP ${verified.status} ${verified.text}`);

    const routed = await rpc('eth_routerTransaction', [tx(payer.address)]);
    assert.equal(routed.body?.error?.code, -32603, routed.text);
    assert.ok(routed.text.includes(UPSTREAM), `eth_routerTransaction names ${UPSTREAM}: ${routed.text}`);
    assertNoSecret(routed.text, `eth_routerTransaction (${what})`);
    t.diagnostic(`settle: HTTP ${settled.status} ${settled.text}`);
    t.diagnostic(`eth_routerTransaction: ${routed.text}`);
    const rest = await stack.post('/', tx(payer.address));
    assert.ok(rest.text.includes(UPSTREAM), `POST / names ${UPSTREAM}: HTTP ${rest.status} ${rest.text}`);
    assertNoSecret(rest.text, `POST / (${what})`);
    const quote = await rpc('router_quote', [tx(payer.address)]);
    assert.equal(quote.body?.result?.[0]?.feasible, false, quote.text);
    assertNoSecret(quote.text, `router_quote (${what})`);
    const quoteRest = await stack.post('/quote', tx(payer.address));
    assertNoSecret(quoteRest.text, `POST /quote (${what})`);
    assertNoSecret((await rpc('router_chains')).text, `router_chains (${what})`);
    const ready = await waitFor(async () => {
      const r = await get('/ready');
      return r.status === 503 ? r : null;
    }, { timeoutMs: 15_000, what: `/ready = 503 (${what})` });
    assertNoSecret(ready.text, `/ready (${what})`);
    const metrics = await get('/metrics');
    assertNoSecret(metrics.text, `/metrics (${what})`);
    const errors = metrics.text.match(new RegExp(`^routerd_upstream_errors_total\\{chain="${NETWORK}",upstream="${NETWORK}#0"\\} (\\d+)$`, 'm'));
    assert.ok(errors && Number(errors[1]) > 0, `failed calls are counted for ${UPSTREAM}:\n${metrics.text}`);
  }

  async function backToReady() {
    proxy.state.fault = null;
    await waitFor(async () => (await get('/ready')).status === 200, { timeoutMs: 20_000, what: '/ready = 200 again' });
  }

  it('a provider that refuses with HTTP 401 quoting its URL: answers name base-sepolia#0 and no key', async (t) => {
    const before = proxy.state.hits.reject;
    proxy.state.fault = 'reject';
    try {
      await expectUnreachableAnswers(t, 'HTTP 401');
      assert.ok(proxy.state.hits.reject > before, 'the refusals reached routerd');
    } finally {
      await backToReady();
    }
  });

  it('the node stopped (connection refused): answers name base-sepolia#0 and no key', async (t) => {
    await proxy.down();
    try {
      await expectUnreachableAnswers(t, 'node stopped');
    } finally {
      await proxy.up();
      await backToReady();
    }
  });

  // A node's own error text is passed on where it explains an answer (a revert, a refusal); a
  // provider that quotes the URL it was asked on in that text must not carry the key out with it.
  it('a provider whose JSON-RPC errors quote its URL: no answer carries the key', async () => {
    const before = proxy.state.hits.echo;
    proxy.state.fault = 'echo';
    try {
      const payer = await stack.newPayer(0n);
      const p = await stack.pay({ account: payer });
      const answers = {
        settle: await stack.settle(p.body),
        verify: await stack.verify(p.body),
        eth_routerTransaction: await rpc('eth_routerTransaction', [tx(payer.address)]),
        router_quote: await rpc('router_quote', [tx(payer.address)]),
        'POST /quote': await stack.post('/quote', tx(payer.address)),
        router_chains: await rpc('router_chains'),
      };
      assert.ok(proxy.state.hits.echo > before, 'the errors reached routerd');
      const shown = Object.entries(answers).filter(([, r]) => leaks(r.text).length > 0);
      assert.deepEqual(shown.map(([k]) => k), [],
        `answers quoting the key: ${shown.map(([k, r]) => `\n${k}: HTTP ${r.status} ${r.text}`).join('')}`);
      await new Promise((r) => setTimeout(r, 1500)); // a few failed polls of /ready's chain state
      assertNoSecret((await get('/ready')).text, '/ready (echo)');
    } finally {
      await backToReady();
    }
  });

  it('check-config shows the URLs as scheme://host:port/… and no key (also one in user:password@)', async () => {
    const env = { ROUTERD_SIGNER_KEY: anvilKey(ROLE.signer) };
    const r = runRouterd(['check-config', '--config', stack.routerd.configFile], env);
    assert.equal(r.status, 0, r.all);
    assertNoSecret(r.stdout + r.stderr, 'check-config');
    assert.ok(r.stdout.includes(`rpc_urls = ["http://127.0.0.1:${proxy.port}/…"]`), `the RPC URL by host: ${r.all}`);
    assert.match(r.stdout, new RegExp(`^ws_urls = \\["ws://127\\.0\\.0\\.1:${proxy.port}/…"\\]$`, 'm'), `the ws URL by host: ${r.all}`);

    // Credentials in the authority, and several URLs: none is shown whole.
    const dir = makeTempDir('routerd-secrets-').dir;
    const text = readFileSync(stack.routerd.configFile, 'utf8').replace(
      /^rpc_urls = .*$/m,
      `rpc_urls = ["http://user:${USER_SECRET}@127.0.0.1:${proxy.port}/", ${JSON.stringify(rpcUrl)}, "https://rpc.example.com/v2/${PATH_SECRET}"]`,
    );
    const file = join(dir, 'three.toml');
    writeFileSync(file, text);
    const three = runRouterd(['check-config', '--config', file], env);
    assert.equal(three.status, 0, three.all);
    assertNoSecret(three.stdout + three.stderr, 'check-config (three URLs)');
    assert.ok(three.stdout.includes('https://rpc.example.com/…'), three.all);

    // A bad entry is named by its position, not quoted.
    const bad = join(dir, 'bad.toml');
    writeFileSync(bad, text.replace(/^rpc_urls = \[/m, `rpc_urls = ["ftp://127.0.0.1/${PATH_SECRET}?apikey=${QUERY_SECRET}", `));
    const refused = runRouterd(['check-config', '--config', bad], env);
    assert.equal(refused.status, 2, refused.all);
    assert.ok(refused.stderr.includes(`chains.${NETWORK}.rpc_urls`), refused.all);
    assertNoSecret(refused.stdout + refused.stderr, 'check-config (bad entry)');
  });

  it('a store out of reach (PostgreSQL stopped) answers a fixed message: no database text, address, path or password', async (t) => {
    // Its own directory under /tmp: the postgres user must reach it.
    const pgDir = mkdtempSync(join(tmpdir(), 'routerd-pg-'));
    let daemon;
    try {
      const url = execFileSync(pgCluster, ['start', pgDir], { encoding: 'utf8', timeout: 300_000, stdio: ['ignore', 'pipe', 'ignore'] }).trim();
      const pgPort = new URL(url).port;
      const port = await freePort();
      const dir = makeTempDir('routerd-secrets-pg-').dir;
      const toml = stack.configToml({ port }).replace(/^\[storage\]\npath = .*$/m, '[storage]\nbackend = "postgres"');
      assert.match(toml, /backend = "postgres"/);
      daemon = await startRouterd({
        configToml: toml, dir, port,
        env: { ROUTERD_SIGNER_KEY: stack.signerKeys.join(','), ROUTERD__STORAGE__POSTGRES_URL: url.replace('postgres@', `postgres:${PG_PASSWORD}@`) },
      });
      const post = async (path, body, headers = {}) => readAnswer(await fetch(`${daemon.url}${path}`, {
        method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json', ...headers },
      }));
      const payer = await stack.newPayer();
      const first = await stack.pay({ account: payer });
      expectSettled(await post('/settle', first.body), { network: NETWORK, payer: payer.address });

      // With gas money, the router's answer would need a nonce reservation: a store write.
      await stack.anvil.rpc('anvil_setBalance', [payer.address, toHex(10n ** 18n)]);
      execFileSync(pgCluster, ['stop', pgDir], { stdio: 'ignore', timeout: 60_000 });
      const second = await stack.pay({ account: payer });
      const a = first.authorization;
      const answers = {
        settle: await post('/settle', second.body),
        'settle with a key': await post('/settle', second.body, { 'Idempotency-Key': 'store-down-1' }),
        verify: await post('/verify', second.body),
        'GET /settlements': await readAnswer(await fetch(`${daemon.url}/settlements/${NETWORK}/${first.requirements.asset}/${a.from}/${a.nonce}`)),
        eth_routerTransaction: await post('/', { jsonrpc: '2.0', id: 1, method: 'eth_routerTransaction', params: [tx(payer.address)] }),
      };
      for (const [k, r] of Object.entries(answers)) t.diagnostic(`${k}: HTTP ${r.status} ${r.text}`);
      const forbidden = [PG_PASSWORD, pgDir, `:${pgPort}`, 'postgres', 'sqlstate', 'db error', 'connection refused', 'error connecting', 'tokio', '.rs:'];
      for (const [k, r] of Object.entries(answers)) {
        const found = forbidden.filter((f) => r.text.toLowerCase().includes(f.toLowerCase()));
        assert.deepEqual(found, [], `${k} shows ${found.join(', ')}: HTTP ${r.status} ${r.text}`);
      }
      // The settle is refused as a store failure (503: nothing lost, try again), not settled.
      expectErrorBody(answers.settle, 400, { error: 503 });
      expectErrorBody(answers['settle with a key'], 400, { error: 503 });
      assert.equal(answers['settle with a key'].body.message, answers.settle.body.message, 'one fixed message');
      assert.equal(answers.eth_routerTransaction.body?.error?.code, -32603, answers.eth_routerTransaction.text);
      assert.equal(answers.eth_routerTransaction.body.error.message, answers.settle.body.message, 'the router tells the same fixed message');
      assert.equal(await stack.balanceOf(second.authorization.to), 0n, 'nothing was settled');

      const log = readFileSync(daemon.logFile, 'utf8');
      assert.ok(log.includes('store failure'), 'the log says what failed');
      assert.ok(!log.includes(PG_PASSWORD), 'the log shows the PostgreSQL password');
    } finally {
      await daemon?.kill();
      spawnSync(pgCluster, ['stop', pgDir], { stdio: 'ignore' });
      rmSync(pgDir, { recursive: true, force: true });
    }
  });

  it('routerd\'s log (at debug level, through all of the above) shows no key and names base-sepolia#0', async () => {
    const log = readFileSync(stack.routerd.logFile, 'utf8');
    assert.ok(log.includes('routerd listening'), 'routerd wrote its log');
    assert.ok(log.includes(UPSTREAM), `the log names ${UPSTREAM} (the failed upstream calls are logged)`);
    const lines = log.split('\n').filter((l) => leaks(l).length > 0);
    assert.deepEqual(lines.slice(0, 10), [], `${lines.length} log lines show a key`);
  });
});

describe('server.ops_listen', () => {
  let anvil;
  let daemon;
  const ports = {};
  const TOKEN = '0x5FbDB2315678afecb367f032d93F642f64180aa3'; // /supported never calls it

  before(async () => {
    anvil = await startAnvil({ chainId: 84532 });
    for (const k of ['main', 'facilitator', 'ops']) ports[k] = await freePort();
    const dir = makeTempDir().dir;
    const toml = `[server]
listen = "127.0.0.1:${ports.main}"
facilitator_listen = "127.0.0.1:${ports.facilitator}"
ops_listen = "127.0.0.1:${ports.ops}"
shutdown_grace_secs = 5
[storage]
path = ${JSON.stringify(join(dir, 'db'))}
[chains.base-sepolia]
chain_id = 84532
kind = "l2"
rpc_urls = ["${anvil.url}"]
[chains.base-sepolia.tokens.USDC]
address = "${TOKEN}"
eip712_name = "USD Coin"
eip712_version = "2"
[router]
chains = ["base-sepolia"]
[facilitator]
networks = ["base-sepolia"]
`;
    daemon = await startRouterd({ dir, configToml: toml, port: ports.main, env: { ROUTERD_SIGNER_KEY: anvilKey(ROLE.signer) } });
  });

  after(async () => {
    await daemon?.stop();
    await anvil?.stop();
  });

  const at = (port, path, init) => fetch(`http://127.0.0.1:${port}${path}`, init).then(readAnswer);
  const oit = (name, fn) => test(name, { timeout: 30_000 }, async (t) => {
    try {
      await fn(t);
    } catch (err) {
      console.error(`--- routerd log tail ---\n${daemon?.tail(40)}\n--- end ---`);
      throw err;
    }
  });

  oit('/metrics and /ready are served on ops_listen', async () => {
    const metrics = await at(ports.ops, '/metrics');
    assert.equal(metrics.status, 200, metrics.text);
    assert.match(metrics.text, /^# TYPE routerd_http_requests counter$/m);
    assert.match(metrics.text, /# EOF\n?$/);
    const ready = await waitFor(async () => {
      const r = await at(ports.ops, '/ready');
      return r.status === 200 ? r : null;
    }, { timeoutMs: 15_000, what: '/ready = 200 on ops_listen' });
    assert.equal(ready.body?.ready, true, ready.text);
    assert.equal((await at(ports.ops, '/health')).status, 200);
  });

  oit('the main and facilitator listeners answer /metrics and /ready 404 with the Error body; /health everywhere', async () => {
    for (const [name, port] of [['listen', ports.main], ['facilitator_listen', ports.facilitator]]) {
      for (const path of ['/metrics', '/ready']) {
        const res = await at(port, path);
        expectErrorBody(res, 404, { error: 404 });
        assert.ok(!res.text.includes('routerd_'), `${name} ${path} shows metrics: ${res.text}`);
      }
      const health = await at(port, '/health');
      assert.equal(health.status, 200, `${name} /health: ${health.text}`);
    }
    // Each listener still serves its own routes, and the ops listener no others.
    assert.equal((await at(ports.facilitator, '/supported')).status, 200);
    const chains = await at(ports.main, '/', {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'router_chains', params: [] }),
    });
    assert.equal(chains.body?.result?.[0]?.chain, 'base-sepolia', chains.text);
    assert.equal((await at(ports.ops, '/supported')).status, 404);
    const rpcOnOps = await at(ports.ops, '/', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"jsonrpc":"2.0","id":1,"method":"router_chains","params":[]}' });
    assert.ok(rpcOnOps.body?.result === undefined, `ops_listen answers the router: ${rpcOnOps.text}`);
  });
});
