//! ERC-6492: the signature of a smart wallet not yet deployed, wrapped with what deploys it, and
//! the one transaction that deploys it and settles (through Multicall3).

use ethers_core::abi::{decode, encode, ParamType, Token};
use ethers_core::types::{Address, Bytes, H160};
use ethers_core::utils::keccak256;

/// The suffix that marks a wrapped signature (ERC-6492's `ERC6492_DETECTION_SUFFIX`):
/// `0x6492` sixteen times.
pub const MAGIC: [u8; 32] = {
    let mut magic = [0x64; 32];
    let mut i = 1;
    while i < 32 {
        magic[i] = 0x92;
        i += 2;
    }
    magic
};

/// Multicall3 (`0xcA11bde05977b3631167028862bE2a173976CA11`), at the same address on every
/// chain that has it, and preinstalled on OP Stack chains.
pub const MULTICALL3: Address = H160([
    0xca, 0x11, 0xbd, 0xe0, 0x59, 0x77, 0xb3, 0x63, 0x11, 0x67, 0x02, 0x88, 0x62, 0xbe, 0x2a, 0x17,
    0x39, 0x76, 0xca, 0x11,
]);

/// What deploys the signing wallet: a call of `calldata` on `factory`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    pub factory: Address,
    pub calldata: Bytes,
}

/// A signature ERC-6492 wrapped: the deployment (none when the wrapper names no factory) and
/// the signature the wallet checks once deployed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wrapped {
    pub deployment: Option<Deployment>,
    pub inner: Vec<u8>,
}

/// The signature ends with the magic suffix, but what precedes it is not
/// `abi.encode(address factory, bytes factoryCalldata, bytes signature)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Undecodable;

/// `Ok(None)` for a signature without the suffix; the wrapped parts otherwise.
pub fn unwrap(signature: &[u8]) -> Result<Option<Wrapped>, Undecodable> {
    let Some(body) = signature.strip_suffix(&MAGIC[..]) else {
        return Ok(None);
    };
    let shape = [ParamType::Address, ParamType::Bytes, ParamType::Bytes];
    let [factory, calldata, inner] = decode(&shape, body)
        .ok()
        .and_then(|tokens| <[Token; 3]>::try_from(tokens).ok())
        .ok_or(Undecodable)?;
    let (factory, calldata, inner) = (
        factory.into_address().ok_or(Undecodable)?,
        calldata.into_bytes().ok_or(Undecodable)?,
        inner.into_bytes().ok_or(Undecodable)?,
    );
    let deployment = (!factory.is_zero() && !calldata.is_empty()).then(|| Deployment {
        factory,
        calldata: calldata.into(),
    });
    Ok(Some(Wrapped { deployment, inner }))
}

/// The settlement that deploys the wallet first: `aggregate3` on Multicall3, the deployment
/// allowed to fail (somebody may have deployed the wallet since), the call on `target` not.
/// If the deployment did not happen, the call fails on the wallet's missing code, and with it
/// the whole transaction.
pub fn deploy_then_call(deployment: &Deployment, target: Address, calldata: &[u8]) -> Bytes {
    aggregate3(&[
        (deployment.factory, true, &deployment.calldata),
        (target, false, calldata),
    ])
}

/// What `deploy_then_call` answers in an `eth_call`, the call on `target` allowed to fail too
/// (`deploy_then_read`): each call's success and return data, or `None` when the answer is not
/// Multicall3's (no code at its address answers `0x`).
pub fn decode_results(answer: &[u8]) -> Option<Vec<(bool, Vec<u8>)>> {
    let result = ParamType::Tuple(vec![ParamType::Bool, ParamType::Bytes]);
    let Token::Array(results) = decode(&[ParamType::Array(Box::new(result))], answer)
        .ok()?
        .pop()?
    else {
        return None;
    };
    results
        .into_iter()
        .map(|r| {
            let [ok, data] = <[Token; 2]>::try_from(r.into_tuple()?).ok()?;
            Some((ok.into_bool()?, data.into_bytes()?))
        })
        .collect()
}

/// For an `eth_call` (nothing is sent): the deployment, then a read of the deployed wallet
/// (`isValidSignature`), both allowed to fail, on nodes that run no state overrides.
pub fn deploy_then_read(deployment: &Deployment, target: Address, calldata: &[u8]) -> Bytes {
    aggregate3(&[
        (deployment.factory, true, &deployment.calldata),
        (target, true, calldata),
    ])
}

/// Multicall3's `aggregate3`: each call with whether it may fail.
pub fn aggregate3(calls: &[(Address, bool, &[u8])]) -> Bytes {
    let selector = &keccak256("aggregate3((address,bool,bytes)[])")[..4];
    let mut data = selector.to_vec();
    let calls = calls
        .iter()
        .map(|(target, allow_failure, data)| {
            Token::Tuple(vec![
                Token::Address(*target),
                Token::Bool(*allow_failure),
                Token::Bytes(data.to_vec()),
            ])
        })
        .collect();
    data.extend(encode(&[Token::Array(calls)]));
    data.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrap(factory: Address, calldata: &[u8], inner: &[u8]) -> Vec<u8> {
        let mut wrapped = encode(&[
            Token::Address(factory),
            Token::Bytes(calldata.to_vec()),
            Token::Bytes(inner.to_vec()),
        ]);
        wrapped.extend(MAGIC);
        wrapped
    }

    #[test]
    fn multicall3_is_the_published_address() {
        assert_eq!(
            format!("{MULTICALL3:?}"),
            "0xca11bde05977b3631167028862be2a173976ca11"
        );
    }

    #[test]
    fn reads_aggregate3_results_and_refuses_anything_else() {
        let answer = encode(&[Token::Array(vec![
            Token::Tuple(vec![Token::Bool(true), Token::Bytes(vec![])]),
            Token::Tuple(vec![Token::Bool(false), Token::Bytes(vec![0x16, 0x26])]),
        ])]);
        assert_eq!(
            decode_results(&answer),
            Some(vec![(true, vec![]), (false, vec![0x16, 0x26])])
        );
        assert_eq!(decode_results(&[]), None);
        assert_eq!(decode_results(&[0xff; 40]), None);
    }

    #[test]
    fn unwraps_a_wrapped_signature_and_leaves_others() {
        let factory = Address::repeat_byte(0x5d);
        let wrapped = wrap(factory, &[1, 2, 3], &[7; 65]);
        let parts = unwrap(&wrapped).unwrap().unwrap();
        assert_eq!(parts.inner, vec![7; 65]);
        assert_eq!(
            parts.deployment,
            Some(Deployment {
                factory,
                calldata: vec![1, 2, 3].into()
            })
        );
        // No deployment named: the inner signature alone.
        let bare = unwrap(&wrap(Address::zero(), &[1], &[7; 65]))
            .unwrap()
            .unwrap();
        assert_eq!(bare.deployment, None);
        assert_eq!(unwrap(&[7; 65]), Ok(None));
        // The suffix over something that is not the three fields.
        let mut garbage = vec![0xff; 40];
        garbage.extend(MAGIC);
        assert_eq!(unwrap(&garbage), Err(Undecodable));
        assert_eq!(unwrap(&MAGIC), Err(Undecodable));
    }

    #[test]
    fn the_settlement_deploys_then_calls_through_aggregate3() {
        let deployment = Deployment {
            factory: Address::repeat_byte(0x5d),
            calldata: vec![0xaa].into(),
        };
        let token = Address::repeat_byte(0x03);
        let data = deploy_then_call(&deployment, token, &[0xbb, 0xcc]);
        assert_eq!(data[..4], [0x82, 0xad, 0x56, 0xcb]);
        let call3 = ParamType::Tuple(vec![ParamType::Address, ParamType::Bool, ParamType::Bytes]);
        let decoded = decode(&[ParamType::Array(Box::new(call3))], &data[4..]).unwrap();
        let Token::Array(calls) = &decoded[0] else {
            panic!("an array")
        };
        assert_eq!(
            calls,
            &vec![
                Token::Tuple(vec![
                    Token::Address(deployment.factory),
                    Token::Bool(true),
                    Token::Bytes(vec![0xaa])
                ]),
                Token::Tuple(vec![
                    Token::Address(token),
                    Token::Bool(false),
                    Token::Bytes(vec![0xbb, 0xcc])
                ]),
            ]
        );
    }
}
