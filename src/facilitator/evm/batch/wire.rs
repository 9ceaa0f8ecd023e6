//! `batch-settlement`'s payloads as x402 v2 carries them (`paymentPayload.payload`, by its
//! `type`), and their values parsed into the contract's terms. A value that does not parse is
//! refused naming its field, under the payload's own reason.

use ethers_core::types::{Address, Bytes, H256, U256};
use serde::Deserialize;
use serde_json::{Number, Value};

use super::reason::{BatchReason, Refusal};
use crate::evm::batch::{ChannelConfig, ClaimRow};
use crate::evm::{hex_decode, parse_address, parse_h256, parse_uint};
use crate::facilitator::protocol::read::read_value;
use crate::facilitator::protocol::v2;

/// A `batch-settlement` request: v2's envelope around one of its payloads.
pub type BatchRequest = v2::PaymentRequest<BatchPayload>;

/// The payload, by `type`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum BatchPayload {
    Deposit(DepositPayload),
    Voucher(VoucherPayload),
    /// A cooperative refund; the server completes it (nonce, claims, its signatures) before
    /// settling it.
    Refund(RefundPayload),
    /// The server's claim of its channels' latest vouchers.
    Claim(ClaimPayload),
    /// The server's sweep of what it claimed.
    Settle(SettlePayload),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DepositPayload {
    pub channel_config: WireConfig,
    pub voucher: WireVoucher,
    pub deposit: WireDeposit,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VoucherPayload {
    pub channel_config: WireConfig,
    pub voucher: WireVoucher,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefundPayload {
    pub channel_config: WireConfig,
    pub voucher: WireVoucher,
    #[serde(default)]
    pub amount: Option<String>,
    #[serde(default)]
    pub refund_nonce: Option<String>,
    #[serde(default)]
    pub claims: Vec<WireClaim>,
    #[serde(default)]
    pub refund_authorizer_signature: Option<String>,
    #[serde(default)]
    pub claim_authorizer_signature: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimPayload {
    pub claims: Vec<WireClaim>,
    #[serde(default)]
    pub claim_authorizer_signature: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SettlePayload {
    pub receiver: String,
    pub token: String,
}

/// Why a payload did not read, naming its field: read again as its own type alone, since the
/// tagged read of the whole request loses the path below `paymentPayload.payload`. `None` when
/// it names no type of the scheme's (the tagged read's message says so already).
pub fn why_not(payload: Value, prefix: &str) -> Option<String> {
    let at = match prefix {
        "" => "paymentPayload.payload".to_string(),
        prefix => format!("{prefix}.paymentPayload.payload"),
    };
    let kind = payload.get("type")?.as_str()?.to_string();
    match kind.as_str() {
        "deposit" => read_value::<DepositPayload>(payload, &[], &at).err(),
        "voucher" => read_value::<VoucherPayload>(payload, &[], &at).err(),
        "refund" => read_value::<RefundPayload>(payload, &[], &at).err(),
        "claim" => read_value::<ClaimPayload>(payload, &[], &at).err(),
        "settle" => read_value::<SettlePayload>(payload, &[], &at).err(),
        _ => None,
    }
}

/// One row of a claim as the server sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireClaim {
    pub voucher: WireClaimVoucher,
    pub signature: String,
    pub total_claimed: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireClaimVoucher {
    pub channel: WireConfig,
    pub max_claimable_amount: String,
}

impl BatchPayload {
    pub fn kind(&self) -> &'static str {
        match self {
            BatchPayload::Deposit(_) => "deposit",
            BatchPayload::Voucher(_) => "voucher",
            BatchPayload::Refund(_) => "refund",
            BatchPayload::Claim(_) => "claim",
            BatchPayload::Settle(_) => "settle",
        }
    }

    /// The payload's channel config and voucher, for the three kinds a payer signs.
    pub fn channel(&self) -> Option<(&WireConfig, &WireVoucher)> {
        match self {
            BatchPayload::Deposit(p) => Some((&p.channel_config, &p.voucher)),
            BatchPayload::Voucher(p) => Some((&p.channel_config, &p.voucher)),
            BatchPayload::Refund(p) => Some((&p.channel_config, &p.voucher)),
            _ => None,
        }
    }

    /// The reason a malformed value of this payload is refused under.
    pub fn malformed(&self) -> BatchReason {
        match self {
            BatchPayload::Deposit(_) => BatchReason::DepositPayload,
            BatchPayload::Refund(_) => BatchReason::RefundPayload,
            _ => BatchReason::VoucherPayload,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireConfig {
    pub payer: String,
    pub payer_authorizer: String,
    pub receiver: String,
    pub receiver_authorizer: String,
    pub token: String,
    pub withdraw_delay: Number,
    pub salt: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireVoucher {
    pub channel_id: String,
    pub max_claimable_amount: String,
    pub signature: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireDeposit {
    pub amount: String,
    pub authorization: WireDepositAuthorization,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireDepositAuthorization {
    #[serde(default)]
    pub erc3009_authorization: Option<WireErc3009>,
    #[serde(default)]
    pub permit2_authorization: Option<Value>,
}

/// A Permit2 deposit's authorization, as the official client sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePermit2 {
    from: String,
    permitted: WirePermitted,
    spender: String,
    nonce: String,
    deadline: String,
    witness: WireDepositWitness,
    signature: String,
}

#[derive(Debug, Clone, Deserialize)]
struct WirePermitted {
    token: String,
    amount: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireDepositWitness {
    channel_id: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireErc3009 {
    pub valid_after: String,
    pub valid_before: String,
    pub salt: String,
    pub signature: String,
}

/// A voucher's values.
#[derive(Debug, Clone)]
pub struct Voucher {
    pub channel_id: H256,
    pub max_claimable: u128,
    pub signature: Bytes,
}

/// An ERC-3009 deposit's values.
#[derive(Debug, Clone)]
pub struct Erc3009Deposit {
    pub amount: u128,
    pub valid_after: U256,
    pub valid_before: U256,
    pub salt: U256,
    pub signature: Bytes,
}

/// A Permit2 deposit's values: the deposit's amount, and the permit the payer signed.
#[derive(Debug, Clone)]
pub struct Permit2Deposit {
    pub amount: u128,
    pub from: Address,
    pub token: Address,
    pub permitted: U256,
    pub spender: Address,
    pub nonce: U256,
    pub deadline: U256,
    pub channel: H256,
    pub signature: Bytes,
}

const PAYLOAD: &str = "paymentPayload.payload";

/// Reads one value, or refuses naming `field` under `reason`.
fn read<T>(
    reason: BatchReason,
    field: &str,
    value: Option<T>,
    expected: &str,
) -> Result<T, Refusal> {
    value.ok_or_else(|| Refusal::new(reason, format!("{PAYLOAD}.{field}: expected {expected}")))
}

fn amount(reason: BatchReason, field: &str, text: &str) -> Result<u128, Refusal> {
    let value = parse_uint(text)
        .filter(|v| v.bits() <= 128)
        .map(|v| v.as_u128());
    read(reason, field, value, "a decimal uint128")
}

fn address(reason: BatchReason, field: &str, text: &str) -> Result<Address, Refusal> {
    read(reason, field, parse_address(text), "a 0x address")
}

fn bytes(reason: BatchReason, field: &str, text: &str) -> Result<Bytes, Refusal> {
    let decoded = text
        .strip_prefix("0x")
        .and_then(|_| hex_decode(text))
        .filter(|b| !b.is_empty() && b.len() <= 4096);
    read(
        reason,
        field,
        decoded.map(Bytes::from),
        "0x-hex bytes (at most 4,096)",
    )
}

pub fn config(reason: BatchReason, wire: &WireConfig) -> Result<ChannelConfig, Refusal> {
    let field = |name: &str| format!("channelConfig.{name}");
    let delay = wire.withdraw_delay.as_u64().filter(|d| *d < 1 << 40);
    Ok(ChannelConfig {
        payer: address(reason, &field("payer"), &wire.payer)?,
        payer_authorizer: address(reason, &field("payerAuthorizer"), &wire.payer_authorizer)?,
        receiver: address(reason, &field("receiver"), &wire.receiver)?,
        receiver_authorizer: address(
            reason,
            &field("receiverAuthorizer"),
            &wire.receiver_authorizer,
        )?,
        token: address(reason, &field("token"), &wire.token)?,
        withdraw_delay: read(reason, &field("withdrawDelay"), delay, "a uint40")?,
        salt: read(
            reason,
            &field("salt"),
            parse_h256(&wire.salt),
            "0x + 64 hex digits",
        )?,
    })
}

pub fn voucher(reason: BatchReason, wire: &WireVoucher) -> Result<Voucher, Refusal> {
    let id = parse_h256(&wire.channel_id);
    Ok(Voucher {
        channel_id: read(reason, "voucher.channelId", id, "0x + 64 hex digits")?,
        max_claimable: amount(
            reason,
            "voucher.maxClaimableAmount",
            &wire.max_claimable_amount,
        )?,
        signature: bytes(reason, "voucher.signature", &wire.signature)?,
    })
}

/// The deposit's amount: above 0.
fn deposit_amount(wire: &WireDeposit) -> Result<u128, Refusal> {
    let reason = BatchReason::DepositPayload;
    let deposited = amount(reason, "deposit.amount", &wire.amount)?;
    if deposited == 0 {
        return Err(Refusal::new(
            reason,
            format!("{PAYLOAD}.deposit.amount: must be above 0"),
        ));
    }
    Ok(deposited)
}

/// An ERC-3009 deposit's values; a deposit with neither authorization, or with a Permit2 one the
/// requirements do not ask for (`Some("eip3009")`), is refused.
pub fn erc3009_deposit(wire: &WireDeposit) -> Result<Erc3009Deposit, Refusal> {
    let reason = BatchReason::DepositPayload;
    let Some(auth) = &wire.authorization.erc3009_authorization else {
        return Err(Refusal::new(
            BatchReason::Erc3009AuthorizationRequired,
            format!("{PAYLOAD}.deposit.authorization.erc3009Authorization: required (or permit2Authorization, unless paymentRequirements.extra.assetTransferMethod is \"eip3009\")"),
        ));
    };
    let field = |name: &str| format!("deposit.authorization.erc3009Authorization.{name}");
    let uint =
        |name: &str, text: &str| read(reason, &field(name), parse_uint(text), "a decimal uint256");
    Ok(Erc3009Deposit {
        amount: deposit_amount(wire)?,
        valid_after: uint("validAfter", &auth.valid_after)?,
        valid_before: uint("validBefore", &auth.valid_before)?,
        salt: uint("salt", &auth.salt)?,
        signature: bytes(reason, &field("signature"), &auth.signature)?,
    })
}

/// A Permit2 deposit's values, when the deposit is one: it carries `permit2Authorization` and no
/// `erc3009Authorization`, and the requirements' `assetTransferMethod` (`hint`) is not
/// `"eip3009"`, as the official facilitator chooses.
pub fn permit2_deposit(
    wire: &WireDeposit,
    hint: Option<&str>,
) -> Result<Option<Permit2Deposit>, Refusal> {
    let authorization = &wire.authorization;
    let (None, Some(value)) = (
        &authorization.erc3009_authorization,
        &authorization.permit2_authorization,
    ) else {
        return Ok(None);
    };
    if hint == Some("eip3009") {
        return Ok(None);
    }
    let reason = BatchReason::DepositPayload;
    let prefix = "deposit.authorization.permit2Authorization";
    let auth = WirePermit2::deserialize(value)
        .map_err(|e| Refusal::new(reason, format!("{PAYLOAD}.{prefix}: {e}")))?;
    let field = |name: &str| format!("{prefix}.{name}");
    let uint =
        |name: &str, text: &str| read(reason, &field(name), parse_uint(text), "a decimal uint256");
    let channel = parse_h256(&auth.witness.channel_id);
    Ok(Some(Permit2Deposit {
        amount: deposit_amount(wire)?,
        from: address(reason, &field("from"), &auth.from)?,
        token: address(reason, &field("permitted.token"), &auth.permitted.token)?,
        permitted: uint("permitted.amount", &auth.permitted.amount)?,
        spender: address(reason, &field("spender"), &auth.spender)?,
        nonce: uint("nonce", &auth.nonce)?,
        deadline: uint("deadline", &auth.deadline)?,
        channel: read(
            reason,
            &field("witness.channelId"),
            channel,
            "0x + 64 hex digits",
        )?,
        signature: bytes(reason, &field("signature"), &auth.signature)?,
    }))
}

/// A claim's rows, each named by its place (`claims[i]`).
pub fn claim_rows(reason: BatchReason, wire: &[WireClaim]) -> Result<Vec<ClaimRow>, Refusal> {
    let row = |(i, claim): (usize, &WireClaim)| {
        let field = |name: &str| format!("claims[{i}].{name}");
        let channel = config(reason, &claim.voucher.channel).map_err(|mut refused| {
            refused.message = refused.message.replace(
                &format!("{PAYLOAD}.channelConfig"),
                &format!("{PAYLOAD}.claims[{i}].voucher.channel"),
            );
            refused
        })?;
        Ok(ClaimRow {
            channel,
            max_claimable: amount(
                reason,
                &field("voucher.maxClaimableAmount"),
                &claim.voucher.max_claimable_amount,
            )?,
            signature: bytes(reason, &field("signature"), &claim.signature)?,
            total_claimed: amount(reason, &field("totalClaimed"), &claim.total_claimed)?,
        })
    };
    wire.iter().enumerate().map(row).collect()
}

/// An optional signature of the payload's, named by its field.
pub fn signature(
    reason: BatchReason,
    field: &str,
    text: Option<&str>,
) -> Result<Option<Bytes>, Refusal> {
    text.map(|t| bytes(reason, field, t)).transpose()
}

/// A sweep's receiver and token.
pub fn sweep(receiver: &str, token: &str) -> Result<(Address, Address), Refusal> {
    let reason = BatchReason::SettlePayload;
    Ok((
        address(reason, "receiver", receiver)?,
        address(reason, "token", token)?,
    ))
}

/// A refund's nonce, when the payload names one.
pub fn refund_nonce(text: Option<&str>) -> Result<Option<U256>, Refusal> {
    let reason = BatchReason::RefundPayload;
    text.map(|t| read(reason, "refundNonce", parse_uint(t), "a decimal uint256"))
        .transpose()
}

/// A refund's amount, when the payload names one.
pub fn refund_amount(text: Option<&str>) -> Result<Option<u128>, Refusal> {
    text.map(|t| amount(BatchReason::RefundPayload, "amount", t))
        .transpose()
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_payload_that_does_not_read_is_named_to_its_field() {
        let voucher = serde_json::json!({
            "type": "voucher",
            "channelConfig": {"payer": "0x", "payerAuthorizer": "0x", "receiver": "0x",
                "receiverAuthorizer": "0x", "token": "0x", "withdrawDelay": 900, "salt": "0x"},
            "voucher": {"channelId": "0x", "maxClaimableAmount": "1", "signature": {"r": 1}},
        });
        let named = why_not(voucher.clone(), "").expect("does not read");
        assert!(
            named.starts_with("paymentPayload.payload.voucher.signature: invalid type: map"),
            "{named}"
        );
        let mut missing = voucher;
        missing["channelConfig"]
            .as_object_mut()
            .unwrap()
            .remove("salt");
        let named = why_not(missing, "[1]").expect("does not read");
        assert_eq!(
            named,
            "[1].paymentPayload.payload.channelConfig.salt: missing"
        );
        assert_eq!(why_not(serde_json::json!({"type": "other"}), ""), None);
    }

    use serde_json::json;

    use super::*;

    fn deposit(erc3009: bool, permit2: bool) -> WireDeposit {
        let mut authorization = serde_json::Map::new();
        if erc3009 {
            authorization.insert(
                "erc3009Authorization".into(),
                json!({"validAfter": "0", "validBefore": "9", "salt": "1", "signature": "0x01"}),
            );
        }
        if permit2 {
            authorization.insert(
                "permit2Authorization".into(),
                json!({
                    "from": format!("0x{}", "11".repeat(20)),
                    "permitted": {"token": format!("0x{}", "22".repeat(20)), "amount": "5"},
                    "spender": "0x4020425FAf3B746C082C2f942b4E5159887B0005",
                    "nonce": "7",
                    "deadline": "9",
                    "witness": {"channelId": format!("0x{}", "33".repeat(32))},
                    "signature": "0x01",
                }),
            );
        }
        serde_json::from_value(json!({"amount": "5", "authorization": authorization})).unwrap()
    }

    #[test]
    fn a_deposit_goes_through_permit2_only_with_no_erc3009_authorization_and_no_eip3009_hint() {
        let permit = permit2_deposit(&deposit(false, true), Some("permit2")).unwrap();
        let permit = permit.expect("a Permit2 deposit");
        assert_eq!((permit.amount, permit.permitted), (5, 5.into()));
        assert_eq!((permit.nonce, permit.deadline), (7.into(), 9.into()));
        assert_eq!(permit.channel, H256::repeat_byte(0x33));
        // The official client sends no hint when the requirements carry none.
        assert!(permit2_deposit(&deposit(false, true), None)
            .unwrap()
            .is_some());
        // An ERC-3009 authorization, or requirements that ask for one, keep the ERC-3009 path.
        assert!(permit2_deposit(&deposit(true, true), Some("permit2"))
            .unwrap()
            .is_none());
        assert!(permit2_deposit(&deposit(false, true), Some("eip3009"))
            .unwrap()
            .is_none());
        let refused = erc3009_deposit(&deposit(false, true)).unwrap_err();
        assert_eq!(refused.reason, BatchReason::Erc3009AuthorizationRequired);
    }

    #[test]
    fn a_permit2_authorization_that_does_not_parse_is_named() {
        let mut wire = deposit(false, true);
        let auth = wire.authorization.permit2_authorization.as_mut().unwrap();
        auth["deadline"] = json!("soon");
        let refused = permit2_deposit(&wire, None).unwrap_err();
        assert_eq!(refused.reason, BatchReason::DepositPayload);
        assert!(refused
            .message
            .contains("deposit.authorization.permit2Authorization.deadline"));
        auth_without(&mut wire, "witness");
        let refused = permit2_deposit(&wire, None).unwrap_err();
        assert!(refused.message.contains("witness"), "{}", refused.message);
    }

    fn auth_without(wire: &mut WireDeposit, key: &str) {
        let auth = wire.authorization.permit2_authorization.as_mut().unwrap();
        auth.as_object_mut().unwrap().remove(key);
    }
}
