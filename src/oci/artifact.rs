//! A model version as a ModelPack artifact, pure: its config (descriptor, `config` with the
//! format, parameter count and precision the manifest says, `modelfs` with each layer's
//! SHA-256) and its OCI image manifest (one raw layer per published file, annotated with its
//! path as ModelPack's `org.cncf.model.filepath` and as `org.opencontainers.image.title`, which
//! `oras` names the files it pulls by). Both are serialized the same way every time from the
//! same files, so a version's manifest digest survives restarts.

use serde_json::{Value, json};
use sha2::Digest as _;

use crate::format::Manifest;

pub(crate) const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const ARTIFACT_TYPE: &str = "application/vnd.cncf.model.manifest.v1+json";
pub(crate) const CONFIG_MEDIA_TYPE: &str = "application/vnd.cncf.model.config.v1+json";
const WEIGHT: &str = "application/vnd.cncf.model.weight.v1.raw";
const WEIGHT_CONFIG: &str = "application/vnd.cncf.model.weight.config.v1.raw";
const DOC: &str = "application/vnd.cncf.model.doc.v1.raw";
const CODE: &str = "application/vnd.cncf.model.code.v1.raw";
const FILEPATH: &str = "org.cncf.model.filepath";
const TITLE: &str = "org.opencontainers.image.title";
/// The model signature's state (`verified`, `unsigned`), where its source's policy reads it.
pub(crate) const SIGNATURE_STATE: &str = "dev.ztserve.signature.state";
/// Who signed the model, once verified.
pub(crate) const SIGNATURE_SIGNER: &str = "dev.ztserve.signature.signer";

/// One published file as a layer.
#[derive(Debug, Clone)]
pub(crate) struct LayerFile {
    pub(crate) path: String,
    pub(crate) size: u64,
    pub(crate) sha256: [u8; 32],
}

/// A model version's artifact: its config and manifest as served, and their digests.
#[derive(Debug, Clone)]
pub(crate) struct Artifact {
    pub(crate) config: Vec<u8>,
    pub(crate) config_digest: String,
    pub(crate) manifest: Vec<u8>,
    pub(crate) manifest_digest: String,
}

/// `sha256:` and the hex of `bytes`' SHA-256.
pub(crate) fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// The ModelPack layer media type of a published file, by its path: safetensors and GGUF files
/// are weights; documentation and code have theirs; every other file (configs, tokenizers, a
/// checkpoint's index) configures the weights.
fn media_type_of(path: &str) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    if name.ends_with(".safetensors") || name.ends_with(".gguf") {
        WEIGHT
    } else if name.ends_with(".md") || name.starts_with("license") || name.starts_with("notice") {
        DOC
    } else if name.ends_with(".py") {
        CODE
    } else {
        WEIGHT_CONFIG
    }
}

/// ModelPack's parameter size: a count with one decimal at most and a scale letter (`6.7B`);
/// `None` below a thousand, which it cannot write.
fn param_size(count: u64) -> Option<String> {
    let scales = [(1e15, "Q"), (1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")];
    let (scale, letter) = scales.into_iter().find(|(scale, _)| count as f64 >= *scale)?;
    let scaled = (count as f64 / scale * 10.0).round() / 10.0;
    Some(if scaled.fract() == 0.0 { format!("{scaled:.0}{letter}") } else { format!("{scaled:.1}{letter}") })
}

/// The precision of the dense tensors `manifest` holds: their dtype when they share one
/// (`bf16`, `fp32`, `int8`…), `mixed` when not, `None` without any; of a GGUF model with
/// block-quantized tensors, their GGML type (`q4_k`; its norms stay f32 whatever the
/// quantization).
fn precision(manifest: &Manifest) -> Option<String> {
    let quantized = |o: &&crate::format::Object| crate::format::quantization_of(o).is_some();
    let any_quantized = manifest.objects.iter().any(|o| quantized(&o));
    let mut seen: Option<String> = None;
    for object in manifest.objects.iter().filter(|o| if any_quantized { quantized(o) } else { o.format == "dense" }) {
        let Some(data) = object.component("data") else { continue };
        let logical = data.logical_type.as_deref();
        let name = match logical.and_then(crate::format::quantization_of_type) {
            Some(ggml) => ggml.name.to_ascii_lowercase(),
            None => precision_name(logical, data.dtype),
        };
        match &seen {
            None => seen = Some(name),
            Some(known) if *known == name => {}
            Some(_) => return Some("mixed".into()),
        }
    }
    seen
}

/// The precision name of a dense tensor's elements.
fn precision_name(logical: Option<&str>, dtype: crate::format::DType) -> String {
    match logical {
        Some(logical) => logical.to_owned(),
        None => match dtype.name() {
            "f64" => "fp64".to_owned(),
            "f32" => "fp32".to_owned(),
            "f16" => "fp16".to_owned(),
            "i8" => "int8".to_owned(),
            "u8" => "uint8".to_owned(),
            other => other.to_owned(),
        },
    }
}

/// The artifact of model `id` at `version` (its version token), whose manifest is
/// `manifest`, publishing `files` (in the order they become layers), with `annotations` besides
/// its title and version.
pub(crate) fn build(
    id: &str,
    version: &str,
    manifest: &Manifest,
    files: &[LayerFile],
    annotations: &[(&str, String)],
) -> Artifact {
    let digests: Vec<String> = files.iter().map(|f| format!("sha256:{}", hex::encode(f.sha256))).collect();
    let parameters: u64 = manifest
        .objects
        .iter()
        .filter(|o| o.format == "dense" || crate::format::quantization_of(o).is_some())
        .filter_map(|o| o.element_count())
        .fold(0u64, u64::saturating_add);
    let mut model_config = serde_json::Map::new();
    let format = manifest.container.published_weights_format();
    model_config.insert("format".into(), json!(format));
    if let Some(size) = param_size(parameters) {
        model_config.insert("paramSize".into(), json!(size));
    }
    if let Some(precision) = precision(manifest) {
        model_config.insert("precision".into(), json!(precision));
    }
    let config = json!({
        "descriptor": { "name": id, "version": version },
        "config": Value::Object(model_config),
        "modelfs": { "type": "layers", "diffIds": digests },
    });
    let config = serde_json::to_vec(&config).expect("JSON values serialize");
    let config_digest = digest_of(&config);
    let layers: Vec<Value> = files
        .iter()
        .zip(&digests)
        .map(|(file, digest)| {
            json!({
                "mediaType": media_type_of(&file.path),
                "digest": digest,
                "size": file.size,
                "annotations": { FILEPATH: file.path, TITLE: file.path },
            })
        })
        .collect();
    let mut top = serde_json::Map::new();
    top.insert(TITLE.into(), json!(id));
    top.insert("org.opencontainers.image.version".into(), json!(version));
    for (key, value) in annotations {
        top.insert((*key).into(), json!(value));
    }
    let manifest_json = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": { "mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest, "size": config.len() },
        "layers": layers,
        "annotations": Value::Object(top),
    });
    let manifest_bytes = serde_json::to_vec(&manifest_json).expect("JSON values serialize");
    Artifact { manifest_digest: digest_of(&manifest_bytes), manifest: manifest_bytes, config, config_digest }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_get_modelpack_media_types_by_name() {
        assert_eq!(media_type_of("model-00001-of-00002.safetensors"), WEIGHT);
        assert_eq!(media_type_of("tiny-Q4_K_M.gguf"), WEIGHT);
        assert_eq!(media_type_of("model.safetensors.index.json"), WEIGHT_CONFIG);
        assert_eq!(media_type_of("tokenizer/vocab.txt"), WEIGHT_CONFIG);
        assert_eq!(media_type_of("README.md"), DOC);
        assert_eq!(media_type_of("LICENSE"), DOC);
        assert_eq!(media_type_of("modeling_x.py"), CODE);
    }

    #[test]
    fn parameter_sizes_are_written_as_modelpack_says() {
        assert_eq!(param_size(999), None);
        assert_eq!(param_size(1_000), Some("1K".into()));
        assert_eq!(param_size(6_700_000_000), Some("6.7B".into()));
        assert_eq!(param_size(8_030_261_248), Some("8B".into()));
        assert_eq!(param_size(124_439_808), Some("124.4M".into()));
        assert_eq!(param_size(1_000_000_000_000), Some("1T".into()));
    }
}
