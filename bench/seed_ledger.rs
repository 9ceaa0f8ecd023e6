//! Fills a routerd store with finished settlement records, for the start-up benchmark: start-up
//! must read only the unfinished index, so its time must not grow with these.
//!
//!   cargo run --release --example seed-ledger -- STORE_PATH COUNT

use ethers_core::types::{Address, Bytes, H256, U256};
use routerd::evm::TxFees;
use routerd::ledger::{Attempt, Inclusion, Outcome, Record, State};
use routerd::store::sled::Store;
use routerd::store::{Limits, SettlementStore};

#[path = "records.rs"]
mod records;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(count)) = (args.next(), args.next().and_then(|c| c.parse::<u64>().ok()))
    else {
        eprintln!("usage: seed-ledger STORE_PATH COUNT");
        std::process::exit(2);
    };
    let store = Store::open(std::path::Path::new(&path)).expect("open the store");
    let now = routerd::clock::unix_now();
    for i in 0..count {
        let record = finished_record(i, now);
        store
            .claim(&record.key(), &record, None, &Limits::balance(U256::MAX))
            .await
            .expect("claim");
        store.save(&[&record], false).await.expect("save");
    }
    store.flush().await.expect("flush");
    println!("{count} finished records in {path}");
}

fn finished_record(i: u64, now: u64) -> Record {
    let mut nonce = [0u8; 32];
    nonce[24..].copy_from_slice(&i.to_be_bytes());
    let hash = H256::from_low_u64_be(i + 1);
    let inclusion = Inclusion {
        block: i,
        block_hash: hash,
        transaction: hash,
        succeeded: true,
    };
    let mut record = records::claimed(records::Payment {
        nonce: H256(nonce),
        payer: Address::repeat_byte(0x22),
        digest: hash,
        valid_before: now + 3600,
        calldata: Bytes::from(vec![0u8; 260]),
    });
    record.state = State::Final { inclusion };
    record.evm_mut().expect("an EVM claim").attempts = vec![Attempt {
        signer: Address::repeat_byte(0x44),
        nonce: i,
        hash,
        raw: Bytes::from(vec![0u8; 400]),
        fees: TxFees::Legacy {
            gas_price: 1.into(),
        },
        sent_at_block: i,
    }];
    record.outcome = Some(Outcome {
        success: true,
        reason: None,
        message: None,
        transaction: Some(hash),
    });
    record.finished_at = Some(now);
    record
}
