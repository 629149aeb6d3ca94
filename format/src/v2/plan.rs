//! Writing v2 manifests: deterministic CBOR, and the [`plan`] of a single-file model whose
//! parts' stored bytes are copied in as they are.

use std::collections::BTreeMap;

use super::container::{BLOB_ALIGNMENT, footer};
use crate::model::Plan;
use crate::{Encoding, Object, Value};

/// `value` in deterministic CBOR, as a v2 manifest must be (map keys sorted at every level,
/// shortest heads, narrowest exact floats). `value` must hold no tags.
pub fn deterministic_cbor(value: &Value) -> Vec<u8> {
    crate::cbor::encode_deterministic(value)
}

/// Lays out a single-file v2 model whose parts' stored bytes are copied in as they are (the
/// parts of `objects`, from any v2 model: its shards merged, seekable streams kept, digests
/// unchanged since they cover decoded bytes): the magic, each blob at the next multiple of
/// `alignment` (a power of two, at least 4096) in object and part order, identical source
/// blobs (same file, offset and length: tied weights) sharing one, then the manifest at an
/// aligned offset and the footer. A file created at `tail_offset + tail.len()` bytes is
/// zero-filled, so writing the magic, every blob at its offset and the tail completes it.
pub fn plan(objects: &[&Object], attributes: Option<&Value>, alignment: u64) -> Plan {
    debug_assert!(alignment.is_power_of_two() && alignment >= BLOB_ALIGNMENT);
    let text = |s: &str| Value::Text(s.to_owned());
    let uint = |n: u64| Value::Integer(n.into());
    let mut position = alignment;
    let mut placed: BTreeMap<(usize, u64, u64), u64> = BTreeMap::new();
    let mut offsets = Vec::with_capacity(objects.len());
    let mut entries = Vec::with_capacity(objects.len());
    for object in objects {
        let mut object_offsets = Vec::with_capacity(object.components.len());
        let mut parts = Vec::with_capacity(object.components.len());
        for c in &object.components {
            let source = (c.file, c.offset, c.stored_length);
            let offset = match placed.get(&source) {
                Some(&offset) if c.stored_length > 0 => offset,
                _ => {
                    let offset = position.next_multiple_of(alignment);
                    position = offset + c.stored_length;
                    placed.insert(source, offset);
                    offset
                }
            };
            object_offsets.push(offset);
            let mut fields = vec![(text("dtype"), text(c.dtype.name()))];
            if let Some(logical) = crate::gguf::declared_logical_type(object, c) {
                fields.push((text("type"), text(logical)));
            }
            fields.push((text("blob"), Value::Array(vec![uint(offset), uint(c.stored_length)])));
            if c.encoding != Encoding::Raw {
                fields.push((text("encoding"), text(c.encoding.name())));
                fields.push((text("decoded_length"), uint(c.decoded_length)));
            }
            if let Some(digest) = &c.digest {
                fields.push((text("digest"), text(&digest.to_string())));
            }
            parts.push((text(&c.role), Value::Map(fields)));
        }
        let mut fields = vec![
            (text("shape"), Value::Array(object.shape.iter().map(|&d| uint(d)).collect())),
            (text("layout"), text(&object.format)),
            (text("parts"), Value::Map(parts)),
        ];
        if let Some(attributes) = &object.attributes {
            fields.push((text("attributes"), attributes.clone()));
        }
        offsets.push(object_offsets);
        entries.push((text(&object.name), Value::Map(fields)));
    }
    let mut root = vec![(text("objects"), Value::Map(entries))];
    if let Some(attributes) = attributes {
        root.push((text("attributes"), attributes.clone()));
    }
    let manifest = deterministic_cbor(&Value::Map(root));
    let tail_offset = position.next_multiple_of(BLOB_ALIGNMENT);
    let mut tail = manifest.clone();
    tail.extend_from_slice(&footer(tail_offset, &manifest));
    Plan { offsets, tail_offset, tail }
}
