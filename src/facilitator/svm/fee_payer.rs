//! The Solana fee payer keys: solana-keygen's JSON (an array of 64 numbers, the secret then the
//! public key), from `facilitator.svm_fee_payer_key_file` (one file or a list, one key each) or
//! the systemd credential `svm-fee-payer`. A key never reaches a log, an error or a `Debug`
//! rendering: only its public key does.

use std::path::{Path, PathBuf};

use crate::svm::{Keypair, Pubkey};

const CREDENTIAL_NAME: &str = "svm-fee-payer";
const KEY_BYTES: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum FeePayerError {
    #[error("{source_name}: cannot read {path}: {reason}")]
    Unreadable {
        source_name: &'static str,
        path: String,
        reason: String,
    },
    /// Says nothing of the file's content: it is a secret, even when it is malformed.
    #[error("{source_name}: {path} is not solana-keygen's JSON array of 64 bytes of a keypair")]
    Malformed {
        source_name: &'static str,
        path: String,
    },
    #[error("no Solana fee payer key: set facilitator.svm_fee_payer_key_file, or a systemd credential named {CREDENTIAL_NAME}")]
    Missing,
    #[error("facilitator.svm_fee_payer_key_file: {0} is listed twice")]
    Duplicate(String),
}

/// routerd's fee payers, in the configured order.
pub struct FeePayers {
    keys: Vec<Keypair>,
    pubkeys: Vec<Pubkey>,
}

impl std::fmt::Debug for FeePayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeePayers")
            .field("pubkeys", &self.pubkeys)
            .finish_non_exhaustive()
    }
}

impl FeePayers {
    /// The configured files, else `$CREDENTIALS_DIRECTORY/svm-fee-payer`.
    pub fn load(files: &[String]) -> Result<Self, FeePayerError> {
        const KEY: &str = "facilitator.svm_fee_payer_key_file";
        let keys = if files.is_empty() {
            let dir = std::env::var_os("CREDENTIALS_DIRECTORY").ok_or(FeePayerError::Missing)?;
            let path = PathBuf::from(dir).join(CREDENTIAL_NAME);
            if !path.exists() {
                return Err(FeePayerError::Missing);
            }
            vec![read_key(&path, "systemd credential svm-fee-payer")?]
        } else {
            files
                .iter()
                .map(|file| read_key(Path::new(file), KEY))
                .collect::<Result<Vec<_>, _>>()?
        };
        Self::new(keys)
    }

    pub fn new(keys: Vec<Keypair>) -> Result<Self, FeePayerError> {
        use solana_signer::Signer;
        let pubkeys: Vec<Pubkey> = keys.iter().map(Signer::pubkey).collect();
        if let Some(twice) = pubkeys
            .iter()
            .enumerate()
            .find(|(i, p)| pubkeys[..*i].contains(p))
        {
            return Err(FeePayerError::Duplicate(twice.1.to_string()));
        }
        Ok(Self { keys, pubkeys })
    }

    pub fn pubkeys(&self) -> &[Pubkey] {
        &self.pubkeys
    }

    /// The key of one of routerd's fee payers.
    pub fn key(&self, pubkey: &Pubkey) -> Option<&Keypair> {
        let index = self.pubkeys.iter().position(|p| p == pubkey)?;
        Some(&self.keys[index])
    }
}

fn read_key(path: &Path, source_name: &'static str) -> Result<Keypair, FeePayerError> {
    let text = std::fs::read_to_string(path).map_err(|e| FeePayerError::Unreadable {
        source_name,
        path: path.display().to_string(),
        reason: e.kind().to_string(),
    })?;
    let malformed = || FeePayerError::Malformed {
        source_name,
        path: path.display().to_string(),
    };
    let bytes: Vec<u8> = serde_json::from_str(&text).map_err(|_| malformed())?;
    if bytes.len() != KEY_BYTES {
        return Err(malformed());
    }
    // The public half must be the secret's: a file whose halves disagree is refused here
    // rather than signing as a key nobody holds.
    Keypair::try_from(bytes.as_slice()).map_err(|_| malformed())
}

#[cfg(test)]
mod tests {
    use solana_signer::Signer;

    use super::*;

    fn temp_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("routerd-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write(dir: &Path, name: &str, text: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    #[test]
    fn keys_load_from_keygen_json_and_never_show() {
        let dir = temp_dir("fee-payer-keys");
        let key = Keypair::new();
        let json = serde_json::to_string(&key.to_bytes().to_vec()).unwrap();
        let file = write(&dir, "fee-payer.json", &json);
        let payers = FeePayers::load(std::slice::from_ref(&file)).unwrap();
        assert_eq!(payers.pubkeys(), &[key.pubkey()]);
        assert!(payers.key(&key.pubkey()).is_some());
        let shown = format!("{payers:?}");
        assert!(shown.contains(&key.pubkey().to_string()));
        assert!(!shown.contains(&json[1..20]));
        assert!(matches!(
            FeePayers::load(&[file.clone(), file]),
            Err(FeePayerError::Duplicate(_))
        ));
    }

    #[test]
    fn a_malformed_key_is_refused_without_its_content() {
        let dir = temp_dir("fee-payer-malformed");
        let mut bytes = Keypair::new().to_bytes().to_vec();
        bytes[40] ^= 1; // the public half no longer matches the secret
        let mismatched = write(&dir, "a.json", &serde_json::to_string(&bytes).unwrap());
        let short = write(&dir, "b.json", "[1,2,3]");
        for file in [mismatched, short] {
            let error = FeePayers::load(&[file]).unwrap_err().to_string();
            assert!(error.contains("is not solana-keygen's JSON"), "{error}");
            assert!(!error.contains("[1,2,3]"));
        }
    }
}
