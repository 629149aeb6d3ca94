//! The names the server and its clients share: the route templates, the URLs the server hands
//! out (built from percent-encoded path segments) and the `X-Zt-*` header names. The router,
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
    pub const OBJECT: &str = "/models/{model}/objects/{object}";
    pub const COMPONENT: &str = "/models/{model}/objects/{object}/components/{role}";
    /// An object may be named "" (the official 1.2.3 writer allows it): an empty segment.
    pub const UNNAMED_OBJECT: &str = "/models/{model}/objects/";
    pub const UNNAMED_COMPONENT: &str = "/models/{model}/objects//components/{role}";

    /// Every route, for the per-route series registered at start.
    pub const ALL: &[&str] = &[
        HEALTHZ,
        READYZ,
        METRICS,
        MODELS,
        MANIFEST,
        FILE,
        STORED_FILE,
        OBJECT,
        COMPONENT,
        UNNAMED_OBJECT,
        UNNAMED_COMPONENT,
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
    pub const FORMAT: &str = "x-zt-format";
    pub const REPR_DIGEST: &str = "repr-digest";
}

/// Characters left as they are in a path segment; everything else (including `/`, `%`, `?`,
/// `#` and spaces) is percent-encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// `text` as one percent-encoded path segment.
pub fn segment(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

/// `/models/{id}`: the model's manifest.
pub fn model_url(id: &str) -> String {
    format!("/models/{}", segment(id))
}

/// `/models/{id}/file`: the model's stored file.
pub fn file_url(id: &str) -> String {
    format!("{}/file", model_url(id))
}

/// `/models/{id}/files/{name}`: one of the model's stored files.
pub fn stored_file_url(id: &str, name: &str) -> String {
    format!("{}/files/{}", model_url(id), segment(name))
}

/// `/models/{id}/objects/{name}`: the object's bytes or description.
pub fn object_url(id: &str, object: &str) -> String {
    format!("{}/objects/{}", model_url(id), segment(object))
}

/// `/models/{id}/objects/{name}/components/{role}`: one component's bytes.
pub fn component_url(id: &str, object: &str, role: &str) -> String {
    format!("{}/components/{}", object_url(id, object), segment(role))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_percent_encode_each_name_as_one_segment() {
        assert_eq!(model_url("org/llama"), "/models/org%2Fllama");
        assert_eq!(file_url("a b"), "/models/a%20b/file");
        assert_eq!(object_url("m", "a/b c%?#ü"), "/models/m/objects/a%2Fb%20c%25%3F%23%C3%BC");
        assert_eq!(component_url("m", "w", "data"), "/models/m/objects/w/components/data");
        assert_eq!(object_url("m", ""), "/models/m/objects/", "the unnamed object's route");
        assert_eq!(component_url("m", "", "data"), "/models/m/objects//components/data");
        assert_eq!(segment("-._~"), "-._~");
    }
}
