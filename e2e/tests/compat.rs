//! Protocol compatibility across one release, both ways (issue 15, item 6):
//!
//! - an agent of the previous protocol version (hand-driven here: `protocol_version =
//!   PROTOCOL_MIN`, no capabilities, no resync state, baseline payloads: status updates
//!   without the `source-uid` annotation) keeps syncing against this principal, managed and
//!   autonomous;
//! - this agent (the real `argocd-agent agent` process) keeps syncing against an older
//!   principal (a fake one in the test, over the same SVID mTLS): a welcome with no
//!   capabilities and no `max_in_flight`, `terminate-operation` with the old payload
//!   `{"operation": ...}`, and error replies with reasons this agent does not know.
//!
//! See "Protocol compatibility" in docs/reliability.md.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_domain::Namespace;
use argocd_agent_domain::event::{PROTOCOL_MIN, PROTOCOL_VERSION};
use argocd_agent_domain::{Event, EventType, Payload, ResourceKind, ResourceRef};
use argocd_agent_identity::SpiffeId;
use argocd_agent_identity::source::SvidSource;
use argocd_agent_identity::tls::PeerPolicy;
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::eventstream::event_stream_client::EventStreamClient;
use argocd_agent_proto::eventstream::event_stream_server::{EventStream, EventStreamServer};
use argocd_agent_proto::eventstream::{AgentMode, Hello, Welcome};
use argocd_agent_testkit::harness::*;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

const T: Duration = Duration::from_secs(20);

/// Source of the hand-driven baseline agent's events.
const OLD_AGENT: &str = "baseline-agent";
/// Source of the fake older principal's events.
const OLD_PRINCIPAL: &str = "baseline-principal";

type Tx = mpsc::Sender<CloudEvent>;

fn app_ref(ns: &str, name: &str) -> ResourceRef {
    ResourceRef::new(
        ResourceKind::Application,
        Namespace::new(ns).expect("valid namespace"),
        name,
    )
}

/// The hello of a previous-version agent: the oldest protocol version this build accepts,
/// no capabilities, no resync state.
fn baseline_hello(mode: AgentMode) -> Event {
    Event::new(
        OLD_AGENT,
        EventType::Hello,
        Payload::Hello(Hello {
            mode: mode as i32,
            version: "0.0.0-baseline".into(),
            protocol_version: PROTOCOL_MIN,
            capabilities: vec![],
            state: None,
        }),
    )
}

/// Dials the principal as a baseline agent; returns the stream and the principal's welcome.
async fn open_baseline(
    source: &SvidSource,
    addr: std::net::SocketAddr,
    mode: AgentMode,
) -> Result<(Tx, Streaming<CloudEvent>, Welcome), HarnessError> {
    let channel = dial_principal(source, addr).await?;
    let (tx, rx) = mpsc::channel(64);
    tx.send(baseline_hello(mode).to_cloud_event()).await?;
    let mut inbound = EventStreamClient::new(channel)
        .subscribe(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let first = tokio::time::timeout(T, inbound.message())
        .await??
        .ok_or("stream closed before welcome")?;
    let event = Event::from_cloud_event(first)?;
    match event.payload {
        Payload::Welcome(w) => Ok((tx, inbound, w)),
        other => Err(format!("expected a welcome, got {} {other:?}", event.ty).into()),
    }
}

/// Reads the principal's events until one matches `want`, acknowledging every resource
/// event on the way (as a baseline spoke that applied it); returns the match.
async fn receive(
    tx: &Tx,
    inbound: &mut Streaming<CloudEvent>,
    what: &str,
    want: impl Fn(&Event) -> bool,
) -> Result<Event, HarnessError> {
    let deadline = tokio::time::Instant::now() + T;
    let mut seen = Vec::new();
    loop {
        let msg = match tokio::time::timeout_at(deadline, inbound.message()).await {
            Ok(m) => m?.ok_or("stream closed")?,
            Err(_) => return Err(format!("timed out waiting for {what}; saw {seen:?}").into()),
        };
        let e = Event::from_cloud_event(msg)?;
        if e.resource.is_some()
            && matches!(
                e.ty,
                EventType::Create
                    | EventType::SpecUpdate
                    | EventType::Delete
                    | EventType::SetOperation
                    | EventType::TerminateOperation
            )
        {
            tx.send(e.ack(OLD_AGENT).to_cloud_event()).await?;
        }
        if want(&e) {
            return Ok(e);
        }
        seen.push(format!(
            "{} {:?}",
            e.ty,
            e.resource.as_ref().map(|r| &r.name)
        ));
    }
}

/// Sends `event` and waits for the principal's answer to it, which must be `processed`.
async fn send_acked(
    tx: &Tx,
    inbound: &mut Streaming<CloudEvent>,
    event: &Event,
) -> Result<(), HarnessError> {
    tx.send(event.to_cloud_event()).await?;
    let id = event.id.clone();
    let answer = receive(tx, inbound, &format!("the answer to {}", event.ty), |e| {
        e.ack_id.as_deref() == Some(id.as_str())
    })
    .await?;
    match answer.ty {
        EventType::Processed => Ok(()),
        _ => Err(format!("{} was answered {:?}", event.ty, answer.payload).into()),
    }
}

fn path_of(e: &Event) -> Option<String> {
    e.object()?
        .pointer("/spec/source/path")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_version_managed_agent_keeps_syncing() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![]),
        ..Default::default()
    })
    .await
    .expect("topology starts");
    let result = async {
        let source = topo.svid_source("managed.sock").await?;
        let (tx, mut inbound, welcome) =
            open_baseline(&source, topo.principal_addr, AgentMode::Managed).await?;
        assert_eq!(welcome.namespace, MANAGED);
        assert!(
            (PROTOCOL_MIN..=PROTOCOL_VERSION).contains(&welcome.protocol_version),
            "{welcome:?}"
        );
        assert!(
            welcome.capabilities.is_empty(),
            "nothing asked, nothing granted: {welcome:?}"
        );
        let hub = apps(&topo.hub, MANAGED)?;
        let name = "compat-managed";

        // Create on the hub -> the object, as an upsert (this principal, like the previous
        // one, sends hub objects as spec-update, which an agent applies as create-or-update).
        hub.create(
            &PostParams::default(),
            &sample_app(name, MANAGED, "guestbook"),
        )
        .await?;
        let created = receive(&tx, &mut inbound, "the create", |e| {
            matches!(e.ty, EventType::Create | EventType::SpecUpdate)
                && e.resource.as_ref().is_some_and(|r| r.name == name)
        })
        .await?;
        assert_eq!(path_of(&created).as_deref(), Some("guestbook"));
        assert_eq!(
            created.resource.as_ref().map(|r| r.namespace.to_string()),
            Some(MANAGED.to_string())
        );

        // Edit on the hub -> a spec-update with the new spec.
        merge_patch(
            &hub,
            name,
            json!({"spec": {"source": {"path": "kustomize-guestbook"}}}),
        )
        .await?;
        let updated = receive(&tx, &mut inbound, "the spec-update", |e| {
            e.ty == EventType::SpecUpdate
                && e.resource.as_ref().is_some_and(|r| r.name == name)
                && path_of(e).as_deref() == Some("kustomize-guestbook")
        })
        .await?;
        assert!(updated.ack_id.is_none());

        // A baseline status-update: no source-uid annotation. Written to the hub as before.
        let status = Event::resource(
            OLD_AGENT,
            EventType::StatusUpdate,
            app_ref(MANAGED, name),
            Payload::Object(Arc::new(json!({
                "metadata": {"name": name},
                "status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}
            }))),
        );
        send_acked(&tx, &mut inbound, &status).await?;
        eventually("the baseline status on the hub", T, || async {
            let app = stored_app(&topo.hub, MANAGED, name)?;
            (app.pointer("/status/sync/status") == Some(&json!("Synced"))
                && app.pointer("/status/health/status") == Some(&json!("Healthy")))
            .then_some(())
        })
        .await?;

        // A sync requested on the hub -> a set-operation carrying the operation.
        merge_patch(
            &hub,
            name,
            json!({"operation": {"sync": {"revision": "compat-rev"}, "initiatedBy": {"username": "compat"}}}),
        )
        .await?;
        let op = receive(&tx, &mut inbound, "the set-operation", |e| {
            e.ty == EventType::SetOperation && e.resource.as_ref().is_some_and(|r| r.name == name)
        })
        .await?;
        assert_eq!(
            op.object()
                .and_then(|o| o.pointer("/operation/sync/revision").cloned()),
            Some(json!("compat-rev")),
            "{op:?}"
        );

        // `argocd app terminate-op` on the hub -> a terminate-operation (now without payload;
        // the previous agent never read the payload of this event, only its resource).
        set_status(
            &hub,
            name,
            json!({"operationState": {"phase": "Terminating"}}),
        )
        .await?;
        receive(&tx, &mut inbound, "the terminate-operation", |e| {
            e.ty == EventType::TerminateOperation
                && e.resource.as_ref().is_some_and(|r| r.name == name)
        })
        .await?;

        // Delete on the hub -> a delete event; acknowledged, the hub object goes.
        hub.delete(name, &DeleteParams::default()).await?;
        receive(&tx, &mut inbound, "the delete", |e| {
            e.ty == EventType::Delete && e.resource.as_ref().is_some_and(|r| r.name == name)
        })
        .await?;
        eventually("the hub Application gone", T, || async {
            stored_app(&topo.hub, MANAGED, name).is_none().then_some(())
        })
        .await?;
        // The session stayed up throughout: one connection, no refusal.
        assert_eq!(topo.connect_count(MANAGED), 1);
        Ok::<_, HarnessError>(())
    }
    .await;
    let logs = topo.logs();
    topo.stop().await;
    result.unwrap_or_else(|e| panic!("{e}\n{logs}"));
}

/// A baseline autonomous agent's Application: the whole object, no source-uid annotation.
fn baseline_app(name: &str, path: &str) -> Payload {
    let mut obj = serde_json::to_value(sample_app(name, AUTONOMOUS, path)).expect("serializes");
    obj["metadata"]["namespace"] = json!(AUTONOMOUS);
    Payload::Object(Arc::new(obj))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_version_autonomous_agent_keeps_syncing() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![]),
        ..Default::default()
    })
    .await
    .expect("topology starts");
    let result = async {
        let source = topo.svid_source("autonomous.sock").await?;
        let (tx, mut inbound, welcome) =
            open_baseline(&source, topo.principal_addr, AgentMode::Autonomous).await?;
        assert_eq!(welcome.namespace, AUTONOMOUS);
        assert!(welcome.capabilities.is_empty(), "{welcome:?}");
        let name = "compat-autonomous";
        let path_on_hub = |want: &'static str| {
            let hub = &topo.hub;
            move || async move {
                let app = stored_app(hub, AUTONOMOUS, name)?;
                (app.pointer("/spec/source/path") == Some(&json!(want))).then_some(())
            }
        };

        let create = Event::resource(
            OLD_AGENT,
            EventType::Create,
            app_ref(AUTONOMOUS, name),
            baseline_app(name, "guestbook"),
        );
        send_acked(&tx, &mut inbound, &create).await?;
        eventually("the create on the hub", T, path_on_hub("guestbook")).await?;

        let update = Event::resource(
            OLD_AGENT,
            EventType::SpecUpdate,
            app_ref(AUTONOMOUS, name),
            baseline_app(name, "helm-guestbook"),
        );
        send_acked(&tx, &mut inbound, &update).await?;
        eventually(
            "the spec-update on the hub",
            T,
            path_on_hub("helm-guestbook"),
        )
        .await?;

        // Reconnect, again without resync state: that means "unknown", not "holds
        // nothing": the principal keeps the hub copy (the same object, not deleted and
        // recreated). The principal answers events only after its resync, so a pong proves
        // the resync is over.
        let uid = stored_app(&topo.hub, AUTONOMOUS, name)
            .and_then(|a| a.pointer("/metadata/uid").cloned())
            .ok_or("the hub copy has no uid")?;
        drop((tx, inbound));
        let (tx, mut inbound, _) =
            open_baseline(&source, topo.principal_addr, AgentMode::Autonomous).await?;
        tx.send(Event::new(OLD_AGENT, EventType::Ping, Payload::None).to_cloud_event())
            .await?;
        receive(&tx, &mut inbound, "a pong", |e| e.ty == EventType::Pong).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = stored_app(&topo.hub, AUTONOMOUS, name);
        assert_eq!(
            after
                .as_ref()
                .and_then(|a| a.pointer("/metadata/uid").cloned()),
            Some(uid),
            "the hub copy was deleted on a reconnect without resync state: {after:?}"
        );
        assert!(
            after
                .as_ref()
                .and_then(|a| a.pointer("/metadata/deletionTimestamp"))
                .is_none(),
            "the hub copy is being deleted: {after:?}"
        );

        let delete = Event::resource(
            OLD_AGENT,
            EventType::Delete,
            app_ref(AUTONOMOUS, name),
            Payload::None,
        );
        send_acked(&tx, &mut inbound, &delete).await?;
        eventually("the delete on the hub", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, name)
                .is_none()
                .then_some(())
        })
        .await?;
        assert_eq!(topo.connect_count(AUTONOMOUS), 2);
        Ok::<_, HarnessError>(())
    }
    .await;
    let logs = topo.logs();
    topo.stop().await;
    result.unwrap_or_else(|e| panic!("{e}\n{logs}"));
}

/// One agent session at the fake older principal: the agent's hello, its events, and the
/// sender of the principal's events.
struct OldSession {
    hello: Hello,
    from_agent: Streaming<CloudEvent>,
    to_agent: mpsc::Sender<Result<CloudEvent, Status>>,
}

/// A principal of the previous release, as far as the wire shows: it answers any hello with
/// a baseline welcome (no capabilities, no `max_in_flight`) and hands the session to the test.
struct OldPrincipal {
    sessions: mpsc::UnboundedSender<OldSession>,
}

type Out = Pin<Box<dyn futures::Stream<Item = Result<CloudEvent, Status>> + Send>>;

#[tonic::async_trait]
impl EventStream for OldPrincipal {
    type SubscribeStream = Out;

    async fn subscribe(
        &self,
        request: Request<Streaming<CloudEvent>>,
    ) -> Result<Response<Out>, Status> {
        let mut from_agent = request.into_inner();
        let first = from_agent
            .message()
            .await?
            .ok_or_else(|| Status::cancelled("no hello"))?;
        let hello = match Event::from_cloud_event(first) {
            Ok(Event {
                payload: Payload::Hello(h),
                ..
            }) => h,
            _ => {
                return Err(Status::failed_precondition(
                    "the first event must be a hello",
                ));
            }
        };
        // The previous release's range: it spoke (and accepted) PROTOCOL_MIN at most. A
        // build that raises its own version without a fallback fails here.
        if hello.protocol_version != PROTOCOL_MIN {
            return Err(Status::failed_precondition(format!(
                "agent speaks protocol {}, this principal accepts {PROTOCOL_MIN}..={PROTOCOL_MIN}",
                hello.protocol_version
            )));
        }
        let (to_agent, rx) = mpsc::channel(64);
        let welcome = Event::new(
            OLD_PRINCIPAL,
            EventType::Welcome,
            Payload::Welcome(Welcome {
                version: "0.0.0-baseline".into(),
                protocol_version: PROTOCOL_MIN,
                agent_name: MANAGED.into(),
                namespace: MANAGED.into(),
                capabilities: vec![],
                max_in_flight: 0,
                ..Default::default()
            }),
        );
        to_agent
            .send(Ok(welcome.to_cloud_event()))
            .await
            .map_err(|_| Status::internal("closed"))?;
        self.sessions
            .send(OldSession {
                hello,
                from_agent,
                to_agent,
            })
            .map_err(|_| Status::unavailable("test over"))?;
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

impl OldSession {
    async fn send(&self, e: &Event) -> Result<(), HarnessError> {
        self.to_agent
            .send(Ok(e.to_cloud_event()))
            .await
            .map_err(|_| "the agent's stream closed".into())
    }

    /// The agent's next event matching `want`, within `within`; `None` when none came.
    /// Resource events on the way are acknowledged (as the older principal does), pings and
    /// cache reports skipped.
    async fn next_matching(
        &mut self,
        within: Duration,
        want: impl Fn(&Event) -> bool,
    ) -> Result<Option<Event>, HarnessError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let msg = match tokio::time::timeout_at(deadline, self.from_agent.message()).await {
                Ok(m) => m?.ok_or("the agent closed its stream")?,
                Err(_) => return Ok(None),
            };
            let e = Event::from_cloud_event(msg)?;
            if want(&e) {
                return Ok(Some(e));
            }
            if e.resource.is_some() && !matches!(e.ty, EventType::Processed | EventType::Error) {
                self.send(&e.ack(OLD_PRINCIPAL)).await?;
            }
        }
    }

    /// The agent's answer (processed or error) to the event with `id`.
    async fn answer_to(&mut self, id: &str) -> Result<Event, HarnessError> {
        self.next_matching(T, |e| e.ack_id.as_deref() == Some(id))
            .await?
            .ok_or_else(|| format!("no answer to {id} within {T:?}").into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_agent_keeps_syncing_against_a_previous_version_principal() {
    // The topology gives the Workload API (SVIDs for the principal's and the agent's
    // identity) and the spoke; its own principal and agents are not used.
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![]),
        ..Default::default()
    })
    .await
    .expect("topology starts");

    let principal_svid = topo
        .svid_source("principal.sock")
        .await
        .expect("principal SVID");
    let tls = argocd_agent_identity::tls::server_config(
        &principal_svid,
        PeerPolicy::Exact(SpiffeId::parse(&agent_id(MANAGED)).expect("valid id")),
    )
    .expect("server TLS");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (sessions_tx, mut sessions) = mpsc::unbounded_channel();
    let stop = tokio_util::sync::CancellationToken::new();
    let incoming = argocd_agent_identity::transport::tls_incoming(
        listener,
        tls,
        &tokio_util::task::TaskTracker::new(),
        stop.clone(),
    );
    let server = tokio::spawn({
        let stop = stop.clone();
        async move {
            let _ = tonic::transport::Server::builder()
                .add_service(EventStreamServer::new(OldPrincipal {
                    sessions: sessions_tx,
                }))
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await;
        }
    });

    let metrics_port = argocd_agent_testkit::envoy::free_loopback_port().expect("port");
    let mut agent = Proc::new(
        MANAGED,
        binary("argocd-agent").expect("argocd-agent built"),
        vec![
            "agent".into(),
            "--agent-mode".into(),
            "managed".into(),
            "--server-address".into(),
            "127.0.0.1".into(),
            "--server-port".into(),
            addr.port().to_string(),
            "--principal-spiffe-id".into(),
            PRINCIPAL_ID.into(),
            "--spiffe-endpoint-socket".into(),
            topo.spiffe.endpoint(&topo.dir.join("managed.sock")),
            "--kubeconfig".into(),
            topo.dir.join("managed.kubeconfig").display().to_string(),
            "--namespace".into(),
            SPOKE_NS.into(),
            "--metrics-host".into(),
            "127.0.0.1".into(),
            "--metrics-port".into(),
            metrics_port.to_string(),
            "--keep-alive-ping-interval".into(),
            "5s".into(),
            "--creds".into(),
            "spiffe".into(),
        ],
        topo.dir.join("agent-vs-old-principal.log"),
    );
    agent.start().expect("agent starts");

    let result = async {
        let mut s = tokio::time::timeout(T, sessions.recv())
            .await
            .map_err(|_| "the agent did not connect to the older principal")?
            .ok_or("server stopped")?;
        // Admitted (the fake checks the previous release's range); the agent offers its
        // capabilities, which the older principal did not grant.
        assert_eq!(s.hello.protocol_version, PROTOCOL_MIN, "{:?}", s.hello);
        assert!(
            s.hello.capabilities.iter().any(|c| c == "resync.v1"),
            "{:?}",
            s.hello
        );
        let spoke = apps(&topo.managed_spoke, SPOKE_NS)?;
        let name = "compat-from-old-principal";

        // 1. A create as an older principal sends it (the hub object, no source-uid
        //    annotation): created on the spoke, acknowledged.
        let create = Event::resource(
            OLD_PRINCIPAL,
            EventType::Create,
            app_ref(MANAGED, name),
            Payload::Object(Arc::new(
                serde_json::to_value(sample_app(name, MANAGED, "guestbook"))
                    .expect("serializes"),
            )),
        );
        s.send(&create).await?;
        let ack = s.answer_to(&create.id).await?;
        assert_eq!(ack.ty, EventType::Processed, "create answered {ack:?}");
        let local = stored_app(&topo.managed_spoke, SPOKE_NS, name)
            .ok_or("the create did not reach the spoke")?;
        assert_eq!(local.pointer("/spec/source/path"), Some(&json!("guestbook")));

        // 2. An operation runs on the spoke; the older principal's terminate-operation with
        //    its old payload {"operation": ...}: applied, acknowledged.
        set_status(
            &spoke,
            name,
            json!({"operationState": {"phase": "Running", "operation": {"sync": {"revision": "HEAD"}}}}),
        )
        .await?;
        let terminate = Event::resource(
            OLD_PRINCIPAL,
            EventType::TerminateOperation,
            app_ref(MANAGED, name),
            Payload::Object(Arc::new(
                json!({"operation": {"sync": {"revision": "HEAD"}}}),
            )),
        );
        s.send(&terminate).await?;
        let ack = s.answer_to(&terminate.id).await?;
        assert_eq!(ack.ty, EventType::Processed, "terminate answered {ack:?}");
        let phase = stored_app(&topo.managed_spoke, SPOKE_NS, name)
            .and_then(|a| a.pointer("/status/operationState/phase").cloned());
        assert_eq!(phase, Some(json!("Terminating")));

        // 3. The agent reports the status; the older principal refuses it with a reason
        //    this agent does not know. That answer is final: no resend (the agent resends
        //    an unanswered event after 2 s, doubling), also not after a reconnect.
        let is_status = |e: &Event| {
            e.ty == EventType::StatusUpdate && e.resource.as_ref().is_some_and(|r| r.name == name)
        };
        let reported = s
            .next_matching(T, |e| {
                is_status(e)
                    && e.object()
                        .and_then(|o| o.pointer("/status/operationState/phase"))
                        == Some(&json!("Terminating"))
            })
            .await?
            .ok_or("no status-update of the terminating operation")?;
        s.send(&reported.error_reply(
            OLD_PRINCIPAL,
            "SomeOldReason",
            "refused by a principal of the previous release".into(),
        ))
        .await?;
        let again = s
            .next_matching(Duration::from_secs(7), |e| {
                e.id == reported.id
                    || (is_status(e)
                        && e.object()
                            .and_then(|o| o.pointer("/status/operationState/phase"))
                            == Some(&json!("Terminating")))
            })
            .await?;
        assert!(
            again.is_none(),
            "a refused status-update was sent again: {again:?}"
        );
        // Reconnect: the agent requeues what is in flight; the refused event is not.
        drop(s);
        let mut s = tokio::time::timeout(Duration::from_secs(40), sessions.recv())
            .await
            .map_err(|_| "the agent did not reconnect")?
            .ok_or("server stopped")?;
        let again = s
            .next_matching(Duration::from_secs(5), |e| e.id == reported.id)
            .await?;
        assert!(
            again.is_none(),
            "the refused status-update came back after a reconnect: {again:?}"
        );
        Ok::<_, HarnessError>(())
    }
    .await;
    let log = agent.log();
    agent.stop().await;
    stop.cancel();
    let _ = server.await;
    topo.stop().await;
    result.unwrap_or_else(|e| panic!("{e}\n--- agent ---\n{log}"));
}
