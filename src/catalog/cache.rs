//! Decoded components in memory. A component that is not stored verbatim (zstd, or legacy
//! big-endian data) is decoded on request, a chunk at a time, off the async runtime and under a
//! bounded number of concurrent decoders. Each decode is shared: every request for a component
//! reads the one [`Decoded`] entry, waiting only for the chunks it needs, and the decoder goes
//! no further than the furthest byte anyone asked for. Entries live in a least-recently-used
//! cache bounded in bytes; an entry someone is reading is never evicted, so the bytes held
//! never exceed the bound. A component that cannot be held (larger than the cache, or no room
//! because everything is being read) is decoded privately per request with [`stream_private`],
//! holding one chunk at a time.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::{Buf as _, Bytes, BytesMut};
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt as _, TryStreamExt as _};
use sha2::Digest as _;
use tokio::sync::{Semaphore, watch};

use crate::format::decode::Decoder;
use crate::format::{Component, Encoding, FormatError};
use crate::storage::{ObjectVersion, StorageError};
use crate::telemetry::names;

/// Largest piece decoded and published at once: small enough that the first bytes of a
/// component reach the client after a fraction of a millisecond of decoding, large enough that
/// per-chunk bookkeeping is noise next to the decoding itself.
pub const CHUNK: usize = 256 << 10;

/// One component of one version of a file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ComponentKey {
    pub model: String,
    /// The stored object's version (a file's identity, an ETag).
    pub version: String,
    pub object: String,
    pub role: String,
}

/// Why decoded bytes cannot be delivered.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Invalid(#[from] FormatError),
    /// The stored bytes could not be read (a remote store failed or the object changed).
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("the decoder stopped unexpectedly: {0}")]
    Aborted(String),
}

/// Where a component's stored bytes come from.
#[derive(Debug, Clone)]
pub enum Stored {
    /// All of them in memory. Never a slice of a file's mapping: see [`Stored::File`].
    Whole(Bytes),
    /// `range` of an open local file (`key` of `source_name`), copied out with `pread` as it
    /// is consumed, never loaded from the file's mapping, so a file truncated in place fails
    /// the read instead of raising SIGBUS (see `storage::local::MappedFile::open`).
    File { file: Arc<std::fs::File>, source_name: String, key: String, range: Range<u64> },
    /// `range` of an object version, read as the decoder consumes it.
    Remote { object: ObjectVersion, range: Range<u64> },
}

impl Stored {
    pub fn len(&self) -> u64 {
        match self {
            Stored::Whole(bytes) => bytes.len() as u64,
            Stored::File { range, .. } | Stored::Remote { range, .. } => range.end - range.start,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stored bytes from offset `from` on, as they are read (for `purpose` in metrics).
    /// A read that ends early is an error, never a short success.
    pub fn stream(&self, from: u64, purpose: &'static str) -> BoxStream<'static, Result<Bytes, StorageError>> {
        match self {
            Stored::Whole(bytes) => {
                let rest = bytes.slice((from as usize).min(bytes.len())..);
                futures_util::stream::iter((!rest.is_empty()).then_some(Ok(rest))).boxed()
            }
            Stored::File { file, source_name, key, range } => {
                crate::storage::local::pread_stream(Arc::clone(file), range.start + from..range.end, source_name, key)
                    .inspect_ok(move |piece| crate::storage::record_bytes("local", purpose, piece.len() as u64))
                    .boxed()
            }
            Stored::Remote { object, range } => object.stream(range.start + from..range.end, purpose),
        }
    }

    /// The source named in errors about these bytes.
    fn source_name(&self) -> &str {
        match self {
            Stored::Whole(_) => "memory",
            Stored::File { source_name, .. } => source_name,
            Stored::Remote { object, .. } => object.storage.name(),
        }
    }
}

/// A decoder's input: stored bytes received and not yet consumed, and the read that brings
/// more. Nothing ahead of the decoder is kept beyond the piece in hand, so decoding a
/// remote component holds one network piece, not the component.
struct Input {
    pieces: VecDeque<Bytes>,
    /// Stored bytes received so far, from the component's start.
    received: u64,
    total: u64,
    reading: Option<BoxStream<'static, Result<Bytes, StorageError>>>,
}

impl Input {
    fn new(stored: &Stored) -> Input {
        match stored {
            Stored::Whole(bytes) => Input {
                pieces: VecDeque::from([bytes.clone()]),
                received: bytes.len() as u64,
                total: bytes.len() as u64,
                reading: None,
            },
            Stored::File { .. } | Stored::Remote { .. } => Input { total: stored.len(), ..Input::empty() },
        }
    }

    /// No input at all (a decode that has ended).
    fn empty() -> Input {
        Input { pieces: VecDeque::new(), received: 0, total: 0, reading: None }
    }

    /// Whether more stored bytes must arrive before the decoder can go on.
    fn starved(&self) -> bool {
        self.pieces.is_empty() && self.received < self.total
    }

    /// Waits for the next piece, opening a read from where the input stands when none is open.
    async fn fill(&mut self, stored: &Stored) -> Result<(), StorageError> {
        if matches!(stored, Stored::Whole(_)) {
            return Ok(());
        }
        let reading = self.reading.get_or_insert_with(|| stored.stream(self.received, "decode"));
        match reading.next().await {
            Some(Ok(piece)) => {
                self.received += piece.len() as u64;
                self.pieces.push_back(piece);
                Ok(())
            }
            Some(Err(e)) => {
                self.reading = None;
                Err(e)
            }
            None => {
                self.reading = None;
                Err(StorageError::Unavailable {
                    source_name: stored.source_name().to_owned(),
                    message: "the read of a component's stored bytes ended early".into(),
                })
            }
        }
    }

    /// Closes the read while the decoder is parked; it reopens where it stopped.
    fn park(&mut self) {
        self.reading = None;
    }

    fn front(&self) -> &[u8] {
        self.pieces.front().map_or(&[], |piece| &piece[..])
    }

    fn consume(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let front = self.pieces.front_mut().expect("consumed bytes came from the front piece");
        front.advance(n);
        if front.is_empty() {
            self.pieces.pop_front();
        }
    }
}

/// Where a decoding step stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The piece is full; more may follow.
    Full,
    /// The input ran dry before the piece was full; more stored bytes are on their way.
    Starved,
    /// The whole encoding has been consumed and proved complete.
    Done,
}

fn encoding_label(component: &Component) -> &'static str {
    match component.encoding {
        Encoding::Zstd => "zstd",
        Encoding::Raw => "byteswap",
    }
}

/// Decoded pieces are cut from blocks this large: one allocation per 16 pieces.
const BLOCK: usize = 16 * CHUNK;

/// A decoder partway through a component's stored bytes.
struct Cursor {
    decoder: Decoder,
    encoding: &'static str,
    /// The unused rest of the current block; each piece is split off its front.
    block: BytesMut,
    /// The next block, being made ready on another thread.
    next_block: Option<std::sync::mpsc::Receiver<BytesMut>>,
    /// Bytes per block: [`BLOCK`] for a cached decode, whose chunks stay together; [`CHUNK`]
    /// for a private one, whose pieces are freed as they are sent (a larger block would live
    /// until its last piece is sent, and one more would be made ready).
    block_len: usize,
}

/// A zeroed block whose pages have all been touched. The kernel zeroes an anonymous page on
/// its first touch; done on the decoder's thread, that made a cold decode-and-serve of a
/// 256 MiB component a fifth slower on a 2-core machine (the cold zstd row of bench/run), so
/// the decoder takes blocks touched ahead of time on a blocking-pool thread.
fn touched_block(len: usize) -> BytesMut {
    let mut block = BytesMut::zeroed(len);
    for page in (0..len).step_by(4096) {
        block[page] = 0;
    }
    // The stores must happen even though the allocator promised zeroes.
    std::hint::black_box(&mut block[..]);
    block
}

impl Cursor {
    fn new(object: &str, component: &Component, block_len: usize) -> Result<Cursor, FormatError> {
        let decoder = Decoder::new(object, component)?;
        metrics::counter!(names::DECODES_STARTED, "encoding" => encoding_label(component)).increment(1);
        Ok(Cursor { decoder, encoding: encoding_label(component), block: BytesMut::new(), next_block: None, block_len })
    }

    /// Decodes the next piece (at most [`CHUNK`] bytes) from `input`. [`Stop::Done`] once the
    /// whole encoding has been consumed and proved complete; the last bytes come with it or
    /// before it.
    fn next_piece(&mut self, input: &mut Input, declared: u64) -> Result<(Bytes, Stop), FormatError> {
        // 16 bytes past the declared end let an over-long encoding show itself.
        let left = declared - self.decoder.produced();
        let room = usize::try_from(left.saturating_add(16)).unwrap_or(usize::MAX);
        let size = room.min(CHUNK);
        if self.block.len() < size {
            // Never more than the component can still need, so small components stay small.
            let len = room.min(self.block_len);
            let ready = self.next_block.take().and_then(|next| next.recv().ok()).filter(|b| b.len() >= size);
            self.block = ready.unwrap_or_else(|| BytesMut::zeroed(len));
            let after = room.saturating_sub(self.block.len()).min(self.block_len);
            if after > 0 && self.block_len > CHUNK {
                self.next_block = prepare_block(after);
            }
        }
        let buffer = &mut self.block[..size];
        let mut filled = 0;
        let mut stop = Stop::Full;
        while size - filled >= 16 {
            let progress = self.decoder.decode(input.front(), &mut buffer[filled..])?;
            input.consume(progress.consumed);
            filled += progress.written;
            if progress.consumed == 0 && progress.written == 0 && input.pieces.is_empty() {
                if input.starved() {
                    stop = Stop::Starved;
                } else {
                    self.decoder.finish()?;
                    stop = Stop::Done;
                }
                break;
            }
        }
        metrics::counter!(names::DECODED_BYTES, "encoding" => self.encoding).increment(filled as u64);
        Ok((self.block.split_to(filled).freeze(), stop))
    }
}

/// Starts making a block ready on the blocking pool; `None` outside a runtime.
fn prepare_block(len: usize) -> Option<std::sync::mpsc::Receiver<BytesMut>> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let (ready, receiver) = std::sync::mpsc::sync_channel(1);
    runtime.spawn_blocking(move || ready.send(touched_block(len)));
    Some(receiver)
}

fn record_failure(error: &DecodeError) {
    // Storage failures are the source's, counted and logged where the request fails.
    if !matches!(error, DecodeError::Storage(_)) {
        metrics::counter!(names::DECODE_FAILURES).increment(1);
        tracing::warn!(error = %error, "decoding failed");
    }
}

/// Where a shared decode stands, as readers see it.
#[derive(Debug, Clone, Default)]
struct SharedProgress {
    produced: u64,
    outcome: Option<Result<(), DecodeError>>,
}

struct State {
    chunks: Vec<Bytes>,
    /// Decoded offset where each chunk ends.
    ends: Vec<u64>,
    produced: u64,
    /// The furthest byte any reader asked for.
    wanted: u64,
    running: bool,
    paused: Option<(Cursor, Input)>,
    outcome: Option<Result<(), DecodeError>>,
}

/// The shared decode of one component: decoded chunks so far, and the decoder that continues
/// when a reader needs more.
pub struct Decoded {
    object: String,
    component: Component,
    stored: Stored,
    len: u64,
    decoders: Arc<Semaphore>,
    /// Filled with the decoded bytes' SHA-256 once a decode completes.
    sha256: Arc<OnceLock<[u8; 32]>>,
    state: Mutex<State>,
    progress: watch::Sender<SharedProgress>,
    /// Readers and decoders at work on this entry: while any is, the cache keeps it.
    holds: AtomicUsize,
    /// Set once the decoded bytes' digest is being computed.
    hashing: std::sync::atomic::AtomicBool,
}

/// A reader's or a decoder's hold on an entry. The cache never evicts an entry that is held,
/// so the bytes someone is reading stay counted in the cache's bound. A hold is let go as soon
/// as its work is done (a reader's before its last piece is sent, a decoder's before it
/// announces the end), so a client that has all its bytes never finds the entry still held.
pub struct Hold(Arc<Decoded>);

impl Hold {
    fn new(entry: &Arc<Decoded>) -> Hold {
        entry.holds.fetch_add(1, Ordering::SeqCst);
        Hold(Arc::clone(entry))
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
    pub fn new(
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
            sha256,
            state: Mutex::new(state),
            progress: watch::channel(SharedProgress::default()).0,
            holds: AtomicUsize::new(0),
            hashing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("decode state lock is never poisoned")
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn failed(&self) -> bool {
        matches!(self.lock().outcome, Some(Err(_)))
    }

    /// Whether the bytes up to `end` are decoded and can be served without decoding.
    pub fn covers(&self, end: u64) -> bool {
        let state = self.lock();
        if end < self.len { state.produced >= end } else { matches!(state.outcome, Some(Ok(()))) }
    }

    /// Makes sure the decoder runs until byte `end` (to the proved end of the encoding when
    /// `end` is the length). Must be called within the tokio runtime, by a holder.
    fn want(self: &Arc<Self>, end: u64) {
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
    /// blocking threads under a decoder permit; waiting for remote stored bytes happens here,
    /// holding no permit, so a slow store never keeps a decoder from other components. Once
    /// the last byte is decoded it goes on to the proved end of the encoding, so the entry
    /// never rests with every byte decoded and no outcome.
    async fn drive(self: Arc<Self>, hold: Hold) {
        let paused = self.lock().paused.take();
        let (mut cursor, mut input) = match paused {
            Some(paused) => paused,
            None => match Cursor::new(&self.object, &self.component, BLOCK) {
                Ok(cursor) => (cursor, Input::new(&self.stored)),
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
                Err(e) => return self.finish(Err(e.into())),
            }
        }
    }

    /// Decodes and publishes chunk after chunk until nobody wants more (`None`), the input
    /// runs dry, or the encoding ends.
    fn decode_until_stop(&self, cursor: &mut Cursor, input: &mut Input) -> Result<Option<Stop>, FormatError> {
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
            if stop != Stop::Full {
                return Ok(Some(stop));
            }
        }
    }

    /// Once a complete entry is idle (nobody reading it), computes the decoded bytes' SHA-256
    /// for `Repr-Digest`, under a decoder permit. Not while anyone reads: on a busy machine the
    /// hash would compete with the responses for the CPU, and it serves only later requests.
    fn hash_when_idle(&self) {
        let complete = matches!(self.lock().outcome, Some(Ok(())));
        if !complete || self.sha256.get().is_some() || self.hashing.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let chunks = self.lock().chunks.clone();
        let (decoders, sha256) = (Arc::clone(&self.decoders), Arc::clone(&self.sha256));
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
    fn finish(&self, outcome: Result<(), DecodeError>) {
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
    pub fn stream(hold: Hold, range: Range<u64>) -> impl Stream<Item = Result<Bytes, DecodeError>> + Send + 'static {
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

/// A private decode's position.
struct Walk {
    cursor: Option<Cursor>,
    input: Input,
    produced: u64,
    /// The overlap of the piece that ends the component, held until the encoding is proved
    /// complete.
    last: Option<Bytes>,
    finished: bool,
}

/// What one private decoding step produced.
enum Private {
    Piece(Bytes),
    NeedInput,
    End,
}

/// Decodes `range` of a component for one reader, one chunk at a time, keeping nothing:
/// for components the cache cannot hold. Bytes before the range are decoded and dropped; no
/// decoder or thread is held while the reader is slow to take the next piece, or while
/// remote stored bytes are on their way.
pub fn stream_private(
    object: String,
    component: Component,
    stored: Stored,
    range: Range<u64>,
    decoders: Arc<Semaphore>,
) -> impl Stream<Item = Result<Bytes, DecodeError>> + Send + 'static {
    let walk = Walk { cursor: None, input: Input::new(&stored), produced: 0, last: None, finished: range.is_empty() };
    let shared = Arc::new((object, component, stored, decoders, range));
    futures_util::stream::unfold(walk, move |mut walk| {
        let shared = Arc::clone(&shared);
        async move {
            loop {
                if walk.finished {
                    return None;
                }
                if walk.input.starved() {
                    if let Err(e) = walk.input.fill(&shared.2).await {
                        let error = DecodeError::Storage(e);
                        record_failure(&error);
                        walk.finished = true;
                        return Some((Err(error), walk));
                    }
                }
                let permit =
                    Arc::clone(&shared.3).acquire_owned().await.expect("the decoder semaphore is never closed");
                let shared = Arc::clone(&shared);
                let stepped = tokio::task::spawn_blocking(move || {
                    let (object, component, _, _, range) = &*shared;
                    let result = next_private_piece(&mut walk, object, component, range);
                    drop(permit);
                    (walk, result)
                })
                .await;
                match stepped {
                    Ok((next, Ok(Private::Piece(piece)))) => return Some((Ok(piece), next)),
                    Ok((next, Ok(Private::NeedInput))) => walk = next,
                    Ok((_, Ok(Private::End))) => return None,
                    Ok((mut next, Err(e))) => {
                        record_failure(&e);
                        next.finished = true;
                        return Some((Err(e), next));
                    }
                    Err(e) => {
                        let error = DecodeError::Aborted(e.to_string());
                        record_failure(&error);
                        return Some((Err(error), Walk::done()));
                    }
                }
            }
        }
    })
}

impl Walk {
    fn done() -> Walk {
        Walk { cursor: None, input: Input::empty(), produced: 0, last: None, finished: true }
    }
}

/// Decodes until a piece overlaps `range` and returns that overlap; the piece that ends the
/// component comes only after the encoding is proved complete.
fn next_private_piece(
    walk: &mut Walk,
    object: &str,
    component: &Component,
    range: &Range<u64>,
) -> Result<Private, DecodeError> {
    let len = component.decoded_length;
    let cursor = match &mut walk.cursor {
        Some(cursor) => cursor,
        None => walk.cursor.insert(Cursor::new(object, component, CHUNK)?),
    };
    loop {
        if walk.last.is_some() {
            // Everything is decoded: drain to the proved end before the last piece goes.
            let (rest, stop) = cursor.next_piece(&mut walk.input, len)?;
            debug_assert!(rest.is_empty(), "the decoder refuses bytes past the declared length");
            match stop {
                Stop::Done => {
                    walk.finished = true;
                    return Ok(Private::Piece(walk.last.take().expect("checked")));
                }
                Stop::Starved => return Ok(Private::NeedInput),
                Stop::Full => continue,
            }
        }
        let (piece, stop) = cursor.next_piece(&mut walk.input, len)?;
        let start = walk.produced;
        walk.produced += piece.len() as u64;
        let (low, high) = (range.start.max(start), range.end.min(walk.produced));
        if low < high {
            let overlap = piece.slice((low - start) as usize..(high - start) as usize);
            if high == len && stop != Stop::Done {
                walk.last = Some(overlap);
                continue;
            }
            if high >= range.end {
                walk.finished = true;
            }
            return Ok(Private::Piece(overlap));
        }
        if stop == Stop::Done || walk.produced >= range.end {
            walk.finished = true;
            return Ok(Private::End);
        }
        if stop == Stop::Starved {
            return Ok(Private::NeedInput);
        }
    }
}

/// The cache's view of one entry.
struct Resident {
    entry: Arc<Decoded>,
    last_used: u64,
}

#[derive(Default)]
struct Lru {
    entries: HashMap<ComponentKey, Resident>,
    held: u64,
    clock: u64,
}

/// Shared decodes, bounded in bytes: each entry reserves its full decoded length.
pub struct DecodeCache {
    capacity: u64,
    decoders: Arc<Semaphore>,
    lru: Mutex<Lru>,
}

impl DecodeCache {
    pub fn new(capacity: u64, decoders: usize) -> DecodeCache {
        DecodeCache { capacity, decoders: Arc::new(Semaphore::new(decoders)), lru: Mutex::default() }
    }

    /// The bound on decoders running at once, shared by shared and private decodes.
    pub fn decoders(&self) -> &Arc<Semaphore> {
        &self.decoders
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.lru.lock().expect("cache lock is never poisoned")
    }

    /// Bytes reserved by the entries held.
    pub fn held(&self) -> u64 {
        self.lock().held
    }

    /// The shared decode of `key`, created with `make` when absent (or when the held one
    /// failed). `None` when the component cannot be held: larger than the cache, or no room
    /// left once every entry nobody is reading has been evicted.
    pub fn entry(&self, key: &ComponentKey, len: u64, make: impl FnOnce(Arc<Semaphore>) -> Decoded) -> Option<Hold> {
        let mut lru = self.lock();
        lru.clock += 1;
        let now = lru.clock;
        if let Some(resident) = lru.entries.get_mut(key) {
            if !resident.entry.failed() {
                resident.last_used = now;
                return Some(Hold::new(&resident.entry));
            }
            let failed = lru.entries.remove(key).expect("present");
            lru.held -= failed.entry.len();
        }
        if len > self.capacity {
            return None;
        }
        let needed = (lru.held + len).saturating_sub(self.capacity);
        if needed > 0 {
            // Holds on a resident entry are only taken under this lock (later ones by holders),
            // so an entry with none cannot gain one while eviction decides.
            let mut idle: Vec<(u64, u64, &ComponentKey)> = lru
                .entries
                .iter()
                .filter(|(_, r)| r.entry.holds.load(Ordering::SeqCst) == 0)
                .map(|(k, r)| (r.last_used, r.entry.len(), k))
                .collect();
            idle.sort_unstable_by_key(|&(last_used, _, _)| last_used);
            let mut freed = 0;
            let victims: Vec<ComponentKey> = idle
                .into_iter()
                .take_while(|&(_, size, _)| {
                    let take = freed < needed;
                    if take {
                        freed += size;
                    }
                    take
                })
                .map(|(_, _, k)| k.clone())
                .collect();
            if freed < needed {
                return None;
            }
            for victim in &victims {
                let evicted = lru.entries.remove(victim).expect("present");
                lru.held -= evicted.entry.len();
            }
            metrics::counter!(names::CACHE_EVICTIONS).increment(victims.len() as u64);
        }
        let entry = Arc::new(make(Arc::clone(&self.decoders)));
        let hold = Hold::new(&entry);
        lru.held += len;
        lru.entries.insert(key.clone(), Resident { entry, last_used: now });
        metrics::gauge!(names::CACHE_BYTES).set(lru.held as f64);
        Some(hold)
    }

    /// Drops every entry whose key `keep` refuses (files that changed or disappeared).
    pub fn retain(&self, keep: impl Fn(&ComponentKey) -> bool) {
        let mut lru = self.lock();
        let before = lru.entries.len();
        lru.entries.retain(|k, _| keep(k));
        if lru.entries.len() != before {
            lru.held = lru.entries.values().map(|r| r.entry.len()).sum();
            metrics::gauge!(names::CACHE_BYTES).set(lru.held as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{ByteOrder, DType};

    fn component(len: u64) -> Component {
        Component {
            role: "data".into(),
            dtype: DType::U8,
            logical_type: None,
            offset: 0,
            stored_length: len,
            encoding: Encoding::Raw,
            decoded_length: len,
            digest: None,
            byte_order: ByteOrder::Big,
        }
    }

    fn key(object: &str) -> ComponentKey {
        ComponentKey { model: "m".into(), version: "v1".into(), object: object.into(), role: "data".into() }
    }

    fn entry(cache: &DecodeCache, object: &str, len: u64) -> Option<Hold> {
        let c = component(len);
        cache.entry(&key(object), len, |decoders| {
            Decoded::new(object, &c, Stored::Whole(Bytes::from(vec![0; len as usize])), decoders, Arc::default())
        })
    }

    #[test]
    fn held_entries_are_never_evicted_and_the_bound_is_never_exceeded() {
        let cache = DecodeCache::new(100, 1);
        let a = entry(&cache, "a", 60).expect("fits");
        // `a` is held: `b` cannot make room, so it is not cached.
        assert!(entry(&cache, "b", 60).is_none());
        assert_eq!(cache.held(), 60);
        drop(a);
        // Now `a` is idle and evicted for `b`.
        let b = entry(&cache, "b", 60).expect("room made");
        assert_eq!(cache.held(), 60);
        drop(b);
        assert!(entry(&cache, "huge", 101).is_none(), "larger than the cache");
        assert!(entry(&cache, "b", 60).is_some(), "b is still resident");
    }

    #[test]
    fn eviction_takes_the_least_recently_used_idle_entries_first() {
        let cache = DecodeCache::new(100, 1);
        for name in ["a", "b", "c"] {
            drop(entry(&cache, name, 30));
        }
        drop(entry(&cache, "a", 30)); // a is now the most recent; b the least
        drop(entry(&cache, "d", 30));
        let resident: Vec<bool> =
            ["a", "b", "c", "d"].iter().map(|k| cache.lock().entries.contains_key(&key(k))).collect();
        assert_eq!(resident, [true, false, true, true]);
        cache.retain(|k| k.object != "c");
        assert_eq!(cache.held(), 60);
    }
}
