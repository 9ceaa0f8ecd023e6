//! `ConfigError`, the one error of loading, and the reading of the `config` crate's errors so that
//! each names its key too.

/// A configuration problem, always naming the key at fault.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl ConfigError {
    pub(super) fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }

    /// A file that cannot be read or parsed, or a value serde refuses (wrong type, unknown key):
    /// named by the key the `config` crate's message mentions.
    pub(super) fn loading(error: &config::ConfigError) -> Self {
        Self::new(config_error_key(error), error.to_string())
    }
}

/// Pulls the key out of a `config` error so the exit message names it (`server.bogus` for an
/// unknown field `bogus` in `[server]`).
fn config_error_key(error: &config::ConfigError) -> String {
    let text = error.to_string();
    if let (Some(field), Some(parent)) = (
        between(&text, "unknown field `", "`"),
        between(&text, "for key `", "`"),
    ) {
        return format!("{parent}.{field}");
    }
    for marker in ["for key `", "key `"] {
        if let Some(start) = text.find(marker) {
            let rest = &text[start + marker.len()..];
            if let Some(end) = rest.find('`') {
                return rest[..end].to_string();
            }
        }
    }
    if let Some(start) = text.find("unknown field `") {
        let rest = &text[start + "unknown field `".len()..];
        if let Some(end) = rest.find('`') {
            return rest[..end].to_string();
        }
    }
    "config".to_string()
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let rest = &text[text.find(start)? + start.len()..];
    Some(&rest[..rest.find(end)?])
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use crate::config::testing::{temp_dir, write, BASE};
    use crate::config::Settings;

    #[test]
    fn unknown_key_is_named() {
        let dir = temp_dir();
        let path = write(
            &dir,
            "unknown.toml",
            &format!("{BASE}\n[storage]\npth = \"x\"\n"),
        );
        let err = Settings::load_from(&[path], &HashMap::new()).unwrap_err();
        assert_eq!(err.key, "storage.pth", "{err}");
    }
}
