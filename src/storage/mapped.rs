//! Files mapped whole, read-only: the only module with `unsafe`. Every live mapping is
//! registered with the file behind it, so a socket can send a slice of one from the file
//! (`sendfile`, when on) or hand it to `writev` (see `transport::zero_copy`); nothing in the
//! process loads from a mapping itself (see the SAFETY note in [`MappedFile::open`]).
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::ops::Deref;
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};

use memmap2::Mmap;

/// A whole file, read-only and mapped (or empty: a zero-length file cannot be mapped), with
/// its descriptor kept open so its current length can be checked before bytes are served.
pub struct MappedFile {
    file: Arc<File>,
    map: Option<Mmap>,
}

/// A live mapping, by its start address in [`MAPPINGS`].
struct Mapping {
    len: usize,
    file: Arc<File>,
    /// A body written once and sent whole to many clients (a rendered manifest): sent with
    /// `sendfile` even where the server copies model bytes with `writev`.
    always_sendfile: bool,
}

/// Live mappings by start address.
static MAPPINGS: RwLock<BTreeMap<usize, Mapping>> = RwLock::new(BTreeMap::new());

/// Where a slice of a live mapping lies in its file.
pub struct FileBehind {
    pub file: Arc<File>,
    pub offset: u64,
    /// Whether the slice is to leave with `sendfile` whatever `server.sendfile` says
    /// ([`MappedFile::temporary`]).
    pub always_sendfile: bool,
}

/// The file whose mapping holds all of `slice`, and the slice's offset in it; `None` for
/// bytes that are not in a live mapping. The answer stays true while `slice` is borrowed:
/// the mapping cannot be dropped, and so deregistered, while its bytes are in use.
pub fn file_behind(slice: &[u8]) -> Option<FileBehind> {
    mapping_at(slice.as_ptr() as usize, slice.len())
}

/// The file mapped at addresses `start..start + len`, if one mapping spans them all.
fn mapping_at(start: usize, len: usize) -> Option<FileBehind> {
    let mappings = MAPPINGS.read().unwrap_or_else(PoisonError::into_inner);
    let (&base, mapping) = mappings.range(..=start).next_back()?;
    (start + len <= base + mapping.len).then(|| FileBehind {
        file: Arc::clone(&mapping.file),
        offset: (start - base) as u64,
        always_sendfile: mapping.always_sendfile,
    })
}

impl MappedFile {
    pub fn open(path: &Path) -> io::Result<MappedFile> {
        let started = std::time::Instant::now();
        let mapped = Self::map(path);
        super::record_read("local", "map", started, 0);
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
        //   `pread` (`region.rs`), which reports a shrunk file as an error.
        // We chose this over a SIGBUS handler (async-signal-safe recovery that remaps zero pages
        // under a running thread, and must not misfire on other faults) and over size checks
        // before each load (always racy): it needs no signal code and has no window.
        // `tests/it/faults.rs` truncates mapped files under every route. The CLI reads a file once
        // and exits, so there a concurrent truncation ends the command, as it would for `cat`.
        let map = unsafe { Mmap::map(&file)? };
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Sequential);
        Ok(Self::registered(file, map, false))
    }

    /// A copy of `bytes` in an unlinked temporary file, mapped: responses send its slices
    /// with `sendfile` from the file, even where `server.sendfile` is off, instead of copying
    /// them. A body sent whole to many clients at once (a manifest) costs its server a copy
    /// per response otherwise, a third of its CPU; one large stream does not gain the same
    /// (bench/README.md: "Design choices measured"). A regular file, not a memfd: the kernel
    /// splices a memfd's pages one lookup at a time and a page-cache file's in batches.
    pub fn temporary(bytes: &[u8]) -> io::Result<MappedFile> {
        use std::io::Write as _;
        let mut file = tempfile::tempfile()?;
        file.write_all(bytes)?;
        if bytes.is_empty() {
            return Ok(MappedFile { file: Arc::new(file), map: None });
        }
        // SAFETY: no other process can reach this unlinked file, and it is never written again.
        let map = unsafe { Mmap::map(&file)? };
        Ok(Self::registered(file, map, true))
    }

    fn registered(file: File, map: Mmap, always_sendfile: bool) -> MappedFile {
        let file = Arc::new(file);
        let mapping = Mapping { len: map.len(), file: Arc::clone(&file), always_sendfile };
        MAPPINGS.write().unwrap_or_else(PoisonError::into_inner).insert(map.as_ptr() as usize, mapping);
        MappedFile { file, map: Some(map) }
    }

    /// The open file mapped: what a [`super::FileRegion`] reads the same bytes from.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// Whether the file mapped is still the version its backend listed (one `fstat`,
    /// blocking; see [`super::scan::is_version`]); a failed `fstat` says it is not.
    pub fn is_version(&self, version: &str) -> bool {
        super::scan::is_version(&self.file, version).unwrap_or(false)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_of_a_live_mapping_lead_to_its_file_and_nothing_else_does() {
        let bytes: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let mapped = MappedFile::temporary(&bytes).unwrap();
        let behind = file_behind(&mapped[1000..5000]).expect("a slice of the mapping");
        assert_eq!(behind.offset, 1000);
        assert!(behind.always_sendfile, "a rendered body leaves with sendfile");
        let mut read = vec![0; 4000];
        std::os::unix::fs::FileExt::read_exact_at(&*behind.file, &mut read, behind.offset).unwrap();
        assert_eq!(read, bytes[1000..5000]);
        assert_eq!(file_behind(&mapped[..]).map(|behind| behind.offset), Some(0));
        assert!(file_behind(&bytes[1000..5000]).is_none(), "heap bytes are not in a mapping");
        let start = mapped.as_ptr() as usize;
        assert!(mapping_at(start + 99_999, 1).is_some(), "the last byte");
        assert!(mapping_at(start + 99_999, 2).is_none(), "a range running past the mapping's end");
        drop(mapped);
        assert!(mapping_at(start, 1).is_none(), "a dropped mapping is forgotten");
    }
}
