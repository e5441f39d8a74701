//! Why a tool's input schema is refused, in words an operator can act on.

use super::MAX_ENCODED_BYTES;

/// Why a tool's input schema was refused; the tool is then not offered to providers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SchemaRefusal {
    /// The top-level schema is not an object with `type: "object"`.
    #[error("the top-level schema must be an object with type \"object\"; the tool is refused")]
    NotAnObjectSchema,
    /// The schema uses a keyword that cannot be kept without widening what the tool
    /// accepts (M8 amended).
    #[error(
        "the schema uses {keyword} {}, which cannot be kept for model providers and cannot be dropped without widening what the tool accepts; the tool is refused",
        at(.path)
    )]
    Forbidden {
        /// The keyword, e.g. `prefixItems`, or `items` in its list (tuple) form.
        keyword: String,
        /// Where the schema using it sits, e.g. `properties.address`; empty at the top.
        path: String,
    },
    /// A `$ref` names another document; it is never fetched (M8).
    #[error(
        "the schema refers to {reference:?} {}, outside the tool's own schema; remote references are never fetched, so the tool is refused",
        at(.path)
    )]
    RemoteRef {
        /// The reference as the server wrote it (cut to 200 characters).
        reference: String,
        /// Where the `$ref` sits.
        path: String,
    },
    /// A `$ref` leads back to a schema that holds it: the schema is recursive and has no
    /// finite inlined form.
    #[error(
        "the schema is recursive: {reference:?} {} refers back to a schema that contains it; the tool is refused",
        at(.path)
    )]
    RecursiveRef {
        /// The reference that closes the cycle.
        reference: String,
        /// Where the `$ref` sits.
        path: String,
    },
    /// A local `$ref` that names nothing in the schema, or is not a JSON pointer.
    #[error(
        "the schema's reference {reference:?} {} {problem}; the tool is refused",
        at(.path)
    )]
    UnresolvedRef {
        /// The reference as the server wrote it (cut to 200 characters).
        reference: String,
        /// Where the `$ref` sits.
        path: String,
        /// What is wrong, e.g. `names nothing in the schema`.
        problem: String,
    },
    /// A schema nests deeper than [`MAX_DEPTH`](super::MAX_DEPTH).
    #[error(
        "the schema nests deeper than {limit} levels {}; the tool is refused",
        at(.path)
    )]
    TooDeep {
        /// The depth limit, [`MAX_DEPTH`](super::MAX_DEPTH).
        limit: usize,
        /// Where the first too-deep schema sits.
        path: String,
    },
    /// The normalised schema is larger than [`MAX_ENCODED_BYTES`](super::MAX_ENCODED_BYTES).
    #[error(
        "the normalised schema is {size} bytes, over the limit of {limit}; the tool is refused"
    )]
    TooLarge {
        /// The size of the normalised schema as compact JSON.
        size: usize,
        /// The size limit, [`MAX_ENCODED_BYTES`](super::MAX_ENCODED_BYTES).
        limit: usize,
    },
    /// Inlining the references would build more than [`MAX_SCHEMAS`](super::MAX_SCHEMAS) schema objects.
    #[error(
        "inlining the schema's references builds more than {limit} nested schemas, far over the {} byte limit; the tool is refused",
        MAX_ENCODED_BYTES
    )]
    TooManySchemas {
        /// The limit, [`MAX_SCHEMAS`](super::MAX_SCHEMAS).
        limit: usize,
    },
    /// A kept keyword has a shape providers would reject, e.g. a `required` that is not
    /// a list of strings.
    #[error("{path} {problem}; the tool is refused")]
    Malformed {
        /// The offending keyword's path, e.g. `properties.address.type`.
        path: String,
        /// What is wrong, e.g. `must be a string or list of strings`.
        problem: String,
    },
}

/// Renders where a schema sits for an error message.
pub(super) fn at(path: &str) -> String {
    if path.is_empty() {
        "at the top level".to_owned()
    } else {
        format!("at {path}")
    }
}

/// A reference as it may appear in an error: on one line and at most 200 characters.
pub(super) fn shown(reference: &str) -> String {
    reference
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect()
}

pub(super) fn malformed(path: String, problem: impl Into<String>) -> SchemaRefusal {
    SchemaRefusal::Malformed {
        path,
        problem: problem.into(),
    }
}
