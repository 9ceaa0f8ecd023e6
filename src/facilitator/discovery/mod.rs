//! The discovery catalogue (x402 v2's `bazaar` extension): a resource server declares its paid
//! endpoint in the payment requirements, the payer echoes the declaration in its payload, and a
//! settlement routerd answered with success lists it. Only what settled is listed (never what
//! was merely verified or claimed); a declaration that fails its checks is not listed and never
//! touches the settlement. Listings expire when not settled again for `discovery_ttl_secs`, and
//! the store keeps at most `discovery_max_entries` of them.

pub mod declaration;
pub mod entry;
pub mod query;
pub mod sanitize;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{iso8601, unix_now_millis};
use crate::config::FacilitatorSettings;
use crate::facilitator::protocol::v2::PaymentRequest;
use crate::store::{Listing, Storage, StoreError};
use declaration::Refused;
use entry::Stored;
use query::{ListQuery, Listed, Pagination, ResourcesPage, SearchPage, SearchPagination};
use query::{SearchQuery, Viewer};

/// How often expired listings are deleted (they stop being answered as soon as they expire).
const PRUNE_EVERY: Duration = Duration::from_secs(600);

pub struct Catalogue {
    store: Storage,
    ttl_secs: u64,
    max_entries: usize,
    max_entry_bytes: usize,
}

impl Catalogue {
    /// The catalogue, when `facilitator.discovery` is on and x402 v2 is served (the extension
    /// is v2's).
    pub fn new(settings: &FacilitatorSettings, store: Storage) -> Option<Arc<Self>> {
        (settings.discovery && settings.serves_version(2)).then(|| {
            Arc::new(Catalogue {
                store,
                ttl_secs: settings.discovery_ttl_secs,
                max_entries: settings.discovery_max_entries,
                max_entry_bytes: settings.discovery_max_entry_bytes,
            })
        })
    }

    /// Lists the resource of `request`, whose settlement routerd just answered with success,
    /// when its payload carries a declaration that passes; `private`: the settling API key keeps
    /// its listings to keys that may settle for their payTo. Nothing here fails the settle.
    pub async fn record(&self, request: &PaymentRequest, private: bool) {
        let extensions = request.payment_payload.extensions.as_ref();
        let Some(extension) = extensions.and_then(|e| e.get(declaration::KEY)) else {
            return;
        };
        let listing = match self.listing(request, extension, private) {
            Ok(listing) => listing,
            Err(refused) => {
                let resource = request.payment_payload.resource.as_ref().map(|r| &r.url);
                tracing::debug!(?resource, reason = %refused, "bazaar declaration not catalogued");
                return;
            }
        };
        if let Err(e) = self.store.list(&listing, self.max_entries).await {
            tracing::warn!(error = %e, "could not store a discovery listing");
        }
    }

    fn listing(
        &self,
        request: &PaymentRequest,
        extension: &serde_json::Value,
        private: bool,
    ) -> Result<Listing, Refused> {
        let stored = entry::build(request, extension, private)?;
        let encoded = serde_json::to_string(&stored).expect("listings serialize");
        if encoded.len() > self.max_entry_bytes {
            return Err(Refused::TooLarge(encoded.len()));
        }
        Ok(Listing {
            id: stored.id(),
            // Milliseconds: two listings settled in one second keep their order.
            settled_at: unix_now_millis(),
            encoded,
        })
    }

    /// Listings settled within the TTL that `viewer` may see, newest first, to `visit`.
    async fn visible(
        &self,
        viewer: &Viewer,
        mut visit: impl FnMut(&str, Stored, u64) + Send,
    ) -> Result<(), StoreError> {
        let since = unix_now_millis().saturating_sub(self.ttl_secs.saturating_mul(1000));
        let mut each = |listing: Listing| match serde_json::from_str::<Stored>(&listing.encoded) {
            Ok(stored) if viewer.sees(&stored) => visit(&listing.id, stored, listing.settled_at),
            Ok(_) => {}
            Err(e) => tracing::debug!(id = listing.id, error = %e, "unreadable discovery listing"),
        };
        self.store.listings(since, &mut each).await
    }

    /// `GET /discovery/resources`: one page of the listings that pass the filters, and how many
    /// pass in all.
    pub async fn resources(
        &self,
        query: &ListQuery,
        viewer: &Viewer,
    ) -> Result<ResourcesPage, StoreError> {
        let window = query.offset..query.offset.saturating_add(query.limit);
        let (mut total, mut items) = (0, Vec::new());
        self.visible(viewer, |_, stored, at| {
            if query.filters.admit(&stored.resource) {
                if window.contains(&total) {
                    items.push(listed(stored, at));
                }
                total += 1;
            }
        })
        .await?;
        Ok(ResourcesPage {
            x402_version: 2,
            items,
            pagination: Pagination {
                limit: query.limit,
                offset: query.offset,
                total,
            },
        })
    }

    /// `GET /discovery/search`: the listings that pass the filters and contain at least one of
    /// the query's words, most words first, then newest first. Two reads of the catalogue: the
    /// first ranks ids, the second fetches the page, so memory holds one page of listings. Each
    /// listing costs one scoring (a bounded number of bounded words) and one lookup: the work is
    /// linear in the catalogue.
    pub async fn search(
        &self,
        query: &SearchQuery,
        viewer: &Viewer,
    ) -> Result<SearchPage, StoreError> {
        let mut ranked: Vec<(usize, String)> = Vec::new();
        self.visible(viewer, |id, stored, _| {
            let score = query::score(&query.terms, &stored.resource);
            if score > 0 && query.filters.admit(&stored.resource) {
                ranked.push((score, id.to_string()));
            }
        })
        .await?;
        // Stable: equal scores keep the catalogue's newest-first order.
        ranked.sort_by_key(|(score, _)| std::cmp::Reverse(*score));
        let total = ranked.len();
        let end = query.start.saturating_add(query.limit).min(total);
        // Each id's place on the page: the second read finds a listing's place in one lookup.
        let page: HashMap<String, usize> = ranked
            .drain(query.start.min(end)..end)
            .enumerate()
            .map(|(place, (_, id))| (id, place))
            .collect();
        let mut found: Vec<Option<Listed>> = vec![None; page.len()];
        self.visible(viewer, |id, stored, at| {
            if let Some(place) = page.get(id) {
                found[*place] = Some(listed(stored, at));
            }
        })
        .await?;
        let resources = found.into_iter().flatten().collect();
        let more = end < total;
        Ok(SearchPage {
            x402_version: 2,
            resources,
            partial_results: more,
            pagination: SearchPagination {
                limit: query.limit,
                cursor: more.then(|| end.to_string()),
            },
        })
    }

    /// Deletes expired listings now and then, for as long as the process runs.
    pub fn spawn_upkeep(self: Arc<Self>) {
        tokio::spawn(async move {
            let mut prune = tokio::time::interval(PRUNE_EVERY);
            loop {
                prune.tick().await;
                let cutoff = unix_now_millis().saturating_sub(self.ttl_secs.saturating_mul(1000));
                if let Err(e) = self.store.unlist_before(cutoff).await {
                    tracing::warn!(error = %e, "could not delete expired discovery listings");
                }
            }
        });
    }
}

fn listed(stored: Stored, settled_at: u64) -> Listed {
    Listed {
        resource: stored.resource,
        last_updated: iso8601(settled_at),
    }
}
