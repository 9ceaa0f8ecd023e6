//! The x402 `batch-settlement` contracts on the wire: a channel's config and id, the EIP-712
//! digests of its vouchers, refunds and claim batches, the ERC-3009 and Permit2 deposits'
//! authorizations, and the calldata of the settlement contract's functions and views. No I/O.
//!
//! The channel id is the EIP-712 hash of the config under the settlement contract's domain
//! (`x402 Batch Settlement`, version 1, the chain and the contract): the same config names another
//! channel on another chain or deployment.

use std::sync::LazyLock;

use ethers_core::abi::{decode, encode, ParamType, Token};
use ethers_core::types::{Address, Bytes, H256, U256};
use ethers_core::utils::keccak256;

use super::permit2::Eip2612Permit;

/// The shortest and longest withdraw delay the contract accepts, in seconds (15 min, 30 days).
pub const MIN_WITHDRAW_DELAY: u64 = 900;
pub const MAX_WITHDRAW_DELAY: u64 = 2_592_000;

/// A channel's immutable config: who pays, who signs vouchers (an EOA, or zero for the payer's
/// own ERC-1271 check), who is paid, who authorizes claims and refunds, the token, and the delay
/// of a timed withdrawal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelConfig {
    pub payer: Address,
    pub payer_authorizer: Address,
    pub receiver: Address,
    pub receiver_authorizer: Address,
    pub token: Address,
    /// A `uint40` on chain.
    pub withdraw_delay: u64,
    pub salt: H256,
}

impl ChannelConfig {
    fn tokens(&self) -> Vec<Token> {
        vec![
            Token::Address(self.payer),
            Token::Address(self.payer_authorizer),
            Token::Address(self.receiver),
            Token::Address(self.receiver_authorizer),
            Token::Address(self.token),
            Token::Uint(self.withdraw_delay.into()),
            Token::FixedBytes(self.salt.as_bytes().to_vec()),
        ]
    }
}

/// One row of a claim: a channel's voucher (its config and signed ceiling), the payer's
/// signature of it, and the channel's new `totalClaimed` (at most the ceiling).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRow {
    pub channel: ChannelConfig,
    pub max_claimable: u128,
    pub signature: Bytes,
    pub total_claimed: u128,
}

static DOMAIN_TYPEHASH: LazyLock<[u8; 32]> = LazyLock::new(|| {
    keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)")
});
static CHANNEL_CONFIG_TYPEHASH: LazyLock<[u8; 32]> = LazyLock::new(|| {
    keccak256("ChannelConfig(address payer,address payerAuthorizer,address receiver,address receiverAuthorizer,address token,uint40 withdrawDelay,bytes32 salt)")
});
static VOUCHER_TYPEHASH: LazyLock<[u8; 32]> =
    LazyLock::new(|| keccak256("Voucher(bytes32 channelId,uint128 maxClaimableAmount)"));
static REFUND_TYPEHASH: LazyLock<[u8; 32]> =
    LazyLock::new(|| keccak256("Refund(bytes32 channelId,uint256 nonce,uint128 amount)"));
static CLAIM_ENTRY_TYPE: &str =
    "ClaimEntry(bytes32 channelId,uint128 maxClaimableAmount,uint128 totalClaimed)";
static CLAIM_ENTRY_TYPEHASH: LazyLock<[u8; 32]> = LazyLock::new(|| keccak256(CLAIM_ENTRY_TYPE));
static CLAIM_BATCH_TYPEHASH: LazyLock<[u8; 32]> =
    LazyLock::new(|| keccak256(format!("ClaimBatch(ClaimEntry[] claims){CLAIM_ENTRY_TYPE}")));
/// Permit2's signed type of a deposit: its own fields, then the collector's witness, which binds
/// the transfer to one channel.
static PERMIT2_DEPOSIT_TYPEHASH: LazyLock<[u8; 32]> = LazyLock::new(|| {
    keccak256("PermitWitnessTransferFrom(TokenPermissions permitted,address spender,uint256 nonce,uint256 deadline,DepositWitness witness)DepositWitness(bytes32 channelId)TokenPermissions(address token,uint256 amount)")
});
static TOKEN_PERMISSIONS_TYPEHASH: LazyLock<[u8; 32]> =
    LazyLock::new(|| keccak256("TokenPermissions(address token,uint256 amount)"));
static DEPOSIT_WITNESS_TYPEHASH: LazyLock<[u8; 32]> =
    LazyLock::new(|| keccak256("DepositWitness(bytes32 channelId)"));

/// A deposit's Permit2 transfer as the payer signed it: `amount` of `token` to the Permit2
/// deposit collector (`spender`), which moves it into `channel` only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit2Deposit {
    pub token: Address,
    pub amount: U256,
    pub spender: Address,
    pub nonce: U256,
    pub deadline: U256,
    pub channel: H256,
}

impl Permit2Deposit {
    /// The `PermitWitnessTransferFrom` digest under Permit2's domain (`permit2::domain_separator`).
    pub fn digest(&self, permit2_domain: H256) -> H256 {
        let permitted = struct_hash(
            &TOKEN_PERMISSIONS_TYPEHASH,
            vec![Token::Address(self.token), Token::Uint(self.amount)],
        );
        let witness = struct_hash(
            &DEPOSIT_WITNESS_TYPEHASH,
            vec![Token::FixedBytes(self.channel.as_bytes().to_vec())],
        );
        let fields = vec![
            Token::FixedBytes(permitted.to_vec()),
            Token::Address(self.spender),
            Token::Uint(self.nonce),
            Token::Uint(self.deadline),
            Token::FixedBytes(witness.to_vec()),
        ];
        typed_digest(
            permit2_domain,
            struct_hash(&PERMIT2_DEPOSIT_TYPEHASH, fields),
        )
    }
}

/// The settlement contract's EIP-712 domain separator on chain `chain_id`.
pub fn domain_separator(chain_id: u64, contract: Address) -> H256 {
    H256(keccak256(encode(&[
        Token::FixedBytes(DOMAIN_TYPEHASH.to_vec()),
        Token::FixedBytes(keccak256("x402 Batch Settlement").to_vec()),
        Token::FixedBytes(keccak256("1").to_vec()),
        Token::Uint(chain_id.into()),
        Token::Address(contract),
    ])))
}

fn typed_digest(domain: H256, struct_hash: [u8; 32]) -> H256 {
    let mut message = Vec::with_capacity(66);
    message.extend_from_slice(&[0x19, 0x01]);
    message.extend_from_slice(domain.as_bytes());
    message.extend_from_slice(&struct_hash);
    H256(keccak256(message))
}

fn struct_hash(typehash: &[u8; 32], fields: Vec<Token>) -> [u8; 32] {
    let mut all = vec![Token::FixedBytes(typehash.to_vec())];
    all.extend(fields);
    keccak256(encode(&all))
}

/// The channel's id: the EIP-712 hash of its config under the contract's domain.
pub fn channel_id(domain: H256, config: &ChannelConfig) -> H256 {
    typed_digest(
        domain,
        struct_hash(&CHANNEL_CONFIG_TYPEHASH, config.tokens()),
    )
}

/// What the payer (or its payer authorizer) signs for a voucher of cumulative ceiling `max`.
pub fn voucher_digest(domain: H256, channel: H256, max: u128) -> H256 {
    let fields = vec![
        Token::FixedBytes(channel.as_bytes().to_vec()),
        Token::Uint(max.into()),
    ];
    typed_digest(domain, struct_hash(&VOUCHER_TYPEHASH, fields))
}

/// What the receiver authorizer signs to refund `amount` at the channel's refund `nonce`.
pub fn refund_digest(domain: H256, channel: H256, nonce: U256, amount: u128) -> H256 {
    let fields = vec![
        Token::FixedBytes(channel.as_bytes().to_vec()),
        Token::Uint(nonce),
        Token::Uint(amount.into()),
    ];
    typed_digest(domain, struct_hash(&REFUND_TYPEHASH, fields))
}

/// What the receiver authorizer signs for `claimWithSignature` over `rows`: each row's channel
/// id, ceiling and new total, in order.
pub fn claim_batch_digest(domain: H256, rows: &[ClaimRow]) -> H256 {
    let mut entries = Vec::with_capacity(rows.len() * 32);
    for row in rows {
        let fields = vec![
            Token::FixedBytes(channel_id(domain, &row.channel).as_bytes().to_vec()),
            Token::Uint(row.max_claimable.into()),
            Token::Uint(row.total_claimed.into()),
        ];
        entries.extend_from_slice(&struct_hash(&CLAIM_ENTRY_TYPEHASH, fields));
    }
    let claims = Token::FixedBytes(keccak256(entries).to_vec());
    typed_digest(domain, struct_hash(&CLAIM_BATCH_TYPEHASH, vec![claims]))
}

/// The ERC-3009 nonce of a deposit: bound to the channel and the authorization's salt, so that
/// a deposit authorization can fund no other channel.
pub fn deposit_nonce(channel: H256, salt: U256) -> H256 {
    H256(keccak256(encode(&[
        Token::FixedBytes(channel.as_bytes().to_vec()),
        Token::Uint(salt),
    ])))
}

fn call(signature: &str, args: &[Token]) -> Bytes {
    let mut data = keccak256(signature)[..4].to_vec();
    data.extend(encode(args));
    Bytes::from(data)
}

const CONFIG: &str = "(address,address,address,address,address,uint40,bytes32)";

fn id_view(name: &str, channel: H256) -> Bytes {
    call(
        &format!("{name}(bytes32)"),
        &[Token::FixedBytes(channel.as_bytes().to_vec())],
    )
}

/// `channels(id)`: `(uint128 balance, uint128 totalClaimed)`.
pub fn channels(channel: H256) -> Bytes {
    id_view("channels", channel)
}

/// `pendingWithdrawals(id)`: `(uint128 amount, uint40 initiatedAt)`.
pub fn pending_withdrawals(channel: H256) -> Bytes {
    id_view("pendingWithdrawals", channel)
}

/// `refundNonce(id)`: the nonce the next `refundWithSignature` must carry.
pub fn refund_nonce(channel: H256) -> Bytes {
    id_view("refundNonce", channel)
}

/// `receivers(receiver, token)`: `(uint128 totalClaimed, uint128 totalSettled)`.
pub fn receivers(receiver: Address, token: Address) -> Bytes {
    call(
        "receivers(address,address)",
        &[Token::Address(receiver), Token::Address(token)],
    )
}

/// `deposit(config, amount, collector, collectorData)`.
pub fn deposit(config: &ChannelConfig, amount: u128, collector: Address, data: &[u8]) -> Bytes {
    let args = [
        Token::Tuple(config.tokens()),
        Token::Uint(amount.into()),
        Token::Address(collector),
        Token::Bytes(data.to_vec()),
    ];
    call(&format!("deposit({CONFIG},uint128,address,bytes)"), &args)
}

/// What the ERC-3009 collector reads of a deposit: the authorization's window, salt and signature.
pub fn erc3009_collector_data(
    valid_after: U256,
    valid_before: U256,
    salt: U256,
    signature: &[u8],
) -> Bytes {
    Bytes::from(encode(&[
        Token::Uint(valid_after),
        Token::Uint(valid_before),
        Token::Uint(salt),
        Token::Bytes(signature.to_vec()),
    ]))
}

/// What the Permit2 collector reads of a deposit: the permit's nonce and deadline, the payer's
/// signature, and an EIP-2612 permit of Permit2 to submit first (empty for none).
pub fn permit2_collector_data(
    nonce: U256,
    deadline: U256,
    signature: &[u8],
    eip2612: &[u8],
) -> Bytes {
    Bytes::from(encode(&[
        Token::Uint(nonce),
        Token::Uint(deadline),
        Token::Bytes(signature.to_vec()),
        Token::Bytes(eip2612.to_vec()),
    ]))
}

/// An EIP-2612 permit of Permit2 as the Permit2 collector reads it:
/// `(value, deadline, v, r, s)`.
pub fn eip2612_permit_data(permit: &Eip2612Permit) -> Bytes {
    Bytes::from(encode(&[
        Token::Uint(permit.value),
        Token::Uint(permit.deadline),
        Token::Uint(permit.v.into()),
        Token::FixedBytes(permit.r.as_bytes().to_vec()),
        Token::FixedBytes(permit.s.as_bytes().to_vec()),
    ]))
}

fn claim_tokens(rows: &[ClaimRow]) -> Token {
    let row = |r: &ClaimRow| {
        let voucher = Token::Tuple(vec![
            Token::Tuple(r.channel.tokens()),
            Token::Uint(r.max_claimable.into()),
        ]);
        Token::Tuple(vec![
            voucher,
            Token::Bytes(r.signature.to_vec()),
            Token::Uint(r.total_claimed.into()),
        ])
    };
    Token::Array(rows.iter().map(row).collect())
}

/// `claimWithSignature(rows, signature)`: the receiver authorizer's `ClaimBatch` signature
/// over exactly these rows.
pub fn claim_with_signature(rows: &[ClaimRow], signature: &[u8]) -> Bytes {
    let args = [claim_tokens(rows), Token::Bytes(signature.to_vec())];
    call(
        &format!("claimWithSignature((({CONFIG},uint128),bytes,uint128)[],bytes)"),
        &args,
    )
}

/// `settle(receiver, token)`: sweeps what the receiver claimed and has not been paid.
pub fn settle(receiver: Address, token: Address) -> Bytes {
    call(
        "settle(address,address)",
        &[Token::Address(receiver), Token::Address(token)],
    )
}

/// `refundWithSignature(config, amount, nonce, signature)`.
pub fn refund_with_signature(
    config: &ChannelConfig,
    amount: u128,
    nonce: U256,
    signature: &[u8],
) -> Bytes {
    let args = [
        Token::Tuple(config.tokens()),
        Token::Uint(amount.into()),
        Token::Uint(nonce),
        Token::Bytes(signature.to_vec()),
    ];
    call(
        &format!("refundWithSignature({CONFIG},uint128,uint256,bytes)"),
        &args,
    )
}

/// `multicall(calls)`: every call on the contract itself, all or nothing.
pub fn multicall(calls: &[Bytes]) -> Bytes {
    let calls = calls.iter().map(|c| Token::Bytes(c.to_vec())).collect();
    call("multicall(bytes[])", &[Token::Array(calls)])
}

/// The topic of `Settled(address indexed receiver, address indexed token, address indexed
/// sender, uint128 amount)`.
pub static SETTLED_TOPIC: LazyLock<H256> =
    LazyLock::new(|| H256(keccak256("Settled(address,address,address,uint128)")));
/// The topic of `Refunded(bytes32 indexed channelId, address indexed sender, uint128 amount)`.
pub static REFUNDED_TOPIC: LazyLock<H256> =
    LazyLock::new(|| H256(keccak256("Refunded(bytes32,address,uint128)")));

/// The two words a view answers, each as a `u128` (the first, the second), or `None` when the
/// answer is not two words or a word does not fit.
pub fn two_words(answer: &[u8]) -> Option<(u128, u128)> {
    let tokens = decode(&[ParamType::Uint(256), ParamType::Uint(256)], answer).ok()?;
    let word = |t: &Token| t.clone().into_uint().filter(|v| v.bits() <= 128);
    Some((word(&tokens[0])?.as_u128(), word(&tokens[1])?.as_u128()))
}

/// A one-word `uint256` answer.
pub fn one_word(answer: &[u8]) -> Option<U256> {
    let tokens = decode(&[ParamType::Uint(256)], answer).ok()?;
    tokens[0].clone().into_uint()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn config() -> ChannelConfig {
        ChannelConfig {
            payer: Address::repeat_byte(1),
            payer_authorizer: Address::repeat_byte(2),
            receiver: Address::repeat_byte(3),
            receiver_authorizer: Address::repeat_byte(4),
            token: Address::repeat_byte(5),
            withdraw_delay: 900,
            salt: H256::zero(),
        }
    }

    #[test]
    fn the_channel_id_is_bound_to_the_chain_and_the_contract() {
        let contract = Address::from_str("0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003").unwrap();
        let here = channel_id(domain_separator(8453, contract), &config());
        assert_ne!(here, channel_id(domain_separator(1, contract), &config()));
        let elsewhere = domain_separator(8453, Address::repeat_byte(9));
        assert_ne!(here, channel_id(elsewhere, &config()));
        let mut salted = config();
        salted.salt = H256::repeat_byte(1);
        assert_ne!(here, channel_id(domain_separator(8453, contract), &salted));
    }

    #[test]
    fn views_answer_words_that_fit() {
        let answer = encode(&[Token::Uint(7.into()), Token::Uint(3.into())]);
        assert_eq!(two_words(&answer), Some((7, 3)));
        let too_big = encode(&[Token::Uint(U256::MAX), Token::Uint(3.into())]);
        assert_eq!(two_words(&too_big), None);
        assert_eq!(two_words(&answer[..40]), None);
        assert_eq!(one_word(&answer[..32]), Some(7.into()));
    }

    #[test]
    fn a_permit2_deposit_digest_is_the_one_viem_signs() {
        // viem's hashTypedData of the same PermitWitnessTransferFrom with its DepositWitness.
        let deposit = Permit2Deposit {
            token: Address::repeat_byte(5),
            amount: 1000.into(),
            spender: Address::from_str("0x4020425FAf3B746C082C2f942b4E5159887B0005").unwrap(),
            nonce: 77.into(),
            deadline: 1_900_000_000u64.into(),
            channel: H256::repeat_byte(0x11),
        };
        let expected =
            H256::from_str("0xa509d467f5c208fa489fceeb3e381a69324816d93960328aa801b25834494e4f")
                .unwrap();
        let domain = crate::evm::permit2::domain_separator(8453);
        assert_eq!(deposit.digest(domain), expected);
        let data = permit2_collector_data(77.into(), 1_900_000_000u64.into(), &[0xab, 0xcd], &[]);
        // viem's encodeAbiParameters: two words, two offsets, the signature's length and word,
        // and the empty permit's length.
        assert_eq!(data.len(), 7 * 32);
        assert_eq!(
            (data[31], data[95], data[127], data[159]),
            (77, 0x80, 0xc0, 2)
        );
        assert_eq!(&data[160..162], &[0xab, 0xcd]);
        assert!(data[192..].iter().all(|b| *b == 0));
    }

    #[test]
    fn calls_carry_their_selectors() {
        assert_eq!(
            &channels(H256::zero())[..4],
            &keccak256("channels(bytes32)")[..4]
        );
        let deposit = deposit(&config(), 5, Address::zero(), &[]);
        let signature = "deposit((address,address,address,address,address,uint40,bytes32),uint128,address,bytes)";
        assert_eq!(&deposit[..4], &keccak256(signature)[..4]);
    }
}
