//! The effective configuration as TOML, for `check-config`. Values go through their `Serialize`
//! impls, so secrets and RPC URLs come out redacted (see `redacted`).

use super::Settings;

impl Settings {
    /// The effective configuration as TOML. Secrets (the database URL) show as `<redacted>`;
    /// signer keys live in files, so only their paths are shown.
    pub fn render(&self) -> String {
        toml_render(self)
    }
}

fn toml_render(settings: &Settings) -> String {
    let value = serde_json::to_value(settings).unwrap_or_default();
    let mut out = String::new();
    render_table(&mut out, "", &value);
    out
}

/// Minimal TOML writer for the effective config: scalars and arrays first, then sub-tables.
fn render_table(out: &mut String, prefix: &str, value: &serde_json::Value) {
    let Some(map) = value.as_object() else { return };
    let has_scalars = map.values().any(|v| !v.is_object() && !v.is_null());
    if !prefix.is_empty() && has_scalars {
        out.push_str(&format!("\n[{prefix}]\n"));
    }
    for (key, v) in map {
        if v.is_object() || v.is_null() {
            continue;
        }
        out.push_str(&format!("{} = {}\n", toml_key(key), v));
    }
    for (key, v) in map {
        if v.is_object() {
            let sub = if prefix.is_empty() {
                toml_key(key)
            } else {
                format!("{prefix}.{}", toml_key(key))
            };
            render_table(out, &sub, v);
        }
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
