//! Deltas between two versions of a model, region by region: what a fleet's ranks fetch to
//! turn the share of version A they hold into the same share of version B. The regions are
//! those of a regions request on B, planned and refused as `/regions` plans them; each is
//! paired with the same region of A (the same object, component and slice, when A has it with
//! the same format, shape, dtype and length; otherwise the region is sent whole), and answered
//! as its `format::delta` bytes followed by their CRC32C, four bytes big-endian, back to back
//! in the order asked. A delta is computed on the blocking pool from both regions' bytes as
//! their own routes serve them (behind their digest guards), once per key (both models and
//! versions, the object, component and slice): concurrent requests for one key wait for one
//! computation, which runs in a task of its own (a client that leaves stops the regions it
//! has not reached; one already under way finishes and is kept), and the result is kept in
//! the [`DeltaStore`]. The memory deltas take is held under one budget
//! (`refits.delta_memory_bytes`): both regions while one is computed, then the delta until its
//! bytes go to the body; a region needing more than all of it is refused before any byte, and a
//! request asks for its next delta only once the last has gone, so it never waits on memory it
//! holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use futures_util::{StreamExt as _, TryStreamExt as _, stream};
use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};

use super::ServiceError;
use super::components::Representations;
use super::delta_store::{DeltaStore, file_name};
use super::regions::{self, Planned, RegionLimits, RegionRequest};
use super::representation::ByteStream;
use super::slices::{ResolvedSlice, SliceRequest};
use crate::catalog::Model;
use crate::format::Manifest;
use crate::format::delta;

/// The zstd level of a patch's payload: fast, and most of a patch's size is its values.
const ZSTD_LEVEL: i32 = 3;

/// Bytes per permit of the memory budget (a semaphore counts at most `u32::MAX` per acquire).
const PERMIT_BYTES: u64 = 1 << 10;

/// A deltas body: how many regions it holds, and its pieces.
pub(crate) struct DeltasBody {
    pub count: usize,
    pub body: ByteStream,
}

/// The two model versions a request diffs, and what reads their bytes.
struct Pair {
    representations: Arc<Representations>,
    base: (Arc<Model>, Arc<Manifest>),
    target: (Arc<Model>, Arc<Manifest>),
}

/// One region's delta to send: B's region, A's when they can be compared, and its key.
struct Job {
    name: String,
    target: Planned,
    base: Option<Planned>,
    width: usize,
    need: u64,
}

/// Whether a delta was read from the store or computed for this request.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Kept,
    Computed,
}

/// A delta and the CRC32C of its bytes, holding its share of the memory budget until every
/// request that waits for it has passed its bytes on.
#[derive(Clone)]
struct Delta {
    bytes: Bytes,
    crc: u32,
    outcome: Outcome,
    _held: Arc<OwnedSemaphorePermit>,
}

/// The deltas of every request: their store, the memory budget their computations share, and
/// the computations under way, by key.
pub(super) struct Deltas {
    store: Arc<DeltaStore>,
    memory: Arc<Semaphore>,
    memory_limit: u64,
    in_flight: Mutex<HashMap<String, Arc<OnceCell<Delta>>>>,
}

impl Deltas {
    pub(super) fn new(refits: &crate::config::Refits) -> std::io::Result<Deltas> {
        let store = DeltaStore::open(refits.delta_dir.as_deref(), refits.delta_cache_bytes)?;
        let permits = usize::try_from(refits.delta_memory_bytes / PERMIT_BYTES)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS)
            .min(u32::MAX as usize);
        Ok(Deltas {
            store: Arc::new(store),
            memory: Arc::new(Semaphore::new(permits)),
            // Whole permits: a region within the limit never asks for more than there are.
            memory_limit: permits as u64 * PERMIT_BYTES,
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// The deltas from `base` to `target` of the regions `requests` asks of `target`: planned
    /// and refused whole first (as `/regions` refuses, and a region over the memory budget),
    /// then each computed or read from the store as the body reaches it.
    pub(super) async fn deltas(
        self: &Arc<Self>,
        representations: Arc<Representations>,
        base: (Arc<Model>, Arc<Manifest>),
        target: (Arc<Model>, Arc<Manifest>),
        requests: Vec<RegionRequest>,
        limits: RegionLimits,
    ) -> Result<DeltasBody, ServiceError> {
        let jobs = self.jobs(&representations, &base, &target, requests, limits).await?;
        let count = jobs.len();
        let pair = Arc::new(Pair { representations, base, target });
        let deltas = Arc::clone(self);
        let body = stream::iter(jobs)
            .map(move |job| Arc::clone(&deltas).one(Arc::clone(&pair), job))
            // One at a time: a request holds one delta's memory, and waits for the next only once
            // that delta has gone to the body, so it never waits on memory it holds itself
            // (requests in parallel are what keeps the blocking pool busy).
            .buffered(1)
            .map_ok(|delta| {
                let sent = delta.bytes.len() as u64 + 4;
                let outcome = match delta.outcome {
                    Outcome::Kept => "kept",
                    Outcome::Computed => "computed",
                };
                metrics::counter!(crate::telemetry::names::DELTAS, "outcome" => outcome).increment(1);
                metrics::counter!(crate::telemetry::names::DELTA_BYTES).increment(sent);
                let crc = Bytes::copy_from_slice(&delta.crc.to_be_bytes());
                let pieces = [Ok(delta.bytes.clone()), Ok(crc)];
                // The delta (and its permits) goes with the stream of its pieces, once both are sent.
                stream::iter(pieces).map(move |piece| {
                    let _held = &delta;
                    piece
                })
            })
            .try_flatten()
            .boxed();
        Ok(DeltasBody { count, body })
    }

    /// The delta from `base` to `target` of the one region `request` asks, as a request for it
    /// would have it (the same key, computation under way, memory budget and store), for a
    /// computation ahead of need: whether this call computed it (not kept, nor computed by
    /// another).
    pub(super) async fn ahead(
        self: &Arc<Self>,
        representations: Arc<Representations>,
        base: (Arc<Model>, Arc<Manifest>),
        target: (Arc<Model>, Arc<Manifest>),
        request: RegionRequest,
        limits: RegionLimits,
    ) -> Result<bool, ServiceError> {
        let mut jobs = self.jobs(&representations, &base, &target, vec![request], limits).await?;
        let Some(job) = jobs.pop() else { return Ok(false) };
        let pair = Arc::new(Pair { representations, base, target });
        let mut ran = false;
        let delta = Arc::clone(self)
            .one_with(job, |deltas, job| {
                ran = true;
                deltas.kept_or_computed(pair, job)
            })
            .await?;
        Ok(ran && matches!(delta.outcome, Outcome::Computed))
    }

    /// The jobs of the regions `requests` asks of `target`, each paired with its region of
    /// `base`: planned and refused whole as `/regions` refuses, and a region over the budget.
    async fn jobs(
        &self,
        representations: &Representations,
        base: &(Arc<Model>, Arc<Manifest>),
        target: &(Arc<Model>, Arc<Manifest>),
        requests: Vec<RegionRequest>,
        limits: RegionLimits,
    ) -> Result<Vec<Job>, ServiceError> {
        let asked = requests.clone();
        let planned = regions::planned(representations, &target.0, &target.1, requests, limits).await?;
        let mut jobs = Vec::with_capacity(planned.len());
        for (request, region) in asked.iter().zip(planned) {
            let base_region = counterpart(&base.0, &base.1, &target.1, &region, request);
            // A base region that is not served now (its digest pending, its signature refused)
            // fails the request as its own route would: sent whole, it would be kept whole.
            if let Some(found) = &base_region {
                let object = &base.1.objects[found.object];
                representations.admit(&base.0, &base.1, object, &object.components[found.component]).await?;
            }
            jobs.push(self.job(base, target, region, base_region)?);
        }
        Ok(jobs)
    }

    /// The job of `region` of `target`, paired with `base_region`: its key, element width and
    /// the memory it needs, refused when that is more than the whole budget.
    fn job(
        &self,
        base: &(Arc<Model>, Arc<Manifest>),
        target: &(Arc<Model>, Arc<Manifest>),
        region: Planned,
        base_region: Option<Planned>,
    ) -> Result<Job, ServiceError> {
        let object = &target.1.objects[region.object];
        let component = &object.components[region.component];
        let width = usize::try_from(component.dtype.width()).unwrap_or(1);
        let width = if matches!(width, 1 | 2 | 4 | 8) && region.len.is_multiple_of(width as u64) { width } else { 1 };
        // Both regions while a patch is encoded; a whole delta copies its region after a header.
        let need = region.len.saturating_add(
            base_region.as_ref().map_or(region.len.saturating_add(delta::HEADER_LEN as u64), |r| r.len),
        );
        if need > self.memory_limit {
            return Err(ServiceError::DeltaRegionTooLarge {
                model: target.0.id.clone(),
                object: object.name.clone(),
                need,
                limit: self.memory_limit,
            });
        }
        let slice = region.slice.as_ref().map_or_else(String::new, |s| {
            s.slice.ranges.iter().map(|r| format!("{}:{}", r.start, r.end)).collect::<Vec<_>>().join(",")
        });
        let (base_version, target_version) = (super::version_token(&base.0), super::version_token(&target.0));
        let name = file_name(&[
            "ztserve-delta-1",
            &base.0.id,
            &base_version,
            &target.0.id,
            &target_version,
            &object.name,
            &component.role,
            &slice,
        ]);
        Ok(Job { name, target: region, base: base_region, width, need })
    }

    /// The delta of `job`: the computation under way for its key, or the one kept, or a new
    /// one (in a task of its own, so it finishes and is kept if this request goes).
    async fn one(self: Arc<Self>, pair: Arc<Pair>, job: Job) -> Result<Delta, ServiceError> {
        self.one_with(job, |deltas, job| deltas.kept_or_computed(pair, job)).await
    }

    /// The delta of `job`: the computation under way for its key, or the one `start` begins.
    async fn one_with<F>(
        self: Arc<Self>,
        job: Job,
        start: impl FnOnce(Arc<Self>, Job) -> F,
    ) -> Result<Delta, ServiceError>
    where
        F: Future<Output = Result<Delta, ServiceError>>,
    {
        let name = job.name.clone();
        let cell = Arc::clone(self.in_flight.lock().expect("in-flight lock").entry(name.clone()).or_default());
        let waiting = Waiting { deltas: Arc::clone(&self), name, cell };
        waiting.cell.get_or_try_init(|| start(Arc::clone(&self), job)).await.cloned()
    }

    async fn kept_or_computed(self: Arc<Self>, pair: Arc<Pair>, job: Job) -> Result<Delta, ServiceError> {
        // A kept delta is at most its region whole, after a header.
        let most = job.target.len.saturating_add(delta::HEADER_LEN as u64);
        let mut held = self.held(most).await?;
        let (store, name) = (Arc::clone(&self.store), job.name.clone());
        let kept = tokio::task::spawn_blocking(move || store.get(&name)).await.map_err(internal)?;
        if let Some((bytes, crc)) = kept {
            drop(held.split(held.num_permits().saturating_sub(units(bytes.len() as u64))));
            return Ok(Delta { bytes, crc, outcome: Outcome::Kept, _held: Arc::new(held) });
        }
        drop(held);
        tokio::spawn(self.computed(pair, job)).await.map_err(internal)?
    }

    /// `bytes` of the memory budget, waited for.
    async fn held(&self, bytes: u64) -> Result<OwnedSemaphorePermit, ServiceError> {
        let units = u32::try_from(units(bytes)).map_err(internal)?;
        Arc::clone(&self.memory).acquire_many_owned(units).await.map_err(internal)
    }

    /// Reads both regions under the memory budget and computes their delta on the blocking
    /// pool, then keeps it.
    async fn computed(self: Arc<Self>, pair: Arc<Pair>, job: Job) -> Result<Delta, ServiceError> {
        let mut permits = self.held(job.need).await?;
        let Pair { representations, base, target } = &*pair;
        let new = regions::region_buffer(representations, &target.0, &target.1, &job.target).await?;
        let old = match &job.base {
            Some(region) => Some(regions::region_buffer(representations, &base.0, &base.1, region).await?),
            None => None,
        };
        let store = Arc::clone(&self.store);
        let Job { name, width, .. } = job;
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let encoded = match &old {
                Some(old) => delta::encode(old, &new, width, ZSTD_LEVEL),
                None => delta::whole(&new, width),
            };
            drop((old, new));
            let bytes = encoded.map_err(|e| ServiceError::Internal(format!("encoding a delta: {e}")))?;
            // What the delta's bytes hold stays counted until they are sent; the rest goes now.
            drop(permits.split(permits.num_permits().saturating_sub(units(bytes.len() as u64))));
            metrics::histogram!(crate::telemetry::names::DELTA_COMPUTE).record(started.elapsed().as_secs_f64());
            let crc = crc32c::crc32c(&bytes);
            store.put(&name, &bytes, crc);
            Ok(Delta { bytes: Bytes::from(bytes), crc, outcome: Outcome::Computed, _held: Arc::new(permits) })
        })
        .await
        .map_err(internal)?
    }
}

/// A request waiting for the delta of `name`: when it stops waiting (answered, failed, or gone
/// with its client), the key's entry goes once its delta is known or nobody else waits.
struct Waiting {
    deltas: Arc<Deltas>,
    name: String,
    cell: Arc<OnceCell<Delta>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut in_flight = self.deltas.in_flight.lock().expect("in-flight lock");
        let held = in_flight.get(&self.name).is_some_and(|held| Arc::ptr_eq(held, &self.cell));
        // Two holders left: the map and this waiter.
        if held && (self.cell.initialized() || Arc::strong_count(&self.cell) <= 2) {
            in_flight.remove(&self.name);
        }
    }
}

/// The permits `bytes` of the memory budget take.
fn units(bytes: u64) -> usize {
    usize::try_from(bytes.div_ceil(PERMIT_BYTES)).unwrap_or(usize::MAX)
}

fn internal(e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Internal(e.to_string())
}

/// The region of `base` that `region` of `target` is a new version of: the same object,
/// component and slice, with the same format, shape, dtype and length; `None` when there is
/// none (the region is then sent whole).
fn counterpart(
    base_model: &Model,
    base: &Manifest,
    target: &Manifest,
    region: &Planned,
    request: &RegionRequest,
) -> Option<Planned> {
    let object = &target.objects[region.object];
    let component = &object.components[region.component];
    let base_index = base.object_index(&object.name)?;
    let base_object = &base.objects[base_index];
    if base_object.shape != object.shape || base_object.format != object.format {
        return None;
    }
    let base_component = base_object.components.iter().position(|c| c.role == component.role)?;
    let found = &base_object.components[base_component];
    if found.dtype != component.dtype || found.decoded_length != component.decoded_length {
        return None;
    }
    let slice = match request.slice.as_deref() {
        Some(spec) => Some(ResolvedSlice::resolve(base_model, base_object, SliceRequest::Spec(spec)).ok()?),
        None => None,
    };
    let len = slice.as_ref().map_or(found.decoded_length, ResolvedSlice::len);
    (len == region.len).then_some(Planned { object: base_index, component: base_component, slice, len })
}
