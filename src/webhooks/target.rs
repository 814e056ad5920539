//! Where a webhook may point: an `http` or `https` URL whose host resolves only to public
//! addresses, unless private ones are allowed (`QUOTA_WEBHOOK_ALLOW_PRIVATE`). Checked when
//! an endpoint is created or changed, and again at each delivery (DNS can change): a
//! delivery goes to the addresses checked, never to what a second lookup might say.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The longest a host name's lookup may take.
const LOOKUP: std::time::Duration = std::time::Duration::from_secs(2);

/// The longest URL an endpoint may have.
pub(crate) const MAX_URL: usize = 2_048;

/// Why a URL is not a webhook target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TargetError {
    /// Not an absolute `http(s)://host…` URL (or one with a user name or password).
    #[error("must be an http or https URL with a host, at most {MAX_URL} characters, and no user or password")]
    Malformed,
    /// The host is, or resolves to, a loopback, private, link-local or otherwise
    /// non-public address.
    #[error(
        "{0} is not a public address (set QUOTA_WEBHOOK_ALLOW_PRIVATE=true to allow private ones)"
    )]
    Private(IpAddr),
    /// The host does not resolve.
    #[error("its host '{0}' does not resolve")]
    Unresolvable(String),
}

/// A URL checked to be a webhook's: absolute, `http` or `https`, with a host.
pub(crate) fn parse(text: &str) -> Result<reqwest::Url, TargetError> {
    if text.len() > MAX_URL {
        return Err(TargetError::Malformed);
    }
    let url = reqwest::Url::parse(text).map_err(|_| TargetError::Malformed)?;
    let fine = matches!(url.scheme(), "http" | "https")
        && url.host_str().is_some_and(|h| !h.is_empty())
        && url.username().is_empty()
        && url.password().is_none();
    fine.then_some(url).ok_or(TargetError::Malformed)
}

/// The addresses `url`'s host resolves to, each checked public unless `allow_private`.
pub(crate) async fn resolve(
    url: &reqwest::Url,
    allow_private: bool,
) -> Result<Vec<SocketAddr>, TargetError> {
    let host = url.host_str().ok_or(TargetError::Malformed)?;
    let port = url.port_or_known_default().ok_or(TargetError::Malformed)?;
    // An IPv6 literal comes bracketed.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addresses: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        // A lookup that hangs is a host that does not resolve.
        Err(_) => tokio::time::timeout(LOOKUP, tokio::net::lookup_host((bare, port)))
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| TargetError::Unresolvable(host.to_owned()))?
            .collect(),
    };
    if addresses.is_empty() {
        return Err(TargetError::Unresolvable(host.to_owned()));
    }
    if !allow_private {
        if let Some(private) = addresses.iter().find(|a| !is_public(a.ip())) {
            return Err(TargetError::Private(private.ip()));
        }
    }
    Ok(addresses)
}

/// Whether `ip` is a public unicast address: not loopback, private, shared (CGNAT),
/// link-local, unspecified, broadcast, multicast, documentation or reserved.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => public_v4(v4),
            None => public_v6(v6),
        },
    }
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || a >= 240) // reserved
}

fn public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local
        || (first & 0xffc0) == 0xfe80 // link-local
        || first == 0x2001 && ip.segments()[1] == 0x0db8) // documentation
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_absolute_http_urls_with_a_host_are_targets() {
        for good in ["https://hooks.example.com/q", "http://203.0.113.9:8080/x"] {
            assert!(parse(good).is_ok(), "{good}");
        }
        for bad in [
            "ftp://example.com/",
            "example.com/hook",
            "https://user:pw@example.com/",
            "file:///etc/passwd",
            "",
        ] {
            assert_eq!(parse(bad), Err(TargetError::Malformed), "{bad}");
        }
        assert_eq!(
            parse(&format!("https://example.com/{}", "a".repeat(MAX_URL))),
            Err(TargetError::Malformed)
        );
    }

    #[test]
    fn loopback_private_and_link_local_addresses_are_not_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fc00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = private.parse().expect("an address");
            assert!(!is_public(ip), "{private}");
        }
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            let ip: IpAddr = public.parse().expect("an address");
            assert!(is_public(ip), "{public}");
        }
    }

    #[tokio::test]
    async fn a_loopback_host_is_refused_unless_private_addresses_are_allowed() {
        let url = parse("http://127.0.0.1:9/hook").expect("a URL");
        assert!(matches!(
            resolve(&url, false).await,
            Err(TargetError::Private(_))
        ));
        assert_eq!(
            resolve(&url, true).await,
            Ok(vec!["127.0.0.1:9".parse().expect("an address")])
        );
        let localhost = parse("http://localhost:9/hook").expect("a URL");
        assert!(matches!(
            resolve(&localhost, false).await,
            Err(TargetError::Private(_))
        ));
    }
}
