//! Logging setup shared by both binaries: `RUST_LOG`-style filter, text or JSON, plus the
//! OpenTelemetry span layer when tracing is configured ([`crate::telemetry`]).

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Installs the global tracing subscriber. `json` selects JSON lines (for log collectors).
pub fn init(level: &str, json: bool) {
    init_with_telemetry(level, json, None);
}

/// [`init`], exporting spans through `telemetry` when given. The log filter applies to the
/// log output only; which spans are exported is decided by [`crate::telemetry::layer`].
pub fn init_with_telemetry(
    level: &str,
    json: bool,
    telemetry: Option<&crate::telemetry::Telemetry>,
) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let fmt = if json {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(telemetry.map(crate::telemetry::layer))
        .try_init();
}
