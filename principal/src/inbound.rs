//! What the principal does with one event from an agent, decided without side effects:
//! authorization against the session's identity and mode, then validation of the payload.
//! The session applies the decision ([`crate::hub::Hub::apply`]) and answers.

use argocd_agent_identity::text;
use std::sync::Arc;

use argocd_agent_domain::authz::{self, Action, ObjectRef, Owner};
use argocd_agent_domain::{AgentIdentity, AgentMode, AgentName, ResourceKind};
use argocd_agent_domain::{Event, EventType, Payload, ResourceRef};
use argocd_agent_kubernetes::object::{self, REFRESHED_ANNOTATION, SOURCE_UID_ANNOTATION};
use argocd_agent_proto::eventstream::ErrorDetail;
use serde_json::Value;

/// What the hub records about who owns an object an agent wants to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerRecord {
    /// The object does not exist on the hub.
    Absent,
    /// It exists without an agent-name label (created on the hub).
    Unlabelled,
    /// Its agent-name label.
    Label(String),
}

/// An authorized change to the hub.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Write the hub copy's `.status` (the object must exist on the hub).
    WriteStatus {
        /// The object, as the event names it.
        resource: ResourceRef,
        /// The agent's `.status`, written as is (`null` when the payload has none).
        status: Value,
        /// The hub UID the agent's copy was made from (managed copies), when the agent
        /// says: a status of a copy of an earlier hub object of the same name is stale.
        source_uid: Option<String>,
        /// Managed: the spoke's Argo CD carried out the hub's refresh request of this value
        /// (the agent's `argocd-agent.argoproj-labs.io/refreshed` annotation).
        refreshed: Option<String>,
    },
    /// Create or update the hub copy from the agent's object (autonomous agents).
    Upsert {
        /// The object, as the event names it.
        resource: ResourceRef,
        /// The agent's whole object, as sent.
        object: Arc<Value>,
    },
    /// Delete the hub copy (autonomous agents).
    Delete {
        /// The object to delete, as the event names it.
        resource: ResourceRef,
    },
    /// Queue the hub's current copy (or a delete) for the agent again.
    ResendCurrent {
        /// The object the agent asked for.
        resource: ResourceRef,
    },
}

/// How the object an event names is tied to an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// By the agent's hub namespace (the default).
    Namespace,
    /// Destination-based mapping (managed Applications): by the hub Application's
    /// `spec.destination.name`, `None` when it does not exist or names none.
    Destination(Option<String>),
}

/// An event refused before anything was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Reason sent to the agent in the error event (`Forbidden`, `BadRequest`, `Invalid`).
    pub reason: &'static str,
    /// Reason code for the refused-events metric.
    pub metric: &'static str,
    /// What was wrong, naming the agent and the object.
    pub message: String,
}

/// The outcome of [`decide`].
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Answer a heartbeat.
    Pong,
    /// Nothing to do.
    Ignore,
    /// The agent acknowledged our event with this id.
    Acked(String),
    /// The agent reports that one of our events failed on its side.
    PeerError(ErrorDetail),
    /// Refuse with an error event.
    Refuse(Refusal),
    /// Apply this to the hub, then acknowledge.
    Apply(Command),
}

fn action_of(ty: EventType) -> Option<Action> {
    Some(match ty {
        EventType::Create => Action::Create,
        EventType::SpecUpdate => Action::UpdateSpec,
        EventType::StatusUpdate => Action::UpdateStatus,
        EventType::Delete => Action::Delete,
        EventType::SetOperation => Action::SetOperation,
        EventType::TerminateOperation => Action::TerminateOperation,
        EventType::RequestUpdate => Action::Read,
        _ => return None,
    })
}

/// Decides what to do with `event` from the agent `identity` running in `mode`.
/// `owner` is what the hub records about the object the event would write.
pub fn decide(
    identity: &AgentIdentity,
    mode: AgentMode,
    event: &Event,
    owner: &OwnerRecord,
    placement: &Placement,
) -> Decision {
    if let Some(control) = control_decision(event) {
        return control;
    }
    let (Some(action), Some(resource)) = (action_of(event.ty), event.resource.clone()) else {
        return Decision::Refuse(Refusal {
            reason: "BadRequest",
            metric: "UnexpectedEvent",
            message: format!("{} events are not accepted from agents", event.ty),
        });
    };
    let authorized = if is_spoke_child(mode, action, &resource, event) {
        check_spoke_child(identity, mode, action, &resource, owner)
    } else {
        check_authorized(identity, mode, action, &resource, owner, placement)
    };
    if let Err(refusal) = authorized {
        return Decision::Refuse(refusal);
    }
    if let Err(refusal) = check_payload_name(event, &resource) {
        return Decision::Refuse(refusal);
    }
    Decision::Apply(command_of(event, resource))
}

/// The protocol's own events (heartbeats, acknowledgements, peer errors), which carry no
/// change to authorize; `None` for every other event.
pub(crate) fn control_decision(event: &Event) -> Option<Decision> {
    Some(match event.ty {
        EventType::Ping => Decision::Pong,
        EventType::Pong => Decision::Ignore,
        EventType::Processed => event
            .ack_id
            .clone()
            .map_or(Decision::Ignore, Decision::Acked),
        EventType::Error => match &event.payload {
            Payload::Error(d) => Decision::PeerError(d.clone()),
            _ => Decision::Ignore,
        },
        _ => return None,
    })
}

/// Whether the event is a managed agent's write of a spoke-authored Application (an
/// app-of-apps child): its object names the parent ([`object::PARENT_ANNOTATION`]).
fn is_spoke_child(mode: AgentMode, action: Action, resource: &ResourceRef, event: &Event) -> bool {
    mode == AgentMode::Managed
        && resource.kind == ResourceKind::Application
        && matches!(action, Action::Create | Action::UpdateSpec | Action::Delete)
        && event
            .object()
            .and_then(|o| object::annotation_of(o, object::PARENT_ANNOTATION))
            .is_some_and(|p| !p.is_empty())
}

/// Authorizes a spoke-authored child's write ([`authz::authorize_spoke_child`]): an
/// Application created on the hub under that name is never the agent's, whatever the
/// action (a name collision is refused, never overwritten).
fn check_spoke_child(
    identity: &AgentIdentity,
    mode: AgentMode,
    action: Action,
    resource: &ResourceRef,
    owner: &OwnerRecord,
) -> Result<(), Refusal> {
    let owner_name = match owner {
        OwnerRecord::Label(l) => AgentName::new(l).ok(),
        _ => None,
    };
    let owner = match (owner, &owner_name) {
        (OwnerRecord::Label(_), Some(name)) => Owner::Agent(name),
        (OwnerRecord::Label(label), None) => Owner::Invalid(label),
        (OwnerRecord::Unlabelled, _) => Owner::Hub,
        (OwnerRecord::Absent, _) => Owner::Unknown,
    };
    let object = ObjectRef {
        kind: resource.kind,
        namespace: &resource.namespace,
        name: &resource.name,
        owner,
    };
    authz::authorize_spoke_child(identity, mode, action, &object).map_err(|denied| Refusal {
        reason: "Forbidden",
        metric: denied.reason_code(),
        message: denied.to_string(),
    })
}

/// Authorizes `action` on `resource` for the agent, given who the hub records as its owner
/// and how it is placed; `Err` is the `Forbidden` refusal.
fn check_authorized(
    identity: &AgentIdentity,
    mode: AgentMode,
    action: Action,
    resource: &ResourceRef,
    owner: &OwnerRecord,
    placement: &Placement,
) -> Result<(), Refusal> {
    let owner_name = match owner {
        OwnerRecord::Label(l) => AgentName::new(l).ok(),
        _ => None,
    };
    let owner = match (owner, &owner_name) {
        (OwnerRecord::Label(_), Some(name)) => Owner::Agent(name),
        (OwnerRecord::Label(label), None) => Owner::Invalid(label),
        // An Application in the agent's namespace without a label is adopted by a write
        // (which labels it), but never deleted: a hub-authored Application is not the
        // agent's to remove. Any other object created on the hub belongs to no agent.
        (OwnerRecord::Unlabelled, _)
            if resource.kind != ResourceKind::Application || action == Action::Delete =>
        {
            Owner::Hub
        }
        _ => Owner::Unknown,
    };
    let object = ObjectRef {
        kind: resource.kind,
        namespace: &resource.namespace,
        name: &resource.name,
        owner,
    };
    let verdict = match placement {
        Placement::Namespace => authz::authorize(identity, mode, action, &object),
        Placement::Destination(d) => {
            authz::authorize_by_destination(identity, mode, action, &object, d.as_deref())
        }
    };
    verdict.map_err(|denied| Refusal {
        reason: "Forbidden",
        metric: denied.reason_code(),
        message: denied.to_string(),
    })
}

/// An object payload must name the same object as the event's attributes; `Err` is the
/// `Invalid` refusal.
fn check_payload_name(event: &Event, resource: &ResourceRef) -> Result<(), Refusal> {
    if let Some(obj) = event.object() {
        let name = obj.pointer("/metadata/name").and_then(Value::as_str);
        if name.is_some_and(|n| n != resource.name) {
            return Err(Refusal {
                reason: "Invalid",
                metric: "Invalid",
                message: format!(
                    "payload names {}, event names {resource}",
                    text::quoted(&name.unwrap_or_default())
                ),
            });
        }
    }
    Ok(())
}

/// The hub change an authorized, valid event asks for.
fn command_of(event: &Event, resource: ResourceRef) -> Command {
    match event.ty {
        EventType::StatusUpdate => Command::WriteStatus {
            status: event
                .object()
                .and_then(|o| o.get("status").cloned())
                .unwrap_or_default(),
            source_uid: event
                .object()
                .and_then(|o| {
                    o.get("metadata")?
                        .get("annotations")?
                        .get(SOURCE_UID_ANNOTATION)
                })
                .and_then(Value::as_str)
                .map(str::to_owned),
            refreshed: event
                .object()
                .and_then(|o| object::annotation_of(o, REFRESHED_ANNOTATION))
                .map(str::to_owned),
            resource,
        },
        EventType::Create | EventType::SpecUpdate => Command::Upsert {
            object: event
                .object()
                .cloned()
                .unwrap_or_else(|| Arc::new(Value::Null)),
            resource,
        },
        EventType::Delete => Command::Delete { resource },
        // RequestUpdate; operations were refused by authorization above.
        _ => Command::ResendCurrent { resource },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_domain::{ClientIdentity, Namespace, ResourceKind, RuleSet};
    use argocd_agent_identity::SpiffeId;
    use serde_json::json;

    const NS: &str = "argocd-edge-7";

    fn identity(modes: &str) -> AgentIdentity {
        RuleSet::from_flags(&[format!(
            "template:spiffe://{{trust_domain}}/sa/{{sa}}=>{{sa}},namespace=argocd-{{sa}},mode={modes}"
        )])
        .unwrap()
        .map_client(&ClientIdentity::Spiffe(
            SpiffeId::parse("spiffe://example.org/sa/edge-7").unwrap(),
        ))
        .unwrap()
    }

    fn app(ns: &str, name: &str) -> ResourceRef {
        ResourceRef::new(ResourceKind::Application, Namespace::new(ns).unwrap(), name)
    }

    fn event(ty: EventType, ns: &str, name: &str, payload: Payload) -> Event {
        Event::resource("spoke", ty, app(ns, name), payload)
    }

    fn object(name: &str) -> Payload {
        Payload::Object(Arc::new(json!({
            "metadata": {"name": name},
            "spec": {"project": "default"},
            "status": {"sync": {"status": "Synced"}}
        })))
    }

    fn refused(d: Decision) -> Refusal {
        match d {
            Decision::Refuse(r) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn heartbeats_acks_and_peer_errors_need_no_authorization() {
        let who = identity("both");
        let ping = Event::new("spoke", EventType::Ping, Payload::None);
        assert_eq!(
            decide(
                &who,
                AgentMode::Managed,
                &ping,
                &OwnerRecord::Absent,
                &Placement::Namespace
            ),
            Decision::Pong
        );
        let pong = Event::new("spoke", EventType::Pong, Payload::None);
        assert_eq!(
            decide(
                &who,
                AgentMode::Managed,
                &pong,
                &OwnerRecord::Absent,
                &Placement::Namespace
            ),
            Decision::Ignore
        );
        let mut ack = Event::new("spoke", EventType::Processed, Payload::None);
        ack.ack_id = Some("e-1".into());
        assert_eq!(
            decide(
                &who,
                AgentMode::Managed,
                &ack,
                &OwnerRecord::Absent,
                &Placement::Namespace
            ),
            Decision::Acked("e-1".into())
        );
        let detail = ErrorDetail {
            reason: "ApplyFailed".into(),
            message: "boom".into(),
            event_id: "e-2".into(),
        };
        let err = Event::new("spoke", EventType::Error, Payload::Error(detail.clone()));
        assert_eq!(
            decide(
                &who,
                AgentMode::Autonomous,
                &err,
                &OwnerRecord::Absent,
                &Placement::Namespace
            ),
            Decision::PeerError(detail)
        );
    }

    #[test]
    fn managed_agent_status_update_becomes_a_status_write() {
        let e = event(
            EventType::StatusUpdate,
            NS,
            "guestbook",
            object("guestbook"),
        );
        assert_eq!(
            decide(
                &identity("both"),
                AgentMode::Managed,
                &e,
                &OwnerRecord::Absent,
                &Placement::Namespace
            ),
            Decision::Apply(Command::WriteStatus {
                resource: app(NS, "guestbook"),
                status: json!({"sync": {"status": "Synced"}}),
                source_uid: None,
                refreshed: None,
            })
        );
        // A managed copy says which hub object it was made from.
        let e = event(
            EventType::StatusUpdate,
            NS,
            "guestbook",
            Payload::Object(Arc::new(json!({
                "metadata": {"name": "guestbook",
                             "annotations": {"argocd.argoproj.io/source-uid": "uid-1"}},
                "status": {"sync": {"status": "Synced"}}
            }))),
        );
        assert!(matches!(
            decide(
                &identity("both"),
                AgentMode::Managed,
                &e,
                &OwnerRecord::Absent,
                &Placement::Namespace
            ),
            Decision::Apply(Command::WriteStatus { source_uid: Some(u), .. }) if u == "uid-1"
        ));
    }

    #[test]
    fn managed_agent_cannot_create_update_or_delete_on_the_hub() {
        for ty in [EventType::Create, EventType::SpecUpdate, EventType::Delete] {
            let e = event(ty, NS, "guestbook", object("guestbook"));
            let r = refused(decide(
                &identity("both"),
                AgentMode::Managed,
                &e,
                &OwnerRecord::Absent,
                &Placement::Namespace,
            ));
            assert_eq!((r.reason, r.metric), ("Forbidden", "ModeForbids"), "{ty}");
        }
    }

    #[test]
    fn a_managed_agents_spoke_authored_child_is_written_only_where_it_may() {
        let child = |name: &str| {
            Payload::Object(Arc::new(json!({
                "metadata": {"name": name, "annotations": {object::PARENT_ANNOTATION: "parent"}},
                "spec": {"project": "default"}
            })))
        };
        let decide_child = |ty, ns: &str, owner: &OwnerRecord, placement: &Placement| {
            decide(
                &identity("both"),
                AgentMode::Managed,
                &event(ty, ns, "child", child("child")),
                owner,
                placement,
            )
        };
        // New, or its own child copy: written (also with destination-based mapping, where
        // the child's destination names no agent).
        for owner in [OwnerRecord::Absent, OwnerRecord::Label("edge-7".into())] {
            for placement in [Placement::Namespace, Placement::Destination(None)] {
                let d = decide_child(EventType::SpecUpdate, NS, &owner, &placement);
                assert!(
                    matches!(d, Decision::Apply(Command::Upsert { .. })),
                    "{owner:?} {placement:?}: {d:?}"
                );
            }
        }
        let d = decide_child(
            EventType::Delete,
            NS,
            &OwnerRecord::Label("edge-7".into()),
            &Placement::Namespace,
        );
        assert!(
            matches!(d, Decision::Apply(Command::Delete { .. })),
            "{d:?}"
        );
        // A hub-authored Application of that name: never taken over nor deleted.
        for ty in [EventType::Create, EventType::SpecUpdate, EventType::Delete] {
            let r = refused(decide_child(
                ty,
                NS,
                &OwnerRecord::Unlabelled,
                &Placement::Namespace,
            ));
            assert_eq!((r.reason, r.metric), ("Forbidden", "NotOwner"), "{ty}");
            assert!(r.message.contains("created on the hub"), "{}", r.message);
        }
        // Another agent's object or namespace.
        let r = refused(decide_child(
            EventType::SpecUpdate,
            NS,
            &OwnerRecord::Label("agent-b".into()),
            &Placement::Namespace,
        ));
        assert_eq!(r.metric, "NotOwner");
        let r = refused(decide_child(
            EventType::SpecUpdate,
            "agent-b",
            &OwnerRecord::Absent,
            &Placement::Namespace,
        ));
        assert_eq!(r.metric, "WrongNamespace");
        // Without the parent annotation it is an ordinary managed write: refused.
        let r = refused(decide(
            &identity("both"),
            AgentMode::Managed,
            &event(EventType::SpecUpdate, NS, "child", object("child")),
            &OwnerRecord::Absent,
            &Placement::Namespace,
        ));
        assert_eq!(r.metric, "ModeForbids");
    }

    #[test]
    fn operations_from_agents_are_refused_in_both_modes() {
        for mode in [AgentMode::Managed, AgentMode::Autonomous] {
            for ty in [EventType::SetOperation, EventType::TerminateOperation] {
                let e = event(ty, NS, "guestbook", Payload::None);
                let r = refused(decide(
                    &identity("both"),
                    mode,
                    &e,
                    &OwnerRecord::Absent,
                    &Placement::Namespace,
                ));
                assert_eq!(r.metric, "ModeForbids", "{mode} {ty}");
            }
        }
    }

    #[test]
    fn autonomous_agent_writes_spec_and_deletes_its_own_objects() {
        let who = identity("both");
        for ty in [EventType::Create, EventType::SpecUpdate] {
            let e = event(ty, NS, "guestbook", object("guestbook"));
            assert!(matches!(
                decide(
                    &who,
                    AgentMode::Autonomous,
                    &e,
                    &OwnerRecord::Label("edge-7".into()),
                    &Placement::Namespace
                ),
                Decision::Apply(Command::Upsert { .. })
            ));
        }
        let e = event(EventType::Delete, NS, "guestbook", Payload::None);
        assert_eq!(
            decide(
                &who,
                AgentMode::Autonomous,
                &e,
                &OwnerRecord::Label("edge-7".into()),
                &Placement::Namespace
            ),
            Decision::Apply(Command::Delete {
                resource: app(NS, "guestbook")
            })
        );
        let e = event(
            EventType::StatusUpdate,
            NS,
            "guestbook",
            object("guestbook"),
        );
        assert!(matches!(
            decide(
                &who,
                AgentMode::Autonomous,
                &e,
                &OwnerRecord::Absent,
                &Placement::Namespace
            ),
            Decision::Apply(Command::WriteStatus { .. })
        ));
    }

    #[test]
    fn request_update_resends_the_hub_copy_in_both_modes() {
        for mode in [AgentMode::Managed, AgentMode::Autonomous] {
            let e = event(EventType::RequestUpdate, NS, "guestbook", Payload::None);
            assert_eq!(
                decide(
                    &identity("both"),
                    mode,
                    &e,
                    &OwnerRecord::Absent,
                    &Placement::Namespace
                ),
                Decision::Apply(Command::ResendCurrent {
                    resource: app(NS, "guestbook")
                })
            );
        }
    }

    #[test]
    fn another_agents_namespace_is_forbidden_for_every_event() {
        for mode in [AgentMode::Managed, AgentMode::Autonomous] {
            for ty in [
                EventType::StatusUpdate,
                EventType::SpecUpdate,
                EventType::Create,
                EventType::Delete,
                EventType::RequestUpdate,
            ] {
                let e = event(ty, "agent-b", "guestbook", object("guestbook"));
                let r = refused(decide(
                    &identity("both"),
                    mode,
                    &e,
                    &OwnerRecord::Absent,
                    &Placement::Namespace,
                ));
                assert_eq!(r.reason, "Forbidden", "{mode} {ty}");
                if ty == EventType::StatusUpdate || ty == EventType::RequestUpdate {
                    assert_eq!(r.metric, "WrongNamespace", "{mode} {ty}");
                }
            }
        }
    }

    #[test]
    fn objects_owned_by_another_agent_or_a_bad_label_are_forbidden() {
        let who = identity("both");
        let e = event(EventType::SpecUpdate, NS, "guestbook", object("guestbook"));
        let r = refused(decide(
            &who,
            AgentMode::Autonomous,
            &e,
            &OwnerRecord::Label("agent-b".into()),
            &Placement::Namespace,
        ));
        assert_eq!(r.metric, "NotOwner");
        assert!(
            r.message.contains("owned by agent \"agent-b\""),
            "{}",
            r.message
        );
        let r = refused(decide(
            &who,
            AgentMode::Autonomous,
            &e,
            &OwnerRecord::Label("Not An Agent".into()),
            &Placement::Namespace,
        ));
        assert_eq!(r.metric, "NotOwner");
    }

    #[test]
    fn hub_authored_applications_are_never_deleted_by_an_agent() {
        let who = identity("both");
        let e = event(EventType::Delete, NS, "guestbook", Payload::None);
        let r = refused(decide(
            &who,
            AgentMode::Autonomous,
            &e,
            &OwnerRecord::Unlabelled,
            &Placement::Namespace,
        ));
        assert_eq!((r.reason, r.metric), ("Forbidden", "NotOwner"));
        assert!(r.message.contains("created on the hub"), "{}", r.message);
        // A write still adopts it (and labels it); a delete of a name the hub does not
        // have goes on to the hub (answered NotFound there).
        let up = event(EventType::SpecUpdate, NS, "guestbook", object("guestbook"));
        assert!(matches!(
            decide(
                &who,
                AgentMode::Autonomous,
                &up,
                &OwnerRecord::Unlabelled,
                &Placement::Namespace
            ),
            Decision::Apply(Command::Upsert { .. })
        ));
        assert_eq!(
            decide(
                &who,
                AgentMode::Autonomous,
                &e,
                &OwnerRecord::Absent,
                &Placement::Namespace
            ),
            Decision::Apply(Command::Delete {
                resource: app(NS, "guestbook")
            })
        );
    }

    #[test]
    fn mode_outside_the_mapping_rule_is_forbidden() {
        let e = event(
            EventType::StatusUpdate,
            NS,
            "guestbook",
            object("guestbook"),
        );
        let r = refused(decide(
            &identity("autonomous"),
            AgentMode::Managed,
            &e,
            &OwnerRecord::Absent,
            &Placement::Namespace,
        ));
        assert_eq!(r.metric, "ModeNotAllowed");
    }

    #[test]
    fn payload_naming_another_object_is_invalid() {
        let e = event(EventType::SpecUpdate, NS, "guestbook", object("other"));
        let r = refused(decide(
            &identity("both"),
            AgentMode::Autonomous,
            &e,
            &OwnerRecord::Absent,
            &Placement::Namespace,
        ));
        assert_eq!((r.reason, r.metric), ("Invalid", "Invalid"));
    }

    #[test]
    fn hub_only_events_from_an_agent_are_bad_requests() {
        let who = identity("both");
        for ty in [
            EventType::Hello,
            EventType::Welcome,
            EventType::RequestResourceResync,
        ] {
            let e = Event::new("spoke", ty, Payload::None);
            let r = refused(decide(
                &who,
                AgentMode::Managed,
                &e,
                &OwnerRecord::Absent,
                &Placement::Namespace,
            ));
            assert_eq!(
                (r.reason, r.metric),
                ("BadRequest", "UnexpectedEvent"),
                "{ty}"
            );
        }
    }

    fn project_event(ty: EventType, name: &str) -> Event {
        Event::resource(
            "spoke",
            ty,
            ResourceRef::new(ResourceKind::AppProject, Namespace::new(NS).unwrap(), name),
            Payload::Object(Arc::new(json!({"metadata": {"name": name}, "spec": {}}))),
        )
    }

    #[test]
    fn projects_an_admin_created_on_the_hub_cannot_be_overwritten_by_an_agent() {
        let e = project_event(EventType::SpecUpdate, "team");
        let who = identity("both");
        let r = refused(decide(
            &who,
            AgentMode::Autonomous,
            &e,
            &OwnerRecord::Unlabelled,
            &Placement::Namespace,
        ));
        assert_eq!(r.metric, "NotOwner");
        assert!(r.message.contains("created on the hub"), "{}", r.message);
        let r = refused(decide(
            &who,
            AgentMode::Autonomous,
            &e,
            &OwnerRecord::Label("agent-b".into()),
            &Placement::Namespace,
        ));
        assert_eq!(r.metric, "NotOwner");
        assert!(matches!(
            decide(
                &who,
                AgentMode::Autonomous,
                &e,
                &OwnerRecord::Label("edge-7".into()),
                &Placement::Namespace
            ),
            Decision::Apply(Command::Upsert { .. })
        ));
        // A managed agent may not write projects at all.
        let r = refused(decide(
            &who,
            AgentMode::Managed,
            &e,
            &OwnerRecord::Absent,
            &Placement::Namespace,
        ));
        assert_eq!(r.metric, "ModeForbids");
        assert!(r.message.contains("appproject"), "{}", r.message);
    }

    #[test]
    fn repositories_and_gpg_keys_are_only_read_by_managed_agents() {
        let who = identity("both");
        for kind in [ResourceKind::Repository, ResourceKind::GpgKeys] {
            let r = |ty| {
                Event::resource(
                    "spoke",
                    ty,
                    ResourceRef::new(kind, Namespace::new(NS).unwrap(), "x"),
                    Payload::None,
                )
            };
            for mode in [AgentMode::Managed, AgentMode::Autonomous] {
                for ty in [
                    EventType::Create,
                    EventType::SpecUpdate,
                    EventType::Delete,
                    EventType::StatusUpdate,
                ] {
                    let d = refused(decide(
                        &who,
                        mode,
                        &r(ty),
                        &OwnerRecord::Absent,
                        &Placement::Namespace,
                    ));
                    assert_eq!(d.metric, "ModeForbids", "{kind} {mode} {ty}");
                }
            }
            assert!(matches!(
                decide(
                    &who,
                    AgentMode::Managed,
                    &r(EventType::RequestUpdate),
                    &OwnerRecord::Absent,
                    &Placement::Namespace
                ),
                Decision::Apply(Command::ResendCurrent { .. })
            ));
            refused(decide(
                &who,
                AgentMode::Autonomous,
                &r(EventType::RequestUpdate),
                &OwnerRecord::Absent,
                &Placement::Namespace,
            ));
        }
    }
}
