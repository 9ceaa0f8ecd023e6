// A JSON-RPC proxy in front of a real node, for the tests of spec/access.md sections 4 and 7:
// - it answers on any path and query (a provider URL such as `/v2/<key>?apikey=<key>`), forwards
//   the body to the node's root, and records the paths it was asked on (`state.paths`), so a
//   test can prove routerd really used the URL that carries the secret;
// - it can be taken down (connections refused) and brought back on the same port;
// - on command (`state.fault`) it misbehaves the way a broken node or provider does:
//     'short'    every JSON-RPC batch is forwarded and answered one entry short (every other
//                one instead one entry long, its last entry twice)
//     'garbage'  requests are forwarded and the answers replaced, in turn, by text that is not
//                JSON, by entries whose result is "0xzz", by JSON of the wrong shape (an object
//                for a batch, an array for a single call, results of the wrong type), and by null
//     'huge'     requests are forwarded and every eth_getBlockByNumber block (and eth_blockNumber)
//                answers number and timestamp 0xffffffffffffffff and baseFeePerGas 2^256-1
//     'stall'    each request is held `state.stallMs` (longer than routerd's request timeout),
//                then forwarded and answered (to a caller that has long given up)
//     'slow'     each request is held `state.slowMs` (well inside routerd's timeout), then
//                forwarded and answered: a node under load, so routerd's reads overlap
//     'reject'   every request is answered HTTP 401 with a provider's text that quotes the path
//                and query it was asked on (unforwarded)
//     'echo'     every call is answered with a JSON-RPC error whose message quotes the whole URL
//                (unforwarded), as a provider's "rate limit exceeded for <url>" would
//   `state.hits[fault]` counts the HTTP requests each fault changed; `state.requests` counts HTTP
//   requests, `state.calls` the JSON-RPC calls they carried and `state.methods` those per method.
// WebSocket upgrades are recorded in `state.paths` and refused (HTTP 403).
import { createServer } from 'node:http';
import { keepLikeANode } from './bad-upstreams.mjs';

const U64_MAX = '0xffffffffffffffff';
const U256_MAX = `0x${'f'.repeat(64)}`;

/** Adds one to `methods[m]` for each method `m` the JSON-RPC request (or batch) `raw` carries. */
export const FAULTS = Object.freeze(['short', 'garbage', 'huge', 'stall']);
/** Faults that only hold a request, then forward it and pass the node's answer on unchanged. */
const DELAYS_ONLY = new Set(['stall', 'slow']);

/**
 * @param {object} [o]
 * @param {string} [o.target]  the node's URL (may be set later through `proxy.target`)
 * @param {number} [o.stallMs=2500]
 * @param {number} [o.slowMs=300]
 */
export async function startNodeProxy({ target = null, stallMs = 2500, slowMs = 300 } = {}) {
  const state = {
    target, fault: null, stallMs, slowMs, paths: new Set(), requests: 0, calls: 0, methods: {}, hits: Object.fromEntries([...FAULTS, 'slow', 'reject', 'echo'].map((f) => [f, 0])),
  };
  let turn = 0; // which garbage (or short/long) comes next
  const timers = new Set();
  const hold = (ms) => new Promise((resolve) => {
    const timer = setTimeout(() => { timers.delete(timer); resolve(); }, ms);
    timers.add(timer);
  });

  /** `state.calls` counts JSON-RPC calls (each entry of a batch), `state.methods` them per method. */
  const countCalls = (raw) => {
    let body;
    try {
      body = JSON.parse(raw);
    } catch {
      return;
    }
    for (const call of [body].flat()) {
      state.calls += 1;
      const method = typeof call?.method === 'string' ? call.method : '?';
      state.methods[method] = (state.methods[method] ?? 0) + 1;
      state.onCall?.(call); // a test's own look at each call (its params), when it sets one
    }
  };

  const forward = async (raw) => {
    const res = await fetch(state.target, { method: 'POST', headers: { 'content-type': 'application/json' }, body: raw });
    return res.text();
  };

  /** The node's answer `text` to request `body`, changed by the current fault: {status, text}. */
  function corrupt(body, text) {
    let answer;
    try {
      answer = JSON.parse(text);
    } catch {
      return null; // the node's own garbage: leave it
    }
    const calls = [body].flat();
    const batch = Array.isArray(body);
    switch (state.fault) {
      case 'short': {
        if (!batch || !Array.isArray(answer) || answer.length === 0) return null;
        turn += 1;
        state.hits.short += 1;
        const changed = turn % 2 === 1 ? answer.slice(0, -1) : [...answer, answer[answer.length - 1]];
        return JSON.stringify(changed);
      }
      case 'huge': {
        let changed = false;
        const entries = [answer].flat();
        for (const entry of entries) {
          const call = calls.find((c) => JSON.stringify(c?.id) === JSON.stringify(entry?.id));
          if (call?.method === 'eth_getBlockByNumber' && entry.result && typeof entry.result === 'object') {
            Object.assign(entry.result, { number: U64_MAX, timestamp: U64_MAX });
            if ('baseFeePerGas' in entry.result) entry.result.baseFeePerGas = U256_MAX;
            changed = true;
          } else if (call?.method === 'eth_blockNumber' && typeof entry.result === 'string') {
            entry.result = U64_MAX;
            changed = true;
          }
        }
        if (!changed) return null;
        state.hits.huge += 1;
        return JSON.stringify(answer);
      }
      case 'garbage': {
        turn += 1;
        state.hits.garbage += 1;
        const ids = calls.map((c) => c?.id ?? null);
        const entry = (id, result) => ({ jsonrpc: '2.0', id, result });
        switch (turn % 6) {
          case 0: return 'this is not JSON-RPC {{{';
          case 1: return JSON.stringify(batch ? ids.map((id) => entry(id, '0xzz')) : entry(ids[0], '0xzz'));
          case 2: return JSON.stringify(batch ? entry(ids[0], '0xzz') : [entry(ids[0], '0x1')]);
          case 3: return JSON.stringify(batch ? ids.map((id, i) => entry(id, [{}, [], 12345, true][i % 4])) : entry(ids[0], { number: [] }));
          case 4: return 'null';
          default: return JSON.stringify(batch ? ids.map((id) => ({ jsonrpc: '2.0', id })) : { jsonrpc: '2.0' });
        }
      }
      default:
        return null;
    }
  }

  const server = createServer((req, res) => {
    state.paths.add(req.url);
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      state.requests += 1;
      const raw = Buffer.concat(chunks).toString('utf8');
      countCalls(raw);
      if (state.fault === 'reject') {
        state.hits.reject += 1;
        res.writeHead(401, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: `invalid API key for ${req.url}` }));
        return;
      }
      let text;
      try {
        if (state.fault === 'echo') {
          state.hits.echo += 1;
          const where = `http://${req.headers.host}${req.url}`;
          const refuse = (c) => ({ jsonrpc: '2.0', id: c?.id ?? null, error: { code: -32005, message: `rate limit exceeded for ${where}` } });
          let body = null;
          try {
            body = JSON.parse(raw);
          } catch {
            // answered as one call
          }
          res.writeHead(200, { 'content-type': 'application/json' });
          res.end(JSON.stringify(Array.isArray(body) ? body.map(refuse) : refuse(body)));
          return;
        }
        if (state.fault === 'stall') {
          state.hits.stall += 1;
          await hold(state.stallMs);
        }
        if (state.fault === 'slow') {
          state.hits.slow += 1;
          await hold(state.slowMs);
        }
        text = await forward(raw);
        if (state.fault && !DELAYS_ONLY.has(state.fault)) {
          let body = null;
          try {
            body = JSON.parse(raw);
          } catch {
            // not JSON: forwarded as it is
          }
          if (body !== null) text = corrupt(body, text) ?? text;
        }
      } catch (err) {
        text = JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32603, message: `proxy: ${err.message}` } });
      }
      if (res.destroyed || res.writableEnded) return;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(text);
    });
    res.on('error', () => {});
  });
  server.on('clientError', (_, socket) => socket.destroy());
  server.on('upgrade', (req, socket) => {
    state.paths.add(req.url);
    socket.on('error', () => {});
    socket.end('HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
  });

  keepLikeANode(server);
  const listen = (port = 0) => new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => {
      server.off('error', reject);
      resolve(server.address().port);
    });
  });
  const close = async () => {
    for (const t of timers) clearTimeout(t);
    timers.clear();
    server.closeAllConnections?.();
    if (server.listening) await new Promise((resolve) => server.close(resolve));
  };
  const port = await listen();
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    state,
    set target(url) { state.target = url; },
    /** Stop listening: connections to the port are refused until up(). */
    down: close,
    /** Listen again on the same port. */
    up: () => listen(port),
    close,
  };
}
