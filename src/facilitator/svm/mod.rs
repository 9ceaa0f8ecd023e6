//! Solana's `exact` (`svm.md`): the family's mechanism beside the EVM one, sharing the protocol
//! lowering and the answers. A payment arrives lowered ([`Payment`]: its requirements typed and
//! its transaction decoded); verify holds it to the leaf's instruction rules (`svm::check`), then
//! asks the cluster once (the simulation, answering the accounts it leaves). Settlements are
//! followed by one follower per cluster (`follower.rs`).

pub mod fee_payer;
mod follower;
pub mod mechanism;
mod readiness;
mod settle;
pub mod wire;

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use ethers_core::types::U256;

use crate::chain::svm::{PaymentAccounts, PaymentState, SolanaChain, SolanaError};
use crate::chain::Unreachable;
use crate::config::{solana_preset, FacilitatorSettings, SolanaChainSettings};
use crate::facilitator::deny_list::{DenyList, DenyLists};
use crate::facilitator::outcome::SettleError;
use crate::facilitator::settlement::answer_times::AnswerTimes;
use crate::facilitator::SetupError;
use crate::store::Storage;
use crate::svm::exact::MAX_MICRO_LAMPORTS_PER_COMPUTE_UNIT;
use crate::svm::{
    self, DecodeError, Limits, MintRefusal, PaymentTransaction, Pubkey, Refusal, Transfer,
};
pub use fee_payer::{FeePayerError, FeePayers};
use settle::exposure_account;
pub use settle::{cooled_down, payment_key, SvmSettled};

/// The x402 version that carried a payment: v1 allows one optional instruction fewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    fn max_instructions(self) -> usize {
        match self {
            Version::V1 => 6,
            Version::V2 => 7,
        }
    }
}

/// A served Solana network.
pub struct SvmNetwork {
    /// The v1 name.
    pub name: &'static str,
    /// The CAIP-2 id, v2's name.
    pub caip2: String,
    pub genesis_hash: &'static str,
    pub chain: Arc<SolanaChain>,
    /// The configured mints.
    pub mints: Vec<Pubkey>,
    /// Follows the cluster's settlements, started with the first.
    follower: std::sync::OnceLock<Arc<follower::Follower>>,
}

impl SvmNetwork {
    /// The served Solana networks of `facilitator.networks`, each with its upstream client.
    /// An error names the chain and why its client could not be built.
    pub(crate) fn configured(
        settings: &FacilitatorSettings,
        chains: &BTreeMap<String, SolanaChainSettings>,
    ) -> Result<Vec<Self>, (String, String)> {
        let network = |name: &'static str| {
            let preset = solana_preset(name).expect("a Solana network's name");
            let settings = &chains[name];
            let chain = SolanaChain::new(name, settings, preset.genesis_hash)
                .map_err(|e| (name.to_string(), e))?;
            let mints = settings
                .tokens
                .values()
                .map(|t| Pubkey::from_str(&t.mint).expect("validated by config"))
                .collect();
            Ok(SvmNetwork {
                name,
                caip2: preset.caip2(),
                genesis_hash: preset.genesis_hash,
                chain,
                mints,
                follower: std::sync::OnceLock::new(),
            })
        };
        settings
            .solana_networks()
            .into_iter()
            .map(network)
            .collect()
    }
}

/// One payment, lowered: what the requirements ask, in Solana's types, and the transaction.
#[derive(Debug, Clone)]
pub struct Payment {
    pub version: Version,
    /// The v1 name of a served network.
    pub network: &'static str,
    /// A configured mint of that network.
    pub mint: Pubkey,
    pub pay_to: Pubkey,
    pub amount: u64,
    /// `extra.feePayer`: one of routerd's fee payers.
    pub fee_payer: Pubkey,
    pub memo: Option<String>,
    pub transaction: PaymentTransaction,
    /// The transaction as the payer sent it (base64), for the simulation.
    pub wire: String,
}

/// Why a Solana payment is refused, past the rules every family shares (version, scheme,
/// network, requirement values); `wire` names each in both versions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error("paymentRequirements.extra.feePayer: missing")]
    MissingFeePayer,
    #[error("paymentRequirements.extra.feePayer: not a fee payer of this facilitator")]
    FeePayerNotManaged,
    #[error("paymentPayload.payload.transaction: {0}")]
    Decode(DecodeError),
    #[error("{0}")]
    Rule(Refusal),
    /// `facilitator.deny_list_file` names the payer (the transfer's authority, or its source
    /// token account's owner) or the payee.
    #[error("{0} is on the deny list")]
    DenyListed(Party),
    #[error("paymentRequirements.asset: the mint is refused: {0}")]
    Mint(MintRefusal),
    #[error("the source token account does not exist")]
    SourceMissing,
    #[error("the payee has no token account for the mint (it is not created for it)")]
    RecipientMissing,
    #[error("the source token account holds {balance}, below the amount")]
    InsufficientFunds { balance: u64 },
    /// Its settlements under way and this one add up to more than the source holds (access.md §2).
    #[error(
        "the source token account holds {balance}, {exposed} of it in settlements under way: below the amount"
    )]
    Exposed { balance: u64, exposed: u64 },
    #[error("the simulation failed: {0}")]
    Simulation(String),
    /// A settlement of the same payer (its transfer authority, on any token account) failed on
    /// chain (access.md §2, 3c).
    #[error("the payer (the transfer's authority) is refused for {left} s more: a settlement from it failed on chain (facilitator.revert_cooldown_secs)")]
    CooledDown { left: u64 },
}

/// Who a deny-listed key is to the payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Party {
    Payer,
    Payee,
}

impl std::fmt::Display for Party {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Party::Payer => "payer",
            Party::Payee => "payTo",
        })
    }
}

/// A payment that passed verify: who pays (the transfer's authority) and what moves, and what the
/// source token account held.
#[derive(Debug, Clone, Copy)]
pub struct Verified {
    pub transfer: Transfer,
    pub balance: u64,
}

pub struct SvmExact {
    networks: Vec<SvmNetwork>,
    fee_payers: FeePayers,
    /// `facilitator.deny_list_file`, as last read (its base58 keys).
    deny_list: Arc<DenyLists>,
    /// Block-to-answer times, shared with the other family's.
    answer_times: AnswerTimes,
}

impl SvmExact {
    /// Solana's `exact`, when `facilitator.networks` names a Solana network: its clusters and
    /// the fee payer keys.
    pub fn configured(
        f: &FacilitatorSettings,
        chains: &BTreeMap<String, SolanaChainSettings>,
    ) -> Result<Option<SvmExact>, SetupError> {
        if f.solana_networks().is_empty() {
            return Ok(None);
        }
        let fee_payers = FeePayers::load(&f.svm_fee_payer_key_file).map_err(SetupError::family)?;
        let networks =
            SvmNetwork::configured(f, chains).map_err(|(name, e)| SetupError::Chain(name, e))?;
        Ok(Some(SvmExact::new(networks, fee_payers)))
    }

    pub fn new(networks: Vec<SvmNetwork>, fee_payers: FeePayers) -> Self {
        Self {
            networks,
            fee_payers,
            deny_list: Arc::new(DenyLists::of(DenyList::default())),
            answer_times: AnswerTimes::default(),
        }
    }

    /// Counts block-to-answer times into `times`.
    pub fn answer_times(mut self, times: AnswerTimes) -> Self {
        self.answer_times = times;
        self
    }

    /// Refuses payments from or to these keys, as the EVM deny list refuses addresses.
    pub fn deny(mut self, lists: Arc<DenyLists>) -> Self {
        self.deny_list = lists;
        self
    }

    pub fn networks(&self) -> &[SvmNetwork] {
        &self.networks
    }

    pub fn network(&self, name: &str) -> Option<&SvmNetwork> {
        self.networks.iter().find(|n| n.name == name)
    }

    pub fn fee_payers(&self) -> &[Pubkey] {
        self.fee_payers.pubkeys()
    }

    /// Refuses a node of another cluster, as an EVM node with another chain id is refused:
    /// every URL that answers now must be on the cluster (one that does not is checked before
    /// its first use, and never used when it is not).
    pub async fn check_genesis(&self) -> Result<(), String> {
        for network in &self.networks {
            let foreign = network
                .chain
                .check_genesis()
                .await
                .map_err(|e| format!("chains.{}: getGenesisHash: {e}", network.name))?;
            if let Some((upstream, found)) = foreign.first() {
                return Err(format!(
                    "chains.{}.rpc_urls: {upstream}: the node's genesis hash is {found}, not {}'s {}",
                    network.name, network.name, network.genesis_hash
                ));
            }
        }
        Ok(())
    }

    /// Refuses to start with a configured Token-2022 mint whose extensions change what the
    /// payee receives (access.md 3c), naming its key: every payment in it would be refused.
    /// Verify reads the mint again, for a fee or a hook set after the start.
    pub async fn check_mints(&self) -> Result<(), String> {
        for network in &self.networks {
            let tokens: Vec<(&String, Pubkey)> = network
                .chain
                .settings
                .tokens
                .iter()
                .map(|(symbol, t)| (symbol, Pubkey::from_str(&t.mint).expect("validated")))
                .collect();
            let mints: Vec<Pubkey> = tokens.iter().map(|(_, mint)| *mint).collect();
            if mints.is_empty() {
                continue;
            }
            let refusals = network
                .chain
                .mint_refusals(&mints)
                .await
                .map_err(|e| format!("chains.{}: reading the mints: {e}", network.name))?;
            let refused = tokens.iter().zip(refusals).find_map(|(t, r)| Some((t, r?)));
            if let Some(((symbol, mint), refusal)) = refused {
                return Err(format!(
                    "chains.{}.tokens.{symbol}.mint: mint {mint} is refused: {refusal}",
                    network.name
                ));
            }
        }
        Ok(())
    }

    /// svm.md §3 rules 1 to 7: the local rules, then one upstream request, and beside it the
    /// store's sum of the source's settlements under way (the exposure rule of access.md §2,
    /// which settle's claim then holds atomically).
    pub async fn verify(
        &self,
        ledger: &Storage,
        payment: &Payment,
    ) -> Result<Result<Verified, Failure>, SettleError> {
        let transfer = match self.check_local(payment) {
            Ok(transfer) => transfer,
            Err(failure) => return Ok(Err(failure)),
        };
        let chain = &self
            .network(payment.network)
            .expect("lowered onto a served network")
            .chain;
        let accounts = payment_accounts(&transfer);
        let read = chain.payment_state(&accounts, &payment.wire);
        self.verify_read(ledger, payment.network, chain, &transfer, read)
            .await
    }

    fn check_local(&self, payment: &Payment) -> Result<Transfer, Failure> {
        let network = self
            .network(payment.network)
            .expect("lowered onto a served network");
        let requirements = svm::Requirements {
            fee_payer: &payment.fee_payer,
            fee_payers: self.fee_payers.pubkeys(),
            mint: &payment.mint,
            pay_to: &payment.pay_to,
            amount: payment.amount,
            memo: payment.memo.as_deref(),
            limits: Limits {
                max_instructions: payment.version.max_instructions(),
                max_compute_units: network.chain.settings.max_compute_units,
                max_micro_lamports_per_compute_unit: MAX_MICRO_LAMPORTS_PER_COMPUTE_UNIT,
                max_priority_fee_lamports: network.chain.settings.max_priority_fee_lamports,
            },
        };
        let transfer = svm::check(&payment.transaction, &requirements).map_err(Failure::Rule)?;
        if self.deny_list.denies_svm(&transfer.authority) {
            return Err(Failure::DenyListed(Party::Payer));
        }
        if self.deny_list.denies_svm(&payment.pay_to) {
            return Err(Failure::DenyListed(Party::Payee));
        }
        Ok(transfer)
    }

    /// Who the cluster says the accounts belong to: the source's owner may be deny-listed
    /// when a delegate authorises the transfer, and a destination whose owner is the payer's
    /// (its owner reassigned away from `payTo`) makes the payment a self-payment.
    fn judge_parties(&self, transfer: &Transfer, state: &PaymentState) -> Result<(), Failure> {
        let source_owner = state.source.map(|s| s.owner);
        if source_owner.is_some_and(|owner| self.deny_list.denies_svm(&owner)) {
            return Err(Failure::DenyListed(Party::Payer));
        }
        let payee = state.destination.map(|d| d.owner);
        if payee.is_some_and(|payee| payee == transfer.authority || Some(payee) == source_owner) {
            return Err(Failure::Rule(Refusal::SelfPayment));
        }
        Ok(())
    }

    /// Rule 7 on `read` (the payment's accounts and simulation), beside the store's sum of the
    /// source's settlements under way; the parties the cluster names are judged first.
    async fn verify_read(
        &self,
        ledger: &Storage,
        network: &str,
        chain: &SolanaChain,
        transfer: &Transfer,
        read: impl std::future::Future<Output = Result<PaymentState, SolanaError>>,
    ) -> Result<Result<Verified, Failure>, SettleError> {
        let account = exposure_account(network, transfer);
        let (state, exposed) = tokio::join!(read, ledger.exposed(&account));
        let state = state.map_err(|e| unreachable(chain, e))?;
        let exposed = exposed?.min(U256::from(u64::MAX)).as_u64();
        let verified = self
            .judge_parties(transfer, &state)
            .and_then(|()| judge(transfer, &state, exposed))
            .map(|balance| Verified {
                transfer: *transfer,
                balance,
            });
        Ok(verified)
    }
}

/// The accounts a transfer moves funds between, its mint and its amount.
fn payment_accounts(transfer: &Transfer) -> PaymentAccounts<'_> {
    PaymentAccounts {
        source: &transfer.source,
        destination: &transfer.destination,
        mint: &transfer.mint,
        amount: transfer.amount,
        authority: &transfer.authority,
    }
}

/// How deep a slot is once the cluster has rooted (finalized) it.
const ROOTED_DEPTH: u64 = 32;

/// Slots confirmed above a transaction that landed at `landed`, with the cluster at `now`, as
/// `getSignatureStatuses` counts them: `None` once the cluster has rooted it.
pub fn confirmations(landed: u64, now: u64) -> Option<u64> {
    let depth = now.saturating_sub(landed);
    (depth < ROOTED_DEPTH).then_some(depth)
}

/// Rule 7 on what the cluster answered and the store counts (`exposed`: the source's
/// settlements under way): the accounts exist, the source holds the amount beside them, and
/// the transaction runs. Answers what the transfer's authority can move out of the source: for
/// a delegate, its allowance, so that settlements under way from one allowance cannot outnumber
/// it and fail together at the fee payer's cost.
fn judge(transfer: &Transfer, state: &PaymentState, exposed: u64) -> Result<u64, Failure> {
    let Some(source) = state.source.filter(|s| s.mint == transfer.mint) else {
        return Err(Failure::SourceMissing);
    };
    if state.destination.is_none() {
        return Err(Failure::RecipientMissing);
    }
    if let Some(refusal) = state.mint_refusal {
        return Err(Failure::Mint(refusal));
    }
    let balance = source.spendable_by(&transfer.authority);
    if balance < transfer.amount {
        return Err(Failure::InsufficientFunds { balance });
    }
    if exposed.saturating_add(transfer.amount) > balance {
        return Err(Failure::Exposed { balance, exposed });
    }
    match &state.simulation_error {
        Some(error) => Err(Failure::Simulation(error.clone())),
        None => Ok(balance),
    }
}

/// A node that answered, but not what Solana's JSON-RPC says it answers, has answered nothing.
fn unreachable(chain: &SolanaChain, error: SolanaError) -> Unreachable {
    match error {
        SolanaError::Unreachable(unreachable) => unreachable,
        other => Unreachable {
            chain: chain.name.clone(),
            detail: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::chain::svm::TokenAccount;
    use crate::svm::TokenProgram;

    fn transfer(amount: u64) -> Transfer {
        Transfer {
            program: TokenProgram::Token,
            source: Pubkey::new_unique(),
            mint: Pubkey::new_unique(),
            destination: Pubkey::new_unique(),
            authority: Pubkey::new_unique(),
            amount,
            decimals: 6,
        }
    }

    fn state(t: &Transfer, balance: u64) -> PaymentState {
        let account = |owner| TokenAccount {
            program: TokenProgram::Token.id(),
            mint: t.mint,
            owner,
            amount: balance,
            delegate: None,
        };
        PaymentState {
            source: Some(account(t.authority)),
            destination: Some(account(Pubkey::new_unique())),
            mint_refusal: None,
            simulation_error: None,
        }
    }

    #[test]
    fn rule_seven_in_order() {
        let t = transfer(100);
        assert_eq!(judge(&t, &state(&t, 100), 0), Ok(100));
        let mut s = state(&t, 99);
        assert_eq!(
            judge(&t, &s, 0),
            Err(Failure::InsufficientFunds { balance: 99 })
        );
        s.destination = None;
        assert_eq!(judge(&t, &s, 0), Err(Failure::RecipientMissing));
        s.source.as_mut().unwrap().mint = Pubkey::new_unique();
        assert_eq!(judge(&t, &s, 0), Err(Failure::SourceMissing));
        let mut s = state(&t, 100);
        s.simulation_error = Some("{\"InstructionError\":[2,\"Custom\"]}".into());
        assert!(matches!(judge(&t, &s, 0), Err(Failure::Simulation(_))));
    }

    #[test]
    fn the_cluster_names_a_deny_listed_owner_and_a_payee_account_of_the_payers_own() {
        let t = transfer(100);
        let fee_payers = FeePayers::new(vec![svm::Keypair::new()]).unwrap();
        let owner = Pubkey::new_unique();
        let svm = SvmExact::new(Vec::new(), fee_payers).deny(Arc::new(DenyLists::of(DenyList {
            evm: HashSet::new(),
            svm: HashSet::from([owner]),
        })));
        let mut s = state(&t, 100);
        assert_eq!(svm.judge_parties(&t, &s), Ok(()));
        // A delegate authorises the transfer from a deny-listed owner's account.
        s.source.as_mut().unwrap().owner = owner;
        assert_eq!(
            svm.judge_parties(&t, &s),
            Err(Failure::DenyListed(Party::Payer))
        );
        // The payee's account belongs to the authority, or to the source's owner.
        for payee in [t.authority, Pubkey::new_unique()] {
            let mut s = state(&t, 100);
            s.source.as_mut().unwrap().owner = payee;
            s.destination.as_mut().unwrap().owner = payee;
            assert_eq!(
                svm.judge_parties(&t, &s),
                Err(Failure::Rule(Refusal::SelfPayment))
            );
        }
        let mut s = state(&t, 100);
        s.mint_refusal = Some(MintRefusal::Pausable);
        assert_eq!(judge(&t, &s, 0), Err(Failure::Mint(MintRefusal::Pausable)));
    }

    #[test]
    fn confirmations_count_slots_above_until_rooted() {
        assert_eq!(
            confirmations(10, 9),
            Some(0),
            "a slot read before it landed"
        );
        assert_eq!(confirmations(10, 12), Some(2));
        assert_eq!(confirmations(10, 41), Some(31));
        assert_eq!(confirmations(10, 42), None);
    }

    #[test]
    fn settlements_under_way_count_against_the_source() {
        let t = transfer(100);
        assert_eq!(judge(&t, &state(&t, 250), 150), Ok(250));
        assert_eq!(
            judge(&t, &state(&t, 250), 151),
            Err(Failure::Exposed {
                balance: 250,
                exposed: 151
            })
        );
    }

    #[test]
    fn a_delegates_settlements_count_against_its_allowance() {
        let t = transfer(100);
        let mut s = state(&t, 1_000);
        let owner = Pubkey::new_unique();
        let delegate = |amount| crate::chain::svm::Delegation {
            delegate: t.authority,
            amount,
        };
        s.source = s.source.map(|a| TokenAccount {
            owner,
            delegate: Some(delegate(150)),
            ..a
        });
        assert_eq!(judge(&t, &s, 0), Ok(150), "its allowance, not the balance");
        assert_eq!(
            judge(&t, &s, 100),
            Err(Failure::Exposed {
                balance: 150,
                exposed: 100
            })
        );
        s.source = s.source.map(|a| TokenAccount {
            delegate: Some(delegate(99)),
            ..a
        });
        assert_eq!(
            judge(&t, &s, 0),
            Err(Failure::InsufficientFunds { balance: 99 })
        );
        s.source = s.source.map(|a| TokenAccount {
            delegate: None,
            ..a
        });
        // Neither owner nor delegate: a permanent delegate, or a transfer the simulation fails.
        assert_eq!(judge(&t, &s, 0), Ok(1_000));
    }
}
