//! Callers' small batches that are ready at the same moment (the reads of concurrent verifies,
//! say) go out together as one HTTP request: each call is still its own JSON-RPC call and each
//! caller gets exactly its own answers back, in order. A task sends the queue, not a caller, so
//! a caller that gives up never takes the others' answers with it; an idle chain, the engine's
//! own traffic and large batches never wait for company.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{Answered, Call, ChainClient, Unreachable};
use crate::chain::Traffic;

/// Batches of at most this many calls (and at most half of `max_batch_calls`) are sent together
/// with the other small batches ready at the same moment; larger ones (a block's receipts, a
/// lane's broadcasts) go out on their own, split at `max_batch_calls`.
const COALESCE_MAX_CALLS: usize = 8;

/// Coalesced requests under way at once. While this many are, the next callers' batches wait
/// in the queue and go together when one is answered: under load the same calls ride fewer,
/// larger requests, and the verify lens's merged calls grow (`merge.rs`), so the node takes the
/// lens's code in once for more verifies. Two keep a node busy while one answer travels back.
/// An idle chain (nothing under way) never waits: its request goes at once, as before; nor
/// does a far node's ([`NEAR_NODE`]).
pub(super) const COALESCED_IN_FLIGHT: usize = 2;

/// A node that answers a read sent alone (nothing else under way) within this, on average, is
/// near (on the same host or network): its CPU is what a wait for company saves, and the wait
/// costs at most its round trip. A farther node's requests go as they come: waiting would add
/// its round trip to every verify under load, and its CPU is not the host's. Reads sent alone
/// measure the distance, not the load: a loaded node's larger requests take longer by design.
const NEAR_NODE: Duration = Duration::from_millis(20);

/// A small batch waiting in the queue, and where its answers go.
pub(super) struct Queued {
    calls: Vec<Call>,
    reply: oneshot::Sender<Answered>,
}

impl ChainClient {
    pub(super) async fn batch_untraced(&self, traffic: Traffic, calls: &[Call]) -> Answered {
        if traffic == Traffic::Own || calls.len() > COALESCE_MAX_CALLS.min(self.max_batch_calls / 2)
        {
            return self.send(traffic, calls).await;
        }
        // An idle chain gets the request at once: waiting for company would only add latency.
        // Its round trip, alone on the node, says how far the node is, whatever the load.
        if self.in_flight.load(Ordering::Relaxed) == 0 {
            let started = Instant::now();
            let answered = self.send(traffic, calls).await;
            if answered.is_ok() {
                self.observe_round_trip(started.elapsed());
            }
            return answered;
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

    /// Sends what is queued once every task ready now has had its turn to add to it and, for a
    /// near node, fewer than [`COALESCED_IN_FLIGHT`] coalesced requests are under way, in
    /// requests of at most `max_batch_calls` calls, at once.
    async fn send_queue(&self) {
        tokio::task::yield_now().await;
        let _turn = if self.node_is_near() {
            let turn = self.coalesced.acquire().await;
            Some(turn.expect("the client never closes it"))
        } else {
            None
        };
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

    fn node_is_near(&self) -> bool {
        let average = self.alone_round_trip_us.load(Ordering::Relaxed);
        u128::from(average) <= NEAR_NODE.as_micros()
    }

    /// The first round trip of a read sent alone is the average; each later one moves it an
    /// eighth of the way.
    fn observe_round_trip(&self, took: Duration) {
        let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let average = self.alone_round_trip_us.load(Ordering::Relaxed);
        let moved = match average {
            0 => took,
            _ => (average - average / 8).saturating_add(took / 8),
        };
        self.alone_round_trip_us.store(moved, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use http_body_util::{BodyExt, Full};
    use hyper::body::{Bytes, Incoming};
    use hyper_util::rt::TokioIo;
    use serde_json::{json, Value};
    use tokio::net::TcpListener;
    use tokio::sync::{mpsc, Semaphore};
    use tokio::task::JoinHandle;

    use super::super::{Answers, ClientLimits};
    use super::*;

    /// A node that reports how many calls each request carries and answers requests only as
    /// `release` lets them, in the order they came.
    async fn held_node() -> (String, mpsc::UnboundedReceiver<usize>, Arc<Semaphore>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (seen, requests) = mpsc::unbounded_channel();
        let release = Arc::new(Semaphore::new(0));
        let gate = release.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (seen, gate) = (seen.clone(), gate.clone());
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<Incoming>| {
                        let (seen, gate) = (seen.clone(), gate.clone());
                        async move {
                            let body = request.into_body().collect().await?.to_bytes();
                            let calls: Vec<Value> = serde_json::from_slice(&body).unwrap();
                            seen.send(calls.len()).unwrap();
                            gate.acquire().await.unwrap().forget();
                            let answers: Vec<Value> = calls
                            .iter()
                            .map(|call| json!({"jsonrpc": "2.0", "id": call["id"], "result": "0x1"}))
                            .collect();
                            let answers = Bytes::from(serde_json::to_vec(&answers).unwrap());
                            Ok::<_, hyper::Error>(hyper::Response::new(Full::new(answers)))
                        }
                    },
                );
                tokio::spawn(async move {
                    let io = TokioIo::new(stream);
                    let connection = hyper::server::conn::http1::Builder::new();
                    let _ = connection.serve_connection(io, service).await;
                });
            }
        });
        (url, requests, release)
    }

    fn client_of(url: String) -> Arc<ChainClient> {
        let limits = ClientLimits {
            timeout: Duration::from_secs(30),
            max_in_flight: 64,
            max_batch_calls: 64,
            max_caller_reads: 64,
        };
        let url = serde_json::from_value(json!(url)).unwrap();
        ChainClient::new("test", &[url], limits).unwrap()
    }

    /// The calls of the next request the node saw; a failure, not a hang, when none comes.
    async fn next(requests: &mut mpsc::UnboundedReceiver<usize>) -> usize {
        let next = tokio::time::timeout(Duration::from_secs(10), requests.recv()).await;
        next.expect("no request came").expect("the node stopped")
    }

    /// `count` reads one after another, each seen by the node as a request of its own.
    async fn each_alone(
        client: &Arc<ChainClient>,
        requests: &mut mpsc::UnboundedReceiver<usize>,
        count: usize,
    ) -> Vec<JoinHandle<Answers>> {
        let mut reads = Vec::new();
        for _ in 0..count {
            reads.push(read(client));
            assert_eq!(next(requests).await, 1);
        }
        reads
    }

    /// Releases every request held and checks that each read got its own answer.
    async fn answered(release: &Semaphore, reads: Vec<JoinHandle<Answers>>) {
        release.add_permits(64);
        for read in reads {
            assert_eq!(read.await.unwrap().unwrap(), vec![Ok(json!("0x1"))]);
        }
    }

    fn read(client: &Arc<ChainClient>) -> JoinHandle<Answers> {
        let client = client.clone();
        let calls = [Call::new("eth_blockNumber", vec![])];
        tokio::spawn(async move { client.batch(Traffic::Callers, &calls).await })
    }

    #[tokio::test]
    async fn under_load_callers_wait_for_one_of_two_coalesced_requests_then_go_as_one() {
        let (url, mut requests, release) = held_node().await;
        let client = client_of(url);
        // Nothing under way: at once, alone; then each of two coalesced requests goes.
        let mut reads = each_alone(&client, &mut requests, 1 + COALESCED_IN_FLIGHT).await;
        // Two coalesced requests under way: the next callers wait, together.
        reads.extend([read(&client), read(&client)]);
        let waited = tokio::time::timeout(Duration::from_millis(300), requests.recv()).await;
        assert!(
            waited.is_err(),
            "a third coalesced request went: {waited:?}"
        );
        // The direct request and the first coalesced one are answered: the waiting go as one.
        release.add_permits(2);
        assert_eq!(next(&mut requests).await, 2);
        answered(&release, reads).await;
        // The first read, sent alone to an idle node, measured how far the node is.
        assert!(client.alone_round_trip_us.load(Ordering::Relaxed) > 0);
    }

    #[tokio::test]
    async fn a_far_nodes_callers_never_wait_for_a_turn() {
        let (url, mut requests, release) = held_node().await;
        let client = client_of(url);
        client.observe_round_trip(NEAR_NODE * 9);
        assert!(!client.node_is_near());
        let reads = each_alone(&client, &mut requests, 3 + COALESCED_IN_FLIGHT).await;
        answered(&release, reads).await;
    }

    #[tokio::test]
    async fn the_first_round_trip_is_the_average_and_each_later_one_moves_it_an_eighth() {
        let client = client_of("http://127.0.0.1:1".to_string());
        let average = || client.alone_round_trip_us.load(Ordering::Relaxed);
        assert!(client.node_is_near());
        client.observe_round_trip(Duration::from_millis(1));
        assert_eq!(average(), 1_000);
        assert!(client.node_is_near());
        client.observe_round_trip(Duration::from_millis(160));
        assert_eq!(average(), 875 + 20_000);
        assert!(!client.node_is_near());
        for _ in 0..8 {
            client.observe_round_trip(Duration::from_millis(1));
        }
        assert!(client.node_is_near());
    }
}
