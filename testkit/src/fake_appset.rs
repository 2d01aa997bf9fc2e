//! A stand-in for Argo CD's ApplicationSet controller on one namespace of a cluster (the hub,
//! or an autonomous spoke), for the e2e suites: the list and cluster generators, template
//! rendering, and the Applications it owns kept in step with what it generates.
//!
//! Modelled from argoproj/argo-cd:
//! - `applicationset/controllers/applicationset_controller.go` (`Reconcile`): every
//!   ApplicationSet is generated into a desired list of Applications, each created or
//!   updated in the ApplicationSet's namespace (`createOrUpdateInCluster`: the controller
//!   owns `spec`, labels, annotations and finalizers of what it generated, and sets an
//!   owner reference with `controller: true` and `blockOwnerDeletion: true` to the set), and
//!   Applications it owns that are no longer generated are deleted (`deleteInCluster`, the
//!   default `create-update-delete` policy);
//! - `applicationset/generators/list.go`: one parameter set per element of
//!   `list.elements` (string values);
//! - `applicationset/generators/cluster.go`: one parameter set per Argo CD cluster Secret
//!   (label `argocd.argoproj.io/secret-type: cluster`) in the controller's namespace
//!   matching `clusters.selector.matchLabels`, with `name`, `nameNormalized`, `server` and
//!   `metadata.labels.<key>` (the principal's self-registered agent Secrets are such
//!   Secrets: their `name` is the agent's name);
//! - `applicationset/utils/utils.go`: without `goTemplate`, `{{param}}` placeholders are
//!   replaced in every string of `spec.template` (fasttemplate).
//!
//! When an ApplicationSet is deleted, Kubernetes' garbage collector deletes the Applications
//! it owns (owner references); the test API server has no garbage collector, so this
//! stand-in deletes them itself. Not modelled: `goTemplate`, the other generators (git,
//! matrix, merge, SCM, pull request, plugin), `templatePatch`, progressive syncs,
//! `preserveResourcesOnDeletion`, `syncPolicy.applicationsSync`, status conditions.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::{Map, Value, json};

use crate::harness::{HarnessError, cluster_secret_field};

/// The label that makes a Secret an Argo CD cluster.
const CLUSTER_SECRET_LABEL: &str = "argocd.argoproj.io/secret-type=cluster";

/// Runs until the task is dropped: every `every`, the ApplicationSets of `appsets` are
/// generated into Applications of `apps` (same namespace), cluster Secrets read from
/// `secrets` (the controller's namespace).
pub async fn run(
    appsets: Api<DynamicObject>,
    apps: Api<DynamicObject>,
    secrets: Api<DynamicObject>,
    every: Duration,
) -> Result<(), HarnessError> {
    loop {
        if let Err(e) = reconcile_all(&appsets, &apps, &secrets).await {
            tracing::debug!(error = %e, "simulated ApplicationSet controller: pass failed (will retry)");
        }
        tokio::time::sleep(every).await;
    }
}

/// One pass over every ApplicationSet, then the garbage collection of orphans.
async fn reconcile_all(
    appsets: &Api<DynamicObject>,
    apps: &Api<DynamicObject>,
    secrets: &Api<DynamicObject>,
) -> Result<(), HarnessError> {
    let sets = appsets.list(&ListParams::default()).await?.items;
    let mut live = HashSet::new();
    for set in &sets {
        let set = serde_json::to_value(set)?;
        let Some(uid) = set["metadata"]["uid"].as_str() else {
            continue;
        };
        live.insert(uid.to_owned());
        let params = generate(&set, secrets).await?;
        let desired: Vec<Value> = params.iter().filter_map(|p| render(&set, p)).collect();
        apply(apps, &set, uid, &desired).await?;
    }
    // Garbage collection: Applications whose owning ApplicationSet is gone.
    for app in apps.list(&ListParams::default()).await?.items {
        let owner = owner_uid(&app);
        if let Some(owner) = owner
            && !live.contains(&owner)
            && let Some(name) = app.metadata.name.as_deref()
        {
            let _ = apps.delete(name, &DeleteParams::default()).await;
        }
    }
    Ok(())
}

/// The uid of the ApplicationSet that controls `app`, if one does.
fn owner_uid(app: &DynamicObject) -> Option<String> {
    app.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == "ApplicationSet" && o.controller == Some(true))
        .map(|o| o.uid.clone())
}

/// The parameter sets of every generator of `set`, in order.
async fn generate(
    set: &Value,
    secrets: &Api<DynamicObject>,
) -> Result<Vec<BTreeMap<String, String>>, HarnessError> {
    let mut out = Vec::new();
    for g in set["spec"]["generators"].as_array().into_iter().flatten() {
        if let Some(elements) = g["list"]["elements"].as_array() {
            for e in elements {
                let params = e
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
                    .collect();
                out.push(params);
            }
        }
        if let Some(clusters) = g.get("clusters") {
            let mut selector = vec![CLUSTER_SECRET_LABEL.to_owned()];
            for (k, v) in clusters["selector"]["matchLabels"]
                .as_object()
                .into_iter()
                .flatten()
            {
                selector.push(format!("{k}={}", v.as_str().unwrap_or_default()));
            }
            let list = secrets
                .list(&ListParams::default().labels(&selector.join(",")))
                .await?;
            for s in list.items {
                out.push(cluster_params(&serde_json::to_value(&s)?));
            }
        }
    }
    Ok(out)
}

/// The cluster generator's parameters of one cluster Secret.
fn cluster_params(secret: &Value) -> BTreeMap<String, String> {
    let field = |k: &str| cluster_secret_field(secret, k);
    let name = field("name");
    let mut p = BTreeMap::from([
        (
            "nameNormalized".to_owned(),
            name.to_lowercase().replace(['_', ' '], "-"),
        ),
        ("name".to_owned(), name),
        ("server".to_owned(), field("server")),
    ]);
    for (k, v) in secret["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
    {
        p.insert(
            format!("metadata.labels.{k}"),
            v.as_str().unwrap_or_default().to_owned(),
        );
    }
    p
}

/// The Application `params` make of `set`'s template; `None` without a name.
fn render(set: &Value, params: &BTreeMap<String, String>) -> Option<Value> {
    let mut template = set["spec"]["template"].clone();
    substitute(&mut template, params);
    let name = template["metadata"]["name"].as_str()?.to_owned();
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(name));
    metadata.insert("namespace".into(), set["metadata"]["namespace"].clone());
    for k in ["labels", "annotations", "finalizers"] {
        if let Some(v) = template["metadata"].get(k).filter(|v| !v.is_null()) {
            metadata.insert(k.into(), v.clone());
        }
    }
    Some(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": metadata,
        "spec": template["spec"],
    }))
}

/// Replaces `{{key}}` (spaces allowed inside the braces) in every string of `v`.
fn substitute(v: &mut Value, params: &BTreeMap<String, String>) {
    match v {
        Value::String(s) => {
            for (k, val) in params {
                for pat in [format!("{{{{{k}}}}}"), format!("{{{{ {k} }}}}")] {
                    if s.contains(&pat) {
                        *s = s.replace(&pat, val);
                    }
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| substitute(x, params)),
        Value::Object(o) => o.values_mut().for_each(|x| substitute(x, params)),
        _ => {}
    }
}

/// Creates or updates each desired Application (owned by `set`) and deletes those `set`
/// owns that are no longer desired.
async fn apply(
    apps: &Api<DynamicObject>,
    set: &Value,
    uid: &str,
    desired: &[Value],
) -> Result<(), HarnessError> {
    let owner = json!([{
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "ApplicationSet",
        "name": set["metadata"]["name"],
        "uid": uid,
        "controller": true,
        "blockOwnerDeletion": true,
    }]);
    let mut names = HashSet::new();
    for app in desired {
        let name = app["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        names.insert(name.clone());
        let mut app = app.clone();
        app["metadata"]["ownerReferences"] = owner.clone();
        match apps.get_opt(&name).await? {
            None => {
                let obj: DynamicObject = serde_json::from_value(app)?;
                apps.create(&PostParams::default(), &obj).await?;
            }
            Some(cur) => {
                let cur = serde_json::to_value(&cur)?;
                let same = cur["spec"] == app["spec"]
                    && ["labels", "annotations", "finalizers"].iter().all(|k| {
                        cur["metadata"][k] == app["metadata"][k]
                            || app["metadata"].get(*k).is_none()
                    })
                    && cur["metadata"]["ownerReferences"] == owner;
                if same {
                    continue;
                }
                let mut next = cur.clone();
                next["spec"] = app["spec"].clone();
                for k in ["labels", "annotations", "finalizers"] {
                    if let Some(v) = app["metadata"].get(k) {
                        next["metadata"][k] = v.clone();
                    }
                }
                next["metadata"]["ownerReferences"] = owner.clone();
                let obj: DynamicObject = serde_json::from_value(next)?;
                apps.replace(&name, &PostParams::default(), &obj).await?;
            }
        }
    }
    for app in apps.list(&ListParams::default()).await?.items {
        if owner_uid(&app).as_deref() == Some(uid)
            && let Some(name) = app.metadata.name.as_deref()
            && !names.contains(name)
        {
            let _ = apps.delete(name, &DeleteParams::default()).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_take_list_parameters_in_every_string() {
        let set = json!({
            "metadata": {"name": "guestbooks", "namespace": "argocd"},
            "spec": {"template": {
                "metadata": {"name": "{{app}}-{{ cluster }}", "labels": {"team": "{{team}}"}},
                "spec": {"destination": {"name": "{{cluster}}", "namespace": "{{app}}"},
                         "project": "default"}
            }}
        });
        let params = BTreeMap::from([
            ("app".to_owned(), "guestbook".to_owned()),
            ("cluster".to_owned(), "agent-a".to_owned()),
            ("team".to_owned(), "blue".to_owned()),
        ]);
        let app = render(&set, &params).unwrap();
        assert_eq!(app["metadata"]["name"], "guestbook-agent-a");
        assert_eq!(app["metadata"]["namespace"], "argocd");
        assert_eq!(app["metadata"]["labels"]["team"], "blue");
        assert_eq!(
            app["spec"]["destination"],
            json!({"name": "agent-a", "namespace": "guestbook"})
        );
    }

    #[test]
    fn cluster_secrets_give_name_server_and_labels() {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let secret = json!({
            "metadata": {"labels": {"argocd.argoproj.io/secret-type": "cluster", "env": "prod"}},
            "data": {"name": b64("agent-a"), "server": b64("https://hub/agents/agent-a")}
        });
        let p = cluster_params(&secret);
        assert_eq!(p["name"], "agent-a");
        assert_eq!(p["server"], "https://hub/agents/agent-a");
        assert_eq!(p["metadata.labels.env"], "prod");
    }
}
