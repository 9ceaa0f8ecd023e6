//! The head of one chain, polled in the background and cached: block number, hash, timestamp and
//! the fee data of that block. Readers never fetch it per request; receipt watchers wake on each
//! new block.
//!
//! The watcher also keeps the hashes of the recent canonical blocks, linked by parent hash: when a
//! new head does not extend what it knows, it walks back until it does, so "is block N still the
//! one with hash H?" is answered without asking the node, and a reorganisation of any depth up to
//! [`KEPT_BLOCKS`] is seen.

use super::traffic::Traffic;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use ethers_core::types::{H256, U256};
use jsonrpsee::core::client::{Subscription, SubscriptionClientT};
use jsonrpsee::core::rpc_params;
use jsonrpsee::ws_client::WsClientBuilder;
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};

use super::batch::Batch;
use super::cadence::Cadence;
use super::client::{Call, ChainClient, Unreachable};
use crate::evm::{parse_h256, parse_quantity, parse_u64};
use crate::evm::{Fees, RecentFees};

/// Canonical block hashes kept: as many as the deepest `finality_depth` allowed.
use crate::config::KEPT_BLOCKS;
use crate::config::{Endpoint, FeeModel};
use crate::guard::Guard;

#[derive(Debug, Clone)]
pub struct Head {
    pub number: u64,
    pub hash: H256,
    pub parent_hash: H256,
    pub timestamp: u64,
    /// The node's fee hints as judged against `recent`.
    pub fees: Fees,
    /// What the recent blocks paid, read with this head.
    pub recent: RecentFees,
    pub fetched_at: Instant,
}

/// Whether a block the caller saw is still on the canonical chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canonical {
    Yes,
    /// Replaced by another block, or above the head after a rollback.
    No,
    /// Older than what the watcher has seen since it started.
    Unknown,
}

/// Recent canonical hashes by number; always one chain, linked by parent hashes.
#[derive(Default)]
struct RecentBlocks(BTreeMap<u64, H256>);

impl RecentBlocks {
    fn canonical(&self, number: u64, hash: H256, head: u64) -> Canonical {
        if number > head {
            return Canonical::No;
        }
        match self.0.get(&number) {
            Some(known) if *known == hash => Canonical::Yes,
            Some(_) => Canonical::No,
            None => Canonical::Unknown,
        }
    }

    /// Forgets everything above `number` (a rollback) and remembers `hash` at it.
    fn set(&mut self, number: u64, hash: H256) {
        self.0.split_off(&(number + 1));
        self.0.insert(number, hash);
        while self.0.len() as u64 > KEPT_BLOCKS {
            self.0.pop_first();
        }
    }

    /// Whether `parent` is what is known at `number - 1` (or nothing is known there).
    fn extends(&self, number: u64, parent: H256) -> Option<bool> {
        let below = number.checked_sub(1)?;
        self.0.get(&below).map(|known| *known == parent)
    }
}

/// When each recent head was first fetched, by number: a block the watcher skipped was first
/// seen with the next head above it.
#[derive(Default)]
struct FirstSeen(BTreeMap<u64, Instant>);

impl FirstSeen {
    fn note(&mut self, number: u64, at: Instant) {
        self.0.entry(number).or_insert(at);
        while self.0.len() as u64 > KEPT_BLOCKS {
            self.0.pop_first();
        }
    }

    /// `None` below the oldest head kept: whenever it was seen, it is forgotten.
    fn of(&self, block: u64) -> Option<Instant> {
        let oldest = *self.0.keys().next()?;
        let seen = self.0.range(block..).next().filter(|_| block >= oldest);
        seen.map(|(_, at)| *at)
    }
}

pub struct HeadWatcher {
    client: Arc<ChainClient>,
    fee_model: FeeModel,
    latest: watch::Receiver<Option<Head>>,
    sender: Arc<watch::Sender<Option<Head>>>,
    recent: Arc<Mutex<RecentBlocks>>,
    first_seen: Arc<Mutex<FirstSeen>>,
    derived_cap: DerivedCap,
    /// The poller's steps: one that panics is logged and the next tick polls again.
    pub guard: Arc<Guard>,
}

/// The cap on what one gas may cost in a transaction routerd signs, for a network without a
/// configured or preset `max_fee_per_gas`: a multiple of what the chain's blocks paid at the
/// first head read (`RecentFees::derived_cap`), fixed from then on, so that later answers of a
/// node cannot raise it. A configured cap fills it at start: nothing is derived then.
pub type DerivedCap = Arc<OnceLock<U256>>;

/// Derives the cap from `head` unless an earlier head did.
fn derive_cap(cell: &DerivedCap, chain: &str, head: &Head) {
    cell.get_or_init(|| {
        let cap = head.recent.derived_cap(&head.fees);
        tracing::info!(%chain, max_fee_per_gas = %cap, "fee cap derived from the recent blocks (used where no max_fee_per_gas is set)");
        cap
    });
}

/// The poller's state between ticks.
struct Poller {
    client: Arc<ChainClient>,
    sender: Weak<watch::Sender<Option<Head>>>,
    recent: Arc<Mutex<RecentBlocks>>,
    first_seen: Arc<Mutex<FirstSeen>>,
    derived_cap: DerivedCap,
    fee_model: FeeModel,
    /// When the whole head was last read.
    last_full_read: Instant,
    /// The configured interval; the whole head is read at least every FULL_READ_EVERY of them.
    interval: Duration,
    /// When to look next; `None` with a `newHeads` subscription, which announces each block.
    cadence: Option<Cadence>,
}

impl Poller {
    /// One tick; `false` once the watcher is gone. Most ticks see no new block: one
    /// `eth_blockNumber` says so. The whole head is read when the number moves (or `announced`
    /// by a subscription), and every FULL_READ_EVERY intervals regardless, so a block replaced
    /// at the same height is seen too.
    async fn tick(&mut self, announced: bool) -> bool {
        let Some(sender) = self.sender.upgrade() else {
            return false;
        };
        // When this look started: the cadence places a block found by it there (cadence.rs).
        let asked = Instant::now();
        let last = sender.borrow().as_ref().map(|h: &Head| (h.number, h.hash));
        if let Some((number, _)) = last.filter(|_| !announced) {
            if self.last_full_read.elapsed() < self.interval * FULL_READ_EVERY {
                match block_number(&self.client).await {
                    Ok(n) if n == number => {
                        return true;
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(chain = %self.client.name(), %error, "head poll failed");
                        return true;
                    }
                }
            }
        }
        self.last_full_read = Instant::now();
        let last = last.map(|(_, hash)| hash);
        match fetch_head(&self.client, self.fee_model).await {
            Ok(head) if Some(head.hash) != last => {
                if let Some(cadence) = &mut self.cadence {
                    cadence.arrived(asked);
                }
                derive_cap(&self.derived_cap, self.client.name(), &head);
                link(&self.client, &self.recent, &head).await;
                lock(&self.first_seen).note(head.number, head.fetched_at);
                sender.send_replace(Some(head));
            }
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(chain = %self.client.name(), %error, "head poll failed")
            }
        }
        true
    }

    /// How long to wait before the next tick.
    fn next_look(&self) -> Duration {
        self.cadence
            .as_ref()
            .map_or(self.interval, |c| c.next_look(Instant::now()))
    }
}

impl HeadWatcher {
    /// Starts the poller, and with `ws_urls` a `newHeads` subscription that wakes it at once;
    /// both stop when the watcher is dropped. With a `configured_cap` no cap is derived.
    pub fn spawn(
        client: Arc<ChainClient>,
        fee_model: FeeModel,
        interval: Duration,
        ws_urls: Vec<Endpoint>,
        configured_cap: Option<U256>,
    ) -> Self {
        let (sender, latest) = watch::channel(None);
        let sender = Arc::new(sender);
        let recent = Arc::new(Mutex::new(RecentBlocks::default()));
        let first_seen = Arc::new(Mutex::new(FirstSeen::default()));
        let derived_cap = DerivedCap::new(configured_cap.map(OnceLock::from).unwrap_or_default());
        let new_head = Arc::new(Notify::new());
        let cadence = ws_urls.is_empty().then(|| Cadence::new(interval));
        if !ws_urls.is_empty() {
            tokio::spawn(subscribe_new_heads(
                client.name().to_string(),
                ws_urls,
                Arc::downgrade(&new_head),
            ));
        }
        let guard = Arc::new(Guard::new(format!("head watcher of {}", client.name())));
        let poller_guard = guard.clone();
        let mut poller = Poller {
            client: client.clone(),
            sender: Arc::downgrade(&sender),
            recent: recent.clone(),
            first_seen: first_seen.clone(),
            derived_cap: derived_cap.clone(),
            fee_model,
            last_full_read: Instant::now(),
            interval,
            cadence,
        };
        tokio::spawn(async move {
            // The first look is at once: readiness and the lanes want a head from the start.
            let mut wait = Duration::ZERO;
            loop {
                // A subscribed new head skips the light poll: the block is known to have moved.
                let announced = tokio::select! {
                    _ = tokio::time::sleep(wait) => false,
                    _ = new_head.notified() => true,
                };
                if poller_guard.step(poller.tick(announced)).await == Some(false) {
                    return;
                }
                wait = poller.next_look();
            }
        });
        Self {
            client,
            fee_model,
            latest,
            sender,
            recent,
            first_seen,
            derived_cap,
            guard,
        }
    }

    /// When the watcher first saw block `block` (or, skipped, the first head above it); `None`
    /// when it is older than the blocks kept or not seen yet.
    pub fn first_seen(&self, block: u64) -> Option<Instant> {
        lock(&self.first_seen).of(block)
    }

    /// The cap derived from the first head read; unset until one was.
    pub fn derived_cap(&self) -> DerivedCap {
        self.derived_cap.clone()
    }

    /// Whether block `number` with `hash` is still canonical, as far as the watcher knows.
    pub fn canonical(&self, number: u64, hash: H256) -> Canonical {
        let head = self.current().map_or(u64::MAX, |h| h.number);
        // A step that panicked while holding it left whole entries: they stay usable.
        self.recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .canonical(number, hash, head)
    }

    pub fn current(&self) -> Option<Head> {
        self.latest.borrow().clone()
    }

    pub async fn latest_or_fetch(&self) -> Result<Head, Unreachable> {
        if let Some(head) = self.current() {
            return Ok(head);
        }
        let head = fetch_head(&self.client, self.fee_model).await?;
        derive_cap(&self.derived_cap, self.client.name(), &head);
        lock(&self.first_seen).note(head.number, head.fetched_at);
        self.sender.send_if_modified(|cached| {
            let newer = cached.as_ref().is_none_or(|c| c.number < head.number);
            if newer {
                *cached = Some(head.clone());
            }
            newer
        });
        Ok(head)
    }

    /// A receiver that is notified at every new block.
    pub fn subscribe(&self) -> watch::Receiver<Option<Head>> {
        self.latest.clone()
    }
}

/// A step that panicked while holding the lock left whole entries: they stay usable.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Pause before subscribing again after a WebSocket failure.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// `eth_subscribe("newHeads")` on each WebSocket URL in turn; every announced head wakes the
/// poller. A broken subscription is made again; polling goes on meanwhile.
async fn subscribe_new_heads(chain: String, ws_urls: Vec<Endpoint>, wake: Weak<Notify>) {
    // URLs are named by position: a provider's URL may carry an API key.
    for (index, url) in ws_urls.iter().enumerate().cycle() {
        if wake.strong_count() == 0 {
            return;
        }
        match follow_subscription(url.expose(), &wake).await {
            Ok(()) => {
                tracing::info!(%chain, ws_url = index, "newHeads subscription ended; subscribing again")
            }
            Err(error) => {
                let error = short(&error).replace(url.expose(), &url.shown());
                tracing::warn!(%chain, ws_url = index, %error, "newHeads subscription failed; polling meanwhile")
            }
        }
        tokio::time::sleep(RESUBSCRIBE_AFTER).await;
    }
}

async fn follow_subscription(
    url: &str,
    wake: &Weak<Notify>,
) -> Result<(), jsonrpsee::core::ClientError> {
    // Without the logger middleware, as the HTTP clients (chain/client.rs says why).
    let client = WsClientBuilder::default()
        .set_rpc_middleware(jsonrpsee::core::middleware::RpcServiceBuilder::new())
        .build(url)
        .await?;
    let mut heads: Subscription<Value> = client
        .subscribe("eth_subscribe", rpc_params!["newHeads"], "eth_unsubscribe")
        .await?;
    while let Some(head) = heads.next().await {
        head?;
        match wake.upgrade() {
            Some(wake) => wake.notify_one(),
            None => return Ok(()),
        }
    }
    Ok(())
}

/// A client error without the URL it may quote.
fn short(error: &jsonrpsee::core::ClientError) -> String {
    match error {
        jsonrpsee::core::ClientError::Transport(_) => {
            "cannot connect or the connection broke".to_string()
        }
        other => other.to_string().chars().take(200).collect(),
    }
}

/// Intervals between two full reads of the head block.
const FULL_READ_EVERY: u32 = 10;
/// The largest block number or timestamp taken from a node (2^48: far beyond any chain).
const MAX_PLAUSIBLE_NUMBER: u64 = 1 << 48;
/// The widest price per gas taken from a node, in bits (2^128 wei is far beyond any fee).
const MAX_PRICE_BITS: usize = 128;
/// Blocks of fee history read with every head: what the node's fee answers are judged against.
const FEE_HISTORY_BLOCKS: u64 = 20;
/// The reward percentile asked of each block: its median tip.
const TIP_PERCENTILE: u64 = 50;

async fn block_number(client: &ChainClient) -> Result<u64, Unreachable> {
    let answer = client.call(Traffic::Own, "eth_blockNumber", vec![]).await?;
    answer
        .ok()
        .as_ref()
        .and_then(parse_u64)
        .ok_or_else(|| Unreachable {
            chain: client.name().to_string(),
            detail: "eth_blockNumber gave no number".to_string(),
        })
}

/// Records `head` among the recent blocks; when it does not extend them, walks back by number
/// (at most [`KEPT_BLOCKS`] blocks) until a block matches, replacing what changed.
async fn link(client: &ChainClient, recent: &Mutex<RecentBlocks>, head: &Head) {
    {
        let mut recent = recent.lock().unwrap_or_else(PoisonError::into_inner);
        let extends = recent.extends(head.number, head.parent_hash);
        let knows_older = recent.0.range(..head.number).next_back().is_some();
        recent.set(head.number, head.hash);
        if extends == Some(true) || !knows_older {
            return;
        }
    }
    let mut number = head.number;
    let mut parent = head.parent_hash;
    while number > 0 && head.number - number < KEPT_BLOCKS {
        number -= 1;
        {
            let mut recent = recent.lock().unwrap_or_else(PoisonError::into_inner);
            if recent.0.get(&number) == Some(&parent) {
                return;
            }
            recent.0.insert(number, parent);
        }
        tracing::info!(chain = %client.name(), block = number, "reorganisation: block replaced");
        match fetch_block(client, number).await {
            Ok((_, grandparent)) => parent = grandparent,
            Err(error) => {
                tracing::warn!(chain = %client.name(), %error, "could not walk back a reorganisation");
                return;
            }
        }
    }
}

/// The hash and parent hash of block `number`.
async fn fetch_block(client: &ChainClient, number: u64) -> Result<(H256, H256), Unreachable> {
    let answer = client
        .call(
            Traffic::Own,
            "eth_getBlockByNumber",
            vec![json!(format!("{number:#x}")), json!(false)],
        )
        .await?;
    let block = answer.map_err(|e| Unreachable {
        chain: client.name().to_string(),
        detail: e.message,
    })?;
    let hash = |field: &str| block.get(field).and_then(parse_hash);
    hash("hash")
        .zip(hash("parentHash"))
        .ok_or_else(|| Unreachable {
            chain: client.name().to_string(),
            detail: format!("block {number} has no hash"),
        })
}

pub fn parse_hash(value: &Value) -> Option<H256> {
    parse_h256(value.as_str()?)
}

/// One batch: the latest block, both fee hints and the recent blocks' fee history; which hint
/// applies depends on the block, and the history judges it (`RecentFees`): the head poll reads
/// the history so that no request path (verify, settle, a route) has to.
async fn fetch_head(client: &ChainClient, fee_model: FeeModel) -> Result<Head, Unreachable> {
    let mut batch = Batch::new();
    let block = batch.add(Call::new(
        "eth_getBlockByNumber",
        vec![json!("latest"), json!(false)],
    ));
    let tip = batch.add(Call::new("eth_maxPriorityFeePerGas", vec![]));
    let gas_price = batch.add(Call::new("eth_gasPrice", vec![]));
    let history = batch.add(Call::new(
        "eth_feeHistory",
        vec![
            json!(format!("{FEE_HISTORY_BLOCKS:#x}")),
            json!("latest"),
            json!([TIP_PERCENTILE]),
        ],
    ));
    let answers = client.ask(Traffic::Own, &batch).await?;
    let malformed = |what: &str| Unreachable {
        chain: client.name().to_string(),
        detail: format!("malformed {what} in head block answer"),
    };
    let block = answers
        .get(block)
        .as_ref()
        .map_err(|e| malformed(&e.message))?;
    let header = read_header(block).map_err(malformed)?;
    let price = |v: &Value| parse_quantity(v).filter(|p| p.bits() <= MAX_PRICE_BITS);
    let base_fee = block.get("baseFeePerGas").and_then(price);
    // A node without eth_feeHistory: the head block's base fee is all there is to judge by.
    let recent = answers
        .get(history)
        .as_ref()
        .ok()
        .and_then(RecentFees::parse)
        .unwrap_or_default();
    let use_1559 = match fee_model {
        FeeModel::Legacy => false,
        FeeModel::Eip1559 | FeeModel::OpStack => true,
        FeeModel::Auto => base_fee.is_some(),
    };
    let fees = if use_1559 {
        let base_fee = base_fee.unwrap_or_default();
        let suggested = answers.get(tip).as_ref().ok().and_then(price);
        Fees::Eip1559 {
            base_fee,
            priority_fee: recent.judge_tip(suggested, base_fee),
        }
    } else {
        let suggested = answers.get(gas_price).as_ref().ok().and_then(price);
        Fees::Legacy {
            gas_price: recent.judge_gas_price(suggested.ok_or_else(|| malformed("gas price"))?),
        }
    };
    Ok(Head {
        number: header.number,
        hash: header.hash,
        parent_hash: header.parent_hash,
        timestamp: header.timestamp,
        fees,
        recent,
        fetched_at: Instant::now(),
    })
}

/// The identity fields of a head block.
struct Header {
    number: u64,
    hash: H256,
    parent_hash: H256,
    timestamp: u64,
}

/// Reads a block's identity; `Err` names the field that is missing or implausible.
fn read_header(block: &Value) -> Result<Header, &'static str> {
    // Numbers no chain reaches are garbage, not a head: every sum made with them later
    // (depths, bump deadlines, costs) stays far from overflowing.
    let plausible = |n: &u64| *n <= MAX_PLAUSIBLE_NUMBER;
    let number = |field: &'static str| {
        block
            .get(field)
            .and_then(parse_u64)
            .filter(plausible)
            .ok_or(field)
    };
    let hash = |field: &'static str| block.get(field).and_then(parse_hash).ok_or(field);
    Ok(Header {
        number: number("number")?,
        timestamp: number("timestamp")?,
        hash: hash("hash")?,
        parent_hash: hash("parentHash")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u8) -> H256 {
        H256::repeat_byte(n)
    }

    #[test]
    fn a_rollback_forgets_the_blocks_above_and_a_replaced_block_is_not_canonical() {
        let mut recent = RecentBlocks::default();
        for n in 1..=5u8 {
            recent.set(n as u64, h(n));
        }
        assert_eq!(recent.canonical(4, h(4), 5), Canonical::Yes);
        recent.set(3, h(3));
        assert_eq!(recent.canonical(4, h(4), 3), Canonical::No);
        recent.set(4, h(44));
        assert_eq!(recent.canonical(4, h(4), 4), Canonical::No);
        assert_eq!(recent.extends(5, h(44)), Some(true));
        assert_eq!(recent.extends(5, h(4)), Some(false));
        assert_eq!(recent.canonical(0, h(0), 4), Canonical::Unknown);
    }

    #[test]
    fn a_block_is_first_seen_with_its_head_or_the_next_one_above_it() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut seen = FirstSeen::default();
        seen.note(10, at(0));
        seen.note(12, at(5));
        seen.note(12, at(9)); // the same height again (a replaced block): first seen stays
        assert_eq!(seen.of(10), Some(at(0)));
        assert_eq!(seen.of(11), Some(at(5)), "skipped: seen with block 12");
        assert_eq!(seen.of(12), Some(at(5)));
        assert_eq!(seen.of(13), None, "not seen yet");
        for n in 0..=KEPT_BLOCKS {
            seen.note(100 + n, at(10));
        }
        assert_eq!(seen.of(10), None, "older blocks are forgotten");
        assert_eq!(seen.of(9), None);
        assert_eq!(seen.0.len() as u64, KEPT_BLOCKS);
    }
}
