//! What the service tells operators: one tracing subscriber (human-readable text or JSON lines,
//! filtered by `RUST_LOG`, default `info`, less s3s's own error lines) and the Prometheus
//! recorder behind `/metrics`. Each request is one span (method, route, path, model, object,
//! cache, status, bytes, duration_ms) closed by one `response` event; see `transport::layers`.
//! Every metric name is declared here, with its help text, so the set is visible in one place.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// s3s logs every error an S3 operation returns at ERROR, a wrong access key's 403 and a
/// missing key's 404 included; the endpoint logs its own faults itself, and each request's line
/// has its status, so s3s's operation log is left out whatever `RUST_LOG` says, unless it names
/// s3s itself.
const S3S_OPERATIONS_OFF: &str = "s3s::ops=off";

/// The filter's directives: `RUST_LOG` (`info` when unset), less s3s's operation log unless
/// `RUST_LOG` names s3s.
fn filter_directives(rust_log: Option<&str>) -> String {
    let asked = rust_log.map(str::trim).filter(|s| !s.is_empty()).unwrap_or("info");
    if asked.contains("s3s") { asked.to_owned() } else { format!("{asked},{S3S_OPERATIONS_OFF}") }
}

/// Installs the global subscriber, writing `format`.
pub fn init(format: LogFormat) {
    let rust_log = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    let filter = EnvFilter::try_new(filter_directives(rust_log.as_deref()))
        .unwrap_or_else(|_| EnvFilter::new(filter_directives(None)));
    // Colour only on a terminal: escape codes in a log file or a pipe garble it for readers.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Metric names (Prometheus conventions: base units, `_total` counters).
pub mod names {
    pub const HTTP_REQUESTS: &str = "ztserve_http_requests_total";
    pub const HTTP_RESPONSE_BYTES: &str = "ztserve_http_response_body_bytes_total";
    pub const HTTP_DURATION: &str = "ztserve_http_request_duration_seconds";
    pub const DECODES_STARTED: &str = "ztserve_decodes_started_total";
    pub const DECODED_BYTES: &str = "ztserve_decoded_bytes_total";
    pub const DECODE_FAILURES: &str = "ztserve_decode_failures_total";
    pub const CACHE_HITS: &str = "ztserve_decode_cache_hits_total";
    pub const CACHE_MISSES: &str = "ztserve_decode_cache_misses_total";
    pub const CACHE_BYTES: &str = "ztserve_decode_cache_bytes";
    pub const CACHE_EVICTIONS: &str = "ztserve_decode_cache_evictions_total";
    pub const DIGEST_CHECKS: &str = "ztserve_digest_checks_total";
    pub const DIGEST_FAILURES: &str = "ztserve_digest_failures_total";
    pub const SIGNATURE_CHECKS: &str = "ztserve_signature_checks_total";
    pub const MODEL_SIGNATURES: &str = "ztserve_model_signatures";
    pub const FILE_DIGEST_BYTES: &str = "ztserve_file_digest_bytes_total";
    pub const DIGEST_PENDING_BYTES: &str = "ztserve_file_digest_pending_bytes";
    pub const DIGEST_FILES: &str = "ztserve_file_digest_files";
    pub const DISK_CACHE_HITS: &str = "ztserve_disk_cache_hits_total";
    pub const DISK_CACHE_MISSES: &str = "ztserve_disk_cache_misses_total";
    pub const DISK_CACHE_ORIGIN_BYTES: &str = "ztserve_disk_cache_origin_bytes_total";
    pub const DISK_CACHE_SERVED_BYTES: &str = "ztserve_disk_cache_served_bytes_total";
    pub const DISK_CACHE_EVICTIONS: &str = "ztserve_disk_cache_evictions_total";
    pub const DISK_CACHE_FILL_FAILURES: &str = "ztserve_disk_cache_fill_failures_total";
    pub const DISK_CACHE_DAMAGED: &str = "ztserve_disk_cache_damaged_blocks_total";
    pub const DISK_CACHE_SCRUBBED_BYTES: &str = "ztserve_disk_cache_scrubbed_bytes_total";
    pub const DISK_CACHE_CHECKED_FILLS: &str = "ztserve_disk_cache_checked_fills_total";
    pub const DISK_CACHE_BYTES: &str = "ztserve_disk_cache_bytes";
    pub const MODELS: &str = "ztserve_models";
    pub const STORAGE_READ_DURATION: &str = "ztserve_storage_read_duration_seconds";
    pub const STORAGE_READ_BYTES: &str = "ztserve_storage_read_bytes_total";
    pub const SENDFILE_BYTES: &str = "ztserve_sendfile_bytes_total";
    pub const REGIONS: &str = "ztserve_regions_total";
    pub const DELTAS: &str = "ztserve_deltas_total";
    pub const DELTA_BYTES: &str = "ztserve_delta_bytes_total";
    pub const DELTA_COMPUTE: &str = "ztserve_delta_compute_seconds";
    pub const DELTA_STORE_DAMAGED: &str = "ztserve_delta_store_damaged_total";
    pub const DELTAS_AHEAD: &str = "ztserve_deltas_ahead_total";
    pub const ARTIFACT_BLOBS_DAMAGED: &str = "ztserve_artifact_blobs_damaged_total";
    pub const HTTP_CONNECTIONS: &str = "ztserve_http_connections";
    pub const HTTP_IDLE_TIMEOUTS: &str = "ztserve_http_idle_timeouts_total";
    pub const DECODE_REFUSALS: &str = "ztserve_decode_refusals_total";
    pub const AUTH_FAILURES: &str = "ztserve_auth_failures_total";
    pub const AUTH_TOKENS: &str = "ztserve_auth_tokens";
    pub const AUTH_TOKEN_FILE_RELOADS: &str = "ztserve_auth_token_file_reloads_total";
    pub const AUTH_CLIENT_REQUESTS: &str = "ztserve_auth_client_identity_requests_total";
    pub const TLS_HANDSHAKES: &str = "ztserve_tls_handshakes_total";
    pub const TLS_RELOADS: &str = "ztserve_tls_reloads_total";
}

/// Seconds buckets for request and storage durations: 100 µs to 5 min.
const DURATION_BUCKETS: &[f64] =
    &[0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// The process-wide Prometheus recorder, installed on first use. Every `app` in the process
/// (tests build several) reports into it.
pub fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), DURATION_BUCKETS)
            .expect("buckets are not empty")
            .build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("another metrics recorder is installed; /metrics will stay empty");
        }
        describe();
        register_at_zero();
        handle
    })
}

/// The help text of every metric, by concern.
fn describe() {
    describe_requests();
    describe_digests();
    describe_disk_cache();
    describe_access();
}

/// Requests, connections, decoding and storage reads.
fn describe_requests() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    use names::*;
    describe_counter!(HTTP_REQUESTS, "Requests answered, by route, method and status.");
    describe_counter!(HTTP_RESPONSE_BYTES, Unit::Bytes, "Response body bytes sent, by route.");
    describe_histogram!(HTTP_DURATION, Unit::Seconds, "Time from request to the end of its response body, by route.");
    describe_counter!(DECODES_STARTED, "Decodes of a component started from its first stored byte, by encoding.");
    describe_counter!(DECODED_BYTES, Unit::Bytes, "Decoded bytes produced, by encoding.");
    describe_counter!(DECODE_FAILURES, "Decodes that found a stored component invalid.");
    describe_counter!(CACHE_HITS, "Component reads answered from already decoded bytes.");
    describe_counter!(CACHE_MISSES, "Component reads that needed decoding.");
    describe_gauge!(CACHE_BYTES, Unit::Bytes, "Bytes reserved by decoded components in the cache.");
    describe_counter!(CACHE_EVICTIONS, "Decoded components evicted to make room.");
    describe_gauge!(MODELS, "Models indexed, by status (ok or broken).");
    describe_histogram!(STORAGE_READ_DURATION, Unit::Seconds, "Duration of reads from storage, by backend and kind.");
    describe_gauge!(HTTP_CONNECTIONS, "Client connections open.");
    describe_counter!(
        HTTP_IDLE_TIMEOUTS,
        "Connections closed after idle_timeout_secs without progress (a client that stopped reading)."
    );
    describe_counter!(DECODE_REFUSALS, "Requests answered 503 because every decoder stayed busy for decode_wait_ms.");
    describe_counter!(STORAGE_READ_BYTES, Unit::Bytes, "Bytes read from storage, by backend and purpose.");
    describe_counter!(
        SENDFILE_BYTES,
        Unit::Bytes,
        "Response bytes sent from files with sendfile, never copied through the process."
    );
    describe_counter!(
        REGIONS,
        "Regions answered by POST /models/{m}/regions (each sent with the 4 bytes of its CRC32C)."
    );
    describe_counter!(
        DELTAS,
        "Region deltas answered by POST /models/{m}/deltas, by outcome (kept: read from the store; computed)."
    );
    describe_counter!(
        DELTA_BYTES,
        Unit::Bytes,
        "Delta bytes sent by POST /models/{m}/deltas, CRC32C trailers included."
    );
    describe_histogram!(DELTA_COMPUTE, Unit::Seconds, "Time to compute one region's delta from both versions' bytes.");
    describe_counter!(
        DELTA_STORE_DAMAGED,
        "Kept deltas that failed their CRC32C when read: removed and computed again."
    );
    describe_counter!(
        DELTAS_AHEAD,
        "Region deltas computed in the background after a rescan listed a lineage's new version."
    );
}

/// Digests of stored bytes and published files, and model signatures.
fn describe_digests() {
    use metrics::{Unit, describe_counter, describe_gauge};
    use names::*;
    describe_counter!(DIGEST_CHECKS, "Stored-bytes digest checks completed, by outcome (ok or mismatch).");
    describe_counter!(DIGEST_FAILURES, "Stored-bytes digest checks that found a mismatch.");
    describe_counter!(
        SIGNATURE_CHECKS,
        "Model signature verdicts reached, by outcome (verified, unsigned or failed): one per model version and signed directory version."
    );
    describe_gauge!(
        MODEL_SIGNATURES,
        "Listed models whose source reads signatures, by signature state (verified, unsigned, failed or pending)."
    );
    describe_counter!(
        FILE_DIGEST_BYTES,
        Unit::Bytes,
        "Bytes hashed to compute the SHA-256 of published files (each file version once)."
    );
    describe_gauge!(
        DIGEST_PENDING_BYTES,
        Unit::Bytes,
        "Bytes of published files still to hash before their digests are known."
    );
    describe_gauge!(
        DIGEST_FILES,
        "Published files of the listed models by digest state (queued, hashing, known, failed)."
    );
}

/// The node's disk cache.
fn describe_disk_cache() {
    use metrics::{Unit, describe_counter, describe_gauge};
    use names::*;
    describe_counter!(DISK_CACHE_HITS, "Blocks of remote sources read from the node's disk cache.");
    describe_counter!(DISK_CACHE_MISSES, "Blocks of remote sources fetched from their origin into the disk cache.");
    describe_counter!(
        DISK_CACHE_ORIGIN_BYTES,
        Unit::Bytes,
        "Bytes fetched from remote sources' origins by the disk cache."
    );
    describe_counter!(DISK_CACHE_SERVED_BYTES, Unit::Bytes, "Bytes of blocks read from the disk cache.");
    describe_counter!(DISK_CACHE_EVICTIONS, "Blocks evicted from the disk cache to stay under its bound.");
    describe_counter!(
        DISK_CACHE_FILL_FAILURES,
        "Blocks that could not be kept in the disk cache (a full disk); served all the same."
    );
    describe_counter!(
        DISK_CACHE_DAMAGED,
        "Cached blocks found damaged on disk (CRC-32C) by a read or the scrub, removed and fetched again."
    );
    describe_counter!(DISK_CACHE_SCRUBBED_BYTES, Unit::Bytes, "Bytes of cached blocks the background scrub checked.");
    describe_counter!(
        ARTIFACT_BLOBS_DAMAGED,
        "Artifact blobs that no longer hashed to their name when read (damaged on disk), dropped."
    );
    describe_counter!(
        DISK_CACHE_CHECKED_FILLS,
        "Fills of objects whose digest is known, by outcome (ok, mismatch: nothing kept, failed: the origin failed)."
    );
    describe_gauge!(DISK_CACHE_BYTES, Unit::Bytes, "Bytes held in the disk cache's blocks.");
}

/// Tokens, client certificates and TLS.
fn describe_access() {
    use metrics::{describe_counter, describe_gauge};
    use names::*;
    describe_counter!(
        AUTH_FAILURES,
        "Requests refused for want of a valid bearer token, by reason (missing or invalid)."
    );
    describe_gauge!(AUTH_TOKENS, "Bearer tokens accepted (from the config and the token file).");
    describe_counter!(
        AUTH_TOKEN_FILE_RELOADS,
        "Re-reads of the changed token file, by outcome (ok, or error: its tokens refused)."
    );
    describe_counter!(
        AUTH_CLIENT_REQUESTS,
        "Requests allowed by a client certificate identity listed in auth.client_identities, by identity."
    );
    describe_counter!(
        TLS_HANDSHAKES,
        "TLS handshakes, by outcome (ok; not_tls, client_certificate, refused, io or timeout: closed)."
    );
    describe_counter!(
        TLS_RELOADS,
        "Reloads of the changed TLS certificate and key, by outcome (ok, or error: the old one kept)."
    );
}

/// What storage reads are for, in `ztserve_storage_read_*` labels.
const READ_PURPOSES: &[&str] = &["manifest", "serve", "decode", "verify", "check", "prefetch"];

/// Registers every series whose labels are known in advance at zero, so that `rate()` and
/// alerts see them from the first scrape, not only after the first decode, digest check or
/// refused token. Series keyed by what only requests reveal (a status, a model) appear with
/// their first request.
fn register_at_zero() {
    use metrics::{counter, gauge, histogram};
    use names::*;
    for name in [
        DECODE_FAILURES,
        CACHE_HITS,
        CACHE_MISSES,
        CACHE_EVICTIONS,
        DIGEST_FAILURES,
        DISK_CACHE_HITS,
        DISK_CACHE_MISSES,
        DISK_CACHE_ORIGIN_BYTES,
        DISK_CACHE_SERVED_BYTES,
        DISK_CACHE_EVICTIONS,
        DISK_CACHE_FILL_FAILURES,
        DISK_CACHE_DAMAGED,
        DISK_CACHE_SCRUBBED_BYTES,
        SENDFILE_BYTES,
        REGIONS,
        DELTA_BYTES,
        DELTA_STORE_DAMAGED,
        DELTAS_AHEAD,
        ARTIFACT_BLOBS_DAMAGED,
        HTTP_IDLE_TIMEOUTS,
        DECODE_REFUSALS,
    ] {
        counter!(name).absolute(0);
    }
    for encoding in ["zstd", "byteswap"] {
        counter!(DECODES_STARTED, "encoding" => encoding).absolute(0);
        counter!(DECODED_BYTES, "encoding" => encoding).absolute(0);
    }
    for outcome in ["kept", "computed"] {
        counter!(DELTAS, "outcome" => outcome).absolute(0);
    }
    let _ = histogram!(DELTA_COMPUTE);
    for outcome in ["ok", "mismatch"] {
        counter!(DIGEST_CHECKS, "outcome" => outcome).absolute(0);
    }
    for outcome in ["ok", "mismatch", "failed"] {
        counter!(DISK_CACHE_CHECKED_FILLS, "outcome" => outcome).absolute(0);
    }
    for outcome in ["verified", "unsigned", "failed"] {
        counter!(SIGNATURE_CHECKS, "outcome" => outcome).absolute(0);
    }
    for state in ["verified", "unsigned", "failed", "pending"] {
        gauge!(MODEL_SIGNATURES, "state" => state).set(0.0);
    }
    for digest in ["file", "image_layer"] {
        counter!(FILE_DIGEST_BYTES, "digest" => digest).absolute(0);
    }
    for reason in ["missing", "invalid"] {
        counter!(AUTH_FAILURES, "reason" => reason).absolute(0);
    }
    for outcome in ["ok", "error"] {
        counter!(AUTH_TOKEN_FILE_RELOADS, "outcome" => outcome).absolute(0);
        counter!(TLS_RELOADS, "outcome" => outcome).absolute(0);
    }
    for outcome in ["ok", "not_tls", "client_certificate", "refused", "io", "timeout"] {
        counter!(TLS_HANDSHAKES, "outcome" => outcome).absolute(0);
    }
    for status in ["ok", "broken"] {
        gauge!(MODELS, "status" => status).set(0.0);
    }
    for state in ["queued", "hashing", "known", "failed"] {
        gauge!(DIGEST_FILES, "state" => state).set(0.0);
    }
    for name in [CACHE_BYTES, HTTP_CONNECTIONS, AUTH_TOKENS, DISK_CACHE_BYTES, DIGEST_PENDING_BYTES] {
        gauge!(name).set(0.0);
    }
    for backend in ["local", "s3", "hf"] {
        for purpose in READ_PURPOSES {
            counter!(STORAGE_READ_BYTES, "backend" => backend, "purpose" => *purpose).absolute(0);
        }
    }
    for (backend, kind) in [("local", "manifest"), ("local", "map"), ("s3", "list"), ("hf", "list")] {
        let _ = histogram!(STORAGE_READ_DURATION, "backend" => backend, "kind" => kind);
    }
    for backend in ["s3", "hf"] {
        for purpose in READ_PURPOSES {
            let _ = histogram!(STORAGE_READ_DURATION, "backend" => backend, "kind" => *purpose);
        }
    }
}

/// Registers the per-route request series of `routes` (the composition root's), so they are
/// scraped from the start; a series already counting keeps its count.
pub fn register_routes(routes: &[&'static str]) {
    use metrics::{counter, histogram};
    use names::*;
    for route in routes {
        counter!(HTTP_REQUESTS, "route" => *route, "method" => "GET", "status" => "200").increment(0);
        counter!(HTTP_RESPONSE_BYTES, "route" => *route).increment(0);
        let _ = histogram!(HTTP_DURATION, "route" => *route);
    }
}

#[cfg(test)]
mod tests {
    use super::filter_directives;

    #[test]
    fn s3s_operation_errors_stay_out_of_the_log_unless_rust_log_names_s3s() {
        assert_eq!(filter_directives(None), "info,s3s::ops=off");
        assert_eq!(filter_directives(Some("")), "info,s3s::ops=off");
        assert_eq!(filter_directives(Some("info")), "info,s3s::ops=off");
        assert_eq!(filter_directives(Some("debug,hyper=warn")), "debug,hyper=warn,s3s::ops=off");
        assert_eq!(filter_directives(Some("info,s3s=debug")), "info,s3s=debug");
    }
}
