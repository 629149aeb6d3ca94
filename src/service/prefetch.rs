//! Filling the node's disk cache ahead of need: a prefetch reads every file of one model
//! version (its stored files and companions) through its source, so the disk cache holds all
//! of it; one runs per model version however many ask, its progress is what the cache holds,
//! and its outcome is kept for whoever waits. Models listed in `[cache] prefetch` are fetched
//! after each rescan that finds a new version of them, and the blocks of models listed in
//! `[cache] pinned`, and of the versions each lineage keeps (`[refits]`), are never evicted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt as _;

use crate::catalog::{Catalog, Model, Source};
use crate::storage::ObjectVersion;

/// One model version's prefetch: its outcome once it has one.
#[derive(Debug)]
pub(crate) struct Prefetch {
    outcome: tokio::sync::watch::Receiver<Option<Result<(), String>>>,
}

impl Prefetch {
    /// The outcome, `None` while it runs.
    pub(crate) fn outcome(&self) -> Option<Result<(), String>> {
        self.outcome.borrow().clone()
    }

    /// Waits for the outcome.
    pub(crate) async fn finished(&self) -> Result<(), String> {
        let mut outcome = self.outcome.clone();
        match outcome.wait_for(Option::is_some).await {
            Ok(done) => done.clone().expect("waited for"),
            Err(_) => Err("the prefetch stopped".into()),
        }
    }
}

/// Prefetches by model id and version, and the models `[cache]` names.
#[derive(Debug, Default)]
pub(crate) struct Prefetches {
    running: Mutex<HashMap<(String, String), Arc<Prefetch>>>,
    /// Models fetched whole after each rescan that finds a new version (`[cache] prefetch`).
    prefetched: Vec<String>,
    /// Models whose blocks are never evicted (`[cache] pinned`).
    pinned: Vec<String>,
}

/// How much of a model the disk cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub bytes: u64,
    pub total: u64,
}

/// Every object a model reads: its stored files and the files beside it.
fn objects_of(catalog: &Catalog, model: &Model) -> Vec<ObjectVersion> {
    model
        .files
        .iter()
        .map(|f| f.object.clone())
        .chain(catalog.companions(&model.id).iter().map(|c| c.object.clone()))
        .collect()
}

impl Held {
    /// How much of `model` (its stored files and companions, as `catalog` lists them) the disk
    /// cache holds; all of it for a model of a source without one (its bytes are local, or
    /// read from the source).
    pub(crate) fn of(catalog: &Catalog, model: &Model) -> Held {
        let objects = objects_of(catalog, model);
        let total = objects.iter().map(|o| o.size).sum();
        let Some(cache) = model.source.cache() else { return Held { bytes: total, total } };
        let bytes = objects.iter().map(|o| cache.cached_bytes(&o.key, &o.version, o.size)).sum();
        Held { bytes, total }
    }
}

impl Prefetches {
    pub(super) fn new(config: crate::config::Cache) -> Prefetches {
        Prefetches { running: Mutex::default(), prefetched: config.prefetch, pinned: config.pinned }
    }

    /// The prefetch of `model`'s version (as `catalog` lists it): the one under way or done,
    /// or a new one.
    pub(crate) fn start(&self, catalog: &Catalog, model: &Arc<Model>) -> Arc<Prefetch> {
        let mut running = self.running.lock().expect("never poisoned");
        let key = (model.id.clone(), model.version.clone());
        if let Some(prefetch) = running.get(&key) {
            return Arc::clone(prefetch);
        }
        let (sender, outcome) = tokio::sync::watch::channel(None);
        let prefetch = Arc::new(Prefetch { outcome });
        running.insert(key, Arc::clone(&prefetch));
        let objects = objects_of(catalog, model);
        let id = model.id.clone();
        // Settled only after reads: one of no object waits for nothing of its own.
        let cache = model.source.cache().filter(|_| !objects.is_empty()).cloned();
        tokio::spawn(async move {
            tracing::info!(model = %id, "prefetching into the disk cache");
            let mut failure = None;
            for object in objects {
                let mut bytes = object.stream(0..object.size, "prefetch");
                while let Some(piece) = bytes.next().await {
                    if let Err(e) = piece {
                        failure = Some(e.to_string());
                        break;
                    }
                }
                if failure.is_some() {
                    break;
                }
            }
            if let Some(cache) = cache {
                // Done only once every block read is on disk.
                cache.settled().await;
            }
            match &failure {
                None => tracing::info!(model = %id, "prefetched"),
                Some(reason) => tracing::warn!(model = %id, reason, "prefetch failed"),
            }
            let _ = sender.send(Some(failure.map_or(Ok(()), Err)));
        });
        prefetch
    }

    /// After a rescan: forgets the prefetches of versions no longer listed (a failed one is
    /// tried again when asked), starts those `[cache] prefetch` names, and tells the disk cache
    /// which objects `[cache] pinned` names and the lineages' kept versions hold.
    pub(crate) fn upkeep(&self, catalog: &Catalog, sources: &[Arc<Source>]) {
        self.running.lock().expect("never poisoned").retain(|(id, version), prefetch| {
            catalog.get(id).is_some_and(|m| &m.version == version) && !matches!(prefetch.outcome(), Some(Err(_)))
        });
        for model in catalog.models().filter(|m| m.source.cache().is_some() && m.state.is_ok()) {
            if self.prefetched.contains(&model.id) {
                self.start(catalog, model);
            }
        }
        let pinned = self.pinned_objects(catalog);
        for source in sources {
            let of_source: Vec<(String, String)> = pinned
                .iter()
                .filter(|o| o.storage.name() == source.name)
                .map(|o| (o.key.clone(), o.version.clone()))
                .collect();
            if let Some(cache) = source.cache() {
                cache.pin(&of_source);
            }
        }
    }

    /// The objects of cached sources the disk cache never evicts: those of the models
    /// `[cache] pinned` names, and of the versions each lineage keeps (a fleet may still be
    /// loading any of them, and the next delta is computed from them).
    fn pinned_objects(&self, catalog: &Catalog) -> Vec<ObjectVersion> {
        catalog
            .models()
            .filter(|m| m.source.cache().is_some() && m.state.is_ok())
            .filter(|m| self.pinned.contains(&m.id) || catalog.is_kept_version(&m.id))
            .flat_map(|m| objects_of(catalog, m))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{LineageRules, ScanOptions};
    use crate::storage::local::LocalStorage;

    #[tokio::test]
    async fn the_kept_versions_of_a_lineage_are_pinned_beside_the_models_cache_pinned_names() {
        let dir = tempfile::tempdir().unwrap();
        let models = dir.path().join("models");
        let weights = crate::service::fixture::one_tensor_safetensors(&[1.0]);
        for (step, ready) in [("step-1", true), ("step-2", true), ("step-3", false)] {
            std::fs::create_dir_all(models.join("policy").join(step)).unwrap();
            std::fs::write(models.join("policy").join(step).join("model.safetensors"), &weights).unwrap();
            if ready {
                std::fs::write(models.join("policy").join(step).join("READY"), b"").unwrap();
            }
        }
        std::fs::write(models.join("solo.safetensors"), &weights).unwrap();
        std::fs::write(models.join("other.safetensors"), &weights).unwrap();
        let cache = crate::storage::cache::DiskCache::open(&dir.path().join("cache"), 1 << 20, 4096).unwrap();
        let source = Source::cached(Arc::new(LocalStorage::new("models", &models)), cache);
        let options = ScanOptions {
            limits: crate::format::Limits::default(),
            manifest_suffix_bytes: 64 << 10,
            concurrent_reads: 2,
            check_shard_digests: true,
            signature_file: None,
            lineages: LineageRules::new(&["policy".into()], 1, "READY"),
        };
        let catalog = Catalog::build(&[source], &Arc::default(), &options).await;
        let prefetches = Prefetches::new(crate::config::Cache { pinned: vec!["solo".into()], ..Default::default() });
        let mut pinned: Vec<String> = prefetches.pinned_objects(&catalog).into_iter().map(|o| o.key).collect();
        pinned.sort();
        assert_eq!(pinned, ["policy/step-2/READY", "policy/step-2/model.safetensors", "solo.safetensors"]);
    }
}
