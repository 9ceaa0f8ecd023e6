//! What a reader asks of the catalogue, in `@x402/extensions`' query parameters: the filters
//! both routes share (`type`, `payTo`, `scheme`, `network`, `extensions`), `limit` and `offset`
//! for `/discovery/resources`, and `query`, `limit` and `cursor` for `/discovery/search`.

use std::collections::HashSet;

use ethers_core::types::Address;
use serde::Serialize;

use super::entry::{Resource, Stored};
use crate::evm;
use crate::facilitator::mechanism::Payee;

/// A page when the reader names no `limit`, and the largest one.
pub const MAX_LIMIT: usize = 100;

/// Bounds on `/discovery/search`'s `query`, so that one request's work stays linear in the
/// catalogue: its words (stopwords and repeats included), each word's characters, and its bytes.
pub const MAX_QUERY_WORDS: usize = 32;
pub const MAX_WORD_CHARS: usize = 64;
pub const MAX_QUERY_BYTES: usize = 1024;

/// Words a search ignores: they would match nearly every resource.
const STOPWORDS: &[&str] = &[
    "a", "an", "and", "the", "of", "for", "to", "in", "on", "with", "or", "by", "is",
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("{0}: {1}")]
    Parameter(&'static str, &'static str),
}

/// Who reads: what an API key's scope lets it see of listings kept private by their merchant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Viewer {
    /// No API key (none configured): public listings only.
    Stranger,
    /// A key with no `pay_to` list (it may settle for anyone): every listing.
    Everything,
    /// A key scoped to these payTo addresses: public listings and private ones that pay them.
    PayTo(HashSet<Address>),
}

impl Viewer {
    /// A key scoped to `payees`: listings are of EVM payments, so its EVM payees are those it
    /// is shown private listings of.
    pub fn paying<'a>(payees: impl Iterator<Item = &'a Payee>) -> Self {
        let evm = |payee: &Payee| {
            let evm = payee.namespace == crate::facilitator::evm::exact::NAMESPACE;
            evm.then(|| Address::from_slice(&payee.key))
        };
        Viewer::PayTo(payees.filter_map(evm).collect())
    }

    pub fn sees(&self, stored: &Stored) -> bool {
        !stored.private
            || match self {
                Viewer::Stranger => false,
                Viewer::Everything => true,
                Viewer::PayTo(allowed) => allowed.contains(&stored.pay_to),
            }
    }
}

/// The filters of both routes; each one given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filters {
    kind: Option<String>,
    pay_to: Option<Address>,
    scheme: Option<String>,
    network: Option<String>,
    /// Extension keys the resource must carry (comma-separated in the query).
    extensions: Vec<String>,
}

impl Filters {
    pub fn admit(&self, resource: &Resource) -> bool {
        let accepts = |field: &str, wanted: &Option<String>| {
            wanted.as_ref().is_none_or(|wanted| {
                resource
                    .accepts
                    .iter()
                    .any(|a| a[field].as_str() == Some(wanted))
            })
        };
        let pays = self.pay_to.is_none_or(|wanted| {
            resource
                .accepts
                .iter()
                .any(|a| a["payTo"].as_str().and_then(evm::parse_address) == Some(wanted))
        });
        self.kind.as_ref().is_none_or(|k| *k == resource.kind)
            && pays
            && accepts("scheme", &self.scheme)
            && accepts("network", &self.network)
            && self
                .extensions
                .iter()
                .all(|e| resource.extensions.contains_key(e))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub filters: Filters,
    pub limit: usize,
    pub offset: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchQuery {
    pub filters: Filters,
    /// Lowercase words of `query`, without stopwords.
    pub terms: Vec<String>,
    pub limit: usize,
    /// Where the page starts: the `cursor` a previous page answered.
    pub start: usize,
}

/// The query parameters of a URL (`None`: there were none), decoded, the last of a name winning.
fn parameters(raw: Option<&str>) -> impl Fn(&str) -> Option<String> + '_ {
    move |name| {
        url::form_urlencoded::parse(raw.unwrap_or("").as_bytes())
            .filter(|(key, _)| key == name)
            .last()
            .map(|(_, value)| value.into_owned())
    }
}

fn filters(get: &impl Fn(&str) -> Option<String>) -> Result<Filters, QueryError> {
    let pay_to = match get("payTo") {
        None => None,
        Some(given) => Some(
            evm::parse_address(&given).ok_or(QueryError::Parameter("payTo", "not a 0x address"))?,
        ),
    };
    let extensions = get("extensions").unwrap_or_default();
    Ok(Filters {
        kind: get("type"),
        pay_to,
        scheme: get("scheme"),
        network: get("network"),
        extensions: extensions
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect(),
    })
}

/// A count parameter; `limit` is at least 1 and at most [`MAX_LIMIT`] (larger asks get the
/// largest page).
fn count(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: usize,
) -> Result<usize, QueryError> {
    let Some(given) = get(name) else {
        return Ok(default);
    };
    let value: usize = match given.parse() {
        Ok(value) if given.bytes().all(|b| b.is_ascii_digit()) => value,
        _ => return Err(QueryError::Parameter(name, "not a non-negative integer")),
    };
    match name {
        "limit" if value == 0 => Err(QueryError::Parameter(name, "must be at least 1")),
        "limit" => Ok(value.min(MAX_LIMIT)),
        _ => Ok(value),
    }
}

/// `GET /discovery/resources`' parameters, from the URL's query string.
pub fn list_query(raw: Option<&str>) -> Result<ListQuery, QueryError> {
    let get = parameters(raw);
    Ok(ListQuery {
        filters: filters(&get)?,
        limit: count(&get, "limit", MAX_LIMIT)?,
        offset: count(&get, "offset", 0)?,
    })
}

/// `GET /discovery/search`'s parameters: `query` needs at least one word that is not a stopword.
pub fn search_query(raw: Option<&str>) -> Result<SearchQuery, QueryError> {
    let get = parameters(raw);
    let terms = terms(&get("query").unwrap_or_default())?;
    Ok(SearchQuery {
        filters: filters(&get)?,
        terms,
        limit: count(&get, "limit", MAX_LIMIT)?,
        start: count(&get, "cursor", 0)?,
    })
}

/// The distinct lowercase words of `query` that are not stopwords, in their order, within the
/// bounds above (its size checked before anything is lowercased; repeats found in a set, so
/// that many distinct words cost no more than few).
fn terms(query: &str) -> Result<Vec<String>, QueryError> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(QueryError::Parameter("query", "at most 1024 bytes"));
    }
    let query = query.to_lowercase();
    let words = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty());
    let mut count = 0;
    let mut seen = HashSet::new();
    let mut terms = Vec::new();
    for word in words {
        count += 1;
        if count > MAX_QUERY_WORDS {
            return Err(QueryError::Parameter("query", "at most 32 words"));
        }
        if word.chars().count() > MAX_WORD_CHARS {
            return Err(QueryError::Parameter(
                "query",
                "words of at most 64 characters",
            ));
        }
        if !STOPWORDS.contains(&word) && seen.insert(word) {
            terms.push(word.to_string());
        }
    }
    if terms.is_empty() {
        return Err(QueryError::Parameter(
            "query",
            "needs at least one search word",
        ));
    }
    Ok(terms)
}

/// How many of the search's words the resource's text contains: its URL, description,
/// service name, tags, method or tool, and an MCP tool's own description.
pub fn score(terms: &[String], resource: &Resource) -> usize {
    let tool_description = resource.extensions.values().find_map(|e| {
        e.pointer("/info/input/description")
            .and_then(|d| d.as_str())
    });
    let text = [
        Some(resource.resource.as_str()),
        resource.description.as_deref(),
        resource.service_name.as_deref(),
        resource.method.as_deref(),
        resource.tool_name.as_deref(),
        tool_description,
    ]
    .into_iter()
    .flatten()
    .chain(resource.tags.iter().flatten().map(String::as_str))
    .collect::<Vec<_>>()
    .join(" ")
    .to_lowercase();
    terms.iter().filter(|t| text.contains(t.as_str())).count()
}

/// A resource as answered: `DiscoveryResource`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Listed {
    #[serde(flatten)]
    pub resource: Resource,
    /// When the settlement that listed it was made (ISO 8601).
    pub last_updated: String,
}

/// `GET /discovery/resources`: `DiscoveryResourcesResponse`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcesPage {
    pub x402_version: u8,
    pub items: Vec<Listed>,
    pub pagination: Pagination,
}

#[derive(Debug, Clone, Serialize)]
pub struct Pagination {
    pub limit: usize,
    pub offset: usize,
    pub total: usize,
}

/// `GET /discovery/search`: `SearchDiscoveryResourcesResponse`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SearchPage {
    pub x402_version: u8,
    pub resources: Vec<Listed>,
    /// More matches than this page holds: `pagination.cursor` continues.
    pub partial_results: bool,
    pub pagination: SearchPagination,
}

#[derive(Debug, Clone, Serialize)]
pub struct SearchPagination {
    pub limit: usize,
    pub cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PAY_TO: &str = "0x90F79bf6EB2c4f870365E785982E1f101E93b906";

    fn resource() -> Resource {
        serde_json::from_value(json!({
            "resource": "https://shop.example/weather", "type": "http", "method": "GET",
            "x402Version": 2,
            "accepts": [{"scheme": "exact", "network": "eip155:84532", "payTo": PAY_TO}],
            "description": "Weather report", "serviceName": "Sky Co", "tags": ["forecast"],
            "extensions": {"bazaar": {"info": {}, "schema": {}}},
        }))
        .unwrap()
    }

    #[test]
    fn filters_follow_upstreams_parameters() {
        let admitted = |raw: &str| list_query(Some(raw)).unwrap().filters.admit(&resource());
        assert!(admitted(""));
        assert!(admitted(
            "type=http&scheme=exact&network=eip155%3A84532&extensions=bazaar"
        ));
        assert!(admitted(&format!("payTo={}", PAY_TO.to_lowercase())));
        assert!(!admitted("type=mcp"));
        assert!(!admitted("scheme=upto"));
        assert!(!admitted("network=eip155:8453"));
        assert!(!admitted("extensions=bazaar,sign-in-with-x"));
        assert!(!admitted(
            "payTo=0x0000000000000000000000000000000000000001"
        ));
    }

    #[test]
    fn paging_parameters_are_bounded_and_checked() {
        let query = list_query(Some("limit=2&offset=3")).unwrap();
        assert_eq!((query.limit, query.offset), (2, 3));
        let query = list_query(None).unwrap();
        assert_eq!((query.limit, query.offset), (MAX_LIMIT, 0));
        assert_eq!(list_query(Some("limit=1000")).unwrap().limit, MAX_LIMIT);
        for bad in ["limit=0", "limit=-1", "offset=x", "limit=+2", "payTo=shop"] {
            assert!(list_query(Some(bad)).is_err(), "{bad}");
        }
        assert_eq!(
            list_query(Some("limit=0")).unwrap_err().to_string(),
            "limit: must be at least 1"
        );
    }

    #[test]
    fn searches_count_the_words_a_resource_contains() {
        let query = search_query(Some("query=The+weather+FORECAST+api&cursor=2")).unwrap();
        assert_eq!(query.terms, ["weather", "forecast", "api"]);
        assert_eq!(query.start, 2);
        assert_eq!(score(&query.terms, &resource()), 2);
        let query = search_query(Some("query=sky")).unwrap();
        assert_eq!(score(&query.terms, &resource()), 1);
        for bad in [None, Some("query="), Some("query=the+of"), Some("limit=3")] {
            assert!(search_query(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn repeated_words_count_once_in_their_first_place() {
        let query = search_query(Some("query=Weather+forecast+WEATHER+the+weather+sky")).unwrap();
        assert_eq!(query.terms, ["weather", "forecast", "sky"]);
        assert_eq!(score(&query.terms, &resource()), 3);
    }

    #[test]
    fn a_query_at_the_bounds_is_searched_and_one_past_them_names_the_query() {
        // 32 words, one of 64 characters, 1,024 bytes in all: every bound reached, none passed.
        let long = "w".repeat(MAX_WORD_CHARS - 7);
        let mut words: Vec<String> = vec![format!("weather{long}"), "forecast".into()];
        words.extend((words.len()..MAX_QUERY_WORDS).map(|i| format!("x{i:02}")));
        let mut query = words.join(" ");
        query.push_str(&" ".repeat(MAX_QUERY_BYTES - query.len()));
        assert_eq!(query.len(), MAX_QUERY_BYTES);
        let at = search_query(Some(&format!("query={query}"))).unwrap();
        assert_eq!(at.terms.len(), MAX_QUERY_WORDS);
        assert_eq!(score(&at.terms, &resource()), 1, "forecast");

        let error = |raw: String| search_query(Some(&raw)).unwrap_err().to_string();
        let words = |n: usize| vec!["sky"; n].join("+");
        assert_eq!(
            error(format!("query={}", words(33))),
            "query: at most 32 words"
        );
        let distinct: Vec<String> = (0..15_800).map(|i| format!("w{i}")).collect();
        assert_eq!(
            error(format!("query={}", distinct.join("+"))),
            "query: at most 1024 bytes"
        );
        assert_eq!(
            error(format!("query={}", "w".repeat(MAX_WORD_CHARS + 1))),
            "query: words of at most 64 characters"
        );
        // Characters, not bytes: 64 two-byte letters are one word within the bound.
        assert!(search_query(Some(&format!("query={}", "é".repeat(MAX_WORD_CHARS)))).is_ok());
        let bytes = format!("query=sky{}", "+".repeat(MAX_QUERY_BYTES));
        assert_eq!(error(bytes), "query: at most 1024 bytes");
    }

    #[test]
    fn private_listings_are_seen_by_keys_that_may_settle_for_them() {
        let stored = |private| Stored {
            resource: resource(),
            pay_to: PAY_TO.parse().unwrap(),
            private,
        };
        let mine = Viewer::PayTo(HashSet::from([PAY_TO.parse().unwrap()]));
        let other = Viewer::PayTo(HashSet::from([Address::repeat_byte(1)]));
        for viewer in [&Viewer::Stranger, &Viewer::Everything, &mine, &other] {
            assert!(viewer.sees(&stored(false)));
        }
        assert!(mine.sees(&stored(true)) && Viewer::Everything.sees(&stored(true)));
        assert!(!other.sees(&stored(true)) && !Viewer::Stranger.sees(&stored(true)));
    }
}
