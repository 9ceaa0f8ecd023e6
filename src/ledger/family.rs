//! What a settlement holds in its family's terms, beside what every settlement shares: an EVM
//! one its authorization, its transaction and the attempts that carried it; a Solana one its one
//! signed transaction. Neither holds the other's fields: the stored layout that an earlier
//! release wrote (one flat record, a Solana one with the EVM fields zeroed) is `stored`'s alone.

use std::ops::{Deref, DerefMut};

use ethers_core::types::{Address, Bytes, H256};
use serde::{Deserialize, Serialize};

use super::keys::{Permit2Nonce, SvmAccount};
use super::record::{Attempt, Record, State, TransferMethod};

/// A settlement's family and what it holds in that family's terms.
#[derive(Debug, Clone)]
pub enum Family {
    Evm(EvmPart),
    Svm(SvmPart),
}

/// An EVM settlement: the authorization, the transaction that carries it, and every signed
/// attempt at sending it.
#[derive(Debug, Clone)]
pub struct EvmPart {
    pub token: Address,
    pub payer: Address,
    pub pay_to: Address,
    pub nonce: H256,
    pub valid_before: u64,
    /// How the funds move; records from before Permit2 read as ERC-3009.
    pub method: TransferMethod,
    /// A Permit2 settlement that first submits the payer's EIP-2612 permit approving Permit2
    /// (`settleWithPermit`): that permit spends the token's permit nonce and sets the allowance.
    pub approves_permit2: bool,
    /// The contract the settlement transaction calls when it is not the token: Multicall3, when
    /// the payer's wallet is deployed in the same transaction (ERC-6492).
    pub via: Option<Address>,
    /// The only signer that may send it: an `upto` witness's facilitator (x402's upto proxy
    /// takes the transaction from nobody else). `None`: any signer of the network.
    pub sender: Option<Address>,
    /// The settlement transaction's calldata (`transferWithAuthorization`, or Multicall3's
    /// `aggregate3` around it), kept so the settlement can be re-signed.
    pub calldata: Bytes,
    pub gas_limit: u64,
    pub attempts: Vec<Attempt>,
}

/// A Solana settlement: its key's digest, the token account its exposure counts against, and
/// its one signed transaction.
#[derive(Debug, Clone)]
pub struct SvmPart {
    /// The SHA-256 of its fee payer's signature: its `PaymentId::Svm`.
    pub signature_digest: [u8; 32],
    /// The mint and source token account its exposure counts against (in full, or as a record
    /// of the landed Solana release names them); its network is the record's.
    pub exposed: SvmAccount,
    pub settlement: SvmSettlement,
}

/// A Solana settlement: one transaction, signed by routerd's fee payer and stored with the claim
/// (the write-ahead), before it is ever sent. Keys and signatures are base58, as Solana writes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SvmSettlement {
    /// The transaction id: the fee payer's signature.
    pub signature: String,
    /// The signed wire transaction, base64: sent again, byte for byte, while it may land.
    pub transaction: String,
    /// An upper bound of its blockhash's `lastValidBlockHeight` (the cluster's latest blockhash's
    /// when it was claimed): past it with the signature unknown, it can never land.
    pub last_valid_block_height: u64,
    /// The transfer's authority.
    pub payer: String,
    pub pay_to: String,
    pub mint: String,
    /// The transfer's source token account. Records of the landed Solana release have none:
    /// their account is read from what that release stored (`SvmAccount::Landed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub amount: u64,
    /// The error the transaction failed with on chain, as the node wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl EvmPart {
    /// Where the settlement transaction goes.
    pub fn call_target(&self) -> Address {
        self.via.unwrap_or(self.token)
    }

    /// The Permit2 nonce it spends on `network`, for a Permit2 settlement.
    pub fn permit2_nonce(&self, network: &str) -> Option<Permit2Nonce> {
        (self.method == TransferMethod::Permit2).then(|| Permit2Nonce {
            network: network.to_string(),
            owner: self.payer,
            nonce: self.nonce,
        })
    }

    /// The latest signed attempt.
    pub fn latest(&self) -> Option<&Attempt> {
        self.attempts.last()
    }

    /// The attempts at the nonce the settlement occupies in `state`: one of them can still be
    /// mined.
    pub fn live_attempts(&self, state: &State) -> impl Iterator<Item = &Attempt> {
        let nonce = state.nonce();
        let signer = self.latest().map(|a| a.signer);
        self.attempts
            .iter()
            .filter(move |a| Some(a.nonce) == nonce && Some(a.signer) == signer)
    }
}

/// A record of one family, made of that family's records only (`TryFrom<Record>`), whose part
/// reads without asking the family. Its family cannot change: a record's family is the
/// ledger's to set.
macro_rules! family_record {
    ($(#[$doc:meta])* $name:ident, $variant:ident, $part:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name(pub(super) Record);

        impl $name {
            pub fn part(&self) -> &$part {
                match &self.0.family {
                    Family::$variant(part) => part,
                    _ => unreachable!("made of records of its family only"),
                }
            }

            pub fn part_mut(&mut self) -> &mut $part {
                match &mut self.0.family {
                    Family::$variant(part) => part,
                    _ => unreachable!("made of records of its family only"),
                }
            }

            pub fn into_record(self) -> Record {
                self.0
            }

            /// The record, as the store takes it.
            pub fn as_record(&self) -> &Record {
                &self.0
            }

            /// The claim as `asking` makes it (`Record::asked_by`).
            pub fn asked_by(self, asking: &super::Asking) -> Self {
                $name(self.0.asked_by(asking))
            }
        }

        /// A record of its family as one; any other record is given back.
        impl TryFrom<Record> for $name {
            type Error = Record;

            fn try_from(record: Record) -> Result<Self, Record> {
                match record.family {
                    Family::$variant(_) => Ok($name(record)),
                    _ => Err(record),
                }
            }
        }

        impl Deref for $name {
            type Target = Record;

            fn deref(&self) -> &Record {
                &self.0
            }
        }

        impl DerefMut for $name {
            fn deref_mut(&mut self) -> &mut Record {
                &mut self.0
            }
        }
    };
}

family_record!(
    /// A record of an EVM settlement: what the EVM lanes hold.
    EvmRecord,
    Evm,
    EvmPart
);

family_record!(
    /// A record of a Solana settlement: what the Solana followers hold.
    SvmRecord,
    Svm,
    SvmPart
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_record_is_made_of_its_familys_records_only() {
        let (evm, svm) = (
            crate::testing::record(1),
            crate::testing::svm_record("net", 2),
        );
        let svm = EvmRecord::try_from(svm).expect_err("a Solana record is no EVM record");
        let evm = SvmRecord::try_from(evm).expect_err("an EVM record is no Solana record");
        let evm = EvmRecord::try_from(evm).unwrap();
        assert_eq!(evm.part().nonce, H256::repeat_byte(1));
        assert_eq!(evm.key(), evm.as_record().key());
        let svm = SvmRecord::try_from(svm).unwrap();
        assert_eq!(svm.part().signature_digest, [2; 32]);
        assert!(svm.into_record().evm().is_none());
    }
}
