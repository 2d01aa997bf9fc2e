//! A session's outbound stream: what the session hands to tonic, bounded and timed, and
//! how the stream ends.

use std::time::Duration;

use argocd_agent_identity::text;
use argocd_agent_proto::cloudevents::CloudEvent;
use futures::Stream;
use tokio::sync::mpsc;
use tonic::Status;

/// Outbound messages buffered per session before the writer waits for the agent.
///
/// The session's channels carry boxed messages: a tokio channel allocates its first block
/// of 32 slots when it is created, so with unboxed messages (~200 bytes for a CloudEvent or
/// a status, ~350 for an event) every idle agent would hold ~17 KiB of empty slots.
pub(super) const OUTBOUND_BUFFER: usize = 64;

/// One outbound message: a CloudEvent, or the status the stream ends with.
pub(super) type OutboundMsg = Result<CloudEvent, Status>;

/// A session's outbound stream, as tonic sends it to the agent.
pub struct OutboundStream(pub(super) mpsc::Receiver<Box<OutboundMsg>>);

impl Stream for OutboundStream {
    type Item = OutboundMsg;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<OutboundMsg>> {
        self.0.poll_recv(cx).map(|m| m.map(|b| *b))
    }
}

/// A session's outbound stream, and how long the agent may take to accept one event: an
/// agent that never reads (HTTP/2 flow control stops, then the buffer fills) ends its
/// session instead of holding it, and the agent's queue, forever.
pub(super) struct Outbound {
    pub(super) tx: mpsc::Sender<Box<OutboundMsg>>,
    pub(super) send_timeout: Duration,
}

/// Why an outbound event could not be handed to the agent's stream.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SendFailure {
    /// The stream is gone.
    Closed,
    /// The agent took nothing for the send timeout.
    NotReading,
}

impl Outbound {
    /// Hands one message to the stream, waiting at most the send timeout for room.
    pub(super) async fn send(&self, msg: OutboundMsg) -> Result<(), SendFailure> {
        match tokio::time::timeout(self.send_timeout, self.tx.send(Box::new(msg))).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(SendFailure::Closed),
            Err(_) => Err(SendFailure::NotReading),
        }
    }
}

/// Logs how a session ended and tells the agent, unless its connection is gone.
pub(super) async fn finish(tx: &Outbound, result: Result<(), Status>) {
    match result {
        Err(status) if argocd_agent_identity::transport::is_connection_loss(&status) => {
            tracing::info!(reason = %text::quoted(status.message()), "connection to the agent lost");
        }
        Err(status) => {
            tracing::warn!(code = text::status_code(status.code()), message = %text::quoted(status.message()), "session ended with error");
            // Bounded: an agent that does not read never gets it.
            let _ = tokio::time::timeout(Duration::from_secs(5), tx.tx.send(Box::new(Err(status))))
                .await;
        }
        Ok(()) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_agent_that_takes_nothing_fails_the_send_after_the_timeout() {
        let (tx, mut rx) = mpsc::channel(1);
        let out = Outbound {
            tx,
            send_timeout: Duration::from_millis(200),
        };
        let msg = || Ok(CloudEvent::default());
        assert_eq!(out.send(msg()).await, Ok(()));
        // The buffer is full and nobody reads: the send gives up, it does not wait forever.
        let started = std::time::Instant::now();
        assert_eq!(out.send(msg()).await, Err(SendFailure::NotReading));
        assert!(started.elapsed() >= Duration::from_millis(200));
        // Once the agent reads, sends go through again; once it is gone, they fail at once.
        assert!(rx.recv().await.is_some());
        assert_eq!(out.send(msg()).await, Ok(()));
        drop(rx);
        assert_eq!(out.send(msg()).await, Err(SendFailure::Closed));
    }
}
