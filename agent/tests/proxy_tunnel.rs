//! The agent's log and exec handlers against the in-memory Kubernetes API server
//! (`KubeTestServer`) and a stand-in principal serving the `Tunnel` service.

use std::time::Duration;

use argocd_agent_agent::dialer::Dialer;
use argocd_agent_agent::metrics::Metrics;
use argocd_agent_agent::proxy::{self, Apps, ProxyConfig, SpokeProxy, Tunnel};
use argocd_agent_domain::{Event, Payload};
use argocd_agent_kube_test_server::KubeTestServer;
use argocd_agent_proto::eventstream::tunnel_server::{Tunnel as TunnelService, TunnelServer};
use argocd_agent_proto::eventstream::{
    LogClosed, LogMessage, LogRequest, ResourceRequest, TerminalFrame, TerminalRequest, log_message,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::sync::CancellationToken;

/// The principal's side: records what the agent sends; for terminals, first sends
/// `to_agent`, then keeps its side open until the agent ends.
struct Principal {
    logs: mpsc::UnboundedSender<LogMessage>,
    frames: mpsc::UnboundedSender<TerminalFrame>,
    to_agent: Vec<TerminalFrame>,
}

#[tonic::async_trait]
impl TunnelService for Principal {
    async fn logs(
        &self,
        request: tonic::Request<tonic::Streaming<LogMessage>>,
    ) -> Result<tonic::Response<LogClosed>, tonic::Status> {
        let mut s = request.into_inner();
        while let Some(m) = s.message().await? {
            let _ = self.logs.send(m);
        }
        Ok(tonic::Response::new(LogClosed {}))
    }

    type TerminalStream = ReceiverStream<Result<TerminalFrame, tonic::Status>>;

    async fn terminal(
        &self,
        request: tonic::Request<tonic::Streaming<TerminalFrame>>,
    ) -> Result<tonic::Response<Self::TerminalStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let (frames, to_agent) = (self.frames.clone(), self.to_agent.clone());
        tokio::spawn(async move {
            // The first frame names the session, then the principal starts talking.
            if let Ok(Some(first)) = inbound.message().await {
                let _ = frames.send(first);
            }
            for f in to_agent {
                let _ = tx.send(Ok(f)).await;
            }
            while let Ok(Some(f)) = inbound.message().await {
                let _ = frames.send(f);
            }
            drop(tx);
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
}

struct Setup {
    kube: KubeTestServer,
    proxy: SpokeProxy,
    principal: mpsc::UnboundedReceiver<LogMessage>,
    frames: mpsc::UnboundedReceiver<TerminalFrame>,
    channel: tonic::transport::Channel,
}

async fn setup(to_agent: Vec<TerminalFrame>) -> Setup {
    let kube = KubeTestServer::start().await.expect("kube test server");
    let kc =
        kube::config::Kubeconfig::from_yaml(&kube.kubeconfig_yaml("spoke")).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");

    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), "default");
    let owner = cms
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner",
                "labels": {"app.kubernetes.io/instance": "guestbook"}}}))
            .unwrap(),
        )
        .await
        .expect("owner");
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), "default");
    let pod = |name: &str, owned: bool| {
        let mut v = json!({"metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": "busybox"}]}});
        if owned {
            v["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
                "name": "owner", "uid": owner.metadata.uid.clone().unwrap_or_default(), "controller": true}]);
        }
        serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(v).unwrap()
    };
    pods.create(&Default::default(), &pod("web-0", true))
        .await
        .expect("pod");
    pods.create(&Default::default(), &pod("stray", false))
        .await
        .expect("pod");

    let (logs_tx, principal) = mpsc::unbounded_channel();
    let (frames_tx, frames) = mpsc::unbounded_channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TunnelServer::new(Principal {
                logs: logs_tx,
                frames: frames_tx,
                to_agent,
            }))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("channel to the principal");
    Setup {
        kube,
        proxy: SpokeProxy::new(client, ProxyConfig::default(), Metrics::new()),
        principal,
        frames,
        channel,
    }
}

fn apps() -> Apps {
    Apps::new([("argocd", "guestbook")])
}

fn tunnel(s: &Setup) -> Tunnel {
    Tunnel::new(s.channel.clone(), &Dialer::Plain, 4 * 1024 * 1024).expect("tunnel")
}

fn response(e: Event) -> (String, u32, Value) {
    let Payload::ResourceResponse(r) = e.payload else {
        panic!("not a resource-response: {:?}", e.ty);
    };
    (
        e.ack_id.unwrap_or_default(),
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn a_managed_pods_log_streams_in_lines_and_others_are_refused() {
    let mut s = setup(Vec::new()).await;
    s.kube.set_pod_log(
        "default",
        "web-0",
        "app",
        "first line\nsecond line\nthird\n",
    );
    let (out, mut answers) = mpsc::channel(4);
    let token = CancellationToken::new();
    let req = LogRequest {
        namespace: "default".into(),
        pod: "web-0".into(),
        container: "app".into(),
        tail_lines: -1,
        ..Default::default()
    };
    proxy::logs::serve(
        &s.proxy,
        &apps(),
        Ok(tunnel(&s)),
        "agent",
        "log-1",
        req.clone(),
        &out,
        &token,
    )
    .await;
    let mut got = Vec::new();
    while let Ok(m) = s.principal.try_recv() {
        got.push(m.message.expect("message"));
    }
    let log_message::Message::Start(start) = &got[0] else {
        panic!("first message is not a start: {:?}", got[0]);
    };
    assert_eq!((start.request_id.as_str(), start.status), ("log-1", 200));
    let data: Vec<u8> = got[1..]
        .iter()
        .flat_map(|m| match m {
            log_message::Message::Data(d) => d.clone(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        String::from_utf8_lossy(&data),
        "first line\nsecond line\nthird\n"
    );
    assert!(
        answers.try_recv().is_err(),
        "no resource-response for a served log"
    );

    // A pod nobody manages: 403 as a resource-response, no stream.
    let stray = LogRequest {
        pod: "stray".into(),
        ..req.clone()
    };
    proxy::logs::serve(
        &s.proxy,
        &apps(),
        Ok(tunnel(&s)),
        "agent",
        "log-2",
        stray,
        &out,
        &token,
    )
    .await;
    let (ack, status, body) = response(answers.recv().await.unwrap());
    assert_eq!((ack.as_str(), status), ("log-2", 403));
    assert_eq!(body["reason"], "Forbidden");
    // A missing pod: 404.
    let missing = LogRequest {
        pod: "missing".into(),
        ..req.clone()
    };
    proxy::logs::serve(
        &s.proxy,
        &apps(),
        Ok(tunnel(&s)),
        "agent",
        "log-3",
        missing,
        &out,
        &token,
    )
    .await;
    assert_eq!(response(answers.recv().await.unwrap()).1, 404);
    // A container the pod does not have: the cluster's 400 is the stream's start.
    let wrong = LogRequest {
        container: "nope".into(),
        ..req
    };
    proxy::logs::serve(
        &s.proxy,
        &apps(),
        Ok(tunnel(&s)),
        "agent",
        "log-4",
        wrong,
        &out,
        &token,
    )
    .await;
    let m = s.principal.recv().await.unwrap().message.unwrap();
    let log_message::Message::Start(start) = m else {
        panic!("not a start");
    };
    assert_ne!(start.status, 200);
    assert!(s.principal.try_recv().is_err());
}

#[tokio::test]
async fn exec_bridges_stdin_and_stdout_and_ends_with_the_status() {
    let to_agent = vec![
        TerminalFrame {
            session_id: String::new(),
            channel: 0,
            data: b"hello through the tunnel".to_vec(),
        },
        TerminalFrame {
            session_id: String::new(),
            channel: 255,
            data: vec![0],
        },
    ];
    let mut s = setup(to_agent).await;
    let (out, mut answers) = mpsc::channel(4);
    let token = CancellationToken::new();
    let req = TerminalRequest {
        session_id: "sess-1".into(),
        namespace: "default".into(),
        pod: "web-0".into(),
        container: "app".into(),
        command: vec!["cat".into()],
        stdin: true,
        stdout: true,
        stderr: true,
        tty: false,
    };
    tokio::time::timeout(
        Duration::from_secs(20),
        proxy::exec::serve(
            &s.proxy,
            &apps(),
            Ok(tunnel(&s)),
            "agent",
            "t-1",
            req.clone(),
            &out,
            &token,
        ),
    )
    .await
    .expect("exec ends");
    let mut frames = Vec::new();
    while let Ok(f) = tokio::time::timeout(Duration::from_secs(2), s.frames.recv()).await {
        match f {
            Some(f) => frames.push(f),
            None => break,
        }
        if frames.last().is_some_and(|f| f.channel == 3) {
            break;
        }
    }
    assert_eq!(frames[0].session_id, "sess-1");
    assert!(frames[0].data.is_empty());
    let stdout: Vec<u8> = frames
        .iter()
        .filter(|f| f.channel == 1)
        .flat_map(|f| f.data.clone())
        .collect();
    assert_eq!(String::from_utf8_lossy(&stdout), "hello through the tunnel");
    let status: Value = serde_json::from_slice(&frames.last().unwrap().data).unwrap();
    assert_eq!(frames.last().unwrap().channel, 3);
    assert_eq!(status, json!({"metadata": {}, "status": "Success"}));
    assert!(answers.try_recv().is_err());

    // A refused pod: a 403 resource-response.
    let stray = TerminalRequest {
        pod: "stray".into(),
        ..req
    };
    proxy::exec::serve(
        &s.proxy,
        &apps(),
        Ok(tunnel(&s)),
        "agent",
        "t-2",
        stray,
        &out,
        &token,
    )
    .await;
    let (ack, status, _) = response(answers.recv().await.unwrap());
    assert_eq!((ack.as_str(), status), ("t-2", 403));
}

#[tokio::test]
async fn a_failing_command_reports_its_exit_code() {
    let mut s = setup(Vec::new()).await;
    let (out, _answers) = mpsc::channel(4);
    let token = CancellationToken::new();
    let req = TerminalRequest {
        session_id: "sess-2".into(),
        namespace: "default".into(),
        pod: "web-0".into(),
        container: "app".into(),
        command: vec!["sh".into(), "-c".into(), "exit 3".into()],
        stdout: true,
        stderr: true,
        ..Default::default()
    };
    tokio::time::timeout(
        Duration::from_secs(20),
        proxy::exec::serve(
            &s.proxy,
            &apps(),
            Ok(tunnel(&s)),
            "agent",
            "t-3",
            req,
            &out,
            &token,
        ),
    )
    .await
    .expect("exec ends");
    let mut last = None;
    while let Ok(Some(f)) = tokio::time::timeout(Duration::from_secs(2), s.frames.recv()).await {
        let done = f.channel == 3;
        last = Some(f);
        if done {
            break;
        }
    }
    let last = last.expect("frames");
    assert_eq!(last.channel, 3);
    let status: Value = serde_json::from_slice(&last.data).unwrap();
    assert_eq!(status["status"], "Failure");
    let causes = status["details"]["causes"].as_array().expect("causes");
    assert!(
        causes
            .iter()
            .any(|c| c["reason"] == "ExitCode" && c["message"] == "3"),
        "{status}"
    );
}

#[tokio::test]
async fn resource_requests_against_a_real_api_server() {
    let s = setup(Vec::new()).await;
    let get = |path: &str, accept: &str| ResourceRequest {
        method: "GET".into(),
        path: path.into(),
        accept: accept.into(),
        ..Default::default()
    };
    let r = s
        .proxy
        .handle_resource(&apps(), &get("/api/v1/namespaces/default/pods/web-0", ""))
        .await;
    assert_eq!(r.status, 200);
    let r = s
        .proxy
        .handle_resource(&apps(), &get("/api/v1/namespaces/default/pods/stray", ""))
        .await;
    assert_eq!(r.status, 403);
    let r = s
        .proxy
        .handle_resource(
            &apps(),
            &get("/api/v1/namespaces/default/pods", "application/json"),
        )
        .await;
    assert_eq!(r.status, 200);
    let list: Value = serde_json::from_slice(&r.body).unwrap();
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["web-0"]);
    let table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let r = s
        .proxy
        .handle_resource(&apps(), &get("/api/v1/namespaces/default/pods", table))
        .await;
    let t: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["rows"].as_array().map(Vec::len), Some(1), "{t}");
    let r = s
        .proxy
        .handle_resource(
            &apps(),
            &get("/api/v1/namespaces/default/pods/web-0", table),
        )
        .await;
    assert_eq!(r.status, 200);
    let t: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(t["kind"], "Table");
}

/// Runs one exec to its end and returns the frames the principal got.
async fn run_exec(s: &mut Setup, req: TerminalRequest) -> Vec<TerminalFrame> {
    let (out, _answers) = mpsc::channel(4);
    let token = CancellationToken::new();
    tokio::time::timeout(
        Duration::from_secs(20),
        proxy::exec::serve(
            &s.proxy,
            &apps(),
            Ok(tunnel(s)),
            "agent",
            "t",
            req,
            &out,
            &token,
        ),
    )
    .await
    .expect("exec ends");
    let mut frames = Vec::new();
    while let Ok(Some(f)) = tokio::time::timeout(Duration::from_secs(2), s.frames.recv()).await {
        let done = f.channel == 3;
        frames.push(f);
        if done {
            break;
        }
    }
    frames
}

#[tokio::test]
async fn an_exec_that_cannot_start_ends_with_a_failure_status() {
    let mut s = setup(Vec::new()).await;
    let frames = run_exec(
        &mut s,
        TerminalRequest {
            session_id: "sess-3".into(),
            namespace: "default".into(),
            pod: "web-0".into(),
            container: "no-such-container".into(),
            command: vec!["true".into()],
            stdout: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(frames[1].channel, 3);
    let status: Value = serde_json::from_slice(&frames[1].data).unwrap();
    assert_eq!(status["status"], "Failure");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-such-container")),
        "{status}"
    );
}

#[tokio::test]
async fn an_exec_without_output_still_reports_its_status() {
    let to_agent = vec![
        TerminalFrame {
            session_id: String::new(),
            channel: 0,
            data: b"ignored".to_vec(),
        },
        TerminalFrame {
            session_id: String::new(),
            channel: 255,
            data: vec![0],
        },
    ];
    let mut s = setup(to_agent).await;
    let frames = run_exec(
        &mut s,
        TerminalRequest {
            session_id: "sess-4".into(),
            namespace: "default".into(),
            pod: "web-0".into(),
            container: "app".into(),
            command: vec!["cat".into()],
            stdin: true,
            ..Default::default()
        },
    )
    .await;
    let last = frames.last().expect("frames");
    assert_eq!(last.channel, 3, "{frames:?}");
    let status: Value = serde_json::from_slice(&last.data).unwrap();
    assert_eq!(status["status"], "Success");
}
