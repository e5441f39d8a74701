//! L3: the stream assembler on recorded event streams of both APIs, fed in many chunkings
//! (whole, byte by byte, random splits, CRLF line ends): every chunking gives the same turn.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use runwarden_models::{
    FinishReason, ModelError, ModelTurn, Progress, StreamApi, StreamAssembler, ToolCallRequest,
    Usage,
};
use runwarden_vault::Delivery;
use serde_json::{Value, json};

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn api_of(name: &str) -> StreamApi {
    if name.starts_with("openai") {
        StreamApi::OpenAi
    } else {
        StreamApi::Anthropic
    }
}

/// Feeds `stream` cut at `cuts` (ascending offsets) as the vault would: the whole body
/// read so far, after each chunk, stopping when the assembler says so.
fn assemble(api: StreamApi, stream: &[u8], cuts: &[usize]) -> Result<ModelTurn, ModelError> {
    let mut assembler = StreamAssembler::new(api, None);
    let mut end = 0;
    for &cut in cuts.iter().chain([&stream.len()]) {
        end = cut.max(end);
        if assembler.feed(&stream[..end]) {
            break;
        }
    }
    assembler.finish(&stream[..end])
}

/// A small deterministic generator, so a failing split can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % below.max(1)
    }
}

/// The chunkings every fixture is fed in: whole, byte by byte, and 200 random splits.
fn chunkings(len: usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(), (1..len).collect()];
    let mut rng = Lcg(0x5eed);
    for _ in 0..200 {
        let mut cuts: Vec<usize> = (0..1 + rng.next(12)).map(|_| rng.next(len)).collect();
        cuts.sort_unstable();
        out.push(cuts);
    }
    out
}

/// The one result of `name` in every chunking, with LF and with CRLF line ends.
fn the_same_in_every_chunking(name: &str) -> Result<ModelTurn, String> {
    let lf = fixture(name);
    let crlf = String::from_utf8(lf.clone())
        .unwrap()
        .replace('\n', "\r\n")
        .into_bytes();
    let api = api_of(name);
    let first = assemble(api, &lf, &[]).map_err(|e| e.to_string());
    for stream in [&lf, &crlf] {
        for cuts in chunkings(stream.len()) {
            let again = assemble(api, stream, &cuts).map_err(|e| e.to_string());
            assert_eq!(again, first, "{name}: cut at {cuts:?}");
        }
    }
    first
}

#[test]
fn an_openai_text_stream_with_empty_deltas_and_split_utf8_is_one_turn_in_any_chunking() {
    let turn = the_same_in_every_chunking("openai_text.sse").unwrap();
    assert_eq!(
        turn.text.as_deref(),
        Some("Caf\u{e9} \u{2615} ready \u{1f600} \u{65e5}\u{672c}.")
    );
    assert!(turn.tool_calls.is_empty());
    assert_eq!(turn.finish, Some(FinishReason::Stop));
    assert_eq!(
        turn.usage,
        Some(Usage {
            input_tokens: 19,
            output_tokens: 7
        }),
        "L5: the include_usage chunk is read"
    );
}

#[test]
fn openai_tool_call_fragments_interleaved_by_index_are_assembled_per_call() {
    let turn = the_same_in_every_chunking("openai_tools.sse").unwrap();
    assert_eq!(turn.text, None);
    assert_eq!(
        turn.tool_calls,
        vec![
            ToolCallRequest::new(
                "call_A1",
                "tickets__create",
                json!({"title": "Printer \u{1f525}", "priority": 1})
            ),
            ToolCallRequest::new("call_B2", "tickets__search", json!({"q": "caf\u{e9}"})),
        ]
    );
    assert_eq!(turn.finish, Some(FinishReason::ToolCalls));
    assert_eq!(turn.usage.map(|u| u.output_tokens), Some(41));
}

#[test]
fn an_anthropic_text_stream_with_pings_and_split_utf8_is_one_turn_in_any_chunking() {
    let turn = the_same_in_every_chunking("anthropic_text.sse").unwrap();
    assert_eq!(
        turn.text.as_deref(),
        Some("Caf\u{e9} \u{2615} ready \u{1f600} \u{65e5}\u{672c}.")
    );
    assert_eq!(turn.finish, Some(FinishReason::Stop));
    assert_eq!(
        turn.usage,
        Some(Usage {
            input_tokens: 25,
            output_tokens: 15
        }),
        "L5: input from message_start, output from message_delta"
    );
}

#[test]
fn anthropic_input_json_deltas_are_joined_per_block_and_an_empty_input_is_an_object() {
    let turn = the_same_in_every_chunking("anthropic_tools.sse").unwrap();
    assert_eq!(turn.text.as_deref(), Some("Filing both."));
    assert_eq!(
        turn.tool_calls,
        vec![
            ToolCallRequest::new(
                "toolu_01A",
                "tickets__create",
                json!({"title": "Printer \u{1f525}", "priority": 1})
            ),
            ToolCallRequest::new("toolu_01B", "tickets__search", json!({})),
        ]
    );
    assert_eq!(turn.finish, Some(FinishReason::ToolCalls));
    assert_eq!(turn.usage.map(|u| u.input_tokens), Some(25));
}

#[test]
fn a_truncated_stream_says_length_and_marks_its_unfinished_arguments() {
    for name in ["openai_truncated.sse", "anthropic_truncated.sse"] {
        let turn = the_same_in_every_chunking(name).unwrap();
        assert_eq!(turn.finish, Some(FinishReason::Length), "{name}: L4");
        let call = &turn.tool_calls[0];
        assert_eq!(call.arguments, Value::Null, "{name}: never a silent {{}}");
        let why = call.invalid_arguments.as_deref().unwrap();
        assert!(why.contains("EOF while parsing"), "{name}: {why}");
        assert!(
            !why.contains("unfin"),
            "{name}: the model's text stays out: {why}"
        );
    }
}

#[test]
fn a_stream_cut_before_its_terminal_event_is_maybe_delivered_never_a_partial_answer() {
    for name in ["openai_cut.sse", "anthropic_cut.sse"] {
        let stream = fixture(name);
        let api = api_of(name);
        for cuts in chunkings(stream.len()) {
            let error = assemble(api, &stream, &cuts).unwrap_err();
            assert!(
                matches!(error, ModelError::Incomplete { .. }),
                "{name}: {error:?}"
            );
            assert_eq!(error.delivery(), Delivery::MaybeDelivered, "{name}: V8");
            assert!(error.is_retryable(), "{name}");
            assert!(!error.to_string().contains("answer is"), "{name}: {error}");
        }
        // Every prefix of a complete stream that lacks its terminal event is cut too.
        let whole = fixture(&name.replace("_cut", "_text"));
        for end in 0..whole.len() - 20 {
            assert!(
                matches!(
                    assemble(api, &whole[..end], &[]),
                    Err(ModelError::Incomplete { .. })
                ),
                "{name}: a prefix of {end} bytes passed for an answer"
            );
        }
    }
}

#[test]
fn an_error_event_is_a_provider_error_that_stops_reading() {
    for (name, kind, retryable) in [
        ("openai_error.sse", "server_error", true),
        ("anthropic_error.sse", "overloaded_error", true),
    ] {
        let stream = fixture(name);
        let mut assembler = StreamAssembler::new(api_of(name), None);
        assert!(
            assembler.feed(&stream),
            "{name}: the error ends the reading"
        );
        match assembler.finish(&stream).unwrap_err() {
            error @ ModelError::Provider { .. } => {
                assert!(error.to_string().contains(kind), "{name}: {error}");
                assert_eq!(error.is_retryable(), retryable, "{name}");
                assert_eq!(error.delivery(), Delivery::Answered, "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn reading_stops_at_the_terminal_event_and_progress_counts_output_deltas() {
    for (name, deltas) in [
        ("openai_text.sse", 6),
        ("openai_tools.sse", 7),
        ("anthropic_text.sse", 3),
        ("anthropic_tools.sse", 5),
    ] {
        let stream = fixture(name);
        let seen = Arc::new(AtomicU64::new(0));
        let reported = seen.clone();
        let progress = Progress::new(move |n| {
            // Monotonic, one step at a time.
            assert_eq!(reported.swap(n, Ordering::SeqCst) + 1, n);
        });
        let mut assembler = StreamAssembler::new(api_of(name), Some(progress));
        let mut trailing = stream.clone();
        trailing.extend_from_slice(b"data: {\"not\": \"read\"}\n\n");
        let mut stopped_at = None;
        for end in 1..=trailing.len() {
            if assembler.feed(&trailing[..end]) {
                stopped_at = Some(end);
                break;
            }
        }
        assert_eq!(
            stopped_at,
            Some(stream.len()),
            "{name}: true once the terminal event is read, before anything after it"
        );
        assert_eq!(seen.load(Ordering::SeqCst), deltas, "{name}");
        assert_eq!(assembler.deltas(), deltas, "{name}");
    }
}
