// The wallet relay is a read endpoint, bounded (spec/access.md section 3c), judged at the node's
// door and in routerd's memory:
// - eth_call / eth_estimateGas with state or block overrides, or a gas above
//   chains.<name>.max_call_gas, and full blocks are refused -32602 naming the param, unforwarded
//   (the attack: 100 eth_calls, each with an override whose code returns 3.5 MB);
// - one answer, every entry of a batch together, is bounded by server.max_relay_answer_bytes
//   while it is read: a read that legitimately returns 3.5 MB answers -32005, and routerd's peak
//   RSS (VmHWM) does not grow by the answer's size;
// - every relayed read takes the router's read budget (chains.<name>.max_caller_reads): over it,
//   HTTP 503 with Retry-After at once, and the node never sees more at a time;
// - a resend of a transaction the node already has (other accounts', mined) is answered its hash
//   from the node's one answer: no lookup, and nothing remembered as sent; what is remembered is
//   bounded by router.max_sent_remembered, oldest first;
// - a node's error data is scrubbed of the keyed URL like its message.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { keccak256, toHex } from 'viem';
import { startRouterStack, DEFAULT_CHAINS, GWEI, withRouterLogTail } from './lib/router-stack.mjs';
import { listen, proxyHandle } from './lib/bad-upstreams.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { sleep } from './lib/util.mjs';

const SECRET = 'sekr1tRelayKey';
const BUDGET = 2;
const MAX_CALL_GAS = 30_000_000;
/** Code that returns `bytes` zero bytes: PUSH3 bytes, PUSH1 0, RETURN. */
const returning = (bytes) => `0x62${bytes.toString(16).padStart(6, '0')}6000f3`;
const BIG = `0x${'b1'.repeat(20)}`; // returns 3.5 MB: 7 MB of hex in its answer
const SMALL = `0x${'51'.repeat(20)}`; // returns 1 MB, within the bound
const L1 = DEFAULT_CHAINS.find((c) => c.name === 'l1');
const LEGACY = DEFAULT_CHAINS.find((c) => c.name === 'legacy');

/**
 * A node's door: forwards each call to `state.target` and records its method (`state.methods`)
 * and the most calls of a method in flight at once (`state.peak`). `state.delay[method]` holds
 * those calls first; `state.echo(call)` answers a call with an error whose data quotes the URL it
 * was asked on, as a provider's does; `state.chunked` sends answers in 64 KiB chunks, without a
 * Content-Length.
 */
async function startDoor() {
  const state = { target: null, methods: [], delay: {}, serving: {}, peak: {}, echo: () => false, chunked: false };
  const answer = async (call, asked) => {
    state.methods.push(call.method);
    if (state.echo(call)) {
      return JSON.stringify({ jsonrpc: '2.0', id: call.id, error: { code: -32000, message: 'not allowed on this plan', data: { asked, path: asked.slice(asked.indexOf('/v2')) } } });
    }
    const m = call.method;
    state.serving[m] = (state.serving[m] ?? 0) + 1;
    state.peak[m] = Math.max(state.peak[m] ?? 0, state.serving[m]);
    try {
      if (state.delay[m]) await sleep(state.delay[m]);
      const res = await fetch(state.target, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(call) });
      return await res.text();
    } finally {
      state.serving[m] -= 1;
    }
  };
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      const body = JSON.parse(Buffer.concat(chunks).toString());
      const asked = `http://${req.headers.host}${req.url}`;
      const text = Array.isArray(body)
        ? `[${(await Promise.all(body.map((call) => answer(call, asked)))).join(',')}]`
        : await answer(body, asked);
      if (!state.chunked) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(text);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
      for (let at = 0; at < text.length; at += 65536) {
        if (!res.write(text.slice(at, at + 65536))) await new Promise((r) => res.once('drain', r));
        if (res.destroyed) return;
      }
      res.end();
    });
  });
  return proxyHandle(server, await listen(server), state);
}

let stack;
const doors = {};

before(async () => {
  doors.l1 = await startDoor();
  doors.legacy = await startDoor();
  const chains = [
    {
      ...L1,
      requestTimeoutMs: 15_000,
      rpcUrlsFor: (url) => {
        doors.l1.target = url;
        return [`${doors.l1.url}/v2/${SECRET}?apikey=${SECRET}`];
      },
    },
    {
      ...LEGACY,
      extra: `max_caller_reads = ${BUDGET}\n`,
      rpcUrlsFor: (url) => {
        doors.legacy.target = url;
        return [doors.legacy.url];
      },
    },
  ];
  stack = await startRouterStack({ chains, router: { extra: 'max_sent_remembered = 2\n' } });
  await stack.setCode(BIG, returning(3_500_000), { on: ['l1'] });
  await stack.setCode(SMALL, returning(1_000_000), { on: ['l1'] });
});
after(async () => {
  await stack?.stop();
  await Promise.all(Object.values(doors).map((d) => d.close()));
});

const it = (name, fn) => test(name, { timeout: 120_000 }, withRouterLogTail(() => stack, fn));

/** routerd's peak resident set so far, in bytes (VmHWM). */
function peakRss() {
  const status = readFileSync(`/proc/${stack.routerd.child.pid}/status`, 'utf8');
  return Number(/VmHWM:\s+(\d+) kB/.exec(status)[1]) * 1024;
}

const envelope = (id, method, params) => ({ jsonrpc: '2.0', id, method, params });
const atChain = (name, body) => stack.post(`/chains/${name}`, body);
const count = (name, method) => doors[name].state.methods.filter((m) => m === method).length;

function expectRpcError(entry, code, pattern, text = JSON.stringify(entry)) {
  assert.ok(entry?.error, `expected error ${code}: ${text}`);
  assert.equal(entry.error.code, code, text);
  if (pattern) assert.match(entry.error.message, pattern, text);
}

it('overrides, a gas above max_call_gas and full blocks are refused -32602 naming the param, and none reaches the node', async () => {
  const before = { call: count('l1', 'eth_call'), estimate: count('l1', 'eth_estimateGas'), block: count('l1', 'eth_getBlockByNumber') };
  const rssBefore = peakRss();
  const call = { to: BIG, data: '0x' };
  // The request: 100 eth_calls, each with code placed by a state override that returns 3.5 MB.
  const attack = Array.from({ length: 100 }, (_, i) => envelope(i, 'eth_call', [{ to: SMALL }, 'latest', { [SMALL]: { code: returning(3_500_000) } }]));
  const refused = await atChain('l1', attack);
  assert.equal(refused.status, 200, refused.text.slice(0, 300));
  assert.equal(refused.body.length, 100);
  for (const entry of refused.body) expectRpcError(entry, -32602, /params\[2\].*overrides/);
  const latest = await stack.chain('l1').anvil.rpc('eth_getBlockByNumber', ['latest', false]);
  const cases = [
    envelope(1, 'eth_estimateGas', [call, 'latest', { [BIG]: { balance: '0x1' } }]),
    envelope(2, 'eth_call', [call, 'latest', {}, { number: '0x1' }]),
    envelope(3, 'eth_call', [{ ...call, gas: toHex(MAX_CALL_GAS + 1) }, 'latest']),
    envelope(4, 'eth_estimateGas', [{ ...call, gas: toHex(MAX_CALL_GAS + 1) }]),
    envelope(5, 'eth_getBlockByNumber', ['latest', true]),
    envelope(6, 'eth_getBlockByHash', [latest.hash, true]),
  ];
  const patterns = [/params\[2\]/, /params\[2\]/, /params\[0\]\.gas.*chains\.l1\.max_call_gas/, /params\[0\]\.gas/, /params\[1\].*full transactions/, /params\[1\].*full transactions/];
  const answers = await atChain('l1', cases);
  answers.body.forEach((entry, i) => expectRpcError(entry, -32602, patterns[i], answers.text));
  assert.equal(count('l1', 'eth_call'), before.call, 'no eth_call reached the node');
  assert.equal(count('l1', 'eth_estimateGas'), before.estimate, 'no eth_estimateGas reached the node');
  assert.equal(count('l1', 'eth_getBlockByHash'), 0, 'no full block reached the node');
  const blockAsks = doors.l1.state.methods.length;
  // Within the bounds, the same reads are served.
  const served = await atChain('l1', [
    envelope(1, 'eth_call', [{ to: SMALL, gas: toHex(MAX_CALL_GAS) }, 'latest']),
    envelope(2, 'eth_getBlockByNumber', ['latest', false]),
    envelope(3, 'eth_getBlockByHash', [latest.hash, false]),
  ]);
  assert.equal(served.body[0].result.length, 2 + 2 * 1_000_000, 'a 1 MB answer is within the bound');
  assert.ok(served.body[1].result.transactions.every((t) => typeof t === 'string'), served.text.slice(0, 300));
  assert.equal(served.body[2].result.hash, latest.hash, served.text.slice(0, 300));
  assert.ok(doors.l1.state.methods.length > blockAsks);
  assert.ok(before.block <= count('l1', 'eth_getBlockByNumber'));
  assert.ok(peakRss() - rssBefore < 32 * 1024 * 1024, `RSS grew ${(peakRss() - rssBefore) >> 20} MiB`);
});

it('one answer is bounded while it is read: 3.5 MB calls answer -32005 naming max_relay_answer_bytes, and routerd\'s peak RSS stays far below the answer', async () => {
  const rssBefore = peakRss();
  // Alone, declared by Content-Length: refused before its body is read.
  const one = await atChain('l1', envelope(1, 'eth_call', [{ to: BIG }, 'latest']));
  expectRpcError(one.body, -32005, /max_relay_answer_bytes \(4194304 bytes\)/, one.text);
  // Twenty at once, each sent in chunks without a length: 140 MB of answer, cut at the bound.
  doors.l1.state.chunked = true;
  try {
    const calls = Array.from({ length: 20 }, (_, i) => envelope(i, 'eth_call', [{ to: BIG }, 'latest']));
    const batch = await atChain('l1', calls);
    assert.equal(batch.body.length, 20);
    for (const entry of batch.body) expectRpcError(entry, -32005, /max_relay_answer_bytes/, batch.text.slice(0, 400));
    assert.ok(batch.text.length < 64 * 1024, `the answer is ${batch.text.length} bytes`);
  } finally {
    doors.l1.state.chunked = false;
  }
  const grown = peakRss() - rssBefore;
  assert.ok(grown < 48 * 1024 * 1024, `routerd's peak RSS grew ${grown >> 20} MiB for a 140 MB answer`);
  // At the router address, a batch's entries share one bound too: 30 lookups of a transaction
  // with 120 KB of calldata are 7 MB of answer; one alone is served.
  const sender = freshAccount();
  await stack.fund(sender.address, { on: ['l1'] });
  const raw = await sender.signTransaction({
    chainId: L1.chainId, type: 'eip1559', nonce: 0, gas: 6_000_000n, to: freshAccount().address, value: 0n,
    data: `0x${'ab'.repeat(120_000)}`, maxFeePerGas: 200n * GWEI, maxPriorityFeePerGas: GWEI,
  });
  const hash = await stack.chain('l1').anvil.rpc('eth_sendRawTransaction', [raw]);
  const alone = await stack.rpc('eth_getTransactionByHash', [hash]);
  assert.equal(alone.body.result?.hash, hash, alone.text.slice(0, 300));
  const lookups = await stack.post('/', Array.from({ length: 30 }, (_, i) => envelope(i, 'eth_getTransactionByHash', [hash])));
  const over = lookups.body.filter((entry) => entry.error);
  assert.ok(over.length > 0 && lookups.text.length <= 4 * 1024 * 1024 + 64 * 1024, `${over.length} refused, ${lookups.text.length} bytes`);
  for (const entry of over) expectRpcError(entry, -32005, /max_relay_answer_bytes/);
  // The node did nothing wrong: it still answers at once, and the chain is not cooled down.
  const after = await atChain('l1', envelope(2, 'eth_blockNumber', []));
  assert.match(after.body.result, /^0x[0-9a-f]+$/, after.text);
});

it(`every relayed read takes the router's budget (max_caller_reads = ${BUDGET}): beyond it HTTP 503 with Retry-After at once, never more at the node`, async () => {
  doors.legacy.state.delay.eth_getBalance = 600;
  doors.legacy.state.peak.eth_getBalance = 0;
  try {
    const address = freshAccount().address;
    const started = Date.now();
    const answers = await Promise.all(Array.from({ length: 12 }, (_, i) => atChain('legacy', envelope(i, 'eth_getBalance', [address, 'latest']))));
    const busy = answers.filter((a) => a.status === 503);
    const served = answers.filter((a) => a.status === 200);
    assert.equal(busy.length + served.length, 12, answers.map((a) => `${a.status} ${a.text}`).join(' | '));
    assert.ok(busy.length >= 12 - 2 * BUDGET, `busy: ${busy.length}`);
    for (const res of served) assert.equal(res.body.result, '0x0', res.text);
    for (const res of busy) expectRpcError(res.body, -32005, /max_caller_reads/, res.text);
    assert.ok(doors.legacy.state.peak.eth_getBalance <= BUDGET, `the node saw ${doors.legacy.state.peak.eth_getBalance} at once`);
    assert.ok(Date.now() - started < 5_000, 'nothing queued into a timeout');
    const retry = await fetch(`${stack.url}/chains/legacy`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(Array.from({ length: BUDGET + 2 }, (_, i) => envelope(i, 'eth_getBalance', [address, 'latest']))),
    });
    assert.equal(retry.status, 503);
    assert.equal(retry.headers.get('retry-after'), '1');
  } finally {
    delete doors.legacy.state.delay.eth_getBalance;
  }
});

/** `n` transfers of fresh accounts, signed for l1 and mined there without routerd. */
async function minedElsewhere(n) {
  const anvil = stack.chain('l1').anvil;
  const raws = [];
  for (let i = 0; i < n; i += 1) {
    const account = freshAccount();
    await stack.fund(account.address, { on: ['l1'] });
    const raw = await account.signTransaction({
      chainId: L1.chainId, type: 'eip1559', nonce: 0, gas: 21_000n, to: freshAccount().address, value: 1n,
      maxFeePerGas: 200n * GWEI, maxPriorityFeePerGas: GWEI,
    });
    await anvil.rpc('eth_sendRawTransaction', [raw]);
    raws.push(raw);
  }
  return raws;
}

it('20 resends of other accounts\' mined transactions: their hashes from the node\'s one answer each, no lookup, nothing remembered as sent', async () => {
  const raws = await minedElsewhere(20);
  const before = doors.l1.state.methods.length;
  for (const raw of raws) {
    const res = await stack.rpc('eth_sendRawTransaction', [raw]);
    assert.equal(res.body.result, keccak256(raw), res.text);
  }
  const asked = doors.l1.state.methods.slice(before);
  assert.equal(asked.filter((m) => m === 'eth_sendRawTransaction').length, 20, asked.join());
  const lookups = asked.filter((m) => m === 'eth_getTransactionByHash' || m === 'eth_getTransactionReceipt');
  assert.deepEqual(lookups, [], 'no lookup of routerd\'s own');
  // Nothing remembered: a wallet's lookup of each hash is asked of every router chain, not of l1 alone.
  const legacyBefore = count('legacy', 'eth_getTransactionReceipt');
  for (const raw of raws) {
    const receipt = await stack.rpc('eth_getTransactionReceipt', [keccak256(raw)]);
    assert.equal(receipt.body.result.status, '0x1', receipt.text.slice(0, 300));
  }
  assert.equal(count('legacy', 'eth_getTransactionReceipt') - legacyBefore, 20, 'every hash was unknown to the store');
});

it('what routerd sent is remembered up to router.max_sent_remembered (2), the oldest forgotten first', async () => {
  const sender = freshAccount();
  await stack.fund(sender.address, { on: ['l1'] });
  const hashes = [];
  for (let nonce = 0; nonce < 3; nonce += 1) {
    const raw = await sender.signTransaction({
      chainId: L1.chainId, type: 'eip1559', nonce, gas: 21_000n, to: freshAccount().address, value: 1n,
      maxFeePerGas: 200n * GWEI, maxPriorityFeePerGas: GWEI,
    });
    const res = await stack.rpc('eth_sendRawTransaction', [raw]);
    assert.equal(res.body.result, keccak256(raw), res.text);
    hashes.push(res.body.result);
    await sleep(1_100); // one second apart: the store orders by the second sent
  }
  const askedOfLegacy = async (hash) => {
    const before = count('legacy', 'eth_getTransactionReceipt');
    const receipt = await stack.rpc('eth_getTransactionReceipt', [hash]);
    assert.equal(receipt.body.result.status, '0x1', receipt.text.slice(0, 300));
    return count('legacy', 'eth_getTransactionReceipt') - before;
  };
  assert.equal(await askedOfLegacy(hashes[0]), 1, 'the oldest is forgotten: looked up everywhere');
  assert.equal(await askedOfLegacy(hashes[1]), 0, 'remembered: asked of l1 only');
  assert.equal(await askedOfLegacy(hashes[2]), 0, 'remembered: asked of l1 only');
});

it('a node\'s error data is scrubbed of its keyed URL like its message', async () => {
  doors.l1.state.echo = (call) => call.method === 'eth_getCode';
  try {
    const res = await atChain('l1', envelope(1, 'eth_getCode', [BIG, 'latest']));
    expectRpcError(res.body, -32000, /not allowed/, res.text);
    assert.ok(res.body.error.data, res.text);
    assert.ok(!res.text.includes(SECRET), `the caller sees the key: ${res.text}`);
    assert.match(JSON.stringify(res.body.error.data), /127\.0\.0\.1:\d+\/…/, res.text);
  } finally {
    doors.l1.state.echo = () => false;
  }
});
