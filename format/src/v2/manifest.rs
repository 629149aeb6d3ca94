//! The v2 manifest read into the generation-neutral model: the root map, the shard table, the
//! objects and their parts, with the name rules, the digests and the limits on names, ranks
//! and nesting; then each object's layout rules and the file's blob rules.

use std::ops::Range;

use super::blobs::check_blobs;
use super::layouts::{check_layout, logical_size};
use crate::cbor::Fields;
use crate::{
    ByteOrder, Component, Container, DType, Digest, DigestScope, Encoding, FormatError, Limits, Location, Manifest,
    Object, Result, Shard, Value,
};

/// Longest object, part or attribute name, in bytes.
pub const MAX_NAME_LEN: usize = 1024;
/// Longest shard name, in bytes.
pub const MAX_SHARD_NAME_LEN: usize = 64;
/// Highest rank of a shape.
pub const MAX_RANK: usize = 64;
/// Deepest CBOR nesting, counted from the manifest root.
pub const MAX_DEPTH: usize = 32;
/// The one encoding profile registered: independent zstd frames and a seek table.
pub use crate::model::ZSTD_SEEKABLE;

/// Builds the model of a decoded v2 manifest found at `span` in a root file of `file_len`
/// bytes, and checks every metadata rule.
pub(crate) fn parse(root: Value, span: Range<u64>, file_len: u64, limits: &Limits) -> Result<Manifest> {
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
