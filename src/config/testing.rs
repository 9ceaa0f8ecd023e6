//! What the tests of the `config` modules share: a base configuration and loading it from a file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{ConfigError, Settings};

pub(super) fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

pub(super) const BASE: &str = r#"
[server]
listen = "127.0.0.1:9000"
[chains.chainX]
chain_id = 1
kind = "l1"
rpc_urls = ["http://127.0.0.1:8545"]
[chains.chainX.tokens.USDC]
address = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
eip712_name = "USD Coin"
eip712_version = "2"
[facilitator]
networks = ["chainX"]
"#;

pub(super) fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "routerd-config-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `body` to `name` in this test's directory and loads it alone, without environment.
pub(super) fn load(name: &str, body: &str) -> Result<Settings, ConfigError> {
    let path = write(&temp_dir(), name, body);
    Settings::load_from(&[path], &HashMap::new())
}
