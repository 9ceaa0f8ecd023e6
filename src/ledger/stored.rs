//! How a record is stored: the one flat layout every release has written, whatever its family.
//! A Solana record keeps, in the fields an EVM one stores its authorization in, what the landed
//! Solana release wrote there (its key's digest as the nonce, the first 20 bytes of its mint and
//! of its source token account as token and payer, zeros and empties in the rest), so records of
//! either release read the same in both. The family's part is told by the `svm` field: absent on
//! every EVM record, as earlier releases wrote them.
//!
//! A Solana record's account is its mint and source in full (`svm.mint`, `svm.source`). A record
//! of the landed Solana release has no `svm.source`: its account is the 20 bytes of each that
//! release keyed it by (`SvmAccount::Landed`), read from its token and payer fields, so that its
//! exposure is removed under the key it was indexed under.

use std::borrow::Cow;

use ethers_core::types::{Address, Bytes, H256, U256};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use solana_pubkey::Pubkey;

use super::family::{EvmPart, Family, SvmPart, SvmSettlement};
use super::keys::SvmAccount;
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
        Family::Svm(svm) => {
            // What the landed Solana release wrote there, still written so that it reads the
            // record as it wrote it.
            let (mint, source) = svm.exposed.landed_key();
            Written {
                svm: Some(&svm.settlement),
                ..shared(
                    Address::from(mint),
                    Address::from(source),
                    H256(svm.signature_digest),
                    Cow::Owned(Bytes::new()),
                )
            }
        }
    }
}

/// Why a stored record does not read as one.
#[derive(Debug, thiserror::Error)]
enum Unreadable {
    #[error("{field} is not a Solana key: {text:?}")]
    NotAKey { field: &'static str, text: String },
}

/// The account a Solana record's exposure counts against: its mint and source in full, or, for
/// a record of the landed Solana release (it stored no source), the 20 bytes of each that
/// release keyed it by, from the token and payer fields.
fn svm_account(
    settlement: &SvmSettlement,
    token: Address,
    payer: Address,
) -> Result<SvmAccount, Unreadable> {
    let Some(source) = &settlement.source else {
        return Ok(SvmAccount::Landed {
            mint: token.0,
            source: payer.0,
        });
    };
    let key = |field, text: &str| {
        text.parse::<Pubkey>().map_err(|_| Unreadable::NotAKey {
            field,
            text: text.to_string(),
        })
    };
    Ok(SvmAccount::Whole {
        mint: key("svm.mint", &settlement.mint)?,
        source: key("svm.source", source)?,
    })
}

impl TryFrom<Read> for Record {
    type Error = Unreadable;

    fn try_from(read: Read) -> Result<Record, Unreadable> {
        let family = match read.svm {
            Some(settlement) => Family::Svm(SvmPart {
                signature_digest: read.nonce.0,
                exposed: svm_account(&settlement, read.token, read.payer)?,
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
        Ok(Record {
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
        })
    }
}

impl Serialize for Record {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        written_family(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let read = Read::deserialize(deserializer)?;
        Record::try_from(read).map_err(serde::de::Error::custom)
    }
}
