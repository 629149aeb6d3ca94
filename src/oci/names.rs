//! Which repository is which model, and what a request under `/v2` asks for, pure: the
//! collision-free mapping between model ids and OCI repository names, and the routes of the
//! distribution API's read side.

use sha2::Digest as _;

/// The first path component of the repository names given to model ids that are not
/// repository names themselves; no model id maps to a name under it any other way.
pub(crate) const HASHED: &str = "ztserve-id";

/// The longest repository name accepted (the distribution spec's limit with a host name).
const MAX_NAME: usize = 255;

/// Whether `component` is one path component of a repository name:
/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn is_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else { return false };
    if !alnum(first) || !alnum(last) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let separator = &component[start..i];
        if !(separator == "." || separator == "_" || separator == "__" || separator.bytes().all(|b| b == b'-')) {
            return false;
        }
    }
    true
}

/// Whether `name` is a repository name: components joined by `/`, at most 255 characters.
pub(crate) fn is_repository_name(name: &str) -> bool {
    name.len() <= MAX_NAME && name.split('/').all(is_component)
}

/// The repository of model `id`: the id itself when it is a repository name (lowercase
/// letters, digits and the separators the spec allows) outside [`HASHED`]; otherwise
/// `ztserve-id/` and the first 32 hex digits of the id's SHA-256.
pub(crate) fn repository_of(id: &str) -> String {
    let plain = is_repository_name(id) && !is_hashed(id);
    if plain { id.to_owned() } else { hashed(id) }
}

fn hashed(id: &str) -> String {
    format!("{HASHED}/{}", &hex::encode(sha2::Sha256::digest(id.as_bytes()))[..32])
}

/// Whether `name` is under [`HASHED`], a repository named by its id's digest.
pub(crate) fn is_hashed(name: &str) -> bool {
    name.split('/').next() == Some(HASHED)
}

/// Whether `name` is the repository of model `id`.
pub(crate) fn names(name: &str, id: &str) -> bool {
    if is_hashed(name) { hashed(id) == name } else { name == id }
}

pub(crate) use crate::digests::sha256_hex;

/// What a request below `/v2` asks for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OciRoute {
    /// `/v2/`: the API's version check.
    Base,
    /// `/v2/_catalog`.
    Catalog,
    /// `/v2/_token`: a bearer token for HTTP basic credentials.
    Token,
    Tags {
        name: String,
    },
    Manifest {
        name: String,
        reference: String,
    },
    Blob {
        name: String,
        digest: String,
    },
    Referrers {
        name: String,
        digest: String,
    },
    /// Uploads (a push): never served.
    Upload,
    Unknown,
}

/// The route of `path` (below `/v2`, still percent-encoded as repository names never are).
pub(crate) fn route(path: &str) -> OciRoute {
    let path = path.strip_prefix('/').unwrap_or(path);
    match path {
        "" => return OciRoute::Base,
        "_catalog" => return OciRoute::Catalog,
        "_token" => return OciRoute::Token,
        _ => {}
    }
    let segments: Vec<&str> = path.split('/').collect();
    let name = |end: usize| segments[..end].join("/");
    let n = segments.len();
    if let Some(at) = segments.iter().position(|s| *s == "blobs").filter(|at| segments.get(at + 1) == Some(&"uploads"))
    {
        if at > 0 {
            return OciRoute::Upload;
        }
    }
    if n < 3 {
        return OciRoute::Unknown;
    }
    match (segments[n - 2], segments[n - 1]) {
        ("tags", "list") => OciRoute::Tags { name: name(n - 2) },
        ("manifests", reference) => OciRoute::Manifest { name: name(n - 2), reference: reference.to_owned() },
        ("blobs", digest) => OciRoute::Blob { name: name(n - 2), digest: digest.to_owned() },
        ("referrers", digest) => OciRoute::Referrers { name: name(n - 2), digest: digest.to_owned() },
        _ => OciRoute::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_names_follow_the_distribution_grammar() {
        for good in ["a", "org/llama", "a.b_c__d---e/f0", "hf/tiny-llama", "x/y/z"] {
            assert!(is_repository_name(good), "{good}");
        }
        for bad in ["", "A", "org/Llama", "a//b", "/a", "a/", "-a", "a-", "a___b", "a..b", "a._b", "a b", "ü"] {
            assert!(!is_repository_name(bad), "{bad}");
        }
        assert!(!is_repository_name(&"a".repeat(256)));
    }

    #[test]
    fn ids_map_to_names_without_collisions() {
        assert_eq!(repository_of("org/llama"), "org/llama");
        let upper = repository_of("Org/Llama-3");
        assert!(upper.starts_with("ztserve-id/") && upper.len() == "ztserve-id/".len() + 32, "{upper}");
        assert!(is_repository_name(&upper));
        // An id that is itself a hashed name is hashed too, so no plain id lands under the prefix.
        assert_ne!(repository_of(&upper), upper);
        for id in ["org/llama", "Org/Llama-3", &upper, "a b", "ztserve-id"] {
            let name = repository_of(id);
            assert!(names(&name, id), "{id}");
            assert!(!names(&name, "other"), "{id}");
        }
        assert_ne!(repository_of("Org/Llama-3"), repository_of("org/llama-3"));
    }

    #[test]
    fn digests_are_read_strictly() {
        let hex = "a".repeat(64);
        assert_eq!(sha256_hex(&format!("sha256:{hex}")), Some(hex.as_str()));
        assert_eq!(sha256_hex(&format!("sha256:{}", "A".repeat(64))), None);
        assert_eq!(sha256_hex(&format!("sha512:{hex}")), None);
        assert_eq!(sha256_hex("sha256:abc"), None);
    }

    #[test]
    fn routes_take_the_last_keyword_so_names_may_hold_any_component() {
        assert_eq!(route("/"), OciRoute::Base);
        assert_eq!(route(""), OciRoute::Base);
        assert_eq!(route("/_catalog"), OciRoute::Catalog);
        assert_eq!(route("/_token"), OciRoute::Token);
        assert_eq!(route("/org/llama/tags/list"), OciRoute::Tags { name: "org/llama".into() });
        assert_eq!(
            route("/a/manifests/b/manifests/latest"),
            OciRoute::Manifest { name: "a/manifests/b".into(), reference: "latest".into() }
        );
        assert_eq!(route("/a/blobs/sha256:00"), OciRoute::Blob { name: "a".into(), digest: "sha256:00".into() });
        assert_eq!(
            route("/a/referrers/sha256:00"),
            OciRoute::Referrers { name: "a".into(), digest: "sha256:00".into() }
        );
        assert_eq!(route("/a/blobs/uploads/"), OciRoute::Upload);
        assert_eq!(route("/a/blobs/uploads/123"), OciRoute::Upload);
        assert_eq!(route("/a/other/x"), OciRoute::Unknown);
        assert_eq!(route("/manifests/latest"), OciRoute::Unknown);
    }
}
