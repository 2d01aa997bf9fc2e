//! `pods/<pod>/exec` through the proxy: the client's WebSocket (`v5.channel.k8s.io`, or
//! `v4.channel.k8s.io` for older clients) is bridged frame by frame to a `Tunnel.Terminal`
//! stream the agent opens for this session, and from there to its cluster's exec API.
//!
//! The session id is a fresh UUID bound to the agent the request went to; the agent's
//! stream must name it and come from that agent's identity ([`crate::tunnel`]). Sessions
//! end when either side closes, after `terminal_idle_timeout` without traffic, and after
//! `terminal_max_duration` in any case (the client then gets a Failure status on the error
//! channel saying why).

use argocd_agent_identity::text;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_domain::AgentName;
use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_proto::eventstream::{TerminalFrame, TerminalRequest};
use futures::{SinkExt, StreamExt};
use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, frame::coding::CloseCode};

use super::response::{Body, from_agent, full, offline, rpc_failure, status};
use super::state::{Admitted, ResourceProxy};
use crate::tunnel::TerminalTunnel;
use argocd_agent_domain::rpc::AgentLink;

/// Subprotocols served, preferred first.
const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
/// Channel of the exec's final status.
const ERROR_CHANNEL: u8 = 3;

/// The exec request's parameters.
fn request(query: &str, session_id: &str, namespace: &str, pod: &str) -> TerminalRequest {
    let mut r = TerminalRequest {
        session_id: session_id.to_owned(),
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
        stdout: true,
        stderr: true,
        ..TerminalRequest::default()
    };
    let flag = |v: &str| matches!(v, "true" | "1");
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "command" => r.command.push(v.into_owned()),
            "container" => r.container = v.into_owned(),
            "stdin" => r.stdin = flag(&v),
            "stdout" => r.stdout = flag(&v),
            "stderr" => r.stderr = flag(&v),
            "tty" => r.tty = flag(&v),
            _ => {}
        }
    }
    r
}

/// The subprotocol to answer with, from the client's offer.
fn choose_protocol(offered: &str) -> Option<&'static str> {
    let offered: Vec<&str> = offered.split(',').map(str::trim).collect();
    PROTOCOLS.into_iter().find(|p| offered.contains(p))
}

/// A Failure status on the error channel, as the kubelet writes one.
fn failure_frame(message: &str) -> Vec<u8> {
    let mut f = vec![ERROR_CHANNEL];
    f.extend_from_slice(
        serde_json::json!({"metadata": {}, "status": "Failure", "message": message,
            "reason": "InternalError"})
        .to_string()
        .as_bytes(),
    );
    f
}

pub(super) async fn serve(
    proxy: Arc<ResourceProxy>,
    admitted: Admitted,
    namespace: String,
    pod: String,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let (key, protocol) = match websocket_upgrade(&req) {
        Ok(offer) => offer,
        Err(refused) => return refused,
    };
    let session_id = uuid::Uuid::new_v4().to_string();
    let query = req.uri().query().unwrap_or("").to_owned();
    let terminal = request(&query, &session_id, &namespace, &pod);
    if terminal.command.is_empty() {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "you must specify at least 1 command",
        );
    }
    let Admitted {
        agent,
        link,
        permit,
    } = admitted;
    let command = terminal.command.clone();
    let tunnel = match open_tunnel(&proxy, &agent, &link, &session_id, terminal).await {
        Ok(t) => t,
        Err(answer) => return answer,
    };
    tracing::info!(agent = %agent, session = %session_id, namespace = %text::quoted(&namespace), pod = %text::quoted(&pod),
        command = %text::quoted_list(&command), "terminal session opened");
    let upgrade = hyper::upgrade::on(&mut req);
    spawn_session(&proxy, upgrade, tunnel, agent, session_id, permit);
    switching_protocols(&key, protocol)
}

/// The client's WebSocket upgrade offer: its key and the subprotocol to answer with, or
/// the `BadRequest` to answer instead.
fn websocket_upgrade(req: &Request<Incoming>) -> Result<(String, &'static str), Response<Body>> {
    let get = |h: &str| {
        req.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    if !get("upgrade").eq_ignore_ascii_case("websocket") {
        return Err(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "Upgrade request required (exec is served over WebSocket, v5.channel.k8s.io)",
        ));
    }
    let key = get("sec-websocket-key");
    let Some(protocol) = choose_protocol(&get("sec-websocket-protocol")) else {
        return Err(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "no supported subprotocol offered (v5.channel.k8s.io or v4.channel.k8s.io)",
        ));
    };
    Ok((key, protocol))
}

/// Asks the agent for the exec and waits for its terminal stream for `session_id`; `Err`
/// is the answer to send instead (the agent's refusal, or its going offline).
async fn open_tunnel(
    proxy: &ResourceProxy,
    agent: &AgentName,
    link: &AgentLink,
    session_id: &str,
    terminal: TerminalRequest,
) -> Result<TerminalTunnel, Response<Body>> {
    let event = Event::new(
        &proxy.parts.source,
        EventType::TerminalRequest,
        Payload::TerminalRequest(terminal),
    );
    let expected = proxy.parts.tunnels.expect_terminal(session_id, agent);
    let mut refusal = match link.request(event, None).await {
        Ok(t) => t,
        Err(e) => return Err(rpc_failure(agent, e)),
    };
    let tunnel = tokio::select! {
        tunnel = expected.arrived() => match tunnel {
            Some(t) => t,
            None => return Err(offline(agent)),
        },
        answer = refusal.answer(proxy.parts.config.request_timeout) => return Err(match answer {
            Ok(Event { payload: Payload::ResourceResponse(r), .. }) => from_agent(&r),
            Ok(_) => status(StatusCode::BAD_GATEWAY, "InternalError", "unexpected answer"),
            Err(e) => rpc_failure(agent, e),
        }),
    };
    drop(refusal);
    Ok(tunnel)
}

/// Runs the session in the background once the client's connection is upgraded: bridges
/// it to the agent's stream, holding the agent's permit, and logs how it ended.
fn spawn_session(
    proxy: &ResourceProxy,
    upgrade: hyper::upgrade::OnUpgrade,
    tunnel: TerminalTunnel,
    agent: AgentName,
    session_id: String,
    permit: super::state::Permit,
) {
    let (idle, max) = (
        proxy.parts.config.terminal_idle_timeout,
        proxy.parts.config.terminal_max_duration,
    );
    let tasks = proxy.parts.tasks.clone();
    tasks.spawn(async move {
        let _permit = permit;
        let upgraded = match upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(session = %session_id, error = %e, "terminal session: upgrade failed");
                return;
            }
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        let started = std::time::Instant::now();
        let why = bridge(ws, tunnel, idle, max).await;
        tracing::info!(agent = %agent, session = %session_id, seconds = started.elapsed().as_secs(),
            "terminal session closed: {why}");
    });
}

/// The `101 Switching Protocols` answer accepting the client's WebSocket `key` with
/// `protocol`.
fn switching_protocols(key: &str, protocol: &'static str) -> Response<Body> {
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut r = Response::new(full(Vec::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(protocol),
    );
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    r
}

/// Moves frames both ways until one side ends or a time limit passes; says why it ended.
async fn bridge<S>(
    mut ws: WebSocketStream<S>,
    tunnel: TerminalTunnel,
    idle: Duration,
    max: Duration,
) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let TerminalTunnel {
        mut stream,
        to_agent,
    } = tunnel;
    let deadline = tokio::time::Instant::now() + max;
    let mut to_agent = Some(to_agent);
    // Frames from the client and from the agent, for the closing log line.
    let mut frames = (0u64, 0u64);
    let why = loop {
        let step = tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                send_failure(&mut ws, &format!("terminal session closed after the maximum of {max}", max = text::duration(max))).await;
                ControlFlow::Break(format!("maximum duration {max} reached", max = text::duration(max)))
            }
            _ = tokio::time::sleep(idle) => {
                send_failure(&mut ws, &format!("terminal session closed after {idle} without input or output", idle = text::duration(idle))).await;
                ControlFlow::Break(format!("idle for {idle}", idle = text::duration(idle)))
            }
            from_client = ws.next() => client_to_agent(from_client, &mut to_agent, &mut frames.0).await,
            from_agent = stream.message() => agent_to_client(&mut ws, from_agent, &mut frames.1).await,
        };
        if let ControlFlow::Break(why) = step {
            break why;
        }
    };
    drop(to_agent);
    close_client(&mut ws).await;
    format!(
        "{why} ({} frames from the client, {} from the agent)",
        frames.0, frames.1
    )
}

/// Sends the client a Failure status on the error channel saying why the session ends.
async fn send_failure<S>(ws: &mut WebSocketStream<S>, message: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let _ = ws
        .send(Message::Binary(failure_frame(message).into()))
        .await;
}

/// Passes one message of the client on toward the container (stdin, resize and close
/// only), counting it; `Break` with the reason when the session ends.
async fn client_to_agent(
    from_client: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
    to_agent: &mut Option<tokio::sync::mpsc::Sender<Result<TerminalFrame, tonic::Status>>>,
    frames: &mut u64,
) -> ControlFlow<String> {
    match from_client {
        Some(Ok(Message::Binary(b))) => {
            let Some((&channel, data)) = b.split_first() else {
                return ControlFlow::Continue(());
            };
            tracing::debug!(
                channel,
                bytes = data.len(),
                "terminal frame from the client"
            );
            *frames += 1;
            // Only stdin, resize and close travel toward the container.
            if !matches!(channel, 0 | 4 | 255) {
                return ControlFlow::Continue(());
            }
            let frame = TerminalFrame {
                session_id: String::new(),
                channel: channel.into(),
                data: data.to_vec(),
            };
            if let Some(tx) = to_agent
                && tx.send(Ok(frame)).await.is_err()
            {
                return ControlFlow::Break("the agent ended the session".into());
            }
            ControlFlow::Continue(())
        }
        Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
            // The client is gone: ending our side tells the agent to stop.
            *to_agent = None;
            ControlFlow::Break("the client closed the session".into())
        }
        Some(Ok(_)) => ControlFlow::Continue(()),
    }
}

/// Passes one frame of the agent on to the client, counting it; `Break` with the reason
/// when the session ends.
async fn agent_to_client<S>(
    ws: &mut WebSocketStream<S>,
    from_agent: Result<Option<TerminalFrame>, tonic::Status>,
    frames: &mut u64,
) -> ControlFlow<String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    match from_agent {
        Ok(Some(f)) => {
            let Ok(channel) = u8::try_from(f.channel) else {
                return ControlFlow::Continue(());
            };
            tracing::debug!(
                channel,
                bytes = f.data.len(),
                "terminal frame to the client"
            );
            *frames += 1;
            let mut out = Vec::with_capacity(f.data.len() + 1);
            out.push(channel);
            out.extend_from_slice(&f.data);
            if ws.send(Message::Binary(out.into())).await.is_err() {
                return ControlFlow::Break("the client went away".into());
            }
            ControlFlow::Continue(())
        }
        Ok(None) => ControlFlow::Break("the command ended".into()),
        Err(e) => {
            send_failure(
                ws,
                &format!("the agent's connection ended: {}", e.message()),
            )
            .await;
            ControlFlow::Break("the agent's connection ended".into())
        }
    }
}

/// Closes the client's WebSocket normally and lets it answer the close, briefly.
async fn close_client<S>(ws: &mut WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let _ = ws
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })))
        .await;
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    use argocd_agent_proto::prost::Message as _;
    use bytes::Bytes;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use tokio::sync::mpsc;

    /// A frame as gRPC puts it on the wire (uncompressed, length-prefixed).
    fn grpc(f: TerminalFrame) -> Result<Frame<Bytes>, std::convert::Infallible> {
        let body = f.encode_to_vec();
        let mut out = vec![0u8];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        Ok(Frame::data(out.into()))
    }

    fn frame(channel: u32, data: &[u8]) -> TerminalFrame {
        TerminalFrame {
            session_id: String::new(),
            channel,
            data: data.to_vec(),
        }
    }

    #[tokio::test]
    async fn frames_cross_both_ways_and_an_idle_session_is_closed_with_a_reason() {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let server = WebSocketStream::from_raw_socket(server_io, Role::Server, None).await;
        let mut client = WebSocketStream::from_raw_socket(client_io, Role::Client, None).await;
        let (agent_tx, agent_rx) = mpsc::channel(8);
        let stream = tonic::Streaming::new_request(
            tonic_prost::ProstDecoder::<TerminalFrame>::default(),
            StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(agent_rx)),
            None,
            None,
        );
        let (to_agent, mut at_agent) = mpsc::channel(8);
        let bridged = tokio::spawn(bridge(
            server,
            TerminalTunnel { stream, to_agent },
            Duration::from_millis(300),
            Duration::from_secs(60),
        ));
        // Agent -> client, channel byte first.
        agent_tx.send(grpc(frame(1, b"hi\n"))).await.unwrap();
        let m = client.next().await.unwrap().unwrap();
        assert_eq!(m.into_data().as_ref(), b"\x01hi\n");
        // Client -> agent: stdin, resize and close pass; output channels do not.
        for f in [&b"\x00x"[..], b"\x01y", b"\x04{}", b"\xff\x00"] {
            client
                .send(Message::Binary(f.to_vec().into()))
                .await
                .unwrap();
        }
        let got: Vec<(u32, Vec<u8>)> = [
            at_agent.recv().await.unwrap().unwrap(),
            at_agent.recv().await.unwrap().unwrap(),
            at_agent.recv().await.unwrap().unwrap(),
        ]
        .into_iter()
        .map(|f| (f.channel, f.data))
        .collect();
        assert_eq!(
            got,
            [(0, b"x".to_vec()), (4, b"{}".to_vec()), (255, vec![0])]
        );
        // Then nothing either way: the client is told why, and the session closes.
        let m = client.next().await.unwrap().unwrap().into_data();
        assert_eq!(m[0], ERROR_CHANNEL);
        let status: serde_json::Value = serde_json::from_slice(&m[1..]).unwrap();
        assert_eq!(status["status"], "Failure");
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .contains("without input or output")
        );
        while let Some(Ok(_)) = client.next().await {}
        let why = bridged.await.unwrap();
        assert!(why.starts_with("idle"), "{why}");
        // The agent's side ended with the session.
        assert!(at_agent.recv().await.is_none());
    }

    #[test]
    fn the_newest_offered_subprotocol_is_chosen() {
        assert_eq!(
            choose_protocol("v4.channel.k8s.io, v5.channel.k8s.io"),
            Some("v5.channel.k8s.io")
        );
        assert_eq!(
            choose_protocol("v4.channel.k8s.io"),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(
            choose_protocol("channel.k8s.io, base64.channel.k8s.io"),
            None
        );
        assert_eq!(choose_protocol(""), None);
    }

    #[test]
    fn exec_parameters_follow_the_kubernetes_query() {
        let r = request(
            "command=sh&command=-c&command=echo%20hi&container=app&stdin=true&tty=true&stderr=false",
            "s",
            "ns",
            "pod",
        );
        assert_eq!(r.command, ["sh", "-c", "echo hi"]);
        assert_eq!(r.container, "app");
        assert!(r.stdin && r.tty && r.stdout && !r.stderr);
        assert_eq!(r.session_id, "s");
    }
}
