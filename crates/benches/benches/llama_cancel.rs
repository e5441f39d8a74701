//! Cancel during generation against a real model server, from the cancel to the server's
//! generation stopped; run: `cargo bench -p runwarden-benches --bench llama_cancel [-- --trials N]`.
//!
//! The server is llama.cpp's `llama-server` with SmolLM2-135M (`runwarden_testkit::LlamaServer`,
//! two slots, one thread). A second client loads it the whole time: one streaming request
//! with a long answer, restarted between trials when it ended (never during one, so the
//! only task a trial's log window starts is the trial's own). A trial sends a long
//! generation through the provider with a `CancelFlag`, waits until the server logs that
//! it started the task, flips the flag, and measures until the server logs
//! `stop processing` for the task it cancelled (its log is watched, not `/slots`: polling
//! is traffic, and traffic delays llama-server's check for a gone non-streaming client).
//! A trial whose generation ran to its `max_tokens` instead of being cancelled is counted
//! as such; its sample is still the time to the stop.
//!
//! Rows: `non-streaming` (the provider as it is today). A streaming provider is one more
//! entry in `variants()`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_benches as _;
use runwarden_models::{Message, ModelProvider, ModelRequest, OpenAiCompatible};
use runwarden_testkit::{Dist, LlamaServer, loopback_vault};
use runwarden_vault::{CancelFlag, EgressClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

/// Trials per variant unless `--trials N` says otherwise.
const TRIALS: usize = 50;
/// A trial's token cap: long enough that a cancel arrives mid-generation, bounded so a
/// cancel the server never notices still ends in seconds.
const TRIAL_MAX_TOKENS: u32 = 400;
/// The loader's token cap (its slot holds 2,048 tokens).
const LOADER_MAX_TOKENS: u32 = 1800;
/// A bound on any one wait; it only fails a hung benchmark.
const WAIT: Duration = Duration::from_secs(120);
const PROMPT: &str = "Count from 1 to 1000, one number per line.";

/// One row: a name and a provider to cancel.
struct Variant {
    name: &'static str,
    model: Box<dyn ModelProvider>,
}

fn variants(egress: &Arc<EgressClient>, server: &LlamaServer) -> Vec<Variant> {
    let mut streaming = OpenAiCompatible::new(egress.clone(), server.base_url(), "smollm2");
    streaming.max_tokens = Some(TRIAL_MAX_TOKENS);
    let mut non_streaming = streaming.clone();
    non_streaming.stream = false;
    vec![
        Variant {
            name: "streaming (L3, the default)",
            model: Box::new(streaming),
        },
        Variant {
            name: "non-streaming",
            model: Box::new(non_streaming),
        },
    ]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let trials = args
        .iter()
        .position(|a| a == "--trials")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(TRIALS);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the runtime starts");
    runtime.block_on(bench(trials));
}

async fn bench(trials: usize) {
    let server = LlamaServer::start();
    let vault = loopback_vault().await;
    let request = ModelRequest {
        system: None,
        messages: vec![Message::User {
            text: PROMPT.into(),
        }],
        tools: Vec::new(),
        correlation: None,
        progress: None,
        max_tokens: None,
    };
    println!(
        "cancel during generation -> llama-server stopped generating ({trials} trials, a second client streaming)"
    );
    println!(
        "{:<16} {:>10} {:>10} {:>10} {:>10}",
        "variant", "p50", "p99", "max", "ran out"
    );
    let mut loader: Option<JoinHandle<()>> = None;
    for variant in variants(&vault.egress, &server) {
        let mut samples = Vec::with_capacity(trials);
        let mut ran_out = 0;
        for _ in 0..trials {
            if loader.as_ref().is_none_or(|l| l.is_finished()) {
                let mark = server.log_mark();
                loader = Some(tokio::spawn(stream_long(server.port())));
                server
                    .wait_generation_started(mark, WAIT)
                    .await
                    .expect("the loader's generation started");
            }
            let (stopped_after, cancelled) = trial(&server, variant.model.as_ref(), &request).await;
            samples.push(stopped_after);
            if !cancelled {
                ran_out += 1;
            }
        }
        let dist = Dist::new(samples);
        println!(
            "{:<16} {:>10.1?} {:>10.1?} {:>10.1?} {:>10}",
            variant.name,
            dist.pct(50.0),
            dist.pct(99.0),
            dist.max(),
            ran_out
        );
    }
    if let Some(loader) = loader {
        loader.abort();
    }
}

/// One cancel: the time from the flag's flip to the server's `stop processing`, and
/// whether the server cancelled the task (rather than finishing it).
async fn trial(
    server: &LlamaServer,
    model: &dyn ModelProvider,
    request: &ModelRequest,
) -> (Duration, bool) {
    let flag = CancelFlag::new();
    let mark = server.log_mark();
    let (outcome, measured) = tokio::join!(model.complete(request, Some(&flag)), async {
        let (task, _) = server
            .wait_generation_started(mark, WAIT)
            .await
            .expect("the trial's generation started");
        flag.cancel();
        let cancelled_at = Instant::now();
        let stopped = server
            .wait_generation_stopped(mark, task, WAIT)
            .await
            .expect("the trial's generation stopped");
        (stopped.saturating_duration_since(cancelled_at), task)
    });
    assert!(
        outcome.as_ref().is_err_and(|e| e.is_cancelled()),
        "the call was cancelled: {outcome:?}"
    );
    let (stopped_after, task) = measured;
    (stopped_after, server.cancelled_since(mark, task))
}

/// The second client: one streaming chat completion with a long answer, read to its end.
async fn stream_long(port: u16) {
    let body = serde_json::json!({
        "model": "smollm2",
        "stream": true,
        "max_tokens": LOADER_MAX_TOKENS,
        "messages": [{"role": "user", "content": PROMPT}],
    })
    .to_string();
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return;
    };
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    if stream.write_all(head.as_bytes()).await.is_err()
        || stream.write_all(body.as_bytes()).await.is_err()
    {
        return;
    }
    let mut buf = vec![0u8; 16 * 1024];
    while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
}
