// Small helpers shared by the e2e harness: ports, polling, temp dirs, child-process bookkeeping.
import { createServer } from 'node:net';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The settle retry header (spec/access.md section 1). */
export const IDEMPOTENCY_KEY = 'Idempotency-Key';

/**
 * A fresh Idempotency-Key for one logical settle request (a resource server's own request, never
 * derived from the payment): send it with the first attempt and with every retry of the same body.
 */
export const idempotencyKey = () => randomUUID();

/** Ask the kernel for a free TCP port on 127.0.0.1 (bind to port 0, read it, release it). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/**
 * Poll `probe` until it returns a truthy value or the deadline passes.
 * `probe` may throw (e.g. connection refused) - that counts as "not yet".
 */
export async function waitFor(probe, { timeoutMs = 10_000, intervalMs = 50, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  let lastError;
  for (;;) {
    try {
      const value = await probe();
      if (value) return value;
    } catch (err) {
      lastError = err;
    }
    if (Date.now() > deadline) {
      const cause = lastError ? `: ${lastError.message ?? lastError}` : '';
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${cause}`);
    }
    await sleep(intervalMs);
  }
}

/** A fresh temp directory; removed by cleanup() unless E2E_KEEP_TMP is set (for post-mortems). */
export function makeTempDir(prefix = 'routerd-e2e-') {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return {
    dir,
    cleanup() {
      if (process.env.E2E_KEEP_TMP) {
        console.error(`# E2E_KEEP_TMP: kept ${dir}`);
        return;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Last `lines` lines of a text file ('' when it does not exist). */
export function tailFile(path, lines = 80) {
  try {
    return readFileSync(path, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return ''; // no log (yet, or any more): the caller's own error says what went wrong
  }
}

// Children that must not outlive the test process, even when it dies on an uncaught error or is
// stopped by a signal (Node runs no 'exit' handlers on a default SIGTERM/SIGINT, so catch those too).
const children = new Set();
function killChildren() {
  for (const child of children) {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
}
process.on('exit', killChildren);
for (const [signal, code] of [['SIGINT', 130], ['SIGTERM', 143], ['SIGHUP', 129]]) {
  process.once(signal, () => {
    killChildren();
    process.exit(code);
  });
}

export function trackChild(child) {
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

/** Resolves with {code, signal} once the child has exited (immediately if it already has). */
export function exited(child) {
  if (child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve({ code: child.exitCode, signal: child.signalCode });
  }
  return new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
}

/** An HTTP answer as {status, body (parsed JSON, or undefined when not JSON), text, headers}. */
export async function readAnswer(res) {
  const text = await res.text();
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  return { status: res.status, body, text, headers: res.headers };
}
