//! The router's JSON-RPC methods, one `#[rpc]` trait per namespace (`eth_routerTransaction` and
//! the wallet's `eth_sendRawTransaction`, `eth_getTransactionReceipt`,
//! `eth_getTransactionByHash`; `router_quote`, `router_chains`), the REST form of the routing
//! calls (`POST /`, `POST /quote`), and each chain's endpoint (`POST /chains/<name>`). Both
//! envelopes share one path: parse -> validate -> engine (or relay).
//!
//! Invariants: a [`RouterApi`] exists only where a router is configured and served, so its
//! handlers hold the router itself and check nothing. A transaction's params are `[tx]` or the
//! bare object, read by [`transaction_from_params`] with this transport's messages rather than
//! by the macro (which reads an object's members as named arguments): the handlers find the
//! params as sent in their extensions, left there by [`KeepParams`].

use std::future::Future;
use std::sync::Arc;

use http::Extensions;
use http::StatusCode;
use jsonrpsee::core::async_trait;
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::server::middleware::rpc::{Batch, BatchEntry, Notification, Request, RpcServiceT};
use jsonrpsee::server::HttpResponse;
use jsonrpsee::types::Params;
use jsonrpsee::RpcModule;

use serde_json::Value;

use super::chains::Endpoint;
use super::listen::Caller;
use super::wire_errors::{json_response, parse_body_with, WireError};
use super::App;
use crate::chain::answer_bound::AnswerBudget;
use crate::router::types::{
    ChainQuote, ChainStatus, RouterTransaction, RouterTransactionRes, Transaction,
};
use crate::router::{Lookup, Router};

pub const INVALID_PARAMS: i32 = -32602;

/// The `eth` namespace.
#[rpc(server, namespace = "eth")]
pub trait EthNamespace {
    /// The completed transaction on the best chain; params `[tx]` or the bare `tx`.
    #[method(name = "routerTransaction", with_extensions)]
    async fn router_transaction(&self) -> Result<RouterTransactionRes, WireError>;

    /// A signed transaction, sent to the configured chain its chain id names; answers its hash.
    #[method(name = "sendRawTransaction", with_extensions)]
    async fn send_raw_transaction(&self, raw: String) -> Result<String, WireError>;

    /// From the chain the transaction was sent to through routerd, else any that knows it.
    #[method(name = "getTransactionReceipt", with_extensions)]
    async fn get_transaction_receipt(&self, hash: String) -> Result<Value, WireError>;

    /// As `getTransactionReceipt`, for the transaction itself.
    #[method(name = "getTransactionByHash", with_extensions)]
    async fn get_transaction_by_hash(&self, hash: String) -> Result<Value, WireError>;
}

/// The `router` namespace.
#[rpc(server, namespace = "router")]
pub trait RouterNamespace {
    /// Every candidate ranked, reserving nothing; params `[tx]` or the bare `tx`.
    #[method(name = "quote", with_extensions)]
    async fn quote(&self) -> Result<Vec<ChainQuote>, WireError>;

    /// The candidate chains and their health; params are ignored.
    #[method(name = "chains")]
    fn chains(&self) -> Result<Vec<ChainStatus>, WireError>;
}

/// The router's handlers, JSON-RPC and REST.
#[derive(Clone)]
pub struct RouterApi {
    router: Arc<Router>,
    app: Arc<App>,
}

impl RouterApi {
    pub fn new(router: Arc<Router>, app: Arc<App>) -> Self {
        Self { router, app }
    }

    /// Routes `tx` for `who`, counting the decision.
    async fn route(
        &self,
        tx: &Transaction,
        who: &Caller,
    ) -> Result<RouterTransactionRes, WireError> {
        let (answer, chain) = self.router.route(tx, &who.0).await?;
        self.app.metrics.observe_decision(&chain);
        tracing::debug!(from = ?tx.from, chain = %chain, nonce = %answer.nonce, "routed");
        Ok(answer)
    }

    /// `POST /` with a bare RouterTransaction: 200 with the answer or 400 `{error, message}`.
    pub async fn route_rest(&self, bytes: &[u8], who: &Caller) -> Result<HttpResponse, WireError> {
        let tx = parse_rest_transaction(bytes)?;
        Ok(json_response(StatusCode::OK, &self.route(&tx, who).await?))
    }

    /// `POST /chains/<name>`: the chain's own JSON-RPC endpoint; 404 for a chain the router
    /// does not have.
    pub async fn chain_rpc(
        &self,
        name: &str,
        bytes: &[u8],
        who: &Caller,
    ) -> Result<HttpResponse, WireError> {
        let relay = self.router.relay();
        let chain = relay.chain(name).ok_or_else(|| {
            WireError::new(
                StatusCode::NOT_FOUND,
                404,
                format!("no chain {name} among router.chains"),
            )
        })?;
        let endpoint = Endpoint {
            relay,
            chain,
            who,
            metrics: &self.app.metrics,
            busy: Default::default(),
        };
        let budget = AnswerBudget::new(self.app.max_relay_answer_bytes);
        Ok(budget.scope(endpoint.answer(bytes)).await)
    }

    /// The bound of the answer a call is part of, shared by a batch's entries (see
    /// [`KeepParams`]); a call's own where none was left.
    fn answer_budget(&self, ext: &Extensions) -> AnswerBudget {
        ext.get::<AnswerBudget>()
            .cloned()
            .unwrap_or_else(|| AnswerBudget::new(self.app.max_relay_answer_bytes))
    }

    /// A lookup by hash over the router's chains, counted, within the answer's bound.
    async fn lookup(&self, ext: &Extensions, what: Lookup, hash: &str) -> Result<Value, WireError> {
        let lookup = self.router.relay().lookup(what, hash);
        let answer = self.answer_budget(ext).scope(lookup).await;
        let method = match what {
            Lookup::Receipt => "eth_getTransactionReceipt",
            Lookup::Transaction => "eth_getTransactionByHash",
        };
        self.app
            .metrics
            .observe_wallet_call(method, "any", answer.is_ok());
        Ok(answer?)
    }

    /// `POST /quote`: the ranked explanation, as `router_quote` answers it.
    pub async fn quote_rest(&self, bytes: &[u8]) -> Result<HttpResponse, WireError> {
        let tx = parse_rest_transaction(bytes)?;
        Ok(json_response(StatusCode::OK, &self.router.quote(&tx).await))
    }
}

#[async_trait]
impl EthNamespaceServer for RouterApi {
    async fn router_transaction(
        &self,
        ext: &Extensions,
    ) -> Result<RouterTransactionRes, WireError> {
        let tx = transaction_from_params(&params_of(ext))?;
        let who = ext
            .get::<Caller>()
            .cloned()
            .unwrap_or_else(|| Caller::of(None, None));
        self.route(&tx, &who).await
    }

    async fn send_raw_transaction(
        &self,
        ext: &Extensions,
        raw: String,
    ) -> Result<String, WireError> {
        let who = ext
            .get::<Caller>()
            .cloned()
            .unwrap_or_else(|| Caller::of(None, None));
        let send = self.router.relay().send(&raw, &who.0);
        let sent = self.answer_budget(ext).scope(send).await;
        let chain = sent.as_ref().map_or("none", |(_, chain)| chain.as_str());
        self.app
            .metrics
            .observe_wallet_call("eth_sendRawTransaction", chain, sent.is_ok());
        let (hash, _) = sent?;
        Ok(format!("{hash:#x}"))
    }

    async fn get_transaction_receipt(
        &self,
        ext: &Extensions,
        hash: String,
    ) -> Result<Value, WireError> {
        self.lookup(ext, Lookup::Receipt, &hash).await
    }

    async fn get_transaction_by_hash(
        &self,
        ext: &Extensions,
        hash: String,
    ) -> Result<Value, WireError> {
        self.lookup(ext, Lookup::Transaction, &hash).await
    }
}

#[async_trait]
impl RouterNamespaceServer for RouterApi {
    async fn quote(&self, ext: &Extensions) -> Result<Vec<ChainQuote>, WireError> {
        let tx = transaction_from_params(&params_of(ext))?;
        Ok(self.router.quote(&tx).await)
    }

    fn chains(&self) -> Result<Vec<ChainStatus>, WireError> {
        Ok(self.router.chains())
    }
}

/// The router's methods; empty without a router (calls answer "method not found").
pub fn module(api: Option<RouterApi>) -> RpcModule<()> {
    let mut module = RpcModule::new(());
    if let Some(api) = api {
        module
            .merge(EthNamespaceServer::into_rpc(api.clone()))
            .expect("method names are unique");
        module
            .merge(RouterNamespaceServer::into_rpc(api))
            .expect("method names are unique");
    }
    module
}

/// A call's params as sent (see [`KeepParams`]).
#[derive(Clone)]
struct RawParams(Option<String>);

fn params_of(ext: &Extensions) -> Params<'_> {
    Params::new(ext.get::<RawParams>().and_then(|p| p.0.as_deref()))
}

/// RPC middleware leaving in each call's extensions its params, as sent, and the budget of the
/// answer it is part of (`server.max_relay_answer_bytes`): one for a call, one shared by every
/// entry of a batch (access.md §3c).
#[derive(Clone)]
pub struct KeepParams<S> {
    pub inner: S,
    pub max_answer_bytes: usize,
}

fn keep_params(request: &mut Request<'_>, budget: &AnswerBudget) {
    let raw = RawParams(request.params.as_ref().map(|p| p.get().to_string()));
    request.extensions_mut().insert(raw);
    request.extensions_mut().insert(budget.clone());
}

impl<S> RpcServiceT for KeepParams<S>
where
    S: RpcServiceT + Send + Sync + Clone + 'static,
{
    type MethodResponse = S::MethodResponse;
    type NotificationResponse = S::NotificationResponse;
    type BatchResponse = S::BatchResponse;

    fn call<'a>(
        &self,
        mut request: Request<'a>,
    ) -> impl Future<Output = Self::MethodResponse> + Send + 'a {
        keep_params(&mut request, &AnswerBudget::new(self.max_answer_bytes));
        self.inner.call(request)
    }

    fn batch<'a>(
        &self,
        mut batch: Batch<'a>,
    ) -> impl Future<Output = Self::BatchResponse> + Send + 'a {
        let budget = AnswerBudget::new(self.max_answer_bytes);
        for entry in batch.iter_mut() {
            if let Ok(BatchEntry::Call(request)) = entry {
                keep_params(request, &budget);
            }
        }
        self.inner.batch(batch)
    }

    fn notification<'a>(
        &self,
        n: Notification<'a>,
    ) -> impl Future<Output = Self::NotificationResponse> + Send + 'a {
        self.inner.notification(n)
    }
}

/// `params` is `[tx]` or the bare object.
pub(crate) fn transaction_from_params(params: &Params<'_>) -> Result<Transaction, WireError> {
    let raw = params
        .as_str()
        .ok_or_else(|| invalid_params("params: missing; expected [{from, to, data, value}]"))?;
    let value: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| invalid_params(format!("params: {e}")))?;
    let object = match value {
        serde_json::Value::Array(mut items) if items.len() == 1 => items.remove(0),
        serde_json::Value::Array(items) => {
            return Err(invalid_params(format!(
                "params: expected one transaction, got {}",
                items.len()
            )))
        }
        other => other,
    };
    let bytes = serde_json::to_vec(&object).expect("a parsed value serializes");
    parse_transaction(&bytes).map_err(|e| {
        let message = match e.message.strip_prefix("body") {
            Some(rest) => format!("params{rest}"),
            None => e.message,
        };
        invalid_params(message)
    })
}

pub(crate) fn parse_transaction(bytes: &[u8]) -> Result<Transaction, WireError> {
    let request: RouterTransaction = parse_body_with(bytes, &[""])?;
    request
        .validate()
        .map_err(|e| WireError::new(StatusCode::BAD_REQUEST, INVALID_PARAMS, e.to_string()))
}

/// A REST body's transaction; every failure answers the JSON-RPC invalid-params code.
fn parse_rest_transaction(bytes: &[u8]) -> Result<Transaction, WireError> {
    parse_transaction(bytes).map_err(|e| WireError {
        code: INVALID_PARAMS,
        ..e
    })
}

fn invalid_params(message: impl Into<String>) -> WireError {
    WireError::new(StatusCode::BAD_REQUEST, INVALID_PARAMS, message)
}
