//! V2: a sigil secret never appears in logs, error text, `Debug` output or audit rows.

use std::time::Duration;

use runwarden_vault::{CancelFlag, Credential, EgressRequest, Method, Placement};

use crate::support::{Captured, SIGIL, fixture};
use runwarden_testkit::{HttpReply, TestServer};

#[tokio::test]
async fn a_sigil_never_leaks_into_logs_errors_debug_or_audit_rows() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let f = fixture().await;
    let secret = f.put_sigil("api").await;
    let mut texts: Vec<String> = Vec::new();

    // Every placement, against a live server, a stalled one, and a closed port.
    let placements = [
        Placement::Bearer,
        Placement::Header {
            name: "x-api-key".into(),
            prefix: None,
        },
        Placement::Query { name: "key".into() },
    ];
    let ok = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let mut stall = TestServer::start(|_| HttpReply::Stall).await;
    let closed_port = runwarden_testkit::closed_port();
    for placement in placements {
        let credential = Credential {
            secret: secret.clone(),
            placement,
        };
        let request =
            EgressRequest::new(Method::Get, ok.url("/a?x=1")).credential(credential.clone());
        texts.push(format!("{request:?}"));
        texts.push(format!("{:?}", f.client.send(request, None).await));

        let request = EgressRequest::new(Method::Get, format!("http://127.0.0.1:{closed_port}/b"))
            .credential(credential.clone());
        let err = f.client.send(request, None).await.unwrap_err();
        texts.push(err.to_string());
        texts.push(format!("{err:?}"));

        let request = EgressRequest::new(Method::Get, stall.url("/c"))
            .credential(credential.clone())
            .timeout(Duration::from_millis(200));
        let err = f.client.send(request, None).await.unwrap_err();
        texts.push(format!("{err} {err:?}"));

        let flag = CancelFlag::new();
        let request = EgressRequest::new(Method::Get, stall.url("/d")).credential(credential);
        let (result, ()) = tokio::join!(f.client.send(request, Some(&flag)), async {
            // Cancel once the request is on the wire (earlier calls left events too).
            while !stall
                .next_request(Duration::from_secs(10))
                .await
                .raw
                .starts_with("GET /d")
            {}
            flag.cancel();
        });
        texts.push(format!("{:?}", result.unwrap_err()));
    }
    texts.push(format!(
        "{:?} {:?} {:?}",
        f.vault,
        f.client,
        f.vault.secret_list().await.unwrap()
    ));
    for row in f.audit().await {
        texts.push(format!(
            "{row:?} {}",
            serde_json::to_string(&row.event).unwrap()
        ));
    }
    texts.push(String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned());

    assert!(texts.len() > 20);
    assert!(
        !texts.last().unwrap().is_empty(),
        "the trace log captured something"
    );
    for text in &texts {
        assert!(!text.contains(SIGIL), "the sigil leaked into: {text}");
    }
}
