// What the stores in tests/fixtures/store-53628ba/ hold: written by routerd 53628ba (the release
// before the ledger room) through its store API, by this very text `include!`d into its tree,
// and read back by this routerd in `store::upgrade_tests`. Kept free of paths so that both
// trees compile it; the includer brings Record, Attempt, Inclusion, Outcome, Lost,
// LaneId, Reason, TxFees, Storage, Duration, Address, Bytes, H256, U256 and serde_json's `json!`,
// and `fixture_router_key()`: in 53628ba the reservation's key was its encoded string,
// FIXTURE_ROUTER_KEY; here it is a RouterNonceKey that encodes to the same. A claim is written
// in the stored layout, which every release reads (53628ba's records and this one's differ in
// memory, and 53628ba has no constructor); the fields 53628ba did not have are left out, and
// read back as it meant them (ERC-3009, called on the token).

const FIXTURE_AT: u64 = 1_700_000_000;
const FIXTURE_ROUTER_KEY: &str = "l1|0x7070707070707070707070707070707070707070|ip:127.0.0.1";

fn fixture_lane() -> LaneId {
    LaneId {
        network: "chainX".to_string(),
        signer: Address::repeat_byte(0x51),
    }
}

fn fixture_claim(n: u8) -> Record {
    let hex = |byte: u8, len: usize| format!("0x{}", format!("{byte:02x}").repeat(len));
    let claim = json!({
        "network": "chainX",
        "token": hex(0x10, 20),
        "payer": hex(0x20 + n % 2, 20),
        "pay_to": hex(0x30, 20),
        "value": format!("{:#x}", 1000 * u64::from(n)),
        "nonce": hex(n, 32),
        "valid_before": FIXTURE_AT + 3600,
        "digest": hex(0x80 + n, 32),
        "calldata": format!("0xe3ee160e{n:02x}"),
        "gas_limit": 150_000,
        "request": { "key": format!("order-{n}"), "body": hex(0xb0 + n, 32) },
        "state": "Claimed",
        "attempts": [],
        "outcome": null,
        "lost": false,
        "finished_at": null,
    });
    serde_json::from_value(claim).expect("a claim in the stored layout")
}

fn fixture_attempt(n: u8, nonce: u64) -> Attempt {
    Attempt {
        signer: fixture_lane().signer,
        nonce,
        hash: H256::repeat_byte(0xa0 + n),
        raw: Bytes::from(vec![0x02, n]),
        fees: if n.is_multiple_of(2) {
            TxFees::Legacy {
                gas_price: U256::from(7_000_000_000u64),
            }
        } else {
            TxFees::Eip1559 {
                max_fee: U256::from(9_000_000_000u64),
                priority_fee: U256::from(1_000_000_000u64),
            }
        },
        sent_at_block: 100 + u64::from(n),
    }
}

fn fixture_inclusion(n: u8, succeeded: bool) -> Inclusion {
    Inclusion {
        block: 110 + u64::from(n),
        block_hash: H256::repeat_byte(0xc0 + n),
        transaction: H256::repeat_byte(0xa0 + n),
        succeeded,
    }
}

/// Every record of the fixture, one per state a settlement can be left in.
fn fixture_records() -> Vec<Record> {
    let claimed = fixture_claim(1);
    let mut signed = fixture_claim(2);
    signed.signed(fixture_attempt(2, 2));
    let mut sent = fixture_claim(3);
    sent.signed(fixture_attempt(3, 3));
    sent.sent();
    let mut included = fixture_claim(4);
    included.signed(fixture_attempt(4, 4));
    included.sent();
    included.included(fixture_inclusion(4, true));
    included.confirm(116, 1, || unreachable!("it succeeded"));
    let mut settled = fixture_claim(5);
    settled.signed(fixture_attempt(5, 5));
    settled.signed(fixture_attempt(6, 5));
    settled.sent();
    settled.included(fixture_inclusion(5, true));
    settled.confirm(200, 1, || unreachable!("it succeeded"));
    settled.finalize(200, 64, FIXTURE_AT);
    let mut reverted = fixture_claim(7);
    reverted.signed(fixture_attempt(7, 6));
    reverted.sent();
    reverted.included(fixture_inclusion(7, false));
    reverted.confirm(200, 1, || Outcome {
        success: false,
        reason: Some(Reason::InsufficientFunds),
        message: Some("ERC20: transfer amount exceeds balance".to_string()),
        transaction: Some(H256::repeat_byte(0xa7)),
    });
    reverted.finalize(200, 64, FIXTURE_AT);
    let mut expired = fixture_claim(8);
    expired.signed(fixture_attempt(8, 7));
    expired.expire(Lost::ValidBeforePassed, FIXTURE_AT);
    let mut lost = fixture_claim(9);
    lost.signed(fixture_attempt(9, 8));
    lost.included(fixture_inclusion(9, true));
    lost.confirm(200, 1, || unreachable!("it succeeded"));
    lost.reorged();
    lost.expire(Lost::AuthorizationUsedElsewhere, FIXTURE_AT);
    vec![claimed, signed, sent, included, settled, reverted, expired, lost]
}

/// The claims `fixture_records` began from, in its order.
const FIXTURE_CLAIMS: [u8; 8] = [1, 2, 3, 4, 5, 7, 8, 9];

/// Writes the fixture as the settlement service would: claims, signed attempts under the lane's
/// lease with its next nonce, the states that followed, and two router reservations.
async fn write_fixture(store: &Storage) {
    let lease = store
        .acquire(&fixture_lane(), "fixture", Duration::from_secs(3600))
        .await
        .unwrap()
        .unwrap();
    // Each record was first claimed as it began.
    for n in FIXTURE_CLAIMS {
        let claim = fixture_claim(n);
        let taken = store.claim(&claim.key(), &claim, None, &Limits::balance(U256::MAX)).await;
        assert!(matches!(taken.unwrap(), Claim::Claimed));
    }
    let records = fixture_records();
    let signed: Vec<&Record> = records.iter().filter(|r| r.latest().is_some()).collect();
    store.commit_signed(&lease, 9, &signed).await.unwrap();
    let all: Vec<&Record> = records.iter().collect();
    store.save(&all, true).await.unwrap();
    for pending in [3, 3] {
        store
            .reserve_router_nonce(&fixture_router_key(), pending, FIXTURE_AT, 120, 16)
            .await
            .unwrap();
    }
    store.flush().await.unwrap();
}
