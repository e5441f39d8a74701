//! What every provider's answer is read for, whatever its shape: tool-call arguments as
//! the model wrote them, token usage, and one-line text for error messages.

use serde_json::Value;

use crate::provider::Usage;

pub(crate) use runwarden_base::one_line;

/// L4: a tool call's arguments as an object, or `null` and why not. Empty text and
/// `null` read as `{}`; text that is not JSON, or JSON that is not an object, is marked
/// (the model gets a tool error), never replaced by `{}` and never a failed turn. The
/// message is the parser's (a position), never the text.
pub(crate) fn arguments_from_text(text: &str) -> (Value, Option<String>) {
    if text.trim().is_empty() {
        return (Value::Object(Default::default()), None);
    }
    match serde_json::from_str::<Value>(text) {
        Ok(value) => arguments_from_value(value),
        Err(e) => (Value::Null, Some(e.to_string())),
    }
}

/// An arguments value as an object, or `null` and why not.
pub(crate) fn arguments_from_value(value: Value) -> (Value, Option<String>) {
    let kind = match &value {
        Value::Null => return (Value::Object(Default::default()), None),
        Value::Object(_) => return (value, None),
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
    };
    (
        Value::Null,
        Some(format!("expected a JSON object, got {kind}")),
    )
}

/// L5: `usage.{input}` and `usage.{output}` of an answer, when both are there.
pub(crate) fn usage(answer: &Value, input: &str, output: &str) -> Option<Usage> {
    let usage = answer.get("usage")?;
    Some(Usage {
        input_tokens: usage.get(input)?.as_u64()?,
        output_tokens: usage.get(output)?.as_u64()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_to_200_characters() {
        let cut = one_line(&"word ".repeat(100));
        assert_eq!(cut.chars().count(), 200);
        assert!(cut.ends_with('…'));
    }
}
