//! One typed [`Config`], merged in a fixed order: built-in defaults < the TOML file <
//! `ZTSERVE_*` environment variables < command-line flags, then validated. Every key has the
//! same name everywhere: `rescan_interval_secs` in the file is `ZTSERVE_RESCAN_INTERVAL_SECS` in
//! the environment. An unknown key, a value of the wrong type or an impossible value stops the
//! start with a message naming the key and where it came from.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The limits the format layer enforces by default.
const FORMAT_LIMITS: crate::format::Limits = crate::format::Limits::DEFAULT;

/// Every setting. `config/ztserve.toml` documents each key with its default; a test keeps the
/// two identical.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Directories and `s3://bucket/prefix` locations whose `*.zt` files are served.
    pub sources: Vec<SourceSpec>,
    /// At start, a source that cannot be listed either stops the server (`fail`) or is
    /// served degraded until it answers (`degrade`).
    pub on_unreadable_source: OnUnreadableSource,
    /// Seconds between rescans of the sources.
    pub rescan_interval_secs: u64,
    /// Manifests read at once during a scan of a remote source.
    pub scan_concurrency: usize,
    /// Seconds a request may take before it is answered 503 (0: no limit).
    pub request_timeout_secs: u64,
    /// Requests handled at once; further ones wait.
    pub max_concurrent_requests: usize,
    /// Client connections open at once; further ones wait to be accepted.
    pub max_connections: usize,
    /// Largest request head (request line and headers), in bytes; larger ones answer 431.
    pub max_header_bytes: usize,
    /// Seconds a client has to send a request's head; also the longest a kept-alive
    /// connection stays open idle between requests.
    pub header_timeout_secs: u64,
    /// Seconds a connection may move no bytes either way while the server waits on it (a
    /// client that stopped reading) before it is closed.
    pub idle_timeout_secs: u64,
    /// Seconds in-flight requests get to finish after SIGTERM or SIGINT.
    pub shutdown_drain_secs: u64,
    /// Log format: `text` or `json`.
    pub log_format: LogFormat,
    /// Ranges one request may ask for.
    pub max_ranges: usize,
    /// Largest manifest accepted, in bytes.
    pub max_manifest_bytes: u64,
    /// Largest decoded size of one component, in bytes.
    pub max_decoded_bytes: u64,
    /// Bytes of decoded components kept in memory (least recently used evicted first).
    pub decode_cache_bytes: u64,
    /// Components decoded at once (0: one per CPU core).
    pub max_concurrent_decodes: usize,
    /// Milliseconds a request that needs decoding waits for a decoder before it is answered
    /// 503 with `Retry-After`.
    pub decode_wait_ms: u64,
    /// When stored bytes are checked against their declared digest: `never`, `first-read`
    /// (once per component and file version) or `always` (every request).
    pub verify: VerifyPolicy,
    /// Largest tensor data in one file of a model's safetensors view; a larger model's view is
    /// an index and shards of at most this size (`huggingface_hub`'s default, 5 GB).
    pub view_shard_bytes: u64,
    /// Bytes read from the end of a remote `.zt` object (the start of a safetensors file) in
    /// the first request for its manifest.
    pub manifest_suffix_bytes: u64,
    /// Bearer tokens accepted on `/models…`, each `TOKEN [PREFIX ...]` (empty, with no
    /// `token_file`: no token needed).
    pub tokens: Vec<String>,
    /// A file of tokens, one entry per line, re-read when it changes (empty: none).
    pub token_file: String,
    /// Whether `/metrics` needs a token too (when tokens are configured).
    pub metrics_require_token: bool,
    /// Address of the S3-compatible read endpoint (empty: off).
    pub s3_listen: String,
    /// The one bucket the S3-compatible endpoint serves.
    pub s3_endpoint_bucket: String,
    /// S3 endpoint URL (empty: `AWS_ENDPOINT_URL`, else AWS itself).
    pub s3_endpoint: String,
    /// S3 region (empty: `AWS_REGION` / `AWS_DEFAULT_REGION`, else us-east-1).
    pub s3_region: String,
    /// Access key id (empty: `AWS_ACCESS_KEY_ID`, else the instance's credentials).
    pub s3_access_key_id: String,
    /// Secret access key (empty: `AWS_SECRET_ACCESS_KEY`).
    pub s3_secret_access_key: String,
    /// Allow a plain `http://` endpoint (or `AWS_ALLOW_HTTP=true`).
    pub s3_allow_http: bool,
    /// Virtual-hosted-style addressing, `bucket.host/key` (or
    /// `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`); path-style otherwise.
    pub s3_virtual_hosted_style: bool,
    /// Seconds to wait for a connection to the store.
    pub s3_connect_timeout_secs: u64,
    /// Seconds to wait for the next bytes of an answer.
    pub s3_read_timeout_secs: u64,
    /// Retries of a failed S3 request, with exponential backoff.
    pub s3_retries: usize,
    /// Bytes per ranged GET when a large read is split.
    pub s3_range_chunk_bytes: u64,
    /// Ranged GETs in flight for one response (1: one GET per read, never split).
    pub s3_range_concurrency: usize,
    /// Bytes fetched ahead of clients across all responses.
    pub s3_readahead_bytes: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            sources: vec![SourceSpec::Local("models".into())],
            rescan_interval_secs: 30,
            scan_concurrency: 8,
            request_timeout_secs: 300,
            max_concurrent_requests: 1024,
            max_connections: 4096,
            max_header_bytes: 16 << 10,
            header_timeout_secs: 30,
            idle_timeout_secs: 60,
            shutdown_drain_secs: 30,
            log_format: LogFormat::Text,
            max_ranges: 64,
            max_manifest_bytes: FORMAT_LIMITS.max_manifest_bytes,
            max_decoded_bytes: FORMAT_LIMITS.max_decoded_bytes,
            decode_cache_bytes: 1 << 30,
            max_concurrent_decodes: 0,
            decode_wait_ms: 1000,
            verify: VerifyPolicy::FirstRead,
            view_shard_bytes: 5_000_000_000,
            on_unreadable_source: OnUnreadableSource::Fail,
            manifest_suffix_bytes: 64 << 10,
            tokens: Vec::new(),
            token_file: String::new(),
            metrics_require_token: false,
            s3_listen: String::new(),
            s3_endpoint_bucket: "models".into(),
            s3_endpoint: String::new(),
            s3_region: String::new(),
            s3_access_key_id: String::new(),
            s3_secret_access_key: String::new(),
            s3_allow_http: false,
            s3_virtual_hosted_style: false,
            s3_connect_timeout_secs: 5,
            s3_read_timeout_secs: 30,
            s3_retries: 3,
            s3_range_chunk_bytes: 8 << 20,
            s3_range_concurrency: 1,
            s3_readahead_bytes: 256 << 20,
        }
    }
}

/// Keys whose values are secrets: shown as `<redacted>` by `Debug`, never logged.
const SECRET_KEYS: &[&str] = &["tokens", "s3_secret_access_key"];

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut table = toml::Table::try_from(self).map_err(|_| std::fmt::Error)?;
        for key in SECRET_KEYS {
            if let Some(value) = table.get_mut(*key) {
                *value = toml::Value::String("<redacted>".into());
            }
        }
        f.debug_tuple("Config").field(&table).finish()
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("environment variable {var}={value:?}: {message}")]
    Env { var: String, value: String, message: String },
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
}

/// Where the merged value of a key came from, for error messages.
fn env_name(key: &str) -> String {
    format!("ZTSERVE_{}", key.to_ascii_uppercase())
}

impl Config {
    /// Merges the layers. `env` is the process environment (or a test's); `flags` are the
    /// command-line overrides as TOML values keyed like the file.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: BTreeMap<String, toml::Value>,
    ) -> Result<Config, ConfigError> {
        let defaults = toml::Table::try_from(Config::default()).expect("the defaults serialize");
        let mut merged = defaults.clone();
        let mut origin: BTreeMap<String, String> = defaults.keys().map(|k| (k.clone(), "default".to_owned())).collect();

        if let Some(path) = file {
            let text =
                std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
            let table: toml::Table = toml::from_str(&text)
                .map_err(|e| ConfigError::File { path: path.to_owned(), message: e.to_string() })?;
            for (key, value) in table {
                if !defaults.contains_key(&key) {
                    return Err(ConfigError::File { path: path.to_owned(), message: format!("unknown key {key:?}") });
                }
                origin.insert(key.clone(), format!("config file {}", path.display()));
                merged.insert(key, value);
            }
        }

        let env: BTreeMap<String, String> = env.into_iter().filter(|(k, _)| k.starts_with("ZTSERVE_")).collect();
        for (key, default) in &defaults {
            let var = env_name(key);
            if let Some(text) = env.get(&var) {
                let value = parse_env(default, text).map_err(|message| ConfigError::Env {
                    var: var.clone(),
                    value: text.clone(),
                    message,
                })?;
                origin.insert(key.clone(), format!("environment variable {var}"));
                merged.insert(key.clone(), value);
            }
        }

        for (key, value) in flags {
            debug_assert!(defaults.contains_key(&key), "flag {key} has no config key");
            origin.insert(key.clone(), format!("flag --{}", key.replace('_', "-")));
            merged.insert(key, value);
        }

        let config: Config = match toml::Value::Table(merged.clone()).try_into() {
            Ok(config) => config,
            Err(whole) => return Err(culprit(&defaults, &merged, &origin).unwrap_or_else(|| invalid_as_a_whole(whole))),
        };
        config.validate(&origin)?;
        Ok(config)
    }

    fn validate(&self, origin: &BTreeMap<String, String>) -> Result<(), ConfigError> {
        let fail = |key: &str, message: String| ConfigError::Invalid {
            origin: format!("{key} (from {})", origin.get(key).map_or("default", String::as_str)),
            message,
        };
        if self.sources.is_empty() {
            return Err(fail("sources", "at least one source directory is needed".into()));
        }
        if self.manifest_suffix_bytes < crate::format::MAX_TRAILER_LEN {
            let message = format!("must be at least {} (the longest trailer)", crate::format::MAX_TRAILER_LEN);
            return Err(fail("manifest_suffix_bytes", message));
        }
        if self.s3_access_key_id.is_empty() != self.s3_secret_access_key.is_empty() {
            let key = if self.s3_access_key_id.is_empty() { "s3_access_key_id" } else { "s3_secret_access_key" };
            return Err(fail(key, "s3_access_key_id and s3_secret_access_key are set together".into()));
        }
        for (key, value) in [
            ("s3_connect_timeout_secs", self.s3_connect_timeout_secs),
            ("s3_read_timeout_secs", self.s3_read_timeout_secs),
            ("s3_range_chunk_bytes", self.s3_range_chunk_bytes),
            ("s3_range_concurrency", self.s3_range_concurrency as u64),
            ("view_shard_bytes", self.view_shard_bytes),
        ] {
            if value == 0 {
                return Err(fail(key, "must be at least 1".into()));
            }
        }
        if !self.s3_listen.is_empty() && self.s3_listen.parse::<SocketAddr>().is_err() {
            return Err(fail(
                "s3_listen",
                "must be an address such as 0.0.0.0:9000, or empty for no S3 endpoint".into(),
            ));
        }
        if !is_bucket_name(&self.s3_endpoint_bucket) {
            let message = "must be a bucket name: 3 to 63 of a-z 0-9 . -, starting and ending with a letter or digit";
            return Err(fail("s3_endpoint_bucket", message.into()));
        }
        if self.rescan_interval_secs == 0 {
            return Err(fail("rescan_interval_secs", "must be at least 1".into()));
        }
        for (key, value) in [
            ("scan_concurrency", self.scan_concurrency as u64),
            ("max_concurrent_requests", self.max_concurrent_requests as u64),
            ("max_connections", self.max_connections as u64),
            ("header_timeout_secs", self.header_timeout_secs),
            ("idle_timeout_secs", self.idle_timeout_secs),
        ] {
            if value == 0 {
                return Err(fail(key, "must be at least 1".into()));
            }
        }
        if !(1024..=1 << 20).contains(&self.max_header_bytes) {
            return Err(fail("max_header_bytes", "must be between 1024 and 1048576".into()));
        }
        if self.max_ranges == 0 {
            return Err(fail("max_ranges", "must be at least 1".into()));
        }
        if self.max_manifest_bytes == 0 {
            return Err(fail("max_manifest_bytes", "must be at least 1".into()));
        }
        Ok(())
    }
}

/// Whether `name` is a valid S3 bucket name (the rules for new buckets).
fn is_bucket_name(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (3..=63).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        && edge(name.chars().next())
        && edge(name.chars().last())
        && !name.contains("..")
}

impl Config {
    /// The S3-compatible endpoint's address, when it is on.
    pub fn s3_listen_address(&self) -> Option<SocketAddr> {
        self.s3_listen.parse().ok()
    }
}

/// When a component's stored bytes are checked against its declared digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerifyPolicy {
    /// Never: digests are only reported.
    Never,
    /// On the first read of each component of a file version; the outcome is remembered.
    FirstRead,
    /// On every request that serves the component.
    Always,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// What a source that cannot be listed at start does to the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnUnreadableSource {
    /// Stop the server with the source's error.
    Fail,
    /// Serve the other sources; this one is reported degraded until it answers.
    Degrade,
}

/// A source as configured: a local directory or an `s3://bucket/prefix` location, written
/// and read as that text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum SourceSpec {
    Local(PathBuf),
    S3 { bucket: String, prefix: String },
}

impl SourceSpec {
    /// A local directory.
    pub fn local(path: impl Into<PathBuf>) -> SourceSpec {
        SourceSpec::Local(path.into())
    }
}

impl TryFrom<String> for SourceSpec {
    type Error = String;

    fn try_from(text: String) -> Result<SourceSpec, String> {
        if text.trim().is_empty() {
            return Err("a source is empty".into());
        }
        if !text.starts_with("s3:") {
            return Ok(SourceSpec::Local(text.into()));
        }
        let rest = text.strip_prefix("s3://").unwrap_or("");
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(format!("{text:?} is not s3://bucket/prefix"));
        }
        Ok(SourceSpec::S3 { bucket: bucket.to_owned(), prefix: prefix.trim_matches('/').to_owned() })
    }
}

impl From<SourceSpec> for String {
    fn from(spec: SourceSpec) -> String {
        spec.to_string()
    }
}

impl std::fmt::Display for SourceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceSpec::Local(path) => write!(f, "{}", path.display()),
            SourceSpec::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            SourceSpec::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

/// The first key whose merged value alone makes the configuration fail, as that key's error
/// with where its value came from (serde's own error does not say which layer set it).
fn culprit(defaults: &toml::Table, merged: &toml::Table, origin: &BTreeMap<String, String>) -> Option<ConfigError> {
    merged.iter().find_map(|(key, value)| {
        let mut alone = defaults.clone();
        alone.insert(key.clone(), value.clone());
        let refused = toml::Value::Table(alone).try_into::<Config>().err()?;
        let from = origin.get(key).map_or("default", String::as_str);
        Some(ConfigError::Invalid { origin: format!("{key} (from {from})"), message: refused.message().to_owned() })
    })
}

fn invalid_as_a_whole(error: toml::de::Error) -> ConfigError {
    ConfigError::Invalid { origin: "configuration".into(), message: error.to_string() }
}

/// Parses an environment value as the type of the key's default: integers, booleans, strings,
/// and comma-separated lists for arrays.
fn parse_env(default: &toml::Value, text: &str) -> Result<toml::Value, String> {
    match default {
        toml::Value::Integer(_) => {
            text.trim().parse::<i64>().map(toml::Value::Integer).map_err(|_| "expected an integer".into())
        }
        toml::Value::Boolean(_) => {
            text.trim().parse::<bool>().map(toml::Value::Boolean).map_err(|_| "expected true or false".into())
        }
        toml::Value::Array(_) => Ok(toml::Value::Array(
            text.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.to_owned()))
                .collect(),
        )),
        _ => Ok(toml::Value::String(text.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn debug_output_never_shows_secrets() {
        let config = Config {
            tokens: vec!["tok-0123456789abcdef".into()],
            s3_access_key_id: "AKIDEXAMPLE".into(),
            s3_secret_access_key: "wJalrXUtnFEMI".into(),
            ..Config::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("tok-0123456789abcdef") && !shown.contains("wJalrXUtnFEMI"), "{shown}");
        assert!(shown.contains("AKIDEXAMPLE") && shown.contains("<redacted>"));
    }

    #[test]
    fn defaults_load_without_a_file() {
        assert_eq!(Config::load(None, env(&[]), BTreeMap::new()).unwrap(), Config::default());
    }

    #[test]
    fn layers_override_in_order_defaults_file_env_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "listen = \"0.0.0.0:9000\"\nmax_ranges = 5\nrescan_interval_secs = 7\n").unwrap();
        let flags = BTreeMap::from([("listen".to_string(), toml::Value::String("127.0.0.1:9100".into()))]);
        let c = Config::load(
            Some(&path),
            env(&[("ZTSERVE_MAX_RANGES", "9"), ("ZTSERVE_SOURCES", "a, b"), ("ZTSERVE_LISTEN", "127.0.0.1:9050")]),
            flags,
        )
        .unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:9100", "flag beats env and file");
        assert_eq!(c.max_ranges, 9, "env beats file");
        assert_eq!(c.rescan_interval_secs, 7, "file beats default");
        assert_eq!(c.sources, [SourceSpec::local("a"), SourceSpec::local("b")]);
        assert_eq!(c.max_concurrent_requests, Config::default().max_concurrent_requests);
    }

    #[test]
    fn invalid_configuration_fails_with_the_key_and_its_origin() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "lisen = \"x\"\n").unwrap();
        let e = Config::load(Some(&path), env(&[]), BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("unknown key \"lisen\""), "{e}");
        std::fs::write(&path, "max_ranges = \"many\"\n").unwrap();
        assert!(Config::load(Some(&path), env(&[]), BTreeMap::new()).is_err());
        let e = Config::load(None, env(&[("ZTSERVE_MAX_RANGES", "lots")]), BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("ZTSERVE_MAX_RANGES") && e.contains("integer"), "{e}");
        let e = Config::load(None, env(&[("ZTSERVE_LISTEN", "nowhere")]), BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("listen (from environment variable ZTSERVE_LISTEN)"), "{e}");
        let e = Config::load(None, env(&[("ZTSERVE_LOG_FORMAT", "xml")]), BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("log_format"), "{e}");
        let e = Config::load(None, env(&[("ZTSERVE_MAX_RANGES", "-1")]), BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("max_ranges") || e.contains("configuration"), "{e}");
        assert!(Config::load(Some(Path::new("/nonexistent/ztserve.toml")), env(&[]), BTreeMap::new()).is_err());
    }

    #[test]
    fn sources_are_directories_or_a_bucket_with_an_optional_prefix() {
        let spec = |text: &str| SourceSpec::try_from(text.to_owned());
        let s3 = |bucket: &str, prefix: &str| SourceSpec::S3 { bucket: bucket.into(), prefix: prefix.into() };
        assert_eq!(spec("s3://models/prod/v1/"), Ok(s3("models", "prod/v1")));
        assert_eq!(spec("s3://models"), Ok(s3("models", "")));
        assert_eq!(spec("models"), Ok(SourceSpec::local("models")));
        assert!(spec("s3:///x").is_err() && spec("s3:models").is_err() && spec(" ").is_err());
        assert_eq!(s3("models", "prod/v1").to_string(), "s3://models/prod/v1");
        let e = Config::load(None, env(&[("ZTSERVE_SOURCES", "s3://")]), BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("sources (from environment variable ZTSERVE_SOURCES)") && e.contains("s3://bucket"), "{e}");
    }

    #[test]
    fn the_documented_config_file_lists_every_key_with_its_default() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/ztserve.toml");
        let documented: toml::Table = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let defaults = toml::Table::try_from(Config::default()).unwrap();
        assert_eq!(documented, defaults, "config/ztserve.toml must show every key at its default");
        let text = std::fs::read_to_string(&path).unwrap();
        for key in defaults.keys() {
            let line = text.lines().position(|l| l.starts_with(&format!("{key} ="))).unwrap();
            let comment = text.lines().nth(line.wrapping_sub(1)).unwrap_or("");
            assert!(comment.starts_with('#'), "{key} needs a comment line above it");
        }
    }
}
