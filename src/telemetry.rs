//! Logging: one tracing subscriber, human-readable text or JSON lines, filtered by `RUST_LOG`
//! (default `info`). Each request is one span (method, route, path, model, object, status,
//! bytes, duration_ms) closed by one `response` event; see `http::request_span`.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; `format` is `text` or `json` (validated by the config).
pub fn init(format: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only on a terminal: escape codes in a log file or a pipe garble it for readers.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if format == "json" { builder.json().try_init() } else { builder.try_init() };
}
