//! The HTTP side of `ztserve pull`: the model's manifest JSON (which lists its stored files),
//! then ranged GETs of each served file, every one after the first bound to the file's ETag
//! with `If-Range`, so a file replaced on the server mid-pull is
//! noticed (a 200 instead of a 206) instead of being mixed into the copy. Retries transient
//! failures with exponential backoff and jitter; refuses for good on other 4xx.

use std::ops::Range;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use reqwest::StatusCode;

use crate::storage::error_chain;
use reqwest::header::{self, HeaderMap};

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The file on the server is not the version this pull started from.
    #[error(
        "the model changed on the server during the pull (ETag {expected} is now {found}); run the pull again to start over"
    )]
    Changed { expected: String, found: String },
    /// Worth trying again: the network, a 5xx, a 408 or a 429, or a body that ended early.
    #[error("{message}")]
    Transient { message: String, retry_after: Option<Duration> },
    /// Trying again will not help.
    #[error("{0}")]
    Refused(String),
}

/// The start of a pull: the file's identity and first bytes.
#[derive(Debug, Clone)]
pub struct Probe {
    pub etag: String,
    pub len: u64,
    pub head: Bytes,
}

/// How retries back off.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts after the first.
    pub retries: u32,
    pub first_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy { retries: 5, first_delay: Duration::from_millis(200), max_delay: Duration::from_secs(10) }
    }
}

impl RetryPolicy {
    /// Exponential, capped, with up to 50% random jitter so many workers retrying after one
    /// outage do not arrive together; a server's `Retry-After` wins when it is longer.
    fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let exponential = self.first_delay.saturating_mul(1 << attempt.min(16)).min(self.max_delay);
        let jitter = exponential.mul_f64(rand_fraction() * 0.5);
        (exponential + jitter).max(retry_after.unwrap_or_default().min(self.max_delay.saturating_mul(3)))
    }
}

/// A cheap fraction in [0, 1) for jitter; not for anything that needs real randomness.
fn rand_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// One served file, fetched by ranges.
#[derive(Clone)]
pub struct Remote {
    client: reqwest::Client,
    url: reqwest::Url,
    token: Option<String>,
    policy: RetryPolicy,
}

impl Remote {
    pub fn new(
        url: reqwest::Url,
        token: Option<String>,
        policy: RetryPolicy,
        connections: usize,
    ) -> anyhow::Result<Remote> {
        let client = reqwest::Client::builder()
            .user_agent(concat!("ztserve-pull/", env!("CARGO_PKG_VERSION")))
            .pool_max_idle_per_host(connections)
            .connect_timeout(Duration::from_secs(10))
            // A stalled transfer fails and is retried rather than hanging the pull.
            .read_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .build()?;
        Ok(Remote { client, url, token, policy })
    }

    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }

    /// The same client (its connections, token and retries) for another URL.
    pub fn with_url(&self, url: reqwest::Url) -> Remote {
        Remote { url, ..self.clone() }
    }

    /// The URL's JSON body (the model's manifest), retried like any fetch.
    pub async fn json(&self) -> Result<serde_json::Value, FetchError> {
        self.with_retries(|| async {
            let mut request = self.client.get(self.url.clone());
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            let response =
                request.send().await.map_err(|e| transient(format!("GET {}: {}", self.url, error_chain(&e))))?;
            let (status, headers) = (response.status(), response.headers().clone());
            if status != StatusCode::OK {
                return Err(status_error(&self.url, status, &headers, response).await);
            }
            let body =
                response.bytes().await.map_err(|e| transient(format!("GET {}: {}", self.url, error_chain(&e))))?;
            serde_json::from_slice(&body)
                .map_err(|e| FetchError::Refused(format!("{} did not answer a manifest's JSON: {e}", self.url)))
        })
        .await
    }

    /// The file's ETag and length, and its first `head_len` bytes (fewer when it is shorter).
    pub async fn probe(&self, head_len: u64) -> Result<Probe, FetchError> {
        let (etag, len, head) = self.with_retries(|| self.get(0..head_len, None, true)).await?;
        Ok(Probe { etag, len, head })
    }

    /// Exactly the bytes in `range` of the version named by `etag`.
    pub async fn range(&self, range: Range<u64>, etag: &str) -> Result<Bytes, FetchError> {
        let (_, _, bytes) = self.with_retries(|| self.get(range.clone(), Some(etag), false)).await?;
        Ok(bytes)
    }

    async fn with_retries<T, F, Fut>(&self, mut attempt: F) -> Result<T, FetchError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, FetchError>>,
    {
        let mut tries = 0;
        loop {
            match attempt().await {
                Err(FetchError::Transient { message, retry_after }) if tries < self.policy.retries => {
                    let delay = self.policy.delay(tries, retry_after);
                    tracing::debug!(%message, ?delay, "retrying");
                    tries += 1;
                    tokio::time::sleep(delay).await;
                }
                Err(FetchError::Transient { message, .. }) if tries > 0 => {
                    return Err(FetchError::Transient {
                        message: format!("{message} (gave up after {} attempts)", tries + 1),
                        retry_after: None,
                    });
                }
                other => return other,
            }
        }
    }

    /// One ranged GET. `clamp` lets the range run past the end (for the probe).
    async fn get(
        &self,
        range: Range<u64>,
        etag: Option<&str>,
        clamp: bool,
    ) -> Result<(String, u64, Bytes), FetchError> {
        if range.is_empty() {
            return Err(FetchError::Refused("internal error: an empty range was requested".into()));
        }
        let mut request =
            self.client.get(self.url.clone()).header(header::RANGE, format!("bytes={}-{}", range.start, range.end - 1));
        if let Some(etag) = etag {
            request = request.header(header::IF_RANGE, etag);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| transient(format!("GET {}: {}", self.url, error_chain(&e))))?;
        let status = response.status();
        let headers = response.headers().clone();
        let found_etag = headers.get(header::ETAG).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        match status {
            StatusCode::PARTIAL_CONTENT => {}
            StatusCode::OK if etag.is_some() => {
                return Err(FetchError::Changed { expected: etag.unwrap_or_default().to_owned(), found: found_etag });
            }
            StatusCode::OK => {
                return Err(FetchError::Refused(format!(
                    "{} answered 200 to a Range request: it is not a ztserve file URL",
                    self.url
                )));
            }
            status => return Err(status_error(&self.url, status, &headers, response).await),
        }
        if found_etag.is_empty() || found_etag.starts_with("W/") {
            return Err(FetchError::Refused(format!(
                "{} sent no strong ETag; a pull cannot tell versions apart without one",
                self.url
            )));
        }
        if let Some(expected) = etag
            && expected != found_etag
        {
            return Err(FetchError::Changed { expected: expected.to_owned(), found: found_etag });
        }
        let content_range = headers.get(header::CONTENT_RANGE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let (served, total) = parse_content_range(content_range).ok_or_else(|| {
            FetchError::Refused(format!("{} sent an unusable Content-Range {content_range:?}", self.url))
        })?;
        let wanted = if clamp { range.start..range.end.min(total) } else { range.clone() };
        if served != wanted {
            return Err(FetchError::Refused(format!(
                "asked {} for bytes {range:?}, it sent {served:?} of {total}",
                self.url
            )));
        }
        let body = read_body(response, served.end - served.start)
            .await
            .map_err(|message| transient(format!("GET {} bytes {served:?}: {message}", self.url)))?;
        Ok((found_etag, total, body))
    }
}

fn transient(message: String) -> FetchError {
    FetchError::Transient { message, retry_after: None }
}

/// Reads exactly `len` bytes of body, into one buffer.
async fn read_body(mut response: reqwest::Response, len: u64) -> Result<Bytes, String> {
    let mut body = BytesMut::with_capacity(len as usize);
    while let Some(piece) = response.chunk().await.map_err(|e| error_chain(&e))? {
        if body.len() as u64 + piece.len() as u64 > len {
            return Err(format!("the body is longer than the {len} bytes announced"));
        }
        body.extend_from_slice(&piece);
    }
    if (body.len() as u64) < len {
        return Err(format!("the body ended after {} of {len} bytes", body.len()));
    }
    Ok(body.freeze())
}

/// `bytes START-END/TOTAL` as the served range and the total.
fn parse_content_range(text: &str) -> Option<(Range<u64>, u64)> {
    let (span, total) = text.strip_prefix("bytes ")?.split_once('/')?;
    let (start, end) = span.split_once('-')?;
    let (start, end, total): (u64, u64, u64) = (start.parse().ok()?, end.parse().ok()?, total.parse().ok()?);
    (start <= end && end < total).then_some((start..end + 1, total))
}

/// A failure status as an error: the server's own `{"error": {...}}` message when it sent one.
async fn status_error(
    url: &reqwest::Url,
    status: StatusCode,
    headers: &HeaderMap,
    response: reqwest::Response,
) -> FetchError {
    let retry_after = headers
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    // Error bodies are small JSON; a hostile server cannot make this read unbounded.
    let body = tokio::time::timeout(Duration::from_secs(10), response.bytes())
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let body = &body[..body.len().min(64 << 10)];
    let detail = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| Some(format!("{}: {}", v["error"]["code"].as_str()?, v["error"]["message"].as_str()?)))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_owned());
    let message = format!("GET {url}: {status}{}{detail}", if detail.is_empty() { "" } else { ": " });
    match status {
        StatusCode::UNAUTHORIZED => {
            FetchError::Refused(format!("{message} (set ZTSERVE_TOKEN to a token the server accepts)"))
        }
        StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS => FetchError::Transient { message, retry_after },
        status if status.is_server_error() => FetchError::Transient { message, retry_after },
        _ => FetchError::Refused(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_parse_only_when_well_formed() {
        assert_eq!(parse_content_range("bytes 0-7/100"), Some((0..8, 100)));
        assert_eq!(parse_content_range("bytes 99-99/100"), Some((99..100, 100)));
        for bad in ["bytes 5-4/100", "bytes 0-100/100", "bytes */100", "0-7/100", "bytes 0-7/x", ""] {
            assert_eq!(parse_content_range(bad), None, "{bad}");
        }
    }

    #[test]
    fn backoff_grows_is_capped_and_honours_retry_after() {
        let policy =
            RetryPolicy { retries: 9, first_delay: Duration::from_millis(100), max_delay: Duration::from_secs(2) };
        let first = policy.delay(0, None);
        assert!(first >= Duration::from_millis(100) && first <= Duration::from_millis(150), "{first:?}");
        let late = policy.delay(8, None);
        assert!(late >= Duration::from_secs(2) && late <= Duration::from_secs(3), "{late:?}");
        assert!(policy.delay(0, Some(Duration::from_secs(4))) >= Duration::from_secs(4));
    }
}
