//! Smoke runs of every load-generator scenario (`argocd-agent-dev bench`): a real principal
//! and a few simulated agents, a few seconds each, so the load generator never rots. No
//! timing is asserted here; the figures live in docs/benchmarks.md.
//!
//! A smoke asserts only what a run this short measures in a debug and in a release build
//! alike: counts, orderings, and CPU figures read with nanosecond clocks. A CPU figure its
//! clock cannot resolve says "not measured" instead of a 0 ([`cpu`]).

use std::time::Duration;

use argocd_agent_load::bench::{self, BenchOptions, Report, Scenario};
use serde_json::Value;

fn opts() -> BenchOptions {
    BenchOptions {
        agents: 12,
        changes: 24,
        payload_bytes: 4096,
        duration: Duration::from_secs(3),
        heartbeat: Duration::from_secs(1),
        writers: 4,
        ..BenchOptions::default()
    }
}

async fn smoke(scenario: Scenario) -> Report {
    let report = bench::run(scenario, &opts())
        .await
        .unwrap_or_else(|e| panic!("bench {}: {e}", scenario.name()));
    eprint!("{}", report.table());
    report
}

fn get(r: &Report, key: &str) -> Value {
    r.json()
        .get(key)
        .cloned()
        .unwrap_or_else(|| panic!("{} has no {key}: {}", r.scenario, r.json()))
}

fn num(r: &Report, key: &str) -> f64 {
    get(r, key)
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number: {}", r.json()))
}

/// Whose CPU a figure is.
#[derive(Clone, Copy, PartialEq)]
enum Of {
    /// The test process (the simulated agents, the floor, the hub): its own nanosecond
    /// clock, always there.
    ThisProcess,
    /// Another process (the principal, a real agent): per-thread nanosecond times where
    /// the kernel has schedstat, else clock ticks.
    Another,
}

/// A CPU figure of the report. It is a measured number, except for another process's on
/// a kernel that gives no per-thread times: then the run may say "not measured" (its
/// clock ticks were too coarse for so short a window), never 0.
fn cpu(r: &Report, key: &str, of: Of) -> Option<f64> {
    match get(r, key) {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s)
            if s.starts_with("not measured")
                && of == Of::Another
                && !argocd_agent_load::bench::env::per_thread_cpu_available() =>
        {
            None
        }
        other => panic!("{key} is {other}, not a measured number: {}", r.json()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_smoke() {
    let r = smoke(Scenario::Connect).await;
    assert_eq!(num(&r, "agents"), 12.0);
    assert_eq!(num(&r, "dropped_streams"), 0.0);
    assert!(num(&r, "rss_connected_mib") > 0.0);
    // The floor process ran in the same run and reported its own growth.
    assert!(get(&r, "floor_idle_bytes_per_conn").is_u64());
    assert!(r.table().contains("idle_ratio_to_floor"));
    // 36 heartbeats in the 3 s idle window are work the principal did: measured, and more
    // than nothing.
    if let Some(pct) = cpu(&r, "idle_cpu_pct", Of::Another) {
        assert!(pct > 0.0, "{}", r.json());
    }
    // The window is whole heartbeat periods: 12 agents × 3 heartbeats, each one counted by
    // the principal (one more or less for an agent whose tick fell on an edge).
    assert_eq!(num(&r, "idle_s"), 3.0);
    let heartbeats = num(&r, "idle_heartbeats");
    assert!((33.0..=39.0).contains(&heartbeats), "{}", r.json());
    cpu(&r, "idle_cpu_us_per_heartbeat", Of::Another);
    let table = r.table();
    assert!(table.starts_with("scenario") && table.contains("connect"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_smoke_as_a_replica_counts_lease_writes() {
    let mut o = opts();
    o.principal_args = [
        "--ha",
        "--replica-lease-duration=1s",
        "--agent-lease-duration=2s",
    ]
    .map(String::from)
    .to_vec();
    let r = bench::run(Scenario::Connect, &o)
        .await
        .unwrap_or_else(|e| panic!("bench connect --ha: {e}"));
    eprint!("{}", r.table());
    assert_eq!(num(&r, "dropped_streams"), 0.0);
    // One Lease per agent (plus the replica's own), then renewals while idle.
    assert!(num(&r, "lease_writes_connect") >= 13.0);
    assert!(num(&r, "lease_writes_idle_per_s") > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_smoke() {
    let r = smoke(Scenario::Storm).await;
    // Every agent came back with a new session and the changes made while the principal
    // was down (checked inside the scenario: every agent holds the new spec).
    assert!(num(&r, "sessions") >= 12.0);
    assert!(num(&r, "resynced_s") >= num(&r, "reconnected_s"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_smoke() {
    let r = smoke(Scenario::Fanout).await;
    assert_eq!(num(&r, "changes"), 24.0);
    assert!(num(&r, "hub_to_agent_max_ms") >= num(&r, "hub_to_agent_p50_ms"));
    assert!(num(&r, "agent_to_hub_max_ms") > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projects_smoke() {
    let o = BenchOptions {
        projects: 30,
        agents_per_project: 3,
        changes: 10,
        ..opts()
    };
    let r = bench::run(Scenario::Projects, &o)
        .await
        .unwrap_or_else(|e| panic!("bench projects: {e}"));
    eprint!("{}", r.table());
    assert_eq!(num(&r, "delivered_to_unmatched_agents"), 0.0);
    // Each change re-evaluates the agents it concerns (3), not the fleet (12).
    assert_eq!(num(&r, "agents_reevaluated_per_change"), 3.0);
    assert!(num(&r, "change_to_all_matched_p99_ms") > 0.0);
    if let Some(ms) = cpu(&r, "principal_cpu_ms_per_change", Of::Another) {
        assert!(ms > 0.0, "{}", r.json());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_smoke() {
    let r = smoke(Scenario::Tenants).await;
    assert_eq!(num(&r, "agents_per_tenant"), 6.0);
    // Team-a was at its limits: its bucket refused events and its Applications past
    // applicationsPerAgent were held back; team-b was refused nothing.
    assert!(num(&r, "a_events_refused") > 0.0, "{}", r.json());
    assert_eq!(num(&r, "a_apps_held_back"), 12.0, "{}", r.json());
    assert_eq!(num(&r, "b_refused"), 0.0, "{}", r.json());
    for key in [
        "b_alone_hub_to_agent_p99_ms",
        "b_flood_hub_to_agent_p99_ms",
        "hub_to_agent_p99_ratio",
        "b_alone_agent_to_hub_p99_ms",
        "b_flood_agent_to_hub_p99_ms",
        "agent_to_hub_p99_ratio",
    ] {
        assert!(num(&r, key) > 0.0, "{key}: {}", r.json());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_smoke() {
    let r = smoke(Scenario::Throughput).await;
    assert_eq!(num(&r, "refused"), 0.0);
    assert!(num(&r, "event_bytes") >= 4096.0);
    for k in [
        "to_agents_per_s",
        "floor_to_agents_per_s",
        "to_principal_per_s",
        "floor_to_principal_per_s",
        "backlog_to_agents_per_s",
    ] {
        assert!(num(&r, k) > 0.0, "{k}");
    }
    // The backlog is 48 events, shorter than a clock tick: the CPU per event is read with
    // nanosecond clocks, and each end did work for every event.
    for (k, of) in [
        ("backlog_principal_cpu_us_per_event", Of::Another),
        ("backlog_agents_cpu_us_per_event", Of::ThisProcess),
        ("floor_cpu_us_per_event", Of::ThisProcess),
    ] {
        if let Some(us) = cpu(&r, k, of) {
            assert!(us > 0.0, "{k}: {}", r.json());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_smoke() {
    let r = smoke(Scenario::Rotation).await;
    assert!(num(&r, "rotations") >= 1.0);
    assert_eq!(num(&r, "dropped_streams"), 0.0);
    assert_eq!(num(&r, "failed_handshakes"), 0.0);
    assert_eq!(num(&r, "refused_events"), 0.0);
    assert_eq!(num(&r, "lost_changes"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_smoke() {
    let r = smoke(Scenario::Bulk).await;
    assert_eq!(num(&r, "ops"), 24.0);
    assert!(num(&r, "managed_converged_s") >= num(&r, "managed_write_s"));
    assert!(num(&r, "autonomous_converged_s") >= num(&r, "autonomous_write_s"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_smoke() {
    let mut o = opts();
    o.principal_args = vec!["--replica-lease-duration=2s".into()];
    let r = bench::run(Scenario::Failover, &o)
        .await
        .unwrap_or_else(|e| panic!("bench failover: {e}"));
    eprint!("{}", r.table());
    // Every agent has a session on a survivor again and holds the spec changed after the
    // kill (both checked inside the scenario); replica 0's agents moved, through Leases.
    assert_eq!(num(&r, "replicas"), 3.0);
    assert_eq!(get(&r, "replica_lease"), "2s");
    assert!(num(&r, "on_killed_replica") >= 1.0);
    assert!(num(&r, "moved") >= num(&r, "on_killed_replica"));
    assert!(num(&r, "sessions") >= num(&r, "on_killed_replica"));
    assert!(num(&r, "resynced_s") >= num(&r, "reconnected_s"));
    assert!(num(&r, "lease_writes") > 0.0);
}

/// Runs `argocd-agent-dev` with `args`; asserts it succeeded and returns its standard output.
async fn run_dev(args: &[&str]) -> String {
    let ctl = argocd_agent_testkit::harness::binary("argocd-agent-dev").unwrap();
    let out = tokio::process::Command::new(&ctl)
        .args(args)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The command as documented: two `connect` runs appended to one JSON-lines file, the
/// cost-growth plot drawn from it (a PNG with both runs), then redrawn without a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_connect_runs_and_plot() {
    let ctl = argocd_agent_testkit::harness::binary("argocd-agent-dev").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (json, png) = (dir.path().join("bench.jsonl"), dir.path().join("cost.png"));
    let (json_s, png_s) = (json.to_str().unwrap(), png.to_str().unwrap());
    for agents in ["5", "10"] {
        let stdout = run_dev(&[
            "bench",
            "connect",
            "--agents",
            agents,
            "--seconds",
            "1",
            "--json",
            json_s,
            "--plot",
            png_s,
        ])
        .await;
        assert!(stdout.starts_with("scenario"), "{stdout}");
        assert!(stdout.contains("plot: "), "{stdout}");
    }
    let rows = std::fs::read_to_string(&json).unwrap();
    assert_eq!(rows.lines().count(), 2, "{rows}");
    let points = bench::plot::connect_points(&rows).unwrap();
    assert_eq!(
        points.iter().map(|p| p.agents).collect::<Vec<_>>(),
        vec![5, 10]
    );
    assert!(
        std::fs::read(&png)
            .unwrap()
            .starts_with(b"\x89PNG\r\n\x1a\n")
    );

    std::fs::remove_file(&png).unwrap();
    let stdout = run_dev(&["bench", "plot", "--json", json_s, "--plot", png_s]).await;
    assert!(stdout.contains("2 connect runs"), "{stdout}");
    assert!(png.is_file());
    // `plot` without --plot is an error, not a silent no-op.
    let out = tokio::process::Command::new(&ctl)
        .args(["bench", "plot", "--json"])
        .arg(&json)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_hub_smoke() {
    let o = BenchOptions {
        apps_per_agent: 4,
        replicas: 1,
        ..opts()
    };
    let r = bench::run(Scenario::BigHub, &o)
        .await
        .unwrap_or_else(|e| panic!("bench big-hub: {e}"));
    eprint!("{}", r.table());
    // Both storms ended with every agent holding all its Applications at the revision
    // written while the principal was down (checked inside the scenario).
    assert_eq!(num(&r, "apps_small"), 12.0);
    assert_eq!(num(&r, "apps"), 48.0);
    assert!(num(&r, "storm_resynced_s") >= num(&r, "storm_reconnected_s"));
    assert!(num(&r, "storm_reconnected_s") >= num(&r, "storm_ready_s"));
    assert!(num(&r, "ready_cold_s") > 0.0);
    assert!(num(&r, "rss_settled_mib") > 0.0 && num(&r, "rss_cold_mib") > 0.0);
    get(&r, "settled_bytes_per_app");
    get(&r, "cold_bytes_per_app");
}

/// `big-hub --replicas 2`: the same hub under one principal, then two `--ha` replicas; each
/// replica keeps decoded exactly the Applications of the agents it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_hub_replicas_smoke() {
    let o = BenchOptions {
        apps_per_agent: 4,
        replicas: 2,
        ..opts()
    };
    let r = bench::run(Scenario::BigHub, &o)
        .await
        .unwrap_or_else(|e| panic!("bench big-hub --replicas 2: {e}"));
    eprint!("{}", r.table());
    assert_eq!(num(&r, "apps"), 48.0);
    assert_eq!(num(&r, "replicas"), 2.0);
    let json = r.json();
    let served: Vec<f64> = json["replica_agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(served.iter().sum::<f64>(), 12.0, "{json}");
    let cached = json["replica_cached"].as_array().unwrap();
    assert_eq!(cached.len(), 2);
    for (forms, agents) in cached.iter().zip(&served) {
        let (decoded, compact) = (
            forms["decoded"].as_f64().unwrap(),
            forms["compact"].as_f64().unwrap(),
        );
        // Every Application is cached once; decoded are the served agents' own (4 each).
        assert_eq!(decoded + compact, 48.0, "{json}");
        assert_eq!(decoded, 4.0 * agents, "{json}");
    }
    for key in ["replica_rss_cold_mib", "replica_rss_settled_mib"] {
        let rss = json[key].as_array().unwrap();
        assert_eq!(rss.len(), 2, "{key}");
        assert!(rss.iter().all(|v| v.as_f64().unwrap() > 0.0), "{key}");
    }
    assert!(num(&r, "single_rss_settled_mib") > 0.0);
    assert!(num(&r, "replica_share_settled") > 0.0);
    assert!(num(&r, "replica_share_cold") > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_spoke_smoke() {
    let o = BenchOptions {
        spoke_apps: 150,
        changes: 20,
        rate: 20.0,
        duration: Duration::from_secs(2),
        ..opts()
    };
    let r = bench::run(Scenario::BigSpoke, &o)
        .await
        .unwrap_or_else(|e| panic!("bench big-spoke: {e}"));
    eprint!("{}", r.table());
    // One real agent filled its spoke, came back after an outage and after a principal
    // restart with the changes made meanwhile, and applied every streamed change (each
    // waited for inside the scenario).
    assert_eq!(num(&r, "apps"), 150.0);
    assert_eq!(num(&r, "resync_changes"), 1.0);
    assert_eq!(num(&r, "stream_changes"), 20.0);
    assert!(num(&r, "outage_resynced_s") >= num(&r, "outage_reconnect_s"));
    assert!(num(&r, "restart_resynced_s") >= num(&r, "restart_ready_s"));
    assert!(num(&r, "apply_max_ms") >= num(&r, "apply_p99_ms"));
    assert!(num(&r, "agent_rss_mib") > 0.0);
    // Idle for 2 s, the agent and the principal may truly use no CPU: their figures must
    // be read (`cpu` fails on anything but a number or an allowed "not measured"), whatever
    // their size. Applying 20 changes is work.
    cpu(&r, "agent_idle_cpu_pct", Of::Another);
    cpu(&r, "principal_idle_cpu_pct", Of::Another);
    if let Some(pct) = cpu(&r, "agent_stream_cpu_pct", Of::Another) {
        assert!(pct > 0.0, "{}", r.json());
    }
}

/// `bench plot` draws the Application charts from big-hub and big-spoke rows alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_plot_draws_application_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (json, png) = (dir.path().join("bench.jsonl"), dir.path().join("cost.png"));
    std::fs::write(
        &json,
        concat!(
            r#"{"scenario":"big-hub","agents":10,"apps_small":10,"apps":40,"rss_cold_small_mib":20.5,"rss_cold_mib":21.0,"rss_settled_small_mib":22.0,"rss_settled_mib":22.5}"#,
            "\n",
            r#"{"scenario":"big-spoke","apps":150,"agent_rss_empty_mib":15.0,"agent_rss_mib":17.5}"#,
            "\n"
        ),
    )
    .unwrap();
    let stdout = run_dev(&[
        "bench",
        "plot",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ])
    .await;
    assert!(
        stdout.contains("0 connect runs, 2 hub and 2 spoke points"),
        "{stdout}"
    );
    assert!(
        std::fs::read(&png)
            .unwrap()
            .starts_with(b"\x89PNG\r\n\x1a\n")
    );
}

/// A storm against the shipped configuration (`replicas` principals, `--ha` with several):
/// every agent served and holding the hub's final state, nothing lost or applied twice.
async fn shipped_storm(scenario: Scenario, replicas: usize) -> Report {
    let o = BenchOptions { replicas, ..opts() };
    let r = bench::run(scenario, &o)
        .await
        .unwrap_or_else(|e| panic!("bench {}: {e}", scenario.name()));
    eprint!("{}", r.table());
    assert_eq!(num(&r, "agents"), 12.0);
    assert_eq!(num(&r, "replicas"), replicas as f64);
    assert_eq!(num(&r, "lost"), 0.0);
    assert_eq!(num(&r, "duplicated"), 0.0);
    assert!(num(&r, "resynced_s") >= num(&r, "served_s"));
    assert!(num(&r, "most_without_session") <= 12.0);
    assert!(!get(&r, "build").as_str().unwrap_or_default().is_empty());
    assert!(get(&r, "loadavg").as_str().is_some());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_connect_smoke() {
    let r = shipped_storm(Scenario::HaConnect, 3).await;
    // Nobody had a session before the storm, and each first session wrote a Lease.
    assert_eq!(num(&r, "most_without_session"), 12.0);
    assert!(num(&r, "lease_writes") >= 12.0);
    assert!(num(&r, "sessions") >= 12.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_kill_one_smoke() {
    let r = shipped_storm(Scenario::HaKillOne, 3).await;
    // The killed replica's agents (4 of 12) lost their sessions, and came back.
    assert!(num(&r, "most_without_session_agents") >= 1.0);
    assert!(num(&r, "sessions") >= 1.0);
    assert!(num(&r, "lease_writes") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_kill_all_smoke() {
    let r = shipped_storm(Scenario::HaKillAll, 3).await;
    assert_eq!(num(&r, "most_without_session_agents"), 12.0);
    assert!(num(&r, "sessions") >= 12.0);
    assert!(num(&r, "lease_writes") >= 12.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_rollout_smoke() {
    let r = shipped_storm(Scenario::HaRollout, 3).await;
    // Every replica was replaced: every agent had to move at least once.
    assert!(num(&r, "sessions") >= 12.0);
    assert!(num(&r, "rollout_s") > 0.0);
    assert!(num(&r, "lease_writes") >= 12.0);
    // As the deployment controller steps it with deploy/'s maxSurge 1, maxUnavailable 1:
    // the first old replica goes and two successors start at once.
    assert_eq!(num(&r, "most_successors_starting"), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_principal_rollout_smoke() {
    let r = shipped_storm(Scenario::HaRollout, 1).await;
    assert_eq!(num(&r, "most_without_session_agents"), 12.0);
    // No --ha: no Leases.
    assert_eq!(num(&r, "lease_writes"), 0.0);
}

/// The soak, short: 20 agents for 40 s, a sample every 5 s, a replica restarted every 15 s,
/// every SVID rotated every 10 s, through the command line with its samples file and plot.
/// Asserts what so short a run measures (nothing lost, the samples at their interval, the
/// restarts, every agent served at the end), never a growth figure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_smoke() {
    use bench::soak::Line;
    let dir = tempfile::tempdir().unwrap();
    let (json, samples, png) = (
        dir.path().join("bench.jsonl"),
        dir.path().join("soak.jsonl"),
        dir.path().join("soak.png"),
    );
    let stdout = run_dev(&[
        "bench",
        "soak",
        "--agents",
        "20",
        "--seconds",
        "40",
        "--interval",
        "5",
        "--restart-every",
        "15",
        "--rotate-every",
        "10",
        "--heartbeat",
        "1",
        "--json",
        json.to_str().unwrap(),
        "--samples",
        samples.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ])
    .await;
    eprint!("{stdout}");
    let row: Value = serde_json::from_str(std::fs::read_to_string(&json).unwrap().trim()).unwrap();
    let n = |k: &str| {
        row[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} is not a number: {row}"))
    };
    assert_eq!(n("agents"), 20.0);
    assert_eq!(n("replicas"), 3.0);
    assert_eq!(n("lost"), 0.0, "{row}");
    assert_eq!(n("served_at_end"), 20.0, "{row}");
    // Restarts at 15 s and 30 s: replicas 1 and 2, round robin; principal-0 never.
    assert_eq!(n("restarts"), 2.0, "{row}");
    assert!(n("rotations") >= 3.0, "{row}");
    assert!(n("kicked") >= 7.0, "{row}");
    assert!(n("changes") > 0.0 && n("status_updates") > 0.0, "{row}");
    assert!(row["compared"].as_str().unwrap().starts_with("principal-0"));

    let lines = bench::soak::read_lines(&std::fs::read_to_string(&samples).unwrap()).unwrap();
    let at_interval: Vec<f64> = lines
        .iter()
        .filter_map(|l| match l {
            Line::Sample {
                t_s,
                before_restart: false,
                ..
            } => Some(*t_s),
            _ => None,
        })
        .collect();
    // At 0, 5, ..., 35 s: on schedule (a restart may delay one, never drop it).
    assert_eq!(at_interval.len(), 8, "{at_interval:?}");
    assert_eq!(n("samples"), 8.0);
    for (k, t) in at_interval.iter().enumerate() {
        assert!(*t >= 5.0 * k as f64, "{at_interval:?}");
    }
    let restarted: Vec<(String, u32)> = lines
        .iter()
        .filter_map(|l| match l {
            Line::Restart {
                replica,
                generation,
                ..
            } => Some((replica.clone(), *generation)),
            _ => None,
        })
        .collect();
    assert_eq!(
        restarted,
        vec![("principal-1".into(), 2), ("principal-2".into(), 2)]
    );
    // Every sample read every replica; a restarted one as its new process afterwards.
    let Some(Line::Sample {
        replicas, bench, ..
    }) = lines
        .iter()
        .rev()
        .find(|l| matches!(l, Line::Sample { .. }))
    else {
        panic!("no sample")
    };
    assert_eq!(
        replicas
            .iter()
            .map(|r| (r.replica.as_str(), r.generation))
            .collect::<Vec<_>>(),
        vec![("principal-0", 1), ("principal-1", 2), ("principal-2", 2)]
    );
    assert!(
        replicas
            .iter()
            .all(|r| r.rss_mib > 0.0 && r.fds > 0 && r.threads > 0)
    );
    assert!(replicas.iter().all(|r| r.queue_depth.is_some()));
    assert!(bench.rss_mib > 0.0 && bench.fds > 0 && bench.tasks > 0);
    assert!(
        std::fs::read(&png)
            .unwrap()
            .starts_with(b"\x89PNG\r\n\x1a\n")
    );
}
