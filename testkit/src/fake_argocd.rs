//! A stand-in for Argo CD's application controller on a spoke, for the local demo only: it
//! marks Applications Synced/Healthy at their target revision and completes requested sync
//! operations. It deploys nothing. Real spokes run real Argo CD.
//!
//! Like Argo CD's application controller, it carries out a refresh request (annotation
//! `argocd.argoproj.io/refresh`, `normal` or `hard`): it reconciles the Application
//! (`status.reconciledAt` moves) and then removes the annotation (argoproj/argo-cd
//! `controller/appcontroller.go`, `processAppRefreshQueueItem`, which refreshes an
//! Application whose refresh annotation is set and patches the annotation away afterwards).
//!
//! It deletes as Argo CD does (`controller/appcontroller.go`, `finalizeApplicationDeletion`;
//! finalizer names from `pkg/apis/application/v1alpha1/types.go`): an Application being
//! deleted that holds a resources finalizer (`resources-finalizer.argocd.argoproj.io`, or
//! its `/foreground` or `/background` form) has its managed resources deleted (here: there
//! are none, so the count is recorded in a log line) and then that finalizer removed; once
//! no resources finalizer is left, the post-delete hooks run (here: nothing to run) and
//! `post-delete-finalizer.argocd.argoproj.io` (and its `/cleanup` form) is removed. Other
//! finalizers are left alone, so an Application held by someone else's finalizer stays, as
//! on a real cluster. An Application without Argo CD's finalizers is deleted by the API
//! server at once; the controller does nothing.
//!
//! App-of-apps: a parent whose source renders Application manifests creates, updates and
//! prunes its children when it syncs ([`crate::app_of_apps`], which also says what the
//! repository server's stand-in is).
//!
//! Not modelled: deploying anything, health assessment, sync waves and hooks other than
//! the deletion order above (the ApplicationSet and notifications controllers have their
//! own stand-ins: [`crate::fake_appset`], [`crate::fake_notifications`]).

use std::time::Duration;

use serde_json::{Value, json};

use kube::api::{Api, DynamicObject, ListParams};

use crate::harness::{HarnessError, cluster_secret_field, merge_patch, set_status};

/// Runs until the task is dropped, reconciling the Applications of `api` every `every`.
pub async fn run(api: Api<DynamicObject>, every: Duration) -> Result<(), HarnessError> {
    run_with(api, every, None).await
}

/// A hub's own application controller next to the principal (a hybrid hub): it reconciles
/// the Applications of `api` (its namespace) except those whose destination is a cluster
/// whose Secret in `clusters` carries `argocd.argoproj.io/skip-reconcile: "true"` (Argo CD
/// "Cluster Management: Skipping cluster reconciliation": the controller skips every app
/// targeting such a cluster). Every Application it reconciled is recorded in `reconciled`.
pub struct HubController {
    /// Argo CD's cluster Secrets (the controller's namespace).
    pub clusters: Api<DynamicObject>,
    /// The controller's own namespace (the one `api` lists).
    pub namespace: String,
    /// Names of the Applications this controller reconciled at least once (`<ns>/<name>`
    /// outside the controller's namespace).
    pub reconciled: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    /// The controller's `--application-namespaces` (Applications in any namespace): besides
    /// its own namespace, it reconciles Applications in the namespaces these globs match
    /// (`*` wildcards; Argo CD `util/security/application_namespaces.go`,
    /// `IsNamespaceEnabled`). Empty: its own namespace only.
    pub application_namespaces: Vec<String>,
}

impl HubController {
    /// Whether an Application in `ns` is one this controller reconciles, its own namespace
    /// being `own`.
    pub fn namespace_enabled(&self, own: &str, ns: &str) -> bool {
        namespace_enabled(&self.application_namespaces, own, ns)
    }
}

fn namespace_enabled(globs: &[String], own: &str, ns: &str) -> bool {
    ns == own || globs.iter().any(|g| glob_match(g, ns))
}

/// Shell-style `*` matching of a whole string (what `--application-namespaces` patterns
/// without `/regex/` do).
fn glob_match(pattern: &str, s: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == s,
        Some((head, rest)) => {
            let Some(tail) = s.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len())
                .filter(|i| tail.is_char_boundary(*i))
                .any(|i| glob_match(rest, &tail[i..]))
        }
    }
}

/// [`run`], as a hub's own controller when `hub` is given.
pub async fn run_with(
    api: Api<DynamicObject>,
    every: Duration,
    hub: Option<HubController>,
) -> Result<(), HarnessError> {
    // With `--application-namespaces`, the hub's controller looks at every namespace.
    let own_ns = hub
        .as_ref()
        .map(|h| h.namespace.clone())
        .unwrap_or_default();
    let client: kube::Client = api.clone().into();
    let listed = match &hub {
        Some(h) if !h.application_namespaces.is_empty() => {
            Api::all_with(client.clone(), &crate::harness::app_resource())
        }
        _ => api.clone(),
    };
    loop {
        match listed.list(&ListParams::default()).await {
            Ok(list) => {
                let skipped = match &hub {
                    Some(h) => skipped_clusters(&h.clusters).await,
                    None => Vec::new(),
                };
                for app in list.items {
                    let app = serde_json::to_value(&app)?;
                    let destination = &app["spec"]["destination"];
                    if skipped.iter().any(|(name, server)| {
                        destination["name"].as_str() == Some(name.as_str())
                            || destination["server"].as_str() == Some(server.as_str())
                    }) {
                        continue;
                    }
                    let ns = app["metadata"]["namespace"].as_str().unwrap_or_default();
                    if let Some(h) = &hub
                        && !h.namespace_enabled(&own_ns, ns)
                    {
                        continue;
                    }
                    if let (Some(h), Some(name)) = (&hub, app["metadata"]["name"].as_str()) {
                        let key = if ns == own_ns {
                            name.to_owned()
                        } else {
                            format!("{ns}/{name}")
                        };
                        h.reconciled
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(key);
                    }
                    let in_ns = if hub.is_none() || ns == own_ns || ns.is_empty() {
                        api.clone()
                    } else {
                        Api::namespaced_with(client.clone(), ns, &crate::harness::app_resource())
                    };
                    if let Err(e) = reconcile(&in_ns, &app).await {
                        tracing::debug!(error = %e, "simulated controller: reconcile failed (will retry)");
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "simulated controller: list failed (will retry)"),
        }
        tokio::time::sleep(every).await;
    }
}

async fn reconcile(
    api: &kube::Api<kube::api::DynamicObject>,
    app: &Value,
) -> Result<(), HarnessError> {
    let Some(name) = app.pointer("/metadata/name").and_then(Value::as_str) else {
        return Ok(());
    };
    if app.pointer("/metadata/deletionTimestamp").is_some() {
        return finalize(api, name, app).await;
    }
    let revision = app
        .pointer("/spec/source/targetRevision")
        .cloned()
        .unwrap_or(json!("HEAD"));
    let now = now_rfc3339();
    let op = app.get("operation").filter(|o| !o.is_null());
    let resources = crate::app_of_apps::reconcile_children(api, app, op).await?;
    let with_resources = |mut status: Value| {
        if let Some(r) = &resources {
            status["resources"] = json!(r);
        }
        status
    };
    if let Some(op) = op {
        let mut status = with_resources(app.get("status").cloned().unwrap_or_else(|| json!({})));
        status["operationState"] = json!({
            "operation": op,
            "phase": "Succeeded",
            "message": "successfully synced (simulated controller)",
            "startedAt": now,
            "finishedAt": now,
        });
        status["sync"] = json!({"status": "Synced", "revision": revision});
        status["health"] = json!({"status": "Healthy"});
        set_status(api, name, status).await?;
        merge_patch(api, name, json!({"operation": null})).await?;
        return Ok(());
    }
    let refresh = app
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(REFRESH_ANNOTATION))
        .is_some();
    if refresh {
        let mut status = with_resources(app.get("status").cloned().unwrap_or_else(|| json!({})));
        status["sync"] = json!({"status": "Synced", "revision": revision});
        status["health"] = json!({"status": "Healthy"});
        status["reconciledAt"] = json!(now);
        set_status(api, name, status).await?;
        merge_patch(
            api,
            name,
            json!({"metadata": {"annotations": {REFRESH_ANNOTATION: null}}}),
        )
        .await?;
        return Ok(());
    }
    let resources_changed = resources
        .as_ref()
        .is_some_and(|r| app.pointer("/status/resources") != Some(&json!(r)));
    if app.pointer("/status/sync/revision") != Some(&revision) || resources_changed {
        let mut status = with_resources(app.get("status").cloned().unwrap_or_else(|| json!({})));
        status["sync"] = json!({"status": "Synced", "revision": revision});
        status["health"] = json!({"status": "Healthy"});
        status["reconciledAt"] = json!(now);
        set_status(api, name, status).await?;
    }
    Ok(())
}

/// The clusters (name, server) whose Secret asks the controller to skip them.
async fn skipped_clusters(clusters: &Api<DynamicObject>) -> Vec<(String, String)> {
    let Ok(list) = clusters
        .list(&ListParams::default().labels("argocd.argoproj.io/secret-type=cluster"))
        .await
    else {
        return Vec::new();
    };
    list.items
        .iter()
        .filter_map(|s| serde_json::to_value(s).ok())
        .filter(|s| s["metadata"]["annotations"]["argocd.argoproj.io/skip-reconcile"] == "true")
        .map(|s| {
            (
                cluster_secret_field(&s, "name"),
                cluster_secret_field(&s, "server"),
            )
        })
        .collect()
}

/// Argo CD's resources finalizers: cascade the deletion to the managed resources.
const RESOURCES_FINALIZERS: [&str; 3] = [
    "resources-finalizer.argocd.argoproj.io",
    "resources-finalizer.argocd.argoproj.io/foreground",
    "resources-finalizer.argocd.argoproj.io/background",
];

/// Argo CD's post-delete hook finalizers: removed once the hooks ran, after the resources.
const POST_DELETE_FINALIZERS: [&str; 2] = [
    "post-delete-finalizer.argocd.argoproj.io",
    "post-delete-finalizer.argocd.argoproj.io/cleanup",
];

/// One step of an Application's deletion: the resources finalizers first, then (on a later
/// pass, as the controller requeues) the post-delete hook finalizers.
async fn finalize(
    api: &kube::Api<kube::api::DynamicObject>,
    name: &str,
    app: &Value,
) -> Result<(), HarnessError> {
    let finalizers: Vec<&str> = app
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let cascading = finalizers.iter().any(|f| RESOURCES_FINALIZERS.contains(f));
    let drop: &[&str] = if cascading {
        let resources = app
            .pointer("/status/resources")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        tracing::info!(
            app = name,
            resources,
            "simulated controller: managed resources deleted"
        );
        &RESOURCES_FINALIZERS
    } else if finalizers
        .iter()
        .any(|f| POST_DELETE_FINALIZERS.contains(f))
    {
        tracing::info!(app = name, "simulated controller: post-delete hooks ran");
        &POST_DELETE_FINALIZERS
    } else {
        return Ok(());
    };
    let kept: Vec<&str> = finalizers
        .into_iter()
        .filter(|f| !drop.contains(f))
        .collect();
    let rv = app
        .pointer("/metadata/resourceVersion")
        .cloned()
        .unwrap_or(Value::Null);
    merge_patch(
        api,
        name,
        json!({"metadata": {"finalizers": kept, "resourceVersion": rv}}),
    )
    .await
}

/// Argo CD's refresh request annotation.
const REFRESH_ANNOTATION: &str = "argocd.argoproj.io/refresh";

fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_namespace_globs_match_as_argo_cd_reads_them() {
        assert!(glob_match("team-*", "team-a"));
        assert!(glob_match("*", "anything"));
        assert!(glob_match("a*b*c", "a-x-b-y-c"));
        assert!(!glob_match("team-*", "agent-managed"));
        assert!(!glob_match("team", "team-a"));
        let globs = ["team-*".to_owned()];
        assert!(namespace_enabled(&globs, "argocd", "argocd"));
        assert!(namespace_enabled(&globs, "argocd", "team-b"));
        assert!(!namespace_enabled(&globs, "argocd", "agent-managed"));
    }
}
