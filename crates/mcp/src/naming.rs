//! M9: the local names `<server>__<tool>` under which imported tools are offered to
//! model providers; the remote name is what goes on the wire.

use std::collections::{BTreeMap, BTreeSet};

/// The longest name providers accept for a tool.
pub(crate) const MAX_LOCAL_NAME: usize = 64;

/// The longest server part of a local name, so that every tool keeps at least 30
/// characters of its own (enough for a collision suffix and part of the tool name).
const MAX_SERVER_PART: usize = 32;

/// Separates the server part from the tool part.
const SEPARATOR: &str = "__";

/// Length of a hash suffix: `_` and 8 hex digits.
const SUFFIX_LEN: usize = 9;

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Maps each remote tool name of `server` to a provider-valid local name (M9);
/// element `i` of the result is the local name of `tools[i]`.
///
/// - A local name is `<server>__<tool>` with every character outside `[A-Za-z0-9_-]`
///   replaced by `_`, so `files/read.v2` on server `docs` becomes `docs__files_read_v2`.
/// - Names are at most 64 characters: the tool part is truncated, and a server part
///   longer than 32 characters is cut to 23 and tagged with a hash of the full server
///   name, so two long server names stay apart.
/// - When distinct remote names map to the same name, one keeps it (a name that
///   needed no sanitising first, then the smallest in byte order) and the others get a
///   suffix `_` + 8 hex digits of a stable hash of their remote name. The choice
///   depends only on the set of names, never on their order.
/// - An empty tool name becomes `<server>__tool` with a suffix, so it never takes the
///   name of a tool really called `tool`.
///
/// Equal remote names get equal local names; distinct remote names get distinct ones.
pub(crate) fn local_names(server: &str, tools: &[&str]) -> Vec<String> {
    let prefix = format!("{}{SEPARATOR}", server_part(server));
    // M9: work on the sorted set of remote names, so input order cannot matter.
    let remote: BTreeSet<&str> = tools.iter().copied().collect();

    // Group the remote names by the name they would take without a suffix.
    let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for &tool in &remote {
        groups
            .entry(base_name(&prefix, tool))
            .or_default()
            .push(tool);
    }

    let mut assigned: BTreeMap<&str, String> = BTreeMap::new();
    let mut taken: BTreeSet<String> = BTreeSet::new();
    let mut suffixed: Vec<(&str, String)> = Vec::new();
    for (base, mut members) in groups {
        // A name that needed no sanitising wins; then byte order decides. The empty
        // name comes last because it never keeps a plain name.
        members.sort_by_key(|tool| (tool.is_empty(), sanitise(tool) != *tool, *tool));
        let mut members = members.into_iter();
        if let Some(first) = members.next() {
            if first.is_empty() {
                suffixed.push((first, base.clone()));
            } else {
                taken.insert(base.clone());
                assigned.insert(first, base.clone());
            }
        }
        suffixed.extend(members.map(|tool| (tool, base.clone())));
    }
    // Suffixed names come after every unsuffixed name is taken, so a suffix never
    // steals a plain name; the salt only matters on a 32-bit hash collision.
    suffixed.sort();
    for (tool, base) in suffixed {
        let stem = &base[..base.len().min(MAX_LOCAL_NAME - SUFFIX_LEN)];
        let mut salt = 0u32;
        let name = loop {
            let candidate = format!("{stem}_{:08x}", fnv1a(tool, salt));
            if !taken.contains(&candidate) {
                break candidate;
            }
            salt += 1;
        };
        taken.insert(name.clone());
        assigned.insert(tool, name);
    }

    tools
        .iter()
        .map(|tool| assigned.get(tool).cloned().unwrap_or_default())
        .collect()
}

/// The name a tool takes when nothing collides with it: prefix and sanitised tool,
/// truncated to [`MAX_LOCAL_NAME`].
fn base_name(prefix: &str, tool: &str) -> String {
    let tool = if tool.is_empty() {
        "tool".to_owned()
    } else {
        sanitise(tool)
    };
    let mut name = format!("{prefix}{tool}");
    // Sanitised names are ASCII, so any byte index is a character boundary.
    name.truncate(MAX_LOCAL_NAME);
    name
}

fn server_part(server: &str) -> String {
    let part = if server.is_empty() {
        "server".to_owned()
    } else {
        sanitise(server)
    };
    if part.len() <= MAX_SERVER_PART {
        return part;
    }
    let stem = &part[..MAX_SERVER_PART - SUFFIX_LEN];
    format!("{stem}_{:08x}", fnv1a(server, 0))
}

/// Replaces every character outside `[A-Za-z0-9_-]` with one `_`.
fn sanitise(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii() && is_name_byte(c as u8) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// FNV-1a, 32 bits, over the name's bytes followed by the salt's when it is not zero.
/// Written out here because std's hasher is seeded per process and names must be
/// stable across restarts.
fn fnv1a(name: &str, salt: u32) -> u32 {
    let salt_bytes = salt.to_le_bytes();
    let salt_bytes: &[u8] = if salt == 0 { &[] } else { &salt_bytes };
    name.bytes()
        .chain(salt_bytes.iter().copied())
        .fold(0x811c_9dc5, |hash, byte| {
            (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `name` is a tool name every provider accepts: 1 to 64 characters from
    /// `[A-Za-z0-9_-]` (M9).
    fn is_valid_local_name(name: &str) -> bool {
        !name.is_empty() && name.len() <= MAX_LOCAL_NAME && name.bytes().all(is_name_byte)
    }

    fn unique(names: &[String]) -> bool {
        names.iter().collect::<BTreeSet<_>>().len() == names.len()
    }

    #[test]
    fn names_are_server_double_underscore_tool() {
        assert_eq!(
            local_names("tickets", &["create", "list-all"]),
            ["tickets__create", "tickets__list-all"]
        );
    }

    #[test]
    fn dots_and_slashes_become_underscores() {
        assert_eq!(
            local_names("my.server", &["files/read.v2", "héllo wörld"]),
            ["my_server__files_read_v2", "my_server__h_llo_w_rld"]
        );
    }

    #[test]
    fn names_never_exceed_64_characters() {
        let long = "t".repeat(200);
        for server in ["s", &"s".repeat(32), &"s".repeat(100)] {
            let names = local_names(server, &[&long, "short", ""]);
            assert!(names.iter().all(|n| is_valid_local_name(n)), "{names:?}");
            assert!(names[0].starts_with(&server[..server.len().min(23)]));
        }
    }

    #[test]
    fn a_long_server_name_is_truncated_and_keeps_room_for_the_tool() {
        let names = local_names(&"s".repeat(100), &["tool_name"]);
        assert_eq!(names[0].len(), MAX_SERVER_PART + "__tool_name".len());
        assert!(names[0].ends_with("__tool_name"));
        let other = local_names(&format!("{}x", "s".repeat(99)), &["tool_name"]);
        assert_ne!(names, other, "long server names stay apart");
    }

    #[test]
    fn collisions_get_distinct_valid_names() {
        let names = local_names("s", &["a.b", "a/b", "a b", "a_b"]);
        assert!(unique(&names), "{names:?}");
        assert!(names.iter().all(|n| is_valid_local_name(n)));
        assert_eq!(
            names[3], "s__a_b",
            "the unsanitised name keeps the plain name"
        );
    }

    #[test]
    fn collisions_resolve_the_same_way_in_any_order() {
        let tools = ["x.y", "x/y", "x_y", "x-y", "", "tool"];
        let forward = local_names("srv", &tools);
        let mut reversed_tools = tools;
        reversed_tools.reverse();
        let mut reversed = local_names("srv", &reversed_tools);
        reversed.reverse();
        assert_eq!(forward, reversed);
        let rotated: Vec<&str> = tools[3..].iter().chain(&tools[..3]).copied().collect();
        let mut back = local_names("srv", &rotated);
        back.rotate_left(3);
        assert_eq!(forward, back);
    }

    #[test]
    fn truncation_collisions_are_resolved_within_64_characters() {
        let a = format!("{}a", "t".repeat(100));
        let b = format!("{}b", "t".repeat(100));
        let names = local_names("s", &[&a, &b]);
        assert!(unique(&names), "{names:?}");
        assert!(names.iter().all(|n| is_valid_local_name(n)));
    }

    #[test]
    fn suffixes_are_stable_across_calls() {
        let forward = local_names("s", &["a.b", "a/b"]);
        let mut backward = local_names("s", &["a/b", "a.b"]);
        backward.reverse();
        assert_eq!(forward, backward);
        assert_eq!(
            forward[0], "s__a_b",
            "the smaller remote name keeps the plain name"
        );
        assert_eq!(forward[1], format!("s__a_b_{:08x}", fnv1a("a/b", 0)));
        // FNV-1a 32 of "a" is 0xe40c292c; the suffix is a pure function of the name.
        assert_eq!(fnv1a("a", 0), 0xe40c_292c);
    }

    #[test]
    fn an_empty_tool_name_gets_tool_and_a_suffix() {
        let names = local_names("s", &["", "tool"]);
        assert_eq!(local_names("s", &["tool", ""])[0], "s__tool");
        assert_eq!(names[1], "s__tool");
        assert_eq!(names[0], format!("s__tool_{:08x}", fnv1a("", 0)));
    }

    #[test]
    fn equal_remote_names_get_equal_local_names() {
        let names = local_names("s", &["a.b", "a.b", "a/b"]);
        assert_eq!(names[0], names[1]);
        assert_ne!(names[0], names[2]);
    }

    #[test]
    fn a_suffix_never_takes_a_name_another_tool_has() {
        let suffixed = format!("a__{:08x}", fnv1a("a/", 0));
        // "a/" and "a_" collide; "a/" would be suffixed into `suffixed`, which a
        // third tool already owns, so it must move on.
        let names = local_names("s", &["a/", "a_", &suffixed]);
        assert!(unique(&names), "{names:?}");
        assert_eq!(names[2], format!("s__{suffixed}"));
    }

    #[test]
    fn validity_follows_the_provider_rule() {
        assert!(is_valid_local_name("a"));
        assert!(is_valid_local_name("A-z_09"));
        assert!(is_valid_local_name(&"a".repeat(64)));
        assert!(!is_valid_local_name(""));
        assert!(!is_valid_local_name(&"a".repeat(65)));
        assert!(!is_valid_local_name("a.b"));
        assert!(!is_valid_local_name("a b"));
        assert!(!is_valid_local_name("é"));
    }
}
