// Hand-built Solana payment transactions, byte by byte, for the refusal tests: any instruction
// list, any account order, address lookup tables, and forged or missing signatures, which the
// official clients never produce. Versioned (v0) messages as the cluster reads them.
import { createPrivateKey, sign } from 'node:crypto';
import { getAddressEncoder } from '@solana/kit';
import { associatedTokenAddress, TOKEN_PROGRAM } from '../../svm-node/chain.mjs';

export const COMPUTE_BUDGET = 'ComputeBudget111111111111111111111111111111';
export const MEMO = 'MemoSq4gqABAXKb96qnH8TysNcWxMyWCqXgDLGmfcHr';
export const SYSTEM = '11111111111111111111111111111111';

const addressBytes = (a) => getAddressEncoder().encode(a);

function compactU16(n) {
  const out = [];
  for (;;) {
    const byte = n & 0x7f;
    n >>= 7;
    if (n === 0) return [...out, byte];
    out.push(byte | 0x80);
  }
}

const u32 = (n) => { const b = Buffer.alloc(4); b.writeUInt32LE(n); return b; };
const u64 = (n) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(n)); return b; };

export const computeLimit = (units) => ({ program: COMPUTE_BUDGET, accounts: [], data: Buffer.concat([Buffer.from([2]), u32(units)]) });
export const computePrice = (microLamports) => ({ program: COMPUTE_BUDGET, accounts: [], data: Buffer.concat([Buffer.from([3]), u64(microLamports)]) });
export const memo = (text, signers = []) => ({
  program: MEMO, accounts: signers.map((address) => ({ address, signer: true, writable: false })), data: Buffer.from(text),
});
/** TransferChecked of `program` (SPL Token by default). */
export const transferChecked = ({ source, mint, destination, authority, amount, decimals = 6, program = TOKEN_PROGRAM }) => ({
  program,
  accounts: [
    { address: source, writable: true }, { address: mint }, { address: destination, writable: true },
    { address: authority, signer: true },
  ],
  data: Buffer.concat([Buffer.from([12]), u64(amount), Buffer.from([decimals])]),
});

/** The three instructions of a valid payment: limit, price, the transfer of `amount` to `payTo`'s token account. */
export async function paymentInstructions({ payer, payTo, mint, amount, units = 20_000, microLamports = 1, program = TOKEN_PROGRAM }) {
  return [
    computeLimit(units),
    computePrice(microLamports),
    transferChecked({
      source: await associatedTokenAddress(payer, mint, program), mint,
      destination: await associatedTokenAddress(payTo, mint, program), authority: payer, amount, program,
    }),
  ];
}

/**
 * Compiles a v0 message: the fee payer first, then writable signers, read-only signers, writable
 * and read-only others (programs last among those). `lookups`: [{table, writable: [i], readonly: [i]}].
 */
export function compileMessage({ feePayer, instructions, blockhash, lookups = [] }) {
  const metas = new Map([[feePayer, { signer: true, writable: true }]]);
  const note = (address, { signer = false, writable = false }) => {
    const m = metas.get(address) ?? { signer: false, writable: false };
    metas.set(address, { signer: m.signer || signer, writable: m.writable || writable });
  };
  for (const ix of instructions) {
    for (const a of ix.accounts) note(a.address, a);
    note(ix.program, {});
  }
  const rank = ({ signer, writable }) => (signer ? 0 : 2) + (writable ? 0 : 1);
  const [first, ...rest] = [...metas.entries()];
  const keys = [first, ...rest.sort((a, b) => rank(a[1]) - rank(b[1]))];
  const index = new Map(keys.map(([address], i) => [address, i]));
  const header = [
    keys.filter(([, m]) => m.signer).length,
    keys.filter(([, m]) => m.signer && !m.writable).length,
    keys.filter(([, m]) => !m.signer && !m.writable).length,
  ];
  const bytes = [0x80, ...header, ...compactU16(keys.length)];
  for (const [address] of keys) bytes.push(...addressBytes(address));
  bytes.push(...addressBytes(blockhash), ...compactU16(instructions.length));
  for (const ix of instructions) {
    bytes.push(index.get(ix.program), ...compactU16(ix.accounts.length), ...ix.accounts.map((a) => index.get(a.address)));
    bytes.push(...compactU16(ix.data.length), ...ix.data);
  }
  bytes.push(...compactU16(lookups.length));
  for (const l of lookups) {
    bytes.push(...addressBytes(l.table), ...compactU16(l.writable.length), ...l.writable, ...compactU16(l.readonly.length), ...l.readonly);
  }
  return { message: Buffer.from(bytes), signers: keys.filter(([, m]) => m.signer).map(([address]) => address) };
}

/** An ed25519 signature by a keypair of lib/svm.mjs (secretKey: seed then public key). */
export function signWith(keypair, message) {
  const der = Buffer.concat([Buffer.from('302e020100300506032b657004220420', 'hex'), Buffer.from(keypair.secretKey.subarray(0, 32))]);
  return sign(null, message, createPrivateKey({ key: der, format: 'der', type: 'pkcs8' }));
}

/**
 * The base64 wire transaction: each signer in `keypairs` (by address) signs, the fee payer's slot
 * and any other signer's stay zero; `forge(signatures)` may alter them before encoding.
 */
export function wireTransaction({ message, signers }, keypairs, forge = (s) => s) {
  const byAddress = new Map(keypairs.map((k) => [k.address, k]));
  const signatures = forge(signers.map((address) => (byAddress.has(address) ? signWith(byAddress.get(address), message) : Buffer.alloc(64))));
  return Buffer.concat([Buffer.from(compactU16(signatures.length)), ...signatures, message]).toString('base64');
}
