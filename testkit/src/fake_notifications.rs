//! A stand-in for Argo CD's notifications controller where it runs (the hub, for agents'
//! Applications), for the e2e suites: it sends the `on-sync-succeeded` notification once per
//! completed sync to every subscriber and records what it sent in the Application's
//! `notified.notifications.argoproj.io` annotation, which is what stops it from sending again.
//!
//! Modelled from argoproj/notifications-engine (`pkg/controller/controller.go`: triggers are
//! evaluated for each subscription, a notification goes out only if the state does not
//! already hold its key; `pkg/controller/state.go`: the state is a JSON object in the
//! `notified.notifications.argoproj.io` annotation, keyed
//! `<oncePer>:<trigger>:<condition>:<service>:<recipient>`, values the Unix time it was
//! sent, at most 100 entries) and from Argo CD's trigger catalog (`on-sync-succeeded`: when
//! `app.status.operationState.phase in ['Succeeded']`). Subscriptions are the annotations
//! `notifications.argoproj.io/subscribe.<trigger>.<service>: <recipient>[;<recipient>...]`.
//!
//! Here `oncePer` is `app.status.operationState.finishedAt` (one notification per completed
//! sync) and the condition part is `[0]` (the engine puts a hash of the condition there).
//! Not modelled: other triggers, templates, services (a send is recorded in a list), the
//! default subscriptions of `argocd-notifications-cm`, removal of keys whose condition
//! turned false (the engine keeps those that have `oncePer`, as this trigger does).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};

use crate::harness::{HarnessError, merge_patch};

/// Argo CD's notification state annotation.
pub const NOTIFIED_ANNOTATION: &str = "notified.notifications.argoproj.io";
/// The one trigger modelled.
pub const ON_SYNC_SUCCEEDED: &str = "on-sync-succeeded";
const SUBSCRIBE_PREFIX: &str = "notifications.argoproj.io/subscribe.";

/// Notifications sent, as `<application>:<state key>`.
pub type Sent = Arc<Mutex<Vec<String>>>;

/// Runs until the task is dropped: every `every`, each Application of `apps` is evaluated.
pub async fn run(
    apps: Api<DynamicObject>,
    every: Duration,
    sent: Sent,
) -> Result<(), HarnessError> {
    loop {
        if let Ok(list) = apps.list(&ListParams::default()).await {
            for app in list.items {
                let app = serde_json::to_value(&app)?;
                if let Err(e) = notify(&apps, &app, &sent).await {
                    tracing::debug!(error = %e, "simulated notifications controller: failed (will retry)");
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// The (service, recipient) pairs subscribed to `trigger` on `app`.
fn subscribers(app: &Value, trigger: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (k, v) in app["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let Some(rest) = k.strip_prefix(SUBSCRIBE_PREFIX) else {
            continue;
        };
        let Some(service) = rest.strip_prefix(trigger).and_then(|s| s.strip_prefix('.')) else {
            continue;
        };
        for recipient in v.as_str().unwrap_or_default().split(';').map(str::trim) {
            if !recipient.is_empty() {
                out.push((service.to_owned(), recipient.to_owned()));
            }
        }
    }
    out
}

/// Sends what `app` is due and records it in its state annotation.
async fn notify(apps: &Api<DynamicObject>, app: &Value, sent: &Sent) -> Result<(), HarnessError> {
    let Some(name) = app["metadata"]["name"].as_str() else {
        return Ok(());
    };
    let op = &app["status"]["operationState"];
    if op["phase"] != "Succeeded" {
        return Ok(());
    }
    let Some(once_per) = op["finishedAt"].as_str() else {
        return Ok(());
    };
    let mut state: BTreeMap<String, i64> = app["metadata"]["annotations"][NOTIFIED_ANNOTATION]
        .as_str()
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    let mut changed = false;
    for (service, recipient) in subscribers(app, ON_SYNC_SUCCEEDED) {
        let key = format!("{once_per}:{ON_SYNC_SUCCEEDED}:[0]:{service}:{recipient}");
        if state.contains_key(&key) {
            continue;
        }
        sent.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("{name}:{key}"));
        state.insert(key, jiff::Timestamp::now().as_second());
        changed = true;
    }
    if !changed {
        return Ok(());
    }
    // The engine keeps the newest 100 entries.
    while state.len() > 100 {
        let oldest = state
            .iter()
            .min_by_key(|(_, t)| **t)
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => state.remove(&k),
            None => break,
        };
    }
    let value = serde_json::to_string(&state)?;
    merge_patch(
        apps,
        name,
        json!({"metadata": {"annotations": {NOTIFIED_ANNOTATION: value}}}),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_name_trigger_service_and_recipients() {
        let app = json!({"metadata": {"annotations": {
            "notifications.argoproj.io/subscribe.on-sync-succeeded.slack": "ops; dev",
            "notifications.argoproj.io/subscribe.on-sync-failed.slack": "oncall",
            "other": "x"
        }}});
        assert_eq!(
            subscribers(&app, ON_SYNC_SUCCEEDED),
            vec![
                ("slack".to_owned(), "ops".to_owned()),
                ("slack".to_owned(), "dev".to_owned())
            ]
        );
    }
}
