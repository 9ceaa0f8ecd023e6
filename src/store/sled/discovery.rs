//! sled's discovery catalogue: listings by id, and their time index, changed together.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::Store;
use crate::store::rows;
use crate::store::{DiscoveryStore, Listing, StoreError};

/// A listing as the `listings` tree holds it.
#[derive(Serialize, Deserialize)]
struct ListingRow {
    settled_at: u64,
    encoded: String,
}

fn listing_time_key(settled_at: u64, id: &str) -> Vec<u8> {
    let mut key = settled_at.to_be_bytes().to_vec();
    key.extend_from_slice(id.as_bytes());
    key
}

fn decode_listing(id: &[u8], bytes: &[u8]) -> Result<Listing, StoreError> {
    let id = String::from_utf8_lossy(id).to_string();
    let row: ListingRow = serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        key: format!("listings/{id}"),
        detail: e.to_string(),
    })?;
    Ok(Listing {
        id,
        settled_at: row.settled_at,
        encoded: row.encoded,
    })
}

impl Store {
    /// Deletes one listing and its time index entry; the caller holds the `listing` lock.
    fn unlist(&self, id: &[u8]) -> Result<(), StoreError> {
        if let Some(old) = self.listings.remove(id)? {
            let old = decode_listing(id, &old)?;
            let time_key = listing_time_key(old.settled_at, &old.id);
            self.listings_by_time.remove(time_key)?;
        }
        Ok(())
    }
}

#[async_trait]
impl DiscoveryStore for Store {
    async fn list(&self, listing: &Listing, max_listings: usize) -> Result<(), StoreError> {
        let _one_writer = self.listing.lock().unwrap_or_else(|e| e.into_inner());
        self.unlist(listing.id.as_bytes())?;
        let row = ListingRow {
            settled_at: listing.settled_at,
            encoded: listing.encoded.clone(),
        };
        self.listings
            .insert(listing.id.as_bytes(), rows::encode(&row))?;
        self.listings_by_time
            .insert(listing_time_key(listing.settled_at, &listing.id), &[])?;
        // The last in read order goes first: the oldest second, and in it the last id.
        while self.listings_by_time.len() > max_listings {
            let Some((oldest, _)) = self.listings_by_time.first()? else {
                break;
            };
            let last = self.listings_by_time.scan_prefix(&oldest[..8]).next_back();
            let Some((last, _)) = last.transpose()? else {
                break;
            };
            self.unlist(&last[8..])?;
        }
        Ok(())
    }

    async fn listings(
        &self,
        since: u64,
        visit: &mut (dyn FnMut(Listing) + Send),
    ) -> Result<(), StoreError> {
        // Newest first: the time index backwards. Ties (one second) are ordered by id.
        let mut second: Vec<Listing> = Vec::new();
        for entry in self.listings_by_time.range(since.to_be_bytes()..).rev() {
            let (key, _) = entry?;
            let Some(bytes) = self.listings.get(&key[8..])? else {
                continue;
            };
            let listing = decode_listing(&key[8..], &bytes)?;
            if second
                .first()
                .is_some_and(|l| l.settled_at != listing.settled_at)
            {
                second.drain(..).rev().for_each(&mut *visit);
            }
            second.push(listing);
        }
        second.drain(..).rev().for_each(visit);
        Ok(())
    }

    async fn unlist_before(&self, cutoff: u64) -> Result<usize, StoreError> {
        let _one_writer = self.listing.lock().unwrap_or_else(|e| e.into_inner());
        let mut unlisted = 0;
        for entry in self.listings_by_time.range(..cutoff.to_be_bytes()) {
            let (key, _) = entry?;
            self.unlist(&key[8..])?;
            unlisted += 1;
        }
        Ok(unlisted)
    }
}
