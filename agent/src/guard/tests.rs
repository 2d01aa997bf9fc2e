use std::sync::Arc;

use serde_json::{Value, json};

use super::*;

fn set(yaml: &str) -> GuardSet {
    GuardSet {
        guards: vec![Arc::new(Guard::from_yaml(yaml, "test").unwrap())],
        configmap: Some("argocd-agent-spoke-guard".into()),
    }
}

const POLICY: &str = r#"
sourceRepos: ["https://git.example.com/team/*", "!https://git.example.com/team/secret*"]
destinations:
  - server: https://kubernetes.default.svc
    namespace: "team-*"
  - name: in-cluster
    namespace: "team-*"
projects: ["team", "default"]
clusterResources: false
"#;

fn app(project: &str, repo: &str, dest: Value) -> Value {
    json!({"metadata": {"name": "a"}, "spec": {"project": project,
        "source": {"repoURL": repo, "path": "."}, "destination": dest}})
}

#[test]
fn parse_errors_name_the_field() {
    let e = Guard::from_yaml("sourceRepo: [x]", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("sourceRepo"), "{e}");
    let e = Guard::from_yaml("sourceRepos: ['a[']", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("sourceRepos[0]"), "{e}");
    let e = Guard::from_yaml("destinations: [{namespace: '{a'}]", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("destinations[0].namespace"), "{e}");
    let e = Guard::from_yaml("destinations: []", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("destinations"), "{e}");
    let e = Guard::from_yaml("sourceRepos: ['!x']", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("no allow pattern"), "{e}");
    let e = Guard::from_yaml("destinationServiceAccounts: [{server: x}]", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("destinationServiceAccounts[0]"), "{e}");
    let e = Guard::from_yaml("repositories: sometimes", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("repositories") || e.contains("sometimes"), "{e}");
    assert!(Guard::from_yaml("# nothing\n", "f").is_err());
    assert!(Guard::from_yaml("{}", "f").is_ok());
}

#[test]
fn applications_need_allowed_project_repositories_and_destination() {
    let g = set(POLICY);
    let ok = json!({"server": "https://kubernetes.default.svc", "namespace": "team-a"});
    assert!(
        g.check_application(&app(
            "team",
            "https://git.example.com/team/app.git",
            ok.clone()
        ))
        .is_ok()
    );
    // Argo CD's URL normalization: case, `.git`, trailing slash.
    assert!(
        g.check_application(&app(
            "team",
            "HTTPS://git.example.com/team/App/",
            ok.clone()
        ))
        .is_ok()
    );
    let r = g
        .check_application(&app("team", "https://evil.example.com/x", ok.clone()))
        .unwrap_err();
    assert_eq!(r.rule, "source-repos");
    assert!(r.to_string().contains("https://evil.example.com/x"), "{r}");
    let r = g
        .check_application(&app(
            "team",
            "https://git.example.com/team/secrets",
            ok.clone(),
        ))
        .unwrap_err();
    assert_eq!(r.rule, "source-repos", "a denial wins");
    let r = g
        .check_application(&app("ops", "https://git.example.com/team/a", ok.clone()))
        .unwrap_err();
    assert_eq!(r.rule, "projects");
    let r = g
        .check_application(&app(
            "team",
            "https://git.example.com/team/a",
            json!({"server": "https://kubernetes.default.svc", "namespace": "kube-system"}),
        ))
        .unwrap_err();
    assert_eq!(r.rule, "destinations");
    assert!(r.message.contains("kube-system"), "{r}");
    // No namespace: every namespace the manifests name; refused.
    assert!(
        g.check_application(&app(
            "team",
            "https://git.example.com/team/a",
            json!({"server": "https://kubernetes.default.svc"})
        ))
        .is_err()
    );
    // By name, as the second rule allows; a foreign cluster is refused.
    assert!(
        g.check_application(&app(
            "team",
            "https://git.example.com/team/a",
            json!({"name": "in-cluster", "namespace": "team-b"})
        ))
        .is_ok()
    );
    assert!(
        g.check_application(&app(
            "team",
            "https://git.example.com/team/a",
            json!({"server": "https://other:6443", "namespace": "team-b"})
        ))
        .is_err()
    );
    // Every source of a multi-source application counts.
    let mut multi = app("team", "https://git.example.com/team/a", ok);
    multi["spec"]["sources"] = json!([{"repoURL": "https://git.example.com/team/b"},
                                      {"repoURL": "https://evil.example.com/c"}]);
    assert_eq!(
        g.check_application(&multi).unwrap_err().rule,
        "source-repos"
    );
    // No project means Argo CD's `default`.
    let mut none = app(
        "",
        "https://git.example.com/team/a",
        json!({"name": "in-cluster", "namespace": "team-a"}),
    );
    none["spec"].as_object_mut().unwrap().remove("project");
    assert!(g.check_application(&none).is_ok());
}

#[test]
fn sync_operations_may_not_override_the_source_with_a_foreign_repository() {
    let g = set(POLICY);
    assert!(
        g.check_operation(&json!({"sync": {"revision": "abc"}}))
            .is_ok()
    );
    assert!(
        g.check_operation(
            &json!({"sync": {"source": {"repoURL": "https://git.example.com/team/a"}}})
        )
        .is_ok()
    );
    let r = g
        .check_operation(&json!({"sync": {"sources": [{"repoURL": "https://evil.example.com/x"}]}}))
        .unwrap_err();
    assert_eq!(r.rule, "source-repos");
}

#[test]
fn projects_are_the_intersection_of_the_hub_and_the_guard() {
    let g = set(POLICY);
    let hub = json!({"metadata": {"name": "team"}, "spec": {
        "sourceRepos": ["*", "https://git.example.com/team/literal", "https://evil.example.com/x", "!https://git.example.com/team/old"],
        "destinations": [
            {"name": "in-cluster", "server": "https://kubernetes.default.svc", "namespace": "*"},
            {"name": "in-cluster", "server": "https://kubernetes.default.svc", "namespace": "team-a"},
            {"name": "in-cluster", "server": "https://kubernetes.default.svc", "namespace": "kube-system"}],
        "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
        "namespaceResourceBlacklist": [{"group": "", "kind": "ResourceQuota"}]}});
    let out = g.shape_project(&hub).unwrap();
    assert_eq!(
        out["spec"]["sourceRepos"],
        json!([
            "https://git.example.com/team/*",
            "https://git.example.com/team/literal",
            "!https://git.example.com/team/old",
            "!https://git.example.com/team/secret*"
        ])
    );
    assert_eq!(
        out["spec"]["destinations"],
        json!([
            {"name": "in-cluster", "server": "https://kubernetes.default.svc", "namespace": "team-*"},
            {"name": "in-cluster", "server": "https://kubernetes.default.svc", "namespace": "team-a"}])
    );
    assert_eq!(out["spec"]["clusterResourceWhitelist"], json!([]));
    assert_eq!(
        out["spec"]["namespaceResourceBlacklist"],
        hub["spec"]["namespaceResourceBlacklist"]
    );
    // Every allow entry of the result is allowed by the guard.
    let repos = GlobList::compile(&["https://git.example.com/team/*".into()], "x", "t").unwrap();
    for r in out["spec"]["sourceRepos"].as_array().unwrap() {
        let r = r.as_str().unwrap();
        assert!(r.starts_with('!') || repos.allows(r), "{r}");
    }
    let other = json!({"metadata": {"name": "ops"}, "spec": {"sourceRepos": ["*"]}});
    assert_eq!(g.shape_project(&other).unwrap_err().rule, "projects");
}

#[test]
fn service_accounts_can_be_required_and_set_by_the_guard() {
    let g = set("requireDestinationServiceAccounts: true\n");
    let bare = json!({"metadata": {"name": "p"}, "spec": {}});
    assert_eq!(
        g.shape_project(&bare).unwrap_err().rule,
        "destination-service-accounts"
    );
    let with = json!({"metadata": {"name": "p"}, "spec": {"destinationServiceAccounts": [
        {"server": "*", "namespace": "*", "defaultServiceAccount": "deployer"}]}});
    assert!(g.shape_project(&with).is_ok());
    let set_by_guard = set(
        "requireDestinationServiceAccounts: true\ndestinationServiceAccounts:\n  - {server: '*', namespace: '*', defaultServiceAccount: 'spoke:limited'}\n",
    );
    let out = set_by_guard.shape_project(&with).unwrap();
    assert_eq!(
        out["spec"]["destinationServiceAccounts"][0]["defaultServiceAccount"],
        "spoke:limited"
    );
}

#[test]
fn repository_secrets_need_an_allowed_url() {
    use base64::Engine;
    let g = set(POLICY);
    let secret = |url: &str, ty: &str| {
        json!({"metadata": {"name": "r",
        "labels": {"argocd.argoproj.io/secret-type": ty}},
        "data": {"url": base64::engine::general_purpose::STANDARD.encode(url)}})
    };
    assert!(
        g.check_repository(&secret("https://git.example.com/team/a", "repository"))
            .is_ok()
    );
    assert_eq!(
        g.check_repository(&secret("https://evil.example.com/a", "repository"))
            .unwrap_err()
            .rule,
        "source-repos"
    );
    // A credential template is a prefix of the repositories it serves.
    assert!(
        g.check_repository(&secret("https://git.example.com/team", "repo-creds"))
            .is_ok()
    );
    assert!(
        g.check_repository(&secret("https://git.example.com/team", "repository"))
            .is_err()
    );
    let local = set("repositories: local-only\n");
    assert_eq!(
        local
            .check_repository(&secret("https://git.example.com/team/a", "repository"))
            .unwrap_err()
            .rule,
        "repositories"
    );
}

#[test]
fn the_guard_configmap_is_never_written_from_the_hub() {
    let g = set("{}");
    assert_eq!(
        g.check_configmap("argocd-agent-spoke-guard")
            .unwrap_err()
            .rule,
        "guard-configmap"
    );
    assert!(g.check_configmap(GPG_KEYS_CONFIGMAP).is_ok());
    assert!(g.check_configmap("anything-else").is_err());
    // No guard: today's behaviour.
    assert!(GuardSet::default().check_configmap("anything-else").is_ok());
}

#[test]
fn every_source_must_allow() {
    let a =
        Arc::new(Guard::from_yaml("sourceRepos: ['https://git.example.com/*']", "file").unwrap());
    let b = Arc::new(
        Guard::from_yaml("sourceRepos: ['https://git.example.com/team/*']", "flags").unwrap(),
    );
    let g = GuardSet {
        guards: vec![a, b],
        configmap: None,
    };
    let d = json!({"name": "in-cluster", "namespace": "x"});
    assert!(
        g.check_application(&app("p", "https://git.example.com/team/a", d.clone()))
            .is_ok()
    );
    let r = g
        .check_application(&app("p", "https://git.example.com/ops/a", d))
        .unwrap_err();
    assert!(r.message.contains("flags"), "{r}");
}

#[test]
fn unknown_fields_of_a_destination_are_refused() {
    let e = Guard::from_yaml("destinations: [{namespace: 'a', cluster: 'x'}]\n", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("cluster"), "{e}");
    let e = Guard::from_yaml("destinations:\n  - namespace: a\n    cluster: x\n", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("cluster"), "{e}");
}
