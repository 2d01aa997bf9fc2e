//! The trusted-proxy guard: header identities are believed only on a listener that nothing
//! but the local mesh proxy can reach.
//!
//! A header such as `x-forwarded-client-cert` is just text. On a plaintext port, anyone who
//! can open a TCP connection to it can write any identity into it; the only thing that makes
//! it true is that the sole client able to connect is the sidecar that verified the
//! caller's certificate. So header auth is served only on loopback or a Unix socket (both
//! unreachable from outside the pod), and each connection's peer address is checked again.
//! Any other bind address needs an explicit, loudly logged override.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// The principal flag that allows header auth on a non-loopback address.
pub const PRINCIPAL_OVERRIDE_FLAG: &str = "--insecure-header-auth-any-address";

/// The agent flag that allows plaintext (`--creds header:`) to a non-loopback address.
/// The principal flag (repeatable) naming a trusted proxy address for header auth.
pub const TRUSTED_PROXY_FLAG: &str = "--header-auth-trusted-proxy";

/// The agent flag that allows plaintext (`--creds header:`) to a non-loopback address.
pub const AGENT_OVERRIDE_FLAG: &str = "--insecure-plaintext-any-address";

/// Where a listener is bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix domain socket path.
    Unix(PathBuf),
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Who may talk to the header-auth listener.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderListenerPolicy {
    /// Peer addresses accepted besides loopback (e.g. the pod IP that Linkerd's proxy
    /// connects from). When non-empty, only these and loopback are accepted, even with
    /// `allow_non_loopback`.
    pub trusted_proxies: Vec<IpAddr>,
    /// The explicit override ([`PRINCIPAL_OVERRIDE_FLAG`]): allow binding header auth to a
    /// non-loopback address.
    pub allow_non_loopback: bool,
}

/// A condition that is allowed but must be logged at every start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardWarning {
    /// The message to log (at `warn`).
    pub message: String,
}

impl fmt::Display for GuardWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Why the guard refused a listener, a target or a connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    /// Header auth on a non-loopback TCP address without the override.
    #[error(
        "refusing header authentication on {addr}: it is not a loopback address, so anyone who can reach this port could claim any agent identity by sending the header; bind to 127.0.0.1, ::1 or a Unix socket that only the mesh sidecar uses, or pass {PRINCIPAL_OVERRIDE_FLAG} together with trusted proxies if the proxy really is the only way in"
    )]
    NonLoopbackListener {
        /// The refused address.
        addr: SocketAddr,
    },
    /// A connection from an address that is neither loopback nor a trusted proxy.
    #[error(
        "refusing connection from {peer} on the header-auth listener: it is neither loopback nor a configured trusted proxy, and accepting it would let that host claim any agent identity"
    )]
    UntrustedPeer {
        /// The peer address.
        peer: SocketAddr,
    },
}

fn is_loopback(ip: IpAddr) -> bool {
    // `::ffff:127.0.0.1` is loopback too; `to_canonical` turns it into 127.0.0.1.
    ip.to_canonical().is_loopback()
}

/// Decides whether header authentication may be served on `addr`.
///
/// Loopback TCP and Unix sockets: `Ok(None)`. Anything else (including `0.0.0.0` and
/// `::`): refused, unless `policy.allow_non_loopback`, in which case the returned warning
/// must be logged at every start.
pub fn check_listen_addr(
    addr: &ListenAddr,
    policy: &HeaderListenerPolicy,
) -> Result<Option<GuardWarning>, GuardError> {
    match addr {
        ListenAddr::Unix(_) => Ok(None),
        ListenAddr::Tcp(a) if is_loopback(a.ip()) => Ok(None),
        ListenAddr::Tcp(a) if policy.allow_non_loopback => {
            let who = if policy.trusted_proxies.is_empty() {
                "ANY host that can reach it can claim any agent identity (no trusted proxies configured)".to_owned()
            } else {
                let list: Vec<String> = policy
                    .trusted_proxies
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                format!(
                    "only loopback and the trusted proxies [{}] are accepted; make sure nothing else can connect from those addresses",
                    list.join(", ")
                )
            };
            Ok(Some(GuardWarning {
                message: format!(
                    "header authentication is served on non-loopback address {a} because {PRINCIPAL_OVERRIDE_FLAG} is set: {who}"
                ),
            }))
        }
        ListenAddr::Tcp(a) => Err(GuardError::NonLoopbackListener { addr: *a }),
    }
}

/// Decides whether one connection to the header-auth listener is accepted.
///
/// `peer` is `None` for Unix-socket connections (access is controlled by the socket's file
/// permissions). A TCP peer must be loopback or in `trusted_proxies`; when that list is
/// empty and the override is set, any peer is accepted (the start-up warning says so).
pub fn check_peer(
    peer: Option<SocketAddr>,
    policy: &HeaderListenerPolicy,
) -> Result<(), GuardError> {
    let Some(peer) = peer else {
        return Ok(());
    };
    let ip = peer.ip().to_canonical();
    if ip.is_loopback()
        || policy
            .trusted_proxies
            .iter()
            .any(|p| p.to_canonical() == ip)
        || (policy.allow_non_loopback && policy.trusted_proxies.is_empty())
    {
        Ok(())
    } else {
        Err(GuardError::UntrustedPeer { peer })
    }
}

/// Whether `host` (a name or an IP literal, optionally in brackets) is the local machine:
/// `localhost`, `*.localhost` or a loopback address. Other names are not resolved: a name
/// that resolves to loopback today may not tomorrow.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let lower = host.trim_end_matches('.').to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return true;
    }
    host.parse::<IpAddr>().is_ok_and(is_loopback)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(s: &str) -> ListenAddr {
        ListenAddr::Tcp(s.parse().unwrap())
    }

    fn strict() -> HeaderListenerPolicy {
        HeaderListenerPolicy::default()
    }

    #[test]
    fn loopback_and_unix_listeners_are_allowed() {
        for addr in [
            tcp("127.0.0.1:8404"),
            tcp("127.0.0.2:8404"),
            tcp("[::1]:8404"),
            tcp("[::ffff:127.0.0.1]:8404"),
            ListenAddr::Unix("/run/principal/header.sock".into()),
        ] {
            assert_eq!(check_listen_addr(&addr, &strict()), Ok(None), "{addr}");
        }
    }

    #[test]
    fn non_loopback_listeners_are_refused_without_override() {
        for addr in ["0.0.0.0:8404", "[::]:8404", "10.1.2.3:8404"] {
            let err = check_listen_addr(&tcp(addr), &strict()).unwrap_err();
            assert!(matches!(err, GuardError::NonLoopbackListener { .. }));
            let msg = err.to_string();
            assert!(msg.contains("could claim any agent identity"), "{msg}");
            assert!(msg.contains(PRINCIPAL_OVERRIDE_FLAG), "{msg}");
        }
    }

    #[test]
    fn override_allows_non_loopback_with_warning() {
        let open = HeaderListenerPolicy {
            allow_non_loopback: true,
            ..strict()
        };
        let w = check_listen_addr(&tcp("0.0.0.0:8404"), &open)
            .unwrap()
            .unwrap();
        assert!(w.message.contains("ANY host"), "{w}");
        let listed = HeaderListenerPolicy {
            allow_non_loopback: true,
            trusted_proxies: vec!["10.0.0.5".parse().unwrap()],
        };
        let w = check_listen_addr(&tcp("10.0.0.5:8404"), &listed)
            .unwrap()
            .unwrap();
        assert!(w.message.contains("10.0.0.5"), "{w}");
    }

    #[test]
    fn peers_must_be_loopback_or_trusted_proxies() {
        let proxy: IpAddr = "10.0.0.5".parse().unwrap();
        let peer = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
        // Unix socket, loopback: always fine.
        assert_eq!(check_peer(None, &strict()), Ok(()));
        assert_eq!(check_peer(peer("127.0.0.6:5000"), &strict()), Ok(()));
        assert_eq!(check_peer(peer("[::1]:5000"), &strict()), Ok(()));
        // Anything else needs to be listed.
        assert!(matches!(
            check_peer(peer("10.0.0.5:5000"), &strict()),
            Err(GuardError::UntrustedPeer { .. })
        ));
        let listed = HeaderListenerPolicy {
            trusted_proxies: vec![proxy],
            allow_non_loopback: true,
        };
        assert_eq!(check_peer(peer("10.0.0.5:5000"), &listed), Ok(()));
        assert_eq!(check_peer(peer("[::ffff:10.0.0.5]:5000"), &listed), Ok(()));
        // With a list, the override does not open the door to others.
        assert!(check_peer(peer("10.0.0.6:5000"), &listed).is_err());
        // Override without a list: any peer (the start-up warning says so).
        let open = HeaderListenerPolicy {
            allow_non_loopback: true,
            ..strict()
        };
        assert_eq!(check_peer(peer("192.0.2.1:5000"), &open), Ok(()));
    }

    #[test]
    fn loopback_hosts_are_recognised_without_resolving() {
        for h in [
            "localhost",
            "LOCALHOST.",
            "sidecar.localhost",
            "127.0.0.1",
            "::1",
            "[::1]",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "principal.example",
            "10.0.0.1",
            "0.0.0.0",
            "localhost.example",
            "[::]",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }
}
