// A wallet whose only endpoint is routerd (issue 30): it routes with eth_routerTransaction, sends
// the signed transaction with eth_sendRawTransaction at the router address, follows it with
// eth_getTransactionReceipt / eth_getTransactionByHash there, and uses POST /chains/<name> as a
// chain's RPC URL (viem's http()). Every chain sits behind a recording proxy, so "nothing was
// forwarded" is checked at the node's door; op's first URL refuses connections (failover), and
// its second carries a key in its path and query that no answer may show.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { createServer as createHttpServer } from 'node:http';
import {
  createPublicClient, createWalletClient, defineChain, http as viemHttp, keccak256, toHex,
} from 'viem';
import { startRouterStack, routerTx, withRouterLogTail, DEFAULT_CHAINS, RouterStack, GWEI } from './lib/router-stack.mjs';
import { expectAnswer, show } from './lib/router-expect.mjs';
import { deadUpstreamUrl, listen, proxyHandle } from './lib/bad-upstreams.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { sleep } from './lib/util.mjs';

const CHAIN_ID = Object.fromEntries(DEFAULT_CHAINS.map((c) => [c.name, c.chainId]));
const SECRET = 'sekr1tProviderKey';
const ANVILS = DEFAULT_CHAINS.map((c) => c.name);
/** A fresh sender funded on the anvil chains of `on` (the fourth chain has no node). */
const newSender = (on = ANVILS) => stack.newSender({ on });

/**
 * A node's door: forwards every JSON-RPC request to `state.target` and records its methods in
 * `state.methods`. With `state.pooled` set, eth_sendRawTransaction is answered its hash and kept
 * away from the node: a node behind a load balancer whose reads do not see the pool yet.
 */
async function startDoor() {
  const state = { target: null, methods: [], pooled: false };
  const answer = async (call) => {
    if (state.pooled && call.method === 'eth_sendRawTransaction') {
      return { jsonrpc: '2.0', id: call.id, result: keccak256(call.params[0]) };
    }
    const res = await fetch(state.target, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(call) });
    return res.json();
  };
  const server = createHttpServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      const body = JSON.parse(Buffer.concat(chunks).toString());
      for (const call of [body].flat()) state.methods.push(call.method);
      const answers = Array.isArray(body) ? await Promise.all(body.map(answer)) : await answer(body);
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(answers));
    });
  });
  return proxyHandle(server, await listen(server), state);
}

let stack;
const doors = {};
let dead;
/** Every answer's text, checked for the provider key at the end. */
const seen = [];

before(async () => {
  for (const c of DEFAULT_CHAINS) doors[c.name] = await startDoor();
  dead = await deadUpstreamUrl();
  const chains = DEFAULT_CHAINS.map((c) => ({
    ...c,
    rpcUrlsFor: (url) => {
      doors[c.name].target = url;
      const door = c.name === 'op' ? `${doors.op.url}/v2/${SECRET}?apikey=${SECRET}` : doors[c.name].url;
      return c.name === 'op' ? [dead, door] : [door];
    },
  }));
  // A fourth chain whose only URL, keyed, refuses connections.
  chains.push({ name: 'gone', chainId: 903, kind: 'l3', rpcUrls: [`${await deadUpstreamUrl()}/v3/${SECRET}`] });
  stack = await startRouterStack({ chains });
});
after(async () => {
  await stack?.stop();
  await Promise.all(Object.values(doors).map((d) => d.close()));
});

const it = (name, fn) => test(name, { timeout: 90_000 }, withRouterLogTail(() => stack, fn));

/** A JSON-RPC call to routerd at `path`, from `localAddress`; answers the envelope. */
function call(method, params, { path = '/', localAddress = '127.0.0.1' } = {}) {
  return post(path, { jsonrpc: '2.0', id: 1, method, params }, localAddress);
}

function post(path, envelope, localAddress = '127.0.0.1') {
  const url = new URL(stack.routerd.url);
  const body = JSON.stringify(envelope);
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: url.hostname, port: url.port, path, method: 'POST', localAddress, agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    }, (res) => {
      let text = '';
      res.on('data', (chunk) => { text += chunk; });
      res.on('end', () => {
        seen.push(text);
        resolve({ status: res.statusCode, text, body: text ? JSON.parse(text) : undefined });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

const sends = (name) => doors[name].state.methods.filter((m) => m === 'eth_sendRawTransaction').length;
const allSends = () => DEFAULT_CHAINS.reduce((n, c) => n + sends(c.name), 0);

/** viem at the router address, as a wallet uses it. */
const rootClient = () => createPublicClient({ transport: viemHttp(stack.routerd.url, { retryCount: 0 }) });

/** The receipt through routerd, polled until there is one. */
async function receiptThroughRouterd(hash) {
  for (let i = 0; i < 200; i += 1) {
    const receipt = await rootClient().request({ method: 'eth_getTransactionReceipt', params: [hash] });
    if (receipt) return receipt;
    await sleep(50);
  }
  throw new Error(`no receipt for ${hash} through routerd`);
}

/** Routes `request` for `account`, signs exactly the answer: the raw transaction and the answer. */
async function routeAndSign(account, request) {
  const answer = await rootClient().request({ method: 'eth_routerTransaction', params: [request] });
  const raw = await account.signTransaction(RouterStack.txFromAnswer(request, answer));
  return { answer, raw };
}

function expectError(envelope, code, pattern) {
  assert.ok(envelope.body?.error, `expected error ${code}: ${envelope.text}`);
  assert.equal(envelope.body.error.code, code, envelope.text);
  if (pattern) assert.match(envelope.body.error.message, pattern, envelope.text);
}

describe('at the router address', () => {
  it('viem routes, signs exactly the answer, sends through routerd (failing over past a dead URL) and gets the receipt there; the value arrives on the chosen chain', async () => {
    const sender = await newSender();
    const to = freshAccount().address;
    const request = routerTx({ from: sender.address, to, value: '12345' });
    const { answer, raw } = await routeAndSign(sender, request);
    expectAnswer(answer, { chainId: CHAIN_ID.op });
    const before = sends('op');
    const hash = await rootClient().request({ method: 'eth_sendRawTransaction', params: [raw] });
    assert.equal(hash, keccak256(raw));
    assert.equal(sends('op'), before + 1, 'sent through op\'s second URL');
    const receipt = await receiptThroughRouterd(hash);
    assert.equal(receipt.status, '0x1', show(receipt));
    assert.equal(receipt.transactionHash, hash);
    const tx = await rootClient().request({ method: 'eth_getTransactionByHash', params: [hash] });
    assert.equal(tx.hash, hash);
    assert.equal(tx.nonce, answer.nonce);
    assert.equal(BigInt(await stack.chain('op').anvil.rpc('eth_getBalance', [to, 'latest'])), 12345n);
    const unknown = await call('eth_getTransactionReceipt', [`0x${'ab'.repeat(32)}`]);
    assert.equal(unknown.body.result, null, unknown.text);
  });

  it('five in a row for one sender without waiting: consecutive nonces, all mined, followed through routerd', async () => {
    const sender = await newSender();
    const hashes = [];
    const nonces = [];
    for (let i = 0; i < 5; i += 1) {
      const { answer, raw } = await routeAndSign(sender, routerTx({ from: sender.address, to: freshAccount().address, value: String(i + 1) }));
      nonces.push(Number(BigInt(answer.nonce)));
      hashes.push(await rootClient().request({ method: 'eth_sendRawTransaction', params: [raw] }));
    }
    assert.deepEqual(nonces, [0, 1, 2, 3, 4]);
    for (const hash of hashes) assert.equal((await receiptThroughRouterd(hash)).status, '0x1');
  });

  it('the same raw transaction sent again, pending and then mined, answers the same hash', async () => {
    const anvil = stack.chain('op').anvil;
    const sender = await newSender();
    const { raw } = await routeAndSign(sender, routerTx({ from: sender.address, to: freshAccount().address, value: '7' }));
    await anvil.rpc('evm_setAutomine', [false]);
    try {
      const first = await call('eth_sendRawTransaction', [raw]);
      assert.equal(first.body.result, keccak256(raw), first.text);
      const pending = await call('eth_sendRawTransaction', [raw]);
      assert.equal(pending.body.result, keccak256(raw), pending.text);
      assert.equal(await rootClient().request({ method: 'eth_getTransactionReceipt', params: [keccak256(raw)] }), null);
      await anvil.rpc('evm_mine', []);
    } finally {
      await anvil.rpc('evm_setAutomine', [true]);
    }
    const mined = await call('eth_sendRawTransaction', [raw]);
    assert.equal(mined.body.result, keccak256(raw), mined.text);
    assert.equal((await receiptThroughRouterd(keccak256(raw))).status, '0x1');
  });

  it('refuses an unknown chain id (naming it), malformed raw and pre-EIP-155 transactions with -32602, and forwards none', async () => {
    const sender = await newSender();
    const before = allSends();
    const base = { to: freshAccount().address, value: 1n, nonce: 0, gas: 21_000n };
    const unknown = await sender.signTransaction({ ...base, chainId: 999, type: 'eip1559', maxFeePerGas: GWEI, maxPriorityFeePerGas: 1n });
    expectError(await call('eth_sendRawTransaction', [unknown]), -32602, /\b999\b/);
    const pre155 = await sender.signTransaction({ ...base, type: 'legacy', gasPrice: 10n * GWEI });
    expectError(await call('eth_sendRawTransaction', [pre155]), -32602, /EIP-155/);
    for (const bad of ['0x1234', '0xzz', '0x', 'f86b', `${unknown}00`, unknown.slice(0, -4)]) {
      expectError(await call('eth_sendRawTransaction', [bad]), -32602);
    }
    expectError(await call('eth_sendRawTransaction', []), -32602);
    expectError(await call('eth_getTransactionReceipt', ['0x12']), -32602);
    assert.equal(allSends(), before, 'nothing reached a node');
  });

  it('a broadcast confirms the reservation for its caller only, before the node\'s pending count moves', async () => {
    const sender = await newSender(['op']);
    const request = () => routerTx({ from: sender.address, to: freshAccount().address });
    const nonceFrom = async (localAddress) => {
      const res = await call('eth_routerTransaction', [request()], { localAddress });
      assert.ok(res.body.result, res.text);
      return Number(BigInt(res.body.result.nonce));
    };
    const answer = { ...(await call('eth_routerTransaction', [request()], { localAddress: '127.0.0.3' })).body.result, nonce: '0x0' };
    const raw = await sender.signTransaction(RouterStack.txFromAnswer(request(), answer));
    doors.op.state.pooled = true;
    try {
      const sent = await call('eth_sendRawTransaction', [raw], { localAddress: '127.0.0.1' });
      assert.equal(sent.body.result, keccak256(raw), sent.text);
      assert.equal(await stack.pendingNonce('op', sender.address), 0, 'the node has not seen it');
      assert.equal(await nonceFrom('127.0.0.1'), 1, 'the sender of the broadcast is told the next nonce');
      assert.equal(await nonceFrom('127.0.0.2'), 0, 'another caller is told the chain\'s');
    } finally {
      doors.op.state.pooled = false;
    }
  });
});

describe('a chain\'s own endpoint, POST /chains/<name>', () => {
  const legacy = defineChain({
    id: CHAIN_ID.legacy, name: 'legacy', nativeCurrency: { name: 'Ether', symbol: 'ETH', decimals: 18 },
    rpcUrls: { default: { http: ['http://unused'] } },
  });
  const endpoint = () => `${stack.routerd.url}/chains/legacy`;

  it('serves viem\'s public and wallet clients: balance, nonce, blocks, a send and its receipt', async () => {
    const sender = await newSender(['legacy']);
    const to = freshAccount().address;
    const client = createPublicClient({ chain: legacy, transport: viemHttp(endpoint(), { retryCount: 0 }) });
    assert.equal(await client.getChainId(), CHAIN_ID.legacy);
    assert.equal(await client.getBalance({ address: sender.address }), 100n * 10n ** 18n);
    assert.equal(await client.getTransactionCount({ address: sender.address }), 0);
    const block = await client.getBlock({ blockTag: 'latest' });
    assert.equal(block.number, await client.getBlockNumber());
    const wallet = createWalletClient({ account: sender, chain: legacy, transport: viemHttp(endpoint(), { retryCount: 0 }) });
    const hash = await wallet.sendTransaction({ to, value: 777n });
    const receipt = await client.waitForTransactionReceipt({ hash, pollingInterval: 50 });
    assert.equal(receipt.status, 'success');
    assert.equal(await client.getBalance({ address: to }), 777n);
    assert.equal(await client.getTransactionCount({ address: sender.address }), 1);
    // The router address finds it too, from the chain it was sent to.
    assert.equal((await receiptThroughRouterd(hash)).transactionHash, hash);
  });

  it('refuses a transaction for another chain id (-32602), forwarding nothing', async () => {
    const sender = await newSender();
    const { raw } = await routeAndSign(sender, routerTx({ from: sender.address, to: freshAccount().address }));
    const before = allSends();
    expectError(await call('eth_sendRawTransaction', [raw], { path: '/chains/legacy' }), -32602, new RegExp(String(CHAIN_ID.op)));
    assert.equal(allSends(), before);
  });

  it('refuses every method that changes or reveals node state with -32601, also inside a batch, forwarding none', async () => {
    const before = doors.legacy.state.methods.length;
    const refused = ['anvil_setBalance', 'anvil_mine', 'debug_traceTransaction', 'admin_peers', 'personal_sign',
      'txpool_content', 'eth_sign', 'eth_signTransaction', 'eth_signTypedData_v4', 'eth_sendTransaction', 'eth_accounts',
      'evm_mine', 'eth_routerTransaction'];
    for (const method of refused) expectError(await call(method, [], { path: '/chains/legacy' }), -32601);
    const batch = await post('/chains/legacy', [
      { jsonrpc: '2.0', id: 1, method: 'eth_chainId' },
      { jsonrpc: '2.0', id: 2, method: 'anvil_setBalance', params: [freshAccount().address, '0x1'] },
      { jsonrpc: '2.0', id: 3, method: 'eth_blockNumber', params: [] },
    ]);
    assert.equal(batch.body.length, 3, batch.text);
    assert.equal(batch.body[0].result, toHex(CHAIN_ID.legacy));
    assert.equal(batch.body[1].error.code, -32601);
    assert.match(batch.body[2].result, /^0x[0-9a-f]+$/);
    const forwarded = doors.legacy.state.methods.slice(before);
    assert.ok(forwarded.every((m) => !refused.includes(m)), `forwarded: ${forwarded}`);
    const unknown = await call('eth_chainId', [], { path: '/chains/nowhere' });
    assert.equal(unknown.status, 404, unknown.text);
  });
});

describe('secrets stay inside', () => {
  it('a chain out of reach is named <chain>#<index>, never by its keyed URL, at either address', async () => {
    const sender = await newSender();
    const raw = await sender.signTransaction({ to: freshAccount().address, value: 1n, nonce: 0, gas: 21_000n, chainId: 903, type: 'legacy', gasPrice: GWEI });
    const down = await call('eth_sendRawTransaction', [raw]);
    expectError(down, -32603, /gone#0/);
    expectError(await call('eth_blockNumber', [], { path: '/chains/gone' }), -32603, /gone#0/);
    await call('eth_getBalance', [sender.address, 'latest'], { path: '/chains/op' });
    for (const text of seen) assert.ok(!text.includes(SECRET), `an answer shows the key: ${text}`);
  });
});
