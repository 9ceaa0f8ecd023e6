//! What the facilitator reports of itself to `/ready` and `/metrics`, in no family's words: the
//! keys that pay for settlements (each family's senders or fee payers) with their funds as last
//! read, the background steps that panicked, and the store's answer to a small read. Each
//! mechanism reads and judges its own keys (`Mechanism::funds`): how much one settlement needs,
//! and the problem `/ready` names when a key cannot pay for it.

use std::time::Duration;

use ethers_core::types::{Address, U256};

use super::Facilitator;
use crate::guard::Guard;
use crate::ledger::Payer;

/// How long the probe of one network's keys, or of the store, may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The facilitator's readiness report.
pub struct Readiness<'a> {
    /// Background steps (a signer lane's worker) whose last step panicked.
    pub down: Vec<&'a Guard>,
    /// Every key that pays for settlements, family by family in the registry's order.
    pub funds: Vec<Funds>,
}

/// What a key does for its family's settlements, which names the metrics its funds are
/// reported under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// It signs and sends settlement transactions, from a balance in the chain's smallest unit,
    /// at a nonce (`routerd_signer_*`).
    Signer,
    /// It pays a settlement's fees, from a balance it must not spend below a minimum
    /// (`routerd_fee_payer_*`).
    FeePayer,
}

/// One key on one network, as its chain last answered (`None`: no answer in time).
#[derive(Debug, Clone)]
pub struct Funds {
    pub role: Role,
    pub network: String,
    /// The key as its family spells it.
    pub key: String,
    /// In the chain's smallest unit.
    pub balance: Option<U256>,
    /// The next nonce, for a family whose keys have one.
    pub nonce: Option<u64>,
    /// How many settlements the balance still pays for (`None`: not read).
    pub settlements_left: Option<u64>,
    /// Why the key cannot pay for one settlement (or cannot be known to), in its family's words.
    pub problem: Option<String>,
}

/// How a family words a key that cannot pay for one settlement (`/ready`'s problem).
pub struct Shortfall {
    /// The balance's unit (`wei`, `lamports`).
    pub unit: &'static str,
    /// What the balance must cover, after "needed for".
    pub needed_for: &'static str,
    /// What did not answer, when the balance is unknown (`chain`, `cluster`).
    pub node: &'static str,
}

impl Shortfall {
    /// Why a key holding `balance` cannot pay for one settlement that needs `needed`, or cannot
    /// be known to; `None` when it can.
    pub fn problem<A: PartialOrd + std::fmt::Display>(
        &self,
        balance: Option<A>,
        needed: A,
    ) -> Option<String> {
        let Shortfall {
            unit,
            needed_for,
            node,
        } = self;
        match balance {
            Some(balance) if balance >= needed => None,
            Some(balance) => Some(format!(
                "balance {balance} {unit} is below {needed} {unit} needed for {needed_for}"
            )),
            None => Some(format!("balance unknown: {node} unreachable")),
        }
    }
}

/// How the store answered one read (`Facilitator::store_probe`).
#[derive(Debug, Clone, Copy)]
pub struct StoreProbe {
    pub ok: bool,
    pub took: Duration,
}

impl Facilitator {
    /// What `/ready` asks of the facilitator.
    pub async fn readiness(&self) -> Readiness<'_> {
        Readiness {
            down: self.down().collect(),
            funds: self.funds().await,
        }
    }

    /// One small read of the store (a payer's revert cooldown), bounded by [`PROBE_TIMEOUT`]:
    /// whether it answered, and how long it took.
    pub async fn store_probe(&self) -> StoreProbe {
        let started = std::time::Instant::now();
        let nobody = Payer::Evm(Address::zero());
        let read = self.ledger.cooldown_of(&nobody, crate::clock::unix_now());
        let ok = matches!(tokio::time::timeout(PROBE_TIMEOUT, read).await, Ok(Ok(_)));
        StoreProbe {
            ok,
            took: started.elapsed(),
        }
    }

    /// The background steps whose last step panicked (see `guard`), mechanism by mechanism.
    pub fn down(&self) -> impl Iterator<Item = &Guard> {
        self.registry.mechanisms().flat_map(|m| m.down())
    }

    /// Every mechanism's keys with their funds as last read, all read at once (each family's
    /// probe may take [`PROBE_TIMEOUT`] on a silent chain), in the registry's order.
    pub async fn funds(&self) -> Vec<Funds> {
        let reads = self.registry.mechanisms().map(|m| m.funds());
        futures::future::join_all(reads)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}
