//! The wallet's side of the router: a transaction signed from an `eth_routerTransaction` answer
//! is sent through routerd and followed through it, so a wallet needs no RPC URL of its own.
//!
//! Invariants: a signed transaction goes only to the configured chain its chain id names (never
//! to a guess); the hash answered is the one routerd computed from the raw bytes, so the same
//! raw transaction sent again is answered the same hash whatever the node's words, once the
//! chain shows it has that very transaction; a send the node took is remembered (hash -> chain,
//! for `router.sent_retention_secs`) and confirms the caller's nonce reservation before the
//! answer.

use std::sync::Arc;
use std::time::Duration;

use ethers_core::types::H256;
use serde_json::{json, Value};

use super::nonces::NonceBook;
use super::raw::{self, RawError, SignedTx};
use super::served::{served, Served};
use crate::chain::Traffic;
use crate::chain::{Chain, RpcError, Unreachable};
use crate::clock::unix_now;
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
    #[error("the method {0} does not exist or is not available here")]
    MethodNotFound(String),
    /// The node's own answer (a refusal, a revert): passed on with its code and data.
    #[error("{}", .0.message)]
    Node(RpcError),
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
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

#[derive(Clone)]
pub struct Relay {
    /// The router's chains, in configured order (the order unknown hashes are looked up in).
    chains: Vec<Arc<Chain>>,
    nonces: NonceBook,
    store: Storage,
    retention_secs: u64,
}

impl Relay {
    pub fn new(
        chains: Vec<Arc<Chain>>,
        nonces: NonceBook,
        store: Storage,
        retention_secs: u64,
    ) -> Self {
        Self {
            chains,
            nonces,
            store,
            retention_secs,
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
            tokio::time::sleep(FORGET_EVERY).await;
        }
    }

    /// Broadcasts `tx` on `chain`, then remembers it and confirms its nonce for `caller`.
    async fn deliver(&self, chain: &Chain, tx: &SignedTx, caller: &str) -> Result<(), RelayError> {
        broadcast(chain, tx).await?;
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

/// Sends `tx`; a node that refuses it is asked whether it has this very transaction (sent
/// before, pending or mined): then the send succeeded, whatever the refusal said.
async fn broadcast(chain: &Chain, tx: &SignedTx) -> Result<(), RelayError> {
    let raw = json!(evm::hex_bytes(&tx.raw));
    let refusal = match chain
        .client
        .call(Traffic::Callers, "eth_sendRawTransaction", vec![raw])
        .await?
    {
        Ok(_) => return Ok(()),
        Err(refusal) => refusal,
    };
    match ask_hash(chain, Lookup::Transaction, tx.hash).await {
        Ok(Value::Null) | Err(_) => Err(RelayError::Node(refusal)),
        Ok(_) => {
            tracing::debug!(chain = %chain.name, hash = ?tx.hash, refusal = %refusal, "sent again: the chain has it");
            Ok(())
        }
    }
}

async fn ask_hash(chain: &Chain, what: Lookup, hash: H256) -> Result<Value, RelayError> {
    let params = vec![json!(format!("{hash:#x}"))];
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
