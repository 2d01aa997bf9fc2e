//! Logging setup shared by both binaries: `RUST_LOG`-style filter, text or JSON.

use tracing_subscriber::EnvFilter;

/// Installs the global tracing subscriber. `json` selects JSON lines (for log collectors).
pub fn init(level: &str, json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if json {
        let _ = builder.json().try_init();
    } else {
        let _ = builder.try_init();
    }
}
