//! Regions of local files ([`FileRegion`]), what a local read answers with: sent from the
//! file's mapping by `sendfile` or `writev`, and read by the server itself only with `pread`
//! from the descriptor behind the mapping (streamed, into a buffer, gathered, in pieces), never
//! by loading from the mapping, so a file truncated in place fails a read instead of raising
//! SIGBUS. The `pread` helpers are this module's own; nothing outside `storage` calls them.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::BoxStream;

use super::StorageError;
use super::mapped::MappedFile;

/// `range` of a local file (`key` of the source `source_name`), mapped whole.
#[derive(Clone)]
pub struct FileRegion {
    mapping: Arc<MappedFile>,
    range: Range<u64>,
    source_name: String,
    key: String,
}

impl std::fmt::Debug for FileRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileRegion")
            .field("source_name", &self.source_name)
            .field("key", &self.key)
            .field("range", &self.range)
            .finish()
    }
}

impl FileRegion {
    /// `range` (within the file) of `mapping`, `key` of `source_name`, named in errors.
    pub(crate) fn new(mapping: Arc<MappedFile>, range: Range<u64>, source_name: &str, key: &str) -> FileRegion {
        FileRegion { mapping, range, source_name: source_name.to_owned(), key: key.to_owned() }
    }

    /// The whole of `mapping`'s file.
    pub(crate) fn whole(mapping: Arc<MappedFile>, source_name: &str, key: &str) -> FileRegion {
        let len = mapping.len() as u64;
        FileRegion::new(mapping, 0..len, source_name, key)
    }

    /// The file's mapping, whole: what a response sends from (see `transport::zero_copy`).
    pub fn mapping(&self) -> &Arc<MappedFile> {
        &self.mapping
    }

    /// The mapping, for a caller that keeps it.
    pub fn into_mapping(self) -> Arc<MappedFile> {
        self.mapping
    }

    /// Where the region lies in the file.
    pub fn range(&self) -> Range<u64> {
        self.range.clone()
    }

    pub fn len(&self) -> u64 {
        self.range.end - self.range.start
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// The source named in errors about the region.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// The file's key in its source.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// `within` (offsets from the region's start, inside it) of this region.
    pub(crate) fn slice(&self, within: Range<u64>) -> FileRegion {
        let range = self.range.start + within.start..self.range.start + within.end;
        FileRegion { range, ..self.clone() }
    }

    /// The region's bytes, read with `pread` in pieces off the async runtime.
    pub fn stream(&self) -> BoxStream<'static, Result<Bytes, StorageError>> {
        pread_stream(Arc::clone(self.mapping.file()), self.range.clone(), &self.source_name, &self.key)
    }

    /// The region's bytes in one buffer, read with one `pread` (blocking).
    pub(crate) fn read_blocking(&self) -> Result<Bytes, StorageError> {
        pread_exact(self.mapping.file(), self.range.clone(), &self.source_name, &self.key)
    }

    /// Fills `buffer` from offset `at` of the region with `pread` (blocking), into memory the
    /// caller reuses.
    pub(crate) fn read_into(&self, at: u64, buffer: &mut [u8]) -> Result<(), StorageError> {
        pread_exact_into(self.mapping.file(), self.range.start + at, buffer, &self.source_name, &self.key)
    }

    /// `runs` of the region (offsets from its start, in order), back to back in one buffer,
    /// runs close together read with one `pread` (blocking); and how many bytes were read.
    pub(crate) fn gather(&self, runs: &[Range<u64>]) -> Result<(Bytes, u64), StorageError> {
        let start = self.range.start;
        let at: Vec<Range<u64>> = runs.iter().map(|r| start + r.start..start + r.end).collect();
        pread_gather(self.mapping.file(), &at, &self.source_name, &self.key)
    }

    /// Every byte of the region, in order, handed to `each` a piece of at most `piece` bytes at
    /// a time, read with `pread` into one buffer (blocking). With `spare_page_cache`, the pages
    /// read are dropped from the page cache behind the reads, so reading a file larger than
    /// memory whole (to hash it) does not evict what is being served.
    pub(crate) fn read_in_pieces(
        &self,
        piece: usize,
        spare_page_cache: bool,
        mut each: impl FnMut(&[u8]),
    ) -> Result<(), StorageError> {
        let file = self.mapping.file();
        let mut buffer = vec![0u8; piece.max(4096)];
        let mut at = self.range.start;
        while at < self.range.end {
            let n = (self.range.end - at).min(buffer.len() as u64) as usize;
            pread_exact_into(file, at, &mut buffer[..n], &self.source_name, &self.key)?;
            each(&buffer[..n]);
            if spare_page_cache {
                let _ =
                    rustix::fs::fadvise(&**file, at, std::num::NonZeroU64::new(n as u64), rustix::fs::Advice::DontNeed);
            }
            at += n as u64;
        }
        Ok(())
    }
}

/// Copies `slice` into `copy` (resized to it) with `pread` from the file behind it when it is a
/// slice of a live mapping (a stored tensor of a built view, meant to be sent with `sendfile`),
/// never loading from the mapping; `None` when it is not in a mapping (bytes in memory, to be
/// used as they are).
pub(crate) fn copy_of_mapped(slice: &[u8], copy: &mut Vec<u8>) -> Option<Result<(), StorageError>> {
    let behind = super::mapped::file_behind(slice)?;
    copy.resize(slice.len(), 0);
    Some(pread_exact_into(&behind.file, behind.offset, copy, "", ""))
}

/// Largest piece a local read yields at once.
pub(crate) const READ_PIECE: u64 = 1 << 20;

/// Bytes `span` of `file`, read with one `pread` (blocking). A file that ends before them was
/// shrunk in place since it was listed.
fn pread_exact(file: &File, span: Range<u64>, source_name: &str, key: &str) -> Result<Bytes, StorageError> {
    let mut buffer = vec![0u8; (span.end - span.start) as usize];
    pread_exact_into(file, span.start, &mut buffer, source_name, key)?;
    Ok(Bytes::from(buffer))
}

/// Fills `buffer` from offset `at` of `file` with `pread` (blocking), as [`pread_exact`] does,
/// into memory the caller reuses.
pub(super) fn pread_exact_into(
    file: &File,
    at: u64,
    buffer: &mut [u8],
    source_name: &str,
    key: &str,
) -> Result<(), StorageError> {
    use std::os::unix::fs::FileExt as _;
    match file.read_exact_at(buffer, at) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            Err(StorageError::Changed { source_name: source_name.to_owned(), key: key.to_owned() })
        }
        Err(e) => Err(StorageError::Unavailable { source_name: source_name.to_owned(), message: e.to_string() }),
    }
}

/// Runs of a file closer than this are read with one `pread` and the gap dropped: a system
/// call costs about as much as copying this many bytes.
pub(super) const READ_THROUGH: u64 = 16 << 10;

/// The longest one such `pread` gets, whatever the runs: what a gather holds besides its output.
const READ_SPAN_MAX: u64 = 4 << 20;

/// `runs` of an open file (in order), back to back in one buffer, read with `pread` (for the
/// same reason as [`pread_stream`]: never loaded from the mapping), runs closer than
/// `READ_THROUGH` with one call; and how many bytes were read from the file.
fn pread_gather(file: &File, runs: &[Range<u64>], source_name: &str, key: &str) -> Result<(Bytes, u64), StorageError> {
    use std::os::unix::fs::FileExt as _;
    let total: u64 = runs.iter().map(|r| r.end - r.start).sum();
    let mut out = Vec::with_capacity(total as usize);
    with_scratch(|span_buffer| {
        let mut read = 0;
        let mut rest = runs;
        while let [first, ..] = rest {
            let close = |w: &&[Range<u64>]| {
                w[1].start.saturating_sub(w[0].end) <= READ_THROUGH && w[1].end - first.start <= READ_SPAN_MAX
            };
            let in_span = 1 + rest.windows(2).take_while(close).count();
            let (span_runs, after) = rest.split_at(in_span);
            let span = first.start..span_runs[in_span - 1].end;
            let span_buffer = scratch(span_buffer, (span.end - span.start) as usize);
            read += span.end - span.start;
            match file.read_exact_at(span_buffer, span.start) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Err(StorageError::Changed { source_name: source_name.to_owned(), key: key.to_owned() });
                }
                Err(e) => {
                    let message = e.to_string();
                    return Err(StorageError::Unavailable { source_name: source_name.to_owned(), message });
                }
            }
            for run in span_runs {
                out.extend_from_slice(&span_buffer[(run.start - span.start) as usize..(run.end - span.start) as usize]);
            }
            rest = after;
        }
        Ok((Bytes::from(out), read))
    })
}

/// Runs `read` with this thread's scratch buffer: reads through gaps and checksums land there,
/// and a blocking thread keeps it from one call to the next rather than zeroing a new one
/// (which cost as much as the read, for short runs).
pub(super) fn with_scratch<T>(read: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|buffer| match buffer.try_borrow_mut() {
        Ok(mut buffer) => {
            let result = read(&mut buffer);
            // A thread keeps at most a span's worth between calls, however long one run was.
            if buffer.len() as u64 > READ_SPAN_MAX {
                *buffer = Vec::new();
            }
            result
        }
        Err(_) => read(&mut Vec::new()),
    })
}

/// The first `len` bytes of `buffer`, grown (never shrunk) to hold them.
pub(super) fn scratch(buffer: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buffer.len() < len {
        buffer.resize(len, 0);
    }
    &mut buffer[..len]
}

/// `span` of an open file, read with `pread` in pieces of at most `READ_PIECE` off the async
/// runtime, the next piece read while the one before is used. Code that reads a model's bytes
/// itself (digest checks, decoding, content checks) reads them this way, never through the
/// mapping: a file truncated in place then ends the read with [`StorageError::Changed`]
/// instead of raising SIGBUS, which would kill the process (see [`MappedFile`]).
fn pread_stream(
    file: Arc<File>,
    span: Range<u64>,
    source_name: &str,
    key: &str,
) -> BoxStream<'static, Result<Bytes, StorageError>> {
    use futures_util::StreamExt as _;
    let (source_name, key) = (source_name.to_owned(), key.to_owned());
    let pieces =
        (span.start..span.end).step_by(READ_PIECE as usize).map(move |at| (at, (at + READ_PIECE).min(span.end)));
    futures_util::stream::iter(pieces)
        .map(move |(start, end)| {
            let (file, source_name, key) = (Arc::clone(&file), source_name.clone(), key.clone());
            async move {
                let unavailable = source_name.clone();
                tokio::task::spawn_blocking(move || pread_exact(&file, start..end, &source_name, &key))
                    .await
                    .unwrap_or_else(|e| {
                        Err(StorageError::Unavailable { source_name: unavailable, message: e.to_string() })
                    })
            }
        })
        .buffered(2)
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathered_runs_are_the_runs_bytes_whatever_their_gaps() {
        use std::io::Write as _;
        let bytes: Vec<u8> = (0..(12u64 << 20)).map(|i| (i % 251) as u8).collect();
        let dir = tempfile::tempdir().unwrap();
        std::fs::File::create(dir.path().join("f")).unwrap().write_all(&bytes).unwrap();
        let mapping = Arc::new(MappedFile::open(&dir.path().join("f")).unwrap());
        let file = FileRegion::whole(mapping, "test", "f");
        let every = |step: u64, len: u64| -> Vec<Range<u64>> {
            (0..bytes.len() as u64 - len).step_by(step as usize).map(|at| at..at + len).collect()
        };
        // Runs far apart, close together (read through), and tiny ones spread over 12 MiB.
        for runs in [every(1 << 20, 100), every(4096, 512), every(20 << 10, 3), every(1 << 30, 1)] {
            let (gathered, read) = file.gather(&runs).unwrap();
            let expected: Vec<u8> =
                runs.iter().flat_map(|r| bytes[r.start as usize..r.end as usize].to_vec()).collect();
            assert_eq!(gathered, expected);
            let wanted: u64 = runs.iter().map(|r| r.end - r.start).sum();
            assert!(read >= wanted && read <= wanted + runs.len() as u64 * READ_THROUGH, "{read} read for {wanted}");
        }
        assert!(matches!(
            file.gather(std::slice::from_ref(&((12 << 20) - 1..(12 << 20) + 1))),
            Err(crate::storage::StorageError::Changed { .. })
        ));
    }
}
