//! Tenants on one hub, with the real principal, a real agent and hand-driven agents: the
//! admin API scoped by tenant (list, inspect, disconnect, blocklist, kubeconfig, tenants),
//! the tenants' quotas (agents connected, events per second, resource-proxy requests in
//! flight), each refused with a reason, a metric and a log line while the other tenant
//! keeps working, and a live rules change that moves an agent out of its tenant.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_domain::{Event, EventType, Namespace, Payload, ResourceKind, ResourceRef};
use argocd_agent_proto::eventstream::AgentMode;
use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const T: Duration = Duration::from_secs(30);
/// Tenant team-a's operator.
const OPS_A: &str = "spiffe://example.org/ns/ops-a/sa/alice";
/// Tenant team-b's operator.
const OPS_B: &str = "spiffe://example.org/ns/ops-b/sa/bob";
/// Tenant team-b's agent (hand-driven), hub namespace `b-1`.
const B1: &str = "b-1";
/// Team-a's second agent (hand-driven; the flood's source).
const FLOOD: &str = "agent-flood";
/// Team-a's third agent: over `quotas.agents: 2`.
const THIRD: &str = "agent-third";
/// Namespace of the spoke objects the proxy reads.
const APP_NS: &str = "web";

fn b_id(sa: &str) -> String {
    format!("spiffe://example.org/ns/team-b/sa/{sa}")
}

/// The rules: the platform operator (`operator.sock`) by an admin rule, every agent by one
/// template; team-a holds the `agents` service accounts (`agent-*` namespaces), team-b
/// holds `team-b`'s (`b-*`), each with its operator; `quotas` are team-a's.
fn rules(team_a_agents: &str, team_a_namespaces: &str, quotas: &str) -> String {
    format!(
        r#"rules:
  - name: operators
    template: "spiffe://example.org/ns/platform/sa/{{who}}"
    role: admin
  - name: agents
    template: "spiffe://example.org/ns/{{ns}}/sa/{{sa}}"
    agent: "{{sa}}"
    namespace: "{{sa}}"
    mode: both
tenants:
  - name: team-a
    agents: ["{team_a_agents}"]
    namespaces: ["{team_a_namespaces}"]
    admins: ["{OPS_A}"]
    quotas: {quotas}
  - name: team-b
    agents: ["spiffe://example.org/ns/team-b/sa/{{sa}}"]
    namespaces: ["b-*"]
    admins: ["{OPS_B}"]
"#
    )
}

const TEAM_A_AGENTS: &str = "spiffe://example.org/ns/agents/sa/{sa}";

fn sockets() -> Vec<(String, String)> {
    vec![
        ("ops-a.sock".into(), OPS_A.into()),
        ("ops-b.sock".into(), OPS_B.into()),
        ("b-1.sock".into(), b_id(B1)),
        ("flood.sock".into(), agent_id(FLOOD)),
        ("third.sock".into(), agent_id(THIRD)),
    ]
}

async fn start(dir: &Path, quotas: &str, proxy_port: u16) -> Topology {
    let rules_file = dir.join("rules.yaml");
    std::fs::write(&rules_file, rules(TEAM_A_AGENTS, "agent-*", quotas)).unwrap();
    let topo = Topology::start(TopologyOptions {
        rules_file: Some(rules_file),
        agents: Some(vec![MANAGED]),
        extra_sockets: sockets(),
        principal_args: vec![
            "--enable-resource-proxy".into(),
            "--resource-proxy-address".into(),
            format!("127.0.0.1:{proxy_port}"),
            "--enable-self-cluster-registration".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    for ns in [B1, FLOOD] {
        create_namespace(&topo.hub, ns).await.unwrap();
    }
    topo
}

/// `argocd-agentctl <args>` over mTLS with the SVID behind `socket`.
async fn ctl(topo: &Topology, socket: &str, args: &[&str]) -> Result<Output, HarnessError> {
    let endpoint = topo.spiffe.endpoint(&topo.dir.join(socket));
    Ok(tokio::process::Command::new(binary("argocd-agentctl")?)
        .args(args)
        .args([
            "--principal-address",
            &topo.principal_addr.to_string(),
            "--spiffe-endpoint-socket",
            &endpoint,
            "--principal-spiffe-id",
            PRINCIPAL_ID,
        ])
        .output()
        .await?)
}

/// Runs `ctl` and wants success; returns standard output.
async fn ok(topo: &Topology, socket: &str, args: &[&str]) -> Result<String, HarnessError> {
    let out = ctl(topo, socket, args).await?;
    if !out.status.success() {
        return Err(format!("{args:?} as {socket}: {}", output_text(&out)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `ctl` and wants a refusal naming the caller's tenant scope.
async fn refused(
    topo: &Topology,
    socket: &str,
    args: &[&str],
    scope: &str,
) -> Result<(), HarnessError> {
    let out = ctl(topo, socket, args).await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success()
        || !stderr.contains("PermissionDenied")
        || !stderr.contains(&format!("outside the caller's scope (tenant {scope})"))
    {
        return Err(format!(
            "{args:?} as {socket} should be refused: {}",
            output_text(&out)
        )
        .into());
    }
    Ok(())
}

async fn names(topo: &Topology, socket: &str) -> Result<Vec<(String, String)>, HarnessError> {
    let out = ok(topo, socket, &["agent", "list", "-o", "json"]).await?;
    let v: Vec<Value> = serde_json::from_str(&out)?;
    let mut names: Vec<(String, String)> = v
        .iter()
        .map(|a| {
            (
                a["name"].as_str().unwrap_or_default().to_owned(),
                a["tenant"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    names.sort();
    Ok(names)
}

/// A hand-driven agent's stream (autonomous), admitted; with its SVID source (keep it).
async fn hand_agent(
    topo: &Topology,
    socket: &str,
) -> Result<(AgentStream, argocd_agent_identity::source::SvidSource), HarnessError> {
    let source = topo.svid_source(socket).await?;
    let (stream, welcome) =
        open_agent_stream(&source, topo.principal_addr, AgentMode::Autonomous).await?;
    if welcome.ty != EventType::Welcome {
        return Err(format!("{socket}: no welcome: {welcome:?}").into());
    }
    Ok((stream, source))
}

async fn metrics(topo: &Topology) -> String {
    http_get(topo.metrics_ports["principal"], "/metrics")
        .await
        .unwrap_or_default()
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_operators_see_and_act_on_their_own_tenant_only() {
    let dir = tempfile::tempdir().unwrap();
    let port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let topo = start(dir.path(), "{}", port).await;
    let r = async {
        let _b1 = hand_agent(&topo, "b-1.sock").await?;
        // 1. The platform operator sees both tenants' agents, each with its tenant.
        let all = eventually("the platform operator lists both agents", T, || async {
            names(&topo, "operator.sock")
                .await
                .ok()
                .filter(|n| n.len() == 2)
        })
        .await?;
        assert_eq!(all, vec![pair(MANAGED, "team-a"), pair(B1, "team-b")]);
        // 2. Each tenant's operator sees its own agent only.
        assert_eq!(
            names(&topo, "ops-a.sock").await?,
            vec![pair(MANAGED, "team-a")]
        );
        assert_eq!(names(&topo, "ops-b.sock").await?, vec![pair(B1, "team-b")]);
        let table = ok(&topo, "ops-a.sock", &["agent", "list"]).await?;
        assert!(
            table.starts_with("NAME") && table.contains("TENANT") && !table.contains(B1),
            "{table}"
        );
        // 3. Inspect and disconnect: own yes; the other tenant's, and unknown names, refused
        // alike (no probing of names).
        let own = ok(&topo, "ops-a.sock", &["agent", "inspect", MANAGED]).await?;
        assert!(own.contains("Tenant:") && own.contains("team-a"), "{own}");
        refused(&topo, "ops-a.sock", &["agent", "inspect", B1], "team-a").await?;
        refused(
            &topo,
            "ops-a.sock",
            &["agent", "inspect", "no-such-agent"],
            "team-a",
        )
        .await?;
        refused(&topo, "ops-a.sock", &["agent", "disconnect", B1], "team-a").await?;
        refused(
            &topo,
            "ops-b.sock",
            &["agent", "disconnect", MANAGED],
            "team-b",
        )
        .await?;
        let before = topo.connect_count(MANAGED);
        ok(&topo, "ops-a.sock", &["agent", "disconnect", MANAGED]).await?;
        eventually(
            "agent-managed reconnects after its operator's disconnect",
            T,
            || async { (topo.connect_count(MANAGED) > before).then_some(()) },
        )
        .await?;
        // 4. Blocklist: exact IDs of the tenant's agents only.
        let b1_id = b_id(B1);
        refused(
            &topo,
            "ops-a.sock",
            &["blocklist", "add", "--id", &b1_id],
            "team-a",
        )
        .await?;
        refused(
            &topo,
            "ops-a.sock",
            &["blocklist", "add", "--prefix", "spiffe://example.org/"],
            "team-a",
        )
        .await?;
        refused(
            &topo,
            "ops-a.sock",
            &["blocklist", "add", "--id", OPS_B],
            "team-a",
        )
        .await?;
        let since = std::time::SystemTime::now();
        let managed_id = agent_id(MANAGED);
        let added = ok(
            &topo,
            "ops-a.sock",
            &["blocklist", "add", "--id", &managed_id],
        )
        .await?;
        assert!(added.contains("added ids"), "{added}");
        eventually("the blocked session is closed", T, || async {
            logged_at(
                &topo.principal.log(),
                "session closed: identity blocked",
                since,
            )
        })
        .await?;
        let before = topo.connect_count(MANAGED);
        ok(
            &topo,
            "ops-a.sock",
            &["blocklist", "remove", "--id", &managed_id],
        )
        .await?;
        eventually("the agent is back once unblocked", T, || async {
            (topo.connect_count(MANAGED) > before).then_some(())
        })
        .await?;
        // 5. Kubeconfigs: the tenant's agents only; the token reaches that agent.
        refused(&topo, "ops-a.sock", &["agent", "kubeconfig", B1], "team-a").await?;
        let kc = dir.path().join("managed.kubeconfig");
        let kc_arg = kc.display().to_string();
        ok(
            &topo,
            "ops-a.sock",
            &["agent", "kubeconfig", MANAGED, "-f", &kc_arg],
        )
        .await?;
        create_namespace(&topo.managed_spoke, APP_NS).await?;
        let o = run_kubectl(&kc, &["get", "configmaps", "-n", APP_NS, "-o", "name"]).await;
        assert!(
            o.status.success(),
            "kubectl through the proxy: {}",
            output_text(&o)
        );
        let token = token_of(&kc);
        // The same token cannot be pointed at the other tenant's agent.
        let other = rewrite_server(&kc, MANAGED, B1);
        let o = run_kubectl(&other, &["get", "configmaps", "-n", APP_NS]).await;
        assert!(
            !o.status.success(),
            "a team-a token reached b-1: {}",
            output_text(&o)
        );
        assert!(
            topo.principal
                .log()
                .contains("resource proxy request refused: the token is for another agent"),
            "{}",
            output_text(&o)
        );
        assert!(!token.is_empty());
        // 6. Tenants: each operator its own; the platform both; offline from the file.
        let t = ok(&topo, "ops-a.sock", &["tenant", "list", "-o", "json"]).await?;
        let v: Vec<Value> = serde_json::from_str(&t)?;
        assert_eq!(v.len(), 1, "{t}");
        assert_eq!(v[0]["name"], "team-a");
        assert_eq!(v[0]["connected"], json!([MANAGED]));
        let t = ok(&topo, "operator.sock", &["tenant", "list", "-o", "json"]).await?;
        assert_eq!(serde_json::from_str::<Vec<Value>>(&t)?.len(), 2, "{t}");
        refused(&topo, "ops-a.sock", &["agent", "inspect", B1], "team-a").await?;
        let offline = tokio::process::Command::new(binary("argocd-agentctl")?)
            .args(["tenant", "inspect", "team-b", "--rules"])
            .arg(dir.path().join("rules.yaml"))
            .output()
            .await?;
        assert!(offline.status.success(), "{}", output_text(&offline));
        assert!(String::from_utf8_lossy(&offline.stdout).contains(OPS_B));
        // Every refusal was counted and logged.
        let m = metrics(&topo).await;
        let outside = metric_value(
            &m,
            "argocd_principal_auth_failures_total{reason=\"OutsideTenant\"}",
        )
        .unwrap_or(0.0);
        assert_eq!(outside, 9.0, "OutsideTenant: one per refusal above");
        assert!(
            topo.principal
                .log()
                .contains("admin call refused: outside the caller's tenant")
        );

        // 7. A live rules change moves agent-managed out of team-a: its session is revoked
        // (TenantChanged), it reconnects as an agent of no tenant.
        let before = topo.connect_count(MANAGED);
        std::fs::write(
            dir.path().join("rules.yaml"),
            rules("spiffe://example.org/ns/team-a/sa/{sa}", "a-*", "{}"),
        )?;
        eventually("the session of the moved agent is revoked", T, || async {
            topo.principal
                .log()
                .lines()
                .any(|l| l.contains("identity no longer maps") && l.contains("tenant"))
                .then_some(())
        })
        .await?;
        eventually("agent-managed reconnects outside any tenant", T, || async {
            let n = names(&topo, "operator.sock").await.ok()?;
            (topo.connect_count(MANAGED) > before && n.contains(&pair(MANAGED, ""))).then_some(())
        })
        .await?;
        // Its old tenant's operator no longer sees it, and the token issued to that
        // operator under team-a no longer reaches it.
        let n = names(&topo, "ops-a.sock").await?;
        assert!(n.is_empty(), "{n:?}");
        refused(
            &topo,
            "ops-a.sock",
            &["agent", "inspect", MANAGED],
            "team-a",
        )
        .await?;
        let o = run_kubectl(&kc, &["get", "configmaps", "-n", APP_NS]).await;
        assert!(
            !o.status.success(),
            "a team-a token reached an agent that left team-a: {}",
            output_text(&o)
        );
        assert!(
            topo.principal.log().contains(
                "resource proxy request refused: the token was issued under another tenant"
            ),
            "{}",
            output_text(&o)
        );
        Ok::<_, HarnessError>(())
    }
    .await;
    topo.finish(r).await;
}

fn token_of(kc: &Path) -> String {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(kc).unwrap()).unwrap();
    v["users"][0]["user"]["token"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A copy of kubeconfig `kc` pointed at agent `to` instead of `from`.
fn rewrite_server(kc: &Path, from: &str, to: &str) -> PathBuf {
    let text = std::fs::read_to_string(kc).unwrap();
    let out = kc.with_extension(format!("{to}.kubeconfig"));
    std::fs::write(
        &out,
        text.replace(&format!("/agents/{from}"), &format!("/agents/{to}")),
    )
    .unwrap();
    out
}

/// A create of Application `name` in hub namespace `ns` (the sender's own).
fn create_event(ns: &str, name: &str) -> Event {
    let mut obj = serde_json::to_value(sample_app(name, ns, "guestbook")).unwrap();
    obj["metadata"]["namespace"] = json!(ns);
    Event::resource(
        "test-client",
        EventType::Create,
        ResourceRef {
            kind: ResourceKind::Application,
            namespace: Namespace::new(ns).unwrap(),
            name: name.into(),
        },
        Payload::Object(Arc::new(obj)),
    )
}

/// Sends `n` creates on `stream` and collects each answer: `processed` or the error's
/// reason and message.
async fn send_creates(
    stream: &mut AgentStream,
    ns: &str,
    prefix: &str,
    n: usize,
) -> Result<Vec<(String, String)>, HarnessError> {
    let (tx, inbound) = stream;
    let mut ids = Vec::new();
    for i in 0..n {
        let e = create_event(ns, &format!("{prefix}-{i}"));
        ids.push(e.id.clone());
        tx.send(e.to_cloud_event())
            .await
            .map_err(|e| e.to_string())?;
    }
    let mut answers = Vec::new();
    for id in ids {
        let e = answer_to(inbound, &id).await?;
        answers.push(match (&e.ty, &e.payload) {
            (EventType::Processed, _) => ("processed".to_owned(), String::new()),
            (_, Payload::Error(d)) => (d.reason.clone(), d.message.clone()),
            (ty, _) => (format!("unexpected {ty}"), String::new()),
        });
    }
    Ok(answers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_quotas_refuse_with_a_reason_and_never_slow_the_other_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let quotas = "{agents: 2, eventsPerSecond: 1, eventsBurst: 3, proxyRequestsInFlight: 1}";
    let topo = start(dir.path(), quotas, port).await;
    let r = async {
        // 1. Agents: agent-managed and agent-flood fill team-a's quota; a third is refused.
        let (mut flood, _flood_svid) = hand_agent(&topo, "flood.sock").await?;
        let source = topo.svid_source("third.sock").await?;
        let third = open_agent_stream(&source, topo.principal_addr, AgentMode::Autonomous).await;
        let err = match third {
            Ok((_, first)) => return Err(format!("the third agent was admitted: {first:?}").into()),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("quotas.agents: 2"), "{err}");
        let m = metrics(&topo).await;
        for series in [
            "argocd_principal_auth_failures_total{reason=\"TenantAgentQuota\"} 1",
            "argocd_principal_tenant_quota_refused_total{tenant=\"team-a\",quota=\"agents\"} 1",
            "argocd_principal_tenant_agents_connected{tenant=\"team-a\"} 2",
        ] {
            assert!(m.lines().any(|l| l == series), "{series} in\n{m}");
        }
        assert!(topo.principal.log().contains("stream refused: tenant agents quota"));
        // Team-b is not limited by team-a's quota.
        let (mut b1, _b1_svid) = hand_agent(&topo, "b-1.sock").await?;

        // 2. Events: team-a's flood is refused past its bucket; team-b's creates, sent at
        // the same time, are all processed.
        let (a, b) = tokio::join!(
            send_creates(&mut flood, FLOOD, "flood", 30),
            send_creates(&mut b1, B1, "steady", 20),
        );
        let (a, b) = (a?, b?);
        let refused: Vec<&(String, String)> = a.iter().filter(|(k, _)| k == "TooManyRequests").collect();
        assert!(refused.len() >= 20, "team-a's flood: {a:?}");
        assert!(refused[0].1.contains("tenant team-a is over its event quota"), "{refused:?}");
        assert!(b.iter().all(|(k, _)| k == "processed"), "team-b's events: {b:?}");
        let m = metrics(&topo).await;
        let counted = metric_value(
            &m,
            &format!("argocd_principal_events_refused_total{{agent=\"{FLOOD}\",reason=\"TenantRateLimited\",tenant=\"team-a\"}}"),
        )
        .unwrap_or(0.0);
        assert_eq!(counted as usize, refused.len(), "{m}");
        assert!(topo.principal.log().contains("tenant over its events per second quota"));

        // 3. Proxy requests in flight: a followed log holds team-a's one slot; another
        // request is refused with 429 TenantProxyQuota until the log ends.
        let spoke = &topo.managed_spoke;
        apps(&topo.hub, MANAGED)?
            .create(&PostParams::default(), &sample_app("web", MANAGED, "guestbook"))
            .await?;
        eventually("the managed Application on its spoke", T, || async {
            stored_app(spoke, SPOKE_NS, "web")
        })
        .await?;
        create_namespace(spoke, APP_NS).await?;
        let pod = object(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-0", "namespace": APP_NS,
                "labels": {"app.kubernetes.io/instance": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]}}));
        core_api(spoke, APP_NS, "pods", "Pod").create(&PostParams::default(), &pod).await?;
        spoke.set_pod_log(APP_NS, "web-0", "web", "first line\n");
        let kc = dir.path().join("a.kubeconfig");
        let kc_arg = kc.display().to_string();
        ok(&topo, "ops-a.sock", &["agent", "kubeconfig", MANAGED, "-f", &kc_arg]).await?;
        let mut follow = tokio::process::Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(&kc)
            .args(["logs", "-f", "web-0", "-n", APP_NS])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(follow.stdout.take().ok_or("no stdout")?).lines();
        let first = tokio::time::timeout(T, lines.next_line()).await??;
        assert_eq!(first.as_deref(), Some("first line"));
        let raw = format!("/api/v1/namespaces/{APP_NS}/pods");
        let o = run_kubectl(&kc, &["get", "--raw", &raw]).await;
        let text = output_text(&o);
        assert!(!o.status.success(), "a second request was let through: {text}");
        assert!(
            topo.principal
                .log()
                .contains("resource proxy request refused: tenant \"team-a\" already has 1 resource proxy requests in flight"),
            "{text}"
        );
        let m = metrics(&topo).await;
        // (kubectl may retry a 429: at least one refusal.)
        let proxy_refused = metric_value(
            &m,
            "argocd_principal_tenant_quota_refused_total{tenant=\"team-a\",quota=\"proxyRequestsInFlight\"}",
        )
        .unwrap_or(0.0);
        assert!(proxy_refused >= 1.0, "{m}");
        assert!(m.contains("argocd_principal_tenant_proxy_requests_in_flight{tenant=\"team-a\"} 1"), "{m}");
        follow.kill().await?;
        eventually("the slot is given back when the log ends", T, || async {
            let o = run_kubectl(&kc, &["get", "--raw", &raw]).await;
            o.status.success().then_some(())
        })
        .await?;
        Ok::<_, HarnessError>(())
    }
    .await;
    topo.finish(r).await;
}
