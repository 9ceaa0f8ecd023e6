//! `POST /chains/<name>`: one chain's JSON-RPC endpoint, for standard clients (viem's `http()`,
//! ethers' `JsonRpcProvider`) that take an RPC URL per chain. This is the envelope only
//! (JSON-RPC 2.0: single calls, batches of at most `MAX_BATCH_CALLS`, notifications); what
//! each method does, and which are served at all, is the relay's (`router::served`). A call
//! refused because the router's read budget on the chain is spent makes the whole answer HTTP
//! 503 with `Retry-After` (access.md §3b), its entries as they are.

use std::sync::atomic::{AtomicBool, Ordering};

use http::StatusCode;
use jsonrpsee::server::HttpResponse;
use serde_json::{json, Map, Value};

use super::listen::Caller;
use super::wire_errors::{json_response, text_response, WireError};
use super::{Metrics, MAX_BATCH_CALLS};
use crate::chain::{traffic, Chain};
use crate::router::{Relay, RelayError};

const PARSE_ERROR: i32 = -32700;
const INVALID_REQUEST: i32 = -32600;

/// What one request at a chain's endpoint answers with, and who asks.
pub struct Endpoint<'a> {
    pub relay: &'a Relay,
    pub chain: &'a Chain,
    pub who: &'a Caller,
    pub metrics: &'a Metrics,
    /// Whether a call was refused for the chain's spent read budget.
    pub busy: AtomicBool,
}

impl Endpoint<'_> {
    /// The answer to `bytes`: HTTP 200 with JSON-RPC answers, as nodes answer (503 when the
    /// chain was busy for a call); empty when every call was a notification.
    pub async fn answer(&self, bytes: &[u8]) -> HttpResponse {
        let Ok(body) = serde_json::from_slice::<Value>(bytes) else {
            return reply(Some(error(Value::Null, PARSE_ERROR, "Parse error")));
        };
        let answer = match body {
            Value::Array(calls) if calls.is_empty() || calls.len() > MAX_BATCH_CALLS as usize => {
                let message = format!("a batch holds 1 to {MAX_BATCH_CALLS} calls");
                Some(error(Value::Null, INVALID_REQUEST, &message))
            }
            Value::Array(calls) => {
                let answers =
                    futures::future::join_all(calls.into_iter().map(|call| self.one(call))).await;
                let answers: Vec<Value> = answers.into_iter().flatten().collect();
                (!answers.is_empty()).then_some(Value::Array(answers))
            }
            call => self.one(call).await,
        };
        let mut response = reply(answer);
        if self.busy.load(Ordering::Relaxed) {
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, traffic::RETRY_AFTER_SECS.into());
        }
        response
    }

    /// One call's answer; `None` for a notification (served, not answered).
    async fn one(&self, call: Value) -> Option<Value> {
        let Value::Object(mut call) = call else {
            return Some(error(Value::Null, INVALID_REQUEST, "Invalid request"));
        };
        let id = call.remove("id");
        let version = call.remove("jsonrpc");
        let method = match (version, call.remove("method")) {
            (Some(Value::String(v)), Some(Value::String(method))) if v == "2.0" => method,
            _ => {
                let id = id.unwrap_or(Value::Null);
                return Some(error(id, INVALID_REQUEST, "Invalid request"));
            }
        };
        let result = self
            .relay
            .chain_call(self.chain, &method, call.remove("params"), &self.who.0)
            .await;
        self.metrics
            .observe_wallet_call(&method, &self.chain.name, result.is_ok());
        if let Err(RelayError::Busy(_)) = &result {
            self.busy.store(true, Ordering::Relaxed);
        }
        let id = id?;
        Some(match result {
            Ok(value) => json!({"jsonrpc": "2.0", "id": id, "result": value}),
            Err(e) => envelope(id, WireError::from(e)),
        })
    }
}

fn error(id: Value, code: i32, message: &str) -> Value {
    envelope(id, WireError::new(StatusCode::OK, code, message))
}

fn envelope(id: Value, e: WireError) -> Value {
    let mut object = Map::new();
    object.insert("code".into(), json!(e.code));
    object.insert("message".into(), json!(e.message));
    if let Some(data) = e.data {
        object.insert("data".into(), data);
    }
    json!({"jsonrpc": "2.0", "id": id, "error": object})
}

fn reply(body: Option<Value>) -> HttpResponse {
    match body {
        Some(body) => json_response(StatusCode::OK, &body),
        None => text_response(StatusCode::OK, "application/json", String::new()),
    }
}
