//! Where bytes come from: one small object-safe async trait, [`Storage`], whose six methods
//! every backend implements: a local directory (`local.rs`, whose reads are [`FileRegion`]s of
//! files mapped whole, sent with `sendfile` and read by the server only with `pread`,
//! `region.rs`), an S3 bucket prefix (`s3.rs`, through `object_store`), a Hub repository
//! (`hub.rs`, by the Hub's read API), and the node's disk cache (`cache/`), a wrapper around a
//! remote backend whose own interface (kept listings, held bytes, pins, stated digests) is
//! reached through the handle a cached source holds, never through the trait. A backend lists
//! every file under its root but hidden ones (a path part starting with `.`), model files and
//! the files beside them alike, reads byte ranges of one object *version* for a
//! [`ReadIntent`] (a read of an object that changed since it was listed fails with
//! [`StorageError::Changed`] rather than mixing two versions), and says what it knows of a
//! version's [`Content`] without reading it. [`ObjectVersion`] binds the reads of one response
//! to one version, checks that each read delivers exactly what was asked, and splits long
//! reads into parallel ranged reads under a shared read-ahead budget.
//! `tests/it/storage_conformance.rs` runs one suite against every backend.

mod block_sums;
pub mod cache;
pub mod hub;
pub mod local;
pub mod mapped;
pub(crate) mod region;
pub mod s3;
pub mod scan;

pub(crate) use self::block_sums::BlockSums;
pub use self::region::FileRegion;

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream};
use futures_util::{FutureExt as _, StreamExt as _, TryStreamExt as _};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::telemetry::names;

/// Records one read from `backend` (`kind`: what it was for) and how long it took to start.
pub fn record_read(backend: &'static str, kind: &'static str, started: std::time::Instant, bytes: u64) {
    metrics::histogram!(names::STORAGE_READ_DURATION, "backend" => backend, "kind" => kind)
        .record(started.elapsed().as_secs_f64());
    record_bytes(backend, kind, bytes);
}

/// Records bytes read from `backend` for `purpose` (manifest, serve, decode or verify).
pub fn record_bytes(backend: &'static str, purpose: &'static str, bytes: u64) {
    if bytes > 0 {
        metrics::counter!(names::STORAGE_READ_BYTES, "backend" => backend, "purpose" => purpose).increment(bytes);
    }
}

/// Records bytes of local files taken from their mappings for `purpose`: the kernel reads them
/// on first touch, so there is no read to time, only bytes to count.
pub(crate) fn record_mapped(purpose: &'static str, bytes: u64) {
    record_bytes("local", purpose, bytes);
}

/// The CA certificates of PEM bundle `file`, for a remote source's TLS client to trust beside
/// the system's roots: each parsed by `parse` (the HTTP client's own certificate type), and at
/// least one. Every error names the file.
pub(crate) fn ca_bundle<C, E: std::fmt::Display>(
    file: &std::path::Path,
    parse: impl FnOnce(&[u8]) -> Result<Vec<C>, E>,
) -> Result<Vec<C>, String> {
    let pem = std::fs::read(file).map_err(|e| format!("cannot read CA file {}: {e}", file.display()))?;
    let certs = parse(&pem).map_err(|e| format!("CA file {} is not a PEM bundle: {e}", file.display()))?;
    if certs.is_empty() {
        return Err(format!("CA file {} holds no PEM certificate", file.display()));
    }
    Ok(certs)
}

/// An error with its causes, which HTTP clients (reqwest) keep apart, in one message.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// One model file found under a source's root.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Listed {
    /// The path below the root, `/`-separated, with its extension.
    pub key: String,
    pub size: u64,
    /// What identifies this version of the object (an ETag, or a file's identity).
    pub version: String,
}

/// Which bytes of an object to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ByteRange {
    /// These bytes (must lie within the object).
    Bounded(Range<u64>),
    /// The last `n` bytes, or the whole object when it is shorter.
    Suffix(u64),
}

/// A read under way: where it lies in the object, and its bytes.
pub struct Read {
    /// The object's whole size.
    pub size: u64,
    /// The bytes read.
    pub range: Range<u64>,
    pub payload: Payload,
}

/// How a read's bytes are had (as `object_store`'s `GetResultPayload`).
pub enum Payload {
    /// Bytes as they arrive.
    Stream(BoxStream<'static, Result<Bytes, StorageError>>),
    /// A region of a local file, mapped whole: a response sends it from the mapping with
    /// `sendfile`, and the server reads it itself only through [`FileRegion`]'s `pread`s.
    File(FileRegion),
}

impl Read {
    /// The read's bytes as they arrive (a file region is read with `pread`).
    pub fn into_stream(self) -> BoxStream<'static, Result<Bytes, StorageError>> {
        match self.payload {
            Payload::Stream(bytes) => bytes,
            Payload::File(region) => region.stream(),
        }
    }

    /// Collects the whole read from `source_name` into one buffer (for small reads such as
    /// manifests).
    pub async fn collect(self, source_name: &str) -> Result<(u64, Range<u64>, Vec<u8>), StorageError> {
        use futures_util::StreamExt as _;
        let (size, range) = (self.size, self.range.clone());
        let mut out = Vec::with_capacity((range.end - range.start) as usize);
        let mut bytes = self.into_stream();
        while let Some(piece) = bytes.next().await {
            out.extend_from_slice(&piece?);
        }
        if out.len() as u64 != range.end - range.start {
            return Err(StorageError::Unavailable {
                source_name: source_name.to_owned(),
                message: format!("read ended after {} of {} bytes", out.len(), range.end - range.start),
            });
        }
        Ok((size, range, out))
    }
}

/// Why storage could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    #[error("{source_name}: {key} does not exist")]
    NotFound { source_name: String, key: String },
    #[error("{source_name}: {key} changed since it was listed")]
    Changed { source_name: String, key: String },
    #[error("{source_name}: range {start}..{end} is outside the object")]
    OutOfRange { source_name: String, start: u64, end: u64 },
    /// This one object cannot be read (a local file's permissions, say); the source answers.
    #[error("{source_name}: cannot read {key}: {message}")]
    Unreadable { source_name: String, key: String, message: String },
    /// Temporary: the store did not answer, or answered an error worth retrying later.
    #[error("{source_name} is unavailable: {message}")]
    Unavailable { source_name: String, message: String },
    /// The origin's bytes did not match the object's known digest, twice in a row: nothing
    /// was kept, and the next read asks the origin again.
    #[error("{source_name}: {key} arrived corrupt: {message}")]
    Corrupt { source_name: String, key: String, message: String },
    /// Lasting until an operator acts: bad credentials, a missing bucket, a bad setting.
    #[error("{source_name} refuses access: {message}")]
    Refused { source_name: String, message: String },
}

impl StorageError {
    /// Whether the error concerns one object (changed, gone) rather than the store itself.
    pub fn is_about_the_object(&self) -> bool {
        matches!(
            self,
            StorageError::NotFound { .. }
                | StorageError::Changed { .. }
                | StorageError::OutOfRange { .. }
                | StorageError::Unreadable { .. }
        )
    }
}

/// What a read is for: a backend that keeps only checked bytes (the disk cache) answers the
/// catalog's parsing differently from bytes that may reach a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadIntent {
    /// Bytes that may reach a client, as they are or decoded (serving, decoding, checking,
    /// prefetching).
    Serve,
    /// The catalog's own parsing (a manifest, a header), never sent to a client as it is: the
    /// disk cache, for an object whose digest is known, may read it from the origin without
    /// keeping it, rather than bring the whole object to check a header.
    Parse,
}

/// What a source knows of one object version's content without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Content {
    /// What of the version names the object's bytes wherever the storage is mounted: what a
    /// content digest is kept by, so that it outlives a remount (a container's new overlay).
    pub version: String,
    /// The SHA-256 of the whole object, when the source says it (a Hub file's LFS id is its
    /// content's SHA-256).
    pub sha256: Option<[u8; 32]>,
}

/// A place model files live. Every backend implements every method; what only the node's
/// disk cache does is [`cache::CachedStorage`]'s own, reached through the handle a source
/// holds, never through this trait.
pub trait Storage: Send + Sync + std::fmt::Debug {
    /// The source as configured (`models`, `s3://bucket/prefix`).
    fn name(&self) -> &str;
    /// The backend's name in metrics (`local`, `s3`).
    fn backend(&self) -> &'static str;
    /// Every model file under the root, in key order.
    fn list(&self) -> BoxFuture<'_, Result<Vec<Listed>, StorageError>>;
    /// Reads `range` of `key`, only from the version `version`, for `intent`.
    fn read(
        &self,
        key: &str,
        range: ByteRange,
        version: &str,
        intent: ReadIntent,
    ) -> BoxFuture<'_, Result<Read, StorageError>>;
    /// What the source knows of the content of `key` at `version`.
    fn content(&self, key: &str, version: &str) -> Content;
    /// Whether reads answer with file regions ([`Payload::File`]) that a response can send
    /// without copying: then a model's whole file is read once and its mapping kept.
    fn maps_files(&self) -> bool;
}

/// The purpose of the catalog's reads of what it parses (in metrics too), read with
/// [`ReadIntent::Parse`].
pub const MANIFEST_READ: &str = "manifest";

/// One version of one object: every read through it is bound to that version, so the reads
/// of one response never mix two versions.
#[derive(Debug, Clone)]
pub struct ObjectVersion {
    pub storage: Arc<dyn Storage>,
    pub key: String,
    pub version: String,
    pub size: u64,
}

/// How a long read is split into ranged reads made at once.
#[derive(Debug, Clone)]
pub struct Readahead {
    /// Bytes per ranged read.
    pub chunk: u64,
    /// Ranged reads in flight for one response (1: one read of the whole range).
    pub concurrency: usize,
    /// Bytes fetched ahead of what clients have taken, across all responses, in KiB permits.
    pub budget: Arc<Semaphore>,
}

impl ObjectVersion {
    fn fail(&self, message: String) -> StorageError {
        StorageError::Unavailable { source_name: self.storage.name().to_owned(), message }
    }

    /// What the source knows of this version's content.
    pub fn content(&self) -> Content {
        self.storage.content(&self.key, &self.version)
    }

    /// `range`'s bytes as they arrive, from one ranged read opened when first polled (for
    /// `purpose` in metrics). A read that ends early is an error, never a short success.
    pub fn stream(&self, range: Range<u64>, purpose: &'static str) -> BoxStream<'static, Result<Bytes, StorageError>> {
        if range.is_empty() {
            return stream::empty().boxed();
        }
        let this = self.clone();
        let expected = range.end - range.start;
        let opened = async move {
            let started = std::time::Instant::now();
            let range = ByteRange::Bounded(range);
            let intent = if purpose == MANIFEST_READ { ReadIntent::Parse } else { ReadIntent::Serve };
            let read = this.storage.read(&this.key, range, &this.version, intent).await;
            record_read(this.storage.backend(), purpose, started, 0);
            read.map(|read| (this, read.into_stream()))
        };
        stream::once(opened)
            .map_ok(move |(this, bytes)| {
                let mut received = 0u64;
                let backend = this.storage.backend();
                bytes
                    .map_ok(move |piece| {
                        record_bytes(backend, purpose, piece.len() as u64);
                        piece
                    })
                    .chain(stream::once(async { Ok(Bytes::new()) }))
                    .and_then(move |piece| {
                        received += piece.len() as u64;
                        let outcome = if piece.is_empty() && received != expected {
                            Err(this.fail(format!("read ended after {received} of {expected} bytes")))
                        } else if received > expected {
                            Err(this.fail(format!("read returned more than the {expected} bytes asked for")))
                        } else {
                            Ok(piece)
                        };
                        std::future::ready(outcome)
                    })
                    .try_filter(|piece| std::future::ready(!piece.is_empty()))
            })
            .try_flatten()
            .boxed()
    }

    /// The object's whole file, mapped, from a backend that [maps files](Storage::maps_files);
    /// `None` from one that does not.
    pub async fn mapping(&self) -> Result<Option<Arc<mapped::MappedFile>>, StorageError> {
        if !self.storage.maps_files() {
            return Ok(None);
        }
        let whole = ByteRange::Bounded(0..self.size);
        let read = self.storage.read(&self.key, whole, &self.version, ReadIntent::Serve).await?;
        Ok(match read.payload {
            Payload::File(region) => Some(region.into_mapping()),
            Payload::Stream(_) => None,
        })
    }

    /// `range`'s bytes, all of them in one buffer (manifests, content checks).
    pub async fn fetch(&self, range: Range<u64>, purpose: &'static str) -> Result<Bytes, StorageError> {
        collect(self.stream(range, purpose)).await
    }

    /// `range`'s bytes in order, read as `chunk`-sized ranged reads with up to `concurrency`
    /// in flight. The chunk being sent streams straight through; chunks after it are fetched
    /// whole, in parallel, but only while the shared budget has room, so memory stays bounded
    /// however many responses run and however slow their clients are.
    pub fn read_ahead(
        &self,
        range: Range<u64>,
        readahead: &Readahead,
        purpose: &'static str,
    ) -> BoxStream<'static, Result<Bytes, StorageError>> {
        if readahead.concurrency <= 1 || range.end - range.start <= readahead.chunk {
            return self.stream(range, purpose);
        }
        let chunk = readahead.chunk.max(1);
        let queue: VecDeque<Chunk> = (range.start..range.end)
            .step_by(chunk as usize)
            .map(|start| Chunk::Pending(start..(start + chunk).min(range.end)))
            .collect();
        let ahead =
            Ahead { object: self.clone(), queue, current: None, readahead: readahead.clone(), purpose, failed: false };
        stream::unfold(ahead, |mut ahead| async move {
            loop {
                if let Some(current) = &mut ahead.current {
                    match current.next().await {
                        Some(Err(e)) => {
                            ahead.failed = true;
                            ahead.current = None;
                            return Some((Err(e), ahead));
                        }
                        Some(piece) => return Some((piece, ahead)),
                        None => ahead.current = None,
                    }
                }
                if ahead.failed {
                    return None;
                }
                ahead.start_fetches();
                match ahead.queue.pop_front()? {
                    Chunk::Pending(range) => ahead.current = Some(ahead.object.stream(range, ahead.purpose)),
                    Chunk::Fetching(mut task) => {
                        let fetched = (&mut task.0).await;
                        let piece =
                            fetched.map_err(|e| ahead.object.fail(e.to_string())).and_then(|(bytes, _permit)| bytes);
                        ahead.failed = piece.is_err();
                        return Some((piece, ahead));
                    }
                }
            }
        })
        .boxed()
    }
}

/// Every piece of a read in one buffer; a read of one piece is returned as it is, not copied.
pub async fn collect(pieces: BoxStream<'static, Result<Bytes, StorageError>>) -> Result<Bytes, StorageError> {
    let pieces: Vec<Bytes> = pieces.try_collect().await?;
    Ok(match <[Bytes; 1]>::try_from(pieces) {
        Ok([one]) => one,
        Err(pieces) => Bytes::from(pieces.concat()),
    })
}

/// A task aborted when dropped: a response that goes away stops its fetches.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

enum Chunk {
    Pending(Range<u64>),
    Fetching(AbortOnDrop<(Result<Bytes, StorageError>, OwnedSemaphorePermit)>),
}

/// A split read in progress.
struct Ahead {
    object: ObjectVersion,
    /// The chunks not yet sent, in order.
    queue: VecDeque<Chunk>,
    /// The chunk being streamed.
    current: Option<BoxStream<'static, Result<Bytes, StorageError>>>,
    readahead: Readahead,
    purpose: &'static str,
    failed: bool,
}

impl Ahead {
    /// Starts fetching the chunks after the next one, up to the concurrency, as the budget
    /// allows (never waiting for it: a chunk without budget is streamed in its turn).
    fn start_fetches(&mut self) {
        let window = self.readahead.concurrency.min(self.queue.len());
        for index in 1..window {
            let Chunk::Pending(range) = &self.queue[index] else { continue };
            let kib = ((range.end - range.start).div_ceil(1024)).min(u64::from(u32::MAX)) as u32;
            let Ok(permit) = Arc::clone(&self.readahead.budget).try_acquire_many_owned(kib) else { return };
            let (object, range, purpose) = (self.object.clone(), range.clone(), self.purpose);
            let task = tokio::spawn(async move { (object.fetch(range, purpose).await, permit) });
            self.queue[index] = Chunk::Fetching(AbortOnDrop(task));
        }
    }
}

/// `body` with each piece held back until the next arrives, and the last until `check`
/// passes; a failed check ends the body with its error instead, so a response is cut short of
/// its length, never completed. An error of the body drops the check.
pub fn last_held_until<E: Send + 'static>(
    body: BoxStream<'static, Result<Bytes, E>>,
    check: impl std::future::Future<Output = Result<(), E>> + Send + 'static,
) -> BoxStream<'static, Result<Bytes, E>> {
    struct Held<E> {
        // Fused: the last piece is returned after the body has ended, and the next poll must
        // not poll the body again (an `unfold` panics when it is).
        body: stream::Fuse<BoxStream<'static, Result<Bytes, E>>>,
        held: Option<Bytes>,
        check: Option<BoxFuture<'static, Result<(), E>>>,
    }
    let state = Held { body: body.fuse(), held: None, check: Some(check.boxed()) };
    stream::unfold(state, |mut s| async move {
        loop {
            match s.body.next().await {
                Some(Ok(piece)) => {
                    if let Some(previous) = s.held.replace(piece) {
                        return Some((Ok(previous), s));
                    }
                }
                Some(Err(e)) => {
                    (s.held, s.check) = (None, None);
                    return Some((Err(e), s));
                }
                None => {
                    if let Some(check) = s.check.take()
                        && let Err(e) = check.await
                    {
                        s.held = None;
                        return Some((Err(e), s));
                    }
                    return s.held.take().map(|last| (Ok(last), s));
                }
            }
        }
    })
    .boxed()
}
