//! `[telemetry]`: where OpenTelemetry traces go, in which encoding, and how many are kept. Off
//! unless an endpoint is given here or in the standard `OTEL_EXPORTER_OTLP_*` variables (the
//! exporter reads those itself; `telemetry` in the daemon decides whether to start it).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::redacted::{Endpoint, Secret};
use super::ConfigError;

/// The OTLP over HTTP encodings routerd can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum OtlpProtocol {
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    #[serde(rename = "http/json")]
    HttpJson,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySettings {
    /// The collector's OTLP/HTTP base URL (`http://127.0.0.1:4318`); traces go to
    /// `<base>/v1/traces`, as with `OTEL_EXPORTER_OTLP_ENDPOINT`. Shown redacted: a vendor's
    /// token may be in it.
    pub otlp_endpoint: Option<Endpoint>,
    /// Unset: `OTEL_EXPORTER_OTLP_PROTOCOL`, else `http/protobuf`.
    pub otlp_protocol: Option<OtlpProtocol>,
    /// Headers sent with each export (a vendor's API key): values never shown. Added to those of
    /// `OTEL_EXPORTER_OTLP_HEADERS`.
    pub otlp_headers: BTreeMap<String, Secret>,
    /// Unset: `OTEL_SERVICE_NAME`, else `routerd`.
    pub service_name: Option<String>,
    /// The share of traces kept, 0 to 1, decided by routerd: a request continuing a caller's
    /// trace keeps its id, not its sampled flag. Unset: `OTEL_TRACES_SAMPLER` /
    /// `OTEL_TRACES_SAMPLER_ARG`, else all.
    pub sample_ratio: Option<f64>,
}

impl TelemetrySettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.otlp_endpoint {
            let parsed = url::Url::parse(endpoint.expose()).map_err(|_| {
                ConfigError::new("telemetry.otlp_endpoint", "not a URL (http://host:4318)")
            })?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(ConfigError::new(
                    "telemetry.otlp_endpoint",
                    "must be an http:// or https:// URL (OTLP over HTTP)",
                ));
            }
        }
        if let Some(ratio) = self.sample_ratio {
            if !(0.0..=1.0).contains(&ratio) {
                return Err(ConfigError::new(
                    "telemetry.sample_ratio",
                    "must be between 0 and 1",
                ));
            }
        }
        for (name, value) in &self.otlp_headers {
            let valid = http_header_name(name) && !value.expose().contains(['\r', '\n']);
            if !valid {
                return Err(ConfigError::new(
                    format!("telemetry.otlp_headers.{name}"),
                    "not a valid HTTP header",
                ));
            }
        }
        if self.service_name.as_deref() == Some("") {
            return Err(ConfigError::new(
                "telemetry.service_name",
                "must not be empty",
            ));
        }
        Ok(())
    }
}

/// RFC 9110's token characters.
fn http_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use crate::config::testing::{load, BASE};

    #[test]
    fn telemetry_is_off_by_default_and_bad_values_name_the_key() {
        let settings = load("telemetry.toml", BASE).unwrap();
        assert!(settings.telemetry.otlp_endpoint.is_none());
        for (section, key) in [
            (
                "otlp_endpoint = \"ftp://collector\"",
                "telemetry.otlp_endpoint",
            ),
            ("otlp_endpoint = \"not a url\"", "telemetry.otlp_endpoint"),
            ("sample_ratio = 1.5", "telemetry.sample_ratio"),
            ("otlp_protocol = \"grpc\"", "telemetry"),
            (
                "otlp_headers = { \"bad header\" = \"x\" }",
                "telemetry.otlp_headers.bad header",
            ),
            ("service_name = \"\"", "telemetry.service_name"),
        ] {
            let error = load(
                "telemetry.toml",
                &format!("{BASE}\n[telemetry]\n{section}\n"),
            )
            .unwrap_err();
            assert!(error.key.starts_with(key), "{section}: {error}");
        }
    }

    #[test]
    fn the_endpoint_and_headers_are_shown_redacted() {
        let settings = load(
            "telemetry.toml",
            &format!(
            "{BASE}\n[telemetry]\notlp_endpoint = \"https://otlp.example/v1/KEYPATH?token=S3CRET\"\n\
             otlp_headers = {{ authorization = \"Bearer T0KEN\" }}\nsample_ratio = 0.25\n"
        ))
        .unwrap();
        let rendered = settings.render();
        assert!(rendered.contains("[telemetry]"), "{rendered}");
        assert!(rendered.contains("otlp_endpoint = \"https://otlp.example/…\""));
        assert!(rendered.contains("sample_ratio = 0.25"));
        for secret in ["KEYPATH", "S3CRET", "T0KEN"] {
            assert!(!rendered.contains(secret), "{rendered}");
            assert!(!format!("{settings:?}").contains(secret));
        }
    }
}
