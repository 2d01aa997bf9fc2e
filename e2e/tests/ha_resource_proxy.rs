//! The resource proxy with several replicas, end to end: three principal replicas (`--ha`),
//! each with its own resource proxy listener, and two agents spread across them by Envoy.
//! Every replica answers for every agent: a request reaching a replica that does not serve
//! the agent is forwarded to the one that does (reads, pod logs, a followed log, exec),
//! and a request already forwarded once is never forwarded again.
//!
//! kubectl comes from `KUBECTL`, the project virtualenv or PATH (`.ci/run` installs it).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use argocd_agent_testkit::envoy::free_loopback_port;
use argocd_agent_testkit::ha::{HaOptions, HaTopology};
use argocd_agent_testkit::harness::*;
use base64::Engine as _;
use kube::api::PostParams;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const T: Duration = Duration::from_secs(30);
const REPLICAS: usize = 3;
const APP_NS: &str = "guestbook";
const AGENTS: [&str; 2] = ["agent-ha-0", "agent-ha-1"];

/// The resource proxy kubeconfig `argocd-agentctl agent kubeconfig` writes for `agent`.
async fn kubeconfig_json(topo: &HaTopology, agent: &str) -> Value {
    let path = agent_kubeconfig(&topo.dir, agent).await;
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A ConfigMap and a Pod (with a log) Argo CD manages for Application `app` on `spoke`.
async fn seed(spoke: &argocd_agent_kube_test_server::KubeTestServer, app: &str, agent: &str) {
    create_namespace(spoke, APP_NS).await.unwrap();
    let cm = object(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "web-config", "namespace": APP_NS,
            "labels": {"app.kubernetes.io/instance": app}},
        "data": {"served": agent}}));
    core_api(spoke, APP_NS, "configmaps", "ConfigMap")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let pod = object(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-0", "namespace": APP_NS,
            "labels": {"app.kubernetes.io/instance": app}},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}}));
    core_api(spoke, APP_NS, "pods", "Pod")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    spoke.set_pod_log(
        APP_NS,
        "web-0",
        "web",
        &format!("first line of {agent}\nsecond line\n"),
    );
}

/// `kubeconfig` pointed at replica `i`'s resource proxy (`port`), written to the topology's
/// directory.
fn kubeconfig_for(topo: &HaTopology, kubeconfig: &Value, agent: &str, port: u16) -> PathBuf {
    let mut kc = kubeconfig.clone();
    kc["clusters"][0]["cluster"]["server"] =
        json!(format!("https://127.0.0.1:{port}/agents/{agent}"));
    let path = topo.dir.join(format!("{agent}.via-{port}.kubeconfig"));
    std::fs::write(&path, serde_json::to_vec_pretty(&kc).unwrap()).unwrap();
    path
}

/// HTTP status and body of a request with curl (headers kubectl does not set; `-`
/// arguments are passed as they are).
async fn curl_status(url: &str, token: &str, ca: &Path, extra: &[&str]) -> (u16, String) {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sS", "-o", "-", "-w", "\n%{http_code}", "--cacert"])
        .arg(ca)
        .args(["-H", &format!("Authorization: Bearer {token}")]);
    let mut extra = extra.iter();
    while let Some(a) = extra.next() {
        if a.starts_with('-') {
            cmd.arg(a);
            if matches!(*a, "-X" | "--data-binary") {
                cmd.arg(extra.next().unwrap());
            }
        } else {
            cmd.args(["-H", a]);
        }
    }
    let out = cmd.arg(url).output().await.expect("curl");
    let s = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = s.rsplit_once('\n').unwrap_or(("", &s));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

async fn next_line(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> String {
    tokio::time::timeout(T, lines.next_line())
        .await
        .expect("a log line in time")
        .unwrap()
        .expect("the log stream ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_replica_answers_for_every_agent_by_forwarding_to_the_one_serving_it() {
    let ports: Vec<u16> = (0..REPLICAS)
        .map(|_| free_loopback_port().unwrap())
        .collect();
    let mut topo = HaTopology::start(HaOptions {
        replicas: REPLICAS,
        agents: AGENTS.iter().map(|a| (a.to_string(), "managed")).collect(),
        principal_args: vec![
            "--replica-lease-duration".into(),
            "3s".into(),
            "--enable-resource-proxy".into(),
            "--enable-self-cluster-registration".into(),
            "--resource-proxy-request-timeout".into(),
            "10s".into(),
        ],
        per_replica_args: ports
            .iter()
            .map(|p| vec!["--resource-proxy-address".into(), format!("127.0.0.1:{p}")])
            .collect(),
        per_agent_args: Default::default(),
        dir: std::env::var_os("E2E_DIR").map(PathBuf::from),
    })
    .await
    .unwrap();
    let result = scenario(&mut topo, &ports).await;
    if let Err(e) = result {
        let logs = topo.logs();
        topo.stop().await;
        panic!("{e}\n{logs}");
    }
    topo.stop().await;
}

async fn scenario(topo: &mut HaTopology, ports: &[u16]) -> Result<(), String> {
    // Every agent has a session (and its Lease) on some replica.
    let deadline = Instant::now() + T;
    let holders = loop {
        let h = topo.holders().await.unwrap_or_default();
        if AGENTS.iter().all(|a| h.contains_key(*a)) {
            break h;
        }
        if Instant::now() > deadline {
            return Err(format!("agents without a session: {h:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("holders: {holders:?}");

    for agent in AGENTS {
        apps(&topo.hub, agent)
            .unwrap()
            .create(
                &PostParams::default(),
                &sample_app("web", agent, "guestbook"),
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    for agent in AGENTS {
        eventually("the Application on its spoke", T, || async {
            stored_app(&topo.spokes[agent], SPOKE_NS, "web")
        })
        .await
        .map_err(|e| format!("{agent}: {e}"))?;
        seed(&topo.spokes[agent], "web", agent).await;
        eventually("a cluster secret", T, || async {
            stored_secret(&topo.hub, HUB_ARGOCD_NS, &format!("cluster-{agent}"))
        })
        .await
        .map_err(|e| format!("no cluster secret for {agent}: {e}"))?;
    }

    for agent in AGENTS {
        let holder = &holders[agent];
        let kubeconfig = kubeconfig_json(topo, agent).await;
        let token = kubeconfig["users"][0]["user"]["token"]
            .as_str()
            .unwrap()
            .to_owned();
        let ca = base64::engine::general_purpose::STANDARD
            .decode(
                kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]
                    .as_str()
                    .unwrap(),
            )
            .unwrap();
        let ca_path = topo.dir.join(format!("{agent}.ca.pem"));
        std::fs::write(&ca_path, ca).unwrap();

        for (i, port) in ports.iter().enumerate() {
            let replica = &topo.replicas[i].name;
            let via = format!("{agent} via {replica} (serving replica {holder})");
            let kc = kubeconfig_for(topo, &kubeconfig, agent, *port);

            // A read (the first one waits for the replica Leases to be seen everywhere).
            let deadline = Instant::now() + T;
            loop {
                let o = run_kubectl(
                    &kc,
                    &["get", "configmap", "web-config", "-n", APP_NS, "-o", "json"],
                )
                .await;
                if o.status.success() {
                    let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())?;
                    if v["data"]["served"] != agent {
                        return Err(format!("{via}: wrong object {v}"));
                    }
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("{via}: get: {}", output_text(&o)));
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let o = run_kubectl(&kc, &["get", "pods", "-n", APP_NS, "-o", "name"]).await;
            if !o.status.success() || !String::from_utf8_lossy(&o.stdout).contains("pod/web-0") {
                return Err(format!("{via}: list pods: {}", output_text(&o)));
            }

            // A log.
            let o = run_kubectl(&kc, &["logs", "web-0", "-n", APP_NS]).await;
            let out = String::from_utf8_lossy(&o.stdout).to_string();
            if !o.status.success() || !out.contains(&format!("first line of {agent}")) {
                return Err(format!("{via}: logs: {}", output_text(&o)));
            }

            // A followed log: a line appended on the spoke arrives while the stream is open.
            let mut follow = tokio::process::Command::new(kubectl())
                .arg("--kubeconfig")
                .arg(&kc)
                .args(["logs", "-f", "web-0", "-n", APP_NS])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
            let first = next_line(&mut lines).await;
            if first != format!("first line of {agent}") {
                return Err(format!("{via}: logs -f began with {first:?}"));
            }
            let _ = next_line(&mut lines).await;
            let appended = format!("appended via {replica}");
            topo.spokes[agent].append_pod_log(APP_NS, "web-0", "web", &format!("{appended}\n"));
            let got = next_line(&mut lines).await;
            follow.kill().await.ok();
            // Keep the spoke's log as seeded for the next replica's check.
            topo.spokes[agent].set_pod_log(
                APP_NS,
                "web-0",
                "web",
                &format!("first line of {agent}\nsecond line\n"),
            );
            if got != appended {
                return Err(format!("{via}: logs -f: got {got:?}, want {appended:?}"));
            }

            // Exec (a WebSocket upgrade, forwarded).
            let o = run_kubectl(&kc, &["exec", "web-0", "-n", APP_NS, "--", "pwd"]).await;
            if !o.status.success() || String::from_utf8_lossy(&o.stdout).trim() != "/" {
                return Err(format!("{via}: exec pwd: {}", output_text(&o)));
            }

            // An interactive exec: stdin one way, stdout and the exit status the other.
            let mut shell = tokio::process::Command::new(kubectl())
                .arg("--kubeconfig")
                .arg(&kc)
                .args(["exec", "-i", "web-0", "-n", APP_NS, "--", "sh"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            {
                use tokio::io::AsyncWriteExt;
                let mut stdin = shell.stdin.take().unwrap();
                stdin.write_all(b"whoami\necho via ").await.unwrap();
                stdin
                    .write_all(format!("{replica}\nexit 3\n").as_bytes())
                    .await
                    .unwrap();
            }
            let o = tokio::time::timeout(T, shell.wait_with_output())
                .await
                .map_err(|_| format!("{via}: exec -i sh did not end"))?
                .unwrap();
            let out = String::from_utf8_lossy(&o.stdout).to_string();
            if o.status.code() != Some(3)
                || !out.contains("root")
                || !out.contains(&format!("via {replica}"))
            {
                return Err(format!("{via}: exec -i sh: {}", output_text(&o)));
            }

            // A request already forwarded once is not forwarded again.
            let url = format!(
                "https://127.0.0.1:{port}/agents/{agent}/api/v1/namespaces/{APP_NS}/configmaps/web-config"
            );
            let (code, body) = curl_status(
                &url,
                &token,
                &ca_path,
                &["x-argocd-agent-forwarded-by: elsewhere"],
            )
            .await;
            let want = if replica == holder { 200 } else { 502 };
            if code != want {
                return Err(format!(
                    "{via}: with the forwarded-by header: {code} {body}"
                ));
            }
            let (code, body) = curl_status(&url, &token, &ca_path, &[]).await;
            if code != 200 {
                return Err(format!("{via}: curl: {code} {body}"));
            }

            // Writes: kubectl's patch, and a chunked HTTP/1.1 body streamed through.
            let patch = format!(r#"{{"data":{{"kubectl-{i}":"{replica}"}}}}"#);
            let o = run_kubectl(
                &kc,
                &[
                    "patch",
                    "configmap",
                    "web-config",
                    "-n",
                    APP_NS,
                    "--type",
                    "merge",
                    "-p",
                    &patch,
                ],
            )
            .await;
            if !o.status.success() {
                return Err(format!("{via}: patch: {}", output_text(&o)));
            }
            let chunked = format!(r#"{{"data":{{"chunked-{i}":"{replica}"}}}}"#);
            let (code, body) = curl_status(
                &url,
                &token,
                &ca_path,
                &[
                    "Transfer-Encoding: chunked",
                    "Content-Type: application/merge-patch+json",
                    "--http1.1",
                    "-X",
                    "PATCH",
                    "--data-binary",
                    &chunked,
                ],
            )
            .await;
            if code != 200 {
                return Err(format!("{via}: chunked patch: {code} {body}"));
            }
            let stored = core_api(&topo.spokes[agent], APP_NS, "configmaps", "ConfigMap")
                .get("web-config")
                .await
                .map_err(|e| e.to_string())?;
            for key in [format!("kubectl-{i}"), format!("chunked-{i}")] {
                if stored.data["data"][&key] != replica.as_str() {
                    return Err(format!("{via}: {key} not written: {:?}", stored.data));
                }
            }
        }
    }

    // Replicas that do not serve an agent counted what they forwarded; the others nothing.
    for r in &topo.replicas {
        let forwarded = metric_sum(
            r.metrics_port,
            "argocd_principal_resource_proxy_forwarded_total",
        )
        .await;
        let serves_all = AGENTS.iter().all(|a| holders[*a] == r.name);
        if serves_all != (forwarded == 0.0) {
            return Err(format!(
                "{}: forwarded {forwarded} (holders {holders:?})",
                r.name
            ));
        }
    }

    // The replica serving the first agent dies (kill -9): once another one took the agent
    // over, every surviving replica answers for it again.
    let agent = AGENTS[0];
    let dead = topo
        .replicas
        .iter()
        .position(|r| r.name == holders[agent])
        .unwrap();
    topo.kill_replica(dead).await;
    let kubeconfig = kubeconfig_json(topo, agent).await;
    for (i, port) in ports.iter().enumerate().filter(|(i, _)| *i != dead) {
        let kc = kubeconfig_for(topo, &kubeconfig, agent, *port);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let o = run_kubectl(&kc, &["get", "configmap", "web-config", "-n", APP_NS]).await;
            if o.status.success() {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{agent} via {} after {} died: {}",
                    topo.replicas[i].name,
                    topo.replicas[dead].name,
                    output_text(&o)
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let o = run_kubectl(&kc, &["exec", "web-0", "-n", APP_NS, "--", "pwd"]).await;
        if !o.status.success() {
            return Err(format!(
                "{agent} via {}: exec after failover: {}",
                topo.replicas[i].name,
                output_text(&o)
            ));
        }
    }
    let now = topo.holders().await.unwrap_or_default();
    if now.get(agent) == Some(&holders[agent]) {
        return Err(format!("{agent} still held by the dead replica: {now:?}"));
    }
    Ok(())
}
