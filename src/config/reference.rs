//! The configuration reference (`docs/configuration.md`) names every key the settings structs
//! read, and no other. The keys are found by serializing settings that have every section (the
//! structs serialize under the names they deserialize, an unset option as null), so a key added
//! to the schema without a row in the reference, or a row left behind by a removed key, fails
//! here rather than reaching an operator.

use std::collections::BTreeSet;

use serde_json::Value;

use super::testing::{load, BASE};

const REFERENCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");

/// Every section and every kind of table: an EVM chain with a token (`BASE`), a Solana cluster
/// with a token, the router, the API keys file and telemetry with a header.
fn every_section() -> String {
    format!(
        "{BASE}
[chains.solana-devnet]
rpc_urls = [\"https://devnet.example\"]
[router]
chains = [\"chainX\"]
[auth]
api_keys_file = \"api-keys.toml\"
[telemetry]
otlp_endpoint = \"http://127.0.0.1:4318\"
otlp_headers = {{ x-api-key = \"k\" }}
"
    )
}

/// The key paths of the schema, with map keys written as the reference writes them: an EVM
/// chain `<name>`, a Solana cluster `<cluster>`, a token `<symbol>`. The settings keep the
/// Solana clusters apart from the EVM chains (`solana_chains`); the file has both under `chains`.
fn schema_keys() -> BTreeSet<String> {
    let settings = load("reference.toml", &every_section()).expect("the sample loads");
    let mut value = serde_json::to_value(&settings).expect("settings serialize");
    let clusters = value
        .as_object_mut()
        .and_then(|root| root.remove("solana_chains"))
        .expect("the sample has a Solana cluster");
    let mut keys = BTreeSet::new();
    collect(&value, &mut Vec::new(), &mut keys);
    for cluster in clusters.as_object().into_iter().flat_map(|c| c.values()) {
        collect(
            cluster,
            &mut vec!["chains".into(), "<cluster>".into()],
            &mut keys,
        );
    }
    keys
}

fn collect(value: &Value, path: &mut Vec<String>, keys: &mut BTreeSet<String>) {
    let Value::Object(table) = value else {
        keys.insert(path.join("."));
        return;
    };
    for (key, child) in table {
        let written = match path.last().map(String::as_str) {
            Some("chains") => "<name>",
            Some("tokens") => "<symbol>",
            Some("otlp_headers") => "<header>",
            _ => key,
        };
        path.push(written.to_string());
        collect(child, path, keys);
        path.pop();
    }
}

/// The first column of the reference's tables: a key in backticks.
fn documented_keys() -> BTreeSet<String> {
    let text = std::fs::read_to_string(REFERENCE).expect("docs/configuration.md is readable");
    text.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`'))
        .map(|(key, _)| key.to_string())
        .collect()
}

#[test]
fn the_reference_lists_every_key_of_the_schema_and_no_other() {
    let schema = schema_keys();
    let documented = documented_keys();
    let undocumented: Vec<_> = schema.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&schema).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/configuration.md lacks {undocumented:?}; it lists keys the schema does not read: {unknown:?}"
    );
}

#[test]
fn the_walk_sees_nested_and_unset_keys() {
    let keys = schema_keys();
    for key in [
        "server.ops_listen",
        "chains.<name>.tokens.<symbol>.transfer_methods",
        "chains.<cluster>.tokens.<symbol>.mint",
        "facilitator.svm_fee_payer_key_file",
        "auth.api_keys_file",
    ] {
        assert!(keys.contains(key), "{key} not in {keys:?}");
    }
    assert!(!keys.iter().any(|k| k.starts_with("solana_chains")));
}
