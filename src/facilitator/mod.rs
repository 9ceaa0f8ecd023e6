//! The x402 `exact` facilitator: supported kinds, verify, settle, for each served protocol
//! version (`protocol` maps the versions onto one rule engine and one ledger). No HTTP in here.

pub mod deny_list;
pub mod discovery;
pub mod evm;
mod funds;
pub mod outcome;
pub mod protocol;
pub mod readiness;
pub mod settlement;
pub mod svm;
pub mod types;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ethers_core::types::Address;
use ethers_core::utils::to_checksum;
use tokio::sync::mpsc;

use crate::chain::{Budget, Chain};
use crate::config::{ChainSettings, FacilitatorSettings, TransferMethod};
use crate::evm::{erc3009, permit2};
use crate::ledger::{Asking, PaymentKey, Reason, Record};
use crate::signer::Signer;
use crate::store::{Storage, StoreError};
use deny_list::DenyLists;
use discovery::Catalogue;
use evm::request::Request;
use evm::request::TokenInfo;
use evm::settle::Begun;
use evm::verify::{Network, Verifier};
pub use evm::{Lane, LaneSettings};
pub use outcome::SettleError;
use outcome::{Invalid, Settled};
use protocol::v1::{self, SettleResponse, VerifyResponse};
use protocol::{eip2612, v2};
use settlement::cooldown::Cooldown;
use settlement::ClaimOn;
use svm::wire::{self as svm_wire, Refused, SvmRequest};
use types::{SettlementStatus, SupportedKind, SupportedResponse};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("facilitator.deny_list_file: {0}")]
    DenyList(#[from] deny_list::DenyListError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

pub struct Facilitator {
    verifier: Arc<Verifier>,
    settler: Arc<evm::settle::Settler>,
    max_batch: usize,
    serves_v1: bool,
    /// Served chain ids and their configured network names, when x402 v2 is served.
    v2_networks: Option<BTreeMap<u64, String>>,
    signers: Vec<Address>,
    cooldown: Arc<Cooldown>,
    /// Solana's `exact`, when a Solana network is served.
    svm: Option<svm::SvmExact>,
    /// The settlement store, for Solana's settlements (the EVM ones go through `settler`).
    ledger: Storage,
    /// The longest a settle waits for its outcome (`facilitator.settle_timeout_secs`).
    settle_timeout: Duration,
    /// The discovery catalogue, when on (`facilitator.discovery`, with v2 served).
    catalogue: Option<Arc<Catalogue>>,
    /// Signers' and fee payers' funds as last read, for `/ready` and `/metrics`.
    funds: readiness::KeptFunds,
    /// `facilitator.deny_list_file` as last read, for SIGHUP to read again.
    deny_list: Arc<DenyLists>,
}

impl Facilitator {
    pub fn new(
        settings: &FacilitatorSettings,
        chain_settings: &BTreeMap<String, ChainSettings>,
        chains: &BTreeMap<String, Arc<Chain>>,
        signers: Vec<Arc<Signer>>,
        svm: Option<svm::SvmExact>,
        store: Storage,
        lease: evm::LeaseSettings,
    ) -> Result<Self, SetupError> {
        let (deny_list, summary) = DenyLists::load(&settings.deny_list_file)?;
        if deny_list.configured() {
            tracing::info!("facilitator.deny_list_file: {summary}");
        }
        let deny_list = Arc::new(deny_list);
        let svm = svm.map(|svm| svm.deny(deny_list.clone()));
        let cooldown = Arc::new(Cooldown::new(
            Duration::from_secs(settings.revert_cooldown_secs),
            store.clone(),
        ));
        let (networks, lanes) = evm_networks(settings, chain_settings, chains, &signers, &cooldown);
        let v2_networks = settings.serves_version(2).then(|| {
            networks
                .iter()
                .map(|n| (n.chain.settings.chain_id, n.name.clone()))
                .collect()
        });
        let signer_addresses = signers.iter().map(|s| s.address).collect();
        let catalogue = Catalogue::new(settings, store.clone());
        let verifier = Arc::new(
            Verifier::new(
                networks,
                deny_list.clone(),
                cooldown.clone(),
                settings.max_signature_bytes,
            )
            .allow_http_resource(settings.allow_http_resource)
            .erc6492_factories(settings.erc6492_factories()?)
            .signers(signers.iter().map(|s| s.address).collect()),
        );
        let settler = evm::settle::Settler::new(
            verifier.clone(),
            store.clone(),
            lanes,
            Duration::from_secs(settings.settle_timeout_secs),
            Duration::from_secs(settings.retention_days * 86_400),
            lease,
        );
        let svm = svm.map(|svm| svm.answer_times(settler.answer_times().clone()));
        Ok(Self {
            verifier,
            settler,
            max_batch: settings.max_batch,
            serves_v1: settings.serves_version(1),
            v2_networks,
            signers: signer_addresses,
            cooldown,
            svm,
            ledger: store,
            settle_timeout: Duration::from_secs(settings.settle_timeout_secs),
            catalogue,
            funds: readiness::KeptFunds::default(),
            deny_list,
        })
    }

    /// Picks up settlements a previous run left unfinished and starts the signer lanes; call
    /// before serving.
    pub async fn start(&self) -> Result<usize, SettleError> {
        // Before serving: a payer refused before a restart is refused from the first request.
        self.cooldown.load().await?;
        self.cooldown.clone().spawn_upkeep();
        if let Some(catalogue) = &self.catalogue {
            catalogue.clone().spawn_upkeep();
        }
        let resumed = self.settler.start().await?;
        let Some(svm) = &self.svm else {
            return Ok(resumed);
        };
        let unfinished = self.ledger.unfinished().await?;
        let records = unfinished.into_iter().filter(|r| r.svm.is_some()).collect();
        Ok(resumed + svm.resume(&self.ledger, &self.cooldown, records))
    }

    /// The Solana clusters served (their upstream counts go to `/metrics`).
    pub fn solana_chains(&self) -> impl Iterator<Item = &crate::chain::svm::SolanaChain> {
        let networks = self.svm.iter().flat_map(|svm| svm.networks());
        networks.map(|n| &*n.chain)
    }

    /// Refuses Solana nodes of another cluster (`getGenesisHash`); call before serving.
    pub async fn check_solana_genesis(&self) -> Result<(), String> {
        match &self.svm {
            Some(svm) => svm.check_genesis().await,
            None => Ok(()),
        }
    }

    /// Refuses configured Solana mints whose extensions change what the payee receives; call
    /// before serving.
    pub async fn check_solana_mints(&self) -> Result<(), String> {
        match &self.svm {
            Some(svm) => svm.check_mints().await,
            None => Ok(()),
        }
    }

    /// v1's kinds name the configured networks; v2's name them by CAIP-2 id and come with v2's
    /// `extensions` (`payment-identifier`: its id is a settle's retry key) and `signers`.
    pub fn supported(&self) -> SupportedResponse {
        let mut kinds: Vec<SupportedKind> = Vec::new();
        if self.serves_v1 {
            kinds.extend(self.verifier.networks().map(|n| SupportedKind {
                x402_version: 1,
                scheme: "exact",
                network: n.name.clone(),
                extra: None,
            }));
            kinds.extend(self.svm_kinds(1, |n| n.name.to_string()));
        }
        kinds.sort_by(|a, b| a.network.cmp(&b.network));
        let Some(v2_networks) = &self.v2_networks else {
            return SupportedResponse {
                kinds,
                extensions: None,
                signers: None,
            };
        };
        kinds.extend(v2_networks.keys().map(|&chain_id| SupportedKind {
            x402_version: 2,
            scheme: "exact",
            network: v2::network_id(chain_id),
            extra: None,
        }));
        kinds.extend(self.upto_kinds(v2_networks));
        kinds.extend(self.svm_kinds(2, |n| n.caip2.clone()));
        let mut signers = BTreeMap::new();
        if !v2_networks.is_empty() {
            let evm = self.signers.iter().map(|a| to_checksum(a, None)).collect();
            signers.insert("eip155:*", evm);
        }
        if let Some(svm) = &self.svm {
            let fee_payers = svm.fee_payers().iter().map(|p| p.to_string()).collect();
            signers.insert("solana:*", fee_payers);
        }
        SupportedResponse {
            kinds,
            extensions: Some(self.extensions()),
            signers: Some(signers),
        }
    }

    /// `exact` on each served Solana network in `version`, named by `name`, with the fee payer
    /// the client must leave the first signature slot for.
    fn svm_kinds(&self, version: u32, name: fn(&svm::SvmNetwork) -> String) -> Vec<SupportedKind> {
        let Some(svm) = &self.svm else {
            return Vec::new();
        };
        let fee_payer = svm.fee_payers()[0].to_string();
        svm.networks()
            .iter()
            .map(|n| SupportedKind {
                x402_version: version,
                scheme: "exact",
                network: name(n),
                extra: Some(serde_json::json!({ "feePayer": fee_payer })),
            })
            .collect()
    }

    /// `/verify` of a Solana payment (svm.md §3), in its version's names.
    pub async fn verify_svm(&self, request: &SvmRequest) -> Result<VerifyResponse, SettleError> {
        let verdict = self.svm_verdict(request).await?;
        Ok(svm_wire::verify_answer(
            request.version(),
            request.transaction(),
            &verdict,
        ))
    }

    async fn svm_verdict(
        &self,
        request: &SvmRequest,
    ) -> Result<Result<svm::Verified, Refused>, SettleError> {
        let (svm, payment) = match self.svm_payment(request) {
            Ok(lowered) => lowered,
            Err(refused) => return Ok(Err(refused)),
        };
        if let Some(record) = svm.settlement_of(&self.ledger, &payment).await? {
            let signature = record.svm.map(|s| s.signature).unwrap_or_default();
            let message = match record.outcome {
                None => format!("transaction already being settled by {signature}"),
                Some(outcome) if outcome.success => {
                    format!("transaction already settled by {signature}")
                }
                Some(_) => format!("transaction {signature} already failed to settle"),
            };
            return Ok(Err(Invalid::new(Reason::Payload, message).into()));
        }
        let verified = {
            let chain = svm.network(payment.network).map(|n| n.chain.client());
            let _read = chain
                .expect("lowered onto a served network")
                .admit(Budget::Verify)?;
            match svm.verify(&self.ledger, &payment).await? {
                Ok(verified) => verified,
                Err(failure) => return Ok(Err(Refused::Svm(failure))),
            }
        };
        Ok(svm::cooled_down(&self.cooldown, &verified.transfer)
            .await?
            .map(|()| verified)
            .map_err(Refused::Svm))
    }

    /// The Solana family and the request lowered onto it, when its version and network are served.
    fn svm_payment(&self, request: &SvmRequest) -> Result<(&svm::SvmExact, svm::Payment), Refused> {
        let served = match request.version() {
            svm::Version::V1 => self.serves_v1,
            svm::Version::V2 => self.serves_v2(),
        };
        let svm = match &self.svm {
            Some(svm) if served => svm,
            _ => {
                let network = request.terms().0;
                let refused = Invalid::new(
                    Reason::Network,
                    format!("network {network:?} is not served"),
                );
                return Err(refused.into());
            }
        };
        Ok((svm, request.lower(svm)?))
    }

    /// `/settle` of a Solana payment (svm.md §4), in its version's names.
    pub async fn settle_svm(
        &self,
        request: &SvmRequest,
        asking: &Asking,
    ) -> Result<SettleResponse, SettleError> {
        let settled = match self.svm_payment(request) {
            Ok((svm, payment)) => {
                svm.settle(
                    &self.ledger,
                    &self.cooldown,
                    &payment,
                    asking,
                    self.settle_timeout,
                )
                .await
            }
            Err(refused) => Ok(svm::SvmSettled::Refused(refused)),
        };
        svm_wire::settle_answer(request, settled)
    }

    /// The v2 extensions routerd implements: `payment-identifier`, `eip2612GasSponsoring`
    /// where a token is paid through Permit2, and `bazaar` while the catalogue is on.
    fn extensions(&self) -> Vec<&'static str> {
        let permit2 = self
            .verifier
            .networks()
            .any(|n| n.tokens.iter().any(|t| t.permit2));
        let mut extensions = vec![v2::PAYMENT_IDENTIFIER];
        extensions.extend(permit2.then_some(eip2612::KEY));
        extensions.extend(
            self.catalogue
                .is_some()
                .then_some(discovery::declaration::KEY),
        );
        extensions
    }

    /// x402's `upto` on each v2 network with a token paid through Permit2. Its witness names the
    /// signer that must send the settlement: the first signer is advertised (any of them is
    /// accepted, and the settlement goes out on that signer's lane).
    fn upto_kinds(&self, v2_networks: &BTreeMap<u64, String>) -> Vec<SupportedKind> {
        let Some(signer) = self.signers.first() else {
            return Vec::new();
        };
        v2_networks
            .iter()
            .filter(|(_, name)| {
                self.verifier
                    .network(name)
                    .is_some_and(|n| n.tokens.iter().any(|t| t.permit2))
            })
            .map(|(&chain_id, _)| SupportedKind {
                x402_version: 2,
                scheme: "upto",
                network: v2::network_id(chain_id),
                extra: Some(serde_json::json!({ "facilitatorAddress": to_checksum(signer, None) })),
            })
            .collect()
    }

    /// Verify's rules from rule 6 on, and one more: a payment whose nonce is claimed for
    /// settlement (by this or any other authorization) is not one a merchant may deliver on
    /// (access.md §1).
    async fn verdict(&self, request: &Request) -> Result<Result<(), Invalid>, SettleError> {
        let payment = match self.verifier.check_local(request) {
            Err(failure) => return Ok(Err(failure)),
            Ok(payment) => payment,
        };
        if let Err(failure) = evm::verify::check_upto_maximum(&payment) {
            return Ok(Err(failure));
        }
        let message = match self.settler.claim_on(&payment).await? {
            None => {
                let _read = payment.network.chain.client.admit(Budget::Verify)?;
                return Ok(self.verifier.check_on_chain(&payment).await?);
            }
            Some(ClaimOn::BeingSettled) => "authorization already being settled",
            Some(ClaimOn::Settled) => "authorization already settled",
        };
        Ok(Err(Invalid::new(Reason::AlreadySettled, message)))
    }

    /// `/verify` in x402 v1: v1's rules 1-3, the shared rules, answered in v1's names.
    pub async fn verify(
        &self,
        request: &v1::PaymentRequest,
    ) -> Result<VerifyResponse, SettleError> {
        let verdict = match self.lower_v1(request) {
            Err(refused) => Err(refused),
            Ok(lowered) => self.verdict(&lowered).await?,
        };
        Ok(v1::verify_answer(request, verdict))
    }

    /// `/settle` in x402 v1. `asking` names the request for its retries: see [`Asking`].
    pub async fn settle(
        &self,
        request: &v1::PaymentRequest,
        asking: &Asking,
    ) -> Result<SettleResponse, SettleError> {
        let begun = Box::pin(self.begin(self.lower_v1(request), asking)).await?;
        let settled = self.settler.finish(begun, asking).await?;
        Ok(v1::settle_answer(request, settled))
    }

    /// A v1 request lowered; with `x402_versions` lacking 1, a v1 body fails rule 1 as any other
    /// version would.
    fn lower_v1(&self, request: &v1::PaymentRequest) -> Result<Request, Invalid> {
        if !self.serves_v1 {
            return Err(Invalid::new(
                Reason::X402Version,
                "x402Version 1 is not served (facilitator.x402_versions)",
            ));
        }
        v1::lower(request, self.verifier.as_ref())
    }

    /// Whether a v2 request may be parsed as v2 at all (`facilitator.x402_versions`).
    pub fn serves_v2(&self) -> bool {
        self.v2_networks.is_some()
    }

    /// `/verify` in x402 v2: v2's own rules, then the shared ones, answered in v2's names.
    pub async fn verify_v2(
        &self,
        request: &v2::PaymentRequest,
    ) -> Result<VerifyResponse, SettleError> {
        let verdict = match self.lower_v2(request) {
            Err(refused) => Err(refused),
            Ok(lowered) => self.verdict(&lowered).await?,
        };
        Ok(v2::verify_answer(request, verdict))
    }

    /// `/settle` in x402 v2: v2's own rules, then the one settlement path, answered in v2's
    /// names and network.
    pub async fn settle_v2(
        &self,
        request: &v2::PaymentRequest,
        asking: &Asking,
    ) -> Result<SettleResponse, SettleError> {
        let begun = Box::pin(self.begin(self.lower_v2(request), asking)).await;
        let outcome = match begun {
            Ok(begun) => self.settler.finish(begun, asking).await,
            Err(error) => Err(error),
        };
        v2::settle_answer(request, outcome)
    }

    /// The request's part of a settlement (`Settler::begin`) for a lowered request. Boxed by its
    /// callers: the lowered request and everything read for it are freed before the wait.
    async fn begin(
        &self,
        lowered: Result<Request, Invalid>,
        asking: &Asking,
    ) -> Result<Begun, SettleError> {
        match lowered {
            Err(refused) => Ok(Begun::answered(Settled::failed(refused))),
            Ok(lowered) => self.settler.begin(&lowered, asking).await,
        }
    }

    /// Lists the resource a v2 settle paid for when routerd answered it with success and its
    /// payload declares it (`bazaar`); `private`: the settling API key keeps its listings to
    /// keys that may settle for their payTo. Never changes the answer.
    pub async fn discovered(
        &self,
        request: &v2::PaymentRequest,
        answer: &SettleResponse,
        private: bool,
    ) {
        if let (Some(catalogue), true) = (&self.catalogue, answer.success) {
            catalogue.record(request, private).await;
        }
    }

    /// The discovery catalogue, when on.
    pub fn catalogue(&self) -> Option<&Catalogue> {
        self.catalogue.as_deref()
    }

    /// The configured name of a network given by that name or, when v2 is served, by its CAIP-2
    /// name (`eip155:84532`); anything else is returned as given (and matches no payment).
    pub fn network_name<'a>(&'a self, given: &'a str) -> &'a str {
        self.v2_networks
            .as_ref()
            .and_then(|networks| v2::served_network(given, networks))
            .map_or(given, String::as_str)
    }

    fn lower_v2(&self, request: &v2::PaymentRequest) -> Result<Request, Invalid> {
        let networks = self.v2_networks.as_ref().expect("checked by serves_v2");
        v2::lower(request, networks, self.verifier.as_ref())
    }

    /// What happened to one payment, or `None` if routerd never settled it.
    pub async fn status(&self, key: &PaymentKey) -> Result<Option<SettlementStatus>, StoreError> {
        let found = self.settler.status(key).await?;
        Ok(found.map(|(record, head)| protocol::status::answer(&record, head)))
    }

    /// What happened to one Solana payment, by its network (v1 name or CAIP-2) and its
    /// transaction's signature; `None` if routerd never settled it (or the network is not served).
    /// Answered from the store: the follower keeps a pending record current.
    pub async fn svm_status(
        &self,
        network: &str,
        signature: &crate::svm::Signature,
    ) -> Result<Option<types::SvmSettlementStatus>, StoreError> {
        let Some(network) = self.svm.as_ref().and_then(|svm| {
            svm.networks()
                .iter()
                .find(|n| n.name == network || n.caip2 == network)
        }) else {
            return Ok(None);
        };
        let key = svm::payment_key(network.name, signature);
        let record = self.ledger.get(&key).await?;
        let Some(mut status) = record.as_ref().and_then(svm_wire::status_answer) else {
            return Ok(None);
        };
        if let Some(slot) = status.slot {
            // One slot read per chain and slot, however many ask (access.md 3c); the stored
            // answer stands when the cluster cannot be read.
            let now = network.chain.recent_slot(slot).await;
            status.confirmations = now.and_then(|now| svm::confirmations(slot, now));
        }
        Ok(Some(status))
    }

    /// The deny list both families read; a reload replaces it for both.
    pub fn deny_list(&self) -> &Arc<DenyLists> {
        &self.deny_list
    }

    pub async fn surrender_lanes(&self) {
        self.settler.surrender_lanes().await
    }

    pub fn lost_settlements(&self) -> u64 {
        self.settler.lost_settlements()
    }

    /// Payers refused by this instance since start because a settlement of theirs reverted on
    /// chain.
    pub fn revert_cooldowns(&self) -> u64 {
        self.cooldown.imposed()
    }

    /// Block-to-answer times of both families' settlements.
    pub fn answer_times(&self) -> &settlement::answer_times::AnswerTimes {
        self.settler.answer_times()
    }

    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    pub fn lanes(&self) -> impl Iterator<Item = &Arc<Lane>> {
        self.settler.lanes().all()
    }

    pub fn pending_settlements(&self) -> usize {
        self.settler.pending_settlements()
    }
}

/// A lane, and the queue its worker takes settlements from.
type LaneQueue = (Arc<Lane>, mpsc::Receiver<Record>);

/// The served EVM networks, and a lane per signer on each.
fn evm_networks(
    settings: &FacilitatorSettings,
    chain_settings: &BTreeMap<String, ChainSettings>,
    chains: &BTreeMap<String, Arc<Chain>>,
    signers: &[Arc<Signer>],
    cooldown: &Arc<Cooldown>,
) -> (Vec<Network>, Vec<LaneQueue>) {
    let mut networks = Vec::new();
    let mut lanes = Vec::new();
    for name in settings.evm_networks() {
        let chain = chains[name].clone();
        let tokens = chain_settings[name]
            .tokens
            .values()
            .map(|t| token_info(t, chain.settings.chain_id))
            .collect();
        let settings = lane_settings(&chain, settings.bump_after_blocks);
        for signer in signers {
            lanes.push(Lane::new(
                chain.clone(),
                signer.clone(),
                settings.clone(),
                cooldown.clone(),
            ));
        }
        networks.push(Network {
            permit2_domain: permit2::domain_separator(chain.settings.chain_id),
            name: name.clone(),
            chain,
            tokens,
            settle_gas: OnceLock::new(),
        });
    }
    (networks, lanes)
}

fn lane_settings(chain: &Chain, bump_after_blocks: u64) -> LaneSettings {
    LaneSettings {
        confirmations: chain.settings.confirmations,
        finality_depth: chain.settings.finality_depth,
        bump_after_blocks,
        max_fee_per_gas: chain.fee_cap(),
        max_settlement_cost: chain.settings.max_settlement_cost(),
        operator_caps: chain.settings.operator_fee_caps(),
    }
}

fn token_info(token: &crate::config::TokenSettings, chain_id: u64) -> TokenInfo {
    let address: Address = token.address.parse().expect("validated by config");
    TokenInfo {
        address,
        domain_separator: erc3009::domain_separator(
            &token.eip712_name,
            &token.eip712_version,
            chain_id,
            address,
        ),
        eip712_name: token.eip712_name.clone(),
        eip712_version: token.eip712_version.clone(),
        eip3009: token.transfer_methods.contains(&TransferMethod::Eip3009),
        permit2: token.transfer_methods.contains(&TransferMethod::Permit2),
    }
}
