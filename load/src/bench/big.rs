//! The big scenarios: many Applications on one hub (`big-hub`) and on one spoke
//! (`big-spoke`).
//!
//! `big-hub`: N simulated agents, first with one Application each, then with
//! `apps_per_agent` each. For both sizes: the principal's start until `/readyz` with the
//! Applications on the hub and no agent connected (its watch cache's initial list), its RSS
//! then, a `kill -9` storm (every agent's first Application changed while it is down), and
//! its RSS once the fleet is resynced and it is quiet. RSS per Application is the difference
//! between the two sizes divided by the Applications added, with the agents connected and
//! without.
//!
//! `big-spoke`: the demo topology with one real managed agent process (the shipped binary)
//! and `spoke_apps` Applications in its hub namespace, so on its spoke: the agent's RSS and
//! idle CPU, resync after a link outage and after a principal restart (some Applications
//! changed meanwhile), and hub write → spoke object updated latency while changes stream at
//! a steady rate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use serde_json::json;

use argocd_agent_kube_test_server::KubeTestServer;
use argocd_agent_testkit::harness::{
    HarnessError, MANAGED, Proc, SPOKE_NS, Topology, TopologyOptions, http_get, kube_client,
    merge_patch, metric_value,
};

use super::env::{BenchEnv, ProcSample, wait_ready_on};
use super::sim::{Fleet, SimAgent, sim_name};
use super::tenants::sum_series;
use super::{
    BenchOptions, Report, Scenario, bench_app, connected_fleet_within, create_apps,
    create_namespaces, fleet as fleet_of, mib, percentiles, poll_until, round2, scaled,
    set_revision, until, wait_holding, with_env,
};

/// Extra bytes of inline Helm values in each Application (about 1.1 KB of JSON each, as in
/// `storm`).
const PAD: usize = 512;

/// How long a principal may take to list `apps` Applications and be ready.
fn ready_timeout(apps: usize) -> Duration {
    Duration::from_secs(120 + apps as u64 / 500)
}

/// Starts the (stopped or killed) principal; time until its `/readyz` says ready.
async fn start_principal(env: &mut BenchEnv, apps: usize) -> Result<Duration, HarnessError> {
    let started = Instant::now();
    env.principal.start()?;
    env.wait_ready(ready_timeout(apps)).await?;
    Ok(started.elapsed())
}

/// The principal's RSS once it is quiet (at most 60 s of waiting).
async fn quiet_rss(env: &BenchEnv) -> Result<u64, HarnessError> {
    proc_quiet_rss(&env.principal).await
}

/// The RSS of a principal process (a replica, say) once it is quiet, as [`quiet_rss`].
async fn proc_quiet_rss(proc: &Proc) -> Result<u64, HarnessError> {
    super::env::until_quiet(proc, Duration::from_secs(60)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = proc
        .pid()
        .ok_or_else(|| format!("{} is not running", proc.name))?;
    Ok(ProcSample::read(pid)?.rss)
}

/// What each of `n` agents must hold when `total` Applications are on the hub: `app-j` for
/// every `j ≡ i (mod n)`, as `(name, spec checksum)`; its first one (`app-i`) at `first`,
/// the others at `v1`.
fn expected(n: usize, total: usize, first: &str) -> Vec<Vec<(String, String)>> {
    let mut want = vec![Vec::new(); n];
    for j in 0..total {
        let (i, name) = (j % n, format!("app-{j}"));
        let rev = if j < n { first } else { "v1" };
        let app = bench_app(&name, &sim_name(i), rev, PAD);
        want[i].push((
            name,
            argocd_agent_kubernetes::object::checksum_of(&app["spec"]),
        ));
    }
    want
}

/// Waits until every agent holds exactly what `want` says.
async fn wait_all_held(
    fleet: &Fleet,
    want: &[Vec<(String, String)>],
    timeout: Duration,
) -> Result<Duration, HarnessError> {
    let total: usize = want.iter().map(Vec::len).sum();
    let started = Instant::now();
    loop {
        let held: usize = fleet.agents.iter().map(|a| a.app_count()).sum();
        if held >= total
            && fleet.agents.iter().zip(want).all(|(a, apps)| {
                apps.iter()
                    .all(|(name, sum)| a.checksum(name).as_deref() == Some(sum.as_str()))
            })
        {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            return Err(format!(
                "timed out after {timeout:?}: the agents hold {held} of {total} Applications"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One storm's times, from the restart.
struct Storm {
    ready: Duration,
    reconnected: Duration,
    resynced: Duration,
}

/// `kill -9` the principal under `fleet`, point every agent's first Application at
/// `revision` while it is down, restart it; time until ready, every agent reconnected, and
/// every agent holding `want`.
async fn storm_once(
    env: &mut BenchEnv,
    fleet: &Fleet,
    opts: &BenchOptions,
    revision: &str,
    want: &[Vec<(String, String)>],
) -> Result<Storm, HarnessError> {
    let n = fleet.agents.len();
    let total: usize = want.iter().map(Vec::len).sum();
    env.kill_principal().await;
    until("every session to notice the crash", scaled(n), || {
        fleet.connected() == 0
    })
    .await?;
    let client = kube_client(&env.hub)?;
    futures::stream::iter(0..n)
        .map(|i| set_revision(&client, i, revision.to_owned()))
        .buffer_unordered(opts.writers.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>, _>>()?;
    let ready = start_principal(env, total).await?;
    let reconnected = until("every agent reconnected", scaled(n), || {
        fleet.connected() == n
    })
    .await?
        + ready;
    let resynced = wait_all_held(fleet, want, scaled(total)).await? + ready;
    Ok(Storm {
        ready,
        reconnected,
        resynced: resynced.max(reconnected),
    })
}

/// Runs `big-hub` (with `opts.replicas` above 1: [`hub_replicas`]).
pub(super) async fn big_hub(opts: &BenchOptions) -> Result<Report, HarnessError> {
    with_env(opts, |mut env| async move {
        let r = if opts.replicas > 1 {
            hub_replicas(&mut env, opts).await
        } else {
            hub_phases(&mut env, opts).await
        };
        (env, r)
    })
    .await
}

/// `big-hub --replicas N`: the hub's N × K Applications first under one principal (no
/// `--ha`), then under N replicas with `--ha` (each caches decoded only the Applications of
/// the agents it serves, the rest as JSON), the same N agents spread over them as a
/// Service spreads first dials. For the principal and for each replica: ready after start
/// with no agent, RSS once quiet with no agent, and RSS once quiet with every agent
/// connected and holding every Application; each replica's share of the principal's RSS.
async fn hub_replicas(env: &mut BenchEnv, opts: &BenchOptions) -> Result<Report, HarnessError> {
    let n = opts.agents;
    let total = n * opts.apps_per_agent.max(2);
    let want = expected(n, total, "v1");
    create_namespaces(env, n).await?;
    // Written with the principal away (the hub alone on the cores), as `big-hub` seeds.
    env.kill_principal().await;
    create_apps(env, n, 0..total, "v1", PAD, opts.writers).await?;

    // One principal holding everything.
    let single_ready = start_principal(env, total).await?;
    let single_cold = quiet_rss(env).await?;
    let fleet = fleet_of(env, super::make_agents(env, n)?, opts);
    let held = wait_all_held(&fleet, &want, scaled(total)).await;
    let single_settled = match held {
        Ok(_) => quiet_rss(env).await,
        Err(e) => Err(e),
    };
    fleet.stop().await;
    let single_settled = single_settled?;
    env.kill_principal().await;

    // N replicas, started one after another with no agent.
    let mut ready = Vec::new();
    let mut cold = Vec::new();
    for i in 0..opts.replicas {
        let started = Instant::now();
        let r = env
            .start_replica(&format!("principal-{i}"), &opts.principal_args)
            .await?;
        ready.push(round2(started.elapsed().as_secs_f64()));
        env.replicas.push(r);
    }
    for r in &env.replicas {
        cold.push(proc_quiet_rss(&r.proc).await?);
    }
    let addrs = env.replicas.iter().map(|r| r.addr).collect();
    let fleet = super::fleet_to(addrs, super::make_agents(env, n)?, opts);
    let held = wait_all_held(&fleet, &want, scaled(total)).await;
    let settled = async {
        held?;
        let mut settled = Vec::new();
        for r in &env.replicas {
            settled.push(proc_quiet_rss(&r.proc).await?);
        }
        // The cache's forms are sampled into their gauge every 5 s.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let mut served = Vec::new();
        let mut forms = Vec::new();
        for r in &env.replicas {
            let text = http_get(r.metrics_port, "/metrics").await?;
            served.push(metric_value(&text, "argocd_principal_connected_agents").unwrap_or(0.0));
            forms.push(json!({
                "decoded": sum_series(&text, CACHED, &["form=\"decoded\""]),
                "compact": sum_series(&text, CACHED, &["form=\"compact\""]),
            }));
        }
        Ok::<_, HarnessError>((settled, served, forms))
    }
    .await;
    fleet.stop().await;
    let (settled, served, forms) = settled?;

    let mib_of = |v: &[u64]| v.iter().map(|b| round2(mib(*b))).collect::<Vec<_>>();
    let share = |v: &[u64], of: u64| {
        let most = v.iter().copied().max().unwrap_or(0) as f64;
        round2(most / (of as f64).max(1.0))
    };
    let mut r = Report::new(Scenario::BigHub);
    r.put("agents", n);
    r.put("apps", total);
    r.put("replicas", opts.replicas);
    r.put("build", super::storms::build());
    r.put("app_json_bytes", app_json_bytes());
    r.put("single_ready_s", round2(single_ready.as_secs_f64()));
    r.put("single_rss_cold_mib", round2(mib(single_cold)));
    r.put("single_rss_settled_mib", round2(mib(single_settled)));
    r.put("replica_ready_s", ready);
    r.put("replica_rss_cold_mib", mib_of(&cold));
    r.put("replica_rss_settled_mib", mib_of(&settled));
    r.put("replica_agents", served);
    r.put("replica_cached", forms);
    r.put("replica_share_cold", share(&cold, single_cold));
    r.put("replica_share_settled", share(&settled, single_settled));
    Ok(r)
}

/// The watch cache's objects by form (`decoded`, `compact`).
const CACHED: &str = "argocd_principal_cached_objects";

/// The principal's readings at one size.
struct HubSize {
    apps: usize,
    cold_ready: Duration,
    cold_rss: u64,
    storm: Storm,
    settled_rss: u64,
}

async fn hub_phases(env: &mut BenchEnv, opts: &BenchOptions) -> Result<Report, HarnessError> {
    let n = opts.agents;
    let total = n * opts.apps_per_agent.max(2);
    // One Application per agent, written while the principal runs.
    create_namespaces(env, n).await?;
    create_apps(env, n, 0..n, "v1", PAD, opts.writers).await?;
    env.kill_principal().await;
    let cold_ready = start_principal(env, n).await?;
    let cold_rss = quiet_rss(env).await?;
    let fleet = connected_fleet_within(env, opts, scaled(n)).await?;
    let phases = async {
        wait_holding(&fleet, "v1", PAD, scaled(n)).await?;
        let storm = storm_once(env, &fleet, opts, "v2", &expected(n, n, "v2")).await?;
        let settled_rss = quiet_rss(env).await?;
        Ok::<_, HarnessError>(HubSize {
            apps: n,
            cold_ready,
            cold_rss,
            storm,
            settled_rss,
        })
    }
    .await;
    let agents: Vec<Arc<SimAgent>> = fleet.agents.clone();
    fleet.stop().await;
    let small = phases?;

    // The rest, written with the principal and every agent away (the hub alone on the
    // cores): then the principal starts with all of them and no agent.
    env.kill_principal().await;
    let seeding = Instant::now();
    create_apps(env, n, n..total, "v1", PAD, opts.writers).await?;
    let seed = seeding.elapsed();
    let cold_ready = start_principal(env, total).await?;
    let cold_rss = quiet_rss(env).await?;
    // The same agents come back (holding their first Application) and take the others.
    let rejoining = Instant::now();
    let fleet = fleet_of(env, agents, opts);
    let phases = async {
        wait_all_held(&fleet, &expected(n, total, "v2"), scaled(total)).await?;
        let rejoined = rejoining.elapsed();
        let storm = storm_once(env, &fleet, opts, "v3", &expected(n, total, "v3")).await?;
        let settled_rss = quiet_rss(env).await?;
        Ok::<_, HarnessError>((
            rejoined,
            HubSize {
                apps: total,
                cold_ready,
                cold_rss,
                storm,
                settled_rss,
            },
        ))
    }
    .await;
    fleet.stop().await;
    let (rejoined, big) = phases?;
    Ok(hub_report(n, seed, rejoined, &small, &big))
}

fn hub_report(
    n: usize,
    seed: Duration,
    rejoined: Duration,
    small: &HubSize,
    big: &HubSize,
) -> Report {
    let added = (big.apps - small.apps).max(1) as f64;
    let per_app = |a: u64, b: u64| ((b as f64 - a as f64) / added).round();
    let secs = |d: Duration| round2(d.as_secs_f64());
    let mut r = Report::new(Scenario::BigHub);
    r.put("agents", n);
    r.put("apps", big.apps);
    r.put("apps_small", small.apps);
    r.put("app_json_bytes", app_json_bytes());
    r.put(
        "seed_writes_per_s",
        round2((big.apps - small.apps) as f64 / seed.as_secs_f64().max(1e-9)),
    );
    r.put("ready_cold_small_s", secs(small.cold_ready));
    r.put("ready_cold_s", secs(big.cold_ready));
    r.put("rss_cold_small_mib", round2(mib(small.cold_rss)));
    r.put("rss_cold_mib", round2(mib(big.cold_rss)));
    r.put("storm_ready_small_s", secs(small.storm.ready));
    r.put("storm_reconnected_small_s", secs(small.storm.reconnected));
    r.put("storm_resynced_small_s", secs(small.storm.resynced));
    r.put("storm_ready_s", secs(big.storm.ready));
    r.put("storm_reconnected_s", secs(big.storm.reconnected));
    r.put("storm_resynced_s", secs(big.storm.resynced));
    r.put("rss_settled_small_mib", round2(mib(small.settled_rss)));
    r.put("rss_settled_mib", round2(mib(big.settled_rss)));
    r.put("rejoin_resynced_s", secs(rejoined));
    r.put("cold_bytes_per_app", per_app(small.cold_rss, big.cold_rss));
    r.put(
        "settled_bytes_per_app",
        per_app(small.settled_rss, big.settled_rss),
    );
    r
}

/// Bytes of one bench Application's JSON, as written to the hub.
fn app_json_bytes() -> usize {
    bench_app("app-12345", &sim_name(1234), "v1", PAD)
        .to_string()
        .len()
}

/// Creates `app-<j>` for `j` in `range` in `ns` of `server`, `writers` at once.
async fn create_apps_in(
    server: &KubeTestServer,
    ns: &str,
    range: std::ops::Range<usize>,
    writers: usize,
) -> Result<(), HarnessError> {
    let api: Api<DynamicObject> = argocd_agent_testkit::harness::apps(server, ns)?;
    futures::stream::iter(range)
        .map(|j| {
            let api = api.clone();
            async move {
                let app: DynamicObject =
                    serde_json::from_value(bench_app(&format!("app-{j}"), ns, "v1", PAD))?;
                api.create(&PostParams::default(), &app).await?;
                Ok::<_, HarnessError>(())
            }
        })
        .buffer_unordered(writers.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// The `spec.source.targetRevision` of Application `name` in `ns` of `server`.
fn revision_of(server: &KubeTestServer, ns: &str, name: &str) -> Option<String> {
    server
        .get_object("argoproj.io", "v1alpha1", "applications", Some(ns), name)?
        .pointer("/spec/source/targetRevision")?
        .as_str()
        .map(str::to_owned)
}

/// Applications in `ns` of `server` (not being deleted).
fn app_count(server: &KubeTestServer, ns: &str) -> usize {
    server
        .list_objects("argoproj.io", "v1alpha1", "applications", Some(ns))
        .iter()
        .filter(|a| a.pointer("/metadata/deletionTimestamp").is_none())
        .count()
}

/// A metric of the process serving `/metrics` on `port` (0 when absent or unreachable).
async fn metric_on(port: u16, name: &str) -> f64 {
    match http_get(port, "/metrics").await {
        Ok(text) => metric_value(&text, name).unwrap_or(0.0),
        Err(_) => 0.0,
    }
}

/// Waits (at most `limit`) until process `pid` uses under 5 % of a core over 500 ms.
async fn until_pid_quiet(pid: u32, limit: Duration) -> Result<(), HarnessError> {
    let started = Instant::now();
    loop {
        let a = ProcSample::read(pid)?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let b = ProcSample::read(pid)?;
        let busy = b.cpu_since(&a).time.as_secs_f64() / (b.at - a.at).as_secs_f64();
        if busy < 0.05 || started.elapsed() >= limit {
            return Ok(());
        }
    }
}

fn pid_of(p: &Option<Proc>) -> Result<u32, HarnessError> {
    p.as_ref()
        .and_then(Proc::pid)
        .ok_or_else(|| "the agent is not running".into())
}

/// Points Applications `which` in the agent's hub namespace at `revision`, `writers` at
/// once.
async fn change_hub_apps(
    hub: &KubeTestServer,
    which: &[usize],
    revision: &str,
    writers: usize,
) -> Result<(), HarnessError> {
    let api = argocd_agent_testkit::harness::apps(hub, MANAGED)?;
    futures::stream::iter(which.iter().copied())
        .map(|j| {
            let api = api.clone();
            async move {
                merge_patch(
                    &api,
                    &format!("app-{j}"),
                    json!({"spec": {"source": {"targetRevision": revision}}}),
                )
                .await
            }
        })
        .buffer_unordered(writers.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Waits until the spoke holds every Application of `which` at `revision`.
async fn until_spoke_has(
    spoke: &KubeTestServer,
    which: &[usize],
    revision: &str,
    timeout: Duration,
) -> Result<Duration, HarnessError> {
    poll_until(
        &format!("{} changed Applications on the spoke", which.len()),
        timeout,
        Duration::from_millis(5),
        || {
            which.iter().all(|j| {
                revision_of(spoke, SPOKE_NS, &format!("app-{j}")).as_deref() == Some(revision)
            })
        },
    )
    .await
}

/// The Applications a resync test changes: every `m / c`-th of `m`, `c` of them.
fn spread(m: usize, c: usize) -> Vec<usize> {
    let c = c.clamp(1, m.max(1));
    (0..c).map(|t| t * m / c).collect()
}

/// Runs `big-spoke`.
pub(super) async fn big_spoke(opts: &BenchOptions) -> Result<Report, HarnessError> {
    let topo = Topology::start(TopologyOptions {
        dir: opts.dir.clone(),
        with_proxy: true,
        principal_args: opts.principal_args.clone(),
        agents: Some(vec![MANAGED]),
        // The initial fill writes every Application to the spoke; at the default client
        // limit (50/s) 10,000 take 200 s. The streaming phase stays far below either.
        agent_args: ["--kube-qps", "2000", "--kube-burst", "4000"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    })
    .await?;
    let mut topo = topo;
    let r = spoke_phases(&mut topo, opts).await;
    let logs = topo.logs();
    topo.stop().await;
    r.map_err(|e: HarnessError| format!("{e}\n{}", super::env::tail(&logs, 60)).into())
}

async fn spoke_phases(topo: &mut Topology, opts: &BenchOptions) -> Result<Report, HarnessError> {
    let m = opts.spoke_apps.max(1);
    let agent_port = topo.metrics_ports[MANAGED];
    let principal_port = topo.metrics_ports["principal"];
    let mut r = Report::new(Scenario::BigSpoke);
    r.put("apps", m);
    // The agent connected with nothing to hold.
    until_pid_quiet(pid_of(&topo.managed)?, Duration::from_secs(30)).await?;
    let rss_empty = ProcSample::read(pid_of(&topo.managed)?)?.rss;

    // The Applications are written to the hub with the principal and the agent stopped, so
    // the principal starts with them listed and the agent's start is the initial fill.
    if let Some(a) = topo.managed.as_mut() {
        a.stop().await;
    }
    topo.principal.stop().await;
    let seeding = Instant::now();
    create_apps_in(&topo.hub, MANAGED, 0..m, opts.writers).await?;
    r.put(
        "seed_writes_per_s",
        round2(m as f64 / seeding.elapsed().as_secs_f64().max(1e-9)),
    );
    let started = Instant::now();
    topo.principal.start()?;
    wait_ready_on(principal_port, &topo.principal, ready_timeout(m)).await?;
    r.put("principal_ready_s", round2(started.elapsed().as_secs_f64()));
    let started = Instant::now();
    topo.managed
        .as_mut()
        .ok_or("the agent is not running")?
        .start()?;
    until("every Application on the spoke", ready_timeout(m), || {
        app_count(&topo.managed_spoke, SPOKE_NS) >= m
    })
    .await?;
    r.put("fill_s", round2(started.elapsed().as_secs_f64()));

    // Idle with every Application held.
    let pid = pid_of(&topo.managed)?;
    until_pid_quiet(pid, Duration::from_secs(60)).await?;
    let (a0, p0) = (
        ProcSample::read(pid)?,
        ProcSample::read(pid_of_principal(topo)?)?,
    );
    tokio::time::sleep(opts.duration).await;
    let (a1, p1) = (
        ProcSample::read(pid)?,
        ProcSample::read(pid_of_principal(topo)?)?,
    );
    r.put("agent_rss_empty_mib", round2(mib(rss_empty)));
    r.put("agent_rss_mib", round2(mib(a1.rss)));
    r.put(
        "agent_bytes_per_app",
        ((a1.rss as f64 - rss_empty as f64) / m as f64).round(),
    );
    r.put("agent_idle_cpu_pct", a1.cpu_percent_since(&a0));
    r.put("principal_rss_mib", round2(mib(p1.rss)));
    r.put("principal_idle_cpu_pct", p1.cpu_percent_since(&p0));
    r.put("idle_s", opts.duration.as_secs());

    resync_after_outage(topo, agent_port, m, opts, &mut r).await?;
    resync_after_restart(topo, agent_port, principal_port, m, opts, &mut r).await?;
    stream_changes(topo, m, opts, &mut r).await?;
    Ok(r)
}

fn pid_of_principal(topo: &Topology) -> Result<u32, HarnessError> {
    topo.principal
        .pid()
        .ok_or_else(|| "the principal is not running".into())
}

/// Changes per resync test: 1 % of the Applications (at least one).
fn resync_changes(m: usize) -> Vec<usize> {
    spread(m, (m / 100).max(1))
}

/// Waits until the agent's `argocd_agent_connections_total` exceeds `before`.
async fn until_reconnected(port: u16, before: f64, timeout: Duration) -> Result<(), HarnessError> {
    let started = Instant::now();
    while metric_on(port, "argocd_agent_connections_total").await <= before {
        if started.elapsed() > timeout {
            return Err(format!("the agent did not reconnect within {timeout:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// The link to the principal goes down (open connections cut, new ones refused), 1 % of the
/// Applications change on the hub, the link comes back: time until the agent has a new
/// connection, and until the spoke holds every change, from the link's return and from
/// the new connection.
async fn resync_after_outage(
    topo: &Topology,
    agent_port: u16,
    m: usize,
    opts: &BenchOptions,
    r: &mut Report,
) -> Result<(), HarnessError> {
    let proxy = topo.proxy.as_ref().ok_or("no proxy in the topology")?;
    let which = resync_changes(m);
    let before = metric_on(agent_port, "argocd_agent_connections_total").await;
    proxy.set_down(true);
    let noticed = Instant::now();
    while metric_on(agent_port, "argocd_agent_connection_status").await > 0.0 {
        if noticed.elapsed() > Duration::from_secs(60) {
            return Err("the agent still counts itself connected 60 s into the outage".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    change_hub_apps(&topo.hub, &which, "outage", opts.writers).await?;
    let up = Instant::now();
    proxy.set_down(false);
    until_reconnected(agent_port, before, Duration::from_secs(120)).await?;
    let connected = up.elapsed();
    let resynced = until_spoke_has(
        &topo.managed_spoke,
        &which,
        "outage",
        Duration::from_secs(120),
    )
    .await?
        + connected;
    r.put("resync_changes", which.len());
    r.put("outage_reconnect_s", round2(connected.as_secs_f64()));
    r.put("outage_resynced_s", round2(resynced.as_secs_f64()));
    r.put(
        "outage_resync_after_connect_s",
        round2((resynced - connected).as_secs_f64()),
    );
    Ok(())
}

/// `kill -9` the principal, 1 % of the Applications change on the hub, restart it: time
/// until it is ready, until the agent has a new connection, and until the spoke holds every
/// change (from the restart).
async fn resync_after_restart(
    topo: &mut Topology,
    agent_port: u16,
    principal_port: u16,
    m: usize,
    opts: &BenchOptions,
    r: &mut Report,
) -> Result<(), HarnessError> {
    let which = resync_changes(m);
    let before = metric_on(agent_port, "argocd_agent_connections_total").await;
    topo.principal.kill().await;
    change_hub_apps(&topo.hub, &which, "restart", opts.writers).await?;
    let started = Instant::now();
    topo.principal.start()?;
    wait_ready_on(principal_port, &topo.principal, ready_timeout(m)).await?;
    let ready = started.elapsed();
    until_reconnected(agent_port, before, Duration::from_secs(120)).await?;
    let connected = started.elapsed();
    let resynced = until_spoke_has(
        &topo.managed_spoke,
        &which,
        "restart",
        Duration::from_secs(120),
    )
    .await?
        + connected;
    r.put("restart_ready_s", round2(ready.as_secs_f64()));
    r.put("restart_reconnect_s", round2(connected.as_secs_f64()));
    r.put("restart_resynced_s", round2(resynced.as_secs_f64()));
    r.put(
        "restart_resync_after_connect_s",
        round2((resynced - connected).as_secs_f64()),
    );
    Ok(())
}

/// `changes` spec changes written to the hub at `rate` per second, to Applications spread
/// over all `m`; each one's latency from its hub write until the spoke holds it.
async fn stream_changes(
    topo: &Topology,
    m: usize,
    opts: &BenchOptions,
    r: &mut Report,
) -> Result<(), HarnessError> {
    let api = argocd_agent_testkit::harness::apps(&topo.hub, MANAGED)?;
    let pid = pid_of(&topo.managed)?;
    let every = Duration::from_secs_f64(1.0 / opts.rate.max(0.1));
    let mut pending: Vec<(String, String, Instant)> = Vec::new();
    let mut latencies = Vec::with_capacity(opts.changes);
    let a0 = ProcSample::read(pid)?;
    let started = Instant::now();
    let mut next = started;
    let mut written = 0usize;
    while written < opts.changes || !pending.is_empty() {
        let now = Instant::now();
        if written < opts.changes && now >= next {
            let j = (written * 7919) % m;
            let (name, marker) = (format!("app-{j}"), format!("s{written}"));
            let t = Instant::now();
            merge_patch(
                &api,
                &name,
                json!({"spec": {"source": {"targetRevision": marker}}}),
            )
            .await?;
            pending.push((name, marker, t));
            written += 1;
            next += every;
        }
        let spoke = &topo.managed_spoke;
        pending.retain(|(name, marker, t)| {
            let done = revision_of(spoke, SPOKE_NS, name).as_deref() == Some(marker.as_str());
            if done {
                latencies.push(t.elapsed());
            }
            !done
        });
        if let Some((_, _, t)) = pending.first()
            && t.elapsed() > Duration::from_secs(60)
        {
            return Err(format!(
                "a change not on the spoke after 60 s ({} pending)",
                pending.len()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let a1 = ProcSample::read(pid)?;
    let (p50, p99, max) = percentiles(latencies);
    r.put("stream_changes", opts.changes);
    r.put("stream_rate_per_s", round2(opts.rate));
    r.put(
        "stream_achieved_per_s",
        round2(opts.changes as f64 / started.elapsed().as_secs_f64().max(1e-9)),
    );
    r.put("apply_p50_ms", p50);
    r.put("apply_p99_ms", p99);
    r.put("apply_max_ms", max);
    r.put("agent_stream_cpu_pct", a1.cpu_percent_since(&a0));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_agent_expects_its_share() {
        let want = expected(3, 7, "v2");
        let names: Vec<Vec<&str>> = want
            .iter()
            .map(|v| v.iter().map(|(n, _)| n.as_str()).collect())
            .collect();
        assert_eq!(
            names,
            vec![
                vec!["app-0", "app-3", "app-6"],
                vec!["app-1", "app-4"],
                vec!["app-2", "app-5"]
            ]
        );
        // The first Application is at the storm's revision, the others at v1.
        let sum = |name: &str, i: usize, rev: &str| {
            argocd_agent_kubernetes::object::checksum_of(
                &bench_app(name, &sim_name(i), rev, PAD)["spec"],
            )
        };
        assert_eq!(want[0][0].1, sum("app-0", 0, "v2"));
        assert_eq!(want[0][1].1, sum("app-3", 0, "v1"));
        assert_ne!(want[0][0].1, sum("app-0", 0, "v1"));
    }

    #[test]
    fn changes_spread_over_the_applications() {
        assert_eq!(spread(10_000, 4), vec![0, 2500, 5000, 7500]);
        assert_eq!(resync_changes(10_000).len(), 100);
        assert_eq!(resync_changes(50), vec![0]);
        assert_eq!(spread(3, 10), vec![0, 1, 2]);
    }
}
