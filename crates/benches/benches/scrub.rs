//! Measures what scrubbing by meaning and the exfiltration check cost, beside the scrubber
//! they replaced, with 100 secrets in the vault; run:
//! `cargo bench -p runwarden-benches --bench scrub [-- --json]` (about 20 s).
//!
//! Per KiB: the time to scrub a response body (or check a request body) of 1 KiB, 64 KiB
//! and 1 MiB of MCP-shaped JSON with escapes in it and no secret, and of the same with a
//! secret spelt with `\u` escapes in it. "before" is the scrubber this replaced, rebuilt
//! here as it was: `memchr::memmem` over the encoder spellings of the one placed secret.
//! "scrub" is the vault's scrubber over every form of all 100 secrets, searched as sent
//! and decoded; "check" is the exfiltration check of a request body.
//!
//! Per call: sequential guarded POSTs of a 200-byte body to 127.0.0.1 through a vault with
//! no other secret and through one with 100, interleaved; the difference at p50 is what
//! the matcher costs a call (the store query that notices changed secrets is in both).

use std::sync::Arc;
use std::time::{Duration, Instant};

use memchr::memmem;
use runwarden_benches as _;
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{Dist, HttpReply, TestServer};
use runwarden_vault::store::VaultStore;
use runwarden_vault::{
    Algorithm, Credential, EgressClient, EgressConfig, EgressPolicy, EgressRequest, MasterKey,
    Method, Placement, Redactor, SecretName, SecretValue, Vault,
};

const SECRETS: usize = 100;
const BODY: &[u8] = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"tickets__create","arguments":{"title":"Printer on floor 3 is jammed again","priority":"normal","labels":["hardware","office"],"by":"bench"}}}"#;
const CALL_WARMUP: usize = 100;
const CALLS: usize = 1_000;

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut lines = Vec::new();
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let full = open_client(&dir.path().join("full.db"), SECRETS).await;
        let empty = open_client(&dir.path().join("empty.db"), 1).await;
        let redactor = full.redactor().await.expect("the matcher builds");
        lines.extend(per_kib(&redactor));
        lines.extend(per_call(&full, &empty).await);
    });
    for line in &lines {
        println!("{}", line.0);
    }
    if json {
        for line in &lines {
            println!("{}", line.1);
        }
    }
}

/// The value of secret `i`: 40 characters, as API keys are.
fn value(i: usize) -> String {
    format!("sk-bench-{i:03}-{}", "x7Qp2Lm9".repeat(4))
}

async fn open_client(path: &std::path::Path, secrets: usize) -> EgressClient {
    let store: Arc<dyn VaultStore> =
        Arc::new(SqliteStore::open(path).expect("the SQLite store opens"));
    let vault = Vault::open(store, MasterKey::generate(), Algorithm::default())
        .await
        .expect("the vault opens");
    for i in 0..secrets {
        vault
            .secret_put(
                &SecretName::new(format!("s{i}")).expect("a name"),
                SecretValue::new(value(i).into_bytes()),
            )
            .await
            .expect("the secret is stored");
    }
    let policy = EgressPolicy::new(&["127.0.0.1"]).expect("a loopback policy");
    EgressClient::new(
        Arc::new(vault),
        EgressConfig {
            policy,
            ..EgressConfig::default()
        },
    )
}

/// An MCP tool result of about `bytes`, with JSON escapes (`\n`, `\"`) as real ones carry.
fn body_of(bytes: usize, with_secret: bool) -> String {
    let line = r#"row 42: \"Printer on floor 3\" is jammed again; see ticket TCK-1042\n"#;
    let mut text = String::new();
    while text.len() + line.len() < bytes.saturating_sub(80) {
        text.push_str(line);
    }
    if with_secret {
        let escaped: String = value(7)
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect();
        text.insert_str(text.len() / 2, &escaped);
    }
    format!(
        r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"type":"text","text":"{text}"}}]}}}}"#
    )
}

/// The scrubber this replaced, as it was: the spellings serde, Python, PHP and Go write of
/// the one placed secret, each searched with `memmem`.
struct Before(Vec<Vec<u8>>);

impl Before {
    fn new(secret: &str) -> Self {
        let serde = serde_json::Value::String(secret.into()).to_string();
        let serde = serde[1..serde.len() - 1].to_string();
        let php = serde.replace('/', "\\/");
        let mut forms = vec![
            secret.as_bytes().to_vec(),
            serde.into_bytes(),
            php.into_bytes(),
        ];
        forms.dedup();
        Self(forms)
    }

    fn scrub(&self, text: &[u8]) -> usize {
        self.0
            .iter()
            .map(|form| memmem::find_iter(text, form).count())
            .sum()
    }
}

/// Runs `f` until `budget` is spent (at least 5 times) and answers the median.
fn median(budget: Duration, mut f: impl FnMut()) -> Duration {
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 5 || start.elapsed() < budget {
        let t = Instant::now();
        f();
        samples.push(t.elapsed());
    }
    Dist::new(samples).pct(50.0)
}

fn per_kib(redactor: &Redactor) -> Vec<(String, String)> {
    let before = Before::new(&value(7));
    let mut lines = vec![(
        format!(
            "{:>8} {:>7} | {:>14} {:>14} {:>14}   (median µs per KiB; {SECRETS} secrets)",
            "body", "secret", "before", "scrub", "check"
        ),
        String::new(),
    )];
    for size in [1 << 10, 64 << 10, 1 << 20] {
        for with_secret in [false, true] {
            let body = body_of(size, with_secret);
            let kib = body.len() as f64 / 1024.0;
            let budget = Duration::from_millis(if size > 100_000 { 1500 } else { 700 });
            let old = median(budget, || {
                std::hint::black_box(before.scrub(body.as_bytes()));
            });
            let scrub = median(budget, || {
                std::hint::black_box(redactor.text(&body));
            });
            let check = median(budget, || {
                std::hint::black_box(redactor.secrets_in_text(&body));
            });
            let found = redactor.secrets_in_text(&body);
            assert_eq!(
                found.is_empty(),
                !with_secret,
                "the check finds the secret: {found:?}"
            );
            let per = |d: Duration| d.as_secs_f64() * 1e6 / kib;
            lines.push((
                format!(
                    "{:>7}K {:>7} | {:>14.2} {:>14.2} {:>14.2}",
                    size >> 10,
                    if with_secret { "escaped" } else { "none" },
                    per(old),
                    per(scrub),
                    per(check)
                ),
                format!(
                    r#"{{"bench":"scrub_per_kib","body_kib":{},"secret":{with_secret},"secrets":{SECRETS},"before_us":{:.3},"scrub_us":{:.3},"check_us":{:.3}}}"#,
                    size >> 10,
                    per(old),
                    per(scrub),
                    per(check)
                ),
            ));
        }
    }
    lines
}

/// One guarded POST of [`BODY`] with a placed bearer, timed.
async fn timed_call(client: &EgressClient, url: &str) -> Duration {
    let request = EgressRequest::new(Method::Post, url)
        .credential(Credential {
            secret: SecretName::new("s0").expect("a name"),
            placement: Placement::Bearer,
        })
        .body(BODY.to_vec());
    let t = Instant::now();
    let response = client
        .send(request, None)
        .await
        .expect("the call is answered");
    assert_eq!(response.status, 200);
    t.elapsed()
}

async fn per_call(full: &EgressClient, empty: &EgressClient) -> Vec<(String, String)> {
    let server =
        TestServer::start(|_| HttpReply::text(200, r#"{"jsonrpc":"2.0","id":1,"result":{}}"#))
            .await;
    let url = server.url("/mcp");
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..CALL_WARMUP + CALLS {
        let a = timed_call(full, &url).await;
        let b = timed_call(empty, &url).await;
        if i >= CALL_WARMUP {
            with.push(a);
            without.push(b);
        }
    }
    let (with, without) = (Dist::new(with), Dist::new(without));
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mut lines = Vec::new();
    for (name, d) in [
        ("1 secret", &without),
        (&format!("{SECRETS} secrets") as &str, &with),
    ] {
        lines.push((
            format!(
                "guarded call, {name:>11}: p50 {:>7.0} µs  p90 {:>7.0} µs  p99 {:>7.0} µs",
                us(d.pct(50.0)),
                us(d.pct(90.0)),
                us(d.pct(99.0))
            ),
            format!(
                r#"{{"bench":"scrub_per_call","vault":"{name}","p50_us":{:.1},"p90_us":{:.1},"p99_us":{:.1}}}"#,
                us(d.pct(50.0)),
                us(d.pct(90.0)),
                us(d.pct(99.0))
            ),
        ));
    }
    lines.push((
        format!(
            "difference at p50: {:.0} µs",
            us(with.pct(50.0)) - us(without.pct(50.0))
        ),
        String::new(),
    ));
    lines.retain(|l| !l.0.is_empty());
    lines
}
