//! The request log: every resource request the server answered, with the attributes a
//! Kubernetes RBAC authorizer sees (user, verb, group, resource, subresource, namespace, name),
//! so tests can check what a client asks for against the RBAC rules it ships with.

use std::collections::VecDeque;
use std::sync::Mutex;

use http::Method;

/// How many requests the log keeps; older ones are dropped first.
pub const REQUEST_LOG_LIMIT: usize = 100_000;

/// One API request the server answered, as a Kubernetes RBAC authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// Kubeconfig user whose bearer token authenticated the request (None if anonymous).
    pub user: Option<String>,
    /// RBAC verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// API group ("" for core).
    pub api_group: String,
    /// Resource plural, e.g. "applications".
    pub resource: String,
    /// Subresource, e.g. Some("status").
    pub subresource: Option<String>,
    /// Namespace of the request (for a namespace object: its own name, as the apiserver's
    /// `RequestInfo` has it).
    pub namespace: Option<String>,
    /// Object name, for requests on one object.
    pub name: Option<String>,
    /// HTTP status code of the answer.
    pub code: u16,
}

/// The resource attributes of a request, derived from its method and URL the way the
/// apiserver's `RequestInfoFactory` derives them; `None` for non-resource requests
/// (discovery, `/version`, OpenAPI).
pub fn resource_attributes(method: &Method, path: &str, watch: bool) -> Option<RecordedRequest> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, rest) = match segs.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, parts): (Option<&str>, &[&str]) = match rest {
        [] => return None,
        // `namespaces/<ns>/<resource>...` unless the third part is a namespace subresource.
        ["namespaces", ns, tail @ ..]
            if !tail.is_empty() && !matches!(tail[0], "status" | "finalize") =>
        {
            (Some(*ns), tail)
        }
        ["namespaces", ns, ..] => (Some(*ns), rest),
        _ => (None, rest),
    };
    let (resource, name, subresource) = match parts {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, sub, ..] => (*resource, Some(*name), Some(*sub)),
        [] => return None,
    };
    let verb = match (method, name.is_some()) {
        (&Method::GET | &Method::HEAD, _) if watch => "watch".to_string(),
        // The apiserver authorizes WebSocket upgrades of pods/exec, attach and portforward
        // (GET) as `create` as well (AuthorizePodWebsocketUpgradeCreatePermission); `create`
        // is what an RBAC rule must grant, so that is what is recorded.
        (&Method::GET, true)
            if resource == "pods"
                && matches!(subresource, Some("exec" | "attach" | "portforward")) =>
        {
            "create".to_string()
        }
        (&Method::GET | &Method::HEAD, true) => "get".to_string(),
        (&Method::GET | &Method::HEAD, false) => "list".to_string(),
        (&Method::POST, _) => "create".to_string(),
        (&Method::PUT, _) => "update".to_string(),
        (&Method::PATCH, _) => "patch".to_string(),
        (&Method::DELETE, true) => "delete".to_string(),
        (&Method::DELETE, false) => "deletecollection".to_string(),
        (m, _) => m.as_str().to_ascii_lowercase(),
    };
    Some(RecordedRequest {
        user: None,
        verb,
        api_group: group.to_string(),
        resource: resource.to_string(),
        subresource: subresource.map(str::to_string),
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        code: 0,
    })
}

/// The bounded log.
#[derive(Default)]
pub struct RequestLog {
    entries: Mutex<VecDeque<RecordedRequest>>,
}

impl RequestLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<RecordedRequest>> {
        // Entries are pushed whole, so a poisoned lock still holds a consistent log.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends one request, dropping the oldest beyond [`REQUEST_LOG_LIMIT`].
    pub fn record(&self, r: RecordedRequest) {
        let mut g = self.lock();
        if g.len() >= REQUEST_LOG_LIMIT {
            g.pop_front();
        }
        g.push_back(r);
    }

    /// Everything kept, oldest first.
    pub fn snapshot(&self) -> Vec<RecordedRequest> {
        self.lock().iter().cloned().collect()
    }

    /// Forgets every entry.
    pub fn clear(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(
        m: Method,
        path: &str,
        watch: bool,
    ) -> (
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        Option<String>,
    ) {
        let r = resource_attributes(&m, path, watch).expect("a resource request");
        (
            r.verb,
            r.api_group,
            r.resource,
            r.subresource,
            r.namespace,
            r.name,
        )
    }

    fn s(x: &str) -> Option<String> {
        Some(x.to_string())
    }

    #[test]
    fn pod_exec_is_recorded_as_create_for_get_and_post() {
        for m in [Method::GET, Method::POST] {
            assert_eq!(
                attrs(m, "/api/v1/namespaces/demo/pods/web/exec", false),
                (
                    "create".into(),
                    "".into(),
                    "pods".into(),
                    s("exec"),
                    s("demo"),
                    s("web")
                )
            );
        }
        assert_eq!(
            attrs(Method::GET, "/api/v1/namespaces/demo/pods/web/log", false).0,
            "get"
        );
    }

    #[test]
    fn verbs_and_scopes_follow_request_info() {
        assert_eq!(
            attrs(
                Method::GET,
                "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications",
                true
            ),
            (
                "watch".into(),
                "argoproj.io".into(),
                "applications".into(),
                None,
                s("argocd"),
                None
            )
        );
        assert_eq!(
            attrs(
                Method::PUT,
                "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/a/status",
                false
            ),
            (
                "update".into(),
                "argoproj.io".into(),
                "applications".into(),
                s("status"),
                s("argocd"),
                s("a")
            )
        );
        assert_eq!(
            attrs(Method::GET, "/api/v1/namespaces/argocd", false),
            (
                "get".into(),
                "".into(),
                "namespaces".into(),
                None,
                s("argocd"),
                s("argocd")
            )
        );
        assert_eq!(
            attrs(Method::DELETE, "/api/v1/namespaces/argocd/secrets", false),
            (
                "deletecollection".into(),
                "".into(),
                "secrets".into(),
                None,
                s("argocd"),
                None
            )
        );
        assert_eq!(
            attrs(
                Method::GET,
                "/apis/argoproj.io/v1alpha1/applications",
                false
            ),
            (
                "list".into(),
                "argoproj.io".into(),
                "applications".into(),
                None,
                None,
                None
            )
        );
        assert!(resource_attributes(&Method::GET, "/api/v1", false).is_none());
        assert!(resource_attributes(&Method::GET, "/openapi/v3", false).is_none());
        assert!(resource_attributes(&Method::GET, "/version", false).is_none());
    }

    #[test]
    fn log_keeps_the_newest_entries() {
        let log = RequestLog::default();
        let r = resource_attributes(&Method::GET, "/api/v1/namespaces", false).expect("attrs");
        for code in 0..(REQUEST_LOG_LIMIT + 5) {
            log.record(RecordedRequest {
                code: (code % 600) as u16,
                ..r.clone()
            });
        }
        let all = log.snapshot();
        assert_eq!(all.len(), REQUEST_LOG_LIMIT);
        assert_eq!(all[0].code, 5);
    }
}
