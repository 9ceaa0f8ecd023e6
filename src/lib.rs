//! routerd: an EVM transaction router and x402 v1 payment facilitator.
//!
//! Dependencies point one way: `server` (transport) -> `router`, `facilitator` (services) ->
//! `chain`, `store`, `signer`. `config` is read by `daemon`, which wires everything together.

pub mod chain;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod evm;
pub mod facilitator;
pub mod fuzzing;
pub mod guard;
pub mod ledger;
pub mod router;
pub mod server;
pub mod signer;
pub mod store;
