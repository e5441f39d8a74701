//! Cedar policy over every call a run makes: which agent may call which tool or model,
//! or have which secret used, with which arguments; allowed, denied, or held for an
//! operator's approval.
//!
//! [`Policies`] is a validated set of policies, read from files ([`PolicyFile`]) and
//! checked against the schema runwarden ships with ([`SCHEMA`]). [`Policies::decide`]
//! answers one [`Request`] with a [`Verdict`]: a [`Decision`], the ids of the policies
//! that determined it, and why. Deny wins; a permit marked `@approval("required")` asks
//! an operator. The names (`Agent`, `Token`, `Tool`, `Model`, `Secret`, the actions
//! `call_tool`, `call_model`, `read_secret`, the context's `arguments`, `run`, `host`)
//! are the same in every installation; docs/policy.md explains them.
//!
//! ```
//! use runwarden_policy::{Decision, Policies, PolicyFile, Request, RunFacts, Target};
//!
//! let file = PolicyFile {
//!     name: "tools.cedar".into(),
//!     text: r#"permit (principal, action == Action::"call_tool", resource)
//!              when { resource.effect == "read_only" };"#.into(),
//! };
//! let policies = Policies::from_files(&[file]).unwrap();
//! let request = Request {
//!     agent: "helper".into(),
//!     agent_tags: vec![],
//!     token: None,
//!     target: Target::Tool {
//!         id: "docs__read".into(),
//!         server: "docs".into(),
//!         name: "read".into(),
//!         effect: "read_only".into(),
//!     },
//!     arguments: serde_json::Map::new(),
//!     run: RunFacts::default(),
//!     host: "docs.example".into(),
//! };
//! assert_eq!(policies.decide(&request).decision, Decision::Allow);
//! ```

#![deny(missing_docs)]

mod error;
mod index;
mod load;
mod policies;
mod request;
mod schema;
mod value;
mod verdict;

pub use error::{PolicyError, Problem};
pub use load::PolicyFile;
pub use policies::Policies;
pub use request::{Request, RunFacts, Target};
pub use schema::SCHEMA;
pub use verdict::{Decision, NO_PERMIT, Verdict};
