//! Streams an agent opens on request: container logs and exec sessions of the resource
//! proxy. The principal never dials an agent, so for a log or an exec it sends a
//! `log-request`/`terminal-request` event with a fresh id and waits here for the agent to
//! open `Tunnel.Logs`/`Tunnel.Terminal` naming that id.
//!
//! An id is bound to the agent it was sent to: a stream naming it is accepted only from
//! that agent's identity (authenticated and mapped like the event stream), once, and only
//! while the request waits. Another agent presenting the id — a replayed or guessed session
//! UUID — is refused and counted (`argocd_principal_auth_failures_total{reason="WrongAgent"}`),
//! and the waiting request stays for its own agent.

use argocd_agent_identity::text::quoted;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use argocd_agent_domain::AgentName;
use argocd_agent_domain::mapping::LiveRules;
use argocd_agent_proto::eventstream::tunnel_server::Tunnel;
use argocd_agent_proto::eventstream::{
    LogClosed, LogMessage, LogStart, TerminalFrame, log_message,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::Authenticator;

/// Frames buffered toward the agent of one exec session.
const TERMINAL_BUFFER: usize = 64;

/// A log stream the agent opened: its first message and the rest. Dropping (or sending on)
/// `closed` answers the agent's call, which ends its side.
pub struct LogTunnel {
    /// The first message: the `log-request` it answers, and the HTTP status, content type
    /// and body of the log request on the agent's cluster (anything but 200 ends the log).
    pub start: LogStart,
    /// The messages after `start` (log data, then the end).
    pub stream: Streaming<LogMessage>,
    /// Ends the agent's `Tunnel.Logs` call when sent on or dropped.
    pub closed: oneshot::Sender<()>,
}

/// An exec session the agent opened: frames from it, and the sender of frames to it.
pub struct TerminalTunnel {
    /// The agent's frames after the first (which named the session), by channel as on the
    /// Kubernetes exec WebSocket.
    pub stream: Streaming<TerminalFrame>,
    /// Frames to the agent (stdin, resize, close); dropping it ends the agent's call.
    pub to_agent: mpsc::Sender<Result<TerminalFrame, Status>>,
}

enum Attached {
    Log(LogTunnel),
    Terminal(TerminalTunnel),
}

struct Waiting {
    agent: AgentName,
    tx: oneshot::Sender<Attached>,
}

/// Requests waiting for their agent's stream, by request id.
#[derive(Default)]
pub struct Tunnels {
    waiting: Mutex<HashMap<String, Waiting>>,
}

/// Where a waiting request's stream arrives. Dropping it forgets the request.
pub struct Expected<T> {
    id: String,
    tunnels: Arc<Tunnels>,
    rx: oneshot::Receiver<Attached>,
    _kind: std::marker::PhantomData<T>,
}

impl<T> Drop for Expected<T> {
    fn drop(&mut self) {
        self.tunnels.lock().remove(&self.id);
    }
}

impl Expected<LogTunnel> {
    /// The agent's log stream (`None`: the request was dropped).
    pub async fn arrived(mut self) -> Option<LogTunnel> {
        match (&mut self.rx).await.ok()? {
            Attached::Log(t) => Some(t),
            Attached::Terminal(_) => None,
        }
    }
}

impl Expected<TerminalTunnel> {
    /// The agent's exec stream (`None`: the request was dropped).
    pub async fn arrived(mut self) -> Option<TerminalTunnel> {
        match (&mut self.rx).await.ok()? {
            Attached::Terminal(t) => Some(t),
            Attached::Log(_) => None,
        }
    }
}

/// Why a stream was not attached.
#[derive(Debug, PartialEq, Eq)]
pub enum AttachError {
    /// No request with that id waits (finished, timed out, already attached, never sent).
    Unknown,
    /// The id was sent to another agent.
    WrongAgent {
        /// The agent the request was sent to.
        expected: AgentName,
    },
}

impl Tunnels {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiting>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn expect<T>(self: &Arc<Self>, id: &str, agent: &AgentName) -> Expected<T> {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(
            id.to_owned(),
            Waiting {
                agent: agent.clone(),
                tx,
            },
        );
        Expected {
            id: id.to_owned(),
            tunnels: self.clone(),
            rx,
            _kind: std::marker::PhantomData,
        }
    }

    /// Waits for `agent` to open the log stream of request `id`.
    pub fn expect_log(self: &Arc<Self>, id: &str, agent: &AgentName) -> Expected<LogTunnel> {
        self.expect(id, agent)
    }

    /// Waits for `agent` to open the exec stream of session `id`.
    pub fn expect_terminal(
        self: &Arc<Self>,
        id: &str,
        agent: &AgentName,
    ) -> Expected<TerminalTunnel> {
        self.expect(id, agent)
    }

    fn attach(&self, id: &str, agent: &AgentName, stream: Attached) -> Result<(), AttachError> {
        let mut waiting = self.lock();
        match waiting.get(id) {
            None => return Err(AttachError::Unknown),
            Some(w) if &w.agent != agent => {
                return Err(AttachError::WrongAgent {
                    expected: w.agent.clone(),
                });
            }
            Some(_) => {}
        }
        let Some(w) = waiting.remove(id) else {
            return Err(AttachError::Unknown);
        };
        w.tx.send(stream).map_err(|_| AttachError::Unknown)
    }

    /// Requests still waiting for their stream.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no request waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `Tunnel` implementation.
pub struct TunnelService {
    /// The requests waiting for their agent's stream.
    pub tunnels: Arc<Tunnels>,
    /// The mapping rules that make a caller an agent (as on the event stream).
    pub rules: Arc<LiveRules>,
    /// Identifies each stream's caller.
    pub auth: Authenticator,
    /// The agents (and the blocklist).
    pub sessions: Arc<crate::sessions::Sessions>,
    /// Where refused streams are counted (`argocd_principal_auth_failures_total`).
    pub metrics: crate::metrics::Metrics,
}

impl TunnelService {
    fn refuse(&self, agent: &AgentName, what: &str, id: &str, err: AttachError) -> Status {
        match err {
            AttachError::Unknown => {
                tracing::warn!(agent = %agent, id = %quoted(&id), "{what} stream refused: no such request is waiting");
                Status::not_found(format!(
                    "no {what} request {id} is waiting",
                    id = quoted(&id)
                ))
            }
            AttachError::WrongAgent { expected } => {
                self.metrics.auth_failed("WrongAgent");
                tracing::warn!(agent = %agent, expected = %expected, id = %quoted(&id),
                    "{what} stream refused: the request was sent to another agent");
                Status::permission_denied(format!(
                    "{what} request {id} was not sent to agent {agent}",
                    id = quoted(&id)
                ))
            }
        }
    }
}

#[tonic::async_trait]
impl Tunnel for TunnelService {
    async fn logs(
        &self,
        request: Request<Streaming<LogMessage>>,
    ) -> Result<Response<LogClosed>, Status> {
        let (identity, _) = crate::auth::identify_agent(
            &self.auth,
            &self.rules,
            &self.sessions,
            &self.metrics,
            &request,
        )?;
        let mut stream = request.into_inner();
        let start = match stream.message().await? {
            Some(LogMessage {
                message: Some(log_message::Message::Start(start)),
            }) => start,
            _ => {
                return Err(Status::invalid_argument(
                    "the first message must be `start`",
                ));
            }
        };
        let id = start.request_id.clone();
        let (closed, done) = oneshot::channel();
        self.tunnels
            .attach(
                &id,
                &identity.agent,
                Attached::Log(LogTunnel {
                    start,
                    stream,
                    closed,
                }),
            )
            .map_err(|e| self.refuse(&identity.agent, "log", &id, e))?;
        // The reader is gone (or the log ended): the agent's call ends.
        let _ = done.await;
        Ok(Response::new(LogClosed {}))
    }

    type TerminalStream = ReceiverStream<Result<TerminalFrame, Status>>;

    async fn terminal(
        &self,
        request: Request<Streaming<TerminalFrame>>,
    ) -> Result<Response<Self::TerminalStream>, Status> {
        let (identity, _) = crate::auth::identify_agent(
            &self.auth,
            &self.rules,
            &self.sessions,
            &self.metrics,
            &request,
        )?;
        let mut stream = request.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the first frame must name the session"))?;
        let id = first.session_id;
        let (to_agent, rx) = mpsc::channel(TERMINAL_BUFFER);
        self.tunnels
            .attach(
                &id,
                &identity.agent,
                Attached::Terminal(TerminalTunnel { stream, to_agent }),
            )
            .map_err(|e| self.refuse(&identity.agent, "terminal", &id, e))?;
        tracing::info!(agent = %identity.agent, session = %id, "terminal session attached");
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(n: &str) -> AgentName {
        AgentName::new(n).unwrap()
    }

    fn terminal() -> (Attached, mpsc::Receiver<Result<TerminalFrame, Status>>) {
        let (tx, rx) = mpsc::channel(1);
        (
            Attached::Terminal(TerminalTunnel {
                stream: Streaming::new_empty(
                    tonic_prost::ProstDecoder::<TerminalFrame>::default(),
                    http_body_util::Empty::<bytes::Bytes>::new(),
                ),
                to_agent: tx,
            }),
            rx,
        )
    }

    #[tokio::test]
    async fn a_session_is_attached_once_and_only_by_its_agent() {
        let tunnels = Arc::new(Tunnels::default());
        let expected = tunnels.expect_terminal("s1", &agent("a"));
        let (t, _rx) = terminal();
        assert_eq!(
            tunnels.attach("s1", &agent("b"), t),
            Err(AttachError::WrongAgent {
                expected: agent("a")
            })
        );
        // Still waiting for its own agent after the refusal.
        assert_eq!(tunnels.len(), 1);
        let (t, _rx) = terminal();
        assert_eq!(tunnels.attach("s1", &agent("a"), t), Ok(()));
        assert!(expected.arrived().await.is_some());
        // Replayed by the same agent: gone.
        let (t, _rx) = terminal();
        assert_eq!(
            tunnels.attach("s1", &agent("a"), t),
            Err(AttachError::Unknown)
        );
        assert!(tunnels.is_empty());
    }

    #[test]
    fn a_dropped_request_is_forgotten() {
        let tunnels = Arc::new(Tunnels::default());
        let expected = tunnels.expect_log("l1", &agent("a"));
        assert_eq!(tunnels.len(), 1);
        drop(expected);
        assert!(tunnels.is_empty());
        let (t, _rx) = terminal();
        assert_eq!(
            tunnels.attach("l1", &agent("a"), t),
            Err(AttachError::Unknown)
        );
    }
}
