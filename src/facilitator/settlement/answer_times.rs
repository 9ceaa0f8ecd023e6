//! How long a caller waits once the chain holds its settlement: from the block holding it, as
//! routerd first saw it (an EVM head; Solana's status at the commitment), to the answer. Each
//! family's mechanism observes its own answers under its own name; `/metrics` serves the
//! histograms (`routerd_block_to_answer_seconds`). A clone shares the same histograms.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

/// The family a time is counted under, as `routerd_settlements_total` names it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabel {
    pub family: &'static str,
}

/// The histograms, one per family.
pub type ByFamily = Family<FamilyLabel, Histogram>;

#[derive(Clone)]
pub struct AnswerTimes(ByFamily);

impl AnswerTimes {
    /// The block-to-answer time of one settlement answered under `family`.
    pub fn observe(&self, family: &'static str, waited: Duration) {
        self.0
            .get_or_create(&FamilyLabel { family })
            .observe(waited.as_secs_f64());
    }

    /// The histograms, for `/metrics` to register.
    pub fn histograms(&self) -> ByFamily {
        self.0.clone()
    }
}

impl Default for AnswerTimes {
    /// 1 ms to about 2 minutes: an answer follows its block by milliseconds (Solana, or EVM at
    /// one confirmation) up to the block times of `confirmations` blocks.
    fn default() -> Self {
        Self(Family::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 18))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn clones_count_into_the_same_histogram_per_family() {
        let times = AnswerTimes::default();
        times.clone().observe("evm", Duration::from_millis(3));
        times.observe("evm", Duration::from_secs(1));
        times.observe("svm", Duration::from_millis(1));
        let mut registry = Registry::with_prefix("routerd");
        registry.register("block_to_answer_seconds", "t", times.histograms());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("routerd_block_to_answer_seconds_count{family=\"evm\"} 2"));
        assert!(text.contains("routerd_block_to_answer_seconds_count{family=\"svm\"} 1"));
        assert!(
            text.contains("routerd_block_to_answer_seconds_bucket{le=\"0.004\",family=\"evm\"} 1")
        );
    }
}
