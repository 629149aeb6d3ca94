//! The generation-neutral model every container's parser produces: a [`Manifest`] of named
//! [`Object`]s, each made of [`Component`]s with their [`DType`], [`Encoding`], [`ByteOrder`] and
//! optional [`Digest`], plus v2's [`Shard`]s and the 1.x logical types this reader knows.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

use crate::{Container, FormatError, Result, Value};

/// The storage types: v2's 12 primitives, and 1.x's `bool` (a logical type over `u8` in v2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    Bool,
}

impl DType {
    pub const ALL: [DType; 13] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U64,
        DType::U32,
        DType::U16,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn width(self) -> u64 {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// The 1.x name (`f32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U64 => "u64",
            DType::U32 => "u32",
            DType::U16 => "u16",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    /// The 0.1 name (`float32`).
    pub fn legacy_name(self) -> &'static str {
        match self {
            DType::F64 => "float64",
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::I16 => "int16",
            DType::I8 => "int8",
            DType::U64 => "uint64",
            DType::U32 => "uint32",
            DType::U16 => "uint16",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    pub fn from_legacy_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.legacy_name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a component's bytes are stored.
/// The name of v2's one registered encoding profile, [`Encoding::ZstdSeekable`] (v2 re-exports it).
pub const ZSTD_SEEKABLE: &str = "zt.zstd-seekable/1";

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Encoding {
    Raw,
    /// One zstd frame (0.1 and 1.x).
    Zstd,
    /// v2's `zt.zstd-seekable/1`: independent frames and a seek table ([`seekable`](crate::seekable)).
    ZstdSeekable,
    /// A v2 encoding profile this reader does not know: its stored bytes are served as they
    /// are, never decoded by guess.
    Unregistered(Box<str>),
}

impl Encoding {
    pub fn name(&self) -> &str {
        match self {
            Encoding::Raw => "raw",
            Encoding::Zstd => "zstd",
            Encoding::ZstdSeekable => ZSTD_SEEKABLE,
            Encoding::Unregistered(name) => name,
        }
    }

    /// Whether this reader can decode it.
    pub fn is_known(&self) -> bool {
        !matches!(self, Encoding::Unregistered(_))
    }
}

/// Byte order of the stored elements. Only legacy files can say `Big`; every byte this crate
/// hands out is little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByteOrder {
    Little,
    Big,
}

/// A declared checksum of a component's bytes (which ones: [`DigestScope`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Digest {
    Crc32c(u32),
    Sha256([u8; 32]),
    /// XXH3-64 (v2).
    Xxh3(u64),
    /// A v2 digest of an algorithm this reader cannot compute, kept as declared.
    Unregistered(Box<str>),
}

impl Digest {
    pub fn algorithm(&self) -> &'static str {
        match self {
            Digest::Crc32c(_) => "crc32c",
            Digest::Sha256(_) => "sha256",
            Digest::Xxh3(_) => "xxh3",
            Digest::Unregistered(_) => "unregistered",
        }
    }

    /// Whether this reader can compute it.
    pub fn is_verifiable(&self) -> bool {
        !matches!(self, Digest::Unregistered(_))
    }

    /// Parses `crc32c:0x1234ABCD` (hex in either case) or `sha256:<64 hex digits>`.
    pub fn parse(text: &str) -> Option<Digest> {
        let (algorithm, value) = text.split_once(':')?;
        match algorithm {
            "crc32c" => {
                let hex = value.strip_prefix("0x").or_else(|| value.strip_prefix("0X"))?;
                if hex.len() != 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return None;
                }
                u32::from_str_radix(hex, 16).ok().map(Digest::Crc32c)
            }
            "sha256" => {
                let mut out = [0u8; 32];
                hex::decode_to_slice(value, &mut out).ok()?;
                Some(Digest::Sha256(out))
            }
            _ => None,
        }
    }
}

impl fmt::Display for Digest {
    /// The canonical form the official writers emit.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Digest::Crc32c(v) => write!(f, "crc32c:0x{v:08X}"),
            Digest::Sha256(v) => write!(f, "sha256:{}", hex::encode(v)),
            Digest::Xxh3(v) => write!(f, "xxh3:{v:016x}"),
            Digest::Unregistered(text) => f.write_str(text),
        }
    }
}

/// Which bytes a digest covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DigestScope {
    /// The bytes as stored (1.x: the compressed bytes of a zstd component).
    Stored,
    /// The decoded bytes (v2), whatever the encoding.
    Decoded,
}

/// A v2 shard: another file holding some of a model's blobs, known by its size and digest.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    /// A label (`[A-Za-z0-9._-]`, 1..64 bytes), never a path.
    pub name: String,
    pub size: u64,
    /// Of the whole file.
    pub digest: Digest,
}

/// The 1.x logical types whose size rule and storage dtype the spec defines. Any other `type`
/// string is kept as is and its bytes are served by their dtype. (v2's: [`v2::logical_size`](crate::v2::logical_size).)
pub fn known_logical_type(name: &str) -> Option<(DType, u64)> {
    match name {
        "f8_e4m3fn" | "f8_e5m2" | "f8_e4m3fnuz" | "f8_e5m2fnuz" => Some((DType::U8, 1)),
        "complex64" => Some((DType::F32, 2)),
        "complex128" => Some((DType::F64, 2)),
        _ => None,
    }
}

/// One contiguous blob of an object.
#[derive(Debug, Clone, PartialEq)]
pub struct Component {
    /// Role name within its object (`data`, `values`, `scales`, …).
    pub role: String,
    pub dtype: DType,
    /// Logical type (`type`), when declared.
    pub logical_type: Option<String>,
    /// Absolute offset of the stored bytes in the file.
    pub offset: u64,
    /// Stored bytes (compressed size for zstd).
    pub stored_length: u64,
    pub encoding: Encoding,
    /// Bytes after decoding, declared or derived from the shape.
    pub decoded_length: u64,
    pub digest: Option<Digest>,
    pub digest_scope: DigestScope,
    pub byte_order: ByteOrder,
    /// Which of the model's stored files holds the stored bytes (`offset` is in that file):
    /// 0, the file holding the manifest, for every 0.1 and 1.x component.
    pub file: usize,
}

impl Component {
    /// A component whose bytes are `range` of file `file` as they are (raw, little-endian, no
    /// declared digest): how safetensors and GGUF tensors are held.
    pub fn stored_as_is(
        role: &str,
        dtype: DType,
        logical_type: Option<String>,
        range: Range<u64>,
        file: usize,
    ) -> Component {
        let length = range.end - range.start;
        Component {
            role: role.into(),
            dtype,
            logical_type,
            offset: range.start,
            stored_length: length,
            encoding: Encoding::Raw,
            decoded_length: length,
            digest: None,
            digest_scope: DigestScope::Stored,
            byte_order: ByteOrder::Little,
            file,
        }
    }

    /// The stored bytes' range in the file.
    pub fn stored_range(&self) -> Range<u64> {
        self.offset..self.offset + self.stored_length
    }

    /// Storage elements per logical element (2 for complex types, 1 otherwise).
    pub fn logical_ratio(&self) -> u64 {
        self.logical_type.as_deref().and_then(known_logical_type).map_or(1, |(_, ratio)| ratio)
    }

    /// Whether the served bytes are exactly the stored bytes (no decoding, no byte swap).
    pub fn is_verbatim(&self) -> bool {
        self.encoding == Encoding::Raw && !self.needs_swap()
    }

    /// Whether decoding byte-swaps (big-endian legacy data wider than a byte).
    pub fn needs_swap(&self) -> bool {
        self.byte_order == ByteOrder::Big && self.dtype.width() > 1
    }

    /// Whether the stored bytes are zstd frames of exactly the served bytes (a seekable
    /// stream's table is a skippable frame every zstd decoder passes over), so a client that
    /// accepts zstd can be sent them as they are.
    pub fn is_zstd_of_served_bytes(&self) -> bool {
        matches!(self.encoding, Encoding::Zstd | Encoding::ZstdSeekable) && !self.needs_swap()
    }
}

/// A named tensor: a shape, a format and its components.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    pub name: String,
    pub shape: Vec<u64>,
    /// `dense`, `sparse_csr`, `sparse_coo`, `quantized_group`, or any custom string.
    pub format: String,
    pub attributes: Option<Value>,
    /// In manifest order.
    pub components: Vec<Component>,
}

impl Object {
    pub fn component(&self, role: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.role == role)
    }

    /// Product of the shape (1 for a scalar), or `None` on overflow.
    pub fn element_count(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }
}

/// A parsed, structurally validated manifest, independent of the container generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub container: Container,
    /// The manifest's `version` string (`"2"` for v2); `None` for legacy files, which have none.
    pub version: Option<String>,
    pub attributes: Option<Value>,
    /// In manifest order.
    pub objects: Vec<Object>,
    /// Where the manifest sits in the file; component bytes all lie before it.
    pub manifest_span: Range<u64>,
    pub file_len: u64,
    /// v2's shard table, by name; a component in shard `i` has `file == i + 1`.
    pub shards: Vec<Shard>,
    by_name: HashMap<String, usize>,
}

impl Manifest {
    pub(crate) fn new(
        container: Container,
        version: Option<String>,
        attributes: Option<Value>,
        objects: Vec<Object>,
        manifest_span: Range<u64>,
        file_len: u64,
    ) -> Result<Manifest> {
        let mut by_name = HashMap::with_capacity(objects.len());
        for (index, object) in objects.iter().enumerate() {
            if by_name.insert(object.name.clone(), index).is_some() {
                return Err(FormatError::DuplicateObject { name: object.name.clone() });
            }
        }
        Ok(Manifest { container, version, attributes, objects, manifest_span, file_len, shards: Vec::new(), by_name })
    }

    pub fn object(&self, name: &str) -> Option<&Object> {
        self.by_name.get(name).map(|&i| &self.objects[i])
    }

    /// Where object `name` is in `objects`.
    pub fn object_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
}

/// Where each blob of a planned file goes and what follows the last one: what the 1.2 writer's
/// [`plan`](crate::write::plan) and v2's [`plan`](crate::v2::plan) both give, so it is neither's.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// For each object, for each component, its offset in the file.
    pub offsets: Vec<Vec<u64>>,
    /// Where the tail starts; the file is `tail_offset + tail.len()` bytes.
    pub tail_offset: u64,
    /// What follows the blobs: the manifest and the generation's trailer.
    pub tail: Vec<u8>,
}
