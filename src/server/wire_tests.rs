//! The transport's answers, byte for byte, on a listener with a router of no chains and on one
//! without a router: status, content type and body of each request.

#![cfg(test)]

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::config::{RouterSettings, StorageSettings};
use crate::router::nonces::NonceBook;

async fn app(with_router: bool) -> Arc<App> {
    app_of(with_router, BTreeMap::new()).await
}

/// An empty sled store of this test process, named `name`.
async fn temp_store(name: &str) -> crate::store::Storage {
    let storage = StorageSettings {
        path: crate::testing::temp_dir(&format!("wire-{name}")),
        ..StorageSettings::default()
    };
    crate::store::open(&storage)
        .await
        .expect("a temporary store")
}

/// An app with no service and no store: what the transport answers by itself. Tests that
/// share a store name would share its directory, and sled's lock on it.
fn bare_app() -> Arc<App> {
    Arc::new(test_app(None, None, BTreeMap::new()))
}

async fn app_of(with_router: bool, chains: BTreeMap<String, Arc<Chain>>) -> Arc<App> {
    let store = temp_store(&format!("{with_router}-{}", chains.len())).await;
    let router = with_router.then(|| {
        let settings: RouterSettings = toml::from_str("chains = []").expect("router settings");
        let candidates = chains.values().cloned().collect();
        Arc::new(Router::new(
            &settings,
            candidates,
            NonceBook::new(store.clone(), 60, 16),
            store,
        ))
    });
    Arc::new(test_app(router, None, chains))
}

async fn exchange(address: SocketAddr, method: &str, path: &str, body: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let answer = String::from_utf8(answer).expect("utf-8");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head");
    let status = head.lines().next().unwrap_or_default();
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type: "))
        .unwrap_or_default();
    format!("{status} | {content_type} | {body}")
}

const TX: &str = r#"{"from":"0x52908400098527886E0F7030069857D2E4169EE7","to":"0x8617E340B3D01FA5F11F306F4090FD50E238070D","data":"0x","value":"1"}"#;

fn call(method: &str, params: Option<&str>) -> String {
    match params {
        Some(p) => format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{p}}}"#),
        None => format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}"}}"#),
    }
}

/// A transfer signed without EIP-155 (the widely published "Nick's method" deployment).
const PRE_155: &str = r#"["0xf8a58085174876e800830186a08080b853604580600e600039806000f350fe7fffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffe03601600081602082378035828234f58015156039578182fd5b8082525050506014600cf31ba02222222222222222222222222222222222222222222222222222222222222222a02222222222222222222222222222222222222222222222222222222222222222"]"#;

/// What each route answers, in the order the recorded answers list them.
fn requests() -> Vec<(&'static str, &'static str, String)> {
    let mut requests = json_rpc_requests();
    requests.extend(plain_requests());
    requests
}

/// The probes and the router's JSON-RPC methods, one call and one batch.
fn json_rpc_requests() -> Vec<(&'static str, &'static str, String)> {
    let tx_list = format!("[{TX}]");
    vec![
        ("GET", "/metrics", String::new()),
        ("GET", "/health", String::new()),
        ("GET", "/ready", String::new()),
        ("POST", "/ready", String::new()),
        ("POST", "/", call("eth_routerTransaction", None)),
        ("POST", "/", call("eth_routerTransaction", Some("[]"))),
        (
            "POST",
            "/",
            call("eth_routerTransaction", Some(&format!("[{TX},{TX}]"))),
        ),
        ("POST", "/", call("eth_routerTransaction", Some(&tx_list))),
        ("POST", "/", call("eth_routerTransaction", Some(TX))),
        ("POST", "/", call("eth_routerTransaction", Some("[7]"))),
        (
            "POST",
            "/",
            call("eth_routerTransaction", Some("[[1,2,3,4]]")),
        ),
        (
            "POST",
            "/",
            call("eth_routerTransaction", Some(r#"{"from":"0x1"}"#)),
        ),
        (
            "POST",
            "/",
            call("eth_routerTransaction", Some(&TX.replace("\"1\"", "\"x\""))),
        ),
        ("POST", "/", call("router_quote", Some(&tx_list))),
        ("POST", "/", call("router_quote", Some(TX))),
        ("POST", "/", call("router_quote", None)),
        ("POST", "/", call("router_chains", None)),
        ("POST", "/", call("router_chains", Some("[1]"))),
        ("POST", "/", call("router_nothing", None)),
        (
            "POST",
            "/",
            format!(
                "[{},{}]",
                call("router_chains", None),
                call("router_quote", Some(TX))
            ),
        ),
    ]
}

/// Bodies that are not JSON-RPC calls, the REST routes, and the methods passed on to a node.
fn plain_requests() -> Vec<(&'static str, &'static str, String)> {
    let hash = format!(r#"["0x{}"]"#, "ab".repeat(32));
    vec![
        ("POST", "/", "not json".to_string()),
        ("POST", "/", TX.to_string()),
        (
            "POST",
            "/",
            r#"{"from":"0x1","to":"0x","data":"0x","value":"1"}"#.to_string(),
        ),
        ("POST", "/", "[]".to_string()),
        ("GET", "/", String::new()),
        ("POST", "/quote", TX.to_string()),
        ("POST", "/quote", "{}".to_string()),
        ("GET", "/quote", String::new()),
        ("GET", "/supported", String::new()),
        ("POST", "/verify", "{}".to_string()),
        ("GET", "/settlements/a/b/c/d", String::new()),
        ("GET", "/nowhere", String::new()),
        (
            "POST",
            "/",
            call("eth_sendRawTransaction", Some(r#"["0x1234"]"#)),
        ),
        ("POST", "/", call("eth_sendRawTransaction", Some("[]"))),
        ("POST", "/", call("eth_sendRawTransaction", Some(PRE_155))),
        (
            "POST",
            "/",
            call("eth_getTransactionReceipt", Some(r#"["0x12"]"#)),
        ),
        ("POST", "/", call("eth_getTransactionByHash", Some(&hash))),
        ("POST", "/chains/nowhere", call("eth_chainId", None)),
        ("GET", "/chains/nowhere", String::new()),
    ]
}

async fn answers(with_router: bool) -> Vec<String> {
    let app = app(with_router).await;
    let listeners = start(&test_settings(), app).await.expect("listening");
    let address = listeners[0].address;
    let mut answers = Vec::new();
    for (method, path, body) in requests() {
        let answer = exchange(address, method, path, &body).await;
        answers.push(format!("{method} {path} {body}\n=> {answer}"));
    }
    answers
}

fn test_settings() -> ServerSettings {
    ServerSettings {
        listen: "127.0.0.1:0".parse().expect("an address"),
        ..ServerSettings::default()
    }
}

/// Compares with the recorded answers; `ROUTERD_RECORD_WIRE=1` records them instead.
fn compare(got: &str, file: &str) {
    let path = format!(
        "{}/src/server/wire_tests/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    if std::env::var_os("ROUTERD_RECORD_WIRE").is_some() {
        std::fs::write(&path, got).expect("recording");
    }
    let expected = std::fs::read_to_string(&path).expect("recorded answers");
    assert_eq!(got, expected);
}

#[tokio::test]
async fn answers_with_a_router() {
    compare(&answers(true).await.join("\n\n"), "with_router.txt");
}

#[tokio::test]
async fn answers_without_a_router() {
    compare(&answers(false).await.join("\n\n"), "without_router.txt");
}

/// A chain that never answers: `/ready` names it, `router_chains` shows it unhealthy.
#[tokio::test]
async fn answers_with_a_silent_chain() {
    let settings =
        toml::from_str("chain_id = 10\nkind = \"l2\"\nrpc_urls = [\"http://127.0.0.1:9\"]")
            .expect("chain settings");
    let chain = Chain::new("silent", &settings).expect("a chain");
    let app = app_of(true, BTreeMap::from([("silent".to_string(), chain)])).await;
    let listeners = start(&test_settings(), app).await.expect("listening");
    let address = listeners[0].address;
    let mut answers = Vec::new();
    for (method, path, body) in [
        ("GET", "/ready", String::new()),
        ("POST", "/", call("router_chains", None)),
    ] {
        let answer = exchange(address, method, path, &body).await;
        answers.push(format!("{method} {path} {body}\n=> {answer}"));
    }
    compare(&answers.join("\n\n"), "silent_chain.txt");
}

/// Bodies of kinds this facilitator does not serve: a Solana payment where no cluster is
/// served, in v2 and v1.
const KINDS: [&str; 2] = [
    r#"{"x402Version":2,"paymentPayload":{"x402Version":2,"accepted":{"scheme":"exact","network":"solana:x","amount":"1","asset":"m","payTo":"p","maxTimeoutSeconds":60},"payload":{"transaction":"AA=="}},"paymentRequirements":{"scheme":"exact","network":"solana:x","amount":"1","asset":"m","payTo":"p","maxTimeoutSeconds":60}}"#,
    r#"{"x402Version":1,"paymentPayload":{"x402Version":1,"scheme":"exact","network":"solana-testnet","payload":{"transaction":"AA=="}},"paymentRequirements":{"scheme":"exact","network":"solana-testnet","maxAmountRequired":"1","resource":"https://r.example","description":"d","mimeType":"m","payTo":"p","maxTimeoutSeconds":60,"asset":"m"}}"#,
];

/// Requests of payments on networks this facilitator does not serve (`v1` is an EVM one on
/// `base`): a network of Solana's spelling, known or not, is refused in Solana's words whatever
/// the payload's shape; a network of no family in the first family's.
fn unserved(v1: &str) -> Vec<(&'static str, &'static str, String)> {
    let evm_on = |network: &str| v1.replace("\"base\"", &format!("\"{network}\""));
    let v2_on = |network: &str| KINDS[0].replace("solana:x", network);
    vec![
        ("POST", "/verify", KINDS[0].to_string()),
        ("POST", "/verify", v2_on("solana-devnet")),
        ("POST", "/verify", evm_on("solana-devnet")),
        ("POST", "/verify", evm_on("cosmos:hub")),
        ("POST", "/verify", KINDS[1].to_string()),
        ("POST", "/settle", KINDS[1].to_string()),
        ("POST", "/verify", v2_on("solana-testnet")),
        ("POST", "/settle", v2_on("solana-testnet")),
        ("POST", "/verify", evm_on("solana-testnet")),
        ("POST", "/settle", evm_on("solana-testnet")),
        ("POST", "/settle", evm_on("cosmos:hub")),
        (
            "POST",
            "/verify",
            KINDS[1].replace("solana-testnet", "cosmos:hub"),
        ),
    ]
}

/// A facilitator on a chain that never answers: its routes, its refusals that need no chain,
/// and `/ready` naming the chain and the signer whose balance is unknown.
#[tokio::test]
async fn answers_with_a_facilitator() {
    let store = temp_store("f").await;
    let key_file = std::env::temp_dir().join(format!("routerd-wire-{}.key", std::process::id()));
    std::fs::write(&key_file, crate::testing::ANVIL_KEY_0).expect("a key file");
    let settings: crate::config::Settings = toml::from_str(&format!(
        "[chains.silent]\nchain_id = 10\nkind = \"l2\"\nrpc_urls = [\"http://127.0.0.1:9\"]\n[chains.silent.tokens.usdc]\naddress = \"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913\"\neip712_name = \"USD Coin\"\neip712_version = \"2\"\n[facilitator]\nnetworks = [\"silent\"]\nx402_versions = [1, 2]\nsigner_key_file = {:?}\n[storage]\ninstance_id = \"test\"\nlease_ttl_secs = 60",
        key_file.display().to_string()
    ))
    .expect("settings");
    let chain = Chain::new("silent", &settings.chains["silent"]).expect("a chain");
    let chains = BTreeMap::from([("silent".to_string(), chain)]);
    let f = settings
        .facilitator
        .as_ref()
        .expect("a facilitator section");
    let facilitator = Facilitator::configured(&settings, f, &chains, store).expect("a facilitator");
    std::fs::remove_file(&key_file).ok();
    let app = Arc::new(test_app(None, Some(Arc::new(facilitator)), chains));
    let listeners = start(&test_settings(), app).await.expect("listening");
    let address = listeners[0].address;
    let v1 = r#"{"x402Version":1,"paymentPayload":{"x402Version":1,"scheme":"exact","network":"base","payload":{"signature":"0x01","authorization":{"from":"0x52908400098527886E0F7030069857D2E4169EE7","to":"0x8617E340B3D01FA5F11F306F4090FD50E238070D","value":"1","validAfter":"0","validBefore":"9","nonce":"0x0000000000000000000000000000000000000000000000000000000000000001"}}},"paymentRequirements":{"scheme":"exact","network":"base","maxAmountRequired":"1","resource":"https://r.example","description":"d","mimeType":"m","payTo":"0x8617E340B3D01FA5F11F306F4090FD50E238070D","maxTimeoutSeconds":60,"asset":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","extra":{"name":"USD Coin","version":"2"}}}"#;
    let status = "/settlements/silent/0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913/0x52908400098527886E0F7030069857D2E4169EE7/0x0000000000000000000000000000000000000000000000000000000000000001";
    let mut answers = Vec::new();
    for (method, path, body) in [
        ("GET", "/ready", String::new()),
        ("GET", "/supported", String::new()),
        ("POST", "/supported", String::new()),
        ("GET", "/verify", String::new()),
        ("POST", "/verify", "{}".to_string()),
        ("POST", "/verify", "[]".to_string()),
        ("POST", "/verify", v1.to_string()),
        ("POST", "/settle", "{}".to_string()),
        ("POST", "/settle", "[]".to_string()),
        ("POST", "/settle", v1.to_string()),
        ("POST", "/settle", format!("[{v1},{{}}]")),
        ("GET", "/settle", String::new()),
        ("GET", status, String::new()),
        ("POST", status, String::new()),
        ("GET", "/settlements/a/b", String::new()),
        ("GET", "/settlements/a/b/c", String::new()),
        (
            "GET",
            &format!("/settlements/solana-devnet/{}", "1".repeat(64)),
            String::new(),
        ),
    ]
    .into_iter()
    .chain(unserved(v1))
    .chain([
        ("POST", "/", call("router_chains", None)),
        ("POST", "/", TX.to_string()),
        ("POST", "/quote", TX.to_string()),
    ]) {
        let answer = exchange(address, method, path, &body).await;
        answers.push(format!("{method} {path} {body}\n=> {answer}"));
    }
    compare(&answers.join("\n\n"), "facilitator.txt");
}

/// HTTP/2 with prior knowledge is served as before, and so is an HTTP/1 request whose first
/// byte arrives alone (it could still be HTTP/2's preface when it is looked at).
#[tokio::test]
async fn answers_http2_and_a_request_begun_with_one_byte() {
    let listeners = start(&test_settings(), bare_app())
        .await
        .expect("listening");
    let address = listeners[0].address;

    let stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("an HTTP/2 handshake");
    tokio::spawn(connection);
    let request = http::Request::get(format!("http://{address}/health"))
        .body(http_body_util::Empty::<hyper::body::Bytes>::new())
        .expect("a request");
    let answer = sender.send_request(request).await.expect("an answer");
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.version(), http::Version::HTTP_2);

    let whole = exchange(address, "POST", "/ready", "").await;
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    stream.write_all(b"P").await.expect("write");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let rest = "OST /ready HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    stream.write_all(rest.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let answer = String::from_utf8(answer).expect("utf-8");
    let status = answer.lines().next().unwrap_or_default();
    assert!(
        whole.starts_with(&format!("{status} |")),
        "{answer} against {whole}"
    );
    assert!(status.starts_with("HTTP/1.1 "), "{answer}");
}

/// Stops the server of `handle` and waits for it to end, failing past half the read timeout
/// (before `what`).
async fn stops_within_half_the_read_timeout(handle: &ServerHandle, what: &str) {
    handle.stop().expect("a running server");
    let bound = std::time::Duration::from_millis(test_settings().request_read_timeout_ms / 2);
    tokio::time::timeout(bound, handle.clone().stopped())
        .await
        .unwrap_or_else(|_| panic!("not stopped before {what}"));
}

/// A connection that has sent nothing yet does not hold a stop up until its read timeout.
#[tokio::test]
async fn a_silent_connection_does_not_hold_a_stop() {
    let listeners = start(&test_settings(), bare_app())
        .await
        .expect("listening");
    let _silent = tokio::net::TcpStream::connect(listeners[0].address)
        .await
        .expect("connect");
    // The accept loop has taken it once a request on another connection is answered.
    let answer = exchange(listeners[0].address, "GET", "/health", "").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    stops_within_half_the_read_timeout(
        &listeners[0].handle,
        "the silent connection's read timeout",
    )
    .await;
}

/// An HTTP/1 connection kept alive after its answer is told to close on stop: it does not hold
/// the stop up until its idle timeout.
#[tokio::test]
async fn a_kept_alive_connection_does_not_hold_a_stop() {
    let listeners = start(&test_settings(), bare_app())
        .await
        .expect("listening");
    let mut kept = tokio::net::TcpStream::connect(listeners[0].address)
        .await
        .expect("connect");
    kept.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut answer = [0u8; 512];
    let read = kept.read(&mut answer).await.expect("read");
    assert!(answer[..read].starts_with(b"HTTP/1.1 200"), "{answer:?}");
    stops_within_half_the_read_timeout(
        &listeners[0].handle,
        "the kept-alive connection's idle timeout",
    )
    .await;
}
