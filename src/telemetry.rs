//! Logs and OpenTelemetry traces: the process's `tracing` subscriber. Log lines come from
//! events only; spans go to the OTLP exporter only, when `[telemetry]` (or the standard
//! `OTEL_EXPORTER_OTLP_*` variables) names a collector. Without one no span is even created:
//! every `info_span!` in routerd is then a disabled span, and tracing costs a branch.
//!
//! The spans (docs/telemetry.md lists them and their attributes): `request` here, for the
//! server; `upstream batch` in `chain`, only inside another span (a head poll is not traced);
//! `settlement` in `facilitator`, carried to the lane with the claim. No attribute is a URL, a
//! token or a key: RPC upstreams are named `<chain>#<index>`, API keys by their name.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{SamplingDecision, SamplingResult, SdkTracerProvider, ShouldSample};
use opentelemetry_sdk::Resource;
pub use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{filter_fn, EnvFilter, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::config::{OtlpProtocol, TelemetrySettings};

/// The service name when neither the configuration nor `OTEL_SERVICE_NAME` gives one.
const SERVICE_NAME: &str = "routerd";
/// OTLP's default bound on one export.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The exporter refused its settings (an `OTEL_*` variable it reads itself, say).
    #[error("telemetry: the OTLP exporter cannot start: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// Checked here, not by the exporter, whose message would quote the URL (and its token).
    #[error("{0}: not an http:// or https:// URL")]
    Endpoint(&'static str),
}

/// The exporter while traces are on; [`Telemetry::shutdown`] sends what is still queued.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Installs the subscriber: log lines to stderr (JSON with `json`), level from `RUST_LOG`;
    /// with a collector, spans to it. Call inside the tokio runtime: the exporter runs on it.
    pub fn init(json: bool, settings: &TelemetrySettings) -> Result<Self, TelemetryError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        let provider = match enabled(settings, &env) {
            true => Some(provider(settings, &env)?),
            false => None,
        };
        let spans = provider.as_ref().map(|provider| {
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer(SERVICE_NAME))
                .with_location(false)
                .with_threads(false)
                .with_tracked_inactivity(false)
                .with_filter(filter_fn(exported))
        });
        tracing_subscriber::registry()
            .with(log_layer(json))
            .with(spans)
            .init();
        Ok(Self { provider })
    }

    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the spans still queued. Call from outside the runtime's tasks, while it runs.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            if let Err(error) = provider.shutdown() {
                tracing::warn!(%error, "telemetry: the last spans could not be exported");
            }
        }
    }
}

/// What the exporter sees: routerd's own spans. Its dependencies' (jsonrpsee's server and
/// client make spans per call) would add fields nobody here chose to export; events are log
/// lines, not span events.
fn exported(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span() && meta.target().starts_with(env!("CARGO_CRATE_NAME"))
}

/// Log lines: events only (a span's fields are the exporter's, not the log's).
fn log_layer<S>(json: bool) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use std::io::IsTerminal;
    // jsonrpsee's clients log their target URLs (with a provider's key) at debug level: they
    // never log below info, whatever RUST_LOG asks.
    let level = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive("jsonrpsee=info".parse().expect("a static directive"));
    let filter = level.and(filter_fn(|meta| meta.is_event()));
    // Colour only on a terminal: under systemd the codes would end up in the journal.
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match json {
        true => layer.json().flatten_event(true).with_filter(filter).boxed(),
        false => layer.with_filter(filter).boxed(),
    }
}

/// On with an endpoint configured or in the environment, unless the environment turns the SDK
/// or its trace exporter off.
fn enabled(settings: &TelemetrySettings, env: &HashMap<String, String>) -> bool {
    let set = |name: &str| env.get(name).is_some_and(|v| !v.trim().is_empty());
    let off = env
        .get("OTEL_SDK_DISABLED")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || env
            .get("OTEL_TRACES_EXPORTER")
            .is_some_and(|v| v.eq_ignore_ascii_case("none"));
    let endpoint = settings.otlp_endpoint.is_some()
        || set("OTEL_EXPORTER_OTLP_ENDPOINT")
        || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    endpoint && !off
}

fn provider(
    settings: &TelemetrySettings,
    env: &HashMap<String, String>,
) -> Result<SdkTracerProvider, TelemetryError> {
    check_endpoints(env)?;
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(http_client(env))
        .with_headers(
            settings
                .otlp_headers
                .iter()
                .map(|(name, value)| (name.clone(), value.expose().to_string()))
                .collect(),
        );
    if let Some(base) = &settings.otlp_endpoint {
        exporter = exporter.with_endpoint(traces_url(base.expose()));
    }
    if let Some(protocol) = protocol(settings, env) {
        exporter = exporter.with_protocol(protocol);
    }
    let processor = BatchSpanProcessor::builder(exporter.build()?, Tokio).build();
    let name = settings
        .service_name
        .clone()
        .or_else(|| env.get("OTEL_SERVICE_NAME").cloned())
        .unwrap_or_else(|| SERVICE_NAME.to_string());
    let mut builder = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(Resource::builder().with_service_name(name).build());
    builder = builder.with_sampler(Kept::new(kept_share(settings, env)));
    Ok(builder.build())
}

/// The share of traces kept: the configured one, else what `OTEL_TRACES_SAMPLER` (and its
/// `_ARG`) asks, read as a share whatever its parent-based prefix says (routerd decides, not
/// the caller), else every trace.
fn kept_share(settings: &TelemetrySettings, env: &HashMap<String, String>) -> f64 {
    if let Some(ratio) = settings.sample_ratio {
        return ratio;
    }
    let arg = || {
        let ratio = env
            .get("OTEL_TRACES_SAMPLER_ARG")?
            .trim()
            .parse::<f64>()
            .ok();
        ratio.filter(|r| (0.0..=1.0).contains(r))
    };
    match env.get("OTEL_TRACES_SAMPLER").map(|s| s.trim()) {
        Some("always_off" | "parentbased_always_off") => 0.0,
        Some("traceidratio" | "parentbased_traceidratio") => arg().unwrap_or(1.0),
        _ => 1.0,
    }
}

/// Whether a trace is exported, decided by routerd (access.md §3c): a new trace, or one a
/// caller continues with its `traceparent`, is kept with probability `share`, whatever the
/// caller's sampled flag says (a caller must not choose what the collector bills); routerd's
/// own spans inside a request follow the request's decision. The draw is a hash of the trace
/// id keyed at random per process: the spans of one trace agree, and no trace id a caller picks
/// is always kept (a plain ratio of the trace id's bits would keep an id of zeros).
#[derive(Debug, Clone)]
struct Kept {
    share: f64,
    key: std::hash::RandomState,
}

impl Kept {
    fn new(share: f64) -> Self {
        Self {
            share,
            key: std::hash::RandomState::new(),
        }
    }

    fn draw(&self, trace_id: opentelemetry::trace::TraceId) -> bool {
        use std::hash::BuildHasher;
        match self.share {
            share if share >= 1.0 => true,
            share if share > 0.0 => {
                (self.key.hash_one(trace_id.to_bytes()) as f64) < share * u64::MAX as f64
            }
            _ => false,
        }
    }
}

impl ShouldSample for Kept {
    fn should_sample(
        &self,
        parent: Option<&opentelemetry::Context>,
        trace_id: opentelemetry::trace::TraceId,
        _: &str,
        _: &opentelemetry::trace::SpanKind,
        _: &[opentelemetry::KeyValue],
        _: &[opentelemetry::trace::Link],
    ) -> SamplingResult {
        let parent = parent
            .filter(|cx| cx.has_active_span())
            .map(|cx| cx.span().span_context().clone())
            .filter(|p| p.is_valid());
        let keep = match &parent {
            Some(local) if !local.is_remote() => local.is_sampled(),
            _ => self.draw(trace_id),
        };
        SamplingResult {
            decision: match keep {
                true => SamplingDecision::RecordAndSample,
                false => SamplingDecision::Drop,
            },
            attributes: Vec::new(),
            trace_state: parent.map(|p| p.trace_state().clone()).unwrap_or_default(),
        }
    }
}

/// The endpoint variables the exporter reads are URLs (the configured one is checked with the
/// configuration).
fn check_endpoints(env: &HashMap<String, String>) -> Result<(), TelemetryError> {
    for name in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ] {
        let Some(value) = env.get(name).filter(|v| !v.is_empty()) else {
            continue;
        };
        let scheme = url::Url::parse(value).map(|url| url.scheme().to_string());
        if !matches!(scheme.as_deref(), Ok("http" | "https")) {
            return Err(TelemetryError::Endpoint(name));
        }
    }
    Ok(())
}

/// The exporter's HTTP client: hyper, as routerd's upstream client, with rustls and the
/// platform's certificate roots, so that an `https://` collector works (the exporter's own
/// hyper client speaks plain HTTP only). Each request is bounded as the exporter bounds an
/// export (`OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT`, in ms, else 10 s).
fn http_client(env: &HashMap<String, String>) -> impl opentelemetry_http::HttpClient {
    use rustls_platform_verifier::ConfigVerifierExt;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(rustls::ClientConfig::with_platform_verifier())
        .https_or_http()
        .enable_http1()
        .build();
    let timeout = [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]
    .iter()
    .find_map(|name| env.get(*name)?.trim().parse().ok())
    .map_or(EXPORT_TIMEOUT, Duration::from_millis);
    opentelemetry_http::hyper::HyperClient::new(connector, timeout, None)
}

/// The encoding: the configured one, else none (the exporter reads `OTEL_EXPORTER_OTLP_*
/// PROTOCOL`), else protobuf, the specification's default (the crate, built with JSON, would
/// pick JSON).
fn protocol(settings: &TelemetrySettings, env: &HashMap<String, String>) -> Option<Protocol> {
    match settings.otlp_protocol {
        Some(OtlpProtocol::HttpProtobuf) => Some(Protocol::HttpBinary),
        Some(OtlpProtocol::HttpJson) => Some(Protocol::HttpJson),
        None if [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ]
        .iter()
        .any(|name| env.contains_key(*name)) =>
        {
            None
        }
        None => Some(Protocol::HttpBinary),
    }
}

/// `<base>/v1/traces`, as the exporter does with `OTEL_EXPORTER_OTLP_ENDPOINT` (the query, if
/// any, kept). `validate` checked that the base is a URL.
fn traces_url(base: &str) -> String {
    let Ok(mut url) = url::Url::parse(base) else {
        return base.to_string();
    };
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(["v1", "traces"]);
    }
    url.into()
}

/// The span of one HTTP request, continuing the caller's W3C `traceparent` when there is one.
/// Its fields are filled in by the server as the request is answered.
pub fn request_span(method: &http::Method, route: &str, headers: &http::HeaderMap) -> Span {
    let span = tracing::info_span!(
        "request",
        otel.name = format!("{method} {route}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %method,
        http.route = route,
        http.response.status_code = tracing::field::Empty,
        outcome = tracing::field::Empty,
        payment = tracing::field::Empty,
        api_key = tracing::field::Empty,
    );
    // With traces off the span is disabled: the header is then read only for the log line.
    if span.is_disabled() {
        return span;
    }
    let parent = incoming(headers);
    if parent.span().span_context().is_valid() {
        // Only fails once the span has started, which it has not.
        let _ = span.set_parent(parent);
    }
    span
}

/// The trace id for the request's log line: the span's when traces are on, else the caller's
/// `traceparent`'s, so that a log line still joins the caller's trace.
pub fn trace_id(span: &Span, headers: &http::HeaderMap) -> Option<String> {
    let own = span.context().span().span_context().trace_id();
    let id = match own != opentelemetry::trace::TraceId::INVALID {
        true => own,
        false => incoming(headers).span().span_context().trace_id(),
    };
    (id != opentelemetry::trace::TraceId::INVALID).then(|| id.to_string())
}

/// The context a W3C `traceparent` (and `tracestate`) header carries, if any.
fn incoming(headers: &http::HeaderMap) -> opentelemetry::Context {
    struct Headers<'a>(&'a http::HeaderMap);
    impl Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(http::HeaderName::as_str).collect()
        }
    }
    if !headers.contains_key("traceparent") {
        return opentelemetry::Context::new();
    }
    TraceContextPropagator::new().extract(&Headers(headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_to_the_base() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://otlp.example/tenant/?token=x"),
            "https://otlp.example/tenant/v1/traces?token=x"
        );
    }

    #[test]
    fn an_endpoint_turns_traces_on_and_the_environment_can_turn_them_off() {
        let configured = TelemetrySettings {
            otlp_endpoint: Some(serde_json::from_str("\"http://c:4318\"").unwrap()),
            ..TelemetrySettings::default()
        };
        let env = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let none = TelemetrySettings::default();
        assert!(!enabled(&none, &env(&[])));
        assert!(enabled(&configured, &env(&[])));
        assert!(enabled(
            &none,
            &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")])
        ));
        assert!(!enabled(
            &configured,
            &env(&[("OTEL_SDK_DISABLED", "true")])
        ));
        assert!(!enabled(
            &configured,
            &env(&[("OTEL_TRACES_EXPORTER", "none")])
        ));
    }

    #[test]
    fn protobuf_unless_the_configuration_or_the_environment_says_json() {
        let mut settings = TelemetrySettings::default();
        let json = HashMap::from([(
            "OTEL_EXPORTER_OTLP_PROTOCOL".to_string(),
            "http/json".to_string(),
        )]);
        assert_eq!(
            protocol(&settings, &HashMap::new()),
            Some(Protocol::HttpBinary)
        );
        assert_eq!(protocol(&settings, &json), None, "the exporter reads it");
        settings.otlp_protocol = Some(OtlpProtocol::HttpJson);
        assert_eq!(
            protocol(&settings, &HashMap::new()),
            Some(Protocol::HttpJson)
        );
    }

    #[test]
    fn only_routerds_own_spans_are_exported() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        struct Count(Arc<AtomicUsize>);
        impl<S: tracing::Subscriber> Layer<S> for Count {
            fn on_new_span(
                &self,
                _: &tracing::span::Attributes<'_>,
                _: &tracing::span::Id,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let seen = Arc::new(AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry()
            .with(Count(seen.clone()).with_filter(filter_fn(exported)));
        tracing::subscriber::with_default(subscriber, || {
            let _dependency = tracing::info_span!(target: "jsonrpsee_client", "call");
            let _ours = tracing::info_span!("upstream batch");
        });
        assert_eq!(seen.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_bad_endpoint_variable_is_named_and_not_quoted() {
        let env = HashMap::from([(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT".to_string(),
            "otlp.example/v1/traces?token=S3CRET".to_string(),
        )]);
        let error = check_endpoints(&env).unwrap_err().to_string();
        assert!(
            error.starts_with("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            "{error}"
        );
        assert!(!error.contains("S3CRET"), "{error}");
        let good = HashMap::from([(
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_string(),
            "https://otlp.example".to_string(),
        )]);
        assert!(check_endpoints(&good).is_ok());
    }

    #[test]
    fn routerd_decides_what_is_kept_whatever_the_callers_flag() {
        use opentelemetry::trace::{
            SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId, TraceState,
        };
        let id = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        let parent = |remote: bool, flags: TraceFlags| {
            let span = SpanContext::new(
                id,
                SpanId::from_hex("00f067aa0ba902b7").unwrap(),
                flags,
                remote,
                TraceState::NONE,
            );
            opentelemetry::Context::new().with_remote_span_context(span)
        };
        let kept = |sampler: &Kept, cx: Option<&opentelemetry::Context>| {
            let result = sampler.should_sample(cx, id, "request", &SpanKind::Server, &[], &[]);
            result.decision == SamplingDecision::RecordAndSample
        };
        let (none, all) = (Kept::new(0.0), Kept::new(1.0));
        let caller_sampled = parent(true, TraceFlags::SAMPLED);
        let caller_not = parent(true, TraceFlags::default());
        assert!(!kept(&none, Some(&caller_sampled)) && !kept(&none, None));
        assert!(kept(&all, Some(&caller_not)) && kept(&all, None));
        // Inside routerd a child follows its request's decision, whatever the share.
        let local = |flags| {
            let span = SpanContext::new(
                id,
                SpanId::from_hex("00f067aa0ba902b8").unwrap(),
                flags,
                false,
                TraceState::NONE,
            );
            opentelemetry::Context::new().with_remote_span_context(span)
        };
        assert!(kept(&none, Some(&local(TraceFlags::SAMPLED))));
        assert!(!kept(&all, Some(&local(TraceFlags::default()))));
        // A trace id of zeros in its low bits is kept about as often as any other.
        let low = TraceId::from_hex("ffffffffffffffff0000000000000000").unwrap();
        let kept_low = (0..400).filter(|_| Kept::new(0.25).draw(low)).count();
        assert!((40..=160).contains(&kept_low), "{kept_low} of 400");
    }

    #[test]
    fn the_share_kept_is_configured_or_read_from_the_environment() {
        let env = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let mut settings = TelemetrySettings::default();
        assert_eq!(kept_share(&settings, &env(&[])), 1.0);
        let ratio = [
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
        ];
        assert_eq!(kept_share(&settings, &env(&ratio)), 0.1);
        let off = [("OTEL_TRACES_SAMPLER", "parentbased_always_off")];
        assert_eq!(kept_share(&settings, &env(&off)), 0.0);
        settings.sample_ratio = Some(0.5);
        assert_eq!(kept_share(&settings, &env(&off)), 0.5);
    }

    #[test]
    fn a_traceparent_gives_the_trace_id_even_without_an_exporter() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        let span = Span::none();
        assert_eq!(
            trace_id(&span, &headers).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(trace_id(&span, &http::HeaderMap::new()), None);
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "garbage",
        ] {
            headers.insert("traceparent", bad.parse().unwrap());
            assert_eq!(trace_id(&span, &headers), None, "{bad}");
        }
        headers.insert(
            "traceparent",
            http::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        );
        assert_eq!(trace_id(&span, &headers), None);
    }
}
