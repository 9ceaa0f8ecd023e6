//! Fee data of one block and the arithmetic the router and the facilitator share.

use ethers_core::types::U256;

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

    /// The fees raised by `percent` (replacement transactions need at least +10% on both fields).
    pub fn bumped(&self, percent: u64) -> Fees {
        let bump = |v: U256| v.saturating_mul((100 + percent).into()) / 100 + 1;
        match *self {
            Fees::Eip1559 {
                base_fee,
                priority_fee,
            } => Fees::Eip1559 {
                base_fee: bump(base_fee),
                priority_fee: bump(priority_fee),
            },
            Fees::Legacy { gas_price } => Fees::Legacy {
                gas_price: bump(gas_price),
            },
        }
    }

    /// Keeps the price at or under `cap`, lowering the tip first.
    pub fn capped(&self, cap: Option<U256>) -> Fees {
        let Some(cap) = cap else { return *self };
        match *self {
            Fees::Eip1559 {
                base_fee,
                priority_fee,
            } => {
                let base_fee = base_fee.min(cap / 2);
                let priority_fee = priority_fee.min(cap - base_fee * 2);
                Fees::Eip1559 {
                    base_fee,
                    priority_fee,
                }
            }
            Fees::Legacy { gas_price } => Fees::Legacy {
                gas_price: gas_price.min(cap),
            },
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
    fn bump_raises_both_fields_by_at_least_the_percentage() {
        let fees = Fees::Eip1559 {
            base_fee: 100.into(),
            priority_fee: 10.into(),
        }
        .bumped(12);
        assert_eq!(
            fees,
            Fees::Eip1559 {
                base_fee: 113.into(),
                priority_fee: 12.into()
            }
        );
    }

    #[test]
    fn cap_keeps_max_fee_under_cap() {
        let fees = Fees::Eip1559 {
            base_fee: 100.into(),
            priority_fee: 50.into(),
        }
        .capped(Some(220.into()));
        assert!(fees.max_fee_per_gas() <= U256::from(220));
        assert_eq!(
            Fees::Legacy {
                gas_price: 9.into()
            }
            .capped(Some(5.into())),
            Fees::Legacy {
                gas_price: 5.into()
            }
        );
    }
}
