//! Durations in log lines, as the flags take them.

/// A duration as the flags take it (`90s` reads `1m30s`, `250ms`, `2h`), for log lines and
/// messages (never `Duration`'s Debug form). Below a second: milliseconds; otherwise whole
/// seconds (a fraction of a second is dropped). The crates above re-export it
/// (`argocd_agent_identity::text::duration`).
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
