//! Kubernetes' own OpenAPI schemas (npm `kubernetes-models`) and the Istio, Gateway API and Prometheus
//! Operator CRD schemas (`@kubernetes-models/istio`, `gateway-api`, `prometheus-operator`),
//! with their generated validators, run with node from `testkit/k8s-schema/` (`.ci/run`
//! installs the packages with `npm ci`). Shared by the tests that render deploy files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// The validator's verdict on one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `apiVersion/kind/name` of the object.
    pub object: String,
    /// false when no package has a model for the kind (nothing was checked).
    pub known: bool,
    /// The validator's message; empty when the object is valid.
    pub error: String,
}

/// Where the validator and its `node_modules` live.
fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testkit/k8s-schema")
}

/// Validates `objects`; one verdict per object, in order. Panics with what to run when node or
/// the packages are missing (the check cannot be done otherwise).
pub fn validate(objects: &[Value]) -> Vec<Verdict> {
    let dir = dir();
    assert!(
        dir.join("node_modules/kubernetes-models").is_dir(),
        "{}/node_modules is missing: run `npm ci --prefix {}` (.ci/run does)",
        dir.display(),
        dir.display()
    );
    let mut child = Command::new("node")
        .arg("validate.mjs")
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running node (needed for the schema validator): {e}"));
    let input = serde_json::to_vec(objects).expect("objects serialize");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(&input).expect("writing to the validator");
    drop(stdin);
    let out = child.wait_with_output().expect("waiting for the validator");
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "the validator failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let verdicts: Vec<Verdict> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("validator line {line:?}: {e}"));
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
            Verdict {
                object: format!("{}/{}/{}", s("apiVersion"), s("kind"), s("name")),
                known: v["known"] == true,
                error: if v["ok"] == true {
                    String::new()
                } else {
                    s("error")
                },
            }
        })
        .collect();
    assert_eq!(
        verdicts.len(),
        objects.len(),
        "the validator answered for {} of {} objects",
        verdicts.len(),
        objects.len()
    );
    verdicts
}

/// Kinds no package has a schema for, and that may appear in a render unchecked.
pub const UNCHECKED_KINDS: [&str; 3] = [
    "policy.linkerd.io/v1beta3/Server",
    "policy.linkerd.io/v1alpha1/MeshTLSAuthentication",
    "policy.linkerd.io/v1alpha1/AuthorizationPolicy",
];

/// Every problem with `objects` of `what`: invalid objects, and objects of a kind without a
/// schema that is not one of [`UNCHECKED_KINDS`].
pub fn problems(what: &str, objects: &[Value]) -> Vec<String> {
    validate(objects)
        .into_iter()
        .filter_map(|v| {
            let kind = v.object.rsplit_once('/').map_or("", |(k, _)| k);
            if !v.known && !UNCHECKED_KINDS.contains(&kind) {
                Some(format!("{what}: {}: no schema for this kind", v.object))
            } else if !v.error.is_empty() {
                Some(format!("{what}: {}: {}", v.object, v.error))
            } else {
                None
            }
        })
        .collect()
}
