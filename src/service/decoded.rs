//! A component's decoded bytes: from the shared, cached decode when the cache can hold it, or
//! from a private decode for one request; and the admission of a new decode to the decoders,
//! which sheds a request rather than let every decode slow down.

use std::ops::Range;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt as _, StreamExt as _, TryStreamExt as _};

use super::ServiceError;
use super::bytes::storage_failed;
use super::representation::{ByteStream, RangeSource};
use crate::decode::{ComponentKey, DecodeCache, DecodeError, Decoded, Stored, stream_private};
use crate::format::Component;
use crate::telemetry::names;

/// A component's decoded bytes: from the shared, cached decode when the cache can hold it,
/// otherwise from a private decode for this request only. Chosen when the body is opened, so
/// HEAD and 304 answers reserve nothing.
pub(super) struct DecodedSource {
    pub(super) decoding: Arc<Decoding>,
    pub(super) source: Arc<crate::catalog::Source>,
    pub(super) key: ComponentKey,
    pub(super) component: Component,
    pub(super) stored: Stored,
    pub(super) sha256: Arc<std::sync::OnceLock<[u8; 32]>>,
}

impl RangeSource for DecodedSource {
    fn len(&self) -> u64 {
        self.component.decoded_length
    }

    /// One frame decodes from its start, whatever is wanted of it: every gap is read through.
    fn gap_worth_reading(&self) -> BoxFuture<'_, Result<u64, ServiceError>> {
        futures_util::future::ready(Ok(u64::MAX)).boxed()
    }

    fn open(&self, range: Range<u64>) -> ByteStream {
        let cache = &self.decoding.cache;
        let make = |decoders| {
            Decoded::new(&self.key.object, &self.component, self.stored.clone(), decoders, Arc::clone(&self.sha256))
        };
        let (model, source) = (self.key.model.clone(), Arc::clone(&self.source));
        let failed = move |e: DecodeError| match e {
            DecodeError::Invalid(invalid) => ServiceError::invalid(&model, invalid),
            DecodeError::Storage(e) => storage_failed(&source, &model, e),
            DecodeError::Aborted(reason) => ServiceError::Internal(reason),
        };
        let span = tracing::Span::current();
        match cache.entry(&self.key, self.len(), make) {
            Some(entry) => {
                let hit = entry.covers(range.end);
                metrics::counter!(if hit { names::CACHE_HITS } else { names::CACHE_MISSES }).increment(1);
                let outcome = if hit { CacheOutcome::Hit } else { CacheOutcome::Miss };
                span.record("cache", outcome.as_str());
                let body = Decoded::stream(entry, range).map(move |piece| piece.map_err(&failed)).boxed();
                if hit { body } else { self.admitted(body) }
            }
            None => {
                metrics::counter!(names::CACHE_MISSES).increment(1);
                span.record("cache", CacheOutcome::Bypass.as_str());
                let decoders = Arc::clone(cache.decoders());
                let body = stream_private(
                    self.key.object.clone(),
                    self.component.clone(),
                    self.stored.clone(),
                    range,
                    decoders,
                )
                .map(move |piece| piece.map_err(&failed))
                .boxed();
                self.admitted(body)
            }
        }
    }
}

impl DecodedSource {
    fn admitted(&self, body: ByteStream) -> ByteStream {
        self.decoding.admitted(body)
    }
}

/// What every decode shares: the decode cache with its decoders, and how long a new decode
/// waits for one.
pub(super) struct Decoding {
    pub cache: DecodeCache,
    pub wait: std::time::Duration,
}

impl Decoding {
    /// `body`, once a decoder has come free within `decode_wait_ms`; otherwise the error
    /// `DecodersBusy` (the body's first piece is taken before any header is sent, so it is a
    /// clean refusal). Decoders are taken one piece at a time, in turn, so this wait is the queue a
    /// new decode would join: when it stays full that long, shedding the request beats letting
    /// every decode slow down.
    pub(super) fn admitted(&self, body: ByteStream) -> ByteStream {
        let (decoders, wait) = (Arc::clone(self.cache.decoders()), self.wait);
        futures_util::stream::once(async move {
            match tokio::time::timeout(wait, decoders.acquire()).await {
                Ok(_free) => Ok(body),
                Err(_) => {
                    metrics::counter!(names::DECODE_REFUSALS).increment(1);
                    Err(ServiceError::DecodersBusy)
                }
            }
        })
        .try_flatten()
        .boxed()
    }
}

/// Where a request's decoded bytes came from, for its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheOutcome {
    /// The shared decode already held them.
    Hit,
    /// The shared decode had to produce them.
    Miss,
    /// Too large for the cache: decoded for this request alone.
    Bypass,
    /// Not decoded at all: the stored zstd frame was sent as it is.
    Passthrough,
}

impl CacheOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CacheOutcome::Hit => "hit",
            CacheOutcome::Miss => "miss",
            CacheOutcome::Bypass => "bypass",
            CacheOutcome::Passthrough => "passthrough",
        }
    }
}
