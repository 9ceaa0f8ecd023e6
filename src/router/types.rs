//! Router wire types and the validation of `{from, to, data, value}` (router.md §2).

use ethers_core::types::{Address, Bytes, U256};
use serde::{Deserialize, Serialize};

use crate::evm;
use crate::evm::Fees;

/// The request as sent: four strings. Values are checked by [`RouterTransaction::validate`].
#[derive(Debug, Clone, Deserialize)]
pub struct RouterTransaction {
    pub from: String,
    pub to: String,
    pub data: String,
    pub value: String,
}

/// A validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct Transaction {
    pub from: Address,
    /// `None` creates a contract.
    pub to: Option<Address>,
    pub data: Bytes,
    pub value: U256,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct InvalidField {
    pub field: &'static str,
    pub problem: String,
}

fn invalid(field: &'static str, problem: impl Into<String>) -> InvalidField {
    InvalidField {
        field,
        problem: problem.into(),
    }
}

impl RouterTransaction {
    pub fn validate(&self) -> Result<Transaction, InvalidField> {
        let from = evm::parse_checksummed(&self.from).map_err(|p| invalid("from", p))?;
        let to = match self.to.as_str() {
            "" | "0x" => None,
            other => Some(evm::parse_checksummed(other).map_err(|p| invalid("to", p))?),
        };
        let data = evm::hex_decode(&self.data)
            .filter(|_| self.data.starts_with("0x"))
            .ok_or_else(|| {
                invalid(
                    "data",
                    "expected 0x followed by an even number of hex digits",
                )
            })?;
        let value = evm::parse_uint(&self.value).ok_or_else(|| {
            invalid(
                "value",
                "expected a decimal integer or a 0x hex quantity of at most 2^256-1",
            )
        })?;
        if to.is_none() && data.is_empty() {
            return Err(invalid("data", "contract creation needs init code"));
        }
        Ok(Transaction {
            from,
            to,
            data: data.into(),
            value,
        })
    }
}

/// The completed parameters; fee fields are those of the chosen chain's fee type only.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouterTransactionRes {
    pub chain_id: String,
    pub nonce: String,
    pub gas_limit: String,
    #[serde(flatten)]
    pub fees: FeeFields,
}

/// `maxFeePerGas` and `maxPriorityFeePerGas` (EIP-1559) or `gasPrice` (legacy), as hex quantities.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FeeFields {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_fee_per_gas: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_priority_fee_per_gas: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gas_price: Option<String>,
}

impl FeeFields {
    pub fn of(fees: &Fees) -> Self {
        match *fees {
            Fees::Eip1559 { priority_fee, .. } => FeeFields {
                max_fee_per_gas: Some(evm::hex_u256(fees.max_fee_per_gas())),
                max_priority_fee_per_gas: Some(evm::hex_u256(priority_fee)),
                gas_price: None,
            },
            Fees::Legacy { gas_price } => FeeFields {
                gas_price: Some(evm::hex_u256(gas_price)),
                ..FeeFields::default()
            },
        }
    }
}

/// One candidate chain's answer in `router_quote`, and in the reasons of a refusal.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ChainQuote {
    pub chain: String,
    pub kind: crate::config::ChainKind,
    pub chain_id: String,
    pub feasible: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gas_limit: Option<String>,
    #[serde(flatten)]
    pub fees: FeeFields,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l1_fee: Option<String>,
    /// Expected cost in wei of the chain's native token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_wei: Option<String>,
    /// Cost converted with `native_price`, comparable across chains.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    pub latency_ms: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainStatus {
    pub chain: String,
    pub kind: crate::config::ChainKind,
    pub chain_id: String,
    pub healthy: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head_block: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_answer_ms_ago: Option<u64>,
    pub fee_model: &'static str,
    /// How verify reads this chain: `lens` (one call), `batch`, or `unknown` until probed.
    pub read_mode: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tx(from: &str, to: &str, data: &str, value: &str) -> RouterTransaction {
        RouterTransaction {
            from: from.into(),
            to: to.into(),
            data: data.into(),
            value: value.into(),
        }
    }

    const A: &str = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8";

    #[test]
    fn accepts_the_documented_forms() {
        let ok = tx(A, &A.to_lowercase(), "0x", "1000").validate().unwrap();
        assert_eq!(ok.value, U256::from(1000));
        assert!(ok.data.is_empty());
        assert_eq!(
            tx(A, A, "0xabcd", "0x10").validate().unwrap().value,
            U256::from(16)
        );
        assert_eq!(tx(A, "", "0x6000", "0").validate().unwrap().to, None);
        assert_eq!(tx(A, "0x", "0x6000", "0").validate().unwrap().to, None);
    }

    #[test]
    fn names_the_bad_field() {
        let bad_checksum = A.replace('C', "c").replacen('c', "C", 1);
        let cases = [
            (tx("0x123", A, "0x", "0"), "from"),
            (tx(&bad_checksum, A, "0x", "0"), "from"),
            (tx(A, "0xzz", "0x", "0"), "to"),
            (tx(A, A, "abcd", "0"), "data"),
            (tx(A, A, "0xabc", "0"), "data"),
            (tx(A, A, "0x", "-1"), "value"),
            (tx(A, A, "0x", "1.5"), "value"),
            (tx(A, A, "0x", "0x"), "value"),
            (tx(A, A, "0x", &format!("0x1{}", "0".repeat(64))), "value"),
            (tx(A, "", "0x", "0"), "data"),
        ];
        for (request, field) in cases {
            assert_eq!(request.validate().unwrap_err().field, field, "{request:?}");
        }
    }
}
