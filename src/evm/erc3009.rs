//! ERC-3009 on the wire: the EIP-712 digest of a `TransferWithAuthorization`, and the calldata of
//! the token functions the facilitator reads and calls.

use std::sync::LazyLock;

use ethers_core::abi::{decode, encode, ParamType, Token};
use ethers_core::types::{Address, Bytes, Signature, H256, U256};
use ethers_core::utils::keccak256;
use secp256k1::ecdsa::{RecoverableSignature, RecoveryId};
use secp256k1::Message;

/// The parsed authorization a payer signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferAuthorization {
    pub from: Address,
    pub to: Address,
    pub value: U256,
    pub valid_after: U256,
    pub valid_before: U256,
    pub nonce: H256,
}

static DOMAIN_TYPEHASH: LazyLock<[u8; 32]> = LazyLock::new(|| {
    keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)")
});
static TRANSFER_TYPEHASH: LazyLock<[u8; 32]> = LazyLock::new(|| {
    keccak256(
        "TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)",
    )
});

static RECEIVE_TYPEHASH: LazyLock<[u8; 32]> = LazyLock::new(|| {
    keccak256(
        "ReceiveWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)",
    )
});

/// The token's EIP-712 domain separator; computed once per configured token.
pub fn domain_separator(name: &str, version: &str, chain_id: u64, token: Address) -> H256 {
    H256(keccak256(encode(&[
        Token::FixedBytes(DOMAIN_TYPEHASH.to_vec()),
        Token::FixedBytes(keccak256(name).to_vec()),
        Token::FixedBytes(keccak256(version).to_vec()),
        Token::Uint(chain_id.into()),
        Token::Address(token),
    ])))
}

/// The digest the payer signed: `keccak256(0x1901 || domainSeparator || structHash)`.
pub fn digest(domain_separator: H256, auth: &TransferAuthorization) -> H256 {
    typed_digest(domain_separator, &TRANSFER_TYPEHASH, auth)
}

/// The digest of the same terms as a `receiveWithAuthorization`, which only `to` may submit
/// (a `batch-settlement` deposit collector).
pub fn receive_digest(domain_separator: H256, auth: &TransferAuthorization) -> H256 {
    typed_digest(domain_separator, &RECEIVE_TYPEHASH, auth)
}

/// EIP-712's digest of `auth` under `typehash`, its seven words written in place: every verify
/// hashes one, and ABI tokens would allocate for each word.
fn typed_digest(domain_separator: H256, typehash: &[u8; 32], auth: &TransferAuthorization) -> H256 {
    let mut words = [0u8; 7 * 32];
    words[..32].copy_from_slice(typehash);
    words[44..64].copy_from_slice(auth.from.as_bytes());
    words[76..96].copy_from_slice(auth.to.as_bytes());
    auth.value.to_big_endian(&mut words[96..128]);
    auth.valid_after.to_big_endian(&mut words[128..160]);
    auth.valid_before.to_big_endian(&mut words[160..192]);
    words[192..].copy_from_slice(auth.nonce.as_bytes());
    let mut message = [0u8; 66];
    message[..2].copy_from_slice(&[0x19, 0x01]);
    message[2..34].copy_from_slice(domain_separator.as_bytes());
    message[34..].copy_from_slice(&keccak256(words));
    H256(keccak256(message))
}

/// Half the secp256k1 order: signatures with a larger `s` are malleable and the token rejects them.
/// Derived from k256's curve order rather than written out.
static HALF_ORDER: LazyLock<U256> = LazyLock::new(|| {
    use k256::elliptic_curve::bigint::ArrayEncoding;
    use k256::elliptic_curve::Curve;
    U256::from_big_endian(&k256::Secp256k1::ORDER.to_be_byte_array()) >> 1
});

/// Splits a 65-byte `r || s || v` signature the way the token's `ECRecover` accepts it
/// (v is 27 or 28, s in the lower half), or `None`.
pub fn split_signature(bytes: &[u8]) -> Option<Signature> {
    if bytes.len() != 65 {
        return None;
    }
    let r = U256::from_big_endian(&bytes[..32]);
    let s = U256::from_big_endian(&bytes[32..64]);
    let v = bytes[64] as u64;
    if !(v == 27 || v == 28) || s > *HALF_ORDER || s.is_zero() || r.is_zero() {
        return None;
    }
    Some(Signature { r, s, v })
}

/// The address that signed `digest`, if the signature is a well-formed 65-byte one.
///
/// Recovery is most of verify's own CPU, so it runs on libsecp256k1 (the `secp256k1` crate, as
/// reth recovers senders), about four times faster here than k256's recover-then-verify.
pub fn recover(digest: H256, signature: &[u8]) -> Option<Address> {
    split_signature(signature)?;
    let id = RecoveryId::try_from(i32::from(signature[64]) - 27).ok()?;
    let key = RecoverableSignature::from_compact(&signature[..64], id)
        .ok()?
        .recover(Message::from_digest(digest.0))
        .ok()?;
    let hash = keccak256(&key.serialize_uncompressed()[1..]);
    Some(Address::from_slice(&hash[12..]))
}

fn selector(signature: &str) -> [u8; 4] {
    let hash = keccak256(signature);
    [hash[0], hash[1], hash[2], hash[3]]
}

/// A function's selector, hashed once per call site: verify writes these calls for every
/// payment, and a keccak of the signature each time was a share of its CPU.
macro_rules! selector {
    ($signature:literal) => {{
        static SELECTOR: LazyLock<[u8; 4]> = LazyLock::new(|| selector($signature));
        *SELECTOR
    }};
}

fn call(selector: [u8; 4], args: &[Token]) -> Bytes {
    let mut data = selector.to_vec();
    data.extend(encode(args));
    Bytes::from(data)
}

pub fn balance_of(owner: Address) -> Bytes {
    call(selector!("balanceOf(address)"), &[Token::Address(owner)])
}

pub fn authorization_state(authorizer: Address, nonce: H256) -> Bytes {
    call(
        selector!("authorizationState(address,bytes32)"),
        &[
            Token::Address(authorizer),
            Token::FixedBytes(nonce.as_bytes().to_vec()),
        ],
    )
}

pub fn is_blacklisted(account: Address) -> Bytes {
    call(
        selector!("isBlacklisted(address)"),
        &[Token::Address(account)],
    )
}

pub fn is_valid_signature(digest: H256, signature: &[u8]) -> Bytes {
    call(
        selector!("isValidSignature(bytes32,bytes)"),
        &[
            Token::FixedBytes(digest.as_bytes().to_vec()),
            Token::Bytes(signature.to_vec()),
        ],
    )
}

/// What a transaction carrying `calldata` pays before it runs: 21,000, and 4 or 16 per byte
/// (EIP-2028). A settlement's execution costs more than EIP-7623's calldata floor.
pub fn intrinsic_gas(calldata: &[u8]) -> u64 {
    21_000
        + calldata
            .iter()
            .map(|&byte| if byte == 0 { 4 } else { 16 })
            .sum::<u64>()
}

/// The least gas a transaction carrying `calldata` is charged on a Prague chain (EIP-7623):
/// 21,000 and 10 per token, a zero byte one token and any other four. A gas limit below it is
/// refused by the node; on older chains it is only a little headroom.
pub fn calldata_floor_gas(calldata: &[u8]) -> u64 {
    21_000
        + calldata
            .iter()
            .map(|&byte| if byte == 0 { 10 } else { 40 })
            .sum::<u64>()
}

/// The ERC-1271 magic value, left-aligned in the answer word.
pub const ERC1271_MAGIC: [u8; 4] = [0x16, 0x26, 0xba, 0x7e];

fn authorization_tokens(auth: &TransferAuthorization) -> Vec<Token> {
    vec![
        Token::Address(auth.from),
        Token::Address(auth.to),
        Token::Uint(auth.value),
        Token::Uint(auth.valid_after),
        Token::Uint(auth.valid_before),
        Token::FixedBytes(auth.nonce.as_bytes().to_vec()),
    ]
}

/// `transferWithAuthorization` calldata: the `(v, r, s)` overload for a 65-byte EOA signature,
/// the `bytes signature` overload for smart wallets.
pub fn transfer_with_authorization(
    auth: &TransferAuthorization,
    signature: &[u8],
    smart_wallet: bool,
) -> Bytes {
    let mut args = authorization_tokens(auth);
    match split_signature(signature).filter(|_| !smart_wallet) {
        Some(sig) => {
            let mut r = [0u8; 32];
            let mut s = [0u8; 32];
            sig.r.to_big_endian(&mut r);
            sig.s.to_big_endian(&mut s);
            args.extend([
                Token::Uint(sig.v.into()),
                Token::FixedBytes(r.to_vec()),
                Token::FixedBytes(s.to_vec()),
            ]);
            call(
        selector!("transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,uint8,bytes32,bytes32)"),
                &args,
            )
        }
        None => {
            args.push(Token::Bytes(signature.to_vec()));
            call(
        selector!("transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes)"),
                &args,
            )
        }
    }
}

/// The payee (`to`) of `transferWithAuthorization` calldata, either overload: the second
/// argument, read by the ABI decoder (`None` when the calldata is not such a call).
pub fn payee(calldata: &[u8]) -> Option<Address> {
    let args = calldata.get(4..)?;
    let mut head = decode(&[ParamType::Address, ParamType::Address], args).ok()?;
    head.pop()?.into_address()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethers_core::utils::secret_key_to_address;
    use k256::ecdsa::SigningKey;

    /// A test key's address and its 65-byte signature (`v` = 27/28) of `digest`.
    fn sign(key: &[u8], digest: H256) -> (Address, Vec<u8>) {
        let key = SigningKey::from_slice(key).unwrap();
        let (signature, recovery) = key.sign_prehash_recoverable(digest.as_bytes()).unwrap();
        let mut bytes = signature.to_bytes().to_vec();
        bytes.push(27 + recovery.to_byte());
        (secret_key_to_address(&key), bytes)
    }

    use crate::testing::ANVIL_KEY_0 as DEV_KEY;

    fn sample() -> TransferAuthorization {
        TransferAuthorization {
            from: "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
                .parse()
                .unwrap(),
            to: "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"
                .parse()
                .unwrap(),
            value: 1_000_000.into(),
            valid_after: 0.into(),
            valid_before: 2_000_000_000u64.into(),
            nonce: H256::repeat_byte(0x11),
        }
    }

    #[test]
    fn selectors_match_the_token_abi() {
        assert_eq!(
            selector!("authorizationState(address,bytes32)"),
            [0xe9, 0x4a, 0x01, 0x02]
        );
        assert_eq!(balance_of(Address::zero())[..4], [0x70, 0xa0, 0x82, 0x31]);
        assert_eq!(selector("balanceOf(address)"), [0x70, 0xa0, 0x82, 0x31]);
        assert_eq!(selector("isValidSignature(bytes32,bytes)"), ERC1271_MAGIC);
        assert_eq!(
            selector("transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,uint8,bytes32,bytes32)"),
            [0xe3, 0xee, 0x16, 0x0e]
        );
    }

    #[test]
    fn digests_hash_the_abi_encoding_of_the_typed_struct() {
        let separator = domain_separator("USD Coin", "2", 84532, Address::repeat_byte(0x22));
        let auth = TransferAuthorization {
            value: U256::MAX - 7,
            valid_after: 1_700_000_000u64.into(),
            ..sample()
        };
        let abi = |typehash: &[u8; 32]| {
            let mut fields = vec![Token::FixedBytes(typehash.to_vec())];
            fields.extend(authorization_tokens(&auth));
            let mut message = vec![0x19, 0x01];
            message.extend_from_slice(separator.as_bytes());
            message.extend_from_slice(&keccak256(encode(&fields)));
            H256(keccak256(message))
        };
        assert_eq!(digest(separator, &auth), abi(&TRANSFER_TYPEHASH));
        assert_eq!(receive_digest(separator, &auth), abi(&RECEIVE_TYPEHASH));
    }

    #[test]
    fn domain_separator_matches_the_eip712_vector() {
        // USDC on Ethereum mainnet publishes this DOMAIN_SEPARATOR for ("USD Coin", "2", 1, token).
        let usdc: Address = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"
            .parse()
            .unwrap();
        let separator = domain_separator("USD Coin", "2", 1, usdc);
        assert_eq!(
            format!("{separator:?}"),
            "0x06c37168a7db5138defc7866392bb87a741f9b3d104deb5094588ce041cae335"
        );
    }

    #[test]
    fn signed_digest_recovers_and_rejects_malleable_forms() {
        let separator = domain_separator("USD Coin", "2", 84532, Address::repeat_byte(0x22));
        let digest = digest(separator, &sample());
        let (signer, mut bytes) = sign(&crate::evm::hex_decode(DEV_KEY).unwrap(), digest);
        assert_eq!(recover(digest, &bytes), Some(signer));

        let mut bad_v = bytes.clone();
        bad_v[64] = 1;
        assert_eq!(recover(digest, &bad_v), None);
        assert_eq!(recover(digest, &bytes[..64]), None);

        // s' = n - s is the malleable twin; the token rejects it.
        let n = U256::from_str_radix(
            "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141",
            16,
        )
        .unwrap();
        assert_eq!(*HALF_ORDER, n >> 1);
        let s = U256::from_big_endian(&bytes[32..64]);
        (n - s).to_big_endian(&mut bytes[32..64]);
        bytes[64] ^= 1;
        assert_eq!(recover(digest, &bytes), None);
    }

    #[test]
    fn recovery_agrees_with_k256_on_many_signatures() {
        for i in 1..=64u8 {
            let digest = H256::from(keccak256([i, 7, i]));
            let (signer, bytes) = sign(&[i; 32], digest);
            let k256 = split_signature(&bytes).and_then(|s| s.recover(digest).ok());
            assert_eq!(recover(digest, &bytes), k256);
            assert_eq!(recover(digest, &bytes), Some(signer));
            // Another digest recovers someone else, on both.
            let other = H256::from(keccak256([i]));
            let k256_other = split_signature(&bytes).and_then(|s| s.recover(other).ok());
            assert_eq!(recover(other, &bytes), k256_other);
            assert_ne!(recover(other, &bytes), Some(signer));
        }
    }

    #[test]
    fn the_payee_is_read_from_either_overload() {
        let to = sample().to;
        let eoa = transfer_with_authorization(&sample(), &[7u8; 65], false);
        assert_eq!(payee(&eoa), Some(to));
        let wallet = transfer_with_authorization(&sample(), &[1, 2, 3], true);
        assert_eq!(payee(&wallet), Some(to));
        assert_eq!(payee(&eoa[..40]), None);
    }

    #[test]
    fn smart_wallet_calldata_uses_the_bytes_overload() {
        let data = transfer_with_authorization(&sample(), &[1, 2, 3], true);
        assert_eq!(
            &data[..4],
            &selector(
                "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes)"
            )
        );
    }
}
