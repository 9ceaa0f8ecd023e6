//! The tower layer in front of jsonrpsee: it serves the REST routes itself and hands JSON-RPC
//! requests at `POST /` through to jsonrpsee. A `POST /` body that is not a JSON-RPC envelope is
//! the REST form of the router.
//!
//! Invariants: a route is answered from the listener's [`Routes`]: a service's routes are
//! there only with its handlers, and answer "no route" (404) otherwise, as any unknown path.
//! Every request is counted and logged once, by route label, status and API key name.

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Method, StatusCode};
use http_body_util::{BodyExt, Limited};
use jsonrpsee::core::BoxError;
use jsonrpsee::server::{HttpBody, HttpRequest, HttpResponse};
use tower::{Layer, Service};
use tracing::Instrument;

use super::auth::{Key, Payee};
use super::client::ClientId;
use super::idempotency;
use super::listen::{Caller, ClientAddr};
use super::ops::{self, NetworkFamily};
use super::wire_errors::{json_response, parse_body, parse_value_with, WireError};
use super::{App, Routes, Surface};
use crate::evm;
use crate::evm::parse_address;
use crate::facilitator::discovery::query::{list_query, search_query, Viewer};
use crate::facilitator::protocol::v1::{PaymentRequest, SettleResponse};
use crate::facilitator::protocol::values::Payload;
use crate::facilitator::protocol::{self, v2};
use crate::facilitator::svm::wire::{self as svm, SvmRequest};
use crate::facilitator::{Facilitator, SettleError};
use crate::ledger::{Asking, Pass, PaymentKey};
use crate::telemetry;

#[derive(Clone)]
pub struct RestLayer {
    routes: Arc<Routes>,
}

impl RestLayer {
    pub(crate) fn new(routes: Arc<Routes>) -> Self {
        Self { routes }
    }
}

impl<S> Layer<S> for RestLayer {
    type Service = RestService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RestService {
            inner,
            routes: self.routes.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RestService<S> {
    inner: S,
    routes: Arc<Routes>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<HttpRequest> for RestService<S>
where
    S: Service<HttpRequest, Response = HttpResponse, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = HttpResponse;
    type Error = BoxError;
    type Future = BoxFuture<Result<HttpResponse, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: HttpRequest) -> Self::Future {
        // The clone that was polled ready serves this call; a fresh clone is left for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let routes = self.routes.clone();
        let route = ops::route_label(request.uri().path());
        let span = telemetry::request_span(request.method(), route, request.headers());
        let trace_id = telemetry::trace_id(&span, request.headers());
        let method = request.method().clone();
        // Boxed: an async block keeps what it captures for as long as it lives (a settle waits
        // for its block), and the route takes the request and the inner service at once.
        let input = Box::new((request, inner));
        let answer = async move {
            let started = Instant::now();
            let mut note = Note::default();
            let (request, inner) = *input;
            let routed = match dispatch(&routes, request, inner, &mut note) {
                Ok(route) => route.await,
                Err(error) => Err(error),
            };
            let response = match routed {
                Ok(response) => response,
                Err(error) => {
                    note.outcome
                        .get_or_insert_with(|| format!("error {}", error.code));
                    error.into_response()
                }
            };
            let status = response.status().as_u16();
            routes.app.metrics.observe_request(
                route,
                status,
                note.key.as_deref().unwrap_or(""),
                started.elapsed(),
            );
            note.record(&tracing::Span::current(), status);
            tracing::info!(
                %method,
                route,
                status,
                latency_ms = started.elapsed().as_millis() as u64,
                outcome = note.outcome.as_deref().unwrap_or(""),
                payment = note.payment.as_deref().unwrap_or(""),
                key = note.key.as_deref().unwrap_or(""),
                trace_id = trace_id.as_deref().unwrap_or(""),
                "request"
            );
            Ok(response)
        };
        Box::pin(answer.instrument(span))
    }
}

/// What the one log line of a request says beyond route, status and latency.
#[derive(Default)]
struct Note {
    /// Payment keys (network|asset|from|nonce): never signatures or whole bodies.
    payment: Option<String>,
    /// The API key's name (never its token).
    key: Option<String>,
    outcome: Option<String>,
}

impl Note {
    /// The request's span gets what its log line says (a disabled span ignores it).
    fn record(&self, span: &tracing::Span, status: u16) {
        if span.is_disabled() {
            return;
        }
        span.record("http.response.status_code", status);
        if status >= 500 {
            span.record("otel.status_code", "ERROR");
        }
        for (field, value) in [
            ("outcome", &self.outcome),
            ("payment", &self.payment),
            ("api_key", &self.key),
        ] {
            if let Some(value) = value {
                span.record(field, value.as_str());
            }
        }
    }
}

/// A route's answer to come, boxed on its own: a request holds only its route's state, not the
/// largest of all of them (a settle waiting for its block, 1,000 at a time).
type Routed<'a> = Pin<Box<dyn Future<Output = Result<HttpResponse, WireError>> + Send + 'a>>;

/// Picks the request's route: the caller and its rate are checked here, before any future is
/// made; the request is taken apart by the route that needs it.
fn dispatch<'a, S>(
    routes: &'a Routes,
    request: HttpRequest,
    inner: S,
    note: &'a mut Note,
) -> Result<Routed<'a>, WireError>
where
    S: Service<HttpRequest, Response = HttpResponse, Error = BoxError> + Send + 'static,
    S::Future: Send,
{
    let (app, surface) = (&*routes.app, routes.surface);
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let caller = caller_of(app, surface, &method, &path, request.headers())?;
    note.key = caller.as_ref().map(|k| k.name.clone());
    let client = request
        .extensions()
        .get::<ClientAddr>()
        .map(|ClientAddr(peer)| ClientId::of(app.proxies.resolve(peer.ip(), request.headers())));
    if path != "/health" {
        admit(app, caller.as_deref(), client, 1)?;
    }
    let asker = Asker::new(caller, client);
    if let Some(facilitator) = &routes.facilitator {
        if is_facilitator_path(&path) {
            return facilitator_route(app, facilitator, asker, &method, &path, request, note);
        }
    }
    if surface.rpc && path.starts_with(CHAINS_PREFIX) {
        return Ok(Box::pin(chain_route(routes, asker, method, path, request)));
    }
    if surface.rpc && matches!(path.as_str(), "/" | "/quote") {
        return Ok(Box::pin(router_route(
            routes, asker, method, path, request, inner,
        )));
    }
    match (path.as_str(), &method) {
        ("/health", &Method::GET) => Ok(answered(ops::health())),
        ("/ready", &Method::GET) if surface.ops => {
            Ok(Box::pin(async move { Ok(ops::ready(&app.services).await) }))
        }
        ("/metrics", &Method::GET) if surface.ops => {
            Ok(Box::pin(async move { Ok(ops::metrics(app).await) }))
        }
        ("/health", _) => Err(WireError::method_not_allowed(&method, &path, "GET")),
        ("/ready" | "/metrics", _) if surface.ops => {
            Err(WireError::method_not_allowed(&method, &path, "GET"))
        }
        _ => Err(WireError::not_found(&path)),
    }
}

/// A route answered without waiting for anything.
fn answered<'a>(response: HttpResponse) -> Routed<'a> {
    Box::pin(std::future::ready(Ok(response)))
}

/// `/` and `/quote` on a listener serving the router's surface. JSON-RPC at `POST /` goes to
/// jsonrpsee whether or not a router is configured (its methods are there only with one).
async fn router_route<S>(
    routes: &Routes,
    call: Asker,
    method: Method,
    path: String,
    request: HttpRequest,
    mut inner: S,
) -> Result<HttpResponse, WireError>
where
    S: Service<HttpRequest, Response = HttpResponse, Error = BoxError>,
{
    let app = &*routes.app;
    match (path.as_str(), &method, &routes.router) {
        ("/", &Method::POST, router) => {
            let (mut parts, body) = request.into_parts();
            let bytes = read_body(app, body).await?;
            admit(app, call.key.as_deref(), call.client, extra_calls(&bytes))?; // each entry of a batch counts
            if is_json_rpc(&bytes) {
                // The body was read as JSON already; a client that left out the header is served
                // rather than told 415 in plain text.
                parts.headers.insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                parts.extensions.insert(call.who);
                let request = HttpRequest::from_parts(parts, HttpBody::from(bytes));
                inner.call(request).await.map_err(|e| {
                    WireError::new(StatusCode::INTERNAL_SERVER_ERROR, 500, e.to_string())
                })
            } else {
                match router {
                    Some(router) => router.route_rest(&bytes, &call.who).await,
                    None => Err(WireError::not_found("/ (no [router] configured)")),
                }
            }
        }
        ("/quote", &Method::POST, Some(router)) => {
            let bytes = read_body(app, request.into_body()).await?;
            router.quote_rest(&bytes).await
        }
        ("/", _, _) | ("/quote", _, Some(_)) => {
            Err(WireError::method_not_allowed(&method, &path, "POST"))
        }
        _ => Err(WireError::not_found(&path)),
    }
}

const CHAINS_PREFIX: &str = "/chains/";

/// `POST /chains/<name>` on a listener serving the router's surface: the chain's JSON-RPC
/// endpoint, each entry of a batch counted by the caller's rate.
async fn chain_route(
    routes: &Routes,
    call: Asker,
    method: Method,
    path: String,
    request: HttpRequest,
) -> Result<HttpResponse, WireError> {
    let name = &path[CHAINS_PREFIX.len()..];
    let Some(router) = &routes.router else {
        return Err(WireError::not_found(&path));
    };
    if method != Method::POST {
        return Err(WireError::method_not_allowed(&method, &path, "POST"));
    }
    let app = &*routes.app;
    let bytes = read_body(app, request.into_body()).await?;
    admit(app, call.key.as_deref(), call.client, extra_calls(&bytes))?;
    router.chain_rpc(name, &bytes, &call.who).await
}

fn is_facilitator_path(path: &str) -> bool {
    matches!(
        path,
        "/supported" | "/verify" | "/settle" | DISCOVERY_RESOURCES | DISCOVERY_SEARCH
    ) || path.starts_with(STATUS_PREFIX)
}

const DISCOVERY_RESOURCES: &str = "/discovery/resources";
const DISCOVERY_SEARCH: &str = "/discovery/search";

/// Who makes a request, when API keys are configured: `/health`, `/supported` and the ops
/// listener's routes are open; every other route needs a known key.
fn caller_of(
    app: &App,
    surface: Surface,
    method: &Method,
    path: &str,
    headers: &http::HeaderMap,
) -> Result<Option<Arc<Key>>, WireError> {
    let Some(keys) = &app.keys else {
        return Ok(None);
    };
    let ops_listener = surface.ops && !surface.rpc && !surface.facilitator;
    let open = matches!((path, method), ("/health" | "/supported", &Method::GET));
    if open || ops_listener {
        return Ok(None);
    }
    keys.caller(headers).map(Some)
}

/// Takes `calls` from the caller's bucket: its API key's, else (with `client_rate_per_sec`)
/// its client address's.
fn admit(
    app: &App,
    caller: Option<&Key>,
    client: Option<ClientId>,
    calls: u32,
) -> Result<(), WireError> {
    match (caller, &app.client_limit, client) {
        (Some(key), _, _) => key.admit(calls),
        (None, Some(limit), Some(client)) => limit.admit(client, calls),
        _ => Ok(()),
    }
}

/// Takes up to `wanted` more tokens, one at a time, from the caller's bucket: how many it got,
/// and the 429 the first refused one answered.
fn admit_each(app: &App, asker: &Asker, wanted: usize) -> (usize, Option<WireError>) {
    for taken in 0..wanted {
        if let Err(over) = admit(app, asker.key.as_deref(), asker.client, 1) {
            return (taken, Some(over));
        }
    }
    (wanted, None)
}

/// Calls in a body beyond the first, which the rate counts too: the entries of an array.
pub(crate) fn extra_calls(bytes: &[u8]) -> u32 {
    if first_json_byte(bytes) != Some(b'[') {
        return 0;
    }
    serde_json::from_slice::<Vec<serde::de::IgnoredAny>>(bytes)
        .map_or(0, |entries| entries.len().saturating_sub(1) as u32)
}

/// Who calls a route: its API key, if any, its client address, and its caller identity (the
/// key's name, or the client address) for its rate, its nonce reservations and its payments.
pub(crate) struct Asker {
    key: Option<Arc<Key>>,
    client: Option<ClientId>,
    who: Caller,
}

impl Asker {
    fn new(key: Option<Arc<Key>>, client: Option<ClientId>) -> Self {
        let who = Caller::of(key.as_ref().map(|k| k.name.as_str()), client.as_ref());
        Asker { key, client, who }
    }

    /// A caller without an API key, named `who` (the fuzz targets' caller).
    pub(crate) fn stranger(who: &str) -> Self {
        Asker {
            key: None,
            client: None,
            who: Caller(who.to_string()),
        }
    }
}

/// A facilitator route: the request is taken apart here, so that its future keeps only what
/// the route reads (for a settle, its body and its `Idempotency-Key`).
fn facilitator_route<'a>(
    app: &'a App,
    facilitator: &'a Facilitator,
    asker: Asker,
    method: &Method,
    path: &str,
    request: HttpRequest,
    note: &'a mut Note,
) -> Result<Routed<'a>, WireError> {
    if path.starts_with(STATUS_PREFIX) {
        if method != Method::GET {
            return Err(WireError::method_not_allowed(method, path, "GET"));
        }
        let path = path.to_string();
        return Ok(Box::pin(async move {
            settlement_status(facilitator, &path, note).await
        }));
    }
    match (path, method) {
        ("/supported", &Method::GET) => Ok(answered(json_response(
            StatusCode::OK,
            &facilitator.supported(),
        ))),
        ("/verify", &Method::POST) => Ok(Box::pin(verify(
            app,
            facilitator,
            asker,
            request.into_body(),
            note,
        ))),
        ("/settle", &Method::POST) => {
            let key = idempotency::header_key(request.headers())?;
            let body = request.into_body();
            Ok(Box::pin(settle(app, facilitator, asker, body, key, note)))
        }
        (DISCOVERY_RESOURCES | DISCOVERY_SEARCH, &Method::GET) => {
            let query = request.uri().query().map(str::to_string);
            let path = path.to_string();
            Ok(Box::pin(async move {
                discovery(facilitator, &asker, &path, query.as_deref()).await
            }))
        }
        ("/supported" | DISCOVERY_RESOURCES | DISCOVERY_SEARCH, _) => {
            Err(WireError::method_not_allowed(method, path, "GET"))
        }
        _ => Err(WireError::method_not_allowed(method, path, "POST")),
    }
}

/// `POST /verify`.
async fn verify(
    app: &App,
    facilitator: &Facilitator,
    asker: Asker,
    body: HttpBody,
    note: &mut Note,
) -> Result<HttpResponse, WireError> {
    let bytes = read_body(app, body).await?;
    let payment = parse_payment_body(facilitator, &bytes)?;
    note.payment = Some(payment.label());
    payment.allowed(asker.key.as_deref())?;
    let answer = match &payment {
        Payment::V1(p) => Box::pin(facilitator.verify(p)).await?,
        Payment::V2(p) => Box::pin(facilitator.verify_v2(p)).await?,
        Payment::Svm(p) => Box::pin(facilitator.verify_svm(p)).await?,
    };
    note.outcome = Some(answer.invalid_reason.unwrap_or("valid").to_string());
    Ok(json_response(StatusCode::OK, &answer))
}

/// `GET /discovery/resources` and `GET /discovery/search` (404 while the catalogue is off):
/// what the caller's API key may see of the catalogue.
async fn discovery(
    facilitator: &Facilitator,
    asker: &Asker,
    path: &str,
    query: Option<&str>,
) -> Result<HttpResponse, WireError> {
    let Some(catalogue) = facilitator.catalogue() else {
        return Err(WireError::not_found(path));
    };
    let viewer = asker.key.as_deref().map_or(Viewer::Stranger, Key::viewer);
    let page = if path == DISCOVERY_RESOURCES {
        let listed = catalogue.resources(&list_query(query)?, &viewer).await;
        listed.map(|page| serde_json::to_value(page).expect("pages serialize"))
    } else {
        let found = catalogue.search(&search_query(query)?, &viewer).await;
        found.map(|page| serde_json::to_value(page).expect("pages serialize"))
    };
    Ok(json_response(
        StatusCode::OK,
        &page.map_err(SettleError::from)?,
    ))
}

const STATUS_PREFIX: &str = "/settlements/";

/// `GET /settlements/{network}/{asset}/{from}/{nonce}`: 200 with the settlement's state, or 404.
/// `network` is the configured name, or with v2 served its CAIP-2 name.
async fn settlement_status(
    facilitator: &Facilitator,
    path: &str,
    note: &mut Note,
) -> Result<HttpResponse, WireError> {
    let rest = &path[STATUS_PREFIX.len()..];
    if let Some((network, signature)) = rest.split_once('/').filter(|(_, s)| !s.contains('/')) {
        return svm_settlement_status(facilitator, network, signature, note).await;
    }
    let mut key = parse_status_path(rest)?;
    key.network = facilitator.network_name(&key.network).to_string();
    note.payment = Some(key.to_string());
    let found = facilitator.status(&key).await.map_err(SettleError::from)?;
    let state = found.as_ref().map(|s| s.state.to_string());
    found_or_404(found, state, note, || {
        format!("no settlement of payment {key}")
    })
}

/// A status route's answer: the settlement found (its state in the log line), or 404 naming what
/// was asked.
fn found_or_404<S: serde::Serialize>(
    found: Option<S>,
    state: Option<String>,
    note: &mut Note,
    missing: impl FnOnce() -> String,
) -> Result<HttpResponse, WireError> {
    let status = found.ok_or_else(|| WireError::new(StatusCode::NOT_FOUND, 404, missing()))?;
    note.outcome = state;
    Ok(json_response(StatusCode::OK, &status))
}

/// `GET /settlements/{network}/{signature}`: a Solana payment, by its transaction's signature.
async fn svm_settlement_status(
    facilitator: &Facilitator,
    network: &str,
    signature: &str,
    note: &mut Note,
) -> Result<HttpResponse, WireError> {
    let signature = crate::svm::Signature::from_str(signature)
        .map_err(|_| WireError::bad_request("signature: not a base58 transaction signature"))?;
    note.payment = Some(format!("{network}/{signature}"));
    let found = facilitator
        .svm_status(network, &signature)
        .await
        .map_err(SettleError::from)?;
    let state = found.as_ref().map(|s| s.state.to_string());
    found_or_404(found, state, note, || {
        format!("no settlement of transaction {signature} on {network}")
    })
}

pub(crate) fn parse_status_path(rest: &str) -> Result<PaymentKey, WireError> {
    let parts: Vec<&str> = rest.split('/').collect();
    let [network, asset, from, nonce] = parts[..] else {
        return Err(WireError::bad_request(
            "path: expected /settlements/{network}/{asset}/{from}/{nonce} or /settlements/{network}/{signature}",
        ));
    };
    let address = |field: &str, value: &str| {
        parse_address(value)
            .ok_or_else(|| WireError::bad_request(format!("{field}: not a 0x address")))
    };
    let nonce = evm::parse_h256(nonce)
        .ok_or_else(|| WireError::bad_request("nonce: not 0x + 64 hex digits"))?;
    if network.is_empty() {
        return Err(WireError::bad_request("network: empty"));
    }
    Ok(PaymentKey {
        network: network.to_string(),
        asset: address("asset", asset)?,
        from: address("from", from)?,
        nonce,
    })
}

/// A single payment answers a single result; an array answers an array, in order, each element
/// on its own: a pending or failed element gets the `Error` shape in its slot. `key` is the
/// request's `Idempotency-Key`.
async fn settle(
    app: &App,
    facilitator: &Facilitator,
    asker: Asker,
    body: HttpBody,
    key: Option<String>,
    note: &mut Note,
) -> Result<HttpResponse, WireError> {
    let bytes = read_body(app, body).await?;
    if first_json_byte(&bytes) == Some(b'[') {
        let batch = settle_batch(app, facilitator, &asker, &bytes, key.as_deref(), note);
        return Box::pin(batch).await;
    }
    let payment = parse_payment_body(facilitator, &bytes)?;
    note.payment = Some(payment.label());
    let caller = asker.key.as_deref();
    payment.allowed(caller)?;
    let asking = payment.asking(&asker, key.as_deref(), None, &bytes)?;
    drop(bytes); // not kept while the settlement waits for its block
    let answer = settle_one(app, facilitator, &payment, &asking, caller).await?;
    note.outcome = Some(settle_outcome(&answer));
    Ok(json_response(StatusCode::OK, &answer))
}

/// An array of payments, each settled on its own and answered in its slot.
async fn settle_batch(
    app: &App,
    facilitator: &Facilitator,
    asker: &Asker,
    bytes: &[u8],
    key: Option<&str>,
    note: &mut Note,
) -> Result<HttpResponse, WireError> {
    let caller = asker.key.as_deref();
    let items: Vec<serde_json::Value> = parse_body(bytes)?;
    if items.is_empty() || items.len() > facilitator.max_batch() {
        return Err(WireError::bad_request(format!(
            "body: an array of 1 to {} payments (facilitator.max_batch)",
            facilitator.max_batch()
        )));
    }
    let payments = items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let element = serde_json::to_vec(&item).expect("JSON values serialize");
            let payment = parse_payment(facilitator.serves_v2(), item, &format!("[{i}]"))?;
            let asking = payment.asking(asker, key, Some(i), &element)?;
            Ok((payment, asking))
        })
        .collect::<Result<Vec<(Payment, Asking)>, WireError>>()?;
    // Each element counts under the rate: the first took the request's token, the others
    // take one each, and those beyond the tokens left answer 429 in their slots.
    let (admitted, over) = admit_each(app, asker, payments.len().saturating_sub(1));
    note.payment = Some(
        payments
            .iter()
            .map(|(p, _)| p.label())
            .collect::<Vec<_>>()
            .join(","),
    );
    // An element whose payTo the key may not pay is refused in its own slot.
    let over = &over;
    let answers = futures::future::join_all(payments.into_iter().enumerate().map(
        |(i, (p, asking))| async move {
            if i > admitted {
                return Err(over
                    .clone()
                    .expect("an element beyond the tokens has its 429"));
            }
            p.allowed(caller)?;
            settle_one(app, facilitator, &p, &asking, caller).await
        },
    ))
    .await;
    note.outcome = Some(
        answers
            .iter()
            .map(|a| match a {
                Ok(answer) => settle_outcome(answer),
                Err(e) => format!("error {}", e.code),
            })
            .collect::<Vec<_>>()
            .join(","),
    );
    let slots: Vec<serde_json::Value> = answers
        .into_iter()
        .map(|a| match a {
            Ok(answer) => serde_json::to_value(answer).expect("answers serialize"),
            Err(e) => e.body(),
        })
        .collect();
    Ok(json_response(StatusCode::OK, &slots))
}

fn settle_outcome(answer: &SettleResponse) -> String {
    match &answer.error_reason {
        None => format!("settled {}", answer.transaction),
        Some(reason) => reason.clone(),
    }
}

/// One payment settled; a v2 success may list its resource in the discovery catalogue, kept
/// private when the caller's API key says so.
async fn settle_one(
    app: &App,
    facilitator: &Facilitator,
    payment: &Payment,
    asking: &Asking,
    caller: Option<&Key>,
) -> Result<SettleResponse, WireError> {
    let family = payment.family();
    // Boxed per family: an EVM settlement waiting for its block does not carry Solana's state.
    let result = match payment {
        Payment::V1(p) => Box::pin(facilitator.settle(p, asking)).await,
        Payment::V2(p) => {
            let settled = Box::pin(facilitator.settle_v2(p, asking)).await;
            if let Ok(answer) = &settled {
                let private = caller.is_some_and(Key::private_listings);
                facilitator.discovered(p, answer, private).await;
            }
            settled
        }
        Payment::Svm(p) => Box::pin(facilitator.settle_svm(p, asking)).await,
    };
    app.metrics.observe_settlement(
        family,
        match &result {
            Ok(answer) if answer.success => "success",
            Ok(answer) if answer.error_reason.as_deref() == Some(v2::SETTLEMENT_PENDING) => {
                "pending"
            }
            Ok(_) => "failure",
            Err(SettleError::Pending(_) | SettleError::PendingSignature(_)) => "pending",
            Err(_) => "error",
        },
    );
    Ok(result?)
}

/// A facilitator request in the wire format of its x402 version; a Solana one in Solana's.
pub(crate) enum Payment {
    V1(PaymentRequest),
    V2(v2::PaymentRequest),
    Svm(SvmRequest),
}

/// One payment body, as its version's wire type.
fn parse_payment_body(facilitator: &Facilitator, bytes: &[u8]) -> Result<Payment, WireError> {
    match parse_payment_direct(facilitator.serves_v2(), bytes) {
        Some(payment) => Ok(payment),
        None => parse_payment(facilitator.serves_v2(), parse_body(bytes)?, ""),
    }
}

/// The common body, read straight into its wire type without building a JSON tree first; `None`
/// sends it the checked way, which reads it the same and names the field of any failure.
///
/// Only a body that says its version at the top level, as a number, is read here: then it is
/// the version [`protocol::version_of`] reads. A body with no `[` anywhere cannot hold an array
/// where an object belongs, which serde's derive would otherwise read as a tuple of fields.
pub(crate) fn parse_payment_direct(serves_v2: bool, bytes: &[u8]) -> Option<Payment> {
    #[derive(serde::Deserialize)]
    struct Version {
        #[serde(rename = "x402Version")]
        version: Option<u64>,
        #[serde(rename = "paymentRequirements")]
        requirements: Option<Network>,
    }
    #[derive(serde::Deserialize)]
    struct Network {
        network: Option<String>,
    }
    if bytes.contains(&b'[') {
        return None;
    }
    let peek = serde_json::from_slice::<Version>(bytes).ok()?;
    // A Solana body goes the checked way, which reads the family from the network.
    let network = peek.requirements.and_then(|r| r.network);
    if network.as_deref().is_some_and(svm::is_solana) {
        return None;
    }
    let version = peek.version?;
    if reads_as_v2(Some(version), serves_v2) {
        serde_json::from_slice(bytes).ok().map(Payment::V2)
    } else {
        serde_json::from_slice(bytes).ok().map(Payment::V1)
    }
}

/// A body speaking version 2 is read as v2 where v2 is served; every other body is read as v1,
/// whose rule 1 refuses versions other than 1.
fn reads_as_v2(version: Option<u64>, serves_v2: bool) -> bool {
    version == Some(2) && serves_v2
}

/// A body already read as JSON, checked field by field: a failure names the field, after
/// `prefix` (an array settle's `[i]`).
pub(crate) fn parse_payment(
    serves_v2: bool,
    body: serde_json::Value,
    prefix: &str,
) -> Result<Payment, WireError> {
    let network = body.pointer("/paymentRequirements/network");
    if network.and_then(|n| n.as_str()).is_some_and(svm::is_solana) {
        let request = if reads_as_v2(protocol::version_of(&body), serves_v2) {
            SvmRequest::V2(parse_value_with(body, svm::V2_OBJECTS, prefix)?)
        } else {
            SvmRequest::V1(parse_value_with(body, svm::V1_OBJECTS, prefix)?)
        };
        return Ok(Payment::Svm(request));
    }
    if reads_as_v2(protocol::version_of(&body), serves_v2) {
        parse_value_with(body, v2::PaymentRequest::OBJECTS, prefix).map(Payment::V2)
    } else {
        parse_value_with(body, PaymentRequest::OBJECTS, prefix).map(Payment::V1)
    }
}

impl Payment {
    /// Who asks to settle this payment: the request's `Idempotency-Key` (scoped to the API key,
    /// else to the client) is its retry key; without one, v2's `payment-identifier` id is the key that names the
    /// payment for this caller (never a retry key); the caller and the hash of `body` are its
    /// pass for the pending rule. The id is read, and checked, whether or not a header is set.
    pub(crate) fn asking(
        &self,
        asker: &Asker,
        header: Option<&str>,
        element: Option<usize>,
        body: &[u8],
    ) -> Result<Asking, WireError> {
        let payment_id = match self {
            Payment::V2(p) => p
                .payment_payload
                .payment_identifier()
                .map_err(|field| WireError::bad_request(prefixed(element, field)))?,
            Payment::Svm(SvmRequest::V2(p)) => p
                .payment_payload
                .payment_identifier()
                .map_err(|field| WireError::bad_request(prefixed(element, field)))?,
            Payment::V1(_) | Payment::Svm(SvmRequest::V1(_)) => None,
        };
        // Keys are the caller's (access.md §3b): an API key's, else the client's, so another
        // client cannot occupy a merchant's key.
        let scope = asker
            .key
            .as_deref()
            .map_or(asker.who.0.as_str(), |k| k.name.as_str());
        let tag = match (header, payment_id) {
            (Some(_), _) => {
                idempotency::tag(header, element, body).map(|t| idempotency::scoped(t, scope))
            }
            (None, Some(id)) => Some(idempotency::identifier_tag(&asker.who.0, id, body)),
            (None, None) => None,
        };
        Ok(Asking {
            tag,
            payment_id: payment_id.map(str::to_string),
            pass: Pass {
                caller: asker.who.0.clone(),
                body: idempotency::body_hash(body),
            },
        })
    }

    fn family(&self) -> NetworkFamily {
        match self {
            Payment::V1(_) | Payment::V2(_) => NetworkFamily::Evm,
            Payment::Svm(_) => NetworkFamily::Svm,
        }
    }

    /// 403 when the caller's key may not verify or settle for this payment's payTo.
    fn allowed(&self, caller: Option<&Key>) -> Result<(), WireError> {
        let Some(key) = caller else {
            return Ok(());
        };
        let pay_to = match self {
            Payment::V1(p) => parse_address(&p.payment_requirements.pay_to).map(Payee::Evm),
            Payment::V2(p) => parse_address(&p.payment_requirements.pay_to).map(Payee::Evm),
            Payment::Svm(p) => {
                let (_, pay_to, _) = p.terms();
                crate::svm::Pubkey::from_str(pay_to).ok().map(Payee::Svm)
            }
        };
        match key.may_pay(pay_to) {
            true => Ok(()),
            false => Err(key.forbidden()),
        }
    }

    /// network|asset|from|nonce, for the request's log line.
    pub(crate) fn label(&self) -> String {
        let (network, asset, payload) = match self {
            Payment::V1(p) => (
                &p.payment_requirements.network,
                &p.payment_requirements.asset,
                Payload::from(&p.payment_payload.payload),
            ),
            Payment::V2(p) => (
                &p.payment_requirements.network,
                &p.payment_requirements.asset,
                Payload::from(&p.payment_payload.payload),
            ),
            // A Solana payment is its message: the log names its network, payTo and asset.
            Payment::Svm(p) => {
                let (network, pay_to, asset) = p.terms();
                return format!("{network}|{asset}|{pay_to}");
            }
        };
        let (from, nonce) = (payload.payer(), payload.nonce());
        format!(
            "{network}|{asset}|{}|{}",
            from.unwrap_or_default(),
            nonce.unwrap_or_default()
        )
    }
}

/// A field path inside an array settle's element `[i]`.
fn prefixed(element: Option<usize>, message: String) -> String {
    match element {
        Some(i) => format!("[{i}].{message}"),
        None => message,
    }
}

/// The whole body, within `server.max_body_bytes` and `server.request_read_timeout_ms`: a client
/// that sends its headers and then stalls is answered 408, and its connection closed.
pub async fn read_body(app: &App, body: HttpBody) -> Result<Vec<u8>, WireError> {
    let limit = app.max_body_bytes;
    let reading = Limited::new(body, limit as usize).collect();
    let Ok(read) = tokio::time::timeout(app.read_timeout, reading).await else {
        return Err(WireError::new(
            StatusCode::REQUEST_TIMEOUT,
            408,
            "body not received within server.request_read_timeout_ms",
        ));
    };
    match read {
        Ok(collected) => Ok(collected.to_bytes().to_vec()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(WireError::too_large(limit))
        }
        Err(error) => Err(WireError::bad_request(format!(
            "body could not be read: {error}"
        ))),
    }
}

pub(crate) fn first_json_byte(bytes: &[u8]) -> Option<u8> {
    bytes.iter().copied().find(|b| !b.is_ascii_whitespace())
}

/// JSON-RPC requests are arrays (batches) or objects carrying `"jsonrpc"`; anything that is not
/// JSON also goes to jsonrpsee, which answers a JSON-RPC parse error.
pub(crate) fn is_json_rpc(bytes: &[u8]) -> bool {
    /// The object's members skipped over, not built, noting whether `jsonrpc` is one of them
    /// (whatever its value, `null` included).
    #[derive(serde::Deserialize)]
    struct Members {
        #[serde(default)]
        jsonrpc: Present,
    }
    #[derive(Default)]
    struct Present(bool);
    impl<'de> serde::Deserialize<'de> for Present {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            serde::de::IgnoredAny::deserialize(d).map(|_| Present(true))
        }
    }
    match first_json_byte(bytes) {
        Some(b'[') => true,
        Some(b'{') => match serde_json::from_slice::<Members>(bytes) {
            Ok(members) => members.jsonrpc.0,
            Err(_) => true,
        },
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = r#"{"x402Version":1,"paymentPayload":{"x402Version":1,"scheme":"exact","network":"base","payload":{"signature":"0x01","authorization":{"from":"0xa","to":"0xb","value":"1","validAfter":"0","validBefore":"9","nonce":"0xc"}}},"paymentRequirements":{"scheme":"exact","network":"base","maxAmountRequired":"1","resource":"https://r","description":"d \"q\"","mimeType":"m","payTo":"0xb","maxTimeoutSeconds":60,"asset":"0xd","extra":{"name":"USDC","version":"2"}}}"#;
    const V2: &str = r#"{"x402Version":2,"paymentPayload":{"x402Version":2,"resource":{"url":"https://r"},"accepted":{"scheme":"exact","network":"eip155:8453","amount":"1","asset":"0xd","payTo":"0xb","maxTimeoutSeconds":60},"payload":{"signature":"0x01","authorization":{"from":"0xa","to":"0xb","value":"1","validAfter":"0","validBefore":"9","nonce":"0xc"}}},"paymentRequirements":{"scheme":"exact","network":"eip155:8453","amount":"1","asset":"0xd","payTo":"0xb","maxTimeoutSeconds":60}}"#;

    /// What the checked path makes of a body, as text to compare.
    fn checked(serves_v2: bool, body: &str) -> Result<String, String> {
        parse_body(body.as_bytes())
            .and_then(|value| parse_payment(serves_v2, value, ""))
            .map(|p| describe(&p))
            .map_err(|e| e.message)
    }

    fn describe(payment: &Payment) -> String {
        match payment {
            Payment::V1(p) => format!("v1 {p:?}"),
            Payment::V2(p) => format!("v2 {p:?}"),
            Payment::Svm(p) => format!("svm {p:?}"),
        }
    }

    #[test]
    fn a_solana_body_is_read_in_solanas_shape_by_its_network() {
        let v2 = r#"{"x402Version":2,"paymentPayload":{"x402Version":2,"accepted":{"scheme":"exact","network":"solana:x","amount":"1","asset":"m","payTo":"p","maxTimeoutSeconds":60},"payload":{"transaction":"AA=="}},"paymentRequirements":{"scheme":"exact","network":"solana:x","amount":"1","asset":"m","payTo":"p","maxTimeoutSeconds":60}}"#;
        assert!(parse_payment_direct(true, v2.as_bytes()).is_none());
        assert!(checked(true, v2).unwrap().starts_with("svm V2("));
        let v1 = V1.replace("\"network\":\"base\"", "\"network\":\"solana-devnet\"");
        assert_eq!(
            checked(true, &v1).unwrap_err(),
            "paymentPayload.payload.transaction: missing"
        );
    }

    #[test]
    fn the_direct_read_agrees_with_the_checked_one_or_declines() {
        let bodies = [
            V1.to_string(),
            V2.to_string(),
            // duplicate keys: the checked read keeps the last one, the direct one declines
            V1.replacen(r#""x402Version":1,"#, r#""x402Version":2,"x402Version":1,"#, 1),
            // versions that are not a top-level number are for the checked read
            V2.replacen(r#""x402Version":2,"#, "", 1),
            V2.replacen(r#""x402Version":2"#, r#""x402Version":null"#, 1),
            V1.replacen(r#""x402Version":1"#, r#""x402Version":"1""#, 1),
            V1.replacen(r#""x402Version":1"#, r#""x402Version":1.0"#, 1),
            // an object given as an array, which serde's derive would read as a tuple
            V1.replacen(
                r#""authorization":{"from":"0xa","to":"0xb","value":"1","validAfter":"0","validBefore":"9","nonce":"0xc"}"#,
                r#""authorization":["0xa","0xb","1","0","9","0xc"]"#,
                1,
            ),
            // a `[` in a string: the direct read declines what it cannot tell apart
            V1.replacen(r#"\"q\""#, "[q]", 1),
            V1.replacen(r#""value":"1""#, r#""value":1"#, 1),
            V1.replacen(r#""payTo":"0xb","#, "", 1),
            format!("{V1} x"),
            "7".to_string(),
            "{}".to_string(),
        ];
        let mut direct_reads = 0;
        for body in &bodies {
            for serves_v2 in [false, true] {
                let Some(direct) = parse_payment_direct(serves_v2, body.as_bytes()) else {
                    continue;
                };
                direct_reads += 1;
                assert_eq!(Ok(describe(&direct)), checked(serves_v2, body), "{body}");
            }
        }
        // V1 with and without v2 served, V2 where v2 is served, and no other body
        assert_eq!(direct_reads, 3);
        let tuple = &bodies[7];
        assert!(parse_payment_direct(true, tuple.as_bytes()).is_none());
        assert_eq!(
            checked(true, tuple).unwrap_err(),
            "paymentPayload.payload.authorization: invalid type: array, expected an object"
        );
    }

    #[test]
    fn tells_json_rpc_from_rest() {
        assert!(is_json_rpc(br#"{"jsonrpc":"2.0","id":1,"method":"m"}"#));
        assert!(is_json_rpc(br#" [{"jsonrpc":"2.0"}]"#));
        assert!(is_json_rpc(b"not json"));
        assert!(is_json_rpc(br#"{"jsonrpc":null,"id":1}"#));
        assert!(is_json_rpc(br#"{"jsonrpc":"2.0","jsonrpc":"2.0"}"#));
        assert!(is_json_rpc(br#"{"from":"0x""#));
        assert!(!is_json_rpc(
            br#"{"from":"0x","to":"0x","data":"0x","value":"0"}"#
        ));
    }
}
