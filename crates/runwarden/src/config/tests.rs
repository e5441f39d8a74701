//! The configuration's checks, read through `Config::load` as the process reads them.

use runwarden_mcp::{Effect, ElicitationPolicy};
use runwarden_oauth::{AssertionSource, Grant, SigningAlg};
use runwarden_vault::Placement;

use super::agents::DEFAULT_MAX_TOKENS;
use super::reference::{ENVIRONMENT, reference};
use super::*;

#[test]
fn model_agents_get_a_default_max_tokens_budgets_and_anthropic_needs_no_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    let text = format!(
        "{TEMPLATE}\n[agents.local]\nprovider = \"anthropic\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmax_tool_calls = 3\nmax_wall_seconds = 60\n\n[agents.cut]\nprovider = \"openai\"\nmodel = \"m\"\nmax_tokens = 64\n"
    );
    std::fs::write(&path, text).unwrap();
    let config = Config::load(&path).unwrap();
    let local = config.agent("local").unwrap();
    // L5: a server's own default may be unlimited, so an agent always sends one.
    assert_eq!(local.provider.max_tokens(), Some(DEFAULT_MAX_TOKENS));
    assert!(matches!(
        &local.provider,
        ProviderConfig::Anthropic { api_key: None, .. }
    ));
    assert_eq!(local.budgets.max_tool_calls, Some(3));
    assert_eq!(local.budgets.max_wall_seconds, Some(60));
    assert_eq!(local.budgets.max_output_tokens_total, None);
    assert_eq!(config.agent("cut").unwrap().provider.max_tokens(), Some(64));
}

#[test]
fn the_configuration_reference_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let generated = reference();
    if std::env::var_os("RUNWARDEN_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        written == generated,
        "docs/configuration.md is not what the configuration types say; run \
         `RUNWARDEN_BLESS=1 cargo test -p runwarden config::tests::the_configuration_reference_is_current` \
         and commit the file"
    );
    for key in [
        "`data_dir`",
        "## `[agents.NAME]`",
        "## `[mcp.servers.NAME.tools.TOOL]`",
        "`tls_cert`",
        "`status_refresh_seconds`",
    ] {
        assert!(generated.contains(key), "{key} in\n{generated}");
    }
}

#[test]
fn every_environment_variable_the_sources_read_is_in_the_reference() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut read = std::collections::BTreeSet::new();
    let mut dirs = vec![src];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for (i, _) in text.match_indices("\"RUNWARDEN_") {
                let name: String = text[i + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                    .collect();
                read.insert(name);
            }
        }
    }
    let documented: std::collections::BTreeSet<String> =
        ENVIRONMENT.iter().map(|(n, _)| n.to_string()).collect();
    // Test-only variables of the test support code are not the program's.
    read.retain(|n| {
        n != "RUNWARDEN_" && !n.starts_with("RUNWARDEN_TEST") && n != "RUNWARDEN_BLESS"
    });
    assert_eq!(read, documented);
}

#[test]
fn a_servers_elicitation_policy_and_progress_extension_are_read_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    let load = |server: &str| {
        std::fs::write(
            &path,
            format!("{TEMPLATE}\n[mcp.servers.s]\nurl = \"http://x/mcp\"\n{server}"),
        )
        .unwrap();
        Config::load(&path)
    };
    let defaults = load("").unwrap();
    let s = defaults.mcp_server("s").unwrap();
    // M14, M15: decline and no extension unless the operator says otherwise.
    assert_eq!(s.elicitation, ElicitationPolicy::Decline);
    assert!(!s.progress_extends_deadline);
    let chosen = load("elicitation = \"operator\"\nprogress_extends_deadline = true").unwrap();
    let s = chosen.mcp_server("s").unwrap();
    assert_eq!(s.elicitation, ElicitationPolicy::Operator);
    assert!(s.progress_extends_deadline);
    // M19: the 2026-07-28 revision is negotiated unless the operator pins the handshake.
    assert_eq!(s.protocol, runwarden_mcp::ProtocolPolicy::Auto);
    let pinned = load("protocol = \"2025-11-25\"").unwrap();
    assert_eq!(
        pinned.mcp_server("s").unwrap().protocol,
        runwarden_mcp::ProtocolPolicy::Handshake
    );
    assert!(format!("{:#}", load("protocol = \"2026\"").unwrap_err()).contains("\"auto\""));
    let error = format!("{:#}", load("elicitation = \"ask\"").unwrap_err());
    assert!(
        error.contains("[mcp.servers.s]")
            && error.contains("\"decline\"")
            && error.contains("\"operator\""),
        "{error}"
    );
}

#[test]
fn the_anthropic_version_header_is_configurable_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    let load = |agent: &str| {
        std::fs::write(&path, format!("{TEMPLATE}\n[agents.a]\n{agent}")).unwrap();
        Config::load(&path)
    };
    let version = |config: &Config| match &config.agent("a").unwrap().provider {
        ProviderConfig::Anthropic { version, .. } => version.clone(),
        other => panic!("{other:?}"),
    };
    let anthropic = "provider = \"anthropic\"\nmodel = \"m\"\n";
    assert_eq!(version(&load(anthropic).unwrap()), "2023-06-01");
    let newer = load(&format!("{anthropic}anthropic_version = \"2099-01-01\"\n")).unwrap();
    assert_eq!(version(&newer), "2099-01-01");
    let injected = load(&format!(
        "{anthropic}anthropic_version = \"2023-06-01\\r\\nX-Evil: 1\"\n"
    ))
    .unwrap_err();
    assert!(
        format!("{injected:#}").contains("anthropic_version must be a version like"),
        "{injected:#}"
    );
    let elsewhere =
        load("provider = \"openai\"\nmodel = \"m\"\nanthropic_version = \"x\"\n").unwrap_err();
    assert!(
        format!("{elsewhere:#}").contains("applies to provider = \"anthropic\" only"),
        "{elsewhere:#}"
    );
}

#[test]
fn the_template_parses_and_paths_are_relative_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    std::fs::write(&path, TEMPLATE).unwrap();
    let config = Config::load(&path).unwrap();
    assert_eq!(config.data_dir, dir.path().join(".runwarden"));
    assert_eq!(
        config.store,
        StoreUrl::Sqlite(dir.path().join(".runwarden/runwarden.db"))
    );
    assert_eq!(
        config.master_key_file,
        dir.path().join(".runwarden/master.key")
    );
    assert_eq!(config.timeout, Duration::from_secs(30));
    assert_eq!(
        config.audit_anchor_file,
        dir.path().join(".runwarden/audit.anchor"),
        "V7: the anchor defaults to <data_dir>/audit.anchor"
    );
}

#[test]
fn the_status_refresh_defaults_to_a_second_and_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    std::fs::write(&path, TEMPLATE).unwrap();
    let config = Config::load(&path).unwrap();
    assert_eq!(
        config.worker.status_refresh,
        Duration::from_secs(1),
        "R6: at most one read per second per call by default"
    );
    std::fs::write(&path, "[worker]\nstatus_refresh_seconds = 60\n").unwrap();
    let config = Config::load(&path).unwrap();
    assert_eq!(config.worker.status_refresh, Duration::from_secs(60));
    for bad in ["0.01", "61"] {
        std::fs::write(&path, format!("[worker]\nstatus_refresh_seconds = {bad}\n")).unwrap();
        let error = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(
            error.contains("status_refresh_seconds must be between 0.05 and 60"),
            "{error}"
        );
    }
}

#[test]
fn the_audit_anchor_file_is_configurable_relative_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    std::fs::write(
        &path,
        "[vault]\naudit_anchor_file = \"witness/audit.anchor\"\n",
    )
    .unwrap();
    let config = Config::load(&path).unwrap();
    assert_eq!(
        config.audit_anchor_file,
        dir.path().join("witness/audit.anchor")
    );
}

#[test]
fn durability_defaults_to_power_cut_and_the_faster_mode_is_sqlite_only() {
    use runwarden_store_sqlite::Durability;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    std::fs::write(&path, TEMPLATE).unwrap();
    assert_eq!(
        Config::load(&path).unwrap().durability,
        Durability::PowerCut
    );
    std::fs::write(&path, "[store]\ndurability = \"process_crash\"\n").unwrap();
    assert_eq!(
        Config::load(&path).unwrap().durability,
        Durability::ProcessCrash
    );
    for (text, says) in [
        (
            "[store]\ndurability = \"normal\"\n",
            "unknown \"normal\": use \"power_cut\"",
        ),
        (
            "[store]\ndurability = \"process_crash\"\nurl = \"postgres://u@127.0.0.1/db\"\n",
            "is for SQLite only",
        ),
    ] {
        std::fs::write(&path, text).unwrap();
        let error = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(error.contains(says), "{error}");
    }
}

#[test]
fn an_unknown_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    std::fs::write(&path, "[egress]\nallowed = []\n").unwrap();
    let err = format!("{:#}", Config::load(&path).unwrap_err());
    assert!(err.contains("allowed"), "{err}");
}

#[test]
fn an_mcp_server_is_read_with_its_auth_effects_and_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    let text = r#"
[mcp.servers.tickets]
url = "https://mcp.example.com/mcp"
auth = { secret = "tickets-token", placement = "header", header = "X-Api-Key", prefix = "Key " }
effect = "idempotent_write"
timeout_seconds = 5
[mcp.servers.tickets.tools.search]
effect = "read_only"
"#;
    std::fs::write(&path, text).unwrap();
    let config = Config::load(&path).unwrap();
    let server = config.mcp_server("tickets").unwrap();
    assert_eq!(server.timeout, Duration::from_secs(5));
    assert_eq!(server.effect_of("search"), Effect::ReadOnly);
    assert_eq!(server.effect_of("create"), Effect::IdempotentWrite);
    let auth = server.auth.as_ref().unwrap();
    assert_eq!(auth.secret.as_str(), "tickets-token");
    assert_eq!(
        auth.placement,
        Placement::Header {
            name: "X-Api-Key".into(),
            prefix: Some("Key ".into())
        }
    );
    assert!(
        config
            .mcp_server("other")
            .unwrap_err()
            .to_string()
            .contains("tickets")
    );
}

#[test]
fn bad_mcp_declarations_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    for (text, expected) in [
        ("[mcp.servers.\"a.b\"]\nurl = \"http://x\"\n", "server name"),
        (
            "[mcp.servers.t]\nurl = \"http://x\"\neffect = \"harmless\"\n",
            "unknown effect",
        ),
        (
            "[mcp.servers.t]\nurl = \"http://x\"\nauth = { secret = \"s\", placement = \"header\" }\n",
            "needs header",
        ),
        (
            "[mcp.servers.t]\nurl = \"http://x\"\nauth = { secret = \"s\", placement = \"cookie\" }\n",
            "unknown auth placement",
        ),
    ] {
        std::fs::write(&path, text).unwrap();
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(err.contains(expected), "{text}: {err}");
    }
}

#[test]
fn urls_and_tool_overrides_are_checked_when_the_file_loads_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    for (text, key, why) in [
        (
            "[mcp.servers.tickets]\nurl = \"mcp.example.com/mcp\"\n",
            "mcp.servers.tickets.url: ",
            "is not a URL",
        ),
        (
            "[mcp.servers.tickets]\nurl = \"ftp://mcp.example.com/mcp\"\n",
            "mcp.servers.tickets.url: ",
            "scheme \"ftp\"",
        ),
        (
            "[agents.a]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"localhost:8080/v1\"\n",
            "agents.a.base_url: ",
            "http",
        ),
        ("[client]\nserver = \"http://\"\n", "client.server: ", ""),
        (
            "[mcp.servers.t]\nurl = \"http://x\"\n[mcp.servers.t.tools.search]\neffect = \"harmless\"\n",
            "mcp.servers.t.tools.search.effect: ",
            "unknown effect \"harmless\"",
        ),
        (
            "[mcp.servers.t]\nurl = \"http://x\"\n[mcp.servers.t.tools.search]\nefect = \"read_only\"\n",
            "efect",
            "tools.search",
        ),
    ] {
        std::fs::write(&path, text).unwrap();
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(err.contains(key) && err.contains(why), "{text}: {err}");
        assert!(
            err.contains(&path.display().to_string()),
            "the file is named: {err}"
        );
    }
    std::fs::write(
        &path,
        "[mcp.servers.t]\nurl = \"https://mcp.example.com:8443/mcp\"\n",
    )
    .unwrap();
    Config::load(&path).expect("an https URL with a port loads");
}

#[test]
fn an_oauth_server_is_read_with_its_grant_client_and_secret_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    let text = r#"
[mcp.servers.tickets]
url = "https://mcp.example.com/mcp"
auth = { oauth = { grant = "client_credentials", client_id = "agent", private_key = "tickets-key", signing_alg = "RS256", scopes = ["tickets:read"], dpop = false } }
"#;
    std::fs::write(&path, text).unwrap();
    let config = Config::load(&path).unwrap();
    let server = config.mcp_server("tickets").unwrap();
    assert!(
        server.auth.is_none(),
        "M18: the vault places the OAuth token"
    );
    let oauth = server.oauth.as_ref().unwrap();
    assert_eq!(oauth.grant, Grant::ClientCredentials);
    assert_eq!(oauth.client_id.as_deref(), Some("agent"));
    assert_eq!(oauth.private_key.as_ref().unwrap().as_str(), "tickets-key");
    assert_eq!(oauth.signing_alg, SigningAlg::Rs256);
    assert_eq!(oauth.scopes, ["tickets:read"]);
    assert_eq!(oauth.dpop, Some(false), "DPoP turned off");
}

#[test]
fn the_assertion_grants_are_read_with_their_source_and_identity_provider() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    let text = r#"
[mcp.servers.wif]
url = "https://mcp.example.com/mcp"
auth = { oauth = { grant = "jwt_bearer", client_id = "workload", assertion_file = "tokens/mcp.jwt" } }

[mcp.servers.cmd]
url = "https://mcp.example.com/mcp"
auth = { oauth = { grant = "jwt_bearer", assertion_command = ["get-token", "--audience", "mcp"] } }

[mcp.servers.xaa]
url = "https://mcp.example.com/mcp"
auth = { oauth = { grant = "cross_app_access", client_id = "app", client_secret = "app-secret", id_token_file = "/run/id.jwt", idp_token_endpoint = "https://idp.example.com/token", idp_client_id = "idp-app", idp_client_secret = "idp-secret" } }
"#;
    std::fs::write(&path, text).unwrap();
    let config = Config::load(&path).unwrap();
    let wif = config.mcp_server("wif").unwrap().oauth.clone().unwrap();
    assert_eq!(wif.grant, Grant::JwtBearer);
    assert_eq!(
        wif.assertion,
        Some(AssertionSource::File(dir.path().join("tokens/mcp.jwt"))),
        "a relative path is relative to the file"
    );
    let cmd = config.mcp_server("cmd").unwrap().oauth.clone().unwrap();
    assert_eq!(cmd.client_id, None, "client authentication is optional");
    assert_eq!(
        cmd.assertion,
        Some(AssertionSource::Command(vec![
            "get-token".into(),
            "--audience".into(),
            "mcp".into()
        ]))
    );
    let xaa = config.mcp_server("xaa").unwrap().oauth.clone().unwrap();
    assert_eq!(xaa.grant, Grant::CrossAppAccess);
    assert_eq!(
        xaa.assertion,
        Some(AssertionSource::File("/run/id.jwt".into()))
    );
    let idp = xaa.identity_provider.unwrap();
    assert_eq!(idp.token_endpoint, "https://idp.example.com/token");
    assert_eq!(idp.client_id, "idp-app");
    assert_eq!(idp.client_secret.unwrap().as_str(), "idp-secret");
}

#[test]
fn bad_assertion_grant_declarations_are_named_with_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    let server = "[mcp.servers.t]\nurl = \"https://x/mcp\"\n";
    let idp = r#"idp_token_endpoint = "https://idp/token", idp_client_id = "i""#;
    for (oauth, expected) in [
        (
            r#"grant = "jwt_bearer""#.to_string(),
            "needs assertion_file = \"PATH\" or assertion_command",
        ),
        (
            r#"grant = "jwt_bearer", assertion_file = "a", assertion_command = ["b"]"#.into(),
            "not both",
        ),
        (
            r#"grant = "jwt_bearer", assertion_command = []"#.into(),
            "assertion_command needs a program",
        ),
        (
            r#"grant = "jwt_bearer", id_token_file = "a""#.into(),
            "id_token_file goes with grant \"cross_app_access\"",
        ),
        (
            r#"grant = "client_credentials", client_id = "c", client_secret = "s", assertion_file = "a""#.into(),
            "assertion_file goes with grant \"jwt_bearer\"",
        ),
        (
            r#"grant = "jwt_bearer", assertion_file = "a", idp_client_id = "i""#.into(),
            "idp_client_id goes with grant \"cross_app_access\"",
        ),
        (
            format!(r#"grant = "cross_app_access", id_token_file = "a", {idp}"#),
            "needs client_id",
        ),
        (
            r#"grant = "cross_app_access", client_id = "c", id_token_file = "a""#.into(),
            "needs idp_token_endpoint",
        ),
        (
            r#"grant = "cross_app_access", client_id = "c", id_token_file = "a", idp_token_endpoint = "ftp://idp", idp_client_id = "i""#.into(),
            "idp_token_endpoint",
        ),
        (
            format!(r#"grant = "cross_app_access", client_id = "c", {idp}"#),
            "needs id_token_file = \"PATH\" or id_token_command",
        ),
    ] {
        let text = format!("{server}auth = {{ oauth = {{ {oauth} }} }}\n");
        std::fs::write(&path, &text).unwrap();
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(err.contains(expected), "{text}: {err}");
        assert!(
            err.contains("[mcp.servers.t] auth.oauth"),
            "the key is named: {err}"
        );
    }
}

#[test]
fn bad_oauth_declarations_are_named_with_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    let server = "[mcp.servers.t]\nurl = \"https://x/mcp\"\n";
    for (auth, expected) in [
        (r#"{ oauth = { grant = "password" } }"#, "unknown grant"),
        (
            r#"{ oauth = { grant = "client_credentials", client_secret = "s" } }"#,
            "needs client_id",
        ),
        (
            r#"{ oauth = { grant = "client_credentials", client_id = "c" } }"#,
            "needs client_secret or private_key",
        ),
        (
            r#"{ oauth = { grant = "authorization_code", auth_method = "private_key_jwt" } }"#,
            "needs private_key",
        ),
        (
            r#"{ oauth = { grant = "authorization_code", auth_method = "magic" } }"#,
            "unknown auth_method",
        ),
        (
            r#"{ oauth = { grant = "authorization_code", client_metadata_url = "http://x/c.json" } }"#,
            "client_metadata_url must be an https URL",
        ),
        (
            r#"{ secret = "s", placement = "bearer", oauth = { grant = "authorization_code" } }"#,
            "auth.oauth stands alone",
        ),
        (r#"{ placement = "bearer" }"#, "auth needs secret"),
    ] {
        let text = format!("{server}auth = {auth}\n");
        std::fs::write(&path, &text).unwrap();
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(err.contains(expected), "{text}: {err}");
        assert!(
            err.contains("[mcp.servers.t]"),
            "the server is named: {err}"
        );
    }
}
