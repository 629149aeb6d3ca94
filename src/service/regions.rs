//! Many regions of one model version in one body: a tensor-parallel rank's whole plan (slices
//! of dense tensors, whole components) asked for at once and answered back to back, each
//! region's bytes followed by their CRC32C, so the client checks every region as it lands and
//! resumes at the first one it has not checked. A request is refused whole before any byte
//! when it asks too much (too many regions, overlapping ones, too many bytes) or names what
//! cannot be cut; each region's bytes are then those its own route would send (from a local
//! file's mapping by the kernel, checksummed from the same bytes read with `pread`), opened
//! only when the body reaches it.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use futures_util::{StreamExt as _, TryStreamExt as _, stream};

use super::ServiceError;
use super::bytes::{ModelBytes, model_bytes, storage_failed};
use super::components::{ComponentRequest, Cut, Representations};
use super::representation::{ByteStream, guarded};
use super::slices::{ResolvedSlice, SliceRequest};
use crate::catalog::Model;
use crate::format::Manifest;

/// The bytes each region's checksum adds after it: CRC32C (Castagnoli), big-endian.
const CHECKSUM_BYTES: u64 = 4;

/// Pieces at least this long are checksummed on the blocking pool; shorter ones cost less
/// than the hop.
const CHECKSUM_OFF_RUNTIME: usize = 64 << 10;

/// Regions opened ahead of the one being sent, so a region's setup (a digest verdict, the
/// first read) overlaps the body before it.
const REGIONS_AHEAD: usize = 2;

/// One region a request asks for: a component of an object (its only one when `component` is
/// not given), whole or cut by `slice` (`start:stop` per dimension, as `?slice=` takes it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegionRequest {
    pub object: String,
    #[serde(default)]
    pub component: Option<String>,
    #[serde(default)]
    pub slice: Option<String>,
}

/// What one regions request may ask for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegionLimits {
    pub max_regions: usize,
    pub max_bytes: u64,
}

/// Why a regions request is refused as written, before any byte is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RegionsRefusal {
    #[error("no regions were asked for")]
    Empty,
    #[error("{requested} regions were asked for; at most {limit} are served per request")]
    TooMany { requested: usize, limit: usize },
    #[error("the regions asked for come to {total} bytes; at most {limit} are served per request")]
    TooLarge { total: u128, limit: u64 },
    #[error("regions {first} and {second} overlap in component {role:?} of object {object:?}; ask for each byte once")]
    Overlap { object: String, role: String, first: usize, second: usize },
    #[error("object {object:?} has the components {available}: name the one wanted")]
    AmbiguousComponent { object: String, available: String },
}

impl RegionsRefusal {
    /// The stable code of the refusal, as the HTTP contract names it.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            RegionsRefusal::Empty => "no_regions",
            RegionsRefusal::TooMany { .. } => "too_many_regions",
            RegionsRefusal::TooLarge { .. } => "regions_too_large",
            RegionsRefusal::Overlap { .. } => "regions_overlap",
            RegionsRefusal::AmbiguousComponent { .. } => "component_ambiguous",
        }
    }
}

/// A region checked against the manifest: where it is and how long its bytes are.
#[derive(Debug, Clone)]
pub(super) struct Planned {
    pub object: usize,
    pub component: usize,
    pub slice: Option<ResolvedSlice>,
    pub len: u64,
}

/// A regions body: its length (every region and its checksum) and its pieces.
pub(crate) struct RegionsBody {
    pub len: u64,
    pub count: usize,
    pub body: ByteStream,
}

/// The regions of `requests` checked against `model`'s manifest and `limits`: each names an
/// object and component it has, cut where it can be cut, no two overlap, and their bytes
/// come to at most the limit.
fn plan(
    model: &Model,
    manifest: &Manifest,
    requests: &[RegionRequest],
    limits: RegionLimits,
) -> Result<Vec<Planned>, ServiceError> {
    let refused = |reason| ServiceError::BadRegions { model: model.id.clone(), reason };
    if requests.is_empty() {
        return Err(refused(RegionsRefusal::Empty));
    }
    if requests.len() > limits.max_regions {
        return Err(refused(RegionsRefusal::TooMany { requested: requests.len(), limit: limits.max_regions }));
    }
    let mut planned = Vec::with_capacity(requests.len());
    let mut total: u128 = 0;
    for request in requests {
        let object_index = manifest
            .object_index(&request.object)
            .ok_or_else(|| ServiceError::ObjectNotFound { model: model.id.clone(), object: request.object.clone() })?;
        let object = &manifest.objects[object_index];
        let component = match (request.component.as_deref(), &object.components[..]) {
            (Some(role), _) => super::component(model, object, role)?,
            (None, [only]) => only,
            (None, all) => {
                let available = all.iter().map(|c| format!("{:?}", c.role)).collect::<Vec<_>>().join(", ");
                return Err(refused(RegionsRefusal::AmbiguousComponent { object: object.name.clone(), available }));
            }
        };
        let slice = request
            .slice
            .as_deref()
            .map(|spec| ResolvedSlice::resolve(model, object, SliceRequest::Spec(spec)))
            .transpose()?;
        let len = match &slice {
            Some(slice) => slice.len(),
            None => component.decoded_length,
        };
        total += u128::from(len);
        if total > u128::from(limits.max_bytes) {
            return Err(refused(RegionsRefusal::TooLarge { total, limit: limits.max_bytes }));
        }
        let component_index =
            object.components.iter().position(|c| c.role == component.role).expect("a component of the object");
        planned.push(Planned { object: object_index, component: component_index, slice, len });
    }
    refuse_overlaps(manifest, &planned).map_err(refused)?;
    Ok(planned)
}

/// The box a region covers in its component, one range per dimension: a slice's ranges, the
/// whole shape of a dense tensor, or the decoded bytes of any other component (which is only
/// ever asked for whole).
fn covered(manifest: &Manifest, planned: &Planned) -> Vec<Range<u64>> {
    let object = &manifest.objects[planned.object];
    match &planned.slice {
        Some(slice) => slice.slice.ranges.clone(),
        None if crate::format::slice::geometry(object).is_ok() => object.shape.iter().map(|&n| 0..n).collect(),
        None => std::iter::once(0..planned.len).collect(),
    }
}

/// Refuses two non-empty regions of the same component that share a byte (or element).
fn refuse_overlaps(manifest: &Manifest, planned: &[Planned]) -> Result<(), RegionsRefusal> {
    /// Each region's index and box, by (object, component).
    type Boxes = std::collections::HashMap<(usize, usize), Vec<(usize, Vec<Range<u64>>)>>;
    let mut by_component = Boxes::new();
    for (at, region) in planned.iter().enumerate() {
        if region.len > 0 {
            by_component.entry((region.object, region.component)).or_default().push((at, covered(manifest, region)));
        }
    }
    let start = |b: &[Range<u64>]| b.first().map_or(0, |r| r.start);
    for ((object, component), mut boxes) in by_component {
        // Swept along the first dimension: only boxes that meet there are compared whole.
        boxes.sort_by_key(|(_, b)| start(b));
        for i in 0..boxes.len() {
            for j in i + 1..boxes.len() {
                let (a, b) = (&boxes[i].1, &boxes[j].1);
                if a.first().is_some_and(|first| start(b) >= first.end) {
                    break;
                }
                if a.iter().zip(b).all(|(a, b)| a.start < b.end && b.start < a.end) {
                    let object = &manifest.objects[object];
                    return Err(RegionsRefusal::Overlap {
                        object: object.name.clone(),
                        role: object.components[component].role.to_string(),
                        first: boxes[i].0.min(boxes[j].0),
                        second: boxes[i].0.max(boxes[j].0),
                    });
                }
            }
        }
    }
    Ok(())
}

/// The regions of `requests` of `model`, planned and refused whole here, off the async runtime
/// (a hostile request's overlap check is quadratic in its regions), each admitted as its own
/// route would admit it before its first byte.
pub(super) async fn planned(
    representations: &Representations,
    model: &Arc<Model>,
    manifest: &Arc<Manifest>,
    requests: Vec<RegionRequest>,
    limits: RegionLimits,
) -> Result<Vec<Planned>, ServiceError> {
    let (planning_model, planning_manifest) = (Arc::clone(model), Arc::clone(manifest));
    let planned = tokio::task::spawn_blocking(move || plan(&planning_model, &planning_manifest, &requests, limits))
        .await
        .map_err(|e| ServiceError::Internal(e.to_string()))??;
    for region in &planned {
        let object = &manifest.objects[region.object];
        representations.admit(model, manifest, object, &object.components[region.component]).await?;
    }
    Ok(planned)
}

/// The body of `requests` of `model`: planned and refused whole ([`planned`]); then each
/// region opened as the body reaches it and sent as its own route would send it, followed by
/// its CRC32C.
pub(super) async fn regions(
    representations: Arc<Representations>,
    model: &Arc<Model>,
    manifest: &Arc<Manifest>,
    requests: Vec<RegionRequest>,
    limits: RegionLimits,
) -> Result<RegionsBody, ServiceError> {
    let planned = planned(&representations, model, manifest, requests, limits).await?;
    let len = planned.iter().map(|r| r.len + CHECKSUM_BYTES).sum();
    let count = planned.len();
    let (model, manifest) = (Arc::clone(model), Arc::clone(manifest));
    let body = stream::iter(planned)
        .map(move |region| {
            region_bytes(Arc::clone(&representations), Arc::clone(&model), Arc::clone(&manifest), region)
        })
        .buffered(REGIONS_AHEAD)
        .try_flatten()
        .boxed();
    Ok(RegionsBody { len, count, body })
}

/// The bytes of `region` as its own route serves them (behind its digest guard), gathered into
/// one buffer of exactly the region's length.
pub(super) async fn region_buffer(
    representations: &Representations,
    model: &Arc<Model>,
    manifest: &Manifest,
    region: &Planned,
) -> Result<Vec<u8>, ServiceError> {
    let object = &manifest.objects[region.object];
    let component = &object.components[region.component];
    let cut = region.slice.as_ref().map_or(Cut::Whole, Cut::Slice);
    let request = ComponentRequest { cut, head: false, accepts_zstd: false };
    let bytes = representations.component_bytes(model, manifest, object, component, request).await?;
    let body = bytes.source.open(0..region.len);
    let mut body = match bytes.guard {
        Some(guard) => guarded(body, guard),
        None => body,
    };
    let len = usize::try_from(region.len).map_err(|e| ServiceError::Internal(e.to_string()))?;
    let mut buffer = Vec::with_capacity(len);
    while let Some(piece) = body.next().await {
        buffer.extend_from_slice(&piece?);
    }
    if buffer.len() != len {
        return Err(ServiceError::Internal(format!("a region of {len} bytes read as {}", buffer.len())));
    }
    Ok(buffer)
}

/// One region's bytes, as its own route serves them, then their CRC32C. Bytes of a local file
/// that leave from its mapping, which the process never reads (the kernel copies them), are
/// checksummed from the same bytes read with `pread`, alongside; any other bytes (decoded,
/// fetched, gathered) as they pass.
async fn region_bytes(
    representations: Arc<Representations>,
    model: Arc<Model>,
    manifest: Arc<Manifest>,
    region: Planned,
) -> Result<ByteStream, ServiceError> {
    let object = &manifest.objects[region.object];
    let component = &object.components[region.component];
    let cut = region.slice.as_ref().map_or(Cut::Whole, Cut::Slice);
    let request = ComponentRequest { cut, head: false, accepts_zstd: false };
    let bytes = representations.component_bytes(&model, &manifest, object, component, request).await?;
    let body = bytes.source.open(0..region.len);
    let body = match bytes.guard {
        Some(guard) => guarded(body, guard),
        None => body,
    };
    let stored = component.stored_range();
    let ModelBytes::Mapped { file, .. } = model_bytes(&model, &manifest, component.file).await? else {
        return Ok(checksummed(body));
    };
    // Short runs are gathered into the process's memory: their bytes are checksummed there.
    if !component.is_verbatim() || region.slice.as_ref().is_some_and(|slice| !slice.sent_from_mapping()) {
        return Ok(checksummed(body));
    }
    let sums = representations.learnt.of(&model).block_sums(component.file, file.len());
    // A client gone before the trailer stops the read behind it, a piece at most later.
    let gone = Arc::new(AtomicBool::new(false));
    let (watching, left) = (Arc::clone(&gone), GoneOnDrop(gone));
    let crc = tokio::task::spawn_blocking(move || {
        let at = |run: Range<u64>| stored.start + run.start..stored.start + run.end;
        let live = move |_: &Range<u64>| !watching.load(Ordering::Relaxed);
        match &region.slice {
            Some(slice) => sums.crc32c_of_runs(&file, slice.runs().map(at).take_while(live)),
            None => {
                let pieces = (stored.start..stored.end).step_by(CRC_PIECE as usize);
                let pieces = pieces.map(|start| start..(start + CRC_PIECE).min(stored.end));
                sums.crc32c_of_runs(&file, pieces.take_while(live))
            }
        }
    });
    let trailer = async move {
        let _left = left;
        let crc = crc.await.map_err(|e| ServiceError::Internal(e.to_string()))?;
        let crc = crc.map_err(|e| storage_failed(&model.source, &model.id, e))?;
        Ok(Bytes::copy_from_slice(&crc.to_be_bytes()))
    };
    Ok(body.chain(stream::once(trailer)).boxed())
}

/// The most bytes of a whole region checksummed before the read looks again whether its client
/// is still there.
const CRC_PIECE: u64 = 8 << 20;

/// Sets its flag when dropped: with the trailer that owns it, when the region's stream goes.
struct GoneOnDrop(Arc<AtomicBool>);

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `pieces` followed by their CRC32C, big-endian; a failure ends the stream without it.
fn checksummed(pieces: ByteStream) -> ByteStream {
    stream::unfold(Some((pieces, 0u32)), |state| async move {
        let (mut pieces, crc) = state?;
        match pieces.next().await {
            Some(Ok(piece)) => match crc_append(crc, piece.clone()).await {
                Ok(crc) => Some((Ok(piece), Some((pieces, crc)))),
                Err(e) => Some((Err(e), None)),
            },
            Some(Err(e)) => Some((Err(e), None)),
            None => Some((Ok(Bytes::copy_from_slice(&crc.to_be_bytes())), None)),
        }
    })
    .boxed()
}

/// `crc` extended over `piece`, on the blocking pool when the piece is long.
async fn crc_append(crc: u32, piece: Bytes) -> Result<u32, ServiceError> {
    if piece.len() < CHECKSUM_OFF_RUNTIME {
        return Ok(crc32c::crc32c_append(crc, &piece));
    }
    tokio::task::spawn_blocking(move || crc32c::crc32c_append(crc, &piece))
        .await
        .map_err(|e| ServiceError::Internal(e.to_string()))
}
