//! Shared helpers for the identity integration tests: a development Workload API server in a
//! temp dir, and a tonic server (Version + an echoing EventStream) behind our rustls config.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use argocd_agent_identity::source::WorkloadApiOptions;
use argocd_agent_identity::tls::{PeerPolicy, client_config, server_config};
use argocd_agent_identity::transport::{ChannelOptions, connect, tls_incoming};
use argocd_agent_identity::transport::{peer_spiffe_id, verified_peer};
use argocd_agent_identity::{SpiffeId, SvidSource, TrustDomain};
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::eventstream::event_stream_server::{EventStream, EventStreamServer};
use argocd_agent_proto::version::version_server::{Version, VersionServer};
use argocd_agent_proto::version::{VersionRequest, VersionResponse};
use argocd_agent_testkit::workload_api::{DevWorkloadApi, DevWorkloadApiHandle};
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

pub const PRINCIPAL: &str = "spiffe://example.org/ns/argocd/sa/principal";
pub const AGENT: &str = "spiffe://example.org/ns/argocd/sa/agent";

pub fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).expect("test SPIFFE ID")
}

pub fn td(s: &str) -> TrustDomain {
    TrustDomain::new(s).expect("test trust domain")
}

/// A dev Workload API in `dir` serving PRINCIPAL on principal.sock and AGENT on agent.sock.
pub async fn dev_server(dir: &Path) -> DevWorkloadApiHandle {
    dev_builder(dir).serve().await.expect("dev server starts")
}

pub fn dev_builder(dir: &Path) -> DevWorkloadApi {
    DevWorkloadApi::builder(dir.join("ca"), td("example.org"))
        .socket(dir.join("principal.sock"), id(PRINCIPAL))
        .socket(dir.join("agent.sock"), id(AGENT))
}

pub fn endpoint(dir: &Path, name: &str) -> String {
    format!("unix://{}", dir.join(format!("{name}.sock")).display())
}

pub async fn source(dir: &Path, name: &str) -> SvidSource {
    SvidSource::workload_api_with(WorkloadApiOptions {
        endpoint: Some(endpoint(dir, name)),
        initial_timeout: Duration::from_secs(5),
        min_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(300),
    })
    .await
    .expect("source gets an SVID")
}

/// What the server saw of a client certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenPeer {
    pub spiffe_id: String,
    pub serial: String,
    pub not_after: i64,
}

pub fn leaf_facts(der: &[u8]) -> (String, i64) {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("parsable leaf");
    (
        cert.raw_serial_as_string(),
        cert.validity().not_after.timestamp(),
    )
}

#[derive(Clone, Default)]
pub struct TestService {
    pub seen: Arc<Mutex<Vec<SeenPeer>>>,
}

impl TestService {
    fn record<T>(&self, request: &Request<T>) -> Result<String, Status> {
        let id = peer_spiffe_id(request).map_err(|e| Status::unauthenticated(e.to_string()))?;
        let peer = verified_peer(request).ok_or_else(|| Status::unauthenticated("no peer"))?;
        let not_after = peer
            .not_after
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs() as i64);
        self.seen.lock().unwrap().push(SeenPeer {
            spiffe_id: id.as_str().to_string(),
            serial: peer.serial.clone(),
            not_after,
        });
        Ok(id.as_str().to_string())
    }
}

#[tonic::async_trait]
impl Version for TestService {
    async fn version(
        &self,
        request: Request<VersionRequest>,
    ) -> Result<Response<VersionResponse>, Status> {
        let id = self.record(&request)?;
        Ok(Response::new(VersionResponse {
            version: id,
            protocol_min: 1,
            protocol_max: 1,
        }))
    }
}

type EventResult = Result<CloudEvent, Status>;

#[tonic::async_trait]
impl EventStream for TestService {
    type SubscribeStream = Pin<Box<dyn Stream<Item = EventResult> + Send + 'static>>;

    async fn subscribe(
        &self,
        request: Request<Streaming<CloudEvent>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        self.record(&request)?;
        let inbound = request.into_inner();
        // Echo every event back.
        Ok(Response::new(Box::pin(inbound.map(|e| e))))
    }
}

pub struct RunningServer {
    pub addr: SocketAddr,
    pub service: TestService,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RunningServer {
    pub fn seen(&self) -> Vec<SeenPeer> {
        self.service.seen.lock().unwrap().clone()
    }
}

pub async fn serve(source: &SvidSource, policy: PeerPolicy) -> RunningServer {
    let config = server_config(source, policy).expect("server config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let service = TestService::default();
    let router = tonic::transport::Server::builder()
        .add_service(VersionServer::new(service.clone()))
        .add_service(EventStreamServer::new(service.clone()));
    let task = tokio::spawn(async move {
        let _ = router
            .serve_with_incoming(tls_incoming(
                listener,
                config,
                &tokio_util::task::TaskTracker::new(),
                tokio_util::sync::CancellationToken::new(),
            ))
            .await;
    });
    RunningServer {
        addr,
        service,
        task,
    }
}

/// Dials the test server over SVID mTLS (a refusal may only surface at the first RPC).
pub async fn dial(
    addr: SocketAddr,
    source: &SvidSource,
    pinned: PeerPolicy,
) -> Result<tonic::transport::Channel, String> {
    let config = client_config(source, pinned).map_err(|e| e.to_string())?;
    connect(
        &addr.to_string(),
        config,
        "principal.argocd.svc",
        ChannelOptions {
            connect_timeout: Duration::from_secs(2),
            ..ChannelOptions::default()
        },
    )
    .await
    .map_err(|e| e.to_string())
}

pub async fn channel(
    addr: SocketAddr,
    source: &SvidSource,
    pinned: PeerPolicy,
) -> tonic::transport::Channel {
    dial(addr, source, pinned).await.expect("TCP + TLS connect")
}

/// One Version RPC (where TLS 1.3 client-certificate refusals surface).
pub async fn version(channel: tonic::transport::Channel) -> Result<VersionResponse, Status> {
    let mut client = argocd_agent_proto::version::version_client::VersionClient::new(channel);
    tokio::time::timeout(Duration::from_secs(5), client.version(VersionRequest {}))
        .await
        .map_err(|_| Status::deadline_exceeded("test timeout"))?
        .map(|r| r.into_inner())
}

/// Dials and calls Version; a refusal anywhere (handshake or first RPC) is an `Err`.
pub async fn try_version(
    addr: SocketAddr,
    source: &SvidSource,
    pinned: PeerPolicy,
) -> Result<VersionResponse, String> {
    let channel = dial(addr, source, pinned).await?;
    version(channel).await.map_err(|e| e.to_string())
}

pub fn event(n: u32) -> CloudEvent {
    CloudEvent {
        id: format!("ev-{n}"),
        source: "test".into(),
        spec_version: "1.0".into(),
        r#type: "io.argoproj.argocd-agent.event.ping".into(),
        ..Default::default()
    }
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}
