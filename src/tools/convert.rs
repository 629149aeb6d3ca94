//! `ztserve convert`: a safetensors checkpoint to a `.zt` file, written atomically: a 1.2 file
//! by this crate's writer, or a v2 file by the official `ztensor` crate's (canonical when raw,
//! `zt.zstd-seekable/1` parts when compressed).

use std::io::{self};
use std::path::Path;

use anyhow::{Context, anyhow, bail};

use crate::format::write::{ComponentInput, DigestAlgorithm, ObjectInput, WriteOptions, Writer};
use crate::format::{DType, Value};
use crate::storage::mapped::MappedFile;

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

/// Maps a safetensors dtype to a storage dtype and logical type.
fn safetensors_dtype(dtype: safetensors::Dtype) -> anyhow::Result<(DType, Option<&'static str>)> {
    use safetensors::Dtype as S;
    Ok(match dtype {
        S::BOOL => (DType::Bool, None),
        S::U8 => (DType::U8, None),
        S::I8 => (DType::I8, None),
        S::U16 => (DType::U16, None),
        S::I16 => (DType::I16, None),
        S::F16 => (DType::F16, None),
        S::BF16 => (DType::BF16, None),
        S::U32 => (DType::U32, None),
        S::I32 => (DType::I32, None),
        S::F32 => (DType::F32, None),
        S::U64 => (DType::U64, None),
        S::I64 => (DType::I64, None),
        S::F64 => (DType::F64, None),
        S::F8_E4M3 => (DType::U8, Some("f8_e4m3fn")),
        S::F8_E5M2 => (DType::U8, Some("f8_e5m2")),
        other => bail!("safetensors dtype {other:?} has no zTensor equivalent"),
    })
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
    logical_type: Option<&'static str>,
    shape: Vec<u64>,
    bytes: &'a [u8],
}

/// `convert`: a safetensors file to a `.zt` file, written atomically (a temporary file beside
/// the output, renamed into place only when complete). Tensors are written in name order so
/// the output depends only on the input's content; `__metadata__` becomes the file's
/// attributes.
pub fn convert(input: &Path, output: &Path, target: &Target) -> anyhow::Result<usize> {
    let file = MappedFile::open(input).with_context(|| format!("cannot open {}", input.display()))?;
    let tensors = safetensors::SafeTensors::deserialize(&file)
        .map_err(|e| anyhow!("{} is not a valid safetensors file: {e}", input.display()))?;
    let (_, metadata) = safetensors::SafeTensors::read_metadata(&file).map_err(|e| anyhow!("{e}"))?;
    let mut names: Vec<&str> = tensors.names();
    names.sort();
    let mut inputs = Vec::with_capacity(names.len());
    for name in &names {
        let view = tensors.tensor(name).map_err(|e| anyhow!("tensor {name:?}: {e}"))?;
        let (dtype, logical_type) = safetensors_dtype(view.dtype()).with_context(|| format!("tensor {name:?}"))?;
        let shape = view.shape().iter().map(|&d| d as u64).collect();
        inputs.push(Tensor { name, dtype, logical_type, shape, bytes: view.data() });
    }
    let mut attributes: Vec<(&String, &String)> = metadata.metadata().iter().flatten().collect();
    attributes.sort();
    match target {
        Target::V1_2(options) => write_v1_2(&inputs, &attributes, output, options)?,
        Target::V2 { seekable } => write_v2(&inputs, &attributes, output, *seekable)?,
    }
    Ok(names.len())
}

fn write_v1_2(
    tensors: &[Tensor<'_>],
    attributes: &[(&String, &String)],
    output: &Path,
    options: &WriteOptions,
) -> anyhow::Result<()> {
    let dir = output.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let temp = tempfile::Builder::new().prefix(".ztserve-convert").tempfile_in(dir)?;
    let mut writer = Writer::new(io::BufWriter::with_capacity(1 << 20, temp))?;
    for tensor in tensors {
        let object = ObjectInput {
            name: tensor.name,
            shape: &tensor.shape,
            format: "dense",
            attributes: None,
            components: vec![ComponentInput {
                role: "data",
                dtype: tensor.dtype,
                logical_type: tensor.logical_type,
                bytes: tensor.bytes,
            }],
        };
        writer.add(&object, options).with_context(|| format!("tensor {:?}", tensor.name))?;
    }
    let attributes = (!attributes.is_empty()).then(|| {
        Value::Map(attributes.iter().map(|(k, v)| (Value::Text((*k).clone()), Value::Text((*v).clone()))).collect())
    });
    let temp = writer.finish(attributes)?.into_inner().map_err(|e| e.into_error())?;
    temp.as_file().sync_all()?;
    temp.persist(output).map_err(|e| e.error).with_context(|| format!("cannot write {}", output.display()))?;
    Ok(())
}

/// A v2 file by the official writer, published atomically (it writes a partial file beside
/// the output and renames it into place on finish; a failure abandons it).
fn write_v2(
    tensors: &[Tensor<'_>],
    attributes: &[(&String, &String)],
    output: &Path,
    seekable: bool,
) -> anyhow::Result<()> {
    let mut writer = ztensor::Writer::options()
        .canonical(!seekable)
        .publish(output)
        .map_err(|e| anyhow!("cannot write {}: {e}", output.display()))?;
    let written = (|| -> anyhow::Result<()> {
        for tensor in tensors {
            // v2 has no bool storage type: bool is a logical type over u8.
            let (dtype, logical) = match tensor.dtype {
                DType::Bool => (DType::U8, Some("bool")),
                dtype => (dtype, tensor.logical_type),
            };
            let dtype: ztensor::DType =
                dtype.name().parse().map_err(|_| anyhow!("dtype {dtype} has no v2 equivalent"))?;
            writer
                .object(tensor.name, |o| {
                    o.shape(tensor.shape.clone()).part("data", |mut p| {
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
        if !attributes.is_empty() {
            let map = attributes
                .iter()
                .map(|(k, v)| {
                    (ztensor::format::cbor::Value::Text((*k).clone()), ztensor::format::cbor::Value::Text((*v).clone()))
                })
                .collect();
            writer.set_attributes(ztensor::format::cbor::Value::Map(map));
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
