// What reading a block's inclusions costs anvil itself, by the block's size: the floor under
// routerd's block-to-answer, measured without routerd. For each size, an idle anvil mines one block
// of that many calls to a contract that emits one log (as a settlement's token does), then reads
// them three ways, a few rounds each: receipts as routerd read them before (requests of 64 calls,
// sent at once), one `eth_getBlockReceipts`, and the block's logs in one `eth_getLogs` (as routerd
// reads them now).
//
//   node bench/anvil-receipts.mjs [sizes, default 95,190,381] [rounds, default 3]
import { spawn } from 'node:child_process';
import { anvilBin } from '../tests/e2e/lib/anvil.mjs';

const sizes = (process.argv[2] ?? '95,190,381').split(',').map(Number);
const rounds = Number(process.argv[3] ?? 3);
const PORT = 8599;
const url = `http://127.0.0.1:${PORT}`;
const rpc = async (body) => (await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })).json();
const call = (method, params = []) => rpc({ jsonrpc: '2.0', id: 1, method, params });
const timed = async (f) => {
  const t = performance.now();
  await f();
  return performance.now() - t;
};

// Runtime code: PUSH32 topic, PUSH1 0, PUSH1 0, LOG1, STOP; the init code returns it.
const RUNTIME = `7f${'ab'.repeat(32)}60006000a100`;
const LENGTH = (RUNTIME.length / 2).toString(16).padStart(2, '0');
const INIT = `0x60${LENGTH}600c60003960${LENGTH}6000f3${RUNTIME}`;

async function emitter(from) {
  const hash = (await call('eth_sendTransaction', [{ from, data: INIT, gas: '0x100000' }])).result;
  await call('evm_mine');
  return (await call('eth_getTransactionReceipt', [hash])).result.contractAddress;
}

async function block(size, to) {
  const accounts = (await call('eth_accounts')).result;
  const hashes = [];
  for (let i = 0; i < size; i += 1) {
    const from = accounts[i % accounts.length];
    hashes.push((await call('eth_sendTransaction', [{ from, to, gas: '0x10000' }])).result);
  }
  await call('evm_mine');
  return { hashes, number: (await call('eth_blockNumber')).result };
}

const anvil = spawn(anvilBin(), ['--port', String(PORT), '--no-mining', '--silent', '--gas-limit', '30000000'], { stdio: 'ignore' });
try {
  await new Promise((resolve) => setTimeout(resolve, 1500));
  const to = await emitter((await call('eth_accounts')).result[0]);
  for (const size of sizes) {
    const { hashes, number } = await block(size, to);
    const batches = [];
    for (let i = 0; i < hashes.length; i += 64) batches.push(hashes.slice(i, i + 64));
    const byHash = [];
    const byBlock = [];
    const byLogs = [];
    for (let r = 0; r < rounds; r += 1) {
      byHash.push(await timed(() => Promise.all(batches.map((b) => rpc(b.map((h, id) => ({ jsonrpc: '2.0', id, method: 'eth_getTransactionReceipt', params: [h] })))))));
      byBlock.push(await timed(() => call('eth_getBlockReceipts', [number])));
      byLogs.push(await timed(() => call('eth_getLogs', [{ fromBlock: number, toBlock: number, address: to }])));
    }
    const ms = (xs) => xs.map((x) => x.toFixed(1)).join(' / ');
    console.log(`${size} calls: ${batches.length} requests of at most 64 receipts ${ms(byHash)} ms; eth_getBlockReceipts ${ms(byBlock)} ms; eth_getLogs ${ms(byLogs)} ms`);
  }
} finally {
  anvil.kill();
}
