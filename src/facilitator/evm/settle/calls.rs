//! A contract call routerd sends that executes no payer's authorization (a `batch-settlement`
//! claim, sweep or refund): claimed in the ledger under the key its caller names (the same key
//! asked again is told the first call's outcome), signed, sent and followed by a lane like every
//! settlement.

use ethers_core::types::{Address, Bytes, H256, U256};
use tokio::time::Instant;

use super::Settler;
use crate::clock::unix_now;
use crate::facilitator::outcome::{SettleError, Settled};
use crate::facilitator::settlement::key_taken;
use crate::facilitator::settlement::waiters::{Progress, Waiters};
use crate::ledger::{Asking, EvmRecord, EvmTerms, TransferMethod};
use crate::store::{Claim, Limits};

/// How long a call may wait unmined before its lane gives it up.
const CALL_LIFETIME_SECS: u64 = 3600;

impl Settler {
    /// Sends `calldata` to `contract` on `network` with `gas_limit`, claimed under `key`, and
    /// answers its outcome.
    pub async fn send_call(
        &self,
        network: &str,
        contract: Address,
        (calldata, key): (Bytes, H256),
        gas_limit: u64,
        asking: &Asking,
    ) -> Result<Settled, SettleError> {
        let record = call_record(network, contract, (calldata, key), gas_limit, asking);
        let key = record.key();
        let deadline = Instant::now() + self.settle_timeout;
        let Some(lane) = self.lanes.pick(network, None) else {
            return Err(SettleError::Abandoned(format!(
                "no signer serves {network}"
            )));
        };
        let mut reservation = lane.reserve();
        let lease = reservation.lane().lease();
        let limits = Limits {
            balance: U256::MAX,
            permit2_allowance: U256::MAX,
        };
        match self
            .ledger
            .claim(&key, &record, lease.as_ref(), &limits)
            .await?
        {
            Claim::Claimed if lease.is_none() => {
                self.await_stored(record.into_record(), deadline).await
            }
            Claim::Claimed => {
                let progress = Waiters::register(
                    &mut self.waiters.lock(),
                    key.clone(),
                    record.digest,
                    record.request.clone(),
                    Progress::Signing,
                    tracing::Span::current(),
                );
                reservation.submit(record).await;
                self.wait(progress, &key, deadline).await
            }
            Claim::Exists(existing) => match &existing.outcome {
                Some(outcome) => Ok(Settled::of(outcome)),
                None => self.await_stored(*existing, deadline).await,
            },
            Claim::KeyTaken => Err(key_taken(&record)),
            refused => unreachable!("a call of no payer fits every limit: {refused:?}"),
        }
    }
}

/// The record of a call: its key is the contract and `key`; no value moves from a payer.
fn call_record(
    network: &str,
    contract: Address,
    (calldata, hash): (Bytes, H256),
    gas_limit: u64,
    asking: &Asking,
) -> EvmRecord {
    let terms = EvmTerms {
        token: contract,
        payer: contract,
        pay_to: contract,
        nonce: hash,
        valid_before: unix_now() + CALL_LIFETIME_SECS,
        method: TransferMethod::Call,
        approves_permit2: false,
        via: Some(contract),
        sender: None,
        calldata,
        gas_limit,
    };
    EvmRecord::new(network.to_string(), U256::zero(), hash, terms).asked_by(asking)
}
