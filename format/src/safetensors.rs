//! safetensors files (Hugging Face's format), read purely: an 8-byte little-endian header
//! length, a JSON header of at most 100,000,000 bytes (the safetensors library's bound) mapping
//! each tensor name to its dtype, shape and `data_offsets`, an optional `__metadata__` of
//! strings, and the tensors' bytes tiling the rest of the file with no gap or overlap. Each
//! tensor becomes what a zTensor dense object's `data` component says: a storage dtype, a
//! logical type where safetensors has one zTensor names (bool, f8, f4, complex), and the byte
//! range. The rules are the safetensors library's (`Metadata::validate`), each failure named
//! with the tensor it is about; names must also be unique, which a JSON map does not promise.
//! A sharded checkpoint's `*.safetensors.index.json` (`metadata`, `weight_map`) is read here
//! too, and [`assemble`] makes one [`Manifest`] of it and its shards' headers, holding every
//! tensor to the shard the index names.

use std::fmt;
use std::ops::Range;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};

use crate::{Component, Container, DType, FormatError, Location, Manifest, Object, Result, Value};

/// Bytes of the header-length field that opens the file.
pub const LENGTH_FIELD: u64 = 8;

/// The largest header the safetensors library reads (`MAX_HEADER_SIZE`).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// How zTensor stores one safetensors dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapped {
    /// The safetensors name (`BF16`, `F8_E4M3`, …).
    pub name: &'static str,
    pub dtype: DType,
    /// The zTensor logical type, where the storage dtype alone does not say what the bytes are.
    pub logical_type: Option<&'static str>,
    /// Bits per element (sub-byte types pack several elements per byte).
    pub bits: u64,
}

/// Every dtype the safetensors library (0.8) defines. F6 types have no zTensor logical type
/// of their own: they are served as the bytes they are, labelled with their safetensors name.
pub const DTYPES: [Mapped; 22] = [
    Mapped { name: "BOOL", dtype: DType::U8, logical_type: Some("bool"), bits: 8 },
    Mapped { name: "U8", dtype: DType::U8, logical_type: None, bits: 8 },
    Mapped { name: "I8", dtype: DType::I8, logical_type: None, bits: 8 },
    Mapped { name: "U16", dtype: DType::U16, logical_type: None, bits: 16 },
    Mapped { name: "I16", dtype: DType::I16, logical_type: None, bits: 16 },
    Mapped { name: "U32", dtype: DType::U32, logical_type: None, bits: 32 },
    Mapped { name: "I32", dtype: DType::I32, logical_type: None, bits: 32 },
    Mapped { name: "U64", dtype: DType::U64, logical_type: None, bits: 64 },
    Mapped { name: "I64", dtype: DType::I64, logical_type: None, bits: 64 },
    Mapped { name: "F16", dtype: DType::F16, logical_type: None, bits: 16 },
    Mapped { name: "BF16", dtype: DType::BF16, logical_type: None, bits: 16 },
    Mapped { name: "F32", dtype: DType::F32, logical_type: None, bits: 32 },
    Mapped { name: "F64", dtype: DType::F64, logical_type: None, bits: 64 },
    Mapped { name: "C64", dtype: DType::F32, logical_type: Some("complex64"), bits: 64 },
    Mapped { name: "F8_E4M3", dtype: DType::U8, logical_type: Some("f8_e4m3fn"), bits: 8 },
    Mapped { name: "F8_E5M2", dtype: DType::U8, logical_type: Some("f8_e5m2"), bits: 8 },
    Mapped { name: "F8_E8M0", dtype: DType::U8, logical_type: Some("f8_e8m0"), bits: 8 },
    Mapped { name: "F8_E4M3FNUZ", dtype: DType::U8, logical_type: Some("f8_e4m3fnuz"), bits: 8 },
    Mapped { name: "F8_E5M2FNUZ", dtype: DType::U8, logical_type: Some("f8_e5m2fnuz"), bits: 8 },
    Mapped { name: "F4", dtype: DType::U8, logical_type: Some("f4_e2m1"), bits: 4 },
    Mapped { name: "F6_E2M3", dtype: DType::U8, logical_type: Some("F6_E2M3"), bits: 6 },
    Mapped { name: "F6_E3M2", dtype: DType::U8, logical_type: Some("F6_E3M2"), bits: 6 },
];

/// How zTensor stores the safetensors dtype `name`; `None` for a name safetensors does not define.
pub fn mapped(name: &str) -> Option<Mapped> {
    DTYPES.iter().copied().find(|m| m.name == name)
}

/// One tensor of a safetensors file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    pub name: String,
    pub dtype: Mapped,
    pub shape: Vec<u64>,
    /// Its bytes in the file (absolute offsets).
    pub range: Range<u64>,
}

/// A parsed, validated safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// `__metadata__`, in file order.
    pub metadata: Vec<(String, String)>,
    /// In the order of their bytes in the file.
    pub tensors: Vec<Tensor>,
    /// Where the JSON header lies in the file.
    pub span: Range<u64>,
}

impl Tensor {
    /// The tensor as a dense object whose one `data` component is its bytes in file `file`.
    fn into_object(self, file: usize) -> Object {
        let logical_type = self.dtype.logical_type.map(str::to_owned);
        let data = Component::stored_as_is("data", self.dtype.dtype, logical_type, self.range, file);
        Object { name: self.name, shape: self.shape, format: "dense".into(), attributes: None, components: vec![data] }
    }
}

impl Header {
    /// The file as a model: `__metadata__` as its attributes, each tensor a dense object.
    pub fn into_manifest(self, file_len: u64) -> Result<Manifest> {
        let attributes = strings_map(&self.metadata);
        let objects = self.tensors.into_iter().map(|t| t.into_object(0)).collect();
        Manifest::new(Container::Safetensors, None, attributes, objects, self.span, file_len)
    }
}

/// `pairs` as a CBOR map of strings, or nothing when there are none.
fn strings_map(pairs: &[(String, String)]) -> Option<Value> {
    (!pairs.is_empty())
        .then(|| Value::Map(pairs.iter().map(|(k, v)| (Value::Text(k.clone()), Value::Text(v.clone()))).collect()))
}

/// The reads that find and parse a safetensors header, whoever makes them: a prefix of the
/// file (which often holds the whole header), then at most one more read for the rest.
#[derive(Debug, Clone)]
pub struct HeaderReads {
    file_len: u64,
    first: Range<u64>,
}

impl HeaderReads {
    /// Reads of a `file_len`-byte file whose first read is `prefix` bytes (at least the
    /// length field, at most the file).
    pub fn new(file_len: u64, prefix: u64) -> HeaderReads {
        HeaderReads { file_len, first: 0..prefix.max(LENGTH_FIELD).min(file_len) }
    }

    pub fn first(&self) -> Range<u64> {
        self.first.clone()
    }

    /// Where the header lies, from the `first` read, and the part of it still to be read.
    pub fn locate(&self, first: &[u8]) -> Result<(Range<u64>, Range<u64>)> {
        let span = header_span(first, self.file_len)?;
        let missing = span.start.max(self.first.end)..span.end.max(self.first.end);
        Ok((span, missing))
    }

    /// Parses the header from the `first` read and the `missing` bytes [`locate`](Self::locate) named.
    pub fn parse(&self, first: &[u8], missing: &[u8]) -> Result<Header> {
        let (span, _) = self.locate(first)?;
        let held = &first[(span.start as usize).min(first.len())..(span.end as usize).min(first.len())];
        let whole = if missing.is_empty() { std::borrow::Cow::Borrowed(held) } else { [held, missing].concat().into() };
        parse(&whole, span, self.file_len)
    }
}

/// A file of `header` (as the JSON header, length field in front) and `data_len` bytes of data:
/// how tests and the fuzzer build files by hand.
pub fn file_around(header: &[u8], data_len: usize) -> Vec<u8> {
    let mut file = Vec::with_capacity(8 + header.len() + data_len);
    file.extend_from_slice(&(header.len() as u64).to_le_bytes());
    file.extend_from_slice(header);
    file.extend((0..data_len).map(|i| (i.wrapping_mul(31) % 251) as u8));
    file
}

/// Parses and validates a whole safetensors file held in memory (or mapped).
pub fn parse_file(file: &[u8]) -> Result<Header> {
    let span = header_span(file, file.len() as u64)?;
    parse(&file[span.start as usize..span.end as usize], span, file.len() as u64)
}

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

/// A JSON object's entries in file order, duplicates kept.
fn json_entries(text: &str) -> serde_json::Result<Vec<(String, serde_json::Value)>> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let entries = de::Deserializer::deserialize_map(&mut deserializer, EntriesVisitor)?;
    deserializer.end()?;
    Ok(entries)
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

/// Where the JSON header lies in a file of `file_len` bytes whose first bytes are `head` (at
/// least [`LENGTH_FIELD`] of them): what a reader fetches second.
pub fn header_span(head: &[u8], file_len: u64) -> Result<Range<u64>> {
    let field: [u8; 8] = head
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or(FormatError::Truncated { len: file_len.min(head.len() as u64), min: LENGTH_FIELD })?;
    let len = u64::from_le_bytes(field);
    if len > MAX_HEADER_LEN {
        return Err(FormatError::ManifestTooLarge { size: len, limit: MAX_HEADER_LEN });
    }
    let available = file_len.saturating_sub(LENGTH_FIELD);
    if len > available {
        return Err(FormatError::ManifestBeyondFile { size: len, available });
    }
    Ok(LENGTH_FIELD..LENGTH_FIELD + len)
}

/// Parses and validates the JSON `header` found at `span` (from [`header_span`]) of a file of
/// `file_len` bytes.
pub fn parse(header: &[u8], span: Range<u64>, file_len: u64) -> Result<Header> {
    let invalid = |detail: String| FormatError::SafetensorsHeader { detail };
    // The format says the header MUST begin with `{`; the library's reader lets leading
    // whitespace through, which we refuse.
    match header.first() {
        Some(b'{') => {}
        Some(&first) => return Err(FormatError::SafetensorsHeaderStart { first }),
        None => return Err(invalid("the header is empty".into())),
    }
    let text = std::str::from_utf8(header).map_err(|e| invalid(format!("not UTF-8: {e}")))?;
    // The safetensors library pads headers with spaces; anything else after the object is not JSON.
    let entries = json_entries(text).map_err(|e| invalid(format!("not a JSON object of tensors: {e}")))?;

    let mut metadata = None;
    let mut tensors = Vec::with_capacity(entries.len());
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    for (name, value) in entries {
        if !seen.insert(name.clone()) {
            return Err(FormatError::DuplicateObject { name });
        }
        if name == "__metadata__" {
            let map: std::collections::BTreeMap<String, serde_json::Value> =
                serde_json::from_value(value).map_err(|e| invalid(format!("__metadata__ is not an object: {e}")))?;
            let mut strings = Vec::with_capacity(map.len());
            for (key, value) in map {
                match value {
                    serde_json::Value::String(text) => strings.push((key, text)),
                    other => return Err(invalid(format!("__metadata__ {key:?} is {other}, not a string"))),
                }
            }
            metadata = Some(strings);
            continue;
        }
        let entry: Entry = serde_json::from_value(value).map_err(|e| invalid(format!("tensor {name:?}: {e}")))?;
        tensors.push((name, entry));
    }
    let data_start = span.end;
    tensors.sort_by_key(|(_, entry)| entry.data_offsets);
    let mut end = 0u64;
    let mut previous: Option<(&str, Range<u64>)> = None;
    let mut checked = Vec::with_capacity(tensors.len());
    for (name, entry) in &tensors {
        let at = || Location::object(name);
        let dtype =
            mapped(&entry.dtype).ok_or_else(|| FormatError::UnknownDtype { at: at(), dtype: entry.dtype.clone() })?;
        let [start, stop] = entry.data_offsets;
        if stop < start {
            return Err(FormatError::OffsetsReversed { at: at(), start, end: stop });
        }
        if start != end {
            return Err(match previous {
                Some((first, ref range)) if start < end => FormatError::Overlap {
                    first: Location::object(first),
                    first_start: range.start,
                    first_end: range.end,
                    second: at(),
                    second_start: start,
                    second_end: stop,
                },
                _ => FormatError::DataGap { at: at(), start, expected: end },
            });
        }
        let elements = entry
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| FormatError::ShapeOverflow { at: at(), shape: entry.shape.clone() })?;
        let bits = elements
            .checked_mul(dtype.bits)
            .ok_or_else(|| FormatError::ShapeOverflow { at: at(), shape: entry.shape.clone() })?;
        if bits % 8 != 0 {
            return Err(FormatError::PackedBits { at: at(), elements, bits: dtype.bits });
        }
        if stop - start != bits / 8 {
            return Err(FormatError::LengthMismatch {
                at: at(),
                what: "data_offsets span",
                expected: bits / 8,
                actual: stop - start,
            });
        }
        end = stop;
        previous = Some((name, start..stop));
        let range = data_start
            .checked_add(start)
            .zip(data_start.checked_add(stop))
            .map(|(from, to)| from..to)
            .ok_or(FormatError::RangeOverflow { at: at(), offset: data_start, length: stop })?;
        checked.push(Tensor { name: name.clone(), dtype, shape: entry.shape.clone(), range });
    }
    let data = file_len.saturating_sub(data_start);
    if end != data {
        return Err(FormatError::DataRegionMismatch { tensors_end: end, data });
    }
    Ok(Header { metadata: metadata.unwrap_or_default(), tensors: checked, span })
}

/// One tensor's entry, as the safetensors library reads it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// The header's top-level entries in file order, duplicates kept (a map would drop them).
struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Vec<(String, serde_json::Value)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            entries.push((key, map.next_value_seed(AnyValue)?));
        }
        Ok(entries)
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

/// A JSON object's entries in file order, duplicates kept.
struct Entries;

impl<'de> DeserializeSeed<'de> for Entries {
    type Value = Vec<(String, serde_json::Value)>;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> std::result::Result<Self::Value, D::Error> {
        deserializer.deserialize_map(EntriesVisitor)
    }
}

struct AnyValue;

impl<'de> DeserializeSeed<'de> for AnyValue {
    type Value = serde_json::Value;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> std::result::Result<Self::Value, D::Error> {
        de::Deserialize::deserialize(deserializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file: the header (padded with spaces to 8 bytes, as the library does), then `data`.
    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut json = header.as_bytes().to_vec();
        while json.len() % 8 != 0 {
            json.push(b' ');
        }
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&json);
        out.resize(out.len() + data, 7);
        out
    }

    fn parsed(bytes: &[u8]) -> Result<Header> {
        let span = header_span(bytes, bytes.len() as u64)?;
        parse(&bytes[span.start as usize..span.end as usize], span, bytes.len() as u64)
    }

    fn code(header: &str, data: usize) -> &'static str {
        parsed(&file(header, data)).unwrap_err().code()
    }

    #[test]
    fn tensors_map_to_stored_dtypes_and_absolute_ranges_in_offset_order() {
        let header = r#"{"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]},"__metadata__":{"format":"pt"},"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}}"#;
        let bytes = file(header, 16);
        let h = parsed(&bytes).unwrap();
        let data_start = h.span.end;
        assert_eq!(h.metadata, vec![("format".to_string(), "pt".to_string())]);
        assert_eq!(h.tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(h.tensors[0].dtype.logical_type, Some("f8_e4m3fn"));
        assert_eq!(h.tensors[0].range, data_start..data_start + 4);
        assert_eq!(h.tensors[1].dtype.dtype, DType::BF16);
        assert_eq!(h.tensors[1].range, data_start + 4..data_start + 16);
    }

    #[test]
    fn sub_byte_types_pack_and_must_fill_whole_bytes() {
        assert!(parsed(&file(r#"{"q":{"dtype":"F4","shape":[6],"data_offsets":[0,3]}}"#, 3)).is_ok());
        assert!(parsed(&file(r#"{"q":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]}}"#, 3)).is_ok());
        assert_eq!(code(r#"{"q":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#, 2), "packed_bits");
    }

    #[test]
    fn every_broken_header_is_refused_with_its_own_code() {
        let t = |offsets: &str| {
            format!(
                r#"{{"a":{{"dtype":"U8","shape":[2],"data_offsets":[0,2]}},"b":{{"dtype":"U8","shape":[2],"data_offsets":{offsets}}}}}"#
            )
        };
        assert_eq!(code(&t("[3,5]"), 5), "data_gap");
        assert_eq!(code(&t("[1,3]"), 3), "overlap");
        assert_eq!(code(&t("[4,2]"), 4), "offsets_reversed");
        assert_eq!(code(&t("[2,5]"), 5), "length_mismatch");
        assert_eq!(code(&t("[2,4]"), 5), "data_region_mismatch");
        assert_eq!(code(r#"{"a":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}}"#, 1), "unknown_dtype");
        assert_eq!(code(r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#, 1), "safetensors_header");
        assert_eq!(code(r#"{"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}"#, 1), "safetensors_header");
        assert_eq!(
            code(
                r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
                2
            ),
            "duplicate_object"
        );
        assert_eq!(code(r#"{"__metadata__":{"n":1}}"#, 0), "safetensors_header");
        assert_eq!(code("[1,2]", 0), "safetensors_header_start");
        assert_eq!(code(" {}", 0), "safetensors_header_start", "the format says MUST begin with {{");
        assert_eq!(code(r#"{"a":1} x"#, 0), "safetensors_header");
        let mut not_utf8 = file("{}", 0);
        not_utf8[9] = 0xff;
        assert_eq!(parsed(&not_utf8).unwrap_err().code(), "safetensors_header");
    }

    #[test]
    fn the_header_length_is_bounded_by_the_file_and_the_library_limit() {
        let mut huge = (MAX_HEADER_LEN + 1).to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert_eq!(header_span(&huge, 10).unwrap_err().code(), "manifest_too_large");
        let beyond = 100u64.to_le_bytes();
        assert_eq!(header_span(&beyond, 50).unwrap_err().code(), "manifest_beyond_file");
        assert_eq!(header_span(&[1, 2], 2).unwrap_err().code(), "truncated");
    }

    /// Files written by the safetensors library, one tensor of every dtype it defines (shapes
    /// that fill whole bytes), read back with the same names, shapes, ranges and metadata.
    #[test]
    fn files_the_library_writes_read_back_exactly() {
        use safetensors::tensor::{Dtype, TensorView};
        let dtypes = [
            Dtype::BOOL,
            Dtype::F4,
            Dtype::F6_E2M3,
            Dtype::F6_E3M2,
            Dtype::U8,
            Dtype::I8,
            Dtype::F8_E5M2,
            Dtype::F8_E4M3,
            Dtype::F8_E8M0,
            Dtype::F8_E4M3FNUZ,
            Dtype::F8_E5M2FNUZ,
            Dtype::I16,
            Dtype::U16,
            Dtype::F16,
            Dtype::BF16,
            Dtype::I32,
            Dtype::U32,
            Dtype::F32,
            Dtype::C64,
            Dtype::F64,
            Dtype::I64,
            Dtype::U64,
        ];
        assert_eq!(dtypes.len(), DTYPES.len(), "every dtype the library defines is mapped");
        let shape = vec![2usize, 4];
        let buffers: Vec<(String, Dtype, Vec<u8>)> = dtypes
            .iter()
            .enumerate()
            .map(|(i, &d)| (format!("t{i:02}.{d}"), d, vec![i as u8; 8 * d.bitsize() / 8]))
            .collect();
        let views: Vec<(String, TensorView<'_>)> = buffers
            .iter()
            .map(|(name, d, data)| (name.clone(), TensorView::new(*d, shape.clone(), data).unwrap()))
            .collect();
        let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
        let bytes = safetensors::serialize(views, Some(metadata)).unwrap();
        let header = parsed(&bytes).unwrap();
        let (_, reference) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(header.metadata, vec![("format".to_string(), "pt".to_string())]);
        assert_eq!(header.tensors.len(), dtypes.len());
        for tensor in &header.tensors {
            let info = reference.info(&tensor.name).unwrap();
            assert_eq!(tensor.dtype.name, info.dtype.to_string(), "{}", tensor.name);
            assert_eq!(tensor.shape, [2, 4]);
            let (start, end) = info.data_offsets;
            assert_eq!(tensor.range, header.span.end + start as u64..header.span.end + end as u64);
            let index = buffers.iter().position(|(name, ..)| *name == tensor.name).unwrap();
            assert_eq!(&bytes[tensor.range.start as usize..tensor.range.end as usize], &buffers[index].2[..]);
        }
    }

    #[test]
    fn a_header_is_read_with_one_more_read_only_when_the_prefix_does_not_hold_it() {
        let bytes =
            file(r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}"#, 12);
        let whole = parse_file(&bytes).unwrap();
        for prefix in [0, 8, 20, whole.span.end, 1 << 20] {
            let reads = HeaderReads::new(bytes.len() as u64, prefix);
            let first = &bytes[reads.first().start as usize..reads.first().end as usize];
            let (span, missing) = reads.locate(first).unwrap();
            assert_eq!(span, whole.span);
            assert_eq!(missing.is_empty(), prefix >= whole.span.end, "prefix {prefix}");
            let header = reads.parse(first, &bytes[missing.start as usize..missing.end as usize]).unwrap();
            assert_eq!(header, whole);
        }
        let manifest = whole.into_manifest(bytes.len() as u64).unwrap();
        assert_eq!(manifest.container, Container::Safetensors);
        let data = manifest.object("a").unwrap().component("data").unwrap();
        assert_eq!((data.dtype, data.stored_length, data.file), (DType::F32, 12, 0));
        assert_eq!(
            crate::json::cbor_to_json(manifest.attributes.as_ref().unwrap()),
            serde_json::json!({"format": "pt"})
        );
    }

    fn shard(tensors: &[&str]) -> Manifest {
        let mut header = String::from("{");
        for (i, name) in tensors.iter().enumerate() {
            if i > 0 {
                header.push(',');
            }
            header.push_str(&format!(r#""{name}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{}]}}"#, i + 1));
        }
        header.push('}');
        let bytes = file(&header, tensors.len());
        parse_file(&bytes).unwrap().into_manifest(bytes.len() as u64).unwrap()
    }

    fn index(weight_map: &str) -> Index {
        parse_index(format!(r#"{{"metadata":{{"total_size":3}},"weight_map":{weight_map}}}"#).as_bytes()).unwrap()
    }

    #[test]
    fn an_index_and_its_shards_make_one_model_with_each_tensor_in_its_own_shard() {
        let index = index(r#"{"b":"s-2.safetensors","a":"s-1.safetensors","c":"s-2.safetensors"}"#);
        assert_eq!(index.shards, ["s-1.safetensors", "s-2.safetensors"]);
        let (one, two) = (shard(&["a"]), shard(&["b", "c"]));
        let manifest = assemble(&index, 100, &[("s-1.safetensors", &one), ("s-2.safetensors", &two)]).unwrap();
        let files: Vec<(&str, usize)> =
            manifest.objects.iter().map(|o| (o.name.as_str(), o.components[0].file)).collect();
        assert_eq!(files, [("a", 1), ("b", 2), ("c", 2)]);
        assert_eq!(manifest.manifest_span, 0..100);
        assert_eq!(
            crate::json::cbor_to_json(manifest.attributes.as_ref().unwrap()),
            serde_json::json!({"total_size": 3})
        );

        let wrong = index_codes(r#"{"a":"s-2.safetensors","b":"s-2.safetensors","c":"s-2.safetensors"}"#, &one, &two);
        assert_eq!(wrong, "tensor_in_wrong_shard");
        let missing = index_codes(r#"{"a":"s-1.safetensors","b":"s-1.safetensors","c":"s-2.safetensors"}"#, &one, &two);
        assert_eq!(missing, "tensor_in_wrong_shard");
        let (extra_one, extra_two) = (shard(&["a", "d"]), shard(&["b", "c"]));
        let extra = index_codes(
            r#"{"a":"s-1.safetensors","b":"s-2.safetensors","c":"s-2.safetensors"}"#,
            &extra_one,
            &extra_two,
        );
        assert_eq!(extra, "tensor_not_indexed");
        let absent = index_codes(r#"{"a":"s-1.safetensors","b":"s-2.safetensors","z":"s-2.safetensors"}"#, &one, &two);
        assert_eq!(absent, "tensor_not_in_shard");
        let (only_a, only_b) = (shard(&["a"]), shard(&["b"]));
        let gone =
            index_codes(r#"{"a":"s-1.safetensors","b":"s-2.safetensors","z":"s-2.safetensors"}"#, &only_a, &only_b);
        assert_eq!(gone, "tensor_not_in_shard");
        let (twice_one, twice_two) = (shard(&["a"]), shard(&["a", "b"]));
        let twice = index_codes(r#"{"a":"s-1.safetensors","b":"s-2.safetensors"}"#, &twice_one, &twice_two);
        assert_eq!(twice, "tensor_in_wrong_shard");
    }

    fn index_codes(weight_map: &str, one: &Manifest, two: &Manifest) -> &'static str {
        let index = index(weight_map);
        assemble(&index, 10, &[("s-1.safetensors", one), ("s-2.safetensors", two)]).unwrap_err().code()
    }

    #[test]
    fn broken_indexes_are_refused_with_the_reason() {
        let code = |text: &str| parse_index(text.as_bytes()).unwrap_err();
        for (text, needle) in [
            ("not json", "not a JSON object"),
            (r#"{"metadata":{}}"#, "no weight_map"),
            (r#"{"weight_map":{},"weight_map":{}}"#, "appears twice"),
            (r#"{"weight_map":{"a":"../x.safetensors"}}"#, "not a file name"),
            (r#"{"weight_map":{"a":"sub/x.safetensors"}}"#, "not a file name"),
            (r#"{"weight_map":{"a":"..\\x.safetensors"}}"#, "not a file name"),
            (r#"{"weight_map":{"a":3}}"#, "not a file name"),
            (r#"{"weight_map":{"a":"model.safetensors.index.json"}}"#, "not a .safetensors file"),
            (r#"{"weight_map":{"a":"x.zt"}}"#, "not a .safetensors file"),
            (r#"{"weight_map":[]}"#, "not a JSON object"),
            (r#"{"metadata":[1],"weight_map":{}}"#, "metadata is"),
        ] {
            let error = code(text);
            assert_eq!(error.code(), "safetensors_index", "{text}");
            assert!(error.to_string().contains(needle), "{text}: {error}");
        }
        assert_eq!(code(r#"{"weight_map":{"a":"x.safetensors","a":"x.safetensors"}}"#).code(), "duplicate_object");
        assert_eq!(parse_index(&[0xff, b'{']).unwrap_err().code(), "safetensors_index");
        let extra = parse_index(br#"{"weight_map":{"a":"x.safetensors"},"format":"pt"}"#).unwrap();
        assert_eq!(extra.weight_map, [("a".to_string(), "x.safetensors".to_string())]);
    }

    #[test]
    fn every_library_dtype_is_known_once() {
        let names: std::collections::HashSet<_> = DTYPES.iter().map(|m| m.name).collect();
        assert_eq!(names.len(), DTYPES.len());
        for name in names {
            assert_eq!(mapped(name).unwrap().name, name);
        }
    }
}
