//! The soak: the shipped HA configuration of the storms ([`super::storms`]: three `--ha`
//! replicas behind the modelled Service) under N agents for hours, with everything that
//! happens to a deployment happening all the time: hub spec changes at a steady rate, status
//! updates from the agents, a few agents kicked (reconnecting) every sampling interval, every
//! SVID rotated every few minutes (as `rotation` does), and a `kill -9` of one replica every
//! few minutes, restarted at once (as `ha-kill-one` does).
//!
//! Every interval it samples each replica process (RSS, open file descriptors, threads, and
//! from its metrics endpoint the queue depth, connected agents and how many series it
//! exposes), this process (RSS, descriptors, threads, live tokio tasks) and the hub's Lease
//! count, and appends the sample as one JSON line to `--samples`. A restarted replica starts
//! a new series (its `generation`). Just before each restart one more sample is taken (the
//! same phase of the restart cycle every time).
//!
//! At the end the writes stop and the run waits until every agent holds the hub's final
//! spec (`lost` must be 0). Each quantity's growth is the least-squares slope of its samples
//! after the warm-up, divided by their mean, in % per hour ([`growth_pct_per_h`]); the queue
//! depth, mostly 0, in events per hour and its maximum ([`slope_per_h`]).
//!
//! What is compared, for the replicas: the restarts go round robin over replicas 1.., and
//! `principal-0` is never restarted: its own series over the whole run is the leak
//! measurement of one principal process. A leak that outlives a process (on the hub, in the
//! Leases) shows in the sum over all replicas taken just before each restart, when the
//! replicas' ages are the same every cycle; the first cycle's is left out too.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use argocd_agent_testkit::harness::{HarnessError, http_get, kube_client, wait_port};

use super::env::{BenchEnv, ProcSample, metric_value, open_fds, threads, wait_ready_on};
use super::sim::{Fleet, SimAgent, sim_id};
use super::storms::{Writer, addresses, build, shipped_args};
use super::{
    BenchOptions, Report, Scenario, create_apps, create_namespaces, fine, fleet, make_agents,
    round2, scaled, until, wait_holding,
};

const QUEUE_DEPTH: &str = "argocd_principal_queue_depth";
const CONNECTED: &str = "argocd_principal_connected_agents";

/// Events the soak's hub keeps. The hub is in this process: its event history grows until
/// full, so a long run wants it full within the warm-up (about 50 events/s here: spec
/// changes, status writes, Lease renewals, so a few minutes), not after 50,000 events.
pub const SOAK_HUB_HISTORY: usize = 10_000;

/// The growth the soak aims under, % per hour.
pub const TARGET_PCT_PER_H: f64 = 2.0;

/// Validity of the SVIDs the agents get at each rotation.
const SVID_TTL: Duration = Duration::from_secs(3600);

/// One replica process at one sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaSample {
    /// `principal-<slot>`.
    pub replica: String,
    /// 1 for the process started first, one more per restart: each generation is a series.
    pub generation: u32,
    /// Its process id.
    pub pid: u32,
    /// Resident set, MiB.
    pub rss_mib: f64,
    /// Entries of `/proc/<pid>/fd`.
    pub fds: usize,
    /// Threads.
    pub threads: usize,
    /// `argocd_principal_queue_depth` (absent when the metrics did not answer in time).
    pub queue_depth: Option<f64>,
    /// `argocd_principal_connected_agents`.
    pub connected: Option<f64>,
    /// Series (sample lines) its `/metrics` exposes: a label that leaks grows it.
    pub series: Option<usize>,
}

/// This process (the simulated agents and the hub) at one sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchSample {
    /// Resident set, MiB.
    pub rss_mib: f64,
    /// Entries of `/proc/self/fd`.
    pub fds: usize,
    /// Threads.
    pub threads: usize,
    /// Live tokio tasks of the runtime (`RuntimeMetrics::num_alive_tasks`).
    pub tasks: usize,
    /// Agents with a live session, by their own count.
    pub agents_connected: usize,
    /// Lease objects on the hub (one per agent with a session, plus the replicas').
    pub hub_leases: usize,
}

/// One line of the samples file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    /// Every process, read at `t_s` seconds from the soak's start.
    Sample {
        /// Seconds since the soak started (after the fleet settled).
        t_s: f64,
        /// Taken just before a restart (the same phase of the restart cycle each time),
        /// not at the interval.
        before_restart: bool,
        /// Each replica, slot order.
        replicas: Vec<ReplicaSample>,
        /// This process.
        bench: BenchSample,
    },
    /// A replica was killed (`kill -9`) and started again.
    Restart {
        /// Seconds since the soak started, at the kill.
        t_s: f64,
        /// `principal-<slot>`.
        replica: String,
        /// The generation that starts.
        generation: u32,
        /// From the kill until the new process was ready again, seconds.
        ready_s: f64,
    },
}

impl Line {
    /// Seconds since the soak started.
    pub fn t_s(&self) -> f64 {
        match self {
            Line::Sample { t_s, .. } | Line::Restart { t_s, .. } => *t_s,
        }
    }
}

/// The lines of a samples file (blank lines skipped); an unreadable line names its number.
pub fn read_lines(text: &str) -> Result<Vec<Line>, HarnessError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| HarnessError::from(format!("samples line {}: {e}", i + 1)))
        })
        .collect()
}

/// The least-squares slope of `points` (hours, value) divided by the values' mean, in %
/// per hour; `None` with fewer than three points, no time between them, or a mean of 0
/// with values that vary (a growth relative to nothing).
pub fn growth_pct_per_h(points: &[(f64, f64)]) -> Option<f64> {
    let (slope, my) = slope_per_h(points)?;
    if my == 0.0 {
        return (slope == 0.0).then_some(0.0);
    }
    Some(slope / my * 100.0)
}

/// The least-squares slope of `points` (hours, value) in the values' unit per hour, and the
/// values' mean; `None` with fewer than three points or no time between them.
pub fn slope_per_h(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let mt = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mt).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mt) * (p.1 - my)).sum();
    if sxx <= 0.0 {
        return None;
    }
    Some((sxy / sxx, my))
}

/// The samples file, appended to as the run goes (an interrupted run keeps its samples).
struct Out {
    file: Option<std::fs::File>,
    lines: Vec<Line>,
}

impl Out {
    fn open(path: Option<&Path>) -> Result<Out, HarnessError> {
        let file = match path {
            Some(p) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| format!("{}: {e}", p.display()))?,
            ),
            None => None,
        };
        Ok(Out {
            file,
            lines: Vec::new(),
        })
    }

    fn push(&mut self, line: Line) -> Result<(), HarnessError> {
        if let Some(f) = &mut self.file {
            writeln!(f, "{}", serde_json::to_string(&line)?)?;
            f.flush()?;
        }
        self.lines.push(line);
        Ok(())
    }
}

/// Runs the soak with `opts.replicas` principals in the shipped configuration.
pub(super) async fn soak(opts: &BenchOptions) -> Result<Report, HarnessError> {
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let replicas = opts.replicas.max(1);
    let args = shipped_args(replicas, &opts.principal_args);
    let mut env =
        BenchEnv::start_with_history(opts.dir.clone(), &args, replicas, SOAK_HUB_HISTORY).await?;
    let r = measure(&mut env, opts).await;
    let log = env.logs(30);
    env.stop().await;
    let mut r = r.map_err(|e| HarnessError::from(format!("{e}\nprincipal log (tail):\n{log}")))?;
    let load: Vec<&str> = loadavg.split_whitespace().take(3).collect();
    r.values.insert(0, ("loadavg", load.join(" ").into()));
    Ok(r)
}

/// What the run did, counted.
#[derive(Debug, Default)]
struct Counts {
    restarts: u64,
    rotations: u64,
    kicked: u64,
    interval_samples: u64,
    restart_ready_max_s: f64,
    /// Agents served at the end, by the replicas' gauges.
    served_at_end: usize,
}

async fn measure(env: &mut BenchEnv, opts: &BenchOptions) -> Result<Report, HarnessError> {
    let n = opts.agents;
    let pad = 512;
    create_namespaces(env, n).await?;
    create_apps(env, n, 0..n, "v1", pad, opts.writers).await?;
    let fleet = fleet(env, make_agents(env, n)?, opts);
    let settled = async {
        until("every agent connected", scaled(n) * 3, || {
            fleet.connected() == n
        })
        .await?;
        wait_holding(&fleet, "v1", pad, scaled(n)).await
    }
    .await;
    if let Err(e) = settled {
        fleet.stop().await;
        return Err(e);
    }
    // Behind the Service, a reconnecting agent lands on any ready replica.
    fleet.spread_reconnects();
    let mut out = Out::open(opts.samples.as_deref())?;
    let r = run_and_settle(env, &fleet, opts, &mut out).await;
    let dropped = fleet.stats.dropped.load(Relaxed);
    let failed = fleet.stats.failed_attempts.load(Relaxed);
    let sessions = fleet.stats.sessions.load(Relaxed);
    fleet.stop().await;
    let (counts, changes, statuses, settle, lost) = r?;
    let mut r = Report::new(Scenario::Soak);
    r.put("agents", n);
    r.put("replicas", env.replicas.len() + 1);
    r.put("build", build());
    r.put("hours", fine(opts.duration.as_secs_f64() / 3600.0));
    r.put("interval_s", opts.interval.as_secs_f64());
    r.put("restart_every_s", opts.restart_every.as_secs_f64());
    r.put("rotate_every_s", opts.rotate_every.as_secs_f64());
    r.put("samples", counts.interval_samples);
    r.put("restarts", counts.restarts);
    r.put("restart_ready_max_s", round2(counts.restart_ready_max_s));
    r.put("rotations", counts.rotations);
    r.put("kicked", counts.kicked);
    r.put("changes", changes);
    r.put("status_updates", statuses);
    r.put("sessions", sessions);
    r.put("dropped_streams", dropped);
    r.put("failed_attempts", failed);
    r.put("settle_s", round2(settle.as_secs_f64()));
    r.put("served_at_end", counts.served_at_end);
    r.put("lost", lost);
    let warmup = warmup(opts);
    r.put("warmup_s", warmup.as_secs_f64());
    growth(&mut r, &out.lines, warmup, opts.restart_every);
    Ok(r)
}

/// The warm-up left out of the growth figures: the first 20 % of the run, and at least one
/// restart interval.
fn warmup(opts: &BenchOptions) -> Duration {
    opts.duration.mul_f64(0.2).max(opts.restart_every)
}

/// The soak, then the settle: (counts, spec changes, status updates, time to settle, agents
/// not at the hub's final state).
async fn run_and_settle(
    env: &mut BenchEnv,
    fleet: &Fleet,
    opts: &BenchOptions,
    out: &mut Out,
) -> Result<(Counts, usize, u64, Duration, usize), HarnessError> {
    let n = fleet.agents.len();
    let writer = Writer::start(kube_client(&env.hub)?, n, opts.rate);
    let status = StatusSender::start(fleet.agents.clone(), opts.rate);
    let counts = run(env, fleet, opts, out).await;
    let changes = writer.stop().await;
    let statuses = status.stop().await;
    let mut counts = counts?;
    let changes = changes?;
    let settling = Instant::now();
    let deadline = scaled(n) + Duration::from_secs(60);
    loop {
        let by_replicas = replicas_connected(env).await;
        if fleet.connected() == n && by_replicas == n {
            counts.served_at_end = by_replicas;
            break;
        }
        if settling.elapsed() > deadline {
            return Err(format!(
                "not every agent served {deadline:?} after the writes stopped: {} connected by \
                 their count, {by_replicas} by the replicas'",
                fleet.connected()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every agent must hold its Application exactly as the hub has it now.
    let lost = super::storms::not_at_hub_state(env, fleet).await;
    Ok((counts, changes, statuses, settling.elapsed(), lost))
}

/// The soak's schedule: a sample (and a few kicks) every interval, a rotation and a
/// restart when due, until the run's duration has passed.
async fn run(
    env: &mut BenchEnv,
    fleet: &Fleet,
    opts: &BenchOptions,
    out: &mut Out,
) -> Result<Counts, HarnessError> {
    let n = fleet.agents.len();
    let slots = env.replicas.len() + 1;
    let mut generations = vec![1u32; slots];
    let mut counts = Counts::default();
    let started = Instant::now();
    let end = started + opts.duration;
    let mut next_sample = started;
    let mut next_restart = started + opts.restart_every;
    let mut next_rotation = started + opts.rotate_every;
    // Round robin over replicas 1.. (principal-0 is the never-restarted one); over the only
    // one when there is one.
    let mut restart_slot = 0usize;
    let kicks = (n / 100).max(1);
    let mut next_kick = 0usize;
    loop {
        let due = next_sample.min(next_restart).min(next_rotation);
        if due >= end {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        let now = Instant::now();
        if now >= next_rotation {
            rotate(env, fleet).await?;
            counts.rotations += 1;
            next_rotation += opts.rotate_every;
        }
        if now >= next_restart {
            let t = started.elapsed().as_secs_f64();
            out.push(sample(env, fleet, &generations, t, true).await?)?;
            let slot = if slots > 1 {
                1 + restart_slot % (slots - 1)
            } else {
                0
            };
            restart_slot += 1;
            let ready = restart(env, fleet, slot).await?;
            generations[slot] += 1;
            counts.restarts += 1;
            counts.restart_ready_max_s = counts.restart_ready_max_s.max(ready.as_secs_f64());
            out.push(Line::Restart {
                t_s: t,
                replica: format!("principal-{slot}"),
                generation: generations[slot],
                ready_s: round2(ready.as_secs_f64()),
            })?;
            next_restart += opts.restart_every;
        }
        if now >= next_sample {
            let t = started.elapsed().as_secs_f64();
            out.push(sample(env, fleet, &generations, t, false).await?)?;
            counts.interval_samples += 1;
            // A few agents reconnect (a new handshake, with the SVID of the last rotation).
            for j in 0..kicks {
                fleet.agents[(next_kick + j) % n].kick();
            }
            next_kick = (next_kick + kicks) % n;
            counts.kicked += kicks as u64;
            next_sample += opts.interval;
        }
    }
    Ok(counts)
}

/// Every agent's SVID and the principals' rotated (as the `rotation` scenario does).
async fn rotate(env: &BenchEnv, fleet: &Fleet) -> Result<(), HarnessError> {
    env.spiffe.rotate_now()?;
    for (i, a) in fleet.agents.iter().enumerate() {
        let id = argocd_agent_identity::SpiffeId::parse(&sim_id(&a.name))?;
        a.rotate(env.svid(&id, SVID_TTL)?);
        if i % 64 == 63 {
            // Issuing is CPU work: let the agents' and the hub's tasks run in between.
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// `kill -9` of replica `slot`, out of the Service's endpoints until it is ready again;
/// started again at once (the kubelet's first restart has no back-off). Returns the time
/// from the kill until ready.
async fn restart(env: &mut BenchEnv, fleet: &Fleet, slot: usize) -> Result<Duration, HarnessError> {
    let t = Instant::now();
    let mut others = addresses(env);
    others.remove(slot);
    let (proc, addr, port) = if slot == 0 {
        (&mut env.principal, env.principal_addr, env.metrics_port)
    } else {
        let r = &mut env.replicas[slot - 1];
        (&mut r.proc, r.addr, r.metrics_port)
    };
    proc.kill().await;
    fleet.set_principals(others);
    proc.start()?;
    wait_port(addr).await?;
    wait_ready_on(port, proc, Duration::from_secs(120)).await?;
    fleet.set_principals(addresses(env));
    Ok(t.elapsed())
}

/// Every process, now.
async fn sample(
    env: &mut BenchEnv,
    fleet: &Fleet,
    generations: &[u32],
    t_s: f64,
    before_restart: bool,
) -> Result<Line, HarnessError> {
    let mut replicas = Vec::with_capacity(generations.len());
    for (slot, &generation) in generations.iter().enumerate() {
        let (proc, port) = if slot == 0 {
            (&mut env.principal, env.metrics_port)
        } else {
            let r = &mut env.replicas[slot - 1];
            (&mut r.proc, r.metrics_port)
        };
        if !proc.is_running() {
            return Err(format!("{} exited on its own at {t_s:.0} s", proc.name).into());
        }
        let pid = proc.pid().ok_or("a running replica without a pid")?;
        let metrics = tokio::time::timeout(Duration::from_secs(5), http_get(port, "/metrics"))
            .await
            .ok()
            .and_then(Result::ok);
        let read = |name| metrics.as_deref().and_then(|m| metric_value(m, name));
        replicas.push(ReplicaSample {
            replica: format!("principal-{slot}"),
            generation,
            pid,
            rss_mib: mib(ProcSample::read(pid)?.rss),
            fds: open_fds(pid)?,
            threads: threads(pid)?,
            queue_depth: read(QUEUE_DEPTH),
            connected: read(CONNECTED),
            series: metrics.as_deref().map(|m| {
                m.lines()
                    .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                    .count()
            }),
        });
    }
    let me = std::process::id();
    let bench = BenchSample {
        rss_mib: mib(ProcSample::read(me)?.rss),
        fds: open_fds(me)?,
        threads: threads(me)?,
        tasks: tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        agents_connected: fleet.connected(),
        hub_leases: env
            .hub
            .list_objects("coordination.k8s.io", "v1", "leases", None)
            .len(),
    };
    Ok(Line::Sample {
        t_s: round2(t_s),
        before_restart,
        replicas,
        bench,
    })
}

fn mib(bytes: u64) -> f64 {
    round2(super::mib(bytes))
}

/// The sum of the replicas' connected-agents gauges (a replica that does not answer: 0).
async fn replicas_connected(env: &BenchEnv) -> usize {
    let ports: Vec<u16> = std::iter::once(env.metrics_port)
        .chain(env.replicas.iter().map(|r| r.metrics_port))
        .collect();
    let mut sum = 0.0;
    for port in ports {
        if let Ok(Ok(text)) =
            tokio::time::timeout(Duration::from_secs(2), http_get(port, "/metrics")).await
        {
            sum += metric_value(&text, CONNECTED).unwrap_or(0.0);
        }
    }
    sum as usize
}

/// Status updates from the agents, `per_s` a second, each from the next agent
/// (k·7919 mod N) about its Application, until stopped. An agent without a session queues
/// it until it has one, as an agent does.
struct StatusSender {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<u64>,
}

impl StatusSender {
    fn start(agents: Vec<Arc<SimAgent>>, per_s: f64) -> StatusSender {
        let stop = CancellationToken::new();
        let token = stop.clone();
        let period = Duration::from_secs_f64(1.0 / per_s.max(1e-3));
        let task = tokio::spawn(async move {
            let n = agents.len().max(1);
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut k = 0usize;
            let mut sent = 0u64;
            loop {
                tokio::select! {
                    _ = token.cancelled() => return sent,
                    _ = tick.tick() => {}
                }
                let i = (k * 7919) % n;
                let status = json!({
                    "sync": {"status": "Synced", "revision": format!("s{k}")},
                    "health": {"status": "Healthy"}
                });
                if agents[i].send_status(&format!("app-{i}"), status).is_ok() {
                    sent += 1;
                }
                k += 1;
            }
        });
        StatusSender { stop, task }
    }

    /// Stops; returns how many were queued.
    async fn stop(self) -> u64 {
        self.stop.cancel();
        self.task.await.unwrap_or(0)
    }
}

/// One quantity's samples after the warm-up: (hours since the start, value).
type Series = Vec<(f64, f64)>;

/// A quantity read from a replica's sample (`None`: not in it).
type ReplicaField = dyn Fn(&ReplicaSample) -> Option<f64>;
/// A quantity summed over the replicas' samples.
type ReplicaSum = dyn Fn(&ReplicaSample) -> f64;
/// A quantity read from the bench process's sample.
type BenchField = dyn Fn(&BenchSample) -> f64;

/// Puts each quantity's growth (% per hour) after `warmup` into `r`, and the worst of them
/// next to the target.
fn growth(r: &mut Report, lines: &[Line], warmup: Duration, restart_every: Duration) {
    let after = warmup.as_secs_f64();
    let samples: Vec<(f64, bool, &[ReplicaSample], &BenchSample)> = lines
        .iter()
        .filter_map(|l| match l {
            Line::Sample {
                t_s,
                before_restart,
                replicas,
                bench,
            } if *t_s >= after => Some((*t_s / 3600.0, *before_restart, &replicas[..], bench)),
            _ => None,
        })
        .collect();
    let restarted_0 = lines
        .iter()
        .any(|l| matches!(l, Line::Restart { replica, .. } if replica == "principal-0"));
    let mut figures: Vec<(&'static str, Option<f64>)> = Vec::new();
    // principal-0: never restarted when there are several replicas.
    let p0 = |f: &dyn Fn(&ReplicaSample) -> Option<f64>| -> Series {
        samples
            .iter()
            .filter_map(|(t, _, reps, _)| Some((*t, f(reps.first()?)?)))
            .collect()
    };
    if !restarted_0 {
        r.put("compared", "principal-0 (never restarted); all replicas summed just before each restart; this process");
        r.put("p0_rss_mib_mean", round2(mean(&p0(&|s| Some(s.rss_mib)))));
        // A queue is mostly empty: its growth relative to a mean near 0 says nothing
        // (one event more in an hour reads as hundreds of %), so it is given in events: the
        // slope per hour and the most seen, next to the relative figures, not among them.
        let queue = p0(&|s| s.queue_depth);
        match slope_per_h(&queue) {
            Some((slope, _)) => r.put("p0_queue_depth_events_per_h", fine(slope)),
            None => r.put(
                "p0_queue_depth_events_per_h",
                "not measured: under 3 samples",
            ),
        }
        r.put(
            "p0_queue_depth_max",
            queue.iter().map(|p| p.1).fold(0.0, f64::max),
        );
        let of_p0: [(&'static str, &ReplicaField); 5] = [
            ("p0_rss_pct_per_h", &|s| Some(s.rss_mib)),
            ("p0_fds_pct_per_h", &|s| Some(s.fds as f64)),
            ("p0_threads_pct_per_h", &|s| Some(s.threads as f64)),
            ("p0_connected_pct_per_h", &|s| s.connected),
            ("p0_series_pct_per_h", &|s| s.series.map(|x| x as f64)),
        ];
        figures.extend(of_p0.map(|(key, f)| (key, growth_pct_per_h(&p0(f)))));
    } else {
        r.put(
            "compared",
            "all replicas summed just before each restart; this process",
        );
    }
    // The same phase of each restart cycle, the first cycle left out.
    let phase_after = after.max(restart_every.as_secs_f64() * 1.5) / 3600.0;
    let phase = |f: &dyn Fn(&ReplicaSample) -> f64| -> Series {
        samples
            .iter()
            .filter(|(t, before, _, _)| *before && *t >= phase_after)
            .map(|(t, _, reps, _)| (*t, reps.iter().map(f).sum::<f64>()))
            .collect()
    };
    let of_phase: [(&'static str, &ReplicaSum); 3] = [
        ("sum_rss_at_phase_pct_per_h", &|s| s.rss_mib),
        ("sum_fds_at_phase_pct_per_h", &|s| s.fds as f64),
        ("sum_threads_at_phase_pct_per_h", &|s| s.threads as f64),
    ];
    figures.extend(of_phase.map(|(key, f)| (key, growth_pct_per_h(&phase(f)))));
    let bench = |f: &dyn Fn(&BenchSample) -> f64| -> Series {
        samples.iter().map(|(t, _, _, b)| (*t, f(b))).collect()
    };
    r.put("bench_rss_mib_mean", round2(mean(&bench(&|b| b.rss_mib))));
    let of_bench: [(&'static str, &BenchField); 5] = [
        ("bench_rss_pct_per_h", &|b| b.rss_mib),
        ("bench_fds_pct_per_h", &|b| b.fds as f64),
        ("bench_threads_pct_per_h", &|b| b.threads as f64),
        ("bench_tasks_pct_per_h", &|b| b.tasks as f64),
        ("hub_leases_pct_per_h", &|b| b.hub_leases as f64),
    ];
    figures.extend(of_bench.map(|(key, f)| (key, growth_pct_per_h(&bench(f)))));
    let mut worst: Option<(&'static str, f64)> = None;
    for (key, g) in figures {
        match g {
            Some(g) => {
                r.put(key, fine(g));
                if worst.is_none_or(|(_, w)| g > w) {
                    worst = Some((key, g));
                }
            }
            None => r.put(
                key,
                "not measured: under 3 samples after the warm-up, or a mean of 0 that varies",
            ),
        }
    }
    match worst {
        Some((key, g)) => {
            r.put("worst_pct_per_h", fine(g));
            r.put("worst", key);
            r.put("target_met", g < TARGET_PCT_PER_H);
        }
        None => r.put("target_met", Value::Null),
    }
}

fn mean(s: &Series) -> f64 {
    if s.is_empty() {
        return 0.0;
    }
    s.iter().map(|p| p.1).sum::<f64>() / s.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mostly_empty_queue_is_measured_in_events_not_percent() {
        // One event more in an hour: a slope of 1 event/h, whatever the mean.
        let pts = [(0.0, 0.0), (0.5, 0.0), (1.0, 1.0)];
        let (slope, mean) = slope_per_h(&pts).unwrap();
        assert!((slope - 1.0).abs() < 1e-9, "{slope}");
        assert!((mean - 1.0 / 3.0).abs() < 1e-9);
        // The same series read as % of its mean is the misleading 300 %/h.
        assert!(growth_pct_per_h(&pts).unwrap() > 299.0);
        assert_eq!(slope_per_h(&pts[..2]), None);
    }

    #[test]
    fn growth_is_the_slope_over_the_mean_per_hour() {
        // 100 -> 102 over one hour: about 2 % of the mean (101) per hour.
        let pts: Vec<(f64, f64)> = (0..=10)
            .map(|i| (i as f64 / 10.0, 100.0 + 0.2 * i as f64))
            .collect();
        let g = growth_pct_per_h(&pts).unwrap();
        assert!((g - 2.0 / 1.01).abs() < 1e-9, "{g}");
        // Flat, falling, too few, all 0.
        assert_eq!(
            growth_pct_per_h(&[(0.0, 5.0), (0.5, 5.0), (1.0, 5.0)]),
            Some(0.0)
        );
        assert!(growth_pct_per_h(&[(0.0, 5.0), (0.5, 4.0), (1.0, 3.0)]).unwrap() < 0.0);
        assert_eq!(growth_pct_per_h(&[(0.0, 5.0), (1.0, 6.0)]), None);
        assert_eq!(
            growth_pct_per_h(&[(0.0, 0.0), (0.5, 0.0), (1.0, 0.0)]),
            Some(0.0)
        );
        assert_eq!(
            growth_pct_per_h(&[(0.0, -1.0), (0.5, 0.0), (1.0, 1.0)]),
            None
        );
        assert_eq!(
            growth_pct_per_h(&[(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]),
            None
        );
    }

    fn replica(slot: usize, generation: u32, rss: f64) -> ReplicaSample {
        ReplicaSample {
            replica: format!("principal-{slot}"),
            generation,
            pid: 1,
            rss_mib: rss,
            fds: 40,
            threads: 8,
            queue_depth: Some(0.0),
            connected: Some(10.0),
            series: Some(100),
        }
    }

    fn bench() -> BenchSample {
        BenchSample {
            rss_mib: 200.0,
            fds: 100,
            threads: 4,
            tasks: 50,
            agents_connected: 30,
            hub_leases: 33,
        }
    }

    #[test]
    fn lines_round_trip_and_growth_compares_the_never_restarted_replica() {
        let mut lines = Vec::new();
        for k in 0..20u32 {
            let t = f64::from(k) * 60.0;
            lines.push(Line::Sample {
                t_s: t,
                before_restart: false,
                replicas: vec![
                    replica(0, 1, 100.0 + f64::from(k)),
                    replica(1, 1 + k / 5, 50.0),
                ],
                bench: bench(),
            });
            if k % 5 == 4 {
                lines.push(Line::Sample {
                    t_s: t + 30.0,
                    before_restart: true,
                    replicas: vec![
                        replica(0, 1, 100.5 + f64::from(k)),
                        replica(1, 1 + k / 5, 50.0),
                    ],
                    bench: bench(),
                });
                lines.push(Line::Restart {
                    t_s: t + 30.0,
                    replica: "principal-1".into(),
                    generation: 2 + k / 5,
                    ready_s: 0.5,
                });
            }
        }
        let text: String = lines
            .iter()
            .map(|l| serde_json::to_string(l).unwrap() + "\n")
            .collect();
        assert!(text.contains(r#""kind":"restart""#), "{text}");
        assert_eq!(read_lines(&text).unwrap(), lines);
        assert!(
            read_lines("{}\n")
                .unwrap_err()
                .to_string()
                .contains("line 1")
        );

        let mut r = Report::new(Scenario::Soak);
        growth(
            &mut r,
            &lines,
            Duration::from_secs(300),
            Duration::from_secs(300),
        );
        let j = r.json();
        // principal-0 grows 1 MiB a minute: 60 MiB/h over a mean of ~112 MiB.
        let g = j["p0_rss_pct_per_h"].as_f64().unwrap();
        assert!(g > 40.0 && g < 70.0, "{j}");
        assert_eq!(j["p0_fds_pct_per_h"], 0.0);
        assert_eq!(j["sum_fds_at_phase_pct_per_h"], 0.0);
        assert!(j["sum_rss_at_phase_pct_per_h"].as_f64().unwrap() > 0.0);
        assert_eq!(j["worst"], "p0_rss_pct_per_h");
        assert_eq!(j["target_met"], false);
        // The empty queue: no growth, in events, and no longer among the % figures.
        assert_eq!(j["p0_queue_depth_events_per_h"], 0.0);
        assert_eq!(j["p0_queue_depth_max"], 0.0);
        assert!(j.get("p0_queue_depth_pct_per_h").is_none());
        assert!(j["compared"].as_str().unwrap().starts_with("principal-0"));
    }
}
