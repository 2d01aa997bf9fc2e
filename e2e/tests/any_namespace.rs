//! Applications in any namespace on a spoke, with the real binaries: `--allowed-namespaces`
//! and `--create-namespace` on managed agents with destination-based mapping, and an
//! autonomous agent publishing the Applications of several namespaces into its one hub
//! namespace as `<namespace>.<name>`.

use std::time::Duration;

use argocd_agent_kube_test_server::KubeTestServer;
use argocd_agent_testkit::harness::*;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(25);
const REFUSED: &str = "argocd_agent_applications_refused_total";

fn refused(reason: &str) -> String {
    format!("{REFUSED}{{reason=\"{reason}\"}}")
}

fn path_of(app: &Value) -> &str {
    app["spec"]["source"]["path"].as_str().unwrap_or_default()
}

/// Waits `d`, then fails if `what` holds.
async fn never(what: &str, d: Duration, f: impl Fn() -> bool) -> Result<(), HarnessError> {
    let deadline = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < deadline {
        if f() {
            return Err(format!("unexpected: {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

fn namespace_exists(server: &KubeTestServer, ns: &str) -> bool {
    server
        .get_object("", "v1", "namespaces", None, ns)
        .is_some()
}

/// Managed agents with destination-based mapping: copies go only into allowed namespaces;
/// a namespace not allowed is refused (metric, log, nothing written); `--create-namespace`
/// creates a missing namespace, and without it the agent says the namespace is missing
/// until it exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_destination_mapping_writes_only_into_allowed_namespaces() {
    let mapping = || "--destination-based-mapping".to_string();
    let topo = Topology::start(TopologyOptions {
        principal_args: vec![mapping()],
        agent_args: vec![mapping(), "--allowed-namespaces".into(), "team-*".into()],
        // The first agent creates namespaces, the second (also managed) does not.
        per_agent_args: vec![(MANAGED, vec!["--create-namespace".into()])],
        second_agent_mode: Some("managed"),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = managed(&topo).await;
    topo.finish(r).await;
}

async fn hub_app(
    topo: &Topology,
    ns: &str,
    name: &str,
    agent: &str,
) -> Result<kube::Api<kube::api::DynamicObject>, HarnessError> {
    create_namespace(&topo.hub, ns).await?;
    let api = apps(&topo.hub, ns)?;
    let mut app = sample_app(name, ns, name);
    app.data["spec"]["destination"] = json!({"name": agent, "namespace": name});
    api.create(&PostParams::default(), &app).await?;
    Ok(api)
}

async fn managed(topo: &Topology) -> Result<(), HarnessError> {
    let (first, second) = (&topo.managed_spoke, &topo.autonomous_spoke);
    let first_port = topo.metrics_ports[MANAGED];
    let second_port = topo.metrics_ports[AUTONOMOUS];

    // An allowed namespace that exists on the spoke: the copy is written, status flows back.
    create_namespace(first, "team-a").await?;
    hub_app(topo, "team-a", "web", MANAGED).await?;
    eventually("copy in an allowed namespace", T, || async {
        stored_app(first, "team-a", "web")
    })
    .await?;
    set_status(
        &apps(first, "team-a")?,
        "web",
        json!({"health": {"status": "Healthy"}}),
    )
    .await?;
    eventually("status of the copy reaches the hub", T, || async {
        stored_app(&topo.hub, "team-a", "web")
            .filter(|a| a["status"]["health"]["status"] == "Healthy")
    })
    .await?;

    // A namespace not allowed (it exists on the spoke): refused, counted, logged, not written.
    create_namespace(first, "prod").await?;
    let prod = hub_app(topo, "prod", "api", MANAGED).await?;
    eventually("refusal counted", T, || async {
        (metric_sum(first_port, &refused("namespace_not_permitted")).await >= 1.0).then_some(())
    })
    .await?;
    let log = topo.managed.as_ref().ok_or("no agent")?.log();
    assert!(
        log.contains("namespace prod is not permitted")
            && log.contains("--allowed-namespaces (team-*)"),
        "agent log does not name the refused namespace and the flag"
    );
    never(
        "copy in a namespace not allowed",
        Duration::from_secs(2),
        || stored_app(first, "prod", "api").is_some(),
    )
    .await?;
    // Its deletion on the hub is not held up by the agent (nothing is held there).
    prod.delete("api", &DeleteParams::default()).await?;
    eventually(
        "hub application in a refused namespace deleted",
        T,
        || async { stored_app(&topo.hub, "prod", "api").is_none().then_some(()) },
    )
    .await?;

    // --create-namespace: a missing allowed namespace is created, then the copy written.
    assert!(!namespace_exists(first, "team-new"));
    hub_app(topo, "team-new", "db", MANAGED).await?;
    eventually("namespace created and copy written", T, || async {
        stored_app(first, "team-new", "db")
    })
    .await?;
    assert!(namespace_exists(first, "team-new"));

    // Without it: a clear error until the namespace exists, then the copy arrives.
    hub_app(topo, "team-missing", "cache", AUTONOMOUS).await?;
    eventually("missing namespace counted", T, || async {
        (metric_sum(second_port, &refused("namespace_missing")).await >= 1.0).then_some(())
    })
    .await?;
    let log = topo.autonomous.as_ref().ok_or("no agent")?.log();
    assert!(
        log.contains("namespace team-missing does not exist on this cluster")
            && log.contains("--create-namespace"),
        "agent log does not say which namespace is missing and how to fix it"
    );
    assert!(!namespace_exists(second, "team-missing"));
    assert!(stored_app(second, "team-missing", "cache").is_none());
    create_namespace(second, "team-missing").await?;
    eventually(
        "copy written once the namespace exists (the principal resends)",
        Duration::from_secs(60),
        || async { stored_app(second, "team-missing", "cache") },
    )
    .await?;
    Ok(())
}

/// The agent refuses `--create-namespace` without destination-based mapping, and an
/// `--allowed-namespaces` pattern that does not compile, at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_refuses_bad_namespace_settings_at_start() {
    let bin = binary("argocd-agent").unwrap();
    let base = [
        "agent",
        "--server-address",
        "127.0.0.1",
        "--server-port",
        "1",
        "--creds",
        "header:",
        "--metrics-port",
        "0",
    ];
    for (extra, expected) in [
        (
            vec!["--create-namespace"],
            "--create-namespace needs --destination-based-mapping",
        ),
        (
            vec!["--allowed-namespaces", "team-*,/(/"],
            "--allowed-namespaces: pattern \"/(/\"",
        ),
    ] {
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::process::Command::new(&bin)
                .args(base.iter().chain(extra.iter()))
                .env("KUBECONFIG", "/nonexistent")
                .output(),
        )
        .await
        .expect("the agent exits at once")
        .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{extra:?}: {text}");
        assert!(text.contains(expected), "{extra:?}: {text}");
    }
}

/// An autonomous agent with `--allowed-namespaces`: Applications of the allowed namespaces
/// reach the hub as `<namespace>.<name>` (the Argo CD namespace's keep their name), status
/// flows, operations and refreshes on a hub name reach the right spoke Application, a
/// deletion removes the hub copy, a namespace not allowed never reaches the hub, and a
/// name collision is refused without overwriting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autonomous_agent_publishes_applications_of_allowed_namespaces() {
    let mut topo = Topology::start(TopologyOptions {
        agents: Some(vec![AUTONOMOUS]),
        agent_args: vec!["--allowed-namespaces".into(), "team-*,/^ops$/".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = autonomous(&mut topo).await;
    topo.finish(r).await;
}

async fn autonomous(topo: &mut Topology) -> Result<(), HarnessError> {
    let spoke = &topo.autonomous_spoke;
    let hub = apps(&topo.hub, AUTONOMOUS)?;
    let stored = |name: &str| stored_app(&topo.hub, AUTONOMOUS, name);
    for ns in ["team-a", "team-b", "ops", "prod"] {
        create_namespace(spoke, ns).await?;
    }
    let create = |ns: &'static str, name: &'static str, path: &'static str| async move {
        apps(spoke, ns)?
            .create(&PostParams::default(), &sample_app(name, ns, path))
            .await?;
        Ok::<(), HarnessError>(())
    };
    create(SPOKE_NS, "root", "root").await?;
    create("team-a", "web", "web-a").await?;
    create("team-b", "web", "web-b").await?;
    create("ops", "tools", "tools").await?;
    create("prod", "secret", "secret").await?;
    for (hub_name, path) in [
        ("root", "root"),
        ("team-a.web", "web-a"),
        ("team-b.web", "web-b"),
        ("ops.tools", "tools"),
    ] {
        eventually(&format!("{hub_name} on the hub"), T, || async {
            stored(hub_name).filter(|a| path_of(a) == path)
        })
        .await?;
    }
    never(
        "an application of a namespace not allowed on the hub",
        Duration::from_secs(2),
        || stored("prod.secret").is_some() || stored("secret").is_some(),
    )
    .await?;

    // Status of team-a/web reaches team-a.web only.
    set_status(
        &apps(spoke, "team-a")?,
        "web",
        json!({"health": {"status": "Degraded"}}),
    )
    .await?;
    eventually("status reaches the hub name", T, || async {
        stored("team-a.web").filter(|a| a["status"]["health"]["status"] == "Degraded")
    })
    .await?;
    assert_ne!(
        stored("team-b.web").unwrap_or_default()["status"]["health"]["status"],
        "Degraded"
    );

    // A sync requested on team-b.web reaches team-b/web, not team-a/web.
    let op = json!({"sync": {"revision": "v9"}, "initiatedBy": {"username": "admin"}});
    merge_patch(&hub, "team-b.web", json!({"operation": op})).await?;
    eventually("operation reaches team-b/web", T, || async {
        stored_app(spoke, "team-b", "web").filter(|a| a["operation"]["sync"]["revision"] == "v9")
    })
    .await?;
    assert!(stored_app(spoke, "team-a", "web").unwrap_or_default()["operation"].is_null());

    // A refresh requested on ops.tools reaches ops/tools.
    merge_patch(
        &hub,
        "ops.tools",
        json!({"metadata": {"annotations": {"argocd.argoproj.io/refresh": "hard"}}}),
    )
    .await?;
    eventually("refresh reaches ops/tools", T, || async {
        stored_app(spoke, "ops", "tools")
            .filter(|a| a["metadata"]["annotations"]["argocd.argoproj.io/refresh"] == "hard")
    })
    .await?;

    collision(topo).await?;
    deletion_and_resync(topo).await
}

/// `team-b.api` in the Argo CD namespace and `api` in `team-b` both have the hub name
/// `team-b.api`: the Argo CD namespace's keeps it, the other is refused and never
/// overwrites it; once the first is gone, the name passes to the second.
async fn collision(topo: &Topology) -> Result<(), HarnessError> {
    let spoke = &topo.autonomous_spoke;
    let port = topo.metrics_ports[AUTONOMOUS];
    let stored = |name: &str| stored_app(&topo.hub, AUTONOMOUS, name);
    let argocd_apps = apps(spoke, SPOKE_NS)?;
    argocd_apps
        .create(
            &PostParams::default(),
            &sample_app("team-b.api", SPOKE_NS, "winner"),
        )
        .await?;
    eventually(
        "the Argo CD namespace's team-b.api on the hub",
        T,
        || async { stored("team-b.api").filter(|a| path_of(a) == "winner") },
    )
    .await?;
    let before = metric_sum(port, &refused("name_collision")).await;
    let team_b = apps(spoke, "team-b")?;
    team_b
        .create(
            &PostParams::default(),
            &sample_app("api", "team-b", "loser"),
        )
        .await?;
    merge_patch(
        &team_b,
        "api",
        json!({"spec": {"source": {"targetRevision": "v2"}}}),
    )
    .await?;
    eventually("collision counted", T, || async {
        (metric_sum(port, &refused("name_collision")).await > before).then_some(())
    })
    .await?;
    never(
        "the colliding application overwrote the hub copy",
        Duration::from_secs(2),
        || stored("team-b.api").is_none_or(|a| path_of(&a) != "winner"),
    )
    .await?;
    let log = topo.autonomous.as_ref().ok_or("no agent")?.log();
    assert!(
        log.contains("application not published"),
        "no warning logged"
    );

    // The Argo CD namespace's application goes: the name passes to team-b/api.
    argocd_apps
        .delete("team-b.api", &DeleteParams::default())
        .await?;
    eventually("team-b/api published once the name is free", T, || async {
        stored("team-b.api").filter(|a| path_of(a) == "loser")
    })
    .await?;
    Ok(())
}

/// A deletion on the spoke removes the hub copy of that hub name only; a deletion made
/// while the agent was down is found by resync (hello checksums keyed by hub name).
async fn deletion_and_resync(topo: &mut Topology) -> Result<(), HarnessError> {
    let stored = |topo: &Topology, name: &str| stored_app(&topo.hub, AUTONOMOUS, name);
    apps(&topo.autonomous_spoke, "team-a")?
        .delete("web", &DeleteParams::default())
        .await?;
    eventually("team-a.web removed from the hub", T, || async {
        stored(topo, "team-a.web").is_none().then_some(())
    })
    .await?;
    assert!(stored(topo, "team-b.web").is_some(), "team-b.web went too");

    let agent = topo.autonomous.as_mut().ok_or("no agent")?;
    agent.stop().await;
    apps(&topo.autonomous_spoke, "team-b")?
        .delete("web", &DeleteParams::default())
        .await?;
    merge_patch(
        &apps(&topo.autonomous_spoke, "ops")?,
        "tools",
        json!({"spec": {"source": {"targetRevision": "offline"}}}),
    )
    .await?;
    let before = topo.connect_count(AUTONOMOUS);
    topo.autonomous.as_mut().ok_or("no agent")?.start()?;
    eventually("agent reconnected", T, || async {
        (topo.connect_count(AUTONOMOUS) > before).then_some(())
    })
    .await?;
    eventually(
        "resync removes team-b.web and updates ops.tools",
        T,
        || async {
            let gone = stored(topo, "team-b.web").is_none();
            let updated = target_revision(stored(topo, "ops.tools")).as_deref() == Some("offline");
            (gone && updated).then_some(())
        },
    )
    .await?;
    for name in ["root", "team-b.api"] {
        assert!(stored(topo, name).is_some(), "{name} lost in the resync");
    }
    Ok(())
}

/// The Redis proxy follows the hub names: argocd-server's key for the hub copy
/// `team-a.web` is served from the spoke's key of Argo CD's instance `team-a_web` (its name
/// for `web` in `team-a`), never from a key spelled with the hub name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_proxy_serves_a_hub_name_from_the_spokes_instance_name() {
    use argocd_agent_redis::RedisEndpoint;
    use argocd_agent_testkit::redis::{RedisServer, redis_cli, redis_cli_bin};
    redis_cli_bin().unwrap();
    let dir = tempfile::Builder::new()
        .prefix("argocd-agent-anyns-redis")
        .tempdir()
        .unwrap();
    let hub_redis = RedisServer::start(dir.path(), "redis-hub").await.unwrap();
    let spoke_redis = RedisServer::start(dir.path(), "redis-spoke").await.unwrap();
    let proxy_port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let topo = Topology::start(TopologyOptions {
        dir: Some(dir.path().join("topology")),
        agents: Some(vec![AUTONOMOUS]),
        principal_args: vec![
            "--redis-proxy-address".into(),
            format!("127.0.0.1:{proxy_port}"),
            "--redis-server-address".into(),
            hub_redis.addr(),
        ],
        agent_args: vec![
            "--allowed-namespaces".into(),
            "team-*".into(),
            "--redis-addr".into(),
            spoke_redis.addr(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        create_namespace(&topo.autonomous_spoke, "team-a").await?;
        apps(&topo.autonomous_spoke, "team-a")?
            .create(&PostParams::default(), &sample_app("web", "team-a", "web"))
            .await?;
        eventually("team-a.web on the hub", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, "team-a.web")
        })
        .await?;
        let mut conn = RedisEndpoint {
            addr: spoke_redis.addr(),
            ..Default::default()
        }
        .connect(1 << 20)
        .await?;
        for (key, value) in [
            ("app|resources-tree|team-a_web|1.8.3", "web-tree"),
            // A key spelled with the hub name is no key of the spoke's Argo CD.
            ("app|resources-tree|team-a.web|1.8.3", "WRONG"),
        ] {
            conn.command(&[b"SET", key.as_bytes(), value.as_bytes()])
                .await?;
        }
        let key = format!("app|resources-tree|{AUTONOMOUS}_team-a.web|1.8.3");
        let out = redis_cli(proxy_port, &[b"GET", key.as_bytes()]).await?;
        let got = String::from_utf8_lossy(&out.stdout).trim_end().to_owned();
        if got != "web-tree" {
            return Err(format!("GET {key} through the proxy gave {got:?}").into());
        }
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
