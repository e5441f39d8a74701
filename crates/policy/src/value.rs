//! A call's JSON arguments as Cedar values. Cedar has no null and no floating point, so
//! the mapping is written down here and in docs/policy.md:
//!
//! - a string, a boolean: itself; an integer that fits in 64 bits: a `Long`;
//! - any other number: a `decimal` when it has at most four digits after the point and
//!   fits Cedar's decimal range, else a string of its JSON text (`"1e+300"`);
//! - an array: a `Set` (order and repeats are lost), its nulls dropped;
//! - an object: a record; an attribute whose value is null is absent (`has` is false).

use cedar_policy::RestrictedExpression;
use serde_json::{Map, Number, Value};

/// The arguments as a record; `None` for a null.
pub(crate) fn to_cedar(value: &Value) -> Option<RestrictedExpression> {
    Some(match value {
        Value::Null => return None,
        Value::Bool(b) => RestrictedExpression::new_bool(*b),
        Value::String(s) => RestrictedExpression::new_string(s.clone()),
        Value::Number(n) => number(n),
        Value::Array(items) => RestrictedExpression::new_set(items.iter().filter_map(to_cedar)),
        Value::Object(map) => return record(map),
    })
}

/// An object as a record, its null attributes left out. `None` only if two attributes
/// shared a name, which a JSON object's cannot.
pub(crate) fn record(map: &Map<String, Value>) -> Option<RestrictedExpression> {
    let fields = map
        .iter()
        .filter_map(|(k, v)| to_cedar(v).map(|v| (k.clone(), v)));
    RestrictedExpression::new_record(fields).ok()
}

fn number(n: &Number) -> RestrictedExpression {
    if let Some(long) = n.as_i64() {
        return RestrictedExpression::new_long(long);
    }
    let text = n.to_string();
    if is_decimal(&text) {
        RestrictedExpression::new_decimal(text)
    } else {
        RestrictedExpression::new_string(text)
    }
}

/// True when `text` is written as Cedar's `decimal` accepts it: digits, a point, one to
/// four digits, within a 64-bit integer of ten-thousandths.
fn is_decimal(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let Some((whole, fraction)) = digits.split_once('.') else {
        return false;
    };
    let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !plain(whole) || !plain(fraction) || fraction.len() > 4 {
        return false;
    }
    let scaled = format!("{whole}{fraction:0<4}");
    match scaled.parse::<i128>() {
        Ok(v) => {
            let v = if text.starts_with('-') { -v } else { v };
            i64::try_from(v).is_ok()
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_with_few_decimals_is_a_decimal() {
        assert!(is_decimal("12.5"));
        assert!(is_decimal("-0.0001"));
        assert!(is_decimal("922337203685477.5807"));
    }

    #[test]
    fn other_numbers_are_not_decimals() {
        assert!(!is_decimal("1.00001"));
        assert!(!is_decimal("1e300"));
        assert!(!is_decimal("922337203685477.5808"));
        assert!(!is_decimal("12"));
    }

    #[test]
    fn null_is_absent() {
        assert!(to_cedar(&Value::Null).is_none());
    }
}
