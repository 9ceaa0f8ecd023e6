//! The embedded store's own memory for a settle burst's records, for the benchmark: the part of
//! routerd's peak that no request path can give back, measured with nothing else in the process.
//!
//!   store-memory STORE_PATH COUNT [BATCH]
//!
//! It opens a new sled store and writes COUNT settlement records through the library's own
//! ledger, in the steps and batches a lane writes them during the burst: each claimed alone, then
//! signed, sent and included BATCH at a time (381 by default, a full block of settlements). Each
//! record is the size of the burst's (ERC-3009 calldata, a signed EIP-1559 transaction), and the
//! records are held while they are written, as the lanes hold theirs until final. It prints one
//! JSON line: the records' stored JSON in MiB and the process's anonymous RSS (`RssAnon`) at the
//! start, at its highest after any step, once the records are dropped, and once glibc has given
//! back every free page it can (`malloc_trim`): what stays then is in pages live data also uses.

use ethers_core::types::{Address, Bytes, H256, U256};
use routerd::evm::TxFees;
use routerd::ledger::{Attempt, Inclusion, LaneId, Record};
use routerd::store::sled::Store;
use routerd::store::{LaneStore, Limits, SettlementStore};

#[path = "records.rs"]
mod records;

/// `transferWithAuthorization(from, to, value, validAfter, validBefore, nonce, v, r, s)`.
const CALLDATA_BYTES: usize = 4 + 9 * 32;
/// The signed EIP-1559 transaction carrying it.
const RAW_BYTES: usize = CALLDATA_BYTES + 112;
/// The burst's payers: claims of one payer share its exposure entries.
const PAYERS: u64 = 250;

extern "C" {
    /// glibc: returns every whole free page of every arena to the kernel.
    fn malloc_trim(pad: usize) -> i32;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(count)) = (args.next(), args.next().and_then(|c| c.parse::<u64>().ok()))
    else {
        eprintln!("usage: store-memory STORE_PATH COUNT [BATCH]");
        std::process::exit(2);
    };
    let batch = args.next().and_then(|b| b.parse().ok()).unwrap_or(381);
    let store = Store::open(std::path::Path::new(&path)).expect("open the store");
    let start = anon_mib();
    let mut peak = start;
    let mut records = claim_and_sign(&store, count, batch, &mut peak).await;
    for record in &mut records {
        record.sent();
    }
    save(&store, &records, batch, &mut peak).await;
    for (i, record) in records.iter_mut().enumerate() {
        let transaction = record.latest().expect("signed").hash;
        record.included(Inclusion {
            block: 1 + i as u64 / batch as u64,
            block_hash: H256::repeat_byte(1),
            transaction,
            succeeded: true,
        });
    }
    save(&store, &records, batch, &mut peak).await;
    let json: usize = records
        .iter()
        .map(|r| serde_json::to_vec(r).expect("a record serializes").len())
        .sum();
    drop(records);
    let after = anon_mib();
    // SAFETY: malloc_trim only releases free memory; it is safe to call at any time.
    unsafe { malloc_trim(0) };
    let trimmed = anon_mib();
    println!(
        "{}",
        serde_json::json!({
            "records": count, "batch": batch, "jsonMiB": json as f64 / 1048576.0,
            "anonStartMiB": start, "anonPeakMiB": peak, "anonAfterMiB": after,
            "anonTrimmedMiB": trimmed,
        })
    );
}

/// Claims each record alone, as each settle does, and signs them `batch` at a time under the
/// lane's lease, as the worker does at each head.
async fn claim_and_sign(store: &Store, count: u64, batch: usize, peak: &mut f64) -> Vec<Record> {
    let signer = Address::repeat_byte(0x44);
    let lane = LaneId {
        network: "base-sepolia".into(),
        signer,
    };
    let ttl = std::time::Duration::from_secs(600);
    let lease = store.acquire(&lane, "bench", ttl).await.expect("lease");
    let lease = lease.expect("a new store's lane is free");
    let mut records: Vec<Record> = (0..count).map(claimed).collect();
    for record in &records {
        let limits = Limits::balance(U256::MAX);
        let claim = store.claim(&record.key(), record, None, &limits).await;
        claim.expect("claim");
    }
    *peak = peak.max(anon_mib());
    let mut next = 0;
    for chunk in records.chunks_mut(batch) {
        for record in chunk.iter_mut() {
            record.signed(Attempt {
                signer,
                nonce: next,
                hash: H256::from_low_u64_be(next + 1),
                raw: Bytes::from(vec![0x5a; RAW_BYTES]),
                fees: TxFees::Legacy {
                    gas_price: 1_000_000_000u64.into(),
                },
                sent_at_block: 1,
            });
            next += 1;
        }
        let refs: Vec<&Record> = chunk.iter().collect();
        store
            .commit_signed(&lease, next, &refs)
            .await
            .expect("sign");
        *peak = peak.max(anon_mib());
    }
    records
}

/// Stores one step of every record, a block's worth per durable write.
async fn save(store: &Store, records: &[Record], batch: usize, peak: &mut f64) {
    for chunk in records.chunks(batch) {
        let refs: Vec<&Record> = chunk.iter().collect();
        store.save(&refs, true).await.expect("save");
        *peak = peak.max(anon_mib());
    }
}

/// A claimed record of payment `i`: a distinct nonce, one of `PAYERS` payers.
fn claimed(i: u64) -> Record {
    let spread = |x: u64| x.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes();
    let mut nonce = [0u8; 32];
    nonce[..8].copy_from_slice(&spread(i + 1));
    let mut payer = [0u8; 20];
    payer[..8].copy_from_slice(&spread(i % PAYERS + 1));
    records::claimed(records::Payment {
        nonce: H256(nonce),
        payer: Address::from(payer),
        digest: H256::from_low_u64_be(i + 1),
        valid_before: routerd::clock::unix_now() + 3600,
        calldata: Bytes::from(vec![0xa5; CALLDATA_BYTES]),
    })
}

/// The process's anonymous resident memory, in MiB.
fn anon_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .expect("RssAnon");
    kib / 1024.0
}
