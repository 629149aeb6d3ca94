//! A sharded checkpoint: its `*.safetensors.index.json` parsed, and one model assembled of it
//! and its shards' headers, every tensor held to the shard the index names.

use std::fmt;

use serde::de::{self, MapAccess, Visitor};

use super::entries::Entries;
use super::header::{MAX_HEADER_LEN, parse_file};
use crate::{Container, FormatError, Manifest, Result, Value};

/// The largest index file read: an index maps names to files, so the header's bound is ample.
pub const MAX_INDEX_LEN: u64 = MAX_HEADER_LEN;

/// A sharded checkpoint's index (`model.safetensors.index.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct Index {
    /// `metadata`, in file order (`total_size` and the like; any JSON values).
    pub metadata: Vec<(String, serde_json::Value)>,
    /// Tensor name → the shard file holding it, in file order.
    pub weight_map: Vec<(String, String)>,
    /// The shard files named, each once, sorted (`model-00001-of-00003.safetensors`, …).
    pub shards: Vec<String>,
}

/// Parses an index file: a JSON object with a `weight_map` of tensor names to shard file names
/// (plain names in the index's directory) and an optional `metadata` object.
pub fn parse_index(bytes: &[u8]) -> Result<Index> {
    let invalid = |detail: String| FormatError::SafetensorsIndex { detail };
    if bytes.len() as u64 > MAX_INDEX_LEN {
        return Err(FormatError::ManifestTooLarge { size: bytes.len() as u64, limit: MAX_INDEX_LEN });
    }
    let text = std::str::from_utf8(bytes).map_err(|e| invalid(format!("not UTF-8: {e}")))?;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let read = de::Deserializer::deserialize_map(&mut deserializer, IndexVisitor)
        .and_then(|read| deserializer.end().map(|()| read))
        .map_err(|e| invalid(format!("not a JSON object with a weight_map: {e}")))?;
    let metadata = match read.metadata {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Object(map)) => map.into_iter().collect(),
        Some(other) => return Err(invalid(format!("metadata is {other}, not an object"))),
    };
    let pairs = read.weight_map.ok_or_else(|| invalid("it has no weight_map".into()))?;
    let mut seen = std::collections::HashSet::with_capacity(pairs.len());
    let mut mapped = Vec::with_capacity(pairs.len());
    for (tensor, shard) in pairs {
        let serde_json::Value::String(shard) = shard else {
            return Err(invalid(format!("weight_map maps {tensor:?} to {shard}, not a file name")));
        };
        if !is_plain_file_name(&shard) {
            return Err(invalid(format!("weight_map maps {tensor:?} to {shard:?}, not a file name in its directory")));
        }
        if crate::FileKind::of(&shard) != Some(crate::FileKind::Safetensors) {
            return Err(invalid(format!("weight_map maps {tensor:?} to {shard:?}, not a .safetensors file")));
        }
        if !seen.insert(tensor.clone()) {
            return Err(FormatError::DuplicateObject { name: tensor });
        }
        mapped.push((tensor, shard));
    }
    let mut shards: Vec<String> = mapped.iter().map(|(_, shard)| shard.clone()).collect();
    shards.sort();
    shards.dedup();
    Ok(Index { metadata, weight_map: mapped, shards })
}

/// A name that stays in its directory: no separator, not `.` or `..`, no NUL, not empty.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// One model of a sharded checkpoint: the index (`index_len` bytes, the model's file 0) and
/// each shard's parsed file, named as the index names them, in [`Index::shards`] order (file
/// `i + 1`). Every tensor must be in the shard the index maps it to and in no other; the
/// model's attributes are the index's `metadata`, then the shards' `__metadata__` keys it lacks.
pub fn assemble(index: &Index, index_len: u64, shards: &[(&str, &Manifest)]) -> Result<Manifest> {
    let mut home: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    for (name, manifest) in shards {
        for object in &manifest.objects {
            if let Some(first) = home.insert(&object.name, name) {
                let claimed = index.weight_map.iter().find(|(t, _)| *t == object.name).map(|(_, s)| s.as_str());
                let (shard, found_in) = match claimed {
                    Some(shard) if shard == first => (shard, *name),
                    Some(shard) => (shard, first),
                    None => {
                        return Err(FormatError::TensorNotIndexed {
                            tensor: object.name.clone(),
                            shard: name.to_string(),
                        });
                    }
                };
                return Err(FormatError::TensorInWrongShard {
                    tensor: object.name.clone(),
                    shard: shard.to_owned(),
                    found_in: found_in.to_owned(),
                });
            }
        }
    }
    let mut claimed = std::collections::HashSet::with_capacity(index.weight_map.len());
    for (tensor, shard) in &index.weight_map {
        match home.get(tensor.as_str()) {
            None => return Err(FormatError::TensorNotInShard { tensor: tensor.clone(), shard: shard.clone() }),
            Some(found_in) if found_in != shard => {
                return Err(FormatError::TensorInWrongShard {
                    tensor: tensor.clone(),
                    shard: shard.clone(),
                    found_in: found_in.to_string(),
                });
            }
            Some(_) => claimed.insert(tensor.as_str()),
        };
    }
    let mut objects = Vec::with_capacity(index.weight_map.len());
    let mut attributes: Vec<(Value, Value)> =
        index.metadata.iter().map(|(k, v)| (Value::Text(k.clone()), json_to_cbor(v))).collect();
    for (position, (name, manifest)) in shards.iter().enumerate() {
        for object in &manifest.objects {
            if !claimed.contains(object.name.as_str()) {
                return Err(FormatError::TensorNotIndexed { tensor: object.name.clone(), shard: name.to_string() });
            }
            let mut object = object.clone();
            object.components.iter_mut().for_each(|c| c.file = position + 1);
            objects.push(object);
        }
        if let Some(Value::Map(entries)) = &manifest.attributes {
            for (key, value) in entries {
                if !attributes.iter().any(|(k, _)| k == key) {
                    attributes.push((key.clone(), value.clone()));
                }
            }
        }
    }
    let attributes = (!attributes.is_empty()).then_some(Value::Map(attributes));
    Manifest::new(Container::Safetensors, None, attributes, objects, 0..index_len, index_len)
}

/// A checkpoint in memory: its parsed index (of `index_len` bytes), and each shard's bytes as
/// `shard` finds them by the name the index gives (or why it could not). Each shard's own
/// faults are named with it.
pub fn parse_checkpoint<'a>(
    parsed: &Index,
    index_len: u64,
    shard: impl Fn(&str) -> Result<&'a [u8]>,
) -> Result<(Manifest, Vec<&'a [u8]>)> {
    let mut files = Vec::with_capacity(parsed.shards.len());
    let mut manifests = Vec::with_capacity(parsed.shards.len());
    for name in &parsed.shards {
        let in_shard = |error| FormatError::InShard { shard: name.clone(), error: Box::new(error) };
        let bytes = shard(name)?;
        let manifest = parse_file(bytes).and_then(|h| h.into_manifest(bytes.len() as u64)).map_err(in_shard)?;
        files.push(bytes);
        manifests.push(manifest);
    }
    let named: Vec<(&str, &Manifest)> = parsed.shards.iter().map(String::as_str).zip(&manifests).collect();
    Ok((assemble(parsed, index_len, &named)?, files))
}

/// A JSON value as CBOR: integers stay integers, other numbers become floats.
fn json_to_cbor(value: &serde_json::Value) -> Value {
    use serde_json::Value as Json;
    match value {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Value::Integer(u.into()),
            (None, Some(i)) => Value::Integer(i.into()),
            _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::Text(s.clone()),
        Json::Array(items) => Value::Array(items.iter().map(json_to_cbor).collect()),
        Json::Object(map) => Value::Map(map.iter().map(|(k, v)| (Value::Text(k.clone()), json_to_cbor(v))).collect()),
    }
}

/// An index's two fields; each may appear once, other fields are passed over.
struct IndexVisitor;

#[derive(Default)]
struct IndexFields {
    metadata: Option<serde_json::Value>,
    weight_map: Option<Vec<(String, serde_json::Value)>>,
}

impl<'de> Visitor<'de> for IndexVisitor {
    type Value = IndexFields;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
        let mut fields = IndexFields::default();
        while let Some(key) = map.next_key::<String>()? {
            let repeated = match key.as_str() {
                "metadata" => fields.metadata.replace(map.next_value()?).is_some(),
                "weight_map" => fields.weight_map.replace(map.next_value_seed(Entries)?).is_some(),
                // Writers add fields of their own; only these two say what the checkpoint holds.
                _ => {
                    map.next_value::<de::IgnoredAny>()?;
                    false
                }
            };
            if repeated {
                return Err(de::Error::custom(format!("{key:?} appears twice")));
            }
        }
        Ok(fields)
    }
}
