//! The typed event model and its CloudEvents 1.0 (protobuf) encoding.
//!
//! Every event on the stream is a CloudEvent of type `io.argoproj.argocd-agent.event.<verb>`
//! with the standard `id`, `source` and `time` attributes set. Resource events carry the
//! object as JSON in `binary_data` (`datacontenttype: application/json`) and name it in the
//! extension attributes `resourcekind`, `resourcenamespace` and `resourcename`, so a receiver
//! can authorize an event before it parses the payload.

use argocd_agent_identity::text::quoted;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::Namespace;
use crate::names::check_object_name;
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::cloudevents::cloud_event::cloud_event_attribute_value::Attr;
use argocd_agent_proto::cloudevents::cloud_event::{CloudEventAttributeValue, Data};
use argocd_agent_proto::eventstream::{
    ClusterCacheInfo, ErrorDetail, Hello, LogRequest, RedisRequest, RedisResponse, ResourceRequest,
    ResourceResponse, ResyncState, TerminalRequest, Welcome,
};
use argocd_agent_proto::prost::Message;
use bytes::Bytes;

/// Prefix of every event type.
pub const TYPE_PREFIX: &str = "io.argoproj.argocd-agent.event.";
/// CloudEvents spec version we speak.
pub const SPEC_VERSION: &str = "1.0";
/// Wire protocol version of this build. Peers within
/// [`PROTOCOL_MIN`]..=[`PROTOCOL_VERSION`] are accepted.
pub const PROTOCOL_VERSION: u32 = 1;
/// Oldest wire protocol version this build still accepts.
pub const PROTOCOL_MIN: u32 = 1;
/// gRPC metadata (a trailer) on the status that ends an agent's stream when a principal
/// replica sends the agent elsewhere (rebalancing, handing it over, a lost or stale Lease):
/// value `now`. The agent then reconnects after its initial backoff instead of a grown one,
/// since being redirected is not a failure. Agents that do not know it back off as before.
pub const RECONNECT_METADATA: &str = "argocd-agent-reconnect";

/// Reason of an error event answering a change the peer could not apply for now: its
/// API server failed or was overloaded (5xx, 429, no answer), or the write met a newer
/// version of the object. Not an answer about the change itself, so the sender keeps it
/// queued and resends it after a backoff (a newer change of the same object replaces it);
/// dropping it would lose the change until the next resync. Peers that do not know this
/// reason take it as final, as every error before it.
pub const REASON_UNAVAILABLE: &str = "Unavailable";

const ATTR_TIME: &str = "time";
const ATTR_CONTENT_TYPE: &str = "datacontenttype";
const ATTR_KIND: &str = "resourcekind";
const ATTR_NAMESPACE: &str = "resourcenamespace";
const ATTR_NAME: &str = "resourcename";
const ATTR_ACK: &str = "ackid";
const ATTR_TRACEPARENT: &str = "traceparent";
const ATTR_TRACESTATE: &str = "tracestate";
/// Longest accepted `traceparent` / `tracestate` value (W3C: 55 and 512 characters).
const MAX_TRACE_HEADER: usize = 1024;

/// The verb of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Agent's first message (payload [`Hello`]).
    Hello,
    /// Principal's answer (payload [`Welcome`]).
    Welcome,
    /// A new object, sent by its source of truth (payload: the object).
    Create,
    /// The object is gone on the sender's side (no payload).
    Delete,
    /// The object changed, or is sent whole by resync (payload: the object; it creates the
    /// object where it is missing).
    SpecUpdate,
    /// Spoke -> hub: an Application's status (payload: `{"metadata": ..., "status": ...}`).
    StatusUpdate,
    /// Hub -> spoke: run the operation set on the hub copy (payload: `{"operation": ...}`).
    SetOperation,
    /// Hub -> spoke: terminate the Application's running operation (no payload).
    TerminateOperation,
    /// Acknowledges the event named by `ackid`.
    Processed,
    /// Asks the peer to send the named resource again (spec-update, or delete if gone).
    RequestUpdate,
    /// Upstream's resync request for the peer's resource list. Parsed but never sent here
    /// (resync state travels in the hello); refused from agents.
    RequestSyncedResourceList,
    /// Upstream's answer to `request-synced-resource-list`. Parsed but never sent here.
    ResponseSyncedResource,
    /// Upstream's request that the peer start a resync. Parsed but never sent here; refused
    /// from agents.
    RequestResourceResync,
    /// Heartbeat: the agent sends one every keep-alive interval, the principal answers
    /// [`EventType::Pong`].
    Ping,
    /// The answer to a [`EventType::Ping`].
    Pong,
    /// A refused or failed event (payload [`ErrorDetail`]).
    Error,
    /// Principal -> agent: read or subscribe to a key of the agent's Redis (payload
    /// [`RedisRequest`], the Application in the resource attributes).
    RedisRequest,
    /// Agent -> principal: the answer to the `redis-request` named by `ackid` (payload
    /// [`RedisResponse`]).
    RedisResponse,
    /// Agent -> principal: a message of the subscription named by `ackid` (payload
    /// [`RedisResponse`]).
    RedisPush,
    /// Agent -> principal: its cluster's cache counts (payload [`ClusterCacheInfo`]).
    ClusterCacheInfoUpdate,
    /// Principal -> agent: one Kubernetes API request of the resource proxy (payload
    /// [`ResourceRequest`]).
    ResourceRequest,
    /// Agent -> principal: the answer to the `resource-request` (or a refused
    /// `log-request`/`terminal-request`) named by `ackid` (payload [`ResourceResponse`]).
    ResourceResponse,
    /// Principal -> agent: stream a container log on a `Tunnel.Logs` stream (payload
    /// [`LogRequest`]).
    LogRequest,
    /// Principal -> agent: open an exec session on a `Tunnel.Terminal` stream (payload
    /// [`TerminalRequest`]).
    TerminalRequest,
    /// Agent -> principal, while connected (capability [`crate::resync::PERIODIC_CAPABILITY`]):
    /// a resync round against what the agent holds now (payload [`ResyncState`]), as the
    /// hello's resync does at connect. Refused (`ResyncTooSoon`) within the principal's
    /// minimum interval.
    Resync,
}

impl EventType {
    /// The verb as it appears after [`TYPE_PREFIX`].
    pub fn verb(self) -> &'static str {
        match self {
            EventType::Hello => "hello",
            EventType::Welcome => "welcome",
            EventType::Create => "create",
            EventType::Delete => "delete",
            EventType::SpecUpdate => "spec-update",
            EventType::StatusUpdate => "status-update",
            EventType::SetOperation => "set-operation",
            EventType::TerminateOperation => "terminate-operation",
            EventType::Processed => "processed",
            EventType::RequestUpdate => "request-update",
            EventType::RequestSyncedResourceList => "request-synced-resource-list",
            EventType::ResponseSyncedResource => "response-synced-resource",
            EventType::RequestResourceResync => "request-resource-resync",
            EventType::Ping => "ping",
            EventType::Pong => "pong",
            EventType::Error => "error",
            EventType::RedisRequest => "redis-request",
            EventType::RedisResponse => "redis-response",
            EventType::RedisPush => "redis-push",
            EventType::ClusterCacheInfoUpdate => "cluster-cache-info-update",
            EventType::ResourceRequest => "resource-request",
            EventType::ResourceResponse => "resource-response",
            EventType::LogRequest => "log-request",
            EventType::TerminalRequest => "terminal-request",
            EventType::Resync => "resync",
        }
    }

    /// Parses a full CloudEvent type string.
    pub fn from_type(ty: &str) -> Option<EventType> {
        let verb = ty.strip_prefix(TYPE_PREFIX)?;
        Some(match verb {
            "hello" => EventType::Hello,
            "welcome" => EventType::Welcome,
            "create" => EventType::Create,
            "delete" => EventType::Delete,
            "spec-update" => EventType::SpecUpdate,
            "status-update" => EventType::StatusUpdate,
            "set-operation" => EventType::SetOperation,
            "terminate-operation" => EventType::TerminateOperation,
            "processed" => EventType::Processed,
            "request-update" => EventType::RequestUpdate,
            "request-synced-resource-list" => EventType::RequestSyncedResourceList,
            "response-synced-resource" => EventType::ResponseSyncedResource,
            "request-resource-resync" => EventType::RequestResourceResync,
            "ping" => EventType::Ping,
            "pong" => EventType::Pong,
            "error" => EventType::Error,
            "redis-request" => EventType::RedisRequest,
            "redis-response" => EventType::RedisResponse,
            "redis-push" => EventType::RedisPush,
            "cluster-cache-info-update" => EventType::ClusterCacheInfoUpdate,
            "resource-request" => EventType::ResourceRequest,
            "resource-response" => EventType::ResourceResponse,
            "log-request" => EventType::LogRequest,
            "terminal-request" => EventType::TerminalRequest,
            "resync" => EventType::Resync,
            _ => return None,
        })
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.verb())
    }
}

/// Kinds of resources that travel on the stream (defined next to the authorization policy
/// that reasons about them).
pub use crate::names::ResourceKind;

/// The resource an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceRef {
    /// What kind of object it is.
    pub kind: ResourceKind,
    /// Hub namespace of the resource (the agent's namespace on the hub).
    pub namespace: Namespace,
    /// Object name: a DNS-1123 subdomain, checked on decode
    /// ([`crate::names::check_object_name`]).
    pub name: String,
}

impl ResourceRef {
    /// A reference to an object of `kind` in hub namespace `namespace`.
    pub fn new(kind: ResourceKind, namespace: Namespace, name: impl Into<String>) -> Self {
        ResourceRef {
            kind,
            namespace,
            name: name.into(),
        }
    }
}

impl fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// What an event carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// No data (`delete`, `processed`, `ping`, ...).
    None,
    /// A Kubernetes object (or a part of it, e.g. `{"status": ...}`) as JSON. Shared, so
    /// queueing and resending do not copy objects.
    Object(Arc<serde_json::Value>),
    /// An object on its way out that writes its own JSON when the event is encoded (see
    /// [`LazyObject`]). Received, it is an [`Payload::Object`] like any other.
    Lazy(LazyObject),
    /// Of [`EventType::Hello`].
    Hello(Hello),
    /// Of [`EventType::Welcome`].
    Welcome(Welcome),
    /// Of [`EventType::Error`].
    Error(ErrorDetail),
    /// Of [`EventType::RedisRequest`].
    RedisRequest(RedisRequest),
    /// Of [`EventType::RedisResponse`] and [`EventType::RedisPush`].
    RedisResponse(RedisResponse),
    /// Of [`EventType::ClusterCacheInfoUpdate`].
    ClusterCacheInfo(ClusterCacheInfo),
    /// Of [`EventType::ResourceRequest`].
    ResourceRequest(ResourceRequest),
    /// Of [`EventType::ResourceResponse`].
    ResourceResponse(ResourceResponse),
    /// Of [`EventType::LogRequest`].
    LogRequest(LogRequest),
    /// Of [`EventType::TerminalRequest`].
    TerminalRequest(TerminalRequest),
    /// Of [`EventType::Resync`].
    Resync(ResyncState),
}

/// An object that writes its JSON itself, for [`Payload::Lazy`].
pub trait JsonObject: fmt::Debug + Send + Sync {
    /// Appends the object's JSON (an object, `{...}`) to `out`.
    fn write_json(&self, out: &mut Vec<u8>);

    /// The object's JSON as shared bytes, what the event's data becomes: by default
    /// written afresh; an implementation that keeps them (the principal's watch cache
    /// writes each version's once) hands out the same bytes to every event.
    fn to_bytes(&self) -> Bytes {
        json_bytes(|out| self.write_json(out))
    }
}

/// Largest buffer [`json_bytes`] keeps for its thread's next call.
const KEPT_SCRATCH: usize = 256 * 1024;

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What `write` writes, as bytes of exactly that length. It writes into a buffer this
/// thread keeps (up to [`KEPT_SCRATCH`]), so an object's JSON is not written into a
/// vector grown by doubling (each growth a new allocation, a copy, and fresh pages to
/// fault in) but copied once into an allocation of its size.
pub fn json_bytes(write: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            write(&mut buf);
            let bytes = Bytes::copy_from_slice(&buf);
            if buf.capacity() > KEPT_SCRATCH {
                *buf = Vec::new();
            }
            bytes
        }
        // Called from inside `write` (an object writing another's JSON): its own buffer.
        Err(_) => {
            let mut out = Vec::new();
            write(&mut out);
            Bytes::from(out)
        }
    })
}

/// An outgoing object that is encoded only when its event is: a queued event then shares
/// the sender's copy (e.g. the principal's watch-cache entry) instead of holding a JSON
/// tree of its own, and the object's JSON is written once, straight into the event's data.
/// Two are equal when they write the same JSON.
#[derive(Debug, Clone)]
pub struct LazyObject(Arc<dyn JsonObject>);

impl LazyObject {
    /// Wraps `object`.
    pub fn new(object: impl JsonObject + 'static) -> Self {
        LazyObject(Arc::new(object))
    }

    /// The object's JSON ([`JsonObject::to_bytes`]).
    pub fn to_json(&self) -> Bytes {
        self.0.to_bytes()
    }
}

impl PartialEq for LazyObject {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.to_json() == other.to_json()
    }
}

/// One event, decoded and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// CloudEvents `id`: 1 to 128 bytes, unique per sender (a UUID for events built here).
    pub id: String,
    /// CloudEvents `source`: the sender (its SPIFFE ID); never empty.
    pub source: String,
    /// CloudEvents `time`: when the event was created (now, if a received one has none).
    pub time: SystemTime,
    /// The verb.
    pub ty: EventType,
    /// The object the event is about (the `resource*` extension attributes); required for
    /// resource events.
    pub resource: Option<ResourceRef>,
    /// For `processed` and `error`: the id of the event this answers.
    pub ack_id: Option<String>,
    /// W3C trace context (`traceparent`), carried so traces can span both sides. Set by
    /// [`Event::new`] from the current span (see [`crate::trace`]).
    pub traceparent: Option<String>,
    /// W3C `tracestate` accompanying `traceparent` (vendor-specific trace data).
    pub tracestate: Option<String>,
    /// The data, decoded according to [`Event::ty`].
    pub payload: Payload,
}

/// A CloudEvent that is not a valid argocd-agent event.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventError {
    /// The type is not `io.argoproj.argocd-agent.event.<verb>` with a known verb.
    #[error("event {id}: unknown event type {ty}", id = quoted(.id), ty = quoted(.ty))]
    UnknownType {
        /// The event's id.
        id: String,
        /// The type as received.
        ty: String,
    },
    /// The specversion is not [`SPEC_VERSION`].
    #[error("event {id}: unsupported specversion {version}", id = quoted(.id), version = quoted(.version))]
    SpecVersion {
        /// The event's id.
        id: String,
        /// The specversion as received.
        version: String,
    },
    /// An attribute the event's type requires is absent.
    #[error("event {id}: missing required attribute {attr}", id = quoted(.id))]
    Missing {
        /// The event's id.
        id: String,
        /// The attribute's name.
        attr: &'static str,
    },
    /// An attribute has the wrong type or an unacceptable value.
    #[error("event {id}: attribute {attr} is invalid: {reason}", id = quoted(.id))]
    Invalid {
        /// The event's id.
        id: String,
        /// The attribute's name.
        attr: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The data does not decode as the type's payload, or is missing where required.
    #[error("event {id}: payload of {ty} event is invalid: {reason}", id = quoted(.id))]
    Payload {
        /// The event's id.
        id: String,
        /// The event's type.
        ty: EventType,
        /// What is wrong with it.
        reason: String,
    },
}

impl Event {
    /// Stamps the event with `span`'s trace context as it is sent (nothing when the span is
    /// not traced): the peer's handling joins the sender's span.
    pub fn stamp_trace(&mut self, span: &tracing::Span) {
        if let Some(headers) = crate::trace::context::span_headers(span) {
            self.traceparent = headers.traceparent;
            self.tracestate = headers.tracestate;
        }
    }

    /// A new event with a fresh id and the current time. Created inside a traced span, it
    /// carries that span's trace context (`traceparent` / `tracestate`), so the peer's
    /// handling of it joins the same trace even when it waits in a queue first.
    pub fn new(source: &str, ty: EventType, payload: Payload) -> Event {
        let headers = crate::trace::context::span_headers(&tracing::Span::current());
        let headers = headers.unwrap_or_default();
        Event {
            id: uuid::Uuid::new_v4().to_string(),
            source: source.to_owned(),
            time: SystemTime::now(),
            ty,
            resource: None,
            ack_id: None,
            traceparent: headers.traceparent,
            tracestate: headers.tracestate,
            payload,
        }
    }

    /// A resource event.
    pub fn resource(source: &str, ty: EventType, resource: ResourceRef, payload: Payload) -> Event {
        let mut e = Event::new(source, ty, payload);
        e.resource = Some(resource);
        e
    }

    /// The `processed` acknowledgement of `self`.
    pub fn ack(&self, source: &str) -> Event {
        let mut e = Event::new(source, EventType::Processed, Payload::None);
        e.ack_id = Some(self.id.clone());
        e.resource = self.resource.clone();
        e
    }

    /// An `error` answer to `self`.
    pub fn error_reply(&self, source: &str, reason: &str, message: String) -> Event {
        let mut e = Event::new(
            source,
            EventType::Error,
            Payload::Error(ErrorDetail {
                reason: reason.to_owned(),
                message,
                event_id: self.id.clone(),
            }),
        );
        e.ack_id = Some(self.id.clone());
        e.resource = self.resource.clone();
        e
    }

    /// The object payload, if any.
    pub fn object(&self) -> Option<&Arc<serde_json::Value>> {
        match &self.payload {
            Payload::Object(o) => Some(o),
            _ => None,
        }
    }

    /// Encodes into the CloudEvents protobuf envelope.
    pub fn to_cloud_event(&self) -> CloudEvent {
        let mut attributes = HashMap::new();
        let ts = prost_types::Timestamp::from(self.time);
        attributes.insert(ATTR_TIME.to_owned(), attr(Attr::CeTimestamp(ts)));
        if let Some(r) = &self.resource {
            attributes.insert(
                ATTR_KIND.into(),
                attr(Attr::CeString(r.kind.as_str().into())),
            );
            attributes.insert(
                ATTR_NAMESPACE.into(),
                attr(Attr::CeString(r.namespace.to_string())),
            );
            attributes.insert(ATTR_NAME.into(), attr(Attr::CeString(r.name.clone())));
        }
        if let Some(a) = &self.ack_id {
            attributes.insert(ATTR_ACK.into(), attr(Attr::CeString(a.clone())));
        }
        if let Some(t) = &self.traceparent {
            attributes.insert(ATTR_TRACEPARENT.into(), attr(Attr::CeString(t.clone())));
        }
        if let Some(t) = &self.tracestate {
            attributes.insert(ATTR_TRACESTATE.into(), attr(Attr::CeString(t.clone())));
        }
        let data = match &self.payload {
            Payload::None => None,
            Payload::Object(v) => {
                attributes.insert(
                    ATTR_CONTENT_TYPE.into(),
                    attr(Attr::CeString("application/json".into())),
                );
                Some(Data::BinaryData(json_bytes(|out| {
                    // Writing a JSON value into a Vec cannot fail.
                    let _ = serde_json::to_writer(out, v.as_ref());
                })))
            }
            Payload::Lazy(o) => {
                attributes.insert(
                    ATTR_CONTENT_TYPE.into(),
                    attr(Attr::CeString("application/json".into())),
                );
                Some(Data::BinaryData(o.to_json()))
            }
            Payload::Hello(h) => Some(Data::BinaryData(h.encode_to_vec().into())),
            Payload::Welcome(w) => Some(Data::BinaryData(w.encode_to_vec().into())),
            Payload::Error(e) => Some(Data::BinaryData(e.encode_to_vec().into())),
            Payload::RedisRequest(r) => Some(Data::BinaryData(r.encode_to_vec().into())),
            Payload::RedisResponse(r) => Some(Data::BinaryData(r.encode_to_vec().into())),
            Payload::ClusterCacheInfo(c) => Some(Data::BinaryData(c.encode_to_vec().into())),
            Payload::ResourceRequest(r) => Some(Data::BinaryData(r.encode_to_vec().into())),
            Payload::ResourceResponse(r) => Some(Data::BinaryData(r.encode_to_vec().into())),
            Payload::LogRequest(r) => Some(Data::BinaryData(r.encode_to_vec().into())),
            Payload::TerminalRequest(r) => Some(Data::BinaryData(r.encode_to_vec().into())),
            Payload::Resync(r) => Some(Data::BinaryData(r.encode_to_vec().into())),
        };
        if matches!(
            self.payload,
            Payload::Hello(_)
                | Payload::Welcome(_)
                | Payload::Error(_)
                | Payload::RedisRequest(_)
                | Payload::RedisResponse(_)
                | Payload::ClusterCacheInfo(_)
                | Payload::ResourceRequest(_)
                | Payload::ResourceResponse(_)
                | Payload::LogRequest(_)
                | Payload::TerminalRequest(_)
                | Payload::Resync(_)
        ) {
            attributes.insert(
                ATTR_CONTENT_TYPE.into(),
                attr(Attr::CeString("application/protobuf".into())),
            );
        }
        CloudEvent {
            id: self.id.clone(),
            source: self.source.clone(),
            spec_version: SPEC_VERSION.into(),
            r#type: format!("{TYPE_PREFIX}{}", self.ty.verb()),
            attributes,
            data,
        }
    }

    /// Decodes and validates a CloudEvent received from the network: envelope, attributes,
    /// resource reference, payload, then the rules that tie them together.
    pub fn from_cloud_event(ce: CloudEvent) -> Result<Event, EventError> {
        let CloudEvent {
            id,
            source,
            spec_version,
            r#type,
            attributes,
            data,
        } = ce;
        let ty = check_envelope(&id, &source, &spec_version, &r#type)?;
        let mut attrs = Attributes {
            id: &id,
            attrs: attributes,
        };
        let time = attrs.time()?;
        let resource = attrs.resource()?;
        let ack_id = attrs.string(ATTR_ACK)?;
        let traceparent = attrs.trace_header(ATTR_TRACEPARENT)?;
        let tracestate = attrs.trace_header(ATTR_TRACESTATE)?;
        let payload = decode_payload(&id, ty, data)?;
        check_shape(&id, ty, resource.as_ref(), &payload, ack_id.as_ref())?;
        if let (Some(resource), Payload::Object(obj)) = (&resource, &payload) {
            check_object_identity(&id, resource, obj)?;
        }
        Ok(Event {
            id,
            source,
            time,
            ty,
            resource,
            ack_id,
            traceparent,
            tracestate,
            payload,
        })
    }
}

/// The CloudEvents envelope: id, specversion, a known type, a source.
fn check_envelope(
    id: &str,
    source: &str,
    spec_version: &str,
    ty: &str,
) -> Result<EventType, EventError> {
    if id.is_empty() || id.len() > 128 {
        return Err(EventError::Invalid {
            id: id.to_owned(),
            attr: "id",
            reason: "must be 1 to 128 bytes".into(),
        });
    }
    if spec_version != SPEC_VERSION {
        return Err(EventError::SpecVersion {
            id: id.to_owned(),
            version: spec_version.to_owned(),
        });
    }
    let Some(ty) = EventType::from_type(ty) else {
        return Err(EventError::UnknownType {
            id: id.to_owned(),
            ty: ty.to_owned(),
        });
    };
    if source.is_empty() {
        return Err(EventError::Missing {
            id: id.to_owned(),
            attr: "source",
        });
    }
    Ok(ty)
}

/// Extension attributes of one event, taken out one by one.
struct Attributes<'a> {
    id: &'a str,
    attrs: HashMap<String, CloudEventAttributeValue>,
}

impl Attributes<'_> {
    fn invalid(&self, attr: &'static str, reason: impl Into<String>) -> EventError {
        EventError::Invalid {
            id: self.id.to_owned(),
            attr,
            reason: reason.into(),
        }
    }

    /// `time`: a timestamp; now when absent.
    fn time(&mut self) -> Result<SystemTime, EventError> {
        match self.attrs.remove(ATTR_TIME).and_then(|a| a.attr) {
            Some(Attr::CeTimestamp(ts)) => {
                SystemTime::try_from(ts).map_err(|_| self.invalid("time", "out of range"))
            }
            Some(_) => Err(self.invalid("time", "not a timestamp")),
            None => Ok(SystemTime::now()),
        }
    }

    fn string(&mut self, name: &'static str) -> Result<Option<String>, EventError> {
        match self.attrs.remove(name).and_then(|a| a.attr) {
            None => Ok(None),
            Some(Attr::CeString(s)) | Some(Attr::CeUri(s)) | Some(Attr::CeUriRef(s)) => Ok(Some(s)),
            Some(_) => Err(self.invalid(name, "not a string")),
        }
    }

    /// `traceparent` / `tracestate`: optional strings. Oversized values are dropped (the
    /// event still counts; only its trace link is lost); the content is only ever parsed by
    /// the trace propagator, which ignores what it cannot read.
    fn trace_header(&mut self, name: &'static str) -> Result<Option<String>, EventError> {
        Ok(self.string(name)?.filter(|v| v.len() <= MAX_TRACE_HEADER))
    }

    /// `resourcekind`, `resourcenamespace`, `resourcename`: all three or none.
    fn resource(&mut self) -> Result<Option<ResourceRef>, EventError> {
        let kind = self.string(ATTR_KIND)?;
        let namespace = self.string(ATTR_NAMESPACE)?;
        let name = self.string(ATTR_NAME)?;
        let (kind, namespace, name) = match (kind, namespace, name) {
            (None, None, None) => return Ok(None),
            (Some(k), Some(ns), Some(n)) => (k, ns, n),
            _ => {
                return Err(EventError::Missing {
                    id: self.id.to_owned(),
                    attr: "resourcekind/namespace/name",
                });
            }
        };
        let kind = ResourceKind::parse(&kind).ok_or_else(|| {
            self.invalid(
                ATTR_KIND,
                format!("unknown kind {kind}", kind = quoted(&kind)),
            )
        })?;
        let namespace =
            Namespace::new(&namespace).map_err(|e| self.invalid(ATTR_NAMESPACE, e.to_string()))?;
        check_object_name(&name).map_err(|e| self.invalid(ATTR_NAME, e.to_string()))?;
        Ok(Some(ResourceRef {
            kind,
            namespace,
            name,
        }))
    }
}

/// The payload: protobuf for hello/welcome/error, a JSON object (or nothing) otherwise.
fn decode_payload(id: &str, ty: EventType, data: Option<Data>) -> Result<Payload, EventError> {
    let bad = |reason: String| EventError::Payload {
        id: id.to_owned(),
        ty,
        reason,
    };
    let bytes = match data {
        None => None,
        Some(Data::BinaryData(b)) => Some(b),
        Some(Data::TextData(t)) => Some(Bytes::from(t.into_bytes())),
        Some(Data::ProtoData(_)) => return Err(bad("proto_data is not supported".into())),
    };
    let proto = bytes.as_deref().unwrap_or_default();
    Ok(match ty {
        EventType::Hello => Payload::Hello(Hello::decode(proto).map_err(|e| bad(e.to_string()))?),
        EventType::Welcome => {
            Payload::Welcome(Welcome::decode(proto).map_err(|e| bad(e.to_string()))?)
        }
        EventType::Error => {
            Payload::Error(ErrorDetail::decode(proto).map_err(|e| bad(e.to_string()))?)
        }
        EventType::RedisRequest => {
            Payload::RedisRequest(RedisRequest::decode(proto).map_err(|e| bad(e.to_string()))?)
        }
        EventType::RedisResponse | EventType::RedisPush => {
            Payload::RedisResponse(RedisResponse::decode(proto).map_err(|e| bad(e.to_string()))?)
        }
        EventType::ClusterCacheInfoUpdate => Payload::ClusterCacheInfo(
            ClusterCacheInfo::decode(proto).map_err(|e| bad(e.to_string()))?,
        ),
        EventType::ResourceRequest => Payload::ResourceRequest(
            ResourceRequest::decode(proto).map_err(|e| bad(e.to_string()))?,
        ),
        EventType::ResourceResponse => Payload::ResourceResponse(
            ResourceResponse::decode(proto).map_err(|e| bad(e.to_string()))?,
        ),
        EventType::LogRequest => {
            Payload::LogRequest(LogRequest::decode(proto).map_err(|e| bad(e.to_string()))?)
        }
        EventType::TerminalRequest => Payload::TerminalRequest(
            TerminalRequest::decode(proto).map_err(|e| bad(e.to_string()))?,
        ),
        EventType::Resync => {
            Payload::Resync(ResyncState::decode(proto).map_err(|e| bad(e.to_string()))?)
        }
        _ => match bytes {
            None => Payload::None,
            Some(b) if b.is_empty() => Payload::None,
            Some(b) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&b).map_err(|e| bad(format!("not JSON: {e}")))?;
                if !v.is_object() {
                    return Err(bad("not a JSON object".into()));
                }
                Payload::Object(Arc::new(v))
            }
        },
    })
}

/// What each event type requires: resource events name a resource, object events carry an
/// object, acknowledgements name the event they answer.
fn check_shape(
    id: &str,
    ty: EventType,
    resource: Option<&ResourceRef>,
    payload: &Payload,
    ack_id: Option<&String>,
) -> Result<(), EventError> {
    let needs_resource = matches!(
        ty,
        EventType::Create
            | EventType::Delete
            | EventType::SpecUpdate
            | EventType::StatusUpdate
            | EventType::SetOperation
            | EventType::TerminateOperation
            | EventType::RequestUpdate
            | EventType::RedisRequest
    );
    if needs_resource && resource.is_none() {
        return Err(EventError::Missing {
            id: id.to_owned(),
            attr: "resourcekind/namespace/name",
        });
    }
    if matches!(
        ty,
        EventType::Create | EventType::SpecUpdate | EventType::StatusUpdate
    ) && !matches!(payload, Payload::Object(_))
    {
        return Err(EventError::Payload {
            id: id.to_owned(),
            ty,
            reason: "an object is required".into(),
        });
    }
    if matches!(
        ty,
        EventType::Processed
            | EventType::RedisResponse
            | EventType::RedisPush
            | EventType::ResourceResponse
    ) && ack_id.is_none()
    {
        return Err(EventError::Missing {
            id: id.to_owned(),
            attr: ATTR_ACK,
        });
    }
    Ok(())
}

/// An object payload is the object the attributes name: its `apiVersion` and `kind`, when
/// present, are those of the resource kind's Kubernetes objects, and its `metadata.name`,
/// when present, is the resource name. Otherwise an event authorized for one object could
/// write another (e.g. an Application sent as an `AppProject` event).
fn check_object_identity(
    id: &str,
    resource: &ResourceRef,
    obj: &serde_json::Value,
) -> Result<(), EventError> {
    let invalid = |attr: &'static str, reason: String| EventError::Invalid {
        id: id.to_owned(),
        attr,
        reason,
    };
    let field = |pointer: &str, expected: &str| match obj.pointer(pointer) {
        None => Ok(()),
        Some(serde_json::Value::String(s)) if s == expected => Ok(()),
        Some(other) => Err(format!(
            "payload {pointer} is {}, {} expects {expected}",
            brief(other),
            resource.kind,
            expected = quoted(&expected)
        )),
    };
    field("/kind", resource.kind.object_kind())
        .and_then(|()| field("/apiVersion", resource.kind.object_api_version()))
        .map_err(|reason| invalid(ATTR_KIND, reason))?;
    match obj.pointer("/metadata/name") {
        None => Ok(()),
        Some(serde_json::Value::String(n)) if *n == resource.name => Ok(()),
        Some(other) => Err(invalid(
            ATTR_NAME,
            format!(
                "payload names {}, the event {}",
                brief(other),
                quoted(&resource.name)
            ),
        )),
    }
}

/// A JSON value for an error message: escaped, and cut after 80 bytes.
fn brief(v: &serde_json::Value) -> String {
    const MAX: usize = 80;
    let mut s = v.to_string();
    if s.len() > MAX {
        let mut end = MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

fn attr(a: Attr) -> CloudEventAttributeValue {
    CloudEventAttributeValue { attr: Some(a) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app_ref() -> ResourceRef {
        ResourceRef {
            kind: ResourceKind::Application,
            namespace: crate::Namespace::new("agent-a").unwrap(),
            name: "guestbook".into(),
        }
    }

    #[test]
    fn resource_event_round_trips_through_cloudevent() {
        let obj = json!({"metadata": {"name": "guestbook"}, "spec": {"x": 1, "unknown": [1, 2]}});
        let e = Event::resource(
            "spiffe://example.org/principal",
            EventType::SpecUpdate,
            app_ref(),
            Payload::Object(Arc::new(obj)),
        );
        let ce = e.to_cloud_event();
        assert_eq!(ce.r#type, "io.argoproj.argocd-agent.event.spec-update");
        assert_eq!(ce.spec_version, "1.0");
        assert!(!ce.id.is_empty());
        assert!(ce.attributes.contains_key("time"));
        let back = Event::from_cloud_event(ce).unwrap();
        // Protobuf timestamps keep nanoseconds, so the whole event is equal.
        assert_eq!(back, e);
    }

    #[derive(Debug)]
    struct Written(&'static str);

    impl JsonObject for Written {
        fn write_json(&self, out: &mut Vec<u8>) {
            out.extend_from_slice(self.0.as_bytes());
        }
    }

    #[test]
    fn json_bytes_are_exactly_what_was_written_even_when_nested() {
        let b = json_bytes(|out| out.extend_from_slice(b"{\"a\":1}"));
        assert_eq!(&b[..], b"{\"a\":1}");
        assert_eq!(b.len(), 7);
        // Called again from inside a writer: the inner call has its own buffer.
        let outer = json_bytes(|out| {
            let inner = json_bytes(|o| o.extend_from_slice(b"[2]"));
            out.extend_from_slice(b"{\"x\":");
            out.extend_from_slice(&inner);
            out.push(b'}');
        });
        assert_eq!(&outer[..], b"{\"x\":[2]}");
        // A larger one than the kept buffer, then a small one: both right.
        let big = json_bytes(|out| out.resize(KEPT_SCRATCH + 10, b' '));
        assert_eq!(big.len(), KEPT_SCRATCH + 10);
        assert_eq!(&json_bytes(|out| out.push(b'1'))[..], b"1");
    }

    #[test]
    fn a_lazy_object_is_written_at_encoding_and_received_as_an_object() {
        let text = r#"{"metadata":{"name":"guestbook"},"spec":{"x":1}}"#;
        let e = Event::resource(
            "spiffe://example.org/principal",
            EventType::SpecUpdate,
            app_ref(),
            Payload::Lazy(LazyObject::new(Written(text))),
        );
        let ce = e.to_cloud_event();
        assert_eq!(
            ce.data,
            Some(Data::BinaryData(Bytes::from_static(text.as_bytes())))
        );
        let back = Event::from_cloud_event(ce).unwrap();
        assert_eq!(
            back.payload,
            Payload::Object(Arc::new(serde_json::from_str(text).unwrap()))
        );
        assert_eq!((back.id, back.ty, back.resource), (e.id, e.ty, e.resource));
        // Equal when they write the same JSON.
        assert_eq!(
            LazyObject::new(Written(text)),
            LazyObject::new(Written(text))
        );
        assert_ne!(
            LazyObject::new(Written(text)),
            LazyObject::new(Written("{}"))
        );
    }

    #[test]
    fn trace_context_extensions_round_trip_and_oversized_ones_are_dropped() {
        let mut e = Event::new("agent", EventType::Ping, Payload::None);
        e.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        e.tracestate = Some("vendor=value".into());
        let ce = e.to_cloud_event();
        assert!(ce.attributes.contains_key("traceparent"));
        assert!(ce.attributes.contains_key("tracestate"));
        assert_eq!(Event::from_cloud_event(ce).unwrap(), e);

        e.tracestate = Some("x".repeat(MAX_TRACE_HEADER + 1));
        let back = Event::from_cloud_event(e.to_cloud_event()).unwrap();
        assert_eq!(back.tracestate, None, "oversized tracestate ignored");
        assert_eq!(back.traceparent, e.traceparent, "the event itself is kept");
    }

    #[test]
    fn hello_and_ack_round_trip() {
        let e = Event::new(
            "agent",
            EventType::Hello,
            Payload::Hello(Hello {
                version: "0.1.0".into(),
                ..Default::default()
            }),
        );
        assert_eq!(Event::from_cloud_event(e.to_cloud_event()).unwrap(), e);
        let ack = e.ack("principal");
        let back = Event::from_cloud_event(ack.to_cloud_event()).unwrap();
        assert_eq!(back.ack_id.as_deref(), Some(e.id.as_str()));
    }

    #[test]
    fn redis_request_and_response_round_trip_and_responses_need_their_request_id() {
        use argocd_agent_proto::eventstream::{RedisCommand, redis_response};
        let req = Event::resource(
            "principal",
            EventType::RedisRequest,
            app_ref(),
            Payload::RedisRequest(RedisRequest {
                command: RedisCommand::Get as i32,
                key_kind: "resources-tree".into(),
                key_suffix: "|1.8.3.gz".into(),
                subscription_id: String::new(),
            }),
        );
        assert_eq!(Event::from_cloud_event(req.to_cloud_event()).unwrap(), req);
        let mut resp = Event::new(
            "agent",
            EventType::RedisResponse,
            Payload::RedisResponse(RedisResponse {
                result: Some(redis_response::Result::Value(b"\x1f\x8b".to_vec())),
            }),
        );
        resp.ack_id = Some(req.id.clone());
        assert_eq!(
            Event::from_cloud_event(resp.to_cloud_event()).unwrap(),
            resp
        );
        resp.ack_id = None;
        assert!(matches!(
            Event::from_cloud_event(resp.to_cloud_event()),
            Err(EventError::Missing { attr: "ackid", .. })
        ));
        let mut no_app = req.clone();
        no_app.resource = None;
        assert!(Event::from_cloud_event(no_app.to_cloud_event()).is_err());
    }

    #[test]
    fn resource_proxy_events_round_trip_and_responses_need_their_request_id() {
        let requests = [
            Event::new(
                "principal",
                EventType::ResourceRequest,
                Payload::ResourceRequest(ResourceRequest {
                    method: "PATCH".into(),
                    path: "/apis/apps/v1/namespaces/web/deployments/front".into(),
                    query: "fieldManager=argocd".into(),
                    content_type: "application/merge-patch+json".into(),
                    accept: "application/json".into(),
                    body: br#"{"spec":{"replicas":2}}"#.to_vec(),
                }),
            ),
            Event::new(
                "principal",
                EventType::LogRequest,
                Payload::LogRequest(LogRequest {
                    namespace: "web".into(),
                    pod: "front-1".into(),
                    follow: true,
                    tail_lines: 10,
                    timestamps: true,
                    ..Default::default()
                }),
            ),
            Event::new(
                "principal",
                EventType::TerminalRequest,
                Payload::TerminalRequest(TerminalRequest {
                    session_id: "4f1c".into(),
                    namespace: "web".into(),
                    pod: "front-1".into(),
                    command: vec!["sh".into()],
                    stdin: true,
                    tty: true,
                    ..Default::default()
                }),
            ),
            Event::new(
                "agent",
                EventType::Resync,
                Payload::Resync(crate::resync::to_state(
                    "Application",
                    &[("guestbook".to_string(), "ab12".to_string())].into(),
                )),
            ),
        ];
        for req in &requests {
            assert_eq!(&Event::from_cloud_event(req.to_cloud_event()).unwrap(), req);
        }
        let mut resp = Event::new(
            "agent",
            EventType::ResourceResponse,
            Payload::ResourceResponse(ResourceResponse {
                status: 403,
                content_type: "application/json".into(),
                body: b"{}".to_vec(),
            }),
        );
        resp.ack_id = Some(requests[0].id.clone());
        assert_eq!(
            Event::from_cloud_event(resp.to_cloud_event()).unwrap(),
            resp
        );
        resp.ack_id = None;
        assert!(matches!(
            Event::from_cloud_event(resp.to_cloud_event()),
            Err(EventError::Missing { attr: "ackid", .. })
        ));
    }

    #[test]
    fn unknown_type_is_refused() {
        let mut ce = Event::new("a", EventType::Ping, Payload::None).to_cloud_event();
        ce.r#type = "io.argoproj.argocd-agent.event.explode".into();
        assert!(matches!(
            Event::from_cloud_event(ce),
            Err(EventError::UnknownType { .. })
        ));
    }

    #[test]
    fn malformed_payload_is_refused_not_panicking() {
        let mut ce = Event::resource(
            "a",
            EventType::Create,
            app_ref(),
            Payload::Object(Arc::new(json!({}))),
        )
        .to_cloud_event();
        ce.data = Some(Data::BinaryData(Bytes::from_static(b"{not json")));
        assert!(matches!(
            Event::from_cloud_event(ce.clone()),
            Err(EventError::Payload { .. })
        ));
        ce.data = Some(Data::BinaryData(Bytes::from_static(b"[1,2]")));
        assert!(matches!(
            Event::from_cloud_event(ce.clone()),
            Err(EventError::Payload { .. })
        ));
        ce.data = None;
        assert!(matches!(
            Event::from_cloud_event(ce),
            Err(EventError::Payload { .. })
        ));
    }

    #[test]
    fn resource_event_without_resource_attributes_is_refused() {
        let mut ce =
            Event::resource("a", EventType::Delete, app_ref(), Payload::None).to_cloud_event();
        ce.attributes.remove("resourcename");
        assert!(matches!(
            Event::from_cloud_event(ce),
            Err(EventError::Missing { .. })
        ));
    }

    #[test]
    fn wrong_spec_version_and_empty_id_are_refused() {
        let mut ce = Event::new("a", EventType::Ping, Payload::None).to_cloud_event();
        ce.spec_version = "0.3".into();
        assert!(matches!(
            Event::from_cloud_event(ce.clone()),
            Err(EventError::SpecVersion { .. })
        ));
        ce.spec_version = "1.0".into();
        ce.id.clear();
        assert!(matches!(
            Event::from_cloud_event(ce),
            Err(EventError::Invalid { .. })
        ));
    }

    #[test]
    fn namespace_attribute_must_be_a_dns_label() {
        for bad in ["Agent_A", "", "a/b", &"x".repeat(64)] {
            let mut ce =
                Event::resource("a", EventType::Delete, app_ref(), Payload::None).to_cloud_event();
            ce.attributes.insert(
                "resourcenamespace".into(),
                attr(Attr::CeString(bad.to_string())),
            );
            assert!(
                matches!(
                    Event::from_cloud_event(ce),
                    Err(EventError::Invalid {
                        attr: "resourcenamespace",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn resource_name_attribute_must_be_a_dns1123_subdomain() {
        for ok in ["guestbook", "my.app-2", "0"] {
            let mut ce =
                Event::resource("a", EventType::Delete, app_ref(), Payload::None).to_cloud_event();
            ce.attributes
                .insert("resourcename".into(), attr(Attr::CeString(ok.to_string())));
            assert!(Event::from_cloud_event(ce).is_ok(), "{ok:?}");
        }
        let long = "x".repeat(254);
        for bad in [
            "",
            "..",
            "../../secrets/x",
            "guestbook/status",
            "guestbook?dryRun=All",
            "a\nlevel=ERROR forged",
            "a\0",
            "Guestbook",
            "-a",
            long.as_str(),
        ] {
            let mut ce =
                Event::resource("a", EventType::Delete, app_ref(), Payload::None).to_cloud_event();
            ce.attributes
                .insert("resourcename".into(), attr(Attr::CeString(bad.to_string())));
            let err = Event::from_cloud_event(ce).unwrap_err();
            assert!(
                matches!(
                    err,
                    EventError::Invalid {
                        attr: "resourcename",
                        ..
                    }
                ),
                "{bad:?}: {err}"
            );
            assert!(!err.to_string().contains('\n'), "{err}");
        }
    }

    #[test]
    fn object_payload_must_be_the_object_the_attributes_name() {
        let project_ref = ResourceRef {
            kind: ResourceKind::AppProject,
            ..app_ref()
        };
        let event = |r: &ResourceRef, obj: serde_json::Value| {
            Event::from_cloud_event(
                Event::resource(
                    "a",
                    EventType::Create,
                    r.clone(),
                    Payload::Object(Arc::new(obj)),
                )
                .to_cloud_event(),
            )
        };
        let app = json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": "guestbook"},
        });
        assert!(event(&app_ref(), app.clone()).is_ok());
        // Partial payloads (status updates) name nothing and are fine.
        assert!(event(&app_ref(), json!({"status": {}})).is_ok());
        let repo_ref = ResourceRef {
            kind: ResourceKind::Repository,
            ..app_ref()
        };
        let secret =
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "guestbook"}});
        assert!(event(&repo_ref, secret.clone()).is_ok());
        let gpg_ref = ResourceRef {
            kind: ResourceKind::GpgKeys,
            ..app_ref()
        };
        let cm =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "guestbook"}});
        assert!(event(&gpg_ref, cm).is_ok());

        let refused = [
            // Kind confusion: an Application authorized as an AppProject.
            (project_ref.clone(), app.clone(), "resourcekind"),
            (app_ref(), secret, "resourcekind"),
            (repo_ref.clone(), app.clone(), "resourcekind"),
            (app_ref(), json!({"kind": "AppProject"}), "resourcekind"),
            (app_ref(), json!({"kind": 7}), "resourcekind"),
            (
                app_ref(),
                json!({"apiVersion": "v1", "kind": "Application"}),
                "resourcekind",
            ),
            (
                repo_ref,
                json!({"apiVersion": "argoproj.io/v1alpha1"}),
                "resourcekind",
            ),
            (
                app_ref(),
                json!({"metadata": {"name": "other"}}),
                "resourcename",
            ),
            (
                app_ref(),
                json!({"metadata": {"name": null}}),
                "resourcename",
            ),
            (
                app_ref(),
                json!({"kind": "x".repeat(10_000)}),
                "resourcekind",
            ),
        ];
        for (r, obj, which) in refused {
            let err = event(&r, obj.clone()).unwrap_err();
            assert!(
                matches!(&err, EventError::Invalid { attr, .. } if *attr == which),
                "{obj}: {err}"
            );
            assert!(err.to_string().len() < 400, "{err}");
        }
    }

    #[test]
    fn processed_without_ackid_and_spec_update_without_object_are_refused() {
        let ce = Event::new("a", EventType::Processed, Payload::None).to_cloud_event();
        assert!(matches!(
            Event::from_cloud_event(ce),
            Err(EventError::Missing { attr: "ackid", .. })
        ));
        let ce =
            Event::resource("a", EventType::SpecUpdate, app_ref(), Payload::None).to_cloud_event();
        assert!(matches!(
            Event::from_cloud_event(ce),
            Err(EventError::Payload { .. })
        ));
    }
}
