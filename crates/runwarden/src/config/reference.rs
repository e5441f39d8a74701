//! docs/configuration.md, generated from the file's types and their doc comments, and
//! the environment variables runwarden reads.

use std::collections::VecDeque;

use serde_json::Value;

use super::file::FileConfig;
use crate::output::on_one_line;

/// Every environment variable runwarden reads, with what it does (the reference's second
/// table; a test checks that the sources read no other).
pub(crate) const ENVIRONMENT: [(&str, &str); 13] = [
    (
        "RUNWARDEN_CONFIG",
        "The configuration file, when `--config` is not given. Default `./runwarden.toml`.",
    ),
    ("RUNWARDEN_DATA_DIR", "Overrides `data_dir`."),
    (
        "RUNWARDEN_DATABASE_URL",
        "Overrides `[store] url`: `sqlite:PATH` or `postgres://...`.",
    ),
    ("RUNWARDEN_SQLITE_PATH", "Overrides `[store] sqlite_path`."),
    (
        "RUNWARDEN_DURABILITY",
        "Overrides `[store] durability`: `power_cut` or `process_crash`.",
    ),
    (
        "RUNWARDEN_MASTER_KEY_FILE",
        "Overrides `[vault] master_key_file`.",
    ),
    (
        "RUNWARDEN_MASTER_KEY",
        "The master key itself, as 64 hex characters, instead of the key file.",
    ),
    (
        "RUNWARDEN_AUDIT_ANCHOR_FILE",
        "Overrides `[vault] audit_anchor_file`.",
    ),
    (
        "RUNWARDEN_EGRESS_ALLOW",
        "Overrides `[egress] allow`: comma-separated hosts, addresses and CIDRs.",
    ),
    (
        "RUNWARDEN_LOG",
        "The log filter (`info`, `debug`, `runwarden_vault=trace`). Default `warn`.",
    ),
    (
        "RUNWARDEN_LOG_FORMAT",
        "`text` or `json`, like `--log-format`; overrides `[log] format`.",
    ),
    (
        "RUNWARDEN_SERVER",
        "The server the CLI talks to, like `--server`; overrides `[client] server`.",
    ),
    (
        "RUNWARDEN_TOKEN",
        "The CLI's API token; overrides `[client] token_file`.",
    ),
];

/// docs/configuration.md: every key of the file, generated from [`FileConfig`]'s types and
/// their doc comments, then every environment variable. An empty variable counts as unset.
/// Written by a test (see `the_configuration_reference_is_current`).
pub(crate) fn reference() -> String {
    let root = serde_json::to_value(schemars::schema_for!(FileConfig)).unwrap_or(Value::Null);
    let defs = root.get("$defs").cloned().unwrap_or(Value::Null);
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the configuration file's types by `cargo test -p runwarden config::tests::\
         the_configuration_reference_is_current` (set `RUNWARDEN_BLESS=1` to rewrite it); do not \
         edit by hand. The file is `--config PATH`, else `$RUNWARDEN_CONFIG`, else \
         `./runwarden.toml`. Unknown keys are errors; relative paths are relative to the file. \
         `runwarden init` writes a commented example.\n",
    );
    // Sections are written breadth-first so a section comes before its subsections.
    let mut queue: VecDeque<(String, Value)> = VecDeque::new();
    queue.push_back((String::new(), root.clone()));
    while let Some((path, schema)) = queue.pop_front() {
        if let Some(text) = section(&defs, &path, &schema, &mut queue) {
            out.push_str(&text);
        }
    }
    out.push_str("\n## Environment\n\nThe environment overrides the file; an empty variable counts as unset.\n\n| variable | meaning |\n| --- | --- |\n");
    for (name, meaning) in ENVIRONMENT {
        out.push_str(&format!("| `{name}` | {meaning} |\n"));
    }
    out
}

/// The schema a field stands for: `Option<T>` is `anyOf: [T, null]`; a section is a
/// `$ref` into `$defs`.
fn resolve(defs: &Value, schema: &Value) -> Value {
    let schema = schema
        .get("anyOf")
        .and_then(Value::as_array)
        .and_then(|all| {
            all.iter()
                .find(|s| s.get("type") != Some(&Value::from("null")))
        })
        .unwrap_or(schema);
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => defs
            .get(r.trim_start_matches("#/$defs/"))
            .cloned()
            .unwrap_or(Value::Null),
        None => schema.clone(),
    }
}

/// A key's type as the reference names it: `string`, `integer`, `list of string`, `table`.
fn kind(schema: &Value) -> String {
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(all)) => all.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let types: Vec<&str> = types.into_iter().filter(|t| *t != "null").collect();
    match types.as_slice() {
        ["array"] => format!(
            "list of {}",
            schema.get("items").map(kind).unwrap_or_default()
        ),
        ["integer"] => "integer".into(),
        ["object"] => "table".into(),
        [one] => (*one).to_string(),
        _ => "table".into(),
    }
}

/// One section of the reference: its heading, its doc and a table of its keys; its
/// subsections (tables, and maps of tables such as `[agents.NAME]`) go on the queue.
/// `None` for a section with nothing to say (the top level, when it holds no key).
fn section(
    defs: &Value,
    path: &str,
    schema: &Value,
    queue: &mut VecDeque<(String, Value)>,
) -> Option<String> {
    let properties = schema.get("properties").and_then(Value::as_object)?;
    let child = |name: &str| {
        if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        }
    };
    let mut rows = Vec::new();
    // Keys in name order: serde_json keeps insertion order when a dependency (cedar-policy)
    // turns its `preserve_order` on, and the reference must not depend on that.
    let mut keys: Vec<(&String, &Value)> = properties.iter().collect();
    keys.sort_by(|a, b| a.0.cmp(b.0));
    for (key, field) in keys {
        let target = resolve(defs, field);
        let doc = field
            .get("description")
            .or_else(|| target.get("description"))
            .and_then(Value::as_str)
            .map(on_one_line)
            .unwrap_or_default();
        if target.get("properties").is_some() {
            let mut described = target.clone();
            if let Some(obj) = described.as_object_mut()
                && !doc.is_empty()
            {
                obj.insert("description".into(), Value::from(doc.clone()));
            }
            queue.push_back((child(key), described));
        } else if let Some(values) = target
            .get("additionalProperties")
            .filter(|v| resolve(defs, v).get("properties").is_some())
        {
            let name = if key == "tools" { "TOOL" } else { "NAME" };
            let mut described = resolve(defs, values);
            if let Some(obj) = described.as_object_mut() {
                obj.insert("description".into(), Value::from(doc.clone()));
            }
            queue.push_back((child(&format!("{key}.{name}")), described));
        } else {
            rows.push(format!("| `{key}` | {} | {doc} |", kind(&target)));
        }
    }
    let doc = schema.get("description").and_then(Value::as_str);
    if rows.is_empty() && !path.is_empty() {
        let doc = doc.map(on_one_line).unwrap_or_default();
        return Some(format!("\n## `[{path}]`\n\n{doc}\n"));
    }
    let mut out = if path.is_empty() {
        "\n## Top level\n\n".to_string()
    } else {
        format!("\n## `[{path}]`\n\n")
    };
    if let Some(doc) = doc.filter(|_| !path.is_empty()) {
        out.push_str(&format!("{}\n\n", on_one_line(doc)));
    }
    out.push_str("| key | type | meaning |\n| --- | --- | --- |\n");
    for row in rows {
        out.push_str(&row);
        out.push('\n');
    }
    Some(out)
}
