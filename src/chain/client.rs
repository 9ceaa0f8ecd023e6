//! One chain's upstream: a jsonrpsee HTTP client per URL, batched requests, failover to the next
//! URL on transport errors or timeouts, and a cool-down for URLs that keep failing.
//!
//! Each URL has two connection pools: one for the settlement engine's own traffic, one for what
//! callers cause (`traffic`), so a flood of client-driven reads never delays a lane. Callers'
//! reads also count against a bound per kind (`Budgets`).
//!
//! Small batches of callers that are ready at the same moment (the reads of concurrent verifies,
//! say) go out together as one HTTP request: each call is still its own JSON-RPC call, but the HTTP
//! round trip, its parsing on both ends and its syscalls are paid once per moment instead of
//! once per request (`coalesce`). A node's errors and their scrubbing are `error`'s.

mod coalesce;
mod error;
mod identity;

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tracing::Instrument;

use jsonrpsee::core::client::{BatchResponse, ClientT, Error as ClientError};
use jsonrpsee::core::params::BatchRequestBuilder;
use jsonrpsee::core::traits::ToRpcParams;
use jsonrpsee::http_client::{
    HttpBackend, HttpClient as LoggedHttpClient, HttpClientBuilder, RpcService, RpcServiceBuilder,
};
use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::answer_bound::{self, CountAnswers, CountAnswersLayer};
use super::merge::{Merge, Part, Plan};
use super::traffic::{Budget, Budgets, Overloaded, Traffic};
use crate::config::Endpoint;
use coalesce::Queued;
use error::{closed_before_answering, rpc_error, scrubbed, short_error};
pub use error::{CallResult, Refusal, RpcError, Unreachable};
use identity::IdentityState;
pub use identity::{Checked, Identity};

/// jsonrpsee's HTTP client without its default logger middleware: that layer serializes every
/// request and answer to JSON a second time, for a `trace` line, even when tracing is off. At
/// one upstream call per verify that was a large share of verify's own CPU. Bodies are counted
/// against a relayed answer's bound while they are read (`answer_bound`).
type HttpClient = LoggedHttpClient<RpcService<CountAnswers<HttpBackend>>>;

/// Consecutive failures after which a URL is skipped for [`COOL_DOWN`].
const FAILURES_BEFORE_COOL_DOWN: u32 = 3;
const COOL_DOWN: Duration = Duration::from_secs(10);

/// An upstream call: method name and positional params.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: &'static str,
    pub params: Vec<Value>,
    /// A last param that is JSON already, sent as it is: the verify lens's state override is
    /// the same 5 KB of code in every call, serialized once.
    pub raw_param: Option<&'static RawValue>,
    /// How calls of this kind go together in a coalesced request (`merge.rs`); `None`: alone.
    pub merge: Option<&'static dyn Merge>,
}

impl Call {
    pub fn new(method: &'static str, params: Vec<Value>) -> Self {
        Self {
            method,
            params,
            raw_param: None,
            merge: None,
        }
    }
}

/// Positional params, serialized straight from the caller's values: a retry on the next URL
/// serializes them again instead of copying them first. `raw` goes last, as it is.
struct Params<'a> {
    values: &'a [Value],
    raw: Option<&'static RawValue>,
}

impl Serialize for Params<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = self.values.len() + usize::from(self.raw.is_some());
        let mut seq = serializer.serialize_seq(Some(len))?;
        for value in self.values {
            seq.serialize_element(value)?;
        }
        if let Some(raw) = self.raw {
            seq.serialize_element(raw)?;
        }
        seq.end()
    }
}

impl ToRpcParams for Params<'_> {
    /// `to_raw_value` takes the text as written; `RawValue::from_string` would parse it all
    /// again (the lens override alone is 5 KB) to check what serde_json has just written.
    fn to_rpc_params(self) -> Result<Option<Box<RawValue>>, serde_json::Error> {
        serde_json::value::to_raw_value(&self).map(Some)
    }
}

struct Upstream {
    /// `<chain>#<index>`: what answers, errors, logs and metrics call it. The URL itself may
    /// carry a provider key and stays inside the client.
    name: String,
    url: Endpoint,
    /// Callers' reads.
    client: HttpClient,
    /// The settlement engine's own requests, on connections of their own.
    own: HttpClient,
    consecutive_failures: AtomicU32,
    /// Milliseconds since `ChainClient::epoch` until which this URL is skipped.
    cooling_until_ms: AtomicU64,
    /// Whether it serves the chain's [`Identity`], once asked.
    identity: IdentityState,
}

/// Counters the operator sees on /metrics, kept per URL.
#[derive(Debug, Clone, Default)]
pub struct UpstreamStats {
    /// `<chain>#<index>`, never the URL.
    pub upstream: String,
    pub requests: u64,
    pub errors: u64,
}

pub struct ChainClient {
    name: String,
    upstreams: Vec<Upstream>,
    epoch: Instant,
    stats: Vec<(AtomicU64, AtomicU64)>,
    last_success: AtomicU64,
    /// HTTP requests under way: a small batch waits for company only while there are some.
    in_flight: AtomicUsize,
    /// Most calls in one coalesced request (`chains.<name>.max_batch_calls`).
    max_batch_calls: usize,
    /// Callers' small batches waiting for the next coalesced request.
    queue: Mutex<Vec<Queued>>,
    /// Turns to send the queue: at most [`coalesce::COALESCED_IN_FLIGHT`] at once.
    coalesced: tokio::sync::Semaphore,
    /// The round trip of a caller's read sent alone to an idle node, a moving average in
    /// microseconds: whether the node is near enough for a batch to wait for a turn.
    alone_round_trip_us: AtomicU64,
    /// Callers' reads in flight, per kind.
    budgets: Budgets,
    /// This client, for the task that sends the queue.
    me: Weak<ChainClient>,
    /// What each URL must answer before it is used, if anything.
    identity: Option<Identity>,
}

type Answers = Result<Vec<CallResult>, Unreachable>;

/// Answers and the index of the upstream that gave them (of a batch sent in several requests,
/// the last one's): a coalesced request is sent by another task, so the upstream is handed
/// back for the caller's span, not recorded on the sender's.
type Answered = Result<(Vec<CallResult>, usize), Unreachable>;

impl ChainClient {
    /// `limits.max_in_flight` bounds the requests to each URL at once (the two pools share it):
    /// under load they queue, so a saturated node slows answers down instead of timing them out.
    pub fn new(name: &str, urls: &[Endpoint], limits: ClientLimits) -> Result<Arc<Self>, String> {
        Self::with_identity(name, urls, limits, None)
    }

    /// As [`Self::new`], each URL asked for `identity` before its first use and never used
    /// when it answers another.
    pub fn with_identity(
        name: &str,
        urls: &[Endpoint],
        limits: ClientLimits,
        identity: Option<Identity>,
    ) -> Result<Arc<Self>, String> {
        let mut upstreams = Vec::with_capacity(urls.len());
        for (index, url) in urls.iter().enumerate() {
            let upstream = format!("{name}#{index}");
            let build = |in_flight: usize| {
                HttpClientBuilder::default()
                    .set_rpc_middleware(RpcServiceBuilder::new())
                    .set_http_middleware(tower::ServiceBuilder::new().layer(CountAnswersLayer))
                    .request_timeout(limits.timeout)
                    .max_concurrent_requests(in_flight)
                    .max_response_size(32 * 1024 * 1024)
                    .build(url.expose())
                    .map_err(|e| format!("{upstream}: {}", scrubbed(&e.to_string(), url)))
            };
            upstreams.push(Upstream {
                url: url.clone(),
                client: build(limits.callers_in_flight())?,
                own: build(limits.own_in_flight())?,
                name: upstream,
                consecutive_failures: AtomicU32::new(0),
                cooling_until_ms: AtomicU64::new(0),
                identity: IdentityState::default(),
            });
        }
        let stats = urls
            .iter()
            .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
            .collect();
        Ok(Arc::new_cyclic(|me| Self {
            name: name.to_string(),
            upstreams,
            epoch: Instant::now(),
            stats,
            last_success: AtomicU64::new(u64::MAX),
            in_flight: AtomicUsize::new(0),
            max_batch_calls: limits.max_batch_calls,
            queue: Mutex::new(Vec::new()),
            coalesced: tokio::sync::Semaphore::new(coalesce::COALESCED_IN_FLIGHT),
            alone_round_trip_us: AtomicU64::new(0),
            budgets: Budgets::new(limits.max_caller_reads),
            me: me.clone(),
            identity,
        }))
    }

    /// A place for a caller's reads on this chain, held while they are under way; at once
    /// `Overloaded` when `budget` is spent.
    pub fn admit(&self, budget: Budget) -> Result<tokio::sync::SemaphorePermit<'_>, Overloaded> {
        self.budgets.admit(budget).ok_or_else(|| Overloaded {
            chain: self.name.clone(),
            budget,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends `calls` as one JSON-RPC batch over `traffic`'s connections; answers per call in
    /// order. A caller's small batch may share its HTTP request with others ready at the same
    /// moment; the engine's own go out at once.
    pub async fn batch(&self, traffic: Traffic, calls: &[Call]) -> Answers {
        let span = self.span(calls.iter().map(|c| c.method));
        let started = Instant::now();
        let answered = self
            .batch_untraced(traffic, calls)
            .instrument(span.clone())
            .await;
        self.finish_span(&span, started, answered)
    }

    /// `calls`, those that merge as one call per kind (`merge.rs`). A merged call that fails
    /// as a whole (a node's cap on one call's gas, say) says nothing of the calls it carried:
    /// they are asked again as they are, in one more request.
    async fn send_merged(&self, traffic: Traffic, calls: Vec<Call>) -> Answered {
        let plan = Plan::new(calls);
        let (answers, mut upstream) = self.send(traffic, &plan.sent).await?;
        let mut results = Vec::with_capacity(answers.len());
        let (mut again, mut again_at) = (Vec::new(), Vec::new());
        for (index, part) in plan.parts(answers).into_iter().enumerate() {
            match part {
                Part::Answered(answer) => results.push(answer),
                Part::Again(call) => {
                    results.push(Ok(Value::Null));
                    again.push(call);
                    again_at.push(index);
                }
            }
        }
        if !again.is_empty() {
            let (answers, answered_by) = self.send(traffic, &again).await?;
            upstream = answered_by;
            for (index, answer) in again_at.into_iter().zip(answers) {
                results[index] = answer;
            }
        }
        Ok((results, upstream))
    }

    /// `calls` in requests of at most `max_batch_calls` calls each, sent at once: a node with a
    /// batch limit takes a block's receipts too, and it builds them on several threads. Answers
    /// in order; one request failing fails them all (readers take answers by position).
    async fn send(&self, traffic: Traffic, calls: &[Call]) -> Answered {
        if calls.len() <= self.max_batch_calls {
            return self.send_one(traffic, calls).await;
        }
        let requests = calls
            .chunks(self.max_batch_calls)
            .map(|chunk| self.send_one(traffic, chunk));
        let mut answers = Vec::with_capacity(calls.len());
        let mut upstream = 0;
        for chunk in futures::future::join_all(requests).await {
            let (chunk, answered_by) = chunk?;
            answers.extend(chunk);
            upstream = answered_by;
        }
        Ok((answers, upstream))
    }

    /// One HTTP request carrying `calls` as a JSON-RPC batch.
    async fn send_one(&self, traffic: Traffic, calls: &[Call]) -> Answered {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlight(&self.in_flight);
        self.with_failover(traffic, |upstream| async move {
            let mut batch = BatchRequestBuilder::new();
            for call in calls {
                batch
                    .insert(
                        call.method,
                        Params {
                            values: &call.params,
                            raw: call.raw_param,
                        },
                    )
                    .map_err(|e| ClientError::Custom(e.to_string()))?;
            }
            let response: BatchResponse<Value> =
                upstream.http(traffic).batch_request(batch).await?;
            let answers: Vec<CallResult> = response
                .into_iter()
                .map(|entry| entry.map_err(|e| rpc_error(&e, &upstream.url)))
                .collect();
            // Every reader takes its answers by position: a node that answers a batch short
            // (or long) has answered nothing, here, once.
            if answers.len() != calls.len() {
                return Err(ClientError::Custom(format!(
                    "the node answered {} of the {} calls of a batch",
                    answers.len(),
                    calls.len()
                )));
            }
            Ok(answers)
        })
        .await
    }

    /// One call; a JSON-RPC error from the node is returned as `Ok(Err(..))`.
    pub async fn call(
        &self,
        traffic: Traffic,
        method: &'static str,
        params: Vec<Value>,
    ) -> Result<CallResult, Unreachable> {
        let span = self.span(std::iter::once(method));
        let started = Instant::now();
        let answered = self
            .call_untraced(traffic, method, params)
            .instrument(span.clone())
            .await;
        self.finish_span(&span, started, answered)
    }

    async fn call_untraced(
        &self,
        traffic: Traffic,
        method: &'static str,
        params: Vec<Value>,
    ) -> Result<(CallResult, usize), Unreachable> {
        let params = &params;
        self.with_failover(traffic, |upstream| async move {
            match upstream
                .http(traffic)
                .request::<Value, _>(
                    method,
                    Params {
                        values: params,
                        raw: None,
                    },
                )
                .await
            {
                Ok(value) => Ok(Ok(value)),
                Err(ClientError::Call(e)) => Ok(Err(rpc_error(&e, &upstream.url))),
                Err(other) => Err(other),
            }
        })
        .await
    }

    /// Tries each URL that is not cooling down, in order; the first answer wins. When every URL
    /// is cooling down they are all tried anyway: a chain is never given up without asking.
    /// A URL on another chain (see [`Identity`]) is never tried. The answer comes with the
    /// index of the upstream that gave it.
    async fn with_failover<'a, F, Fut, T>(
        &'a self,
        traffic: Traffic,
        attempt: F,
    ) -> Result<(T, usize), Unreachable>
    where
        F: Fn(&'a Upstream) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let now = self.now_ms();
        let ours = |&i: &usize| !self.upstreams[i].identity.foreign();
        let mut order: Vec<usize> = (0..self.upstreams.len())
            .filter(ours)
            .filter(|&i| self.upstreams[i].cooling_until_ms.load(Ordering::Relaxed) <= now)
            .collect();
        if order.is_empty() {
            order = (0..self.upstreams.len()).filter(ours).collect();
        }
        let mut last_error = String::from("no upstream URL on the configured chain");
        for i in order {
            let upstream = &self.upstreams[i];
            self.stats[i].0.fetch_add(1, Ordering::Relaxed);
            let mut answer = match self.identify(upstream, traffic).await {
                Ok(Checked::Confirmed) => attempt(upstream).await,
                Ok(Checked::Foreign(_)) => {
                    last_error = format!("{}: on another chain", upstream.name);
                    continue;
                }
                Err(error) => Err(error),
            };
            if answer.is_err() && answer_bound::exceeded_here() {
                // The caller's answer outgrew its bound: the node did nothing wrong, and no other
                // URL is asked for more of it.
                return Err(Unreachable {
                    chain: self.name.clone(),
                    detail: format!("{}: the answer is over its bound", upstream.name),
                });
            }
            if answer.as_ref().is_err_and(closed_before_answering) {
                // A pooled connection the node (or a balancer before it) had just closed: the
                // same URL again, on a new connection. Every call routerd makes may be repeated
                // (reads, and broadcasts of the same signed transaction).
                answer = attempt(upstream).await;
            }
            match answer {
                Ok(value) => {
                    upstream.consecutive_failures.store(0, Ordering::Relaxed);
                    self.last_success.store(self.now_ms(), Ordering::Relaxed);
                    return Ok((value, i));
                }
                Err(error) => last_error = self.failed(i, &error),
            }
        }
        Err(Unreachable {
            chain: self.name.clone(),
            detail: last_error,
        })
    }

    /// Counts a failed request of upstream `i` (cooling it down after a few in a row); answers
    /// what to say of it, by its name only.
    fn failed(&self, i: usize, error: &ClientError) -> String {
        let upstream = &self.upstreams[i];
        self.stats[i].1.fetch_add(1, Ordering::Relaxed);
        let failures = upstream
            .consecutive_failures
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        if failures >= FAILURES_BEFORE_COOL_DOWN {
            let until = self.now_ms() + COOL_DOWN.as_millis() as u64;
            upstream.cooling_until_ms.store(until, Ordering::Relaxed);
        }
        let error = short_error(error, &upstream.url);
        tracing::debug!(chain = %self.name, upstream = %upstream.name, %error, "upstream request failed");
        format!("{}: {error}", upstream.name)
    }

    /// The span of one request to this chain's nodes, inside the request or settlement it
    /// serves; none for routerd's own watching (head polls, fee reads), which would otherwise
    /// be a trace each. Its attributes name the chain and its upstream, never a URL.
    fn span<'a>(&self, methods: impl Iterator<Item = &'a str>) -> tracing::Span {
        if tracing::Span::current().is_none() {
            return tracing::Span::none();
        }
        let methods: Vec<&str> = methods.collect();
        tracing::info_span!(
            "upstream batch",
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            rpc.system = "jsonrpc",
            chain = %self.name,
            rpc.methods = %methods.join(","),
            calls = methods.len(),
            upstream = tracing::field::Empty,
            latency_ms = tracing::field::Empty,
            error = tracing::field::Empty,
        )
    }

    /// Records on an upstream span which upstream answered, the latency and, when no node
    /// answered, why (the detail names upstreams by `<chain>#<index>` only); answers the value
    /// without the upstream's index.
    fn finish_span<T>(
        &self,
        span: &tracing::Span,
        started: Instant,
        answered: Result<(T, usize), Unreachable>,
    ) -> Result<T, Unreachable> {
        if !span.is_none() {
            span.record("latency_ms", started.elapsed().as_millis() as u64);
            match &answered {
                Ok((_, upstream)) => {
                    span.record("upstream", self.upstreams[*upstream].name.as_str());
                }
                Err(error) => {
                    span.record("otel.status_code", "ERROR");
                    span.record("error", error.detail.as_str());
                }
            }
        }
        answered.map(|(value, _)| value)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// How long ago any URL of this chain last answered, if ever.
    pub fn since_last_success(&self) -> Option<Duration> {
        match self.last_success.load(Ordering::Relaxed) {
            u64::MAX => None,
            at => Some(Duration::from_millis(self.now_ms().saturating_sub(at))),
        }
    }

    pub fn stats(&self) -> Vec<UpstreamStats> {
        self.upstreams
            .iter()
            .zip(&self.stats)
            .map(|(u, (requests, errors))| UpstreamStats {
                upstream: u.name.clone(),
                requests: requests.load(Ordering::Relaxed),
                errors: errors.load(Ordering::Relaxed),
            })
            .collect()
    }
}

/// How a chain's client is bounded.
#[derive(Debug, Clone, Copy)]
pub struct ClientLimits {
    pub timeout: Duration,
    /// Requests to one URL at once, shared by the two pools.
    pub max_in_flight: usize,
    /// Most calls in one coalesced request.
    pub max_batch_calls: usize,
    /// Callers' reads in flight per kind (`chains.<name>.max_caller_reads`).
    pub max_caller_reads: usize,
}

impl ClientLimits {
    /// The engine's share of a URL's requests at once: a quarter, at least one. Together with
    /// the callers' share it stays within `max_in_flight` (where that is at least two).
    fn own_in_flight(&self) -> usize {
        (self.max_in_flight / 4).max(1)
    }

    fn callers_in_flight(&self) -> usize {
        self.max_in_flight
            .saturating_sub(self.own_in_flight())
            .max(1)
    }
}

impl Upstream {
    fn http(&self, traffic: Traffic) -> &HttpClient {
        match traffic {
            Traffic::Own => &self.own,
            Traffic::Callers => &self.client,
        }
    }
}

/// Counts one HTTP request down when it ends, answered or dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_param_is_sent_last_as_it_is() {
        let raw = RawValue::from_string(r#"{"0xab":{"code":"0x00"}}"#.to_string()).unwrap();
        let raw: &'static RawValue = Box::leak(raw);
        let values = [
            serde_json::json!({"to": "0x01"}),
            serde_json::json!("latest"),
        ];
        let params = |values: &[Value], raw| {
            Params { values, raw }
                .to_rpc_params()
                .unwrap()
                .unwrap()
                .get()
                .to_string()
        };
        assert_eq!(
            params(&values, Some(raw)),
            r#"[{"to":"0x01"},"latest",{"0xab":{"code":"0x00"}}]"#
        );
        assert_eq!(params(&[], Some(raw)), r#"[{"0xab":{"code":"0x00"}}]"#);
        assert_eq!(params(&values, None), r#"[{"to":"0x01"},"latest"]"#);
    }
}
