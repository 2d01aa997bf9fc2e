//! The agents' gRPC listener: its services, its connection options and the accept loop
//! that guards each connection (TLS, then the HTTP/2 rules: keepalive pings, idle time) before it is served.

use std::sync::Arc;

use argocd_agent_domain::mapping::LiveRules;
use argocd_agent_identity::tls::PeerPolicy;
use argocd_agent_proto::eventstream::event_stream_server::EventStreamServer;
use argocd_agent_proto::version::version_server::VersionServer;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin;
use crate::auth::ListenerAuth;
use crate::config::PrincipalConfig;
use crate::error::PrincipalError;
use crate::metrics::Metrics;
use crate::server::{EventStreamService, VersionService};
use crate::session::SessionContext;
use crate::tunnel;
use crate::wiring::Wiring;

/// The gRPC services on the agent listener: event stream, tunnels, the operator API (only
/// SPIFFE IDs with an admin rule) and version.
fn grpc_router(
    config: &PrincipalConfig,
    auth: &ListenerAuth,
    admin_context: Arc<admin::AdminContext>,
    rules: Arc<LiveRules>,
    sessions: SessionContext,
    tunnels: Arc<tunnel::Tunnels>,
) -> AgentRouter {
    let metrics = sessions.hub.shared.metrics.clone();
    let admin = argocd_agent_proto::admin::admin_server::AdminServer::new(admin::AdminService {
        sessions: sessions.hub.shared.sessions.clone(),
        metrics: metrics.clone(),
        access: admin::AdminAccess::Rules {
            auth: auth.authenticator.clone(),
            rules: rules.clone(),
        },
        context: admin_context,
    });
    let tunnel =
        argocd_agent_proto::eventstream::tunnel_server::TunnelServer::new(tunnel::TunnelService {
            tunnels,
            rules: rules.clone(),
            auth: auth.authenticator.clone(),
            sessions: sessions.hub.shared.sessions.clone(),
            metrics,
        })
        .max_decoding_message_size(config.max_message_size)
        .max_encoding_message_size(config.max_message_size);
    let events = EventStreamServer::new(EventStreamService {
        sessions,
        rules,
        auth: auth.authenticator.clone(),
    })
    .max_decoding_message_size(config.max_message_size)
    .max_encoding_message_size(config.max_message_size);
    // Both encodings are decoded and may be answered in; AnswerCompression decides per
    // request whether answers are compressed.
    let (events, tunnel) =
        crate::server::ENCODINGS
            .into_iter()
            .fold((events, tunnel), |(e, t), enc| {
                (
                    e.accept_compressed(enc).send_compressed(enc),
                    t.accept_compressed(enc).send_compressed(enc),
                )
            });
    let answers = crate::server::AnswerCompression {
        enabled: config.compression,
    };
    with_keepalive(tonic::transport::Server::builder(), config.keepalive)
        .max_concurrent_streams(Some(config.max_concurrent_streams))
        .layer(answers)
        .add_service(events)
        .add_service(tunnel)
        .add_service(admin)
        .add_service(VersionServer::new(VersionService))
}

/// `server` PINGing each connection as `keepalive` says.
fn with_keepalive(
    server: tonic::transport::Server,
    keepalive: crate::config::Keepalive,
) -> tonic::transport::Server {
    server
        .http2_keepalive_interval(keepalive.interval)
        .http2_keepalive_timeout(Some(keepalive.timeout))
}

/// The agent listener's router.
type AgentRouter = tonic::transport::server::Router<
    tower::layer::util::Stack<crate::server::AnswerCompression, tower::layer::util::Identity>,
>;

/// Serves gRPC on `listener` (TLS with SVIDs, also inside WebSockets with
/// `--enable-websocket`, or plaintext behind a mesh or ingress) until `shutdown`. While
/// `readiness` says not ready, new connections are closed before any TLS.
pub(crate) fn serve(
    w: Wiring,
    listener: TcpListener,
    sessions: SessionContext,
    tunnels: Arc<tunnel::Tunnels>,
    readiness: crate::health::Readiness,
) -> Result<tokio::task::JoinHandle<Result<(), PrincipalError>>, PrincipalError> {
    let Wiring {
        config,
        tasks,
        shutdown,
        listener_auth: auth,
        rules,
        admin,
        ..
    } = w;
    // Connections dropped before their first request count as auth failures.
    let metrics = sessions.hub.shared.metrics.clone();
    let router = grpc_router(&config, &auth, admin, rules, sessions, tunnels);
    let handle = match (&config.auth, auth.svid) {
        (crate::auth::AuthConfig::Mtls { trust_domains, .. }, Some(source)) => {
            let policy = if trust_domains.is_empty() {
                PeerPolicy::Any
            } else {
                PeerPolicy::TrustDomains(trust_domains.clone())
            };
            let tls = argocd_agent_identity::tls::server_config(&source, policy)
                .map_err(PrincipalError::Tls)?;
            let options = incoming_options(&config, metrics, readiness);
            let incoming = Incoming {
                listener,
                tls,
                options,
            };
            // The source feeds every handshake's certificate: kept while serving.
            if config.websocket {
                let incoming = incoming.websocket(&tasks, shutdown.clone());
                serve_incoming(&tasks, router, incoming, shutdown, source)
            } else {
                let incoming = incoming.direct(&tasks, shutdown.clone());
                serve_incoming(&tasks, router, incoming, shutdown, source)
            }
        }
        _ => {
            if config.websocket {
                return Err(PrincipalError::Config(
                    "--enable-websocket carries SVID mutual TLS inside the WebSocket: it needs --auth spiffe (mTLS)".into(),
                ));
            }
            let options = incoming_options(&config, metrics, readiness);
            let name = format!("agent listener {} (plaintext)", config.listen);
            let incoming = argocd_agent_listener::plain_incoming(
                listener,
                &options,
                &name,
                &tasks,
                shutdown.clone(),
            );
            serve_incoming(&tasks, router, incoming, shutdown, ())
        }
    };
    Ok(handle)
}

/// The agent listener's caps (`--max-connections`, `--max-connections-per-client`,
/// `--max-handshakes-per-client`) and readiness: connections refused by a cap, or closed
/// before TLS while the principal is not ready (`/readyz`) or after waiting
/// `--max-handshake-wait` for a handshake slot (`Busy`), are counted in
/// `argocd_principal_listener_connections_closed_total{listener="grpc"}`, connections
/// dropped before their first request (handshake, SVID, preface) as auth failures.
fn incoming_options(
    config: &PrincipalConfig,
    metrics: Metrics,
    readiness: crate::health::Readiness,
) -> argocd_agent_listener::IncomingOptions {
    let hook = move |reason: &'static str| match reason {
        "TooManyConnections" | "TooManyFromClient" | "NotReady" | "Busy" | "TooManyPings"
        | "IdleTimeout" => metrics.listener_closed("grpc", reason),
        _ => metrics.auth_failed(reason),
    };
    argocd_agent_listener::IncomingOptions {
        max_handshakes: config.max_concurrent_handshakes,
        max_handshakes_per_client: config.max_handshakes_per_client,
        max_connections: config.max_connections,
        max_connections_per_client: config.max_connections_per_client,
        max_handshake_wait: config.max_handshake_wait,
        on_refused: Some(argocd_agent_listener::RefusedHook(Arc::new(hook))),
        ready: Some(argocd_agent_listener::ReadyHook(Arc::new(move || {
            readiness.is_ready()
        }))),
        h2: argocd_agent_listener::H2Policy {
            min_ping_interval: config.keepalive_min_interval,
            max_idle: config.max_connection_idle,
        },
        ..Default::default()
    }
}

/// The mTLS agent listener's parts, before it is served directly or also over WebSockets.
struct Incoming {
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    options: argocd_agent_listener::IncomingOptions,
}

/// A connection past its TLS handshake and HTTP/2 preface, its client verified.
type Verified<IO> =
    argocd_agent_listener::H2Connection<argocd_agent_identity::transport::VerifiedStream<IO>>;

impl Incoming {
    /// TLS straight on TCP, accepted on `tasks` until `shutdown`.
    fn direct(
        self,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> impl futures::Stream<Item = std::io::Result<Verified<TcpStream>>> + Send + 'static {
        argocd_agent_identity::transport::tls_incoming_with_options(
            self.listener,
            self.tls,
            self.options,
            tasks,
            shutdown,
        )
    }

    /// TLS straight on TCP, or inside a WebSocket (`--enable-websocket`), accepted on
    /// `tasks` until `shutdown`.
    fn websocket(
        self,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> impl futures::Stream<
        Item = std::io::Result<Verified<argocd_agent_identity::websocket::Carrier>>,
    > + Send
    + 'static {
        tracing::info!(
            subprotocol = argocd_agent_identity::websocket::SUBPROTOCOL,
            "agent listener also takes HTTP/1.1 WebSocket upgrades (mTLS inside)"
        );
        argocd_agent_identity::websocket::tls_incoming_websocket(
            self.listener,
            self.tls,
            self.options,
            argocd_agent_identity::websocket::WsOptions::default(),
            tasks,
            shutdown,
        )
    }
}

/// Serves `router` on `incoming` on the principal's tasks until `shutdown`, keeping `keep`
/// (the SVID source of a TLS listener) while serving.
fn serve_incoming<IO, K>(
    tasks: &TaskTracker,
    router: AgentRouter,
    incoming: impl futures::Stream<Item = Result<IO, std::io::Error>> + Send + 'static,
    shutdown: CancellationToken,
    keep: K,
) -> tokio::task::JoinHandle<Result<(), PrincipalError>>
where
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
    K: Send + 'static,
{
    tasks.spawn(async move {
        let _keep = keep;
        router
            .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
            .await
            .map_err(PrincipalError::from)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn readiness(ready: bool) -> crate::health::Readiness {
        let (_tx, synced) = tokio::sync::watch::channel(ready);
        crate::health::Readiness {
            synced,
            svid: None,
            checks: Vec::new(),
        }
    }

    #[test]
    fn the_principals_keepalive_is_a_backstop_behind_the_agents_pings_and_the_idle_timeout() {
        let defaults = PrincipalConfig::default();
        let interval = defaults.keepalive.interval.expect("the principal PINGs");
        // The agent's default PING and heartbeat interval (`--keep-alive-ping-interval`,
        // defined by the CLI, which this crate does not depend on).
        let agents = Duration::from_secs(30);
        assert!(interval >= 2 * agents);
        // A silent peer is found before the session's idle timeout would close it.
        let idle = defaults.idle_timeout;
        assert!(interval + defaults.keepalive.timeout < idle, "{idle:?}");
    }

    /// A server with the listener's keepalive and two services (version, and [`Drain`]),
    /// on plaintext TCP.
    async fn keepalive_server(keepalive: crate::config::Keepalive) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let server = with_keepalive(tonic::transport::Server::builder(), keepalive)
            .add_service(VersionServer::new(VersionService))
            .add_service(Drain);
        tokio::spawn(server.serve_with_incoming(incoming));
        addr
    }

    /// A service that reads its request's body to the end, as a session reads its agent's
    /// stream, then answers.
    #[derive(Clone)]
    struct Drain;

    impl tonic::server::NamedService for Drain {
        const NAME: &'static str = "test.Drain";
    }

    impl tower::Service<http::Request<tonic::body::Body>> for Drain {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            use http_body_util::BodyExt;
            Box::pin(async move {
                let mut body = req.into_body();
                while let Some(Ok(_)) = body.frame().await {}
                Ok(http::Response::new(tonic::body::Body::empty()))
            })
        }
    }

    /// What a raw HTTP/2 client saw on one connection (h2's own client answers PINGs
    /// without telling its caller, so the frames are read here).
    #[derive(Debug, Default)]
    struct Seen {
        /// When each PING from the server arrived, from the connect.
        pings: Vec<Duration>,
        /// When the server closed the connection (GOAWAY or end of stream), if it did.
        closed: Option<Duration>,
    }

    /// An HTTP/2 frame: 9-byte header, then `payload`.
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// A HEADERS block opening a gRPC call to [`Drain`], each field a literal without
    /// indexing (RFC 7541 6.2.2), so no HPACK table is needed.
    fn drain_call_headers() -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/test.Drain/Call"),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ] {
            block.push(0);
            block.push(u8::try_from(name.len()).unwrap());
            block.extend_from_slice(name.as_bytes());
            block.push(u8::try_from(value.len()).unwrap());
            block.extend_from_slice(value.as_bytes());
        }
        frame(1, 0x4, 1, &block) // END_HEADERS, stream 1
    }

    /// Connects to `addr` as an HTTP/2 client, answers the server's SETTINGS and (when
    /// `answer`) its PINGs, and reads frames for `window`. With `data_every`, it opens a
    /// call to [`Drain`] and sends an empty gRPC message on it that often, as an agent's
    /// heartbeats.
    async fn watch_pings(
        addr: std::net::SocketAddr,
        answer: bool,
        data_every: Option<Duration>,
        window: Duration,
    ) -> Seen {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let conn = TcpStream::connect(addr).await.unwrap();
        let start = tokio::time::Instant::now();
        let (mut rd, wr) = conn.into_split();
        let wr = Arc::new(tokio::sync::Mutex::new(wr));
        let send = move |bytes: Vec<u8>| {
            let wr = wr.clone();
            async move {
                // The server may have closed the connection: what it saw is what counts.
                let _ = wr.lock().await.write_all(&bytes).await;
            }
        };
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend(frame(4, 0, 0, &[])); // an empty SETTINGS
        send(hello).await;
        let heartbeats = data_every.map(|every| {
            let send = send.clone();
            tokio::spawn(async move {
                send(drain_call_headers()).await;
                loop {
                    tokio::time::sleep(every).await;
                    send(frame(0, 0, 1, &[0, 0, 0, 0, 0])).await; // DATA: an empty message
                }
            })
        });
        let mut seen = Seen::default();
        let read_frames = async {
            loop {
                let mut head = [0u8; 9];
                if rd.read_exact(&mut head).await.is_err() {
                    return;
                }
                let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                let (kind, flags) = (head[3], head[4]);
                let mut payload = vec![0u8; len];
                if rd.read_exact(&mut payload).await.is_err() {
                    return;
                }
                match (kind, flags & 1) {
                    (4, 0) => send(frame(4, 1, 0, &[])).await, // SETTINGS: ACK
                    (6, 0) => {
                        seen.pings.push(start.elapsed());
                        if answer {
                            send(frame(6, 1, 0, &payload)).await;
                        }
                    }
                    (7, _) => return, // GOAWAY
                    _ => {}
                }
            }
        };
        if tokio::time::timeout(window, read_frames).await.is_ok() {
            seen.closed = Some(start.elapsed());
        }
        if let Some(h) = heartbeats {
            h.abort();
        }
        seen
    }

    fn keepalive(interval: Duration, timeout: Duration) -> crate::config::Keepalive {
        crate::config::Keepalive {
            interval: Some(interval),
            timeout,
        }
    }

    #[tokio::test]
    async fn an_agent_that_answers_the_principals_pings_is_pinged_each_interval_and_kept() {
        let interval = Duration::from_millis(200);
        let addr = keepalive_server(keepalive(interval, Duration::from_millis(200))).await;
        let seen = watch_pings(addr, true, None, Duration::from_millis(1500)).await;
        assert_eq!(seen.closed, None, "{seen:?}");
        assert!(seen.pings.len() >= 3, "{seen:?}");
        assert!(seen.pings[0] >= interval, "{seen:?}");
    }

    #[tokio::test]
    async fn a_connection_that_leaves_the_principals_ping_unanswered_is_closed() {
        let (interval, timeout) = (Duration::from_millis(200), Duration::from_millis(300));
        let addr = keepalive_server(keepalive(interval, timeout)).await;
        let seen = watch_pings(addr, false, None, Duration::from_secs(5)).await;
        let first = *seen.pings.first().expect("a PING");
        let closed = seen.closed.expect("the connection closed");
        assert!(closed >= first + timeout, "{seen:?}");
        assert!(
            closed < first + timeout + Duration::from_secs(2),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn an_agent_whose_heartbeats_come_more_often_than_the_interval_is_not_pinged() {
        let interval = Duration::from_millis(400);
        let addr = keepalive_server(keepalive(interval, Duration::from_millis(200))).await;
        // Unanswered, a PING would also close the connection.
        let every = Some(Duration::from_millis(100));
        let seen = watch_pings(addr, false, every, Duration::from_millis(2000)).await;
        assert!(seen.pings.is_empty() && seen.closed.is_none(), "{seen:?}");
    }

    #[test]
    fn the_listener_gets_the_configured_caps_and_handshake_wait() {
        let config = PrincipalConfig {
            max_handshake_wait: Some(Duration::from_secs(3)),
            max_concurrent_handshakes: 17,
            max_handshakes_per_client: 5,
            max_connections: 99,
            max_connections_per_client: 7,
            ..PrincipalConfig::default()
        };
        let o = incoming_options(&config, Metrics::new(), readiness(true));
        assert_eq!(o.max_handshake_wait, Some(Duration::from_secs(3)));
        assert_eq!(
            (
                o.max_handshakes,
                o.max_handshakes_per_client,
                o.max_connections,
                o.max_connections_per_client
            ),
            (17, 5, 99, 7)
        );
        let off = incoming_options(&PrincipalConfig::default(), Metrics::new(), readiness(true));
        assert_eq!(off.max_handshake_wait, None);
    }

    #[test]
    fn a_busy_or_not_ready_refusal_is_a_closed_connection_not_an_auth_failure() {
        let metrics = Metrics::new();
        let o = incoming_options(
            &PrincipalConfig::default(),
            metrics.clone(),
            readiness(false),
        );
        let ready = o.ready.as_ref().expect("a readiness hook");
        assert!(!(ready.0)());
        let refused = o.on_refused.as_ref().expect("a refusal hook");
        (refused.0)("Busy");
        (refused.0)("NotReady");
        (refused.0)("HandshakeFailed");
        let text = metrics.encode();
        // A counter's value, by metric name and labels (the raw encoding ends in `_total`).
        let counted = |name: &str, labels: &str| {
            text.lines().any(|l| {
                l.starts_with(name) && l.contains(&format!("{{{labels}}} ")) && l.ends_with(" 1")
            })
        };
        let closed = "argocd_principal_listener_connections_closed_total";
        for reason in ["Busy", "NotReady"] {
            let labels = format!("listener=\"grpc\",reason=\"{reason}\"");
            assert!(
                counted(closed, &labels),
                "{reason} not counted as closed:\n{text}"
            );
        }
        let failed = "argocd_principal_auth_failures_total";
        assert!(counted(failed, "reason=\"HandshakeFailed\""), "{text}");
        assert!(!counted(
            closed,
            "listener=\"grpc\",reason=\"HandshakeFailed\""
        ));
    }
}
