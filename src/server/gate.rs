//! How many connections routerd holds (access.md §3b): overall, within the open-file limit the
//! process has, and per client, on every listener. A connection beyond a bound is not simply
//! refused: an idle one (no request in flight: a keep-alive between requests, or a fresh
//! connection that sent nothing) is closed to make room first, preferring the client that holds
//! the most, so that a stranger's idle sockets never keep `/health`, the ops routes or an honest
//! settle out. Only when every connection is busy is the new one closed at once.
//!
//! A std `Mutex` (not tokio's): it is held for map operations only, never across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::client::ClientId;
use super::silence::Clock;

/// The bounds of one gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub per_client: usize,
}

/// Descriptors kept out of the connection budget: the store's files, the upstream pools, the
/// ops listener and the process's own.
pub const RESERVED_DESCRIPTORS: u64 = 256;
/// Connections the ops listener holds when it has its own address.
pub const OPS_CONNECTIONS: usize = 64;

impl Limits {
    /// The bounds for an open-file limit of `open_files`, unless configured: every descriptor
    /// but the reserve, and per client at most that.
    pub fn for_open_files(
        open_files: u64,
        total: Option<usize>,
        per_client: Option<usize>,
    ) -> Self {
        let budget = open_files.saturating_sub(RESERVED_DESCRIPTORS).max(16);
        let total = total.unwrap_or(usize::try_from(budget).unwrap_or(usize::MAX));
        Limits {
            total,
            per_client: per_client.unwrap_or(DEFAULT_PER_CLIENT).min(total),
        }
    }
}

/// Room for a busy resource server behind one address (access.md §3b: at least 1,024): a
/// thousand concurrent callers were seen to hold more sockets than that, their pool opening
/// new ones while answered ones return.
pub const DEFAULT_PER_CLIENT: usize = 4096;

/// How long a connection that has sent nothing yet is spared: an honest client writes its
/// first request at once, and closing its socket under it would fail that request.
const FRESH_GRACE: Duration = Duration::from_millis(100);

struct Held {
    /// `None` for a trusted proxy's connections, which carry many clients: the total bound only.
    client: Option<ClientId>,
    clock: Arc<Clock>,
    close: Arc<Notify>,
    /// Order of arrival: among idle connections the oldest goes first.
    serial: u64,
}

#[derive(Default)]
struct Book {
    next: u64,
    held: HashMap<u64, Held>,
    per_client: HashMap<ClientId, usize>,
}

impl Book {
    fn remove(&mut self, id: u64) -> Option<Held> {
        let held = self.held.remove(&id)?;
        if let Some(client) = held.client {
            if let Some(n) = self.per_client.get_mut(&client) {
                *n -= 1;
                if *n == 0 {
                    self.per_client.remove(&client);
                }
            }
        }
        Some(held)
    }

    fn count(&self, client: Option<ClientId>) -> usize {
        client
            .and_then(|c| self.per_client.get(&c).copied())
            .unwrap_or(0)
    }

    /// The idle connection to close for room: of `only` when given, else of the client holding
    /// the most; the oldest of those.
    fn victim(&self, only: Option<ClientId>) -> Option<u64> {
        let now = Instant::now();
        self.held
            .iter()
            .filter(|(_, h)| only.is_none_or(|c| Some(c) == h.client))
            .filter(|(_, h)| h.clock.is_idle(now, FRESH_GRACE))
            .max_by_key(|(_, h)| (self.count(h.client), std::cmp::Reverse(h.serial)))
            .map(|(id, _)| *id)
    }

    /// Closes `victim`: it leaves the book now and its task drops the socket.
    fn evict(&mut self, victim: u64) {
        if let Some(held) = self.remove(victim) {
            held.close.notify_one();
        }
    }
}

pub struct Gate {
    limits: Limits,
    book: Mutex<Book>,
}

/// A connection's place in its gate; dropping it gives the place back. `close` is notified
/// when the gate closes the connection to make room.
pub struct Permit {
    gate: Arc<Gate>,
    id: u64,
    pub close: Arc<Notify>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.book().remove(self.id);
    }
}

impl Gate {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Gate {
            limits,
            book: Mutex::default(),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // A poisoned lock only means a panic elsewhere held it; the book is still whole.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a new connection of `client` (`None`: a trusted proxy's), making room by
    /// closing an idle one where a bound is reached; `None` when every connection in the way is
    /// busy.
    pub fn admit(self: &Arc<Self>, client: Option<ClientId>, clock: Arc<Clock>) -> Option<Permit> {
        let mut book = self.book();
        if client.is_some() && book.count(client) >= self.limits.per_client {
            let victim = book.victim(client)?;
            book.evict(victim);
        }
        if book.held.len() >= self.limits.total {
            let victim = book.victim(None)?;
            book.evict(victim);
        }
        let (id, close) = (book.next, Arc::new(Notify::new()));
        book.next += 1;
        let held = Held {
            client,
            clock,
            close: close.clone(),
            serial: id,
        };
        book.held.insert(id, held);
        if let Some(client) = client {
            *book.per_client.entry(client).or_default() += 1;
        }
        Some(Permit {
            gate: self.clone(),
            id,
            close,
        })
    }

    /// Connections held now.
    pub fn held(&self) -> usize {
        self.book().held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::silence::Timeouts;
    use futures::FutureExt;
    use std::time::Duration;
    use tokio::time::Instant;

    /// A connection opened `ago`.
    fn opened(ago: Duration) -> Arc<Clock> {
        let t = Duration::from_secs(10);
        Clock::new(Timeouts { read: t, idle: t }, Instant::now() - ago)
    }

    /// A connection opened a second ago, past the grace.
    fn clock() -> Arc<Clock> {
        opened(Duration::from_secs(1))
    }

    fn client(last: u8) -> Option<ClientId> {
        Some(ClientId::of(std::net::IpAddr::from([10, 0, 0, last])))
    }

    #[tokio::test]
    async fn idle_connections_make_room_and_busy_ones_do_not() {
        let gate = Gate::new(Limits {
            total: 3,
            per_client: 2,
        });
        let stranger = client(1);
        let (a, b) = (clock(), clock());
        let _first = gate.admit(stranger, a.clone()).unwrap();
        let _second = gate.admit(stranger, b).unwrap();
        // At its own bound the stranger's next connection closes its oldest idle one.
        let _busy_a = a.request_started();
        let third = gate.admit(stranger, clock()).unwrap();
        assert_eq!(gate.held(), 2, "one of the stranger's was closed for room");
        let _honest = gate.admit(client(2), clock()).unwrap();
        assert_eq!(gate.held(), 3);
        // At the total bound: the idle connection of the client holding the most goes.
        let _another = gate.admit(client(3), clock()).unwrap();
        assert_eq!(gate.held(), 3);
        assert!(
            third.close.notified().now_or_never().is_some(),
            "the stranger's idle one was told to close"
        );
        // Every connection busy: the next one is refused.
        let clocks: Vec<_> = gate.book().held.values().map(|h| h.clock.clone()).collect();
        let _busy: Vec<_> = clocks.iter().map(|c| c.request_started()).collect();
        assert!(gate.admit(client(4), clock()).is_none());
    }

    #[tokio::test]
    async fn a_connection_just_opened_is_spared() {
        let gate = Gate::new(Limits {
            total: 1,
            per_client: 1,
        });
        let _young = gate.admit(client(1), opened(Duration::ZERO)).unwrap();
        assert!(
            gate.admit(client(2), clock()).is_none(),
            "its first request is on its way"
        );
    }

    #[test]
    fn a_closed_place_is_given_back() {
        let gate = Gate::new(Limits {
            total: 1,
            per_client: 1,
        });
        drop(gate.admit(client(1), clock()).unwrap());
        assert_eq!(gate.held(), 0);
    }

    #[test]
    fn the_budget_keeps_a_reserve_and_the_per_client_bound_fits_it() {
        let limits = Limits::for_open_files(1024, None, None);
        assert_eq!(limits.total, 1024 - RESERVED_DESCRIPTORS as usize);
        assert_eq!(limits.per_client, limits.total);
        let roomy = Limits::for_open_files(65_536, None, None);
        assert_eq!(roomy.per_client, DEFAULT_PER_CLIENT);
        assert_eq!(
            Limits::for_open_files(65_536, Some(100), Some(500)).per_client,
            100
        );
    }
}
