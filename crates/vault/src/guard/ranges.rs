//! The address ranges an outbound call may never reach unless the operator allows them:
//! every row of IANA's special-purpose address registries that is not globally
//! reachable, and a few more we refuse on purpose.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What a registry row says about reaching its addresses, and so what the guard does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A registry row marked not globally reachable: refused.
    NotGlobal,
    /// A registry row marked globally reachable: this row refuses nothing (an address
    /// in it is still refused when a wider row is not globally reachable).
    Global,
    /// A registry row for a format that carries an IPv4 address (mapped, 6to4, Teredo):
    /// judged by that IPv4 address, wherever the stack would deliver it.
    Embedded,
    /// Not refused by the registries, refused by us; the name says why.
    Ours,
}

/// A range: first address, prefix length, human name, where the rule comes from.
type V4Range = (u32, u32, &'static str, Source);
/// The same for IPv6.
type V6Range = (u128, u32, &'static str, Source);

const fn v4(a: u8, b: u8, c: u8, d: u8) -> u32 {
    u32::from_be_bytes([a, b, c, d])
}

const fn v6(segments: [u16; 8]) -> u128 {
    let mut bits = 0u128;
    let mut i = 0;
    while i < 8 {
        bits = (bits << 16) | segments[i] as u128;
        i += 1;
    }
    bits
}

use Source::{Embedded, Global, NotGlobal, Ours};

/// IANA IPv4 Special-Purpose Address Registry, row by row, and multicast. Documentation
/// ranges are refused with the rest: no real service lives there, so a name answering
/// with one is hostile.
pub(crate) const V4_RANGES: &[V4Range] = &[
    (v4(0, 0, 0, 0), 8, "this network 0.0.0.0/8", NotGlobal),
    (v4(0, 0, 0, 0), 32, "this host 0.0.0.0/32", NotGlobal),
    (v4(10, 0, 0, 0), 8, "private 10.0.0.0/8", NotGlobal),
    (
        v4(100, 64, 0, 0),
        10,
        "shared address space (CGNAT) 100.64.0.0/10",
        NotGlobal,
    ),
    (v4(127, 0, 0, 0), 8, "loopback 127.0.0.0/8", NotGlobal),
    (
        v4(169, 254, 0, 0),
        16,
        "link-local 169.254.0.0/16 (cloud metadata)",
        NotGlobal,
    ),
    (v4(172, 16, 0, 0), 12, "private 172.16.0.0/12", NotGlobal),
    (
        v4(192, 0, 0, 0),
        24,
        "IETF protocol assignments 192.0.0.0/24",
        NotGlobal,
    ),
    (
        v4(192, 0, 0, 0),
        29,
        "IPv4 service continuity 192.0.0.0/29",
        NotGlobal,
    ),
    (
        v4(192, 0, 0, 8),
        32,
        "IPv4 dummy address 192.0.0.8/32",
        NotGlobal,
    ),
    (v4(192, 0, 0, 9), 32, "PCP anycast 192.0.0.9/32", Global),
    (v4(192, 0, 0, 10), 32, "TURN anycast 192.0.0.10/32", Global),
    (
        v4(192, 0, 0, 170),
        32,
        "NAT64/DNS64 discovery 192.0.0.170/32",
        NotGlobal,
    ),
    (
        v4(192, 0, 0, 171),
        32,
        "NAT64/DNS64 discovery 192.0.0.171/32",
        NotGlobal,
    ),
    (
        v4(192, 0, 2, 0),
        24,
        "documentation 192.0.2.0/24",
        NotGlobal,
    ),
    (v4(192, 31, 196, 0), 24, "AS112 192.31.196.0/24", Global),
    (v4(192, 52, 193, 0), 24, "AMT 192.52.193.0/24", Global),
    // Deprecated; the registry leaves reachability open. Nothing an agent calls.
    (
        v4(192, 88, 99, 0),
        24,
        "6to4 relay anycast 192.88.99.0/24",
        Ours,
    ),
    (v4(192, 168, 0, 0), 16, "private 192.168.0.0/16", NotGlobal),
    (
        v4(192, 175, 48, 0),
        24,
        "AS112 direct delegation 192.175.48.0/24",
        Global,
    ),
    (
        v4(198, 18, 0, 0),
        15,
        "benchmarking 198.18.0.0/15",
        NotGlobal,
    ),
    (
        v4(198, 51, 100, 0),
        24,
        "documentation 198.51.100.0/24",
        NotGlobal,
    ),
    (
        v4(203, 0, 113, 0),
        24,
        "documentation 203.0.113.0/24",
        NotGlobal,
    ),
    (v4(240, 0, 0, 0), 4, "reserved 240.0.0.0/4", NotGlobal),
    (
        v4(255, 255, 255, 255),
        32,
        "limited broadcast 255.255.255.255/32",
        NotGlobal,
    ),
    // From the multicast registry: never a unicast service.
    (v4(224, 0, 0, 0), 4, "multicast 224.0.0.0/4", Ours),
];

/// IANA IPv6 Special-Purpose Address Registry, row by row, and what we add.
pub(crate) const V6_RANGES: &[V6Range] = &[
    (1, 128, "loopback ::1/128", NotGlobal),
    (0, 128, "unspecified ::/128", NotGlobal),
    (
        v6([0, 0, 0, 0, 0, 0xffff, 0, 0]),
        96,
        "IPv4-mapped ::ffff:0:0/96",
        Embedded,
    ),
    // Globally reachable in the registry, but it reaches whatever IPv4 address a
    // translator is handed: refused outright, as it always was.
    (
        v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0]),
        96,
        "NAT64 64:ff9b::/96",
        Ours,
    ),
    (
        v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0]),
        48,
        "local-use NAT64 64:ff9b:1::/48",
        NotGlobal,
    ),
    (
        v6([0x100, 0, 0, 0, 0, 0, 0, 0]),
        64,
        "discard-only 100::/64",
        NotGlobal,
    ),
    (
        v6([0x100, 0, 0, 1, 0, 0, 0, 0]),
        64,
        "dummy prefix 100:0:0:1::/64",
        NotGlobal,
    ),
    (
        v6([0x2001, 0, 0, 0, 0, 0, 0, 0]),
        23,
        "IETF protocol assignments 2001::/23",
        NotGlobal,
    ),
    (
        v6([0x2001, 0, 0, 0, 0, 0, 0, 0]),
        32,
        "Teredo 2001::/32",
        Embedded,
    ),
    (
        v6([0x2001, 1, 0, 0, 0, 0, 0, 1]),
        128,
        "PCP anycast 2001:1::1/128",
        Global,
    ),
    (
        v6([0x2001, 1, 0, 0, 0, 0, 0, 2]),
        128,
        "TURN anycast 2001:1::2/128",
        Global,
    ),
    (
        v6([0x2001, 1, 0, 0, 0, 0, 0, 3]),
        128,
        "DNS-SD SRP anycast 2001:1::3/128",
        Global,
    ),
    (
        v6([0x2001, 2, 0, 0, 0, 0, 0, 0]),
        48,
        "benchmarking 2001:2::/48",
        NotGlobal,
    ),
    (
        v6([0x2001, 3, 0, 0, 0, 0, 0, 0]),
        32,
        "AMT 2001:3::/32",
        Global,
    ),
    (
        v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0]),
        48,
        "AS112 2001:4:112::/48",
        Global,
    ),
    (
        v6([0x2001, 0x10, 0, 0, 0, 0, 0, 0]),
        28,
        "deprecated ORCHID 2001:10::/28",
        NotGlobal,
    ),
    (
        v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0]),
        28,
        "ORCHIDv2 2001:20::/28",
        Global,
    ),
    (
        v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0]),
        28,
        "drone remote ID 2001:30::/28",
        Global,
    ),
    (
        v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0]),
        32,
        "documentation 2001:db8::/32",
        NotGlobal,
    ),
    (
        v6([0x2002, 0, 0, 0, 0, 0, 0, 0]),
        16,
        "6to4 2002::/16",
        Embedded,
    ),
    (
        v6([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0]),
        48,
        "AS112 direct delegation 2620:4f:8000::/48",
        Global,
    ),
    (
        v6([0x3fff, 0, 0, 0, 0, 0, 0, 0]),
        20,
        "documentation 3fff::/20",
        NotGlobal,
    ),
    (
        v6([0x5f00, 0, 0, 0, 0, 0, 0, 0]),
        16,
        "SRv6 SIDs 5f00::/16",
        NotGlobal,
    ),
    (
        v6([0xfc00, 0, 0, 0, 0, 0, 0, 0]),
        7,
        "unique local fc00::/7",
        NotGlobal,
    ),
    (
        v6([0xfe80, 0, 0, 0, 0, 0, 0, 0]),
        10,
        "link-local fe80::/10",
        NotGlobal,
    ),
    // Deprecated site-local and multicast: outside the special-purpose registry.
    (
        v6([0xfec0, 0, 0, 0, 0, 0, 0, 0]),
        10,
        "site-local fec0::/10",
        Ours,
    ),
    (
        v6([0xff00, 0, 0, 0, 0, 0, 0, 0]),
        8,
        "multicast ff00::/8",
        Ours,
    ),
];

const MAPPED: V6Range = V6_RANGES[2];
const TRANSLATED: V6Range = (v6([0, 0, 0, 0, 0xffff, 0, 0, 0]), 96, "", Embedded);
const COMPATIBLE: V6Range = (0, 96, "", Embedded);
const SIX_TO_FOUR: V6Range = V6_RANGES[19];
const TEREDO: V6Range = V6_RANGES[8];
const GLOBAL_UNICAST: V6Range = (v6([0x2000, 0, 0, 0, 0, 0, 0, 0]), 3, "", Global);

/// True for a row whose addresses the guard refuses.
fn refuses(source: Source) -> bool {
    matches!(source, NotGlobal | Ours)
}

/// The forbidden range `ip` falls in, named for humans ("loopback 127.0.0.0/8"), or
/// `None` for an ordinary public address.
///
/// IPv6 addresses that carry an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`,
/// IPv4-compatible `::a.b.c.d`, 6to4 `2002:aabb:ccdd::/48`, Teredo `2001::/32`) are judged
/// by that IPv4 address and named by its range. Any other IPv6 address outside global
/// unicast `2000::/3` is refused as reserved.
pub(crate) fn forbidden_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => forbidden_v4(ip),
        IpAddr::V6(ip) => forbidden_v6(ip),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let bits = u32::from(ip);
    V4_RANGES
        .iter()
        .filter(|r| refuses(r.3))
        .find(|&&(base, prefix, _, _)| bits >> (32 - prefix) == base >> (32 - prefix))
        .map(|&(_, _, name, _)| name)
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(ip);
    let within = |&(base, prefix, _, _): &V6Range| bits >> (128 - prefix) == base >> (128 - prefix);
    // The cast keeps the low 32 bits on purpose.
    let low32 = |shift: u32| Ipv4Addr::from((bits >> shift) as u32);
    if within(&TEREDO) {
        // Judged by what it carries, before its wider row (2001::/23): the server's
        // address sits in bits 32..64, the client's (inverted) in 96..128.
        return forbidden_v4(low32(64)).or_else(|| forbidden_v4(!low32(0)));
    }
    if let Some(&(_, _, name, _)) = V6_RANGES
        .iter()
        .filter(|r| refuses(r.3))
        .find(|r| within(r))
    {
        return Some(name);
    }
    // IPv4 embedded in IPv6 is judged by its IPv4 value, wherever the stack would
    // deliver it.
    if within(&MAPPED) || within(&TRANSLATED) || within(&COMPATIBLE) {
        return forbidden_v4(low32(0));
    }
    if within(&SIX_TO_FOUR) {
        return forbidden_v4(low32(80));
    }
    if !within(&GLOBAL_UNICAST) {
        return Some("reserved, outside global unicast 2000::/3");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_v4(base: u32, prefix: u32) -> u32 {
        if prefix >= 32 {
            base
        } else {
            base | (u32::MAX >> prefix)
        }
    }

    fn last_v6(base: u128, prefix: u32) -> u128 {
        if prefix >= 128 {
            base
        } else {
            base | (u128::MAX >> prefix)
        }
    }

    /// Covered by a refusing row other than `skip` (a wider not-globally-reachable row
    /// around a globally reachable one).
    fn covered_v4(bits: u32, skip: usize) -> bool {
        V4_RANGES
            .iter()
            .enumerate()
            .any(|(i, &(base, prefix, _, source))| {
                i != skip && refuses(source) && bits >> (32 - prefix) == base >> (32 - prefix)
            })
    }

    #[test]
    fn every_ipv4_row_is_walked_first_and_last_address() {
        for (i, &(base, prefix, name, source)) in V4_RANGES.iter().enumerate() {
            for bits in [base, last_v4(base, prefix)] {
                let ip = Ipv4Addr::from(bits);
                let refused = forbidden_range(IpAddr::V4(ip)).is_some();
                let expected = refuses(source) || covered_v4(bits, i);
                assert_eq!(refused, expected, "{name}: {ip}");
            }
        }
        // Globally reachable rows outside any refused row pass.
        for addr in ["192.31.196.1", "192.52.193.1", "192.175.48.1", "8.8.8.8"] {
            assert_eq!(forbidden_range(addr.parse().unwrap()), None, "{addr}");
        }
    }

    #[test]
    fn every_ipv6_row_is_walked_first_and_last_address() {
        for &(base, prefix, name, source) in V6_RANGES {
            for bits in [base, last_v6(base, prefix)] {
                let ip = Ipv6Addr::from(bits);
                let refused = forbidden_range(IpAddr::V6(ip));
                match source {
                    NotGlobal | Ours => assert!(refused.is_some(), "{name}: {ip}"),
                    // Inside 2001::/23, which is not globally reachable.
                    Global if name.contains(" 2001:") => {
                        assert!(refused.is_some(), "{name}: {ip}")
                    }
                    Global => assert_eq!(refused, None, "{name}: {ip}"),
                    // The first address of each embeds 0.0.0.0 (this network).
                    Embedded => assert!(refused.is_some(), "{name}: {ip}"),
                }
            }
        }
    }

    #[test]
    fn the_ranges_that_passed_before_are_refused() {
        for addr in [
            "3fff::1",
            "3fff:fff::1",
            "2001:10::1",
            "2001:1f:ffff::1",
            "5f00::1",
            "100:0:0:1::1",
        ] {
            assert!(forbidden_range(addr.parse().unwrap()).is_some(), "{addr}");
        }
        assert_eq!(
            forbidden_range("3fff:1000::1".parse().unwrap()),
            None,
            "past the /20"
        );
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address")
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
}
