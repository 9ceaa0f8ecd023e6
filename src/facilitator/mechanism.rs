//! What every mechanism is to the facade, in no family's words. A mechanism serves some kinds
//! of payment (x402 version, CAIP-2 namespace, scheme: `registry` lists which): it reads a
//! body in its own wire type into a [`Payment`] that verifies and settles itself, finds its
//! settlements by their status path, and lists its kinds, signers and extensions for
//! `/supported`. The transport sees only these traits.

use std::future::Future;
use std::pin::Pin;

use super::outcome::SettleError;
use super::protocol::v1::{SettleResponse, VerifyResponse};
use super::readiness::Funds;
use super::types::SupportedKind;
use crate::chain::ChainClient;
use crate::guard::Guard;
use crate::ledger::Asking;
use crate::store::StoreError;

/// An answer to come, boxed: a request holds only its own mechanism's state while it waits.
pub type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, SettleError>> + Send + 'a>>;

/// Work to come, boxed (a family's start, check or stop).
pub type Later<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A payTo as its family reads it: the CAIP-2 namespace of the family and the key's bytes (an
/// EVM address's 20, a Solana public key's 32). API keys are scoped to these.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Payee {
    pub namespace: &'static str,
    pub key: Box<[u8]>,
}

impl Payee {
    /// A payTo as an API key's `pay_to` writes it, in the first family that reads it (the
    /// families' spellings never overlap).
    pub fn parse(text: &str) -> Option<Self> {
        let families = super::registry::FAMILIES;
        families.iter().find_map(|family| (family.payee)(text))
    }
}

/// One payment, read in the wire type of the mechanism serving its kind.
pub trait Payment: Send + Sync {
    /// What the request's log line names the payment by (network|asset|from|nonce, or the
    /// family's own): never a signature or the whole body.
    fn label(&self) -> String;
    /// v2's `payment-identifier` id, or the message naming its field when it is malformed.
    fn payment_identifier(&self) -> Result<Option<&str>, String>;
    /// Who is paid, for API keys scoped to their payTo; `None` when it cannot be read.
    fn payee(&self) -> Option<Payee>;
    /// The family settle answers are counted by (`/metrics`).
    fn family(&self) -> &'static str;
    /// The verdict, in the version's names.
    fn verify(&self) -> Answer<'_, VerifyResponse>;
    /// Settled, in the version's names. `private`: the settling API key keeps the discovery
    /// listings its settlements make to keys that may settle for their payTo.
    fn settle<'a>(&'a self, asking: &'a Asking, private: bool) -> Answer<'a, SettleResponse>;
}

/// A settlement's status route, parsed: what it names, and the lookup.
pub trait StatusLookup: Send + Sync {
    /// What the request's log line names the settlement by.
    fn label(&self) -> String;
    /// The 404's message when routerd never settled it.
    fn missing(&self) -> String;
    /// The settlement as JSON, with its state for the log line; `None` if routerd never settled it.
    fn find(&self) -> Pin<Box<dyn Future<Output = Result<Option<Found>, StoreError>> + Send + '_>>;
}

/// A status route's answer body and the state its log line names.
pub struct Found {
    pub body: Vec<u8>,
    pub state: String,
}

/// A family's mechanism: it reads the kinds the registry gives it and answers their status, and
/// starts, checks and stops its own settlements' machinery.
pub trait Mechanism: Send + Sync {
    /// The CAIP-2 namespace of its networks.
    fn namespace(&self) -> &'static str;
    /// What it serves there, as (x402 version, scheme): the registry's rows.
    fn kinds(&self) -> &'static [(u64, &'static str)];
    /// What must hold before serving (its nodes are of the configured networks, its assets pay
    /// what they say), or the message naming what does not.
    fn check(&self) -> Later<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
    /// Picks up its settlements a previous run left unfinished and starts what follows them;
    /// answers how many. Call before serving.
    fn start(&self) -> Answer<'_, usize>;
    /// Hands what it holds over to other instances, at shutdown.
    fn stop(&self) -> Later<'_, ()> {
        Box::pin(async {})
    }
    /// The nodes only it reads (not the configured chains'), by name, with their clients: their
    /// upstream counts go to `/metrics`.
    fn upstreams(&self) -> Vec<(&str, &ChainClient)> {
        Vec::new()
    }
    /// The body straight into the wire type of `version` without building a JSON tree first,
    /// or `None` to read it the checked way (which reads it the same, and names the field of a
    /// failure).
    fn read_direct(&self, version: u64, bytes: &[u8]) -> Option<Box<dyn Payment + '_>>;
    /// A body already read as JSON into the wire type of `version`, field by field: a failure
    /// names the field, after `prefix` (an array settle's `[i]`).
    fn read(
        &self,
        version: u64,
        body: serde_json::Value,
        prefix: &str,
    ) -> Result<Box<dyn Payment + '_>, String>;
    /// The path of its status route under `/settlements`, as its 400 names it.
    fn status_form(&self) -> &'static str;
    /// The lookup a status path's segments name (as many as `status_form` has), or the
    /// message naming what is wrong with them.
    fn status<'a>(&'a self, segments: &[&str]) -> Result<Box<dyn StatusLookup + 'a>, String>;
    /// The kinds it serves in x402 `version` (`/supported`), with what a client needs of each.
    fn supported(&self, version: u32) -> Vec<SupportedKind>;
    /// Who sends its settlements, under its namespace's wildcard (`/supported`'s `signers`),
    /// when it serves any network in x402 v2.
    fn signers(&self) -> Option<(&'static str, Vec<String>)>;
    /// The x402 v2 extensions it implements.
    fn extensions(&self) -> Vec<&'static str> {
        Vec::new()
    }
    /// The keys that pay for its settlements, with their funds as last read (`/ready`,
    /// `/metrics`).
    fn funds(&self) -> Later<'_, Vec<Funds>> {
        Box::pin(async { Vec::new() })
    }
    /// Its background steps whose last step panicked.
    fn down(&self) -> Vec<&Guard> {
        Vec::new()
    }
    /// Who sends its settlements, each as `network:key`, for the start-up log line.
    fn senders(&self) -> Vec<String> {
        Vec::new()
    }
    /// Settle requests waiting on one of its settlements now.
    fn pending(&self) -> usize {
        0
    }
    /// Its settlements answered with success whose transaction can no longer land.
    fn lost(&self) -> u64 {
        0
    }
}
