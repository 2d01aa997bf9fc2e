//! Principal high availability, end to end with real processes: three principal replicas
//! (`--ha`) against one hub Kubernetes API test server, a real Envoy spreading six agents
//! (four managed, two autonomous) across them. Kill -9 one replica: its agents are served by
//! the others and every object converges; no agent ever has two live sessions; no change
//! made during the failover is lost; the restarted replica gets its share back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use argocd_agent_testkit::ha::{HaOptions, HaTopology};
use argocd_agent_testkit::harness::*;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

const REPLICAS: usize = 3;

fn agents() -> Vec<(String, &'static str)> {
    (0..6)
        .map(|i| {
            let mode = if i < 4 { "managed" } else { "autonomous" };
            (format!("agent-ha-{i}"), mode)
        })
        .collect()
}

/// Application name -> source path in `ns` on `server`.
async fn paths(
    server: &argocd_agent_kube_test_server::KubeTestServer,
    ns: &str,
) -> BTreeMap<String, String> {
    let Ok(api) = apps(server, ns) else {
        return BTreeMap::new();
    };
    match api.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .map(|o| {
                let path = o.data["spec"]["source"]["path"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                (o.metadata.name.unwrap_or_default(), path)
            })
            .collect(),
        Err(_) => BTreeMap::new(),
    }
}

/// Whether every agent's spoke and hub namespace hold the same Applications (name and
/// path), and the authoring side holds `expected`.
async fn converged(
    topo: &HaTopology,
    expected: &BTreeMap<String, BTreeMap<String, String>>,
) -> Result<(), String> {
    for (agent, want) in expected {
        let hub = paths(&topo.hub, agent).await;
        let spoke = paths(&topo.spokes[agent], SPOKE_NS).await;
        if &hub != want || &spoke != want {
            return Err(format!(
                "{agent}: want {want:?}, hub {hub:?}, spoke {spoke:?}"
            ));
        }
    }
    Ok(())
}

async fn wait_converged(
    topo: &HaTopology,
    expected: &BTreeMap<String, BTreeMap<String, String>>,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        match converged(topo, expected).await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits until every replica serves exactly `per` agents (by the Leases and by the logs).
async fn wait_balanced(topo: &HaTopology, per: usize, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let holders = topo.holders().await.unwrap_or_default();
        let served = topo.served();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for replica in holders.values() {
            *counts.entry(replica.clone()).or_default() += 1;
        }
        let by_lease = counts.len() == REPLICAS && counts.values().all(|n| *n == per);
        let by_log = served.len() == REPLICAS && served.values().all(|a| a.len() == per);
        if holders.len() == 6 && by_lease && by_log {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not balanced: leases {counts:?}, sessions {served:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Where `agent`'s Applications are authored: on the hub for a managed agent, on its spoke
/// for an autonomous one. Returns their API and namespace there.
fn authored<'a>(
    topo: &HaTopology,
    agent: &'a str,
    mode: &str,
) -> Result<(kube::Api<kube::api::DynamicObject>, &'a str), HarnessError> {
    let (server, ns) = if mode == "managed" {
        (&topo.hub, agent)
    } else {
        (&topo.spokes[agent], SPOKE_NS)
    };
    Ok((apps(server, ns)?, ns))
}

/// Sets Application `app`'s source path to `path` where each of `agents` authors it, and
/// expects it.
async fn set_path(
    topo: &HaTopology,
    expected: &mut BTreeMap<String, BTreeMap<String, String>>,
    agents: &[String],
    app: &str,
    path: &str,
) -> Result<(), String> {
    for agent in agents {
        let (api, _) =
            authored(topo, agent, topo.modes[agent.as_str()]).map_err(|x| x.to_string())?;
        merge_patch(&api, app, json!({"spec": {"source": {"path": path}}}))
            .await
            .map_err(|x| x.to_string())?;
        expected
            .get_mut(agent)
            .ok_or(format!("{agent} expects nothing"))?
            .insert(app.into(), path.into());
    }
    Ok(())
}

/// The replica holding `agent`'s Lease: its index, its name and every agent it holds.
async fn serving_replica(
    topo: &HaTopology,
    agent: &str,
) -> Result<(usize, String, Vec<String>), String> {
    let holders = topo.holders().await.map_err(|e| e.to_string())?;
    let name = holders
        .get(agent)
        .ok_or(format!("{agent} has no Lease"))?
        .clone();
    let index = topo
        .replicas
        .iter()
        .position(|r| r.name == name)
        .ok_or(format!("replica {name} not found"))?;
    let agents = holders
        .iter()
        .filter(|(_, r)| **r == name)
        .map(|(a, _)| a.clone())
        .collect();
    Ok((index, name, agents))
}

/// Waits until each of `agents` holds its Lease on a replica other than `gone` and has a
/// session there.
async fn wait_served_elsewhere(
    topo: &HaTopology,
    agents: &[String],
    gone: &str,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let holders = topo.holders().await.unwrap_or_default();
        let served = topo.served();
        let all_elsewhere = agents.iter().all(|a| {
            holders.get(a).is_some_and(|r| r != gone)
                && served
                    .iter()
                    .any(|(r, served)| r != gone && served.contains(a))
        });
        if all_elsewhere {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "agents of {gone} not served elsewhere: leases {holders:?}, sessions {served:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_fail_over_without_losing_anything_or_doubling_sessions() {
    let dir = std::env::var_os("E2E_DIR").map(std::path::PathBuf::from);
    let mut topo = HaTopology::start(HaOptions {
        replicas: REPLICAS,
        agents: agents(),
        principal_args: vec![
            "--replica-lease-duration".into(),
            "3s".into(),
            "--rebalance-interval".into(),
            "1s".into(),
            "--rebalance-slack".into(),
            "0".into(),
        ],
        per_replica_args: vec![],
        per_agent_args: Default::default(),
        dir,
    })
    .await
    .unwrap();
    let result = scenario(&mut topo).await;
    if let Err(e) = &result {
        eprintln!("{e}\n{}", topo.logs());
    }
    let overlaps = topo.overlapping_sessions();
    topo.stop().await;
    result.unwrap();
    assert!(
        overlaps.is_empty(),
        "agents with two live sessions at once: {overlaps:#?}"
    );
}

async fn scenario(topo: &mut HaTopology) -> Result<(), String> {
    let e = |e: Box<dyn std::error::Error + Send + Sync>| e.to_string();
    // 1. Envoy spreads the agents; the replicas even out to two each.
    wait_balanced(topo, 2, Duration::from_secs(60)).await?;
    eprintln!("balanced: {:?}", topo.served());
    // What an operator sees: every replica live with two agents, every agent served.
    let out = std::process::Command::new(binary("argocd-agentctl").map_err(e)?)
        .args(["replicas", "--agents", "-n", HUB_ARGOCD_NS, "--kubeconfig"])
        .arg(topo.dir.join("hub.kubeconfig"))
        .output()
        .map_err(|x| x.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{text}");
    let live_rows = text
        .lines()
        .filter(|l| {
            l.starts_with("principal-") && l.contains(" live ") && l.trim_end().ends_with(" 2")
        })
        .count();
    if !out.status.success()
        || live_rows != REPLICAS
        || !text.contains("agents: 6 with a Lease, 0 not connected")
    {
        return Err(format!(
            "argocd-agentctl replicas: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }

    // 2. Applications: authored on the hub for managed agents, on the spoke for autonomous.
    let mut expected: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (agent, mode) in topo.modes.clone() {
        let (api, ns) = authored(topo, &agent, mode).map_err(e)?;
        for name in ["app-a", "app-b"] {
            api.create(&PostParams::default(), &sample_app(name, ns, "guestbook"))
                .await
                .map_err(|x| x.to_string())?;
            expected
                .entry(agent.clone())
                .or_default()
                .insert(name.to_string(), "guestbook".into());
        }
    }
    wait_converged(topo, &expected, Duration::from_secs(30)).await?;

    // 3. kill -9 the replica serving agent-ha-0, then change objects of its agents (and
    // others) while they move.
    let (victim, victim_name, moved) = serving_replica(topo, "agent-ha-0").await?;
    let killed = Instant::now();
    topo.kill_replica(victim).await;
    eprintln!("killed {victim_name}, which served {moved:?}");
    for (agent, mode) in topo.modes.clone() {
        let (api, ns) = authored(topo, &agent, mode).map_err(e)?;
        // Every agent: one edit, one delete, one create.
        merge_patch(
            &api,
            "app-a",
            json!({"spec": {"source": {"path": "helm-guestbook"}}}),
        )
        .await
        .map_err(e)?;
        api.delete("app-b", &DeleteParams::default())
            .await
            .map_err(|x| x.to_string())?;
        api.create(
            &PostParams::default(),
            &sample_app("app-c", ns, "kustomize-guestbook"),
        )
        .await
        .map_err(|x| x.to_string())?;
        let want = expected.get_mut(&agent).unwrap();
        want.insert("app-a".into(), "helm-guestbook".into());
        want.remove("app-b");
        want.insert("app-c".into(), "kustomize-guestbook".into());
    }
    // Served again: the moved agents hold Leases of live replicas and have sessions there.
    wait_served_elsewhere(topo, &moved, &victim_name, Duration::from_secs(60)).await?;
    let served_after = killed.elapsed();
    wait_converged(topo, &expected, Duration::from_secs(60)).await?;
    let converged_after = killed.elapsed();
    eprintln!(
        "failover: {} agents served by the survivors {:.2}s after kill -9, every object equal after {:.2}s",
        moved.len(),
        served_after.as_secs_f64(),
        converged_after.as_secs_f64()
    );

    // 4. Restart the replica: the load evens out again as agents are moved to it.
    topo.restart_replica(victim).await.map_err(e)?;
    let restarted = Instant::now();
    wait_balanced(topo, 2, Duration::from_secs(60)).await?;
    eprintln!(
        "rebalanced to two agents per replica {:.2}s after restart: {:?}",
        restarted.elapsed().as_secs_f64(),
        topo.served()
    );
    // 5. A second session of a served agent on another replica (the agent reconnected
    // there while its old connection looked alive): the serving replica is asked, closes
    // its session and hands the Lease over; only then is the new session welcomed.
    let holders = topo.holders().await.map_err(e)?;
    let agent = "agent-ha-1";
    let serving = holders[agent].clone();
    let other = topo
        .replicas
        .iter()
        .position(|r| r.name != serving && r.proc_running())
        .ok_or("no other replica")?;
    let source = argocd_agent_identity::source::SvidSource::workload_api(Some(
        topo.spiffe
            .endpoint(&topo.dir.join(format!("{agent}.sock"))),
    ))
    .await
    .map_err(|x| x.to_string())?;
    source
        .wait_ready(Duration::from_secs(30))
        .await
        .map_err(|x| x.to_string())?;
    let asked = Instant::now();
    let (stream, welcome) = open_agent_stream(
        &source,
        topo.replicas[other].addr,
        argocd_agent_proto::eventstream::AgentMode::Managed,
    )
    .await
    .map_err(e)?;
    if welcome.ty != argocd_agent_domain::EventType::Welcome {
        return Err(format!("second session not welcomed: {welcome:?}"));
    }
    eprintln!(
        "{agent} handed over from {serving} to {} in {:.0} ms",
        topo.replicas[other].name,
        asked.elapsed().as_secs_f64() * 1000.0
    );
    let now_held = topo.holders().await.map_err(e)?;
    if now_held[agent] != topo.replicas[other].name {
        return Err(format!("lease of {agent} not handed over: {now_held:?}"));
    }
    let serving_log = topo
        .replicas
        .iter()
        .find(|r| r.name == serving)
        .map(|r| r.proc.log())
        .unwrap_or_default();
    if !serving_log.contains("another replica asked for this agent") {
        return Err(format!("{serving} did not log the handover"));
    }
    drop(stream);
    // The real agent comes back (through Envoy) and the layout evens out again.
    wait_balanced(topo, 2, Duration::from_secs(60)).await?;

    // A last round of edits reaches every spoke (or hub) through the new layout.
    let all: Vec<String> = topo.modes.keys().cloned().collect();
    set_path(topo, &mut expected, &all, "app-c", "blue-green").await?;
    wait_converged(topo, &expected, Duration::from_secs(30)).await?;

    // 6. SIGTERM to the replica serving agent-ha-2 (a step of a rolling update): it clears
    // its replica Lease and tells its agents at once, writing no release of their Leases;
    // the others take each over as from a replica that is gone. No agent has two sessions
    // at once (checked by the caller), and changes still arrive.
    let (leaving, leaving_name, leaving_agents) = serving_replica(topo, "agent-ha-2").await?;
    let stopped = Instant::now();
    topo.stop_replica(leaving).await;
    let exited = stopped.elapsed();
    wait_served_elsewhere(
        topo,
        &leaving_agents,
        &leaving_name,
        Duration::from_secs(30),
    )
    .await?;
    eprintln!(
        "SIGTERM: {leaving_name} exited {:.2}s after it; its {} agents served by the others {:.2}s after it",
        exited.as_secs_f64(),
        leaving_agents.len(),
        stopped.elapsed().as_secs_f64()
    );
    let survivors_log: String = topo
        .replicas
        .iter()
        .filter(|r| r.name != leaving_name)
        .map(|r| r.proc.log())
        .collect();
    for agent in &leaving_agents {
        let taken_over = survivors_log.lines().any(|l| {
            l.contains("agent Lease taken over from a replica that is gone")
                && l.contains(&format!("agent={agent} "))
                && l.contains(&format!("previous={leaving_name}_"))
        });
        if !taken_over {
            return Err(format!(
                "{agent}'s Lease was not taken over from {leaving_name} (released instead?)"
            ));
        }
    }
    set_path(topo, &mut expected, &leaving_agents, "app-a", "guestbook").await?;
    wait_converged(topo, &expected, Duration::from_secs(30)).await?;

    // Lease writes were counted; a handover or takeover happened for each moved agent.
    let mut writes = 0.0;
    for r in &topo.replicas {
        writes += metric_sum(r.metrics_port, "argocd_principal_lease_writes_total").await;
    }
    eprintln!("lease writes counted by the live replicas: {writes}");
    if writes <= 0.0 {
        return Err("no lease writes counted".into());
    }
    Ok(())
}
