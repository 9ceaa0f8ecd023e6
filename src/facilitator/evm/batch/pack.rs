//! Claims, sweeps and refunds that arrive close together go out in one transaction per
//! network, through the settlement contract's `multicall`, up to
//! `facilitator.batch_max_calls_per_tx` calls: claim rows routerd signs for (channels that name
//! its receiver authorizer) under one `claimWithSignature` it signs over all of them, then each
//! caller's own calls in arrival order, then the sweeps, each pair once. Every job was tried on
//! its own before it came here; a packed transaction the node will not estimate is sent job by
//! job instead, so one caller's call can never sink another's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ethers_core::types::{Address, Bytes, H256};
use ethers_core::utils::keccak256;
use serde_json::json;
use tokio::sync::oneshot;

use crate::chain::{self, Batch, Chain, Traffic};
use crate::evm::batch::{self as leaf, ClaimRow};
use crate::evm::logs::Log;
use crate::evm::{hex_bytes, parse_quantity};
use crate::facilitator::evm::settle::Settler;
use crate::facilitator::outcome::{SettleError, Settled};
use crate::ledger::{Asking, Pass};
use crate::signer::Authorizer;

/// How long the first job of a pack waits for others to join it.
const PACK_WINDOW: Duration = Duration::from_millis(150);
/// Gas added on top of the node's estimate of a packed transaction.
const GAS_HEADROOM_PERCENT: u64 = 25;

/// What a job's calls came to: the shared transaction's outcome.
#[derive(Debug, Clone)]
pub enum Packed {
    Done(Settled),
    Pending(Option<H256>),
    /// Nothing was sent: the node would not estimate the pack, or the settler gave it up
    /// before it was signed.
    NotSent(String),
    /// The settler answered an error once it had taken the pack (the store's, while it waited):
    /// its transaction may be out.
    Failed(String),
}

impl Packed {
    /// Whether a transaction of the job may still land: it is pending, or its fate unknown.
    pub fn may_land(&self) -> bool {
        matches!(self, Packed::Pending(_) | Packed::Failed(_))
    }
}

/// One caller's calls.
pub struct Job {
    /// Calls complete as they are (the caller's own signatures, or a refund routerd signed).
    pub calls: Vec<Bytes>,
    /// Claim rows routerd signs for, with every other job's.
    pub rows: Vec<ClaimRow>,
    /// A sweep of what `receiver` has claimed in `token`.
    pub sweep: Option<Sweep>,
    answer: Option<oneshot::Sender<Packed>>,
}

/// A sweep of (receiver, token), up to the receiver's claimed total read before it was packed.
/// Every sweep of a pair calls the same `settle(receiver, token)`: its claimed total tells a
/// sweep of newer claims from the same sweep asked again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sweep {
    pub receiver: Address,
    pub token: Address,
    pub claimed: u128,
}

impl Job {
    pub fn new(calls: Vec<Bytes>, rows: Vec<ClaimRow>, sweep: Option<Sweep>) -> Self {
        Job {
            calls,
            rows,
            sweep,
            answer: None,
        }
    }

    fn size(&self) -> usize {
        self.calls.len() + self.rows.len() + usize::from(self.sweep.is_some())
    }
}

/// Where a network's packs go.
#[derive(Clone)]
pub struct Target {
    pub network: String,
    pub chain: Arc<Chain>,
    pub settlement: Address,
    pub domain: H256,
}

pub struct Packer {
    settler: Arc<Settler>,
    authorizer: Option<Arc<Authorizer>>,
    max_calls: usize,
    queues: Mutex<HashMap<String, Vec<Job>>>,
}

impl Packer {
    pub fn new(
        settler: Arc<Settler>,
        authorizer: Option<Arc<Authorizer>>,
        max_calls: usize,
    ) -> Self {
        Packer {
            settler,
            authorizer,
            max_calls: max_calls.max(1),
            queues: Mutex::new(HashMap::new()),
        }
    }

    /// The most calls one transaction packs (`facilitator.batch_max_calls_per_tx`).
    pub fn max_calls(&self) -> usize {
        self.max_calls
    }

    /// Queues `job` for `target`'s next transaction and waits for its outcome.
    pub async fn submit(self: &Arc<Self>, target: Target, mut job: Job) -> Packed {
        let (sender, receiver) = oneshot::channel();
        job.answer = Some(sender);
        let first = {
            let mut queues = self.queues.lock().expect("pack queues");
            let queue = queues.entry(target.network.clone()).or_default();
            queue.push(job);
            queue.len() == 1
        };
        if first {
            let packer = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(PACK_WINDOW).await;
                packer.flush(target).await;
            });
        }
        receiver
            .await
            .unwrap_or_else(|_| Packed::Failed("the pack was dropped".to_string()))
    }

    async fn flush(self: Arc<Self>, target: Target) {
        let jobs = {
            let mut queues = self.queues.lock().expect("pack queues");
            queues.remove(&target.network).unwrap_or_default()
        };
        for chunk in chunks(jobs, self.max_calls) {
            let packer = self.clone();
            let target = target.clone();
            tokio::spawn(async move { packer.send(target, chunk).await });
        }
    }

    /// Sends `jobs` in one transaction, or job by job when the packed one will not estimate.
    async fn send(self: Arc<Self>, target: Target, jobs: Vec<Job>) {
        let calls = self.calls(&target, &jobs);
        let data = leaf::multicall(&calls);
        let answer = match estimate(&target, &data).await {
            Ok(gas) => {
                let asking = asking();
                let key = pack_key(&data, &jobs);
                let sent = self.settler.send_call(
                    &target.network,
                    target.settlement,
                    (data, key),
                    gas,
                    &asking,
                );
                packed(sent.await)
            }
            Err(_) if jobs.len() > 1 => {
                for job in jobs {
                    Box::pin(self.clone().send(target.clone(), vec![job])).await;
                }
                return;
            }
            Err(revert) => Packed::NotSent(revert),
        };
        for job in jobs {
            if let Some(sender) = job.answer {
                let _ = sender.send(answer.clone());
            }
        }
    }

    /// The pack's calls: routerd's claim first, then each job's own, then the sweeps once each.
    fn calls(&self, target: &Target, jobs: &[Job]) -> Vec<Bytes> {
        let rows: Vec<ClaimRow> = jobs.iter().flat_map(|j| j.rows.iter().cloned()).collect();
        let mut calls = Vec::new();
        if let (false, Some(authorizer)) = (rows.is_empty(), &self.authorizer) {
            let signature = sign_claims(authorizer, target.domain, &rows);
            calls.push(leaf::claim_with_signature(&rows, &signature));
        }
        calls.extend(jobs.iter().flat_map(|j| j.calls.iter().cloned()));
        let mut swept = Vec::new();
        for sweep in jobs.iter().filter_map(|j| j.sweep) {
            let pair = (sweep.receiver, sweep.token);
            if !swept.contains(&pair) {
                swept.push(pair);
                calls.push(leaf::settle(sweep.receiver, sweep.token));
            }
        }
        calls
    }
}

/// The ledger key of a pack: the hash of its calldata (the same pack asked again is told the
/// first one's outcome), and, when it sweeps, of the claimed totals its sweeps sweep up to, so
/// that a sweep of newer claims is not told an older sweep's outcome.
fn pack_key(calldata: &[u8], jobs: &[Job]) -> H256 {
    let mut sweeps = jobs.iter().filter_map(|j| j.sweep).peekable();
    if sweeps.peek().is_none() {
        return H256(keccak256(calldata));
    }
    let mut keyed = calldata.to_vec();
    for sweep in sweeps {
        keyed.extend_from_slice(sweep.receiver.as_bytes());
        keyed.extend_from_slice(sweep.token.as_bytes());
        keyed.extend_from_slice(&sweep.claimed.to_be_bytes());
    }
    H256(keccak256(keyed))
}

/// routerd's `ClaimBatch` signature over `rows`, in order.
pub fn sign_claims(authorizer: &Authorizer, domain: H256, rows: &[ClaimRow]) -> [u8; 65] {
    authorizer.sign_hash(leaf::claim_batch_digest(domain, rows))
}

/// Jobs in arrival order, cut into packs of at most `max` calls (a job is never cut).
fn chunks(jobs: Vec<Job>, max: usize) -> Vec<Vec<Job>> {
    let mut packs: Vec<Vec<Job>> = Vec::new();
    let mut size = 0;
    for job in jobs {
        let fits = packs.last().is_some() && size + job.size() <= max;
        if !fits {
            packs.push(Vec::new());
            size = 0;
        }
        size += job.size();
        packs.last_mut().expect("pushed").push(job);
    }
    packs
}

/// The asking of a pack: no caller's own (each is answered by its job).
fn asking() -> Asking {
    Asking {
        tag: None,
        payment_id: None,
        payee_scoped: false,
        pass: Pass {
            caller: "routerd:batch-settlement".to_string(),
            body: H256::zero(),
        },
    }
}

fn packed(sent: Result<Settled, SettleError>) -> Packed {
    match sent {
        Ok(settled) => Packed::Done(settled),
        Err(SettleError::Pending(hash)) => Packed::Pending(hash),
        Err(SettleError::Abandoned(why)) => Packed::NotSent(why),
        Err(other) => Packed::Failed(other.to_string()),
    }
}

/// The node's estimate of the pack, with headroom, or why it would revert.
async fn estimate(target: &Target, data: &Bytes) -> Result<u64, String> {
    let call = chain::Call::new(
        "eth_estimateGas",
        vec![json!({"to": hex_bytes(target.settlement), "data": hex_bytes(data)})],
    );
    let mut batch = Batch::new();
    let slot = batch.add(call);
    let answers = target
        .chain
        .client
        .ask(Traffic::Own, &batch)
        .await
        .map_err(|e| e.to_string())?;
    let gas = match answers.get(slot) {
        Ok(value) => parse_quantity(value)
            .filter(|g| g.bits() <= 64)
            .map(|g| g.as_u64()),
        Err(e) => return Err(e.to_string()),
    };
    let gas = gas.ok_or("the node's gas estimate does not parse")?;
    Ok(gas.saturating_mul(100 + GAS_HEADROOM_PERCENT) / 100)
}

/// The logs of `transaction`'s receipt that parse, or `None` when the node cannot say.
pub async fn receipt_logs(chain: &Chain, transaction: H256) -> Option<Vec<Log>> {
    let mut batch = Batch::new();
    let call = chain::Call::new("eth_getTransactionReceipt", vec![json!(transaction)]);
    let slot = batch.add(call);
    let answers = chain.client.ask(Traffic::Callers, &batch).await.ok()?;
    let receipt = answers.get(slot).as_ref().ok()?;
    let logs = receipt.get("logs")?.as_array()?;
    Some(logs.iter().filter_map(Log::parse).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(claimed: u128) -> Sweep {
        Sweep {
            receiver: Address::repeat_byte(1),
            token: Address::repeat_byte(2),
            claimed,
        }
    }

    fn job(calls: usize, swept: bool) -> Job {
        Job::new(
            vec![Bytes::new(); calls],
            Vec::new(),
            swept.then(|| sweep(5)),
        )
    }

    #[test]
    fn a_sweep_of_newer_claims_is_another_pack() {
        let calldata = leaf::multicall(&[leaf::settle(
            Address::repeat_byte(1),
            Address::repeat_byte(2),
        )]);
        let of = |claimed| vec![Job::new(Vec::new(), Vec::new(), Some(sweep(claimed)))];
        assert_eq!(
            pack_key(&calldata, &of(5)),
            pack_key(&calldata, &of(5)),
            "asked again"
        );
        assert_ne!(
            pack_key(&calldata, &of(5)),
            pack_key(&calldata, &of(9)),
            "newer claims"
        );
        let claims = vec![job(1, false)];
        assert_eq!(
            pack_key(&calldata, &claims),
            H256(keccak256(&calldata)),
            "no sweep: its calldata"
        );
    }

    #[test]
    fn packs_keep_to_the_most_calls_and_never_cut_a_job() {
        let sizes = |packs: Vec<Vec<Job>>| -> Vec<Vec<usize>> {
            packs
                .iter()
                .map(|p| p.iter().map(Job::size).collect())
                .collect()
        };
        let jobs = vec![job(1, false), job(2, false), job(1, true), job(3, false)];
        assert_eq!(sizes(chunks(jobs, 4)), vec![vec![1, 2], vec![2], vec![3]]);
        // A job larger than the bound goes alone, whole.
        assert_eq!(
            sizes(chunks(vec![job(5, false), job(1, false)], 4)),
            vec![vec![5], vec![1]]
        );
        let three = (0..3).map(|_| job(1, false)).collect();
        assert_eq!(sizes(chunks(three, 100)), vec![vec![1, 1, 1]]);
    }

    #[test]
    fn only_a_pack_given_up_unsent_cannot_land() {
        use crate::store::StoreError;
        let sent = |e: SettleError| packed(Err(e)).may_land();
        assert!(!sent(SettleError::Abandoned("no signer".into())));
        assert!(!Packed::NotSent("reverts".into()).may_land());
        assert!(sent(SettleError::Pending(None)), "still being signed");
        assert!(sent(SettleError::Pending(Some(H256::zero()))));
        // The store failed while the settler waited: the transaction may be out.
        assert!(sent(SettleError::Store(StoreError::Backend("gone".into()))));
    }
}
