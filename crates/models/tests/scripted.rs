//! The scripted provider (L2): stateless replay by assistant turn count.

use runwarden_models::{
    Message, ModelError, ModelProvider, ModelRequest, Scripted, ToolCallRequest,
};
use runwarden_vault::CancelFlag;
use serde_json::json;

const PLAN: &str = r#"[
  {"tool_calls": [
    {"name": "tickets__search", "arguments": {"q": "printer"}},
    {"name": "tickets__create", "arguments": {"title": "Printer on fire"}}
  ]},
  {"text": "Ticket T-1 filed."}
]"#;

fn after(assistant_turns: usize) -> ModelRequest {
    let mut messages = vec![Message::User {
        text: "The printer is on fire.".into(),
    }];
    for n in 0..assistant_turns {
        messages.push(Message::Assistant {
            text: None,
            tool_calls: Vec::new(),
        });
        messages.push(Message::Tool {
            call_id: format!("c{n}"),
            name: "tickets__search".into(),
            content: "ok".into(),
            is_error: false,
        });
    }
    ModelRequest {
        system: None,
        messages,
        tools: Vec::new(),
        correlation: None,
        progress: None,
        max_tokens: None,
    }
}

#[tokio::test]
async fn the_scripted_plan_replays_by_assistant_turn_count() {
    let plan = Scripted::from_json(PLAN).unwrap();

    let first = plan.complete(&after(0), None).await.unwrap();
    assert_eq!(first.text, None);
    assert_eq!(
        first.tool_calls,
        vec![
            ToolCallRequest {
                id: "call-1-1".into(),
                name: "tickets__search".into(),
                arguments: json!({"q": "printer"}),
                invalid_arguments: None,
            },
            ToolCallRequest {
                id: "call-1-2".into(),
                name: "tickets__create".into(),
                arguments: json!({"title": "Printer on fire"}),
                invalid_arguments: None,
            },
        ]
    );
    // Stateless: asking the same conversation again (a restarted run) replays the same turn.
    assert_eq!(plan.complete(&after(0), None).await.unwrap(), first);

    let second = plan.complete(&after(1), None).await.unwrap();
    assert_eq!(second.text.as_deref(), Some("Ticket T-1 filed."));
    assert!(second.tool_calls.is_empty());
}

#[tokio::test]
async fn a_scripted_plan_past_its_end_says_so() {
    let plan = Scripted::from_json(PLAN).unwrap();
    let error = plan.complete(&after(2), None).await.unwrap_err();
    assert!(matches!(error, ModelError::Script(_)), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("the plan has 2 turns; turn 3 was asked for"),
        "{error}"
    );
}

#[tokio::test]
async fn a_scripted_call_honours_a_cancelled_signal() {
    let plan = Scripted::from_json(PLAN).unwrap();
    let flag = CancelFlag::new();
    assert!(plan.complete(&after(0), Some(&flag)).await.is_ok());
    flag.cancel();
    let error = plan.complete(&after(0), Some(&flag)).await.unwrap_err();
    assert!(
        matches!(error, ModelError::Cancelled { in_flight: false }),
        "{error:?}"
    );
}

#[test]
fn a_malformed_plan_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.json");
    std::fs::write(&path, r#"[{"text": "hi"}, {"tool_call": [{"name": "t"}]}]"#).unwrap();
    let error = Scripted::from_file(&path).unwrap_err().to_string();
    assert!(error.contains(&path.display().to_string()), "{error}");
    assert!(
        error.contains("turn 2 has an unknown key \"tool_call\""),
        "{error}"
    );

    std::fs::write(&path, "[{\"text\": ").unwrap();
    let error = Scripted::from_file(&path).unwrap_err().to_string();
    assert!(
        error.contains("plan.json") && error.contains("not JSON"),
        "{error}"
    );

    let missing = dir.path().join("absent.json");
    let error = Scripted::from_file(&missing).unwrap_err().to_string();
    assert!(
        error.contains("could not read") && error.contains("absent.json"),
        "{error}"
    );

    std::fs::write(&path, PLAN).unwrap();
    assert_eq!(Scripted::from_file(&path).unwrap().turn_count(), 2);
}
