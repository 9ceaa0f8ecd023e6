//! Callers' small batches that are ready at the same moment (the reads of concurrent verifies,
//! say) go out together as one HTTP request: each call is still its own JSON-RPC call and each
//! caller gets exactly its own answers back, in order. A task sends the queue, not a caller, so
//! a caller that gives up never takes the others' answers with it; an idle chain, the engine's
//! own traffic and large batches never wait for company.

use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::{Answered, Call, ChainClient, Unreachable};
use crate::chain::Traffic;

/// Batches of at most this many calls (and at most half of `max_batch_calls`) are sent together
/// with the other small batches ready at the same moment; larger ones (a block's receipts, a
/// lane's broadcasts) go out on their own, split at `max_batch_calls`.
const COALESCE_MAX_CALLS: usize = 8;

/// A small batch waiting in the queue, and where its answers go.
pub(super) struct Queued {
    calls: Vec<Call>,
    reply: oneshot::Sender<Answered>,
}

impl ChainClient {
    pub(super) async fn batch_untraced(&self, traffic: Traffic, calls: &[Call]) -> Answered {
        // An idle chain gets the request at once: waiting for company would only add latency.
        if traffic == Traffic::Own
            || calls.len() > COALESCE_MAX_CALLS.min(self.max_batch_calls / 2)
            || self.in_flight.load(Ordering::Relaxed) == 0
        {
            return self.send(traffic, calls).await;
        }
        let (reply, answer) = oneshot::channel();
        let first = {
            let mut queue = self.queue.lock().expect("queue lock");
            queue.push(Queued {
                calls: calls.to_vec(),
                reply,
            });
            queue.len() == 1
        };
        if first {
            // A task, not this caller, sends the queue: a caller that gives up must not take
            // the other callers' answers with it.
            let client = self.me.upgrade().expect("a client is used through its Arc");
            tokio::spawn(async move { client.send_queue().await });
        }
        answer.await.unwrap_or_else(|_| {
            Err(Unreachable {
                chain: self.name.clone(),
                detail: "the coalesced request was dropped".to_string(),
            })
        })
    }

    /// Sends what is queued once every task ready now has had its turn to add to it, in
    /// requests of at most `max_batch_calls` calls, at once.
    async fn send_queue(&self) {
        tokio::task::yield_now().await;
        let queued = std::mem::take(&mut *self.queue.lock().expect("queue lock"));
        let mut groups: Vec<Vec<Queued>> = Vec::new();
        let mut calls_in_last = 0;
        for entry in queued {
            match groups.last_mut() {
                Some(group) if calls_in_last + entry.calls.len() <= self.max_batch_calls => {
                    calls_in_last += entry.calls.len();
                    group.push(entry);
                }
                _ => {
                    calls_in_last = entry.calls.len();
                    groups.push(vec![entry]);
                }
            }
        }
        futures::future::join_all(groups.into_iter().map(|group| self.send_group(group))).await;
    }

    /// One HTTP request for every call of `group`; each caller gets its own answers back.
    async fn send_group(&self, group: Vec<Queued>) {
        let sizes: Vec<usize> = group.iter().map(|entry| entry.calls.len()).collect();
        let (calls, replies): (Vec<Vec<Call>>, Vec<oneshot::Sender<Answered>>) = group
            .into_iter()
            .map(|entry| (entry.calls, entry.reply))
            .unzip();
        let calls: Vec<Call> = calls.into_iter().flatten().collect();
        let answers = self.send_merged(Traffic::Callers, calls).await;
        match answers {
            Ok((answers, upstream)) => {
                let mut answers = answers.into_iter();
                for (reply, size) in replies.into_iter().zip(sizes) {
                    let _ = reply.send(Ok((answers.by_ref().take(size).collect(), upstream)));
                }
            }
            Err(unreachable) => {
                for reply in replies {
                    let _ = reply.send(Err(unreachable.clone()));
                }
            }
        }
    }
}
