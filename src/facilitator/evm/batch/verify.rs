//! Verification rules 1-11 of the binding for the payloads a payer signs (`deposit`, `voucher`,
//! `refund`): the requirements and the channel config (rules 1-5) and an EOA voucher's
//! signature (rule 6) without the chain; then the channel's state, read in one batch with what
//! else the payload needs (an ERC-1271 voucher check), for rules 7, 9 and 10.

use ethers_core::types::{Address, Bytes, H256, U256};
use serde_json::{json, Map, Value};

use super::reason::{BatchReason, Refusal};
use super::wire::{BatchPayload, BatchRequest, Voucher};
use crate::chain::{self, Batch, Chain, Traffic, Unreachable};
use crate::evm::batch::{self as leaf, ChannelConfig};
use crate::evm::hex_decode;
use crate::evm::{erc3009, erc6492};
use crate::facilitator::evm::verify::Network;

/// The batch-settlement scheme's name on the wire.
pub const SCHEME: &str = "batch-settlement";

/// The channel's state as the contract holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelState {
    pub balance: u128,
    pub total_claimed: u128,
    pub withdraw_requested_at: u64,
    pub refund_nonce: U256,
}

impl ChannelState {
    /// The snapshot answers carry (verify: `extra`; settle: `extra.channelState`).
    pub fn snapshot(&self, channel: H256) -> Value {
        json!({
            "channelId": format!("{channel:#x}"),
            "balance": self.balance.to_string(),
            "totalClaimed": self.total_claimed.to_string(),
            "withdrawRequestedAt": self.withdraw_requested_at,
            "refundNonce": self.refund_nonce.to_string(),
        })
    }
}

/// Rules 1 (scheme), 2 (network) of every payload: both requirements name the scheme and the
/// same network, and routerd serves it.
pub fn check_requirements<'n>(
    request: &BatchRequest,
    network: impl Fn(&str) -> Option<&'n Network>,
) -> Result<&'n Network, Refusal> {
    let (accepted, required) = (
        &request.payment_payload.accepted,
        &request.payment_requirements,
    );
    if accepted.scheme != SCHEME || required.scheme != SCHEME {
        return Err(Refusal::new(
            BatchReason::Scheme,
            format!("paymentRequirements.scheme: expected {SCHEME:?}"),
        ));
    }
    if accepted.network != required.network {
        return Err(Refusal::new(
            BatchReason::NetworkMismatch,
            "paymentPayload.accepted.network is not paymentRequirements.network",
        ));
    }
    network(&required.network).ok_or_else(|| {
        Refusal::new(
            BatchReason::Network,
            format!("network {:?} is not served", required.network),
        )
    })
}

fn extra<'a>(request: &'a BatchRequest, key: &str) -> Option<&'a Value> {
    let extra: Option<&Map<String, Value>> = request.payment_requirements.extra.as_ref();
    extra.and_then(|e| e.get(key))
}

/// Rules 1-5 on the config: it hashes to the voucher's channel id, and names the requirements'
/// payTo, receiver authorizer, asset and withdraw delay (in the binding's order). A refund's
/// requirements are the server's own (the official channel manager sends an empty `extra`):
/// its receiver authorizer is checked when they name one.
pub fn check_config(
    request: &BatchRequest,
    domain: H256,
    config: &ChannelConfig,
    channel: H256,
) -> Result<(), Refusal> {
    let refund = matches!(request.payment_payload.payload, BatchPayload::Refund(_));
    let refuse = |reason, message: &str| Err(Refusal::new(reason, message));
    if leaf::channel_id(domain, config) != channel {
        return refuse(
            BatchReason::ChannelIdMismatch,
            "paymentPayload.payload.voucher.channelId is not the hash of channelConfig",
        );
    }
    let required = &request.payment_requirements;
    if crate::evm::parse_address(&required.pay_to) != Some(config.receiver) {
        return refuse(
            BatchReason::ReceiverMismatch,
            "channelConfig.receiver is not paymentRequirements.payTo",
        );
    }
    if config.receiver == config.payer {
        // access.md §3c: a payment to oneself moves no value; its gas would be the operator's.
        return refuse(
            BatchReason::ReceiverMismatch,
            "channelConfig.receiver is channelConfig.payer: a channel to oneself moves no value",
        );
    }
    let authorizer = extra(request, "receiverAuthorizer")
        .and_then(Value::as_str)
        .and_then(crate::evm::parse_address)
        .filter(|a| !a.is_zero());
    let named = extra(request, "receiverAuthorizer").is_some();
    if authorizer != Some(config.receiver_authorizer) && (named || !refund) {
        return refuse(
            BatchReason::ReceiverAuthorizerMismatch,
            "channelConfig.receiverAuthorizer is not paymentRequirements.extra.receiverAuthorizer",
        );
    }
    if crate::evm::parse_address(&required.asset) != Some(config.token) {
        return refuse(
            BatchReason::TokenMismatch,
            "channelConfig.token is not paymentRequirements.asset",
        );
    }
    check_delay(request, config.withdraw_delay)
}

/// Calls that move `tokens` (as `field` names each) are sent only for the network's configured
/// tokens (x402-facilitator.md: only configured assets are ever called). The contract's dry run
/// cannot tell how another token behaves in the transaction routerd signs, and its gas is the
/// operator's.
pub fn served<'t>(
    network: &Network,
    tokens: impl IntoIterator<Item = (Address, &'t str)>,
) -> Result<(), Refusal> {
    for (token, field) in tokens {
        if !network.tokens.iter().any(|t| t.address == token) {
            return Err(Refusal::new(
                BatchReason::TokenMismatch,
                format!("{field}: not a token routerd serves on that network"),
            ));
        }
    }
    Ok(())
}

fn check_delay(request: &BatchRequest, delay: u64) -> Result<(), Refusal> {
    let asked = extra(request, "withdrawDelay");
    let same = |v: &Value| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    };
    if asked.is_some_and(|v| same(v) != Some(delay)) {
        return Err(Refusal::new(
            BatchReason::WithdrawDelayMismatch,
            "channelConfig.withdrawDelay is not paymentRequirements.extra.withdrawDelay",
        ));
    }
    if !(leaf::MIN_WITHDRAW_DELAY..=leaf::MAX_WITHDRAW_DELAY).contains(&delay) {
        return Err(Refusal::new(
            BatchReason::WithdrawDelayOutOfRange,
            "channelConfig.withdrawDelay: expected 900 to 2,592,000 seconds",
        ));
    }
    Ok(())
}

/// A call the channel's read asks beside it: its target and calldata.
pub type Asked = (Address, Bytes);

/// Rule 6 as far as it needs no chain: a voucher of a payer authorizer is that EOA's ECDSA
/// signature, nothing else; one of the payer itself recovers to it, or the payer's wallet is
/// asked (`Some`: the ERC-1271 call to add to the read).
pub fn check_voucher_signature(
    domain: H256,
    config: &ChannelConfig,
    voucher: &Voucher,
) -> Result<Option<Asked>, Refusal> {
    let digest = leaf::voucher_digest(domain, voucher.channel_id, voucher.max_claimable);
    let recovered = erc3009::recover(digest, &voucher.signature);
    let refused = || {
        Refusal::new(
            BatchReason::VoucherSignature,
            "paymentPayload.payload.voucher.signature is not the voucher signed by the channel's payer authorizer",
        )
    };
    if !config.payer_authorizer.is_zero() {
        return match recovered == Some(config.payer_authorizer) {
            true => Ok(None),
            false => Err(refused()),
        };
    }
    if recovered == Some(config.payer) {
        return Ok(None);
    }
    Ok(Some((
        config.payer,
        erc3009::is_valid_signature(digest, &voucher.signature),
    )))
}

/// What one read says: the channel, and the answers of the extra calls asked with it.
pub struct Read {
    pub state: ChannelState,
    pub extra: Vec<Option<Bytes>>,
}

/// The channel's state and the `extra` calls, in one `eth_call` through Multicall3 (an extra call
/// may fail: its answer is then `None`). An answer that does not parse is the binding's
/// `rpc_read_failed` (`Ok(Err)`); a node that cannot be reached is `Err`.
pub async fn read(
    chain: &Chain,
    contract: Address,
    channel: H256,
    extra: Vec<Asked>,
) -> Result<Result<Read, Refusal>, Unreachable> {
    let views = [
        leaf::channels(channel),
        leaf::pending_withdrawals(channel),
        leaf::refund_nonce(channel),
    ];
    let mut calls: Vec<(Address, bool, &[u8])> =
        views.iter().map(|v| (contract, false, &v[..])).collect();
    calls.extend(extra.iter().map(|(to, data)| (*to, true, &data[..])));
    let results = aggregate(chain, &calls).await?;
    let state = results.as_deref().and_then(state_of);
    let (Some(results), Some(state)) = (results, state) else {
        return Ok(Err(Refusal::new(
            BatchReason::RpcReadFailed,
            "the channel's state could not be read from the settlement contract",
        )));
    };
    let extra = results[views.len()..]
        .iter()
        .map(|(ok, data)| ok.then(|| Bytes::from(data.clone())))
        .collect();
    Ok(Ok(Read { state, extra }))
}

/// `calls` in one `eth_call` through Multicall3's `aggregate3`: each call's success and answer,
/// or `None` when the answer does not parse.
async fn aggregate(
    chain: &Chain,
    calls: &[(Address, bool, &[u8])],
) -> Result<Option<Vec<(bool, Vec<u8>)>>, Unreachable> {
    let mut batch = Batch::new();
    let data = erc6492::aggregate3(calls);
    let slot = batch.add(chain::eth_call(erc6492::MULTICALL3, &data, "latest"));
    let answers = chain.client.ask(Traffic::Callers, &batch).await?;
    Ok(answers
        .get(slot)
        .as_ref()
        .ok()
        .and_then(Value::as_str)
        .and_then(hex_decode)
        .and_then(|answer| erc6492::decode_results(&answer))
        .filter(|results| results.len() == calls.len()))
}

/// What each of `channels` has claimed on chain, in one `eth_call`.
pub async fn claimed_totals(
    chain: &Chain,
    contract: Address,
    channels: &[H256],
) -> Result<Result<Vec<u128>, Refusal>, Unreachable> {
    let views: Vec<Bytes> = channels.iter().map(|c| leaf::channels(*c)).collect();
    let calls: Vec<(Address, bool, &[u8])> =
        views.iter().map(|v| (contract, false, &v[..])).collect();
    let totals = aggregate(chain, &calls).await?.and_then(|results| {
        let total = |(ok, answer): &(bool, Vec<u8>)| ok.then(|| leaf::two_words(answer)).flatten();
        results
            .iter()
            .map(|r| total(r).map(|(_, claimed)| claimed))
            .collect()
    });
    Ok(totals.ok_or_else(|| {
        Refusal::new(
            BatchReason::RpcReadFailed,
            "the channels' claimed totals could not be read from the settlement contract",
        )
    }))
}

/// The channel's state from the answers of its three views, in order.
fn state_of(results: &[(bool, Vec<u8>)]) -> Option<ChannelState> {
    let [(true, channels), (true, pending), (true, nonce), ..] = results else {
        return None;
    };
    let (balance, total_claimed) = leaf::two_words(channels)?;
    let (_, requested_at) = leaf::two_words(pending)?;
    Some(ChannelState {
        balance,
        total_claimed,
        withdraw_requested_at: u64::try_from(requested_at).ok()?,
        refund_nonce: leaf::one_word(nonce)?,
    })
}

/// Rules 7, 9 and 10 on the state read: the channel holds a balance (or the deposit funds it),
/// the voucher's ceiling is within it and above what is claimed (a refund's may equal it).
pub fn check_state(
    state: &ChannelState,
    max_claimable: u128,
    deposit: u128,
    refund: bool,
) -> Result<(), Refusal> {
    if state.balance == 0 && deposit == 0 {
        return Err(Refusal::new(
            BatchReason::ChannelNotFound,
            "the channel has no balance",
        ));
    }
    if max_claimable > state.balance.saturating_add(deposit) {
        return Err(Refusal::new(
            BatchReason::CumulativeExceedsBalance,
            "paymentPayload.payload.voucher.maxClaimableAmount exceeds the channel's balance",
        ));
    }
    let below = match refund {
        true => max_claimable < state.total_claimed,
        false => max_claimable <= state.total_claimed,
    };
    if below {
        return Err(Refusal::new(
            BatchReason::CumulativeBelowClaimed,
            "paymentPayload.payload.voucher.maxClaimableAmount is not above the channel's totalClaimed",
        ));
    }
    Ok(())
}

/// An ERC-1271 answer: the magic value `isValidSignature` returns for a valid signature.
pub fn erc1271_accepts(answer: Option<&Bytes>) -> bool {
    answer.is_some_and(|a| a.len() >= 4 && a[..4] == [0x16, 0x26, 0xba, 0x7e])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(balance: u128, total_claimed: u128) -> ChannelState {
        ChannelState {
            balance,
            total_claimed,
            withdraw_requested_at: 0,
            refund_nonce: U256::zero(),
        }
    }

    fn reason(result: Result<(), Refusal>) -> Option<BatchReason> {
        result.err().map(|r| r.reason)
    }

    #[test]
    fn the_channel_rules_hold_a_voucher_between_what_is_claimed_and_the_balance() {
        use BatchReason::*;
        assert_eq!(
            reason(check_state(&state(0, 0), 1, 0, false)),
            Some(ChannelNotFound)
        );
        // A deposit funds the channel it opens.
        assert_eq!(reason(check_state(&state(0, 0), 1, 5, false)), None);
        assert_eq!(
            reason(check_state(&state(10, 0), 11, 0, false)),
            Some(CumulativeExceedsBalance)
        );
        assert_eq!(reason(check_state(&state(10, 0), 11, 1, false)), None);
        assert_eq!(
            reason(check_state(&state(10, 4), 4, 0, false)),
            Some(CumulativeBelowClaimed)
        );
        // A refund's zero-charge voucher may equal what is claimed, never be below it.
        assert_eq!(reason(check_state(&state(10, 4), 4, 0, true)), None);
        assert_eq!(
            reason(check_state(&state(10, 4), 3, 0, true)),
            Some(CumulativeBelowClaimed)
        );
    }

    #[test]
    fn only_the_wallets_magic_value_accepts_a_signature() {
        assert!(erc1271_accepts(Some(&Bytes::from(vec![
            0x16, 0x26, 0xba, 0x7e, 0, 0
        ]))));
        assert!(!erc1271_accepts(Some(&Bytes::from(vec![0xff; 32]))));
        assert!(!erc1271_accepts(Some(&Bytes::new())));
        assert!(!erc1271_accepts(None));
    }
}
