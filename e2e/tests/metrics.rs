//! `/metrics` of the real principal and agent, read by an independent parser (the Python
//! Prometheus client's OpenMetrics parser, installed by `.ci/run`): the listed series exist
//! and move after a create, a status report, an autonomous write and a disconnect.

use std::path::{Path, PathBuf};
use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);

/// One sample: name, labels, value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: serde_json::Map<String, Value>,
    value: f64,
}

fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    if venv.is_file() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// Parses an OpenMetrics exposition with `prometheus_client.openmetrics.parser` (strict: a
/// malformed exposition fails the test).
fn parse(text: &str) -> Result<Vec<Sample>, HarnessError> {
    const SCRIPT: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append([s.name, s.labels, s.value])
print(json.dumps(out))
"#;
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
            "the OpenMetrics parser refused the exposition: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let rows: Vec<(String, serde_json::Map<String, Value>, f64)> =
        serde_json::from_slice(&out.stdout)?;
    Ok(rows
        .into_iter()
        .map(|(name, labels, value)| Sample {
            name,
            labels,
            value,
        })
        .collect())
}

async fn scrape_text(port: u16) -> Result<String, HarnessError> {
    http_get(port, "/metrics").await
}

async fn scrape(port: u16) -> Result<Vec<Sample>, HarnessError> {
    parse(&scrape_text(port).await?)
}

/// Every sample name an exposition can carry, from its `# TYPE` lines (families without
/// samples yet included): counters `_total`, histograms `_bucket`/`_count`/`_sum`.
fn exposed_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        if (f.next(), f.next()) != (Some("#"), Some("TYPE")) {
            continue;
        }
        let (Some(name), Some(ty)) = (f.next(), f.next()) else {
            continue;
        };
        match ty {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_count", "_sum"] {
                    out.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                out.insert(name.to_owned());
            }
        }
    }
    out
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
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<&Sample> = samples
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
        let samples = scrape(port).await.ok()?;
        value(&samples, name, labels).filter(|v| ok(*v)).map(|_| ())
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
        // Upstream's families are all present, even at zero.
        for name in [
            "principal_applications_created_total",
            "principal_app_projects_deleted_total",
            "principal_repositories_updated_total",
            "argocd_principal_event_writer_events_discarded_total",
            "argocd_principal_hub_write_errors_total",
            "argocd_principal_queue_depth",
            "argocd_principal_event_resends_total",
        ] {
            assert!(value(&ps, name, &[]).is_some(), "{name} missing");
        }
        for name in [
            "argocd_agent_auth_failures_total",
            "argocd_agent_event_writer_events_discarded_total",
            "argocd_agent_connection_start_timestamp_seconds",
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
            "principal_events_sent_total",
            &[("agent", MANAGED), ("type", "spec-update")],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "agent received it",
            m,
            "agent_events_received_total",
            &[("type", "spec-update")],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "agent applied it",
            m,
            "agent_event_processing_time_count",
            &[("resource_type", "Application"), ("status", "success")],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "propagation latency observed",
            m,
            "agent_event_propagation_latency_seconds_count",
            &[("resource_type", "Application")],
            |v| v >= 1.0,
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
            "principal_events_received_total",
            &[("agent", MANAGED), ("type", "status-update")],
            |v| v >= 1.0,
        )
        .await?;
        until(
            "principal processed it",
            p,
            "principal_event_processing_time_count",
            &[
                ("agent_name", MANAGED),
                ("resource_type", "Application"),
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
            "principal_applications_created_total",
            &[],
            |v| v >= 1.0,
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

        // Every metric the shipped alerts and dashboard use is one the binaries export.
        let mut exported = exposed_names(&scrape_text(p).await?);
        exported.extend(exposed_names(&scrape_text(m).await?));
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
fn the_parser_refuses_a_malformed_exposition() {
    assert!(parse("# TYPE x counter\nx_total{a=\"b\" 1\n# EOF\n").is_err());
    let ok = parse("# TYPE x counter\nx_total{a=\"b\"} 2\n# EOF\n").unwrap();
    assert_eq!(value(&ok, "x_total", &[("a", "b")]), Some(2.0));
}
