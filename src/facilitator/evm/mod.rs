//! The EVM family's mechanism: verify's chain rules and the lens, the settle pipeline, and the
//! lanes (a worker per signer and network, the follower of each head, front-runs, leases), and
//! the start-up check of the `batch-settlement` contracts.

pub mod batch;
pub mod contracts;
pub mod exact;
pub mod family;
mod follower;
mod front_run;
pub(crate) mod inclusions;
pub mod lane;
mod lease;
mod ledger_nonce;
pub mod lens;
pub mod lower;
mod readiness;
pub mod request;
pub mod settle;
mod status;
pub mod verify;
mod worker;

pub use lane::{Lane, LaneSettings, Lanes};
pub use settle::{LeaseSettings, Ledger};
