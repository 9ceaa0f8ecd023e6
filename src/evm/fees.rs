//! Fee data of one block and the arithmetic the router and the facilitator share.

use ethers_core::types::U256;

pub use crate::primitives::TxFees;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fees {
    Eip1559 { base_fee: U256, priority_fee: U256 },
    Legacy { gas_price: U256 },
}

impl Fees {
    /// `maxFeePerGas = 2 * baseFee + priority`: room for six full blocks of base-fee growth.
    pub fn max_fee_per_gas(&self) -> U256 {
        match *self {
            Fees::Eip1559 {
                base_fee,
                priority_fee,
            } => base_fee
                .saturating_mul(2.into())
                .saturating_add(priority_fee),
            Fees::Legacy { gas_price } => gas_price,
        }
    }

    /// What one unit of gas is expected to cost if included in the next block.
    pub fn effective_price(&self) -> U256 {
        match *self {
            Fees::Eip1559 {
                base_fee,
                priority_fee,
            } => base_fee.saturating_add(priority_fee),
            Fees::Legacy { gas_price } => gas_price,
        }
    }

    /// The fee fields of a transaction signed at these fees.
    pub fn for_transaction(&self) -> TxFees {
        match *self {
            Fees::Eip1559 { priority_fee, .. } => TxFees::Eip1559 {
                max_fee: self.max_fee_per_gas(),
                priority_fee,
            },
            Fees::Legacy { gas_price } => TxFees::Legacy { gas_price },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eip1559_max_fee_is_twice_base_plus_tip() {
        let fees = Fees::Eip1559 {
            base_fee: 100.into(),
            priority_fee: 7.into(),
        };
        assert_eq!(fees.max_fee_per_gas(), U256::from(207));
        assert_eq!(fees.effective_price(), U256::from(107));
    }

    #[test]
    fn cap_keeps_the_tip_when_base_plus_tip_fits() {
        let base: U256 = 1_000_000_000u64.into();
        let tip: U256 = 100_000_000u64.into();
        let cap = base * 3 / 2;
        let fees = Fees::Eip1559 {
            base_fee: base,
            priority_fee: tip,
        }
        .for_transaction()
        .capped(Some(cap));
        assert_eq!(fees.max_fee_per_gas(), cap);
        assert_eq!(fees.priority_fee(), tip);
        assert_eq!(
            TxFees::Legacy {
                gas_price: 9.into()
            }
            .capped(Some(5.into())),
            TxFees::Legacy {
                gas_price: 5.into()
            }
        );
    }
}
