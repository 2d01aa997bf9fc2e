//! Header authentication (`--auth header:...`): which header carries the caller's identity
//! and how to read it, plus the rule that the mTLS listener refuses such headers.

use argocd_agent_identity::text::quoted;
use std::fmt;

use argocd_agent_identity::SpiffeId;

use argocd_agent_domain::{AgentName, ClientIdentity};
use http::{HeaderMap, HeaderName};
use regex::Regex;

use crate::MeshError;
use crate::linkerd::{L5D_CLIENT_ID_HEADER, LinkerdId};
use crate::xfcc::{XFCC_HEADER, identity_from_xfcc};

/// Headers through which a mesh proxy forwards a verified client identity. A request that
/// reaches the mTLS or JWT-SVID listener with any of them is refused (the principal's `auth.rs`).
pub const IDENTITY_HEADERS: &[&str] = &[XFCC_HEADER, L5D_CLIENT_ID_HEADER];

/// How the principal reads a caller's identity from request headers.
#[derive(Debug, Clone)]
pub enum HeaderAuth {
    /// `header:istio`: Istio sidecar; identity from the nearest XFCC element.
    Istio,
    /// `header:envoy`: a plain Envoy in front of the principal; identity from the nearest
    /// XFCC element.
    Envoy,
    /// `header:linkerd`: Linkerd proxy; identity from `l5d-client-id`, converted to
    /// `spiffe://<trust-domain>/ns/<ns>/sa/<sa>`.
    Linkerd,
    /// `header:<name>:<regex>` (as upstream argocd-agent): the first capture group of
    /// `regex` applied to header `header` is the identity.
    Custom {
        /// The header to read.
        header: HeaderName,
        /// The expression; it has at least one capture group.
        regex: Regex,
    },
}

impl HeaderAuth {
    /// Parses an `--auth` value: `header:istio`, `header:envoy`, `header:linkerd` or
    /// `header:<name>:<regex>`.
    ///
    /// ```
    /// use argocd_agent_mesh::header::HeaderAuth;
    /// assert!(matches!(HeaderAuth::parse("header:istio"), Ok(HeaderAuth::Istio)));
    /// let custom = HeaderAuth::parse("header:x-client-id:^agent=(.+)$").unwrap();
    /// assert_eq!(custom.header_name().as_str(), "x-client-id");
    /// ```
    pub fn parse(value: &str) -> Result<HeaderAuth, MeshError> {
        let bad = |reason: String| MeshError::InvalidAuth {
            value: value.to_owned(),
            reason,
        };
        let rest = value
            .strip_prefix("header:")
            .ok_or_else(|| bad("header authentication values start with \"header:\"".into()))?;
        match rest {
            "istio" => return Ok(HeaderAuth::Istio),
            "envoy" => return Ok(HeaderAuth::Envoy),
            "linkerd" => return Ok(HeaderAuth::Linkerd),
            _ => {}
        }
        // Header names cannot contain ':', so the first ':' ends the name; the regex may
        // contain more.
        let (name, expr) = rest.split_once(':').ok_or_else(|| {
            bad(
                "expected header:istio, header:envoy, header:linkerd or header:<name>:<regex>"
                    .into(),
            )
        })?;
        let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            bad(format!(
                "{name} is not a valid header name",
                name = quoted(&name)
            ))
        })?;
        if expr.is_empty() {
            return Err(bad("the regular expression is empty".into()));
        }
        let regex =
            Regex::new(expr).map_err(|e| bad(format!("invalid regular expression: {e}")))?;
        if regex.captures_len() < 2 {
            return Err(bad(
                "the regular expression needs a capture group: its first group is the identity"
                    .into(),
            ));
        }
        Ok(HeaderAuth::Custom { header, regex })
    }

    /// The header this method reads.
    pub fn header_name(&self) -> HeaderName {
        match self {
            HeaderAuth::Istio | HeaderAuth::Envoy => HeaderName::from_static(XFCC_HEADER),
            HeaderAuth::Linkerd => HeaderName::from_static(L5D_CLIENT_ID_HEADER),
            HeaderAuth::Custom { header, .. } => header.clone(),
        }
    }

    /// Reads the caller's identity from `headers`.
    ///
    /// Exactly one value of the identity header must be present: with several, which one
    /// the proxy wrote cannot be known, so the request is refused.
    pub fn identity_from_headers(&self, headers: &HeaderMap) -> Result<ClientIdentity, MeshError> {
        self.identity_from_headers_checked(headers, None)
    }

    /// Like [`identity_from_headers`](Self::identity_from_headers); for the XFCC presets,
    /// also requires the nearest element's `By` to be `principal_id` when given (proof the
    /// element was added by the proxy holding the principal's SVID). Ignored for Linkerd
    /// and custom rules, whose headers have no such field.
    pub fn identity_from_headers_checked(
        &self,
        headers: &HeaderMap,
        principal_id: Option<&SpiffeId>,
    ) -> Result<ClientIdentity, MeshError> {
        let name = self.header_name();
        let value = single_header_value(headers, &name)?;
        match self {
            HeaderAuth::Istio | HeaderAuth::Envoy => {
                identity_from_xfcc(value, principal_id).map(ClientIdentity::Spiffe)
            }
            HeaderAuth::Linkerd => LinkerdId::parse(value)?
                .to_spiffe_id()
                .map(ClientIdentity::Spiffe),
            HeaderAuth::Custom { header, regex } => {
                let captured = regex
                    .captures(value)
                    .and_then(|c| c.get(1))
                    .map(|m| m.as_str())
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| MeshError::NoMatch {
                        header: header.to_string(),
                        value: value.to_owned(),
                        regex: regex.as_str().to_owned(),
                    })?;
                if captured.starts_with("spiffe://") {
                    SpiffeId::parse(captured)
                        .map(ClientIdentity::Spiffe)
                        .map_err(|e| MeshError::InvalidSpiffeId {
                            header: "custom identity header",
                            value: captured.to_owned(),
                            reason: e.to_string(),
                        })
                } else {
                    // Upstream-style: the capture is the agent name (and hub namespace).
                    AgentName::new(captured)
                        .map(ClientIdentity::AgentName)
                        .map_err(|e| MeshError::InvalidAgentName {
                            value: captured.to_owned(),
                            reason: e.to_string(),
                        })
                }
            }
        }
    }
}

impl std::str::FromStr for HeaderAuth {
    type Err = MeshError;
    /// Same as [`HeaderAuth::parse`] (for clap's `value_parser`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HeaderAuth::parse(s)
    }
}

impl fmt::Display for HeaderAuth {
    /// Writes the `--auth` value this was parsed from.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderAuth::Istio => f.write_str("header:istio"),
            HeaderAuth::Envoy => f.write_str("header:envoy"),
            HeaderAuth::Linkerd => f.write_str("header:linkerd"),
            HeaderAuth::Custom { header, regex } => write!(f, "header:{header}:{}", regex.as_str()),
        }
    }
}

/// The one value of `name`, as text.
fn single_header_value<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<&'h str, MeshError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next().ok_or_else(|| MeshError::MissingHeader {
        header: name.to_string(),
    })?;
    let rest = values.count();
    if rest > 0 {
        return Err(MeshError::SeveralHeaderValues {
            header: name.to_string(),
            count: rest + 1,
        });
    }
    first.to_str().map_err(|_| MeshError::HeaderNotText {
        header: name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const AGENT: &str = "spiffe://edge.example/ns/argocd/sa/agent-1";

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn spiffe(s: &str) -> ClientIdentity {
        ClientIdentity::Spiffe(SpiffeId::parse(s).unwrap())
    }

    #[test]
    fn presets_parse_and_print_back() {
        for v in ["header:istio", "header:envoy", "header:linkerd"] {
            assert_eq!(HeaderAuth::parse(v).unwrap().to_string(), v);
        }
        let c = HeaderAuth::parse("header:X-Client-Id:^spiffe://(.*)$|^(x)").unwrap();
        assert!(matches!(&c, HeaderAuth::Custom { header, .. } if header == "x-client-id"));
        assert_eq!(c.to_string(), "header:x-client-id:^spiffe://(.*)$|^(x)");
    }

    #[test]
    fn bad_auth_values_are_refused() {
        for bad in [
            "mtls:uri:(.*)",
            "header:",
            "header:unknown",
            "header:x-id:",
            "header:x-id:no-group",
            "header:x-id:(unclosed",
            "header:bad header:(.*)",
        ] {
            let err = HeaderAuth::parse(bad).expect_err(bad);
            assert!(matches!(err, MeshError::InvalidAuth { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn istio_and_envoy_read_xfcc() {
        let h = headers(&[(XFCC_HEADER, &format!("By=spiffe://hub/x;URI={AGENT}"))]);
        for auth in [HeaderAuth::Istio, HeaderAuth::Envoy] {
            assert_eq!(auth.identity_from_headers(&h).unwrap(), spiffe(AGENT));
        }
        let principal = SpiffeId::parse("spiffe://hub/y").unwrap();
        let err = HeaderAuth::Istio
            .identity_from_headers_checked(&h, Some(&principal))
            .unwrap_err();
        assert!(matches!(err, MeshError::XfccByMismatch { .. }));
    }

    #[test]
    fn linkerd_reads_l5d_client_id_as_spiffe_id() {
        let h = headers(&[(
            L5D_CLIENT_ID_HEADER,
            "agent-1.argocd.serviceaccount.identity.linkerd.edge.example",
        )]);
        assert_eq!(
            HeaderAuth::Linkerd.identity_from_headers(&h).unwrap(),
            spiffe(AGENT)
        );
        // An XFCC header is not what Linkerd reads.
        let h = headers(&[(XFCC_HEADER, &format!("URI={AGENT}"))]);
        let err = HeaderAuth::Linkerd.identity_from_headers(&h).unwrap_err();
        assert!(matches!(err, MeshError::MissingHeader { .. }), "{err}");
    }

    #[test]
    fn custom_rule_yields_spiffe_id_or_name() {
        let auth = HeaderAuth::parse("header:x-client:^id=(.+)$").unwrap();
        let h = headers(&[("x-client", &format!("id={AGENT}"))]);
        assert_eq!(auth.identity_from_headers(&h).unwrap(), spiffe(AGENT));
        let h = headers(&[("x-client", "id=edge-7")]);
        assert_eq!(
            auth.identity_from_headers(&h).unwrap(),
            ClientIdentity::AgentName(AgentName::new("edge-7").unwrap())
        );
        let h = headers(&[("x-client", "nope")]);
        assert!(matches!(
            auth.identity_from_headers(&h),
            Err(MeshError::NoMatch { .. })
        ));
        let h = headers(&[("x-client", "id=spiffe://Bad/x")]);
        assert!(matches!(
            auth.identity_from_headers(&h),
            Err(MeshError::InvalidSpiffeId { .. })
        ));
        let h = headers(&[("x-client", "id=Edge_7")]);
        assert!(matches!(
            auth.identity_from_headers(&h),
            Err(MeshError::InvalidAgentName { .. })
        ));
    }

    #[test]
    fn several_identity_header_values_are_refused() {
        let v = format!("URI={AGENT}");
        let h = headers(&[(XFCC_HEADER, &v), (XFCC_HEADER, &v)]);
        let err = HeaderAuth::Envoy.identity_from_headers(&h).unwrap_err();
        assert!(
            matches!(err, MeshError::SeveralHeaderValues { count: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn missing_or_non_text_header_is_refused() {
        let err = HeaderAuth::Envoy
            .identity_from_headers(&HeaderMap::new())
            .unwrap_err();
        assert!(matches!(err, MeshError::MissingHeader { .. }));
        let mut h = HeaderMap::new();
        h.insert(XFCC_HEADER, HeaderValue::from_bytes(b"URI=\xff").unwrap());
        let err = HeaderAuth::Envoy.identity_from_headers(&h).unwrap_err();
        assert!(matches!(err, MeshError::HeaderNotText { .. }));
    }
}
