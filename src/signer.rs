//! Signer keys: loaded from a file, the environment, or systemd credentials; used only through
//! `sign_hash`. Beside them, the `batch-settlement` receiver authorizer's key, from its own file.
//! The key material never reaches a log, an error or a `Debug` rendering.

use std::path::{Path, PathBuf};

use ethers_core::types::transaction::eip2718::TypedTransaction;
use ethers_core::types::{
    Address, Bytes, Eip1559TransactionRequest, Signature, TransactionRequest, H256, U256,
};
use ethers_core::utils::{keccak256, secret_key_to_address};
use k256::ecdsa::SigningKey;

use crate::evm::{hex_decode, TxFees};

pub const ENV_KEY: &str = "ROUTERD_SIGNER_KEY";
const CREDENTIAL_NAME: &str = "signer-key";

#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    #[error("facilitator.signer_key_file: cannot read {path}: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("{source_name}: entry {index} is not a 32-byte 0x-hex private key")]
    Malformed { source_name: String, index: usize },
    #[error("no signer key: set facilitator.signer_key_file, {ENV_KEY}, or a systemd credential named {CREDENTIAL_NAME}")]
    Missing,
}

pub struct Signer {
    key: SigningKey,
    pub address: Address,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// A 32-byte private key written in hex, `0x` optional.
fn key_from_hex(text: &str) -> Option<SigningKey> {
    let text = text.trim();
    let digits = text.strip_prefix("0x").unwrap_or(text);
    if digits.len() != 64 {
        return None;
    }
    let bytes = hex_decode(&format!("0x{digits}"))?;
    SigningKey::from_slice(&bytes).ok()
}

/// An Ethereum signature (`v` = 27/28) by `key` over a 32-byte hash.
fn sign_prehash(key: &SigningKey, hash: H256) -> Signature {
    let (signature, recovery) = key
        .sign_prehash_recoverable(hash.as_bytes())
        .expect("signing a 32-byte prehash cannot fail");
    let bytes = signature.to_bytes();
    Signature {
        r: U256::from_big_endian(&bytes[..32]),
        s: U256::from_big_endian(&bytes[32..]),
        v: 27 + recovery.to_byte() as u64,
    }
}

impl Signer {
    pub fn from_hex(text: &str) -> Option<Self> {
        let key = key_from_hex(text)?;
        let address = secret_key_to_address(&key);
        Some(Self { key, address })
    }

    /// An Ethereum signature (`v` = 27/28) over a 32-byte hash.
    pub fn sign_hash(&self, hash: H256) -> Signature {
        sign_prehash(&self.key, hash)
    }

    /// Signs a transaction to `to` with `fees`; answers its hash and the raw bytes to broadcast.
    pub fn sign_transaction(&self, tx: &UnsignedTx) -> (H256, Bytes) {
        // The fee fields decide the type; everything else is common to both.
        let mut request: TypedTransaction = match tx.fees {
            TxFees::Eip1559 {
                max_fee,
                priority_fee,
            } => Eip1559TransactionRequest::new()
                .max_fee_per_gas(max_fee)
                .max_priority_fee_per_gas(priority_fee)
                .into(),
            TxFees::Legacy { gas_price } => TransactionRequest::new().gas_price(gas_price).into(),
        };
        request
            .set_from(self.address)
            .set_to(tx.to)
            .set_data(tx.data.clone())
            .set_gas(tx.gas_limit)
            .set_nonce(tx.nonce)
            .set_chain_id(tx.chain_id);
        let mut signature = self.sign_hash(request.sighash());
        let parity = signature.v - 27;
        signature.v = match tx.fees {
            // EIP-155: v carries the chain id for legacy transactions.
            TxFees::Legacy { .. } => parity + 35 + 2 * tx.chain_id,
            TxFees::Eip1559 { .. } => parity,
        };
        let raw = request.rlp_signed(&signature);
        (H256(keccak256(&raw)), raw)
    }
}

/// The `batch-settlement` receiver authorizer (`facilitator.receiver_authorizer_key_file`): the
/// key that signs EIP-712 claim and refund authorizations. It is no signer: it never signs a
/// transaction, pays no gas and has no lane, so it is kept apart from the signers' keys.
pub struct Authorizer {
    key: SigningKey,
    address: Address,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Authorizer {
    fn from_hex(text: &str) -> Option<Self> {
        let key = key_from_hex(text)?;
        let address = secret_key_to_address(&key);
        Some(Self { key, address })
    }

    pub fn address(&self) -> Address {
        self.address
    }

    /// The 65-byte signature over an EIP-712 digest, as contracts take it: r, s, then v (27/28).
    pub fn sign_hash(&self, hash: H256) -> [u8; 65] {
        sign_prehash(&self.key, hash).into()
    }
}

const AUTHORIZER_KEY: &str = "facilitator.receiver_authorizer_key_file";

/// Why the receiver authorizer's key file cannot be used; never its content.
#[derive(Debug, thiserror::Error)]
pub enum AuthorizerError {
    #[error("{AUTHORIZER_KEY}: cannot read {path}: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("{AUTHORIZER_KEY}: {path} does not hold one 32-byte 0x-hex private key on one line")]
    Malformed { path: String },
}

/// The receiver authorizer of `facilitator.receiver_authorizer_key_file`; `None` when the key is
/// empty. The file holds one key on one line (blank lines and `#` comments aside).
pub fn load_authorizer(key_file: &str) -> Result<Option<Authorizer>, AuthorizerError> {
    if key_file.is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(key_file).map_err(|e| AuthorizerError::Unreadable {
        path: key_file.to_string(),
        reason: e.kind().to_string(),
    })?;
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'));
    let malformed = || AuthorizerError::Malformed {
        path: key_file.to_string(),
    };
    let (Some(line), None) = (lines.next(), lines.next()) else {
        return Err(malformed());
    };
    Authorizer::from_hex(line).map(Some).ok_or_else(malformed)
}

/// A contract call ready to be signed.
pub struct UnsignedTx {
    pub chain_id: u64,
    pub nonce: u64,
    pub to: Address,
    pub data: Bytes,
    pub gas_limit: u64,
    pub fees: TxFees,
}

/// Keys in this order of precedence: the configured file, `ROUTERD_SIGNER_KEY`
/// (comma-separated), then `$CREDENTIALS_DIRECTORY/signer-key`.
pub fn load_signers(key_file: &str) -> Result<Vec<Signer>, SignerError> {
    if !key_file.is_empty() {
        return read_key_file(Path::new(key_file), "facilitator.signer_key_file");
    }
    if let Ok(text) = std::env::var(ENV_KEY) {
        return parse_keys(text.split(','), ENV_KEY);
    }
    if let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY") {
        let path = PathBuf::from(dir).join(CREDENTIAL_NAME);
        if path.exists() {
            return read_key_file(&path, "systemd credential signer-key");
        }
    }
    Err(SignerError::Missing)
}

fn read_key_file(path: &Path, source_name: &str) -> Result<Vec<Signer>, SignerError> {
    let text = std::fs::read_to_string(path).map_err(|e| SignerError::Unreadable {
        path: path.display().to_string(),
        reason: e.kind().to_string(),
    })?;
    parse_keys(text.lines(), source_name)
}

fn parse_keys<'a>(
    entries: impl Iterator<Item = &'a str>,
    source_name: &str,
) -> Result<Vec<Signer>, SignerError> {
    let signers = entries
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .enumerate()
        .map(|(index, line)| {
            Signer::from_hex(line).ok_or(SignerError::Malformed {
                source_name: source_name.to_string(),
                index: index + 1,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if signers.is_empty() {
        return Err(SignerError::Missing);
    }
    Ok(signers)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::ANVIL_KEY_0 as DEV_KEY;

    #[test]
    fn derives_the_address() {
        let signer = Signer::from_hex(DEV_KEY).unwrap();
        assert_eq!(
            format!("{:?}", signer.address),
            "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"
        );
    }

    #[test]
    fn signature_recovers_to_the_signer() {
        let signer = Signer::from_hex(DEV_KEY).unwrap();
        let hash = H256(keccak256(b"routerd"));
        let signature = signer.sign_hash(hash);
        assert_eq!(signature.recover(hash).unwrap(), signer.address);
    }

    #[test]
    fn signed_transactions_recover_to_the_signer() {
        use ethers_core::types::Transaction;
        let signer = Signer::from_hex(DEV_KEY).unwrap();
        for fees in [
            TxFees::Eip1559 {
                max_fee: 15.into(),
                priority_fee: 1.into(),
            },
            TxFees::Legacy {
                gas_price: 9.into(),
            },
        ] {
            let tx = UnsignedTx {
                chain_id: 84532,
                nonce: 3,
                to: Address::repeat_byte(1),
                data: vec![1, 2].into(),
                gas_limit: 90_000,
                fees,
            };
            let (hash, raw) = signer.sign_transaction(&tx);
            let decoded: Transaction = ethers_core::utils::rlp::decode(&raw).unwrap();
            assert_eq!(decoded.hash, hash);
            assert_eq!(decoded.recover_from().unwrap(), signer.address);
            assert_eq!(decoded.nonce, 3.into());
        }
    }

    /// Anvil's second key: not the signers' key, as an authorizer is not a signer.
    const AUTHORIZER_KEY_HEX: &str =
        "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";

    fn key_file(name: &str, text: &str) -> String {
        let dir = std::env::temp_dir().join(format!("routerd-signer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    #[test]
    fn the_authorizer_signature_recovers_to_its_address() {
        let path = key_file("authorizer.key", &format!("{AUTHORIZER_KEY_HEX}\n"));
        let authorizer = load_authorizer(&path).unwrap().unwrap();
        assert_eq!(
            format!("{:?}", authorizer.address()),
            "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"
        );
        let hash = H256(keccak256(b"claim"));
        let bytes = authorizer.sign_hash(hash);
        assert!(matches!(bytes[64], 27 | 28), "v is {}", bytes[64]);
        let signature = Signature::try_from(&bytes[..]).unwrap();
        assert_eq!(signature.recover(hash).unwrap(), authorizer.address());
    }

    #[test]
    fn no_authorizer_without_a_key_file_and_bad_files_name_the_key_never_the_content() {
        assert!(load_authorizer("").unwrap().is_none());
        let missing = load_authorizer("/nonexistent/authorizer.key").unwrap_err();
        assert!(matches!(missing, AuthorizerError::Unreadable { .. }));
        assert!(missing.to_string().starts_with(AUTHORIZER_KEY), "{missing}");
        let secret = &AUTHORIZER_KEY_HEX[2..];
        for (name, text) in [
            ("short.key", "0x59c6995e998f97a5\n".to_string()),
            ("two.key", format!("{AUTHORIZER_KEY_HEX}\n{DEV_KEY}\n")),
            ("empty.key", "# no key\n".to_string()),
            ("bad.key", format!("{}zz\n", &AUTHORIZER_KEY_HEX[..64])),
        ] {
            let err = load_authorizer(&key_file(name, &text)).unwrap_err();
            assert!(matches!(err, AuthorizerError::Malformed { .. }), "{name}");
            let shown = format!("{err} {err:?}");
            assert!(shown.starts_with(AUTHORIZER_KEY), "{shown}");
            assert!(!shown.contains(&secret[..16]), "{shown}");
        }
        let path = key_file(
            "commented.key",
            &format!("# routerd\n\n{AUTHORIZER_KEY_HEX}\n"),
        );
        let authorizer = load_authorizer(&path).unwrap().unwrap();
        let debug = format!("{authorizer:?}");
        assert!(
            debug.contains("0x70997970c51812dc3a010c7d01b50e0d17dc79c8"),
            "{debug}"
        );
        assert!(!debug.contains(&secret[..16]), "{debug}");
    }

    #[test]
    fn debug_and_errors_never_show_the_key() {
        let signer = Signer::from_hex(DEV_KEY).unwrap();
        assert!(!format!("{signer:?}").contains("ac0974"));
        let err = parse_keys(["0x1234", DEV_KEY].into_iter(), "test").unwrap_err();
        assert!(!err.to_string().contains("ac0974"));
        assert!(err.to_string().contains("entry 1"));
    }
}
