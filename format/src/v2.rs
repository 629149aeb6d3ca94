//! The zTensor v2 container (`89 5A 54 32 0D 0A 1A 0A`, spec "Draft 4"): the 40-byte footer
//! and its manifest hash, the deterministic-CBOR manifest of objects, parts and shards read
//! into the generation-neutral model, and every rule of the spec's validation summary (§3.6):
//! names, ranks, blob alignment and bounds per file, identical-or-disjoint blobs, logical
//! types, and the metadata rules of the layouts it interprets (`dense`, `zt.sparse_csr/1`,
//! `zt.sparse_coo/1`, `zt.quant_group/1`). Other layouts, logical types and encodings are kept
//! as declared and served structurally, never guessed at. Data rules (bool bytes, packed
//! nibbles, sparse index structure) need the decoded bytes: [`check_content`].

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;

use super::cbor::Fields;
use super::{
    ByteOrder, Component, Container, DType, Digest, DigestScope, Encoding, FormatError, Limits, Location, Manifest,
    Object, Result, Shard, V2_MAGIC, Value,
};

/// Bytes of the footer: manifest offset, length and hash, version, reserved, magic.
pub const FOOTER_LEN: u64 = 40;
/// Every blob (and the manifest) starts at a multiple of this, and never before it.
pub const BLOB_ALIGNMENT: u64 = 4096;
/// The footer version this reader understands.
pub const VERSION: u32 = 2;
/// Longest object, part or attribute name, in bytes.
pub const MAX_NAME_LEN: usize = 1024;
/// Longest shard name, in bytes.
pub const MAX_SHARD_NAME_LEN: usize = 64;
/// Highest rank of a shape.
pub const MAX_RANK: usize = 64;
/// Deepest CBOR nesting, counted from the manifest root.
pub const MAX_DEPTH: usize = 32;
/// The one encoding profile registered: independent zstd frames and a seek table.
pub const ZSTD_SEEKABLE: &str = "zt.zstd-seekable/1";

/// The footer at the end of a v2 file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    pub manifest_offset: u64,
    pub manifest_length: u64,
    pub manifest_hash: u64,
    pub version: u32,
}

impl Footer {
    /// Reads the footer from the last [`FOOTER_LEN`] bytes of `tail` (of a file of `file_len`
    /// bytes), checking the file's size, the footer magic and the version.
    pub fn read(file_len: u64, tail: &[u8]) -> Result<Footer> {
        let min = super::HEADER_LEN + FOOTER_LEN;
        if file_len < min {
            return Err(FormatError::Truncated { len: file_len, min });
        }
        let start = tail
            .len()
            .checked_sub(FOOTER_LEN as usize)
            .ok_or(FormatError::Truncated { len: tail.len() as u64, min: FOOTER_LEN })?;
        let footer = &tail[start..];
        if &footer[32..40] != V2_MAGIC {
            return Err(FormatError::BadFooterMagic { found: super::printable(&footer[32..40]) });
        }
        let u64_at = |at: usize| u64::from_le_bytes(footer[at..at + 8].try_into().expect("8 bytes"));
        let version = u32::from_le_bytes(footer[24..28].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(FormatError::UnsupportedContainerVersion { version });
        }
        Ok(Footer { manifest_offset: u64_at(0), manifest_length: u64_at(8), manifest_hash: u64_at(16), version })
    }

    /// Where the manifest is, checked against the file and the size limit before any of it is
    /// read. A data shard (no manifest) is [`FormatError::DataShard`]: its blobs belong to the
    /// model of a root file.
    pub fn manifest_span(&self, file_len: u64, limits: &Limits) -> Result<Range<u64>> {
        let (offset, length) = (self.manifest_offset, self.manifest_length);
        if length == 0 {
            if offset != 0 || self.manifest_hash != 0 {
                return Err(FormatError::DataShardFooter { offset, hash: self.manifest_hash });
            }
            return Err(FormatError::DataShard);
        }
        if length > limits.max_manifest_bytes {
            return Err(FormatError::ManifestTooLarge { size: length, limit: limits.max_manifest_bytes });
        }
        if offset % BLOB_ALIGNMENT != 0 || offset < BLOB_ALIGNMENT {
            return Err(FormatError::ManifestMisaligned { offset });
        }
        let data_end = file_len - FOOTER_LEN;
        match offset.checked_add(length) {
            Some(end) if end <= data_end => Ok(offset..end),
            _ => Err(FormatError::ManifestOutOfBounds { offset, length, data_end }),
        }
    }
}

/// Checks the manifest bytes against the footer's XXH3-64 hash; nothing is parsed before.
pub fn check_manifest_hash(bytes: &[u8], expected: u64) -> Result<()> {
    let actual = xxhash_rust::xxh3::xxh3_64(bytes);
    if actual != expected {
        return Err(FormatError::ManifestHashMismatch { expected, actual });
    }
    Ok(())
}

/// The container (L0) around a blob heap and a manifest: the magic, zero padding to 4096,
/// `heap` (which so starts at offset 4096), zero padding to the next multiple of 4096, the
/// manifest, and the footer with its offset, length and XXH3-64. An empty manifest makes a
/// data shard (offset, length and hash zero). Blob offsets in the manifest are the writer's
/// business; tests and the fuzzer build files by hand with this.
pub fn file_around(heap: &[u8], manifest: &[u8]) -> Vec<u8> {
    let mut file = Vec::with_capacity(2 * BLOB_ALIGNMENT as usize + heap.len() + manifest.len() + 40);
    file.extend_from_slice(V2_MAGIC);
    file.resize(BLOB_ALIGNMENT as usize, 0);
    file.extend_from_slice(heap);
    file.resize(file.len().next_multiple_of(BLOB_ALIGNMENT as usize), 0);
    let offset = file.len() as u64;
    file.extend_from_slice(manifest);
    file.extend_from_slice(&footer(offset, manifest));
    file
}

/// The footer of a file whose manifest `manifest` starts at `offset` (a data shard's, all
/// zero but version and magic, when `manifest` is empty).
fn footer(offset: u64, manifest: &[u8]) -> [u8; FOOTER_LEN as usize] {
    let (offset, hash) = if manifest.is_empty() { (0, 0) } else { (offset, xxhash_rust::xxh3::xxh3_64(manifest)) };
    let mut footer = [0u8; FOOTER_LEN as usize];
    footer[..8].copy_from_slice(&offset.to_le_bytes());
    footer[8..16].copy_from_slice(&(manifest.len() as u64).to_le_bytes());
    footer[16..24].copy_from_slice(&hash.to_le_bytes());
    footer[24..28].copy_from_slice(&VERSION.to_le_bytes());
    footer[32..].copy_from_slice(V2_MAGIC);
    footer
}

/// `value` in deterministic CBOR, as a v2 manifest must be (map keys sorted at every level,
/// shortest heads, narrowest exact floats). `value` must hold no tags.
pub fn deterministic_cbor(value: &Value) -> Vec<u8> {
    super::cbor::encode_deterministic(value)
}

/// Lays out a single-file v2 model whose parts' stored bytes are copied in as they are (the
/// parts of `objects`, from any v2 model: its shards merged, seekable streams kept, digests
/// unchanged since they cover decoded bytes): the magic, each blob at the next multiple of
/// `alignment` (a power of two, at least 4096) in object and part order, identical source
/// blobs (same file, offset and length: tied weights) sharing one, then the manifest at an
/// aligned offset and the footer. A file created at `tail_offset + tail.len()` bytes is
/// zero-filled, so writing the magic, every blob at its offset and the tail completes it.
pub fn plan(objects: &[&Object], attributes: Option<&Value>, alignment: u64) -> super::write::Plan {
    debug_assert!(alignment.is_power_of_two() && alignment >= BLOB_ALIGNMENT);
    let text = |s: &str| Value::Text(s.to_owned());
    let uint = |n: u64| Value::Integer(n.into());
    let mut position = alignment;
    let mut placed: BTreeMap<(usize, u64, u64), u64> = BTreeMap::new();
    let mut offsets = Vec::with_capacity(objects.len());
    let mut entries = Vec::with_capacity(objects.len());
    for object in objects {
        let mut object_offsets = Vec::with_capacity(object.components.len());
        let mut parts = Vec::with_capacity(object.components.len());
        for c in &object.components {
            let source = (c.file, c.offset, c.stored_length);
            let offset = match placed.get(&source) {
                Some(&offset) if c.stored_length > 0 => offset,
                _ => {
                    let offset = position.next_multiple_of(alignment);
                    position = offset + c.stored_length;
                    placed.insert(source, offset);
                    offset
                }
            };
            object_offsets.push(offset);
            let mut fields = vec![(text("dtype"), text(c.dtype.name()))];
            if let Some(logical) = crate::gguf::declared_logical_type(object, c) {
                fields.push((text("type"), text(logical)));
            }
            fields.push((text("blob"), Value::Array(vec![uint(offset), uint(c.stored_length)])));
            if c.encoding != Encoding::Raw {
                fields.push((text("encoding"), text(c.encoding.name())));
                fields.push((text("decoded_length"), uint(c.decoded_length)));
            }
            if let Some(digest) = &c.digest {
                fields.push((text("digest"), text(&digest.to_string())));
            }
            parts.push((text(&c.role), Value::Map(fields)));
        }
        let mut fields = vec![
            (text("shape"), Value::Array(object.shape.iter().map(|&d| uint(d)).collect())),
            (text("layout"), text(&object.format)),
            (text("parts"), Value::Map(parts)),
        ];
        if let Some(attributes) = &object.attributes {
            fields.push((text("attributes"), attributes.clone()));
        }
        offsets.push(object_offsets);
        entries.push((text(&object.name), Value::Map(fields)));
    }
    let mut root = vec![(text("objects"), Value::Map(entries))];
    if let Some(attributes) = attributes {
        root.push((text("attributes"), attributes.clone()));
    }
    let manifest = deterministic_cbor(&Value::Map(root));
    let tail_offset = position.next_multiple_of(BLOB_ALIGNMENT);
    let mut tail = manifest.clone();
    tail.extend_from_slice(&footer(tail_offset, &manifest));
    super::write::Plan { offsets, tail_offset, tail }
}

/// Builds the model of a decoded v2 manifest found at `span` in a root file of `file_len`
/// bytes, and checks every metadata rule.
pub(super) fn parse(root: Value, span: Range<u64>, file_len: u64, limits: &Limits) -> Result<Manifest> {
    let fields = Fields::of(&root, "manifest")?;
    let attributes = attributes(&fields, "manifest")?;
    let shards = match fields.get("shards") {
        None => Vec::new(),
        Some(value) => shard_table(value)?,
    };
    let objects_value = fields.require("objects")?;
    let object_map = Fields::of(objects_value, "manifest.objects")?;
    let Value::Map(raw_entries) = objects_value else { unreachable!("Fields::of checked the map") };
    if object_map.entries().count() != raw_entries.len() {
        return Err(object_map.wrong("<key>", "text object names"));
    }
    let objects =
        object_map.entries().map(|(name, value)| object(name, value, &shards, limits)).collect::<Result<Vec<_>>>()?;
    let mut manifest = Manifest::new(Container::V2, Some("2".into()), attributes, objects, span, file_len)?;
    manifest.shards = shards;
    check_blobs(&manifest)?;
    Ok(manifest)
}

/// The name rules of §3.5: 1..1024 bytes of UTF-8 (CBOR text already is), no NUL.
fn check_name(what: &'static str, name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "is empty"
    } else if name.len() > MAX_NAME_LEN {
        "is longer than 1024 bytes"
    } else if name.contains('\0') {
        "contains NUL"
    } else {
        return Ok(());
    };
    Err(FormatError::BadName { what, name: name.chars().take(80).collect(), reason })
}

/// A shard name (§7.1): 1..64 bytes of `[A-Za-z0-9._-]`, not starting with a dot, so it is
/// always safe as one path component.
pub fn check_shard_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "is empty"
    } else if name.len() > MAX_SHARD_NAME_LEN {
        "is longer than 64 bytes"
    } else if name.starts_with('.') {
        "starts with a dot"
    } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        "has a character outside [A-Za-z0-9._-]"
    } else {
        return Ok(());
    };
    Err(FormatError::BadName { what: "shard name", name: name.chars().take(80).collect(), reason })
}

/// An `attributes` map, when present: its keys are text obeying the name rules.
fn attributes(fields: &Fields<'_>, context: &str) -> Result<Option<Value>> {
    match fields.get("attributes") {
        None => Ok(None),
        Some(v @ Value::Map(entries)) => {
            for (key, _) in entries {
                let Value::Text(key) = key else {
                    return Err(FormatError::WrongShape {
                        context: format!("{context}.attributes"),
                        expected: "a map with text keys",
                    });
                };
                check_name("attribute key", key)?;
            }
            Ok(Some(v.clone()))
        }
        Some(_) => Err(fields.wrong("attributes", "a map")),
    }
}

fn shard_table(value: &Value) -> Result<Vec<Shard>> {
    let Value::Map(entries) = value else {
        return Err(FormatError::WrongShape { context: "manifest.shards".into(), expected: "a map" });
    };
    let mut shards = Vec::with_capacity(entries.len());
    for (key, entry) in entries {
        let Value::Text(name) = key else {
            return Err(FormatError::WrongShape { context: "manifest.shards".into(), expected: "text shard names" });
        };
        check_shard_name(name)?;
        let fields = Fields::of(entry, format!("shard {name:?}"))?;
        let size = fields.required_uint("size")?;
        let text = fields.required_text("digest")?;
        let digest = parse_digest(text).ok_or_else(|| FormatError::BadShardDigest {
            shard: name.clone(),
            digest: text.chars().take(80).collect(),
        })?;
        if matches!(digest, Digest::Unregistered(_)) {
            // A shard's digest is its identity: one this reader cannot compute cannot resolve it.
            return Err(FormatError::BadShardDigest { shard: name.clone(), digest: text.chars().take(80).collect() });
        }
        shards.push(Shard { name: name.clone(), size, digest });
    }
    Ok(shards)
}

/// Where the spec's positional convention (Appendix B) puts shard `shard` of the root file
/// named `root` (`llama.zt`): beside it, as `<root stem>-<shard>.zt` (`llama-00001.zt`). A
/// resolver that finds nothing there falls back to matching files by size and digest.
pub fn positional_shard_name(root: &str, shard: &str) -> String {
    let stem = root.strip_suffix(".zt").unwrap_or(root);
    format!("{stem}-{shard}.zt")
}

/// `"<algorithm>:<lowercase hex>"` (§3.4): `xxh3` (16 digits) and `sha256` (64) are computed;
/// another algorithm in the same form is kept, unverifiable, as the spec allows.
pub fn parse_digest(text: &str) -> Option<Digest> {
    let (algorithm, hex) = text.split_once(':')?;
    let lower_hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if algorithm.is_empty()
        || !algorithm.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        || !lower_hex(hex)
    {
        return None;
    }
    match algorithm {
        "xxh3" if hex.len() == 16 => u64::from_str_radix(hex, 16).ok().map(Digest::Xxh3),
        "sha256" if hex.len() == 64 => {
            let mut out = [0u8; 32];
            hex::decode_to_slice(hex, &mut out).ok()?;
            Some(Digest::Sha256(out))
        }
        "xxh3" | "sha256" => None,
        _ => Some(Digest::Unregistered(text.into())),
    }
}

fn object(name: &str, value: &Value, shards: &[Shard], limits: &Limits) -> Result<Object> {
    check_name("object name", name)?;
    let at = Location::object(name);
    let fields = Fields::of(value, at.to_string())?;
    let shape = fields.uint_array("shape")?;
    if shape.len() > MAX_RANK {
        return Err(FormatError::RankTooLarge { at, rank: shape.len() });
    }
    let layout = fields.required_text("layout")?.to_owned();
    let attributes = attributes(&fields, &at.to_string())?;
    let parts_value = fields.require("parts")?;
    let part_map = Fields::of(parts_value, format!("{at}.parts"))?;
    let Value::Map(raw_parts) = parts_value else { unreachable!("Fields::of checked the map") };
    if part_map.entries().count() != raw_parts.len() {
        return Err(part_map.wrong("<key>", "text part names"));
    }
    if raw_parts.is_empty() {
        return Err(FormatError::WrongShape { context: format!("{at}.parts"), expected: "a non-empty map" });
    }
    let mut object = Object { name: name.to_owned(), shape, format: layout, attributes, components: Vec::new() };
    if object.element_count().is_none() {
        return Err(FormatError::ShapeOverflow { at, shape: object.shape });
    }
    for (role, value) in part_map.entries() {
        check_name("part name", role)?;
        object.components.push(part(name, role, value, shards, limits)?);
    }
    check_layout(&object)?;
    Ok(object)
}

fn part(object: &str, role: &str, value: &Value, shards: &[Shard], limits: &Limits) -> Result<Component> {
    let at = Location::component(object, role);
    let fields = Fields::of(value, at.to_string())?;
    let dtype_name = fields.required_text("dtype")?;
    let dtype = DType::from_name(dtype_name)
        .filter(|d| *d != DType::Bool)
        .ok_or_else(|| FormatError::UnknownDtype { at: at.clone(), dtype: dtype_name.to_owned() })?;
    let logical_type = fields.text("type")?.map(str::to_owned);
    if let Some((expected, _)) = logical_type.as_deref().and_then(logical_size) {
        if expected != dtype {
            return Err(FormatError::LogicalTypeMismatch {
                at,
                logical_type: logical_type.unwrap_or_default(),
                expected: expected.name(),
                found: dtype.name(),
            });
        }
    }
    let blob = match fields.require("blob")? {
        Value::Array(items) if items.len() == 2 => items,
        _ => return Err(fields.wrong("blob", "an array of exactly two unsigned integers [offset, length]")),
    };
    let uint = |v: &Value| match v {
        Value::Integer(i) => u64::try_from(*i).ok(),
        _ => None,
    };
    let (Some(offset), Some(stored_length)) = (uint(&blob[0]), uint(&blob[1])) else {
        return Err(fields.wrong("blob", "an array of exactly two unsigned integers [offset, length]"));
    };
    let file = match fields.text("shard")? {
        None => 0,
        Some(shard) => shards
            .iter()
            .position(|s| s.name == shard)
            .map(|i| i + 1)
            .ok_or_else(|| FormatError::UnknownShard { at: at.clone(), shard: shard.chars().take(80).collect() })?,
    };
    let (encoding, decoded_length) = match (fields.text("encoding")?, fields.uint("decoded_length")?) {
        (None, None) => (Encoding::Raw, stored_length),
        (Some(ZSTD_SEEKABLE), Some(decoded)) => (Encoding::ZstdSeekable, decoded),
        (Some(other), Some(decoded)) => (Encoding::Unregistered(other.into()), decoded),
        _ => return Err(FormatError::EncodingWithoutDecodedLength { at }),
    };
    // A raw part's size is its blob's, bounded by its file; only a declared one is a claim.
    if encoding != Encoding::Raw && decoded_length > limits.max_decoded_bytes {
        return Err(FormatError::DecodedTooLarge { at, size: decoded_length, limit: limits.max_decoded_bytes });
    }
    let digest = match fields.text("digest")? {
        None => None,
        Some(text) => Some(parse_digest(text).ok_or_else(|| FormatError::BadDigest {
            at: at.clone(),
            digest: text.chars().take(80).collect(),
            expected: "\"<algorithm>:<lowercase hex>\" (xxh3: 16 digits, sha256: 64)",
        })?),
    };
    Ok(Component {
        role: role.to_owned(),
        dtype,
        logical_type,
        offset,
        stored_length,
        encoding,
        decoded_length,
        digest,
        digest_scope: DigestScope::Decoded,
        byte_order: ByteOrder::Little,
        file,
    })
}

/// What a registered logical type (Appendix A) requires: its storage dtype, and the decoded
/// size of `n` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogicalSize {
    /// `n × width(dtype) × k`: plain byte-wide types (k = 1) and complex ones (k = 2).
    PerElement(u64),
    /// `⌈n / 2⌉`: two 4-bit elements per byte, low nibble first.
    Nibbles,
}

impl LogicalSize {
    pub fn bytes(self, dtype: DType, elements: u64) -> Option<u64> {
        match self {
            LogicalSize::PerElement(k) => elements.checked_mul(dtype.width())?.checked_mul(k),
            LogicalSize::Nibbles => Some(elements.div_ceil(2)),
        }
    }
}

/// The registered logical types of v2 (Appendix A); `None` for any other name.
pub fn logical_size(name: &str) -> Option<(DType, LogicalSize)> {
    match name {
        "bool" | "f8_e4m3fn" | "f8_e5m2" | "f8_e4m3fnuz" | "f8_e5m2fnuz" | "f8_e8m0" => {
            Some((DType::U8, LogicalSize::PerElement(1)))
        }
        "f4_e2m1" => Some((DType::U8, LogicalSize::Nibbles)),
        "complex64" => Some((DType::F32, LogicalSize::PerElement(2))),
        "complex128" => Some((DType::F64, LogicalSize::PerElement(2))),
        _ => None,
    }
}

/// The decoded size `elements` of this part's type take, when its type is known (a part
/// without `type` is its dtype); `None` for an unregistered logical type.
fn size_of(component: &Component, elements: u64) -> Option<Option<u64>> {
    match component.logical_type.as_deref() {
        None => Some(elements.checked_mul(component.dtype.width())),
        Some(name) => logical_size(name).map(|(_, size)| size.bytes(component.dtype, elements)),
    }
}

fn layout_error(object: &Object, detail: impl Into<String>) -> FormatError {
    FormatError::LayoutRule { at: Location::object(&object.name), layout: object.format.clone(), detail: detail.into() }
}

/// The parts are exactly `roles`, in any order.
fn exact_parts(object: &Object, roles: &[&str]) -> Result<()> {
    let mut present: Vec<&str> = object.components.iter().map(|c| c.role.as_str()).collect();
    present.sort_unstable();
    let mut wanted = roles.to_vec();
    wanted.sort_unstable();
    if present != wanted {
        return Err(layout_error(object, format!("parts must be exactly {wanted:?}, found {present:?}")));
    }
    Ok(())
}

fn part_of<'o>(object: &'o Object, role: &str) -> &'o Component {
    object.component(role).expect("exact_parts checked the roles")
}

fn expect_size(object: &Object, component: &Component, what: &'static str, expected: Option<u64>) -> Result<()> {
    let at = Location::component(&object.name, &component.role);
    let expected =
        expected.ok_or_else(|| FormatError::ShapeOverflow { at: at.clone(), shape: object.shape.clone() })?;
    if component.decoded_length != expected {
        return Err(FormatError::LengthMismatch { at, what, expected, actual: component.decoded_length });
    }
    Ok(())
}

/// A sparse index part: plain `u32` or `u64`.
fn index_width(object: &Object, component: &Component) -> Result<u64> {
    match (component.dtype, &component.logical_type) {
        (DType::U32 | DType::U64, None) => Ok(component.dtype.width()),
        _ => Err(layout_error(
            object,
            format!("part {:?} must be plain u32 or u64, found {}", component.role, describe_type(component)),
        )),
    }
}

fn describe_type(component: &Component) -> String {
    match &component.logical_type {
        Some(t) => format!("{} with type {t:?}", component.dtype),
        None => component.dtype.to_string(),
    }
}

/// The metadata rules of the layouts this reader interprets; any other layout is structural.
fn check_layout(object: &Object) -> Result<()> {
    let elements = object.element_count().expect("checked before the parts");
    match object.format.as_str() {
        "dense" => {
            exact_parts(object, &["data"])?;
            let data = part_of(object, "data");
            match size_of(data, elements) {
                Some(size) => expect_size(object, data, "decoded size of dense data", size),
                None => Ok(()),
            }
        }
        "zt.sparse_csr/1" => {
            exact_parts(object, &["values", "indices", "indptr"])?;
            let [rows, _] = object.shape[..] else {
                return Err(layout_error(object, format!("needs rank 2, found shape {:?}", object.shape)));
            };
            let (indices, indptr, values) =
                (part_of(object, "indices"), part_of(object, "indptr"), part_of(object, "values"));
            let width = index_width(object, indices)?;
            index_width(object, indptr)?;
            if indptr.dtype != indices.dtype {
                return Err(layout_error(object, "indptr and indices must have the same dtype"));
            }
            expect_size(
                object,
                indptr,
                "decoded size of indptr",
                rows.checked_add(1).and_then(|r| r.checked_mul(width)),
            )?;
            let nnz = whole_count(object, indices, width)?;
            check_values(object, values, nnz)
        }
        "zt.sparse_coo/1" => {
            exact_parts(object, &["values", "coords"])?;
            if object.shape.is_empty() {
                return Err(layout_error(object, "needs rank 1 or more"));
            }
            let (coords, values) = (part_of(object, "coords"), part_of(object, "values"));
            let width = index_width(object, coords)?;
            let per_element = width * object.shape.len() as u64;
            let nnz = whole_count(object, coords, per_element)?;
            check_values(object, values, nnz)
        }
        "zt.quant_group/1" => check_quant_group(object, elements),
        _ => Ok(()),
    }
}

/// `decoded_size / unit`, which must divide exactly.
fn whole_count(object: &Object, component: &Component, unit: u64) -> Result<u64> {
    if component.decoded_length % unit != 0 {
        return Err(FormatError::LengthNotMultiple {
            at: Location::component(&object.name, &component.role),
            length: component.decoded_length,
            width: unit,
        });
    }
    Ok(component.decoded_length / unit)
}

fn check_values(object: &Object, values: &Component, nnz: u64) -> Result<()> {
    match size_of(values, nnz) {
        Some(size) => expect_size(object, values, "decoded size of values (nnz elements)", size),
        None => Ok(()),
    }
}

/// `zt.quant_group/1`: a parametric profile whose attributes state every decoder parameter.
fn check_quant_group(object: &Object, elements: u64) -> Result<()> {
    let fail = |detail: String| Err(layout_error(object, detail));
    let attrs = match &object.attributes {
        Some(attrs) => Fields::of(attrs, format!("object {:?}.attributes", object.name))?,
        None => return fail("needs the attributes bits, group_size, axis, packing, scale_form, zero_point".into()),
    };
    let bits = attrs.required_uint("bits")?;
    let group_size = attrs.required_uint("group_size")?;
    let axis = attrs.required_uint("axis")?;
    let packing = Fields::of(attrs.require("packing")?, "attributes.packing")?;
    let word_name = packing.required_text("word")?;
    let order = packing.required_text("order")?;
    let per_word = packing.required_uint("per_word")?;
    let scale_form = attrs.required_text("scale_form")?;
    let zero_point = Fields::of(attrs.require("zero_point")?, "attributes.zero_point")?;
    let form = zero_point.required_text("form")?;
    let has_zeros = match form {
        "none" => false,
        "implied" => {
            if !matches!(zero_point.get("value"), Some(Value::Integer(_))) {
                return fail("zero_point.form \"implied\" needs an integer zero_point.value".into());
            }
            false
        }
        "tensor" => true,
        other => return fail(format!("zero_point.form {other:?} is not none, implied or tensor")),
    };
    exact_parts(object, if has_zeros { &["data", "scales", "zeros"] } else { &["data", "scales"] })?;
    let (data, scales) = (part_of(object, "data"), part_of(object, "scales"));
    let word = match word_name {
        "u8" => DType::U8,
        "u16" => DType::U16,
        "u32" => DType::U32,
        "u64" => DType::U64,
        other => return fail(format!("packing.word {other:?} is not u8, u16, u32 or u64")),
    };
    let unsigned_of_data = match data.dtype {
        DType::I8 => DType::U8,
        DType::I16 => DType::U16,
        DType::I32 => DType::U32,
        DType::I64 => DType::U64,
        d => d,
    };
    if data.logical_type.is_some() || unsigned_of_data != word {
        return fail(format!("data must be plain {word_name} (or its signed twin), found {}", describe_type(data)));
    }
    if !matches!(order, "lsb_first" | "msb_first") {
        return fail(format!("packing.order {order:?} is not lsb_first or msb_first"));
    }
    let word_bits = 8 * word.width();
    if !matches!(bits, 2..=6 | 8) || word_bits % bits != 0 || per_word != word_bits / bits {
        return fail(format!("bits {bits} and per_word {per_word} do not pack a {word_bits}-bit word exactly"));
    }
    match scale_form {
        "f32_factors" | "f16_factors" if matches!(scales.dtype, DType::F64 | DType::F32 | DType::F16 | DType::BF16) => {
        }
        "e8m0_exponent" if scales.dtype == DType::U8 && scales.logical_type.as_deref() == Some("f8_e8m0") => {}
        "f32_factors" | "f16_factors" | "e8m0_exponent" => {
            return fail(format!("scales ({}) do not suit scale_form {scale_form:?}", describe_type(scales)));
        }
        other => return fail(format!("scale_form {other:?} is not registered")),
    }
    let rank = object.shape.len() as u64;
    if axis >= rank {
        return fail(format!("axis {axis} is not below the rank {rank}"));
    }
    let along = object.shape[axis as usize];
    if group_size != 0 && along % group_size != 0 {
        return fail(format!("group_size {group_size} does not divide shape[{axis}] = {along}"));
    }
    let groups = along.checked_div(group_size).unwrap_or(along);
    let lanes = elements.checked_div(along).unwrap_or(0);
    let group_count = groups.checked_mul(lanes);
    if elements % per_word != 0 {
        return fail(format!("{elements} codes do not fill whole {per_word}-code words"));
    }
    expect_size(object, data, "decoded size of packed data", (elements / per_word).checked_mul(word.width()))?;
    expect_size(
        object,
        scales,
        "decoded size of scales",
        group_count.and_then(|g| g.checked_mul(scales.dtype.width())),
    )?;
    if has_zeros {
        let zeros = part_of(object, "zeros");
        let expected = match zero_point.required_text("packing")? {
            "plain" => group_count.and_then(|g| g.checked_mul(zeros.dtype.width())),
            "same_as_data" => group_count.map(|g| g / per_word).and_then(|w| w.checked_mul(word.width())),
            other => return fail(format!("zero_point.packing {other:?} is not plain or same_as_data")),
        };
        expect_size(object, zeros, "decoded size of zeros", expected)?;
    }
    Ok(())
}

/// The blob rules (§2.4, §3.6 items 3 and 4), per file: aligned, not before byte 4096, inside
/// the file's data region, and pairwise identical or disjoint (with the manifest blob, in the
/// root). References into a shard are checked against the size its table entry declares.
fn check_blobs(manifest: &Manifest) -> Result<()> {
    let data_end = |file: usize| match file {
        0 => Some(manifest.file_len - FOOTER_LEN),
        i => manifest.shards[i - 1].size.checked_sub(FOOTER_LEN),
    };
    // Per file: (start, end, object index, component index); the manifest is (usize::MAX, 0).
    let mut by_file: BTreeMap<usize, Vec<(u64, u64, usize, usize)>> = BTreeMap::new();
    by_file.entry(0).or_default().push((manifest.manifest_span.start, manifest.manifest_span.end, usize::MAX, 0));
    for (oi, object) in manifest.objects.iter().enumerate() {
        for (ci, c) in object.components.iter().enumerate() {
            let at = || Location::component(&object.name, &c.role);
            if c.offset % BLOB_ALIGNMENT != 0 {
                return Err(FormatError::Misaligned { at: at(), offset: c.offset, alignment: BLOB_ALIGNMENT });
            }
            if c.offset < BLOB_ALIGNMENT {
                return Err(FormatError::RangeIntoHeader {
                    at: at(),
                    start: c.offset,
                    end: c.offset.saturating_add(c.stored_length),
                    header: BLOB_ALIGNMENT,
                });
            }
            let end = c.offset.checked_add(c.stored_length).ok_or(FormatError::RangeOverflow {
                at: at(),
                offset: c.offset,
                length: c.stored_length,
            })?;
            let limit = data_end(c.file).unwrap_or(0);
            if end > limit {
                return Err(FormatError::RangeIntoFooter { at: at(), start: c.offset, end, data_end: limit });
            }
            if c.stored_length > 0 {
                by_file.entry(c.file).or_default().push((c.offset, end, oi, ci));
            }
        }
    }
    let locate = |oi: usize, ci: usize| {
        if oi == usize::MAX {
            Location::object("(the manifest blob)")
        } else {
            let object = &manifest.objects[oi];
            Location::component(&object.name, &object.components[ci].role)
        }
    };
    for ranges in by_file.values_mut() {
        ranges.sort_unstable();
        let mut reach: Option<(u64, u64, usize, usize)> = None;
        for &range in ranges.iter() {
            if let Some(prev) = reach {
                if range.0 < prev.1 && (range.0, range.1) != (prev.0, prev.1) {
                    return Err(FormatError::Overlap {
                        first: locate(prev.2, prev.3),
                        first_start: prev.0,
                        first_end: prev.1,
                        second: locate(range.2, range.3),
                        second_start: range.0,
                        second_end: range.1,
                    });
                }
            }
            if reach.is_none_or(|prev| range.1 > prev.1) {
                reach = Some(range);
            }
        }
    }
    Ok(())
}

/// The data rules of an object, over its parts' decoded bytes: `bool` bytes are 0 or 1, the
/// unused final nibble of a packed `f4_e2m1` dense part is zero, and the sparse layouts'
/// indices are consistent, in range and (COO) unique.
pub(super) fn check_content<'a, F>(object: &Object, decoded: &mut F) -> Result<()>
where
    F: FnMut(&Component) -> Result<std::borrow::Cow<'a, [u8]>>,
{
    for component in &object.components {
        let at = || Location::component(&object.name, &component.role);
        match component.logical_type.as_deref() {
            Some("bool") => {
                let bytes = decoded(component)?;
                if let Some(index) = bytes.iter().position(|&b| b > 1) {
                    return Err(FormatError::BoolByte { at: at(), index: index as u64, value: bytes[index] });
                }
            }
            Some("f4_e2m1") if object.format == "dense" => {
                let elements = object.element_count().unwrap_or(0);
                if elements % 2 == 1 {
                    let bytes = decoded(component)?;
                    if bytes.last().is_some_and(|last| last >> 4 != 0) {
                        return Err(FormatError::PackedPadding { at: at() });
                    }
                }
            }
            _ => {}
        }
    }
    match object.format.as_str() {
        "zt.sparse_csr/1" => check_csr(object, decoded),
        "zt.sparse_coo/1" => check_coo(object, decoded),
        _ => Ok(()),
    }
}

fn sparse_error(object: &Object, role: &str, detail: String) -> FormatError {
    FormatError::SparseStructure { at: Location::component(&object.name, role), detail }
}

/// Little-endian unsigned integers of `width` bytes (4 or 8).
fn indices(bytes: &[u8], width: u64) -> impl Iterator<Item = u64> + '_ {
    bytes.chunks_exact(width as usize).map(|c| match c.len() {
        4 => u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes"))),
        _ => u64::from_le_bytes(c.try_into().expect("8 bytes")),
    })
}

fn check_csr<'a, F>(object: &Object, decoded: &mut F) -> Result<()>
where
    F: FnMut(&Component) -> Result<std::borrow::Cow<'a, [u8]>>,
{
    let cols = object.shape[1];
    let (indptr_part, indices_part) = (part_of(object, "indptr"), part_of(object, "indices"));
    let width = indices_part.dtype.width();
    let nnz = indices_part.decoded_length / width;
    let pointers: Vec<u64> = indices(&decoded(indptr_part)?, width).collect();
    if pointers.first().is_some_and(|&p| p != 0) {
        return Err(sparse_error(object, "indptr", format!("starts at {}, expected 0", pointers[0])));
    }
    if let Some(i) = pointers.windows(2).position(|w| w[1] < w[0]) {
        return Err(sparse_error(object, "indptr", format!("decreases at entry {}", i + 1)));
    }
    if pointers.last().is_some_and(|&p| p != nnz) {
        return Err(sparse_error(
            object,
            "indptr",
            format!("ends at {}, expected nnz = {nnz}", pointers[pointers.len() - 1]),
        ));
    }
    let columns: Vec<u64> = indices(&decoded(indices_part)?, width).collect();
    for (row, bounds) in pointers.windows(2).enumerate() {
        let row_columns = &columns[bounds[0] as usize..bounds[1] as usize];
        if let Some(&c) = row_columns.iter().find(|&&c| c >= cols) {
            return Err(sparse_error(object, "indices", format!("row {row} names column {c}, beyond {cols} columns")));
        }
        if row_columns.windows(2).any(|w| w[1] <= w[0]) {
            return Err(sparse_error(object, "indices", format!("row {row}'s columns are not strictly increasing")));
        }
    }
    Ok(())
}

fn check_coo<'a, F>(object: &Object, decoded: &mut F) -> Result<()>
where
    F: FnMut(&Component) -> Result<std::borrow::Cow<'a, [u8]>>,
{
    let coords_part = part_of(object, "coords");
    let width = coords_part.dtype.width();
    let ndim = object.shape.len();
    let nnz = (coords_part.decoded_length / width) as usize / ndim;
    let coords: Vec<u64> = indices(&decoded(coords_part)?, width).collect();
    for (d, &size) in object.shape.iter().enumerate() {
        if let Some(i) = coords[d * nnz..(d + 1) * nnz].iter().position(|&c| c >= size) {
            return Err(sparse_error(
                object,
                "coords",
                format!("element {i} has coordinate {} in dimension {d}, beyond its size {size}", coords[d * nnz + i]),
            ));
        }
    }
    let mut seen = HashSet::with_capacity(nnz);
    for i in 0..nnz {
        let cell: Vec<u64> = (0..ndim).map(|d| coords[d * nnz + i]).collect();
        if !seen.insert(cell) {
            return Err(sparse_error(object, "coords", format!("element {i} names a cell an earlier element names")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The official writer's seekable file, laid out again by [`plan`] at 4096 and 64 KiB:
    /// the same objects, the same decoded bytes, every digest still matching.
    #[test]
    fn a_planned_file_holds_the_same_parts() {
        let original = include_bytes!("../../fuzz/seeds/seed-official-2.1.2.zt");
        let manifest = crate::parse_file(original, &Limits::default()).unwrap();
        for alignment in [4096, 65536] {
            let objects: Vec<&Object> = manifest.objects.iter().collect();
            let plan = plan(&objects, manifest.attributes.as_ref(), alignment);
            let mut file = vec![0u8; (plan.tail_offset as usize) + plan.tail.len()];
            file[..8].copy_from_slice(V2_MAGIC);
            for (object, offsets) in manifest.objects.iter().zip(&plan.offsets) {
                for (c, &offset) in object.components.iter().zip(offsets) {
                    assert_eq!(offset % alignment, 0);
                    file[offset as usize..(offset + c.stored_length) as usize]
                        .copy_from_slice(&original[c.stored_range().start as usize..c.stored_range().end as usize]);
                }
            }
            file[plan.tail_offset as usize..].copy_from_slice(&plan.tail);
            let report = crate::verify::verify_file(&file, &Limits::default());
            assert!(report.is_valid() && report.digests_checked == 6, "{:?}", report.errors);
            let replanned = crate::parse_file(&file, &Limits::default()).unwrap();
            assert_eq!(replanned.attributes, manifest.attributes);
            for (a, b) in manifest.objects.iter().zip(&replanned.objects) {
                assert_eq!((&a.name, &a.shape, &a.format), (&b.name, &b.shape, &b.format));
            }
        }
    }
}
