//! Storms against the shipped configuration: the principal flags and Lease durations that
//! `deploy/principal` runs (three replicas with `--ha`, or one principal without), under N
//! agents while hub spec changes flow. Four storms: first connect of the fleet, `kill -9` of
//! one replica and of every replica (restarted at once, as the kubelet restarts a crashed
//! container), and a rolling update (every replica replaced as the Deployment controller
//! steps it with `deploy/`'s strategy, see [`rollout`]).
//!
//! Each reports the time until every agent is served (a live session, by the agents' own
//! count and by the replicas' `argocd_principal_connected_agents`) and resynced (holds its
//! Application exactly as the hub has it after the last change), the most agents without a
//! session at once (sampled every 100 ms), the replicas' Lease writes, and changes lost
//! (an agent that never reaches the hub's final state) or applied twice (an object the
//! agent already held and had acknowledged, delivered again).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_agent_domain::sync::lock;
use argocd_agent_testkit::harness::{HarnessError, binary, http_get, kube_client, stored_app};
use tokio_util::sync::CancellationToken;

use super::env::{BenchEnv, metric_value};
use super::rolling::{MAX_SURGE, MAX_UNAVAILABLE, Rolling};
use super::sim::{Fleet, sim_name};
use super::{
    BenchOptions, Report, Scenario, create_apps, create_namespaces, fleet, make_agents, round2,
    scaled, set_revision, until, wait_holding, with_replicas,
};

const CONNECTED: &str = "argocd_principal_connected_agents";
const LEASE_WRITES: &str = "argocd_principal_lease_writes_total";

/// Hub spec changes written per second while a storm runs.
pub const CHANGES_PER_S: u64 = 100;

/// How long Kubernetes waits for a terminating pod (`terminationGracePeriodSeconds` of
/// `deploy/principal/deployment.yaml`) before it kills it.
const GRACE: Duration = Duration::from_secs(30);

/// Which storm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Storm {
    /// Every agent connects for the first time.
    Connect,
    /// `kill -9` of replica 0, restarted at once.
    KillOne,
    /// `kill -9` of every replica, all restarted at once.
    KillAll,
    /// Every replica replaced by a rolling update.
    Rollout,
}

impl Storm {
    fn scenario(self) -> Scenario {
        match self {
            Storm::Connect => Scenario::HaConnect,
            Storm::KillOne => Scenario::HaKillOne,
            Storm::KillAll => Scenario::HaKillAll,
            Storm::Rollout => Scenario::HaRollout,
        }
    }
}

/// The principal flags of `deploy/principal` (deployment.yaml and params-cm.yaml) that
/// apply to a bench run, for `replicas` replicas: `principal.ha.enable: "true"` (`--ha` is
/// added per replica by the run) with the default Lease durations written out, the
/// per-agent event limit of the params (20/s, burst 200), namespace creation, and JSON logs
/// at info. With one replica, the params' single-principal setting (`--ha` off). Flags
/// `extra` names again are left to `extra`, which follows.
pub fn shipped_args(replicas: usize, extra: &[String]) -> Vec<String> {
    let mut shipped = vec![
        "--agent-event-rate=20",
        "--agent-event-burst=200",
        "--namespace-create-enable",
        "--log-level=info",
        "--log-format=json",
    ];
    if replicas > 1 {
        shipped.extend(["--replica-lease-duration=10s", "--agent-lease-duration=15m"]);
    }
    let flag = |a: &str| a.split('=').next().unwrap_or(a).to_owned();
    let overridden: Vec<String> = extra.iter().map(|a| flag(a)).collect();
    shipped
        .into_iter()
        .filter(|a| !overridden.contains(&flag(a)))
        .map(String::from)
        .chain(extra.iter().cloned())
        .collect()
}

/// Runs `storm` with `opts.replicas` principals in the shipped configuration.
pub(super) async fn run(storm: Storm, opts: &BenchOptions) -> Result<Report, HarnessError> {
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let replicas = opts.replicas.max(1);
    let args = shipped_args(replicas, &opts.principal_args);
    let shipped = BenchOptions {
        principal_args: args.clone(),
        ..opts.clone()
    };
    with_replicas(&shipped, replicas, |mut env| async move {
        let r = measure(storm, &mut env, opts, &args).await.map(|mut r| {
            let load: Vec<&str> = loadavg.split_whitespace().take(3).collect();
            r.values.insert(0, ("loadavg", load.join(" ").into()));
            r
        });
        (env, r)
    })
    .await
}

/// The build of the principal binary the run starts (`release` or `debug`: its directory).
pub(super) fn build() -> String {
    binary("argocd-agent")
        .ok()
        .and_then(|p| Some(p.parent()?.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

async fn measure(
    storm: Storm,
    env: &mut BenchEnv,
    opts: &BenchOptions,
    args: &[String],
) -> Result<Report, HarnessError> {
    let n = opts.agents;
    let pad = 512;
    create_namespaces(env, n).await?;
    create_apps(env, n, 0..n, "v1", pad, opts.writers).await?;
    let agents = make_agents(env, n)?;
    let client = kube_client(&env.hub)?;
    let mut settled = None;
    if storm != Storm::Connect {
        let f = fleet(env, agents.clone(), opts);
        let settled_up = async {
            until("every agent connected", scaled(n) * 3, || {
                f.connected() == n
            })
            .await?;
            wait_holding(&f, "v1", pad, scaled(n)).await
        };
        if let Err(e) = settled_up.await {
            f.stop().await;
            return Err(e);
        }
        settled = Some(f);
    }
    let sampler = Sampler::start(env, n, settled.as_ref()).await;
    let writer = Writer::start(client, n, CHANGES_PER_S as f64);
    let started = Instant::now();
    let stats = settled.as_ref().map(snapshot);
    let fleet = match settled {
        Some(f) => f,
        None => fleet(env, agents, opts),
    };
    sampler.watch(&fleet);
    // Behind the Service, a reconnecting agent lands on any ready replica.
    fleet.spread_reconnects();
    let outcome = storm_and_settle(storm, env, &fleet, &sampler, writer, args, started).await;
    let samples = sampler.stop().await;
    let after = snapshot(&fleet);
    fleet.stop().await;
    let (action, served, resynced, changes, lost) = outcome?;
    let before = stats.unwrap_or_default();
    let mut r = Report::new(storm.scenario());
    r.put("agents", n);
    r.put("replicas", env.replicas.len() + 1);
    r.put("build", build());
    if storm != Storm::Connect {
        r.put(storm_action_key(storm), round2(action.as_secs_f64()));
    }
    r.put("served_s", round2(served.as_secs_f64()));
    r.put("resynced_s", round2(resynced.as_secs_f64()));
    r.put("most_without_session", samples.most_unserved);
    r.put("most_without_session_agents", samples.most_unserved_agents);
    r.put("lease_writes", samples.lease_writes as u64);
    if storm == Storm::Rollout && !env.replicas.is_empty() {
        r.put("most_successors_starting", samples.most_starting);
    }
    r.put(
        "lease_writes_per_s",
        round2(samples.lease_writes / served.as_secs_f64().max(1e-9)),
    );
    r.put("changes", changes);
    r.put("lost", lost);
    r.put("duplicated", after.redelivered - before.redelivered);
    r.put("sessions", after.sessions - before.sessions);
    r.put(
        "sessions_per_s",
        round2((after.sessions - before.sessions) as f64 / served.as_secs_f64().max(1e-9)),
    );
    r.put("failed_attempts", after.failed - before.failed);
    r.put("dials_refused", after.refused - before.refused);
    Ok(r)
}

fn storm_action_key(storm: Storm) -> &'static str {
    match storm {
        Storm::Connect => "started_s",
        Storm::KillOne | Storm::KillAll => "restarted_ready_s",
        Storm::Rollout => "rollout_s",
    }
}

/// Counters of a fleet at one moment.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    sessions: u64,
    failed: u64,
    refused: u64,
    redelivered: u64,
}

fn snapshot(f: &Fleet) -> Counts {
    Counts {
        sessions: f.stats.sessions.load(Relaxed),
        failed: f.stats.failed_attempts.load(Relaxed),
        refused: f.stats.dials_refused.load(Relaxed),
        redelivered: f.stats.redelivered.load(Relaxed),
    }
}

/// The storm, then the wait until every agent is served and resynced: (the action's own
/// time, served, resynced, changes written, agents not at the hub's final state).
async fn storm_and_settle(
    storm: Storm,
    env: &mut BenchEnv,
    fleet: &Fleet,
    sampler: &Sampler,
    writer: Writer,
    args: &[String],
    started: Instant,
) -> Result<(Duration, Duration, Duration, usize, usize), HarnessError> {
    let n = fleet.agents.len();
    let action = match act(storm, env, fleet, sampler, args).await {
        Ok(d) => d,
        Err(e) => {
            writer.stop().await.ok();
            return Err(e);
        }
    };
    let deadline = scaled(n) + Duration::from_secs(60);
    let served = until("every agent served", deadline, || {
        fleet.connected() == n && sampler.connected() == n
    })
    .await;
    let changes = writer.stop().await?;
    served.map_err(|e| {
        format!(
            "{e}: {} agents connected by their count, {} by the replicas'",
            fleet.connected(),
            sampler.connected()
        )
    })?;
    let served = started.elapsed();
    let lost = not_at_hub_state(env, fleet).await;
    let resynced = started.elapsed();
    Ok((action, served, resynced, changes, lost))
}

/// Waits (as long as [`scaled`] allows for the fleet) until every agent holds its
/// Application exactly as the hub has it now; returns how many still do not (lost).
pub(super) async fn not_at_hub_state(env: &BenchEnv, fleet: &Fleet) -> usize {
    let n = fleet.agents.len();
    let want: Vec<Option<String>> = (0..n)
        .map(|i| {
            stored_app(&env.hub, &sim_name(i), &format!("app-{i}"))
                .map(|a| argocd_agent_kubernetes::object::checksum_of(&a["spec"]))
        })
        .collect();
    let holds = |i: usize| fleet.agents[i].checksum(&format!("app-{i}")) == want[i];
    let converged = until("every agent at the hub's final state", scaled(n), || {
        (0..n).all(holds)
    })
    .await
    .is_ok();
    if converged {
        0
    } else {
        (0..n).filter(|&i| !holds(i)).count()
    }
}

/// Does the storm's action; returns how long it took.
async fn act(
    storm: Storm,
    env: &mut BenchEnv,
    fleet: &Fleet,
    sampler: &Sampler,
    args: &[String],
) -> Result<Duration, HarnessError> {
    let t = Instant::now();
    let n = fleet.agents.len();
    match storm {
        Storm::Connect => {}
        Storm::KillOne => {
            let on_killed = fleet
                .agents
                .iter()
                .filter(|a| a.principal_index() == Some(0))
                .count();
            env.kill_principal().await;
            sampler.restarted(env.metrics_port);
            // The Service's endpoints leave it out until it is ready again.
            fleet.set_principals(env.replicas.iter().map(|r| r.addr).collect());
            // Its agents see their connections reset; the kubelet restarts the container at
            // once (a first restart has no back-off).
            until("its sessions to notice", scaled(n), || {
                fleet.connected() <= n - on_killed
            })
            .await?;
            env.restart_principal().await?;
            fleet.set_principals(addresses(env));
        }
        Storm::KillAll => {
            env.kill_principal().await;
            sampler.restarted(env.metrics_port);
            for r in &mut env.replicas {
                r.proc.kill().await;
                sampler.restarted(r.metrics_port);
            }
            // No replica is ready: the Service has no endpoints, so a dial is refused at
            // once (kube-proxy rejects connections to a Service without endpoints).
            fleet.set_principals(Vec::new());
            // The agents see their connections reset; then the kubelet restarts each
            // container at once (its first restart has no back-off).
            until("every session to notice", scaled(n), || {
                fleet.connected() == 0
            })
            .await?;
            env.principal.start()?;
            for r in &mut env.replicas {
                r.proc.start()?;
            }
            endpoints_as_ready(env, fleet).await?;
        }
        Storm::Rollout => rollout(env, fleet, sampler, args).await?,
    }
    Ok(t.elapsed())
}

/// Adds each restarted replica to the Service's endpoints once its `/readyz` says ready, as
/// the endpoints controller does; returns when all are.
async fn endpoints_as_ready(env: &BenchEnv, fleet: &Fleet) -> Result<(), HarnessError> {
    let all: Vec<(
        std::net::SocketAddr,
        u16,
        &argocd_agent_testkit::harness::Proc,
    )> = std::iter::once((env.principal_addr, env.metrics_port, &env.principal))
        .chain(
            env.replicas
                .iter()
                .map(|r| (r.addr, r.metrics_port, &r.proc)),
        )
        .collect();
    let mut pending: futures::stream::FuturesUnordered<_> = all
        .into_iter()
        .map(|(addr, port, proc)| async move {
            super::env::wait_ready_on(port, proc, Duration::from_secs(120))
                .await
                .map(|()| addr)
        })
        .collect();
    let mut ready = Vec::new();
    while let Some(addr) = futures::StreamExt::next(&mut pending).await {
        ready.push(addr?);
        fleet.set_principals(ready.clone());
    }
    Ok(())
}

/// Replaces every replica as the Deployment's rolling update does with `deploy/`'s strategy
/// ([`Rolling`]: `maxSurge: 1, maxUnavailable: 1`, the controller's `rolling.go`). An old
/// replica the controller scales down leaves the Service's endpoints and gets SIGTERM; it
/// drains within the grace period, then is killed. A new replica starts on its own address
/// and joins the endpoints once its `/readyz` says ready, which is the event that lets the
/// controller go on. With three replicas: one old replica goes and two new ones start; each
/// new one that is ready lets one more old one go. The rollout is over once every new
/// replica is ready and every old one is gone. One principal (no `--ha`): SIGTERM, exit,
/// start again (a second principal without Leases beside it would serve the same agents),
/// with no endpoint until it is ready.
async fn rollout(
    env: &mut BenchEnv,
    fleet: &Fleet,
    sampler: &Sampler,
    args: &[String],
) -> Result<(), HarnessError> {
    if env.replicas.is_empty() {
        // A terminating pod leaves the endpoints; its successor joins them once ready.
        fleet.set_principals(Vec::new());
        terminate(&mut env.principal).await;
        sampler.restarted(env.metrics_port);
        env.principal.start()?;
        return endpoints_as_ready(env, fleet).await;
    }
    let replicas = env.replicas.len() + 1;
    let mut plan = Rolling::new(replicas, MAX_SURGE, MAX_UNAVAILABLE);
    let mut endpoints = addresses(env);
    // Old replicas in slot order (the oldest ReplicaSet's pods go first), those sent
    // SIGTERM whose slot still holds them (with the moment they are killed), and new
    // replicas ready but not yet in a slot.
    let mut old: std::collections::VecDeque<usize> = (0..replicas).collect();
    let mut terminated = std::collections::VecDeque::new();
    let mut ready = std::collections::VecDeque::new();
    let mut starting = futures::stream::FuturesUnordered::new();
    let mut draining = tokio::task::JoinSet::new();
    let mut spawned = 0;
    loop {
        let (start, stop) = plan.settle();
        for _ in 0..stop {
            let slot = old
                .pop_front()
                .ok_or("the rollout stops more replicas than it has")?;
            let (addr, pid) = slot_of(env, slot);
            endpoints.retain(|a| *a != addr);
            fleet.set_principals(endpoints.clone());
            if let Some(pid) = pid {
                sigterm(pid).await;
            }
            terminated.push_back((slot, Instant::now() + GRACE));
        }
        for _ in 0..start {
            let new = env.spawn_replica(&format!("principal-{spawned}-2"), args)?;
            spawned += 1;
            sampler.add(new.metrics_port);
            starting.push(async move { new.until_ready().await.map(|()| new) });
        }
        sampler.starting(starting.len());
        // Each ready replica takes the slot of the first old one terminated.
        while !terminated.is_empty() && !ready.is_empty() {
            let (Some((slot, kill_at)), Some(new)) = (terminated.pop_front(), ready.pop_front())
            else {
                break;
            };
            draining.spawn(reap(put_in_slot(env, slot, new), kill_at));
        }
        if plan.done() {
            break;
        }
        let new = futures::StreamExt::next(&mut starting)
            .await
            .ok_or("the rollout waits for no replica")??;
        endpoints.push(new.addr);
        fleet.set_principals(endpoints.clone());
        plan.ready();
        ready.push_back(new);
    }
    // The rollout is over once every old replica is gone.
    while draining.join_next().await.is_some() {}
    Ok(())
}

/// The address and process id of the replica in `slot` (0 is `env.principal`).
fn slot_of(env: &BenchEnv, slot: usize) -> (std::net::SocketAddr, Option<u32>) {
    if slot == 0 {
        (env.principal_addr, env.principal.pid())
    } else {
        let r = &env.replicas[slot - 1];
        (r.addr, r.proc.pid())
    }
}

/// Puts `new` in `slot`; returns the process it replaces.
fn put_in_slot(
    env: &mut BenchEnv,
    slot: usize,
    new: super::env::Replica,
) -> argocd_agent_testkit::harness::Proc {
    if slot == 0 {
        env.principal_addr = new.addr;
        env.metrics_port = new.metrics_port;
        std::mem::replace(&mut env.principal, new.proc)
    } else {
        std::mem::replace(&mut env.replicas[slot - 1], new).proc
    }
}

/// Every principal's address, slot order.
pub(super) fn addresses(env: &BenchEnv) -> Vec<std::net::SocketAddr> {
    std::iter::once(env.principal_addr)
        .chain(env.replicas.iter().map(|r| r.addr))
        .collect()
}

/// SIGTERM, then waits up to the grace period for the exit, then kills.
async fn terminate(proc: &mut argocd_agent_testkit::harness::Proc) {
    if let Some(pid) = proc.pid() {
        sigterm(pid).await;
        let _ = until(&format!("{} to exit", proc.name), GRACE, || {
            !proc.is_running()
        })
        .await;
    }
    proc.kill().await;
}

/// Sends SIGTERM to `pid`, as the kubelet does to a terminating pod.
async fn sigterm(pid: u32) {
    let _ = tokio::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await;
}

/// Waits until `kill_at` (the end of the grace period) for a process already sent SIGTERM
/// to exit, then kills it.
async fn reap(mut proc: argocd_agent_testkit::harness::Proc, kill_at: Instant) {
    let grace = kill_at.saturating_duration_since(Instant::now());
    let _ = until(&format!("{} to exit", proc.name), grace, || {
        !proc.is_running()
    })
    .await;
    proc.kill().await;
}

/// Hub spec changes, `per_s` a second (the storms: [`CHANGES_PER_S`]), each to the next
/// agent's Application (`targetRevision: c<k>`), until stopped.
pub(super) struct Writer {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<usize, HarnessError>>,
}

impl Writer {
    pub(super) fn start(client: kube::Client, n: usize, per_s: f64) -> Writer {
        let stop = CancellationToken::new();
        let token = stop.clone();
        let period = Duration::from_secs_f64(1.0 / per_s.max(1e-3));
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut k = 0usize;
            loop {
                tokio::select! {
                    _ = token.cancelled() => return Ok(k),
                    _ = tick.tick() => {}
                }
                set_revision(&client, (k * 7919) % n.max(1), format!("c{k}")).await?;
                k += 1;
            }
        });
        Writer { stop, task }
    }

    /// Stops writing; returns how many changes were written.
    pub(super) async fn stop(self) -> Result<usize, HarnessError> {
        self.stop.cancel();
        self.task
            .await
            .map_err(|e| HarnessError::from(format!("hub writer: {e}")))?
    }
}

/// One principal process's Lease write counter, as sampled.
#[derive(Debug, Default, Clone, Copy)]
struct LeaseCount {
    /// Its value when sampling began (0 for a process started later).
    base: f64,
    last: f64,
    /// Writes of earlier processes on the same port (killed and restarted).
    earlier: f64,
}

#[derive(Default)]
struct Shared {
    counts: HashMap<u16, LeaseCount>,
    /// Sum of the replicas' connected-agents gauges at the last sample.
    connected: usize,
    most_unserved: usize,
    most_unserved_agents: usize,
    /// Most new replicas starting (spawned, not yet ready) at once in a rollout.
    most_starting: usize,
}

/// What the sampler saw.
struct Samples {
    most_unserved: usize,
    most_unserved_agents: usize,
    lease_writes: f64,
    most_starting: usize,
}

/// Every 100 ms: each principal's connected agents and Lease writes, and the fleet's own
/// count of live sessions.
struct Sampler {
    shared: Arc<Mutex<Shared>>,
    stats: Arc<Mutex<Option<Arc<super::sim::Stats>>>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    /// Starts sampling every principal of `env`, their counters' current values the base.
    async fn start(env: &BenchEnv, n: usize, fleet: Option<&Fleet>) -> Sampler {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let ports: Vec<u16> = std::iter::once(env.metrics_port)
            .chain(env.replicas.iter().map(|r| r.metrics_port))
            .collect();
        let mut connected = 0;
        for port in ports {
            let (c, l) = scrape(port).await.ok().flatten().unwrap_or_default();
            connected += c;
            lock(&shared).counts.insert(
                port,
                LeaseCount {
                    base: l,
                    last: l,
                    earlier: 0.0,
                },
            );
        }
        {
            // The storm starts from here: a fleet not yet started has nobody served.
            let mut s = lock(&shared);
            s.connected = connected;
            s.most_unserved = n.saturating_sub(connected);
            s.most_unserved_agents = n.saturating_sub(fleet.map_or(0, Fleet::connected));
        }
        let stats = Arc::new(Mutex::new(fleet.map(|f| f.stats.clone())));
        let stop = CancellationToken::new();
        let task = tokio::spawn(sample(n, shared.clone(), stats.clone(), stop.clone()));
        Sampler {
            shared,
            stats,
            stop,
            task,
        }
    }

    /// Counts the agents of `fleet` from now on.
    fn watch(&self, fleet: &Fleet) {
        *lock(&self.stats) = Some(fleet.stats.clone());
    }

    /// A new principal process on `port` (its counter starts at 0).
    fn add(&self, port: u16) {
        lock(&self.shared).counts.entry(port).or_default();
    }

    /// The process on `port` was killed (its next one starts from 0).
    fn restarted(&self, port: u16) {
        let mut s = lock(&self.shared);
        let c = s.counts.entry(port).or_default();
        c.earlier += c.last - c.base;
        c.base = 0.0;
        c.last = 0.0;
    }

    /// `n` new replicas are starting (spawned, not yet ready) in a rollout.
    fn starting(&self, n: usize) {
        let mut s = lock(&self.shared);
        s.most_starting = s.most_starting.max(n);
    }

    /// Agents the principals count as connected, at the last sample.
    fn connected(&self) -> usize {
        lock(&self.shared).connected
    }

    async fn stop(self) -> Samples {
        self.stop.cancel();
        let _ = self.task.await;
        let s = lock(&self.shared);
        Samples {
            most_unserved: s.most_unserved,
            most_unserved_agents: s.most_unserved_agents,
            lease_writes: s
                .counts
                .values()
                .map(|c| c.earlier + (c.last - c.base).max(0.0))
                .sum(),
            most_starting: s.most_starting,
        }
    }
}

async fn sample(
    n: usize,
    shared: Arc<Mutex<Shared>>,
    stats: Arc<Mutex<Option<Arc<super::sim::Stats>>>>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let ports: Vec<u16> = lock(&shared).counts.keys().copied().collect();
        let mut connected = 0;
        let mut leases = Vec::new();
        let mut complete = true;
        for port in ports {
            match scrape(port).await {
                Ok(Some((c, l))) => {
                    connected += c;
                    leases.push((port, l));
                }
                // A killed or exited process refuses the connection: it serves nobody.
                Ok(None) => {}
                // A busy one that did not answer in time: this round says nothing.
                Err(()) => complete = false,
            }
        }
        let agents = lock(&stats)
            .as_ref()
            .map_or(0, |s| s.connected.load(Relaxed));
        let mut s = lock(&shared);
        for (port, l) in leases {
            let c = s.counts.entry(port).or_default();
            if l < c.last {
                // Restarted without being told: what it had counted is kept.
                c.earlier += c.last - c.base;
                c.base = 0.0;
            }
            c.last = l;
        }
        if complete {
            s.connected = connected;
            s.most_unserved = s.most_unserved.max(n.saturating_sub(connected));
        }
        s.most_unserved_agents = s.most_unserved_agents.max(n.saturating_sub(agents));
    }
}

/// Connected agents and Lease writes of the principal whose metrics are on `port`; `None`
/// when nothing listens there, an error when it did not answer within a second.
async fn scrape(port: u16) -> Result<Option<(usize, f64)>, ()> {
    let answer = tokio::time::timeout(Duration::from_secs(1), async {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(None),
            _ => http_get(port, "/metrics").await.map(Some).map_err(|_| ()),
        }
    })
    .await
    .map_err(|_| ())??;
    let Some(text) = answer else { return Ok(None) };
    let connected = metric_value(&text, CONNECTED).ok_or(())? as usize;
    Ok(Some((
        connected,
        metric_value(&text, LEASE_WRITES).unwrap_or(0.0),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_flags_give_way_to_the_runs_own() {
        let one = shipped_args(1, &[]);
        assert!(one.contains(&"--agent-event-rate=20".to_owned()));
        assert!(
            !one.iter()
                .any(|a| a.starts_with("--replica-lease-duration"))
        );
        let three = shipped_args(3, &["--replica-lease-duration=3s".into()]);
        assert_eq!(
            three
                .iter()
                .filter(|a| a.starts_with("--replica-lease-duration"))
                .collect::<Vec<_>>(),
            vec!["--replica-lease-duration=3s"]
        );
        assert!(three.contains(&"--agent-lease-duration=15m".to_owned()));
    }
}
