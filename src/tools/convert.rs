//! `ztserve convert`: a safetensors checkpoint to a `.zt` file, written atomically: a 1.2 file
//! by this crate's writer, or a v2 file by the official `ztensor` crate's (canonical when raw,
//! `zt.zstd-seekable/1` parts when compressed).

use std::io::{self};
use std::path::Path;

use anyhow::{Context, anyhow, bail};

use crate::format::write::{ComponentInput, DigestAlgorithm, ObjectInput, WriteOptions, Writer};
use crate::format::{DType, FileKind, Limits, Value};

/// `--compress` and `--digest` of `convert`.
pub fn parse_compress(text: &str) -> anyhow::Result<Option<i32>> {
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

pub fn parse_digest(text: &str) -> anyhow::Result<Option<DigestAlgorithm>> {
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

/// One tensor of the input.
struct Tensor<'a> {
    name: &'a str,
    dtype: DType,
    logical_type: Option<&'a str>,
    shape: &'a [u64],
    bytes: &'a [u8],
}

/// `convert`: a safetensors file, or a sharded checkpoint given by its index, to a `.zt` file,
/// written atomically (a temporary file beside the output, renamed into place only when
/// complete). Tensors are written in name order so the output depends only on the input's
/// content; the checkpoint's metadata (`__metadata__`, an index's `metadata`) becomes the
/// file's attributes.
pub fn convert(input: &Path, output: &Path, target: &Target) -> anyhow::Result<usize> {
    if !matches!(super::kind_of(input), Some(FileKind::Safetensors | FileKind::SafetensorsIndex)) {
        bail!("{} is not a .safetensors file or a .safetensors.index.json", input.display());
    }
    let opened = super::open(input, &Limits::default())?;
    let mut objects: Vec<&crate::format::Object> = opened.manifest.objects.iter().collect();
    objects.sort_by(|a, b| a.name.cmp(&b.name));
    let mut inputs = Vec::with_capacity(objects.len());
    for object in &objects {
        let data = &object.components[0];
        let bytes = crate::format::decode::stored_bytes(&opened.files[data.file], &object.name, data)?;
        inputs.push(Tensor {
            name: &object.name,
            dtype: data.dtype,
            logical_type: data.logical_type.as_deref(),
            shape: &object.shape,
            bytes,
        });
    }
    let attributes = opened.manifest.attributes.clone();
    match target {
        Target::V1_2(options) => write_v1_2(&inputs, attributes, output, options)?,
        Target::V2 { seekable } => write_v2(&inputs, attributes.as_ref(), output, *seekable)?,
    }
    Ok(objects.len())
}

/// 1.2 stores bool as its own dtype and names only the f8 and complex logical types.
fn v1_2_dtype<'a>(tensor: &Tensor<'a>) -> anyhow::Result<(DType, Option<&'a str>)> {
    match tensor.logical_type {
        None => Ok((tensor.dtype, None)),
        Some("bool") => Ok((DType::Bool, None)),
        Some(logical) if crate::format::known_logical_type(logical).is_some() => Ok((tensor.dtype, Some(logical))),
        Some(logical) => bail!("tensor {:?}: {logical} has no zTensor 1.2 type; --format v2 has it", tensor.name),
    }
}

fn write_v1_2(
    tensors: &[Tensor<'_>],
    attributes: Option<Value>,
    output: &Path,
    options: &WriteOptions,
) -> anyhow::Result<()> {
    let dir = output.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let temp = tempfile::Builder::new().prefix(".ztserve-convert").tempfile_in(dir)?;
    let mut writer = Writer::new(io::BufWriter::with_capacity(1 << 20, temp))?;
    for tensor in tensors {
        let (dtype, logical_type) = v1_2_dtype(tensor)?;
        let object = ObjectInput {
            name: tensor.name,
            shape: tensor.shape,
            format: "dense",
            attributes: None,
            components: vec![ComponentInput { role: "data", dtype, logical_type, bytes: tensor.bytes }],
        };
        writer.add(&object, options).with_context(|| format!("tensor {:?}", tensor.name))?;
    }
    let temp = writer.finish(attributes)?.into_inner().map_err(|e| e.into_error())?;
    temp.as_file().sync_all()?;
    temp.persist(output).map_err(|e| e.error).with_context(|| format!("cannot write {}", output.display()))?;
    Ok(())
}

/// A v2 file by the official writer, published atomically (it writes a partial file beside
/// the output and renames it into place on finish; a failure abandons it).
fn write_v2(tensors: &[Tensor<'_>], attributes: Option<&Value>, output: &Path, seekable: bool) -> anyhow::Result<()> {
    let mut writer = ztensor::Writer::options()
        .canonical(!seekable)
        .publish(output)
        .map_err(|e| anyhow!("cannot write {}: {e}", output.display()))?;
    let written = (|| -> anyhow::Result<()> {
        for tensor in tensors {
            let (dtype, logical) = (tensor.dtype, tensor.logical_type);
            if logical.is_some_and(|l| crate::format::v2::logical_size(l).is_none()) {
                bail!("tensor {:?}: {} has no zTensor v2 logical type", tensor.name, logical.unwrap_or_default());
            }
            let dtype: ztensor::DType =
                dtype.name().parse().map_err(|_| anyhow!("dtype {dtype} has no v2 equivalent"))?;
            writer
                .object(tensor.name, |o| {
                    o.shape(tensor.shape.to_vec()).part("data", |mut p| {
                        p = p.dtype(dtype);
                        if let Some(logical) = logical {
                            p = p.logical(logical);
                        }
                        if seekable {
                            p = p.encoding(crate::format::v2::ZSTD_SEEKABLE);
                        }
                        p.bytes(tensor.bytes)
                    })
                })
                .map_err(|e| anyhow!("tensor {:?}: {e}", tensor.name))?;
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
