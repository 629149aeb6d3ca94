//! What a scan schedules: the digests a `SHA256SUMS` states, handed down to the disk cache
//! before the catalog is swapped in, and after it, a job for every published file (and image
//! layer) whose digest is not known, small files first; what no listed model publishes any
//! more leaves the queue.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::{DigestOf, Hashing, Input, Job, Outcome, publish_gauges};
use crate::catalog::{Catalog, Model};
use crate::digests::{FileIdentity, ModelFiles, Urgency};
use crate::format::Manifest;
use crate::service::image_layer::{LayerFraming, layer_identity};
use crate::service::published::PublishedFile;
use crate::storage::ObjectVersion;

/// The digests a model's `SHA256SUMS` states, by path below the model's directory.
pub(crate) type StatedSums = BTreeMap<String, [u8; 32]>;

/// The `SHA256SUMS` read during a scan, by model: read once, both before and after the swap.
pub(crate) type StatedByModel = HashMap<String, StatedSums>;

/// What one scan wants hashed, and what its models publish.
#[derive(Default)]
struct Plan {
    wanted: Vec<(FileIdentity, Job)>,
    models: HashMap<String, ModelFiles>,
    /// The image layers of every published file: kept in the queue, asked for or not.
    layers: HashSet<FileIdentity>,
    /// Files listed whose digest is not known (hashed ahead or not).
    unknown_files: usize,
}

/// What the plan of one model version is made from.
struct ModelAt<'a> {
    catalog: &'a Arc<Catalog>,
    model: &'a Arc<Model>,
    manifest: &'a Arc<Manifest>,
    /// Whether its files are hashed ahead of need (`digests.ahead`).
    ahead: bool,
}

impl ModelAt<'_> {
    fn input(&self, file: &PublishedFile) -> Input {
        Input {
            catalog: Arc::clone(self.catalog),
            model: Arc::clone(self.model),
            manifest: Arc::clone(self.manifest),
            file: file.clone(),
        }
    }
}

impl Hashing {
    /// Tells the disk cache the digest a `SHA256SUMS` states for each file of `catalog`'s
    /// models read through it and not told yet, so that its fills are checked. Runs before the
    /// catalog is swapped in, so no read of a new version (or of any, after a restart) fills
    /// unchecked first. Gives back the lists it read, for [`Hashing::schedule`].
    pub(crate) async fn hand_down_statements(&self, catalog: &Catalog) -> StatedByModel {
        let mut read = StatedByModel::new();
        for model in catalog.models() {
            // Every file of a model is of its source: only a cached source's are read checked,
            // and only a model with a SHA256SUMS has lines to hand down.
            let Ok(manifest) = &model.state else { continue };
            let has_sums = || catalog.companions(&model.id).iter().any(|c| c.name == crate::format::sums::SUMS_FILE);
            let Some(cache) = model.source.cache() else { continue };
            if !has_sums() {
                continue;
            }
            let untold: Vec<(String, ObjectVersion)> = self
                .publication
                .repository_files(catalog, model, manifest)
                .into_iter()
                .filter_map(|file| {
                    Some((file.path.clone(), self.publication.object_behind(catalog, model, manifest, &file)?))
                })
                .filter(|(_, o)| !cache.expects_sha256(&o.key, &o.version))
                .collect();
            if untold.is_empty() {
                continue;
            }
            let sums = self.stated_sums(catalog, model).await;
            for (path, object) in untold {
                if let Some(digest) = sums.get(&path) {
                    cache.expect_sha256(&object.key, &object.version, *digest);
                }
            }
            read.insert(model.id.clone(), sums);
        }
        read
    }

    /// Schedules the hashing of every file the models of `catalog` publish whose digest is
    /// not known, and drops what no listed model publishes any more. A digest the file's source
    /// gives (a Hub file's LFS id) is kept at once, unread; one a `SHA256SUMS` in the model's
    /// directory states (`stated` holds those read for this catalog already) is taken until a
    /// whole read checks it. Called after each scan.
    pub(crate) async fn schedule(self: &Arc<Self>, catalog: &Arc<Catalog>, mut stated: StatedByModel) {
        let mut plan = Plan::default();
        for model in catalog.models() {
            let Ok(manifest) = &model.state else { continue };
            let ahead = match self.ahead {
                crate::config::HashAhead::All => true,
                crate::config::HashAhead::Local => model.source.kind() == "local",
                crate::config::HashAhead::None => false,
            };
            let at = ModelAt { catalog, model, manifest, ahead };
            self.plan_model(&at, &mut plan, stated.remove(&model.id)).await;
        }
        self.enter(plan);
        self.start_hashing();
    }

    /// Adds `at`'s model version to `plan`: its files' own digests, then their image layers,
    /// then the files of its signed directory.
    async fn plan_model(&self, at: &ModelAt<'_>, plan: &mut Plan, stated: Option<StatedSums>) {
        let ModelAt { catalog, model, manifest, ahead } = *at;
        let files = self.publication.repository_files(catalog, model, manifest);
        let mut listed = Vec::with_capacity(files.len());
        let mut unknown = Vec::new();
        let mut layer_candidates = Vec::new();
        for file in files {
            let identity = self.publication.digest_identity(catalog, model, manifest, &file);
            listed.push((identity, file.size));
            let layer = layer_identity(identity, &file.path);
            plan.layers.insert(layer);
            let from_source = self.source_sha256(catalog, model, manifest, &file);
            // A file whose own digest its source states is read for its layer only when
            // its image is asked for.
            if from_source.is_none() && self.digests.known(layer).is_none() {
                layer_candidates.push((layer, identity, file.clone()));
            }
            if self.digests.known(identity).is_some() {
                continue;
            }
            if let Some(digest) = from_source {
                self.digests.insert_from_source(identity, digest);
                continue;
            }
            unknown.push((identity, file));
        }
        let mut with_layer = HashSet::new();
        if !unknown.is_empty() {
            let sums = match stated {
                Some(sums) => sums,
                None => self.stated_sums(catalog, model).await,
            };
            for (identity, file) in unknown {
                let built = self.publication.object_behind(catalog, model, manifest, &file).is_none();
                if let Some(digest) = sums.get(&file.path).filter(|_| !built) {
                    self.digests.state(identity, *digest);
                    continue;
                }
                plan.unknown_files += 1;
                if !ahead {
                    continue;
                }
                let mut job = Job::new(DigestOf::File, identity, at.input(&file), built, Outcome::Running);
                // A built file (a `.zt` model's view) may need decoding to be read: its
                // layer is hashed in the same read rather than decoded again.
                job.with_layer = built && LayerFraming::of(&file.path, file.size).is_ok();
                with_layer.extend(job.with_layer.then_some(identity));
                plan.wanted.push((identity, job));
            }
        }
        // Layers ahead too, after every file's own digest; not of files a SHA256SUMS
        // states, whose reading it spares (their layers are read when asked for).
        for (layer, identity, file) in layer_candidates {
            let framed = LayerFraming::of(&file.path, file.size).is_ok();
            if ahead && framed && self.digests.unverified(identity).is_none() && !with_layer.contains(&identity) {
                let built = self.publication.object_behind(catalog, model, manifest, &file).is_none();
                let job = Job::new(DigestOf::ImageLayer, identity, at.input(&file), built, Outcome::Running);
                plan.wanted.push((layer, job));
            }
        }
        self.plan_signed(at, plan, &mut listed);
        plan.models.insert(model.id.clone(), ModelFiles { version: model.version.clone(), files: listed });
    }

    /// A signed model's verdict needs the digest this server computes of every file of its
    /// signed directory: one a SHA256SUMS states or its source gives will not do. Adds those
    /// not listed yet to `listed`, and their jobs to `plan`.
    fn plan_signed(&self, at: &ModelAt<'_>, plan: &mut Plan, listed: &mut Vec<(FileIdentity, u64)>) {
        let ModelAt { catalog, model, manifest, ahead } = *at;
        if self.signing.policy_of(&model.source.name) == crate::config::SigningPolicy::None {
            return;
        }
        let mut seen: HashSet<FileIdentity> = listed.iter().map(|(id, _)| *id).collect();
        seen.extend(plan.wanted.iter().map(|(id, _)| *id));
        for file in self.publication.signature_files(catalog, model) {
            let identity = self.publication.digest_identity(catalog, model, manifest, &file);
            if !seen.insert(identity) || self.digests.computed(identity).is_some() {
                continue;
            }
            listed.push((identity, file.size));
            plan.unknown_files += 1;
            if ahead {
                let job = Job::new(DigestOf::ComputedFile, identity, at.input(&file), false, Outcome::Running);
                plan.wanted.push((identity, job));
            }
        }
    }

    /// Puts `plan` in the queue: small files first, so every model's config and tokenizer are
    /// known within moments.
    fn enter(&self, plan: Plan) {
        let Plan { mut wanted, models, layers, unknown_files } = plan;
        wanted.sort_by_key(|(_, job)| job.size);
        let known_files = models.values().flat_map(|m| &m.files).count() - unknown_files;
        let mut queue = self.lock();
        // What a listed model publishes stays (asked for, when scans queue nothing).
        let mut keep: HashSet<FileIdentity> =
            models.values().flat_map(|m: &ModelFiles| m.files.iter().map(|(id, _)| *id)).collect();
        keep.extend(layers);
        // Known since the scan looked (a request had it hashed meanwhile): kept as is.
        let wanted: Vec<(FileIdentity, Job, Urgency)> = wanted
            .into_iter()
            .filter(|(key, job)| self.digest_known(*key, job.of).is_none())
            .map(|(key, job)| {
                let urgency = match job.of {
                    DigestOf::File | DigestOf::ComputedFile => Urgency::Scheduled,
                    DigestOf::ImageLayer => Urgency::ScheduledImageLayers,
                };
                (key, job, urgency)
            })
            .collect();
        // A job entered already reads the file as this scan listed it; a failed one is
        // tried again after each scan.
        let refresh = |entered: &Job, listed: Job| {
            *entered.input.lock().expect("never poisoned") = listed.input.into_inner().expect("never poisoned");
        };
        queue.reschedule(&keep, wanted, refresh, models, known_files);
        publish_gauges(&queue);
    }

    /// The digests the `SHA256SUMS` beside `model` states, by path below the model's
    /// directory (none when there is no such file, or it cannot be read: then every file is
    /// hashed, and the reason logged).
    async fn stated_sums(&self, catalog: &Catalog, model: &Arc<Model>) -> StatedSums {
        use crate::format::sums::{MAX_SUMS_BYTES, SUMS_FILE, parse_sums};
        let companions = catalog.companions(&model.id);
        let Some(sums) = companions.iter().find(|c| c.name == SUMS_FILE) else { return Default::default() };
        let failed = |reason: String| {
            tracing::warn!(model = %model.id, file = SUMS_FILE, reason, "cannot take the digests a SHA256SUMS states; hashing the files");
            Default::default()
        };
        if sums.object.size > MAX_SUMS_BYTES {
            return failed(format!("{} bytes, over the {MAX_SUMS_BYTES} bytes read", sums.object.size));
        }
        let read = match self.publication.representations().companion_file(model, sums) {
            Ok(bytes) => {
                use futures_util::TryStreamExt as _;
                let pieces = bytes.source.open(0..bytes.source.len()).map_ok(|piece| piece.to_vec());
                pieces.try_concat().await
            }
            Err(e) => return failed(e.to_string()),
        };
        let text = match read.map(String::from_utf8) {
            Ok(Ok(text)) => text,
            Ok(Err(_)) => return failed("not UTF-8".into()),
            Err(e) => return failed(e.to_string()),
        };
        let (stated, unreadable) = parse_sums(&text);
        if unreadable > 0 {
            tracing::warn!(model = %model.id, file = SUMS_FILE, unreadable, "lines of a SHA256SUMS that are no digest line are ignored");
        }
        stated
    }
}
