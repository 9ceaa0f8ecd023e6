//! The payer's wire transaction: base64 of a bincode `VersionedTransaction` (legacy or v0), whose
//! first account is the fee payer with its signature slot left empty for routerd to fill.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bincode::Options;
use solana_keypair::Keypair;
use solana_message::compiled_instruction::CompiledInstruction;
use solana_message::{Hash, VersionedMessage};
use solana_pubkey::Pubkey;
use solana_signature::Signature;
use solana_signer::Signer;
use solana_transaction::versioned::VersionedTransaction;

/// The largest transaction a Solana node accepts (one network packet, 1232 bytes). Anything
/// longer could never land, so it is refused before it costs a decode.
const PACKET_DATA_SIZE: u64 = 1232;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("not base64")]
    Base64,
    #[error("not a Solana wire transaction")]
    Wire,
    #[error("the transaction is malformed")]
    Malformed,
}

/// A payment is its message: the same message hash is the same payment, whoever re-signs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageHash(pub [u8; 32]);

/// A decoded, sanitized payer transaction.
#[derive(Debug, Clone)]
pub struct PaymentTransaction {
    tx: VersionedTransaction,
    message: Vec<u8>,
}

/// The transaction with routerd's fee payer signature: what is stored before it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedTransaction {
    /// The transaction id: the fee payer's signature.
    pub signature: Signature,
    /// Base64 of the wire bytes, as `sendTransaction` takes them.
    pub wire: String,
}

impl PaymentTransaction {
    pub fn decode(base64: &str) -> Result<Self, DecodeError> {
        let bytes = BASE64.decode(base64).map_err(|_| DecodeError::Base64)?;
        Self::from_wire(&bytes)
    }

    pub fn from_wire(bytes: &[u8]) -> Result<Self, DecodeError> {
        let tx: VersionedTransaction = bincode::DefaultOptions::new()
            .with_fixint_encoding()
            .reject_trailing_bytes()
            .with_limit(PACKET_DATA_SIZE)
            .deserialize(bytes)
            .map_err(|_| DecodeError::Wire)?;
        // Sanitizing holds the indexes and counts to the account list, so that every accessor
        // below can index without checking again.
        tx.sanitize().map_err(|_| DecodeError::Malformed)?;
        let message = tx.message.serialize();
        Ok(Self { tx, message })
    }

    pub fn fee_payer(&self) -> &Pubkey {
        &self.tx.message.static_account_keys()[0]
    }

    pub fn message_hash(&self) -> MessageHash {
        MessageHash(VersionedMessage::hash_raw_message(&self.message).to_bytes())
    }

    pub fn recent_blockhash(&self) -> &Hash {
        self.tx.message.recent_blockhash()
    }

    pub fn uses_lookup_tables(&self) -> bool {
        self.tx
            .message
            .address_table_lookups()
            .is_some_and(|l| !l.is_empty())
    }

    pub fn instructions(&self) -> &[CompiledInstruction] {
        self.tx.message.instructions()
    }

    /// A static account by its index in the message (lookup-table accounts are not static).
    pub fn account(&self, index: u8) -> Option<&Pubkey> {
        self.tx
            .message
            .static_account_keys()
            .get(usize::from(index))
    }

    /// Every signature the message requires besides the fee payer's is present and valid.
    pub fn payer_signatures_valid(&self) -> bool {
        let required = usize::from(self.tx.message.header().num_required_signatures);
        let keys = self.tx.message.static_account_keys();
        (1..required).all(|i| self.tx.signatures[i].verify(keys[i].as_ref(), &self.message))
    }

    /// The accounts that must sign: the fee payer and the payer's signers.
    pub fn signers(&self) -> &[Pubkey] {
        let required = usize::from(self.tx.message.header().num_required_signatures);
        &self.tx.message.static_account_keys()[..required]
    }

    /// The fee payer's signature of the message: the settlement's name, which verify looks up
    /// without writing the whole signed transaction.
    pub fn fee_payer_signature(&self, fee_payer: &Keypair) -> Signature {
        fee_payer.sign_message(&self.message)
    }

    /// Fills the fee payer's slot. The caller has checked that `fee_payer` is the first account.
    pub fn sign_as_fee_payer(&self, fee_payer: &Keypair) -> SignedTransaction {
        let mut tx = self.tx.clone();
        tx.signatures[0] = self.fee_payer_signature(fee_payer);
        let bytes = bincode::serialize(&tx).expect("a decoded transaction serializes");
        SignedTransaction {
            signature: tx.signatures[0],
            wire: BASE64.encode(bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::svm::exact::tests::{payment, Fixture};

    #[test]
    fn round_trips_v0_and_legacy() {
        let f = Fixture::new();
        for legacy in [false, true] {
            let wire = f.encode(f.build(payment(&f), legacy));
            let tx = PaymentTransaction::decode(&wire).unwrap();
            assert_eq!(tx.fee_payer(), &f.fee_payer.pubkey());
            assert!(tx.payer_signatures_valid());
            assert_eq!(tx.instructions().len(), 3);
            assert!(!tx.uses_lookup_tables());
        }
    }

    #[test]
    fn refuses_what_is_not_a_transaction() {
        assert_eq!(
            PaymentTransaction::decode("%%").unwrap_err(),
            DecodeError::Base64
        );
        assert_eq!(
            PaymentTransaction::decode("AAAA").unwrap_err(),
            DecodeError::Wire
        );
        let f = Fixture::new();
        let mut bytes = BASE64
            .decode(f.encode(f.build(payment(&f), false)))
            .unwrap();
        bytes.push(0);
        assert_eq!(
            PaymentTransaction::from_wire(&bytes).unwrap_err(),
            DecodeError::Wire
        );
    }

    #[test]
    fn a_forged_payer_signature_is_invalid() {
        let f = Fixture::new();
        let mut tx = f.build(payment(&f), false);
        tx.signatures[1] = Signature::from([7; 64]);
        assert!(!PaymentTransaction::decode(&f.encode(tx))
            .unwrap()
            .payer_signatures_valid());
    }

    #[test]
    fn the_fee_payer_signature_makes_a_valid_transaction_with_the_same_message() {
        let f = Fixture::new();
        let tx = PaymentTransaction::decode(&f.encode(f.build(payment(&f), false))).unwrap();
        let signed = tx.sign_as_fee_payer(&f.fee_payer);
        let full = PaymentTransaction::decode(&signed.wire).unwrap();
        assert_eq!(full.message_hash(), tx.message_hash());
        assert!(full.tx.verify_with_results().iter().all(|ok| *ok));
        assert_eq!(full.tx.signatures[0], signed.signature);
        // What verify looks the settlement up by is that same signature.
        assert_eq!(tx.fee_payer_signature(&f.fee_payer), signed.signature);
    }
}
