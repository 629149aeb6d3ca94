//! GGUF tensor infos: read from the header (names, ranks, types, offsets), then placed in the
//! file (whole blocks, aligned, in bounds, not overlapping) and made objects.

use std::ops::Range;

use super::cursor::{Cursor, Parsed, gguf_error};
use super::limits::{MAX_DIMS, MAX_TENSOR_NAME};
use super::types::{GgmlType, ggml_type, removed_type};
use crate::{Component, DType, Object, Result, Value};

/// One tensor info.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Row-major, outermost first (the reverse of GGUF's `ne`).
    pub shape: Vec<u64>,
    pub ggml_type: GgmlType,
    /// The data's range in the file (absolute).
    pub range: Range<u64>,
}

impl TensorInfo {
    pub(super) fn into_object(self, file: usize) -> Object {
        let t = self.ggml_type;
        let (dtype, logical_type, format) = match t.dense {
            Some(dtype) => (dtype, None, "dense".to_owned()),
            None => (DType::U8, Some(t.logical_type()), t.layout()),
        };
        let mut attributes = vec![(Value::Text("ggml_type".into()), Value::Text(t.name.into()))];
        if t.dense.is_none() {
            attributes.push((Value::Text("block_elements".into()), Value::Integer(t.block_elements.into())));
            attributes.push((Value::Text("block_bytes".into()), Value::Integer(t.block_bytes.into())));
        }
        let data = Component::stored_as_is("data", dtype, logical_type, self.range, file);
        Object {
            name: self.name,
            shape: self.shape,
            format,
            attributes: Some(Value::Map(attributes)),
            components: vec![data],
        }
    }
}

/// A tensor info as read, before it is placed: where it was read, its name, `ne`, type and
/// offset in the data.
pub(super) type RawInfo = (u64, String, Vec<u64>, GgmlType, u64);

/// The `tensor_count` tensor infos: names distinct, ranks within ggml's, types known.
pub(super) fn read_tensor_infos(c: &mut Cursor<'_>, tensor_count: u64) -> Parsed<Vec<RawInfo>> {
    let mut infos = Vec::with_capacity(tensor_count as usize);
    let mut names = std::collections::HashSet::with_capacity(tensor_count as usize);
    for _ in 0..tensor_count {
        let at = c.at;
        let name = c.string("a tensor name", MAX_TENSOR_NAME)?;
        if !names.insert(name.clone()) {
            return Err(gguf_error("gguf_duplicate_tensor", at, format!("tensor {name:?} appears twice")).into());
        }
        let n_dims = c.u32(&name)?;
        if n_dims as usize > MAX_DIMS {
            let detail = format!("tensor {name:?} has {n_dims} dimensions, over ggml's {MAX_DIMS}");
            return Err(gguf_error("gguf_rank", at, detail).into());
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(c.u64(&name)?);
        }
        let type_at = c.at;
        let type_id = c.u32(&name)?;
        let ggml = ggml_type(type_id).ok_or_else(|| match removed_type(type_id) {
            Some(old) => gguf_error(
                "gguf_tensor_type",
                type_at,
                format!("tensor {name:?} has type {type_id} ({old}), whose support ggml removed from GGUF files"),
            ),
            None => gguf_error("gguf_tensor_type", type_at, format!("tensor {name:?} has unknown GGML type {type_id}")),
        })?;
        let offset = c.u64(&name)?;
        infos.push((at, name, ne, ggml, offset));
    }
    Ok(infos)
}

/// Each tensor placed in the file: shape in whole blocks, offset aligned, data inside the file
/// and overlapping no other tensor's; sorted by where it lies. Whether any is quantized.
pub(super) fn place_tensors(
    infos: Vec<RawInfo>,
    alignment: u64,
    data_start: u64,
    file_len: u64,
) -> Result<(Vec<TensorInfo>, bool)> {
    let mut tensors = Vec::with_capacity(infos.len());
    let mut quantized = false;
    for (at, name, ne, ggml, offset) in infos {
        let elements = ne.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).filter(|&n| n <= i64::MAX as u64);
        let Some(elements) = elements else {
            return Err(gguf_error("gguf_shape", at, format!("tensor {name:?}: its dimensions {ne:?} overflow")));
        };
        if ne.first().is_some_and(|&inner| inner % ggml.block_elements != 0) {
            let detail = format!(
                "tensor {name:?}: its innermost dimension {} is not a whole number of {}-element {} blocks",
                ne[0], ggml.block_elements, ggml.name
            );
            return Err(gguf_error("gguf_block", at, detail));
        }
        let length = ggml.bytes_of(elements).ok_or_else(|| {
            gguf_error(
                "gguf_block",
                at,
                format!("tensor {name:?}: {elements} elements are not whole {} blocks", ggml.name),
            )
        })?;
        if offset % alignment != 0 {
            let detail = format!("tensor {name:?}: its offset {offset} is not a multiple of the alignment {alignment}");
            return Err(gguf_error("gguf_misaligned", at, detail));
        }
        let start = data_start.checked_add(offset);
        let end = start.and_then(|s| s.checked_add(length));
        let (Some(start), Some(end)) = (start, end) else {
            return Err(gguf_error(
                "gguf_out_of_bounds",
                at,
                format!("tensor {name:?}: its offset {offset} overflows"),
            ));
        };
        if end > file_len {
            let detail =
                format!("tensor {name:?}: its data [{start}, {end}) runs past the end of the {file_len}-byte file");
            return Err(gguf_error("gguf_out_of_bounds", at, detail));
        }
        quantized |= ggml.dense.is_none();
        let shape = ne.iter().rev().copied().collect();
        tensors.push(TensorInfo { name, shape, ggml_type: ggml, range: start..end });
    }
    tensors.sort_by_key(|t| (t.range.start, t.range.end));
    for pair in tensors.windows(2) {
        if pair[1].range.start < pair[0].range.end {
            let detail = format!(
                "tensors {:?} [{}, {}) and {:?} [{}, {}) overlap",
                pair[0].name,
                pair[0].range.start,
                pair[0].range.end,
                pair[1].name,
                pair[1].range.start,
                pair[1].range.end
            );
            return Err(gguf_error("gguf_overlap", pair[1].range.start, detail));
        }
    }
    Ok((tensors, quantized))
}
