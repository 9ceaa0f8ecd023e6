//! Whose upstream reads are whose (access.md §3b). The settlement engine's own work (lanes'
//! broadcasts, receipts, head polls) goes over connections of its own and never waits behind what
//! callers cause. Callers' reads have a bound per kind (a `/verify`'s apart from a `/settle`'s and
//! the router's): over it a caller is told at once that the chain is busy (503 with
//! `Retry-After`) instead of waiting into a timeout, and a flood of strangers' verifies delays
//! other verifies, never settlements.

use tokio::sync::{Semaphore, SemaphorePermit};

/// Which connections a read goes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// The settlement engine and the operator's probes: heads, receipts, broadcasts, readiness.
    Own,
    /// Reads a request causes: verify and settle checks, router probes, a wallet's calls.
    Callers,
}

/// The bound a caller's reads count against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    Verify,
    Settle,
    Router,
}

impl Budget {
    pub fn name(self) -> &'static str {
        match self {
            Budget::Verify => "verify",
            Budget::Settle => "settle",
            Budget::Router => "router",
        }
    }
}

/// A caller's read refused because its budget on the chain is spent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{chain} is busy with {} reads (chains.{chain}.max_caller_reads); retry shortly",
    budget.name()
)]
pub struct Overloaded {
    pub chain: String,
    pub budget: Budget,
}

/// How long a caller told "busy" is asked to wait before it tries again.
pub const RETRY_AFTER_SECS: u64 = 1;

/// The reads in flight allowed per budget on one chain.
pub struct Budgets {
    verify: Semaphore,
    settle: Semaphore,
    router: Semaphore,
}

impl Budgets {
    pub fn new(per_budget: usize) -> Self {
        Budgets {
            verify: Semaphore::new(per_budget),
            settle: Semaphore::new(per_budget),
            router: Semaphore::new(per_budget),
        }
    }

    /// A place in `budget`, held while the read is under way; `None` when it is spent.
    pub fn admit(&self, budget: Budget) -> Option<SemaphorePermit<'_>> {
        let semaphore = match budget {
            Budget::Verify => &self.verify,
            Budget::Settle => &self.settle,
            Budget::Router => &self.router,
        };
        semaphore.try_acquire().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_budget_is_bounded_on_its_own() {
        let budgets = Budgets::new(2);
        let held: Vec<_> = (0..2).map(|_| budgets.admit(Budget::Verify)).collect();
        assert!(held.iter().all(Option::is_some));
        assert!(
            budgets.admit(Budget::Verify).is_none(),
            "verify's budget is spent"
        );
        assert!(
            budgets.admit(Budget::Settle).is_some(),
            "settle's is its own"
        );
        drop(held);
        assert!(
            budgets.admit(Budget::Verify).is_some(),
            "given back when done"
        );
    }
}
