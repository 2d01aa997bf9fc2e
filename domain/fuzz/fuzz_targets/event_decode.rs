//! Fuzz target: the event decoder, from wire bytes to a validated `Event`
//! (`CloudEvent::decode` then `Event::from_cloud_event`). Must never panic; an accepted event
//! must survive `to_cloud_event` → encode → decode → `from_cloud_event` unchanged.
//!
//! An even first byte: the rest is the protobuf CloudEvent as received. An odd first byte: the
//! rest builds a CloudEvent with a valid envelope (type, kind and which attributes are set
//! from the next bytes; namespace, name, ack id, traceparent and payload separated by NUL), so
//! the attribute, payload and shape checks are reached too.
#![no_main]

use std::collections::HashMap;

use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::cloudevents::cloud_event::cloud_event_attribute_value::Attr;
use argocd_agent_proto::cloudevents::cloud_event::{CloudEventAttributeValue, Data};
use argocd_agent_proto::prost::Message;
use argocd_agent_domain::Event;
use argocd_agent_domain::event::{SPEC_VERSION, TYPE_PREFIX};
use libfuzzer_sys::fuzz_target;

const TYPES: &[&str] = &[
    "hello",
    "welcome",
    "create",
    "delete",
    "spec-update",
    "status-update",
    "set-operation",
    "terminate-operation",
    "processed",
    "request-update",
    "request-synced-resource-list",
    "response-synced-resource",
    "request-resource-resync",
    "ping",
    "pong",
    "error",
    "redis-request",
    "redis-response",
    "redis-push",
    "cluster-cache-info-update",
    "resource-request",
    "resource-response",
    "log-request",
    "terminal-request",
];
const KINDS: &[&str] = &[
    "Application",
    "AppProject",
    "Repository",
    "GPGKeys",
    "Bogus",
];

fn attr(a: Attr) -> CloudEventAttributeValue {
    CloudEventAttributeValue { attr: Some(a) }
}

fn structured(data: &[u8]) -> Option<CloudEvent> {
    let [ty, kind, flags, rest @ ..] = data else {
        return None;
    };
    let mut parts = rest.splitn(5, |&b| b == 0);
    let mut next = || String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let (namespace, name, ack, traceparent) = (next(), next(), next(), next());
    let payload = parts.next().unwrap_or_default().to_vec();
    let mut attributes = HashMap::new();
    if flags & 1 != 0 {
        let ts = prost_types::Timestamp {
            seconds: 1_795_392_000 + i64::from(*flags),
            nanos: i32::from(*kind) * 1_000_003,
        };
        attributes.insert("time".to_owned(), attr(Attr::CeTimestamp(ts)));
    }
    if flags & 2 != 0 {
        let k = KINDS[usize::from(*kind) % KINDS.len()];
        attributes.insert("resourcekind".to_owned(), attr(Attr::CeString(k.into())));
        attributes.insert(
            "resourcenamespace".to_owned(),
            attr(Attr::CeString(namespace)),
        );
        attributes.insert("resourcename".to_owned(), attr(Attr::CeString(name)));
    }
    if flags & 4 != 0 {
        attributes.insert("ackid".to_owned(), attr(Attr::CeString(ack)));
    }
    if flags & 8 != 0 {
        attributes.insert("traceparent".to_owned(), attr(Attr::CeString(traceparent)));
    }
    let data = match flags >> 4 & 3 {
        0 => None,
        1 => Some(Data::BinaryData(payload.into())),
        2 => Some(Data::TextData(
            String::from_utf8_lossy(&payload).into_owned(),
        )),
        _ => Some(Data::ProtoData(prost_types::Any::default())),
    };
    Some(CloudEvent {
        id: "e-1".into(),
        source: "fuzz".into(),
        spec_version: SPEC_VERSION.into(),
        r#type: format!("{TYPE_PREFIX}{}", TYPES[usize::from(*ty) % TYPES.len()]),
        attributes,
        data,
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let ce = if mode % 2 == 0 {
        match CloudEvent::decode(rest) {
            Ok(ce) => ce,
            Err(_) => return,
        }
    } else {
        match structured(rest) {
            Some(ce) => ce,
            None => return,
        }
    };
    let Ok(event) = Event::from_cloud_event(ce) else {
        return;
    };
    let wire = event.to_cloud_event().encode_to_vec();
    let again = CloudEvent::decode(wire.as_slice()).expect("an encoded event decodes");
    let again = Event::from_cloud_event(again).expect("a re-encoded event is valid");
    assert_eq!(again, event);
});
