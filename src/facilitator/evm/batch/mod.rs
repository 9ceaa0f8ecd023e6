//! x402's `batch-settlement` on EVM (v2 only): a payer deposits once into an escrow channel of
//! the `x402BatchSettlement` contract, then pays each request with a cumulative voucher that
//! costs no gas. routerd verifies `deposit`, `voucher` and `refund` payloads by the binding's
//! rules 1-11 and settles deposits: a deposit is an ERC-3009 `receiveWithAuthorization` that the
//! deposit collector submits inside the settlement contract's `deposit`, so it goes through the
//! `exact` settle pipeline as that authorization (write-ahead, one success per authorization,
//! the payer's exposure, reorgs, every instance), only its transaction calling the contract.
//!
//! Rooms: `wire` (the payloads), `verify` (the rules and the channel read), `deposit` (a
//! deposit as the settle pipeline takes it), `mirror` (the last state routerd read or caused
//! per channel, the floor of what only grows), `reason` (the binding's reason names).

mod actions;
mod deposit;
mod mirror;
mod order;
pub mod pack;
pub mod reason;
mod verify;
pub mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ethers_core::types::{Address, H256};
use ethers_core::utils::to_checksum;
use serde_json::json;

use super::contracts::check_batch_contracts;
use super::settle::Settler;
use super::verify::{Network, Verifier};
use crate::evm::batch as leaf;
use crate::evm::parse_address;
use crate::facilitator::mechanism::{Answer, Later, Mechanism, Payee, Payment, StatusLookup};
use crate::facilitator::outcome::SettleError;
use crate::facilitator::protocol::read::read_value;
use crate::facilitator::protocol::v1::{SettleResponse, VerifyResponse};
use crate::facilitator::protocol::v2;
use crate::facilitator::types::SupportedKind;
use crate::ledger::Asking;
use crate::signer::Authorizer;
use crate::store::{ChannelKey, Storage};
use reason::{BatchReason, Refusal};
use wire::{BatchPayload, BatchRequest};

pub use verify::SCHEME;

/// The contracts of the scheme on a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contracts {
    pub settlement: Address,
    pub erc3009_collector: Address,
    pub permit2_collector: Address,
}

/// The mechanism: the `exact` verifier's networks and the settle pipeline deposits go through.
pub struct EvmBatch {
    pub(crate) verifier: Arc<Verifier>,
    pub(crate) settler: Arc<Settler>,
    /// Served chain ids and their configured network names (x402 v2).
    pub(crate) v2_networks: BTreeMap<u64, String>,
    /// Each served network's contracts, by its configured name.
    pub(crate) contracts: BTreeMap<String, Contracts>,
    /// The receiver authorizer routerd offers (`/supported`) and signs claims and refunds with,
    /// when it has the key.
    pub(crate) authorizer: Option<Arc<Authorizer>>,
    /// Packs claims, sweeps and refunds into one transaction per network.
    pub(crate) packer: Arc<pack::Packer>,
    /// Refunds of one channel, one at a time.
    order: order::ChannelOrder,
    /// The channels' last states routerd read or caused.
    mirror: mirror::Mirror,
}

/// Who this instance is to the other instances' refunds, and how long its hold of a channel's
/// refund lasts unless released.
pub struct RefundHolder {
    pub instance: String,
    pub hold: Duration,
}

impl EvmBatch {
    /// The scheme on every network `verifier` serves in x402 v2 (`v2_networks`), with its
    /// contracts from `[chains.<name>.contracts]`.
    pub fn new(
        verifier: &Arc<Verifier>,
        settler: &Arc<Settler>,
        v2_networks: BTreeMap<u64, String>,
        authorizer: Option<Arc<Authorizer>>,
        max_calls: usize,
        store: &Storage,
        refunds: RefundHolder,
    ) -> Self {
        let of = |n: &Network| {
            let configured = &n.chain.settings.contracts;
            let contracts = Contracts {
                settlement: configured.batch_settlement,
                erc3009_collector: configured.erc3009_deposit_collector,
                permit2_collector: configured.permit2_deposit_collector,
            };
            (n.name.clone(), contracts)
        };
        let packer = pack::Packer::new(settler.clone(), authorizer.clone(), max_calls);
        EvmBatch {
            verifier: verifier.clone(),
            settler: settler.clone(),
            v2_networks,
            contracts: verifier.networks().map(of).collect(),
            authorizer,
            packer: Arc::new(packer),
            order: order::ChannelOrder::new(store.clone(), refunds.instance, refunds.hold),
            mirror: mirror::Mirror::new(store.clone()),
        }
    }

    fn network(&self, caip2: &str) -> Option<&Network> {
        let name = v2::served_network(caip2, &self.v2_networks)?;
        self.contracts.get(name)?;
        self.verifier.network(name)
    }

    /// The settlement contract's domain on `network`, and its contracts.
    fn domain(&self, network: &Network) -> (H256, Contracts) {
        let contracts = self.contracts[&network.name];
        let chain_id = network.chain.settings.chain_id;
        (
            leaf::domain_separator(chain_id, contracts.settlement),
            contracts,
        )
    }

    async fn verify(&self, request: &BatchRequest) -> Result<VerifyResponse, SettleError> {
        let payload = &request.payment_payload.payload;
        let verdict = match payload {
            BatchPayload::Deposit(_) => deposit::verify(self, request).await?,
            BatchPayload::Voucher(_) | BatchPayload::Refund(_) => {
                self.verify_voucher(request).await?
            }
            _ => Err(Refusal::new(
                BatchReason::PayloadType,
                format!(
                    "paymentPayload.payload.type: {:?} is settled, not verified",
                    payload.kind()
                ),
            )),
        };
        Ok(verify_answer(payer_of(payload), verdict))
    }

    /// A voucher or refund payload: rules 1-7, 9 and 10 in one read of the chain (none of it
    /// for the signature of a payer authorizer's voucher).
    async fn verify_voucher(
        &self,
        request: &BatchRequest,
    ) -> Result<Result<(H256, verify::ChannelState), Refusal>, SettleError> {
        let payload = &request.payment_payload.payload;
        let checked = match self.check_voucher(request) {
            Ok(checked) => checked,
            Err(refused) => return Ok(Err(refused)),
        };
        let (network, contracts, voucher, erc1271) = checked;
        if let BatchPayload::Refund(refund) = payload {
            if let Err(refused) = wire::refund_amount(refund.amount.as_deref()) {
                return Ok(Err(refused));
            }
        }
        let _read = network.chain.client.admit(crate::chain::Budget::Verify)?;
        let asks_wallet = erc1271.is_some();
        let asked = erc1271.into_iter().collect();
        let read = verify::read(
            &network.chain,
            contracts.settlement,
            voucher.channel_id,
            asked,
        );
        let read = match read.await? {
            Ok(read) => read,
            Err(refused) => return Ok(Err(refused)),
        };
        let state = (self.mirror)
            .judge(&network.name, voucher.channel_id, read.state)
            .await;
        if asks_wallet && !verify::erc1271_accepts(read.extra[0].as_ref()) {
            return Ok(Err(Refusal::new(
                BatchReason::VoucherSignature,
                "paymentPayload.payload.voucher.signature: the payer's wallet does not accept it (ERC-1271)",
            )));
        }
        let refund = matches!(payload, BatchPayload::Refund(_));
        Ok(
            verify::check_state(&state, voucher.max_claimable, 0, refund)
                .map(|()| (voucher.channel_id, state)),
        )
    }

    /// Rules 1-6 of a voucher as far as they need no chain: its network and contracts, the
    /// voucher, and the ERC-1271 call to ask when the payer itself signs.
    #[allow(clippy::type_complexity)]
    fn check_voucher(
        &self,
        request: &BatchRequest,
    ) -> Result<(&Network, Contracts, wire::Voucher, Option<verify::Asked>), Refusal> {
        let network = verify::check_requirements(request, |n| self.network(n))?;
        let payload = &request.payment_payload.payload;
        let Some((config, voucher)) = payload.channel() else {
            return Err(Refusal::new(
                BatchReason::PayloadType,
                "paymentPayload.payload.type",
            ));
        };
        let reason = payload.malformed();
        let (config, voucher) = (
            wire::config(reason, config)?,
            wire::voucher(reason, voucher)?,
        );
        let (domain, contracts) = self.domain(network);
        verify::check_config(request, domain, &config, voucher.channel_id)?;
        verify::served(
            network,
            [(config.token, "paymentPayload.payload.channelConfig.token")],
        )?;
        let erc1271 = verify::check_voucher_signature(domain, &config, &voucher)?;
        Ok((network, contracts, voucher, erc1271))
    }

    async fn settle(
        &self,
        request: &BatchRequest,
        asking: &Asking,
    ) -> Result<SettleResponse, SettleError> {
        let payload = &request.payment_payload.payload;
        let network = request.payment_requirements.network.clone();
        match payload {
            BatchPayload::Deposit(_) => deposit::settle(self, request, asking).await,
            BatchPayload::Refund(_) => self.settle_refund(request, asking, network).await,
            BatchPayload::Voucher(_) => Ok(refused_settle(
                payload,
                network,
                Refusal::new(
                    BatchReason::PayloadType,
                    "paymentPayload.payload.type: a voucher is charged by the resource server, not settled",
                ),
            )),
            BatchPayload::Claim(_) => actions::claim(self, request).await,
            BatchPayload::Settle(_) => actions::sweep(self, request).await,
        }
    }

    /// Two refunds of a channel would sign its one refund nonce: the second would revert at the
    /// operator's cost. Each waits for the one ahead to be answered, on this instance or
    /// another; one whose voucher does not hold waits for nothing.
    async fn settle_refund(
        &self,
        request: &BatchRequest,
        asking: &Asking,
        network: String,
    ) -> Result<SettleResponse, SettleError> {
        let payload = &request.payment_payload.payload;
        let (key, checked) = match self.check_voucher(request) {
            Ok((served, _, voucher, erc1271)) => {
                let key = ChannelKey {
                    network: served.name.clone(),
                    channel: voucher.channel_id,
                };
                (key, (voucher, erc1271))
            }
            Err(refused) => return Ok(refused_settle(payload, network, refused)),
        };
        let held = match self.order.turn(key).await? {
            Ok(held) => held,
            Err(busy) => return Ok(refused_settle(payload, network, busy)),
        };
        let refunded = actions::refund(self, request, asking, checked).await;
        // A transaction that may still land (pending, or its fate unknown) keeps the hold until
        // it runs out. Every other answer leaves no transaction of this refund out, an error
        // too: errors arise before the refund is sent (its reads and trial) or after it is
        // mined (the read of its outcome).
        if !matches!(&refunded, Ok(r) if r.may_land) {
            held.release().await;
        }
        refunded.map(|r| r.answer)
    }
}

/// The payer a payload names, as sent ("" for the server's own payloads).
fn payer_of(payload: &BatchPayload) -> String {
    payload
        .channel()
        .map(|(config, _)| config.payer.clone())
        .unwrap_or_default()
}

/// The `/verify` answer: the channel snapshot in `extra` when valid.
fn verify_answer(
    payer: String,
    verdict: Result<(H256, verify::ChannelState), Refusal>,
) -> VerifyResponse {
    match verdict {
        Ok((channel, state)) => VerifyResponse {
            is_valid: true,
            invalid_reason: None,
            invalid_message: None,
            payer,
            extra: Some(state.snapshot(channel)),
        },
        Err(refused) => VerifyResponse {
            is_valid: false,
            invalid_reason: Some(refused.reason.name()),
            invalid_message: Some(refused.message),
            payer,
            extra: None,
        },
    }
}

fn refused_settle(payload: &BatchPayload, network: String, refused: Refusal) -> SettleResponse {
    SettleResponse {
        success: false,
        error_reason: Some(refused.reason.name().to_string()),
        error_message: Some(refused.message),
        payer: payer_of(payload),
        transaction: String::new(),
        network,
        amount: None,
        extra: None,
    }
}

/// A payment and the mechanism serving it.
struct Served<'a> {
    batch: &'a EvmBatch,
    request: BatchRequest,
}

impl Payment for Served<'_> {
    fn label(&self) -> String {
        let required = &self.request.payment_requirements;
        let payload = &self.request.payment_payload.payload;
        let channel = payload.channel().map(|(_, v)| v.channel_id.as_str());
        format!(
            "{}|{}|{}|{}",
            required.network,
            payload.kind(),
            payer_of(payload),
            channel.unwrap_or_default()
        )
    }

    fn payment_identifier(&self) -> Result<Option<&str>, String> {
        self.request.payment_payload.payment_identifier()
    }

    fn payee(&self) -> Option<Payee> {
        let address = parse_address(&self.request.payment_requirements.pay_to)?;
        Some(Payee {
            namespace: super::exact::NAMESPACE,
            key: address.as_bytes().into(),
        })
    }

    fn family(&self) -> &'static str {
        "evm"
    }

    fn verify(&self) -> Answer<'_, VerifyResponse> {
        Box::pin(self.batch.verify(&self.request))
    }

    fn settle<'a>(&'a self, asking: &'a Asking, _private: bool) -> Answer<'a, SettleResponse> {
        Box::pin(self.batch.settle(&self.request, asking))
    }
}

/// Paths of a batch-settlement request that must be JSON objects.
const OBJECTS: &[&str] = &[
    "",
    "paymentPayload",
    "paymentPayload.accepted",
    "paymentPayload.payload",
    "paymentRequirements",
];

impl Mechanism for EvmBatch {
    fn namespace(&self) -> &'static str {
        super::exact::NAMESPACE
    }

    fn kinds(&self) -> &'static [(u64, &'static str)] {
        &[(2, SCHEME)]
    }

    /// Its contracts have code on every network it serves.
    fn check(&self) -> Later<'_, Result<(), String>> {
        let chains: Vec<_> = self.verifier.networks().map(|n| n.chain.clone()).collect();
        Box::pin(async move {
            let checked = check_batch_contracts(&chains).await;
            checked.map_err(|e| e.to_string())
        })
    }

    /// Its deposits, claims, sweeps and refunds are the EVM lanes' settlements: `exact`
    /// resumes them.
    fn start(&self) -> Answer<'_, usize> {
        Box::pin(async { Ok(0) })
    }

    fn read_direct(&self, _version: u64, bytes: &[u8]) -> Option<Box<dyn Payment + '_>> {
        let request = serde_json::from_slice(bytes).ok()?;
        Some(Box::new(Served {
            batch: self,
            request,
        }))
    }

    fn read(
        &self,
        _version: u64,
        body: serde_json::Value,
        prefix: &str,
    ) -> Result<Box<dyn Payment + '_>, String> {
        let payload = body.pointer("/paymentPayload/payload").cloned();
        let request = read_value(body, OBJECTS, prefix).map_err(|message| {
            // The tagged read names `paymentPayload.payload` alone: read again, it names the field.
            let at = format!(
                "{prefix}{}paymentPayload.payload",
                if prefix.is_empty() { "" } else { "." }
            );
            let lossy = message.starts_with(&at);
            let named = payload
                .filter(|_| lossy)
                .and_then(|p| wire::why_not(p, prefix));
            named.unwrap_or(message)
        })?;
        Ok(Box::new(Served {
            batch: self,
            request,
        }))
    }

    /// Deposits are found by their authorization, under `exact`'s route.
    fn status_form(&self) -> &'static str {
        "/settlements/{network}/{asset}/{from}/{nonce}"
    }

    fn status<'a>(&'a self, _segments: &[&str]) -> Result<Box<dyn StatusLookup + 'a>, String> {
        Err("path: a deposit's settlement is found by its authorization under /settlements/{network}/{asset}/{from}/{nonce}".to_string())
    }

    /// Every v2 network with a token whose deposits a collector takes (ERC-3009 or Permit2).
    fn supported(&self, version: u32) -> Vec<SupportedKind> {
        if version != 2 {
            return Vec::new();
        }
        let extra = self
            .authorizer
            .as_ref()
            .map(|a| json!({ "receiverAuthorizer": to_checksum(&a.address(), None) }));
        let deposits = |name: &String| {
            self.contracts.contains_key(name)
                && self
                    .verifier
                    .network(name)
                    .is_some_and(|n| n.tokens.iter().any(|t| t.eip3009 || t.permit2))
        };
        let served = self.v2_networks.iter().filter(|(_, name)| deposits(name));
        served
            .map(|(&id, _)| SupportedKind {
                x402_version: 2,
                scheme: SCHEME,
                network: v2::network_id(id),
                extra: extra.clone(),
            })
            .collect()
    }

    fn signers(&self) -> Option<(&'static str, Vec<String>)> {
        None
    }
}
