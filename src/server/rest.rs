//! The tower layer in front of jsonrpsee: it serves the REST routes itself and hands JSON-RPC
//! requests at `POST /` through to jsonrpsee. A `POST /` body that is not a JSON-RPC envelope is
//! the REST form of the router.
//!
//! Invariants: a route is answered from the listener's [`Routes`]: a service's routes are
//! there only with its handlers, and answer "no route" (404) otherwise, as any unknown path.
//! Every request is counted and logged once, by route label, status and API key name.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Method, StatusCode};
use jsonrpsee::core::BoxError;
use jsonrpsee::server::{HttpBody, HttpRequest, HttpResponse};
use tower::{Layer, Service};
use tracing::Instrument;

use super::auth::Key;
use super::client::ClientId;
use super::idempotency;
use super::listen::{Caller, ClientAddr};
use super::ops;
use super::wire_errors::{json_bytes_response, json_response, parse_body, WireError};
use super::{App, Routes, Surface};
use crate::facilitator::discovery::query::{list_query, search_query, Viewer};
use crate::facilitator::protocol::v1::SettleResponse;
use crate::facilitator::protocol::v2;
use crate::facilitator::{Facilitator, Payment, SettleError};
use crate::ledger::Asking;
use crate::telemetry;

mod parse;

use parse::allowed;
pub(crate) use parse::{
    asking, first_json_byte, is_json_rpc, parse_payment, parse_payment_body, read_body,
};

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
                    routes.app.metrics.observe_error(route, error.code);
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
    allowed(&*payment, asker.key.as_deref())?;
    let started = Instant::now();
    let verified = payment.verify().await;
    app.metrics
        .observe_verify_time(payment.family(), started.elapsed());
    let answer = verified?;
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

/// `GET /settlements/{network}/{asset}/{from}/{nonce}` and
/// `GET /settlements/{network}/{signature}`: 200 with the settlement's state, or 404. `network`
/// is the configured name, or with v2 served its CAIP-2 name.
async fn settlement_status(
    facilitator: &Facilitator,
    path: &str,
    note: &mut Note,
) -> Result<HttpResponse, WireError> {
    let rest = &path[STATUS_PREFIX.len()..];
    let lookup = facilitator
        .status_of(rest)
        .map_err(WireError::bad_request)?;
    note.payment = Some(lookup.label());
    let found = lookup.find().await.map_err(SettleError::from)?;
    let found =
        found.ok_or_else(|| WireError::new(StatusCode::NOT_FOUND, 404, lookup.missing()))?;
    note.outcome = Some(found.state);
    Ok(json_bytes_response(StatusCode::OK, found.body))
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
    allowed(&*payment, caller)?;
    let asking = asking(
        payment.payment_identifier(),
        &asker,
        key.as_deref(),
        None,
        &bytes,
    )?;
    drop(bytes); // not kept while the settlement waits for its block
    let answer = settle_one(app, &*payment, &asking, caller).await?;
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
            let payment = parse_payment(facilitator, item, &format!("[{i}]"))?;
            let asking = asking(payment.payment_identifier(), asker, key, Some(i), &element)?;
            Ok((payment, asking))
        })
        .collect::<Result<Vec<(Box<dyn Payment + '_>, Asking)>, WireError>>()?;
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
            allowed(&*p, caller)?;
            settle_one(app, &*p, &asking, caller).await
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
    payment: &dyn Payment,
    asking: &Asking,
    caller: Option<&Key>,
) -> Result<SettleResponse, WireError> {
    let family = payment.family();
    let private = caller.is_some_and(Key::private_listings);
    let started = Instant::now();
    let result = payment.settle(asking, private).await;
    app.metrics.observe_settle_time(family, started.elapsed());
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
