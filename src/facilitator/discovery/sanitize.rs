//! The bazaar specification's soft-drop rules for what a payer echoes from the resource server
//! (`serviceName`, `tags`, `iconUrl` on `resource`; `routeTemplate` on the extension), as
//! `@x402/extensions` applies them: a field that breaks its rule is dropped, the rest is kept.
//! The payer is a stranger here: these fields reach every agent that reads the catalogue.

use serde_json::Value;
use url::{Host, Url};

const MAX_SERVICE_NAME_LEN: usize = 32;
const MAX_TAG_LEN: usize = 32;
const MAX_TAGS: usize = 5;
const MAX_ICON_URL_LEN: usize = 2048;
/// How many times a route template is percent-decoded before its `..` and `://` checks
/// (upstream's bound: `%252e` hides `%2e` hides `.`).
const MAX_DECODE_PASSES: usize = 5;
const LOOPBACK_HOSTNAMES: &[&str] = &[
    "localhost",
    "localhost.localdomain",
    "ip6-localhost",
    "ip6-loopback",
];

/// Printable ASCII only (U+0020..U+007E): lengths count the same in every SDK, and no control
/// or look-alike character reaches a catalogue's reader.
fn printable_ascii(value: &str, max_len: usize) -> bool {
    (1..=max_len).contains(&value.len()) && value.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// `serviceName`, when it keeps to its rule.
pub fn service_name(value: Option<&Value>) -> Option<String> {
    let name = value?.as_str()?;
    printable_ascii(name, MAX_SERVICE_NAME_LEN).then(|| name.to_string())
}

/// `tags`: the first five valid entries, deduplicated case-insensitively (first wins); `None`
/// when none is left.
pub fn tags(value: Option<&Value>) -> Option<Vec<String>> {
    let mut kept: Vec<String> = Vec::new();
    for tag in value?.as_array()?.iter().filter_map(Value::as_str) {
        if !printable_ascii(tag, MAX_TAG_LEN) || kept.iter().any(|k| k.eq_ignore_ascii_case(tag)) {
            continue;
        }
        kept.push(tag.to_string());
        if kept.len() == MAX_TAGS {
            break;
        }
    }
    (!kept.is_empty()).then_some(kept)
}

/// `iconUrl`: an absolute http(s) URL without credentials whose host is a name (after IDNA
/// and percent-decoding, which the URL parser does), not an IP literal in any spelling nor a
/// loopback name: an agent fetching the icon must not be pointed at its own network.
pub fn icon_url(value: Option<&Value>) -> Option<String> {
    let text = value?.as_str()?;
    if text.is_empty() || text.len() > MAX_ICON_URL_LEN || text.chars().any(char::is_control) {
        return None;
    }
    let url = Url::parse(text).ok()?;
    let credentials = !url.username().is_empty() || url.password().is_some();
    if !matches!(url.scheme(), "http" | "https") || credentials {
        return None;
    }
    // The WHATWG parser already reads `2130706433` and `0x7f000001` as IPv4 addresses.
    let Some(Host::Domain(host)) = url.host() else {
        return None;
    };
    // A trailing dot names the same host (`localhost.` is loopback too).
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let all_digits = host.bytes().all(|b| b.is_ascii_digit());
    let hex_literal = host
        .strip_prefix("0x")
        .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()));
    if host.is_empty() || LOOPBACK_HOSTNAMES.contains(&host.as_str()) || all_digits || hex_literal {
        return None;
    }
    Some(text.to_string())
}

/// `routeTemplate` (`/users/:id`), when it is a safe path: its characters, and once fully
/// percent-decoded neither `..` nor `://`. Otherwise the concrete path is catalogued.
pub fn route_template(value: Option<&Value>) -> Option<String> {
    let template = value?.as_str()?;
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"_/:.-~%".contains(&b);
    if !template.starts_with('/') || template.len() < 2 || !template.bytes().all(allowed) {
        return None;
    }
    let decoded = fully_decoded(template)?;
    (!decoded.contains("..") && !decoded.contains("://")).then(|| template.to_string())
}

/// `value` percent-decoded until it no longer changes; `None` when a pass fails (a stray `%`,
/// bytes that are not UTF-8) or it still changes after the last pass.
fn fully_decoded(value: &str) -> Option<String> {
    let mut decoded = value.to_string();
    for _ in 0..MAX_DECODE_PASSES {
        let next = percent_decode(&decoded)?;
        if next == decoded {
            return Some(decoded);
        }
        decoded = next;
    }
    None
}

fn percent_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
        out.push(u8::from_str_radix(hex, 16).ok()?);
        i += 3;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn service_names_are_short_printable_ascii() {
        assert_eq!(
            service_name(Some(&json!("Weather Co"))),
            Some("Weather Co".into())
        );
        for bad in [
            json!(""),
            json!("x".repeat(33)),
            json!("caf\u{e9}"),
            json!("a\nb"),
            json!(7),
        ] {
            assert_eq!(service_name(Some(&bad)), None, "{bad}");
        }
        assert_eq!(service_name(None), None);
    }

    #[test]
    fn tags_keep_the_first_five_valid_distinct_ones() {
        let given = json!(["Weather", "weather", "", 3, "x\u{7}", "a", "b", "c", "d", "e"]);
        assert_eq!(
            tags(Some(&given)),
            Some(vec![
                "Weather".into(),
                "a".into(),
                "b".into(),
                "c".into(),
                "d".into()
            ])
        );
        assert_eq!(tags(Some(&json!(["\u{e9}t\u{e9}"]))), None);
        assert_eq!(tags(Some(&json!("weather"))), None);
    }

    #[test]
    fn icon_urls_name_a_public_host_over_http() {
        assert_eq!(
            icon_url(Some(&json!("https://shop.example/icon.png"))),
            Some("https://shop.example/icon.png".into())
        );
        for bad in [
            "javascript:alert(1)",
            "data:image/png;base64,AAAA",
            "file:///etc/passwd",
            "https://user:pw@shop.example/i.png",
            "http://127.0.0.1/i.png",
            "http://[::1]/i.png",
            "http://2130706433/i.png",
            "http://0x7f000001/i.png",
            "http://localhost/i.png",
            "http://LOCALHOST./i.png",
            "http://%6c%6fcalhost/i.png",
            "http://ip6-loopback/i.png",
            "/relative.png",
            "https://shop.example/\u{1}.png",
        ] {
            assert_eq!(icon_url(Some(&json!(bad))), None, "{bad}");
        }
        let long = format!("https://shop.example/{}", "a".repeat(2048));
        assert_eq!(icon_url(Some(&json!(long))), None);
    }

    #[test]
    fn route_templates_are_safe_paths() {
        assert_eq!(
            route_template(Some(&json!("/users/:userId"))),
            Some("/users/:userId".into())
        );
        for bad in [
            "users/:id",
            "/",
            "/users/../admin",
            "/users/%2e%2e/admin",
            "/users/%252e%252e/admin",
            "/x/http%3a%2f%2fevil.example",
            "/users/%zz",
            "/users/%ff",
            "/users?id=1",
            "/users/<id>",
        ] {
            assert_eq!(route_template(Some(&json!(bad))), None, "{bad}");
        }
        // Still changing after five passes: refused rather than trusted.
        assert_eq!(route_template(Some(&json!("/a/%2525252525252e"))), None);
    }
}
