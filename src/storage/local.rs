//! Local directories as a [`super::Storage`]: listed by walking them, read as regions of files
//! mapped whole (`mapped.rs`), and the storage metrics for them.

use std::fs::File;
use std::io;
use std::sync::Arc;

use super::mapped::MappedFile;
use super::scan::{FileIdentity, version_of};

/// Records one blocking read from local storage (`kind`: what it was for) and its bytes.
pub fn record_read(kind: &'static str, started: std::time::Instant, bytes: u64) {
    super::record_read("local", kind, started, bytes);
}

/// Records bytes read for `purpose` (manifest, serve, decode or verify). Bytes taken from a
/// mapping are read by the kernel on first touch, so there is no read to time, only bytes to
/// count.
pub fn record_mapped(purpose: &'static str, bytes: u64) {
    super::record_bytes("local", purpose, bytes);
}

/// A local directory as a [`super::Storage`]: listed by walking it, read as regions of
/// files mapped whole ([`super::Payload::File`]), each mapping checked against the version
/// listed through the descriptor it was made from.
#[derive(Debug)]
pub struct LocalStorage {
    name: String,
    root: std::path::PathBuf,
}

/// Largest piece a local read yields at once.
pub const READ_PIECE: u64 = 1 << 20;

/// Bytes `span` of `file`, read with one `pread` (blocking). A file that ends before them was
/// shrunk in place since it was listed.
pub fn pread_exact(
    file: &File,
    span: std::ops::Range<u64>,
    source_name: &str,
    key: &str,
) -> Result<bytes::Bytes, super::StorageError> {
    let mut buffer = vec![0u8; (span.end - span.start) as usize];
    pread_exact_into(file, span.start, &mut buffer, source_name, key)?;
    Ok(bytes::Bytes::from(buffer))
}

/// Fills `buffer` from offset `at` of `file` with `pread` (blocking), as [`pread_exact`] does,
/// into memory the caller reuses.
pub fn pread_exact_into(
    file: &File,
    at: u64,
    buffer: &mut [u8],
    source_name: &str,
    key: &str,
) -> Result<(), super::StorageError> {
    use std::os::unix::fs::FileExt as _;
    match file.read_exact_at(buffer, at) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            Err(super::StorageError::Changed { source_name: source_name.to_owned(), key: key.to_owned() })
        }
        Err(e) => Err(super::StorageError::Unavailable { source_name: source_name.to_owned(), message: e.to_string() }),
    }
}

/// Runs of a file closer than this are read with one `pread` and the gap dropped: a system
/// call costs about as much as copying this many bytes.
const READ_THROUGH: u64 = 16 << 10;

/// The longest one such `pread` gets, whatever the runs: what a gather holds besides its output.
const READ_SPAN_MAX: u64 = 4 << 20;

/// `runs` of an open file (in order), back to back in one buffer, read with `pread` (for the
/// same reason as [`pread_stream`]: never loaded from the mapping), runs closer than
/// `READ_THROUGH` with one call; and how many bytes were read from the file.
pub fn pread_gather(
    file: &File,
    runs: &[std::ops::Range<u64>],
    source_name: &str,
    key: &str,
) -> Result<(bytes::Bytes, u64), super::StorageError> {
    use std::os::unix::fs::FileExt as _;
    let total: u64 = runs.iter().map(|r| r.end - r.start).sum();
    let mut out = Vec::with_capacity(total as usize);
    with_scratch(|span_buffer| {
        let mut read = 0;
        let mut rest = runs;
        while let [first, ..] = rest {
            let close = |w: &&[std::ops::Range<u64>]| {
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
                    return Err(super::StorageError::Changed {
                        source_name: source_name.to_owned(),
                        key: key.to_owned(),
                    });
                }
                Err(e) => {
                    let message = e.to_string();
                    return Err(super::StorageError::Unavailable { source_name: source_name.to_owned(), message });
                }
            }
            for run in span_runs {
                out.extend_from_slice(&span_buffer[(run.start - span.start) as usize..(run.end - span.start) as usize]);
            }
            rest = after;
        }
        Ok((bytes::Bytes::from(out), read))
    })
}

/// Runs `read` with this thread's scratch buffer: reads through gaps and checksums land there,
/// and a blocking thread keeps it from one call to the next rather than zeroing a new one
/// (which cost as much as the read, for short runs).
fn with_scratch<T>(read: impl FnOnce(&mut Vec<u8>) -> T) -> T {
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
fn scratch(buffer: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buffer.len() < len {
        buffer.resize(len, 0);
    }
    &mut buffer[..len]
}

/// Bytes in a block of [`BlockSums`].
pub const SUM_BLOCK: u64 = 64 << 10;

/// The CRC32C of every [`SUM_BLOCK`] of one version of a local file, each learnt the first time
/// a run covering it whole is checksummed and kept: the checksum of a long run is then combined
/// from them, and only its ends are read. 4 bytes and a bit per block (66 KB per GB).
#[derive(Debug)]
pub struct BlockSums {
    sums: Box<[std::sync::atomic::AtomicU32]>,
    /// One bit per block: its sum is known.
    known: Box<[std::sync::atomic::AtomicU64]>,
}

/// `crc` as if followed by [`SUM_BLOCK`] zero bytes: the linear map `crc32c_combine` applies
/// for that length, as its 32 columns, so appending a block's sum costs 32 steps, not a
/// combine's 17 matrix squarings.
fn after_block(crc: u32) -> u32 {
    static COLUMNS: std::sync::LazyLock<[u32; 32]> =
        std::sync::LazyLock::new(|| std::array::from_fn(|bit| crc32c::crc32c_combine(1 << bit, 0, SUM_BLOCK as usize)));
    (0..32).filter(|bit| crc >> bit & 1 == 1).fold(0, |out, bit| out ^ COLUMNS[bit])
}

impl BlockSums {
    /// The sums of a file of `len` bytes, none known yet.
    pub fn new(len: u64) -> BlockSums {
        let blocks = len.div_ceil(SUM_BLOCK) as usize;
        BlockSums {
            sums: (0..blocks).map(|_| std::sync::atomic::AtomicU32::new(0)).collect(),
            known: (0..blocks.div_ceil(64)).map(|_| std::sync::atomic::AtomicU64::new(0)).collect(),
        }
    }

    fn get(&self, block: usize) -> Option<u32> {
        use std::sync::atomic::Ordering;
        let known = self.known[block / 64].load(Ordering::Acquire) >> (block % 64) & 1 == 1;
        known.then(|| self.sums[block].load(Ordering::Relaxed))
    }

    fn learn(&self, block: usize, sum: u32) {
        use std::sync::atomic::Ordering;
        self.sums[block].store(sum, Ordering::Relaxed);
        self.known[block / 64].fetch_or(1 << (block % 64), Ordering::Release);
    }

    /// The CRC32C of `runs` of `file` (in order, as if back to back), read with `pread` into
    /// one buffer of at most [`READ_PIECE`] bytes reused throughout (blocking): a whole block of
    /// a long run from its sum (read and learnt when unknown), the rest read; runs closer than
    /// `READ_THROUGH` a span at a time.
    pub fn crc32c_of_runs(
        &self,
        file: &File,
        runs: impl Iterator<Item = std::ops::Range<u64>>,
        source_name: &str,
        key: &str,
    ) -> Result<u32, super::StorageError> {
        with_scratch(|buffer| self.crc32c_of_runs_into(file, runs, buffer, source_name, key))
    }

    fn crc32c_of_runs_into(
        &self,
        file: &File,
        runs: impl Iterator<Item = std::ops::Range<u64>>,
        buffer: &mut Vec<u8>,
        source_name: &str,
        key: &str,
    ) -> Result<u32, super::StorageError> {
        let mut crc = 0;
        let mut runs = runs.filter(|run| !run.is_empty()).peekable();
        while let Some(first) = runs.next() {
            if first.end - first.start > READ_THROUGH {
                crc = self.crc32c_of_run(file, crc, first, buffer, source_name, key)?;
                continue;
            }
            let mut span = vec![first];
            while let Some(next) = runs.next_if(|next| {
                let last = span.last().expect("never empty");
                next.end - next.start <= READ_THROUGH
                    && next.start.saturating_sub(last.end) <= READ_THROUGH
                    && next.end - span[0].start <= READ_PIECE
            }) {
                span.push(next);
            }
            let (start, end) = (span[0].start, span[span.len() - 1].end);
            let read = scratch(buffer, (end - start) as usize);
            pread_exact_into(file, start, read, source_name, key)?;
            for run in &span {
                crc = crc32c::crc32c_append(crc, &read[(run.start - start) as usize..(run.end - start) as usize]);
            }
        }
        Ok(crc)
    }

    /// `crc` extended over one long run: its whole blocks by their sums, its ends read.
    fn crc32c_of_run(
        &self,
        file: &File,
        mut crc: u32,
        run: std::ops::Range<u64>,
        buffer: &mut Vec<u8>,
        source_name: &str,
        key: &str,
    ) -> Result<u32, super::StorageError> {
        let mut at = run.start;
        while at < run.end {
            let block = (at / SUM_BLOCK) as usize;
            let block_end = (block as u64 + 1) * SUM_BLOCK;
            if at.is_multiple_of(SUM_BLOCK) && block_end <= run.end && block < self.sums.len() {
                let sum = match self.get(block) {
                    Some(sum) => sum,
                    None => {
                        let read = scratch(buffer, SUM_BLOCK as usize);
                        pread_exact_into(file, at, read, source_name, key)?;
                        let sum = crc32c::crc32c(read);
                        self.learn(block, sum);
                        sum
                    }
                };
                crc = after_block(crc) ^ sum;
                at = block_end;
            } else {
                let end = run.end.min(block_end);
                let read = scratch(buffer, (end - at) as usize);
                pread_exact_into(file, at, read, source_name, key)?;
                crc = crc32c::crc32c_append(crc, read);
                at = end;
            }
        }
        Ok(crc)
    }
}

/// `span` of an open file, read with `pread` in pieces of at most `READ_PIECE` off the async
/// runtime, the next piece read while the one before is used. Code that reads a model's bytes
/// itself (digest checks, decoding, content checks) reads them this way, never through the
/// mapping: a file truncated in place then ends the read with [`super::StorageError::Changed`]
/// instead of raising SIGBUS, which would kill the process (see [`MappedFile::open`]).
pub fn pread_stream(
    file: Arc<File>,
    span: std::ops::Range<u64>,
    source_name: &str,
    key: &str,
) -> futures_util::stream::BoxStream<'static, Result<bytes::Bytes, super::StorageError>> {
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
                        Err(super::StorageError::Unavailable { source_name: unavailable, message: e.to_string() })
                    })
            }
        })
        .buffered(2)
        .boxed()
}

impl LocalStorage {
    /// The source `name` over the directory `root`.
    pub fn new(name: &str, root: impl Into<std::path::PathBuf>) -> LocalStorage {
        LocalStorage { name: name.to_owned(), root: root.into() }
    }

    fn unavailable(&self, e: impl std::fmt::Display) -> super::StorageError {
        super::StorageError::Unavailable { source_name: self.name.clone(), message: e.to_string() }
    }
}

impl super::Storage for LocalStorage {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "local"
    }

    /// The version without its device: a container's overlay is a new device at every start,
    /// while the inode, size and times of an image's file stay what they were.
    fn content_version<'v>(&self, version: &'v str) -> &'v str {
        version.split_once('-').map_or(version, |(_device, rest)| rest)
    }

    fn list(&self) -> futures_util::future::BoxFuture<'_, Result<Vec<super::Listed>, super::StorageError>> {
        use futures_util::FutureExt as _;
        let root = self.root.clone();
        async move {
            let (found, _) = tokio::task::spawn_blocking(move || super::scan::scan_local(&root))
                .await
                .map_err(|e| self.unavailable(e))?
                .map_err(|e| self.unavailable(e))?;
            let mut listed: Vec<super::Listed> = found
                .into_iter()
                .map(|f| super::Listed { key: f.key, size: f.identity.size, version: version_of(&f.identity) })
                .collect();
            listed.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(listed)
        }
        .boxed()
    }

    fn maps_files(&self) -> bool {
        true
    }

    fn read(
        &self,
        key: &str,
        range: super::ByteRange,
        version: &str,
    ) -> futures_util::future::BoxFuture<'_, Result<super::Read, super::StorageError>> {
        use futures_util::FutureExt as _;
        let (key, version) = (key.to_owned(), version.to_owned());
        let path = self.root.join(&key);
        let name = self.name.clone();
        async move {
            // Mapped, then compared with the version listed through the mapping's own
            // descriptor, so the bytes are exactly that version's even if the path was
            // replaced meanwhile.
            let opened = tokio::task::spawn_blocking(move || match MappedFile::open(&path) {
                Ok(mapping) => {
                    let identity = FileIdentity::of(&mapping.file().metadata()?);
                    Ok(Some((version_of(&identity) == version, identity.size, mapping)))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            })
            .await
            .map_err(|e| self.unavailable(e))?;
            let (mapping, size) = match opened {
                Ok(None) => return Err(super::StorageError::NotFound { source_name: name, key }),
                Ok(Some((false, _, _))) => return Err(super::StorageError::Changed { source_name: name, key }),
                Ok(Some((true, size, mapping))) => (Arc::new(mapping), size),
                Err(e) => {
                    return Err(super::StorageError::Unreadable { source_name: name, key, message: e.to_string() });
                }
            };
            let span = match range {
                super::ByteRange::Bounded(r) if r.end <= size && r.start <= r.end => r,
                super::ByteRange::Bounded(r) => {
                    return Err(super::StorageError::OutOfRange { source_name: name, start: r.start, end: r.end });
                }
                super::ByteRange::Suffix(n) => size.saturating_sub(n)..size,
            };
            Ok(super::Read { size, range: span, payload: super::Payload::File { mapping, source_name: name, key } })
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_of_runs_is_the_crc32c_of_their_bytes_whether_its_blocks_are_known_or_not() {
        use std::io::Write as _;
        let len = 3 * SUM_BLOCK + 1234;
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&bytes).unwrap();
        let expected = |runs: &[std::ops::Range<u64>]| {
            runs.iter().fold(0, |crc, r| crc32c::crc32c_append(crc, &bytes[r.start as usize..r.end as usize]))
        };
        let sums = BlockSums::new(len);
        let cases: Vec<Vec<std::ops::Range<u64>>> = vec![
            vec![0..len],
            vec![100..len - 7, 0..5],
            vec![SUM_BLOCK..3 * SUM_BLOCK],
            (0..len - 600).step_by(4096).map(|at| at..at + 600).collect(),
            vec![5..5, 7..SUM_BLOCK + 9, 2 * SUM_BLOCK - 3..len],
        ];
        for round in 0..2 {
            for runs in &cases {
                let found = sums.crc32c_of_runs(&file, runs.iter().cloned(), "test", "f").unwrap();
                assert_eq!(found, expected(runs), "round {round}, runs {runs:?}");
            }
        }
        assert!((0..3).all(|block| sums.get(block).is_some()), "every whole block was learnt");
        assert_eq!(sums.get(3), None, "the file's last, partial block is never learnt");
    }

    #[test]
    fn appending_a_block_by_its_sum_is_appending_its_bytes() {
        let block: Vec<u8> = (0..SUM_BLOCK).map(|i| (i % 241) as u8).collect();
        for crc in [0, 1, 0xFFFF_FFFF, 0x1234_5678, crc32c::crc32c(b"ztserve")] {
            assert_eq!(after_block(crc) ^ crc32c::crc32c(&block), crc32c::crc32c_append(crc, &block));
        }
    }

    #[test]
    fn gathered_runs_are_the_runs_bytes_whatever_their_gaps() {
        use std::io::Write as _;
        let bytes: Vec<u8> = (0..(12u64 << 20)).map(|i| (i % 251) as u8).collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&bytes).unwrap();
        let every = |step: u64, len: u64| -> Vec<std::ops::Range<u64>> {
            (0..bytes.len() as u64 - len).step_by(step as usize).map(|at| at..at + len).collect()
        };
        // Runs far apart, close together (read through), and tiny ones spread over 12 MiB.
        for runs in [every(1 << 20, 100), every(4096, 512), every(20 << 10, 3), every(1 << 30, 1)] {
            let (gathered, read) = pread_gather(&file, &runs, "test", "f").unwrap();
            let expected: Vec<u8> =
                runs.iter().flat_map(|r| bytes[r.start as usize..r.end as usize].to_vec()).collect();
            assert_eq!(gathered, expected);
            let wanted: u64 = runs.iter().map(|r| r.end - r.start).sum();
            assert!(read >= wanted && read <= wanted + runs.len() as u64 * READ_THROUGH, "{read} read for {wanted}");
        }
        assert!(matches!(
            pread_gather(&file, std::slice::from_ref(&((12 << 20) - 1..(12 << 20) + 1)), "test", "f"),
            Err(crate::storage::StorageError::Changed { .. })
        ));
    }

    #[test]
    fn a_files_content_is_named_without_its_device_which_a_remount_changes() {
        use crate::storage::Storage as _;
        let storage = LocalStorage::new("src", std::path::Path::new("/nowhere"));
        let identity = |device| FileIdentity { device, inode: 7, size: 9, mtime_ns: 11, ctime_ns: 13 };
        let (here, remounted) = (version_of(&identity(1)), version_of(&identity(2)));
        assert_ne!(here, remounted);
        assert_eq!(storage.content_version(&here), storage.content_version(&remounted));
        assert_eq!(storage.content_version(&here), "7-9-b-d");
    }
}
