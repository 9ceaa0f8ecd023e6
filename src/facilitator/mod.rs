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
use std::sync::Arc;
use std::time::Duration;

use crate::chain::Chain;
use crate::config::{FacilitatorSettings, Settings};
use crate::signer::Authorizer;
use crate::store::Storage;
use deny_list::DenyLists;
use discovery::Catalogue;
pub use mechanism::{Payee, Payment, StatusLookup};
pub use outcome::SettleError;
use protocol::v2;
use registry::{Registry, Setup};
use settlement::answer_times::AnswerTimes;
use settlement::cooldown::Cooldown;
use types::{SupportedKind, SupportedResponse};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("facilitator.deny_list_file: {0}")]
    DenyList(#[from] deny_list::DenyListError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("chains.{0}.rpc_urls: {1}")]
    Chain(String, String),
    #[error("{0}")]
    Authorizer(#[from] crate::signer::AuthorizerError),
    /// A family's own keys or settings, in its own words.
    #[error(transparent)]
    Family(Box<dyn std::error::Error + Send + Sync>),
}

impl SetupError {
    /// A family's own setup error, shown as it writes it.
    pub fn family(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        SetupError::Family(Box::new(error))
    }
}

pub struct Facilitator {
    max_batch: usize,
    serves_v1: bool,
    serves_v2: bool,
    cooldown: Arc<Cooldown>,
    /// Block-to-answer times of every family's settlements.
    answer_times: AnswerTimes,
    /// The settlement store, for `/ready`'s probe.
    ledger: Storage,
    /// Which mechanism serves which kind of payment.
    registry: Registry,
    /// The discovery catalogue, when on (`facilitator.discovery`, with v2 served).
    catalogue: Option<Arc<Catalogue>>,
    /// `facilitator.deny_list_file` as last read, for SIGHUP to read again.
    deny_list: Arc<DenyLists>,
    /// `facilitator.receiver_authorizer_key_file`'s key, when configured.
    receiver_authorizer: Option<Arc<Authorizer>>,
}

impl Facilitator {
    /// The facilitator `f` configures: what every family shares, then each family's mechanisms
    /// with its own keys (`registry::FAMILIES`; a facilitator serving one family needs no key of
    /// another). `chains` are the connected chains of `[chains]`.
    pub fn configured(
        settings: &Settings,
        f: &FacilitatorSettings,
        chains: &BTreeMap<String, Arc<Chain>>,
        store: Storage,
    ) -> Result<Self, SetupError> {
        let cooldown = Arc::new(Cooldown::new(
            Duration::from_secs(f.revert_cooldown_secs),
            store.clone(),
        ));
        let catalogue = Catalogue::new(f, store.clone());
        let answer_times = AnswerTimes::default();
        let shared = (&cooldown, &answer_times, &catalogue);
        let setup = Setup::new(settings, f, chains, &store, shared);
        let registry = Registry::configured(&setup)?;
        let deny_list = setup.deny_list()?;
        let receiver_authorizer = setup.receiver_authorizer()?;
        Ok(Self {
            max_batch: f.max_batch,
            serves_v1: f.serves_version(1),
            serves_v2: f.serves_version(2),
            cooldown,
            answer_times,
            ledger: store,
            registry,
            catalogue,
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
        self.serves_v2
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

    /// Settlements answered with success whose transaction can no longer land, of every
    /// mechanism.
    pub fn lost_settlements(&self) -> u64 {
        self.registry.mechanisms().map(|m| m.lost()).sum()
    }

    /// Payers refused by this instance since start because a settlement of theirs reverted on
    /// chain.
    pub fn revert_cooldowns(&self) -> u64 {
        self.cooldown.imposed()
    }

    /// Block-to-answer times of every family's settlements.
    pub fn answer_times(&self) -> &AnswerTimes {
        &self.answer_times
    }

    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Who sends each mechanism's settlements, each as `network:key`.
    pub fn senders(&self) -> Vec<String> {
        self.registry
            .mechanisms()
            .flat_map(|m| m.senders())
            .collect()
    }

    /// Settle requests waiting on a settlement now, of every mechanism.
    pub fn pending_settlements(&self) -> usize {
        self.registry.mechanisms().map(|m| m.pending()).sum()
    }
}
