//! The Prometheus text exposition format 0.0.4 that `/metrics` serves, made from the
//! OpenMetrics text of a `prometheus-client` registry.
//!
//! Upstream argocd-agent serves `/metrics` with Go's `promhttp.Handler()`, which never
//! negotiates OpenMetrics: a Prometheus server scraping it stores each counter under the
//! name it was registered with (`principal_events_received`, not `…_total`). The
//! `prometheus-client` crate writes OpenMetrics only, where every counter sample ends in
//! `_total`. So both binaries register every metric under the name it is exposed with (an
//! upstream counter without `_total` keeps none, ours carry it) and `/metrics` rewrites the
//! registry's OpenMetrics into text 0.0.4, where a counter's sample is named after its
//! family, as Go's encoder writes it.
//!
//! The rules of the rewrite:
//! - a counter `N` sampled as `N_total` is written `N`; `_created` samples are dropped
//!   (text 0.0.4 has none);
//! - histograms and summaries keep `_bucket`, `_sum`, `_count` and quantile samples;
//! - `info` families become gauges named `N_info`, state sets gauges, `unknown` `untyped`;
//!   gauge histograms keep their samples without metadata (text 0.0.4 has no such type);
//! - exemplars and `# UNIT` lines are dropped, timestamps go from seconds to milliseconds;
//! - numbers, and the `le` and `quantile` label values, are written the way Go's
//!   `expfmt` writes them (`1`, `0.005`, `1e+06`), so the stored `le` values match upstream's.

use argocd_agent_identity::text::quoted;
use std::fmt::Write as _;

/// The content type of `/metrics`: text exposition format 0.0.4, as upstream serves.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Go `client_golang`'s `prometheus.DefBuckets`: the buckets of upstream's histograms, so
/// their `le` series are upstream's.
pub const GO_DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Labels of `argocd_agent_build_info`, as upstream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct BuildLabels {
    version: String,
    git_revision: String,
}

/// The commit the running binary was built from, as the binary recorded it at build time
/// ([`set_git_revision`]); `unknown` (upstream's value when its build sets none) until then.
static GIT_REVISION: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Records the commit the binary was built from, once, before its metrics are registered
/// (the binary's build script knows it; this crate's does not). Later calls are ignored.
pub fn set_git_revision(revision: &'static str) {
    let _ = GIT_REVISION.set(revision);
}

/// The revision `argocd_agent_build_info` reports: what [`set_git_revision`] recorded, else
/// `unknown`.
pub fn git_revision() -> &'static str {
    GIT_REVISION.get().copied().unwrap_or("unknown")
}

/// Registers upstream's `argocd_agent_build_info{version,git_revision}` gauge (always 1), which
/// both upstream binaries export.
pub fn register_build_info(r: &mut prometheus_client::registry::Registry) {
    let family = prometheus_client::metrics::family::Family::<
        BuildLabels,
        prometheus_client::metrics::gauge::Gauge,
    >::default();
    family
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            git_revision: git_revision().to_owned(),
        })
        .set(1);
    r.register(
        "argocd_agent_build_info",
        "Build metadata for the running argocd-agent binary",
        family,
    );
}

/// Why an OpenMetrics text could not be rewritten.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("OpenMetrics line {line}: {what}")]
pub struct ExpositionError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub what: LineProblem,
}

/// What is wrong with one line of an OpenMetrics text ([`ExpositionError::what`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum LineProblem {
    /// A line after `# EOF`.
    #[error("content after # EOF")]
    AfterEof,
    /// The text does not end in `# EOF`.
    #[error("no # EOF")]
    NoEof,
    /// A `# ` line that is not HELP, TYPE or UNIT of a valid name.
    #[error("not a metadata line: {}", quoted(.0))]
    NotMetadata(String),
    /// A sample before any `# ` line.
    #[error("sample before any family: {}", quoted(.0))]
    NoFamily(String),
    /// A sample line without a value.
    #[error("no value: {}", quoted(.0))]
    NoValue(String),
    /// A sample whose metric name is invalid.
    #[error("bad metric name: {}", quoted(.0))]
    BadName(String),
    /// A sample whose labels do not parse.
    #[error("bad labels: {}", quoted(.0))]
    BadLabels(String),
    /// A sample whose value (and timestamp) do not parse.
    #[error("bad value: {}", quoted(.0))]
    BadValue(String),
    /// A number that does not parse.
    #[error("not a number: {}", quoted(.0))]
    NotNumber(String),
    /// A sample not named after its family.
    #[error("sample {sample} outside family {family}")]
    OutsideFamily {
        /// The sample's name.
        sample: String,
        /// The family's name.
        family: String,
    },
    /// A sample whose suffix its family's type does not have.
    #[error("sample {sample} in {kind} family {family}")]
    WrongSuffix {
        /// The sample's name.
        sample: String,
        /// The family's type.
        kind: String,
        /// The family's name.
        family: String,
    },
}

/// One family being rewritten: its metadata and rewritten sample lines.
struct Family {
    name: String,
    help: Option<String>,
    kind: String,
    samples: Vec<String>,
}

impl Family {
    fn new(name: &str) -> Family {
        Family {
            name: name.to_owned(),
            help: None,
            kind: "unknown".to_owned(),
            samples: Vec::new(),
        }
    }

    /// The text 0.0.4 name and type of the family, if it can carry metadata there.
    fn text_metadata(&self) -> Option<(String, &'static str)> {
        let n = self.name.clone();
        match self.kind.as_str() {
            "counter" => Some((n, "counter")),
            "gauge" => Some((n, "gauge")),
            "histogram" => Some((n, "histogram")),
            "summary" => Some((n, "summary")),
            "stateset" => Some((n, "gauge")),
            "info" => Some((format!("{n}_info"), "gauge")),
            "unknown" => Some((n, "untyped")),
            _ => None,
        }
    }

    fn write(&self, out: &mut String) {
        if let Some((name, ty)) = self.text_metadata() {
            if let Some(help) = &self.help {
                let _ = writeln!(out, "# HELP {name} {help}");
            }
            let _ = writeln!(out, "# TYPE {name} {ty}");
        }
        for s in &self.samples {
            out.push_str(s);
            out.push('\n');
        }
    }

    /// The text 0.0.4 name of the sample `sample` of this family; `None` to drop it.
    fn sample_name(&self, sample: &str) -> Result<Option<String>, LineProblem> {
        let suffix =
            sample
                .strip_prefix(self.name.as_str())
                .ok_or_else(|| LineProblem::OutsideFamily {
                    sample: sample.to_owned(),
                    family: self.name.clone(),
                })?;
        let allowed: &[&str] = match self.kind.as_str() {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            "summary" => &["", "_sum", "_count", "_created"],
            "gaugehistogram" => &["_bucket", "_gsum", "_gcount"],
            "info" => &["_info"],
            _ => &[""],
        };
        if !allowed.contains(&suffix) {
            return Err(LineProblem::WrongSuffix {
                sample: sample.to_owned(),
                kind: self.kind.clone(),
                family: self.name.clone(),
            });
        }
        Ok(match (self.kind.as_str(), suffix) {
            (_, "_created") => None,
            ("counter", _) => Some(self.name.clone()),
            _ => Some(sample.to_owned()),
        })
    }
}

/// Rewrites the OpenMetrics text `om` (ending in `# EOF`) into text exposition 0.0.4.
pub fn openmetrics_to_text(om: &str) -> Result<String, ExpositionError> {
    let mut out = String::with_capacity(om.len());
    let mut family: Option<Family> = None;
    let mut eof = false;
    for (i, line) in om.lines().enumerate() {
        let err = |what: LineProblem| ExpositionError { line: i + 1, what };
        if eof {
            return Err(err(LineProblem::AfterEof));
        }
        if line == "# EOF" {
            eof = true;
            continue;
        }
        if let Some(meta) = line.strip_prefix("# ") {
            let (keyword, rest) = meta.split_once(' ').unwrap_or((meta, ""));
            let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
            if !matches!(keyword, "HELP" | "TYPE" | "UNIT") || !valid_name(name) {
                return Err(err(LineProblem::NotMetadata(line.to_owned())));
            }
            if family.as_ref().is_none_or(|f| f.name != name) {
                if let Some(f) = family.take() {
                    f.write(&mut out);
                }
                family = Some(Family::new(name));
            }
            let f = family.as_mut().expect("set above");
            match keyword {
                "HELP" => f.help = Some(help_text(value)),
                "TYPE" => f.kind = value.to_owned(),
                _ => {}
            }
            continue;
        }
        let sample = parse_sample(line).map_err(err)?;
        let f = family
            .as_mut()
            .ok_or_else(|| err(LineProblem::NoFamily(line.to_owned())))?;
        if let Some(name) = f.sample_name(sample.name).map_err(err)? {
            f.samples.push(sample.to_text(&name).map_err(err)?);
        }
    }
    if !eof {
        return Err(ExpositionError {
            line: om.lines().count(),
            what: LineProblem::NoEof,
        });
    }
    if let Some(f) = family {
        f.write(&mut out);
    }
    Ok(out)
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// OpenMetrics escapes `"` in HELP, text 0.0.4 does not (it escapes `\` and newlines only).
fn help_text(om: &str) -> String {
    om.replace("\\\"", "\"")
}

/// One OpenMetrics sample line, split.
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(&'a str, &'a str)>,
    value: &'a str,
    timestamp: Option<&'a str>,
}

fn parse_sample(line: &str) -> Result<Sample<'_>, LineProblem> {
    let end = line
        .find(['{', ' '])
        .ok_or_else(|| LineProblem::NoValue(line.to_owned()))?;
    let name = &line[..end];
    if !valid_name(name) {
        return Err(LineProblem::BadName(line.to_owned()));
    }
    let (labels, rest) = if line[end..].starts_with('{') {
        parse_labels(&line[end + 1..]).ok_or_else(|| LineProblem::BadLabels(line.to_owned()))?
    } else {
        (Vec::new(), &line[end..])
    };
    let rest = rest
        .strip_prefix(' ')
        .ok_or_else(|| LineProblem::NoValue(line.to_owned()))?;
    // An exemplar follows ` # `; text 0.0.4 has none.
    let rest = rest.split_once(" # ").map_or(rest, |(r, _)| r);
    let mut fields = rest.split(' ');
    let value = fields.next().unwrap_or_default();
    let timestamp = fields.next();
    if fields.next().is_some() || value.is_empty() {
        return Err(LineProblem::BadValue(line.to_owned()));
    }
    Ok(Sample {
        name,
        labels,
        value,
        timestamp,
    })
}

/// Labels after `{`, as escaped in the text, and what follows `}`.
fn parse_labels(s: &str) -> Option<(Vec<(&str, &str)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = s;
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (name, after) = rest.split_once("=\"")?;
        if !valid_name(name) || name.contains(':') {
            return None;
        }
        let bytes = after.as_bytes();
        let mut i = 0;
        while i < bytes.len() && bytes[i] != b'"' {
            i += if bytes[i] == b'\\' { 2 } else { 1 };
        }
        if i >= bytes.len() {
            return None;
        }
        labels.push((name, &after[..i]));
        rest = &after[i + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

impl Sample<'_> {
    fn to_text(&self, name: &str) -> Result<String, LineProblem> {
        let mut out = name.to_owned();
        if !self.labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in self.labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let v = if matches!(*k, "le" | "quantile") {
                    go_float(parse_number(v)?)
                } else {
                    (*v).to_owned()
                };
                let _ = write!(out, "{k}=\"{v}\"");
            }
            out.push('}');
        }
        let _ = write!(out, " {}", go_float(parse_number(self.value)?));
        if let Some(ts) = self.timestamp {
            let ms = (parse_number(ts)? * 1000.0).round();
            let _ = write!(out, " {ms}");
        }
        Ok(out)
    }
}

fn parse_number(s: &str) -> Result<f64, LineProblem> {
    match s {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|_| LineProblem::NotNumber(s.to_owned())),
    }
}

/// `v` as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it (what `expfmt` uses for
/// values and `le`/`quantile` labels): the shortest digits that read back as `v`, in
/// exponent form (`1e+06`) when the decimal exponent is below -4 or at least 6.
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return "0".into();
    }
    // Rust's `{:e}` is the shortest round-trip form, e.g. `1.5e-5`, `1e6`.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        // Rust's `{}` never uses an exponent and is the shortest round-trip form too.
        return format!("{v}");
    }
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_as_go_writes_them() {
        for (v, go) in [
            (1.0, "1"),
            (0.0, "0"),
            (0.005, "0.005"),
            (2.5, "2.5"),
            (10.0, "10"),
            (123456.0, "123456"),
            (1e6, "1e+06"),
            (1234567.0, "1.234567e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-1.5e-7, "-1.5e-07"),
            (1e21, "1e+21"),
            (1e100, "1e+100"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(go_float(v), go, "{v}");
        }
    }

    #[test]
    fn counters_are_named_after_their_family_and_lose_created() {
        let om = "# HELP principal_events_received Events received.\n\
                  # TYPE principal_events_received counter\n\
                  principal_events_received_total 5\n\
                  principal_events_received_created 1700000000.5\n\
                  # HELP argocd_principal_agent_connections_total Sessions.\n\
                  # TYPE argocd_principal_agent_connections_total counter\n\
                  argocd_principal_agent_connections_total_total{agent_name=\"a\"} 2\n\
                  # EOF\n";
        assert_eq!(
            openmetrics_to_text(om).unwrap(),
            "# HELP principal_events_received Events received.\n\
             # TYPE principal_events_received counter\n\
             principal_events_received 5\n\
             # HELP argocd_principal_agent_connections_total Sessions.\n\
             # TYPE argocd_principal_agent_connections_total counter\n\
             argocd_principal_agent_connections_total{agent_name=\"a\"} 2\n"
        );
    }

    #[test]
    fn histograms_keep_their_samples_with_go_le_values() {
        let om = "# HELP t Time.\n# TYPE t histogram\n\
                  t_sum{s=\"ok\"} 0.5\nt_count{s=\"ok\"} 2\n\
                  t_bucket{s=\"ok\",le=\"0.005\"} 0\nt_bucket{s=\"ok\",le=\"1.0\"} 1\n\
                  t_bucket{s=\"ok\",le=\"10.0\"} 2\nt_bucket{s=\"ok\",le=\"+Inf\"} 2\n# EOF\n";
        assert_eq!(
            openmetrics_to_text(om).unwrap(),
            "# HELP t Time.\n# TYPE t histogram\n\
             t_sum{s=\"ok\"} 0.5\nt_count{s=\"ok\"} 2\n\
             t_bucket{s=\"ok\",le=\"0.005\"} 0\nt_bucket{s=\"ok\",le=\"1\"} 1\n\
             t_bucket{s=\"ok\",le=\"10\"} 2\nt_bucket{s=\"ok\",le=\"+Inf\"} 2\n"
        );
    }

    #[test]
    fn gauges_summaries_info_and_unknown_map_to_text_types() {
        let om = "# HELP g A gauge.\n# TYPE g gauge\ng{a=\"x\"} -1.5\n\
                  # TYPE s summary\ns{quantile=\"0.50\"} 3\ns_sum 7\ns_count 2\ns_created 1\n\
                  # HELP b Build.\n# TYPE b info\nb_info{version=\"1\"} 1\n\
                  # TYPE u unknown\nu 1e6\n\
                  # TYPE gh gaugehistogram\ngh_bucket{le=\"+Inf\"} 1\ngh_gcount 1\ngh_gsum 2\n\
                  # EOF\n";
        assert_eq!(
            openmetrics_to_text(om).unwrap(),
            "# HELP g A gauge.\n# TYPE g gauge\ng{a=\"x\"} -1.5\n\
             # TYPE s summary\ns{quantile=\"0.5\"} 3\ns_sum 7\ns_count 2\n\
             # HELP b_info Build.\n# TYPE b_info gauge\nb_info{version=\"1\"} 1\n\
             # TYPE u untyped\nu 1e+06\n\
             gh_bucket{le=\"+Inf\"} 1\ngh_gcount 1\ngh_gsum 2\n"
        );
    }

    #[test]
    fn escapes_exemplars_units_and_timestamps() {
        let om = "# HELP c Say \\\"hi\\\" \\\\ there.\n# TYPE c counter\n# UNIT c seconds\n\
                  c_total{path=\"a\\\"} b{,\\\\\",x=\"#\"} 1 # {trace_id=\"x\"} 1.0 5\n\
                  c_total{path=\"z\"} 2 1700000000.25\n# EOF\n";
        assert_eq!(
            openmetrics_to_text(om).unwrap(),
            "# HELP c Say \"hi\" \\\\ there.\n# TYPE c counter\n\
             c{path=\"a\\\"} b{,\\\\\",x=\"#\"} 1\n\
             c{path=\"z\"} 2 1700000000250\n"
        );
    }

    #[test]
    fn malformed_input_is_refused_with_its_line() {
        for (om, line) in [
            ("# TYPE c counter\nc_total 1\n", 2),
            ("# TYPE c counter\nc_total 1\n# EOF\nc_total 2\n", 4),
            ("# TYPE c counter\nc_total{a=\"1\" 1\n# EOF\n", 2),
            ("# TYPE c counter\nc_total{a=\"1} 1\n# EOF\n", 2),
            ("# TYPE c counter\nc_total one\n# EOF\n", 2),
            ("# TYPE c counter\nc 1\n# EOF\n", 2),
            ("# TYPE c counter\nd_total 1\n# EOF\n", 2),
            ("c_total 1\n# EOF\n", 1),
            ("# TYPE c histogram\nc_total 1\n# EOF\n", 2),
            ("# comment\n# EOF\n", 1),
            ("# TYPE c counter\nc_total 1 2 3\n# EOF\n", 2),
            ("# TYPE c counter\nc_total{9a=\"1\"} 1\n# EOF\n", 2),
        ] {
            let e = openmetrics_to_text(om).unwrap_err();
            assert_eq!(e.line, line, "{om:?}: {e}");
        }
    }

    #[test]
    fn a_prometheus_client_registry_comes_out_as_upstream_names() {
        use prometheus_client::metrics::{counter::Counter, gauge::Gauge, histogram::Histogram};
        let mut r = prometheus_client::registry::Registry::default();
        let c: Counter = Counter::default();
        c.inc_by(3);
        r.register("agent_events_sent", "Sent", c);
        r.register(
            "argocd_agent_connections_total",
            "Conns",
            Counter::<u64>::default(),
        );
        let g: Gauge = Gauge::default();
        g.set(1);
        r.register("argocd_agent_connection_status", "Up", g);
        let h = Histogram::new([0.005, 1.0, 2.5]);
        h.observe(0.5);
        r.register("agent_event_processing_time", "Time", h);
        register_build_info(&mut r);
        let mut om = String::new();
        prometheus_client::encoding::text::encode(&mut om, &r).unwrap();
        let text = openmetrics_to_text(&om).unwrap();
        for line in [
            "# TYPE agent_events_sent counter",
            "agent_events_sent 3",
            "# TYPE argocd_agent_connections_total counter",
            "argocd_agent_connections_total 0",
            "argocd_agent_connection_status 1",
            "agent_event_processing_time_bucket{le=\"1\"} 1",
            "agent_event_processing_time_bucket{le=\"2.5\"} 1",
            "agent_event_processing_time_count 1",
            "# TYPE argocd_agent_build_info gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        let version = format!(
            "argocd_agent_build_info{{version=\"{}\",git_revision=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            git_revision()
        );
        assert!(text.lines().any(|l| l == version), "{version} in\n{text}");
        assert!(
            !text.contains("_total_total") && !text.contains("# EOF"),
            "{text}"
        );
    }
}
