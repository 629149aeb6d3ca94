//! The content digests known of the files model versions publish: the SHA-256 of each file's
//! bytes as served (the Hub API's ETag and LFS oid, the OCI blob digest, the S3 endpoint's
//! checksum) and of each file's image layer, kept in memory by the file's identity (its
//! source, model, path and strong ETag, which its version determines) and, when
//! `digests.store` is set, appended to a small file read back at start, so a restart reads no
//! file again. A digest a list beside the files states (`SHA256SUMS`) is kept apart until a
//! whole read checks it.

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
    store: Option<Mutex<std::fs::File>>,
}

impl FileDigests {
    /// The digests of `store` (created when missing), or none kept across restarts.
    pub(crate) fn open(store: Option<&Path>) -> Result<FileDigests, DigestStoreError> {
        let mut known = HashMap::new();
        let Some(path) = store else {
            let known = Mutex::new(known);
            return Ok(FileDigests { known, stated: Mutex::default(), from_source: Mutex::default(), store: None });
        };
        let failed = |source| DigestStoreError { path: path.to_owned(), source };
        let mut file = std::fs::OpenOptions::new().create(true).read(true).append(true).open(path).map_err(failed)?;
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut text).map_err(failed)?;
        let mut unreadable = 0usize;
        for line in text.split(|&b| b == b'\n').filter(|line| !line.is_empty()) {
            match std::str::from_utf8(line).ok().and_then(parse_line) {
                Some((identity, digest)) => {
                    known.insert(identity, digest);
                }
                // A line torn by a crash mid-append, or not ours: its digest is computed again.
                None => unreadable += 1,
            }
        }
        if text.last().is_some_and(|&b| b != b'\n') {
            // Ends the torn line, so the next digest appended starts a line of its own.
            file.write_all(b"\n").map_err(failed)?;
        }
        tracing::info!(store = %path.display(), digests = known.len(), unreadable, "file digests loaded");
        Ok(FileDigests {
            known: Mutex::new(known),
            stated: Mutex::default(),
            from_source: Mutex::default(),
            store: Some(Mutex::new(file)),
        })
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
        self.stated.lock().expect("never poisoned").remove(&identity);
        if self.known.lock().expect("never poisoned").insert(identity, digest) == Some(digest) {
            return;
        }
        if let Some(store) = &self.store {
            let line = format!("{} {}\n", hex::encode(identity), hex::encode(digest));
            if let Err(e) = store.lock().expect("never poisoned").write_all(line.as_bytes()) {
                // Still known in memory; only a restart computes it again.
                tracing::warn!(error = %e, "cannot append a file digest to the store");
            }
        }
    }
}

/// One stored line: `IDENTITY SHA256`, both hex.
fn parse_line(line: &str) -> Option<(FileIdentity, [u8; 32])> {
    let (identity, digest) = line.split_once(' ')?;
    let mut parsed = ([0u8; 16], [0u8; 32]);
    hex::decode_to_slice(identity, &mut parsed.0).ok()?;
    hex::decode_to_slice(digest, &mut parsed.1).ok()?;
    Some(parsed)
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
