//! Envoy's `x-forwarded-client-cert` (XFCC) header: a strict parser, a serializer, and the
//! rule that picks the caller's SPIFFE ID out of it.
//!
//! Hand-written because no maintained Rust crate parses XFCC.
//!
//! Grammar (Envoy's documentation): the value is a list of elements separated by `,`; each
//! element is a list of `key=value` pairs separated by `;`; keys are case-insensitive and
//! one of `By`, `Hash`, `Cert`, `Chain`, `Subject`, `URI`, `DNS`; a value that contains
//! `,`, `;` or `=` is wrapped in `"` and a `"` inside it is written `\"`. Each proxy on the
//! path appends one element, so the LAST element was added by the proxy nearest to us.

use std::fmt;

use argocd_agent_identity::SpiffeId;

use crate::MeshError;

/// Largest XFCC value accepted, in bytes. A value with one element and no `Cert`/`Chain`
/// is a few hundred bytes; 16 KiB leaves room for a URL-encoded leaf certificate.
pub const MAX_XFCC_BYTES: usize = 16 * 1024;

/// Most elements accepted in one XFCC value (one per proxy on the path).
pub const MAX_XFCC_ELEMENTS: usize = 16;

/// Most `key=value` pairs accepted in one element.
pub const MAX_XFCC_PAIRS: usize = 64;

/// One XFCC element: what one proxy knew about the client certificate it verified.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XfccElement {
    /// `By`: the URI SAN of the proxy's own certificate (for SPIFFE, the server's ID).
    pub by: Option<String>,
    /// `Hash`: hex SHA-256 of the client leaf certificate.
    pub hash: Option<String>,
    /// `Cert`: the URL-encoded PEM client leaf certificate.
    pub cert: Option<String>,
    /// `Chain`: the URL-encoded PEM client chain.
    pub chain: Option<String>,
    /// `Subject`: the client certificate's subject DN.
    pub subject: Option<String>,
    /// `URI`: URI SANs of the client certificate, in order (may repeat).
    pub uri: Vec<String>,
    /// `DNS`: DNS SANs of the client certificate, in order (may repeat).
    pub dns: Vec<String>,
}

pub use crate::error::XfccError;

/// The keys Envoy writes, in their canonical spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    By,
    Hash,
    Cert,
    Chain,
    Subject,
    Uri,
    Dns,
}

impl Key {
    fn from_str_ci(key: &str) -> Option<Key> {
        const KEYS: [(&str, Key); 7] = [
            ("By", Key::By),
            ("Hash", Key::Hash),
            ("Cert", Key::Cert),
            ("Chain", Key::Chain),
            ("Subject", Key::Subject),
            ("URI", Key::Uri),
            ("DNS", Key::Dns),
        ];
        KEYS.iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(key))
            .map(|(_, k)| *k)
    }

    fn name(self) -> &'static str {
        match self {
            Key::By => "By",
            Key::Hash => "Hash",
            Key::Cert => "Cert",
            Key::Chain => "Chain",
            Key::Subject => "Subject",
            Key::Uri => "URI",
            Key::Dns => "DNS",
        }
    }
}

/// The field of a single-valued key; `None` for `URI` and `DNS`, which may repeat.
fn single_valued_slot(el: &mut XfccElement, key: Key) -> Option<&mut Option<String>> {
    match key {
        Key::By => Some(&mut el.by),
        Key::Hash => Some(&mut el.hash),
        Key::Cert => Some(&mut el.cert),
        Key::Chain => Some(&mut el.chain),
        Key::Subject => Some(&mut el.subject),
        Key::Uri | Key::Dns => None,
    }
}

/// Parses a complete XFCC header value into its elements, first (farthest proxy) to last
/// (nearest proxy).
///
/// Strict: unknown keys, duplicate single-valued keys, empty elements, stray quotes and
/// control characters are errors, so that a value that two parsers could read differently
/// is refused rather than guessed at.
///
/// ```
/// let els = argocd_agent_mesh::xfcc::parse_xfcc(
///     r#"By=spiffe://hub.example/ns/argocd/sa/principal;Subject="";URI=spiffe://hub.example/ns/edge/sa/agent-1"#,
/// ).unwrap();
/// assert_eq!(els[0].uri, ["spiffe://hub.example/ns/edge/sa/agent-1"]);
/// ```
pub fn parse_xfcc(value: &str) -> Result<Vec<XfccElement>, XfccError> {
    if value.len() > MAX_XFCC_BYTES {
        return Err(XfccError::TooLong {
            len: value.len(),
            max: MAX_XFCC_BYTES,
        });
    }
    Parser {
        input: value,
        pos: 0,
    }
    .parse()
}

struct Parser<'a> {
    input: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.input[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn parse(mut self) -> Result<Vec<XfccElement>, XfccError> {
        let mut elements = Vec::new();
        loop {
            let index = elements.len();
            if index >= MAX_XFCC_ELEMENTS {
                return Err(XfccError::TooManyElements {
                    max: MAX_XFCC_ELEMENTS,
                });
            }
            elements.push(self.element(index)?);
            match self.bump() {
                None => return Ok(elements),
                Some(',') => continue,
                // `element` only returns at ',' or end of input.
                Some(c) => {
                    return Err(XfccError::Unexpected {
                        element: index,
                        found: c,
                        at: self.pos - c.len_utf8(),
                    });
                }
            }
        }
    }

    /// Reads one element, stopping before the `,` that ends it (or at end of input).
    fn element(&mut self, index: usize) -> Result<XfccElement, XfccError> {
        if matches!(self.peek(), None | Some(',')) {
            return Err(XfccError::EmptyElement { element: index });
        }
        let mut el = XfccElement::default();
        let mut pairs = 0;
        loop {
            pairs += 1;
            if pairs > MAX_XFCC_PAIRS {
                return Err(XfccError::TooManyPairs {
                    element: index,
                    max: MAX_XFCC_PAIRS,
                });
            }
            let (key, value) = self.pair(index)?;
            match single_valued_slot(&mut el, key) {
                Some(slot) if slot.is_some() => {
                    return Err(XfccError::DuplicateKey {
                        element: index,
                        key: key.name(),
                    });
                }
                Some(slot) => *slot = Some(value),
                None if key == Key::Uri => el.uri.push(value),
                None => el.dns.push(value),
            }
            match self.peek() {
                Some(';') => {
                    self.bump();
                }
                _ => return Ok(el),
            }
        }
    }

    /// Reads `key=value`, stopping before `;`, `,` or end of input.
    fn pair(&mut self, element: usize) -> Result<(Key, String), XfccError> {
        let key_start = self.pos;
        while let Some(c) = self.peek() {
            match c {
                '=' => break,
                ';' | ',' => {
                    return Err(XfccError::MissingEquals {
                        element,
                        key: self.input[key_start..self.pos].to_owned(),
                        at: self.pos,
                    });
                }
                c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                    self.bump();
                }
                c => {
                    return Err(XfccError::Unexpected {
                        element,
                        found: c,
                        at: self.pos,
                    });
                }
            }
        }
        let raw_key = &self.input[key_start..self.pos];
        if self.peek().is_none() {
            return Err(XfccError::MissingEquals {
                element,
                key: raw_key.to_owned(),
                at: self.pos,
            });
        }
        if raw_key.is_empty() {
            return Err(XfccError::EmptyKey {
                element,
                at: key_start,
            });
        }
        let key = Key::from_str_ci(raw_key).ok_or_else(|| XfccError::UnknownKey {
            element,
            key: raw_key.to_owned(),
        })?;
        self.bump(); // '='
        let value = if self.peek() == Some('"') {
            self.quoted(element)?
        } else {
            self.unquoted(element)?
        };
        Ok((key, value))
    }

    fn quoted(&mut self, element: usize) -> Result<String, XfccError> {
        let open = self.pos;
        self.bump(); // '"'
        let mut out = String::new();
        loop {
            match self.bump() {
                None => return Err(XfccError::UnterminatedQuote { element, at: open }),
                Some('"') => break,
                // `\"` and `\\` are escapes; any other backslash is kept as written, since
                // subject DNs use RFC 4514 escapes such as `\,` that Envoy passes through.
                Some('\\') => match self.peek() {
                    Some(c @ ('"' | '\\')) => {
                        self.bump();
                        out.push(c);
                    }
                    _ => out.push('\\'),
                },
                Some(c) if c.is_control() => {
                    return Err(XfccError::Unexpected {
                        element,
                        found: c,
                        at: self.pos - c.len_utf8(),
                    });
                }
                Some(c) => out.push(c),
            }
        }
        match self.peek() {
            None | Some(';') | Some(',') => Ok(out),
            Some(c) => Err(XfccError::Unexpected {
                element,
                found: c,
                at: self.pos,
            }),
        }
    }

    fn unquoted(&mut self, element: usize) -> Result<String, XfccError> {
        let start = self.pos;
        while let Some(c) = self.peek() {
            match c {
                ';' | ',' => break,
                '"' | '=' => {
                    return Err(XfccError::Unexpected {
                        element,
                        found: c,
                        at: self.pos,
                    });
                }
                c if c.is_control() => {
                    return Err(XfccError::Unexpected {
                        element,
                        found: c,
                        at: self.pos,
                    });
                }
                _ => {
                    self.bump();
                }
            }
        }
        Ok(self.input[start..self.pos].to_owned())
    }
}

/// Writes a value, quoting it when it contains a separator, a quote or a backslash, or is
/// empty (as Envoy writes `Subject=""`).
fn write_value(f: &mut fmt::Formatter<'_>, value: &str) -> fmt::Result {
    let needs_quotes = value.is_empty() || value.contains([',', ';', '=', '"', '\\']);
    if !needs_quotes {
        return f.write_str(value);
    }
    f.write_str("\"")?;
    for c in value.chars() {
        if c == '"' || c == '\\' {
            f.write_str("\\")?;
        }
        write!(f, "{c}")?;
    }
    f.write_str("\"")
}

impl fmt::Display for XfccElement {
    /// Writes the element in Envoy's key order; [`parse_xfcc`] reads it back unchanged
    /// (values must not contain control characters).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let singles = [
            ("By", &self.by),
            ("Hash", &self.hash),
            ("Cert", &self.cert),
            ("Chain", &self.chain),
            ("Subject", &self.subject),
        ];
        let pairs = singles
            .into_iter()
            .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
            .chain(self.uri.iter().map(|v| ("URI", v.as_str())))
            .chain(self.dns.iter().map(|v| ("DNS", v.as_str())));
        for (i, (key, value)) in pairs.enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{key}=")?;
            write_value(f, value)?;
        }
        Ok(())
    }
}

/// Joins elements into one XFCC header value (the inverse of [`parse_xfcc`]).
pub fn format_xfcc(elements: &[XfccElement]) -> String {
    elements
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The caller's SPIFFE ID from an XFCC value.
///
/// Only the LAST element counts: it was added by the proxy nearest to this server (our own
/// sidecar), which verified the client certificate itself. Earlier elements were written
/// by proxies further away or by the client, and proxies configured with `APPEND_FORWARD`
/// (Istio's sidecar default) pass those through unchanged, so they prove nothing.
///
/// That element must carry exactly one non-empty `URI`, and it must be a SPIFFE ID; zero or
/// several are refused because choosing one would be a guess. When `expected_by` is set,
/// the element's `By` (the proxy's own URI SAN) must be that SPIFFE ID, which proves the
/// element was written by a proxy holding the principal's SVID.
pub fn identity_from_xfcc(
    value: &str,
    expected_by: Option<&SpiffeId>,
) -> Result<SpiffeId, MeshError> {
    let elements = parse_xfcc(value)?;
    let nearest = elements
        .last()
        .ok_or(MeshError::Xfcc(XfccError::EmptyElement { element: 0 }))?;
    let element = elements.len() - 1;
    if let Some(expected) = expected_by {
        let by_ok = nearest
            .by
            .as_deref()
            .and_then(|by| SpiffeId::parse(by).ok())
            .is_some_and(|by| &by == expected);
        if !by_ok {
            return Err(MeshError::XfccByMismatch {
                expected: expected.to_string(),
                found: nearest.by.clone(),
            });
        }
    }
    let uris: Vec<&String> = nearest.uri.iter().filter(|u| !u.is_empty()).collect();
    match uris.as_slice() {
        [] => Err(MeshError::XfccNoUri { element }),
        [uri] => SpiffeId::parse(uri).map_err(|e| MeshError::InvalidSpiffeId {
            header: XFCC_HEADER,
            value: (*uri).clone(),
            reason: e.to_string(),
        }),
        several => Err(MeshError::XfccSeveralUris {
            element,
            uris: several.iter().map(|u| (*u).clone()).collect(),
        }),
    }
}

/// Name of Envoy's header.
pub const XFCC_HEADER: &str = "x-forwarded-client-cert";

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = "spiffe://edge.example/ns/argocd/sa/agent-1";
    const PRINCIPAL: &str = "spiffe://hub.example/ns/argocd/sa/principal";

    fn id(s: &str) -> SpiffeId {
        SpiffeId::parse(s).unwrap()
    }

    #[test]
    fn xfcc_uses_element_added_by_nearest_proxy() {
        // The first element was written by the client (or a far proxy) and claims to be
        // agent-2; the last one is what our sidecar verified.
        let value = format!(
            "By={PRINCIPAL};URI=spiffe://edge.example/ns/argocd/sa/agent-2,By={PRINCIPAL};Hash=abc;Subject=\"\";URI={AGENT}"
        );
        assert_eq!(identity_from_xfcc(&value, None).unwrap(), id(AGENT));
    }

    #[test]
    fn xfcc_parses_envoy_example() {
        let els = parse_xfcc(
            r#"By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject="/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client";URI=http://testclient.lyft.com"#,
        )
        .unwrap();
        assert_eq!(els.len(), 1);
        let el = &els[0];
        assert_eq!(el.by.as_deref(), Some("http://frontend.lyft.com"));
        assert_eq!(
            el.subject.as_deref(),
            Some("/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client")
        );
        assert_eq!(el.uri, ["http://testclient.lyft.com"]);
        assert!(el.dns.is_empty() && el.cert.is_none() && el.chain.is_none());
    }

    #[test]
    fn xfcc_quoted_values_keep_separators_and_escaped_quotes() {
        let els = parse_xfcc(r#"Subject="CN=a,b;c=\"d\"";URI=x,DNS="e=f""#).unwrap();
        assert_eq!(els.len(), 2);
        assert_eq!(els[0].subject.as_deref(), Some(r#"CN=a,b;c="d""#));
        assert_eq!(els[0].uri, ["x"]);
        assert_eq!(els[1].dns, ["e=f"]);
    }

    #[test]
    fn xfcc_keeps_rfc4514_backslash_escapes_in_subject() {
        let els = parse_xfcc(r#"Subject="CN=Doe\, John""#).unwrap();
        assert_eq!(els[0].subject.as_deref(), Some(r"CN=Doe\, John"));
    }

    #[test]
    fn xfcc_keys_are_case_insensitive_and_uri_dns_repeat() {
        let els = parse_xfcc("by=a;uRi=u1;Uri=u2;dns=d1;DNS=d2").unwrap();
        assert_eq!(els[0].by.as_deref(), Some("a"));
        assert_eq!(els[0].uri, ["u1", "u2"]);
        assert_eq!(els[0].dns, ["d1", "d2"]);
    }

    #[test]
    fn xfcc_element_with_zero_uris_is_refused() {
        let err = identity_from_xfcc(r#"By=x;Subject="CN=a""#, None).unwrap_err();
        assert!(matches!(err, MeshError::XfccNoUri { element: 0 }), "{err}");
        // Envoy writes `URI=` for a certificate without URI SAN.
        let err = identity_from_xfcc("Hash=h;URI=", None).unwrap_err();
        assert!(matches!(err, MeshError::XfccNoUri { .. }), "{err}");
    }

    #[test]
    fn xfcc_element_with_two_uris_is_refused() {
        let value = format!("URI={AGENT};URI=spiffe://edge.example/other");
        let err = identity_from_xfcc(&value, None).unwrap_err();
        assert!(matches!(&err, MeshError::XfccSeveralUris { uris, .. } if uris.len() == 2));
        assert!(err.to_string().contains("exactly one"), "{err}");
    }

    #[test]
    fn xfcc_uri_that_is_not_spiffe_is_refused() {
        let err = identity_from_xfcc("URI=https://example.org/x", None).unwrap_err();
        assert!(matches!(err, MeshError::InvalidSpiffeId { .. }), "{err}");
    }

    #[test]
    fn xfcc_by_must_match_principal_when_configured() {
        let value = format!("By={PRINCIPAL};URI={AGENT}");
        assert_eq!(
            identity_from_xfcc(&value, Some(&id(PRINCIPAL))).unwrap(),
            id(AGENT)
        );
        let other = id("spiffe://hub.example/ns/argocd/sa/other");
        let err = identity_from_xfcc(&value, Some(&other)).unwrap_err();
        assert!(matches!(err, MeshError::XfccByMismatch { .. }), "{err}");
        let err = identity_from_xfcc(&format!("URI={AGENT}"), Some(&other)).unwrap_err();
        assert!(matches!(err, MeshError::XfccByMismatch { found: None, .. }));
    }

    #[test]
    fn xfcc_malformed_inputs_are_errors() {
        type Check = fn(&XfccError) -> bool;
        let cases: &[(&str, Check)] = &[
            (r#"Subject="abc"#, |e| {
                matches!(e, XfccError::UnterminatedQuote { .. })
            }),
            (r#"Subject="abc\""#, |e| {
                matches!(e, XfccError::UnterminatedQuote { .. })
            }),
            ("URI", |e| matches!(e, XfccError::MissingEquals { .. })),
            ("URI;By=x", |e| matches!(e, XfccError::MissingEquals { .. })),
            ("", |e| matches!(e, XfccError::EmptyElement { element: 0 })),
            ("URI=a,,URI=b", |e| {
                matches!(e, XfccError::EmptyElement { element: 1 })
            }),
            ("URI=a,", |e| {
                matches!(e, XfccError::EmptyElement { element: 1 })
            }),
            ("URI=a;", |e| matches!(e, XfccError::MissingEquals { .. })),
            ("=a", |e| matches!(e, XfccError::EmptyKey { .. })),
            ("Foo=a", |e| matches!(e, XfccError::UnknownKey { .. })),
            ("By=a;By=b", |e| matches!(e, XfccError::DuplicateKey { .. })),
            ("URI=a\"b", |e| {
                matches!(e, XfccError::Unexpected { found: '"', .. })
            }),
            ("URI=a=b", |e| {
                matches!(e, XfccError::Unexpected { found: '=', .. })
            }),
            (r#"Subject="a"b"#, |e| {
                matches!(e, XfccError::Unexpected { found: 'b', .. })
            }),
            ("URI=a\nb", |e| matches!(e, XfccError::Unexpected { .. })),
            (" URI=a", |e| {
                matches!(e, XfccError::Unexpected { found: ' ', .. })
            }),
        ];
        for (input, check) in cases {
            match parse_xfcc(input) {
                Ok(v) => panic!("{input:?} parsed as {v:?}"),
                Err(e) => assert!(check(&e), "{input:?} gave {e:?}"),
            }
        }
    }

    #[test]
    fn xfcc_limits_size_and_element_count() {
        let long = format!("URI={}", "a".repeat(MAX_XFCC_BYTES));
        assert!(matches!(parse_xfcc(&long), Err(XfccError::TooLong { .. })));
        let many = vec!["URI=a"; MAX_XFCC_ELEMENTS + 1].join(",");
        assert!(matches!(
            parse_xfcc(&many),
            Err(XfccError::TooManyElements { .. })
        ));
        let just_enough = vec!["URI=a"; MAX_XFCC_ELEMENTS].join(",");
        assert_eq!(parse_xfcc(&just_enough).unwrap().len(), MAX_XFCC_ELEMENTS);
        let pairs = vec!["DNS=a"; MAX_XFCC_PAIRS + 1].join(";");
        assert!(matches!(
            parse_xfcc(&pairs),
            Err(XfccError::TooManyPairs { .. })
        ));
    }

    #[test]
    fn xfcc_serializes_back_to_what_it_parsed() {
        let el = XfccElement {
            by: Some(PRINCIPAL.into()),
            hash: Some("00ff".into()),
            cert: Some("-----BEGIN%20CERTIFICATE-----%0A".into()),
            chain: None,
            subject: Some(r#"CN=x,O="y";z\w"#.into()),
            uri: vec![AGENT.into(), String::new()],
            dns: vec!["a.example".into()],
        };
        let text = format_xfcc(&[el.clone(), XfccElement::default().with_uri("u")]);
        let back = parse_xfcc(&text).unwrap();
        assert_eq!(back[0], el);
        assert_eq!(back[1].uri, ["u"]);
    }

    impl XfccElement {
        fn with_uri(mut self, uri: &str) -> Self {
            self.uri.push(uri.into());
            self
        }
    }
}
