//! What every instance shares besides claims: payer cooldowns, the discovery catalogue and the
//! batch-settlement channel mirror.

use super::*;

/// `payer` cooled down until `until` through `store`.
async fn cool(store: &Storage, payer: Payer, until: u64) {
    store
        .cool_down(PayerCooldown { payer, until })
        .await
        .unwrap();
}

/// A cooldown stored through one handle refuses the payer on the other; a shorter one never
/// shortens it; ended ones are not answered and pruning deletes exactly those.
pub(super) async fn cooldowns_are_shared_and_pruned(a: &Storage, b: &Storage) {
    let now = 1_000_000;
    let payer = Payer::Evm(Address::repeat_byte(0x51));
    let ended = Payer::Evm(Address::repeat_byte(0x52));
    assert_eq!(b.cooldown_of(&payer, now).await.unwrap(), None);
    cool(a, payer, now + 60).await;
    cool(b, payer, now + 30).await;
    cool(a, ended, now - 1).await;
    assert_eq!(b.cooldown_of(&payer, now).await.unwrap(), Some(now + 60));
    assert_eq!(a.cooldown_of(&ended, now).await.unwrap(), None);
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
        b.cooldown_of(&payer, now + 59).await.unwrap(),
        Some(now + 60)
    );
    assert_eq!(b.cooldown_of(&payer, now + 60).await.unwrap(), None);
    assert_eq!(a.prune_cooldowns(now + 60).await.unwrap(), 1);
    assert!(b.cooldowns(0).await.unwrap().is_empty());
}

/// A Solana key sharing its first 20 bytes with `shared_prefix(_)`'s others.
fn shared_prefix(last: u8) -> Pubkey {
    Pubkey::new_from_array(std::array::from_fn(|i| if i < 20 { 0x53 } else { last }))
}

/// A Solana payer's cooldown is kept and listed under its whole key: another key sharing its
/// first 20 bytes is refused apart, and nothing is kept under the 20 bytes.
pub(super) async fn a_solana_cooldown_is_kept_under_its_whole_key(a: &Storage, b: &Storage) {
    let now = 1_000_000;
    let (payer, neighbour) = (Payer::Svm(shared_prefix(1)), Payer::Svm(shared_prefix(2)));
    cool(a, payer, now + 60).await;
    cool(b, neighbour, now + 30).await;
    assert_eq!(b.cooldown_of(&payer, now).await.unwrap(), Some(now + 60));
    assert_eq!(
        a.cooldown_of(&neighbour, now).await.unwrap(),
        Some(now + 30)
    );
    let truncated = payer.earlier_cooldown().unwrap();
    assert_eq!(b.cooldown_of(&truncated, now).await.unwrap(), None);
    let mut listed = a.cooldowns(now).await.unwrap();
    listed.sort_by_key(|c| c.until);
    let expected = [(neighbour, now + 30), (payer, now + 60)]
        .map(|(payer, until)| PayerCooldown { payer, until });
    assert_eq!(listed, expected);
    assert_eq!(b.prune_cooldowns(now + 30).await.unwrap(), 1);
    assert_eq!(a.cooldown_of(&neighbour, now).await.unwrap(), None);
    assert_eq!(a.cooldown_of(&payer, now).await.unwrap(), Some(now + 60));
}

/// A cooldown the landed Solana release stored for a Solana payer, under its key's first 20
/// bytes (the layout of an address), is found where `Payer::earlier_cooldown` looks, and listed
/// so that every instance loads it.
pub(super) async fn a_solana_cooldown_in_the_earlier_layout_is_found(a: &Storage, b: &Storage) {
    let now = 1_000_000;
    let key = shared_prefix(1);
    let landed = Payer::Evm(Address::from_slice(&key.to_bytes()[..20]));
    cool(a, landed, now + 60).await;
    let earlier = Payer::Svm(key).earlier_cooldown().unwrap();
    assert_eq!(b.cooldown_of(&earlier, now).await.unwrap(), Some(now + 60));
    assert_eq!(b.cooldown_of(&Payer::Svm(key), now).await.unwrap(), None);
    assert_eq!(
        b.cooldowns(now).await.unwrap(),
        vec![PayerCooldown {
            payer: earlier,
            until: now + 60
        }]
    );
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
pub(super) async fn the_catalogue_is_bounded_ordered_and_expires(a: &Storage, b: &Storage) {
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

fn channel_key(network: &str, byte: u8) -> ChannelKey {
    ChannelKey {
        network: network.to_string(),
        channel: H256::repeat_byte(byte),
    }
}

fn snapshot(balance: u128, total_claimed: u128, refund_nonce: u64, at: u64) -> ChannelSnapshot {
    ChannelSnapshot {
        balance,
        total_claimed,
        withdraw_requested_at: at / 2,
        refund_nonce: U256::from(refund_nonce),
        at,
    }
}

/// The mirror through two handles: a write never lowers totalClaimed or refundNonce (a stale
/// read), balance and withdrawal come from the newer write, and channels of one id on two
/// networks are two entries.
pub(super) async fn the_channel_mirror_never_lowers_what_only_grows(a: &Storage, b: &Storage) {
    let key = channel_key("base", 0x61);
    assert_eq!(b.channel(&key).await.unwrap(), None);
    let first = snapshot(1000, 300, 2, 100);
    assert_eq!(a.put_channel(&key, &first).await.unwrap(), first);
    assert_eq!(b.channel(&key).await.unwrap(), Some(first));
    // A lagging node's older state, written later: what only grows stays.
    let stale = snapshot(900, 100, 1, 110);
    let merged = ChannelSnapshot {
        total_claimed: 300,
        refund_nonce: U256::from(2),
        ..stale
    };
    assert_eq!(b.put_channel(&key, &stale).await.unwrap(), merged);
    assert_eq!(a.channel(&key).await.unwrap(), Some(merged));
    // An older write keeps the newer balance, yet raises what only grows.
    let late = snapshot(5, 400, 7, 50);
    let raised = ChannelSnapshot {
        total_claimed: 400,
        refund_nonce: U256::from(7),
        ..merged
    };
    assert_eq!(a.put_channel(&key, &late).await.unwrap(), raised);
    assert_eq!(b.channel(&key).await.unwrap(), Some(raised));
    // Full-width amounts are stored whole.
    let wide = ChannelSnapshot {
        balance: u128::MAX,
        total_claimed: u128::MAX,
        withdraw_requested_at: 1,
        refund_nonce: U256::MAX,
        at: 200,
    };
    let other = channel_key("base-sepolia", 0x61);
    a.put_channel(&other, &wide).await.unwrap();
    assert_eq!(b.channel(&other).await.unwrap(), Some(wide));
    assert_eq!(b.channel(&key).await.unwrap(), Some(raised));
}

/// Two writers of one channel at once, each raising totalClaimed: the highest of all stays,
/// whatever the interleaving.
pub(super) async fn two_writers_of_a_channel_keep_the_highest_claim(a: &Storage, b: &Storage) {
    let key = channel_key("base", 0x62);
    let write = |store: Storage, from: u128| {
        let key = key.clone();
        tokio::spawn(async move {
            for claimed in (from..200).step_by(2) {
                let at = 1000 + (claimed as u64 % 7);
                let put = snapshot(500, claimed, claimed as u64, at);
                store.put_channel(&key, &put).await.unwrap();
            }
        })
    };
    let (one, two) = (write(a.clone(), 0), write(b.clone(), 1));
    one.await.unwrap();
    two.await.unwrap();
    let stored = a.channel(&key).await.unwrap().unwrap();
    assert_eq!(stored.total_claimed, 199);
    assert_eq!(stored.refund_nonce, U256::from(199));
    assert_eq!(stored.at, 1006);
    assert_eq!(b.channel(&key).await.unwrap(), Some(stored));
}

/// A channel's refund has one holder across handles: another is refused until the hold is
/// released or runs out; the holder extends its own; channels and networks are held apart.
pub(super) async fn one_refund_holder_per_channel(a: &Storage, b: &Storage) {
    let key = channel_key("base", 0x63);
    assert!(a.hold_refund(&key, "one", LONG).await.unwrap());
    assert!(!b.hold_refund(&key, "two", LONG).await.unwrap());
    assert!(
        a.hold_refund(&key, "one", LONG).await.unwrap(),
        "its own hold"
    );
    assert!(b
        .hold_refund(&channel_key("base", 0x64), "two", LONG)
        .await
        .unwrap());
    assert!(b
        .hold_refund(&channel_key("base-sepolia", 0x63), "two", LONG)
        .await
        .unwrap());
    // Another holder's release lets nothing go.
    b.release_refund(&key, "two").await.unwrap();
    assert!(!b.hold_refund(&key, "two", LONG).await.unwrap());
    a.release_refund(&key, "one").await.unwrap();
    assert!(b
        .hold_refund(&key, "two", Duration::from_millis(300))
        .await
        .unwrap());
    assert!(!a.hold_refund(&key, "one", LONG).await.unwrap());
    // A holder that stopped (a process that died) holds no longer than it asked.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        a.hold_refund(&key, "one", LONG).await.unwrap(),
        "the hold ran out"
    );
    assert!(!b.hold_refund(&key, "two", LONG).await.unwrap());
}
