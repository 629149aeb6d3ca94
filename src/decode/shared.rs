//! The shared decode of one component: every reader waits only for the chunks it needs, the
//! decoder goes no further than the furthest byte anyone asked for and parks there, and the
//! decoded bytes' SHA-256 is computed once the entry is complete and idle.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use futures_util::Stream;
use sha2::Digest as _;
use tokio::sync::{Semaphore, watch};

use super::DecodeError;
use super::cursor::{BLOCK, Cursor, Stop, record_failure};
use super::source::{Input, Stored};
use crate::format::Component;

/// Where a shared decode stands, as readers see it.
#[derive(Debug, Clone, Default)]
pub(super) struct SharedProgress {
    pub(super) produced: u64,
    pub(super) outcome: Option<Result<(), DecodeError>>,
}

pub(super) struct State {
    pub(super) chunks: Vec<Bytes>,
    /// Decoded offset where each chunk ends.
    pub(super) ends: Vec<u64>,
    pub(super) produced: u64,
    /// The furthest byte any reader asked for.
    pub(super) wanted: u64,
    pub(super) running: bool,
    pub(super) paused: Option<(Cursor, Input)>,
    pub(super) outcome: Option<Result<(), DecodeError>>,
}

/// The shared decode of one component: decoded chunks so far, and the decoder that continues
/// when a reader needs more.
pub(crate) struct Decoded {
    pub(super) object: String,
    pub(super) component: Component,
    pub(super) stored: Stored,
    pub(super) len: u64,
    pub(super) decoders: Arc<Semaphore>,
    /// Filled with the decoded bytes' SHA-256 once a decode completes; `None` where nobody
    /// reads it (a seekable part's frame: hashing every frame would compete with the response).
    pub(super) sha256: Option<Arc<OnceLock<[u8; 32]>>>,
    /// Decoded in one step when first wanted (a seekable part's frame, at most 16 MiB): one
    /// read and one decoder call, where a component is decoded and published piece by piece.
    pub(super) whole: bool,
    pub(super) state: Mutex<State>,
    pub(super) progress: watch::Sender<SharedProgress>,
    /// Readers and decoders at work on this entry: while any is, the cache keeps it.
    pub(super) holds: AtomicUsize,
    /// Set once the decoded bytes' digest is being computed.
    pub(super) hashing: std::sync::atomic::AtomicBool,
    /// Decoders started from the component's first stored byte: one per entry, however many
    /// readers come and however often it parks.
    pub(super) starts: AtomicUsize,
}

/// A reader's or a decoder's hold on an entry. The cache never evicts an entry that is held,
/// so the bytes someone is reading stay counted in the cache's bound. A hold is let go as soon
/// as its work is done (a reader's before its last piece is sent, a decoder's before it
/// announces the end), so a client that has all its bytes never finds the entry still held.
pub(crate) struct Hold(Arc<Decoded>);

impl Hold {
    pub(super) fn new(entry: &Arc<Decoded>) -> Hold {
        entry.holds.fetch_add(1, Ordering::SeqCst);
        Hold(Arc::clone(entry))
    }

    /// A hold on an entry no cache keeps: a decode private to its one reader, freed with it.
    pub(crate) fn alone(entry: Decoded) -> Hold {
        Hold::new(&Arc::new(entry))
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.0.holds.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.hash_when_idle();
        }
    }
}

impl std::ops::Deref for Hold {
    type Target = Arc<Decoded>;
    fn deref(&self) -> &Arc<Decoded> {
        &self.0
    }
}

impl Decoded {
    /// A decode of `component` (of `object`) from its `stored` bytes, not yet started.
    pub(crate) fn new(
        object: &str,
        component: &Component,
        stored: Stored,
        decoders: Arc<Semaphore>,
        sha256: Arc<OnceLock<[u8; 32]>>,
    ) -> Decoded {
        let state = State {
            chunks: Vec::new(),
            ends: Vec::new(),
            produced: 0,
            wanted: 0,
            running: false,
            paused: None,
            outcome: None,
        };
        Decoded {
            object: object.to_owned(),
            component: component.clone(),
            stored,
            len: component.decoded_length,
            decoders,
            sha256: Some(sha256),
            whole: false,
            state: Mutex::new(state),
            progress: watch::channel(SharedProgress::default()).0,
            holds: AtomicUsize::new(0),
            hashing: std::sync::atomic::AtomicBool::new(false),
            starts: AtomicUsize::new(0),
        }
    }

    /// The decode of one frame of a seekable part (`frame`, as the seek table describes it),
    /// done whole when first wanted.
    pub(crate) fn frame(object: &str, frame: &Component, stored: Stored, decoders: Arc<Semaphore>) -> Decoded {
        Decoded { sha256: None, whole: true, ..Decoded::new(object, frame, stored, decoders, Arc::default()) }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("decode state lock is never poisoned")
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(super) fn failed(&self) -> bool {
        matches!(self.lock().outcome, Some(Err(_)))
    }

    /// Whether the bytes up to `end` are decoded and can be served without decoding.
    pub(crate) fn covers(&self, end: u64) -> bool {
        let state = self.lock();
        if end < self.len { state.produced >= end } else { matches!(state.outcome, Some(Ok(()))) }
    }

    /// Makes sure the decoder runs until byte `end` (to the proved end of the encoding when
    /// `end` is the length). Must be called within the tokio runtime, by a holder.
    pub(super) fn want(self: &Arc<Self>, end: u64) {
        let mut state = self.lock();
        state.wanted = state.wanted.max(end);
        let more = state.produced < state.wanted || (state.wanted == self.len && state.outcome.is_none());
        if state.running || state.outcome.is_some() || !more {
            return;
        }
        state.running = true;
        drop(state);
        tokio::spawn(Arc::clone(self).drive(Hold::new(self)));
    }

    /// Runs the decoder until the furthest wanted byte, then parks it. Decoding happens on
    /// blocking threads under a decoder permit, and so does reading a local file (a `pread`
    /// of the next piece on the same thread); waiting for remote stored bytes happens here,
    /// holding no permit, so a slow store never keeps a decoder from other components. Once
    /// the last byte is decoded it goes on to the proved end of the encoding, so the entry
    /// never rests with every byte decoded and no outcome.
    async fn drive(self: Arc<Self>, hold: Hold) {
        if self.whole {
            return self.drive_whole(hold).await;
        }
        let paused = self.lock().paused.take();
        let (mut cursor, mut input) = match paused {
            Some(paused) => paused,
            None => match Cursor::new(&self.object, &self.component, BLOCK) {
                Ok(cursor) => {
                    let starts = self.starts.fetch_add(1, Ordering::SeqCst) + 1;
                    tracing::debug!(object = %self.object, component = %self.component.role, starts, "decoder started");
                    (cursor, Input::new(&self.stored))
                }
                Err(e) => return self.finish(Err(e.into())),
            },
        };
        loop {
            if input.starved() {
                if let Err(e) = input.fill(&self.stored).await {
                    return self.finish(Err(e.into()));
                }
            }
            let permit =
                Arc::clone(&self.decoders).acquire_owned().await.expect("the decoder semaphore is never closed");
            let entry = Arc::clone(&self);
            let stepped = tokio::task::spawn_blocking(move || {
                let stop = entry.decode_until_stop(&mut cursor, &mut input);
                (cursor, input, stop)
            })
            .await;
            drop(permit);
            let stop = match stepped {
                Ok((returned_cursor, returned_input, stop)) => {
                    (cursor, input) = (returned_cursor, returned_input);
                    stop
                }
                Err(e) => return self.finish(Err(DecodeError::Aborted(e.to_string()))),
            };
            match stop {
                Ok(None) => {
                    // Parked under the lock `want` checks, so a new want restarts it.
                    let mut state = self.lock();
                    if state.produced >= state.wanted && state.produced < self.len {
                        input.park();
                        state.paused = Some((cursor, input));
                        state.running = false;
                        return;
                    }
                }
                Ok(Some(Stop::Starved | Stop::Full)) => {}
                Ok(Some(Stop::Done)) => {
                    // Let go before announcing the end, so no reader can finish first and find
                    // the entry still held; then hash if the readers are already gone.
                    drop(hold);
                    self.finish(Ok(()));
                    tracing::debug!(object = %self.object, component = %self.component.role, "decoded to the end");
                    if self.holds.load(Ordering::SeqCst) == 0 {
                        self.hash_when_idle();
                    }
                    return;
                }
                Err(e) => return self.finish(Err(e)),
            }
        }
    }

    /// Reads and decodes the whole entry in one step on a blocking thread, under a decoder
    /// permit (a local file is read there too; remote bytes are fetched first, holding none).
    async fn drive_whole(self: Arc<Self>, hold: Hold) {
        self.starts.fetch_add(1, Ordering::SeqCst);
        metrics::counter!(crate::telemetry::names::DECODES_STARTED, "encoding" => "zstd").increment(1);
        let fetched = match &self.stored {
            Stored::Remote { .. } => match self.stored.fetch_from(0, "decode").await {
                Ok(bytes) => Some(bytes),
                Err(e) => return self.finish(Err(e.into())),
            },
            Stored::Whole(_) | Stored::File(_) => None,
        };
        let permit = Arc::clone(&self.decoders).acquire_owned().await.expect("the decoder semaphore is never closed");
        let entry = Arc::clone(&self);
        let decoded = tokio::task::spawn_blocking(move || {
            let stored = match fetched {
                Some(bytes) => bytes,
                None => entry.stored.read_blocking()?,
            };
            let decoded = crate::format::decode::decode_frame(&entry.object, &entry.component, &stored)?;
            metrics::counter!(crate::telemetry::names::DECODED_BYTES, "encoding" => "zstd")
                .increment(decoded.len() as u64);
            Ok::<_, DecodeError>(Bytes::from(decoded))
        })
        .await;
        drop(permit);
        let decoded = match decoded {
            Ok(Ok(decoded)) => decoded,
            Ok(Err(e)) => return self.finish(Err(e)),
            Err(e) => return self.finish(Err(DecodeError::Aborted(e.to_string()))),
        };
        {
            let mut state = self.lock();
            let produced = decoded.len() as u64;
            state.produced = produced;
            state.ends.push(produced);
            state.chunks.push(decoded);
            drop(state);
            self.progress.send_modify(|p| p.produced = produced);
        }
        drop(hold);
        self.finish(Ok(()));
    }

    /// Decodes and publishes chunk after chunk until nobody wants more (`None`), the input
    /// runs dry (remote bytes, awaited by the caller; a local file is read here), or the
    /// encoding ends.
    pub(super) fn decode_until_stop(
        &self,
        cursor: &mut Cursor,
        input: &mut Input,
    ) -> Result<Option<Stop>, DecodeError> {
        let span =
            tracing::debug_span!("decode", object = %self.object, component = %self.component.role, bytes = self.len);
        let _entered = span.enter();
        loop {
            {
                let state = self.lock();
                if state.produced >= state.wanted && state.produced < self.len {
                    return Ok(None);
                }
            }
            let (piece, stop) = cursor.next_piece(input, self.len)?;
            if !piece.is_empty() {
                let mut state = self.lock();
                state.produced += piece.len() as u64;
                let end = state.produced;
                state.ends.push(end);
                state.chunks.push(piece);
                drop(state);
                self.progress.send_modify(|p| p.produced = end);
            }
            if stop == Stop::Starved {
                if let Some(read) = input.read_here(&self.stored) {
                    read?;
                    continue;
                }
            }
            if stop != Stop::Full {
                return Ok(Some(stop));
            }
        }
    }

    /// Once a complete entry is idle (nobody reading it), computes the decoded bytes' SHA-256
    /// for `Repr-Digest`, under a decoder permit. Not while anyone reads: on a busy machine the
    /// hash would compete with the responses for the CPU, and it serves only later requests.
    pub(super) fn hash_when_idle(&self) {
        let Some(sha256) = &self.sha256 else { return };
        let complete = matches!(self.lock().outcome, Some(Ok(())));
        if !complete || sha256.get().is_some() || self.hashing.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let chunks = self.lock().chunks.clone();
        let (decoders, sha256) = (Arc::clone(&self.decoders), Arc::clone(sha256));
        runtime.spawn(async move {
            let Ok(permit) = decoders.acquire_owned().await else { return };
            let _ = tokio::task::spawn_blocking(move || {
                let mut hasher = sha2::Sha256::new();
                for chunk in &chunks {
                    hasher.update(chunk);
                }
                let _ = sha256.set(hasher.finalize().into());
                drop(permit);
            })
            .await;
        });
    }

    /// Publishes the outcome; a failed entry drops its bytes.
    pub(super) fn finish(&self, outcome: Result<(), DecodeError>) {
        if let Err(e) = &outcome {
            record_failure(e);
        }
        let mut state = self.lock();
        state.running = false;
        state.paused = None;
        if outcome.is_err() {
            state.chunks.clear();
        }
        state.outcome = Some(outcome.clone());
        drop(state);
        self.progress.send_modify(|p| p.outcome = Some(outcome));
    }

    /// The decoded bytes of `range`, as they are decoded, for the holder of `hold`. The piece
    /// holding the component's last byte is released only once the whole encoding is proved
    /// valid.
    pub(crate) fn stream(
        hold: Hold,
        range: Range<u64>,
    ) -> impl Stream<Item = Result<Bytes, DecodeError>> + Send + 'static {
        hold.want(range.end);
        let progress = hold.progress.subscribe();
        let len = hold.len;
        let end = range.end;
        futures_util::stream::unfold((Some(hold), progress, range.start), move |(hold, mut progress, at)| async move {
            let hold = hold.filter(|_| at < end)?;
            let seen = progress
                .wait_for(|p| {
                    matches!(p.outcome, Some(Err(_))) || (p.produced > at && (p.produced < len || p.outcome.is_some()))
                })
                .await
                .map(|p| p.outcome.clone());
            let failure = match seen {
                Ok(Some(Err(e))) => Some(e),
                Err(_) => Some(DecodeError::Aborted("decoder gone".into())),
                Ok(_) => None,
            };
            let piece = {
                let state = hold.lock();
                match (failure.as_ref(), &state.outcome) {
                    (Some(e), _) | (None, Some(Err(e))) => Err(e.clone()),
                    _ => {
                        let index = state.ends.partition_point(|&e| e <= at);
                        let chunk = &state.chunks[index];
                        let chunk_start = state.ends[index] - chunk.len() as u64;
                        let piece_end = end.min(state.ends[index]);
                        Ok(chunk.slice((at - chunk_start) as usize..(piece_end - chunk_start) as usize))
                    }
                }
            };
            match piece {
                Err(e) => Some((Err(e), (None, progress, end))),
                Ok(piece) => {
                    let next = at + piece.len() as u64;
                    // The hold goes with the last piece, before the client can have it.
                    let hold = (next < end).then_some(hold);
                    Some((Ok(piece), (hold, progress, next)))
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use futures_util::TryStreamExt as _;

    use super::*;
    use crate::decode::{ComponentKey, DecodeCache, stream_private};
    use crate::format::{ByteOrder, DType, Encoding};

    /// Compressible bytes and their zstd frame, as a component stored in memory.
    fn packed(len: usize) -> (Vec<u8>, Component, Stored) {
        let data: Vec<u8> = (0..len).map(|i| ((i / 7) % 251) as u8 ^ (i % 3) as u8).collect();
        let frame = zstd::encode_all(&data[..], 3).unwrap();
        let component = Component {
            role: "data".into(),
            dtype: DType::U8,
            logical_type: None,
            offset: 0,
            stored_length: frame.len() as u64,
            encoding: Encoding::Zstd,
            decoded_length: len as u64,
            digest: None,
            digest_scope: crate::format::DigestScope::Stored,
            byte_order: ByteOrder::Little,
            file: 0,
        };
        (data, component, Stored::Whole(Bytes::from(frame)))
    }

    fn key() -> ComponentKey {
        ComponentKey { model: "m".into(), version: "v".into(), object: "w".into(), role: "data".into(), frame: None }
    }

    fn shared(cache: &DecodeCache, component: &Component, stored: &Stored) -> Hold {
        cache
            .entry(&key(), component.decoded_length, |decoders| {
                Decoded::new("w", component, stored.clone(), decoders, Arc::default())
            })
            .expect("the cache holds it")
    }

    async fn read(hold: Hold, range: Range<u64>) -> Result<Vec<u8>, DecodeError> {
        let pieces: Vec<Bytes> = Decoded::stream(hold, range).try_collect().await?;
        Ok(pieces.concat())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_readers_share_one_decoder() {
        let (data, component, stored) = packed(3 << 20);
        let cache = DecodeCache::new(64 << 20, 2);
        let ranges = [0..data.len() as u64, 1000..2_000_000, (2 << 20)..(3 << 20), 0..1];
        let readers: Vec<_> =
            ranges.iter().map(|range| tokio::spawn(read(shared(&cache, &component, &stored), range.clone()))).collect();
        for (reader, range) in readers.into_iter().zip(&ranges) {
            let bytes = reader.await.unwrap().unwrap();
            assert!(bytes == data[range.start as usize..range.end as usize], "{range:?}");
        }
        let entry = shared(&cache, &component, &stored);
        assert_eq!(entry.starts.load(Ordering::SeqCst), 1, "one decoder for every reader");
        assert!(entry.covers(data.len() as u64));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_decoder_parks_at_the_furthest_byte_wanted_and_resumes_there_for_a_later_reader() {
        let (data, component, stored) = packed(8 << 20);
        let cache = DecodeCache::new(64 << 20, 2);
        let first = read(shared(&cache, &component, &stored), 0..100).await.unwrap();
        assert_eq!(first, data[..100]);
        let entry = shared(&cache, &component, &stored);
        // Parked: a little past the byte wanted, far from the end.
        assert!(entry.covers(100) && !entry.covers(4 << 20), "the decoder ran on past what was wanted");
        let tail = read(entry, (7 << 20)..(8 << 20)).await.unwrap();
        assert!(tail == data[7 << 20..], "the resumed decode delivered other bytes");
        let entry = shared(&cache, &component, &stored);
        assert_eq!(entry.starts.load(Ordering::SeqCst), 1, "resumed, not started again");
        assert!(entry.covers(8 << 20));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_truncated_frame_fails_every_reader_and_a_later_request_decodes_afresh() {
        let (_, component, stored) = packed(1 << 20);
        let Stored::Whole(frame) = &stored else { unreachable!() };
        // A frame cut short: zstd frames carry no checksum here, so a flipped byte could
        // decode to other bytes, but a missing end is always found.
        let broken = Stored::Whole(frame.slice(..frame.len() - 64));
        let cache = DecodeCache::new(64 << 20, 2);
        let (a, b) = tokio::join!(
            read(shared(&cache, &component, &broken), 0..(1 << 20)),
            read(shared(&cache, &component, &broken), 0..(1 << 20))
        );
        let failed = |r: &Result<Vec<u8>, DecodeError>| matches!(r, Err(DecodeError::Invalid(_)));
        assert!(failed(&a) && failed(&b), "a reader was served bytes of a truncated frame");
        assert_eq!(cache.held(), 1 << 20, "the failed entry is still counted until replaced");
        let retried = shared(&cache, &component, &stored);
        assert_eq!(retried.starts.load(Ordering::SeqCst), 0, "a failed entry is replaced, not reused");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_component_the_cache_cannot_hold_is_decoded_privately_for_each_range() {
        let (data, component, stored) = packed(2 << 20);
        let cache = DecodeCache::new(1 << 20, 1);
        let make = |decoders| Decoded::new("w", &component, stored.clone(), decoders, Arc::default());
        assert!(cache.entry(&key(), component.decoded_length, make).is_none(), "larger than the cache");
        for range in [0..(2 << 20), 5..6, (1 << 20)..(2 << 20), 300_000..1_700_000] {
            let decoders = Arc::clone(cache.decoders());
            let pieces: Vec<Bytes> =
                stream_private("w".into(), component.clone(), stored.clone(), range.clone(), decoders)
                    .try_collect()
                    .await
                    .unwrap();
            assert!(pieces.iter().all(|p| p.len() <= crate::decode::CHUNK), "one chunk at a time");
            assert!(pieces.concat() == data[range.start as usize..range.end as usize], "{range:?}");
        }
        assert_eq!(cache.held(), 0);
    }
}
