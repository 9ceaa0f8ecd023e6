// OpenTelemetry traces (issue 31): off by default; with `[telemetry] otlp_endpoint` routerd sends
// OTLP/HTTP (here its JSON encoding) to a collector, played by a small receiver in this file. One
// settle, called with a W3C `traceparent`, is one trace: the `request` span (a child of the
// caller's span), the `upstream batch` spans of its chain reads, and the `settlement` span from
// the claim to the answer, under which the lane's broadcast is traced. No exported byte holds the
// RPC URL's secrets (the chain is reached through a proxy answering on a secret path and query),
// the signer's key or the API token; the request's log line names the trace. An https://
// collector is spoken to in TLS.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer as createTcpServer } from 'node:net';
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { startFacilitatorStack, withLogTail, NETWORK } from './lib/stack.mjs';
import { startNodeProxy } from './lib/node-proxy.mjs';
import { expectSettled } from './lib/expect.mjs';
import { startOtlpReceiver } from './lib/otlp.mjs';

const PATH_SECRET = 'PATHSECRET123';
const QUERY_SECRET = 'QUERYSECRET456';
const RPC_PATH = `/v2/${PATH_SECRET}?apikey=${QUERY_SECRET}`;
const TOKEN = 'token-of-the-traced-shop';
const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736';
const CALLER_SPAN = '00f067aa0ba902b7';

let stack;
let proxy;
let receiver;
const it = (name, fn) => test(name, { timeout: 90_000 }, withLogTail(() => stack, fn));

before(async () => {
  receiver = await startOtlpReceiver();
  proxy = await startNodeProxy();
  stack = await startFacilitatorStack({
    fundedPayers: 2,
    rpcUrlFor: (name, url) => {
      proxy.target = url;
      return `${proxy.url}${RPC_PATH}`;
    },
  });
});

after(async () => {
  await stack?.stop();
  await proxy?.close();
  await receiver?.close();
});

it('off by default: a settle exports nothing, not even when routerd stops', async () => {
  const p = await stack.pay({ account: stack.payers[0] });
  expectSettled(await stack.settle(p.body, { headers: { traceparent: `00-${TRACE_ID}-${CALLER_SPAN}-01` } }), { network: NETWORK, payer: stack.payers[0].address });
  // An exporter sends what it holds when the daemon stops: once stopped, nothing can come later.
  await stack.routerd.stop();
  assert.deepEqual(receiver.exports, []);
  const log = readFileSync(stack.routerd.logFile, 'utf8');
  assert.match(log, new RegExp(`trace_id="?${TRACE_ID}`), 'without an exporter the log line still names the caller\'s trace');
});

it('one settle is one trace: request, upstream batches and settlement, continuing the caller\'s traceparent', async () => {
  const keysFile = join(stack.tmp.dir, 'api-keys.toml');
  const sha = createHash('sha256').update(TOKEN).digest('hex');
  writeFileSync(keysFile, `[keys.traced-shop]\nsha256 = "${sha}"\n`);
  stack.reconfigure({
    routerdOpts: {
      extra: `[auth]\napi_keys_file = ${JSON.stringify(keysFile)}\n\n`
        + `[telemetry]\notlp_endpoint = ${JSON.stringify(receiver.url)}\notlp_protocol = "http/json"\nservice_name = "routerd-e2e"\n`,
    },
  });
  await stack.routerd.start();
  const payer = stack.payers[1];
  const p = await stack.pay({ account: payer });
  const res = await stack.settle(p.body, {
    headers: { traceparent: `00-${TRACE_ID}-${CALLER_SPAN}-01`, authorization: `Bearer ${TOKEN}` },
  });
  const transaction = expectSettled(res, { network: NETWORK, payer: payer.address });
  assert.ok(proxy.state.paths.has(RPC_PATH), 'routerd reached the chain on the URL with the secrets');
  // Stopping sends what the exporter still holds.
  await stack.routerd.stop();

  assert.ok(receiver.exports.length > 0, 'spans were exported');
  for (const e of receiver.exports) {
    assert.equal(e.path, '/v1/traces');
    assert.match(e.type, /application\/json/);
  }
  const trace = receiver.spans().filter((s) => s.traceId === TRACE_ID);
  const request = trace.find((s) => s.name === 'POST /settle');
  assert.ok(request, `a request span in the caller's trace: ${JSON.stringify(trace.map((s) => s.name))}`);
  assert.equal(request.parentSpanId, CALLER_SPAN, 'the request continues the caller\'s span');
  assert.equal(request.service, 'routerd-e2e');
  assert.equal(request.attributes['http.route'], '/settle');
  assert.equal(request.attributes.api_key, 'traced-shop');
  assert.equal(String(request.attributes['http.response.status_code']), '200');
  assert.match(request.attributes.outcome, /^settled 0x/);
  assert.match(request.attributes.payment, new RegExp(payer.address.slice(2), 'i'));

  const settlement = trace.find((s) => s.name === 'settlement');
  assert.ok(settlement, 'a settlement span');
  assert.equal(settlement.parentSpanId, request.spanId);
  assert.equal(settlement.attributes.signer.toLowerCase(), stack.signer.toLowerCase());
  assert.equal(settlement.attributes.transaction, transaction);
  assert.equal(String(settlement.attributes.block), String((await stack.receipt(transaction)).blockNumber));
  assert.ok(settlement.attributes.nonce !== undefined, 'the transaction nonce');
  assert.ok(BigInt(settlement.endTimeUnixNano) <= BigInt(request.endTimeUnixNano), 'answered before the request ends');

  const batches = trace.filter((s) => s.name === 'upstream batch');
  assert.ok(batches.some((s) => s.parentSpanId === request.spanId || s.parentSpanId === settlement.spanId), 'chain reads of the settle');
  const broadcast = batches.find((s) => s.attributes['rpc.methods'].includes('eth_sendRawTransaction'));
  assert.ok(broadcast, `the broadcast: ${JSON.stringify(batches.map((s) => s.attributes['rpc.methods']))}`);
  assert.equal(broadcast.parentSpanId, settlement.spanId, 'the lane\'s broadcast is in the settlement');
  for (const b of batches) {
    assert.equal(b.attributes.chain, NETWORK);
    assert.equal(b.attributes.upstream, `${NETWORK}#0`);
    assert.ok(Number(b.attributes.latency_ms) >= 0);
  }

  // routerd's own spans only: its dependencies' (jsonrpsee's server and client, hyper) carry
  // fields nobody here chose.
  const foreign = receiver.spans().filter((s) => !String(s.attributes.target).startsWith('routerd::'));
  assert.deepEqual(foreign.map((s) => `${s.attributes.target} ${s.name}`), []);
  const exported = receiver.exports.map((e) => e.text).join('\n');
  const signerKey = stack.signerKey.replace(/^0x/, '');
  for (const secret of [PATH_SECRET, QUERY_SECRET, 'apikey=', TOKEN, signerKey]) {
    assert.ok(!exported.includes(secret), `an export holds ${secret}`);
  }
  const line = readFileSync(stack.routerd.logFile, 'utf8').split('\n')
    .find((l) => l.includes('request') && l.includes('/settle') && l.includes(transaction));
  assert.match(line ?? '', new RegExp(`trace_id="?${TRACE_ID}`), `the request's log line names its trace: ${line}`);
});

it('verifies whose reads share one coalesced request each name the upstream that answered them', async () => {
  // A slow node keeps the first verify's read in flight, so the others' reads wait and go out
  // together in one request, sent by a task of its own: each caller's span still names the
  // upstream, handed back with the answers.
  const traceId = 'a1b2c3d4e5f60718293a4b5c6d7e8f90';
  receiver.exports.length = 0;
  stack.reconfigure({
    routerdOpts: {
      extra: `[telemetry]\notlp_endpoint = ${JSON.stringify(receiver.url)}\notlp_protocol = "http/json"\nservice_name = "routerd-e2e"\n`,
    },
  });
  await stack.routerd.start();
  const payments = await Promise.all([0, 1, 0, 1, 0, 1].map((i) => stack.pay({ account: stack.payers[i] })));
  proxy.state.fault = 'slow';
  try {
    const answers = await Promise.all(payments.map((p, i) => stack.post('/verify', p.body, {
      headers: { traceparent: `00-${traceId}-${String(i + 1).padStart(16, '0')}-01` },
    })));
    for (const res of answers) assert.equal(res.status, 200, JSON.stringify(res.body));
  } finally {
    proxy.state.fault = null;
  }
  await stack.routerd.stop();
  const batches = receiver.spans().filter((s) => s.traceId === traceId && s.name === 'upstream batch');
  assert.ok(batches.length >= payments.length, `a read per verify: ${batches.length}`);
  for (const b of batches) {
    assert.equal(b.attributes.upstream, `${NETWORK}#0`, `a span without its upstream: ${JSON.stringify(b.attributes)}`);
  }
});

it('an https:// collector is spoken to in TLS, and a failing export names no secret of its URL', async () => {
  // A TCP server that keeps the first bytes of each connection: a TLS ClientHello starts with
  // 0x16 (a handshake record), plain HTTP with the method's letters.
  const firstBytes = [];
  const tcp = createTcpServer((socket) => {
    socket.once('data', (chunk) => {
      firstBytes.push(chunk[0]);
      socket.destroy();
    });
  });
  await new Promise((resolve) => tcp.listen(0, '127.0.0.1', resolve));
  const endpoint = `https://127.0.0.1:${tcp.address().port}/tenant/ENDPOINTSECRET?token=QUERYTOKEN`;
  try {
    stack.reconfigure({
      routerdOpts: { extra: `[telemetry]\notlp_endpoint = ${JSON.stringify(endpoint)}\nservice_name = "routerd-tls"\n` },
    });
    stack.routerd.env = { ...stack.routerd.env, OTEL_EXPORTER_OTLP_TIMEOUT: '2000' };
    await stack.routerd.start();
    assert.equal((await stack.request('/health')).status, 200);
    // Stopping exports the /health span: the collector is asked, and refuses the handshake.
    await stack.routerd.stop();
    assert.ok(firstBytes.length > 0, 'routerd connected to the collector');
    assert.ok(firstBytes.every((b) => b === 0x16), `a TLS handshake, not plain HTTP: ${firstBytes}`);
    const log = readFileSync(stack.routerd.logFile, 'utf8');
    for (const secret of ['ENDPOINTSECRET', 'QUERYTOKEN']) assert.ok(!log.includes(secret), `the log holds ${secret}`);
  } finally {
    await new Promise((resolve) => tcp.close(resolve));
  }
});

// access.md §3c: whether a request is exported is routerd's decision (telemetry.sample_ratio),
// never the caller's sampled flag; the caller's trace id is still continued.
it('sample_ratio decides: 0 exports nothing for a caller\'s sampled traceparent, 1 exports an unsampled one in the caller\'s trace', async () => {
  const telemetry = (ratio) => ({
    routerdOpts: {
      extra: `[telemetry]\notlp_endpoint = ${JSON.stringify(receiver.url)}\notlp_protocol = "http/json"\nsample_ratio = ${ratio}\n`,
    },
  });
  // Zeros in the low half: what a plain ratio of the trace id's bits keeps at any share above 0.
  const forced = 'feedfacefeedface0000000000000000';
  receiver.exports.length = 0;
  stack.reconfigure(telemetry(0));
  await stack.routerd.start();
  const sampled = { traceparent: `00-${forced}-${CALLER_SPAN}-01` };
  assert.equal((await stack.request('/health', { headers: sampled })).status, 200);
  const p = await stack.pay({ account: stack.payers[0] });
  assert.equal((await stack.post('/verify', p.body, { headers: sampled })).status, 200);
  await stack.routerd.stop();
  assert.deepEqual(receiver.spans().map((s) => s.name), [], 'sample_ratio = 0: nothing exported');

  const unsampled = 'a0a1a2a3a4a5a6a7a8a9aaabacadaeaf';
  stack.reconfigure(telemetry(1));
  await stack.routerd.start();
  const verified = await stack.post('/verify', p.body, { headers: { traceparent: `00-${unsampled}-${CALLER_SPAN}-00` } });
  assert.equal(verified.status, 200);
  await stack.routerd.stop();
  const request = receiver.spans().find((s) => s.name === 'POST /verify');
  assert.ok(request, `sample_ratio = 1: the request is exported: ${JSON.stringify(receiver.spans().map((s) => s.name))}`);
  assert.equal(request.traceId, unsampled, 'in the caller\'s trace');
  assert.equal(request.parentSpanId, CALLER_SPAN);
});
