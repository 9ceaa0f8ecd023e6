// facilitator.x402_versions = [2]: v1 is not served. A v1 body fails rule 1 (invalid_x402_version,
// in v1's shape) on verify and settle and sends nothing; /supported lists only v2 kinds; v2 settles.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFacilitatorStack, withLogTail, NETWORK, CHAIN_ID } from './lib/stack.mjs';
import { expectInvalid, expectSettled, expectSettleFailed } from './lib/expect.mjs';

const CAIP2 = `eip155:${CHAIN_ID}`;

let stack;
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({ routerd: { x402Versions: [2] } });
});

after(() => stack?.stop());

it('/supported lists only the v2 kind', async () => {
  const res = await stack.request('/supported');
  assert.deepEqual(res.body.kinds, [{ x402Version: 2, scheme: 'exact', network: CAIP2 }], res.text);
});

it('a v1 body answers invalid_x402_version on verify and settle, and nothing is sent', async () => {
  const payer = await stack.newPayer();
  const p = await stack.payV2({ account: payer });
  const nonce = await stack.signerNonce('pending');
  expectInvalid(await stack.verify(p.body), 'invalid_x402_version', { payer: payer.address });
  expectSettleFailed(await stack.settle(p.body), 'invalid_x402_version', { network: NETWORK, payer: payer.address });
  assert.equal(await stack.signerNonce('pending'), nonce, 'no transaction may be sent');
  // The same payment in v2 settles.
  expectSettled(await stack.settle(p.v2), { network: CAIP2, payer: payer.address });
});
