//! Renders every kustomize base and overlay under `deploy/` with `kubectl kustomize` and checks
//! the objects against the real binaries: every flag and environment variable a Deployment
//! uses must exist in `argocd-agent <subcommand> --help`, the RBAC must grant exactly what
//! docs/deploy.md lists (tests/rbac.rs proves the code needs no more), the example identity rules must load, and the committed mesh
//! policies must match what `argocd-agentctl mesh` prints, and the binary must accept each
//! Deployment's args and environment.
#![forbid(unsafe_code)]

#[path = "support/k8s_schema.rs"]
mod k8s_schema;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

/// The workspace root (`e2e/..`).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// kubectl from `KUBECTL`, the project virtualenv, or `PATH`; there is no other way to run
/// the same kustomize that users run, so a missing kubectl fails the test.
fn kubectl() -> PathBuf {
    let found = argocd_agent_testkit::harness::kubectl();
    if found != Path::new("kubectl") {
        return found;
    }
    let on_path = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if on_path {
        return PathBuf::from("kubectl");
    }
    panic!(
        "kubectl not found (KUBECTL unset, no .venv/bin/kubectl, none on PATH): run .ci/run once to install it into .venv"
    );
}

/// Every directory under `deploy/` with a kustomization that can be built on its own
/// (components are built through the overlays that use them).
fn kustomize_dirs() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
                .path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                if !text.lines().any(|l| l.trim() == "kind: Component") {
                    out.push(dir.to_path_buf());
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(&workspace_root().join("deploy"), &mut out);
    out.sort();
    out
}

/// Path relative to `deploy/`, for messages and for telling principal from agent.
fn rel(dir: &Path) -> String {
    dir.strip_prefix(workspace_root().join("deploy"))
        .unwrap_or(dir)
        .to_string_lossy()
        .into_owned()
}

/// Which component a kustomization deploys, from its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Component {
    Principal,
    Agent,
}

fn component(dir: &Path) -> Component {
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("principal") => Component::Principal,
        Some("agent") => Component::Agent,
        other => panic!(
            "{}: kustomization directory must be named principal or agent, found {other:?}",
            rel(dir)
        ),
    }
}

fn render(dir: &Path) -> Vec<Value> {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("running kubectl kustomize {}: {e}", rel(dir)));
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        rel(dir),
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout)
        .unwrap_or_else(|e| panic!("{}: output is not UTF-8: {e}", rel(dir)));
    serde_saphyr::from_multiple::<Value>(&yaml)
        .unwrap_or_else(|e| panic!("{}: output is not YAML: {e}", rel(dir)))
}

/// Rendered objects of every kustomization, computed once for all tests of this file.
fn rendered() -> &'static BTreeMap<PathBuf, Vec<Value>> {
    static CELL: OnceLock<BTreeMap<PathBuf, Vec<Value>>> = OnceLock::new();
    CELL.get_or_init(|| {
        kustomize_dirs()
            .into_iter()
            .map(|d| (d.clone(), render(&d)))
            .collect()
    })
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.pointer(pointer).and_then(Value::as_str)
}

fn kind(obj: &Value) -> &str {
    str_at(obj, "/kind").unwrap_or("")
}

fn name(obj: &Value) -> &str {
    str_at(obj, "/metadata/name").unwrap_or("")
}

fn find<'a>(objects: &'a [Value], kind_: &str, name_: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| kind(o) == kind_ && name(o) == name_)
}

fn deployment(dir: &Path, objects: &[Value]) -> Value {
    let deployments: Vec<&Value> = objects.iter().filter(|o| kind(o) == "Deployment").collect();
    assert_eq!(
        deployments.len(),
        1,
        "{}: expected exactly one Deployment",
        rel(dir)
    );
    deployments[0].clone()
}

fn array<'a>(obj: &'a Value, pointer: &str) -> &'a [Value] {
    obj.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// `argocd-agent <sub> --help`, once per subcommand.
fn help(c: Component) -> &'static str {
    static PRINCIPAL: OnceLock<String> = OnceLock::new();
    static AGENT: OnceLock<String> = OnceLock::new();
    let (cell, sub) = match c {
        Component::Principal => (&PRINCIPAL, "principal"),
        Component::Agent => (&AGENT, "agent"),
    };
    cell.get_or_init(|| {
        let bin = argocd_agent_testkit::harness::binary("argocd-agent")
            .unwrap_or_else(|e| panic!("argocd-agent binary: {e}"));
        let out = Command::new(&bin)
            .args([sub, "--help"])
            .output()
            .unwrap_or_else(|e| panic!("running {} {sub} --help: {e}", bin.display()));
        assert!(
            out.status.success(),
            "{sub} --help failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
}

/// The flags `--help` lists (first token of each option line, without the value name; a
/// boolean's optional value, `--flag[=<FLAG>]`, is cut off).
fn help_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .flat_map(|l| l.split([' ', ',']))
        .filter(|t| t.starts_with("--") && t.len() > 2)
        .map(|t| t.split("[=").next().unwrap_or(t).to_owned())
        .collect()
}

#[test]
fn every_kustomization_is_found() {
    let found: BTreeSet<String> = kustomize_dirs().iter().map(|d| rel(d)).collect();
    for expected in [
        "principal",
        "agent",
        "overlays/spire/principal",
        "overlays/spire/agent",
        "overlays/pem-files/principal",
        "overlays/pem-files/agent",
        "overlays/istio/principal",
        "overlays/istio/agent",
        "overlays/linkerd/principal",
        "overlays/linkerd/agent",
        "examples/gateway-api/principal",
    ] {
        assert!(
            found.contains(expected),
            "deploy/{expected} missing; found {found:?}"
        );
    }
}

#[test]
fn every_rendered_object_is_complete_and_unique() {
    for (dir, objects) in rendered() {
        assert!(!objects.is_empty(), "{}: rendered nothing", rel(dir));
        let mut seen = BTreeSet::new();
        for obj in objects {
            for field in ["/apiVersion", "/kind", "/metadata/name"] {
                assert!(
                    str_at(obj, field).is_some_and(|s| !s.is_empty()),
                    "{}: object without {field}: {obj}",
                    rel(dir)
                );
            }
            let ns = str_at(obj, "/metadata/namespace").unwrap_or("").to_owned();
            assert!(
                seen.insert((kind(obj).to_owned(), ns, name(obj).to_owned())),
                "{}: duplicate {} {}",
                rel(dir),
                kind(obj),
                name(obj)
            );
        }
    }
}

/// Every object of every kustomization against Kubernetes' own schemas (and Istio's): the
/// validators of npm `kubernetes-models`, not ours (tests/support/k8s_schema.rs).
#[test]
fn every_rendered_object_is_valid_against_kubernetes_schemas() {
    let mut problems = Vec::new();
    for (dir, objects) in rendered() {
        problems.extend(k8s_schema::problems(&rel(dir), objects));
    }
    assert!(
        problems.is_empty(),
        "objects the schemas refuse:\n{}",
        problems.join("\n")
    );
}

#[test]
fn expected_kinds_are_present() {
    for (dir, objects) in rendered() {
        let kinds: BTreeSet<&str> = objects.iter().map(kind).collect();
        let mut expected = vec![
            "Deployment",
            "ServiceAccount",
            "Service",
            "ConfigMap",
            "NetworkPolicy",
        ];
        // The principal works across agent namespaces (ClusterRole) and in Argo CD's own
        // namespace (Role: AppProjects, repository Secrets, the GPG keys ConfigMap); the
        // agent only in its own namespace (Role), never cluster-wide.
        let (wanted, unwanted): (&[&str], &[&str]) = match component(dir) {
            Component::Principal => (
                &["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"],
                &[],
            ),
            Component::Agent => (
                &["Role", "RoleBinding"],
                &["ClusterRole", "ClusterRoleBinding"],
            ),
        };
        expected.extend(wanted);
        for k in expected {
            assert!(
                kinds.contains(k),
                "{}: no {k} rendered (kinds: {kinds:?})",
                rel(dir)
            );
        }
        for k in unwanted {
            assert!(!kinds.contains(k), "{}: unexpected {k}", rel(dir));
        }
    }
}

#[test]
fn overlays_put_every_namespaced_object_and_binding_subject_in_one_namespace() {
    const CLUSTER_SCOPED: [&str; 3] = ["ClusterRole", "ClusterRoleBinding", "Namespace"];
    for (dir, objects) in rendered()
        .iter()
        .filter(|(d, _)| rel(d).starts_with("overlays/") || rel(d).starts_with("examples/"))
    {
        for obj in objects {
            let ns = str_at(obj, "/metadata/namespace");
            if CLUSTER_SCOPED.contains(&kind(obj)) {
                assert!(
                    ns.is_none(),
                    "{}: cluster-scoped {} {} has a namespace",
                    rel(dir),
                    kind(obj),
                    name(obj)
                );
            } else {
                assert_eq!(
                    ns,
                    Some("argocd"),
                    "{}: {} {} namespace",
                    rel(dir),
                    kind(obj),
                    name(obj)
                );
            }
            for subject in array(obj, "/subjects") {
                assert_eq!(
                    str_at(subject, "/namespace"),
                    Some("argocd"),
                    "{}: {} {} subject {subject} has no or another namespace",
                    rel(dir),
                    kind(obj),
                    name(obj)
                );
                let sa = str_at(subject, "/name").unwrap_or("");
                assert!(
                    find(objects, "ServiceAccount", sa).is_some(),
                    "{}: subject {sa} is not rendered",
                    rel(dir)
                );
            }
        }
    }
}

#[test]
fn deployment_args_and_env_exist_in_binary_help() {
    for (dir, objects) in rendered() {
        let c = component(dir);
        let help = help(c);
        let flags = help_flags(help);
        let deploy = deployment(dir, objects);
        let containers = array(&deploy, "/spec/template/spec/containers");
        assert_eq!(containers.len(), 1, "{}: expected one container", rel(dir));
        let container = &containers[0];
        let args: Vec<&str> = array(container, "/args")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let sub = match c {
            Component::Principal => "principal",
            Component::Agent => "agent",
        };
        assert_eq!(
            args.first().copied(),
            Some(sub),
            "{}: first arg must be the subcommand",
            rel(dir)
        );
        for arg in args.iter().filter(|a| a.starts_with("--")) {
            let flag = arg.split_once('=').map_or(*arg, |(f, _)| f);
            assert!(
                flags.contains(flag),
                "{}: `{flag}` is not a flag of `argocd-agent {sub}`",
                rel(dir)
            );
        }
        for env in array(container, "/env") {
            let var = str_at(env, "/name").unwrap_or("");
            // `[env: VAR]` for a secret (its value hidden from the help).
            if help.contains(&format!("[env: {var}=")) || help.contains(&format!("[env: {var}]")) {
                continue;
            }
            // Upstream argocd-agent's variables (read, or refused with a reason).
            if help.contains(&format!("[upstream env: {var}]")) {
                continue;
            }
            // Anything else must only feed `$(VAR)` expansion in the args.
            assert!(
                args.iter().any(|a| a.contains(&format!("$({var})"))),
                "{}: env {var} is neither read by `argocd-agent {sub}` nor used in args",
                rel(dir)
            );
        }
    }
}

#[test]
fn params_configmap_keys_and_env_references_match() {
    for (dir, objects) in rendered() {
        let params = find(objects, "ConfigMap", "argocd-agent-params")
            .unwrap_or_else(|| panic!("{}: no argocd-agent-params ConfigMap", rel(dir)));
        let keys: BTreeSet<&str> = params
            .pointer("/data")
            .and_then(Value::as_object)
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let deploy = deployment(dir, objects);
        let mut referenced = BTreeSet::new();
        for env in array(&deploy, "/spec/template/spec/containers/0/env") {
            if let Some(r) = env.pointer("/valueFrom/configMapKeyRef") {
                let cm = str_at(r, "/name").unwrap_or("");
                assert!(
                    find(objects, "ConfigMap", cm).is_some(),
                    "{}: env refers to missing ConfigMap {cm}",
                    rel(dir)
                );
                referenced.insert(str_at(r, "/key").unwrap_or(""));
            }
        }
        // A key nothing reads is a typo or a setting that silently does nothing.
        for key in &keys {
            assert!(
                referenced.contains(key),
                "{}: params key {key} is not read by any env var",
                rel(dir)
            );
        }
        let prefix = match component(dir) {
            Component::Principal => "principal.",
            Component::Agent => "agent.",
        };
        assert!(
            referenced.iter().all(|k| k.starts_with(prefix)),
            "{}: keys must start with {prefix}",
            rel(dir)
        );
        if component(dir) == Component::Agent {
            assert!(
                keys.contains("agent.server.address"),
                "{}: agent.server.address is required",
                rel(dir)
            );
        }
        for (k, v) in params
            .pointer("/data")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            assert!(
                v.as_str().is_some_and(|s| !s.is_empty()),
                "{}: params key {k} is empty",
                rel(dir)
            );
        }
    }
}

#[test]
fn volume_mounts_refer_to_rendered_volumes() {
    for (dir, objects) in rendered() {
        let deploy = deployment(dir, objects);
        let volumes = array(&deploy, "/spec/template/spec/volumes");
        let names: BTreeSet<&str> = volumes.iter().filter_map(|v| str_at(v, "/name")).collect();
        for m in array(&deploy, "/spec/template/spec/containers/0/volumeMounts") {
            let n = str_at(m, "/name").unwrap_or("");
            assert!(
                names.contains(n),
                "{}: volumeMount {n} has no volume",
                rel(dir)
            );
            assert_eq!(
                m.pointer("/readOnly"),
                Some(&Value::Bool(true)),
                "{}: mount {n} must be read-only",
                rel(dir)
            );
        }
        for v in volumes {
            if let Some(cm) = str_at(v, "/configMap/name") {
                assert!(
                    find(objects, "ConfigMap", cm).is_some(),
                    "{}: volume uses missing ConfigMap {cm}",
                    rel(dir)
                );
            }
        }
        let sc = deploy.pointer("/spec/template/spec/containers/0/securityContext");
        assert_eq!(
            sc.and_then(|s| s.pointer("/readOnlyRootFilesystem")),
            Some(&Value::Bool(true)),
            "{}: root filesystem must be read-only",
            rel(dir)
        );
        assert_eq!(
            deploy.pointer("/spec/template/spec/securityContext/runAsNonRoot"),
            Some(&Value::Bool(true)),
            "{}: must run as non-root",
            rel(dir)
        );
    }
}

#[test]
fn spire_overlays_mount_the_workload_api_and_pem_overlays_do_not() {
    for (dir, objects) in rendered() {
        let deploy = deployment(dir, objects);
        let has_csi = array(&deploy, "/spec/template/spec/volumes")
            .iter()
            .any(|v| str_at(v, "/csi/driver") == Some("csi.spiffe.io"));
        let r = rel(dir);
        let wants_csi = !(r.contains("pem-files") || r.contains("istio") || r.contains("linkerd"));
        assert_eq!(
            has_csi, wants_csi,
            "{r}: SPIFFE CSI volume present = {has_csi}"
        );
    }
}

/// A role's rules as (apiGroup, resource, verb, resourceNames) tuples.
fn rule_tuples(role: &Value) -> BTreeSet<(String, String, String, Vec<String>)> {
    let mut out = BTreeSet::new();
    for rule in array(role, "/rules") {
        let list = |f: &str| -> Vec<String> {
            array(rule, f)
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        };
        for g in list("/apiGroups") {
            for r in list("/resources") {
                for v in list("/verbs") {
                    out.insert((g.clone(), r.clone(), v, list("/resourceNames")));
                }
            }
        }
    }
    out
}

const ALL_VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// The documented table (docs/deploy.md, docs/kubernetes.md); tests/rbac.rs proves the code
/// needs no more. Per role kind: the principal's ClusterRole (Applications across agent
/// namespaces, namespaces) and its Role in Argo CD's namespace (AppProjects, read-only
/// repository Secrets and ConfigMaps); the agent's Role in its own namespace. The principal
/// never gets Secrets or ConfigMaps cluster-wide, and never writes them.
fn expected_rules(
    c: Component,
    role_kind: &str,
) -> BTreeSet<(String, String, String, Vec<String>)> {
    let mut rows: Vec<(&str, &str, &str)> = Vec::new();
    let applications = |rows: &mut Vec<(&str, &str, &str)>| {
        rows.extend(ALL_VERBS.map(|v| ("argoproj.io", "applications", v)));
        rows.push(("argoproj.io", "applications/status", "patch"));
    };
    match (c, role_kind) {
        (Component::Principal, "ClusterRole") => {
            applications(&mut rows);
            rows.extend([
                ("", "namespaces", "get"),
                ("", "namespaces", "list"),
                ("", "namespaces", "watch"),
                ("", "namespaces", "create"),
            ]);
        }
        (Component::Principal, "Role") => {
            rows.extend(ALL_VERBS.map(|v| ("argoproj.io", "appprojects", v)));
            for r in ["secrets", "configmaps"] {
                rows.extend([("", r, "list"), ("", r, "watch")]);
            }
            // The resource proxy's keys Secret (read or created once) and agents' cluster
            // secrets (created, renewed by update).
            rows.extend([
                ("", "secrets", "get"),
                ("", "secrets", "create"),
                ("", "secrets", "update"),
            ]);
            // Replicas' and agents' Leases (--ha).
            rows.extend(
                ["get", "list", "watch", "create", "update"]
                    .map(|v| ("coordination.k8s.io", "leases", v)),
            );
        }
        (Component::Agent, "Role") => {
            applications(&mut rows);
            // Copies are written whole (get, create, update), never patched.
            for (g, r) in [
                ("argoproj.io", "appprojects"),
                ("", "secrets"),
                ("", "configmaps"),
            ] {
                rows.extend(
                    ALL_VERBS
                        .into_iter()
                        .filter(|v| *v != "patch")
                        .map(|v| (g, r, v)),
                );
            }
        }
        _ => panic!("no {role_kind} expected for {c:?}"),
    }
    rows.into_iter()
        .map(|(g, r, v)| (g.to_owned(), r.to_owned(), v.to_owned(), Vec::new()))
        .collect()
}

#[test]
fn roles_grant_exactly_the_documented_least_privilege_rules() {
    for (dir, objects) in rendered() {
        let (name_, kinds): (&str, &[&str]) = match component(dir) {
            Component::Principal => ("argocd-agent-principal", &["ClusterRole", "Role"]),
            Component::Agent => ("argocd-agent-agent", &["Role"]),
        };
        for role_kind in kinds {
            let role = find(objects, role_kind, name_)
                .unwrap_or_else(|| panic!("{}: {role_kind} {name_} not rendered", rel(dir)));
            assert_eq!(
                rule_tuples(role),
                expected_rules(component(dir), role_kind),
                "{}: {role_kind} {name_} rules differ from the documented least-privilege table",
                rel(dir)
            );
        }
        // Every role is one of the audited ones, and every binding binds one of them to the
        // component's own service account.
        for obj in objects {
            match kind(obj) {
                "Role" | "ClusterRole" => assert!(
                    name(obj) == name_ && kinds.contains(&kind(obj)),
                    "{}: unexpected {} {}",
                    rel(dir),
                    kind(obj),
                    name(obj)
                ),
                "RoleBinding" | "ClusterRoleBinding" => {
                    let role_kind = str_at(obj, "/roleRef/kind").unwrap_or("");
                    assert_eq!(
                        (role_kind, str_at(obj, "/roleRef/name")),
                        (
                            if kind(obj) == "RoleBinding" {
                                "Role"
                            } else {
                                "ClusterRole"
                            },
                            Some(name_)
                        ),
                        "{}: {} {} binds another role",
                        rel(dir),
                        kind(obj),
                        name(obj)
                    );
                    let subjects: Vec<Option<&str>> = array(obj, "/subjects")
                        .iter()
                        .map(|s| str_at(s, "/name"))
                        .collect();
                    assert_eq!(
                        subjects,
                        vec![Some(name_)],
                        "{}: {} {} subjects",
                        rel(dir),
                        kind(obj),
                        name(obj)
                    );
                }
                _ => {}
            }
        }
    }
}

#[test]
fn example_identity_rules_load_and_map_an_agent() {
    for (dir, objects) in rendered()
        .iter()
        .filter(|(d, _)| component(d) == Component::Principal)
    {
        let cm = find(objects, "ConfigMap", "argocd-agent-identity-rules")
            .unwrap_or_else(|| panic!("{}: no identity rules ConfigMap", rel(dir)));
        let text = str_at(cm, "/data/rules.yaml")
            .unwrap_or_else(|| panic!("{}: no rules.yaml key", rel(dir)));
        let rules = argocd_agent_domain::RuleSet::from_yaml(text)
            .unwrap_or_else(|e| panic!("{}: {e}", rel(dir)));
        // The mesh overlays list their agents (exact rules, shared with the mesh policy);
        // the others ship the pattern rules of the base.
        let (cases, unknown): (&[(&str, &str, &str)], &str) = if mesh(dir).is_some() {
            (
                &[
                    (
                        "spiffe://cluster.local/ns/argocd/sa/argocd-agent-agent-edge-1",
                        "edge-1",
                        "edge-1",
                    ),
                    (
                        "spiffe://cluster.local/ns/argocd/sa/argocd-agent-agent-edge-2",
                        "edge-2",
                        "edge-2",
                    ),
                ],
                "spiffe://cluster.local/ns/argocd/sa/argocd-agent-agent-edge-3",
            )
        } else {
            (
                &[
                    ("spiffe://example.org/agent/edge-1", "edge-1", "edge-1"),
                    (
                        "spiffe://example.org/ns/argocd/sa/edge-2",
                        "edge-2",
                        "argocd-edge-2",
                    ),
                ],
                "spiffe://other.org/agent/edge-1",
            )
        };
        for &(id, agent, namespace) in cases {
            let id = argocd_agent_identity::SpiffeId::parse(id).expect("valid ID");
            let mapped = rules
                .map(&id)
                .unwrap_or_else(|e| panic!("{}: {e}", rel(dir)));
            assert_eq!(
                (mapped.agent.as_str(), mapped.namespace.as_str()),
                (agent, namespace),
                "{}: {id}",
                rel(dir)
            );
        }
        // Deny by default: an ID no rule lists is not admitted.
        let foreign = argocd_agent_identity::SpiffeId::parse(unknown).expect("valid ID");
        assert!(
            rules.map(&foreign).is_err(),
            "{}: foreign trust domain admitted",
            rel(dir)
        );
        // The path the Deployment passes with --identity-rules is where the ConfigMap lands.
        let deploy = deployment(dir, objects);
        let args = array(&deploy, "/spec/template/spec/containers/0/args");
        assert!(
            args.iter()
                .any(|a| a.as_str() == Some("--identity-rules=/etc/argocd-agent/rules/rules.yaml")),
            "{}: --identity-rules not passed",
            rel(dir)
        );
        let mounted = array(&deploy, "/spec/template/spec/containers/0/volumeMounts")
            .iter()
            .any(|m| str_at(m, "/mountPath") == Some("/etc/argocd-agent/rules"));
        assert!(
            mounted,
            "{}: rules ConfigMap not mounted at /etc/argocd-agent/rules",
            rel(dir)
        );
    }
}

#[test]
fn committed_mesh_policies_match_the_generator() {
    let ctl = argocd_agent_testkit::harness::binary("argocd-agentctl")
        .unwrap_or_else(|e| panic!("argocd-agentctl: {e}"));
    let rules = |mesh: &str| {
        workspace_root()
            .join(format!("deploy/overlays/{mesh}/principal/rules.yaml"))
            .display()
            .to_string()
    };
    let (istio_rules, linkerd_rules) = (rules("istio"), rules("linkerd"));
    let cases: [(&str, Vec<&str>); 2] = [
        (
            "overlays/istio/principal/mesh-policy.yaml",
            vec![
                "mesh",
                "istio",
                "--namespace",
                "argocd",
                "--port",
                "8443",
                "--upstream-port",
                "8404",
                "--agents-from-rules",
                &istio_rules,
            ],
        ),
        (
            "overlays/linkerd/principal/mesh-policy.yaml",
            vec![
                "mesh",
                "linkerd",
                "--namespace",
                "argocd",
                "--port",
                "8443",
                "--agents-from-rules",
                &linkerd_rules,
            ],
        ),
    ];
    for (file, args) in cases {
        let path = workspace_root().join("deploy").join(file);
        let committed =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {file}: {e}"));
        let out = Command::new(&ctl)
            .args(&args)
            .output()
            .unwrap_or_else(|e| panic!("argocd-agentctl {args:?}: {e}"));
        assert!(
            out.status.success(),
            "argocd-agentctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let generated = String::from_utf8_lossy(&out.stdout);
        let parse = |s: &str| {
            serde_saphyr::from_multiple::<Value>(s).unwrap_or_else(|e| panic!("{file}: {e}"))
        };
        assert_eq!(
            parse(&committed),
            parse(&generated),
            "deploy/{file} is stale: regenerate with argocd-agentctl {}",
            args.join(" ")
        );
    }
}

/// The environment a container would get: literal values, params ConfigMap keys (missing
/// optional keys are left out, as the kubelet does), the pod IP as 127.0.0.1, a pod name and
/// a stand-in for optional Secret keys.
fn container_env(dir: &Path, objects: &[Value], container: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for env in array(container, "/env") {
        let var = str_at(env, "/name").unwrap_or("").to_owned();
        if let Some(v) = str_at(env, "/value") {
            out.push((var, v.to_owned()));
        } else if let Some(r) = env.pointer("/valueFrom/configMapKeyRef") {
            let cm = find(objects, "ConfigMap", str_at(r, "/name").unwrap_or(""))
                .unwrap_or_else(|| panic!("{}: env {var} refers to a missing ConfigMap", rel(dir)));
            let key = str_at(r, "/key").unwrap_or("");
            if let Some(v) = cm
                .pointer("/data")
                .and_then(|d| d.get(key))
                .and_then(Value::as_str)
            {
                out.push((var, v.to_owned()));
            }
        } else if str_at(env, "/valueFrom/fieldRef/fieldPath") == Some("status.podIP") {
            out.push((var, "127.0.0.1".to_owned()));
        } else if str_at(env, "/valueFrom/fieldRef/fieldPath") == Some("metadata.name") {
            out.push((var, "argocd-agent-principal-7c9f-x2x4q".to_owned()));
        } else if env.pointer("/valueFrom/secretKeyRef/optional") == Some(&Value::Bool(true)) {
            // An optional Secret key (Argo CD's Redis password): a stand-in value.
            out.push((var, "secret-from-a-secret".to_owned()));
        } else {
            panic!("{}: env {var}: unsupported source {env}", rel(dir));
        }
    }
    out
}

/// Settings that would make the test bind real ports: checked here, then replaced.
const LISTEN_FLAGS: [&str; 4] = [
    "--listen-host",
    "--listen-port",
    "--metrics-host",
    "--metrics-port",
];
const LISTEN_ENV: [&str; 4] = [
    "ARGOCD_PRINCIPAL_LISTEN_HOST",
    "ARGOCD_PRINCIPAL_LISTEN_PORT",
    "ARGOCD_PRINCIPAL_METRICS_PORT",
    "ARGOCD_AGENT_METRICS_PORT",
];

fn check_listen_value(dir: &Path, setting: &str, value: &str) {
    let ok = if setting.contains("HOST") || setting.ends_with("-host") {
        value.parse::<std::net::IpAddr>().is_ok()
    } else {
        value.parse::<u16>().is_ok()
    };
    assert!(ok, "{}: {setting}={value:?} is not valid", rel(dir));
}

/// Runs `argocd-agent` with a Deployment's args and environment (ports replaced by port 0 on
/// 127.0.0.1, the rules file by a temp copy, a kubeconfig that does not exist). Accepted means
/// every flag and value passed parsing and validation: the process either reached the start
/// stage (and failed there on the missing SVID source or kubeconfig) or is still running.
fn run_with_rendered_settings(dir: &Path, objects: &[Value]) -> Result<(), String> {
    let tmp = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let deploy = deployment(dir, objects);
    let container = &array(&deploy, "/spec/template/spec/containers")[0];
    let env = container_env(dir, objects, container);
    let expand = |arg: &str| {
        env.iter()
            .fold(arg.to_owned(), |a, (k, v)| a.replace(&format!("$({k})"), v))
    };
    let mut args = Vec::new();
    for arg in array(container, "/args").iter().filter_map(Value::as_str) {
        let arg = expand(arg);
        let (flag, value) = arg.split_once('=').unwrap_or((arg.as_str(), ""));
        if LISTEN_FLAGS.contains(&flag) {
            check_listen_value(dir, flag, value);
        } else if flag == "--identity-rules" {
            let cm = find(objects, "ConfigMap", "argocd-agent-identity-rules")
                .ok_or_else(|| format!("{}: no rules ConfigMap", rel(dir)))?;
            let rules = tmp.path().join("rules.yaml");
            std::fs::write(&rules, str_at(cm, "/data/rules.yaml").unwrap_or(""))
                .map_err(|e| format!("writing {}: {e}", rules.display()))?;
            args.push(format!("--identity-rules={}", rules.display()));
        } else {
            args.push(arg.clone());
        }
    }
    let principal = component(dir) == Component::Principal;
    if principal {
        args.extend([
            "--listen-host=127.0.0.1".into(),
            "--listen-port=0".into(),
            "--admin-address=off".into(),
        ]);
    }
    args.push("--metrics-port=0".into());
    args.push(format!(
        "--kubeconfig={}",
        tmp.path().join("missing-kubeconfig").display()
    ));
    let bin = argocd_agent_testkit::harness::binary("argocd-agent").map_err(|e| e.to_string())?;
    let mut cmd = Command::new(bin);
    cmd.env_clear()
        .args(&args)
        .stdout(std::process::Stdio::null());
    cmd.stderr(std::fs::File::create(tmp.path().join("stderr")).map_err(|e| e.to_string())?);
    for (k, v) in &env {
        if LISTEN_ENV.contains(&k.as_str()) {
            check_listen_value(dir, k, v);
        } else {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("spawning argocd-agent: {e}"))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let status = loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(status) => break Some(status),
            None if std::time::Instant::now() >= deadline => {
                // Still running (waiting for an SVID): parsing and validation passed.
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    };
    let stderr = std::fs::read_to_string(tmp.path().join("stderr")).unwrap_or_default();
    match status {
        None => Ok(()),
        Some(_)
            if stderr.contains("error: SVID source") || stderr.contains("error: kubernetes") =>
        {
            Ok(())
        }
        Some(s) => Err(format!(
            "{}: argocd-agent {} exited with {s}: {stderr}",
            rel(dir),
            args.join(" ")
        )),
    }
}

#[test]
fn binary_accepts_every_rendered_deployment_configuration() {
    // In parallel: a Workload API setup waits for its SVID until the 3 s deadline.
    let handles: Vec<_> = rendered()
        .iter()
        .map(|(dir, objects)| std::thread::spawn(move || run_with_rendered_settings(dir, objects)))
        .collect();
    let errors: Vec<String> = handles
        .into_iter()
        .filter_map(|h| match h.join() {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some("a check panicked (see above)".to_owned()),
        })
        .collect();
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// The pod template's single container.
fn container(deploy: &Value) -> &Value {
    &array(deploy, "/spec/template/spec/containers")[0]
}

/// Number of a named container port.
fn container_port(dir: &Path, container: &Value, port_name: &str) -> u64 {
    array(container, "/ports")
        .iter()
        .find(|p| str_at(p, "/name") == Some(port_name))
        .and_then(|p| p.pointer("/containerPort"))
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{}: no container port named {port_name}", rel(dir)))
}

/// Whether the overlay puts the pod in a mesh, and which one.
fn mesh(dir: &Path) -> Option<&'static str> {
    let r = rel(dir);
    if r.contains("istio") {
        Some("istio")
    } else if r.contains("linkerd") {
        Some("linkerd")
    } else {
        None
    }
}

#[test]
fn network_policies_admit_grpc_on_the_listener_and_metrics_only_from_monitoring() {
    for (dir, objects) in rendered() {
        let deploy = deployment(dir, objects);
        let c = container(&deploy);
        let pod_labels = deploy
            .pointer("/spec/template/metadata/labels")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let policies: Vec<&Value> = objects
            .iter()
            .filter(|o| kind(o) == "NetworkPolicy")
            .collect();
        assert_eq!(policies.len(), 1, "{}: one NetworkPolicy", rel(dir));
        let np = policies[0];
        let selector = np
            .pointer("/spec/podSelector/matchLabels")
            .and_then(Value::as_object)
            .unwrap_or_else(|| panic!("{}: NetworkPolicy without matchLabels", rel(dir)));
        assert!(!selector.is_empty(), "{}: selects every pod", rel(dir));
        for (k, v) in selector {
            assert_eq!(
                pod_labels.get(k),
                Some(v),
                "{}: NetworkPolicy selector {k}={v} does not select the Deployment's pods",
                rel(dir)
            );
        }
        assert_eq!(
            np.pointer("/spec/policyTypes"),
            Some(&serde_json::json!(["Ingress"])),
            "{}: policyTypes",
            rel(dir)
        );
        // Every rule names ports, and every named port is one of the container's.
        let mut admitted: BTreeMap<String, Option<Value>> = BTreeMap::new();
        for rule in array(np, "/spec/ingress") {
            let ports = array(rule, "/ports");
            assert!(
                !ports.is_empty(),
                "{}: an ingress rule without ports admits every port: {rule}",
                rel(dir)
            );
            for p in ports {
                let name = str_at(p, "/port")
                    .unwrap_or_else(|| panic!("{}: use named ports: {p}", rel(dir)));
                container_port(dir, c, name);
                admitted.insert(name.to_owned(), rule.pointer("/from").cloned());
            }
        }
        let monitoring = serde_json::json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]);
        assert_eq!(
            admitted.get("metrics"),
            Some(&Some(monitoring)),
            "{}: metrics must be admitted from the monitoring namespace only",
            rel(dir)
        );
        match component(dir) {
            Component::Agent => assert_eq!(
                admitted.keys().collect::<Vec<_>>(),
                ["metrics"],
                "{}: the agent accepts nothing but metrics/health",
                rel(dir)
            ),
            Component::Principal => {
                assert_eq!(
                    admitted.keys().collect::<Vec<_>>(),
                    ["grpc", "metrics", "redis-proxy"],
                    "{}: the principal accepts gRPC, metrics and the Redis proxy only",
                    rel(dir)
                );
                // argocd-server, and the other replicas forwarding keys (--ha).
                let redis_clients = serde_json::json!([
                    {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "argocd-server"}}},
                    {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "argocd-agent-principal"}}}
                ]);
                assert_eq!(
                    admitted.get("redis-proxy"),
                    Some(&Some(redis_clients)),
                    "{}: the Redis proxy must be admitted from argocd-server and the principal's replicas only",
                    rel(dir)
                );
                let from = admitted["grpc"].clone();
                let gateway = |ns: &str, key: &str, value: &str| {
                    Some(serde_json::json!([{
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                        "podSelector": {"matchLabels": {key: value}}
                    }]))
                };
                let want = match mesh(dir) {
                    None => None,
                    Some("istio") => gateway("istio-system", "istio", "eastwestgateway"),
                    Some(_) => gateway("linkerd-multicluster", "app", "linkerd-gateway"),
                };
                assert_eq!(from, want, "{}: sources admitted to gRPC", rel(dir));
                // The NetworkPolicy's grpc port is the one the Service sends agents to.
                let svc = find(objects, "Service", "argocd-agent-principal")
                    .unwrap_or_else(|| panic!("{}: no principal Service", rel(dir)));
                assert!(
                    array(svc, "/spec/ports")
                        .iter()
                        .any(|p| str_at(p, "/targetPort") == Some("grpc")),
                    "{}: the Service does not target the grpc port",
                    rel(dir)
                );
            }
        }
    }
}

#[test]
fn metrics_and_health_bind_the_pod_ip_on_the_declared_port() {
    for (dir, objects) in rendered() {
        let deploy = deployment(dir, objects);
        let c = container(&deploy);
        let args: Vec<&str> = array(c, "/args").iter().filter_map(Value::as_str).collect();
        assert!(
            args.contains(&"--metrics-host=$(POD_IP)"),
            "{}: metrics must bind the pod IP: {args:?}",
            rel(dir)
        );
        let pod_ip = array(c, "/env")
            .iter()
            .filter(|e| str_at(e, "/name") == Some("POD_IP"))
            .collect::<Vec<_>>();
        assert_eq!(pod_ip.len(), 1, "{}: one POD_IP variable", rel(dir));
        assert_eq!(
            str_at(pod_ip[0], "/valueFrom/fieldRef/fieldPath"),
            Some("status.podIP"),
            "{}: POD_IP source",
            rel(dir)
        );
        // The port the binary binds (params) is the declared container port.
        let key = match component(dir) {
            Component::Principal => "principal.metrics.port",
            Component::Agent => "agent.metrics.port",
        };
        let params = find(objects, "ConfigMap", "argocd-agent-params").expect("params");
        let port = str_at(params, &format!("/data/{key}"))
            .unwrap_or_else(|| panic!("{}: no {key}", rel(dir)));
        assert_eq!(
            port.parse::<u64>().ok(),
            Some(container_port(dir, c, "metrics")),
            "{}: {key} differs from the metrics container port",
            rel(dir)
        );
        // Under Istio, metrics bypass the sidecar (no mesh identity needed to scrape).
        if mesh(dir) == Some("istio") {
            assert_eq!(
                str_at(
                    &deploy,
                    "/spec/template/metadata/annotations/traffic.sidecar.istio.io~1excludeInboundPorts"
                ),
                Some(port),
                "{}: metrics port not excluded from the sidecar",
                rel(dir)
            );
        }
    }
}

fn probe<'a>(dir: &Path, c: &'a Value, which: &str) -> &'a Value {
    c.pointer(&format!("/{which}"))
        .unwrap_or_else(|| panic!("{}: no {which}", rel(dir)))
}

fn http_path(p: &Value) -> Option<&str> {
    (str_at(p, "/httpGet/port") == Some("metrics"))
        .then(|| str_at(p, "/httpGet/path"))
        .flatten()
}

#[test]
fn probes_wait_for_the_first_svid_and_readiness_uses_readyz() {
    for (dir, objects) in rendered() {
        let deploy = deployment(dir, objects);
        let c = container(&deploy);
        let startup = probe(dir, c, "startupProbe");
        let readiness = probe(dir, c, "readinessProbe");
        let liveness = probe(dir, c, "livenessProbe");
        // Start-up may wait minutes for SPIRE to attest the pod before liveness applies.
        let num = |p: &Value, f: &str, default: u64| {
            p.pointer(f).and_then(Value::as_u64).unwrap_or(default)
        };
        let budget = num(startup, "/periodSeconds", 10) * num(startup, "/failureThreshold", 3);
        assert!(
            budget >= 120,
            "{}: startupProbe allows only {budget}s for the first SVID",
            rel(dir)
        );
        assert_eq!(
            http_path(readiness),
            Some("/readyz"),
            "{}: readiness must use /readyz: {readiness}",
            rel(dir)
        );
        match component(dir) {
            Component::Principal => {
                assert_eq!(http_path(startup), Some("/healthz"), "{}", rel(dir));
                assert_eq!(http_path(liveness), Some("/healthz"), "{}", rel(dir));
            }
            Component::Agent => {
                // A disconnected agent must not be restarted: listener checks only.
                for p in [startup, liveness] {
                    assert_eq!(
                        str_at(p, "/tcpSocket/port"),
                        Some("metrics"),
                        "{}: agent start-up/liveness: {p}",
                        rel(dir)
                    );
                }
            }
        }
    }
}

#[test]
fn mesh_policies_admit_exactly_the_agents_the_identity_rules_map() {
    for (dir, objects) in rendered()
        .iter()
        .filter(|(d, _)| component(d) == Component::Principal && mesh(d).is_some())
    {
        // The rules the principal loads are the overlay's rules.yaml, the generator's input.
        let file = dir.join("rules.yaml");
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: reading rules.yaml: {e}", rel(dir)));
        let cm = find(objects, "ConfigMap", "argocd-agent-identity-rules")
            .unwrap_or_else(|| panic!("{}: no identity rules ConfigMap", rel(dir)));
        assert_eq!(
            str_at(cm, "/data/rules.yaml"),
            Some(text.as_str()),
            "{}: the rules ConfigMap is not rules.yaml",
            rel(dir)
        );
        let rules = argocd_agent_domain::RuleSet::from_yaml(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", rel(dir)));
        let rule_count = text.matches("exact:").count();
        // The identities the mesh admits, as SPIFFE IDs.
        let admitted: Vec<String> = match mesh(dir) {
            Some("istio") => {
                let ap = find(objects, "AuthorizationPolicy", "argocd-agent-principal")
                    .unwrap_or_else(|| panic!("{}: no AuthorizationPolicy", rel(dir)));
                array(ap, "/spec/rules")
                    .iter()
                    .flat_map(|r| array(r, "/from"))
                    .flat_map(|f| array(f, "/source/principals"))
                    .filter_map(Value::as_str)
                    .map(|p| format!("spiffe://{p}"))
                    .collect()
            }
            _ => {
                let auth = find(objects, "MeshTLSAuthentication", "argocd-agent-principal")
                    .unwrap_or_else(|| panic!("{}: no MeshTLSAuthentication", rel(dir)));
                array(auth, "/spec/identities")
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|i| {
                        // <sa>.<ns>.serviceaccount.identity.linkerd.<td>
                        let (sa_ns, td) = i
                            .split_once(".serviceaccount.identity.linkerd.")
                            .unwrap_or_else(|| panic!("{}: identity {i}", rel(dir)));
                        let (sa, ns) = sa_ns
                            .split_once('.')
                            .unwrap_or_else(|| panic!("{}: identity {i}", rel(dir)));
                        format!("spiffe://{td}/ns/{ns}/sa/{sa}")
                    })
                    .collect()
            }
        };
        assert!(
            admitted.iter().all(|a| !a.contains('*')),
            "{}: the mesh admits a wildcard: {admitted:?}",
            rel(dir)
        );
        assert_eq!(
            admitted.len(),
            rule_count,
            "{}: the mesh admits {admitted:?}, the rules list {rule_count} agents",
            rel(dir)
        );
        for id in &admitted {
            let parsed = argocd_agent_identity::SpiffeId::parse(id)
                .unwrap_or_else(|e| panic!("{}: {id}: {e}", rel(dir)));
            rules.map(&parsed).unwrap_or_else(|e| {
                panic!("{}: the mesh admits {id}, the rules deny it: {e}", rel(dir))
            });
        }
    }
}

#[test]
fn spire_and_pem_principals_are_reachable_from_other_clusters_with_client_certificates_kept() {
    for (dir, objects) in rendered()
        .iter()
        .filter(|(d, _)| component(d) == Component::Principal)
    {
        let r = rel(dir);
        let load_balancers: Vec<&Value> = objects
            .iter()
            .filter(|o| kind(o) == "Service" && str_at(o, "/spec/type") == Some("LoadBalancer"))
            .collect();
        let gateways: Vec<&Value> = objects.iter().filter(|o| kind(o) == "Gateway").collect();
        let routes: Vec<&Value> = objects.iter().filter(|o| kind(o) == "TLSRoute").collect();
        if r == "principal" || mesh(dir).is_some() {
            // The base leaves exposure to the overlays; meshes bring their own gateways.
            assert!(
                load_balancers.is_empty() && gateways.is_empty(),
                "{r}: unexpected exposure"
            );
            continue;
        }
        // Exposure is layer 4 or TLS passthrough only: the principal terminates TLS and
        // verifies the agent's client certificate itself (--auth spiffe).
        let params = find(objects, "ConfigMap", "argocd-agent-params").expect("params");
        assert_eq!(
            str_at(params, "/data/principal.auth"),
            Some("spiffe"),
            "{r}: the principal must verify client certificates itself"
        );
        assert_eq!(
            load_balancers.len() + gateways.len(),
            1,
            "{r}: exactly one way in from other clusters (LoadBalancer or Gateway)"
        );
        let deploy = deployment(dir, objects);
        let grpc = container_port(dir, container(&deploy), "grpc");
        let svc_port_to_grpc = |svc: &Value, port: u64| {
            array(svc, "/spec/ports").iter().any(|p| {
                p.pointer("/port").and_then(Value::as_u64) == Some(port)
                    && (str_at(p, "/targetPort") == Some("grpc")
                        || p.pointer("/targetPort").and_then(Value::as_u64) == Some(grpc))
            })
        };
        for lb in &load_balancers {
            let ports = array(lb, "/spec/ports");
            assert_eq!(ports.len(), 1, "{r}: the LoadBalancer exposes gRPC only");
            assert!(
                svc_port_to_grpc(lb, 8443),
                "{r}: LoadBalancer must target grpc"
            );
            assert_eq!(
                lb.pointer("/spec/selector/app.kubernetes.io~1name")
                    .and_then(Value::as_str),
                Some("argocd-agent-principal"),
                "{r}: LoadBalancer selector"
            );
        }
        for gw in &gateways {
            let listeners = array(gw, "/spec/listeners");
            assert!(!listeners.is_empty(), "{r}: Gateway without listeners");
            for l in listeners {
                assert_eq!(str_at(l, "/protocol"), Some("TLS"), "{r}: {l}");
                assert_eq!(
                    str_at(l, "/tls/mode"),
                    Some("Passthrough"),
                    "{r}: a terminating Gateway would drop the client certificate: {l}"
                );
            }
            assert_eq!(routes.len(), 1, "{r}: one TLSRoute");
            let route = routes[0];
            let parent = &array(route, "/spec/parentRefs")[0];
            assert_eq!(str_at(parent, "/name"), Some(name(gw)), "{r}: parentRef");
            let section = str_at(parent, "/sectionName").unwrap_or("");
            let listener = listeners
                .iter()
                .find(|l| str_at(l, "/name") == Some(section))
                .unwrap_or_else(|| panic!("{r}: no listener {section}"));
            let hostnames: Vec<&str> = array(route, "/spec/hostnames")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            assert_eq!(
                hostnames,
                [str_at(listener, "/hostname").unwrap_or("")],
                "{r}: the route's SNI host name must be the listener's"
            );
            for backend in array(route, "/spec/rules")
                .iter()
                .flat_map(|rule| array(rule, "/backendRefs"))
            {
                let svc = find(objects, "Service", str_at(backend, "/name").unwrap_or(""))
                    .unwrap_or_else(|| panic!("{r}: backend {backend} is not rendered"));
                let port = backend
                    .pointer("/port")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                assert!(
                    svc_port_to_grpc(svc, port),
                    "{r}: backend {backend} does not reach the grpc port"
                );
            }
        }
    }
}
