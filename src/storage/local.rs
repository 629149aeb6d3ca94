//! Local files, memory-mapped for zero-copy reads. The only module with `unsafe`.

use std::fs::File;
use std::io;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

/// A whole file, read-only and mapped (or empty: a zero-length file cannot be mapped).
pub struct MappedFile {
    map: Option<Mmap>,
}

impl MappedFile {
    pub fn open(path: &Path) -> io::Result<MappedFile> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        if len == 0 {
            return Ok(MappedFile { map: None });
        }
        // SAFETY: the map is read-only and never outlives this value, so no reference into it
        // dangles. The remaining hazard is another process changing the file underneath us:
        // replacing it by rename is harmless (the map keeps the old inode alive), but
        // truncating it in place makes reads past the new end raise SIGBUS. The CLI reads a
        // file once and exits, so there a concurrent truncation ends the command, as it would
        // for `cat`; the long-lived server must not rely on this type alone for that reason.
        let map = unsafe { Mmap::map(&file)? };
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Sequential);
        Ok(MappedFile { map: Some(map) })
    }
}

impl Deref for MappedFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}
