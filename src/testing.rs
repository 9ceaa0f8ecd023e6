//! Fixtures the unit tests share: a claimed record, a signed attempt, a fresh directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ethers_core::types::{Address, Bytes, H256, U256};
use solana_pubkey::Pubkey;

use crate::evm::TxFees;
use crate::ledger::{Attempt, EvmTerms, Record, SvmSettlement, SvmTerms, Terms};

/// anvil's first development account: a key published with anvil (and hardhat), never used
/// for value. Tests that need a signer use it; no real signer key is ever written in code.
pub const ANVIL_KEY_0: &str = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

/// A claimed payment of 1000 from 0x02…02 to 0x03…03 on `net`, told apart by `nonce`.
pub fn record(nonce: u8) -> Record {
    let terms = EvmTerms {
        token: Address::repeat_byte(1),
        payer: Address::repeat_byte(2),
        pay_to: Address::repeat_byte(3),
        nonce: H256::repeat_byte(nonce),
        valid_before: u64::MAX / 2,
        method: Default::default(),
        approves_permit2: false,
        via: None,
        sender: None,
        calldata: Bytes::from(vec![1, 2, 3]),
        gas_limit: 90_000,
    };
    let digest = H256::repeat_byte(0xd0);
    Record::new(
        "net".to_string(),
        U256::from(1000),
        digest,
        Terms::Evm(terms),
    )
}

/// A legacy-priced transaction of `signer` at `nonce`, its hash told apart by the nonce.
pub fn attempt(signer: Address, nonce: u64) -> Attempt {
    Attempt {
        signer,
        nonce,
        hash: H256::from_low_u64_be(nonce + 1),
        raw: Bytes::from(vec![0xf8]),
        fees: TxFees::Legacy {
            gas_price: U256::from(1),
        },
        sent_at_block: 1,
    }
}

/// An empty directory of this process named `name` (what was there before is removed).
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("routerd-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The sled store at `dir` opened again. The handle dropped before may still hold the
/// directory's lock for a moment: a flush's blocking task lets go of its handle just after it
/// has answered.
pub fn reopen(dir: &Path) -> crate::store::sled::Store {
    for _ in 0..100 {
        match crate::store::sled::Store::open(dir) {
            Ok(store) => return store,
            Err(e) if e.to_string().contains("could not acquire lock") => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("reopening {}: {e}", dir.display()),
        }
    }
    panic!("{} stayed locked for 5 s", dir.display())
}

/// A claimed Solana payment of 1000 on `network` settling [`svm_settlement`], its key's digest
/// told apart by `digest`; its mint and source token account are all 0x11 and all 0x22 (so its
/// exposure counts against the account `network|0x11…11|0x22…22`, 32 bytes each).
pub fn svm_record(network: &str, digest: u8) -> Record {
    svm_record_from(network, digest, Pubkey::new_from_array([0x22; 32]))
}

/// [`svm_record`] from the token account `source`.
pub fn svm_record_from(network: &str, digest: u8, source: Pubkey) -> Record {
    let terms = SvmTerms {
        signature_digest: [digest; 32],
        mint: Pubkey::new_from_array([0x11; 32]),
        source,
        settlement: svm_settlement(),
    };
    let digest = H256::repeat_byte(0xd0);
    Record::new(
        network.to_string(),
        U256::from(1000),
        digest,
        Terms::Svm(terms),
    )
}

/// A Solana settlement of 1000 by a made-up signature and wire transaction (not decodable: the
/// ledger and the stores keep it as they are given it).
pub fn svm_settlement() -> SvmSettlement {
    SvmSettlement {
        signature: "5sig".into(),
        transaction: "AQID".into(),
        last_valid_block_height: 150,
        payer: "payer".into(),
        pay_to: "payee".into(),
        mint: "mint".into(),
        source: None,
        amount: 1000,
        error: None,
    }
}

/// A Solana record as the landed Solana release stored it (no source in full): its account is
/// the one that release keyed it by, in `(mint, source)` 20 bytes each.
pub fn landed_solana_record(digest: u8) -> serde_json::Value {
    let settlement = svm_settlement();
    assert!(settlement.source.is_none(), "that release wrote no source");
    serde_json::json!({
        "network": "solana-devnet",
        "token": format!("0x{}", "11".repeat(20)),
        "payer": format!("0x{}", "22".repeat(20)),
        "pay_to": format!("0x{}", "00".repeat(20)),
        "value": "0x3e8",
        "nonce": format!("0x{}", format!("{digest:02x}").repeat(32)),
        "valid_before": 0,
        "digest": format!("0x{}", "d0".repeat(32)),
        "calldata": "0x",
        "gas_limit": 0,
        "request": null,
        "state": "Claimed",
        "attempts": [],
        "outcome": null,
        "lost": false,
        "finished_at": null,
        "svm": settlement,
    })
}
