//! The one door the protocols reach the service by: a [`Listing`] (one catalog snapshot, for
//! what spans every model: lists, repositories, buckets, readiness), an [`OpenModel`] (one
//! model version opened from it, which opening admitted: known, not broken, its signature
//! letting it be served) that a request then asks for its bytes, files, digests and cache
//! state, and a [`ListedFile`], a published file with the model version it is of. Each
//! answers from the snapshot it was opened at, so one request never mixes two versions.

use std::sync::Arc;

use super::components::{ComponentBytes, ComponentRequest};
use super::deltas::DeltasBody;
use super::files::FoundFile;
use super::hashing::DigestOf;
use super::learnt::Rendered;
use super::prefetch::{Held, Prefetch};
use super::published::PublishedFile;
use super::regions::{RegionLimits, RegionRequest, RegionsBody};
use super::signatures::SignatureStatus;
use super::{Service, ServiceError, StoredBytes};
use crate::catalog::{Catalog, Model};
use crate::digests::DigestProgress;
use crate::format::{Component, Manifest, Object};

/// The models of one catalog snapshot, as every listing asks them.
#[derive(Clone)]
pub(crate) struct Listing {
    service: Arc<Service>,
    catalog: Arc<Catalog>,
}

/// A published file and the model version it is of: what its digest is asked by, in place
/// of the catalog, model, manifest and file named one by one.
#[derive(Clone)]
pub(crate) struct ListedFile {
    pub model: Arc<Model>,
    pub manifest: Arc<Manifest>,
    pub file: PublishedFile,
}

/// One model version a request is served from, admitted when it was opened (ready, known,
/// not broken, allowed by its signature), pinned to the catalog snapshot it was found in.
#[derive(Clone)]
pub(crate) struct OpenModel {
    listing: Listing,
    model: Arc<Model>,
    manifest: Arc<Manifest>,
    signature: SignatureStatus,
}

impl Service {
    /// Every model as the current catalog lists it.
    pub(crate) fn listing(self: &Arc<Self>) -> Listing {
        Listing { service: Arc::clone(self), catalog: self.catalogs.current() }
    }
}

impl Listing {
    /// The models listed, sorted by id.
    pub(crate) fn models(&self) -> impl Iterator<Item = &Arc<Model>> {
        self.catalog.models()
    }

    /// The model `id`, if it is listed (broken or not).
    pub(crate) fn get(&self, id: &str) -> Option<&Arc<Model>> {
        self.catalog.get(id)
    }

    /// Whether this is the listing of the same snapshot as `other`.
    pub(crate) fn is_same_snapshot(&self, other: &Listing) -> bool {
        Arc::ptr_eq(&self.catalog, &other.catalog)
    }

    /// The id of the repository `model` is published in ([`Catalog::repository_of`]).
    pub(crate) fn repository_of(&self, model: &Model) -> String {
        self.catalog.repository_of(model)
    }

    /// The ids of the models repository `id` holds that `allows` lets through
    /// ([`Catalog::members_of`]).
    pub(crate) fn members_of(&self, id: &str, allows: impl Fn(&str) -> bool) -> Vec<String> {
        self.catalog.members_of(id, allows)
    }

    /// Whether repository `id` shows `member` as its published files rather than as stored
    /// ([`Catalog::shows_published_files`]).
    pub(crate) fn shows_published_files(&self, id: &str, member: &Model) -> bool {
        self.catalog.shows_published_files(id, member)
    }

    /// The signature of `model` as far as it is known, without waiting.
    pub(crate) fn signature(&self, model: &Model) -> SignatureStatus {
        self.service.signatures.status(&self.catalog, model)
    }

    /// Why `model` is not served under its source's policy, when its verdict says so already.
    pub(crate) fn refusal(&self, model: &Model) -> Option<ServiceError> {
        self.service.signatures.refusal(&self.catalog, model)
    }

    /// How far the hashing of `model`'s published files is.
    pub(crate) fn digest_progress(&self, model: &Model) -> DigestProgress {
        self.service.hashing.digest_progress(model)
    }

    /// How far the hashing of every listed model's files is, all together.
    pub(crate) fn digest_totals(&self) -> DigestProgress {
        self.service.hashing.digest_totals(&self.catalog)
    }

    /// Sets the signature gauge from the listed models (at each metrics scrape).
    pub(crate) fn publish_signature_gauge(&self) {
        self.service.signatures.publish_gauge(&self.catalog);
    }

    /// How much of `model` the disk cache holds.
    pub(crate) fn held(&self, model: &Model) -> Held {
        Held::of(&self.catalog, model)
    }

    /// The files a repository of `model` holds ([`OpenModel::repository_files`]), as listed
    /// files.
    pub(crate) fn repository_files(&self, model: &Arc<Model>, manifest: &Arc<Manifest>) -> Vec<ListedFile> {
        let files = self.service.publication.repository_files(&self.catalog, model, manifest);
        listed(model, manifest, files)
    }

    /// `model`'s files as its source holds them ([`OpenModel::files_as_stored`]), as listed
    /// files.
    pub(crate) fn files_as_stored(&self, model: &Arc<Model>, manifest: &Arc<Manifest>) -> Vec<ListedFile> {
        let files = self.service.publication.files_as_stored(&self.catalog, model, manifest);
        listed(model, manifest, files)
    }

    /// The SHA-256 of `listed`, if it is already known: never waited for.
    pub(crate) fn known_sha256(&self, listed: &ListedFile) -> Option<[u8; 32]> {
        self.service.hashing.known_sha256(&self.catalog, &listed.model, &listed.manifest, &listed.file)
    }

    /// The model `id` opened at this snapshot: refused when the catalog is not ready, the
    /// model is unknown or broken, or its signature does not let it be served (waiting for its
    /// digests as a request for one file does). Whoever asks has already checked that the
    /// caller may read it.
    pub(crate) async fn open(&self, id: &str) -> Result<OpenModel, ServiceError> {
        let service = &self.service;
        let (model, manifest) = service.catalogs.model_in(&self.catalog, id)?;
        let wait = service.hashing.wait(false);
        let signature = service.signatures.admit(&self.catalog, &model, &manifest, wait).await?;
        Ok(OpenModel { listing: self.clone(), model, manifest, signature })
    }
}

fn listed(model: &Arc<Model>, manifest: &Arc<Manifest>, files: Vec<PublishedFile>) -> Vec<ListedFile> {
    files
        .into_iter()
        .map(|file| ListedFile { model: Arc::clone(model), manifest: Arc::clone(manifest), file })
        .collect()
}

impl OpenModel {
    pub(crate) fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub(crate) fn manifest(&self) -> &Arc<Manifest> {
        &self.manifest
    }

    /// Its signature, as its source's policy checked it when it was opened.
    pub(crate) fn signature(&self) -> &SignatureStatus {
        &self.signature
    }

    fn service(&self) -> &Service {
        &self.listing.service
    }

    /// Its object `name`.
    pub(crate) fn object(&self, name: &str) -> Result<&Object, ServiceError> {
        super::object(&self.model, &self.manifest, name)
    }

    /// The component `role` of its `object`.
    pub(crate) fn component<'o>(&self, object: &'o Object, role: &str) -> Result<&'o Component, ServiceError> {
        super::component(&self.model, object, role)
    }

    /// The bytes of `component` of `object`, cut and coded as `request` asks.
    pub(crate) async fn component_bytes(
        &self,
        object: &Object,
        component: &Component,
        request: ComponentRequest<'_>,
    ) -> Result<ComponentBytes, ServiceError> {
        let representations = &self.service().representations;
        representations.component_bytes(&self.model, &self.manifest, object, component, request).await
    }

    /// Its one stored file (refused for a model stored in several).
    pub(crate) async fn stored_file(&self) -> Result<StoredBytes, ServiceError> {
        self.service().representations.stored_file(&self.model, &self.manifest).await
    }

    /// Its file `name`: one of its stored files, or else a file beside it by its path below the
    /// model's directory (`config.json`, `tokenizer/vocab.txt`).
    pub(crate) async fn file_named(&self, name: &str) -> Result<(StoredBytes, FoundFile), ServiceError> {
        let companions = self.listing.catalog.companions(&self.model.id);
        self.service().representations.file_named(&self.model, &self.manifest, companions, name).await
    }

    /// The file `name` of its safetensors view.
    pub(crate) async fn view_file(&self, name: &str) -> Result<StoredBytes, ServiceError> {
        self.service().publication.view_file(&self.model, &self.manifest, name).await
    }

    /// Regions of it in one body ([`Service::regions`]).
    pub(crate) async fn regions(
        &self,
        requests: Vec<RegionRequest>,
        limits: RegionLimits,
    ) -> Result<RegionsBody, ServiceError> {
        self.service().regions(&self.model, &self.manifest, requests, limits).await
    }

    /// The deltas from `base` (another model, or another version, the request may read) to it
    /// of the regions `requests` asks of it ([`Service::deltas`]).
    pub(crate) async fn deltas(
        &self,
        base: &OpenModel,
        requests: Vec<RegionRequest>,
        limits: RegionLimits,
    ) -> Result<DeltasBody, ServiceError> {
        let base_pair = (Arc::clone(&base.model), Arc::clone(&base.manifest));
        let target = (Arc::clone(&self.model), Arc::clone(&self.manifest));
        self.service().deltas(base_pair, target, requests, limits).await
    }

    /// Its manifest as rendered, if it has been already (no trip to the blocking pool).
    pub(crate) fn rendered_manifest_if_ready(&self) -> Option<Rendered> {
        self.service().rendered_manifest_if_ready(&self.model)
    }

    /// Its manifest as rendered, rendering it now when it is not yet (blocking: seconds for
    /// a model of 100k tensors).
    pub(crate) fn rendered_manifest(&self) -> Rendered {
        self.service().rendered_manifest(&self.model, &self.manifest)
    }

    /// The files a repository of it holds (the Hub API, the OCI registry): its companions and
    /// its weights as safetensors, sorted by path.
    pub(crate) fn repository_files(&self) -> Vec<PublishedFile> {
        self.service().publication.repository_files(&self.listing.catalog, &self.model, &self.manifest)
    }

    /// Its files as its source holds them: the files beside it and each stored file as it is.
    pub(crate) fn files_as_stored(&self) -> Vec<PublishedFile> {
        self.service().publication.files_as_stored(&self.listing.catalog, &self.model, &self.manifest)
    }

    /// The bytes `file` serves, as they are built or stored.
    pub(crate) async fn published_bytes(&self, file: &PublishedFile) -> Result<StoredBytes, ServiceError> {
        let publication = &self.service().publication;
        publication.published_bytes(&self.listing.catalog, &self.model, &self.manifest, &file.what).await
    }

    /// The bytes `file` serves to the protocols that publish files: a whole read of a file
    /// whose digest its source stated is checked against it before its last piece.
    pub(crate) async fn file_bytes(&self, file: &PublishedFile) -> Result<StoredBytes, ServiceError> {
        let hashing = &self.service().hashing;
        hashing.published_file_bytes(&self.listing.catalog, &self.model, &self.manifest, file).await
    }

    /// The SHA-256 of `file`, waiting as long as a request for one file waits.
    pub(crate) async fn sha256(&self, file: &PublishedFile) -> Result<[u8; 32], ServiceError> {
        let hashing = &self.service().hashing;
        let wait = hashing.wait(false);
        hashing.published_sha256(&self.listing.catalog, &self.model, &self.manifest, file, wait).await
    }

    /// The digests `of` each of `files`, waiting as long as a listing waits.
    pub(crate) async fn sha256s(&self, files: &[&PublishedFile], of: DigestOf) -> Result<Vec<[u8; 32]>, ServiceError> {
        let hashing = &self.service().hashing;
        let wait = hashing.wait(true);
        hashing.published_sha256s(&self.listing.catalog, &self.model, &self.manifest, files, of, wait).await
    }

    /// How much of it the disk cache holds.
    pub(crate) fn held(&self) -> Held {
        self.listing.held(&self.model)
    }

    /// Its prefetch into the disk cache: the one under way or done, or a new one.
    pub(crate) fn prefetch(&self) -> Arc<Prefetch> {
        self.service().prefetches.start(&self.listing.catalog, &self.model)
    }
}
