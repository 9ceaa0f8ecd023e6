//! A request body read into its wire type, a failure worded as the wire answers it: the path of
//! the field that fails (`paymentPayload.payload.authorization.nonce: missing`). Both the
//! transport and the mechanisms that read their own payloads use it.

/// A JSON value read into `T`; a failure is the message naming the field path, after `prefix`
/// (an array element's place, `[2]`). `objects` lists the paths that must be JSON objects:
/// serde would otherwise read a struct from an array, positionally.
pub fn read_value<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
    objects: &[&str],
    prefix: &str,
) -> Result<T, String> {
    for path in objects {
        let found = path
            .split('.')
            .filter(|s| !s.is_empty())
            .try_fold(&value, |v, key| v.get(key));
        if let Some(serde_json::Value::Array(_)) = found {
            let at = join_path(prefix, path);
            let at = if at.is_empty() {
                "body".to_string()
            } else {
                at
            };
            return Err(format!("{at}: invalid type: array, expected an object"));
        }
    }
    // The common case, a good body, skips the path tracking; a failure is deserialized again
    // with it, for the message that names the field.
    if let Ok(parsed) = T::deserialize(&value) {
        return Ok(parsed);
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let message = describe_parse_error(e);
        let message = message
            .strip_prefix("body: ")
            .map(|m| format!("body: {m}"))
            .unwrap_or(message);
        if prefix.is_empty() {
            message
        } else {
            format!("{prefix}.{message}")
        }
    })
}

/// A serde failure as the wire words it: the field path, then what is wrong there.
pub fn describe_parse_error(error: serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = error.path().to_string();
    let inner = error.into_inner();
    if inner.is_syntax() || inner.is_eof() {
        return format!(
            "body is not valid JSON: {}",
            strip_position(&inner.to_string())
        );
    }
    let text = strip_position(&inner.to_string());
    let parent = if path == "." { String::new() } else { path };
    if let Some(field) = text
        .strip_prefix("missing field `")
        .and_then(|r| r.strip_suffix('`'))
    {
        return format!("{}: missing", join_path(&parent, field));
    }
    let at = if parent.is_empty() {
        "body".to_string()
    } else {
        parent
    };
    format!("{at}: {text}")
}

fn join_path(parent: &str, field: &str) -> String {
    if field.is_empty() {
        parent.to_string()
    } else if parent.is_empty() {
        field.to_string()
    } else {
        format!("{parent}.{field}")
    }
}

/// serde_json appends " at line L column C"; the field path says more.
pub fn strip_position(text: &str) -> String {
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_string(),
        None => text.to_string(),
    }
}
