//! Validation: the values a configuration may not hold, each refused with the key and where
//! its value came from.

use std::collections::BTreeMap;

use super::*;

/// Makes the error of a key's value, naming where it came from.
type Fail<'a> = dyn Fn(&str, String) -> ConfigError + 'a;

impl Config {
    pub(super) fn validate(&self, origin: &BTreeMap<String, String>) -> Result<(), ConfigError> {
        let fail = |key: &str, message: String| ConfigError::Invalid {
            origin: format!("{key} (from {})", origin.get(key).map_or("default", String::as_str)),
            message,
        };
        self.validate_sources(&fail)?;
        self.validate_access(&fail)?;
        self.validate_digests_and_cache(&fail)?;
        self.validate_limits(&fail)?;
        self.validate_refits(&fail)
    }

    /// Sources, the stores they are read from, and the S3 endpoint's buckets.
    fn validate_sources(&self, fail: &Fail<'_>) -> Result<(), ConfigError> {
        if self.sources.paths.is_empty() {
            return Err(fail("sources.paths", "at least one source directory is needed".into()));
        }
        if self.sources.manifest_suffix_bytes < crate::format::MAX_TRAILER_LEN {
            let message = format!("must be at least {} (the longest trailer)", crate::format::MAX_TRAILER_LEN);
            return Err(fail("sources.manifest_suffix_bytes", message));
        }
        let s3 = &self.s3_source;
        if s3.access_key_id.is_none() != s3.secret_access_key.is_none() {
            let key =
                if s3.access_key_id.is_none() { "s3_source.access_key_id" } else { "s3_source.secret_access_key" };
            return Err(fail(key, "access_key_id and secret_access_key are set together".into()));
        }
        for (key, value) in [
            ("s3_source.endpoint", &s3.endpoint),
            ("s3_source.region", &s3.region),
            ("s3_source.access_key_id", &s3.access_key_id),
            ("s3_source.secret_access_key", &s3.secret_access_key),
        ] {
            if value.as_deref() == Some("") {
                return Err(fail(key, "must not be empty: leave it out for the default".into()));
            }
        }
        for (key, value) in
            [("hub_source.endpoint", &self.hub_source.endpoint), ("hub_source.token", &self.hub_source.token)]
        {
            if value.as_deref() == Some("") {
                return Err(fail(key, "must not be empty: leave it out for the default".into()));
            }
        }
        if let Some(endpoint) = &self.hub_source.endpoint {
            if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
                return Err(fail("hub_source.endpoint", format!("{endpoint:?} is not an http:// or https:// URL")));
            }
        }
        let message = "must be a bucket name: 3 to 63 of a-z 0-9 . -, starting and ending with a letter or digit";
        if !is_bucket_name(&self.s3_endpoint.bucket) {
            return Err(fail("s3_endpoint.bucket", message.into()));
        }
        let stored = self.s3_endpoint.stored_bucket();
        if !is_bucket_name(&stored) {
            return Err(fail("s3_endpoint.stored_bucket", message.into()));
        }
        if stored == self.s3_endpoint.bucket {
            return Err(fail("s3_endpoint.stored_bucket", "must differ from s3_endpoint.bucket".into()));
        }
        Ok(())
    }

    /// Tokens, TLS and signing.
    fn validate_access(&self, fail: &Fail<'_>) -> Result<(), ConfigError> {
        if self.auth.token_file.as_deref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(fail("auth.token_file", "must not be empty: leave it out for no token file".into()));
        }
        let tls = &self.tls;
        for (key, value) in [
            ("tls.cert_file", &tls.cert_file),
            ("tls.key_file", &tls.key_file),
            ("tls.client_ca_file", &tls.client_ca_file),
            ("s3_source.ca_file", &self.s3_source.ca_file),
            ("hub_source.ca_file", &self.hub_source.ca_file),
        ] {
            if value.as_deref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(fail(key, "must not be empty: leave it out for the default".into()));
            }
        }
        if tls.cert_file.is_none() != tls.key_file.is_none() {
            let key = if tls.cert_file.is_none() { "tls.cert_file" } else { "tls.key_file" };
            return Err(fail(key, "cert_file and key_file are set together".into()));
        }
        if tls.client_ca_file.is_some() && tls.cert_file.is_none() {
            return Err(fail("tls.client_ca_file", "client certificates need TLS: set cert_file and key_file".into()));
        }
        if !self.auth.client_identities.is_empty() && tls.client_ca_file.is_none() {
            let message = "identities come from client certificates: set tls.client_ca_file";
            return Err(fail("auth.client_identities", message.into()));
        }
        let signing = &self.signing;
        let enforced = std::iter::once(signing.policy)
            .chain(signing.source_policies.iter().map(|p| p.policy))
            .any(|p| p != SigningPolicy::None);
        if enforced && signing.public_keys.is_empty() && signing.ca_file.is_none() {
            let message =
                "a policy other than none needs signing.public_keys or signing.ca_file: no signature could verify";
            return Err(fail("signing.policy", message.into()));
        }
        for entry in &signing.source_policies {
            if !self.sources.paths.iter().any(|spec| spec.to_string() == entry.source) {
                let message = format!("{:?} is not a source of sources.paths", entry.source);
                return Err(fail("signing.source_policies", message));
            }
        }
        let name = &signing.signature_file;
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(fail("signing.signature_file", "must be a file name, without a directory".into()));
        }
        if signing.max_signature_bytes == 0 {
            return Err(fail("signing.max_signature_bytes", "must be at least 1".into()));
        }
        if tls.handshake_timeout_secs == 0 {
            return Err(fail("tls.handshake_timeout_secs", "must be at least 1".into()));
        }
        Ok(())
    }

    /// The digest store, the disk cache, the artifact store and the view's shards.
    fn validate_digests_and_cache(&self, fail: &Fail<'_>) -> Result<(), ConfigError> {
        if self.digests.store.as_deref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(fail("digests.store", "must not be empty: leave it out to keep digests in memory only".into()));
        }
        if !(64 << 10..=256 << 20).contains(&self.digests.read_buffer_bytes) {
            let message = "must be between 65536 (64 KiB) and 268435456 (256 MiB)";
            return Err(fail("digests.read_buffer_bytes", message.into()));
        }
        if self.cache.dir.as_deref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(fail("cache.dir", "must not be empty: leave it out for no disk cache".into()));
        }
        if self.digests.sync_interval_secs == 0 {
            return Err(fail("digests.sync_interval_secs", "must be at least 1".into()));
        }
        if !(64 << 10..=256 << 20).contains(&self.cache.block_bytes) {
            return Err(fail("cache.block_bytes", "must be between 65536 (64 KiB) and 268435456 (256 MiB)".into()));
        }
        if self.cache.max_bytes < 2 * self.cache.block_bytes {
            return Err(fail("cache.max_bytes", "must hold at least two blocks (2 × cache.block_bytes)".into()));
        }
        if self.artifacts.dir.as_deref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(fail("artifacts.dir", "must not be empty: leave it out for no artifact store".into()));
        }
        if self.artifacts.dir.is_none() && !self.artifacts.writers.is_empty() {
            return Err(fail("artifacts.writers", "grants writing to a store there is not: set artifacts.dir".into()));
        }
        if self.artifacts.dir.is_none() && !self.artifacts.writer_identities.is_empty() {
            return Err(fail(
                "artifacts.writer_identities",
                "grants writing to a store there is not: set artifacts.dir".into(),
            ));
        }
        if !self.artifacts.writer_identities.is_empty() && self.tls.client_ca_file.is_none() {
            let message =
                "names client certificate identities, and tls.client_ca_file (which verifies them) is not set";
            return Err(fail("artifacts.writer_identities", message.into()));
        }
        if self.artifacts.require_signature && self.artifacts.allow_unsigned {
            let message = "cannot be set with artifacts.require_signature, which refuses what it would allow";
            return Err(fail("artifacts.allow_unsigned", message.into()));
        }
        let writers = !self.artifacts.writers.is_empty() || !self.artifacts.writer_identities.is_empty();
        if writers && !self.artifacts.require_signature && !self.artifacts.allow_unsigned {
            let message = "writers could take any name under their prefixes with a bundle no reader trusts, so the \
                trusted publisher's is never taken (squatting): set artifacts.require_signature with [signing] keys, \
                or artifacts.allow_unsigned = true for a store whose writers are all trusted";
            return Err(fail("artifacts.require_signature", message.into()));
        }
        if self.artifacts.require_signature && self.signing.public_keys.is_empty() && self.signing.ca_file.is_none() {
            let message = "needs a signer to trust: set signing.public_keys or signing.ca_file";
            return Err(fail("artifacts.require_signature", message.into()));
        }
        if let Some(spec) = &self.artifacts.s3 {
            if !matches!(spec, SourceSpec::S3 { .. }) {
                return Err(fail("artifacts.s3", format!("{spec} is not s3://bucket/prefix")));
            }
            if self.artifacts.dir.is_none() {
                return Err(fail("artifacts.s3", "shares a store there is not: set artifacts.dir too".into()));
            }
        }
        if self.artifacts.max_bytes == 0 {
            return Err(fail("artifacts.max_bytes", "must be at least 1".into()));
        }
        if self.serving.view_shard_bytes > MAX_HUB_FILE_BYTES {
            let message = format!(
                "must be at most {MAX_HUB_FILE_BYTES} (50 GB): huggingface_hub cannot download a larger file over HTTP"
            );
            return Err(fail("serving.view_shard_bytes", message));
        }
        Ok(())
    }

    /// Counts, sizes and times that must be at least 1, and the request head's bounds.
    fn validate_limits(&self, fail: &Fail<'_>) -> Result<(), ConfigError> {
        let s3 = &self.s3_source;
        for (key, value) in [
            ("s3_source.connect_timeout_secs", Some(s3.connect_timeout_secs)),
            ("s3_source.read_timeout_secs", Some(s3.read_timeout_secs)),
            ("remote.range_chunk_bytes", Some(self.remote.range_chunk_bytes)),
            ("remote.range_concurrency", Some(self.remote.range_concurrency as u64)),
            ("serving.view_shard_bytes", Some(self.serving.view_shard_bytes)),
            ("sources.rescan_interval_secs", Some(self.sources.rescan_interval_secs)),
            ("sources.scan_concurrency", Some(self.sources.scan_concurrency as u64)),
            ("limits.max_concurrent_requests", Some(self.limits.max_concurrent_requests as u64)),
            ("limits.max_connections", Some(self.limits.max_connections as u64)),
            ("limits.header_timeout_secs", Some(self.limits.header_timeout_secs)),
            ("limits.idle_timeout_secs", Some(self.limits.idle_timeout_secs)),
            ("limits.max_ranges", Some(self.limits.max_ranges as u64)),
            ("limits.max_regions", Some(self.limits.max_regions as u64)),
            ("limits.max_regions_bytes", Some(self.limits.max_regions_bytes)),
            ("limits.max_manifest_bytes", Some(self.limits.max_manifest_bytes)),
            ("limits.request_timeout_secs", self.limits.request_timeout_secs),
            ("decode.max_concurrent", self.decode.max_concurrent.map(|n| n as u64)),
            ("digests.hash_concurrency", self.digests.hash_concurrency.map(|n| n as u64)),
        ] {
            if value == Some(0) {
                return Err(fail(key, "must be at least 1".into()));
            }
        }
        if !(1024..=1 << 20).contains(&self.limits.max_header_bytes) {
            return Err(fail("limits.max_header_bytes", "must be between 1024 and 1048576".into()));
        }
        Ok(())
    }
}

impl Config {
    /// Lineages, their kept versions and ready marker, and the delta store.
    fn validate_refits(&self, fail: &Fail<'_>) -> Result<(), ConfigError> {
        let refits = &self.refits;
        if refits.keep_versions == 0 {
            return Err(fail("refits.keep_versions", "must be at least 1".into()));
        }
        if let Some(bad) = refits.lineages.iter().find(|l| l.is_empty() || l.starts_with('/') || l.ends_with('/')) {
            return Err(fail("refits.lineages", format!("{bad:?} is no model-id prefix (`policy`, `org/policy`)")));
        }
        if refits.ready_marker.is_empty() || refits.ready_marker.contains('/') {
            return Err(fail("refits.ready_marker", "must be a file name, without a slash".into()));
        }
        if refits.delta_dir.as_deref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(fail("refits.delta_dir", "must not be empty: leave it out for a temporary one".into()));
        }
        if refits.delta_memory_bytes < 1 << 20 {
            return Err(fail("refits.delta_memory_bytes", "must be at least 1048576 (1 MiB)".into()));
        }
        Ok(())
    }
}

/// Whether `name` is a valid S3 bucket name (the rules for new buckets).
fn is_bucket_name(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (3..=63).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        && edge(name.chars().next())
        && edge(name.chars().last())
        && !name.contains("..")
}
