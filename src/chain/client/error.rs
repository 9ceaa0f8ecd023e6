//! What a node's answers say when they are errors: a call's JSON-RPC error (a revert, a halt,
//! a refusal of a transaction, classified here once so that no caller matches on message text),
//! and the chain unreachable. A node's words never carry the URL they were asked on: every
//! error is scrubbed of it, message and data alike (access.md §3c).

use jsonrpsee::core::client::Error as ClientError;
use serde_json::Value;

use crate::config::Endpoint;

/// The node's answer to one call of a batch: a value, or the JSON-RPC error it returned
/// (a revert, "nonce too low", ...).
pub type CallResult = Result<Value, RpcError>;

#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i32,
    pub message: String,
    pub data: Option<Value>,
}

/// What a node's error answer to `eth_sendRawTransaction` means for the transaction, classified
/// here once so that no caller matches on message text. Only an answer by which a node clearly
/// refuses the transaction is a refusal; anything else leaves it possibly taken (access.md §2, "an
/// unclear broadcast is not a failure").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The node has this very transaction already.
    AlreadyKnown,
    /// The signer's nonce was used already (by us or by someone else).
    NonceTooLow,
    /// Another transaction holds this nonce in the pool with equal or higher fees, or the
    /// price is below what the node takes now (a base fee above the fee cap).
    Underpriced,
    /// The node cannot take it now (a full pool, a rate limit): sent again later.
    Busy,
    /// The signer cannot pay for the gas.
    InsufficientFunds,
    /// The node says it will not take this transaction as it is: an invalid sender or
    /// signature, too little intrinsic gas, over the block gas limit, a revert, a policy.
    Rejected,
    /// Not a refusal the node made clear (an internal error, text nobody here recognises): the
    /// node may have taken the transaction before it failed to say so, so it may still be mined.
    Unclear,
}

/// Phrases by which nodes (geth, reth, erigon, nethermind, anvil, providers) reject a
/// transaction for good: sending the same bytes again does not change the answer.
const REJECTIONS: [&str; 16] = [
    "invalid sender",
    "invalid signature",
    "invalid transaction",
    "intrinsic gas too low",
    "exceeds block gas limit",
    "gas limit reached",
    "oversized data",
    "max initcode size exceeded",
    "type not supported",
    "invalid chain id",
    "tip higher than fee cap",
    "higher than max fee per gas",
    "exceeds the configured cap",
    "negative value",
    "rejected",
    "reverted",
];

impl RpcError {
    /// Whether the node ran the call and it reverted: EIP-1474's code 3 (with the revert data),
    /// or a node that says so only in its message. Anything else (a block it no longer has
    /// during a reorganisation, a method it does not serve, an internal error) says nothing
    /// about the call: asked again, the node may answer it.
    pub fn is_revert(&self) -> bool {
        self.code == 3 || self.message.to_lowercase().contains("revert")
    }

    /// Whether the node ran the call and the EVM stopped it: a revert, or an exceptional halt
    /// (out of gas, an invalid opcode or jump, a stack error, a size limit). Nodes name halts
    /// only in their messages; these are the phrases of geth and of anvil (revm's
    /// `EVM error <halt>`). Anything not recognised is taken as the node failing, not the call.
    pub fn is_execution_failure(&self) -> bool {
        const HALTS: [&str; 10] = [
            "out of gas",
            "gas required exceeds",
            "evm error",
            "invalid opcode",
            "invalid jump",
            "stack underflow",
            "stack overflow",
            "write protection",
            "size exceeded",
            "return data out of bounds",
        ];
        let message = self.message.to_lowercase();
        self.is_revert() || HALTS.iter().any(|halt| message.contains(halt))
    }

    pub fn refusal(&self) -> Refusal {
        let m = self.message.to_lowercase();
        if m.contains("already known")
            || m.contains("known transaction")
            || m.contains("already imported")
        {
            Refusal::AlreadyKnown
        } else if m.contains("nonce too low") || m.contains("nonce is too low") {
            Refusal::NonceTooLow
        } else if [
            "underpriced",
            "less than block base fee",
            "fee too low",
            "price too low",
        ]
        .iter()
        .any(|p| m.contains(p))
        {
            Refusal::Underpriced
        } else if [
            "pool is full",
            "txpool full",
            "rate limit",
            "too many requests",
        ]
        .iter()
        .any(|p| m.contains(p))
        {
            Refusal::Busy
        } else if m.contains("insufficient funds") || m.contains("insufficient balance") {
            Refusal::InsufficientFunds
        } else if REJECTIONS.iter().any(|p| m.contains(p)) {
            Refusal::Rejected
        } else {
            Refusal::Unclear
        }
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

/// The chain could not be asked at all: every URL failed or timed out.
#[derive(Debug, Clone, thiserror::Error)]
#[error("chain {chain} unreachable: {detail}")]
pub struct Unreachable {
    pub chain: String,
    pub detail: String,
}

/// A node's error, without the URL its text may quote (a provider's error can name the keyed
/// URL it was asked on), in its message and in every string of its data (access.md §3c).
pub(super) fn rpc_error(e: &jsonrpsee::types::ErrorObject<'_>, url: &Endpoint) -> RpcError {
    RpcError {
        code: e.code(),
        message: scrubbed(e.message(), url),
        data: e
            .data()
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
            .map(|data| scrubbed_value(data, url)),
    }
}

/// `value` with [`scrubbed`] applied to each of its strings, object keys included.
fn scrubbed_value(value: Value, url: &Endpoint) -> Value {
    match value {
        Value::String(text) => Value::String(scrubbed(&text, url)),
        Value::Array(values) => Value::Array(
            values
                .into_iter()
                .map(|value| scrubbed_value(value, url))
                .collect(),
        ),
        Value::Object(members) => Value::Object(
            members
                .into_iter()
                .map(|(key, value)| (scrubbed(&key, url), scrubbed_value(value, url)))
                .collect(),
        ),
        other => other,
    }
}

/// The connection closed with the request on it and no answer: an idle pooled connection that
/// the other side closed as it was reused (hyper's "connection closed before message completed").
pub(super) fn closed_before_answering(error: &ClientError) -> bool {
    let ClientError::Transport(error) = error else {
        return false;
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error.as_ref());
    while let Some(error) = source {
        if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
            return hyper.is_incomplete_message();
        }
        source = error.source();
    }
    false
}

/// At most 200 characters of `error`, without the URL it may quote.
pub(super) fn short_error(error: &ClientError, url: &Endpoint) -> String {
    match error {
        ClientError::RequestTimeout => "timed out".to_string(),
        other => scrubbed(&other.to_string(), url)
            .chars()
            .take(200)
            .collect(),
    }
}

/// `text` with `url`, and its path and query, replaced by what may be shown of it.
pub(super) fn scrubbed(text: &str, url: &Endpoint) -> String {
    let secret = url.expose();
    let mut text = text.replace(secret, &url.shown());
    if let Some((_, rest)) = secret.split_once("://") {
        if let Some(start) = rest.find(['/', '?']) {
            let tail = &rest[start..];
            if tail.len() > 1 {
                text = text.replace(tail, "/…");
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(message: &str) -> Refusal {
        RpcError {
            code: -32000,
            message: message.to_string(),
            data: None,
        }
        .refusal()
    }

    #[test]
    fn a_node_errors_data_is_scrubbed_like_its_message() {
        let url: Endpoint =
            serde_json::from_value(serde_json::json!("https://node.example/v2/K3Y?apikey=K3Y"))
                .unwrap();
        let error = jsonrpsee::types::ErrorObject::owned(
            -32005,
            "limit for https://node.example/v2/K3Y?apikey=K3Y",
            Some(serde_json::json!({
                "url": "https://node.example/v2/K3Y?apikey=K3Y",
                "tried": ["/v2/K3Y?apikey=K3Y", 7],
                "/v2/K3Y?apikey=K3Y": true,
            })),
        );
        let scrubbed = rpc_error(&error, &url);
        let shown = format!("{} {}", scrubbed.message, scrubbed.data.unwrap());
        assert!(!shown.contains("K3Y"), "{shown}");
        assert!(shown.contains("https://node.example/…"), "{shown}");
    }

    #[test]
    fn only_a_revert_is_a_revert() {
        let error = |code, message: &str| RpcError {
            code,
            message: message.to_string(),
            data: None,
        };
        assert!(error(3, "execution reverted: FiatTokenV2: invalid signature").is_revert());
        assert!(error(3, "execution reverted").is_revert());
        assert!(error(-32000, "Execution reverted").is_revert());
        assert!(!error(
            -32603,
            "BlockOutOfRangeError: block height is 17 but requested was 19"
        )
        .is_revert());
        assert!(!error(-32000, "header not found").is_revert());
        assert!(!error(-32601, "the method eth_estimateGas does not exist").is_revert());
    }

    #[test]
    fn halts_are_execution_failures_and_node_errors_are_not() {
        let error = |code, message: &str| RpcError {
            code,
            message: message.to_string(),
            data: None,
        };
        for (code, halt) in [
            (3, "execution reverted"),
            (
                -32003,
                "Out of gas: gas required exceeds allowance: 30000000",
            ),
            (-32000, "gas required exceeds allowance (30000000)"),
            (-32603, "EVM error InvalidFEOpcode"),
            (-32000, "invalid opcode: INVALID"),
            (-32000, "invalid jump destination"),
            (-32000, "stack underflow (0 <=> 2)"),
            (-32000, "max code size exceeded"),
        ] {
            assert!(error(code, halt).is_execution_failure(), "{halt}");
        }
        for (code, failure) in [
            (
                -32603,
                "BlockOutOfRangeError: block height is 17 but requested was 19",
            ),
            (-32000, "header not found"),
            (-32005, "limit exceeded"),
            (-32601, "the method eth_estimateGas does not exist"),
            (-32000, "missing trie node"),
        ] {
            assert!(!error(code, failure).is_execution_failure(), "{failure}");
        }
    }

    #[test]
    fn node_refusals_are_classified_across_node_dialects() {
        assert_eq!(refusal("already known"), Refusal::AlreadyKnown);
        assert_eq!(
            refusal("transaction already imported"),
            Refusal::AlreadyKnown
        );
        assert_eq!(refusal("nonce too low: next nonce 5"), Refusal::NonceTooLow);
        assert_eq!(
            refusal("replacement transaction underpriced"),
            Refusal::Underpriced
        );
        assert_eq!(
            refusal("Insufficient funds for gas * price + value"),
            Refusal::InsufficientFunds
        );
        assert_eq!(refusal("intrinsic gas too low"), Refusal::Rejected);
        assert_eq!(
            refusal("max fee per gas less than block base fee"),
            Refusal::Underpriced
        );
        assert_eq!(refusal("txpool is full"), Refusal::Busy);
        assert_eq!(refusal("transaction rejected by policy"), Refusal::Rejected);
    }

    #[test]
    fn clear_rejections_are_refusals_and_anything_else_is_unclear() {
        for clear in [
            "invalid sender",
            "invalid transaction v, r, s values",
            "transaction type not supported",
            "exceeds block gas limit",
            "intrinsic gas too low: have 21000, want 53000",
            "max priority fee per gas higher than max fee per gas",
            "tx fee (1.20 ether) exceeds the configured cap (1.00 ether)",
            "execution reverted",
        ] {
            assert_eq!(refusal(clear), Refusal::Rejected, "{clear}");
        }
        // The node may have taken the transaction before it failed to answer.
        for unclear in [
            "internal error",
            "Internal JSON-RPC error.",
            "context deadline exceeded",
            "upstream connect error or disconnect/reset before headers",
            "",
        ] {
            assert_eq!(refusal(unclear), Refusal::Unclear, "{unclear:?}");
        }
    }
}
