//! The metrics alert rules ask about most (packaging/prometheus/routerd-alerts.yml): whether
//! `/ready` answers 200, how many settlements each signer's and fee payer's balance still pays
//! for, how the store answers, how long verify, settle and the wait after a settlement's block
//! take per family, and the error codes answered (a facilitator's 502 or 504 goes out with HTTP
//! status 400, so `routerd_http_requests_total` cannot tell them).

use std::time::Duration;

use http::StatusCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use super::{ready, Metrics, SignerLabels};
use crate::facilitator::readiness::Role;
use crate::facilitator::settlement::answer_times::{ByFamily, FamilyLabel};
use crate::facilitator::Facilitator;
use crate::server::App;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    route: &'static str,
    /// The answer's `error` code.
    code: i32,
}

pub(super) struct Health {
    errors: Family<ErrorLabels, Counter>,
    ready: Gauge,
    signer_settlements_left: Family<SignerLabels, Gauge>,
    fee_payer_settlements_left: Family<SignerLabels, Gauge>,
    store_up: Gauge,
    store_probe: Gauge<f64, std::sync::atomic::AtomicU64>,
    verify_time: ByFamily,
    settle_time: ByFamily,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            errors: Family::default(),
            ready: Gauge::default(),
            signer_settlements_left: Family::default(),
            fee_payer_settlements_left: Family::default(),
            store_up: Gauge::default(),
            store_probe: Gauge::default(),
            // 1 ms to about 30 s: one upstream read, or a busy read budget's wait.
            verify_time: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
            // 50 ms to about 14 minutes: the block and its confirmations, up to
            // settle_timeout_secs.
            settle_time: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.05, 2.0, 15))
            }),
        }
    }
}

impl Metrics {
    pub(super) fn register_health(&mut self) {
        let (r, h) = (&mut self.registry, &self.health);
        r.register(
            "ready",
            "1 while /ready answers 200, else 0",
            h.ready.clone(),
        );
        r.register(
            "error_answers",
            "Requests answered with an error body, by route and the body's error code (502 a chain unreachable, 504 a settlement pending at its deadline, 500 a store failure, 503 busy)",
            h.errors.clone(),
        );
        r.register(
            "signer_settlements_left",
            "Settlements each signer's balance still pays for at the chain's current gas price",
            h.signer_settlements_left.clone(),
        );
        r.register(
            "fee_payer_settlements_left",
            "Settlements each Solana fee payer's lamports above the rent-exempt minimum still pay for, each at the most one costs",
            h.fee_payer_settlements_left.clone(),
        );
        r.register(
            "verify_duration_seconds",
            "Verify answers' latency by network family",
            h.verify_time.clone(),
        );
        r.register(
            "settle_duration_seconds",
            "Settle answers' latency by network family, up to the answer (success, failure or pending)",
            h.settle_time.clone(),
        );
    }

    /// With a facilitator: its block-to-answer histograms (`AnswerTimes`) and its store's probe
    /// (without one, no store is probed: a 0 would read as a store down).
    pub fn register_facilitator(&mut self, facilitator: &Facilitator) {
        let (r, h) = (&mut self.registry, &self.health);
        r.register(
            "block_to_answer_seconds",
            "Time from the block holding a settlement, as routerd first saw it (an EVM head; a Solana status at the commitment), to the answer, by network family",
            facilitator.answer_times().histograms(),
        );
        r.register(
            "store_up",
            "1 when the store answered a small read within 2 seconds at the last scrape, else 0",
            h.store_up.clone(),
        );
        r.register(
            "store_probe_seconds",
            "How long the store took to answer that read",
            h.store_probe.clone(),
        );
    }

    /// A request answered with an error body whose code is `code`.
    pub fn observe_error(&self, route: &'static str, code: i32) {
        self.health
            .errors
            .get_or_create(&ErrorLabels { route, code })
            .inc();
    }

    pub fn observe_verify_time(&self, family: &'static str, took: Duration) {
        let label = FamilyLabel { family };
        let histogram = self.health.verify_time.get_or_create(&label);
        histogram.observe(took.as_secs_f64());
    }

    pub fn observe_settle_time(&self, family: &'static str, took: Duration) {
        let label = FamilyLabel { family };
        let histogram = self.health.settle_time.get_or_create(&label);
        histogram.observe(took.as_secs_f64());
    }

    /// Readiness as `/ready` answers it, and with a facilitator its funds and store.
    pub(super) async fn record_health(&self, app: &App) {
        let ready = ready(&app.services).await.status() == StatusCode::OK;
        self.health.ready.set(i64::from(ready));
        let Some(facilitator) = &app.services.facilitator else {
            return;
        };
        self.record_settlements_left(facilitator).await;
        let probe = facilitator.store_probe().await;
        self.health.store_up.set(i64::from(probe.ok));
        self.health.store_probe.set(probe.took.as_secs_f64());
    }

    async fn record_settlements_left(&self, facilitator: &Facilitator) {
        let gauge = |left: u64| i64::try_from(left).unwrap_or(i64::MAX);
        for funds in facilitator.funds().await {
            let Some(left) = funds.settlements_left else {
                continue;
            };
            let family = match funds.role {
                Role::Signer => &self.health.signer_settlements_left,
                Role::FeePayer => &self.health.fee_payer_settlements_left,
            };
            let labels = SignerLabels {
                network: funds.network,
                signer: funds.key,
            };
            family.get_or_create(&labels).set(gauge(left));
        }
    }
}
