//! `ztserve convert`: anything ztserve reads (a zTensor file of any generation, 0.1 to v2 with
//! its shards; a safetensors file; a checkpoint's index) to a `.zt` file, written atomically: a
//! 1.2 file by this crate's writer, or a v2 file by the official `ztensor` crate's (canonical
//! when raw, `zt.zstd-seekable/1` parts when compressed). It is how 1.x files, which `ztensor`
//! 2.x cannot open, become v2. Every component is checked against its digest and decoded to
//! its little-endian bytes first, one object at a time.

use std::io::{self};
use std::path::Path;

use anyhow::{Context, anyhow, bail};

use crate::format::write::{ComponentInput, DigestAlgorithm, ObjectInput, WriteOptions, Writer};
use crate::format::{DType, Limits, Value};

/// `--compress` and `--digest` of `convert`.
pub(super) fn parse_compress(text: &str) -> anyhow::Result<Option<i32>> {
    match text.split_once(':') {
        None if text == "none" || text == "raw" => Ok(None),
        None if text == "zstd" => Ok(Some(3)),
        Some(("zstd", level)) => {
            let level: i32 = level.parse().with_context(|| format!("zstd level {level:?} is not a number"))?;
            let range = zstd::compression_level_range();
            if !range.contains(&level) {
                bail!("zstd level {level} is outside {}..={}", range.start(), range.end());
            }
            Ok(Some(level))
        }
        _ => bail!("--compress takes none, zstd or zstd:LEVEL, not {text:?}"),
    }
}

pub(super) fn parse_digest(text: &str) -> anyhow::Result<Option<DigestAlgorithm>> {
    match text {
        "none" => Ok(None),
        "sha256" => Ok(Some(DigestAlgorithm::Sha256)),
        "crc32c" => Ok(Some(DigestAlgorithm::Crc32c)),
        _ => bail!("--digest takes none, sha256 or crc32c, not {text:?}"),
    }
}

/// What `convert` writes.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// A 1.2 file, by this crate's writer.
    V1_2(WriteOptions),
    /// A v2 file, by the official writer: canonical (64 KiB placement, xxh3 digests), or with
    /// every part `zt.zstd-seekable/1` (1 MiB frames at level 3, the official encoder's).
    V2 { seekable: bool },
}

impl Target {
    /// `--format`, `--compress` and `--digest` of `convert`.
    pub fn parse(format: &str, compress: &str, digest: &str) -> anyhow::Result<Target> {
        match format {
            "1.2" => {
                Ok(Target::V1_2(WriteOptions { zstd_level: parse_compress(compress)?, digest: parse_digest(digest)? }))
            }
            "v2" => {
                let seekable = match compress {
                    "none" | "raw" => false,
                    "zstd" => true,
                    _ => bail!(
                        "--format v2 takes --compress none or zstd (the seekable encoding's level is the official writer's, 3), not {compress:?}"
                    ),
                };
                if !matches!(digest, "none" | "xxh3") {
                    bail!("--format v2 writes an xxh3 digest on every part; --digest {digest:?} is for --format 1.2");
                }
                Ok(Target::V2 { seekable })
            }
            _ => bail!("--format takes 1.2 or v2, not {format:?}"),
        }
    }
}

/// One component of an object of the input, decoded.
struct Part<'a> {
    role: &'a str,
    dtype: DType,
    logical_type: Option<&'a str>,
    bytes: std::borrow::Cow<'a, [u8]>,
}

/// One object of the input, its components decoded.
struct Item<'a> {
    name: &'a str,
    /// The input's format (1.x) or layout (v2).
    format: &'a str,
    shape: &'a [u64],
    attributes: Option<&'a Value>,
    parts: Vec<Part<'a>>,
}

/// `convert`: a `.zt` file of any generation (with a v2 root's shards, found beside it), a
/// safetensors file, or a sharded checkpoint given by its index, to a `.zt` file, written
/// atomically (a temporary file beside the output, renamed into place only when complete).
/// Objects are written in name order so the output depends only on the input's content; the
/// input's attributes (a checkpoint's `__metadata__`, an index's `metadata`) become the
/// file's. Each component's digest is checked before it is written.
pub fn convert(input: &Path, output: &Path, target: &Target) -> anyhow::Result<usize> {
    if super::kind_of(input).is_none() {
        bail!("{} is not a .zt file, a .safetensors file or a .safetensors.index.json", input.display());
    }
    let opened = super::open(input, &Limits::default())?;
    let manifest = &opened.manifest;
    let shards = super::shards_beside(input, manifest, true)
        .into_iter()
        .map(|found| found.map(|(_, file)| file))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: a shard is not usable", input.display()))?;
    let files: Vec<&[u8]> = opened.files.iter().chain(&shards).map(|f| &f[..]).collect();
    let mut objects: Vec<&crate::format::Object> = manifest.objects.iter().collect();
    objects.sort_by(|a, b| a.name.cmp(&b.name));
    let items = objects.iter().map(|object| decoded(object, &files));
    let attributes = manifest.attributes.clone();
    match target {
        Target::V1_2(options) => write_v1_2(items, attributes, output, options)?,
        Target::V2 { seekable } => write_v2(items, attributes.as_ref(), output, *seekable)?,
    }
    Ok(objects.len())
}

/// `object` with each component digest-checked and decoded from `files` (the model's files,
/// by the index components name).
fn decoded<'a>(object: &'a crate::format::Object, files: &[&'a [u8]]) -> anyhow::Result<Item<'a>> {
    use crate::format::DigestScope;
    use crate::format::decode::{decode_component, stored_bytes, verify_digest};
    let mut parts = Vec::with_capacity(object.components.len());
    for component in &object.components {
        let file = files
            .get(component.file)
            .with_context(|| format!("object {:?}: no file {}", object.name, component.file))?;
        let stored = stored_bytes(file, &object.name, component)?;
        if component.is_verbatim() || component.digest_scope == DigestScope::Stored {
            verify_digest(&object.name, component, stored)?;
        }
        let bytes = decode_component(&object.name, component, stored)?;
        if !component.is_verbatim() && component.digest_scope == DigestScope::Decoded {
            verify_digest(&object.name, component, &bytes)?;
        }
        parts.push(Part {
            role: &component.role,
            dtype: component.dtype,
            logical_type: crate::format::gguf::declared_logical_type(object, component),
            bytes,
        });
    }
    Ok(Item {
        name: &object.name,
        format: &object.format,
        shape: &object.shape,
        attributes: object.attributes.as_ref(),
        parts,
    })
}

/// 1.2 stores bool as its own dtype and names only the f8 and complex logical types.
fn v1_2_dtype<'a>(object: &str, part: &Part<'a>) -> anyhow::Result<(DType, Option<&'a str>)> {
    match part.logical_type {
        None => Ok((part.dtype, None)),
        Some("bool") => Ok((DType::Bool, None)),
        Some(logical) if crate::format::known_logical_type(logical).is_some() => Ok((part.dtype, Some(logical))),
        Some(logical) => bail!("object {object:?}: {logical} has no zTensor 1.2 type; --format v2 has it"),
    }
}

/// v2's CSR layout is 1.x's `sparse_csr`; other names are the same in both, or custom.
const V2_CSR: &str = "zt.sparse_csr/1";

fn write_v1_2<'a>(
    items: impl Iterator<Item = anyhow::Result<Item<'a>>>,
    attributes: Option<Value>,
    output: &Path,
    options: &WriteOptions,
) -> anyhow::Result<()> {
    let dir = output.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let temp = tempfile::Builder::new().prefix(".ztserve-convert").tempfile_in(dir)?;
    let mut writer = Writer::new(io::BufWriter::with_capacity(1 << 20, temp))?;
    for item in items {
        let mut item = item?;
        let format = if item.format == V2_CSR { "sparse_csr" } else { item.format };
        if format == "sparse_csr" {
            // 1.x requires u64 indices; v2 allows u32, widened here without loss.
            for part in item.parts.iter_mut().filter(|p| matches!(p.role, "indices" | "indptr")) {
                if part.dtype == DType::U32 {
                    let wide: Vec<u8> = part
                        .bytes
                        .chunks_exact(4)
                        .flat_map(|b| u64::from(u32::from_le_bytes(b.try_into().expect("4 bytes"))).to_le_bytes())
                        .collect();
                    (part.dtype, part.bytes) = (DType::U64, wide.into());
                }
            }
        }
        let mut components = Vec::with_capacity(item.parts.len());
        for part in &item.parts {
            let (dtype, logical_type) = v1_2_dtype(item.name, part)?;
            components.push(ComponentInput { role: part.role, dtype, logical_type, bytes: &part.bytes });
        }
        let object = ObjectInput {
            name: item.name,
            shape: item.shape,
            format,
            attributes: item.attributes.cloned(),
            components,
        };
        writer.add(&object, options).with_context(|| format!("object {:?}", item.name))?;
    }
    let temp = writer.finish(attributes)?.into_inner().map_err(|e| e.into_error())?;
    temp.as_file().sync_all()?;
    temp.persist(output).map_err(|e| e.error).with_context(|| format!("cannot write {}", output.display()))?;
    Ok(())
}

/// A v2 file by the official writer, published atomically (it writes a partial file beside
/// the output and renames it into place on finish; a failure abandons it).
fn write_v2<'a>(
    items: impl Iterator<Item = anyhow::Result<Item<'a>>>,
    attributes: Option<&Value>,
    output: &Path,
    seekable: bool,
) -> anyhow::Result<()> {
    let mut writer = ztensor::Writer::options()
        .canonical(!seekable)
        .publish(output)
        .map_err(|e| anyhow!("cannot write {}: {e}", output.display()))?;
    let written = (|| -> anyhow::Result<()> {
        for item in items {
            let item = item?;
            let layout = if item.format == "sparse_csr" { V2_CSR } else { item.format };
            let mut parts = Vec::with_capacity(item.parts.len());
            for part in &item.parts {
                // 1.x's bool dtype is v2's bool type over u8.
                let (dtype, logical) = match (part.dtype, part.logical_type) {
                    (DType::Bool, None) => (DType::U8, Some("bool")),
                    other => other,
                };
                if logical.is_some_and(|l| crate::format::v2::logical_size(l).is_none()) {
                    bail!("object {:?}: {} has no zTensor v2 logical type", item.name, logical.unwrap_or_default());
                }
                let dtype: ztensor::DType =
                    dtype.name().parse().map_err(|_| anyhow!("dtype {dtype} has no v2 equivalent"))?;
                parts.push((part.role, dtype, logical, &part.bytes[..]));
            }
            let attributes = item.attributes.map(official_cbor).transpose()?;
            writer
                .object(item.name, |mut o| {
                    o = o.shape(item.shape.to_vec()).layout(layout);
                    if let Some(attributes) = attributes {
                        o = o.attributes(attributes);
                    }
                    for (role, dtype, logical, bytes) in parts {
                        o = o.part(role, |mut p| {
                            p = p.dtype(dtype);
                            if let Some(logical) = logical {
                                p = p.logical(logical);
                            }
                            if seekable {
                                p = p.encoding(crate::format::v2::ZSTD_SEEKABLE);
                            }
                            p.bytes(bytes)
                        });
                    }
                    o
                })
                .map_err(|e| anyhow!("object {:?}: {e}", item.name))?;
        }
        if let Some(attributes) = attributes {
            writer.set_attributes(official_cbor(attributes)?);
        }
        Ok(())
    })();
    match written {
        Ok(()) => writer.finish().map(drop).map_err(|e| anyhow!("cannot write {}: {e}", output.display())),
        Err(e) => {
            writer.abandon();
            Err(e)
        }
    }
}

/// A CBOR value in the official crate's model (which has no tags).
fn official_cbor(value: &Value) -> anyhow::Result<ztensor::format::cbor::Value> {
    use ztensor::format::cbor::Value as Official;
    Ok(match value {
        Value::Integer(i) => {
            let wide = i128::from(*i);
            match u64::try_from(wide) {
                Ok(n) => Official::Uint(n),
                Err(_) => Official::Nint(u64::try_from(-1 - wide).map_err(|_| anyhow!("integer {wide} out of range"))?),
            }
        }
        Value::Bytes(b) => Official::Bytes(b.clone()),
        Value::Text(t) => Official::Text(t.clone()),
        Value::Array(items) => Official::Array(items.iter().map(official_cbor).collect::<anyhow::Result<_>>()?),
        Value::Map(entries) => Official::Map(
            entries.iter().map(|(k, v)| Ok((official_cbor(k)?, official_cbor(v)?))).collect::<anyhow::Result<_>>()?,
        ),
        Value::Bool(b) => Official::Bool(*b),
        Value::Null => Official::Null,
        Value::Float(f) => Official::Float(*f),
        other => bail!("attribute value {other:?} has no v2 form"),
    })
}
