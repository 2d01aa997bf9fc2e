//! Pod subresource `log`, as the apiserver and the kubelet serve it: each container's log
//! is a list of lines stamped with the time they were appended (set by tests with
//! `KubeTestServer::set_pod_log` / `append_pod_log`, or made by the log generator
//! annotation), read with the `PodLogOptions` query parameters, and followed as a chunked
//! stream. `exec` lives in `exec.rs`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use jiff::Timestamp;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::Shared;
use super::status::ApiError;

/// Largest log kept per container, in bytes (the oldest lines are dropped beyond it).
pub const POD_LOG_LIMIT: usize = 1 << 20;

/// Pod annotation that makes the server append `line <n> from <pod>/<container>` to every
/// container's log at the given interval (a Go duration such as `500ms` or `2s`).
pub const LOG_EVERY_ANNOTATION: &str = "kube-test-server.argocd-agent.io/log-every";

/// Shortest generator interval honoured (shorter ones are raised to it).
const MIN_LOG_EVERY: Duration = Duration::from_millis(10);

type Key = (String, String, String);

/// One log line and when it was appended.
#[derive(Clone)]
struct LogLine {
    /// Position in the container's log since the server started (never reused).
    seq: u64,
    time: Timestamp,
    text: String,
}

#[derive(Default)]
struct ContainerLog {
    lines: VecDeque<LogLine>,
    bytes: usize,
}

/// Container logs by (namespace, pod, container), and a signal bumped on every append.
pub struct PodLogs {
    logs: Mutex<BTreeMap<Key, ContainerLog>>,
    next_seq: Mutex<u64>,
    changed: watch::Sender<u64>,
}

impl Default for PodLogs {
    fn default() -> Self {
        Self {
            logs: Mutex::default(),
            next_seq: Mutex::new(0),
            changed: watch::channel(0).0,
        }
    }
}

fn key(ns: &str, pod: &str, container: &str) -> Key {
    (ns.into(), pod.into(), container.into())
}

impl PodLogs {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, ContainerLog>> {
        // Every change is a push or pop of whole lines: a poisoned lock is still consistent.
        self.logs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the log of one container with `text`'s lines, stamped now.
    pub fn set(&self, ns: &str, pod: &str, container: &str, text: &str) {
        self.lock().remove(&key(ns, pod, container));
        self.append(ns, pod, container, text);
    }

    /// Appends `text`'s lines (a missing final newline is implied), stamped now, and wakes
    /// followers.
    pub fn append(&self, ns: &str, pod: &str, container: &str, text: &str) {
        let now = Timestamp::now();
        {
            let mut logs = self.lock();
            let log = logs.entry(key(ns, pod, container)).or_default();
            let mut seq = self.next_seq.lock().unwrap_or_else(|e| e.into_inner());
            for line in text.lines() {
                log.bytes += line.len() + 1;
                log.lines.push_back(LogLine {
                    seq: *seq,
                    time: now,
                    text: line.to_string(),
                });
                *seq += 1;
            }
            while log.bytes > POD_LOG_LIMIT {
                match log.lines.pop_front() {
                    Some(l) => log.bytes -= l.text.len() + 1,
                    None => break,
                }
            }
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// Lines from position `from` on (all lines when `from` is 0).
    fn lines_from(&self, key: &Key, from: u64) -> Vec<LogLine> {
        self.lock()
            .get(key)
            .map(|log| {
                log.lines
                    .iter()
                    .filter(|l| l.seq >= from)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The container a `log`/`exec` request names (`container=`, or the only one).
pub fn resolve_container<'a>(
    pod: &'a Value,
    q: &super::http::QueryView,
) -> Result<&'a str, ApiError> {
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let containers = container_names(pod);
    match q.get("container") {
        Some(c) => containers
            .iter()
            .find(|x| **x == c)
            .copied()
            .ok_or_else(|| {
                ApiError::bad_request(format!("container {c} is not valid for pod {name}"))
            }),
        None if containers.len() == 1 => Ok(containers[0]),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}

fn container_names(pod: &Value) -> Vec<&str> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default()
}

/// `PodLogOptions` from the query, checked as the apiserver does.
struct LogOptions {
    follow: bool,
    tail_lines: Option<usize>,
    since: Option<Timestamp>,
    timestamps: bool,
    limit_bytes: Option<u64>,
}

/// Go's `strconv.ParseBool`, which the apiserver's query conversion uses.
fn parse_bool(q: &super::http::QueryView, k: &str) -> Result<bool, ApiError> {
    match q.get(k) {
        None | Some("") => Ok(false),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
        Some(v) => Err(ApiError::bad_request(format!(
            "invalid value for {k}: strconv.ParseBool: parsing {v:?}: invalid syntax"
        ))),
    }
}

fn parse_int(q: &super::http::QueryView, k: &str) -> Result<Option<i64>, ApiError> {
    match q.get(k) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            ApiError::bad_request(format!(
                "invalid value for {k}: strconv.ParseInt: parsing {v:?}: invalid syntax"
            ))
        }),
    }
}

/// 422 for a `PodLogOptions` field error, as `ValidatePodLogOptions` reports it.
fn invalid_options(pod: &str, field: &str, message: &str, reason: &str) -> ApiError {
    let shown = if field.is_empty() {
        message.to_string()
    } else {
        format!("{field}: {message}")
    };
    let mut e = ApiError::new(
        422,
        "Invalid",
        format!("PodLogOptions \"{pod}\" is invalid: {shown}"),
    );
    e.details = Some(json!({"name": pod, "kind": "PodLogOptions",
        "causes": [{"reason": reason, "message": message, "field": field}]}));
    e
}

fn log_options(
    q: &super::http::QueryView,
    pod: &str,
    container: &str,
) -> Result<LogOptions, ApiError> {
    let follow = parse_bool(q, "follow")?;
    let timestamps = parse_bool(q, "timestamps")?;
    let previous = parse_bool(q, "previous")?;
    let tail = parse_int(q, "tailLines")?;
    let limit = parse_int(q, "limitBytes")?;
    let since_seconds = parse_int(q, "sinceSeconds")?;
    let since_time = match q.get("sinceTime") {
        None => None,
        Some(v) => Some(v.parse::<Timestamp>().map_err(|e| {
            ApiError::bad_request(format!("invalid value for sinceTime: {v:?}: {e}"))
        })?),
    };
    if let Some(n) = tail.filter(|n| *n < 0) {
        return Err(invalid_options(
            pod,
            "tailLines",
            &format!("Invalid value: {n}: must be greater than or equal to 0"),
            "FieldValueInvalid",
        ));
    }
    if let Some(n) = limit.filter(|n| *n < 1) {
        return Err(invalid_options(
            pod,
            "limitBytes",
            &format!("Invalid value: {n}: must be greater than 0"),
            "FieldValueInvalid",
        ));
    }
    let since = match (since_seconds, since_time) {
        (Some(_), Some(_)) => {
            return Err(invalid_options(
                pod,
                "",
                "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified",
                "FieldValueForbidden",
            ));
        }
        (Some(n), None) if n < 1 => {
            return Err(invalid_options(
                pod,
                "sinceSeconds",
                &format!("Invalid value: {n}: must be greater than 0"),
                "FieldValueInvalid",
            ));
        }
        (Some(n), None) => Some(
            Timestamp::now()
                .checked_sub(jiff::SignedDuration::from_secs(n))
                .unwrap_or(Timestamp::MIN),
        ),
        (None, t) => t,
    };
    if previous {
        // Containers here never restart, so there is no previous instance (kubelet's answer).
        return Err(ApiError::bad_request(format!(
            "previous terminated container \"{container}\" in pod \"{pod}\" not found"
        )));
    }
    Ok(LogOptions {
        follow,
        tail_lines: tail.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        since,
        timestamps,
        limit_bytes: limit.map(|n| n.unsigned_abs()),
    })
}

/// A log line as the kubelet writes it: with `timestamps`, prefixed by its RFC 3339 time
/// with 9 fractional digits (`RFC3339NanoFixed`) and a space.
fn render(line: &LogLine, timestamps: bool) -> String {
    if timestamps {
        format!("{} {}\n", rfc3339_nano_fixed(line.time), line.text)
    } else {
        format!("{}\n", line.text)
    }
}

fn rfc3339_nano_fixed(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S.%9fZ").to_string()
}

/// Output budget (`limitBytes`): what may still be written.
struct Budget(Option<u64>);

impl Budget {
    fn spent(&self) -> bool {
        self.0 == Some(0)
    }

    /// The part of `s` that fits; `None` once the budget is spent.
    fn take(&mut self, s: String) -> Option<Bytes> {
        match &mut self.0 {
            None => Some(Bytes::from(s)),
            Some(0) => None,
            Some(left) => {
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(s.len());
                *left -= n as u64;
                let mut b = s.into_bytes();
                b.truncate(n);
                Some(Bytes::from(b))
            }
        }
    }
}

/// What `GET pods/<name>/log` answers.
pub enum LogBody {
    Text(Bytes),
    /// `follow=true`: chunks (one per line) until the pod goes or the client leaves.
    Follow(mpsc::Receiver<Bytes>),
}

/// `GET pods/<name>/log` with `container`, `follow`, `tailLines`, `sinceSeconds`,
/// `sinceTime`, `timestamps`, `limitBytes` and `previous`.
pub fn log(
    shared: &Arc<Shared>,
    pod: &Value,
    q: &super::http::QueryView,
) -> Result<LogBody, ApiError> {
    let s = |p: &str| pod.pointer(p).and_then(Value::as_str).unwrap_or("");
    let (ns, name, uid) = (
        s("/metadata/namespace"),
        s("/metadata/name"),
        s("/metadata/uid"),
    );
    let container = resolve_container(pod, q)?;
    let opts = log_options(q, name, container)?;
    let key = key(ns, name, container);
    // Subscribed before reading, so no append between the read and the follow is missed.
    let changed = shared.pod_logs.changed.subscribe();
    let lines = shared.pod_logs.lines_from(&key, 0);
    let next = lines.last().map_or(0, |l| l.seq + 1);
    let skip = opts.tail_lines.map_or(0, |n| lines.len().saturating_sub(n));
    let mut budget = Budget(opts.limit_bytes);
    let mut initial = Vec::new();
    for line in lines[skip..]
        .iter()
        .filter(|l| opts.since.is_none_or(|t| l.time >= t))
    {
        match budget.take(render(line, opts.timestamps)) {
            Some(b) => initial.push(b),
            None => break,
        }
    }
    if !opts.follow {
        return Ok(LogBody::Text(initial.concat().into()));
    }
    let (tx, rx) = mpsc::channel(64);
    let follower = Follower {
        shared: shared.clone(),
        key,
        uid: uid.to_string(),
        timestamps: opts.timestamps,
        budget,
        next,
    };
    tokio::spawn(follower.run(initial, changed, tx));
    Ok(LogBody::Follow(rx))
}

/// A `follow=true` stream.
struct Follower {
    shared: Arc<Shared>,
    key: Key,
    uid: String,
    timestamps: bool,
    budget: Budget,
    /// The first line not sent yet.
    next: u64,
}

impl Follower {
    async fn run(
        mut self,
        initial: Vec<Bytes>,
        mut changed: watch::Receiver<u64>,
        tx: mpsc::Sender<Bytes>,
    ) {
        for chunk in initial {
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
        if self.budget.spent() {
            return;
        }
        let mut writes = self.shared.store.subscribe();
        let mut stop = self.shared.shutdown.subscribe();
        loop {
            changed.borrow_and_update();
            writes.borrow_and_update();
            for line in self.shared.pod_logs.lines_from(&self.key, self.next) {
                self.next = line.seq + 1;
                let Some(chunk) = self.budget.take(render(&line, self.timestamps)) else {
                    return;
                };
                if tx.send(chunk).await.is_err() || self.budget.spent() {
                    return;
                }
            }
            if !self.pod_exists() || *stop.borrow() {
                return;
            }
            tokio::select! {
                c = changed.changed() => if c.is_err() { return },
                w = writes.changed() => if w.is_err() { return },
                _ = stop.changed() => return,
                _ = tx.closed() => return,
            }
        }
    }

    /// The followed pod is still there (the same one: a re-created pod has another uid).
    fn pod_exists(&self) -> bool {
        let store = &self.shared.store;
        let (ns, pod, _) = &self.key;
        store.find("", "v1", "pods").is_some_and(|res| {
            store.get(res, ns, pod).is_ok_and(|p| {
                p.pointer("/metadata/uid").and_then(Value::as_str) == Some(self.uid.as_str())
            })
        })
    }
}

/// A Go duration (`300ms`, `2s`, `1m30s`, `1.5h`): units `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * scale;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// A running generator, aborted when dropped.
struct Generator {
    uid: String,
    every: Duration,
    containers: Vec<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Generator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs the log generators of pods annotated with [`LOG_EVERY_ANNOTATION`]: one task per
/// pod, started when such a pod appears, restarted when its interval or containers change,
/// stopped when the pod is deleted or loses the annotation, all stopped on shutdown.
pub async fn run_log_generators(shared: Arc<Shared>) {
    let Some(res) = shared.store.find("", "v1", "pods") else {
        return;
    };
    let mut writes = shared.store.subscribe();
    let mut stop = shared.shutdown.subscribe();
    let mut running: HashMap<(String, String), Generator> = HashMap::new();
    loop {
        writes.borrow_and_update();
        if *stop.borrow() {
            return;
        }
        let (pods, _) = shared.store.list(res, None);
        let mut wanted = HashMap::new();
        for pod in &pods {
            let s = |p: &str| pod.pointer(p).and_then(Value::as_str).unwrap_or("");
            let every = pod
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(LOG_EVERY_ANNOTATION))
                .and_then(Value::as_str);
            let Some(every) = every else { continue };
            let Some(every) = parse_go_duration(every) else {
                tracing::warn!(
                    pod = s("/metadata/name"),
                    every,
                    "invalid {LOG_EVERY_ANNOTATION}"
                );
                continue;
            };
            let containers: Vec<String> = container_names(pod)
                .into_iter()
                .map(str::to_string)
                .collect();
            let key = (
                s("/metadata/namespace").to_string(),
                s("/metadata/name").to_string(),
            );
            wanted.insert(
                key,
                (
                    s("/metadata/uid").to_string(),
                    every.max(MIN_LOG_EVERY),
                    containers,
                ),
            );
        }
        running.retain(|k, g| {
            wanted.get(k).is_some_and(|(uid, every, cs)| {
                *uid == g.uid && *every == g.every && *cs == g.containers
            })
        });
        for (k, (uid, every, containers)) in wanted {
            if running.contains_key(&k) {
                continue;
            }
            let task = tokio::spawn(generate(
                shared.clone(),
                k.clone(),
                every,
                containers.clone(),
            ));
            running.insert(
                k,
                Generator {
                    uid,
                    every,
                    containers,
                    task,
                },
            );
        }
        tokio::select! {
            w = writes.changed() => if w.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}

/// Appends `line <n> from <pod>/<container>` to each container every `every`.
async fn generate(
    shared: Arc<Shared>,
    (ns, pod): (String, String),
    every: Duration,
    containers: Vec<String>,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 1u64.. {
        tick.tick().await;
        for c in &containers {
            shared
                .pod_logs
                .append(&ns, &pod, c, &format!("line {n} from {pod}/{c}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_go_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration(""), None);
        assert_eq!(parse_go_duration("5"), None);
        assert_eq!(parse_go_duration("5x"), None);
        assert_eq!(parse_go_duration("-1s"), None);
    }

    #[test]
    fn timestamps_have_nine_fractional_digits() {
        let t: Timestamp = "2026-11-23T10:00:00.1234Z".parse().unwrap();
        assert_eq!(rfc3339_nano_fixed(t), "2026-11-23T10:00:00.123400000Z");
        let t: Timestamp = "2026-11-23T10:00:00Z".parse().unwrap();
        assert_eq!(rfc3339_nano_fixed(t), "2026-11-23T10:00:00.000000000Z");
    }

    #[test]
    fn logs_keep_lines_and_drop_the_oldest_beyond_the_limit() {
        let logs = PodLogs::default();
        logs.set("ns", "p", "c", "a\nb");
        logs.append("ns", "p", "c", "c\n");
        let k = key("ns", "p", "c");
        let texts: Vec<String> = logs.lines_from(&k, 0).into_iter().map(|l| l.text).collect();
        assert_eq!(texts, ["a", "b", "c"]);
        let big = "x".repeat(POD_LOG_LIMIT / 2);
        logs.append("ns", "p", "c", &format!("{big}\n{big}\n"));
        let lines = logs.lines_from(&k, 0);
        assert_eq!(lines.len(), 1);
        assert!(lines.iter().all(|l| l.text == big));
    }

    #[test]
    fn budget_truncates_and_then_stops() {
        let mut b = Budget(Some(5));
        assert_eq!(b.take("abc\n".into()).unwrap(), "abc\n");
        assert_eq!(b.take("def\n".into()).unwrap(), "d");
        assert!(b.take("g\n".into()).is_none());
    }
}
