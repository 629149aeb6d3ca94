//! A safetensors file's header: where it lies (the length field, bounded), its reads by a
//! remote reader, and the JSON parsed and validated into tensors that tile the data region.

use std::ops::Range;

use super::dtypes::{Mapped, mapped};
use super::entries::json_entries;
use crate::{Component, Container, FormatError, Location, Manifest, Object, Result, Value};

/// Bytes of the header-length field that opens the file.
pub use crate::container::SAFETENSORS_LENGTH_FIELD as LENGTH_FIELD;

/// The largest header the safetensors library reads (`MAX_HEADER_SIZE`).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

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
