//! Which mechanism serves which kind of payment: one table, keyed by (x402 version, CAIP-2
//! namespace, scheme), looked up once per request. A new scheme or family is its rooms and a
//! line here.
//!
//! A network names its namespace: a name of a family's own spelling (a Solana cluster's, served
//! or not) that family's, another CAIP-2 id by its prefix, another x402 v1 name the first
//! family's. A kind no mechanism serves goes to its namespace's mechanism, whose rules refuse its
//! network, version or scheme in that family's words (`invalid_network` for a cluster not
//! served), and a network of no served namespace to the first family's, as unserved.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use super::deny_list::DenyLists;
use super::discovery::Catalogue;
use super::evm::exact as evm;
use super::mechanism::{Mechanism, Payee, Payment, StatusLookup};
use super::settlement::answer_times::AnswerTimes;
use super::settlement::cooldown::Cooldown;
use super::svm::mechanism as svm;
use super::SetupError;
use crate::chain::Chain;
use crate::config::{FacilitatorSettings, Settings};
use crate::signer::{load_authorizer, Authorizer};
use crate::store::Storage;

/// A family as routerd knows it before any is configured: how an API key's `pay_to` entry and
/// an x402 v1 network name read in its spelling, and how the configuration makes its mechanisms.
pub struct Declared {
    /// An API key's `pay_to` entry as this family reads it, if it does.
    pub payee: fn(&str) -> Option<Payee>,
    /// This family's namespace for a network name of its own spelling, served or not (its body
    /// is then read in its shape, and refused by its rules).
    pub names: fn(&str) -> Option<&'static str>,
    /// Its mechanisms as `Setup` configures them: the family's own first (it serves the
    /// family's status route and refuses what no mechanism of it serves), then its further
    /// schemes'. It loads its own keys and reads its own sections.
    pub build: fn(&Setup) -> Built,
}

/// A family's mechanisms as built, its own first.
pub type Built = Result<Vec<Arc<dyn Mechanism>>, SetupError>;

/// Every family routerd has, in the order their status routes are named and their readings
/// tried; the first one's rules refuse a network no family names. A new family is its rooms
/// and a line here.
pub(crate) static FAMILIES: &[Declared] = &[evm::DECLARED, svm::DECLARED];

/// What every family builds its mechanisms from: the configuration, the connected chains of
/// `[chains]`, and what the families' settlements share. The deny list and the receiver
/// authorizer are read from their files when first asked for, so that a family's own keys are
/// read before them and a missing key is the error named first (as the daemon always named it).
pub struct Setup<'a> {
    pub settings: &'a Settings,
    pub facilitator: &'a FacilitatorSettings,
    pub chains: &'a BTreeMap<String, Arc<Chain>>,
    pub store: &'a Storage,
    /// Payers refused after a settlement of theirs reverted.
    pub cooldown: &'a Arc<Cooldown>,
    /// Where every family counts its block-to-answer times.
    pub answer_times: &'a AnswerTimes,
    /// The discovery catalogue, when on.
    pub catalogue: &'a Option<Arc<Catalogue>>,
    deny_list: OnceLock<Arc<DenyLists>>,
    receiver_authorizer: OnceLock<Option<Arc<Authorizer>>>,
}

impl<'a> Setup<'a> {
    pub fn new(
        settings: &'a Settings,
        facilitator: &'a FacilitatorSettings,
        chains: &'a BTreeMap<String, Arc<Chain>>,
        store: &'a Storage,
        shared: (
            &'a Arc<Cooldown>,
            &'a AnswerTimes,
            &'a Option<Arc<Catalogue>>,
        ),
    ) -> Self {
        let (cooldown, answer_times, catalogue) = shared;
        Setup {
            settings,
            facilitator,
            chains,
            store,
            cooldown,
            answer_times,
            catalogue,
            deny_list: OnceLock::new(),
            receiver_authorizer: OnceLock::new(),
        }
    }

    /// `facilitator.deny_list_file`, which every family reads; read once.
    pub fn deny_list(&self) -> Result<Arc<DenyLists>, SetupError> {
        if let Some(lists) = self.deny_list.get() {
            return Ok(lists.clone());
        }
        let (lists, summary) = DenyLists::load(&self.facilitator.deny_list_file)?;
        if lists.configured() {
            tracing::info!("facilitator.deny_list_file: {summary}");
        }
        Ok(self.deny_list.get_or_init(|| Arc::new(lists)).clone())
    }

    /// `facilitator.receiver_authorizer_key_file`'s key, when configured; read once. Not a
    /// signer: it signs authorizations, never a transaction, and gets no lane.
    pub fn receiver_authorizer(&self) -> Result<Option<Arc<Authorizer>>, SetupError> {
        if let Some(key) = self.receiver_authorizer.get() {
            return Ok(key.clone());
        }
        let key = load_authorizer(&self.facilitator.receiver_authorizer_key_file)?;
        Ok(self
            .receiver_authorizer
            .get_or_init(|| key.map(Arc::new))
            .clone())
    }
}

/// A kind of payment a mechanism serves.
struct Kind {
    version: u64,
    namespace: &'static str,
    scheme: &'static str,
}

pub struct Registry {
    kinds: Vec<(Kind, Arc<dyn Mechanism>)>,
    /// One mechanism per family, in the order their status routes are named.
    families: Vec<Arc<dyn Mechanism>>,
    /// Every mechanism once: the families', then the schemes served beside them.
    mechanisms: Vec<Arc<dyn Mechanism>>,
}

impl Registry {
    /// The table of every family's mechanisms `setup` configures, in `FAMILIES`' order.
    pub fn configured(setup: &Setup) -> Result<Self, SetupError> {
        let built = FAMILIES.iter().map(|family| (family.build)(setup));
        Ok(Self::new(built.collect::<Result<_, _>>()?))
    }

    /// The table of `built`, each family's mechanisms with its own first: the families' come
    /// first (they serve their status routes), then their further schemes' (found by their
    /// family's route), each serving the kinds it lists.
    fn new(built: Vec<Vec<Arc<dyn Mechanism>>>) -> Self {
        let families: Vec<_> = built.iter().filter_map(|b| b.first()).cloned().collect();
        let schemes = built.iter().flat_map(|b| b.iter().skip(1));
        let mechanisms: Vec<_> = families.iter().chain(schemes).cloned().collect();
        let kinds = mechanisms
            .iter()
            .flat_map(|m| {
                m.kinds().iter().map(|&(version, scheme)| {
                    let namespace = m.namespace();
                    let kind = Kind {
                        version,
                        namespace,
                        scheme,
                    };
                    (kind, m.clone())
                })
            })
            .collect();
        Registry {
            kinds,
            families,
            mechanisms,
        }
    }

    /// The mechanism serving a payment of `version` on `network` in `scheme`, as its body names
    /// them (absent when the body names none, or not as a string).
    pub fn lookup(
        &self,
        version: u64,
        network: Option<&str>,
        scheme: Option<&str>,
    ) -> &dyn Mechanism {
        let namespace = network.map(namespace_of);
        let same = |k: &Kind| k.version == version && Some(k.namespace) == namespace;
        let served = self.kinds.iter();
        let found = served
            .clone()
            .find(|(k, _)| same(k) && Some(k.scheme) == scheme)
            .or_else(|| served.clone().find(|(k, _)| same(k)))
            .or_else(|| served.clone().find(|(k, _)| k.version == version));
        let (_, mechanism) = found.unwrap_or(&self.kinds[0]);
        mechanism.as_ref()
    }

    /// Each family's mechanism, once.
    pub fn families(&self) -> impl Iterator<Item = &dyn Mechanism> {
        self.families.iter().map(|m| m.as_ref())
    }

    /// Every mechanism, once: each lists its own kinds in `/supported`, and starts, checks and
    /// stops its own machinery.
    pub fn mechanisms(&self) -> impl Iterator<Item = &dyn Mechanism> {
        self.mechanisms.iter().map(|m| m.as_ref())
    }

    /// The settlement a status path (after `/settlements/`) names, by the family whose route
    /// has as many segments; a path of no family's shape is told every route.
    pub fn status(&self, path: &str) -> Result<Box<dyn StatusLookup + '_>, String> {
        let segments: Vec<&str> = path.split('/').collect();
        let length = |form: &str| form.split('/').count() - 2;
        let family = self
            .families
            .iter()
            .find(|m| length(m.status_form()) == segments.len());
        match family {
            Some(mechanism) => mechanism.status(&segments),
            None => {
                let forms: Vec<&str> = self.families.iter().map(|m| m.status_form()).collect();
                Err(format!("path: expected {}", forms.join(" or ")))
            }
        }
    }

    /// A body read the checked way by the mechanism serving its kind.
    pub fn read(
        &self,
        version: u64,
        body: serde_json::Value,
        prefix: &str,
    ) -> Result<Box<dyn Payment + '_>, String> {
        let requirements = |field: &str| {
            let value = body.pointer(&format!("/paymentRequirements/{field}"));
            value.and_then(|v| v.as_str()).map(str::to_string)
        };
        let (network, scheme) = (requirements("network"), requirements("scheme"));
        let mechanism = self.lookup(version, network.as_deref(), scheme.as_deref());
        mechanism.read(version, body, prefix)
    }
}

/// A body speaking version 2 is read as v2 where v2 is served; every other body is read as v1,
/// whose rule 1 refuses versions other than 1.
pub fn read_as(version: Option<u64>, serves_v2: bool) -> u64 {
    match version == Some(2) && serves_v2 {
        true => 2,
        false => 1,
    }
}

/// What a body says of its kind, read without building a JSON tree: its top-level
/// `x402Version` and its requirements' network and scheme.
pub struct Peek {
    pub version: u64,
    pub network: Option<String>,
    pub scheme: Option<String>,
}

/// The kind of a body that may be read straight into its wire type: one with no `[` anywhere
/// (it cannot hold an array where an object belongs, which serde's derive would otherwise read
/// as a tuple of fields) that says its version at the top level, as a number (then it is the
/// version `protocol::version_of` reads).
pub fn peek(bytes: &[u8]) -> Option<Peek> {
    #[derive(serde::Deserialize)]
    struct Kind {
        #[serde(rename = "x402Version")]
        version: Option<u64>,
        #[serde(rename = "paymentRequirements")]
        requirements: Option<Requirements>,
    }
    #[derive(serde::Deserialize)]
    struct Requirements {
        network: Option<String>,
        scheme: Option<String>,
    }
    if bytes.contains(&b'[') {
        return None;
    }
    let kind = serde_json::from_slice::<Kind>(bytes).ok()?;
    let (network, scheme) = kind
        .requirements
        .map_or((None, None), |r| (r.network, r.scheme));
    Some(Peek {
        version: kind.version?,
        network,
        scheme,
    })
}

/// The CAIP-2 namespace of a network named by its CAIP-2 id or by its x402 v1 name. A name of
/// a family's spelling (a Solana cluster's) is that family's whether or not the network is
/// served or known, so that its body is read in that family's shape and refused as
/// `invalid_network`, not as a malformed payload of another family.
pub fn namespace_of(network: &str) -> &str {
    if let Some(namespace) = FAMILIES.iter().find_map(|f| (f.names)(network)) {
        return namespace;
    }
    match network.split_once(':') {
        Some((namespace, _)) => namespace,
        None => evm::NAMESPACE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facilitator::evm::exact::EvmRequest;
    use crate::facilitator::protocol::version_of;
    use crate::facilitator::svm::wire::SvmRequest;

    const V1: &str = r#"{"x402Version":1,"paymentPayload":{"x402Version":1,"scheme":"exact","network":"base","payload":{"signature":"0x01","authorization":{"from":"0xa","to":"0xb","value":"1","validAfter":"0","validBefore":"9","nonce":"0xc"}}},"paymentRequirements":{"scheme":"exact","network":"base","maxAmountRequired":"1","resource":"https://r","description":"d \"q\"","mimeType":"m","payTo":"0xb","maxTimeoutSeconds":60,"asset":"0xd","extra":{"name":"USDC","version":"2"}}}"#;
    const V2: &str = r#"{"x402Version":2,"paymentPayload":{"x402Version":2,"resource":{"url":"https://r"},"accepted":{"scheme":"exact","network":"eip155:8453","amount":"1","asset":"0xd","payTo":"0xb","maxTimeoutSeconds":60},"payload":{"signature":"0x01","authorization":{"from":"0xa","to":"0xb","value":"1","validAfter":"0","validBefore":"9","nonce":"0xc"}}},"paymentRequirements":{"scheme":"exact","network":"eip155:8453","amount":"1","asset":"0xd","payTo":"0xb","maxTimeoutSeconds":60}}"#;

    /// What the checked path makes of an EVM body, as text to compare.
    fn checked(serves_v2: bool, body: &str) -> Result<String, String> {
        let value: serde_json::Value = serde_json::from_str(body).map_err(|e| e.to_string())?;
        let version = read_as(version_of(&value), serves_v2);
        EvmRequest::read(version, value, "").map(|p| format!("{p:?}"))
    }

    /// What the direct path makes of it, where the facade would take it.
    fn direct(serves_v2: bool, body: &str) -> Option<String> {
        let kind = peek(body.as_bytes())?;
        if kind.network.as_deref().map(namespace_of) == Some(svm::NAMESPACE) {
            return None;
        }
        let version = read_as(Some(kind.version), serves_v2);
        EvmRequest::read_direct(version, body.as_bytes()).map(|p| format!("{p:?}"))
    }

    #[test]
    fn a_network_names_its_family() {
        assert_eq!(namespace_of("eip155:8453"), evm::NAMESPACE);
        assert_eq!(namespace_of("base"), evm::NAMESPACE);
        assert_eq!(
            namespace_of("solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"),
            svm::NAMESPACE
        );
        // v1's names of Solana's spelling, known, served or not: Solana's rules refuse an
        // unserved one as `invalid_network`
        assert_eq!(namespace_of("solana-devnet"), svm::NAMESPACE);
        assert_eq!(namespace_of("solana"), svm::NAMESPACE);
        assert_eq!(namespace_of("solana-testnet"), svm::NAMESPACE);
        assert_eq!(namespace_of("solana-x:y"), svm::NAMESPACE);
        // other names are not Solana's: the first family's rules refuse them as unserved
        assert_eq!(namespace_of("solanas"), evm::NAMESPACE);
        assert_eq!(namespace_of("cosmos:hub"), "cosmos");
    }

    #[test]
    fn a_solana_body_is_read_in_solanas_shape() {
        let v2 = r#"{"x402Version":2,"paymentPayload":{"x402Version":2,"accepted":{"scheme":"exact","network":"solana:x","amount":"1","asset":"m","payTo":"p","maxTimeoutSeconds":60},"payload":{"transaction":"AA=="}},"paymentRequirements":{"scheme":"exact","network":"solana:x","amount":"1","asset":"m","payTo":"p","maxTimeoutSeconds":60}}"#;
        assert!(direct(true, v2).is_none());
        let read = SvmRequest::read(2, serde_json::from_str(v2).unwrap(), "").unwrap();
        assert!(matches!(read, SvmRequest::V2(_)));
        let v1 = V1.replace("\"network\":\"base\"", "\"network\":\"solana-devnet\"");
        let error = SvmRequest::read(1, serde_json::from_str(&v1).unwrap(), "").unwrap_err();
        assert_eq!(error, "paymentPayload.payload.transaction: missing");
    }

    #[test]
    fn the_direct_read_agrees_with_the_checked_one_or_declines() {
        let bodies = [
            V1.to_string(),
            V2.to_string(),
            // duplicate keys: the checked read keeps the last one, the direct one declines
            V1.replacen(r#""x402Version":1,"#, r#""x402Version":2,"x402Version":1,"#, 1),
            // versions that are not a top-level number are for the checked read
            V2.replacen(r#""x402Version":2,"#, "", 1),
            V2.replacen(r#""x402Version":2"#, r#""x402Version":null"#, 1),
            V1.replacen(r#""x402Version":1"#, r#""x402Version":"1""#, 1),
            V1.replacen(r#""x402Version":1"#, r#""x402Version":1.0"#, 1),
            // an object given as an array, which serde's derive would read as a tuple
            V1.replacen(
                r#""authorization":{"from":"0xa","to":"0xb","value":"1","validAfter":"0","validBefore":"9","nonce":"0xc"}"#,
                r#""authorization":["0xa","0xb","1","0","9","0xc"]"#,
                1,
            ),
            // a `[` in a string: the direct read declines what it cannot tell apart
            V1.replacen(r#"\"q\""#, "[q]", 1),
            V1.replacen(r#""value":"1""#, r#""value":1"#, 1),
            V1.replacen(r#""payTo":"0xb","#, "", 1),
            format!("{V1} x"),
            "7".to_string(),
            "{}".to_string(),
        ];
        let mut direct_reads = 0;
        for body in &bodies {
            for serves_v2 in [false, true] {
                let Some(read) = direct(serves_v2, body) else {
                    continue;
                };
                direct_reads += 1;
                assert_eq!(Ok(read), checked(serves_v2, body), "{body}");
            }
        }
        // V1 with and without v2 served, V2 where v2 is served, and no other body
        assert_eq!(direct_reads, 3);
        let tuple = &bodies[7];
        assert!(direct(true, tuple).is_none());
        assert_eq!(
            checked(true, tuple).unwrap_err(),
            "paymentPayload.payload.authorization: invalid type: array, expected an object"
        );
    }
}
