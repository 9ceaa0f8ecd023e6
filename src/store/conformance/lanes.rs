//! Lanes: one lease holder, the fence, and the work queue handing each claim to one lane.

use super::*;

pub(super) async fn one_holder_per_lane_and_the_fence_stops_the_old_one(a: &Storage, b: &Storage) {
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

fn other_lane() -> LaneId {
    LaneId {
        network: "net".to_string(),
        signer: Address::repeat_byte(8),
    }
}

/// Shared stores only (sled has one instance, which signs what it claims).
pub(super) async fn the_work_queue_hands_each_claim_to_one_lane_and_a_takeover_inherits(
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
pub(super) async fn a_claim_naming_its_signer_goes_to_that_signers_lane_only(
    a: &Storage,
    b: &Storage,
) {
    let named = b
        .acquire(&other_lane(), "two", LONG)
        .await
        .unwrap()
        .unwrap();
    let other = a.acquire(&lane(), "one", LONG).await.unwrap().unwrap();
    let mut upto = record(20);
    upto.evm_mut().unwrap().sender = Some(other_lane().signer);
    a.claim(&upto.key(), &upto, None, &Limits::balance(U256::MAX))
        .await
        .unwrap();
    assert!(a.take_queued(&other, 10).await.unwrap().is_empty());
    let taken = b.take_queued(&named, 10).await.unwrap();
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(
        taken[0].evm().unwrap().sender,
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
