//! Solana settle (svm.md §4): one transaction, no nonce lanes. Sign as fee payer, verify as
//! `/verify` does but read at `processed`, in the one request that prepares the send (a refusal
//! there stores nothing: the payment stays unclaimed), claim (the claim stores the signed transaction:
//! the write-ahead, made durable before the first `sendTransaction`), send, then wait on the
//! cluster's follower (`follower.rs`) until the transaction's record shows it ran at the
//! commitment, or it can no longer land.
//!
//! A payment's key is its network and the SHA-256 of its fee payer signature: ed25519 signing is
//! deterministic and the message names its fee payer, so one message has one such signature, and
//! the status route finds the payment by the transaction id callers were told.

use std::sync::Arc;
use std::time::Duration;

use ethers_core::types::{H256, U256};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tracing::Instrument;

use super::follower::{self, Follower};
use super::wire::Refused;
use super::{payment_accounts, Failure, Payment, SvmExact, SvmNetwork};
use crate::chain::svm::SolanaChain;
use crate::chain::Budget;
use crate::facilitator::outcome::SettleError;
use crate::facilitator::settlement::cooldown::Cooldown;
use crate::facilitator::settlement::{caller_of, key_taken, pass_on, with_pass};
use crate::facilitator::settlement::{Answer, Caller};
use crate::ledger::{Account, Asking, PaymentKey, Record, SvmSettlement};
use crate::ledger::{Payer, SvmRecord, SvmTerms};
use crate::store::{Claim, Limits, Storage, StoreError};
use crate::svm::{Keypair, Signature, SignedTransaction, Transfer};

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
    PaymentKey::svm(network, signature_digest(signature))
}

fn signature_digest(signature: &Signature) -> [u8; 32] {
    Sha256::digest(signature.as_ref()).into()
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
        let chain = &network.chain;
        let follower = network.follower(ledger, cooldown);
        let wait = wait.min(Duration::from_secs(chain.settings.settle_timeout_secs));
        let deadline = Instant::now() + wait;
        let transfer = match self.check_local(payment) {
            Ok(transfer) => transfer,
            Err(failure) => return Ok(SvmSettled::Refused(failure.into())),
        };
        let signed = self.sign(payment);
        let digest = signature_digest(&signed.signature);
        let key = PaymentKey::svm(payment.network, digest);
        if let Some(record) = ledger.get(&key).await? {
            // Boxed, as each step the wait leaves behind: a settlement waiting for its
            // confirmation holds only the wait.
            return Box::pin(known(ledger, &follower, record, &key, asking, deadline)).await;
        }
        let ready = self.ready_to_send(ledger, cooldown, payment, &transfer, &signed.wire);
        let balance = match Box::pin(ready).await? {
            Ok(balance) => balance,
            Err(failure) => return Ok(SvmSettled::Refused(failure.into())),
        };
        let svm = svm_settlement(payment, &transfer, signed);
        let message = message_digest(payment);
        let record = new_record((payment.network, digest), &transfer, asking, svm, message);
        // The source's settlements under way and this one stay within what it holds now.
        let limits = Limits::balance(U256::from(balance));
        match ledger.claim(&key, &record, None, &limits).await? {
            Claim::Claimed => {}
            Claim::Exists(existing) => {
                let known = known(ledger, &follower, *existing, &key, asking, deadline);
                return Box::pin(known).await;
            }
            Claim::KeyTaken => return Err(key_taken(&record)),
            Claim::OverLimit { exposed } => {
                let failure = Failure::Exposed {
                    balance,
                    exposed: exposed.min(U256::from(u64::MAX)).as_u64(),
                };
                return Ok(SvmSettled::Refused(failure.into()));
            }
            Claim::OverAllowance { .. } | Claim::Permit2Clash(_) => {
                unreachable!("a Solana claim spends no Permit2 allowance or nonce")
            }
        }
        // The write-ahead: on disk before the transaction is ever sent.
        ledger.save(&[record.as_record()], true).await?;
        let signature = record_signature(&record);
        // The send, the follower's sends again and its reads of the record are traced in the
        // settlement's span, which ends with the settlement.
        let span = settlement_span(payment, &signature);
        let sent = send(chain, &record).instrument(span.clone()).await;
        let ending = follower.follow(record, sent, span);
        let outcome = match follower::until(ending, deadline).await {
            Some(ended) => {
                self.answer_times.observe("svm", ended.seen.elapsed());
                Ok(SvmSettled::Ended(Box::new(ended.record)))
            }
            None => Ok(SvmSettled::Pending { signature }),
        };
        pass_on(ledger, outcome, &key, asking).await
    }

    /// Verify's rules, read again right before sending (access.md 3c): the simulation of the fee
    /// payer's signed transaction at `processed`, answering the accounts it leaves, so that a
    /// source drained since `/verify` read it is refused unsent; then the cooldown. Answers what
    /// the source holds. The read takes the cluster's settle budget (503 beyond it).
    async fn ready_to_send(
        &self,
        ledger: &Storage,
        cooldown: &Cooldown,
        payment: &Payment,
        transfer: &Transfer,
        signed: &str,
    ) -> Result<Result<u64, Failure>, SettleError> {
        let chain = &self
            .network(payment.network)
            .expect("lowered onto a served network")
            .chain;
        let _read = chain.client().admit(Budget::Settle)?;
        let accounts = payment_accounts(transfer);
        let read = chain.presend_state(&accounts, signed);
        let verified = self
            .verify_read(ledger, payment.network, chain, transfer, read)
            .await?;
        let verified = match verified {
            Ok(verified) => verified,
            Err(failure) => return Ok(Err(failure)),
        };
        if let Err(failure) = cooled_down(cooldown, transfer).await? {
            return Ok(Err(failure));
        }
        Ok(Ok(verified.balance))
    }

    /// The stored settlement of this payment's transaction, if any: verify refuses a transaction
    /// already claimed, as it refuses an EVM authorization already claimed (access.md §1).
    pub async fn settlement_of(
        &self,
        ledger: &Storage,
        payment: &Payment,
    ) -> Result<Option<Record>, StoreError> {
        let signature = payment
            .transaction
            .fee_payer_signature(self.fee_payer(payment));
        ledger.get(&payment_key(payment.network, &signature)).await
    }

    /// The transaction with the fee payer's signature.
    fn sign(&self, payment: &Payment) -> SignedTransaction {
        payment
            .transaction
            .sign_as_fee_payer(self.fee_payer(payment))
    }

    /// The payment's fee payer; lowering made sure `extra.feePayer` is one of this facilitator's.
    fn fee_payer(&self, payment: &Payment) -> &Keypair {
        self.fee_payers
            .key(&payment.fee_payer)
            .expect("lowered: a fee payer of this facilitator")
    }

    /// Follows every unfinished Solana settlement of a served network again (at start): status,
    /// sending again while it may land, expiry. Answers how many.
    pub fn resume(
        &self,
        ledger: &Storage,
        cooldown: &Arc<Cooldown>,
        records: Vec<SvmRecord>,
    ) -> usize {
        let mut resumed = 0;
        for record in records {
            let Some(network) = self.network(&record.network) else {
                tracing::warn!(payment = %record.key(), "Solana settlement of a network no longer served; left in the store");
                continue;
            };
            let follower = network.follower(ledger, cooldown);
            drop(follower.follow(record, None, tracing::Span::none()));
            resumed += 1;
        }
        resumed
    }
}

impl SvmNetwork {
    /// The cluster's follower, started with its first settlement.
    fn follower(&self, ledger: &Storage, cooldown: &Arc<Cooldown>) -> Arc<Follower> {
        let start = || Follower::start(self.chain.clone(), ledger.clone(), cooldown.clone());
        self.follower.get_or_init(start).clone()
    }
}

/// Sends a claimed settlement's transaction the first time: when, unless the send failed (the
/// follower sends it again then).
async fn send(chain: &SolanaChain, record: &SvmRecord) -> Option<Instant> {
    let svm = &record.part().settlement;
    match chain.send_transaction(&svm.transaction).await {
        Ok(()) => Some(Instant::now()),
        Err(e) => {
            tracing::warn!(chain = %chain.name, signature = %svm.signature, error = %e, "sendTransaction failed; trying again");
            None
        }
    }
}

/// The ledger account a payment's exposure counts against: its mint and source token account,
/// as [`new_record`] stores them.
pub(super) fn exposure_account(network: &str, transfer: &Transfer) -> Account {
    Account::svm(network, transfer.mint, transfer.source)
}

/// The revert cooldown of the payment's owner (access.md 3c): its transfer authority, on every
/// token account and mint of the family. A cooldown stored by an earlier release under the source
/// token account (its first 20 bytes: `Payer::earlier_cooldown`) still refuses that account
/// until it ends (those are all loaded at start, so memory knows them: no second store read).
pub async fn cooled_down(
    cooldown: &Cooldown,
    transfer: &Transfer,
) -> Result<Result<(), Failure>, StoreError> {
    let owner = Payer::Svm(transfer.authority);
    let left = match cooldown.refuses_stored(&owner).await? {
        Some(left) => Some(left),
        None => cooldown.refuses(&Payer::Svm(transfer.source)),
    };
    Ok(left.map_or(Ok(()), |left| Err(Failure::CooledDown { left })))
}

/// A failed settlement cools its payer down (the transfer authority), as [`cooled_down`] reads
/// it. A record whose authority does not read as a key (no record routerd wrote) has nobody to
/// cool down; that is logged.
pub(super) async fn cool_down(cooldown: &Cooldown, record: &Record) {
    match record.paid_by() {
        Some(payer) => cooldown.impose(&payer).await,
        None => {
            tracing::warn!(payment = %record.key(), "a failed Solana settlement's payer is not a key; nobody is cooled down")
        }
    }
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

fn record_signature(record: &SvmRecord) -> String {
    record.part().settlement.signature.clone()
}

/// What a claim stores of a Solana payment: the signed transaction and what it pays. Its blockhash
/// bound is not read yet (0): the follower reads it after the send (`follower.rs`).
fn svm_settlement(
    payment: &Payment,
    transfer: &Transfer,
    signed: SignedTransaction,
) -> SvmSettlement {
    SvmSettlement {
        signature: signed.signature.to_string(),
        transaction: signed.wire,
        last_valid_block_height: 0,
        payer: transfer.authority.to_string(),
        pay_to: payment.pay_to.to_string(),
        mint: transfer.mint.to_string(),
        source: Some(transfer.source.to_string()),
        amount: payment.amount,
        error: None,
    }
}

/// The claim of a payment keyed by (`network`, `signature_digest`).
fn new_record(
    (network, signature_digest): (&str, [u8; 32]),
    transfer: &Transfer,
    asking: &Asking,
    svm: SvmSettlement,
    digest: H256,
) -> SvmRecord {
    let value = U256::from(svm.amount);
    let terms = SvmTerms {
        signature_digest,
        mint: transfer.mint,
        source: transfer.source,
        settlement: svm,
    };
    SvmRecord::new(network.to_string(), value, digest, terms).asked_by(asking)
}

/// A payment already claimed: the claimant (its `Idempotency-Key`, or the identical request a
/// pending answer passed the outcome on to) is told the outcome, following the transaction
/// until the deadline; any other request is told the signature, as a failure.
async fn known(
    ledger: &Storage,
    follower: &Follower,
    record: Record,
    key: &PaymentKey,
    asking: &Asking,
    deadline: Instant,
) -> Result<SvmSettled, SettleError> {
    // Its key is a Solana one: so is the record stored under it; any other is somebody else's.
    let record = SvmRecord::try_from(record).map_err(|other| key_taken(&other))?;
    let caller = caller_of(record.request.as_ref(), asking.tag.as_ref())?;
    let caller = with_pass(ledger, caller, key, asking).await?;
    let signature = record_signature(&record);
    match (&record.outcome, caller) {
        // A failure is nobody's success: everybody is told it.
        (Some(outcome), Caller::Another) if !outcome.success => {
            return Ok(SvmSettled::Ended(Box::new(record.into_record())))
        }
        (outcome, Caller::Another) => {
            return Ok(SvmSettled::Duplicate {
                signature,
                ended: outcome.is_some(),
            })
        }
        (Some(_), Caller::Claimant) => {
            return Ok(SvmSettled::Ended(Box::new(record.into_record())))
        }
        (None, Caller::Claimant) => {}
    }
    // Followed once: a claimant asking again waits on the same follower.
    let ending = follower.follow(record, None, tracing::Span::current());
    let outcome = match follower::until(ending, deadline).await {
        // Not timed: a retry, whose wait after the block began with an earlier request.
        Some(ended) => Ok(SvmSettled::Ended(Box::new(ended.record))),
        None => Ok(SvmSettled::Pending { signature }),
    };
    pass_on(ledger, outcome, key, asking).await
}

impl Answer for Result<SvmSettled, SettleError> {
    fn pending(&self) -> bool {
        matches!(self, Ok(SvmSettled::Pending { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::svm::{Pubkey, TokenProgram};

    fn transfer(authority: Pubkey, source: Pubkey) -> Transfer {
        Transfer {
            program: TokenProgram::Token,
            source,
            mint: Pubkey::new_unique(),
            destination: Pubkey::new_unique(),
            authority,
            amount: 1,
            decimals: 6,
        }
    }

    fn cooldown(name: &str) -> Cooldown {
        let dir = crate::testing::temp_dir(&format!("svm-cooldown-{name}"));
        let store: Storage = Arc::new(crate::store::sled::Store::open(&dir).unwrap());
        Cooldown::new(Duration::from_secs(60), store)
    }

    /// A failed settlement refuses its owner from any token account; one stored by the
    /// previous release under a source account still refuses that account.
    #[tokio::test]
    async fn a_cooldown_follows_the_owner_across_token_accounts() {
        let cooldown = cooldown("owner");
        let (owner, source) = (Pubkey::new_unique(), Pubkey::new_unique());
        cooldown.impose(&Payer::Svm(owner)).await;
        let fresh = transfer(owner, Pubkey::new_unique());
        let refused = cooled_down(&cooldown, &fresh).await.unwrap();
        assert!(matches!(refused, Err(Failure::CooledDown { .. })));
        let stranger = transfer(Pubkey::new_unique(), source);
        assert_eq!(cooled_down(&cooldown, &stranger).await.unwrap(), Ok(()));
        cooldown.impose(&Payer::Svm(source)).await;
        let refused = cooled_down(&cooldown, &stranger).await.unwrap();
        assert!(matches!(refused, Err(Failure::CooledDown { .. })));
    }
}
