//! V9: a server that echoes the credential it received, in any channel and for any
//! placement, never gets it back through the vault: not in a body, a header, an error or
//! an audit row.

use std::sync::{Arc, Mutex};

use runwarden_testkit::{
    Channel, HOSTILE_SIGIL, Spelling, TestServer, echo_handler, echo_handler_spelt, find_form,
    forms_of, hostile_placements, json_decoded, received_credential,
};
use runwarden_vault::store::AuditFilter;
use runwarden_vault::{Credential, EgressRequest, Method, SecretName, SecretValue};
use serde_json::json;

use crate::support::fixture;

/// A bound on a step that takes milliseconds; it only fails a hung test.
const WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[tokio::test]
async fn an_echoed_credential_is_redacted_in_every_channel_for_every_placement() {
    let f = fixture().await;
    let channel = Arc::new(Mutex::new(Channel::Body));
    let spelling = Arc::new(Mutex::new(Spelling::Raw));
    let mut server = TestServer::start(echo_handler_spelt(
        channel.clone(),
        spelling.clone(),
        vec![],
    ))
    .await;
    for (i, (placement, value)) in hostile_placements().into_iter().enumerate() {
        let name = SecretName::new(format!("s{i}")).unwrap();
        f.vault
            .secret_put(&name, SecretValue::new(value.as_bytes().to_vec()))
            .await
            .unwrap();
        let forms = forms_of(&value);
        for (echo, spelt) in Channel::ALL
            .into_iter()
            .flat_map(|c| Spelling::ALL.map(|s| (c, s)))
        {
            *channel.lock().unwrap() = echo;
            *spelling.lock().unwrap() = spelt;
            let method = if echo == Channel::ProtocolVersion {
                "initialize"
            } else {
                "tools/call"
            };
            let request = EgressRequest::new(Method::Post, server.url("/mcp"))
                .credential(Credential {
                    secret: name.clone(),
                    placement: placement.clone(),
                })
                .body(json!({"jsonrpc": "2.0", "id": 1, "method": method}).to_string());
            let returned = match f.client.send(request, None).await {
                Ok(response) => format!(
                    "{response:?}\n{}\n{:?}",
                    String::from_utf8_lossy(&response.body),
                    response.headers
                ),
                Err(error) => format!("{error}\n{error:?}"),
            };

            // The server did receive the credential and echo it: the check is not vacuous.
            let seen = server.next_request(WAIT).await;
            assert!(
                received_credential(&seen)
                    .iter()
                    .any(|f| f.contains(HOSTILE_SIGIL)),
                "{placement:?}: the server saw no credential"
            );
            // Judged by what the answer means: a reader decodes its JSON escapes.
            assert_eq!(
                find_form(&json_decoded(&returned), &forms),
                None,
                "{placement:?} {echo:?} {spelt:?}: a form of the secret came back:\n{returned}"
            );
            assert!(
                returned.contains("[redacted]"),
                "{placement:?} {echo:?} {spelt:?}: the echo did not come back redacted:\n{returned}"
            );
        }
    }
    let rows = f.vault.audit_list(AuditFilter::default()).await.unwrap();
    // V7 (amended): every call reached the server, so each has an intent and a completion.
    assert_eq!(
        rows.len(),
        2 * hostile_placements().len() * Channel::ALL.len() * Spelling::ALL.len()
    );
    let rows = format!("{rows:?}");
    for (_, value) in hostile_placements() {
        assert_eq!(find_form(&rows, &forms_of(&value)), None, "{rows}");
    }
    assert!(rows.contains("[redacted]"), "the redirect's error row");
}

#[tokio::test]
async fn a_complete_when_hook_reads_the_body_already_redacted() {
    let f = fixture().await;
    let channel = Arc::new(Mutex::new(Channel::Body));
    let mut server = TestServer::start(echo_handler(channel, vec![])).await;
    for (i, (placement, value)) in hostile_placements().into_iter().enumerate() {
        let name = SecretName::new(format!("s{i}")).unwrap();
        f.vault
            .secret_put(&name, SecretValue::new(value.as_bytes().to_vec()))
            .await
            .unwrap();
        let seen_by_hook = Arc::new(Mutex::new(Vec::<u8>::new()));
        let hook = seen_by_hook.clone();
        let request = EgressRequest::new(Method::Post, server.url("/mcp"))
            .credential(Credential {
                secret: name.clone(),
                placement: placement.clone(),
            })
            .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}).to_string())
            .complete_when(Box::new(move |body: &[u8]| {
                *hook.lock().unwrap() = body.to_vec();
                false
            }));
        f.client.send(request, None).await.unwrap();
        server.next_request(WAIT).await;
        // V9: an MCP client hands progress and log text on from this hook.
        let seen = String::from_utf8_lossy(&seen_by_hook.lock().unwrap()).into_owned();
        assert_eq!(
            find_form(&seen, &forms_of(&value)),
            None,
            "{placement:?}: {seen}"
        );
        assert!(seen.contains("[redacted]"), "{placement:?}: {seen}");
    }
}
