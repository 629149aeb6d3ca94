//! `ztserve convert`: a safetensors checkpoint to a 1.2 `.zt` file, written atomically.

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

/// `convert`: a safetensors file to a 1.2 `.zt` file, written atomically (a temporary file
/// beside the output, renamed into place only when complete). Tensors are written in name
/// order so the output depends only on the input's content; `__metadata__` becomes the file's
/// attributes.
pub fn convert(input: &Path, output: &Path, options: &WriteOptions) -> anyhow::Result<usize> {
    let file = MappedFile::open(input).with_context(|| format!("cannot open {}", input.display()))?;
    let tensors = safetensors::SafeTensors::deserialize(&file)
        .map_err(|e| anyhow!("{} is not a valid safetensors file: {e}", input.display()))?;
    let (_, metadata) = safetensors::SafeTensors::read_metadata(&file).map_err(|e| anyhow!("{e}"))?;
    let mut names: Vec<String> = tensors.names().into_iter().map(str::to_owned).collect();
    names.sort();
    let dir = output.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let temp = tempfile::Builder::new().prefix(".ztserve-convert").tempfile_in(dir)?;
    let mut writer = Writer::new(io::BufWriter::with_capacity(1 << 20, temp))?;
    for name in &names {
        let view = tensors.tensor(name).map_err(|e| anyhow!("tensor {name:?}: {e}"))?;
        let (dtype, logical_type) = safetensors_dtype(view.dtype()).with_context(|| format!("tensor {name:?}"))?;
        let shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
        let object = ObjectInput {
            name,
            shape: &shape,
            format: "dense",
            attributes: None,
            components: vec![ComponentInput { role: "data", dtype, logical_type, bytes: view.data() }],
        };
        writer.add(&object, options).with_context(|| format!("tensor {name:?}"))?;
    }
    let attributes = metadata.metadata().as_ref().map(|m| {
        let mut entries: Vec<_> = m.iter().collect();
        entries.sort();
        Value::Map(entries.into_iter().map(|(k, v)| (Value::Text(k.clone()), Value::Text(v.clone()))).collect())
    });
    let temp = writer.finish(attributes)?.into_inner().map_err(|e| e.into_error())?;
    temp.as_file().sync_all()?;
    temp.persist(output).map_err(|e| e.error).with_context(|| format!("cannot write {}", output.display()))?;
    Ok(names.len())
}
