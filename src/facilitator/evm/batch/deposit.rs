//! A deposit: the payer's ERC-3009 `receiveWithAuthorization` to the collector, lowered into the
//! `exact` pipeline's request with the settlement contract's `deposit` as the call that executes
//! it. The pipeline judges the authorization (signature, time, balance, nonce, the call tried)
//! and settles it under the ledger's rules; the channel's rules are checked beside it.

use ethers_core::types::H256;

use super::reason::{BatchReason, Refusal};
use super::verify::{self, ChannelState};
use super::wire::{self, BatchPayload, BatchRequest, Erc3009Deposit};
use super::{payer_of, EvmBatch};
use crate::chain::Budget;
use crate::evm::batch::{self as leaf, ChannelConfig};
use crate::evm::erc3009::TransferAuthorization;
use crate::evm::{erc6492, hex_bytes};
use crate::facilitator::evm::request::{Method, Request, Through};
use crate::facilitator::evm::verify::Network;
use crate::facilitator::outcome::{Invalid, SettleError};
use crate::facilitator::protocol::v1::SettleResponse;
use crate::facilitator::protocol::v2::SETTLEMENT_PENDING;
use crate::facilitator::settlement::ClaimOn;
use crate::ledger::{Asking, Reason};

/// A deposit checked as far as it needs no chain, and lowered.
struct Lowered<'a> {
    network: &'a Network,
    channel: H256,
    max_claimable: u128,
    amount: u128,
    request: Request,
    settlement: ethers_core::types::Address,
}

fn lower<'a>(batch: &'a EvmBatch, request: &BatchRequest) -> Result<Lowered<'a>, Refusal> {
    let (network, contracts, voucher, erc1271) = batch.check_voucher(request)?;
    if erc1271.is_some() {
        // Deposits are taken from payers whose voucher signer is an EOA: the read beside the
        // settle pipeline's is the channel's alone.
        return Err(Refusal::new(
            BatchReason::VoucherSignature,
            "paymentPayload.payload.voucher.signature does not recover to the channel's payer",
        ));
    }
    let BatchPayload::Deposit {
        channel_config,
        deposit,
        ..
    } = &request.payment_payload.payload
    else {
        unreachable!("lowered only for a deposit payload");
    };
    let config = wire::config(BatchReason::DepositPayload, channel_config)?;
    let extra = request.payment_requirements.extra.as_ref();
    let named = |key: &str| extra.and_then(|e| e.get(key)).and_then(|v| v.as_str());
    if named("name").is_none() || named("version").is_none() {
        return Err(Refusal::new(
            BatchReason::MissingEip712Domain,
            "paymentRequirements.extra.name and .version: required (the token's EIP-712 domain)",
        ));
    }
    let deposit = wire::erc3009_deposit(deposit)?;
    let token = network
        .tokens
        .iter()
        .find(|t| t.address == config.token && t.eip3009);
    if token.is_none() {
        return Err(Refusal::new(
            BatchReason::TokenMismatch,
            "paymentRequirements.asset: not a token routerd takes ERC-3009 deposits of on that network",
        ));
    }
    let request = exact_request(network, &config, voucher.channel_id, &deposit, contracts)?;
    Ok(Lowered {
        network,
        channel: voucher.channel_id,
        max_claimable: voucher.max_claimable,
        amount: deposit.amount,
        request,
        settlement: contracts.settlement,
    })
}

/// The deposit as `exact` settles an authorization: from the payer to the collector, its nonce
/// bound to the channel, executed by `deposit(config, amount, collector, collectorData)`.
fn exact_request(
    network: &Network,
    config: &ChannelConfig,
    channel: H256,
    deposit: &Erc3009Deposit,
    contracts: super::Contracts,
) -> Result<Request, Refusal> {
    let collector = contracts.erc3009_collector;
    // The collector hands the token the signature itself: an ERC-6492 wrapper's inner one.
    let inner = match erc6492::unwrap(&deposit.signature) {
        Ok(Some(wrapped)) => wrapped.inner.to_vec(),
        Ok(None) => deposit.signature.to_vec(),
        Err(_) => {
            return Err(Refusal::new(
                BatchReason::DepositPayload,
                "paymentPayload.payload.deposit.authorization.erc3009Authorization.signature: an ERC-6492 wrapper that does not decode",
            ))
        }
    };
    let data = leaf::erc3009_collector_data(
        deposit.valid_after,
        deposit.valid_before,
        deposit.salt,
        &inner,
    );
    Ok(Request {
        network: network.name.clone(),
        asset: config.token,
        pay_to: collector,
        amount: deposit.amount.into(),
        resource: String::new(),
        max_timeout_seconds: 0,
        authorization: TransferAuthorization {
            from: config.payer,
            to: collector,
            value: deposit.amount.into(),
            valid_after: deposit.valid_after,
            valid_before: deposit.valid_before,
            nonce: leaf::deposit_nonce(channel, deposit.salt),
        },
        method: Method::Eip3009Receive,
        eip2612: None,
        signature: deposit.signature.to_vec(),
        through: Some(Through {
            contract: contracts.settlement,
            calldata: leaf::deposit(config, deposit.amount, collector, &data),
        }),
    })
}

/// The `exact` pipeline's refusal in the binding's words.
fn refusal(failure: Invalid) -> Refusal {
    let reason = match failure.reason {
        Reason::ValidBefore => BatchReason::ValidBefore,
        Reason::ValidAfter => BatchReason::ValidAfter,
        Reason::Signature | Reason::SignatureAddress => BatchReason::ReceiveAuthorizationSignature,
        Reason::InsufficientFunds => BatchReason::InsufficientBalance,
        Reason::Network => BatchReason::Network,
        // Told to every settle of a deposit another request settled: its transaction is named.
        Reason::AlreadySettled => BatchReason::DepositPayload,
        Reason::Payload if failure_reverts(&failure) => BatchReason::DepositSimulationFailed,
        _ => BatchReason::DepositPayload,
    };
    let message = failure
        .message
        .render(crate::facilitator::protocol::v2::path);
    Refusal::new(reason, message)
}

fn failure_reverts(failure: &Invalid) -> bool {
    let text = failure
        .message
        .render(crate::facilitator::protocol::v2::path);
    text.contains("would revert")
}

/// Verify of a deposit: the authorization as `exact` verifies it, and the channel's rules
/// against its balance with the deposit added.
pub(super) async fn verify(
    batch: &EvmBatch,
    request: &BatchRequest,
) -> Result<Result<(H256, ChannelState), Refusal>, SettleError> {
    let lowered = match lower(batch, request) {
        Ok(lowered) => lowered,
        Err(refused) => return Ok(Err(refused)),
    };
    let payment = match batch.verifier.check_local(&lowered.request) {
        Ok(payment) => payment,
        Err(failure) => return Ok(Err(refusal(failure))),
    };
    let used = match batch.settler.claim_on(&payment).await? {
        None => None,
        Some(ClaimOn::BeingSettled) => Some("the deposit authorization is already being settled"),
        Some(ClaimOn::Settled) => Some("the deposit authorization is already settled"),
    };
    if let Some(message) = used {
        return Ok(Err(Refusal::new(BatchReason::DepositPayload, message)));
    }
    let _read = lowered.network.chain.client.admit(Budget::Verify)?;
    let chain = &lowered.network.chain;
    let channel_read = verify::read(chain, lowered.settlement, lowered.channel, Vec::new());
    let (authorization, channel) =
        tokio::join!(batch.verifier.check_on_chain(&payment), channel_read);
    if let Err(failure) = authorization? {
        return Ok(Err(refusal(failure)));
    }
    let state = match channel? {
        Ok(read) => read.state,
        Err(refused) => return Ok(Err(refused)),
    };
    Ok(
        verify::check_state(&state, lowered.max_claimable, lowered.amount, false)
            .map(|()| (lowered.channel, state)),
    )
}

/// Whether the ledger holds a claim of this deposit's authorization.
async fn known(batch: &EvmBatch, lowered: &Lowered<'_>) -> Result<bool, SettleError> {
    match batch.verifier.check_local(&lowered.request) {
        Ok(payment) => Ok(batch.settler.claim_on(&payment).await?.is_some()),
        Err(_) => Ok(false),
    }
}

/// A deposit broadcast and not yet answered at the deadline: v2's `settlement_pending`, with
/// its transaction, for the caller to settle again.
fn pending(payload: &BatchPayload, network: String, hash: H256) -> SettleResponse {
    SettleResponse {
        success: false,
        error_reason: Some(SETTLEMENT_PENDING.to_string()),
        error_message: Some(SettleError::Pending(Some(hash)).to_string()),
        payer: payer_of(payload),
        transaction: hex_bytes(hash),
        network,
        amount: None,
        extra: None,
    }
}

/// Settle of a deposit: the channel's rules, then the authorization through the settle
/// pipeline; a success answers the deposit's transaction, its amount and the channel after it.
pub(super) async fn settle(
    batch: &EvmBatch,
    request: &BatchRequest,
    asking: &Asking,
) -> Result<SettleResponse, SettleError> {
    let payload = &request.payment_payload.payload;
    let network = request.payment_requirements.network.clone();
    let lowered = match lower(batch, request) {
        Ok(lowered) => lowered,
        Err(refused) => return Ok(super::refused_settle(payload, network, refused)),
    };
    let chain = &lowered.network.chain;
    // A deposit the ledger knows is answered by it (its claimant told the success, anybody else
    // the transaction), whatever the channel holds since.
    if !known(batch, &lowered).await? {
        let before = {
            let _read = chain.client.admit(Budget::Settle)?;
            verify::read(chain, lowered.settlement, lowered.channel, Vec::new()).await?
        };
        let checked = before.and_then(|read| {
            verify::check_state(&read.state, lowered.max_claimable, lowered.amount, false)
        });
        if let Err(refused) = checked {
            return Ok(super::refused_settle(payload, network, refused));
        }
    }
    let begun = batch.settler.begin(&lowered.request, asking).await?;
    let settled = match batch.settler.finish(begun, asking).await {
        Ok(settled) => settled,
        Err(SettleError::Pending(Some(hash))) => return Ok(pending(payload, network, hash)),
        Err(other) => return Err(other),
    };
    let mut answer = SettleResponse {
        success: settled.success,
        error_reason: None,
        error_message: None,
        payer: payer_of(payload),
        transaction: settled.transaction.map(hex_bytes).unwrap_or_default(),
        network,
        amount: Some(lowered.amount.to_string()),
        extra: None,
    };
    if !settled.success {
        let failure = Invalid {
            reason: settled.reason.unwrap_or(Reason::Payload),
            message: settled.message.unwrap_or_else(|| "".into()),
        };
        let reverted = failure.reason == Reason::Payload && settled.transaction.is_some();
        let mut refused = refusal(failure);
        if reverted {
            refused.reason = BatchReason::DepositTransactionFailed;
        }
        answer.error_reason = Some(refused.reason.name().to_string());
        answer.error_message = Some(refused.message);
        answer.amount = None;
        return Ok(answer);
    }
    let after = verify::read(chain, lowered.settlement, lowered.channel, Vec::new()).await?;
    let state = after.map(|read| read.state.snapshot(lowered.channel)).ok();
    answer.extra = state.map(|s| serde_json::json!({ "channelState": s }));
    Ok(answer)
}
