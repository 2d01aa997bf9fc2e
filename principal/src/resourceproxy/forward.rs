//! With several replicas (`--ha`), an agent's session lives on exactly one of them. A
//! request for an agent served by another live replica is forwarded, once authenticated
//! here, to that replica's resource proxy (the URL it published on its replica Lease),
//! unchanged: same method, path, query, headers (the `Authorization` header too: the
//! target authenticates again) and body, streamed both ways. An exec's WebSocket upgrade
//! is forwarded and the two upgraded connections are then copied into each other.
//!
//! The target is trusted with the CA clients trust (the proxy's serving CA, shared by all
//! replicas) and must present a certificate naming the host of its replica URL. A forwarded
//! request carries [`FORWARDED_BY`] and is never forwarded again.

// A refusal is the HTTP response to send; it is built once and moved, not worth a box.
#![allow(clippy::result_large_err)]

use argocd_agent_identity::text::{self, quoted};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_domain::AgentName;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use super::response::{Body, full, status};
use crate::ha::{self, Leases};

/// Header of a forwarded request: the replica that forwarded it.
pub const FORWARDED_BY: &str = "x-argocd-agent-forwarded-by";
/// How long connecting to another replica (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default URL of this replica's resource proxy: `https://$POD_IP:<port>` when the pod
/// IP is known, else the bound address (loopback for an unspecified one).
pub fn default_replica_url(pod_ip: Option<&str>, bound: SocketAddr) -> String {
    // The same address the Redis proxy publishes for its port.
    format!(
        "https://{}",
        crate::redisproxy::default_replica_address(pod_ip, bound)
    )
}

/// Where a request goes: the replica's address, TLS name and the request URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub host: String,
    pub port: u16,
    /// `host[:port]` for the Host header.
    pub authority: String,
    /// Origin-form URI: the replica URL's path, then the request's path and query.
    pub uri: Uri,
}

impl Target {
    pub(crate) fn new(base: &str, uri: &Uri) -> Result<Target, ForwardError> {
        let url = url::Url::parse(base).map_err(|error| ForwardError::Url {
            base: base.to_owned(),
            error,
        })?;
        if url.scheme() != "https" {
            return Err(ForwardError::NotHttps(base.to_owned()));
        }
        let host = url
            .host_str()
            .ok_or_else(|| ForwardError::NoHost(base.to_owned()))?
            .trim_matches(['[', ']'])
            .to_owned();
        let port = url.port_or_known_default().unwrap_or(443);
        let authority = match url.port() {
            Some(p) if host.contains(':') => format!("[{host}]:{p}"),
            Some(p) => format!("{host}:{p}"),
            None if host.contains(':') => format!("[{host}]"),
            None => host.clone(),
        };
        let prefix = url.path().trim_end_matches('/');
        let rest = uri.path_and_query().map_or("/", |pq| pq.as_str());
        let uri: Uri = format!("{prefix}{rest}")
            .parse()
            .map_err(ForwardError::Uri)?;
        Ok(Target {
            host,
            port,
            authority,
            uri,
        })
    }
}

/// Why a request could not be forwarded to another replica (each cause is printed in the
/// message, so none is a `#[source]`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    /// The replica URL does not parse.
    #[error("replica URL {}: {error}", quoted(.base))]
    Url {
        /// The replica URL.
        base: String,
        /// Why it does not parse.
        error: url::ParseError,
    },
    /// The replica URL is not `https`.
    #[error("replica URL {}: not https", quoted(.0))]
    NotHttps(String),
    /// The replica URL has no host.
    #[error("replica URL {}: no host", quoted(.0))]
    NoHost(String),
    /// The outgoing request's URI does not parse.
    #[error("request URI: {0}")]
    Uri(http::uri::InvalidUri),
    /// The agent's replica published no resource proxy URL.
    #[error(
        "agent {agent} is served by principal replica {replica}, which published no resource proxy URL"
    )]
    NoUrl {
        /// The agent.
        agent: AgentName,
        /// The replica serving it.
        replica: String,
    },
    /// The proxy CA bundle does not parse.
    #[error("resource proxy CA: {0}")]
    CaPem(rustls_pki_types::pem::Error),
    /// A proxy CA certificate is not usable.
    #[error("resource proxy CA: {0}")]
    CaCert(rustls::Error),
    /// The proxy CA bundle holds no certificate.
    #[error("resource proxy CA: no certificate")]
    NoCa,
    /// The TLS client configuration could not be built.
    #[error("{0}")]
    Tls(rustls::Error),
    /// The replica URL's host is no TLS server name.
    #[error("replica URL host {}: {error}", quoted(.host))]
    Host {
        /// The host.
        host: String,
        /// Why it is no server name.
        error: rustls_pki_types::InvalidDnsNameError,
    },
    /// The TCP connection failed.
    #[error("connecting to {authority}: {error}")]
    Connect {
        /// The replica's `host:port`.
        authority: String,
        /// The socket's error.
        error: std::io::Error,
    },
    /// The TLS handshake failed.
    #[error("TLS with {authority}: {error}")]
    Handshake {
        /// The replica's `host:port`.
        authority: String,
        /// The handshake's error.
        error: std::io::Error,
    },
    /// Connecting took longer than the connect timeout.
    #[error(
        "connecting to {authority} timed out after {}",
        text::duration(CONNECT_TIMEOUT)
    )]
    ConnectTimeout {
        /// The replica's `host:port`.
        authority: String,
    },
    /// The HTTP (`HTTP` or `HTTP/2`) connection failed.
    #[error("{what} with {authority}: {error}")]
    Http {
        /// `HTTP` or `HTTP/2`.
        what: &'static str,
        /// The replica's `host:port`.
        authority: String,
        /// hyper's error.
        error: hyper::Error,
    },
    /// Sending the request failed.
    #[error("request to {authority}: {error}")]
    Request {
        /// The replica's `host:port`.
        authority: String,
        /// hyper's error.
        error: hyper::Error,
    },
    /// The replica did not do `what` in time.
    #[error("{authority} did not {what} within {}", text::duration(*.timeout))]
    Timeout {
        /// The replica's `host:port`.
        authority: String,
        /// `answer` or `switch protocols`.
        what: &'static str,
        /// The answer timeout.
        timeout: Duration,
    },
}

/// Whether a request asks to switch protocols (exec's WebSocket).
pub(crate) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Drops hop-by-hop headers (and those `Connection` names); with `upgrade`, `Connection:
/// Upgrade` and `Upgrade` stay.
fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for h in named {
        if !(upgrade && h == header::UPGRADE) {
            headers.remove(h);
        }
    }
    for h in [
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(h);
    }
    headers.remove(header::CONNECTION);
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

/// The headers sent to the target: the client's, less hop-by-hop ones, with the target's
/// Host and [`FORWARDED_BY`].
pub(crate) fn outbound_headers(
    client: &HeaderMap,
    upgrade: bool,
    authority: &str,
    me: &str,
) -> HeaderMap {
    let mut h = client.clone();
    strip_hop_by_hop(&mut h, upgrade);
    h.remove(header::HOST);
    if let Ok(v) = HeaderValue::from_str(authority) {
        h.insert(header::HOST, v);
    }
    h.remove(FORWARDED_BY);
    if let Ok(v) = HeaderValue::from_str(me) {
        h.insert(FORWARDED_BY, v);
    }
    h
}

/// Forwards requests to the replica serving their agent.
pub struct Forwarder {
    /// Which replica serves each agent, and the resource proxy URL each replica publishes.
    pub leases: Arc<Leases>,
    /// The CA clients trust for the proxy (the same for every replica).
    ca_pem: watch::Receiver<String>,
    /// Client TLS configurations (HTTP/2, HTTP/1.1) built from `ca_pem`.
    tls: Mutex<Option<(String, TlsConfigs)>>,
    /// One HTTP/2 connection per replica (by authority), shared by every forwarded request
    /// but upgrades (which need HTTP/1.1 and a connection of their own).
    pool: Mutex<HashMap<String, http2::SendRequest<Incoming>>>,
    /// How long the target may take to answer with a response head.
    answer_timeout: Duration,
    /// Where connections to other replicas and upgraded streams run (drained on shutdown).
    tasks: TaskTracker,
}

#[derive(Clone)]
struct TlsConfigs {
    h2: Arc<rustls::ClientConfig>,
    h1: Arc<rustls::ClientConfig>,
}

impl Forwarder {
    /// Forwards to replicas found through `leases`, trusting `ca_pem`; a replica has
    /// `answer_timeout` to send a response head (502 after).
    pub fn new(
        leases: Arc<Leases>,
        ca_pem: watch::Receiver<String>,
        answer_timeout: Duration,
        tasks: TaskTracker,
    ) -> Forwarder {
        Forwarder {
            tasks,
            leases,
            ca_pem,
            tls: Mutex::new(None),
            pool: Mutex::new(HashMap::new()),
            answer_timeout,
        }
    }

    /// This replica's name.
    pub fn me(&self) -> &str {
        ha::replica_of(self.leases.holder())
    }

    /// The replica serving `agent` when it is another live one: (holder, URL). `Err`: it is
    /// served elsewhere but published no URL.
    pub(crate) fn target(
        &self,
        agent: &AgentName,
    ) -> Result<Option<(String, String)>, ForwardError> {
        let Some(holder) = self.leases.holder_of(agent) else {
            return Ok(None);
        };
        if holder == self.leases.holder() {
            return Ok(None);
        }
        match self.leases.resource_proxy_url_of(&holder) {
            Some(url) if !url.is_empty() => Ok(Some((holder, url))),
            _ => Err(ForwardError::NoUrl {
                agent: agent.clone(),
                replica: ha::replica_of(&holder).to_owned(),
            }),
        }
    }

    fn client_configs(&self) -> Result<TlsConfigs, ForwardError> {
        let pem = self.ca_pem.borrow().clone();
        let mut cached = lock(&self.tls);
        if let Some((p, c)) = cached.as_ref()
            && *p == pem
        {
            return Ok(c.clone());
        }
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(ForwardError::CaPem)?;
            roots.add(cert).map_err(ForwardError::CaCert)?;
        }
        if roots.is_empty() {
            return Err(ForwardError::NoCa);
        }
        let config = |alpn: &[u8]| -> Result<Arc<rustls::ClientConfig>, ForwardError> {
            let mut config = argocd_agent_identity::tls::TlsProfile::process()
                .client_builder()
                .map_err(ForwardError::Tls)?
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
            config.alpn_protocols = vec![alpn.to_vec()];
            Ok(Arc::new(config))
        };
        let configs = TlsConfigs {
            h2: config(b"h2")?,
            h1: config(b"http/1.1")?,
        };
        *cached = Some((pem, configs.clone()));
        Ok(configs)
    }

    /// A TLS connection to the target, verified against the proxy CA and the URL's host.
    async fn connect(
        &self,
        target: &Target,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ForwardError> {
        let name =
            ServerName::try_from(target.host.clone()).map_err(|error| ForwardError::Host {
                host: target.host.clone(),
                error,
            })?;
        let connect = async {
            let tcp = TcpStream::connect((target.host.as_str(), target.port))
                .await
                .map_err(|error| ForwardError::Connect {
                    authority: target.authority.clone(),
                    error,
                })?;
            let _ = tcp.set_nodelay(true);
            tokio_rustls::TlsConnector::from(tls)
                .connect(name, tcp)
                .await
                .map_err(|error| ForwardError::Handshake {
                    authority: target.authority.clone(),
                    error,
                })
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| ForwardError::ConnectTimeout {
                authority: target.authority.clone(),
            })?
    }

    /// The shared HTTP/2 connection to the target, ready for a request (a new one when
    /// there is none or it closed).
    async fn h2_sender(
        &self,
        target: &Target,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<http2::SendRequest<Incoming>, ForwardError> {
        let pooled = lock(&self.pool).get(&target.authority).cloned();
        if let Some(mut sender) = pooled {
            if sender.ready().await.is_ok() {
                return Ok(sender);
            }
            lock(&self.pool).remove(&target.authority);
        }
        let stream = self.connect(target, tls).await?;
        let (mut sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(Duration::from_secs(30)))
            .keep_alive_timeout(Duration::from_secs(10))
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|error| ForwardError::Http {
                what: "HTTP/2",
                authority: target.authority.clone(),
                error,
            })?;
        let authority = target.authority.clone();
        self.tasks.spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(replica = %authority, error = %e,
                    "resource proxy: connection to another replica ended");
            }
        });
        sender.ready().await.map_err(|error| ForwardError::Http {
            what: "HTTP/2",
            authority: target.authority.clone(),
            error,
        })?;
        lock(&self.pool).insert(target.authority.clone(), sender.clone());
        Ok(sender)
    }

    /// Sends `req` to the replica at `base` and returns its answer (streamed), or the
    /// reason it could not be reached.
    pub(crate) async fn forward(
        &self,
        req: Request<Incoming>,
        base: &str,
    ) -> Result<Response<Body>, ForwardError> {
        let target = Target::new(base, req.uri())?;
        let tls = self.client_configs()?;
        let timeout = |what: &'static str| ForwardError::Timeout {
            authority: target.authority.clone(),
            what,
            timeout: self.answer_timeout,
        };
        if is_upgrade(req.headers()) {
            return tokio::time::timeout(self.answer_timeout, self.upgrade(req, &target, tls.h1))
                .await
                .map_err(|_| timeout("switch protocols"))?;
        }
        let (parts, body) = req.into_parts();
        let uri: Uri = format!("https://{}{}", target.authority, target.uri)
            .parse()
            .map_err(ForwardError::Uri)?;
        let mut out = Request::new(body);
        *out.method_mut() = parts.method;
        *out.uri_mut() = uri;
        *out.version_mut() = Version::HTTP_2;
        let mut headers = outbound_headers(&parts.headers, false, &target.authority, self.me());
        headers.remove(header::HOST);
        *out.headers_mut() = headers;
        let resp = tokio::time::timeout(self.answer_timeout, async {
            let mut sender = self.h2_sender(&target, tls.h2).await?;
            sender
                .send_request(out)
                .await
                .map_err(|error| ForwardError::Request {
                    authority: target.authority.clone(),
                    error,
                })
        })
        .await
        .map_err(|_| timeout("answer"))??;
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers, false);
        Ok(Response::from_parts(
            parts,
            body.map_err(std::io::Error::other).boxed(),
        ))
    }

    /// Forwards an upgrade (exec's WebSocket) on a connection of its own, then copies the
    /// two upgraded connections into each other.
    async fn upgrade(
        &self,
        mut req: Request<Incoming>,
        target: &Target,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<Response<Body>, ForwardError> {
        let stream = self.connect(target, tls).await?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| ForwardError::Http {
                what: "HTTP",
                authority: target.authority.clone(),
                error,
            })?;
        self.tasks.spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "resource proxy: forwarded connection ended");
            }
        });
        let client_upgrade = hyper::upgrade::on(&mut req);
        let (parts, body) = req.into_parts();
        let mut out = Request::new(body);
        *out.method_mut() = parts.method;
        *out.uri_mut() = target.uri.clone();
        *out.version_mut() = Version::HTTP_11;
        *out.headers_mut() = outbound_headers(&parts.headers, true, &target.authority, self.me());
        let mut resp = sender
            .send_request(out)
            .await
            .map_err(|error| ForwardError::Request {
                authority: target.authority.clone(),
                error,
            })?;
        let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switching {
            let upstream = hyper::upgrade::on(&mut resp);
            self.tasks.spawn(async move {
                let (client, upstream) = match tokio::join!(client_upgrade, upstream) {
                    (Ok(c), Ok(u)) => (c, u),
                    (c, u) => {
                        tracing::warn!(client = %text::or_dash(c.err()), upstream = %text::or_dash(u.err()),
                            "resource proxy: forwarded upgrade failed");
                        return;
                    }
                };
                let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
                if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                    tracing::debug!(error = %e, "resource proxy: forwarded session ended");
                }
            });
        }
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers, switching);
        let body: Body = if switching {
            full(bytes::Bytes::new())
        } else {
            body.map_err(std::io::Error::other).boxed()
        };
        Ok(Response::from_parts(parts, body))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The answer when forwarding failed.
pub(crate) fn failed(agent: &AgentName, replica: &str, why: &str) -> Response<Body> {
    status(
        StatusCode::BAD_GATEWAY,
        "ServiceUnavailable",
        format!(
            "agent {agent} is served by principal replica {replica}, which could not be reached: {why}"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_forward_is_a_502_status_naming_the_replica() {
        let r = failed(
            &AgentName::new("edge-1").unwrap(),
            "principal-2",
            "connection refused",
        );
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        let body = futures::executor::block_on(r.into_body().collect())
            .unwrap()
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["code"], 502);
        let message = v["message"].as_str().unwrap();
        assert!(
            message.contains("edge-1")
                && message.contains("principal-2")
                && message.contains("connection refused"),
            "{message}"
        );
    }

    #[test]
    fn the_replica_url_defaults_to_the_pod_ip_then_the_bound_address() {
        let any: SocketAddr = "0.0.0.0:9090".parse().unwrap();
        assert_eq!(
            default_replica_url(Some("10.1.2.3"), any),
            "https://10.1.2.3:9090"
        );
        assert_eq!(
            default_replica_url(Some("fd00::5"), any),
            "https://[fd00::5]:9090"
        );
        assert_eq!(default_replica_url(None, any), "https://127.0.0.1:9090");
        assert_eq!(
            default_replica_url(Some("not an ip"), "10.0.0.1:1".parse().unwrap()),
            "https://10.0.0.1:1"
        );
    }

    #[test]
    fn targets_keep_the_path_and_query_under_the_replica_url() {
        let uri: Uri = "/agents/a/api/v1/namespaces?limit=1".parse().unwrap();
        let t = Target::new("https://10.0.0.1:9090", &uri).unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.authority.as_str()),
            ("10.0.0.1", 9090, "10.0.0.1:9090")
        );
        assert_eq!(t.uri.to_string(), "/agents/a/api/v1/namespaces?limit=1");
        let t = Target::new("https://[fd00::1]:9443/base/", &uri).unwrap();
        assert_eq!(
            (t.host.as_str(), t.authority.as_str()),
            ("fd00::1", "[fd00::1]:9443")
        );
        assert_eq!(
            t.uri.to_string(),
            "/base/agents/a/api/v1/namespaces?limit=1"
        );
        let t = Target::new("https://proxy-0.example", &uri).unwrap();
        assert_eq!((t.port, t.authority.as_str()), (443, "proxy-0.example"));
        assert!(Target::new("http://10.0.0.1:9090", &uri).is_err());
        assert!(Target::new("nonsense", &uri).is_err());
    }

    #[test]
    fn forwarded_headers_drop_hop_by_hop_ones_and_name_the_forwarder() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer t".parse().unwrap());
        h.insert(header::HOST, "service:9090".parse().unwrap());
        h.insert(header::CONNECTION, "keep-alive, x-private".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        h.insert(FORWARDED_BY, "spoofed".parse().unwrap());
        h.insert(header::ACCEPT, "application/json".parse().unwrap());
        let out = outbound_headers(&h, false, "10.0.0.1:9090", "principal-1");
        assert_eq!(out[header::AUTHORIZATION], "Bearer t");
        assert_eq!(out[header::HOST], "10.0.0.1:9090");
        assert_eq!(out[FORWARDED_BY], "principal-1");
        assert_eq!(out.get_all(FORWARDED_BY).iter().count(), 1);
        assert_eq!(out[header::ACCEPT], "application/json");
        for gone in ["connection", "keep-alive", "x-private", "transfer-encoding"] {
            assert!(!out.contains_key(gone), "{gone}");
        }
    }

    #[test]
    fn an_upgrade_keeps_its_connection_and_upgrade_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "Upgrade".parse().unwrap());
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        h.insert("sec-websocket-key", "abc".parse().unwrap());
        h.insert(
            "sec-websocket-protocol",
            "v5.channel.k8s.io".parse().unwrap(),
        );
        assert!(is_upgrade(&h));
        let out = outbound_headers(&h, true, "h:1", "p");
        assert_eq!(out[header::CONNECTION], "Upgrade");
        assert_eq!(out[header::UPGRADE], "websocket");
        assert_eq!(out["sec-websocket-key"], "abc");
        let plain = outbound_headers(&h, false, "h:1", "p");
        assert!(!plain.contains_key(header::UPGRADE));
        h.remove(header::CONNECTION);
        assert!(!is_upgrade(&h));
    }
}
