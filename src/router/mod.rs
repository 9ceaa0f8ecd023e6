//! The transaction router of router.md: validation, the engine, per-chain probes, nonces.
//! No HTTP in here.

pub mod engine;
pub mod nonces;
pub mod probe;
pub mod types;

pub use engine::{RouteError, Router};
