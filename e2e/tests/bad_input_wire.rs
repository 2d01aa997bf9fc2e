//! Bad input on the wire, end to end with the real principal (issue 15 item 4; the flood and
//! delete cases are in `bad_input.rs`, cross-agent creates/status and config kinds in
//! `security.rs`): malformed CloudEvents, unknown types and tricky names are refused at
//! decode (`Malformed`), bytes that are not protobuf and messages over the size limit end
//! the stream (`Undecodable`, `TooLarge`), a stream without hello is closed after
//! `--hello-timeout`, an agent that never reads is closed after `--idle-timeout`
//! (`NotReading`), concurrent streams of one identity leave one live session (the newest),
//! a replayed JWT-SVID is just another session of its agent, and every Application verb on
//! another agent's object is `Forbidden`. Each case: a clear answer to the sender, a log
//! line, a metric, nothing stored changed, and a real agent still syncing at normal latency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use argocd_agent_domain::Namespace;
use argocd_agent_domain::{Event, EventType, Payload, ResourceKind, ResourceRef};
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::cloudevents::cloud_event::{
    CloudEventAttributeValue, Data, cloud_event_attribute_value::Attr,
};
use argocd_agent_proto::eventstream::AgentMode;
use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use prost::Message as _;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const T: Duration = Duration::from_secs(30);
/// What "normal latency" of the legitimate agent means on a loaded 2-core machine.
const NORMAL: Duration = Duration::from_secs(3);

fn refused_series(agent: &str, reason: &str) -> String {
    format!(
        "argocd_principal_events_refused_total{{agent=\"{agent}\",reason=\"{reason}\",tenant=\"\"}}"
    )
}

/// The principal's `argocd_principal_connected_agents`.
async fn connected(topo: &Topology) -> f64 {
    metric_sum(
        topo.metrics_ports["principal"],
        "argocd_principal_connected_agents",
    )
    .await
}

/// Reads `inbound` until it ends with a gRPC status (events are skipped); errors when it
/// ends cleanly or stays open for `T`.
async fn final_status(
    inbound: &mut tonic::Streaming<CloudEvent>,
) -> Result<tonic::Status, HarnessError> {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        match tokio::time::timeout_at(deadline, inbound.message()).await? {
            Ok(Some(_)) => continue,
            Ok(None) => return Err("stream ended without a status".into()),
            Err(s) => return Ok(s),
        }
    }
}

/// The legitimate managed agent still syncs at normal latency: a hub create reaches its
/// spoke within [`NORMAL`].
async fn managed_agent_syncs(topo: &Topology, name: &str) -> Result<(), HarnessError> {
    let started = Instant::now();
    apps(&topo.hub, MANAGED)?
        .create(
            &PostParams::default(),
            &sample_app(name, MANAGED, "guestbook"),
        )
        .await?;
    eventually("the legitimate agent syncs", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, name)
    })
    .await?;
    let took = started.elapsed();
    eprintln!("legitimate agent: {name} reached the spoke in {took:?}");
    assert!(took < NORMAL, "{name} took {took:?} to reach the spoke");
    Ok(())
}

/// The legitimate autonomous agent still syncs at normal latency: a spoke create reaches
/// the hub within [`NORMAL`].
async fn autonomous_agent_syncs(topo: &Topology, name: &str) -> Result<(), HarnessError> {
    let started = Instant::now();
    apps(&topo.autonomous_spoke, SPOKE_NS)?
        .create(
            &PostParams::default(),
            &sample_app(name, SPOKE_NS, "guestbook"),
        )
        .await?;
    eventually("the legitimate agent syncs", T, || async {
        stored_app(&topo.hub, AUTONOMOUS, name)
    })
    .await?;
    let took = started.elapsed();
    eprintln!("legitimate agent: {name} reached the hub in {took:?}");
    assert!(took < NORMAL, "{name} took {took:?} to reach the hub");
    Ok(())
}

fn app_ref(ns: &str, name: &str) -> ResourceRef {
    ResourceRef {
        kind: ResourceKind::Application,
        namespace: Namespace::new(ns).expect("valid namespace"),
        name: name.into(),
    }
}

/// A create of Application `name` in the autonomous agent's hub namespace, on the wire.
fn create_ce(name: &str) -> CloudEvent {
    let mut obj = serde_json::to_value(sample_app(name, AUTONOMOUS, "guestbook"))
        .expect("sample app serializes");
    obj["metadata"]["namespace"] = json!(AUTONOMOUS);
    Event::resource(
        "test-client",
        EventType::Create,
        app_ref(AUTONOMOUS, name),
        Payload::Object(Arc::new(obj)),
    )
    .to_cloud_event()
}

fn set_attr(ce: &mut CloudEvent, name: &str, value: &str) {
    ce.attributes.insert(
        name.into(),
        CloudEventAttributeValue {
            attr: Some(Attr::CeString(value.into())),
        },
    );
}

/// A create whose resource name (event attribute and payload) is `name`.
fn named_create(name: &str) -> CloudEvent {
    let mut ce = create_ce("placeholder");
    set_attr(&mut ce, "resourcename", name);
    let obj = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": AUTONOMOUS},
        "spec": {"project": "default"},
    });
    ce.data = Some(Data::TextData(obj.to_string()));
    ce
}

/// Writes (not reads) to the hub so far in namespace `ns`, of the object `name` (any when
/// `None`), status subresource excluded.
fn hub_writes(topo: &Topology, ns: &str, name: Option<&str>) -> usize {
    topo.hub
        .requests()
        .iter()
        .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .filter(|r| r.namespace.as_deref() == Some(ns) && r.subresource.is_none())
        .filter(|r| name.is_none() || r.name.as_deref() == name)
        .count()
}

/// Writes to the hub so far in any namespace (or none), status subresource excluded.
fn hub_writes_anywhere(topo: &Topology) -> usize {
    topo.hub
        .requests()
        .iter()
        .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .filter(|r| r.subresource.is_none())
        .count()
}

/// Application names stored on the hub in the autonomous agent's namespace.
fn autonomous_hub_apps(topo: &Topology) -> Vec<String> {
    let mut v: Vec<String> = topo
        .hub
        .list_objects("argoproj.io", "v1alpha1", "applications", Some(AUTONOMOUS))
        .iter()
        .filter_map(|a| a["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    v.sort();
    v
}

/// Sends raw gRPC messages (`frames`, each any bytes) on an `EventStream.Subscribe` stream
/// and returns the status the stream ends with.
async fn raw_stream(
    channel: tonic::transport::Channel,
    frames: Vec<Vec<u8>>,
) -> Result<tonic::Status, HarnessError> {
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(usize::MAX);
    grpc.ready().await.map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel::<Vec<u8>>(frames.len() + 1);
    for f in frames {
        tx.send(f).await?;
    }
    let path =
        http::uri::PathAndQuery::from_static("/argocdagent.eventstream.v1.EventStream/Subscribe");
    let resp = grpc
        .streaming(tonic::Request::new(ReceiverStream::new(rx)), path, RawCodec)
        .await;
    let mut inbound = match resp {
        Ok(r) => r.into_inner(),
        Err(s) => return Ok(s),
    };
    let out = tokio::time::timeout(T, async {
        loop {
            match inbound.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return Err::<tonic::Status, HarnessError>("no status".into()),
                Err(s) => return Ok(s),
            }
        }
    })
    .await?;
    drop(tx);
    out
}

/// A codec of raw message bytes: what a broken or hostile client puts on the wire.
#[derive(Clone, Copy)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        let mut v = vec![0; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

fn hello_bytes(mode: AgentMode) -> Vec<u8> {
    hello_event(mode).to_cloud_event().encode_to_vec()
}

fn hello_event(mode: AgentMode) -> Event {
    Event::new(
        "test-client",
        EventType::Hello,
        Payload::Hello(argocd_agent_proto::eventstream::Hello {
            mode: mode as i32,
            version: "test".into(),
            protocol_version: 1,
            ..Default::default()
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_events_tricky_names_garbage_and_oversized_messages_are_refused() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        topo.wait_connected(MANAGED, T).await?;
        let port = topo.metrics_ports["principal"];
        managed_agent_syncs(&topo, "before").await?;
        let hub_apps_before = autonomous_hub_apps(&topo);
        let source = topo.svid_source("autonomous.sock").await?;
        let ((tx, mut inbound), welcome) =
            open_agent_stream(&source, topo.principal_addr, AgentMode::Autonomous).await?;
        assert_eq!(welcome.ty, EventType::Welcome);
        // Let the (empty) resync's writes settle before counting hub writes.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let writes_before = hub_writes_anywhere(&topo);
        let malformed_before = metric_sum(port, &refused_series(AUTONOMOUS, "Malformed")).await;

        // Malformed CloudEvents, unknown types, contradicting kinds and tricky names: each
        // answered with an error event `Malformed` naming the event and saying why.
        let mut cases: Vec<(String, CloudEvent, &str)> = Vec::new();
        let mut ce = create_ce("no-source");
        ce.source.clear();
        cases.push(("missing source".into(), ce, "source"));
        let mut ce = create_ce("bad-spec");
        ce.spec_version = "0.3".into();
        cases.push(("bad specversion".into(), ce, "specversion"));
        let mut ce = create_ce("bad-type");
        ce.r#type = "io.argoproj.argocd-agent.event.explode".into();
        cases.push(("unknown event type".into(), ce, "unknown event type"));
        let mut ce = create_ce("foreign-type");
        ce.r#type = "com.example.something".into();
        cases.push(("foreign event type".into(), ce, "unknown event type"));
        let mut ce = create_ce("half-resource");
        ce.attributes.remove("resourcenamespace");
        cases.push(("resource attributes incomplete".into(), ce, "missing"));
        let mut ce = create_ce("broken-json");
        ce.data = Some(Data::TextData("{\"metadata\": {\"name\": ".into()));
        cases.push(("broken JSON payload".into(), ce, "payload"));
        let mut ce = create_ce("wrong-kind");
        let mut obj: Value = serde_json::to_value(sample_app("wrong-kind", AUTONOMOUS, "x"))?;
        obj["kind"] = json!("AppProject");
        ce.data = Some(Data::TextData(obj.to_string()));
        cases.push(("payload kind contradicts the event".into(), ce, "kind"));
        let mut ce = create_ce("wrong-api");
        let mut obj: Value = serde_json::to_value(sample_app("wrong-api", AUTONOMOUS, "x"))?;
        obj["apiVersion"] = json!("v1");
        ce.data = Some(Data::TextData(obj.to_string()));
        cases.push((
            "payload apiVersion contradicts the event".into(),
            ce,
            "apiVersion",
        ));
        let mut ce = create_ce("unknown-kind");
        set_attr(&mut ce, "resourcekind", "Pod");
        cases.push(("unknown resource kind".into(), ce, "unknown kind"));
        let forged = "x\nlevel=ERROR forged-by-name";
        let long = "a".repeat(254);
        for name in [
            "../victim",
            "a?b",
            "victim/status",
            "a%2Fb",
            "UpperCase",
            long.as_str(),
            "nul\0byte",
            forged,
            "ünïcödé",
            "",
        ] {
            cases.push((format!("name {name:?}"), named_create(name), "resourcename"));
        }
        for ns in ["../agent-managed", "Agent-Autonomous", "a/b", "x\ny"] {
            let mut ce = create_ce("tricky-namespace");
            set_attr(&mut ce, "resourcenamespace", ns);
            cases.push((format!("namespace {ns:?}"), ce, "resourcenamespace"));
        }
        for (what, ce, says) in &cases {
            let id = ce.id.clone();
            tx.send(ce.clone()).await?;
            let reply = answer_to(&mut inbound, &id).await?;
            let Payload::Error(d) = &reply.payload else {
                return Err(format!("{what}: expected an error, got {}", reply.ty).into());
            };
            assert_eq!(d.reason, "Malformed", "{what}: {d:?}");
            assert_eq!(d.event_id, id, "{what}: {d:?}");
            assert!(
                d.message.to_lowercase().contains(&says.to_lowercase()),
                "{what}: the message says why ({says}): {}",
                d.message
            );
        }
        // Metric, log line (escaped: no raw newline from a name), nothing stored.
        let n = cases.len() as f64;
        eventually("Malformed counted", T, || async {
            (metric_sum(port, &refused_series(AUTONOMOUS, "Malformed")).await
                >= malformed_before + n)
                .then_some(())
        })
        .await?;
        let log = topo.principal.log();
        assert!(
            log.lines()
                .filter(|l| l.contains("malformed event refused"))
                .count()
                >= cases.len(),
            "one log line per refused event"
        );
        assert!(
            log.lines()
                .filter(|l| l.contains("forged-by-name"))
                .all(|l| l.contains("malformed event refused")),
            "a name with a newline forged a log line"
        );
        assert_eq!(
            autonomous_hub_apps(&topo),
            hub_apps_before,
            "nothing stored"
        );
        assert_eq!(
            hub_writes_anywhere(&topo),
            writes_before,
            "no hub write for a refused event"
        );
        // Known event types an agent may not send: BadRequest, counted `UnexpectedEvent`.
        let unexpected_before =
            metric_sum(port, &refused_series(AUTONOMOUS, "UnexpectedEvent")).await;
        for e in [
            Event::new(
                "test-client",
                EventType::RequestSyncedResourceList,
                Payload::None,
            ),
            Event::new(
                "test-client",
                EventType::RequestResourceResync,
                Payload::None,
            ),
        ] {
            tx.send(e.to_cloud_event()).await?;
            let reply = answer_to(&mut inbound, &e.id).await?;
            let Payload::Error(d) = &reply.payload else {
                return Err(format!("{}: expected an error, got {}", e.ty, reply.ty).into());
            };
            assert_eq!(d.reason, "BadRequest", "{}: {d:?}", e.ty);
            assert!(d.message.contains("not accepted from agents"), "{d:?}");
        }
        eventually("UnexpectedEvent counted", T, || async {
            (metric_sum(port, &refused_series(AUTONOMOUS, "UnexpectedEvent")).await
                >= unexpected_before + 2.0)
                .then_some(())
        })
        .await?;
        // The stream is still usable after all that: a valid create is applied.
        let ok = create_ce("valid-after-garbage");
        let ok_id = ok.id.clone();
        tx.send(ok).await?;
        let reply = answer_to(&mut inbound, &ok_id).await?;
        assert_eq!(reply.ty, EventType::Processed, "{reply:?}");
        managed_agent_syncs(&topo, "after-malformed").await?;
        drop((tx, inbound));

        // Bytes that are not a protobuf CloudEvent, after a valid hello: the stream ends
        // with InvalidArgument, counted `Undecodable`.
        let undecodable_before = metric_sum(port, &refused_series(AUTONOMOUS, "Undecodable")).await;
        let garbage = vec![0xff, 0xff, 0xff, 0xff, 0x0f, 0x0a, 0x99];
        let status = raw_stream(
            dial_principal(&source, topo.principal_addr).await?,
            vec![hello_bytes(AgentMode::Autonomous), garbage],
        )
        .await?;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains("not a protobuf CloudEvent"),
            "{status:?}"
        );
        // Garbage instead of the hello: the same.
        let status = raw_stream(
            dial_principal(&source, topo.principal_addr).await?,
            vec![b"GET / HTTP/1.1\r\n\r\n".to_vec()],
        )
        .await?;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        eventually("Undecodable counted", T, || async {
            (metric_sum(port, &refused_series(AUTONOMOUS, "Undecodable")).await
                >= undecodable_before + 2.0)
                .then_some(())
        })
        .await?;
        eventually("Undecodable logged", T, || async {
            topo.principal
                .log()
                .lines()
                .any(|l| l.contains("agent stream refused") && l.contains("Undecodable"))
                .then_some(())
        })
        .await?;
        managed_agent_syncs(&topo, "after-garbage").await?;

        // A message over --max-message-size (4 MiB): OutOfRange, counted `TooLarge`, and
        // not stored.
        let mut obj = serde_json::to_value(sample_app("huge", AUTONOMOUS, "guestbook"))?;
        obj["metadata"]["namespace"] = json!(AUTONOMOUS);
        obj["metadata"]["annotations"] = json!({"filler": "x".repeat(5 * 1024 * 1024)});
        let huge = Event::resource(
            "test-client",
            EventType::Create,
            app_ref(AUTONOMOUS, "huge"),
            Payload::Object(Arc::new(obj)),
        );
        let status = raw_stream(
            dial_principal(&source, topo.principal_addr).await?,
            vec![
                hello_bytes(AgentMode::Autonomous),
                huge.to_cloud_event().encode_to_vec(),
            ],
        )
        .await?;
        assert!(
            matches!(
                status.code(),
                tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
            ),
            "{status:?}"
        );
        assert!(status.message().contains("too large"), "{status:?}");
        eventually("TooLarge counted and logged", T, || async {
            (metric_sum(port, &refused_series(AUTONOMOUS, "TooLarge")).await >= 1.0
                && topo
                    .principal
                    .log()
                    .lines()
                    .any(|l| l.contains("agent stream refused") && l.contains("TooLarge")))
            .then_some(())
        })
        .await?;
        assert!(stored_app(&topo.hub, AUTONOMOUS, "huge").is_none());
        managed_agent_syncs(&topo, "after-huge").await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

/// RSS of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slowloris_without_hello_or_without_reading_is_closed_and_bounded() {
    let topo = Topology::start(TopologyOptions {
        // The autonomous agent is real; the managed identity is the slow client.
        agents: Some(vec![AUTONOMOUS]),
        principal_args: vec![
            "--hello-timeout".into(),
            "2s".into(),
            // The harness's agents send heartbeats every 5 s.
            "--idle-timeout".into(),
            "12s".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        topo.wait_connected(AUTONOMOUS, T).await?;
        let port = topo.metrics_ports["principal"];
        autonomous_agent_syncs(&topo, "before").await?;
        let source = topo.svid_source("managed.sock").await?;
        // (0) A TCP connection that never starts its TLS handshake (checked at the end: the
        // principal drops it after its 10 s handshake timeout).
        let mut silent_tcp = tokio::net::TcpStream::connect(topo.principal_addr).await?;
        let silent_since = Instant::now();

        // (a) A stream that never sends its hello: DeadlineExceeded after --hello-timeout.
        let channel = dial_principal(&source, topo.principal_addr).await?;
        let (_hold, rx) = mpsc::channel::<CloudEvent>(1);
        let started = Instant::now();
        let mut client =
            argocd_agent_proto::eventstream::event_stream_client::EventStreamClient::new(channel);
        let status = match client.subscribe(ReceiverStream::new(rx)).await {
            Err(s) => s,
            Ok(resp) => final_status(&mut resp.into_inner()).await?,
        };
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        assert!(status.message().contains("no hello"), "{status:?}");
        assert!(started.elapsed() >= Duration::from_millis(1900));
        eventually("HelloTimeout counted and logged", T, || async {
            (metric_sum(port, &refused_series(MANAGED, "HelloTimeout")).await >= 1.0
                && topo
                    .principal
                    .log()
                    .lines()
                    .any(|l| l.contains("session ended with error") && l.contains("no hello")))
            .then_some(())
        })
        .await?;
        autonomous_agent_syncs(&topo, "after-no-hello").await?;

        // (b) A client that says hello, keeps sending heartbeats, and never reads (nor
        // acknowledges), while the hub has much to send it: 400 Applications of 24 KiB; the
        // 256 the principal sends before waiting for acknowledgements are more than the
        // HTTP/2 windows and the session buffer hold.
        let pid = topo.principal.pid().ok_or("principal not running")?;
        let rss_before = rss_kib(pid);
        let ((tx, stuck_inbound), welcome) =
            open_agent_stream(&source, topo.principal_addr, AgentMode::Managed).await?;
        assert_eq!(welcome.ty, EventType::Welcome);
        let pinger = tokio::spawn(async move {
            loop {
                let ping = Event::new("test-client", EventType::Ping, Payload::None);
                if tx.send(ping.to_cloud_event()).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        let stuck_started = Instant::now();
        let hub = apps(&topo.hub, MANAGED)?;
        let filler = "y".repeat(24 * 1024);
        for i in 0..400 {
            let mut app = sample_app(&format!("pile-{i}"), MANAGED, "guestbook");
            app.metadata
                .annotations
                .get_or_insert_default()
                .insert("filler".into(), filler.clone());
            hub.create(&PostParams::default(), &app).await?;
        }
        // The other agent is not blocked meanwhile.
        autonomous_agent_syncs(&topo, "while-stuck").await?;
        // The principal closes the stuck session once it has taken nothing for
        // --idle-timeout, although it still sends heartbeats.
        eventually("the non-reading session is closed", T, || async {
            (metric_sum(port, &refused_series(MANAGED, "NotReading")).await >= 1.0
                && connected(&topo).await == 1.0)
                .then_some(())
        })
        .await?;
        assert!(
            stuck_started.elapsed() >= Duration::from_secs(11),
            "closed before the idle timeout"
        );
        eventually("NotReading logged", T, || async {
            topo.principal
                .log()
                .lines()
                .any(|l| l.contains("agent takes no events: session closed"))
                .then_some(())
        })
        .await?;
        let rss_after = rss_kib(pid);
        eprintln!(
            "principal RSS {rss_before} KiB before, {rss_after} KiB after; stuck session closed after {:?}",
            stuck_started.elapsed()
        );
        assert!(
            rss_after < rss_before + 200 * 1024,
            "principal RSS grew from {rss_before} KiB to {rss_after} KiB"
        );
        pinger.abort();
        drop(stuck_inbound);
        autonomous_agent_syncs(&topo, "after-stuck").await?;

        // (0) The silent TCP connection was closed by the principal, counted and logged.
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(T, tokio::io::AsyncReadExt::read(&mut silent_tcp, &mut buf))
            .await?;
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert!(silent_since.elapsed() >= Duration::from_secs(9));
        eventually("HandshakeTimeout counted and logged", T, || async {
            (metric_sum(
                port,
                "argocd_principal_auth_failures_total{reason=\"HandshakeTimeout\"}",
            )
            .await
                >= 1.0
                && topo.principal.log().contains("TLS handshake timed out"))
            .then_some(())
        })
        .await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_streams_of_one_identity_leave_one_live_session_the_newest() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![AUTONOMOUS]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        topo.wait_connected(AUTONOMOUS, T).await?;
        let source = Arc::new(topo.svid_source("managed.sock").await?);
        let addr = topo.principal_addr;
        let opens = (0..20).map(|_| {
            let source = source.clone();
            tokio::spawn(async move { open_agent_stream(&source, addr, AgentMode::Managed).await })
        });
        let mut streams = Vec::new();
        for o in opens {
            let ((tx, inbound), welcome) = o.await??;
            assert_eq!(welcome.ty, EventType::Welcome);
            streams.push((tx, inbound));
        }
        // All but one are closed, with a reason; the gauge counts one session for the
        // identity (plus the real autonomous agent).
        let mut closed = 0;
        let mut live = Vec::new();
        for (tx, mut inbound) in streams {
            match tokio::time::timeout(Duration::from_secs(3), final_status(&mut inbound)).await {
                Ok(status) => {
                    let status = status?;
                    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
                    assert!(
                        status.message().contains("replaced by a newer session"),
                        "{status:?}"
                    );
                    closed += 1;
                }
                Err(_) => live.push((tx, inbound)),
            }
        }
        assert_eq!((closed, live.len()), (19, 1), "one live session");
        eventually("gauge counts one session per agent", T, || async {
            (connected(&topo).await == 2.0).then_some(())
        })
        .await?;
        // The live one gets the agent's events.
        let (_tx, mut inbound) = live.pop().ok_or("no live session")?;
        apps(&topo.hub, MANAGED)?
            .create(
                &PostParams::default(),
                &sample_app("to-live", MANAGED, "guestbook"),
            )
            .await?;
        tokio::time::timeout(T, async {
            loop {
                let e = Event::from_cloud_event(inbound.message().await?.ok_or("closed")?)?;
                if e.resource.as_ref().is_some_and(|r| r.name == "to-live") {
                    return Ok::<(), HarnessError>(());
                }
            }
        })
        .await??;
        // A newer session (opened after it, for certain) wins in turn.
        let ((_tx2, mut newest), _) = open_agent_stream(&source, addr, AgentMode::Managed).await?;
        let status = final_status(&mut inbound).await?;
        assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
        apps(&topo.hub, MANAGED)?
            .create(
                &PostParams::default(),
                &sample_app("to-newest", MANAGED, "guestbook"),
            )
            .await?;
        tokio::time::timeout(T, async {
            loop {
                let e = Event::from_cloud_event(newest.message().await?.ok_or("closed")?)?;
                if e.resource.as_ref().is_some_and(|r| r.name == "to-newest") {
                    return Ok::<(), HarnessError>(());
                }
            }
        })
        .await??;
        autonomous_agent_syncs(&topo, "after-streams").await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

/// Opens a stream on the JWT listener with `token`; returns the stream and the welcome.
async fn jwt_stream(
    addr: std::net::SocketAddr,
    token: &str,
) -> Result<(AgentStream, Event), HarnessError> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client =
        argocd_agent_proto::eventstream::event_stream_client::EventStreamClient::new(channel);
    let (tx, rx) = mpsc::channel(16);
    tx.send(hello_event(AgentMode::Managed).to_cloud_event())
        .await?;
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    let mut inbound = client.subscribe(req).await?.into_inner();
    let first = inbound.message().await?.ok_or("closed before welcome")?;
    Ok(((tx, inbound), Event::from_cloud_event(first)?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_jwt_svid_opens_a_session_that_replaces_the_first() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![AUTONOMOUS]),
        principal_args: vec!["--auth".into(), "jwt-svid".into()],
        agent_creds: Some("jwt-svid".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        topo.wait_connected(AUTONOMOUS, T).await?;
        let id = argocd_agent_identity::SpiffeId::parse(&agent_id(MANAGED))?;
        let token = topo.spiffe.ca().issue_jwt(
            &id,
            &[PRINCIPAL_ID.to_string()],
            Duration::from_secs(300),
        )?;
        let ((_tx1, mut first), w1) = jwt_stream(topo.principal_addr, &token).await?;
        assert_eq!(w1.ty, EventType::Welcome);
        // The same token again, on another connection: a bearer credential, so it is the
        // same agent reconnecting; the newer session replaces the first.
        let ((_tx2, mut second), w2) = jwt_stream(topo.principal_addr, &token).await?;
        assert_eq!(w2.ty, EventType::Welcome);
        let status = final_status(&mut first).await?;
        assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
        assert!(
            status.message().contains("replaced by a newer session"),
            "{status:?}"
        );
        eventually("one session for the replayed identity", T, || async {
            (connected(&topo).await == 2.0).then_some(())
        })
        .await?;
        // The replayed session is the live one: it receives the agent's objects.
        apps(&topo.hub, MANAGED)?
            .create(
                &PostParams::default(),
                &sample_app("via-replay", MANAGED, "guestbook"),
            )
            .await?;
        tokio::time::timeout(T, async {
            loop {
                let e = Event::from_cloud_event(second.message().await?.ok_or("closed")?)?;
                if e.resource.as_ref().is_some_and(|r| r.name == "via-replay") {
                    return Ok::<(), HarnessError>(());
                }
            }
        })
        .await??;
        // Only within the token's own audience and lifetime: another audience's token, or
        // this identity's expired one, opens nothing (see jwt_svid.rs for the full set).
        let now = std::time::SystemTime::now();
        let expired = topo.spiffe.ca().issue_jwt_at(
            &id,
            &[PRINCIPAL_ID.to_string()],
            now - Duration::from_secs(600),
            now - Duration::from_secs(1),
        )?;
        match jwt_stream(topo.principal_addr, &expired).await {
            Ok(_) => return Err("an expired token opened a session".into()),
            Err(e) => assert!(
                e.to_string().contains("nauthenticated") || e.to_string().contains("expired"),
                "{e}"
            ),
        }
        autonomous_agent_syncs(&topo, "after-replay").await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_verb_on_another_agents_objects_of_every_kind_is_forbidden() {
    // An autonomous identity against a managed agent's objects.
    cross_agent(MANAGED, AUTONOMOUS, AgentMode::Autonomous).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_verb_on_another_agents_objects_of_every_kind_is_forbidden_from_the_managed_side() {
    // A managed identity against an autonomous agent's objects.
    cross_agent(AUTONOMOUS, MANAGED, AgentMode::Managed).await;
}

/// The real `victim` agent syncs an Application; a hand-driven stream of identity
/// `attacker` (in `mode`) sends every verb for it, and for each configuration kind in the
/// victim's namespace: every one is refused `Forbidden`, counted, logged, and nothing on
/// the hub changes.
async fn cross_agent(victim: &'static str, attacker: &'static str, mode: AgentMode) {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![victim]),
        ..Default::default()
    })
    .await
    .unwrap();
    let victim_syncs = |name: &'static str| {
        let topo = &topo;
        async move {
            if victim == MANAGED {
                managed_agent_syncs(topo, name).await
            } else {
                autonomous_agent_syncs(topo, name).await
            }
        }
    };
    let r: Result<(), HarnessError> = async {
        topo.wait_connected(victim, T).await?;
        let port = topo.metrics_ports["principal"];
        victim_syncs("victim").await?;
        let source = topo
            .svid_source(&format!("{}.sock", attacker.trim_start_matches("agent-")))
            .await?;
        let ((tx, mut inbound), _) = open_agent_stream(&source, topo.principal_addr, mode).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = stored_app(&topo.hub, victim, "victim").ok_or("victim missing")?;
        let writes_before = hub_writes(&topo, victim, Some("victim"));
        let hub_argocd_writes_before = hub_writes(&topo, HUB_ARGOCD_NS, None);
        let managed_writes_before = hub_writes(&topo, victim, None);
        let refused_before = metric_sum(port, &refused_series(attacker, "WrongNamespace")).await
            + metric_sum(port, &refused_series(attacker, "NotOwner")).await
            + metric_sum(port, &refused_series(attacker, "ModeForbids")).await;
        let victim_app = app_ref(victim, "victim");
        let obj = |extra: Value| {
            let mut o = json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": {"name": "victim", "namespace": victim},
            });
            if let (Some(o), Some(e)) = (o.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            Payload::Object(Arc::new(o))
        };
        let table: Vec<(EventType, Payload)> = vec![
            (
                EventType::Create,
                obj(json!({"spec": {"project": "default"}})),
            ),
            (
                EventType::SpecUpdate,
                obj(json!({"spec": {"project": "stolen"}})),
            ),
            (
                EventType::StatusUpdate,
                obj(json!({"status": {"health": {"status": "Degraded"}}})),
            ),
            (EventType::Delete, Payload::None),
            (
                EventType::SetOperation,
                obj(json!({"operation": {"sync": {"revision": "HEAD"}}})),
            ),
            (EventType::TerminateOperation, Payload::None),
            (EventType::RequestUpdate, Payload::None),
        ];
        for (ty, payload) in table {
            let e = Event::resource("test-client", ty, victim_app.clone(), payload);
            tx.send(e.to_cloud_event()).await?;
            let reply = answer_to(&mut inbound, &e.id).await?;
            let Payload::Error(d) = &reply.payload else {
                return Err(format!("{ty}: expected an error, got {}", reply.ty).into());
            };
            assert_eq!(d.reason, "Forbidden", "{ty}: {d:?}");
            assert_eq!(d.event_id, e.id, "{ty}");
        }
        // Each config kind, every verb, in the other agent's namespace: the managed agent's
        // project, repository and GPG keys (which no agent may write anyway).
        let config_obj = |kind: ResourceKind, name: &str| {
            Payload::Object(Arc::new(json!({
                "apiVersion": kind.object_api_version(), "kind": kind.object_kind(),
                "metadata": {"name": name},
                "spec": {"sourceRepos": ["*"]},
                "data": {"url": "aHR0cHM6Ly9ldmls"},
            })))
        };
        let mut config_rows = 0.0;
        for (kind, name) in [
            (ResourceKind::AppProject, "team"),
            (ResourceKind::Repository, "repo"),
            (ResourceKind::GpgKeys, "argocd-gpg-keys-cm"),
        ] {
            for ty in [
                EventType::Create,
                EventType::SpecUpdate,
                EventType::StatusUpdate,
                EventType::Delete,
                EventType::SetOperation,
                EventType::TerminateOperation,
                EventType::RequestUpdate,
            ] {
                let payload = match ty {
                    EventType::Create | EventType::SpecUpdate | EventType::StatusUpdate => {
                        config_obj(kind, name)
                    }
                    _ => Payload::None,
                };
                let target = ResourceRef {
                    kind,
                    namespace: Namespace::new(victim)?,
                    name: name.into(),
                };
                let e = Event::resource("test-client", ty, target, payload);
                tx.send(e.to_cloud_event()).await?;
                let reply = answer_to(&mut inbound, &e.id).await?;
                let Payload::Error(d) = &reply.payload else {
                    return Err(format!("{kind} {ty}: expected an error, got {}", reply.ty).into());
                };
                assert_eq!(d.reason, "Forbidden", "{kind} {ty}: {d:?}");
                config_rows += 1.0;
            }
        }
        eventually("refusals counted", T, || async {
            let now = metric_sum(port, &refused_series(attacker, "WrongNamespace")).await
                + metric_sum(port, &refused_series(attacker, "NotOwner")).await
                + metric_sum(port, &refused_series(attacker, "ModeForbids")).await;
            (now >= refused_before + 7.0 + config_rows).then_some(())
        })
        .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = stored_app(&topo.hub, victim, "victim").ok_or("victim deleted")?;
        assert_eq!(before["spec"], after["spec"]);
        assert_eq!(before.get("operation"), after.get("operation"));
        assert_ne!(after["status"]["health"]["status"], json!("Degraded"));
        assert_eq!(
            hub_writes(&topo, victim, Some("victim")),
            writes_before,
            "no hub write for a refused event"
        );
        assert_eq!(
            hub_writes(&topo, HUB_ARGOCD_NS, None),
            hub_argocd_writes_before,
            "no project, repository or GPG key written"
        );
        assert_eq!(hub_writes(&topo, victim, None), managed_writes_before);
        assert!(
            topo.principal
                .log()
                .lines()
                .filter(|l| l.contains("event refused") && l.contains("victim"))
                .count()
                >= 7
        );
        victim_syncs("after-cross").await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
