//! One typed [`Config`] in sections (`[server]`, `[sources]`, `[remote]`, `[s3_source]`,
//! `[hub_source]`, `[s3_endpoint]`, `[limits]`, `[decode]`, `[serving]`, `[digests]`, `[cache]`,
//! `[auth]`, `[tls]`, `[signing]`, `[artifacts]`, `[refits]`): this file (with the rooms
//! `access` and `refits` for the larger sections) is the schema an operator reads, each key with
//! what it means; [`load`] merges the layers in a fixed order (built-in defaults < the TOML
//! file < `ZTSERVE_*` environment variables < command-line flags) and reads the names of
//! earlier releases as deprecated aliases; [`validate`] refuses impossible values. A key has one
//! name everywhere: `max_ranges` in `[limits]` is `ZTSERVE_LIMITS__MAX_RANGES` in the
//! environment (section and key joined by a double underscore, since both hold single ones) and
//! `limits.max_ranges` for flags. A setting that can be off is an `Option`, absent when off,
//! and tokens are parsed and checked as the configuration loads. An unknown key, a value of the
//! wrong type or an impossible value stops the start with a message naming the key and where
//! it came from.
mod access;
mod load;
mod refits;
mod source_spec;
mod validate;

pub use access::{Auth, IdentityEntry, MIN_TOKEN_LEN, Signing, SigningPolicy, SourcePolicy, Tls, TokenEntry};
pub use load::{ConfigError, Loaded, env_name};
pub use refits::Refits;
pub use source_spec::SourceSpec;

use std::net::SocketAddr;
use std::path::PathBuf;

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
    pub remote: Remote,
    pub s3_source: S3Source,
    pub hub_source: HubSource,
    pub s3_endpoint: S3Endpoint,
    pub limits: Limits,
    pub decode: Decode,
    pub serving: Serving,
    pub digests: Digests,
    pub cache: Cache,
    pub auth: Auth,
    pub tls: Tls,
    pub signing: Signing,
    pub artifacts: Artifacts,
    pub refits: Refits,
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
    /// Whether bytes of mapped files leave with `sendfile` (no copy at the sender) rather than
    /// `writev` from the mapping (one copy, by the kernel).
    pub sendfile: bool,
}

impl Default for Server {
    fn default() -> Server {
        Server {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            log_format: LogFormat::Text,
            shutdown_drain_secs: 30,
            sendfile: false,
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
    /// Ask each listed object version once (a signed `HEAD`) for the SHA-256 checksum the
    /// store keeps, to check fills against and publish as its digest.
    pub ask_checksums: bool,
    /// A PEM bundle of CA certificates trusted for an `https://` endpoint, beside the system's
    /// roots (absent: the system's roots alone).
    pub ca_file: Option<PathBuf>,
}

/// How reads of remote sources (S3 prefixes and Hub repositories alike) are split and read
/// ahead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Remote {
    /// Bytes per ranged GET when a large read is split.
    pub range_chunk_bytes: u64,
    /// Ranged GETs in flight for one response (1: one GET per read, never split).
    pub range_concurrency: usize,
    /// Bytes fetched ahead of clients across all responses.
    pub readahead_bytes: u64,
}

impl Default for Remote {
    fn default() -> Remote {
        Remote { range_chunk_bytes: 8 << 20, range_concurrency: 1, readahead_bytes: 256 << 20 }
    }
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
            ask_checksums: true,
            ca_file: None,
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
            .field("ask_checksums", &self.ask_checksums)
            .field("ca_file", &self.ca_file)
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
    /// Regions one `POST /models/{m}/regions` may ask for.
    pub max_regions: usize,
    /// Bytes the regions of one such request may come to.
    pub max_regions_bytes: u64,
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
            max_regions: 4096,
            max_regions_bytes: 16 << 30,
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
    /// The namespace of the Hub API's repositories of models at the top of a source
    /// (`{hub_namespace}/llama` of `llama.safetensors`), since the Hub's clients refuse repo ids
    /// of one segment.
    pub hub_namespace: String,
}

impl Default for Serving {
    fn default() -> Serving {
        Serving { verify: VerifyPolicy::FirstRead, view_shard_bytes: 5_000_000_000, hub_namespace: "local".into() }
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
    /// Seconds between syncs of the digests appended to the store to disk (a crash loses at
    /// most this much, computed again after it).
    pub sync_interval_secs: u64,
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
            sync_interval_secs: 5,
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
    /// A PEM bundle of CA certificates trusted for an `https://` Hub, beside the system's
    /// roots (absent: the system's roots alone).
    pub ca_file: Option<PathBuf>,
}

impl Default for HubSource {
    fn default() -> HubSource {
        HubSource {
            endpoint: None,
            token: None,
            connect_timeout_secs: 10,
            read_timeout_secs: 60,
            retries: 5,
            ca_file: None,
        }
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
            .field("ca_file", &self.ca_file)
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
    /// How fast the background scrub reads the blocks held to check them (0: no scrub).
    pub scrub_bytes_per_second: u64,
}

impl Default for Cache {
    fn default() -> Cache {
        Cache {
            dir: None,
            max_bytes: 100_000_000_000,
            block_bytes: 8 << 20,
            prefetch: Vec::new(),
            pinned: Vec::new(),
            scrub_bytes_per_second: 32 << 20,
        }
    }
}

/// The artifact store: bundles publishers upload (engine compile caches), the only writes the
/// server takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Artifacts {
    /// The store's directory (absent: no store, and no writes at all).
    pub dir: Option<PathBuf>,
    /// The most bytes its blobs, bundle documents and uploads in progress hold; the least
    /// recently read bundles are evicted past it.
    pub max_bytes: u64,
    /// Tokens granted writing, each `TOKEN [PREFIX ...]` as in `[auth] tokens`: the prefixes
    /// limit the bundle names it may publish (none: nobody writes).
    pub writers: Vec<TokenEntry>,
    /// Client certificate identities granted writing, each `KIND:NAME [PREFIX ...]` as in
    /// `[auth] client_identities` (needs `tls.client_ca_file`).
    pub writer_identities: Vec<IdentityEntry>,
    /// Whether a bundle is taken, and served, only with a signature that `[signing]`'s keys or
    /// CA verify for its name over exactly its files.
    pub require_signature: bool,
    /// Whether writers may publish bundles no trusted signer signed. Off, a store with writers
    /// needs `require_signature`: else any writer could take a name first with a bundle every
    /// reader refuses, and the trusted publisher's would never be taken (squatting).
    pub allow_unsigned: bool,
    /// An S3 prefix (`s3://bucket/prefix`, reached with `[s3_source]`'s settings) replicas
    /// share: every blob and bundle is written through to it, and read from it when missing here.
    pub s3: Option<SourceSpec>,
}

impl Default for Artifacts {
    fn default() -> Artifacts {
        Artifacts {
            dir: None,
            max_bytes: 50_000_000_000,
            writers: Vec::new(),
            writer_identities: Vec::new(),
            require_signature: false,
            allow_unsigned: false,
            s3: None,
        }
    }
}

/// The largest file `huggingface_hub` downloads over plain HTTP (50 GB, decimal).
pub const MAX_HUB_FILE_BYTES: u64 = 50_000_000_000;

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

#[cfg(test)]
mod tests;
