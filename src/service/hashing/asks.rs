//! What requests ask of the digests: one file's, or a listing's, known, stated by the source,
//! or computed in the background with the asked file moved to the front of the queue; a
//! bounded wait, then a refusal that says how far the model's hashing is and when to ask
//! again.

use std::sync::Arc;
use std::time::Duration;

use super::{DigestOf, Hashing, Input, Job, Outcome};
use crate::catalog::{Catalog, Model};
use crate::digests::{DigestProgress, FileIdentity, Urgency};
use crate::format::Manifest;
use crate::service::ServiceError;
use crate::service::image_layer::{LayerFraming, layer_identity};
use crate::service::published::PublishedFile;

impl Hashing {
    /// The SHA-256 of `file` of `model`, if it is already known.
    pub(crate) fn known_sha256(
        &self,
        catalog: &Catalog,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        file: &PublishedFile,
    ) -> Option<[u8; 32]> {
        self.digests.known(self.publication.digest_identity(catalog, model, manifest, file))
    }

    /// How long a request waits for digests being computed: `digests.file_wait_ms` for one
    /// file, `digests.listing_wait_secs` for a listing; always a second under
    /// `limits.request_timeout_secs`, so that the client gets the refusal and its Retry-After,
    /// not the timeout's.
    pub(crate) fn wait(&self, listing: bool) -> Duration {
        let wait = if listing { self.waits.listing } else { self.waits.file };
        match self.waits.request_timeout {
            Some(limit) => wait.min(limit.saturating_sub(Duration::from_secs(1))),
            None => wait,
        }
    }

    /// The digest of `file` of `model`: known, stated by its source, or computed in the
    /// background, this file first. Waits at most `wait` for a computation, then refuses with
    /// how far the model's hashing is and when to ask again.
    pub(crate) async fn published_sha256(
        self: &Arc<Self>,
        catalog: &Arc<Catalog>,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        file: &PublishedFile,
        wait: Duration,
    ) -> Result<[u8; 32], ServiceError> {
        Ok(self.published_sha256s(catalog, model, manifest, &[file], DigestOf::File, wait).await?.remove(0))
    }

    /// The digests of `files` of `model` (or of their image layers), as
    /// [`Hashing::published_sha256`] gives one, waiting at most `wait` for them all. A layer's
    /// digest is computed in the same read as its file's: a file whose own digest its source
    /// states is read once when its layer is first asked for.
    pub(crate) async fn published_sha256s(
        self: &Arc<Self>,
        catalog: &Arc<Catalog>,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        files: &[&PublishedFile],
        of: DigestOf,
        wait: Duration,
    ) -> Result<Vec<[u8; 32]>, ServiceError> {
        let identities: Vec<FileIdentity> =
            files.iter().map(|f| self.publication.digest_identity(catalog, model, manifest, f)).collect();
        let wanted: Vec<FileIdentity> = match of {
            DigestOf::File | DigestOf::ComputedFile => identities.clone(),
            DigestOf::ImageLayer => {
                for file in files {
                    LayerFraming::of(&file.path, file.size)
                        .map_err(|reason| ServiceError::NoImageLayer { model: model.id.clone(), reason })?;
                }
                identities.iter().zip(files).map(|(id, f)| layer_identity(*id, &f.path)).collect()
            }
        };
        let computed_only = of.computed_only();
        let lookup = |id: FileIdentity| self.digest_known(id, of);
        let mut digests: Vec<Option<[u8; 32]>> = wanted.iter().map(|id| lookup(*id)).collect();
        let mut waiting = Vec::new();
        for (((identity, key), file), digest) in identities.iter().zip(&wanted).zip(files).zip(&mut digests) {
            if digest.is_some() {
                continue;
            }
            if let (DigestOf::File, false, Some(stated)) =
                (of, computed_only, self.source_sha256(catalog, model, manifest, file))
            {
                self.digests.insert_from_source(*identity, stated);
                *digest = Some(stated);
                continue;
            }
            let urgency = if files.len() == 1 { Urgency::FileAsked } else { Urgency::ListingAsked };
            waiting.push(self.ask((*key, of, *identity), catalog, model, manifest, file, urgency));
        }
        if waiting.is_empty() {
            return Ok(digests.into_iter().map(|d| d.expect("every digest known")).collect());
        }
        self.start_hashing();
        let deadline = tokio::time::Instant::now() + wait;
        let mut pending = Vec::new();
        for (key, job) in waiting {
            let mut outcome = job.outcome.subscribe();
            let settled = tokio::time::timeout_at(deadline, outcome.wait_for(|o| !matches!(o, Outcome::Running))).await;
            match settled.map(|o| o.map(|o| o.clone())) {
                Ok(Ok(Outcome::Known)) => {
                    let at = wanted.iter().position(|id| *id == key).expect("asked for");
                    // Kept before its job said so; a job that found the digest stated meanwhile
                    // did not compute it, and the next ask for a computed one will.
                    match lookup(key) {
                        Some(known) => digests[at] = Some(known),
                        None if computed_only => pending.push((key, job)),
                        None => return Err(ServiceError::Internal("a digest said known is not".into())),
                    }
                }
                Ok(Ok(Outcome::Failed(e))) => return Err(e),
                // Timed out (or the job was replaced by a newer scan): still running.
                _ => pending.push((key, job)),
            }
        }
        if pending.is_empty() {
            return Ok(digests.into_iter().map(|d| d.expect("every digest known")).collect());
        }
        Err(self.digest_pending(model, &pending))
    }

    /// The job computing the digest kept under `key` (`of` the file whose identity is `file`),
    /// moved up the queue to `urgency` (or made, for a digest no scan scheduled yet).
    fn ask(
        &self,
        (key, of, identity): (FileIdentity, DigestOf, FileIdentity),
        catalog: &Arc<Catalog>,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        file: &PublishedFile,
        urgency: Urgency,
    ) -> (FileIdentity, Arc<Job>) {
        let input = || Input {
            catalog: Arc::clone(catalog),
            model: Arc::clone(model),
            manifest: Arc::clone(manifest),
            file: file.clone(),
        };
        let built = self.publication.object_behind(catalog, model, manifest, file).is_none();
        let mut queue = self.lock();
        // Checked again under the queue's lock. A finished computation keeps its digest before
        // its job leaves the queue, so an ask that races its end finds one or the other, and
        // a file is never hashed twice.
        if self.digest_known(key, of).is_some() {
            return (key, Arc::new(Job::new(of, identity, input(), false, Outcome::Known)));
        }
        (key, queue.ask(key, urgency, || Job::new(of, identity, input(), built, Outcome::Running)))
    }

    /// The refusal of a request whose digests of `model` are still being computed: how far
    /// the model's hashing is, and when the last of those `pending` should be known (what is
    /// being hashed and what is queued ahead of it, shared among the workers).
    fn digest_pending(&self, model: &Model, pending: &[(FileIdentity, Arc<Job>)]) -> ServiceError {
        let progress = self.digest_progress(model);
        let (remaining, running) = {
            let queue = self.lock();
            (queue.remaining_through(pending), queue.running)
        };
        let workers = self.workers.min(pending.len().max(running));
        ServiceError::DigestPending {
            model: model.id.clone(),
            hashed: progress.hashed_bytes,
            total: progress.bytes,
            retry_after_secs: self.rate.seconds_for(remaining, workers),
        }
    }

    /// How far the hashing of `model`'s published files is (as of the last scan's listing of
    /// this version; nothing known of another).
    pub(crate) fn digest_progress(&self, model: &Model) -> DigestProgress {
        self.lock().progress(&model.id, &model.version, |key| self.digests.known(key).is_some())
    }

    /// How far the hashing of every listed model's files is, all together.
    pub(crate) fn digest_totals(&self, catalog: &Catalog) -> DigestProgress {
        let listed = DigestProgress { listed: true, ..DigestProgress::default() };
        catalog.models().filter(|m| m.state.is_ok()).map(|m| self.digest_progress(m)).fold(listed, DigestProgress::and)
    }
}
