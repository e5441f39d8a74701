//! The egress guard: which targets a call may reach, decided before any secret is read.

use std::net::IpAddr;

use url::{Host, Url};

use crate::resolver::Resolver;

mod describe;
mod policy;
mod ranges;
mod spelling;

pub(crate) use describe::{describe_for_audit, describe_location};
pub use policy::{EgressPolicy, PolicyError};
pub(crate) use ranges::forbidden_range;
use spelling::{cut, is_legacy_numeric, raw_authority, split_authority, split_scheme, trim_url};

/// Why the guard refused a target. The text never contains a query string or a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GuardRefusal {
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
        "{}; add it to [egress] allow if this is intended",
        forbidden(host, addr, range)
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

/// Where a refused address lies: an address written as such "is in" its range, a name
/// "resolves to" it.
fn forbidden(host: &str, addr: &IpAddr, range: &str) -> String {
    match host == addr.to_string() {
        true => format!("{addr} is in {range}"),
        false => format!("host {host:?} resolves to {addr} in {range}"),
    }
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

/// Decides whether `raw_url` may be reached under `policy`, resolving its host once.
///
/// V4, in this order: scheme, legacy numeric spellings (judged on the text as written,
/// before the URL parser silently rewrites them), credentials in the URL, host
/// normalisation, one resolution, then every address against the forbidden ranges.
pub(crate) async fn vet_target(
    policy: &EgressPolicy,
    resolver: &dyn Resolver,
    raw_url: &str,
) -> Result<VettedTarget, GuardRefusal> {
    // The URL standard ignores leading and trailing controls and spaces; so do we.
    let text = trim_url(raw_url);

    // V4 (a): http or https only, decided on the text itself.
    let (scheme, rest) = split_scheme(text)?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(GuardRefusal::Scheme {
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
        return Err(GuardRefusal::CredentialsInUrl);
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
            _ => return Err(GuardRefusal::Unresolvable { host }),
        },
    };

    // V4 (f): every address, not just the first, must be public or admitted.
    for &addr in &addrs {
        if let Some(range) = forbidden_range(addr)
            && !policy.admits(&host, addr)
        {
            return Err(GuardRefusal::ForbiddenAddress { host, addr, range });
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

/// Decides whether `host` on `port` (the target of a proxy's `CONNECT`) may be reached
/// under `policy`: the very rules of [`vet_target`], on the URL `http://host:port/`. A
/// host with a character that would change what that URL means is refused as written.
pub(crate) async fn vet_authority(
    policy: &EgressPolicy,
    resolver: &dyn Resolver,
    host: &str,
    port: u16,
) -> Result<VettedTarget, GuardRefusal> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"-._:".contains(&b);
    if host.is_empty() || !host.bytes().all(plain) {
        return Err(invalid("the target is not host:port"));
    }
    let url = match host.contains(':') {
        true => format!("http://[{host}]:{port}/"),
        false => format!("http://{host}:{port}/"),
    };
    vet_target(policy, resolver, &url).await
}

fn invalid(reason: &str) -> GuardRefusal {
    GuardRefusal::InvalidUrl {
        reason: cut(reason, 200),
    }
}

fn legacy(host: &str) -> GuardRefusal {
    GuardRefusal::LegacyNumericHost {
        host: cut(host, 64),
    }
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

    async fn vet(allow: &[&str], url: &str) -> Result<VettedTarget, GuardRefusal> {
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

    fn kind(refusal: &GuardRefusal) -> Kind {
        match refusal {
            GuardRefusal::InvalidUrl { .. } => Kind::Invalid,
            GuardRefusal::Scheme { .. } => Kind::Scheme,
            GuardRefusal::CredentialsInUrl => Kind::Credentials,
            GuardRefusal::LegacyNumericHost { .. } => Kind::Legacy,
            GuardRefusal::ForbiddenAddress { .. } => Kind::Forbidden,
            GuardRefusal::Unresolvable { .. } => Kind::Unresolvable,
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
            GuardRefusal::ForbiddenAddress {
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
    async fn a_refused_address_is_in_its_range_and_a_refused_name_resolves_to_it() {
        let literal = vet(&[], "http://169.254.169.254/")
            .await
            .expect_err("literal");
        assert_eq!(
            literal.to_string(),
            "169.254.169.254 is in link-local 169.254.0.0/16 (cloud metadata); add it to \
             [egress] allow if this is intended"
        );
        let name = vet(&[], "http://metadata.test/").await.expect_err("name");
        assert!(
            name.to_string()
                .starts_with("host \"metadata.test\" resolves to 169.254.169.254 in link-local"),
            "{name}"
        );
    }

    #[tokio::test]
    async fn an_authority_is_vetted_by_the_rules_of_a_url() {
        let empty = EgressPolicy::default();
        let resolver = TestResolver::new();
        let vet = |host: &'static str, port| vet_authority(&empty, &resolver, host, port);
        let target = vet("public.test", 443).await.expect("public name");
        assert_eq!(
            (target.port, target.addrs.clone()),
            (443, vec![ip("93.184.216.34")])
        );
        vet("2606:4700:4700::1111", 443).await.expect("public v6");
        for (host, expected) in [
            ("169.254.169.254", Kind::Forbidden),
            ("::1", Kind::Forbidden),
            ("metadata.test", Kind::Forbidden),
            ("2130706433", Kind::Legacy),
            ("0x7f.1", Kind::Legacy),
            ("nowhere.test", Kind::Unresolvable),
            ("user@public.test", Kind::Invalid),
            ("public.test/x", Kind::Invalid),
            ("", Kind::Invalid),
        ] {
            let refusal = vet(host, 80).await.expect_err(host);
            assert_eq!(kind(&refusal), expected, "{host:?}: {refusal}");
        }
        let allowed = policy(&["127.0.0.1"]);
        let target = vet_authority(&allowed, &resolver, "127.0.0.1", 8080)
            .await
            .expect("allowed");
        assert_eq!(target.port, 8080);
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
}
