//! Typed settings: layered TOML files, `ROUTERD__SECTION__KEY` environment overrides, validation
//! that names the bad key, and a redacted rendering for `check-config`.
//!
//! What holds throughout: [`Settings::load`] and [`Settings::load_from`] return settings only once
//! every check has passed, and every [`ConfigError`] names the key at fault; a [`Secret`] or an
//! [`Endpoint`] is never shown in full, neither in `Debug` nor in [`Settings::render`]. This
//! module depends on no other routerd module.
//!
//! - `schema`: the settings structs and enums, their serde attributes and defaults;
//! - `redacted`: [`Secret`] and [`Endpoint`], the values shown redacted;
//! - `env`: the layered sources (files, then the environment, then systemd credentials);
//! - `batch`: `[chains.<name>.contracts]`, the `batch-settlement` contracts, preset on every chain;
//! - `presets`: the known networks (x402's network names, their chain ids and default tokens);
//! - `solana`: the known Solana clusters, a Solana chain's settings and their checks;
//! - `telemetry`: `[telemetry]`, where OpenTelemetry traces go, and its checks;
//! - `resolve`: the known networks applied to the layered sources, and where each value came from;
//! - `validate`: the checks of each section;
//! - `error`: [`ConfigError`], and the key read out of the `config` crate's errors;
//! - `render`: the effective configuration as TOML, for `check-config`.
//! - `reference` (tests): `docs/configuration.md` lists every key of the schema and no other.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

mod batch;
mod env;
mod error;
mod presets;
mod redacted;
#[cfg(test)]
mod reference;
mod render;
mod resolve;
mod schema;
mod solana;
mod telemetry;
#[cfg(test)]
mod testing;
mod validate;

pub use batch::{BatchContract, BatchContracts};
pub use env::ENV_PREFIX;
pub use error::ConfigError;
pub use redacted::{Endpoint, Secret};
pub use schema::{
    AuthSettings, ChainKind, ChainSettings, FacilitatorSettings, FeeModel, RouterSettings,
    ServerSettings, Settings, StorageBackend, StorageSettings, TokenSettings, TransferMethod,
    KEPT_BLOCKS,
};
pub use solana::find as solana_preset;
pub use solana::{Commitment, SolanaChainSettings, SolanaPreset, SolanaTokenSettings};
pub use telemetry::{OtlpProtocol, TelemetrySettings};

impl Settings {
    /// Loads `paths` in order (later files win), then the environment, then validates.
    pub fn load(paths: &[PathBuf]) -> Result<Self, ConfigError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        Self::load_from(paths, &env)
    }

    pub fn load_from(
        paths: &[PathBuf],
        env: &HashMap<String, String>,
    ) -> Result<Self, ConfigError> {
        let mut settings = env::read_layers(paths, env)?;
        settings.storage.resolve_url(env)?;
        settings.auth.resolve_file(env);
        settings
            .validate()
            .map_err(|e| settings.provenance.in_written_terms(e))?;
        Ok(settings)
    }
}

/// Where the default configuration lives when `--config` is not given.
pub fn default_config_path() -> &'static Path {
    Path::new("conf/default.toml")
}
