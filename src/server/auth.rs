//! API keys (access.md §5): bearer tokens known only by their SHA-256, each with the payTo
//! addresses it may verify and settle for (EVM addresses and Solana public keys) and a token
//! bucket. Read at start (a bad file stops the start) and again on SIGHUP (a bad file then keeps
//! the keys in use).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::client::ClientId;
use super::wire_errors::WireError;
use crate::facilitator::discovery::query::Viewer;
use crate::facilitator::Payee;

#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("auth.api_keys_file: cannot read {0}: {1}")]
    Read(String, String),
    #[error("auth.api_keys_file: {0}")]
    Parse(String),
    #[error("auth.api_keys_file: keys.{0}.{1}")]
    Entry(String, &'static str),
}

/// The file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    keys: BTreeMap<String, KeyEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    sha256: String,
    #[serde(default)]
    pay_to: Option<Vec<String>>,
    #[serde(default)]
    rate_per_sec: Option<u32>,
    #[serde(default)]
    burst: Option<u32>,
    #[serde(default)]
    discovery: Listings,
}

/// Who may read the discovery listings a key's settlements make.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Listings {
    /// Every caller of the discovery routes.
    #[default]
    Public,
    /// Only keys that may settle for the listing's payTo (this key's `pay_to`, which it needs).
    Private,
}

/// One caller.
pub struct Key {
    pub name: String,
    /// `None`: any payTo.
    pay_to: Option<HashSet<Payee>>,
    limiter: Option<DefaultDirectRateLimiter>,
    /// Its settlements' discovery listings are kept to keys that may settle for their payTo.
    private_listings: bool,
}

impl Key {
    /// Whether this key may verify and settle payments to `pay_to`.
    pub fn may_pay(&self, pay_to: Option<Payee>) -> bool {
        match (&self.pay_to, pay_to) {
            (None, _) => true,
            (Some(allowed), Some(to)) => allowed.contains(&to),
            (Some(_), None) => false,
        }
    }

    /// Whether the key names the payTos it may settle for (`pay_to`).
    pub fn is_scoped(&self) -> bool {
        self.pay_to.is_some()
    }

    /// Whether the discovery listings this key's settlements make are private.
    pub fn private_listings(&self) -> bool {
        self.private_listings
    }

    /// What this key is shown of private discovery listings: those whose payTo it may settle
    /// for (listings are of EVM payments only).
    pub fn viewer(&self) -> Viewer {
        match &self.pay_to {
            None => Viewer::Everything,
            Some(pay_to) => Viewer::paying(pay_to.iter()),
        }
    }

    /// Takes `calls` tokens from the key's bucket, or answers 429 with when to come back.
    pub fn admit(&self, calls: u32) -> Result<(), WireError> {
        let (Some(limiter), Some(calls)) = (&self.limiter, NonZeroU32::new(calls)) else {
            return Ok(());
        };
        let wait = match limiter.check_n(calls) {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(not_until)) => not_until.wait_time_from(DefaultClock::default().now()),
            // More calls in one request than the burst: never admitted; back in a second.
            Err(_) => std::time::Duration::from_secs(1),
        };
        Err(too_many(
            format!("API key {:?} is over its rate; retry later", self.name),
            wait,
        ))
    }

    pub fn forbidden(&self) -> WireError {
        WireError::new(
            StatusCode::FORBIDDEN,
            403,
            format!(
                "API key {:?} may not verify or settle for this payTo",
                self.name
            ),
        )
    }
}

/// Without API keys: a token bucket per client (`server.client_rate_per_sec`): an IPv4
/// address, or an IPv6 /64.
pub struct ClientLimit {
    limiter: DefaultKeyedRateLimiter<ClientId>,
}

impl ClientLimit {
    /// `None` when no rate is configured.
    pub fn new(rate_per_sec: Option<u32>, burst: Option<u32>) -> Option<Self> {
        let rate = NonZeroU32::new(rate_per_sec?)?;
        let burst = burst.and_then(NonZeroU32::new).unwrap_or(rate);
        Some(Self {
            limiter: RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)),
        })
    }

    /// Takes `calls` tokens from `client`'s bucket, or answers 429 with when to come back.
    pub fn admit(&self, client: ClientId, calls: u32) -> Result<(), WireError> {
        let Some(calls) = NonZeroU32::new(calls) else {
            return Ok(());
        };
        // Buckets of clients that went quiet are full again: forget them.
        if self.limiter.len() > CLIENTS_KEPT {
            self.limiter.retain_recent();
        }
        let wait = match self.limiter.check_key_n(&client, calls) {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(not_until)) => not_until.wait_time_from(DefaultClock::default().now()),
            Err(_) => std::time::Duration::from_secs(1),
        };
        Err(too_many(
            "this client is over server.client_rate_per_sec; retry later".to_string(),
            wait,
        ))
    }
}

/// Client buckets kept before the idle ones are dropped.
const CLIENTS_KEPT: usize = 10_000;

fn too_many(message: String, wait: std::time::Duration) -> WireError {
    let mut error = WireError::new(StatusCode::TOO_MANY_REQUESTS, 429, message);
    error.retry_after_secs = Some(wait.as_secs_f64().ceil().max(1.0) as u64);
    error
}

/// The keys in use, by SHA-256 of their token.
pub struct Keys {
    path: PathBuf,
    by_digest: RwLock<Arc<HashMap<[u8; 32], Arc<Key>>>>,
}

impl Keys {
    pub fn load(path: &Path) -> Result<Self, KeysError> {
        Ok(Self {
            by_digest: RwLock::new(Arc::new(read(path)?)),
            path: path.to_path_buf(),
        })
    }

    /// Reads the file again; on failure the keys in use stay. Answers how many keys there are.
    pub fn reload(&self) -> Result<usize, KeysError> {
        let keys = read(&self.path)?;
        let count = keys.len();
        *self.by_digest.write().expect("keys lock") = Arc::new(keys);
        Ok(count)
    }

    pub fn count(&self) -> usize {
        self.by_digest.read().expect("keys lock").len()
    }

    /// The caller of a request, from its `Authorization: Bearer <token>` header, or 401.
    pub fn caller(&self, headers: &HeaderMap) -> Result<Arc<Key>, WireError> {
        let unauthorized =
            |message: &str| WireError::new(StatusCode::UNAUTHORIZED, 401, message.to_string());
        let token = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| unauthorized("Authorization: Bearer <API key> is required"))?;
        let digest: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
        let keys = self.by_digest.read().expect("keys lock").clone();
        keys.get(&digest)
            .cloned()
            .ok_or_else(|| unauthorized("Authorization: unknown API key"))
    }
}

fn read(path: &Path) -> Result<HashMap<[u8; 32], Arc<Key>>, KeysError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| KeysError::Read(path.display().to_string(), e.kind().to_string()))?;
    let file: KeysFile =
        toml::from_str(&text).map_err(|e| KeysError::Parse(e.message().to_string()))?;
    let mut keys = HashMap::new();
    for (name, entry) in file.keys {
        let (digest, key) = key_of(&name, entry)?;
        if keys.insert(digest, Arc::new(key)).is_some() {
            return Err(KeysError::Entry(
                name,
                "sha256: the same token as another key",
            ));
        }
    }
    Ok(keys)
}

fn key_of(name: &str, entry: KeyEntry) -> Result<([u8; 32], Key), KeysError> {
    let bad = |what: &'static str| KeysError::Entry(name.to_string(), what);
    let digest: [u8; 32] = const_hex::decode(entry.sha256.trim())
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| bad("sha256: not 64 hex digits"))?;
    let pay_to = entry
        .pay_to
        .map(|list| {
            list.iter()
                .map(|a| {
                    Payee::parse(a).ok_or_else(|| {
                        bad("pay_to: an entry is neither a 0x address nor a base58 Solana public key")
                    })
                })
                .collect::<Result<HashSet<_>, _>>()
        })
        .transpose()?;
    let limiter = match (entry.rate_per_sec, entry.burst) {
        (None, None) => None,
        (rate, burst) => {
            let rate = NonZeroU32::new(rate.unwrap_or(0))
                .ok_or_else(|| bad("rate_per_sec: must be at least 1"))?;
            let burst = NonZeroU32::new(burst.unwrap_or(rate.get()))
                .ok_or_else(|| bad("burst: must be at least 1"))?;
            Some(RateLimiter::direct(
                Quota::per_second(rate).allow_burst(burst),
            ))
        }
    };
    let private_listings = entry.discovery == Listings::Private;
    if private_listings && pay_to.is_none() {
        return Err(bad(
            "discovery: \"private\" keeps listings to a payTo scope: set pay_to",
        ));
    }
    let key = Key {
        name: name.to_string(),
        pay_to,
        limiter,
        private_listings,
    };
    Ok((digest, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh public key in base58, as an API key file writes a Solana payee.
    fn new_unique() -> String {
        crate::svm::Pubkey::new_unique().to_string()
    }

    fn file(name: &str, body: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("routerd-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        path
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        headers
    }

    fn sha(token: &str) -> String {
        const_hex::encode(Sha256::digest(token.as_bytes()))
    }

    #[test]
    fn a_token_is_known_by_its_digest_scoped_to_its_pay_to_and_rate() {
        let body = format!(
            "[keys.shop-a]\nsha256 = \"{}\"\npay_to = [\"0x90F79bf6EB2c4f870365E785982E1f101E93b906\"]\nrate_per_sec = 1\nburst = 2\n",
            sha("token-a")
        );
        let keys = Keys::load(&file("a.toml", &body)).unwrap();
        let refused = |headers: HeaderMap| keys.caller(&headers).err().map(|e| e.code);
        assert_eq!(refused(HeaderMap::new()), Some(401));
        assert_eq!(refused(bearer("other")), Some(401));
        let key = keys.caller(&bearer("token-a")).unwrap();
        assert_eq!(key.name, "shop-a");
        assert!(key.may_pay(Payee::parse("0x90f79bf6eb2c4f870365e785982e1f101e93b906")));
        assert!(!key.may_pay(Payee::parse("0x0000000000000000000000000000000000000001")));
        assert!(key.admit(0).is_ok() && key.admit(1).is_ok() && key.admit(1).is_ok());
        let over = key.admit(1).unwrap_err();
        assert_eq!((over.code, over.retry_after_secs), (429, Some(1)));
    }

    #[test]
    fn a_scope_holds_solana_payees_by_their_public_key() {
        let (ours, other) = (new_unique(), new_unique());
        let evm = "0x90F79bf6EB2c4f870365E785982E1f101E93b906";
        let body = format!(
            "[keys.shop]\nsha256 = \"{}\"\npay_to = [\"{ours}\", \"{evm}\"]\n",
            sha("token-s")
        );
        let keys = Keys::load(&file("svm.toml", &body)).unwrap();
        let key = keys.caller(&bearer("token-s")).unwrap();
        assert!(key.may_pay(Payee::parse(&ours)));
        assert!(!key.may_pay(Payee::parse(&other)));
        assert!(key.may_pay(Payee::parse(evm)));
        let read = Payee::parse(&ours).unwrap();
        assert_eq!(read.key.len(), 32);
        // Discovery listings are of EVM payments: the key is shown those of its EVM payee.
        assert!(matches!(key.viewer(), Viewer::PayTo(evm) if evm.len() == 1));
        for bad in ["0x12", "not-a-key", "1111", "0OIl"] {
            let body = format!(
                "[keys.x]\nsha256 = \"{}\"\npay_to = [\"{bad}\"]\n",
                sha("t")
            );
            let error = Keys::load(&file("bad-payee.toml", &body)).err().unwrap();
            assert!(error.to_string().contains("keys.x.pay_to"), "{error}");
        }
    }

    #[test]
    fn each_client_address_has_its_own_bucket() {
        assert!(ClientLimit::new(None, Some(5)).is_none());
        let limit = ClientLimit::new(Some(1), Some(2)).unwrap();
        let id = |ip: &str| ClientId::of(ip.parse().unwrap());
        let (a, b) = (id("10.0.0.1"), id("10.0.0.2"));
        assert!(limit.admit(a, 2).is_ok());
        let over = limit.admit(a, 1).unwrap_err();
        assert_eq!((over.code, over.retry_after_secs), (429, Some(1)));
        assert!(limit.admit(b, 1).is_ok(), "another client is not held back");
        assert!(limit.admit(a, 0).is_ok());
        // An IPv6 client rotating within its /64 keeps one bucket.
        assert!(limit.admit(id("2001:db8::1"), 2).is_ok());
        assert!(limit.admit(id("2001:db8::2"), 1).is_err());
    }

    #[test]
    fn a_bad_file_names_what_is_wrong_and_a_reload_keeps_the_keys_in_use() {
        let bad = file("bad.toml", "[keys.x]\nsha256 = \"00\"\n");
        assert!(matches!(Keys::load(&bad), Err(KeysError::Entry(_, _))));
        let path = file(
            "reload.toml",
            &format!("[keys.a]\nsha256 = \"{}\"\n", sha("t")),
        );
        let keys = Keys::load(&path).unwrap();
        std::fs::write(&path, "not toml [").unwrap();
        assert!(keys.reload().is_err());
        assert!(keys.caller(&bearer("t")).is_ok());
        std::fs::write(&path, format!("[keys.b]\nsha256 = \"{}\"\n", sha("u"))).unwrap();
        assert_eq!(keys.reload().unwrap(), 1);
        assert!(keys.caller(&bearer("t")).is_err());
        assert_eq!(keys.caller(&bearer("u")).unwrap().name, "b");
    }
}
