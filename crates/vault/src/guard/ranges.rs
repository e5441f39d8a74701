//! The address ranges an outbound call may never reach unless the operator allows them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An IPv4 range: first address, prefix length, human name.
type V4Range = (u32, u32, &'static str);
/// An IPv6 range: first address, prefix length, human name.
type V6Range = (u128, u32, &'static str);

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

// V4: every IPv4 range that is not ordinary public unicast. Documentation ranges are
// included because no real service lives there: a name answering with one is hostile.
const V4_RANGES: &[V4Range] = &[
    (v4(0, 0, 0, 0), 8, "this network 0.0.0.0/8"),
    (v4(10, 0, 0, 0), 8, "private 10.0.0.0/8"),
    (
        v4(100, 64, 0, 0),
        10,
        "shared address space (CGNAT) 100.64.0.0/10",
    ),
    (v4(127, 0, 0, 0), 8, "loopback 127.0.0.0/8"),
    (
        v4(169, 254, 0, 0),
        16,
        "link-local 169.254.0.0/16 (cloud metadata)",
    ),
    (v4(172, 16, 0, 0), 12, "private 172.16.0.0/12"),
    (
        v4(192, 0, 0, 0),
        24,
        "IETF protocol assignments 192.0.0.0/24",
    ),
    (v4(192, 0, 2, 0), 24, "documentation 192.0.2.0/24"),
    (v4(192, 88, 99, 0), 24, "6to4 relay anycast 192.88.99.0/24"),
    (v4(192, 168, 0, 0), 16, "private 192.168.0.0/16"),
    (v4(198, 18, 0, 0), 15, "benchmarking 198.18.0.0/15"),
    (v4(198, 51, 100, 0), 24, "documentation 198.51.100.0/24"),
    (v4(203, 0, 113, 0), 24, "documentation 203.0.113.0/24"),
    (v4(224, 0, 0, 0), 4, "multicast 224.0.0.0/4"),
    (v4(240, 0, 0, 0), 4, "reserved 240.0.0.0/4"),
];

// V4: IPv6 ranges refused outright, whatever they might embed.
const V6_RANGES: &[V6Range] = &[
    (0, 128, "unspecified ::/128"),
    (1, 128, "loopback ::1/128"),
    (
        v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0]),
        96,
        "NAT64 64:ff9b::/96",
    ),
    (
        v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0]),
        48,
        "local-use NAT64 64:ff9b:1::/48",
    ),
    (
        v6([0x100, 0, 0, 0, 0, 0, 0, 0]),
        64,
        "discard-only 100::/64",
    ),
    (
        v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0]),
        32,
        "documentation 2001:db8::/32",
    ),
    (
        v6([0xfc00, 0, 0, 0, 0, 0, 0, 0]),
        7,
        "unique local fc00::/7",
    ),
    (
        v6([0xfe80, 0, 0, 0, 0, 0, 0, 0]),
        10,
        "link-local fe80::/10",
    ),
    (
        v6([0xfec0, 0, 0, 0, 0, 0, 0, 0]),
        10,
        "site-local fec0::/10",
    ),
    (v6([0xff00, 0, 0, 0, 0, 0, 0, 0]), 8, "multicast ff00::/8"),
];

const MAPPED: V6Range = (v6([0, 0, 0, 0, 0, 0xffff, 0, 0]), 96, "");
const TRANSLATED: V6Range = (v6([0, 0, 0, 0, 0xffff, 0, 0, 0]), 96, "");
const COMPATIBLE: V6Range = (0, 96, "");
const SIX_TO_FOUR: V6Range = (v6([0x2002, 0, 0, 0, 0, 0, 0, 0]), 16, "");
const TEREDO: V6Range = (v6([0x2001, 0, 0, 0, 0, 0, 0, 0]), 32, "");
const GLOBAL_UNICAST: V6Range = (v6([0x2000, 0, 0, 0, 0, 0, 0, 0]), 3, "");

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
        .find(|&&(base, prefix, _)| bits >> (32 - prefix) == base >> (32 - prefix))
        .map(|&(_, _, name)| name)
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(ip);
    let within = |&(base, prefix, _): &V6Range| bits >> (128 - prefix) == base >> (128 - prefix);
    if let Some(&(_, _, name)) = V6_RANGES.iter().find(|r| within(r)) {
        return Some(name);
    }
    // V4: IPv4 embedded in IPv6 is judged by its IPv4 value, wherever the stack would
    // deliver it. The casts keep the low 32 bits on purpose.
    let low32 = |shift: u32| Ipv4Addr::from((bits >> shift) as u32);
    if within(&MAPPED) || within(&TRANSLATED) || within(&COMPATIBLE) {
        return forbidden_v4(low32(0));
    }
    if within(&SIX_TO_FOUR) {
        return forbidden_v4(low32(80));
    }
    if within(&TEREDO) {
        // The server's address sits in bits 32..64, the client's (inverted) in 96..128.
        return forbidden_v4(low32(64)).or_else(|| forbidden_v4(!low32(0)));
    }
    if !within(&GLOBAL_UNICAST) {
        return Some("reserved, outside global unicast 2000::/3");
    }
    None
}
