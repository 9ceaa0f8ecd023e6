//! Claims: one winner across handles, Solana records read back whole, the exposure and Permit2
//! bounds of a claim, request keys, passes, and the end of a record.

use super::*;

pub(super) async fn claims_once_and_releases(a: &Storage, b: &Storage) {
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
pub(super) async fn a_solana_settlement_is_claimed_once_and_read_back_whole(
    a: &Storage,
    b: &Storage,
) {
    let claim = crate::testing::svm_record("solana-devnet", 0x5a);
    let key = PaymentKey::svm("solana-devnet", [0x5a; 32]);
    assert_eq!(claim.key(), key);
    let limits = Limits::balance(U256::MAX);
    assert!(matches!(
        a.claim(&key, &claim, None, &limits).await.unwrap(),
        Claim::Claimed
    ));
    a.save(&[&claim], true).await.unwrap();
    match b.claim(&key, &claim, None, &limits).await.unwrap() {
        Claim::Exists(stored) => assert_eq!(settlement(&stored), settlement(&claim)),
        other => panic!("a Solana payment was claimed twice: {other:?}"),
    }
    let unfinished = b.unfinished().await.unwrap();
    let stored = unfinished.iter().find(|r| r.key() == key).unwrap();
    assert_eq!(
        settlement(stored),
        settlement(&claim),
        "the signed transaction is stored"
    );
    // Verify reads the same exposure without claiming.
    assert_eq!(b.exposed(&claim.account()).await.unwrap(), U256::from(1000));
    // The same source's next payment counts this one in flight (access.md §2).
    let next = crate::testing::svm_record("solana-devnet", 0x5b);
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
    assert_eq!(settlement(&read), settlement(&ended));
    assert!(!a.unfinished().await.unwrap().iter().any(|r| r.key() == key));
    assert_eq!(a.exposed(&claim.account()).await.unwrap(), U256::zero());
    assert!(matches!(
        b.claim(&next_key, &next, None, &within).await.unwrap(),
        Claim::Claimed
    ));
}

/// Two token accounts of one mint sharing their first 20 bytes are two accounts: one's
/// settlement in flight does not count against the other's balance (access.md §2).
pub(super) async fn two_solana_sources_sharing_20_bytes_are_exposed_apart(
    a: &Storage,
    b: &Storage,
) {
    let source =
        |last| Pubkey::new_from_array(std::array::from_fn(|i| if i < 20 { 0x22 } else { last }));
    let first = crate::testing::svm_record_from("solana-devnet", 0x61, source(1));
    let second = crate::testing::svm_record_from("solana-devnet", 0x62, source(2));
    assert_ne!(first.account(), second.account());
    let within = Limits::balance(U256::from(1500));
    assert!(matches!(
        a.claim(&first.key(), &first, None, &within).await.unwrap(),
        Claim::Claimed
    ));
    assert_eq!(b.exposed(&first.account()).await.unwrap(), U256::from(1000));
    assert_eq!(b.exposed(&second.account()).await.unwrap(), U256::zero());
    match b
        .claim(&second.key(), &second, None, &within)
        .await
        .unwrap()
    {
        Claim::Claimed => {}
        other => panic!("another source's settlement was counted: {other:?}"),
    }
    assert_eq!(
        a.exposed(&second.account()).await.unwrap(),
        U256::from(1000)
    );
    assert_eq!(a.exposed(&first.account()).await.unwrap(), U256::from(1000));
}

/// A Solana record the landed Solana release stored reads back unchanged, counts under the
/// account that release indexed it by and against the account in full it may spend, and once it
/// ends stops counting: its index entry is removed under the key it was written with.
pub(super) async fn a_landed_solana_record_is_exposed_and_ended_under_its_key(
    a: &Storage,
    b: &Storage,
) {
    let landed = crate::testing::landed_solana_record(0x63);
    let claim: Record = serde_json::from_value(landed.clone()).unwrap();
    let key = PaymentKey::svm("solana-devnet", [0x63; 32]);
    let account = claim.account();
    assert_eq!(
        account.storage_key(),
        format!("solana-devnet|0x{}|0x{}", "11".repeat(20), "22".repeat(20))
    );
    let limits = Limits::balance(U256::MAX);
    assert!(matches!(
        a.claim(&key, &claim, None, &limits).await.unwrap(),
        Claim::Claimed
    ));
    let read = b.get(&key).await.unwrap().unwrap();
    assert_eq!(
        serde_json::to_value(&read).unwrap(),
        landed,
        "read back unchanged"
    );
    assert_eq!(read.account(), account);
    assert_eq!(b.exposed(&account).await.unwrap(), U256::from(1000));
    // It may still spend the token account it was keyed by: a new claim from that account
    // counts it; one from another account sharing none of its bytes does not.
    let next = crate::testing::svm_record("solana-devnet", 0x64);
    assert_ne!(next.account(), account);
    assert_eq!(a.exposed(&next.account()).await.unwrap(), U256::from(1000));
    let within = Limits::balance(U256::from(1500));
    match b.claim(&next.key(), &next, None, &within).await.unwrap() {
        Claim::OverLimit { exposed } => assert_eq!(exposed, U256::from(1000)),
        other => panic!("the landed record was not counted: {other:?}"),
    }
    let stranger = crate::testing::svm_record_from("solana-devnet", 0x65, Pubkey::new_unique());
    assert_eq!(a.exposed(&stranger.account()).await.unwrap(), U256::zero());
    let mut ended = read;
    ended.landed(42, None, 9);
    b.save(&[&ended], true).await.unwrap();
    assert_eq!(a.exposed(&account).await.unwrap(), U256::zero());
    assert_eq!(b.exposed(&next.account()).await.unwrap(), U256::zero());
    assert!(!a.unfinished().await.unwrap().iter().any(|r| r.key() == key));
    assert!(matches!(
        b.claim(&next.key(), &next, None, &within).await.unwrap(),
        Claim::Claimed
    ));
}

pub(super) async fn concurrent_claims_have_one_winner(a: &Storage, b: &Storage) {
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
pub(super) async fn exposure_adds_up_per_account(a: &Storage, b: &Storage) {
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
    stranger.evm_mut().unwrap().payer = Address::repeat_byte(0x77);
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

/// A Solana record's signed transaction.
fn settlement(record: &Record) -> Option<&crate::ledger::SvmSettlement> {
    record.svm().map(|part| &part.settlement)
}

/// A Permit2 record of `token`, told apart by `nonce`; `approves`: it carries an EIP-2612 permit.
fn permit2(nonce: u8, token: u8, approves: bool) -> Record {
    let mut r = record(nonce);
    r.evm_mut().unwrap().method = crate::ledger::TransferMethod::Permit2;
    r.evm_mut().unwrap().token = Address::repeat_byte(token);
    r.evm_mut().unwrap().approves_permit2 = approves;
    r
}

/// Concurrent claims on both handles; answers the records claimed.
pub(super) async fn claim_all(
    a: &Storage,
    b: &Storage,
    records: Vec<Record>,
    limits: Limits,
) -> Vec<Record> {
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
pub(super) async fn permit2_claims_keep_to_allowance_nonce_and_approval(a: &Storage, b: &Storage) {
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
    let same_nonce = permit2(won[0].evm().unwrap().nonce.0[0], 0x12, false);
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
    for nonce in [&won[0], &won[1]].map(|r| r.evm().unwrap().nonce.0[0]) {
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
pub(super) async fn a_request_key_names_one_payment(a: &Storage, b: &Storage) {
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
pub(super) async fn a_pass_is_taken_once(a: &Storage, b: &Storage) {
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
pub(super) async fn terminal_records_leave_unfinished_and_are_pruned(a: &Storage, b: &Storage) {
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
