//! Authorization of every event an agent sends to the principal.
//!
//! One function, [`authorize`], decides; the rules, in the order they are checked:
//!
//! 1. the agent's mode must be one its mapping rule allows;
//! 2. the action must flow in the direction the mode allows for the object's kind
//!    (agent -> principal):
//!
//!    | kind          | action                                          | managed | autonomous |
//!    |---------------|-------------------------------------------------|---------|------------|
//!    | Application   | `Read`, `UpdateStatus`                          | yes     | yes        |
//!    | Application   | `Create`, `UpdateSpec`, `Delete`                | no      | yes        |
//!    | AppProject    | `Read`                                          | yes     | yes        |
//!    | AppProject    | `Create`, `UpdateSpec`, `Delete`                | no      | yes        |
//!    | Repository, GPGKeys | `Read`                                    | yes     | no         |
//!    | any           | `SetOperation`, `TerminateOperation`, `Refresh` | no      | no         |
//!    | any other combination                                           | no      | no         |
//!
//!    Operations and refreshes flow hub -> spoke only; a managed agent's hub copy is the
//!    source of truth for `.spec`, so it may only report status; projects, repositories
//!    and GPG keys flow from the hub to managed agents, and only an autonomous agent's own
//!    projects flow up;
//! 3. the object must be in the agent's own hub namespace;
//! 4. if the object's owner is known, it must be this agent (an object created on the hub
//!    by someone else belongs to nobody an agent may claim).
//!
//! One exception to rule 2, decided by [`authorize_spoke_child`]: a managed agent may
//! create, update and delete the Applications an app-of-apps parent created on its spoke
//! (spoke-authored children). Rules 3 and 4 hold for them strictly: only in its own hub
//! namespace (also with destination-based mapping), and never over an Application created
//! on the hub (a name collision is refused, not adopted). What needs the hub's state is
//! checked by the principal after this (`principal/src/bounds.rs`): the child's parent must
//! be an Application the hub sends the agent that lists the child in its status, its
//! project one the hub sends the agent, and every write is held to the agent's bounds.

// Denials are the rare path and carry everything a log line needs (identity, object,
// reason); boxing them would only add noise at every call site.
#![allow(clippy::result_large_err)]

use std::fmt;

use crate::client::ClientIdentity;
use crate::mapping::AgentIdentity;
use crate::names::{AgentMode, AgentName, AllowedModes, Namespace, ResourceKind};

/// What an agent asks to do to an object on the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Create an object (autonomous agents).
    Create,
    /// Replace or patch `.spec` (autonomous agents).
    UpdateSpec,
    /// Replace or patch `.status`.
    UpdateStatus,
    /// Delete an object (autonomous agents).
    Delete,
    /// Start a sync operation (hub -> spoke only).
    SetOperation,
    /// Terminate a running operation (hub -> spoke only).
    TerminateOperation,
    /// Request a refresh (hub -> spoke only).
    Refresh,
    /// Read an object.
    Read,
}

impl Action {
    /// The action as written in messages, e.g. `update-status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::UpdateSpec => "update-spec",
            Action::UpdateStatus => "update-status",
            Action::Delete => "delete",
            Action::SetOperation => "set-operation",
            Action::TerminateOperation => "terminate-operation",
            Action::Refresh => "refresh",
            Action::Read => "read",
        }
    }

    /// Whether an agent in `mode` may send this action on an object of `kind` to the
    /// principal (the table in the module docs).
    pub fn allowed_from_agent(self, mode: AgentMode, kind: ResourceKind) -> bool {
        let autonomous = mode == AgentMode::Autonomous;
        match (kind, self) {
            (_, Action::SetOperation | Action::TerminateOperation | Action::Refresh) => false,
            (ResourceKind::Application, Action::Read | Action::UpdateStatus) => true,
            (ResourceKind::AppProject, Action::Read) => true,
            (
                ResourceKind::Application | ResourceKind::AppProject,
                Action::Create | Action::UpdateSpec | Action::Delete,
            ) => autonomous,
            (ResourceKind::Repository | ResourceKind::GpgKeys, Action::Read) => !autonomous,
            _ => false,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The object an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectRef<'a> {
    /// Kind, e.g. `Application`.
    pub kind: ResourceKind,
    /// Hub namespace.
    pub namespace: &'a Namespace,
    /// Name.
    pub name: &'a str,
    /// Who owns the object on the hub, if anyone is recorded.
    pub owner: Owner<'a>,
}

/// The recorded owner of a hub object (its agent-name label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner<'a> {
    /// Nothing recorded (or the object does not exist yet).
    Unknown,
    /// Owned by this agent.
    Agent(&'a AgentName),
    /// The label holds something that is not an agent name: nobody may claim it.
    Invalid(&'a str),
    /// The object exists on the hub and was not written by an agent (e.g. an AppProject an
    /// administrator created): no agent may claim it.
    Hub,
}

/// Why an event was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeniedReason {
    /// The object is not in the agent's namespace.
    WrongNamespace {
        /// The agent's own namespace.
        own: Namespace,
    },
    /// The object belongs to another agent (or its owner label is not an agent name).
    NotOwner {
        /// Its owner, as recorded.
        owner: String,
    },
    /// The object exists on the hub and was not written by an agent.
    CreatedOnHub,
    /// Destination-based mapping: the Application's destination is another agent (or none).
    NotDestination {
        /// `spec.destination.name` of the hub Application, if any.
        destination: Option<String>,
    },
    /// The agent's mode does not allow this action from an agent.
    ModeForbids {
        /// The agent's mode.
        mode: AgentMode,
    },
    /// The agent runs in a mode its mapping rule does not allow.
    ModeNotAllowed {
        /// The agent's mode.
        mode: AgentMode,
        /// What its rule allows.
        allowed: AllowedModes,
        /// The rule.
        rule: String,
    },
}

/// An event refused by [`authorize`]; the message names the agent, its SPIFFE ID, the
/// action, the object and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Denied {
    /// The agent name.
    pub agent: AgentName,
    /// The caller (its SPIFFE ID).
    pub client: ClientIdentity,
    /// What it tried.
    pub action: Action,
    /// The object's kind.
    pub kind: ResourceKind,
    /// The object's namespace.
    pub namespace: Namespace,
    /// The object's name.
    pub name: String,
    /// Why it was refused.
    pub reason: DeniedReason,
}

impl Denied {
    /// A short stable code for metrics labels: `WrongNamespace`, `NotOwner`, `ModeForbids`
    /// or `ModeNotAllowed`.
    pub fn reason_code(&self) -> &'static str {
        match self.reason {
            DeniedReason::WrongNamespace { .. } => "WrongNamespace",
            DeniedReason::NotOwner { .. } | DeniedReason::CreatedOnHub => "NotOwner",
            DeniedReason::NotDestination { .. } => "NotDestination",
            DeniedReason::ModeForbids { .. } => "ModeForbids",
            DeniedReason::ModeNotAllowed { .. } => "ModeNotAllowed",
        }
    }
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "agent \"{}\" ({}) may not {} {} \"{}/{}\": ",
            self.agent,
            self.client,
            self.action,
            self.kind.as_str().to_ascii_lowercase(),
            self.namespace,
            self.name
        )?;
        match &self.reason {
            DeniedReason::WrongNamespace { own } => write!(
                f,
                "namespace \"{}\" belongs to another agent (own namespace is \"{own}\")",
                self.namespace
            ),
            DeniedReason::NotOwner { owner } => write!(f, "owned by agent \"{owner}\""),
            DeniedReason::NotDestination {
                destination: Some(d),
            } => write!(
                f,
                "its destination is agent \"{d}\" (destination-based mapping)"
            ),
            DeniedReason::NotDestination { destination: None } => write!(
                f,
                "it does not exist on the hub or names no destination (destination-based mapping)"
            ),
            DeniedReason::CreatedOnHub => write!(
                f,
                "the hub object it maps to was created on the hub, not by an agent, and no agent may change it"
            ),
            DeniedReason::ModeForbids { mode } => match (self.action, self.kind) {
                (Action::SetOperation | Action::TerminateOperation | Action::Refresh, _) => {
                    write!(
                        f,
                        "{} flows from the principal to agents, never from an agent",
                        self.action
                    )
                }
                (_, ResourceKind::AppProject) => write!(
                    f,
                    "projects flow from the hub to {mode} agents; only an autonomous agent's own projects flow up"
                ),
                (_, ResourceKind::Repository | ResourceKind::GpgKeys) => write!(
                    f,
                    "{}s flow from the hub to managed agents only; no agent may write them on the hub",
                    self.kind.as_str().to_ascii_lowercase()
                ),
                _ => write!(
                    f,
                    "a {mode} agent may only send status updates (the hub owns .spec)"
                ),
            },
            DeniedReason::ModeNotAllowed {
                mode,
                allowed,
                rule,
            } => write!(
                f,
                "it runs in {mode} mode, but its mapping rule \"{rule}\" allows {allowed}"
            ),
        }
    }
}

/// With destination-based mapping (managed agents): like [`authorize`], except that rules 3
/// and 4 become one: the hub Application's `spec.destination.name` (`destination`) must be
/// this agent, whatever namespace the Application lives in. Unlike upstream, a status update
/// for an Application bound to another agent is refused.
pub fn authorize_by_destination(
    identity: &AgentIdentity,
    mode: AgentMode,
    action: Action,
    object: &ObjectRef<'_>,
    destination: Option<&str>,
) -> Result<(), Denied> {
    check_mode_and_direction(identity, mode, action, object)?;
    if destination == Some(identity.agent.as_str()) {
        return Ok(());
    }
    Err(denial(
        identity,
        action,
        object,
        DeniedReason::NotDestination {
            destination: destination.map(str::to_owned),
        },
    ))
}

/// A managed agent's write of a spoke-authored Application (a child an app-of-apps parent
/// created on its spoke): `Create`, `UpdateSpec`, `UpdateStatus` and `Delete` are allowed
/// in the agent's own hub namespace, on an object that does not exist there yet or that
/// this agent wrote; an object created on the hub ([`Owner::Unknown`] is never passed for
/// it: the caller gives [`Owner::Hub`]) or another agent's is refused.
pub fn authorize_spoke_child(
    identity: &AgentIdentity,
    mode: AgentMode,
    action: Action,
    object: &ObjectRef<'_>,
) -> Result<(), Denied> {
    let deny = |reason| denial(identity, action, object, reason);
    if !identity.allowed_modes.allows(mode) {
        return check_mode_and_direction(identity, mode, action, object);
    }
    let allowed = mode == AgentMode::Managed
        && object.kind == ResourceKind::Application
        && matches!(
            action,
            Action::Create | Action::UpdateSpec | Action::UpdateStatus | Action::Delete
        );
    if !allowed {
        return Err(deny(DeniedReason::ModeForbids { mode }));
    }
    authorize_in_namespace(identity, object).map_err(deny)
}

/// Rules 3 and 4 of the module docs.
fn authorize_in_namespace(
    identity: &AgentIdentity,
    object: &ObjectRef<'_>,
) -> Result<(), DeniedReason> {
    if *object.namespace != identity.namespace {
        return Err(DeniedReason::WrongNamespace {
            own: identity.namespace.clone(),
        });
    }
    match object.owner {
        Owner::Unknown => Ok(()),
        Owner::Agent(owner) if *owner == identity.agent => Ok(()),
        Owner::Agent(owner) => Err(DeniedReason::NotOwner {
            owner: owner.to_string(),
        }),
        Owner::Invalid(label) => Err(DeniedReason::NotOwner {
            owner: label.to_owned(),
        }),
        Owner::Hub => Err(DeniedReason::CreatedOnHub),
    }
}

fn denial(
    identity: &AgentIdentity,
    action: Action,
    object: &ObjectRef<'_>,
    reason: DeniedReason,
) -> Denied {
    Denied {
        agent: identity.agent.clone(),
        client: identity.client.clone(),
        action,
        kind: object.kind,
        namespace: object.namespace.clone(),
        name: object.name.to_owned(),
        reason,
    }
}

/// Rules 1 and 2 of the module docs.
fn check_mode_and_direction(
    identity: &AgentIdentity,
    mode: AgentMode,
    action: Action,
    object: &ObjectRef<'_>,
) -> Result<(), Denied> {
    if !identity.allowed_modes.allows(mode) {
        return Err(denial(
            identity,
            action,
            object,
            DeniedReason::ModeNotAllowed {
                mode,
                allowed: identity.allowed_modes,
                rule: identity.rule.clone(),
            },
        ));
    }
    if !action.allowed_from_agent(mode, object.kind) {
        return Err(denial(
            identity,
            action,
            object,
            DeniedReason::ModeForbids { mode },
        ));
    }
    Ok(())
}

/// Decides whether the agent `identity`, running in `mode`, may perform `action` on `object`.
/// Used for every inbound event; see the module docs for the rules.
pub fn authorize(
    identity: &AgentIdentity,
    mode: AgentMode,
    action: Action,
    object: &ObjectRef<'_>,
) -> Result<(), Denied> {
    check_mode_and_direction(identity, mode, action, object)?;
    authorize_in_namespace(identity, object)
        .map_err(|reason| denial(identity, action, object, reason))
}
