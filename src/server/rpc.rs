//! The JSON-RPC module (`eth_routerTransaction`, `router_quote`, `router_chains`) and the REST
//! form of the same calls. Both envelopes share one path: parse -> validate -> engine.

use std::sync::Arc;

use http::StatusCode;
use jsonrpsee::server::HttpResponse;
use jsonrpsee::types::{ErrorObjectOwned, Params};
use jsonrpsee::RpcModule;

use super::listen::Caller;
use super::wire_errors::{json_response, parse_body_with, WireError};
use super::App;
use crate::router::types::{RouterTransaction, Transaction};

pub const INVALID_PARAMS: i32 = -32602;

/// The router methods; empty when no `[router]` is configured (calls answer "method not found").
pub fn module(app: Arc<App>) -> RpcModule<Arc<App>> {
    let mut module = RpcModule::new(app.clone());
    if app.router.is_none() {
        return module;
    }
    module
        .register_async_method("eth_routerTransaction", |params, app, ext| async move {
            let tx = transaction_from_params(&params)?;
            let who = ext
                .get::<Caller>()
                .cloned()
                .unwrap_or_else(|| Caller::of(None, None));
            route(&app, &tx, &who).await.map_err(ErrorObjectOwned::from)
        })
        .expect("method names are unique");
    module
        .register_async_method("router_quote", |params, app, _| async move {
            let tx = transaction_from_params(&params)?;
            Ok::<_, ErrorObjectOwned>(
                app.router
                    .as_ref()
                    .expect("registered with a router")
                    .quote(&tx)
                    .await,
            )
        })
        .expect("method names are unique");
    module
        .register_method("router_chains", |_, app, _| {
            app.router
                .as_ref()
                .expect("registered with a router")
                .chains()
        })
        .expect("method names are unique");
    module
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

fn invalid_params(message: impl Into<String>) -> WireError {
    WireError::new(StatusCode::BAD_REQUEST, INVALID_PARAMS, message)
}

async fn route(
    app: &App,
    tx: &Transaction,
    who: &Caller,
) -> Result<crate::router::types::RouterTransactionRes, WireError> {
    let router = app.router.as_ref().expect("called with a router");
    let (answer, chain) = router.route(tx, &who.0).await?;
    app.metrics.observe_decision(&chain);
    tracing::debug!(from = ?tx.from, chain = %chain, nonce = %answer.nonce, "routed");
    Ok(answer)
}

/// `POST /` with a bare RouterTransaction: 200 with the answer or 400 `{error, message}`.
pub async fn route_rest(app: &App, bytes: &[u8], who: &Caller) -> Result<HttpResponse, WireError> {
    if app.router.is_none() {
        return Err(WireError::not_found("/ (no [router] configured)"));
    }
    let tx = parse_transaction(bytes).map_err(|e| WireError {
        code: INVALID_PARAMS,
        ..e
    })?;
    Ok(json_response(StatusCode::OK, &route(app, &tx, who).await?))
}

/// `POST /quote`: the ranked explanation, as `router_quote` answers it.
pub async fn quote_rest(app: &App, bytes: &[u8]) -> Result<HttpResponse, WireError> {
    let router = app.router.as_ref().expect("checked by the caller");
    let tx = parse_transaction(bytes).map_err(|e| WireError {
        code: INVALID_PARAMS,
        ..e
    })?;
    Ok(json_response(StatusCode::OK, &router.quote(&tx).await))
}
