//! Self reviews, answered from the request and never stored: SelfSubjectAccessReview
//! (`kubectl auth can-i`) and SelfSubjectReview (`kubectl auth whoami`).

use serde_json::{Value, json};

use super::ResourceType;
use super::status::ApiError;

/// Why every access review is allowed.
const ALLOW_REASON: &str = "the kube test server has no RBAC: every authenticated user may do everything (compare KubeTestServer::requests with the RBAC rules instead)";

/// The answer to a review `POST` from `user`.
pub fn answer(r: &ResourceType, mut review: Value, user: &str) -> Result<Value, ApiError> {
    if !review.is_object() {
        return Err(ApiError::bad_request(format!(
            "the body of the request for {} is not a JSON object",
            r.qualified_plural()
        )));
    }
    review["apiVersion"] = json!(r.api_version());
    review["kind"] = json!(r.kind);
    if !review.get("metadata").is_some_and(Value::is_object) {
        review["metadata"] = json!({});
    }
    review["metadata"]["creationTimestamp"] = Value::Null;
    match r.kind.as_str() {
        "SelfSubjectAccessReview" => {
            let resource = review.pointer("/spec/resourceAttributes").is_some();
            let non_resource = review.pointer("/spec/nonResourceAttributes").is_some();
            if resource == non_resource {
                return Err(ApiError::invalid(
                    r,
                    "",
                    "spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
                ));
            }
            review["status"] = json!({"allowed": true, "reason": ALLOW_REASON});
        }
        "SelfSubjectReview" => {
            review["status"] = json!({"userInfo": {
                "username": user,
                "groups": ["system:authenticated"],
            }});
        }
        other => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("no review semantics for kind {other}"),
            ));
        }
    }
    Ok(review)
}
