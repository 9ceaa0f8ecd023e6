//! The EVM family as the configuration makes it: its signers (loaded only when an EVM network is
//! served), a lane per signer on each served network, the verifier and the settle pipeline they
//! share, and its mechanisms: `exact`/`upto`, and `batch-settlement` when it is on.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ethers_core::types::Address;
use tokio::sync::mpsc;

use super::batch::{EvmBatch, RefundHolder};
use super::exact::EvmExact;
use super::request::TokenInfo;
use super::settle::Settler;
use super::verify::{Network, Verifier};
use super::{Lane, LaneSettings, LeaseSettings};
use crate::chain::Chain;
use crate::config::{ChainSettings, FacilitatorSettings, TokenSettings, TransferMethod};
use crate::evm::{erc3009, permit2};
use crate::facilitator::mechanism::Mechanism;
use crate::facilitator::registry::{Built, Setup};
use crate::facilitator::settlement::cooldown::Cooldown;
use crate::facilitator::SetupError;
use crate::ledger::EvmRecord;
use crate::signer::{load_signers, Signer};

/// A lane, and the queue its worker takes settlements from.
type LaneQueue = (Arc<Lane>, mpsc::Receiver<EvmRecord>);

/// The EVM mechanisms `setup` configures, `exact` first.
pub fn build(setup: &Setup) -> Built {
    let f = setup.facilitator;
    let signers: Vec<Arc<Signer>> = match f.evm_networks().next() {
        Some(_) => load_signers(&f.signer_key_file)
            .map_err(SetupError::family)?
            .into_iter()
            .map(Arc::new)
            .collect(),
        None => Vec::new(),
    };
    // Read after the signers, as the daemon always read the keys (a missing signer key is named
    // first), and before what only this family's further schemes use.
    let authorizer = setup.receiver_authorizer()?;
    let addresses: Vec<Address> = signers.iter().map(|s| s.address).collect();
    let chain_settings = &setup.settings.chains;
    let (networks, lanes) = networks(f, chain_settings, setup.chains, &signers, setup.cooldown);
    let v2_networks = f.serves_version(2).then(|| {
        let named = networks
            .iter()
            .map(|n| (n.chain.settings.chain_id, n.name.clone()));
        named.collect::<BTreeMap<_, _>>()
    });
    let verifier = Verifier::new(
        networks,
        setup.deny_list()?,
        setup.cooldown.clone(),
        f.max_signature_bytes,
    );
    let verifier = Arc::new(
        verifier
            .allow_http_resource(f.allow_http_resource)
            .erc6492_factories(f.erc6492_factories()?)
            .signers(addresses.iter().copied().collect()),
    );
    let settler = settler(setup, &verifier, lanes);
    let exact = EvmExact {
        verifier: verifier.clone(),
        settler: settler.clone(),
        serves_v1: f.serves_version(1),
        v2_networks: v2_networks.clone(),
        catalogue: setup.catalogue.clone(),
        signers: addresses,
        funds: Default::default(),
    };
    let mut built: Vec<Arc<dyn Mechanism>> = vec![Arc::new(exact)];
    if f.batch_settlement {
        let networks = v2_networks.unwrap_or_default();
        let max_calls = f.batch_max_calls_per_tx;
        let batch = EvmBatch::new(
            &verifier,
            &settler,
            networks,
            authorizer,
            max_calls,
            setup.store,
            refund_holder(setup),
        );
        built.push(Arc::new(batch));
    }
    Ok(built)
}

fn refund_holder(setup: &Setup) -> RefundHolder {
    let timeout = Duration::from_secs(setup.facilitator.settle_timeout_secs);
    RefundHolder {
        instance: setup.settings.storage.instance_id.clone(),
        hold: refund_hold(timeout),
    }
}

/// A channel's refund is held for its instance's settle timeout and a minute more: a refund
/// answered in time releases it; one whose transaction may still land keeps it that long. At
/// most a day, whatever the timeout: the store keeps the hold's end as a time.
fn refund_hold(settle_timeout: Duration) -> Duration {
    const LONGEST: Duration = Duration::from_secs(86_400);
    settle_timeout
        .saturating_add(Duration::from_secs(60))
        .min(LONGEST)
}

/// The settle pipeline over `lanes`, each lane held under this instance's lease.
fn settler(setup: &Setup, verifier: &Arc<Verifier>, lanes: Vec<LaneQueue>) -> Arc<Settler> {
    let (f, storage) = (setup.facilitator, &setup.settings.storage);
    let lease = LeaseSettings {
        holder: storage.instance_id.clone(),
        ttl: Duration::from_secs(storage.lease_ttl_secs),
    };
    Settler::new(
        verifier.clone(),
        setup.store.clone(),
        lanes,
        Duration::from_secs(f.settle_timeout_secs),
        Duration::from_secs(f.retention_days * 86_400),
        lease,
        setup.answer_times.clone(),
    )
}

/// The served EVM networks, and a lane per signer on each.
fn networks(
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

fn token_info(token: &TokenSettings, chain_id: u64) -> TokenInfo {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refund_hold_outlasts_the_settle_timeout_by_a_minute_and_a_day_at_most() {
        let secs = Duration::from_secs;
        assert_eq!(refund_hold(secs(30)), secs(90));
        assert_eq!(refund_hold(secs(86_400)), secs(86_400));
        assert_eq!(refund_hold(Duration::MAX), secs(86_400));
    }
}
