//! The operator's allow list: which private targets the egress guard admits.

use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

use super::spelling::{cut, is_numeric_spelling};

/// An allowlist entry could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid [egress] allow entry {entry:?}: {problem}")]
pub struct PolicyError {
    /// The entry as written.
    pub entry: String,
    /// What is wrong with it.
    pub problem: String,
}

/// The operator's egress policy: an allowlist of exact hosts, addresses and CIDRs that may
/// admit private targets. Public targets need no entry.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    /// Exact host names: lowercase, no trailing dot.
    hosts: Vec<String>,
    /// Addresses (as full-length prefixes) and CIDRs.
    nets: Vec<IpNet>,
    /// Wildcard suffixes (`internal.example` for `*.internal.example`). V4: they never
    /// admit a private address; they are kept for a later "only these public hosts" mode.
    wildcards: Vec<String>,
}

impl EgressPolicy {
    /// Builds a policy from the operator's `[egress] allow` entries: exact host names
    /// (`mcp.internal.example`, case-insensitive, trailing dot ignored), addresses
    /// (`127.0.0.1`, `::1`), CIDRs (`10.1.2.0/24`) and wildcard hosts (`*.example.com`).
    ///
    /// V4: wildcard entries never admit a private address. They are accepted so that a
    /// configuration written for a later "only these public hosts" mode loads today, but
    /// for now they admit nothing a policy without them would refuse.
    pub fn new<S: AsRef<str>>(allow: &[S]) -> Result<Self, PolicyError> {
        let mut policy = Self::default();
        for entry in allow {
            policy.add(entry.as_ref())?;
        }
        Ok(policy)
    }

    /// True when the policy has no entries, so every private target is refused.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && self.nets.is_empty() && self.wildcards.is_empty()
    }

    fn add(&mut self, entry: &str) -> Result<(), PolicyError> {
        let bad = |problem: String| PolicyError {
            entry: cut(entry, 128),
            problem,
        };
        let text = entry.trim();
        if text.is_empty() {
            return Err(bad("the entry is empty".into()));
        }
        if text.contains("://") {
            return Err(bad("write a host, an address or a CIDR, not a URL".into()));
        }
        if text.contains('/') {
            let net = IpNet::from_str(text).map_err(|_| {
                bad("not a CIDR: write an address and a prefix length, as in 10.1.2.0/24".into())
            })?;
            if net.trunc() != net {
                return Err(bad(format!(
                    "host bits are set: did you mean {}?",
                    net.trunc()
                )));
            }
            self.nets.push(net);
            return Ok(());
        }
        let bare = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'));
        if let Ok(ip) = IpAddr::from_str(bare.unwrap_or(text)) {
            self.nets.push(IpNet::from(ip));
            return Ok(());
        }
        let lower = text.to_ascii_lowercase();
        let name = lower.strip_suffix('.').unwrap_or(&lower);
        let (wildcard, name) = match name.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, name),
        };
        if name == "*" {
            return Err(bad("a bare * would admit every host: name the hosts".into()));
        }
        if name.contains('*') {
            return Err(bad(
                "a wildcard must be the whole first label, as in *.internal.example".into(),
            ));
        }
        if name.contains(':') {
            return Err(bad("write the host without a port".into()));
        }
        if is_numeric_spelling(name) {
            return Err(bad("not an IPv4 address: write it as a.b.c.d".into()));
        }
        if !name.is_ascii() {
            return Err(bad(
                "write an internationalised name in its xn-- form".into()
            ));
        }
        let label_ok = |l: &str| {
            (1..=63).contains(&l.len())
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(bad(
                "not a host name: use labels of letters, digits, - and _ separated by dots".into(),
            ));
        }
        if wildcard {
            self.wildcards.push(name.to_owned());
        } else {
            self.hosts.push(name.to_owned());
        }
        Ok(())
    }

    /// V4: an allowlisted exact host admits whatever it resolves to; an allowlisted
    /// address or CIDR admits that address wherever it came from. Wildcards admit nothing.
    pub(super) fn admits(&self, host: &str, addr: IpAddr) -> bool {
        // An IPv4-mapped address reaches the same endpoint as its IPv4 value.
        let canonical = addr.to_canonical();
        self.hosts.iter().any(|h| h == host)
            || self
                .nets
                .iter()
                .any(|n| n.contains(&addr) || n.contains(&canonical))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str]) -> EgressPolicy {
        EgressPolicy::new(allow).expect("test policy")
    }

    #[test]
    fn bad_allowlist_entries_are_refused_with_a_reason() {
        for entry in [
            "10.0.0.0/99",
            "",
            "  ",
            "*",
            "*.",
            "http://x",
            "localhost:8080",
            "a.*.example",
            "10.1.2.7/24",
            "2130706433",
            "exa mple.com",
            "bücher.example",
        ] {
            let err = EgressPolicy::new(&[entry]).expect_err(entry);
            assert!(!err.problem.is_empty(), "{entry:?}");
            assert!(!err.to_string().ends_with('.'), "{err}");
        }
    }

    #[test]
    fn good_allowlist_entries_are_accepted() {
        let allow = [
            "mcp.internal.example",
            "my_service",
            "*.internal.example",
            "127.0.0.1",
            "::1",
            "[::1]",
            "10.1.2.0/24",
            "fd00::/8",
        ];
        assert!(!policy(&allow).is_empty());
        assert!(
            EgressPolicy::new::<&str>(&[])
                .expect("empty policy")
                .is_empty()
        );
    }
}
