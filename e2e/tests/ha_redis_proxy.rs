//! The Redis proxy with several replicas, end to end: three principal replicas (`--ha`),
//! each with its own Redis proxy listener in front of one hub Redis, and two agents (each
//! with its own spoke Redis) spread across them by Envoy. Every replica answers for every
//! agent: a `GET` or `SUBSCRIBE` reaching a replica that does not serve the agent is
//! forwarded to the one that does, and a forwarded connection is never forwarded again. The
//! hub Redis is password-protected: the replicas log in to each other's proxies with it.
//!
//! Needs `redis-server` (Debian package `redis-server`, installed by `.ci/run`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use argocd_agent_redis::resp::{Frame2, Value};
use argocd_agent_redis::{RedisConn, RedisEndpoint};
use argocd_agent_testkit::envoy::free_loopback_port;
use argocd_agent_testkit::ha::{HaOptions, HaTopology};
use argocd_agent_testkit::harness::*;
use argocd_agent_testkit::redis::RedisServer;
use kube::api::PostParams;

const T: Duration = Duration::from_secs(30);
const REPLICAS: usize = 3;
const AGENTS: [&str; 2] = ["agent-hr-0", "agent-hr-1"];
const SUFFIX: &str = "|1.8.3.gz";

/// The hub Redis wants a password, as Argo CD's does: clients of the proxies send it, and
/// a replica forwarding a key to another logs in to that one's proxy with it.
const HUB_PASSWORD: &str = "ha-hub-redis-password";

async fn conn(addr: String) -> Result<RedisConn, String> {
    login(addr, None).await
}

async fn login(addr: String, password: Option<&str>) -> Result<RedisConn, String> {
    RedisEndpoint {
        addr,
        password: password.map(str::to_owned),
        ..Default::default()
    }
    .connect(1 << 20)
    .await
    .map_err(|e| e.to_string())
}

async fn proxy(port: u16) -> Result<RedisConn, String> {
    login(format!("127.0.0.1:{port}"), Some(HUB_PASSWORD)).await
}

/// `GET key` through a connection: the value, nil, or the error message.
async fn get(c: &mut RedisConn, key: &str) -> Result<Option<Vec<u8>>, String> {
    let frame = tokio::time::timeout(
        Duration::from_secs(10),
        c.command(&[b"GET", key.as_bytes()]),
    )
    .await
    .map_err(|_| "no reply within 10 s".to_string())?
    .map_err(|e| e.to_string())?;
    frame
        .into_value()
        .map(|v| v.map(|b| b.to_vec()))
        .map_err(|e| e.to_string())
}

fn tree(agent: &str) -> Vec<u8> {
    format!("\x1f tree of web on {agent}").into_bytes()
}

fn replica_metric(result: &str) -> String {
    format!("argocd_principal_redis_proxy_commands_total{{route=\"replica\",result=\"{result}\"}}")
}

/// Redis servers (hub, one per agent) and the replicas, each with its own Redis proxy.
struct Setup {
    _dir: tempfile::TempDir,
    _hub_redis: RedisServer,
    spoke_redis: BTreeMap<&'static str, RedisServer>,
    ports: Vec<u16>,
    topo: HaTopology,
}

/// With `unreachable`, every replica publishes a Redis proxy address nobody listens on.
async fn start(replicas: usize, agents: &[&'static str], unreachable: bool) -> Setup {
    let dir = tempfile::Builder::new()
        .prefix("argocd-agent-ha-redis")
        .tempdir()
        .unwrap();
    let hub_redis = RedisServer::start_with_password(dir.path(), "redis-hub", HUB_PASSWORD)
        .await
        .unwrap();
    let mut spoke_redis = BTreeMap::new();
    for agent in agents {
        spoke_redis.insert(
            *agent,
            RedisServer::start(dir.path(), &format!("redis-{agent}"))
                .await
                .unwrap(),
        );
    }
    let ports: Vec<u16> = (0..replicas)
        .map(|_| free_loopback_port().unwrap())
        .collect();
    let per_replica_args = ports
        .iter()
        .map(|p| {
            let mut args = vec!["--redis-proxy-address".into(), format!("127.0.0.1:{p}")];
            if unreachable {
                args.extend([
                    "--redis-proxy-replica-address".into(),
                    format!("127.0.0.1:{}", free_loopback_port().unwrap()),
                ]);
            }
            args
        })
        .collect();
    let topo = HaTopology::start(HaOptions {
        replicas,
        agents: agents.iter().map(|a| (a.to_string(), "managed")).collect(),
        principal_args: vec![
            "--replica-lease-duration".into(),
            "3s".into(),
            "--redis-server-address".into(),
            hub_redis.addr(),
            "--redis-password".into(),
            HUB_PASSWORD.into(),
            "--redis-proxy-request-timeout".into(),
            "5s".into(),
        ],
        per_replica_args,
        per_agent_args: agents
            .iter()
            .map(|a| {
                (
                    a.to_string(),
                    vec!["--redis-addr".into(), spoke_redis[a].addr()],
                )
            })
            .collect(),
        dir: std::env::var_os("E2E_DIR").map(PathBuf::from),
    })
    .await
    .unwrap();
    Setup {
        _dir: dir,
        _hub_redis: hub_redis,
        spoke_redis,
        ports,
        topo,
    }
}

/// Runs a scenario; on failure, panics with the processes' logs.
async fn finish(setup: Setup, result: Result<(), String>) {
    let topo = setup.topo;
    if let Err(e) = result {
        let logs = topo.logs();
        topo.stop().await;
        panic!("{e}\n{logs}");
    }
    topo.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_replica_redis_proxy_answers_for_every_agent() {
    let setup = start(REPLICAS, &AGENTS, false).await;
    let result = scenario(&setup.topo, &setup.ports, &setup.spoke_redis).await;
    finish(setup, result).await;
}

/// Waits for every agent's session, creates Application `web` for each and seeds its
/// spoke's Redis with the tree key; returns the serving replica of each agent.
async fn prepare(
    topo: &HaTopology,
    agents: &[&'static str],
    spoke_redis: &BTreeMap<&'static str, RedisServer>,
) -> Result<BTreeMap<String, String>, String> {
    let deadline = Instant::now() + T;
    let holders = loop {
        let h = topo.holders().await.unwrap_or_default();
        if agents.iter().all(|a| h.contains_key(*a)) {
            break h;
        }
        if Instant::now() > deadline {
            return Err(format!("agents without a session: {h:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("holders: {holders:?}");
    for agent in agents {
        apps(&topo.hub, agent)
            .map_err(|e| e.to_string())?
            .create(
                &PostParams::default(),
                &sample_app("web", agent, "guestbook"),
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    for agent in agents {
        eventually("the Application on its spoke", T, || async {
            stored_app(&topo.spokes[*agent], SPOKE_NS, "web")
        })
        .await
        .map_err(|e| format!("{agent}: {e}"))?;
        // The spoke's Argo CD writes the key under the bare name.
        let mut spoke = conn(spoke_redis[agent].addr()).await?;
        let key = format!("app|resources-tree|web{SUFFIX}");
        let r = spoke
            .command(&[b"SET", key.as_bytes(), &tree(agent)])
            .await
            .map_err(|e| e.to_string())?;
        assert!(!r.is_error(), "SET on the spoke: {r:?}");
    }
    Ok(holders)
}

async fn scenario(
    topo: &HaTopology,
    ports: &[u16],
    spoke_redis: &BTreeMap<&'static str, RedisServer>,
) -> Result<(), String> {
    let holders = prepare(topo, &AGENTS, spoke_redis).await?;

    // 1. GET of each agent's tree key through every replica: the spoke's bytes.
    for agent in AGENTS {
        let key = format!("app|resources-tree|{agent}_web{SUFFIX}");
        for (i, port) in ports.iter().enumerate() {
            let via = format!(
                "{agent} via {} (serving: {})",
                topo.replicas[i].name, holders[agent]
            );
            // The first GET may come before the replica Leases are seen everywhere.
            let deadline = Instant::now() + T;
            let mut c = proxy(*port).await?;
            loop {
                match get(&mut c, &key).await {
                    Ok(Some(v)) if v == tree(agent) => break,
                    other => {
                        if Instant::now() > deadline {
                            return Err(format!("GET {key} {via}: {other:?}"));
                        }
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                }
            }
            // Again on the same connection (the forwarding connection is reused).
            let again = get(&mut c, &key).await;
            if again != Ok(Some(tree(agent))) {
                return Err(format!("second GET {key} {via}: {again:?}"));
            }
            eprintln!("GET ok: {via}");
        }
    }

    // 2. A forwarded connection is answered locally, never forwarded again: a replica that
    // does not serve the agent does not return its value.
    for agent in AGENTS {
        let serving = &holders[agent];
        let other = (0..REPLICAS)
            .find(|i| &topo.replicas[*i].name != serving)
            .unwrap();
        let mut c = proxy(ports[other]).await?;
        let ok = c
            .command(&[b"CLIENT", b"SETNAME", b"argocd-agent-forwarded"])
            .await
            .map_err(|e| e.to_string())?;
        assert!(!ok.is_error(), "CLIENT SETNAME: {ok:?}");
        let key = format!("app|resources-tree|{agent}_web{SUFFIX}");
        match get(&mut c, &key).await {
            // Nil when it never served the agent, "not connected" when it did once.
            Ok(None) => {}
            Err(e) if e.contains("not connected") => {}
            got => {
                return Err(format!(
                    "marked GET of {agent} on non-serving {}: {got:?}",
                    topo.replicas[other].name
                ));
            }
        }
    }

    // 3. SUBSCRIBE through a replica that does not serve the agent: the spoke's messages.
    for agent in AGENTS {
        let serving = &holders[agent];
        let other = (0..REPLICAS)
            .rev()
            .find(|i| &topo.replicas[*i].name != serving)
            .unwrap();
        let channel = format!("app|managed-resources|{agent}_web|1.8.3");
        let mut sub = proxy(ports[other]).await?;
        let confirm = sub
            .command(&[b"SUBSCRIBE", channel.as_bytes()])
            .await
            .map_err(|e| e.to_string())?;
        if confirm.is_error() {
            return Err(format!("SUBSCRIBE {channel}: {confirm:?}"));
        }
        // Publish on the spoke until the agent's subscription is there.
        let spoke_channel = "app|managed-resources|web|1.8.3";
        let spoke = &spoke_redis[agent];
        eventually("the agent subscribed on the spoke's Redis", T, || async {
            let mut c = conn(spoke.addr()).await.ok()?;
            let n = c
                .command(&[b"PUBLISH", spoke_channel.as_bytes(), b"changed"])
                .await
                .ok()?;
            match n.value {
                Value::V2(Frame2::Integer(n)) if n > 0 => Some(()),
                _ => None,
            }
        })
        .await
        .map_err(|e| format!("{agent}: {e}"))?;
        let message = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .map_err(|_| format!("{agent}: no message through the non-serving replica"))?
            .map_err(|e| e.to_string())?;
        match message.clone().into_message() {
            Some(p) if p.as_ref() == b"changed" => {}
            _ => return Err(format!("{agent}: unexpected frame {message:?}")),
        }
        // UNSUBSCRIBE is confirmed (after any queued messages).
        sub.send(&[b"UNSUBSCRIBE", channel.as_bytes()])
            .await
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let f = tokio::time::timeout(Duration::from_secs(10), sub.next())
                .await
                .map_err(|_| format!("{agent}: no UNSUBSCRIBE confirmation"))?
                .map_err(|e| e.to_string())?;
            if f.clone().into_message().is_none() {
                let text = format!("{f:?}");
                assert!(text.contains("unsubscribe"), "{agent}: {text}");
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{agent}: no UNSUBSCRIBE confirmation"));
            }
        }
        eprintln!("SUBSCRIBE ok: {agent} via {}", topo.replicas[other].name);
    }

    // 4. The forwarding replicas counted what they forwarded.
    for r in &topo.replicas {
        if holders.values().all(|h| h == &r.name) {
            continue;
        }
        let n = metric_sum(r.metrics_port, &replica_metric("forwarded")).await;
        if n < 1.0 {
            return Err(format!("{}: {} = {n}", r.name, replica_metric("forwarded")));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_replica_is_answered_as_an_offline_agent() {
    const AGENT: &str = "agent-hr-u";
    let setup = start(2, &[AGENT], true).await;
    let result = unreachable_scenario(&setup).await;
    finish(setup, result).await;
}

async fn unreachable_scenario(setup: &Setup) -> Result<(), String> {
    let agent = "agent-hr-u";
    let topo = &setup.topo;
    let holders = prepare(topo, &[agent], &setup.spoke_redis).await?;
    let serving = topo
        .replicas
        .iter()
        .position(|r| r.name == holders[agent])
        .unwrap();
    let other = 1 - serving;
    let key = format!("app|resources-tree|{agent}_web{SUFFIX}");
    // The serving replica answers itself.
    let port = setup.ports[serving];
    eventually("GET through the serving replica", T, || {
        let key = key.clone();
        async move {
            let mut c = proxy(port).await.ok()?;
            (get(&mut c, &key).await == Ok(Some(tree(agent)))).then_some(())
        }
    })
    .await
    .map_err(|e| e.to_string())?;
    // The other one cannot reach it: "not connected", as for an offline agent.
    let mut c = proxy(setup.ports[other]).await?;
    let deadline = Instant::now() + T;
    loop {
        match get(&mut c, &key).await {
            Err(e) if e.contains("not connected") => break,
            got => {
                if Instant::now() > deadline {
                    return Err(format!("GET through the non-serving replica: {got:?}"));
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    let mut sub = proxy(setup.ports[other]).await?;
    let channel = format!("app|managed-resources|{agent}_web|1.8.3");
    let reply = sub
        .command(&[b"SUBSCRIBE", channel.as_bytes()])
        .await
        .map_err(|e| e.to_string())?;
    let text = format!("{reply:?}");
    if !reply.is_error() || !text.contains("not connected") {
        return Err(format!("SUBSCRIBE through the non-serving replica: {text}"));
    }
    let errors = metric_sum(topo.replicas[other].metrics_port, &replica_metric("error")).await;
    if errors < 2.0 {
        return Err(format!("{} = {errors}", replica_metric("error")));
    }
    let logs = std::fs::read_to_string(topo.dir.join(format!("{}.log", topo.replicas[other].name)))
        .unwrap_or_default();
    if !logs.contains("could not forward to the replica serving the agent") {
        return Err("no warning about the unreachable replica".into());
    }
    Ok(())
}
