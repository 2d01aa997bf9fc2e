//! Argo CD's own CRD schemas as an independent check of the objects the e2e suites leave on
//! the hub and the spokes: the npm package `@kubernetes-models/argo-cd` (Argo CD's schemas
//! with generated validators, not ours), run with node from `testkit/argocd-schema/`.
//! `.ci/run` installs it (`npm ci`).

use std::path::PathBuf;
use std::process::Stdio;

use argocd_agent_kube_test_server::KubeTestServer;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::harness::{HarnessError, app_resource, kube_client, resource};

/// One object the validator refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The object's `kind`.
    pub kind: String,
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The validator's message.
    pub error: String,
}

/// Where the validator and its `node_modules` live.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("argocd-schema")
}

/// Validates `objects` (Applications, AppProjects, ApplicationSets as JSON); the refused
/// ones. Errors when node or the package is missing.
pub async fn validate(objects: &[Value]) -> Result<Vec<Invalid>, HarnessError> {
    let dir = dir();
    if !dir.join("node_modules/@kubernetes-models/argo-cd").exists() {
        return Err(format!(
            "{}/node_modules is missing: run `npm ci --prefix {}` (.ci/run does)",
            dir.display(),
            dir.display()
        )
        .into());
    }
    let mut child = tokio::process::Command::new("node")
        .arg("validate.mjs")
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("node: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("node: no stdin")?;
    let input = serde_json::to_vec(objects)?;
    stdin.write_all(&input).await?;
    drop(stdin);
    let out = child.wait_with_output().await?;
    if out.status.code() == Some(2) || (out.status.code() != Some(0) && out.stdout.is_empty()) {
        return Err(format!(
            "the validator failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let mut invalid = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: Value = serde_json::from_str(line)?;
        if v["ok"] != true {
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
            invalid.push(Invalid {
                kind: s("kind"),
                namespace: s("namespace"),
                name: s("name"),
                error: s("error"),
            });
        }
    }
    Ok(invalid)
}

/// Every Application, AppProject and ApplicationSet stored on `server`, in every namespace,
/// with `apiVersion` and `kind` set (a list's items carry neither).
pub async fn argocd_objects(server: &KubeTestServer) -> Result<Vec<Value>, HarnessError> {
    let client = kube_client(server)?;
    let kinds = [
        app_resource(),
        resource("argoproj.io", "AppProject", "appprojects"),
        resource("argoproj.io", "ApplicationSet", "applicationsets"),
    ];
    let mut out = Vec::new();
    for ar in kinds {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let list = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            // A kind the server does not serve holds nothing.
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(e.into()),
        };
        for item in list.items {
            let mut v = serde_json::to_value(&item)?;
            v["apiVersion"] = Value::from(ar.api_version.clone());
            v["kind"] = Value::from(ar.kind.clone());
            out.push(v);
        }
    }
    Ok(out)
}
