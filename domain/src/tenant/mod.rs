//! Tenants: groups of agents on one hub, bound to SPIFFE IDs.
//!
//! A tenant is declared in the `tenants:` section of the mapping rules file (the same file
//! or ConfigMap, reloaded live with the rules; see docs/tenancy.md for why not a CRD). It
//! names:
//!
//! - `agents`: SPIFFE ID patterns of its agents (the mapping templates' syntax);
//! - `namespaces`: the hub namespaces its agents may map to (globs);
//! - `admins`: SPIFFE ID patterns of its operators, who may call the admin API for this
//!   tenant only;
//! - `projects`, `repositories`, `repoCreds`, `gpgKeys`: the hub AppProjects, repository and
//!   repo-creds Secrets (by name) and GPG keys (by key ID) that belong to it;
//! - `quotas`: how much it may hold and do.
//!
//! ```yaml
//! tenants:
//!   - name: team-a
//!     agents: ["spiffe://example.org/ns/team-a/sa/{sa}"]
//!     namespaces: ["team-a-*"]
//!     admins: ["spiffe://example.org/ns/team-a-ops/sa/{sa}"]
//!     projects: ["team-a-*"]
//!     repositories: ["team-a-*"]
//!     repoCreds: ["team-a-*"]
//!     gpgKeys: ["4AEE18F83AFDEB23"]
//!     quotas:
//!       agents: 20
//!       applications: 1000
//!       applicationsPerAgent: 200
//!       eventsPerSecond: 100
//!       proxyRequestsInFlight: 16
//! ```
//!
//! Which identity is whose is decided by the patterns alone, never by object names or
//! labels an agent or hub writer could choose. Patterns of two tenants that could match a
//! common identity, namespace, project, Secret name or key ID are refused at load, as are a
//! tenant's agent and admin patterns that could match a common ID; so an identity belongs to
//! at most one tenant, in one role. Objects no tenant claims belong to the platform and reach
//! every agent their own rules select (today's behaviour); without any tenant declared,
//! nothing changes.

mod overlap;

use argocd_agent_identity::text::quoted;
use std::fmt;

use serde::Deserialize;

use crate::names::Namespace;
use argocd_agent_identity::id::SpiffeId;

pub use overlap::{Pattern, PatternError};

pub use crate::names::TenantName;

/// How much a tenant may hold and do; `None` is unlimited.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Quotas {
    /// Agents connected at once (across every principal replica that sees them).
    pub agents: Option<u32>,
    /// Applications on the hub across the tenant's namespaces: hub-authored, autonomous
    /// copies and app-of-apps children alike.
    pub applications: Option<u32>,
    /// Applications on the hub in one agent's namespace.
    pub applications_per_agent: Option<u32>,
    /// Events per second from all the tenant's agents together.
    pub events_per_second: Option<f64>,
    /// Events the tenant may send in a burst above its rate (default: one second's worth).
    pub events_burst: Option<u32>,
    /// Resource-proxy requests (including log streams and terminals) in flight at once for
    /// all the tenant's agents.
    pub proxy_requests_in_flight: Option<u32>,
}

/// One tenant as written in the YAML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct TenantSpec {
    name: Option<String>,
    #[serde(default)]
    agents: Vec<String>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    admins: Vec<String>,
    #[serde(default)]
    projects: Vec<String>,
    #[serde(default)]
    repositories: Vec<String>,
    #[serde(default)]
    repo_creds: Vec<String>,
    #[serde(default)]
    gpg_keys: Vec<String>,
    #[serde(default)]
    quotas: Quotas,
}

/// A tenant declaration that cannot be loaded: names the tenant and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tenant {tenant} field {field}: {reason}", tenant = quoted(.tenant))]
pub struct TenantError {
    /// The tenant's name (or `tenant-<n>` when it has none).
    pub tenant: String,
    /// The field, with its entry index where one is at fault (e.g. `agents[2]`).
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

/// Which kind of hub object a name pattern claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Hub namespaces.
    Namespace,
    /// AppProjects, by name.
    Project,
    /// Repository Secrets, by name.
    Repository,
    /// Repo-creds (credential template) Secrets, by name.
    RepoCreds,
    /// GPG public keys, by key ID.
    GpgKey,
}

impl Claim {
    const ALL: [Claim; 5] = [
        Claim::Namespace,
        Claim::Project,
        Claim::Repository,
        Claim::RepoCreds,
        Claim::GpgKey,
    ];

    /// The YAML field that declares it.
    pub fn field(self) -> &'static str {
        match self {
            Claim::Namespace => "namespaces",
            Claim::Project => "projects",
            Claim::Repository => "repositories",
            Claim::RepoCreds => "repoCreds",
            Claim::GpgKey => "gpgKeys",
        }
    }
}

/// One tenant, validated.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Its name.
    pub name: TenantName,
    agents: Vec<Pattern>,
    admins: Vec<Pattern>,
    claims: [Vec<Pattern>; 5],
    /// Its quotas.
    pub quotas: Quotas,
}

impl Tenant {
    /// Whether `id` is one of its agents.
    pub fn has_agent(&self, id: &SpiffeId) -> bool {
        self.agents.iter().any(|p| p.matches(id.as_str()))
    }

    /// Whether `id` is one of its operators.
    pub fn has_admin(&self, id: &SpiffeId) -> bool {
        self.admins.iter().any(|p| p.matches(id.as_str()))
    }

    /// Whether it claims the object of `kind` called `name`.
    pub fn claims(&self, kind: Claim, name: &str) -> bool {
        self.patterns(kind).iter().any(|p| p.matches(name))
    }

    /// Whether its agents may map to hub namespace `ns`.
    pub fn owns_namespace(&self, ns: &Namespace) -> bool {
        self.claims(Claim::Namespace, ns.as_str())
    }

    /// The patterns it declares for `kind`, as written.
    pub fn patterns(&self, kind: Claim) -> &[Pattern] {
        &self.claims[Claim::ALL.iter().position(|k| *k == kind).unwrap_or(0)]
    }

    /// Its agent patterns, as written.
    pub fn agent_patterns(&self) -> &[Pattern] {
        &self.agents
    }

    /// Its admin patterns, as written.
    pub fn admin_patterns(&self) -> &[Pattern] {
        &self.admins
    }
}

/// Every tenant of a hub. Empty when none is declared (then nothing is scoped).
#[derive(Debug, Clone, Default)]
pub struct Tenants {
    list: Vec<Tenant>,
}

impl Tenants {
    /// Validates the `tenants:` section: names, patterns, and that no two tenants (nor one
    /// tenant's agents and admins) can claim a common identity or object.
    pub(crate) fn from_specs(specs: Vec<TenantSpec>) -> Result<Tenants, TenantError> {
        let mut list: Vec<Tenant> = Vec::with_capacity(specs.len());
        for (i, spec) in specs.into_iter().enumerate() {
            let tenant = compile(spec, i + 1)?;
            if let Some(first) = list.iter().find(|t| t.name == tenant.name) {
                return Err(TenantError {
                    tenant: tenant.name.to_string(),
                    field: "name".into(),
                    reason: format!("the name is already used by tenant {}", first.name),
                });
            }
            check_overlaps(&list, &tenant)?;
            list.push(tenant);
        }
        Ok(Tenants { list })
    }

    /// Whether no tenant is declared.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Every tenant, in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = &Tenant> {
        self.list.iter()
    }

    /// The tenant called `name`.
    pub fn get(&self, name: &TenantName) -> Option<&Tenant> {
        self.list.iter().find(|t| &t.name == name)
    }

    /// The tenant whose agent `id` is.
    pub fn of_agent(&self, id: &SpiffeId) -> Option<&Tenant> {
        self.list.iter().find(|t| t.has_agent(id))
    }

    /// The tenant whose operator `id` is.
    pub fn of_admin(&self, id: &SpiffeId) -> Option<&Tenant> {
        self.list.iter().find(|t| t.has_admin(id))
    }

    /// The tenant that claims the object of `kind` called `name`; `None` is the platform's.
    pub fn owner(&self, kind: Claim, name: &str) -> Option<&TenantName> {
        self.list
            .iter()
            .find(|t| t.claims(kind, name))
            .map(|t| &t.name)
    }

    /// Whether an agent of `tenant` (`None`: an agent of no tenant) may receive the object of
    /// `kind` called `name`: objects of the platform reach everyone their own rules select;
    /// a tenant's objects reach that tenant's agents only.
    pub fn visible_to(&self, kind: Claim, name: &str, tenant: Option<&TenantName>) -> bool {
        match self.owner(kind, name) {
            None => true,
            Some(owner) => Some(owner) == tenant,
        }
    }
}

/// Where an agent of `tenant` named `agent` may not go: [`Tenants::check_agent`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantRefusal {
    /// The tenant's agent mapped to a hub namespace the tenant does not declare.
    NamespaceNotOwned {
        /// The tenant.
        tenant: TenantName,
        /// The namespace the rules gave.
        namespace: Namespace,
    },
    /// An agent of another tenant (or of none) mapped to a namespace this tenant claims.
    NamespaceOfTenant {
        /// The tenant that claims it.
        owner: TenantName,
        /// The namespace.
        namespace: Namespace,
    },
    /// The identity is a tenant's operator, never an agent.
    TenantAdmin {
        /// The tenant.
        tenant: TenantName,
    },
}

impl fmt::Display for TenantRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenantRefusal::NamespaceNotOwned { tenant, namespace } => write!(
                f,
                "tenant \"{tenant}\" does not list hub namespace \"{namespace}\" in its namespaces"
            ),
            TenantRefusal::NamespaceOfTenant { owner, namespace } => write!(
                f,
                "hub namespace \"{namespace}\" belongs to tenant \"{owner}\", which does not list this identity in its agents"
            ),
            TenantRefusal::TenantAdmin { tenant } => write!(
                f,
                "the identity is an admin of tenant \"{tenant}\": operators may call the admin API but never connect as an agent"
            ),
        }
    }
}

impl Tenants {
    /// The tenant of an agent identity that the rules mapped to `namespace`, or why it may
    /// not connect: a tenant's agents stay in its namespaces, nobody else enters them, and
    /// operators are never agents. `id` is `None` for callers without a SPIFFE ID (an
    /// upstream-style header capture), which belong to no tenant.
    pub fn check_agent(
        &self,
        id: Option<&SpiffeId>,
        namespace: &Namespace,
    ) -> Result<Option<TenantName>, TenantRefusal> {
        if let Some(t) = id.and_then(|id| self.of_admin(id)) {
            return Err(TenantRefusal::TenantAdmin {
                tenant: t.name.clone(),
            });
        }
        match id.and_then(|id| self.of_agent(id)) {
            Some(t) if t.owns_namespace(namespace) => Ok(Some(t.name.clone())),
            Some(t) => Err(TenantRefusal::NamespaceNotOwned {
                tenant: t.name.clone(),
                namespace: namespace.clone(),
            }),
            None => match self.owner(Claim::Namespace, namespace.as_str()) {
                Some(owner) => Err(TenantRefusal::NamespaceOfTenant {
                    owner: owner.clone(),
                    namespace: namespace.clone(),
                }),
                None => Ok(None),
            },
        }
    }
}

fn compile(spec: TenantSpec, index: usize) -> Result<Tenant, TenantError> {
    let shown = spec
        .name
        .clone()
        .unwrap_or_else(|| format!("tenant-{index}"));
    let err = |field: String, reason: String| TenantError {
        tenant: shown.clone(),
        field,
        reason,
    };
    let name = match &spec.name {
        None => return Err(err("name".into(), "every tenant needs a name".into())),
        Some(n) => TenantName::new(n).map_err(|e| err("name".into(), e.to_string()))?,
    };
    if spec.agents.is_empty() {
        return Err(err(
            "agents".into(),
            "list at least one SPIFFE ID pattern of the tenant's agents".into(),
        ));
    }
    if spec.namespaces.is_empty() {
        return Err(err(
            "namespaces".into(),
            "list at least one hub namespace the tenant's agents may map to".into(),
        ));
    }
    let ids = |field: &str, list: &[String]| -> Result<Vec<Pattern>, TenantError> {
        list.iter()
            .enumerate()
            .map(|(i, p)| {
                Pattern::spiffe_id(p).map_err(|r| err(format!("{field}[{}]", i + 1), r.to_string()))
            })
            .collect()
    };
    let globs = |field: &str, list: &[String]| -> Result<Vec<Pattern>, TenantError> {
        list.iter()
            .enumerate()
            .map(|(i, p)| {
                Pattern::glob(p).map_err(|r| err(format!("{field}[{}]", i + 1), r.to_string()))
            })
            .collect()
    };
    let agents = ids("agents", &spec.agents)?;
    let admins = ids("admins", &spec.admins)?;
    for (i, a) in agents.iter().enumerate() {
        if let Some((j, b)) = admins.iter().enumerate().find(|(_, b)| a.overlaps(b)) {
            return Err(err(
                format!("admins[{}]", j + 1),
                format!(
                    "{b} can match the same SPIFFE ID as agents[{}] {a}: an identity is an agent or an operator, never both",
                    i + 1
                ),
            ));
        }
    }
    check_quotas(&spec.quotas).map_err(|(field, reason)| err(format!("quotas.{field}"), reason))?;
    let claims = [
        globs("namespaces", &spec.namespaces)?,
        globs("projects", &spec.projects)?,
        globs("repositories", &spec.repositories)?,
        globs("repoCreds", &spec.repo_creds)?,
        globs("gpgKeys", &spec.gpg_keys)?,
    ];
    Ok(Tenant {
        name,
        agents,
        admins,
        claims,
        quotas: spec.quotas,
    })
}

fn check_quotas(q: &Quotas) -> Result<(), (&'static str, String)> {
    if let Some(r) = q.events_per_second
        && !(r.is_finite() && r > 0.0)
    {
        return Err((
            "eventsPerSecond",
            format!("{r} is not a positive number (leave it out for no limit)"),
        ));
    }
    if q.events_burst.is_some() && q.events_per_second.is_none() {
        return Err((
            "eventsBurst",
            "a burst needs eventsPerSecond as well".into(),
        ));
    }
    let zero = [
        ("agents", q.agents),
        ("applications", q.applications),
        ("applicationsPerAgent", q.applications_per_agent),
        ("eventsBurst", q.events_burst),
        ("proxyRequestsInFlight", q.proxy_requests_in_flight),
    ];
    if let Some((field, _)) = zero.iter().find(|(_, v)| *v == Some(0)) {
        return Err((
            field,
            "0 would refuse everything; leave the field out for no limit".into(),
        ));
    }
    Ok(())
}

/// Refuses `new` if any of its patterns could claim what an earlier tenant claims.
fn check_overlaps(earlier: &[Tenant], new: &Tenant) -> Result<(), TenantError> {
    let refuse = |field: String,
                  mine: &Pattern,
                  other: &Tenant,
                  their_field: String,
                  theirs: &Pattern| TenantError {
        tenant: new.name.to_string(),
        field,
        reason: format!(
            "{mine} can match what tenant \"{}\" claims with {their_field} {theirs}: an identity or object belongs to at most one tenant",
            other.name
        ),
    };
    let people = |t: &Tenant| -> Vec<(String, Pattern)> {
        let agents = t
            .agents
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("agents[{}]", i + 1), p.clone()));
        let admins = t
            .admins
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("admins[{}]", i + 1), p.clone()));
        agents.chain(admins).collect()
    };
    for other in earlier {
        for (field, mine) in people(new) {
            if let Some((their_field, theirs)) =
                people(other).into_iter().find(|(_, p)| mine.overlaps(p))
            {
                return Err(refuse(field, &mine, other, their_field, &theirs));
            }
        }
        for kind in Claim::ALL {
            for (i, mine) in new.patterns(kind).iter().enumerate() {
                if let Some((j, theirs)) = other
                    .patterns(kind)
                    .iter()
                    .enumerate()
                    .find(|(_, p)| mine.overlaps(p))
                {
                    return Err(refuse(
                        format!("{}[{}]", kind.field(), i + 1),
                        mine,
                        other,
                        format!("{}[{}]", kind.field(), j + 1),
                        theirs,
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
