//! Talking to EVM nodes: the upstream client, the per-block head and fee cache. What a value
//! means (hex, fees, calldata) is `evm`'s; this room only carries it.
//!
//! A chain reports its own readiness ([`Chain::readiness`]): whether it answered recently, and
//! whether its head watcher's last step panicked. It asks no node to say so.

pub mod batch;
mod cadence;
pub mod client;
pub mod head;
pub mod merge;
pub mod read_mode;
pub mod svm;
pub mod traffic;

use std::sync::Arc;
use std::time::Duration;

use ethers_core::types::{Address, U256};
use serde_json::json;

use crate::evm::hex_bytes;

use crate::config::ChainSettings;
use crate::guard::Guard;
pub use batch::{Answered, Batch, Slot};
pub use client::{Call, CallResult, ChainClient, ClientLimits, Refusal, RpcError, Unreachable};
pub use head::{Canonical, DerivedCap, Head, HeadWatcher};
pub use read_mode::ReadMode;
use read_mode::ReadModeCell;
pub use traffic::{Budget, Overloaded, Traffic};

/// A configured chain: its settings, its upstream client and its head cache.
pub struct Chain {
    pub name: String,
    pub settings: ChainSettings,
    pub client: Arc<ChainClient>,
    pub head: HeadWatcher,
    read_mode: ReadModeCell,
}

impl Chain {
    pub fn new(name: &str, settings: &ChainSettings) -> Result<Arc<Self>, String> {
        let limits = ClientLimits {
            timeout: Duration::from_millis(settings.request_timeout_ms),
            max_in_flight: settings.max_concurrent_requests,
            max_batch_calls: settings.max_batch_calls,
            max_caller_reads: settings.max_caller_reads,
        };
        let client = ChainClient::new(name, &settings.rpc_urls, limits)?;
        let head = HeadWatcher::spawn(
            client.clone(),
            settings.fee_model,
            Duration::from_millis(settings.poll_interval_ms),
            settings.ws_urls.clone(),
            settings.max_fee_cap(),
        );
        Ok(Arc::new(Self {
            name: name.to_string(),
            settings: settings.clone(),
            client,
            head,
            read_mode: ReadModeCell::default(),
        }))
    }

    /// What one gas may cost at most in a transaction routerd signs here (access.md §2): the
    /// configured or preset `max_fee_per_gas`, else the cap derived from the chain's blocks.
    pub fn fee_cap(&self) -> FeeCap {
        match self.settings.max_fee_cap() {
            Some(cap) => FeeCap::Set(cap),
            None => FeeCap::Derived(self.head.derived_cap()),
        }
    }

    /// The latest head, asking the chain now if the cache has none yet.
    pub async fn latest_head(&self) -> Result<Head, Unreachable> {
        self.head.latest_or_fetch().await
    }

    /// Whether the chain answered within five polls and a request timeout.
    pub fn answering(&self) -> Answering {
        let fresh = Duration::from_millis(
            self.settings.poll_interval_ms * 5 + self.settings.request_timeout_ms,
        );
        match self.client.since_last_success() {
            Some(age) if age <= fresh => Answering::Recently(age),
            Some(age) => Answering::Silent(age),
            None => Answering::Never,
        }
    }

    /// What `/ready` asks of a chain; answered from what the chain saw, without a request.
    pub fn readiness(&self) -> Readiness<'_> {
        Readiness {
            answering: self.answering(),
            watcher_down: Some(&*self.head.guard).filter(|g| g.is_down()),
            read_mode: self.read_mode(),
        }
    }

    pub fn read_mode(&self) -> ReadMode {
        self.read_mode.get()
    }

    /// The read mode, probing the node first if it is not known yet.
    pub async fn learn_read_mode(&self) -> Result<ReadMode, Unreachable> {
        let known = self.read_mode.get();
        if known != ReadMode::Unknown {
            return Ok(known);
        }
        let mode = read_mode::probe(&self.client).await?;
        self.read_mode.set(mode);
        tracing::info!(chain = %self.name, read_mode = mode.as_str(), "verify read mode");
        Ok(mode)
    }

    /// The node did not run an override it ran before (a failover URL of another make, say):
    /// the next read probes again, and this one is sent in batch mode.
    pub fn forget_read_mode(&self, why: &str) {
        if self.read_mode.get() != ReadMode::Unknown {
            self.read_mode.set(ReadMode::Unknown);
            tracing::warn!(chain = %self.name, %why, "verify read mode to be probed again");
        }
    }
}

/// The absolute cap on what one gas may cost on a chain (see [`Chain::fee_cap`]).
#[derive(Debug, Clone)]
pub enum FeeCap {
    /// `max_fee_per_gas` from the configuration or the network's preset.
    Set(U256),
    /// Derived from the chain's recent blocks at the first head read; unknown before it.
    Derived(DerivedCap),
}

impl FeeCap {
    pub fn get(&self) -> Option<U256> {
        match self {
            FeeCap::Set(cap) => Some(*cap),
            FeeCap::Derived(cell) => cell.get().copied(),
        }
    }
}

/// How recently a chain answered: `Recently` is within five polls and a request timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answering {
    Recently(Duration),
    Silent(Duration),
    Never,
}

impl Answering {
    pub fn is_recent(&self) -> bool {
        matches!(self, Answering::Recently(_))
    }

    /// Time since the last answer, if there was one.
    pub fn age(&self) -> Option<Duration> {
        match self {
            Answering::Recently(age) | Answering::Silent(age) => Some(*age),
            Answering::Never => None,
        }
    }
}

/// A chain's readiness report.
pub struct Readiness<'a> {
    pub answering: Answering,
    /// The head watcher, when its last step panicked.
    pub watcher_down: Option<&'a Guard>,
    /// Not a readiness condition (batch mode is slower, not wrong); shown to operators.
    pub read_mode: ReadMode,
}

pub fn eth_call(to: Address, data: &[u8], block: &str) -> Call {
    Call::new(
        "eth_call",
        vec![
            json!({"to": hex_bytes(to), "data": hex_bytes(data)}),
            json!(block),
        ],
    )
}
