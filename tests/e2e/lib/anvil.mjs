// Start a real anvil node (from the pinned npm package) on a free port.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { openSync, closeSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { freePort, waitFor, trackChild, exited, tailFile } from './util.mjs';

const require = createRequire(import.meta.url);

/** Path of the anvil binary: $ANVIL_BIN, else the one shipped in @foundry-rs/anvil-linux-amd64. */
export function anvilBin() {
  if (process.env.ANVIL_BIN) return process.env.ANVIL_BIN;
  const pkg = require.resolve('@foundry-rs/anvil-linux-amd64/package.json');
  return join(dirname(pkg), 'bin', 'anvil');
}

export async function rpc(url, method, params = []) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
  });
  const body = await res.json();
  if (body.error) throw new Error(`${method}: ${body.error.message}`);
  return body.result;
}

/**
 * Start anvil and wait until it answers eth_chainId.
 * @param {object} o
 * @param {number} [o.chainId=31337]
 * @param {number} [o.blockTime]   seconds between blocks (interval mining) instead of one block per tx
 * @param {bigint|number|string} [o.baseFee]  --block-base-fee-per-gas (wei)
 * @param {string} [o.hardfork]    e.g. 'berlin' for a legacy-fee (pre-London) chain
 * @param {boolean} [o.noMining]   --no-mining: blocks only on evm_mine (see setAutomine for setup)
 * @param {string[]} [o.extraArgs]
 * @param {string} [o.logFile]     where anvil's stdout/stderr go (default: discarded)
 * @returns {Promise<{url: string, port: number, chainId: number, child: import('node:child_process').ChildProcess,
 *   rpc: (method: string, params?: any[]) => Promise<any>, mine: (blocks?: number) => Promise<void>,
 *   setAutomine: (on: boolean) => Promise<void>, stop: () => Promise<void>}>}
 */
export async function startAnvil({
  chainId = 31337, blockTime, baseFee, hardfork, noMining = false, extraArgs = [], logFile,
} = {}) {
  const port = await freePort();
  const args = ['--host', '127.0.0.1', '--port', String(port), '--chain-id', String(chainId)];
  if (blockTime !== undefined) args.push('--block-time', String(blockTime));
  if (baseFee !== undefined) args.push('--block-base-fee-per-gas', String(baseFee));
  if (hardfork) args.push('--hardfork', hardfork);
  if (noMining) args.push('--no-mining');
  args.push(...extraArgs);

  const out = logFile ? openSync(logFile, 'a') : 'ignore';
  const child = trackChild(spawn(anvilBin(), args, { stdio: ['ignore', out, out] }));
  if (logFile) closeSync(out);

  const url = `http://127.0.0.1:${port}`;
  const spawnError = new Promise((_, reject) => child.once('error', reject));
  const early = exited(child).then(({ code, signal }) => {
    throw new Error(`anvil exited early (code ${code}, signal ${signal})\n${logFile ? tailFile(logFile, 20) : ''}`);
  });
  await Promise.race([
    waitFor(async () => Number(await rpc(url, 'eth_chainId')) === chainId, { what: `anvil on ${url}` }),
    spawnError,
    early,
  ]);
  early.catch(() => {}); // exiting later (stop()) is not an error

  return {
    url,
    port,
    chainId,
    child,
    rpc: (method, params) => rpc(url, method, params),
    async mine(blocks = 1) {
      await rpc(url, 'anvil_mine', [blocks]);
    },
    // Lets a --no-mining chain be set up (deploy, fund) with instant blocks, then switched back.
    async setAutomine(on) {
      await rpc(url, 'evm_setAutomine', [on]);
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000); // never let teardown hang
      await exited(child);
      clearTimeout(timer);
    },
  };
}
