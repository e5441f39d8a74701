//! Who watches a run's events as they are stored.

use std::sync::Arc;

use crate::store::RunEvent;

/// Sees every event right after it was stored (the CLI prints them as they happen).
pub type Observer = Arc<dyn Fn(&RunEvent) + Send + Sync>;
