//! `GET pods/<pod>/log` through the proxy: the agent streams the container log on a
//! `Tunnel.Logs` stream (HTTP/2 flow control end to end: a slow reader slows the agent's
//! read of its cluster's log). A followed log survives the agent reconnecting: the proxy
//! keeps the client's response open for `log_resume_timeout`, asks the agent again from the
//! last second it passed on, and drops the lines it already sent ([`LogCursor`]).

// A refusal is the HTTP response to send; it is built once and moved, not worth a box.
#![allow(clippy::result_large_err)]

use argocd_agent_identity::text;
use argocd_agent_identity::text::quoted;
use std::sync::Arc;
use std::time::{Duration, Instant};

use argocd_agent_domain::AgentName;
use argocd_agent_domain::proxy::LogCursor;
use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_proto::eventstream::{LogRequest, log_message};
use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::mpsc;

use super::response::{Body, from_agent, offline, rpc_failure, status};
use super::state::{Admitted, ResourceProxy};
use crate::tunnel::LogTunnel;

/// Chunks buffered toward the client.
const CLIENT_BUFFER: usize = 16;
/// Largest partial line kept while waiting for its newline.
const MAX_PENDING: usize = 2 << 20;

/// The client's log parameters.
#[derive(Debug, Clone, Default, PartialEq)]
struct Params {
    container: String,
    follow: bool,
    tail_lines: Option<i64>,
    since_seconds: Option<i64>,
    since_time: Option<String>,
    limit_bytes: Option<i64>,
    previous: bool,
    timestamps: bool,
}

/// A log parameter that should be a non-negative integer and is not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {} is not a non-negative integer", quoted(.value))]
struct BadParam {
    /// The parameter's name.
    key: String,
    /// Its value.
    value: String,
}

fn params(query: &str) -> Result<Params, BadParam> {
    let mut p = Params::default();
    let flag = |v: &str| matches!(v, "true" | "1");
    let number = |k: &str, v: &str| {
        v.parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| BadParam {
                key: k.to_owned(),
                value: v.to_owned(),
            })
    };
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "container" => p.container = v.into_owned(),
            "follow" => p.follow = flag(&v),
            "tailLines" => p.tail_lines = Some(number(&k, &v)?),
            "sinceSeconds" => p.since_seconds = Some(number(&k, &v)?),
            "sinceTime" => p.since_time = Some(v.into_owned()),
            "limitBytes" => p.limit_bytes = Some(number(&k, &v)?),
            "previous" => p.previous = flag(&v),
            "timestamps" => p.timestamps = flag(&v),
            _ => {}
        }
    }
    Ok(p)
}

impl Params {
    /// The request to the agent: always timestamped; a resumed one starts at the cursor.
    fn request(&self, namespace: &str, pod: &str, resume: Option<String>) -> LogRequest {
        let resumed = resume.is_some();
        LogRequest {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
            container: self.container.clone(),
            follow: self.follow,
            tail_lines: if resumed {
                -1
            } else {
                self.tail_lines.unwrap_or(-1)
            },
            since_seconds: if resumed {
                0
            } else {
                self.since_seconds.unwrap_or(0)
            },
            limit_bytes: if resumed {
                0
            } else {
                self.limit_bytes.unwrap_or(0)
            },
            since_time: resume
                .or_else(|| self.since_time.clone())
                .unwrap_or_default(),
            previous: self.previous,
            timestamps: true,
        }
    }
}

/// Asks the agent for the log; its stream, or the response to answer instead.
async fn open(
    proxy: &ResourceProxy,
    agent: &AgentName,
    link: &argocd_agent_domain::rpc::AgentLink,
    request: LogRequest,
) -> Result<LogTunnel, Response<Body>> {
    let event = Event::new(
        &proxy.parts.source,
        EventType::LogRequest,
        Payload::LogRequest(request),
    );
    let expected = proxy.parts.tunnels.expect_log(&event.id, agent);
    let mut refusal = link
        .request(event, None)
        .await
        .map_err(|e| rpc_failure(agent, e))?;
    let timeout = proxy.parts.config.request_timeout;
    tokio::select! {
        tunnel = expected.arrived() => tunnel.ok_or_else(|| offline(agent)),
        answer = refusal.answer(timeout) => Err(match answer {
            Ok(Event { payload: Payload::ResourceResponse(r), .. }) => from_agent(&r),
            Ok(_) => status(StatusCode::BAD_GATEWAY, "InternalError", "unexpected answer"),
            Err(e) => rpc_failure(agent, e),
        }),
    }
}

/// How a tunnel's stream ended.
enum Ended {
    /// The log ended (not followed, or the container is gone).
    Done,
    /// The client went away.
    ClientGone,
    /// The agent's connection broke.
    Broken,
}

/// Passes a tunnel's lines to the client, dropping those already passed on.
async fn pump(
    tunnel: LogTunnel,
    cursor: &mut LogCursor,
    timestamps: bool,
    tx: &mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>,
    pending: &mut Vec<u8>,
) -> Ended {
    let LogTunnel {
        mut stream, closed, ..
    } = tunnel;
    let ended = loop {
        let chunk = tokio::select! {
            _ = tx.closed() => break Ended::ClientGone,
            m = stream.message() => match m {
                Ok(Some(m)) => m,
                Ok(None) => break Ended::Done,
                Err(_) => break Ended::Broken,
            },
        };
        let Some(log_message::Message::Data(data)) = chunk.message else {
            continue;
        };
        pending.extend_from_slice(&data);
        let mut out = Vec::new();
        while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            if !cursor.accept(&line) {
                continue;
            }
            match (
                timestamps,
                argocd_agent_domain::proxy::split_timestamp(&line),
            ) {
                (false, Some((_, text))) => out.extend_from_slice(text),
                _ => out.extend_from_slice(&line),
            }
        }
        // A line longer than any kubelet writes (the agent cuts its lines at 1 MiB) is
        // passed on as it is, so a peer that never sends a newline cannot grow the buffer.
        if pending.len() > MAX_PENDING {
            out.append(pending);
        }
        if !out.is_empty() && tx.send(Ok(Frame::data(Bytes::from(out)))).await.is_err() {
            break Ended::ClientGone;
        }
    };
    let _ = closed.send(());
    ended
}

/// Serves one log request.
pub(super) async fn serve(
    proxy: Arc<ResourceProxy>,
    admitted: Admitted,
    namespace: String,
    pod: String,
    query: &str,
) -> Response<Body> {
    let p = match params(query) {
        Ok(p) => p,
        Err(why) => return status(StatusCode::BAD_REQUEST, "BadRequest", why.to_string()),
    };
    let Admitted {
        agent,
        link,
        permit,
    } = admitted;
    let first = match open(&proxy, &agent, &link, p.request(&namespace, &pod, None)).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    if first.start.status != 200 {
        return from_agent(&argocd_agent_proto::eventstream::ResourceResponse {
            status: first.start.status,
            content_type: first.start.content_type.clone(),
            body: first.start.body.clone(),
        });
    }
    tracing::info!(agent = %agent, namespace = %text::quoted(&namespace), pod = %text::quoted(&pod), follow = p.follow, "log stream opened");
    let (tx, rx) = mpsc::channel(CLIENT_BUFFER);
    let tasks = proxy.parts.tasks.clone();
    tasks.spawn(async move {
        let _permit = permit;
        let mut cursor = LogCursor::default();
        let mut pending = Vec::new();
        let mut tunnel = first;
        let mut session = link.session_id;
        loop {
            match pump(tunnel, &mut cursor, p.timestamps, &tx, &mut pending).await {
                Ended::ClientGone => return,
                Ended::Done | Ended::Broken if !p.follow => return,
                // An agent ends its log streams when its session ends: a followed log that
                // ends while the session it was opened in is gone resumes.
                Ended::Done if proxy.link(&agent).map(|l| l.session_id) == Some(session) => {
                    return;
                }
                Ended::Done | Ended::Broken => {}
            }
            // Followed: wait for the agent to come back, then resume after the last line.
            pending.clear();
            let deadline = Instant::now() + proxy.parts.config.log_resume_timeout;
            tunnel = loop {
                if tx.is_closed() || Instant::now() >= deadline {
                    tracing::info!(agent = %agent, pod = %text::quoted(&pod), "followed log ended: agent did not come back");
                    return;
                }
                if let Some(link) = proxy.link(&agent) {
                    cursor.resume();
                    let request = p.request(&namespace, &pod, cursor.since_time());
                    match open(&proxy, &agent, &link, request).await {
                        Ok(t) if t.start.status == 200 => {
                            tracing::info!(agent = %agent, pod = %text::quoted(&pod), "followed log resumed after reconnect");
                            session = link.session_id;
                            break t;
                        }
                        Ok(_) | Err(_) => return,
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
        }
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed();
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_parameters_are_read_and_checked() {
        let p =
            params("container=app&follow=true&tailLines=5&timestamps=1&sinceSeconds=60").unwrap();
        assert_eq!(p.container, "app");
        assert!(p.follow && p.timestamps);
        assert_eq!(p.tail_lines, Some(5));
        assert_eq!(p.since_seconds, Some(60));
        assert!(params("tailLines=-1").is_err());
        assert!(params("limitBytes=x").is_err());
    }

    #[test]
    fn the_agent_is_asked_for_timestamps_and_a_resume_starts_at_the_cursor() {
        let p = params("tailLines=5&sinceSeconds=60&limitBytes=10").unwrap();
        let first = p.request("ns", "pod", None);
        assert!(first.timestamps);
        assert_eq!(
            (first.tail_lines, first.since_seconds, first.limit_bytes),
            (5, 60, 10)
        );
        let resumed = p.request("ns", "pod", Some("2026-11-23T10:00:01Z".into()));
        assert_eq!(resumed.since_time, "2026-11-23T10:00:01Z");
        assert_eq!(
            (
                resumed.tail_lines,
                resumed.since_seconds,
                resumed.limit_bytes
            ),
            (-1, 0, 0)
        );
        assert_eq!(params("").unwrap().request("n", "p", None).tail_lines, -1);
    }
}
