//! The `ZTEN0001` (0.1) index: a CBOR array of per-tensor maps with long dtype names, an
//! optional `data_endianness`, `checksum` and `layout`. Each entry becomes an object with one
//! `data` component; `layout` becomes the format, and every field the model has no place for
//! (`sparse_format`, custom keys) is kept in the object's attributes, so nothing is lost.

use std::ops::Range;

use super::manifest::decoded_length;
use crate::cbor::Fields;
use crate::{
    ByteOrder, Component, Container, DType, Digest, DigestScope, Encoding, FormatError, Location, Manifest, Object,
    Result, Value,
};

/// Fields the model represents directly; all others go to the object's attributes.
const KNOWN_FIELDS: [&str; 9] =
    ["name", "offset", "size", "dtype", "shape", "encoding", "data_endianness", "checksum", "layout"];

pub(super) fn parse(root: Value, span: Range<u64>, file_len: u64) -> Result<Manifest> {
    let Value::Array(entries) = &root else {
        return Err(FormatError::WrongShape { context: "index".into(), expected: "an array of tensor maps" });
    };
    let objects = entries.iter().enumerate().map(|(i, entry)| object(i, entry)).collect::<Result<Vec<_>>>()?;
    Manifest::new(Container::Legacy01, None, None, objects, span, file_len)
}

fn object(index: usize, entry: &Value) -> Result<Object> {
    let fields = Fields::of(entry, format!("index[{index}]"))?;
    let name = fields.required_text("name")?;
    let fields = Fields::of(entry, format!("index[{index}] (tensor {name:?})"))?;
    let at = Location::component(name, "data");
    let dtype_name = fields.required_text("dtype")?;
    let dtype = DType::from_legacy_name(dtype_name)
        .ok_or_else(|| FormatError::UnknownDtype { at: at.clone(), dtype: dtype_name.to_owned() })?;
    let shape = fields.uint_array("shape")?;
    let offset = fields.required_uint("offset")?;
    let stored_length = fields.required_uint("size")?;
    let encoding = match fields.required_text("encoding")? {
        "raw" => Encoding::Raw,
        "zstd" => Encoding::Zstd,
        other => return Err(FormatError::UnknownEncoding { at, encoding: other.to_owned() }),
    };
    let byte_order = match fields.text("data_endianness")? {
        None | Some("little") => ByteOrder::Little,
        Some("big") => ByteOrder::Big,
        Some(other) => return Err(FormatError::UnknownEndianness { at, value: other.to_owned() }),
    };
    let digest = match fields.text("checksum")? {
        None => None,
        Some(text) => Some(Digest::parse(text).ok_or_else(|| FormatError::BadDigest {
            at: at.clone(),
            digest: text.to_owned(),
            expected: "\"crc32c:0x<8 hex>\" or \"sha256:<64 hex>\"",
        })?),
    };
    let format = fields.text("layout")?.unwrap_or("dense").to_owned();
    let extra: Vec<(Value, Value)> = fields
        .entries()
        .filter(|(k, _)| !KNOWN_FIELDS.contains(k))
        .map(|(k, v)| (Value::Text(k.to_owned()), v.clone()))
        .collect();
    let attributes = (!extra.is_empty()).then_some(Value::Map(extra));
    let mut object = Object { name: name.to_owned(), shape, format, attributes, components: Vec::new() };
    let mut component = Component {
        role: "data".to_owned(),
        dtype,
        logical_type: None,
        offset,
        stored_length,
        encoding,
        decoded_length: 0,
        digest,
        digest_scope: DigestScope::Stored,
        byte_order,
        file: 0,
    };
    component.decoded_length = decoded_length(&object, object.element_count(), &component, None, &at)?;
    object.components.push(component);
    Ok(object)
}
