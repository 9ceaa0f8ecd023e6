//! What the ledger and the EVM leaf both hold, so that neither imports the other: hex of bytes as
//! keys and answers print it, and the fee fields of one signed transaction with their
//! arithmetic (an attempt stores them; the lanes price replacements with them). No I/O.

use ethers_core::types::U256;

/// `0x` and lowercase hex: bytes, or an address or hash (what their `{:?}` prints, without
/// primitive-types' byte-by-byte formatting, which was a tenth of verify's own instructions).
pub fn hex_bytes(bytes: impl AsRef<[u8]>) -> String {
    const_hex::encode_prefixed(bytes)
}

/// The fee fields of one signed transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TxFees {
    Eip1559 { max_fee: U256, priority_fee: U256 },
    Legacy { gas_price: U256 },
}

/// A replacement must pay at least this much more than the transaction it replaces, in
/// per-mille (nodes require +10%; 12.5% leaves room for rounding and is what geth suggests).
const REPLACEMENT_BUMP_PER_MILLE: u64 = 125;

impl TxFees {
    pub fn max_fee_per_gas(&self) -> U256 {
        match *self {
            TxFees::Eip1559 { max_fee, .. } => max_fee,
            TxFees::Legacy { gas_price } => gas_price,
        }
    }

    pub fn priority_fee(&self) -> U256 {
        match *self {
            TxFees::Eip1559 { priority_fee, .. } => priority_fee,
            TxFees::Legacy { gas_price } => gas_price,
        }
    }

    /// Keeps the price at or under `cap`. The tip is kept whole when it fits under the cap
    /// (a transaction without a tip may wait forever); only the headroom above it is cut.
    pub fn capped(&self, cap: Option<U256>) -> TxFees {
        let Some(cap) = cap else { return *self };
        match *self {
            TxFees::Eip1559 {
                max_fee,
                priority_fee,
            } => {
                let max_fee = max_fee.min(cap);
                TxFees::Eip1559 {
                    max_fee,
                    priority_fee: priority_fee.min(max_fee),
                }
            }
            TxFees::Legacy { gas_price } => TxFees::Legacy {
                gas_price: gas_price.min(cap),
            },
        }
    }

    /// The fees of a replacement for a transaction signed at `self`: the market price or the
    /// previous price plus 12.5%, whichever is higher, on each field.
    pub fn replacement(&self, market: TxFees) -> TxFees {
        let bump = |v: U256| v + v * REPLACEMENT_BUMP_PER_MILLE / 1000 + 1;
        match (*self, market) {
            (
                TxFees::Eip1559 {
                    max_fee,
                    priority_fee,
                },
                market,
            ) => TxFees::Eip1559 {
                max_fee: bump(max_fee).max(market.max_fee_per_gas()),
                priority_fee: bump(priority_fee).max(market.priority_fee()),
            },
            (TxFees::Legacy { gas_price }, market) => TxFees::Legacy {
                gas_price: bump(gas_price).max(market.max_fee_per_gas()),
            },
        }
    }

    /// Whether a replacement at these fees would be accepted over `previous` by a node.
    pub fn replaces(&self, previous: &TxFees) -> bool {
        let enough = |new: U256, old: U256| new * 1000 >= old * 1100;
        enough(self.max_fee_per_gas(), previous.max_fee_per_gas())
            && enough(self.priority_fee(), previous.priority_fee())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replacement_pays_at_least_an_eighth_more_or_the_market() {
        let old = TxFees::Eip1559 {
            max_fee: 1000.into(),
            priority_fee: 100.into(),
        };
        let calm = old.replacement(TxFees::Eip1559 {
            max_fee: 900.into(),
            priority_fee: 50.into(),
        });
        assert_eq!(
            calm,
            TxFees::Eip1559 {
                max_fee: 1126.into(),
                priority_fee: 113.into()
            }
        );
        assert!(calm.replaces(&old));
        let busy = old.replacement(TxFees::Eip1559 {
            max_fee: 5000.into(),
            priority_fee: 50.into(),
        });
        assert_eq!(busy.max_fee_per_gas(), U256::from(5000));
        assert!(!old.replaces(&old));
    }
}
