//! A short chaos seed (`argocd-agent-dev chaos`), every run: real principal and agent
//! processes (two managed, two autonomous), a fault-injecting proxy on every agent link, a
//! few hundred seeded operations under a fault every ~0.6 s (kills of the principal, the
//! agents and the Workload API server, link cuts, outages and delays, API 500s and 429s,
//! dropped watches, forced 410s) and SVID rotation every 2 s; then every object is checked
//! against the model. The full run (10,000 operations) and its figures are in
//! docs/reliability.md.

use std::time::Duration;

use argocd_agent_load::chaos::{self, ChaosOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_seed_loses_nothing_under_faults() {
    let opts = ChaosOptions {
        seed: 20261123,
        ops: 300,
        agents: 4,
        rate: 25.0,
        fault_every: Duration::from_millis(600),
        rotate_every: Duration::from_secs(2),
        ..ChaosOptions::default()
    };
    let report = chaos::run(&opts).await.expect("chaos topology");
    eprint!("{}", report.table());
    assert!(
        report.passed(),
        "chaos seed {} failed:\n{}",
        opts.seed,
        report.table()
    );
    assert_eq!(report.objects_checked, 4 * opts.names * 2);
    let applied: usize = report.applied.values().sum();
    assert!(
        applied >= opts.ops * 9 / 10,
        "most operations must apply: {:?} {:?}",
        report.applied,
        report.skipped
    );
    // The schedule really injected faults of many kinds, rotation among them.
    let kinds = report
        .faults
        .keys()
        .filter(|k| *k != "svid-rotation")
        .count();
    assert!(kinds >= 4, "too few fault kinds: {:?}", report.faults);
    assert!(report.faults.get("svid-rotation").copied().unwrap_or(0) >= 2);
}
