//! The `tenants` scenario: one tenant at its limits never slows another (issue 41, item 3).
//!
//! The principal runs with a rules file declaring two tenants: team-a (agents
//! `spiffe://example.org/ns/team-a/sa/ta-<i>`, hub namespaces `ta-*`) with low quotas
//! (`eventsPerSecond` = `--rate`, `eventsBurst` the same, `applicationsPerAgent: 1`) and team-b
//! (`tb-*`) without quotas. `--agents` is split between them. Each agent holds one
//! Application (`app-<i>`).
//!
//! 1. **B alone**: team-b's agents make `--changes` round trips each way, one at a time, as
//!    `fanout` does: a hub write until the agent holds it, an agent status update until the
//!    hub holds it.
//! 2. **A at its limits**: team-a's agents flood status updates at [`FLOOD_FACTOR`] times
//!    the tenant's `eventsPerSecond`, and [`EXTRA_APPS`] more Applications per team-a agent
//!    are written to the hub than `applicationsPerAgent` allows; team-b repeats the same
//!    measurement meanwhile.
//!
//! Reported: B's p50/p99 alone and under A's flood, each way, the p99 ratios, and from the
//! principal's `/metrics` how many of A's events its tenant bucket refused
//! (`argocd_principal_tenant_quota_refused_total{tenant="team-a",quota="eventsPerSecond"}`),
//! how many of A's Applications were held back, and B's refusals (none expected), so the row
//! shows A was at its limits while B was measured.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use serde_json::json;

use argocd_agent_testkit::harness::{HarnessError, app_resource, http_get, kube_client, resource};

use super::env::BenchEnv;
use super::sim::{Fleet, SimAgent};
use super::{
    BenchOptions, Report, Scenario, bench_app, fleet, percentiles, poll_until, round2, scaled,
    until, wait_holding, with_env,
};

/// Team-a's agents send this many times their tenant's `eventsPerSecond`.
pub const FLOOD_FACTOR: f64 = 20.0;
/// Applications written per team-a agent past its `applicationsPerAgent: 1`.
pub const EXTRA_APPS: usize = 2;
/// Size of the Applications' inline values, bytes.
const PAD: usize = 512;

/// The rules file: one mapping rule per team, and the two tenants.
fn rules(events_per_second: f64) -> String {
    let burst = events_per_second.ceil().max(1.0) as u64;
    format!(
        r#"rules:
  - name: team-a
    template: "spiffe://example.org/ns/team-a/sa/{{sa}}"
    agent: "{{sa}}"
    namespace: "{{sa}}"
    mode: both
  - name: team-b
    template: "spiffe://example.org/ns/team-b/sa/{{sa}}"
    agent: "{{sa}}"
    namespace: "{{sa}}"
    mode: both
tenants:
  - name: team-a
    agents: ["spiffe://example.org/ns/team-a/sa/{{sa}}"]
    namespaces: ["ta-*"]
    quotas:
      applicationsPerAgent: 1
      eventsPerSecond: {events_per_second}
      eventsBurst: {burst}
  - name: team-b
    agents: ["spiffe://example.org/ns/team-b/sa/{{sa}}"]
    namespaces: ["tb-*"]
"#
    )
}

/// Agent `i` of a team (`a` or `b`): its name (and hub namespace).
fn agent_name(team: char, i: usize) -> String {
    format!("t{team}-{i:05}")
}

/// Creates the team's hub namespaces and `app-<i>` in each, then its agents.
async fn team(
    env: &BenchEnv,
    team: char,
    n: usize,
    writers: usize,
) -> Result<Vec<Arc<SimAgent>>, HarnessError> {
    let client = kube_client(&env.hub)?;
    let namespaces: Api<DynamicObject> =
        Api::all_with(client.clone(), &resource("", "Namespace", "namespaces"));
    let results: Vec<Result<(), HarnessError>> = futures::stream::iter(0..n)
        .map(|i| {
            let (client, namespaces) = (client.clone(), namespaces.clone());
            async move {
                let ns = agent_name(team, i);
                let obj: DynamicObject = serde_json::from_value(
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                )?;
                namespaces.create(&PostParams::default(), &obj).await?;
                let apps: Api<DynamicObject> = Api::namespaced_with(client, &ns, &app_resource());
                let app: DynamicObject =
                    serde_json::from_value(bench_app(&format!("app-{i}"), &ns, "v1", PAD))?;
                apps.create(&PostParams::default(), &app).await?;
                Ok(())
            }
        })
        .buffer_unordered(writers.max(1))
        .collect()
        .await;
    results.into_iter().collect::<Result<(), _>>()?;
    (0..n)
        .map(|i| {
            let name = agent_name(team, i);
            let id = argocd_agent_identity::SpiffeId::parse(&format!(
                "spiffe://example.org/ns/team-{team}/sa/{name}"
            ))?;
            SimAgent::new(name, env.svid(&id, Duration::from_secs(3600))?)
        })
        .collect()
}

/// Started and connected, every agent holding its `app-<i>` at `v1`.
async fn settled(
    env: &BenchEnv,
    agents: Vec<Arc<SimAgent>>,
    opts: &BenchOptions,
) -> Result<Fleet, HarnessError> {
    let n = agents.len();
    let f = fleet(env, agents, opts);
    until("every agent connected", scaled(n), || f.connected() == n).await?;
    wait_holding(&f, "v1", PAD, scaled(n)).await?;
    Ok(f)
}

/// `m` hub writes and `m` status updates to and from team-b, one at a time, each marked
/// with `tag`: (hub -> agent, agent -> hub) latencies.
async fn round_trips(
    env: &BenchEnv,
    fleet: &Fleet,
    m: usize,
    tag: &str,
) -> Result<(Vec<Duration>, Vec<Duration>), HarnessError> {
    let n = fleet.agents.len();
    let client = kube_client(&env.hub)?;
    fleet.arrivals.track(true);
    let mut down = Vec::with_capacity(m);
    for j in 0..m {
        let i = (j * 7919) % n;
        let marker = format!("{tag}{j}");
        let key = format!("app-{i}@{marker}");
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &fleet.agents[i].name, &app_resource());
        let t = Instant::now();
        argocd_agent_testkit::harness::merge_patch(
            &api,
            &format!("app-{i}"),
            json!({"spec": {"source": {"targetRevision": marker}}}),
        )
        .await?;
        poll_until(
            &format!("{key} at its agent"),
            Duration::from_secs(30),
            Duration::from_millis(1),
            || fleet.arrivals.get(&key).is_some(),
        )
        .await?;
        down.push(
            fleet
                .arrivals
                .get(&key)
                .map_or(Duration::ZERO, |at| at.saturating_duration_since(t)),
        );
    }
    let mut up = Vec::with_capacity(m);
    for j in 0..m {
        let i = (j * 7919) % n;
        let marker = format!("{tag}s{j}");
        let (name, ns) = (format!("app-{i}"), fleet.agents[i].name.clone());
        let t = Instant::now();
        fleet.agents[i].send_status(
            &name,
            json!({"sync": {"status": "Synced", "revision": marker}, "health": {"status": "Healthy"}}),
        )?;
        poll_until(
            &format!("status {marker} of {ns}/{name} on the hub"),
            Duration::from_secs(30),
            Duration::from_millis(1),
            || {
                argocd_agent_testkit::harness::stored_app(&env.hub, &ns, &name)
                    .and_then(|a| a.pointer("/status/sync/revision").cloned())
                    .is_some_and(|r| r == marker.as_str())
            },
        )
        .await?;
        up.push(t.elapsed());
    }
    Ok((down, up))
}

/// The sum of `name`'s series whose labels contain every one of `labels` (`k="v"`).
pub(super) fn sum_series(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            (rest.starts_with('{') && labels.iter().all(|want| rest.contains(want)))
                .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// Team-a's flood: every agent sends status updates for its `app-<i>` at `per_agent` per
/// second until `stop`; counts what it sent.
fn flood(
    agents: Vec<Arc<SimAgent>>,
    per_agent: f64,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let every = Duration::from_secs_f64(1.0 / per_agent.max(1e-3));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut k = 0u64;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            for (i, a) in agents.iter().enumerate() {
                let status = json!({"sync": {"status": "OutOfSync", "revision": format!("flood{k}")}, "health": {"status": "Progressing"}});
                if a.send_status(&format!("app-{i}"), status).is_ok() {
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            }
            k += 1;
        }
    })
}

/// Writes [`EXTRA_APPS`] Applications per team-a agent past its `applicationsPerAgent`.
async fn over_quota_apps(env: &BenchEnv, n: usize, writers: usize) -> Result<(), HarnessError> {
    let apps = (0..n)
        .flat_map(|i| (0..EXTRA_APPS).map(move |k| (agent_name('a', i), format!("app-{i}-x{k}"))));
    super::create_named_apps(env, apps, "v1", PAD, writers).await
}

/// Runs the scenario.
pub(super) async fn tenants(opts: &BenchOptions) -> Result<Report, HarnessError> {
    let per_tenant = (opts.agents / 2).max(1);
    let m = opts.changes;
    let eps = opts.rate;
    // The rules file must exist before the principal starts: the run's directory is made
    // here (kept with --dir, temporary otherwise).
    let tmp = match &opts.dir {
        Some(_) => None,
        None => Some(
            tempfile::Builder::new()
                .prefix("argocd-agent-bench")
                .tempdir()?,
        ),
    };
    let dir = opts
        .dir
        .clone()
        .or_else(|| tmp.as_ref().map(|t| t.path().to_path_buf()))
        .ok_or("no run directory")?;
    std::fs::create_dir_all(&dir)?;
    let rules_file = dir.join("rules.yaml");
    std::fs::write(&rules_file, rules(eps))?;
    let mut opts = opts.clone();
    opts.dir = Some(dir);
    opts.principal_args
        .extend(["--identity-rules".into(), rules_file.display().to_string()]);
    let opts = &opts;
    let r = with_env(opts, |env| async move {
        let r = async {
            let a_agents = team(&env, 'a', per_tenant, opts.writers).await?;
            let b_agents = team(&env, 'b', per_tenant, opts.writers).await?;
            let fleet_a = settled(&env, a_agents, opts).await?;
            let fleet_b = settled(&env, b_agents, opts).await?;

            // 1. B alone.
            let (down_alone, up_alone) = round_trips(&env, &fleet_b, m, "alone").await?;

            // 2. A at its limits, B measured again.
            let m0 = http_get(env.metrics_port, "/metrics").await?;
            let (stop, sent) = (
                Arc::new(AtomicBool::new(false)),
                Arc::new(AtomicU64::new(0)),
            );
            let offered = eps * FLOOD_FACTOR;
            let flooding = flood(
                fleet_a.agents.clone(),
                offered / per_tenant as f64,
                stop.clone(),
                sent.clone(),
            );
            over_quota_apps(&env, per_tenant, opts.writers).await?;
            // Let the bucket empty and the flood reach its pace before measuring.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let flood_start = Instant::now();
            let sent0 = sent.load(Ordering::Relaxed);
            let measured = round_trips(&env, &fleet_b, m, "flood").await;
            let flood_secs = flood_start.elapsed().as_secs_f64();
            let flood_sent = sent.load(Ordering::Relaxed) - sent0;
            stop.store(true, Ordering::Relaxed);
            let _ = flooding.await;
            let (down_flood, up_flood) = measured?;
            // The last refusals' answers and held-back conditions land.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let m1 = http_get(env.metrics_port, "/metrics").await?;
            let delta = |name: &str, labels: &[&str]| {
                sum_series(&m1, name, labels) - sum_series(&m0, name, labels)
            };
            const REFUSED: &str = "argocd_principal_tenant_quota_refused_total";
            let a_events_refused =
                delta(REFUSED, &["tenant=\"team-a\"", "quota=\"eventsPerSecond\""]);
            let a_held_back = sum_series(
                &m1,
                "argocd_principal_applications_held_back_total",
                &["tenant=\"team-a\""],
            );
            let b_refused = delta(REFUSED, &["tenant=\"team-b\""])
                + delta(
                    "argocd_principal_events_refused_total",
                    &["tenant=\"team-b\""],
                );
            fleet_a.stop().await;
            fleet_b.stop().await;

            let (da50, da99, _) = percentiles(down_alone);
            let (ua50, ua99, _) = percentiles(up_alone);
            let (df50, df99, _) = percentiles(down_flood);
            let (uf50, uf99, _) = percentiles(up_flood);
            let ratio = |flood: f64, alone: f64| round2(flood / alone.max(1e-3));
            let mut r = Report::new(Scenario::Tenants);
            r.put("agents_per_tenant", per_tenant);
            r.put("changes", m);
            r.put("a_quota_events_per_s", eps);
            r.put(
                "a_offered_events_per_s",
                round2(flood_sent as f64 / flood_secs.max(1e-9)),
            );
            r.put("a_events_refused", a_events_refused as u64);
            r.put("a_apps_held_back", a_held_back as u64);
            r.put("b_refused", b_refused as u64);
            r.put("b_alone_hub_to_agent_p50_ms", da50);
            r.put("b_alone_hub_to_agent_p99_ms", da99);
            r.put("b_flood_hub_to_agent_p50_ms", df50);
            r.put("b_flood_hub_to_agent_p99_ms", df99);
            r.put("hub_to_agent_p99_ratio", ratio(df99, da99));
            r.put("b_alone_agent_to_hub_p50_ms", ua50);
            r.put("b_alone_agent_to_hub_p99_ms", ua99);
            r.put("b_flood_agent_to_hub_p50_ms", uf50);
            r.put("b_flood_agent_to_hub_p99_ms", uf99);
            r.put("agent_to_hub_p99_ratio", ratio(uf99, ua99));
            Ok(r)
        }
        .await;
        (env, r)
    })
    .await;
    drop(tmp);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_summed_by_label() {
        let text = "# HELP x\n\
            argocd_principal_tenant_quota_refused_total{tenant=\"team-a\",quota=\"eventsPerSecond\"} 40\n\
            argocd_principal_tenant_quota_refused_total{tenant=\"team-a\",quota=\"agents\"} 1\n\
            argocd_principal_tenant_quota_refused_total{tenant=\"team-b\",quota=\"eventsPerSecond\"} 2\n";
        let name = "argocd_principal_tenant_quota_refused_total";
        assert_eq!(sum_series(text, name, &["tenant=\"team-a\""]), 41.0);
        assert_eq!(
            sum_series(
                text,
                name,
                &["tenant=\"team-a\"", "quota=\"eventsPerSecond\""]
            ),
            40.0
        );
        assert_eq!(sum_series(text, "argocd_principal_tenant_quota", &[]), 0.0);
    }

    #[test]
    fn the_rules_declare_both_tenants() {
        let r = rules(20.0);
        assert!(r.contains("eventsPerSecond: 20"), "{r}");
        assert!(r.contains("eventsBurst: 20"), "{r}");
        assert!(r.contains("- name: team-b"), "{r}");
    }
}
