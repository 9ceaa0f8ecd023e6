//! The `bazaar` extension a payer echoed, checked as the specification asks before anything is
//! catalogued: its `info` valid against its own `schema` (JSON Schema draft 2020-12, which may
//! not reach outside itself), and `info.input` one of the shapes the catalogue keys on (an HTTP
//! method, or an MCP tool).

use serde_json::{json, Map, Value};

use super::sanitize;

/// The extension's key in `extensions` (and in `/supported`).
pub const KEY: &str = "bazaar";

const QUERY_METHODS: &[&str] = &["GET", "HEAD", "DELETE"];
const BODY_METHODS: &[&str] = &["POST", "PUT", "PATCH"];
const BODY_TYPES: &[&str] = &["json", "form-data", "text"];
const MCP_TRANSPORTS: &[&str] = &["streamable-http", "sse"];

/// What a resource is called in the catalogue besides its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Http { method: String },
    Mcp { tool: String },
}

impl Input {
    /// The `type` of `info.input` and of a catalogued resource.
    pub fn kind(&self) -> &'static str {
        match self {
            Input::Http { .. } => "http",
            Input::Mcp { .. } => "mcp",
        }
    }
}

/// A declaration that passed: what it is called, and the extension as it is echoed back to
/// readers (`info`, `schema`, and a valid `routeTemplate`; nothing else the payer added).
#[derive(Debug, Clone, PartialEq)]
pub struct Declaration {
    pub input: Input,
    pub route_template: Option<String>,
    pub echoed: Value,
}

/// Why a declaration is not catalogued (logged at debug; the settlement is not concerned).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the bazaar extension is not an object with info and schema")]
    Shape,
    #[error("the schema has a $ref or $id that points outside it")]
    ExternalReference,
    #[error("the schema does not compile: {0}")]
    Schema(String),
    #[error("info does not match its schema: {0}")]
    Info(String),
    #[error("info.input: {0}")]
    Input(&'static str),
    #[error("paymentPayload.resource.url: not an absolute URL")]
    Resource,
    #[error("the listing is {0} bytes, above facilitator.discovery_max_entry_bytes")]
    TooLarge(usize),
}

/// The declaration in `extension` (the value of `extensions.bazaar`), or why it is refused.
pub fn read(extension: &Value) -> Result<Declaration, Refused> {
    let (Some(info), Some(schema)) = (extension.get("info"), extension.get("schema")) else {
        return Err(Refused::Shape);
    };
    if reaches_outside(schema) {
        return Err(Refused::ExternalReference);
    }
    validate(schema, info)?;
    let input = input(info.get("input").and_then(Value::as_object))?;
    let route_template = match input {
        Input::Http { .. } => sanitize::route_template(extension.get("routeTemplate")),
        Input::Mcp { .. } => None,
    };
    let mut echoed = json!({ "info": info, "schema": schema });
    if let Some(template) = &route_template {
        echoed["routeTemplate"] = json!(template);
    }
    Ok(Declaration {
        input,
        route_template,
        echoed,
    })
}

/// A `$ref` or `$id` anywhere that is not a fragment of this document (`#...`): the validator
/// must never fetch, nor a declaration name another's schema.
fn reaches_outside(node: &Value) -> bool {
    match node {
        Value::Array(items) => items.iter().any(reaches_outside),
        Value::Object(members) => members.iter().any(|(key, value)| {
            let reference = (key == "$ref" || key == "$id")
                && !value.as_str().is_some_and(|v| v.starts_with('#'));
            reference || reaches_outside(value)
        }),
        _ => false,
    }
}

/// `info` against `schema`, as draft 2020-12 (upstream's Ajv2020). Patterns run on a
/// linear-time regex engine: a hostile pattern cannot stall the settle path.
fn validate(schema: &Value, info: &Value) -> Result<(), Refused> {
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .offline()
        .build(schema)
        .map_err(|e| Refused::Schema(e.to_string()))?;
    validator
        .validate(info)
        .map_err(|e| Refused::Info(e.to_string()))
}

/// The specification's rules for `info.input` beyond the declaration's own schema, and what
/// the catalogue needs: an HTTP declaration names its method (the resource server's middleware
/// fills it in), an MCP one its tool.
fn input(input: Option<&Map<String, Value>>) -> Result<Input, Refused> {
    let input = input.ok_or(Refused::Input("missing or not an object"))?;
    let text = |field: &str| input.get(field).and_then(Value::as_str);
    match text("type") {
        Some("http") => {
            let method = text("method").ok_or(Refused::Input("an HTTP input needs its method"))?;
            let is_body = BODY_METHODS.contains(&method);
            if !is_body && !QUERY_METHODS.contains(&method) {
                return Err(Refused::Input(
                    "method: not an HTTP method the bazaar lists",
                ));
            }
            if let Some(body_type) = input.get("bodyType") {
                let known = body_type.as_str().is_some_and(|t| BODY_TYPES.contains(&t));
                if !known || !is_body {
                    return Err(Refused::Input(
                        "bodyType: json, form-data or text, with POST, PUT or PATCH",
                    ));
                }
            }
            Ok(Input::Http {
                method: method.to_string(),
            })
        }
        Some("mcp") => {
            let tool = text("toolName").filter(|t| !t.is_empty());
            let tool = tool.ok_or(Refused::Input("toolName: a non-empty string"))?;
            if !input.get("inputSchema").is_some_and(Value::is_object) {
                return Err(Refused::Input("inputSchema: an object"));
            }
            if let Some(transport) = input.get("transport") {
                if !transport
                    .as_str()
                    .is_some_and(|t| MCP_TRANSPORTS.contains(&t))
                {
                    return Err(Refused::Input("transport: streamable-http or sse"));
                }
            }
            Ok(Input::Mcp {
                tool: tool.to_string(),
            })
        }
        _ => Err(Refused::Input("type: \"http\" or \"mcp\"")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `declareDiscoveryExtension` makes for `GET` with a `city` query parameter, after the
    /// middleware filled in the method.
    fn declared() -> Value {
        json!({
            "info": {
                "input": {"type": "http", "method": "GET", "queryParams": {"city": "Paris"}},
                "output": {"type": "json", "example": {"report": "sunny"}},
            },
            "schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {
                    "input": {
                        "type": "object",
                        "properties": {
                            "type": {"type": "string", "const": "http"},
                            "method": {"type": "string", "enum": ["GET"]},
                            "queryParams": {
                                "type": "object",
                                "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}},
                                "required": ["city"],
                            },
                        },
                        "required": ["type", "method"],
                        "additionalProperties": false,
                    },
                },
                "required": ["input"],
            },
        })
    }

    #[test]
    fn a_declaration_valid_against_its_schema_is_read() {
        let mut extension = declared();
        extension["routeTemplate"] = json!("/weather/:city");
        extension["injected"] = json!("dropped");
        let read = read(&extension).unwrap();
        assert_eq!(
            read.input,
            Input::Http {
                method: "GET".into()
            }
        );
        assert_eq!(read.route_template.as_deref(), Some("/weather/:city"));
        assert_eq!(read.echoed["routeTemplate"], "/weather/:city");
        assert!(read.echoed.get("injected").is_none());
        assert_eq!(read.echoed["info"], extension["info"]);
    }

    #[test]
    fn info_that_breaks_its_schema_is_refused() {
        let mut extension = declared();
        extension["info"]["input"]["queryParams"]["city"] = json!("paris");
        assert!(matches!(read(&extension), Err(Refused::Info(_))));
        let mut extension = declared();
        extension["info"]["input"]["extra"] = json!(1);
        assert!(matches!(read(&extension), Err(Refused::Info(_))));
        let mut extension = declared();
        extension["schema"]["properties"]["input"]["type"] = json!(12);
        assert!(matches!(read(&extension), Err(Refused::Schema(_))));
    }

    #[test]
    fn schemas_may_not_reach_outside_themselves() {
        for reference in [
            json!({"$ref": "https://evil.example/s.json"}),
            json!({"$id": "urn:x"}),
            json!({"$ref": 7}),
        ] {
            let mut extension = declared();
            extension["schema"]["properties"]["output"] = reference;
            assert_eq!(read(&extension), Err(Refused::ExternalReference));
        }
        let mut extension = declared();
        extension["schema"]["$defs"] = json!({"s": {"type": "string"}});
        extension["schema"]["properties"]["input"]["properties"]["type"] =
            json!({"$ref": "#/$defs/s"});
        assert!(read(&extension).is_ok());
    }

    #[test]
    fn the_input_must_name_a_method_or_a_tool() {
        let permissive = json!({"type": "object"});
        let refused = |info: Value| read(&json!({"info": info, "schema": permissive}));
        for input in [
            json!({"type": "http"}),
            json!({"type": "http", "method": "TRACE"}),
            json!({"type": "http", "method": "GET", "bodyType": "json"}),
            json!({"type": "http", "method": "POST", "bodyType": "xml"}),
            json!({"type": "mcp", "toolName": "", "inputSchema": {}}),
            json!({"type": "mcp", "toolName": "t"}),
            json!({"type": "mcp", "toolName": "t", "inputSchema": {}, "transport": "ws"}),
            json!({"type": "grpc"}),
        ] {
            assert!(
                matches!(refused(json!({"input": input})), Err(Refused::Input(_))),
                "{input}"
            );
        }
        assert!(matches!(refused(json!({})), Err(Refused::Input(_))));
        let tool = json!({"type": "mcp", "toolName": "forecast", "inputSchema": {}});
        assert_eq!(
            refused(json!({"input": tool})).unwrap().input,
            Input::Mcp {
                tool: "forecast".into()
            }
        );
        assert_eq!(read(&json!({"info": {}})), Err(Refused::Shape));
        assert_eq!(read(&json!("bazaar")), Err(Refused::Shape));
    }
}
