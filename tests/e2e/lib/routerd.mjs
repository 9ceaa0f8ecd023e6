// Run the real routerd binary as a child process with a real config file.
import { spawn } from 'node:child_process';
import { existsSync, openSync, closeSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { freePort, waitFor, trackChild, exited, tailFile, makeTempDir } from './util.mjs';

/** $ROUTERD_BIN, else cargo's debug build in the shared target dir (what scripts/test-e2e builds). */
export function routerdBin() {
  if (process.env.ROUTERD_BIN) return process.env.ROUTERD_BIN;
  const target = process.env.CARGO_TARGET_DIR ?? join(homedir(), '.cache', 'routerd', 'target');
  return join(target, 'debug', 'routerd');
}

// Short, so that a test of SIGTERM does not wait the production default (30 s) for in-flight work.
export const SHUTDOWN_GRACE_SECS = 5;

const q = (s) => JSON.stringify(String(s)); // a JSON string is a valid TOML basic string for our values
const list = (xs) => `[${xs.map(q).join(', ')}]`;

/**
 * routerd TOML config for the facilitator tests.
 * @param {object} o
 * @param {number} o.port
 * @param {string} o.storePath
 * @param {{name: string, chainId: number, kind?: string, rpcUrl: string, token?: string, extra?: string}[]} o.chains
 *   `token` is the USDC address (omit for a chain without tokens); `extra` is raw TOML added to the chain table.
 * @param {string[]} o.networks           served by the facilitator
 * @param {string} o.denyListFile
 * @param {number} [o.settleTimeoutSecs=60]
 * @param {number} [o.maxBatch=100]
 * @param {number} [o.maxBodyBytes=65536]
 * @param {number[]} [o.x402Versions]     facilitator.x402_versions (left to routerd's default when absent)
 * @param {boolean} [o.allowHttpResource] facilitator.allow_http_resource (left to the default when absent)
 * @param {string[]} [o.erc6492Factories] facilitator.erc6492_factories (left to the default when absent)
 * @param {string} [o.extra]              raw TOML appended at the end (e.g. a [router] table)
 * @param {string} [o.serverExtra]        raw TOML lines added to the [server] table
 */
export function routerdConfig({
  port, storePath, chains, networks, denyListFile, settleTimeoutSecs = 60, maxBatch = 100, maxBodyBytes = 65536,
  x402Versions, allowHttpResource, erc6492Factories, extra = '', serverExtra = '',
}) {
  const parts = [
    `[server]\nlisten = ${q(`127.0.0.1:${port}`)}\nmax_body_bytes = ${maxBodyBytes}\n`
      + `shutdown_grace_secs = ${SHUTDOWN_GRACE_SECS}\n${serverExtra}`,
    `[storage]\npath = ${q(storePath)}\n`,
  ];
  for (const c of chains) {
    parts.push(`[chains.${c.name}]\nchain_id = ${c.chainId}\nkind = ${q(c.kind ?? 'l2')}\nrpc_urls = ${list([c.rpcUrl])}\n${c.extra ?? ''}`);
    if (c.token) {
      parts.push(`[chains.${c.name}.tokens.USDC]\naddress = ${q(c.token)}\neip712_name = "USD Coin"\neip712_version = "2"\n${c.tokenExtra ?? ''}`);
    }
  }
  parts.push(
    `[facilitator]\nnetworks = ${list(networks)}\ndeny_list_file = ${q(denyListFile)}\n`
      + `settle_timeout_secs = ${settleTimeoutSecs}\nmax_batch = ${maxBatch}\n`
      + (x402Versions ? `x402_versions = [${x402Versions.join(', ')}]\n` : '')
      + (allowHttpResource === undefined ? '' : `allow_http_resource = ${allowHttpResource}\n`)
      + (erc6492Factories ? `erc6492_factories = ${list(erc6492Factories)}\n` : ''),
  );
  if (extra) parts.push(extra);
  return parts.join('\n');
}

/**
 * Start routerd and wait for GET /health = 200.
 * @param {object} o
 * @param {string} o.configToml   written to <dir>/routerd.toml
 * @param {string} [o.dir]        where config and log live (default: a new temp dir)
 * @param {number} [o.port]       the port the config listens on (default: read from server.listen)
 * @param {Record<string,string>} [o.env]  e.g. ROUTERD_SIGNER_KEY
 * @returns {Promise<Routerd>}
 */
export async function startRouterd({ configToml, dir = makeTempDir().dir, port = listenPort(configToml), env = {}, openFiles }) {
  const bin = routerdBin();
  if (!existsSync(bin)) {
    throw new Error(`routerd binary not found at ${bin}: build it (cargo build) or set ROUTERD_BIN`);
  }
  const configFile = join(dir, 'routerd.toml');
  writeFileSync(configFile, configToml);
  const r = new Routerd({ bin, configFile, logFile: join(dir, 'routerd.log'), port, env, openFiles });
  await r.start();
  return r;
}

function listenPort(configToml) {
  const m = configToml.match(/^listen\s*=\s*"[^"]*:(\d+)"/m);
  if (!m) throw new Error('startRouterd: no port given and no server.listen in the config');
  return Number(m[1]);
}

export class Routerd {
  constructor({ bin, configFile, logFile, port, env, openFiles }) {
    Object.assign(this, { bin, configFile, logFile, port, env, openFiles });
    this.url = `http://127.0.0.1:${port}`;
    this.child = null;
    this.starts = 0;
  }

  /** Spawn and wait until /health answers 200; fails fast (with the log tail) if routerd exits. */
  async start() {
    this.starts += 1;
    const out = openSync(this.logFile, 'a');
    writeFileSync(out, `\n===== routerd start #${this.starts} ${new Date().toISOString()} =====\n`);
    const env = { ...process.env, RUST_LOG: process.env.RUST_LOG ?? 'info,routerd=debug', ...this.env };
    // With `openFiles`, under that open-file limit (soft and hard), as a shell's `ulimit -n` sets it.
    const [command, args] = this.openFiles
      ? ['prlimit', [`--nofile=${this.openFiles}:${this.openFiles}`, '--', this.bin, '--config', this.configFile]]
      : [this.bin, ['--config', this.configFile]];
    const child = trackChild(spawn(command, args, { stdio: ['ignore', out, out], env }));
    closeSync(out);
    this.child = child;

    const spawnError = new Promise((_, reject) => child.once('error', reject));
    const early = exited(child).then(({ code, signal }) => {
      throw new Error(`routerd exited during startup (code ${code}, signal ${signal})\n${this.tail(40)}`);
    });
    early.catch(() => {}); // a later exit (stop/kill) is not a startup failure
    try {
      await Promise.race([
        waitFor(async () => (await fetch(`${this.url}/health`)).status === 200, {
          timeoutMs: 30_000, what: `routerd /health on ${this.url}`,
        }),
        spawnError,
        early,
      ]);
    } catch (err) {
      child.kill('SIGKILL');
      if (!err.message.includes('routerd exited')) err.message += `\n--- routerd log tail ---\n${this.tail(40)}`;
      throw err;
    }
    return this;
  }

  /**
   * SIGTERM and wait: graceful shutdown. Returns the exit {code, signal}. A daemon still running
   * `graceMs` later is SIGKILLed so that a hung shutdown fails the test instead of hanging the suite:
   * the result is then {code: null, signal: 'SIGKILL', hung: true}.
   */
  async stop({ graceMs = (SHUTDOWN_GRACE_SECS + 10) * 1000 } = {}) {
    if (!this.running) return exited(this.child);
    this.child.kill('SIGTERM');
    let timer;
    const hung = new Promise((resolve) => { timer = setTimeout(() => resolve('hung'), graceMs); });
    const first = await Promise.race([exited(this.child), hung]);
    clearTimeout(timer);
    if (first !== 'hung') return first;
    this.note(`no exit ${graceMs} ms after SIGTERM, sending SIGKILL`);
    this.child.kill('SIGKILL');
    return { ...(await exited(this.child)), hung: true };
  }

  /** SIGKILL: a crash, with no chance to flush or clean up. */
  async kill() {
    if (!this.running) return exited(this.child);
    this.child.kill('SIGKILL');
    return exited(this.child);
  }

  /** Start again on the same config and store (after stop() or kill()). */
  async restart() {
    if (this.running) await this.stop();
    return this.start();
  }

  get running() {
    return this.child !== null && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Best effort: a harness remark in the log (the temp dir may already be gone). */
  note(text) {
    try {
      writeFileSync(this.logFile, `\n===== harness: ${text} =====\n`, { flag: 'a' });
    } catch {
      // nothing to annotate
    }
  }

  tail(lines = 80) {
    return tailFile(this.logFile, lines);
  }
}

export { freePort };
