//! The wallet's side of the router: a transaction signed from an `eth_routerTransaction` answer
//! is sent through routerd and followed through it, so a wallet needs no RPC URL of its own.
//!
//! Invariants: a signed transaction goes only to the configured chain its chain id names (never
//! to a guess); the hash answered is the one routerd computed from the raw bytes, so the same
//! raw transaction sent again is answered the same hash from the node's one answer;
//! only a send the node took from routerd is remembered (hash -> chain, for
//! `router.sent_retention_secs`, at most `router.max_sent_remembered` of them) and confirms the
//! caller's nonce reservation before the answer. Every upstream call takes the router's read
//! budget on its chain (access.md §3c): over it the caller is told at once that the chain is busy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ethers_core::types::H256;
use serde_json::{json, Value};

use super::nonces::NonceBook;
use super::raw::{self, RawError, SignedTx};
use super::reads::{self, ReadBounds, ReadRefusal};
use super::served::{served, Served};
use crate::chain::answer_bound::{self, AnswerBudget};
use crate::chain::{Budget, Overloaded, Refusal, Traffic};
use crate::chain::{Chain, RpcError, Unreachable};
use crate::clock::unix_now;
use crate::config::RouterSettings;
use crate::evm;
use crate::ledger::RouterNonceKey;
use crate::store::{Sent, Storage, StoreError};

/// How often transactions older than the retention are forgotten.
const FORGET_EVERY: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Raw(#[from] RawError),
    #[error("no configured chain has chain id {0} ({0:#x}); nothing was sent")]
    UnknownChain(u64),
    #[error("this endpoint is chain {chain} (chain id {expected}); the transaction is for chain id {got}; nothing was sent")]
    WrongChain {
        chain: String,
        expected: u64,
        got: u64,
    },
    #[error("params: {0}")]
    InvalidParams(String),
    /// A read the endpoint does not serve as asked (an override, too much gas, full blocks).
    #[error(transparent)]
    Refused(#[from] ReadRefusal),
    /// The router's read budget on the chain is spent: answered at once, not queued.
    #[error(transparent)]
    Busy(#[from] Overloaded),
    #[error("the answer is larger than server.max_relay_answer_bytes ({limit} bytes); ask for less at once")]
    AnswerTooLarge { limit: usize },
    #[error("the method {0} does not exist or is not available here")]
    MethodNotFound(String),
    /// The node's own answer (a refusal, a revert): passed on with its code and data.
    #[error("{}", .0.message)]
    Node(RpcError),
    #[error(transparent)]
    Unreachable(Unreachable),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Which lookup a wallet asks for by hash.
#[derive(Debug, Clone, Copy)]
pub enum Lookup {
    Receipt,
    Transaction,
}

impl Lookup {
    fn method(self) -> &'static str {
        match self {
            Lookup::Receipt => "eth_getTransactionReceipt",
            Lookup::Transaction => "eth_getTransactionByHash",
        }
    }
}

/// An upstream call's failure: the answer's bound, when that is what stopped it.
impl From<Unreachable> for RelayError {
    fn from(e: Unreachable) -> Self {
        match answer_bound::current().filter(AnswerBudget::exceeded) {
            Some(budget) => RelayError::AnswerTooLarge {
                limit: budget.limit(),
            },
            None => RelayError::Unreachable(e),
        }
    }
}

#[derive(Clone)]
pub struct Relay {
    /// The router's chains, in configured order (the order unknown hashes are looked up in).
    chains: Vec<Arc<Chain>>,
    nonces: NonceBook,
    store: Storage,
    retention_secs: u64,
    max_remembered: usize,
    /// Sends remembered since the store was last trimmed to `max_remembered`.
    since_trim: Arc<AtomicUsize>,
}

impl Relay {
    pub fn new(
        chains: Vec<Arc<Chain>>,
        nonces: NonceBook,
        store: Storage,
        settings: &RouterSettings,
    ) -> Self {
        Self {
            chains,
            nonces,
            store,
            retention_secs: settings.sent_retention_secs,
            max_remembered: settings.max_sent_remembered,
            since_trim: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The router's chain named `name`.
    pub fn chain(&self, name: &str) -> Option<&Arc<Chain>> {
        self.chains.iter().find(|c| c.name == name)
    }

    /// `eth_sendRawTransaction` at the router address: to the chain the transaction names.
    /// Answers the hash and the chain's name.
    pub async fn send(&self, raw: &str, caller: &str) -> Result<(H256, String), RelayError> {
        let tx = raw::decode(raw)?;
        let chain = self
            .chains
            .iter()
            .find(|c| c.settings.chain_id == tx.chain_id)
            .ok_or(RelayError::UnknownChain(tx.chain_id))?;
        self.deliver(chain, &tx, caller).await?;
        Ok((tx.hash, chain.name.clone()))
    }

    /// `eth_sendRawTransaction` at `chain`'s own endpoint: only a transaction for that chain.
    pub async fn send_on(
        &self,
        chain: &Chain,
        raw: &str,
        caller: &str,
    ) -> Result<H256, RelayError> {
        let tx = raw::decode(raw)?;
        if tx.chain_id != chain.settings.chain_id {
            return Err(RelayError::WrongChain {
                chain: chain.name.clone(),
                expected: chain.settings.chain_id,
                got: tx.chain_id,
            });
        }
        self.deliver(chain, &tx, caller).await?;
        Ok(tx.hash)
    }

    /// One call at `chain`'s own endpoint; `params` as sent (`None` when left out).
    pub async fn chain_call(
        &self,
        chain: &Chain,
        method: &str,
        params: Option<Value>,
        caller: &str,
    ) -> Result<Value, RelayError> {
        let params = positional(params)?;
        match served(method).ok_or_else(|| RelayError::MethodNotFound(method.to_string()))? {
            Served::ChainId => Ok(json!(format!("{:#x}", chain.settings.chain_id))),
            Served::SendRaw => {
                let hash = self.send_on(chain, one_string(&params)?, caller).await?;
                Ok(json!(format!("{hash:#x}")))
            }
            Served::Forward(method) => {
                let bounds = ReadBounds {
                    chain: &chain.name,
                    max_call_gas: chain.settings.max_call_gas,
                };
                reads::check(method, &params, bounds)?;
                let _read = chain.client.admit(Budget::Router)?;
                answered(chain.client.call(Traffic::Callers, method, params).await?)
            }
        }
    }

    /// The receipt or the transaction of `hash`: from the chain it was sent to through routerd,
    /// else from the first configured chain that knows it; `null` when none does.
    pub async fn lookup(&self, what: Lookup, hash: &str) -> Result<Value, RelayError> {
        let hash = evm::parse_h256(hash)
            .ok_or_else(|| RelayError::InvalidParams("expected [0x + 64 hex digits]".into()))?;
        if let Some(chain) = self.sent_to(hash).await? {
            return ask_hash(chain, what, hash).await;
        }
        let answers =
            futures::future::join_all(self.chains.iter().map(|chain| ask_hash(chain, what, hash)))
                .await;
        let mut failure = None;
        let mut any_answer = false;
        for answer in answers {
            match answer {
                Ok(Value::Null) => any_answer = true,
                Ok(found) => return Ok(found),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        match failure {
            Some(e) if !any_answer => Err(e),
            _ => Ok(Value::Null),
        }
    }

    /// Forgets sent transactions past the retention, every [`FORGET_EVERY`], for good.
    pub async fn forget_periodically(self) {
        loop {
            let cutoff = unix_now().saturating_sub(self.retention_secs);
            match self.store.forget_sent(cutoff).await {
                Ok(0) => {}
                Ok(forgotten) => tracing::info!(forgotten, "forgot routed transactions"),
                Err(e) => tracing::error!(error = %e, "could not forget routed transactions"),
            }
            self.trim().await;
            tokio::time::sleep(FORGET_EVERY).await;
        }
    }

    /// Forgets the oldest sent transactions beyond `router.max_sent_remembered`.
    async fn trim(&self) {
        match self.store.forget_sent_beyond(self.max_remembered).await {
            Ok(0) => {}
            Ok(forgotten) => tracing::info!(forgotten, "forgot the oldest routed transactions"),
            Err(e) => tracing::error!(error = %e, "could not forget routed transactions"),
        }
    }

    /// Broadcasts `tx` on `chain`; when the node took it from routerd, remembers it and confirms
    /// its nonce for `caller`. A transaction the node had already (another sender's, or one
    /// mined long ago) is answered its hash and leaves nothing behind: no sent row, no
    /// reservation.
    async fn deliver(&self, chain: &Chain, tx: &SignedTx, caller: &str) -> Result<(), RelayError> {
        if broadcast(chain, tx).await? == Delivery::Known {
            tracing::debug!(chain = %chain.name, hash = ?tx.hash, "sent again: the node has it");
            return Ok(());
        }
        let now = unix_now();
        let key = RouterNonceKey {
            chain: chain.name.clone(),
            sender: tx.sender,
            caller: caller.to_string(),
        };
        let sent = Sent {
            chain: chain.name.clone(),
            at: now,
        };
        // Both writes at once: sled's group commit makes them one flush.
        let (remembered, confirmed) = futures::future::join(
            self.store.remember_sent(tx.hash, &sent),
            self.nonces.confirm(&key, tx.nonce, now),
        )
        .await;
        remembered?;
        confirmed?;
        // Trimmed every hundredth of the bound, beside the answer rather than before it: the
        // store holds at most about a hundredth more.
        let step = (self.max_remembered / 100).max(1);
        if self.since_trim.fetch_add(1, Ordering::Relaxed) + 1 >= step {
            self.since_trim.store(0, Ordering::Relaxed);
            let relay = self.clone();
            tokio::spawn(async move { relay.trim().await });
        }
        tracing::debug!(chain = %chain.name, hash = ?tx.hash, sender = ?tx.sender, nonce = tx.nonce, "relayed");
        Ok(())
    }

    /// The configured chain `hash` was sent to through routerd within the retention.
    async fn sent_to(&self, hash: H256) -> Result<Option<&Arc<Chain>>, RelayError> {
        let Some(sent) = self.store.sent(hash).await? else {
            return Ok(None);
        };
        if unix_now().saturating_sub(sent.at) >= self.retention_secs {
            return Ok(None);
        }
        Ok(self.chain(&sent.chain))
    }
}

/// What the node's one answer to a send says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// The node took it from routerd.
    Sent,
    /// The node knew it already or had it mined: routerd sent nothing new.
    Known,
}

/// Sends `tx`, under the router's read budget; the node's one answer decides, and routerd asks
/// nothing more of its own (access.md §3c). Nodes answer a resend of a pending transaction
/// `already known` and of a mined one `nonce too low`, the words they also have for another
/// transaction at a used nonce: both are answered the hash, whose receipt then tells the wallet.
async fn broadcast(chain: &Chain, tx: &SignedTx) -> Result<Delivery, RelayError> {
    let raw = json!(evm::hex_bytes(&tx.raw));
    let _read = chain.client.admit(Budget::Router)?;
    match chain
        .client
        .call(Traffic::Callers, "eth_sendRawTransaction", vec![raw])
        .await?
    {
        Ok(_) => Ok(Delivery::Sent),
        Err(refusal) => match refusal.refusal() {
            Refusal::AlreadyKnown | Refusal::NonceTooLow => Ok(Delivery::Known),
            _ => Err(RelayError::Node(refusal)),
        },
    }
}

async fn ask_hash(chain: &Chain, what: Lookup, hash: H256) -> Result<Value, RelayError> {
    let params = vec![json!(format!("{hash:#x}"))];
    let _read = chain.client.admit(Budget::Router)?;
    answered(
        chain
            .client
            .call(Traffic::Callers, what.method(), params)
            .await?,
    )
}

fn answered(answer: Result<Value, RpcError>) -> Result<Value, RelayError> {
    answer.map_err(RelayError::Node)
}

/// JSON-RPC params as the positional list an upstream call takes.
fn positional(params: Option<Value>) -> Result<Vec<Value>, RelayError> {
    match params {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(values)) => Ok(values),
        Some(_) => Err(RelayError::InvalidParams(
            "expected an array of positional params".into(),
        )),
    }
}

/// The one string param of `eth_sendRawTransaction`.
fn one_string(params: &[Value]) -> Result<&str, RelayError> {
    match params {
        [Value::String(raw)] => Ok(raw),
        _ => Err(RelayError::InvalidParams(
            "expected [\"0x<signed transaction>\"]".into(),
        )),
    }
}
