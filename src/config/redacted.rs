//! Values routerd never shows in full, in logs (`Debug`) or in the rendered configuration
//! (`Serialize`, which `check-config` prints): the database URL and the RPC/WebSocket URLs.

use serde::{Deserialize, Serialize};

/// A value never shown: `Debug` and the rendered configuration print `<redacted>`.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub(super) String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("<redacted>")
    }
}

/// An RPC or WebSocket URL. Providers put API keys in the path or the query (and some in the
/// user part), so `Debug` and the rendered configuration show only the scheme and host.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Endpoint(String);

impl Endpoint {
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `scheme://host[:port]`, with `/…` when more followed.
    pub fn shown(&self) -> String {
        let (scheme, rest) = self.0.split_once("://").unwrap_or(("", &self.0));
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..end];
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let more = if end < rest.len() { "/…" } else { "" };
        format!("{scheme}://{host}{more}")
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl Serialize for Endpoint {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.shown())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_show_scheme_and_host_only() {
        let shown = |url: &str| Endpoint(url.to_string()).shown();
        assert_eq!(
            shown("https://base-mainnet.example/v2/KEY123?apikey=S3CRET"),
            "https://base-mainnet.example/…"
        );
        assert_eq!(
            shown("http://user:pw@127.0.0.1:8545"),
            "http://127.0.0.1:8545"
        );
        assert_eq!(
            shown("wss://node.example?token=S3CRET"),
            "wss://node.example/…"
        );
        let debug = format!("{:?}", Endpoint("https://h/KEY".to_string()));
        assert!(!debug.contains("KEY"));
    }
}
