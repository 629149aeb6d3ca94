//! The zTensor byte layout, and nothing else: bytes in, typed values out. This crate owns the
//! container framing of every supported generation (`ZTEN0001` legacy, `ZTEN1000` 1.x, v2), turns
//! each into one generation-neutral [`Manifest`], validates it, decodes components and writes
//! files. It does no IO and never touches async code, so the server, the CLI and the fuzzer all
//! share exactly the same rules.
//!
//! Reading is split so that a remote reader fetches only what it needs, whatever does the
//! reading: [`ManifestReads`] names the header and tail reads, then the one read a large
//! manifest may still need, and parses what they brought. [`parse_file`] does it all over a
//! whole file in memory.

#![forbid(unsafe_code)]

mod cbor;
pub mod decode;
mod error;
pub mod gguf;
pub mod json;
mod legacy;
pub mod model_signature;
pub mod safetensors;
pub mod seekable;
pub mod slice;
pub mod sums;
mod v1;
pub mod v2;
pub mod validate;
pub mod verify;
pub mod view;
pub mod write;

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

pub use ciborium::Value;
pub use error::{FormatError, Location, Result};
/// What a published repository's files say of a block-quantized model, by capability: the file
/// of a quantization tag, the multimodal projector beside it, and a tensor's quantization.
pub use gguf::{
    GgmlType, file_of_quantization_tag, projector_file, quantized_object as quantization_of,
    quantized_type as quantization_of_type,
};

/// The magic of the 0.1 container (`ZTEN0001`): no footer, a CBOR array index.
pub const LEGACY_MAGIC: &[u8; 8] = b"ZTEN0001";
/// The magic of the 1.x container (`ZTEN1000`), repeated as the footer.
pub const V1_MAGIC: &[u8; 8] = b"ZTEN1000";
/// The magic of the zTensor v2 container, repeated at the end of its footer.
pub const V2_MAGIC: &[u8; 8] = b"\x89ZT2\r\n\x1a\n";
/// Size of the magic header every container starts with.
pub const HEADER_LEN: u64 = 8;
/// Every component blob starts at a multiple of this.
pub const ALIGNMENT: u64 = 64;

/// Which container generation a file uses. New generations add a variant here and a parser
/// module producing the same [`Manifest`]; callers do not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Container {
    /// zTensor 0.1: `ZTEN0001`, CBOR array index, u64 LE index size at EOF.
    Legacy01,
    /// zTensor 1.x: `ZTEN1000` header and footer, CBOR map manifest.
    V1,
    /// zTensor v2: 40-byte footer with a hashed, deterministic-CBOR manifest, 4096-aligned
    /// blobs, optional shards.
    V2,
    /// A safetensors file, or a checkpoint of several under a `.safetensors.index.json`
    /// ([`safetensors`]): no magic, found by its name.
    Safetensors,
    /// A GGUF file, or a split model of several ([`gguf`]): found by its name.
    Gguf,
}

impl Container {
    /// Whether a model of this container is published as its stored files, which its loaders
    /// read as they are, rather than as its safetensors view (which would hold only its dense
    /// tensors).
    pub fn publishes_stored_files(self) -> bool {
        self == Container::Gguf
    }

    /// The format of the weights a published model of this container holds, as the Hub tags
    /// its repository and ModelPack's `config.format` names it.
    pub fn published_weights_format(self) -> &'static str {
        if self.publishes_stored_files() { "gguf" } else { "safetensors" }
    }

    /// Identifies the container from the first 8 bytes of a file.
    pub fn sniff(head: &[u8]) -> Result<Container> {
        let magic = head.get(..8).ok_or(FormatError::Truncated { len: head.len() as u64, min: 8 })?;
        match magic {
            m if m == LEGACY_MAGIC => Ok(Container::Legacy01),
            m if m == V1_MAGIC => Ok(Container::V1),
            m if m == V2_MAGIC => Ok(Container::V2),
            m => Err(FormatError::BadHeaderMagic { found: printable(m) }),
        }
    }

    /// Bytes of the trailer that locates the manifest: the size field, plus the footer magic
    /// for 1.x; v2's whole footer.
    pub fn trailer_len(self) -> u64 {
        match self {
            Container::Legacy01 => 8,
            Container::V1 => 16,
            Container::V2 => v2::FOOTER_LEN,
            Container::Safetensors | Container::Gguf => 0,
        }
    }

    /// The smallest file this container can describe.
    pub fn min_file_len(self) -> u64 {
        match self {
            // Header, at least one manifest byte, trailer.
            Container::Legacy01 | Container::V1 => HEADER_LEN + 1 + self.trailer_len(),
            // Header and footer: a data shard holds nothing else.
            Container::V2 => HEADER_LEN + v2::FOOTER_LEN,
            Container::Safetensors => safetensors::LENGTH_FIELD,
            // The magic, the version and the two counts.
            Container::Gguf => 24,
        }
    }

    /// The short name the HTTP API lists (`zt-0.1`, `zt-1`, `zt-2`).
    pub fn id(self) -> &'static str {
        match self {
            Container::Legacy01 => "zt-0.1",
            Container::V1 => "zt-1",
            Container::V2 => "zt-2",
            Container::Safetensors => "safetensors",
            Container::Gguf => "gguf",
        }
    }
}

impl fmt::Display for Container {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Container::Legacy01 => "ZTEN0001 (0.1)",
            Container::V1 => "ZTEN1000 (1.x)",
            Container::V2 => "zTensor v2",
            Container::Safetensors => "safetensors",
            Container::Gguf => "GGUF",
        })
    }
}

/// What a stored file is, by its name: the kinds of file a source lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// `*.zt`: any zTensor generation, told apart by its magic.
    Zt,
    /// `*.safetensors`.
    Safetensors,
    /// `*.safetensors.index.json`: a sharded safetensors checkpoint's index.
    SafetensorsIndex,
    /// `*.gguf`: a GGUF file, or a part of a split model (`name-00001-of-00003.gguf`).
    Gguf,
}

impl FileKind {
    pub const SAFETENSORS_INDEX_SUFFIX: &'static str = ".safetensors.index.json";

    /// The kind of the file named `key` (a path or a bare name), if it is one a source lists.
    pub fn of(key: &str) -> Option<FileKind> {
        let name = key.rsplit('/').next().unwrap_or(key);
        if name.len() > Self::SAFETENSORS_INDEX_SUFFIX.len() && name.ends_with(Self::SAFETENSORS_INDEX_SUFFIX) {
            Some(FileKind::SafetensorsIndex)
        } else if name.len() > ".safetensors".len() && name.ends_with(".safetensors") {
            Some(FileKind::Safetensors)
        } else if name.len() > ".zt".len() && name.ends_with(".zt") {
            Some(FileKind::Zt)
        } else if name.len() > ".gguf".len() && name.ends_with(".gguf") {
            Some(FileKind::Gguf)
        } else {
            None
        }
    }
}

/// Limits that bound the work and memory a hostile file can cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest manifest accepted, in bytes.
    pub max_manifest_bytes: u64,
    /// Largest decoded size of one component, in bytes.
    pub max_decoded_bytes: u64,
    /// Deepest CBOR nesting accepted in a manifest.
    pub max_cbor_depth: usize,
    /// Most CBOR items (every scalar, string, array and map) in one manifest; bounds the
    /// memory of the decoded tree, which is larger per item than the encoded bytes.
    pub max_cbor_items: u64,
}

impl Limits {
    /// The defaults, usable in constant expressions.
    pub const DEFAULT: Limits = Limits {
        max_manifest_bytes: 1 << 30,
        max_decoded_bytes: 64 << 30,
        max_cbor_depth: 64,
        max_cbor_items: 8_000_000,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Encoding {
    Raw,
    /// One zstd frame (0.1 and 1.x).
    Zstd,
    /// v2's `zt.zstd-seekable/1`: independent frames and a seek table ([`seekable`]).
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
            Encoding::ZstdSeekable => v2::ZSTD_SEEKABLE,
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
/// string is kept as is and its bytes are served by their dtype. (v2's: [`v2::logical_size`].)
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

/// Finds the manifest from the file length and the file's last bytes (at least the trailer, or
/// the whole file when shorter). Checks the footer, the size field and the size limit. Returns
/// the manifest hash v2 declares.
fn manifest_span(
    container: Container,
    file_len: u64,
    tail: &[u8],
    limits: &Limits,
) -> Result<(Range<u64>, Option<u64>)> {
    if container == Container::V2 {
        let footer = v2::Footer::read(file_len, tail)?;
        return Ok((footer.manifest_span(file_len, limits)?, Some(footer.manifest_hash)));
    }
    if file_len < container.min_file_len() {
        return Err(FormatError::Truncated { len: file_len, min: container.min_file_len() });
    }
    let trailer_len = container.trailer_len() as usize;
    let trailer = tail
        .len()
        .checked_sub(trailer_len)
        .map(|start| &tail[start..])
        .ok_or(FormatError::Truncated { len: tail.len() as u64, min: trailer_len as u64 })?;
    if container == Container::V1 && &trailer[8..16] != V1_MAGIC {
        return Err(FormatError::BadFooterMagic { found: printable(&trailer[8..16]) });
    }
    let size = u64::from_le_bytes(trailer[..8].try_into().expect("8 bytes"));
    if size == 0 {
        return Err(FormatError::ManifestEmpty);
    }
    if size > limits.max_manifest_bytes {
        return Err(FormatError::ManifestTooLarge { size, limit: limits.max_manifest_bytes });
    }
    let available = file_len - HEADER_LEN - trailer_len as u64;
    if size > available {
        return Err(FormatError::ManifestBeyondFile { size, available });
    }
    let end = file_len - trailer_len as u64;
    Ok((end - size..end, None))
}

/// Decodes and structurally validates a manifest found at `span` in a file of `file_len` bytes.
fn parse_manifest(
    container: Container,
    bytes: &[u8],
    span: Range<u64>,
    file_len: u64,
    limits: &Limits,
) -> Result<Manifest> {
    if container == Container::V2 {
        let strict = Limits { max_cbor_depth: limits.max_cbor_depth.min(v2::MAX_DEPTH), ..*limits };
        let value = cbor::decode(bytes, &strict, cbor::Rules::DETERMINISTIC)?;
        return v2::parse(value, span, file_len, limits);
    }
    let value = cbor::decode(bytes, limits, cbor::Rules::ANY)?;
    let manifest = match container {
        Container::Legacy01 => legacy::parse(value, span, file_len)?,
        _ => v1::parse(value, span, file_len)?,
    };
    validate::check_structure(&manifest, limits)?;
    Ok(manifest)
}

/// Parses and validates a whole file held in memory (or mapped).
pub fn parse_file(file: &[u8], limits: &Limits) -> Result<Manifest> {
    let reads = ManifestReads::new(file.len() as u64, MAX_TRAILER_LEN);
    let slice = |range: Range<u64>| &file[range.start as usize..range.end as usize];
    let (head, tail) = (slice(reads.head()), slice(reads.tail()));
    let located = reads.locate(head, tail, limits)?;
    located.parse(tail, slice(located.missing.clone()), limits)
}

/// The longest trailer of any container: a tail this long always holds the manifest's place.
pub const MAX_TRAILER_LEN: u64 = v2::FOOTER_LEN;

/// The reads that find and parse a file's manifest, whoever makes them (a local `pread`, an
/// S3 ranged GET, an HTTP range request): the header and the file's tail, read together, then
/// at most one more read for the part of a large manifest the tail did not hold.
#[derive(Debug, Clone)]
pub struct ManifestReads {
    file_len: u64,
    tail: Range<u64>,
}

/// Where a manifest is, once the header and the tail have been read.
#[derive(Debug, Clone)]
pub struct Located {
    pub container: Container,
    /// The manifest's bytes in the file.
    pub span: Range<u64>,
    /// The manifest's bytes before the tail, still to be read (empty when the tail holds them).
    pub missing: Range<u64>,
    /// The XXH3-64 the manifest bytes must hash to (v2).
    hash: Option<u64>,
    file_len: u64,
    tail_start: u64,
}

impl ManifestReads {
    /// Reads of a `file_len`-byte file whose tail read is `suffix` bytes (at least
    /// [`MAX_TRAILER_LEN`], at most the file): a larger suffix often holds a whole manifest.
    pub fn new(file_len: u64, suffix: u64) -> ManifestReads {
        ManifestReads { file_len, tail: file_len - suffix.max(MAX_TRAILER_LEN).min(file_len)..file_len }
    }

    /// The first read: the container's magic.
    pub fn head(&self) -> Range<u64> {
        0..self.file_len.min(HEADER_LEN)
    }

    /// The read made with the first: the file's last bytes.
    pub fn tail(&self) -> Range<u64> {
        self.tail.clone()
    }

    /// Identifies the container from `head` and finds the manifest from the trailer at the end
    /// of `tail` (checking the footer, the size field and the size limit).
    pub fn locate(&self, head: &[u8], tail: &[u8], limits: &Limits) -> Result<Located> {
        let container = Container::sniff(head)?;
        let (span, hash) = manifest_span(container, self.file_len, tail, limits)?;
        let missing = span.start.min(self.tail.start)..self.tail.start.min(span.end);
        Ok(Located { container, span, missing, hash, file_len: self.file_len, tail_start: self.tail.start })
    }
}

impl Located {
    /// Decodes and validates the manifest from the `tail` read and the `missing` bytes.
    pub fn parse(&self, tail: &[u8], missing: &[u8], limits: &Limits) -> Result<Manifest> {
        let in_tail = |at: u64| (at.max(self.tail_start) - self.tail_start) as usize;
        let from_tail = &tail[in_tail(self.span.start)..in_tail(self.span.end)];
        let whole = if missing.is_empty() {
            std::borrow::Cow::Borrowed(from_tail)
        } else {
            [missing, from_tail].concat().into()
        };
        if let Some(hash) = self.hash {
            v2::check_manifest_hash(&whole, hash)?;
        }
        parse_manifest(self.container, &whole, self.span.clone(), self.file_len, limits)
    }
}

/// Renders bytes for an error message: ASCII kept, everything else escaped.
fn printable(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::{ComponentInput, ObjectInput, WriteOptions, Writer};

    /// A 1.2 file of `objects` one-byte tensors: its manifest grows with the count.
    fn file(objects: usize) -> Vec<u8> {
        let names: Vec<String> = (0..objects).map(|i| format!("tensor.{i}")).collect();
        let mut writer = Writer::new(Vec::new()).unwrap();
        for name in &names {
            let data = ComponentInput { role: "data", dtype: DType::U8, logical_type: None, bytes: &[7] };
            let object = ObjectInput { name, shape: &[1], format: "dense", attributes: None, components: vec![data] };
            writer.add(&object, &WriteOptions::default()).unwrap();
        }
        writer.finish(None).unwrap()
    }

    /// Drives the reads as a remote reader would, counting the bytes it fetched.
    fn read(file: &[u8], suffix: u64) -> (Manifest, u64, bool) {
        let reads = ManifestReads::new(file.len() as u64, suffix);
        let slice = |range: Range<u64>| &file[range.start as usize..range.end as usize];
        let located = reads.locate(slice(reads.head()), slice(reads.tail()), &Limits::default()).unwrap();
        let fetched =
            reads.head().end + (reads.tail().end - reads.tail().start) + located.missing.end - located.missing.start;
        let manifest = located.parse(slice(reads.tail()), slice(located.missing.clone()), &Limits::default()).unwrap();
        (manifest, fetched, located.missing.is_empty())
    }

    #[test]
    fn a_manifest_is_found_with_a_second_read_only_when_the_tail_does_not_hold_it() {
        let bytes = file(200);
        let whole = parse_file(&bytes, &Limits::default()).unwrap();
        for suffix in [0, 16, 100, 4096, 1 << 20] {
            let (manifest, fetched, one_read) = read(&bytes, suffix);
            assert_eq!(manifest, whole, "suffix {suffix}");
            let span_len = whole.manifest_span.end - whole.manifest_span.start;
            assert_eq!(one_read, suffix.max(MAX_TRAILER_LEN) >= span_len + 16, "suffix {suffix}");
            assert!(fetched <= HEADER_LEN + suffix.max(MAX_TRAILER_LEN).min(bytes.len() as u64) + span_len);
        }
    }

    #[test]
    fn files_are_told_apart_by_name() {
        let cases = [
            ("org/llama.zt", Some(FileKind::Zt)),
            ("org/llama.safetensors", Some(FileKind::Safetensors)),
            ("org/llama/model.safetensors.index.json", Some(FileKind::SafetensorsIndex)),
            ("org/llama/other.safetensors.index.json", Some(FileKind::SafetensorsIndex)),
            ("model.safetensors.index.json", Some(FileKind::SafetensorsIndex)),
            ("org/llama/model.safetensors", Some(FileKind::Safetensors)),
            ("model.safetensors", Some(FileKind::Safetensors)),
            ("org/llama/model.zt", Some(FileKind::Zt)),
            ("model.zt", Some(FileKind::Zt)),
            ("org/llama/mymodel.zt", Some(FileKind::Zt)),
            ("org/llama/model-00001-of-00002.safetensors", Some(FileKind::Safetensors)),
            ("org/config.json", None),
            ("org/.safetensors", None),
            ("org/.zt", None),
            ("org/llama.zt.partial", None),
            ("org/tiny-gguf/model.gguf", Some(FileKind::Gguf)),
            ("org/tiny/tiny-Q4_K_M.gguf", Some(FileKind::Gguf)),
            ("org/tiny/tiny-Q8_0-00002-of-00003.gguf", Some(FileKind::Gguf)),
            ("org/tiny/model-00001-of-00002.gguf", Some(FileKind::Gguf)),
            ("tiny-00001-of-00002.gguf", Some(FileKind::Gguf)),
            ("org/.gguf", None),
        ];
        for (key, expected) in cases {
            assert_eq!(FileKind::of(key), expected, "{key}");
        }
    }
}
