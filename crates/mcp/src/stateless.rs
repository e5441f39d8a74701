//! M19: what the 2026-07-28 revision adds to the wire. There is no `initialize`: the
//! client probes `server/discover`, and every request carries the protocol version, the
//! client's capabilities and its identity in `_meta`. Every POST names its method (and,
//! for `tools/call`, the tool) in `Mcp-Method` / `Mcp-Name`, and the arguments a tool marks
//! with `x-mcp-header` are mirrored into `Mcp-Param-{Name}` headers, encoded by the spec's
//! value rules. A result may ask for input (`resultType: "input_required"`) instead of
//! answering; the client answers by re-issuing the request with `inputResponses` and the
//! server's `requestState`, unchanged.

use base64::Engine;
use serde_json::{Map, Value, json};

/// The stateless revision's version string.
pub const STATELESS_VERSION: &str = "2026-07-28";

/// `_meta` key: the protocol version of this request.
pub(crate) const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key: the client's capabilities.
pub(crate) const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key: the client's name and version.
pub(crate) const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";

/// The JSON-RPC error of a server that does not serve the requested version; its data
/// lists what it serves (`supported`).
pub(crate) const UNSUPPORTED_VERSION: i64 = -32022;

/// The largest integer a header may carry: JavaScript's safe range, as the spec says.
pub(crate) const MAX_HEADER_INTEGER: i64 = (1 << 53) - 1;

/// The prefix of a mirrored parameter's header.
pub(crate) const PARAM_HEADER_PREFIX: &str = "mcp-param-";

/// The most rounds of `input_required` one call answers before it gives up (a server that
/// keeps asking is a failure, not a hang).
pub(crate) const MAX_INPUT_ROUNDS: usize = 8;

/// The type a mirrored parameter must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderKind {
    /// A JSON string.
    String,
    /// A JSON integer within [`MAX_HEADER_INTEGER`].
    Integer,
    /// `true` or `false`.
    Boolean,
}

impl HeaderKind {
    fn name(self) -> &'static str {
        match self {
            Self::String => "a string",
            Self::Integer => "an integer",
            Self::Boolean => "a boolean",
        }
    }
}

/// One tool parameter the server asked to see as a header (`x-mcp-header`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeaderParam {
    /// The argument's property path from the arguments object, dot-joined for people.
    pub property: String,
    /// The same path, one property name per level.
    pub path: Vec<String>,
    /// The header's name after `Mcp-Param-`, as the server wrote it.
    pub name: String,
    /// Its declared type.
    pub kind: HeaderKind,
}

/// Why a tool's `x-mcp-header` declarations are refused; the whole tool is then refused,
/// as the spec requires (other tools of the server are kept).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum HeaderRefusal {
    /// `x-mcp-header` is not a string, or is empty.
    #[error("property {property:?} has an empty or non-string x-mcp-header")]
    Empty {
        /// The property.
        property: String,
    },
    /// The name is not an HTTP token (space, colon, control or non-ASCII characters).
    #[error(
        "property {property:?} has x-mcp-header {name:?}, which is not a header name (ASCII letters, digits and !#$%&'*+-.^_`|~ only)"
    )]
    BadName {
        /// The property.
        property: String,
        /// The name as written (escaped by Debug).
        name: String,
    },
    /// The property is not declared as one string, integer or boolean.
    #[error(
        "property {property:?} carries x-mcp-header but is not declared as type string, integer or boolean"
    )]
    NotPrimitive {
        /// The property.
        property: String,
    },
    /// Two properties use the same header name (header names ignore case).
    #[error("x-mcp-header {name:?} is declared on two properties (header names ignore case)")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// `x-mcp-header` sits where no argument value is found by property names alone (the
    /// root, array items, a combinator branch).
    #[error(
        "x-mcp-header appears at {at}, which is not a property reached through properties alone"
    )]
    OffChain {
        /// Where, as a JSON pointer-like path.
        at: String,
    },
}

/// Why one call's argument cannot be mirrored into its header; the call is refused unsent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum HeaderValueError {
    /// The argument's JSON type is not the declared one.
    #[error(
        "argument {property:?} is mirrored into header Mcp-Param-{name} and must be {expected}, not {got}: fix the arguments"
    )]
    WrongType {
        /// The property.
        property: String,
        /// The header's name.
        name: String,
        /// What the schema declares.
        expected: &'static str,
        /// The JSON type given.
        got: &'static str,
    },
    /// An integer outside the range a header may carry.
    #[error(
        "argument {property:?} ({value}) is outside the range header Mcp-Param-{name} may carry (at most 2^53-1 either way)"
    )]
    OutOfRange {
        /// The property.
        property: String,
        /// The header's name.
        name: String,
        /// The value as written.
        value: String,
    },
}

/// M19: the parameters of `input_schema` marked `x-mcp-header`, checked by the spec's
/// rules: on a property reached from the root through `properties` alone, a non-empty
/// HTTP token, on a property declared as string, integer or boolean (not number, object,
/// array or null), each name once ignoring case.
pub(crate) fn header_params(input_schema: &Value) -> Result<Vec<HeaderParam>, HeaderRefusal> {
    let mut params: Vec<HeaderParam> = Vec::new();
    walk(input_schema, &mut Vec::new(), &mut params)?;
    Ok(params)
}

/// True when `value` holds an `x-mcp-header` key anywhere.
fn mentions_header(value: &Value) -> bool {
    match value {
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k == "x-mcp-header" || mentions_header(v)),
        Value::Array(items) => items.iter().any(mentions_header),
        _ => false,
    }
}

fn walk(
    schema: &Value,
    path: &mut Vec<String>,
    params: &mut Vec<HeaderParam>,
) -> Result<(), HeaderRefusal> {
    let Some(map) = schema.as_object() else {
        return Ok(());
    };
    for (key, value) in map {
        match key.as_str() {
            "x-mcp-header" if path.is_empty() => {
                return Err(HeaderRefusal::OffChain {
                    at: "the root".into(),
                });
            }
            "x-mcp-header" => declare(schema, path, params)?,
            "properties" => {
                if let Some(properties) = value.as_object() {
                    for (name, sub) in properties {
                        path.push(name.clone());
                        walk(sub, path, params)?;
                        path.pop();
                    }
                }
            }
            other if mentions_header(value) => {
                let mut at = path.join(".");
                if !at.is_empty() {
                    at.push('.');
                }
                at.push_str(other);
                return Err(HeaderRefusal::OffChain { at });
            }
            _ => {}
        }
    }
    Ok(())
}

fn declare(
    schema: &Value,
    path: &[String],
    params: &mut Vec<HeaderParam>,
) -> Result<(), HeaderRefusal> {
    let property = path.join(".");
    {
        let Some(header) = schema.get("x-mcp-header") else {
            return Ok(());
        };
        let name = match header.as_str() {
            Some(name) if !name.is_empty() => name,
            _ => {
                return Err(HeaderRefusal::Empty {
                    property: property.clone(),
                });
            }
        };
        if !name.bytes().all(is_token_byte) {
            return Err(HeaderRefusal::BadName {
                property: property.clone(),
                name: name.chars().take(64).collect(),
            });
        }
        let kind = match schema.get("type").and_then(Value::as_str) {
            Some("string") => HeaderKind::String,
            Some("integer") => HeaderKind::Integer,
            Some("boolean") => HeaderKind::Boolean,
            _ => {
                return Err(HeaderRefusal::NotPrimitive {
                    property: property.clone(),
                });
            }
        };
        if params.iter().any(|p| p.name.eq_ignore_ascii_case(name)) {
            return Err(HeaderRefusal::Duplicate { name: name.into() });
        }
        params.push(HeaderParam {
            property: property.clone(),
            path: path.to_vec(),
            name: name.into(),
            kind,
        });
    }
    Ok(())
}

/// RFC 9110 `tchar`.
fn is_token_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// M19: a value as a header carries it. Printable ASCII without leading or trailing
/// whitespace goes as it is; anything else (non-ASCII, control characters, CR/LF, tabs,
/// edge spaces, or text that looks like the encoding's own marker) goes as
/// `=?base64?{UTF-8 bytes in standard Base64}?=`. So no CR or LF ever reaches a header.
pub(crate) fn encode_header_value(text: &str) -> String {
    let plain = text.bytes().all(|b| (0x20..=0x7e).contains(&b))
        && text.trim() == text
        && !(text.starts_with("=?base64?") && text.ends_with("?="));
    if plain {
        text.to_string()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(text.as_bytes())
        )
    }
}

/// M19: the `Mcp-Param-*` headers of one call. An argument that is absent or null sends
/// no header; one of the wrong type, or an integer out of range, refuses the call.
pub(crate) fn mirrored_headers(
    params: &[HeaderParam],
    arguments: &Map<String, Value>,
) -> Result<Vec<(String, String)>, HeaderValueError> {
    let mut headers = Vec::new();
    for param in params {
        let mut found = None;
        for (depth, name) in param.path.iter().enumerate() {
            found = if depth == 0 {
                arguments.get(name)
            } else {
                found.and_then(|v: &Value| v.get(name))
            };
        }
        let value = match found {
            None | Some(Value::Null) => continue,
            Some(value) => value,
        };
        let wrong = || HeaderValueError::WrongType {
            property: param.property.clone(),
            name: param.name.clone(),
            expected: param.kind.name(),
            got: json_type(value),
        };
        let text = match (param.kind, value) {
            (HeaderKind::String, Value::String(text)) => encode_header_value(text),
            (HeaderKind::Boolean, Value::Bool(flag)) => flag.to_string(),
            (HeaderKind::Integer, Value::Number(number)) => {
                let Some(integer) = number.as_i64() else {
                    if number.is_u64() {
                        return Err(out_of_range(param, number));
                    }
                    return Err(wrong());
                };
                if integer.abs() > MAX_HEADER_INTEGER {
                    return Err(out_of_range(param, number));
                }
                integer.to_string()
            }
            _ => return Err(wrong()),
        };
        headers.push((format!("{PARAM_HEADER_PREFIX}{}", param.name), text));
    }
    Ok(headers)
}

fn out_of_range(param: &HeaderParam, number: &serde_json::Number) -> HeaderValueError {
    HeaderValueError::OutOfRange {
        property: param.property.clone(),
        name: param.name.clone(),
        value: number.to_string(),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number with a fraction",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One question of an `input_required` result.
#[derive(Debug, Clone, PartialEq)]
pub struct InputRequest {
    /// The key the answer goes back under (`inputResponses[key]`).
    pub key: String,
    /// What is asked: `elicitation/create` is the one runwarden answers.
    pub method: String,
    /// The request's params (for an elicitation: `message`, `requestedSchema`).
    pub params: Value,
}

/// M19: a result that asks for input instead of answering (multi-round-trip requests).
/// Its `Debug` shows the size of the server's state, not the state.
#[derive(Clone, PartialEq)]
pub struct InputRequired {
    /// The questions, in the server's order.
    pub requests: Vec<InputRequest>,
    /// The server's opaque state, echoed back exactly (never inspected); absent when the
    /// server sent none, and then never sent back.
    pub request_state: Option<String>,
}

impl InputRequired {
    /// Reads a result: `Some` only for `resultType: "input_required"` (a result without a
    /// `resultType` is complete).
    pub fn from_result(result: &Value) -> Option<Self> {
        if result.get("resultType").and_then(Value::as_str) != Some("input_required") {
            return None;
        }
        let requests = result
            .get("inputRequests")
            .and_then(Value::as_object)
            .map(|requests| {
                requests
                    .iter()
                    .map(|(key, request)| InputRequest {
                        key: key.clone(),
                        method: request
                            .get("method")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string(),
                        params: request.get("params").cloned().unwrap_or(Value::Null),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            requests,
            request_state: result
                .get("requestState")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}

/// M19: the answers to one `input_required` result, for the re-issued request. The
/// answers belong to that request alone; no other request carries them. Its `Debug`
/// shows the keys answered and the size of the state, not what they hold.
#[derive(Clone, Default, PartialEq)]
pub struct InputResume {
    /// `inputResponses`: each question's key and its result (for an elicitation,
    /// `{"action": ..., "content": ...}`).
    pub responses: Map<String, Value>,
    /// The `requestState` the server sent, exactly; `None` when it sent none.
    pub request_state: Option<String>,
}

fn state_size(state: &Option<String>) -> Option<String> {
    state.as_ref().map(|s| format!("[{} bytes]", s.len()))
}

impl std::fmt::Debug for InputRequired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputRequired")
            .field(
                "requests",
                &self
                    .requests
                    .iter()
                    .map(|r| (&r.key, &r.method))
                    .collect::<Vec<_>>(),
            )
            .field("request_state", &state_size(&self.request_state))
            .finish()
    }
}

impl std::fmt::Debug for InputResume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputResume")
            .field("answered", &self.responses.keys().collect::<Vec<_>>())
            .field("request_state", &state_size(&self.request_state))
            .finish()
    }
}

impl InputResume {
    /// Adds the answers to a request's params.
    pub(crate) fn apply(&self, params: &mut Value) {
        params["inputResponses"] = Value::Object(self.responses.clone());
        if let Some(state) = &self.request_state {
            params["requestState"] = json!(state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(properties: Value) -> Value {
        json!({"type": "object", "properties": properties})
    }

    #[test]
    fn plain_printable_ascii_goes_as_it_is_and_everything_else_as_base64() {
        assert_eq!(encode_header_value("us-west1"), "us-west1");
        assert_eq!(encode_header_value("us west 1"), "us west 1");
        assert_eq!(encode_header_value(""), "");
        for unsafe_text in [
            "Hello, 世界",
            " padded ",
            " us-west1",
            "us-west1 ",
            "line1\nline2",
            "line1\r\nline2",
            "\tindented",
            "=?base64?aGk=?=",
        ] {
            let encoded = encode_header_value(unsafe_text);
            let inner = encoded
                .strip_prefix("=?base64?")
                .and_then(|e| e.strip_suffix("?="))
                .unwrap_or_else(|| panic!("{unsafe_text:?} was not encoded: {encoded:?}"));
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(inner)
                .expect("standard base64");
            assert_eq!(decoded, unsafe_text.as_bytes());
            assert!(!encoded.contains(['\r', '\n']));
        }
    }

    #[test]
    fn header_declarations_are_refused_by_the_spec_rules() {
        let refused = |properties: Value| header_params(&schema(properties)).unwrap_err();
        assert!(matches!(
            refused(json!({"v": {"type": "string", "x-mcp-header": ""}})),
            HeaderRefusal::Empty { .. }
        ));
        for bad in ["My Region", "Region:Primary", "Région", "Region\t1"] {
            assert!(matches!(
                refused(json!({"v": {"type": "string", "x-mcp-header": bad}})),
                HeaderRefusal::BadName { .. }
            ));
        }
        for ty in ["number", "object", "array", "null"] {
            assert!(matches!(
                refused(json!({"v": {"type": ty, "x-mcp-header": "V"}})),
                HeaderRefusal::NotPrimitive { .. }
            ));
        }
        assert!(matches!(
            refused(json!({
                "a": {"type": "string", "x-mcp-header": "MyField"},
                "b": {"type": "string", "x-mcp-header": "myfield"}
            })),
            HeaderRefusal::Duplicate { .. }
        ));
        let ok = header_params(&schema(json!({
            "region": {"type": "string", "x-mcp-header": "Region"},
            "query": {"type": "string"}
        })))
        .unwrap();
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].name, "Region");
        assert!(matches!(
            refused(
                json!({"tags": {"type": "array", "items": {"type": "string", "x-mcp-header": "Tag"}}})
            ),
            HeaderRefusal::OffChain { .. }
        ));
        let nested = header_params(&schema(json!({
            "target": {"type": "object", "properties": {"zone": {"type": "string", "x-mcp-header": "Zone"}}}
        })))
        .unwrap();
        let arguments = json!({"target": {"zone": "eu-1"}});
        assert_eq!(
            mirrored_headers(&nested, arguments.as_object().unwrap()).unwrap(),
            vec![("mcp-param-Zone".to_string(), "eu-1".to_string())]
        );
    }

    #[test]
    fn arguments_are_mirrored_by_type_and_nulls_are_omitted() {
        let params = header_params(&schema(json!({
            "region": {"type": "string", "x-mcp-header": "Region"},
            "priority": {"type": "integer", "x-mcp-header": "Priority"},
            "verbose": {"type": "boolean", "x-mcp-header": "Verbose"},
            "query": {"type": "string"}
        })))
        .unwrap();
        let arguments = json!({"region": "eu", "priority": 42, "verbose": null, "query": "x"});
        let headers = mirrored_headers(&params, arguments.as_object().unwrap()).unwrap();
        let mut headers: Vec<_> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        headers.sort();
        assert_eq!(
            headers,
            vec![("mcp-param-Priority", "42"), ("mcp-param-Region", "eu")]
        );
    }

    #[test]
    fn an_argument_that_cannot_be_its_header_refuses_the_call() {
        let params = header_params(&schema(json!({
            "priority": {"type": "integer", "x-mcp-header": "Priority"},
            "region": {"type": "string", "x-mcp-header": "Region"}
        })))
        .unwrap();
        let wrong = json!({"priority": 1.5});
        assert!(matches!(
            mirrored_headers(&params, wrong.as_object().unwrap()),
            Err(HeaderValueError::WrongType { .. })
        ));
        let object = json!({"region": {"nested": true}});
        assert!(matches!(
            mirrored_headers(&params, object.as_object().unwrap()),
            Err(HeaderValueError::WrongType { .. })
        ));
        let huge = json!({"priority": 9_007_199_254_740_993_i64});
        assert!(matches!(
            mirrored_headers(&params, huge.as_object().unwrap()),
            Err(HeaderValueError::OutOfRange { .. })
        ));
    }

    #[test]
    fn only_an_input_required_result_asks_and_its_state_is_kept_exactly() {
        assert!(InputRequired::from_result(&json!({"content": []})).is_none());
        assert!(
            InputRequired::from_result(&json!({"resultType": "complete", "content": []})).is_none()
        );
        let asked = InputRequired::from_result(&json!({
            "resultType": "input_required",
            "inputRequests": {"confirm": {"method": "elicitation/create", "params": {"message": "ok?"}}},
            "requestState": "{\"nonce\": 1}"
        }))
        .unwrap();
        assert_eq!(asked.requests[0].key, "confirm");
        assert_eq!(asked.request_state.as_deref(), Some("{\"nonce\": 1}"));
        assert!(!format!("{asked:?}").contains("nonce"), "{asked:?}");
        let mut params = json!({"name": "t"});
        InputResume {
            responses: Map::new(),
            request_state: None,
        }
        .apply(&mut params);
        assert!(params.get("requestState").is_none());
        let resume = InputResume {
            responses: Map::new(),
            request_state: asked.request_state.clone(),
        };
        resume.apply(&mut params);
        assert_eq!(params["requestState"], "{\"nonce\": 1}", "echoed exactly");
        assert!(!format!("{resume:?}").contains("nonce"), "{resume:?}");
    }
}
