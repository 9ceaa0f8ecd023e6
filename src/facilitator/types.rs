//! The answers no single version's request shapes: a settlement's outcome as the status routes
//! show it (in v1's reason names, as it always was; each family's route answers its own shape)
//! and the supported kinds of every served version. Each version's requests and its verify and
//! settle answers are its own (`protocol::v1`, `protocol::v2`).

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusOutcome {
    pub success: bool,
    pub transaction: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SupportedKind {
    pub x402_version: u32,
    pub scheme: &'static str,
    pub network: String,
    /// `upto`'s: the `facilitatorAddress` its witness must name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
}

/// `GET /supported`. `extensions` and `signers` are x402 v2's fields: present when v2 is served.
#[derive(Debug, Clone, Serialize)]
pub struct SupportedResponse {
    pub kinds: Vec<SupportedKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<&'static str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signers: Option<std::collections::BTreeMap<&'static str, Vec<String>>>,
}
