//! The resource proxy end to end: the real principal (with `--enable-resource-proxy
//! --enable-self-cluster-registration`), a managed and an autonomous agent, and the real
//! `kubectl` using the kubeconfig `argocd-agentctl agent kubeconfig` writes from each
//! agent's cluster secret — exactly what argocd-server would use.
//!
//! kubectl comes from `KUBECTL`, the project virtualenv or PATH (`.ci/run` installs it).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const T: Duration = Duration::from_secs(30);
const APP_NS: &str = "guestbook";

fn api(
    server: &argocd_agent_kube_test_server::KubeTestServer,
    plural: &str,
    kind: &str,
) -> Api<DynamicObject> {
    core_api(server, APP_NS, plural, kind)
}

/// A ConfigMap and a Pod Argo CD manages for Application `app` (label tracking), and a
/// ConfigMap it does not manage, on `spoke`.
async fn seed(spoke: &argocd_agent_kube_test_server::KubeTestServer, app: &str) {
    create_namespace(spoke, APP_NS).await.unwrap();
    let cms = api(spoke, "configmaps", "ConfigMap");
    for (name, labels) in [
        ("web-config", json!({"app.kubernetes.io/instance": app})),
        ("unmanaged", json!({})),
    ] {
        let cm = object(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": APP_NS, "labels": labels},
            "data": {"greeting": "hello"}}));
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let pod = object(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-0", "namespace": APP_NS,
            "labels": {"app.kubernetes.io/instance": app}},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}}));
    api(spoke, "pods", "Pod")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    spoke.set_pod_log(APP_NS, "web-0", "web", "first line\nsecond line\n");
}

fn kubeconfig_token(path: &Path) -> (String, String) {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    (
        v["clusters"][0]["cluster"]["server"]
            .as_str()
            .unwrap()
            .to_owned(),
        v["users"][0]["user"]["token"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_reaches_managed_and_autonomous_spokes_through_the_principal_and_nothing_else() {
    let port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let topo = Topology::start(TopologyOptions {
        principal_args: vec![
            "--enable-resource-proxy".into(),
            "--resource-proxy-address".into(),
            format!("127.0.0.1:{port}"),
            "--enable-self-cluster-registration".into(),
            "--resource-proxy-request-timeout".into(),
            "10s".into(),
        ],
        // Keep logs somewhere known when asked (debugging).
        dir: std::env::var_os("E2E_DIR").map(PathBuf::from),
        ..Default::default()
    })
    .await
    .unwrap();
    topo.wait_connected(MANAGED, T).await.unwrap();
    topo.wait_connected(AUTONOMOUS, T).await.unwrap();

    // Applications each agent holds: hub-authored for the managed one, local for the other.
    apps(&topo.hub, MANAGED)
        .unwrap()
        .create(
            &PostParams::default(),
            &sample_app("web", MANAGED, "guestbook"),
        )
        .await
        .unwrap();
    apps(&topo.autonomous_spoke, SPOKE_NS)
        .unwrap()
        .create(
            &PostParams::default(),
            &sample_app("shop", SPOKE_NS, "guestbook"),
        )
        .await
        .unwrap();
    eventually("the managed Application on its spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "web")
    })
    .await
    .expect("the managed Application reaches its spoke");
    seed(&topo.managed_spoke, "web").await;
    seed(&topo.autonomous_spoke, "shop").await;

    // 1. Cluster secrets, created on connect, pointing at the proxy.
    for agent in [MANAGED, AUTONOMOUS] {
        let secret = eventually("a cluster secret", T, || async {
            stored_secret(&topo.hub, HUB_ARGOCD_NS, &format!("cluster-{agent}"))
        })
        .await
        .unwrap_or_else(|e| panic!("no cluster secret for {agent}: {e}"));
        assert_eq!(
            secret["metadata"]["labels"]["argocd.argoproj.io/secret-type"],
            "cluster"
        );
        assert_eq!(
            secret["metadata"]["labels"]["argocd-agent.argoproj-labs.io/agent-name"],
            agent
        );
    }
    let managed_kc = agent_kubeconfig(&topo.dir, MANAGED).await;
    let autonomous_kc = agent_kubeconfig(&topo.dir, AUTONOMOUS).await;
    let (managed_url, managed_token) = kubeconfig_token(&managed_kc);
    assert_eq!(
        managed_url,
        format!("https://127.0.0.1:{port}/agents/{MANAGED}")
    );

    // 2. Reads and writes of managed objects, on both spokes.
    for (kc, spoke) in [
        (&managed_kc, &topo.managed_spoke),
        (&autonomous_kc, &topo.autonomous_spoke),
    ] {
        let o = run_kubectl(kc, &["get", "configmap", "web-config", "-n", APP_NS]).await;
        assert!(o.status.success(), "get: {}", output_text(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("web-config"));
        let o = run_kubectl(
            kc,
            &["get", "configmap", "web-config", "-n", APP_NS, "-o", "yaml"],
        )
        .await;
        assert!(o.status.success(), "get -o yaml: {}", output_text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("greeting: hello"),
            "{}",
            output_text(&o)
        );
        // A list shows only what Argo CD manages.
        let o = run_kubectl(kc, &["get", "configmaps", "-n", APP_NS, "-o", "name"]).await;
        assert!(o.status.success(), "list: {}", output_text(&o));
        let listed = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            listed.contains("configmap/web-config") && !listed.contains("unmanaged"),
            "{listed}"
        );
        let o = run_kubectl(
            kc,
            &[
                "patch",
                "configmap",
                "web-config",
                "-n",
                APP_NS,
                "--type",
                "merge",
                "-p",
                r#"{"data":{"greeting":"patched"}}"#,
            ],
        )
        .await;
        assert!(o.status.success(), "patch: {}", output_text(&o));
        let cm = api(spoke, "configmaps", "ConfigMap")
            .get("web-config")
            .await
            .unwrap();
        assert_eq!(cm.data["data"]["greeting"], "patched");
        // Not managed by Argo CD: 403, and unchanged.
        let o = run_kubectl(kc, &["get", "configmap", "unmanaged", "-n", APP_NS]).await;
        assert!(
            !o.status.success(),
            "unmanaged get must fail: {}",
            output_text(&o)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr)
                .to_lowercase()
                .contains("forbidden"),
            "{}",
            output_text(&o)
        );
        let o = run_kubectl(kc, &["delete", "configmap", "unmanaged", "-n", APP_NS]).await;
        assert!(
            !o.status.success(),
            "unmanaged delete must fail: {}",
            output_text(&o)
        );
        assert!(
            api(spoke, "configmaps", "ConfigMap")
                .get("unmanaged")
                .await
                .is_ok()
        );
        // Logs, and exec.
        let o = run_kubectl(kc, &["logs", "web-0", "-n", APP_NS]).await;
        assert!(o.status.success(), "logs: {}", output_text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "first line\nsecond line\n"
        );
        let o = run_kubectl(kc, &["exec", "web-0", "-n", APP_NS, "--", "pwd"]).await;
        assert!(o.status.success(), "exec pwd: {}", output_text(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "/");
    }

    // 3. logs -f: lines appended on the spoke arrive, nothing repeats.
    let mut follow = tokio::process::Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(&managed_kc)
        .args(["logs", "-f", "web-0", "-n", APP_NS])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for i in 0..2 {
        seen.push(
            tokio::time::timeout(T, lines.next_line())
                .await
                .unwrap()
                .unwrap()
                .unwrap_or_else(|| panic!("line {i}")),
        );
    }
    topo.managed_spoke
        .append_pod_log(APP_NS, "web-0", "web", "third line\n");
    seen.push(
        tokio::time::timeout(T, lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap(),
    );
    assert_eq!(seen, ["first line", "second line", "third line"]);
    // The agent's connection is cut: the follow resumes without repeating a line.
    let _ = http_post_admin_disconnect(&topo, MANAGED).await;
    topo.managed_spoke
        .append_pod_log(APP_NS, "web-0", "web", "fourth line\n");
    let next = tokio::time::timeout(T, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next, "fourth line", "after the reconnect");
    follow.kill().await.ok();

    // 4. exec -it under a pty.
    if which("script") {
        let cmd = format!(
            "{} --kubeconfig {} exec -it web-0 -n {APP_NS} -- sh",
            kubectl().display(),
            managed_kc.display()
        );
        let mut child = tokio::process::Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        stdin.write_all(b"whoami\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        stdin.write_all(b"exit 3\n").await.unwrap();
        let out = tokio::time::timeout(T, child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("root"),
            "{}",
            output_text(&out)
        );
        assert_eq!(out.status.code(), Some(3), "{}", output_text(&out));
    } else {
        eprintln!("skipping exec -it: `script` (util-linux) is not installed");
    }

    // 5. Agent A's credential with agent B's URL: refused, nothing on B changes.
    let b_url = format!("https://127.0.0.1:{port}/agents/{AUTONOMOUS}");
    let forged = topo.dir.join("forged.kubeconfig");
    let ca = serde_json::from_str::<Value>(&std::fs::read_to_string(&managed_kc).unwrap()).unwrap()
        ["clusters"][0]["cluster"]["certificate-authority-data"]
        .clone();
    std::fs::write(
        &forged,
        json!({"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "b", "cluster": {"server": b_url, "certificate-authority-data": ca}}],
            "users": [{"name": "a", "user": {"token": managed_token}}],
            "contexts": [{"name": "x", "context": {"cluster": "b", "user": "a"}}],
            "current-context": "x"})
        .to_string(),
    )
    .unwrap();
    let o = run_kubectl(
        &forged,
        &["delete", "configmap", "web-config", "-n", APP_NS],
    )
    .await;
    assert!(
        !o.status.success(),
        "cross-agent delete must fail: {}",
        output_text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .to_lowercase()
            .contains("forbidden"),
        "{}",
        output_text(&o)
    );
    assert!(
        api(&topo.autonomous_spoke, "configmaps", "ConfigMap")
            .get("web-config")
            .await
            .is_ok()
    );

    // 6. Delete through the proxy.
    let o = run_kubectl(
        &managed_kc,
        &["delete", "configmap", "web-config", "-n", APP_NS],
    )
    .await;
    assert!(o.status.success(), "delete: {}", output_text(&o));
    assert!(
        api(&topo.managed_spoke, "configmaps", "ConfigMap")
            .get("web-config")
            .await
            .is_err()
    );

    // 7. A terminal session's UUID presented by another agent: refused; the session goes on.
    replayed_session_is_refused(&topo, &managed_kc).await;

    // 8. The agent offline: 502.
    let mut topo = topo;
    if let Some(p) = topo.autonomous.as_mut() {
        p.stop().await;
    }
    let o = eventually("the offline agent reported", T, || async {
        let o = run_kubectl(
            &autonomous_kc,
            &["get", "configmap", "web-config", "-n", APP_NS],
        )
        .await;
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        eprintln!("kubectl with the agent offline: {err}");
        (err.contains("not connected") || err.contains("unable to handle the request")).then_some(o)
    })
    .await
    .expect("an offline agent is reported");
    assert!(!o.status.success());
    topo.stop().await;
}

/// Opens an interactive exec through the proxy, takes its session UUID from the principal's
/// log, and presents it on a `Tunnel.Terminal` stream with the autonomous agent's SVID.
async fn replayed_session_is_refused(topo: &Topology, kubeconfig: &Path) {
    use argocd_agent_proto::eventstream::TerminalFrame;
    use argocd_agent_proto::eventstream::tunnel_client::TunnelClient;
    use tokio::io::AsyncWriteExt;

    let before = topo.logs().matches("terminal session opened").count();
    let mut shell = tokio::process::Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["exec", "-i", "web-0", "-n", APP_NS, "--", "sh"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let session = eventually(
        "the interactive session's id in the principal's log",
        T,
        || async {
            let log = std::fs::read_to_string(topo.dir.join("principal.log")).unwrap_or_default();
            log.lines()
                .filter(|l| l.contains("terminal session opened"))
                .nth(before)
                .and_then(|l| l.split("session=").nth(1))
                .and_then(|r| r.split_whitespace().next())
                .map(str::to_owned)
        },
    )
    .await
    .unwrap();
    let source = topo.svid_source("autonomous.sock").await.unwrap();
    let channel = dial_principal(&source, topo.principal_addr).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(TerminalFrame {
        session_id: session.clone(),
        channel: 0,
        data: Vec::new(),
    })
    .await
    .unwrap();
    let replay = TunnelClient::new(channel)
        .terminal(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await;
    let status = replay.expect_err("another agent must not attach to the session");
    assert!(
        matches!(
            status.code(),
            tonic::Code::PermissionDenied | tonic::Code::NotFound
        ),
        "{status:?}"
    );
    // The real session is unaffected.
    let mut stdin = shell.stdin.take().unwrap();
    stdin.write_all(b"whoami\nexit\n").await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(T, shell.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "root");
}

fn which(cmd: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Cuts the agent's session through the principal's admin API (it reconnects by itself).
async fn http_post_admin_disconnect(topo: &Topology, agent: &str) -> bool {
    let out = tokio::process::Command::new(binary("argocd-agentctl").unwrap())
        .args([
            "agent",
            "disconnect",
            agent,
            "--admin-address",
            &topo.admin_address,
        ])
        .output()
        .await
        .unwrap();
    out.status.success()
}

/// The Kubernetes API of `kind` in `group/version` on `server`, in namespace `ns`.
fn typed_api(
    server: &argocd_agent_kube_test_server::KubeTestServer,
    (group, version, kind, plural): (&str, &str, &str, &str),
    ns: &str,
) -> Api<DynamicObject> {
    Api::namespaced_with(
        kube_client(server).unwrap(),
        ns,
        &kube::api::ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: format!("{group}/{version}"),
            kind: kind.into(),
            plural: plural.into(),
        },
    )
}

/// The user the managed agent's kubeconfig names on its spoke (its context name).
const SPOKE_USER: &str = "managed";
const CRONJOBS: (&str, &str, &str, &str) = ("batch", "v1", "CronJob", "cronjobs");
const JOBS: (&str, &str, &str, &str) = ("batch", "v1", "Job", "jobs");

/// `kubectl create -f` of `body` through the proxy (`extra` flags added).
async fn kubectl_create(
    kc: &Path,
    dir: &Path,
    name: &str,
    body: Value,
    extra: &[&str],
) -> std::process::Output {
    let file = dir.join(format!("{name}.json"));
    std::fs::write(&file, body.to_string()).unwrap();
    let mut args = vec!["create", "--validate=false", "-f", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    run_kubectl(kc, &args).await
}

/// What a token may create on its agent's cluster: what Argo CD's create-job action makes
/// of a managed CronJob (dry run, then for real), and none of the objects of the issue —
/// a Secret in kube-system, a ClusterRoleBinding to cluster-admin, a Namespace, a privileged
/// Pod — even with an owner reference to that CronJob and the Application's own label and
/// tracking annotation. And `watch=f` never becomes a watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_creates_only_what_a_resource_action_creates() {
    let port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let topo = Topology::start(TopologyOptions {
        principal_args: vec![
            "--enable-resource-proxy".into(),
            "--resource-proxy-address".into(),
            format!("127.0.0.1:{port}"),
            "--enable-self-cluster-registration".into(),
            "--resource-proxy-request-timeout".into(),
            "10s".into(),
        ],
        agents: Some(vec![MANAGED]),
        spoke_resources: vec![
            argocd_agent_kube_test_server::ResourceType::new(
                "batch", "v1", "cronjobs", "CronJob", true, true,
            )
            .built_in(true),
            argocd_agent_kube_test_server::ResourceType::new(
                "batch", "v1", "jobs", "Job", true, true,
            )
            .built_in(true),
            argocd_agent_kube_test_server::ResourceType::new(
                "rbac.authorization.k8s.io",
                "v1",
                "clusterrolebindings",
                "ClusterRoleBinding",
                false,
                false,
            )
            .built_in(false),
        ],
        dir: std::env::var_os("E2E_DIR").map(PathBuf::from),
        ..Default::default()
    })
    .await
    .unwrap();
    topo.wait_connected(MANAGED, T).await.unwrap();
    // Application `web` deploys to namespace `web` (sample_app).
    apps(&topo.hub, MANAGED)
        .unwrap()
        .create(
            &PostParams::default(),
            &sample_app("web", MANAGED, "guestbook"),
        )
        .await
        .unwrap();
    eventually("the managed Application on its spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "web")
    })
    .await
    .expect("the managed Application reaches its spoke");
    let spoke = &topo.managed_spoke;
    create_namespace(spoke, "web").await.unwrap();
    let pod_spec =
        json!({"restartPolicy": "Never", "containers": [{"name": "run", "image": "busybox"}]});
    let cronjob = typed_api(spoke, CRONJOBS, "web")
        .create(
            &PostParams::default(),
            &object(json!({"apiVersion": "batch/v1", "kind": "CronJob",
                "metadata": {"name": "nightly", "namespace": "web",
                    "labels": {"app.kubernetes.io/instance": "web"}},
                "spec": {"schedule": "0 1 * * *",
                    "jobTemplate": {"spec": {"template": {"spec": pod_spec}}}}})),
        )
        .await
        .unwrap();
    let uid = cronjob.metadata.uid.clone().unwrap();
    let owner = json!([{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
        "uid": uid, "controller": true, "blockOwnerDeletion": true}]);
    let kc = agent_kubeconfig(&topo.dir, MANAGED).await;

    // Argo CD's create-job action: a Job owned by the CronJob, its spec copied. argocd-server
    // creates it with dryRun=All first.
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "nightly-manual", "namespace": "web",
            "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
            "ownerReferences": owner},
        "spec": {"template": {"spec": pod_spec}}});
    let o = kubectl_create(
        &kc,
        &topo.dir,
        "job-dry",
        job.clone(),
        &["--dry-run=server"],
    )
    .await;
    assert!(
        o.status.success(),
        "dry-run create-job: {}",
        output_text(&o)
    );
    assert!(
        typed_api(spoke, JOBS, "web")
            .get_opt("nightly-manual")
            .await
            .unwrap()
            .is_none()
    );
    let o = kubectl_create(&kc, &topo.dir, "job", job, &[]).await;
    assert!(o.status.success(), "create-job: {}", output_text(&o));
    // The agent's creates (the dry run and the Job) are granted by the narrowed ClusterRole
    // of deploy/components/agent-resource-proxy.
    let creatable = component_creates();
    let job_creates: Vec<_> = spoke
        .requests()
        .into_iter()
        .filter(|r| {
            r.user.as_deref() == Some(SPOKE_USER) && r.verb == "create" && r.resource == "jobs"
        })
        .collect();
    assert_eq!(job_creates.len(), 2, "{job_creates:?}");
    for r in &job_creates {
        assert!(
            creatable.contains(&(r.api_group.clone(), r.resource.clone())),
            "{r:?} is not granted by the agent's resource-proxy ClusterRole ({creatable:?})"
        );
    }
    let created = typed_api(spoke, JOBS, "web")
        .get("nightly-manual")
        .await
        .unwrap();
    assert_eq!(
        created.metadata.owner_references.unwrap()[0].uid,
        cronjob.metadata.uid.unwrap()
    );

    // The attacks: each with the owner reference, the Application's label and its tracking
    // annotation.
    spoke.clear_requests();
    let meta = |name: &str, ns: Option<&str>| {
        let mut m = json!({"name": name, "ownerReferences": owner,
            "labels": {"app.kubernetes.io/instance": "web"},
            "annotations": {"argocd.argoproj.io/tracking-id": format!("web:/X:web/{name}")}});
        if let Some(ns) = ns {
            m["namespace"] = json!(ns);
        }
        m
    };
    let attacks = [
        (
            "secret",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta("loot", Some("kube-system")),
                "stringData": {"k": "v"}}),
        ),
        (
            "crb",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": meta("pwn", None),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "web"}]}),
        ),
        (
            "namespace",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": meta("evil", None)}),
        ),
        (
            "pod",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta("root", Some("web")),
                "spec": {"hostPID": true, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
                    "containers": [{"name": "sh", "image": "busybox",
                        "securityContext": {"privileged": true}}]}}),
        ),
    ];
    for (name, body) in attacks {
        let o = kubectl_create(&kc, &topo.dir, name, body, &[]).await;
        assert!(
            !o.status.success(),
            "{name} must be refused: {}",
            output_text(&o)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("(Forbidden)"),
            "{name}: {}",
            output_text(&o)
        );
    }
    assert!(
        spoke
            .get_object("", "v1", "secrets", Some("kube-system"), "loot")
            .is_none()
    );
    assert!(
        spoke
            .get_object(
                "rbac.authorization.k8s.io",
                "v1",
                "clusterrolebindings",
                None,
                "pwn"
            )
            .is_none()
    );
    assert!(
        spoke
            .get_object("", "v1", "namespaces", None, "evil")
            .is_none()
    );
    assert!(
        spoke
            .get_object("", "v1", "pods", Some("web"), "root")
            .is_none()
    );
    // None of them reached the spoke's API as a create (the agent did look at the owner).
    assert!(
        spoke
            .requests()
            .iter()
            .any(|r| r.user.as_deref() == Some(SPOKE_USER) && r.resource == "cronjobs"),
        "the agent's requests are recorded under its user"
    );
    let creates: Vec<String> = spoke
        .requests()
        .into_iter()
        .filter(|r| r.user.as_deref() == Some(SPOKE_USER) && r.verb == "create")
        .map(|r| format!("{}/{} {:?}", r.api_group, r.resource, r.name))
        .collect();
    assert!(
        creates
            .iter()
            .all(|c| c.starts_with("argoproj.io/applications")
                || c.starts_with("/events")
                || c.starts_with("events.k8s.io/")),
        "{creates:?}"
    );

    // `watch=f` is a watch to the API server: refused.
    for q in ["watch=f", "watch=", "watch"] {
        let path = format!("/api/v1/namespaces/web/pods?{q}");
        let o = run_kubectl(&kc, &["get", "--request-timeout=10s", "--raw", &path]).await;
        assert!(!o.status.success(), "{q}: {}", output_text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("(Forbidden)"),
            "{q}: {}",
            output_text(&o)
        );
    }
    topo.stop().await;
}

/// `(apiGroup, resource)` pairs the agent's resource-proxy ClusterRole grants `create` on
/// (no wildcards: the role names each kind).
fn component_creates() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/components/agent-resource-proxy/rbac.yaml");
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(path).unwrap()).unwrap();
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole")
        .expect("a ClusterRole");
    let list = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        if !list(&rule["verbs"])
            .iter()
            .any(|v| v == "create" || v == "*")
        {
            continue;
        }
        for g in list(&rule["apiGroups"]) {
            for r in list(&rule["resources"]) {
                assert!(
                    g != "*" && r != "*",
                    "create on {g}/{r}: the role grants every kind"
                );
                out.push((g.clone(), r));
            }
        }
    }
    out
}
