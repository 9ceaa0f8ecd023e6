//! When the lane stops moving: settlements past their `validBefore` give their nonce to a
//! self-transfer, waiting transactions are sent again and the one that blocks the lane is
//! replaced with higher fees within the caps (or, priced out, by a self-transfer), and nonces
//! nothing occupies are filled.

use ethers_core::types::{Bytes, U256};

use super::super::worker::{announce_sent, Slot, Worker, FILLER_GAS};
use super::STALL_BEFORE_RESEND;
use crate::chain::Head;
use crate::clock::unix_now;
use crate::evm::TxFees;
use crate::ledger::{Attempt, Lost};

impl Worker {
    /// Settlements not mined by the time the chain passed their `validBefore` can never land:
    /// record that, and put a self-transfer in their nonce so the transaction that would revert
    /// is replaced.
    pub(super) async fn expire(
        &mut self,
        head: &Head,
        chain_nonce: u64,
        market: TxFees,
    ) -> Vec<Bytes> {
        let expired: Vec<u64> = self
            .nonces
            .slots
            .range(chain_nonce..)
            .filter(|(_, slot)| match slot {
                Slot::Settlement { record, .. } => {
                    !slot.is_included() && head.timestamp >= record.part().valid_before
                }
                Slot::Filler { .. } => false,
            })
            .map(|(n, _)| *n)
            .collect();
        let mut resend = Vec::new();
        for nonce in expired {
            let Some(Slot::Settlement { mut record, .. }) = self.nonces.slots.remove(&nonce) else {
                continue;
            };
            tracing::warn!(payment = %record.key(), nonce, "authorization expired before the settlement was mined");
            let previous = record.latest().map(|a| a.fees).unwrap_or(market);
            let answered_now = record.expire(Lost::ValidBeforePassed, unix_now());
            let filler = self.filler(nonce, previous.replacement(market), head.number);
            resend.push(filler.raw.clone());
            self.nonces.slots.insert(nonce, Slot::filler(filler));
            self.finished(*record, answered_now).await;
        }
        resend
    }

    /// When the chain's nonce stops moving while transactions wait: send them all again (the
    /// node may have dropped its pool), and after `bump_after_blocks` replace the one that
    /// blocks the lane with higher fees, within the caps.
    pub(super) async fn unstick(
        &mut self,
        head: &Head,
        chain_nonce: u64,
        market: TxFees,
    ) -> Vec<Bytes> {
        let waiting = self
            .nonces
            .slots
            .range(chain_nonce..)
            .any(|(_, s)| !s.is_included());
        if !waiting || self.seen.chain_nonce != Some(chain_nonce) {
            self.seen.stalled = 0;
            return Vec::new();
        }
        self.seen.stalled += 1;
        // A transaction held back while its authorization was used elsewhere: a front-run.
        let mut resend = self.forestalled(head, chain_nonce, market).await;
        if self.seen.stalled.is_multiple_of(STALL_BEFORE_RESEND) {
            resend.extend(
                self.nonces
                    .slots
                    .range(chain_nonce..)
                    .filter(|(_, s)| !s.is_included())
                    .filter_map(|(_, s)| s.latest().map(|a| a.raw.clone())),
            );
        }
        if self.seen.stalled >= self.lane.settings.bump_after_blocks {
            if let Some(raw) = self.bump(chain_nonce, head, market).await {
                resend.push(raw);
            }
        }
        resend
    }

    /// Replaces the transaction at `nonce` with higher fees if the caps allow it.
    async fn bump(&mut self, nonce: u64, head: &Head, market: TxFees) -> Option<Bytes> {
        let (latest, first, gas) = {
            let slot = self.nonces.slots.get(&nonce)?;
            let latest = slot.latest()?.clone();
            let first = slot.attempts().first()?.fees.max_fee_per_gas();
            let gas = match slot {
                Slot::Settlement { record, .. } => record.part().gas_limit,
                Slot::Filler { .. } => FILLER_GAS,
            };
            (latest, first, gas)
        };
        if head.number < latest.sent_at_block + self.lane.settings.bump_after_blocks {
            return None;
        }
        let ceiling = self.lane.settings.bump_cap(gas, first);
        let fees = latest.fees.replacement(market).capped(Some(ceiling));
        if !fees.replaces(&latest.fees) {
            let waited =
                head.number >= latest.sent_at_block + 2 * self.lane.settings.bump_after_blocks;
            if waited && matches!(self.nonces.slots.get(&nonce)?, Slot::Settlement { .. }) {
                // The self-transfer may cost as much as the settlement could, not more.
                let spend = ceiling.saturating_mul(gas.into()) / U256::from(FILLER_GAS);
                return self.give_up(nonce, &latest, market, spend, head).await;
            }
            tracing::warn!(lane = %self.lane.id, nonce, max_fee = %latest.fees.max_fee_per_gas(), "transaction cannot be mined under the fee caps; not bumped");
            return None;
        }
        tracing::info!(lane = %self.lane.id, nonce, max_fee = %fees.max_fee_per_gas(), "replacing the transaction that blocks the lane with higher fees");
        let call = match self.nonces.slots.get(&nonce)? {
            Slot::Settlement { record, .. } => {
                let evm = record.part();
                Some((evm.call_target(), evm.calldata.clone()))
            }
            Slot::Filler { .. } => None,
        };
        let attempt = match &call {
            Some((token, calldata)) => self.sign(nonce, *token, calldata, gas, fees, head.number),
            None => self.filler(nonce, fees, head.number),
        };
        match self.nonces.slots.get_mut(&nonce)? {
            Slot::Settlement { record, .. } => {
                let raw = attempt.raw.clone();
                record.signed(attempt);
                record.sent();
                let record = record.clone();
                if let Err(e) = self.store.ledger.save(&[&record], true).await {
                    tracing::error!(payment = %record.key(), error = %e, "could not store a replacement");
                    return None;
                }
                announce_sent(&self.out.waiters, &record);
                Some(raw)
            }
            Slot::Filler { attempts } => {
                let raw = attempt.raw.clone();
                attempts.push(attempt);
                Some(raw)
            }
        }
    }

    /// A settlement that stayed unmined at its fee ceiling for another `bump_after_blocks` must
    /// not hold the lane (access.md §3): a self-transfer replaces it in the pool (21,000 gas,
    /// priced at most `spend` per gas: no more than the settlement was allowed to cost) and the
    /// payment is answered as failed. Where the caps keep even the self-transfer from replacing
    /// it, it stays: answering it failed while it may still be mined would cost the payer.
    async fn give_up(
        &mut self,
        nonce: u64,
        latest: &Attempt,
        market: TxFees,
        spend: U256,
        head: &Head,
    ) -> Option<Bytes> {
        let fees = latest.fees.replacement(market).capped(Some(spend));
        let filler = self.filler(nonce, fees, head.number);
        if !filler.fees.replaces(&latest.fees) {
            tracing::warn!(lane = %self.lane.id, nonce, "settlement cannot be mined under the fee caps, nor replaced within them; it waits for the market");
            return None;
        }
        let Some(Slot::Settlement { mut record, .. }) = self.nonces.slots.remove(&nonce) else {
            return None;
        };
        tracing::warn!(lane = %self.lane.id, payment = %record.key(), nonce, "settlement unmined at its fee ceiling; answered as failed, and a self-transfer takes its nonce");
        let answered_now = record.expire(Lost::PricedOut, unix_now());
        let raw = filler.raw.clone();
        self.nonces.slots.insert(nonce, Slot::filler(filler));
        self.finished(*record, answered_now).await;
        Some(raw)
    }

    /// Nonces below the next one that nothing occupies, seen empty at two heads in a row (a
    /// settlement arriving meanwhile takes them first), get a self-transfer.
    pub(super) async fn fill_gaps(&mut self, head: &Head, chain_nonce: u64, market: TxFees) {
        let gaps: Vec<u64> = self.nonces.free(chain_nonce).collect();
        let due: Vec<u64> = gaps
            .iter()
            .copied()
            .filter(|n| self.seen.gaps.contains(n))
            .collect();
        self.seen.gaps = gaps;
        if due.is_empty() || !self.lane.funded() {
            return;
        }
        let fees = market.capped(self.lane.settings.cap(FILLER_GAS));
        let mut raws = Vec::new();
        for nonce in due {
            tracing::info!(lane = %self.lane.id, nonce, "filling an unused signer nonce with a self-transfer");
            let attempt = self.filler(nonce, fees, head.number);
            raws.push(attempt.raw.clone());
            self.nonces.slots.insert(nonce, Slot::filler(attempt));
        }
        self.broadcast(&raws).await;
    }
}
