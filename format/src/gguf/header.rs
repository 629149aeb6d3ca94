//! A GGUF header, parsed and validated: the preamble, the metadata, the alignment and the
//! padding before the data, the keys a model requires and a split model's part; whole
//! ([`parse_file`]) or read in growing prefixes ([`HeaderReads`]).

use std::ops::Range;

use super::cursor::{Cursor, HeaderRead, Parsed, gguf_error};
use super::limits::{DEFAULT_ALIGNMENT, MAGIC, MAX_HEADER, MAX_KEY, MAX_KVS, MAX_TENSORS};
use super::tensors::{TensorInfo, place_tensors, read_tensor_infos};
use super::values::{KeyValue, MetaValue, ValueType};
use crate::{Container, Manifest, Result, Value};

/// A split model's part: the `split.*` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPart {
    /// 0-based (`split.no`).
    pub index: u64,
    /// `split.count`.
    pub count: u64,
    /// `split.tensors.count`: tensors of the whole model.
    pub tensors: u64,
}

/// A parsed, validated GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub version: u32,
    pub metadata: Vec<KeyValue>,
    /// In the order of their data in the file.
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Where the tensor data starts (after the infos and their padding).
    pub data_start: u64,
    pub split: Option<SplitPart>,
}

impl Header {
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|kv| kv.key == key).map(|kv| &kv.value)
    }

    /// The file as a model: its metadata as the attributes, each tensor an object.
    pub fn into_manifest(self, file_len: u64) -> Result<Manifest> {
        if let Some(split) = self.split.filter(|s| s.count > 1) {
            return Err(gguf_error(
                "gguf_split",
                0,
                format!(
                    "part {} of a {}-part split model, which is read with its other parts",
                    split.index + 1,
                    split.count
                ),
            ));
        }
        let version = self.version;
        let span = 0..self.data_start;
        let attributes = attributes(&self.metadata);
        let objects = self.tensors.into_iter().map(|t| t.into_object(0)).collect();
        Manifest::new(Container::Gguf, Some(version.to_string()), attributes, objects, span, file_len)
    }
}

pub(super) fn attributes(metadata: &[KeyValue]) -> Option<Value> {
    (!metadata.is_empty())
        .then(|| Value::Map(metadata.iter().map(|kv| (Value::Text(kv.key.clone()), kv.value.to_value())).collect()))
}

/// Whether `key` is what the specification allows: ASCII, `.`-separated segments of
/// `lower_snake_case` (lowercase letters, digits and `_`), at most [`MAX_KEY`] bytes.
fn is_valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.split('.').all(|segment| {
            !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
}

/// Parses and validates the header of a `file_len`-byte file from its first bytes, `prefix`:
/// [`HeaderRead::NeedMore`] when the header runs past them. In the order of the file: the
/// preamble, the key-values, the tensor infos and the padding (each read from the bytes), then
/// the checks that need all of them (where each tensor lies, and the keys a model requires).
pub fn parse_header(prefix: &[u8], file_len: u64) -> Parsed<Header> {
    let mut c = Cursor { bytes: prefix, at: 0, file_len, kept: 0 };
    let Preamble { version, tensor_count, kv_count } = read_preamble(&mut c)?;
    let metadata = read_metadata(&mut c, kv_count)?;
    let alignment = alignment_of(&metadata)?;
    let split = split_part(&metadata)?;
    let infos = read_tensor_infos(&mut c, tensor_count)?;
    let data_start = read_padding(&mut c, alignment)?;
    let (tensors, quantized) = place_tensors(infos, alignment, data_start, file_len)?;
    check_required_keys(&metadata, split.is_none_or(|s| s.index == 0), quantized)?;
    Ok(Header { version, metadata, tensors, alignment, data_start, split })
}

/// What the first 24 bytes say.
#[derive(Debug, PartialEq)]
pub(super) struct Preamble {
    pub(super) version: u32,
    pub(super) tensor_count: u64,
    pub(super) kv_count: u64,
}

/// The magic, the version and the counts, each bounded, and counts the file cannot hold refused
/// before anything is allocated for them.
pub(super) fn read_preamble(c: &mut Cursor<'_>) -> Parsed<Preamble> {
    let magic = c.take(4, "the magic")?;
    if magic != MAGIC {
        let found = magic.escape_ascii().to_string();
        return Err(gguf_error("gguf_magic", 0, format!("the magic is {found:?}, not \"GGUF\"")).into());
    }
    let raw_version = c.u32("the version")?;
    let version = match raw_version {
        2 | 3 => raw_version,
        // A big-endian file's version reads with its low half zero (the `gguf` reader's test).
        v if v & 0xFFFF == 0 => {
            let detail = format!("a big-endian file (version {}): only little-endian GGUF is served", v.swap_bytes());
            return Err(gguf_error("gguf_big_endian", 4, detail).into());
        }
        1 => {
            return Err(
                gguf_error("gguf_version", 4, "version 1 (32-bit counts) is not read; only 2 and 3".into()).into()
            );
        }
        v => return Err(gguf_error("gguf_version", 4, format!("version {v} is not 2 or 3")).into()),
    };
    let tensor_count = c.u64("the tensor count")?;
    if tensor_count > MAX_TENSORS {
        let detail = format!("{tensor_count} tensors, over the {MAX_TENSORS}-tensor limit");
        return Err(gguf_error("gguf_too_many_tensors", 8, detail).into());
    }
    let kv_count = c.u64("the key-value count")?;
    if kv_count > MAX_KVS {
        let detail = format!("{kv_count} key-values, over the {MAX_KVS} limit");
        return Err(gguf_error("gguf_too_many_keys", 16, detail).into());
    }
    // Every key-value takes at least 13 bytes and every tensor info 29.
    let file_len = c.file_len;
    let room = file_len.saturating_sub(24);
    if kv_count.saturating_mul(13).saturating_add(tensor_count.saturating_mul(29)) > room {
        let detail =
            format!("{kv_count} key-values and {tensor_count} tensor infos cannot fit in a {file_len}-byte file");
        return Err(gguf_error("gguf_truncated", 8, detail).into());
    }
    Ok(Preamble { version, tensor_count, kv_count })
}

/// The `kv_count` key-values: keys valid and distinct, values of known types.
fn read_metadata(c: &mut Cursor<'_>, kv_count: u64) -> Parsed<Vec<KeyValue>> {
    let mut metadata: Vec<KeyValue> = Vec::with_capacity(kv_count as usize);
    let mut keys = std::collections::HashSet::with_capacity(kv_count as usize);
    for _ in 0..kv_count {
        let at = c.at;
        let key = c.string("a metadata key", MAX_KEY)?;
        if !is_valid_key(&key) {
            let detail = format!("key {key:?} is not dot-separated lower_snake_case ASCII");
            return Err(gguf_error("gguf_key", at, detail).into());
        }
        if !keys.insert(key.clone()) {
            return Err(gguf_error("gguf_duplicate_key", at, format!("key {key:?} appears twice")).into());
        }
        let type_at = c.at;
        let type_id = c.u32(&key)?;
        let value_type = ValueType::of(type_id)
            .ok_or_else(|| gguf_error("gguf_value_type", type_at, format!("{key}: unknown value type {type_id}")))?;
        let value = c.value(value_type, &key, 0, true)?.expect("a value asked to be kept");
        metadata.push(KeyValue { key, value_type, value });
    }
    Ok(metadata)
}

/// `general.alignment` (a UINT32 power of two that is a multiple of 8), or the default.
pub(super) fn alignment_of(metadata: &[KeyValue]) -> Result<u64> {
    match metadata.iter().find(|kv| kv.key == "general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(KeyValue { value_type: ValueType::U32, value, .. }) => {
            let a = value.as_u64().unwrap_or(0);
            if a == 0 || a % 8 != 0 || !a.is_power_of_two() {
                let detail = format!("general.alignment is {a}, not a power of two that is a multiple of 8");
                return Err(gguf_error("gguf_alignment", 0, detail));
            }
            Ok(a)
        }
        Some(kv) => {
            let detail = format!("general.alignment is a {}, not a UINT32", kv.value_type.name());
            Err(gguf_error("gguf_alignment", 0, detail))
        }
    }
}

/// The padding from the end of the tensor infos to the data, at the next multiple of
/// `alignment`: inside the file and all 0x00, as the specification says. Where the data starts.
pub(super) fn read_padding(c: &mut Cursor<'_>, alignment: u64) -> Parsed<u64> {
    let (infos_end, file_len) = (c.at, c.file_len);
    let data_start = infos_end.div_ceil(alignment) * alignment;
    if data_start > file_len {
        let detail = format!("the tensor data would start at {data_start}, past the end of the {file_len}-byte file");
        return Err(gguf_error("gguf_truncated", infos_end, detail).into());
    }
    let padding = c.take(data_start - infos_end, "the padding before the tensor data")?;
    if let Some(bad) = padding.iter().position(|&b| b != 0) {
        let detail = format!("the padding before the tensor data holds a non-zero byte at {}", infos_end + bad as u64);
        return Err(gguf_error("gguf_padding", infos_end + bad as u64, detail).into());
    }
    Ok(data_start)
}

/// The keys a model requires: `general.architecture` (lowercase ASCII letters and digits) in a
/// whole file or a split model's first part, and `general.quantization_version` (a UINT32)
/// where tensors are quantized.
pub(super) fn check_required_keys(metadata: &[KeyValue], first_part: bool, quantized: bool) -> Result<()> {
    let find = |key: &str| metadata.iter().find(|kv| kv.key == key);
    if first_part {
        match find("general.architecture") {
            Some(KeyValue { value: MetaValue::Text(arch), .. })
                if !arch.is_empty() && arch.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) => {}
            Some(KeyValue { value: MetaValue::Text(arch), .. }) => {
                let detail = format!("general.architecture {arch:?} is not lowercase ASCII letters and digits");
                return Err(gguf_error("gguf_architecture", 0, detail));
            }
            Some(kv) => {
                let detail = format!("general.architecture is a {}, not a STRING", kv.value_type.name());
                return Err(gguf_error("gguf_architecture", 0, detail));
            }
            None => {
                return Err(gguf_error("gguf_architecture", 0, "the required general.architecture is missing".into()));
            }
        }
    }
    match find("general.quantization_version") {
        Some(kv) if kv.value_type != ValueType::U32 => {
            let detail = format!("general.quantization_version is a {}, not a UINT32", kv.value_type.name());
            Err(gguf_error("gguf_quantization_version", 0, detail))
        }
        None if quantized && first_part => {
            let detail = "quantized tensors without the general.quantization_version they require".to_owned();
            Err(gguf_error("gguf_quantization_version", 0, detail))
        }
        _ => Ok(()),
    }
}

/// The `split.*` keys, when present: all three, of their types, consistent.
fn split_part(metadata: &[KeyValue]) -> Parsed<Option<SplitPart>> {
    let find = |key: &str| metadata.iter().find(|kv| kv.key == key);
    let (no, count, tensors) = (find("split.no"), find("split.count"), find("split.tensors.count"));
    if no.is_none() && count.is_none() && tensors.is_none() {
        return Ok(None);
    }
    let number = |kv: Option<&KeyValue>, key: &str, types: &[ValueType]| -> Parsed<u64> {
        let bad = |detail: String| HeaderRead::Invalid(gguf_error("gguf_split", 0, detail));
        let kv = kv.ok_or_else(|| bad(format!("{key} is missing beside the other split.* keys")))?;
        if !types.contains(&kv.value_type) {
            return Err(bad(format!("{key} is a {}", kv.value_type.name())));
        }
        kv.value.as_u64().ok_or_else(|| bad(format!("{key} is negative")))
    };
    let index = number(no, "split.no", &[ValueType::U16])?;
    let count = number(count, "split.count", &[ValueType::U16])?;
    let tensors = number(tensors, "split.tensors.count", &[ValueType::I32, ValueType::U32, ValueType::U64])?;
    if count == 0 || index >= count {
        let detail = format!("split.no {index} is not a part of split.count {count}");
        return Err(gguf_error("gguf_split", 0, detail).into());
    }
    Ok(Some(SplitPart { index, count, tensors }))
}

/// The header of a whole file held in memory (or mapped).
pub fn parse_file(file: &[u8]) -> Result<Header> {
    parse_header(file, file.len() as u64).map_err(|e| match e {
        HeaderRead::Invalid(e) => e,
        // The whole file was given, so the header cannot need more of it.
        HeaderRead::NeedMore { needed } => gguf_error("gguf_truncated", needed, "the header runs past the file".into()),
    })
}

/// The reads that find a GGUF header, whoever makes them: a prefix of the file, then, while
/// the header runs past what was read, a prefix four times longer (or as long as needed).
#[derive(Debug, Clone)]
pub struct HeaderReads {
    pub file_len: u64,
}

impl HeaderReads {
    /// The first read, of `prefix` bytes at most.
    pub fn first(&self, prefix: u64) -> Range<u64> {
        0..prefix.max(64).min(self.file_len).min(MAX_HEADER)
    }

    /// The next prefix to read after `read` bytes fell short of `needed`.
    pub fn next(&self, read: u64, needed: u64) -> Range<u64> {
        0..needed.max(read.saturating_mul(4)).min(self.file_len).min(MAX_HEADER)
    }

    /// The header, parsed from the file's first bytes `held`, or the bytes to read after them
    /// when it runs past them: what a reader does with each read, whoever makes it.
    pub fn step(&self, held: &[u8]) -> Result<std::result::Result<Header, Range<u64>>> {
        match parse_header(held, self.file_len) {
            Ok(header) => Ok(Ok(header)),
            Err(HeaderRead::Invalid(e)) => Err(e),
            Err(HeaderRead::NeedMore { needed }) => {
                Ok(Err(held.len() as u64..self.next(held.len() as u64, needed).end))
            }
        }
    }
}
