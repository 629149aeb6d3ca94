//! Which Hub repository is which model, pure: the collision-free mapping between model ids and
//! repo ids, the request paths of the Hub's read API, the commit id of a model version's
//! files, and the tree of a repository's files (directories derived from the paths).

use std::collections::BTreeSet;

use sha2::Digest as _;

/// The longest namespace or name `huggingface_hub` accepts.
const MAX_REPO_PART: usize = 96;

/// Whether `part` is a namespace or name the Hub client accepts: 1 to 96 of `A-Z a-z 0-9 - _ .`,
/// starting and ending with a letter, digit or `_`, without `--` or `..`, not ending in `.git`.
fn is_repo_part(part: &str) -> bool {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    (1..=MAX_REPO_PART).contains(&part.len())
        && part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && word(part.chars().next())
        && word(part.chars().last())
        && !part.contains("--")
        && !part.contains("..")
        && !part.ends_with(".git")
}

/// Joins the segments of a model id deeper than `namespace/name` in a repo name.
const DEEP_JOIN: &str = "__";

/// The repo id of model `id`, where `namespace` names the models at the top of a source: for a
/// one-segment id (`llama`), `{namespace}/llama`, since `huggingface_hub` 2.x refuses repo ids
/// of one segment; the id itself when it is `namespace/name`; for a deeper id, its first segment
/// as the namespace and the rest joined with `__` as the name (`org/team/llama` is
/// `org/team__llama`). `None` when the id cannot be written so: a part the Hub client refuses,
/// or a segment that is empty, holds `__` or starts or ends with `_` (any of which would make
/// two ids meet in one repo id).
pub(crate) fn repo_id_of(id: &str, namespace: &str) -> Option<String> {
    let segments: Vec<&str> = id.split('/').collect();
    if segments.iter().any(|s| s.is_empty() || s.contains(DEEP_JOIN)) {
        return None;
    }
    let repo = match segments[..] {
        [name] => format!("{namespace}/{name}"),
        [_, _] => id.to_owned(),
        [namespace, ref rest @ ..] => {
            if rest.iter().any(|s| s.starts_with('_') || s.ends_with('_')) {
                return None;
            }
            format!("{namespace}/{}", rest.join(DEEP_JOIN))
        }
        [] => return None,
    };
    repo.split('/').all(is_repo_part).then_some(repo)
}

/// Whether `namespace` can name the models at the top of a source ([`repo_id_of`]).
pub(crate) fn is_namespace(namespace: &str) -> bool {
    is_repo_part(namespace)
}

/// The model ids repo `repo` may stand for ([`repo_id_of`]'s inverse), the one to prefer first:
/// `{namespace}/llama` is the model of that id, else the model `llama` at the top of a source;
/// a one-segment repo id, as clients before `huggingface_hub` 2.x write it, is the model of
/// that id.
pub(crate) fn model_ids_of(repo: &str, namespace: &str) -> Vec<String> {
    let mut ids = Vec::with_capacity(2);
    match repo.split_once('/') {
        None => {
            if repo_id_of(repo, namespace).is_some() {
                ids.push(repo.to_owned());
            }
        }
        Some((first, name)) => {
            let id = if name.contains(DEEP_JOIN) {
                format!("{first}/{}", name.replace(DEEP_JOIN, "/"))
            } else {
                repo.to_owned()
            };
            if repo_id_of(&id, namespace).as_deref() == Some(repo) {
                ids.push(id);
            }
            if first == namespace && repo_id_of(name, namespace).as_deref() == Some(repo) {
                ids.push(name.to_owned());
            }
        }
    }
    ids
}

/// What a request under the Hub API asks for (paths below the API's prefix, each segment
/// percent-decoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HubRoute {
    /// `GET /api/models/{repo}` and `/api/models/{repo}/revision/{revision}`.
    Info { repo: String, revision: Option<String> },
    /// `GET /api/models/{repo}/tree/{revision}[/{path}]`.
    Tree { repo: String, revision: String, path: String },
    /// `POST /api/models/{repo}/paths-info/{revision}`.
    PathsInfo { repo: String, revision: String },
    /// `GET /api/models/{repo}/refs`: the branches (`main`) and their commits.
    Refs { repo: String },
    /// `GET /api/models/{repo}/safetensors-metadata/{path}`: a sharded checkpoint's index (less
    /// its weight map) and every shard's header, at `main`, in one answer.
    SafetensorsMetadata { repo: String, path: String },
    /// `GET /v2/{repo}/manifests/{tag}`: the model file of a quantization tag, as llama.cpp
    /// releases before its tree listing ask for it.
    QuantizationManifest { repo: String, tag: String },
    /// `GET|HEAD /{repo}/resolve/{revision}/{path}`.
    Resolve { repo: String, revision: String, path: String },
    /// `GET /api/models`: the repositories, filtered, sorted and paged.
    ListModels,
    /// `GET /api/agent-harnesses`: the registry `huggingface_hub` 2.x reads once a day to tell
    /// whether a coding agent runs it.
    AgentHarnesses,
    /// A route of another repository type (datasets, spaces): no such repository here.
    OtherRepoType { repo: String },
    /// A route of the Hub API that is not served (writes, listings, discussions…).
    NotServed(String),
    /// No route of the Hub API.
    Unknown,
}

/// The route of `segments` (the path below the API's prefix), where `is_repo` says which repo
/// ids exist: `name` and `namespace/name` both being possible, a known repo wins, and otherwise
/// the reading whose next segment is the operation.
pub(crate) fn route(segments: &[String], is_repo: impl Fn(&str) -> bool) -> HubRoute {
    let operation_after = |rest: &[String], operations: &[&str]| -> Option<(String, usize)> {
        let two = (rest.len() >= 2).then(|| format!("{}/{}", rest[0], rest[1]));
        let follows = |at: usize| rest.get(at).is_none_or(|s| operations.contains(&s.as_str()));
        match two {
            Some(two) if is_repo(&two) && follows(2) => Some((two, 2)),
            _ if !rest.is_empty() && is_repo(&rest[0]) && follows(1) => Some((rest[0].clone(), 1)),
            Some(_) if rest.get(1).is_some_and(|s| operations.contains(&s.as_str())) => Some((rest[0].clone(), 1)),
            Some(two) => Some((two, 2)),
            None => rest.first().map(|one| (one.clone(), 1)),
        }
    };
    let tail = |rest: &[String]| rest.join("/");
    match segments.first().map(String::as_str) {
        Some("v2") if segments.len() >= 4 && segments[segments.len() - 2] == "manifests" => {
            match &segments[1..segments.len() - 2] {
                [one] => {
                    HubRoute::QuantizationManifest { repo: one.clone(), tag: segments[segments.len() - 1].clone() }
                }
                [namespace, name] => HubRoute::QuantizationManifest {
                    repo: format!("{namespace}/{name}"),
                    tag: segments[segments.len() - 1].clone(),
                },
                _ => HubRoute::Unknown,
            }
        }
        Some("api") => match segments.get(1).map(String::as_str) {
            Some("models") if segments.len() == 2 => HubRoute::ListModels,
            Some("agent-harnesses") if segments.len() == 2 => HubRoute::AgentHarnesses,
            Some("models") => {
                let rest = &segments[2..];
                let Some((repo, at)) =
                    operation_after(rest, &["revision", "tree", "paths-info", "refs", "safetensors-metadata"])
                else {
                    return HubRoute::Unknown;
                };
                match &rest[at..] {
                    [] => HubRoute::Info { repo, revision: None },
                    [op, revision] if op == "revision" => HubRoute::Info { repo, revision: Some(revision.clone()) },
                    [op, revision, path @ ..] if op == "tree" => {
                        HubRoute::Tree { repo, revision: revision.clone(), path: tail(path) }
                    }
                    [op, revision] if op == "paths-info" => HubRoute::PathsInfo { repo, revision: revision.clone() },
                    [op] if op == "refs" => HubRoute::Refs { repo },
                    [op, path @ ..] if op == "safetensors-metadata" && !path.is_empty() => {
                        HubRoute::SafetensorsMetadata { repo, path: tail(path) }
                    }
                    [op, ..] => HubRoute::NotServed(format!("the {op:?} operation on models")),
                }
            }
            Some(kind @ ("datasets" | "spaces")) => {
                HubRoute::OtherRepoType { repo: format!("{kind}/{}", tail(&segments[2..])) }
            }
            _ => HubRoute::NotServed(format!("/api/{}", tail(&segments[1..]))),
        },
        Some(_) => {
            let (prefix, rest) = match segments[0].as_str() {
                kind @ ("datasets" | "spaces")
                    if !is_repo(&format!("{kind}/{}", segments.get(1).map_or("", |s| s))) =>
                {
                    (Some(kind), &segments[1..])
                }
                _ => (None, segments),
            };
            let Some((repo, at)) = operation_after(rest, &["resolve"]) else { return HubRoute::Unknown };
            match &rest[at..] {
                [op, revision, path @ ..] if op == "resolve" && !path.is_empty() => match prefix {
                    Some(kind) => HubRoute::OtherRepoType { repo: format!("{kind}/{repo}") },
                    None => HubRoute::Resolve { repo, revision: revision.clone(), path: tail(path) },
                },
                _ => HubRoute::Unknown,
            }
        }
        None => HubRoute::Unknown,
    }
}

/// The commit id of a repository whose files are `files` (path and strong ETag each): 40 hex
/// digits, as a git commit id is, that change whenever any file's version does.
pub(crate) fn commit_of<'f>(files: impl Iterator<Item = (&'f str, &'f str)>) -> String {
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"ztserve hub commit\0");
    for (path, etag) in files {
        hasher.update(path.as_bytes());
        hasher.update([0]);
        hasher.update(etag.as_bytes());
        hasher.update([0]);
    }
    hex::encode(&hasher.finalize()[..20])
}

/// The git blob id of the LFS pointer file for a file of `size` bytes with SHA-256 `sha256`:
/// what the Hub gives as an LFS file's `oid` (its blob id in the repository).
pub(crate) fn lfs_pointer_oid(sha256: &[u8; 32], size: u64) -> (String, usize) {
    let pointer = lfs_pointer(sha256, size);
    let mut hasher = sha1::Sha1::new();
    hasher.update(format!("blob {}\0", pointer.len()).as_bytes());
    hasher.update(pointer.as_bytes());
    (hex::encode(hasher.finalize()), pointer.len())
}

fn lfs_pointer(sha256: &[u8; 32], size: u64) -> String {
    format!("version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize {size}\n", hex::encode(sha256))
}

/// A directory's `oid` in a tree listing: stable for a commit and path (ztserve keeps no git
/// trees; clients only compare it).
pub(crate) fn directory_oid(commit: &str, path: &str) -> String {
    let mut hasher = sha1::Sha1::new();
    hasher.update(format!("tree {commit}\0{path}").as_bytes());
    hex::encode(hasher.finalize())
}

/// One entry of a tree listing, by index into the repository's files for a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TreeEntry {
    File(usize),
    Directory(String),
}

/// The entries below directory `under` (`""`: the root) of a repository whose files have
/// `paths`: its files and directories, or, when `recursive`, every file and directory below
/// it; sorted by path. `None` when `under` is no directory of the repository.
pub(crate) fn tree<'p>(paths: impl Iterator<Item = &'p str>, under: &str, recursive: bool) -> Option<Vec<TreeEntry>> {
    let under = under.trim_matches('/');
    let prefix = if under.is_empty() { String::new() } else { format!("{under}/") };
    let mut found = under.is_empty();
    let mut entries: Vec<(String, TreeEntry)> = Vec::new();
    let mut directories = BTreeSet::new();
    for (index, path) in paths.enumerate() {
        let Some(rest) = path.strip_prefix(prefix.as_str()) else { continue };
        found = true;
        let mut parts: Vec<&str> = rest.split('/').collect();
        let _file = parts.pop();
        if recursive {
            for depth in 1..=parts.len() {
                directories.insert(format!("{prefix}{}", parts[..depth].join("/")));
            }
            entries.push((path.to_owned(), TreeEntry::File(index)));
        } else if let Some(first) = parts.first() {
            directories.insert(format!("{prefix}{first}"));
        } else {
            entries.push((path.to_owned(), TreeEntry::File(index)));
        }
    }
    if !found {
        return None;
    }
    entries.extend(directories.into_iter().map(|d| (d.clone(), TreeEntry::Directory(d))));
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Some(entries.into_iter().map(|(_, entry)| entry).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_map_to_repo_ids_and_back_without_two_ids_meeting() {
        for (id, repo) in [
            ("llama", Some("local/llama")),
            ("org/llama-3.1_8B", Some("org/llama-3.1_8B")),
            ("org/team/llama", Some("org/team__llama")),
            ("a/b/c/d", Some("a/b__c__d")),
            // Ids that would meet another's repo id, or that the Hub client refuses.
            ("org/team__llama", None),
            ("org/team_/llama", None),
            ("org/_team/llama", None),
            ("org/-llama", None),
            ("org/llama.", None),
            ("org/llama--x", None),
            ("org/llama..x", None),
            ("org/llama.git", None),
            ("org/llama x", None),
            ("org/ll\u{e4}ma", None),
            ("-llama", None),
        ] {
            assert_eq!(repo_id_of(id, "local").as_deref(), repo, "{id}");
            if let Some(repo) = repo {
                assert!(model_ids_of(repo, "local").iter().any(|m| m == id), "{repo}");
            }
        }
        assert_eq!(repo_id_of(&format!("o/{}", "x".repeat(97)), "local"), None);
        assert_eq!(repo_id_of(&format!("o/{}", "x".repeat(96)), "local").map(|r| r.len()), Some(98));
        for repo in ["org/team__llama_", "org/team____llama", "a__b", "org/team__", "org/__team", "-a"] {
            assert_eq!(model_ids_of(repo, "local"), Vec::<String>::new(), "{repo}");
        }
        // `local/llama` is the model of that id if there is one, else the top-level `llama`;
        // the one-segment repo id of older clients is the top-level model.
        assert_eq!(model_ids_of("local/llama", "local"), ["local/llama", "llama"]);
        assert_eq!(model_ids_of("llama", "local"), ["llama"]);
        assert_eq!(model_ids_of("org/llama", "local"), ["org/llama"]);
        assert!(is_namespace("local") && !is_namespace("a/b") && !is_namespace(""));
    }

    fn segments(path: &str) -> Vec<String> {
        path.split('/').map(str::to_owned).collect()
    }

    #[test]
    fn request_paths_are_read_as_the_hub_api_routes_they_name() {
        let known = |repo: &str| ["gpt2", "org/llama", "org/tree"].contains(&repo);
        let info = |repo: &str, revision: Option<&str>| HubRoute::Info {
            repo: repo.into(),
            revision: revision.map(str::to_owned),
        };
        for (path, expected) in [
            ("api/models/gpt2", info("gpt2", None)),
            ("api/models/org/llama", info("org/llama", None)),
            ("api/models/org/llama/revision/main", info("org/llama", Some("main"))),
            ("api/models/gpt2/revision/refs/pr/1", HubRoute::NotServed("the \"revision\" operation on models".into())),
            ("api/models/gpt2/revision/refs%2Fpr%2F1", info("gpt2", Some("refs%2Fpr%2F1"))),
            (
                "api/models/org/tree/tree/main",
                HubRoute::Tree { repo: "org/tree".into(), revision: "main".into(), path: String::new() },
            ),
            (
                "api/models/org/llama/tree/main/tokenizer/a",
                HubRoute::Tree { repo: "org/llama".into(), revision: "main".into(), path: "tokenizer/a".into() },
            ),
            (
                "api/models/missing/tree/main",
                HubRoute::Tree { repo: "missing".into(), revision: "main".into(), path: String::new() },
            ),
            ("api/models/org/missing", info("org/missing", None)),
            (
                "api/models/org/llama/paths-info/abc",
                HubRoute::PathsInfo { repo: "org/llama".into(), revision: "abc".into() },
            ),
            ("api/models/org/llama/refs", HubRoute::Refs { repo: "org/llama".into() }),
            (
                "v2/org/tiny/manifests/Q4_K_M",
                HubRoute::QuantizationManifest { repo: "org/tiny".into(), tag: "Q4_K_M".into() },
            ),
            ("v2/gpt2/manifests/latest", HubRoute::QuantizationManifest { repo: "gpt2".into(), tag: "latest".into() }),
            ("api/models/gpt2/refs", HubRoute::Refs { repo: "gpt2".into() }),
            (
                "api/models/org/llama/safetensors-metadata/model.safetensors.index.json",
                HubRoute::SafetensorsMetadata { repo: "org/llama".into(), path: "model.safetensors.index.json".into() },
            ),
            (
                "api/models/org/new/safetensors-metadata/sub/x.safetensors.index.json",
                HubRoute::SafetensorsMetadata { repo: "org/new".into(), path: "sub/x.safetensors.index.json".into() },
            ),
            ("api/models/org/llama/discussions", HubRoute::NotServed("the \"discussions\" operation on models".into())),
            ("api/models", HubRoute::ListModels),
            ("api/agent-harnesses", HubRoute::AgentHarnesses),
            ("api/whoami-v2", HubRoute::NotServed("/api/whoami-v2".into())),
            ("api/datasets/org/data", HubRoute::OtherRepoType { repo: "datasets/org/data".into() }),
            (
                "org/llama/resolve/main/config.json",
                HubRoute::Resolve { repo: "org/llama".into(), revision: "main".into(), path: "config.json".into() },
            ),
            (
                "gpt2/resolve/abc/sub/dir/vocab.txt",
                HubRoute::Resolve { repo: "gpt2".into(), revision: "abc".into(), path: "sub/dir/vocab.txt".into() },
            ),
            ("datasets/org/data/resolve/main/x.csv", HubRoute::OtherRepoType { repo: "datasets/org/data".into() }),
            ("org/llama/resolve/main", HubRoute::Unknown),
            ("org/llama/blob/main/config.json", HubRoute::Unknown),
            ("", HubRoute::Unknown),
        ] {
            // Segments arrive percent-decoded; one holding `%2F` stands for a decoded `/`.
            assert_eq!(route(&segments(path), known), expected, "{path}");
        }
    }

    #[test]
    fn commit_ids_are_forty_hex_digits_that_change_with_any_file_version() {
        let a = commit_of([("config.json", "\"1\""), ("model.safetensors", "\"2\"")].into_iter());
        let b = commit_of([("config.json", "\"1\""), ("model.safetensors", "\"3\"")].into_iter());
        let is_commit_id =
            |t: &str| t.len() == 40 && t.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        assert!(is_commit_id(&a) && is_commit_id(&b) && a != b, "{a} {b}");
    }

    #[test]
    fn an_lfs_oid_is_the_git_blob_id_of_the_pointer_file() {
        // `git lfs pointer` of the empty file, then `git hash-object` of that pointer.
        let empty: [u8; 32] = sha2::Sha256::digest(b"").into();
        let (oid, pointer_size) = lfs_pointer_oid(&empty, 0);
        assert_eq!(pointer_size, 126);
        let pointer = lfs_pointer(&empty, 0);
        let expected = hex::encode(sha1::Sha1::digest(format!("blob {}\0{pointer}", pointer.len()).as_bytes()));
        assert_eq!(oid, expected);
    }

    #[test]
    fn trees_list_files_and_directories_below_a_path() {
        let paths = ["config.json", "model.safetensors", "tokenizer/merges.txt", "tokenizer/sub/vocab.json"];
        let tree = |under: &str, recursive: bool| tree(paths.iter().copied(), under, recursive);
        use TreeEntry::{Directory as D, File as F};
        assert_eq!(tree("", false), Some(vec![F(0), F(1), D("tokenizer".into())]));
        assert_eq!(
            tree("", true),
            Some(vec![F(0), F(1), D("tokenizer".into()), F(2), D("tokenizer/sub".into()), F(3)])
        );
        assert_eq!(tree("tokenizer", false), Some(vec![F(2), D("tokenizer/sub".into())]));
        assert_eq!(tree("tokenizer/", true), Some(vec![F(2), D("tokenizer/sub".into()), F(3)]));
        assert_eq!(tree("tokenizer/sub", false), Some(vec![F(3)]));
        assert_eq!(tree("missing", false), None);
        assert_eq!(tree("config.json", false), None);
        assert_eq!(tree("tok", false), None);
    }
}
