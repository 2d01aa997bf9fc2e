//! The principal's Redis proxy end to end, with real Redis servers (one for the hub, one per
//! spoke), the real principal and two real agents: `redis-cli` and raw RESP clients talk to
//! the proxy as argocd-server would.
//!
//! Needs `redis-server` and `redis-cli` (Debian package `redis-server`, installed by
//! `.ci/run`); without them the test fails with a message saying how to install them.

use std::time::{Duration, Instant};

use argocd_agent_redis::clusterinfo::{self, Compression};
use argocd_agent_redis::resp::Value;
use argocd_agent_redis::{Protocol, RedisConn, RedisEndpoint};
use argocd_agent_testkit::harness::*;
use argocd_agent_testkit::redis::{RedisServer, RespClient, redis_cli, redis_cli_bin};
use kube::api::PostParams;
use tokio::io::{AsyncBufReadExt, BufReader};

const T: Duration = Duration::from_secs(30);
/// Argo CD's cache version suffix and compression, as argocd-server reads keys.
const SUFFIX: &str = "|1.8.3.gz";
/// Bytes that are not UTF-8 (a gzip header), to check values pass unchanged.
const TREE: &[u8] = b"\x1f\x8b\x08\x00guestbook-tree\xff\x00\r\n";

async fn conn(server: &RedisServer) -> RedisConn {
    RedisEndpoint {
        addr: server.addr(),
        ..Default::default()
    }
    .connect(1 << 20)
    .await
    .unwrap()
}

async fn set(server: &RedisServer, key: &str, value: &[u8]) {
    let reply = conn(server)
        .await
        .command(&[b"SET", key.as_bytes(), value])
        .await
        .unwrap();
    assert!(!reply.is_error(), "SET {key}: {reply:?}");
}

/// What `redis-cli` prints for a reply (raw mode: the value and a newline).
async fn cli_get(port: u16, extra: &[&str], key: &str) -> (String, Vec<u8>, Duration) {
    let started = Instant::now();
    let mut args: Vec<&[u8]> = extra.iter().map(|a| a.as_bytes()).collect();
    args.push(b"GET");
    args.push(key.as_bytes());
    let out = redis_cli(port, &args).await.unwrap();
    (
        String::from_utf8_lossy(&out.stdout).trim_end().to_owned(),
        out.stdout,
        started.elapsed(),
    )
}

fn cmd(args: &[&[u8]]) -> Vec<u8> {
    argocd_agent_redis::resp::command(args).to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_proxy_routes_application_keys_to_the_owning_agent() {
    redis_cli_bin().unwrap();
    let dir = tempfile::Builder::new()
        .prefix("argocd-agent-redis")
        .tempdir()
        .unwrap();
    let hub_redis = RedisServer::start(dir.path(), "redis-hub").await.unwrap();
    let managed_redis = RedisServer::start(dir.path(), "redis-managed")
        .await
        .unwrap();
    let autonomous_redis = RedisServer::start(dir.path(), "redis-autonomous")
        .await
        .unwrap();
    let proxy_port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let mut topo = Topology::start(TopologyOptions {
        dir: Some(dir.path().join("topology")),
        principal_args: vec![
            "--redis-proxy-address".into(),
            format!("127.0.0.1:{proxy_port}"),
            "--redis-server-address".into(),
            hub_redis.addr(),
            "--redis-proxy-request-timeout".into(),
            "5s".into(),
        ],
        agent_args: vec!["--cache-refresh-interval".into(), "1s".into()],
        per_agent_args: vec![
            (MANAGED, vec!["--redis-addr".into(), managed_redis.addr()]),
            (
                AUTONOMOUS,
                vec!["--redis-addr".into(), autonomous_redis.addr()],
            ),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        // A managed Application (hub -> managed spoke) and an autonomous one (autonomous
        // spoke -> hub).
        let pp = PostParams::default();
        apps(&topo.hub, MANAGED)?
            .create(&pp, &sample_app("guestbook", MANAGED, "guestbook"))
            .await?;
        apps(&topo.autonomous_spoke, SPOKE_NS)?
            .create(&pp, &sample_app("edge", SPOKE_NS, "edge"))
            .await?;
        eventually("guestbook on the managed spoke", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
        })
        .await?;
        eventually("edge on the hub", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, "edge")
        })
        .await?;

        // Each spoke's Argo CD writes keys with its own instance names (Applications in
        // Argo CD's namespace: the bare name).
        set(
            &managed_redis,
            &format!("app|resources-tree|guestbook{SUFFIX}"),
            TREE,
        )
        .await;
        set(
            &autonomous_redis,
            "app|resources-tree|edge|1.8.3",
            b"edge-tree",
        )
        .await;
        // Traps: the same names in the wrong places must never be served.
        set(
            &autonomous_redis,
            &format!("app|resources-tree|guestbook{SUFFIX}"),
            b"WRONG-agent",
        )
        .await;
        set(
            &hub_redis,
            &format!("app|resources-tree|{MANAGED}_guestbook{SUFFIX}"),
            b"WRONG-hub",
        )
        .await;
        set(&hub_redis, "plain-key", b"hub-value").await;

        let tree_key = format!("app|resources-tree|{MANAGED}_guestbook{SUFFIX}");
        // 1. GET through the proxy returns the managed spoke's bytes, unchanged.
        let (_, raw, _) = cli_get(proxy_port, &[], &tree_key).await;
        assert_eq!(&raw[..raw.len() - 1], TREE, "redis-cli GET of the tree key");
        let (edge, _, _) = cli_get(
            proxy_port,
            &[],
            &format!("app|resources-tree|{AUTONOMOUS}_edge|1.8.3"),
        )
        .await;
        assert_eq!(
            edge, "edge-tree",
            "autonomous agent's key from its own Redis"
        );

        // 1b. A resource tree names the Applications a parent created by their namespace on
        // the spoke; served through the proxy, they point where the hub has them (the
        // agent's hub namespace), and nothing else in the tree changes (gzip as Argo CD
        // writes it with redis compression on, plain JSON without).
        let spoke_tree = serde_json::json!({
            "nodes": [
                {"group": "argoproj.io", "version": "v1alpha1", "kind": "Application",
                 "namespace": SPOKE_NS, "name": "child", "uid": "u1",
                 "parentRefs": [{"group": "argoproj.io", "kind": "Application", "namespace": SPOKE_NS, "name": "guestbook"}]},
                {"group": "apps", "version": "v1", "kind": "Deployment",
                 "namespace": "guestbook", "name": "web", "uid": "u2",
                 "parentRefs": [{"group": "argoproj.io", "kind": "Application", "namespace": SPOKE_NS, "name": "child"}]},
            ],
            "hosts": [],
        });
        for (suffix, compression) in [("|1.8.3.gz", Compression::Gzip), ("|1.8.3", Compression::None)] {
            set(
                &managed_redis,
                &format!("app|resources-tree|guestbook{suffix}"),
                &clusterinfo::encode(&spoke_tree, compression),
            )
            .await;
            let mut c = RedisEndpoint {
                addr: format!("127.0.0.1:{proxy_port}"),
                ..Default::default()
            }
            .connect(1 << 20)
            .await?;
            let key = format!("app|resources-tree|{MANAGED}_guestbook{suffix}");
            let got = c.command(&[b"GET", key.as_bytes()]).await?.into_value()?.ok_or("nil tree")?;
            let tree = clusterinfo::decode(&got, compression).ok_or("tree does not decode")?;
            let nodes = tree["nodes"].as_array().ok_or("no nodes")?;
            assert_eq!(nodes[0]["namespace"], MANAGED, "{tree}");
            assert_eq!(nodes[0]["name"], "child", "{tree}");
            assert_eq!(nodes[0]["parentRefs"][0]["namespace"], MANAGED, "{tree}");
            assert_eq!(nodes[1]["namespace"], "guestbook", "a Deployment keeps its namespace: {tree}");
            assert_eq!(nodes[1]["parentRefs"][0]["namespace"], MANAGED, "{tree}");
            assert_eq!(nodes[1]["uid"], "u2", "{tree}");
        }
        // The steps below read the raw bytes again.
        set(
            &managed_redis,
            &format!("app|resources-tree|guestbook{SUFFIX}"),
            TREE,
        )
        .await;

        // 2. Ownership: an Application that does not exist in a namespace is a cache miss,
        // never another agent's value; unknown Applications too.
        let (miss, _, _) = cli_get(
            proxy_port,
            &[],
            &format!("app|resources-tree|{AUTONOMOUS}_guestbook{SUFFIX}"),
        )
        .await;
        assert_eq!(miss, "", "guestbook is not the autonomous agent's: nil");
        let (miss, _, _) = cli_get(
            proxy_port,
            &[],
            &format!("app|managed-resources|{MANAGED}_nope"),
        )
        .await;
        assert_eq!(miss, "");

        // 3. Everything else reaches the hub Redis, writes included.
        let (plain, _, _) = cli_get(proxy_port, &[], "plain-key").await;
        assert_eq!(plain, "hub-value");
        let out = redis_cli(proxy_port, &[b"SET", b"via-proxy", b"1"]).await?;
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
        let v = conn(&hub_redis)
            .await
            .command(&[b"GET", b"via-proxy"])
            .await?;
        assert_eq!(v.into_value().unwrap().as_deref(), Some(&b"1"[..]));

        // 4. RESP3: redis-cli -3, and a raw HELLO 3 client pipelining hub and agent commands.
        let (v3, raw3, _) = cli_get(proxy_port, &["-3"], &tree_key).await;
        assert_eq!(&raw3[..raw3.len() - 1], TREE, "RESP3 GET ({v3})");
        let mut raw = RespClient::connect(proxy_port).await;
        let mut pipeline = cmd(&[b"HELLO", b"3"]);
        pipeline.extend(cmd(&[b"GET", tree_key.as_bytes()]));
        pipeline.extend(cmd(&[b"GET", b"plain-key"]));
        pipeline.extend(cmd(&[
            b"GET",
            format!("app|managed-resources|{MANAGED}_nope").as_bytes(),
        ]));
        pipeline.extend(cmd(&[b"PING"]));
        raw.send(&pipeline).await?;
        let hello = raw.frame(Protocol::Resp3).await;
        assert!(
            matches!(hello.value, Value::V3(_)) && !hello.is_error(),
            "{hello:?}"
        );
        assert_eq!(
            raw.frame(Protocol::Resp3)
                .await
                .into_value()
                .unwrap()
                .as_deref(),
            Some(TREE)
        );
        assert_eq!(
            raw.frame(Protocol::Resp3)
                .await
                .into_value()
                .unwrap()
                .as_deref(),
            Some(&b"hub-value"[..])
        );
        assert_eq!(
            &raw.frame(Protocol::Resp3).await.raw[..],
            b"_\r\n",
            "RESP3 null"
        );
        assert_eq!(&raw.frame(Protocol::Resp3).await.raw[..], b"+PONG\r\n");

        // 5. RESP2 pipelining: replies in command order, agent and hub interleaved.
        let mut raw = RespClient::connect(proxy_port).await;
        let mut pipeline = Vec::new();
        for _ in 0..20 {
            pipeline.extend(cmd(&[b"GET", tree_key.as_bytes()]));
            pipeline.extend(cmd(&[b"GET", b"plain-key"]));
        }
        raw.send(&pipeline).await?;
        for _ in 0..20 {
            assert_eq!(
                raw.frame(Protocol::Resp2)
                    .await
                    .into_value()
                    .unwrap()
                    .as_deref(),
                Some(TREE)
            );
            assert_eq!(
                raw.frame(Protocol::Resp2)
                    .await
                    .into_value()
                    .unwrap()
                    .as_deref(),
                Some(&b"hub-value"[..])
            );
        }
        // A malformed frame gets a RESP error, not a hang or a crash.
        let mut bad = RespClient::connect(proxy_port).await;
        bad.send(b"*2\r\n$3\r\nGET\r\n$x\r\n").await?;
        assert!(bad.frame(Protocol::Resp2).await.is_error());

        // 6. SUBSCRIBE: argocd-server subscribes to managed-resources; the spoke's Argo CD
        // publishes on its own key name when the tree changes.
        let channel = format!("app|managed-resources|{MANAGED}_guestbook|1.8.3");
        let mut sub = tokio::process::Command::new(redis_cli_bin()?)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &proxy_port.to_string(),
                "SUBSCRIBE",
                &channel,
            ])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(sub.stdout.take().unwrap()).lines();
        let managed_redis = &managed_redis;
        eventually("the agent subscribed on the spoke's Redis", T, || {
            let spoke_key = "app|managed-resources|guestbook|1.8.3";
            async move {
                let mut spoke = conn(managed_redis).await;
                let n = spoke
                    .command(&[b"PUBLISH", spoke_key.as_bytes(), b"changed"])
                    .await
                    .ok()?;
                match n.value {
                    Value::V2(argocd_agent_redis::resp::Frame2::Integer(n)) if n > 0 => Some(()),
                    _ => None,
                }
            }
        })
        .await?;
        let seen = tokio::time::timeout(Duration::from_secs(10), async {
            let mut out = Vec::new();
            while let Ok(Some(l)) = lines.next_line().await {
                out.push(l.clone());
                if l == "changed" {
                    return out;
                }
            }
            out
        })
        .await
        .map_err(|_| "no pub/sub message through the proxy within 10 s")?;
        assert!(seen.contains(&"message".to_owned()), "{seen:?}");
        assert!(seen.contains(&channel), "{seen:?}");

        // 7. Cluster info: Successful with the agent's counts (Applications it holds; APIs
        // and resources from its Argo CD's own cluster info) where argocd-server reads it.
        let spoke_info = serde_json::json!({
            "connectionState": {"status": "Successful"},
            "cacheInfo": {"resourcesCount": 42, "apisCount": 7},
            "serverVersion": "1.33",
        });
        set(
            managed_redis,
            &clusterinfo::key(clusterinfo::IN_CLUSTER, Compression::Gzip),
            &clusterinfo::encode(&spoke_info, Compression::Gzip),
        )
        .await;
        let hub_key = clusterinfo::key(
            &format!("https://argocd-agent-resource-proxy:9090?agentName={MANAGED}"),
            Compression::Gzip,
        );
        let info = |want: &'static str| {
            let hub_key = hub_key.clone();
            let hub_redis = &hub_redis;
            async move {
                let v = conn(hub_redis)
                    .await
                    .command(&[b"GET", hub_key.as_bytes()])
                    .await
                    .ok()?;
                let doc = clusterinfo::decode(&v.into_value().ok()??, Compression::Gzip)?;
                (doc["connectionState"]["status"] == want).then_some(doc)
            }
        };
        let doc = eventually("cluster info Successful with counts", T, || async {
            info("Successful")
                .await
                .filter(|d| d["cacheInfo"]["resourcesCount"] == 42)
        })
        .await?;
        assert_eq!(doc["applicationsCount"], 1, "{doc}");
        assert_eq!(doc["cacheInfo"]["apisCount"], 7, "{doc}");
        assert_eq!(doc["serverVersion"], "1.33", "{doc}");
        // The agent's version from its hello (upstream issue #940): in the message Argo CD
        // shows next to the status, and as a field of its own.
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(doc["agentVersion"], version, "{doc}");
        assert_eq!(
            doc["connectionState"]["message"],
            format!("argocd-agent {version}"),
            "{doc}"
        );

        // 8. Agent offline: a prompt error, never a hang; cluster info Failed within 5 s.
        // Killed, not stopped: the agent gets no chance to say goodbye.
        let cut = Instant::now();
        topo.managed.as_mut().unwrap().kill().await;
        eventually("cluster info Failed", Duration::from_secs(5), || {
            info("Failed")
        })
        .await?;
        let failed_after = cut.elapsed();
        assert!(
            failed_after < Duration::from_secs(5),
            "Failed after {failed_after:?}"
        );
        eventually("the principal saw the managed agent leave", T, || async {
            let (out, _, _) = cli_get(proxy_port, &[], &tree_key).await;
            out.contains("not connected").then_some(())
        })
        .await?;
        let (out, _, took) = cli_get(proxy_port, &[], &tree_key).await;
        assert!(out.contains("not connected"), "{out}");
        assert!(took < Duration::from_secs(2), "offline error took {took:?}");
        // The subscribed client is closed so it subscribes again later.
        let ended = tokio::time::timeout(Duration::from_secs(10), sub.wait()).await;
        assert!(
            ended.is_ok(),
            "subscribed client not closed after the agent left"
        );
        // Other agents and the hub keep working.
        let (edge, _, _) = cli_get(
            proxy_port,
            &[],
            &format!("app|resources-tree|{AUTONOMOUS}_edge|1.8.3"),
        )
        .await;
        assert_eq!(edge, "edge-tree");
        Ok::<(), HarnessError>(())
    }
    .await;
    if let Err(e) = &r {
        eprintln!("{}", topo.logs());
        panic!("{e}");
    }
    topo.stop().await;
}

/// A CA and a certificate for `localhost` / 127.0.0.1 it signed, as PEM files in `dir`:
/// (ca, cert, key).
fn tls_files(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // Distinct names: a leaf named like its issuer looks self-issued to OpenSSL.
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "redis test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::from_ca_cert_der(ca.der(), ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
    let cert = params.signed_by(&key, &issuer).unwrap();
    let paths = (dir.join("ca.pem"), dir.join("tls.pem"), dir.join("tls.key"));
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_proxy_speaks_tls_on_both_legs() {
    redis_cli_bin().unwrap();
    let dir = tempfile::Builder::new()
        .prefix("argocd-agent-redis-tls")
        .tempdir()
        .unwrap();
    let (ca, cert, key) = tls_files(dir.path());
    let hub_redis = RedisServer::start_tls(dir.path(), "redis-hub", &cert, &key, &ca)
        .await
        .unwrap();
    let spoke_redis = RedisServer::start_tls(dir.path(), "redis-managed", &cert, &key, &ca)
        .await
        .unwrap();
    let proxy_port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let path = |p: &std::path::Path| p.display().to_string();
    let topo = Topology::start(TopologyOptions {
        dir: Some(dir.path().join("topology")),
        agents: Some(vec![MANAGED]),
        principal_args: vec![
            "--redis-proxy-address".into(),
            format!("127.0.0.1:{proxy_port}"),
            "--redis-server-address".into(),
            hub_redis.addr(),
            "--redis-server-tls-ca-path".into(),
            path(&ca),
            "--redis-proxy-tls-cert-path".into(),
            path(&cert),
            "--redis-proxy-tls-key-path".into(),
            path(&key),
        ],
        per_agent_args: vec![(
            MANAGED,
            vec![
                "--redis-addr".into(),
                spoke_redis.addr(),
                "--redis-tls-ca-path".into(),
                path(&ca),
            ],
        )],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        apps(&topo.hub, MANAGED)?
            .create(
                &PostParams::default(),
                &sample_app("guestbook", MANAGED, "guestbook"),
            )
            .await?;
        eventually("guestbook on the managed spoke", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
        })
        .await?;
        let tls_cli = |args: Vec<String>| {
            let ca = path(&ca);
            async move {
                tokio::process::Command::new(redis_cli_bin().unwrap())
                    .args(["--tls", "--cacert", &ca, "-h", "127.0.0.1", "-p"])
                    .arg(proxy_port.to_string())
                    .args(args)
                    .output()
                    .await
                    .map(|o| String::from_utf8_lossy(&o.stdout).trim_end().to_owned())
            }
        };
        // Seed both Redis servers through TLS too (redis-cli against each server).
        for (port, k, v) in [
            (hub_redis.port, "plain-key", "hub-over-tls"),
            (
                spoke_redis.port,
                "app|resources-tree|guestbook|1.8.3",
                "tree-over-tls",
            ),
        ] {
            let out = tokio::process::Command::new(redis_cli_bin()?)
                .args([
                    "--tls",
                    "--cacert",
                    &path(&ca),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "SET",
                    k,
                    v,
                ])
                .output()
                .await?;
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK", "{out:?}");
        }
        let plain = tls_cli(vec!["GET".into(), "plain-key".into()]).await?;
        assert_eq!(plain, "hub-over-tls");
        let tree = tls_cli(vec![
            "GET".into(),
            format!("app|resources-tree|{MANAGED}_guestbook|1.8.3"),
        ])
        .await?;
        assert_eq!(tree, "tree-over-tls");
        // Plaintext to a TLS listener gets nothing useful (and no hang of the proxy).
        let out = redis_cli(proxy_port, &[b"PING"]).await?;
        assert_ne!(String::from_utf8_lossy(&out.stdout).trim(), "PONG");
        Ok::<(), HarnessError>(())
    }
    .await;
    if let Err(e) = &r {
        eprintln!("{}", topo.logs());
        panic!("{e}");
    }
    topo.stop().await;
}
