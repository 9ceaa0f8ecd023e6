#!/usr/bin/env node
// CLI: print a signed x402 /verify or /settle body (single object) for a local chain, e.g.
//   node tests/e2e/lib/sign-payment.mjs --usdc 0x.. --key 0x.. --pay-to 0x.. --amount 10000 \
//     | curl -s -H 'content-type: application/json' --data-binary @- http://127.0.0.1:8080/verify
// --v2 prints the same payment in x402 v2's shapes (network eip155:<chain id>).
// --smart-wallet --rpc URL signs for KEY's smart wallet (lib/smart-wallet.mjs), ERC-6492 wrapped
// while it is not deployed.
import { parseArgs } from 'node:util';
import { privateKeyToAccount } from 'viem/accounts';
import { getAddress } from 'viem';
import { buildPayment, toV2 } from './x402.mjs';
import { USDC_EIP712, walletFor } from './deploy-usdc.mjs';
import { smartAccountFor } from './smart-wallet.mjs';

const { values } = parseArgs({
  options: {
    usdc: { type: 'string' },
    key: { type: 'string' },
    'pay-to': { type: 'string' },
    amount: { type: 'string', default: '10000' },
    network: { type: 'string', default: 'base-sepolia' },
    'chain-id': { type: 'string', default: '84532' },
    v2: { type: 'boolean', default: false },
    'smart-wallet': { type: 'boolean', default: false },
    rpc: { type: 'string' },
  },
});
for (const required of ['usdc', 'key', 'pay-to']) {
  if (!values[required]) {
    console.error(`sign-payment: --${required} is required`);
    process.exit(2);
  }
}
if (values['smart-wallet'] && !values.rpc) {
  console.error('sign-payment: --smart-wallet needs --rpc');
  process.exit(2);
}
const owner = privateKeyToAccount(values.key);
const account = values['smart-wallet']
  ? await smartAccountFor(await walletFor(values.rpc, values.key), owner)
  : owner;
const payment = await buildPayment({
  account,
  token: { address: values.usdc, ...USDC_EIP712 },
  network: values.network,
  chainId: Number(values['chain-id']),
  payTo: getAddress(values['pay-to']),
  amount: BigInt(values.amount),
});
console.log(JSON.stringify(values.v2 ? toV2(payment, Number(values['chain-id'])) : payment.body));
