//! The admin API's tenant rules: which blocklist entries a caller may edit, and the tenants' view.

use argocd_agent_domain::AdminScope;
use argocd_agent_domain::mapping::LiveRules;
use argocd_agent_domain::tenant::{Quotas, Tenant};
use argocd_agent_identity::SpiffeId;
use argocd_agent_identity::text;
use argocd_agent_proto::admin::{BlockRequest, QuotaUse, TenantInfo};
use tonic::Status;

use crate::blocklist::{FINGERPRINTS, IDS, PREFIXES, normalize_fingerprint};
use crate::sessions::Sessions;

/// The blocklist data key and normalized entry of a request, or why it is invalid.
pub(super) fn entry(r: &BlockRequest) -> Result<(&'static str, String), Status> {
    let given = [&r.id, &r.prefix, &r.fingerprint]
        .iter()
        .filter(|v| !v.is_empty())
        .count();
    if given != 1 {
        return Err(Status::invalid_argument(
            "exactly one of id, prefix, fingerprint is required",
        ));
    }
    if !r.id.is_empty() {
        SpiffeId::parse(&r.id)
            .map_err(|e| Status::invalid_argument(format!("id {}: {e}", text::quoted(&r.id))))?;
        return Ok((IDS, r.id.clone()));
    }
    if !r.prefix.is_empty() {
        if !r.prefix.starts_with("spiffe://") {
            return Err(Status::invalid_argument(format!(
                "prefix {}: must start with spiffe://",
                text::quoted(&r.prefix)
            )));
        }
        return Ok((PREFIXES, r.prefix.clone()));
    }
    let f = normalize_fingerprint(&r.fingerprint);
    if f.len() != 64 || !f.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(Status::invalid_argument(
            "fingerprint: expected 32 bytes of hex (SHA-256)",
        ));
    }
    Ok((FINGERPRINTS, f))
}

/// Why a caller with `scope` may not block `(key, entry)` (the refusal's subject), or
/// `None` if it may: platform operators anything; a tenant's operators exact IDs of their
/// tenant's agents only.
pub(super) fn outside_scope(
    rules: &LiveRules,
    scope: &AdminScope,
    key: &str,
    entry: &str,
) -> Option<String> {
    let AdminScope::Tenant(tenant) = scope else {
        return None;
    };
    let rules = rules.current();
    let ours = key == IDS
        && SpiffeId::parse(entry).is_ok_and(|id| {
            rules
                .tenants()
                .get(tenant)
                .is_some_and(|t| t.has_agent(&id))
        });
    if ours {
        return None;
    }
    Some(match key {
        IDS => format!("identity {entry} (not one of tenant {tenant}'s agents)"),
        _ => format!("a blocklist {key} entry (tenant operators block exact agent IDs only)"),
    })
}

fn quota(name: &str, limit: Option<f64>, used: f64, refused: u64) -> QuotaUse {
    QuotaUse {
        name: name.into(),
        limit: limit.unwrap_or(0.0),
        used,
        refused,
    }
}

fn quotas(q: &Quotas, usage: &crate::tenant_limits::Usage) -> Vec<QuotaUse> {
    let refused = |n: &str| usage.refused.get(n).copied().unwrap_or(0);
    vec![
        quota(
            "agents",
            q.agents.map(f64::from),
            usage.agents_connected as f64,
            refused("agents"),
        ),
        quota(
            "eventsPerSecond",
            q.events_per_second,
            -1.0,
            refused("eventsPerSecond"),
        ),
        quota("eventsBurst", q.events_burst.map(f64::from), -1.0, 0),
        quota(
            "proxyRequestsInFlight",
            q.proxy_requests_in_flight.map(f64::from),
            f64::from(usage.proxy_in_flight),
            refused("proxyRequestsInFlight"),
        ),
        quota("applications", q.applications.map(f64::from), -1.0, 0),
        quota(
            "applicationsPerAgent",
            q.applications_per_agent.map(f64::from),
            -1.0,
            0,
        ),
    ]
}

/// What `ListTenants` shows about `tenant`.
pub(super) fn tenant_info(sessions: &Sessions, tenant: &Tenant) -> TenantInfo {
    let usage = sessions.tenancy.usage(&tenant.name);
    let mut agents: Vec<String> = sessions
        .agents()
        .iter()
        .filter(|s| s.identity().tenant.as_ref() == Some(&tenant.name))
        .map(|s| s.name.to_string())
        .collect();
    agents.sort();
    let show =
        |p: &[argocd_agent_domain::tenant::Pattern]| p.iter().map(|p| p.to_string()).collect();
    TenantInfo {
        name: tenant.name.to_string(),
        agents,
        connected: usage.local_agents.iter().map(|a| a.to_string()).collect(),
        agents_connected: u32::try_from(usage.agents_connected).unwrap_or(u32::MAX),
        quotas: quotas(&tenant.quotas, &usage),
        namespaces: show(tenant.patterns(argocd_agent_domain::tenant::Claim::Namespace)),
        agent_patterns: show(tenant.agent_patterns()),
        admin_patterns: show(tenant.admin_patterns()),
    }
}
