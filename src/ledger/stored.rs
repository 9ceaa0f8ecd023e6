//! How a record is stored: the one flat layout every release has written, whatever its family.
//! A Solana record keeps, in the fields an EVM one stores its authorization in, what earlier
//! releases wrote there (its key's digest as the nonce, the first 20 bytes of its mint and of its
//! source token account as token and payer, zeros and empties in the rest), so records of either
//! release read the same and their keys and account keys stay those the stores index them by.
//! The family's part is told by the `svm` field: absent on every EVM record, as earlier releases
//! wrote them.

use std::borrow::Cow;

use ethers_core::types::{Address, Bytes, H256, U256};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::family::{EvmPart, Family, SvmPart, SvmSettlement};
use super::keys::Account;
use super::record::{Attempt, Outcome, Record, RequestTag, State, TransferMethod};

/// A record as it is written: fields in the order, and under the names, earlier releases wrote.
#[derive(Serialize)]
struct Written<'a> {
    network: &'a str,
    token: Address,
    payer: Address,
    pay_to: Address,
    value: U256,
    nonce: H256,
    valid_before: u64,
    digest: H256,
    #[serde(skip_serializing_if = "TransferMethod::is_eip3009")]
    method: TransferMethod,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    approves_permit2: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    via: Option<Address>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sender: Option<Address>,
    calldata: Cow<'a, Bytes>,
    gas_limit: u64,
    request: &'a Option<RequestTag>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payment_id: Option<&'a String>,
    state: State,
    attempts: &'a [Attempt],
    outcome: &'a Option<Outcome>,
    lost: bool,
    finished_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    svm: Option<&'a SvmSettlement>,
}

/// A record as it is read: what earlier releases left out reads as they meant it (no Permit2,
/// no request tag, no Solana part).
#[derive(Deserialize)]
struct Read {
    network: String,
    token: Address,
    payer: Address,
    pay_to: Address,
    value: U256,
    nonce: H256,
    valid_before: u64,
    digest: H256,
    #[serde(default)]
    method: TransferMethod,
    #[serde(default)]
    approves_permit2: bool,
    #[serde(default)]
    via: Option<Address>,
    #[serde(default)]
    sender: Option<Address>,
    calldata: Bytes,
    gas_limit: u64,
    #[serde(default)]
    request: Option<RequestTag>,
    #[serde(default)]
    payment_id: Option<String>,
    state: State,
    attempts: Vec<Attempt>,
    outcome: Option<Outcome>,
    lost: bool,
    finished_at: Option<u64>,
    #[serde(default)]
    svm: Option<SvmSettlement>,
}

/// What a record's family writes in the authorization's fields.
fn written_family(record: &Record) -> Written<'_> {
    let shared = |token, payer, nonce, calldata| Written {
        network: &record.network,
        token,
        payer,
        pay_to: Address::zero(),
        value: record.value,
        nonce,
        valid_before: 0,
        digest: record.digest,
        method: TransferMethod::Eip3009,
        approves_permit2: false,
        via: None,
        sender: None,
        calldata,
        gas_limit: 0,
        request: &record.request,
        payment_id: record.payment_id.as_ref(),
        state: record.state,
        attempts: &[],
        outcome: &record.outcome,
        lost: record.lost,
        finished_at: record.finished_at,
        svm: None,
    };
    match &record.family {
        Family::Evm(evm) => Written {
            pay_to: evm.pay_to,
            valid_before: evm.valid_before,
            method: evm.method,
            approves_permit2: evm.approves_permit2,
            via: evm.via,
            sender: evm.sender,
            gas_limit: evm.gas_limit,
            attempts: &evm.attempts,
            ..shared(
                evm.token,
                evm.payer,
                evm.nonce,
                Cow::Borrowed(&evm.calldata),
            )
        },
        Family::Svm(svm) => Written {
            svm: Some(&svm.settlement),
            ..shared(
                svm.exposed.asset,
                svm.exposed.payer,
                H256(svm.signature_digest),
                Cow::Owned(Bytes::new()),
            )
        },
    }
}

impl From<Read> for Record {
    fn from(read: Read) -> Record {
        let family = match read.svm {
            Some(settlement) => Family::Svm(SvmPart {
                signature_digest: read.nonce.0,
                exposed: Account {
                    network: read.network.clone(),
                    asset: read.token,
                    payer: read.payer,
                },
                settlement,
            }),
            None => Family::Evm(EvmPart {
                token: read.token,
                payer: read.payer,
                pay_to: read.pay_to,
                nonce: read.nonce,
                valid_before: read.valid_before,
                method: read.method,
                approves_permit2: read.approves_permit2,
                via: read.via,
                sender: read.sender,
                calldata: read.calldata,
                gas_limit: read.gas_limit,
                attempts: read.attempts,
            }),
        };
        Record {
            network: read.network,
            value: read.value,
            digest: read.digest,
            request: read.request,
            payment_id: read.payment_id,
            state: read.state,
            outcome: read.outcome,
            lost: read.lost,
            finished_at: read.finished_at,
            family,
        }
    }
}

impl Serialize for Record {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        written_family(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Read::deserialize(deserializer).map(Record::from)
    }
}
