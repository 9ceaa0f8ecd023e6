import { installOpStackPredeploys, getL1Fee, readOracle } from '../lib/op-stack.mjs';
import { serializeTransaction, toHex } from 'viem';
async function rpc(url, method, params = []) {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }) });
  const b = await res.json(); if (b.error) throw new Error(method + ': ' + JSON.stringify(b.error)); return b.result;
}
const anvil = { rpc: (m, p) => rpc('http://127.0.0.1:18546', m, p) };
await installOpStackPredeploys(anvil);
console.log('isEcotone', await readOracle(anvil, 'isEcotone'), 'l1BaseFee', await readOracle(anvil, 'l1BaseFee'), 'version', await readOracle(anvil, 'version'));
for (const n of [0, 1, 100, 1000, 4000]) {
  const tx = serializeTransaction({ chainId: 901, type: 'eip1559', nonce: 0, gas: 1000000n, maxFeePerGas: 1n, maxPriorityFeePerGas: 1n, to: '0x1111111111111111111111111111111111111111', data: '0x' + 'ff'.repeat(n), value: 0n });
  console.log(n, await getL1Fee(anvil, tx));
}
const to = '0x2222222222222222222222222222222222222222';
for (const port of [18545, 18546, 18547]) {
  const u = 'http://127.0.0.1:' + port;
  await rpc(u, 'anvil_setCode', [to, '0x00']);
  await rpc(u, "anvil_setBalance", ["0x1234567890123456789012345678901234567890", "0xde0b6b3a7640000"]);
  for (const n of [0, 1000, 4000]) {
    console.log(port, n, 'est', BigInt(await rpc(u, 'eth_estimateGas', [{ from: '0x1234567890123456789012345678901234567890', to, data: '0x' + 'ff'.repeat(n) }])));
  }
}
for (const port of [18545, 18546, 18547]) console.log(port, await rpc('http://127.0.0.1:' + port, 'eth_gasPrice'), (await rpc('http://127.0.0.1:' + port, 'eth_getBlockByNumber', ['latest', false])).baseFeePerGas);
