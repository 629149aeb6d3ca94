//! A `zt.zstd-seekable/1` part served in O(range): its seek table is read once per version
//! (two small reads at the end of the part), and a range decodes only the frames it covers.
//! Each frame (16 MiB at most) is read and decoded whole in one step, straight into its own
//! buffer, and cached on its own in the shared decode cache, so every reader of
//! the part (every tensor-parallel rank, every range) shares one decode per frame; the frames
//! of a long read decode in parallel on the blocking pool, a few ahead of the one on the wire,
//! and are sent in order.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{FutureExt as _, StreamExt as _, TryStreamExt as _};

use super::ServiceError;
use super::decoded::Decoding;
use super::learnt::ComponentFacts;
use super::representation::{ByteStream, RangeSource};
use crate::decode::{ComponentKey, DecodeError, Decoded, Hold, Stored};
use crate::format::seekable::{SeekTable, TABLE_FOOTER_LEN, table_len};
use crate::format::{Component, Location};
use crate::telemetry::names;

/// Frames decoding ahead of the one being sent: enough to keep both cores of a small machine
/// busy while the wire drains, few enough that a request holds at most this many frames
/// (16 MiB each at most).
const FRAMES_AHEAD: usize = 4;

/// The decoded bytes of a seekable part.
pub(super) struct SeekableSource {
    pub decoding: Arc<Decoding>,
    pub source: Arc<crate::catalog::Source>,
    pub key: ComponentKey,
    pub component: Component,
    pub stored: Stored,
    pub facts: Arc<ComponentFacts>,
}

impl SeekableSource {
    /// The part's seek table, read and checked on first use.
    async fn table(&self) -> Result<Arc<SeekTable>, ServiceError> {
        let at = Location::component(&self.key.object, &self.component.role);
        let (stored, decoded_length) = (&self.stored, self.component.decoded_length);
        let model = &self.key.model;
        let read = |from: u64| async move {
            stored
                .fetch_from(from, "seek_table")
                .await
                .map_err(|e| super::bytes::storage_failed(&self.source, model, e))
        };
        let table = self
            .facts
            .seek_table
            .get_or_try_init(|| async {
                let len = stored.len();
                let footer = read(len.saturating_sub(TABLE_FOOTER_LEN)).await?;
                let table_len = table_len(&at, len, &footer).map_err(|e| ServiceError::invalid(model, e))?;
                let table = read(len - table_len).await?;
                let parsed =
                    SeekTable::parse(&at, &table, len, decoded_length).map_err(|e| ServiceError::invalid(model, e))?;
                Ok::<_, ServiceError>(Arc::new(parsed))
            })
            .await?;
        Ok(Arc::clone(table))
    }

    /// Decoded bytes `range` of frame `index` (within the frame): from the frame's shared,
    /// cached decode, or a private one when the cache cannot hold it.
    fn frame(&self, table: &SeekTable, index: usize, range: Range<u64>) -> ByteStream {
        let frame = table.frame_component(&self.component, index);
        let stored = self.stored.slice(table.stored(index));
        let key = ComponentKey { frame: Some(index), ..self.key.clone() };
        let cache = &self.decoding.cache;
        let (model, source) = (self.key.model.clone(), Arc::clone(&self.source));
        let failed = move |e: DecodeError| match e {
            DecodeError::Invalid(invalid) => ServiceError::invalid(&model, invalid),
            DecodeError::Storage(e) => super::bytes::storage_failed(&source, &model, e),
            DecodeError::Aborted(reason) => ServiceError::Internal(reason),
        };
        let make = |decoders| Decoded::frame(&self.key.object, &frame, stored.clone(), decoders);
        match cache.entry(&key, frame.decoded_length, make) {
            Some(entry) => {
                let hit = entry.covers(range.end);
                metrics::counter!(if hit { names::CACHE_HITS } else { names::CACHE_MISSES }).increment(1);
                Decoded::stream(entry, range).map(move |piece| piece.map_err(&failed)).boxed()
            }
            None => {
                metrics::counter!(names::CACHE_MISSES).increment(1);
                let private = Hold::alone(make(Arc::clone(cache.decoders())));
                Decoded::stream(private, range).map(move |piece| piece.map_err(&failed)).boxed()
            }
        }
    }
}

impl RangeSource for SeekableSource {
    fn len(&self) -> u64 {
        self.component.decoded_length
    }

    /// A gap shorter than a frame cannot hold a whole frame, so reading through it decodes
    /// nothing a wanted range does not touch.
    fn gap_worth_reading(&self) -> futures_util::future::BoxFuture<'_, Result<u64, ServiceError>> {
        async move { Ok(self.table().await?.frame_size().saturating_sub(1)) }.boxed()
    }

    fn open(&self, range: Range<u64>) -> ByteStream {
        let this = SeekableSource {
            decoding: Arc::clone(&self.decoding),
            source: Arc::clone(&self.source),
            key: self.key.clone(),
            component: self.component.clone(),
            stored: self.stored.clone(),
            facts: Arc::clone(&self.facts),
        };
        let body = async move {
            let table = this.table().await?;
            let frames = table.frames_for(range.clone());
            let this = Arc::new(this);
            // Each frame's wanted bytes, collected so later frames decode while earlier ones
            // are sent; `buffered` keeps the wire in order.
            let pieces = futures_util::stream::iter(frames)
                .map(move |index| {
                    let (this, table) = (Arc::clone(&this), Arc::clone(&table));
                    let decoded = table.decoded(index);
                    let within =
                        range.start.max(decoded.start) - decoded.start..range.end.min(decoded.end) - decoded.start;
                    async move { this.frame(&table, index, within).try_collect::<Vec<Bytes>>().await }
                })
                .buffered(FRAMES_AHEAD)
                .map_ok(|pieces| futures_util::stream::iter(pieces.into_iter().map(Ok)))
                .try_flatten();
            Ok::<_, ServiceError>(pieces)
        };
        self.decoding.admitted(futures_util::stream::once(body).try_flatten().boxed())
    }
}
