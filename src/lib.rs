//! routerd: an EVM transaction router and x402 payment facilitator (EVM and Solana).
//!
//! The rooms, top to bottom. Each imports only rooms below it (`scripts/check-layers` holds
//! every room to the list in its line, and `scripts/test` runs it):
//!
//! ```text
//! daemon, main     wiring: settings -> store -> chains -> services -> listeners; recovery, shutdown
//! server           transport: listeners, API keys and rate limits, REST and JSON-RPC, ops,
//!                  wire errors              -> every room below
//! telemetry        the log and trace subscriber, OTLP export, a request's span and its
//!                  W3C `traceparent`        -> config
//! router           eth_routerTransaction: probe every chain, choose, reserve the caller's nonce;
//!                  the relay: a wallet's signed transaction sent, remembered and looked up,
//!                  each chain's served methods (/chains/<name>)
//!                                           -> chain store ledger evm config clock
//! facilitator      x402 verify and settle: the facade (mod.rs), the registry (registry.rs: the
//!                  families, a line each, each building its own mechanisms; which mechanism
//!                  serves which version, namespace and scheme), the traits they implement
//!                  (mechanism.rs), discovery, readiness in no family's words, and the rooms
//!                  below, each importing only rooms after it in this list
//!                                           -> chain store ledger signer evm svm config guard clock
//!   svm            Solana's exact: how the configuration makes it, its mechanism, verify,
//!                  settle, fee payers and their funds, its wire shapes (wire.rs)
//!                                           -> mechanism protocol settlement outcome types;
//!                                              never evm
//!   evm            EVM's exact and upto (ERC-3009, Permit2): how the configuration makes it
//!                  (signers, lanes, mechanisms), its mechanism and status answer, the parsed
//!                  request and its lowering from either version, verify and the lens, the
//!                  settle pipeline, lanes, the follower, front-runs, leases; and
//!                  `batch-settlement` (evm/batch: its payloads, rules, deposits through the
//!                  settle pipeline, claims, sweeps and refunds packed per network)
//!                                           -> mechanism discovery protocol settlement outcome
//!                                              types; never svm
//!   protocol       the x402 versions' shapes, field paths and reason names (v1, v2)
//!                                           -> outcome types; no mechanism (evm, svm) and
//!                                              never settlement
//!   settlement     what every family's settlement shares: who a caller is, passes, one
//!                  success per payment, the exposure recheck, waiters, cooldowns
//!                                           -> outcome; no family leaf (evm, svm, chain::evm,
//!                                              chain::svm) and no family room
//!   outcome, types what a payment comes to (Invalid, Settled, SettleError) and the status and
//!                  supported answers, in no family's words
//! store            sled and PostgreSQL behind one set of traits, one codec, one conformance
//!                  suite                    -> ledger evm config clock
//! ledger           the settlement record, its keys and reasons: plain data, pure transitions
//!                                           -> primitives
//! chain            upstream nodes: batches, failover, refusals, heads and fees; Solana
//!                  clusters (`chain::svm`)  -> evm svm config guard clock
//! signer           keys and signatures      -> evm
//! evm              hex, quantities, fees, revert data, ERC-3009 (and what its logs say),
//!                  ERC-6492, Permit2, the batch-settlement contracts and nonce reads: no I/O
//!                                           -> primitives
//! svm              Solana: the payer's wire transaction, the exact instruction rules,
//!                  associated token accounts: no I/O (never imports evm, nor evm it)
//! primitives       what the ledger and evm both hold: hex of bytes, a signed transaction's
//!                  fee fields: no I/O
//! config, guard, clock                      leaves
//! ```
//!
//! `fuzzing` exposes the parsers to the fuzz targets; `testing` holds the unit tests' fixtures.

pub mod chain;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod evm;
pub mod facilitator;
pub mod fuzzing;
pub mod guard;
pub mod ledger;
pub mod primitives;
pub mod router;
pub mod server;
pub mod signer;
pub mod store;
pub mod svm;
pub mod telemetry;
#[cfg(test)]
mod testing;
