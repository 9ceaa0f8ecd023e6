#!/usr/bin/env node
// CLI: print a signed x402 /verify or /settle body (single object) for a local chain, e.g.
//   node tests/e2e/lib/sign-payment.mjs --usdc 0x.. --key 0x.. --pay-to 0x.. --amount 10000 \
//     | curl -s -H 'content-type: application/json' --data-binary @- http://127.0.0.1:8080/verify
// --v2 prints the same payment in x402 v2's shapes (network eip155:<chain id>).
import { parseArgs } from 'node:util';
import { privateKeyToAccount } from 'viem/accounts';
import { getAddress } from 'viem';
import { buildPayment, toV2 } from './x402.mjs';
import { USDC_EIP712 } from './deploy-usdc.mjs';

const { values } = parseArgs({
  options: {
    usdc: { type: 'string' },
    key: { type: 'string' },
    'pay-to': { type: 'string' },
    amount: { type: 'string', default: '10000' },
    network: { type: 'string', default: 'base-sepolia' },
    'chain-id': { type: 'string', default: '84532' },
    v2: { type: 'boolean', default: false },
  },
});
for (const required of ['usdc', 'key', 'pay-to']) {
  if (!values[required]) {
    console.error(`sign-payment: --${required} is required`);
    process.exit(2);
  }
}
const payment = await buildPayment({
  account: privateKeyToAccount(values.key),
  token: { address: values.usdc, ...USDC_EIP712 },
  network: values.network,
  chainId: Number(values['chain-id']),
  payTo: getAddress(values['pay-to']),
  amount: BigInt(values.amount),
});
console.log(JSON.stringify(values.v2 ? toV2(payment, Number(values['chain-id'])) : payment.body));
