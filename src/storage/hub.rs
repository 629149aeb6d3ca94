//! Hugging Face Hub repositories as a source (`hf://namespace/name[@revision]`): huggingface.co,
//! a mirror, or another ztserve's `/hf`, reached at `HF_ENDPOINT` with `HF_TOKEN`, as
//! `huggingface_hub` does. A listing resolves the revision to a commit (a commit id once and for
//! all; a branch or tag at every listing, the files listed again only when it moved) and lists
//! the repository's files at that commit through the tree API, following its `Link` pages. Keys
//! are the repo id then the file's path, so the repository is the model of the repo's id. A
//! file's version is its content's id (the LFS SHA-256, else the git blob id): a commit that
//! leaves a file unchanged leaves its version, and its cached blocks, as they were. A read is
//! one ranged GET of `resolve/{commit}/{path}` at a commit whose tree listed that version, so
//! its bytes cannot change; the answer's range and length are checked against the listing.
//! Rate limits (429, with `Retry-After`), 5xx and network failures are retried with backoff,
//! and a `Retry-After` too long to wait out in one request holds every request of the source
//! (rescans too) until it has passed; other refusals become precise source errors.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt as _, StreamExt as _};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap};

use super::{ByteRange, Content, Listed, Payload, Read, ReadIntent, Storage, StorageError, error_chain};

/// The public Hub, when neither the config nor `HF_ENDPOINT` names another.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The most bytes of one API answer (a listing page, a revision's info) read before it is
/// refused: a hostile or broken endpoint cannot make the server buffer without bound.
const MAX_API_BYTES: usize = 64 << 20;

/// The most tree pages one listing follows (the Hub pages 1,000 files at a time).
const MAX_TREE_PAGES: usize = 10_000;

/// The longest wait a `Retry-After` may impose on one request before the source is reported
/// unavailable instead (and nothing is sent until it has passed).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The longest quiet a `Retry-After` is taken to ask for (a hostile value cannot silence the
/// source for longer, nor overflow a clock).
const MAX_QUIET: Duration = Duration::from_secs(24 * 3600);

/// Characters escaped in a path segment of a request (a file's path keeps its `/`).
const SEGMENT: &AsciiSet =
    &CONTROLS.add(b' ').add(b'"').add(b'#').add(b'%').add(b'<').add(b'>').add(b'?').add(b'`').add(b'{').add(b'}');
const REVISION: &AsciiSet = &SEGMENT.add(b'/');

/// How to reach the Hub.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// `https://huggingface.co`, a mirror, or another ztserve's `…/hf`.
    pub endpoint: String,
    /// Sent as a bearer token to the endpoint (never to where it redirects: reqwest drops
    /// `Authorization` when a redirect leaves the host).
    pub token: Option<String>,
    pub connect_timeout: Duration,
    /// Longest wait for the next bytes of an answer.
    pub read_timeout: Duration,
    /// Retries of a request that failed for a reason worth retrying.
    pub retries: u32,
    /// CA certificates (a PEM bundle) trusted beside the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
}

impl HubOptions {
    /// The configured settings, else the variables `huggingface_hub` reads (`HF_ENDPOINT`,
    /// `HF_TOKEN`), looked up with `env`.
    pub fn from_config(config: &crate::config::HubSource, env: impl Fn(&str) -> Option<String>) -> HubOptions {
        let set = |value: Option<String>| value.filter(|v| !v.trim().is_empty());
        HubOptions {
            endpoint: config
                .endpoint
                .clone()
                .or_else(|| set(env("HF_ENDPOINT")))
                .unwrap_or_else(|| DEFAULT_ENDPOINT.into()),
            token: config.token.clone().or_else(|| set(env("HF_TOKEN"))),
            connect_timeout: Duration::from_secs(config.connect_timeout_secs),
            read_timeout: Duration::from_secs(config.read_timeout_secs),
            retries: config.retries,
            ca_file: config.ca_file.clone(),
        }
    }
}

/// One `hf://namespace/name[@revision]` source.
#[derive(Debug)]
pub struct HubStorage {
    name: String,
    repo: String,
    /// As configured (`main` when none was).
    revision: String,
    options: HubOptions,
    client: reqwest::Client,
    answers: Mutex<Answers>,
}

/// What the Hub has answered so far.
#[derive(Debug, Default)]
struct Answers {
    /// Until when the Hub asked not to be called (a `Retry-After` longer than a request may
    /// wait): nothing is sent before then.
    quiet_until: Option<std::time::Instant>,
    /// The last commit listed and its files.
    last: Option<(String, Vec<Listed>)>,
    /// For each file version listed (key and content id): a commit that has it, and its size.
    versions: HashMap<(String, String), (String, u64)>,
}

/// One entry of the tree API's answer.
#[derive(Debug, serde::Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    oid: Option<String>,
    #[serde(default)]
    lfs: Option<LfsEntry>,
}

#[derive(Debug, serde::Deserialize)]
struct LfsEntry {
    oid: String,
    size: u64,
}

/// Why one request failed: worth retrying (with the wait the server asked for), or not.
enum Failure {
    Retry { message: String, after: Option<Duration> },
    Final(StorageError),
}

impl HubStorage {
    /// The source `name` over repository `repo` at `revision` (`None`: `main`). Nothing is
    /// contacted yet.
    pub fn new(
        name: &str,
        repo: &str,
        revision: Option<&str>,
        options: &HubOptions,
    ) -> Result<HubStorage, StorageError> {
        let refused = |message: String| StorageError::Refused { source_name: name.to_owned(), message };
        let mut client = reqwest::Client::builder()
            .user_agent(concat!("ztserve/", env!("CARGO_PKG_VERSION"), "; hf_hub-compatible"))
            .connect_timeout(options.connect_timeout)
            .read_timeout(options.read_timeout);
        if let Some(file) = &options.ca_file {
            client =
                client.tls_certs_merge(super::ca_bundle(file, reqwest::Certificate::from_pem_bundle).map_err(refused)?);
        }
        let client = client.build().map_err(|e| refused(e.to_string()))?;
        Ok(HubStorage {
            name: name.to_owned(),
            repo: repo.to_owned(),
            revision: revision.unwrap_or("main").to_owned(),
            options: HubOptions { endpoint: options.endpoint.trim_end_matches('/').to_owned(), ..options.clone() },
            client,
            answers: Mutex::new(Answers::default()),
        })
    }

    fn refused(&self, message: String) -> StorageError {
        StorageError::Refused { source_name: self.name.clone(), message }
    }

    fn unavailable(&self, message: String) -> StorageError {
        StorageError::Unavailable { source_name: self.name.clone(), message }
    }

    /// Whether the configured revision is a commit id, which never moves.
    fn is_pinned(&self) -> bool {
        self.revision.len() == 40 && self.revision.bytes().all(|b| b.is_ascii_hexdigit())
    }

    fn api_url(&self, rest: &str) -> String {
        format!("{}/api/models/{}/{rest}", self.options.endpoint, self.repo)
    }

    /// Sends `request` (rebuilt for every attempt), retrying what is worth retrying with
    /// exponential backoff, or the server's `Retry-After` when it asks for longer. `judge` turns
    /// an answer that is not a success into the failure it is.
    async fn send(
        &self,
        what: &str,
        request: impl Fn() -> reqwest::RequestBuilder,
        judge: impl Fn(StatusCode, &HeaderMap) -> Option<StorageError>,
    ) -> Result<reqwest::Response, StorageError> {
        let mut attempt = 0u32;
        loop {
            let quiet_until = self.answers.lock().expect("never poisoned").quiet_until;
            if let Some(left) = quiet_until.and_then(|until| until.checked_duration_since(std::time::Instant::now())) {
                let message =
                    format!("{what}: not sent, the Hub asked for {} s more of quiet (Retry-After)", left.as_secs() + 1);
                return Err(self.unavailable(message));
            }
            let mut builder = request();
            if let Some(token) = &self.options.token {
                builder = builder.bearer_auth(token);
            }
            let failure = match builder.send().await {
                Err(e) => Failure::Retry { message: format!("{what}: {}", error_chain(&e)), after: None },
                Ok(response) if response.status().is_success() => return Ok(response),
                Ok(response) => self.failure(what, response.status(), response.headers(), &judge),
            };
            match failure {
                Failure::Final(error) => return Err(error),
                Failure::Retry { message, after } => {
                    if let Some(after) = after.filter(|after| *after > MAX_RETRY_AFTER) {
                        // Honoured by every request of this source, rescans included.
                        self.answers.lock().expect("never poisoned").quiet_until =
                            Some(std::time::Instant::now() + after.min(MAX_QUIET));
                        return Err(self.unavailable(message));
                    }
                    if attempt >= self.options.retries {
                        return Err(self.unavailable(message));
                    }
                    let backoff =
                        Duration::from_millis(100).saturating_mul(1 << attempt.min(6)).min(Duration::from_secs(5));
                    tracing::debug!(source = %self.name, %message, attempt, "retrying the Hub");
                    tokio::time::sleep(backoff.max(after.unwrap_or_default())).await;
                    attempt += 1;
                }
            }
        }
    }

    /// What an answer that is not a success means.
    fn failure(
        &self,
        what: &str,
        status: StatusCode,
        headers: &HeaderMap,
        judge: &impl Fn(StatusCode, &HeaderMap) -> Option<StorageError>,
    ) -> Failure {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
        let (code, said) = (text("x-error-code"), text("x-error-message"));
        let mut message = format!("{what}: {status}");
        for part in [code, said].into_iter().filter(|p| !p.is_empty()) {
            message = format!("{message}, {part}");
        }
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT
        {
            let after = text("retry-after").trim().parse::<u64>().ok().map(Duration::from_secs);
            if let Some(after) = after {
                message = format!("{message} (Retry-After {} s)", after.as_secs());
            }
            return Failure::Retry { message, after };
        }
        if let Some(error) = judge(status, headers) {
            return Failure::Final(error);
        }
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            message = format!("{message} (is HF_TOKEN set to a token that may read {}?)", self.repo);
        }
        Failure::Final(self.refused(message))
    }

    /// An API answer's JSON, read up to [`MAX_API_BYTES`].
    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        mut response: reqwest::Response,
    ) -> Result<T, StorageError> {
        let mut body = Vec::new();
        while let Some(piece) =
            response.chunk().await.map_err(|e| self.unavailable(format!("{what}: {}", error_chain(&e))))?
        {
            if body.len() + piece.len() > MAX_API_BYTES {
                return Err(self.refused(format!("{what}: the answer is over {MAX_API_BYTES} bytes")));
            }
            body.extend_from_slice(&piece);
        }
        serde_json::from_slice(&body).map_err(|e| self.refused(format!("{what}: not the Hub's JSON: {e}")))
    }

    /// The commit the configured revision names now.
    async fn resolve_revision(&self) -> Result<String, StorageError> {
        if self.is_pinned() {
            return Ok(self.revision.to_ascii_lowercase());
        }
        #[derive(serde::Deserialize)]
        struct Info {
            sha: String,
        }
        let url = self.api_url(&format!("revision/{}", utf8_percent_encode(&self.revision, REVISION)));
        let what = format!("GET {url}");
        let response = self.send(&what, || self.client.get(&url), |_, _| None).await?;
        let info: Info = self.json(&what, response).await?;
        if info.sha.len() != 40 || !info.sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.refused(format!("{what}: {:?} is not a commit id", info.sha)));
        }
        Ok(info.sha.to_ascii_lowercase())
    }

    /// Every file of the repository at `commit`, keyed under the repo id, in key order.
    async fn list_commit(&self, commit: &str) -> Result<Vec<Listed>, StorageError> {
        let mut url = reqwest::Url::parse(&self.api_url(&format!("tree/{commit}")))
            .map_err(|e| self.refused(format!("the endpoint {} is not a URL: {e}", self.options.endpoint)))?;
        url.query_pairs_mut().append_pair("recursive", "true");
        let mut listed = Vec::new();
        for _ in 0..MAX_TREE_PAGES {
            let what = format!("GET {url}");
            let response = self.send(&what, || self.client.get(url.clone()), |_, _| None).await?;
            let next = next_page(response.headers(), &url);
            let entries: Vec<TreeEntry> = self.json(&what, response).await?;
            for entry in entries.into_iter().filter(|e| e.kind == "file") {
                if entry.path.split('/').any(|part| part.is_empty() || part.starts_with('.') || part == "..") {
                    continue;
                }
                let (size, version) = match (entry.lfs, entry.oid) {
                    (Some(lfs), _) => (lfs.size, lfs.oid),
                    (None, Some(oid)) => (entry.size, oid),
                    (None, None) => return Err(self.refused(format!("{what}: {} has no oid", entry.path))),
                };
                listed.push(Listed { key: format!("{}/{}", self.repo, entry.path), size, version });
            }
            match next {
                Some(next) => url = next,
                None => {
                    listed.sort_by(|a, b| a.key.cmp(&b.key));
                    listed.dedup_by(|a, b| a.key == b.key);
                    return Ok(listed);
                }
            }
        }
        Err(self.refused(format!("the tree of {} at {commit} runs past {MAX_TREE_PAGES} pages", self.repo)))
    }

    /// `key`'s path in the repository.
    fn path_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.repo.as_str())?.strip_prefix('/')
    }
}

impl Storage for HubStorage {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "hf"
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Listed>, StorageError>> {
        async move {
            let started = std::time::Instant::now();
            let commit = self.resolve_revision().await?;
            let known = self.answers.lock().expect("never poisoned").last.clone();
            let listed = match known {
                Some((last, listed)) if last == commit => listed,
                _ => {
                    let listed = self.list_commit(&commit).await?;
                    let mut listings = self.answers.lock().expect("never poisoned");
                    for file in &listed {
                        listings.versions.insert((file.key.clone(), file.version.clone()), (commit.clone(), file.size));
                    }
                    if listings.last.as_ref().is_none_or(|(last, _)| *last != commit) {
                        tracing::info!(source = %self.name, %commit, files = listed.len(), "listed the repository at a new commit");
                    }
                    listings.last = Some((commit, listed.clone()));
                    listed
                }
            };
            super::record_read("hf", "list", started, 0);
            Ok(listed)
        }
        .boxed()
    }

    /// An LFS file's version is its oid, the SHA-256 of its content (64 hex digits); a small
    /// file's is its git blob id (40), which is not.
    fn content(&self, _key: &str, version: &str) -> Content {
        let mut digest = [0u8; 32];
        let sha256 =
            (version.len() == 64).then(|| hex::decode_to_slice(version, &mut digest).ok()).flatten().map(|()| digest);
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
            let not_found = || StorageError::NotFound { source_name: self.name.clone(), key: key.clone() };
            let path = self.path_of(&key).ok_or_else(not_found)?;
            let known =
                self.answers.lock().expect("never poisoned").versions.get(&(key.clone(), version.clone())).cloned();
            let Some((commit, size)) = known else {
                // Only a listing in this process says at which commit a version is.
                return Err(self.unavailable(format!("{key} at {version} has not been listed since the start")));
            };
            let wanted = match range {
                ByteRange::Bounded(r) if r.end > size || r.start > r.end => {
                    return Err(StorageError::OutOfRange {
                        source_name: self.name.clone(),
                        start: r.start,
                        end: r.end,
                    });
                }
                ByteRange::Bounded(r) => r,
                ByteRange::Suffix(n) => size.saturating_sub(n)..size,
            };
            if wanted.is_empty() {
                return Ok(Read {
                    size,
                    range: wanted,
                    payload: Payload::Stream(futures_util::stream::empty().boxed()),
                });
            }
            let url = format!(
                "{}/{}/resolve/{commit}/{}",
                self.options.endpoint,
                self.repo,
                utf8_percent_encode(path, SEGMENT)
            );
            let what = format!("GET {url}");
            let bytes = format!("bytes={}-{}", wanted.start, wanted.end - 1);
            let changed = || StorageError::Changed { source_name: self.name.clone(), key: key.clone() };
            let judge = |status: StatusCode, headers: &HeaderMap| match status {
                StatusCode::NOT_FOUND => {
                    // The commit is gone (another ztserve forgets a replaced version's commit):
                    // what was listed changed; a file missing at its own commit is not found.
                    let code = headers.get("x-error-code").and_then(|v| v.to_str().ok());
                    Some(if code == Some("RevisionNotFound") { changed() } else { not_found() })
                }
                StatusCode::RANGE_NOT_SATISFIABLE => Some(changed()),
                _ => None,
            };
            let response = self.send(&what, || self.client.get(&url).header(header::RANGE, &bytes), judge).await?;
            let served = match response.status() {
                StatusCode::PARTIAL_CONTENT => content_range(response.headers()),
                StatusCode::OK if wanted == (0..size) => response.content_length().map(|len| (0..len, len)),
                _ => None,
            };
            match served {
                Some((got, total)) if got == wanted && total == size => {}
                Some(_) => return Err(changed()),
                None => {
                    return Err(self.unavailable(format!("{what}: {} without the range asked for", response.status())));
                }
            }
            let name = self.name.clone();
            let stream = response.bytes_stream().map(move |piece| {
                piece.map_err(|e| StorageError::Unavailable { source_name: name.clone(), message: error_chain(&e) })
            });
            Ok(Read { size, range: wanted, payload: Payload::Stream(stream.boxed()) })
        }
        .boxed()
    }
}

/// A `206`'s `Content-Range: bytes a-b/total`, as the bytes served and the total.
fn content_range(headers: &HeaderMap) -> Option<(Range<u64>, u64)> {
    let value = headers.get(header::CONTENT_RANGE)?.to_str().ok()?;
    let (span, total) = value.strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let (first, last, total) = (first.parse::<u64>().ok()?, last.parse::<u64>().ok()?, total.parse().ok()?);
    (first <= last).then(|| (first..last + 1, total))
}

/// The next page of a listing: the `Link` header's `rel="next"` target, resolved against `url`.
fn next_page(headers: &HeaderMap, url: &reqwest::Url) -> Option<reqwest::Url> {
    headers.get_all(header::LINK).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).find_map(|link| {
        let (target, params) = link.trim().split_once(';')?;
        let is_next = params.split(';').any(|p| p.trim().replace(' ', "") == "rel=\"next\"" || p.trim() == "rel=next");
        let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        is_next.then(|| url.join(target).ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_the_next_link_relative_or_absolute() {
        let base = reqwest::Url::parse("http://h/hf/api/models/a/b/tree/c?recursive=true").unwrap();
        let mut headers = HeaderMap::new();
        headers
            .insert(header::LINK, "</hf/api/models/a/b/tree/c?recursive=true&cursor=x>; rel=\"next\"".parse().unwrap());
        assert_eq!(
            next_page(&headers, &base).unwrap().as_str(),
            "http://h/hf/api/models/a/b/tree/c?recursive=true&cursor=x"
        );
        headers.insert(
            header::LINK,
            "<https://x/y?cursor=2>; rel=\"prev\", <https://x/y?cursor=3>; rel=\"next\"".parse().unwrap(),
        );
        assert_eq!(next_page(&headers, &base).unwrap().as_str(), "https://x/y?cursor=3");
        headers.insert(header::LINK, "<https://x/y?cursor=2>; rel=\"prev\"".parse().unwrap());
        assert_eq!(next_page(&headers, &base), None);
    }

    #[test]
    fn content_ranges_are_read_strictly() {
        let at = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_RANGE, value.parse().unwrap());
            content_range(&headers)
        };
        assert_eq!(at("bytes 0-9/100"), Some((0..10, 100)));
        assert_eq!(at("bytes 9-0/100"), None);
        assert_eq!(at("bytes */100"), None);
        assert_eq!(at("items 0-9/100"), None);
    }
}
