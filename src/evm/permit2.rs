//! Permit2 on the wire, as x402's `exact` scheme uses it for any ERC-20: the EIP-712 digest of a
//! `PermitWitnessTransferFrom` whose spender is x402's Permit2 proxy and whose witness names the
//! payee, the proxy's `settle` calldata, and the reads that say whether the payer approved
//! Permit2 and whether a Permit2 nonce is used.

use std::sync::LazyLock;

use ethers_core::abi::{encode, Token};
use ethers_core::types::{Address, Bytes, H160, H256, U256};
use ethers_core::utils::keccak256;

/// Uniswap's Permit2, at the same address on every chain that has it.
pub const PERMIT2: Address = H160([
    0x00, 0x00, 0x00, 0x00, 0x00, 0x22, 0xd4, 0x73, 0x03, 0x0f, 0x11, 0x6d, 0xde, 0xe9, 0xf6, 0xb4,
    0x3a, 0xc7, 0x8b, 0xa3,
]);

/// x402's exact Permit2 proxy (`0x402085c248EeA27D92E8b30b2C58ed07f9E20001`): the spender every
/// `exact` Permit2 authorization names, which sends the funds only to the witness's `to`.
pub const EXACT_PROXY: Address = H160([
    0x40, 0x20, 0x85, 0xc2, 0x48, 0xee, 0xa2, 0x7d, 0x92, 0xe8, 0xb3, 0x0b, 0x2c, 0x58, 0xed, 0x07,
    0xf9, 0xe2, 0x00, 0x01,
]);

/// x402's upto Permit2 proxy (`0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002`): the spender of an
/// `upto` authorization; it transfers what the facilitator named in the witness charges, at most
/// the permitted amount, and only when that facilitator sends the transaction.
pub const UPTO_PROXY: Address = H160([
    0x40, 0x20, 0xa4, 0xf3, 0xb7, 0xb9, 0x0c, 0xca, 0x42, 0x3b, 0x9f, 0xab, 0xcc, 0x0c, 0xe5, 0x7c,
    0x6c, 0x24, 0x00, 0x02,
]);

/// A Permit2 transfer the payer signed for x402's `exact` or `upto` scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit2Authorization {
    pub from: Address,
    pub token: Address,
    pub amount: U256,
    pub spender: Address,
    pub nonce: U256,
    pub deadline: U256,
    /// The witness: who is paid, and from when; for `upto`, also who may settle it.
    pub to: Address,
    pub valid_after: U256,
    pub facilitator: Option<Address>,
}

static TOKEN_PERMISSIONS_TYPEHASH: LazyLock<[u8; 32]> =
    LazyLock::new(|| keccak256("TokenPermissions(address token,uint256 amount)"));
static WITNESS_TYPEHASH: LazyLock<[u8; 32]> =
    LazyLock::new(|| keccak256("Witness(address to,uint256 validAfter)"));
static UPTO_WITNESS_TYPEHASH: LazyLock<[u8; 32]> =
    LazyLock::new(|| keccak256("Witness(address to,address facilitator,uint256 validAfter)"));
/// The full types Permit2 hashes: its own fields, then each proxy's witness type string.
static PERMIT_TYPEHASH: LazyLock<[u8; 32]> = LazyLock::new(|| {
    keccak256(
        "PermitWitnessTransferFrom(TokenPermissions permitted,address spender,uint256 nonce,uint256 deadline,Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,uint256 validAfter)",
    )
});
static UPTO_PERMIT_TYPEHASH: LazyLock<[u8; 32]> = LazyLock::new(|| {
    keccak256(
        "PermitWitnessTransferFrom(TokenPermissions permitted,address spender,uint256 nonce,uint256 deadline,Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,address facilitator,uint256 validAfter)",
    )
});

/// Permit2's EIP-712 domain separator on `chain_id` (no version in its domain).
pub fn domain_separator(chain_id: u64) -> H256 {
    H256(keccak256(encode(&[
        Token::FixedBytes(
            keccak256("EIP712Domain(string name,uint256 chainId,address verifyingContract)")
                .to_vec(),
        ),
        Token::FixedBytes(keccak256("Permit2").to_vec()),
        Token::Uint(chain_id.into()),
        Token::Address(PERMIT2),
    ])))
}

/// The digest the payer signed.
pub fn digest(domain_separator: H256, auth: &Permit2Authorization) -> H256 {
    let permitted = keccak256(encode(&[
        Token::FixedBytes(TOKEN_PERMISSIONS_TYPEHASH.to_vec()),
        Token::Address(auth.token),
        Token::Uint(auth.amount),
    ]));
    let (permit_typehash, witness) = match auth.facilitator {
        None => (
            *PERMIT_TYPEHASH,
            encode(&[
                Token::FixedBytes(WITNESS_TYPEHASH.to_vec()),
                Token::Address(auth.to),
                Token::Uint(auth.valid_after),
            ]),
        ),
        Some(facilitator) => (
            *UPTO_PERMIT_TYPEHASH,
            encode(&[
                Token::FixedBytes(UPTO_WITNESS_TYPEHASH.to_vec()),
                Token::Address(auth.to),
                Token::Address(facilitator),
                Token::Uint(auth.valid_after),
            ]),
        ),
    };
    let witness = keccak256(witness);
    let struct_hash = keccak256(encode(&[
        Token::FixedBytes(permit_typehash.to_vec()),
        Token::FixedBytes(permitted.to_vec()),
        Token::Address(auth.spender),
        Token::Uint(auth.nonce),
        Token::Uint(auth.deadline),
        Token::FixedBytes(witness.to_vec()),
    ]));
    let mut message = Vec::with_capacity(66);
    message.extend_from_slice(&[0x19, 0x01]);
    message.extend_from_slice(domain_separator.as_bytes());
    message.extend_from_slice(&struct_hash);
    H256(keccak256(message))
}

fn call(signature: &str, args: &[Token]) -> Bytes {
    let mut data = keccak256(signature)[..4].to_vec();
    data.extend(encode(args));
    Bytes::from(data)
}

/// `(permit, owner, witness, signature)`: the exact proxy's `settle` arguments.
fn settle_args(auth: &Permit2Authorization, signature: &[u8]) -> Vec<Token> {
    vec![
        permit_token(auth),
        Token::Address(auth.from),
        Token::Tuple(vec![Token::Address(auth.to), Token::Uint(auth.valid_after)]),
        Token::Bytes(signature.to_vec()),
    ]
}

/// `(permit, amount, owner, witness, signature)`: the upto proxy's `settle` arguments.
fn settle_upto_args(auth: &Permit2Authorization, amount: U256, signature: &[u8]) -> Vec<Token> {
    vec![
        permit_token(auth),
        Token::Uint(amount),
        Token::Address(auth.from),
        Token::Tuple(vec![
            Token::Address(auth.to),
            Token::Address(auth.facilitator.unwrap_or_default()),
            Token::Uint(auth.valid_after),
        ]),
        Token::Bytes(signature.to_vec()),
    ]
}

fn permit_token(auth: &Permit2Authorization) -> Token {
    Token::Tuple(vec![
        Token::Tuple(vec![Token::Address(auth.token), Token::Uint(auth.amount)]),
        Token::Uint(auth.nonce),
        Token::Uint(auth.deadline),
    ])
}

const PERMIT: &str = "((address,uint256),uint256,uint256)";
const PERMIT_2612: &str = "(uint256,uint256,bytes32,bytes32,uint8)";

/// The exact proxy's `settle(permit, owner, witness, signature)`.
pub fn settle(auth: &Permit2Authorization, signature: &[u8]) -> Bytes {
    call(
        &format!("settle({PERMIT},address,(address,uint256),bytes)"),
        &settle_args(auth, signature),
    )
}

/// The upto proxy's `settle(permit, amount, owner, witness, signature)`: `amount` is what is
/// charged, at most the permitted amount.
pub fn settle_upto(auth: &Permit2Authorization, amount: U256, signature: &[u8]) -> Bytes {
    call(
        &format!("settle({PERMIT},uint256,address,(address,address,uint256),bytes)"),
        &settle_upto_args(auth, amount, signature),
    )
}

/// An EIP-2612 permit by which the payer approves Permit2 in the settlement transaction itself
/// (x402's `eip2612GasSponsoring`): the proxies' `settleWithPermit` submits it first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eip2612Permit {
    pub value: U256,
    pub deadline: U256,
    pub v: u8,
    pub r: H256,
    pub s: H256,
}

impl Eip2612Permit {
    /// The token's `permit(owner, PERMIT2, value, deadline, v, r, s)`: what `settleWithPermit`
    /// submits first.
    pub fn call(&self, owner: Address) -> Bytes {
        call(
            "permit(address,address,uint256,uint256,uint8,bytes32,bytes32)",
            &[
                Token::Address(owner),
                Token::Address(PERMIT2),
                Token::Uint(self.value),
                Token::Uint(self.deadline),
                Token::Uint(self.v.into()),
                Token::FixedBytes(self.r.as_bytes().to_vec()),
                Token::FixedBytes(self.s.as_bytes().to_vec()),
            ],
        )
    }

    fn token(&self) -> Token {
        Token::Tuple(vec![
            Token::Uint(self.value),
            Token::Uint(self.deadline),
            Token::FixedBytes(self.r.as_bytes().to_vec()),
            Token::FixedBytes(self.s.as_bytes().to_vec()),
            Token::Uint(self.v.into()),
        ])
    }
}

/// The exact proxy's `settleWithPermit(permit2612, permit, owner, witness, signature)`.
pub fn settle_with_permit(
    permit: &Eip2612Permit,
    auth: &Permit2Authorization,
    signature: &[u8],
) -> Bytes {
    let mut args = vec![permit.token()];
    args.extend(settle_args(auth, signature));
    call(
        &format!("settleWithPermit({PERMIT_2612},{PERMIT},address,(address,uint256),bytes)"),
        &args,
    )
}

/// The upto proxy's `settleWithPermit(permit2612, permit, amount, owner, witness, signature)`.
pub fn settle_upto_with_permit(
    permit: &Eip2612Permit,
    auth: &Permit2Authorization,
    amount: U256,
    signature: &[u8],
) -> Bytes {
    let mut args = vec![permit.token()];
    args.extend(settle_upto_args(auth, amount, signature));
    call(
        &format!(
            "settleWithPermit({PERMIT_2612},{PERMIT},uint256,address,(address,address,uint256),bytes)"
        ),
        &args,
    )
}

/// `allowance(owner, PERMIT2)` on the token.
pub fn allowance(owner: Address) -> Bytes {
    call(
        "allowance(address,address)",
        &[Token::Address(owner), Token::Address(PERMIT2)],
    )
}

/// Permit2's `nonceBitmap(owner, word)`: the word that holds `nonce`'s bit.
pub fn nonce_bitmap(owner: Address, nonce: U256) -> Bytes {
    call(
        "nonceBitmap(address,uint256)",
        &[Token::Address(owner), Token::Uint(nonce >> 8)],
    )
}

/// The bit of `nonce` in its bitmap word: set once the nonce is used.
pub fn nonce_bit(nonce: U256) -> U256 {
    U256::one() << (nonce.low_u32() & 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_addresses_are_the_canonical_ones() {
        assert_eq!(
            format!("{PERMIT2:?}"),
            "0x000000000022d473030f116ddee9f6b43ac78ba3"
        );
        assert_eq!(
            format!("{EXACT_PROXY:?}"),
            "0x402085c248eea27d92e8b30b2c58ed07f9e20001"
        );
        assert_eq!(
            format!("{UPTO_PROXY:?}"),
            "0x4020a4f3b7b90cca423b9fabcc0ce57c6c240002"
        );
    }

    #[test]
    fn the_digest_is_what_viem_signs() {
        // The spec's example authorization, hashed by viem's hashTypedData with @x402/evm's
        // permit2WitnessTypes on Base Sepolia.
        let auth = Permit2Authorization {
            from: "0x857b06519E91e3A54538791bDbb0E22373e36b66"
                .parse()
                .unwrap(),
            token: "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
                .parse()
                .unwrap(),
            amount: 10_000.into(),
            spender: EXACT_PROXY,
            nonce: U256::from_dec_str(
                "33247007178036348590600198031289925668252061821958005840077069883511451257277",
            )
            .unwrap(),
            deadline: 1_740_672_154u64.into(),
            to: "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
                .parse()
                .unwrap(),
            valid_after: 1_740_672_089u64.into(),
            facilitator: None,
        };
        assert_eq!(
            format!("{:?}", digest(domain_separator(84532), &auth)),
            "0x21528e1468aac114016416353e2309329f217dc180b21baa1d81cde941095685"
        );
        // The same with @x402/evm's uptoPermit2WitnessTypes, the upto proxy and a facilitator.
        let upto = Permit2Authorization {
            spender: UPTO_PROXY,
            nonce: 7.into(),
            facilitator: Some(
                "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
                    .parse()
                    .unwrap(),
            ),
            ..auth
        };
        assert_eq!(
            format!("{:?}", digest(domain_separator(84532), &upto)),
            "0x442e9e76de9622c64990ce594f98979dc596a53b720c85512d8f84cafcb90b9e"
        );
    }

    #[test]
    fn a_nonce_is_a_bit_in_the_word_of_its_high_bits() {
        let nonce = U256::from(0x1_05u64);
        assert_eq!(nonce_bit(nonce), U256::one() << 5);
        let read = nonce_bitmap(Address::repeat_byte(1), nonce);
        assert_eq!(U256::from_big_endian(&read[36..68]), U256::one());
    }

    #[test]
    fn selectors_match_the_abi() {
        // settle: the exact proxy's, as @x402/evm 2.27.0 calls it.
        let data = settle(
            &Permit2Authorization {
                from: Address::zero(),
                token: Address::zero(),
                amount: U256::zero(),
                spender: EXACT_PROXY,
                nonce: U256::zero(),
                deadline: U256::zero(),
                to: Address::zero(),
                valid_after: U256::zero(),
                facilitator: None,
            },
            &[],
        );
        assert_eq!(
            data[..4],
            keccak256(
                "settle(((address,uint256),uint256,uint256),address,(address,uint256),bytes)"
            )[..4]
        );
        assert_eq!(allowance(Address::zero())[..4], [0xdd, 0x62, 0xed, 0x3e]);
        let permit = Eip2612Permit {
            value: U256::zero(),
            deadline: U256::zero(),
            v: 27,
            r: H256::zero(),
            s: H256::zero(),
        };
        // EIP-2612's permit, as OpenZeppelin's ERC20Permit and Circle's USDC declare it.
        assert_eq!(permit.call(Address::zero())[..4], [0xd5, 0x05, 0xac, 0xcf]);
    }
}
