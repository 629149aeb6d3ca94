//! One typed [`Config`] in sections (`[server]`, `[sources]`, `[s3_source]`, `[hub_source]`,
//! `[s3_endpoint]`, `[limits]`, `[decode]`, `[serving]`, `[digests]`, `[cache]`, `[auth]`), merged in a fixed order: built-in defaults <
//! the TOML file < `ZTSERVE_*` environment variables < command-line flags, then validated. A
//! key has one name everywhere: `max_ranges` in `[limits]` is `ZTSERVE_LIMITS__MAX_RANGES` in
//! the environment (section and key joined by a double underscore, since both hold single
//! ones) and `limits.max_ranges` for flags. A setting that can be off is an `Option`, absent
//! when off, and tokens are parsed and checked as the configuration loads. The flat names of
//! earlier releases (`s3_endpoint` at the top of the file, `ZTSERVE_S3_ENDPOINT`) still work as
//! aliases, each reported once as deprecated ([`Loaded::notices`]). An unknown key, a value of
//! the wrong type or an impossible value stops the start with a message naming the key and
//! where it came from.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The limits the format layer enforces by default.
const FORMAT_LIMITS: crate::format::Limits = crate::format::Limits::DEFAULT;

/// Every setting, by section. `config/ztserve.toml` documents each key with its default (an
/// optional key commented out, with an example); a test keeps the two identical.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: Server,
    pub sources: Sources,
    pub s3_source: S3Source,
    pub hub_source: HubSource,
    pub s3_endpoint: S3Endpoint,
    pub limits: Limits,
    pub decode: Decode,
    pub serving: Serving,
    pub digests: Digests,
    pub cache: Cache,
    pub auth: Auth,
}

impl Config {
    /// The default configuration serving `paths`.
    pub fn serving(paths: Vec<SourceSpec>) -> Config {
        Config { sources: Sources::at(paths), ..Config::default() }
    }
}

/// The listener and the process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Server {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Log format: `text` or `json`.
    pub log_format: LogFormat,
    /// Seconds in-flight requests get to finish after SIGTERM or SIGINT.
    pub shutdown_drain_secs: u64,
}

impl Default for Server {
    fn default() -> Server {
        Server {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            log_format: LogFormat::Text,
            shutdown_drain_secs: 30,
        }
    }
}

/// Where the models are, and how they are scanned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sources {
    /// Directories, `s3://bucket/prefix` locations and `hf://namespace/name[@revision]` Hub
    /// repositories whose model files are served.
    pub paths: Vec<SourceSpec>,
    /// At start, a source that cannot be listed either stops the server (`fail`) or is
    /// served degraded until it answers (`degrade`).
    pub on_unreadable: OnUnreadableSource,
    /// Seconds between rescans of the sources.
    pub rescan_interval_secs: u64,
    /// Manifests read at once during a scan of a remote source.
    pub scan_concurrency: usize,
    /// Bytes read from the end of a remote `.zt` object (the start of a safetensors file) in
    /// the first request for its manifest.
    pub manifest_suffix_bytes: u64,
}

impl Default for Sources {
    fn default() -> Sources {
        Sources {
            paths: vec![SourceSpec::Local("models".into())],
            on_unreadable: OnUnreadableSource::Fail,
            rescan_interval_secs: 30,
            scan_concurrency: 8,
            manifest_suffix_bytes: 64 << 10,
        }
    }
}

impl Sources {
    /// These paths, every other setting at its default.
    pub fn at(paths: Vec<SourceSpec>) -> Sources {
        Sources { paths, ..Sources::default() }
    }
}

/// How `s3://` sources are reached.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct S3Source {
    /// S3 endpoint URL (absent: `AWS_ENDPOINT_URL`, else AWS itself).
    pub endpoint: Option<String>,
    /// S3 region (absent: `AWS_REGION` / `AWS_DEFAULT_REGION`, else us-east-1).
    pub region: Option<String>,
    /// Access key id (absent: `AWS_ACCESS_KEY_ID`, else the instance's credentials).
    pub access_key_id: Option<String>,
    /// Secret access key (absent: `AWS_SECRET_ACCESS_KEY`); set with `access_key_id`.
    pub secret_access_key: Option<String>,
    /// Allow a plain `http://` endpoint (or `AWS_ALLOW_HTTP=true`).
    pub allow_http: bool,
    /// Virtual-hosted-style addressing, `bucket.host/key` (or
    /// `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`); path-style otherwise.
    pub virtual_hosted_style: bool,
    /// Seconds to wait for a connection to the store.
    pub connect_timeout_secs: u64,
    /// Seconds to wait for the next bytes of an answer.
    pub read_timeout_secs: u64,
    /// Retries of a failed S3 request, with exponential backoff.
    pub retries: usize,
    /// Bytes per ranged GET when a large read is split.
    pub range_chunk_bytes: u64,
    /// Ranged GETs in flight for one response (1: one GET per read, never split).
    pub range_concurrency: usize,
    /// Bytes fetched ahead of clients across all responses.
    pub readahead_bytes: u64,
}

impl Default for S3Source {
    fn default() -> S3Source {
        S3Source {
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            allow_http: false,
            virtual_hosted_style: false,
            connect_timeout_secs: 5,
            read_timeout_secs: 30,
            retries: 3,
            range_chunk_bytes: 8 << 20,
            range_concurrency: 1,
            readahead_bytes: 256 << 20,
        }
    }
}

impl std::fmt::Debug for S3Source {
    /// The secret access key is never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Source")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &self.secret_access_key.as_ref().map(|_| "<redacted>"))
            .field("allow_http", &self.allow_http)
            .field("virtual_hosted_style", &self.virtual_hosted_style)
            .field("connect_timeout_secs", &self.connect_timeout_secs)
            .field("read_timeout_secs", &self.read_timeout_secs)
            .field("retries", &self.retries)
            .field("range_chunk_bytes", &self.range_chunk_bytes)
            .field("range_concurrency", &self.range_concurrency)
            .field("readahead_bytes", &self.readahead_bytes)
            .finish()
    }
}

/// The S3-compatible read endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct S3Endpoint {
    /// Address of the endpoint's own listener (absent: no endpoint).
    pub listen: Option<SocketAddr>,
    /// The bucket loaders list: each model's companions and safetensors files, what the Hub
    /// API lists.
    pub bucket: String,
    /// The bucket of each model's stored files as they are (`.zt` files among them); absent:
    /// `bucket` followed by `-stored`.
    pub stored_bucket: Option<String>,
}

impl Default for S3Endpoint {
    fn default() -> S3Endpoint {
        S3Endpoint { listen: None, bucket: "models".into(), stored_bucket: None }
    }
}

impl S3Endpoint {
    /// The name of the bucket of stored files.
    pub fn stored_bucket(&self) -> String {
        self.stored_bucket.clone().unwrap_or_else(|| format!("{}-stored", self.bucket))
    }
}

/// What bounds requests and connections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Seconds a request may take to start its answer before it is answered 503 (`"none"`:
    /// no limit).
    #[serde(with = "seconds_or_none")]
    pub request_timeout_secs: Option<u64>,
    /// Requests handled at once; further ones wait.
    pub max_concurrent_requests: usize,
    /// Client connections open at once; further ones wait to be accepted.
    pub max_connections: usize,
    /// Largest request head (request line and headers), in bytes; larger ones answer 431.
    pub max_header_bytes: usize,
    /// Seconds a client has to send a request's head; also the longest a kept-alive
    /// connection stays open idle between requests.
    pub header_timeout_secs: u64,
    /// Seconds a connection may wait on its client with no bytes moving (a client that
    /// stopped reading, or stalled mid-request) before it is closed; time spent answering a
    /// request is not counted.
    pub idle_timeout_secs: u64,
    /// Ranges one request may ask for.
    pub max_ranges: usize,
    /// Largest manifest accepted, in bytes.
    pub max_manifest_bytes: u64,
    /// Largest decoded size of one component, in bytes.
    pub max_decoded_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            request_timeout_secs: Some(600),
            max_concurrent_requests: 1024,
            max_connections: 4096,
            max_header_bytes: 16 << 10,
            header_timeout_secs: 30,
            idle_timeout_secs: 60,
            max_ranges: 64,
            max_manifest_bytes: FORMAT_LIMITS.max_manifest_bytes,
            max_decoded_bytes: FORMAT_LIMITS.max_decoded_bytes,
        }
    }
}

/// Decoding of components not stored verbatim, and its cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Decode {
    /// Bytes of decoded components kept in memory (least recently used evicted first).
    pub cache_bytes: u64,
    /// Components decoded at once (absent: one per CPU core).
    pub max_concurrent: Option<usize>,
    /// Milliseconds a request that needs decoding waits for a decoder before it is answered
    /// 503 with `Retry-After`.
    pub wait_ms: u64,
}

impl Default for Decode {
    fn default() -> Decode {
        Decode { cache_bytes: 1 << 30, max_concurrent: None, wait_ms: 1000 }
    }
}

/// What is checked and how models are shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Serving {
    /// When stored bytes are checked against their declared digest: `never`, `first-read`
    /// (once per component and model version) or `always` (every request).
    pub verify: VerifyPolicy,
    /// Largest tensor data in one file of a model's safetensors view; a larger model's view is
    /// an index and shards of at most this size (`huggingface_hub`'s default, 5 GB).
    pub view_shard_bytes: u64,
}

impl Default for Serving {
    fn default() -> Serving {
        Serving { verify: VerifyPolicy::FirstRead, view_shard_bytes: 5_000_000_000 }
    }
}

/// The files' content digests (SHA-256 of each file a model version publishes: the Hub API's
/// ETags and LFS oids, the S3 endpoint's checksums).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Digests {
    /// A file the computed digests are appended to and read back from at start, so a restart
    /// does not read every file again (absent: `digests` in `cache.dir` when there is one,
    /// else kept in memory only).
    pub store: Option<PathBuf>,
    /// Which sources' published files are hashed in the background after each scan; the
    /// others' when a request needs a digest (the request then waits as below).
    pub ahead: HashAhead,
    /// Files hashed at once in the background (absent: one per core).
    pub hash_concurrency: Option<usize>,
    /// Bytes read at a time from a local file being hashed.
    pub read_buffer_bytes: u64,
    /// Whether the pages read to hash a local file are dropped from the page cache behind the
    /// reads, so hashing a model larger than memory does not evict what is being served.
    pub spare_page_cache: bool,
    /// Milliseconds a request about one file (a Hub `resolve` or HEAD, an OCI blob) waits for
    /// its digest before it is refused as retryable (503 with `Retry-After`): under the 10 s
    /// that `huggingface_hub` gives such a request.
    pub file_wait_ms: u64,
    /// Seconds a listing with digests (a Hub tree, model info with files, paths-info; an OCI
    /// manifest) waits for them before it is refused as retryable. Their clients set no time
    /// limit, and some (oras-py, the first page of `huggingface_hub` 0.36's tree) retry
    /// nothing, so the wait is long; it ends a second before `limits.request_timeout_secs`.
    pub listing_wait_secs: u64,
}

impl Default for Digests {
    fn default() -> Digests {
        Digests {
            store: None,
            ahead: HashAhead::Local,
            hash_concurrency: None,
            read_buffer_bytes: 4 << 20,
            spare_page_cache: true,
            file_wait_ms: 5000,
            listing_wait_secs: 540,
        }
    }
}

/// How `hf://` sources (Hub repositories) are reached.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HubSource {
    /// The Hub's URL (absent: `HF_ENDPOINT`, else `https://huggingface.co`).
    pub endpoint: Option<String>,
    /// A token that may read the repositories (absent: `HF_TOKEN`, else none).
    pub token: Option<String>,
    /// Seconds to wait for a connection to the Hub.
    pub connect_timeout_secs: u64,
    /// Seconds to wait for the next bytes of an answer.
    pub read_timeout_secs: u64,
    /// Retries of a request that failed for a reason worth retrying (the network, 5xx, 429),
    /// with exponential backoff or the Hub's `Retry-After`.
    pub retries: u32,
}

impl Default for HubSource {
    fn default() -> HubSource {
        HubSource { endpoint: None, token: None, connect_timeout_secs: 10, read_timeout_secs: 60, retries: 5 }
    }
}

impl std::fmt::Debug for HubSource {
    /// The token is never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubSource")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("connect_timeout_secs", &self.connect_timeout_secs)
            .field("read_timeout_secs", &self.read_timeout_secs)
            .field("retries", &self.retries)
            .finish()
    }
}

/// The node's disk cache for remote sources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Cache {
    /// The directory bytes read from remote sources (S3) are kept in (absent: no cache).
    pub dir: Option<PathBuf>,
    /// The most bytes the cache's blocks hold; the least recently used are evicted past it.
    pub max_bytes: u64,
    /// The size of a block, the unit fetched from the source and kept.
    pub block_bytes: u64,
    /// Models (ids) fetched whole into the cache after each rescan that finds a new version.
    pub prefetch: Vec<String>,
    /// Models (ids) whose blocks are never evicted.
    pub pinned: Vec<String>,
}

impl Default for Cache {
    fn default() -> Cache {
        Cache { dir: None, max_bytes: 100_000_000_000, block_bytes: 8 << 20, prefetch: Vec::new(), pinned: Vec::new() }
    }
}

/// Who may read what.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Auth {
    /// Tokens accepted (as HTTP bearer tokens, S3 keys…), each `TOKEN [PREFIX ...]`; with no
    /// tokens and no `token_file`, none is needed.
    pub tokens: Vec<TokenEntry>,
    /// A file of tokens, one entry per line, re-read when it changes.
    pub token_file: Option<PathBuf>,
    /// Whether `/metrics` needs a token too (when tokens are configured).
    pub metrics_require_token: bool,
}

/// The shortest token accepted: 16 characters of a random token are ~96 bits.
pub const MIN_TOKEN_LEN: usize = 16;

/// One token and the model id prefixes it may read (none: every model), as written
/// `TOKEN [PREFIX ...]` in `auth.tokens`, `ZTSERVE_AUTH__TOKENS` or a line of the token file;
/// checked when it is read. Never shown: `Debug` redacts the token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TokenEntry {
    pub token: String,
    pub prefixes: Vec<String>,
}

impl TokenEntry {
    /// Parses `TOKEN [PREFIX ...]`; the error never repeats the token.
    pub fn parse(entry: &str) -> Result<TokenEntry, String> {
        let mut words = entry.split_whitespace();
        let token = words.next().ok_or("is empty")?;
        // RFC 6750's b64token: what a client can send in `Authorization: Bearer`.
        let b64token = token.trim_end_matches('=').bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b));
        if !b64token || token.starts_with('=') {
            return Err(
                "the token has characters a bearer token cannot carry (allowed: A-Z a-z 0-9 - . _ ~ + / and trailing =)"
                    .into(),
            );
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err(format!("the token is {} characters; at least {MIN_TOKEN_LEN} are required", token.len()));
        }
        let mut prefixes = Vec::new();
        for prefix in words {
            let prefix = prefix.trim_matches('/');
            if prefix.is_empty() || prefix.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
                return Err(format!("prefix {prefix:?} is not a model id prefix like team-a or team-a/vision"));
            }
            prefixes.push(prefix.to_owned());
        }
        Ok(TokenEntry { token: token.to_owned(), prefixes })
    }
}

impl TryFrom<String> for TokenEntry {
    type Error = String;

    fn try_from(entry: String) -> Result<TokenEntry, String> {
        TokenEntry::parse(&entry)
    }
}

impl From<TokenEntry> for String {
    fn from(entry: TokenEntry) -> String {
        std::iter::once(entry.token).chain(entry.prefixes).collect::<Vec<_>>().join(" ")
    }
}

impl std::fmt::Debug for TokenEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEntry").field("token", &"<redacted>").field("prefixes", &self.prefixes).finish()
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
    /// `shown` is the value as written, where it may be shown: never a secret's, nor that of
    /// a variable that names no key (it could be a secret under a mistyped name).
    #[error("environment variable {var}{}: {message}", shown.as_ref().map(|v| format!("={v:?}")).unwrap_or_default())]
    Env { var: String, shown: Option<String>, message: String },
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
}

/// A loaded configuration, and what its loading has to say (deprecated names used), to be
/// logged once the logger is up.
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
    pub notices: Vec<String>,
}

/// Keys whose values are secrets: never shown in an error.
const SECRET_KEYS: &[(&str, &str)] = &[("auth", "tokens"), ("s3_source", "secret_access_key"), ("hub_source", "token")];

/// The flat key of earlier releases, and the section and key it now is. Each still works in
/// the file and as `ZTSERVE_<FLAT KEY>`, with a deprecation notice.
const ALIASES: &[(&str, &str, &str)] = &[
    ("listen", "server", "listen"),
    ("log_format", "server", "log_format"),
    ("shutdown_drain_secs", "server", "shutdown_drain_secs"),
    ("sources", "sources", "paths"),
    ("on_unreadable_source", "sources", "on_unreadable"),
    ("rescan_interval_secs", "sources", "rescan_interval_secs"),
    ("scan_concurrency", "sources", "scan_concurrency"),
    ("manifest_suffix_bytes", "sources", "manifest_suffix_bytes"),
    ("s3_endpoint", "s3_source", "endpoint"),
    ("s3_region", "s3_source", "region"),
    ("s3_access_key_id", "s3_source", "access_key_id"),
    ("s3_secret_access_key", "s3_source", "secret_access_key"),
    ("s3_allow_http", "s3_source", "allow_http"),
    ("s3_virtual_hosted_style", "s3_source", "virtual_hosted_style"),
    ("s3_connect_timeout_secs", "s3_source", "connect_timeout_secs"),
    ("s3_read_timeout_secs", "s3_source", "read_timeout_secs"),
    ("s3_retries", "s3_source", "retries"),
    ("s3_range_chunk_bytes", "s3_source", "range_chunk_bytes"),
    ("s3_range_concurrency", "s3_source", "range_concurrency"),
    ("s3_readahead_bytes", "s3_source", "readahead_bytes"),
    ("s3_listen", "s3_endpoint", "listen"),
    ("s3_endpoint_bucket", "s3_endpoint", "bucket"),
    ("request_timeout_secs", "limits", "request_timeout_secs"),
    ("max_concurrent_requests", "limits", "max_concurrent_requests"),
    ("max_connections", "limits", "max_connections"),
    ("max_header_bytes", "limits", "max_header_bytes"),
    ("header_timeout_secs", "limits", "header_timeout_secs"),
    ("idle_timeout_secs", "limits", "idle_timeout_secs"),
    ("max_ranges", "limits", "max_ranges"),
    ("max_manifest_bytes", "limits", "max_manifest_bytes"),
    ("max_decoded_bytes", "limits", "max_decoded_bytes"),
    ("decode_cache_bytes", "decode", "cache_bytes"),
    ("max_concurrent_decodes", "decode", "max_concurrent"),
    ("decode_wait_ms", "decode", "wait_ms"),
    ("verify", "serving", "verify"),
    ("view_shard_bytes", "serving", "view_shard_bytes"),
    ("tokens", "auth", "tokens"),
    ("token_file", "auth", "token_file"),
    ("metrics_require_token", "auth", "metrics_require_token"),
];

/// The environment variable of `section.key`.
pub fn env_name(section: &str, key: &str) -> String {
    format!("ZTSERVE_{}__{}", section.to_ascii_uppercase(), key.to_ascii_uppercase())
}

/// The value an aliased flat key's value stands for: earlier releases wrote "off" as `""`
/// (addresses, endpoints, credentials, the token file) or `0` (the request timeout, the
/// decoders), where the sections leave the key out (or, for the request timeout, say
/// `"none"`). `None`: the key is left out.
fn from_flat(flat: &str, value: toml::Value) -> Option<toml::Value> {
    match (&value, flat) {
        (toml::Value::Integer(0), "request_timeout_secs") => Some(toml::Value::String("none".into())),
        (toml::Value::Integer(0), "max_concurrent_decodes") => None,
        (toml::Value::String(text), _) if text.is_empty() => None,
        _ => Some(value),
    }
}

/// Every key of every section, each with a value of its type (optional keys included): what
/// the file, the environment and flags may set, and how an environment value is read.
fn shape() -> toml::Table {
    let example = Config {
        s3_source: S3Source {
            endpoint: Some(String::new()),
            region: Some(String::new()),
            access_key_id: Some(String::new()),
            secret_access_key: Some(String::new()),
            ..S3Source::default()
        },
        s3_endpoint: S3Endpoint { listen: Some(SocketAddr::from(([0, 0, 0, 0], 9000))), ..S3Endpoint::default() },
        decode: Decode { max_concurrent: Some(1), ..Decode::default() },
        auth: Auth { token_file: Some(PathBuf::new()), ..Auth::default() },
        digests: Digests { store: Some(PathBuf::new()), hash_concurrency: Some(1), ..Digests::default() },
        cache: Cache { dir: Some(PathBuf::new()), ..Cache::default() },
        ..Config::default()
    };
    toml::Table::try_from(example).expect("the configuration serializes")
}

/// What is being merged: the sections' tables, where each key's value came from, and the
/// deprecated names used.
struct Merging {
    shape: toml::Table,
    merged: toml::Table,
    origin: BTreeMap<String, String>,
    notices: Vec<String>,
}

impl Merging {
    /// Whether `section.key` is a key of the configuration.
    fn knows(&self, section: &str, key: &str) -> bool {
        self.shape.get(section).and_then(toml::Value::as_table).is_some_and(|t| t.contains_key(key))
    }

    /// Sets `section.key` (`None`: leaves it out, as an aliased "off" value does).
    fn set(&mut self, section: &str, key: &str, value: Option<toml::Value>, origin: String) {
        let table = self
            .merged
            .entry(section.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .expect("every section is a table");
        match value {
            Some(value) => table.insert(key.to_owned(), value),
            None => table.remove(key),
        };
        self.origin.insert(format!("{section}.{key}"), origin);
    }

    /// The section and key a deprecated flat name stands for, noting its use once.
    fn alias(
        &mut self,
        flat: &str,
        used_as: String,
        now: impl Fn(&str, &str) -> String,
    ) -> Option<(&'static str, &'static str)> {
        let &(_, section, key) = ALIASES.iter().find(|(name, _, _)| *name == flat)?;
        let notice = format!("{used_as} is deprecated: use {}", now(section, key));
        if !self.notices.contains(&notice) {
            self.notices.push(notice);
        }
        Some((section, key))
    }
}

impl Config {
    /// Merges the layers. `env` is the process environment (or a test's); `flags` are the
    /// command-line overrides as TOML values keyed `section.key`.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: BTreeMap<String, toml::Value>,
    ) -> Result<Loaded, ConfigError> {
        let defaults = toml::Table::try_from(Config::default()).expect("the defaults serialize");
        let mut merging =
            Merging { shape: shape(), merged: defaults.clone(), origin: BTreeMap::new(), notices: Vec::new() };

        if let Some(path) = file {
            let text =
                std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
            let table: toml::Table = toml::from_str(&text)
                .map_err(|e| ConfigError::File { path: path.to_owned(), message: e.to_string() })?;
            let from = format!("config file {}", path.display());
            let unknown =
                |key: &str| ConfigError::File { path: path.to_owned(), message: format!("unknown key {key:?}") };
            // The file's keys as written: an old name and its new one together are ambiguous.
            let mut written: BTreeMap<String, String> = BTreeMap::new();
            let mut once = |key: String, as_written: String| match written.insert(key.clone(), as_written.clone()) {
                Some(other) => Err(ConfigError::File {
                    path: path.to_owned(),
                    message: format!(
                        "{key} is set twice, as {other} and as {as_written}: set it once, by its new name"
                    ),
                }),
                None => Ok(()),
            };
            for (name, value) in table {
                match value {
                    toml::Value::Table(keys) if merging.shape.contains_key(&name) => {
                        for (key, value) in keys {
                            if !merging.knows(&name, &key) {
                                return Err(unknown(&format!("{name}.{key}")));
                            }
                            once(format!("{name}.{key}"), format!("{key} in [{name}]"))?;
                            merging.set(&name, &key, Some(value), from.clone());
                        }
                    }
                    value => {
                        let used_as = format!("config key {name:?} ({from})");
                        let (section, key) = merging
                            .alias(&name, used_as, |section, key| format!("{key} in [{section}]"))
                            .ok_or_else(|| unknown(&name))?;
                        once(format!("{section}.{key}"), format!("{name:?}"))?;
                        merging.set(section, key, from_flat(&name, value), from.clone());
                    }
                }
            }
        }

        let env: BTreeMap<String, String> = env.into_iter().filter(|(k, _)| k.starts_with("ZTSERVE_")).collect();
        // Which variable set each key: an old name and its new one together are ambiguous.
        let mut set_by: BTreeMap<String, String> = BTreeMap::new();
        let keys = shape();
        let is_key = |section: &str, key: &str| {
            keys.get(section).and_then(toml::Value::as_table).is_some_and(|t| t.contains_key(key))
        };
        for (var, text) in &env {
            let name = var["ZTSERVE_".len()..].to_ascii_lowercase();
            let env_error = |section: &str, key: &str, message: String| {
                let shown = is_key(section, key) && !SECRET_KEYS.contains(&(section, key));
                ConfigError::Env { var: var.clone(), shown: shown.then(|| text.clone()), message }
            };
            let (section, key, flat) = match name.split_once("__") {
                Some((section, key)) if merging.knows(section, key) => (section.to_owned(), key.to_owned(), None),
                Some((section, key)) => return Err(env_error(section, key, "no such configuration key".into())),
                // Other ZTSERVE_ variables (the client's ZTSERVE_TOKEN, the tests' own) are not
                // configuration, unless they are an earlier release's flat names.
                None => match merging.alias(&name, var.clone(), env_name) {
                    Some((section, key)) => (section.to_owned(), key.to_owned(), Some(name.clone())),
                    None => continue,
                },
            };
            if let Some(other) = set_by.insert(format!("{section}.{key}"), var.clone()) {
                let message = format!("{section}.{key} is set by {other} too: set it once, by its new name");
                return Err(env_error(&section, &key, message));
            }
            let typed = &merging.shape[section.as_str()][key.as_str()];
            let value = parse_env(typed, text).map_err(|message| env_error(&section, &key, message))?;
            let value = match &flat {
                Some(flat) => from_flat(flat, value),
                None => Some(value),
            };
            merging.set(&section, &key, value, format!("environment variable {var}"));
        }

        for (path, value) in flags {
            let (section, key) = path.split_once('.').expect("flags are keyed section.key");
            debug_assert!(merging.knows(section, key), "flag {path} has no config key");
            merging.set(section, key, Some(value), format!("flag --{}", key.replace('_', "-")));
        }

        let Merging { merged, origin, notices, .. } = merging;
        let config: Config = match toml::Value::Table(merged.clone()).try_into() {
            Ok(config) => config,
            Err(whole) => return Err(culprit(&defaults, &merged, &origin).unwrap_or_else(|| invalid_as_a_whole(whole))),
        };
        config.validate(&origin)?;
        let mut config = config;
        // A node with a cache directory has a place to keep state: the digests stay with it.
        if config.digests.store.is_none() {
            config.digests.store = config.cache.dir.as_ref().map(|dir| dir.join("digests"));
        }
        Ok(Loaded { config, notices })
    }

    fn validate(&self, origin: &BTreeMap<String, String>) -> Result<(), ConfigError> {
        let fail = |key: &str, message: String| ConfigError::Invalid {
            origin: format!("{key} (from {})", origin.get(key).map_or("default", String::as_str)),
            message,
        };
        if self.sources.paths.is_empty() {
            return Err(fail("sources.paths", "at least one source directory is needed".into()));
        }
        if self.sources.manifest_suffix_bytes < crate::format::MAX_TRAILER_LEN {
            let message = format!("must be at least {} (the longest trailer)", crate::format::MAX_TRAILER_LEN);
            return Err(fail("sources.manifest_suffix_bytes", message));
        }
        let s3 = &self.s3_source;
        if s3.access_key_id.is_none() != s3.secret_access_key.is_none() {
            let key =
                if s3.access_key_id.is_none() { "s3_source.access_key_id" } else { "s3_source.secret_access_key" };
            return Err(fail(key, "access_key_id and secret_access_key are set together".into()));
        }
        for (key, value) in [
            ("s3_source.endpoint", &s3.endpoint),
            ("s3_source.region", &s3.region),
            ("s3_source.access_key_id", &s3.access_key_id),
            ("s3_source.secret_access_key", &s3.secret_access_key),
        ] {
            if value.as_deref() == Some("") {
                return Err(fail(key, "must not be empty: leave it out for the default".into()));
            }
        }
        for (key, value) in
            [("hub_source.endpoint", &self.hub_source.endpoint), ("hub_source.token", &self.hub_source.token)]
        {
            if value.as_deref() == Some("") {
                return Err(fail(key, "must not be empty: leave it out for the default".into()));
            }
        }
        if let Some(endpoint) = &self.hub_source.endpoint {
            if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
                return Err(fail("hub_source.endpoint", format!("{endpoint:?} is not an http:// or https:// URL")));
            }
        }
        let message = "must be a bucket name: 3 to 63 of a-z 0-9 . -, starting and ending with a letter or digit";
        if !is_bucket_name(&self.s3_endpoint.bucket) {
            return Err(fail("s3_endpoint.bucket", message.into()));
        }
        let stored = self.s3_endpoint.stored_bucket();
        if !is_bucket_name(&stored) {
            return Err(fail("s3_endpoint.stored_bucket", message.into()));
        }
        if stored == self.s3_endpoint.bucket {
            return Err(fail("s3_endpoint.stored_bucket", "must differ from s3_endpoint.bucket".into()));
        }
        if self.auth.token_file.as_deref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(fail("auth.token_file", "must not be empty: leave it out for no token file".into()));
        }
        if self.digests.store.as_deref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(fail("digests.store", "must not be empty: leave it out to keep digests in memory only".into()));
        }
        if !(64 << 10..=256 << 20).contains(&self.digests.read_buffer_bytes) {
            let message = "must be between 65536 (64 KiB) and 268435456 (256 MiB)";
            return Err(fail("digests.read_buffer_bytes", message.into()));
        }
        if self.cache.dir.as_deref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(fail("cache.dir", "must not be empty: leave it out for no disk cache".into()));
        }
        if !(64 << 10..=256 << 20).contains(&self.cache.block_bytes) {
            return Err(fail("cache.block_bytes", "must be between 65536 (64 KiB) and 268435456 (256 MiB)".into()));
        }
        if self.cache.max_bytes < 2 * self.cache.block_bytes {
            return Err(fail("cache.max_bytes", "must hold at least two blocks (2 × cache.block_bytes)".into()));
        }
        if self.serving.view_shard_bytes > MAX_HUB_FILE_BYTES {
            let message = format!(
                "must be at most {MAX_HUB_FILE_BYTES} (50 GB): huggingface_hub cannot download a larger file over HTTP"
            );
            return Err(fail("serving.view_shard_bytes", message));
        }
        for (key, value) in [
            ("s3_source.connect_timeout_secs", Some(s3.connect_timeout_secs)),
            ("s3_source.read_timeout_secs", Some(s3.read_timeout_secs)),
            ("s3_source.range_chunk_bytes", Some(s3.range_chunk_bytes)),
            ("s3_source.range_concurrency", Some(s3.range_concurrency as u64)),
            ("serving.view_shard_bytes", Some(self.serving.view_shard_bytes)),
            ("sources.rescan_interval_secs", Some(self.sources.rescan_interval_secs)),
            ("sources.scan_concurrency", Some(self.sources.scan_concurrency as u64)),
            ("limits.max_concurrent_requests", Some(self.limits.max_concurrent_requests as u64)),
            ("limits.max_connections", Some(self.limits.max_connections as u64)),
            ("limits.header_timeout_secs", Some(self.limits.header_timeout_secs)),
            ("limits.idle_timeout_secs", Some(self.limits.idle_timeout_secs)),
            ("limits.max_ranges", Some(self.limits.max_ranges as u64)),
            ("limits.max_manifest_bytes", Some(self.limits.max_manifest_bytes)),
            ("limits.request_timeout_secs", self.limits.request_timeout_secs),
            ("decode.max_concurrent", self.decode.max_concurrent.map(|n| n as u64)),
            ("digests.hash_concurrency", self.digests.hash_concurrency.map(|n| n as u64)),
        ] {
            if value == Some(0) {
                return Err(fail(key, "must be at least 1".into()));
            }
        }
        if !(1024..=1 << 20).contains(&self.limits.max_header_bytes) {
            return Err(fail("limits.max_header_bytes", "must be between 1024 and 1048576".into()));
        }
        Ok(())
    }
}

/// The largest file `huggingface_hub` downloads over plain HTTP (50 GB, decimal).
pub const MAX_HUB_FILE_BYTES: u64 = 50_000_000_000;

/// Whether `name` is a valid S3 bucket name (the rules for new buckets).
fn is_bucket_name(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (3..=63).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        && edge(name.chars().next())
        && edge(name.chars().last())
        && !name.contains("..")
}

/// Which sources' files are hashed ahead of need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HashAhead {
    /// Every source's. For a remote source this reads every byte of every model from the
    /// store (into the disk cache, when there is one): on each node that serves it.
    All,
    /// Local directories': reading them costs no store traffic. A Hub file's digest is its
    /// LFS id, known without reading; an S3 object's is computed when first needed.
    Local,
    /// None: every digest is computed when first needed.
    None,
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

/// A source as configured: a local directory, an `s3://bucket/prefix` location or an
/// `hf://namespace/name[@revision]` Hub repository, written and read as that text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum SourceSpec {
    Local(PathBuf),
    S3 {
        bucket: String,
        prefix: String,
    },
    /// A Hub repository (`name` or `namespace/name`) at a revision (a branch, tag or commit;
    /// `None` is `main`).
    Hub {
        repo: String,
        revision: Option<String>,
    },
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
        if text.starts_with("hf:") {
            return hub_spec(&text);
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

/// `hf://namespace/name[@revision]`: a repo id the Hub's client accepts (one or two parts of
/// `A-Z a-z 0-9 - _ .`), and a revision without spaces or `..`.
fn hub_spec(text: &str) -> Result<SourceSpec, String> {
    let wrong = || format!("{text:?} is not hf://namespace/name[@revision]");
    let rest = text.strip_prefix("hf://").ok_or_else(wrong)?;
    let (repo, revision) = match rest.split_once('@') {
        Some((repo, revision)) => (repo, Some(revision)),
        None => (rest, None),
    };
    let part = |p: &str| {
        !p.is_empty()
            && p.len() <= 96
            && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !p.starts_with(['-', '.'])
            && !p.ends_with(['-', '.'])
            && !p.contains("--")
            && !p.contains("..")
    };
    let parts: Vec<&str> = repo.split('/').collect();
    if parts.len() > 2 || !parts.iter().all(|p| part(p)) {
        return Err(wrong());
    }
    if let Some(revision) = revision {
        let fine = !revision.is_empty()
            && !revision.contains("..")
            && !revision.starts_with('/')
            && !revision.ends_with('/')
            && revision.chars().all(|c| c.is_ascii_graphic() && !matches!(c, '?' | '#' | '%' | '\\' | '@'));
        if !fine {
            return Err(format!("{text:?}: {revision:?} is not a revision (a branch, tag or commit id)"));
        }
    }
    Ok(SourceSpec::Hub { repo: repo.to_owned(), revision: revision.map(str::to_owned) })
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
            SourceSpec::Hub { repo, revision: None } => write!(f, "hf://{repo}"),
            SourceSpec::Hub { repo, revision: Some(revision) } => write!(f, "hf://{repo}@{revision}"),
        }
    }
}

/// `request_timeout_secs`: seconds, or `"none"` for no limit (TOML has no null).
mod seconds_or_none {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub(super) fn serialize<S: Serializer>(value: &Option<u64>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(seconds) => serializer.serialize_u64(*seconds),
            None => serializer.serialize_str("none"),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Seconds(u64),
            Word(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Seconds(seconds) => Ok(Some(seconds)),
            Written::Word(word) if word == "none" => Ok(None),
            Written::Word(word) => Err(D::Error::custom(format!("expected seconds or \"none\", not {word:?}"))),
        }
    }
}

/// The first key whose merged value alone makes the configuration fail, as that key's error
/// with where its value came from (serde's own error does not say which layer set it).
fn culprit(defaults: &toml::Table, merged: &toml::Table, origin: &BTreeMap<String, String>) -> Option<ConfigError> {
    merged.iter().find_map(|(section, keys)| {
        keys.as_table()?.iter().find_map(|(key, value)| {
            let mut alone = defaults.clone();
            alone.get_mut(section)?.as_table_mut()?.insert(key.clone(), value.clone());
            let refused = toml::Value::Table(alone).try_into::<Config>().err()?;
            let path = format!("{section}.{key}");
            let from = origin.get(&path).map_or("default", String::as_str);
            Some(ConfigError::Invalid {
                origin: format!("{path} (from {from})"),
                message: refused.message().to_owned(),
            })
        })
    })
}

fn invalid_as_a_whole(error: toml::de::Error) -> ConfigError {
    ConfigError::Invalid { origin: "configuration".into(), message: error.to_string() }
}

/// Parses an environment value as the type `typed` has: integers (or `none` where a key takes
/// it), booleans, strings, and comma-separated lists for arrays.
fn parse_env(typed: &toml::Value, text: &str) -> Result<toml::Value, String> {
    match typed {
        toml::Value::Integer(_) if text.trim() == "none" => Ok(toml::Value::String("none".into())),
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

    fn load(file: Option<&Path>, pairs: &[(&str, &str)]) -> Result<Loaded, ConfigError> {
        Config::load(file, env(pairs), BTreeMap::new())
    }

    const TOKEN: &str = "tok-0123456789abcdef";

    #[test]
    fn debug_output_never_shows_secrets() {
        let config = Config {
            s3_source: S3Source {
                access_key_id: Some("AKIDEXAMPLE".into()),
                secret_access_key: Some("wJalrXUtnFEMI".into()),
                ..S3Source::default()
            },
            auth: Auth { tokens: vec![TokenEntry::parse(TOKEN).unwrap()], ..Auth::default() },
            ..Config::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains(TOKEN) && !shown.contains("wJalrXUtnFEMI"), "{shown}");
        assert!(shown.contains("AKIDEXAMPLE") && shown.contains("<redacted>"));
    }

    #[test]
    fn defaults_load_without_a_file() {
        let loaded = load(None, &[]).unwrap();
        assert_eq!(loaded.config, Config::default());
        assert!(loaded.notices.is_empty());
    }

    #[test]
    fn layers_override_in_order_defaults_file_env_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let file =
            "[server]\nlisten = \"0.0.0.0:9000\"\n[limits]\nmax_ranges = 5\n[sources]\nrescan_interval_secs = 7\n";
        std::fs::write(&path, file).unwrap();
        let flags = BTreeMap::from([("server.listen".to_string(), toml::Value::String("127.0.0.1:9100".into()))]);
        let vars = env(&[
            ("ZTSERVE_LIMITS__MAX_RANGES", "9"),
            ("ZTSERVE_SOURCES__PATHS", "a, b"),
            ("ZTSERVE_SERVER__LISTEN", "127.0.0.1:9050"),
        ]);
        let c = Config::load(Some(&path), vars, flags).unwrap().config;
        assert_eq!(c.server.listen.to_string(), "127.0.0.1:9100", "flag beats env and file");
        assert_eq!(c.limits.max_ranges, 9, "env beats file");
        assert_eq!(c.sources.rescan_interval_secs, 7, "file beats default");
        assert_eq!(c.sources.paths, [SourceSpec::local("a"), SourceSpec::local("b")]);
        assert_eq!(c.limits.max_concurrent_requests, Limits::default().max_concurrent_requests);
    }

    #[test]
    fn every_key_is_a_section_and_key_in_the_environment_with_a_double_underscore() {
        for (section, keys) in shape() {
            for key in keys.as_table().unwrap().keys() {
                let var = env_name(&section, key);
                assert!(var.starts_with("ZTSERVE_") && var.contains("__"), "{var}");
                assert_eq!(
                    var["ZTSERVE_".len()..].to_ascii_lowercase().split_once("__"),
                    Some((section.as_str(), key.as_str()))
                );
            }
        }
        let c = load(
            None,
            &[("ZTSERVE_S3_SOURCE__ENDPOINT", "http://minio:9000"), ("ZTSERVE_DECODE__MAX_CONCURRENT", "3")],
        )
        .unwrap()
        .config;
        assert_eq!((c.s3_source.endpoint.as_deref(), c.decode.max_concurrent), (Some("http://minio:9000"), Some(3)));
        let e = load(None, &[("ZTSERVE_LIMITS__MAX_RANGERS", "3")]).unwrap_err().to_string();
        assert!(e.contains("ZTSERVE_LIMITS__MAX_RANGERS") && e.contains("no such configuration key"), "{e}");
        // Variables that are not configuration (the client's token, the tests' own) are left alone.
        assert!(load(None, &[("ZTSERVE_TOKEN", "x"), ("ZTSERVE_VENVS", "/v")]).is_ok());
    }

    #[test]
    fn the_flat_names_of_earlier_releases_still_work_and_are_each_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "max_ranges = 5\ns3_listen = \"\"\nrequest_timeout_secs = 0\n[decode]\nwait_ms = 7\n")
            .unwrap();
        let loaded = load(
            Some(&path),
            &[
                ("ZTSERVE_SOURCES", "s3://models"),
                ("ZTSERVE_S3_ENDPOINT", "http://minio:9000"),
                ("ZTSERVE_S3_REGION", ""),
                ("ZTSERVE_MAX_CONCURRENT_DECODES", "0"),
                ("ZTSERVE_S3_LISTEN", "0.0.0.0:9000"),
            ],
        )
        .unwrap();
        let c = &loaded.config;
        assert_eq!(c.limits.max_ranges, 5);
        assert_eq!(c.limits.request_timeout_secs, None, "0 was no limit");
        assert_eq!(c.decode.wait_ms, 7);
        assert_eq!(c.decode.max_concurrent, None, "0 was one per core");
        assert_eq!(c.sources.paths, [SourceSpec::S3 { bucket: "models".into(), prefix: String::new() }]);
        assert_eq!(c.s3_source.endpoint.as_deref(), Some("http://minio:9000"));
        assert_eq!(c.s3_source.region, None, "\"\" was off");
        assert_eq!(c.s3_endpoint.listen, Some(SocketAddr::from(([0, 0, 0, 0], 9000))), "env beats the file's \"\"");
        assert_eq!(loaded.notices.len(), 8, "{:?}", loaded.notices);
        assert!(loaded.notices.iter().any(|n| n.contains("\"max_ranges\"") && n.contains("max_ranges in [limits]")));
        assert!(
            loaded
                .notices
                .iter()
                .any(|n| n.contains("ZTSERVE_S3_ENDPOINT is deprecated: use ZTSERVE_S3_SOURCE__ENDPOINT"))
        );
    }

    #[test]
    fn an_old_name_and_its_new_one_together_are_refused_as_ambiguous() {
        let e = load(None, &[("ZTSERVE_SOURCES", "a"), ("ZTSERVE_SOURCES__PATHS", "b")]).unwrap_err().to_string();
        assert!(e.contains("sources.paths is set by ZTSERVE_SOURCES too"), "{e}");
        // Never with a secret's value, nor one under a name that is no key.
        for vars in [
            [("ZTSERVE_TOKENS", TOKEN), ("ZTSERVE_AUTH__TOKENS", "other-token-0123456789")],
            [("ZTSERVE_AUTH__TOKEN", TOKEN), ("ZTSERVE_X", "")],
        ] {
            let e = load(None, &vars).unwrap_err().to_string();
            assert!(!e.contains(TOKEN) && !e.contains("other-token"), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "max_ranges = 5\n[limits]\nmax_ranges = 6\n").unwrap();
        let e = load(Some(&path), &[]).unwrap_err().to_string();
        assert!(e.contains("limits.max_ranges is set twice"), "{e}");
    }

    #[test]
    fn off_is_a_key_left_out_and_the_request_timeout_says_none() {
        let c = Config::default();
        assert_eq!((c.s3_endpoint.listen, c.auth.token_file.as_ref(), c.decode.max_concurrent), (None, None, None));
        assert_eq!(c.limits.request_timeout_secs, Some(600));
        let c = load(None, &[("ZTSERVE_LIMITS__REQUEST_TIMEOUT_SECS", "none")]).unwrap().config;
        assert_eq!(c.limits.request_timeout_secs, None);
        for (var, value, key) in [
            ("ZTSERVE_LIMITS__REQUEST_TIMEOUT_SECS", "0", "limits.request_timeout_secs"),
            ("ZTSERVE_DECODE__MAX_CONCURRENT", "0", "decode.max_concurrent"),
            ("ZTSERVE_S3_SOURCE__REGION", "", "s3_source.region"),
            ("ZTSERVE_AUTH__TOKEN_FILE", "", "auth.token_file"),
            ("ZTSERVE_S3_ENDPOINT__LISTEN", "nowhere", "s3_endpoint.listen"),
            ("ZTSERVE_LIMITS__MAX_RANGES", "none", "limits.max_ranges"),
        ] {
            let e = load(None, &[(var, value)]).unwrap_err().to_string();
            assert!(e.contains(key), "{var}={value:?}: {e}");
        }
    }

    #[test]
    fn tokens_are_parsed_and_checked_as_the_configuration_loads_never_repeating_one() {
        let c = load(None, &[("ZTSERVE_AUTH__TOKENS", &format!("{TOKEN} team-a/ org/vision"))]).unwrap().config;
        assert_eq!(
            c.auth.tokens,
            [TokenEntry { token: TOKEN.into(), prefixes: vec!["team-a".into(), "org/vision".into()] }]
        );
        for (entry, expected) in [
            ("short", "at least 16"),
            ("has\"quote0123456789", "characters"),
            ("=0123456789abcdefgh", "characters"),
            (&format!("{TOKEN} ../etc"), "prefix"),
            (&format!("{TOKEN} a//b"), "prefix"),
        ] {
            let e = load(None, &[("ZTSERVE_AUTH__TOKENS", entry)]).unwrap_err().to_string();
            assert!(e.contains("auth.tokens") && e.contains(expected), "{entry:?}: {e}");
            let token = entry.split_whitespace().next().unwrap();
            assert!(!e.contains(token), "{e} repeats the token");
        }
        assert_eq!(TokenEntry::parse("").unwrap_err(), "is empty");
    }

    #[test]
    fn invalid_configuration_fails_with_the_key_and_its_origin() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "lisen = \"x\"\n").unwrap();
        let e = load(Some(&path), &[]).unwrap_err().to_string();
        assert!(e.contains("unknown key \"lisen\""), "{e}");
        std::fs::write(&path, "[limits]\nmax_rangers = 3\n").unwrap();
        let e = load(Some(&path), &[]).unwrap_err().to_string();
        assert!(e.contains("unknown key \"limits.max_rangers\""), "{e}");
        std::fs::write(&path, "[limits]\nmax_ranges = \"many\"\n").unwrap();
        let e = load(Some(&path), &[]).unwrap_err().to_string();
        assert!(e.contains("limits.max_ranges (from config file"), "{e}");
        let e = load(None, &[("ZTSERVE_LIMITS__MAX_RANGES", "lots")]).unwrap_err().to_string();
        assert!(e.contains("ZTSERVE_LIMITS__MAX_RANGES") && e.contains("integer"), "{e}");
        let e = load(None, &[("ZTSERVE_SERVER__LISTEN", "nowhere")]).unwrap_err().to_string();
        assert!(e.contains("server.listen (from environment variable ZTSERVE_SERVER__LISTEN)"), "{e}");
        let e = load(None, &[("ZTSERVE_LISTEN", "nowhere")]).unwrap_err().to_string();
        assert!(e.contains("server.listen (from environment variable ZTSERVE_LISTEN)"), "{e}");
        let e = load(None, &[("ZTSERVE_SERVER__LOG_FORMAT", "xml")]).unwrap_err().to_string();
        assert!(e.contains("server.log_format"), "{e}");
        let e = load(None, &[("ZTSERVE_LIMITS__MAX_RANGES", "-1")]).unwrap_err().to_string();
        assert!(e.contains("max_ranges") || e.contains("configuration"), "{e}");
        assert!(load(Some(Path::new("/nonexistent/ztserve.toml")), &[]).is_err());
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
        let hub = |repo: &str, revision: Option<&str>| SourceSpec::Hub {
            repo: repo.into(),
            revision: revision.map(str::to_owned),
        };
        assert_eq!(spec("hf://org/llama"), Ok(hub("org/llama", None)));
        assert_eq!(spec("hf://gpt2@v1.0"), Ok(hub("gpt2", Some("v1.0"))));
        assert_eq!(spec("hf://org/llama@refs/pr/1"), Ok(hub("org/llama", Some("refs/pr/1"))));
        for bad in [
            "hf://",
            "hf:org/llama",
            "hf://a/b/c",
            "hf://org/-x",
            "hf://org/a..b",
            "hf://org/x@",
            "hf://o/x@a b",
            "hf://o/x@../y",
        ] {
            assert!(spec(bad).is_err(), "{bad}");
        }
        assert_eq!(hub("org/llama", Some("refs/pr/1")).to_string(), "hf://org/llama@refs/pr/1");
        let e = load(None, &[("ZTSERVE_SOURCES__PATHS", "s3://")]).unwrap_err().to_string();
        assert!(
            e.contains("sources.paths (from environment variable ZTSERVE_SOURCES__PATHS)") && e.contains("s3://bucket"),
            "{e}"
        );
    }

    #[test]
    fn the_documented_config_file_lists_every_key_with_its_default() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/ztserve.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let documented: toml::Table = toml::from_str(&text).unwrap();
        let defaults = toml::Table::try_from(Config::default()).unwrap();
        assert_eq!(documented, defaults, "config/ztserve.toml must show every key at its default");
        // Every key, optional ones commented out with an example, under its section, with a
        // comment line above it.
        for (section, keys) in shape() {
            let start = text.lines().position(|l| l == format!("[{section}]")).unwrap_or_else(|| panic!("[{section}]"));
            let body: Vec<&str> = text.lines().skip(start + 1).take_while(|l| !l.starts_with('[')).collect();
            for key in keys.as_table().unwrap().keys() {
                let line = body
                    .iter()
                    .position(|l| l.starts_with(&format!("{key} =")) || l.starts_with(&format!("# {key} =")))
                    .unwrap_or_else(|| panic!("{key} is not documented in [{section}]"));
                assert!(line > 0 && body[line - 1].starts_with('#'), "{section}.{key} needs a comment line above it");
            }
        }
    }
}
