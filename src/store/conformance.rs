//! One suite, every backend: what the daemon relies on from its store. sled runs with the unit
//! tests; PostgreSQL runs against a real server when `ROUTERD_TEST_POSTGRES_URL` names one
//! (scripts/test-postgres starts a throwaway cluster and sets it). Each case gets two handles
//! on one store, as two instances would have.
#![cfg(test)]

use std::sync::Arc;
use std::time::Duration;

use ethers_core::types::{Address, H256, U256};

use super::{
    next_router_nonce, Claim, Limits, Listing, PayerCooldown, Permit2Clash, Sent, Storage,
    StoreError,
};
use crate::ledger::{
    Inclusion, LaneId, Outcome, Pass, PaymentKey, Record, RequestTag, RouterNonceKey, State,
};

const LONG: Duration = Duration::from_secs(600);

use crate::testing::record;

fn lane() -> LaneId {
    LaneId {
        network: "net".to_string(),
        signer: Address::repeat_byte(9),
    }
}

fn signed(mut record: Record, nonce: u64) -> Record {
    record.signed(crate::testing::attempt(lane().signer, nonce));
    record
}

fn finished(mut record: Record, at: u64) -> Record {
    let inclusion = Inclusion {
        block: 5,
        block_hash: H256::repeat_byte(5),
        transaction: H256::repeat_byte(6),
        succeeded: true,
    };
    record.state = State::Final { inclusion };
    record.outcome = Some(Outcome {
        success: true,
        reason: None,
        message: None,
        transaction: Some(inclusion.transaction),
    });
    record.finished_at = Some(at);
    record
}

async fn claims_once_and_releases(a: &Storage, b: &Storage) {
    let first = record(1);
    let key = first.key();
    assert!(matches!(
        a.claim(&key, &first, None, &Limits::balance(U256::MAX))
            .await
            .unwrap(),
        Claim::Claimed
    ));
    let mut other = record(1);
    other.digest = H256::repeat_byte(0xee);
    match b
        .claim(&key, &other, None, &Limits::balance(U256::MAX))
        .await
        .unwrap()
    {
        Claim::Exists(stored) => assert_eq!(stored.digest, first.digest, "the first claim stays"),
        Claim::Claimed => panic!("a payment was claimed twice"),
        other => panic!("no limit or key was set: {other:?}"),
    }
    assert_eq!(b.get(&key).await.unwrap().unwrap().digest, first.digest);
    let unfinished = b.unfinished().await.unwrap();
    assert!(unfinished.iter().any(|r| r.key() == key));
    a.release(&key).await.unwrap();
    assert!(b.get(&key).await.unwrap().is_none());
    assert!(!b.unfinished().await.unwrap().iter().any(|r| r.key() == key));
    assert!(matches!(
        b.claim(&key, &other, None, &Limits::balance(U256::MAX))
            .await
            .unwrap(),
        Claim::Claimed
    ));
}

/// A Solana settlement (svm.md §4): claimed once under its family's key, its signed transaction
/// read back whole by every handle (the write-ahead), and ended like any record.
async fn a_solana_settlement_is_claimed_once_and_read_back_whole(a: &Storage, b: &Storage) {
    let mut claim = record(1);
    claim.network = "solana-devnet".to_string();
    // The mint's and the source token account's first bytes: the account of its exposure.
    claim.token = Address::repeat_byte(0x11);
    claim.payer = Address::repeat_byte(0x22);
    claim.nonce = H256::repeat_byte(0x5a);
    claim.svm = Some(crate::testing::svm_settlement());
    let key = PaymentKey::svm("solana-devnet", [0x5a; 32]);
    assert_eq!(claim.key(), key);
    let limits = Limits::balance(U256::MAX);
    assert!(matches!(
        a.claim(&key, &claim, None, &limits).await.unwrap(),
        Claim::Claimed
    ));
    a.save(&[&claim], true).await.unwrap();
    match b.claim(&key, &claim, None, &limits).await.unwrap() {
        Claim::Exists(stored) => assert_eq!(stored.svm, claim.svm),
        other => panic!("a Solana payment was claimed twice: {other:?}"),
    }
    let unfinished = b.unfinished().await.unwrap();
    let stored = unfinished.iter().find(|r| r.key() == key).unwrap();
    assert_eq!(stored.svm, claim.svm, "the signed transaction is stored");
    // Verify reads the same exposure without claiming.
    assert_eq!(b.exposed(&claim.account()).await.unwrap(), U256::from(1000));
    // The same source's next payment counts this one in flight (access.md §2).
    let mut next = claim.clone();
    next.nonce = H256::repeat_byte(0x5b);
    let next_key = PaymentKey::svm("solana-devnet", [0x5b; 32]);
    let within = Limits::balance(U256::from(1500));
    match b.claim(&next_key, &next, None, &within).await.unwrap() {
        Claim::OverLimit { exposed } => assert_eq!(exposed, U256::from(1000)),
        other => panic!("the source's exposure was not counted: {other:?}"),
    }
    let mut ended = claim.clone();
    ended.landed(42, Some("{\"InstructionError\":[2,\"Custom\"]}".into()), 9);
    b.save(&[&ended], true).await.unwrap();
    let read = a.get(&key).await.unwrap().unwrap();
    assert_eq!(read.state, ended.state);
    assert_eq!(read.svm, ended.svm);
    assert!(!a.unfinished().await.unwrap().iter().any(|r| r.key() == key));
    assert_eq!(a.exposed(&claim.account()).await.unwrap(), U256::zero());
    assert!(matches!(
        b.claim(&next_key, &next, None, &within).await.unwrap(),
        Claim::Claimed
    ));
}

async fn concurrent_claims_have_one_winner(a: &Storage, b: &Storage) {
    let key = record(2).key();
    let mut tasks = Vec::new();
    for i in 0..24u8 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        let mut candidate = record(2);
        candidate.digest = H256::repeat_byte(i);
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            matches!(
                store
                    .claim(&key, &candidate, None, &Limits::balance(U256::MAX))
                    .await
                    .unwrap(),
                Claim::Claimed
            )
        }));
    }
    let mut winners = 0;
    for task in tasks {
        winners += usize::from(task.await.unwrap());
    }
    assert_eq!(winners, 1);
}

/// A payer's claims that still expose its balance add up, across handles and concurrently:
/// with a limit of three values, three of eight concurrent claims win. An answered one stops
/// counting; a released one too.
async fn exposure_adds_up_per_account(a: &Storage, b: &Storage) {
    let value = record(0).value;
    let limit = value * 3;
    let mut tasks = Vec::new();
    for i in 0..8u8 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        let candidate = record(0x40 + i);
        tasks.push(tokio::spawn(async move {
            let key = candidate.key();
            let claim = store
                .claim(&key, &candidate, None, &Limits::balance(limit))
                .await
                .unwrap();
            matches!(claim, Claim::Claimed).then_some(candidate)
        }));
    }
    let mut won = Vec::new();
    for task in tasks {
        won.extend(task.await.unwrap());
    }
    assert_eq!(won.len(), 3, "three values fit under the limit");
    let late = record(0x50);
    match b
        .claim(&late.key(), &late, None, &Limits::balance(limit))
        .await
        .unwrap()
    {
        Claim::OverLimit { exposed } => assert_eq!(exposed, limit),
        _ => panic!("a fourth value was claimed over the limit"),
    }
    // Another payer's account is apart.
    let mut stranger = record(0x51);
    stranger.payer = Address::repeat_byte(0x77);
    assert!(matches!(
        a.claim(&stranger.key(), &stranger, None, &Limits::balance(value))
            .await
            .unwrap(),
        Claim::Claimed
    ));
    let mut answered = finished(signed(won[0].clone(), 7), 1);
    answered.state = State::Sent { nonce: 7 };
    answered.finished_at = None;
    a.save(&[&answered], true).await.unwrap();
    a.release(&won[1].key()).await.unwrap();
    let second = record(0x52);
    assert!(matches!(
        b.claim(&second.key(), &second, None, &Limits::balance(value * 2))
            .await
            .unwrap(),
        Claim::Claimed
    ));
    let third = record(0x53);
    assert!(matches!(
        b.claim(&third.key(), &third, None, &Limits::balance(value * 2))
            .await
            .unwrap(),
        Claim::OverLimit { .. }
    ));
}

/// A Permit2 record of `token`, told apart by `nonce`; `approves`: it carries an EIP-2612 permit.
fn permit2(nonce: u8, token: u8, approves: bool) -> Record {
    let mut r = record(nonce);
    r.method = crate::ledger::TransferMethod::Permit2;
    r.token = Address::repeat_byte(token);
    r.approves_permit2 = approves;
    r
}

/// Concurrent claims on both handles; answers the records claimed.
async fn claim_all(a: &Storage, b: &Storage, records: Vec<Record>, limits: Limits) -> Vec<Record> {
    let tasks: Vec<_> = records
        .into_iter()
        .enumerate()
        .map(|(i, candidate)| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let claim = store
                    .claim(&candidate.key(), &candidate, None, &limits)
                    .await;
                matches!(claim.unwrap(), Claim::Claimed).then_some(candidate)
            })
        })
        .collect();
    let mut won = Vec::new();
    for task in tasks {
        won.extend(task.await.unwrap());
    }
    won
}

/// A payer's Permit2 claims in flight keep to its Permit2 allowance (beside its balance), across
/// handles and concurrently; a Permit2 nonce is held across the owner's tokens until its record
/// is answered or released; an EIP-2612 approval is in flight alone among the account's Permit2
/// claims. ERC-3009 claims of the account are held to none of these.
async fn permit2_claims_keep_to_allowance_nonce_and_approval(a: &Storage, b: &Storage) {
    let value = record(0).value;
    let limits = Limits {
        balance: U256::MAX,
        permit2_allowance: value * 2,
    };
    let burst = (0..6).map(|i| permit2(0x70 + i, 0x11, false)).collect();
    let won = claim_all(a, b, burst, limits).await;
    assert_eq!(won.len(), 2, "two values fit the allowance");
    let late = permit2(0x76, 0x11, false);
    match b.claim(&late.key(), &late, None, &limits).await.unwrap() {
        Claim::OverAllowance { exposed } => assert_eq!(exposed, value * 2),
        other => panic!("a third Permit2 value over the allowance: {other:?}"),
    }
    let eip3009 = record(0x77);
    assert!(matches!(
        a.claim(&eip3009.key(), &eip3009, None, &limits)
            .await
            .unwrap(),
        Claim::Claimed
    ));
    // Another token, a nonce in flight: refused; concurrently, one of two wins.
    let same_nonce = permit2(won[0].nonce.0[0], 0x12, false);
    let claim = a.claim(&same_nonce.key(), &same_nonce, None, &limits).await;
    assert!(matches!(
        claim.unwrap(),
        Claim::Permit2Clash(Permit2Clash::Nonce)
    ));
    let twins = vec![permit2(0x78, 0x13, false), permit2(0x78, 0x14, false)];
    assert_eq!(
        claim_all(a, b, twins, limits).await.len(),
        1,
        "one nonce, one claim"
    );
    // Answered or released, the nonce is free again.
    let mut answered = finished(signed(won[0].clone(), 7), 1);
    answered.state = State::Sent { nonce: 7 };
    answered.finished_at = None;
    a.save(&[&answered], true).await.unwrap();
    b.release(&won[1].key()).await.unwrap();
    for nonce in [won[0].nonce.0[0], won[1].nonce.0[0]] {
        let freed = permit2(nonce, 0x12, false);
        let claim = b.claim(&freed.key(), &freed, None, &limits).await.unwrap();
        assert!(matches!(claim, Claim::Claimed), "{claim:?}");
    }
    // One EIP-2612 approval of an account at a time, and alone among its Permit2 claims.
    let approvals = (0..4).map(|i| permit2(0x80 + i, 0x15, true)).collect();
    let approving = claim_all(a, b, approvals, Limits::balance(U256::MAX)).await;

    assert_eq!(approving.len(), 1, "one approval in flight");
    let plain = permit2(0x84, 0x15, false);
    let unlimited = Limits::balance(U256::MAX);
    let claim = a.claim(&plain.key(), &plain, None, &unlimited).await;
    assert!(matches!(
        claim.unwrap(),
        Claim::Permit2Clash(Permit2Clash::Approval)
    ));
    a.release(&approving[0].key()).await.unwrap();
    assert!(matches!(
        b.claim(&plain.key(), &plain, None, &unlimited)
            .await
            .unwrap(),
        Claim::Claimed
    ));
    let approval = permit2(0x85, 0x15, true);
    let claim = b.claim(&approval.key(), &approval, None, &unlimited).await;
    assert!(matches!(
        claim.unwrap(),
        Claim::Permit2Clash(Permit2Clash::Approval)
    ));
}

/// A request key names one payment, across handles: another payment claimed under it is
/// refused until the first record is gone.
async fn a_request_key_names_one_payment(a: &Storage, b: &Storage) {
    let tagged = |nonce: u8| {
        let mut r = record(nonce);
        r.request = Some(RequestTag {
            key: "order-1".to_string(),
            body: H256::repeat_byte(nonce),
            kind: Default::default(),
        });
        r
    };
    let (first, second) = (tagged(0x60), tagged(0x61));
    let claim = |store: &Storage, r: &Record| {
        let (store, r) = (store.clone(), r.clone());
        async move {
            store
                .claim(&r.key(), &r, None, &Limits::balance(U256::MAX))
                .await
                .unwrap()
        }
    };
    assert!(matches!(claim(a, &first).await, Claim::Claimed));
    assert!(matches!(claim(b, &second).await, Claim::KeyTaken));
    assert!(matches!(claim(b, &first).await, Claim::Exists(_)));
    a.release(&first.key()).await.unwrap();
    assert!(matches!(claim(b, &second).await, Claim::Claimed));
}

/// A pass is taken once per grant, only by its own caller and body, also across handles; it
/// goes with its record.
async fn a_pass_is_taken_once(a: &Storage, b: &Storage) {
    let r = record(0x70);
    let key = r.key();
    let pass = |caller: &str, body: u8| Pass {
        caller: caller.to_string(),
        body: H256::repeat_byte(body),
    };
    a.claim(&key, &r, None, &Limits::balance(U256::MAX))
        .await
        .unwrap();
    assert!(
        !a.take_pass(&key, &pass("ip:1", 1)).await.unwrap(),
        "nothing granted"
    );
    a.grant_pass(&key, &pass("ip:1", 1)).await.unwrap();
    assert!(
        !b.take_pass(&key, &pass("ip:2", 1)).await.unwrap(),
        "another caller"
    );
    assert!(
        !b.take_pass(&key, &pass("ip:1", 2)).await.unwrap(),
        "another body"
    );
    let granted = pass("ip:1", 1);
    let (x, y) = tokio::join!(a.take_pass(&key, &granted), b.take_pass(&key, &granted));
    assert!(x.unwrap() ^ y.unwrap(), "one taker");
    assert!(!a.take_pass(&key, &pass("ip:1", 1)).await.unwrap(), "taken");
    // A new grant replaces the old one.
    a.grant_pass(&key, &pass("ip:1", 1)).await.unwrap();
    b.grant_pass(&key, &pass("ip:3", 3)).await.unwrap();
    assert!(!a.take_pass(&key, &pass("ip:1", 1)).await.unwrap());
    // Released with its record.
    a.release(&key).await.unwrap();
    a.claim(&key, &r, None, &Limits::balance(U256::MAX))
        .await
        .unwrap();
    assert!(
        !b.take_pass(&key, &pass("ip:3", 3)).await.unwrap(),
        "gone with the record"
    );
}

/// Records saved together: the one that ended leaves the unfinished index, the other stays.
async fn terminal_records_leave_unfinished_and_are_pruned(a: &Storage, b: &Storage) {
    let claimed = record(3);
    let key = claimed.key();
    let other = record(4);
    a.claim(&key, &claimed, None, &Limits::balance(U256::MAX))
        .await
        .unwrap();
    a.claim(&other.key(), &other, None, &Limits::balance(U256::MAX))
        .await
        .unwrap();
    a.save(
        &[&signed(claimed.clone(), 0), &signed(other.clone(), 1)],
        true,
    )
    .await
    .unwrap();
    assert_eq!(
        b.get(&key).await.unwrap().unwrap().state,
        State::Signed { nonce: 0 }
    );
    assert_eq!(
        b.get(&other.key()).await.unwrap().unwrap().state,
        State::Signed { nonce: 1 }
    );
    a.save(
        &[
            &finished(signed(claimed, 0), 1_000),
            &signed(other.clone(), 2),
        ],
        true,
    )
    .await
    .unwrap();
    let unfinished = b.unfinished().await.unwrap();
    assert!(!unfinished.iter().any(|r| r.key() == key));
    assert!(unfinished
        .iter()
        .any(|r| r.key() == other.key() && r.state == State::Signed { nonce: 2 }));
    assert_eq!(
        b.prune(1_000).await.unwrap(),
        0,
        "finished at the cutoff: kept"
    );
    assert!(b.get(&key).await.unwrap().unwrap().outcome.unwrap().success);
    assert_eq!(b.prune(1_001).await.unwrap(), 1);
    assert!(a.get(&key).await.unwrap().is_none());
}

async fn one_holder_per_lane_and_the_fence_stops_the_old_one(a: &Storage, b: &Storage) {
    let lane = lane();
    let first = a.acquire(&lane, "one", LONG).await.unwrap().unwrap();
    assert!(b.acquire(&lane, "two", LONG).await.unwrap().is_none());
    let renewed = a.acquire(&lane, "one", LONG).await.unwrap().unwrap();
    assert_eq!(renewed.fence, first.fence, "renewal keeps the fence");
    a.commit_signed(&first, 5, &[&signed(record(4), 4)])
        .await
        .unwrap();
    assert_eq!(b.lane_nonce(&lane).await.unwrap(), Some(5));
    // "one" stops renewing: a zero TTL is a lease that has already run out.
    a.acquire(&lane, "one", Duration::ZERO).await.unwrap();
    let second = b.acquire(&lane, "two", LONG).await.unwrap().unwrap();
    assert!(second.fence > first.fence);
    // The old holder wakes up and signs: nothing it writes is stored.
    let stale = signed(record(5), 5);
    match a.commit_signed(&first, 6, &[&stale]).await {
        Err(StoreError::LeaseLost(_)) => {}
        other => panic!("a stale lease wrote: {other:?}"),
    }
    assert!(matches!(
        a.set_lane_nonce(&first, 9).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert!(b.get(&stale.key()).await.unwrap().is_none());
    assert_eq!(b.lane_nonce(&lane).await.unwrap(), Some(5));
    b.commit_signed(&second, 6, &[&stale]).await.unwrap();
    assert_eq!(a.lane_nonce(&lane).await.unwrap(), Some(6));
    assert!(a.acquire(&lane, "one", LONG).await.unwrap().is_none());
    // A clean shutdown hands the lane over at once.
    b.surrender(&second).await.unwrap();
    let third = a.acquire(&lane, "one", LONG).await.unwrap().unwrap();
    assert!(third.fence > second.fence);
}

/// One sender's reservations on chain `c`, as one caller sees them.
fn router_key(sender: u8) -> RouterNonceKey {
    RouterNonceKey {
        chain: "c".to_string(),
        sender: Address::repeat_byte(sender),
        caller: "ip:127.0.0.1".to_string(),
    }
}

async fn router_nonces_are_consecutive_across_handles(a: &Storage, b: &Storage) {
    let reserve = |store: &Storage, sender: u8, pending: u64, now: u64| {
        let store = store.clone();
        async move {
            store
                .reserve_router_nonce(&router_key(sender), pending, now, 120, 32)
                .await
                .unwrap()
        }
    };
    assert_eq!(reserve(a, 1, 3, 10).await, Some(3));
    assert_eq!(reserve(b, 1, 3, 11).await, Some(4));
    assert_eq!(reserve(a, 1, 9, 12).await, Some(9));
    assert_eq!(reserve(b, 1, 3, 500).await, Some(3));
    assert_eq!(reserve(a, 2, 0, 500).await, Some(0));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(reserve(&store, 3, 100, 1000)));
    }
    let mut handed: Vec<u64> = Vec::new();
    for task in tasks {
        handed.extend(task.await.unwrap());
    }
    handed.sort_unstable();
    assert_eq!(handed, (100..120).collect::<Vec<_>>());
    // At most 32 ahead of the pending nonce: the 33rd is refused and nothing moves.
    for expected in 120..132 {
        assert_eq!(reserve(a, 3, 100, 1001).await, Some(expected));
    }
    assert_eq!(reserve(b, 3, 100, 1002).await, None);
    assert_eq!(reserve(a, 3, 101, 1003).await, Some(132));
}

/// Reservations handed out before the cutoff are deleted, from either handle, and the others
/// stand (access.md §3b: strangers naming new senders do not grow the store for good).
async fn expired_router_reservations_are_deleted(a: &Storage, b: &Storage) {
    let ttl = 120;
    let (old, fresh) = (router_key(0x21), router_key(0x22));
    assert_eq!(
        a.reserve_router_nonce(&old, 3, 100, ttl, 16).await.unwrap(),
        Some(3)
    );
    assert_eq!(
        b.reserve_router_nonce(&fresh, 3, 500, ttl, 16)
            .await
            .unwrap(),
        Some(3)
    );
    assert_eq!(b.prune_router_nonces(300).await.unwrap(), 1);
    assert_eq!(a.prune_router_nonces(300).await.unwrap(), 0, "deleted once");
    // The fresh one still counts: the next is consecutive.
    assert_eq!(
        a.reserve_router_nonce(&fresh, 3, 501, ttl, 16)
            .await
            .unwrap(),
        Some(4)
    );
}

/// PostgreSQL computes a reservation in SQL (one statement, so that concurrent ones queue on
/// the row), sled by `next_router_nonce` itself: both must hand out what that rule says, step
/// by step, at the edges of `ttl` and `max_ahead` included.
async fn router_nonces_follow_the_rule(a: &Storage, _b: &Storage) {
    let (ttl, max_ahead) = (120, 4);
    let steps = [
        (5, 100),
        (5, 101),
        (5, 102),
        (5, 103),
        (5, 104), // four ahead: refused, nothing stored
        (7, 105),
        (12, 106), // the chain moved past the reservations
        (3, 226),  // exactly `ttl` after the last: expired
        (3, 345),
        (3, 466),
    ];
    let mut previous = None;
    for (pending, now) in steps {
        let expected = next_router_nonce(previous, pending, now, ttl, max_ahead);
        let got = a
            .reserve_router_nonce(&router_key(9), pending, now, ttl, max_ahead)
            .await
            .unwrap();
        assert_eq!(got, expected, "pending {pending} at {now}");
        if let Some(last) = got {
            previous = Some((last, now));
        }
    }
}

/// A broadcast moves the caller's reservation to its nonce (by `confirmed_router_nonce`), seen
/// from the other handle, and leaves other callers' alone.
async fn a_broadcast_confirms_the_reservation(a: &Storage, b: &Storage) {
    let ttl = 120;
    let key = router_key(4);
    a.confirm_router_nonce(&key, 6, 100, ttl).await.unwrap();
    assert_eq!(
        b.reserve_router_nonce(&key, 6, 101, ttl, 16).await.unwrap(),
        Some(7)
    );
    // Reserved ahead (7, 8) and then 6 broadcast again: the reservations stand.
    assert_eq!(
        a.reserve_router_nonce(&key, 6, 102, ttl, 16).await.unwrap(),
        Some(8)
    );
    b.confirm_router_nonce(&key, 6, 103, ttl).await.unwrap();
    assert_eq!(
        a.reserve_router_nonce(&key, 6, 104, ttl, 16).await.unwrap(),
        Some(9)
    );
    // Long after: the broadcast nonce counts from its own time.
    b.confirm_router_nonce(&key, 7, 1000, ttl).await.unwrap();
    assert_eq!(
        a.reserve_router_nonce(&key, 7, 1001, ttl, 16)
            .await
            .unwrap(),
        Some(8)
    );
    let other = RouterNonceKey {
        caller: "key:other".to_string(),
        ..key
    };
    assert_eq!(
        b.reserve_router_nonce(&other, 7, 1002, ttl, 16)
            .await
            .unwrap(),
        Some(7)
    );
}

/// A forwarded transaction's chain is found by its hash from either handle, until forgotten.
async fn sent_transactions_are_found_until_forgotten(a: &Storage, b: &Storage) {
    let (old, new) = (H256::repeat_byte(1), H256::repeat_byte(2));
    let sent = |chain: &str, at| Sent {
        chain: chain.to_string(),
        at,
    };
    a.remember_sent(old, &sent("l1", 100)).await.unwrap();
    b.remember_sent(new, &sent("op", 200)).await.unwrap();
    assert_eq!(b.sent(old).await.unwrap(), Some(sent("l1", 100)));
    assert_eq!(a.sent(new).await.unwrap(), Some(sent("op", 200)));
    assert_eq!(a.sent(H256::repeat_byte(3)).await.unwrap(), None);
    // Sent again later: the later time is kept.
    b.remember_sent(old, &sent("l1", 150)).await.unwrap();
    assert_eq!(a.forget_sent(160).await.unwrap(), 1);
    assert_eq!(b.sent(old).await.unwrap(), None);
    assert_eq!(b.sent(new).await.unwrap(), Some(sent("op", 200)));
}

/// The sent transactions are bounded: beyond `keep`, the oldest are forgotten first, whichever
/// handle remembered them.
async fn sent_transactions_are_bounded_oldest_first(a: &Storage, b: &Storage) {
    let sent = |at| Sent {
        chain: "op".to_string(),
        at,
    };
    for i in 1..=5u8 {
        let handle = if i % 2 == 0 { a } else { b };
        handle
            .remember_sent(H256::repeat_byte(i), &sent(100 + u64::from(i)))
            .await
            .unwrap();
    }
    assert_eq!(a.forget_sent_beyond(5).await.unwrap(), 0);
    assert_eq!(b.forget_sent_beyond(3).await.unwrap(), 2);
    for i in 1..=2u8 {
        assert_eq!(a.sent(H256::repeat_byte(i)).await.unwrap(), None, "{i}");
    }
    for i in 3..=5u8 {
        let kept = b.sent(H256::repeat_byte(i)).await.unwrap();
        assert_eq!(kept, Some(sent(100 + u64::from(i))), "{i}");
    }
    assert_eq!(a.forget_sent_beyond(3).await.unwrap(), 0);
}

/// A cooldown stored through one handle refuses the payer on the other; a shorter one never
/// shortens it; ended ones are not answered and pruning deletes exactly those.
async fn cooldowns_are_shared_and_pruned(a: &Storage, b: &Storage) {
    let now = 1_000_000;
    let payer = Address::repeat_byte(0x51);
    let ended = Address::repeat_byte(0x52);
    assert_eq!(b.cooldown_of(payer, now).await.unwrap(), None);
    a.cool_down(PayerCooldown {
        payer,
        until: now + 60,
    })
    .await
    .unwrap();
    b.cool_down(PayerCooldown {
        payer,
        until: now + 30,
    })
    .await
    .unwrap();
    a.cool_down(PayerCooldown {
        payer: ended,
        until: now - 1,
    })
    .await
    .unwrap();
    assert_eq!(b.cooldown_of(payer, now).await.unwrap(), Some(now + 60));
    assert_eq!(a.cooldown_of(ended, now).await.unwrap(), None);
    assert_eq!(
        b.cooldowns(now).await.unwrap(),
        vec![PayerCooldown {
            payer,
            until: now + 60
        }]
    );
    assert_eq!(a.prune_cooldowns(now).await.unwrap(), 1);
    assert_eq!(b.prune_cooldowns(now).await.unwrap(), 0);
    assert_eq!(
        b.cooldown_of(payer, now + 59).await.unwrap(),
        Some(now + 60)
    );
    assert_eq!(b.cooldown_of(payer, now + 60).await.unwrap(), None);
    assert_eq!(a.prune_cooldowns(now + 60).await.unwrap(), 1);
    assert!(b.cooldowns(0).await.unwrap().is_empty());
}

fn listing(id: &str, settled_at: u64) -> Listing {
    Listing {
        id: id.to_string(),
        settled_at,
        encoded: format!("{{\"id\":\"{id}\",\"at\":{settled_at}}}"),
    }
}

async fn listed(store: &Storage, since: u64) -> Vec<Listing> {
    let mut seen = Vec::new();
    store.listings(since, &mut |l| seen.push(l)).await.unwrap();
    seen
}

/// The catalogue through two handles: one listing per id (a later settle replaces it), read
/// newest first (ties by id), never more than the cap (the least recently settled goes), and
/// expired by settle time.
async fn the_catalogue_is_bounded_ordered_and_expires(a: &Storage, b: &Storage) {
    a.list(&listing("b", 100), 3).await.unwrap();
    b.list(&listing("a", 100), 3).await.unwrap();
    a.list(&listing("c", 90), 3).await.unwrap();
    let ids = |l: Vec<Listing>| l.into_iter().map(|l| l.id).collect::<Vec<_>>();
    assert_eq!(ids(listed(b, 0).await), ["a", "b", "c"]);
    // Settled again: replaced, and now the newest.
    b.list(&listing("c", 120), 3).await.unwrap();
    assert_eq!(listed(a, 0).await[0], listing("c", 120));
    assert_eq!(ids(listed(a, 0).await), ["c", "a", "b"]);
    // Over the cap: the least recently settled (ties: the last by id) is evicted.
    a.list(&listing("d", 110), 3).await.unwrap();
    assert_eq!(ids(listed(b, 0).await), ["c", "d", "a"]);
    assert_eq!(ids(listed(b, 110).await), ["c", "d"]);
    assert_eq!(b.unlist_before(111).await.unwrap(), 2);
    assert_eq!(a.unlist_before(111).await.unwrap(), 0);
    assert_eq!(ids(listed(a, 0).await), ["c"]);
}

fn other_lane() -> LaneId {
    LaneId {
        network: "net".to_string(),
        signer: Address::repeat_byte(8),
    }
}

/// Shared stores only (sled has one instance, which signs what it claims).
async fn the_work_queue_hands_each_claim_to_one_lane_and_a_takeover_inherits(
    a: &Storage,
    b: &Storage,
) {
    let one = a.acquire(&lane(), "one", LONG).await.unwrap().unwrap();
    let two = b
        .acquire(&other_lane(), "two", LONG)
        .await
        .unwrap()
        .unwrap();
    // A free claim: exactly one of two lanes polling together takes it.
    let free = record(10);
    a.claim(&free.key(), &free, None, &Limits::balance(U256::MAX))
        .await
        .unwrap();
    let (by_one, by_two) = tokio::join!(a.take_queued(&one, 10), b.take_queued(&two, 10));
    let (by_one, by_two) = (by_one.unwrap(), by_two.unwrap());
    assert_eq!(by_one.len() + by_two.len(), 1, "{by_one:?} {by_two:?}");
    assert!(a.take_queued(&one, 10).await.unwrap().is_empty());
    assert!(b.take_queued(&two, 10).await.unwrap().is_empty());
    // A claim taken by its claimer's lane stays with it...
    let mine = record(11);
    a.claim(&mine.key(), &mine, Some(&one), &Limits::balance(U256::MAX))
        .await
        .unwrap();
    assert!(b.take_queued(&two, 10).await.unwrap().is_empty());
    assert!(a.take_queued(&one, 10).await.unwrap().is_empty());
    // ...until the lane changes hands: the next holder inherits it.
    a.acquire(&lane(), "one", Duration::ZERO).await.unwrap();
    let three = b.acquire(&lane(), "three", LONG).await.unwrap().unwrap();
    let inherited = b.take_queued(&three, 10).await.unwrap();
    assert!(
        inherited.iter().any(|r| r.key() == mine.key()),
        "{inherited:?}"
    );
    // The old holder can take nothing more.
    let late = record(12);
    a.claim(&late.key(), &late, None, &Limits::balance(U256::MAX))
        .await
        .unwrap();
    assert!(a.take_queued(&one, 10).await.unwrap().is_empty());
    // Given back, it is free again; once signed, it leaves the queue.
    b.requeue(&[late.key()]).await.unwrap();
    let taken = b.take_queued(&two, 10).await.unwrap();
    assert!(taken.iter().any(|r| r.key() == late.key()));
    b.commit_signed(&two, 1, &[&signed(late.clone(), 0)])
        .await
        .unwrap();
    b.requeue(&[late.key()]).await.unwrap();
    assert!(b.take_queued(&three, 10).await.unwrap().is_empty());
    // A released claim leaves the queue with its record.
    let dropped = record(13);
    a.claim(&dropped.key(), &dropped, None, &Limits::balance(U256::MAX))
        .await
        .unwrap();
    a.release(&dropped.key()).await.unwrap();
    assert!(b.take_queued(&three, 10).await.unwrap().is_empty());
}

/// Shared stores only: a claim that names its signer (an `upto` witness's facilitator) is
/// taken by that signer's lane alone: queued free, given back after a lost lease, or left
/// by a lane that changed hands.
async fn a_claim_naming_its_signer_goes_to_that_signers_lane_only(a: &Storage, b: &Storage) {
    let named = b
        .acquire(&other_lane(), "two", LONG)
        .await
        .unwrap()
        .unwrap();
    let other = a.acquire(&lane(), "one", LONG).await.unwrap().unwrap();
    let mut upto = record(20);
    upto.sender = Some(other_lane().signer);
    a.claim(&upto.key(), &upto, None, &Limits::balance(U256::MAX))
        .await
        .unwrap();
    assert!(a.take_queued(&other, 10).await.unwrap().is_empty());
    let taken = b.take_queued(&named, 10).await.unwrap();
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(
        taken[0].sender,
        Some(other_lane().signer),
        "the record keeps its signer"
    );
    // Given back (its lane lost the lease): still only that signer's.
    b.requeue(&[upto.key()]).await.unwrap();
    assert!(a.take_queued(&other, 10).await.unwrap().is_empty());
    // Taken again by the named lane, which then changes hands: its next holder inherits it.
    assert_eq!(b.take_queued(&named, 10).await.unwrap().len(), 1);
    b.acquire(&other_lane(), "two", Duration::ZERO)
        .await
        .unwrap();
    let next = a
        .acquire(&other_lane(), "three", LONG)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.take_queued(&next, 10).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a server: scripts/test-postgres runs it"]
async fn postgres_work_queue() {
    let (a, b) = open_postgres("queue").await;
    the_work_queue_hands_each_claim_to_one_lane_and_a_takeover_inherits(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a server: scripts/test-postgres runs it"]
async fn postgres_work_queue_named_signer() {
    let (a, b) = open_postgres("queue_named").await;
    a_claim_naming_its_signer_goes_to_that_signers_lane_only(&a, &b).await;
}

/// Every case, each on a fresh store from `open` (called twice per store: two handles).
macro_rules! conformance {
    ($module:ident, $open:path $(, $attr:meta)?) => {
        mod $module {
            use super::*;

            async fn run<F, Fut>(name: &str, case: F)
            where
                F: FnOnce(Storage, Storage) -> Fut,
                Fut: std::future::Future<Output = ()>,
            {
                let (a, b) = $open(name).await;
                case(a, b).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn claims_once_and_releases() {
                run("claims", |a, b| async move { super::claims_once_and_releases(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_solana_settlement_is_claimed_once_and_read_back_whole() {
                run("solana", |a, b| async move { super::a_solana_settlement_is_claimed_once_and_read_back_whole(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_claims_have_one_winner() {
                run("concurrent", |a, b| async move { super::concurrent_claims_have_one_winner(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn terminal_records_leave_unfinished_and_are_pruned() {
                run("terminal", |a, b| async move { super::terminal_records_leave_unfinished_and_are_pruned(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn one_holder_per_lane_and_the_fence_stops_the_old_one() {
                run("leases", |a, b| async move { super::one_holder_per_lane_and_the_fence_stops_the_old_one(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_request_key_names_one_payment() {
                run("request_keys", |a, b| async move { super::a_request_key_names_one_payment(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_pass_is_taken_once() {
                run("passes", |a, b| async move { super::a_pass_is_taken_once(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn permit2_claims_keep_to_allowance_nonce_and_approval() {
                run("permit2_claims", |a, b| async move { super::permit2_claims_keep_to_allowance_nonce_and_approval(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn exposure_adds_up_per_account() {
                run("exposure", |a, b| async move { super::exposure_adds_up_per_account(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cooldowns_are_shared_and_pruned() {
                run("cooldowns", |a, b| async move { super::cooldowns_are_shared_and_pruned(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn expired_router_reservations_are_deleted() {
                run("router_prune", |a, b| async move { super::expired_router_reservations_are_deleted(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_catalogue_is_bounded_ordered_and_expires() {
                run("catalogue", |a, b| async move { super::the_catalogue_is_bounded_ordered_and_expires(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn router_nonces_follow_the_rule() {
                run("router_rule", |a, b| async move { super::router_nonces_follow_the_rule(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_broadcast_confirms_the_reservation() {
                run("router_confirm", |a, b| async move { super::a_broadcast_confirms_the_reservation(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sent_transactions_are_found_until_forgotten() {
                run("router_sent", |a, b| async move { super::sent_transactions_are_found_until_forgotten(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sent_transactions_are_bounded_oldest_first() {
                run("router_sent_bound", |a, b| async move { super::sent_transactions_are_bounded_oldest_first(&a, &b).await }).await;
            }

            $(#[$attr])?
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn router_nonces_are_consecutive_across_handles() {
                run("router", |a, b| async move { super::router_nonces_are_consecutive_across_handles(&a, &b).await }).await;
            }
        }
    };
}

/// sled allows one process per directory: both handles are the same store.
async fn open_sled(name: &str) -> (Storage, Storage) {
    let dir = crate::testing::temp_dir(&format!("conformance-{name}"));
    let store: Storage = Arc::new(super::sled_v1::open(&dir).await.unwrap());
    (store.clone(), store)
}

/// A fresh database per case on the server `ROUTERD_TEST_POSTGRES_URL` names, and two
/// connection pools to it.
async fn open_postgres(name: &str) -> (Storage, Storage) {
    let url = fresh_database(&format!("routerd_conformance_{name}")).await;
    let a: Storage = Arc::new(super::postgres::PgStore::connect(&url).await.unwrap());
    let b: Storage = Arc::new(super::postgres::PgStore::connect(&url).await.unwrap());
    (a, b)
}

/// An empty database named `database` on the server `ROUTERD_TEST_POSTGRES_URL` names; its URL.
pub(super) async fn fresh_database(database: &str) -> String {
    let admin_url = std::env::var("ROUTERD_TEST_POSTGRES_URL")
        .expect("ROUTERD_TEST_POSTGRES_URL: scripts/test-postgres sets it");
    let (admin, connection) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
        .await
        .expect("connecting to the test server");
    tokio::spawn(connection);
    // CREATE DATABASE copies template1, which must not be in use: one at a time.
    static CREATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let creating = CREATING.lock().await;
    for statement in [
        format!("DROP DATABASE IF EXISTS {database}"),
        format!("CREATE DATABASE {database}"),
    ] {
        admin.batch_execute(&statement).await.unwrap();
    }
    drop(creating);
    let mut config: tokio_postgres::Config = admin_url.parse().unwrap();
    config.dbname(database);
    postgres_url(&config)
}

/// The URL of `config` (host, port, user, database: the test cluster trusts local users).
fn postgres_url(config: &tokio_postgres::Config) -> String {
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
    };
    format!(
        "postgres://{}@{}:{}/{}",
        config.get_user().unwrap_or("postgres"),
        host,
        config.get_ports().first().copied().unwrap_or(5432),
        config.get_dbname().unwrap_or("postgres")
    )
}

conformance!(sled_backend, open_sled);
conformance!(
    postgres_backend,
    open_postgres,
    ignore = "needs a server: scripts/test-postgres runs it"
);
