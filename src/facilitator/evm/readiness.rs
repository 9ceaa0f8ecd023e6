//! The EVM signers' funds for `/ready` and `/metrics`: each signer's balance and pending nonce on
//! each network, judged against [`SETTLEMENT_GAS`] at the chain's current price (the same gas a
//! lane is chosen by). A network is read in one batch, bounded by [`PROBE_TIMEOUT`], at most once
//! per head (`funds`), never per report; signers come network by network in name order, each
//! network's in configuration order.

use std::collections::BTreeMap;
use std::sync::Arc;

use ethers_core::types::{Address, U256};
use serde_json::json;

use super::lane::SETTLEMENT_GAS;
use super::Lane;
use crate::chain::{Batch, Call, Chain, Slot, Traffic};
use crate::evm;
use crate::facilitator::funds::{Due, Kept};
use crate::facilitator::readiness::{Funds, Role, Shortfall, PROBE_TIMEOUT};

/// A signer that cannot pay for one settlement, in `/ready`'s words.
const SHORTFALL: Shortfall = Shortfall {
    unit: "wei",
    needed_for: "one settlement",
    node: "chain",
};

/// One signer on one network, as its chain answered (`None`: no answer in time).
#[derive(Debug, Clone)]
pub struct SignerFunds {
    pub network: String,
    pub address: Address,
    /// Wei.
    pub balance: Option<U256>,
    pub nonce: Option<u64>,
    /// What one settlement costs at the current price.
    pub needed: U256,
}

impl SignerFunds {
    /// How many settlements the balance still pays for at the current price (`None`: not
    /// read); every one when the price is zero.
    pub fn settlements_left(&self) -> Option<u64> {
        let balance = self.balance?;
        let left = balance.checked_div(self.needed).unwrap_or(U256::MAX);
        Some(left.min(U256::from(u64::MAX)).as_u64())
    }

    /// As the facilitator reports it.
    pub fn report(&self) -> Funds {
        Funds {
            role: Role::Signer,
            network: self.network.clone(),
            key: evm::hex_bytes(self.address),
            balance: self.balance,
            nonce: self.nonce,
            settlements_left: self.settlements_left(),
            problem: SHORTFALL.problem(self.balance, self.needed),
        }
    }
}

/// Balance and pending nonce of every signer of `lanes`, as last read at its network's head:
/// one batch per network and block at most, none per call.
pub async fn signer_funds<'a>(
    lanes: impl Iterator<Item = &'a Arc<Lane>>,
    kept: &Kept<SignerFunds>,
) -> Vec<SignerFunds> {
    let mut by_network: BTreeMap<&str, Vec<&Arc<Lane>>> = BTreeMap::new();
    for lane in lanes {
        by_network.entry(lane.network()).or_default().push(lane);
    }
    let mut funds = Vec::new();
    for lanes in by_network.into_values() {
        funds.extend(network_funds(&lanes[0].chain, &lanes, kept).await);
    }
    funds
}

/// The signers of `lanes`, all on `chain`, read again only at a new head; nothing is read
/// before the first head (what one settlement costs is judged at its price) nor while the
/// chain is silent (its last answers may be stale, and asking again would only wait).
async fn network_funds(
    chain: &Arc<Chain>,
    lanes: &[&Arc<Lane>],
    kept: &Kept<SignerFunds>,
) -> Vec<SignerFunds> {
    let head = chain.head.current();
    let price = head.as_ref().map(|h| h.fees.max_fee_per_gas());
    let unknown = || unknown_funds(chain, lanes, price);
    let Some(head) = head.filter(|_| chain.readiness().answering.is_recent()) else {
        return unknown();
    };
    let due = Due::NewHead(head.number, head.hash);
    let read = || read_signers(chain, lanes, head.fees.max_fee_per_gas());
    kept.get(&chain.name, due, read).await
}

/// The funds the signers of `lanes` are reported with when they cannot be read.
fn unknown_funds(chain: &Chain, lanes: &[&Arc<Lane>], price: Option<U256>) -> Vec<SignerFunds> {
    let needed = price
        .unwrap_or_default()
        .saturating_mul(SETTLEMENT_GAS.into());
    let unknown = |lane: &&Arc<Lane>| SignerFunds {
        network: chain.name.clone(),
        address: lane.signer_address(),
        balance: None,
        nonce: None,
        needed,
    };
    lanes.iter().map(unknown).collect()
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
            address: signer,
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

    fn signer(balance: Option<u64>, needed: u64) -> SignerFunds {
        SignerFunds {
            network: "base".into(),
            address: Address::repeat_byte(1),
            balance: balance.map(U256::from),
            nonce: None,
            needed: needed.into(),
        }
    }

    #[test]
    fn settlements_left_are_the_balance_over_what_one_costs() {
        assert_eq!(signer(Some(1_000), 300).settlements_left(), Some(3));
        assert_eq!(signer(Some(299), 300).settlements_left(), Some(0));
        assert_eq!(signer(Some(5), 0).settlements_left(), Some(u64::MAX));
        assert_eq!(signer(None, 300).settlements_left(), None);
    }

    #[test]
    fn a_signer_is_judged_against_what_one_settlement_needs() {
        assert_eq!(signer(Some(300), 300).report().problem, None);
        assert_eq!(
            signer(Some(299), 300).report().problem.as_deref(),
            Some("balance 299 wei is below 300 wei needed for one settlement")
        );
        let unknown = signer(None, 300).report();
        assert_eq!(
            unknown.problem.as_deref(),
            Some("balance unknown: chain unreachable")
        );
        assert_eq!(unknown.key, "0x0101010101010101010101010101010101010101");
        assert_eq!(unknown.role, Role::Signer);
    }
}
