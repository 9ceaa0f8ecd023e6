//! The verify lens: `contracts/VerifyLens.sol`, run through an `eth_call` state override, reads
//! every chain fact verify needs in one upstream call. Its compiled code is `lens.hex`
//! (rebuilt by `scripts/build-lens`, checked against the source by `scripts/test`).

use std::sync::LazyLock;

use ethers_core::abi::{decode, encode, ParamType, Token};
use ethers_core::types::{Address, U256};
use ethers_core::utils::id;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::chain::{read_mode, Call};
use crate::evm;
use crate::evm::erc6492::Deployment;
use crate::evm::NonceRead;

const CODE: &str = include_str!("lens.hex");

/// What the lens answered; the token reads say whether they succeeded.
#[derive(Debug, PartialEq)]
pub struct LensFacts {
    pub timestamp: u64,
    pub from_code_size: U256,
    /// `from`'s code size after the ERC-6492 deployment asked (the same when none was).
    pub wallet_code_size: U256,
    pub balance: Option<U256>,
    /// The word of the nonce read: the token's `authorizationState`, or Permit2's bitmap word.
    pub authorization_state: Option<U256>,
    /// The payer's allowance for the spender asked (Permit2), when asked and read.
    pub allowance: Option<U256>,
    pub from_blacklisted: bool,
    pub to_blacklisted: bool,
    pub erc1271_answer: Vec<u8>,
    /// The settlement call tried on the token, when asked and its outcome came back.
    pub trial: Option<LensTrial>,
    /// The token took the EIP-2612 permit asked (tried and undone).
    pub permit_accepted: bool,
}

#[derive(Debug, PartialEq)]
pub struct LensTrial {
    pub succeeded: bool,
    /// From before the lens's CALL to the token to after it (the token's account cold).
    pub gas: U256,
    pub revert_data: Vec<u8>,
}

/// What the lens is asked about one payment.
pub struct Ask<'a> {
    pub token: Address,
    pub from: Address,
    pub pay_to: Address,
    /// Where the authorization's nonce is marked used.
    pub nonce_read: &'a NonceRead,
    /// `allowance(from, spender)` is read on the token (Permit2's approval).
    pub allowance_spender: Option<Address>,
    /// Deploys `from` first when it has no code (ERC-6492), inside the call only.
    pub deployment: Option<&'a Deployment>,
    /// Empty: ERC-1271 is not asked.
    pub erc1271_call: &'a [u8],
    /// The settlement call to try and where it goes; empty calldata: no trial.
    pub trial_target: Address,
    pub trial_call: &'a [u8],
    /// An EIP-2612 permit to try on the token (the settlement submits it first); empty: none.
    pub permit_call: &'a [u8],
}

/// `facts(Ask)`.
pub fn call(ask: &Ask<'_>) -> Call {
    static SELECTOR: LazyLock<[u8; 4]> = LazyLock::new(|| {
        id("facts((address,address,address,address,bytes,uint256,address,address,bytes,bytes,address,bytes,bytes))")
    });
    let (factory, factory_call) = ask
        .deployment
        .map_or((Address::zero(), &[][..]), |d| (d.factory, &d.calldata[..]));
    let mut data = SELECTOR.to_vec();
    data.extend(encode(&[Token::Tuple(vec![
        Token::Address(ask.token),
        Token::Address(ask.from),
        Token::Address(ask.pay_to),
        Token::Address(ask.nonce_read.target),
        Token::Bytes(ask.nonce_read.call.to_vec()),
        Token::Uint(ask.nonce_read.mask),
        Token::Address(ask.allowance_spender.unwrap_or_default()),
        Token::Address(factory),
        Token::Bytes(factory_call.to_vec()),
        Token::Bytes(ask.erc1271_call.to_vec()),
        Token::Address(ask.trial_target),
        Token::Bytes(ask.trial_call.to_vec()),
        Token::Bytes(ask.permit_call.to_vec()),
    ])]));
    static OVERRIDE: LazyLock<Box<RawValue>> =
        LazyLock::new(|| read_mode::code_override(CODE.trim()));
    read_mode::call_with_code(&OVERRIDE, &data)
}

/// Decodes the lens's `Facts` struct; `None` for anything else (a node that ignored the
/// override answers `0x`).
pub fn decode_answer(answer: &Value) -> Option<LensFacts> {
    let bytes = evm::hex_decode(answer.as_str()?)?;
    let shape = ParamType::Tuple(vec![
        ParamType::Uint(256), // blockNumber
        ParamType::Uint(256), // timestamp
        ParamType::Uint(256), // fromCodeSize
        ParamType::Uint(256), // walletCodeSize
        ParamType::Bool,      // balanceRead
        ParamType::Uint(256), // balance
        ParamType::Bool,      // authorizationStateRead
        ParamType::Uint(256), // authorizationState
        ParamType::Bool,      // allowanceRead
        ParamType::Uint(256), // allowance
        ParamType::Bool,      // fromBlacklisted
        ParamType::Bool,      // toBlacklisted
        ParamType::Bytes,     // erc1271Answer
        ParamType::Bool,      // trialRan
        ParamType::Bool,      // trialSucceeded
        ParamType::Uint(256), // trialGas
        ParamType::Bytes,     // trialRevert
        ParamType::Bool,      // permitAccepted
    ]);
    let Token::Tuple(fields) = decode(&[shape], &bytes).ok()?.pop()? else {
        return None;
    };
    let [_, timestamp, code_size, wallet_code_size, balance_read, balance, state_read, state, allowance_read, allowance, from_bl, to_bl, erc1271, trial_ran, succeeded, gas, revert_data, permit_accepted] =
        <[Token; 18]>::try_from(fields).ok()?;
    let read = |ok: Token, value: Token| ok.into_bool()?.then(|| value.into_uint()).flatten();
    let trial = match trial_ran.into_bool()? {
        true => Some(LensTrial {
            succeeded: succeeded.into_bool()?,
            gas: gas.into_uint()?,
            revert_data: revert_data.into_bytes()?,
        }),
        false => None,
    };
    Some(LensFacts {
        timestamp: timestamp.into_uint()?.try_into().ok()?,
        from_code_size: code_size.into_uint()?,
        wallet_code_size: wallet_code_size.into_uint()?,
        balance: read(balance_read, balance),
        authorization_state: read(state_read, state),
        allowance: read(allowance_read, allowance),
        from_blacklisted: from_bl.into_bool()?,
        to_blacklisted: to_bl.into_bool()?,
        erc1271_answer: erc1271.into_bytes()?,
        trial,
        permit_accepted: permit_accepted.into_bool()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decodes_the_lens_answer_and_refuses_an_ignored_override() {
        let word = |n: u64| Token::Uint(n.into());
        let answer = encode(&[Token::Tuple(vec![
            word(7),
            word(1_700_000_000),
            word(0),
            word(120),
            Token::Bool(true),
            word(5_000),
            Token::Bool(false),
            word(0),
            Token::Bool(true),
            word(77),
            Token::Bool(false),
            Token::Bool(true),
            Token::Bytes(vec![0x16, 0x26]),
            Token::Bool(true),
            Token::Bool(false),
            word(61_000),
            Token::Bytes(vec![0x08, 0xc3, 0x79, 0xa0]),
            Token::Bool(true),
        ])]);
        let facts = decode_answer(&json!(evm::hex_bytes(&answer))).unwrap();
        assert_eq!(
            facts,
            LensFacts {
                timestamp: 1_700_000_000,
                from_code_size: U256::zero(),
                wallet_code_size: 120.into(),
                balance: Some(5_000.into()),
                authorization_state: None,
                allowance: Some(77.into()),
                from_blacklisted: false,
                to_blacklisted: true,
                erc1271_answer: vec![0x16, 0x26],
                trial: Some(LensTrial {
                    succeeded: false,
                    gas: 61_000.into(),
                    revert_data: vec![0x08, 0xc3, 0x79, 0xa0],
                }),
                permit_accepted: true,
            }
        );
        assert_eq!(decode_answer(&json!("0x")), None);
        assert_eq!(decode_answer(&json!(42)), None);
    }
}
