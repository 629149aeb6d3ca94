//! The data rules of v2 objects, over their parts' decoded bytes: bool bytes, the padding
//! nibble of packed `f4_e2m1` parts, and the sparse layouts' index structure.

use std::collections::HashSet;

use super::layouts::part_of;
use crate::{Component, FormatError, Location, Object, Result};

/// The data rules of an object, over its parts' decoded bytes: `bool` bytes are 0 or 1, the
/// unused final nibble of a packed `f4_e2m1` dense part is zero, and the sparse layouts'
/// indices are consistent, in range and (COO) unique.
pub(crate) fn check_content<'a, F>(object: &Object, decoded: &mut F) -> Result<()>
where
    F: FnMut(&Component) -> Result<std::borrow::Cow<'a, [u8]>>,
{
    for component in &object.components {
        let at = || Location::component(&object.name, &component.role);
        match component.logical_type.as_deref() {
            Some("bool") => {
                let bytes = decoded(component)?;
                if let Some(index) = bytes.iter().position(|&b| b > 1) {
                    return Err(FormatError::BoolByte { at: at(), index: index as u64, value: bytes[index] });
                }
            }
            Some("f4_e2m1") if object.format == "dense" => {
                let elements = object.element_count().unwrap_or(0);
                if elements % 2 == 1 {
                    let bytes = decoded(component)?;
                    if bytes.last().is_some_and(|last| last >> 4 != 0) {
                        return Err(FormatError::PackedPadding { at: at() });
                    }
                }
            }
            _ => {}
        }
    }
    match object.format.as_str() {
        "zt.sparse_csr/1" => check_csr(object, decoded),
        "zt.sparse_coo/1" => check_coo(object, decoded),
        _ => Ok(()),
    }
}

fn sparse_error(object: &Object, role: &str, detail: String) -> FormatError {
    FormatError::SparseStructure { at: Location::component(&object.name, role), detail }
}

/// Little-endian unsigned integers of `width` bytes (4 or 8).
fn indices(bytes: &[u8], width: u64) -> impl Iterator<Item = u64> + '_ {
    bytes.chunks_exact(width as usize).map(|c| match c.len() {
        4 => u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes"))),
        _ => u64::from_le_bytes(c.try_into().expect("8 bytes")),
    })
}

fn check_csr<'a, F>(object: &Object, decoded: &mut F) -> Result<()>
where
    F: FnMut(&Component) -> Result<std::borrow::Cow<'a, [u8]>>,
{
    let cols = object.shape[1];
    let (indptr_part, indices_part) = (part_of(object, "indptr"), part_of(object, "indices"));
    let width = indices_part.dtype.width();
    let nnz = indices_part.decoded_length / width;
    let pointers: Vec<u64> = indices(&decoded(indptr_part)?, width).collect();
    if pointers.first().is_some_and(|&p| p != 0) {
        return Err(sparse_error(object, "indptr", format!("starts at {}, expected 0", pointers[0])));
    }
    if let Some(i) = pointers.windows(2).position(|w| w[1] < w[0]) {
        return Err(sparse_error(object, "indptr", format!("decreases at entry {}", i + 1)));
    }
    if pointers.last().is_some_and(|&p| p != nnz) {
        return Err(sparse_error(
            object,
            "indptr",
            format!("ends at {}, expected nnz = {nnz}", pointers[pointers.len() - 1]),
        ));
    }
    let columns: Vec<u64> = indices(&decoded(indices_part)?, width).collect();
    for (row, bounds) in pointers.windows(2).enumerate() {
        let row_columns = &columns[bounds[0] as usize..bounds[1] as usize];
        if let Some(&c) = row_columns.iter().find(|&&c| c >= cols) {
            return Err(sparse_error(object, "indices", format!("row {row} names column {c}, beyond {cols} columns")));
        }
        if row_columns.windows(2).any(|w| w[1] <= w[0]) {
            return Err(sparse_error(object, "indices", format!("row {row}'s columns are not strictly increasing")));
        }
    }
    Ok(())
}

fn check_coo<'a, F>(object: &Object, decoded: &mut F) -> Result<()>
where
    F: FnMut(&Component) -> Result<std::borrow::Cow<'a, [u8]>>,
{
    let coords_part = part_of(object, "coords");
    let width = coords_part.dtype.width();
    let ndim = object.shape.len();
    let nnz = (coords_part.decoded_length / width) as usize / ndim;
    let coords: Vec<u64> = indices(&decoded(coords_part)?, width).collect();
    for (d, &size) in object.shape.iter().enumerate() {
        if let Some(i) = coords[d * nnz..(d + 1) * nnz].iter().position(|&c| c >= size) {
            return Err(sparse_error(
                object,
                "coords",
                format!("element {i} has coordinate {} in dimension {d}, beyond its size {size}", coords[d * nnz + i]),
            ));
        }
    }
    let mut seen = HashSet::with_capacity(nnz);
    for i in 0..nnz {
        let cell: Vec<u64> = (0..ndim).map(|d| coords[d * nnz + i]).collect();
        if !seen.insert(cell) {
            return Err(sparse_error(object, "coords", format!("element {i} names a cell an earlier element names")));
        }
    }
    Ok(())
}
