//! Serving the principal's log and terminal requests (`log-request`, `terminal-request`):
//! a stream slot, then the log or exec stream on its own task, on a tunnel the agent opens.

use argocd_agent_domain::{Event, Payload};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Host, Tunnel, entry, exec, logs, refuse_soon};
use crate::error::SessionError;

/// Starts serving a log or terminal request from the principal (without holding up the
/// stream): answers go to `out`, the stream ends with `connection`.
pub fn serve(
    spoke: &impl Host,
    event: Event,
    out: &mpsc::Sender<Event>,
    connection: &CancellationToken,
    tunnel: impl FnOnce() -> Result<Tunnel, SessionError>,
) {
    let Some((proxy, source, tasks)) = entry(spoke, &event, out) else {
        return;
    };
    let id = event.id;
    let what = match &event.payload {
        Payload::LogRequest(_) => "log",
        Payload::TerminalRequest(_) => "exec",
        _ => {
            let why = "not a log or terminal request";
            refuse_soon(&tasks, out, &source, &id, 400, why);
            return;
        }
    };
    let Some(slot) = proxy.try_stream_slot() else {
        proxy.count(what, "error");
        let why = "too many log and exec streams at once";
        refuse_soon(&tasks, out, &source, &id, 429, why);
        return;
    };
    let apps = spoke.apps();
    let out = out.clone();
    let tunnel = tunnel();
    let connection = connection.clone();
    tasks.spawn(async move {
        match event.payload {
            Payload::LogRequest(req) => {
                logs::serve(&proxy, &apps, tunnel, &source, &id, req, &out, &connection).await
            }
            Payload::TerminalRequest(req) => {
                exec::serve(&proxy, &apps, tunnel, &source, &id, req, &out, &connection).await
            }
            _ => {}
        }
        drop(slot);
    });
}
