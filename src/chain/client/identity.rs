//! Which chain a URL serves, checked before the URL is first used (access.md 3c): a Solana
//! cluster is named by its genesis hash, and a failover URL on another cluster would settle
//! payments on a chain the merchant is not paid on. Each URL is asked once; a URL on another
//! chain is never used, one that could not be asked is asked again before its next use.

use std::sync::atomic::{AtomicU8, Ordering};

use jsonrpsee::core::client::{ClientT, Error as ClientError};
use serde_json::Value;

use super::{scrubbed, ChainClient, Params, Unreachable, Upstream};
use crate::chain::Traffic;

/// What every URL of a chain must answer before it is used.
#[derive(Debug, Clone)]
pub struct Identity {
    /// A method without params (`getGenesisHash`).
    pub method: &'static str,
    pub expected: String,
}

/// What one URL answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    Confirmed,
    /// On another chain: what it answered instead.
    Foreign(String),
}

// 0, the default: not asked yet.
const CONFIRMED: u8 = 1;
const FOREIGN: u8 = 2;

/// One URL's identity, once known.
#[derive(Default)]
pub(super) struct IdentityState {
    known: AtomicU8,
    /// One check at a time per URL: the requests that wait for it take its answer.
    checking: tokio::sync::Mutex<()>,
}

impl IdentityState {
    /// Whether the URL is known to be on another chain.
    pub(super) fn foreign(&self) -> bool {
        self.known.load(Ordering::Relaxed) == FOREIGN
    }

    /// The URL's identity, asking it with `ask` unless known; an error when it could not be
    /// asked (it is asked again next time).
    pub(super) async fn check<F, Fut>(
        &self,
        identity: &Identity,
        ask: F,
    ) -> Result<Checked, ClientError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Value, ClientError>>,
    {
        if let Some(known) = self.known() {
            return Ok(known);
        }
        let _one = self.checking.lock().await;
        if let Some(known) = self.known() {
            return Ok(known);
        }
        let found = ask().await?;
        let checked = judge(identity, &found);
        let state = match checked {
            Checked::Confirmed => CONFIRMED,
            Checked::Foreign(_) => FOREIGN,
        };
        self.known.store(state, Ordering::Relaxed);
        Ok(checked)
    }

    fn known(&self) -> Option<Checked> {
        match self.known.load(Ordering::Relaxed) {
            CONFIRMED => Some(Checked::Confirmed),
            // What it answered was logged when it was found; later refusals need only the fact.
            FOREIGN => Some(Checked::Foreign(String::new())),
            _ => None,
        }
    }
}

/// An answer that is not the expected string is another chain's (a node that answers a number
/// or an object to `getGenesisHash` is not a node of this cluster either).
fn judge(identity: &Identity, found: &Value) -> Checked {
    match found.as_str() {
        Some(found) if found == identity.expected => Checked::Confirmed,
        Some(found) => Checked::Foreign(found.chars().take(88).collect()),
        None => Checked::Foreign("an answer that is not a string".to_string()),
    }
}

impl ChainClient {
    /// Whether `upstream` serves this chain, asking it first (over `traffic`'s connections) if
    /// nobody has. A URL found on another chain is logged by its name, never its URL.
    pub(super) async fn identify(
        &self,
        upstream: &Upstream,
        traffic: Traffic,
    ) -> Result<Checked, ClientError> {
        let Some(identity) = &self.identity else {
            return Ok(Checked::Confirmed);
        };
        let ask = || async {
            let none: Vec<Value> = Vec::new();
            let params = Params {
                values: &none,
                raw: None,
            };
            upstream
                .http(traffic)
                .request::<Value, _>(identity.method, params)
                .await
        };
        Ok(match upstream.identity.check(identity, ask).await? {
            // What a node answered may quote the URL it was asked on: scrubbed as its errors are.
            Checked::Foreign(found) if !found.is_empty() => {
                let found = scrubbed(&found, &upstream.url);
                tracing::error!(chain = %self.name, upstream = %upstream.name, found = %found, expected = %identity.expected, method = identity.method, "an RPC URL is on another chain: it is never used");
                Checked::Foreign(found)
            }
            checked => checked,
        })
    }

    /// Asks every URL for the chain's identity now (at start). Answers each URL that is on
    /// another chain with what it answered (by name), or the error when no URL answered.
    pub async fn check_identities(&self) -> Result<Vec<(String, String)>, Unreachable> {
        let checks = self
            .upstreams
            .iter()
            .map(|u| self.identify(u, Traffic::Own));
        let (mut foreign, mut answered) = (Vec::new(), false);
        let mut last_error = String::from("no upstream URL");
        for (i, checked) in futures::future::join_all(checks)
            .await
            .into_iter()
            .enumerate()
        {
            match checked {
                Ok(Checked::Confirmed) => answered = true,
                Ok(Checked::Foreign(found)) => {
                    foreign.push((self.upstreams[i].name.clone(), found));
                    answered = true;
                }
                Err(error) => last_error = self.failed(i, &error),
            }
        }
        if !answered {
            return Err(Unreachable {
                chain: self.name.clone(),
                detail: last_error,
            });
        }
        Ok(foreign)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::AtomicUsize;

    fn identity() -> Identity {
        Identity {
            method: "getGenesisHash",
            expected: "G".to_string(),
        }
    }

    #[tokio::test]
    async fn a_url_is_asked_until_it_answers_then_never_again() {
        let state = IdentityState::default();
        let asked = AtomicUsize::new(0);
        let down = || async {
            asked.fetch_add(1, Ordering::Relaxed);
            Err(ClientError::Custom("refused".into()))
        };
        assert!(state.check(&identity(), down).await.is_err());
        let up = || async {
            asked.fetch_add(1, Ordering::Relaxed);
            Ok(json!("G"))
        };
        assert_eq!(
            state.check(&identity(), up).await.unwrap(),
            Checked::Confirmed
        );
        assert_eq!(
            state.check(&identity(), up).await.unwrap(),
            Checked::Confirmed
        );
        assert_eq!(
            asked.load(Ordering::Relaxed),
            2,
            "confirmed once, then known"
        );
        assert!(!state.foreign());
    }

    #[tokio::test]
    async fn a_url_on_another_chain_stays_refused() {
        let state = IdentityState::default();
        let other = || async { Ok(json!("H")) };
        assert_eq!(
            state.check(&identity(), other).await.unwrap(),
            Checked::Foreign("H".to_string())
        );
        assert!(state.foreign());
        let now_right = || async { Ok(json!("G")) };
        assert!(matches!(
            state.check(&identity(), now_right).await.unwrap(),
            Checked::Foreign(_)
        ));
        let odd = IdentityState::default();
        let number = || async { Ok(json!(7)) };
        assert!(matches!(
            odd.check(&identity(), number).await.unwrap(),
            Checked::Foreign(_)
        ));
    }
}
