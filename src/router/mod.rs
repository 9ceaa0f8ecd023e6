//! The transaction router of router.md: validation, the engine, per-chain probes, nonces, and
//! the relay that sends and follows a wallet's signed transactions (issue 30).
//! No HTTP in here.

pub mod engine;
pub mod nonces;
pub mod probe;
pub mod raw;
pub mod reads;
pub mod relay;
pub mod served;
pub mod types;

pub use engine::{RouteError, Router};
pub use relay::{Lookup, Relay, RelayError};
