//! `log-request`: a container log streamed to the principal on a `Tunnel.Logs` stream the
//! agent opens, in whole lines, no faster than the stream takes them.

use argocd_agent_identity::text;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use argocd_agent_domain::Event;
use argocd_agent_proto::eventstream::{LogMessage, LogRequest, LogStart, log_message};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::{Answer, SpokeProxy, Tunnel, response_event};
use crate::error::SessionError;

/// Buffered whole lines are sent at least this often.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// Buffered whole lines are sent once this many bytes are buffered.
pub const FLUSH_BYTES: usize = 32 * 1024;
/// A line longer than this is passed on in pieces.
pub const MAX_LINE: usize = 1024 * 1024;
/// Messages waiting for the gRPC stream: the log is read no faster than it is sent.
const TUNNEL_BUFFER: usize = 4;
/// How long the agent waits for the principal's `LogClosed` after the log ended.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Collects log bytes and hands them on in whole lines.
#[derive(Debug, Default)]
pub struct LineBuffer {
    buf: Vec<u8>,
}

impl LineBuffer {
    /// Appends `data`; returns what to send now: the whole lines once [`FLUSH_BYTES`] are
    /// buffered, or everything once a single line exceeds [`MAX_LINE`].
    pub fn push(&mut self, data: &[u8]) -> Option<Vec<u8>> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= MAX_LINE && !self.buf.contains(&b'\n') {
            return self.finish();
        }
        if self.buf.len() >= FLUSH_BYTES {
            return self.take_lines();
        }
        None
    }

    /// The whole lines buffered (for the periodic flush); a partial line stays.
    pub fn take_lines(&mut self) -> Option<Vec<u8>> {
        let end = self.buf.iter().rposition(|b| *b == b'\n')? + 1;
        let rest = self.buf.split_off(end);
        Some(std::mem::replace(&mut self.buf, rest))
    }

    /// Everything buffered (at the end of the log, where the last line may be cut short
    /// by `limitBytes`).
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        (!self.buf.is_empty()).then(|| std::mem::take(&mut self.buf))
    }
}

/// The log path and query of a request: only the parameters that are set (`tail_lines <
/// 0`, `since_seconds <= 0`, `limit_bytes <= 0` and empty strings are unset).
pub fn log_path(req: &LogRequest) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    if !req.container.is_empty() {
        q.append_pair("container", &req.container);
    }
    if req.follow {
        q.append_pair("follow", "true");
    }
    if req.tail_lines >= 0 {
        q.append_pair("tailLines", &req.tail_lines.to_string());
    }
    if req.since_seconds > 0 {
        q.append_pair("sinceSeconds", &req.since_seconds.to_string());
    }
    if !req.since_time.is_empty() {
        q.append_pair("sinceTime", &req.since_time);
    }
    if req.limit_bytes > 0 {
        q.append_pair("limitBytes", &req.limit_bytes.to_string());
    }
    if req.previous {
        q.append_pair("previous", "true");
    }
    if req.timestamps {
        q.append_pair("timestamps", "true");
    }
    let query = q.finish();
    let path = format!("/api/v1/namespaces/{}/pods/{}/log", req.namespace, req.pod);
    if query.is_empty() {
        path
    } else {
        format!("{path}?{query}")
    }
}

fn start(id: &str, status: u16, content_type: String, body: Vec<u8>) -> LogMessage {
    LogMessage {
        message: Some(log_message::Message::Start(LogStart {
            request_id: id.to_string(),
            status: u32::from(status),
            content_type,
            body,
        })),
    }
}

fn data(chunk: Vec<u8>) -> LogMessage {
    LogMessage {
        message: Some(log_message::Message::Data(chunk)),
    }
}

/// Sends one message, unless the principal answered (the reader went away) or the
/// connection ended first; `false`: stop.
async fn forward<F: Future>(
    tx: &mpsc::Sender<LogMessage>,
    msg: LogMessage,
    call: &mut Pin<&mut F>,
    connection: &CancellationToken,
) -> bool {
    tokio::select! {
        sent = tx.send(msg) => sent.is_ok(),
        _ = call.as_mut() => false,
        _ = connection.cancelled() => false,
    }
}

/// Serves one `log-request` (see the module documentation).
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    proxy: &SpokeProxy,
    apps: &super::Apps,
    tunnel: Result<Tunnel, SessionError>,
    source: &str,
    id: &str,
    req: LogRequest,
    out: &mpsc::Sender<Event>,
    connection: &CancellationToken,
) {
    let answer = |a: Answer| out.send(response_event(source, id, a.into_response()));
    let tunnel =
        match super::admit_stream(proxy, apps, tunnel, "log", &req.namespace, &req.pod).await {
            Ok(t) => t,
            Err(refused) => {
                let _ = answer(refused).await;
                return;
            }
        };
    let Some(response) = get_log(proxy, &req, connection).await else {
        return;
    };
    let (tx, rx) = mpsc::channel(TUNNEL_BUFFER);
    let mut client = tunnel.client();
    let call = client.logs(tunnel.request(ReceiverStream::new(rx)));
    tokio::pin!(call);
    let body = match response {
        Ok(r) if r.status() == http::StatusCode::OK => {
            if !forward(
                &tx,
                start(id, 200, "text/plain".into(), Vec::new()),
                &mut call,
                connection,
            )
            .await
            {
                return;
            }
            r.into_body()
        }
        Ok(r) => {
            let status = r.status().as_u16();
            let failed = super::read_answer(r, proxy.config.max_body)
                .await
                .unwrap_or_else(|f| f.answer());
            let msg = start(id, status, failed.content_type, failed.body.to_vec());
            return answer_only(tx, msg, &mut call, connection).await;
        }
        Err(message) => {
            tracing::warn!(namespace = %text::quoted(&req.namespace), pod = %text::quoted(&req.pod), error = %message, "container log request failed");
            let failed = Answer::status(502, &message.to_string());
            let msg = start(id, 502, failed.content_type, failed.body.to_vec());
            return answer_only(tx, msg, &mut call, connection).await;
        }
    };
    if pump(body, &tx, &mut call, connection).await {
        drop(tx);
        close(&mut call, connection).await;
    }
}

/// Why a container log could not be asked of the cluster (the 502's message).
#[derive(Debug, thiserror::Error)]
enum LogError {
    /// The API server could not be reached.
    #[error("kubernetes API: {0}")]
    Kube(kube::Error),
    /// No answer within the proxy's timeout.
    #[error("the log request timed out")]
    TimedOut,
    /// The request could not be built.
    #[error("invalid log request")]
    Invalid,
}

/// Asks the cluster for the container's log (within the proxy's timeout): the response, or
/// why it failed; `None` when the connection ended first.
async fn get_log(
    proxy: &SpokeProxy,
    req: &LogRequest,
    connection: &CancellationToken,
) -> Option<Result<http::Response<kube::client::Body>, LogError>> {
    let request = super::build_request("GET", &log_path(req), "", None, "", Vec::new())
        .map(|r| proxy.client.send(r));
    Some(match request {
        Ok(send) => tokio::select! {
            _ = connection.cancelled() => return None,
            r = tokio::time::timeout(proxy.config.timeout, send) => match r {
                Ok(r) => r.map_err(LogError::Kube),
                Err(_) => Err(LogError::TimedOut),
            },
        },
        Err(_) => Err(LogError::Invalid),
    })
}

/// Sends the stream's only message (the start of a failed request), then ends the agent's
/// side and waits for the principal to close the stream.
async fn answer_only<F: Future>(
    tx: mpsc::Sender<LogMessage>,
    msg: LogMessage,
    call: &mut Pin<&mut F>,
    connection: &CancellationToken,
) {
    if forward(&tx, msg, call, connection).await {
        drop(tx);
        close(call, connection).await;
    }
}

/// Passes the log on in whole lines; `false` when the principal or the connection ended
/// the stream first.
async fn pump<F: Future>(
    mut body: kube::client::Body,
    tx: &mpsc::Sender<LogMessage>,
    call: &mut Pin<&mut F>,
    connection: &CancellationToken,
) -> bool {
    let mut lines = LineBuffer::default();
    let mut tick = tokio::time::interval(FLUSH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let chunk = tokio::select! {
            _ = connection.cancelled() => return false,
            _ = call.as_mut() => return false,
            frame = body.frame() => match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(bytes) => lines.push(&bytes),
                    Err(_) => None,
                },
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "container log stream ended with an error");
                    break;
                }
                None => break,
            },
            _ = tick.tick() => lines.take_lines(),
        };
        if let Some(chunk) = chunk
            && !forward(tx, data(chunk), call, connection).await
        {
            return false;
        }
    }
    match lines.finish() {
        Some(rest) => forward(tx, data(rest), call, connection).await,
        None => true,
    }
}

/// Waits (briefly) for the principal to close the stream after the agent's side ended.
async fn close<F: Future>(call: &mut Pin<&mut F>, connection: &CancellationToken) {
    tokio::select! {
        _ = call.as_mut() => {}
        _ = connection.cancelled() => {}
        _ = tokio::time::sleep(CLOSE_WAIT) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_passed_on_whole() {
        let mut b = LineBuffer::default();
        assert_eq!(b.push(b"one\ntw"), None);
        assert_eq!(b.take_lines(), Some(b"one\n".to_vec()));
        assert_eq!(b.take_lines(), None);
        assert_eq!(b.push(b"o\nthr"), None);
        assert_eq!(b.take_lines(), Some(b"two\n".to_vec()));
        assert_eq!(b.finish(), Some(b"thr".to_vec()));
        assert_eq!(b.finish(), None);
    }

    #[test]
    fn a_full_buffer_flushes_its_whole_lines() {
        let mut b = LineBuffer::default();
        let mut line = vec![b'x'; 1000];
        line.push(b'\n');
        let mut sent = Vec::new();
        for _ in 0..40 {
            if let Some(chunk) = b.push(&line) {
                sent.push(chunk);
            }
        }
        b.push(b"partial");
        assert_eq!(sent.len(), 1);
        assert!(sent[0].len() >= FLUSH_BYTES && sent[0].ends_with(b"\n"));
        let rest = b.take_lines().unwrap();
        assert_eq!(sent[0].len() + rest.len(), 40 * 1001);
        assert_eq!(b.finish(), Some(b"partial".to_vec()));
    }

    #[test]
    fn an_endless_line_is_cut() {
        let mut b = LineBuffer::default();
        let piece = vec![b'y'; 64 * 1024];
        let mut out = None;
        for _ in 0..16 {
            if let Some(c) = b.push(&piece) {
                out = Some(c);
                break;
            }
        }
        assert_eq!(out.map(|c| c.len()), Some(MAX_LINE));
        assert_eq!(b.finish(), None);
    }

    #[test]
    fn log_paths_carry_only_set_parameters() {
        let req = LogRequest {
            namespace: "ns".into(),
            pod: "web-0".into(),
            tail_lines: -1,
            ..Default::default()
        };
        assert_eq!(log_path(&req), "/api/v1/namespaces/ns/pods/web-0/log");
        let req = LogRequest {
            namespace: "ns".into(),
            pod: "web-0".into(),
            container: "app".into(),
            follow: true,
            tail_lines: 0,
            since_seconds: 30,
            limit_bytes: 0,
            since_time: "2026-11-23T10:00:00Z".into(),
            previous: true,
            timestamps: true,
        };
        assert_eq!(
            log_path(&req),
            "/api/v1/namespaces/ns/pods/web-0/log?container=app&follow=true&tailLines=0&sinceSeconds=30&sinceTime=2026-11-23T10%3A00%3A00Z&previous=true&timestamps=true"
        );
    }
}
