// What a Solana payment may cost the operator (access.md 3c, svm.md §3 rule 3), against the Solana
// test node: a self-payment (payTo is the payer, or the payee's account belongs to the payer), a
// priority fee above `chains.<cluster>.max_priority_fee_lamports`, the issue's 400,000 compute
// units at 5 lamports each, a signature more than the fee payer's and the authority's, a
// Token-2022 mint with a transfer fee, and a payer or payee on `facilitator.deny_list_file` (base58
// keys beside 0x addresses) are each refused at /verify and /settle in both versions, three
// settles in a row, with nothing sent: the fee payer keeps every lamport and no token moves. An
// honest payment still settles for two signatures and its priority fee. A delegate's payments
// under way count against its allowance, not the account's balance: five sent at once on an
// allowance of one are one transaction, the other four refused unsent (else all five are sent and
// four fail on chain at the fee payer's cost). A configured mint with a transfer fee, and a
// deny-list line that is neither kind, stop the start, naming their key/line.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { writeFileSync } from 'node:fs';
import {
  startSvmNode, newSolanaKeypair, svmFacilitatorConfig, newFeePayer, testWithLogs, postTo, associatedTokenAddress,
  DEVNET_USDC_MINT, TOKEN_2022_PROGRAM,
} from './lib/svm.mjs';
import { svmBodies } from './lib/svm-payment.mjs';
import { getAddressEncoder } from '@solana/kit';
import {
  paymentInstructions, memo, compileMessage, wireTransaction, computeLimit, computePrice, transferChecked,
} from './lib/svm-tx.mjs';
import { startRouterd, freePort } from './lib/routerd.mjs';
import { makeTempDir, sleep, waitFor } from './lib/util.mjs';

const AMOUNT = 10_000;
const FEE_BASIS_POINTS = 100;
const SELF = ['invalid_exact_svm_payload_recipient_mismatch', 'invalid_exact_svm_payload_transaction_transfer_to_incorrect_ata'];
const PRICE_TOO_HIGH = 'invalid_exact_svm_payload_transaction_instructions_compute_price_instruction_too_high';

let tmp;
let node;
let routerd;
let feePayer;
let feePayerFile;
let payer;
let payee;
let reassigned;
let denied;
let deniedPayee;
let feeMint;

/**
 * A Token-2022 mint with a TransferFeeConfig of `basisPoints` in both epochs, laid out as
 * InitializeTransferFeeConfig then InitializeMint leave it (the base mint, zeros to 165 bytes, the
 * account type, the extension record), placed on the node at `mint`: the real Token-2022 program
 * charges it. The fee's authority can set it at any time (it applies two epochs later).
 */
async function placeFeeMint(mint, basisPoints) {
  const data = Buffer.alloc(166 + 4 + 108);
  data.writeBigUInt64LE(0n, 36); // supply
  data.writeUInt8(6, 44); // decimals
  data.writeUInt8(1, 45); // initialised
  data.writeUInt8(1, 165); // AccountType::Mint
  data.writeUInt16LE(1, 166); // ExtensionType::TransferFeeConfig
  data.writeUInt16LE(108, 168);
  for (const at of [170 + 72, 170 + 90]) {
    data.writeBigUInt64LE(0n, at); // epoch
    data.writeBigUInt64LE(1_000_000n, at + 8); // maximum fee
    data.writeUInt16LE(basisPoints, at + 16);
  }
  await setAccount(mint, TOKEN_2022_PROGRAM, data);
}

/** `owner`'s associated Token-2022 account of `mint` holding `amount`, with the extensions a fee mint's accounts carry. */
async function createFeeAccount(mint, owner, amount) {
  const address = await associatedTokenAddress(owner, mint, TOKEN_2022_PROGRAM);
  const data = Buffer.alloc(166 + 4 + 4 + 8);
  data.set(Buffer.from(addressBytes(mint)), 0);
  data.set(Buffer.from(addressBytes(owner)), 32);
  data.writeBigUInt64LE(BigInt(amount), 64);
  data.writeUInt8(1, 108); // AccountState::Initialized
  data.writeUInt8(2, 165); // AccountType::Account
  data.writeUInt16LE(7, 166); // ImmutableOwner, no value
  data.writeUInt16LE(0, 168);
  data.writeUInt16LE(2, 170); // TransferFeeAmount: the withheld amount
  data.writeUInt16LE(8, 172);
  await setAccount(address, TOKEN_2022_PROGRAM, data);
  return address;
}

const addressBytes = (address) => getAddressEncoder().encode(address);

async function setAccount(address, owner, data) {
  const lamports = Number(await node.rpc('getMinimumBalanceForRentExemption', [data.length]));
  await node.rpc('litesvm_setAccount', [{ address, owner, lamports, data: data.toString('base64') }]);
}

before(async () => {
  tmp = makeTempDir('routerd-svm-operator-cost-');
  node = await startSvmNode({ slotMs: 100, logFile: join(tmp.dir, 'svm-node.log') });
  ({ feePayer, feePayerFile } = await newFeePayer(node, tmp.dir));
  await node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  [payer, payee, reassigned, denied, deniedPayee] = await Promise.all([1, 2, 3, 4, 5].map(() => newSolanaKeypair()));
  for (const who of [payer, denied]) await node.mintTo(DEVNET_USDC_MINT, who.address, 1_000_000n);
  for (const who of [payee, reassigned, deniedPayee]) await node.createTokenAccount(DEVNET_USDC_MINT, who.address);
  // `reassigned`'s token account now belongs to the payer (SPL Token's SetAuthority AccountOwner).
  const account = await associatedTokenAddress(reassigned.address, DEVNET_USDC_MINT);
  const info = (await node.rpc('getAccountInfo', [account, { encoding: 'base64' }])).value;
  const data = Buffer.from(info.data[0], 'base64');
  data.set(Buffer.from(addressBytes(payer.address)), 32);
  await node.rpc('litesvm_setAccount', [{ address: account, owner: info.owner, lamports: info.lamports, data: data.toString('base64') }]);
  // No fee yet: a configured mint with a fee stops the start (the last test); this one gets its
  // fee once routerd serves, and verify reads it.
  feeMint = (await newSolanaKeypair()).address;
  await placeFeeMint(feeMint, 0);
  await createFeeAccount(feeMint, payer.address, 1_000_000);
  await createFeeAccount(feeMint, payee.address, 0);
  const denyList = join(tmp.dir, 'deny.txt');
  writeFileSync(denyList, `# KYT\n0x000000000000000000000000000000000000dEaD\n\n${denied.address}\n  ${deniedPayee.address}  \n`);
  const config = svmFacilitatorConfig({
    port: await freePort(), storePath: join(tmp.dir, 'store'), rpcUrl: node.url, feePayerFile,
    // A tokens table replaces the preset's: USDC is named again beside the fee mint.
    chain: `[chains.solana-devnet.tokens.USDC]\nmint = "${DEVNET_USDC_MINT}"\ndecimals = 6\n`
      + `[chains.solana-devnet.tokens.FEE]\nmint = "${feeMint}"\ndecimals = 6\n`,
    facilitator: `deny_list_file = "${denyList}"\n`,
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

/** The v2 and the v1 body of one wire transaction paying AMOUNT of `mint` to `payTo`. */
function bodies(transaction, { payTo = payee.address, mint = DEVNET_USDC_MINT } = {}) {
  return svmBodies(transaction, { payTo, mint, amount: AMOUNT, feePayer: feePayer.address });
}

async function build(instructions, signers = [payer]) {
  const { value: { blockhash } } = await node.rpc('getLatestBlockhash', []);
  return wireTransaction(compileMessage({ feePayer: feePayer.address, instructions, blockhash }), signers);
}

const instructions = (o = {}) => paymentInstructions({ payer: payer.address, payTo: payee.address, mint: DEVNET_USDC_MINT, amount: AMOUNT, ...o });

/** What the operator and the parties hold: the fee payer's lamports, the node's transactions, token balances. */
async function books(accounts) {
  return {
    lamports: await node.balance(feePayer.address),
    transactions: (await node.status()).transactionCount,
    tokens: await Promise.all(accounts.map((a) => node.tokenBalance(a))),
  };
}

/**
 * `/verify` in both versions answers [v2Reason, v1Reason] with `message`, and three `/settle`s in
 * each version are refused the same way; the books of `accounts` are unchanged throughout.
 */
async function refusedUnsent(what, { v1, v2 }, [v2Reason, v1Reason], message, accounts) {
  const before = await books(accounts);
  for (const [body, reason, version] of [[v2, v2Reason, 'v2'], [v1, v1Reason, 'v1']]) {
    const verified = await post('/verify', body);
    assert.deepEqual([verified.status, verified.body.isValid, verified.body.invalidReason], [200, false, reason],
      `${what} verify (${version}): ${JSON.stringify(verified.body)}`);
    assert.match(verified.body.invalidMessage, message, `${what} (${version})`);
    for (let i = 0; i < 3; i += 1) {
      const settled = await post('/settle', body);
      assert.deepEqual([settled.status, settled.body.success, settled.body.errorReason, settled.body.transaction],
        [200, false, reason, ''], `${what} settle ${i + 1} (${version}): ${JSON.stringify(settled.body)}`);
    }
  }
  await node.advanceSlots(2);
  assert.deepEqual(await books(accounts), before, `${what}: the fee payer keeps every lamport, nothing is sent, no token moves`);
}

it('a payment to its own payer is refused at verify and at every settle: nothing is sent', async () => {
  const own = await associatedTokenAddress(payer.address, DEVNET_USDC_MINT);
  const self = bodies(await build(await instructions({ payTo: payer.address })), { payTo: payer.address });
  await refusedUnsent('payTo is the payer', self, SELF, /self-payment/, [own]);
  // payTo is another key, but its token account was reassigned to the payer: read on chain.
  const toReassigned = bodies(await build(await instructions({ payTo: reassigned.address })), { payTo: reassigned.address });
  const theirs = await associatedTokenAddress(reassigned.address, DEVNET_USDC_MINT);
  await refusedUnsent('the payee account belongs to the payer', toReassigned, SELF, /self-payment/, [own, theirs]);
});

it('a priority fee above max_priority_fee_lamports, and the issue\'s 400,000 units at 5 lamports, are refused unsent', async () => {
  const accounts = [await associatedTokenAddress(payer.address, DEVNET_USDC_MINT), await associatedTokenAddress(payee.address, DEVNET_USDC_MINT)];
  // 20,000 units at 1,000,000 micro-lamports: 20,000 lamports, above the default 10,000.
  const over = bodies(await build(await instructions({ units: 20_000, microLamports: 1_000_000 })));
  await refusedUnsent('20,000 lamports of priority fee', over, [PRICE_TOO_HIGH, PRICE_TOO_HIGH], /20000 lamports.*max_priority_fee_lamports/, accounts);
  const issue = bodies(await build(await instructions({ units: 400_000, microLamports: 5_000_000 })));
  const limit = 'invalid_exact_svm_payload_transaction_instructions_compute_limit_instruction';
  await refusedUnsent('400,000 units at 5 lamports', issue, [`${limit}_too_high`, limit], /compute unit limit/, accounts);
});

it('a signature beyond the fee payer\'s and the authority\'s is refused unsent', async () => {
  const extra = await newSolanaKeypair();
  const accounts = [await associatedTokenAddress(payer.address, DEVNET_USDC_MINT)];
  const signed = bodies(await build([...await instructions(), memo('order-1', [extra.address])], [payer, extra]));
  await refusedUnsent('three signers', signed, ['invalid_exact_svm_payload_excessive_signers', 'invalid_exact_svm_payload_transaction'],
    /3 signatures/, accounts);
});

it('a Token-2022 mint given a transfer fee after the start is refused at verify: the merchant is never told success for less', async () => {
  await placeFeeMint(feeMint, FEE_BASIS_POINTS);
  const [source, destination] = await Promise.all([payer, payee].map((w) => associatedTokenAddress(w.address, feeMint, TOKEN_2022_PROGRAM)));
  const ixs = await instructions({ mint: feeMint, program: TOKEN_2022_PROGRAM });
  const transaction = await build(ixs);
  const reason = 'invalid_payment_requirements';
  await refusedUnsent('a transfer fee mint', bodies(transaction, { mint: feeMint }), [reason, reason], /transfer fee \(up to 100 basis points\)/,
    [source, destination]);
  // What routerd refused: the same transaction, signed by the fee payer and sent, credits the
  // payee the amount less 1% (Token-2022 withholds the fee in the payee's account).
  const { value: { blockhash } } = await node.rpc('getLatestBlockhash', []);
  const wire = wireTransaction(compileMessage({ feePayer: feePayer.address, instructions: ixs, blockhash }), [feePayer, payer]);
  const signature = await node.rpc('sendTransaction', [wire, { encoding: 'base64' }]);
  await node.waitForStatus(signature);
  assert.equal(await node.tokenBalance(destination), BigInt(AMOUNT - AMOUNT * FEE_BASIS_POINTS / 10_000));
});

it('a Solana payer or payee on the deny list (base58 beside 0x lines) is refused unsent', async () => {
  const source = await associatedTokenAddress(denied.address, DEVNET_USDC_MINT);
  const ixs = await paymentInstructions({ payer: denied.address, payTo: payee.address, mint: DEVNET_USDC_MINT, amount: AMOUNT });
  await refusedUnsent('a deny-listed payer', bodies(await build(ixs, [denied])), ['invalid_payload', 'invalid_payload'], /payer is on the deny list/, [source]);
  const toDenied = bodies(await build(await instructions({ payTo: deniedPayee.address })), { payTo: deniedPayee.address });
  const reason = 'invalid_payment_requirements';
  await refusedUnsent('a deny-listed payee', toDenied, [reason, reason], /payTo is on the deny list/,
    [await associatedTokenAddress(payer.address, DEVNET_USDC_MINT)]);
});

it('an honest payment still settles, for two signatures and its priority fee', async () => {
  const accounts = [await associatedTokenAddress(payer.address, DEVNET_USDC_MINT), await associatedTokenAddress(payee.address, DEVNET_USDC_MINT)];
  const before = await books(accounts);
  const { v2 } = bodies(await build(await instructions()));
  const settled = await post('/settle', v2);
  assert.equal(settled.body.success, true, JSON.stringify(settled.body));
  const after = await books(accounts);
  // 2 x 5,000 lamports of signatures, and 20,000 units at 1 micro-lamport: 1 lamport.
  assert.equal(before.lamports - after.lamports, 10_001n);
  assert.deepEqual(after.tokens, [before.tokens[0] - BigInt(AMOUNT), before.tokens[1] + BigInt(AMOUNT)]);
});

it('a delegate\'s payments under way count against its allowance: five at once on an allowance of one are one transaction, four refused unsent', async () => {
  const [owner, delegate] = await Promise.all([newSolanaKeypair(), newSolanaKeypair()]);
  await node.mintTo(DEVNET_USDC_MINT, owner.address, 1_000_000n);
  const source = await associatedTokenAddress(owner.address, DEVNET_USDC_MINT);
  const destination = await associatedTokenAddress(payee.address, DEVNET_USDC_MINT);
  // SPL Token's Approve, as the account's data records it: the delegate may move AMOUNT.
  const info = (await node.rpc('getAccountInfo', [source, { encoding: 'base64' }])).value;
  const data = Buffer.from(info.data[0], 'base64');
  data.writeUInt32LE(1, 72);
  data.set(Buffer.from(addressBytes(delegate.address)), 76);
  data.writeBigUInt64LE(BigInt(AMOUNT), 121);
  await node.rpc('litesvm_setAccount', [{ address: source, owner: info.owner, lamports: info.lamports, data: data.toString('base64') }]);
  // Five distinct payments by the delegate (each its own compute price: its own fee payer signature).
  const payments = [];
  for (let i = 1; i <= 5; i += 1) {
    const transfer = transferChecked({ source, mint: DEVNET_USDC_MINT, destination, authority: delegate.address, amount: AMOUNT });
    payments.push(bodies(await build([computeLimit(20_000), computePrice(i), transfer], [delegate])).v2);
  }
  const before = await books([source, destination]);
  // One slot holds them all: whatever routerd sends lands together when the node goes on.
  await node.pause();
  const answers = Promise.all(payments.map((body) => post('/settle', body)));
  await waitFor(async () => (await node.status()).pending >= 1, { timeoutMs: 10_000, what: 'a settlement sent' });
  await sleep(1_500);
  const sent = (await node.status()).pending;
  await node.resume();
  const settled = await answers;
  assert.equal(sent, 1, 'one transaction was sent');
  const [won, ...refused] = [...settled].sort((a, b) => Number(b.body.success) - Number(a.body.success));
  assert.equal(won.body.success, true, JSON.stringify(won.body));
  for (const r of refused) {
    assert.deepEqual([r.body.success, r.body.errorReason, r.body.transaction], [false, 'insufficient_funds', ''], JSON.stringify(r.body));
  }
  await node.advanceSlots(2);
  const after = await books([source, destination]);
  assert.equal(before.lamports - after.lamports, 10_001n, 'the fee payer paid one settlement: two signatures and 1 lamport of priority');
  assert.deepEqual(after.tokens, [before.tokens[0] - BigInt(AMOUNT), before.tokens[1] + BigInt(AMOUNT)]);
});

it('a configured Token-2022 mint with a transfer fee stops the start, naming its key', async () => {
  const dir = makeTempDir('routerd-svm-fee-mint-');
  try {
    const config = svmFacilitatorConfig({
      port: await freePort(), storePath: join(dir.dir, 'store'), rpcUrl: node.url, feePayerFile,
      chain: `[chains.solana-devnet.tokens.FEE]\nmint = "${feeMint}"\ndecimals = 6\n`,
    });
    await assert.rejects(startRouterd({ configToml: config, dir: dir.dir }),
      new RegExp(`chains\\.solana-devnet\\.tokens\\.FEE\\.mint: mint ${feeMint} is refused: it charges a transfer fee \\(up to 100 basis points\\)`));
  } finally {
    dir.cleanup();
  }
});

it('a deny-list line that is neither a 0x address nor a base58 key stops the start, naming its line', async () => {
  const dir = makeTempDir('routerd-svm-deny-bad-');
  try {
    const denyList = join(dir.dir, 'deny.txt');
    writeFileSync(denyList, `# KYT\n${denied.address}\nnot-a-key\n`);
    const config = svmFacilitatorConfig({
      port: await freePort(), storePath: join(dir.dir, 'store'), rpcUrl: node.url, feePayerFile,
      facilitator: `deny_list_file = "${denyList}"\n`,
    });
    await assert.rejects(startRouterd({ configToml: config, dir: dir.dir }),
      /facilitator\.deny_list_file: line 3 is neither a 0x address nor a base58 Solana key/);
  } finally {
    dir.cleanup();
  }
});
