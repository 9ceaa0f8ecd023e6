// A round-robin HTTP front for several routerd instances: each request goes to the next instance
// (a dead one is skipped). For the local stack (scripts/dev-stack --instances N) and tests.
//
//   node tests/e2e/lib/round-robin.mjs --port 8080 http://127.0.0.1:8081 http://127.0.0.1:8082
import { createServer, request } from 'node:http';
import { fileURLToPath } from 'node:url';
import { keepLikeANode } from './bad-upstreams.mjs';

/** Listen on 127.0.0.1:`port`; resolves to the server once listening. */
export function startRoundRobin({ port, targets }) {
  let next = 0;
  const forward = (req, res, body, left) => {
    const target = new URL(targets[next % targets.length]);
    next += 1;
    const upstream = request({
      host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers,
    }, (answer) => {
      res.writeHead(answer.statusCode, answer.headers);
      answer.pipe(res);
    });
    upstream.on('error', () => {
      if (left > 1) forward(req, res, body, left - 1);
      else {
        res.writeHead(502, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: 502, message: 'no routerd instance answered' }));
      }
    });
    upstream.end(body);
  };
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => forward(req, res, Buffer.concat(chunks), targets.length));
  });
  keepLikeANode(server);
  return new Promise((resolve) => server.listen(port, '127.0.0.1', () => resolve(server)));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  const at = args.indexOf('--port');
  const port = Number(args[at + 1]);
  const targets = args.filter((_, i) => i !== at && i !== at + 1);
  if (at < 0 || !port || targets.length === 0) {
    console.error('usage: round-robin.mjs --port PORT URL...');
    process.exit(2);
  }
  await startRoundRobin({ port, targets });
  console.error(`round-robin on http://127.0.0.1:${port} -> ${targets.join(' ')}`);
}
