//! What a settlement is at each moment, and the only ways it moves on. Pure: no chain, no store,
//! so every transition is unit-tested on its own.
//!
//! `Claimed -> Signed(nonce) -> Sent -> Included(block, hash) -> Final | Reverted`, or `Expired`
//! when it can no longer land, or `FrontRun` when somebody else's transaction executed the
//! authorization with its signed effect first. A reorganisation moves `Included` back to `Sent`; a
//! nonce taken by somebody else moves `Sent` back to `Signed` at a new nonce. `outcome` is what callers are
//! answered, set once the inclusion is `confirmations` deep, and never changed afterwards.

use ethers_core::types::{Address, Bytes, H256, U256};
use serde::{Deserialize, Serialize};

use super::family::{EvmPart, Family, SvmPart};
use super::keys::{Account, AccountId, Payer, PaymentKey, Permit2Nonce};
use super::Reason;
use crate::primitives::TxFees;

/// The request key a payment was claimed with, bound to a hash of the body it first came with.
/// An `Idempotency-Key` header (set by the caller of `/settle`, never by the payer) names the
/// claiming request: a retry carrying it and the same body is told the claimant's answer. The
/// payer's own `payment-identifier` id names the payment only: it is stored and keeps another
/// payment from using it, but never makes a second success (access.md §1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestTag {
    pub key: String,
    pub body: H256,
    /// Records written before the payment-identifier rule read as headers.
    #[serde(default, skip_serializing_if = "TagKind::is_header")]
    pub kind: TagKind,
}

/// Who chose a request key, and so whether it replays a success.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TagKind {
    /// `Idempotency-Key`: the caller's own; its retries are the claimant again.
    #[default]
    #[serde(rename = "header")]
    Header,
    /// x402 v2's `payment-identifier`: the payer's, unsigned; never a retry key.
    #[serde(rename = "payment-identifier")]
    PaymentIdentifier,
}

impl TagKind {
    fn is_header(&self) -> bool {
        *self == TagKind::Header
    }
}

/// A caller and the hash of the body it sent: after a pending answer, the next settle of the
/// same payment with the same body from the same caller is told the outcome (access.md §1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pass {
    /// `key:<API key name>` or `ip:<client address>`.
    pub caller: String,
    pub body: H256,
}

/// Who asks to settle a payment, as far as its answer depends on it.
#[derive(Debug, Clone)]
pub struct Asking {
    /// The request key stored with the claim, if the request carries one.
    pub tag: Option<RequestTag>,
    /// The payer's `payment-identifier` id, stored with the record and shown by the status route.
    pub payment_id: Option<String>,
    /// The caller and body, for the pending rule.
    pub pass: Pass,
    /// The caller's API key is scoped to `pay_to` entries, this payment's payee among them (a
    /// key that may pay any payee, or no key, is not).
    pub payee_scoped: bool,
}

impl Asking {
    /// Whether a pending answer to this request passes the outcome on to its identical next
    /// request. A request with an `Idempotency-Key` has its key for that.
    pub fn passes_on(&self) -> bool {
        !self
            .tag
            .as_ref()
            .is_some_and(|tag| tag.kind == TagKind::Header)
    }
}

/// Why a settlement can no longer land.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Lost {
    /// The chain's time passed `validBefore` before any of its transactions was mined.
    ValidBeforePassed,
    /// The authorization was used by a transaction that is not ours, and not with its signed
    /// effect (a front-run with it is `State::FrontRun`, a success).
    AuthorizationUsedElsewhere,
    /// The node refused the transaction for a reason that sending it again does not change
    /// (not its nonce, not its price): it gave its nonce up rather than stall the lane.
    Refused,
    /// It stayed unmined at its fee ceiling; a self-transfer took its nonce.
    PricedOut,
    /// The only signer that may send it (`EvmPart::sender`) cannot pay for gas: no other signer
    /// sends it instead (its transaction would revert).
    SenderUnfunded,
    /// Solana: the block height passed the transaction's `lastValidBlockHeight` and the
    /// signature is unknown: it can never land.
    BlockHeightExceeded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inclusion {
    pub block: u64,
    pub block_hash: H256,
    pub transaction: H256,
    pub succeeded: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    Claimed,
    Signed {
        nonce: u64,
    },
    Sent {
        nonce: u64,
    },
    Included {
        nonce: u64,
        inclusion: Inclusion,
    },
    Final {
        inclusion: Inclusion,
    },
    Reverted {
        inclusion: Inclusion,
    },
    Expired {
        why: Lost,
    },
    /// Settled by a transaction that is not ours (`by`, which succeeded): it executed the payer's
    /// authorization with exactly the signed effect before ours could (access.md §1).
    FrontRun {
        by: Inclusion,
    },
    /// Solana: the one transaction reached the commitment at `slot`, and ran (or failed).
    Landed {
        slot: u64,
        succeeded: bool,
    },
}

impl State {
    pub fn name(&self) -> &'static str {
        match self {
            State::Claimed => "claimed",
            State::Signed { .. } => "signed",
            State::Sent { .. } => "sent",
            State::Included { .. } => "included",
            State::Final { .. } => "final",
            State::Reverted { .. } => "reverted",
            State::Expired { .. } => "expired",
            State::FrontRun { .. } => "front_run",
            State::Landed {
                succeeded: true, ..
            } => "final",
            State::Landed { .. } => "failed",
        }
    }

    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            State::Final { .. }
                | State::Reverted { .. }
                | State::Expired { .. }
                | State::FrontRun { .. }
                | State::Landed { .. }
        )
    }

    /// The signer nonce the settlement occupies while it is followed.
    pub fn nonce(&self) -> Option<u64> {
        match *self {
            State::Signed { nonce } | State::Sent { nonce } | State::Included { nonce, .. } => {
                Some(nonce)
            }
            _ => None,
        }
    }

    /// The transaction that settled or reverted it, and where: for a front-run, the other one.
    pub fn inclusion(&self) -> Option<Inclusion> {
        match *self {
            State::Included { inclusion, .. }
            | State::Final { inclusion }
            | State::Reverted { inclusion }
            | State::FrontRun { by: inclusion } => Some(inclusion),
            _ => None,
        }
    }
}

/// The answer callers get, fixed once known.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Outcome {
    pub success: bool,
    pub reason: Option<Reason>,
    pub message: Option<String>,
    /// `None` only when nothing of ours was mined (an expired authorization).
    pub transaction: Option<H256>,
}

/// One signed transaction of a settlement. Fee bumps add attempts with the same nonce; a nonce
/// taken by somebody else, or a move to another signer, adds one with a new nonce.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attempt {
    pub signer: Address,
    pub nonce: u64,
    pub hash: H256,
    pub raw: Bytes,
    pub fees: TxFees,
    pub sent_at_block: u64,
}

/// How a payment's funds move: the token's own `transferWithAuthorization` (ERC-3009), or
/// Permit2's `permitWitnessTransferFrom` through x402's proxy. The stored names are spelled out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransferMethod {
    #[default]
    #[serde(rename = "eip3009")]
    Eip3009,
    #[serde(rename = "permit2")]
    Permit2,
    /// A contract call that executes no payer's authorization (a `batch-settlement` claim or
    /// sweep): no nonce of a payer to read, no payer's funds to follow.
    #[serde(rename = "call")]
    Call,
}

impl TransferMethod {
    pub(super) fn is_eip3009(&self) -> bool {
        *self == TransferMethod::Eip3009
    }
}

/// A settlement: what every family's shares (its network, value, digest, who asked, where it
/// stands and what was answered) and what it holds in its family's terms. It is stored in the
/// flat layout earlier releases wrote (`stored`).
#[derive(Debug, Clone)]
pub struct Record {
    pub network: String,
    pub value: U256,
    /// What only the same payment carries: the EIP-712 digest settled, a Solana message's
    /// hash. Only the same payment is told the outcome.
    pub digest: H256,
    /// The claiming request's tag, when it carried one: a header's retries get its answer.
    pub request: Option<RequestTag>,
    /// The payer's x402 v2 `payment-identifier` id, when its payload carried one.
    pub payment_id: Option<String>,
    pub state: State,
    pub outcome: Option<Outcome>,
    /// A success was answered and the settlement can no longer land: money owed to a merchant.
    pub lost: bool,
    /// Unix time of the terminal state, for pruning.
    pub finished_at: Option<u64>,
    /// Set by the ledger alone (`Record::new`, `stored`): outside it, read through `evm`/`svm`.
    pub(super) family: Family,
}

impl Record {
    pub fn key(&self) -> PaymentKey {
        match &self.family {
            Family::Evm(evm) => {
                PaymentKey::evm(self.network.clone(), evm.token, evm.payer, evm.nonce)
            }
            Family::Svm(svm) => PaymentKey::svm(&self.network, svm.signature_digest),
        }
    }

    /// The EVM settlement, for an EVM record.
    pub fn evm(&self) -> Option<&EvmPart> {
        match &self.family {
            Family::Evm(evm) => Some(evm),
            Family::Svm(_) => None,
        }
    }

    pub fn evm_mut(&mut self) -> Option<&mut EvmPart> {
        match &mut self.family {
            Family::Evm(evm) => Some(evm),
            Family::Svm(_) => None,
        }
    }

    /// The Solana settlement, for a Solana record.
    pub fn svm(&self) -> Option<&SvmPart> {
        match &self.family {
            Family::Svm(svm) => Some(svm),
            Family::Evm(_) => None,
        }
    }

    pub fn svm_mut(&mut self) -> Option<&mut SvmPart> {
        match &mut self.family {
            Family::Svm(svm) => Some(svm),
            Family::Evm(_) => None,
        }
    }

    /// Who pays: the authorization's signer, or the Solana transfer's authority. `None` for a
    /// Solana record whose authority does not read as a key (no record routerd wrote).
    pub fn paid_by(&self) -> Option<Payer> {
        match &self.family {
            Family::Evm(evm) => Some(Payer::Evm(evm.payer)),
            Family::Svm(svm) => svm.settlement.payer.parse().ok().map(Payer::Svm),
        }
    }

    /// The account its exposure counts against.
    pub fn account(&self) -> Account {
        match &self.family {
            Family::Evm(evm) => Account::evm(&self.network, evm.token, evm.payer),
            Family::Svm(svm) => Account {
                network: self.network.clone(),
                id: AccountId::Svm(svm.exposed),
            },
        }
    }

    /// The Permit2 nonce it spends, for a Permit2 settlement.
    pub fn permit2_nonce(&self) -> Option<Permit2Nonce> {
        self.evm()?.permit2_nonce(&self.network)
    }

    /// Whether its value may still leave the payer's balance and is not yet answered: such
    /// settlements count against the balance of the next one (access.md §2). Once answered,
    /// the chain's balance already shows the transfer (or its failure).
    pub fn exposes(&self) -> bool {
        self.outcome.is_none() && !self.state.is_terminal()
    }

    /// Its latest signed transaction (an EVM settlement's; a Solana one is signed at its claim).
    pub fn latest(&self) -> Option<&Attempt> {
        self.evm()?.latest()
    }

    /// The attempts at the nonce the settlement occupies now: one of them can still be mined.
    pub fn live_attempts(&self) -> impl Iterator<Item = &Attempt> {
        let attempts = self.evm().map(|evm| evm.live_attempts(&self.state));
        attempts.into_iter().flatten()
    }

    /// An EVM settlement signed `attempt`, at its nonce; a Solana record is never re-signed.
    pub fn signed(&mut self, attempt: Attempt) {
        let Some(evm) = self.evm_mut() else {
            return;
        };
        let nonce = attempt.nonce;
        evm.attempts.push(attempt);
        self.state = State::Signed { nonce };
    }

    pub fn sent(&mut self) {
        if let State::Signed { nonce } = self.state {
            self.state = State::Sent { nonce };
        }
    }

    pub fn included(&mut self, inclusion: Inclusion) {
        if let Some(nonce) = self.state.nonce() {
            self.state = State::Included { nonce, inclusion };
        }
    }

    /// The including block left the canonical chain: the transaction is to be sent again.
    pub fn reorged(&mut self) {
        if let State::Included { nonce, .. } = self.state {
            self.state = State::Sent { nonce };
        }
    }

    /// Sets the answer once the inclusion is deep enough; answers whether it was set now.
    pub fn confirm(
        &mut self,
        head: u64,
        confirmations: u64,
        revert: impl FnOnce() -> Outcome,
    ) -> bool {
        let State::Included { inclusion, .. } = self.state else {
            return false;
        };
        if self.outcome.is_some() || depth(head, inclusion.block) < confirmations {
            return false;
        }
        self.outcome = Some(if inclusion.succeeded {
            Outcome {
                success: true,
                reason: None,
                message: None,
                transaction: Some(inclusion.transaction),
            }
        } else {
            revert()
        });
        true
    }

    /// Past `finality_depth`: no reorganisation is followed any more.
    pub fn finalize(&mut self, head: u64, finality_depth: u64, now: u64) -> bool {
        let State::Included { inclusion, .. } = self.state else {
            return false;
        };
        if self.outcome.is_none() || depth(head, inclusion.block) < finality_depth {
            return false;
        }
        self.state = if inclusion.succeeded {
            State::Final { inclusion }
        } else {
            State::Reverted { inclusion }
        };
        self.finished_at = Some(now);
        true
    }

    /// It can no longer land. A success already answered becomes a loss to report. Answers
    /// whether the failure answer was set now (nothing had been answered yet).
    pub fn expire(&mut self, why: Lost, now: u64) -> bool {
        self.state = State::Expired { why };
        self.finished_at = Some(now);
        match &self.outcome {
            Some(outcome) => {
                self.lost = outcome.success;
                false
            }
            None => {
                self.outcome = Some(Outcome {
                    success: false,
                    reason: Some(match why {
                        Lost::ValidBeforePassed => Reason::ValidBefore,
                        Lost::AuthorizationUsedElsewhere
                        | Lost::Refused
                        | Lost::PricedOut
                        | Lost::SenderUnfunded
                        | Lost::BlockHeightExceeded => Reason::Payload,
                    }),
                    message: Some(
                        match why {
                            Lost::ValidBeforePassed => {
                                "authorization expired before the settlement was mined"
                            }
                            Lost::AuthorizationUsedElsewhere => {
                                "authorization was used by another transaction"
                            }
                            Lost::Refused => "the node refused the settlement transaction",
                            Lost::PricedOut => {
                                "the settlement transaction could not be mined under the fee caps"
                            }
                            Lost::SenderUnfunded => {
                                "the facilitator signer the payment names cannot pay for gas; nothing was sent"
                            }
                            Lost::BlockHeightExceeded => {
                                "the transaction's blockhash expired before it landed"
                            }
                        }
                        .to_string(),
                    ),
                    transaction: None,
                });
                true
            }
        }
    }

    /// Solana: the transaction reached the commitment at `slot`; `error`, when it failed on
    /// chain. Answers whether the answer was set now.
    pub fn landed(&mut self, slot: u64, error: Option<String>, now: u64) -> bool {
        let succeeded = error.is_none();
        self.state = State::Landed { slot, succeeded };
        self.finished_at = Some(now);
        if let Some(svm) = self.svm_mut() {
            svm.settlement.error = error.clone();
        }
        if self.outcome.is_some() {
            return false;
        }
        self.outcome = Some(Outcome {
            success: succeeded,
            reason: (!succeeded).then_some(Reason::Payload),
            message: error.map(|e| format!("the transaction failed on chain: {e}")),
            transaction: None,
        });
        true
    }

    /// Somebody else's transaction `by` executed the authorization with exactly its signed
    /// effect (the value reached `pay_to`): the payment is settled, once, by that transaction,
    /// and no longer followed. Answers whether the success was set now. A success answered
    /// before (our own inclusion, reorganised away since) keeps its answer, and nothing is lost:
    /// the payee has the funds.
    pub fn front_run(&mut self, by: Inclusion, now: u64) -> bool {
        debug_assert!(
            by.succeeded,
            "only an executed authorization settles a payment"
        );
        self.state = State::FrontRun { by };
        self.finished_at = Some(now);
        self.lost = false;
        if self.outcome.is_some() {
            return false;
        }
        self.outcome = Some(Outcome {
            success: true,
            reason: None,
            message: None,
            transaction: Some(by.transaction),
        });
        true
    }
}

/// How many blocks deep `block` is at `head`: 1 for the head itself.
pub fn depth(head: u64, block: u64) -> u64 {
    (head + 1).saturating_sub(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::record as claimed;

    fn record() -> Record {
        claimed(4)
    }

    fn attempt(nonce: u64) -> Attempt {
        crate::testing::attempt(Address::repeat_byte(9), nonce)
    }

    fn inclusion(block: u64, succeeded: bool) -> Inclusion {
        Inclusion {
            block,
            block_hash: H256::repeat_byte(block as u8),
            transaction: H256::repeat_byte(7),
            succeeded,
        }
    }

    fn no_revert() -> Outcome {
        unreachable!("a succeeded inclusion is not diagnosed")
    }

    #[test]
    fn success_is_answered_only_confirmations_deep_and_final_only_at_finality() {
        let mut r = record();
        r.signed(attempt(3));
        r.sent();
        assert_eq!(r.state, State::Sent { nonce: 3 });
        r.included(inclusion(10, true));
        assert!(!r.confirm(11, 3, no_revert));
        assert!(r.outcome.is_none());
        assert!(r.confirm(12, 3, no_revert));
        assert!(r.outcome.as_ref().unwrap().success);
        assert!(!r.finalize(20, 64, 0));
        assert!(r.finalize(73, 64, 5));
        assert_eq!(
            r.state,
            State::Final {
                inclusion: inclusion(10, true)
            }
        );
        assert_eq!(r.finished_at, Some(5));
    }

    #[test]
    fn a_reorg_sends_again_and_keeps_the_answer() {
        let mut r = record();
        r.signed(attempt(3));
        r.sent();
        r.included(inclusion(10, true));
        assert!(r.confirm(10, 1, no_revert));
        r.reorged();
        assert_eq!(r.state, State::Sent { nonce: 3 });
        assert!(r.outcome.as_ref().unwrap().success);
        assert!(
            !r.finalize(100, 64, 0),
            "nothing is final while not included"
        );
    }

    #[test]
    fn expiring_after_a_success_answer_is_a_loss_and_before_it_a_failure() {
        let mut r = record();
        r.signed(attempt(3));
        assert!(r.expire(Lost::ValidBeforePassed, 1));
        assert!(!r.lost);
        assert_eq!(
            r.outcome.as_ref().unwrap().reason,
            Some(Reason::ValidBefore)
        );
        let mut r = record();
        r.signed(attempt(3));
        r.included(inclusion(10, true));
        r.confirm(10, 1, no_revert);
        r.reorged();
        assert!(!r.expire(Lost::AuthorizationUsedElsewhere, 1));
        assert!(r.lost);
        assert!(r.state.is_terminal());
    }

    fn foreign(block: u64) -> Inclusion {
        Inclusion {
            block,
            block_hash: H256::repeat_byte(0xbb),
            transaction: H256::repeat_byte(0xf0),
            succeeded: true,
        }
    }

    #[test]
    fn a_front_run_is_one_success_naming_the_other_transaction() {
        let mut r = record();
        r.signed(attempt(3));
        r.sent();
        assert!(r.exposes());
        assert!(r.front_run(foreign(11), 9));
        let outcome = r.outcome.clone().unwrap();
        assert!(outcome.success);
        assert_eq!(outcome.transaction, Some(H256::repeat_byte(0xf0)));
        assert_eq!(outcome.reason, None);
        assert_eq!(r.state, State::FrontRun { by: foreign(11) });
        assert_eq!(r.state.name(), "front_run");
        assert!(r.state.is_terminal());
        assert_eq!(
            r.state.nonce(),
            None,
            "the signer nonce is no longer its own"
        );
        assert_eq!(r.state.inclusion(), Some(foreign(11)));
        assert!(!r.exposes());
        assert!(!r.lost);
        assert_eq!(r.finished_at, Some(9));
    }

    #[test]
    fn a_front_run_after_an_answered_success_keeps_the_answer_and_loses_nothing() {
        let mut r = record();
        r.signed(attempt(3));
        r.included(inclusion(10, true));
        r.confirm(10, 1, no_revert);
        r.reorged();
        let answered = r.outcome.clone();
        assert!(!r.front_run(foreign(12), 9));
        assert_eq!(r.outcome, answered, "an answer is never changed");
        assert!(!r.lost);
        assert!(r.state.is_terminal());
    }

    #[test]
    fn a_front_run_state_reads_back() {
        let state = State::FrontRun { by: foreign(11) };
        let stored = serde_json::to_string(&state).unwrap();
        assert_eq!(serde_json::from_str::<State>(&stored).unwrap(), state);
    }

    fn solana() -> Record {
        crate::testing::svm_record("net", 4)
    }

    #[test]
    fn a_solana_landing_is_answered_once_and_ends_the_record() {
        let mut r = solana();
        assert!(r.exposes());
        assert!(r.landed(42, None, 7));
        assert_eq!(
            r.state,
            State::Landed {
                slot: 42,
                succeeded: true
            }
        );
        assert_eq!(r.state.name(), "final");
        assert!(r.state.is_terminal() && !r.exposes());
        assert_eq!(r.finished_at, Some(7));
        assert!(r.outcome.as_ref().unwrap().success);
        assert!(
            !r.landed(43, Some("err".into()), 8),
            "an answer is never changed"
        );
        assert!(r.outcome.as_ref().unwrap().success);

        let mut failed = solana();
        assert!(failed.landed(42, Some("{\"InstructionError\":[2,\"Custom\"]}".into()), 7));
        assert_eq!(failed.state.name(), "failed");
        let outcome = failed.outcome.clone().unwrap();
        assert!(!outcome.success);
        assert_eq!(outcome.reason, Some(Reason::Payload));
        assert!(outcome.message.unwrap().contains("InstructionError"));
        assert_eq!(
            failed.svm().unwrap().settlement.error.as_deref(),
            Some("{\"InstructionError\":[2,\"Custom\"]}")
        );

        let mut expired = solana();
        assert!(expired.expire(Lost::BlockHeightExceeded, 9));
        assert!(expired
            .outcome
            .unwrap()
            .message
            .unwrap()
            .contains("expired"));
    }

    #[test]
    fn a_solana_record_reads_back_and_an_evm_one_stores_no_svm_field() {
        let r = record();
        let stored = serde_json::to_string(&r).unwrap();
        assert!(
            !stored.contains("\"svm\""),
            "EVM records are stored as before"
        );
        let read = serde_json::from_str::<Record>(&stored).unwrap();
        assert!(read.svm().is_none() && read.evm().is_some());
        assert_eq!(serde_json::to_string(&read).unwrap(), stored);
        let mut r = solana();
        r.landed(42, None, 7);
        let stored = serde_json::to_string(&r).unwrap();
        let read: Record = serde_json::from_str(&stored).unwrap();
        assert!(read.evm().is_none(), "a Solana record holds no EVM part");
        assert_eq!(
            read.svm().map(|s| &s.settlement),
            r.svm().map(|s| &s.settlement)
        );
        assert_eq!(read.state, r.state);
        assert_eq!(read.key(), r.key());
        assert_eq!(read.account(), r.account());
        assert_eq!(serde_json::to_string(&read).unwrap(), stored);
    }

    #[test]
    fn live_attempts_are_those_at_the_current_nonce() {
        let mut r = record();
        r.signed(attempt(3));
        r.signed(attempt(3));
        r.signed(attempt(8));
        assert_eq!(r.live_attempts().count(), 1);
        assert_eq!(depth(10, 10), 1);
    }
}
