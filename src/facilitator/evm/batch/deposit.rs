//! A deposit: the payer's ERC-3009 `receiveWithAuthorization` to the ERC-3009 collector, or its
//! Permit2 `PermitWitnessTransferFrom` to the Permit2 collector, lowered into the `exact`
//! pipeline's request with the settlement contract's `deposit` as the call that executes it. The
//! pipeline judges the authorization (signature, time, balance, nonce, Permit2's allowance, the
//! call tried) and settles it under the ledger's rules; the channel's rules are checked beside it.

use ethers_core::types::{H256, U256};

use super::reason::{BatchReason, Refusal};
use super::verify::{self, ChannelState};
use super::wire::{self, BatchPayload, BatchRequest, Erc3009Deposit, Permit2Deposit};
use super::{payer_of, EvmBatch};
use crate::chain::Budget;
use crate::evm::batch::{self as leaf, ChannelConfig};
use crate::evm::erc3009::TransferAuthorization;
use crate::evm::{erc6492, hex_bytes};
use crate::facilitator::evm::lower;
use crate::facilitator::evm::request::{Method, Request, Through};
use crate::facilitator::evm::verify::Network;
use crate::facilitator::outcome::{Invalid, SettleError};
use crate::facilitator::protocol::v1::SettleResponse;
use crate::facilitator::protocol::v2::{self, SETTLEMENT_PENDING};
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
    let BatchPayload::Deposit(wire::DepositPayload {
        channel_config,
        deposit,
        ..
    }) = &request.payment_payload.payload
    else {
        unreachable!("lowered only for a deposit payload");
    };
    let config = wire::config(BatchReason::DepositPayload, channel_config)?;
    let extra = request.payment_requirements.extra.as_ref();
    let named = |key: &str| extra.and_then(|e| e.get(key)).and_then(|v| v.as_str());
    let channel = voucher.channel_id;
    let request = match wire::permit2_deposit(deposit, named("assetTransferMethod"))? {
        Some(permit) => {
            check_permit2(network, &config, channel, &permit, &contracts)?;
            let sponsored = v2::eip2612_extension(request);
            permit2_request(network, &config, &permit, contracts, sponsored)?
        }
        None => {
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
            exact_request(network, &config, channel, &deposit, contracts)?
        }
    };
    Ok(Lowered {
        network,
        channel,
        max_claimable: voucher.max_claimable,
        amount: request.amount.as_u128(),
        request,
        settlement: contracts.settlement,
    })
}

/// The collector's ERC-6492 unwrapped signature: the one the token or Permit2 checks.
fn inner_signature(signature: &[u8], field: &str) -> Result<Vec<u8>, Refusal> {
    match erc6492::unwrap(signature) {
        Ok(Some(wrapped)) => Ok(wrapped.inner.to_vec()),
        Ok(None) => Ok(signature.to_vec()),
        Err(_) => Err(Refusal::new(
            BatchReason::DepositPayload,
            format!("paymentPayload.payload.deposit.authorization.{field}.signature: an ERC-6492 wrapper that does not decode"),
        )),
    }
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
    let inner = inner_signature(&deposit.signature, "erc3009Authorization")?;
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

/// A Permit2 deposit's terms against the channel and the served configuration, in the order the
/// official facilitator checks them; its deadline and signature are the pipeline's.
fn check_permit2(
    network: &Network,
    config: &ChannelConfig,
    channel: H256,
    permit: &Permit2Deposit,
    contracts: &super::Contracts,
) -> Result<(), Refusal> {
    const FIELD: &str = "paymentPayload.payload.deposit.authorization.permit2Authorization";
    let refuse = |reason, what: &str| Err(Refusal::new(reason, format!("{FIELD}.{what}")));
    if permit.from != config.payer {
        return refuse(
            BatchReason::Permit2InvalidSignature,
            "from: not channelConfig.payer",
        );
    }
    if permit.spender != contracts.permit2_collector {
        return refuse(
            BatchReason::Permit2InvalidSpender,
            "spender: not the Permit2 deposit collector",
        );
    }
    if permit.token != config.token {
        return refuse(
            BatchReason::TokenMismatch,
            "permitted.token: not paymentRequirements.asset",
        );
    }
    if permit.permitted != U256::from(permit.amount) {
        return refuse(
            BatchReason::Permit2AmountMismatch,
            "permitted.amount: not deposit.amount",
        );
    }
    if permit.channel != channel {
        return refuse(
            BatchReason::ChannelIdMismatch,
            "witness.channelId: not voucher.channelId",
        );
    }
    let served = network
        .tokens
        .iter()
        .any(|t| t.address == config.token && t.permit2);
    if !served {
        return Err(Refusal::new(
            BatchReason::TokenMismatch,
            "paymentRequirements.asset: not a token routerd takes Permit2 deposits of on that network",
        ));
    }
    Ok(())
}

/// A Permit2 deposit as `exact` settles a Permit2 payment: from the payer to the Permit2
/// collector (the spender), its Permit2 nonce the payment's, executed by `deposit(config,
/// amount, collector, collectorData)`; with the `eip2612GasSponsoring` permit (`sponsored`) the
/// collector submits first, for a payer that has not approved Permit2.
fn permit2_request(
    network: &Network,
    config: &ChannelConfig,
    permit: &Permit2Deposit,
    contracts: super::Contracts,
    sponsored: Option<&serde_json::Value>,
) -> Result<Request, Refusal> {
    let collector = contracts.permit2_collector;
    let inner = inner_signature(&permit.signature, "permit2Authorization")?;
    let mut nonce = [0u8; 32];
    permit.nonce.to_big_endian(&mut nonce);
    let mut request = Request {
        network: network.name.clone(),
        asset: config.token,
        pay_to: collector,
        amount: permit.amount.into(),
        resource: String::new(),
        max_timeout_seconds: 0,
        authorization: TransferAuthorization {
            from: config.payer,
            to: collector,
            value: permit.amount.into(),
            valid_after: U256::zero(),
            valid_before: permit.deadline,
            nonce: H256(nonce),
        },
        method: Method::Permit2Deposit {
            channel: permit.channel,
        },
        eip2612: None,
        signature: permit.signature.to_vec(),
        through: None,
    };
    if let Some(extension) = sponsored {
        let checked = lower::permit(extension, &request).map_err(|f| refusal(f, true))?;
        request.eip2612 = Some(checked);
    }
    let eip2612 = request.eip2612.as_ref().map(leaf::eip2612_permit_data);
    let data = leaf::permit2_collector_data(
        permit.nonce,
        permit.deadline,
        &inner,
        eip2612.as_deref().unwrap_or_default(),
    );
    request.through = Some(Through {
        contract: contracts.settlement,
        calldata: leaf::deposit(config, permit.amount, collector, &data),
    });
    Ok(request)
}

/// The `exact` pipeline's refusal in the binding's words: a Permit2 deposit's deadline,
/// signature and allowance in the Permit2 ones.
fn refusal(failure: Invalid, permit2: bool) -> Refusal {
    let reason = match failure.reason {
        Reason::ValidBefore if permit2 => BatchReason::Permit2DeadlineExpired,
        Reason::Signature | Reason::SignatureAddress if permit2 => {
            BatchReason::Permit2InvalidSignature
        }
        Reason::Permit2Allowance => BatchReason::Permit2AllowanceRequired,
        Reason::Eip2612Format => BatchReason::Eip2612Format,
        Reason::Eip2612From => BatchReason::Eip2612FromMismatch,
        Reason::Eip2612Asset => BatchReason::Eip2612AssetMismatch,
        Reason::Eip2612Spender => BatchReason::Eip2612SpenderNotPermit2,
        Reason::Eip2612Amount => BatchReason::Eip2612AmountMismatch,
        Reason::Eip2612Deadline => BatchReason::Eip2612DeadlineExpired,
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
        Err(failure) => return Ok(Err(refusal(failure, lowered.request.method.is_permit2()))),
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
        return Ok(Err(refusal(failure, lowered.request.method.is_permit2())));
    }
    let state = match channel? {
        Ok(read) => read.state,
        Err(refused) => return Ok(Err(refused)),
    };
    let state = (batch.mirror)
        .judge(&lowered.network.name, lowered.channel, state)
        .await;
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
        let state = match before {
            Ok(read) => {
                let name = &lowered.network.name;
                batch.mirror.judge(name, lowered.channel, read.state).await
            }
            Err(refused) => return Ok(super::refused_settle(payload, network, refused)),
        };
        let checked = verify::check_state(&state, lowered.max_claimable, lowered.amount, false);
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
        let mut refused = refusal(failure, lowered.request.method.is_permit2());
        if reverted {
            refused.reason = BatchReason::DepositTransactionFailed;
        }
        answer.error_reason = Some(refused.reason.name().to_string());
        answer.error_message = Some(refused.message);
        answer.amount = None;
        return Ok(answer);
    }
    let after = verify::read(chain, lowered.settlement, lowered.channel, Vec::new()).await?;
    if let Ok(read) = after {
        let name = &lowered.network.name;
        let state = batch.mirror.judge(name, lowered.channel, read.state).await;
        let snapshot = state.snapshot(lowered.channel);
        answer.extra = Some(serde_json::json!({ "channelState": snapshot }));
    }
    Ok(answer)
}
