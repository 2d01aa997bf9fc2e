//! With several replicas (`--ha`), an agent's session lives on exactly one of them. A `GET`
//! or `SUBSCRIBE` of an Application key whose agent is served by another live replica is
//! sent to that replica's Redis proxy (the address it published on its replica Lease), as a
//! Redis client would: the connection first names itself [`FORWARDED_NAME`] with
//! `CLIENT SETNAME`, which the target answers itself and takes as "answer locally, never
//! forward again". `GET`s share one connection per target replica; each `SUBSCRIBE` has its
//! own, closed when the client unsubscribes or leaves.
//!
//! When the proxy serves TLS, the target is trusted when it presents the very certificate
//! this replica serves (every replica mounts the same one; its names need not include the
//! replicas' addresses).

use argocd_agent_identity::text;
use argocd_agent_identity::text::quoted;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_domain::AgentName;
use argocd_agent_redis::{RedisConn, RedisEndpoint, RedisTls};
use bytes::Bytes;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::reply::{Reply, lock};
use crate::ha::{self, Leases};

/// The client name a forwarding replica gives its connections to another replica.
pub const FORWARDED_NAME: &[u8] = b"argocd-agent-forwarded";

/// The default address of this replica's Redis proxy for the other replicas:
/// `$POD_IP:<port>` when the pod IP is known, else the bound address (loopback for an
/// unspecified one).
pub fn default_replica_address(pod_ip: Option<&str>, bound: SocketAddr) -> String {
    let ip = pod_ip
        .map(str::trim)
        .and_then(|s| s.parse::<IpAddr>().ok())
        .unwrap_or_else(|| {
            if bound.ip().is_unspecified() {
                IpAddr::from([127, 0, 0, 1])
            } else {
                bound.ip()
            }
        });
    SocketAddr::new(ip, bound.port()).to_string()
}

/// Whether a command is `CLIENT SETNAME argocd-agent-forwarded`: the connection comes from
/// another replica.
pub(crate) fn is_forward_marker(args: &[Bytes]) -> bool {
    matches!(args, [client, setname, name]
        if client.eq_ignore_ascii_case(b"CLIENT")
            && setname.eq_ignore_ascii_case(b"SETNAME")
            && name.as_ref() == FORWARDED_NAME)
}

/// Where a command for an agent that is not connected here goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PeerRoute {
    /// Nowhere else: answered here (offline).
    Local,
    /// To another live replica's Redis proxy.
    Replica { replica: String, addr: String },
    /// Another live replica serves the agent but published no Redis proxy address.
    NoAddress { replica: String },
}

/// The rule: a forwarded connection is never forwarded again; an agent served by another
/// live replica is asked there.
pub(crate) fn peer_route(
    forwarded: bool,
    me: &str,
    holder: Option<&str>,
    addr: Option<&str>,
) -> PeerRoute {
    match holder {
        _ if forwarded => PeerRoute::Local,
        None => PeerRoute::Local,
        Some(h) if h == me => PeerRoute::Local,
        Some(h) => {
            let replica = ha::replica_of(h).to_owned();
            match addr.map(str::trim).filter(|a| !a.is_empty()) {
                Some(addr) => PeerRoute::Replica {
                    replica,
                    addr: addr.to_owned(),
                },
                None => PeerRoute::NoAddress { replica },
            }
        }
    }
}

/// The host part of `host:port` (brackets of an IPv6 address removed).
fn host_of(addr: &str) -> &str {
    let host = match addr.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => addr,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Connections to the other replicas' Redis proxies.
pub(crate) struct Peers {
    pub leases: Arc<Leases>,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// The hub Redis's user and password: the other replicas' proxies want them as
    /// argocd-server's connections do.
    auth: (Option<String>, Option<String>),
    limit: usize,
    timeout: Duration,
    /// One connection per target address for `GET`s.
    pool: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<RedisConn>>>>>,
}

impl Peers {
    pub fn new(
        leases: Arc<Leases>,
        tls: Option<Arc<rustls::ClientConfig>>,
        auth: (Option<String>, Option<String>),
        limit: usize,
        timeout: Duration,
    ) -> Peers {
        Peers {
            leases,
            tls,
            auth,
            limit,
            timeout,
            pool: Mutex::new(HashMap::new()),
        }
    }

    /// Where a command for `agent` (not connected here) goes.
    pub fn route(&self, agent: &AgentName, forwarded: bool) -> PeerRoute {
        if forwarded {
            return PeerRoute::Local;
        }
        let holder = self.leases.holder_of(agent);
        let addr = holder
            .as_deref()
            .and_then(|h| self.leases.redis_proxy_address_of(h));
        peer_route(
            forwarded,
            self.leases.holder(),
            holder.as_deref(),
            addr.as_deref(),
        )
    }

    /// A new connection to a replica's Redis proxy, marked as forwarded.
    async fn dial(&self, addr: &str) -> Result<RedisConn, ReplicaError> {
        let tls = match &self.tls {
            None => None,
            Some(config) => Some(RedisTls {
                config: config.clone(),
                server_name: ServerName::try_from(host_of(addr).to_owned()).map_err(|error| {
                    ReplicaError::ServerName {
                        addr: addr.to_owned(),
                        error,
                    }
                })?,
            }),
        };
        let endpoint = RedisEndpoint {
            addr: addr.to_owned(),
            tls,
            username: self.auth.0.clone(),
            password: self.auth.1.clone(),
        };
        let mut conn = endpoint
            .connect(self.limit)
            .await
            .map_err(ReplicaError::Redis)?;
        let reply = conn
            .command(&[b"CLIENT", b"SETNAME", FORWARDED_NAME])
            .await
            .map_err(ReplicaError::Redis)?;
        if reply.is_error() {
            return Err(ReplicaError::SetName(reply.error_text()));
        }
        Ok(conn)
    }

    /// `GET key` on the replica at `addr`: its reply, or why it could not be asked. A pooled
    /// connection that fails is replaced once.
    pub async fn get(&self, addr: &str, key: &str) -> Result<Reply, ReplicaError> {
        let slot = lock(&self.pool)
            .entry(addr.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(None)))
            .clone();
        let work = async {
            let mut conn = slot.lock().await;
            let mut last = None;
            for _ in 0..2 {
                if conn.is_none() {
                    match self.dial(addr).await {
                        Ok(c) => *conn = Some(c),
                        Err(e) => return Err(e),
                    }
                }
                let c = conn.as_mut().expect("just set");
                match c.command(&[b"GET", key.as_bytes()]).await {
                    Ok(frame) => {
                        return Ok(match frame.into_value() {
                            Ok(Some(v)) => Reply::Value(v),
                            Ok(None) => Reply::Nil,
                            Err(e) => Reply::Error(e.to_string()),
                        });
                    }
                    Err(e) => {
                        *conn = None;
                        last = Some(e);
                    }
                }
            }
            Err(last.map_or(ReplicaError::Timeout(self.timeout), ReplicaError::Redis))
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => {
                // The connection may hold half a reply: start over next time.
                if let Ok(mut c) = slot.try_lock() {
                    *c = None;
                }
                Err(ReplicaError::Timeout(self.timeout))
            }
        }
    }

    /// `SUBSCRIBE channel` on the replica at `addr`, on a connection of its own: the
    /// connection once subscribed, `Ok(Err(reply))` when the target refused, `Err` when it
    /// could not be asked.
    pub async fn subscribe(
        &self,
        addr: &str,
        channel: &[u8],
    ) -> Result<Result<RedisConn, Reply>, ReplicaError> {
        let work = async {
            let mut conn = self.dial(addr).await?;
            let frame = conn
                .command(&[b"SUBSCRIBE", channel])
                .await
                .map_err(ReplicaError::Redis)?;
            if frame.is_error() {
                let msg = frame.error_text();
                return Ok(Err(Reply::Error(msg)));
            }
            Ok(Ok(conn))
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| ReplicaError::Timeout(self.timeout))?
    }
}

/// Why another replica's Redis proxy could not be asked (each cause is printed in the
/// message, so none is a `#[source]`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplicaError {
    /// The replica's address has no valid TLS server name.
    #[error("{}: {error}", quoted(.addr))]
    ServerName {
        /// The replica's address.
        addr: String,
        /// Why its host is no server name.
        error: rustls_pki_types::InvalidDnsNameError,
    },
    /// Connecting to the replica or talking to it failed.
    #[error("{0}")]
    Redis(argocd_agent_redis::RespError),
    /// The replica refused to name the connection as forwarded.
    #[error("CLIENT SETNAME refused: {0}")]
    SetName(String),
    /// The replica did not answer in time.
    #[error("no answer within {}", text::duration(*.0))]
    Timeout(Duration),
}

/// Why the TLS towards the other replicas could not be built (each cause is printed in the
/// message, so none is a `#[source]`).
#[derive(Debug, thiserror::Error)]
pub enum PinnedTlsError {
    /// The certificate file could not be read or parsed.
    #[error("{}: {error}", .path.display())]
    Pem {
        /// The certificate file.
        path: std::path::PathBuf,
        /// Why it could not be read.
        error: rustls_pki_types::pem::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{}: no certificate", .0.display())]
    NoCertificate(std::path::PathBuf),
    /// The TLS client configuration could not be built.
    #[error("{0}")]
    Tls(rustls::Error),
}

/// TLS towards the other replicas' Redis proxies: the server must present `cert` (the first
/// certificate of the PEM file this replica serves).
pub fn pinned_replica_tls(cert: &Path) -> Result<Arc<rustls::ClientConfig>, PinnedTlsError> {
    let pem = |error| PinnedTlsError::Pem {
        path: cert.to_owned(),
        error,
    };
    let leaf = CertificateDer::pem_file_iter(cert)
        .map_err(pem)?
        .next()
        .ok_or_else(|| PinnedTlsError::NoCertificate(cert.to_owned()))?
        .map_err(pem)?;
    let profile = argocd_agent_identity::tls::TlsProfile::process();
    let verifier = Arc::new(Pinned {
        cert: leaf.into_owned(),
        algorithms: profile.provider().signature_verification_algorithms,
    });
    let config = profile
        .client_builder()
        .map_err(PinnedTlsError::Tls)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Accepts exactly one server certificate (the handshake signatures are still checked).
#[derive(Debug)]
struct Pinned {
    cert: CertificateDer<'static>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "not the Redis proxy certificate of this deployment".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_address_prefers_the_pod_ip() {
        let bound: SocketAddr = "0.0.0.0:6379".parse().unwrap();
        assert_eq!(
            default_replica_address(Some("10.1.2.3"), bound),
            "10.1.2.3:6379"
        );
        assert_eq!(
            default_replica_address(Some("fd00::1"), bound),
            "[fd00::1]:6379"
        );
        assert_eq!(default_replica_address(None, bound), "127.0.0.1:6379");
        assert_eq!(
            default_replica_address(Some("garbage"), "10.0.0.9:7000".parse().unwrap()),
            "10.0.0.9:7000"
        );
    }

    #[test]
    fn only_the_exact_setname_marks_a_forwarded_connection() {
        let args = |a: &[&str]| -> Vec<Bytes> {
            a.iter()
                .map(|s| Bytes::copy_from_slice(s.as_bytes()))
                .collect()
        };
        assert!(is_forward_marker(&args(&[
            "client",
            "setname",
            "argocd-agent-forwarded"
        ])));
        assert!(is_forward_marker(&args(&[
            "CLIENT",
            "SETNAME",
            "argocd-agent-forwarded"
        ])));
        assert!(!is_forward_marker(&args(&["CLIENT", "SETNAME", "argocd"])));
        assert!(!is_forward_marker(&args(&[
            "CLIENT",
            "SETINFO",
            "argocd-agent-forwarded"
        ])));
        assert!(!is_forward_marker(&args(&["CLIENT", "SETNAME"])));
    }

    #[test]
    fn forwarded_connections_and_own_agents_stay_local() {
        let me = "principal-0_abc";
        assert_eq!(
            peer_route(true, me, Some("principal-1_x"), Some("10.0.0.2:6379")),
            PeerRoute::Local
        );
        assert_eq!(peer_route(false, me, None, None), PeerRoute::Local);
        assert_eq!(
            peer_route(false, me, Some(me), Some("10.0.0.1:6379")),
            PeerRoute::Local
        );
        assert_eq!(
            peer_route(false, me, Some("principal-1_x"), Some("10.0.0.2:6379")),
            PeerRoute::Replica {
                replica: "principal-1".into(),
                addr: "10.0.0.2:6379".into()
            }
        );
        assert_eq!(
            peer_route(false, me, Some("principal-1_x"), Some(" ")),
            PeerRoute::NoAddress {
                replica: "principal-1".into()
            }
        );
        assert_eq!(
            peer_route(false, me, Some("principal-1_x"), None),
            PeerRoute::NoAddress {
                replica: "principal-1".into()
            }
        );
    }

    /// Writes a self-signed certificate and key for `name`; returns their paths.
    fn self_signed(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let c = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        let (cert, key) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, c.cert.pem()).unwrap();
        std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
        (cert, key)
    }

    async fn handshake(server_cert: &Path, server_key: &Path, pinned: &Path) -> bool {
        let builder = argocd_agent_identity::tls::TlsProfile::default()
            .server_builder()
            .unwrap();
        let server =
            argocd_agent_redis::client::server_tls(server_cert, server_key, builder).unwrap();
        let client = pinned_replica_tls(pinned).unwrap();
        let (a, b) = tokio::io::duplex(64 * 1024);
        let accept = tokio::spawn(async move {
            let _ = tokio_rustls::TlsAcceptor::from(server).accept(a).await;
        });
        // The name is not checked: replicas are reached by pod IP.
        let name = ServerName::try_from("10.0.0.7").unwrap();
        let ok = tokio_rustls::TlsConnector::from(client)
            .connect(name, b)
            .await
            .is_ok();
        accept.abort();
        ok
    }

    #[tokio::test]
    async fn replicas_trust_exactly_the_certificate_they_serve() {
        let dir = std::env::temp_dir().join(format!("redis-replica-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ours, our_key) = self_signed(&dir, "redis-proxy.example");
        let (theirs, their_key) = self_signed(&dir, "other.example");
        assert!(handshake(&ours, &our_key, &ours).await);
        assert!(!handshake(&theirs, &their_key, &ours).await);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn host_of_strips_port_and_brackets() {
        assert_eq!(host_of("10.0.0.1:6379"), "10.0.0.1");
        assert_eq!(host_of("[fd00::1]:6379"), "fd00::1");
        assert_eq!(host_of("redis.example"), "redis.example");
    }
}
