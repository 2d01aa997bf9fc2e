//! What an event from the principal asks of the spoke, decided without side effects, and
//! the pure helpers the spoke's flows use on objects.

use std::sync::Arc;

use argocd_agent_domain::{AgentMode, Event, EventType, Namespace, ResourceRef};
use argocd_agent_kubernetes::object;
use serde_json::{Value, json};

use crate::error::SpokeError;
use crate::managed::MANAGED_LABEL;
use crate::namespaces::AllowedNamespaces;

/// Managed: the labels and annotations of a copy that the hub decides (every one but
/// the agent's own label and the spoke-owned annotations, [`object::spoke_owned_key`]),
/// as JSON, to compare a local copy with the principal's object.
pub(super) fn hub_metadata(obj: &Value) -> Value {
    let pick = |field: &str, skip: &dyn Fn(&str) -> bool| -> serde_json::Map<String, Value> {
        obj.get("metadata")
            .and_then(|m| m.get(field))
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| !skip(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    json!({
        "labels": pick("labels", &|k| k == MANAGED_LABEL),
        "annotations": pick("annotations", &object::spoke_owned_key),
    })
}

/// Adds `condition` to `status.conditions` (replacing one of its type).
pub(super) fn add_condition(status: &mut Value, condition: Value) {
    if !status.is_object() {
        *status = json!({});
    }
    let ty = condition.get("type").cloned();
    let conditions = &mut status["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    if let Some(list) = conditions.as_array_mut() {
        list.retain(|c| c.get("type") != ty.as_ref());
        list.push(condition);
    }
}

/// Managed with destination-based mapping: the answer to an event for an Application in a
/// namespace the agent does not take (`None`: the namespace is allowed). A delete is done
/// (the agent holds nothing there); anything else is refused.
pub(super) fn outside_allowed(
    allowed: &AllowedNamespaces,
    event: &Event,
    resource: &ResourceRef,
) -> Option<Result<(), SpokeError>> {
    if allowed.allows(resource.namespace.as_str()) {
        return None;
    }
    if event.ty == EventType::Delete {
        return Some(Ok(()));
    }
    Some(Err(SpokeError::NamespaceNotPermitted {
        namespace: resource.namespace.as_str().to_owned(),
        allowed: allowed.describe(),
    }))
}

/// What an event from the principal asks of the spoke.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Command {
    /// Managed: create or update the local copy.
    Upsert(Arc<Value>),
    /// Managed: delete the local copy.
    Delete,
    /// Set `.operation` (a sync requested on the hub).
    SetOperation(Value),
    /// Terminate the running operation.
    TerminateOperation,
    /// Autonomous: publish the local object again (or its deletion).
    Republish,
    /// Managed: report the local copy's status again (a periodic resync found the hub's
    /// copy holding another status than the one this agent last sent).
    ReportStatus,
    /// Autonomous: a refresh requested on the hub copy (`normal` or `hard`), written as
    /// Argo CD's refresh annotation on the local Application.
    Refresh(String),
}

impl Command {
    /// For span fields.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Command::Upsert(_) => "upsert",
            Command::Delete => "delete",
            Command::SetOperation(_) => "set-operation",
            Command::TerminateOperation => "terminate-operation",
            Command::Republish => "republish",
            Command::ReportStatus => "report-status",
            Command::Refresh(_) => "refresh",
        }
    }
}

/// Decides what an event from the principal means for a spoke in `mode` whose hub namespace
/// is `hub_ns`, without side effects.
/// With `across_namespaces` (destination-based mapping, managed) any hub namespace is
/// accepted once the principal has welcomed us.
pub(super) fn plan(
    mode: AgentMode,
    hub_ns: Option<&Namespace>,
    across_namespaces: bool,
    event: &Event,
) -> Result<Command, SpokeError> {
    let Some(resource) = &event.resource else {
        return Err(SpokeError::NotAccepted { ty: event.ty, mode });
    };
    let namespace_ok = match hub_ns {
        Some(_) if across_namespaces && mode == AgentMode::Managed => true,
        Some(ns) => *ns == resource.namespace,
        None => false,
    };
    if !namespace_ok {
        return Err(SpokeError::WrongNamespace(resource.to_string()));
    }
    match (mode, event.ty) {
        (AgentMode::Managed, EventType::Create | EventType::SpecUpdate) => {
            let obj = event.object().cloned().unwrap_or_default();
            if obj.pointer("/metadata/name").and_then(Value::as_str) != Some(resource.name.as_str())
            {
                return Err(SpokeError::NameMismatch(resource.name.clone()));
            }
            Ok(Command::Upsert(obj))
        }
        (AgentMode::Managed, EventType::Delete) => Ok(Command::Delete),
        (_, EventType::SetOperation) => Ok(Command::SetOperation(
            event
                .object()
                .and_then(|o| o.get("operation").cloned())
                .unwrap_or(Value::Null),
        )),
        (_, EventType::TerminateOperation) => Ok(Command::TerminateOperation),
        (AgentMode::Autonomous, EventType::RequestUpdate) => Ok(Command::Republish),
        (AgentMode::Managed, EventType::RequestUpdate) => Ok(Command::ReportStatus),
        // The principal carries a refresh requested on the hub copy as a spec-update whose
        // object holds nothing but the name and the refresh annotation (an older agent
        // refuses it, and the hub copy keeps its request).
        (AgentMode::Autonomous, EventType::SpecUpdate) => event
            .object()
            .and_then(|o| refresh_request(o))
            .map(Command::Refresh)
            .ok_or(SpokeError::NotAccepted { ty: event.ty, mode }),
        (mode, ty) => Err(SpokeError::NotAccepted { ty, mode }),
    }
}

/// The refresh value of a refresh request (an object with no `spec`, only metadata
/// carrying [`object::REFRESH_ANNOTATION`]).
pub(super) fn refresh_request(obj: &Value) -> Option<String> {
    if obj.get("spec").is_some() {
        return None;
    }
    object::annotation_of(obj, object::REFRESH_ANNOTATION).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_domain::{Payload, ResourceKind};

    fn ns(s: &str) -> Namespace {
        Namespace::new(s).unwrap()
    }

    fn event(ty: EventType, ns_: &str, payload: Payload) -> Event {
        Event::resource(
            "principal",
            ty,
            ResourceRef::new(ResourceKind::Application, ns(ns_), "guestbook"),
            payload,
        )
    }

    fn app(name: &str) -> Payload {
        Payload::Object(Arc::new(json!({"metadata": {"name": name}, "spec": {}})))
    }

    #[test]
    fn managed_spoke_applies_specs_and_deletes_from_its_hub_namespace() {
        let hub = ns("edge-1");
        let e = event(EventType::SpecUpdate, "edge-1", app("guestbook"));
        assert!(matches!(
            plan(AgentMode::Managed, Some(&hub), false, &e),
            Ok(Command::Upsert(_))
        ));
        let e = event(EventType::Delete, "edge-1", Payload::None);
        assert_eq!(
            plan(AgentMode::Managed, Some(&hub), false, &e).unwrap(),
            Command::Delete
        );
    }

    #[test]
    fn events_for_another_hub_namespace_are_refused_in_both_modes() {
        let hub = ns("edge-1");
        for mode in [AgentMode::Managed, AgentMode::Autonomous] {
            let e = event(EventType::SetOperation, "edge-2", Payload::None);
            assert!(matches!(
                plan(mode, Some(&hub), false, &e),
                Err(SpokeError::WrongNamespace(_))
            ));
            // Before the first welcome nothing is accepted.
            assert!(matches!(
                plan(mode, None, false, &e),
                Err(SpokeError::WrongNamespace(_))
            ));
        }
    }

    #[test]
    fn autonomous_spoke_refuses_spec_and_delete_from_the_hub() {
        let hub = ns("edge-1");
        for ty in [EventType::Create, EventType::SpecUpdate, EventType::Delete] {
            let e = event(ty, "edge-1", app("guestbook"));
            assert!(
                matches!(
                    plan(AgentMode::Autonomous, Some(&hub), false, &e),
                    Err(SpokeError::NotAccepted { .. })
                ),
                "{ty}"
            );
        }
    }

    #[test]
    fn operations_reach_both_modes_and_request_update_asks_each_mode_for_its_own() {
        let hub = ns("edge-1");
        let op = Payload::Object(Arc::new(json!({"operation": {"sync": {}}})));
        for mode in [AgentMode::Managed, AgentMode::Autonomous] {
            let e = event(EventType::SetOperation, "edge-1", op.clone());
            assert_eq!(
                plan(mode, Some(&hub), false, &e).unwrap(),
                Command::SetOperation(json!({"sync": {}}))
            );
            let e = event(EventType::TerminateOperation, "edge-1", Payload::None);
            assert_eq!(
                plan(mode, Some(&hub), false, &e).unwrap(),
                Command::TerminateOperation
            );
        }
        let e = event(EventType::RequestUpdate, "edge-1", Payload::None);
        assert_eq!(
            plan(AgentMode::Autonomous, Some(&hub), false, &e).unwrap(),
            Command::Republish
        );
        // A managed agent owns only the status: the principal asks for that again.
        assert_eq!(
            plan(AgentMode::Managed, Some(&hub), false, &e).unwrap(),
            Command::ReportStatus
        );
    }

    #[test]
    fn destination_mapping_accepts_any_hub_namespace_for_managed_agents_only() {
        let hub = ns("edge-1");
        let e = event(EventType::SpecUpdate, "team-apps", app("guestbook"));
        assert!(matches!(
            plan(AgentMode::Managed, Some(&hub), true, &e),
            Ok(Command::Upsert(_))
        ));
        assert!(matches!(
            plan(AgentMode::Managed, Some(&hub), false, &e),
            Err(SpokeError::WrongNamespace(_))
        ));
        assert!(matches!(
            plan(AgentMode::Managed, None, true, &e),
            Err(SpokeError::WrongNamespace(_))
        ));
        let op = event(EventType::SetOperation, "team-apps", Payload::None);
        assert!(matches!(
            plan(AgentMode::Autonomous, Some(&hub), true, &op),
            Err(SpokeError::WrongNamespace(_))
        ));
    }

    #[test]
    fn autonomous_spoke_takes_a_refresh_request_from_the_hub() {
        let hub = ns("edge-1");
        let req = Payload::Object(Arc::new(json!({"metadata": {"name": "guestbook",
            "annotations": {object::REFRESH_ANNOTATION: "hard"}}})));
        let e = event(EventType::SpecUpdate, "edge-1", req);
        assert_eq!(
            plan(AgentMode::Autonomous, Some(&hub), false, &e).unwrap(),
            Command::Refresh("hard".into())
        );
        // With a spec it is an object, which an autonomous spoke never takes from the hub.
        let obj = Payload::Object(Arc::new(json!({"metadata": {"name": "guestbook",
            "annotations": {object::REFRESH_ANNOTATION: "hard"}}, "spec": {}})));
        let e = event(EventType::SpecUpdate, "edge-1", obj);
        assert!(plan(AgentMode::Autonomous, Some(&hub), false, &e).is_err());
    }

    #[test]
    fn the_hub_decides_labels_and_annotations_but_not_the_spokes_own() {
        let hub = json!({"metadata": {"labels": {"team": "a"},
            "annotations": {"owner": "x", object::REFRESH_ANNOTATION: "normal"}}});
        let local = json!({"metadata": {"labels": {"team": "a", MANAGED_LABEL: "true"},
            "annotations": {"owner": "x", object::NOTIFIED_ANNOTATION: "{}"}}});
        // The agent's label, the spoke's notification state and a refresh request (carried
        // out and removed by the spoke's Argo CD) are no drift.
        assert_eq!(hub_metadata(&hub), hub_metadata(&local));
        let edited = json!({"metadata": {"labels": {"team": "b", MANAGED_LABEL: "true"},
            "annotations": {"owner": "x"}}});
        assert_ne!(hub_metadata(&hub), hub_metadata(&edited));
    }

    #[test]
    fn destination_mapping_refuses_namespaces_not_allowed_but_takes_their_deletes() {
        let allowed = AllowedNamespaces::new("argocd", &["team-*".to_string()]).unwrap();
        for ns_ in ["argocd", "team-a"] {
            let e = event(EventType::SpecUpdate, ns_, app("guestbook"));
            assert!(outside_allowed(&allowed, &e, e.resource.as_ref().unwrap()).is_none());
        }
        for ty in [
            EventType::Create,
            EventType::SpecUpdate,
            EventType::SetOperation,
            EventType::TerminateOperation,
        ] {
            let e = event(ty, "prod", app("guestbook"));
            match outside_allowed(&allowed, &e, e.resource.as_ref().unwrap()) {
                Some(Err(err @ SpokeError::NamespaceNotPermitted { .. })) => {
                    let m = err.to_string();
                    assert!(
                        m.contains("namespace prod is not permitted")
                            && m.contains("--allowed-namespaces (team-*)"),
                        "{m}"
                    );
                }
                other => panic!("{ty}: {other:?}"),
            }
        }
        // Nothing is held there: a delete is done at once.
        let e = event(EventType::Delete, "prod", Payload::None);
        assert!(matches!(
            outside_allowed(&allowed, &e, e.resource.as_ref().unwrap()),
            Some(Ok(()))
        ));
    }

    #[test]
    fn payload_naming_another_object_is_refused() {
        let hub = ns("edge-1");
        let e = event(EventType::SpecUpdate, "edge-1", app("other"));
        assert!(matches!(
            plan(AgentMode::Managed, Some(&hub), false, &e),
            Err(SpokeError::NameMismatch(_))
        ));
    }
}
