//! Signer keys: loaded from a file, the environment, or systemd credentials; used only through
//! `sign_hash`. The key material never reaches a log, an error or a `Debug` rendering.

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

impl Signer {
    pub fn from_hex(text: &str) -> Option<Self> {
        let text = text.trim();
        let digits = text.strip_prefix("0x").unwrap_or(text);
        if digits.len() != 64 {
            return None;
        }
        let bytes = hex_decode(&format!("0x{digits}"))?;
        let key = SigningKey::from_slice(&bytes).ok()?;
        let address = secret_key_to_address(&key);
        Some(Self { key, address })
    }

    /// An Ethereum signature (`v` = 27/28) over a 32-byte hash.
    pub fn sign_hash(&self, hash: H256) -> Signature {
        let (signature, recovery) = self
            .key
            .sign_prehash_recoverable(hash.as_bytes())
            .expect("signing a 32-byte prehash cannot fail");
        let bytes = signature.to_bytes();
        Signature {
            r: U256::from_big_endian(&bytes[..32]),
            s: U256::from_big_endian(&bytes[32..]),
            v: 27 + recovery.to_byte() as u64,
        }
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

    #[test]
    fn debug_and_errors_never_show_the_key() {
        let signer = Signer::from_hex(DEV_KEY).unwrap();
        assert!(!format!("{signer:?}").contains("ac0974"));
        let err = parse_keys(["0x1234", DEV_KEY].into_iter(), "test").unwrap_err();
        assert!(!err.to_string().contains("ac0974"));
        assert!(err.to_string().contains("entry 1"));
    }
}
