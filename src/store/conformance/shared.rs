//! What every instance shares besides claims: payer cooldowns and the discovery catalogue.

use super::*;

/// A cooldown stored through one handle refuses the payer on the other; a shorter one never
/// shortens it; ended ones are not answered and pruning deletes exactly those.
pub(super) async fn cooldowns_are_shared_and_pruned(a: &Storage, b: &Storage) {
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
