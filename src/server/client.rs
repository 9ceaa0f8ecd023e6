//! Who a request comes from (access.md §3b): the connection's peer, or, when the peer is one of
//! `server.trusted_proxies`, the address that proxy forwarded (`X-Forwarded-For`, or
//! `Forwarded: for=`), and nothing else a client can write. Clients are counted by [`ClientId`]:
//! an IPv4 address, or an IPv6 address's /64 (one subscriber's prefix), so rotating addresses
//! within a prefix buys no fresh rate bucket or caller identity.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use http::HeaderMap;
use ipnet::IpNet;

/// The proxies whose forwarding headers are believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    pub fn new(nets: Vec<IpNet>) -> Self {
        TrustedProxies(nets)
    }

    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client of a request that reached routerd from `peer`. Through trusted proxies the
    /// forwarded chain is read from the right (the nearest hop first): the first address that
    /// is not itself a trusted proxy is the client. Anything unreadable there ends the walk at
    /// the last trusted hop, so a malformed header never makes a client of a made-up address.
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        let mut client = peer;
        for hop in forwarded_chain(headers).into_iter().rev() {
            let Some(ip) = hop else {
                return client;
            };
            client = ip;
            if !self.trusts(ip) {
                return ip;
            }
        }
        client
    }
}

/// The addresses a request was forwarded for, nearest last: `X-Forwarded-For` when present,
/// else the `for=` parameters of `Forwarded` (RFC 7239). `None` marks an entry that is not an
/// address (`unknown`, an obfuscated name, garbage).
fn forwarded_chain(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let xff: Vec<Option<IpAddr>> = headers
        .get_all("x-forwarded-for")
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(|hop| parse_hop(hop.trim()))
        .collect();
    if !xff.is_empty() {
        return xff;
    }
    headers
        .get_all(http::header::FORWARDED)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("for=?").split(','))
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (name, value) = pair.trim().split_once('=')?;
                name.eq_ignore_ascii_case("for")
                    .then(|| parse_hop(value.trim().trim_matches('"')))
            })
        })
        .collect()
}

/// One hop: `1.2.3.4`, `1.2.3.4:port`, `2001:db8::1`, or `[2001:db8::1]:port`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse() {
        return Some(ip);
    }
    if let Some(rest) = hop.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    let (host, port) = hop.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// What a client is counted by: its IPv4 address, or its IPv6 address's /64. An IPv4 address
/// mapped into IPv6 counts as the IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientId(IpAddr);

impl ClientId {
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => ClientId(ip),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => ClientId(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    ClientId(IpAddr::V6(Ipv6Addr::from(prefix)))
                }
            },
        }
    }

    pub fn ip(&self) -> IpAddr {
        self.0
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxies(nets: &[&str]) -> TrustedProxies {
        TrustedProxies::new(nets.iter().map(|n| n.parse().unwrap()).collect())
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn forwarding_headers_count_only_from_trusted_proxies() {
        let trusted = proxies(&["10.0.0.0/8"]);
        let forged = headers(&[("x-forwarded-for", "1.1.1.1")]);
        // An untrusted peer's header is ignored; without proxies every header is.
        assert_eq!(trusted.resolve(ip("9.9.9.9"), &forged), ip("9.9.9.9"));
        assert_eq!(
            TrustedProxies::default().resolve(ip("10.0.0.1"), &forged),
            ip("10.0.0.1")
        );
        assert_eq!(trusted.resolve(ip("10.0.0.1"), &forged), ip("1.1.1.1"));
    }

    #[test]
    fn the_chain_is_read_from_the_nearest_hop() {
        let trusted = proxies(&["10.0.0.0/8"]);
        // The client wrote "6.6.6.6" itself; the proxies appended what they saw.
        let chain = headers(&[("x-forwarded-for", "6.6.6.6, 2.2.2.2, 10.0.0.7")]);
        assert_eq!(trusted.resolve(ip("10.0.0.1"), &chain), ip("2.2.2.2"));
        let split = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "2.2.2.2:4711"),
        ]);
        assert_eq!(trusted.resolve(ip("10.0.0.1"), &split), ip("2.2.2.2"));
        // Garbage at the nearest hop: the last trusted hop is the client.
        let garbage = headers(&[("x-forwarded-for", "2.2.2.2, nonsense")]);
        assert_eq!(trusted.resolve(ip("10.0.0.1"), &garbage), ip("10.0.0.1"));
    }

    #[test]
    fn forwarded_for_parameters_and_ipv6_hops() {
        let trusted = proxies(&["127.0.0.1/32", "::1/128"]);
        let forwarded = headers(&[(
            "forwarded",
            r#"for=6.6.6.6;proto=https, for="[2001:db8::5]:443";by=10.0.0.1"#,
        )]);
        assert_eq!(trusted.resolve(ip("::1"), &forwarded), ip("2001:db8::5"));
        let unknown = headers(&[("forwarded", "for=unknown")]);
        assert_eq!(trusted.resolve(ip("127.0.0.1"), &unknown), ip("127.0.0.1"));
    }

    #[test]
    fn ipv6_clients_count_by_their_slash_64() {
        let a = ClientId::of(ip("2001:db8:1:2:aaaa::1"));
        let b = ClientId::of(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        let other = ClientId::of(ip("2001:db8:1:3::1"));
        assert_eq!(a, b);
        assert_ne!(a, other);
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        assert_eq!(ClientId::of(ip("::ffff:1.2.3.4")).to_string(), "1.2.3.4");
        assert_ne!(ClientId::of(ip("1.2.3.4")), ClientId::of(ip("1.2.3.5")));
    }
}
