//! `argocd-agentctl replicas`: the principal replicas and which agents each serves, read from
//! the hub's Leases (docs/ha.md), so one command answers "who serves edge-42?" without asking
//! every replica.

use std::collections::BTreeMap;
use std::time::Duration;

use argocd_agent_principal::ha::{AGENT_LABEL, LEASE_LABEL, LeaseView, replica_of};
use kube::api::{Api, DynamicObject, ListParams};

use crate::ctl::HubArgs;

/// Arguments of `argocd-agentctl replicas`.
#[derive(Debug, clap::Args)]
pub struct ReplicasArgs {
    /// Also list every agent with the replica serving it.
    #[arg(long)]
    pub(crate) agents: bool,
    #[command(flatten)]
    pub(crate) hub: HubArgs,
}

/// One replica as its Lease says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReplicaRow {
    pub replica: String,
    pub holder: String,
    pub renewed_ago: Option<Duration>,
    pub live: bool,
    pub agents: usize,
}

/// The replica table and agent -> (replica, moves) from the Leases (`now` for ages).
pub(crate) fn summarize(
    leases: &[DynamicObject],
    now: jiff::Timestamp,
) -> (Vec<ReplicaRow>, BTreeMap<String, (String, i32)>) {
    let label =
        |l: &DynamicObject, k: &str| l.metadata.labels.as_ref().and_then(|m| m.get(k)).cloned();
    let mut rows: BTreeMap<String, ReplicaRow> = BTreeMap::new();
    let mut agents = BTreeMap::new();
    for l in leases {
        let view = LeaseView::of(l);
        match label(l, LEASE_LABEL).as_deref() {
            Some("replica") => {
                let holder = view.holder.clone().unwrap_or_default();
                let replica = if holder.is_empty() {
                    l.metadata
                        .name
                        .as_deref()
                        .unwrap_or_default()
                        .trim_start_matches(argocd_agent_principal::ha::REPLICA_LEASE_PREFIX)
                        .to_string()
                } else {
                    replica_of(&holder).to_string()
                };
                let renewed_ago = view
                    .renewed
                    .and_then(|r| Duration::try_from(now.duration_since(r)).ok());
                rows.insert(
                    holder.clone(),
                    ReplicaRow {
                        replica,
                        live: !holder.is_empty() && !view.expired(now, Duration::ZERO),
                        holder,
                        renewed_ago,
                        agents: 0,
                    },
                );
            }
            Some("agent") => {
                let Some(agent) = label(l, AGENT_LABEL) else {
                    continue;
                };
                let serving = view
                    .holder
                    .as_deref()
                    .map(|h| replica_of(h).to_string())
                    .unwrap_or_else(|| "-".into());
                if let Some(h) = &view.holder
                    && let Some(row) = rows.get_mut(h)
                {
                    row.agents += 1;
                }
                agents.insert(agent, (serving, view.transitions));
            }
            _ => {}
        }
    }
    // Agent Leases may come before their replica's in the list: count again.
    for row in rows.values_mut() {
        row.agents = leases
            .iter()
            .filter(|l| label(l, LEASE_LABEL).as_deref() == Some("agent"))
            .filter(|l| LeaseView::of(l).holder.as_deref() == Some(row.holder.as_str()))
            .count();
    }
    let mut table: Vec<ReplicaRow> = rows.into_values().collect();
    table.sort_by(|a, b| a.replica.cmp(&b.replica));
    (table, agents)
}

/// Runs `replicas`: the replica table, then with `--agents` every agent and its replica.
pub async fn run(a: ReplicasArgs) -> crate::CmdResult {
    let client = a.hub.client().await?;
    let api: Api<DynamicObject> = Api::namespaced_with(
        client,
        &a.hub.namespace,
        &argocd_agent_kubernetes::Kind::Lease.api_resource(),
    );
    let leases = api
        .list(&ListParams::default().labels(LEASE_LABEL))
        .await
        .map_err(|e| format!("listing Leases in {}: {e}", a.hub.namespace))?
        .items;
    if leases.is_empty() {
        println!(
            "no principal Leases in namespace {}: the principal does not run with --ha",
            a.hub.namespace
        );
        return Ok(());
    }
    let (rows, agents) = summarize(&leases, jiff::Timestamp::now());
    println!(
        "{:<28} {:<10} {:<12} {:>7}",
        "REPLICA", "STATE", "RENEWED", "AGENTS"
    );
    for r in &rows {
        let renewed = r
            .renewed_ago
            .map(|d| format!("{:.1}s ago", d.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        let state = if r.live { "live" } else { "gone" };
        println!(
            "{:<28} {:<10} {:<12} {:>7}",
            r.replica, state, renewed, r.agents
        );
    }
    let unserved = agents.values().filter(|(r, _)| r == "-").count();
    println!(
        "agents: {} with a Lease, {unserved} not connected",
        agents.len()
    );
    if a.agents {
        println!();
        println!("{:<40} {:<28} {:>5}", "AGENT", "SERVED BY", "MOVES");
        for (agent, (replica, moves)) in &agents {
            println!("{agent:<40} {replica:<28} {moves:>5}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(
        name: &str,
        kind: &str,
        agent: Option<&str>,
        holder: Option<&str>,
        renewed: &str,
    ) -> DynamicObject {
        let mut labels = json!({ LEASE_LABEL: kind });
        if let Some(a) = agent {
            labels[AGENT_LABEL] = json!(a);
        }
        serde_json::from_value(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "argocd", "labels": labels},
            "spec": {"holderIdentity": holder, "renewTime": renewed,
                     "leaseDurationSeconds": 10, "leaseTransitions": 2}
        }))
        .unwrap()
    }

    #[test]
    fn replicas_and_agents_from_leases() {
        let now: jiff::Timestamp = "2026-11-23T12:00:05Z".parse().unwrap();
        let leases = vec![
            lease(
                "argocd-agent-session-a",
                "agent",
                Some("a"),
                Some("p-0_1"),
                "2026-11-23T11:59:00.000000Z",
            ),
            lease(
                "argocd-agent-replica-p-0",
                "replica",
                None,
                Some("p-0_1"),
                "2026-11-23T12:00:03.000000Z",
            ),
            lease(
                "argocd-agent-replica-p-1",
                "replica",
                None,
                Some("p-1_9"),
                "2026-11-23T11:59:00.000000Z",
            ),
            lease(
                "argocd-agent-session-b",
                "agent",
                Some("b"),
                None,
                "2026-11-23T11:59:00.000000Z",
            ),
        ];
        let (rows, agents) = summarize(&leases, now);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].replica, "p-0");
        assert!(rows[0].live);
        assert_eq!(rows[0].agents, 1);
        assert_eq!(rows[0].renewed_ago, Some(Duration::from_secs(2)));
        assert_eq!(rows[1].replica, "p-1");
        assert!(!rows[1].live, "renewed 65 s ago with a 10 s Lease");
        assert_eq!(agents["a"], ("p-0".to_string(), 2));
        assert_eq!(agents["b"].0, "-");
    }
}
