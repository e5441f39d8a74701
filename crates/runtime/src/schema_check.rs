//! Checks a JSON value against the subset of JSON Schema a normalised tool schema (M8) or
//! an elicitation's flat form schema (M14) uses: `type`, `properties`, `required`,
//! `additionalProperties`, `enum`, `const`, `items`, string and number bounds, `anyOf`,
//! `oneOf`, `allOf` and `not`. Operators' edits and answers are checked with it before they
//! reach a server (R12). A keyword it does not know is ignored, never a reason to refuse.

use serde_json::Value;

/// `Ok` when `value` fits `schema`; otherwise what does not fit, with its JSON path.
pub(crate) fn check(schema: &Value, value: &Value) -> Result<(), String> {
    at(schema, value, "$")
}

fn type_fits(name: &str, value: &Value) -> bool {
    match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => true,
    }
}

/// A schema object, as the checks read it.
type Schema = serde_json::Map<String, Value>;

fn at(schema: &Value, value: &Value, path: &str) -> Result<(), String> {
    let Value::Object(schema) = schema else {
        // `true` admits everything, `false` nothing.
        return match schema {
            Value::Bool(false) => Err(format!("{path}: no value is allowed here")),
            _ => Ok(()),
        };
    };
    kind_fits(schema, value, path)?;
    bounds_fit(schema, value, path)?;
    if let Value::Object(map) = value {
        members_fit(schema, map, path)?;
    }
    if let (Value::Array(items), Some(sub)) = (value, schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            at(sub, item, &format!("{path}[{i}]"))?;
        }
    }
    combinations_fit(schema, value, path)
}

/// `type`, `enum` and `const`.
fn kind_fits(schema: &Schema, value: &Value, path: &str) -> Result<(), String> {
    match schema.get("type") {
        Some(Value::String(name)) if !type_fits(name, value) => {
            return Err(format!("{path}: expected {name}"));
        }
        Some(Value::Array(names))
            if !names
                .iter()
                .filter_map(Value::as_str)
                .any(|n| type_fits(n, value)) =>
        {
            return Err(format!(
                "{path}: expected one of {}",
                Value::Array(names.clone())
            ));
        }
        _ => {}
    }
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(value)
    {
        return Err(format!(
            "{path}: must be one of {}",
            Value::Array(allowed.clone())
        ));
    }
    if let Some(constant) = schema.get("const")
        && constant != value
    {
        return Err(format!("{path}: must be {constant}"));
    }
    Ok(())
}

/// A string's length and a number's range.
fn bounds_fit(schema: &Schema, value: &Value, path: &str) -> Result<(), String> {
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    if let Value::String(text) = value {
        let chars = text.chars().count() as u64;
        let length = |key: &str| schema.get(key).and_then(Value::as_u64);
        if length("minLength").is_some_and(|n| chars < n) {
            return Err(format!("{path}: too short"));
        }
        if length("maxLength").is_some_and(|n| chars > n) {
            return Err(format!("{path}: too long"));
        }
    }
    if let Some(number) = value.as_f64() {
        if bound("minimum").is_some_and(|m| number < m) {
            return Err(format!("{path}: below the minimum"));
        }
        if bound("maximum").is_some_and(|m| number > m) {
            return Err(format!("{path}: above the maximum"));
        }
    }
    Ok(())
}

/// An object's `required` members, and each member against its property's schema or
/// `additionalProperties`.
fn members_fit(
    schema: &Schema,
    map: &serde_json::Map<String, Value>,
    path: &str,
) -> Result<(), String> {
    let properties = schema.get("properties").and_then(Value::as_object);
    if let Some(Value::Array(required)) = schema.get("required") {
        for name in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(name) {
                return Err(format!("{path}: {name:?} is required"));
            }
        }
    }
    for (name, item) in map {
        let child = format!("{path}.{name}");
        match properties.and_then(|p| p.get(name)) {
            Some(sub) => at(sub, item, &child)?,
            None => match schema.get("additionalProperties") {
                Some(Value::Bool(false)) => {
                    return Err(format!("{path}: {name:?} is not allowed"));
                }
                Some(sub @ Value::Object(_)) => at(sub, item, &child)?,
                _ => {}
            },
        }
    }
    Ok(())
}

/// `allOf`, `anyOf`, `oneOf` and `not`.
fn combinations_fit(schema: &Schema, value: &Value, path: &str) -> Result<(), String> {
    if let Some(Value::Array(all)) = schema.get("allOf") {
        for sub in all {
            at(sub, value, path)?;
        }
    }
    if let Some(Value::Array(any)) = schema.get("anyOf")
        && !any.iter().any(|sub| at(sub, value, path).is_ok())
    {
        return Err(format!("{path}: matches none of anyOf"));
    }
    if let Some(Value::Array(one)) = schema.get("oneOf")
        && one
            .iter()
            .filter(|sub| at(sub, value, path).is_ok())
            .count()
            != 1
    {
        return Err(format!("{path}: must match exactly one of oneOf"));
    }
    if let Some(not) = schema.get("not")
        && at(not, value, path).is_ok()
    {
        return Err(format!("{path}: matches a schema it must not"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_value_is_checked_against_types_required_fields_enums_and_closed_objects() {
        let schema = json!({
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 1},
                "priority": {"type": "integer", "enum": [1, 2, 3]},
                "tags": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["title"],
            "additionalProperties": false
        });
        assert_eq!(
            check(&schema, &json!({"title": "printer", "priority": 2})),
            Ok(())
        );
        let missing = check(&schema, &json!({"priority": 2})).unwrap_err();
        assert!(missing.contains("\"title\" is required"), "{missing}");
        assert!(
            check(&schema, &json!({"title": 5}))
                .unwrap_err()
                .contains("$.title")
        );
        assert!(check(&schema, &json!({"title": "x", "priority": 9})).is_err());
        assert!(check(&schema, &json!({"title": "x", "extra": 1})).is_err());
        assert!(
            check(&schema, &json!({"title": "x", "tags": ["a", 2]}))
                .unwrap_err()
                .contains("$.tags[1]")
        );
        assert!(check(&schema, &json!({"title": ""})).is_err());
        assert!(check(&schema, &json!("not an object")).is_err());
    }
}
