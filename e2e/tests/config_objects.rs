//! Everything around the Application, end to end with the real binaries: AppProjects
//! (managed distribution by destination and source-namespace match, deny patterns, the
//! default project, spoke copies, revert; autonomous projects renamed on the hub with
//! rewritten policies, hub edits reverted), repositories and repo-creds (project scoping,
//! late project creation, a project change revokes, never to autonomous agents), GPG keys
//! (adopt a pre-existing ConfigMap, revert), ignore-sync on each kind, and resync of each
//! kind after an agent or principal restart.

use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);
const MANAGED_LABEL: &str = "argocd-agent.argoproj-labs.io/managed-by-principal";
const IGNORE_SYNC: &str = "argocd-agent.argoproj-labs.io/ignore-sync";

async fn run(
    agents: Vec<&'static str>,
    f: impl AsyncFnOnce(&mut Topology) -> Result<(), HarnessError>,
) {
    let mut topo = Topology::start(TopologyOptions {
        agents: Some(agents),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = f(&mut topo).await;
    let mut logs = topo.logs();
    if r.is_err() && std::env::var_os("E2E_DUMP_REQUESTS").is_some() {
        for req in topo.managed_spoke.requests() {
            logs.push_str(&format!("managed spoke request: {req:?}\n"));
        }
    }
    topo.stop().await;
    if let Err(e) = r {
        panic!("{e}\n{logs}");
    }
}

fn project(name: &str, spec: Value) -> kube::api::DynamicObject {
    object(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": name, "namespace": HUB_ARGOCD_NS},
        "spec": spec
    }))
}

fn repo_secret(
    name: &str,
    secret_type: &str,
    project: &str,
    url: &str,
) -> kube::api::DynamicObject {
    object(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": HUB_ARGOCD_NS,
                     "labels": {"argocd.argoproj.io/secret-type": secret_type}},
        "type": "Opaque",
        "stringData": {"project": project, "url": url, "type": "git", "password": "s3cr3t-token"}
    }))
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A project that goes to the managed agent by destination name and source namespace.
fn team_spec() -> Value {
    json!({
        "sourceNamespaces": ["agent-*"],
        "sourceRepos": ["*"],
        "destinations": [{"name": "agent-m*", "namespace": "guestbook", "server": "*"},
                         {"name": "edge-*", "namespace": "edge", "server": "*"}],
        "roles": [{"name": "ci", "policies": ["p, proj:team:ci, applications, sync, team/*, allow"]}]
    })
}

/// Stays quiet for a moment, then checks that `f` still says nothing arrived.
async fn never(what: &str, f: impl Fn() -> bool) -> Result<(), HarnessError> {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    if f() {
        return Err(format!("{what}: it arrived").into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_agent_receives_its_projects_repositories_and_gpg_keys() {
    run(vec![MANAGED, AUTONOMOUS], async |topo| {
        let hub_projects = projects(&topo.hub, HUB_ARGOCD_NS)?;
        let hub_secrets = secrets(&topo.hub, HUB_ARGOCD_NS)?;
        let hub_cms = configmaps(&topo.hub, HUB_ARGOCD_NS)?;
        let spoke = &topo.managed_spoke;
        let pp = PostParams::default();

        // A GPG keys ConfigMap the spoke had before (installed with its Argo CD).
        configmaps(spoke, SPOKE_NS)?
            .create(&pp, &object(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "argocd-gpg-keys-cm", "namespace": SPOKE_NS},
                "data": {"LOCALKEY": "local"}})))
            .await?;

        // Projects: one for the managed agent, one for others only, one denied to it, the
        // default one, one labelled ignore-sync.
        hub_projects.create(&pp, &project("team", team_spec())).await?;
        hub_projects
            .create(&pp, &project("edge-only", json!({"sourceNamespaces": ["*"],
                "destinations": [{"name": "edge-*", "namespace": "*", "server": "*"}]})))
            .await?;
        hub_projects
            .create(&pp, &project("denied", json!({"sourceNamespaces": ["*"],
                "destinations": [{"name": "*", "namespace": "*", "server": "*"}, {"name": "!agent-managed"}]})))
            .await?;
        hub_projects
            .create(&pp, &project("default", json!({"sourceRepos": ["*"],
                "destinations": [{"namespace": "*", "server": "*"}]})))
            .await?;
        hub_projects
            .create(&pp, &object(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "ignored", "namespace": HUB_ARGOCD_NS, "labels": {IGNORE_SYNC: "true"}},
                "spec": {"sourceNamespaces": ["*"], "destinations": [{"name": "*", "server": "*"}]}})))
            .await?;
        let team = eventually("project team reaches the managed spoke", T, || async {
            stored_project(spoke, SPOKE_NS, "team")
        })
        .await?;
        assert_eq!(
            team["spec"]["destinations"],
            json!([{"name": "in-cluster", "namespace": "guestbook", "server": "https://kubernetes.default.svc"}]),
            "only the agent's destinations, in-cluster"
        );
        assert!(team["spec"].get("sourceNamespaces").is_none() && team["spec"].get("roles").is_none());
        assert_eq!(team["metadata"]["labels"][MANAGED_LABEL], "true");
        eventually("default project reaches the managed spoke", T, || async {
            stored_project(spoke, SPOKE_NS, "default")
        })
        .await?;

        // Repositories: scoped to team (repository and repo-creds) or to edge-only.
        hub_secrets.create(&pp, &repo_secret("team-repo", "repository", "team", "https://git.example/team")).await?;
        hub_secrets.create(&pp, &repo_secret("team-creds", "repo-creds", "team", "https://git.example/")).await?;
        hub_secrets.create(&pp, &repo_secret("edge-repo", "repository", "edge-only", "https://git.example/edge")).await?;
        hub_secrets.create(&pp, &repo_secret("late-repo", "repository", "late", "https://git.example/late")).await?;
        let mut ignored = repo_secret("ignored-repo", "repository", "team", "https://git.example/ignored");
        ignored.metadata.labels.get_or_insert_with(Default::default).insert(IGNORE_SYNC.into(), "true".into());
        hub_secrets.create(&pp, &ignored).await?;
        let repo = eventually("team's repository reaches the managed spoke", T, || async {
            stored_secret(spoke, SPOKE_NS, "team-repo")
        })
        .await?;
        assert_eq!(repo["data"]["url"], b64("https://git.example/team"));
        assert_eq!(repo["data"]["password"], b64("s3cr3t-token"));
        assert_eq!(repo["metadata"]["labels"]["argocd.argoproj.io/secret-type"], "repository");
        eventually("team's repo-creds reach the managed spoke", T, || async {
            stored_secret(spoke, SPOKE_NS, "team-creds")
        })
        .await?;

        // GPG keys: the hub's replace (adopt) the spoke's.
        hub_cms
            .create(&pp, &object(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "argocd-gpg-keys-cm", "namespace": HUB_ARGOCD_NS},
                "data": {"4AEE18F83AFDEB23": "-----BEGIN PGP PUBLIC KEY BLOCK-----\nhub\n"}})))
            .await?;
        eventually("hub GPG keys adopt the spoke's ConfigMap", T, || async {
            stored_configmap(spoke, SPOKE_NS, "argocd-gpg-keys-cm").filter(|c| {
                c["data"].get("4AEE18F83AFDEB23").is_some()
                    && c["data"].get("LOCALKEY").is_none()
                    && c["metadata"]["labels"][MANAGED_LABEL] == "true"
            })
        })
        .await?;

        // What is not the managed agent's never arrives; autonomous agents get nothing.
        never("projects and repositories of other agents", || {
            ["edge-only", "denied", "ignored"]
                .iter()
                .any(|p| stored_project(spoke, SPOKE_NS, p).is_some())
                || ["edge-repo", "late-repo", "ignored-repo"]
                    .iter()
                    .any(|s| stored_secret(spoke, SPOKE_NS, s).is_some())
        })
        .await?;
        let auto = &topo.autonomous_spoke;
        assert!(stored_secret(auto, SPOKE_NS, "team-repo").is_none(), "never to autonomous agents");
        assert!(stored_configmap(auto, SPOKE_NS, "argocd-gpg-keys-cm").is_none());
        assert!(stored_project(auto, SPOKE_NS, "default").is_none());

        // Late project creation: the repository follows its project.
        hub_projects
            .create(&pp, &project("late", json!({"sourceNamespaces": ["agent-managed"],
                "destinations": [{"server": "https://proxy:9090?agentName=agent-managed", "namespace": "*"}]})))
            .await?;
        eventually("repository of a late project arrives with it", T, || async {
            stored_secret(spoke, SPOKE_NS, "late-repo")
        })
        .await?;

        // Local edits and deletions on the spoke are reverted.
        let spoke_projects = projects(spoke, SPOKE_NS)?;
        merge_patch(&spoke_projects, "team", json!({"spec": {"sourceRepos": ["https://evil.example/*"]}})).await?;
        eventually("local project edit reverted", T, || async {
            stored_project(spoke, SPOKE_NS, "team").filter(|p| p["spec"]["sourceRepos"] == json!(["*"]))
        })
        .await?;
        secrets(spoke, SPOKE_NS)?.delete("team-repo", &DeleteParams::default()).await?;
        eventually("local repository deletion reverted", T, || async {
            stored_secret(spoke, SPOKE_NS, "team-repo")
        })
        .await?;
        merge_patch(&configmaps(spoke, SPOKE_NS)?, "argocd-gpg-keys-cm", json!({"data": {"EVIL": "x"}})).await?;
        eventually("local GPG keys edit reverted", T, || async {
            stored_configmap(spoke, SPOKE_NS, "argocd-gpg-keys-cm").filter(|c| c["data"].get("EVIL").is_none())
        })
        .await?;

        // Updates and deletes on the hub propagate.
        merge_patch(&hub_secrets, "team-repo", json!({"stringData": {"url": "https://git.example/team-v2"}})).await?;
        eventually("repository update propagates", T, || async {
            stored_secret(spoke, SPOKE_NS, "team-repo")
                .filter(|s| s["data"]["url"] == b64("https://git.example/team-v2"))
        })
        .await?;
        hub_secrets.delete("team-creds", &DeleteParams::default()).await?;
        eventually("repo-creds deletion propagates", T, || async {
            stored_secret(spoke, SPOKE_NS, "team-creds").is_none().then_some(())
        })
        .await?;

        // A project change that stops matching revokes the project and its repositories.
        merge_patch(&hub_projects, "team", json!({"spec": {"destinations": [{"name": "edge-*", "namespace": "*", "server": "*"}]}})).await?;
        eventually("project change revokes project and repositories", T, || async {
            (stored_project(spoke, SPOKE_NS, "team").is_none()
                && stored_secret(spoke, SPOKE_NS, "team-repo").is_none())
            .then_some(())
        })
        .await?;
        assert!(stored_project(spoke, SPOKE_NS, "late").is_some());

        // A repository that gains the ignore-sync label looks deleted: its copy goes.
        merge_patch(&hub_secrets, "late-repo", json!({"metadata": {"labels": {IGNORE_SYNC: "true"}}})).await?;
        eventually("repository labelled ignore-sync leaves the spoke", T, || async {
            stored_secret(spoke, SPOKE_NS, "late-repo").is_none().then_some(())
        })
        .await?;

        // Secret data never appears in the logs.
        for log in [topo.principal.log(), topo.managed.as_ref().map(|p| p.log()).unwrap_or_default()] {
            assert!(!log.contains("s3cr3t-token") && !log.contains(&b64("s3cr3t-token")), "secret in a log");
        }
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_spoke_catches_up_on_every_kind_after_an_agent_restart() {
    run(vec![MANAGED], async |topo| {
        let hub_projects = projects(&topo.hub, HUB_ARGOCD_NS)?;
        let hub_secrets = secrets(&topo.hub, HUB_ARGOCD_NS)?;
        let spoke = &topo.managed_spoke;
        let pp = PostParams::default();
        hub_projects.create(&pp, &project("team", team_spec())).await?;
        hub_secrets.create(&pp, &repo_secret("team-repo", "repository", "team", "https://git.example/team")).await?;
        hub_secrets.create(&pp, &repo_secret("gone-repo", "repository", "team", "https://git.example/gone")).await?;
        eventually("objects reach the spoke", T, || async {
            stored_secret(spoke, SPOKE_NS, "gone-repo").and(stored_secret(spoke, SPOKE_NS, "team-repo"))
        })
        .await?;

        // While the agent is down: a new project, a changed repository, a deleted one, GPG keys.
        let agent = topo.managed.as_mut().ok_or("no managed agent")?;
        agent.stop().await;
        hub_projects
            .create(&pp, &project("while-down", json!({"sourceNamespaces": ["*"],
                "destinations": [{"name": "agent-managed", "namespace": "*", "server": "*"}]})))
            .await?;
        merge_patch(&hub_secrets, "team-repo", json!({"stringData": {"url": "https://git.example/changed"}})).await?;
        hub_secrets.delete("gone-repo", &DeleteParams::default()).await?;
        configmaps(&topo.hub, HUB_ARGOCD_NS)?
            .create(&pp, &object(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "argocd-gpg-keys-cm", "namespace": HUB_ARGOCD_NS}, "data": {"K": "v"}})))
            .await?;
        let before = topo.connect_count(MANAGED);
        topo.managed.as_mut().ok_or("no managed agent")?.start()?;
        eventually("agent reconnected", T, || async { (topo.connect_count(MANAGED) > before).then_some(()) }).await?;
        eventually("spoke converges on every kind", T, || async {
            (stored_project(spoke, SPOKE_NS, "while-down").is_some()
                && stored_secret(spoke, SPOKE_NS, "gone-repo").is_none()
                && stored_secret(spoke, SPOKE_NS, "team-repo")
                    .is_some_and(|s| s["data"]["url"] == b64("https://git.example/changed"))
                && stored_configmap(spoke, SPOKE_NS, "argocd-gpg-keys-cm").is_some())
            .then_some(())
        })
        .await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autonomous_projects_are_renamed_on_the_hub_and_kept_read_only() {
    run(vec![AUTONOMOUS], async |topo| {
        let spoke = &topo.autonomous_spoke;
        let spoke_projects = projects(spoke, SPOKE_NS)?;
        let hub_projects = projects(&topo.hub, HUB_ARGOCD_NS)?;
        let pp = PostParams::default();
        let hub_name = format!("{AUTONOMOUS}-local");
        spoke_projects
            .create(&pp, &object(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "local", "namespace": SPOKE_NS},
                "spec": {"sourceNamespaces": ["argocd"], "sourceRepos": ["*"],
                    "destinations": [{"name": "in-cluster", "namespace": "*", "server": "https://kubernetes.default.svc"}],
                    "roles": [{"name": "ro", "policies": ["p, proj:local:ro, applications, get, local/*, allow"]}]}})))
            .await?;
        let p = eventually("autonomous project lands on the hub renamed", T, || async {
            stored_project(&topo.hub, HUB_ARGOCD_NS, &hub_name)
        })
        .await?;
        assert_eq!(p["spec"]["destinations"], json!([{"name": AUTONOMOUS, "namespace": "*", "server": "*"}]));
        assert_eq!(p["spec"]["sourceNamespaces"], json!([AUTONOMOUS]));
        assert_eq!(
            p["spec"]["roles"][0]["policies"][0],
            format!("p, proj:{hub_name}:ro, applications, get, {hub_name}/{AUTONOMOUS}/*, allow")
        );
        assert_eq!(p["metadata"]["labels"]["argocd-agent.argoproj-labs.io/agent-name"], AUTONOMOUS);
        assert!(stored_project(&topo.hub, HUB_ARGOCD_NS, "local").is_none());

        // The agent's Applications refer to the renamed project on the hub only.
        let mut app = sample_app("guestbook", SPOKE_NS, "guestbook");
        app.data["spec"]["project"] = json!("local");
        apps(spoke, SPOKE_NS)?.create(&pp, &app).await?;
        eventually("hub application refers to the renamed project", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, "guestbook").filter(|a| a["spec"]["project"] == hub_name.as_str())
        })
        .await?;
        assert_eq!(stored_app(spoke, SPOKE_NS, "guestbook").unwrap()["spec"]["project"], "local");

        // Hub edits and deletions of the copy are reverted.
        merge_patch(&hub_projects, &hub_name, json!({"spec": {"sourceRepos": ["https://other/*"]}})).await?;
        eventually("hub project edit reverted", T, || async {
            stored_project(&topo.hub, HUB_ARGOCD_NS, &hub_name).filter(|p| p["spec"]["sourceRepos"] == json!(["*"]))
        })
        .await?;
        hub_projects.delete(&hub_name, &DeleteParams::default()).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        eventually("hub project deletion reverted", T, || async {
            stored_project(&topo.hub, HUB_ARGOCD_NS, &hub_name)
        })
        .await?;

        // Spoke edits propagate; the application never churns.
        merge_patch(&spoke_projects, "local", json!({"spec": {"description": "v2"}})).await?;
        eventually("spoke project edit propagates", T, || async {
            stored_project(&topo.hub, HUB_ARGOCD_NS, &hub_name).filter(|p| p["spec"]["description"] == "v2")
        })
        .await?;

        // While the principal is down: one project changed, one deleted, one created.
        spoke_projects
            .create(&pp, &object(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "doomed", "namespace": SPOKE_NS}, "spec": {"sourceRepos": ["*"]}})))
            .await?;
        eventually("second project lands", T, || async {
            stored_project(&topo.hub, HUB_ARGOCD_NS, &format!("{AUTONOMOUS}-doomed"))
        })
        .await?;
        spoke_projects
            .create(&pp, &object(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "steady", "namespace": SPOKE_NS}, "spec": {"sourceRepos": ["*"]}})))
            .await?;
        eventually("steady project lands", T, || async {
            stored_project(&topo.hub, HUB_ARGOCD_NS, &format!("{AUTONOMOUS}-steady"))
        })
        .await?;
        topo.principal.stop().await;
        merge_patch(&spoke_projects, "local", json!({"spec": {"description": "v3"}})).await?;
        spoke_projects.delete("doomed", &DeleteParams::default()).await?;
        spoke_projects
            .create(&pp, &object(json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "fresh", "namespace": SPOKE_NS}, "spec": {"sourceRepos": ["*"]}})))
            .await?;
        let before = topo.connect_count(AUTONOMOUS);
        topo.principal.start()?;
        eventually("agent reconnected", Duration::from_secs(40), || async {
            (topo.connect_count(AUTONOMOUS) > before).then_some(())
        })
        .await?;
        eventually("hub converges on the agent's projects after a principal restart", T, || async {
            (stored_project(&topo.hub, HUB_ARGOCD_NS, &hub_name).is_some_and(|p| p["spec"]["description"] == "v3")
                && stored_project(&topo.hub, HUB_ARGOCD_NS, &format!("{AUTONOMOUS}-doomed")).is_none()
                && stored_project(&topo.hub, HUB_ARGOCD_NS, &format!("{AUTONOMOUS}-fresh")).is_some())
            .then_some(())
        })
        .await?;

        // A project unchanged while the principal was down is still kept read-only on the hub.
        merge_patch(&hub_projects, &format!("{AUTONOMOUS}-steady"), json!({"spec": {"sourceRepos": ["https://x/*"]}})).await?;
        eventually("hub edit of an unchanged project reverted after a principal restart", T, || async {
            stored_project(&topo.hub, HUB_ARGOCD_NS, &format!("{AUTONOMOUS}-steady"))
                .filter(|p| p["spec"]["sourceRepos"] == json!(["*"]))
        })
        .await?;

        // ignore-sync on the spoke: the project leaves the hub.
        merge_patch(&spoke_projects, "fresh", json!({"metadata": {"labels": {IGNORE_SYNC: "true"}}})).await?;
        eventually("ignore-sync project removed from the hub", T, || async {
            stored_project(&topo.hub, HUB_ARGOCD_NS, &format!("{AUTONOMOUS}-fresh")).is_none().then_some(())
        })
        .await?;
        // Deleting on the spoke deletes on the hub.
        spoke_projects.delete("local", &DeleteParams::default()).await?;
        eventually("spoke deletion propagates", T, || async {
            stored_project(&topo.hub, HUB_ARGOCD_NS, &hub_name).is_none().then_some(())
        })
        .await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_converges_after_the_connection_is_cut() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        with_proxy: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        let hub_projects = projects(&topo.hub, HUB_ARGOCD_NS)?;
        let hub_secrets = secrets(&topo.hub, HUB_ARGOCD_NS)?;
        let spoke = &topo.managed_spoke;
        let pp = PostParams::default();
        hub_projects.create(&pp, &project("team", team_spec())).await?;
        hub_secrets.create(&pp, &repo_secret("team-repo", "repository", "team", "https://git.example/a")).await?;
        eventually("objects reach the spoke", T, || async { stored_secret(spoke, SPOKE_NS, "team-repo") }).await?;
        let before = topo.connect_count(MANAGED);
        // Cut mid-stream and change every kind at once.
        topo.proxy.as_ref().ok_or("no proxy")?.cut_all();
        merge_patch(&hub_secrets, "team-repo", json!({"stringData": {"url": "https://git.example/b"}})).await?;
        hub_projects
            .create(&pp, &project("second", json!({"sourceNamespaces": ["*"],
                "destinations": [{"name": MANAGED, "namespace": "*", "server": "*"}]})))
            .await?;
        configmaps(&topo.hub, HUB_ARGOCD_NS)?
            .create(&pp, &object(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "argocd-gpg-keys-cm", "namespace": HUB_ARGOCD_NS}, "data": {"K": "v"}})))
            .await?;
        eventually("agent reconnected", T, || async { (topo.connect_count(MANAGED) > before).then_some(()) }).await?;
        eventually("every kind converges after the cut", T, || async {
            (stored_secret(spoke, SPOKE_NS, "team-repo").is_some_and(|s| s["data"]["url"] == b64("https://git.example/b"))
                && stored_project(spoke, SPOKE_NS, "second").is_some()
                && stored_configmap(spoke, SPOKE_NS, "argocd-gpg-keys-cm").is_some())
            .then_some(())
        })
        .await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

/// A project change costs work only in the managed agents it concerns (those that hold the
/// project or that it matches now), counted by `argocd_principal_config_fanout_agents`;
/// each agent still ends up with exactly its projects and their repositories.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_change_reaches_only_the_agents_it_concerns() {
    let topo = Topology::start(TopologyOptions {
        second_agent_mode: Some("managed"),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let port = topo.metrics_ports["principal"];
        let fanout =
            || async { metric_sum(port, "argocd_principal_config_fanout_agents_sum").await };
        let count =
            || async { metric_sum(port, "argocd_principal_config_fanout_agents_count").await };
        let to = |agent: &str| {
            json!({
                "sourceRepos": ["*"], "sourceNamespaces": [agent],
                "destinations": [{"name": agent, "namespace": "*"}]
            })
        };
        let hub = projects(&topo.hub, HUB_ARGOCD_NS)?;
        hub.create(&PostParams::default(), &project("only-a", to(MANAGED)))
            .await?;
        eventually("only-a on agent A", T, || async {
            stored_project(&topo.managed_spoke, SPOKE_NS, "only-a")
        })
        .await?;
        secrets(&topo.hub, HUB_ARGOCD_NS)?
            .create(
                &PostParams::default(),
                &repo_secret(
                    "repo-a",
                    "repository",
                    "only-a",
                    "https://example.com/a.git",
                ),
            )
            .await?;
        eventually("repo-a on agent A", T, || async {
            stored_secret(&topo.managed_spoke, SPOKE_NS, "repo-a")
        })
        .await?;
        // Settled: each later change is measured alone.
        tokio::time::sleep(Duration::from_millis(500)).await;
        // One change, measured alone: the agents that re-evaluated for it.
        let measured = |what: &'static str, before: (f64, f64)| async move {
            eventually(&format!("{what}: routed"), T, || async {
                (count().await > before.1).then_some(())
            })
            .await?;
            Ok::<f64, HarnessError>(fanout().await - before.0)
        };
        // A label on only-a: A holds it, B neither holds it nor is matched.
        let before = (fanout().await, count().await);
        merge_patch(
            &hub,
            "only-a",
            json!({"metadata": {"labels": {"team": "a"}}}),
        )
        .await?;
        let affected = measured("a label on only-a", before).await?;
        assert_eq!(affected, 1.0, "only agent A re-evaluates");
        // The repository of only-a changes: only A, which holds both.
        let repos = secrets(&topo.hub, HUB_ARGOCD_NS)?;
        let before = (fanout().await, count().await);
        merge_patch(
            &repos,
            "repo-a",
            json!({"stringData": {"url": "https://example.com/a2.git"}}),
        )
        .await?;
        let affected = measured("repo-a changed", before).await?;
        assert_eq!(
            affected, 1.0,
            "only agent A re-evaluates for its repository"
        );
        // only-a now points at B instead: A (holds it) and B (matched now) re-evaluate; the
        // project and its repository move from A to B.
        let before = (fanout().await, count().await);
        merge_patch(&hub, "only-a", json!({"spec": to(AUTONOMOUS)})).await?;
        let affected = measured("only-a moved to B", before).await?;
        assert_eq!(affected, 2.0, "A and B re-evaluate");
        eventually("only-a and repo-a moved from A to B", T, || async {
            (stored_project(&topo.managed_spoke, SPOKE_NS, "only-a").is_none()
                && stored_secret(&topo.managed_spoke, SPOKE_NS, "repo-a").is_none()
                && stored_project(&topo.autonomous_spoke, SPOKE_NS, "only-a").is_some()
                && stored_secret(&topo.autonomous_spoke, SPOKE_NS, "repo-a").is_some())
            .then_some(())
        })
        .await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
