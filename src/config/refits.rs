//! `[refits]`: the versions a trainer publishes into a lineage's folder (which stay listed,
//! and the marker that publishes one) and the store of deltas between them a fleet's ranks
//! fetch; a section of its own, read by the catalog (lineages) and the deltas.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Refits: the versions a trainer publishes, and the deltas between them a fleet's ranks fetch
/// (docs/refits.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Refits {
    /// Model-id prefixes (`policy`, `org/policy`) whose sub-folders are a trainer's versions
    /// (`policy/step-000120/`), each a model of its own.
    pub lineages: Vec<String>,
    /// How many versions of each lineage stay listed (the newest by name); an older one is gone.
    pub keep_versions: usize,
    /// The file a trainer writes into a version's folder last: the version is listed only then.
    pub ready_marker: String,
    /// The directory deltas are kept in (absent: a temporary one, removed at exit).
    pub delta_dir: Option<PathBuf>,
    /// The most bytes the kept deltas hold; the least recently read are evicted past it.
    pub delta_cache_bytes: u64,
    /// The most bytes held in memory for deltas at once: both versions' regions while one is
    /// computed, and each delta until it is sent.
    pub delta_memory_bytes: u64,
    /// Whether, after a rescan lists a lineage's new version, the deltas from the version
    /// before it of the regions recent deltas requests of the lineage asked are computed in
    /// the background, so a fleet's first request finds them kept.
    pub deltas_ahead: bool,
}

impl Default for Refits {
    fn default() -> Refits {
        Refits {
            lineages: Vec::new(),
            keep_versions: 4,
            ready_marker: "READY".to_owned(),
            delta_dir: None,
            delta_cache_bytes: 10_000_000_000,
            delta_memory_bytes: 4 << 30,
            deltas_ahead: true,
        }
    }
}
