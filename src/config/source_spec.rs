//! A source as written in `sources.paths`, `--source` and `ZTSERVE_SOURCES__PATHS`: a local
//! directory, an `s3://bucket/prefix` location or an `hf://namespace/name[@revision]` Hub
//! repository, parsed and checked as it is read.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A source as configured: a local directory, an `s3://bucket/prefix` location or an
/// `hf://namespace/name[@revision]` Hub repository, written and read as that text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum SourceSpec {
    Local(PathBuf),
    S3 {
        bucket: String,
        prefix: String,
    },
    /// A Hub repository (`name` or `namespace/name`) at a revision (a branch, tag or commit;
    /// `None` is `main`).
    Hub {
        repo: String,
        revision: Option<String>,
    },
}

impl SourceSpec {
    /// A local directory.
    pub fn local(path: impl Into<PathBuf>) -> SourceSpec {
        SourceSpec::Local(path.into())
    }
}

impl TryFrom<String> for SourceSpec {
    type Error = String;

    fn try_from(text: String) -> Result<SourceSpec, String> {
        if text.trim().is_empty() {
            return Err("a source is empty".into());
        }
        if text.starts_with("hf:") {
            return hub_spec(&text);
        }
        if !text.starts_with("s3:") {
            return Ok(SourceSpec::Local(text.into()));
        }
        let rest = text.strip_prefix("s3://").unwrap_or("");
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(format!("{text:?} is not s3://bucket/prefix"));
        }
        Ok(SourceSpec::S3 { bucket: bucket.to_owned(), prefix: prefix.trim_matches('/').to_owned() })
    }
}

/// `hf://namespace/name[@revision]`: a repo id the Hub's client accepts (one or two parts of
/// `A-Z a-z 0-9 - _ .`), and a revision without spaces or `..`.
fn hub_spec(text: &str) -> Result<SourceSpec, String> {
    let wrong = || format!("{text:?} is not hf://namespace/name[@revision]");
    let rest = text.strip_prefix("hf://").ok_or_else(wrong)?;
    let (repo, revision) = match rest.split_once('@') {
        Some((repo, revision)) => (repo, Some(revision)),
        None => (rest, None),
    };
    let part = |p: &str| {
        !p.is_empty()
            && p.len() <= 96
            && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !p.starts_with(['-', '.'])
            && !p.ends_with(['-', '.'])
            && !p.contains("--")
            && !p.contains("..")
    };
    let parts: Vec<&str> = repo.split('/').collect();
    if parts.len() > 2 || !parts.iter().all(|p| part(p)) {
        return Err(wrong());
    }
    if let Some(revision) = revision {
        let fine = !revision.is_empty()
            && !revision.contains("..")
            && !revision.starts_with('/')
            && !revision.ends_with('/')
            && revision.chars().all(|c| c.is_ascii_graphic() && !matches!(c, '?' | '#' | '%' | '\\' | '@'));
        if !fine {
            return Err(format!("{text:?}: {revision:?} is not a revision (a branch, tag or commit id)"));
        }
    }
    Ok(SourceSpec::Hub { repo: repo.to_owned(), revision: revision.map(str::to_owned) })
}

impl From<SourceSpec> for String {
    fn from(spec: SourceSpec) -> String {
        spec.to_string()
    }
}

impl std::fmt::Display for SourceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceSpec::Local(path) => write!(f, "{}", path.display()),
            SourceSpec::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            SourceSpec::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            SourceSpec::Hub { repo, revision: None } => write!(f, "hf://{repo}"),
            SourceSpec::Hub { repo, revision: Some(revision) } => write!(f, "hf://{repo}@{revision}"),
        }
    }
}
