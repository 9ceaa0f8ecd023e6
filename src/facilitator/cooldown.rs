//! Payers whose settlement reverted on chain although its trial succeeded (access.md §2): the
//! operator paid for it, so the payer is refused for `facilitator.revert_cooldown_secs`. A
//! wallet that answers differently on chain than in the trial costs at most one reverted
//! settlement per period. Kept per instance: each instance learns from the reverts it follows.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ethers_core::types::Address;

use crate::clock::unix_now;

pub struct Cooldown {
    period: Duration,
    /// Payer -> unix time its refusal ends.
    until: Mutex<HashMap<Address, u64>>,
    imposed: AtomicU64,
}

impl Cooldown {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            until: Mutex::default(),
            imposed: AtomicU64::new(0),
        }
    }

    /// A settlement of `payer` reverted on chain.
    pub fn impose(&self, payer: Address) {
        let until = unix_now().saturating_add(self.period.as_secs());
        let mut map = self.until.lock().expect("cooldown lock");
        map.retain(|_, end| *end > unix_now());
        map.insert(payer, until);
        self.imposed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(payer = %crate::evm::hex_bytes(payer), seconds = self.period.as_secs(), "a settlement reverted on chain: payer refused for the revert cooldown");
    }

    /// Seconds left of `payer`'s refusal, if it is refused now.
    pub fn refuses(&self, payer: Address) -> Option<u64> {
        let map = self.until.lock().expect("cooldown lock");
        let left = map.get(&payer)?.saturating_sub(unix_now());
        (left > 0).then_some(left)
    }

    /// How many refusals were imposed since start.
    pub fn imposed(&self) -> u64 {
        self.imposed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payer_is_refused_for_the_period_and_others_are_not() {
        let cooldown = Cooldown::new(Duration::from_secs(60));
        let payer = Address::repeat_byte(1);
        assert_eq!(cooldown.refuses(payer), None);
        cooldown.impose(payer);
        assert!(cooldown.refuses(payer).is_some_and(|left| left <= 60));
        assert_eq!(cooldown.refuses(Address::repeat_byte(2)), None);
        assert_eq!(cooldown.imposed(), 1);
        let none = Cooldown::new(Duration::ZERO);
        none.impose(payer);
        assert_eq!(none.refuses(payer), None);
    }
}
