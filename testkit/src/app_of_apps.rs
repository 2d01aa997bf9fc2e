//! The app-of-apps part of the Argo CD stand-in ([`crate::fake_argocd`]): a parent
//! Application whose source holds Application manifests creates, updates and prunes those
//! children, as Argo CD's application controller does when it syncs it (argoproj/argo-cd
//! `controller/sync.go`, `SyncAppState`: the rendered manifests are applied, each stamped
//! with the parent's tracking, and with pruning on, live objects tracked by the parent
//! that are no longer rendered are deleted; `controller/state.go`, `CompareAppState`, for
//! the `status.resources` entries; tracking per `util/argo/resource_tracking.go`: the
//! `argocd.argoproj.io/tracking-id` annotation `<app>:<group>/<kind>:<ns>/<name>`, or the
//! instance label with `application.resourceTrackingMethod: label`).
//!
//! The repository server's stand-in is a ConfigMap, [`REPO_CONFIGMAP`], in the
//! controller's namespace: each key is a source path (`/` written as `_`) and its value a
//! JSON array of manifests. Only Application manifests are applied; others count in
//! `status.resources` and are not created (the stand-in deploys nothing). Sync happens on
//! an operation (its `sync.prune` decides pruning) or, with `spec.syncPolicy.automated`,
//! whenever the children differ from the manifests (`automated.prune` decides pruning).
//!
//! Not modelled: children in another namespace than the controller's (skipped, logged),
//! sync waves, hooks, health of the children, a child already tracked by another parent
//! (left alone, as Argo CD reports a shared-resource conflict).

use std::collections::BTreeMap;

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};

use crate::harness::{HarnessError, merge_patch, resource};

/// Name of the ConfigMap that plays the repository server.
pub const REPO_CONFIGMAP: &str = "argocd-agent-testkit-repo";
/// Argo CD's tracking annotation.
pub const TRACKING_ANNOTATION: &str = "argocd.argoproj.io/tracking-id";
/// Argo CD's default instance label (label tracking).
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// How the controller marks the objects of an Application (argocd-cm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tracking {
    Annotation,
    Label,
}

/// The Application manifests and other manifests `app`'s source renders to, when the
/// repository stand-in has its path.
async fn rendered(api: &Api<DynamicObject>, ns: &str, app: &Value) -> Option<Vec<Value>> {
    let path = app.pointer("/spec/source/path").and_then(Value::as_str)?;
    let repo: Api<DynamicObject> = Api::namespaced_with(
        api.clone().into_client(),
        ns,
        &resource("", "ConfigMap", "configmaps"),
    );
    let cm = repo.get_opt(REPO_CONFIGMAP).await.ok()??;
    let text = cm.data.pointer(&format!(
        "/data/{}",
        path.trim_matches('/').replace('/', "_")
    ))?;
    serde_json::from_str(text.as_str()?).ok()
}

async fn tracking(api: &Api<DynamicObject>, ns: &str) -> Tracking {
    let cms: Api<DynamicObject> = Api::namespaced_with(
        api.clone().into_client(),
        ns,
        &resource("", "ConfigMap", "configmaps"),
    );
    let method = cms
        .get_opt("argocd-cm")
        .await
        .ok()
        .flatten()
        .and_then(|cm| {
            cm.data
                .pointer("/data/application.resourceTrackingMethod")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
    match method.as_deref() {
        Some("label") => Tracking::Label,
        _ => Tracking::Annotation,
    }
}

/// Whether `child` is tracked as a resource of the Application `parent`.
fn tracked_by(child: &Value, parent: &str, tracking: Tracking) -> bool {
    match tracking {
        Tracking::Label => child["metadata"]["labels"][INSTANCE_LABEL].as_str() == Some(parent),
        Tracking::Annotation => child["metadata"]["annotations"][TRACKING_ANNOTATION]
            .as_str()
            .and_then(|id| id.split_once(':'))
            .is_some_and(|(app, rest)| {
                app == parent && rest.starts_with("argoproj.io/Application:")
            }),
    }
}

/// A child manifest as the controller applies it: in `ns`, stamped with the parent's tracking.
fn stamped(manifest: &Value, parent: &str, ns: &str, tracking: Tracking) -> Value {
    let mut child = manifest.clone();
    let name = child["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    child["metadata"]["namespace"] = json!(ns);
    match tracking {
        Tracking::Label => child["metadata"]["labels"][INSTANCE_LABEL] = json!(parent),
        Tracking::Annotation => {
            child["metadata"]["annotations"][TRACKING_ANNOTATION] =
                json!(format!("{parent}:argoproj.io/Application:{ns}/{name}"))
        }
    }
    child
}

/// Whether the live child already holds what the manifest says (spec, and the manifest's
/// labels and annotations).
fn in_sync(live: &Value, want: &Value) -> bool {
    if live.get("spec") != want.get("spec") {
        return false;
    }
    ["labels", "annotations"].iter().all(|f| {
        want["metadata"][*f]
            .as_object()
            .is_none_or(|m| m.iter().all(|(k, v)| &live["metadata"][*f][k] == v))
    })
}

/// Syncs the children of the parent `app` (named `parent`, in `ns`) when its source renders
/// Application manifests and a sync is due. Returns the `status.resources` entries of what
/// it renders (`None`: the source renders nothing known to the repository stand-in).
pub async fn reconcile_children(
    api: &Api<DynamicObject>,
    app: &Value,
    operation: Option<&Value>,
) -> Result<Option<Vec<Value>>, HarnessError> {
    let (Some(parent), Some(ns)) = (
        app.pointer("/metadata/name").and_then(Value::as_str),
        app.pointer("/metadata/namespace").and_then(Value::as_str),
    ) else {
        return Ok(None);
    };
    let Some(manifests) = rendered(api, ns, app).await else {
        return Ok(None);
    };
    let tracking = tracking(api, ns).await;
    let mut wanted = BTreeMap::new();
    let mut entries = Vec::new();
    for m in &manifests {
        let kind = m["kind"].as_str().unwrap_or_default();
        let name = m["metadata"]["name"].as_str().unwrap_or_default();
        let child_ns = m["metadata"]["namespace"]
            .as_str()
            .or_else(|| {
                app.pointer("/spec/destination/namespace")
                    .and_then(Value::as_str)
            })
            .unwrap_or(ns);
        entries.push(json!({
            "group": m["apiVersion"].as_str().and_then(|v| v.split_once('/')).map(|(g, _)| g).unwrap_or(""),
            "version": m["apiVersion"].as_str().map(|v| v.rsplit('/').next().unwrap_or(v)).unwrap_or(""),
            "kind": kind, "namespace": child_ns, "name": name, "status": "Synced",
        }));
        if kind != "Application" || name.is_empty() {
            continue;
        }
        if child_ns != ns {
            tracing::debug!(%parent, child = name, namespace = child_ns, "simulated controller: child in another namespace not applied");
            continue;
        }
        wanted.insert(name.to_owned(), stamped(m, parent, ns, tracking));
    }
    let live: BTreeMap<String, Value> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|o| serde_json::to_value(o).ok())
        .filter_map(|o| Some((o["metadata"]["name"].as_str()?.to_owned(), o)))
        .collect();
    let automated = app
        .pointer("/spec/syncPolicy/automated")
        .filter(|a| a.is_object());
    let prune = match operation {
        Some(op) => op.pointer("/sync/prune").and_then(Value::as_bool) == Some(true),
        None => {
            automated
                .and_then(|a| a.get("prune"))
                .and_then(Value::as_bool)
                == Some(true)
        }
    };
    let stale: Vec<&String> = live
        .iter()
        .filter(|(n, o)| !wanted.contains_key(*n) && tracked_by(o, parent, tracking))
        .map(|(n, _)| n)
        .collect();
    let differs = wanted
        .iter()
        .any(|(n, w)| live.get(n).is_none_or(|l| !in_sync(l, w)))
        || (prune && !stale.is_empty());
    if operation.is_none() && (automated.is_none() || !differs) {
        return Ok(Some(entries));
    }
    for (name, want) in &wanted {
        match live.get(name) {
            None => {
                let obj: DynamicObject = serde_json::from_value(want.clone())?;
                api.create(&PostParams::default(), &obj).await?;
                tracing::info!(%parent, child = %name, "simulated controller: child application created");
            }
            Some(l) if !tracked_by(l, parent, tracking) => {
                tracing::info!(%parent, child = %name, "simulated controller: an application of that name is not this parent's; left alone");
            }
            Some(l) if !in_sync(l, want) => {
                merge_patch(
                    api,
                    name,
                    json!({"metadata": {"labels": want["metadata"]["labels"], "annotations": want["metadata"]["annotations"]},
                           "spec": want["spec"]}),
                )
                .await?;
                tracing::info!(%parent, child = %name, "simulated controller: child application updated");
            }
            Some(_) => {}
        }
    }
    if prune {
        for name in stale {
            api.delete(name, &DeleteParams::default()).await?;
            tracing::info!(%parent, child = %name, "simulated controller: child application pruned");
        }
    }
    Ok(Some(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_stamped_and_recognised_with_either_tracking() {
        let m = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                       "metadata": {"name": "child-a"}, "spec": {"project": "default"}});
        for t in [Tracking::Annotation, Tracking::Label] {
            let c = stamped(&m, "parent", "argocd", t);
            assert!(tracked_by(&c, "parent", t), "{t:?}");
            assert!(!tracked_by(&c, "other", t), "{t:?}");
            assert!(in_sync(&c, &c));
        }
        let c = stamped(&m, "parent", "argocd", Tracking::Annotation);
        assert_eq!(
            c["metadata"]["annotations"][TRACKING_ANNOTATION],
            "parent:argoproj.io/Application:argocd/child-a"
        );
        // A parent named like a prefix of another does not track its children.
        assert!(!tracked_by(&c, "par", Tracking::Annotation));
        let mut changed = c.clone();
        changed["spec"]["project"] = json!("other");
        assert!(!in_sync(&changed, &c));
    }
}
