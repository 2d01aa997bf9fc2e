//! How errors, times and durations read in messages and log lines: each cause once, RFC
//! 3339 times, durations as the flags take them.

/// Formats an error with its chain of causes, `outer: inner: root`, each cause once: a
/// cause whose text the message before it already ends with (an error that prints its
/// source, or a library that repeats it) is not printed again. The message of error events
/// and of every error a user reads.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let text = e.to_string();
        if !text.is_empty() && !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = e.source();
    }
    out
}

/// A value's text in double quotes, escaped as Rust escapes a string (`"a\"b\n"`): how a
/// name, path or flag value that came from outside reads in a message or log line. Control
/// characters and quotes are escaped, so attacker-supplied text cannot end a log line or a
/// quoted field early, and an empty or space-padded value stays visible.
pub fn quoted<T: std::fmt::Display + ?Sized>(value: &T) -> Quoted<'_, T> {
    Quoted(value)
}

/// The Display form of [`quoted`].
pub struct Quoted<'a, T: ?Sized>(&'a T);

impl<T: std::fmt::Display + ?Sized> std::fmt::Display for Quoted<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        /// Escapes what goes through it as `str`'s Debug form does.
        struct Escape<'a, 'b>(&'a mut std::fmt::Formatter<'b>);
        impl Write for Escape<'_, '_> {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                for c in s.chars() {
                    if c == '\'' {
                        self.0.write_char(c)?;
                    } else {
                        write!(self.0, "{}", c.escape_debug())?;
                    }
                }
                Ok(())
            }
        }
        f.write_char('"')?;
        write!(Escape(f), "{}", self.0)?;
        f.write_char('"')
    }
}

/// Values quoted as [`quoted`] does, in brackets: `["a", "b"]`.
pub fn quoted_list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = items.into_iter().map(|i| quoted(&i).to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// A gRPC status code by its canonical name (`PERMISSION_DENIED`, `UNAVAILABLE`), for
/// log lines and messages (never `tonic::Code`'s Debug form, nor its long description).
pub fn status_code(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "OK",
        C::Cancelled => "CANCELLED",
        C::Unknown => "UNKNOWN",
        C::InvalidArgument => "INVALID_ARGUMENT",
        C::DeadlineExceeded => "DEADLINE_EXCEEDED",
        C::NotFound => "NOT_FOUND",
        C::AlreadyExists => "ALREADY_EXISTS",
        C::PermissionDenied => "PERMISSION_DENIED",
        C::ResourceExhausted => "RESOURCE_EXHAUSTED",
        C::FailedPrecondition => "FAILED_PRECONDITION",
        C::Aborted => "ABORTED",
        C::OutOfRange => "OUT_OF_RANGE",
        C::Unimplemented => "UNIMPLEMENTED",
        C::Internal => "INTERNAL",
        C::Unavailable => "UNAVAILABLE",
        C::DataLoss => "DATA_LOSS",
        C::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// An optional value's text, or `-` when there is none (never `Some(..)`/`None`).
pub fn or_dash<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// A time as RFC 3339 (UTC), for log lines and messages (never `SystemTime`'s Debug form).
pub fn rfc3339(t: std::time::SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| "(out of range)".to_owned())
}

pub use argocd_agent_listener::text::duration;

#[cfg(test)]
mod duration_tests {
    use std::time::Duration;

    #[test]
    fn durations_read_as_flags_take_them() {
        for (d, text) in [
            (Duration::ZERO, "0ms"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_secs(5), "5s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_secs(3661), "1h1m1s"),
            (Duration::from_millis(1500), "1s"),
        ] {
            assert_eq!(super::duration(d), text);
        }
    }
}

#[cfg(test)]
mod quoted_tests {
    use super::{or_dash, quoted};

    #[test]
    fn quoted_text_reads_as_a_debug_string_does() {
        for s in [
            "",
            "plain",
            "a \"b\"",
            "it's",
            "line\nforged=1",
            "tab\t\u{7}",
            "ünï",
        ] {
            assert_eq!(quoted(s).to_string(), format!("{s:?}"), "{s}");
        }
        assert_eq!(quoted(&'x').to_string(), "\"x\"");
        assert_eq!(quoted(&String::from("x\r")).to_string(), "\"x\\r\"");
    }

    #[test]
    fn a_quoted_list_reads_as_a_debug_vec_does() {
        let v = vec!["a".to_owned(), "b\n".to_owned()];
        assert_eq!(super::quoted_list(&v), format!("{v:?}"));
        assert_eq!(super::quoted_list(Vec::<String>::new()), "[]");
    }

    #[test]
    fn status_codes_read_by_their_canonical_names() {
        assert_eq!(
            super::status_code(tonic::Code::PermissionDenied),
            "PERMISSION_DENIED"
        );
        assert_eq!(super::status_code(tonic::Code::Ok), "OK");
    }

    #[test]
    fn a_missing_value_reads_as_a_dash() {
        assert_eq!(or_dash(None::<&str>), "-");
        assert_eq!(or_dash(Some("v1.2")), "v1.2");
    }
}

#[cfg(test)]
mod chain_tests {
    #[derive(Debug, thiserror::Error)]
    #[error("mapping rules file /x: {source}")]
    struct Repeats {
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect")]
    struct Outer(#[source] Repeats);

    #[test]
    fn each_cause_is_printed_once() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = Repeats { source: io() };
        assert_eq!(
            super::error_chain(&e),
            format!("mapping rules file /x: {}", io())
        );
        let e = Outer(Repeats { source: io() });
        assert_eq!(
            super::error_chain(&e),
            format!("cannot connect: mapping rules file /x: {}", io())
        );
    }

    #[test]
    fn times_read_as_rfc3339() {
        assert_eq!(
            super::rfc3339(std::time::SystemTime::UNIX_EPOCH),
            "1970-01-01T00:00:00Z"
        );
    }
}
