//! The egress guard: which targets a call may reach, decided before any secret is read.

use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

use ipnet::IpNet;
use url::{Host, Url};

use crate::resolver::Resolver;

mod ranges;

pub(crate) use ranges::forbidden_range;

/// Why the guard refused a target. The text never contains a query string or a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The URL does not parse or has no host.
    #[error("invalid URL: {reason}")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// The scheme is not http or https.
    #[error("scheme {scheme:?} is not allowed: only http and https")]
    Scheme {
        /// The scheme found.
        scheme: String,
    },
    /// The URL carries a user name or password, which would bypass the vault.
    #[error("the URL carries credentials; name a vault secret instead")]
    CredentialsInUrl,
    /// The host is a legacy numeric IPv4 spelling such as `2130706433` or `0x7f.1`.
    #[error("host {host:?} is a legacy numeric IPv4 spelling; write the address as a.b.c.d")]
    LegacyNumericHost {
        /// The host as written.
        host: String,
    },
    /// The host resolves to (or is) an address in a forbidden range.
    #[error(
        "host {host:?} resolves to {addr} in {range}; add it to [egress] allow if this is intended"
    )]
    ForbiddenAddress {
        /// The normalised host.
        host: String,
        /// The offending address.
        addr: IpAddr,
        /// The range it falls in, named ("loopback 127.0.0.0/8").
        range: &'static str,
    },
    /// The host did not resolve.
    #[error("host {host:?} does not resolve")]
    Unresolvable {
        /// The normalised host.
        host: String,
    },
}

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

/// A target that passed the guard: where the connection may go, and nowhere else.
#[derive(Debug, Clone)]
pub(crate) struct VettedTarget {
    /// The parsed URL (host normalised).
    pub(crate) url: url::Url,
    /// The normalised host: lowercase, no brackets, no trailing dot.
    pub(crate) host: String,
    /// The port, explicit or the scheme's default.
    pub(crate) port: u16,
    /// The vetted addresses (for an IP literal, that address alone).
    pub(crate) addrs: Vec<IpAddr>,
    /// True when the host was written as an IP address.
    pub(crate) ip_literal: bool,
}

impl VettedTarget {
    /// The host as the audit log shows it: with the port when it is not the scheme's own.
    pub(crate) fn audit_host(&self) -> String {
        let default = match self.url.scheme() {
            "https" => 443,
            _ => 80,
        };
        match (self.port == default, self.host.contains(':')) {
            (true, _) => self.host.clone(),
            (false, false) => format!("{}:{}", self.host, self.port),
            (false, true) => format!("[{}]:{}", self.host, self.port),
        }
    }
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
    fn admits(&self, host: &str, addr: IpAddr) -> bool {
        // An IPv4-mapped address reaches the same endpoint as its IPv4 value.
        let canonical = addr.to_canonical();
        self.hosts.iter().any(|h| h == host)
            || self
                .nets
                .iter()
                .any(|n| n.contains(&addr) || n.contains(&canonical))
    }
}

/// Decides whether `raw_url` may be reached under `policy`, resolving its host once.
///
/// V4, in this order: scheme, legacy numeric spellings (judged on the text as written,
/// before the URL parser silently rewrites them), credentials in the URL, host
/// normalisation, one resolution, then every address against the forbidden ranges.
pub(crate) async fn vet_target(
    policy: &EgressPolicy,
    resolver: &dyn Resolver,
    raw_url: &str,
) -> Result<VettedTarget, Refusal> {
    // The URL standard ignores leading and trailing controls and spaces; so do we.
    let text = trim_url(raw_url);

    // V4 (a): http or https only, decided on the text itself.
    let (scheme, rest) = split_scheme(text)?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(Refusal::Scheme {
            scheme: cut(&scheme.to_ascii_lowercase(), 32),
        });
    }
    // The parser deletes tabs and newlines anywhere, which could hide a host from the
    // checks below; such a URL is never legitimate.
    if text.chars().any(|c| c.is_ascii_control()) {
        return Err(invalid("the URL contains control characters"));
    }

    // V4 (b): legacy numeric IPv4 spellings, judged as written.
    let (has_userinfo, raw_host) = split_authority(raw_authority(rest));
    let raw_host = raw_host.to_ascii_lowercase();
    if is_legacy_numeric(&raw_host) {
        return Err(legacy(&raw_host));
    }

    // V4 (c): parse; no credentials in the URL; a host is required.
    let mut url = Url::parse(text).map_err(|e| invalid(&e.to_string()))?;
    if has_userinfo || !url.username().is_empty() || url.password().is_some() {
        return Err(Refusal::CredentialsInUrl);
    }
    let (host, literal) = match url.host() {
        None => return Err(invalid("the URL has no host")),
        // Percent-encoded or full-width digits also become an IPv4 address in the
        // parser: whatever it made an address must have been written as one.
        Some(Host::Ipv4(ip)) if raw_host != ip.to_string() => return Err(legacy(&raw_host)),
        Some(Host::Ipv4(ip)) => (ip.to_string(), Some(IpAddr::V4(ip))),
        Some(Host::Ipv6(ip)) => (ip.to_string(), Some(IpAddr::V6(ip))),
        Some(Host::Domain(name)) => (name.to_ascii_lowercase(), None),
    };

    // V4 (d): normalise: lowercase (done), no brackets (done), one trailing dot dropped,
    // the port explicit or the scheme's default.
    let host = match host.strip_suffix('.') {
        Some(stripped) => stripped.to_owned(),
        None => host,
    };
    if literal.is_none() {
        // An empty label ("a..b", or "10.0.0.1.." which would become the literal
        // 10.0.0.1 once a dot is dropped) is refused rather than resolved.
        if host.split('.').any(str::is_empty) {
            return Err(invalid("the host has an empty label"));
        }
        if url.host_str() != Some(host.as_str()) {
            url.set_host(Some(&host))
                .map_err(|e| invalid(&e.to_string()))?;
        }
    }
    let port = url
        .port_or_known_default()
        .ok_or_else(|| invalid("the URL has no port"))?;

    // V4 (e): an address is itself; a name is resolved exactly once, and only the
    // addresses of that one answer are ever connected to (no DNS rebinding).
    let addrs = match literal {
        Some(ip) => vec![ip],
        None => match resolver.resolve(&host).await {
            Ok(addrs) if !addrs.is_empty() => addrs,
            _ => return Err(Refusal::Unresolvable { host }),
        },
    };

    // V4 (f): every address, not just the first, must be public or admitted.
    for &addr in &addrs {
        if let Some(range) = forbidden_range(addr)
            && !policy.admits(&host, addr)
        {
            return Err(Refusal::ForbiddenAddress { host, addr, range });
        }
    }

    Ok(VettedTarget {
        url,
        host,
        port,
        addrs,
        ip_literal: literal.is_some(),
    })
}

/// A best-effort (host, path) for the audit row of a call that may have been refused:
/// never the query string, never the fragment, never userinfo. Unparsable input gives
/// the host as written when it is made of plain host characters, else nothing.
pub(crate) fn describe_for_audit(raw_url: &str) -> (String, String) {
    let text = trim_url(raw_url);
    if let Ok(url) = Url::parse(text)
        && matches!(url.scheme(), "http" | "https")
    {
        let host = match url.host() {
            Some(Host::Domain(name)) => name.strip_suffix('.').unwrap_or(name).to_owned(),
            Some(Host::Ipv4(ip)) => ip.to_string(),
            Some(Host::Ipv6(ip)) => ip.to_string(),
            None => String::new(),
        };
        // A refused row keeps the port, as an answered one does (`Target::audit_host`):
        // `127.0.0.1:8080` and `127.0.0.1:9090` are different services. `port()` is
        // `None` for the scheme's default port.
        let host = match (url.port(), host.contains(':')) {
            (None, _) => host,
            (Some(port), false) => format!("{host}:{port}"),
            (Some(port), true) => format!("[{host}]:{port}"),
        };
        return (cut(&host, 253), cut(url.path(), 256));
    }
    let Ok((scheme, rest)) = split_scheme(text) else {
        return (String::new(), String::new());
    };
    // Another scheme (`file:///etc/passwd`, `ftp://...`) is shown as what it is: the
    // scheme and authority in the host column and the path beside it, never a path
    // segment read as a host (`etc`). Userinfo, query and fragment stay out.
    let scheme = scheme.to_ascii_lowercase();
    let plain_scheme = scheme
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
    if let Ok(url) = Url::parse(text)
        && plain_scheme
    {
        let host = url.host_str().unwrap_or_default();
        let host = match url.port() {
            Some(port) => format!("{scheme}://{host}:{port}"),
            None => format!("{scheme}://{host}"),
        };
        return (cut(&host, 253), cut(url.path(), 256));
    }
    let (_, host) = split_authority(raw_authority(rest));
    let plain = host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b));
    let host = if plain && plain_scheme {
        cut(&format!("{scheme}://{}", host.to_ascii_lowercase()), 64)
    } else {
        String::new()
    };
    (host, String::new())
}

fn invalid(reason: &str) -> Refusal {
    Refusal::InvalidUrl {
        reason: cut(reason, 200),
    }
}

fn legacy(host: &str) -> Refusal {
    Refusal::LegacyNumericHost {
        host: cut(host, 64),
    }
}

/// At most `max` characters of `text`.
fn cut(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// Drops what the URL standard drops: leading and trailing C0 controls and spaces.
fn trim_url(raw: &str) -> &str {
    raw.trim_matches(|c: char| c <= ' ')
}

/// Splits `scheme:rest`. A missing or malformed scheme is an invalid URL.
fn split_scheme(text: &str) -> Result<(&str, &str), Refusal> {
    let missing = || invalid("no scheme: write the URL as http://host/ or https://host/");
    let (scheme, rest) = text.split_once(':').ok_or_else(missing)?;
    let mut chars = scheme.chars();
    let well_formed = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if well_formed {
        Ok((scheme, rest))
    } else {
        Err(missing())
    }
}

/// The authority as the URL standard reads it for http and https: after any run of
/// slashes or backslashes, up to the first slash, backslash, `?` or `#`.
fn raw_authority(after_scheme: &str) -> &str {
    let start = after_scheme.trim_start_matches(['/', '\\']);
    let end = start.find(['/', '\\', '?', '#']).unwrap_or(start.len());
    &start[..end]
}

/// Whether the authority carries userinfo, and its host text (brackets kept, port cut).
fn split_authority(authority: &str) -> (bool, &str) {
    let (has_userinfo, host_port) = match authority.rsplit_once('@') {
        Some((_, host_port)) => (true, host_port),
        None => (false, authority),
    };
    let host = if host_port.starts_with('[') {
        host_port
            .find(']')
            .map_or(host_port, |end| &host_port[..=end])
    } else {
        host_port.split(':').next().unwrap_or(host_port)
    };
    (has_userinfo, host)
}

/// True for a host the URL parser would read as an IPv4 address (dot-separated decimal
/// or `0x` hexadecimal parts, one trailing dot allowed) that is not the canonical form
/// `a.b.c.d`: four decimal parts, no leading zeros, no trailing dot.
fn is_legacy_numeric(host: &str) -> bool {
    is_numeric_spelling(host) && !Ipv4Addr::from_str(host).is_ok_and(|ip| ip.to_string() == host)
}

fn is_numeric_spelling(host: &str) -> bool {
    let body = host.strip_suffix('.').unwrap_or(host);
    let numeric_part = |part: &str| match part.strip_prefix("0x") {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()),
    };
    !body.is_empty() && body.split('.').all(numeric_part)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;

    use super::*;

    /// Answers from a fixed table and counts the questions. Opens no socket.
    struct TestResolver {
        answers: HashMap<&'static str, Vec<IpAddr>>,
        calls: AtomicUsize,
    }

    impl TestResolver {
        fn new() -> Self {
            let table: &[(&'static str, &[&str])] = &[
                ("public.test", &["93.184.216.34"]),
                ("localhost", &["127.0.0.1"]),
                ("metadata.test", &["169.254.169.254"]),
                ("mixed.test", &["8.8.8.8", "10.0.0.1"]),
                ("v6loop.test", &["::1"]),
                ("mapped.test", &["::ffff:127.0.0.1"]),
                ("empty.test", &[]),
                ("mcp.internal.example", &["10.9.8.7"]),
                ("other.internal.example", &["10.9.8.8"]),
            ];
            let answers = table
                .iter()
                .map(|&(name, addrs)| (name, addrs.iter().map(|a| ip(a)).collect()))
                .collect();
            Self {
                answers,
                calls: AtomicUsize::new(0),
            }
        }

        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    #[async_trait]
    impl Resolver for TestResolver {
        async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.answers
                .get(host)
                .cloned()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such host"))
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address")
    }

    fn policy(allow: &[&str]) -> EgressPolicy {
        EgressPolicy::new(allow).expect("test policy")
    }

    async fn vet(allow: &[&str], url: &str) -> Result<VettedTarget, Refusal> {
        vet_target(&policy(allow), &TestResolver::new(), url).await
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        Invalid,
        Scheme,
        Credentials,
        Legacy,
        Forbidden,
        Unresolvable,
    }

    fn kind(refusal: &Refusal) -> Kind {
        match refusal {
            Refusal::InvalidUrl { .. } => Kind::Invalid,
            Refusal::Scheme { .. } => Kind::Scheme,
            Refusal::CredentialsInUrl => Kind::Credentials,
            Refusal::LegacyNumericHost { .. } => Kind::Legacy,
            Refusal::ForbiddenAddress { .. } => Kind::Forbidden,
            Refusal::Unresolvable { .. } => Kind::Unresolvable,
        }
    }

    #[tokio::test]
    async fn hostile_targets_are_refused_with_the_right_reason() {
        use Kind::*;
        let table: &[(&str, Kind)] = &[
            // Every forbidden IPv4 range, by literal.
            ("http://0.0.0.0/", Forbidden),
            ("http://0.1.2.3/", Forbidden),
            ("http://127.0.0.1/", Forbidden),
            ("http://127.0.0.1:9/", Forbidden),
            ("http://127.255.255.254/", Forbidden),
            ("http://10.0.0.1/", Forbidden),
            ("http://172.16.0.1/", Forbidden),
            ("http://172.31.255.255/", Forbidden),
            ("http://192.168.1.1/", Forbidden),
            ("http://100.64.0.1/", Forbidden),
            ("http://100.127.255.254/", Forbidden),
            ("http://169.254.169.254/latest/meta-data/", Forbidden),
            ("http://192.0.0.170/", Forbidden),
            ("http://198.18.0.1/", Forbidden),
            ("http://198.19.255.1/", Forbidden),
            ("http://224.0.0.1/", Forbidden),
            ("http://239.255.255.250/", Forbidden),
            ("http://240.0.0.1/", Forbidden),
            ("http://255.255.255.255/", Forbidden),
            ("http://192.0.2.1/", Forbidden),
            ("http://198.51.100.7/", Forbidden),
            ("http://203.0.113.9/", Forbidden),
            // Every forbidden IPv6 range, by literal.
            ("http://[::1]:8080/", Forbidden),
            ("http://[::]/", Forbidden),
            ("http://[0:0:0:0:0:0:0:1]/", Forbidden),
            ("http://[fc00::1]/", Forbidden),
            ("http://[fd12:3456::1]/", Forbidden),
            ("http://[fe80::1]/", Forbidden),
            ("http://[ff02::1]/", Forbidden),
            ("http://[100::1]/", Forbidden),
            ("http://[2001:db8::1]/", Forbidden),
            // IPv6 transition forms, judged by their IPv4 value (NAT64 outright).
            ("http://[::ffff:127.0.0.1]/", Forbidden),
            ("http://[::ffff:a9fe:a9fe]/", Forbidden),
            ("http://[::127.0.0.1]/", Forbidden),
            ("http://[2002:7f00:1::]/", Forbidden),
            ("http://[2002:a9fe:a9fe::1]/", Forbidden),
            ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", Forbidden),
            ("http://[2001:0:a00:1::f7f7:f7f7]/", Forbidden),
            ("http://[64:ff9b::808:808]/", Forbidden),
            // Legacy numeric spellings of 127.0.0.1, and disguises the parser undoes.
            ("http://2130706433/", Legacy),
            ("http://0x7f000001/", Legacy),
            ("http://0177.0.0.1/", Legacy),
            ("http://127.1/", Legacy),
            ("http://0x7f.1/", Legacy),
            ("http://017700000001/", Legacy),
            ("http://0X7F.0.0.1/", Legacy),
            ("http://127.0.0.1./", Legacy),
            ("http://%31%32%37.0.0.1/", Legacy),
            ("http://\u{ff11}\u{ff12}\u{ff17}.0.0.1/", Legacy),
            ("http:2130706433/", Legacy),
            ("http:\\\\0x7f.1\\", Legacy),
            // Names that resolve to forbidden addresses.
            ("HTTP://LOCALHOST./", Forbidden),
            ("http://localhost:8080/", Forbidden),
            ("http://metadata.test/", Forbidden),
            ("http://mixed.test/", Forbidden),
            ("http://v6loop.test/", Forbidden),
            ("http://mapped.test/", Forbidden),
            // Names that do not resolve.
            ("http://nowhere.test/", Unresolvable),
            ("http://empty.test/", Unresolvable),
            // Schemes other than http and https.
            ("ftp://public.test/", Scheme),
            ("file:///etc/passwd", Scheme),
            ("gopher://127.0.0.1:25/", Scheme),
            ("javascript:alert(1)", Scheme),
            ("data:text/plain,hi", Scheme),
            ("ws://public.test/", Scheme),
            // Credentials in the URL, checked before the address.
            ("http://user:pass@public.test/", Credentials),
            ("http://user@public.test/", Credentials),
            ("http://@public.test/", Credentials),
            ("http://public.test@127.0.0.1/", Credentials),
            // Not URLs at all.
            ("http://", Invalid),
            ("not a url", Invalid),
            ("//public.test/", Invalid),
            ("http://pub\tlic.test/", Invalid),
            ("http://127.0.0.1../", Invalid),
            ("http://public..test/", Invalid),
            ("http://./", Invalid),
        ];
        assert!(table.len() >= 45);
        for &(url, expected) in table {
            match vet(&[], url).await {
                Ok(target) => panic!("{url:?} was admitted as {:?}", target.addrs),
                Err(refusal) => assert_eq!(kind(&refusal), expected, "{url:?}: {refusal}"),
            }
        }
    }

    #[tokio::test]
    async fn every_resolved_address_is_checked() {
        let refusal = vet(&[], "http://mixed.test/")
            .await
            .expect_err("mixed answer");
        assert_eq!(
            refusal,
            Refusal::ForbiddenAddress {
                host: "mixed.test".into(),
                addr: ip("10.0.0.1"),
                range: "private 10.0.0.0/8",
            }
        );
    }

    #[tokio::test]
    async fn cloud_metadata_is_named_in_the_refusal() {
        let refusal = vet(&[], "http://metadata.test/")
            .await
            .expect_err("metadata");
        assert!(refusal.to_string().contains("169.254.169.254"), "{refusal}");
        assert!(refusal.to_string().contains("cloud metadata"), "{refusal}");
    }

    #[tokio::test]
    async fn public_targets_are_admitted() {
        let target = vet(&[], "http://public.test/x?q=1")
            .await
            .expect("public name");
        assert_eq!(target.addrs, vec![ip("93.184.216.34")]);
        assert_eq!((target.port, target.ip_literal), (80, false));

        let target = vet(&[], "https://8.8.8.8/").await.expect("public v4");
        assert_eq!((target.host.as_str(), target.port), ("8.8.8.8", 443));
        assert!(target.ip_literal);

        let target = vet(&[], "http://[2606:4700:4700::1111]:8443/")
            .await
            .expect("public v6");
        assert_eq!(
            (target.host.as_str(), target.port),
            ("2606:4700:4700::1111", 8443)
        );
    }

    #[tokio::test]
    async fn the_host_is_normalised() {
        let target = vet(&[], "HTTPS://Public.TEST./p")
            .await
            .expect("public name");
        assert_eq!(target.host, "public.test");
        assert_eq!(target.url.host_str(), Some("public.test"));
        assert_eq!(target.port, 443);
    }

    #[tokio::test]
    async fn an_allowlisted_address_admits_its_literal_and_names_resolving_to_it() {
        let allow = ["127.0.0.1"];
        let target = vet(&allow, "http://127.0.0.1:8931/mcp")
            .await
            .expect("literal");
        assert_eq!(target.port, 8931);
        vet(&allow, "http://localhost:8931/").await.expect("name");
        vet(&allow, "http://mapped.test/")
            .await
            .expect("mapped form");
        let refusal = vet(&allow, "http://127.0.0.2/")
            .await
            .expect_err("neighbour");
        assert_eq!(kind(&refusal), Kind::Forbidden);
    }

    #[tokio::test]
    async fn an_allowlisted_host_admits_its_private_address() {
        let allow = ["MCP.internal.example."];
        let target = vet(&allow, "http://mcp.internal.example/mcp")
            .await
            .expect("host");
        assert_eq!(target.addrs, vec![ip("10.9.8.7")]);
        let refusal = vet(&allow, "http://other.internal.example/")
            .await
            .expect_err("other");
        assert_eq!(kind(&refusal), Kind::Forbidden);
    }

    #[tokio::test]
    async fn a_cidr_admits_inside_and_refuses_outside() {
        let allow = ["10.1.2.0/24"];
        vet(&allow, "http://10.1.2.7/").await.expect("inside");
        let refusal = vet(&allow, "http://10.1.3.7/").await.expect_err("outside");
        assert_eq!(kind(&refusal), Kind::Forbidden);
    }

    #[tokio::test]
    async fn a_wildcard_never_admits_a_private_address() {
        let allow = ["*.internal.example"];
        let refusal = vet(&allow, "http://mcp.internal.example/")
            .await
            .expect_err("wildcard");
        assert_eq!(kind(&refusal), Kind::Forbidden);
        assert!(!policy(&allow).is_empty());
    }

    #[tokio::test]
    async fn a_legacy_spelling_is_refused_even_when_allowlisted() {
        for url in ["http://2130706433/", "http://127.1/", "http://0x7f.1:8080/"] {
            let refusal = vet(&["127.0.0.1"], url).await.expect_err(url);
            assert_eq!(kind(&refusal), Kind::Legacy, "{url}");
        }
    }

    #[tokio::test]
    async fn the_resolver_is_called_exactly_once_per_vet() {
        let resolver = TestResolver::new();
        let empty = EgressPolicy::default();
        for (i, url) in [
            "http://public.test/",
            "http://mixed.test/",
            "http://nowhere.test/",
        ]
        .into_iter()
        .enumerate()
        {
            let _ = vet_target(&empty, &resolver, url).await;
            assert_eq!(resolver.calls(), i + 1, "{url}");
        }
    }

    #[tokio::test]
    async fn an_ip_literal_never_calls_the_resolver() {
        let resolver = TestResolver::new();
        let empty = EgressPolicy::default();
        for url in [
            "http://8.8.8.8/",
            "http://[::1]/",
            "http://127.0.0.1/",
            "http://127.1/",
        ] {
            let _ = vet_target(&empty, &resolver, url).await;
        }
        assert_eq!(resolver.calls(), 0);
    }

    #[test]
    fn forbidden_ranges_are_named_and_public_addresses_pass() {
        let cases = [
            ("127.0.0.1", Some("loopback 127.0.0.0/8")),
            (
                "169.254.169.254",
                Some("link-local 169.254.0.0/16 (cloud metadata)"),
            ),
            (
                "100.64.0.1",
                Some("shared address space (CGNAT) 100.64.0.0/10"),
            ),
            ("172.15.255.255", None),
            ("172.32.0.0", None),
            ("100.128.0.0", None),
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("::1", Some("loopback ::1/128")),
            ("::", Some("unspecified ::/128")),
            ("64:ff9b::808:808", Some("NAT64 64:ff9b::/96")),
            ("2606:4700:4700::1111", None),
            ("2001:4860:4860::8888", None),
            ("4000::1", Some("reserved, outside global unicast 2000::/3")),
        ];
        for (addr, expected) in cases {
            assert_eq!(forbidden_range(ip(addr)), expected, "{addr}");
        }
    }

    #[test]
    fn ipv4_embedded_in_ipv6_is_judged_by_its_ipv4_value() {
        let cases = [
            ("::ffff:127.0.0.1", true),
            ("::ffff:8.8.8.8", false),
            ("::ffff:0:10.0.0.1", true),
            ("::10.0.0.1", true),
            ("::8.8.8.8", false),
            ("2002:7f00:0001::", true),
            ("2002:0808:0808::", false),
            // Teredo: server 65.54.227.120, client !0x80fffffe = 127.0.0.1.
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", true),
            // Teredo: server 10.0.0.1, client 8.8.8.8.
            ("2001:0:a00:1::f7f7:f7f7", true),
            // Teredo: server 65.54.227.120, client 8.8.8.8.
            ("2001:0:4136:e378::f7f7:f7f7", false),
        ];
        for (addr, forbidden) in cases {
            assert_eq!(forbidden_range(ip(addr)).is_some(), forbidden, "{addr}");
        }
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

    #[test]
    fn audit_descriptions_keep_the_port_and_the_scheme_but_no_query_and_no_userinfo() {
        let cases = [
            (
                "http://user:pw@Example.COM./a/b?token=x#f",
                ("example.com", "/a/b"),
            ),
            ("http://[::1]:8080/p?q=1", ("[::1]:8080", "/p")),
            ("https://api.example:443/p", ("api.example", "/p")),
            ("http://127.0.0.1:9/p", ("127.0.0.1:9", "/p")),
            (
                "ftp://u:pw@files.example/x?y",
                ("ftp://files.example", "/x"),
            ),
            ("file:///etc/passwd", ("file://", "/etc/passwd")),
            ("garbage", ("", "")),
            ("http://exa mple.com/?secret", ("", "")),
        ];
        for (url, (host, path)) in cases {
            assert_eq!(
                describe_for_audit(url),
                (host.to_owned(), path.to_owned()),
                "{url}"
            );
        }
    }
}
