//! The routing engine: probe every candidate chain in parallel, price the feasible ones, pick
//! the cheapest (ties by kind preference, then latency), reserve a nonce there.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ethers_core::types::{Address, U256};

use super::nonces::NonceBook;
use super::probe::{self, Estimate, Infeasible, Probe};
use super::relay::Relay;
use super::types::{ChainQuote, ChainStatus, FeeFields, RouterTransactionRes, Transaction};
use crate::chain::Chain;
use crate::clock::unix_now;
use crate::config::{ChainKind, FeeModel, RouterSettings};
use crate::evm::hex_u256;
use crate::ledger::RouterNonceKey;
use crate::store::{Storage, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("no chain can execute the transaction: {}", summary(.0))]
    NoFeasibleChain(Vec<ChainQuote>),
    #[error("no chain could be reached: {}", summary(.0))]
    AllUnreachable(Vec<ChainQuote>),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The caller holds `router.max_reservations_ahead` unused nonces of this sender already.
    #[error("{0} nonces of this sender are reserved for you ahead of its pending nonce on {1} (router.max_reservations_ahead); send those transactions first")]
    TooFarAhead(u64, String),
}

fn summary(quotes: &[ChainQuote]) -> String {
    quotes
        .iter()
        .map(|q| format!("{}: {}", q.chain, q.reason.as_deref().unwrap_or("feasible")))
        .collect::<Vec<_>>()
        .join("; ")
}

struct Candidate {
    chain: Arc<Chain>,
    /// Addresses known to hold code: code does not disappear, so a positive answer is kept.
    has_code: Mutex<HashSet<Address>>,
}

pub struct Router {
    candidates: Vec<Candidate>,
    prefer: Vec<ChainKind>,
    timeout: Duration,
    gas_headroom: f64,
    nonces: NonceBook,
    relay: Relay,
}

/// A probed chain with its price, when feasible.
struct Evaluation<'a> {
    candidate: &'a Candidate,
    probe: Probe,
    priced: Result<Priced, Infeasible>,
}

struct Priced {
    estimate: Estimate,
    gas_limit: u64,
    cost_wei: U256,
    cost: f64,
}

impl Router {
    /// `store` keeps what the relay sent (the reservations are in `nonces`).
    pub fn new(
        settings: &RouterSettings,
        chains: Vec<Arc<Chain>>,
        nonces: NonceBook,
        store: Storage,
    ) -> Self {
        let relay = Relay::new(chains.clone(), nonces.clone(), store, settings);
        Self {
            candidates: chains
                .into_iter()
                .map(|chain| Candidate {
                    chain,
                    has_code: Mutex::new(HashSet::new()),
                })
                .collect(),
            prefer: settings.prefer.clone(),
            timeout: Duration::from_millis(settings.chain_timeout_ms),
            gas_headroom: settings.gas_headroom,
            nonces,
            relay,
        }
    }

    /// Sending and following signed transactions through the router's chains.
    /// The reservations book, for its pruning task.
    pub fn nonces(&self) -> &NonceBook {
        &self.nonces
    }

    pub fn relay(&self) -> &Relay {
        &self.relay
    }

    /// Every candidate, ranked best first, with its reason when infeasible. Reserves nothing.
    pub async fn quote(&self, tx: &Transaction) -> Vec<ChainQuote> {
        self.evaluate(tx)
            .await
            .iter()
            .map(|e| self.describe(e))
            .collect()
    }

    /// The completed parameters on the best chain, and that chain's name. The nonce is
    /// reserved for `caller` (an API key's name or a client address).
    pub async fn route(
        &self,
        tx: &Transaction,
        caller: &str,
    ) -> Result<(RouterTransactionRes, String), RouteError> {
        let evaluations = self.evaluate(tx).await;
        let Some(best) = evaluations.first().filter(|e| e.priced.is_ok()) else {
            let quotes: Vec<ChainQuote> = evaluations.iter().map(|e| self.describe(e)).collect();
            let all_unreachable = evaluations
                .iter()
                .all(|e| matches!(e.priced, Err(Infeasible::Unreachable(_))));
            return Err(if all_unreachable {
                RouteError::AllUnreachable(quotes)
            } else {
                RouteError::NoFeasibleChain(quotes)
            });
        };
        let priced = best.priced.as_ref().expect("filtered feasible");
        let chain = &best.candidate.chain;
        let nonce = self
            .nonces
            .reserve(
                &RouterNonceKey {
                    chain: chain.name.clone(),
                    sender: tx.from,
                    caller: caller.to_string(),
                },
                priced.estimate.pending_nonce,
                unix_now(),
            )
            .await?
            .ok_or_else(|| RouteError::TooFarAhead(self.nonces.max_ahead(), chain.name.clone()))?;
        Ok((
            RouterTransactionRes {
                chain_id: format!("{:#x}", chain.settings.chain_id),
                nonce: format!("{nonce:#x}"),
                gas_limit: format!("{:#x}", priced.gas_limit),
                fees: FeeFields::of(&priced.estimate.fees),
            },
            chain.name.clone(),
        ))
    }

    /// Each candidate as `router_chains` reports it; healthy is [`Chain::answering`]'s recently.
    pub fn chains(&self) -> Vec<ChainStatus> {
        self.candidates
            .iter()
            .map(|c| {
                let chain = &c.chain;
                let answering = chain.answering();
                let last = answering.age();
                ChainStatus {
                    chain: chain.name.clone(),
                    kind: chain.settings.kind,
                    chain_id: format!("{:#x}", chain.settings.chain_id),
                    healthy: answering.is_recent(),
                    head_block: chain.head.current().map(|h| h.number),
                    last_answer_ms_ago: last.map(|d| d.as_millis() as u64),
                    fee_model: match chain.settings.fee_model {
                        FeeModel::Auto => "auto",
                        FeeModel::Eip1559 => "eip1559",
                        FeeModel::Legacy => "legacy",
                        FeeModel::OpStack => "op-stack",
                    },
                    read_mode: chain.read_mode().as_str(),
                }
            })
            .collect()
    }

    /// Probes all candidates at once and sorts them: feasible by cost, kind preference and
    /// latency; infeasible ones after.
    async fn evaluate(&self, tx: &Transaction) -> Vec<Evaluation<'_>> {
        let probes =
            futures::future::join_all(self.candidates.iter().map(|candidate| async move {
                let known = tx
                    .to
                    .filter(|to| candidate.has_code.lock().expect("code cache").contains(to))
                    .map(|_| true);
                let probe = probe::probe(&candidate.chain, tx, known, self.timeout).await;
                (candidate, probe)
            }))
            .await;
        let mut evaluations: Vec<Evaluation<'_>> = probes
            .into_iter()
            .map(|(candidate, probe)| {
                if let (Ok(_), Some(to)) = (&probe.outcome, tx.to) {
                    if !tx.data.is_empty() {
                        remember_code(&mut candidate.has_code.lock().expect("code cache"), to);
                    }
                }
                let priced = probe
                    .outcome
                    .clone()
                    .and_then(|e| self.price(&candidate.chain, tx, e));
                Evaluation {
                    candidate,
                    probe,
                    priced,
                }
            })
            .collect();
        evaluations.sort_by(|a, b| {
            self.rank(a)
                .partial_cmp(&self.rank(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        evaluations
    }

    fn rank(&self, e: &Evaluation<'_>) -> (u8, f64, usize, u128) {
        let preference = self
            .prefer
            .iter()
            .position(|k| *k == e.candidate.chain.settings.kind)
            .unwrap_or(self.prefer.len());
        match &e.priced {
            Ok(p) => (0, p.cost, preference, e.probe.latency.as_micros()),
            Err(_) => (1, 0.0, preference, e.probe.latency.as_micros()),
        }
    }

    /// Feasibility (the balance covers value, the worst-case gas bill and the L1 fee) and cost.
    fn price(
        &self,
        chain: &Chain,
        tx: &Transaction,
        estimate: Estimate,
    ) -> Result<Priced, Infeasible> {
        let gas_limit = ((estimate.gas_estimate as f64) * (1.0 + self.gas_headroom)).ceil() as u64;
        let worst_case = U256::from(gas_limit)
            .saturating_mul(estimate.fees.max_fee_per_gas())
            .saturating_add(estimate.l1_fee)
            .saturating_add(tx.value);
        if estimate.balance < worst_case {
            return Err(Infeasible::InsufficientBalance {
                needed: worst_case,
                balance: estimate.balance,
            });
        }
        let cost_wei = U256::from(gas_limit)
            .saturating_mul(estimate.fees.effective_price())
            .saturating_add(estimate.l1_fee);
        let cost = wei_to_f64(cost_wei) * chain.settings.native_price;
        Ok(Priced {
            estimate,
            gas_limit,
            cost_wei,
            cost,
        })
    }

    fn describe(&self, e: &Evaluation<'_>) -> ChainQuote {
        let chain = &e.candidate.chain;
        let mut quote = ChainQuote {
            chain: chain.name.clone(),
            kind: chain.settings.kind,
            chain_id: format!("{:#x}", chain.settings.chain_id),
            feasible: e.priced.is_ok(),
            reason: None,
            gas_limit: None,
            fees: FeeFields::default(),
            l1_fee: None,
            cost_wei: None,
            cost: None,
            latency_ms: e.probe.latency.as_millis() as u64,
        };
        match &e.priced {
            Ok(p) => {
                quote.gas_limit = Some(format!("{:#x}", p.gas_limit));
                quote.fees = FeeFields::of(&p.estimate.fees);
                quote.l1_fee = (!p.estimate.l1_fee.is_zero()).then(|| hex_u256(p.estimate.l1_fee));
                quote.cost_wei = Some(p.cost_wei.to_string());
                quote.cost = Some(p.cost);
            }
            Err(reason) => quote.reason = Some(reason.to_string()),
        }
        quote
    }
}

fn wei_to_f64(v: U256) -> f64 {
    v.to_string().parse().unwrap_or(f64::MAX)
}

/// Contracts known to have code, per chain: at most this many are kept (access.md §3b: what
/// strangers can create is bounded).
const CODE_CACHE_MAX: usize = 4096;

/// Adds `to` to the contracts known to have code; a full cache starts over rather than grow.
fn remember_code(known: &mut HashSet<Address>, to: Address) {
    if known.len() >= CODE_CACHE_MAX && !known.contains(&to) {
        known.clear();
    }
    known.insert(to);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_cache_stays_bounded() {
        let mut known = HashSet::new();
        let last = CODE_CACHE_MAX as u64 + 10;
        for i in 1..=last {
            remember_code(&mut known, Address::from_low_u64_be(i));
            assert!(known.len() <= CODE_CACHE_MAX);
        }
        assert!(known.contains(&Address::from_low_u64_be(last)));
    }
}
