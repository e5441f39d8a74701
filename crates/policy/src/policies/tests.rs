//! Decisions over real policy text: the three outcomes, deny winning, ids and reasons,
//! arguments read as values, and validation naming file and line.

use serde_json::{Value, json};

use super::*;
use crate::request::RunFacts;

fn file(name: &str, text: &str) -> PolicyFile {
    PolicyFile {
        name: name.into(),
        text: text.into(),
    }
}

fn policies(text: &str) -> Policies {
    Policies::from_files(&[file("p.cedar", text)]).expect("the policies load")
}

fn problems(text: &str) -> Vec<Problem> {
    match Policies::from_files(&[file("p.cedar", text)]) {
        Err(PolicyError::Invalid(problems)) => problems,
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("the policies were accepted"),
    }
}

use crate::error::Problem;

fn tool_call(agent: &str, tool: &str, effect: &str, arguments: Value) -> Request {
    let (server, name) = tool.split_once("__").unwrap();
    Request {
        agent: agent.into(),
        agent_tags: vec!["finance".into()],
        token: Some("alice".into()),
        target: Target::Tool {
            id: tool.into(),
            server: server.into(),
            name: name.into(),
            effect: effect.into(),
        },
        arguments: arguments.as_object().cloned().unwrap_or_default(),
        run: RunFacts {
            id: "run-1".into(),
            tags: vec!["nightly".into()],
            step: 3,
        },
        host: "files.example".into(),
    }
}

const FILES: &str = r#"
@id("read-anything")
permit (principal, action == Action::"call_tool", resource)
when { resource.effect == "read_only" };

@id("write-under-srv")
permit (principal, action == Action::"call_tool", resource == Tool::"files__write");

@id("no-write-outside-srv")
@reason("writes stay under /srv")
forbid (principal, action == Action::"call_tool", resource == Tool::"files__write")
unless { context.arguments has path && context.arguments.path like "/srv/*" };
"#;

#[test]
fn a_permit_that_matches_allows_and_is_named() {
    let verdict =
        policies(FILES).decide(&tool_call("helper", "files__read", "read_only", json!({})));
    assert_eq!(verdict.decision, Decision::Allow);
    assert_eq!(verdict.policies, vec!["read-anything"]);
}

#[test]
fn an_argument_outside_the_prefix_is_denied_by_the_forbid_with_its_reason() {
    let p = policies(FILES);
    let inside = p.decide(&tool_call(
        "helper",
        "files__write",
        "non_idempotent_write",
        json!({"path": "/srv/a.txt"}),
    ));
    assert_eq!(inside.decision, Decision::Allow);
    let outside = p.decide(&tool_call(
        "helper",
        "files__write",
        "non_idempotent_write",
        json!({"path": "/etc/passwd"}),
    ));
    assert_eq!(outside.decision, Decision::Deny);
    assert_eq!(outside.policies, vec!["no-write-outside-srv"]);
    assert_eq!(outside.reasons, vec!["writes stay under /srv"]);
    assert_eq!(
        outside.summary(),
        "denied by policy no-write-outside-srv: writes stay under /srv"
    );
}

#[test]
fn nothing_permitted_is_a_default_deny_with_no_policy_named() {
    let verdict = policies(FILES).decide(&tool_call(
        "helper",
        "files__delete",
        "non_idempotent_write",
        json!({}),
    ));
    assert_eq!(verdict.decision, Decision::Deny);
    assert!(verdict.policies.is_empty());
    assert_eq!(verdict.reasons, vec![NO_PERMIT]);
}

#[test]
fn no_policies_deny_everything() {
    let p = Policies::from_files(&[]).unwrap();
    assert!(p.is_empty());
    let verdict = p.decide(&tool_call("a", "s__t", "read_only", json!({})));
    assert_eq!(verdict.decision, Decision::Deny);
}

const PAYMENTS: &str = r#"
@id("small-payments")
permit (principal, action == Action::"call_tool", resource == Tool::"bank__pay")
when { context.arguments.amount <= 1000 };

@id("large-payments-need-approval")
@approval("required")
@reason("payments above 1000 need a person")
permit (principal, action == Action::"call_tool", resource == Tool::"bank__pay")
when { context.arguments.amount > 1000 };
"#;

#[test]
fn an_amount_above_the_limit_requires_approval() {
    let p = policies(PAYMENTS);
    let small = p.decide(&tool_call(
        "a",
        "bank__pay",
        "non_idempotent_write",
        json!({"amount": 20}),
    ));
    assert_eq!(small.decision, Decision::Allow);
    assert_eq!(small.policies, vec!["small-payments"]);
    let large = p.decide(&tool_call(
        "a",
        "bank__pay",
        "non_idempotent_write",
        json!({"amount": 5000}),
    ));
    assert_eq!(large.decision, Decision::ApprovalRequired);
    assert_eq!(large.policies, vec!["large-payments-need-approval"]);
    assert_eq!(large.reasons, vec!["payments above 1000 need a person"]);
}

#[test]
fn any_matching_permit_that_requires_approval_requires_it() {
    let text = r#"
        @id("plain") permit (principal, action, resource);
        @id("careful") @approval("required") permit (principal, action, resource);
    "#;
    let verdict = policies(text).decide(&tool_call("a", "s__t", "read_only", json!({})));
    assert_eq!(verdict.decision, Decision::ApprovalRequired);
    assert_eq!(verdict.policies, vec!["careful", "plain"]);
}

#[test]
fn deny_wins_over_a_permit_and_over_approval() {
    let text = r#"
        @id("all") @approval("required") permit (principal, action, resource);
        @id("not-intern") forbid (principal == Agent::"intern", action, resource);
    "#;
    let p = policies(text);
    let intern = p.decide(&tool_call("intern", "s__t", "read_only", json!({})));
    assert_eq!(intern.decision, Decision::Deny);
    assert_eq!(intern.policies, vec!["not-intern"]);
    assert_eq!(intern.reasons, vec!["forbidden by policy not-intern"]);
    let other = p.decide(&tool_call("senior", "s__t", "read_only", json!({})));
    assert_eq!(other.decision, Decision::ApprovalRequired);
}

#[test]
fn a_forbid_that_fails_denies_and_says_why() {
    // `amount` is a string here: `>` on a string fails, and a failing forbid denies.
    let text = r#"
        @id("all") permit (principal, action, resource);
        @id("cap") forbid (principal, action, resource) when { context.arguments.amount > 10 };
    "#;
    let verdict = policies(text).decide(&tool_call(
        "a",
        "s__t",
        "read_only",
        json!({"amount": "s3cr3t-value"}),
    ));
    assert_eq!(verdict.decision, Decision::Deny);
    assert_eq!(verdict.policies, vec!["cap"]);
    assert!(
        verdict.reasons[0].starts_with("policy cap failed: type error"),
        "{:?}",
        verdict.reasons
    );
    assert!(!verdict.summary().contains("s3cr3t-value"));
}

#[test]
fn a_permit_that_fails_permits_nothing() {
    let text = r#"@id("p") permit (principal, action, resource) when { context.arguments.n > 1 };"#;
    let verdict = policies(text).decide(&tool_call("a", "s__t", "read_only", json!({})));
    assert_eq!(verdict.decision, Decision::Deny);
    assert_eq!(verdict.reasons[0], NO_PERMIT);
    assert!(
        verdict.reasons[1].contains("policy p failed"),
        "{:?}",
        verdict.reasons
    );
}

#[test]
fn the_principal_its_tags_its_token_and_the_run_can_be_named() {
    let text = r#"
        @id("finance-nightly")
        permit (principal in Token::"alice", action == Action::"call_tool", resource)
        when { principal.tags.contains("finance") && context.run.tags.contains("nightly")
               && context.run.step == 3 && context.host == "files.example"
               && resource.server == "files" && resource.name == "read" };
    "#;
    let p = policies(text);
    let request = tool_call("helper", "files__read", "read_only", json!({}));
    assert_eq!(p.decide(&request).decision, Decision::Allow);
    let mut other = request.clone();
    other.token = Some("bob".into());
    assert_eq!(p.decide(&other).decision, Decision::Deny);
}

#[test]
fn models_and_secrets_are_their_own_actions() {
    let text = r#"
        @id("model") permit (principal, action == Action::"call_model", resource == Model::"small");
        @id("secret") permit (principal, action == Action::"read_secret", resource == Secret::"GH_TOKEN");
    "#;
    let p = policies(text);
    let mut request = tool_call("a", "s__t", "read_only", json!({}));
    request.target = Target::Model("small".into());
    assert_eq!(p.decide(&request).policies, vec!["model"]);
    request.target = Target::Secret("GH_TOKEN".into());
    assert_eq!(p.decide(&request).policies, vec!["secret"]);
    request.target = Target::Secret("OTHER".into());
    assert_eq!(p.decide(&request).decision, Decision::Deny);
}

#[test]
fn arguments_become_cedar_values() {
    let text = r#"
        @id("shapes") permit (principal, action, resource) when {
            context.arguments.count == 3
            && context.arguments.ratio.greaterThan(decimal("0.5"))
            && context.arguments.huge == "1e+300"
            && context.arguments.tags.contains("x")
            && context.arguments.options.recursive
            && !(context.arguments has gone)
        };
    "#;
    let arguments = json!({
        "count": 3, "ratio": 0.75, "huge": 1e300, "tags": ["x", "y", null],
        "options": {"recursive": true}, "gone": null
    });
    let verdict = policies(text).decide(&tool_call("a", "s__t", "read_only", arguments));
    assert_eq!(verdict.decision, Decision::Allow, "{verdict:?}");
}

#[test]
fn a_policy_without_an_id_is_named_by_file_and_line() {
    let text = "// tools\n\npermit (principal, action, resource);\n\nforbid (principal, action == Action::\"call_tool\", resource)\n  when { resource.effect == \"x\" };\n";
    let p = Policies::from_files(&[file("policies/a.cedar", text)]).unwrap();
    assert_eq!(p.ids(), vec!["policies/a.cedar:3", "policies/a.cedar:5"]);
}

#[test]
fn an_unknown_entity_attribute_is_rejected_with_its_line() {
    let text = "@id(\"ok\") permit (principal, action, resource);\n\npermit (principal, action == Action::\"call_tool\", resource)\nwhen { principal.department == \"finance\" };\n";
    let found = problems(text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].file, "p.cedar");
    assert_eq!(found[0].line, 4);
    assert!(
        found[0].message.contains("department"),
        "{}",
        found[0].message
    );
    assert!(found[0].to_string().starts_with("p.cedar:4: "));
}

#[test]
fn an_unknown_context_attribute_or_type_is_rejected() {
    assert_eq!(
        problems(r#"permit (principal, action == Action::"call_tool", resource) when { context.argument.path == "x" };"#).len(),
        1
    );
    assert_eq!(
        problems(r#"permit (principal == User::"x", action, resource);"#).len(),
        1
    );
    assert_eq!(
        problems(r#"permit (principal, action == Action::"call_tol", resource);"#).len(),
        1
    );
}

#[test]
fn an_argument_read_validates_whatever_its_name() {
    let text = r#"
        forbid (principal, action == Action::"call_tool", resource)
        when { context.arguments.path like "/etc/*" || context.arguments["odd name"] == 1
               || context.arguments.options.mode == "x" };
    "#;
    assert_eq!(policies(text).len(), 1);
}

#[test]
fn a_syntax_error_names_its_line() {
    let found =
        problems("permit (principal, action, resource);\n\npermit (principal action, resource);\n");
    assert_eq!(found[0].line, 3, "{found:?}");
}

#[test]
fn a_repeated_id_names_both_places() {
    let a = file(
        "a.cedar",
        "@id(\"same\") permit (principal, action, resource);",
    );
    let b = file(
        "b.cedar",
        "\n@id(\"same\") permit (principal, action, resource);",
    );
    let Err(PolicyError::Invalid(found)) = Policies::from_files(&[a, b]) else {
        panic!("a repeated id was accepted");
    };
    assert_eq!(
        found[0].to_string(),
        "b.cedar:2: the policy id \"same\" is already used at a.cedar:1; give each policy its own @id"
    );
}

#[test]
fn approval_is_understood_only_as_required_on_a_permit() {
    assert!(
        problems(r#"@approval("maybe") permit (principal, action, resource);"#)[0]
            .message
            .contains("not understood")
    );
    assert!(
        problems(r#"@approval("required") forbid (principal, action, resource);"#)[0]
            .message
            .contains("for a permit policy")
    );
}

#[test]
fn a_template_is_refused() {
    assert!(
        problems("permit (principal == ?principal, action, resource);")[0]
            .message
            .contains("template")
    );
}

#[test]
fn the_shipped_schema_loads() {
    assert!(crate::schema::validator().is_ok());
}

#[test]
fn the_index_decides_exactly_as_cedar_over_the_whole_set() {
    let text = format!(
        "{FILES}\n{PAYMENTS}\n{}",
        r#"
        @id("generic-forbid") forbid (principal == Agent::"intern", action, resource);
        @id("in-list") permit (principal, action in [Action::"call_model", Action::"call_tool"], resource)
          when { context.arguments has fine };
        @id("failing") forbid (principal, action, resource is Tool) when { context.arguments.n > 1 };
        @id("tool-in") permit (principal, action, resource in Tool::"files__read");
        "#
    );
    let files = [file("p.cedar", &text)];
    let whole = crate::load::load(&files).unwrap();
    let p = Policies::from_files(&files).unwrap();
    let authorizer = Authorizer::new();
    let tools = [
        ("files__read", "read_only"),
        ("files__write", "non_idempotent_write"),
        ("bank__pay", "non_idempotent_write"),
        ("other__thing", "read_only"),
    ];
    let arguments = [
        json!({}),
        json!({"path": "/srv/a"}),
        json!({"path": "/etc"}),
        json!({"amount": 5000}),
        json!({"amount": 5, "fine": true, "n": 0}),
        json!({"n": "x"}),
    ];
    let mut compared = 0;
    for agent in ["helper", "intern"] {
        for (tool, effect) in tools {
            for args in &arguments {
                let mut request = tool_call(agent, tool, effect, args.clone());
                for target in [
                    request.target.clone(),
                    Target::Model("small".into()),
                    Target::Secret("GH".into()),
                ] {
                    request.target = target;
                    let (cedar, entities, action, resource) =
                        cedar_request(&p.names, &request).unwrap();
                    let full = authorizer.is_authorized(&cedar, &whole, &entities);
                    let sliced = authorizer.is_authorized(
                        &cedar,
                        p.index.slice(&action, &resource),
                        &entities,
                    );
                    assert_eq!(full.decision(), sliced.decision(), "{request:?}");
                    let ids = |r: &cedar_policy::Response| {
                        let mut ids: Vec<String> =
                            r.diagnostics().reason().map(ToString::to_string).collect();
                        ids.sort();
                        let mut failed: Vec<String> =
                            r.diagnostics().errors().map(ToString::to_string).collect();
                        failed.sort();
                        (ids, failed)
                    };
                    assert_eq!(ids(&full), ids(&sliced), "{request:?}");
                    compared += 1;
                }
            }
        }
    }
    assert_eq!(compared, 2 * 4 * 6 * 3);
}

#[test]
fn a_misspelt_annotation_is_refused_so_an_approval_never_becomes_a_plain_allow() {
    let text = "@id(\"pay\")\n@aproval(\"required\")\npermit (principal, action, resource);\n";
    let found = problems(text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].line, 1);
    assert!(
        found[0]
            .message
            .contains("unknown annotation @aproval: runwarden reads @id, @reason and @approval"),
        "{found:?}"
    );
}

/// G2: what a gateway client is shown. A tool is hidden only when every call to it is
/// denied whatever its arguments: no permit's scope reaches it, or a forbid without
/// conditions covers it. A forbid or a permit on arguments hides nothing.
#[test]
fn a_tool_is_shown_when_some_call_could_be_allowed_and_hidden_when_none_could() {
    let set = policies(
        r#"
@id("payments-under-a-limit")
permit (principal, action == Action::"call_tool", resource == Tool::"bank__pay")
when { context.arguments.amount < 100 };

@id("files")
permit (principal, action == Action::"call_tool", resource)
when { resource.server == "files" };

@id("no-writes-outside-srv")
forbid (principal, action == Action::"call_tool", resource == Tool::"files__write")
unless { context.arguments has path && context.arguments.path like "/srv/*" };

@id("alice-never-deletes")
forbid (principal in Token::"alice", action == Action::"call_tool", resource == Tool::"files__delete");
"#,
    );
    let shown = |tool: &str| set.could_allow(&tool_call("helper", tool, "read_only", json!({})));
    assert!(
        shown("bank__pay"),
        "a permit on an argument: some call could be allowed"
    );
    assert!(
        shown("files__write"),
        "a forbid on an argument denies only some calls"
    );
    assert!(
        !shown("files__delete"),
        "a forbid without conditions denies every call"
    );
    assert!(!shown("mail__send"), "no permit reaches it");
    let mut bob = tool_call("helper", "files__delete", "read_only", json!({}));
    bob.token = Some("bob".into());
    assert!(set.could_allow(&bob), "the forbid is alice's only");
}

#[test]
fn a_forbid_on_who_calls_what_hides_and_one_on_the_call_does_not() {
    let set = policies(
        r#"
@id("all")
permit (principal, action == Action::"call_tool", resource);

@id("no-writes-for-interns")
forbid (principal, action == Action::"call_tool", resource)
when { resource.effect == "non_idempotent_write" && principal has tags && principal.tags.contains("intern") };

@id("no-late-steps")
forbid (principal, action == Action::"call_tool", resource)
when { context.run.step > 10 };
"#,
    );
    let mut intern = tool_call("helper", "files__write", "non_idempotent_write", json!({}));
    intern.agent_tags = vec!["intern".into()];
    assert!(
        !set.could_allow(&intern),
        "every write of an intern is denied"
    );
    let reader = tool_call("helper", "files__read", "read_only", json!({}));
    assert!(
        set.could_allow(&reader),
        "a forbid on the run's step hides nothing"
    );
}
