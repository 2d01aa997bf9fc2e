//! OpenTelemetry tracing for both binaries: an OTLP/gRPC span exporter behind a bounded
//! batch processor, fed by a `tracing-opentelemetry` layer (see `docs/observability.md`).
//!
//! Off unless `--otlp-address` or `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set: then no layer is installed, spans carry no
//! OpenTelemetry context and events no `traceparent`.
//!
//! Export never blocks the sync path: ended spans go into the batch processor's bounded
//! queue (`OTEL_BSP_MAX_QUEUE_SIZE`, default 2048) and are dropped when it is full; a
//! background thread exports them. Spans lost either way are counted
//! ([`SpanCounts`], exported on `/metrics` as
//! `<binary>_trace_spans_total{outcome}`) and logged when export starts failing, when it
//! recovers, and at shutdown.

use argocd_agent_identity::text::quoted;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, Span, SpanData, SpanExporter,
    SpanProcessor,
};

/// Default per-export timeout (`OTEL_EXPORTER_OTLP_TIMEOUT` overrides it).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long shutdown waits for the last spans to be exported.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// Default export queue size (`OTEL_BSP_MAX_QUEUE_SIZE` overrides it), as the SDK's.
const MAX_QUEUE: u64 = 2048;

/// Tracing settings from the command line.
#[derive(Debug, Clone, Default)]
pub struct OtlpOptions {
    /// `--otlp-address`: the collector's OTLP/gRPC endpoint.
    pub address: Option<String>,
    /// `--otlp-insecure`: plaintext gRPC instead of TLS.
    pub insecure: bool,
    /// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` sets it.
    pub default_service_name: &'static str,
}

/// Where and how to export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The collector's URL (`http://` or `https://`, host and port).
    pub url: String,
    /// Whether the export runs over TLS (verified against the system roots).
    pub tls: bool,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Why the OTLP endpoint given is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointError {
    /// `--otlp-address http://...` without `--otlp-insecure`.
    #[error("--otlp-address {} is plaintext: add --otlp-insecure, or use https://", quoted(.0))]
    Plaintext(String),
    /// A scheme other than http or https.
    #[error("OTLP endpoint {}: unsupported scheme {} (http or https)", quoted(.raw), quoted(.other))]
    Scheme {
        /// The endpoint as given.
        raw: String,
        /// Its scheme.
        other: String,
    },
    /// An endpoint with nothing after the scheme.
    #[error("OTLP endpoint {} names no host", quoted(.0))]
    NoHost(String),
}

/// Why trace export cannot be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The endpoint is unusable.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The exporter cannot be built.
    #[error("OTLP exporter for {url}: {cause}")]
    Exporter {
        /// The endpoint's URL.
        url: String,
        /// Why.
        cause: opentelemetry_otlp::ExporterBuildError,
    },
}

/// Resolves the endpoint: the flag first, then the standard environment variables. With
/// the flag, `--otlp-insecure` selects plaintext (an `http://` address requires it);
/// from the environment, the scheme decides (`http://` plaintext, `https://` TLS) and a
/// scheme-less address uses TLS unless `--otlp-insecure` or `OTEL_EXPORTER_OTLP_INSECURE=true`.
pub fn resolve_endpoint(
    opts: &OtlpOptions,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<Endpoint>, EndpointError> {
    let (raw, from_flag) = match &opts.address {
        Some(a) if !a.trim().is_empty() => (a.trim().to_owned(), true),
        _ => match env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
        {
            Some(a) => (a.trim().to_owned(), false),
            None => return Ok(None),
        },
    };
    let env_insecure = env("OTEL_EXPORTER_OTLP_INSECURE").is_some_and(|v| v == "true");
    let (scheme, rest) = match raw.split_once("://") {
        Some((s, r)) => (Some(s.to_ascii_lowercase()), r.to_owned()),
        None => (None, raw.clone()),
    };
    let tls = match scheme.as_deref() {
        Some("http") if from_flag && !opts.insecure => {
            return Err(EndpointError::Plaintext(raw));
        }
        Some("http") => false,
        Some("https") => !opts.insecure,
        None => !(opts.insecure || (!from_flag && env_insecure)),
        Some(other) => {
            return Err(EndpointError::Scheme {
                other: other.to_owned(),
                raw,
            });
        }
    };
    if rest.is_empty() {
        return Err(EndpointError::NoHost(raw));
    }
    let url = format!("{}://{rest}", if tls { "https" } else { "http" });
    Ok(Some(Endpoint { url, tls }))
}

/// Whether the last export failed (to log the change, not every failure).
static FAILING: AtomicBool = AtomicBool::new(false);

/// Counts what the exporter delivers and loses; logs when export starts and stops failing.
#[derive(Debug)]
struct CountingExporter<E> {
    inner: E,
    counts: &'static SpanCounts,
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let n = batch.len() as u64;
        let counts = self.counts;
        let fut = self.inner.export(batch);
        async move {
            let result = fut.await;
            match &result {
                Ok(()) => {
                    counts.exported.fetch_add(n, Ordering::Relaxed);
                    if FAILING.swap(false, Ordering::Relaxed) {
                        tracing::info!(
                            failed_spans = counts.failed.load(Ordering::Relaxed),
                            "span export recovered"
                        );
                    }
                }
                Err(e) => {
                    let failed = counts.failed.fetch_add(n, Ordering::Relaxed) + n;
                    if !FAILING.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %e, failed_spans = failed,
                            "span export failing: spans are dropped until the collector is reachable");
                    } else {
                        tracing::debug!(error = %e, failed_spans = failed, "span export failed");
                    }
                }
            }
            result
        }
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Counts ended spans in front of the batch processor, and drops (counting them) those that
/// would not fit its queue: the SDK drops silently, so the bound is kept here. Its own queue is
/// never smaller than what is admitted (spans in an export in progress are counted as queued
/// here but have left its queue).
#[derive(Debug)]
struct CountingProcessor {
    inner: BatchSpanProcessor,
    counts: &'static SpanCounts,
    max_queue: u64,
}

impl SpanProcessor for CountingProcessor {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.counts.queued() >= self.max_queue {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.counts.ended.fetch_add(1, Ordering::Relaxed);
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The running tracer provider; [`Telemetry::shutdown`] flushes it.
pub struct Telemetry {
    provider: SdkTracerProvider,
    /// What became of the spans exported through this provider.
    pub counts: &'static SpanCounts,
}

impl Telemetry {
    /// Flushes queued spans (bounded by a timeout) and stops the exporter.
    pub async fn shutdown(self) {
        let Telemetry { provider, counts } = self;
        // The batch processor's flush blocks its caller; keep it off the async workers.
        let result =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT))
                .await;
        let ended = counts.ended.load(Ordering::Relaxed);
        let exported = counts.exported.load(Ordering::Relaxed);
        let failed = counts.failed.load(Ordering::Relaxed);
        let dropped = counts.dropped.load(Ordering::Relaxed);
        if failed > 0 || dropped > 0 {
            tracing::warn!(
                ended,
                exported,
                failed,
                dropped,
                "tracing stopped; some spans were not exported"
            );
        } else {
            tracing::debug!(ended, exported, "tracing stopped");
        }
        if let Ok(Err(e)) = result {
            tracing::debug!(error = %e, "tracer provider shutdown");
        }
    }
}

fn resource(default_service_name: &str) -> Resource {
    let named = env("OTEL_SERVICE_NAME").is_some()
        || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',')
                .any(|kv| kv.trim_start().starts_with("service.name="))
        });
    // `Resource::builder` reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES itself.
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder
            .with_service_name(default_service_name.to_owned())
            .build()
    }
}

/// Builds the exporter and provider when an endpoint is configured. Must run inside the
/// tokio runtime (the gRPC channel is created there, connecting lazily). The sampler comes
/// from `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (default: parent-based,
/// always on), the batch settings from `OTEL_BSP_*`.
pub fn init_provider(opts: &OtlpOptions) -> Result<Option<Telemetry>, TelemetryError> {
    let Some(endpoint) = resolve_endpoint(opts, env)? else {
        return Ok(None);
    };
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.url.clone());
    if env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT").is_none()
        && env("OTEL_EXPORTER_OTLP_TIMEOUT").is_none()
    {
        builder = builder.with_timeout(EXPORT_TIMEOUT);
    }
    if endpoint.tls {
        builder = builder.with_tls_config(
            opentelemetry_otlp::tonic_types::transport::ClientTlsConfig::new().with_native_roots(),
        );
    }
    let exporter = builder.build().map_err(|cause| TelemetryError::Exporter {
        url: endpoint.url.clone(),
        cause,
    })?;
    let counts = span_counts();
    let max_queue = env("OTEL_BSP_MAX_QUEUE_SIZE")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(MAX_QUEUE);
    let processor = CountingProcessor {
        inner: BatchSpanProcessor::builder(CountingExporter {
            inner: exporter,
            counts,
        })
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(usize::try_from(max_queue).unwrap_or(usize::MAX))
                .build(),
        )
        .build(),
        counts,
        max_queue,
    };
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource(opts.default_service_name))
        .build();
    Ok(Some(Telemetry { provider, counts }))
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of `telemetry`'s provider.
/// Only this project's spans and events at `INFO` and above are exported, whatever the log
/// level: never those of the exporter's own stack (gRPC, HTTP/2), so exporting never
/// produces spans to export.
pub fn layer<S>(telemetry: &Telemetry) -> impl tracing_subscriber::Layer<S> + 'static
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    let tracer = telemetry.provider.tracer("argocd-agent");
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            let t = meta.target();
            *meta.level() <= tracing::Level::INFO
                && t.starts_with("argocd_agent")
                && !t.starts_with("argocd_agent_cli::telemetry")
        }))
}

/// What happened to the spans this process produced: handed to the exporter's queue, accepted
/// by the collector, lost in a failed export, or dropped because the queue was full. One set
/// per process, like the global tracer provider; all zero while tracing is off.
#[derive(Debug)]
pub struct SpanCounts {
    /// Spans ended and queued for export.
    pub ended: AtomicU64,
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    /// Spans in batches whose export failed (collector unreachable, timeout, refused).
    pub failed: AtomicU64,
    /// Spans dropped before export because the queue was full.
    pub dropped: AtomicU64,
}

impl SpanCounts {
    const fn new() -> SpanCounts {
        SpanCounts {
            ended: AtomicU64::new(0),
            exported: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Spans queued and not yet exported or failed.
    pub fn queued(&self) -> u64 {
        self.ended
            .load(Ordering::Relaxed)
            .saturating_sub(self.exported.load(Ordering::Relaxed))
            .saturating_sub(self.failed.load(Ordering::Relaxed))
    }
}

static SPAN_COUNTS: SpanCounts = SpanCounts::new();

/// This process's span counters (see [`SpanCounts`]).
pub fn span_counts() -> &'static SpanCounts {
    &SPAN_COUNTS
}

/// Exports [`span_counts`] as `<prefix>_trace_spans_total{outcome}` (outcome `exported`,
/// `failed`, `dropped`) and `<prefix>_trace_spans_queued`. Register it with
/// `Registry::register_collector`.
#[derive(Debug)]
pub struct SpanCollector {
    /// Metric name prefix, e.g. `argocd_principal`.
    pub prefix: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

impl prometheus_client::collector::Collector for SpanCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        use prometheus_client::metrics::{MetricType, TypedMetric};
        let c = span_counts();
        // Registered under its exposed name: /metrics names a counter after its family.
        let name = format!("{}_trace_spans_total", self.prefix);
        let mut family = encoder.encode_descriptor(
            &name,
            "Trace spans by what became of them: exported to the OTLP collector, lost in a failed export, dropped because the export queue was full",
            None,
            MetricType::Counter,
        )?;
        for (outcome, n) in [
            ("exported", &c.exported),
            ("failed", &c.failed),
            ("dropped", &c.dropped),
        ] {
            let labels = OutcomeLabels { outcome };
            let metric = family.encode_family(&labels)?;
            ConstCounter::new(n.load(Ordering::Relaxed)).encode(metric)?;
        }
        let queued = ConstGauge::new(i64::try_from(c.queued()).unwrap_or(i64::MAX));
        let queued_name = format!("{}_trace_spans_queued", self.prefix);
        let metric = encoder.encode_descriptor(
            &queued_name,
            "Trace spans waiting in the export queue",
            None,
            <ConstGauge as TypedMetric>::TYPE,
        )?;
        queued.encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(address: Option<&str>, insecure: bool) -> OtlpOptions {
        OtlpOptions {
            address: address.map(str::to_owned),
            insecure,
            default_service_name: "svc",
        }
    }

    fn ep(url: &str, tls: bool) -> Option<Endpoint> {
        Some(Endpoint {
            url: url.into(),
            tls,
        })
    }

    #[test]
    fn nothing_configured_means_no_exporter() {
        assert_eq!(resolve_endpoint(&opts(None, false), |_| None), Ok(None));
        assert_eq!(resolve_endpoint(&opts(Some(" "), true), |_| None), Ok(None));
    }

    #[test]
    fn flag_address_uses_tls_unless_insecure() {
        let none = |_: &str| None;
        assert_eq!(
            resolve_endpoint(&opts(Some("http://c:4317"), true), none),
            Ok(ep("http://c:4317", false))
        );
        assert_eq!(
            resolve_endpoint(&opts(Some("c:4317"), false), none),
            Ok(ep("https://c:4317", true))
        );
        assert_eq!(
            resolve_endpoint(&opts(Some("c:4317"), true), none),
            Ok(ep("http://c:4317", false))
        );
        assert!(resolve_endpoint(&opts(Some("http://c:4317"), false), none).is_err());
        assert!(resolve_endpoint(&opts(Some("ftp://c"), true), none).is_err());
    }

    #[test]
    fn environment_endpoint_follows_its_scheme() {
        let e = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            resolve_endpoint(
                &opts(None, false),
                e(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317")])
            ),
            Ok(ep("http://c:4317", false))
        );
        assert_eq!(
            resolve_endpoint(
                &opts(None, false),
                e(&[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://t:4317")
                ])
            ),
            Ok(ep("https://t:4317", true))
        );
        assert_eq!(
            resolve_endpoint(
                &opts(None, false),
                e(&[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4317"),
                    ("OTEL_EXPORTER_OTLP_INSECURE", "true")
                ])
            ),
            Ok(ep("http://c:4317", false))
        );
        // The flag wins over the environment.
        assert_eq!(
            resolve_endpoint(
                &opts(Some("http://f:1"), true),
                e(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4317")])
            ),
            Ok(ep("http://f:1", false))
        );
    }
}
