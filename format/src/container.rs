//! The containers and their framing constants: each generation's magic, the header length and
//! blob alignment, which [`Container`] a file uses, what [`FileKind`] a stored file is by its
//! name, and the [`Limits`] that bound the work a hostile file can cause.

use std::fmt;

use crate::{FormatError, Result};

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
/// v2's footer (manifest offset, length and hash, version, magic); here, with the other
/// framing, so that the framing needs nothing of v2's parser, which re-exports it.
pub const V2_FOOTER_LEN: u64 = 40;
/// The little-endian u64 header length a safetensors file starts with (re-exported there).
pub const SAFETENSORS_LENGTH_FIELD: u64 = 8;

/// Which container generation a file uses. New generations add a variant here and a parser
/// module producing the same [`Manifest`](crate::Manifest); callers do not change. Not merged
/// with [`FileKind`]: this is what a file's bytes are (one `.zt` name is any of three
/// generations, told apart only by the magic), which a manifest records once the file is read.
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
    /// ([`safetensors`](crate::safetensors)): no magic, found by its name.
    Safetensors,
    /// A GGUF file, or a split model of several ([`gguf`](crate::gguf)): found by its name.
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
            Container::V2 => V2_FOOTER_LEN,
            Container::Safetensors | Container::Gguf => 0,
        }
    }

    /// The smallest file this container can describe.
    pub fn min_file_len(self) -> u64 {
        match self {
            // Header, at least one manifest byte, trailer.
            Container::Legacy01 | Container::V1 => HEADER_LEN + 1 + self.trailer_len(),
            // Header and footer: a data shard holds nothing else.
            Container::V2 => HEADER_LEN + V2_FOOTER_LEN,
            Container::Safetensors => SAFETENSORS_LENGTH_FIELD,
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

/// What a stored file is, by its name: the kinds of file a source lists. Not merged with
/// [`Container`]: this is known before a byte is read, and one kind is no container at all
/// (a safetensors index only names the files that hold tensors).
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

/// Renders bytes for an error message: ASCII kept, everything else escaped.
pub(crate) fn printable(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}
