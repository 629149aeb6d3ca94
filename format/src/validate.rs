//! The rules a parsed manifest must satisfy before any byte of it is trusted: structural checks
//! that need only the manifest (alignment, bounds, overlap, sizes, overflow, required
//! components), and content checks that need a component's decoded bytes (bool values, sparse
//! index structure), which `verify` and the server run before calling a component valid.

use super::{
    ALIGNMENT, Component, DType, Encoding, FormatError, HEADER_LEN, Limits, Location, Manifest, Object, Result,
    known_logical_type,
};

/// Components each well-known format requires; custom formats require nothing.
pub fn required_roles(format: &str) -> &'static [&'static str] {
    match format {
        "dense" => &["data"],
        "sparse_csr" => &["values", "indices", "indptr"],
        "sparse_coo" => &["values", "coords"],
        "quantized_group" => &["packed_weight", "scales", "zeros"],
        _ => &[],
    }
}

/// Roles that hold sparse indices, which must be `u64`.
pub fn is_sparse_index(format: &str, role: &str) -> bool {
    matches!((format, role), ("sparse_csr", "indices" | "indptr") | ("sparse_coo", "coords"))
}

/// Every structural rule, over the whole manifest.
pub fn check_structure(manifest: &Manifest, limits: &Limits) -> Result<()> {
    let data_end = manifest.manifest_span.start;
    let mut ranges: Vec<(u64, u64, usize, usize)> = Vec::new();
    for (oi, object) in manifest.objects.iter().enumerate() {
        let elements = object.element_count();
        if elements.is_none() {
            return Err(FormatError::ShapeOverflow { at: Location::object(&object.name), shape: object.shape.clone() });
        }
        check_roles(&object.name, &object.format, object.components.iter().map(|c| c.role.as_str()))?;
        for (ci, component) in object.components.iter().enumerate() {
            let at = Location::component(&object.name, &component.role);
            check_component(object, elements, component, &at, data_end, limits)?;
            if component.stored_length > 0 {
                ranges.push((component.offset, component.offset + component.stored_length, oi, ci));
            }
        }
    }
    check_overlaps(manifest, &mut ranges)
}

fn check_component(
    object: &Object,
    elements: Option<u64>,
    component: &Component,
    at: &Location,
    data_end: u64,
    limits: &Limits,
) -> Result<()> {
    if component.offset % ALIGNMENT != 0 {
        return Err(FormatError::Misaligned { at: at.clone(), offset: component.offset, alignment: ALIGNMENT });
    }
    let end = component.offset.checked_add(component.stored_length).ok_or(FormatError::RangeOverflow {
        at: at.clone(),
        offset: component.offset,
        length: component.stored_length,
    })?;
    if component.stored_length > 0 && component.offset < HEADER_LEN {
        return Err(FormatError::RangeIntoHeader { at: at.clone(), start: component.offset, end, header: HEADER_LEN });
    }
    if end > data_end {
        return Err(FormatError::RangeIntoManifest { at: at.clone(), start: component.offset, end, data_end });
    }
    if component.decoded_length > limits.max_decoded_bytes {
        return Err(FormatError::DecodedTooLarge {
            at: at.clone(),
            size: component.decoded_length,
            limit: limits.max_decoded_bytes,
        });
    }
    let meaning = ComponentMeaning {
        role: &component.role,
        dtype: component.dtype,
        logical_type: component.logical_type.as_deref(),
        encoding: &component.encoding,
        decoded_length: component.decoded_length,
    };
    check_meaning(object, elements, &meaning, at)
}

/// What the rules on a component's meaning need to know of it, whether it was read from a
/// manifest or is about to be written.
pub struct ComponentMeaning<'a> {
    pub role: &'a str,
    pub dtype: DType,
    pub logical_type: Option<&'a str>,
    pub encoding: &'a Encoding,
    pub decoded_length: u64,
}

/// The rules on a component's meaning, shared by the readers and the writer (which so never
/// writes a file the readers refuse): a known logical type has its dtype, sparse indices are
/// `u64`, the decoded bytes are whole elements, and a dense `data` component fills the shape.
pub fn check_meaning(object: &Object, elements: Option<u64>, c: &ComponentMeaning<'_>, at: &Location) -> Result<()> {
    let ratio = match c.logical_type.and_then(known_logical_type) {
        Some((expected, _)) if expected != c.dtype => {
            return Err(FormatError::LogicalTypeMismatch {
                at: at.clone(),
                logical_type: c.logical_type.unwrap_or_default().to_owned(),
                expected: expected.name(),
                found: c.dtype.name(),
            });
        }
        Some((_, ratio)) => ratio,
        None => 1,
    };
    if is_sparse_index(&object.format, c.role) && c.dtype != DType::U64 {
        return Err(FormatError::SparseIndexDtype { at: at.clone(), found: c.dtype.name() });
    }
    let unit = c.dtype.width() * ratio;
    if c.decoded_length % unit != 0 {
        return Err(FormatError::LengthNotMultiple { at: at.clone(), length: c.decoded_length, width: unit });
    }
    if object.format == "dense" && c.role == "data" {
        let expected = elements
            .and_then(|n| n.checked_mul(unit))
            .ok_or_else(|| FormatError::ShapeOverflow { at: at.clone(), shape: object.shape.clone() })?;
        if c.decoded_length != expected {
            let what = if *c.encoding == Encoding::Raw { "raw length" } else { "uncompressed_length" };
            return Err(FormatError::LengthMismatch { at: at.clone(), what, expected, actual: c.decoded_length });
        }
    }
    Ok(())
}

/// Every component the object's format requires is among `roles`.
pub fn check_roles<'r>(object: &str, format: &str, roles: impl Iterator<Item = &'r str> + Clone) -> Result<()> {
    for &role in required_roles(format) {
        if !roles.clone().any(|r| r == role) {
            return Err(FormatError::MissingComponent {
                at: Location::object(object),
                format: format.to_owned(),
                role,
            });
        }
    }
    Ok(())
}

/// Blobs may not partially overlap. Zero-length blobs are excluded by the caller (writers give
/// them the next blob's offset) and identical ranges are allowed (shared storage).
fn check_overlaps(manifest: &Manifest, ranges: &mut [(u64, u64, usize, usize)]) -> Result<()> {
    ranges.sort_unstable();
    let mut reach: Option<(u64, u64, usize, usize)> = None;
    for &range in ranges.iter() {
        let (start, end, ..) = range;
        if let Some(prev) = reach {
            if start < prev.1 && (start, end) != (prev.0, prev.1) {
                let loc = |(_, _, oi, ci): (u64, u64, usize, usize)| {
                    let object = &manifest.objects[oi];
                    Location::component(&object.name, &object.components[ci].role)
                };
                return Err(FormatError::Overlap {
                    first: loc(prev),
                    first_start: prev.0,
                    first_end: prev.1,
                    second: loc(range),
                    second_start: start,
                    second_end: end,
                });
            }
            if end > prev.1 {
                reach = Some(range);
            }
        } else {
            reach = Some(range);
        }
    }
    Ok(())
}

/// Content checks of one object, given a way to obtain each component's decoded,
/// little-endian bytes. Bool components must hold only 0 and 1; sparse index structures must
/// be consistent with the shape and the number of values.
pub fn check_content<'a, F>(object: &Object, mut decoded: F) -> Result<()>
where
    F: FnMut(&Component) -> Result<std::borrow::Cow<'a, [u8]>>,
{
    for component in &object.components {
        if component.dtype == DType::Bool {
            let bytes = decoded(component)?;
            if let Some(index) = bytes.iter().position(|&b| b > 1) {
                return Err(FormatError::BoolByte {
                    at: Location::component(&object.name, &component.role),
                    index: index as u64,
                    value: bytes[index],
                });
            }
        }
    }
    match object.format.as_str() {
        "sparse_csr" => check_csr(object, &mut decoded),
        "sparse_coo" => check_coo(object, &mut decoded),
        _ => crate::v2::check_content(object, &mut decoded),
    }
}

/// Whether an object has content rules beyond its manifest, which [`check_content`] checks.
pub fn has_content_rules(object: &Object) -> bool {
    matches!(object.format.as_str(), "sparse_csr" | "sparse_coo" | "zt.sparse_csr/1" | "zt.sparse_coo/1")
        || object
            .components
            .iter()
            .any(|c| c.dtype == DType::Bool || matches!(c.logical_type.as_deref(), Some("bool" | "f4_e2m1")))
}

fn sparse_error(object: &Object, role: &str, detail: String) -> FormatError {
    FormatError::SparseStructure { at: Location::component(&object.name, role), detail }
}

fn nnz(object: &Object) -> u64 {
    let values = object.component("values").expect("structure check requires values");
    values.decoded_length / (values.dtype.width() * values.logical_ratio())
}

fn u64s(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
}

fn check_csr<'a, F>(object: &Object, decoded: &mut F) -> Result<()>
where
    F: FnMut(&Component) -> Result<std::borrow::Cow<'a, [u8]>>,
{
    let [rows, cols] = object.shape[..] else {
        return Err(sparse_error(object, "indptr", format!("sparse_csr needs a 2-d shape, found {:?}", object.shape)));
    };
    let nnz = nnz(object);
    let indptr = object.component("indptr").expect("structure check requires indptr");
    let indices = object.component("indices").expect("structure check requires indices");
    let indptr_count = indptr.decoded_length / 8;
    if Some(indptr_count) != rows.checked_add(1) {
        return Err(sparse_error(
            object,
            "indptr",
            format!("holds {indptr_count} entries, expected rows + 1 = {}", rows as u128 + 1),
        ));
    }
    if indices.decoded_length / 8 != nnz {
        return Err(sparse_error(
            object,
            "indices",
            format!("holds {} entries, expected nnz = {nnz}", indices.decoded_length / 8),
        ));
    }
    let bytes = decoded(indptr)?;
    let mut previous = 0u64;
    for (i, p) in u64s(&bytes).enumerate() {
        if i == 0 && p != 0 {
            return Err(sparse_error(object, "indptr", format!("starts at {p}, expected 0")));
        }
        if p < previous {
            return Err(sparse_error(object, "indptr", format!("decreases at entry {i} ({previous} then {p})")));
        }
        previous = p;
    }
    if previous != nnz {
        return Err(sparse_error(object, "indptr", format!("ends at {previous}, expected nnz = {nnz}")));
    }
    let bytes = decoded(indices)?;
    if let Some((i, c)) = u64s(&bytes).enumerate().find(|&(_, c)| c >= cols) {
        return Err(sparse_error(object, "indices", format!("entry {i} is column {c}, beyond {cols} columns")));
    }
    Ok(())
}

fn check_coo<'a, F>(object: &Object, decoded: &mut F) -> Result<()>
where
    F: FnMut(&Component) -> Result<std::borrow::Cow<'a, [u8]>>,
{
    let nnz = nnz(object);
    let coords = object.component("coords").expect("structure check requires coords");
    let ndim = object.shape.len() as u64;
    let count = coords.decoded_length / 8;
    if Some(count) != ndim.checked_mul(nnz) {
        return Err(sparse_error(
            object,
            "coords",
            format!("holds {count} entries, expected ndim × nnz = {ndim} × {nnz}"),
        ));
    }
    let bytes = decoded(coords)?;
    for (i, c) in u64s(&bytes).enumerate() {
        let dim = (i as u64 / nnz.max(1)) as usize;
        if c >= object.shape[dim] {
            return Err(sparse_error(
                object,
                "coords",
                format!(
                    "entry {} of dimension {dim} is {c}, beyond its size {}",
                    i as u64 % nnz.max(1),
                    object.shape[dim]
                ),
            ));
        }
    }
    Ok(())
}
