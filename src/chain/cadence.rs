//! When to look at a polled chain's head next. A chain seals blocks at a steady pace, so the
//! next block is expected one usual gap after the last one arrived: the poller waits at the
//! configured interval until shortly before that moment, then looks every few milliseconds until
//! the block is there. A settlement's answer waits for the block to be seen; polling at the
//! configured interval alone would add half of it on average (50 ms at the default 100 ms), and
//! polling that fast all the time would multiply the requests a node gets for nothing.
//!
//! With a WebSocket subscription the node announces each block and none of this is needed.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How often the head is looked at while a block is due.
pub const DUE_POLL: Duration = Duration::from_millis(10);
/// How long before the expected moment the fast looks start: a block may come a little early.
const LEAD: Duration = Duration::from_millis(40);
/// How long after the expected moment they go on before falling back to the configured
/// interval: a late block (a missed slot) is then found at the usual pace.
const TRAIL: Duration = Duration::from_millis(250);
/// Gaps between arrivals kept to estimate the chain's pace.
const KEPT_GAPS: usize = 8;
/// Gaps needed before the pace is trusted.
const MIN_GAPS: usize = 3;

/// The arrivals of recent blocks, and the configured interval.
pub struct Cadence {
    interval: Duration,
    last_arrival: Option<Instant>,
    gaps: VecDeque<Duration>,
}

impl Cadence {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            last_arrival: None,
            gaps: VecDeque::with_capacity(KEPT_GAPS),
        }
    }

    /// A new head was found by the look sent at `at` (its reads ended later). The block is
    /// placed at the look's start, not at the read's end: under load the reads take tens of
    /// milliseconds, and a block placed that late would place the next one as late, so the fast
    /// looks would start after it was sealed and each block would be seen later than the last.
    pub fn arrived(&mut self, at: Instant) {
        if let Some(last) = self.last_arrival {
            if self.gaps.len() == KEPT_GAPS {
                self.gaps.pop_front();
            }
            self.gaps.push_back(at.saturating_duration_since(last));
        }
        self.last_arrival = Some(at);
    }

    /// A new head found by the look sent at `at`, `heads` past the last one placed. Looks far
    /// apart (a Solana follower rests while nothing is followed) leave the heads between unseen:
    /// they came at the usual pace, so the latest is placed where that pace puts it (never after
    /// the look) and no gap is counted, and the fast looks are due when the next head is.
    pub fn arrived_after(&mut self, at: Instant, heads: u64) {
        if heads <= 1 {
            return self.arrived(at);
        }
        let paced = self.pace().zip(self.last_arrival).and_then(|(pace, last)| {
            let stretch = pace.checked_mul(u32::try_from(heads).ok()?)?;
            last.checked_add(stretch)
        });
        self.last_arrival = Some(paced.filter(|placed| *placed <= at).unwrap_or(at));
    }

    /// The usual gap between blocks: the median of the recent ones, once there are enough of
    /// them and when it is long enough for the configured interval to miss much of it.
    fn pace(&self) -> Option<Duration> {
        if self.gaps.len() < MIN_GAPS {
            return None;
        }
        let mut gaps: Vec<Duration> = self.gaps.iter().copied().collect();
        gaps.sort_unstable();
        let median = gaps[gaps.len() / 2];
        (median > self.interval).then_some(median)
    }

    /// How long to wait, from `now`, before looking at the head again.
    pub fn next_look(&self, now: Instant) -> Duration {
        let (Some(pace), Some(last)) = (self.pace(), self.last_arrival) else {
            return self.interval;
        };
        let expected = last + pace;
        let due_from = expected.checked_sub(LEAD).unwrap_or(expected);
        if now >= expected + TRAIL {
            self.interval
        } else if now >= due_from {
            DUE_POLL.min(self.interval)
        } else {
            self.interval.min(due_from - now)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    /// A cadence that saw blocks every `gap` ms, the last at `t0 + n * gap`.
    fn seen(interval: u64, gap: u64, n: u64) -> (Cadence, Instant) {
        let t0 = Instant::now();
        let mut cadence = Cadence::new(MS(interval));
        for i in 0..=n {
            cadence.arrived(t0 + MS(i * gap));
        }
        (cadence, t0 + MS(n * gap))
    }

    #[test]
    fn until_the_pace_is_known_the_configured_interval() {
        let (cadence, last) = seen(100, 1000, 2);
        assert_eq!(cadence.next_look(last + MS(10)), MS(100));
    }

    #[test]
    fn waits_at_the_interval_then_looks_often_while_a_block_is_due() {
        let (cadence, last) = seen(100, 1000, 5);
        assert_eq!(cadence.next_look(last + MS(10)), MS(100));
        // Not past the lead: the wait ends where the fast looks begin.
        assert_eq!(cadence.next_look(last + MS(900)), MS(60));
        assert_eq!(cadence.next_look(last + MS(960)), DUE_POLL);
        assert_eq!(cadence.next_look(last + MS(1100)), DUE_POLL);
    }

    #[test]
    fn the_fast_looks_start_before_the_block_however_long_the_reads_take() {
        // Blocks every 1,000 ms, each found by a look sent 5 ms after it was sealed whose
        // reads (the number, then the head) took 60 ms more.
        let t0 = Instant::now();
        let mut cadence = Cadence::new(MS(100));
        for i in 0..=5 {
            cadence.arrived(t0 + MS(i * 1000 + 5));
        }
        // Read at 5,065; the next block is sealed at 6,000 and looked for often from 5,965.
        assert_eq!(cadence.next_look(t0 + MS(5065)), MS(100));
        assert_eq!(cadence.next_look(t0 + MS(5915)), MS(50));
        assert_eq!(cadence.next_look(t0 + MS(5975)), DUE_POLL);
    }

    #[test]
    fn a_late_block_is_looked_for_at_the_interval_again() {
        let (cadence, last) = seen(100, 1000, 5);
        assert_eq!(cadence.next_look(last + MS(1300)), MS(100));
        assert_eq!(cadence.next_look(last + MS(5000)), MS(100));
    }

    #[test]
    fn a_chain_faster_than_the_interval_is_polled_at_the_interval() {
        let (cadence, last) = seen(100, 50, 8);
        assert_eq!(cadence.next_look(last + MS(40)), MS(100));
    }

    #[test]
    fn heads_unseen_between_looks_are_placed_at_the_pace_and_count_no_gap() {
        let (mut cadence, last) = seen(100, 400, 5);
        // Looked again 10 s later, 25 heads on: the latest came at the pace, at last + 10,000.
        cadence.arrived_after(last + MS(10_030), 25);
        assert_eq!(cadence.gaps.len(), 5, "no gap counted for the stretch");
        assert_eq!(cadence.next_look(last + MS(10_040)), MS(100));
        assert_eq!(cadence.next_look(last + MS(10_370)), DUE_POLL);
        // A pace that would place it after the look places it at the look.
        cadence.arrived_after(last + MS(10_100), 3);
        assert_eq!(cadence.last_arrival, Some(last + MS(10_100)));
        // Without a pace yet, at the look, and no gap either.
        let mut fresh = Cadence::new(MS(100));
        fresh.arrived_after(last, 7);
        assert_eq!((fresh.last_arrival, fresh.gaps.len()), (Some(last), 0));
    }

    #[test]
    fn the_pace_is_the_median_gap_so_one_missed_slot_does_not_move_it() {
        let t0 = Instant::now();
        let mut cadence = Cadence::new(MS(100));
        for at in [0, 2000, 4000, 8000, 10000] {
            cadence.arrived(t0 + MS(at));
        }
        // Gaps 2000, 2000, 4000, 2000: the next block is due at 12,000.
        assert_eq!(cadence.next_look(t0 + MS(11970)), DUE_POLL);
        assert_eq!(cadence.next_look(t0 + MS(11000)), MS(100));
    }
}
