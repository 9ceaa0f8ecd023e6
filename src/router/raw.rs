//! A signed transaction as a wallet sends it (`eth_sendRawTransaction`): decoded with
//! ethers-core, never by a parser of our own. What routerd needs of it is the chain it is for,
//! its sender and nonce (for the reservations), and its hash, which routerd computes itself so
//! that a resend is recognised whatever the node says.

use ethers_core::types::transaction::eip2718::TypedTransaction;
use ethers_core::types::{Address, Bytes, H256};
use ethers_core::utils::keccak256;
use ethers_core::utils::rlp::Rlp;

use crate::evm;

/// A decoded signed transaction of a type routerd forwards.
#[derive(Debug, Clone, PartialEq)]
pub struct SignedTx {
    /// keccak256 of the raw bytes: the hash every node reports for it.
    pub hash: H256,
    pub chain_id: u64,
    pub sender: Address,
    pub nonce: u64,
    pub raw: Bytes,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RawError {
    #[error("raw transaction: expected 0x followed by an even number of hex digits")]
    NotHex,
    #[error("raw transaction: empty")]
    Empty,
    /// EIP-2718 types other than 0x01 (EIP-2930) and 0x02 (EIP-1559), and bytes that are none.
    #[error("raw transaction: type {0:#04x} is not forwarded (legacy, EIP-2930 and EIP-1559 are)")]
    UnsupportedType(u8),
    #[error("raw transaction: malformed: {0}")]
    Malformed(String),
    /// A legacy transaction signed without EIP-155 could be replayed on every chain, and names
    /// no chain to send it to.
    #[error("raw transaction: signed without a chain id (pre-EIP-155); sign it with EIP-155")]
    NoChainId,
}

/// Decodes `hex` (`0x` + the signed transaction's bytes) and recovers its sender.
pub fn decode(hex: &str) -> Result<SignedTx, RawError> {
    let bytes = evm::hex_decode(hex)
        .filter(|_| hex.starts_with("0x"))
        .ok_or(RawError::NotHex)?;
    let first = *bytes.first().ok_or(RawError::Empty)?;
    // 0xc0 and above start an RLP list: a legacy transaction. Below 0x80, an EIP-2718 type.
    let body = match first {
        0x01 | 0x02 => &bytes[1..],
        0xc0.. => &bytes[..],
        other => return Err(RawError::UnsupportedType(other)),
    };
    whole_list(body)?;
    let (tx, signature) = TypedTransaction::decode_signed(&Rlp::new(&bytes))
        .map_err(|e| RawError::Malformed(e.to_string()))?;
    let chain_id = tx.chain_id().ok_or(RawError::NoChainId)?.as_u64();
    let sender = signature
        .recover(tx.sighash())
        .map_err(|e| RawError::Malformed(format!("signature: {e}")))?;
    let nonce = tx
        .nonce()
        .filter(|n| n.bits() <= 64)
        .ok_or_else(|| RawError::Malformed("nonce above 2^64-1".into()))?
        .as_u64();
    Ok(SignedTx {
        hash: H256(keccak256(&bytes)),
        chain_id,
        sender,
        nonce,
        raw: bytes.into(),
    })
}

/// `body` is one RLP list and nothing after it: bytes past the list would be dropped by the
/// decoder, and the hash routerd answers would not be the one the node computes.
fn whole_list(body: &[u8]) -> Result<(), RawError> {
    let rlp = Rlp::new(body);
    let info = rlp
        .payload_info()
        .map_err(|e| RawError::Malformed(e.to_string()))?;
    if !rlp.is_list() || info.header_len + info.value_len != body.len() {
        return Err(RawError::Malformed(
            "not exactly one RLP list after the type byte".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethers_core::k256::ecdsa::SigningKey;
    use ethers_core::types::transaction::eip2930::AccessList;
    use ethers_core::types::{
        Eip1559TransactionRequest, Eip2930TransactionRequest, Signature, TransactionRequest, U256,
    };
    use ethers_core::utils::{hex, secret_key_to_address};

    use crate::testing::ANVIL_KEY_0;

    fn key() -> SigningKey {
        SigningKey::from_slice(&evm::hex_decode(ANVIL_KEY_0).unwrap()).unwrap()
    }

    /// `tx` signed by [`key`]: with EIP-155's `v` when `chain_id` is set, else 27 or 28.
    fn signed(tx: &TypedTransaction, chain_id: Option<u64>) -> String {
        let (signature, recovery) = key()
            .sign_prehash_recoverable(tx.sighash().as_bytes())
            .unwrap();
        let bytes = signature.to_bytes();
        let v = match chain_id {
            Some(id) => recovery.to_byte() as u64 + 35 + 2 * id,
            None => recovery.to_byte() as u64 + 27,
        };
        let signature = Signature {
            r: U256::from_big_endian(&bytes[..32]),
            s: U256::from_big_endian(&bytes[32..]),
            v,
        };
        format!("0x{}", hex::encode(tx.rlp_signed(&signature)))
    }

    fn legacy() -> TransactionRequest {
        TransactionRequest::new()
            .to(Address::repeat_byte(0xb))
            .nonce(7)
            .gas(21_000)
            .gas_price(1)
    }

    #[test]
    fn decodes_the_three_types_with_their_chain_sender_nonce_and_hash() {
        let eip2930 = Eip2930TransactionRequest::new(legacy().chain_id(900), AccessList::default());
        let eip1559 = Eip1559TransactionRequest::new()
            .to(Address::repeat_byte(0xb))
            .nonce(7)
            .gas(21_000)
            .max_fee_per_gas(2)
            .max_priority_fee_per_gas(1)
            .chain_id(901);
        for (tx, chain_id) in [
            (TypedTransaction::Legacy(legacy().chain_id(902)), 902),
            (TypedTransaction::Eip2930(eip2930), 900),
            (TypedTransaction::Eip1559(eip1559), 901),
        ] {
            let raw = signed(&tx, Some(chain_id));
            let decoded = decode(&raw).unwrap();
            assert_eq!(decoded.chain_id, chain_id, "{raw}");
            assert_eq!(decoded.sender, secret_key_to_address(&key()));
            assert_eq!(decoded.nonce, 7);
            let bytes = hex::decode(&raw[2..]).unwrap();
            assert_eq!(decoded.hash, H256(keccak256(&bytes)));
        }
    }

    #[test]
    fn refuses_what_it_cannot_forward() {
        let pre_155 = signed(&TypedTransaction::Legacy(legacy()), None);
        assert_eq!(decode(&pre_155).unwrap_err(), RawError::NoChainId);
        let good = signed(&TypedTransaction::Legacy(legacy().chain_id(1)), Some(1));
        assert!(decode(&good).is_ok());
        assert_eq!(decode("0x").unwrap_err(), RawError::Empty);
        assert_eq!(decode(&good[2..]).unwrap_err(), RawError::NotHex);
        assert_eq!(decode("0xabc").unwrap_err(), RawError::NotHex);
        assert_eq!(decode("0x03c0").unwrap_err(), RawError::UnsupportedType(3));
        let malformed = [
            format!("{good}00"),
            good[..good.len() - 2].to_string(),
            "0x02c0".to_string(),
            "0xc0".to_string(),
        ];
        for raw in malformed {
            assert!(matches!(decode(&raw), Err(RawError::Malformed(_))), "{raw}");
        }
    }
}
