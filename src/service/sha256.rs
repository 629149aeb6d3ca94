//! Hashing a published file's bytes: [`FileHasher`] computes the SHA-256 of a file's bytes and
//! (or) of the same bytes inside their image layer's framing ([`super::image_layer`]) in one
//! read, and [`sha256_of`] hashes a stream of them on the blocking pool. Where digests are kept
//! is [`crate::digests`]'s; when files are hashed, [`super::hashing`]'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures_util::StreamExt as _;
use sha2::Digest as _;

use super::ServiceError;
use super::image_layer::LayerFraming;
use super::representation::ByteStream;
use crate::telemetry::names;

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
            match crate::storage::region::copy_of_mapped(&piece, &mut copy) {
                Some(copied) => {
                    copied?;
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
}
