//! Serving a resource-proxy event from the principal: admits it against the proxy's slots
//! and hands it to the request handler, or to the log or exec stream.

use std::sync::Arc;

use argocd_agent_domain::{Event, Payload};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Answer, Apps, SpokeProxy, Tunnel, exec, logs, response_event, rules};
use crate::error::SessionError;

/// What serving a resource-proxy event asks of the spoke (the spoke implements it).
pub trait Host {
    /// CloudEvents `source` of the answers.
    fn source(&self) -> &str;
    /// Where the request handlers run.
    fn tasks(&self) -> &TaskTracker;
    /// The resource proxy, when the agent serves it.
    fn proxy(&self) -> Option<Arc<SpokeProxy>>;
    /// The Applications this spoke holds, by the names their objects carry, with where each
    /// deploys and what it manages.
    fn apps(&self) -> Apps;
}

/// Starts serving a resource-proxy event from the principal (without holding up the
/// stream): answers go to `out`, log and exec streams end with `connection`.
pub fn serve(
    spoke: &impl Host,
    event: Event,
    out: &mpsc::Sender<Event>,
    connection: &CancellationToken,
    tunnel: impl FnOnce() -> Result<Tunnel, SessionError>,
) {
    let source = spoke.source().to_owned();
    let tasks = spoke.tasks().clone();
    let id = event.id.clone();
    let Some(proxy) = spoke.proxy() else {
        let why = "this agent does not serve the resource proxy";
        refuse_soon(&tasks, out, &source, &id, 501, why);
        return;
    };
    let apps = spoke.apps();
    let out = out.clone();
    match event.payload {
        Payload::ResourceRequest(req) => {
            let Some(slot) = proxy.try_request_slot() else {
                proxy.count(rules::method_verb(&req.method), "error");
                let why = "too many resource proxy requests at once";
                refuse_soon(&tasks, &out, &source, &id, 429, why);
                return;
            };
            tasks.spawn(async move {
                let response = proxy.handle_resource(&apps, &req).await;
                drop(slot);
                let _ = out.send(response_event(&source, &id, response)).await;
            });
        }
        payload @ (Payload::LogRequest(_) | Payload::TerminalRequest(_)) => {
            let what = match payload {
                Payload::LogRequest(_) => "log",
                _ => "exec",
            };
            let Some(slot) = proxy.try_stream_slot() else {
                proxy.count(what, "error");
                let why = "too many log and exec streams at once";
                refuse_soon(&tasks, &out, &source, &id, 429, why);
                return;
            };
            let tunnel = tunnel();
            let connection = connection.clone();
            tasks.spawn(async move {
                match payload {
                    Payload::LogRequest(req) => {
                        logs::serve(&proxy, &apps, tunnel, &source, &id, req, &out, &connection)
                            .await
                    }
                    Payload::TerminalRequest(req) => {
                        exec::serve(&proxy, &apps, tunnel, &source, &id, req, &out, &connection)
                            .await
                    }
                    _ => {}
                }
                drop(slot);
            });
        }
        _ => refuse_soon(
            &tasks,
            &out,
            &source,
            &id,
            400,
            "not a resource proxy request",
        ),
    }
}

/// Answers the request `id` with the error `status` and `message` through
/// [`answer_soon`].
fn refuse_soon(
    tasks: &TaskTracker,
    out: &mpsc::Sender<Event>,
    source: &str,
    id: &str,
    status: u16,
    message: &str,
) {
    let answer = Answer::status(status, message);
    answer_soon(
        tasks,
        out,
        response_event(source, id, answer.into_response()),
    );
}

/// Sends an immediate answer (a refusal) without holding up the stream, even when the
/// outbound channel is momentarily full.
fn answer_soon(tasks: &TaskTracker, out: &mpsc::Sender<Event>, event: Event) {
    if let Err(mpsc::error::TrySendError::Full(event)) = out.try_send(event) {
        let out = out.clone();
        tasks.spawn(async move {
            let _ = out.send(event).await;
        });
    }
}
