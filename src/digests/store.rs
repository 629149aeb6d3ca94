//! The content digests known of the files model versions publish: the SHA-256 of each file's
//! bytes as served (the Hub API's ETag and LFS oid, the OCI blob digest, the S3 endpoint's
//! checksum) and of each file's image layer, kept in memory by the file's identity (its
//! source, model, path and strong ETag, which its version determines) and, when
//! `digests.store` is set, appended to a small file read back at start, so a restart reads no
//! file again. Each line carries a CRC-32C of itself, and the file is synced on a schedule: a
//! torn, corrupt or contradicted line is dropped at start (the store rewritten without it) and
//! its digest computed again, never published. A digest a list beside the files states
//! (`SHA256SUMS`) is kept apart until a whole read checks it.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::Digest as _;

/// What identifies one version of one published file.
pub(crate) type FileIdentity = [u8; 16];

/// The identity of file `path` of `model` (in `source`) whose strong ETag is `etag`.
pub(crate) fn file_identity(source: &str, model: &str, path: &str, etag: &str) -> FileIdentity {
    let mut hasher = sha2::Sha256::new();
    for part in [source, model, path, etag] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hasher.finalize()[..16].try_into().expect("16 of 32 bytes")
}

/// Why the digest store could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("digest store {path}: {source}")]
pub(crate) struct DigestStoreError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Every digest known, and the store they are appended to.
pub(crate) struct FileDigests {
    known: Mutex<HashMap<FileIdentity, [u8; 32]>>,
    /// Digests a list beside the files states (`SHA256SUMS`), trusted for listings until a
    /// whole read of the file checks them; never stored, so a restart reads the list again.
    stated: Mutex<HashMap<FileIdentity, [u8; 32]>>,
    /// Digests a source gives unread (a Hub file's LFS id): trusted for listings, never for a
    /// signature's check, and never stored, so no restart takes one for a computed digest.
    from_source: Mutex<HashMap<FileIdentity, [u8; 32]>>,
    store: Option<Mutex<Store>>,
}

/// The store's file, and whether lines were appended since it was last synced.
struct Store {
    file: std::fs::File,
    unsynced: bool,
}

/// What [`FileDigests::open`] made of the store's lines.
#[derive(Debug, Default, PartialEq, Eq)]
struct Loaded {
    known: HashMap<FileIdentity, [u8; 32]>,
    /// Lines that are not `IDENTITY SHA256 CRC` with a matching CRC (torn, damaged, or from a
    /// version of the store without checksums).
    unreadable: usize,
    /// Identities whose lines disagree: none of their digests is trusted.
    contradicted: usize,
    /// Lines that repeat a digest already read.
    repeated: usize,
}

impl Loaded {
    fn from_text(text: &[u8]) -> Loaded {
        let mut loaded = Loaded::default();
        let mut dropped = std::collections::HashSet::new();
        for line in text.split(|&b| b == b'\n').filter(|line| !line.is_empty()) {
            let Some((identity, digest)) = std::str::from_utf8(line).ok().and_then(parse_line) else {
                loaded.unreadable += 1;
                continue;
            };
            if dropped.contains(&identity) {
                continue;
            }
            match loaded.known.insert(identity, digest) {
                Some(earlier) if earlier != digest => {
                    loaded.known.remove(&identity);
                    dropped.insert(identity);
                    loaded.contradicted += 1;
                }
                Some(_) => loaded.repeated += 1,
                None => {}
            }
        }
        loaded
    }

    /// Whether the store holds lines it should not keep.
    fn needs_rewrite(&self) -> bool {
        self.unreadable + self.contradicted + self.repeated > 0
    }
}

impl FileDigests {
    /// The digests of `store` (created when missing), or none kept across restarts.
    pub(crate) fn open(store: Option<&Path>) -> Result<FileDigests, DigestStoreError> {
        let Some(path) = store else {
            let known = Mutex::default();
            return Ok(FileDigests { known, stated: Mutex::default(), from_source: Mutex::default(), store: None });
        };
        let failed = |source| DigestStoreError { path: path.to_owned(), source };
        let _ = std::fs::remove_file(aside_of(path));
        let text = match std::fs::read(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(failed(e)),
        };
        let loaded = Loaded::from_text(&text);
        let (unreadable, contradicted, repeated) = (loaded.unreadable, loaded.contradicted, loaded.repeated);
        if loaded.needs_rewrite() {
            // Only the lines trusted are kept: written aside, synced, renamed over the store.
            tracing::warn!(store = %path.display(), unreadable, contradicted, "the digest store holds lines it cannot trust; they are dropped and their digests computed again");
            rewrite(path, &loaded.known).map_err(failed)?;
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(failed)?;
        tracing::info!(store = %path.display(), digests = loaded.known.len(), unreadable, contradicted, repeated, "file digests loaded");
        Ok(FileDigests {
            known: Mutex::new(loaded.known),
            stated: Mutex::default(),
            from_source: Mutex::default(),
            store: Some(Mutex::new(Store { file, unsynced: false })),
        })
    }

    /// Syncs the lines appended since the last sync to disk (blocking): the server calls it
    /// on a schedule (`digests.sync_interval_secs`), so a crash loses at most that much.
    pub(crate) fn sync(&self) {
        let Some(store) = &self.store else { return };
        let mut store = store.lock().expect("never poisoned");
        if !store.unsynced {
            return;
        }
        match store.file.sync_data() {
            Ok(()) => store.unsynced = false,
            Err(e) => tracing::warn!(error = %e, "cannot sync the digest store"),
        }
    }

    /// The digest of `identity` if it is known: computed, given by its source, or stated.
    pub(crate) fn known(&self, identity: FileIdentity) -> Option<[u8; 32]> {
        let given = || self.from_source.lock().expect("never poisoned").get(&identity).copied();
        self.computed(identity).or_else(given).or_else(|| self.unverified(identity))
    }

    /// The digest of `identity` if this server computed it from the bytes (now, or before a
    /// restart, from the store).
    pub(crate) fn computed(&self, identity: FileIdentity) -> Option<[u8; 32]> {
        self.known.lock().expect("never poisoned").get(&identity).copied()
    }

    /// Takes `digest`, which the file's source gives without its bytes being read, as the
    /// digest of `identity` (kept in memory: the source gives it again after a restart).
    pub(crate) fn insert_from_source(&self, identity: FileIdentity, digest: [u8; 32]) {
        self.from_source.lock().expect("never poisoned").insert(identity, digest);
    }

    /// The digest stated for `identity` and not yet checked.
    pub(crate) fn unverified(&self, identity: FileIdentity) -> Option<[u8; 32]> {
        self.stated.lock().expect("never poisoned").get(&identity).copied()
    }

    /// Takes `digest` as the digest of `identity` for listings, until a whole read checks it.
    pub(crate) fn state(&self, identity: FileIdentity, digest: [u8; 32]) {
        self.stated.lock().expect("never poisoned").insert(identity, digest);
    }

    /// Keeps `digest` as the digest of `identity`, appending it to the store when it is new
    /// (a small blocking write, on the caller's thread: callers hash on the blocking pool or
    /// learn a digest without reading).
    pub(crate) fn insert(&self, identity: FileIdentity, digest: [u8; 32]) {
        if self.remember(identity, digest) {
            self.append(identity, digest);
        }
    }

    /// Keeps `digest` as the digest of `identity` in memory only; whether it is new there (then
    /// [`FileDigests::append`] keeps it across restarts).
    pub(crate) fn remember(&self, identity: FileIdentity, digest: [u8; 32]) -> bool {
        self.stated.lock().expect("never poisoned").remove(&identity);
        self.known.lock().expect("never poisoned").insert(identity, digest) != Some(digest)
    }

    /// Appends `digest` of `identity` to the store (a small blocking write).
    pub(crate) fn append(&self, identity: FileIdentity, digest: [u8; 32]) {
        if let Some(store) = &self.store {
            let mut store = store.lock().expect("never poisoned");
            // One write of the whole line, which a torn append can only cut short.
            match store.file.write_all(line(identity, digest).as_bytes()) {
                Ok(()) => store.unsynced = true,
                // Still known in memory; only a restart computes it again.
                Err(e) => tracing::warn!(error = %e, "cannot append a file digest to the store"),
            }
        }
    }
}

/// One stored line: `IDENTITY SHA256 CRC`, all hex, the CRC-32C that of `IDENTITY SHA256`.
fn line(identity: FileIdentity, digest: [u8; 32]) -> String {
    let body = format!("{} {}", hex::encode(identity), hex::encode(digest));
    format!("{body} {:08x}\n", crc32c::crc32c(body.as_bytes()))
}

/// The identity and digest of a stored line whose CRC matches; `None` for anything else.
fn parse_line(line: &str) -> Option<(FileIdentity, [u8; 32])> {
    let (body, crc) = line.rsplit_once(' ')?;
    if crc.len() != 8 || u32::from_str_radix(crc, 16).ok()? != crc32c::crc32c(body.as_bytes()) {
        return None;
    }
    let (identity, digest) = body.split_once(' ')?;
    let mut parsed = ([0u8; 16], [0u8; 32]);
    hex::decode_to_slice(identity, &mut parsed.0).ok()?;
    hex::decode_to_slice(digest, &mut parsed.1).ok()?;
    Some(parsed)
}

/// Replaces the store at `path` by `known`'s lines: written aside, synced, renamed, and the
/// directory synced, so a crash leaves the old store or the new one.
fn rewrite(path: &Path, known: &HashMap<FileIdentity, [u8; 32]>) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let aside = aside_of(path);
    let text: String = known.iter().map(|(identity, digest)| line(*identity, *digest)).collect();
    let mut file = std::fs::File::create(&aside)?;
    file.write_all(text.as_bytes())?;
    file.sync_data()?;
    std::fs::rename(&aside, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Where [`rewrite`] writes the new store before renaming it (a crash may leave it: the next
/// open removes it).
fn aside_of(path: &Path) -> PathBuf {
    let mut aside = path.as_os_str().to_owned();
    aside.push(".rewrite");
    PathBuf::from(aside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_read_back_from_the_store_after_a_restart_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("digests");
        let identity = file_identity("src", "m", "model.safetensors", "\"etag\"");
        let digests = FileDigests::open(Some(&path)).unwrap();
        assert_eq!(digests.known(identity), None);
        digests.insert(identity, [7; 32]);
        digests.insert(identity, [7; 32]);
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1, "a digest already kept is not appended");
        // A torn last line (a crash mid-append) is skipped, not fatal.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"0123").unwrap();
        let restarted = FileDigests::open(Some(&path)).unwrap();
        assert_eq!(restarted.known(identity), Some([7; 32]));
        // What is appended after the torn line is read back too.
        let other = file_identity("src", "m", "config.json", "\"etag\"");
        restarted.insert(other, [9; 32]);
        let again = FileDigests::open(Some(&path)).unwrap();
        assert_eq!((again.known(identity), again.known(other)), (Some([7; 32]), Some([9; 32])));
    }

    #[test]
    fn a_flipped_digit_a_contradiction_or_a_line_without_its_checksum_is_dropped_and_the_store_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("digests");
        let [a, b, c, d] = ["a", "b", "c", "d"].map(|name| file_identity("src", "m", name, "\"etag\""));
        let digests = FileDigests::open(Some(&path)).unwrap();
        for (identity, digest) in [(a, [1; 32]), (b, [2; 32]), (c, [3; 32])] {
            digests.insert(identity, digest);
        }
        digests.sync();
        drop(digests);
        let mut text = std::fs::read_to_string(&path).unwrap();
        // b's line gets one hex digit of its digest flipped, as rot or a bad write would.
        let b_line = text.lines().find(|l| l.starts_with(&hex::encode(b))).unwrap().to_owned();
        let mut flipped = b_line.clone().into_bytes();
        flipped[40] = if flipped[40] == b'0' { b'1' } else { b'0' };
        text = text.replace(&b_line, std::str::from_utf8(&flipped).unwrap());
        // c's line again, with another digest (and a valid checksum); a's line repeated as is;
        // d's line as a store without checksums wrote it.
        text.push_str(&line(c, [4; 32]));
        text.push_str(&line(a, [1; 32]));
        text.push_str(&format!("{} {}\n", hex::encode(d), hex::encode([5u8; 32])));
        std::fs::write(&path, &text).unwrap();
        let loaded = Loaded::from_text(text.as_bytes());
        assert_eq!((loaded.unreadable, loaded.contradicted, loaded.repeated), (2, 1, 1));

        let reopened = FileDigests::open(Some(&path)).unwrap();
        assert_eq!([a, b, c, d].map(|i| reopened.known(i)), [Some([1; 32]), None, None, None]);
        // Rewritten with only what is trusted; nothing left aside.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), line(a, [1; 32]));
        assert!(!aside_of(&path).exists());
        // What is computed again is appended and read back.
        reopened.insert(b, [2; 32]);
        reopened.sync();
        let again = FileDigests::open(Some(&path)).unwrap();
        assert_eq!((again.known(a), again.known(b)), (Some([1; 32]), Some([2; 32])));
    }

    #[test]
    fn a_replaced_file_has_another_identity_so_its_old_digest_is_never_its_own() {
        let digests = FileDigests::open(None).unwrap();
        let before = file_identity("src", "m", "model.safetensors", "\"v1\"");
        digests.insert(before, [1; 32]);
        assert_eq!(digests.known(file_identity("src", "m", "model.safetensors", "\"v2\"")), None);
    }

    #[test]
    fn an_unusable_store_is_refused_with_its_path() {
        let error = FileDigests::open(Some(Path::new("/nonexistent/dir/digests"))).err().unwrap();
        assert!(error.to_string().starts_with("digest store /nonexistent/dir/digests: "), "{error}");
    }
}
