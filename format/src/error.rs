//! `FormatError`: every way a `.zt` file can be malformed, one variant per rule, each naming
//! the object and component it concerns so a user can find the fault without a hex editor.

use std::fmt;

/// Where in a manifest a fault was found: an object, optionally one of its components.
/// Boxed strings keep every `FormatError` small enough to return by value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub object: Box<str>,
    pub component: Option<Box<str>>,
}

impl Location {
    pub fn object(name: &str) -> Self {
        Location { object: name.into(), component: None }
    }
    pub fn component(object: &str, role: &str) -> Self {
        Location { object: object.into(), component: Some(role.into()) }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "object {:?}", self.object)?;
        if let Some(role) = &self.component {
            write!(f, ", component {role:?}")?;
        }
        Ok(())
    }
}

/// A `.zt` file, manifest or component that breaks a rule of the format.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FormatError {
    // --- container ---------------------------------------------------------------------
    #[error("file is {len} bytes, shorter than the {min}-byte minimum of its container")]
    Truncated { len: u64, min: u64 },
    #[error("bad header magic {found:?}: not a zTensor file")]
    BadHeaderMagic { found: String },
    #[error("container version {version} is not supported (this reader knows zTensor v2)")]
    UnsupportedContainerVersion { version: u32 },
    #[error("bad footer magic {found:?}: the file is truncated or was not finished by its writer")]
    BadFooterMagic { found: String },
    #[error("manifest size is zero")]
    ManifestEmpty,
    #[error("manifest size {size} is over the limit of {limit} bytes")]
    ManifestTooLarge { size: u64, limit: u64 },
    #[error("manifest size {size} runs beyond the file ({available} bytes available before the trailer)")]
    ManifestBeyondFile { size: u64, available: u64 },
    #[error("manifest is at offset {offset}, not a multiple of 4096 at or after 4096")]
    ManifestMisaligned { offset: u64 },
    #[error(
        "manifest at {offset} ({length} bytes) runs past the data region, which ends at {data_end} where the footer begins"
    )]
    ManifestOutOfBounds { offset: u64, length: u64, data_end: u64 },
    #[error("manifest hash mismatch: the footer says {expected:#018x}, the manifest bytes hash to {actual:#018x}")]
    ManifestHashMismatch { expected: u64, actual: u64 },
    #[error("a data shard (no manifest): its blobs belong to the model of a root file that names it")]
    DataShard,
    #[error("a footer without a manifest must have offset and hash 0, found offset {offset} and hash {hash:#x}")]
    DataShardFooter { offset: u64, hash: u64 },
    #[error("manifest version {version:?} is not supported in a ZTEN1000 container (major must be 1)")]
    UnsupportedVersion { version: String },

    // --- CBOR --------------------------------------------------------------------------
    #[error("manifest CBOR is invalid at byte {offset}: {detail}")]
    CborInvalid { offset: usize, detail: String },
    #[error("manifest CBOR nests deeper than {limit} levels")]
    CborTooDeep { limit: usize },
    #[error("manifest CBOR holds more than {limit} items")]
    CborTooManyItems { limit: u64 },
    #[error("manifest CBOR at byte {offset} declares {declared} bytes or items but only {remaining} bytes remain")]
    CborLengthBeyondInput { offset: usize, declared: u64, remaining: u64 },
    #[error("manifest CBOR is not deterministically encoded at byte {offset}: {detail}")]
    CborNotDeterministic { offset: usize, detail: String },
    #[error("manifest CBOR is followed by {count} trailing bytes")]
    CborTrailingBytes { count: usize },
    #[error("{context}: duplicate key {key}")]
    DuplicateKey { context: String, key: String },
    #[error("{context}: expected {expected}")]
    WrongShape { context: String, expected: &'static str },
    #[error("{context}: missing required field {field:?}")]
    MissingField { context: String, field: &'static str },
    #[error("{context}: field {field:?} must be an unsigned integer, found {found}")]
    NotUnsigned { context: String, field: &'static str, found: &'static str },
    #[error("object name {name:?} appears twice")]
    DuplicateObject { name: String },

    // --- manifest semantics --------------------------------------------------------------
    #[error("{at}: unknown dtype {dtype:?}")]
    UnknownDtype { at: Location, dtype: String },
    #[error("{at}: unknown encoding {encoding:?}")]
    UnknownEncoding { at: Location, encoding: String },
    #[error("{at}: unknown data_endianness {value:?} (expected \"little\" or \"big\")")]
    UnknownEndianness { at: Location, value: String },
    #[error("{at}: digest {digest:?} is not {expected}")]
    BadDigest { at: Location, digest: String, expected: &'static str },
    #[error("shard {shard:?}: digest {digest:?} is not \"xxh3:<16 hex>\" or \"sha256:<64 hex>\"")]
    BadShardDigest { shard: String, digest: String },
    #[error("{what} {name:?} {reason}")]
    BadName { what: &'static str, name: String, reason: &'static str },
    #[error("{at}: rank {rank} is over the limit of 64")]
    RankTooLarge { at: Location, rank: usize },
    #[error("shard {shard:?} was not found beside the file that names it")]
    ShardMissing { shard: String },
    #[error("shard {shard:?} is {actual} bytes, the root's shard table says {expected}")]
    ShardSizeMismatch { shard: String, expected: u64, actual: u64 },
    #[error("shard {shard:?} digest mismatch: the root's shard table says {expected}, the file hashes to {actual}")]
    ShardDigestMismatch { shard: String, expected: String, actual: String },
    #[error("{at}: shard {shard:?} is not in the manifest's shard table")]
    UnknownShard { at: Location, shard: String },
    #[error("{at}: encoding and decoded_length must be both present or both absent")]
    EncodingWithoutDecodedLength { at: Location },
    #[error("{at}: layout {layout:?}: {detail}")]
    LayoutRule { at: Location, layout: String, detail: String },
    #[error("{at}: logical type {logical_type:?} needs dtype {expected}, found {found}")]
    LogicalTypeMismatch { at: Location, logical_type: String, expected: &'static str, found: &'static str },
    #[error("{at}: shape {shape:?} has an element count that overflows 64 bits")]
    ShapeOverflow { at: Location, shape: Vec<u64> },
    #[error("{at}: offset {offset} is not a multiple of {alignment}")]
    Misaligned { at: Location, offset: u64, alignment: u64 },
    #[error("{at}: offset {offset} + length {length} overflows 64 bits")]
    RangeOverflow { at: Location, offset: u64, length: u64 },
    #[error("{at}: bytes {start}..{end} start inside the first {header} bytes, where no data may lie")]
    RangeIntoHeader { at: Location, start: u64, end: u64, header: u64 },
    #[error("{at}: bytes {start}..{end} run past the data region, which ends at {data_end} where the manifest begins")]
    RangeIntoManifest { at: Location, start: u64, end: u64, data_end: u64 },
    #[error(
        "{at}: bytes {start}..{end} run past the data region of their file, which ends at {data_end} where the footer begins"
    )]
    RangeIntoFooter { at: Location, start: u64, end: u64, data_end: u64 },
    #[error(
        "{first} (bytes {first_start}..{first_end}) partially overlaps {second} (bytes {second_start}..{second_end})"
    )]
    Overlap { first: Location, first_start: u64, first_end: u64, second: Location, second_start: u64, second_end: u64 },
    #[error("{at}: {what} is {actual} bytes but {expected} were expected")]
    LengthMismatch { at: Location, what: &'static str, expected: u64, actual: u64 },
    #[error("{at}: length {length} is not a multiple of the {width}-byte dtype width")]
    LengthNotMultiple { at: Location, length: u64, width: u64 },
    #[error("{at}: zstd component has no uncompressed_length and its size cannot be derived from the shape")]
    UnknownDecodedLength { at: Location },
    #[error("{at}: decoded size {size} is over the limit of {limit} bytes")]
    DecodedTooLarge { at: Location, size: u64, limit: u64 },
    #[error("{at}: format {format:?} requires a {role:?} component")]
    MissingComponent { at: Location, format: String, role: &'static str },
    #[error("{at}: sparse index component must have dtype u64, found {found}")]
    SparseIndexDtype { at: Location, found: &'static str },

    // --- content checks ----------------------------------------------------------------
    #[error("{at}: bool element {index} is {value:#04x}, not 0 or 1")]
    BoolByte { at: Location, index: u64, value: u8 },
    #[error("{at}: {detail}")]
    SparseStructure { at: Location, detail: String },
    #[error("{at}: the unused high nibble of the last byte of packed 4-bit data is not zero")]
    PackedPadding { at: Location },
    #[error("{at}: seek table: {detail}")]
    SeekTable { at: Location, fault: SeekFault, detail: String },

    // --- decoding and digests -------------------------------------------------------------
    #[error("{at}: zstd data inflates past its declared {declared} bytes")]
    ZstdTooLong { at: Location, declared: u64 },
    #[error("{at}: zstd data stops at {produced} of its declared {declared} bytes")]
    ZstdTooShort { at: Location, produced: u64, declared: u64 },
    #[error("{at}: zstd frame is truncated")]
    ZstdTruncated { at: Location },
    #[error("{at}: zstd data is corrupt: {detail}")]
    ZstdCorrupt { at: Location, detail: String },
    #[error("{at}: {algorithm} digest mismatch: declared {expected}, computed {actual}")]
    DigestMismatch { at: Location, algorithm: &'static str, expected: String, actual: String },
    #[error("{at}: stored bytes are {actual} long, expected {expected}")]
    StoredLengthMismatch { at: Location, expected: u64, actual: u64 },
    #[error("safetensors header is invalid: {detail}")]
    SafetensorsHeader { detail: String },
    #[error("safetensors header must begin with '{{' (0x7B), but its first byte is {first:#04x}")]
    SafetensorsHeaderStart { first: u8 },
    #[error("{at}: data_offsets [{start}, {end}] end before they start")]
    OffsetsReversed { at: Location, start: u64, end: u64 },
    #[error("{at}: data starts at {start}, leaving a gap after the bytes before it, which end at {expected}")]
    DataGap { at: Location, start: u64, expected: u64 },
    #[error("{at}: {elements} elements of {bits} bits do not fill whole bytes")]
    PackedBits { at: Location, elements: u64, bits: u64 },
    #[error("the tensors' bytes end at {tensors_end}, but the file holds {data} bytes of data")]
    DataRegionMismatch { tensors_end: u64, data: u64 },
    #[error("safetensors index is invalid: {detail}")]
    SafetensorsIndex { detail: String },
    #[error("tensor {tensor:?}: the index maps it to {shard:?}, which does not hold it")]
    TensorNotInShard { tensor: String, shard: String },
    #[error("tensor {tensor:?}: the index maps it to {shard:?}, but it is in {found_in:?}")]
    TensorInWrongShard { tensor: String, shard: String, found_in: String },
    #[error("tensor {tensor:?} in {shard:?} is not in the index's weight_map")]
    TensorNotIndexed { tensor: String, shard: String },
    #[error("shard {shard:?}: {error}")]
    InShard { shard: String, error: Box<FormatError> },
    #[error("GGUF header, at byte {at}: {detail}")]
    Gguf { code: &'static str, at: u64, detail: String },

    // --- refit deltas ----------------------------------------------------------------------
    /// A refit delta ([`crate::delta`]) that breaks a rule; `code` names the rule.
    #[error("refit delta: {detail}")]
    Delta { code: &'static str, detail: String },
}

impl FormatError {
    /// A short stable identifier for the rule that failed (used in JSON reports and metrics).
    pub fn code(&self) -> &'static str {
        use FormatError::*;
        match self {
            Truncated { .. } => "truncated",
            BadHeaderMagic { .. } => "bad_header_magic",
            UnsupportedContainerVersion { .. } => "unsupported_container_version",
            ManifestMisaligned { .. } => "manifest_misaligned",
            ManifestOutOfBounds { .. } => "manifest_out_of_bounds",
            ManifestHashMismatch { .. } => "manifest_hash_mismatch",
            DataShard => "data_shard",
            DataShardFooter { .. } => "data_shard_footer",
            CborNotDeterministic { .. } => "cbor_not_deterministic",
            BadShardDigest { .. } => "bad_shard_digest",
            BadName { .. } => "bad_name",
            RankTooLarge { .. } => "rank_too_large",
            UnknownShard { .. } => "unknown_shard",
            ShardMissing { .. } => "shard_missing",
            ShardSizeMismatch { .. } => "shard_size_mismatch",
            ShardDigestMismatch { .. } => "shard_digest_mismatch",
            EncodingWithoutDecodedLength { .. } => "encoding_without_decoded_length",
            LayoutRule { .. } => "layout_rule",
            RangeIntoFooter { .. } => "range_into_footer",
            PackedPadding { .. } => "packed_padding",
            SeekTable { fault, .. } => fault.code(),
            BadFooterMagic { .. } => "bad_footer_magic",
            ManifestEmpty => "manifest_empty",
            ManifestTooLarge { .. } => "manifest_too_large",
            ManifestBeyondFile { .. } => "manifest_beyond_file",
            UnsupportedVersion { .. } => "unsupported_version",
            CborInvalid { .. } => "cbor_invalid",
            CborTooDeep { .. } => "cbor_too_deep",
            CborTooManyItems { .. } => "cbor_too_many_items",
            CborLengthBeyondInput { .. } => "cbor_length_beyond_input",
            CborTrailingBytes { .. } => "cbor_trailing_bytes",
            DuplicateKey { .. } => "duplicate_key",
            WrongShape { .. } => "wrong_shape",
            MissingField { .. } => "missing_field",
            NotUnsigned { .. } => "not_unsigned",
            DuplicateObject { .. } => "duplicate_object",
            UnknownDtype { .. } => "unknown_dtype",
            UnknownEncoding { .. } => "unknown_encoding",
            UnknownEndianness { .. } => "unknown_endianness",
            BadDigest { .. } => "bad_digest",
            LogicalTypeMismatch { .. } => "logical_type_mismatch",
            ShapeOverflow { .. } => "shape_overflow",
            Misaligned { .. } => "misaligned",
            RangeOverflow { .. } => "range_overflow",
            RangeIntoHeader { .. } => "range_into_header",
            RangeIntoManifest { .. } => "range_into_manifest",
            Overlap { .. } => "overlap",
            LengthMismatch { .. } => "length_mismatch",
            LengthNotMultiple { .. } => "length_not_multiple",
            UnknownDecodedLength { .. } => "unknown_decoded_length",
            DecodedTooLarge { .. } => "decoded_too_large",
            MissingComponent { .. } => "missing_component",
            SparseIndexDtype { .. } => "sparse_index_dtype",
            BoolByte { .. } => "bool_byte",
            SparseStructure { .. } => "sparse_structure",
            ZstdTooLong { .. } => "zstd_too_long",
            ZstdTooShort { .. } => "zstd_too_short",
            ZstdTruncated { .. } => "zstd_truncated",
            ZstdCorrupt { .. } => "zstd_corrupt",
            DigestMismatch { .. } => "digest_mismatch",
            StoredLengthMismatch { .. } => "stored_length_mismatch",
            SafetensorsHeader { .. } => "safetensors_header",
            SafetensorsHeaderStart { .. } => "safetensors_header_start",
            OffsetsReversed { .. } => "offsets_reversed",
            DataGap { .. } => "data_gap",
            PackedBits { .. } => "packed_bits",
            DataRegionMismatch { .. } => "data_region_mismatch",
            SafetensorsIndex { .. } => "safetensors_index",
            TensorNotInShard { .. } => "tensor_not_in_shard",
            TensorInWrongShard { .. } => "tensor_in_wrong_shard",
            TensorNotIndexed { .. } => "tensor_not_indexed",
            InShard { error, .. } => error.code(),
            Gguf { code, .. } => code,
            Delta { code, .. } => code,
        }
    }
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;

/// Which rule of a seek table ([`seekable`](crate::seekable)) a stream breaks; each has its own
/// error code. Here rather than in `seekable` because [`FormatError`] carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekFault {
    /// Not a seek table: magic, descriptor, frame count or skippable length are wrong.
    Malformed,
    /// The decoded sizes do not sum to the part's `decoded_length`.
    Total,
    /// A frame decodes to more than 16 MiB (or to nothing).
    FrameSize,
    /// The compressed sizes do not cover the stream before the table exactly.
    Coverage,
    /// Non-final frames of different decoded sizes.
    Unequal,
    /// A frame without a content checksum, which the profile requires of every frame.
    NoChecksum,
}

impl SeekFault {
    pub fn code(self) -> &'static str {
        match self {
            SeekFault::Malformed => "seek_table_malformed",
            SeekFault::Total => "seek_table_total",
            SeekFault::FrameSize => "seek_frame_size",
            SeekFault::Coverage => "seek_table_coverage",
            SeekFault::Unequal => "seek_frames_unequal",
            SeekFault::NoChecksum => "seek_frame_no_checksum",
        }
    }
}
