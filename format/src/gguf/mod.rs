//! GGUF files (ggml's format: llama.cpp, Ollama, LM Studio), read purely, versions 2 and 3
//! as ggml's `docs/gguf.md` states them: the `GGUF` magic, the version, the tensor and
//! key-value counts, the metadata key-values, the tensor infos, padding to `general.alignment`,
//! then the tensor data. Every rule the specification states is checked, every count, length
//! and offset bounded before anything is read or allocated ([`MAX_TENSORS`] and the other
//! limits), so a hostile file gets a precise reason. Tensors become objects: the dense GGML
//! types (F32, F16, BF16, F64, I8 … I64) as `dense` tensors of the zTensor dtype, the
//! block-quantized ones as objects of the layout `ztensor` 2.x's GGUF reader names
//! (`gguf.q4_k/1`) whose one `data` component is the raw blocks (logical type `gguf.q4_k`,
//! the GGML type and block geometry in the object's attributes). Shapes
//! are written row-major, outermost first, as numpy and the `gguf` reader show them (GGUF lists
//! `ne[0]`, the innermost, first). A split model (`name-00001-of-00003.gguf`, the `split.*`
//! keys) is [`assemble`]d into one manifest.

mod builder;

use std::ops::Range;

use crate::{Component, Container, DType, FormatError, Manifest, Object, Result, Value};

pub use self::builder::{FileBuilder, f16_bytes, quantize_q8_0, string_bytes};

/// The magic every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor has (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Longest tensor name, in bytes (the specification's 64).
pub const MAX_TENSOR_NAME: u64 = 64;
/// Longest metadata key, in bytes (the specification's 65535).
pub const MAX_KEY: u64 = 65_535;
/// Longest metadata string value, in bytes (a chat template is tens of KiB).
pub const MAX_STRING: u64 = 16 << 20;
/// Most elements of one metadata array (a tokenizer's vocabulary is about 10^5, its merges 10^6).
pub const MAX_ARRAY: u64 = 1 << 24;
/// Deepest nesting of metadata arrays (arrays of arrays of …).
pub const MAX_ARRAY_DEPTH: usize = 4;
/// Most tensors in one file.
pub const MAX_TENSORS: u64 = 1 << 20;
/// Most metadata key-values in one file.
pub const MAX_KVS: u64 = 1 << 20;
/// Longest header (everything before the tensor data) read, in bytes.
pub const MAX_HEADER: u64 = 1 << 30;
/// Arrays longer than this appear in a manifest's attributes as their type and length only.
pub const KEPT_ARRAY: u64 = 64;
/// Values kept in a header's attributes in all (scalars, strings, the elements of short arrays):
/// arrays past it are kept as their type and length only, so arrays of short arrays cannot
/// make the kept metadata many times larger than the file.
pub const MAX_KEPT_VALUES: u64 = 1 << 16;

/// A GGML tensor type: its GGUF id, name and block geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    pub id: u32,
    /// As ggml names it (`Q4_K`).
    pub name: &'static str,
    /// Elements per block (1 for the dense types).
    pub block_elements: u64,
    /// Bytes per block.
    pub block_bytes: u64,
    /// The zTensor dtype of a dense type's elements; `None` for a block-quantized type.
    pub dense: Option<DType>,
}

impl GgmlType {
    /// The logical type a block-quantized tensor's bytes carry (`gguf.q4_k`).
    pub fn logical_type(&self) -> String {
        format!("gguf.{}", self.name.to_ascii_lowercase())
    }

    /// The object layout of a block-quantized tensor, as `ztensor` 2.x names it (`gguf.q4_k/1`).
    pub fn layout(&self) -> String {
        format!("{}/1", self.logical_type())
    }

    /// Bytes `elements` elements take, or `None` when they are not whole blocks or overflow.
    pub fn bytes_of(&self, elements: u64) -> Option<u64> {
        (elements % self.block_elements == 0).then(|| (elements / self.block_elements).checked_mul(self.block_bytes))?
    }
}

const QK_K: u64 = 256;

const fn dense(id: u32, name: &'static str, dtype: DType, width: u64) -> GgmlType {
    GgmlType { id, name, block_elements: 1, block_bytes: width, dense: Some(dtype) }
}

const fn blocks(id: u32, name: &'static str, block_elements: u64, block_bytes: u64) -> GgmlType {
    GgmlType { id, name, block_elements, block_bytes, dense: None }
}

/// Every GGML type a GGUF file may hold, with the geometry of ggml's `type_traits` (the `gguf`
/// package's `GGML_QUANT_SIZES`).
pub const TYPES: [GgmlType; 34] = [
    dense(0, "F32", DType::F32, 4),
    dense(1, "F16", DType::F16, 2),
    blocks(2, "Q4_0", 32, 2 + 16),
    blocks(3, "Q4_1", 32, 2 + 2 + 16),
    blocks(6, "Q5_0", 32, 2 + 4 + 16),
    blocks(7, "Q5_1", 32, 2 + 2 + 4 + 16),
    blocks(8, "Q8_0", 32, 2 + 32),
    blocks(9, "Q8_1", 32, 4 + 4 + 32),
    blocks(10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
    blocks(11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
    blocks(12, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
    blocks(13, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
    blocks(14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
    blocks(15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8),
    blocks(16, "IQ2_XXS", QK_K, 2 + QK_K / 4),
    blocks(17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
    blocks(18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
    blocks(19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
    blocks(20, "IQ4_NL", 32, 2 + 16),
    blocks(21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
    blocks(22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
    blocks(23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
    dense(24, "I8", DType::I8, 1),
    dense(25, "I16", DType::I16, 2),
    dense(26, "I32", DType::I32, 4),
    dense(27, "I64", DType::I64, 8),
    dense(28, "F64", DType::F64, 8),
    blocks(29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
    dense(30, "BF16", DType::BF16, 2),
    blocks(34, "TQ1_0", QK_K, 2 + 4 * 13),
    blocks(35, "TQ2_0", QK_K, 2 + 64),
    blocks(39, "MXFP4", 32, 1 + 16),
    blocks(40, "NVFP4", 64, 4 + 32),
    blocks(41, "Q1_0", 128, 2 + 16),
];

/// The GGML type of GGUF id `id`.
pub fn ggml_type(id: u32) -> Option<GgmlType> {
    TYPES.iter().copied().find(|t| t.id == id)
}

/// The GGML type named `name` (`Q4_K`), any case.
pub fn ggml_type_named(name: &str) -> Option<GgmlType> {
    TYPES.iter().copied().find(|t| t.name.eq_ignore_ascii_case(name))
}

/// The GGML type of a block-quantized tensor's logical type (`gguf.q4_k`).
pub fn quantized_type(logical_type: &str) -> Option<GgmlType> {
    logical_type.strip_prefix("gguf.").and_then(ggml_type_named).filter(|t| t.dense.is_none())
}

/// The GGML type of `object`, when it is a block-quantized GGUF tensor: its layout
/// `gguf.<type>/1`, whether read from a GGUF file (its component's logical type `gguf.<type>`)
/// or from a zTensor copy of one (no logical type: the layout names the bytes).
pub fn quantized_object(object: &Object) -> Option<GgmlType> {
    let ggml = object.format.strip_prefix("gguf.")?.strip_suffix("/1").and_then(ggml_type_named)?;
    let logical = object.components.first()?.logical_type.as_deref();
    (ggml.dense.is_none() && logical.is_none_or(|l| l == ggml.logical_type())).then_some(ggml)
}

/// The logical type a copy of `component` of `object` written as zTensor declares: none for a
/// GGUF block-quantized tensor, whose layout (`gguf.q4_k/1`) already names its bytes, as
/// `ztensor` 2.x's GGUF reader projects them; the component's own for any other.
pub fn declared_logical_type<'o>(object: &Object, component: &'o Component) -> Option<&'o str> {
    match quantized_object(object) {
        Some(_) => None,
        None => component.logical_type.as_deref(),
    }
}

/// Types ggml once had and removed from GGUF files: named in the refusal.
fn removed_type(id: u32) -> Option<&'static str> {
    match id {
        4 => Some("Q4_2"),
        5 => Some("Q4_3"),
        31 => Some("Q4_0_4_4"),
        32 => Some("Q4_0_4_8"),
        33 => Some("Q4_0_8_8"),
        36 => Some("IQ4_NL_4_4"),
        37 => Some("IQ4_NL_4_8"),
        38 => Some("IQ4_NL_8_8"),
        _ => None,
    }
}

/// A metadata value's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    fn of(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// As the `gguf` package names it (`UINT32`).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "UINT8",
            I8 => "INT8",
            U16 => "UINT16",
            I16 => "INT16",
            U32 => "UINT32",
            I32 => "INT32",
            F32 => "FLOAT32",
            Bool => "BOOL",
            String => "STRING",
            Array => "ARRAY",
            U64 => "UINT64",
            I64 => "INT64",
            F64 => "FLOAT64",
        }
    }

    fn fixed_width(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }
}

/// A metadata value as kept: scalars and short arrays whole, long arrays as their element type
/// and length ([`KEPT_ARRAY`]).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    Int(i128),
    Float(f64),
    Bool(bool),
    Text(String),
    Array(Vec<MetaValue>),
    /// An array too long to keep: its element type and length.
    LongArray {
        of: ValueType,
        len: u64,
    },
}

impl MetaValue {
    /// As a manifest attribute: a long array as `{"array_of": TYPE, "length": N}`.
    pub fn to_value(&self) -> Value {
        match self {
            MetaValue::Int(i) => match i64::try_from(*i) {
                Ok(v) => Value::Integer(v.into()),
                Err(_) => Value::Integer(u64::try_from(*i).unwrap_or(u64::MAX).into()),
            },
            MetaValue::Float(f) => Value::Float(*f),
            MetaValue::Bool(b) => Value::Bool(*b),
            MetaValue::Text(t) => Value::Text(t.clone()),
            MetaValue::Array(items) => Value::Array(items.iter().map(MetaValue::to_value).collect()),
            MetaValue::LongArray { of, len } => Value::Map(vec![
                (Value::Text("array_of".into()), Value::Text(of.name().into())),
                (Value::Text("length".into()), Value::Integer((*len).into())),
            ]),
        }
    }

    fn as_u64(&self) -> Option<u64> {
        match self {
            MetaValue::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }
}

/// One metadata key-value.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyValue {
    pub key: String,
    pub value_type: ValueType,
    pub value: MetaValue,
}

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

impl TensorInfo {
    fn into_object(self, file: usize) -> Object {
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

fn attributes(metadata: &[KeyValue]) -> Option<Value> {
    (!metadata.is_empty())
        .then(|| Value::Map(metadata.iter().map(|kv| (Value::Text(kv.key.clone()), kv.value.to_value())).collect()))
}

fn gguf_error(code: &'static str, at: u64, detail: String) -> FormatError {
    FormatError::Gguf { code, at, detail }
}

/// Why a header could not be parsed from the bytes given.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderRead {
    /// The header runs past the bytes given: read the file's first `needed` bytes at least.
    NeedMore {
        needed: u64,
    },
    Invalid(FormatError),
}

impl From<FormatError> for HeaderRead {
    fn from(e: FormatError) -> Self {
        HeaderRead::Invalid(e)
    }
}

type Parsed<T> = std::result::Result<T, HeaderRead>;

/// Reads little-endian fields from a prefix of a file of `file_len` bytes.
struct Cursor<'b> {
    bytes: &'b [u8],
    at: u64,
    file_len: u64,
    /// Metadata values kept so far ([`MAX_KEPT_VALUES`]).
    kept: u64,
}

impl<'b> Cursor<'b> {
    fn take(&mut self, n: u64, what: &str) -> Parsed<&'b [u8]> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.file_len).ok_or_else(|| {
            gguf_error(
                "gguf_truncated",
                self.at,
                format!("{what} ({n} bytes) runs past the end of the {}-byte file", self.file_len),
            )
        })?;
        if end > MAX_HEADER {
            return Err(gguf_error(
                "gguf_header_too_large",
                self.at,
                format!("the header runs past {MAX_HEADER} bytes"),
            )
            .into());
        }
        if end > self.bytes.len() as u64 {
            return Err(HeaderRead::NeedMore { needed: end });
        }
        let taken = &self.bytes[self.at as usize..end as usize];
        self.at = end;
        Ok(taken)
    }

    fn u32(&mut self, what: &str) -> Parsed<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, what: &str) -> Parsed<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }

    /// A `gguf_string_t` of at most `max` bytes, valid UTF-8.
    fn string(&mut self, what: &str, max: u64) -> Parsed<String> {
        Ok(self.str(what, max)?.to_owned())
    }

    /// A `gguf_string_t` of at most `max` bytes, valid UTF-8, as it lies in the bytes read.
    fn str(&mut self, what: &str, max: u64) -> Parsed<&'b str> {
        let at = self.at;
        let len = self.u64(what)?;
        if len > max {
            return Err(gguf_error(
                "gguf_string_too_long",
                at,
                format!("{what} is {len} bytes, over the {max}-byte limit"),
            )
            .into());
        }
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes)
            .map_err(|_| gguf_error("gguf_string_utf8", at, format!("{what} is not valid UTF-8")).into())
    }

    /// A metadata value of type `value_type`, arrays `depth` deep so far, read and checked;
    /// returned when it is to be `kept` (an element of a long array is only checked).
    fn value(&mut self, value_type: ValueType, key: &str, depth: usize, keep: bool) -> Parsed<Option<MetaValue>> {
        let at = self.at;
        let fixed = |c: &mut Self, n: u64| -> Parsed<[u8; 8]> {
            let mut out = [0u8; 8];
            out[..n as usize].copy_from_slice(c.take(n, key)?);
            Ok(out)
        };
        let value = match value_type {
            ValueType::U8 => MetaValue::Int(fixed(self, 1)?[0].into()),
            ValueType::I8 => MetaValue::Int((fixed(self, 1)?[0] as i8).into()),
            ValueType::U16 => MetaValue::Int(u16::from_le_bytes(fixed(self, 2)?[..2].try_into().expect("2")).into()),
            ValueType::I16 => MetaValue::Int(i16::from_le_bytes(fixed(self, 2)?[..2].try_into().expect("2")).into()),
            ValueType::U32 => MetaValue::Int(u32::from_le_bytes(fixed(self, 4)?[..4].try_into().expect("4")).into()),
            ValueType::I32 => MetaValue::Int(i32::from_le_bytes(fixed(self, 4)?[..4].try_into().expect("4")).into()),
            ValueType::F32 => MetaValue::Float(f32::from_le_bytes(fixed(self, 4)?[..4].try_into().expect("4")).into()),
            ValueType::U64 => MetaValue::Int(u64::from_le_bytes(fixed(self, 8)?).into()),
            ValueType::I64 => MetaValue::Int(i64::from_le_bytes(fixed(self, 8)?).into()),
            ValueType::F64 => MetaValue::Float(f64::from_le_bytes(fixed(self, 8)?)),
            ValueType::Bool => match fixed(self, 1)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                other => {
                    return Err(
                        gguf_error("gguf_bool", at, format!("{key}: a bool is 0 or 1, not {other:#04x}")).into()
                    );
                }
            },
            ValueType::String => {
                let text = self.str(key, MAX_STRING)?;
                if !keep {
                    return Ok(None);
                }
                MetaValue::Text(text.to_owned())
            }
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    let detail = format!("{key}: arrays nest deeper than {MAX_ARRAY_DEPTH} levels");
                    return Err(gguf_error("gguf_array_too_deep", at, detail).into());
                }
                let type_id = self.u32(key)?;
                let of = ValueType::of(type_id).ok_or_else(|| {
                    gguf_error("gguf_value_type", at, format!("{key}: array of unknown value type {type_id}"))
                })?;
                let len = self.u64(key)?;
                if len > MAX_ARRAY {
                    let detail = format!("{key}: an array of {len} elements, over the {MAX_ARRAY}-element limit");
                    return Err(gguf_error("gguf_array_too_long", at, detail).into());
                }
                if let Some(width) = of.fixed_width() {
                    // Fixed-width elements: read and checked at once (bools must be 0 or 1).
                    let whole = len * width;
                    if len > KEPT_ARRAY {
                        let bytes = self.take(whole, key)?;
                        if of == ValueType::Bool {
                            if let Some(bad) = bytes.iter().position(|&b| b > 1) {
                                let detail = format!("{key}: bool element {bad} is {:#04x}, not 0 or 1", bytes[bad]);
                                return Err(gguf_error("gguf_bool", at, detail).into());
                            }
                        }
                        return Ok(keep.then_some(MetaValue::LongArray { of, len }));
                    }
                }
                // Each element takes at least one byte: a count beyond the file is refused
                // before anything is kept.
                if len > self.file_len.saturating_sub(self.at) {
                    let detail = format!("{key}: {len} elements cannot fit in the rest of the file");
                    return Err(gguf_error("gguf_truncated", at, detail).into());
                }
                let keep_items = keep && len <= KEPT_ARRAY && self.kept + len <= MAX_KEPT_VALUES;
                let mut items = Vec::with_capacity(if keep_items { len as usize } else { 0 });
                for _ in 0..len {
                    items.extend(self.value(of, key, depth + 1, keep_items)?);
                }
                if keep_items { MetaValue::Array(items) } else { MetaValue::LongArray { of, len } }
            }
        };
        if !keep {
            return Ok(None);
        }
        self.kept += 1;
        Ok(Some(value))
    }
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
struct Preamble {
    version: u32,
    tensor_count: u64,
    kv_count: u64,
}

/// The magic, the version and the counts, each bounded, and counts the file cannot hold refused
/// before anything is allocated for them.
fn read_preamble(c: &mut Cursor<'_>) -> Parsed<Preamble> {
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
fn alignment_of(metadata: &[KeyValue]) -> Result<u64> {
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

/// A tensor info as read, before it is placed: where it was read, its name, `ne`, type and
/// offset in the data.
type RawInfo = (u64, String, Vec<u64>, GgmlType, u64);

/// The `tensor_count` tensor infos: names distinct, ranks within ggml's, types known.
fn read_tensor_infos(c: &mut Cursor<'_>, tensor_count: u64) -> Parsed<Vec<RawInfo>> {
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

/// The padding from the end of the tensor infos to the data, at the next multiple of
/// `alignment`: inside the file and all 0x00, as the specification says. Where the data starts.
fn read_padding(c: &mut Cursor<'_>, alignment: u64) -> Parsed<u64> {
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

/// Each tensor placed in the file: shape in whole blocks, offset aligned, data inside the file
/// and overlapping no other tensor's; sorted by where it lies. Whether any is quantized.
fn place_tensors(
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

/// The keys a model requires: `general.architecture` (lowercase ASCII letters and digits) in a
/// whole file or a split model's first part, and `general.quantization_version` (a UINT32)
/// where tensors are quantized.
fn check_required_keys(metadata: &[KeyValue], first_part: bool, quantized: bool) -> Result<()> {
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

/// Whether the GGUF file at `path` is a model rather than one loaded beside a model (a
/// multimodal projector, an importance matrix, speculative-decoding heads), by llama.cpp's rule.
fn is_model_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    path.ends_with(".gguf")
        && !["mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"].iter().any(|sidecar| name.contains(sidecar))
}

/// The index among `paths` of the GGUF model file llama.cpp's `-hf REPO:TAG` takes: the first
/// whose path holds `TAG.` or `TAG-` (any case), a split model's first part only; for `latest`
/// (no tag), `Q4_K_M`, then `Q8_0`, then the first GGUF model file of any tag.
pub fn file_of_quantization_tag(paths: &[&str], tag: &str) -> Option<usize> {
    let is_first_part = |path: &str| {
        let name = path.rsplit('/').next().unwrap_or(path);
        split_name(name).is_none_or(|(_, part, _)| part == 1)
    };
    let candidates = || (0..paths.len()).filter(|&i| is_model_file(paths[i]) && is_first_part(paths[i]));
    let tags: &[&str] = if tag.is_empty() || tag == "latest" { &["Q4_K_M", "Q8_0"] } else { &[tag] };
    for tag in tags {
        let tag = tag.to_ascii_uppercase();
        let tagged = |i: &usize| {
            let upper = paths[*i].to_ascii_uppercase();
            upper.contains(&format!("{tag}.")) || upper.contains(&format!("{tag}-"))
        };
        if let Some(found) = candidates().find(tagged) {
            return Some(found);
        }
    }
    if tag.is_empty() || tag == "latest" { candidates().next() } else { None }
}

/// The index among `paths` of the first multimodal projector (`mmproj` in its name), which a
/// model's manifest names beside its GGUF file.
pub fn projector_file(paths: &[&str]) -> Option<usize> {
    paths.iter().position(|p| p.ends_with(".gguf") && p.rsplit('/').next().unwrap_or(p).contains("mmproj"))
}

/// The name parts of a split file: `(prefix, part, count)` of `prefix-00001-of-00003.gguf`
/// (1-based part, five digits each as the naming convention says).
pub fn split_name(name: &str) -> Option<(&str, u64, u64)> {
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, part) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if prefix.is_empty() || !digits(part) || !digits(count) {
        return None;
    }
    Some((prefix, part.parse().ok()?, count.parse().ok()?))
}

/// The file name of part `part` (1-based) of `count` of the split model `prefix`.
pub fn split_file_name(prefix: &str, part: u64, count: u64) -> String {
    format!("{prefix}-{part:05}-of-{count:05}.gguf")
}

/// The manifest of a GGUF model held in memory: one file, or a split model's parts in order
/// (each with its file name), every part's header parsed and the parts [`assemble`]d.
pub fn parse_model(parts: &[(&str, &[u8])]) -> Result<Manifest> {
    let mut headers = Vec::with_capacity(parts.len());
    for (name, bytes) in parts {
        let header = match parse_file(bytes) {
            Err(e) if parts.len() > 1 || split_name(name).is_some() => {
                return Err(FormatError::InShard { shard: (*name).to_owned(), error: Box::new(e) });
            }
            header => header?,
        };
        headers.push(((*name).to_owned(), header, bytes.len() as u64));
    }
    manifest_of(headers)
}

/// The manifest of a GGUF model from its files' headers, each `(file name, header, file
/// length)` in part order: a lone file not named as a part is its own model, anything else a
/// split model's parts, [`assemble`]d.
pub fn manifest_of(mut parts: Vec<(String, Header, u64)>) -> Result<Manifest> {
    if parts.len() == 1 && split_name(&parts[0].0).is_none() {
        let (_, header, file_len) = parts.pop().expect("one part");
        return header.into_manifest(file_len);
    }
    assemble(&parts.iter().map(|(name, header, len)| (name.as_str(), header, *len)).collect::<Vec<_>>())
}

/// One manifest of a split model's parts, each `(file name, header, file length)`, in part
/// order: every part present once, agreeing on the count, and the tensors together as many as
/// `split.tensors.count` says, each name once. Part 1's metadata is the model's.
pub fn assemble(parts: &[(&str, &Header, u64)]) -> Result<Manifest> {
    let count = parts.len() as u64;
    let mut objects = Vec::new();
    let mut names = std::collections::HashSet::new();
    let mut declared = None;
    let split_error = |detail: String| gguf_error("gguf_split", 0, detail);
    let mut first = None;
    for (index, &(name, header, file_len)) in parts.iter().enumerate() {
        let in_part = |e: FormatError| FormatError::InShard { shard: name.to_owned(), error: Box::new(e) };
        let Some(split) = header.split else {
            return Err(in_part(split_error("a part of a split model without split.* keys".into())));
        };
        if split.index != index as u64 || split.count != count {
            let detail = format!(
                "split.no {} of split.count {}, where part {} of {count} belongs",
                split.index,
                split.count,
                index + 1
            );
            return Err(in_part(split_error(detail)));
        }
        if *declared.get_or_insert(split.tensors) != split.tensors {
            return Err(in_part(split_error(format!("split.tensors.count {} differs from part 1's", split.tensors))));
        }
        for tensor in header.tensors.iter() {
            if !names.insert(tensor.name.clone()) {
                return Err(in_part(gguf_error(
                    "gguf_duplicate_tensor",
                    0,
                    format!("tensor {:?} is in two parts", tensor.name),
                )));
            }
        }
        objects.extend(header.tensors.iter().map(|t| t.clone().into_object(index)));
        if index == 0 {
            first = Some((header, file_len));
        }
    }
    if declared != Some(objects.len() as u64) {
        let detail =
            format!("split.tensors.count is {}, the parts hold {} tensors", declared.unwrap_or(0), objects.len());
        return Err(split_error(detail));
    }
    let (header, file_len) = first.ok_or_else(|| split_error("no parts".into()))?;
    let attributes = attributes(&header.metadata);
    Manifest::new(
        Container::Gguf,
        Some(header.version.to_string()),
        attributes,
        objects,
        0..header.data_start,
        file_len,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantization_tag_picks_the_gguf_file_llama_cpp_would() {
        let paths = [
            "README.md",
            "mmproj-tiny-F16.gguf",
            "tiny-IQ4_XS.gguf",
            "tiny-Q4_K_M-00002-of-00002.gguf",
            "tiny-Q4_K_M-00001-of-00002.gguf",
            "tiny-Q4_K_S.gguf",
            "tiny-Q8_0.gguf",
            "tiny.imatrix.gguf",
        ];
        let pick = |tag: &str| file_of_quantization_tag(&paths, tag).map(|i| paths[i]);
        assert_eq!(pick("Q4_K_M"), Some("tiny-Q4_K_M-00001-of-00002.gguf"));
        assert_eq!(pick("q4_k_s"), Some("tiny-Q4_K_S.gguf"));
        assert_eq!(pick("IQ4_XS"), Some("tiny-IQ4_XS.gguf"));
        assert_eq!(pick("latest"), Some("tiny-Q4_K_M-00001-of-00002.gguf"));
        assert_eq!(pick("F16"), None, "a projector is not a model");
        assert_eq!(pick("Q2_K"), None);
        assert_eq!(projector_file(&paths).map(|i| paths[i]), Some("mmproj-tiny-F16.gguf"));
        let only_q6 = ["x/tiny-Q6_K.gguf"];
        assert_eq!(file_of_quantization_tag(&only_q6, "latest"), Some(0), "no default tag: the first model");
        assert_eq!(file_of_quantization_tag(&only_q6, "Q8_0"), None);
    }

    fn code_of<T: std::fmt::Debug>(read: Parsed<T>) -> &'static str {
        match read {
            Err(HeaderRead::Invalid(e)) => e.code(),
            other => panic!("not an invalid header: {other:?}"),
        }
    }

    fn kv(key: &str, value_type: ValueType, value: MetaValue) -> KeyValue {
        KeyValue { key: key.into(), value_type, value }
    }

    #[test]
    fn the_preamble_bounds_the_counts_by_what_the_file_can_hold() {
        let preamble = |magic: &[u8; 4], version: u32, tensors: u64, kvs: u64, file_len: u64| {
            let mut bytes = magic.to_vec();
            bytes.extend(version.to_le_bytes());
            bytes.extend(tensors.to_le_bytes());
            bytes.extend(kvs.to_le_bytes());
            read_preamble(&mut Cursor { bytes: &bytes, at: 0, file_len, kept: 0 })
        };
        assert_eq!(
            preamble(MAGIC, 3, 1, 2, 24 + 13 * 2 + 29),
            Ok(Preamble { version: 3, tensor_count: 1, kv_count: 2 })
        );
        assert_eq!(code_of(preamble(b"GGUG", 3, 0, 0, 24)), "gguf_magic");
        assert_eq!(code_of(preamble(MAGIC, 3 << 24, 0, 0, 24)), "gguf_big_endian");
        assert_eq!(code_of(preamble(MAGIC, 1, 0, 0, 24)), "gguf_version");
        assert_eq!(code_of(preamble(MAGIC, 3, MAX_TENSORS + 1, 0, u64::MAX)), "gguf_too_many_tensors");
        assert_eq!(code_of(preamble(MAGIC, 3, 0, MAX_KVS + 1, u64::MAX)), "gguf_too_many_keys");
        assert_eq!(code_of(preamble(MAGIC, 3, 1, 2, 24 + 13 * 2 + 28)), "gguf_truncated");
        // A prefix too short asks for more.
        let short = read_preamble(&mut Cursor { bytes: b"GGUF", at: 0, file_len: 100, kept: 0 });
        assert!(matches!(short, Err(HeaderRead::NeedMore { .. })), "{short:?}");
    }

    #[test]
    fn the_alignment_is_a_uint32_power_of_two_multiple_of_eight_or_the_default() {
        let of = |kvs: Vec<KeyValue>| alignment_of(&kvs).map_err(|e| e.code());
        assert_eq!(of(vec![]), Ok(DEFAULT_ALIGNMENT));
        assert_eq!(of(vec![kv("general.alignment", ValueType::U32, MetaValue::Int(64))]), Ok(64));
        assert_eq!(of(vec![kv("general.alignment", ValueType::U32, MetaValue::Int(12))]), Err("gguf_alignment"));
        assert_eq!(of(vec![kv("general.alignment", ValueType::U64, MetaValue::Int(64))]), Err("gguf_alignment"));
    }

    #[test]
    fn the_padding_before_the_data_is_aligned_inside_the_file_and_zero() {
        // The infos end at 1; with an alignment of 4 the data starts at 4.
        let padding = |bytes: &[u8], file_len: u64| read_padding(&mut Cursor { bytes, at: 1, file_len, kept: 0 }, 4);
        assert_eq!(padding(&[9, 0, 0, 0], 8), Ok(4));
        assert_eq!(code_of(padding(&[9, 0, 7, 0], 8)), "gguf_padding");
        assert_eq!(code_of(padding(&[9, 0, 0, 0], 3)), "gguf_truncated");
    }

    #[test]
    fn tensors_are_placed_aligned_in_whole_blocks_inside_the_file_without_overlap() {
        let f32 = ggml_type(0).unwrap();
        let q8_0 = ggml_type(8).unwrap();
        let info =
            |name: &str, ne: &[u64], ggml: GgmlType, offset: u64| (0, name.to_owned(), ne.to_vec(), ggml, offset);
        let place = |infos: Vec<RawInfo>| place_tensors(infos, 32, 64, 64 + 256).map_err(|e| e.code());
        let (tensors, quantized) = place(vec![info("b", &[8], f32, 32), info("a", &[8], f32, 0)]).unwrap();
        assert_eq!(
            tensors.iter().map(|t| (t.name.as_str(), t.range.clone())).collect::<Vec<_>>(),
            [("a", 64..96), ("b", 96..128)]
        );
        assert!(!quantized);
        assert_eq!(place(vec![info("q", &[32, 2], q8_0, 0)]).map(|(_, q)| q), Ok(true));
        assert_eq!(place(vec![info("a", &[8], f32, 4)]), Err("gguf_misaligned"));
        assert_eq!(place(vec![info("a", &[16], f32, 0), info("b", &[8], f32, 32)]), Err("gguf_overlap"));
        assert_eq!(place(vec![info("a", &[8], f32, 256)]), Err("gguf_out_of_bounds"));
        assert_eq!(place(vec![info("q", &[31], q8_0, 0)]), Err("gguf_block"));
        assert_eq!(place(vec![info("a", &[u64::MAX, 2], f32, 0)]), Err("gguf_shape"));
    }

    #[test]
    fn a_model_names_its_architecture_and_quantized_tensors_their_quantization_version() {
        let arch = |name: &str| kv("general.architecture", ValueType::String, MetaValue::Text(name.into()));
        let version = kv("general.quantization_version", ValueType::U32, MetaValue::Int(2));
        let check = |kvs: &[KeyValue], first: bool, quantized: bool| {
            check_required_keys(kvs, first, quantized).map_err(|e| e.code())
        };
        assert_eq!(check(&[arch("llama")], true, false), Ok(()));
        assert_eq!(check(&[arch("Llama")], true, false), Err("gguf_architecture"));
        assert_eq!(check(&[], true, false), Err("gguf_architecture"));
        // A later part of a split model need not repeat them.
        assert_eq!(check(&[], false, true), Ok(()));
        assert_eq!(check(&[arch("llama")], true, true), Err("gguf_quantization_version"));
        assert_eq!(check(&[arch("llama"), version], true, true), Ok(()));
    }

    fn code(file: &[u8]) -> &'static str {
        match parse_file(file).and_then(|h| h.into_manifest(file.len() as u64)) {
            Ok(_) => "ok",
            Err(e) => e.code(),
        }
    }

    fn good() -> FileBuilder {
        FileBuilder::new("llama")
            .kv_u32("general.quantization_version", 2)
            .tensor("token_embd.weight", &[64, 3], 8)
            .tensor("output_norm.weight", &[64], 0)
    }

    fn u64s(values: &[u64]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn a_good_file_becomes_a_manifest_with_row_major_shapes_and_block_geometry() {
        let file = good()
            .kv(
                "tokenizer.ggml.tokens",
                9,
                [8u32.to_le_bytes().to_vec(), u64s(&[100])]
                    .concat()
                    .into_iter()
                    .chain((0..100).flat_map(|i| string_bytes(format!("t{i}").as_bytes())))
                    .collect(),
            )
            .build();
        let manifest = parse_file(&file).unwrap().into_manifest(file.len() as u64).unwrap();
        assert_eq!(manifest.container, Container::Gguf);
        assert_eq!(manifest.version.as_deref(), Some("3"));
        let q = manifest.object("token_embd.weight").unwrap();
        assert_eq!((q.shape.clone(), q.format.as_str()), (vec![3, 64], "gguf.q8_0/1"));
        assert_eq!(q.components[0].logical_type.as_deref(), Some("gguf.q8_0"));
        assert_eq!(q.components[0].stored_length, 3 * 2 * 34);
        let norm = manifest.object("output_norm.weight").unwrap();
        assert_eq!((norm.format.as_str(), norm.components[0].dtype), ("dense", DType::F32));
        let json = crate::json::manifest_json(&manifest);
        assert_eq!(
            json["attributes"]["tokenizer.ggml.tokens"],
            serde_json::json!({"array_of": "STRING", "length": 100})
        );
        assert_eq!(json["attributes"]["general.architecture"], "llama");
    }

    #[test]
    fn a_header_read_in_pieces_asks_for_exactly_what_it_lacks() {
        let file = good().kv("general.description", 8, string_bytes(&[b'x'; 5000])).build();
        let reads = HeaderReads { file_len: file.len() as u64 };
        let mut held = reads.first(64).end;
        let mut steps = 0;
        let header = loop {
            match parse_header(&file[..held as usize], file.len() as u64) {
                Ok(header) => break header,
                Err(HeaderRead::NeedMore { needed }) => {
                    assert!(needed > held && needed <= file.len() as u64);
                    held = reads.next(held, needed).end;
                    steps += 1;
                }
                Err(HeaderRead::Invalid(e)) => panic!("{e}"),
            }
        };
        assert_eq!(header, parse_file(&file).unwrap());
        assert!(steps <= 4, "{steps}");
    }

    #[test]
    fn every_rule_of_the_specification_is_refused_with_its_own_code() {
        let mut bad_magic = good();
        bad_magic.magic = *b"GGML";
        let mut v1 = good();
        v1.version = 1;
        let mut v4 = good();
        v4.version = 4;
        let mut big_endian = good();
        big_endian.version = 3u32.swap_bytes();
        let mut many_tensors = good();
        many_tensors.counts = Some((MAX_TENSORS + 1, 3));
        let mut many_keys = good();
        many_keys.counts = Some((2, u64::MAX));
        let mut unfit = good();
        unfit.counts = Some((100_000, 2));
        let mut dirty_padding = good();
        dirty_padding.padding = 0xAA;
        let mut cut = good().build();
        cut.truncate(40);
        let nested = |depth: usize| {
            let mut value = [4u32.to_le_bytes().to_vec(), u64s(&[0])].concat();
            for _ in 0..depth {
                value = [9u32.to_le_bytes().to_vec(), u64s(&[1]), value].concat();
            }
            value
        };
        let no_arch = {
            let mut b = good();
            b.kvs.remove(0);
            b
        };
        let misaligned = {
            let mut b = good();
            b.tensors[1].3 += 4;
            b
        };
        let overlapping = {
            let mut b = good();
            b.tensors[1].3 = 0;
            b
        };
        let beyond = {
            let mut b = good();
            b.tensors[1].3 = 1 << 20;
            b
        };
        let overflowing = {
            let mut b = good();
            b.tensors[1].3 = u64::MAX - 31;
            b
        };
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("good", good().build(), "ok"),
            ("magic", bad_magic.build(), "gguf_magic"),
            ("version 1", v1.build(), "gguf_version"),
            ("version 4", v4.build(), "gguf_version"),
            ("big-endian", big_endian.build(), "gguf_big_endian"),
            ("too many tensors", many_tensors.build(), "gguf_too_many_tensors"),
            ("too many keys", many_keys.build(), "gguf_too_many_keys"),
            ("counts beyond the file", unfit.build(), "gguf_truncated"),
            ("cut in the header", cut, "gguf_truncated"),
            ("key case", good().kv_u32("General.Alignment", 32).build(), "gguf_key"),
            ("key segment", good().kv_u32("general..x", 32).build(), "gguf_key"),
            ("key not ascii", good().kv_u32("général.x", 32).build(), "gguf_key"),
            ("duplicate key", good().kv_u32("a.b", 1).kv_u32("a.b", 2).build(), "gguf_duplicate_key"),
            ("value type", good().kv("a.b", 13, vec![0; 8]).build(), "gguf_value_type"),
            ("bool", good().kv("a.b", 7, vec![2]).build(), "gguf_bool"),
            (
                "long bool array",
                good().kv("a.b", 9, [7u32.to_le_bytes().to_vec(), u64s(&[100]), vec![0; 99], vec![3]].concat()).build(),
                "gguf_bool",
            ),
            ("string length", good().kv("a.b", 8, u64s(&[1 << 62])).build(), "gguf_string_too_long"),
            ("string utf-8", good().kv("a.b", 8, string_bytes(&[0xff, 0xfe])).build(), "gguf_string_utf8"),
            (
                "array length",
                good().kv("a.b", 9, [8u32.to_le_bytes().to_vec(), u64s(&[u64::MAX])].concat()).build(),
                "gguf_array_too_long",
            ),
            (
                "array beyond file",
                good().kv("a.b", 9, [8u32.to_le_bytes().to_vec(), u64s(&[1 << 20])].concat()).build(),
                "gguf_truncated",
            ),
            ("array depth", good().kv("a.b", 9, nested(MAX_ARRAY_DEPTH)).build(), "gguf_array_too_deep"),
            ("array depth within", good().kv("a.b", 9, nested(MAX_ARRAY_DEPTH - 1)).build(), "ok"),
            (
                "array type",
                good().kv("a.b", 9, [77u32.to_le_bytes().to_vec(), u64s(&[0])].concat()).build(),
                "gguf_value_type",
            ),
            ("alignment 0", good().kv_u32("general.alignment", 0).build(), "gguf_alignment"),
            ("alignment 12", good().kv_u32("general.alignment", 12).build(), "gguf_alignment"),
            ("alignment 4", good().kv_u32("general.alignment", 4).build(), "gguf_alignment"),
            ("alignment type", good().kv("general.alignment", 10, u64s(&[32])).build(), "gguf_alignment"),
            ("no architecture", no_arch.build(), "gguf_architecture"),
            ("architecture case", FileBuilder::new("Llama").build(), "gguf_architecture"),
            (
                "no quantization version",
                FileBuilder::new("llama").tensor("q", &[32], 2).build(),
                "gguf_quantization_version",
            ),
            (
                "quantization version type",
                FileBuilder::new("llama").kv("general.quantization_version", 10, u64s(&[2])).build(),
                "gguf_quantization_version",
            ),
            ("tensor name", good().tensor(&"n".repeat(65), &[4], 0).build(), "gguf_string_too_long"),
            ("duplicate tensor", good().tensor("output_norm.weight", &[4], 0).build(), "gguf_duplicate_tensor"),
            ("rank", good().tensor("r", &[1, 1, 1, 1, 1], 0).build(), "gguf_rank"),
            (
                "removed type",
                {
                    let mut b = good();
                    b.tensors[1].2 = 4;
                    b.build()
                },
                "gguf_tensor_type",
            ),
            (
                "unknown type",
                {
                    let mut b = good();
                    b.tensors[1].2 = 99;
                    b.build()
                },
                "gguf_tensor_type",
            ),
            (
                "shape overflow",
                {
                    let mut b = good();
                    b.tensors[1].1 = vec![1 << 32, 1 << 32, 4];
                    b.build()
                },
                "gguf_shape",
            ),
            (
                "partial block",
                {
                    let mut b = good();
                    b.tensors[0].1 = vec![48, 2];
                    b.build()
                },
                "gguf_block",
            ),
            ("misaligned", misaligned.build(), "gguf_misaligned"),
            ("overlap", overlapping.build(), "gguf_overlap"),
            ("beyond the file", beyond.build(), "gguf_out_of_bounds"),
            ("offset overflow", overflowing.build(), "gguf_out_of_bounds"),
            ("padding", dirty_padding.build(), "gguf_padding"),
            (
                "split of one",
                good()
                    .kv("split.no", 2, vec![0, 0])
                    .kv("split.count", 2, vec![1, 0])
                    .kv("split.tensors.count", 5, vec![2, 0, 0, 0])
                    .build(),
                "ok",
            ),
            (
                "split of two",
                good()
                    .kv("split.no", 2, vec![0, 0])
                    .kv("split.count", 2, vec![2, 0])
                    .kv("split.tensors.count", 5, vec![4, 0, 0, 0])
                    .build(),
                "gguf_split",
            ),
            (
                "split part",
                good()
                    .kv("split.no", 2, vec![2, 0])
                    .kv("split.count", 2, vec![2, 0])
                    .kv("split.tensors.count", 5, vec![4, 0, 0, 0])
                    .build(),
                "gguf_split",
            ),
            ("split keys", good().kv("split.no", 2, vec![0, 0]).build(), "gguf_split"),
        ];
        for (name, file, expected) in cases {
            assert_eq!(code(&file), expected, "{name}");
        }
    }

    #[test]
    fn split_parts_are_one_model_only_when_every_part_agrees() {
        let part = |no: u16, count: u16, total: i32, names: &[&str]| {
            let builder = FileBuilder::new("llama").kv_u32("general.quantization_version", 2).split(no, count, total);
            names.iter().fold(builder, |b, name| b.tensor(name, &[32, 2], 8)).build()
        };
        let (a, b) = (part(0, 2, 3, &["x", "y"]), part(1, 2, 3, &["z"]));
        let parts = [("m-00001-of-00002.gguf", &a[..]), ("m-00002-of-00002.gguf", &b[..])];
        let manifest = parse_model(&parts).unwrap();
        assert_eq!(
            manifest.objects.iter().map(|o| (o.name.as_str(), o.components[0].file)).collect::<Vec<_>>(),
            [("x", 0), ("y", 0), ("z", 1)]
        );
        let code_of = |parts: &[(&str, &[u8])]| parse_model(parts).map(drop).map_err(|e| e.code());
        let wrong_total = part(1, 2, 4, &["z"]);
        assert_eq!(code_of(&[parts[0], ("m-00002-of-00002.gguf", &wrong_total)]), Err("gguf_split"));
        let twice = part(1, 2, 3, &["y"]);
        assert_eq!(code_of(&[parts[0], ("m-00002-of-00002.gguf", &twice)]), Err("gguf_duplicate_tensor"));
        assert_eq!(code_of(&[parts[1], parts[0]]), Err("gguf_split"));
        assert_eq!(code_of(&parts[..1]), Err("gguf_split"));
    }

    #[test]
    fn arrays_of_short_arrays_keep_a_bounded_number_of_values() {
        // 64 arrays of 64 arrays of 64 bytes: 262,144 values, in about 300 KiB.
        let bytes_array = [0u32.to_le_bytes().to_vec(), u64s(&[64]), vec![7; 64]].concat();
        let level = |inner: &[u8]| [9u32.to_le_bytes().to_vec(), u64s(&[64]), inner.repeat(64)].concat();
        let value = [9u32.to_le_bytes().to_vec(), u64s(&[64]), level(&bytes_array).repeat(64)].concat();
        let file = good().kv("a.b", 9, value).build();
        let header = parse_file(&file).unwrap();
        fn count(value: &MetaValue) -> u64 {
            match value {
                MetaValue::Array(items) => 1 + items.iter().map(count).sum::<u64>(),
                _ => 1,
            }
        }
        let kept: u64 = header.metadata.iter().map(|kv| count(&kv.value)).sum();
        assert!(kept <= MAX_KEPT_VALUES + 64 * 64, "{kept} values kept");
        let MetaValue::Array(outer) = &header.get("a.b").unwrap() else { panic!("kept whole at the top") };
        assert!(outer.iter().any(|inner| matches!(inner, MetaValue::LongArray { len: 64, .. })), "summarised");
    }

    #[test]
    fn split_names_are_five_digit_parts_of_five_digit_counts() {
        assert_eq!(split_name("Grok-100B-v1.0-Q4_0-00003-of-00009.gguf"), Some(("Grok-100B-v1.0-Q4_0", 3, 9)));
        assert_eq!(split_name("m-1-of-2.gguf"), None);
        assert_eq!(split_name("-00001-of-00002.gguf"), None);
        assert_eq!(split_name("m-00001-of-00002.safetensors"), None);
        assert_eq!(split_file_name("m", 2, 3), "m-00002-of-00003.gguf");
    }

    #[test]
    fn every_type_has_the_geometry_of_ggml_and_a_round_trip_name() {
        assert_eq!(TYPES.iter().map(|t| t.id).collect::<std::collections::HashSet<_>>().len(), TYPES.len());
        let q4_k = ggml_type(12).unwrap();
        assert_eq!((q4_k.block_elements, q4_k.block_bytes), (256, 144));
        assert_eq!(quantized_type(&q4_k.logical_type()), Some(q4_k));
        assert_eq!(quantized_type("gguf.f32"), None);
        assert_eq!(ggml_type(30).unwrap().dense, Some(DType::BF16));
    }
}
