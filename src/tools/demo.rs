//! `ztserve write-demo`: the demo models `serve` shows by default: 1.2 files by our own writer
//! (`demo/`), v2 files by the official `ztensor` crate's writer (`v2/`): a model with seekable
//! zstd parts, and one whose root names two data shards; and a safetensors checkpoint sharded
//! as Hugging Face shards (`hf/tiny-llama/`), by the `safetensors` crate; and a directory of two
//! GGUF quantizations of one tiny model (`gguf/tiny/`), one Hub repository.

use std::path::Path;

use crate::format::write::{ComponentInput, DigestAlgorithm, ObjectInput, WriteOptions, Writer};
use crate::format::{DType, Value};

/// Deterministic little-endian bytes of `n` values produced by `f`.
fn le_bytes<T, const W: usize>(n: usize, f: impl Fn(usize) -> T, to_le: impl Fn(T) -> [u8; W]) -> Vec<u8> {
    (0..n).flat_map(|i| to_le(f(i))).collect()
}

fn text_map(entries: &[(&str, Value)]) -> Value {
    Value::Map(entries.iter().map(|(k, v)| (Value::Text((*k).to_owned()), v.clone())).collect())
}

/// f32 → f16, for values f16 holds exactly (small multiples of 1/8).
fn exact_f16(x: f32) -> [u8; 2] {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    if x == 0.0 {
        return sign.to_le_bytes();
    }
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let mantissa = ((bits >> 13) & 0x3ff) as u16;
    (sign | ((exp as u16) << 10) | mantissa).to_le_bytes()
}

/// The write options the demo files mix: SHA-256 digests, CRC-32C digests, zstd with SHA-256,
/// and raw bytes with no digest.
const SHA: WriteOptions = WriteOptions { zstd_level: None, digest: Some(DigestAlgorithm::Sha256) };
const CRC: WriteOptions = WriteOptions { zstd_level: None, digest: Some(DigestAlgorithm::Crc32c) };
const ZSTD: WriteOptions = WriteOptions { zstd_level: Some(9), digest: Some(DigestAlgorithm::Sha256) };
const RAW: WriteOptions = WriteOptions { zstd_level: None, digest: None };

/// `write-demo`: the demo models `serve` shows by default, written by our own writer. They
/// cover every format, raw and zstd, both digests, file and object attributes, a logical type
/// and names that need percent-encoding. Output is deterministic, so the committed files can
/// be regenerated and compared.
pub fn write_demo(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let demo = dir.join("demo");
    std::fs::create_dir_all(&demo)?;
    let mut written = vec![write_dense_demo(&demo)?, write_structured_demo(&demo)?];
    written.extend(write_v2_demo(&dir.join("v2"))?);
    written.extend(write_safetensors_demo(&dir.join("hf/tiny-llama"))?);
    written.extend(write_gguf_demo(&dir.join("gguf/tiny"))?);
    Ok(written)
}

/// `demo/dense.zt`: dense tensors of several dtypes, a logical type, zstd and both digests.
fn write_dense_demo(demo: &Path) -> anyhow::Result<std::path::PathBuf> {
    let embed = le_bytes(64 * 32, |i| ((i % 97) as f32 - 48.0) / 16.0, f32::to_le_bytes);
    let bias = le_bytes(32, |i| (i as f32 - 16.0) / 8.0, exact_f16);
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
        (dense("embed.weight", &[64, 32], DType::F32, None, leak(embed), None), SHA),
        (dense("layers.0.bias", &[32], DType::F16, None, leak(bias), Some(layer_attributes)), CRC),
        (dense("counts", &[4096], DType::I64, None, leak(counts), None), ZSTD),
        (dense("mask", &[16], DType::Bool, None, leak(mask), None), RAW),
        (dense("scale", &[], DType::F64, None, leak(scalar), None), RAW),
        (dense("head.weight", &[8, 8], DType::BF16, None, leak(bf16), None), ZSTD),
        (dense("fp8.weight", &[32], DType::U8, Some("f8_e4m3fn"), leak(fp8), None), CRC),
    ] {
        writer.add(&object, &options)?;
    }
    let file_attributes = text_map(&[
        ("description", Value::Text("ztserve demo: dense tensors of several dtypes, zstd, digests".into())),
        ("license", Value::Text("Apache-2.0".into())),
        ("written_by", Value::Text("ztserve write-demo".into())),
    ]);
    let path = demo.join("dense.zt");
    std::fs::write(&path, writer.finish(Some(file_attributes))?)?;
    Ok(path)
}

/// `demo/structured.zt`: sparse CSR and COO, `quantized_group` and a custom format whose name
/// needs percent-encoding.
fn write_structured_demo(demo: &Path) -> anyhow::Result<std::path::PathBuf> {
    let u64s = |v: &[u64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let csr_values = le_bytes(6, |i| i as f32 + 1.0, f32::to_le_bytes);
    let csr_indices = u64s(&[0, 3, 1, 7, 2, 5]);
    let csr_indptr = u64s(&[0, 2, 2, 3, 3, 3, 4, 4, 6]);
    let coo_values = le_bytes(3, |i| (i as i32 + 1) * 10, i32::to_le_bytes);
    let coo_coords = u64s(&[0, 1, 3, 4, 0, 2, 5, 0, 1]);
    let packed = le_bytes(64 * 64 / 8, |i| (i as u32).wrapping_mul(2_654_435_761) as i32, i32::to_le_bytes);
    let scales = le_bytes(64 * 64 / 32, |i| (i % 8) as f32 / 8.0 + 0.125, exact_f16);
    let zeros = le_bytes(64 * 64 / 32, |i| (i % 4) as f32, exact_f16);
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
            SHA,
        ),
        (
            ObjectInput {
                name: "points",
                shape: &[4, 5, 6],
                format: "sparse_coo",
                attributes: None,
                components: vec![c("values", DType::I32, &coo_values), c("coords", DType::U64, &coo_coords)],
            },
            ZSTD,
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
            CRC,
        ),
        (
            ObjectInput {
                name: "vendor/lookup table ü %?#",
                shape: &[256],
                format: "x_vendor.lut",
                attributes: None,
                components: vec![c("table", DType::U8, &lut)],
            },
            RAW,
        ),
    ];
    for (object, options) in &objects {
        writer.add(object, options)?;
    }
    let path = demo.join("structured.zt");
    let attributes = text_map(&[(
        "description",
        Value::Text("ztserve demo: sparse CSR and COO, quantized_group, a custom format".into()),
    )]);
    std::fs::write(&path, writer.finish(Some(attributes))?)?;
    Ok(path)
}

/// `gguf/tiny/`: one tiny llama-shaped model as two GGUF files, `tiny-F16.gguf` and
/// `tiny-Q8_0.gguf` (its weights quantized as ggml's reference quantizer does), each with an
/// f32 norm and the metadata llama.cpp's converters write: the models `gguf/tiny/tiny-F16` and
/// `gguf/tiny/tiny-Q8_0`, and together the Hub repository `gguf/tiny`. The values are multiples
/// of 1/16, which f16 holds exactly.
fn write_gguf_demo(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    use crate::format::gguf::{FileBuilder, f16_bytes, quantize_q8_0, string_bytes};
    std::fs::create_dir_all(dir)?;
    let values =
        |n: usize, seed: usize| -> Vec<f32> { (0..n).map(|i| ((i * 37 + seed) % 61) as f32 / 16.0 - 1.875).collect() };
    let embed = values(64 * 32, 0);
    let attn_q = values(64 * 64, 11);
    let norm: Vec<u8> = (0..64).flat_map(|i| (1.0 + i as f32 / 64.0).to_le_bytes()).collect();
    let tokens: Vec<u8> = [8u32.to_le_bytes().to_vec(), 32u64.to_le_bytes().to_vec()]
        .concat()
        .into_iter()
        .chain((0..32).flat_map(|i| string_bytes(format!("t{i}").as_bytes())))
        .collect();
    let mut written = Vec::new();
    /// How a file stores its weights: their GGML type, its `general.file_type`, their bytes.
    type Weights = (u32, u32, fn(&[f32]) -> Vec<u8>);
    let files: [(&str, Weights); 2] = [("tiny-F16.gguf", (1, 1, f16_bytes)), ("tiny-Q8_0.gguf", (8, 7, quantize_q8_0))];
    for (name, (weight_type, file_type, encode)) in files {
        let file = FileBuilder::new("llama")
            .kv("general.name", 8, string_bytes(b"tiny"))
            .kv_u32("general.quantization_version", 2)
            .kv_u32("general.file_type", file_type)
            .kv_u32("llama.context_length", 32)
            .kv_u32("llama.embedding_length", 64)
            .kv_u32("llama.block_count", 1)
            .kv("tokenizer.ggml.model", 8, string_bytes(b"llama"))
            .kv("tokenizer.ggml.tokens", 9, tokens.clone())
            .tensor_bytes("token_embd.weight", &[64, 32], weight_type, encode(&embed))
            .tensor_bytes("blk.0.attn_q.weight", &[64, 64], weight_type, encode(&attn_q))
            .tensor_bytes("output_norm.weight", &[64], 0, norm.clone())
            .build();
        crate::format::gguf::parse_file(&file)?;
        let path = dir.join(name);
        std::fs::write(&path, file)?;
        written.push(path);
    }
    Ok(written)
}

/// One tensor of a safetensors checkpoint: name, dtype, shape, bytes.
pub type CheckpointTensor<'a> = (&'a str, safetensors::Dtype, Vec<usize>, &'a [u8]);

/// `hf/tiny-llama/`: two shards (`model-0000N-of-00002.safetensors`, with `__metadata__`
/// `{"format": "pt"}` as torch writes it) and the `model.safetensors.index.json` mapping each
/// tensor to its shard, as `save_pretrained` lays out a large checkpoint. bf16, fp8 and bool.
fn write_safetensors_demo(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    use safetensors::Dtype;
    std::fs::create_dir_all(dir)?;
    let bf16 = |n: usize, scale: f32| {
        le_bytes(n, move |i| (((i % 29) as f32 - 14.0) * scale).to_bits() >> 16, |b| (b as u16).to_le_bytes())
    };
    let embed = bf16(128 * 32, 1.0 / 16.0);
    let head = bf16(128 * 32, 1.0 / 32.0);
    let q: Vec<u8> = (0..32 * 32).map(|i| (i * 13 % 251) as u8).collect();
    let norm = le_bytes(32, |i| 1.0 + i as f32 / 64.0, f32::to_le_bytes);
    let mask: Vec<u8> = (0..8).map(|i| u8::from(i % 2 == 0)).collect();
    let shards: [Vec<CheckpointTensor<'_>>; 2] = [
        vec![
            ("model.embed_tokens.weight", Dtype::BF16, vec![128, 32], &embed),
            ("model.layers.0.self_attn.q_proj.weight", Dtype::F8_E4M3, vec![32, 32], &q),
        ],
        vec![
            ("model.norm.weight", Dtype::F32, vec![32], &norm),
            ("lm_head.weight", Dtype::BF16, vec![128, 32], &head),
            ("attention_mask", Dtype::BOOL, vec![8], &mask),
        ],
    ];
    let mut written = Vec::new();
    for (name, bytes) in safetensors_checkpoint(&[&shards[0], &shards[1]])? {
        let path = dir.join(name);
        std::fs::write(&path, bytes)?;
        written.push(path);
    }
    Ok(written)
}

/// A safetensors file of `tensors`, with `__metadata__` `{"format": "pt"}` as torch writes it.
pub fn safetensors_file(tensors: &[CheckpointTensor<'_>]) -> anyhow::Result<Vec<u8>> {
    let mut views = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, bytes) in tensors {
        views.push((name.to_string(), safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)?));
    }
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    Ok(safetensors::serialize(views, Some(metadata))?)
}

/// A sharded checkpoint in Hugging Face's layout: `model.safetensors.index.json` (its
/// `metadata.total_size` and a `weight_map` of every tensor to its shard), then
/// `model-0000N-of-0000M.safetensors` for each of `shards`, by file name. Deterministic.
pub fn safetensors_checkpoint(shards: &[&[CheckpointTensor<'_>]]) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut weight_map = std::collections::BTreeMap::new();
    let mut files = Vec::with_capacity(shards.len() + 1);
    let mut total = 0;
    for (index, tensors) in shards.iter().enumerate() {
        let name = format!("model-{:05}-of-{:05}.safetensors", index + 1, shards.len());
        for (tensor, _, _, bytes) in tensors.iter() {
            weight_map.insert(tensor.to_string(), name.clone());
            total += bytes.len();
        }
        files.push((name, safetensors_file(tensors)?));
    }
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    files
        .insert(0, ("model.safetensors.index.json".to_string(), (serde_json::to_string_pretty(&index)? + "\n").into()));
    Ok(files)
}

/// `v2/seekable.zt` (seekable zstd parts, one of several frames, beside raw ones) and
/// `v2/sharded.zt`, whose root names two data shards beside it (`sharded-00001-of-00002.zt`,
/// `sharded-00002-of-00002.zt`, written as another producer would: the official writer makes
/// no data shards) and keeps one tensor itself. Deterministic, like the rest of the demo.
fn write_v2_demo(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    use ztensor::{DType as Z, DigestAlgorithm as Algorithm};
    std::fs::create_dir_all(dir)?;
    let failed = |e: ztensor::Error| anyhow::anyhow!("{e}");
    let seekable = crate::format::v2::ZSTD_SEEKABLE;
    // 3 MiB of a slowly varying pattern: three 1 MiB frames, a few KiB stored.
    let long = le_bytes(3 << 18, |i| (i / 4096) as f32, f32::to_le_bytes);
    let embed = le_bytes(256 * 64, |i| ((i % 61) as f32 - 30.0) / 8.0, f32::to_le_bytes);
    let norm = le_bytes(64, |i| ((1.0 + i as f32 / 64.0).to_bits() >> 16) as u16, u16::to_le_bytes);
    let seekable_path = dir.join("seekable.zt");
    let mut w = ztensor::Writer::options().canonical(false).align(4096).create(&seekable_path).map_err(failed)?;
    w.object("embed.weight", |o| {
        o.shape([256u64, 64]).part("data", |p| p.dtype(Z::F32).encoding(seekable).bytes(&embed))
    })
    .map_err(failed)?;
    w.object("positions", |o| o.shape([3u64 << 18]).part("data", |p| p.dtype(Z::F32).encoding(seekable).bytes(&long)))
        .map_err(failed)?;
    w.add("norm.weight", [64u64], Z::BF16, &norm).map_err(failed)?;
    w.finish().map_err(failed)?;

    let shard_paths = [dir.join("sharded-00001-of-00002.zt"), dir.join("sharded-00002-of-00002.zt")];
    let layers: Vec<Vec<u8>> =
        (0..2).map(|l| le_bytes(64 * 64, move |i| ((i + l * 7) % 113) as f32 / 32.0, f32::to_le_bytes)).collect();
    for (path, layer) in shard_paths.iter().zip(&layers) {
        std::fs::write(path, crate::format::v2::file_around(layer, &[]))?;
    }
    let sharded_path = dir.join("sharded.zt");
    let head = le_bytes(16 * 64, |i| (i % 5) as f32, f32::to_le_bytes);
    let mut w = ztensor::Writer::options().canonical(false).align(4096).create(&sharded_path).map_err(failed)?;
    for (index, path) in shard_paths.iter().enumerate() {
        let name = format!("0000{}-of-00002", index + 1);
        w.add_shard(&name, &ztensor::read::shard_identity(path, Algorithm::Xxh3).map_err(failed)?).map_err(failed)?;
        let len = layers[index].len() as u64;
        // The official writer hashes bytes it writes; a part in another file is given its digest.
        let mut hasher = crate::format::decode::Hasher::for_digest(&crate::format::Digest::Xxh3(0));
        hasher.update(&layers[index]);
        let digest = hasher.finish().expect("xxh3 is computed").to_string();
        w.object(format!("layers.{index}.weight"), |o| {
            o.shape([64u64, 64])
                .part("data", |p| p.dtype(Z::F32).digest(digest.clone()).external(name.clone(), 4096..4096 + len))
        })
        .map_err(failed)?;
    }
    w.add("lm_head.weight", [16u64, 64], Z::F32, &head).map_err(failed)?;
    w.finish().map_err(failed)?;
    let mut written = vec![seekable_path, sharded_path];
    written.extend(shard_paths);
    Ok(written)
}
