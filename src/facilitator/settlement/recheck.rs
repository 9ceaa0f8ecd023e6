//! The exposure recheck: a claim refused because the payer's settlements under way and this one
//! add up to more than it holds is tried again after the chain moves (one of those may be mined
//! already, and leaves the exposure once answered), a few times and never past the deadline. A
//! refused claim stores nothing, so trying again can never settle twice.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::facilitator::outcome::Invalid;
use crate::ledger::Reason;

/// How many times a claim refused for the payer's balance is tried again: enough for a lane to
/// answer what was mined (also an instance that restarted and follows its settlements again).
pub const MAX_RECHECKS: u32 = 5;

/// The longest a refused claim waits for a new head before it is tried again: on a chain that
/// mines nothing the refusal then comes a few seconds late, not at the settle timeout.
const RECHECK_WAIT: Duration = Duration::from_secs(1);

/// A refusal for the payer's balance or Permit2 allowance beside its settlements under way: one
/// of those may be mined already, and leave the exposure once answered.
pub fn exposure_may_clear(failure: &Invalid) -> bool {
    matches!(
        failure.reason,
        Reason::InsufficientFunds | Reason::Permit2Allowance
    )
}

/// Waits for the chain's next head, or RECHECK_WAIT; false when `deadline` has passed.
pub async fn next_head<T>(heads: &mut watch::Receiver<T>, deadline: Instant) -> bool {
    let until = deadline.min(Instant::now() + RECHECK_WAIT);
    let _ = tokio::time::timeout_at(until, heads.changed()).await;
    Instant::now() < deadline
}
