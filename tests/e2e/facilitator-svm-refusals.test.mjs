// Every instruction rule of svm.md §3 refused at /verify with a hand-built transaction
// (lib/svm-tx.mjs), which no official client would build: the compute unit limit and price above
// their caps, too few and too many instructions (v1 allows one fewer than v2), an unknown program
// after the transfer or in its place, routerd's fee payer in an instruction's accounts, as the
// transfer's authority or its source, address lookup tables, a forged or a missing payer
// signature. Each answers its exact reason in v2 and v1, /settle refuses it too, and the fee payer
// keeps every lamport.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import {
  startSvmNode, newSolanaKeypair, svmFacilitatorConfig, newFeePayer, testWithLogs, postTo, associatedTokenAddress, DEVNET_USDC_MINT,
} from './lib/svm.mjs';
import { svmBodies } from './lib/svm-payment.mjs';
import {
  paymentInstructions, computeLimit, computePrice, memo, transferChecked, compileMessage, wireTransaction, SYSTEM,
} from './lib/svm-tx.mjs';
import { startRouterd, freePort } from './lib/routerd.mjs';
import { makeTempDir } from './lib/util.mjs';

const AMOUNT = 10_000;
const TX = 'invalid_exact_svm_payload_transaction';
const FEE_PAYER_MOVES = 'invalid_exact_svm_payload_transaction_fee_payer_transferring_funds';
const FEE_PAYER_NAMED = 'invalid_exact_svm_payload_transaction_fee_payer_included_in_instruction_accounts';
const LENGTH = 'invalid_exact_svm_payload_transaction_instructions_length';

let tmp;
let node;
let routerd;
let feePayer;
let payer;
let payee;

before(async () => {
  tmp = makeTempDir('routerd-svm-refusals-');
  node = await startSvmNode({ slotMs: 100, logFile: join(tmp.dir, 'svm-node.log') });
  let feePayerFile;
  ({ feePayer, feePayerFile } = await newFeePayer(node, tmp.dir));
  await node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  [payer, payee] = [await newSolanaKeypair(), await newSolanaKeypair()];
  await node.mintTo(DEVNET_USDC_MINT, payer.address, 1_000_000n);
  await node.createTokenAccount(DEVNET_USDC_MINT, payee.address);
  // The fee payer holds the mint too: a transfer it authorised could move it.
  await node.mintTo(DEVNET_USDC_MINT, feePayer.address, 1_000_000n);
  const config = svmFacilitatorConfig({
    port: await freePort(), storePath: join(tmp.dir, 'store'), rpcUrl: node.url, feePayerFile,
  });
  routerd = await startRouterd({ configToml: config, dir: tmp.dir });
});

after(async () => {
  await routerd?.stop();
  await node?.stop();
  tmp?.cleanup();
});

const it = testWithLogs(test, () => tmp.dir);

const post = (path, body) => postTo(routerd.url, path, body);

/** The v2 and the v1 body of one wire transaction paying AMOUNT to the payee. */
function bodies(transaction) {
  return svmBodies(transaction, { payTo: payee.address, amount: AMOUNT, feePayer: feePayer.address });
}

/** A transaction of `instructions` with routerd's fee payer, signed by the payer (and `signers`). */
async function build(instructions, { lookups, signers = [payer], forge } = {}) {
  const { value: { blockhash } } = await node.rpc('getLatestBlockhash', []);
  const compiled = compileMessage({ feePayer: feePayer.address, instructions, blockhash, lookups });
  return wireTransaction(compiled, signers, forge);
}

const valid = (o = {}) => paymentInstructions({ payer: payer.address, payTo: payee.address, mint: DEVNET_USDC_MINT, amount: AMOUNT, ...o });

it('the hand-built payment itself is valid in v2 and v1: each refusal below is its one rule', async () => {
  const { v1, v2 } = bodies(await build(await valid()));
  assert.deepEqual((await post('/verify', v2)).body, { isValid: true, payer: payer.address });
  assert.deepEqual((await post('/verify', v1)).body, { isValid: true, payer: payer.address });
  // Four optional instructions after the transfer: seven in all, v2's most and one more than v1's.
  const seven = bodies(await build([...await valid(), ...['a', 'b', 'c', 'd'].map((t) => memo(t))]));
  assert.equal((await post('/verify', seven.v2)).body.isValid, true);
  assert.equal((await post('/verify', seven.v1)).body.invalidReason, LENGTH);
});

it('every instruction rule answers its exact reason in v2 and v1, settle refuses it, and the fee payer keeps every lamport', async () => {
  const lamports = await node.balance(feePayer.address);
  const { transactionCount } = await node.status();
  const [limit, price, transfer] = await valid();
  const feePayerAccount = await associatedTokenAddress(feePayer.address, DEVNET_USDC_MINT);
  const payeeAccount = await associatedTokenAddress(payee.address, DEVNET_USDC_MINT);
  const cases = [
    ['compute unit limit above 40,000 (the default max_compute_units)', await build(await valid({ units: 40_001 })),
      'invalid_exact_svm_payload_transaction_instructions_compute_limit_instruction_too_high',
      'invalid_exact_svm_payload_transaction_instructions_compute_limit_instruction'],
    ['compute unit price above 5 lamports', await build(await valid({ microLamports: 5_000_001 })),
      'invalid_exact_svm_payload_transaction_instructions_compute_price_instruction_too_high',
      'invalid_exact_svm_payload_transaction_instructions_compute_price_instruction_too_high'],
    ['two instructions', await build([limit, price]), LENGTH, LENGTH],
    ['eight instructions', await build([limit, price, transfer, ...['a', 'b', 'c', 'd', 'e'].map((t) => memo(t))]), LENGTH, LENGTH],
    ['an unknown program after the transfer', await build([limit, price, transfer, { program: SYSTEM, accounts: [], data: Buffer.from([9]) }]),
      'invalid_exact_svm_payload_unknown_fourth_instruction', 'invalid_exact_svm_payload_transaction_instructions'],
    ['no TransferChecked in third place', await build([limit, price, memo('pay'), transfer]),
      'invalid_exact_svm_payload_no_transfer_instruction',
      'invalid_exact_svm_payload_transaction_instruction_not_spl_token_transfer_checked'],
    ['the fee payer among a memo\'s accounts', await build([limit, price, transfer, memo('hi', [feePayer.address])]),
      FEE_PAYER_MOVES, FEE_PAYER_NAMED],
    ['the fee payer as the transfer\'s authority', await build([limit, price, transferChecked({
      source: feePayerAccount, mint: DEVNET_USDC_MINT, destination: payeeAccount, authority: feePayer.address, amount: AMOUNT,
    })], { signers: [] }), FEE_PAYER_MOVES, FEE_PAYER_MOVES],
    ['the fee payer as the transfer\'s source', await build([limit, price, transferChecked({
      source: feePayer.address, mint: DEVNET_USDC_MINT, destination: payeeAccount, authority: payer.address, amount: AMOUNT,
    })]), FEE_PAYER_MOVES, FEE_PAYER_NAMED],
    ['an address lookup table', await build(await valid(), { lookups: [{ table: (await newSolanaKeypair()).address, writable: [0], readonly: [] }] }),
      TX, TX],
    ['a forged payer signature', await build(await valid(), { forge: (s) => [s[0], Buffer.from(s[1]).fill(7, 0, 8)] }),
      'invalid_exact_svm_payload_signature_invalid', TX],
    ['a missing payer signature', await build(await valid(), { signers: [] }), 'invalid_exact_svm_payload_signature_invalid', TX],
  ];
  for (const [what, transaction, v2Reason, v1Reason] of cases) {
    const { v1, v2 } = bodies(transaction);
    const two = await post('/verify', v2);
    assert.deepEqual([two.status, two.body.isValid, two.body.invalidReason], [200, false, v2Reason], `${what} (v2): ${JSON.stringify(two.body)}`);
    const one = await post('/verify', v1);
    assert.deepEqual([one.status, one.body.isValid, one.body.invalidReason], [200, false, v1Reason], `${what} (v1): ${JSON.stringify(one.body)}`);
    const settled = await post('/settle', v2);
    assert.deepEqual([settled.body.success, settled.body.errorReason], [false, v2Reason], `${what} (settle): ${JSON.stringify(settled.body)}`);
  }
  assert.equal(await node.balance(feePayer.address), lamports, 'no refusal costs the fee payer a lamport');
  assert.equal((await node.status()).transactionCount, transactionCount, 'nothing was sent');
});
