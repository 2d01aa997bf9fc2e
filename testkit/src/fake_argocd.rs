//! A stand-in for Argo CD's application controller on a spoke, for the local demo only: it
//! marks Applications Synced/Healthy at their target revision and completes requested sync
//! operations. It deploys nothing. Real spokes run real Argo CD.
//!
//! Like Argo CD's application controller, it carries out a refresh request (annotation
//! `argocd.argoproj.io/refresh`, `normal` or `hard`): it reconciles the Application
//! (`status.reconciledAt` moves) and then removes the annotation (argoproj/argo-cd
//! `controller/appcontroller.go`, `processAppRefreshQueueItem`, which refreshes an
//! Application whose refresh annotation is set and patches the annotation away afterwards).

use std::time::Duration;

use serde_json::{Value, json};

use kube::api::{Api, DynamicObject, ListParams};

use crate::harness::{HarnessError, merge_patch, set_status};

/// Runs until the task is dropped, reconciling the Applications of `api` every `every`.
pub async fn run(api: Api<DynamicObject>, every: Duration) -> Result<(), HarnessError> {
    loop {
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                for app in list.items {
                    let app = serde_json::to_value(&app)?;
                    if let Err(e) = reconcile(&api, &app).await {
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
        return Ok(());
    }
    let revision = app
        .pointer("/spec/source/targetRevision")
        .cloned()
        .unwrap_or(json!("HEAD"));
    let now = now_rfc3339();
    if let Some(op) = app.get("operation").filter(|o| !o.is_null()) {
        let mut status = app.get("status").cloned().unwrap_or_else(|| json!({}));
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
        let mut status = app.get("status").cloned().unwrap_or_else(|| json!({}));
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
    if app.pointer("/status/sync/revision") != Some(&revision) {
        let mut status = app.get("status").cloned().unwrap_or_else(|| json!({}));
        status["sync"] = json!({"status": "Synced", "revision": revision});
        status["health"] = json!({"status": "Healthy"});
        status["reconciledAt"] = json!(now);
        set_status(api, name, status).await?;
    }
    Ok(())
}

/// Argo CD's refresh request annotation.
const REFRESH_ANNOTATION: &str = "argocd.argoproj.io/refresh";

fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}
