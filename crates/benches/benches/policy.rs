//! Measures what Cedar policy adds to every tool call: `Policies::decide` for one call with
//! 10, 100 and 1,000 policies (goal: p99 under 50 us at 100), beside the same call with no
//! policies configured (the executor then skips the step: nothing is built or asked). Run:
//! `cargo bench -p runwarden-benches --bench policy`.
//!
//! The policies are the kinds operators write: per-tool permits with a rule on an
//! argument, forbids on a path prefix, approval above an amount, spread over 10 servers of
//! 10 tools, and one in ten a per-agent forbid that names no tool. A decision evaluates the
//! policies that can apply to the call's action and resource (the asked tool's and every
//! one that names no tool), so the per-agent forbids are what grows with the set. The
//! asked call matches a permit and is checked by the forbids of its tool. Each size is
//! loaded (and validated) once, then asked 20,000 times after 2,000 warm-up decisions;
//! every answer is checked.

use std::time::{Duration, Instant};

use runwarden_benches as _;
use runwarden_policy::{Decision, Policies, PolicyFile, Request, RunFacts, Target};
use runwarden_testkit::Dist;
use serde_json::json;

const SAMPLES: usize = 20_000;
const WARMUP: usize = 2_000;

/// `n` policies over up to 100 tools (`srvS__toolT`): per ten, four per-tool permits with a
/// rule on an argument, three per-tool forbids on a path prefix, two per-tool approvals
/// above an amount, and one per-agent forbid that names no tool (asked on every call).
fn policies(n: usize) -> String {
    let mut text = String::new();
    for i in 0..n {
        // Ten policies per tool, one of each kind: the asked tool has ten at every size.
        let tool = format!("srv{}__tool{}", (i / 10) % 10, (i / 100) % 10);
        let policy = match i % 10 {
            0..=3 => format!(
                "@id(\"p{i}\")\npermit (principal, action == Action::\"call_tool\", resource == Tool::\"{tool}\")\nwhen {{ resource.effect == \"read_only\" || context.arguments has path }};\n"
            ),
            4..=6 => format!(
                "@id(\"p{i}\")\n@reason(\"writes stay under /srv\")\nforbid (principal, action == Action::\"call_tool\", resource == Tool::\"{tool}\")\nunless {{ context.arguments has path && context.arguments.path like \"/srv/*\" }};\n"
            ),
            7 | 8 => format!(
                "@id(\"p{i}\")\n@approval(\"required\")\npermit (principal, action == Action::\"call_tool\", resource == Tool::\"{tool}\")\nwhen {{ context.arguments has amount && context.arguments.amount > 1000 }};\n"
            ),
            _ => format!(
                "@id(\"p{i}\")\nforbid (principal == Agent::\"intern{i}\", action, resource);\n"
            ),
        };
        text.push_str(&policy);
    }
    text
}

fn request() -> Request {
    let arguments =
        json!({"path": "/srv/reports/q3.txt", "content": "hello", "mode": "overwrite", "size": 5});
    Request {
        agent: "helper".into(),
        agent_tags: vec!["finance".into()],
        token: Some("alice".into()),
        target: Target::Tool {
            id: "srv0__tool0".into(),
            server: "srv0".into(),
            name: "tool0".into(),
            effect: "non_idempotent_write".into(),
        },
        arguments: arguments.as_object().cloned().unwrap_or_default(),
        run: RunFacts {
            id: "0190c0de-0000-7000-8000-000000000000".into(),
            tags: Vec::new(),
            step: 3,
        },
        host: "srv0.example".into(),
    }
}

fn measure(n: usize) -> (Dist, Duration) {
    let loaded = Instant::now();
    let file = PolicyFile {
        name: "bench.cedar".into(),
        text: policies(n),
    };
    let set = Policies::from_files(&[file]).expect("the bench's policies validate");
    let load = loaded.elapsed();
    assert_eq!(set.len(), n);
    let request = request();
    // With no policy, nothing permits: what is left is building the request itself.
    let expected = if n == 0 {
        Decision::Deny
    } else {
        Decision::Allow
    };
    for _ in 0..WARMUP {
        assert_eq!(set.decide(&request).decision, expected);
    }
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let start = Instant::now();
        let verdict = set.decide(&request);
        samples.push(start.elapsed());
        assert_eq!(verdict.decision, expected, "{verdict:?}");
    }
    (Dist::new(samples), load)
}

fn us(d: Duration) -> String {
    format!("{:.1} us", d.as_secs_f64() * 1e6)
}

fn main() {
    println!("policy decision latency per tool call ({SAMPLES} decisions each, one thread)");
    println!("  no [policy] section: the step is skipped, 0 us added");
    let mut p99_at_100 = Duration::ZERO;
    for n in [0, 10, 100, 1_000] {
        let (dist, load) = measure(n);
        if n == 100 {
            p99_at_100 = dist.pct(99.0);
        }
        println!(
            "  {n:>5} policies: p50 {}  p99 {}  max {}  (load and validate: {:.1} ms)",
            us(dist.pct(50.0)),
            us(dist.pct(99.0)),
            us(dist.max()),
            load.as_secs_f64() * 1e3
        );
    }
    let verdict = if p99_at_100 < Duration::from_micros(50) {
        "met"
    } else {
        "NOT met"
    };
    println!("  goal p99 < 50 us at 100 policies: {verdict}");
}
