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

/// A time as RFC 3339 (UTC), for log lines and messages (never `SystemTime`'s Debug form).
pub fn rfc3339(t: std::time::SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| "(out of range)".to_owned())
}

/// A duration as the flags take it (`90s` reads `1m30s`, `250ms`, `2h`), for log lines and
/// messages (never `Duration`'s Debug form). Below a second: milliseconds; otherwise whole
/// seconds (a fraction of a second is dropped).
pub fn duration(d: std::time::Duration) -> String {
    if d.as_secs() == 0 {
        return format!("{}ms", d.as_millis());
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    out
}

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
