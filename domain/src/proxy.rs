//! What both sides of the resource proxy share: the capability name, the watch check of a
//! query, and the cursor that lets a followed container log resume after a reconnect
//! without repeating a line.
//!
//! The principal always asks the agent for timestamped lines. The cursor remembers the
//! newest timestamp passed on and how many lines carried exactly it; a resumed request asks
//! for lines since that second (Kubernetes' `sinceTime` has second precision), and the
//! cursor drops every line older than its mark, and as many lines at the mark as it has
//! already passed on.

use std::str::FromStr;

/// Capability an agent offers when it serves the resource proxy (requests, logs, exec).
pub const CAPABILITY: &str = "resource-proxy.v1";

/// Whether a query string asks the Kubernetes API server for a watch.
///
/// The API server reads a boolean query parameter with apimachinery's conversion of
/// `[]string` to `bool` (`Convert_Slice_string_To_bool` in `k8s.io/apimachinery/pkg/runtime`):
/// a parameter that is present is true unless its first value is `0` or, ignoring case,
/// `false`. So `watch`, `watch=`, `watch=f`, `watch=yes` and `watch=+false` are watches. Keys
/// and values are percent-decoded first (`w%61tch=1` is a watch). To be safe whatever value
/// the server takes, any `watch` value that reads as true counts, not only the first one; and
/// a value that only Unicode case folding makes `false` (Go's `EqualFold`) counts as a
/// watch too.
pub fn is_watch(query: &str) -> bool {
    url::form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "watch" && reads_true(&v))
}

/// apimachinery's reading of one boolean query value, with ASCII case folding only.
fn reads_true(value: &str) -> bool {
    !(value == "0" || value.eq_ignore_ascii_case("false"))
}

/// Where a followed log stream has got to.
#[derive(Debug, Default, Clone)]
pub struct LogCursor {
    /// Newest timestamp passed on, and how many lines carried it.
    mark: Option<(jiff::Timestamp, usize)>,
    /// While resuming: how many lines at `mark` have been seen again (and dropped).
    replayed: usize,
}

/// Splits a kubelet log line (`<RFC3339Nano> <text>`) into its timestamp and the rest.
pub fn split_timestamp(line: &[u8]) -> Option<(jiff::Timestamp, &[u8])> {
    let space = line.iter().position(|b| *b == b' ')?;
    let ts = std::str::from_utf8(&line[..space]).ok()?;
    let ts = jiff::Timestamp::from_str(ts).ok()?;
    Some((ts, &line[space + 1..]))
}

impl LogCursor {
    /// Whether `line` (timestamped) is new and must be passed on; records it if so. Lines
    /// without a readable timestamp are always passed on.
    pub fn accept(&mut self, line: &[u8]) -> bool {
        let Some((ts, _)) = split_timestamp(line) else {
            return true;
        };
        match &mut self.mark {
            Some((mark, count)) if ts < *mark => false,
            Some((mark, count)) if ts == *mark => {
                if self.replayed < *count {
                    self.replayed += 1;
                    false
                } else {
                    *count += 1;
                    self.replayed = *count;
                    true
                }
            }
            _ => {
                self.mark = Some((ts, 1));
                self.replayed = 1;
                true
            }
        }
    }

    /// Starts a resumed request: lines at the mark are counted again from zero.
    pub fn resume(&mut self) {
        self.replayed = 0;
    }

    /// `sinceTime` for a resumed request: the mark's second (RFC 3339), if any line passed.
    pub fn since_time(&self) -> Option<String> {
        let (mark, _) = self.mark?;
        let secs = jiff::Timestamp::from_second(mark.as_second()).ok()?;
        Some(secs.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_reads_kubelet_timestamps() {
        let (ts, rest) = split_timestamp(b"2026-11-23T10:00:00.5Z hello world\n").unwrap();
        assert_eq!(ts.as_second(), 1_795_428_000);
        assert_eq!(rest, b"hello world\n");
        assert!(split_timestamp(b"no timestamp here").is_none());
        assert!(split_timestamp(b"").is_none());
    }

    #[test]
    fn a_resumed_stream_repeats_no_line_and_loses_none() {
        let lines: Vec<Vec<u8>> = [
            "2026-11-23T10:00:00.1Z a\n",
            "2026-11-23T10:00:00.2Z b\n",
            "2026-11-23T10:00:00.2Z c\n",
            "2026-11-23T10:00:01Z d\n",
            "2026-11-23T10:00:01Z e\n",
            "2026-11-23T10:00:01.7Z f\n",
        ]
        .iter()
        .map(|l| l.as_bytes().to_vec())
        .collect();
        let mut c = LogCursor::default();
        // The first stream passes a..d, then the agent reconnects.
        for l in &lines[..4] {
            assert!(c.accept(l));
        }
        assert_eq!(c.since_time().as_deref(), Some("2026-11-23T10:00:01Z"));
        c.resume();
        // The resumed stream starts at 10:00:01 and so repeats d.
        let passed: Vec<&Vec<u8>> = lines[3..].iter().filter(|l| c.accept(l)).collect();
        assert_eq!(passed, vec![&lines[4], &lines[5]]);
        // A second resume with sinceTime in the same second drops everything up to f.
        c.resume();
        let again: Vec<&Vec<u8>> = lines[3..].iter().filter(|l| c.accept(l)).collect();
        assert!(again.is_empty());
        assert!(c.accept(b"2026-11-23T10:00:02Z g\n"));
    }

    #[test]
    fn watch_values_are_read_as_the_api_server_reads_them() {
        for q in [
            "watch",
            "watch=",
            "watch=f",
            "watch=F",
            "watch=t",
            "watch=1",
            "watch=true",
            "watch=yes",
            "watch=no",
            "watch=00",
            "watch=+false",
            "watch=%20false",
            "watch=false%00",
            // `fal\u{17f}e` (long s) is `false` to Go's EqualFold; refused all the same.
            "watch=fal%C5%BFe",
            "w%61tch=1",
            "w%61tch",
            "%77atch=",
            "limit=5&watch",
            "watch=false&watch=true",
            "watch=true&watch=false",
            "watch=0&watch=f",
        ] {
            assert!(is_watch(q), "{q:?} is a watch");
        }
        for q in [
            "",
            "watch=0",
            "watch=false",
            "watch=False",
            "watch=FALSE",
            "watch=FaLsE",
            "w%61tch=false",
            "watch=f%61lse",
            "watch=0&watch=false",
            "limit=5",
            "watchx=1",
            "xwatch=1",
            "allowWatchBookmarks=true",
            "resourceVersionMatch=NotOlderThan",
        ] {
            assert!(!is_watch(q), "{q:?} is not a watch");
        }
    }

    #[test]
    fn lines_without_timestamps_pass() {
        let mut c = LogCursor::default();
        assert!(c.accept(b"plain\n"));
        assert!(c.since_time().is_none());
    }
}
