//! Authorization of inbound events: every rule and every deny reason.

use std::sync::LazyLock;

use argocd_agent_domain::authz::{
    Action, DeniedReason, ObjectRef, Owner, authorize, authorize_spoke_child,
};
use argocd_agent_domain::mapping::{AgentIdentity, RuleSet};
use argocd_agent_domain::{AgentMode, AgentName, Namespace, ResourceKind};
use argocd_agent_identity::SpiffeId;

static OWN_NS: LazyLock<Namespace> = LazyLock::new(|| Namespace::new("argocd-edge-7").unwrap());
static AGENT_B_NS: LazyLock<Namespace> = LazyLock::new(|| Namespace::new("agent-b").unwrap());
static X_NS: LazyLock<Namespace> = LazyLock::new(|| Namespace::new("x").unwrap());
static AGENT_B: LazyLock<AgentName> = LazyLock::new(|| AgentName::new("agent-b").unwrap());
static EDGE_7: LazyLock<AgentName> = LazyLock::new(|| AgentName::new("edge-7").unwrap());

const ALL: [Action; 8] = [
    Action::Create,
    Action::UpdateSpec,
    Action::UpdateStatus,
    Action::Delete,
    Action::SetOperation,
    Action::TerminateOperation,
    Action::Refresh,
    Action::Read,
];

fn identity(modes: &str) -> AgentIdentity {
    let rules = RuleSet::from_flags(&[format!(
        "template:spiffe://{{trust_domain}}/ns/{{ns}}/sa/{{sa}}=>{{sa}},namespace=argocd-{{sa}},mode={modes},name=spire"
    )])
    .unwrap();
    rules
        .map(&SpiffeId::parse("spiffe://example.org/ns/argocd/sa/edge-7").unwrap())
        .unwrap()
}

fn own(name: &str) -> ObjectRef<'_> {
    ObjectRef {
        kind: ResourceKind::Application,
        namespace: &OWN_NS,
        name,
        owner: Owner::Unknown,
    }
}

#[test]
fn managed_agent_may_only_update_status_and_read() {
    let who = identity("both");
    for action in ALL {
        let res = authorize(&who, AgentMode::Managed, action, &own("guestbook"));
        let want_ok = matches!(action, Action::UpdateStatus | Action::Read);
        assert_eq!(res.is_ok(), want_ok, "{action}: {res:?}");
        if let Err(d) = res {
            assert_eq!(d.reason_code(), "ModeForbids", "{action}");
        }
    }
}

#[test]
fn managed_agent_cannot_create_apps_on_hub() {
    let d = authorize(
        &identity("both"),
        AgentMode::Managed,
        Action::Create,
        &own("guestbook"),
    )
    .unwrap_err();
    assert_eq!(
        d.to_string(),
        "agent \"edge-7\" (spiffe://example.org/ns/argocd/sa/edge-7) may not create application \
         \"argocd-edge-7/guestbook\": a managed agent may only send status updates (the hub owns .spec)"
    );
}

#[test]
fn autonomous_agent_may_write_spec_and_status_but_not_operations() {
    let who = identity("both");
    for action in ALL {
        let res = authorize(&who, AgentMode::Autonomous, action, &own("guestbook"));
        let want_ok = !matches!(
            action,
            Action::SetOperation | Action::TerminateOperation | Action::Refresh
        );
        assert_eq!(res.is_ok(), want_ok, "{action}: {res:?}");
    }
}

#[test]
fn operations_from_an_agent_are_always_refused() {
    let who = identity("both");
    for mode in [AgentMode::Managed, AgentMode::Autonomous] {
        for action in [
            Action::SetOperation,
            Action::TerminateOperation,
            Action::Refresh,
        ] {
            let d = authorize(&who, mode, action, &own("guestbook")).unwrap_err();
            assert_eq!(d.reason, DeniedReason::ModeForbids { mode });
            let msg = d.to_string();
            assert!(
                msg.contains(&format!(
                    "{action} flows from the principal to agents, never from an agent"
                )),
                "{msg}"
            );
        }
    }
}

#[test]
fn object_in_another_agents_namespace_is_refused_naming_all_parties() {
    let d = authorize(
        &identity("both"),
        AgentMode::Managed,
        Action::UpdateStatus,
        &ObjectRef {
            kind: ResourceKind::Application,
            namespace: &AGENT_B_NS,
            name: "guestbook",
            owner: Owner::Unknown,
        },
    )
    .unwrap_err();
    assert_eq!(d.reason_code(), "WrongNamespace");
    assert_eq!(
        d.to_string(),
        "agent \"edge-7\" (spiffe://example.org/ns/argocd/sa/edge-7) may not update-status \
         application \"agent-b/guestbook\": namespace \"agent-b\" belongs to another agent \
         (own namespace is \"argocd-edge-7\")"
    );
}

#[test]
fn reads_are_also_confined_to_the_own_namespace() {
    let mut obj = own("guestbook");
    obj.namespace = &AGENT_B_NS;
    let d = authorize(&identity("both"), AgentMode::Autonomous, Action::Read, &obj).unwrap_err();
    assert_eq!(d.reason_code(), "WrongNamespace");
}

#[test]
fn object_owned_by_another_agent_is_refused() {
    let obj = ObjectRef {
        owner: Owner::Agent(&AGENT_B),
        ..own("guestbook")
    };
    let d = authorize(
        &identity("both"),
        AgentMode::Autonomous,
        Action::Delete,
        &obj,
    )
    .unwrap_err();
    assert_eq!(d.reason_code(), "NotOwner");
    let msg = d.to_string();
    assert!(
        msg.contains("agent \"edge-7\"")
            && msg.contains("spiffe://example.org/ns/argocd/sa/edge-7")
            && msg.contains("may not delete application \"argocd-edge-7/guestbook\"")
            && msg.contains("owned by agent \"agent-b\""),
        "{msg}"
    );
    // Owned by itself: allowed.
    let mine = ObjectRef {
        owner: Owner::Agent(&EDGE_7),
        ..own("guestbook")
    };
    assert!(
        authorize(
            &identity("both"),
            AgentMode::Autonomous,
            Action::Delete,
            &mine
        )
        .is_ok()
    );
}

#[test]
fn mode_not_allowed_by_mapping_rule_is_refused_for_every_action() {
    let who = identity("managed");
    for action in ALL {
        let d = authorize(&who, AgentMode::Autonomous, action, &own("guestbook")).unwrap_err();
        assert_eq!(d.reason_code(), "ModeNotAllowed", "{action}");
        let msg = d.to_string();
        assert!(
            msg.contains("runs in autonomous mode, but its mapping rule \"spire\" allows managed"),
            "{msg}"
        );
    }
    assert!(authorize(&who, AgentMode::Managed, Action::UpdateStatus, &own("g")).is_ok());
    let who = identity("autonomous");
    let d = authorize(&who, AgentMode::Managed, Action::Read, &own("g")).unwrap_err();
    assert_eq!(d.reason_code(), "ModeNotAllowed");
}

#[test]
fn deny_reasons_map_to_their_codes() {
    let who = identity("both");
    let foreign = ObjectRef {
        namespace: &X_NS,
        ..own("g")
    };
    let cases = [
        (AgentMode::Managed, Action::Create, own("g"), "ModeForbids"),
        (
            AgentMode::Autonomous,
            Action::Create,
            foreign,
            "WrongNamespace",
        ),
        (
            AgentMode::Autonomous,
            Action::Create,
            ObjectRef {
                owner: Owner::Agent(&AGENT_B),
                ..own("g")
            },
            "NotOwner",
        ),
        (
            AgentMode::Autonomous,
            Action::UpdateSpec,
            ObjectRef {
                owner: Owner::Invalid("Not_An_Agent"),
                ..own("g")
            },
            "NotOwner",
        ),
    ];
    for (mode, action, obj, code) in cases {
        assert_eq!(
            authorize(&who, mode, action, &obj)
                .unwrap_err()
                .reason_code(),
            code
        );
    }
}

fn own_kind(kind: ResourceKind, owner: Owner<'_>) -> ObjectRef<'_> {
    ObjectRef {
        kind,
        namespace: &OWN_NS,
        name: "team-a",
        owner,
    }
}

#[test]
fn every_kind_follows_the_direction_table_in_both_modes() {
    let who = identity("both");
    for kind in ResourceKind::ALL {
        for mode in [AgentMode::Managed, AgentMode::Autonomous] {
            for action in ALL {
                let res = authorize(&who, mode, action, &own_kind(kind, Owner::Unknown));
                let autonomous = mode == AgentMode::Autonomous;
                let want_ok = match (kind, action) {
                    (_, Action::SetOperation | Action::TerminateOperation | Action::Refresh) => {
                        false
                    }
                    (ResourceKind::Application, Action::Read | Action::UpdateStatus) => true,
                    (ResourceKind::AppProject, Action::Read) => true,
                    (ResourceKind::AppProject, Action::UpdateStatus) => false,
                    (
                        ResourceKind::Application | ResourceKind::AppProject,
                        Action::Create | Action::UpdateSpec | Action::Delete,
                    ) => autonomous,
                    (ResourceKind::Repository | ResourceKind::GpgKeys, Action::Read) => !autonomous,
                    (ResourceKind::Repository | ResourceKind::GpgKeys, _) => false,
                };
                assert_eq!(res.is_ok(), want_ok, "{kind} {mode} {action}: {res:?}");
                if let Err(d) = res {
                    assert_eq!(d.reason_code(), "ModeForbids");
                    assert_eq!(d.kind, kind);
                }
            }
        }
    }
}

#[test]
fn denials_of_config_kinds_name_the_kind_and_the_flow() {
    let who = identity("both");
    let d = authorize(
        &who,
        AgentMode::Managed,
        Action::Create,
        &own_kind(ResourceKind::AppProject, Owner::Unknown),
    )
    .unwrap_err();
    let msg = d.to_string();
    assert!(
        msg.contains("may not create appproject \"argocd-edge-7/team-a\""),
        "{msg}"
    );
    assert!(msg.contains("projects flow from the hub"), "{msg}");
    let d = authorize(
        &who,
        AgentMode::Autonomous,
        Action::UpdateSpec,
        &own_kind(ResourceKind::Repository, Owner::Unknown),
    )
    .unwrap_err();
    let msg = d.to_string();
    assert!(msg.contains("may not update-spec repository"), "{msg}");
    assert!(msg.contains("no agent may write them on the hub"), "{msg}");
}

#[test]
fn a_hub_created_project_cannot_be_claimed_by_an_autonomous_agent() {
    let who = identity("both");
    let d = authorize(
        &who,
        AgentMode::Autonomous,
        Action::UpdateSpec,
        &own_kind(ResourceKind::AppProject, Owner::Hub),
    )
    .unwrap_err();
    assert_eq!(d.reason, DeniedReason::CreatedOnHub);
    assert_eq!(d.reason_code(), "NotOwner");
    assert!(d.to_string().contains("created on the hub"), "{d}");
    let b = authorize(
        &who,
        AgentMode::Autonomous,
        Action::UpdateSpec,
        &own_kind(ResourceKind::AppProject, Owner::Agent(&AGENT_B)),
    )
    .unwrap_err();
    assert_eq!(b.reason_code(), "NotOwner");
    assert!(
        authorize(
            &who,
            AgentMode::Autonomous,
            Action::UpdateSpec,
            &own_kind(ResourceKind::AppProject, Owner::Agent(&EDGE_7)),
        )
        .is_ok()
    );
}

#[test]
fn destination_mapping_accepts_only_the_agent_the_application_is_bound_to() {
    let who = identity("both");
    let in_x = ObjectRef {
        kind: ResourceKind::Application,
        namespace: &X_NS,
        name: "guestbook",
        owner: Owner::Unknown,
    };
    // Any namespace, as long as the destination is this agent.
    assert!(
        authz_dest(&who, Action::UpdateStatus, &in_x, Some("edge-7")).is_ok(),
        "own destination"
    );
    let d = authz_dest(&who, Action::UpdateStatus, &in_x, Some("agent-b")).unwrap_err();
    assert_eq!(d.reason_code(), "NotDestination");
    assert!(
        d.to_string()
            .contains("its destination is agent \"agent-b\""),
        "{d}"
    );
    let d = authz_dest(&who, Action::UpdateStatus, &in_x, None).unwrap_err();
    assert_eq!(d.reason_code(), "NotDestination");
    // Direction rules still apply.
    let d = authz_dest(&who, Action::UpdateSpec, &in_x, Some("edge-7")).unwrap_err();
    assert_eq!(d.reason_code(), "ModeForbids");
}

#[allow(clippy::result_large_err)] // the same shape as authorize() itself
fn authz_dest(
    who: &AgentIdentity,
    action: Action,
    object: &ObjectRef<'_>,
    destination: Option<&str>,
) -> Result<(), argocd_agent_domain::authz::Denied> {
    argocd_agent_domain::authz::authorize_by_destination(
        who,
        AgentMode::Managed,
        action,
        object,
        destination,
    )
}

#[test]
fn a_managed_agent_writes_its_spoke_authored_children_in_its_own_namespace_only() {
    let who = identity("both");
    for action in ALL {
        let res = authorize_spoke_child(&who, AgentMode::Managed, action, &own("child"));
        let want_ok = matches!(
            action,
            Action::Create | Action::UpdateSpec | Action::UpdateStatus | Action::Delete
        );
        assert_eq!(res.is_ok(), want_ok, "{action}: {res:?}");
    }
    // Its own child copy: yes. Another agent's object, one created on the hub (a name
    // collision), or another namespace: no.
    let mine = ObjectRef {
        owner: Owner::Agent(&EDGE_7),
        ..own("child")
    };
    assert!(authorize_spoke_child(&who, AgentMode::Managed, Action::Delete, &mine).is_ok());
    for (owner, code) in [
        (Owner::Agent(&AGENT_B), "NotOwner"),
        (Owner::Hub, "NotOwner"),
        (Owner::Invalid("x y"), "NotOwner"),
    ] {
        let obj = ObjectRef {
            owner,
            ..own("child")
        };
        let d =
            authorize_spoke_child(&who, AgentMode::Managed, Action::UpdateSpec, &obj).unwrap_err();
        assert_eq!(d.reason_code(), code, "{owner:?}");
    }
    let elsewhere = ObjectRef {
        namespace: &AGENT_B_NS,
        ..own("child")
    };
    let d =
        authorize_spoke_child(&who, AgentMode::Managed, Action::Create, &elsewhere).unwrap_err();
    assert_eq!(d.reason_code(), "WrongNamespace");
    let collision = ObjectRef {
        owner: Owner::Hub,
        ..own("child")
    };
    let d =
        authorize_spoke_child(&who, AgentMode::Managed, Action::Create, &collision).unwrap_err();
    assert!(d.to_string().contains("created on the hub"), "{d}");
    // Not for autonomous agents (their Applications are all theirs anyway), nor in a mode
    // the rule does not allow.
    assert!(authorize_spoke_child(&who, AgentMode::Autonomous, Action::Create, &own("c")).is_err());
    let autonomous_only = identity("autonomous");
    let d = authorize_spoke_child(
        &autonomous_only,
        AgentMode::Managed,
        Action::Create,
        &own("c"),
    )
    .unwrap_err();
    assert_eq!(d.reason_code(), "ModeNotAllowed");
}
