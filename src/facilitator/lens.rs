//! The verify lens: `contracts/VerifyLens.sol`, run through an `eth_call` state override, reads
//! every chain fact verify needs in one upstream call. Its compiled code is `lens.hex`
//! (rebuilt by `scripts/build-lens`, checked against the source by `scripts/test`).

use std::sync::LazyLock;

use ethers_core::abi::{decode, encode, ParamType, Token};
use ethers_core::types::{Address, H256, U256};
use ethers_core::utils::id;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::chain::{read_mode, Call};
use crate::evm;

const CODE: &str = include_str!("lens.hex");

/// What the lens answered; the token reads say whether they succeeded.
#[derive(Debug, PartialEq)]
pub struct LensFacts {
    pub timestamp: u64,
    pub from_code_size: U256,
    pub balance: Option<U256>,
    pub authorization_state: Option<U256>,
    pub from_blacklisted: bool,
    pub to_blacklisted: bool,
    pub erc1271_answer: Vec<u8>,
    /// The settlement call tried on the token, when asked and its outcome came back.
    pub trial: Option<LensTrial>,
}

#[derive(Debug, PartialEq)]
pub struct LensTrial {
    pub succeeded: bool,
    /// From before the lens's CALL to the token to after it (the token's account cold).
    pub gas: U256,
    pub revert_data: Vec<u8>,
}

/// `facts(token, from, payTo, nonce, erc1271Call, trialCall)`; an empty `erc1271_call` skips
/// ERC-1271, an empty `trial_call` the trial.
pub fn call(
    token: Address,
    from: Address,
    pay_to: Address,
    nonce: H256,
    erc1271_call: &[u8],
    trial_call: &[u8],
) -> Call {
    static SELECTOR: LazyLock<[u8; 4]> =
        LazyLock::new(|| id("facts(address,address,address,bytes32,bytes,bytes)"));
    let mut data = SELECTOR.to_vec();
    data.extend(encode(&[
        Token::Address(token),
        Token::Address(from),
        Token::Address(pay_to),
        Token::FixedBytes(nonce.as_bytes().to_vec()),
        Token::Bytes(erc1271_call.to_vec()),
        Token::Bytes(trial_call.to_vec()),
    ]));
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
        ParamType::Bool,      // balanceRead
        ParamType::Uint(256), // balance
        ParamType::Bool,      // authorizationStateRead
        ParamType::Uint(256), // authorizationState
        ParamType::Bool,      // fromBlacklisted
        ParamType::Bool,      // toBlacklisted
        ParamType::Bytes,     // erc1271Answer
        ParamType::Bool,      // trialRan
        ParamType::Bool,      // trialSucceeded
        ParamType::Uint(256), // trialGas
        ParamType::Bytes,     // trialRevert
    ]);
    let Token::Tuple(fields) = decode(&[shape], &bytes).ok()?.pop()? else {
        return None;
    };
    let [_, timestamp, code_size, balance_read, balance, state_read, state, from_bl, to_bl, erc1271, trial_ran, succeeded, gas, revert_data] =
        <[Token; 14]>::try_from(fields).ok()?;
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
        balance: read(balance_read, balance),
        authorization_state: read(state_read, state),
        from_blacklisted: from_bl.into_bool()?,
        to_blacklisted: to_bl.into_bool()?,
        erc1271_answer: erc1271.into_bytes()?,
        trial,
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
            Token::Bool(true),
            word(5_000),
            Token::Bool(false),
            word(0),
            Token::Bool(false),
            Token::Bool(true),
            Token::Bytes(vec![0x16, 0x26]),
            Token::Bool(true),
            Token::Bool(false),
            word(61_000),
            Token::Bytes(vec![0x08, 0xc3, 0x79, 0xa0]),
        ])]);
        let facts = decode_answer(&json!(evm::hex_bytes(&answer))).unwrap();
        assert_eq!(
            facts,
            LensFacts {
                timestamp: 1_700_000_000,
                from_code_size: U256::zero(),
                balance: Some(5_000.into()),
                authorization_state: None,
                from_blacklisted: false,
                to_blacklisted: true,
                erc1271_answer: vec![0x16, 0x26],
                trial: Some(LensTrial {
                    succeeded: false,
                    gas: 61_000.into(),
                    revert_data: vec![0x08, 0xc3, 0x79, 0xa0],
                }),
            }
        );
        assert_eq!(decode_answer(&json!("0x")), None);
        assert_eq!(decode_answer(&json!(42)), None);
    }
}
