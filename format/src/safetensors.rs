//! safetensors files (Hugging Face's format), read purely: an 8-byte little-endian header
//! length, a JSON header of at most 100,000,000 bytes (the safetensors library's bound) mapping
//! each tensor name to its dtype, shape and `data_offsets`, an optional `__metadata__` of
//! strings, and the tensors' bytes tiling the rest of the file with no gap or overlap. Each
//! tensor becomes what a zTensor dense object's `data` component says: a storage dtype, a
//! logical type where safetensors has one zTensor names (bool, f8, f4, complex), and the byte
//! range. The rules are the safetensors library's (`Metadata::validate`), each failure named
//! with the tensor it is about; names must also be unique, which a JSON map does not promise.

use std::fmt;
use std::ops::Range;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};

use crate::{DType, FormatError, Location, Result};

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
    let text = std::str::from_utf8(header).map_err(|e| invalid(format!("not UTF-8: {e}")))?;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let entries = de::Deserializer::deserialize_map(&mut deserializer, EntriesVisitor)
        .map_err(|e| invalid(format!("not a JSON object of tensors: {e}")))?;
    // The safetensors library pads headers with spaces; anything else after the object is not JSON.
    deserializer.end().map_err(|e| invalid(format!("not a JSON object of tensors: {e}")))?;

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
        assert_eq!(code("[1,2]", 0), "safetensors_header");
        assert_eq!(code(r#"{"a":1} x"#, 0), "safetensors_header");
        let mut not_utf8 = file("{}", 0);
        not_utf8[8] = 0xff;
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
    fn every_library_dtype_is_known_once() {
        let names: std::collections::HashSet<_> = DTYPES.iter().map(|m| m.name).collect();
        assert_eq!(names.len(), DTYPES.len());
        for name in names {
            assert_eq!(mapped(name).unwrap().name, name);
        }
    }
}
