//! Where a component's stored bytes come from ([`Stored`]: memory, a local file read with
//! `pread`, a remote object version), and a decoder's input over them, which holds only the
//! piece in hand.

use std::collections::VecDeque;
use std::ops::Range;

use bytes::{Buf as _, Bytes};
use futures_util::stream::BoxStream;
use futures_util::{StreamExt as _, TryStreamExt as _};

use crate::storage::region::READ_PIECE;
use crate::storage::{FileRegion, ObjectVersion, StorageError};

/// Where a component's stored bytes come from.
#[derive(Debug, Clone)]
pub(crate) enum Stored {
    /// All of them in memory. Never a slice of a file's mapping: see [`Stored::File`]. Only
    /// the unit tests hold stored bytes in memory; every server path reads a file or an object.
    #[cfg_attr(not(test), expect(dead_code))]
    Whole(Bytes),
    /// A region of a local file, copied out with `pread` as it is consumed, never loaded from
    /// the file's mapping, so a file truncated in place fails the read instead of raising
    /// SIGBUS (see [`FileRegion`]).
    File(FileRegion),
    /// `range` of an object version, read as the decoder consumes it.
    Remote { object: ObjectVersion, range: Range<u64> },
}

impl Stored {
    pub(crate) fn len(&self) -> u64 {
        match self {
            Stored::Whole(bytes) => bytes.len() as u64,
            Stored::File(region) => region.len(),
            Stored::Remote { range, .. } => range.end - range.start,
        }
    }

    /// `range` of these stored bytes (within `0..len`), from the same place.
    pub(crate) fn slice(&self, range: Range<u64>) -> Stored {
        match self {
            Stored::Whole(bytes) => Stored::Whole(bytes.slice(range.start as usize..range.end as usize)),
            Stored::File(region) => Stored::File(region.slice(range)),
            Stored::Remote { object, range: whole } => {
                Stored::Remote { object: object.clone(), range: whole.start + range.start..whole.start + range.end }
            }
        }
    }

    /// The stored bytes from offset `from` to the end, collected.
    pub(crate) async fn fetch_from(&self, from: u64, purpose: &'static str) -> Result<Bytes, StorageError> {
        let mut pieces = self.stream(from, purpose);
        let mut out = bytes::BytesMut::with_capacity((self.len() - from.min(self.len())) as usize);
        while let Some(piece) = pieces.next().await {
            out.extend_from_slice(&piece?);
        }
        Ok(out.freeze())
    }

    /// The stored bytes from offset `from` on, as they are read (for `purpose` in metrics).
    /// A read that ends early is an error, never a short success.
    pub(crate) fn stream(&self, from: u64, purpose: &'static str) -> BoxStream<'static, Result<Bytes, StorageError>> {
        match self {
            Stored::Whole(bytes) => {
                let rest = bytes.slice((from as usize).min(bytes.len())..);
                futures_util::stream::iter((!rest.is_empty()).then_some(Ok(rest))).boxed()
            }
            Stored::File(region) => region
                .slice(from.min(region.len())..region.len())
                .stream()
                .inspect_ok(move |piece| crate::storage::record_bytes("local", purpose, piece.len() as u64))
                .boxed(),
            Stored::Remote { object, range } => object.stream(range.start + from..range.end, purpose),
        }
    }

    /// All the stored bytes, read on the calling (blocking) thread: from memory, or with one
    /// `pread` of a local file. Remote bytes are fetched with [`Stored::fetch_from`] instead.
    pub(super) fn read_blocking(&self) -> Result<Bytes, StorageError> {
        match self {
            Stored::Whole(bytes) => Ok(bytes.clone()),
            Stored::File(region) => {
                let read = region.read_blocking()?;
                crate::storage::record_bytes("local", "decode", read.len() as u64);
                Ok(read)
            }
            Stored::Remote { object, .. } => Err(StorageError::Unavailable {
                source_name: object.storage.name().to_owned(),
                message: "remote bytes are fetched, not read on a blocking thread".into(),
            }),
        }
    }

    /// The bytes of `runs` (ranges within these stored bytes, in order), back to back, read on
    /// the calling (blocking) thread: from memory, or with `pread` from a local file (runs close
    /// together with one call).
    pub(crate) fn gather_blocking(&self, runs: &[Range<u64>]) -> Result<Bytes, StorageError> {
        match self {
            Stored::Whole(bytes) => {
                let mut out = bytes::BytesMut::with_capacity(runs.iter().map(|r| (r.end - r.start) as usize).sum());
                for run in runs {
                    out.extend_from_slice(&bytes[run.start as usize..run.end as usize]);
                }
                Ok(out.freeze())
            }
            Stored::File(region) => {
                let (gathered, read) = region.gather(runs)?;
                crate::storage::record_bytes("local", "slice", read);
                Ok(gathered)
            }
            Stored::Remote { .. } => self.read_blocking(),
        }
    }

    /// The source named in errors about these bytes.
    pub(super) fn source_name(&self) -> &str {
        match self {
            Stored::Whole(_) => "memory",
            Stored::File(region) => region.source_name(),
            Stored::Remote { object, .. } => object.storage.name(),
        }
    }
}

/// A decoder's input: stored bytes received and not yet consumed, and the read that brings
/// more. Nothing ahead of the decoder is kept beyond the piece in hand, so decoding a
/// remote component holds one network piece, not the component.
pub(super) struct Input {
    pub(super) pieces: VecDeque<Bytes>,
    /// A local file's stored bytes are read on the decoder's own thread into this one buffer,
    /// reused piece after piece: no hop to another thread and back per piece, and no fresh
    /// memory to fault in.
    pub(super) buffer: Vec<u8>,
    /// The part of `buffer` not yet consumed.
    pub(super) held: Range<usize>,
    /// Stored bytes received so far, from the component's start.
    pub(super) received: u64,
    pub(super) total: u64,
    pub(super) reading: Option<BoxStream<'static, Result<Bytes, StorageError>>>,
}

impl Input {
    pub(super) fn new(stored: &Stored) -> Input {
        match stored {
            Stored::Whole(bytes) => Input {
                pieces: VecDeque::from([bytes.clone()]),
                buffer: Vec::new(),
                held: 0..0,
                received: bytes.len() as u64,
                total: bytes.len() as u64,
                reading: None,
            },
            Stored::File(_) | Stored::Remote { .. } => Input { total: stored.len(), ..Input::empty() },
        }
    }

    /// No input at all (a decode that has ended).
    pub(super) fn empty() -> Input {
        Input { pieces: VecDeque::new(), buffer: Vec::new(), held: 0..0, received: 0, total: 0, reading: None }
    }

    /// Whether more stored bytes must arrive before the decoder can go on.
    pub(super) fn starved(&self) -> bool {
        self.pieces.is_empty() && self.held.is_empty() && self.received < self.total
    }

    /// Whether stored bytes are in hand, waiting to be decoded.
    pub(super) fn holds_bytes(&self) -> bool {
        !self.pieces.is_empty() || !self.held.is_empty()
    }

    /// Reads the next piece of a local file's stored bytes on the calling (blocking) thread;
    /// `None` where the bytes must be awaited with [`Input::fill`] instead (a remote object).
    pub(super) fn read_here(&mut self, stored: &Stored) -> Option<Result<(), StorageError>> {
        let Stored::File(region) = stored else { return None };
        let len = (self.total - self.received).min(READ_PIECE) as usize;
        if self.buffer.len() < len {
            self.buffer.resize(len, 0);
        }
        let read = region.read_into(self.received, &mut self.buffer[..len]);
        if read.is_ok() {
            crate::storage::record_bytes("local", "decode", len as u64);
            self.received += len as u64;
            self.held = 0..len;
        }
        Some(read)
    }

    /// Waits for the next piece of a remote object, opening a read from where the input
    /// stands when none is open. Bytes in memory need no reading, and a local file is read on
    /// the decoder's thread ([`Input::read_here`]).
    pub(super) async fn fill(&mut self, stored: &Stored) -> Result<(), StorageError> {
        if matches!(stored, Stored::Whole(_) | Stored::File(_)) {
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
    pub(super) fn park(&mut self) {
        self.reading = None;
    }

    pub(super) fn front(&self) -> &[u8] {
        if !self.held.is_empty() {
            return &self.buffer[self.held.clone()];
        }
        self.pieces.front().map_or(&[], |piece| &piece[..])
    }

    pub(super) fn consume(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        if !self.held.is_empty() {
            self.held.start += n;
            return;
        }
        let front = self.pieces.front_mut().expect("consumed bytes came from the front piece");
        front.advance(n);
        if front.is_empty() {
            self.pieces.pop_front();
        }
    }
}
