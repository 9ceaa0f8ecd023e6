//! The x402 v1 `exact` facilitator: supported kinds, verify, settle. No HTTP in here.

pub mod erc3009;
pub mod settlement;
pub mod types;
pub mod verify;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ethers_core::types::Address;

use crate::chain::Chain;
use crate::config::{ChainSettings, FacilitatorSettings};
use crate::signer::Signer;
use crate::store::{Storage, StoreError};
pub use settlement::{Lane, LaneSettings, PaymentKey, SettleError};
use types::{
    PaymentRequest, SettleResponse, SettlementStatus, SupportedKind, SupportedResponse,
    VerifyResponse,
};
use verify::{Network, TokenInfo, Verifier};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("facilitator.deny_list_file: cannot read {0}: {1}")]
    DenyList(String, String),
    #[error("facilitator.deny_list_file: line {0} is not a 0x address")]
    DenyListEntry(usize),
}

pub struct Facilitator {
    verifier: Arc<Verifier>,
    settler: Arc<settlement::Settler>,
    max_batch: usize,
}

impl Facilitator {
    pub fn new(
        settings: &FacilitatorSettings,
        chain_settings: &BTreeMap<String, ChainSettings>,
        chains: &BTreeMap<String, Arc<Chain>>,
        signers: Vec<Arc<Signer>>,
        store: Storage,
        lease: settlement::LeaseSettings,
    ) -> Result<Self, SetupError> {
        let deny_list = load_deny_list(&settings.deny_list_file)?;
        let mut networks = Vec::new();
        let mut lanes = Vec::new();
        for name in &settings.networks {
            let chain = chains[name].clone();
            let tokens = chain_settings[name]
                .tokens
                .values()
                .map(|t| token_info(t, chain.settings.chain_id))
                .collect();
            let settings = lane_settings(&chain_settings[name], settings.bump_after_blocks);
            for signer in &signers {
                lanes.push(Lane::new(chain.clone(), signer.clone(), settings.clone()));
            }
            networks.push(Network {
                name: name.clone(),
                chain,
                tokens,
            });
        }
        let verifier = Arc::new(Verifier::new(networks, deny_list));
        let settler = settlement::Settler::new(
            verifier.clone(),
            store,
            lanes,
            Duration::from_secs(settings.settle_timeout_secs),
            Duration::from_secs(settings.retention_days * 86_400),
            lease,
        );
        Ok(Self {
            verifier,
            settler,
            max_batch: settings.max_batch,
        })
    }

    /// Picks up settlements a previous run left unfinished and starts the signer lanes; call
    /// before serving.
    pub async fn start(&self) -> Result<usize, SettleError> {
        self.settler.start().await
    }

    pub fn supported(&self) -> SupportedResponse {
        let mut kinds: Vec<SupportedKind> = self
            .verifier
            .networks()
            .map(|n| SupportedKind {
                x402_version: 1,
                scheme: "exact",
                network: n.name.clone(),
            })
            .collect();
        kinds.sort_by(|a, b| a.network.cmp(&b.network));
        SupportedResponse { kinds }
    }

    /// Verify's rules, and one more: a nonce another authorization has claimed for settlement
    /// is not a payment a merchant may deliver on.
    pub async fn verify(&self, request: &PaymentRequest) -> Result<VerifyResponse, SettleError> {
        let verdict = match self.verifier.check_local(request) {
            Err(failure) => Err(failure),
            Ok(payment) if self.settler.claimed_by_another(&payment).await? => {
                Err(verify::Invalid {
                    reason: types::Reason::Payload,
                    message: "authorization nonce already claimed by another authorization"
                        .to_string(),
                })
            }
            Ok(payment) => self.verifier.check_on_chain(&payment, &[]).await?.0,
        };
        Ok(Verifier::respond(request, verdict))
    }

    pub async fn settle(&self, request: &PaymentRequest) -> Result<SettleResponse, SettleError> {
        self.settler.settle(request).await
    }

    /// What happened to one payment, or `None` if routerd never settled it.
    pub async fn status(&self, key: &PaymentKey) -> Result<Option<SettlementStatus>, StoreError> {
        self.settler.status(key).await
    }

    pub async fn surrender_lanes(&self) {
        self.settler.surrender_lanes().await
    }

    pub fn lost_settlements(&self) -> u64 {
        self.settler.lost_settlements()
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

fn lane_settings(chain: &ChainSettings, bump_after_blocks: u64) -> LaneSettings {
    LaneSettings {
        confirmations: chain.confirmations,
        finality_depth: chain.finality_depth,
        bump_after_blocks,
        max_fee_per_gas: chain.max_fee_cap(),
        max_settlement_cost: chain.max_settlement_cost(),
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
    }
}

/// KYT deny list: one address per line; blank lines and `#` comments are skipped.
fn load_deny_list(path: &str) -> Result<HashSet<Address>, SetupError> {
    if path.is_empty() {
        return Ok(HashSet::new());
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| SetupError::DenyList(path.to_string(), e.to_string()))?;
    text.lines()
        .map(str::trim)
        .enumerate()
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
        .map(|(i, line)| verify::parse_address(line).ok_or(SetupError::DenyListEntry(i + 1)))
        .collect()
}
