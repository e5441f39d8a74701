//! The stream assembler's overhead per token (L3): a recorded-shape 2,000-token stream of
//! each API fed one event per chunk, as a server writes it and the vault hands it over
//! (the whole body so far each time), against the floor of any per-event reader: parsing
//! each event's JSON and nothing else. Prints p50/p99 ns per token over 200 trials.
//!
//! `cargo bench -p runwarden-benches --bench assembler`

use std::hint::black_box;
use std::time::{Duration, Instant};

use runwarden_benches as _;
use runwarden_models::{StreamApi, StreamAssembler};
use runwarden_testkit::Dist;
use serde_json::{Value, json};

const TOKENS: usize = 2000;
const TRIALS: usize = 200;

/// Token-sized pieces of text, some multibyte.
fn piece(n: usize) -> String {
    match n % 5 {
        0 => " the".into(),
        1 => " caf\u{e9}".into(),
        2 => format!(" w{n}"),
        3 => ",".into(),
        _ => " \u{65e5}".into(),
    }
}

/// An OpenAI chat completions stream: 2,000 content deltas, finish, usage, `[DONE]`.
fn openai_stream() -> (Vec<u8>, Vec<usize>) {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-AZ3kq", "object": "chat.completion.chunk", "created": 1764750000,
               "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_0ba0d124f1",
               "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
               "usage": null})
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    events.extend((0..TOKENS).map(|n| chunk(json!({"content": piece(n)}), Value::Null)));
    events.push(chunk(json!({}), json!("stop")));
    events
        .push(json!({"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": TOKENS}}));
    let mut texts: Vec<String> = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    texts.push("data: [DONE]\n\n".into());
    framed(texts)
}

/// An Anthropic Messages stream: 2,000 text deltas in one block.
fn anthropic_stream() -> (Vec<u8>, Vec<usize>) {
    let event = |kind: &str, body: Value| format!("event: {kind}\ndata: {body}\n\n");
    let mut texts = vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_01", "type": "message",
            "role": "assistant", "content": [], "model": "claude-sonnet-4-5", "stop_reason": null,
            "usage": {"input_tokens": 20, "output_tokens": 1}}}),
        ),
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    texts.extend((0..TOKENS).map(|n| {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": piece(n)}}),
        )
    }));
    texts.push(event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    texts.push(event(
        "message_delta",
        json!({"type": "message_delta",
        "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": TOKENS}}),
    ));
    texts.push(event("message_stop", json!({"type": "message_stop"})));
    framed(texts)
}

/// The body and the offsets where each event (one network chunk) ends.
fn framed(events: Vec<String>) -> (Vec<u8>, Vec<usize>) {
    let mut body = Vec::new();
    let mut cuts = Vec::new();
    for e in events {
        body.extend_from_slice(e.as_bytes());
        cuts.push(body.len());
    }
    (body, cuts)
}

fn assemble(api: StreamApi, body: &[u8], cuts: &[usize]) {
    let mut assembler = StreamAssembler::new(api, None);
    for &cut in cuts {
        if assembler.feed(&body[..cut]) {
            break;
        }
    }
    let turn = assembler.finish(body).expect("a complete stream");
    black_box(turn);
}

fn per_token(samples: Vec<Duration>) -> Dist {
    Dist::new(samples.into_iter().map(|d| d / TOKENS as u32).collect())
}

fn measure(mut run: impl FnMut()) -> Dist {
    for _ in 0..10 {
        run();
    }
    per_token(
        (0..TRIALS)
            .map(|_| {
                let start = Instant::now();
                run();
                start.elapsed()
            })
            .collect(),
    )
}

fn main() {
    println!("stream assembler, {TOKENS} tokens per stream, {TRIALS} trials, ns per token");
    for (name, api, (body, cuts)) in [
        ("openai", StreamApi::OpenAi, openai_stream()),
        ("anthropic", StreamApi::Anthropic, anthropic_stream()),
    ] {
        let streamed = measure(|| assemble(api, &body, &cuts));
        // Baseline: each event's JSON parsed, nothing framed or assembled.
        let datas: Vec<String> = String::from_utf8(body.clone())
            .expect("utf-8")
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(str::to_string)
            .collect();
        let baseline = measure(|| {
            for data in &datas {
                black_box(serde_json::from_str::<Value>(black_box(data)).expect("json"));
            }
        });
        println!(
            "{name:>9}: assembler p50 {:>5} ns p99 {:>5} ns | JSON parse alone p50 {:>5} ns p99 {:>5} ns | {} bytes, {} events",
            streamed.pct(50.0).as_nanos(),
            streamed.pct(99.0).as_nanos(),
            baseline.pct(50.0).as_nanos(),
            baseline.pct(99.0).as_nanos(),
            body.len(),
            cuts.len(),
        );
    }
}
