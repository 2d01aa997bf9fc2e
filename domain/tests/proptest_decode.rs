//! Property tests (proptest) of the event decoder, the stable-toolchain counterpart of the
//! cargo-fuzz target `sync/fuzz` `event_decode`: arbitrary wire bytes never panic
//! `CloudEvent::decode` + `Event::from_cloud_event`, and encode → decode of events is the
//! identity.

use std::sync::Arc;

use argocd_agent_domain::Namespace;
use argocd_agent_domain::{Event, EventError, EventType, Payload, ResourceKind, ResourceRef};
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::prost::Message;
use proptest::prelude::*;
use serde_json::{Value, json};

fn decode(bytes: &[u8]) -> Option<Result<Event, EventError>> {
    CloudEvent::decode(bytes).ok().map(Event::from_cloud_event)
}

fn kind() -> impl Strategy<Value = ResourceKind> {
    prop::sample::select(vec![
        ResourceKind::Application,
        ResourceKind::AppProject,
        ResourceKind::Repository,
        ResourceKind::GpgKeys,
    ])
}

fn object_type() -> impl Strategy<Value = EventType> {
    prop::sample::select(vec![
        EventType::Create,
        EventType::SpecUpdate,
        EventType::StatusUpdate,
    ])
}

/// JSON without floats (whose text form is not this test's subject).
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-zA-Z.$/-]{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn dns_label() -> impl Strategy<Value = String> {
    "[a-z]([a-z0-9-]{0,20}[a-z0-9])?"
}

fn round_trip(event: &Event) -> Event {
    let wire = event.to_cloud_event().encode_to_vec();
    decode(&wire)
        .expect("an encoded event decodes")
        .expect("an encoded event is valid")
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(bytes in any::<Vec<u8>>()) {
        if let Some(Ok(event)) = decode(&bytes) {
            prop_assert_eq!(round_trip(&event), event);
        }
    }

    #[test]
    fn object_events_round_trip(
        ty in object_type(),
        kind in kind(),
        ns in dns_label(),
        name in dns_label(),
        spec in json_value(),
        with_identity in any::<bool>(),
    ) {
        let mut obj = json!({"metadata": {"name": name, "namespace": ns}, "spec": spec});
        if with_identity {
            obj["kind"] = kind.object_kind().into();
            obj["apiVersion"] = kind.object_api_version().into();
        }
        let resource = ResourceRef::new(kind, Namespace::new(&ns).unwrap(), name);
        let event = Event::resource("agent-1", ty, resource, Payload::Object(Arc::new(obj)));
        prop_assert_eq!(round_trip(&event), event.clone());
        let ack = event.ack("principal");
        prop_assert_eq!(round_trip(&ack), ack);
    }

    #[test]
    fn an_object_naming_another_resource_is_refused(
        ty in object_type(),
        kind in kind(),
        name in dns_label(),
        other in dns_label(),
    ) {
        prop_assume!(name != other);
        let obj = json!({"metadata": {"name": other}});
        let resource = ResourceRef::new(kind, Namespace::new("agent-1").unwrap(), name);
        let event = Event::resource("agent-1", ty, resource, Payload::Object(Arc::new(obj)));
        let wire = event.to_cloud_event().encode_to_vec();
        let is_invalid_name = matches!(
            decode(&wire),
            Some(Err(EventError::Invalid { attr: "resourcename", .. }))
        );
        prop_assert!(is_invalid_name);
    }

    #[test]
    fn truncated_events_never_panic(
        kind in kind(),
        name in dns_label(),
        spec in json_value(),
        cut in any::<prop::sample::Index>(),
    ) {
        let obj = json!({"metadata": {"name": name}, "spec": spec});
        let resource = ResourceRef::new(kind, Namespace::new("agent-1").unwrap(), name);
        let event = Event::resource("agent-1", EventType::Create, resource, Payload::Object(Arc::new(obj)));
        let wire = event.to_cloud_event().encode_to_vec();
        let _ = decode(&wire[..cut.index(wire.len())]);
    }
}

/// Found by the `event_decode` fuzz target: without serde_json's `float_roundtrip`, a long
/// number in an object (here 39 digits) parsed to a float whose printed form parsed back to a
/// different float, so an event changed on every decode → encode → decode hop.
#[test]
fn long_numbers_survive_a_round_trip() {
    let obj: Value = serde_json::from_str(
        r#"{"metadata": {"name": "app"}, "spec": 111111111111111111111111111111111111111}"#,
    )
    .unwrap();
    let resource = ResourceRef::new(
        ResourceKind::Application,
        Namespace::new("agent-1").unwrap(),
        "app",
    );
    let event = Event::resource(
        "agent-1",
        EventType::Create,
        resource,
        Payload::Object(Arc::new(obj)),
    );
    assert_eq!(round_trip(&event), event);
}
