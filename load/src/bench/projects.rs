//! The `projects` scenario: configuration fan-out at scale. N managed agents, P AppProjects
//! in the hub's Argo CD namespace, each matching `agents_per_project` agents (by destination
//! name and source namespace) and each with one repository Secret; then M project changes,
//! one at a time. Reported: time until every agent the changed project matches holds the
//! change (p50/p99/max), whether exactly those agents got it, the principal's CPU per change,
//! and how many agents re-evaluated their set per change (the principal's
//! `argocd_principal_config_fanout_agents`).

use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use argocd_agent_testkit::harness::{HUB_ARGOCD_NS, HarnessError, kube_client, object, resource};

use super::sim::sim_name;
use super::{
    BenchOptions, Report, Scenario, percentiles, poll_until, round2, settled_fleet, with_env,
};

/// The agents project `j` of `p` matches, among `n` (`k` each, spread over the fleet).
fn matched(j: usize, n: usize, k: usize) -> Vec<usize> {
    let k = k.clamp(1, n.max(1));
    (0..k).map(|t| (j * k + t) % n).collect()
}

fn project(j: usize, agents: &[usize], marker: &str) -> DynamicObject {
    let names: Vec<String> = agents.iter().map(|i| sim_name(*i)).collect();
    object(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": format!("proj-{j}"), "namespace": HUB_ARGOCD_NS},
        "spec": {
            "description": marker,
            "sourceRepos": ["*"],
            "sourceNamespaces": names,
            "destinations": names.iter().map(|n| json!({"name": n, "namespace": "*", "server": "*"})).collect::<Vec<_>>()
        }
    }))
}

fn repository(j: usize) -> DynamicObject {
    object(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("repo-{j}"), "namespace": HUB_ARGOCD_NS,
                     "labels": {"argocd.argoproj.io/secret-type": "repository"}},
        "type": "Opaque",
        "stringData": {"project": format!("proj-{j}"), "type": "git",
                       "url": format!("https://git.example.com/team-{j}.git")}
    }))
}

/// Creates the Argo CD namespace, the projects and their repositories (`writers` at once).
async fn seed(env: &super::BenchEnv, opts: &BenchOptions) -> Result<(), HarnessError> {
    let client = kube_client(&env.hub)?;
    let namespaces: Api<DynamicObject> =
        Api::all_with(client.clone(), &resource("", "Namespace", "namespaces"));
    let ns = object(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": HUB_ARGOCD_NS}}),
    );
    if let Err(e) = namespaces.create(&PostParams::default(), &ns).await
        && !matches!(&e, kube::Error::Api(a) if a.code == 409)
    {
        return Err(e.into());
    }
    let projects: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        HUB_ARGOCD_NS,
        &resource("argoproj.io", "AppProject", "appprojects"),
    );
    let secrets: Api<DynamicObject> =
        Api::namespaced_with(client, HUB_ARGOCD_NS, &resource("", "Secret", "secrets"));
    let (n, k) = (opts.agents, opts.agents_per_project);
    let results: Vec<Result<(), HarnessError>> = futures::stream::iter(0..opts.projects)
        .map(|j| {
            let (projects, secrets) = (projects.clone(), secrets.clone());
            async move {
                projects
                    .create(&PostParams::default(), &project(j, &matched(j, n, k), "m0"))
                    .await?;
                secrets
                    .create(&PostParams::default(), &repository(j))
                    .await?;
                Ok(())
            }
        })
        .buffer_unordered(opts.writers.max(1))
        .collect()
        .await;
    results.into_iter().collect()
}

/// Runs the scenario.
pub(super) async fn projects(opts: &BenchOptions) -> Result<Report, HarnessError> {
    with_env(opts, |env| async move {
        let r = async {
            seed(&env, opts).await?;
            let fleet = settled_fleet(&env, opts, 256).await?;
            let (n, k, p) = (opts.agents, opts.agents_per_project, opts.projects);
            // Every agent holds its projects before the changes start.
            fleet.arrivals.track(true);
            let projects: Api<DynamicObject> = Api::namespaced_with(
                kube_client(&env.hub)?,
                HUB_ARGOCD_NS,
                &resource("argoproj.io", "AppProject", "appprojects"),
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
            let fanout0 = (
                env.metric("argocd_principal_config_fanout_agents_sum")
                    .await?,
                env.metric("argocd_principal_config_fanout_agents_count")
                    .await?,
            );
            let cpu0 = env.sample()?;
            let mut latencies = Vec::with_capacity(opts.changes);
            let mut wrong = 0usize;
            for c in 0..opts.changes {
                let j = (c * 7919) % p;
                let marker = format!("m{}", c + 1);
                let agents = matched(j, n, k);
                let t = Instant::now();
                projects
                    .patch(
                        &format!("proj-{j}"),
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"spec": {"description": marker}})),
                    )
                    .await?;
                let keys: Vec<String> = agents
                    .iter()
                    .map(|i| format!("{}:proj-{j}@{marker}", sim_name(*i)))
                    .collect();
                poll_until(
                    &format!("proj-{j}@{marker} at its {} agents", agents.len()),
                    Duration::from_secs(60),
                    Duration::from_millis(1),
                    || keys.iter().all(|k| fleet.arrivals.get(k).is_some()),
                )
                .await?;
                latencies.push(
                    keys.iter()
                        .filter_map(|k| fleet.arrivals.get(k))
                        .max()
                        .map_or(Duration::ZERO, |at| at.saturating_duration_since(t)),
                );
                let suffix = format!(":proj-{j}@{marker}");
                wrong += fleet.arrivals.count(|key| key.ends_with(&suffix)) - agents.len();
            }
            let cpu = env.sample()?.cpu_since(&cpu0);
            let fanout1 = (
                env.metric("argocd_principal_config_fanout_agents_sum")
                    .await?,
                env.metric("argocd_principal_config_fanout_agents_count")
                    .await?,
            );
            fleet.stop().await;
            let (p50, p99, max) = percentiles(latencies);
            let mut r = Report::new(Scenario::Projects);
            r.put("agents", n);
            r.put("projects", p);
            r.put("agents_per_project", k.min(n));
            r.put("changes", opts.changes);
            r.put("change_to_all_matched_p50_ms", p50);
            r.put("change_to_all_matched_p99_ms", p99);
            r.put("change_to_all_matched_max_ms", max);
            r.put("delivered_to_unmatched_agents", wrong);
            r.put(
                "principal_cpu_ms_per_change",
                cpu.per(opts.changes as u64, 1e3),
            );
            let routed = (fanout1.1 - fanout0.1).max(1.0);
            r.put(
                "agents_reevaluated_per_change",
                round2((fanout1.0 - fanout0.0) / routed),
            );
            Ok(r)
        }
        .await;
        (env, r)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_project_matches_its_share_of_the_fleet() {
        assert_eq!(matched(0, 100, 10), (0..10).collect::<Vec<_>>());
        assert_eq!(matched(12, 100, 10), (20..30).collect::<Vec<_>>());
        // Fewer agents than a project wants: each agent once.
        assert_eq!(matched(3, 4, 10), vec![0, 1, 2, 3]);
        assert_eq!(matched(0, 10, 0), vec![0]);
    }
}
