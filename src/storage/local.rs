//! Local files, memory-mapped for zero-copy reads, and the storage metrics for them. The only
//! module with `unsafe`.

use std::fs::File;
use std::io;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

use crate::telemetry::names;

/// Records one blocking read from local storage (`kind`: what it was for) and its bytes.
pub fn record_read(kind: &'static str, started: std::time::Instant, bytes: u64) {
    metrics::histogram!(names::STORAGE_READ_DURATION, "backend" => "local", "kind" => kind)
        .record(started.elapsed().as_secs_f64());
    if bytes > 0 {
        record_mapped(kind, bytes);
    }
}

/// Records bytes read for `purpose` (manifest, serve, decode or verify). Bytes taken from a
/// mapping are read by the kernel on first touch, so there is no read to time, only bytes to
/// count.
pub fn record_mapped(purpose: &'static str, bytes: u64) {
    metrics::counter!(names::STORAGE_READ_BYTES, "backend" => "local", "purpose" => purpose).increment(bytes);
}

/// A whole file, read-only and mapped (or empty: a zero-length file cannot be mapped), with
/// its descriptor kept open so its current length can be checked before bytes are served.
pub struct MappedFile {
    file: File,
    map: Option<Mmap>,
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
            return Ok(MappedFile { file, map: None });
        }
        // SAFETY: the map is read-only and never outlives this value, so no reference into it
        // dangles. The remaining hazard is another process changing the file underneath us:
        // replacing it by rename is harmless (the map keeps the old inode alive), but
        // truncating it in place makes reads past the new end raise SIGBUS. The CLI reads a
        // file once and exits, so there a concurrent truncation ends the command, as it would
        // for `cat`. The server checks `current_len` against the manifest before each response,
        // which narrows but does not close that window.
        let map = unsafe { Mmap::map(&file)? };
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Sequential);
        Ok(MappedFile { file, map: Some(map) })
    }

    /// The file's length now, from its descriptor: smaller than the mapping if it was
    /// truncated in place since it was mapped.
    pub fn current_len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
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
