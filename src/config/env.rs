//! Where values come from, in order: the TOML files (later files win), then `ROUTERD__…`
//! environment variables, then the credential files systemd hands over in
//! `$CREDENTIALS_DIRECTORY` for what neither set.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use config::{Config, File, FileFormat, Map, Source, Value, ValueKind};

use super::presets::{self, Preset};
use super::resolve::{self, Origin};
use super::{AuthSettings, ConfigError, Secret, Settings, StorageBackend, StorageSettings};

/// The prefix of environment overrides: `ROUTERD__SECTION__KEY` sets `section.key`.
pub const ENV_PREFIX: &str = "ROUTERD";

/// The files of `paths` in order (later files win), with the `ROUTERD__…` variables of `env`
/// over them and the known networks' presets under both; not yet validated.
pub(super) fn read_layers(
    paths: &[PathBuf],
    env: &HashMap<String, String>,
) -> Result<Settings, ConfigError> {
    let mut builder = Config::builder();
    for path in paths {
        builder =
            builder.add_source(File::new(&path.to_string_lossy(), FileFormat::Toml).required(true));
    }
    let mut tree = builder
        .build()
        .and_then(|files| files.collect())
        .map_err(|e| ConfigError::loading(&e))?;
    let overrides = env_overrides(&tree, env)?;
    let from_env: Vec<Vec<String>> = overrides.iter().map(|(path, _)| path.clone()).collect();
    for (path, value) in overrides {
        set_path(&mut tree, &path, value);
    }
    let provenance = resolve::apply(&mut tree, &from_env)?;
    let mut settings: Settings = Value::new(None, ValueKind::Table(tree))
        .try_deserialize()
        .map_err(|e| provenance.in_written_terms(ConfigError::loading(&e)))?;
    for (name, chain) in settings.chains.iter_mut() {
        let origin = provenance.origin(&["chains", name, "max_fee_per_gas"]);
        chain.max_fee_per_gas_is_preset = origin == Some(Origin::Preset);
    }
    settings.provenance = provenance;
    Ok(settings)
}

/// Sets `value` at `path` in `tree`, making the tables on the way (a value in the way becomes a
/// table). The path is applied as segments, not parsed: a chain keyed by a CAIP-2 id
/// (`eip155:84532`) has a `:` that the `config` crate's key expressions do not allow.
fn set_path(tree: &mut Map<String, Value>, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut level = tree;
    for key in parents {
        let entry = level
            .entry(key.clone())
            .or_insert_with(|| Value::new(None, ValueKind::Table(Map::new())));
        if !matches!(entry.kind, ValueKind::Table(_)) {
            entry.kind = ValueKind::Table(Map::new());
        }
        let ValueKind::Table(next) = &mut entry.kind else {
            return;
        };
        level = next;
    }
    level.insert(last.clone(), value);
}

/// `config` lowercases environment keys, while network names in files keep their case
/// (`chainX`). Each `ROUTERD__A__B` variable is matched segment by segment, ignoring case and
/// reading `_` for `-`, against the keys the files define, so `ROUTERD__CHAINS__CHAINX__RPC_URLS`
/// reaches `[chains.chainX]`. A value for a list key is split on commas.
fn env_overrides(
    file_tree: &Map<String, Value>,
    env: &HashMap<String, String>,
) -> Result<Vec<(Vec<String>, Value)>, ConfigError> {
    let prefix = format!("{ENV_PREFIX}__");
    let mut overrides = Vec::new();
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let segments: Vec<String> = rest.split("__").map(str::to_lowercase).collect();
        if segments.iter().any(String::is_empty) {
            return Err(ConfigError::new(name.clone(), "empty key segment"));
        }
        let (path, existing) = resolve_case_insensitive(file_tree, &segments);
        let value = if is_list_key(&path, existing) {
            let items: Vec<Value> = raw
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::new(None, s.to_string()))
                .collect();
            Value::new(None, ValueKind::Array(items))
        } else {
            Value::new(None, raw.clone())
        };
        overrides.push((path, value));
    }
    overrides.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(overrides)
}

/// How a key compares with an environment variable's segment: case aside, and `-` and `:` written
/// as `_` (systemd and shells allow neither in variable names: `chainX-testnet` is
/// `CHAINX_TESTNET`, `eip155:84532` is `EIP155_84532`).
fn env_segment(key: &str) -> String {
    key.to_lowercase().replace(['-', ':'], "_")
}

fn resolve_case_insensitive<'a>(
    tree: &'a Map<String, Value>,
    segments: &[String],
) -> (Vec<String>, Option<&'a Value>) {
    let mut path: Vec<String> = Vec::with_capacity(segments.len());
    let mut level = Some(tree);
    let mut found = None;
    for segment in segments {
        let hit = level.and_then(|map| map.iter().find(|(k, _)| same_key(&path, k, segment)));
        match hit {
            Some((key, value)) => {
                path.push(key.clone());
                found = Some(value);
                level = match &value.kind {
                    ValueKind::Table(inner) => Some(inner),
                    _ => None,
                };
            }
            None => {
                path.push(preset_key(&path, segment).unwrap_or_else(|| segment.clone()));
                found = None;
                level = None;
            }
        }
    }
    (path, found)
}

/// Whether the files' `key` under `parent` is what an environment segment names: the same name
/// as `env_segment` compares them; under `chains`, a known network's v1 name and its CAIP-2 id
/// are one name (`BASE_SEPOLIA` reaches `[chains."eip155:84532"]`).
fn same_key(parent: &[String], key: &str, segment: &str) -> bool {
    env_segment(key) == env_segment(segment)
        || (parent == ["chains"]
            && matches!(
                (presets::find(key), known_network(segment)),
                (Some(a), Some(b)) if a.name == b.name
            ))
}

/// The key a known network gives a segment the files do not have: its v1 name under `chains`
/// (`BASE_SEPOLIA`, `EIP155_84532`), its token's symbol under its `tokens` (`USDC`), so that the
/// environment alone can configure a known network or override its preset.
fn preset_key(parent: &[String], segment: &str) -> Option<String> {
    match parent {
        [chains] if chains == "chains" => known_network(segment).map(|p| p.name.to_string()),
        [chains, key, tokens] if chains == "chains" && tokens == "tokens" => {
            let token = presets::find(key)?.token.as_ref()?;
            (env_segment(token.symbol) == env_segment(segment)).then(|| token.symbol.to_string())
        }
        _ => None,
    }
}

/// The known network an environment segment names, by its v1 name or its CAIP-2 id.
fn known_network(segment: &str) -> Option<&'static Preset> {
    let wanted = env_segment(segment);
    presets::PRESETS
        .iter()
        .find(|p| env_segment(p.name) == wanted || env_segment(&p.caip2()) == wanted)
}

const LIST_KEYS: &[&str] = &["rpc_urls", "networks", "chains", "prefer"];

fn is_list_key(path: &[String], existing: Option<&Value>) -> bool {
    matches!(existing.map(|v| &v.kind), Some(ValueKind::Array(_)))
        || path
            .last()
            .is_some_and(|last| LIST_KEYS.contains(&last.as_str()) && path.len() >= 2)
}

impl AuthSettings {
    /// The credential systemd hands over (`LoadCredential=api-keys:...`), when no file is set.
    pub(super) fn resolve_file(&mut self, env: &HashMap<String, String>) {
        if self.api_keys_file.is_some() {
            return;
        }
        let Some(dir) = env.get("CREDENTIALS_DIRECTORY") else {
            return;
        };
        let file = Path::new(dir).join("api-keys");
        if file.exists() {
            self.api_keys_file = Some(file);
        }
    }
}

impl StorageSettings {
    /// The credential file systemd hands over (`LoadCredential=postgres-url:...`), when the URL
    /// is not in the files or the environment.
    pub(super) fn resolve_url(&mut self, env: &HashMap<String, String>) -> Result<(), ConfigError> {
        if self.backend != StorageBackend::Postgres || self.postgres_url.is_some() {
            return Ok(());
        }
        let Some(dir) = env.get("CREDENTIALS_DIRECTORY") else {
            return Ok(());
        };
        let file = Path::new(dir).join("postgres-url");
        match std::fs::read_to_string(&file) {
            Ok(url) => self.postgres_url = Some(Secret(url.trim().to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ConfigError::new(
                    "storage.postgres_url",
                    format!("cannot read {}: {e}", file.display()),
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use crate::config::testing::{load, temp_dir, write, BASE};
    use crate::config::{Endpoint, Settings, StorageBackend};

    #[test]
    fn env_override_reaches_mixed_case_network() {
        let dir = temp_dir();
        let path = write(&dir, "a.toml", BASE);
        let env = HashMap::from([(
            "ROUTERD__CHAINS__CHAINX__RPC_URLS".to_string(),
            "http://a:1, http://b:2".to_string(),
        )]);
        let settings = Settings::load_from(&[path], &env).unwrap();
        let urls: Vec<&str> = settings.chains["chainX"]
            .rpc_urls
            .iter()
            .map(Endpoint::expose)
            .collect();
        assert_eq!(urls, vec!["http://a:1", "http://b:2"]);
    }

    #[test]
    fn env_override_reaches_dashed_network_with_underscores() {
        let dir = temp_dir();
        let body = BASE
            .replace("chains.chainX", "chains.chainX-testnet")
            .replace("[\"chainX\"]", "[\"chainX-testnet\"]");
        let path = write(&dir, "dashed.toml", &body);
        let env = HashMap::from([(
            "ROUTERD__CHAINS__CHAINX_TESTNET__RPC_URLS".to_string(),
            "http://c:3".to_string(),
        )]);
        let settings = Settings::load_from(&[path], &env).unwrap();
        assert_eq!(
            settings.chains["chainX-testnet"].rpc_urls[0].expose(),
            "http://c:3"
        );
    }

    #[test]
    fn later_file_overrides_earlier() {
        let dir = temp_dir();
        let a = write(&dir, "base.toml", BASE);
        let b = write(&dir, "over.toml", "[server]\nlisten = \"127.0.0.1:9100\"\n");
        let settings = Settings::load_from(&[a, b], &HashMap::new()).unwrap();
        assert_eq!(settings.server.listen.port(), 9100);
    }

    #[test]
    fn storage_keys_default_read_the_credential_file_and_never_show_the_url() {
        let dir = temp_dir();
        let settings = load("storage-defaults.toml", BASE).unwrap();
        assert_eq!(settings.storage.backend, StorageBackend::Sled);
        assert_eq!(settings.storage.lease_ttl_secs, 10);
        assert!(settings
            .storage
            .instance_id
            .ends_with(&format!("-{}", std::process::id())));
        let body = format!("[storage]\nbackend = \"postgres\"\n{BASE}");
        let path = write(&dir, "storage-pg.toml", &body);
        let err = Settings::load_from(std::slice::from_ref(&path), &HashMap::new()).unwrap_err();
        assert_eq!(err.key, "storage.postgres_url");
        let url = "postgres://routerd:s3cret-pw@db.internal:5433/routerd";
        let credentials = dir.join("credentials");
        std::fs::create_dir_all(&credentials).unwrap();
        std::fs::write(credentials.join("postgres-url"), format!("{url}\n")).unwrap();
        let env = HashMap::from([(
            "CREDENTIALS_DIRECTORY".to_string(),
            credentials.display().to_string(),
        )]);
        let settings = Settings::load_from(std::slice::from_ref(&path), &env).unwrap();
        assert_eq!(
            settings.storage.postgres_url.as_ref().unwrap().expose(),
            url
        );
        assert!(
            !settings.render().contains("s3cret"),
            "{}",
            settings.render()
        );
        assert!(!format!("{settings:?}").contains("s3cret"));
        // The environment wins over the credential file.
        let env = HashMap::from([(
            "ROUTERD__STORAGE__POSTGRES_URL".to_string(),
            "postgres://other@h/db".to_string(),
        )]);
        let settings = Settings::load_from(std::slice::from_ref(&path), &env).unwrap();
        assert_eq!(
            settings.storage.postgres_url.unwrap().expose(),
            "postgres://other@h/db"
        );
        for (line, key) in [
            ("postgres_url = \"not a url\"", "storage.postgres_url"),
            (
                "postgres_url = \"postgres://a@h/d\"\nlease_ttl_secs = 0",
                "storage.lease_ttl_secs",
            ),
            (
                "postgres_url = \"postgres://a@h/d\"\ninstance_id = \" \"",
                "storage.instance_id",
            ),
        ] {
            let body = format!("[storage]\nbackend = \"postgres\"\n{line}\n{BASE}");
            let err = load("storage-bad.toml", &body).unwrap_err();
            assert_eq!(err.key, key, "{line}");
            assert!(!err.to_string().contains("not a url"), "{err}");
        }
    }
}
