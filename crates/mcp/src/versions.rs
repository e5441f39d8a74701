//! The protocol versions runwarden speaks, and the one it refuses by name.

/// The protocol versions this client accepts, newest first (M17, M19): the stateless
/// 2026-07-28 through `server/discover`, the others through the `initialize` handshake,
/// which offers the second.
pub(crate) const SUPPORTED_VERSIONS: [&str; 4] =
    ["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"];

/// The versions the `initialize` handshake accepts (M17).
pub(crate) const HANDSHAKE_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

/// The version of the old HTTP+SSE transport, refused with a message that says so (M17).
pub(crate) const OLD_HTTP_SSE_VERSION: &str = "2024-11-05";
