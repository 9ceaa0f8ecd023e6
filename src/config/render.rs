//! The effective configuration as TOML, for `check-config`. Values go through their `Serialize`
//! impls, so secrets and RPC URLs come out redacted (see `redacted`). A known network's chain says
//! so, and each of its preset values says where it came from (`# preset`, `# file`,
//! `# environment`), as does each `batch-settlement` contract while that scheme is on.

use serde_json::Value;

use super::presets::SOURCES;
use super::resolve::Provenance;
use super::Settings;

impl Settings {
    /// The effective configuration as TOML. Secrets (the database URL) show as `<redacted>`;
    /// signer keys live in files, so only their paths are shown.
    pub fn render(&self) -> String {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if !self
            .facilitator
            .as_ref()
            .is_some_and(|f| f.batch_settlement)
        {
            hide_contracts(&mut value);
        }
        show_solana_chains_under_chains(&mut value);
        let mut out = String::new();
        render_table(&mut out, &[], &value, &self.provenance);
        out
    }
}

/// Minimal TOML writer for the effective config: scalars and arrays first, then sub-tables.
fn render_table(out: &mut String, path: &[&str], value: &Value, provenance: &Provenance) {
    let Some(map) = value.as_object() else { return };
    let has_scalars = map.values().any(|v| !v.is_object() && !v.is_null());
    if !path.is_empty() && has_scalars {
        out.push('\n');
        if let ["chains", key] = path {
            known_network_note(out, key, provenance);
        }
        let header: Vec<String> = path.iter().map(|k| toml_key(k)).collect();
        out.push_str(&format!("[{}]\n", header.join(".")));
    }
    for (key, v) in map {
        if v.is_object() || v.is_null() {
            continue;
        }
        out.push_str(&format!("{} = {v}", toml_key(key)));
        if let Some(origin) = provenance.origin(&[path, &[key.as_str()]].concat()) {
            out.push_str(&format!("  # {}", origin.as_str()));
        }
        out.push('\n');
    }
    if let ["chains", key] = path {
        if provenance.solana_preset(key).is_none() {
            derived_cap_note(out, map);
        }
    }
    for (key, v) in map {
        if v.is_object() {
            render_table(out, &[path, &[key.as_str()]].concat(), v, provenance);
        }
    }
}

/// `[chains.<name>.contracts]` is read by the `batch-settlement` scheme only: without it, the
/// presets every chain has would be noise.
fn hide_contracts(value: &mut Value) {
    let chains = value.get_mut("chains").and_then(Value::as_object_mut);
    for chain in chains.into_iter().flat_map(|c| c.values_mut()) {
        if let Some(chain) = chain.as_object_mut() {
            chain.remove("contracts");
        }
    }
}

/// The file writes Solana clusters under `[chains.*]`; so does `check-config`.
fn show_solana_chains_under_chains(value: &mut Value) {
    let Some(settings) = value.as_object_mut() else {
        return;
    };
    let Some(Value::Object(solana)) = settings.remove("solana_chains") else {
        return;
    };
    if let Some(Value::Object(chains)) = settings.get_mut("chains") {
        chains.extend(solana);
    }
}

/// A comment above a known network's chain: which network, and what `# preset` means.
fn known_network_note(out: &mut String, key: &str, provenance: &Provenance) {
    if let Some(cluster) = provenance.solana_preset(key) {
        out.push_str(&format!(
            "# {key}: a known Solana network ({}); values marked preset are routerd's (@x402/svm 2.27.0)\n",
            cluster.caip2()
        ));
        return;
    }
    let Some(preset) = provenance.preset(key) else {
        return;
    };
    let written = provenance
        .written_as(key)
        .map(|_| ", the key the configuration gives it".to_string())
        .unwrap_or_default();
    out.push_str(&format!(
        "# {key}: a known network ({}{written}); values marked preset are routerd's ({SOURCES})\n",
        preset.caip2()
    ));
}

/// A chain with no `max_fee_per_gas` from the files, the environment or a preset still has one
/// (access.md §2): it is derived when the daemon starts, from the fees of the chain's recent
/// blocks, which `check-config` does not ask for.
fn derived_cap_note(out: &mut String, chain: &serde_json::Map<String, Value>) {
    if chain.get("max_fee_per_gas").is_none_or(Value::is_null) {
        out.push_str(
            "# max_fee_per_gas: derived at start from the fees of the chain's recent blocks\n",
        );
    }
}

fn toml_key(key: &str) -> String {
    if key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        key.to_string()
    } else {
        format!("{key:?}")
    }
}
