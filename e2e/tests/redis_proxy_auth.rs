//! The Redis proxy in front of a password-protected hub Redis (Argo CD's default), attacked
//! as an outsider would: the real principal and a real managed agent, real Redis servers,
//! and raw RESP clients next to `redis-cli` (playing argocd-server).
//!
//! - nothing of an agent is served before AUTH (GET, SUBSCRIBE; after a failed AUTH too);
//! - the principal logs in to the hub Redis with Argo CD's `REDIS_PASSWORD` and writes the
//!   agent's cluster info there;
//! - a deeply nested request (the shape that overflowed the decoder's stack and aborted the
//!   principal before any AUTH) is refused and the principal keeps serving;
//! - unauthenticated clients get a small frame limit, a pool and a per-address cap of their
//!   own, and are closed when they do not authenticate in time, so they cannot lock out
//!   argocd-server.
//!
//! Needs `redis-server` and `redis-cli` (installed by `.ci/run`).

use std::time::{Duration, Instant};

use argocd_agent_redis::clusterinfo::{self, Compression};
use argocd_agent_redis::{Frame, Protocol, RedisEndpoint};
use argocd_agent_testkit::harness::*;
use argocd_agent_testkit::redis::{RedisServer, RespClient, redis_cli, redis_cli_bin};
use kube::api::PostParams;
use tokio::net::{TcpSocket, TcpStream};

const T: Duration = Duration::from_secs(30);
const PASSWORD: &str = "s3cret-hub-redis";
const SUFFIX: &str = "|1.8.3.gz";
const TREE: &[u8] = b"guestbook-tree";

fn error_text(f: Frame) -> String {
    assert!(f.is_error(), "expected an error, got {f:?}");
    f.into_value().unwrap_err().to_string()
}

/// A connection from another loopback address (another pod, for the per-client caps).
async fn connect_from(ip: &str, port: u16) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    s.connect(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_protected_hub_redis_is_protected_through_the_proxy() {
    redis_cli_bin().unwrap();
    let dir = tempfile::Builder::new()
        .prefix("argocd-agent-redis-auth")
        .tempdir()
        .unwrap();
    let hub_redis = RedisServer::start_with_password(dir.path(), "redis-hub", PASSWORD)
        .await
        .unwrap();
    let spoke_redis = RedisServer::start(dir.path(), "redis-managed")
        .await
        .unwrap();
    let proxy_port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let mut topo = Topology::start(TopologyOptions {
        dir: Some(dir.path().join("topology")),
        agents: Some(vec![MANAGED]),
        principal_args: vec![
            "--redis-proxy-address".into(),
            format!("127.0.0.1:{proxy_port}"),
            "--redis-server-address".into(),
            hub_redis.addr(),
        ],
        // Argo CD's variable, as argocd-server reads it from the argocd-redis Secret.
        // Argo CD's variable, on the principal only: an agent reads REDIS_PASSWORD too (as
        // upstream's does) for its own cluster's Redis, which has no password here.
        principal_envs: vec![("REDIS_PASSWORD".into(), PASSWORD.into())],
        agent_args: vec!["--cache-refresh-interval".into(), "1s".into()],
        per_agent_args: vec![(MANAGED, vec!["--redis-addr".into(), spoke_redis.addr()])],
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
        let spoke = RedisEndpoint {
            addr: spoke_redis.addr(),
            ..Default::default()
        };
        let tree_key = format!("app|resources-tree|{MANAGED}_guestbook{SUFFIX}");
        let reply = spoke
            .connect(1 << 20)
            .await?
            .command(&[
                b"SET",
                format!("app|resources-tree|guestbook{SUFFIX}").as_bytes(),
                TREE,
            ])
            .await?;
        assert!(!reply.is_error());

        // 1. The principal logs in to the hub Redis: the agent's cluster info is there.
        let hub = RedisEndpoint {
            addr: hub_redis.addr(),
            password: Some(PASSWORD.into()),
            ..Default::default()
        };
        let info_key = clusterinfo::key(
            &format!("https://argocd-agent-resource-proxy:9090?agentName={MANAGED}"),
            Compression::Gzip,
        );
        eventually("cluster info written with the password", T, || async {
            let v = hub
                .connect(1 << 20)
                .await
                .ok()?
                .command(&[b"GET", info_key.as_bytes()])
                .await
                .ok()?;
            let doc = clusterinfo::decode(&v.into_value().ok()??, Compression::Gzip)?;
            (doc["connectionState"]["status"] == "Successful").then_some(())
        })
        .await?;
        assert!(
            !topo.principal.log().contains("NOAUTH"),
            "the principal's hub writes were refused"
        );

        // 2. Nothing of an agent before AUTH, or after a failed one.
        let mut c = RespClient::connect(proxy_port).await;
        let e = error_text(c.cmd(&[b"GET", tree_key.as_bytes()]).await);
        assert!(e.starts_with("NOAUTH"), "GET before AUTH: {e}");
        let e = error_text(c.cmd(&[b"SUBSCRIBE", tree_key.as_bytes()]).await);
        assert!(e.starts_with("NOAUTH"), "SUBSCRIBE before AUTH: {e}");
        let e = error_text(c.cmd(&[b"GET", b"plain-key"]).await);
        assert!(e.starts_with("NOAUTH"), "hub key before AUTH: {e}");
        let e = error_text(c.cmd(&[b"AUTH", b"wrong"]).await);
        assert!(e.contains("WRONGPASS") || e.contains("invalid"), "{e}");
        let e = error_text(c.cmd(&[b"GET", tree_key.as_bytes()]).await);
        assert!(e.starts_with("NOAUTH"), "GET after a failed AUTH: {e}");
        // The right password, pipelined with the GET (go-redis may send both at once).
        let mut both = argocd_agent_redis::resp::command(&[b"AUTH", PASSWORD.as_bytes()]).to_vec();
        both.extend_from_slice(&argocd_agent_redis::resp::command(&[
            b"GET",
            tree_key.as_bytes(),
        ]));
        c.send(&both).await?;
        assert!(
            !c.frame(Protocol::Resp2).await.is_error(),
            "AUTH with the password"
        );
        assert_eq!(
            c.frame(Protocol::Resp2)
                .await
                .into_value()
                .unwrap()
                .as_deref(),
            Some(TREE)
        );
        // HELLO 3 AUTH authenticates too.
        let mut h = RespClient::connect(proxy_port).await;
        let hello = h
            .cmd(&[b"HELLO", b"2", b"AUTH", b"default", PASSWORD.as_bytes()])
            .await;
        assert!(!hello.is_error(), "{hello:?}");
        let v = h.cmd(&[b"GET", tree_key.as_bytes()]).await;
        assert_eq!(v.into_value().unwrap().as_deref(), Some(TREE));
        // And argocd-server's way: redis-cli with the password sees the tree; without, nothing.
        let out = redis_cli(
            proxy_port,
            &[
                b"--no-auth-warning",
                b"-a",
                PASSWORD.as_bytes(),
                b"GET",
                tree_key.as_bytes(),
            ],
        )
        .await?;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim_end(),
            "guestbook-tree"
        );
        let out = redis_cli(proxy_port, &[b"GET", tree_key.as_bytes()]).await?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("NOAUTH") && !text.contains("guestbook-tree"),
            "{text}"
        );

        // 3. The request that crashed the principal: 20,000 nested arrays (80 KB), before
        // and after AUTH. Refused, the connection closed, the principal still serving.
        let mut nested = Vec::new();
        for _ in 0..20_000 {
            nested.extend_from_slice(b"*1\r\n");
        }
        nested.extend_from_slice(b"*0\r\n");
        for authenticate in [false, true] {
            let mut a = RespClient::connect(proxy_port).await;
            if authenticate {
                assert!(!a.cmd(&[b"AUTH", PASSWORD.as_bytes()]).await.is_error());
            }
            let _ = a.send(&nested).await;
            let e = error_text(a.frame(Protocol::Resp2).await);
            assert!(e.contains("Protocol error"), "{e}");
            assert!(a.closed_within(Duration::from_secs(5)).await);
        }
        assert!(
            topo.principal.is_running(),
            "the principal survived the nested request"
        );
        let v = c.cmd(&[b"GET", tree_key.as_bytes()]).await;
        assert_eq!(
            v.into_value().unwrap().as_deref(),
            Some(TREE),
            "the proxy still serves"
        );

        // 4. An unauthenticated client cannot send a large value.
        let mut big = RespClient::connect(proxy_port).await;
        let mut set = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$67108000\r\n".to_vec();
        set.extend_from_slice(&[b'x'; 1024]);
        let _ = big.send(&set).await;
        let e = error_text(big.frame(Protocol::Resp2).await);
        assert!(e.contains("larger than the limit"), "{e}");
        assert!(big.closed_within(Duration::from_secs(5)).await);

        // 5. Idle unauthenticated connections from another address fill only their own
        // places: argocd-server (here 127.0.0.1) still gets in, and they are closed when
        // they have not authenticated within 10 s.
        let mut idle = Vec::new();
        for _ in 0..16 {
            idle.push(RespClient::from(
                connect_from("127.0.0.2", proxy_port).await,
            ));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut over = RespClient::from(connect_from("127.0.0.2", proxy_port).await);
        assert!(
            over.closed_within(Duration::from_secs(3)).await,
            "the 17th unauthenticated connection from one address is refused"
        );
        let out = redis_cli(
            proxy_port,
            &[
                b"--no-auth-warning",
                b"-a",
                PASSWORD.as_bytes(),
                b"GET",
                tree_key.as_bytes(),
            ],
        )
        .await?;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim_end(),
            "guestbook-tree",
            "argocd-server is not locked out"
        );
        let started = Instant::now();
        for c in &mut idle {
            assert!(
                c.closed_within(Duration::from_secs(15)).await,
                "an unauthenticated connection outlived the auth deadline"
            );
        }
        assert!(started.elapsed() >= Duration::from_secs(5));
        let port = topo.metrics_ports["principal"];
        let closed = |reason: &'static str| async move {
            let text = http_get(port, "/metrics").await.unwrap_or_default();
            text.lines()
                .filter(|l| {
                    l.starts_with("argocd_principal_listener_connections_closed_total")
                        && l.contains("listener=\"redis-proxy\"")
                        && l.contains(&format!("reason=\"{reason}\""))
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        };
        assert!(closed("AuthTimeout").await >= 16.0);
        assert!(closed("TooManyFromClient").await >= 1.0);
        assert!(closed("ProtocolError").await >= 3.0);
        let refused = metric_sum(port, "argocd_principal_redis_proxy_commands_total").await;
        assert!(refused > 0.0);
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
