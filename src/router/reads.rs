//! What a read forwarded at a chain's endpoint may ask (access.md §3c): the endpoint is a read
//! endpoint, bounded. `eth_call` and `eth_estimateGas` run what the caller sends, so their state
//! and block overrides (third and later params: code of the caller's choosing at any address,
//! returning megabytes per call) are refused, and so is a `gas` above the chain's
//! `max_call_gas`; a block is served with its transaction hashes only. Refused before any
//! upstream request.

use ethers_core::types::U256;
use serde_json::Value;

use crate::evm;

/// Why a read's params are refused; each names the param at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadRefusal {
    #[error("params[{0}]: state and block overrides are not served here; send the call and its block only")]
    Override(usize),
    #[error("params[0].gas: {asked} is above chains.{chain}.max_call_gas ({max})")]
    GasAbove {
        chain: String,
        asked: U256,
        max: u64,
    },
    #[error("params[0].gas: expected a hex quantity (0x...)")]
    GasMalformed,
    #[error("params[1]: full transactions are not served here; ask with false (transaction hashes only)")]
    FullTransactions,
}

/// The bounds of one chain's reads.
#[derive(Debug, Clone, Copy)]
pub struct ReadBounds<'a> {
    pub chain: &'a str,
    pub max_call_gas: u64,
}

/// Whether `read` with `params` may be forwarded.
pub fn check(read: &str, params: &[Value], bounds: ReadBounds<'_>) -> Result<(), ReadRefusal> {
    match read {
        "eth_call" | "eth_estimateGas" => {
            if params.len() > 2 {
                return Err(ReadRefusal::Override(2));
            }
            check_gas(params.first(), bounds)
        }
        "eth_getBlockByNumber" | "eth_getBlockByHash" => match params.get(1) {
            Some(Value::Bool(true)) => Err(ReadRefusal::FullTransactions),
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

fn check_gas(call: Option<&Value>, bounds: ReadBounds<'_>) -> Result<(), ReadRefusal> {
    let Some(gas) = call.and_then(|call| call.get("gas")) else {
        return Ok(());
    };
    if gas.is_null() {
        return Ok(());
    }
    let asked = evm::parse_quantity(gas).ok_or(ReadRefusal::GasMalformed)?;
    if asked > U256::from(bounds.max_call_gas) {
        return Err(ReadRefusal::GasAbove {
            chain: bounds.chain.to_string(),
            asked,
            max: bounds.max_call_gas,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const BOUNDS: ReadBounds<'static> = ReadBounds {
        chain: "op",
        max_call_gas: 30_000_000,
    };

    fn check_of(read: &str, params: Value) -> Result<(), ReadRefusal> {
        check(read, params.as_array().unwrap(), BOUNDS)
    }

    #[test]
    fn overrides_are_refused_in_calls_and_estimates_and_named() {
        let call = json!({"to": "0x0000000000000000000000000000000000000001"});
        for read in ["eth_call", "eth_estimateGas"] {
            assert_eq!(check_of(read, json!([call, "latest"])), Ok(()));
            assert_eq!(check_of(read, json!([call])), Ok(()));
            let state = json!([call, "latest", {"0x01": {"code": "0x00"}}]);
            assert_eq!(check_of(read, state), Err(ReadRefusal::Override(2)));
            let block = json!([call, "latest", {}, {"number": "0x1"}]);
            assert_eq!(check_of(read, block), Err(ReadRefusal::Override(2)));
        }
        let message = ReadRefusal::Override(2).to_string();
        assert!(message.starts_with("params[2]"), "{message}");
    }

    #[test]
    fn gas_above_the_chain_cap_is_refused_and_at_it_served() {
        let with_gas = |gas: Value| json!([{"to": "0x01", "gas": gas}, "latest"]);
        assert_eq!(check_of("eth_call", with_gas(json!("0x1c9c380"))), Ok(()));
        assert_eq!(check_of("eth_call", with_gas(Value::Null)), Ok(()));
        let above = check_of("eth_estimateGas", with_gas(json!("0x1c9c381"))).unwrap_err();
        assert!(matches!(
            above,
            ReadRefusal::GasAbove {
                max: 30_000_000,
                ..
            }
        ));
        let message = above.to_string();
        assert!(
            message.contains("params[0].gas") && message.contains("chains.op.max_call_gas"),
            "{message}"
        );
        for malformed in [json!(30), json!("30"), json!("0x"), json!({})] {
            assert_eq!(
                check_of("eth_call", with_gas(malformed)),
                Err(ReadRefusal::GasMalformed)
            );
        }
    }

    #[test]
    fn blocks_are_served_with_hashes_only() {
        assert_eq!(
            check_of("eth_getBlockByNumber", json!(["latest", false])),
            Ok(())
        );
        assert_eq!(check_of("eth_getBlockByNumber", json!(["latest"])), Ok(()));
        assert_eq!(
            check_of("eth_getBlockByNumber", json!(["latest", true])),
            Err(ReadRefusal::FullTransactions)
        );
        assert_eq!(
            check_of(
                "eth_getBlockByHash",
                json!([format!("0x{}", "ab".repeat(32)), true])
            ),
            Err(ReadRefusal::FullTransactions)
        );
        assert_eq!(
            check_of("eth_getBalance", json!(["0x01", "latest", 1, 2])),
            Ok(())
        );
    }
}
