//! The Helm charts under `deploy/helm/`: `helm lint --strict` and `helm template` for every
//! documented profile, every rendered object validated against Kubernetes' own schemas (and
//! Istio's and the Prometheus Operator's), and each profile that has a kustomize equivalent
//! rendering the same objects as that overlay (the kustomize files are the source of truth).
//!
//! The comparison is of whole objects, normalized. Intentional differences, removed before
//! comparing:
//! - Helm's labels (`helm.sh/chart`, `app.kubernetes.io/managed-by`, `app.kubernetes.io/instance`);
//! - `app.kubernetes.io/part-of`: the chart puts it on every object, kustomize only on the
//!   objects of the bases (not on those its components add); a separate test checks the chart;
//! - the text of the identity rules file (comments, layout): its YAML is compared;
//! - empty maps and lists (kustomize leaves `volumes: []` where a patch removed the last one).
//!
//! helm comes from `HELM`, `.tools/bin/helm` (what `.ci/run` installs) or `PATH`. Without
//! it the tests skip with a message, except under `CI=true` or with `HELM` set (as `.ci/run`
//! sets it), where they fail.
#![forbid(unsafe_code)]

#[path = "support/k8s_schema.rs"]
mod k8s_schema;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The workspace root (`e2e/..`).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// helm, or `None` (with the reason printed) when it is not installed and this is not CI.
fn helm() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("HELM").map(PathBuf::from),
        Some(workspace_root().join(".tools/bin/helm")),
        Some(PathBuf::from("helm")),
    ];
    for c in candidates.into_iter().flatten() {
        let works = Command::new(&c)
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
        if works {
            return Some(c);
        }
    }
    if let Some(set) = std::env::var_os("HELM") {
        panic!(
            "HELM={} does not run `helm version`",
            Path::new(&set).display()
        );
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "helm not found (HELM unset, no .tools/bin/helm, none on PATH) and CI=true: .ci/run installs it"
    );
    eprintln!(
        "SKIPPED: helm is not installed (set HELM, or run .ci/run once to put it in .tools/bin)"
    );
    None
}

/// A documented profile: a chart with one of its `profiles/*.yaml` (or none: the defaults).
#[derive(Debug, Clone, Copy)]
struct Profile {
    chart: &'static str,
    name: &'static str,
    /// What kustomize renders for the same settings: an overlay under `deploy/`, plus
    /// components under `deploy/components/` added to it.
    kustomize: Option<(&'static str, &'static [&'static str])>,
}

const PROFILES: [Profile; 13] = [
    Profile {
        chart: "argocd-agent-principal",
        name: "default",
        kustomize: Some(("overlays/spire/principal", &[])),
    },
    Profile {
        chart: "argocd-agent-principal",
        name: "pem-files",
        kustomize: Some(("overlays/pem-files/principal", &[])),
    },
    Profile {
        chart: "argocd-agent-principal",
        name: "istio",
        kustomize: Some(("overlays/istio/principal", &[])),
    },
    Profile {
        chart: "argocd-agent-principal",
        name: "linkerd",
        kustomize: Some(("overlays/linkerd/principal", &[])),
    },
    Profile {
        chart: "argocd-agent-principal",
        name: "single-replica",
        kustomize: None,
    },
    Profile {
        chart: "argocd-agent-principal",
        name: "resource-proxy",
        kustomize: None,
    },
    Profile {
        chart: "argocd-agent-principal",
        name: "servicemonitor",
        kustomize: None,
    },
    Profile {
        chart: "argocd-agent-agent",
        name: "default",
        kustomize: Some(("overlays/spire/agent", &[])),
    },
    Profile {
        chart: "argocd-agent-agent",
        name: "pem-files",
        kustomize: Some(("overlays/pem-files/agent", &[])),
    },
    Profile {
        chart: "argocd-agent-agent",
        name: "istio",
        kustomize: Some(("overlays/istio/agent", &[])),
    },
    Profile {
        chart: "argocd-agent-agent",
        name: "linkerd",
        kustomize: Some(("overlays/linkerd/agent", &[])),
    },
    Profile {
        chart: "argocd-agent-agent",
        name: "resource-proxy",
        kustomize: Some(("overlays/spire/agent", &["agent-resource-proxy"])),
    },
    Profile {
        chart: "argocd-agent-agent",
        name: "servicemonitor",
        kustomize: None,
    },
];

impl Profile {
    fn chart_dir(&self) -> PathBuf {
        workspace_root().join("deploy/helm").join(self.chart)
    }

    /// `-f profiles/<name>.yaml`, or nothing for the defaults.
    fn values_args(&self) -> Vec<String> {
        if self.name == "default" {
            return Vec::new();
        }
        let file = self
            .chart_dir()
            .join(format!("profiles/{}.yaml", self.name));
        vec!["-f".into(), file.to_string_lossy().into_owned()]
    }

    fn label(&self) -> String {
        format!("{} ({})", self.chart, self.name)
    }
}

/// Runs helm with `args`; stdout, or the failure with stderr.
fn run_helm(helm: &Path, args: &[String]) -> Result<String, String> {
    let out = Command::new(helm)
        .args(args)
        .output()
        .map_err(|e| format!("running {}: {e}", helm.display()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "helm {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The objects of a multi-document YAML text (empty documents left out).
fn parse_objects(what: &str, yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .unwrap_or_else(|e| panic!("{what}: output is not YAML: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// `helm template` of a profile into namespace argocd (the overlays' namespace), with `extra`
/// arguments (e.g. `--set`).
fn render_chart(helm: &Path, p: &Profile, extra: &[&str]) -> Result<Vec<Value>, String> {
    let mut args: Vec<String> = vec![
        "template".into(),
        "argocd-agent".into(),
        p.chart_dir().to_string_lossy().into_owned(),
        "--namespace".into(),
        "argocd".into(),
    ];
    args.extend(p.values_args());
    args.extend(extra.iter().map(|s| s.to_string()));
    let yaml = run_helm(helm, &args)?;
    Ok(parse_objects(&p.label(), &yaml))
}

/// kubectl for `kubectl kustomize` (the one deploy_render.rs uses).
fn kubectl() -> PathBuf {
    argocd_agent_testkit::harness::kubectl()
}

/// What kustomize renders for a profile's equivalent: the overlay alone, or a kustomization
/// in a temporary directory under `target/` that adds the components to it.
fn render_kustomize(overlay: &str, components: &[&str]) -> Vec<Value> {
    let root = workspace_root();
    let scratch;
    let dir = if components.is_empty() {
        root.join("deploy").join(overlay)
    } else {
        // kustomize takes only relative paths: the directory is two levels below the root.
        let base = root.join("target/helm-charts-test");
        std::fs::create_dir_all(&base).expect("creating target/helm-charts-test");
        scratch = tempfile::tempdir_in(&base).expect("temporary kustomization directory");
        let mut text = format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../../deploy/{overlay}\ncomponents:\n"
        );
        for c in components {
            text.push_str(&format!("  - ../../../deploy/components/{c}\n"));
        }
        std::fs::write(scratch.path().join("kustomization.yaml"), text)
            .expect("writing the kustomization");
        scratch.path().to_path_buf()
    };
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("running kubectl kustomize {overlay}: {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize {overlay} {components:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_objects(overlay, &String::from_utf8_lossy(&out.stdout))
}

/// Removes empty maps and lists, recursively (equivalent in Kubernetes objects).
fn drop_empty(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.values_mut().for_each(drop_empty);
            map.retain(|_, x| !is_empty(x));
        }
        Value::Array(items) => items.iter_mut().for_each(drop_empty),
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

/// An object with the intentional differences (module docs) removed.
fn normalize(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(labels) = o
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        for k in [
            "helm.sh/chart",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/part-of",
        ] {
            labels.remove(k);
        }
    }
    if let Some(rules) = o.pointer_mut("/data/rules.yaml") {
        let text = rules.as_str().unwrap_or_default().to_owned();
        *rules = serde_saphyr::from_str::<Value>(&text)
            .unwrap_or_else(|e| panic!("rules.yaml is not YAML: {e}\n{text}"));
    }
    drop_empty(&mut o);
    o
}

fn key(o: &Value) -> (String, String) {
    let s = |p: &str| {
        o.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    (s("/kind"), s("/metadata/name"))
}

fn by_key(objects: &[Value]) -> BTreeMap<(String, String), Value> {
    objects.iter().map(|o| (key(o), normalize(o))).collect()
}

/// How `a` and `b` differ: the JSON pointers of the first differing leaves.
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let null = Value::Null;
                let p = format!("{path}/{}", k.replace('~', "~0").replace('/', "~1"));
                differences(
                    x.get(k).unwrap_or(&null),
                    y.get(k).unwrap_or(&null),
                    &p,
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (l, r)) in x.iter().zip(y).enumerate() {
                differences(l, r, &format!("{path}/{i}"), out);
            }
        }
        _ if a != b => out.push(format!("{path}: kustomize {a} / chart {b}")),
        _ => {}
    }
}

#[test]
fn every_profile_file_is_tested_and_every_tested_profile_exists() {
    let mut on_disk = BTreeSet::new();
    for chart in ["argocd-agent-principal", "argocd-agent-agent"] {
        let dir = workspace_root()
            .join("deploy/helm")
            .join(chart)
            .join("profiles");
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            let name = path
                .file_stem()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            on_disk.insert((chart.to_owned(), name));
        }
        on_disk.insert((chart.to_owned(), "default".to_owned()));
    }
    let tested: BTreeSet<(String, String)> = PROFILES
        .iter()
        .map(|p| (p.chart.to_owned(), p.name.to_owned()))
        .collect();
    assert_eq!(
        on_disk, tested,
        "profiles on disk vs profiles this test renders"
    );
}

#[test]
fn charts_lint_strictly_in_every_profile() {
    let Some(helm) = helm() else { return };
    let mut failures = Vec::new();
    for p in PROFILES {
        let mut args = vec![
            "lint".into(),
            p.chart_dir().to_string_lossy().into_owned(),
            "--strict".into(),
        ];
        args.extend(p.values_args());
        args.extend(["--namespace".into(), "argocd".into()]);
        if let Err(e) = run_helm(&helm, &args) {
            failures.push(format!("{}: {e}", p.label()));
        }
    }
    assert!(
        failures.is_empty(),
        "helm lint failed:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_rendered_object_is_valid_against_kubernetes_schemas() {
    let Some(helm) = helm() else { return };
    // The validator refuses what Kubernetes' schema refuses (a control).
    let broken = serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "s"}, "spec": {"ports": [{"port": "grpc"}]}});
    assert!(
        !k8s_schema::problems("control", &[broken]).is_empty(),
        "the validator accepts a Service with a named port number"
    );
    let mut problems = Vec::new();
    let mut checked = 0;
    for p in PROFILES {
        // With the chart's test pod: it is rendered and installed like the rest.
        let objects = render_chart(&helm, &p, &["--set", "tests.enabled=true"])
            .unwrap_or_else(|e| panic!("{}: {e}", p.label()));
        checked += objects.len();
        problems.extend(k8s_schema::problems(&p.label(), &objects));
    }
    assert!(checked > 100, "only {checked} objects rendered");
    assert!(
        problems.is_empty(),
        "objects the schemas refuse:\n{}",
        problems.join("\n")
    );
}

#[test]
fn chart_profiles_render_what_the_kustomize_overlays_render() {
    let Some(helm) = helm() else { return };
    let mut mismatches = Vec::new();
    for p in PROFILES {
        let Some((overlay, components)) = p.kustomize else {
            continue;
        };
        let chart =
            by_key(&render_chart(&helm, &p, &[]).unwrap_or_else(|e| panic!("{}: {e}", p.label())));
        let kustomize = by_key(&render_kustomize(overlay, components));
        let names =
            |m: &BTreeMap<(String, String), Value>| m.keys().cloned().collect::<BTreeSet<_>>();
        if names(&chart) != names(&kustomize) {
            mismatches.push(format!(
                "{} vs {overlay} {components:?}: objects only in the chart {:?}, only in kustomize {:?}",
                p.label(),
                names(&chart).difference(&names(&kustomize)).collect::<Vec<_>>(),
                names(&kustomize).difference(&names(&chart)).collect::<Vec<_>>()
            ));
        }
        for (k, expected) in &kustomize {
            let Some(actual) = chart.get(k) else { continue };
            let mut diff = Vec::new();
            differences(expected, actual, "", &mut diff);
            if !diff.is_empty() {
                mismatches.push(format!(
                    "{} vs {overlay}: {} {}:\n  {}",
                    p.label(),
                    k.0,
                    k.1,
                    diff.join("\n  ")
                ));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "chart and kustomize differ:\n{}",
        mismatches.join("\n")
    );
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| key(o) == (kind.to_owned(), name.to_owned()))
}

fn profile(chart: &str, name: &str) -> Profile {
    *PROFILES
        .iter()
        .find(|p| p.chart == chart && p.name == name)
        .unwrap_or_else(|| panic!("no profile {chart} {name}"))
}

#[test]
fn profiles_without_an_overlay_render_what_they_document() {
    let Some(helm) = helm() else { return };
    let render = |chart: &str, name: &str| {
        render_chart(&helm, &profile(chart, name), &[])
            .unwrap_or_else(|e| panic!("{chart} {name}: {e}"))
    };
    let single = render("argocd-agent-principal", "single-replica");
    let deploy =
        find(&single, "Deployment", "argocd-agent-principal").expect("principal Deployment");
    assert_eq!(deploy.pointer("/spec/replicas"), Some(&Value::from(1)));
    assert!(
        find(&single, "PodDisruptionBudget", "argocd-agent-principal").is_none(),
        "a PDB for one replica blocks node drains"
    );
    let params = find(&single, "ConfigMap", "argocd-agent-params").expect("params");
    assert_eq!(
        params.pointer("/data/principal.ha.enable"),
        Some(&Value::from("false"))
    );

    let proxy = render("argocd-agent-principal", "resource-proxy");
    let params = find(&proxy, "ConfigMap", "argocd-agent-params").expect("params");
    assert_eq!(
        params.pointer("/data/principal.resource-proxy.enable"),
        Some(&Value::from("true"))
    );
    let service = find(&proxy, "Service", "argocd-agent-principal").expect("Service");
    let ports: Vec<&str> = service
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .expect("ports")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(ports, ["grpc", "metrics", "redis-proxy", "resource-proxy"]);

    for chart in ["argocd-agent-principal", "argocd-agent-agent"] {
        let objects = render(chart, "servicemonitor");
        let sm = objects
            .iter()
            .find(|o| key(o).0 == "ServiceMonitor")
            .expect("a ServiceMonitor");
        assert_eq!(
            sm.pointer("/spec/endpoints/0/port"),
            Some(&Value::from("metrics"))
        );
        let labels = sm.pointer("/metadata/labels/release");
        assert_eq!(
            labels,
            Some(&Value::from("prometheus")),
            "{chart}: additionalLabels"
        );
        let default = render(chart, "default");
        assert!(
            default.iter().all(|o| key(o).0 != "ServiceMonitor"),
            "{chart}: ServiceMonitor is opt-in"
        );
        for o in objects.iter().chain(&default) {
            assert_eq!(
                o.pointer("/metadata/labels/app.kubernetes.io~1part-of"),
                Some(&Value::from("argocd-agent")),
                "{chart}: {:?} lacks the part-of label",
                key(o)
            );
        }
    }
}

#[test]
fn charts_refuse_settings_the_binaries_would_refuse() {
    let Some(helm) = helm() else { return };
    let principal = profile("argocd-agent-principal", "default");
    let agent = profile("argocd-agent-agent", "default");
    let cases: [(&Profile, &[&str], &str); 6] = [
        (
            &agent,
            &["--set", "principalSpiffeId="],
            "principalSpiffeId (or principalTrustDomain) is required",
        ),
        (
            &agent,
            &["--set", "agentMode=hub"],
            "agentMode must be one of",
        ),
        (
            &agent,
            &["--set", "tlsSecretName=x"],
            "Additional property tlsSecretName is not allowed",
        ),
        (
            &principal,
            &["--set", "principal.ha.enable=false"],
            "needs principal.ha.enable=true",
        ),
        (
            &principal,
            &["--set", "identity.mode=istio"],
            "rule \"agent-path\" is a pattern rule",
        ),
        (
            &principal,
            &["--set", "identity.mode=cert-manager"],
            "identity.mode must be one of",
        ),
    ];
    for (p, args, expected) in cases {
        match render_chart(&helm, p, args) {
            Ok(_) => panic!("{} {args:?}: rendered, expected a refusal", p.label()),
            Err(e) => assert!(
                e.contains(expected),
                "{} {args:?}: {e}\n(expected {expected:?})",
                p.label()
            ),
        }
    }
}

/// Keys whose value is one object or list as a whole (documented as one row).
const WHOLE_VALUES: [&str; 8] = [
    "affinity",
    "topologySpreadConstraints",
    "updateStrategy",
    "resources",
    "podSecurityContext",
    "securityContext",
    "gatewayLabels",
    "rules",
];

/// Dotted paths of the documented values: leaves, and whole objects of [`WHOLE_VALUES`].
fn value_keys(prefix: &str, v: &Value, out: &mut Vec<String>) {
    let last = prefix.rsplit('.').next().unwrap_or_default();
    match v {
        Value::Object(map) if !map.is_empty() && !WHOLE_VALUES.contains(&last) => {
            for (k, x) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                value_keys(&path, x, out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

#[test]
fn every_values_key_is_in_the_docs_table() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/helm.md")).expect("docs/helm.md");
    let mut missing = Vec::new();
    for chart in ["argocd-agent-principal", "argocd-agent-agent"] {
        let path = workspace_root()
            .join("deploy/helm")
            .join(chart)
            .join("values.yaml");
        let text = std::fs::read_to_string(&path).expect("values.yaml");
        let values: Value = serde_saphyr::from_str(&text).expect("values.yaml is YAML");
        let mut keys = Vec::new();
        value_keys("", &values, &mut keys);
        assert!(keys.len() > 40, "{chart}: only {} keys", keys.len());
        missing.extend(
            keys.into_iter()
                .filter(|k| !doc.contains(&format!("| `{k}` |")))
                .map(|k| format!("{chart}: {k}")),
        );
    }
    assert!(
        missing.is_empty(),
        "values keys missing from docs/helm.md's tables:\n{}",
        missing.join("\n")
    );
}

/// A kind the charts create: group, version, plural, kind, namespaced, status subresource,
/// and for built-in kinds whether they keep `metadata.generation` (`None`: a custom resource).
type Kind = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    bool,
    Option<bool>,
);

const CHART_KINDS: [Kind; 17] = [
    (
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        true,
        false,
        Some(false),
    ),
    ("", "v1", "services", "Service", true, true, Some(false)),
    (
        "apps",
        "v1",
        "deployments",
        "Deployment",
        true,
        true,
        Some(true),
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "Role",
        true,
        false,
        Some(false),
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        true,
        false,
        Some(false),
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        false,
        Some(false),
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        false,
        Some(false),
    ),
    (
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "NetworkPolicy",
        true,
        false,
        Some(true),
    ),
    (
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        true,
        true,
        Some(true),
    ),
    (
        "security.istio.io",
        "v1",
        "peerauthentications",
        "PeerAuthentication",
        true,
        false,
        None,
    ),
    (
        "security.istio.io",
        "v1",
        "authorizationpolicies",
        "AuthorizationPolicy",
        true,
        false,
        None,
    ),
    (
        "networking.istio.io",
        "v1",
        "sidecars",
        "Sidecar",
        true,
        false,
        None,
    ),
    (
        "networking.istio.io",
        "v1",
        "destinationrules",
        "DestinationRule",
        true,
        false,
        None,
    ),
    (
        "policy.linkerd.io",
        "v1beta3",
        "servers",
        "Server",
        true,
        false,
        None,
    ),
    (
        "policy.linkerd.io",
        "v1alpha1",
        "meshtlsauthentications",
        "MeshTLSAuthentication",
        true,
        false,
        None,
    ),
    (
        "policy.linkerd.io",
        "v1alpha1",
        "authorizationpolicies",
        "AuthorizationPolicy",
        true,
        false,
        None,
    ),
    (
        "monitoring.coreos.com",
        "v1",
        "servicemonitors",
        "ServiceMonitor",
        true,
        false,
        None,
    ),
];

/// The kinds the charts create, registered on the Kubernetes API test server as stored
/// resources, besides its defaults (namespaces, Secrets, ConfigMaps, Leases, ...).
fn chart_resources() -> Vec<argocd_agent_kube_test_server::ResourceType> {
    use argocd_agent_kube_test_server::ResourceType as R;
    let mut all = R::defaults();
    for (group, version, plural, kind, namespaced, status, built_in) in CHART_KINDS {
        let r = R::new(group, version, plural, kind, namespaced, status);
        all.push(match built_in {
            Some(generation) => r.built_in(generation),
            None => r,
        });
    }
    all
}

/// `helm install`s a profile on a fresh Kubernetes API test server (a cluster of its own, as
/// the principal's and an agent's are) and checks every rendered object was stored.
async fn install_on_own_cluster(helm: &Path, p: &Profile) {
    use argocd_agent_kube_test_server::{KubeTestServer, ServerOptions};
    let server = KubeTestServer::start_on(
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        ServerOptions {
            resources: chart_resources(),
            initial_namespaces: vec!["argocd".into()],
            ..Default::default()
        },
    )
    .await
    .expect("starting the Kubernetes API test server");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    server
        .write_kubeconfig(&kubeconfig, "cluster")
        .expect("writing the kubeconfig");
    let mut args: Vec<String> = vec![
        "install".into(),
        p.chart.into(),
        p.chart_dir().to_string_lossy().into_owned(),
        "--namespace".into(),
        "argocd".into(),
        "--kubeconfig".into(),
        kubeconfig.to_string_lossy().into_owned(),
    ];
    args.extend(p.values_args());
    let h = helm.to_path_buf();
    tokio::task::spawn_blocking(move || run_helm(&h, &args))
        .await
        .expect("helm install ran")
        .unwrap_or_else(|e| panic!("{}: {e}", p.label()));
    let resources = chart_resources();
    let rendered = render_chart(helm, p, &[]).unwrap_or_else(|e| panic!("{}: {e}", p.label()));
    for o in &rendered {
        let (kind, name) = key(o);
        let api_version = o["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let plural = &resources
            .iter()
            .find(|r| r.kind == kind && r.group == group)
            .unwrap_or_else(|| panic!("{kind} is not registered"))
            .plural;
        let stored = server.get_object(group, version, plural, Some("argocd"), &name);
        assert!(
            stored.is_some(),
            "{}: {kind} {name} was not created",
            p.label()
        );
    }
    // Helm's release record, in a Secret of the release namespace.
    let releases = server.list_objects("", "v1", "secrets", Some("argocd"));
    assert!(
        releases.iter().any(|s| s["type"] == "helm.sh/release.v1"),
        "{}: no release Secret",
        p.label()
    );
    server.shutdown().await;
}

/// `helm install` of every profile against the Kubernetes API test server, which stores the
/// objects as an API server does (discovery, creates, Helm's release Secret).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_every_profile_on_a_kubernetes_api() {
    let Some(helm) = helm() else { return };
    for p in PROFILES {
        install_on_own_cluster(&helm, &p).await;
    }
}
