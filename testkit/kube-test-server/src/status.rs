//! API errors and the `Status` bodies the apiserver sends for them.

use serde_json::{Value, json};

use super::ResourceType;

/// An API failure: HTTP code, `reason` and message, sent as a `meta/v1` `Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code (also `Status.code`).
    pub code: u16,
    /// `Status.reason`, e.g. `NotFound`.
    pub reason: &'static str,
    /// Human-readable message, worded as the apiserver words it.
    pub message: String,
    /// `Status.details` (`name`, `group`, `kind`), when the error is about one object.
    pub details: Option<Value>,
}

impl ApiError {
    /// An error without details.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    fn with_details(mut self, res: &ResourceType, name: &str, kind: &str) -> Self {
        self.details = Some(json!({"name": name, "group": res.group, "kind": kind}));
        self
    }

    /// 404 NotFound: `applications.argoproj.io "x" not found`.
    pub fn not_found(res: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.qualified_plural()),
        )
        .with_details(res, name, &res.plural)
    }

    /// 409 AlreadyExists.
    pub fn already_exists(res: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", res.qualified_plural()),
        )
        .with_details(res, name, &res.plural)
    }

    /// 409 Conflict on a stale resourceVersion or a failed delete precondition.
    pub fn conflict(res: &ResourceType, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                res.qualified_plural()
            ),
        )
        .with_details(res, name, &res.plural)
    }

    /// 422 Invalid: `Application.argoproj.io "x" is invalid: <field>: <why>`; the field error
    /// is also a `details.causes` entry, which kubectl prints.
    pub fn invalid(res: &ResourceType, name: &str, field_error: &str) -> Self {
        let qualified_kind = if res.group.is_empty() {
            res.kind.clone()
        } else {
            format!("{}.{}", res.kind, res.group)
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{qualified_kind} \"{name}\" is invalid: {field_error}"),
        )
        .with_details(res, name, &res.kind);
        let (field, message) = field_error.split_once(": ").unwrap_or(("", field_error));
        let reason = [
            ("Invalid value", "FieldValueInvalid"),
            ("Forbidden", "FieldValueForbidden"),
            ("Required value", "FieldValueRequired"),
            ("Unsupported value", "FieldValueNotSupported"),
            ("Too long", "FieldValueTooLong"),
        ]
        .iter()
        .find(|(prefix, _)| message.starts_with(prefix))
        .map_or("FieldValueInvalid", |(_, r)| r);
        if let Some(d) = e.details.as_mut() {
            d["causes"] = json!([{"reason": reason, "message": message, "field": field}]);
        }
        e
    }

    /// 403 Forbidden: a create in a namespace that is being deleted.
    pub fn namespace_terminating(res: &ResourceType, name: &str, ns: &str) -> Self {
        let message = format!(
            "unable to create new content in namespace {ns} because it is being terminated"
        );
        let mut e = Self::new(
            403,
            "Forbidden",
            format!(
                "{} \"{name}\" is forbidden: {message}",
                res.qualified_plural()
            ),
        );
        e.details = Some(json!({"name": name, "group": res.group, "kind": res.plural,
            "causes": [{"reason": "NamespaceTerminating", "message": message, "field": "metadata.namespace"}]}));
        e
    }

    /// 409 Conflict from server-side apply: fields owned by other managers, by path.
    pub fn apply_conflict(
        res: &ResourceType,
        name: &str,
        conflicts: &std::collections::BTreeMap<Vec<String>, Vec<String>>,
    ) -> Self {
        let dotted = |p: &[String]| -> String {
            p.iter()
                .map(|s| match (s.strip_prefix("f:"), s.strip_prefix("v:")) {
                    (Some(f), _) => format!(".{f}"),
                    (_, Some(v)) => format!("[{v}]"),
                    _ => s.clone(),
                })
                .collect()
        };
        let mut causes = Vec::new();
        let mut lines = Vec::new();
        for (path, managers) in conflicts {
            for m in managers {
                let msg = format!("conflict with \"{m}\" using {}", res.api_version());
                lines.push(format!("{msg}: {}", dotted(path)));
                causes.push(json!({"reason": "FieldManagerConflict", "message": msg, "field": dotted(path)}));
            }
        }
        let n = lines.len();
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {n} conflict{}: {}",
                if n == 1 { "" } else { "s" },
                lines.join("\n")
            ),
        );
        e.details =
            Some(json!({"name": name, "group": res.group, "kind": res.plural, "causes": causes}));
        e
    }

    /// 410 Expired for a resourceVersion older than the event history.
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// The `Status` object for this error.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            status["details"] = d.clone();
        }
        status
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
