// What a block's receipts cost anvil itself, by the block's size: the floor under routerd's
// block-to-answer, measured without routerd. For each size, an idle anvil mines one block of that
// many transfers, then its receipts are read as routerd reads them (requests of 64 calls, sent at
// once) and with one `eth_getBlockReceipts`, a few rounds each.
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

async function block(size) {
  const accounts = (await call('eth_accounts')).result;
  const hashes = [];
  for (let i = 0; i < size; i += 1) {
    const from = accounts[i % accounts.length];
    const to = accounts[(i + 1) % accounts.length];
    hashes.push((await call('eth_sendTransaction', [{ from, to, value: '0x1', gas: '0x5208' }])).result);
  }
  await call('evm_mine');
  return { hashes, number: (await call('eth_blockNumber')).result };
}

const anvil = spawn(anvilBin(), ['--port', String(PORT), '--no-mining', '--silent', '--gas-limit', '30000000'], { stdio: 'ignore' });
try {
  await new Promise((resolve) => setTimeout(resolve, 1500));
  for (const size of sizes) {
    const { hashes, number } = await block(size);
    const batches = [];
    for (let i = 0; i < hashes.length; i += 64) batches.push(hashes.slice(i, i + 64));
    const byHash = [];
    const byBlock = [];
    for (let r = 0; r < rounds; r += 1) {
      byHash.push(await timed(() => Promise.all(batches.map((b) => rpc(b.map((h, id) => ({ jsonrpc: '2.0', id, method: 'eth_getTransactionReceipt', params: [h] })))))));
      byBlock.push(await timed(() => call('eth_getBlockReceipts', [number])));
    }
    const ms = (xs) => xs.map((x) => x.toFixed(1)).join(' / ');
    console.log(`${size} transfers: ${batches.length} requests of at most 64 receipts ${ms(byHash)} ms; eth_getBlockReceipts ${ms(byBlock)} ms`);
  }
} finally {
  anvil.kill();
}
