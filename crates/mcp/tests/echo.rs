//! V9 through the MCP client: a server that echoes the credential it received (in a tool
//! result, a JSON-RPC error, `protocolVersion`, the content type, headers, a redirect or
//! an error body) never gets it into a result, an error or an audit row.

use std::sync::{Arc, Mutex};

use runwarden_mcp::{McpCall, McpClient, ProtocolPolicy, Request, ServerConfig};
use runwarden_testkit::{
    Channel, HOSTILE_SIGIL, Spelling, TestServer, echo_handler_spelt, find_form, forms_of,
    hostile_placements, json_decoded, received_credential, tool,
};
use runwarden_vault::{Credential, SecretName, SecretValue};
use serde_json::{Map, json};

use crate::support::fixture;

#[tokio::test]
async fn an_echoed_credential_never_reaches_a_tool_result_an_error_or_an_audit_row() {
    let f = fixture().await;
    let channel = Arc::new(Mutex::new(Channel::Body));
    let spelling = Arc::new(Mutex::new(Spelling::Raw));
    // The tool's description echoes the credential too: what the catalogue would keep.
    let mut create = tool("create");
    create["description"] = json!("creates tickets for {echo}");
    let mut server = TestServer::start(echo_handler_spelt(
        channel.clone(),
        spelling.clone(),
        vec![create],
    ))
    .await;
    for (i, (placement, value)) in hostile_placements().into_iter().enumerate() {
        let name = SecretName::new(format!("srv{i}")).unwrap();
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
            // A fresh client per channel, so each one starts with a handshake.
            let mut config = ServerConfig::new("tickets", server.url("/mcp"))
                .with_protocol(ProtocolPolicy::Handshake);
            config.auth = Some(Credential {
                secret: name.clone(),
                placement: placement.clone(),
            });
            let client = McpClient::new(config, f.egress.clone());
            let listed = client.send_request(Request::ListTools, None).await;
            let called = client
                .call_tool(
                    McpCall {
                        tool: "create".into(),
                        arguments: Map::from_iter([("q".to_string(), json!("printer"))]),
                        correlation: None,
                        gate: None,
                        elicitor: None,
                        output_schema: None,
                        notices: None,
                        ..Default::default()
                    },
                    None,
                )
                .await;
            let mut returned = match &listed {
                Ok(reply) => format!("{reply:?}"),
                Err(error) => format!("{error}\n{error:?}"),
            };
            returned.push_str(&format!("\n{called:?}\n{}", called.result.text));
            if let Some(error) = &called.result.error {
                returned.push_str(&format!("\n{error}"));
            }

            let seen = server.drain_requests();
            assert!(
                seen.iter().any(|r| received_credential(r)
                    .iter()
                    .any(|f| f.contains(HOSTILE_SIGIL))),
                "{placement:?} {echo:?}: the server saw no credential: {seen:?}"
            );
            assert_eq!(
                find_form(&json_decoded(&returned), &forms),
                None,
                "{placement:?} {echo:?} {spelt:?}: a form of the secret came back:\n{returned}"
            );
            // Where the client shows what the server wrote, the echo arrived, cut.
            if matches!(
                echo,
                Channel::Body
                    | Channel::JsonRpcError
                    | Channel::ProtocolVersion
                    | Channel::ContentType
            ) {
                assert!(
                    returned.contains("[redacted]"),
                    "{placement:?} {echo:?}: the echo was not shown redacted:\n{returned}"
                );
            }
        }
    }
    let rows = format!("{:?}", f.audit().await);
    for (_, value) in hostile_placements() {
        assert_eq!(find_form(&rows, &forms_of(&value)), None, "{rows}");
    }
}
