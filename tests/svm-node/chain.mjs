// A Solana test chain: one in-process LiteSVM (the real SVM runtime, with SPL Token, Token-2022,
// Associated Token Account and Memo) plus what LiteSVM lacks to look like a cluster to a client:
// slots produced on a timer, a blockhash per block that ages out after `blockhashExpiry` blocks,
// transactions executed in the slot after they were sent, and statuses that deepen from processed
// to confirmed to finalized. No HTTP here: server.mjs puts JSON-RPC in front of it.
import { createRequire } from 'node:module';
import { createPublicKey, verify as verifySignature, randomBytes } from 'node:crypto';
import {
  getAddressEncoder, getAddressDecoder, getBase58Encoder, getBase58Decoder, getTransactionDecoder,
  getCompiledTransactionMessageDecoder, getProgramDerivedAddress,
} from '@solana/kit';

const require = createRequire(import.meta.url);
// litesvm's byte-level API (its kit-typed wrapper pins another major of @solana/kit than
// @x402/svm; the wire bytes need no kit types at all).
const { LiteSvm, Account, TransactionMetadata, FailedTransactionMetadata } = require('litesvm/dist/internal.js');

export const TOKEN_PROGRAM = 'TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA';
export const TOKEN_2022_PROGRAM = 'TokenzQdBNbLqP5VEhdkAS6EPFLC1PHnBqCXEpPxuEb';
export const ATA_PROGRAM = 'ATokenGPvbdGVxr1b2hvZbsiqW5xWH25efTNsLJA8knL';
export const MEMO_PROGRAM = 'MemoSq4gqABAXKb96qnH8TysNcWxMyWCqXgDLGmfcHr';
export const SYSTEM_PROGRAM = '11111111111111111111111111111111';
// Solana devnet's genesis hash: the default, so that the official clients (which know only
// mainnet, devnet and testnet) and routerd's `solana-devnet` preset take this chain for devnet,
// as the EVM tests' anvil answers chain id 84532 for base-sepolia. CAIP-2: solana:<first 32 chars>.
export const DEVNET_GENESIS_HASH = 'EtWTRABZaYq6iMfeYKouRu166VU2xqa1wcaWoxPkrZBG';
export const DEVNET_USDC_MINT = '4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU';
export const U64_MAX = 18446744073709551615n;

// Names of litesvm's numeric error enums (litesvm dist/internal.d.ts, in declaration order): the
// node answers errors the way a real one writes them in JSON ("BlockhashNotFound", {"InstructionError": [2, {"Custom": 1}]}).
const TX_ERRORS = ['AccountInUse', 'AccountLoadedTwice', 'AccountNotFound', 'ProgramAccountNotFound', 'InsufficientFundsForFee',
  'InvalidAccountForFee', 'AlreadyProcessed', 'BlockhashNotFound', 'CallChainTooDeep', 'MissingSignatureForFee',
  'InvalidAccountIndex', 'SignatureFailure', 'InvalidProgramForExecution', 'SanitizeFailure', 'ClusterMaintenance',
  'AccountBorrowOutstanding', 'WouldExceedMaxBlockCostLimit', 'UnsupportedVersion', 'InvalidWritableAccount',
  'WouldExceedMaxAccountCostLimit', 'WouldExceedAccountDataBlockLimit', 'TooManyAccountLocks', 'AddressLookupTableNotFound',
  'InvalidAddressLookupTableOwner', 'InvalidAddressLookupTableData', 'InvalidAddressLookupTableIndex', 'InvalidRentPayingAccount',
  'WouldExceedMaxVoteCostLimit', 'WouldExceedAccountDataTotalLimit', 'MaxLoadedAccountsDataSizeExceeded', 'ResanitizationNeeded',
  'InvalidLoadedAccountsDataSizeLimit', 'UnbalancedTransaction', 'ProgramCacheHitMaxLimit', 'CommitCancelled'];
const IX_ERRORS = ['GenericError', 'InvalidArgument', 'InvalidInstructionData', 'InvalidAccountData', 'AccountDataTooSmall',
  'InsufficientFunds', 'IncorrectProgramId', 'MissingRequiredSignature', 'AccountAlreadyInitialized', 'UninitializedAccount',
  'UnbalancedInstruction', 'ModifiedProgramId', 'ExternalAccountLamportSpend', 'ExternalAccountDataModified', 'ReadonlyLamportChange',
  'ReadonlyDataModified', 'DuplicateAccountIndex', 'ExecutableModified', 'RentEpochModified', 'NotEnoughAccountKeys',
  'AccountDataSizeChanged', 'AccountNotExecutable', 'AccountBorrowFailed', 'AccountBorrowOutstanding', 'DuplicateAccountOutOfSync',
  'InvalidError', 'ExecutableDataModified', 'ExecutableLamportChange', 'ExecutableAccountNotRentExempt', 'UnsupportedProgramId',
  'CallDepth', 'MissingAccount', 'ReentrancyNotAllowed', 'MaxSeedLengthExceeded', 'InvalidSeeds', 'InvalidRealloc',
  'ComputationalBudgetExceeded', 'PrivilegeEscalation', 'ProgramEnvironmentSetupFailure', 'ProgramFailedToComplete',
  'ProgramFailedToCompile', 'Immutable', 'IncorrectAuthority', 'AccountNotRentExempt', 'InvalidAccountOwner', 'ArithmeticOverflow',
  'UnsupportedSysvar', 'IllegalOwner', 'MaxAccountsDataAllocationsExceeded', 'MaxAccountsExceeded',
  'MaxInstructionTraceLengthExceeded', 'BuiltinProgramsMustConsumeComputeUnits', 'BorshIoError'];

const addressEncoder = getAddressEncoder();
const addressDecoder = getAddressDecoder();
const base58Encoder = getBase58Encoder(); // string -> bytes
const base58Decoder = getBase58Decoder(); // bytes -> string
const txDecoder = getTransactionDecoder();
const messageDecoder = getCompiledTransactionMessageDecoder();

/** An error the JSON-RPC layer answers as {code, message, data}. */
export class RpcError extends Error {
  constructor(code, message, data) {
    super(message);
    this.code = code;
    this.data = data;
  }
}
export const invalidParams = (message) => new RpcError(-32602, message);

/** Address string -> 32 bytes; an invalid one is -32602 as a real node answers. */
export function addressBytes(address) {
  if (typeof address !== 'string') throw invalidParams('Invalid param: expected a base58 address string');
  let bytes;
  try {
    bytes = base58Encoder.encode(address);
  } catch {
    throw invalidParams('Invalid param: Invalid');
  }
  if (bytes.length !== 32) throw invalidParams('Invalid param: WrongSize');
  return new Uint8Array(bytes);
}
export const addressOf = (bytes) => addressDecoder.decode(bytes);

/** The associated token account of (owner, mint, token program). */
export async function associatedTokenAddress(owner, mint, tokenProgram = TOKEN_PROGRAM) {
  const [ata] = await getProgramDerivedAddress({
    programAddress: ATA_PROGRAM,
    seeds: [addressEncoder.encode(owner), addressEncoder.encode(tokenProgram), addressEncoder.encode(mint)],
  });
  return ata;
}

/** The JSON form of a litesvm transaction error, as a real node writes it. */
export function txErrorJson(err) {
  if (typeof err === 'number') return TX_ERRORS[err] ?? `TransactionError${err}`;
  const name = err?.constructor?.name ?? '';
  if (name.includes('InstructionError')) {
    const inner = err.err();
    let ix;
    if (typeof inner === 'number') ix = IX_ERRORS[inner] ?? `InstructionError${inner}`;
    else if ('code' in inner) ix = { Custom: inner.code };
    else ix = { BorshIoError: inner.msg };
    return { InstructionError: [err.index, ix] };
  }
  if (name.includes('DuplicateInstruction')) return { DuplicateInstruction: err.index };
  if (name.includes('InsufficientFundsForRent')) return { InsufficientFundsForRent: { account_index: err.accountIndex } };
  if (name.includes('ProgramExecutionTemporarilyRestricted')) {
    return { ProgramExecutionTemporarilyRestricted: { account_index: err.accountIndex } };
  }
  return String(err);
}

/** A short text for an error, like the node's "Transaction simulation failed: ..." message. */
export function txErrorText(json) {
  if (typeof json === 'string') return json.replace(/([a-z])([A-Z])/g, '$1 $2').replace(/^(.)(.*)$/, (_, a, b) => a + b.toLowerCase());
  if (json.InstructionError) {
    const [i, e] = json.InstructionError;
    const what = typeof e === 'string' ? txErrorText(e).toLowerCase() : e.Custom !== undefined ? `custom program error: 0x${e.Custom.toString(16)}` : JSON.stringify(e);
    return `Error processing Instruction ${i}: ${what}`;
  }
  return JSON.stringify(json);
}

// Errors with which a transaction is still recorded on chain (fee charged, status with `err`).
// Every other error means it never lands: a real leader drops it and its status stays null.
const LANDS_WITH_ERROR = (json) => typeof json === 'object' && (json.InstructionError || json.InsufficientFundsForRent
  || json.ProgramExecutionTemporarilyRestricted);

function signaturesValid(tx, messageBytes) {
  for (const [address, signature] of Object.entries(tx.signatures)) {
    if (!signature) return false;
    const key = createPublicKey({
      key: Buffer.concat([Buffer.from('302a300506032b6570032100', 'hex'), Buffer.from(addressBytes(address))]), format: 'der', type: 'spki',
    });
    if (!verifySignature(null, messageBytes, key, signature)) return false;
  }
  return true;
}

/**
 * Decode a wire transaction: {bytes, tx ({messageBytes, signatures}), message (compiled),
 * signature (base58 of the first, the fee payer's), blockhash}. A malformed one is -32602.
 */
export function decodeWireTransaction(text, encoding = 'base58') {
  if (typeof text !== 'string') throw invalidParams('invalid transaction: expected an encoded transaction string');
  let bytes;
  if (encoding === 'base64') bytes = Buffer.from(text, 'base64');
  else if (encoding === 'base58') {
    try {
      bytes = base58Encoder.encode(text);
    } catch {
      throw invalidParams('invalid base58 encoding');
    }
  } else throw invalidParams(`unsupported encoding: ${encoding}. Supported encodings: base58, base64`);
  bytes = new Uint8Array(bytes);
  try {
    const tx = txDecoder.decode(bytes);
    const message = messageDecoder.decode(tx.messageBytes);
    const first = Object.values(tx.signatures)[0];
    return {
      bytes, tx, message, blockhash: message.lifetimeToken,
      signature: base58Decoder.decode(first ?? new Uint8Array(64)),
      versioned: (tx.messageBytes[0] & 0x80) !== 0,
    };
  } catch (err) {
    throw invalidParams(`failed to deserialize solana_transaction::versioned::VersionedTransaction: ${err.message}`);
  }
}

// SPL Token account layouts (the same base layout in Token-2022, without extensions).
function mintData({ mintAuthority, supply = 0n, decimals, freezeAuthority }) {
  const b = Buffer.alloc(82);
  if (mintAuthority) {
    b.writeUInt32LE(1, 0);
    Buffer.from(addressBytes(mintAuthority)).copy(b, 4);
  }
  b.writeBigUInt64LE(supply, 36);
  b.writeUInt8(decimals, 44);
  b.writeUInt8(1, 45); // initialised
  if (freezeAuthority) {
    b.writeUInt32LE(1, 46);
    Buffer.from(addressBytes(freezeAuthority)).copy(b, 50);
  }
  return b;
}
function tokenAccountData({ mint, owner, amount }) {
  const b = Buffer.alloc(165);
  Buffer.from(addressBytes(mint)).copy(b, 0);
  Buffer.from(addressBytes(owner)).copy(b, 32);
  b.writeBigUInt64LE(amount, 64);
  b.writeUInt8(1, 108); // AccountState::Initialized
  return b;
}
const optionKey = (b, at) => (b.readUInt32LE(at) === 1 ? addressOf(b.subarray(at + 4, at + 36)) : null);

/** A token program account decoded as jsonParsed answers it, or null when it is not one. */
export function parseTokenAccount(owner, data) {
  const program = owner === TOKEN_PROGRAM ? 'spl-token' : owner === TOKEN_2022_PROGRAM ? 'spl-token-2022' : null;
  if (!program) return null;
  const b = Buffer.from(data);
  if (b.length === 82 || (owner === TOKEN_2022_PROGRAM && b.length > 165 && b[165] === 1)) {
    return {
      program, space: b.length,
      parsed: {
        type: 'mint',
        info: {
          decimals: b.readUInt8(44), freezeAuthority: optionKey(b, 46), isInitialized: b.readUInt8(45) === 1,
          mintAuthority: optionKey(b, 0), supply: b.readBigUInt64LE(36).toString(),
        },
      },
    };
  }
  if (b.length >= 165) {
    const state = ['uninitialized', 'initialized', 'frozen'][b.readUInt8(108)] ?? 'uninitialized';
    return {
      program, space: b.length,
      parsed: {
        type: 'account',
        info: {
          isNative: b.readUInt32LE(109) === 1, mint: addressOf(b.subarray(0, 32)), owner: addressOf(b.subarray(32, 64)), state,
          tokenAmount: { amount: b.readBigUInt64LE(64).toString() }, // decimals filled in by the caller (they live on the mint)
        },
      },
    };
  }
  return null;
}

export function uiAmount(amount, decimals) {
  const s = amount.toString().padStart(decimals + 1, '0');
  const whole = s.slice(0, s.length - decimals);
  const frac = s.slice(s.length - decimals).replace(/0+$/, '');
  const text = frac ? `${whole}.${frac}` : whole;
  return { amount: amount.toString(), decimals, uiAmount: Number(text), uiAmountString: text };
}

/**
 * The balances getTransaction reports of a transaction over `keys` (its static accounts, by
 * index): lamports before and after, and token balances of the token accounts among them.
 */
function balancesOf(keys, before, after, decimalsOf) {
  const tokens = (read) => keys.flatMap((k, accountIndex) => {
    const a = read(k);
    const parsed = a && parseTokenAccount(a.owner, a.data);
    if (parsed?.parsed.type !== 'account') return [];
    const { mint, owner, tokenAmount } = parsed.parsed.info;
    return [{ accountIndex, mint, owner, programId: a.owner, uiTokenAmount: uiAmount(BigInt(tokenAmount.amount), decimalsOf(mint)) }];
  });
  const lamports = (read) => keys.map((k) => read(k)?.lamports ?? 0n);
  return {
    preBalances: lamports(before), postBalances: lamports(after),
    preTokenBalances: tokens(before), postTokenBalances: tokens(after),
  };
}

export class SvmChain {
  /**
   * @param {object} o
   * @param {number} [o.slotMs=400]            slot time; slots advance on a timer
   * @param {number} [o.blockhashExpiry=150]   blocks a blockhash stays valid (lastValidBlockHeight = height + this)
   * @param {number} [o.confirmedDepth=1]      slots after landing until a status is `confirmed`
   * @param {number} [o.finalizedDepth=32]     slots after landing until `finalized` (confirmations: null)
   * @param {number} [o.statusCacheSlots=300]  statuses older than this answer only with searchTransactionHistory
   * @param {string} [o.genesisHash]           what getGenesisHash answers (default devnet's)
   * @param {(line: string) => void} [o.log]
   */
  constructor({
    slotMs = 400, blockhashExpiry = 150, confirmedDepth = 1, finalizedDepth = 32, statusCacheSlots = 300,
    genesisHash = DEVNET_GENESIS_HASH, log = () => {},
  } = {}) {
    Object.assign(this, { slotMs, blockhashExpiry, confirmedDepth, finalizedDepth, statusCacheSlots, genesisHash, log });
    this.svm = new LiteSvm();
    this.svm.setBlockhashCheck(false); // blockhash age is checked here, per block, like a cluster does
    this.svm.setSigverify(true);
    this.slot = 0;
    this.blockHeight = 0;
    this.blockhashes = new Map(); // blockhash -> block height it was produced at
    this.pending = []; // decoded transactions sent, executed at the next slot
    this.statuses = new Map(); // signature -> {slot, err, logs, unitsConsumed, record}
    this.history = []; // [{slot, before: Map(address -> account | null)}]: what transactions overwrote, newest last
    this.faults = { lagConfirmed: false, fakeConfirmed: false }; // see setFaults
    this.transactionCount = 0;
    this.slotTimes = new Map(); // slot -> when it was produced (ms since the epoch), the last 10,000
    this.paused = false;
    this.timer = null;
    this.produceSlot(); // slot 1 with its blockhash
  }

  start() {
    this.stopTimer();
    if (!this.paused) this.timer = setInterval(() => this.produceSlot(), this.slotMs);
    return this;
  }
  stopTimer() {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
  pause() {
    this.paused = true;
    this.stopTimer();
  }
  resume() {
    this.paused = false;
    this.start();
  }
  setSlotInterval(ms) {
    if (!Number.isInteger(ms) || ms < 10) throw invalidParams('slot interval: an integer number of milliseconds >= 10');
    this.slotMs = ms;
    if (!this.paused) this.start();
  }

  get latestBlockhash() {
    return this.svm.latestBlockhash();
  }
  lastValidBlockHeight(blockhash) {
    const h = this.blockhashes.get(blockhash);
    return h === undefined ? null : h + this.blockhashExpiry;
  }
  /** A blockhash is valid while the block height has not passed its lastValidBlockHeight. */
  blockhashValid(blockhash, height = this.blockHeight) {
    const last = this.lastValidBlockHeight(blockhash);
    return last !== null && height <= last;
  }

  /** One slot: a new block with a new blockhash, holding every transaction sent before it. */
  produceSlot() {
    this.slot += 1;
    this.blockHeight += 1;
    this.slotTimes.set(this.slot, Date.now());
    this.slotTimes.delete(this.slot - 10_000);
    const clock = this.svm.getClock();
    clock.slot = BigInt(this.slot);
    clock.unixTimestamp = BigInt(Math.floor(Date.now() / 1000));
    this.svm.setClock(clock);
    const queue = this.pending;
    this.pending = [];
    for (const decoded of queue) this.execute(decoded);
    this.svm.expireBlockhash();
    this.blockhashes.set(this.svm.latestBlockhash(), this.blockHeight);
    for (const [hash, h] of this.blockhashes) {
      if (h + this.blockhashExpiry * 2 < this.blockHeight) this.blockhashes.delete(hash);
      else break; // insertion order = age order
    }
  }

  execute(decoded) {
    const { signature } = decoded;
    if (this.statuses.has(signature)) return; // the same transaction twice: processed once
    if (!this.blockhashValid(decoded.blockhash)) {
      this.log(`slot ${this.slot}: dropped ${signature} (blockhash ${decoded.blockhash} expired or unknown)`);
      return;
    }
    const keys = decoded.message.staticAccounts;
    const before = new Map(keys.map((k) => [k, this.account(k)]));
    const result = this.run(decoded, { sigverify: true, simulate: false });
    if (result.err && !LANDS_WITH_ERROR(result.err)) {
      this.log(`slot ${this.slot}: dropped ${signature} (${JSON.stringify(result.err)})`);
      return;
    }
    this.history.push({ slot: this.slot, before });
    if (this.history.length > 256) this.history.shift();
    const record = { decoded, ...balancesOf(keys, (k) => before.get(k), (k) => this.account(k), (m) => this.decimalsOf(m)) };
    this.statuses.set(signature, { slot: this.slot, err: result.err, logs: result.logs, unitsConsumed: result.unitsConsumed, record });
    this.transactionCount += 1;
    this.log(`slot ${this.slot}: landed ${signature}${result.err ? ` with error ${JSON.stringify(result.err)}` : ''}`);
  }

  /** Run a decoded transaction in LiteSVM: {err (JSON or null), logs, unitsConsumed, postAccounts?, innerInstructions}. */
  run(decoded, { sigverify, simulate }) {
    this.svm.setSigverify(sigverify);
    let out;
    try {
      const fn = simulate
        ? (decoded.versioned ? 'simulateVersionedTransaction' : 'simulateLegacyTransaction')
        : (decoded.versioned ? 'sendVersionedTransaction' : 'sendLegacyTransaction');
      out = this.svm[fn](decoded.bytes);
    } finally {
      this.svm.setSigverify(true);
    }
    if (out instanceof FailedTransactionMetadata) {
      const meta = out.meta();
      return { err: txErrorJson(out.err()), logs: meta.logs(), unitsConsumed: meta.computeUnitsConsumed(), meta };
    }
    const meta = out instanceof TransactionMetadata ? out : out.meta();
    return { err: null, logs: meta.logs(), unitsConsumed: meta.computeUnitsConsumed(), meta, info: simulate ? out : null };
  }

  /**
   * simulateTransaction: {err, logs, unitsConsumed, replacementBlockhash?, info, meta}. With
   * replaceRecentBlockhash the transaction's own blockhash is not checked; otherwise an unknown or
   * expired one is err "BlockhashNotFound", as on a cluster.
   */
  simulate(decoded, { sigVerify = false, replaceRecentBlockhash = false, commitment } = {}) {
    const lagged = this.lagged(commitment);
    if (lagged.size === 0) return this.simulateNow(decoded, { sigVerify, replaceRecentBlockhash });
    // The state an older commitment sees: what the recent transactions overwrote, put back for
    // the simulation only.
    const now = new Map([...lagged.keys()].map((k) => [k, this.account(k)]));
    for (const [k, a] of lagged) if (a) this.setAccount(k, a);
    try {
      return this.simulateNow(decoded, { sigVerify, replaceRecentBlockhash });
    } finally {
      for (const [k, a] of now) if (a) this.setAccount(k, a);
    }
  }

  simulateNow(decoded, { sigVerify, replaceRecentBlockhash }) {
    if (sigVerify && !signaturesValid(decoded.tx, decoded.tx.messageBytes)) {
      throw new RpcError(-32003, 'Transaction signature verification failure');
    }
    if (!replaceRecentBlockhash && !this.blockhashValid(decoded.blockhash)) {
      return { err: 'BlockhashNotFound', logs: [], unitsConsumed: 0n };
    }
    if (this.statuses.has(decoded.signature) && sigVerify) return { err: 'AlreadyProcessed', logs: [], unitsConsumed: 0n };
    const result = this.run(decoded, { sigverify: sigVerify, simulate: true });
    if (replaceRecentBlockhash) {
      result.replacementBlockhash = { blockhash: this.latestBlockhash, lastValidBlockHeight: this.lastValidBlockHeight(this.latestBlockhash) };
    }
    return result;
  }

  /**
   * sendTransaction: queue for the next slot and answer the signature. Unless skipPreflight, the
   * node first checks the signatures (-32003) and simulates (-32002 with the simulation in data),
   * as a real RPC node does.
   */
  send(decoded, { skipPreflight = false } = {}) {
    if (!skipPreflight) {
      if (!signaturesValid(decoded.tx, decoded.tx.messageBytes)) {
        throw new RpcError(-32003, 'Transaction signature verification failure');
      }
      const sim = this.statuses.has(decoded.signature)
        ? { err: 'AlreadyProcessed', logs: [], unitsConsumed: 0n }
        : this.simulate(decoded, { sigVerify: false });
      if (sim.err) {
        throw new RpcError(-32002, `Transaction simulation failed: ${txErrorText(sim.err)}`, {
          accounts: null, err: sim.err, innerInstructions: null, loadedAccountsDataSize: 0, logs: sim.logs,
          replacementBlockhash: null, returnData: null, unitsConsumed: sim.unitsConsumed,
        });
      }
    }
    if (this.faults.fakeConfirmed) {
      this.log(`dropped ${decoded.signature} (fakeConfirmed: accepted, never landed)`);
      return decoded.signature;
    }
    if (!this.statuses.has(decoded.signature) && !this.pending.some((p) => p.signature === decoded.signature)) {
      this.pending.push(decoded);
    }
    return decoded.signature;
  }

  /**
   * Test faults: `lagConfirmed` makes reads and simulations at any commitment but `processed`
   * see accounts as they were before the transactions of the last `confirmedDepth` slots (a
   * cluster's confirmed state trails what a leader processed); `fakeConfirmed` makes
   * getSignatureStatuses answer `confirmed` without error for any signature it does not know,
   * and sendTransaction accept and drop every transaction (a lying node).
   */
  setFaults(faults) {
    for (const [k, v] of Object.entries(faults)) {
      if (!(k in this.faults) || typeof v !== 'boolean') throw invalidParams(`faults: ${Object.keys(this.faults).join(', ')} (booleans)`);
      this.faults[k] = v;
    }
    this.log(`faults ${JSON.stringify(this.faults)}`);
    return { ...this.faults };
  }

  /** Accounts as a read at `commitment` sees them where that differs from now: address -> account (or null). */
  lagged(commitment) {
    const out = new Map();
    if (!this.faults.lagConfirmed || commitment === 'processed') return out;
    for (const { slot, before } of this.history) {
      if (slot <= this.slot - this.confirmedDepth) continue;
      for (const [k, a] of before) if (!out.has(k)) out.set(k, a);
    }
    return out;
  }

  /** getTransaction's record of `signature` at `commitment`, or null. */
  transaction(signature, commitment = 'finalized') {
    const s = this.statuses.get(signature);
    if (!s?.record) return null;
    const depth = this.slot - s.slot;
    if (depth < (commitment === 'finalized' ? this.finalizedDepth : this.confirmedDepth)) return null;
    return { slot: s.slot, err: s.err, logs: s.logs, unitsConsumed: s.unitsConsumed, ...s.record };
  }

  decimalsOf(mint) {
    try {
      return this.mintInfo(mint).decimals;
    } catch {
      return 0;
    }
  }

  /** A status as getSignatureStatuses answers it, or null (never landed, or aged out of the cache). */
  status(signature, { searchTransactionHistory = false } = {}) {
    const s = this.statuses.get(signature);
    if (!s && this.faults.fakeConfirmed) {
      return { slot: this.slot, confirmations: 1, err: null, status: { Ok: null }, confirmationStatus: 'confirmed' };
    }
    if (!s) return null;
    const depth = this.slot - s.slot;
    if (!searchTransactionHistory && depth > this.statusCacheSlots) return null;
    const confirmationStatus = depth >= this.finalizedDepth ? 'finalized' : depth >= this.confirmedDepth ? 'confirmed' : 'processed';
    return {
      slot: s.slot, confirmations: confirmationStatus === 'finalized' ? null : depth, err: s.err,
      status: s.err ? { Err: s.err } : { Ok: null }, confirmationStatus,
    };
  }

  dropPending() {
    const n = this.pending.length;
    this.pending = [];
    this.log(`dropped ${n} pending transaction(s)`);
    return n;
  }

  // ---- accounts ----

  /** {lamports, owner, data, executable, rentEpoch} or null, as a read at `commitment` sees it. */
  account(address, commitment = 'processed') {
    const lagged = this.lagged(commitment);
    if (lagged.has(address)) return lagged.get(address);
    const a = this.svm.getAccount(addressBytes(address));
    if (!a) return null;
    return { lamports: a.lamports(), owner: addressOf(a.owner()), data: a.data(), executable: a.executable(), rentEpoch: a.rentEpoch() };
  }
  setAccount(address, { lamports, owner = SYSTEM_PROGRAM, data = new Uint8Array(0), executable = false }) {
    this.svm.setAccount(addressBytes(address), new Account(BigInt(lamports), new Uint8Array(data), addressBytes(owner), executable, U64_MAX));
  }
  rentExempt(len) {
    return this.svm.minimumBalanceForRentExemption(BigInt(len));
  }

  /** Airdrop lamports (a real transfer from LiteSVM's faucet, recorded in the current slot). */
  airdrop(address, lamports) {
    const out = this.svm.airdrop(addressBytes(address), BigInt(lamports));
    if (!out || out instanceof FailedTransactionMetadata) {
      throw new RpcError(-32603, `airdrop failed: ${out ? JSON.stringify(txErrorJson(out.err())) : 'no result'}`);
    }
    const signature = base58Decoder.decode(out.signature());
    this.statuses.set(signature, { slot: this.slot, err: null, logs: out.logs(), unitsConsumed: out.computeUnitsConsumed() });
    this.transactionCount += 1;
    return signature;
  }

  /** Place an initialised mint (SPL Token or Token-2022, no extensions) at `address` (fresh if omitted). */
  createMint({ decimals, tokenProgram = TOKEN_PROGRAM, address, mintAuthority = null, freezeAuthority = null }) {
    if (!Number.isInteger(decimals) || decimals < 0 || decimals > 255) throw invalidParams('decimals: an integer 0..255');
    if (![TOKEN_PROGRAM, TOKEN_2022_PROGRAM].includes(tokenProgram)) throw invalidParams(`tokenProgram: ${TOKEN_PROGRAM} or ${TOKEN_2022_PROGRAM}`);
    const mint = address ?? addressOf(randomBytes(32));
    const data = mintData({ mintAuthority, decimals, freezeAuthority });
    this.setAccount(mint, { lamports: this.rentExempt(data.length), owner: tokenProgram, data });
    this.log(`mint ${mint} (${tokenProgram === TOKEN_PROGRAM ? 'SPL Token' : 'Token-2022'}, ${decimals} decimals)`);
    return { mint, tokenProgram, decimals };
  }

  mintInfo(mint) {
    const a = this.account(mint);
    const parsed = a && parseTokenAccount(a.owner, a.data);
    if (parsed?.parsed.type !== 'mint') throw invalidParams(`not a mint: ${mint}`);
    return { ...parsed.parsed.info, tokenProgram: a.owner, account: a };
  }

  /** Create `owner`'s associated token account of `mint` if missing; its address. */
  async createTokenAccount({ mint, owner }) {
    addressBytes(owner);
    const info = this.mintInfo(mint);
    const ata = await associatedTokenAddress(owner, mint, info.tokenProgram);
    if (!this.account(ata)) {
      const data = tokenAccountData({ mint, owner, amount: 0n });
      this.setAccount(ata, { lamports: this.rentExempt(data.length), owner: info.tokenProgram, data });
    }
    return { tokenAccount: ata, tokenProgram: info.tokenProgram };
  }

  /** Mint `amount` to `owner`'s associated token account (created if missing); the new balance. */
  async mintTo({ mint, owner, amount }) {
    const add = BigInt(amount);
    if (add < 0n) throw invalidParams('amount: a non-negative integer');
    const { tokenAccount, tokenProgram } = await this.createTokenAccount({ mint, owner });
    const acct = this.account(tokenAccount);
    const data = Buffer.from(acct.data);
    const balance = data.readBigUInt64LE(64) + add;
    data.writeBigUInt64LE(balance, 64);
    this.setAccount(tokenAccount, { lamports: acct.lamports, owner: tokenProgram, data });
    const m = this.account(mint);
    const mdata = Buffer.from(m.data);
    mdata.writeBigUInt64LE(mdata.readBigUInt64LE(36) + add, 36);
    this.setAccount(mint, { lamports: m.lamports, owner: m.owner, data: mdata });
    return { tokenAccount, amount: balance.toString() };
  }
}
