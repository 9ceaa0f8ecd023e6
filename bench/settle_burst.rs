//! The bench's load generator wherever Node's one thread would be the limit (the settle burst,
//! the verify runs at concurrency, the Solana verifies and settles): closed-loop POSTs from many
//! connections, each one request at a time (as wrk sends them), every answer stamped with the wall
//! clock when its last byte is read.
//!
//!   settle-burst URL CONCURRENCY MAX_MS < BODIES
//!
//! BODIES holds one request body per line; each is sent once, in order, until all are sent or
//! MAX_MS has passed. At the end it prints one JSON line per request sent:
//! `{"i":INDEX,"status":STATUS,"at":EPOCH_MS,"ms":LATENCY_MS,"body":TEXT}`, or `"error"` in place
//! of status and body when the request got no answer.
//!
//! Why not Node: a full block's answers (381 of them) leave routerd within a few milliseconds of
//! each other, and Node's one thread takes 100 µs and more to read each and send the next: its
//! stamps came 43 to 70 ms after routerd's own (docs/benchmarks.md). This client reads an answer
//! in a few microseconds on one runtime thread, so block-to-answer measures what a merchant on its
//! own machine waits for.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpStream;

/// Where the requests go: `host:port` (the socket to connect to, and each request's Host
/// header) and the path.
struct Target {
    authority: String,
    path: String,
}

struct Burst {
    target: Target,
    bodies: Vec<Bytes>,
    next: AtomicUsize,
    deadline: Instant,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(concurrency), Some(max_ms)) = (
        args.first().and_then(|u| url::Url::parse(u).ok()),
        args.get(1).and_then(|c| c.parse::<usize>().ok()),
        args.get(2).and_then(|m| m.parse::<u64>().ok()),
    ) else {
        eprintln!("usage: settle-burst URL CONCURRENCY MAX_MS < BODIES");
        std::process::exit(2);
    };
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        eprintln!("settle-burst: the URL names no host and port");
        std::process::exit(2);
    };
    let target = Target {
        authority: format!("{host}:{port}"),
        path: url.path().to_string(),
    };
    let bodies = std::io::stdin()
        .lock()
        .lines()
        .map_while(Result::ok)
        .filter(|line| !line.is_empty())
        .map(Bytes::from)
        .collect();
    let burst = Arc::new(Burst {
        target,
        bodies,
        next: AtomicUsize::new(0),
        deadline: Instant::now() + Duration::from_millis(max_ms),
    });
    let lines = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(burst, concurrency));
    let mut out = std::io::stdout().lock();
    for line in lines {
        writeln!(out, "{line}").expect("stdout");
    }
}

async fn run(burst: Arc<Burst>, concurrency: usize) -> Vec<serde_json::Value> {
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        workers.spawn(worker(burst.clone()));
    }
    let mut lines = Vec::with_capacity(burst.bodies.len());
    while let Some(done) = workers.join_next().await {
        lines.extend(done.expect("a worker panicked"));
    }
    lines
}

/// One connection's closed loop: the next body as soon as the previous answer is read.
async fn worker(burst: Arc<Burst>) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    let mut sender: Option<SendRequest<Full<Bytes>>> = None;
    loop {
        let i = burst.next.fetch_add(1, Ordering::Relaxed);
        if i >= burst.bodies.len() || Instant::now() >= burst.deadline {
            return lines;
        }
        let started = Instant::now();
        match post(&mut sender, &burst.target, burst.bodies[i].clone()).await {
            Ok((status, body)) => lines.push(json!({
                "i": i,
                "status": status,
                "at": epoch_ms(),
                "ms": started.elapsed().as_secs_f64() * 1e3,
                "body": body,
            })),
            Err(error) => {
                sender = None; // a new connection for the next one
                lines.push(json!({ "i": i, "error": error }));
            }
        }
    }
}

/// POSTs one body on the worker's connection (opened on first use) and reads the whole answer.
async fn post(
    sender: &mut Option<SendRequest<Full<Bytes>>>,
    target: &Target,
    body: Bytes,
) -> Result<(u16, String), String> {
    if sender.is_none() {
        *sender = Some(connect(target).await?);
    }
    let connection = sender.as_mut().expect("connected above");
    let request = hyper::Request::post(&target.path)
        .header(hyper::header::HOST, &target.authority)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let response = connection
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

async fn connect(target: &Target) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = TcpStream::connect(&target.authority)
        .await
        .map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Milliseconds since the Unix epoch, as the bench's block watcher stamps a block's arrival.
fn epoch_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}
