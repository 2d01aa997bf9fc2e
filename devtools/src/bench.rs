//! `argocd-agent-dev bench <scenario>`: the load generator (`argocd_agent_load::bench`). A real
//! principal process against a Kubernetes API test server as hub, and N simulated agents in
//! this process, each with its own SVID, TLS connection and stream. Prints one table row per
//! run and, with `--json`, appends the row as one JSON line to a file. See
//! `docs/benchmarks.md`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use argocd_agent_load::bench::{self, BenchOptions, Scenario};

/// Scenarios.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ScenarioArg {
    /// N agents connect: time to all connected, idle bytes per agent, idle CPU.
    Connect,
    /// kill -9 and restart the principal under N agents: time to reconnected and resynced.
    Storm,
    /// Hub write to agent and agent status to hub, one at a time: p50/p99/max.
    Fanout,
    /// Events per second both ways, next to a raw tonic stream over the same TLS.
    Throughput,
    /// Every SVID (agents and principal) rotated every 2 s under load: drops and losses.
    Rotation,
    /// The demo topology with real agent processes: --changes mixed operations on the hub
    /// (managed) and on the spoke (autonomous); time until the other side is equal.
    Bulk,
    /// --replicas principal replicas (--ha) under N agents spread across them: kill -9 one;
    /// time until its agents have sessions on the others and until all are resynced.
    Failover,
    /// --projects AppProjects (each with a repository Secret, each matching
    /// --agents-per-project agents) over N agents; --changes project changes one at a time:
    /// time until every matched agent holds it, principal CPU per change.
    Projects,
    /// --apps-per-agent Applications per agent on the hub over N agents: principal RSS per
    /// Application, start until ready with them all, kill -9 storm with them on the hub.
    /// With --replicas N (N > 1): the same hub under one principal, then under N --ha
    /// replicas with the agents spread over them; each replica's RSS and its share of the
    /// principal's.
    BigHub,
    /// One real agent process with --spoke-apps Applications on its spoke: agent RSS and
    /// idle CPU, resync after a link outage and after a principal restart, apply latency of
    /// --changes changes at --rate per second.
    BigSpoke,
    /// The shipped configuration (--replicas replicas with --ha as deploy/ runs them; 1: one
    /// principal): first connect of N agents while hub changes flow.
    HaConnect,
    /// The shipped configuration: kill -9 of one replica, restarted at once.
    HaKillOne,
    /// The shipped configuration: kill -9 of every replica, all restarted at once.
    HaKillAll,
    /// The shipped configuration: rolling update (new replica, ready, SIGTERM the old, next).
    HaRollout,
    /// Two tenants sharing --agents: team-b's round trips (--changes each way) alone, then
    /// while team-a floods 20 times its eventsPerSecond (--rate) and writes Applications
    /// past its applicationsPerAgent; p50/p99 side by side and team-a's refusals.
    Tenants,
    /// The shipped configuration for --hours under steady hub changes and status updates
    /// (--rate each per second), a few reconnects every --interval, every SVID rotated every
    /// --rotate-every, a kill -9 of one replica every --restart-every: growth per hour of
    /// each process's RSS, descriptors, threads and queue depth; changes lost. Samples go
    /// to --samples; --plot draws them.
    Soak,
    /// Internal: the idle floor's bare tonic server, started by `connect` (`--dir`: the
    /// run's directory, whose `principal.sock` gives its SVID).
    #[value(hide = true)]
    FloorServer,
    /// No run: draw --plot from the connect, big-hub and big-spoke rows already in --json
    /// (cost growth), or from a soak's --samples.
    Plot,
}

impl ScenarioArg {
    /// The scenario to run (`None` for `plot`, which only draws).
    fn scenario(self) -> Option<Scenario> {
        Some(match self {
            ScenarioArg::Connect => Scenario::Connect,
            ScenarioArg::Storm => Scenario::Storm,
            ScenarioArg::Fanout => Scenario::Fanout,
            ScenarioArg::Throughput => Scenario::Throughput,
            ScenarioArg::Rotation => Scenario::Rotation,
            ScenarioArg::Bulk => Scenario::Bulk,
            ScenarioArg::Failover => Scenario::Failover,
            ScenarioArg::Projects => Scenario::Projects,
            ScenarioArg::BigHub => Scenario::BigHub,
            ScenarioArg::BigSpoke => Scenario::BigSpoke,
            ScenarioArg::HaConnect => Scenario::HaConnect,
            ScenarioArg::HaKillOne => Scenario::HaKillOne,
            ScenarioArg::HaKillAll => Scenario::HaKillAll,
            ScenarioArg::HaRollout => Scenario::HaRollout,
            ScenarioArg::Tenants => Scenario::Tenants,
            ScenarioArg::Soak => Scenario::Soak,
            ScenarioArg::Plot | ScenarioArg::FloorServer => return None,
        })
    }
}

/// Arguments of `argocd-agent-dev bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum)]
    scenario: ScenarioArg,
    /// Simulated agents. Each needs one file descriptor here and one in the principal
    /// (the run raises RLIMIT_NOFILE to the hard limit and says if it is too low).
    #[arg(long, default_value_t = 100)]
    agents: usize,
    /// Changes or events (fanout, throughput).
    #[arg(long, default_value_t = 200)]
    changes: usize,
    /// Application payload size in bytes (throughput).
    #[arg(long, default_value_t = 6144)]
    payload_bytes: usize,
    /// Idle phase (connect; rounded up to whole heartbeat intervals) or run length
    /// (rotation, soak), seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Run length in hours, fractions allowed (soak; instead of --seconds).
    #[arg(long)]
    hours: Option<f64>,
    /// Seconds between samples (soak).
    #[arg(long, default_value_t = 60)]
    interval: u64,
    /// Seconds between replica restarts, kill -9 of one replica round robin (soak).
    #[arg(long, default_value_t = 300)]
    restart_every: u64,
    /// Seconds between SVID rotations, every agent's and the principals' (soak).
    #[arg(long, default_value_t = 180)]
    rotate_every: u64,
    /// Append each sample to this file as one JSON line, as the run goes (soak); with
    /// `plot`, the file --plot draws.
    #[arg(long)]
    samples: Option<PathBuf>,
    /// Heartbeat interval of the simulated agents, seconds (the agent's default: 30).
    #[arg(long, default_value_t = 30)]
    heartbeat: u64,
    /// HTTP/2 PING interval of the simulated agents, seconds (the agent's
    /// `--keep-alive-ping-interval`, default 30).
    #[arg(long, default_value_t = 30)]
    keepalive: u64,
    /// Concurrent hub writers.
    #[arg(long, default_value_t = 16)]
    writers: usize,
    /// Principal replicas (default 3; failover: at least 2; ha-*: 1 is one principal without
    /// --ha; big-hub: default 1, and N > 1 measures the Applications under one principal,
    /// then under N replicas with --ha). Pass --replica-lease-duration (default 10s) with
    /// --principal-arg.
    #[arg(long)]
    replicas: Option<usize>,
    /// Keep logs and kubeconfigs here (default: a temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Append the result as one JSON line to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// After the run, draw the cost-growth plot (PNG) of the rows in --json: principal RSS
    /// and idle CPU against connected agents (connect), principal RSS against Applications
    /// on the hub (big-hub), agent RSS against Applications on its spoke (big-spoke). With
    /// soak (or plot --samples): the soak's samples over time.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// TrueType font for the plot's text (default: DejaVu Sans or Liberation Sans from the
    /// usual system paths).
    #[arg(long)]
    font: Option<PathBuf>,
    /// The simulated agents compress their messages (`gzip` or `zstd`, as the agent's
    /// `--enable-compression --compression-algorithm`); add
    /// `--principal-arg=--enable-compression` for the principal's side.
    #[arg(long)]
    compression: Option<bench::Compression>,
    /// Count the bytes on the wire (throughput): the agents dial through a counting TCP
    /// proxy in this process.
    #[arg(long)]
    wire_bytes: bool,
    /// AppProjects on the hub, each with one repository Secret (projects).
    #[arg(long, default_value_t = 1000)]
    projects: usize,
    /// Agents each project matches (projects).
    #[arg(long, default_value_t = 10)]
    agents_per_project: usize,
    /// Applications per agent on the hub (big-hub; at least 2: the run compares one per
    /// agent with this many).
    #[arg(long, default_value_t = 10)]
    apps_per_agent: usize,
    /// Applications on the agent's spoke (big-spoke).
    #[arg(long, default_value_t = 10_000)]
    spoke_apps: usize,
    /// Changes per second while apply latency is measured (big-spoke); team-a's
    /// eventsPerSecond quota (tenants); hub spec changes and status updates per second,
    /// each (soak).
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Extra principal argument (repeat), e.g. --principal-arg=--kube-qps=200.
    #[arg(long = "principal-arg", allow_hyphen_values = true)]
    principal_args: Vec<String>,
}

/// Runs one scenario and prints its row.
pub async fn run(a: BenchArgs) -> crate::CmdResult {
    let opts = BenchOptions {
        agents: a.agents.max(1),
        changes: a.changes.max(1),
        payload_bytes: a.payload_bytes,
        duration: match a.hours {
            Some(h) if h.is_finite() && h > 0.0 => Duration::from_secs_f64(h * 3600.0),
            Some(h) => return Err(format!("--hours must be a positive number, not {h}").into()),
            None => Duration::from_secs(a.seconds),
        },
        heartbeat: Duration::from_secs(a.heartbeat.max(1)),
        keepalive: Duration::from_secs(a.keepalive.max(1)),
        writers: a.writers.max(1),
        dir: a.dir,
        principal_args: a.principal_args,
        replicas: a
            .replicas
            .unwrap_or(if matches!(a.scenario, ScenarioArg::BigHub) {
                1
            } else {
                3
            })
            .max(1),
        compression: a.compression,
        wire_bytes: a.wire_bytes,
        projects: a.projects.max(1),
        agents_per_project: a.agents_per_project.max(1),
        apps_per_agent: a.apps_per_agent.max(2),
        spoke_apps: a.spoke_apps.max(1),
        rate: a.rate,
        interval: Duration::from_secs(a.interval.max(1)),
        restart_every: Duration::from_secs(a.restart_every.max(1)),
        rotate_every: Duration::from_secs(a.rotate_every.max(1)),
        samples: a.samples.clone(),
    };
    if !(a.rate.is_finite() && a.rate > 0.0) {
        return Err(format!(
            "--rate must be a positive number of changes per second, not {}",
            a.rate
        )
        .into());
    }
    if let ScenarioArg::FloorServer = a.scenario {
        let dir = opts
            .dir
            .clone()
            .ok_or("bench floor-server: --dir (the run's directory) is required")?;
        let endpoint = format!("unix://{}", dir.join("principal.sock").display());
        bench::floor::Floor::serve_standalone(endpoint).await?;
        return Ok(());
    }
    // The soak's plot is drawn from its samples, the others' from the rows of --json.
    let soak_plot = matches!(a.scenario, ScenarioArg::Soak)
        || (matches!(a.scenario, ScenarioArg::Plot) && a.samples.is_some());
    if a.plot.is_some() && soak_plot && a.samples.is_none() {
        return Err("bench soak --plot: the samples it draws go to --samples FILE".into());
    }
    if a.plot.is_some() && !soak_plot && a.json.is_none() {
        return Err("--plot draws the rows of --json FILE: give it".into());
    }
    if let Some(scenario) = a.scenario.scenario() {
        let report = bench::run(scenario, &opts)
            .await
            .map_err(|e| format!("bench {}: {e}", scenario.name()))?;
        print!("{}", report.table());
        if let Some(path) = &a.json {
            append_json_line(path, &report.json().to_string())?;
        }
    } else if a.plot.is_none() {
        return Err("bench plot: say where with --plot FILE.png (and --json FILE)".into());
    }
    match (&a.plot, &a.json, &a.samples) {
        (Some(png), _, Some(samples)) if soak_plot => {
            soak_plot_png(samples, png, a.font.as_deref())?
        }
        (Some(png), Some(json), _) => plot(json, png, a.font.as_deref())?,
        _ => {}
    }
    Ok(())
}

/// Draws the soak's samples in `samples` into `png`.
fn soak_plot_png(samples: &Path, png: &Path, font: Option<&Path>) -> crate::CmdResult {
    let text =
        std::fs::read_to_string(samples).map_err(|e| format!("{}: {e}", samples.display()))?;
    let lines =
        bench::soak::read_lines(&text).map_err(|e| format!("{}: {e}", samples.display()))?;
    let font = bench::plot::find_font(font).map_err(|e| e.to_string())?;
    bench::plot::draw_soak_png(&lines, &font, png).map_err(|e| e.to_string())?;
    println!(
        "plot: {} ({} samples from {})",
        png.display(),
        lines
            .iter()
            .filter(|l| matches!(l, bench::soak::Line::Sample { .. }))
            .count(),
        samples.display()
    );
    Ok(())
}

/// Draws the `connect`, `big-hub` and `big-spoke` rows of `json` into `png`.
fn plot(json: &Path, png: &Path, font: Option<&Path>) -> crate::CmdResult {
    let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
    let data = bench::plot::plot_data(&text).map_err(|e| format!("{}: {e}", json.display()))?;
    let font = bench::plot::find_font(font).map_err(|e| e.to_string())?;
    bench::plot::draw_png(&data, &font, png).map_err(|e| e.to_string())?;
    println!(
        "plot: {} ({} connect runs, {} hub and {} spoke points from {})",
        png.display(),
        data.connect.len(),
        data.hub.len(),
        data.spoke.len(),
        json.display()
    );
    Ok(())
}

/// Appends `line` and a newline to the file at `path` (created if missing): one run per line.
pub(crate) fn append_json_line(path: &std::path::Path, line: &str) -> crate::CmdResult {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "{line}").map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}
