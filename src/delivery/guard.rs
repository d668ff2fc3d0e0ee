//! The address guard (SSRF defence): spindle sends requests to URLs other people choose, so it
//! connects only to addresses it has checked.
//!
//! - Names are resolved by [`GuardedResolver`], which hands the HTTP client only the addresses
//!   that pass: the client never resolves again between the check and the connect.
//! - IP literals (which the client does not resolve) are checked before the request is built;
//!   the URL parser has already turned odd encodings (`2130706433`, `0x7f.1`, `0177.0.0.1`,
//!   `127.1`) into the address they mean.
//! - Blocked: unspecified, loopback, private, shared (CGNAT), link-local (cloud metadata
//!   included), multicast, broadcast and reserved ranges, IPv6 unique-local and site-local, and
//!   the IPv6 forms that carry an IPv4 address (mapped, compatible, NAT64, 6to4) whenever the
//!   IPv4 address inside is blocked; Teredo always.
//! - An explicit allowlist of subnets admits exactly what it names (tests use it for their
//!   loopback endpoints). IPv4-mapped IPv6 addresses are treated as the IPv4 address they are.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Why an address may not be contacted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{ip} is a {class} address; spindle does not deliver there")]
pub struct Blocked {
    /// The address.
    pub ip: IpAddr,
    /// Its class (`loopback`, `private`, ...).
    pub class: &'static str,
}

/// Which addresses deliveries may reach.
#[derive(Clone, Debug, Default)]
pub struct AddressPolicy {
    allow: Vec<IpNet>,
}

impl AddressPolicy {
    /// A policy that blocks the special ranges except the subnets in `allow`.
    pub fn new(allow: Vec<IpNet>) -> Self {
        AddressPolicy { allow }
    }

    /// Whether `ip` may be contacted.
    pub fn check(&self, ip: IpAddr) -> Result<(), Blocked> {
        let ip = ip.to_canonical();
        if self.allow.iter().any(|net| net.contains(&ip)) {
            return Ok(());
        }
        match blocked_class(ip) {
            Some(class) => Err(Blocked { ip, class }),
            None => Ok(()),
        }
    }
}

/// The special-purpose class of an address, if it is one spindle must not contact.
pub fn blocked_class(ip: IpAddr) -> Option<&'static str> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => v6_class(v6),
    }
}

fn v4_class(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "unspecified",
        (127, _, _) => "loopback",
        (10, _, _) | (192, 168, _) => "private",
        (172, 16..=31, _) => "private",
        (100, 64..=127, _) => "shared",
        (169, 254, _) => "link-local",
        (192, 0, 0) | (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "reserved",
        // The deprecated 6to4 relay anycast (RFC 7526): whatever answers there is a relay.
        (192, 88, 99) => "reserved",
        (198, 18..=19, _) => "reserved",
        (224..=239, _, _) => "multicast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    })
}

fn v6_class(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from(((hi as u32) << 16) | lo as u32);
    // IPv4-compatible (deprecated) ::a.b.c.d, NAT64 64:ff9b::a.b.c.d: the IPv4 address decides.
    if s[..6] == [0, 0, 0, 0, 0, 0] || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return v4_class(embedded(s[6], s[7])).or(if s[0] == 0 { Some("reserved") } else { None });
    }
    // 6to4 2002:aabb:ccdd::/48 embeds a.b.c.d.
    if s[0] == 0x2002 {
        return v4_class(embedded(s[1], s[2]));
    }
    Some(match s[0] {
        // The rest of ::/8 (IPv4-translated ::ffff:0:a.b.c.d and the unassigned forms):
        // reserved by the IETF, reachable only through translators.
        0 => "reserved",
        // Local-use NAT64 (RFC 8215): translates to whatever the operator's network holds.
        0x0064 if s[1] == 0xff9b && s[2] == 1 => "nat64-local",
        0x2001 if s[1] == 0 => "teredo",
        0x2001 if s[1] == 0x0db8 => "reserved",
        // Benchmarking (2001:2::/48) and ORCHID v1/v2 (2001:10::/28, 2001:20::/28).
        0x2001 if s[1] == 2 && s[2] == 0 => "reserved",
        0x2001 if matches!(s[1] & 0xfff0, 0x0010 | 0x0020) => "reserved",
        // Documentation (3fff::/20, RFC 9637) and SRv6 segment ids (5f00::/16).
        0x3fff if s[1] & 0xf000 == 0 => "reserved",
        0x5f00 => "reserved",
        0x0100 if s[1..4] == [0, 0, 0] => "reserved",
        x if x & 0xfe00 == 0xfc00 => "unique-local",
        x if x & 0xffc0 == 0xfe80 => "link-local",
        x if x & 0xffc0 == 0xfec0 => "site-local",
        x if x & 0xff00 == 0xff00 => "multicast",
        _ => return None,
    })
}

/// A DNS resolver that returns only addresses the policy admits.
#[derive(Clone, Debug)]
pub struct GuardedResolver {
    policy: Arc<AddressPolicy>,
}

impl GuardedResolver {
    /// A resolver enforcing `policy`.
    pub fn new(policy: Arc<AddressPolicy>) -> Self {
        GuardedResolver { policy }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut admitted = Vec::new();
            let mut refused = None;
            for addr in resolved {
                match policy.check(addr.ip()) {
                    Ok(()) => admitted.push(addr),
                    Err(blocked) => refused = Some(blocked),
                }
            }
            match (admitted.is_empty(), refused) {
                (false, _) => Ok(Box::new(admitted.into_iter()) as Addrs),
                (true, Some(blocked)) => {
                    Err(Box::new(blocked) as Box<dyn std::error::Error + Send + Sync>)
                }
                (true, None) => Err(format!("{host} has no address").into()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(text: &str) -> Option<&'static str> {
        blocked_class(text.parse().unwrap())
    }

    #[test]
    fn special_ranges_are_blocked() {
        for (ip, expected) in [
            ("0.0.0.0", "unspecified"),
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.0.1", "private"),
            ("100.64.0.1", "shared"),
            ("169.254.169.254", "link-local"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("::127.0.0.1", "loopback"),
            ("64:ff9b::7f00:1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("2002:7f00:1::", "loopback"),
            ("2002:c0a8:101::1", "private"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "teredo"),
            ("fc00::1", "unique-local"),
            ("fd00:ec2::254", "unique-local"),
            ("fe80::1", "link-local"),
            ("ff02::1", "multicast"),
            // Ranges a review found let through.
            ("64:ff9b:1::7f00:1", "nat64-local"),
            ("64:ff9b:1:abcd::808:808", "nat64-local"),
            ("::ffff:0:7f00:1", "reserved"),
            ("::ffff:0:808:808", "reserved"),
            ("192.88.99.1", "reserved"),
            ("2001:2::1", "reserved"),
            ("2001:10::1", "reserved"),
            ("2001:20::1", "reserved"),
            ("3fff::1", "reserved"),
            ("5f00::1", "reserved"),
        ] {
            assert_eq!(class(ip), Some(expected), "{ip}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(class(ip), None, "{ip}");
        }
    }

    #[test]
    fn the_allowlist_admits_exactly_what_it_names() {
        let policy = AddressPolicy::new(vec!["127.0.0.0/8".parse().unwrap()]);
        assert!(policy.check("127.0.0.1".parse().unwrap()).is_ok());
        assert!(
            policy.check("::ffff:127.0.0.1".parse().unwrap()).is_ok(),
            "mapped is the IPv4 address"
        );
        assert!(policy.check("::1".parse().unwrap()).is_err());
        assert!(policy.check("10.0.0.1".parse().unwrap()).is_err());
        assert!(
            policy.check("64:ff9b::7f00:1".parse().unwrap()).is_err(),
            "NAT64 is another address"
        );
        assert!(AddressPolicy::default()
            .check("127.0.0.1".parse().unwrap())
            .is_err());
    }
}
