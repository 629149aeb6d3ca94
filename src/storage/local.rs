//! Local files, memory-mapped for zero-copy reads, and the storage metrics for them. Every
//! live mapping is registered with the file behind it, so a socket can send a slice of one
//! from the file (`sendfile`) instead of copying it (see `http::zero_copy`). The only module
//! with `unsafe`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::ops::Deref;
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};

use memmap2::Mmap;

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

/// A whole file, read-only and mapped (or empty: a zero-length file cannot be mapped), with
/// its descriptor kept open so its current length can be checked before bytes are served.
pub struct MappedFile {
    file: Arc<File>,
    map: Option<Mmap>,
}

/// Live mappings by start address: their length and the file mapped (from offset 0).
static MAPPINGS: RwLock<BTreeMap<usize, (usize, Arc<File>)>> = RwLock::new(BTreeMap::new());

/// The file whose mapping holds all of `slice`, and the slice's offset in it; `None` for
/// bytes that are not in a live mapping. The answer stays true while `slice` is borrowed:
/// the mapping cannot be dropped, and so deregistered, while its bytes are in use.
pub fn file_behind(slice: &[u8]) -> Option<(Arc<File>, u64)> {
    mapping_at(slice.as_ptr() as usize, slice.len())
}

/// The file mapped at addresses `start..start + len`, if one mapping spans them all.
fn mapping_at(start: usize, len: usize) -> Option<(Arc<File>, u64)> {
    let mappings = MAPPINGS.read().unwrap_or_else(PoisonError::into_inner);
    let (&base, (mapped, file)) = mappings.range(..=start).next_back()?;
    (start + len <= base + mapped).then(|| (Arc::clone(file), (start - base) as u64))
}

impl MappedFile {
    pub fn open(path: &Path) -> io::Result<MappedFile> {
        let started = std::time::Instant::now();
        let mapped = Self::map(path);
        record_read("map", started, 0);
        mapped
    }

    fn map(path: &Path) -> io::Result<MappedFile> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        if len == 0 {
            return Ok(MappedFile { file: Arc::new(file), map: None });
        }
        // SAFETY: the map is read-only and never outlives this value, so no reference into it
        // dangles. The remaining hazard is another process changing the file underneath us.
        // Replacing it by rename is harmless: the map keeps the old inode alive. Truncating it
        // in place makes any *user-space* load past the new end raise SIGBUS, which would kill
        // the process. So the server never loads from a model's mapping itself:
        // - bytes it sends leave by `sendfile` from the descriptor, or by `writev` for short
        //   slices; both are read by the kernel, which answers a vanished page with a short
        //   transfer or EFAULT (an error for that one connection), never a signal;
        // - bytes it reads itself (digest checks, decoding, content checks) are copied out with
        //   `pread` ([`pread_stream`]), which reports a shrunk file as an error.
        // We chose this over a SIGBUS handler (async-signal-safe recovery that remaps zero pages
        // under a running thread, and must not misfire on other faults) and over size checks
        // before each load (always racy): it needs no signal code and has no window.
        // `tests/faults.rs` truncates mapped files under every route. The CLI reads a file once
        // and exits, so there a concurrent truncation ends the command, as it would for `cat`.
        let map = unsafe { Mmap::map(&file)? };
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Sequential);
        Ok(Self::registered(file, map))
    }

    /// A copy of `bytes` in an unlinked temporary file, mapped: responses send its slices
    /// with `sendfile`, as they do a model file's, instead of copying them. A regular file,
    /// not a memfd: the kernel splices a memfd's pages one lookup at a time and a page-cache
    /// file's in batches (bench/README.md: "Design choices measured").
    pub fn temporary(bytes: &[u8]) -> io::Result<MappedFile> {
        use std::io::Write as _;
        let mut file = tempfile::tempfile()?;
        file.write_all(bytes)?;
        if bytes.is_empty() {
            return Ok(MappedFile { file: Arc::new(file), map: None });
        }
        // SAFETY: no other process can reach this unlinked file, and it is never written again.
        let map = unsafe { Mmap::map(&file)? };
        Ok(Self::registered(file, map))
    }

    fn registered(file: File, map: Mmap) -> MappedFile {
        let file = Arc::new(file);
        MAPPINGS
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(map.as_ptr() as usize, (map.len(), Arc::clone(&file)));
        MappedFile { file, map: Some(map) }
    }

    /// The file's length now, from its descriptor: smaller than the mapping if it was
    /// truncated in place since it was mapped.
    pub fn current_len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    /// The open file mapped: what [`pread_stream`] reads the same bytes from.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // Deregistered before the fields drop, so before the unmap: no lookup can find an
        // address range that is about to be reused.
        if let Some(map) = &self.map {
            MAPPINGS.write().unwrap_or_else(PoisonError::into_inner).remove(&(map.as_ptr() as usize));
        }
    }
}

impl Deref for MappedFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile").field("len", &self.len()).finish()
    }
}

impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// A local directory as a [`super::Storage`]: listed by walking it, read as regions of
/// files mapped whole ([`super::Payload::File`]), each mapping checked against the version
/// listed through the descriptor it was made from.
#[derive(Debug)]
pub struct LocalStorage {
    name: String,
    root: std::path::PathBuf,
}

/// A file version as a string: its identity (device, inode, size, modification time).
pub fn version_of(identity: &super::scan::FileIdentity) -> String {
    format!("{:x}-{:x}-{:x}-{:x}", identity.device, identity.inode, identity.size, identity.mtime_ns)
}

/// Largest piece a local read yields at once.
const READ_PIECE: u64 = 1 << 20;

/// `span` of an open file, read with `pread` in pieces of at most [`READ_PIECE`] off the async
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
    use std::os::unix::fs::FileExt as _;
    let (source_name, key) = (source_name.to_owned(), key.to_owned());
    let pieces =
        (span.start..span.end).step_by(READ_PIECE as usize).map(move |at| (at, (at + READ_PIECE).min(span.end)));
    futures_util::stream::iter(pieces)
        .map(move |(start, end)| {
            let (file, source_name, key) = (Arc::clone(&file), source_name.clone(), key.clone());
            async move {
                let read = tokio::task::spawn_blocking(move || {
                    let mut buffer = vec![0u8; (end - start) as usize];
                    file.read_exact_at(&mut buffer, start).map(|()| bytes::Bytes::from(buffer))
                })
                .await;
                match read {
                    Ok(Ok(piece)) => Ok(piece),
                    // The file ends before bytes it had when it was listed: shrunk in place.
                    Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        Err(super::StorageError::Changed { source_name, key })
                    }
                    Ok(Err(e)) => Err(super::StorageError::Unavailable { source_name, message: e.to_string() }),
                    Err(e) => Err(super::StorageError::Unavailable { source_name, message: e.to_string() }),
                }
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
                .map(|f| super::Listed {
                    key: format!("{}.zt", f.id),
                    size: f.identity.size,
                    version: version_of(&f.identity),
                })
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
                    let identity = super::scan::FileIdentity::of(&mapping.file().metadata()?);
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
    fn slices_of_a_live_mapping_lead_to_its_file_and_nothing_else_does() {
        let bytes: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let mapped = MappedFile::temporary(&bytes).unwrap();
        let (file, offset) = file_behind(&mapped[1000..5000]).expect("a slice of the mapping");
        assert_eq!(offset, 1000);
        let mut read = vec![0; 4000];
        std::os::unix::fs::FileExt::read_exact_at(&*file, &mut read, offset).unwrap();
        assert_eq!(read, bytes[1000..5000]);
        assert_eq!(file_behind(&mapped[..]).map(|(_, offset)| offset), Some(0));
        assert!(file_behind(&bytes[1000..5000]).is_none(), "heap bytes are not in a mapping");
        let start = mapped.as_ptr() as usize;
        assert!(mapping_at(start + 99_999, 1).is_some(), "the last byte");
        assert!(mapping_at(start + 99_999, 2).is_none(), "a range running past the mapping's end");
        drop(mapped);
        assert!(mapping_at(start, 1).is_none(), "a dropped mapping is forgotten");
    }
}
