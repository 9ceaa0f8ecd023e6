//! Whether a chain's node runs `eth_call` with a state override (code placed at an address for
//! that one call). With it, verify reads every fact it needs in one call through the lens
//! (`facilitator/evm/lens.rs`); without it, verify sends a batch of plain reads.
//!
//! Learnt per chain with a probe at start, or at the first read after a start during which the
//! chain did not answer. When a node stops running the override (a failover URL of another make,
//! say), that read is sent as a batch and the next one probes again: a wrong guess costs a round
//! trip, never a wrong answer.

use super::traffic::Traffic;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::LazyLock;

use ethers_core::types::Address;
use serde_json::json;
use serde_json::value::RawValue;

use super::{eth_call, Batch, Call, ChainClient, Unreachable};
use crate::evm::parse_word;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// Not learnt yet: the chain has not answered the probe.
    Unknown,
    /// One `eth_call` with a state override per verify.
    Lens,
    /// A batch of plain reads per verify.
    Batch,
}

impl ReadMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReadMode::Unknown => "unknown",
            ReadMode::Lens => "lens",
            ReadMode::Batch => "batch",
        }
    }
}

/// Where overridden code is placed: the last 20 bytes of keccak256("routerd.lens"), an address
/// nobody holds a key or a contract for.
static OVERRIDE_ADDRESS: LazyLock<Address> = LazyLock::new(|| {
    let hash = ethers_core::utils::keccak256(b"routerd.lens");
    Address::from_slice(&hash[12..])
});

/// The chain's read mode, shared by every verify on it.
pub struct ReadModeCell(AtomicU8);

impl Default for ReadModeCell {
    fn default() -> Self {
        Self(AtomicU8::new(ReadMode::Unknown as u8))
    }
}

impl ReadModeCell {
    pub fn get(&self) -> ReadMode {
        match self.0.load(Ordering::Relaxed) {
            x if x == ReadMode::Lens as u8 => ReadMode::Lens,
            x if x == ReadMode::Batch as u8 => ReadMode::Batch,
            _ => ReadMode::Unknown,
        }
    }

    pub fn set(&self, mode: ReadMode) {
        self.0.store(mode as u8, Ordering::Relaxed);
    }
}

/// The state override that places `code` at `OVERRIDE_ADDRESS`, as JSON: built once per
/// code, since it is the same in every call.
pub fn code_override(code: &str) -> Box<RawValue> {
    serde_json::value::to_raw_value(&json!({ super::hex_bytes(*OVERRIDE_ADDRESS): {"code": code} }))
        .expect("a JSON object of strings")
}

/// `eth_call` of `data` on the code that `code_override` places, for this call only.
pub fn call_with_code(code_override: &'static RawValue, data: &[u8]) -> Call {
    let mut call = eth_call(*OVERRIDE_ADDRESS, data, "latest");
    call.raw_param = Some(code_override);
    call
}

/// Code that returns the word 42: PUSH1 42, PUSH1 0, MSTORE, PUSH1 32, PUSH1 0, RETURN.
const PROBE_CODE: &str = "0x602a60005260206000f3";

/// Asks the node to run `PROBE_CODE` through an override. A node without overrides either
/// refuses the third parameter (an error that is not the EVM's) or ignores it and runs the
/// empty account (answer `0x`). Any other answer (garbage, a revert) says nothing of the
/// node's make: no mode is learnt, and the next read probes again.
pub async fn probe(client: &ChainClient) -> Result<ReadMode, Unreachable> {
    static PROBE: LazyLock<Box<RawValue>> = LazyLock::new(|| code_override(PROBE_CODE));
    let mut batch = Batch::new();
    let probed = batch.add(call_with_code(&PROBE, &[]));
    let answers = client.ask(Traffic::Own, &batch).await?;
    match answers.get(probed) {
        Ok(v) if parse_word(v) == Some(42.into()) => Ok(ReadMode::Lens),
        Ok(v) if v.as_str() == Some("0x") => Ok(ReadMode::Batch),
        Err(e) if !e.is_execution_failure() => Ok(ReadMode::Batch),
        other => Err(Unreachable {
            chain: client.name().to_string(),
            detail: format!(
                "the read-mode probe got an answer that is neither ran nor refused: {}",
                match other {
                    Ok(v) => v.to_string().chars().take(80).collect::<String>(),
                    Err(e) => e.to_string(),
                }
            ),
        }),
    }
}
