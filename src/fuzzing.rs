//! Entry points for the coverage-guided fuzzer (`fuzz/`, `scripts/fuzz`) and for the replay of
//! its committed corpus (`tests/fuzz_corpus.rs`). Each takes any bytes and runs them through the
//! parsers that read that input in the daemon, as the daemon calls them. None panics on its own:
//! a panic out of one of these is a panic of a parser.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use ethers_core::types::H256;
use http::{HeaderMap, HeaderValue};
use serde_json::Value;

use crate::chain::{self, head};
use crate::evm;
use crate::evm::erc3009;
use crate::facilitator::evm::exact::{status_key, EvmRequest};
use crate::facilitator::evm::inclusions;
use crate::facilitator::evm::lens;
use crate::facilitator::evm::lower;
use crate::facilitator::evm::request::Served;
use crate::facilitator::evm::request::TokenInfo;
use crate::facilitator::outcome::Spelling;
use crate::facilitator::protocol::values::Payload;
use crate::facilitator::protocol::{self, v1, v2};
use crate::facilitator::registry;
use crate::facilitator::svm::mechanism as svm_mechanism;
use crate::facilitator::svm::wire::{self as svm_wire, SvmRequest};
use crate::facilitator::svm::Failure;
use crate::router::{probe, raw};
use crate::server::rest;
use crate::server::rpc;
use crate::server::wire_errors::parse_body;
use crate::svm;

/// `max_signature_bytes` as configured by default.
const MAX_SIGNATURE_BYTES: usize = 2048;

/// `Idempotency-Key` and API key name, for the tags of payments that carry neither or both.
const HEADER_KEY: &str = "order-8812";
const CALLER: &str = "ip:127.0.0.1";

/// `POST /verify` and `POST /settle` bodies: one payment (v1 or v2) or, for settle, an array of
/// them; read with v2 served and not, in the wire type of the family its network names (as the
/// registry picks it). Each payment read is then checked as verify checks it before asking a
/// chain (lowered, the payload's values, the signature recovered), and tagged as settle tags it.
pub fn payment_body(data: &[u8]) {
    for serves_v2 in [false, true] {
        // /verify, and /settle of a single payment: straight into an EVM wire type where the
        // facilitator would try that, else the checked way.
        let direct = (!data.contains(&b'[')).then(|| {
            let version = read_as(
                serves_v2,
                serde_json::from_slice::<Value>(data)
                    .ok()?
                    .get("x402Version")?
                    .as_u64(),
            );
            EvmRequest::read_direct(version, data).map(Read::Evm)
        });
        let single = match direct.flatten() {
            Some(payment) => Some(payment),
            None => parse_body(data)
                .ok()
                .and_then(|body| read(serves_v2, body, "")),
        };
        if let Some(payment) = single {
            check_payment(&payment, None, data);
        }
        // /settle of an array.
        if rest::first_json_byte(data) == Some(b'[') {
            let Ok(items) = parse_body::<Vec<Value>>(data) else {
                continue;
            };
            for (i, item) in items.into_iter().enumerate() {
                let Ok(element) = serde_json::to_vec(&item) else {
                    continue;
                };
                if let Some(payment) = read(serves_v2, item, &format!("[{i}]")) {
                    check_payment(&payment, Some(i), &element);
                }
            }
        }
    }
}

/// A payment in its family's wire type.
enum Read {
    Evm(EvmRequest),
    Svm(SvmRequest),
}

/// The version a body is read as (the facilitator's rule).
fn read_as(serves_v2: bool, version: Option<u64>) -> u64 {
    match version == Some(2) && serves_v2 {
        true => 2,
        false => 1,
    }
}

/// A body read the checked way, in the wire type of the family its network names.
fn read(serves_v2: bool, body: Value, prefix: &str) -> Option<Read> {
    let version = read_as(serves_v2, protocol::version_of(&body));
    let network = body.pointer("/paymentRequirements/network");
    match network.and_then(Value::as_str).map(registry::namespace_of) {
        Some(svm_mechanism::NAMESPACE) => {
            SvmRequest::read(version, body, prefix).ok().map(Read::Svm)
        }
        _ => EvmRequest::read(version, body, prefix).ok().map(Read::Evm),
    }
}

fn check_payment(payment: &Read, element: Option<usize>, body: &[u8]) {
    let asker = rest::Asker::stranger(CALLER);
    let identifier = || match payment {
        Read::Evm(request) => request.payment_identifier(),
        Read::Svm(request) => request.payment_identifier(),
    };
    for header in [None, Some(HEADER_KEY)] {
        let _ = rest::asking(identifier(), &asker, header, element, body);
    }
    let request = match payment {
        Read::Evm(request) => request,
        Read::Svm(request) => {
            let _ = request.label();
            // Lowering a Solana payment asks for its clusters; what a stranger's body reaches
            // without them is the transaction's decoding, in the answer's payer.
            let refused = Err(svm_wire::Refused::Svm(Failure::MissingFeePayer));
            let _ = svm_wire::verify_answer(request.version(), request.transaction(), &refused);
            return;
        }
    };
    let _ = request.label();
    let served = FuzzServed::new();
    let (lowered, payload, path): (_, _, Spelling) = match request {
        EvmRequest::V1(request) => (
            lower::lower_v1(request, &served),
            Payload::from(&request.payment_payload.payload),
            v1::path,
        ),
        EvmRequest::V2(request) => {
            let by_chain_id = BTreeMap::from([
                (8453, "base".to_string()),
                (84532, "base-sepolia".to_string()),
            ]);
            (
                lower::lower_v2(request, &by_chain_id, &served),
                Payload::from(&request.payment_payload.payload),
                v2::path,
            )
        }
    };
    if let Err(failure) = lowered {
        let _ = failure.message.render(path);
    }
    let _ = v1::payer_of(payload.clone());
    // Rule 5 on its own as well: most bodies fail rule 4 first (an asset that is not served).
    if let Ok((auth, _, signature)) = lower::payload(&payload, MAX_SIGNATURE_BYTES) {
        let digest = erc3009::digest(H256::repeat_byte(0x5a), &auth);
        let _ = erc3009::recover(digest, &signature);
    }
}

/// The configuration fuzzed payments are lowered against: two networks with one token each.
struct FuzzServed(Vec<TokenInfo>);

impl FuzzServed {
    fn new() -> Self {
        Self(vec![TokenInfo {
            address: ethers_core::types::Address::repeat_byte(0xd),
            eip712_name: "USDC".to_string(),
            eip712_version: "2".to_string(),
            domain_separator: H256::repeat_byte(0x5a),
            eip3009: true,
            permit2: true,
        }])
    }
}

impl Served for FuzzServed {
    fn tokens(&self, network: &str) -> Option<&[TokenInfo]> {
        matches!(network, "base" | "base-sepolia").then_some(self.0.as_slice())
    }

    fn allow_http_resource(&self) -> bool {
        false
    }

    fn max_signature_bytes(&self) -> usize {
        MAX_SIGNATURE_BYTES
    }
}

/// `POST /` and `POST /quote`: a JSON-RPC call or batch whose params are the transaction, read
/// as jsonrpsee hands them to the method, or the bare transaction (the REST form); also the bytes
/// taken as `params` themselves.
/// `eth_sendRawTransaction`'s param: the bytes as a signed transaction (as `0x` + their hex),
/// and the bytes as the text a wallet sent.
pub fn raw_transaction(data: &[u8]) {
    let _ = raw::decode(&evm::hex_bytes(data));
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = raw::decode(text);
    }
}

/// A Solana `exact` payload's `transaction`: base64 text as the wire carries it, or the wire
/// bytes themselves. What decodes is held to the instruction rules (its fee payer taken as
/// routerd's), hashed, and signed as the fee payer signs it.
pub fn svm_transaction(data: &[u8]) {
    let decoded = match std::str::from_utf8(data) {
        Ok(text) => svm::PaymentTransaction::decode(text.trim()),
        Err(_) => svm::PaymentTransaction::from_wire(data),
    };
    let Ok(tx) = decoded else { return };
    let fee_payers = [*tx.fee_payer()];
    let mint = svm::Pubkey::new_from_array([1; 32]);
    let pay_to = svm::Pubkey::new_from_array([2; 32]);
    let requirements = svm::Requirements {
        fee_payer: &fee_payers[0],
        fee_payers: &fee_payers,
        mint: &mint,
        pay_to: &pay_to,
        amount: 10_000,
        memo: Some("order-1"),
        limits: svm::Limits {
            max_instructions: 7,
            max_compute_units: 400_000,
            max_micro_lamports_per_compute_unit: svm::exact::MAX_MICRO_LAMPORTS_PER_COMPUTE_UNIT,
            max_priority_fee_lamports: 10_000,
        },
    };
    let _ = svm::check(&tx, &requirements);
    let _ = tx.message_hash();
    let signed = tx.sign_as_fee_payer(&svm::Keypair::new_from_array([3; 32]));
    let _ = svm::PaymentTransaction::decode(&signed.wire);
}

pub fn router_body(data: &[u8]) {
    use jsonrpsee::types::{Params, Request};
    use serde_json::value::RawValue;

    let _ = rest::extra_calls(data);
    if rest::is_json_rpc(data) {
        let calls = match rest::first_json_byte(data) {
            Some(b'[') => serde_json::from_slice::<Vec<&RawValue>>(data).unwrap_or_default(),
            _ => serde_json::from_slice::<&RawValue>(data).map_or(Vec::new(), |call| vec![call]),
        };
        for call in calls {
            if let Ok(request) = serde_json::from_str::<Request>(call.get()) {
                let _ = rpc::transaction_from_params(&request.params());
            }
        }
    }
    let _ = rpc::parse_transaction(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = rpc::transaction_from_params(&Params::new(Some(text)));
    }
}

/// `GET /settlements/{network}/{asset}/{from}/{nonce}`: the path after `/settlements/`.
pub fn status_path(data: &[u8]) {
    let path = String::from_utf8_lossy(data);
    let segments: Vec<&str> = path.split('/').collect();
    if let Ok(key) = status_key(&segments) {
        let _ = key.to_string();
    }
}

/// A configuration file, as `routerd --config` reads it, then the effective configuration as
/// `routerd check-config` renders it. Input: the file's TOML, then optionally a NUL byte and
/// environment overrides, one `SECTION__KEY=value` a line (read as `ROUTERD__SECTION__KEY`).
pub fn config(data: &[u8]) {
    let (file, env) = split_at_nul(data);
    let env = String::from_utf8_lossy(env)
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| {
            (
                format!("{}__{key}", crate::config::ENV_PREFIX),
                value.to_string(),
            )
        })
        .collect();
    let Some(path) = TempFile::write("config.toml", file) else {
        return;
    };
    if let Ok(settings) = crate::config::Settings::load_from(std::slice::from_ref(&path.0), &env) {
        let _ = settings.render();
    }
}

/// The API keys file (`auth.api_keys_file`), then a request's `Authorization` header checked
/// against the keys read. Input: the file's TOML, then optionally a NUL byte and the header's
/// value.
pub fn api_keys(data: &[u8]) {
    let (file, header) = split_at_nul(data);
    let Some(path) = TempFile::write("api-keys.toml", file) else {
        return;
    };
    let Ok(keys) = crate::server::Keys::load(&path.0) else {
        return;
    };
    let _ = keys.count();
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_bytes(header) {
        headers.insert(http::header::AUTHORIZATION, value);
    }
    if let Ok(key) = keys.caller(&headers) {
        let pay_to = String::from_utf8_lossy(header);
        let _ = key.may_pay(crate::facilitator::Payee::parse(pay_to.trim()));
        let _ = key.admit(header.len() as u32);
    }
}

/// Node answers about blocks: the head block (number, timestamp, hashes, base fee, as the head
/// watcher reads `eth_getBlockByNumber`), fee hints and `eth_feeHistory` rewards, and a
/// transaction receipt and a log as the settlement follower reads them. Input: any JSON value.
pub fn node_block(data: &[u8]) {
    let Ok(answer) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    for field in ["number", "timestamp", "blockNumber", "status", "gasUsed"] {
        let _ = answer.get(field).and_then(evm::parse_u64);
    }
    for field in ["hash", "parentHash", "blockHash"] {
        let _ = answer.get(field).and_then(head::parse_hash);
    }
    for field in ["baseFeePerGas", "gasPrice", "effectiveGasPrice"] {
        let _ = answer.get(field).and_then(evm::parse_quantity);
    }
    let _ = evm::parse_quantity(&answer);
    let _ = evm::parse_u64(&answer);
    let _ = evm::parse_word(&answer);
    let _ = head::parse_hash(&answer);
    if let Some(rewards) = answer.get("reward").and_then(Value::as_array) {
        for reward in rewards {
            let _ = reward.get(0).and_then(evm::parse_quantity);
        }
    }
    if let Some(text) = answer.as_str() {
        let _ = evm::hex_decode(text);
        let _ = evm::parse_h256(text);
    }
    let hash = H256::repeat_byte(0x11);
    for head in [0, 1 << 20, u64::MAX] {
        let _ = inclusions::inclusion_of(hash, &Ok(answer.clone()), head);
        let _ = inclusions::log_inclusion(&answer, 0..=head);
    }
}

/// The lens's `eth_call` answer (`facilitator::evm::lens::decode_answer`). Input: the answer as JSON
/// (a string of 0x-hex, or anything a node may send instead), or else the raw return data.
pub fn lens_answer(data: &[u8]) {
    match serde_json::from_slice::<Value>(data) {
        Ok(answer) => {
            let _ = lens::decode_answer(&answer);
        }
        Err(_) => {
            let _ = lens::decode_answer(&Value::String(evm::hex_bytes(data)));
        }
    }
}

/// Revert data and node errors: the raw data through `revert_message`, and, when the input is
/// a JSON-RPC error object (`{code, message, data}`), the node's error as the router and the
/// settlement classify it.
pub fn revert_data(data: &[u8]) {
    let _ = evm::revert_message(data);
    let Ok(Value::Object(error)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let error = chain::client::RpcError {
        code: error
            .get("code")
            .and_then(Value::as_i64)
            .and_then(|c| i32::try_from(c).ok())
            .unwrap_or(-32000),
        message: error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        data: error.get("data").cloned(),
    };
    let _ = error.is_revert();
    let _ = error.is_execution_failure();
    let _ = error.refusal();
    let _ = probe::revert_reason(&error);
    if let Some(bytes) = error
        .data
        .as_ref()
        .and_then(Value::as_str)
        .and_then(evm::hex_decode)
    {
        let _ = evm::revert_message(&bytes);
    }
}

/// A fuzz target: any bytes in, nothing out.
pub type Target = fn(&[u8]);

/// The targets by name, for the corpus replay.
pub const TARGETS: &[(&str, Target)] = &[
    ("payment_body", payment_body),
    ("router_body", router_body),
    ("status_path", status_path),
    ("config", config),
    ("api_keys", api_keys),
    ("node_block", node_block),
    ("lens_answer", lens_answer),
    ("revert_data", revert_data),
    ("raw_transaction", raw_transaction),
    ("svm_transaction", svm_transaction),
];

fn split_at_nul(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// A file of this process's own in the temporary directory, removed when dropped: the parsers
/// of files read paths.
struct TempFile(PathBuf);

impl TempFile {
    fn write(name: &str, contents: &[u8]) -> Option<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("routerd-fuzz-{}-{n}-{name}", std::process::id()));
        std::fs::write(&path, contents).ok()?;
        Some(Self(path))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
