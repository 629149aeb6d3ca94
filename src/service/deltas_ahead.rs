//! Deltas computed ahead of need (`refits.deltas_ahead`): a fleet asks the deltas between two
//! versions of a lineage for the same regions at every step, so the regions those requests
//! asked are remembered per lineage (the most recent, at most [`MOST_REMEMBERED`] distinct
//! ones: every rank's plan of a DeepSeek-sized model at TP=8), and after a rescan that lists a lineage's new newest version V, the deltas from the
//! version kept before it, P, of those regions are computed in the background, as a request
//! for them would compute them (the same keys, computations under way, memory budget and
//! store): a request arriving meanwhile waits for the same computation, and the fleet's first
//! request finds them kept. One region at a time across every lineage, never more than one
//! computation at once, yielding to requests between regions; a run stops when V or P is no
//! longer kept, or a newer version is.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use super::catalogs::Catalogs;
use super::components::Representations;
use super::deltas::Deltas;
use super::regions::{RegionLimits, RegionRequest};
use crate::catalog::{Catalog, Model};
use crate::format::Manifest;

/// The most distinct regions remembered per lineage: a TP=8 engine's ranks of a 700 GB model
/// ask about 720,000 (each remembered in about a hundred bytes).
const MOST_REMEMBERED: usize = 1 << 20;

/// What the service computes ahead with, and what it remembers of the requests.
pub(super) struct DeltasAhead {
    enabled: bool,
    limits: RegionLimits,
    deltas: Arc<Deltas>,
    representations: Arc<Representations>,
    catalogs: Arc<Catalogs>,
    /// By lineage: the regions asked of its versions.
    remembered: Mutex<HashMap<String, Asked>>,
    /// By lineage: its newest kept version at the last rescan.
    newest: Mutex<HashMap<String, String>>,
    /// The one background computation's turn.
    turn: Arc<Semaphore>,
}

/// One run: the deltas from `base` to `target` (model ids, at the versions the catalog listed)
/// of `regions`, while both stay kept and `target` stays its lineage's newest version.
struct Run {
    lineage: String,
    newest: String,
    base: (String, String),
    target: (String, String),
    regions: Vec<RegionRequest>,
}

impl DeltasAhead {
    pub(super) fn new(
        enabled: bool,
        limits: RegionLimits,
        deltas: Arc<Deltas>,
        representations: Arc<Representations>,
        catalogs: Arc<Catalogs>,
    ) -> DeltasAhead {
        DeltasAhead {
            enabled,
            limits,
            deltas,
            representations,
            catalogs,
            remembered: Mutex::default(),
            newest: Mutex::default(),
            turn: Arc::new(Semaphore::new(1)),
        }
    }

    /// Remembers the regions a deltas request from model `base` to model `target` asked, when
    /// both are versions of one lineage (the same model within two version folders).
    pub(super) fn remember(&self, base: &str, target: &str, requests: &[RegionRequest]) {
        if !self.enabled {
            return;
        }
        let catalog = self.catalogs.current();
        let (Some((lineage, from, rest)), Some((target_lineage, to, target_rest))) =
            (catalog.lineage_version(base), catalog.lineage_version(target))
        else {
            return;
        };
        if lineage.lineage != target_lineage.lineage || rest != target_rest || from == to {
            return;
        }
        let mut remembered = self.remembered.lock().expect("never poisoned");
        let asked = remembered.entry(lineage.lineage.clone()).or_default();
        asked.remember(&rest, requests, MOST_REMEMBERED);
    }

    /// After a rescan: for each lineage whose newest kept version is new since the last one,
    /// and that keeps a version before it, computes in the background the deltas between the
    /// two of the regions remembered for it. Lineages no longer listed are forgotten.
    pub(super) fn upkeep(self: &Arc<Self>, catalog: &Catalog) {
        if !self.enabled {
            return;
        }
        let mut runs = Vec::new();
        {
            let mut newest = self.newest.lock().expect("never poisoned");
            let mut remembered = self.remembered.lock().expect("never poisoned");
            let listed: Vec<&String> = catalog.lineages().map(|v| &v.lineage).collect();
            remembered.retain(|lineage, _| listed.contains(&lineage));
            newest.retain(|lineage, _| listed.contains(&lineage));
            for versions in catalog.lineages() {
                let [.., previous, last] = versions.kept.as_slice() else { continue };
                let was = newest.insert(versions.lineage.clone(), last.clone());
                if was.as_ref() == Some(last) {
                    continue;
                }
                let Some(asked) = remembered.get(&versions.lineage) else { continue };
                for (rest, regions) in asked.by_model() {
                    let base = format!("{}/{previous}{rest}", versions.lineage);
                    let target = format!("{}/{last}{rest}", versions.lineage);
                    let (Some(base_model), Some(target_model)) = (catalog.get(&base), catalog.get(&target)) else {
                        continue;
                    };
                    runs.push(Run {
                        lineage: versions.lineage.clone(),
                        newest: last.clone(),
                        base: (base, base_model.version.clone()),
                        target: (target, target_model.version.clone()),
                        regions,
                    });
                }
            }
        }
        for run in runs {
            tokio::spawn(Arc::clone(self).run(run));
        }
    }

    /// Computes a run's deltas one region at a time, each in its turn.
    async fn run(self: Arc<Self>, run: Run) {
        tracing::info!(from = %run.base.0, to = %run.target.0, regions = run.regions.len(), "computing deltas ahead");
        let mut computed = 0usize;
        for request in run.regions {
            let Ok(turn) = Arc::clone(&self.turn).acquire_owned().await else { return };
            let catalog = self.catalogs.current();
            let newest = self.newest.lock().expect("never poisoned").get(&run.lineage) == Some(&run.newest);
            let (Some(base), Some(target), true) = (kept(&catalog, &run.base), kept(&catalog, &run.target), newest)
            else {
                tracing::debug!(from = %run.base.0, to = %run.target.0, "versions no longer kept: deltas ahead stop");
                return;
            };
            let representations = Arc::clone(&self.representations);
            match self.deltas.ahead(representations, base, target, request, self.limits).await {
                Ok(true) => {
                    computed += 1;
                    metrics::counter!(crate::telemetry::names::DELTAS_AHEAD).increment(1);
                }
                Ok(false) => {}
                Err(e) => tracing::debug!(to = %run.target.0, error = %e, "a delta ahead was not computed"),
            }
            drop(turn);
            tokio::task::yield_now().await;
        }
        tracing::info!(from = %run.base.0, to = %run.target.0, computed, "deltas computed ahead");
    }
}

/// The distinct regions asked of a lineage's versions, each by the rest of the model id below
/// the version (usually empty) and stamped with when it was last asked.
#[derive(Debug, Default)]
struct Asked {
    next: u64,
    regions: HashMap<(String, RegionRequest), u64>,
}

impl Asked {
    /// Remembers `requests` asked of the model `rest` below a version, keeping the `most`
    /// most recently asked regions.
    fn remember(&mut self, rest: &str, requests: &[RegionRequest], most: usize) {
        for request in requests {
            self.regions.insert((rest.to_owned(), request.clone()), self.next);
            self.next += 1;
        }
        if self.regions.len() > most {
            let mut stamps: Vec<u64> = self.regions.values().copied().collect();
            let at = stamps.len() - most;
            let oldest_kept = *stamps.select_nth_unstable(at).1;
            self.regions.retain(|_, stamp| *stamp >= oldest_kept);
        }
    }

    /// The regions remembered, by the model below a version, each model's in the order asked.
    fn by_model(&self) -> BTreeMap<String, Vec<RegionRequest>> {
        let mut stamped: Vec<(&u64, &(String, RegionRequest))> = self.regions.iter().map(|(k, s)| (s, k)).collect();
        stamped.sort_unstable_by_key(|(stamp, _)| **stamp);
        let mut by_model: BTreeMap<String, Vec<RegionRequest>> = BTreeMap::new();
        for (_, (rest, request)) in stamped {
            by_model.entry(rest.clone()).or_default().push(request.clone());
        }
        by_model
    }
}

/// Model `id` at `version` and its manifest, while `catalog` lists it so as a kept version.
fn kept(catalog: &Catalog, (id, version): &(String, String)) -> Option<(Arc<Model>, Arc<Manifest>)> {
    let model = catalog.get(id).filter(|m| &m.version == version && catalog.is_kept_version(id))?;
    let manifest = model.state.as_ref().ok()?;
    Some((Arc::clone(model), Arc::clone(manifest)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(object: &str, slice: &str) -> RegionRequest {
        RegionRequest { object: object.into(), component: None, slice: Some(slice.into()) }
    }

    #[test]
    fn the_most_recently_asked_distinct_regions_are_remembered_within_the_bound() {
        let mut asked = Asked::default();
        asked.remember("", &[region("w", "0:1"), region("w", "1:2"), region("b", "0:4")], 3);
        // Asked again, a region is the most recent, not a second one.
        asked.remember("", &[region("w", "0:1")], 3);
        asked.remember("/weights", &[region("w", "2:3")], 3);
        let by_model = asked.by_model();
        assert_eq!(by_model[""], [region("b", "0:4"), region("w", "0:1")]);
        assert_eq!(by_model["/weights"], [region("w", "2:3")]);
        assert_eq!(asked.regions.len(), 3);
        // More than the bound at once: the last `most` of them.
        let many: Vec<RegionRequest> = (0..10).map(|i| region("w", &format!("{i}:{}", i + 1))).collect();
        asked.remember("", &many, 4);
        assert_eq!(asked.by_model()[""], many[6..]);
        assert_eq!(asked.by_model().len(), 1);
    }
}
