#!/usr/bin/env node
// Settle throughput with one, two and three routerd instances sharing one PostgreSQL (and, for
// comparison, one instance on sled): the same key everywhere, so one lane signs for all, fed by
// the others through the work queue. Not a test: it measures, it does not judge.
//
//   ROUTERD_BIN=.../routerd node bench/instances.mjs [--payments N] [--concurrency C]
//
// Each row: N payments sent round-robin over the instances, C at a time, each asked again on a
// pending answer until it is answered; settled per second from the first request to the last
// answer. The chain mines every transaction at once (anvil automine).
import { execFileSync, spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { startFacilitatorStack } from '../tests/e2e/lib/stack.mjs';
import { startRouterd } from '../tests/e2e/lib/routerd.mjs';
import { freePort, makeTempDir, readAnswer } from '../tests/e2e/lib/util.mjs';

const { values: opts } = parseArgs({
  options: { payments: { type: 'string', default: '300' }, concurrency: { type: 'string', default: '32' } },
});
const PAYMENTS = Number(opts.payments);
const CONCURRENCY = Number(opts.concurrency);
process.env.RUST_LOG = process.env.BENCH_RUST_LOG ?? 'info';

const repo = join(dirname(fileURLToPath(import.meta.url)), '..');
const pgCluster = join(repo, 'scripts', 'pg-cluster');
const pgDir = mkdtempSync(join(tmpdir(), 'routerd-bench-pg-'));
const url = execFileSync(pgCluster, ['start', pgDir], { encoding: 'utf8' }).trim();
const stack = await startFacilitatorStack({ fundedPayers: 64 });
await stack.routerd.stop();

async function instances(count, storage) {
  const out = [];
  for (let i = 0; i < count; i += 1) {
    const port = await freePort();
    const toml = stack.configToml({ port }).replace(/\[storage\]\npath = "[^"]*"\n/, storage(i));
    out.push(await startRouterd({
      configToml: toml, dir: makeTempDir('routerd-bench-').dir, port,
      env: { ROUTERD_SIGNER_KEY: stack.signerKey, ROUTERD__STORAGE__POSTGRES_URL: url },
    }));
  }
  return out;
}

async function settle(daemon, body) {
  // One key per payment, repeated on each retry: only the request that claimed a payment (or a
  // retry carrying its key) is told the success.
  const key = `bench-${randomUUID()}`;
  const bytes = JSON.stringify(body);
  for (;;) {
    const res = await readAnswer(await fetch(`${daemon.url}/settle`, {
      method: 'POST', body: bytes, headers: { 'content-type': 'application/json', 'idempotency-key': key },
    }));
    if (!(res.status === 400 && res.body?.error === 504)) return res;
  }
}

async function run(label, daemons) {
  const ps = await Promise.all(Array.from({ length: PAYMENTS }, (_, i) => stack.pay({ account: stack.payers[i % stack.payers.length] })));
  let next = 0;
  let failed = 0;
  const started = performance.now();
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < ps.length) {
      const k = next;
      next += 1;
      const res = await settle(daemons[k % daemons.length], ps[k].body);
      if (res.status !== 200 || !res.body.success) failed += 1;
    }
  }));
  const seconds = (performance.now() - started) / 1000;
  console.log(`${label.padEnd(26)} ${String(PAYMENTS).padStart(8)} ${(PAYMENTS / seconds).toFixed(1).padStart(10)} ${String(failed).padStart(7)}`);
}

console.log(`${'store, instances'.padEnd(26)} ${'payments'.padStart(8)} ${'settled/s'.padStart(10)} ${'failed'.padStart(7)}`);
try {
  const sled = await instances(1, () => `[storage]\npath = "${join(makeTempDir('routerd-bench-sled-').dir, 'routerd.db')}"\n`);
  await run('sled, 1', sled);
  await Promise.all(sled.map((d) => d.stop()));
  for (const count of [1, 2, 3]) {
    const daemons = await instances(count, (i) => `[storage]\nbackend = "postgres"\ninstance_id = "bench-${i}"\n`);
    await run(`postgres, ${count}`, daemons);
    await Promise.all(daemons.map((d) => d.stop()));
  }
} finally {
  await stack.stop();
  spawnSync(pgCluster, ['stop', pgDir], { stdio: 'ignore' });
  rmSync(pgDir, { recursive: true, force: true });
}
