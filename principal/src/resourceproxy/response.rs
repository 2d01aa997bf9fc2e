//! The resource proxy's own answers: Kubernetes `Status` bodies, agent answers, and the
//! failure reason each carries until it is counted.

use argocd_agent_domain::AgentName;
use argocd_agent_domain::rpc::RpcError;
use argocd_agent_identity::text;
use argocd_agent_proto::eventstream::ResourceResponse;
use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

/// Response body of the proxy.
pub type Body = BoxBody<Bytes, std::io::Error>;

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|e| match e {}).boxed()
}

/// A Kubernetes `Status` answer.
pub fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response<Body> {
    let message = message.into();
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
    });
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The failure an answer stands for, as upstream's `reason` of
/// `argocd_principal_resource_proxy_errors_total` (`agent_disconnected`, `timeout`,
/// `agent_error`); carried as an extension of the response until it is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProxyError(pub &'static str);

/// `r`, marked with the failure `reason`.
pub(crate) fn with_error(mut r: Response<Body>, reason: &'static str) -> Response<Body> {
    r.extensions_mut().insert(ProxyError(reason));
    r
}

/// The upstream failure reason `r` was marked with, if any.
pub(crate) fn error_of(r: &Response<Body>) -> Option<&'static str> {
    r.extensions().get::<ProxyError>().map(|e| e.0)
}

/// The answer an agent sent for a request (an agent error unless it is a success).
pub(crate) fn from_agent(answer: &ResourceResponse) -> Response<Body> {
    let code = u16::try_from(answer.status)
        .ok()
        .and_then(|c| StatusCode::from_u16(c).ok())
        .unwrap_or(StatusCode::BAD_GATEWAY);
    let mut r = Response::new(full(answer.body.clone()));
    *r.status_mut() = code;
    if let Ok(ct) = HeaderValue::from_str(&answer.content_type)
        && !answer.content_type.is_empty()
    {
        r.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    if code.is_success() || code == StatusCode::SWITCHING_PROTOCOLS {
        r
    } else {
        with_error(r, "agent_error")
    }
}

/// The failure of a request the agent did not answer.
pub(crate) fn rpc_failure(agent: &AgentName, e: RpcError) -> Response<Body> {
    match e {
        RpcError::Timeout(t) => with_error(
            status(
                StatusCode::GATEWAY_TIMEOUT,
                "Timeout",
                format!(
                    "agent {agent} did not answer within {t}",
                    t = text::duration(t)
                ),
            ),
            "timeout",
        ),
        RpcError::TooMany { limit } => status(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            format!("agent {agent} has {limit} requests in flight"),
        ),
        RpcError::Disconnected => offline(agent),
    }
}

/// The answer for a request to an agent that is not connected.
pub(crate) fn offline(agent: &AgentName) -> Response<Body> {
    with_error(
        status(
            StatusCode::BAD_GATEWAY,
            "ServiceUnavailable",
            format!("agent {agent} is not connected"),
        ),
        "agent_disconnected",
    )
}
