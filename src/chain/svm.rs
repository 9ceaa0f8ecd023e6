//! One Solana cluster's upstream: the same jsonrpsee transport as an EVM chain (batches, failover
//! across `rpc_urls`, cool-downs; [`ChainClient`]), and the Solana methods routerd calls, their
//! answers read into typed values here once. What a payment transaction means is `svm`'s.
//!
//! Verify asks one call (`simulateTransaction` answering the payment's accounts: `payment.rs`).
//! Settle asks it again at `processed` right before it sends, sends with `sendTransaction`, and
//! its cluster's follower asks for every followed signature in one batch per tick (`follow.rs`);
//! once a status says a transaction reached the commitment, the settlement is decided on the
//! transaction's own record (`getTransaction`).

mod follow;
mod payment;
mod record;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::{json, Value};

use super::client::{Call, CallResult, ChainClient, ClientLimits, Identity, RpcError, Unreachable};
use super::traffic::Traffic;
use crate::config::SolanaChainSettings;
use crate::svm::{mint, MintRefusal, Pubkey};
pub use follow::{FollowRead, Looks};
pub use payment::PaymentAccounts;
use payment::Simulated;
pub use record::TransactionRecord;

/// Requests to one URL at once, and calls per coalesced request: a verify is one call.
const MAX_IN_FLIGHT: usize = 64;
const MAX_BATCH_CALLS: usize = 64;
/// How long a slot read for the status route serves every status asked meanwhile: about a slot.
const SLOT_READ_FRESH: Duration = Duration::from_millis(400);

#[derive(Debug, Clone, thiserror::Error)]
pub enum SolanaError {
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    #[error("{method}: {error}")]
    Rpc {
        method: &'static str,
        error: RpcError,
    },
    #[error("{method}: unexpected answer: {what}")]
    Malformed {
        method: &'static str,
        what: &'static str,
    },
}

/// A configured Solana cluster.
pub struct SolanaChain {
    /// The v1 network name (the key of its `[chains.*]`).
    pub name: String,
    pub settings: SolanaChainSettings,
    client: Arc<ChainClient>,
    /// The last slot read for the status route: one read serves every status asked within a
    /// slot time.
    slot_read: tokio::sync::Mutex<Option<SlotRead>>,
}

/// A slot read for the status route.
#[derive(Debug, Clone, Copy)]
struct SlotRead {
    at: tokio::time::Instant,
    /// `None` when the read failed.
    slot: Option<u64>,
    /// Read again within the slot time for a transaction that landed after the last read.
    again: bool,
}

/// Whether a slot read serves a status.
#[derive(Debug, PartialEq, Eq)]
enum Serves {
    Yes(Option<u64>),
    /// Fresh, but older than the transaction asked about: read once more.
    ReadAgain,
    Stale,
}

impl SlotRead {
    fn serves(&self, at_least: u64) -> Serves {
        if self.at.elapsed() >= SLOT_READ_FRESH {
            return Serves::Stale;
        }
        if self.again || self.slot.is_none_or(|slot| slot >= at_least) {
            return Serves::Yes(self.slot);
        }
        Serves::ReadAgain
    }
}

/// An SPL Token (or Token-2022) account, as its base layout says: both programs share it (mint,
/// owner, amount, then the delegate and what it may still move).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenAccount {
    /// The program that owns the account.
    pub program: Pubkey,
    pub mint: Pubkey,
    pub owner: Pubkey,
    pub amount: u64,
    pub delegate: Option<Delegation>,
}

/// A token account's delegate, and how much of the account it may still move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delegation {
    pub delegate: Pubkey,
    pub amount: u64,
}

impl TokenAccount {
    /// What `authority` can move out of the account: the rest of its allowance for its
    /// delegate, else all of it (its owner; a Token-2022 mint's permanent delegate, which only
    /// the simulation can tell from anyone else).
    pub fn spendable_by(&self, authority: &Pubkey) -> u64 {
        match self.delegate {
            Some(d) if d.delegate == *authority && *authority != self.owner => {
                d.amount.min(self.amount)
            }
            _ => self.amount,
        }
    }
}

/// What verify reads of a payment, in one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentState {
    /// `None` when the account does not exist or is no token account.
    pub source: Option<TokenAccount>,
    pub destination: Option<TokenAccount>,
    /// Why the mint's extensions refuse it (`None` for a mint without such extensions, or none
    /// read: the simulation fails a transfer of a mint that does not exist).
    pub mint_refusal: Option<MintRefusal>,
    /// `simulateTransaction`'s error, as the node wrote it; `None` when the simulation succeeded.
    pub simulation_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureStatus {
    pub slot: u64,
    /// The transaction's error, as the node wrote it; `None` when it ran.
    pub error: Option<String>,
    /// Whether it reached the configured commitment.
    pub committed: bool,
    /// Slots confirmed above it; `None` once the cluster has rooted (finalized) it.
    pub confirmations: Option<u64>,
}

/// Commitment levels in order.
fn rank(level: &str) -> u8 {
    match level {
        "finalized" => 2,
        "confirmed" => 1,
        _ => 0,
    }
}

impl SolanaChain {
    /// Each URL is used only once it answered `genesis_hash` (`getGenesisHash`), the cluster's.
    pub fn new(
        name: &str,
        settings: &SolanaChainSettings,
        genesis_hash: &str,
    ) -> Result<Arc<Self>, String> {
        let limits = ClientLimits {
            timeout: Duration::from_millis(settings.request_timeout_ms),
            max_in_flight: MAX_IN_FLIGHT,
            max_batch_calls: MAX_BATCH_CALLS,
            max_caller_reads: settings.max_caller_reads,
        };
        let identity = Identity {
            method: "getGenesisHash",
            expected: genesis_hash.to_string(),
        };
        let client = ChainClient::with_identity(name, &settings.rpc_urls, limits, Some(identity))?;
        Ok(Arc::new(Self {
            name: name.to_string(),
            settings: settings.clone(),
            client,
            slot_read: tokio::sync::Mutex::new(None),
        }))
    }

    pub fn client(&self) -> &ChainClient {
        &self.client
    }

    fn commitment(&self) -> &'static str {
        self.settings.commitment.name()
    }

    /// Asks every URL for its genesis hash now (at start): the URLs on another cluster, by
    /// name, with the hash each answered; an error when no URL answered. A URL that did not
    /// answer is asked before its first use, on failover too.
    pub async fn check_genesis(&self) -> Result<Vec<(String, String)>, SolanaError> {
        Ok(self.client.check_identities().await?)
    }

    /// The accounts a payment moves funds between and its mint, before the transfer, and the
    /// simulation of the transaction as the payer signed it (`wire`: base64): one call when the
    /// simulation runs.
    pub async fn payment_state(
        &self,
        payment: &PaymentAccounts<'_>,
        wire: &str,
    ) -> Result<PaymentState, SolanaError> {
        self.read_payment(payment, wire, self.commitment()).await
    }

    /// What settle reads right before it sends: the same as [`Self::payment_state`] of the fee
    /// payer's signed transaction (`wire`), at `processed`, so that a source drained a slot ago
    /// is seen.
    pub async fn presend_state(
        &self,
        payment: &PaymentAccounts<'_>,
        wire: &str,
    ) -> Result<PaymentState, SolanaError> {
        self.read_payment(payment, wire, "processed").await
    }

    async fn read_payment(
        &self,
        payment: &PaymentAccounts<'_>,
        wire: &str,
        commitment: &str,
    ) -> Result<PaymentState, SolanaError> {
        let call = payment::simulate_call(payment, wire, commitment);
        let answer = self.caller_call(call).await?;
        match payment::read_simulation(answer, payment)? {
            Simulated::Read(state) => Ok(*state),
            Simulated::ReadApart(error) => {
                let call = payment::accounts_call(payment, commitment);
                payment::read_accounts(self.caller_call(call).await?, error)
            }
        }
    }

    /// One call of a caller's, in a batch: those of verifies ready together share a request.
    async fn caller_call(&self, call: Call) -> Result<CallResult, SolanaError> {
        let answers = self.client.batch(Traffic::Callers, &[call]).await?;
        let answer = answers.into_iter().next();
        Ok(answer.expect("the client answers every call of a batch"))
    }

    /// What each mint's extensions say (`crate::svm::mint`), in one `getMultipleAccounts`:
    /// read once at start, so that a configured mint that would pay the payee less is named
    /// before anything is served. A mint that does not exist answers `None`.
    pub async fn mint_refusals(
        &self,
        mints: &[Pubkey],
    ) -> Result<Vec<Option<MintRefusal>>, SolanaError> {
        const METHOD: &str = "getMultipleAccounts";
        let config = json!({"encoding": "base64", "commitment": self.commitment()});
        let addresses: Vec<String> = mints.iter().map(Pubkey::to_string).collect();
        let answer = self
            .client
            .call(Traffic::Own, METHOD, vec![json!(addresses), config])
            .await?;
        let accounts = context_value(METHOD, answer)?;
        let accounts = accounts.as_array().filter(|a| a.len() == mints.len());
        let accounts = accounts.ok_or(SolanaError::Malformed {
            method: METHOD,
            what: "not one account per mint",
        })?;
        Ok(accounts.iter().map(mint_refusal).collect())
    }

    /// The lamports each of `accounts` holds at the commitment, in one batch (`getBalance` each).
    pub async fn balances(&self, accounts: &[Pubkey]) -> Result<Vec<u64>, SolanaError> {
        const METHOD: &str = "getBalance";
        let config = json!({"commitment": self.commitment()});
        let calls: Vec<Call> = accounts
            .iter()
            .map(|a| Call::new(METHOD, vec![json!(a.to_string()), config.clone()]))
            .collect();
        let answers = self.client.batch(Traffic::Own, &calls).await?;
        answers
            .into_iter()
            .map(|answer| {
                context_value(METHOD, answer)?
                    .as_u64()
                    .ok_or(SolanaError::Malformed {
                        method: METHOD,
                        what: "not a number of lamports",
                    })
            })
            .collect()
    }

    /// The cluster's slot, read at most once per slot time however many statuses ask: the
    /// status route's confirmations cost no upstream request per request (access.md 3c). A
    /// slot read before `at_least` (a transaction that landed since) is read again, once per
    /// slot time: at most two reads per slot time whatever the records say. `None` when the
    /// cluster could not be read (also remembered for a slot time).
    pub async fn recent_slot(&self, at_least: u64) -> Option<u64> {
        let mut read = self.slot_read.lock().await;
        let again = match read.map(|last| last.serves(at_least)) {
            Some(Serves::Yes(slot)) => return slot,
            Some(Serves::ReadAgain) => true,
            Some(Serves::Stale) | None => false,
        };
        let config = json!({"commitment": self.commitment()});
        let answer = self
            .client
            .call(Traffic::Callers, "getSlot", vec![config])
            .await;
        let slot = answer.ok().and_then(Result::ok).and_then(|v| v.as_u64());
        let at = tokio::time::Instant::now();
        *read = Some(SlotRead { at, slot, again });
        slot
    }

    /// Sends a signed transaction (`wire`: base64) without preflight: settle simulated it.
    /// Sending it again is harmless: the cluster runs a signature once.
    pub async fn send_transaction(&self, wire: &str) -> Result<(), SolanaError> {
        const METHOD: &str = "sendTransaction";
        let config = json!({"encoding": "base64", "skipPreflight": true});
        let answer = self
            .client
            .call(Traffic::Own, METHOD, vec![json!(wire), config])
            .await?;
        answer.map(drop).map_err(|error| SolanaError::Rpc {
            method: METHOD,
            error,
        })
    }

    /// The transaction `signature` (base58) as the cluster recorded it at the commitment, or
    /// `None` while it has no record of it: what a settlement's outcome is decided on.
    pub async fn transaction_record(
        &self,
        signature: &str,
    ) -> Result<Option<TransactionRecord>, SolanaError> {
        let config = json!({
            "commitment": self.commitment(), "encoding": "json", "maxSupportedTransactionVersion": 0,
        });
        let answer = self
            .client
            .call(
                Traffic::Own,
                "getTransaction",
                vec![json!(signature), config],
            )
            .await?;
        record::read(answer)
    }

    fn signature_status(&self, status: &Value) -> Option<SignatureStatus> {
        let slot = status.get("slot")?.as_u64()?;
        let level = status
            .get("confirmationStatus")
            .and_then(Value::as_str)
            .unwrap_or("processed");
        Some(SignatureStatus {
            slot,
            error: status
                .get("err")
                .filter(|err| !err.is_null())
                .map(Value::to_string),
            committed: rank(level) >= rank(self.commitment()),
            confirmations: status.get("confirmations").and_then(Value::as_u64),
        })
    }
}

/// `getLatestBlockhash`'s `lastValidBlockHeight`.
fn last_valid_height(answer: Result<Value, RpcError>) -> Result<u64, SolanaError> {
    const METHOD: &str = "getLatestBlockhash";
    context_value(METHOD, answer)?
        .get("lastValidBlockHeight")
        .and_then(Value::as_u64)
        .ok_or(SolanaError::Malformed {
            method: METHOD,
            what: "no lastValidBlockHeight",
        })
}

/// `{context, value}`: the value, or why there is none.
fn context_value(
    method: &'static str,
    answer: Result<Value, RpcError>,
) -> Result<Value, SolanaError> {
    let mut answer = answer.map_err(|error| SolanaError::Rpc { method, error })?;
    match answer.get_mut("value") {
        Some(value) => Ok(value.take()),
        None => Err(SolanaError::Malformed {
            method,
            what: "no value",
        }),
    }
}

fn owner(account: &Value) -> Option<Pubkey> {
    Pubkey::from_str(account.get("owner")?.as_str()?).ok()
}

/// An account's data (`encoding: base64`).
fn data(account: &Value) -> Option<Vec<u8>> {
    BASE64.decode(account.get("data")?.get(0)?.as_str()?).ok()
}

/// What the mint account's extensions say (`crate::svm::mint`); a mint whose data does not
/// decode is refused as malformed, one that does not exist is left to the simulation.
fn mint_refusal(account: &Value) -> Option<MintRefusal> {
    if account.is_null() {
        return None;
    }
    match data(account) {
        Some(data) => mint::refusal(&data),
        None => Some(MintRefusal::Malformed),
    }
}

/// An account (`encoding: base64`) read as a token account, when its data has that layout.
fn token_account(account: &Value) -> Option<TokenAccount> {
    let program = owner(account)?;
    let data = data(account)?;
    let key = |at: usize| Pubkey::try_from(data.get(at..at + 32)?).ok();
    let word = |at: usize| Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?));
    // The delegate is a `COption<Pubkey>` (a u32 tag, then the key) at 72, and what it may
    // still move a u64 at 121, after the state and the `COption<u64>` of a native account.
    let delegate = match data.get(72..76) {
        Some([1, 0, 0, 0]) => Some(Delegation {
            delegate: key(76)?,
            amount: word(121)?,
        }),
        _ => None,
    };
    Some(TokenAccount {
        program,
        mint: key(0)?,
        owner: key(32)?,
        amount: word(64)?,
        delegate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(owner: &Pubkey, data: &[u8]) -> Value {
        json!({"owner": owner.to_string(), "lamports": 1, "data": [BASE64.encode(data), "base64"]})
    }

    #[test]
    fn a_token_account_is_read_from_its_layout() {
        let (program, mint, holder) = (
            Pubkey::new_unique(),
            Pubkey::new_unique(),
            Pubkey::new_unique(),
        );
        let mut data = [mint.to_bytes(), holder.to_bytes()].concat();
        data.extend(1234u64.to_le_bytes());
        data.extend([0; 93]);
        let read = token_account(&account(&program, &data));
        let plain = TokenAccount {
            program,
            mint,
            owner: holder,
            amount: 1234,
            delegate: None,
        };
        assert_eq!(read, Some(plain));
        // A delegate that may still move 200.
        let delegate = Pubkey::new_unique();
        data[72..76].copy_from_slice(&1u32.to_le_bytes());
        data[76..108].copy_from_slice(&delegate.to_bytes());
        data[121..129].copy_from_slice(&200u64.to_le_bytes());
        let delegation = Some(Delegation {
            delegate,
            amount: 200,
        });
        let read = token_account(&account(&program, &data)).expect("a token account");
        assert_eq!(read.delegate, delegation);
        assert_eq!(read.spendable_by(&holder), 1234, "the owner: all of it");
        assert_eq!(
            read.spendable_by(&delegate),
            200,
            "the delegate: its allowance"
        );
        assert_eq!(
            read.spendable_by(&Pubkey::new_unique()),
            1234,
            "anyone else: the simulation decides"
        );
        let poor = TokenAccount { amount: 50, ..read };
        assert_eq!(
            poor.spendable_by(&delegate),
            50,
            "no more than the account holds"
        );
        assert_eq!(token_account(&account(&program, &data[..70])), None);
        assert_eq!(token_account(&Value::Null), None);
        assert_eq!(owner(&account(&program, &[])), Some(program));
    }

    #[test]
    fn a_slot_read_serves_a_slot_time_and_is_read_again_once_for_a_newer_landing() {
        let now = tokio::time::Instant::now();
        let read = |slot, again| SlotRead {
            at: now,
            slot,
            again,
        };
        assert_eq!(read(Some(10), false).serves(10), Serves::Yes(Some(10)));
        assert_eq!(read(Some(10), false).serves(11), Serves::ReadAgain);
        assert_eq!(read(Some(10), true).serves(99), Serves::Yes(Some(10)));
        assert_eq!(read(None, false).serves(99), Serves::Yes(None));
        let old = SlotRead {
            at: now - SLOT_READ_FRESH,
            ..read(Some(10), false)
        };
        assert_eq!(old.serves(1), Serves::Stale);
    }

    #[test]
    fn an_answer_without_a_value_is_malformed() {
        assert!(matches!(
            context_value("m", Ok(json!({"context": {}}))),
            Err(SolanaError::Malformed { .. })
        ));
        assert_eq!(
            context_value("m", Ok(json!({"context": {}, "value": 3}))).unwrap(),
            json!(3)
        );
    }
}
