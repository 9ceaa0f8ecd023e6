//! Why a `batch-settlement` payment is refused, with the binding's reason names
//! (`scheme_batch_settlement_evm.md`, "Error Codes").

/// A refusal: its reason, and words naming the field or the fact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: BatchReason,
    pub message: String,
}

impl Refusal {
    pub fn new(reason: BatchReason, message: impl Into<String>) -> Self {
        Refusal {
            reason,
            message: message.into(),
        }
    }
}

/// The reasons routerd answers, in the binding's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchReason {
    Scheme,
    /// `invalid_network`: no served EVM network of that name (as for every scheme).
    Network,
    NetworkMismatch,
    PayloadType,
    VoucherPayload,
    DepositPayload,
    RefundPayload,
    ChannelIdMismatch,
    ReceiverMismatch,
    ReceiverAuthorizerMismatch,
    TokenMismatch,
    WithdrawDelayMismatch,
    WithdrawDelayOutOfRange,
    VoucherSignature,
    ChannelNotFound,
    CumulativeExceedsBalance,
    CumulativeBelowClaimed,
    RpcReadFailed,
    MissingEip712Domain,
    Erc3009AuthorizationRequired,
    Permit2InvalidSpender,
    Permit2AmountMismatch,
    Permit2DeadlineExpired,
    Permit2InvalidSignature,
    Permit2AllowanceRequired,
    Eip2612Format,
    Eip2612FromMismatch,
    Eip2612AssetMismatch,
    Eip2612SpenderNotPermit2,
    Eip2612AmountMismatch,
    Eip2612DeadlineExpired,
    ValidBefore,
    ValidAfter,
    ReceiveAuthorizationSignature,
    InsufficientBalance,
    DepositSimulationFailed,
    DepositTransactionFailed,
    ClaimPayload,
    ClaimSimulationFailed,
    ClaimTransactionFailed,
    SettlePayload,
    NothingToSettle,
    SettleTransactionFailed,
    RefundAmountInvalid,
    RefundNoBalance,
    RefundSimulationFailed,
    RefundTransactionFailed,
    AuthorizerAddressMismatch,
    AuthorizerNotConfigured,
    ChannelBusy,
}

impl BatchReason {
    pub fn name(self) -> &'static str {
        use BatchReason::*;
        match self {
            Scheme => "invalid_batch_settlement_evm_scheme",
            Network => "invalid_network",
            NetworkMismatch => "invalid_batch_settlement_evm_network_mismatch",
            PayloadType => "invalid_batch_settlement_evm_payload_type",
            VoucherPayload => "invalid_batch_settlement_evm_voucher_payload",
            DepositPayload => "invalid_batch_settlement_evm_deposit_payload",
            RefundPayload => "invalid_batch_settlement_evm_refund_payload",
            ChannelIdMismatch => "invalid_batch_settlement_evm_channel_id_mismatch",
            ReceiverMismatch => "invalid_batch_settlement_evm_receiver_mismatch",
            ReceiverAuthorizerMismatch => {
                "invalid_batch_settlement_evm_receiver_authorizer_mismatch"
            }
            TokenMismatch => "invalid_batch_settlement_evm_token_mismatch",
            WithdrawDelayMismatch => "invalid_batch_settlement_evm_withdraw_delay_mismatch",
            WithdrawDelayOutOfRange => "invalid_batch_settlement_evm_withdraw_delay_out_of_range",
            VoucherSignature => "invalid_batch_settlement_evm_voucher_signature",
            ChannelNotFound => "invalid_batch_settlement_evm_channel_not_found",
            CumulativeExceedsBalance => "invalid_batch_settlement_evm_cumulative_exceeds_balance",
            CumulativeBelowClaimed => "invalid_batch_settlement_evm_cumulative_below_claimed",
            RpcReadFailed => "invalid_batch_settlement_evm_rpc_read_failed",
            MissingEip712Domain => "invalid_batch_settlement_evm_missing_eip712_domain",
            Erc3009AuthorizationRequired => {
                "invalid_batch_settlement_evm_erc3009_authorization_required"
            }
            Permit2InvalidSpender => "invalid_batch_settlement_evm_permit2_invalid_spender",
            Permit2AmountMismatch => "invalid_batch_settlement_evm_permit2_amount_mismatch",
            Permit2DeadlineExpired => "invalid_batch_settlement_evm_permit2_deadline_expired",
            Permit2InvalidSignature => "invalid_batch_settlement_evm_permit2_invalid_signature",
            Permit2AllowanceRequired => "invalid_batch_settlement_evm_permit2_allowance_required",
            // The official facilitator answers the extension's own names, but for its amount.
            Eip2612Format => "invalid_eip2612_extension_format",
            Eip2612FromMismatch => "eip2612_from_mismatch",
            Eip2612AssetMismatch => "eip2612_asset_mismatch",
            Eip2612SpenderNotPermit2 => "eip2612_spender_not_permit2",
            Eip2612AmountMismatch => "invalid_batch_settlement_evm_eip2612_amount_mismatch",
            Eip2612DeadlineExpired => "eip2612_deadline_expired",
            ValidBefore => "invalid_batch_settlement_evm_payload_authorization_valid_before",
            ValidAfter => "invalid_batch_settlement_evm_payload_authorization_valid_after",
            ReceiveAuthorizationSignature => {
                "invalid_batch_settlement_evm_receive_authorization_signature"
            }
            InsufficientBalance => "invalid_batch_settlement_evm_insufficient_balance",
            DepositSimulationFailed => "invalid_batch_settlement_evm_deposit_simulation_failed",
            DepositTransactionFailed => "invalid_batch_settlement_evm_deposit_transaction_failed",
            ClaimPayload => "invalid_batch_settlement_evm_claim_payload",
            ClaimSimulationFailed => "invalid_batch_settlement_evm_claim_simulation_failed",
            ClaimTransactionFailed => "invalid_batch_settlement_evm_claim_transaction_failed",
            SettlePayload => "invalid_batch_settlement_evm_settle_payload",
            NothingToSettle => "invalid_batch_settlement_evm_nothing_to_settle",
            SettleTransactionFailed => "invalid_batch_settlement_evm_settle_transaction_failed",
            RefundAmountInvalid => "invalid_batch_settlement_evm_refund_amount_invalid",
            RefundNoBalance => "invalid_batch_settlement_evm_refund_no_balance",
            RefundSimulationFailed => "invalid_batch_settlement_evm_refund_simulation_failed",
            RefundTransactionFailed => "invalid_batch_settlement_evm_refund_transaction_failed",
            AuthorizerAddressMismatch => "invalid_batch_settlement_evm_authorizer_address_mismatch",
            AuthorizerNotConfigured => "invalid_batch_settlement_evm_authorizer_not_configured",
            ChannelBusy => "invalid_batch_settlement_evm_channel_busy",
        }
    }
}
