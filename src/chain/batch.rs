//! A batch read by name: each call added gives a [`Slot`], and its answer is taken by that
//! slot, never by a position counted by hand. The answers exist only as the client returns
//! them, one per call (a node that answers a batch short or long has answered nothing), so a
//! slot always finds its answer.

use super::client::{Call, CallResult, ChainClient, Unreachable};
use super::traffic::Traffic;

/// The calls of one JSON-RPC batch.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    calls: Vec<Call>,
}

/// Where a call's answer is in its batch's [`Answered`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(usize);

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, call: Call) -> Slot {
        self.calls.push(call);
        Slot(self.calls.len() - 1)
    }

    pub fn calls(&self) -> &[Call] {
        &self.calls
    }
}

/// A batch's answers, one per call.
#[derive(Debug)]
pub struct Answered(Vec<CallResult>);

impl Answered {
    pub fn get(&self, slot: Slot) -> &CallResult {
        &self.0[slot.0]
    }
}

impl ChainClient {
    /// Sends `batch` over `traffic`'s connections (see [`ChainClient::batch`]); its answers
    /// are read by slot.
    pub async fn ask(&self, traffic: Traffic, batch: &Batch) -> Result<Answered, Unreachable> {
        self.batch(traffic, batch.calls()).await.map(Answered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_slot_reads_its_own_answer() {
        let mut batch = Batch::new();
        let first = batch.add(Call::new("eth_chainId", vec![]));
        let second = batch.add(Call::new("eth_blockNumber", vec![]));
        let answered = Answered(vec![Ok(json!("0x1")), Ok(json!("0x2"))]);
        assert_eq!(answered.get(second), &Ok(json!("0x2")));
        assert_eq!(answered.get(first), &Ok(json!("0x1")));
        assert_eq!(batch.calls().len(), 2);
    }
}
