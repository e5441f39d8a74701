//! Local references: a `$ref` into the same document is inlined where it sits, with the
//! keywords beside it kept; a remote, recursive or dangling one refuses the tool.

use serde_json::{Map, Value};

use super::refusal::{SchemaRefusal, malformed, shown};
use super::{Normaliser, join};

impl<'a> Normaliser<'a> {
    /// M8 (amended): the normalised schema a local `$ref` names, or why it cannot be
    /// inlined. It sits at the depth of the `$ref` it replaces.
    pub(super) fn inline(
        &mut self,
        reference: &Value,
        path: &str,
        depth: usize,
    ) -> Result<Map<String, Value>, SchemaRefusal> {
        let here = join(path, "$ref");
        let Some(reference) = reference.as_str() else {
            return Err(malformed(here, "must be a string"));
        };
        let unresolved = |problem: &str| SchemaRefusal::UnresolvedRef {
            reference: shown(reference),
            path: path.to_owned(),
            problem: problem.to_owned(),
        };
        // M8: only a fragment of this very document is followed; anything with a scheme,
        // a host or a path names another document, which is never fetched.
        let Some(fragment) = reference.strip_prefix('#') else {
            return Err(SchemaRefusal::RemoteRef {
                reference: shown(reference),
                path: path.to_owned(),
            });
        };
        if !fragment.is_empty() && !fragment.starts_with('/') {
            return Err(unresolved(
                "is a plain-name anchor; only JSON pointers like \"#/$defs/Name\" are followed",
            ));
        }
        let pointer = percent_decode(fragment)
            .ok_or_else(|| unresolved("is not a valid percent-encoded JSON pointer"))?;
        if self.expanding.contains(&pointer) {
            return Err(SchemaRefusal::RecursiveRef {
                reference: shown(reference),
                path: path.to_owned(),
            });
        }
        let Some(target) = self.root.pointer(&pointer) else {
            return Err(unresolved("names nothing in the schema"));
        };
        let Value::Object(target) = target else {
            return Err(unresolved("names something that is not a schema object"));
        };
        self.expanding.push(pointer);
        let inlined = self.level(target, path, depth);
        self.expanding.pop();
        inlined
    }
}

/// Puts an inlined target into the level that referred to it. Keywords only one side
/// sets are merged; where both set one to different values, the level's own
/// annotation wins, and any other clash keeps the whole target under `allOf`, so both
/// sides still apply (JSON Schema 2020-12: a `$ref` applies beside its siblings).
pub(super) fn merge(level: &mut Map<String, Value>, target: Map<String, Value>) {
    let clash = target.iter().any(|(key, value)| {
        level.get(key).is_some_and(|own| own != value)
            && !matches!(key.as_str(), "description" | "title" | "default")
    });
    if clash {
        match level.get_mut("allOf") {
            Some(Value::Array(all)) => all.push(Value::Object(target)),
            _ => {
                level.insert(
                    "allOf".to_owned(),
                    Value::Array(vec![Value::Object(target)]),
                );
            }
        }
        return;
    }
    for (key, value) in target {
        level.entry(key).or_insert(value);
    }
}

/// Decodes `%XX` escapes of a URI fragment; `None` when an escape is broken or the
/// result is not UTF-8.
fn percent_decode(fragment: &str) -> Option<String> {
    let bytes = fragment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = fragment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}
