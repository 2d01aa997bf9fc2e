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
        let incoming = argocd_agent_identity::transport::tls_incoming(listener, tls);
        let shutdown = tokio_util::sync::CancellationToken::new();
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
        let channel = argocd_agent_identity::transport::connect(
            &self.addr.to_string(),
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
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
