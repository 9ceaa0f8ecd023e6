// A small OTLP/HTTP collector for the telemetry tests: it keeps every export it is sent, and
// reads the spans of the JSON ones (OTLP's JSON encoding: hex ids, attributes as key/value lists).
import { createServer } from 'node:http';

/** Start the collector on 127.0.0.1: {url, exports: [{path, type, text}], spans(), close()}. */
export function startOtlpReceiver() {
  const exports = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      exports.push({ path: req.url, type: req.headers['content-type'], text: Buffer.concat(chunks).toString('utf8') });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{}');
    });
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => resolve({
      exports,
      url: `http://127.0.0.1:${server.address().port}`,
      spans: () => spansOf(exports),
      close: () => new Promise((done) => server.close(done)),
    }));
  });
}

/** Every span of every JSON export, its attributes as a plain object, with its service name. */
function spansOf(exports) {
  const all = [];
  for (const e of exports) {
    for (const rs of JSON.parse(e.text).resourceSpans ?? []) {
      const service = rs.resource?.attributes?.find((a) => a.key === 'service.name')?.value?.stringValue;
      for (const ss of rs.scopeSpans ?? []) {
        for (const s of ss.spans ?? []) {
          const attributes = Object.fromEntries((s.attributes ?? []).map(({ key, value }) => [key, Object.values(value)[0]]));
          all.push({ ...s, attributes, service });
        }
      }
    }
  }
  return all;
}
