//! `/metrics` of the real principal and agent, read by an independent parser (the Python
//! Prometheus client's text-format parser, installed by `.ci/run`): the exposition is text
//! format 0.0.4 as upstream serves it, every upstream series we implement has upstream's
//! stored name, type and label names, and the series move after a create, a status report,
//! an autonomous write, a GPG key change and a disconnect.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);

/// Upstream's principal series as a Prometheus server scraping it stores them (upstream's
/// `promhttp.Handler()` serves text format 0.0.4, where a counter keeps its registered name):
/// name, type, label names. From argoproj-labs/argocd-agent `internal/metrics/metrics.go`
/// (`NewPrincipalMetrics`, `RegisterBuildInfo`), registered by `principal/server.go`.
const UPSTREAM_PRINCIPAL: &[(&str, &str, &[&str])] = &[
    ("argocd_principal_connected_agents", "gauge", &[]),
    ("principal_agent_avg_connection_time", "gauge", &[]),
    ("principal_applications_created", "counter", &[]),
    ("principal_applications_updated", "counter", &[]),
    ("principal_applications_deleted", "counter", &[]),
    ("principal_app_projects_created", "counter", &[]),
    ("principal_app_projects_updated", "counter", &[]),
    ("principal_app_projects_deleted", "counter", &[]),
    ("principal_repositories_created", "counter", &[]),
    ("principal_repositories_updated", "counter", &[]),
    ("principal_repositories_deleted", "counter", &[]),
    ("argocd_principal_gpg_keys_count", "gauge", &[]),
    ("principal_events_received", "counter", &[]),
    ("principal_events_sent", "counter", &[]),
    (
        "principal_event_processing_time",
        "histogram",
        &["status", "agent_name", "resource_type"],
    ),
    (
        "principal_event_writer_send_errors_total",
        "counter",
        &["agent_name", "reason"],
    ),
    (
        "argocd_principal_event_writer_events_discarded_total",
        "counter",
        &["agent_name", "event_type", "resource_type"],
    ),
    ("principal_errors", "counter", &["resource_type"]),
    (
        "argocd_principal_agent_connections_total",
        "counter",
        &["agent_name"],
    ),
    (
        "argocd_principal_resource_proxy_requests_total",
        "counter",
        &["agent_name"],
    ),
    (
        "argocd_principal_resource_proxy_errors_total",
        "counter",
        &["agent_name", "reason"],
    ),
    (
        "argocd_principal_redis_proxy_requests_total",
        "counter",
        &["agent_name", "command"],
    ),
    (
        "argocd_principal_redis_proxy_errors_total",
        "counter",
        &["agent_name", "command"],
    ),
    (
        "argocd_agent_build_info",
        "gauge",
        &["version", "git_revision"],
    ),
];

/// Upstream's agent series, as [`UPSTREAM_PRINCIPAL`]; from the same file (`NewAgentMetrics`,
/// `RegisterBuildInfo`), registered by `agent/agent.go`.
const UPSTREAM_AGENT: &[(&str, &str, &[&str])] = &[
    ("agent_events_received", "counter", &[]),
    ("agent_events_sent", "counter", &[]),
    (
        "agent_event_processing_time",
        "histogram",
        &["status", "agent_mode", "resource_type"],
    ),
    (
        "agent_event_propagation_latency_seconds",
        "histogram",
        &["resource_type"],
    ),
    (
        "argocd_agent_event_writer_events_discarded_total",
        "counter",
        &["event_type", "resource_type"],
    ),
    ("agent_errors", "counter", &["resource_type"]),
    ("argocd_agent_connection_status", "gauge", &[]),
    (
        "argocd_agent_connection_start_timestamp_seconds",
        "gauge",
        &[],
    ),
    ("argocd_agent_connections_total", "counter", &[]),
    ("argocd_agent_auth_failures_total", "counter", &[]),
    ("argocd_agent_resource_proxy_requests_total", "counter", &[]),
    ("argocd_agent_resource_proxy_errors_total", "counter", &[]),
    (
        "argocd_agent_redis_proxy_requests_total",
        "counter",
        &["command"],
    ),
    (
        "argocd_agent_redis_proxy_errors_total",
        "counter",
        &["command"],
    ),
    (
        "argocd_agent_build_info",
        "gauge",
        &["version", "git_revision"],
    ),
];

/// Upstream principal series we do not export (ApplicationSets are never synced, so the
/// principal never writes one to the hub; docs/migration.md).
const NOT_EXPORTED: &[&str] = &[
    "argocd_principal_appsets_created",
    "argocd_principal_appsets_updated",
    "argocd_principal_appsets_deleted",
];

/// One sample as stored: name, labels, value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: serde_json::Map<String, Value>,
    value: f64,
}

/// A parsed exposition.
#[derive(Debug, Default)]
struct Exposition {
    /// The `# TYPE` lines: family name as exposed, type.
    declared: BTreeMap<String, String>,
    /// The samples, with the names a text-format scraper stores.
    samples: Vec<Sample>,
}

fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    if venv.is_file() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// Parses a text format 0.0.4 exposition with `prometheus_client.parser` (a malformed
/// exposition fails the test). Its family model renames counters (`x` becomes `x_total`), so
/// the stored names come from its sample-line parser, line by line, as Prometheus reads them.
fn parse(text: &str) -> Result<Exposition, HarnessError> {
    const SCRIPT: &str = r##"
import json, sys
from prometheus_client.parser import text_string_to_metric_families, _parse_sample
text = sys.stdin.read()
types = {f.name: f.type for f in text_string_to_metric_families(text)}
declared, samples = [], []
for line in text.splitlines():
    if line.startswith("# TYPE "):
        _, _, name, typ = line.split(" ", 3)
        base = name[:-6] if typ == "counter" and name.endswith("_total") else name
        assert types.get(base) == typ, (name, typ, types.get(base))
        declared.append([name, typ])
    elif line.strip() and not line.startswith("#"):
        s = _parse_sample(line)
        samples.append([s.name, s.labels, s.value])
print(json.dumps({"declared": declared, "samples": samples}))
"##;
    let mut child = std::process::Command::new(python())
        .args(["-c", SCRIPT])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("python with prometheus_client (run .ci/run once): {e}"))?;
    use std::io::Write;
    child
        .stdin
        .take()
        .ok_or("stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(format!(
            "the text-format parser refused the exposition: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    #[derive(serde::Deserialize)]
    struct Parsed {
        declared: Vec<(String, String)>,
        samples: Vec<(String, serde_json::Map<String, Value>, f64)>,
    }
    let parsed: Parsed = serde_json::from_slice(&out.stdout)?;
    Ok(Exposition {
        declared: parsed.declared.into_iter().collect(),
        samples: parsed
            .samples
            .into_iter()
            .map(|(name, labels, value)| Sample {
                name,
                labels,
                value,
            })
            .collect(),
    })
}

/// `/metrics` of the process on `port`, parsed.
async fn scrape(port: u16) -> Result<Exposition, HarnessError> {
    parse(&http_get(port, "/metrics").await?)
}

/// The `content-type` of `/metrics` on `port`, asked for as a Prometheus server asks (it
/// prefers OpenMetrics; upstream answers text 0.0.4 all the same).
async fn content_type(port: u16) -> Result<String, HarnessError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let accept = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,\
                  application/openmetrics-text;version=0.0.1;q=0.4,\
                  text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,\
                  text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
    s.write_all(
        format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_owned)
        })
        .unwrap_or_default())
}

/// The sample names a family of `ty` called `name` is stored under.
fn sample_names(name: &str, ty: &str) -> Vec<String> {
    match ty {
        "histogram" => ["_bucket", "_count", "_sum"]
            .iter()
            .map(|s| format!("{name}{s}"))
            .collect(),
        _ => vec![name.to_owned()],
    }
}

/// Checks that every upstream series of `upstream` is declared with upstream's name and type
/// (labelled ones once they have series), that its samples carry upstream's label names and
/// no others, and that `moved` have samples.
fn check_upstream(what: &str, e: &Exposition, upstream: &[(&str, &str, &[&str])], moved: &[&str]) {
    for (name, ty, labels) in upstream {
        // A labelled family without series is not exposed at all (as with Go's vectors).
        if !labels.is_empty() && !moved.contains(name) && !e.declared.contains_key(*name) {
            continue;
        }
        assert_eq!(
            e.declared.get(*name).map(String::as_str),
            Some(*ty),
            "{what}: upstream's {name} ({ty}) not declared as such; declared: {:?}",
            e.declared
        );
        let names = sample_names(name, ty);
        let samples: Vec<&Sample> = e
            .samples
            .iter()
            .filter(|s| names.contains(&s.name))
            .collect();
        for s in &samples {
            let mut got: BTreeSet<&str> = s.labels.keys().map(String::as_str).collect();
            if s.name.ends_with("_bucket") {
                assert!(got.remove("le"), "{what}: {} without le", s.name);
            }
            let want: BTreeSet<&str> = labels.iter().copied().collect();
            assert_eq!(got, want, "{what}: labels of {} {:?}", s.name, s.labels);
        }
        if moved.contains(name) {
            assert!(!samples.is_empty(), "{what}: {name} has no samples");
        }
    }
    // Nothing else is exposed under a name a text-format scraper would store for upstream.
    for s in &e.samples {
        let ours = s.name.starts_with("argocd_principal_") || s.name.starts_with("argocd_agent_");
        let upstream_name = upstream
            .iter()
            .any(|(n, ty, _)| sample_names(n, ty).contains(&s.name));
        assert!(
            ours || upstream_name,
            "{what}: {} is neither upstream's nor in our namespace",
            s.name
        );
    }
    for name in NOT_EXPORTED {
        assert!(
            !e.declared.contains_key(*name),
            "{what}: {name} is exported"
        );
    }
}

/// Every sample name an exposition can carry, from its `# TYPE` lines (families without
/// samples yet included).
fn exposed_names(e: &Exposition) -> BTreeSet<String> {
    e.declared
        .iter()
        .flat_map(|(name, ty)| sample_names(name, ty))
        .collect()
}

/// Metric names used in PromQL expressions (identifiers of our namespaces).
fn promql_metrics(expr: &str) -> Vec<String> {
    // Label names (in `by (...)`, `without (...)` and matchers) are not metrics.
    let labels = regex::Regex::new(r"(by|without)\s*\([^)]*\)|\{[^}]*\}").unwrap();
    let expr = labels.replace_all(expr, " ");
    let re = regex::Regex::new(r"[a-zA-Z_:][a-zA-Z0-9_:]*").unwrap();
    re.find_iter(&expr)
        .map(|m| m.as_str().to_owned())
        .filter(|t| {
            t.starts_with("argocd_") || t.starts_with("principal_") || t.starts_with("agent_")
        })
        .collect()
}

/// The expressions of `deploy/observability`: the PrometheusRule's and the dashboard's.
fn asset_expressions() -> Result<Vec<String>, HarnessError> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/observability");
    let rule: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.join("prometheusrule.yaml"))?)?;
    let mut exprs: Vec<String> = rule["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["expr"].as_str().map(str::to_owned))
        .collect();
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(
        dir.join("grafana-dashboard.json"),
    )?)?;
    exprs.extend(
        dash["panels"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
            .filter_map(|t| t["expr"].as_str().map(str::to_owned)),
    );
    Ok(exprs)
}

/// Sum of the samples named `name` whose labels include `labels`.
fn value(e: &Exposition, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<&Sample> = e
        .samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).and_then(Value::as_str) == Some(*v))
        })
        .collect();
    (!matching.is_empty()).then(|| matching.iter().map(|s| s.value).sum())
}

async fn until(
    what: &str,
    port: u16,
    name: &'static str,
    labels: &'static [(&'static str, &'static str)],
    ok: impl Fn(f64) -> bool,
) -> Result<(), HarnessError> {
    eventually(what, T, || async {
        let e = scrape(port).await.ok()?;
        value(&e, name, labels).filter(|v| ok(*v)).map(|_| ())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principal_and_agent_metrics_exist_and_move() {
    let mut topo = Topology::start(TopologyOptions::default()).await.unwrap();
    let r: Result<(), HarnessError> = async {
        let p = topo.metrics_ports["principal"];
        let m = topo.metrics_ports[MANAGED];
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs() as f64;

        // Connections and identities.
        until(
            "both agents connected",
            p,
            "argocd_principal_connected_agents",
            &[],
            |v| v == 2.0,
        )
        .await?;
        until(
            "connections counted per agent",
            p,
            "argocd_principal_agent_connections_total",
            &[("agent_name", MANAGED)],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "agent connection status",
            m,
            "argocd_agent_connection_status",
            &[],
            |v| v == 1.0,
        )
        .await?;
        until(
            "agent connections",
            m,
            "argocd_agent_connections_total",
            &[],
            |v| v >= 1.0,
        )
        .await?;
        for port in [p, m] {
            assert_eq!(
                content_type(port).await?,
                "text/plain; version=0.0.4; charset=utf-8"
            );
        }
        let ps = scrape(p).await?;
        assert!(
            value(&ps, "argocd_principal_svid_expiry_timestamp_seconds", &[])
                .is_some_and(|t| t > now),
            "principal SVID expiry"
        );
        assert!(value(&ps, "argocd_principal_svid_rotations_total", &[]).is_some_and(|v| v >= 1.0));
        let ms = scrape(m).await?;
        assert!(
            value(&ms, "argocd_agent_svid_expiry_timestamp_seconds", &[]).is_some_and(|t| t > now),
            "agent SVID expiry"
        );
        // Tracing is off here: the span counters exist (parsed by the independent parser) at 0.
        for (samples, name) in [
            (&ps, "argocd_principal_trace_spans_total"),
            (&ms, "argocd_agent_trace_spans_total"),
        ] {
            for outcome in ["exported", "failed", "dropped"] {
                assert_eq!(
                    value(samples, name, &[("outcome", outcome)]),
                    Some(0.0),
                    "{name}{{outcome={outcome}}}"
                );
            }
        }
        // Build info, as upstream: one series at 1, with the commit `--version` shows.
        let shown = std::process::Command::new(binary("argocd-agent")?)
            .arg("--version")
            .output()?;
        let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
        let commit = shown
            .split("(commit ")
            .nth(1)
            .and_then(|rest| rest.split([',', ')']).next())
            .unwrap_or_else(|| panic!("no commit in --version: {shown}"))
            .to_owned();
        for e in [&ps, &ms] {
            assert_eq!(
                value(
                    e,
                    "argocd_agent_build_info",
                    &[
                        ("version", env!("CARGO_PKG_VERSION")),
                        ("git_revision", commit.as_str())
                    ]
                ),
                Some(1.0),
                "build info with git_revision {commit:?}"
            );
        }
        // Our own series keep their names.
        for name in [
            "argocd_principal_hub_write_errors_total",
            "argocd_principal_queue_depth",
            "argocd_principal_event_resends_total",
        ] {
            assert!(value(&ps, name, &[]).is_some(), "{name} missing");
        }
        for name in [
            "argocd_agent_queue_depth",
            "argocd_agent_event_resends_total",
        ] {
            assert!(value(&ms, name, &[]).is_some(), "{name} missing");
        }

        // A hub create reaches the agent: sent, received, applied, latency observed.
        apps(&topo.hub, MANAGED)?
            .create(
                &PostParams::default(),
                &sample_app("guestbook", MANAGED, "guestbook"),
            )
            .await?;
        eventually("app on spoke", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
        })
        .await?;
        until(
            "principal sent a spec-update",
            p,
            "argocd_principal_events_sent_total",
            &[("agent", MANAGED), ("type", "spec-update")],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "principal sent events",
            p,
            "principal_events_sent",
            &[],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "agent received it",
            m,
            "argocd_agent_events_received_total",
            &[("type", "spec-update")],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "agent received events",
            m,
            "agent_events_received",
            &[],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "agent applied it",
            m,
            "agent_event_processing_time_count",
            &[
                ("resource_type", "application"),
                ("status", "success"),
                ("agent_mode", "managed"),
            ],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "propagation latency observed",
            m,
            "agent_event_propagation_latency_seconds_count",
            &[("resource_type", "application")],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "the agent's DefBuckets (Go's) hold it",
            m,
            "agent_event_propagation_latency_seconds_bucket",
            &[("resource_type", "application"), ("le", "10")],
            |v| v >= 1.0,
        )
        .await?;
        // The agent's acknowledgement was timed: the estimate a new agent's queue starts
        // from is above 0 (sampled every 5 s) and far below the 60 s resend cap.
        until(
            "the acknowledgement round trip is learned",
            p,
            "argocd_principal_ack_timeout_seconds",
            &[],
            |v| v > 0.0 && v < 60.0,
        )
        .await?;

        // Status from the spoke: received and processed by the principal.
        set_status(
            &apps(&topo.managed_spoke, SPOKE_NS)?,
            "guestbook",
            json!({"health": {"status": "Healthy"}}),
        )
        .await?;
        until(
            "principal received the status",
            p,
            "argocd_principal_events_received_total",
            &[("agent", MANAGED), ("type", "status-update")],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "principal received events",
            p,
            "principal_events_received",
            &[],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "principal processed it",
            p,
            "principal_event_processing_time_count",
            &[
                ("agent_name", MANAGED),
                ("resource_type", "application"),
                ("status", "success"),
            ],
            |v| v >= 1.0,
        )
        .await?;

        // An autonomous create is a hub write the principal counts.
        apps(&topo.autonomous_spoke, SPOKE_NS)?
            .create(
                &PostParams::default(),
                &sample_app("edge", SPOKE_NS, "guestbook"),
            )
            .await?;
        until(
            "hub application created by the principal",
            p,
            "principal_applications_created",
            &[],
            |v| v >= 1.0,
        )
        .await?;

        // The hub's GPG keys are counted, and back to 0 when their ConfigMap goes.
        let cms = configmaps(&topo.hub, HUB_ARGOCD_NS)?;
        cms.create(
            &PostParams::default(),
            &object(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "argocd-gpg-keys-cm", "namespace": HUB_ARGOCD_NS},
                "data": {"4AEE18F83AFDEB23": "key one", "FCCA2B4F6E8B1B6C": "key two"}})),
        )
        .await?;
        until(
            "GPG keys counted",
            p,
            "argocd_principal_gpg_keys_count",
            &[],
            |v| v == 2.0,
        )
        .await?;
        cms.delete("argocd-gpg-keys-cm", &Default::default())
            .await?;
        until(
            "GPG keys gone",
            p,
            "argocd_principal_gpg_keys_count",
            &[],
            |v| v == 0.0,
        )
        .await?;
        until(
            "resync durations observed",
            p,
            "argocd_principal_resync_duration_seconds_count",
            &[("mode", "autonomous")],
            |v| v >= 1.0,
        )
        .await?;

        // Upstream's series: names, types and label names as upstream's, the active ones
        // with samples.
        let (ps, ms) = (scrape(p).await?, scrape(m).await?);
        check_upstream(
            "principal",
            &ps,
            UPSTREAM_PRINCIPAL,
            &[
                "argocd_principal_connected_agents",
                "principal_agent_avg_connection_time",
                "principal_applications_created",
                "argocd_principal_gpg_keys_count",
                "principal_events_received",
                "principal_events_sent",
                "principal_event_processing_time",
                "argocd_principal_agent_connections_total",
                "argocd_agent_build_info",
            ],
        );
        check_upstream(
            "agent",
            &ms,
            UPSTREAM_AGENT,
            &[
                "agent_events_received",
                "agent_events_sent",
                "agent_event_processing_time",
                "agent_event_propagation_latency_seconds",
                "argocd_agent_connection_status",
                "argocd_agent_connection_start_timestamp_seconds",
                "argocd_agent_connections_total",
                "argocd_agent_auth_failures_total",
                "argocd_agent_resource_proxy_requests_total",
                "argocd_agent_resource_proxy_errors_total",
                "argocd_agent_build_info",
            ],
        );

        // Every metric the shipped alerts and dashboard use is one the binaries export.
        // (Upstream's labelled families, checked above, appear with their first series.)
        let mut exported = exposed_names(&ps);
        exported.extend(exposed_names(&ms));
        for (name, ty, _) in UPSTREAM_PRINCIPAL.iter().chain(UPSTREAM_AGENT) {
            exported.extend(sample_names(name, ty));
        }
        let exprs = asset_expressions()?;
        assert!(
            exprs.len() >= 10,
            "alerts and panels found: {}",
            exprs.len()
        );
        for expr in &exprs {
            for name in promql_metrics(expr) {
                assert!(
                    exported.contains(&name),
                    "{name} (in `{expr}`) is not exported; exported: {exported:?}"
                );
            }
        }

        // A disconnect shows on both sides.
        topo.managed
            .as_mut()
            .ok_or("no managed agent")?
            .stop()
            .await;
        until(
            "one agent left",
            p,
            "argocd_principal_connected_agents",
            &[],
            |v| v == 1.0,
        )
        .await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

#[test]
fn the_parser_refuses_a_malformed_exposition_and_keeps_stored_names() {
    assert!(parse("# TYPE x counter\nx{a=\"b\" 1\n").is_err());
    // A TYPE line saying something else than what the parser makes of the family.
    assert!(parse("# TYPE x counter\n# TYPE x gauge\nx 1\n").is_err());
    let ok = parse("# TYPE x counter\nx{a=\"b\"} 2\n# TYPE y_total counter\ny_total 1\n").unwrap();
    assert_eq!(value(&ok, "x", &[("a", "b")]), Some(2.0));
    assert_eq!(value(&ok, "x_total", &[]), None);
    assert_eq!(value(&ok, "y_total", &[]), Some(1.0));
    assert_eq!(ok.declared.get("x").map(String::as_str), Some("counter"));
}

#[test]
fn upstream_checks_fail_on_a_wrong_name_type_or_label() {
    let run = |text: &str| {
        let e = parse(text).unwrap();
        std::panic::catch_unwind(|| {
            check_upstream("t", &e, &[("c", "counter", &["agent_name"])], &["c"])
        })
        .is_ok()
    };
    assert!(run("# TYPE c counter\nc{agent_name=\"a\"} 1\n"));
    assert!(!run(
        "# TYPE c_total counter\nc_total{agent_name=\"a\"} 1\n"
    ));
    assert!(!run("# TYPE c gauge\nc{agent_name=\"a\"} 1\n"));
    assert!(!run("# TYPE c counter\nc{agent=\"a\"} 1\n"));
    assert!(!run("# TYPE c counter\n"));
    assert!(!run(
        "# TYPE c counter\nc{agent_name=\"a\"} 1\n# TYPE d counter\nd 1\n"
    ));
}
