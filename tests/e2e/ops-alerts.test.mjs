// The packaged alert rules (packaging/prometheus/routerd-alerts.yml) fire on what a real routerd
// serves when their condition is made real: each test brings the condition about on anvil and
// routerd, scrapes /metrics, and evaluates the rule's expression over the samples taken, its
// window shortened to the test's seconds (Prometheus itself does not run here; `promtool test
// rules` in scripts/check-alerts proves the rules on synthetic series). Each first shows the
// expression quiet on the healthy stack.
// - RouterdSignerBalanceLow/Critical: the signer drained to a few settlements' worth of gas;
//   RouterdNotReady: drained below one settlement.
// - RouterdCallersRefused: a stranger floods /supported over server.client_rate_per_sec.
// - RouterdChainHeadStalled: anvil stops mining; then stopped, RouterdUpstreamErrors,
//   RouterdNotReady and RouterdServerErrors (a verify answered error 502).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { sleep, waitFor } from './lib/util.mjs';

const STRANGER = '127.0.0.3';
const NEIGHBOUR = '127.0.0.2';
// Every client's rate, /metrics included: the test's scrapes (from 127.0.0.1, at most one each
// 100 ms) stay within it, the stranger's flood does not.
const RATE = 20;

let stack;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({
    // Silent after five polls and one request timeout: /ready turns 503 within seconds.
    chainExtra: 'request_timeout_ms = 1000\n',
    routerd: { serverExtra: `client_rate_per_sec = ${RATE}\nclient_burst = ${RATE}\n` },
  });
});

after(() => stack?.stop());

/** Every sample of /metrics: {name, labels, value}. */
async function scrape() {
  const res = await fetch(`${stack.url}/metrics`);
  assert.equal(res.status, 200, 'a scrape within its client\'s rate');
  const text = await res.text();
  return text.split('\n').flatMap((line) => {
    const m = line.match(/^([a-z_]+)(?:\{([^}]*)\})? (\S+)$/);
    if (!m) return [];
    const labels = Object.fromEntries([...(m[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]));
    return [{ name: m[1], labels, value: Number(m[3]) }];
  });
}

/** The value of `name` whose labels include `labels` (undefined when not served). */
async function sample(name, labels = {}) {
  const found = (await scrape()).find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  return found?.value;
}

const signer = () => ({ network: NETWORK, signer: stack.signer.toLowerCase() });
const setSignerBalance = (wei) => stack.anvil.rpc('anvil_setBalance', [stack.signer, `0x${wei.toString(16)}`]);
const ready = async () => sample('routerd_ready');

/** A GET from the loopback address `localAddress` (a client of its own): its status. */
function getFrom(localAddress, path) {
  const url = new URL(stack.url);
  return new Promise((resolve, reject) => {
    const req = http.get({ host: url.hostname, port: url.port, path, localAddress, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode));
    });
    req.on('error', reject);
  });
}

/** The rate per second of RouterdCallersRefused's series over `during`: rate(...{status=~"429|503", route!="/ready"}). */
async function refusedRate(during) {
  const refused = async () => (await scrape())
    .filter((s) => s.name === 'routerd_http_requests_total' && /^(429|503)$/.test(s.labels.status) && s.labels.route !== '/ready')
    .reduce((sum, s) => sum + s.value, 0);
  const [before, start] = [await refused(), Date.now()];
  await during();
  return ((await refused()) - before) / ((Date.now() - start) / 1000);
}

/** `changes(routerd_chain_head_block{chain=NETWORK}[ms])`, from a scrape every 100 ms. */
async function headChanges(ms) {
  const heads = [];
  for (const end = Date.now() + ms; Date.now() < end; await sleep(100)) {
    heads.push(await sample('routerd_chain_head_block', { chain: NETWORK }));
  }
  assert.ok(heads.every((h) => h > 0), `a head in every scrape: ${heads}`);
  return heads.slice(1).filter((h, i) => h !== heads[i]).length;
}

it('a signer drained to 20 settlements\' worth fires RouterdSignerBalanceLow and Critical; below one, RouterdNotReady', async () => {
  const healthy = await sample('routerd_signer_settlements_left', signer());
  assert.ok(healthy >= 500, `a funded signer pays for ${healthy} settlements: both rules quiet`);
  assert.equal(await ready(), 1);
  const balance = await sample('routerd_signer_balance_wei', signer());
  const cost = BigInt(Math.ceil(balance / healthy)); // what one settlement costs at the head's price
  await setSignerBalance(cost * 20n);
  await stack.anvil.mine(1); // the funds are read again at the next head
  const left = await waitFor(async () => {
    const v = await sample('routerd_signer_settlements_left', signer());
    return v < 50 ? v : null;
  }, { timeoutMs: 10_000, intervalMs: 200, what: 'routerd_signer_settlements_left < 50' });
  assert.ok(left >= 10, `${left} settlements left: the balance over one settlement's cost`);
  assert.equal(await ready(), 1, 'still ready: it pays for one settlement');
  await setSignerBalance(cost / 2n);
  await stack.anvil.mine(1);
  await waitFor(async () => ((await ready()) === 0 ? true : null), { timeoutMs: 10_000, intervalMs: 200, what: 'routerd_ready == 0' });
  assert.equal(await sample('routerd_signer_settlements_left', signer()), 0);
  assert.equal((await fetch(`${stack.url}/ready`)).status, 503);
  await setSignerBalance(10n ** 22n);
  await stack.anvil.mine(1);
  await waitFor(async () => ((await ready()) === 1 ? true : null), { timeoutMs: 10_000, intervalMs: 200, what: 'routerd_ready == 1' });
});

it('a stranger flooding /supported over client_rate_per_sec fires RouterdCallersRefused (over one refusal a second)', async () => {
  // An honest client within its rate: no refusal.
  const honest = await refusedRate(async () => {
    for (let i = 0; i < 10; i += 1) {
      assert.equal(await getFrom(NEIGHBOUR, '/supported'), 200);
      await sleep(1000 / RATE + 50);
    }
  });
  assert.equal(honest, 0, 'quiet under honest traffic');
  let refused = 0;
  const flood = await refusedRate(async () => {
    for (let i = 0; i < 200; i += 1) refused += (await getFrom(STRANGER, '/supported')) === 429 ? 1 : 0;
  });
  assert.ok(refused >= 100, `${refused} of 200 answered 429`);
  assert.ok(flood > 1, `${flood.toFixed(1)} refusals a second`);
  assert.equal(await sample('routerd_http_requests_total', { route: '/supported', status: '429', key: '' }), refused);
});

it('anvil no longer mining fires RouterdChainHeadStalled; anvil stopped fires RouterdUpstreamErrors, RouterdNotReady and RouterdServerErrors', async () => {
  const payment = await stack.pay({ account: await stack.newPayer(5000n), amount: 1000n });
  await stack.anvil.rpc('evm_setIntervalMining', [1]);
  assert.ok((await headChanges(3_000)) >= 1, 'the head moves: quiet');
  await stack.anvil.rpc('evm_setIntervalMining', [0]);
  await sleep(300); // a block mined as mining stopped is read
  assert.equal(await headChanges(3_000), 0, 'changes(routerd_chain_head_block[3s]) == 0');
  assert.equal(await ready(), 1, 'a chain that answers but mines nothing is still ready');

  const upstream = async () => {
    const all = (await scrape()).filter((s) => s.labels.chain === NETWORK);
    const sum = (name) => all.filter((s) => s.name === name).reduce((a, s) => a + s.value, 0);
    return { requests: sum('routerd_upstream_requests_total'), errors: sum('routerd_upstream_errors_total') };
  };
  const healthy = await upstream();
  await sleep(1000);
  const quiet = await upstream();
  assert.equal(quiet.errors - healthy.errors, 0, 'no upstream errors while anvil answers');
  await stack.anvil.stop();
  await waitFor(async () => ((await ready()) === 0 ? true : null), { timeoutMs: 15_000, intervalMs: 200, what: 'routerd_ready == 0' });
  const down = await upstream();
  const ratio = (down.errors - quiet.errors) / (down.requests - quiet.requests);
  assert.ok(ratio > 0.05, `RouterdUpstreamErrors: ${down.errors - quiet.errors} of ${down.requests - quiet.requests} upstream requests failed`);
  assert.equal(await headChanges(1_000), 0, 'the head stays where it was');

  // The error code is the body's: HTTP status 400 carries it.
  const unreachable = { route: '/verify', code: '502' };
  assert.equal(await sample('routerd_error_answers_total', unreachable), undefined, 'no 502 while anvil answered');
  const verify = await stack.verify(payment.body);
  assert.equal(verify.body?.error, 502, verify.text);
  assert.equal(await sample('routerd_error_answers_total', unreachable), 1);
});
