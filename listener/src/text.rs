//! Durations in log lines, as the flags take them.

/// A duration as the flags take it (`90s` reads `1m30s`, `250ms`, `2h`): below a second,
/// milliseconds; otherwise whole seconds (the same text as `argocd_agent_identity::text`'s,
/// which this crate does not depend on).
pub(crate) fn duration(d: std::time::Duration) -> String {
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
mod tests {
    use std::time::Duration;

    #[test]
    fn durations_read_as_flags_take_them() {
        for (d, text) in [
            (Duration::ZERO, "0ms"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_secs(5), "5s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(7200), "2h"),
        ] {
            assert_eq!(super::duration(d), text);
        }
    }
}
