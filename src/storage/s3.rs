//! S3 and S3-compatible stores (MinIO, Ceph, R2, …) through `object_store`'s AmazonS3 backend.
//! A source `s3://bucket/prefix` lists every model file below the prefix; every read is one ranged
//! GET conditioned with `If-Match` on the ETag seen at listing, and the ETag of the answer is
//! checked again on our side, so two versions of an object are never mixed even by a store
//! that ignores the condition. Each object version listed is asked once, with a signed `HEAD`
//! in checksum mode, for the full-object SHA-256 the store keeps when it was uploaded with one:
//! the digest fills are checked against and published without reading the bytes. Endpoint,
//! region, credentials and addressing come from the standard `AWS_*` variables, overridden by
//! [`S3Options`].

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt as _, StreamExt as _, TryStreamExt as _};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::signer::{HeaderName, HeaderValue, Method, SignedUrlOptions, Signer as _};
use object_store::{BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, RetryConfig};

use super::{ByteRange, Content, Listed, Payload, Read, ReadIntent, Storage, StorageError};
use crate::config::S3Source;

/// S3 error codes that no retry will cure: credentials, permissions or a missing bucket.
/// `object_store` reports them (on listings, for instance) as generic errors carrying the
/// store's answer, and does not expose the status, so the code in the answer decides.
const REFUSALS: [&str; 6] = [
    "NoSuchBucket",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "403 Forbidden",
    "401 Unauthorized",
];

/// Object versions asked for their checksum at once, after a listing: a catalog of 100k
/// objects takes about a minute of them at its first listing, at 20 ms a `HEAD`.
const CHECKSUM_REQUESTS: usize = 32;

/// How to reach the store; `None` leaves the `AWS_*` environment's value.
#[derive(Debug, Clone)]
pub struct S3Options {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Plain `http://` endpoints (a local MinIO); refused otherwise.
    pub allow_http: bool,
    /// `bucket.host/key` instead of `host/bucket/key`.
    pub virtual_hosted_style: bool,
    pub connect_timeout: Duration,
    /// Longest wait for the next bytes of an answer (not the whole answer: downloads are long).
    pub read_timeout: Duration,
    /// Retries of a failed request, with exponential backoff.
    pub retries: usize,
    /// Whether each listed object version is asked for its SHA-256 checksum.
    pub ask_checksums: bool,
    /// Access key id and secret; `None` takes the `AWS_*` environment's (or the instance's).
    pub credentials: Option<(String, String)>,
    /// CA certificates (a PEM bundle) trusted beside the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            endpoint: None,
            region: None,
            allow_http: false,
            virtual_hosted_style: false,
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(30),
            retries: 3,
            ask_checksums: true,
            credentials: None,
            ca_file: None,
        }
    }
}

/// One `s3://bucket/prefix` source.
#[derive(Debug)]
pub struct S3Storage {
    name: String,
    prefix: Option<Path>,
    store: Arc<AmazonS3>,
    /// For the checksum requests `object_store` cannot make (it never asks for checksums);
    /// `None` when they are not asked for (`s3_source.ask_checksums`).
    http: Option<reqwest::Client>,
    /// Each listed object version's full-object SHA-256, by key and ETag: `None` when the
    /// store keeps none (uploaded without one, or in parts).
    checksums: Mutex<HashMap<KeyAndEtag, Option<[u8; 32]>>>,
}

/// An object version: its key and ETag.
type KeyAndEtag = (String, String);

impl S3Options {
    /// The configured settings, else the `AWS_*` variables in `env` for the switches.
    pub fn from_config(config: &S3Source, env: &BTreeMap<String, String>) -> S3Options {
        let env_true = |var: &str| env.get(var).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        S3Options {
            endpoint: config.endpoint.clone(),
            region: config.region.clone(),
            allow_http: config.allow_http || env_true("AWS_ALLOW_HTTP"),
            virtual_hosted_style: config.virtual_hosted_style || env_true("AWS_VIRTUAL_HOSTED_STYLE_REQUEST"),
            connect_timeout: Duration::from_secs(config.connect_timeout_secs),
            read_timeout: Duration::from_secs(config.read_timeout_secs),
            retries: config.retries,
            ask_checksums: config.ask_checksums,
            credentials: config.access_key_id.clone().zip(config.secret_access_key.clone()),
            ca_file: config.ca_file.clone(),
        }
    }
}

/// A client of `bucket` with `options` (the sources', and the artifact store's bucket).
pub(crate) fn bucket_client(bucket: &str, options: &S3Options) -> Result<AmazonS3, String> {
    let mut client = ClientOptions::new()
        .with_connect_timeout(options.connect_timeout)
        .with_read_timeout(options.read_timeout)
        .with_timeout_disabled()
        .with_allow_http(options.allow_http);
    if let Some(file) = &options.ca_file {
        for cert in super::ca_bundle(file, object_store::Certificate::from_pem_bundle)? {
            client = client.with_root_certificate(cert);
        }
    }
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: options.retries,
        retry_timeout: Duration::from_secs(60),
    };
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_client_options(client)
        .with_retry(retry)
        .with_virtual_hosted_style_request(options.virtual_hosted_style);
    if let Some(endpoint) = &options.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some((key_id, secret)) = &options.credentials {
        builder = builder.with_access_key_id(key_id).with_secret_access_key(secret);
    }
    if let Some(region) = &options.region {
        builder = builder.with_region(region);
    }
    builder.build().map_err(|e| e.to_string())
}

impl S3Storage {
    /// The source `name` (`s3://bucket/prefix`) over `prefix` of `bucket`. Nothing is
    /// contacted yet.
    pub fn new(name: &str, bucket: &str, prefix: &str, options: &S3Options) -> Result<S3Storage, StorageError> {
        let source = name;
        let refused = |message: String| StorageError::Refused { source_name: source.to_owned(), message };
        let store = bucket_client(bucket, options).map_err(refused)?;
        let prefix = (!prefix.is_empty()).then(|| Path::from(prefix));
        let mut http = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .read_timeout(options.read_timeout)
            .redirect(reqwest::redirect::Policy::none());
        if let Some(file) = &options.ca_file {
            http =
                http.tls_certs_merge(super::ca_bundle(file, reqwest::Certificate::from_pem_bundle).map_err(refused)?);
        }
        let http = options.ask_checksums.then(|| http.build()).transpose().map_err(|e| refused(e.to_string()))?;
        let (name, store, checksums) = (source.to_owned(), Arc::new(store), Mutex::default());
        Ok(S3Storage { name, prefix, store, http, checksums })
    }

    /// The full-object SHA-256 the store keeps for `key` at ETag `version`: a `HEAD` signed
    /// with `x-amz-checksum-mode: ENABLED` and `If-Match`. `None` when it keeps none, or only
    /// a checksum of parts (`COMPOSITE`, from a multipart upload), which no whole read checks.
    async fn stored_sha256(
        &self,
        http: &reqwest::Client,
        key: &str,
        version: &str,
    ) -> Result<Option<[u8; 32]>, String> {
        use base64::Engine as _;
        let mode = (HeaderName::from_static("x-amz-checksum-mode"), HeaderValue::from_static("ENABLED"));
        let condition = HeaderValue::from_str(version).map_err(|e| e.to_string())?;
        let options = SignedUrlOptions::new()
            .with_signed_header(mode.0.clone(), mode.1.clone())
            .with_signed_header(HeaderName::from_static("if-match"), condition.clone());
        let url = self
            .store
            .signed_url_opts(Method::HEAD, &self.location(key), Duration::from_secs(300), &options)
            .await
            .map_err(|e| e.to_string())?;
        let answer = http
            .head(url)
            .header(mode.0, mode.1)
            .header(reqwest::header::IF_MATCH, condition)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = answer.status();
        if status == reqwest::StatusCode::PRECONDITION_FAILED || status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(format!("HEAD answered {status}"));
        }
        let header = |name: &str| answer.headers().get(name).and_then(|v| v.to_str().ok());
        if header("etag").is_some_and(|tag| tag != version)
            || header("x-amz-checksum-type").is_some_and(|t| t != "FULL_OBJECT")
        {
            return Ok(None);
        }
        let digest =
            header("x-amz-checksum-sha256").and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok());
        Ok(digest.and_then(|d| <[u8; 32]>::try_from(d).ok()))
    }

    /// Asks for the checksum of every object version of `listed` not asked yet, and forgets
    /// those no longer listed. One that cannot be asked now is asked again after the next
    /// listing; until then its fills go unchecked, as they did before.
    async fn learn_checksums(&self, listed: &[Listed]) {
        let Some(http) = &self.http else { return };
        let unasked: Vec<(String, String)> = {
            let known = self.checksums.lock().expect("never poisoned");
            listed
                .iter()
                .map(|l| (l.key.clone(), l.version.clone()))
                .filter(|object| !known.contains_key(object))
                .collect()
        };
        let answers: Vec<_> = futures_util::stream::iter(unasked)
            .map(|(key, version)| async move {
                let answer = self.stored_sha256(http, &key, &version).await;
                ((key, version), answer)
            })
            .buffer_unordered(CHECKSUM_REQUESTS)
            .collect()
            .await;
        let current: std::collections::HashSet<(&str, &str)> =
            listed.iter().map(|l| (l.key.as_str(), l.version.as_str())).collect();
        let mut known = self.checksums.lock().expect("never poisoned");
        known.retain(|(key, version), _| current.contains(&(key.as_str(), version.as_str())));
        for (object, answer) in answers {
            match answer {
                Ok(digest) => {
                    known.insert(object, digest);
                }
                Err(message) => {
                    tracing::debug!(source = %self.name, key = %object.0, %message, "cannot ask for the object's checksum")
                }
            }
        }
    }

    fn location(&self, key: &str) -> Path {
        match &self.prefix {
            Some(prefix) => Path::from(format!("{prefix}/{key}")),
            None => Path::from(key),
        }
    }

    fn error(&self, key: &str, error: object_store::Error) -> StorageError {
        let source_name = self.name.clone();
        match error {
            object_store::Error::NotFound { .. } => StorageError::NotFound { source_name, key: key.to_owned() },
            object_store::Error::Precondition { .. } => StorageError::Changed { source_name, key: key.to_owned() },
            object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
                StorageError::Refused { source_name, message: error.to_string() }
            }
            other => {
                let message = other.to_string();
                if REFUSALS.iter().any(|code| message.contains(code)) {
                    StorageError::Refused { source_name, message }
                } else {
                    StorageError::Unavailable { source_name, message }
                }
            }
        }
    }
}

impl Storage for S3Storage {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "s3"
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Listed>, StorageError>> {
        async move {
            let started = std::time::Instant::now();
            let metas: Vec<object_store::ObjectMeta> =
                self.store.list(self.prefix.as_ref()).try_collect().await.map_err(|e| match self.error("", e) {
                    // Listing a prefix never finds nothing: a 404 means the bucket is missing.
                    StorageError::NotFound { source_name, .. } => {
                        StorageError::Refused { source_name, message: "the bucket does not exist".into() }
                    }
                    other => other,
                })?;
            super::record_read("s3", "list", started, 0);
            let skip = self.prefix.as_ref().map_or(0, |p| p.as_ref().len() + 1);
            let mut listed: Vec<Listed> = metas
                .into_iter()
                .map(|m| Listed {
                    key: m.location.as_ref()[skip..].to_owned(),
                    size: m.size,
                    version: m.e_tag.unwrap_or_else(|| m.last_modified.to_rfc3339()),
                })
                .filter(|l| !l.key.split('/').any(|part| part.starts_with('.')))
                .collect();
            listed.sort_by(|a, b| a.key.cmp(&b.key));
            self.learn_checksums(&listed).await;
            Ok(listed)
        }
        .boxed()
    }

    fn content(&self, key: &str, version: &str) -> Content {
        let known = self.checksums.lock().expect("never poisoned");
        let sha256 = known.get(&(key.to_owned(), version.to_owned())).copied().flatten();
        Content { version: version.to_owned(), sha256 }
    }

    fn maps_files(&self) -> bool {
        false
    }

    fn read(
        &self,
        key: &str,
        range: ByteRange,
        version: &str,
        _intent: ReadIntent,
    ) -> BoxFuture<'_, Result<Read, StorageError>> {
        let key = key.to_owned();
        let version = version.to_owned();
        async move {
            let range = match range {
                ByteRange::Bounded(r) if r.is_empty() => {
                    // S3 has no empty range; nothing to fetch.
                    return Ok(Read {
                        size: 0,
                        range: r,
                        payload: Payload::Stream(futures_util::stream::empty().boxed()),
                    });
                }
                ByteRange::Bounded(r) => GetRange::Bounded(r),
                ByteRange::Suffix(n) => GetRange::Suffix(n),
            };
            let options = GetOptions { if_match: Some(version.clone()), range: Some(range), ..GetOptions::default() };
            let location = self.location(&key);
            let result = self.store.get_opts(&location, options).await.map_err(|e| self.error(&key, e))?;
            // A store that ignores If-Match is caught here.
            if result.meta.e_tag.as_deref().is_some_and(|tag| tag != version) {
                return Err(StorageError::Changed { source_name: self.name.clone(), key });
            }
            let (size, served): (u64, Range<u64>) = (result.meta.size, result.range.clone());
            let name = self.name.clone();
            let bytes = result
                .into_stream()
                .map(move |piece| {
                    piece.map_err(|e| StorageError::Unavailable { source_name: name.clone(), message: e.to_string() })
                })
                .boxed();
            Ok(Read { size, range: served, payload: Payload::Stream(bytes) })
        }
        .boxed()
    }
}
