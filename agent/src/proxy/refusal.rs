//! Why the resource proxy's rules refuse a request ([`RuleError`]): a leaf, so the rules and
//! whatever checks a request with them name the same reasons.

use argocd_agent_identity::text::quoted;

/// Why the resource proxy's rules refuse a request; the Display text reaches kubectl users
/// in a Kubernetes Status message.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    /// A patch changes a value the spoke's tracking reads.
    #[error(
        "a patch may not change metadata.{map}[{}], which tracks the object for Argo CD (it is {was}, it would be {now})",
        quoted(.key)
    )]
    TrackingChanged {
        /// `labels` or `annotations`.
        map: &'static str,
        /// The label or annotation key.
        key: String,
        /// Its value before (JSON, or `unset`).
        was: String,
        /// Its value after (JSON, or `unset`).
        now: String,
    },
    /// A create body's Content-Type is not JSON.
    #[error("a create body must be JSON (Content-Type {})", quoted(.0))]
    CreateNotJson(String),
    /// A create body is not read as strict JSON.
    #[error("a create body must be a JSON object: {0}")]
    CreateUnreadable(serde_json::Error),
    /// A create body is JSON but not an object.
    #[error("a create body must be a JSON object")]
    CreateNotObject,
    /// A body is not read as strict JSON.
    #[error("not JSON as the API server reads it: {0}")]
    NotStrictJson(serde_json::Error),
    /// A create of a cluster-scoped kind.
    #[error(
        "{0} is cluster-scoped: cluster-scoped objects are never created through the resource proxy"
    )]
    ClusterScoped(String),
    /// The body's kind differs from the request's.
    #[error("the body's kind {} is not the request's {}", quoted(.body), quoted(.request))]
    KindMismatch {
        /// The body's kind.
        body: String,
        /// The request's kind.
        request: String,
    },
    /// The body's apiVersion differs from the request's.
    #[error("the body's apiVersion {} is not the request's {}", quoted(.body), quoted(.request))]
    ApiVersionMismatch {
        /// The body's apiVersion.
        body: String,
        /// The request's apiVersion.
        request: String,
    },
    /// The body's namespace differs from the request's.
    #[error("the object's namespace {} is not the request's {}", quoted(.body), quoted(.request))]
    NamespaceMismatch {
        /// The body's namespace.
        body: String,
        /// The request's namespace.
        request: String,
    },
    /// The namespace is not a destination of the owner's Application.
    #[error("namespace {} is not a destination of Application {}", quoted(.namespace), quoted(.app))]
    NotDestination {
        /// The namespace.
        namespace: String,
        /// The Application's name.
        app: String,
    },
    /// The Application manages no object of the (RBAC) kind created.
    #[error("Application {} manages no {kind}, so none is created for it", quoted(.app))]
    KindNotManaged {
        /// The Application's name.
        app: String,
        /// The kind created.
        kind: String,
    },
    /// A service-account token for an Application that manages no Secrets.
    #[error(
        "Application {} manages no Secrets, so no service-account token is created for it",
        quoted(.0)
    )]
    TokenNotManaged(String),
    /// The created object asks for privileges its owner does not have.
    #[error("the new {kind} asks for {} that its owner {owner_kind} does not have", .asks.join(", "))]
    OwnerLacks {
        /// The created kind.
        kind: String,
        /// What it asks for beyond its owner.
        asks: Vec<String>,
        /// The owner's kind.
        owner_kind: String,
    },
    /// The object is nested deeper than [`MAX_SCAN_DEPTH`](super::rules::MAX_SCAN_DEPTH).
    #[error("the object is nested too deeply to be checked")]
    TooDeep,
}
