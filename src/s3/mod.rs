//! The S3-compatible read endpoint, on its own listener (`s3_endpoint.listen`), built on `s3s`
//! (the protocol: routing, XML, SigV4, errors), path-style, with two buckets ([`keys`]): the
//! loaders' (`s3_endpoint.bucket`), whose keys are what the Hub API lists of each model (its
//! safetensors files and the files beside it: config, tokenizer), so loaders that read S3
//! (vLLM's Run:ai streamer, boto3, s3fs, rclone, the aws CLI) read any model unchanged and
//! fetch its weights once; and the stored files' (`s3_endpoint.stored_bucket`), each model's
//! files as stored, for copying them exactly. It answers ListObjects (version 1, which rclone, the
//! aws CLI's `list-objects` and older Java and Hadoop clients use), ListObjectsV2, HeadObject,
//! GetObject (ranges, conditionals), HeadBucket and GetBucketLocation from the same service as
//! the HTTP routes; every other operation is `s3s`'s `NotImplemented`. With no tokens every
//! request is served and signatures are ignored; with tokens, requests must be SigV4-signed
//! with a token's S3 key and see only the models the token may read (others are `NoSuchKey`,
//! as absent models are on the HTTP routes).

mod error;
mod keys;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::Request;
use bytes::Bytes;
use futures_util::StreamExt as _;
use s3s::dto::{
    ChecksumMode, ChecksumType, CommonPrefix, ETag, ETagCondition, GetBucketLocationInput, GetBucketLocationOutput,
    GetObjectInput, GetObjectOutput, HeadBucketInput, HeadBucketOutput, HeadObjectInput, HeadObjectOutput,
    ListObjectsInput, ListObjectsOutput, ListObjectsV2Input, ListObjectsV2Output, Object, ObjectStorageClass,
    StreamingBlob, Timestamp,
};
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

use self::error::{internal_error, request_timeout, service_error};
use self::keys::{After, Holds, Key, Keys, Query};
use crate::access::{Access, Refused, Tokens, Verdict};
use crate::config::Config;
use crate::service::{ListedFile, PublishedFile, Service, ServiceError, StoredBytes};
use crate::transport::ClientIdentity;

/// The most keys one listing page holds, as on S3.
const MAX_KEYS: usize = 1000;

/// The router of the S3 endpoint over `service`, checking `tokens`, its buckets and limits as
/// `config` says: `s3s`'s service behind the same panic catching, concurrency limit, tracing
/// and metrics as every listener.
pub(crate) fn app(service: Arc<Service>, tokens: Arc<Tokens>, config: &Config) -> Router {
    let open = !tokens.required();
    let bucket = |name: String, holds: Holds| Bucket { name, holds, keys: Mutex::new(None) };
    let buckets = [
        bucket(config.s3_endpoint.bucket.clone(), Holds::Repository),
        bucket(config.s3_endpoint.stored_bucket(), Holds::Stored),
    ];
    let endpoint = Endpoint { service, tokens: Arc::clone(&tokens), buckets };
    let mut builder = s3s::service::S3ServiceBuilder::new(endpoint);
    if !open {
        builder.set_auth(TokenKeys(Arc::clone(&tokens)));
        builder.set_access(SignedOrIdentified(tokens));
    }
    let service = builder.build();
    let handled = axum::error_handling::HandleError::new(service, |e: s3s::HttpError| async move {
        tracing::error!(error = ?e, "the S3 endpoint failed a request");
        axum::http::StatusCode::INTERNAL_SERVER_ERROR
    });
    let router = Router::new().fallback_service(handled);
    let router = if open { router.layer(axum::middleware::map_request(unsigned)) } else { router };
    let refusals = crate::transport::Refusals { panicked: internal_error, timed_out: request_timeout };
    let labels = crate::transport::RouteLabels { routes: &[], unmatched: |_| "s3" };
    crate::transport::with_common_layers(router, config, labels, refusals)
}

/// With no tokens, every request is served as it comes: its signature, which no configured
/// secret could check, is dropped (clients with credentials configured sign by default).
async fn unsigned(mut request: Request) -> Request {
    request.headers_mut().remove(axum::http::header::AUTHORIZATION);
    if let Some(query) = request.uri().query().filter(|q| q.contains("X-Amz-Signature")) {
        let kept: Vec<&str> = query.split('&').filter(|p| !p.starts_with("X-Amz-")).collect();
        let path_and_query = match kept.is_empty() {
            true => request.uri().path().to_owned(),
            false => format!("{}?{}", request.uri().path(), kept.join("&")),
        };
        if let Ok(uri) = axum::http::Uri::builder().path_and_query(path_and_query).build() {
            *request.uri_mut() = uri;
        }
    }
    request
}

/// Tokens as S3 keys: `s3s` checks each signature with the secret found here.
struct TokenKeys(Arc<Tokens>);

#[async_trait::async_trait]
impl s3s::auth::S3Auth for TokenKeys {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<s3s::auth::SecretKey> {
        match self.0.s3_key(access_key) {
            Some((secret, _)) => Ok(s3s::auth::SecretKey::from(&*secret)),
            None => Err(access_of(Verdict::Invalid).expect_err("an invalid verdict is refused")),
        }
    }
}

/// Lets a request through to the operations, which decide what it may read, when it is signed
/// (`s3s` has checked the signature) or comes over a connection whose client certificate names
/// a listed identity; refuses it as `s3s` would otherwise.
struct SignedOrIdentified(Arc<Tokens>);

#[async_trait::async_trait]
impl s3s::access::S3Access for SignedOrIdentified {
    async fn check(&self, cx: &mut s3s::access::S3AccessContext<'_>) -> S3Result<()> {
        if cx.credentials().is_some() {
            return Ok(());
        }
        let client = cx.extensions_mut().get::<Arc<ClientIdentity>>().map(|c| c.names.clone());
        match self.0.identity_access(client.as_deref()) {
            Some(_) => Ok(()),
            None => Err(s3_error!(AccessDenied, "Signature is required")),
        }
    }
}

/// What `verdict` lets a request read, or its S3 error (the refusal counted).
fn access_of(verdict: Verdict) -> S3Result<Access> {
    verdict.access().map_err(|refused| match refused {
        Refused::Missing => s3_error!(AccessDenied, "requests must be signed with a token's S3 key"),
        Refused::Invalid => s3_error!(InvalidAccessKeyId, "no token has this access key id"),
    })
}

/// The S3 operations over the service.
struct Endpoint {
    service: Arc<Service>,
    tokens: Arc<Tokens>,
    /// The loaders' bucket, then the stored files'.
    buckets: [Bucket; 2],
}

/// One bucket of the endpoint.
struct Bucket {
    name: String,
    holds: Holds,
    /// The keys of the catalog last listed, rebuilt when the catalog changes.
    keys: Mutex<Option<Arc<Keys>>>,
}

impl Endpoint {
    /// What the request may read: everything when no tokens are configured, otherwise what
    /// its verified access key's token may (`s3s` has already refused a bad signature).
    fn access<T>(&self, request: &S3Request<T>) -> S3Result<Access> {
        let client = crate::transport::client_names(&request.extensions);
        let verdict = match &request.credentials {
            _ if self.tokens.identity_access(client).is_some() || !self.tokens.required() => {
                self.tokens.verdict(None, client)
            }
            None => Verdict::Missing,
            Some(credentials) => match self.tokens.s3_key(&credentials.access_key) {
                Some((_, access)) => Verdict::Allowed(access),
                None => Verdict::Invalid,
            },
        };
        access_of(verdict)
    }

    /// The bucket named `name`, once the catalog is ready.
    fn bucket(&self, name: &str) -> S3Result<&Bucket> {
        let Some(bucket) = self.buckets.iter().find(|b| b.name == name) else {
            let [loaders, stored] = &self.buckets;
            return Err(s3_error!(
                NoSuchBucket,
                "this endpoint serves the buckets {:?} (what loaders read) and {:?} (the stored files)",
                loaders.name,
                stored.name
            ));
        };
        if !self.service.is_ready() {
            return Err(service_error(ServiceError::NotReady));
        }
        Ok(bucket)
    }

    /// The current catalog's keys in `bucket`.
    fn keys(&self, bucket: &Bucket) -> Arc<Keys> {
        let listing = self.service.listing();
        let mut cached = bucket.keys.lock().expect("never poisoned");
        match &*cached {
            Some(keys) if keys.are_of(&listing) => Arc::clone(keys),
            _ => {
                let keys = Arc::new(Keys::build(listing, bucket.holds));
                *cached = Some(Arc::clone(&keys));
                keys
            }
        }
    }

    /// One page of the keys of `bucket` that `access` may read, as both listing operations
    /// answer it.
    fn page(
        &self,
        bucket: &Bucket,
        query: &Query,
        access: &Access,
        encoding: Option<&s3s::dto::EncodingType>,
    ) -> ListedPage {
        let url_encoded = encoding.is_some_and(|e| e.as_str() == s3s::dto::EncodingType::URL);
        let keys = self.keys(bucket);
        let listing = keys.listing();
        // A model its signature refuses is not listed, as a broken one is not.
        let refused = |id: &str| listing.get(id).is_some_and(|m| listing.refusal(m).is_some());
        let page = keys.list(query, |id| access.allows(id) && !refused(id));
        let encode = |text: &str| if url_encoded { url_encode(text) } else { text.to_owned() };
        let contents = page
            .contents
            .iter()
            .map(|key| Object {
                key: Some(encode(&key.key)),
                size: Some(key.size as i64),
                e_tag: Some(s3_etag(&key.etag)),
                last_modified: Some(Timestamp::from(key.model.found_at)),
                storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
                ..Object::default()
            })
            .collect();
        let common_prefixes = page.common_prefixes.iter().map(|p| CommonPrefix { prefix: Some(encode(p)) }).collect();
        ListedPage { contents, common_prefixes, next: page.next, url_encoded }
    }

    /// The bytes `key` of `bucket` serves, for a request that may read `access`, and the key's
    /// index in the keys it was found among.
    async fn object(&self, bucket: &Bucket, key: &str, access: &Access) -> S3Result<(Arc<Keys>, usize, StoredBytes)> {
        let keys = self.keys(bucket);
        let Some(index) = keys.index_of(key).filter(|&i| access.allows(&keys.at(i).model.id)) else {
            return Err(s3_error!(NoSuchKey, "no key {key:?}"));
        };
        let found = keys.at(index);
        let open = keys.listing().open(&found.model.id).await.map_err(service_error)?;
        let bytes = open.file_bytes(&found.published()).await.map_err(service_error)?;
        Ok((keys, index, bytes))
    }

    /// `x-amz-checksum-sha256` of a whole object whose request enabled checksums, when its
    /// digest is already known (the Hub API or an earlier request computed it): never waited
    /// for, as S3 clients do not need it to read.
    fn checksum(
        &self,
        mode: Option<&ChecksumMode>,
        keys: &Keys,
        key: &Key,
        etag: &str,
        answer: &Answer,
    ) -> Option<String> {
        let enabled = mode.is_some_and(|m| m.as_str() == ChecksumMode::ENABLED);
        if !enabled || answer.range.is_some() {
            return None;
        }
        let listed = key.listed();
        let listed = ListedFile { file: PublishedFile { etag: etag.to_owned(), ..listed.file }, ..listed };
        let digest = keys.listing().known_sha256(&listed)?;
        Some(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, digest))
    }

    /// The object `key` for a GET or HEAD: its bytes, and what its conditionals and range make
    /// of the answer.
    async fn settled(
        &self,
        bucket: &Bucket,
        key: &str,
        access: &Access,
        conditions: Conditions<'_>,
        range: Option<&s3s::dto::Range>,
    ) -> S3Result<(Arc<Keys>, usize, StoredBytes, Answer)> {
        let (keys, index, bytes) = self.object(bucket, key, access).await?;
        let answer = settle(keys.at(index), &bytes.etag, conditions, range, bytes.source.len())?;
        Ok((keys, index, bytes, answer))
    }
}

/// A listing page in S3's types, and where the next page starts.
struct ListedPage {
    contents: Vec<Object>,
    common_prefixes: Vec<CommonPrefix>,
    next: Option<After>,
    url_encoded: bool,
}

impl ListedPage {
    /// `text` as this listing writes keys and prefixes (`encoding-type=url` or as it is).
    fn encode(&self, text: &str) -> String {
        if self.url_encoded { url_encode(text) } else { text.to_owned() }
    }
}

/// The page size a listing asked for, at most [`MAX_KEYS`].
fn max_keys(asked: Option<i32>) -> S3Result<usize> {
    match asked {
        None => Ok(MAX_KEYS),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok((n as usize).min(MAX_KEYS)),
    }
}

/// Our ETag (quoted) as S3's.
fn s3_etag(etag: &str) -> ETag {
    ETag::Strong(etag.trim_matches('"').to_owned())
}

fn matches(condition: &ETagCondition, etag: &str) -> bool {
    match condition {
        ETagCondition::Any => true,
        ETagCondition::ETag(tag) => tag.value() == etag.trim_matches('"'),
    }
}

/// The conditional headers of a GetObject or HeadObject input: two s3s types with the same
/// fields.
macro_rules! conditions_of {
    ($input:expr) => {
        Conditions {
            if_match: $input.if_match.as_ref(),
            if_none_match: $input.if_none_match.as_ref(),
            if_modified_since: $input.if_modified_since.as_ref(),
            if_unmodified_since: $input.if_unmodified_since.as_ref(),
        }
    };
}

/// A GET's or HEAD's conditional headers.
struct Conditions<'a> {
    if_match: Option<&'a ETagCondition>,
    if_none_match: Option<&'a ETagCondition>,
    if_modified_since: Option<&'a Timestamp>,
    if_unmodified_since: Option<&'a Timestamp>,
}

/// What a GET or HEAD of one object answers, once its conditionals and range are settled.
struct Answer {
    range: Option<std::ops::Range<u64>>,
    len: u64,
}

/// Applies a GET's or HEAD's conditional headers (ETag and time) and range to `key`.
fn settle(
    key: &Key,
    etag: &str,
    conditions: Conditions<'_>,
    range: Option<&s3s::dto::Range>,
    len: u64,
) -> S3Result<Answer> {
    let Conditions { if_match, if_none_match, if_modified_since, if_unmodified_since } = conditions;
    let modified = Timestamp::from(key.model.found_at);
    let seconds = |t: &Timestamp| time::OffsetDateTime::from(t.clone()).unix_timestamp();
    if if_match.is_some_and(|c| !matches(c, etag))
        || (if_match.is_none() && if_unmodified_since.is_some_and(|t| seconds(&modified) > seconds(t)))
    {
        return Err(s3_error!(PreconditionFailed, "the object does not match the precondition"));
    }
    if if_none_match.is_some_and(|c| matches(c, etag))
        || (if_none_match.is_none() && if_modified_since.is_some_and(|t| seconds(&modified) <= seconds(t)))
    {
        return Err(S3Error::new(S3ErrorCode::NotModified));
    }
    let range = match range {
        None => None,
        Some(range) => Some(
            range
                .check(len)
                .map_err(|_| s3_error!(InvalidRange, "the range is not satisfiable for an object of {len} bytes"))?,
        ),
    };
    Ok(Answer { range, len })
}

#[async_trait::async_trait]
impl S3 for Endpoint {
    async fn list_objects(&self, request: S3Request<ListObjectsInput>) -> S3Result<S3Response<ListObjectsOutput>> {
        let access = self.access(&request)?;
        let input = request.input;
        let bucket = self.bucket(&input.bucket)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let delimiter = input.delimiter.clone().unwrap_or_default();
        // A marker that is a common prefix of this listing (a NextMarker we gave) resumes after
        // every key under it, as S3 does; any other resumes after that key.
        let after = input.marker.clone().filter(|m| !m.is_empty()).map(|marker| {
            let rolled_up = !delimiter.is_empty()
                && marker.strip_prefix(prefix.as_str()).and_then(|rest| rest.find(delimiter.as_str()))
                    == Some(marker.len() - prefix.len() - delimiter.len());
            if rolled_up { After::Prefix(marker) } else { After::Key(marker) }
        });
        let query = Query { prefix, delimiter, after, max_keys: max_keys(input.max_keys)? };
        let page = self.page(bucket, &query, &access, input.encoding_type.as_ref());
        // Sent whenever the page is truncated (S3 sends it only with a delimiter; clients take
        // it when present, else the last key).
        let next_marker = page.next.as_ref().map(|next| match next {
            After::Key(key) | After::Prefix(key) => page.encode(key),
        });
        let output = ListObjectsOutput {
            name: Some(bucket.name.clone()),
            prefix: Some(page.encode(&query.prefix)),
            delimiter: input.delimiter.as_deref().map(|d| page.encode(d)),
            marker: Some(input.marker.as_deref().map(|m| page.encode(m)).unwrap_or_default()),
            encoding_type: input.encoding_type.clone(),
            max_keys: Some(query.max_keys as i32),
            is_truncated: Some(page.next.is_some()),
            next_marker,
            contents: Some(page.contents),
            common_prefixes: (!page.common_prefixes.is_empty()).then_some(page.common_prefixes),
            ..ListObjectsOutput::default()
        };
        Ok(S3Response::new(output))
    }

    async fn list_objects_v2(
        &self,
        request: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let access = self.access(&request)?;
        let input = request.input;
        let bucket = self.bucket(&input.bucket)?;
        let after = match &input.continuation_token {
            Some(token) => Some(
                After::from_token(token)
                    .ok_or_else(|| s3_error!(InvalidArgument, "the continuation token provided is incorrect"))?,
            ),
            None => input.start_after.clone().map(After::Key),
        };
        let query = Query {
            prefix: input.prefix.clone().unwrap_or_default(),
            delimiter: input.delimiter.clone().unwrap_or_default(),
            after,
            max_keys: max_keys(input.max_keys)?,
        };
        let page = self.page(bucket, &query, &access, input.encoding_type.as_ref());
        let output = ListObjectsV2Output {
            name: Some(bucket.name.clone()),
            prefix: Some(page.encode(&query.prefix)),
            delimiter: input.delimiter.as_deref().map(|d| page.encode(d)),
            start_after: input.start_after.as_deref().map(|s| page.encode(s)),
            encoding_type: input.encoding_type.clone(),
            max_keys: Some(query.max_keys as i32),
            key_count: Some((page.contents.len() + page.common_prefixes.len()) as i32),
            is_truncated: Some(page.next.is_some()),
            continuation_token: input.continuation_token.clone(),
            next_continuation_token: page.next.as_ref().map(After::token),
            contents: Some(page.contents),
            common_prefixes: (!page.common_prefixes.is_empty()).then_some(page.common_prefixes),
            ..ListObjectsV2Output::default()
        };
        Ok(S3Response::new(output))
    }

    async fn head_object(&self, request: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        let access = self.access(&request)?;
        let input = request.input;
        let bucket = self.bucket(&input.bucket)?;
        let (keys, index, bytes, answer) =
            self.settled(bucket, &input.key, &access, conditions_of!(input), input.range.as_ref()).await?;
        let key = keys.at(index);
        let checksum = self.checksum(input.checksum_mode.as_ref(), &keys, key, &bytes.etag, &answer);
        let output = HeadObjectOutput {
            checksum_type: checksum.as_ref().map(|_| ChecksumType::from_static(ChecksumType::FULL_OBJECT)),
            checksum_sha256: checksum,
            accept_ranges: Some("bytes".into()),
            content_length: Some(answer.range.as_ref().map_or(answer.len, |r| r.end - r.start) as i64),
            content_range: answer.range.as_ref().map(|r| content_range(r, answer.len)),
            content_type: Some(content_type(&key.key)),
            e_tag: Some(s3_etag(&bytes.etag)),
            last_modified: Some(Timestamp::from(key.model.found_at)),
            ..HeadObjectOutput::default()
        };
        Ok(S3Response::new(output))
    }

    async fn get_object(&self, request: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let access = self.access(&request)?;
        let input = request.input;
        let bucket = self.bucket(&input.bucket)?;
        if input.part_number.is_some() {
            return Err(s3_error!(NotImplemented, "partNumber is not supported: objects are not multipart uploads"));
        }
        let (keys, index, bytes, answer) =
            self.settled(bucket, &input.key, &access, conditions_of!(input), input.range.as_ref()).await?;
        let key = keys.at(index);
        let range = answer.range.clone().unwrap_or(0..answer.len);
        let checksum = self.checksum(input.checksum_mode.as_ref(), &keys, key, &bytes.etag, &answer);
        let body = primed(bytes.source.open(range.clone())).await?;
        let output = GetObjectOutput {
            checksum_type: checksum.as_ref().map(|_| ChecksumType::from_static(ChecksumType::FULL_OBJECT)),
            checksum_sha256: checksum,
            body: Some(StreamingBlob::wrap(sync_wrapper::SyncStream::new(body))),
            accept_ranges: Some("bytes".into()),
            content_length: Some((range.end - range.start) as i64),
            content_range: answer.range.as_ref().map(|r| content_range(r, answer.len)),
            content_type: Some(content_type(&key.key)),
            e_tag: Some(s3_etag(&bytes.etag)),
            last_modified: Some(Timestamp::from(key.model.found_at)),
            ..GetObjectOutput::default()
        };
        Ok(S3Response::new(output))
    }

    async fn head_bucket(&self, request: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        self.access(&request)?;
        self.bucket(&request.input.bucket)?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        request: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.access(&request)?;
        self.bucket(&request.input.bucket)?;
        // us-east-1, whose location constraint is empty: the region clients sign for by default.
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }
}

/// `bytes first-last/len`.
fn content_range(range: &std::ops::Range<u64>, len: u64) -> String {
    format!("bytes {}-{}/{len}", range.start, range.end - 1)
}

fn content_type(key: &str) -> s3s::dto::ContentType {
    crate::format::view::media_type(key).parse().expect("a valid media type")
}

/// A key as `encoding-type=url` listings write it: every byte but unreserved ones and `/`
/// percent-encoded (botocore decodes with `unquote_plus`, so `+` must be encoded too).
fn url_encode(text: &str) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    const KEEP: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'/');
    utf8_percent_encode(text, KEEP).to_string()
}

/// Takes the body's first piece before the response starts, so a source that fails at once is
/// answered with its error; a later failure aborts the body before its end.
async fn primed(
    mut body: crate::service::ByteStream,
) -> S3Result<futures_util::stream::BoxStream<'static, Result<Bytes, std::io::Error>>> {
    let first = match body.next().await {
        None => None,
        Some(Err(e)) => return Err(service_error(e)),
        Some(Ok(first)) => Some(first),
    };
    let rest = body.map(|piece| {
        piece.map_err(|e| {
            tracing::warn!(error = %e, "S3 response body aborted");
            std::io::Error::other(e.to_string())
        })
    });
    Ok(futures_util::stream::iter(first.map(Ok)).chain(rest).boxed())
}
