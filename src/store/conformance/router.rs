//! The router's nonce reservations and the sent transactions it remembers.

use super::*;

/// One sender's reservations on chain `c`, as one caller sees them.
fn router_key(sender: u8) -> RouterNonceKey {
    RouterNonceKey {
        chain: "c".to_string(),
        sender: Address::repeat_byte(sender),
        caller: "ip:127.0.0.1".to_string(),
    }
}

pub(super) async fn router_nonces_are_consecutive_across_handles(a: &Storage, b: &Storage) {
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
pub(super) async fn expired_router_reservations_are_deleted(a: &Storage, b: &Storage) {
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
pub(super) async fn router_nonces_follow_the_rule(a: &Storage, _b: &Storage) {
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
pub(super) async fn a_broadcast_confirms_the_reservation(a: &Storage, b: &Storage) {
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
pub(super) async fn sent_transactions_are_found_until_forgotten(a: &Storage, b: &Storage) {
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
pub(super) async fn sent_transactions_are_bounded_oldest_first(a: &Storage, b: &Storage) {
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
