// HTTP status rules (spec/x402-facilitator.md section 1): a body of the wrong shape is HTTP 400 with
// the Error body naming the field; size, path and method errors are 413/404/405 with the same body;
// nothing a client sends produces a 5xx, and the daemon keeps serving.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFacilitatorStack, withLogTail } from './lib/stack.mjs';
import { mutate } from './lib/x402.mjs';
import { expectErrorBody, expectValid, show } from './lib/expect.mjs';

const MAX_BODY_BYTES = 65536;

let stack;
let alice;
let signerNonceAtStart;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({ routerd: { maxBodyBytes: MAX_BODY_BYTES } });
  alice = await stack.newPayer();
  signerNonceAtStart = await stack.signerNonce('pending');
});

after(() => stack?.stop());

const payment = () => stack.pay({ account: alice });

// Every shape error is checked on both POST routes: they share the body schema.
const ROUTES = ['/verify', '/settle'];

/** POST a body edited by `edit` to both routes; expect 400 naming `path` in the message. */
async function expectShapeError(edit, path) {
  const p = await payment();
  const body = mutate(p.body, edit);
  for (const route of ROUTES) {
    expectErrorBody(await stack.post(route, body), 400, { messageIncludes: path });
  }
}

// ---------------------------------------------------------------------------------------------
// Not JSON, or not the schema's shape -> 400

it('a body that is not JSON -> 400 Error', async () => {
  for (const route of ROUTES) {
    for (const raw of ['{not json', '', '{"x402Version": 1,', '\u00ff\u00fe']) {
      expectErrorBody(await stack.post(route, raw), 400);
    }
  }
});

it('bytes that are not UTF-8 -> 400 Error', async () => {
  for (const route of ROUTES) {
    const res = await stack.request(route, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: Buffer.from([0x7b, 0xff, 0xfe, 0x7d]),
    });
    expectErrorBody(res, 400);
  }
});

it('JSON that is not an object -> 400 Error', async () => {
  for (const route of ROUTES) {
    for (const raw of ['"hello"', '42', 'null', 'true']) {
      expectErrorBody(await stack.post(route, raw), 400);
    }
  }
});

it('a missing field -> 400 naming its path', async () => {
  await expectShapeError((b) => { delete b.paymentPayload.payload.authorization.nonce; }, 'paymentPayload.payload.authorization.nonce');
  await expectShapeError((b) => { delete b.paymentPayload.payload.signature; }, 'paymentPayload.payload.signature');
  await expectShapeError((b) => { delete b.paymentRequirements.payTo; }, 'paymentRequirements.payTo');
  await expectShapeError((b) => { delete b.paymentRequirements; }, 'paymentRequirements');
  await expectShapeError((b) => { delete b.x402Version; }, 'x402Version');
});

it('a number where a string is required -> 400 naming its path', async () => {
  await expectShapeError((b) => { b.paymentPayload.payload.authorization.value = 1000; }, 'paymentPayload.payload.authorization.value');
  await expectShapeError((b) => { b.paymentRequirements.maxAmountRequired = 1000; }, 'paymentRequirements.maxAmountRequired');
});

it('a string where an integer is required -> 400 naming its path', async () => {
  await expectShapeError((b) => { b.paymentRequirements.maxTimeoutSeconds = '60'; }, 'paymentRequirements.maxTimeoutSeconds');
  await expectShapeError((b) => { b.x402Version = '1'; }, 'x402Version');
});

it('an array where an object is required -> 400 naming its path', async () => {
  await expectShapeError((b) => { b.paymentRequirements = []; }, 'paymentRequirements');
  await expectShapeError((b) => { b.paymentPayload.payload.authorization = []; }, 'paymentPayload.payload.authorization');
});

it('a string where an object is required -> 400 naming its path', async () => {
  await expectShapeError((b) => { b.paymentRequirements.extra = 'USD Coin'; }, 'paymentRequirements.extra');
});

it('deeply nested JSON is refused without crashing -> 400', async () => {
  const deep = `${'['.repeat(20_000)}${']'.repeat(20_000)}`; // 40 KB, under the size limit
  for (const route of ROUTES) expectErrorBody(await stack.post(route, deep), 400);
});

// ---------------------------------------------------------------------------------------------
// Size, path and method -> 413 / 404 / 405, same Error body

it(`a body above max_body_bytes (${MAX_BODY_BYTES}) -> 413 Error`, async () => {
  const p = await payment();
  const body = mutate(p.body, (b) => { b.paymentRequirements.description = 'x'.repeat(MAX_BODY_BYTES); });
  for (const route of ROUTES) expectErrorBody(await stack.post(route, body), 413);
});

it('unknown paths -> 404 Error', async () => {
  expectErrorBody(await stack.request('/nope'), 404);
  expectErrorBody(await stack.post('/verify/extra', {}), 404);
  expectErrorBody(await stack.post('/settlement', {}), 404);
});

it('wrong methods -> 405 Error', async () => {
  expectErrorBody(await stack.request('/verify'), 405);
  expectErrorBody(await stack.request('/settle'), 405);
  expectErrorBody(await stack.request('/supported', { method: 'POST', body: '{}' }), 405);
  expectErrorBody(await stack.request('/verify', { method: 'DELETE' }), 405);
  expectErrorBody(await stack.request('/settle', { method: 'PUT', body: '{}' }), 405);
});

it('a JSON body sent without a JSON content type is never a 5xx', async () => {
  // The spec does not say whether the content type is required; it does say no input may cause 5xx.
  // The payment is one that fails verification, so an accepted /settle sends nothing either.
  const p = await stack.pay({ account: alice, amount: 1000n, auth: { value: 999n } });
  for (const route of ROUTES) {
    const res = await stack.request(route, { method: 'POST', headers: { 'content-type': 'text/plain' }, body: JSON.stringify(p.body) });
    assert.ok(res.status < 500, show(res));
    if (res.status !== 200) expectErrorBody(res, res.status);
  }
});

// ---------------------------------------------------------------------------------------------

it('after all that the daemon still serves, and no transaction was sent', async () => {
  assert.equal((await stack.request('/health')).status, 200);
  expectValid(await stack.verify((await payment()).body), { payer: alice.address });
  assert.equal(await stack.signerNonce('pending'), signerNonceAtStart);
});
