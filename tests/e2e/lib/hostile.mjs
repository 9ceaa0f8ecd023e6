// Hostile payers and a hostile node, for the tests of spec/access.md sections 2 and 3 (the
// operator pays only for payments that can succeed; nobody stalls a lane):
// - hand-assembled ERC-1271 smart wallets (no compiler needed), installed with anvil_setCode,
//   whose isValidSignature answers differently in routerd's trial than on chain, or burns gas;
// - a JSON-RPC proxy in front of a real node that refuses chosen calls with an error of its own
//   (a node whose policy refuses a transaction), answering each element of a batch;
// - a JSON-RPC proxy that forwards everything and then answers chosen calls with an error (a node
//   that takes a transaction and fails to say so);
// - reading one value out of routerd's Prometheus /metrics text.
import { createServer } from 'node:http';
import { keccak256, toBytes, getAddress } from 'viem';
import { listen, proxyHandle } from './bad-upstreams.mjs';

// ---------------------------------------------------------------------------------------------
// EVM code

/** Where routerd places its verify lens with an eth_call state override: the last 20 bytes of keccak256("routerd.lens"). */
export const LENS_ADDRESS = getAddress(`0x${keccak256(toBytes('routerd.lens')).slice(-40)}`);

const byte = (n) => {
  if (!Number.isInteger(n) || n < 0 || n > 0xff) throw new Error(`not a byte: ${n}`);
  return n.toString(16).padStart(2, '0');
};
const size = (hex) => hex.length / 2;

// Return the ERC-1271 magic value bytes4(0x1626ba7e), left-aligned in one word:
//   63 1626ba7e   PUSH4 0x1626ba7e
//   60 e0 1b      PUSH1 224, SHL        -> 0x1626ba7e << 224
//   60 00 52      PUSH1 0, MSTORE       -> memory[0..32] = that word
//   60 20 60 00 f3  PUSH1 32, PUSH1 0, RETURN(0, 32)
const RETURN_MAGIC = '631626ba7e60e01b60005260206000f3';
// Return one zero word (memory is zero): "not a valid signature".
//   60 20 60 00 f3  PUSH1 32, PUSH1 0, RETURN(0, 32)
const RETURN_ZERO = '60206000f3';

/**
 * Runtime code of a wallet whose isValidSignature (any call, in fact) says yes exactly when
 * `condition` (code that leaves one word on the stack) leaves a non-zero word:
 *   <condition>
 *   60 V 57        PUSH1 V, JUMPI        -> to V when the word is not zero
 *   <RETURN_ZERO>                        -> the word was zero: "no"
 *   5b             JUMPDEST (V)
 *   <RETURN_MAGIC>                       -> "yes"
 */
function conditionalWallet(condition) {
  const valid = size(condition) + 3 + size(RETURN_ZERO); // offset of the JUMPDEST
  return `0x${condition}60${byte(valid)}57${RETURN_ZERO}5b${RETURN_MAGIC}`;
}

/**
 * Says yes only where routerd's lens has code: in routerd's eth_call (the lens is placed with a
 * state override), never on chain, where nothing lives at LENS_ADDRESS. Its trial succeeds and
 * its settlement transaction reverts.
 *   73 <LENS_ADDRESS>  PUSH20 the lens address
 *   3b                 EXTCODESIZE      -> > 0 only inside routerd's eth_call
 */
export const ERC1271_VALID_WHERE_THE_LENS_IS = conditionalWallet(`73${LENS_ADDRESS.slice(2).toLowerCase()}3b`);

/**
 * Says yes only to a free call: when the gas price is 0, as in an eth_call that names none. A
 * trial at a real gas price sees "no", like the chain does.
 *   3a 15   GASPRICE, ISZERO
 */
export const ERC1271_VALID_WHEN_FREE = conditionalWallet('3a15');

/**
 * Says yes only to a call from nobody: when tx.origin is the zero address, as in an eth_call that
 * names no sender. A trial from the signer's address sees "no", like the chain does.
 *   32 15   ORIGIN, ISZERO
 */
export const ERC1271_VALID_FROM_NOBODY = conditionalWallet('3215');

/** Gas one turn of burnerWallet's loop takes: JUMPDEST 1, PUSH1 3, SWAP1 3, SUB 3, DUP1 3, PUSH1 3, JUMPI 10. */
export const BURNER_GAS_PER_TURN = 26;

/**
 * Says yes to everything, after burning about `gas` gas in a counting loop:
 *   62 NNNNNN      PUSH3 turns
 *   5b             JUMPDEST (4)
 *   60 01 90 03    PUSH1 1, SWAP1, SUB   -> turns - 1
 *   80             DUP1
 *   60 04 57       PUSH1 4, JUMPI        -> again while not zero
 *   50             POP
 *   <RETURN_MAGIC>
 */
export function burnerWallet(gas) {
  const turns = Math.ceil(gas / BURNER_GAS_PER_TURN);
  if (turns < 1 || turns > 0xffffff) throw new Error(`burnerWallet: ${turns} turns`);
  return `0x62${turns.toString(16).padStart(6, '0')}5b600190038060045750${RETURN_MAGIC}`;
}

/** Place `code` at `address` on the chain of `anvil`. */
export function placeCode(anvil, address, code) {
  return anvil.rpc('anvil_setCode', [address, code]);
}

// ---------------------------------------------------------------------------------------------
// A node that refuses chosen calls

/**
 * A JSON-RPC proxy in front of a real node. `state.refuse(call)` is asked for every call (alone
 * or in a batch): an error object ({code, message}), or a promise of one, answers that call with
 * it, unforwarded; anything falsy forwards it. Batches are answered element by element, in order, with the
 * refused ones in their slots. `state.refused` keeps every refused call, and
 * `state.refusedIn` the size of the request each came in (1: alone or in a batch of one).
 * `state.rewrite(call, answer)` gives the answer a forwarded call gets (a node that lies about
 * what it read; by default the node's own). Set `target` (the node's URL) before the first
 * request.
 */
export async function startRefusingProxy({ target = null, refuse = () => null, rewrite = (call, answer) => answer } = {}) {
  const state = { target, refuse, rewrite, refused: [], refusedIn: [] };
  const forward = async (payload) => {
    const res = await fetch(state.target, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(payload) });
    const answers = await res.json();
    if (!Array.isArray(payload)) return state.rewrite(payload, answers);
    const byId = new Map(payload.map((call) => [JSON.stringify(call.id), call]));
    return [answers].flat().map((a) => state.rewrite(byId.get(JSON.stringify(a?.id)) ?? {}, a));
  };
  const refusal = async (call, size = 1) => {
    const error = call && typeof call === 'object' ? await state.refuse(call) : null;
    if (!error) return null;
    state.refused.push(call);
    state.refusedIn.push(size);
    return { jsonrpc: '2.0', id: call.id ?? null, error };
  };
  async function answer(body) {
    if (!Array.isArray(body)) return (await refusal(body)) ?? forward(body);
    const refusals = await Promise.all(body.map((call) => refusal(call, body.length)));
    const allowed = body.filter((_, i) => !refusals[i]);
    const forwarded = allowed.length ? await forward(allowed) : [];
    const byId = new Map([forwarded].flat().map((r) => [JSON.stringify(r.id), r]));
    return body.map((c, i) => refusals[i] ?? byId.get(JSON.stringify(c.id)));
  }
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      let out;
      try {
        out = await answer(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch (err) {
        out = { jsonrpc: '2.0', id: null, error: { code: -32603, message: `proxy: ${err.message}` } };
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(out));
    });
  });
  return proxyHandle(server, await listen(server), state);
}

// ---------------------------------------------------------------------------------------------
// A node that takes a transaction and answers an error

/**
 * A JSON-RPC proxy in front of a real node that forwards every request as it is, then changes
 * the answer: `state.fail(call)` is asked for every call of the request (alone or in a batch):
 * `{rpc: {code, message}}` replaces that call's answer (the node's result) with the error;
 * `{http: status}` answers the whole request with that HTTP status and a text body instead of the
 * node's JSON; anything falsy keeps the node's answer. `state.failed` keeps every call whose
 * answer was replaced. Set `target` (the node's URL) before the first request.
 */
export async function startUnclearProxy({ target = null, fail = () => null } = {}) {
  const state = { target, fail, failed: [] };
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      const raw = Buffer.concat(chunks).toString('utf8');
      let status = 200;
      let out;
      try {
        const node = await fetch(state.target, { method: 'POST', headers: { 'content-type': 'application/json' }, body: raw });
        const answer = await node.json();
        const body = JSON.parse(raw);
        const calls = [body].flat();
        const faults = calls.map((call) => (call && typeof call === 'object' ? state.fail(call) : null));
        faults.forEach((fault, i) => { if (fault) state.failed.push(calls[i]); });
        const http = faults.find((fault) => fault?.http);
        if (http) {
          status = http.http;
          out = `upstream answered HTTP ${status}`;
        } else {
          const replaced = (entry) => {
            const i = calls.findIndex((c) => JSON.stringify(c?.id) === JSON.stringify(entry?.id));
            const error = faults[i]?.rpc;
            return error ? { jsonrpc: '2.0', id: entry.id, error } : entry;
          };
          out = JSON.stringify(Array.isArray(answer) ? answer.map(replaced) : replaced(answer));
        }
      } catch (err) {
        out = JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32603, message: `proxy: ${err.message}` } });
      }
      res.writeHead(status, { 'content-type': status === 200 ? 'application/json' : 'text/plain' });
      res.end(out);
    });
  });
  return proxyHandle(server, await listen(server), state);
}

// ---------------------------------------------------------------------------------------------
// Metrics

/**
 * The value of the sample `name` (no labels) in Prometheus text `text`, as a number, or undefined
 * when no line is exactly `name <value>`.
 */
export function metricValue(text, name) {
  for (const line of text.split('\n')) {
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)\s+(\S+)/);
    if (m && m[1] === name) return Number(m[2]);
  }
  return undefined;
}
