//! EVM's `exact` and `upto` as a mechanism: a body read in its version's wire type, lowered
//! (`lower`), verified (`verify`, rule 6 on) and settled (`settle`), answered in its version's
//! names; and a settlement's status by its payment key
//! (`/settlements/{network}/{asset}/{from}/{nonce}`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ethers_core::types::Address;
use ethers_core::utils::to_checksum;

use super::lower::{lower_v1, lower_v2};
use super::readiness::{signer_funds, SignerFunds};
use super::request::Request;
use super::settle::{Begun, Settler};
use super::verify::Verifier;
use crate::chain::Budget;
use crate::evm::{self as leaf, parse_address};
use crate::facilitator::discovery::Catalogue;
use crate::facilitator::funds::Kept;
use crate::facilitator::mechanism::{
    Answer, Found, Later, Mechanism, Payee, Payment, StatusLookup,
};
use crate::facilitator::outcome::{Invalid, SettleError, Settled};
use crate::facilitator::protocol::read::read_value;
use crate::facilitator::protocol::v1::{self, SettleResponse, VerifyResponse};
use crate::facilitator::protocol::values::Payload;
use crate::facilitator::protocol::{eip2612, v2};
use crate::facilitator::readiness::Funds;
use crate::facilitator::registry::Declared;
use crate::facilitator::settlement::ClaimOn;
use crate::facilitator::types::SupportedKind;
use crate::guard::Guard;
use crate::ledger::{Asking, PaymentKey, Reason};
use crate::store::StoreError;

/// The CAIP-2 namespace of EVM chains.
pub const NAMESPACE: &str = "eip155";

/// The EVM mechanism: the verifier and the settle pipeline it hands payments to.
pub struct EvmExact {
    pub(super) verifier: Arc<Verifier>,
    pub(super) settler: Arc<Settler>,
    pub(super) serves_v1: bool,
    /// Served chain ids and their configured network names, when x402 v2 is served.
    pub(super) v2_networks: Option<BTreeMap<u64, String>>,
    /// The discovery catalogue, when on (`facilitator.discovery`, with v2 served).
    pub(super) catalogue: Option<Arc<Catalogue>>,
    /// The signers' addresses, in their configured order.
    pub(super) signers: Vec<Address>,
    /// The signers' funds as last read on each network.
    pub(super) funds: Kept<SignerFunds>,
}

impl EvmExact {
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
        if let Err(failure) = super::verify::check_upto_maximum(&payment) {
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
    async fn verify_v1(&self, request: &v1::PaymentRequest) -> Result<VerifyResponse, SettleError> {
        let verdict = match self.lower_v1(request) {
            Err(refused) => Err(refused),
            Ok(lowered) => self.verdict(&lowered).await?,
        };
        Ok(v1::verify_answer(request, verdict))
    }

    /// `/settle` in x402 v1. `asking` names the request for its retries: see [`Asking`].
    async fn settle_v1(
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
        lower_v1(request, self.verifier.as_ref())
    }

    /// `/verify` in x402 v2: v2's own rules, then the shared ones, answered in v2's names.
    async fn verify_v2(&self, request: &v2::PaymentRequest) -> Result<VerifyResponse, SettleError> {
        let verdict = match self.lower_v2(request) {
            Err(refused) => Err(refused),
            Ok(lowered) => self.verdict(&lowered).await?,
        };
        Ok(v2::verify_answer(request, verdict))
    }

    /// `/settle` in x402 v2: v2's own rules, then the one settlement path, answered in v2's
    /// names and network.
    async fn settle_v2(
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
    async fn discovered(
        &self,
        request: &v2::PaymentRequest,
        answer: &SettleResponse,
        private: bool,
    ) {
        if let (Some(catalogue), true) = (&self.catalogue, answer.success) {
            catalogue.record(request, private).await;
        }
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
        let networks = self
            .v2_networks
            .as_ref()
            .expect("read as v2 only where v2 is served");
        lower_v2(request, networks, self.verifier.as_ref())
    }
}

/// An API key's payTo, when it is an EVM address (`0x` and 40 hex digits).
/// EVM as the registry knows it before any chain is configured: its v1 names are the
/// configuration's, of no spelling of their own (a name no family spells is EVM's, as unserved).
pub const DECLARED: Declared = Declared {
    payee,
    names: |_| None,
    build: super::family::build,
};

pub fn payee(text: &str) -> Option<Payee> {
    if !(text.starts_with("0x") || text.starts_with("0X")) {
        return None;
    }
    parse_address(text).map(address_payee)
}

fn address_payee(address: Address) -> Payee {
    Payee {
        namespace: NAMESPACE,
        key: address.as_bytes().into(),
    }
}

/// An EVM payment in the wire type of its version.
#[derive(Debug)]
pub enum EvmRequest {
    V1(v1::PaymentRequest),
    V2(v2::PaymentRequest),
}

impl EvmRequest {
    /// The body straight into its version's wire type, or `None`.
    pub fn read_direct(version: u64, bytes: &[u8]) -> Option<Self> {
        match version {
            2 => serde_json::from_slice(bytes).ok().map(EvmRequest::V2),
            _ => serde_json::from_slice(bytes).ok().map(EvmRequest::V1),
        }
    }

    /// A body read as JSON, field by field.
    pub fn read(version: u64, body: serde_json::Value, prefix: &str) -> Result<Self, String> {
        match version {
            2 => read_value(body, v2::PaymentRequest::OBJECTS, prefix).map(EvmRequest::V2),
            _ => read_value(body, v1::PaymentRequest::OBJECTS, prefix).map(EvmRequest::V1),
        }
    }

    /// network|asset|from|nonce, as sent.
    pub fn label(&self) -> String {
        let (network, asset, payload) = match self {
            EvmRequest::V1(p) => (
                &p.payment_requirements.network,
                &p.payment_requirements.asset,
                Payload::from(&p.payment_payload.payload),
            ),
            EvmRequest::V2(p) => (
                &p.payment_requirements.network,
                &p.payment_requirements.asset,
                Payload::from(&p.payment_payload.payload),
            ),
        };
        let (from, nonce) = (payload.payer(), payload.nonce());
        format!(
            "{network}|{asset}|{}|{}",
            from.unwrap_or_default(),
            nonce.unwrap_or_default()
        )
    }

    /// v2's `payment-identifier` id; v1 has none.
    pub fn payment_identifier(&self) -> Result<Option<&str>, String> {
        match self {
            EvmRequest::V1(_) => Ok(None),
            EvmRequest::V2(p) => p.payment_payload.payment_identifier(),
        }
    }

    fn pay_to(&self) -> &str {
        match self {
            EvmRequest::V1(p) => &p.payment_requirements.pay_to,
            EvmRequest::V2(p) => &p.payment_requirements.pay_to,
        }
    }
}

/// A payment and the mechanism serving it.
struct Served<'a> {
    exact: &'a EvmExact,
    request: EvmRequest,
}

impl Payment for Served<'_> {
    fn label(&self) -> String {
        self.request.label()
    }

    fn payment_identifier(&self) -> Result<Option<&str>, String> {
        self.request.payment_identifier()
    }

    fn payee(&self) -> Option<Payee> {
        parse_address(self.request.pay_to()).map(address_payee)
    }

    fn family(&self) -> &'static str {
        "evm"
    }

    fn verify(&self) -> Answer<'_, VerifyResponse> {
        match &self.request {
            EvmRequest::V1(p) => Box::pin(self.exact.verify_v1(p)),
            EvmRequest::V2(p) => Box::pin(self.exact.verify_v2(p)),
        }
    }

    fn settle<'a>(&'a self, asking: &'a Asking, private: bool) -> Answer<'a, SettleResponse> {
        match &self.request {
            EvmRequest::V1(p) => Box::pin(self.exact.settle_v1(p, asking)),
            EvmRequest::V2(p) => Box::pin(async move {
                let settled = self.exact.settle_v2(p, asking).await;
                if let Ok(answer) = &settled {
                    self.exact.discovered(p, answer, private).await;
                }
                settled
            }),
        }
    }
}

impl Mechanism for EvmExact {
    fn namespace(&self) -> &'static str {
        NAMESPACE
    }

    fn kinds(&self) -> &'static [(u64, &'static str)] {
        &[(1, "exact"), (2, "exact"), (2, "upto")]
    }

    /// Resumes the lanes' unfinished settlements and starts the lane workers.
    fn start(&self) -> Answer<'_, usize> {
        Box::pin(self.settler.start())
    }

    /// Hands the lanes back.
    fn stop(&self) -> Later<'_, ()> {
        Box::pin(self.settler.surrender_lanes())
    }

    /// Every signer on every network, with its balance and pending nonce as last read.
    fn funds(&self) -> Later<'_, Vec<Funds>> {
        Box::pin(async {
            let lanes = self.settler.lanes().all();
            let funds = signer_funds(lanes, &self.funds).await;
            funds.iter().map(SignerFunds::report).collect()
        })
    }

    /// The signer lanes whose worker's last step panicked.
    fn down(&self) -> Vec<&Guard> {
        let guards = self.settler.lanes().all().map(|l| &l.guard);
        guards.filter(|g| g.is_down()).collect()
    }

    fn senders(&self) -> Vec<String> {
        let lanes = self.settler.lanes().all();
        lanes
            .map(|l| format!("{}:{:?}", l.network(), l.signer_address()))
            .collect()
    }

    fn pending(&self) -> usize {
        self.settler.pending_settlements()
    }

    fn lost(&self) -> u64 {
        self.settler.lost_settlements()
    }

    fn read_direct(&self, version: u64, bytes: &[u8]) -> Option<Box<dyn Payment + '_>> {
        let request = EvmRequest::read_direct(version, bytes)?;
        Some(Box::new(Served {
            exact: self,
            request,
        }))
    }

    fn read(
        &self,
        version: u64,
        body: serde_json::Value,
        prefix: &str,
    ) -> Result<Box<dyn Payment + '_>, String> {
        let request = EvmRequest::read(version, body, prefix)?;
        Ok(Box::new(Served {
            exact: self,
            request,
        }))
    }

    fn status_form(&self) -> &'static str {
        "/settlements/{network}/{asset}/{from}/{nonce}"
    }

    fn status<'a>(&'a self, segments: &[&str]) -> Result<Box<dyn StatusLookup + 'a>, String> {
        let mut key = status_key(segments)?;
        key.network = self.network_name(&key.network).to_string();
        Ok(Box::new(Status { exact: self, key }))
    }

    /// v1's kinds name the configured networks; v2's name them by CAIP-2 id, and add `upto`.
    fn supported(&self, version: u32) -> Vec<SupportedKind> {
        let exact = |network| SupportedKind {
            x402_version: version,
            scheme: "exact",
            network,
            extra: None,
        };
        match (version, &self.v2_networks) {
            (1, _) => self
                .verifier
                .networks()
                .map(|n| exact(n.name.clone()))
                .collect(),
            (_, Some(v2_networks)) => {
                let ids = v2_networks.keys().map(|&id| exact(v2::network_id(id)));
                ids.chain(self.upto_kinds(v2_networks)).collect()
            }
            (_, None) => Vec::new(),
        }
    }

    fn signers(&self) -> Option<(&'static str, Vec<String>)> {
        let served = self.v2_networks.as_ref().is_some_and(|n| !n.is_empty());
        let signers = self.signers.iter().map(|a| to_checksum(a, None));
        served.then(|| ("eip155:*", signers.collect()))
    }

    /// `eip2612GasSponsoring`, where a token is paid through Permit2.
    fn extensions(&self) -> Vec<&'static str> {
        let permit2 = self
            .verifier
            .networks()
            .any(|n| n.tokens.iter().any(|t| t.permit2));
        permit2.then_some(eip2612::KEY).into_iter().collect()
    }
}

/// The payment key of a status path's four segments.
pub fn status_key(segments: &[&str]) -> Result<PaymentKey, String> {
    let [network, asset, from, nonce] = segments else {
        return Err("path: four segments expected".to_string());
    };
    let address = |field: &str, value: &str| {
        parse_address(value).ok_or_else(|| format!("{field}: not a 0x address"))
    };
    let nonce = leaf::parse_h256(nonce).ok_or("nonce: not 0x + 64 hex digits")?;
    if network.is_empty() {
        return Err("network: empty".to_string());
    }
    let (asset, from) = (address("asset", asset)?, address("from", from)?);
    Ok(PaymentKey::evm(network.to_string(), asset, from, nonce))
}

/// One payment's settlement, by its key.
struct Status<'a> {
    exact: &'a EvmExact,
    key: PaymentKey,
}

impl StatusLookup for Status<'_> {
    fn label(&self) -> String {
        self.key.to_string()
    }

    fn missing(&self) -> String {
        format!("no settlement of payment {}", self.key)
    }

    fn find(&self) -> Pin<Box<dyn Future<Output = Result<Option<Found>, StoreError>> + Send + '_>> {
        Box::pin(async move {
            let found = self.exact.settler.status(&self.key).await?;
            // Its key is an EVM one: so is the record stored under it.
            Ok(found.and_then(|(record, head)| {
                let status = super::status::answer(&record, record.evm()?, head);
                Some(Found {
                    state: status.state.to_string(),
                    body: serde_json::to_vec(&status).expect("status answers serialize"),
                })
            }))
        })
    }
}
