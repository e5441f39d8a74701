//! M1: reading `text/event-stream` bodies for the one JSON-RPC response we wait for.

use serde_json::Value;

/// The `data` payloads of every complete event in `text` (events end at a blank line; a
/// final event without one counts when `at_end`).
pub(crate) fn events(text: &str, at_end: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut data: Option<String> = None;
    for line in text.lines() {
        if line.is_empty() {
            if let Some(d) = data.take() {
                out.push(d);
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(rest);
                }
                None => data = Some(rest.to_string()),
            }
        }
        // `event:`, `id:`, `retry:` and `:` comments carry nothing we need.
    }
    // `lines()` hides whether the text ended on a blank line; only trust a trailing event
    // when the stream is over.
    if at_end && let Some(d) = data {
        out.push(d);
    }
    out
}

/// True when `message` is the response (result or error) to request `id`.
pub(crate) fn is_response_to(message: &Value, id: i64) -> bool {
    message.get("id").and_then(Value::as_i64) == Some(id)
        && (message.get("result").is_some() || message.get("error").is_some())
}

/// The response to `id` among the stream's events; server-initiated messages are skipped.
pub(crate) fn find_response(text: &str, id: i64, at_end: bool) -> Option<Value> {
    events(text, at_end)
        .into_iter()
        .filter_map(|data| serde_json::from_str::<Value>(&data).ok())
        .find(|message| is_response_to(message, id))
}

/// M5: true when a stream cut at the size limit had begun the response to `id`: its last,
/// unfinished event opens a JSON-RPC message that names our id and carries a result or an
/// error, so the server had finished the request when it wrote it.
pub(crate) fn response_begun(text: &str, id: i64) -> bool {
    let Some(last) = events(text, true).pop() else {
        return false;
    };
    let head: String = last.chars().take(4096).collect();
    let compact: String = head.split_whitespace().collect();
    compact.starts_with('{')
        && compact.contains(&format!("\"id\":{id},"))
        && (compact.contains("\"result\":") || compact.contains("\"error\":"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_initiated_messages_are_skipped() {
        let body = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n\
                    event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"ok\":true}}\n\n";
        let found = find_response(body, 7, false).unwrap();
        assert_eq!(found["result"]["ok"], true);
        assert!(find_response(body, 8, true).is_none());
    }

    #[test]
    fn crlf_framing_and_multi_line_data_are_read() {
        let body = "data: {\"jsonrpc\":\"2.0\",\r\ndata: \"id\":1,\"result\":{}}\r\n\r\n";
        assert!(find_response(body, 1, false).is_some());
    }

    #[test]
    fn a_response_cut_at_the_limit_is_known_begun_only_when_its_id_and_result_arrived() {
        let cut = "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n\
                   data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[{\"text\":\"xxxx";
        assert!(response_begun(cut, 7));
        assert!(!response_begun(cut, 8), "another request's id");
        let progress_only = "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"x\":\"xxxx";
        assert!(!response_begun(progress_only, 7));
    }

    #[test]
    fn an_unterminated_event_counts_only_at_the_end() {
        let body = "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n";
        assert!(find_response(body, 1, false).is_none());
        assert!(find_response(body, 1, true).is_some());
    }
}
