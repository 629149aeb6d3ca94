//! Catalogs and their versions: the configured sources, the catalog snapshot every request
//! reads, the rescan that builds the next one and swaps it in (one at a time, so listings never
//! arrive out of order), readiness after the first, and the lookup of a model, an object and a
//! component with the precise error for each miss.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use super::ServiceError;
use crate::catalog::{Catalog, Model, ScanOptions, Source};
use crate::format::{Component, Manifest, Object};
use crate::telemetry::names;

/// The sources and the catalog snapshot listed from them.
pub(crate) struct Catalogs {
    /// The configured sources, in order, with their health.
    sources: Vec<Arc<Source>>,
    options: ScanOptions,
    current: RwLock<Arc<Catalog>>,
    /// Held for a whole rescan: two rescans at once could finish out of order and swap in the
    /// older listing last.
    rescanning: tokio::sync::Mutex<()>,
    ready: AtomicBool,
}

impl Catalogs {
    /// An empty catalog of `sources`, not ready until the first rescan.
    pub(crate) fn new(sources: Vec<Arc<Source>>, options: ScanOptions) -> Catalogs {
        Catalogs {
            sources,
            options,
            current: RwLock::new(Arc::new(Catalog::default())),
            rescanning: tokio::sync::Mutex::new(()),
            ready: AtomicBool::new(false),
        }
    }

    /// The current catalog snapshot.
    pub(crate) fn current(&self) -> Arc<Catalog> {
        Arc::clone(&self.current.read().expect("catalog lock is never poisoned"))
    }

    /// The configured sources, in order, with their health.
    pub(crate) fn sources(&self) -> &[Arc<Source>] {
        &self.sources
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Lists every source and swaps in the new catalog, which makes the catalogs ready.
    /// `before_swap` sees the new catalog first, so what is kept per model version can be
    /// trimmed, and what the disk cache must know told, before a request reads the new listing. `None` when the scan itself failed (it
    /// runs in its own task, so a panic in it is contained like one in a handler); the old
    /// catalog then stays.
    pub(crate) async fn rescan(self: &Arc<Self>, before_swap: impl AsyncFnOnce(&Catalog)) -> Option<Arc<Catalog>> {
        let _one_at_a_time = self.rescanning.lock().await;
        let (catalogs, previous) = (Arc::clone(self), self.current());
        let built =
            tokio::spawn(async move { Catalog::build(&catalogs.sources, &previous, &catalogs.options).await }).await;
        let catalog = match built {
            Ok(catalog) => catalog,
            Err(e) => {
                tracing::error!(error = %e, "rescan task failed");
                return None;
            }
        };
        for (source, reason) in &catalog.unreadable_sources {
            tracing::warn!(source, reason, "source cannot be scanned");
        }
        let total = catalog.models().count();
        let broken = catalog.models().filter(|m| m.state.is_err()).count();
        tracing::debug!(models = total, broken, "catalog rescanned");
        metrics::gauge!(names::MODELS, "status" => "ok").set((total - broken) as f64);
        metrics::gauge!(names::MODELS, "status" => "broken").set(broken as f64);
        before_swap(&catalog).await;
        let catalog = Arc::new(catalog);
        *self.current.write().expect("catalog lock is never poisoned") = Arc::clone(&catalog);
        self.ready.store(true, Ordering::Release);
        Some(catalog)
    }

    /// The model `id` of the current catalog and its manifest, as [`Catalogs::model_in`].
    #[cfg(test)]
    fn model(&self, id: &str) -> Result<(Arc<Model>, Arc<Manifest>), ServiceError> {
        self.model_in(&self.current(), id)
    }

    /// The model `id` of `catalog` (a snapshot of these) and its manifest: refused when the
    /// catalog is not ready, the model is unknown (or a version of a lineage that is not kept)
    /// or it is broken. Whoever asks has already checked that the caller may read it.
    pub(crate) fn model_in(&self, catalog: &Catalog, id: &str) -> Result<(Arc<Model>, Arc<Manifest>), ServiceError> {
        if !self.is_ready() {
            return Err(ServiceError::NotReady);
        }
        let model = catalog.get(id).cloned().ok_or_else(|| match catalog.gone_version(id) {
            Some(gone) => ServiceError::LineageVersionGone { model: id.to_owned(), gone: Box::new(gone) },
            None => ServiceError::ModelNotFound(id.to_owned()),
        })?;
        let manifest = match &model.state {
            Ok(manifest) => Arc::clone(manifest),
            Err(e) => return Err(ServiceError::BrokenModel { model: id.to_owned(), source: Box::new(e.clone()) }),
        };
        Ok((model, manifest))
    }
}

/// `name` of `model`'s manifest.
pub(crate) fn object<'m>(model: &Model, manifest: &'m Manifest, name: &str) -> Result<&'m Object, ServiceError> {
    manifest
        .object(name)
        .ok_or_else(|| ServiceError::ObjectNotFound { model: model.id.clone(), object: name.to_owned() })
}

/// Component `role` of `object`, or the roles it has.
pub(crate) fn component<'o>(model: &Model, object: &'o Object, role: &str) -> Result<&'o Component, ServiceError> {
    object.component(role).ok_or_else(|| ServiceError::ComponentNotFound {
        model: model.id.clone(),
        object: object.name.clone(),
        role: role.to_owned(),
        available: object.components.iter().map(|c| format!("{:?}", c.role)).collect::<Vec<_>>().join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalogs_of(dir: &std::path::Path) -> Arc<Catalogs> {
        crate::service::fixture::catalogs_of(dir, None)
    }

    fn safetensors_of_one_tensor() -> Vec<u8> {
        crate::service::fixture::one_tensor_safetensors(&[0.0, 0.0])
    }

    #[tokio::test]
    async fn a_lookup_names_what_is_missing_and_waits_for_the_first_listing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("good.safetensors"), safetensors_of_one_tensor()).unwrap();
        std::fs::write(dir.path().join("bad.safetensors"), b"not a header").unwrap();
        let catalogs = catalogs_of(dir.path());
        assert!(matches!(catalogs.model("good"), Err(ServiceError::NotReady)));

        let mut seen_before_swap = 0;
        let listed =
            catalogs.rescan(async |catalog: &Catalog| seen_before_swap = catalog.models().count()).await.unwrap();
        assert_eq!(seen_before_swap, 2);
        assert!(Arc::ptr_eq(&listed, &catalogs.current()));

        let (model, manifest) = catalogs.model("good").unwrap();
        let tensor = object(&model, &manifest, "w").unwrap();
        assert!(component(&model, tensor, "data").is_ok());
        match component(&model, tensor, "absmax") {
            Err(ServiceError::ComponentNotFound { available, .. }) => assert_eq!(available, "\"data\""),
            other => panic!("expected ComponentNotFound, got {other:?}"),
        }
        assert!(matches!(object(&model, &manifest, "v"), Err(ServiceError::ObjectNotFound { .. })));
        assert!(matches!(catalogs.model("bad"), Err(ServiceError::BrokenModel { .. })));
        assert!(matches!(catalogs.model("absent"), Err(ServiceError::ModelNotFound(_))));
    }

    #[tokio::test]
    async fn a_rescan_swaps_in_what_the_sources_list_now() {
        let dir = tempfile::tempdir().unwrap();
        let catalogs = catalogs_of(dir.path());
        catalogs.rescan(async |_: &Catalog| {}).await.unwrap();
        assert!(matches!(catalogs.model("late"), Err(ServiceError::ModelNotFound(_))));
        std::fs::write(dir.path().join("late.safetensors"), safetensors_of_one_tensor()).unwrap();
        catalogs.rescan(async |_: &Catalog| {}).await.unwrap();
        assert!(catalogs.model("late").is_ok());
    }
}
