//! The content digest of each file a model version publishes: the SHA-256 of its bytes as
//! served (the Hub API's ETag and LFS oid, the S3 endpoint's checksum), computed once per file
//! version: concurrent askers share one computation, which streams the file's bytes and hashes
//! them on the blocking pool. Digests are kept in memory by the file's identity (its source,
//! model, path and strong ETag, which its version determines) and, when `digests.store` is set,
//! appended to a small file read back at start, so a restart reads no file again.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt as _;
use sha2::Digest as _;

use super::ServiceError;
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

/// Every digest known or being computed, and the store they are appended to.
pub(crate) struct FileDigests {
    cells: Mutex<HashMap<FileIdentity, Arc<tokio::sync::OnceCell<[u8; 32]>>>>,
    store: Option<Arc<Mutex<std::fs::File>>>,
}

impl FileDigests {
    /// The digests of `store` (created when missing), or none kept across restarts.
    pub(crate) fn open(store: Option<&Path>) -> Result<FileDigests, DigestStoreError> {
        let mut cells = HashMap::new();
        let Some(path) = store else {
            return Ok(FileDigests { cells: Mutex::new(cells), store: None });
        };
        let failed = |source| DigestStoreError { path: path.to_owned(), source };
        let mut file = std::fs::OpenOptions::new().create(true).read(true).append(true).open(path).map_err(failed)?;
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut text).map_err(failed)?;
        let mut unreadable = 0usize;
        for line in text.split(|&b| b == b'\n').filter(|line| !line.is_empty()) {
            match std::str::from_utf8(line).ok().and_then(parse_line) {
                Some((identity, digest)) => {
                    cells.insert(identity, Arc::new(tokio::sync::OnceCell::new_with(Some(digest))));
                }
                // A line torn by a crash mid-append, or not ours: its digest is computed again.
                None => unreadable += 1,
            }
        }
        if text.last().is_some_and(|&b| b != b'\n') {
            // Ends the torn line, so the next digest appended starts a line of its own.
            file.write_all(b"\n").map_err(failed)?;
        }
        tracing::info!(store = %path.display(), digests = cells.len(), unreadable, "file digests loaded");
        Ok(FileDigests { cells: Mutex::new(cells), store: Some(Arc::new(Mutex::new(file))) })
    }

    fn cell(&self, identity: FileIdentity) -> Arc<tokio::sync::OnceCell<[u8; 32]>> {
        Arc::clone(self.cells.lock().expect("never poisoned").entry(identity).or_default())
    }

    /// The digest of `identity` if it is already known.
    pub(crate) fn known(&self, identity: FileIdentity) -> Option<[u8; 32]> {
        self.cells.lock().expect("never poisoned").get(&identity).and_then(|cell| cell.get().copied())
    }

    /// The digest of `identity`: known, or computed by `compute` (once, however many ask at
    /// once; a failed computation is tried again by the next asker) and then stored.
    pub(crate) async fn get_or_compute<F>(&self, identity: FileIdentity, compute: F) -> Result<[u8; 32], ServiceError>
    where
        F: std::future::Future<Output = Result<[u8; 32], ServiceError>>,
    {
        let cell = self.cell(identity);
        let digest = cell
            .get_or_try_init(|| async {
                let digest = compute.await?;
                if let Some(store) = &self.store {
                    let store = Arc::clone(store);
                    let line = format!("{} {}\n", hex::encode(identity), hex::encode(digest));
                    let appended = tokio::task::spawn_blocking(move || {
                        store.lock().expect("never poisoned").write_all(line.as_bytes())
                    })
                    .await;
                    if let Ok(Err(e)) | Err(e) = appended.map_err(std::io::Error::other) {
                        // Still known in memory; only a restart computes it again.
                        tracing::warn!(error = %e, "cannot append a file digest to the store");
                    }
                }
                Ok::<_, ServiceError>(digest)
            })
            .await?;
        Ok(*digest)
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

/// The SHA-256 of every byte of `body`, hashed on the blocking pool while the body is read.
pub(crate) async fn sha256_of(mut body: ByteStream) -> Result<[u8; 32], ServiceError> {
    let (pieces, mut received) = tokio::sync::mpsc::channel::<Bytes>(4);
    let hashing = tokio::task::spawn_blocking(move || {
        let mut hasher = sha2::Sha256::new();
        while let Some(piece) = received.blocking_recv() {
            hasher.update(&piece);
            metrics::counter!(names::FILE_DIGEST_BYTES).increment(piece.len() as u64);
        }
        <[u8; 32]>::from(hasher.finalize())
    });
    while let Some(piece) = body.next().await {
        if pieces.send(piece?).await.is_err() {
            break;
        }
    }
    drop(pieces);
    hashing.await.map_err(|e| ServiceError::Internal(format!("hashing a file failed: {e}")))
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
        let digest = sha256_of(body(&[b"hello ", b"", b"world"])).await.unwrap();
        assert_eq!(hex::encode(digest), "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9");
    }

    #[tokio::test]
    async fn digests_are_computed_once_and_read_back_from_the_store_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("digests");
        let identity = file_identity("src", "m", "model.safetensors", "\"etag\"");
        let computed = std::sync::atomic::AtomicUsize::new(0);
        let compute = || async {
            computed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok([7u8; 32])
        };
        let digests = FileDigests::open(Some(&path)).unwrap();
        assert_eq!(digests.known(identity), None);
        let (a, b) =
            tokio::join!(digests.get_or_compute(identity, compute()), digests.get_or_compute(identity, compute()));
        assert_eq!((a.unwrap(), b.unwrap()), ([7; 32], [7; 32]));
        assert_eq!(computed.load(std::sync::atomic::Ordering::SeqCst), 1);
        // A torn last line (a crash mid-append) is skipped, not fatal.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"0123").unwrap();
        let restarted = FileDigests::open(Some(&path)).unwrap();
        assert_eq!(restarted.known(identity), Some([7; 32]));
        assert_eq!(restarted.get_or_compute(identity, compute()).await.unwrap(), [7; 32]);
        assert_eq!(computed.load(std::sync::atomic::Ordering::SeqCst), 1);
        // What is appended after the torn line is read back too.
        let other = file_identity("src", "m", "config.json", "\"etag\"");
        restarted.get_or_compute(other, async { Ok([9u8; 32]) }).await.unwrap();
        let again = FileDigests::open(Some(&path)).unwrap();
        assert_eq!((again.known(identity), again.known(other)), (Some([7; 32]), Some([9; 32])));
    }

    #[tokio::test]
    async fn a_failed_computation_is_tried_again_by_the_next_asker() {
        let digests = FileDigests::open(None).unwrap();
        let identity = file_identity("src", "m", "f", "e");
        let failed = digests.get_or_compute(identity, async { Err(ServiceError::NotReady) }).await;
        assert!(failed.is_err());
        assert_eq!(digests.get_or_compute(identity, async { Ok([1; 32]) }).await.unwrap(), [1; 32]);
    }

    #[test]
    fn an_unusable_store_is_refused_with_its_path() {
        let error = FileDigests::open(Some(Path::new("/nonexistent/dir/digests"))).err().unwrap();
        assert!(error.to_string().starts_with("digest store /nonexistent/dir/digests: "), "{error}");
    }
}
