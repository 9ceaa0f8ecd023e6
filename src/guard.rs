//! Background loops that nothing they read can stop (access.md §7). A loop runs each of its
//! steps (one head, one batch of settlements) through its [`Guard`]: a step that panics is
//! logged at error level and the loop goes on with the next one, keeping its state (a lane its
//! nonces, a watcher its recent blocks). Until a step succeeds again the guard reports the loop
//! down, for `/ready` and the systemd watchdog.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::FutureExt;

pub struct Guard {
    /// What the loop is, for the log and `/ready` ("head watcher of base-sepolia").
    what: String,
    down: AtomicBool,
    panics: AtomicU64,
}

impl Guard {
    pub fn new(what: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            down: AtomicBool::new(false),
            panics: AtomicU64::new(0),
        }
    }

    /// Runs one step; `None` when it panicked.
    pub async fn step<T>(&self, step: impl Future<Output = T>) -> Option<T> {
        match AssertUnwindSafe(step).catch_unwind().await {
            Ok(value) => {
                self.down.store(false, Ordering::Relaxed);
                Some(value)
            }
            Err(panic) => {
                self.down.store(true, Ordering::Relaxed);
                self.panics.fetch_add(1, Ordering::Relaxed);
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(task = %self.what, panic = %message, "a background step panicked; the loop goes on with the next one");
                None
            }
        }
    }

    /// Whether its last step panicked: the loop is up, but what it does is not being done.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    pub fn what(&self) -> &str {
        &self.what
    }

    pub fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_step_is_caught_and_reported_until_one_succeeds() {
        let guard = Guard::new("test loop");
        assert_eq!(guard.step(async { 7 }).await, Some(7));
        let answers: Vec<u8> = Vec::new();
        let failed = guard.step(async { answers[3] }).await;
        assert_eq!(failed, None);
        assert!(guard.is_down());
        assert_eq!(guard.panics(), 1);
        assert_eq!(guard.step(async { 1 }).await, Some(1));
        assert!(!guard.is_down());
    }
}
