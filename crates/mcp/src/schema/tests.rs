//! The normaliser's rules, one test each.

use super::keywords::FORBIDDEN;
use super::*;
use serde_json::json;

fn refusal(schema: Value) -> SchemaRefusal {
    match normalise_input_schema(&schema) {
        Ok(normalised) => panic!("expected a refusal, got {normalised}"),
        Err(refusal) => refusal,
    }
}

fn accepted(schema: Value) -> Value {
    normalise_input_schema(&schema).unwrap_or_else(|r| panic!("refused: {r}"))
}

/// A schema `depth` levels deep: the top level plus `depth - 1` nested properties.
fn nested(depth: usize) -> Value {
    let mut schema = json!({"type": "string"});
    for _ in 1..depth {
        schema = json!({"type": "object", "properties": {"a": schema}});
    }
    schema
}

#[test]
fn an_empty_schema_becomes_an_empty_object() {
    assert_eq!(
        accepted(json!({})),
        json!({"type": "object", "properties": {}})
    );
}

#[test]
fn a_top_level_without_properties_gets_empty_properties() {
    let normalised = accepted(json!({"type": "object"}));
    assert_eq!(normalised, json!({"type": "object", "properties": {}}));
}

#[test]
fn the_top_level_must_be_an_object_type() {
    for schema in [
        json!(null),
        json!(true),
        json!([]),
        json!({"type": "string"}),
        json!({"type": ["object", "null"]}),
        json!({"properties": {"a": {"type": "string"}}}),
        json!({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s"}),
    ] {
        assert_eq!(refusal(schema), SchemaRefusal::NotAnObjectSchema);
    }
}

/// M8 (amended): every keyword that narrows what a model may send survives, with the
/// annotations that tell it what to send. One row per kept keyword.
#[test]
fn every_narrowing_keyword_is_kept_as_it_is() {
    let table: &[(&str, Value, Value)] = &[
        ("const", json!({"type": "string"}), json!("only")),
        ("enum", json!({"type": "string"}), json!(["fast", "slow"])),
        ("pattern", json!({"type": "string"}), json!("^[a-z]+$")),
        ("format", json!({"type": "string"}), json!("date-time")),
        ("minimum", json!({"type": "integer"}), json!(1)),
        ("maximum", json!({"type": "number"}), json!(9.5)),
        ("exclusiveMinimum", json!({"type": "number"}), json!(0)),
        ("exclusiveMaximum", json!({"type": "number"}), json!(100)),
        ("multipleOf", json!({"type": "integer"}), json!(5)),
        ("minLength", json!({"type": "string"}), json!(1)),
        ("maxLength", json!({"type": "string"}), json!(64)),
        ("minItems", json!({"type": "array"}), json!(2)),
        ("maxItems", json!({"type": "array"}), json!(2)),
        ("uniqueItems", json!({"type": "array"}), json!(true)),
        ("minProperties", json!({"type": "object"}), json!(1)),
        ("maxProperties", json!({"type": "object"}), json!(3)),
        ("default", json!({"type": "integer"}), json!(10)),
        ("title", json!({"type": "string"}), json!("Query")),
        (
            "description",
            json!({"type": "string"}),
            json!("what to find"),
        ),
        (
            "items",
            json!({"type": "array"}),
            json!({"type": "string", "maxLength": 9}),
        ),
    ];
    for (keyword, base, value) in table {
        let mut property = base.clone();
        property[*keyword] = value.clone();
        let normalised = accepted(json!({"type": "object", "properties": {"p": property}}));
        assert_eq!(
            normalised["properties"]["p"][*keyword], *value,
            "{keyword} was not kept: {normalised}"
        );
    }
}

#[test]
fn a_literal_stays_a_literal_and_a_bounded_list_stays_bounded() {
    // The issue's examples: `Literal["only"]` must not become any string, and a pair
    // (pydantic's `conlist(min_length=2, max_length=2)`) must not become any array.
    let normalised = accepted(json!({
        "type": "object",
        "properties": {
            "mode": {"const": "only", "type": "string", "title": "Mode"},
            "pair": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}
        },
        "required": ["mode", "pair"]
    }));
    assert_eq!(
        normalised,
        json!({
            "type": "object",
            "properties": {
                "mode": {"const": "only", "type": "string", "title": "Mode"},
                "pair": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}
            },
            "required": ["mode", "pair"]
        })
    );
}

#[test]
fn keywords_that_constrain_nothing_are_dropped() {
    let normalised = accepted(json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.com/search.json",
        "$comment": "internal",
        "type": "object",
        "properties": {
            "query": {"type": "string", "examples": ["x"], "x-vendor": 1, "deprecated": false}
        },
        "additionalProperties": false
    }));
    assert_eq!(
        normalised,
        json!({
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "additionalProperties": false
        })
    );
}

#[test]
fn combinators_not_and_additional_properties_schemas_are_normalised() {
    let normalised = accepted(json!({
        "type": "object",
        "properties": {
            "v": {
                "anyOf": [{"type": "string", "x-a": "x"}, {"type": "null"}],
                "not": {"type": "integer", "$comment": "t"}
            }
        },
        "additionalProperties": {"type": "number", "examples": [3]}
    }));
    assert_eq!(
        normalised,
        json!({
            "type": "object",
            "properties": {
                "v": {"anyOf": [{"type": "string"}, {"type": "null"}], "not": {"type": "integer"}}
            },
            "additionalProperties": {"type": "number"}
        })
    );
}

#[test]
fn a_property_named_like_a_forbidden_keyword_is_not_refused() {
    let schema = json!({"type": "object", "properties": {"$ref": {"type": "string"}, "if": {}}});
    assert!(normalise_input_schema(&schema).is_ok());
}

/// The shape pydantic publishes for a nested model: `$defs` plus `$ref`s, one of them
/// under `anyOf` for an optional field.
#[test]
fn local_refs_are_inlined_and_the_definitions_dropped() {
    let normalised = accepted(json!({
        "$defs": {
            "Address": {
                "properties": {
                    "street": {"title": "Street", "type": "string"},
                    "zip": {"pattern": "^[0-9]{5}$", "title": "Zip", "type": "string"}
                },
                "required": ["street", "zip"],
                "title": "Address",
                "type": "object"
            }
        },
        "properties": {
            "home": {"$ref": "#/$defs/Address"},
            "work": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "default": null}
        },
        "required": ["home"],
        "title": "shipArguments",
        "type": "object"
    }));
    let address = json!({
        "properties": {
            "street": {"title": "Street", "type": "string"},
            "zip": {"pattern": "^[0-9]{5}$", "title": "Zip", "type": "string"}
        },
        "required": ["street", "zip"],
        "title": "Address",
        "type": "object"
    });
    assert_eq!(
        normalised,
        json!({
            "properties": {
                "home": address,
                "work": {"anyOf": [address, {"type": "null"}], "default": null}
            },
            "required": ["home"],
            "title": "shipArguments",
            "type": "object"
        })
    );
}

#[test]
fn draft_seven_definitions_and_escaped_pointers_are_followed() {
    let normalised = accepted(json!({
        "type": "object",
        "definitions": {"a/b": {"type": "integer", "minimum": 0}, "c d": {"type": "boolean"}},
        "properties": {
            "n": {"$ref": "#/definitions/a~1b"},
            "f": {"$ref": "#/definitions/c%20d"}
        }
    }));
    assert_eq!(
        normalised["properties"]["n"],
        json!({"type": "integer", "minimum": 0})
    );
    assert_eq!(normalised["properties"]["f"], json!({"type": "boolean"}));
}

#[test]
fn keywords_beside_a_ref_apply_with_it() {
    let normalised = accepted(json!({
        "type": "object",
        "$defs": {"Id": {"type": "string", "description": "an id", "maxLength": 8}},
        "properties": {
            // The site's description wins over the target's.
            "a": {"$ref": "#/$defs/Id", "description": "the order's id"},
            // A clash that is not an annotation keeps both under allOf.
            "b": {"$ref": "#/$defs/Id", "maxLength": 4}
        }
    }));
    assert_eq!(
        normalised["properties"]["a"],
        json!({"description": "the order's id", "type": "string", "maxLength": 8})
    );
    assert_eq!(
        normalised["properties"]["b"],
        json!({"maxLength": 4, "allOf": [{"type": "string", "description": "an id", "maxLength": 8}]})
    );
}

#[test]
fn a_reference_used_twice_without_a_cycle_is_inlined_twice() {
    let normalised = accepted(json!({
        "type": "object",
        "$defs": {
            "Point": {"type": "object", "properties": {"x": {"type": "number"}}},
            "Line": {"type": "object", "properties": {"a": {"$ref": "#/$defs/Point"}, "b": {"$ref": "#/$defs/Point"}}}
        },
        "properties": {"line": {"$ref": "#/$defs/Line"}}
    }));
    let point = json!({"type": "object", "properties": {"x": {"type": "number"}}});
    assert_eq!(normalised["properties"]["line"]["properties"]["a"], point);
    assert_eq!(normalised["properties"]["line"]["properties"]["b"], point);
}

/// M8 (amended): one row per way a tool is refused, with the words the operator reads.
#[test]
fn every_refusal_names_its_reason() {
    let table: Vec<(Value, &str)> = vec![
        (
            json!({"type": "object", "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}}, "properties": {"head": {"$ref": "#/$defs/Node"}}}),
            "the schema is recursive: \"#/$defs/Node\" at properties.head.properties.next refers back to a schema that contains it",
        ),
        (
            json!({"type": "object", "properties": {"tree": {"type": "array", "items": {"$ref": "#"}}}}),
            "the schema is recursive: \"#\" at properties.tree.items",
        ),
        (
            json!({"type": "object", "properties": {"profile": {"$ref": "https://example.com/profile.json"}}}),
            "refers to \"https://example.com/profile.json\" at properties.profile, outside the tool's own schema; remote references are never fetched",
        ),
        (
            json!({"type": "object", "properties": {"p": {"$ref": "other.json#/a"}}}),
            "remote references are never fetched",
        ),
        (
            json!({"type": "object", "properties": {"p": {"$ref": "#/$defs/Missing"}}}),
            "the schema's reference \"#/$defs/Missing\" at properties.p names nothing in the schema",
        ),
        (
            json!({"type": "object", "properties": {"p": {"$ref": "#addressDef"}}}),
            "is a plain-name anchor; only JSON pointers like \"#/$defs/Name\" are followed",
        ),
        (
            json!({"type": "object", "properties": {"p": {"$ref": 3}}}),
            "properties.p.$ref must be a string",
        ),
        (
            json!({"type": "object", "properties": {"pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]}}}),
            "the schema uses prefixItems at properties.pair, which cannot be kept for model providers and cannot be dropped without widening what the tool accepts",
        ),
        (
            json!({"type": "object", "properties": {"pair": {"type": "array", "items": [{"type": "string"}]}}}),
            "the schema uses items as a list (the tuple form) at properties.pair",
        ),
        (
            json!({"type": "object", "properties": {"o": {"type": "object", "$id": "https://x/o", "properties": {}}}}),
            "$id (an embedded schema resource) at properties.o",
        ),
    ];
    for (schema, words) in table {
        let text = refusal(schema.clone()).to_string();
        assert!(
            text.contains(words),
            "{schema}\n  gave: {text}\n  want: {words}"
        );
        assert!(text.ends_with("the tool is refused"), "{text}");
    }
}

#[test]
fn every_forbidden_keyword_refuses_the_tool_wherever_it_sits() {
    for &keyword in FORBIDDEN {
        let wrap = |inner: Value| -> Vec<(Value, &'static str)> {
            vec![
                (
                    json!({"type": "object", "properties": {}, keyword: inner.clone()}),
                    "",
                ),
                (
                    json!({"type": "object", "properties": {"p": {"type": "object", keyword: inner.clone()}}}),
                    "properties.p",
                ),
                (
                    json!({"type": "object", "properties": {"p": {"anyOf": [{"type": "null"}, {"type": "string", keyword: inner.clone()}]}}}),
                    "properties.p.anyOf[1]",
                ),
                (
                    json!({"type": "object", "additionalProperties": {keyword: inner.clone()}}),
                    "additionalProperties",
                ),
                (
                    json!({"type": "object", "properties": {"l": {"type": "array", "items": {keyword: inner.clone()}}}}),
                    "properties.l.items",
                ),
                (
                    json!({"type": "object", "properties": {"n": {"not": {keyword: inner}}}}),
                    "properties.n.not",
                ),
                // Reached through a reference: refused where the reference sits.
                (
                    json!({"type": "object", "$defs": {"d": {keyword: {}}}, "properties": {"r": {"$ref": "#/$defs/d"}}}),
                    "properties.r",
                ),
            ]
        };
        for (schema, path) in wrap(json!({})) {
            assert_eq!(
                refusal(schema),
                SchemaRefusal::Forbidden {
                    keyword: keyword.to_owned(),
                    path: path.to_owned()
                },
                "{keyword} at {path:?}"
            );
        }
    }
}

#[test]
fn an_unused_definition_is_not_looked_at() {
    let schema = json!({"type": "object", "$defs": {"unused": {"if": {}, "$ref": "https://x"}}});
    assert!(normalise_input_schema(&schema).is_ok());
}

#[test]
fn depth_twelve_is_accepted() {
    assert!(normalise_input_schema(&nested(MAX_DEPTH)).is_ok());
}

#[test]
fn depth_thirteen_is_refused() {
    let refused = refusal(nested(MAX_DEPTH + 1));
    assert!(matches!(refused, SchemaRefusal::TooDeep { limit: 12, .. }));
    assert!(refused.to_string().contains("deeper than 12 levels"));
}

#[test]
fn depth_counts_the_inlined_schemas() {
    // Twelve nested levels only once the chain of references is inlined.
    let mut defs = Map::new();
    defs.insert("d0".into(), json!({"type": "string"}));
    for i in 1..12 {
        defs.insert(
            format!("d{i}"),
            json!({"type": "object", "properties": {"a": {"$ref": format!("#/$defs/d{}", i - 1)}}}),
        );
    }
    let fits = json!({"type": "object", "$defs": defs.clone(), "properties": {"a": {"$ref": "#/$defs/d10"}}});
    assert!(normalise_input_schema(&fits).is_ok());
    let deeper =
        json!({"type": "object", "$defs": defs, "properties": {"a": {"$ref": "#/$defs/d11"}}});
    assert!(matches!(refusal(deeper), SchemaRefusal::TooDeep { .. }));
}

#[test]
fn references_that_fan_out_are_stopped_before_they_are_built() {
    // Each definition names the next one twice: 2^11 copies of the last, from a
    // schema of a few hundred bytes.
    let mut defs = Map::new();
    defs.insert(
        "d0".into(),
        json!({"type": "string", "description": "x".repeat(20)}),
    );
    for i in 1..11 {
        let prev = format!("#/$defs/d{}", i - 1);
        defs.insert(
            format!("d{i}"),
            json!({"type": "object", "properties": {"a": {"$ref": prev}, "b": {"$ref": prev}}}),
        );
    }
    let schema =
        json!({"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d10"}}});
    let refused = refusal(schema);
    assert!(
        matches!(
            refused,
            SchemaRefusal::TooManySchemas { .. } | SchemaRefusal::TooLarge { .. }
        ),
        "{refused}"
    );
}

#[test]
fn a_schema_over_16_kib_after_normalising_is_refused() {
    let description = "d".repeat(MAX_ENCODED_BYTES);
    let refused = refusal(json!({"type": "object", "description": description}));
    assert!(
        matches!(refused, SchemaRefusal::TooLarge { size, limit: 16384 } if size > 16384),
        "{refused:?}"
    );
}

#[test]
fn size_is_measured_after_dropping_keywords() {
    let schema = json!({"type": "object", "$comment": "t".repeat(2 * MAX_ENCODED_BYTES)});
    assert!(normalise_input_schema(&schema).is_ok());
}

#[test]
fn malformed_shapes_are_refused_naming_the_path() {
    for (schema, message) in [
        (
            json!({"type": "object", "properties": {"address": {"type": 3}}}),
            "properties.address.type must be a string or list of strings",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "int"}}}),
            "properties.a.type names an unknown type \"int\"",
        ),
        (
            json!({"type": "object", "required": "a"}),
            "required must be a list of strings",
        ),
        (
            json!({"type": "object", "required": ["a", 1]}),
            "required must be a list of strings",
        ),
        (
            json!({"type": "object", "properties": []}),
            "properties must be an object of schemas",
        ),
        (
            json!({"type": "object", "properties": {"a": "string"}}),
            "properties.a must be a schema object",
        ),
        (
            json!({"type": "object", "properties": {"a": {"anyOf": []}}}),
            "properties.a.anyOf must be a non-empty list of schemas",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "maxLength": -1}}}),
            "properties.a.maxLength must be a non-negative integer",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": 5}}}),
            "properties.a.pattern must be a string",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 0}}}),
            "properties.a.multipleOf must be a number greater than 0",
        ),
    ] {
        assert_eq!(
            refusal(schema).to_string(),
            format!("{message}; the tool is refused")
        );
    }
}

#[test]
fn normalising_is_deterministic_and_idempotent() {
    let schema = json!({
        "type": "object",
        "$defs": {"N": {"type": ["integer", "null"], "minimum": 0}},
        "properties": {"b": {"type": "string", "format": "uri"}, "a": {"$ref": "#/$defs/N"}},
        "required": ["b"]
    });
    let once = accepted(schema.clone());
    let again = accepted(schema);
    assert_eq!(once.to_string(), again.to_string());
    let twice = accepted(once.clone());
    assert_eq!(once.to_string(), twice.to_string());
}
