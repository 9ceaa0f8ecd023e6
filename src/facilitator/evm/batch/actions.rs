//! The server's own payloads: `claim` (its channels' latest vouchers), `settle` (the sweep of
//! what it claimed) and `refund` (a cooperative refund). Each is checked and tried on its own
//! before it is packed (`pack`): a call that would revert is answered its reason and never sent.
//! routerd signs for a receiver authorizer only with its own key, and a refund only for a caller
//! whose API key is scoped to the channel's receiver: a payer must not be able to take back
//! unclaimed escrow through the facilitator.

use ethers_core::types::{Address, Bytes, H256};
use serde_json::{json, Value};

use super::pack::{receipt_logs, sign_claims, Job, Packed, Sweep, Target};
use super::reason::{BatchReason, Refusal};
use super::verify::{self, ChannelState};
use super::wire::{self, BatchPayload, BatchRequest};
use super::{payer_of, EvmBatch, Network};
use crate::chain::{self, Batch, Budget, Traffic};
use crate::evm::batch::{self as leaf, ChannelConfig, ClaimRow};
use crate::evm::logs::{address_topic, Log};
use crate::evm::{erc3009, hex_bytes, hex_decode, parse_address};
use crate::facilitator::outcome::SettleError;
use crate::facilitator::protocol::v1::SettleResponse;
use crate::facilitator::protocol::v2::SETTLEMENT_PENDING;
use crate::ledger::Asking;

/// A settle answer being built: the payload's payer and network.
struct Answer<'a> {
    payload: &'a BatchPayload,
    network: String,
}

impl<'a> Answer<'a> {
    /// The answer to `request`: its payload's payer, its network as it named it.
    fn to(request: &'a BatchRequest) -> Self {
        Answer {
            payload: &request.payment_payload.payload,
            network: request.payment_requirements.network.clone(),
        }
    }

    fn refused(&self, refused: Refusal) -> SettleResponse {
        super::refused_settle(self.payload, self.network.clone(), refused)
    }

    /// A packed job's outcome; `failed` names a transaction that did not do it.
    fn of(&self, packed: Packed, failed: BatchReason) -> SettleResponse {
        let mut answer = SettleResponse {
            success: false,
            error_reason: None,
            error_message: None,
            payer: payer_of(self.payload),
            transaction: String::new(),
            network: self.network.clone(),
            amount: None,
            extra: None,
        };
        match packed {
            Packed::Done(settled) => {
                answer.success = settled.success;
                answer.transaction = settled.transaction.map(hex_bytes).unwrap_or_default();
                if !settled.success {
                    answer.error_reason = Some(failed.name().to_string());
                    answer.error_message = settled
                        .message
                        .map(|m| m.render(crate::facilitator::protocol::v2::path));
                }
            }
            Packed::Pending(hash) => {
                answer.error_reason = Some(SETTLEMENT_PENDING.to_string());
                answer.transaction = hash.map(hex_bytes).unwrap_or_default();
            }
            Packed::NotSent(message) | Packed::Failed(message) => {
                answer.error_reason = Some(failed.name().to_string());
                answer.error_message = Some(message);
            }
        }
        answer
    }
}

/// The network's pack target, after the requirements' rules, and the network.
fn target<'b>(
    batch: &'b EvmBatch,
    request: &BatchRequest,
) -> Result<(Target, &'b Network), Refusal> {
    let network = verify::check_requirements(request, |n| batch.network(n))?;
    let (domain, contracts) = batch.domain(network);
    let target = Target {
        network: network.name.clone(),
        chain: network.chain.clone(),
        settlement: contracts.settlement,
        domain,
    };
    Ok((target, network))
}

/// A `claim`: its rows, signed by the server's authorizer or by routerd's.
pub(super) async fn claim(
    batch: &EvmBatch,
    request: &BatchRequest,
) -> Result<SettleResponse, SettleError> {
    let answer = Answer::to(request);
    let (target, job, claimed) = match claim_job(batch, request).await? {
        Ok(prepared) => prepared,
        Err(refused) => return Ok(answer.refused(refused)),
    };
    let packed = batch.packer.submit(target.clone(), job).await;
    let settled = answer.of(packed, BatchReason::ClaimTransactionFailed);
    if settled.success {
        mirror_claims(batch, &target, &claimed).await;
    }
    Ok(settled)
}

/// Records in the mirror what a settled claim caused: a node that answers the state from
/// before it must not pass a voucher at or below it. A channel the mirror knows nothing of is
/// read first, for the fields a claim leaves as they were.
async fn mirror_claims(batch: &EvmBatch, target: &Target, claimed: &[(H256, u128)]) {
    let network = &target.network;
    for &(channel, total) in claimed {
        if batch.mirror.claimed(network, channel, total, None).await {
            continue;
        }
        let read = verify::read(&target.chain, target.settlement, channel, Vec::new()).await;
        if let Ok(Ok(read)) = read {
            let state = Some(read.state);
            batch.mirror.claimed(network, channel, total, state).await;
        }
    }
}

/// Where a claim row names the token its channel holds.
const CLAIMED_TOKEN: &str = "paymentPayload.payload.claims[].voucher.channel.token";

/// Each claimed channel and the total its row claims.
type ClaimedTotals = Vec<(H256, u128)>;

async fn claim_job(
    batch: &EvmBatch,
    request: &BatchRequest,
) -> Result<Result<(Target, Job, ClaimedTotals), Refusal>, SettleError> {
    let BatchPayload::Claim(wire::ClaimPayload {
        claims,
        claim_authorizer_signature,
    }) = &request.payment_payload.payload
    else {
        unreachable!("a claim payload");
    };
    let checked = (|| {
        let (target, network) = target(batch, request)?;
        let rows = wire::claim_rows(BatchReason::ClaimPayload, claims)?;
        verify::served(
            network,
            rows.iter().map(|r| (r.channel.token, CLAIMED_TOKEN)),
        )?;
        let pay_to = parse_address(&request.payment_requirements.pay_to);
        check_rows(&rows, pay_to, batch.packer.max_calls())?;
        let field = "claimAuthorizerSignature";
        let reason = BatchReason::ClaimPayload;
        let signature = wire::signature(reason, field, claim_authorizer_signature.as_deref())?;
        match &signature {
            Some(signature) => check_claim_signer(target.domain, &rows, signature)?,
            None => routerd_signs(batch, rows.iter().map(|r| r.channel.receiver_authorizer))?,
        }
        Ok((target, rows, signature))
    })();
    let (target, rows, signature) = match checked {
        Ok(checked) => checked,
        Err(refused) => return Ok(Err(refused)),
    };
    let rows = match advancing(&target, rows, signature.is_none()).await? {
        Ok(rows) => rows,
        Err(refused) => return Ok(Err(refused)),
    };
    let claimed = rows
        .iter()
        .map(|r| (leaf::channel_id(target.domain, &r.channel), r.total_claimed))
        .collect();
    let job = match signature {
        Some(signature) => {
            let call = leaf::claim_with_signature(&rows, &signature);
            Job::new(vec![call], Vec::new(), None)
        }
        None => Job::new(Vec::new(), rows, None),
    };
    let tried = try_job(batch, &target, &job, BatchReason::ClaimSimulationFailed).await?;
    Ok(tried.map(|()| (target, job, claimed)))
}

/// The rows that claim more than their channel has claimed on chain (the contract skips the
/// others, and a transaction of them alone would cost the operator gas and move nothing). Rows
/// routerd signs for are cut to these; a server's signature covers its rows as they are, sent
/// whole when any of them claims more.
async fn advancing(
    target: &Target,
    rows: Vec<ClaimRow>,
    cut: bool,
) -> Result<Result<Vec<ClaimRow>, Refusal>, SettleError> {
    let channels: Vec<H256> = rows
        .iter()
        .map(|r| leaf::channel_id(target.domain, &r.channel))
        .collect();
    let totals = {
        let _read = target.chain.client.admit(Budget::Settle)?;
        verify::claimed_totals(&target.chain, target.settlement, &channels).await?
    };
    let totals = match totals {
        Ok(totals) => totals,
        Err(refused) => return Ok(Err(refused)),
    };
    let advances: Vec<bool> = rows
        .iter()
        .zip(&totals)
        .map(|(row, on_chain)| row.total_claimed > *on_chain)
        .collect();
    if !advances.contains(&true) {
        return Ok(Err(Refusal::new(
            BatchReason::ClaimPayload,
            "paymentPayload.payload.claims: every row is at or below what its channel has claimed: nothing to claim",
        )));
    }
    Ok(Ok(match cut {
        true => rows
            .into_iter()
            .zip(advances)
            .filter_map(|(row, advances)| advances.then_some(row))
            .collect(),
        false => rows,
    }))
}

/// Rows of a claim: some, no more than one transaction packs
/// (`facilitator.batch_max_calls_per_tx`), each of a channel paying the requirements' payTo (an
/// API key scoped to a payTo claims for it alone), none above its voucher's signed ceiling.
fn check_rows(rows: &[ClaimRow], pay_to: Option<Address>, max: usize) -> Result<(), Refusal> {
    let refuse = |message: String| Err(Refusal::new(BatchReason::ClaimPayload, message));
    if rows.is_empty() {
        return refuse("paymentPayload.payload.claims: empty".to_string());
    }
    if rows.len() > max {
        return refuse(format!(
            "paymentPayload.payload.claims: {} rows, above the {max} one transaction packs (facilitator.batch_max_calls_per_tx)",
            rows.len()
        ));
    }
    if let Some(i) = rows.iter().position(|r| Some(r.channel.receiver) != pay_to) {
        return Err(Refusal::new(
            BatchReason::ReceiverMismatch,
            format!("paymentPayload.payload.claims[{i}].voucher.channel.receiver is not paymentRequirements.payTo"),
        ));
    }
    match rows.iter().position(|r| r.total_claimed > r.max_claimable) {
        Some(i) => refuse(format!(
            "paymentPayload.payload.claims[{i}].totalClaimed exceeds its voucher's maxClaimableAmount"
        )),
        None => Ok(()),
    }
}

/// The server's `ClaimBatch` signature is its rows' one receiver authorizer's.
fn check_claim_signer(domain: H256, rows: &[ClaimRow], signature: &[u8]) -> Result<(), Refusal> {
    let signer = erc3009::recover(leaf::claim_batch_digest(domain, rows), signature);
    match rows.iter().all(|r| Some(r.channel.receiver_authorizer) == signer) {
        true => Ok(()),
        false => Err(Refusal::new(
            BatchReason::AuthorizerAddressMismatch,
            "paymentPayload.payload.claimAuthorizerSignature is not the signature of every row's receiverAuthorizer",
        )),
    }
}

/// routerd signs for these receiver authorizers only when each is its own key.
fn routerd_signs(
    batch: &EvmBatch,
    authorizers: impl Iterator<Item = Address>,
) -> Result<(), Refusal> {
    let Some(own) = &batch.authorizer else {
        return Err(Refusal::new(
            BatchReason::AuthorizerNotConfigured,
            "routerd has no receiver authorizer key: the payload must carry its authorizer's signature",
        ));
    };
    let mut authorizers = authorizers;
    match authorizers.all(|a| a == own.address()) {
        true => Ok(()),
        false => Err(Refusal::new(
            BatchReason::AuthorizerAddressMismatch,
            "a channel's receiverAuthorizer is not routerd's and the payload carries no signature of it",
        )),
    }
}

/// The job's calls tried on the contract as they would be sent (routerd's claim rows signed
/// over this job's alone): `Ok(Err)` when they would revert.
async fn try_job(
    batch: &EvmBatch,
    target: &Target,
    job: &Job,
    reason: BatchReason,
) -> Result<Result<(), Refusal>, SettleError> {
    let mut calls = Vec::new();
    if let (false, Some(authorizer)) = (job.rows.is_empty(), &batch.authorizer) {
        let signature = sign_claims(authorizer, target.domain, &job.rows);
        calls.push(leaf::claim_with_signature(&job.rows, &signature));
    }
    calls.extend(job.calls.iter().cloned());
    calls.extend(job.sweep.map(|s| leaf::settle(s.receiver, s.token)));
    let _read = target.chain.client.admit(Budget::Settle)?;
    let mut read = Batch::new();
    let slot = read.add(chain::eth_call(
        target.settlement,
        &leaf::multicall(&calls),
        "latest",
    ));
    let answers = target.chain.client.ask(Traffic::Callers, &read).await?;
    Ok(match answers.get(slot) {
        Ok(_) => Ok(()),
        Err(e) => Err(Refusal::new(
            reason,
            format!("the contract would revert: {e}"),
        )),
    })
}

/// A sweep: what the receiver claimed and was not paid, moved to it.
pub(super) async fn sweep(
    batch: &EvmBatch,
    request: &BatchRequest,
) -> Result<SettleResponse, SettleError> {
    let payload = &request.payment_payload.payload;
    let answer = Answer::to(request);
    let BatchPayload::Settle(wire::SettlePayload { receiver, token }) = payload else {
        unreachable!("a settle payload");
    };
    let pay_to = parse_address(&request.payment_requirements.pay_to);
    let checked = target(batch, request).and_then(|(t, network)| {
        let (receiver, token) = wire::sweep(receiver, token)?;
        verify::served(network, [(token, "paymentPayload.payload.token")])?;
        match Some(receiver) == pay_to {
            // An API key scoped to a payTo sweeps for it alone.
            true => Ok((t, (receiver, token))),
            false => Err(Refusal::new(
                BatchReason::ReceiverMismatch,
                "paymentPayload.payload.receiver is not paymentRequirements.payTo",
            )),
        }
    });
    let (target, (receiver, token)) = match checked {
        Ok(checked) => checked,
        Err(refused) => return Ok(answer.refused(refused)),
    };
    let claimed = match owed(&target, receiver, token).await? {
        Ok(claimed) => claimed,
        Err(refused) => return Ok(answer.refused(refused)),
    };
    let sweep = Sweep {
        receiver,
        token,
        claimed,
    };
    let job = Job::new(Vec::new(), Vec::new(), Some(sweep));
    let packed = batch.packer.submit(target.clone(), job).await;
    let mut settled = answer.of(packed, BatchReason::SettleTransactionFailed);
    if settled.success {
        let swept = swept(&target, &settled.transaction, receiver, token).await;
        settled.amount = Some(swept.map_or_else(String::new, |a| a.to_string()));
    }
    Ok(settled)
}

/// The receiver's claimed total in `token`, or `Ok(Err)` when it has nothing claimed and
/// unsettled.
async fn owed(
    target: &Target,
    receiver: Address,
    token: Address,
) -> Result<Result<u128, Refusal>, SettleError> {
    let _read = target.chain.client.admit(Budget::Settle)?;
    let mut read = Batch::new();
    let data = leaf::receivers(receiver, token);
    let slot = read.add(chain::eth_call(target.settlement, &data, "latest"));
    let answers = target.chain.client.ask(Traffic::Callers, &read).await?;
    let words = answers
        .get(slot)
        .as_ref()
        .ok()
        .and_then(Value::as_str)
        .and_then(hex_decode);
    Ok(match words.as_deref().and_then(leaf::two_words) {
        None => Err(Refusal::new(
            BatchReason::RpcReadFailed,
            "the receiver's claimed total could not be read",
        )),
        Some((claimed, settled)) if claimed <= settled => Err(Refusal::new(
            BatchReason::NothingToSettle,
            "the receiver has nothing claimed and unsettled in this token",
        )),
        Some((claimed, _)) => Ok(claimed),
    })
}

/// What the transaction's `Settled` event paid `receiver` in `token`.
async fn swept(
    target: &Target,
    transaction: &str,
    receiver: Address,
    token: Address,
) -> Option<u128> {
    let hash = crate::evm::parse_h256(transaction)?;
    let logs = receipt_logs(&target.chain, hash).await?;
    let topics = [
        *leaf::SETTLED_TOPIC,
        address_topic(receiver),
        address_topic(token),
    ];
    logs.iter()
        .filter(|log| log.is(target.settlement, &topics))
        .find_map(Log::last_u128)
}

/// A cooperative refund: the server's claims and refund, signed by its authorizer, or by
/// routerd's for a caller whose API key is scoped to the channel's receiver. `voucher` and
/// `erc1271` are what `EvmBatch::check_voucher` found of the request.
/// A refund's answer, and whether its transaction may still land (pending, or its fate unknown).
pub(super) struct Refunded {
    pub answer: SettleResponse,
    pub may_land: bool,
}

pub(super) async fn refund(
    batch: &EvmBatch,
    request: &BatchRequest,
    asking: &Asking,
    (voucher, erc1271): (wire::Voucher, Option<verify::Asked>),
) -> Result<Refunded, SettleError> {
    let answer = Answer::to(request);
    let prepared = match refund_job(batch, request, asking, voucher, erc1271).await? {
        Ok(prepared) => prepared,
        Err(refused) => {
            let answer = answer.refused(refused);
            return Ok(Refunded {
                answer,
                may_land: false,
            });
        }
    };
    let (target, job, channel) = prepared;
    let packed = batch.packer.submit(target.clone(), job).await;
    let may_land = packed.may_land();
    let mut settled = answer.of(packed, BatchReason::RefundTransactionFailed);
    if settled.success {
        let refunded = refunded(&target, &settled.transaction, channel).await;
        settled.amount = Some(refunded.map_or_else(String::new, |a| a.to_string()));
        let after = verify::read(&target.chain, target.settlement, channel, Vec::new()).await?;
        if let Ok(read) = after {
            let state = batch.mirror.judge(&target.network, channel, read.state);
            let state = state.await;
            settled.extra = Some(json!({ "channelState": state.snapshot(channel) }));
        }
    }
    Ok(Refunded {
        answer: settled,
        may_land,
    })
}

/// What a refund's transaction returned to the payer (`Refunded`).
async fn refunded(target: &Target, transaction: &str, channel: H256) -> Option<u128> {
    let hash = crate::evm::parse_h256(transaction)?;
    let logs = receipt_logs(&target.chain, hash).await?;
    let topics = [*leaf::REFUNDED_TOPIC, channel];
    logs.iter()
        .filter(|log| log.is(target.settlement, &topics))
        .find_map(Log::last_u128)
}

/// The refund's calls, checked against the channel read now.
async fn refund_job(
    batch: &EvmBatch,
    request: &BatchRequest,
    asking: &Asking,
    voucher: wire::Voucher,
    erc1271: Option<verify::Asked>,
) -> Result<Result<(Target, Job, H256), Refusal>, SettleError> {
    let target = match target(batch, request) {
        Ok((target, _)) => target,
        Err(refused) => return Ok(Err(refused)),
    };
    let asks_wallet = erc1271.is_some();
    let read = {
        let _read = target.chain.client.admit(Budget::Settle)?;
        let asked = erc1271.into_iter().collect();
        verify::read(&target.chain, target.settlement, voucher.channel_id, asked).await?
    };
    let read = match read {
        Ok(read) => read,
        Err(refused) => return Ok(Err(refused)),
    };
    if asks_wallet && !verify::erc1271_accepts(read.extra[0].as_ref()) {
        return Ok(Err(Refusal::new(
            BatchReason::VoucherSignature,
            "paymentPayload.payload.voucher.signature: the payer's wallet does not accept it (ERC-1271)",
        )));
    }
    let network = &target.network;
    let state = batch.mirror.judge(network, voucher.channel_id, read.state);
    let state = state.await;
    let calls = verify::check_state(&state, voucher.max_claimable, 0, true)
        .and_then(|()| refund_calls(batch, request, asking, &target, voucher.channel_id, &state));
    let job = match calls {
        Ok(calls) => Job::new(calls, Vec::new(), None),
        Err(refused) => return Ok(Err(refused)),
    };
    let tried = try_job(batch, &target, &job, BatchReason::RefundSimulationFailed).await?;
    Ok(tried.map(|()| (target, job, voucher.channel_id)))
}

/// The refund's calls: its claims (when they claim more), then `refundWithSignature`.
fn refund_calls(
    batch: &EvmBatch,
    request: &BatchRequest,
    asking: &Asking,
    target: &Target,
    channel: H256,
    state: &ChannelState,
) -> Result<Vec<Bytes>, Refusal> {
    let BatchPayload::Refund(wire::RefundPayload {
        channel_config,
        amount,
        refund_nonce,
        claims,
        refund_authorizer_signature,
        claim_authorizer_signature,
        ..
    }) = &request.payment_payload.payload
    else {
        unreachable!("a refund payload");
    };
    let reason = BatchReason::RefundPayload;
    let config = wire::config(reason, channel_config)?;
    let rows = wire::claim_rows(reason, claims)?;
    let claimed = rows
        .iter()
        .filter(|r| leaf::channel_id(target.domain, &r.channel) == channel)
        .map(|r| r.total_claimed)
        .fold(state.total_claimed, u128::max);
    let available = state.balance.saturating_sub(claimed);
    let amount = refund_amount(amount.as_deref(), available)?;
    let nonce = wire::refund_nonce(refund_nonce.as_deref())?.unwrap_or(state.refund_nonce);
    if nonce != state.refund_nonce {
        return Err(Refusal::new(
            reason,
            format!(
                "paymentPayload.payload.refundNonce: the channel's is {}",
                state.refund_nonce
            ),
        ));
    }
    let mut calls = Vec::new();
    if rows.iter().any(|r| r.total_claimed > state.total_claimed) {
        let field = "claimAuthorizerSignature";
        let given = wire::signature(reason, field, claim_authorizer_signature.as_deref())?;
        let signature = match given {
            Some(signature) => {
                check_claim_signer(target.domain, &rows, &signature)?;
                signature.to_vec()
            }
            None => sign_for_refund(batch, asking, &config, |a| {
                sign_claims(a, target.domain, &rows)
            })?,
        };
        calls.push(leaf::claim_with_signature(&rows, &signature));
    }
    let digest = leaf::refund_digest(target.domain, channel, nonce, amount);
    let field = "refundAuthorizerSignature";
    let signature = match wire::signature(reason, field, refund_authorizer_signature.as_deref())? {
        Some(signature) if erc3009::recover(digest, &signature) == Some(config.receiver_authorizer) => {
            signature.to_vec()
        }
        Some(_) => {
            return Err(Refusal::new(
                BatchReason::AuthorizerAddressMismatch,
                "paymentPayload.payload.refundAuthorizerSignature is not the channel's receiverAuthorizer's",
            ))
        }
        None => sign_for_refund(batch, asking, &config, |a| a.sign_hash(digest))?,
    };
    calls.push(leaf::refund_with_signature(
        &config, amount, nonce, &signature,
    ));
    Ok(calls)
}

/// The refunded amount: the one asked (above 0), or all the channel holds unclaimed.
fn refund_amount(asked: Option<&str>, available: u128) -> Result<u128, Refusal> {
    if available == 0 {
        return Err(Refusal::new(
            BatchReason::RefundNoBalance,
            "the channel holds nothing unclaimed to refund",
        ));
    }
    match wire::refund_amount(asked).map_err(|mut r| {
        r.reason = BatchReason::RefundAmountInvalid;
        r
    })? {
        Some(0) => Err(Refusal::new(
            BatchReason::RefundAmountInvalid,
            "paymentPayload.payload.amount: must be above 0",
        )),
        Some(amount) => Ok(amount),
        None => Ok(available),
    }
}

/// routerd's signature for a refund's claim or refund: only with its own authorizer key, for
/// the channel that names it, asked by a caller whose API key is scoped to the receiver.
fn sign_for_refund(
    batch: &EvmBatch,
    asking: &Asking,
    config: &ChannelConfig,
    sign: impl FnOnce(&crate::signer::Authorizer) -> [u8; 65],
) -> Result<Vec<u8>, Refusal> {
    routerd_signs(batch, std::iter::once(config.receiver_authorizer))?;
    if !asking.payee_scoped {
        return Err(Refusal::new(
            BatchReason::AuthorizerNotConfigured,
            "routerd signs a refund only for a caller whose API key is scoped to the channel's receiver (pay_to): send the receiver authorizer's signatures, or settle with such a key",
        ));
    }
    let authorizer = batch.authorizer.as_ref().expect("checked by routerd_signs");
    Ok(sign(authorizer).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refund_returns_what_is_asked_or_all_that_is_unclaimed() {
        assert_eq!(refund_amount(None, 700), Ok(700));
        assert_eq!(refund_amount(Some("300"), 700), Ok(300));
        let reason = |asked, available| refund_amount(asked, available).err().map(|r| r.reason);
        assert_eq!(
            reason(Some("0"), 700),
            Some(BatchReason::RefundAmountInvalid)
        );
        assert_eq!(
            reason(Some("-1"), 700),
            Some(BatchReason::RefundAmountInvalid)
        );
        assert_eq!(reason(None, 0), Some(BatchReason::RefundNoBalance));
    }

    #[test]
    fn claim_rows_are_some_and_none_above_its_ceiling() {
        let row = |max, total| ClaimRow {
            channel: ChannelConfig {
                payer: Address::repeat_byte(1),
                payer_authorizer: Address::repeat_byte(1),
                receiver: Address::repeat_byte(2),
                receiver_authorizer: Address::repeat_byte(3),
                token: Address::repeat_byte(4),
                withdraw_delay: 900,
                salt: H256::zero(),
            },
            max_claimable: max,
            signature: Bytes::new(),
            total_claimed: total,
        };
        let payee = Some(Address::repeat_byte(2));
        assert!(check_rows(&[row(5, 5), row(5, 1)], payee, 100).is_ok());
        let over = check_rows(&[row(5, 5), row(5, 6)], payee, 100).unwrap_err();
        assert_eq!(over.reason, BatchReason::ClaimPayload);
        assert!(over.message.contains("claims[1]"), "{}", over.message);
        let empty = check_rows(&[], payee, 100).unwrap_err();
        assert_eq!(empty.reason, BatchReason::ClaimPayload);
        let many = check_rows(&[row(5, 5), row(5, 5), row(5, 5)], payee, 2).unwrap_err();
        assert_eq!(many.reason, BatchReason::ClaimPayload);
        assert!(
            many.message.contains("batch_max_calls_per_tx"),
            "{}",
            many.message
        );
        let elsewhere = check_rows(&[row(5, 5)], Some(Address::repeat_byte(9)), 100).unwrap_err();
        assert_eq!(elsewhere.reason, BatchReason::ReceiverMismatch);
    }
}
