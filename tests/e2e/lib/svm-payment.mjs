#!/usr/bin/env node
// A Solana `exact` payment body for routerd's /verify and /settle, built by the official clients:
// x402@1.2.0's for v1 (network `solana-devnet`), @x402/svm 2.27.0's for v2 (CAIP-2 network).
//
// CLI (scripts/dev-stack prints it), e.g.
//   node tests/e2e/lib/svm-payment.mjs --rpc http://127.0.0.1:8899 --key data/dev/svm-payer.json \
//     --pay-to <payee> --fee-payer <routerd's fee payer> [--mint <mint>] [--amount 10000] [--v1] \
//     | curl -s -H 'content-type: application/json' --data-binary @- http://127.0.0.1:8080/verify
import { readFileSync, realpathSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { createKeyPairSignerFromBytes } from '@solana/kit';
import { createPaymentHeader } from 'x402/client';
import { ExactSvmScheme as ExactSvmClient } from '@x402/svm/exact/client';
import { DEVNET_USDC_MINT, SOLANA_DEVNET_CAIP2 } from './svm.mjs';
const RESOURCE = 'http://shop.test/report';

/** v1's requirements (x402@1.2.0's shape) for `amount` of `mint` to `payTo`. */
export function v1Requirements({ payTo, mint = DEVNET_USDC_MINT, amount, feePayer, extra = {} }) {
  return {
    scheme: 'exact', network: 'solana-devnet', maxAmountRequired: String(amount), resource: RESOURCE, description: '',
    mimeType: '', payTo, maxTimeoutSeconds: 60, asset: mint, extra: { feePayer, ...extra },
  };
}

/** v2's requirements (@x402/svm's shape). */
export function v2Requirements({ payTo, mint = DEVNET_USDC_MINT, amount, feePayer, extra = {} }) {
  return {
    scheme: 'exact', network: SOLANA_DEVNET_CAIP2, asset: mint, amount: String(amount), payTo, maxTimeoutSeconds: 60,
    extra: { feePayer, ...extra },
  };
}

/**
 * The v2 and the v1 body of one wire `transaction` (base64) paying `amount` of `mint` to
 * `payTo`, for tests that build their own transactions.
 */
export function svmBodies(transaction, terms) {
  const v2 = v2Requirements(terms);
  const v1 = v1Requirements(terms);
  return {
    v2: {
      x402Version: 2, paymentRequirements: v2,
      paymentPayload: { x402Version: 2, accepted: v2, resource: { url: RESOURCE }, payload: { transaction } },
    },
    v1: {
      x402Version: 1, paymentRequirements: v1,
      paymentPayload: { x402Version: 1, scheme: 'exact', network: 'solana-devnet', payload: { transaction } },
    },
  };
}

/**
 * The /verify or /settle body of one payment by `signer` (a @solana/kit KeyPairSigner), built by
 * the version's official client against the node at `rpc`.
 */
export async function svmPaymentBody({ rpc, signer, version = 2, ...terms }) {
  if (version === 1) {
    const paymentRequirements = v1Requirements(terms);
    const header = await createPaymentHeader(signer, 1, paymentRequirements, { svmConfig: { rpcUrl: rpc } });
    const paymentPayload = JSON.parse(Buffer.from(header, 'base64').toString('utf8'));
    return { x402Version: 1, paymentPayload, paymentRequirements };
  }
  const paymentRequirements = v2Requirements(terms);
  const partial = await new ExactSvmClient(signer, { rpcUrl: rpc }).createPaymentPayload(2, paymentRequirements);
  const paymentPayload = { ...partial, accepted: paymentRequirements, resource: { url: RESOURCE } };
  return { x402Version: 2, paymentPayload, paymentRequirements };
}

if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  const { values } = parseArgs({
    options: {
      rpc: { type: 'string' },
      key: { type: 'string' },
      'pay-to': { type: 'string' },
      'fee-payer': { type: 'string' },
      mint: { type: 'string', default: DEVNET_USDC_MINT },
      amount: { type: 'string', default: '10000' },
      v1: { type: 'boolean', default: false },
    },
  });
  for (const required of ['rpc', 'key', 'pay-to', 'fee-payer']) {
    if (!values[required]) {
      console.error(`svm-payment: --${required} is required`);
      process.exit(2);
    }
  }
  const signer = await createKeyPairSignerFromBytes(new Uint8Array(JSON.parse(readFileSync(values.key, 'utf8'))));
  const body = await svmPaymentBody({
    rpc: values.rpc, signer, version: values.v1 ? 1 : 2, payTo: values['pay-to'], mint: values.mint,
    amount: values.amount, feePayer: values['fee-payer'],
  });
  console.log(JSON.stringify(body));
}
