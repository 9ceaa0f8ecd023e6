//! Talking to EVM nodes: the upstream client, the per-block head and fee cache, and the
//! hex-quantity helpers every caller needs.

pub mod client;
pub mod fees;
pub mod head;
pub mod read_mode;

use std::sync::Arc;
use std::time::Duration;

use ethers_core::abi::{decode, ParamType, Token};
use ethers_core::types::{Address, H256, U256};
use ethers_core::utils::id;
use serde_json::{json, Value};

use crate::config::ChainSettings;
pub use client::{Call, CallResult, ChainClient, Refusal, RpcError, Unreachable};
pub use fees::{Fees, TxFees};
pub use head::{Canonical, Head, HeadWatcher};
pub use read_mode::ReadMode;
use read_mode::ReadModeCell;

/// A configured chain: its settings, its upstream client and its head cache.
pub struct Chain {
    pub name: String,
    pub settings: ChainSettings,
    pub client: Arc<ChainClient>,
    pub head: HeadWatcher,
    read_mode: ReadModeCell,
}

impl Chain {
    pub fn new(name: &str, settings: &ChainSettings) -> Result<Arc<Self>, String> {
        let client = ChainClient::new(
            name,
            &settings.rpc_urls,
            Duration::from_millis(settings.request_timeout_ms),
            settings.max_concurrent_requests,
            settings.max_batch_calls,
        )?;
        let head = HeadWatcher::spawn(
            client.clone(),
            settings.fee_model,
            Duration::from_millis(settings.poll_interval_ms),
            settings.ws_urls.clone(),
        );
        Ok(Arc::new(Self {
            name: name.to_string(),
            settings: settings.clone(),
            client,
            head,
            read_mode: ReadModeCell::default(),
        }))
    }

    /// The latest head, asking the chain now if the cache has none yet.
    pub async fn latest_head(&self) -> Result<Head, Unreachable> {
        self.head.latest_or_fetch().await
    }

    pub fn read_mode(&self) -> ReadMode {
        self.read_mode.get()
    }

    /// The read mode, probing the node first if it is not known yet.
    pub async fn learn_read_mode(&self) -> Result<ReadMode, Unreachable> {
        let known = self.read_mode.get();
        if known != ReadMode::Unknown {
            return Ok(known);
        }
        let mode = read_mode::probe(&self.client).await?;
        self.read_mode.set(mode);
        tracing::info!(chain = %self.name, read_mode = mode.as_str(), "verify read mode");
        Ok(mode)
    }

    /// The node did not run an override it ran before (a failover URL of another make, say):
    /// the next read probes again, and this one is sent in batch mode.
    pub fn forget_read_mode(&self, why: &str) {
        if self.read_mode.get() != ReadMode::Unknown {
            self.read_mode.set(ReadMode::Unknown);
            tracing::warn!(chain = %self.name, %why, "verify read mode to be probed again");
        }
    }
}

pub fn hex_u256(n: U256) -> String {
    format!("{n:#x}")
}

/// `0x` and lowercase hex: bytes, or an address or hash (what their `{:?}` prints, without
/// primitive-types' byte-by-byte formatting, which was a tenth of verify's own instructions).
pub fn hex_bytes(bytes: impl AsRef<[u8]>) -> String {
    const_hex::encode_prefixed(bytes)
}

/// Decodes `0x`-prefixed hex with an even number of digits.
pub fn hex_decode(s: &str) -> Option<Vec<u8>> {
    let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    // Digits only: const-hex would take a second `0x` (or `0X`) as a prefix too.
    if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    const_hex::decode(digits).ok()
}

/// Reads a JSON-RPC hex quantity (`"0x1a"`).
pub fn parse_quantity(value: &Value) -> Option<U256> {
    let s = value.as_str()?;
    let digits = s.strip_prefix("0x")?;
    if digits.is_empty() || digits.len() > 64 {
        return None;
    }
    U256::from_str_radix(digits, 16).ok()
}

pub fn parse_u64(value: &Value) -> Option<u64> {
    parse_quantity(value)
        .filter(|n| *n <= U256::from(u64::MAX))
        .map(|n| n.as_u64())
}

/// A 32-byte value written `0x` + 64 hex digits: a nonce, a digest, a block or transaction hash.
pub fn parse_h256(s: &str) -> Option<H256> {
    let digits = s.strip_prefix("0x")?;
    let bytes = hex_decode(s).filter(|_| digits.len() == 64)?;
    (bytes.len() == 32).then(|| H256::from_slice(&bytes))
}

/// The reason in revert data encoded as `Error(string)`, as Solidity's `require` and
/// `revert("...")` write it.
pub fn error_string(data: &[u8]) -> Option<String> {
    if data.len() < 4 || data[..4] != id("Error(string)") {
        return None;
    }
    match decode(&[ParamType::String], &data[4..]).ok()?.pop()? {
        Token::String(reason) => Some(reason),
        _ => None,
    }
}

/// What revert data says, for a person: its `Error(string)` reason, or the data itself.
pub fn revert_message(data: &[u8]) -> String {
    match error_string(data) {
        Some(reason) => reason,
        None if data.is_empty() => "execution reverted".to_string(),
        None => format!("execution reverted with {}", hex_bytes(data)),
    }
}

/// Reads an ABI-encoded word answer of `eth_call` (`0x` + 64 hex digits).
pub fn parse_word(value: &Value) -> Option<U256> {
    let bytes = hex_decode(value.as_str()?)?;
    (bytes.len() >= 32).then(|| U256::from_big_endian(&bytes[..32]))
}

pub fn eth_call(to: Address, data: &[u8], block: &str) -> Call {
    Call::new(
        "eth_call",
        vec![
            json!({"to": hex_bytes(to), "data": hex_bytes(data)}),
            json!(block),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        assert_eq!(hex_decode("0x00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(hex_decode("0x0"), None);
        assert_eq!(hex_decode("00"), None);
        assert_eq!(hex_decode("0xzz"), None);
        assert_eq!(hex_decode("0x0x00"), None);
        // Found by the fuzzer: a second prefix in capitals left 31 bytes for a 32-byte hash.
        assert_eq!(hex_decode("0x0X00"), None);
        let nonce = format!("0x0X{}", "0".repeat(62));
        assert_eq!(parse_h256(&nonce), None);
        assert_eq!(hex_decode("0XAbCd"), Some(vec![0xab, 0xcd]));
        assert_eq!(hex_bytes([0, 255, 16]), "0x00ff10");
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity(&json!("0x1a")), Some(U256::from(26)));
        assert_eq!(parse_quantity(&json!("1a")), None);
        assert_eq!(parse_quantity(&json!("0x")), None);
        assert_eq!(parse_u64(&json!("0x10000000000000000")), None);
        assert_eq!(hex_u256(U256::from(255)), "0xff");
        assert_eq!(hex_u256(U256::zero()), "0x0");
    }
}
