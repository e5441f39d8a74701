//! V4 through the real client: every hostile target is refused before a secret is read
//! and before a socket opens, with exactly one audit row.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use runwarden_vault::audit::action;
use runwarden_vault::{
    Credential, EgressError, EgressRequest, GuardRefusal, MAX_TICK, Method, Placement,
};

use crate::support::{ScriptedResolver, fixture, fixture_with};
use runwarden_testkit::{HttpReply, TestServer};

/// Targets that must be refused with no allowlist. `{port}` is the port of a live loopback
/// listener, so a target that slipped through would show up as a connection.
const HOSTILE: &[&str] = &[
    // Loopback in every spelling.
    "http://127.0.0.1:{port}/",
    "http://127.0.0.2:{port}/",
    "http://localhost:{port}/",
    "HTTP://LOCALHOST.:{port}/",
    "http://[::1]:{port}/",
    "http://[::]:{port}/",
    "http://0.0.0.0:{port}/",
    "http://[::ffff:127.0.0.1]:{port}/",
    "http://[::ffff:7f00:1]:{port}/",
    "http://[::127.0.0.1]:{port}/",
    "http://[2002:7f00:1::]:{port}/",
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]:{port}/",
    // Legacy numeric spellings.
    "http://2130706433:{port}/",
    "http://0x7f000001:{port}/",
    "http://0177.0.0.1:{port}/",
    "http://127.1:{port}/",
    "http://0x7f.1:{port}/",
    "http://017700000001:{port}/",
    // Private, shared and special ranges.
    "http://10.0.0.1/",
    "http://172.16.0.1/",
    "http://172.31.255.254/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",
    "http://100.127.255.254/",
    "http://169.254.169.254/latest/meta-data/",
    "http://192.0.0.8/",
    "http://198.18.0.1/",
    "http://198.19.255.1/",
    "http://224.0.0.1/",
    "http://239.255.255.250/",
    "http://240.0.0.1/",
    "http://255.255.255.255/",
    "http://[fc00::1]/",
    "http://[fd12:3456::1]/",
    "http://[fe80::1]/",
    "http://[ff02::1]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[100::1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:10.0.0.1]/",
    "http://[2002:a9fe:a9fe::]/",
    // Names that resolve somewhere forbidden, or nowhere.
    "http://metadata.test/computeMetadata/v1/",
    "http://mixed.test/",
    "http://nowhere.test/",
    // Not http at all, or credentials in the URL.
    "ftp://example.com/file",
    "file:///etc/passwd",
    "gopher://example.com/",
    "https://user:pass@example.com/",
    "not a url",
];

#[tokio::test]
async fn every_hostile_target_is_refused_before_a_secret_is_read_or_a_socket_opens() {
    assert!(HOSTILE.len() >= 40);
    let resolver = ScriptedResolver::default()
        .with("metadata.test", &["169.254.169.254"], &["169.254.169.254"])
        .with("mixed.test", &["93.184.216.34", "10.0.0.1"], &["10.0.0.1"])
        .with("localhost", &["127.0.0.1"], &["127.0.0.1"]);
    let f = fixture_with(&[], Arc::new(resolver), MAX_TICK).await;
    let secret = f.put_sigil("api").await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let port = server.addr.port().to_string();

    for (i, template) in HOSTILE.iter().enumerate() {
        let url = template.replace("{port}", &port);
        let request = EgressRequest::new(Method::Get, url.clone()).credential(Credential {
            secret: secret.clone(),
            placement: Placement::Bearer,
        });
        let err = f.client.send(request, None).await.expect_err(&url);
        assert!(
            matches!(err, EgressError::Refused(_)),
            "{url}: expected a refusal, got {err}"
        );
        let rows = f.audit().await;
        assert_eq!(rows.len(), i + 1, "{url}: exactly one audit row per call");
        let row = rows.last().unwrap();
        assert_eq!(row.event.action, action::HTTP_CALL_REFUSED, "{url}");
        assert_eq!(row.event.status, 0, "{url}");
    }
    assert_eq!(
        f.secret_reads(),
        0,
        "no secret may be read for a refused target"
    );
    assert_eq!(
        server.connections.load(Ordering::SeqCst),
        0,
        "no refused target may reach the listener"
    );
}

#[tokio::test]
async fn a_redirect_to_cloud_metadata_is_returned_as_a_failure_and_never_followed() {
    let f = fixture().await;
    let secret = f.put_sigil("api").await;
    let location = "http://169.254.169.254/latest/meta-data/iam?token=abc";
    let headers = vec![("location".to_string(), location.to_string())];
    let mut server = TestServer::start({
        let reply = HttpReply::Respond {
            status: 302,
            headers,
            body: vec![],
        };
        move |_| reply.clone()
    })
    .await;
    let request = EgressRequest::new(Method::Get, server.url("/start")).credential(Credential {
        secret,
        placement: Placement::Bearer,
    });
    let err = f.client.send(request, None).await.unwrap_err();
    match &err {
        EgressError::Redirect {
            status, location, ..
        } => {
            assert_eq!(status, &302);
            assert_eq!(
                location, "169.254.169.254/latest/meta-data/iam",
                "named, without its query"
            );
        }
        other => panic!("expected a redirect failure, got {other}"),
    }
    server.next_request(Duration::from_secs(5)).await;
    assert_eq!(
        server.connections.load(Ordering::SeqCst),
        1,
        "one request, no follow-up"
    );
    let row = f.completion_row().await;
    assert_eq!(
        (
            row.event.action.as_str(),
            row.event.status,
            row.event.success
        ),
        (action::HTTP_CALL, 302, false)
    );
}

#[tokio::test]
async fn a_rebinding_name_is_resolved_once_and_the_connection_goes_to_the_vetted_address() {
    // First answer: loopback (allowlisted, our server). Every later answer: a private
    // address that must never be connected to.
    let resolver =
        Arc::new(ScriptedResolver::default().with("rebind.test", &["127.0.0.1"], &["10.0.0.1"]));
    let f = fixture_with(&["127.0.0.1"], resolver.clone(), MAX_TICK).await;
    let mut server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let url = format!("http://rebind.test:{}/first", server.addr.port());
    let response = f
        .client
        .send(EgressRequest::new(Method::Get, url.clone()), None)
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    let raw = server.next_request(Duration::from_secs(5)).await.raw;
    assert!(raw.contains("host: rebind.test"), "{raw}");
    assert_eq!(
        resolver.lookups.load(Ordering::SeqCst),
        1,
        "exactly one lookup: no second resolution at connect time"
    );

    // The next call asks again, sees the private answer and is refused before any socket.
    let err = f
        .client
        .send(EgressRequest::new(Method::Get, url), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            EgressError::Refused(GuardRefusal::ForbiddenAddress { .. })
        ),
        "{err}"
    );
    assert_eq!(resolver.lookups.load(Ordering::SeqCst), 2);
    // The first call: an intent and its completion; the refused one: one row.
    assert_eq!(f.audit().await.len(), 3);
}

#[tokio::test]
async fn a_legacy_spelling_is_refused_even_when_its_address_is_allowlisted() {
    let f = fixture().await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let url = format!("http://2130706433:{}/", server.addr.port());
    let err = f
        .client
        .send(EgressRequest::new(Method::Get, url), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            EgressError::Refused(GuardRefusal::LegacyNumericHost { .. })
        ),
        "{err}"
    );
    assert_eq!(server.connections.load(Ordering::SeqCst), 0);
}
