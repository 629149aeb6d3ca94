//! The content digests known of the files model versions publish: the SHA-256 of each file's
//! bytes as served (the Hub API's ETag and LFS oid, the OCI blob digest, the S3 endpoint's
//! checksum), kept in memory by the file's identity (its source, model, path and strong ETag,
//! which its version determines) and, when `digests.store` is set, appended to a small file
//! read back at start, so a restart reads no file again; and, the same way, the SHA-256 of
//! each file's image layer ([`super::image_layer`]), computed in the same read. How they come
//! to be known is [`super::hashing`]'s; [`sha256_of`] hashes a stream of bytes on the
//! blocking pool.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt as _;
use sha2::Digest as _;

use super::ServiceError;
use super::image_layer::LayerFraming;
use super::representation::ByteStream;
use crate::telemetry::names;

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
    store: Option<Mutex<std::fs::File>>,
}

impl FileDigests {
    /// The digests of `store` (created when missing), or none kept across restarts.
    pub(crate) fn open(store: Option<&Path>) -> Result<FileDigests, DigestStoreError> {
        let mut known = HashMap::new();
        let Some(path) = store else {
            return Ok(FileDigests { known: Mutex::new(known), stated: Mutex::default(), store: None });
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
        Ok(FileDigests { known: Mutex::new(known), stated: Mutex::default(), store: Some(Mutex::new(file)) })
    }

    /// The digest of `identity` if it is known, computed or stated.
    pub(crate) fn known(&self, identity: FileIdentity) -> Option<[u8; 32]> {
        let computed = self.known.lock().expect("never poisoned").get(&identity).copied();
        computed.or_else(|| self.unverified(identity))
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

/// What one read of a file gives: its SHA-256, its image layer's, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileSha256s {
    pub(crate) file: Option<[u8; 32]>,
    pub(crate) layer: Option<[u8; 32]>,
}

/// Hashes a file's bytes as they are read, and (or) the same bytes inside their image layer's
/// framing, so one read gives both digests.
pub(crate) struct FileHasher {
    file: Option<sha2::Sha256>,
    layer: Option<(sha2::Sha256, &'static [u8])>,
}

impl FileHasher {
    /// A hasher of the file's own digest when `own`, and of its layer's when `framing`.
    pub(crate) fn new(own: bool, framing: Option<&LayerFraming>) -> FileHasher {
        let layer = framing.map(|framing| {
            let mut layer = sha2::Sha256::new();
            layer.update(&framing.head);
            (layer, framing.tail())
        });
        FileHasher { file: own.then(sha2::Sha256::new), layer }
    }

    /// What its reads are counted as (`ztserve_file_digest_bytes_total{digest}`): a read for
    /// the file's own digest (its layer's too, perhaps), or for an image layer alone.
    pub(crate) fn purpose(&self) -> &'static str {
        if self.file.is_some() { "file" } else { "image_layer" }
    }

    pub(crate) fn update(&mut self, piece: &[u8]) {
        if let Some(file) = &mut self.file {
            file.update(piece);
        }
        if let Some((layer, _)) = &mut self.layer {
            layer.update(piece);
        }
    }

    pub(crate) fn finish(self) -> FileSha256s {
        let layer = self.layer.map(|(mut layer, tail)| {
            layer.update(tail);
            layer.finalize().into()
        });
        FileSha256s { file: self.file.map(|file| file.finalize().into()), layer }
    }
}

/// The digests `hasher` takes of every byte of `body` (of `model`), hashed on the blocking
/// pool while the body is read; `hashed` counts the bytes
/// hashed so far. A piece that is a slice of a file's mapping (a stored tensor of a built view
/// file, meant to be sent with `sendfile`) is read with `pread`, never loaded from the
/// mapping: a file truncated in place fails the hashing as changed on disk instead of raising
/// SIGBUS.
pub(crate) async fn sha256_of(
    mut body: ByteStream,
    mut hasher: FileHasher,
    hashed: Arc<AtomicU64>,
    model: &str,
) -> Result<FileSha256s, ServiceError> {
    let (pieces, mut received) = tokio::sync::mpsc::channel::<Bytes>(4);
    let counter = metrics::counter!(names::FILE_DIGEST_BYTES, "digest" => hasher.purpose());
    let hashing = tokio::task::spawn_blocking(move || {
        let mut copy = Vec::new();
        while let Some(piece) = received.blocking_recv() {
            match crate::storage::mapped::file_behind(&piece) {
                Some((file, offset)) => {
                    copy.resize(piece.len(), 0);
                    crate::storage::local::pread_exact_into(&file, offset, &mut copy, "", "")?;
                    hasher.update(&copy);
                }
                None => hasher.update(&piece),
            }
            hashed.fetch_add(piece.len() as u64, Ordering::Relaxed);
            counter.increment(piece.len() as u64);
            metrics::gauge!(names::DIGEST_PENDING_BYTES).decrement(piece.len() as f64);
        }
        Ok::<_, crate::storage::StorageError>(hasher.finish())
    });
    while let Some(piece) = body.next().await {
        if pieces.send(piece?).await.is_err() {
            break;
        }
    }
    drop(pieces);
    match hashing.await {
        Ok(Ok(digests)) => Ok(digests),
        Ok(Err(_)) => Err(ServiceError::ChangedOnDisk { model: model.to_owned() }),
        Err(e) => Err(ServiceError::Internal(format!("hashing a file failed: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(pieces: &[&'static [u8]]) -> ByteStream {
        let pieces: Vec<_> = pieces.iter().map(|p| Ok(Bytes::from_static(p))).collect();
        futures_util::stream::iter(pieces).boxed()
    }

    #[tokio::test]
    async fn a_digest_is_the_sha256_of_every_piece_in_order() {
        let hashed = Arc::new(AtomicU64::new(0));
        let hasher = FileHasher::new(true, None);
        let digest = sha256_of(body(&[b"hello ", b"", b"world"]), hasher, Arc::clone(&hashed), "m").await.unwrap();
        assert_eq!(hashed.load(Ordering::Relaxed), 11);
        let expected = "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9";
        assert_eq!(digest.file.map(hex::encode).as_deref(), Some(expected));
        assert_eq!(digest.layer, None);
    }

    #[tokio::test]
    async fn one_read_gives_the_layer_digest_of_the_layer_served() {
        use super::super::image_layer::TarLayer;
        use super::super::representation::RangeSource as _;
        let framing = LayerFraming::of("dir/model.safetensors", 11).unwrap();
        let hashed = Arc::new(AtomicU64::new(0));
        let hasher = FileHasher::new(true, Some(&framing));
        let digest = sha256_of(body(&[b"hello ", b"world"]), hasher, hashed, "m").await.unwrap();
        let layer = TarLayer { framing, file: Arc::new(Bytes::from_static(b"hello world")) };
        let served: Vec<Bytes> = layer.open(0..layer.len()).map(|p| p.unwrap()).collect().await;
        assert_eq!(digest.layer, Some(<[u8; 32]>::from(sha2::Sha256::digest(served.concat()))));
        assert_eq!(digest.file, Some(<[u8; 32]>::from(sha2::Sha256::digest(b"hello world"))));
    }

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
