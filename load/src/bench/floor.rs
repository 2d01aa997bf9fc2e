//! The raw floor of the throughput scenario: a minimal tonic bidirectional stream over the
//! same TLS 1.3 mTLS (same SVIDs, same verifier) carrying the same CloudEvent bytes, with
//! nothing else: no hub, no queue, no acknowledgements, no Kubernetes writes. What the
//! principal reaches is reported as a fraction of this.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use argocd_agent_identity::source::SvidSource;
use argocd_agent_identity::svid::SvidState;
use argocd_agent_identity::tls::PeerPolicy;
use argocd_agent_identity::transport::ChannelOptions;
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::eventstream::event_stream_client::EventStreamClient;
use argocd_agent_proto::eventstream::event_stream_server::{EventStream, EventStreamServer};
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use argocd_agent_testkit::harness::HarnessError;

/// Type of the first message: the client uploads, the server counts.
const UPLOAD: &str = "bench.floor.upload";
/// Type of the first message: the server sends `id` (a count) copies of the payload.
const DOWNLOAD: &str = "bench.floor.download";
/// Type of the first message: the stream stays open and idle until the client ends it.
const IDLE: &str = "bench.floor.idle";

/// A connected floor client.
pub type Client = EventStreamClient<tonic::transport::Channel>;

struct FloorService {
    payload: CloudEvent,
}

type Out = Pin<Box<dyn Stream<Item = Result<CloudEvent, Status>> + Send>>;

#[tonic::async_trait]
impl EventStream for FloorService {
    type SubscribeStream = Out;

    async fn subscribe(
        &self,
        request: Request<Streaming<CloudEvent>>,
    ) -> Result<Response<Out>, Status> {
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty stream"))?;
        let (tx, rx) = mpsc::channel(64);
        match first.r#type.as_str() {
            UPLOAD => {
                tokio::spawn(async move {
                    let mut n: u64 = 0;
                    while let Ok(Some(_)) = inbound.message().await {
                        n += 1;
                    }
                    let _ = tx
                        .send(Ok(CloudEvent {
                            id: n.to_string(),
                            ..CloudEvent::default()
                        }))
                        .await;
                });
            }
            DOWNLOAD => {
                let count: u64 = first.id.parse().unwrap_or(0);
                let payload = self.payload.clone();
                tokio::spawn(async move {
                    for _ in 0..count {
                        if tx.send(Ok(payload.clone())).await.is_err() {
                            return;
                        }
                    }
                });
            }
            IDLE => {
                // Reads (nothing, until the client ends the stream); `tx` keeps the answer
                // stream open meanwhile.
                tokio::spawn(async move {
                    while let Ok(Some(_)) = inbound.message().await {}
                    drop(tx);
                });
            }
            other => return Err(Status::invalid_argument(format!("unknown mode {other}"))),
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// A floor server on loopback.
pub struct Floor {
    /// Where it listens (127.0.0.1, a free port).
    pub addr: std::net::SocketAddr,
    _source: SvidSource,
    shutdown: tokio_util::sync::CancellationToken,
}

impl Floor {
    /// Serves with `svid` (the principal's identity in the bench), sending `payload` on
    /// downloads.
    pub async fn start(svid: Arc<SvidState>, payload: CloudEvent) -> Result<Floor, HarnessError> {
        let (_tx, rx) = tokio::sync::watch::channel(Some(svid));
        // The sender is dropped: the source keeps the last value.
        let source = SvidSource::from_receiver(rx);
        let tls = argocd_agent_identity::tls::server_config(&source, PeerPolicy::Any)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        // Connections in their handshake stop with the floor. Every simulated client dials
        // from 127.0.0.1: one address may hold every handshake slot (the principal in the
        // bench is started with the same allowance).
        let options = argocd_agent_listener::IncomingOptions {
            max_handshakes_per_client: argocd_agent_listener::DEFAULT_MAX_CONCURRENT_HANDSHAKES,
            max_connections_per_client: argocd_agent_listener::DEFAULT_MAX_CONNECTIONS,
            ..Default::default()
        };
        let incoming = argocd_agent_identity::transport::tls_incoming_with_options(
            listener,
            tls,
            options,
            &tokio_util::task::TaskTracker::new(),
            shutdown.clone(),
        );
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(
                    EventStreamServer::new(FloorService { payload })
                        .max_decoding_message_size(16 << 20)
                        .max_encoding_message_size(16 << 20),
                )
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await;
        });
        Ok(Floor {
            addr,
            _source: source,
            shutdown,
        })
    }

    /// Serves from the SVID of the Workload API at `endpoint` (the bench's `principal.sock`,
    /// so the same identity as the principal), on 127.0.0.1, in this process until it is
    /// killed; prints `listening <addr>` once it accepts. This is the floor process of
    /// [`idle_floor`]: its RSS is the floor's alone.
    pub async fn serve_standalone(endpoint: String) -> Result<(), HarnessError> {
        let source = SvidSource::workload_api(Some(endpoint)).await?;
        let svid = source.wait_ready(Duration::from_secs(30)).await?;
        let floor = Floor::start(svid, CloudEvent::default()).await?;
        println!("listening {}", floor.addr);
        std::future::pending::<()>().await;
        Ok(())
    }

    /// Connects one client per TLS configuration (one connection each, handshakes done
    /// before any timing starts).
    pub async fn connect(
        &self,
        clients: &[Arc<rustls::ClientConfig>],
    ) -> Result<Vec<Client>, HarnessError> {
        let mut out = Vec::with_capacity(clients.len());
        for tls in clients {
            out.push(self.client(tls.clone()).await?);
        }
        Ok(out)
    }

    /// Each client uploads `per_client` copies of `payload`; returns events per second over
    /// all.
    pub async fn upload(
        &self,
        clients: &[Client],
        per_client: u64,
        payload: &CloudEvent,
    ) -> Result<f64, HarnessError> {
        let started = Instant::now();
        let mut handles = Vec::new();
        for client in clients {
            let mut client = client.clone();
            let payload = payload.clone();
            handles.push(tokio::spawn(async move {
                let first = CloudEvent {
                    r#type: UPLOAD.into(),
                    ..CloudEvent::default()
                };
                let stream = tokio_stream::once(first).chain(tokio_stream::iter(
                    (0..per_client).map(move |_| payload.clone()),
                ));
                let mut answer = client.subscribe(stream).await?.into_inner();
                let done = answer.message().await?.ok_or("no count from the floor")?;
                let n: u64 = done.id.parse()?;
                Ok::<u64, HarnessError>(n)
            }));
        }
        let mut total = 0;
        for h in handles {
            total += h.await??;
        }
        Ok(total as f64 / started.elapsed().as_secs_f64())
    }

    /// Each client downloads `per_client` events; returns events per second over all.
    pub async fn download(&self, clients: &[Client], per_client: u64) -> Result<f64, HarnessError> {
        let started = Instant::now();
        let mut handles = Vec::new();
        for client in clients {
            let mut client = client.clone();
            handles.push(tokio::spawn(async move {
                let first = CloudEvent {
                    r#type: DOWNLOAD.into(),
                    id: per_client.to_string(),
                    ..CloudEvent::default()
                };
                // Keep the request stream open while receiving (as the agent does).
                let (tx, rx) = mpsc::channel(1);
                tx.send(first).await.map_err(|_| "closed")?;
                let mut inbound = client
                    .subscribe(ReceiverStream::new(rx))
                    .await?
                    .into_inner();
                let mut n: u64 = 0;
                while n < per_client {
                    if inbound.message().await?.is_none() {
                        break;
                    }
                    n += 1;
                }
                drop(tx);
                Ok::<u64, HarnessError>(n)
            }));
        }
        let mut total = 0;
        for h in handles {
            total += h.await??;
        }
        Ok(total as f64 / started.elapsed().as_secs_f64())
    }

    async fn client(&self, tls: Arc<rustls::ClientConfig>) -> Result<Client, HarnessError> {
        client_to(self.addr, tls).await
    }
}

/// What idle streams cost a bare tonic server.
#[derive(Debug, Clone, Copy)]
pub struct IdleFloor {
    /// The floor process's RSS growth over the connections it holds, per connection.
    pub bytes_per_conn: u64,
}

/// The idle-memory floor: starts `argocd-agent-dev bench floor-server` as its own process
/// (identity from the bench's `principal.sock` in `dir`), opens one connection and one idle
/// bidirectional stream per TLS configuration (the simulated agents' SVIDs, the agent's
/// keepalive), lets them settle and reads the process's RSS growth.
pub async fn idle_floor(
    dir: &std::path::Path,
    clients: &[Arc<rustls::ClientConfig>],
    settle: Duration,
) -> Result<IdleFloor, HarnessError> {
    use tokio::io::AsyncBufReadExt;
    let program = argocd_agent_testkit::harness::binary("argocd-agent-dev")?;
    let mut child = tokio::process::Command::new(program)
        .args(["bench", "floor-server", "--dir"])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().ok_or("floor server exited at once")?;
    let stdout = child
        .stdout
        .take()
        .ok_or("no stdout from the floor server")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| "floor server did not start in 30 s")??
        .ok_or("floor server exited before listening")?;
    let addr: std::net::SocketAddr = line
        .strip_prefix("listening ")
        .ok_or_else(|| format!("floor server said {line:?}"))?
        .parse()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = super::env::ProcSample::read(pid)?.rss;
    let mut streams = Vec::with_capacity(clients.len());
    for chunk in clients.chunks(64) {
        let opened =
            futures::future::join_all(chunk.iter().map(|tls| hold_idle(addr, tls.clone()))).await;
        for s in opened {
            streams.push(s?);
        }
    }
    tokio::time::sleep(settle).await;
    let after = super::env::ProcSample::read(pid)?.rss;
    drop(streams);
    let _ = child.kill().await;
    Ok(IdleFloor {
        bytes_per_conn: after.saturating_sub(before) / clients.len().max(1) as u64,
    })
}

/// A floor client on its own connection, with the agent's keepalive.
async fn client_to(
    addr: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> Result<Client, HarnessError> {
    let channel = argocd_agent_identity::transport::connect(
        &addr.to_string(),
        tls,
        "localhost",
        ChannelOptions {
            keepalive_interval: Duration::from_secs(30),
            ..ChannelOptions::default()
        },
    )
    .await?;
    Ok(EventStreamClient::new(channel)
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(16 << 20))
}

/// One connection with one open, idle stream; both end when the value is dropped.
async fn hold_idle(
    addr: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> Result<(mpsc::Sender<CloudEvent>, Streaming<CloudEvent>), HarnessError> {
    let mut client = client_to(addr, tls).await?;
    let (tx, rx) = mpsc::channel(1);
    tx.send(CloudEvent {
        r#type: IDLE.into(),
        ..CloudEvent::default()
    })
    .await
    .map_err(|_| "closed")?;
    let inbound = client
        .subscribe(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((tx, inbound))
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
