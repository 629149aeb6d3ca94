//! Digests a `SHA256SUMS` states, checked: a whole read of such a file hashes it alongside
//! (once, however many read) and holds the body's last piece back until the digest matches;
//! a match makes the digest a computed one, a mismatch is logged, counted and replaced.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use super::{Hashing, Input};
use crate::catalog::{Catalog, Model};
use crate::digests::FileIdentity;
use crate::format::Manifest;
use crate::service::ServiceError;
use crate::service::bytes::StoredBytes;
use crate::service::published::PublishedFile;
use crate::service::representation::{ByteStream, Guard, RangeSource, guard, guarded};
use crate::telemetry::names;

impl Hashing {
    /// The bytes `file` of `model` serves to the protocols that publish files. A whole read of
    /// a file whose digest a `SHA256SUMS` stated checks it: the body's last piece is held back
    /// until the file's real digest (hashed alongside, once however many read) matches.
    pub(crate) async fn published_file_bytes(
        self: &Arc<Self>,
        catalog: &Arc<Catalog>,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        file: &PublishedFile,
    ) -> Result<StoredBytes, ServiceError> {
        let bytes = self.publication.published_bytes(catalog, model, manifest, &file.what).await?;
        let identity = self.publication.digest_identity(catalog, model, manifest, file);
        let Some(stated) = self.digests.unverified(identity) else { return Ok(bytes) };
        let input = Input {
            catalog: Arc::clone(catalog),
            model: Arc::clone(model),
            manifest: Arc::clone(manifest),
            file: file.clone(),
        };
        let checked = StatedCheck { inner: bytes.source, hashing: Arc::clone(self), identity, stated, input };
        Ok(StoredBytes { source: Arc::new(checked), etag: bytes.etag })
    }

    /// The check of `identity`'s stated digest against its bytes, started now or joined. A
    /// match makes the digest a computed one (kept in the store); a mismatch is logged and
    /// counted, and the digest computed takes the stated one's place.
    fn check_stated(self: &Arc<Self>, identity: FileIdentity, stated: [u8; 32], input: &Input) -> Guard {
        let mut checks = self.checks.lock().expect("never poisoned");
        if let Some(running) = checks.get(&identity) {
            return running.clone();
        }
        let (done, outcome) = tokio::sync::oneshot::channel();
        let hashing = Arc::clone(self);
        let input = input.clone();
        // A task of its own: the check runs while the body streams, not when its end is polled.
        tokio::spawn(async move {
            let (model, path) = (&input.model.id, &input.file.path);
            let computed = hashing.compute_sha256(&input, Arc::new(AtomicU64::new(0)), true, None).await;
            let computed = computed.and_then(|digests| {
                digests.file.ok_or_else(|| ServiceError::Internal("a file's digest was not computed".into()))
            });
            if let Ok(actual) = computed {
                // Computed, it is the file's digest from now on (a blocking append to the store).
                let keeping = Arc::clone(&hashing);
                let _ = tokio::task::spawn_blocking(move || keeping.digests.insert(identity, actual)).await;
            }
            let result = match computed {
                Ok(actual) if actual == stated => {
                    metrics::counter!(names::DIGEST_CHECKS, "outcome" => "ok").increment(1);
                    Ok(())
                }
                Ok(actual) => {
                    metrics::counter!(names::DIGEST_CHECKS, "outcome" => "mismatch").increment(1);
                    metrics::counter!(names::DIGEST_FAILURES).increment(1);
                    let reason = format!(
                        "file {path:?} of model {model:?} has SHA-256 {}, not the {} its SHA256SUMS states",
                        hex::encode(actual),
                        hex::encode(stated)
                    );
                    tracing::error!(model = %model, file = %path, reason, "a stated digest does not match the file; its computed digest is served from now on");
                    Err(reason)
                }
                Err(e) => Err(format!("cannot check the stated SHA-256 of {path:?} of model {model:?}: {e}")),
            };
            hashing.checks.lock().expect("never poisoned").remove(&identity);
            let _ = done.send(result);
        });
        let running =
            guard(async move { outcome.await.unwrap_or_else(|_| Err("the digest check ended early".into())) });
        checks.insert(identity, running.clone());
        running
    }
}

/// A published file whose digest was stated and not yet checked: a whole read checks it.
struct StatedCheck {
    inner: Arc<dyn RangeSource>,
    hashing: Arc<Hashing>,
    identity: FileIdentity,
    stated: [u8; 32],
    input: Input,
}

impl RangeSource for StatedCheck {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn open(&self, range: std::ops::Range<u64>) -> ByteStream {
        let whole = range == (0..self.inner.len());
        let body = self.inner.open(range);
        if !whole {
            return body;
        }
        guarded(body, self.hashing.check_stated(self.identity, self.stated, &self.input))
    }

    fn gap_worth_reading(&self) -> futures_util::future::BoxFuture<'_, Result<u64, ServiceError>> {
        self.inner.gap_worth_reading()
    }
}
