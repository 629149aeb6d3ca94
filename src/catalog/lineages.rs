//! Lineages (`[refits] lineages`): a model-id prefix whose direct sub-folders are the versions a
//! trainer publishes (`policy/step-000120/`), each a model of its own once its ready marker
//! (`READY`, written last) is listed in it. Of each source's listing only the newest
//! `keep_versions` ready versions of a lineage (by name, in byte order) keep their keys; every
//! other version's keys are dropped before any model is made, so they are neither parsed nor
//! served, hashed ahead or cached. What each lineage keeps and drops is remembered
//! ([`Versions`]), so a request for a version that is not kept is told why ([`GoneVersion`]),
//! and the disk cache can hold the kept ones. Keys under no lineage pass untouched.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::storage::Listed;

/// Which model-id prefixes are lineages, how many versions of each stay listed, and the file
/// that makes a version ready.
#[derive(Debug, Clone, Default)]
pub(crate) struct LineageRules {
    /// Longest first, so that of two nested lineages the inner one places a key.
    lineages: Vec<String>,
    keep: usize,
    marker: String,
}

/// One lineage's versions as a source lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Versions {
    /// The lineage (`policy`, `org/policy`).
    pub lineage: String,
    /// The source that lists them.
    pub source: String,
    /// The versions listed, oldest first: the newest ready ones, at most `keep`.
    pub kept: Vec<String>,
    /// Ready versions older than those kept: dropped from the listing.
    pub retired: BTreeSet<String>,
    /// Versions without their ready marker yet: dropped from the listing.
    pub unready: BTreeSet<String>,
    /// How many ready versions are kept (`refits.keep_versions`).
    pub keep: usize,
    /// The ready marker's file name.
    pub marker: String,
}

/// Why a version of a lineage is not listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotKept {
    /// Ready, but older than the versions kept.
    Retired,
    /// Its ready marker is not there (yet).
    NotReady,
}

/// A version of a lineage that its source lists but the catalog does not: the answer to a
/// request for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GoneVersion {
    /// The version's folder name (`step-000100`).
    pub version: String,
    pub why: NotKept,
    /// The lineage's versions, with those it keeps.
    pub versions: Arc<Versions>,
}

impl std::fmt::Display for GoneVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Versions { lineage, kept, keep, marker, .. } = &*self.versions;
        match self.why {
            NotKept::Retired => write!(f, "{lineage}/{} is no longer kept: ", self.version)?,
            NotKept::NotReady => {
                write!(f, "{lineage}/{} is not published yet (no {marker} marker in its folder): ", self.version)?
            }
        }
        match kept.as_slice() {
            [] => write!(f, "lineage {lineage} keeps no ready version yet"),
            kept => write!(f, "lineage {lineage} keeps {} (refits.keep_versions = {keep})", kept.join(", ")),
        }
    }
}

impl LineageRules {
    /// The rules of `[refits]`: `lineages`, `keep` versions of each, `marker` making one ready.
    pub(crate) fn new(lineages: &[String], keep: usize, marker: &str) -> LineageRules {
        let mut lineages: Vec<String> = lineages.iter().map(|l| l.trim_matches('/').to_owned()).collect();
        lineages.retain(|l| !l.is_empty());
        lineages.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        lineages.dedup();
        LineageRules { lineages, keep, marker: marker.to_owned() }
    }

    /// The lineage, version and path within the version of `key`, when it lies in a version's
    /// folder (`L/<version>/<rest>`, `rest` not empty) of the innermost lineage holding it.
    fn place<'k>(&self, key: &'k str) -> Option<(&str, &'k str, &'k str)> {
        self.lineages.iter().find_map(|lineage| {
            let below = key.strip_prefix(lineage.as_str())?.strip_prefix('/')?;
            let (version, rest) = below.split_once('/')?;
            (!version.is_empty() && !rest.is_empty()).then_some((lineage.as_str(), version, rest))
        })
    }

    /// `listed` (a listing of the source `source`) without the keys of the versions that are
    /// not kept, and what each lineage found in it keeps and drops.
    pub(super) fn sift(&self, source: &str, listed: Vec<Listed>) -> (Vec<Listed>, BTreeMap<String, Arc<Versions>>) {
        if self.lineages.is_empty() {
            return (listed, BTreeMap::new());
        }
        // Every version seen of each lineage, and whether its marker is among its keys.
        let mut seen: BTreeMap<&str, BTreeMap<&str, bool>> = BTreeMap::new();
        for object in &listed {
            if let Some((lineage, version, rest)) = self.place(&object.key) {
                *seen.entry(lineage).or_default().entry(version).or_default() |= rest == self.marker;
            }
        }
        let lineages: BTreeMap<String, Arc<Versions>> = seen
            .into_iter()
            .map(|(lineage, versions)| {
                // By name, byte for byte: `step-000120` after `step-000100`.
                let ready: Vec<&str> = versions.iter().filter(|(_, ready)| **ready).map(|(v, _)| *v).collect();
                let (retired, kept) = ready.split_at(ready.len().saturating_sub(self.keep));
                let versions = Versions {
                    lineage: lineage.to_owned(),
                    source: source.to_owned(),
                    kept: kept.iter().map(|v| (*v).to_owned()).collect(),
                    retired: retired.iter().map(|v| (*v).to_owned()).collect(),
                    unready: versions.iter().filter(|(_, ready)| !**ready).map(|(v, _)| (*v).to_owned()).collect(),
                    keep: self.keep,
                    marker: self.marker.clone(),
                };
                (lineage.to_owned(), Arc::new(versions))
            })
            .collect();
        let before = listed.len();
        let listed: Vec<Listed> = listed
            .into_iter()
            .filter(|object| match self.place(&object.key) {
                Some((lineage, version, _)) => lineages[lineage].kept.iter().any(|kept| kept == version),
                None => true,
            })
            .collect();
        if listed.len() < before {
            tracing::debug!(source, dropped = before - listed.len(), "keys of versions not kept are not listed");
        }
        (listed, lineages)
    }
}

/// The lineage and version model `id` lies in, among `lineages` (by lineage): the innermost
/// lineage `L` with `id` = `L/<version>` or `L/<version>/...`.
pub(super) fn version_of<'a>(
    lineages: &'a BTreeMap<String, Arc<Versions>>,
    id: &'a str,
) -> Option<(&'a Arc<Versions>, &'a str)> {
    if lineages.is_empty() {
        return None;
    }
    // Each `/` of the id, from the last: the lineage before it, the version after it.
    id.rmatch_indices('/').find_map(|(slash, _)| {
        let versions = lineages.get(&id[..slash])?;
        let version = id[slash + 1..].split('/').next().filter(|v| !v.is_empty())?;
        Some((versions, version))
    })
}

/// Why model `id` is not listed, when it is a version of one of `lineages` that is not kept.
pub(super) fn gone(lineages: &BTreeMap<String, Arc<Versions>>, id: &str) -> Option<GoneVersion> {
    let (versions, version) = version_of(lineages, id)?;
    let why = if versions.retired.contains(version) {
        NotKept::Retired
    } else if versions.unready.contains(version) {
        NotKept::NotReady
    } else {
        return None;
    };
    Some(GoneVersion { version: version.to_owned(), why, versions: Arc::clone(versions) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(keys: &[&str]) -> Vec<Listed> {
        keys.iter().map(|k| Listed { key: (*k).to_owned(), size: 1, version: "v".into() }).collect()
    }

    fn keys(listed: &[Listed]) -> Vec<&str> {
        listed.iter().map(|l| l.key.as_str()).collect()
    }

    #[test]
    fn only_the_newest_ready_versions_keep_their_keys_and_the_others_are_remembered() {
        let rules = LineageRules::new(&["policy".into(), "org/policy".into()], 2, "READY");
        let all = listed(&[
            "policy/step-000001/model.safetensors",
            "policy/step-000001/READY",
            "policy/step-000002/model.safetensors",
            "policy/step-000002/READY",
            "policy/step-000003/model.safetensors",
            "policy/step-000003/READY",
            "policy/step-000004/model.safetensors",
            "policy/step-000004/tokenizer/READY",
            "policy/README.md",
            "policy.safetensors",
            "org/policy/a/model.zt",
            "org/policy/a/READY",
            "other/step-000001/model.safetensors",
        ]);
        let (kept, lineages) = rules.sift("models", all);
        assert_eq!(
            keys(&kept),
            [
                "policy/step-000002/model.safetensors",
                "policy/step-000002/READY",
                "policy/step-000003/model.safetensors",
                "policy/step-000003/READY",
                "policy/README.md",
                "policy.safetensors",
                "org/policy/a/model.zt",
                "org/policy/a/READY",
                "other/step-000001/model.safetensors",
            ]
        );
        let policy = &lineages["policy"];
        assert_eq!(policy.kept, ["step-000002", "step-000003"]);
        assert_eq!(policy.retired.iter().collect::<Vec<_>>(), ["step-000001"]);
        // A marker deeper in the folder is not the version's.
        assert_eq!(policy.unready.iter().collect::<Vec<_>>(), ["step-000004"]);
        assert_eq!(lineages["org/policy"].kept, ["a"]);
        assert_eq!(lineages.len(), 2, "a lineage is recorded where its source lists versions of it");
    }

    #[test]
    fn a_request_for_a_version_not_kept_is_told_why_and_what_is_kept() {
        let rules = LineageRules::new(&["policy".into()], 2, "READY");
        let (_, lineages) = rules.sift(
            "models",
            listed(&[
                "policy/step-000100/model.safetensors",
                "policy/step-000100/READY",
                "policy/step-000300/model.safetensors",
                "policy/step-000300/READY",
                "policy/step-000400/model.safetensors",
                "policy/step-000400/READY",
                "policy/step-000500/model.safetensors",
            ]),
        );
        let retired = gone(&lineages, "policy/step-000100").unwrap();
        assert_eq!(retired.why, NotKept::Retired);
        assert_eq!(
            retired.to_string(),
            "policy/step-000100 is no longer kept: lineage policy keeps step-000300, step-000400 \
             (refits.keep_versions = 2)"
        );
        let unready = gone(&lineages, "policy/step-000500").unwrap();
        assert_eq!(unready.why, NotKept::NotReady);
        assert!(unready.to_string().starts_with("policy/step-000500 is not published yet (no READY marker"));
        // Ids of models deeper in a version's folder are the version's too.
        assert_eq!(gone(&lineages, "policy/step-000100/weights").unwrap().version, "step-000100");
        for listed_or_unknown in ["policy/step-000400", "policy/step-000200", "policy", "other/step-000100"] {
            assert_eq!(gone(&lineages, listed_or_unknown), None, "{listed_or_unknown}");
        }
    }

    #[test]
    fn without_lineages_a_listing_passes_whole() {
        let all = listed(&["policy/step-1/model.zt"]);
        let (kept, lineages) = LineageRules::default().sift("models", all.clone());
        assert_eq!(kept, all);
        assert!(lineages.is_empty());
    }
}
