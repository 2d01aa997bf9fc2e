//! `terminal-request`: an exec session on this cluster, bridged to a `Tunnel.Terminal`
//! stream the agent opens. Frames are numbered as the Kubernetes `v5.channel.k8s.io`
//! protocol numbers its channels.
//!
//! The agent's first frame carries only the request's `session_id` (channel 0, no data).
//! From the principal: channel 0 is written to stdin, 4 resizes the terminal
//! (`{"Width":w,"Height":h}`, with a tty), 255 with data `[0]` closes stdin. To the
//! principal: stdout (1), stderr (2), and last channel 3 with the exec's final
//! `metav1.Status` as JSON (`{"metadata":{},"status":"Success"}` on success), after which
//! the agent ends its side. An exec that fails to start gets a Failure Status on channel 3.

use argocd_agent_domain::Event;
use argocd_agent_identity::text;
use argocd_agent_proto::eventstream::{TerminalFrame, TerminalRequest};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams, TerminalSize};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::{Answer, SpokeProxy, Tunnel, response_event};
use crate::error::SessionError;

/// Channel of the frames from the principal written to the container's stdin.
pub const STDIN: u32 = 0;
/// Channel of the container's stdout.
pub const STDOUT: u32 = 1;
/// Channel of the container's stderr.
pub const STDERR: u32 = 2;
/// Channel of the last frame to the principal: the exec's final `metav1.Status` as JSON.
pub const STATUS: u32 = 3;
/// Channel of a terminal resize from the principal (`{"Width":w,"Height":h}`).
pub const RESIZE: u32 = 4;
/// Channel of a close from the principal; data `[0]` closes stdin.
pub const CLOSE: u32 = 255;

/// Frames waiting for the gRPC stream.
const TUNNEL_BUFFER: usize = 8;
/// Largest stdout/stderr chunk per frame.
const READ_CHUNK: usize = 32 * 1024;
/// How long the agent waits for the principal to end its side after the agent ended.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn frame(channel: u32, data: Vec<u8>) -> TerminalFrame {
    TerminalFrame {
        session_id: String::new(),
        channel,
        data,
    }
}

/// The channel-3 body for the exec's final status: `{"metadata":{},"status":"Success"}`
/// on success, the failure Status as the cluster sent it otherwise.
pub fn status_json(status: Option<&Status>) -> Vec<u8> {
    let mut v = match status {
        Some(s) if s.status.as_deref() == Some("Success") => {
            json!({"metadata": {}, "status": "Success"})
        }
        Some(s) => serde_json::to_value(s).unwrap_or_else(|_| failure("exec failed")),
        None => failure("the exec ended without a status"),
    };
    if let Some(map) = v.as_object_mut() {
        map.entry("metadata").or_insert_with(|| json!({}));
    }
    v.to_string().into_bytes()
}

/// A Failure Status with `message`.
pub fn failure(message: &str) -> Value {
    json!({"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError", "code": 500})
}

/// The Status of an exec that did not start.
fn start_failure(e: &kube::Error) -> Vec<u8> {
    let v = match e {
        kube::Error::Api(s) => serde_json::to_value(s).unwrap_or_else(|_| failure("exec failed")),
        other => failure(&format!("exec failed to start: {other}")),
    };
    let mut v = v;
    if let Some(map) = v.as_object_mut() {
        map.entry("metadata").or_insert_with(|| json!({}));
        map.insert("status".into(), json!("Failure"));
    }
    v.to_string().into_bytes()
}

/// A resize frame's `{"Width":w,"Height":h}`.
pub fn parse_resize(data: &[u8]) -> Option<TerminalSize> {
    let v: Value = serde_json::from_slice(data).ok()?;
    let dim = |k: &str| u16::try_from(v.get(k)?.as_u64()?).ok();
    Some(TerminalSize {
        width: dim("Width")?,
        height: dim("Height")?,
    })
}

/// The exec parameters of a request (a tty carries stderr on stdout).
pub fn attach_params(req: &TerminalRequest) -> AttachParams {
    AttachParams {
        container: (!req.container.is_empty()).then(|| req.container.clone()),
        stdin: req.stdin,
        stdout: req.stdout,
        stderr: req.stderr && !req.tty,
        tty: req.tty,
        ..AttachParams::default()
    }
}

/// Serves one `terminal-request` (see the module documentation).
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    proxy: &SpokeProxy,
    apps: &super::Apps,
    tunnel: Result<Tunnel, SessionError>,
    source: &str,
    id: &str,
    req: TerminalRequest,
    out: &mpsc::Sender<Event>,
    connection: &CancellationToken,
) {
    let answer = |a: Answer| out.send(response_event(source, id, a.into_response()));
    if req.command.is_empty() {
        proxy.count("exec", "forbidden");
        let _ = answer(Answer::status(400, "no command given")).await;
        return;
    }
    let tunnel =
        match super::admit_stream(proxy, apps, tunnel, "exec", &req.namespace, &req.pod).await {
            Ok(t) => t,
            Err(refused) => {
                let _ = answer(refused).await;
                return;
            }
        };
    let (tx, rx) = mpsc::channel(TUNNEL_BUFFER);
    let first = TerminalFrame {
        session_id: req.session_id.clone(),
        channel: STDIN,
        data: Vec::new(),
    };
    if tx.send(first).await.is_err() {
        return;
    }
    let mut client = tunnel.client();
    let inbound = tokio::select! {
        _ = connection.cancelled() => return,
        r = client.terminal(tunnel.request(ReceiverStream::new(rx))) => r,
    };
    let mut inbound = match inbound {
        Ok(r) => r.into_inner(),
        Err(status) => {
            tracing::warn!(code = text::status_code(status.code()), message = %text::quoted(status.message()), "the principal refused the exec stream");
            return;
        }
    };
    let api: Api<Pod> = Api::namespaced(proxy.client.clone(), &req.namespace);
    let params = attach_params(&req);
    let started = tokio::select! {
        _ = connection.cancelled() => return,
        r = tokio::time::timeout(proxy.config.timeout, api.exec(&req.pod, req.command.clone(), &params)) => r,
    };
    let process = match started {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            tracing::warn!(namespace = %text::quoted(&req.namespace), pod = %text::quoted(&req.pod), error = %e, "exec failed to start");
            let _ = tx.send(frame(STATUS, start_failure(&e))).await;
            finish(tx, &mut inbound, connection).await;
            return;
        }
        Err(_) => {
            let body = failure("the exec did not start in time")
                .to_string()
                .into_bytes();
            let _ = tx.send(frame(STATUS, body)).await;
            finish(tx, &mut inbound, connection).await;
            return;
        }
    };
    bridge(process, inbound, tx, connection).await;
}

/// Ends the agent's side, then waits (briefly) for the principal to end its side: the
/// frames still queued are only delivered while the call lives (dropping its response
/// would reset the stream).
async fn finish(
    tx: mpsc::Sender<TerminalFrame>,
    inbound: &mut tonic::Streaming<TerminalFrame>,
    connection: &CancellationToken,
) {
    drop(tx);
    let deadline = tokio::time::sleep(CLOSE_WAIT);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => return,
            _ = connection.cancelled() => return,
            msg = inbound.message() => match msg {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            },
        }
    }
}

/// Moves frames between the principal and the exec until the exec ends (then sends its
/// status), the principal ends its side, or the connection ends.
async fn bridge(
    mut process: kube::api::AttachedProcess,
    mut inbound: tonic::Streaming<TerminalFrame>,
    tx: mpsc::Sender<TerminalFrame>,
    connection: &CancellationToken,
) {
    let mut status = process.take_status().map(Box::pin);
    let mut stdin = process.stdin();
    let mut stdout = process.stdout();
    let mut stderr = process.stderr();
    let mut resize = process.terminal_size();
    let mut out_buf = vec![0u8; READ_CHUNK];
    let mut err_buf = vec![0u8; READ_CHUNK];
    let final_status = loop {
        let outputs_done = stdout.is_none() && stderr.is_none();
        let out = tokio::select! {
            _ = connection.cancelled() => None,
            n = read_some(&mut stdout, &mut out_buf) => match n {
                Some(n) => Some(frame(STDOUT, out_buf[..n].to_vec())),
                None => { stdout = None; continue; }
            },
            n = read_some(&mut stderr, &mut err_buf) => match n {
                Some(n) => Some(frame(STDERR, err_buf[..n].to_vec())),
                None => { stderr = None; continue; }
            },
            msg = inbound.message() => match msg {
                Ok(Some(f)) => { on_frame(f, &mut stdin, &mut resize).await; continue; }
                // The principal ended its side: the session is over.
                Ok(None) | Err(_) => None,
            },
            // The status once all output has been passed on (kube resolves it with `None`
            // when the exec's connection ends without one).
            s = async {
                match status.as_mut() {
                    Some(s) => s.await,
                    None => None,
                }
            }, if outputs_done => break s,
        };
        let Some(out) = out else {
            process.abort();
            return;
        };
        if !send_frame(&tx, out, connection).await {
            process.abort();
            return;
        }
    };
    drop(stdin);
    let _ = send_frame(
        &tx,
        frame(STATUS, status_json(final_status.as_ref())),
        connection,
    )
    .await;
    finish(tx, &mut inbound, connection).await;
}

/// Sends a frame to the principal unless the connection ends first; `false`: stop.
async fn send_frame(
    tx: &mpsc::Sender<TerminalFrame>,
    f: TerminalFrame,
    connection: &CancellationToken,
) -> bool {
    tokio::select! {
        sent = tx.send(f) => sent.is_ok(),
        _ = connection.cancelled() => false,
    }
}

/// Reads from an output that is still open; `None` at its end (or when absent: then it
/// never resolves, so the select waits on the others).
async fn read_some<R: tokio::io::AsyncRead + Unpin>(
    r: &mut Option<R>,
    buf: &mut [u8],
) -> Option<usize> {
    match r {
        Some(r) => match r.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

/// Handles one frame from the principal.
async fn on_frame<W: tokio::io::AsyncWrite + Unpin>(
    f: TerminalFrame,
    stdin: &mut Option<W>,
    resize: &mut Option<futures::channel::mpsc::Sender<TerminalSize>>,
) {
    match f.channel {
        STDIN => {
            if let Some(w) = stdin
                && !f.data.is_empty()
                && (w.write_all(&f.data).await.is_err() || w.flush().await.is_err())
            {
                *stdin = None;
            }
        }
        RESIZE => {
            if let (Some(size), Some(tx)) = (parse_resize(&f.data), resize.as_mut()) {
                use futures::SinkExt;
                if tx.send(size).await.is_err() {
                    *resize = None;
                }
            }
        }
        CLOSE if f.data.first() == Some(&0) => {
            if let Some(mut w) = stdin.take() {
                let _ = w.shutdown().await;
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_frames() {
        let s = parse_resize(br#"{"Width":120,"Height":40}"#).unwrap();
        assert_eq!((s.width, s.height), (120, 40));
        assert!(parse_resize(b"{}").is_none());
        assert!(parse_resize(b"garbage").is_none());
        assert!(parse_resize(br#"{"Width":-1,"Height":40}"#).is_none());
    }

    #[test]
    fn final_status_json() {
        let ok: Status = serde_json::from_value(json!({"status": "Success"})).unwrap();
        let v: Value = serde_json::from_slice(&status_json(Some(&ok))).unwrap();
        assert_eq!(v, json!({"metadata": {}, "status": "Success"}));
        let failed: Status = serde_json::from_value(json!({
            "status": "Failure", "reason": "NonZeroExitCode", "message": "command terminated with non-zero exit code",
            "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}
        }))
        .unwrap();
        let v: Value = serde_json::from_slice(&status_json(Some(&failed))).unwrap();
        assert_eq!(v["reason"], "NonZeroExitCode");
        assert_eq!(v["details"]["causes"][0]["message"], "3");
        assert_eq!(v["metadata"], json!({}));
        let v: Value = serde_json::from_slice(&status_json(None)).unwrap();
        assert_eq!(v["status"], "Failure");
    }

    #[test]
    fn a_tty_carries_no_separate_stderr() {
        let req = TerminalRequest {
            container: "app".into(),
            stdin: true,
            stdout: true,
            stderr: true,
            tty: true,
            ..Default::default()
        };
        let p = attach_params(&req);
        assert!(p.tty && p.stdin && p.stdout && !p.stderr);
        assert_eq!(p.container.as_deref(), Some("app"));
    }
}
