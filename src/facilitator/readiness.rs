//! What the facilitator reports of itself to `/ready` and `/metrics`: each signer's funds and
//! pending nonce, each Solana fee payer's lamports, and the signer lanes whose last step panicked.
//!
//! Invariants: whether a signer can pay is judged here, against [`SETTLEMENT_GAS`] at the
//! chain's current price, the same gas a lane is chosen by; whether a fee payer can, against the
//! most one Solana settlement costs it ([`svm::max_settlement_fee`]) and the rent-exempt minimum
//! it must keep. A network is read in one batch, bounded by [`PROBE_TIMEOUT`], when its last
//! read is due (`funds`: a new head, a Solana slot time), never per report; signers and fee
//! payers come network by network in name order, each network's in configuration order.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ethers_core::types::{Address, U256};
use serde_json::json;

use super::evm::lane::SETTLEMENT_GAS;
use super::funds::{Due, Kept, SOLANA_BLOCK_TIME};
use super::svm::SvmNetwork;
use super::{Facilitator, Lane};
use crate::chain::Traffic;
use crate::chain::{Batch, Call, Chain, Slot};
use crate::evm;
use crate::guard::Guard;
use crate::ledger::Payer;
use crate::svm::{self, Pubkey};

/// How long the probe of one network's signers may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The funds last read, per network (see `funds`).
#[derive(Default)]
pub struct KeptFunds {
    signers: Kept<SignerFunds>,
    fee_payers: Kept<FeePayerFunds>,
}

/// The facilitator's readiness report.
pub struct Readiness<'a> {
    /// Lanes whose worker's last step panicked.
    pub lanes_down: Vec<&'a Guard>,
    pub signers: Vec<SignerFunds>,
    pub fee_payers: Vec<FeePayerFunds>,
}

/// One signer on one network, as its chain answered (`None`: no answer in time).
#[derive(Debug, Clone)]
pub struct SignerFunds {
    pub network: String,
    /// Lower-case 0x hex.
    pub address: String,
    pub balance: Option<U256>,
    pub nonce: Option<u64>,
    /// What one settlement costs at the current price.
    pub needed: U256,
}

/// One Solana fee payer on one network, as its cluster answered (`None`: no answer in time).
#[derive(Debug, Clone)]
pub struct FeePayerFunds {
    /// The v1 name of the network.
    pub network: &'static str,
    pub fee_payer: Pubkey,
    /// Lamports.
    pub balance: Option<u64>,
    /// The most one settlement costs, and the rent-exempt minimum the fee payer keeps.
    pub needed: u64,
}

/// Whether a signer (wei) or a fee payer (lamports) can pay for one settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Funding<A = U256> {
    Enough,
    Short {
        balance: A,
        needed: A,
    },
    /// The chain did not answer.
    Unknown,
}

impl<A: Ord + Copy> Funding<A> {
    fn of(balance: Option<A>, needed: A) -> Self {
        match balance {
            Some(balance) if balance >= needed => Funding::Enough,
            Some(balance) => Funding::Short { balance, needed },
            None => Funding::Unknown,
        }
    }
}

impl SignerFunds {
    pub fn funding(&self) -> Funding {
        Funding::of(self.balance, self.needed)
    }

    /// How many settlements the balance still pays for at the current price (`None`: not
    /// read); every one when the price is zero.
    pub fn settlements_left(&self) -> Option<u64> {
        let balance = self.balance?;
        let left = balance.checked_div(self.needed).unwrap_or(U256::MAX);
        Some(left.min(U256::from(u64::MAX)).as_u64())
    }
}

impl FeePayerFunds {
    pub fn funding(&self) -> Funding<u64> {
        Funding::of(self.balance, self.needed)
    }

    /// How many settlements the lamports above the rent-exempt minimum still pay for, each at
    /// the most one costs (`None`: not read).
    pub fn settlements_left(&self) -> Option<u64> {
        let spendable = self
            .balance?
            .saturating_sub(svm::exact::RENT_EXEMPT_MINIMUM);
        let one = self.needed.saturating_sub(svm::exact::RENT_EXEMPT_MINIMUM);
        Some(spendable.checked_div(one).unwrap_or(u64::MAX))
    }
}

/// How the store answered one read (`Facilitator::store_probe`).
#[derive(Debug, Clone, Copy)]
pub struct StoreProbe {
    pub ok: bool,
    pub took: Duration,
}

impl Facilitator {
    /// What `/ready` asks of the facilitator.
    pub async fn readiness(&self) -> Readiness<'_> {
        // Both probes at once: each may take PROBE_TIMEOUT on a silent chain.
        let (signers, fee_payers) = tokio::join!(self.signer_funds(), self.fee_payer_funds());
        Readiness {
            lanes_down: self.lanes_down().collect(),
            signers,
            fee_payers,
        }
    }

    /// One small read of the store (a payer's revert cooldown), bounded by [`PROBE_TIMEOUT`]:
    /// whether it answered, and how long it took.
    pub async fn store_probe(&self) -> StoreProbe {
        let started = std::time::Instant::now();
        let nobody = Payer::Evm(Address::zero());
        let read = self.ledger.cooldown_of(&nobody, crate::clock::unix_now());
        let ok = matches!(tokio::time::timeout(PROBE_TIMEOUT, read).await, Ok(Ok(_)));
        StoreProbe {
            ok,
            took: started.elapsed(),
        }
    }

    /// The lanes whose worker's last step panicked (see `guard`).
    pub fn lanes_down(&self) -> impl Iterator<Item = &Guard> {
        self.lanes().map(|l| &l.guard).filter(|g| g.is_down())
    }

    /// Balance and pending nonce of every signer, as last read at its network's head (see
    /// `funds`): one batch per network and block at most, none per call.
    pub async fn signer_funds(&self) -> Vec<SignerFunds> {
        let mut by_network: BTreeMap<&str, Vec<&Arc<Lane>>> = BTreeMap::new();
        for lane in self.lanes() {
            by_network.entry(lane.network()).or_default().push(lane);
        }
        let mut funds = Vec::new();
        for (network, lanes) in by_network {
            if let Some(served) = self.verifier.network(network) {
                funds.extend(self.network_funds(&served.chain, &lanes).await);
            }
        }
        funds
    }

    /// The lamports of every Solana fee payer, as last read (see `funds`): one batch per
    /// network and slot time at most, none per call.
    pub async fn fee_payer_funds(&self) -> Vec<FeePayerFunds> {
        let Some(svm) = &self.svm else {
            return Vec::new();
        };
        let mut networks: Vec<&SvmNetwork> = svm.networks().iter().collect();
        networks.sort_by_key(|n| n.name);
        let mut funds = Vec::new();
        for network in networks {
            let due = Due::After(SOLANA_BLOCK_TIME);
            let read = || network_fee_payers(network, svm.fee_payers());
            funds.extend(self.funds.fee_payers.get(network.name, due, read).await);
        }
        funds
    }

    /// The signers of `lanes`, all on `chain`, read again only at a new head; nothing is read
    /// before the first head (what one settlement costs is judged at its price) nor while the
    /// chain is silent (its last answers may be stale, and asking again would only wait).
    async fn network_funds(&self, chain: &Arc<Chain>, lanes: &[&Arc<Lane>]) -> Vec<SignerFunds> {
        let head = chain.head.current();
        let price = head.as_ref().map(|h| h.fees.max_fee_per_gas());
        let unknown = || unknown_funds(chain, lanes, price);
        let Some(head) = head.filter(|_| chain.readiness().answering.is_recent()) else {
            return unknown();
        };
        let due = Due::NewHead(head.number, head.hash);
        let read = || read_signers(chain, lanes, head.fees.max_fee_per_gas());
        self.funds.signers.get(&chain.name, due, read).await
    }
}

/// The funds the signers of `lanes` are reported with when they cannot be read.
fn unknown_funds(chain: &Chain, lanes: &[&Arc<Lane>], price: Option<U256>) -> Vec<SignerFunds> {
    let needed = price
        .unwrap_or_default()
        .saturating_mul(SETTLEMENT_GAS.into());
    let unknown = |lane: &&Arc<Lane>| SignerFunds {
        network: chain.name.clone(),
        address: evm::hex_bytes(lane.signer_address()),
        balance: None,
        nonce: None,
        needed,
    };
    lanes.iter().map(unknown).collect()
}

/// The lamports of `fee_payers` on `network`, in one batch bounded by [`PROBE_TIMEOUT`], and
/// whether the cluster answered.
async fn network_fee_payers(
    network: &SvmNetwork,
    fee_payers: &[Pubkey],
) -> (Vec<FeePayerFunds>, bool) {
    let balances = tokio::time::timeout(PROBE_TIMEOUT, network.chain.balances(fee_payers))
        .await
        .ok()
        .and_then(Result::ok);
    let settings = &network.chain.settings;
    let needed = svm::max_settlement_fee(
        settings.max_compute_units,
        settings.max_priority_fee_lamports,
    ) + svm::exact::RENT_EXEMPT_MINIMUM;
    let funds = fee_payers
        .iter()
        .enumerate()
        .map(|(i, fee_payer)| FeePayerFunds {
            network: network.name,
            fee_payer: *fee_payer,
            balance: balances.as_ref().and_then(|b| b.get(i).copied()),
            needed,
        })
        .collect::<Vec<_>>();
    let complete = funds.iter().all(|f| f.balance.is_some());
    (funds, complete)
}

/// The signers of `lanes`, all on `chain`: balance and pending nonce of each, in one batch
/// bounded by [`PROBE_TIMEOUT`], judged at `price`; and whether every answer read.
async fn read_signers(
    chain: &Arc<Chain>,
    lanes: &[&Arc<Lane>],
    price: U256,
) -> (Vec<SignerFunds>, bool) {
    let mut batch = Batch::new();
    let asked: Vec<(Address, Slot, Slot)> = lanes
        .iter()
        .map(|lane| {
            let signer = lane.signer_address();
            let address = json!(evm::hex_bytes(signer));
            let balance = batch.add(Call::new(
                "eth_getBalance",
                vec![address.clone(), json!("latest")],
            ));
            let nonce = batch.add(Call::new(
                "eth_getTransactionCount",
                vec![address, json!("pending")],
            ));
            (signer, balance, nonce)
        })
        .collect();
    let answers = tokio::time::timeout(PROBE_TIMEOUT, chain.client.ask(Traffic::Own, &batch))
        .await
        .ok()
        .and_then(Result::ok);
    let answer = |slot: Slot| answers.as_ref().and_then(|a| a.get(slot).as_ref().ok());
    let funds = asked
        .into_iter()
        .map(|(signer, balance, nonce)| SignerFunds {
            network: chain.name.clone(),
            address: evm::hex_bytes(signer),
            balance: answer(balance).and_then(evm::parse_quantity),
            nonce: answer(nonce).and_then(evm::parse_u64),
            needed: price.saturating_mul(SETTLEMENT_GAS.into()),
        })
        .collect::<Vec<_>>();
    let complete = funds
        .iter()
        .all(|f| f.balance.is_some() && f.nonce.is_some());
    (funds, complete)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fee_payer_is_judged_against_what_one_settlement_needs() {
        let funds = |balance| FeePayerFunds {
            network: "solana-devnet",
            fee_payer: Pubkey::new_unique(),
            balance,
            needed: 100,
        };
        assert_eq!(funds(Some(100)).funding(), Funding::Enough);
        assert_eq!(
            funds(Some(99)).funding(),
            Funding::Short {
                balance: 99,
                needed: 100
            }
        );
        assert_eq!(funds(None).funding(), Funding::Unknown);
    }

    #[test]
    fn settlements_left_are_the_balance_over_what_one_costs() {
        let rent = svm::exact::RENT_EXEMPT_MINIMUM;
        let fee_payer = |balance| FeePayerFunds {
            network: "solana-devnet",
            fee_payer: Pubkey::new_unique(),
            balance,
            needed: 10_000 + rent,
        };
        assert_eq!(fee_payer(Some(rent + 25_000)).settlements_left(), Some(2));
        assert_eq!(fee_payer(Some(rent - 1)).settlements_left(), Some(0));
        assert_eq!(fee_payer(None).settlements_left(), None);
        let signer = |balance: u64, needed: u64| SignerFunds {
            network: "base".into(),
            address: "0x".into(),
            balance: Some(balance.into()),
            nonce: None,
            needed: needed.into(),
        };
        assert_eq!(signer(1_000, 300).settlements_left(), Some(3));
        assert_eq!(signer(299, 300).settlements_left(), Some(0));
        assert_eq!(signer(5, 0).settlements_left(), Some(u64::MAX));
    }
}
