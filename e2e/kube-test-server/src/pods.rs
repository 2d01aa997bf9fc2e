//! Pod subresources: `log` (text set by tests with `KubeTestServer::set_pod_log`) and
//! `exec` (refused: there are no containers to run in).

use std::collections::BTreeMap;
use std::sync::Mutex;

use http::HeaderMap;
use serde_json::Value;

use super::Shared;
use super::status::ApiError;

/// Largest log text kept per container (longer text keeps its tail).
pub const POD_LOG_LIMIT: usize = 1 << 20;

/// Container logs by (namespace, pod, container).
#[derive(Default)]
pub struct PodLogs(Mutex<BTreeMap<(String, String, String), String>>);

impl PodLogs {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String, String), String>> {
        // Values are replaced whole; a poisoned lock still holds consistent text.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the log text of one container.
    pub fn set(&self, ns: &str, pod: &str, container: &str, text: &str) {
        let mut start = text.len().saturating_sub(POD_LOG_LIMIT);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        self.lock().insert(
            (ns.into(), pod.into(), container.into()),
            text[start..].to_string(),
        );
    }

    fn get(&self, ns: &str, pod: &str, container: &str) -> String {
        self.lock()
            .get(&(ns.into(), pod.into(), container.into()))
            .cloned()
            .unwrap_or_default()
    }
}

/// `GET pods/<name>/log[?container=c&tailLines=n]`.
pub fn log(shared: &Shared, pod: &Value, q: &super::http::QueryView) -> Result<String, ApiError> {
    let s = |p: &str| pod.pointer(p).and_then(Value::as_str).unwrap_or("");
    let (ns, name) = (s("/metadata/namespace"), s("/metadata/name"));
    let containers: Vec<&str> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    let container = match q.get("container") {
        Some(c) if containers.contains(&c) => c,
        Some(c) => {
            return Err(ApiError::bad_request(format!(
                "container {c} is not valid for pod {name}"
            )));
        }
        None if containers.len() == 1 => containers[0],
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            )));
        }
    };
    let text = shared.pod_logs.get(ns, name, container);
    match q.get("tailLines") {
        None => Ok(text),
        Some(n) => {
            let n: usize = n
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid tailLines {n:?}")))?;
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(n)..];
            Ok(tail.iter().map(|l| format!("{l}\n")).collect())
        }
    }
}

/// `pods/<name>/exec`: the apiserver would upgrade the connection (WebSocket or SPDY) and
/// stream to the kubelet; this server has no containers, so it refuses with the answer the
/// apiserver gives a request that cannot be upgraded.
pub fn exec(headers: &HeaderMap) -> ApiError {
    if headers.contains_key(http::header::UPGRADE) {
        ApiError::new(
            501,
            "NotImplemented",
            "the kube test server has no containers: pods/exec streams are not served",
        )
    } else {
        ApiError::bad_request("Upgrade request required")
    }
}
