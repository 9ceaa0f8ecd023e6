// The Solana test node (tests/svm-node) behaves like a Solana node for the official clients:
// @x402/svm 2.27.0's client builds `exact` payments against it, its facilitator (or this test as
// the fee payer) co-signs and sends them, and the chain moves exactly the amount; blockhashes age
// out, statuses deepen with slots, and errors are a node's JSON-RPC errors. No routerd here.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import {
  getTransactionDecoder, getTransactionEncoder, getBase58Decoder, getBase64EncodedWireTransaction, partiallySignTransaction,
} from '@solana/kit';
import { ExactSvmScheme as ExactSvmClient } from '@x402/svm/exact/client';
import { ExactSvmScheme as ExactSvmFacilitator } from '@x402/svm/exact/facilitator';
import { toFacilitatorSvmSigner } from '@x402/svm';
import {
  startSvmNode, newSolanaKeypair, associatedTokenAddress, SOLANA_DEVNET_CAIP2, DEVNET_GENESIS_HASH,
  TOKEN_PROGRAM, TOKEN_2022_PROGRAM,
} from './lib/svm.mjs';
import { makeTempDir, tailFile, waitFor } from './lib/util.mjs';

const EXPIRY = 20; // blocks a blockhash lives here (a cluster: 150)
const FINALIZED_DEPTH = 6;
let tmp;
let node;
let feePayer;
let usdc; // SPL Token mint, 6 decimals

before(async () => {
  tmp = makeTempDir('routerd-svm-node-');
  node = await startSvmNode({ slotMs: 100, blockhashExpiry: EXPIRY, finalizedDepth: FINALIZED_DEPTH, logFile: join(tmp.dir, 'svm-node.log') });
  feePayer = await newSolanaKeypair();
  await node.airdrop(feePayer.address, 5_000_000_000);
  ({ mint: usdc } = await node.createMint({ decimals: 6 }));
});

after(async () => {
  await node?.stop();
  tmp?.cleanup();
});

/** A payer holding `amount` of `mint` (and no SOL) and a payee with a token account. */
async function parties(mint, amount) {
  const payer = await newSolanaKeypair();
  const payee = await newSolanaKeypair();
  if (amount > 0n) await node.mintTo(mint, payer.address, amount);
  const { tokenAccount: payeeAccount } = await node.createTokenAccount(mint, payee.address);
  return { payer, payee, payeeAccount };
}

const requirementsFor = ({ mint, payee, amount }) => ({
  scheme: 'exact', network: SOLANA_DEVNET_CAIP2, asset: mint, amount: String(amount), payTo: payee.address,
  maxTimeoutSeconds: 60, extra: { feePayer: feePayer.address },
});

/** The official client's payment payload for `requirements`, built against the node. */
async function clientPayment(payer, requirements) {
  const client = new ExactSvmClient(payer.signer, { rpcUrl: node.url });
  const partial = await client.createPaymentPayload(2, requirements);
  return { ...partial, accepted: requirements, resource: { url: 'http://shop.test/report', description: 'r', mimeType: 'text/plain' } };
}

/** The client's transaction co-signed by the fee payer (as a facilitator does), as kit's Transaction. */
async function coSigned(payment) {
  const tx = getTransactionDecoder().decode(Buffer.from(payment.payload.transaction, 'base64'));
  return partiallySignTransaction([feePayer.signer.keyPair], tx);
}
const base58Wire = (tx) => getBase58Decoder().decode(getTransactionEncoder().encode(tx));
const signatureOf = (tx) => getBase58Decoder().decode(tx.signatures[feePayer.address]);
const statusOf = async (signature, config) => (await node.rpc('getSignatureStatuses', [[signature], config])).value[0];

async function withPaused(fn) {
  await node.pause();
  try {
    return await fn();
  } finally {
    await node.resume();
  }
}

function withLog(fn) {
  return async (t) => {
    try {
      await fn(t);
    } catch (err) {
      err.message += `\n--- svm node log (tail) ---\n${tailFile(join(tmp.dir, 'svm-node.log'), 30)}`;
      throw err;
    }
  };
}

test('@x402/svm pays through the node: its client builds the exact transaction, its facilitator verifies and settles it, the payee gets exactly the amount', withLog(async () => {
  const { payer, payee, payeeAccount } = await parties(usdc, 1_000_000n);
  const requirements = requirementsFor({ mint: usdc, payee, amount: 12_345n });
  const payment = await clientPayment(payer, requirements);
  const feesBefore = await node.balance(feePayer.address);

  const facilitator = new ExactSvmFacilitator(toFacilitatorSvmSigner(feePayer.signer, { defaultRpcUrl: node.url }));
  const verified = await facilitator.verify(payment, requirements);
  assert.deepEqual({ isValid: verified.isValid, invalidReason: verified.invalidReason, payer: verified.payer },
    { isValid: true, invalidReason: undefined, payer: payer.address });
  const settled = await facilitator.settle(payment, requirements);
  assert.equal(settled.success, true, JSON.stringify(settled));
  assert.match(settled.transaction, /^[1-9A-HJ-NP-Za-km-z]{64,88}$/);

  assert.equal(await node.tokenBalance(payeeAccount), 12_345n);
  assert.equal(await node.tokenBalance(await associatedTokenAddress(payer.address, usdc)), 1_000_000n - 12_345n);
  assert.equal(await node.balance(payer.address), 0n, 'the payer spends no SOL');
  const fee = feesBefore - (await node.balance(feePayer.address));
  assert.ok(fee > 0n && fee < 100_000n, `the fee payer paid the fee only (${fee} lamports)`);
  const status = await statusOf(settled.transaction);
  assert.equal(status.err, null);
  assert.ok(['confirmed', 'finalized'].includes(status.confirmationStatus), JSON.stringify(status));
}));

test('a co-signed payment sent in base58 is not executed before the next slot; its status goes processed -> confirmed -> finalized with depth', withLog(async () => {
  const { payer, payee, payeeAccount } = await parties(usdc, 50_000n);
  const payment = await clientPayment(payer, requirementsFor({ mint: usdc, payee, amount: 50_000n }));
  const tx = await coSigned(payment);
  await withPaused(async () => {
    const signature = await node.rpc('sendTransaction', [base58Wire(tx)]); // default encoding base58, with preflight
    assert.equal(signature, signatureOf(tx));
    assert.equal(await statusOf(signature), null, 'sent but not yet in a block');
    assert.equal(await node.tokenBalance(payeeAccount), 0n);

    const { slot } = await node.advanceSlots(1);
    assert.deepEqual(await statusOf(signature),
      { slot, confirmations: 0, err: null, status: { Ok: null }, confirmationStatus: 'processed' });
    assert.equal(await node.tokenBalance(payeeAccount), 50_000n);

    await node.advanceSlots(1);
    assert.deepEqual(await statusOf(signature),
      { slot, confirmations: 1, err: null, status: { Ok: null }, confirmationStatus: 'confirmed' });
    await node.advanceSlots(FINALIZED_DEPTH - 1);
    assert.deepEqual(await statusOf(signature),
      { slot, confirmations: null, err: null, status: { Ok: null }, confirmationStatus: 'finalized' });

    // The same transaction again: refused by preflight, sent once; skipping preflight answers its signature, executed once.
    await assert.rejects(node.rpc('sendTransaction', [getBase64EncodedWireTransaction(tx), { encoding: 'base64' }]),
      (err) => err.code === -32002 && err.data.err === 'AlreadyProcessed');
    assert.equal(await node.rpc('sendTransaction', [getBase64EncodedWireTransaction(tx), { encoding: 'base64', skipPreflight: true }]), signature);
    await node.advanceSlots(1);
    assert.equal(await node.tokenBalance(payeeAccount), 50_000n);
  });
}));

test('simulateTransaction of a transfer beyond the balance reports the token program error; sendTransaction refuses it with -32002 and the simulation in data', withLog(async () => {
  const { payer, payee, payeeAccount } = await parties(usdc, 1_000n);
  const requirements = requirementsFor({ mint: usdc, payee, amount: 1_001n });
  const payment = await clientPayment(payer, requirements);
  const tx = payment.payload.transaction;

  const { value: sim } = await node.rpc('simulateTransaction', [tx, { encoding: 'base64', sigVerify: false, replaceRecentBlockhash: false, commitment: 'confirmed' }]);
  assert.deepEqual(sim.err, { InstructionError: [2, { Custom: 1 }] }, JSON.stringify(sim)); // TokenError::InsufficientFunds
  assert.ok(sim.logs.some((l) => /insufficient funds/i.test(l)), sim.logs.join('\n'));
  assert.ok(sim.unitsConsumed > 0);

  // The same bytes with 1,000 (what the payer holds) simulate clean: the error is the amount's.
  const ok = await clientPayment(payer, requirementsFor({ mint: usdc, payee, amount: 1_000n }));
  const { value: okSim } = await node.rpc('simulateTransaction', [ok.payload.transaction, { encoding: 'base64', sigVerify: false }]);
  assert.equal(okSim.err, null, JSON.stringify(okSim));

  // The accounts option, as agave answers it: each account as the simulation left it (the source
  // spent, the payee paid), null for each when it failed; base58 and more addresses than the
  // transaction loads are refused.
  const payerAccount = await associatedTokenAddress(payer.address, usdc);
  const accounts = (addresses, encoding = 'base64') => ({ encoding: 'base64', sigVerify: false, accounts: { encoding, addresses } });
  const { value: after } = await node.rpc('simulateTransaction', [ok.payload.transaction, accounts([payerAccount, payeeAccount])]);
  const amountOf = (a) => Buffer.from(a.data[0], 'base64').readBigUInt64LE(64);
  assert.deepEqual(after.accounts.map(amountOf), [0n, 1_000n], JSON.stringify(after.accounts));
  assert.equal(await node.tokenBalance(payeeAccount), 0n, 'a simulation moves nothing');
  const { value: failed } = await node.rpc('simulateTransaction', [tx, accounts([payerAccount, payeeAccount])]);
  assert.deepEqual(failed.accounts, [null, null], JSON.stringify(failed));
  await assert.rejects(node.rpc('simulateTransaction', [tx, accounts([payerAccount], 'base58')]), (err) => err.code === -32602);
  await assert.rejects(node.rpc('simulateTransaction', [tx, accounts(Array(40).fill(payerAccount))]),
    (err) => err.code === -32602 && /Too many accounts provided/.test(err.message));

  // sigVerify with the fee payer's signature still missing; sigVerify with replaceRecentBlockhash.
  await assert.rejects(node.rpc('simulateTransaction', [tx, { encoding: 'base64', sigVerify: true }]), (err) => err.code === -32003);
  await assert.rejects(node.rpc('simulateTransaction', [tx, { encoding: 'base64', sigVerify: true, replaceRecentBlockhash: true }]),
    (err) => err.code === -32602);

  const signed = await coSigned(payment);
  await assert.rejects(node.rpc('sendTransaction', [getBase64EncodedWireTransaction(signed), { encoding: 'base64' }]), (err) => {
    assert.equal(err.code, -32002);
    assert.match(err.message, /Transaction simulation failed: Error processing Instruction 2: custom program error: 0x1/);
    assert.deepEqual(err.data.err, { InstructionError: [2, { Custom: 1 }] });
    assert.ok(err.data.logs.length > 0);
    return true;
  });
  // The official facilitator's verify reads the same answer.
  const facilitator = new ExactSvmFacilitator(toFacilitatorSvmSigner(feePayer.signer, { defaultRpcUrl: node.url }));
  const verified = await facilitator.verify(payment, requirements);
  assert.equal(verified.isValid, false);
  assert.match(verified.invalidReason, /simulation_failed/);
  assert.equal(await node.tokenBalance(payeeAccount), 0n);
}));

test('a batch of reads answers every call, in order, with per-call errors; bad params are -32602', withLog(async () => {
  const payee = await newSolanaKeypair();
  const answers = await node.batch([
    ['getGenesisHash'], ['getSlot'], ['getBalance', [feePayer.address]], ['getAccountInfo', [usdc, { encoding: 'base64' }]],
    ['noSuchMethod'], ['getLatestBlockhash'], ['getAccountInfo', ['not-an-address']], ['getAccountInfo', [payee.address]],
    ['getMinimumBalanceForRentExemption', [165]], ['getBlockHeight'],
  ]);
  assert.deepEqual(answers.map((a) => a.id), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
  assert.equal(answers[0].result, DEVNET_GENESIS_HASH);
  assert.ok(Number.isInteger(answers[1].result) && answers[1].result > 0);
  assert.ok(answers[2].result.value > 0 && answers[2].result.context.slot >= answers[1].result);
  const mintAccount = answers[3].result.value;
  assert.equal(mintAccount.owner, TOKEN_PROGRAM);
  assert.equal(Buffer.from(mintAccount.data[0], 'base64').length, 82);
  assert.equal(Buffer.from(mintAccount.data[0], 'base64')[44], 6, 'decimals');
  assert.equal(answers[4].error.code, -32601);
  assert.equal(answers[5].result.value.lastValidBlockHeight - answers[9].result, EXPIRY);
  assert.equal(answers[6].error.code, -32602);
  assert.equal(answers[7].result.value, null, 'an account that does not exist');
  assert.equal(answers[8].result, 2_039_280);

  const single = await fetch(node.url, { method: 'POST', body: '[]' }).then((r) => r.json());
  assert.equal(single.error.code, -32600);
  const garbage = await fetch(node.url, { method: 'POST', body: '{"jsonrpc":' }).then((r) => r.json());
  assert.equal(garbage.error.code, -32700);
  await assert.rejects(node.rpc('getSignatureStatuses', [['x']]), (err) => err.code === -32602);
  await assert.rejects(node.rpc('sendTransaction', ['AAAA', { encoding: 'base64' }]), (err) => err.code === -32602);
}));

test('jsonParsed token accounts and getTokenAccountBalance read what the chain holds', withLog(async () => {
  const { payer } = await parties(usdc, 2_500_000n);
  const account = await associatedTokenAddress(payer.address, usdc);
  const { value } = await node.rpc('getAccountInfo', [account, { encoding: 'jsonParsed' }]);
  assert.equal(value.data.program, 'spl-token');
  assert.deepEqual(value.data.parsed.info.tokenAmount, { amount: '2500000', decimals: 6, uiAmount: 2.5, uiAmountString: '2.5' });
  assert.equal(value.data.parsed.info.owner, payer.address);
  assert.equal(value.data.parsed.info.mint, usdc);
  const { value: mint } = await node.rpc('getAccountInfo', [usdc, { encoding: 'jsonParsed' }]);
  assert.equal(mint.data.parsed.type, 'mint');
  assert.equal(mint.data.parsed.info.decimals, 6);
  assert.equal((await node.rpc('getTokenAccountBalance', [account])).value.amount, '2500000');
}));

test('a blockhash older than the expiry is refused by sendTransaction and the transaction never lands; a never-landed signature is null', withLog(async () => {
  const { payer, payee, payeeAccount } = await parties(usdc, 10_000n);
  const payment = await clientPayment(payer, requirementsFor({ mint: usdc, payee, amount: 10_000n }));
  const tx = await coSigned(payment);
  const wire = getBase64EncodedWireTransaction(tx);
  await withPaused(async () => {
    const { value: [fresh] } = await node.rpc('getSignatureStatuses', [[signatureOf(tx)]]);
    assert.equal(fresh, null);
    await node.advanceSlots(EXPIRY + 1);
    await assert.rejects(node.rpc('sendTransaction', [wire, { encoding: 'base64' }]),
      (err) => err.code === -32002 && err.data.err === 'BlockhashNotFound');
    const { value: sim } = await node.rpc('simulateTransaction', [wire, { encoding: 'base64' }]);
    assert.equal(sim.err, 'BlockhashNotFound');
    const { value: replaced } = await node.rpc('simulateTransaction', [wire, { encoding: 'base64', replaceRecentBlockhash: true }]);
    assert.equal(replaced.err, null, 'with the blockhash replaced it would pay');
    assert.ok(replaced.replacementBlockhash.lastValidBlockHeight > 0);

    // Without preflight the node answers the signature, but no block takes it.
    assert.equal(await node.rpc('sendTransaction', [wire, { encoding: 'base64', skipPreflight: true }]), signatureOf(tx));
    await node.advanceSlots(3);
    assert.equal(await statusOf(signatureOf(tx)), null);
    assert.equal(await statusOf(signatureOf(tx), { searchTransactionHistory: true }), null);
    assert.equal(await node.tokenBalance(payeeAccount), 0n);
  });
}));

test('a blockhash is valid up to its lastValidBlockHeight: a payment built just before expiry lands at that height', withLog(async () => {
  const { payer, payee, payeeAccount } = await parties(usdc, 7n);
  await withPaused(async () => {
    const payment = await clientPayment(payer, requirementsFor({ mint: usdc, payee, amount: 7n }));
    const tx = await coSigned(payment);
    const { blockHeight } = await node.status();
    const { value: valid } = await node.rpc('isBlockhashValid', [(await node.rpc('getLatestBlockhash')).value.blockhash]);
    assert.equal(valid, true);
    // Sent with EXPIRY - 1 blocks gone: it lands in the next block, the last one its blockhash allows.
    await node.advanceSlots(EXPIRY - 1);
    const signature = await node.rpc('sendTransaction', [getBase64EncodedWireTransaction(tx), { encoding: 'base64' }]);
    const { blockHeight: landed } = await node.advanceSlots(1);
    assert.equal(landed, blockHeight + EXPIRY);
    assert.equal((await statusOf(signature)).err, null);
    assert.equal(await node.tokenBalance(payeeAccount), 7n);
  });
}));

test('a node that forgets: dropped pending transactions never land, and the same bytes sent again do', withLog(async () => {
  const { payer, payee, payeeAccount } = await parties(usdc, 300n);
  const tx = await coSigned(await clientPayment(payer, requirementsFor({ mint: usdc, payee, amount: 300n })));
  const wire = getBase64EncodedWireTransaction(tx);
  await withPaused(async () => {
    const signature = await node.rpc('sendTransaction', [wire, { encoding: 'base64' }]);
    assert.equal(await node.dropPending(), 1);
    await node.advanceSlots(2);
    assert.equal(await statusOf(signature), null);
    assert.equal(await node.tokenBalance(payeeAccount), 0n);
    assert.equal(await node.rpc('sendTransaction', [wire, { encoding: 'base64' }]), signature);
    await node.advanceSlots(1);
    assert.equal((await statusOf(signature)).confirmationStatus, 'processed');
    assert.equal(await node.tokenBalance(payeeAccount), 300n);
  });
}));

test('a Token-2022 mint: the client builds a Token-2022 transfer and it settles', withLog(async () => {
  const { mint } = await node.createMint({ decimals: 2, tokenProgram: 'token-2022' });
  const { payer, payee, payeeAccount } = await parties(mint, 1_000n);
  const { value: payeeInfo } = await node.rpc('getAccountInfo', [payeeAccount, { encoding: 'base64' }]);
  assert.equal(payeeInfo.owner, TOKEN_2022_PROGRAM);
  assert.equal(payeeAccount, await associatedTokenAddress(payee.address, mint, TOKEN_2022_PROGRAM));

  const requirements = requirementsFor({ mint, payee, amount: 250n });
  const payment = await clientPayment(payer, requirements);
  const facilitator = new ExactSvmFacilitator(toFacilitatorSvmSigner(feePayer.signer, { defaultRpcUrl: node.url }));
  const settled = await facilitator.settle(payment, requirements);
  assert.equal(settled.success, true, JSON.stringify(settled));
  assert.equal(await node.tokenBalance(payeeAccount), 250n);
  assert.equal(await node.tokenBalance(await associatedTokenAddress(payer.address, mint, TOKEN_2022_PROGRAM)), 750n);
  assert.equal((await node.rpc('getAccountInfo', [payeeAccount, { encoding: 'jsonParsed' }])).value.data.program, 'spl-token-2022');
}));

test('slots advance on the timer, and the interval is a control', withLog(async () => {
  const a = await node.rpc('getSlot');
  await waitFor(async () => (await node.rpc('getSlot')) >= a + 3, { timeoutMs: 10_000, what: 'three slots on the timer' });
  await node.pause();
  const p = await node.rpc('getSlot');
  await new Promise((r) => setTimeout(r, 250));
  assert.equal(await node.rpc('getSlot'), p, 'paused: no slot');
  await node.setSlotInterval(50);
  await node.resume();
  const { slotMs } = await node.status();
  assert.equal(slotMs, 50);
  await node.setSlotInterval(100);
}));

test('getTransaction records a landed payment by its token balances; the faults lag confirmed reads and fake statuses', withLog(async () => {
  const { payer, payee, payeeAccount } = await parties(usdc, 70_000n);
  const tx = await coSigned(await clientPayment(payer, requirementsFor({ mint: usdc, payee, amount: 30_000n })));
  const source = await associatedTokenAddress(payer.address, usdc);
  const config = { commitment: 'confirmed', maxSupportedTransactionVersion: 0 };
  await withPaused(async () => {
    const signature = await node.rpc('sendTransaction', [getBase64EncodedWireTransaction(tx), { encoding: 'base64' }]);
    await node.rpc('litesvm_setFaults', [{ lagConfirmed: true }]);
    try {
      await node.advanceSlots(1);
      assert.equal(await node.rpc('getTransaction', [signature, config]), null, 'processed only: no record at confirmed');
      const amount = async (commitment) => (await node.rpc('getTokenAccountBalance', [payeeAccount, { commitment }])).value.amount;
      assert.deepEqual([await amount('processed'), await amount('confirmed')], ['30000', '0'], 'confirmed trails processed by a slot');
      await node.advanceSlots(1);
      assert.equal(await amount('confirmed'), '30000');
    } finally {
      await node.rpc('litesvm_setFaults', [{ lagConfirmed: false }]);
    }
    await assert.rejects(node.rpc('getTransaction', [signature, { commitment: 'confirmed' }]), (err) => err.code === -32015);
    const record = await node.rpc('getTransaction', [signature, config]);
    assert.equal(record.meta.err, null);
    const keys = record.transaction.message.accountKeys;
    const balance = (list, account) => list.find((b) => keys[b.accountIndex] === account)?.uiTokenAmount.amount;
    assert.deepEqual([balance(record.meta.preTokenBalances, source), balance(record.meta.postTokenBalances, source)], ['70000', '40000']);
    assert.deepEqual([balance(record.meta.preTokenBalances, payeeAccount), balance(record.meta.postTokenBalances, payeeAccount)], ['0', '30000']);
    assert.equal(record.meta.fee, Number(record.meta.preBalances[0] - record.meta.postBalances[0]));
  });
  // A lying node: any unknown signature is confirmed, and what is sent never lands.
  await node.rpc('litesvm_setFaults', [{ fakeConfirmed: true }]);
  try {
    const never = '1'.repeat(64);
    assert.equal((await statusOf(never)).confirmationStatus, 'confirmed');
    assert.equal(await node.rpc('getTransaction', [never, config]), null);
  } finally {
    await node.rpc('litesvm_setFaults', [{ fakeConfirmed: false }]);
  }
  assert.equal(await statusOf('1'.repeat(64)), null);
}));
