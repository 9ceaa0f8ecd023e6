//! What a chain's own recent blocks paid per gas, read from `eth_feeHistory`, and the judgement
//! of a node's fee answer against it (access.md §2, "No single answer sets the price"): a node
//! that answers `eth_maxPriorityFeePerGas` or `eth_gasPrice` with a price far above what the
//! blocks show does not set what routerd pays.

use ethers_core::types::U256;
use serde_json::Value;

use super::fees::Fees;
use super::hex::parse_quantity;

/// A tip or gas price more than this many times the most a recent block paid per gas is not
/// believed. Ten leaves an honest node room for a burst the window has not seen yet.
pub const BELIEVED_MULTIPLE: u64 = 10;
/// A network with neither a configured nor a preset `max_fee_per_gas` is capped at this many
/// times the most its recent blocks paid at start: one window is no busy period, so the margin
/// is wider than a preset's.
pub const DERIVED_CAP_MULTIPLE: u64 = 20;
/// The tip used when the node suggests none and no recent block held a transaction.
const FALLBACK_TIP: u64 = 1_000_000_000;
/// The widest price per gas taken from a node, in bits (2^128 wei is far beyond any fee).
const MAX_PRICE_BITS: usize = 128;

/// One block of a fee history: its base fee, the median tip of its transactions, and whether it
/// held any (an empty block's "tip" is a zero that says nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaidBlock {
    pub base_fee: U256,
    pub tip: U256,
    pub used: bool,
}

/// A summary of the recent blocks, what the judgement needs of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecentFees {
    /// The most any recent block paid per gas: its base fee plus its median tip (zero without a
    /// fee history and on a legacy chain whose recent blocks are empty: nothing is known).
    pub paid: U256,
    /// The median of the median tips of the blocks that held transactions.
    pub tip: Option<U256>,
    /// The median of base fee plus median tip over the blocks that held transactions.
    pub price: Option<U256>,
}

impl RecentFees {
    pub fn of(blocks: &[PaidBlock]) -> Self {
        let paid = blocks
            .iter()
            .map(|b| b.base_fee.saturating_add(b.tip))
            .max()
            .unwrap_or_default();
        let used: Vec<&PaidBlock> = blocks.iter().filter(|b| b.used).collect();
        Self {
            paid,
            tip: median(used.iter().map(|b| b.tip).collect()),
            price: median(
                used.iter()
                    .map(|b| b.base_fee.saturating_add(b.tip))
                    .collect(),
            ),
        }
    }

    /// Reads an `eth_feeHistory` answer asked with one reward percentile. The base fee of the
    /// block after the last (the history's extra entry) counts as a block without transactions.
    pub fn parse(answer: &Value) -> Option<Self> {
        let price = |v: &Value| parse_quantity(v).filter(|p| p.bits() <= MAX_PRICE_BITS);
        let base_fees: Vec<U256> = answer
            .get("baseFeePerGas")?
            .as_array()?
            .iter()
            .map(price)
            .collect::<Option<_>>()?;
        let ratios = answer.get("gasUsedRatio")?.as_array()?;
        let rewards = answer.get("reward")?.as_array()?;
        if ratios.len() != rewards.len() || base_fees.len() < rewards.len() {
            return None;
        }
        let mut blocks = Vec::with_capacity(base_fees.len());
        for (i, base_fee) in base_fees.iter().enumerate() {
            let block = match (ratios.get(i), rewards.get(i)) {
                (Some(ratio), Some(reward)) => PaidBlock {
                    base_fee: *base_fee,
                    tip: reward.get(0).and_then(price)?,
                    used: ratio.as_f64()? > 0.0,
                },
                _ => PaidBlock {
                    base_fee: *base_fee,
                    tip: U256::zero(),
                    used: false,
                },
            };
            blocks.push(block);
        }
        Some(Self::of(&blocks))
    }

    /// The most a node's answer may be and still be believed, with `base_fee` the head block's
    /// (a header the node cannot inflate without the chain showing it); `None`: nothing is
    /// known to judge by.
    fn believed_up_to(&self, base_fee: U256) -> Option<U256> {
        let paid = self.paid.max(base_fee);
        (!paid.is_zero()).then(|| paid.saturating_mul(BELIEVED_MULTIPLE.into()))
    }

    /// The tip to sign with: the node's `suggested` one unless it is more than ten times what
    /// recent blocks paid per gas, in which case the blocks' own median tip (zero when they held
    /// no transaction: at the base fee alone a transaction still enters a quiet chain). A node
    /// that suggests none gets the blocks' tip too.
    pub fn judge_tip(&self, suggested: Option<U256>, base_fee: U256) -> U256 {
        let blocks_tip = self.tip.unwrap_or_default();
        match suggested {
            None => self.tip.unwrap_or_else(|| FALLBACK_TIP.into()),
            Some(tip) => match self.believed_up_to(base_fee) {
                Some(limit) if tip > limit => blocks_tip,
                _ => tip,
            },
        }
    }

    /// The legacy gas price to sign with: the node's unless it is more than ten times what
    /// recent blocks paid, in which case the median price the blocks paid.
    pub fn judge_gas_price(&self, suggested: U256) -> U256 {
        match self.believed_up_to(U256::zero()) {
            Some(limit) if suggested > limit => self.price.unwrap_or(self.paid),
            _ => suggested,
        }
    }

    /// The absolute cap of a network without a configured or preset one: a multiple of what
    /// the recent blocks paid, or, where they show nothing (a legacy chain with empty blocks),
    /// of the `judged` head fees.
    pub fn derived_cap(&self, judged: &Fees) -> U256 {
        let basis = if self.paid.is_zero() {
            judged.max_fee_per_gas()
        } else {
            self.paid
        };
        basis
            .max(U256::one())
            .saturating_mul(DERIVED_CAP_MULTIPLE.into())
    }
}

fn median(mut values: Vec<U256>) -> Option<U256> {
    values.sort();
    values.get(values.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const GWEI: u64 = 1_000_000_000;

    fn gwei(n: u64) -> U256 {
        U256::from(n) * GWEI
    }

    fn block(base_fee: U256, tip: U256) -> PaidBlock {
        PaidBlock {
            base_fee,
            tip,
            used: true,
        }
    }

    #[test]
    fn a_tip_ten_thousand_times_what_blocks_paid_is_clamped_to_their_tip() {
        // The node: base fee 0.02 gwei, blocks tipping 0.001 gwei, a 10,000 gwei answer.
        let base = gwei(2) / 100;
        let recent = RecentFees::of(&[block(base, gwei(1) / 1000); 5]);
        assert_eq!(recent.judge_tip(Some(gwei(10_000)), base), gwei(1) / 1000);
        // Ten times what a block paid is still believed; a wei more is not.
        let limit = (base + gwei(1) / 1000) * 10;
        assert_eq!(recent.judge_tip(Some(limit), base), limit);
        assert_eq!(
            recent.judge_tip(Some(limit + 1), base),
            gwei(1) / 1000,
            "one wei above ten times"
        );
    }

    #[test]
    fn empty_blocks_judge_by_their_base_fee_and_clamp_to_no_tip() {
        let recent = RecentFees::of(&[PaidBlock {
            base_fee: gwei(1) / 10,
            tip: U256::zero(),
            used: false,
        }]);
        assert_eq!(recent.tip, None);
        // anvil's 1 gwei suggestion over a 0.1 gwei base fee: exactly ten times, believed.
        assert_eq!(recent.judge_tip(Some(gwei(1)), gwei(1) / 10), gwei(1));
        assert_eq!(recent.judge_tip(Some(gwei(2)), gwei(1) / 10), U256::zero());
        // Without a suggestion and without tips to go by, the fallback tip.
        assert_eq!(recent.judge_tip(None, gwei(1) / 10), gwei(1));
    }

    #[test]
    fn without_a_history_the_head_base_fee_still_bounds_the_tip() {
        let none = RecentFees::default();
        assert_eq!(none.judge_tip(Some(gwei(5)), gwei(1)), gwei(5));
        assert_eq!(none.judge_tip(Some(gwei(11)), gwei(1)), U256::zero());
        // A legacy chain with nothing to judge by: the node's price stands (the cap bounds it).
        assert_eq!(none.judge_gas_price(gwei(10)), gwei(10));
    }

    #[test]
    fn a_legacy_price_far_above_what_blocks_paid_becomes_their_median_price() {
        let recent = RecentFees::of(&[
            block(U256::zero(), gwei(10)),
            block(U256::zero(), gwei(12)),
            block(U256::zero(), gwei(11)),
        ]);
        assert_eq!(recent.judge_gas_price(gwei(100)), gwei(100));
        assert_eq!(recent.judge_gas_price(gwei(121)), gwei(11));
    }

    #[test]
    fn the_derived_cap_is_a_multiple_of_the_busiest_block_or_of_the_head() {
        let recent = RecentFees::of(&[block(gwei(1), gwei(2)), block(gwei(3), gwei(1))]);
        let head = Fees::Eip1559 {
            base_fee: gwei(3),
            priority_fee: gwei(1),
        };
        assert_eq!(recent.derived_cap(&head), gwei(4) * DERIVED_CAP_MULTIPLE);
        let legacy = Fees::Legacy {
            gas_price: gwei(10),
        };
        assert_eq!(
            RecentFees::default().derived_cap(&legacy),
            gwei(10) * DERIVED_CAP_MULTIPLE
        );
    }

    #[test]
    fn a_fee_history_answer_is_read_block_by_block() {
        let answer = json!({
            "baseFeePerGas": ["0x64", "0x6e", "0x78"],
            "gasUsedRatio": [0.5, 0.0],
            "reward": [["0xa"], ["0x0"]],
            "oldestBlock": "0x1",
        });
        let recent = RecentFees::parse(&answer).expect("a history");
        assert_eq!(recent.paid, U256::from(0x78));
        assert_eq!(recent.tip, Some(U256::from(0xa)));
        assert_eq!(recent.price, Some(U256::from(0x6e)));
        for broken in [
            json!({"baseFeePerGas": ["0x1"], "gasUsedRatio": [0.5], "reward": []}),
            json!({"baseFeePerGas": ["0x1", "0x1"], "gasUsedRatio": [0.5], "reward": [["zz"]]}),
            json!({"baseFeePerGas": [format!("0x1{}", "0".repeat(40))], "gasUsedRatio": [], "reward": []}),
            json!("nope"),
        ] {
            assert_eq!(RecentFees::parse(&broken), None, "{broken}");
        }
    }
}
