//! Solana settle (svm.md §4): one transaction, no nonce lanes. Verify as `/verify` does, sign as
//! fee payer, claim (the claim stores the signed transaction: the write-ahead, made durable before
//! the first `sendTransaction`), then follow the signature until it reaches the commitment, fails
//! on chain, or can no longer land; the same signed bytes are sent again while they may land.
//!
//! A payment's key is its network and the SHA-256 of its fee payer signature: ed25519 signing is
//! deterministic and the message names its fee payer, so one message has one such signature, and
//! the status route finds the payment by the transaction id callers were told.

use std::sync::Arc;
use std::time::Duration;

use ethers_core::types::{Address, H256, U256};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tracing::Instrument;

use super::{unreachable, Failure, Payment, SvmExact};
use crate::chain::svm::SolanaChain;
use crate::clock::unix_now;
use crate::facilitator::cooldown::Cooldown;
use crate::facilitator::protocol::svm::Refused;
use crate::facilitator::settlement::{caller_of, key_taken, Caller, SettleError};
use crate::ledger::{Account, Asking, Lost, PaymentKey, Record, State, SvmSettlement};
use crate::store::{Claim, Limits, Storage, StoreError};
use crate::svm::{Pubkey, Signature, SignedTransaction, Transfer};

/// How often a followed signature is read.
const POLL: Duration = Duration::from_millis(400);
/// How often a transaction the cluster does not know yet is sent again.
const RESEND_EVERY: Duration = Duration::from_secs(2);

/// What a Solana settle came to, in no version's words.
#[derive(Debug)]
pub enum SvmSettled {
    /// Refused before anything was signed or sent.
    Refused(Refused),
    /// The settlement ended: landed (succeeded or failed on chain) or expired.
    Ended(Box<Record>),
    /// Another request's settlement of the same transaction: never its success.
    Duplicate { signature: String, ended: bool },
    /// Sent, its outcome still unknown at the deadline: the signature to follow.
    Pending { signature: String },
}

/// The key a Solana payment is stored under: its network and its fee payer signature's digest.
pub fn payment_key(network: &str, signature: &Signature) -> PaymentKey {
    PaymentKey::svm(network, Sha256::digest(signature.as_ref()).into())
}

impl SvmExact {
    /// Settles one payment for `asking`; waits at most `wait` (and the chain's
    /// `settle_timeout_secs`) for the outcome.
    pub async fn settle(
        &self,
        ledger: &Storage,
        cooldown: &Arc<Cooldown>,
        payment: &Payment,
        asking: &Asking,
        wait: Duration,
    ) -> Result<SvmSettled, SettleError> {
        let network = self
            .network(payment.network)
            .expect("lowered onto a served network");
        let chain = network.chain.clone();
        let wait = wait.min(Duration::from_secs(chain.settings.settle_timeout_secs));
        let deadline = Instant::now() + wait;
        let transfer = match self.check_local(payment) {
            Ok(transfer) => transfer,
            Err(failure) => return Ok(SvmSettled::Refused(failure.into())),
        };
        let signed = self.sign(payment);
        let key = payment_key(payment.network, &signed.signature);
        if let Some(record) = ledger.get(&key).await? {
            // Boxed, as each step the wait leaves behind: a settlement waiting for its
            // confirmation holds only the wait.
            return Box::pin(known(
                ledger, cooldown, &chain, record, &key, asking, deadline,
            ))
            .await;
        }
        let verified = match Box::pin(self.verify(ledger, payment)).await? {
            Ok(verified) => verified,
            Err(failure) => return Ok(SvmSettled::Refused(failure.into())),
        };
        if let Err(failure) = cooled_down(cooldown, &transfer).await? {
            return Ok(SvmSettled::Refused(failure.into()));
        }
        let last_valid_block_height = Box::pin(chain.last_valid_block_height())
            .await
            .map_err(|e| unreachable(&chain, e))?;
        let record = new_record(
            &key,
            &transfer,
            asking,
            SvmSettlement {
                signature: signed.signature.to_string(),
                transaction: signed.wire,
                last_valid_block_height,
                payer: verified.transfer.authority.to_string(),
                pay_to: payment.pay_to.to_string(),
                mint: transfer.mint.to_string(),
                amount: payment.amount,
                error: None,
            },
            message_digest(payment),
        );
        // The source's settlements under way and this one stay within what verify read it holds.
        let limits = Limits::balance(U256::from(verified.balance));
        match ledger.claim(&key, &record, None, &limits).await? {
            Claim::Claimed => {}
            Claim::Exists(existing) => {
                let known = known(ledger, cooldown, &chain, *existing, &key, asking, deadline);
                return Box::pin(known).await;
            }
            Claim::KeyTaken => return Err(key_taken(&record)),
            Claim::OverLimit { exposed } => {
                let failure = Failure::Exposed {
                    balance: verified.balance,
                    exposed: exposed.min(U256::from(u64::MAX)).as_u64(),
                };
                return Ok(SvmSettled::Refused(failure.into()));
            }
            Claim::OverAllowance { .. } | Claim::Permit2Clash(_) => {
                unreachable!("a Solana claim spends no Permit2 allowance or nonce")
            }
        }
        // The write-ahead: on disk before the transaction is ever sent.
        ledger.save(&[&record], true).await?;
        let signature = record_signature(&record);
        let books = (ledger.clone(), cooldown.clone());
        // The follower runs on: its sends and status reads are traced in the settlement's span.
        let span = settlement_span(payment, &signature);
        let follower = tokio::spawn(follow(chain, books, record, None).instrument(span));
        let outcome = match tokio::time::timeout_at(deadline, follower).await {
            Ok(Ok(Ok(Some(ended)))) => Ok(SvmSettled::Ended(Box::new(ended))),
            Ok(Ok(Err(e))) => Err(e.into()),
            Ok(Ok(Ok(None))) | Ok(Err(_)) | Err(_) => Ok(SvmSettled::Pending { signature }),
        };
        pass_on(ledger, outcome, &key, asking).await
    }

    /// The stored settlement of this payment's transaction, if any: verify refuses a transaction
    /// already claimed, as it refuses an EVM authorization already claimed (access.md §1).
    pub async fn settlement_of(
        &self,
        ledger: &Storage,
        payment: &Payment,
    ) -> Result<Option<Record>, StoreError> {
        let signature = self.sign(payment).signature;
        ledger.get(&payment_key(payment.network, &signature)).await
    }

    /// The transaction with the fee payer's signature; lowering made sure `extra.feePayer` is one
    /// of this facilitator's.
    fn sign(&self, payment: &Payment) -> SignedTransaction {
        let fee_payer = self
            .fee_payers
            .key(&payment.fee_payer)
            .expect("lowered: a fee payer of this facilitator");
        payment.transaction.sign_as_fee_payer(fee_payer)
    }

    /// Follows every unfinished Solana settlement of a served network again (at start): status,
    /// sending again while it may land, expiry. Answers how many.
    pub fn resume(
        &self,
        ledger: &Storage,
        cooldown: &Arc<Cooldown>,
        records: Vec<Record>,
    ) -> usize {
        let mut resumed = 0;
        for record in records {
            let Some(network) = self.network(&record.network) else {
                tracing::warn!(payment = %record.key(), "Solana settlement of a network no longer served; left in the store");
                continue;
            };
            let books = (ledger.clone(), cooldown.clone());
            tokio::spawn(follow(network.chain.clone(), books, record, None));
            resumed += 1;
        }
        resumed
    }
}

/// The address a token account is known by in the ledger's accounts and the revert cooldown: its
/// first 20 bytes.
fn account_address(account: &Pubkey) -> Address {
    Address::from_slice(&account.to_bytes()[..20])
}

/// The ledger account a payment's exposure counts against: its mint and source token account,
/// as [`new_record`] stores them.
pub(super) fn exposure_account(network: &str, transfer: &Transfer) -> Account {
    Account {
        network: network.to_string(),
        asset: account_address(&transfer.mint),
        payer: account_address(&transfer.source),
    }
}

/// The revert cooldown of the payment's source token account (access.md §2).
pub async fn cooled_down(
    cooldown: &Cooldown,
    transfer: &Transfer,
) -> Result<Result<(), Failure>, StoreError> {
    let source = account_address(&transfer.source);
    Ok(match cooldown.refuses_stored(source).await? {
        Some(left) => Err(Failure::CooledDown { left }),
        None => Ok(()),
    })
}

/// The message's digest, kept as the record's `digest`: a Solana key already binds the message.
fn message_digest(payment: &Payment) -> H256 {
    H256(payment.transaction.message_hash().0)
}

/// The span of one Solana settlement, from its claim until the follower has its end, a child
/// of the request's: `signer` is the fee payer, `transaction` the signature, `block` the slot
/// it landed in.
fn settlement_span(payment: &Payment, signature: &str) -> tracing::Span {
    let empty = tracing::field::Empty;
    tracing::info_span!(
        "settlement",
        network = payment.network,
        signer = %payment.fee_payer,
        transaction = signature,
        block = empty,
        success = empty,
    )
}

fn record_signature(record: &Record) -> String {
    record
        .svm
        .as_ref()
        .map(|s| s.signature.clone())
        .unwrap_or_default()
}

fn new_record(
    key: &PaymentKey,
    transfer: &Transfer,
    asking: &Asking,
    svm: SvmSettlement,
    digest: H256,
) -> Record {
    Record {
        network: key.network.clone(),
        token: account_address(&transfer.mint),
        payer: account_address(&transfer.source),
        pay_to: Default::default(),
        value: U256::from(svm.amount),
        nonce: key.nonce,
        valid_before: 0,
        digest,
        method: Default::default(),
        approves_permit2: false,
        via: None,
        sender: None,
        calldata: Default::default(),
        gas_limit: 0,
        request: asking.tag.clone(),
        payment_id: asking.payment_id.clone(),
        state: State::Claimed,
        attempts: Vec::new(),
        outcome: None,
        lost: false,
        finished_at: None,
        svm: Some(svm),
    }
}

/// A payment already claimed: the claimant (its `Idempotency-Key`, or the identical request a
/// pending answer passed the outcome on to) is told the outcome, following the transaction
/// until the deadline; any other request is told the signature, as a failure.
async fn known(
    ledger: &Storage,
    cooldown: &Arc<Cooldown>,
    chain: &Arc<SolanaChain>,
    record: Record,
    key: &PaymentKey,
    asking: &Asking,
    deadline: Instant,
) -> Result<SvmSettled, SettleError> {
    let caller = match caller_of(record.request.as_ref(), asking.tag.as_ref())? {
        Caller::Another if ledger.take_pass(key, &asking.pass).await? => Caller::Claimant,
        caller => caller,
    };
    let signature = record_signature(&record);
    match (&record.outcome, caller) {
        // A failure is nobody's success: everybody is told it.
        (Some(outcome), Caller::Another) if !outcome.success => {
            return Ok(SvmSettled::Ended(Box::new(record)))
        }
        (outcome, Caller::Another) => {
            return Ok(SvmSettled::Duplicate {
                signature,
                ended: outcome.is_some(),
            })
        }
        (Some(_), Caller::Claimant) => return Ok(SvmSettled::Ended(Box::new(record))),
        (None, Caller::Claimant) => {}
    }
    let books = (ledger.clone(), cooldown.clone());
    let outcome = match follow(chain.clone(), books, record, Some(deadline)).await? {
        Some(ended) => Ok(SvmSettled::Ended(Box::new(ended))),
        None => Ok(SvmSettled::Pending { signature }),
    };
    pass_on(ledger, outcome, key, asking).await
}

/// A claimant told "pending" passes the outcome on to its identical next request (access.md §1).
async fn pass_on(
    ledger: &Storage,
    outcome: Result<SvmSettled, SettleError>,
    key: &PaymentKey,
    asking: &Asking,
) -> Result<SvmSettled, SettleError> {
    if matches!(outcome, Ok(SvmSettled::Pending { .. })) && asking.passes_on() {
        if let Err(e) = ledger.grant_pass(key, &asking.pass).await {
            tracing::warn!(payment = %key, error = %e, "could not keep the pending answer's pass");
        }
    }
    outcome
}

/// Follows a stored settlement until it ends (stored durably), or answers `None` once `deadline`
/// passes. Only the chain decides: the signature at the commitment (success, or
/// its error on chain), or unknown once the block height is past the blockhash's last valid one.
async fn follow(
    chain: Arc<SolanaChain>,
    (ledger, cooldown): (Storage, Arc<Cooldown>),
    mut record: Record,
    deadline: Option<Instant>,
) -> Result<Option<Record>, StoreError> {
    let svm = record.svm.clone().expect("a Solana record");
    let mut sent_at: Option<Instant> = None;
    loop {
        match chain.track(&svm.signature).await {
            Ok(tracked) => match tracked.status {
                Some(status) if status.committed => {
                    let failed = status.error.is_some();
                    let span = tracing::Span::current();
                    span.record("block", status.slot);
                    span.record("success", !failed);
                    record.landed(status.slot, status.error, unix_now());
                    ledger.save(&[&record], true).await?;
                    if failed {
                        cooldown.impose(record.payer).await;
                    }
                    return Ok(Some(record));
                }
                // Landed, not yet at the commitment.
                Some(_) => {}
                None if tracked.block_height > svm.last_valid_block_height => {
                    record.expire(Lost::BlockHeightExceeded, unix_now());
                    ledger.save(&[&record], true).await?;
                    return Ok(Some(record));
                }
                None if sent_at.is_none_or(|at| at.elapsed() >= RESEND_EVERY) => {
                    if let Err(e) = chain.send_transaction(&svm.transaction).await {
                        tracing::warn!(chain = %chain.name, signature = %svm.signature, error = %e, "sendTransaction failed; trying again");
                    }
                    sent_at = Some(Instant::now());
                }
                None => {}
            },
            Err(e) => {
                tracing::warn!(chain = %chain.name, signature = %svm.signature, error = %e, "could not read the settlement's status; trying again")
            }
        }
        if deadline.is_some_and(|d| Instant::now() + POLL >= d) {
            return Ok(None);
        }
        tokio::time::sleep(POLL).await;
    }
}
