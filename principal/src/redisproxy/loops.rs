//! The loops that move frames: replies and out-of-band frames to the client, the hub
//! Redis's replies into their slots, and an agent subscription's pushes.

use argocd_agent_identity::text;
use std::ops::ControlFlow;
use std::sync::Arc;

use argocd_agent_domain::{Event, Payload};
use argocd_agent_proto::eventstream::redis_response;
use argocd_agent_redis::{FrameReader, RespError};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::reply::{Out, lock};
use super::state::*;

/// The message one push of an agent's subscription carries (`None`: not a Redis answer,
/// skipped); `Break` when the agent ended the subscription.
pub(super) fn pushed_message(push: Event, key: &str) -> ControlFlow<(), Option<Bytes>> {
    let Payload::RedisResponse(r) = push.payload else {
        return ControlFlow::Continue(None);
    };
    match r.result {
        Some(redis_response::Result::Value(v)) => ControlFlow::Continue(Some(Bytes::from(v))),
        Some(redis_response::Result::Error(e)) => {
            tracing::warn!(key = %key, error = %text::quoted(&e), "agent ended a subscription");
            ControlFlow::Break(())
        }
        _ => ControlFlow::Continue(Some(Bytes::new())),
    }
}

/// Writes replies in command order, and out-of-band frames as they come.
pub(super) async fn write_client<W: AsyncWrite + Unpin>(
    mut w: W,
    mut slots: mpsc::Receiver<oneshot::Receiver<Out>>,
    mut oob: mpsc::Receiver<Bytes>,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    let mut current: Option<oneshot::Receiver<Out>> = None;
    loop {
        tokio::select! {
            biased;
            Some(frame) = oob.recv() => {
                w.write_all(&frame).await?;
                w.flush().await?;
            }
            reply = async { current.as_mut().expect("guarded").await }, if current.is_some() => {
                current = None;
                if let Ok(out) = reply {
                    w.write_all(&out.encode(shared.protocol())).await?;
                    w.flush().await?;
                }
            }
            next = slots.recv(), if current.is_none() => match next {
                Some(rx) => current = Some(rx),
                None => {
                    w.shutdown().await?;
                    return Ok(());
                }
            },
        }
    }
}

/// Reads the hub Redis's frames: each fills the oldest waiting slot, except out-of-band
/// pushes and everything after the connection entered pub/sub mode.
pub(super) async fn read_upstream<R: AsyncRead + Unpin>(
    mut reader: FrameReader<R>,
    shared: Arc<Shared>,
    oob: mpsc::Sender<Bytes>,
) -> Result<(), RespError> {
    let mut pubsub = false;
    loop {
        // The protocol is chosen when the bytes are there: the slot of the command they
        // answer is always queued before the command is sent.
        let head = lock(&shared.upstream).front().map(|s| s.kind);
        let protocol = match head {
            Some(SlotKind::Hello(p, _)) => p,
            _ => shared.protocol(),
        };
        let Some(frame) = reader.decode(protocol)? else {
            if !reader.fill().await? {
                return Ok(());
            }
            continue;
        };
        if pubsub {
            if oob.send(frame.raw).await.is_err() {
                return Ok(());
            }
            continue;
        }
        let slot = {
            let mut queue = lock(&shared.upstream);
            match queue.front().map(|s| s.kind) {
                Some(SlotKind::Subscribe | SlotKind::PubSubReply) => queue.pop_front(),
                _ if frame.is_push() => None,
                Some(_) => queue.pop_front(),
                None => None,
            }
        };
        match slot {
            Some(slot) => {
                let ok = !frame.is_error();
                match slot.kind {
                    SlotKind::Subscribe if ok => pubsub = true,
                    SlotKind::Hello(p, auth) => {
                        if ok {
                            *lock(&shared.protocol) = p;
                        }
                        if auth {
                            shared.auth_answered(ok.then_some(true));
                        }
                    }
                    SlotKind::Auth => shared.auth_answered(ok.then_some(true)),
                    // Back to the default user, who needs a password here.
                    SlotKind::Reset => shared.auth_answered(ok.then_some(false)),
                    _ => {}
                }
                let _ = slot.tx.send(Out::Raw(frame.raw));
            }
            None => {
                if oob.send(frame.raw).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}
