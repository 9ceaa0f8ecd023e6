//! Solana's `exact` as a mechanism: a body read in its version's wire type (`wire`), verified
//! and settled (svm.md §3 and §4) and answered in its version's names; and a settlement's status
//! by its transaction's signature (`/settlements/{network}/{signature}`).

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use super::readiness::{fee_payer_funds, FeePayerFunds};
use super::wire::{self, Refused, SvmRequest, SvmSettlementStatus};
use super::{cooled_down, payment_key, SvmExact, SvmNetwork, SvmSettled, Version};
use crate::chain::Budget;
use crate::chain::ChainClient;
use crate::facilitator::funds::Kept;
use crate::facilitator::mechanism::{
    Answer, Found, Later, Mechanism, Payee, Payment, StatusLookup,
};
use crate::facilitator::outcome::{Invalid, SettleError};
use crate::facilitator::protocol::read::read_value;
use crate::facilitator::protocol::v1::{SettleResponse, VerifyResponse};
use crate::facilitator::readiness::Funds;
use crate::facilitator::registry::{Built, Declared, Setup};
use crate::facilitator::settlement::cooldown::Cooldown;
use crate::facilitator::types::SupportedKind;
use crate::ledger::{Asking, Reason, SvmRecord};
use crate::store::{Storage, StoreError};
use crate::svm::{Pubkey, Signature};

/// The CAIP-2 namespace of Solana clusters.
pub const NAMESPACE: &str = "solana";

/// Solana as the registry knows it before any cluster is configured.
pub const DECLARED: Declared = Declared {
    payee,
    names: spelled,
    build,
};

/// The Solana mechanism `setup` configures: its clusters and fee payers when a Solana network is
/// served (a facilitator serving none needs no fee payer key), else one that refuses every
/// Solana network as unserved.
fn build(setup: &Setup) -> Built {
    let f = setup.facilitator;
    let exact = match SvmExact::configured(f, &setup.settings.solana_chains)? {
        Some(exact) => {
            let exact = exact.deny(setup.deny_list()?);
            Some(Arc::new(exact.answer_times(setup.answer_times.clone())))
        }
        None => None,
    };
    let mechanism = SvmMechanism {
        exact,
        ledger: setup.store.clone(),
        cooldown: setup.cooldown.clone(),
        settle_timeout: Duration::from_secs(f.settle_timeout_secs),
        serves_v1: f.serves_version(1),
        serves_v2: f.serves_version(2),
        funds: Kept::default(),
    };
    Ok(vec![Arc::new(mechanism)])
}

/// Solana's namespace for a network named in its spelling (`solana`, `solana-<cluster>`,
/// `solana:<genesis>`), whether or not routerd knows or serves the cluster.
fn spelled(network: &str) -> Option<&'static str> {
    let ours =
        network == NAMESPACE || network.starts_with("solana-") || network.starts_with("solana:");
    ours.then_some(NAMESPACE)
}

/// The Solana mechanism: the served clusters, when any, and what its settlements share with
/// the EVM ones (the store, the revert cooldown).
pub struct SvmMechanism {
    /// Solana's `exact`, when a Solana network is served.
    exact: Option<Arc<SvmExact>>,
    ledger: Storage,
    cooldown: Arc<Cooldown>,
    /// The longest a settle waits for its outcome (`facilitator.settle_timeout_secs`).
    settle_timeout: Duration,
    serves_v1: bool,
    serves_v2: bool,
    /// The fee payers' lamports as last read on each cluster.
    funds: Kept<FeePayerFunds>,
}

impl SvmMechanism {
    /// `exact` on each served Solana network in `version`, named by `name`, with the fee payer
    /// the client must leave the first signature slot for.
    fn kinds(&self, version: u32, name: fn(&SvmNetwork) -> String) -> Vec<SupportedKind> {
        let Some(svm) = &self.exact else {
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
    async fn verify(&self, request: &SvmRequest) -> Result<VerifyResponse, SettleError> {
        let verdict = self.verdict(request).await?;
        Ok(wire::verify_answer(
            request.version(),
            request.transaction(),
            &verdict,
        ))
    }

    async fn verdict(
        &self,
        request: &SvmRequest,
    ) -> Result<Result<super::Verified, Refused>, SettleError> {
        let (svm, payment) = match self.payment(request) {
            Ok(lowered) => lowered,
            Err(refused) => return Ok(Err(refused)),
        };
        if let Some(record) = svm.settlement_of(&self.ledger, &payment).await? {
            let signature = record.svm().map(|s| s.settlement.signature.clone());
            let signature = signature.unwrap_or_default();
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
        Ok(cooled_down(&self.cooldown, &verified.transfer)
            .await?
            .map(|()| verified)
            .map_err(Refused::Svm))
    }

    /// The Solana family and the request lowered onto it, when its version and network are served.
    fn payment(&self, request: &SvmRequest) -> Result<(&SvmExact, super::Payment), Refused> {
        let served = match request.version() {
            Version::V1 => self.serves_v1,
            Version::V2 => self.serves_v2,
        };
        let svm = match &self.exact {
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
    async fn settle(
        &self,
        request: &SvmRequest,
        asking: &Asking,
    ) -> Result<SettleResponse, SettleError> {
        let settled = match self.payment(request) {
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
            Err(refused) => Ok(SvmSettled::Refused(refused)),
        };
        wire::settle_answer(request, settled)
    }

    /// What happened to one Solana payment, by its network (v1 name or CAIP-2) and its
    /// transaction's signature; `None` if routerd never settled it (or the network is not served).
    /// Answered from the store: the follower keeps a pending record current.
    async fn status(
        &self,
        network: &str,
        signature: &Signature,
    ) -> Result<Option<SvmSettlementStatus>, StoreError> {
        let Some(network) = self.exact.as_ref().and_then(|svm| {
            svm.networks()
                .iter()
                .find(|n| n.name == network || n.caip2 == network)
        }) else {
            return Ok(None);
        };
        let key = payment_key(network.name, signature);
        let record = self.ledger.get(&key).await?;
        let Some(mut status) = record.as_ref().and_then(wire::status_answer) else {
            return Ok(None);
        };
        if let Some(slot) = status.slot {
            // One slot read per chain and slot, however many ask (access.md 3c); the stored
            // answer stands when the cluster cannot be read.
            let now = network.chain.recent_slot(slot).await;
            status.confirmations = now.and_then(|now| super::confirmations(slot, now));
        }
        Ok(Some(status))
    }
}

/// An API key's payTo, when it is a Solana public key in base58.
pub fn payee(text: &str) -> Option<Payee> {
    Pubkey::from_str(text).ok().map(key_payee)
}

fn key_payee(key: Pubkey) -> Payee {
    Payee {
        namespace: NAMESPACE,
        key: key.to_bytes().into(),
    }
}

impl SvmRequest {
    /// A body read as JSON into its version's wire type, field by field.
    pub fn read(version: u64, body: serde_json::Value, prefix: &str) -> Result<Self, String> {
        match version {
            2 => read_value(body, wire::V2_OBJECTS, prefix).map(SvmRequest::V2),
            _ => read_value(body, wire::V1_OBJECTS, prefix).map(SvmRequest::V1),
        }
    }

    /// A Solana payment is its message: the log names its network, asset and payTo.
    pub fn label(&self) -> String {
        let (network, pay_to, asset) = self.terms();
        format!("{network}|{asset}|{pay_to}")
    }

    /// v2's `payment-identifier` id; v1 has none.
    pub fn payment_identifier(&self) -> Result<Option<&str>, String> {
        match self {
            SvmRequest::V1(_) => Ok(None),
            SvmRequest::V2(p) => p.payment_payload.payment_identifier(),
        }
    }
}

/// A payment and the mechanism serving it.
struct Served<'a> {
    mechanism: &'a SvmMechanism,
    request: SvmRequest,
}

impl Payment for Served<'_> {
    fn label(&self) -> String {
        self.request.label()
    }

    fn payment_identifier(&self) -> Result<Option<&str>, String> {
        self.request.payment_identifier()
    }

    fn payee(&self) -> Option<Payee> {
        payee(self.request.terms().1)
    }

    fn family(&self) -> &'static str {
        "svm"
    }

    fn verify(&self) -> Answer<'_, VerifyResponse> {
        Box::pin(self.mechanism.verify(&self.request))
    }

    fn settle<'a>(&'a self, asking: &'a Asking, _private: bool) -> Answer<'a, SettleResponse> {
        Box::pin(self.mechanism.settle(&self.request, asking))
    }
}

impl Mechanism for SvmMechanism {
    fn namespace(&self) -> &'static str {
        NAMESPACE
    }

    fn kinds(&self) -> &'static [(u64, &'static str)] {
        &[(1, "exact"), (2, "exact")]
    }

    /// Its nodes are of their clusters (`getGenesisHash`), and no configured mint's extensions
    /// change what the payee receives.
    fn check(&self) -> Later<'_, Result<(), String>> {
        Box::pin(async {
            let Some(exact) = &self.exact else {
                return Ok(());
            };
            exact.check_genesis().await?;
            exact.check_mints().await
        })
    }

    /// Follows every unfinished Solana settlement of a served cluster again.
    fn start(&self) -> Answer<'_, usize> {
        Box::pin(async {
            let Some(exact) = &self.exact else {
                return Ok(0);
            };
            let unfinished = self.ledger.unfinished().await?;
            let records = unfinished
                .into_iter()
                .filter_map(|r| SvmRecord::try_from(r).ok())
                .collect();
            Ok(exact.resume(&self.ledger, &self.cooldown, records))
        })
    }

    /// Every fee payer on every served cluster, with its lamports as last read.
    fn funds(&self) -> Later<'_, Vec<Funds>> {
        Box::pin(async {
            let Some(exact) = &self.exact else {
                return Vec::new();
            };
            let funds = fee_payer_funds(exact, &self.funds).await;
            funds.iter().map(FeePayerFunds::report).collect()
        })
    }

    /// The clusters' nodes: only the facilitator reads them.
    fn upstreams(&self) -> Vec<(&str, &ChainClient)> {
        let networks = self.exact.iter().flat_map(|svm| svm.networks());
        networks
            .map(|n| (n.chain.name.as_str(), n.chain.client()))
            .collect()
    }

    /// Always the checked way.
    fn read_direct(&self, _version: u64, _bytes: &[u8]) -> Option<Box<dyn Payment + '_>> {
        None
    }

    fn read(
        &self,
        version: u64,
        body: serde_json::Value,
        prefix: &str,
    ) -> Result<Box<dyn Payment + '_>, String> {
        let request = SvmRequest::read(version, body, prefix)?;
        Ok(Box::new(Served {
            mechanism: self,
            request,
        }))
    }

    fn status_form(&self) -> &'static str {
        "/settlements/{network}/{signature}"
    }

    /// `exact` on each served cluster, by its v1 name or its CAIP-2 id.
    fn supported(&self, version: u32) -> Vec<SupportedKind> {
        match version {
            1 => self.kinds(1, |n| n.name.to_string()),
            _ => self.kinds(version, |n| n.caip2.clone()),
        }
    }

    /// The fee payers, while a cluster is served.
    fn signers(&self) -> Option<(&'static str, Vec<String>)> {
        let svm = self.exact.as_ref()?;
        let fee_payers = svm.fee_payers().iter().map(|p| p.to_string()).collect();
        Some(("solana:*", fee_payers))
    }

    fn status<'a>(&'a self, segments: &[&str]) -> Result<Box<dyn StatusLookup + 'a>, String> {
        let [network, signature] = segments else {
            return Err("path: two segments expected".to_string());
        };
        let signature = signature
            .parse()
            .map_err(|_| "signature: not a base58 transaction signature".to_string())?;
        Ok(Box::new(Status {
            mechanism: self,
            network: network.to_string(),
            signature,
        }))
    }
}

/// One Solana payment's settlement, by its network and its transaction's signature.
struct Status<'a> {
    mechanism: &'a SvmMechanism,
    network: String,
    signature: Signature,
}

impl StatusLookup for Status<'_> {
    fn label(&self) -> String {
        format!("{}/{}", self.network, self.signature)
    }

    fn missing(&self) -> String {
        format!(
            "no settlement of transaction {} on {}",
            self.signature, self.network
        )
    }

    fn find(&self) -> Pin<Box<dyn Future<Output = Result<Option<Found>, StoreError>> + Send + '_>> {
        Box::pin(async move {
            let found = self
                .mechanism
                .status(&self.network, &self.signature)
                .await?;
            Ok(found.map(|status| Found {
                state: status.state.to_string(),
                body: serde_json::to_vec(&status).expect("status answers serialize"),
            }))
        })
    }
}
