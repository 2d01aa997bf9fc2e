//! The spoke guard, end to end with the real binaries: a compromised hub (full write access
//! to the hub's API) writes an Application from a foreign repository targeting
//! `kube-system`, widens an AppProject to `*`, points a repository Secret at a foreign URL
//! and writes a ConfigMap named like the guard's: nothing of it lands on the guarded spoke,
//! the hub copies carry Argo CD's `InvalidSpecError` condition naming the rule, the agent
//! counts each refusal, and legitimate changes keep flowing. A live change of the guard's
//! ConfigMap takes effect (what it refused arrives), a broken one keeps the last good
//! policy, and a broken policy or a guard ConfigMap the hub writes stops the agent at start.

use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(25);
const GUARD_CM: &str = "argocd-agent-spoke-guard";
const ALLOWED_REPO: &str = "https://github.com/argoproj/argocd-example-apps";

async fn run(f: impl AsyncFnOnce(&mut Topology) -> Result<(), HarnessError>) {
    let mut topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        per_agent_args: vec![(
            MANAGED,
            vec![
                format!("--guard-configmap={GUARD_CM}"),
                "--guard-reload-interval=500ms".into(),
                "--guard-allowed-projects=default,team".into(),
            ],
        )],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = f(&mut topo).await;
    // Also checks that what is left (the conditions included) passes Argo CD's schemas.
    topo.finish(r).await;
}

fn guard_configmap(policy: &str) -> kube::api::DynamicObject {
    object(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": GUARD_CM, "namespace": SPOKE_NS},
        "data": {"guard.yaml": policy}}))
}

const POLICY: &str = "sourceRepos: ['https://github.com/argoproj/*']\n\
destinations: [{namespace: 'guestbook*'}]\n\
clusterResources: false\n";

/// Writes the guard's ConfigMap on the spoke and waits until the agent reloaded it.
async fn set_policy(topo: &Topology, policy: &str, nth: usize) -> Result<(), HarnessError> {
    let cms = configmaps(&topo.managed_spoke, SPOKE_NS)?;
    match stored_configmap(&topo.managed_spoke, SPOKE_NS, GUARD_CM) {
        None => {
            cms.create(&PostParams::default(), &guard_configmap(policy))
                .await?;
        }
        Some(_) => merge_patch(&cms, GUARD_CM, json!({"data": {"guard.yaml": policy}})).await?,
    }
    eventually("the agent reloads the guard", T, || async {
        (topo.logs().matches("spoke guard reloaded").count() >= nth).then_some(())
    })
    .await?;
    Ok(())
}

fn condition(app: &Value) -> Option<String> {
    app["status"]["conditions"]
        .as_array()?
        .iter()
        .find_map(|c| {
            (c["type"] == "InvalidSpecError")
                .then(|| c["message"].as_str().unwrap_or_default().to_owned())
        })
}

fn app(name: &str, repo: &str, namespace: &str) -> kube::api::DynamicObject {
    let mut a = sample_app(name, MANAGED, "guestbook");
    a.data["spec"]["source"]["repoURL"] = json!(repo);
    a.data["spec"]["destination"]["namespace"] = json!(namespace);
    a
}

async fn refused_total(topo: &Topology) -> f64 {
    metric_sum(
        topo.metrics_ports[MANAGED],
        "argocd_agent_guard_refused_total",
    )
    .await
}

/// Waits for the hub copy of `name` to carry the guard's condition naming `rule`.
async fn hub_condition(topo: &Topology, name: &str, rule: &str) -> Result<String, HarnessError> {
    eventually(
        &format!("hub copy of {name} carries the guard's condition ({rule})"),
        T,
        || async {
            stored_app(&topo.hub, MANAGED, name)
                .as_ref()
                .and_then(condition)
                .filter(|m| m.contains(&format!("rule {rule}")))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compromised_hub_cannot_write_past_the_guard() {
    run(async |topo| {
        set_policy(topo, POLICY, 1).await?;
        let hub_apps = apps(&topo.hub, MANAGED)?;
        let spoke = &topo.managed_spoke;
        let pp = PostParams::default();

        // Legitimate work flows.
        hub_apps.create(&pp, &app("guestbook", ALLOWED_REPO, "guestbook")).await?;
        eventually("an allowed application reaches the spoke", T, || async {
            stored_app(spoke, SPOKE_NS, "guestbook")
        })
        .await?;

        // The hub writes an Application from a foreign repository into kube-system, and
        // one from an allowed repository into kube-system.
        hub_apps.create(&pp, &app("evil", "https://evil.example.com/pwn", "kube-system")).await?;
        hub_apps.create(&pp, &app("evil-ns", ALLOWED_REPO, "kube-system")).await?;
        let m = hub_condition(topo, "evil", "source-repos").await?;
        assert!(m.contains("https://evil.example.com/pwn"), "{m}");
        let m = hub_condition(topo, "evil-ns", "destinations").await?;
        assert!(m.contains("kube-system"), "{m}");
        // The hub turns the allowed application to a foreign repository: the spoke keeps
        // what it had.
        merge_patch(&hub_apps, "guestbook", json!({"spec": {"source": {"repoURL": "https://evil.example.com/pwn"}}})).await?;
        hub_condition(topo, "guestbook", "source-repos").await?;

        // The hub widens the default project to everything.
        projects(&topo.hub, HUB_ARGOCD_NS)?
            .create(&pp, &object(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "default", "namespace": HUB_ARGOCD_NS},
                "spec": {"sourceRepos": ["*"], "destinations": [{"namespace": "*", "server": "*"}],
                         "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]}})))
            .await?;
        let p = eventually("the narrowed project reaches the spoke", T, || async {
            stored_project(spoke, SPOKE_NS, "default")
        })
        .await?;
        assert_eq!(p["spec"]["sourceRepos"], json!(["https://github.com/argoproj/*"]), "{p}");
        assert_eq!(p["spec"]["clusterResourceWhitelist"], json!([]), "{p}");
        for d in p["spec"]["destinations"].as_array().unwrap() {
            assert_eq!(d["namespace"], "guestbook*", "{p}");
        }
        // A project the guard does not allow is not written.
        projects(&topo.hub, HUB_ARGOCD_NS)?
            .create(&pp, &object(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "ops", "namespace": HUB_ARGOCD_NS},
                "spec": {"sourceNamespaces": [MANAGED], "sourceRepos": ["*"],
                         "destinations": [{"namespace": "*", "server": "*"}]}})))
            .await?;

        // A repository Secret: allowed, then pointed at a foreign URL.
        let hub_secrets = secrets(&topo.hub, HUB_ARGOCD_NS)?;
        hub_secrets
            .create(&pp, &object(json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "example-apps", "namespace": HUB_ARGOCD_NS,
                             "labels": {"argocd.argoproj.io/secret-type": "repository"}},
                "stringData": {"project": "default", "url": ALLOWED_REPO, "type": "git", "password": "token"}})))
            .await?;
        eventually("an allowed repository reaches the spoke", T, || async {
            stored_secret(spoke, SPOKE_NS, "example-apps")
        })
        .await?;
        merge_patch(&hub_secrets, "example-apps", json!({"stringData": {"url": "https://evil.example.com/pwn"}})).await?;

        // The hub writes a ConfigMap named like the guard's, here and in the agent's namespace.
        for ns in [HUB_ARGOCD_NS, MANAGED] {
            configmaps(&topo.hub, ns)?
                .create(&pp, &object(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": GUARD_CM, "namespace": ns},
                    "data": {"guard.yaml": "{}"}})))
                .await?;
        }

        // Each refusal is counted: two applications, one edit, one project, one Secret.
        eventually("the agent counts every refusal", T, || async {
            (refused_total(topo).await >= 5.0).then_some(())
        })
        .await?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(stored_app(spoke, SPOKE_NS, "evil").is_none(), "foreign repository landed");
        assert!(stored_app(spoke, SPOKE_NS, "evil-ns").is_none(), "kube-system application landed");
        let kept = stored_app(spoke, SPOKE_NS, "guestbook").unwrap();
        assert_eq!(kept["spec"]["source"]["repoURL"], ALLOWED_REPO, "refused edit landed");
        assert!(stored_project(spoke, SPOKE_NS, "ops").is_none(), "project outside the guard landed");
        let secret = stored_secret(spoke, SPOKE_NS, "example-apps").unwrap();
        assert_eq!(cluster_secret_field(&secret, "url"), ALLOWED_REPO, "foreign repository URL landed");
        let guard = stored_configmap(spoke, SPOKE_NS, GUARD_CM).unwrap();
        assert_eq!(guard["data"]["guard.yaml"], POLICY, "the guard's ConfigMap changed");
        let text = http_get(topo.metrics_ports[MANAGED], "/metrics").await?;
        for rule in ["source-repos", "destinations", "projects"] {
            assert!(
                text.lines().any(|l| l.starts_with("argocd_agent_guard_refused_total") && l.contains(&format!("rule=\"{rule}\""))),
                "{rule} not counted:\n{text}"
            );
        }

        // Legitimate changes keep flowing: the hub puts guestbook back on an allowed
        // repository with a new path (the condition goes), and a new application arrives.
        merge_patch(&hub_apps, "guestbook", json!({"spec": {"source": {"repoURL": ALLOWED_REPO, "path": "helm-guestbook"}}})).await?;
        eventually("the allowed edit reaches the spoke", T, || async {
            stored_app(spoke, SPOKE_NS, "guestbook").filter(|a| a["spec"]["source"]["path"] == "helm-guestbook")
        })
        .await?;
        eventually("the condition leaves the hub copy", T, || async {
            stored_app(&topo.hub, MANAGED, "guestbook").filter(|a| condition(a).is_none())
        })
        .await?;
        hub_apps.create(&pp, &app("guestbook-2", ALLOWED_REPO, "guestbook-2")).await?;
        eventually("a new allowed application reaches the spoke", T, || async {
            stored_app(spoke, SPOKE_NS, "guestbook-2")
        })
        .await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_guard_change_takes_effect_and_a_broken_one_keeps_the_last_good_policy() {
    run(async |topo| {
        set_policy(topo, POLICY, 1).await?;
        let hub_apps = apps(&topo.hub, MANAGED)?;
        let spoke = &topo.managed_spoke;
        let pp = PostParams::default();
        let gitlab = "https://gitlab.example.com/team/app";
        hub_apps
            .create(&pp, &app("team-app", gitlab, "guestbook"))
            .await?;
        hub_condition(topo, "team-app", "source-repos").await?;
        assert!(stored_app(spoke, SPOKE_NS, "team-app").is_none());

        // The spoke's owner allows the repository: what was refused arrives.
        let wider = POLICY.replace(
            "['https://github.com/argoproj/*']",
            "['https://github.com/argoproj/*', 'https://gitlab.example.com/team/*']",
        );
        set_policy(topo, &wider, 2).await?;
        eventually(
            "the refused application arrives after the guard allows it",
            T,
            || async { stored_app(spoke, SPOKE_NS, "team-app") },
        )
        .await?;
        eventually("its condition leaves the hub copy", T, || async {
            stored_app(&topo.hub, MANAGED, "team-app").filter(|a| condition(a).is_none())
        })
        .await?;

        // A broken update is refused (counted) and the last good policy stays.
        let errors = "argocd_agent_guard_reload_errors_total";
        let cms = configmaps(spoke, SPOKE_NS)?;
        merge_patch(
            &cms,
            GUARD_CM,
            json!({"data": {"guard.yaml": "sourceRepo: ['*']\n"}}),
        )
        .await?;
        eventually("the broken guard update is counted", T, || async {
            (metric_sum(topo.metrics_ports[MANAGED], errors).await >= 1.0).then_some(())
        })
        .await?;
        assert!(
            topo.logs().contains("sourceRepo"),
            "the log names the field"
        );
        hub_apps
            .create(
                &pp,
                &app("still-refused", "https://evil.example.com/pwn", "guestbook"),
            )
            .await?;
        hub_condition(topo, "still-refused", "source-repos").await?;
        assert!(stored_app(spoke, SPOKE_NS, "still-refused").is_none());
        Ok(())
    })
    .await;
}

/// The agent's exit status and stderr with `args` (it must stop before connecting).
async fn agent_refuses(args: &[&str]) -> String {
    let out = tokio::process::Command::new(binary("argocd-agent").unwrap())
        .args([
            "agent",
            "--server-address",
            "127.0.0.1:1",
            "--principal-trust-domain",
            "example.org",
            "--spiffe-endpoint-socket",
            "unix:///nonexistent/agent.sock",
        ])
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success(), "the agent started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn a_broken_policy_or_a_guard_configmap_the_hub_writes_stops_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("guard.yaml");
    std::fs::write(
        &bad,
        "sourceRepos: ['https://ok/*']\ndestinations: [{namespace: 'a', cluster: 'x'}]\n",
    )
    .unwrap();
    let e = agent_refuses(&["--guard-file", bad.to_str().unwrap()]).await;
    assert!(e.contains("cluster") && e.contains("guard.yaml"), "{e}");
    let e = agent_refuses(&["--guard-configmap", "argocd-gpg-keys-cm"]).await;
    assert!(e.contains("--guard-configmap"), "{e}");
    let e = agent_refuses(&["--guard-allowed-destinations", "server=x;cluster=y"]).await;
    assert!(e.contains("unknown field"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autonomous_spoke_refuses_hub_syncs_that_break_its_guard() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![AUTONOMOUS]),
        per_agent_args: vec![(
            AUTONOMOUS,
            vec!["--guard-allowed-repos=https://github.com/argoproj/*".into()],
        )],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let spoke_apps = apps(&topo.autonomous_spoke, SPOKE_NS)?;
        let hub_apps = apps(&topo.hub, AUTONOMOUS)?;
        let pp = PostParams::default();
        // The spoke's own Applications: one within the guard, one outside it.
        for (name, repo) in [("local-ok", ALLOWED_REPO), ("local-foreign", "https://evil.example.com/pwn")] {
            let mut a = sample_app(name, SPOKE_NS, "guestbook");
            a.data["spec"]["source"]["repoURL"] = json!(repo);
            spoke_apps.create(&pp, &a).await?;
            eventually(&format!("{name} is published"), T, || async { stored_app(&topo.hub, AUTONOMOUS, name) }).await?;
        }
        let sync = json!({"operation": {"initiatedBy": {"username": "hub"}, "sync": {"revision": "v2"}}});
        merge_patch(&hub_apps, "local-foreign", sync.clone()).await?;
        // A sync that overrides the source with a foreign repository.
        let foreign_source = json!({"operation": {"initiatedBy": {"username": "hub"},
            "sync": {"revision": "v3", "source": {"repoURL": "https://evil.example.com/pwn", "path": "."}}}});
        merge_patch(&hub_apps, "local-ok", foreign_source).await?;
        let port = topo.metrics_ports[AUTONOMOUS];
        eventually("both syncs are refused and counted", T, || async {
            (metric_sum(port, "argocd_agent_guard_refused_total").await >= 2.0).then_some(())
        })
        .await?;
        let text = http_get(port, "/metrics").await?;
        assert!(text.contains("kind=\"Operation\""), "{text}");
        for name in ["local-foreign", "local-ok"] {
            let a = stored_app(&topo.autonomous_spoke, SPOKE_NS, name).unwrap();
            assert!(a.get("operation").is_none_or(Value::is_null), "{name}: a refused sync landed: {a}");
        }
        // A sync within the guard still reaches the spoke. `source: null`: the refused
        // operation may still be on the hub copy, and a merge patch would keep its foreign
        // source.
        let allowed = json!({"operation": {"initiatedBy": {"username": "hub"},
            "sync": {"revision": "v2", "source": null}}});
        merge_patch(&hub_apps, "local-ok", allowed).await?;
        eventually("an allowed sync reaches the spoke", T, || async {
            stored_app(&topo.autonomous_spoke, SPOKE_NS, "local-ok")
                .filter(|a| a["operation"]["sync"]["revision"] == "v2")
        })
        .await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
