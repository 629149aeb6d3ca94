//! The names the server and its clients share: the route templates, which paths are model
//! routes, the URLs the server hands out (ids written naturally where that is unambiguous,
//! every name a percent-encoded path segment) and the `X-Zt-*` header names. The router,
//! the manifest's JSON, telemetry and `ztserve pull` all take them from here, so a URL the
//! manifest gives is one the router answers.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Route templates, as the router declares them and metrics label them.
pub mod routes {
    pub const HEALTHZ: &str = "/healthz";
    pub const READYZ: &str = "/readyz";
    pub const METRICS: &str = "/metrics";
    pub const MODELS: &str = "/models";
    pub const MANIFEST: &str = "/models/{model}";
    /// A single-file model's stored file.
    pub const FILE: &str = "/models/{model}/file";
    /// Any of a model's stored files, by name (a v2 root and its shards).
    pub const STORED_FILE: &str = "/models/{model}/files/{name}";
    /// A file of the model's safetensors view (`model.safetensors`, or its index and shards).
    pub const VIEW_FILE: &str = "/models/{model}/{view_file}";
    /// How much of the model the disk cache holds (GET); fetching all of it into the cache (POST).
    pub const PREFETCH: &str = "/models/{model}/prefetch";
    /// Many regions of the model's tensors in one body (POST), each followed by its CRC32C.
    pub const REGIONS: &str = "/models/{model}/regions";
    /// The deltas from another model version of many regions in one body (POST), each
    /// followed by its CRC32C.
    pub const DELTAS: &str = "/models/{model}/deltas";
    pub const OBJECT: &str = "/models/{model}/objects/{object}";
    pub const COMPONENT: &str = "/models/{model}/objects/{object}/components/{role}";
    /// An object may be named "" (the official 1.2.3 writer allows it): an empty segment.
    pub const UNNAMED_OBJECT: &str = "/models/{model}/objects/";
    pub const UNNAMED_COMPONENT: &str = "/models/{model}/objects//components/{role}";

    /// The Hugging Face Hub API's prefix (`HF_ENDPOINT=http://HOST:PORT/hf`); requests below
    /// it that are neither [`HUB_API`] nor [`HUB_FILE`] are labelled with it.
    pub const HUB: &str = "/hf";
    /// The Hub's JSON API (repository info, trees, paths-info), as one label.
    pub const HUB_API: &str = "/hf/api";
    /// A file of a repository at a revision, as one label: its body bytes are the files sent.
    pub const HUB_FILE: &str = "/hf/{repo}/resolve/{revision}/{path}";

    /// The OCI distribution API's prefix (`oras pull HOST:PORT/org/llama:latest`); requests below
    /// it that are neither [`OCI_MANIFEST`] nor [`OCI_BLOB`] are labelled with it.
    pub const OCI: &str = "/v2";
    /// A manifest, by tag or digest.
    pub const OCI_MANIFEST: &str = "/v2/{name}/manifests/{reference}";
    /// A blob (a layer: one of the model's files; or the config), by digest.
    pub const OCI_BLOB: &str = "/v2/{name}/blobs/{digest}";

    /// The artifact store's prefix, mounted only with `[artifacts] dir`; requests below it that
    /// are none of its routes are labelled with it.
    pub const ARTIFACTS: &str = "/artifacts";
    /// A blob of the artifact store, by its digest (`sha256:HEX`).
    pub const ARTIFACT_BLOB: &str = "/artifacts/blobs/{digest}";
    /// The names of the bundles published.
    pub const ARTIFACT_BUNDLES: &str = "/artifacts/bundles";
    /// A bundle, by its name (which may hold `/`).
    pub const ARTIFACT_BUNDLE: &str = "/artifacts/bundles/{*name}";

    /// Every route, for the per-route series registered at start.
    pub const ALL: &[&str] = &[
        HEALTHZ,
        READYZ,
        METRICS,
        MODELS,
        MANIFEST,
        FILE,
        STORED_FILE,
        VIEW_FILE,
        PREFETCH,
        REGIONS,
        DELTAS,
        OBJECT,
        COMPONENT,
        UNNAMED_OBJECT,
        UNNAMED_COMPONENT,
        HUB,
        HUB_API,
        HUB_FILE,
        OCI,
        OCI_MANIFEST,
        OCI_BLOB,
        ARTIFACTS,
        ARTIFACT_BLOB,
        ARTIFACT_BUNDLES,
        ARTIFACT_BUNDLE,
    ];
}

/// Response headers of the contract (lower case, as HTTP/2 and `HeaderName` want them).
pub mod headers {
    /// The model's version on every response drawn from it: a client compares it across the
    /// requests of one load to know no piece came from a replacement.
    pub const MODEL_VERSION: &str = "x-zt-model-version";
    pub const DTYPE: &str = "x-zt-dtype";
    pub const TYPE: &str = "x-zt-type";
    pub const SHAPE: &str = "x-zt-shape";
    /// On a slice: the slice as `start:stop` for every dimension, whatever form it was asked in.
    pub const SLICE: &str = "x-zt-slice";
    pub const FORMAT: &str = "x-zt-format";
    pub const REPR_DIGEST: &str = "repr-digest";
    /// On a regions body: how many regions it holds.
    pub const REGIONS: &str = "x-zt-regions";
    /// On a deltas body: the version token of the model the deltas are from.
    pub const FROM_VERSION: &str = "x-zt-from-version";
}

/// Characters left as they are in a path segment (unreserved ones, and `@`, which a path may
/// hold as it is and version-pinned URLs use); everything else (including `/`, `%`, `?`, `#` and
/// spaces) is percent-encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'@');

/// `text` as one percent-encoded path segment.
pub fn segment(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

/// Whether `rest` (the path segments after a model id, as written) is one of the model routes:
/// the manifest (nothing), `file`, `files/{name}`, `prefetch`, `regions`, `deltas`, `objects/{object}`,
/// `objects/{object}/components/{role}`, or a file of the safetensors view.
pub fn is_model_route(rest: &[&str]) -> bool {
    match rest {
        []
        | ["file"]
        | ["files", _]
        | ["prefetch"]
        | ["regions"]
        | ["deltas"]
        | ["objects", _]
        | ["objects", _, "components", _] => true,
        [name] => crate::format::view::is_view_file_name(name),
        _ => false,
    }
}

/// `/models/{id}/{rest...}` (`rest` already encoded). The id is written naturally, its `/`
/// kept, when no tail of it could itself be read as a model route (the natural-URL rule then
/// finds exactly this id, whatever other models exist), and as one `%2F`-encoded segment
/// otherwise (an id such as `a/objects/b`, or with an empty or dot segment a client would
/// normalise away).
fn model_path(id: &str, rest: &[&str]) -> String {
    let parts: Vec<String> = id.split('/').map(segment).collect();
    let plain = parts.iter().all(|p| !p.is_empty() && p != "." && p != "..");
    let unambiguous = (1..parts.len()).all(|k| {
        let tail: Vec<&str> = parts[k..].iter().map(String::as_str).chain(rest.iter().copied()).collect();
        !is_model_route(&tail)
    });
    let id = if plain && unambiguous { parts.join("/") } else { segment(id) };
    let mut path = format!("/models/{id}");
    for part in rest {
        path.push('/');
        path.push_str(part);
    }
    path
}

/// The model id and version of a version-pinned id, `{id}@{version}` (a version is hex digits
/// and `-`, as `X-Zt-Model-Version` writes it between its quotes); `None` for any other id.
pub fn split_pinned(id: &str) -> Option<(&str, &str)> {
    let (base, version) = id.rsplit_once('@')?;
    let token = !version.is_empty() && version.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    (token && !base.is_empty()).then_some((base, version))
}

/// `/models/{id}`: the model's manifest.
pub fn model_url(id: &str) -> String {
    model_path(id, &[])
}

/// `/models/{id}/file`: the model's stored file.
pub fn file_url(id: &str) -> String {
    model_path(id, &["file"])
}

/// `/models/{id}/files/{name}`: one of the model's stored files.
pub fn stored_file_url(id: &str, name: &str) -> String {
    model_path(id, &["files", &segment(name)])
}

/// `/models/{id}/{name}`: a file of the model's safetensors view.
pub fn view_file_url(id: &str, name: &str) -> String {
    model_path(id, &[&segment(name)])
}

/// `/models/{id}/objects/{name}`: the object's bytes or description.
pub fn object_url(id: &str, object: &str) -> String {
    model_path(id, &["objects", &segment(object)])
}

/// `/models/{id}/objects/{name}/components/{role}`: one component's bytes.
pub fn component_url(id: &str, object: &str, role: &str) -> String {
    model_path(id, &["objects", &segment(object), "components", &segment(role)])
}

/// `/models/{id}` with the id as one `%2F`-encoded segment: the form every id has.
pub fn encoded_model_url(id: &str) -> String {
    format!("/models/{}", segment(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_percent_encode_each_name_as_one_segment() {
        assert_eq!(model_url("org/llama"), "/models/org/llama", "natural");
        assert_eq!(encoded_model_url("org/llama"), "/models/org%2Fllama");
        assert_eq!(file_url("a b"), "/models/a%20b/file");
        assert_eq!(object_url("m", "a/b c%?#ü"), "/models/m/objects/a%2Fb%20c%25%3F%23%C3%BC");
        assert_eq!(component_url("m", "w", "data"), "/models/m/objects/w/components/data");
        assert_eq!(object_url("m", ""), "/models/m/objects/", "the unnamed object's route");
        assert_eq!(component_url("m", "", "data"), "/models/m/objects//components/data");
        assert_eq!(segment("-._~"), "-._~");
        assert_eq!(view_file_url("org/llama", "model.safetensors"), "/models/org/llama/model.safetensors");
    }

    #[test]
    fn a_pinned_id_is_an_id_then_at_then_a_version() {
        assert_eq!(split_pinned("org/llama@18f0-ab12"), Some(("org/llama", "18f0-ab12")));
        assert_eq!(split_pinned("a@b@ff"), Some(("a@b", "ff")));
        assert_eq!(split_pinned("org/llama@18f0/objects/w"), None);
        assert_eq!(split_pinned("org/llama@"), None);
        assert_eq!(split_pinned("@ff"), None);
        assert_eq!(split_pinned("org/llama"), None);
    }

    #[test]
    fn an_id_is_written_naturally_only_when_no_tail_of_it_reads_as_a_route() {
        assert_eq!(object_url("a/b c", "w"), "/models/a/b%20c/objects/w");
        assert_eq!(component_url("org/team/llama", "w", "data"), "/models/org/team/llama/objects/w/components/data");
        // `a/objects/b` would read as model `a`'s object `b`; `a/file` as `a`'s file.
        assert_eq!(model_url("a/objects/b"), "/models/a%2Fobjects%2Fb");
        assert_eq!(model_url("a/file"), "/models/a%2Ffile");
        assert_eq!(object_url("a/files", "w"), "/models/a/files/objects/w", "only the whole tail counts");
        assert_eq!(model_url("a/x.safetensors"), "/models/a%2Fx.safetensors");
        assert_eq!(model_url("a/../b"), "/models/a%2F..%2Fb");
        assert_eq!(model_url("a//b"), "/models/a%2F%2Fb");
    }
}
