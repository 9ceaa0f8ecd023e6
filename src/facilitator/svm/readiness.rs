//! The Solana fee payers' funds for `/ready` and `/metrics`: each fee payer's lamports on each
//! cluster, judged against the most one settlement costs it ([`svm::max_settlement_fee`]) and the
//! rent-exempt minimum it must keep. A cluster is read in one batch, bounded by
//! [`PROBE_TIMEOUT`], at most once per [`SOLANA_BLOCK_TIME`] (`funds`), never per report; fee
//! payers come cluster by cluster in name order, each in configuration order.

use std::time::Duration;

use ethers_core::types::U256;

use super::{SvmExact, SvmNetwork};
use crate::facilitator::funds::{Due, Kept};
use crate::facilitator::readiness::{Funds, Role, Shortfall, PROBE_TIMEOUT};
use crate::svm::{self, Pubkey};

/// About one Solana slot: fee payers' lamports are read no more often.
pub const SOLANA_BLOCK_TIME: Duration = Duration::from_millis(400);

/// A fee payer that cannot pay for one settlement, in `/ready`'s words.
const SHORTFALL: Shortfall = Shortfall {
    unit: "lamports",
    needed_for: "one settlement and the rent-exempt minimum",
    node: "cluster",
};

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

impl FeePayerFunds {
    /// How many settlements the lamports above the rent-exempt minimum still pay for, each at
    /// the most one costs (`None`: not read).
    pub fn settlements_left(&self) -> Option<u64> {
        let spendable = self
            .balance?
            .saturating_sub(svm::exact::RENT_EXEMPT_MINIMUM);
        let one = self.needed.saturating_sub(svm::exact::RENT_EXEMPT_MINIMUM);
        Some(spendable.checked_div(one).unwrap_or(u64::MAX))
    }

    /// As the facilitator reports it: named by its public key, as `/supported` names it.
    pub fn report(&self) -> Funds {
        Funds {
            role: Role::FeePayer,
            network: self.network.to_string(),
            key: self.fee_payer.to_string(),
            balance: self.balance.map(U256::from),
            nonce: None,
            settlements_left: self.settlements_left(),
            problem: SHORTFALL.problem(self.balance, self.needed),
        }
    }
}

/// The lamports of every fee payer of `exact`, as last read: one batch per network and slot time
/// at most, none per call.
pub async fn fee_payer_funds(exact: &SvmExact, kept: &Kept<FeePayerFunds>) -> Vec<FeePayerFunds> {
    let mut networks: Vec<&SvmNetwork> = exact.networks().iter().collect();
    networks.sort_by_key(|n| n.name);
    let mut funds = Vec::new();
    for network in networks {
        let due = Due::After(SOLANA_BLOCK_TIME);
        let read = || network_fee_payers(network, exact.fee_payers());
        funds.extend(kept.get(network.name, due, read).await);
    }
    funds
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fee_payer(balance: Option<u64>, needed: u64) -> FeePayerFunds {
        FeePayerFunds {
            network: "solana-devnet",
            fee_payer: Pubkey::new_unique(),
            balance,
            needed,
        }
    }

    #[test]
    fn a_fee_payer_is_judged_against_what_one_settlement_needs() {
        assert_eq!(fee_payer(Some(100), 100).report().problem, None);
        assert_eq!(
            fee_payer(Some(99), 100).report().problem.as_deref(),
            Some("balance 99 lamports is below 100 lamports needed for one settlement and the rent-exempt minimum")
        );
        let unknown = fee_payer(None, 100).report();
        assert_eq!(
            unknown.problem.as_deref(),
            Some("balance unknown: cluster unreachable")
        );
        assert_eq!(unknown.role, Role::FeePayer);
    }

    #[test]
    fn settlements_left_are_the_lamports_above_the_minimum_over_what_one_costs() {
        let rent = svm::exact::RENT_EXEMPT_MINIMUM;
        let needed = 10_000 + rent;
        assert_eq!(
            fee_payer(Some(rent + 25_000), needed).settlements_left(),
            Some(2)
        );
        assert_eq!(
            fee_payer(Some(rent - 1), needed).settlements_left(),
            Some(0)
        );
        assert_eq!(fee_payer(None, needed).settlements_left(), None);
    }
}
