//! A model version as a container image, pure: the files it publishes under `/models/`, one
//! uncompressed tar layer per file ([`crate::service::TarLayer`]), so versions that share a
//! file share its layer; an image config per platform whose `rootfs.diff_ids` are the layer
//! digests (uncompressed, a layer's digest is its diff id); an image manifest per platform;
//! and an image index naming the manifests for `linux/amd64` and `linux/arm64`, which hold
//! the same layers (weights run on either). Nothing in the image runs: no entrypoint, no
//! shell. It is what KServe's `oci://` downloader and Kubernetes image volumes read. All of
//! it is serialized the same way every time from the same layers, so its digests survive
//! restarts.

use serde_json::json;

use super::artifact::{INDEX_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, digest_of};

pub(crate) const IMAGE_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub(crate) const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
const TITLE: &str = "org.opencontainers.image.title";
const VERSION: &str = "org.opencontainers.image.version";
/// The path a layer puts its file at, so a reader of the manifest knows each layer's file.
const LAYER_FILE: &str = "io.ztserve.image.file";

/// The platforms the index names, as Go's `GOARCH` names them.
pub(crate) const ARCHITECTURES: [&str; 2] = ["amd64", "arm64"];

/// What a tag names: the ModelPack artifact, or the image.
pub(crate) const IMAGE_TAG_SUFFIX: &str = "-image";

/// One published file as an image layer.
#[derive(Debug, Clone)]
pub(crate) struct ImageLayer {
    /// The file's path below `/models/`.
    pub(crate) path: String,
    /// The layer's length (the file's in its tar framing).
    pub(crate) size: u64,
    pub(crate) sha256: [u8; 32],
}

/// One platform's manifest and config, as served, with their digests.
#[derive(Debug, Clone)]
pub(crate) struct PlatformImage {
    pub(crate) architecture: &'static str,
    pub(crate) config: Vec<u8>,
    pub(crate) config_digest: String,
    pub(crate) manifest: Vec<u8>,
    pub(crate) manifest_digest: String,
}

/// A model version's image: its index, and each platform's image.
#[derive(Debug, Clone)]
pub(crate) struct Image {
    pub(crate) index: Vec<u8>,
    pub(crate) index_digest: String,
    pub(crate) platforms: Vec<PlatformImage>,
}

impl Image {
    /// The platform image whose manifest has `digest`.
    pub(crate) fn manifest(&self, digest: &str) -> Option<&PlatformImage> {
        self.platforms.iter().find(|p| p.manifest_digest == digest)
    }

    /// The config blob with `digest`.
    pub(crate) fn config(&self, digest: &str) -> Option<&[u8]> {
        self.platforms.iter().find(|p| p.config_digest == digest).map(|p| p.config.as_slice())
    }
}

/// The image of model `id` at `version` (its version token), whose layers are `layers` (in
/// the order they are stacked).
pub(crate) fn build(id: &str, version: &str, layers: &[ImageLayer]) -> Image {
    let digests: Vec<String> = layers.iter().map(|l| format!("sha256:{}", hex::encode(l.sha256))).collect();
    let annotations = json!({ TITLE: id, VERSION: version });
    let layer_descriptors: Vec<serde_json::Value> = layers
        .iter()
        .zip(&digests)
        .map(|(layer, digest)| {
            json!({
                "mediaType": LAYER_MEDIA_TYPE,
                "digest": digest,
                "size": layer.size,
                "annotations": { LAYER_FILE: format!("/{}/{}", crate::service::MODELS_DIR, layer.path) },
            })
        })
        .collect();
    let platforms: Vec<PlatformImage> = ARCHITECTURES
        .iter()
        .map(|&architecture| {
            let config = json!({
                "architecture": architecture,
                "os": "linux",
                "config": { "Labels": annotations, "WorkingDir": format!("/{}", crate::service::MODELS_DIR) },
                "rootfs": { "type": "layers", "diff_ids": digests },
            });
            let config = serde_json::to_vec(&config).expect("JSON values serialize");
            let config_digest = digest_of(&config);
            let manifest = json!({
                "schemaVersion": 2,
                "mediaType": MANIFEST_MEDIA_TYPE,
                "config": { "mediaType": IMAGE_CONFIG_MEDIA_TYPE, "digest": config_digest, "size": config.len() },
                "layers": layer_descriptors,
                "annotations": annotations,
            });
            let manifest = serde_json::to_vec(&manifest).expect("JSON values serialize");
            PlatformImage { architecture, manifest_digest: digest_of(&manifest), manifest, config, config_digest }
        })
        .collect();
    let index = json!({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": platforms.iter().map(|p| json!({
            "mediaType": MANIFEST_MEDIA_TYPE,
            "digest": p.manifest_digest,
            "size": p.manifest.len(),
            "platform": { "architecture": p.architecture, "os": "linux" },
        })).collect::<Vec<_>>(),
        "annotations": annotations,
    });
    let index = serde_json::to_vec(&index).expect("JSON values serialize");
    Image { index_digest: digest_of(&index), index, platforms }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_names_one_manifest_per_platform_over_the_same_layers_and_is_built_the_same_every_time() {
        let layers = vec![
            ImageLayer { path: "config.json".into(), size: 2048, sha256: [1; 32] },
            ImageLayer { path: "model.safetensors".into(), size: 4096, sha256: [2; 32] },
        ];
        let image = build("org/m", "v1", &layers);
        assert_eq!(image.index, build("org/m", "v1", &layers).index, "deterministic");
        let index: serde_json::Value = serde_json::from_slice(&image.index).unwrap();
        let named: Vec<(&str, &str)> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["platform"]["architecture"].as_str().unwrap(), m["digest"].as_str().unwrap()))
            .collect();
        assert_eq!(named.len(), 2);
        for (architecture, digest) in named {
            let platform = image.manifest(digest).unwrap();
            assert_eq!(platform.architecture, architecture);
            let manifest: serde_json::Value = serde_json::from_slice(&platform.manifest).unwrap();
            let config: serde_json::Value =
                serde_json::from_slice(image.config(&platform.config_digest).unwrap()).unwrap();
            let layer_digests: Vec<&str> =
                manifest["layers"].as_array().unwrap().iter().map(|l| l["digest"].as_str().unwrap()).collect();
            let diff_ids: Vec<&str> =
                config["rootfs"]["diff_ids"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
            assert_eq!(layer_digests, diff_ids, "uncompressed layers: each digest is its diff id");
            assert_eq!(layer_digests[1], format!("sha256:{}", hex::encode([2u8; 32])));
            assert_eq!(manifest["layers"][0]["mediaType"], LAYER_MEDIA_TYPE);
            assert_eq!(config["architecture"], architecture);
        }
    }
}
