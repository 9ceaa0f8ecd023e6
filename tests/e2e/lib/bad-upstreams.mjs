// Upstream RPC URLs that misbehave, for fault tests: one that accepts connections and never
// answers, one that answers HTTP 200 with something that is not JSON-RPC, one where nothing listens,
// and a proxy in front of a real node that hides or swallows chosen methods.
import { createServer as createTcpServer } from 'node:net';
import { createServer as createHttpServer } from 'node:http';
import { freePort } from './util.mjs';

/**
 * Keeps idle connections open as long as the nodes a test server stands for do (geth: 120 s),
 * longer than routerd's client keeps them in its pool (90 s). Node's default of 5 s closed an
 * idle connection just as routerd reused it, and that request failed without reaching the node.
 */
export function keepLikeANode(server) {
  server.keepAliveTimeout = 120_000;
  return server;
}

/** Starts `server` listening on a free 127.0.0.1 port: the port. */
export function listen(server) {
  keepLikeANode(server);
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve(server.address().port));
  });
}

/**
 * The handle of a proxy: HTTP `server` listening on `port`, with its `state` (a settable `target`
 * writes `state.target`, the node's URL); close() ends its connections and stops it.
 */
export function proxyHandle(server, port, state) {
  return {
    url: `http://127.0.0.1:${port}`,
    state,
    set target(url) { state.target = url; },
    async close() {
      server.closeAllConnections?.();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/** Accepts TCP connections, reads the request and never answers. */
export async function startHangingUpstream() {
  const sockets = new Set();
  const server = createTcpServer((socket) => {
    sockets.add(socket);
    socket.on('data', () => {}); // swallow the request
    socket.on('error', () => {});
    socket.on('close', () => sockets.delete(socket));
  });
  const port = await listen(server);
  return {
    url: `http://127.0.0.1:${port}`,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/** Answers every request with HTTP 200 and a body that is not JSON. */
export async function startGarbageUpstream(body = 'this is not JSON-RPC {{{') {
  const server = createHttpServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(body);
    });
  });
  const port = await listen(server);
  return {
    url: `http://127.0.0.1:${port}`,
    async close() {
      server.closeAllConnections?.();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/** A URL where nothing listens (connection refused). */
export async function deadUpstreamUrl() {
  return `http://127.0.0.1:${await freePort()}`;
}

/**
 * A JSON-RPC proxy in front of a real node that answers "method not found" for `blocked` methods
 * (also inside batches) and forwards everything else: a node without, say, eth_maxPriorityFeePerGas.
 * Requests that call one of the `hanging` methods (alone or in a batch) are swallowed: never
 * forwarded, never answered (a node that stalls on eth_sendRawTransaction, say). Both lists live in
 * `state` and may be changed while the proxy runs; `state.hungCalls` counts the swallowed requests and `state.hung` keeps their bodies.
 * With `capacity`, it is a node that saturates: each request is held `delayMs`, and a request
 * arriving while `capacity` are being served is refused with HTTP 503 (`state.overloaded` counts
 * them; `state.peak` is the most served at once).
 * `overrides` plays a node's support for eth_call's state override (the third parameter):
 * 'run' forwards it, 'ignore' drops it (the node runs the call against the real, empty account),
 * 'refuse' answers "invalid params". `state.requests` lists the methods of every forwarded HTTP
 * request, in order (a batch is one entry with several methods), for counting upstream calls;
 * `state.overridden` counts the eth_calls with a state override among them.
 * `state.failing`, when set, picks calls the node cannot run: they are answered with the error
 * anvil gives mid-reorganisation for a block it no longer has (not a revert).
 * `state.dropNext` requests (0 unless set) are read and then their connection is closed with no
 * answer, as a balancer closes an idle connection just as it is reused (`state.dropped` counts).
 * `state.maxBatch`, when set, is a provider's batch limit: a batch of more calls is answered with
 * one error object, as geth answers "batch too large" (`state.tooLarge` counts them).
 * Set `target` (the node's URL) before the first request.
 */
export async function startFilteringProxy({ blocked = [], hanging = [], target = null, capacity = Infinity, delayMs = 0, overrides = 'run' } = {}) {
  const state = { target, blocked, hanging, failing: null, maxBatch: null, tooLarge: 0, dropNext: 0, dropped: 0, blockedCalls: 0, hungCalls: 0, hung: [], capacity, delayMs, serving: 0, peak: 0, overloaded: 0, overrides, requests: [], overridden: 0 };
  const overridden = (call) => call?.method === 'eth_call' && call.params?.length > 2;
  const withoutOverride = (call) => (overridden(call) && state.overrides === 'ignore' ? { ...call, params: call.params.slice(0, 2) } : call);
  const refuse = (call) => {
    state.blockedCalls += 1;
    return { jsonrpc: '2.0', id: call.id ?? null, error: { code: -32601, message: `the method ${call.method} does not exist/is not available` } };
  };
  const refuseOverride = (call) => ({ jsonrpc: '2.0', id: call.id ?? null, error: { code: -32602, message: 'too many arguments, want at most 2' } });
  const fails = (call) => Boolean(state.failing?.(call));
  const cannotRun = (call) => ({ jsonrpc: '2.0', id: call.id ?? null, error: { code: -32603, message: 'BlockOutOfRangeError: block height is 17 but requested was 19' } });
  const isBlocked = (call) => fails(call) || state.blocked.includes(call?.method) || (overridden(call) && state.overrides === 'refuse');
  const refusal = (call) => (fails(call) ? cannotRun(call) : overridden(call) ? refuseOverride(call) : refuse(call));
  const hangs = (body) => [body].flat().some((call) => state.hanging.includes(call?.method));
  const forward = async (payload) => {
    state.requests.push([payload].flat().map((c) => c.method));
    state.overridden += [payload].flat().filter(overridden).length;
    const res = await fetch(state.target, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(Array.isArray(payload) ? payload.map(withoutOverride) : withoutOverride(payload)) });
    return res.json();
  };
  const server = createHttpServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      if (state.dropNext > 0) {
        state.dropNext -= 1;
        state.dropped += 1;
        req.socket.destroy();
        return;
      }
      if (state.serving >= state.capacity) {
        state.overloaded += 1;
        res.writeHead(503, { 'content-type': 'text/plain' });
        res.end('node saturated');
        return;
      }
      state.serving += 1;
      state.peak = Math.max(state.peak, state.serving);
      try {
        if (state.delayMs > 0) await new Promise((r) => setTimeout(r, state.delayMs));
        await answerRequest(chunks, res);
      } finally {
        state.serving -= 1;
      }
    });
  });
  async function answerRequest(chunks, res) {
    let answer;
    try {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      if (hangs(body)) {
        state.hungCalls += 1;
        state.hung.push(body);
        return; // never answered; close() ends the connection
      }
      if (Array.isArray(body) && state.maxBatch !== null && body.length > state.maxBatch) {
        state.tooLarge += 1;
        answer = { jsonrpc: '2.0', id: null, error: { code: -32600, message: 'batch too large' } };
      } else if (Array.isArray(body)) {
        const allowed = body.filter((c) => !isBlocked(c));
        const forwarded = allowed.length ? await forward(allowed) : [];
        const byId = new Map(forwarded.map((r) => [JSON.stringify(r.id), r]));
        answer = body.map((c) => (isBlocked(c) ? refusal(c) : byId.get(JSON.stringify(c.id))));
      } else {
        answer = isBlocked(body) ? refusal(body) : await forward(body);
      }
    } catch (err) {
      answer = { jsonrpc: '2.0', id: null, error: { code: -32603, message: `proxy: ${err.message}` } };
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(answer));
  }
  return proxyHandle(server, await listen(server), state);
}
