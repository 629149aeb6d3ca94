//! Server-side slices of dense objects (a tensor-parallel rank's rows or columns): the slice
//! checked against the object (`format::slice`), and its bytes cut from the component's as they
//! are served, in bounded memory whatever the tensor's size. A raw component of a local file
//! sends runs of 1 KiB or more from its mapping (the kernel copies them) and gathers shorter ones
//! with `pread` into bounded buffers; any other source (a remote object, a decode through the
//! shared cache, seekable frames) is opened once per span of runs close enough to read through,
//! and the runs are cut from its pieces, so a seekable part decodes only frames the slice touches.

use std::iter::Peekable;
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::{StreamExt as _, TryStreamExt as _, stream};

use super::ServiceError;
use super::bytes::{ModelBytes, storage_failed, unchanged};
use super::representation::{ByteStream, RangeSource, guarded};
use crate::catalog::Model;
use crate::decode::Stored;
use crate::format::slice::{RunsWithin, Slice, geometry, parse, shard_spec};
use crate::format::{Component, Object};
use crate::storage::mapped::MappedFile;

/// Runs of a mapped file at least this long are sent from the mapping as they are (by
/// `sendfile` from 64 KiB, `transport::zero_copy`, and below that by `writev`: either way the kernel
/// copies them, never the server); shorter ones cost less read with `pread` and gathered.
/// Measured on 8 ranks' columns of a 1 GiB bf16 matrix (runs of 8 KiB): gathered by one `pread`
/// each, 0.6× the throughput of contiguous ranges of the same bytes; sent from the mapping, 1.0×.
const SEND_MAPPED_MIN: u64 = 1 << 10;

/// Runs sent from the mapping per step, so the steps stay few.
const SENDS_PER_STEP: usize = 256;

/// Parts of an in-memory piece at least this long are passed on as they are; shorter ones are
/// copied into a gather buffer, where one copy costs less than one more body frame.
const PASS_ON_MIN: u64 = 64 << 10;

/// Gathered runs are sent in buffers of about this size: large enough for one write to move
/// many runs, small enough that a request holds little.
const GATHER_BYTES: u64 = 1 << 20;

/// Runs one gather holds at most (a list of 1 MiB), however short they are.
const RUNS_PER_GATHER: usize = 64 << 10;

/// Gathers read ahead of the one being sent, so reading overlaps sending.
const GATHERS_AHEAD: usize = 2;

/// What a request asks to cut from an object, as written in its query.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SliceRequest<'a> {
    /// `slice=SPEC`: `start:stop` per dimension.
    Spec(&'a str),
    /// `shard=RANK/WORLD&dim=D`: an even split of one dimension.
    Shard { split: &'a str, dim: &'a str },
}

/// A slice checked against the object it cuts.
#[derive(Debug, Clone)]
pub(crate) struct ResolvedSlice {
    /// Of the object's shape.
    pub slice: Slice,
    /// The same slice in the units of `shape` (a block-quantized tensor's innermost dimension
    /// in blocks).
    cut: Slice,
    /// The width of one element as slices cut it (a complex element whole, fp8 as bytes, a
    /// GGML block whole).
    element: u64,
    /// The shape the object's bytes are laid out in ([`crate::format::slice::Geometry`]).
    shape: Vec<u64>,
}

impl ResolvedSlice {
    /// The bytes of this slice of `component`, cut from `whole` (the component's bytes as a
    /// whole request gets them), or for a raw component of a mapped local file, from the file
    /// itself (`stored_in`).
    pub(super) fn source(
        &self,
        model: &Arc<Model>,
        component: &Component,
        stored_in: &ModelBytes,
        whole: Arc<dyn RangeSource>,
    ) -> Arc<dyn RangeSource> {
        let cutter = match stored_in {
            ModelBytes::Mapped { bytes: mapped, file, version } if component.is_verbatim() => {
                let range = component.stored_range();
                let sent = mapped.slice(range.start as usize..range.end as usize);
                let (read, mapping, version) = (stored_in.stored(range), Arc::clone(file.mapping()), version.clone());
                Cutter::File(Arc::new(FileBytes { sent, read, mapping, version }))
            }
            _ => Cutter::Spans(whole),
        };
        Arc::new(SliceSource {
            slice: self.cut.clone(),
            shape: self.shape.clone(),
            element: self.element,
            len: self.len(),
            cutter,
            model: Arc::clone(model),
        })
    }

    /// The slice's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.cut.len(self.element).expect("a slice is no larger than its object")
    }

    /// The runs of the component's bytes the slice is made of, in order.
    pub(crate) fn runs(&self) -> crate::format::slice::Runs {
        self.cut.runs(&self.shape, self.element)
    }

    /// Whether a raw component's slice leaves from the file's mapping (its runs are long) or
    /// is gathered into the process's memory (they are short): every run of a slice but its
    /// last is as long as the first.
    pub(crate) fn sent_from_mapping(&self) -> bool {
        self.runs().next().is_some_and(|run| run.end - run.start >= SEND_MAPPED_MIN)
    }

    /// `request`'s slice of `object`, checked against it: only a dense object of whole-byte
    /// elements of a known type, or a GGML block-quantized tensor at whole blocks, can be cut,
    /// within its bounds.
    pub(crate) fn resolve(
        model: &Model,
        object: &Object,
        request: SliceRequest<'_>,
    ) -> Result<ResolvedSlice, ServiceError> {
        let bad = |source| ServiceError::BadSlice { model: model.id.clone(), object: object.name.clone(), source };
        let geometry = geometry(object).map_err(bad)?;
        let slice = match request {
            SliceRequest::Spec(spec) => parse(spec, &object.shape),
            SliceRequest::Shard { split, dim } => shard_spec(split, dim, &object.shape),
        }
        .map_err(bad)?;
        let cut = geometry.cut(&slice).map_err(bad)?;
        Ok(ResolvedSlice { slice, cut, element: geometry.element, shape: geometry.shape })
    }
}

/// Where a slice's runs are cut from.
enum Cutter {
    /// A raw component of a mapped local file.
    File(Arc<FileBytes>),
    /// Any other source, opened once per span.
    Spans(Arc<dyn RangeSource>),
}

/// A raw component of a mapped local file, two ways: `sent` is its mapping, sent as it is (by
/// `sendfile` or `writev`: the kernel reads it, never the server, see `storage::mapped`), and
/// `read` the same bytes, read with `pread`; and the file's version they must still be when a
/// body ends (a file changed in place cuts it short).
struct FileBytes {
    sent: Bytes,
    read: Stored,
    mapping: Arc<MappedFile>,
    version: String,
}

/// The bytes of a slice of a component.
struct SliceSource {
    slice: Slice,
    shape: Vec<u64>,
    element: u64,
    len: u64,
    cutter: Cutter,
    model: Arc<Model>,
}

impl RangeSource for SliceSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn open(&self, range: Range<u64>) -> ByteStream {
        let runs = self.slice.runs_within(&self.shape, self.element, range);
        match &self.cutter {
            Cutter::File(file) => {
                let unchanged = unchanged(Arc::clone(&file.mapping), file.version.clone());
                guarded(from_file(Arc::clone(file), Arc::clone(&self.model), runs), unchanged)
            }
            Cutter::Spans(source) => from_spans(Arc::clone(source), runs),
        }
    }
}

/// What one step of sending a slice from a file does.
enum Step {
    /// Send these runs from the mapping.
    Send(Vec<Range<u64>>),
    /// Read these runs with `pread` into one buffer and send it.
    Gather(Vec<Range<u64>>),
}

/// The runs of a slice as steps: long runs sent from the mapping, short ones gathered.
struct Steps {
    runs: Peekable<RunsWithin>,
}

impl Iterator for Steps {
    type Item = Step;

    fn next(&mut self) -> Option<Step> {
        let long = |run: &Range<u64>| run.end - run.start >= SEND_MAPPED_MIN;
        if long(self.runs.peek()?) {
            let mut runs = Vec::new();
            while runs.len() < SENDS_PER_STEP {
                match self.runs.next_if(long) {
                    Some(run) => runs.push(run),
                    None => break,
                }
            }
            return Some(Step::Send(runs));
        }
        let (mut runs, mut gathered) = (Vec::new(), 0);
        while gathered < GATHER_BYTES && runs.len() < RUNS_PER_GATHER {
            match self.runs.next_if(|run| !long(run)) {
                Some(run) => {
                    gathered += run.end - run.start;
                    runs.push(run);
                }
                None => break,
            }
        }
        Some(Step::Gather(runs))
    }
}

fn from_file(file: Arc<FileBytes>, model: Arc<Model>, runs: RunsWithin) -> ByteStream {
    stream::iter(Steps { runs: runs.peekable() })
        .map(move |step| {
            let (file, model) = (Arc::clone(&file), Arc::clone(&model));
            async move {
                match step {
                    Step::Send(runs) => Ok(stream::iter(runs).flat_map(move |run| file.sent.open(run)).boxed()),
                    Step::Gather(runs) => {
                        let gathered = tokio::task::spawn_blocking(move || file.read.gather_blocking(&runs))
                            .await
                            .map_err(|e| ServiceError::Internal(e.to_string()))?
                            .map_err(|e| storage_failed(&model.source, &model.id, e))?;
                        Ok(stream::iter([Ok(gathered)]).boxed())
                    }
                }
            }
        })
        .buffered(GATHERS_AHEAD)
        .try_flatten()
        .boxed()
}

/// Runs close enough to read through as one open of the source: the range that covers them, and
/// the runs themselves, generated again rather than kept (a span may hold millions).
struct Span {
    range: Range<u64>,
    runs: std::iter::Take<Peekable<RunsWithin>>,
}

fn spans(runs: RunsWithin, gap: u64) -> impl Iterator<Item = Span> {
    let mut runs = runs.peekable();
    std::iter::from_fn(move || {
        let from_here = runs.clone();
        let first = runs.next()?;
        let (mut end, mut count) = (first.end, 1);
        while let Some(next) = runs.next_if(|next| next.start - end <= gap) {
            (end, count) = (next.end, count + 1);
        }
        Some(Span { range: first.start..end, runs: from_here.take(count) })
    })
}

fn from_spans(source: Arc<dyn RangeSource>, runs: RunsWithin) -> ByteStream {
    stream::once(async move {
        let gap = source.gap_worth_reading().await?;
        let pieces = stream::iter(spans(runs, gap)).flat_map(move |span| cut(source.open(span.range.clone()), span));
        Ok::<_, ServiceError>(pieces)
    })
    .try_flatten()
    .boxed()
}

/// A span's runs cut from the pieces of its bytes: long parts passed on as they are (slices of
/// the pieces, not copies), short ones copied into buffers of about [`GATHER_BYTES`].
fn cut(pieces: ByteStream, span: Span) -> ByteStream {
    struct Cutting {
        pieces: ByteStream,
        /// The piece in hand, and where in the source it starts.
        piece: Bytes,
        at: u64,
        /// What is left of the run being cut, then the runs after it.
        run: Option<Range<u64>>,
        runs: std::iter::Take<Peekable<RunsWithin>>,
        out: BytesMut,
    }
    fn flush(out: &mut BytesMut) -> Bytes {
        let full = out.split().freeze();
        out.reserve(GATHER_BYTES as usize);
        full
    }
    let mut runs = span.runs;
    let (run, out) = (runs.next(), BytesMut::with_capacity(GATHER_BYTES as usize));
    let state = Cutting { pieces, piece: Bytes::new(), at: span.range.start, run, runs, out };
    stream::unfold(state, |mut s| async move {
        loop {
            if s.out.len() as u64 >= GATHER_BYTES {
                return Some((Ok(flush(&mut s.out)), s));
            }
            let Some(run) = s.run.clone() else {
                return (!s.out.is_empty()).then(|| (Ok(flush(&mut s.out)), s));
            };
            let piece_end = s.at + s.piece.len() as u64;
            if run.start >= piece_end {
                s.at = piece_end;
                let failure = match s.pieces.next().await {
                    Some(Ok(piece)) => {
                        s.piece = piece;
                        continue;
                    }
                    Some(Err(e)) => e,
                    None => ServiceError::Internal(format!(
                        "a slice's source ended at byte {piece_end}, before byte {}",
                        run.start
                    )),
                };
                // Nothing more after a failure: the body ends with it.
                (s.run, s.out) = (None, BytesMut::new());
                return Some((Err(failure), s));
            }
            let within = (run.start - s.at) as usize..(run.end.min(piece_end) - s.at) as usize;
            let long = within.len() as u64 >= PASS_ON_MIN;
            if long && !s.out.is_empty() {
                return Some((Ok(flush(&mut s.out)), s));
            }
            let rest = run.start + within.len() as u64..run.end;
            s.run = if rest.is_empty() { s.runs.next() } else { Some(rest) };
            if long {
                return Some((Ok(s.piece.slice(within)), s));
            }
            s.out.extend_from_slice(&s.piece[within]);
        }
    })
    .boxed()
}
