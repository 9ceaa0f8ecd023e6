// Assertions on routerd's router answers (spec/router.md §4, §5), with the raw answer in every message.
import assert from 'node:assert/strict';

/** A JSON-RPC hex quantity: 0x, no leading zeros ("0x0" for zero). */
export const QUANTITY = /^0x(0|[1-9a-f][0-9a-f]*)$/;

const show = (x) => JSON.stringify(x);

/**
 * A RouterTransactionRes: hex quantities; exactly the fee fields of one fee type.
 * @param {'eip1559'|'legacy'} [type]
 */
export function expectAnswer(answer, { chainId, type } = {}) {
  assert.ok(answer && typeof answer === 'object' && !Array.isArray(answer), `not an object: ${show(answer)}`);
  for (const field of ['chainId', 'nonce', 'gasLimit']) {
    assert.match(String(answer[field]), QUANTITY, `${field} is not a hex quantity: ${show(answer)}`);
  }
  const is1559 = answer.maxFeePerGas !== undefined;
  if (is1559) {
    assert.match(answer.maxFeePerGas, QUANTITY, show(answer));
    assert.match(answer.maxPriorityFeePerGas, QUANTITY, show(answer));
    assert.equal(answer.gasPrice, undefined, `1559 answer with gasPrice: ${show(answer)}`);
    assert.ok(BigInt(answer.maxFeePerGas) >= BigInt(answer.maxPriorityFeePerGas), show(answer));
  } else {
    assert.match(String(answer.gasPrice), QUANTITY, `no fee fields: ${show(answer)}`);
    assert.equal(answer.maxPriorityFeePerGas, undefined, show(answer));
  }
  const allowed = new Set(['chainId', 'nonce', 'gasLimit', 'maxFeePerGas', 'maxPriorityFeePerGas', 'gasPrice']);
  for (const key of Object.keys(answer)) assert.ok(allowed.has(key), `unexpected field ${key}: ${show(answer)}`);
  if (chainId !== undefined) assert.equal(Number(BigInt(answer.chainId)), chainId, `chain: ${show(answer)}`);
  if (type !== undefined) assert.equal(is1559 ? 'eip1559' : 'legacy', type, `fee type: ${show(answer)}`);
}

/** The mined transaction carries exactly the answered fields, and succeeded. */
export function expectMinedAsAnswered({ receipt, onChain }, answer) {
  assert.equal(receipt.status, '0x1', `receipt: ${show(receipt)}`);
  assert.equal(BigInt(onChain.chainId), BigInt(answer.chainId), show(onChain));
  assert.equal(BigInt(onChain.nonce), BigInt(answer.nonce), show(onChain));
  assert.equal(BigInt(onChain.gas), BigInt(answer.gasLimit), show(onChain));
  if (answer.maxFeePerGas !== undefined) {
    assert.equal(onChain.type, '0x2', show(onChain));
    assert.equal(BigInt(onChain.maxFeePerGas), BigInt(answer.maxFeePerGas), show(onChain));
    assert.equal(BigInt(onChain.maxPriorityFeePerGas), BigInt(answer.maxPriorityFeePerGas), show(onChain));
  } else {
    assert.equal(onChain.type, '0x0', show(onChain));
    assert.equal(BigInt(onChain.gasPrice), BigInt(answer.gasPrice), show(onChain));
  }
}

/**
 * A JSON-RPC error envelope {jsonrpc, id, error: {code, message}} answered with HTTP 200.
 * @param {{code: number, field?: string}} o  field: the message must name it as `field:` or `field`.
 */
export function expectRpcError(res, { code, field, id }) {
  const where = `HTTP ${res.status} ${res.text}`;
  assert.equal(res.status, 200, where);
  assert.equal(res.body?.jsonrpc, '2.0', where);
  if (id !== undefined) assert.equal(res.body.id, id, where);
  assert.equal(res.body.result, undefined, where);
  assert.equal(res.body.error?.code, code, where);
  assert.equal(typeof res.body.error.message, 'string', where);
  if (field !== undefined) expectNamesField(res.body.error.message, field, where);
  return res.body.error;
}

/** A REST error: HTTP `status` with {error: <code>, message, data?}. */
export function expectRestError(res, { status = 400, code, field }) {
  const where = `HTTP ${res.status} ${res.text}`;
  assert.equal(res.status, status, where);
  assert.ok(res.body && typeof res.body === 'object' && !Array.isArray(res.body), where);
  assert.equal(res.body.error, code, where);
  assert.equal(typeof res.body.message, 'string', where);
  if (field !== undefined) expectNamesField(res.body.message, field, where);
  return res.body;
}

/** The message names `field` as a field: "field: problem", or `field` in backticks. */
export function expectNamesField(message, field, where = message) {
  const named = message.startsWith(`${field}:`) || message.includes(` ${field}:`) || message.includes(`\`${field}\``)
    || message.includes(`.${field}:`);
  assert.ok(named, `message does not name the field "${field}": ${where}`);
}

/** The per-chain entries of a refusal (-32000/-32603 data) or of router_quote. */
export function expectChainEntries(entries, names) {
  assert.ok(Array.isArray(entries), `not an array: ${show(entries)}`);
  assert.deepEqual(entries.map((e) => e.chain).sort(), [...names].sort(), `chains: ${show(entries)}`);
  for (const e of entries) {
    assert.ok(['l1', 'l2', 'l3'].includes(e.kind), `kind: ${show(e)}`);
    assert.match(e.chainId, QUANTITY, `chainId: ${show(e)}`);
    assert.equal(typeof e.feasible, 'boolean', `feasible: ${show(e)}`);
    assert.ok(Number.isInteger(e.latencyMs) && e.latencyMs >= 0, `latencyMs: ${show(e)}`);
    if (!e.feasible) assert.ok(typeof e.reason === 'string' && e.reason.length > 0, `reason: ${show(e)}`);
  }
}

export { show };
