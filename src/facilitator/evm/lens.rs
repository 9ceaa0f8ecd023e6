//! The verify lens: `contracts/VerifyLens.sol`, run through an `eth_call` state override, reads
//! every chain fact verify needs in one upstream call. Its compiled code is `lens.hex`
//! (rebuilt by `scripts/build-lens`, checked against the source by `scripts/test`).

use std::sync::LazyLock;

use ethers_core::abi::{decode, encode, ParamType, Token};
use ethers_core::types::{Address, U256};
use ethers_core::utils::id;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::chain::merge::Merge;
use crate::chain::{read_mode, Call, CallResult, RpcError};
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

/// `Ask`'s ABI tuple.
const ASK: &str =
    "(address,address,address,address,bytes,uint256,address,address,bytes,bytes,address,bytes,bytes)";
static FACTS: LazyLock<[u8; 4]> = LazyLock::new(|| id(format!("facts({ASK})")));
static FACTS_EACH: LazyLock<[u8; 4]> = LazyLock::new(|| id(format!("factsEach({ASK}[])")));
static OVERRIDE: LazyLock<Box<RawValue>> = LazyLock::new(|| read_mode::code_override(CODE.trim()));

/// `facts(Ask)`. Verifies ready at the same moment go as one `factsEach` call ([`EACH`]).
pub fn call(ask: &Ask<'_>) -> Call {
    let (factory, factory_call) = ask
        .deployment
        .map_or((Address::zero(), &[][..]), |d| (d.factory, &d.calldata[..]));
    let mut data = FACTS.to_vec();
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
    let mut call = read_mode::call_with_code(&OVERRIDE, &data);
    call.merge = Some(&EACH);
    call
}

/// Merges lens calls into one `factsEach(Ask[])` call: the node takes the lens's code in once
/// for all of them (`chain::merge`). An ask that changes state runs in a frame of its own that
/// is undone, and each has an even share of the gas, so each answer is what the ask's own call
/// would have answered (`contracts/VerifyLens.sol`). Trials never merge: `verify::as_settlement`
/// sends them alone, and `factsEach` answers nothing for one.
#[derive(Debug)]
pub struct Each;

pub static EACH: Each = Each;

impl Merge for Each {
    fn merge(&self, calls: &[&Call]) -> Option<Call> {
        let data: Vec<Vec<u8>> = calls.iter().map(|c| ask_data(c)).collect::<Option<_>>()?;
        // `facts(Ask)`'s calldata is the selector, the offset of the tuple (one word), then
        // the tuple's encoding, which is self-contained: its offsets count from its start.
        let asks: Vec<&[u8]> = data.iter().map(|d| d.get(36..)).collect::<Option<_>>()?;
        Some(read_mode::call_with_code(&OVERRIDE, &each_calldata(&asks)))
    }

    fn split(&self, answer: &Value, count: usize) -> Vec<CallResult> {
        let parts = answer
            .as_str()
            .and_then(evm::hex_decode)
            .and_then(|bytes| decode(&[ParamType::Array(Box::new(ParamType::Bytes))], &bytes).ok())
            .and_then(|mut tokens| tokens.pop()?.into_array())
            .filter(|parts| parts.len() == count);
        // Not the answer of `factsEach` (a node that ignored the override answers `0x`): each
        // ask gets it as its own call would have.
        let Some(parts) = parts else {
            return vec![Ok(answer.clone()); count];
        };
        parts.into_iter().map(part).collect()
    }
}

/// One ask's part of a `factsEach` answer: its `Facts`, or nothing (its wallet used up its
/// share of the gas, or its frame stopped): then the EVM stopped this ask, and verify reads the
/// payment again on its own (`LensRead::Halted`).
fn part(token: Token) -> CallResult {
    let bytes = token.into_bytes().unwrap_or_default();
    let hex = Value::String(evm::hex_bytes(&bytes));
    match decode_facts(&bytes) {
        Some(_) => Ok(hex),
        None => Err(RpcError {
            code: 3,
            message: "execution reverted: the verify lens's frame for this payment stopped".into(),
            data: Some(hex),
        }),
    }
}

/// The calldata of a lens call written by [`call`], when `call` is one exactly as written
/// there: the lens's override, its address, the latest block, and nothing else.
fn ask_data(call: &Call) -> Option<Vec<u8>> {
    let same_code = call
        .raw_param
        .is_some_and(|raw| std::ptr::eq(raw, &**OVERRIDE));
    let [tx, block] = call.params.as_slice() else {
        return None;
    };
    let tx = tx.as_object().filter(|tx| tx.len() == 2)?;
    let data = evm::hex_decode(tx.get("data")?.as_str()?)?;
    let written = same_code && tx.contains_key("to") && block.as_str() == Some("latest");
    (written && data.starts_with(&*FACTS)).then_some(data)
}

/// `factsEach(Ask[])` of the asks' tuple encodings: the array's offset, its length, each
/// element's offset (from the first element's), then the elements.
fn each_calldata(asks: &[&[u8]]) -> Vec<u8> {
    let mut heads = vec![Token::Uint(32.into()), Token::Uint(asks.len().into())];
    let mut offset = 32 * asks.len();
    for ask in asks {
        heads.push(Token::Uint(offset.into()));
        offset += ask.len();
    }
    let mut data = FACTS_EACH.to_vec();
    data.extend(encode(&heads));
    for ask in asks {
        data.extend_from_slice(ask);
    }
    data
}

/// Decodes the lens's `Facts` struct; `None` for anything else (a node that ignored the
/// override answers `0x`).
pub fn decode_answer(answer: &Value) -> Option<LensFacts> {
    decode_facts(&evm::hex_decode(answer.as_str()?)?)
}

fn decode_facts(bytes: &[u8]) -> Option<LensFacts> {
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
    let Token::Tuple(fields) = decode(&[shape], bytes).ok()?.pop()? else {
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

    fn ask_tokens(from: u64, nonce_call: Vec<u8>) -> Vec<Token> {
        let address = |n: u64| Token::Address(Address::from_low_u64_be(n));
        vec![
            address(1),
            address(from),
            address(3),
            address(1),
            Token::Bytes(nonce_call),
            Token::Uint(U256::MAX),
            address(0),
            address(0),
            Token::Bytes(vec![]),
            Token::Bytes(vec![0xab; 37]),
            address(0),
            Token::Bytes(vec![]),
            Token::Bytes(vec![]),
        ]
    }

    fn ask_call(from: u64, nonce_call: &[u8]) -> Call {
        let read = NonceRead {
            target: Address::from_low_u64_be(1),
            call: nonce_call.to_vec().into(),
            mask: U256::MAX,
        };
        call(&Ask {
            token: Address::from_low_u64_be(1),
            from: Address::from_low_u64_be(from),
            pay_to: Address::from_low_u64_be(3),
            nonce_read: &read,
            allowance_spender: None,
            deployment: None,
            erc1271_call: &[0xab; 37],
            trial_target: Address::zero(),
            trial_call: &[],
            permit_call: &[],
        })
    }

    fn ask_shape() -> ParamType {
        let (a, b) = (ParamType::Address, ParamType::Bytes);
        ParamType::Tuple(vec![
            a.clone(),
            a.clone(),
            a.clone(),
            a.clone(),
            b.clone(),
            ParamType::Uint(256),
            a.clone(),
            a.clone(),
            b.clone(),
            b.clone(),
            a,
            b.clone(),
            b,
        ])
    }

    #[test]
    fn merged_asks_are_one_facts_each_call_of_the_same_asks() {
        let (one, two) = (ask_call(10, &[1, 2, 3]), ask_call(20, &[4; 68]));
        let merged = EACH.merge(&[&one, &two]).unwrap();
        assert!(merged.merge.is_none());
        assert!(std::ptr::eq(
            merged.raw_param.unwrap(),
            one.raw_param.unwrap()
        ));
        let data = evm::hex_decode(merged.params[0]["data"].as_str().unwrap()).unwrap();
        assert_eq!(data[..4], *FACTS_EACH);
        let decoded = decode(&[ParamType::Array(Box::new(ask_shape()))], &data[4..]).unwrap();
        let expected = Token::Array(vec![
            Token::Tuple(ask_tokens(10, vec![1, 2, 3])),
            Token::Tuple(ask_tokens(20, vec![4; 68])),
        ]);
        assert_eq!(decoded, vec![expected]);
    }

    #[test]
    fn a_call_not_written_by_the_lens_does_not_merge() {
        let one = ask_call(10, &[1]);
        let mut settling = ask_call(20, &[2]);
        settling.params[0]["from"] = json!("0x0000000000000000000000000000000000000001");
        assert!(EACH.merge(&[&one, &settling]).is_none());
        let mut other_block = ask_call(20, &[2]);
        other_block.params[1] = json!("pending");
        assert!(EACH.merge(&[&one, &other_block]).is_none());
    }

    #[test]
    fn each_ask_gets_its_facts_or_the_halt_of_its_frame() {
        let facts = encode(&[Token::Tuple(vec![
            Token::Uint(7.into()),
            Token::Uint(1_700_000_000u64.into()),
            Token::Uint(0.into()),
            Token::Uint(0.into()),
            Token::Bool(true),
            Token::Uint(5_000.into()),
            Token::Bool(true),
            Token::Uint(0.into()),
            Token::Bool(false),
            Token::Uint(0.into()),
            Token::Bool(false),
            Token::Bool(false),
            Token::Bytes(vec![]),
            Token::Bool(false),
            Token::Bool(false),
            Token::Uint(0.into()),
            Token::Bytes(vec![]),
            Token::Bool(false),
        ])]);
        let answer = encode(&[Token::Array(vec![
            Token::Bytes(facts.clone()),
            Token::Bytes(vec![]),
        ])]);
        let parts = EACH.split(&json!(evm::hex_bytes(&answer)), 2);
        assert_eq!(parts[0], Ok(json!(evm::hex_bytes(&facts))));
        assert!(parts[1].as_ref().unwrap_err().is_execution_failure());
        // A node that ignored the override: each ask meets that, as it would on its own.
        assert_eq!(
            EACH.split(&json!("0x"), 2),
            vec![Ok(json!("0x")), Ok(json!("0x"))]
        );
        // An answer for another count of asks is no answer to these.
        let short = EACH.split(&json!(evm::hex_bytes(&answer)), 3);
        assert!(short
            .iter()
            .all(|p| decode_answer(p.as_ref().unwrap()).is_none()));
    }
}
