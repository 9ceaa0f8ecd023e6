//! One catalogued resource: built from a settled x402 v2 payment and its checked declaration,
//! stored as JSON, and answered in the shape of `@x402/extensions`' `DiscoveryResource`.

use ethers_core::types::Address;
use ethers_core::utils::to_checksum;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use url::Url;

use super::declaration::{self, Declaration, Input, Refused};
use super::sanitize;
use crate::evm;
use crate::facilitator::protocol::v2::PaymentRequest;

/// A resource as readers see it (`DiscoveryResource` without `lastUpdated`, which is the time
/// of the settlement that listed it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resource {
    /// The resource server's origin and path (or its route template): no query string.
    pub resource: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    pub x402_version: u8,
    /// The requirements of the settlement that listed it.
    pub accepts: Vec<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icon_url: Option<String>,
    /// `bazaar` as checked: its info, schema and route template (never the payer's other
    /// extensions, such as a payment-identifier id).
    pub extensions: Map<String, Value>,
}

/// What the store holds for one listing: the resource, whose payTo it pays, and whether the
/// merchant's API key keeps it to callers that may settle for that payTo.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stored {
    pub resource: Resource,
    pub pay_to: Address,
    pub private: bool,
}

impl Stored {
    /// One listing per (payTo, method or tool, resource): a stranger paying itself for another
    /// merchant's URL adds its own listing, and never rewrites the merchant's.
    pub fn id(&self) -> String {
        let name = match (&self.resource.method, &self.resource.tool_name) {
            (Some(method), _) => method.as_str(),
            (None, Some(tool)) => tool.as_str(),
            (None, None) => "",
        };
        let pay_to = evm::hex_bytes(self.pay_to);
        format!(
            "{pay_to}|{}:{name}|{}",
            self.resource.kind, self.resource.resource
        )
    }
}

/// The listing a settled `request` makes with its bazaar `extension`.
pub fn build(
    request: &PaymentRequest,
    extension: &Value,
    private: bool,
) -> Result<Stored, Refused> {
    let Declaration {
        input,
        route_template,
        echoed,
    } = declaration::read(extension)?;
    let payload = &request.payment_payload;
    let info = payload.resource.as_ref().ok_or(Refused::Resource)?;
    let resource = canonical_url(&info.url, route_template.as_deref())?;
    let required = &request.payment_requirements;
    let pay_to = evm::parse_address(&required.pay_to).ok_or(Refused::Resource)?;
    let (method, tool_name) = match &input {
        Input::Http { method } => (Some(method.clone()), None),
        Input::Mcp { tool } => (None, Some(tool.clone())),
    };
    let mut accepted = json!({
        "scheme": required.scheme,
        "network": required.network,
        "amount": required.amount,
        "asset": required.asset,
        "payTo": to_checksum(&pay_to, None),
        "maxTimeoutSeconds": required.max_timeout_seconds,
    });
    if let Some(extra) = &required.extra {
        accepted["extra"] = Value::Object(extra.clone());
    }
    let resource = Resource {
        resource,
        kind: input.kind().to_string(),
        method,
        tool_name,
        x402_version: 2,
        accepts: vec![accepted],
        description: info.description.clone().filter(|d| !d.is_empty()),
        mime_type: info.mime_type.clone().filter(|m| !m.is_empty()),
        service_name: sanitize::service_name(info.service_name.as_deref()),
        tags: sanitize::tags(info.tags.as_deref()),
        icon_url: sanitize::icon_url(info.icon_url.as_deref()),
        extensions: Map::from_iter([(declaration::KEY.to_string(), echoed)]),
    };
    Ok(Stored {
        resource,
        pay_to,
        private,
    })
}

/// The URL a resource is catalogued under: its origin and its route template, or its concrete
/// path (upstream's rule), so that `/weather?city=Paris` and `/weather?city=Oslo` are one.
fn canonical_url(url: &str, route_template: Option<&str>) -> Result<String, Refused> {
    let url = Url::parse(url).map_err(|_| Refused::Resource)?;
    let origin = url.origin();
    if !origin.is_tuple() {
        return Err(Refused::Resource);
    }
    let path = route_template.unwrap_or(url.path());
    Ok(format!("{}{path}", origin.ascii_serialization()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_are_catalogued_by_origin_and_path_or_template() {
        assert_eq!(
            canonical_url("https://Shop.example:443/weather?city=Paris#x", None).unwrap(),
            "https://shop.example/weather"
        );
        assert_eq!(
            canonical_url("http://127.0.0.1:8080/users/42", Some("/users/:id")).unwrap(),
            "http://127.0.0.1:8080/users/:id"
        );
        assert_eq!(canonical_url("not a url", None), Err(Refused::Resource));
        assert_eq!(
            canonical_url("data:text/plain,x", None),
            Err(Refused::Resource)
        );
    }
}
