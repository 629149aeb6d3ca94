//! The deltas kept on disk, so a fleet's second rank (and every rank after a restart) is
//! answered without reading both versions again. One file per delta in `refits.delta_dir`
//! (absent: a temporary directory removed when the store is dropped, with the server), named by
//! the hex SHA-256 of its key (both model ids and versions, the object, component and slice),
//! written to a temporary file and renamed into place, so a reader never sees half a file. Each
//! file is the delta's bytes followed by their CRC32C (four bytes, big-endian), checked on
//! every read: a file that fails is removed, logged and counted, and the delta is computed
//! again. The files together hold at most `refits.delta_cache_bytes`; past it, the least
//! recently read (or written) are removed, each file counted as at least a filesystem block. One
//! server to a directory: a second would count its own files only, and remove the first's
//! temporary files at start. On start the files already in the directory are
//! indexed (by their modification time, oldest first) and checked only when read; leftover
//! temporary files are removed. Every method does file I/O: call them off the async runtime.
//! The index's lock is never held across I/O.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};

/// The prefix of a file being written (removed at start when a crash left one behind).
const TMP_PREFIX: &str = ".tmp-";

/// The bytes a kept file adds after the delta: its CRC32C, big-endian.
const TRAILER: usize = 4;

/// The least a file is counted as against the bound: a filesystem block and an inode, so many
/// tiny deltas cannot hold more disk than the bound says.
const FILE_AT_LEAST: u64 = 4096;

/// What a file of `len` bytes counts against the bound.
fn charged(len: u64) -> u64 {
    len.max(FILE_AT_LEAST)
}

/// A bounded store of deltas on disk, by key.
pub(super) struct DeltaStore {
    dir: PathBuf,
    /// The temporary directory the files are in when none was configured: removed on drop.
    _temp: Option<tempfile::TempDir>,
    bound: u64,
    index: Mutex<Index>,
}

/// Which files are held, how long each is, and in which order they were last read.
#[derive(Default)]
struct Index {
    /// File name -> (length on disk, tick of its last use).
    files: HashMap<String, (u64, u64)>,
    /// Tick of last use -> file name: the least recently used first.
    order: BTreeMap<u64, String>,
    total: u64,
    tick: u64,
}

impl Index {
    fn touch(&mut self, name: &str) -> bool {
        self.tick += 1;
        let tick = self.tick;
        match self.files.get_mut(name) {
            Some((_, used)) => {
                self.order.remove(used);
                *used = tick;
                self.order.insert(tick, name.to_owned());
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, name: String, len: u64) {
        self.remove(&name);
        self.tick += 1;
        self.order.insert(self.tick, name.clone());
        self.files.insert(name, (len, self.tick));
        self.total += len;
    }

    fn remove(&mut self, name: &str) {
        if let Some((len, used)) = self.files.remove(name) {
            self.order.remove(&used);
            self.total -= len;
        }
    }

    /// The least recently used names to remove for the total to be at most `bound`, taken out
    /// of the index (their files are removed by the caller, without the lock).
    fn evict_to(&mut self, bound: u64) -> Vec<String> {
        let mut evicted = Vec::new();
        while self.total > bound {
            let Some((_, name)) = self.order.pop_first() else { break };
            if let Some((len, _)) = self.files.remove(&name) {
                self.total -= len;
            }
            evicted.push(name);
        }
        evicted
    }
}

/// The name of the file a delta of `key` is kept in: the hex SHA-256 of its parts, each
/// length-prefixed so no two keys run together.
pub(super) fn file_name(key: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in key {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

impl DeltaStore {
    /// The store in `dir` (created if absent; its files indexed), or in a new temporary
    /// directory, holding at most `bound` bytes.
    pub(super) fn open(dir: Option<&Path>, bound: u64) -> std::io::Result<DeltaStore> {
        let (dir, temp) = match dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                (dir.to_path_buf(), None)
            }
            None => {
                let temp = tempfile::Builder::new().prefix("ztserve-deltas-").tempdir()?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let meta = entry.metadata()?;
            if !meta.is_file() {
                continue;
            }
            if name.starts_with(TMP_PREFIX) {
                let _ = std::fs::remove_file(entry.path());
            } else if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
                found.push((meta.modified().ok(), name, meta.len()));
            }
        }
        found.sort();
        let mut index = Index::default();
        for (_, name, len) in found {
            index.insert(name, charged(len));
        }
        let store = DeltaStore { dir, _temp: temp, bound, index: Mutex::new(index) };
        let evicted = store.index.lock().expect("index lock").evict_to(bound);
        store.remove_files(&evicted);
        Ok(store)
    }

    /// The delta kept as `name` and its CRC32C, checked; `None` when none is kept, or the one
    /// kept fails its check (it is removed).
    pub(super) fn get(&self, name: &str) -> Option<(Bytes, u32)> {
        if !self.index.lock().expect("index lock").touch(name) {
            return None;
        }
        let path = self.dir.join(name);
        let checked = match std::fs::read(&path) {
            Ok(mut bytes) if bytes.len() >= TRAILER => {
                let at = bytes.len() - TRAILER;
                let crc = u32::from_be_bytes(bytes[at..].try_into().expect("four bytes"));
                if crc32c::crc32c(&bytes[..at]) == crc {
                    bytes.truncate(at);
                    Ok((bytes, crc))
                } else {
                    Err("its CRC32C does not match its bytes".to_owned())
                }
            }
            Ok(bytes) => Err(format!("it is {} bytes, shorter than its checksum", bytes.len())),
            Err(e) => Err(e.to_string()),
        };
        match checked {
            Ok((bytes, crc)) => Some((Bytes::from(bytes), crc)),
            Err(reason) => {
                tracing::warn!(file = %path.display(), %reason, "a kept delta failed its check: removed, computed again");
                metrics::counter!(crate::telemetry::names::DELTA_STORE_DAMAGED).increment(1);
                self.index.lock().expect("index lock").remove(name);
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Keeps `delta` as `name` with `crc`, its CRC32C, then evicts the least recently used past the
    /// bound. A delta larger than the whole bound is not kept; a failure to write is logged.
    pub(super) fn put(&self, name: &str, delta: &[u8], crc: u32) {
        let len = charged((delta.len() + TRAILER) as u64);
        if len > self.bound {
            return;
        }
        // Room first, so a write does not take the files past the bound (short of two at once).
        let evicted = self.index.lock().expect("index lock").evict_to(self.bound - len);
        self.remove_files(&evicted);
        if let Err(e) = self.write(name, delta, crc) {
            tracing::warn!(error = %e, dir = %self.dir.display(), "a delta could not be kept");
            return;
        }
        let evicted = {
            let mut index = self.index.lock().expect("index lock");
            index.insert(name.to_owned(), len);
            index.evict_to(self.bound)
        };
        self.remove_files(&evicted);
    }

    fn write(&self, name: &str, delta: &[u8], crc: u32) -> std::io::Result<()> {
        let mut file = tempfile::Builder::new().prefix(TMP_PREFIX).tempfile_in(&self.dir)?;
        file.write_all(delta)?;
        file.write_all(&crc.to_be_bytes())?;
        file.persist(self.dir.join(name)).map_err(|e| e.error)?;
        Ok(())
    }

    fn remove_files(&self, names: &[String]) {
        for name in names {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
    }

    /// The bytes the kept files hold, checksums included.
    #[cfg(test)]
    pub(super) fn total(&self) -> u64 {
        self.index.lock().expect("index lock").total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_delta_is_read_back_and_a_damaged_one_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = DeltaStore::open(Some(dir.path()), 1 << 20).unwrap();
        let name = file_name(&["a", "b"]);
        assert_eq!(store.get(&name), None);
        store.put(&name, b"delta bytes", crc32c::crc32c(b"delta bytes"));
        assert_eq!(store.get(&name).unwrap().0, &b"delta bytes"[..]);
        let path = dir.path().join(&name);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[0] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(store.get(&name), None);
        assert!(!path.exists());
        assert_eq!(store.total(), 0);
    }

    #[test]
    fn the_least_recently_read_are_evicted_past_the_bound_and_files_found_at_start_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = DeltaStore::open(Some(dir.path()), 3 * FILE_AT_LEAST).unwrap();
        let names: Vec<String> = (0..4).map(|i| file_name(&[&i.to_string()])).collect();
        for name in &names[..3] {
            store.put(name, &[7; 100], crc32c::crc32c(&[7; 100]));
        }
        assert!(store.get(&names[0]).is_some());
        store.put(&names[3], &[8; 100], crc32c::crc32c(&[8; 100]));
        assert!(store.total() <= 3 * FILE_AT_LEAST);
        assert!(store.get(&names[1]).is_none(), "the least recently read is evicted");
        assert!(store.get(&names[0]).is_some() && store.get(&names[3]).is_some());
        std::fs::write(dir.path().join(".tmp-left"), b"x").unwrap();
        drop(store);
        let again = DeltaStore::open(Some(dir.path()), 3 * FILE_AT_LEAST).unwrap();
        assert_eq!(again.total(), 3 * FILE_AT_LEAST, "each file counts at least a block");
        assert!(again.get(&names[2]).is_some());
        assert!(!dir.path().join(".tmp-left").exists());
        assert_ne!(file_name(&["ab", "c"]), file_name(&["a", "bc"]));
    }
}
