//! The file subcommands: `inspect`, `verify`, `cat` and `convert`. Each takes paths and
//! writers so tests drive them directly; `main.rs` only parses arguments and sets exit codes.

use std::io::{self, Write};
use std::path::Path;

use anyhow::{Context, anyhow, bail};
use serde_json::json;

use crate::format::decode::{DECODE_PIECE, stored_bytes, verify_digest};
use crate::format::json::{cbor_to_json, manifest_json};
use crate::format::write::{ComponentInput, DigestAlgorithm, ObjectInput, WriteOptions, Writer};
use crate::format::{self, DType, Limits, Manifest, Value};
use crate::storage::local::MappedFile;

fn open(path: &Path, limits: &Limits) -> anyhow::Result<(MappedFile, Manifest)> {
    let file = MappedFile::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let manifest =
        format::parse_file(&file, limits).with_context(|| format!("{} is not a valid .zt file", path.display()))?;
    Ok((file, manifest))
}

/// Escapes control characters so hostile names cannot rewrite the terminal.
fn shown(name: &str) -> String {
    if name.chars().any(|c| c.is_control()) || name.is_empty() { format!("{name:?}") } else { name.to_owned() }
}

/// `inspect`: version, attributes and a table of objects.
pub fn inspect(path: &Path, as_json: bool, limits: &Limits, out: &mut dyn Write) -> anyhow::Result<()> {
    let (_file, manifest) = open(path, limits)?;
    if as_json {
        serde_json::to_writer_pretty(&mut *out, &manifest_json(&manifest))?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "file:       {}", path.display())?;
    writeln!(out, "container:  {}", manifest.container)?;
    writeln!(out, "version:    {}", manifest.version.as_deref().unwrap_or("(none: 0.1 files carry no version)"))?;
    let attributes = manifest.attributes.as_ref().map_or("(none)".to_owned(), |a| cbor_to_json(a).to_string());
    writeln!(out, "attributes: {attributes}")?;
    writeln!(out, "objects:    {}", manifest.objects.len())?;
    let mut rows = vec![
        ["NAME", "FORMAT", "SHAPE", "COMPONENT", "DTYPE", "TYPE", "ENCODING", "STORED", "DECODED"].map(String::from),
    ];
    for object in &manifest.objects {
        for (i, c) in object.components.iter().enumerate() {
            let first = i == 0;
            rows.push([
                if first { shown(&object.name) } else { String::new() },
                if first { shown(&object.format) } else { String::new() },
                if first { format!("{:?}", object.shape) } else { String::new() },
                shown(&c.role),
                c.dtype.name().to_owned(),
                c.logical_type.as_deref().map_or("-".to_owned(), shown),
                c.encoding.name().to_owned(),
                c.stored_length.to_string(),
                c.decoded_length.to_string(),
            ]);
        }
        if object.components.is_empty() {
            rows.push([
                shown(&object.name),
                shown(&object.format),
                format!("{:?}", object.shape),
                "-".into(),
                "".into(),
                "".into(),
                "".into(),
                "0".into(),
                "0".into(),
            ]);
        }
    }
    let widths: Vec<usize> = (0..9).map(|col| rows.iter().map(|r| r[col].chars().count()).max().unwrap_or(0)).collect();
    for row in &rows {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        writeln!(out, "{}", line.join("  ").trim_end())?;
    }
    Ok(())
}

/// `verify`: returns whether the file is valid, after printing the report.
pub fn verify(path: &Path, as_json: bool, limits: &Limits, out: &mut dyn Write) -> anyhow::Result<bool> {
    let file = MappedFile::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let report = format::verify::verify_file(&file, limits);
    if as_json {
        let errors: Vec<_> =
            report.errors.iter().map(|e| json!({ "code": e.code(), "message": e.to_string() })).collect();
        let body = json!({
            "file": path.display().to_string(),
            "valid": report.is_valid(),
            "objects": report.objects,
            "components": report.components,
            "digests_checked": report.digests_checked,
            "errors": errors,
        });
        serde_json::to_writer_pretty(&mut *out, &body)?;
        writeln!(out)?;
    } else if report.is_valid() {
        writeln!(
            out,
            "valid: {} objects, {} components decoded, {} digests verified",
            report.objects, report.components, report.digests_checked
        )?;
    } else {
        for e in &report.errors {
            writeln!(out, "invalid [{}]: {e}", e.code())?;
        }
    }
    Ok(report.is_valid())
}

/// `cat`: the decoded little-endian bytes of one component, after checking its digest.
pub fn cat(
    path: &Path,
    object_name: &str,
    role: Option<&str>,
    limits: &Limits,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let (file, manifest) = open(path, limits)?;
    let object =
        manifest.object(object_name).ok_or_else(|| anyhow!("no object named {object_name:?} in {}", path.display()))?;
    let roles = || object.components.iter().map(|c| format!("{:?}", c.role)).collect::<Vec<_>>().join(", ");
    let component = match role {
        Some(role) => object.component(role).ok_or_else(|| {
            anyhow!("object {object_name:?} has no component {role:?}; its components are {}", roles())
        })?,
        None => match &object.components[..] {
            [only] => only,
            [] => bail!("object {object_name:?} has no components"),
            _ => bail!("object {object_name:?} has several components ({}): choose one with --component", roles()),
        },
    };
    let stored = stored_bytes(&file, &object.name, component)?;
    verify_digest(&object.name, component, stored)?;
    if component.is_verbatim() {
        out.write_all(stored)?;
    } else {
        decode_pipelined(&object.name, component, stored, out)?;
    }
    out.flush()?;
    Ok(())
}

/// Decodes on this thread while another writes, so decoding and output overlap (as the
/// `zstd` CLI's asynchronous I/O does). Buffers circulate between the two through bounded
/// channels, so memory stays at a few pieces whatever the component's size.
fn decode_pipelined(
    object: &str,
    component: &format::Component,
    stored: &[u8],
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    const IN_FLIGHT: usize = 4;
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<(Vec<u8>, usize)>(IN_FLIGHT);
    let (empty_tx, empty_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(IN_FLIGHT);
    for _ in 0..IN_FLIGHT {
        empty_tx.send(vec![0u8; DECODE_PIECE]).expect("channel has room");
    }
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> io::Result<()> {
            for (buffer, len) in full_rx {
                out.write_all(&buffer[..len])?;
                // The decoder may have finished and dropped its receiver; nothing to recycle then.
                let _ = empty_tx.send(buffer);
            }
            Ok(())
        });
        let mut decoder = format::decode::Decoder::new(object, component)?;
        let mut input = stored;
        let decoded = loop {
            // A closed channel means the writer failed; its error is reported below.
            let Ok(mut buffer) = empty_rx.recv() else { break Ok(()) };
            let progress = match decoder.decode(input, &mut buffer) {
                Ok(p) => p,
                Err(e) => break Err(e),
            };
            input = &input[progress.consumed..];
            if progress.written > 0 && full_tx.send((buffer, progress.written)).is_err() {
                break Ok(());
            }
            if input.is_empty() && progress.written == 0 && progress.consumed == 0 {
                break decoder.finish();
            }
        };
        drop(full_tx);
        writer.join().expect("writer thread does not panic")?;
        decoded?;
        Ok(())
    })
}

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

/// Deterministic little-endian bytes of `n` values produced by `f`.
fn le_bytes<T, const W: usize>(n: usize, f: impl Fn(usize) -> T, to_le: impl Fn(T) -> [u8; W]) -> Vec<u8> {
    (0..n).flat_map(|i| to_le(f(i))).collect()
}

fn text_map(entries: &[(&str, Value)]) -> Value {
    Value::Map(entries.iter().map(|(k, v)| (Value::Text((*k).to_owned()), v.clone())).collect())
}

/// `write-demo`: the demo models `serve` shows by default, written by our own writer. They
/// cover every format, raw and zstd, both digests, file and object attributes, a logical type
/// and names that need percent-encoding. Output is deterministic, so the committed files can
/// be regenerated and compared.
pub fn write_demo(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let demo = dir.join("demo");
    std::fs::create_dir_all(&demo)?;
    let half = |x: f32| -> [u8; 2] {
        // f32 → f16 for values that f16 holds exactly (small multiples of 1/8).
        let bits = x.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        if x == 0.0 {
            return sign.to_le_bytes();
        }
        let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
        let mantissa = ((bits >> 13) & 0x3ff) as u16;
        (sign | ((exp as u16) << 10) | mantissa).to_le_bytes()
    };
    let sha = WriteOptions { zstd_level: None, digest: Some(DigestAlgorithm::Sha256) };
    let crc = WriteOptions { zstd_level: None, digest: Some(DigestAlgorithm::Crc32c) };
    let zstd = WriteOptions { zstd_level: Some(9), digest: Some(DigestAlgorithm::Sha256) };
    let raw = WriteOptions::default();

    let embed = le_bytes(64 * 32, |i| ((i % 97) as f32 - 48.0) / 16.0, f32::to_le_bytes);
    let bias = le_bytes(32, |i| (i as f32 - 16.0) / 8.0, half);
    let counts = le_bytes(4096, |i| (i / 64) as i64, i64::to_le_bytes);
    let mask: Vec<u8> = (0..16).map(|i| u8::from(i % 3 == 0)).collect();
    let scalar = 2.5f64.to_le_bytes().to_vec();
    let bf16 = le_bytes(64, |i| ((i as f32 / 8.0).to_bits() >> 16) as u16, u16::to_le_bytes);
    let fp8: Vec<u8> = (0..32).map(|i| (i * 7) as u8).collect();
    let dense = |name: &'static str, shape: &'static [u64], dtype, logical_type, bytes: &'static [u8], attributes| {
        ObjectInput {
            name,
            shape,
            format: "dense",
            attributes,
            components: vec![ComponentInput { role: "data", dtype, logical_type, bytes }],
        }
    };
    let leak = |v: Vec<u8>| -> &'static [u8] { v.leak() };
    let layer_attributes = text_map(&[("layer", Value::Integer(0.into())), ("trainable", Value::Bool(true))]);
    let mut writer = Writer::new(Vec::new())?;
    for (object, options) in [
        (dense("embed.weight", &[64, 32], DType::F32, None, leak(embed), None), sha),
        (dense("layers.0.bias", &[32], DType::F16, None, leak(bias), Some(layer_attributes)), crc),
        (dense("counts", &[4096], DType::I64, None, leak(counts), None), zstd),
        (dense("mask", &[16], DType::Bool, None, leak(mask), None), raw),
        (dense("scale", &[], DType::F64, None, leak(scalar), None), raw),
        (dense("head.weight", &[8, 8], DType::BF16, None, leak(bf16), None), zstd),
        (dense("fp8.weight", &[32], DType::U8, Some("f8_e4m3fn"), leak(fp8), None), crc),
    ] {
        writer.add(&object, &options)?;
    }
    let file_attributes = text_map(&[
        ("description", Value::Text("ztserve demo: dense tensors of several dtypes, zstd, digests".into())),
        ("license", Value::Text("Apache-2.0".into())),
        ("written_by", Value::Text("ztserve write-demo".into())),
    ]);
    let dense_path = demo.join("dense.zt");
    std::fs::write(&dense_path, writer.finish(Some(file_attributes))?)?;

    let u64s = |v: &[u64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let csr_values = le_bytes(6, |i| i as f32 + 1.0, f32::to_le_bytes);
    let csr_indices = u64s(&[0, 3, 1, 7, 2, 5]);
    let csr_indptr = u64s(&[0, 2, 2, 3, 3, 3, 4, 4, 6]);
    let coo_values = le_bytes(3, |i| (i as i32 + 1) * 10, i32::to_le_bytes);
    let coo_coords = u64s(&[0, 1, 3, 4, 0, 2, 5, 0, 1]);
    let packed = le_bytes(64 * 64 / 8, |i| (i as u32).wrapping_mul(2_654_435_761) as i32, i32::to_le_bytes);
    let scales = le_bytes(64 * 64 / 32, |i| (i % 8) as f32 / 8.0 + 0.125, half);
    let zeros = le_bytes(64 * 64 / 32, |i| (i % 4) as f32, half);
    let lut: Vec<u8> = (0..=255).collect();
    let quant_attributes = text_map(&[
        ("bits", Value::Integer(4.into())),
        ("group_size", Value::Integer(32.into())),
        ("packing", Value::Text("8_per_i32".into())),
    ]);
    let c = |role, dtype, bytes| ComponentInput { role, dtype, logical_type: None, bytes };
    let mut writer = Writer::new(Vec::new())?;
    let objects = [
        (
            ObjectInput {
                name: "adjacency",
                shape: &[8, 8],
                format: "sparse_csr",
                attributes: None,
                components: vec![
                    c("values", DType::F32, &csr_values),
                    c("indices", DType::U64, &csr_indices),
                    c("indptr", DType::U64, &csr_indptr),
                ],
            },
            sha,
        ),
        (
            ObjectInput {
                name: "points",
                shape: &[4, 5, 6],
                format: "sparse_coo",
                attributes: None,
                components: vec![c("values", DType::I32, &coo_values), c("coords", DType::U64, &coo_coords)],
            },
            zstd,
        ),
        (
            ObjectInput {
                name: "layers.0.q_proj",
                shape: &[64, 64],
                format: "quantized_group",
                attributes: Some(quant_attributes),
                components: vec![
                    c("packed_weight", DType::I32, &packed),
                    c("scales", DType::F16, &scales),
                    c("zeros", DType::F16, &zeros),
                ],
            },
            crc,
        ),
        (
            ObjectInput {
                name: "vendor/lookup table ü %?#",
                shape: &[256],
                format: "x_vendor.lut",
                attributes: None,
                components: vec![c("table", DType::U8, &lut)],
            },
            raw,
        ),
    ];
    for (object, options) in &objects {
        writer.add(object, options)?;
    }
    let structured_path = demo.join("structured.zt");
    let attributes = text_map(&[(
        "description",
        Value::Text("ztserve demo: sparse CSR and COO, quantized_group, a custom format".into()),
    )]);
    std::fs::write(&structured_path, writer.finish(Some(attributes))?)?;
    Ok(vec![dense_path, structured_path])
}
