// Assertions on routerd's answers, with the raw response in every failure message.
import assert from 'node:assert/strict';
import { getAddress } from 'viem';

const show = (res) => `HTTP ${res.status} ${res.text}`;
export const TX_HASH = /^0x[0-9a-fA-F]{64}$/;

/** The invalidReason/errorReason field may be absent or null on success; anything else is wrong. */
function assertNoReason(value, res) {
  assert.ok(value === undefined || value === null, `unexpected reason in ${show(res)}`);
}

/** verify answered 200 {isValid: false, invalidReason: reason, payer}. */
export function expectInvalid(res, reason, { payer } = {}) {
  assert.equal(res.status, 200, show(res));
  assert.equal(res.body?.isValid, false, show(res));
  assert.equal(res.body.invalidReason, reason, show(res));
  assertPayer(res, payer);
}

/** verify answered 200 {isValid: true, payer}. */
export function expectValid(res, { payer } = {}) {
  assert.equal(res.status, 200, show(res));
  assert.equal(res.body?.isValid, true, show(res));
  assertNoReason(res.body.invalidReason, res);
  assertPayer(res, payer);
}

/** payer is always present; for an address it is the checksummed form. */
function assertPayer(res, payer) {
  assert.equal(typeof res.body.payer, 'string', `payer missing: ${show(res)}`);
  if (payer !== undefined) assert.equal(res.body.payer, payer, show(res));
}

/** One settle result object: {success: true, transaction: 0x..64, network, payer}. Returns the hash. */
export function expectSettledResult(result, { network, payer }, res) {
  const where = res ? show(res) : JSON.stringify(result);
  assert.equal(result?.success, true, where);
  assertNoReason(result.errorReason, res ?? { status: 200, text: where });
  assert.match(result.transaction, TX_HASH, where);
  assert.equal(result.network, network, where);
  assert.equal(result.payer, getAddress(payer), where);
  return result.transaction;
}

/** settle answered 200 with a success result. Returns the transaction hash. */
export function expectSettled(res, { network, payer }) {
  assert.equal(res.status, 200, show(res));
  assert.ok(!Array.isArray(res.body), `single body answered with an array: ${show(res)}`);
  return expectSettledResult(res.body, { network, payer }, res);
}

/** One failed settle result: {success: false, errorReason, transaction: "", network, payer}. */
export function expectSettleFailedResult(result, reason, { network, payer, transaction = '' }, res) {
  const where = res ? show(res) : JSON.stringify(result);
  assert.equal(result?.success, false, where);
  assert.equal(result.errorReason, reason, where);
  assert.equal(result.transaction, transaction, where);
  assert.equal(result.network, network, where);
  if (payer !== undefined) assert.equal(result.payer, payer, where);
}

export function expectSettleFailed(res, reason, opts) {
  assert.equal(res.status, 200, show(res));
  expectSettleFailedResult(res.body, reason, opts, res);
}

/**
 * An Error body {error: int, message: string} with the given HTTP status.
 * @param {{messageIncludes?: string|string[], error?: number}} [o]
 */
export function expectErrorBody(res, status, { messageIncludes = [], error } = {}) {
  assert.equal(res.status, status, show(res));
  assert.ok(res.body && typeof res.body === 'object' && !Array.isArray(res.body), `not a JSON object: ${show(res)}`);
  assert.ok(Number.isInteger(res.body.error), `error is not an integer: ${show(res)}`);
  assert.equal(typeof res.body.message, 'string', `message is not a string: ${show(res)}`);
  if (error !== undefined) assert.equal(res.body.error, error, show(res));
  for (const part of [messageIncludes].flat()) {
    assert.ok(res.body.message.includes(part), `message does not name "${part}": ${show(res)}`);
  }
}

export { show };

/** The errorReason / invalidReason of a payment whose nonce is already claimed, per x402 version. */
export const ALREADY_REASON = Object.freeze({ 1: 'invalid_payload', 2: 'invalid_exact_evm_nonce_already_used' });

/**
 * One duplicate settle result (spec/access.md section 1): another settle of a payment that one
 * request claimed is told which transaction settles it, never success: {success: false,
 * errorReason, errorMessage "already settled by 0x<hash>" (or "already being settled by 0x<hash>"
 * when its own wait ended first), transaction: hash, payer, network}.
 * @param {{transaction: string, network: string, payer?: string, version?: 1|2, being?: boolean}} o
 *   `being`: true for "already being settled", false for "already settled", undefined for either.
 */
export function expectDuplicateResult(result, { transaction, network, payer, version = 1, being = false }, res) {
  const where = res ? show(res) : JSON.stringify(result);
  assert.equal(result?.success, false, `a duplicate settle must not be told success: ${where}`);
  assert.equal(result.errorReason, ALREADY_REASON[version], where);
  assert.match(result.transaction ?? '', TX_HASH, where);
  assert.equal(result.transaction.toLowerCase(), transaction.toLowerCase(), `the duplicate names the settling transaction: ${where}`);
  assert.equal(result.network, network, where);
  if (payer !== undefined) assert.equal(result.payer, getAddress(payer), where);
  const settled = `already settled by ${result.transaction}`;
  const running = `already being settled by ${result.transaction}`;
  const allowed = being === undefined ? [settled, running] : [being ? running : settled];
  assert.ok(allowed.includes(result.errorMessage), `errorMessage is ${allowed.map((m) => JSON.stringify(m)).join(' or ')}: ${where}`);
}

/** settle answered HTTP 200 with one duplicate result (see expectDuplicateResult). */
export function expectDuplicate(res, opts) {
  assert.equal(res.status, 200, show(res));
  assert.ok(!Array.isArray(res.body), `single body answered with an array: ${show(res)}`);
  expectDuplicateResult(res.body, opts, res);
}

/**
 * verify of a payment whose nonce is claimed: isValid false, the version's reason, and the message
 * "authorization already being settled" (`being`) or "authorization already settled".
 */
export function expectClaimedOnVerify(res, { version = 1, being, payer } = {}) {
  expectInvalid(res, ALREADY_REASON[version], { payer });
  const message = being ? 'authorization already being settled' : 'authorization already settled';
  assert.equal(res.body.invalidMessage, message, show(res));
}
