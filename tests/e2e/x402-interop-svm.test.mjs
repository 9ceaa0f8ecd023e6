// The official v1 client pays Solana through routerd (svm.md §5): x402@1.2.0 builds the
// transaction, routerd's /verify and /settle take it; and a Token-2022 mint, configured as a
// token of solana-devnet, is paid in v1 (x402@1.2.0) and v2 (@x402/svm 2.27.0). Each time the
// payee gets exactly the price, the payer spends no SOL and the fee payer only the fee.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import {
  startSvmNode, newSolanaKeypair, svmFacilitatorConfig, newFeePayer, testWithLogs, postTo, associatedTokenAddress, DEVNET_USDC_MINT, TOKEN_2022_PROGRAM,
} from './lib/svm.mjs';
import { svmPaymentBody } from './lib/svm-payment.mjs';
import { startRouterd, freePort } from './lib/routerd.mjs';
import { makeTempDir } from './lib/util.mjs';

const PRICE = 25_000n;
const SIGNATURE = /^[1-9A-HJ-NP-Za-km-z]{64,88}$/;

let tmp;
let node;
let routerd;
let feePayer;
let payee;
let token2022;

before(async () => {
  tmp = makeTempDir('routerd-svm-interop-');
  node = await startSvmNode({ slotMs: 100, logFile: join(tmp.dir, 'svm-node.log') });
  let feePayerFile;
  ({ feePayer, feePayerFile } = await newFeePayer(node, tmp.dir));
  await node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  ({ mint: token2022 } = await node.createMint({ decimals: 6, tokenProgram: 'token-2022' }));
  payee = await newSolanaKeypair();
  for (const mint of [DEVNET_USDC_MINT, token2022]) await node.createTokenAccount(mint, payee.address);
  const config = svmFacilitatorConfig({
    port: await freePort(), storePath: join(tmp.dir, 'store'), rpcUrl: node.url, feePayerFile,
    // Named tokens replace the preset's: USDC is named again beside the Token-2022 mint.
    chain: `[chains.solana-devnet.tokens.USDC]\nmint = "${DEVNET_USDC_MINT}"\ndecimals = 6\n`
      + `[chains.solana-devnet.tokens.T22]\nmint = "${token2022}"\ndecimals = 6\n`,
  });
  routerd = await startRouterd({ configToml: config, dir: tmp.dir });
});

after(async () => {
  await routerd?.stop();
  await node?.stop();
  tmp?.cleanup();
});

const it = testWithLogs(test, () => tmp.dir, { nodeLog: true });

const post = (path, body) => postTo(routerd.url, path, body);

/** A payer holding 1 token of `mint` and no SOL. */
async function newPayer(mint) {
  const payer = await newSolanaKeypair();
  await node.mintTo(mint, payer.address, 1_000_000n);
  return payer;
}

async function balances(payer, mint, program) {
  return {
    payee: await node.tokenBalance(await associatedTokenAddress(payee.address, mint, program)),
    payer: await node.tokenBalance(await associatedTokenAddress(payer.address, mint, program)),
    payerSol: await node.balance(payer.address),
    feePayer: await node.balance(feePayer.address),
  };
}

/** Verifies then settles `version`'s payment of PRICE in `mint`; checks what moved. */
async function paysThrough(version, mint, program) {
  const payer = await newPayer(mint);
  const body = await svmPaymentBody({
    rpc: node.url, signer: payer.signer, version, payTo: payee.address, mint, amount: PRICE, feePayer: feePayer.address,
  });
  assert.equal(body.paymentPayload.x402Version, version);
  const before = await balances(payer, mint, program);
  assert.deepEqual(await post('/verify', body), { status: 200, body: { isValid: true, payer: payer.address } });
  const settled = await post('/settle', body);
  assert.equal(settled.status, 200, JSON.stringify(settled.body));
  assert.equal(settled.body.success, true, JSON.stringify(settled.body));
  assert.match(settled.body.transaction, SIGNATURE);
  assert.equal(settled.body.payer, payer.address);
  const after = await balances(payer, mint, program);
  assert.equal(after.payee - before.payee, PRICE, 'the payee gets exactly the price');
  assert.equal(before.payer - after.payer, PRICE);
  assert.equal(after.payerSol, before.payerSol, 'the payer spends no SOL');
  const spent = before.feePayer - after.feePayer;
  assert.ok(spent >= 10_000n && spent < 20_000n, `the fee payer paid only the fee (${spent} lamports)`);
}

it('x402@1.2.0 (v1) pays USDC through routerd\'s /verify and /settle', async () => {
  await paysThrough(1, DEVNET_USDC_MINT);
});

it('a Token-2022 mint is paid through routerd in v1 (x402@1.2.0) and v2 (@x402/svm)', async () => {
  await paysThrough(1, token2022, TOKEN_2022_PROGRAM);
  await paysThrough(2, token2022, TOKEN_2022_PROGRAM);
});

it('/supported lists solana-devnet once per version: the Token-2022 mint is one more asset, not another kind', async () => {
  const { kinds } = await (await fetch(`${routerd.url}/supported`)).json();
  assert.deepEqual(kinds.map((k) => `${k.x402Version} ${k.network}`), ['1 solana-devnet', '2 solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1']);
});
