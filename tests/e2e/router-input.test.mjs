// Input rules and envelopes of the router (spec/router.md §1, §2): every invalid-input class is
// -32602 (JSON-RPC) or HTTP 400 {error, message} (REST) with the field named in the message, never a
// 5xx, and routerd keeps serving; JSON-RPC batches, notifications and bare-object params work; the
// REST form takes the bare object.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { getAddress } from 'viem';
import { startRouterStack, routerTx, withRouterLogTail, DEFAULT_CHAINS } from './lib/router-stack.mjs';
import {
  expectAnswer, expectRpcError, expectRestError, expectChainEntries, show,
} from './lib/router-expect.mjs';
import { freshAccount } from './lib/accounts.mjs';

let stack;
let sender; // funded on every chain
const it = (name, fn) => test(name, { timeout: 90_000 }, withRouterLogTail(() => stack, fn));
const OP_CHAIN_ID = DEFAULT_CHAINS.find((c) => c.name === 'op').chainId;
const ALL = DEFAULT_CHAINS.map((c) => c.name);

const MAX_U256 = (1n << 256n) - 1n;
// A checksummed address with letters in it, and the same with one letter's case flipped.
const GOOD = getAddress('0x70997970c51812dc3a010c7d01b50e0d17dc79c8'); // 0x70997970C51812dc3A010C7d01b50e0d17dc79C8
const BAD_CHECKSUM = (() => {
  const i = GOOD.slice(2).search(/[a-fA-F]/) + 2;
  const c = GOOD[i];
  return GOOD.slice(0, i) + (c === c.toLowerCase() ? c.toUpperCase() : c.toLowerCase()) + GOOD.slice(i + 1);
})();

before(async () => {
  stack = await startRouterStack();
  sender = await stack.newSender();
});

after(() => stack?.stop());

const valid = () => routerTx({ from: sender.address, to: freshAccount().address, value: '1' });
const edit = (fn) => { const tx = valid(); fn(tx); return tx; };

// [field the message must name, description, the invalid request]
const INVALID = [
  ['from', 'from too short', () => edit((t) => { t.from = '0x123'; })],
  ['from', 'from not hex', () => edit((t) => { t.from = `0x${'zz'.repeat(20)}`; })],
  ['from', 'from without 0x', () => edit((t) => { t.from = GOOD.slice(2); })],
  ['from', 'from 41 hex digits', () => edit((t) => { t.from = `${GOOD}a`; })],
  ['from', 'from mixed case with a bad EIP-55 checksum', () => edit((t) => { t.from = BAD_CHECKSUM; })],
  ['to', 'to not hex', () => edit((t) => { t.to = '0xzz'; })],
  ['to', 'to 39 hex digits', () => edit((t) => { t.to = GOOD.slice(0, -1); })],
  ['to', 'to mixed case with a bad EIP-55 checksum', () => edit((t) => { t.to = BAD_CHECKSUM; })],
  ['data', 'data of odd length', () => edit((t) => { t.data = '0xabc'; })],
  ['data', 'data without 0x', () => edit((t) => { t.data = 'abcd'; })],
  ['data', 'data not hex', () => edit((t) => { t.data = '0xzz'; })],
  ['data', 'data empty string', () => edit((t) => { t.data = ''; })],
  ['data', 'contract creation without init code', () => edit((t) => { t.to = ''; t.data = '0x'; })],
  ['value', 'value negative', () => edit((t) => { t.value = '-1'; })],
  ['value', 'value a float', () => edit((t) => { t.value = '1.5'; })],
  ['value', 'value in exponent notation', () => edit((t) => { t.value = '1e3'; })],
  ['value', 'value empty', () => edit((t) => { t.value = ''; })],
  ['value', 'value "0x" alone', () => edit((t) => { t.value = '0x'; })],
  ['value', 'value 2^256 (decimal)', () => edit((t) => { t.value = (MAX_U256 + 1n).toString(); })],
  ['value', 'value 2^256 (hex)', () => edit((t) => { t.value = `0x1${'0'.repeat(64)}`; })],
  ['value', 'value not hex after 0x', () => edit((t) => { t.value = '0xg'; })],
  ['from', 'from missing', () => edit((t) => { delete t.from; })],
  ['to', 'to missing', () => edit((t) => { delete t.to; })],
  ['data', 'data missing', () => edit((t) => { delete t.data; })],
  ['value', 'value missing', () => edit((t) => { delete t.value; })],
  ['from', 'from a number', () => edit((t) => { t.from = 123; })],
  ['to', 'to null', () => edit((t) => { t.to = null; })],
  ['data', 'data an array', () => edit((t) => { t.data = []; })],
  ['value', 'value a JSON number', () => edit((t) => { t.value = 1000; })],
  ['value', 'value a boolean', () => edit((t) => { t.value = true; })],
];

for (const [field, what, make] of INVALID) {
  it(`invalid input: ${what} -> -32602 / HTTP 400 naming "${field}"`, async () => {
    const tx = make();
    expectRpcError(await stack.rpc('eth_routerTransaction', [tx], { id: 3 }), { code: -32602, field, id: 3 });
    expectRpcError(await stack.rpc('eth_routerTransaction', tx, { id: 4 }), { code: -32602, field, id: 4 });
    expectRpcError(await stack.rpc('router_quote', [tx]), { code: -32602, field });
    expectRestError(await stack.post('/', tx), { status: 400, code: -32602, field });
    expectRestError(await stack.post('/quote', tx), { status: 400, code: -32602, field });
  });
}

it('params as an array of 2 -> -32602 naming params', async () => {
  expectRpcError(await stack.rpc('eth_routerTransaction', [valid(), valid()]), { code: -32602, field: 'params' });
  expectRpcError(await stack.rpc('router_quote', [valid(), valid()]), { code: -32602, field: 'params' });
});

it('params missing (or an empty array) -> -32602 naming params', async () => {
  expectRpcError(await stack.rpc('eth_routerTransaction', undefined, { id: 9 }), { code: -32602, field: 'params', id: 9 });
  expectRpcError(await stack.rpc('eth_routerTransaction', []), { code: -32602, field: 'params' });
  expectRpcError(await stack.rpc('router_quote', undefined), { code: -32602, field: 'params' });
});

it('params that are not an object -> -32602', async () => {
  for (const params of ['x', 7, [7], [[valid()]], ['x']]) {
    expectRpcError(await stack.rpc('eth_routerTransaction', params), { code: -32602 });
  }
});

it('routerd keeps serving after every invalid input: still running, and a valid call is answered', async () => {
  assert.ok(stack.routerd.running, 'routerd exited');
  const health = await fetch(`${stack.url}/health`);
  assert.equal(health.status, 200);
  const answer = await stack.route(valid());
  expectAnswer(answer, { chainId: OP_CHAIN_ID });
  assert.ok(!/panick/i.test(stack.routerd.tail(2000)), 'routerd log mentions a panic');
});

// ---------------------------------------------------------------------------------------------
// Accepted forms

it('accepted forms: lowercase, uppercase and checksummed addresses; decimal and hex values; `to` "" and "0x"', async () => {
  const to = getAddress(freshAccount().address);
  const cases = [
    routerTx({ from: sender.address.toLowerCase(), to: to.toLowerCase(), value: '0' }),
    routerTx({ from: `0x${sender.address.slice(2).toUpperCase()}`, to: `0x${to.slice(2).toUpperCase()}`, value: '0x0' }),
    routerTx({ from: getAddress(sender.address), to, value: '1000' }),
    routerTx({ from: sender.address, to, value: '0x3E8' }),
    routerTx({ from: sender.address, to, value: '0x3e8' }),
    routerTx({ from: sender.address, to: '', data: '0x6000' }),
    routerTx({ from: sender.address, to: '0x', data: '0x6000' }),
  ];
  for (const tx of cases) {
    const res = await stack.rpc('router_quote', [tx]);
    assert.equal(res.body?.error, undefined, `${show(tx)} refused: ${res.text}`);
    expectChainEntries(res.body.result, ALL);
    assert.ok(res.body.result.some((q) => q.feasible), `${show(tx)}: ${res.text}`);
  }
});

it('value 2^256-1 is valid input: refused as infeasible (-32000), not as invalid params', async () => {
  for (const value of [MAX_U256.toString(), `0x${'f'.repeat(64)}`]) {
    const tx = routerTx({ from: sender.address, to: freshAccount().address, value });
    const error = expectRpcError(await stack.rpc('eth_routerTransaction', [tx]), { code: -32000 });
    expectChainEntries(error.data, ALL);
    for (const entry of error.data) assert.match(entry.reason, /insufficient/i, show(entry));
  }
});

// ---------------------------------------------------------------------------------------------
// JSON-RPC envelopes

it('params as the bare object works', async () => {
  const res = await stack.rpc('eth_routerTransaction', valid(), { id: 'bare' });
  assert.equal(res.status, 200, res.text);
  assert.equal(res.body.id, 'bare', res.text);
  expectAnswer(res.body.result, { chainId: OP_CHAIN_ID });
});

it('a batch of 2 calls answers 2 results, matched by id', async () => {
  const a = await stack.newSender();
  const b = await stack.newSender();
  const res = await stack.post('/', [
    { jsonrpc: '2.0', id: 1, method: 'eth_routerTransaction', params: [routerTx({ from: a.address, to: freshAccount().address })] },
    { jsonrpc: '2.0', id: 2, method: 'eth_routerTransaction', params: [routerTx({ from: b.address, to: freshAccount().address })] },
  ]);
  assert.equal(res.status, 200, res.text);
  assert.ok(Array.isArray(res.body) && res.body.length === 2, `expected 2 responses: ${res.text}`);
  assert.deepEqual(res.body.map((r) => r.id).sort(), [1, 2], res.text);
  for (const r of res.body) {
    assert.equal(r.error, undefined, res.text);
    expectAnswer(r.result, { chainId: OP_CHAIN_ID });
    assert.equal(r.result.nonce, '0x0', res.text);
  }
});

it('a batch mixing a valid and an invalid call answers one result and one -32602 error', async () => {
  const res = await stack.post('/', [
    { jsonrpc: '2.0', id: 'ok', method: 'router_quote', params: [valid()] },
    { jsonrpc: '2.0', id: 'bad', method: 'router_quote', params: [edit((t) => { t.value = '-1'; })] },
  ]);
  assert.equal(res.status, 200, res.text);
  assert.equal(res.body?.length, 2, res.text);
  const byId = Object.fromEntries(res.body.map((r) => [r.id, r]));
  expectChainEntries(byId.ok.result, ALL);
  assert.equal(byId.bad.error?.code, -32602, res.text);
  assert.match(byId.bad.error.message, /value/, res.text);
});

it('a notification gets no result, alone or in a batch', async () => {
  const notification = { jsonrpc: '2.0', method: 'eth_routerTransaction', params: [valid()] };
  const alone = await stack.post('/', notification);
  assert.ok(alone.status === 200 || alone.status === 204, `HTTP ${alone.status} ${alone.text}`);
  // JSON-RPC 2.0: no Response object for a notification (an empty body; jsonrpsee writes `null`).
  assert.ok(alone.text === '' || alone.body === null, `a notification was answered: ${alone.text}`);

  const batch = await stack.post('/', [{ jsonrpc: '2.0', id: 5, method: 'router_chains', params: [] }, notification]);
  assert.equal(batch.status, 200, batch.text);
  assert.ok(Array.isArray(batch.body) && batch.body.length === 1, `expected exactly 1 response: ${batch.text}`);
  assert.equal(batch.body[0].id, 5, batch.text);
  assert.ok(Array.isArray(batch.body[0].result), batch.text);
});

it('an unknown method -> -32601 method not found', async () => {
  expectRpcError(await stack.rpc('eth_routerTransactionz', [valid()]), { code: -32601 });
});

// ---------------------------------------------------------------------------------------------
// REST envelope

it('REST: POST / with the bare object -> 200 with the answer fields', async () => {
  const res = await stack.post('/', valid());
  assert.equal(res.status, 200, res.text);
  expectAnswer(res.body, { chainId: OP_CHAIN_ID, type: 'eip1559' });
});

it('REST: invalid input -> 400 {error, message} naming the field, and no -32602 envelope', async () => {
  const body = expectRestError(await stack.post('/', edit((t) => { t.from = '0x123'; })), { status: 400, code: -32602, field: 'from' });
  assert.equal(body.jsonrpc, undefined, show(body));
});

it('bodies that are not a transaction at all: a JSON-RPC error or HTTP 400, never a 5xx; routerd keeps serving', async () => {
  for (const raw of ['{bad', '', 'null', '42', '"x"', '[]', '[1]', '{"jsonrpc":"2.0","id":1}', '{}', '\u00ff\u00fe']) {
    for (const path of ['/', '/quote']) {
      const res = await stack.post(path, raw);
      assert.ok(res.status === 200 || res.status === 400, `${path} ${JSON.stringify(raw)}: HTTP ${res.status} ${res.text}`);
      assert.ok(res.body !== undefined, `${path} ${JSON.stringify(raw)}: not JSON: ${res.text}`);
      const rpcError = res.body?.error && typeof res.body.error === 'object' ? res.body.error.code : undefined;
      const first = Array.isArray(res.body) ? res.body[0]?.error?.code : undefined;
      const code = rpcError ?? first ?? res.body?.error;
      assert.ok(Number.isInteger(code), `${path} ${JSON.stringify(raw)}: no error code: ${res.text}`);
      assert.equal(res.body?.result, undefined, res.text);
    }
  }
  expectAnswer(await stack.route(valid()), { chainId: OP_CHAIN_ID });
});
