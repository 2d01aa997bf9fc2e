//! Why the principal refuses: the reason words it counts
//! (`argocd_principal_events_refused_total`, `argocd_principal_auth_failures_total`) and tells
//! the agent, for the refusals made by the session, the per-agent bounds, the rate limits and
//! the tenants' quotas. A leaf: the modules that refuse and [`crate::metrics`] (which exports
//! every reason at zero) both import it.

/// Refusal reason (`argocd_principal_events_refused`) of a stream without a hello in time.
pub const HELLO_TIMEOUT: &str = "HelloTimeout";
/// Refusal reason of a message over `--max-message-size`.
pub const TOO_LARGE: &str = "TooLarge";
/// Refusal reason of bytes that are not a protobuf CloudEvent.
pub const UNDECODABLE: &str = "Undecodable";
/// Refusal reason of an agent that takes no outbound event for the idle timeout.
pub const NOT_READING: &str = "NotReading";

/// Reason label of `argocd_principal_events_refused_total` for rate-limited events.
pub const RATE_LIMITED: &str = "RateLimited";

/// Auth failure reason (`argocd_principal_auth_failures_total`) of a session refused by its
/// tenant's `agents` quota.
pub const TENANT_AGENT_QUOTA: &str = "TenantAgentQuota";
/// Refusal reason (`argocd_principal_events_refused_total`) of an event over its tenant's
/// `eventsPerSecond`.
pub const TENANT_RATE_LIMITED: &str = "TenantRateLimited";

/// Refusal reason of an object larger than `--agent-max-object-size`.
pub const OBJECT_TOO_LARGE: &str = "ObjectTooLarge";
/// Refusal reason of a new Application over `--agent-max-applications`.
pub const TOO_MANY_APPLICATIONS: &str = "TooManyApplications";
/// Refusal reason of a write that would take the agent over `--agent-max-bytes`.
pub const AGENT_BYTES_EXCEEDED: &str = "AgentBytesExceeded";
/// Refusal reason of a child whose parent is not on the hub.
pub const PARENT_NOT_FOUND: &str = "ParentNotFound";
/// Refusal reason of a child whose parent is not an Application the hub sends the agent.
pub const PARENT_NOT_HELD: &str = "ParentNotHeld";
/// Refusal reason of a child its parent's status does not list.
pub const CHILD_NOT_TRACKED: &str = "ChildNotTracked";
/// Refusal reason of a child whose project the hub does not send the agent.
pub const PROJECT_NOT_ALLOWED: &str = "ProjectNotAllowed";

/// Refusal reason of an agent's new Application over its tenant's `applicationsPerAgent`.
pub const AGENT_APPLICATION_QUOTA: &str = "TenantApplicationsPerAgentQuota";
/// Refusal reason of an agent's new Application over its tenant's `applications`.
pub const TENANT_APPLICATION_QUOTA: &str = "TenantApplicationQuota";
