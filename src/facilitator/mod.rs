//! The x402 facilitator's facade: supported kinds, verify, settle and status, for each served
//! protocol version and family. A request's kind (version, CAIP-2 namespace, scheme) is looked
//! up once in the `registry`, and the `mechanism` serving it reads, verifies and settles it. No
//! HTTP in here.

pub mod deny_list;
pub mod discovery;
pub mod evm;
mod funds;
pub mod mechanism;
pub mod outcome;
pub mod protocol;
pub mod readiness;
pub mod registry;
pub mod settlement;
pub mod svm;
pub mod types;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ethers_core::types::Address;
use tokio::sync::mpsc;

use crate::chain::Chain;
use crate::config::{ChainSettings, FacilitatorSettings, Settings, TransferMethod};
use crate::evm::{erc3009, permit2};
use crate::ledger::EvmRecord;
use crate::signer::{load_authorizer, load_signers, Authorizer, Signer};
use crate::store::Storage;
use deny_list::DenyLists;
use discovery::Catalogue;
use evm::exact::EvmExact;
use evm::request::TokenInfo;
use evm::verify::{Network, Verifier};
pub use evm::{Lane, LaneSettings};
use mechanism::Mechanism;
pub use mechanism::{Payee, Payment, StatusLookup};
pub use outcome::SettleError;
use protocol::v2;
use registry::Registry;
use settlement::cooldown::Cooldown;
use svm::mechanism::SvmMechanism;
use types::{SupportedKind, SupportedResponse};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("facilitator.deny_list_file: {0}")]
    DenyList(#[from] deny_list::DenyListError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    Signer(#[from] crate::signer::SignerError),
    #[error("{0}")]
    FeePayer(#[from] svm::FeePayerError),
    #[error("chains.{0}.rpc_urls: {1}")]
    Chain(String, String),
    #[error("{0}")]
    Authorizer(#[from] crate::signer::AuthorizerError),
}

/// The keys the daemon loaded for the facilitator: the signers, each sending transactions from
/// its lanes, and the `batch-settlement` receiver authorizer, which signs EIP-712
/// authorizations only (never a transaction: it is no signer and has no lane).
pub struct FacilitatorKeys {
    pub signers: Vec<Arc<Signer>>,
    pub receiver_authorizer: Option<Authorizer>,
}

pub struct Facilitator {
    verifier: Arc<Verifier>,
    settler: Arc<evm::settle::Settler>,
    max_batch: usize,
    serves_v1: bool,
    /// Served chain ids and their configured network names, when x402 v2 is served.
    v2_networks: Option<BTreeMap<u64, String>>,
    cooldown: Arc<Cooldown>,
    /// Solana's `exact`, when a Solana network is served: its fee payers' funds for `/ready`.
    svm: Option<Arc<svm::SvmExact>>,
    /// The settlement store, for `/ready`'s probe.
    ledger: Storage,
    /// Which mechanism serves which kind of payment.
    registry: Registry,
    /// The discovery catalogue, when on (`facilitator.discovery`, with v2 served).
    catalogue: Option<Arc<Catalogue>>,
    /// Signers' and fee payers' funds as last read, for `/ready` and `/metrics`.
    funds: readiness::KeptFunds,
    /// `facilitator.deny_list_file` as last read, for SIGHUP to read again.
    deny_list: Arc<DenyLists>,
    /// `facilitator.receiver_authorizer_key_file`'s key, when configured.
    receiver_authorizer: Option<Arc<Authorizer>>,
}

impl Facilitator {
    /// The facilitator `f` configures, each family with its keys: the EVM signers when an EVM
    /// network is served, Solana's clusters and fee payers when a Solana one is (a facilitator
    /// serving one family needs no key of the other). `chains` are the connected EVM chains.
    pub fn configured(
        settings: &Settings,
        f: &FacilitatorSettings,
        chains: &BTreeMap<String, Arc<Chain>>,
        store: Storage,
        lease: evm::LeaseSettings,
    ) -> Result<Self, SetupError> {
        let signers = match f.evm_networks().next() {
            Some(_) => load_signers(&f.signer_key_file)?
                .into_iter()
                .map(Arc::new)
                .collect(),
            None => Vec::new(),
        };
        // Not a signer: it signs authorizations, never a transaction, and gets no lane.
        let receiver_authorizer = load_authorizer(&f.receiver_authorizer_key_file)?;
        let keys = FacilitatorKeys {
            signers,
            receiver_authorizer,
        };
        let svm = svm::SvmExact::configured(f, &settings.solana_chains)?;
        Self::new(f, &settings.chains, chains, keys, svm, store, lease)
    }

    pub fn new(
        settings: &FacilitatorSettings,
        chain_settings: &BTreeMap<String, ChainSettings>,
        chains: &BTreeMap<String, Arc<Chain>>,
        keys: FacilitatorKeys,
        svm: Option<svm::SvmExact>,
        store: Storage,
        lease: evm::LeaseSettings,
    ) -> Result<Self, SetupError> {
        let FacilitatorKeys {
            signers,
            receiver_authorizer,
        } = keys;
        let deny_list = load_deny_list(settings)?;
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
        let svm = svm.map(|svm| Arc::new(svm.answer_times(settler.answer_times().clone())));
        let evm = EvmExact {
            verifier: verifier.clone(),
            settler: settler.clone(),
            serves_v1: settings.serves_version(1),
            v2_networks: v2_networks.clone(),
            catalogue: catalogue.clone(),
            signers: signers.iter().map(|s| s.address).collect(),
        };
        let receiver_authorizer = receiver_authorizer.map(Arc::new);
        let batch = settings.batch_settlement.then(|| {
            let networks = v2_networks.clone().unwrap_or_default();
            let authorizer = receiver_authorizer.clone();
            let max_calls = settings.batch_max_calls_per_tx;
            evm::batch::EvmBatch::new(&verifier, &settler, networks, authorizer, max_calls, &store)
        });
        let registry = registry(settings, evm, batch, svm.clone(), &store, &cooldown);
        Ok(Self {
            verifier,
            settler,
            max_batch: settings.max_batch,
            serves_v1: settings.serves_version(1),
            v2_networks,
            cooldown,
            svm,
            ledger: store,
            registry,
            catalogue,
            funds: readiness::KeptFunds::default(),
            deny_list,
            receiver_authorizer,
        })
    }

    /// A payment body (one payment, not an array) read straight into the wire type of the
    /// mechanism serving its kind, without building a JSON tree first; `None` sends it the
    /// checked way ([`Facilitator::read_payment`]), which reads it the same and names the field
    /// of any failure.
    ///
    /// Only a body that says its version at the top level, as a number, is read here: then it is
    /// the version [`protocol::version_of`] reads. A body with no `[` anywhere cannot hold an
    /// array where an object belongs, which serde's derive would otherwise read as a tuple of
    /// fields.
    pub fn read_payment_direct(&self, bytes: &[u8]) -> Option<Box<dyn Payment + '_>> {
        let kind = registry::peek(bytes)?;
        let version = registry::read_as(Some(kind.version), self.serves_v2());
        let mechanism =
            self.registry
                .lookup(version, kind.network.as_deref(), kind.scheme.as_deref());
        mechanism.read_direct(version, bytes)
    }

    /// A payment already read as JSON, checked field by field by the mechanism serving its
    /// kind: a failure names the field, after `prefix` (an array settle's `[i]`).
    pub fn read_payment(
        &self,
        body: serde_json::Value,
        prefix: &str,
    ) -> Result<Box<dyn Payment + '_>, String> {
        let version = registry::read_as(protocol::version_of(&body), self.serves_v2());
        self.registry.read(version, body, prefix)
    }

    /// The settlement a status path (after `/settlements/`) names, or the message naming what
    /// is wrong with the path.
    pub fn status_of(&self, path: &str) -> Result<Box<dyn StatusLookup + '_>, String> {
        self.registry.status(path)
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
        let mut resumed = 0;
        for mechanism in self.registry.mechanisms() {
            resumed += mechanism.start().await?;
        }
        Ok(resumed)
    }

    /// The nodes only the facilitator reads, by name, with their clients (their upstream
    /// counts go to `/metrics`): each family's own.
    pub fn own_upstreams(&self) -> impl Iterator<Item = (&str, &crate::chain::ChainClient)> {
        self.registry
            .families()
            .flat_map(|family| family.upstreams())
    }

    /// What each mechanism must hold before serving (its nodes of the configured networks, its
    /// assets paying what they say, its contracts), or the message naming what does not; call
    /// before serving.
    pub async fn check(&self) -> Result<(), String> {
        for mechanism in self.registry.mechanisms() {
            mechanism.check().await?;
        }
        Ok(())
    }

    /// v1's kinds name the configured networks; v2's name them by CAIP-2 id and come with v2's
    /// `extensions` (`payment-identifier`: its id is a settle's retry key) and `signers`.
    pub fn supported(&self) -> SupportedResponse {
        let families = || self.registry.mechanisms();
        let mut kinds: Vec<SupportedKind> = Vec::new();
        if self.serves_v1 {
            kinds.extend(families().flat_map(|m| m.supported(1)));
        }
        kinds.sort_by(|a, b| a.network.cmp(&b.network));
        if !self.serves_v2() {
            return SupportedResponse {
                kinds,
                extensions: None,
                signers: None,
            };
        }
        kinds.extend(families().flat_map(|m| m.supported(2)));
        SupportedResponse {
            kinds,
            extensions: Some(self.extensions()),
            signers: Some(families().filter_map(|m| m.signers()).collect()),
        }
    }

    /// The v2 extensions routerd implements: `payment-identifier`, each mechanism's own
    /// (EVM's `eip2612GasSponsoring` where a token is paid through Permit2), and `bazaar` while
    /// the catalogue is on.
    fn extensions(&self) -> Vec<&'static str> {
        let mut extensions = vec![v2::PAYMENT_IDENTIFIER];
        extensions.extend(self.registry.mechanisms().flat_map(|m| m.extensions()));
        extensions.extend(
            self.catalogue
                .is_some()
                .then_some(discovery::declaration::KEY),
        );
        extensions
    }

    /// Whether a v2 request may be parsed as v2 at all (`facilitator.x402_versions`).
    pub fn serves_v2(&self) -> bool {
        self.v2_networks.is_some()
    }

    /// The discovery catalogue, when on.
    pub fn catalogue(&self) -> Option<&Catalogue> {
        self.catalogue.as_deref()
    }

    /// The `batch-settlement` receiver authorizer, when its key is configured.
    pub fn receiver_authorizer(&self) -> Option<&Arc<Authorizer>> {
        self.receiver_authorizer.as_ref()
    }

    /// The deny list both families read; a reload replaces it for both.
    pub fn deny_list(&self) -> &Arc<DenyLists> {
        &self.deny_list
    }

    /// Hands what each mechanism holds (the EVM lanes) over to other instances, at shutdown.
    pub async fn stop(&self) {
        for mechanism in self.registry.mechanisms() {
            mechanism.stop().await;
        }
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
type LaneQueue = (Arc<Lane>, mpsc::Receiver<EvmRecord>);

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

/// `facilitator.deny_list_file`, read at start.
fn load_deny_list(settings: &FacilitatorSettings) -> Result<Arc<DenyLists>, SetupError> {
    let (deny_list, summary) = DenyLists::load(&settings.deny_list_file)?;
    if deny_list.configured() {
        tracing::info!("facilitator.deny_list_file: {summary}");
    }
    Ok(Arc::new(deny_list))
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

/// The table of mechanisms: EVM's, and Solana's (which answers `invalid_network` while no
/// Solana network is served).
fn registry(
    settings: &FacilitatorSettings,
    evm: EvmExact,
    batch: Option<evm::batch::EvmBatch>,
    svm: Option<Arc<svm::SvmExact>>,
    store: &Storage,
    cooldown: &Arc<Cooldown>,
) -> Registry {
    let svm = SvmMechanism {
        exact: svm,
        ledger: store.clone(),
        cooldown: cooldown.clone(),
        settle_timeout: Duration::from_secs(settings.settle_timeout_secs),
        serves_v1: settings.serves_version(1),
        serves_v2: settings.serves_version(2),
    };
    let schemes = batch.map(|b| -> Arc<dyn Mechanism> { Arc::new(b) });
    Registry::new(
        vec![Arc::new(evm), Arc::new(svm)],
        schemes.into_iter().collect(),
    )
}
