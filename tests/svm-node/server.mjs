#!/usr/bin/env node
// The Solana test node: a Solana JSON-RPC 2.0 server over HTTP in front of one SvmChain (chain.mjs,
// a LiteSVM whose slots advance on a timer). It answers the methods a Solana payment client and
// facilitator use, as a real node writes them, and test controls under the `litesvm_` prefix.
// tests/e2e/README.md ("The Solana test node") lists both.
//
//   node tests/svm-node/server.mjs [--host 127.0.0.1] [--port 8899] [--slot-ms 400]
//     [--blockhash-expiry 150] [--confirmed-depth 1] [--finalized-depth 32] [--genesis-hash HASH]
//
// Prints one JSON line on stdout once listening: {url, port, genesisHash, caip2, slotMs, blockhashExpiry}.
// Logs what lands or is dropped on stderr.
import { createServer } from 'node:http';
import { pathToFileURL } from 'node:url';
import { realpathSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { getBase58Decoder } from '@solana/kit';
import {
  SvmChain, RpcError, invalidParams, decodeWireTransaction, addressBytes, parseTokenAccount, uiAmount,
  TOKEN_PROGRAM, TOKEN_2022_PROGRAM,
} from './chain.mjs';

const API_VERSION = '2.2.0';
const MAX_BODY_BYTES = 50 * 1024 * 1024;
const base58 = getBase58Decoder();
const bs58 = (bytes) => base58.decode(bytes);

/** JSON with bigints written as plain integers (a node's u64s: rentEpoch 2^64-1, lamports). */
function toJson(value) {
  return JSON.stringify(value, (_, v) => (typeof v === 'bigint' ? `__u64__${v}__` : v)).replace(/"__u64__(\d+)__"/g, '$1');
}

const config = (params, i) => {
  const c = params[i];
  if (c === undefined || c === null) return {};
  if (typeof c !== 'object' || Array.isArray(c)) throw invalidParams(`Invalid params: config at position ${i} must be an object`);
  return c;
};
const arrayParams = (params) => {
  if (params === undefined) return [];
  if (!Array.isArray(params)) throw invalidParams('Invalid params: expected an array');
  return params;
};

export class SvmRpc {
  constructor(chain) {
    this.chain = chain;
  }

  context() {
    return { slot: this.chain.slot, apiVersion: API_VERSION };
  }
  withContext(value) {
    return { context: this.context(), value };
  }
  checkMinContextSlot(c) {
    if (c.minContextSlot !== undefined && Number(c.minContextSlot) > this.chain.slot) {
      throw new RpcError(-32016, 'Minimum context slot has not been reached', { contextSlot: this.chain.slot });
    }
  }

  encodeAccount(address, c) {
    const a = this.chain.account(address, c.commitment);
    if (!a) return null;
    const encoding = c.encoding ?? 'base58';
    let data = Buffer.from(a.data);
    if (c.dataSlice) data = data.subarray(c.dataSlice.offset ?? 0, (c.dataSlice.offset ?? 0) + (c.dataSlice.length ?? data.length));
    let out;
    if (encoding === 'jsonParsed') {
      const parsed = parseTokenAccount(a.owner, a.data);
      if (parsed?.parsed.type === 'account') {
        const m = this.chain.account(parsed.parsed.info.mint); // the decimals live on the mint
        const decimals = (m && parseTokenAccount(m.owner, m.data)?.parsed.info.decimals) ?? 0;
        parsed.parsed.info.tokenAmount = uiAmount(BigInt(parsed.parsed.info.tokenAmount.amount), decimals);
      }
      out = parsed ?? [data.toString('base64'), 'base64']; // a real node falls back to base64 too
    } else if (encoding === 'base64') out = [data.toString('base64'), 'base64'];
    else if (encoding === 'base58') {
      if (data.length > 128) throw invalidParams('Encoded binary (base 58) data should be less than 128 bytes, please use Base64 encoding.');
      out = [bs58(data), 'base58'];
    } else if (encoding === 'base64+zstd') throw invalidParams('base64+zstd is not supported by this test node');
    else throw invalidParams(`Invalid params: unknown encoding ${encoding}`);
    return { data: out, executable: a.executable, lamports: a.lamports, owner: a.owner, rentEpoch: a.rentEpoch, space: a.data.length };
  }

  // ---- the Solana methods ----

  getHealth() {
    return 'ok';
  }
  getVersion() {
    return { 'solana-core': `${API_VERSION}-litesvm`, 'feature-set': 0 };
  }
  getGenesisHash() {
    return this.chain.genesisHash;
  }
  getSlot(params) {
    this.checkMinContextSlot(config(params, 0));
    return this.chain.slot;
  }
  getBlockHeight(params) {
    this.checkMinContextSlot(config(params, 0));
    return this.chain.blockHeight;
  }
  getEpochInfo() {
    const slotsInEpoch = 432000;
    return {
      absoluteSlot: this.chain.slot, blockHeight: this.chain.blockHeight, epoch: Math.floor(this.chain.slot / slotsInEpoch),
      slotIndex: this.chain.slot % slotsInEpoch, slotsInEpoch, transactionCount: this.chain.transactionCount,
    };
  }
  getLatestBlockhash(params) {
    this.checkMinContextSlot(config(params, 0));
    const blockhash = this.chain.latestBlockhash;
    return this.withContext({ blockhash, lastValidBlockHeight: this.chain.lastValidBlockHeight(blockhash) });
  }
  isBlockhashValid(params) {
    const [blockhash] = params;
    if (typeof blockhash !== 'string') throw invalidParams('Invalid params: expected a blockhash string');
    this.checkMinContextSlot(config(params, 1));
    return this.withContext(this.chain.blockhashValid(blockhash));
  }
  getMinimumBalanceForRentExemption(params) {
    const [len] = params;
    if (!Number.isInteger(len) || len < 0) throw invalidParams('Invalid params: expected a data length');
    return this.chain.rentExempt(len);
  }
  getBalance(params) {
    const c = config(params, 1);
    this.checkMinContextSlot(c);
    const a = this.chain.account(params[0], c.commitment);
    return this.withContext(a ? a.lamports : 0n);
  }
  getAccountInfo(params) {
    const c = config(params, 1);
    this.checkMinContextSlot(c);
    addressBytes(params[0]);
    return this.withContext(this.encodeAccount(params[0], c));
  }
  getMultipleAccounts(params) {
    const [addresses] = params;
    if (!Array.isArray(addresses)) throw invalidParams('Invalid params: expected an array of addresses');
    if (addresses.length > 100) throw invalidParams('Too many inputs provided; max 100');
    const c = config(params, 1);
    this.checkMinContextSlot(c);
    addresses.forEach(addressBytes);
    return this.withContext(addresses.map((a) => this.encodeAccount(a, c)));
  }
  getTokenAccountBalance(params) {
    const a = this.chain.account(params[0], config(params, 1).commitment);
    const parsed = a && parseTokenAccount(a.owner, a.data);
    if (parsed?.parsed.type !== 'account') throw invalidParams('Invalid param: not a Token account');
    const { decimals } = this.chain.mintInfo(parsed.parsed.info.mint);
    return this.withContext(uiAmount(BigInt(parsed.parsed.info.tokenAmount.amount), decimals));
  }
  getSignatureStatuses(params) {
    const [signatures] = params;
    if (!Array.isArray(signatures)) throw invalidParams('Invalid params: expected an array of signatures');
    if (signatures.length > 256) throw invalidParams('Too many inputs provided; max 256');
    const c = config(params, 1);
    for (const s of signatures) {
      if (typeof s !== 'string' || !/^[1-9A-HJ-NP-Za-km-z]{64,88}$/.test(s)) throw invalidParams('Invalid param: Invalid');
    }
    return this.withContext(signatures.map((s) => this.chain.status(s, c)));
  }
  getTransaction(params) {
    const [signature] = params;
    if (typeof signature !== 'string' || !/^[1-9A-HJ-NP-Za-km-z]{64,88}$/.test(signature)) throw invalidParams('Invalid param: Invalid');
    const c = config(params, 1);
    if (c.commitment === 'processed') throw invalidParams('Method does not support commitment below `confirmed`');
    const encoding = c.encoding ?? 'json';
    if (encoding !== 'json') throw invalidParams(`this test node answers getTransaction in json only, not ${encoding}`);
    const t = this.chain.transaction(signature, c.commitment);
    if (!t) return null;
    const { decoded } = t;
    if (decoded.versioned && c.maxSupportedTransactionVersion === undefined) {
      throw new RpcError(-32015, 'Transaction version (0) is not supported by the requesting client. Please try the request again with the following configuration parameter: "maxSupportedTransactionVersion": 0');
    }
    const m = decoded.message;
    return {
      slot: t.slot, blockTime: null, version: decoded.versioned ? 0 : 'legacy',
      transaction: {
        signatures: Object.values(decoded.tx.signatures).map((sig) => bs58(sig ?? new Uint8Array(64))),
        message: {
          accountKeys: m.staticAccounts, header: m.header, recentBlockhash: m.lifetimeToken,
          instructions: m.instructions.map((ix) => ({
            programIdIndex: ix.programAddressIndex, accounts: ix.accountIndices ?? [], data: bs58(ix.data ?? new Uint8Array(0)), stackHeight: null,
          })),
        },
      },
      meta: {
        err: t.err, status: t.err ? { Err: t.err } : { Ok: null }, fee: t.preBalances[0] - t.postBalances[0],
        preBalances: t.preBalances, postBalances: t.postBalances,
        preTokenBalances: t.preTokenBalances, postTokenBalances: t.postTokenBalances,
        logMessages: t.logs, computeUnitsConsumed: t.unitsConsumed, innerInstructions: [], rewards: [],
        loadedAddresses: { writable: [], readonly: [] },
      },
    };
  }
  simulateTransaction(params) {
    const c = config(params, 1);
    if (c.sigVerify && c.replaceRecentBlockhash) throw invalidParams('sigVerify may not be used with replaceRecentBlockhash');
    this.checkMinContextSlot(c);
    const decoded = decodeWireTransaction(params[0], c.encoding ?? 'base58');
    const sim = this.chain.simulate(decoded, {
      sigVerify: !!c.sigVerify, replaceRecentBlockhash: !!c.replaceRecentBlockhash, commitment: c.commitment,
    });
    const value = {
      accounts: null, err: sim.err, innerInstructions: null, loadedAccountsDataSize: 0, logs: sim.logs, replacementBlockhash: sim.replacementBlockhash ?? null,
      returnData: null, unitsConsumed: sim.unitsConsumed,
    };
    if (c.accounts?.addresses) {
      // As agave's rpc.rs: base64 only, no more addresses than the transaction loads, null for
      // each when the simulation failed; an address the transaction did not write is read from
      // the bank the simulation ran on.
      const encoding = c.accounts.encoding ?? 'base64';
      if (encoding === 'binary' || encoding === 'base58') throw invalidParams('base58 encoding not supported');
      if (!Array.isArray(c.accounts.addresses)) throw invalidParams('Invalid params: accounts.addresses must be an array');
      const loaded = decoded.message.staticAccounts.length;
      if (c.accounts.addresses.length > loaded) throw invalidParams(`Too many accounts provided; max ${loaded}`);
      c.accounts.addresses.forEach(addressBytes);
      const post = new Map((sim.info?.postAccounts() ?? []).map((p) => [bs58(p.address), p.account()]));
      value.accounts = c.accounts.addresses.map((addr) => {
        if (sim.err) return null;
        const acc = post.get(addr);
        if (!acc) return this.encodeAccount(addr, { encoding, commitment: c.commitment });
        return {
          data: [Buffer.from(acc.data()).toString('base64'), 'base64'], executable: acc.executable(), lamports: acc.lamports(),
          owner: bs58(acc.owner()), rentEpoch: acc.rentEpoch(), space: acc.data().length,
        };
      });
    }
    if (c.innerInstructions && sim.meta) {
      value.innerInstructions = sim.meta.innerInstructions().map((list, index) => ({
        index,
        instructions: list.map((ii) => {
          const ix = ii.instruction();
          return { programIdIndex: ix.programIdIndex(), accounts: [...ix.accounts()], data: bs58(ix.data()), stackHeight: ii.stackHeight() };
        }),
      })).filter((e) => e.instructions.length > 0);
    }
    return this.withContext(value);
  }
  sendTransaction(params) {
    const c = config(params, 1);
    this.checkMinContextSlot(c);
    const decoded = decodeWireTransaction(params[0], c.encoding ?? 'base58');
    return this.chain.send(decoded, { skipPreflight: !!c.skipPreflight });
  }
  requestAirdrop(params) {
    const [address, lamports] = params;
    if (!Number.isSafeInteger(lamports) || lamports <= 0) throw invalidParams('Invalid params: expected lamports');
    return this.chain.airdrop(address, lamports);
  }

  // ---- test controls (not Solana methods) ----

  litesvm_airdrop(params) {
    return this.requestAirdrop(params);
  }
  litesvm_createMint(params) {
    const o = config(params, 0);
    return this.chain.createMint({ ...o, tokenProgram: programOf(o.tokenProgram) });
  }
  litesvm_createTokenAccount(params) {
    return this.chain.createTokenAccount(config(params, 0));
  }
  litesvm_mintTo(params) {
    const o = config(params, 0);
    if (!/^\d+$/.test(String(o.amount))) throw invalidParams('amount: a decimal integer');
    return this.chain.mintTo(o);
  }
  litesvm_setAccount(params) {
    const o = config(params, 0);
    this.chain.setAccount(o.address, { ...o, data: Buffer.from(o.data ?? '', 'base64') });
    return null;
  }
  litesvm_pause() {
    this.chain.pause();
    return this.litesvm_status();
  }
  litesvm_resume() {
    this.chain.resume();
    return this.litesvm_status();
  }
  litesvm_setSlotInterval(params) {
    this.chain.setSlotInterval(params[0]);
    return this.litesvm_status();
  }
  litesvm_advanceSlots(params) {
    const n = params[0] ?? 1;
    if (!Number.isInteger(n) || n < 1 || n > 100_000) throw invalidParams('slots: an integer 1..100000');
    for (let i = 0; i < n; i += 1) this.chain.produceSlot();
    return this.litesvm_status();
  }
  litesvm_setFaults(params) {
    return this.chain.setFaults(config(params, 0));
  }
  litesvm_dropPending() {
    return this.chain.dropPending();
  }
  /** When the node produced `slot` (ms since the epoch; null when unknown): what a commitment's time is read against. */
  litesvm_slotTime(params) {
    const slot = params?.[0];
    if (!Number.isInteger(slot) || slot < 0) throw invalidParams('slot: a non-negative integer');
    return this.chain.slotTimes.get(slot) ?? null;
  }
  litesvm_status() {
    const ch = this.chain;
    return {
      slot: ch.slot, blockHeight: ch.blockHeight, paused: ch.paused, slotMs: ch.slotMs, pending: ch.pending.length,
      blockhashExpiry: ch.blockhashExpiry, confirmedDepth: ch.confirmedDepth, finalizedDepth: ch.finalizedDepth,
      genesisHash: ch.genesisHash, transactionCount: ch.transactionCount,
    };
  }

  /** One JSON-RPC request object -> its response object (null for a notification). */
  async handle(req) {
    const id = req && typeof req === 'object' && 'id' in req ? req.id : null;
    const reply = (body) => ({ jsonrpc: '2.0', ...body, id });
    if (!req || typeof req !== 'object' || Array.isArray(req) || req.jsonrpc !== '2.0' || typeof req.method !== 'string') {
      return reply({ error: { code: -32600, message: 'Invalid request' } });
    }
    const fn = METHODS.has(req.method) ? this[req.method] : null;
    if (!fn) return reply({ error: { code: -32601, message: 'Method not found' } });
    try {
      const result = await fn.call(this, arrayParams(req.params));
      return 'id' in req ? reply({ result }) : null;
    } catch (err) {
      if (err instanceof RpcError) return reply({ error: { code: err.code, message: err.message, ...(err.data !== undefined ? { data: err.data } : {}) } });
      return reply({ error: { code: -32603, message: `Internal error: ${err.message}` } });
    }
  }
}

const programOf = (p) => {
  if (p === undefined || p === 'spl-token' || p === 'token' || p === TOKEN_PROGRAM) return TOKEN_PROGRAM;
  if (p === 'spl-token-2022' || p === 'token-2022' || p === TOKEN_2022_PROGRAM) return TOKEN_2022_PROGRAM;
  throw invalidParams(`tokenProgram: "token" or "token-2022" (or a program address), not ${p}`);
};

const METHODS = new Set(Object.getOwnPropertyNames(SvmRpc.prototype)
  .filter((m) => !['constructor', 'context', 'withContext', 'checkMinContextSlot', 'encodeAccount', 'handle'].includes(m)));

/**
 * Start the node: an SvmChain (options as its constructor's) and an HTTP server on host:port
 * (0 = any free port). Returns {url, port, chain, rpc, close()}.
 */
export async function startSvmServer({ host = '127.0.0.1', port = 0, ...chainOpts } = {}) {
  const chain = new SvmChain(chainOpts).start();
  const rpc = new SvmRpc(chain);
  // Requests are answered one at a time in arrival order (the chain is single-threaded anyway).
  let queue = Promise.resolve();
  const server = createServer((req, res) => {
    const send = (status, text) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(text);
    };
    if (req.method === 'GET' && req.url.split('?')[0] === '/health') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end('ok');
      return;
    }
    if (req.method !== 'POST') {
      send(405, toJson({ jsonrpc: '2.0', error: { code: -32600, message: 'Invalid request: POST a JSON-RPC body' }, id: null }));
      return;
    }
    const chunks = [];
    let size = 0;
    req.on('data', (c) => {
      size += c.length;
      if (size > MAX_BODY_BYTES) req.destroy();
      else chunks.push(c);
    });
    req.on('end', () => {
      queue = queue.then(async () => {
        let body;
        try {
          body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
        } catch {
          send(200, toJson({ jsonrpc: '2.0', error: { code: -32700, message: 'Parse error' }, id: null }));
          return;
        }
        if (Array.isArray(body)) {
          if (body.length === 0) {
            send(200, toJson({ jsonrpc: '2.0', error: { code: -32600, message: 'Invalid request' }, id: null }));
            return;
          }
          const answers = [];
          for (const r of body) answers.push(await rpc.handle(r)); // in order, as a node executes a batch
          send(200, toJson(answers.filter((a) => a !== null)));
        } else {
          const answer = await rpc.handle(body);
          send(200, answer === null ? '' : toJson(answer));
        }
      }).catch((err) => send(500, toJson({ jsonrpc: '2.0', error: { code: -32603, message: err.message }, id: null })));
    });
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  const bound = server.address().port;
  return {
    url: `http://${host}:${bound}`, port: bound, chain, rpc,
    close: () => {
      chain.stopTimer();
      return new Promise((resolve) => { server.closeAllConnections?.(); server.close(() => resolve()); });
    },
  };
}

if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  const { values } = parseArgs({
    options: {
      host: { type: 'string', default: '127.0.0.1' },
      port: { type: 'string', default: '8899' },
      'slot-ms': { type: 'string', default: '400' },
      'blockhash-expiry': { type: 'string', default: '150' },
      'confirmed-depth': { type: 'string', default: '1' },
      'finalized-depth': { type: 'string', default: '32' },
      'genesis-hash': { type: 'string' },
    },
  });
  const int = (name) => {
    const v = Number(values[name]);
    if (!Number.isInteger(v) || v < 0) {
      console.error(`svm-node: --${name}: not a non-negative integer: ${values[name]}`);
      process.exit(2);
    }
    return v;
  };
  const node = await startSvmServer({
    host: values.host, port: int('port'), slotMs: int('slot-ms'), blockhashExpiry: int('blockhash-expiry'),
    confirmedDepth: int('confirmed-depth'), finalizedDepth: int('finalized-depth'),
    ...(values['genesis-hash'] ? { genesisHash: values['genesis-hash'] } : {}),
    log: (line) => console.error(`${new Date().toISOString()} ${line}`),
  });
  const { chain } = node;
  console.log(JSON.stringify({
    url: node.url, port: node.port, genesisHash: chain.genesisHash, caip2: `solana:${chain.genesisHash.slice(0, 32)}`,
    slotMs: chain.slotMs, blockhashExpiry: chain.blockhashExpiry,
  }));
  for (const signal of ['SIGINT', 'SIGTERM']) {
    process.once(signal, async () => {
      await node.close();
      process.exit(0);
    });
  }
}
