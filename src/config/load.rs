//! Loading a configuration: the layers merged in order (defaults < file < environment <
//! flags), each key's origin kept for errors, and the names of earlier releases read as
//! deprecated aliases, each reported once with its new name.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::*;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
    /// `shown` is the value as written, where it may be shown: never a secret's, nor that of
    /// a variable that names no key (it could be a secret under a mistyped name).
    #[error("environment variable {var}{}: {message}", shown.as_ref().map(|v| format!("={v:?}")).unwrap_or_default())]
    Env { var: String, shown: Option<String>, message: String },
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
}

/// A loaded configuration, and what its loading has to say (deprecated names used), to be
/// logged once the logger is up.
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
    pub notices: Vec<String>,
}

/// Keys whose values are secrets: never shown in an error.
const SECRET_KEYS: &[(&str, &str)] =
    &[("auth", "tokens"), ("artifacts", "writers"), ("s3_source", "secret_access_key"), ("hub_source", "token")];

/// The release that stops reading the names of earlier releases ([`ALIASES`]).
pub(super) const ALIASES_REMOVED_IN: &str = "0.2.0";

/// A name of earlier releases (a flat key, or `section.key` for a key that moved), and the
/// section and key it now is. Each still works in the file and in the environment
/// (`ZTSERVE_<FLAT KEY>`, `ZTSERVE_<SECTION>__<KEY>`), with a deprecation notice, until
/// [`ALIASES_REMOVED_IN`].
const ALIASES: &[(&str, &str, &str)] = &[
    ("listen", "server", "listen"),
    ("log_format", "server", "log_format"),
    ("shutdown_drain_secs", "server", "shutdown_drain_secs"),
    ("sources", "sources", "paths"),
    ("on_unreadable_source", "sources", "on_unreadable"),
    ("rescan_interval_secs", "sources", "rescan_interval_secs"),
    ("scan_concurrency", "sources", "scan_concurrency"),
    ("manifest_suffix_bytes", "sources", "manifest_suffix_bytes"),
    ("s3_endpoint", "s3_source", "endpoint"),
    ("s3_region", "s3_source", "region"),
    ("s3_access_key_id", "s3_source", "access_key_id"),
    ("s3_secret_access_key", "s3_source", "secret_access_key"),
    ("s3_allow_http", "s3_source", "allow_http"),
    ("s3_virtual_hosted_style", "s3_source", "virtual_hosted_style"),
    ("s3_connect_timeout_secs", "s3_source", "connect_timeout_secs"),
    ("s3_read_timeout_secs", "s3_source", "read_timeout_secs"),
    ("s3_retries", "s3_source", "retries"),
    ("s3_range_chunk_bytes", "remote", "range_chunk_bytes"),
    ("s3_range_concurrency", "remote", "range_concurrency"),
    ("s3_readahead_bytes", "remote", "readahead_bytes"),
    // Keys that moved between sections: S3 and Hub sources share them.
    ("s3_source.range_chunk_bytes", "remote", "range_chunk_bytes"),
    ("s3_source.range_concurrency", "remote", "range_concurrency"),
    ("s3_source.readahead_bytes", "remote", "readahead_bytes"),
    ("s3_listen", "s3_endpoint", "listen"),
    ("s3_endpoint_bucket", "s3_endpoint", "bucket"),
    ("request_timeout_secs", "limits", "request_timeout_secs"),
    ("max_concurrent_requests", "limits", "max_concurrent_requests"),
    ("max_connections", "limits", "max_connections"),
    ("max_header_bytes", "limits", "max_header_bytes"),
    ("header_timeout_secs", "limits", "header_timeout_secs"),
    ("idle_timeout_secs", "limits", "idle_timeout_secs"),
    ("max_ranges", "limits", "max_ranges"),
    ("max_manifest_bytes", "limits", "max_manifest_bytes"),
    ("max_decoded_bytes", "limits", "max_decoded_bytes"),
    ("decode_cache_bytes", "decode", "cache_bytes"),
    ("max_concurrent_decodes", "decode", "max_concurrent"),
    ("decode_wait_ms", "decode", "wait_ms"),
    ("verify", "serving", "verify"),
    ("view_shard_bytes", "serving", "view_shard_bytes"),
    ("tokens", "auth", "tokens"),
    ("token_file", "auth", "token_file"),
    ("metrics_require_token", "auth", "metrics_require_token"),
];

/// The environment variable of `section.key`.
pub fn env_name(section: &str, key: &str) -> String {
    format!("ZTSERVE_{}__{}", section.to_ascii_uppercase(), key.to_ascii_uppercase())
}

/// The value an aliased flat key's value stands for: earlier releases wrote "off" as `""`
/// (addresses, endpoints, credentials, the token file) or `0` (the request timeout, the
/// decoders), where the sections leave the key out (or, for the request timeout, say
/// `"none"`). `None`: the key is left out.
fn from_flat(flat: &str, value: toml::Value) -> Option<toml::Value> {
    match (&value, flat) {
        (toml::Value::Integer(0), "request_timeout_secs") => Some(toml::Value::String("none".into())),
        (toml::Value::Integer(0), "max_concurrent_decodes") => None,
        (toml::Value::String(text), _) if text.is_empty() => None,
        _ => Some(value),
    }
}

/// Every key of every section, each with a value of its type (optional keys included): what
/// the file, the environment and flags may set, and how an environment value is read.
pub(super) fn shape() -> toml::Table {
    let example = Config {
        s3_source: S3Source {
            endpoint: Some(String::new()),
            region: Some(String::new()),
            access_key_id: Some(String::new()),
            secret_access_key: Some(String::new()),
            ca_file: Some(PathBuf::new()),
            ..S3Source::default()
        },
        hub_source: HubSource { ca_file: Some(PathBuf::new()), ..HubSource::default() },
        tls: Tls {
            cert_file: Some(PathBuf::new()),
            key_file: Some(PathBuf::new()),
            client_ca_file: Some(PathBuf::new()),
            ..Tls::default()
        },
        s3_endpoint: S3Endpoint { listen: Some(SocketAddr::from(([0, 0, 0, 0], 9000))), ..S3Endpoint::default() },
        decode: Decode { max_concurrent: Some(1), ..Decode::default() },
        auth: Auth { token_file: Some(PathBuf::new()), ..Auth::default() },
        digests: Digests { store: Some(PathBuf::new()), hash_concurrency: Some(1), ..Digests::default() },
        cache: Cache { dir: Some(PathBuf::new()), ..Cache::default() },
        signing: Signing { ca_file: Some(PathBuf::new()), ..Signing::default() },
        artifacts: Artifacts {
            dir: Some(PathBuf::new()),
            s3: Some(SourceSpec::S3 { bucket: String::new(), prefix: String::new() }),
            ..Artifacts::default()
        },
        refits: Refits { delta_dir: Some(PathBuf::new()), ..Refits::default() },
        ..Config::default()
    };
    toml::Table::try_from(example).expect("the configuration serializes")
}

/// What is being merged: the sections' tables, where each key's value came from, and the
/// deprecated names used.
struct Merging {
    shape: toml::Table,
    merged: toml::Table,
    origin: BTreeMap<String, String>,
    notices: Vec<String>,
}

impl Merging {
    /// Whether `section.key` is a key of the configuration.
    fn knows(&self, section: &str, key: &str) -> bool {
        self.shape.get(section).and_then(toml::Value::as_table).is_some_and(|t| t.contains_key(key))
    }

    /// Sets `section.key` (`None`: leaves it out, as an aliased "off" value does).
    fn set(&mut self, section: &str, key: &str, value: Option<toml::Value>, origin: String) {
        let table = self
            .merged
            .entry(section.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .expect("every section is a table");
        match value {
            Some(value) => table.insert(key.to_owned(), value),
            None => table.remove(key),
        };
        self.origin.insert(format!("{section}.{key}"), origin);
    }

    /// The section and key a deprecated name (a flat key, or `section.key` of a key that moved)
    /// stands for, noting its use once.
    fn alias(
        &mut self,
        flat: &str,
        used_as: String,
        now: impl Fn(&str, &str) -> String,
    ) -> Option<(&'static str, &'static str)> {
        let &(_, section, key) = ALIASES.iter().find(|(name, _, _)| *name == flat)?;
        let notice =
            format!("{used_as} is deprecated: use {}; release {ALIASES_REMOVED_IN} removes it", now(section, key));
        if !self.notices.contains(&notice) {
            self.notices.push(notice);
        }
        Some((section, key))
    }
}

impl Config {
    /// Merges the layers. `env` is the process environment (or a test's); `flags` are the
    /// command-line overrides as TOML values keyed `section.key`.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: BTreeMap<String, toml::Value>,
    ) -> Result<Loaded, ConfigError> {
        let defaults = toml::Table::try_from(Config::default()).expect("the defaults serialize");
        let mut merging =
            Merging { shape: shape(), merged: defaults.clone(), origin: BTreeMap::new(), notices: Vec::new() };

        if let Some(path) = file {
            merge_file(&mut merging, path)?;
        }
        merge_env(&mut merging, env.into_iter().filter(|(k, _)| k.starts_with("ZTSERVE_")).collect())?;

        for (path, value) in flags {
            let (section, key) = path.split_once('.').expect("flags are keyed section.key");
            debug_assert!(merging.knows(section, key), "flag {path} has no config key");
            merging.set(section, key, Some(value), format!("flag --{}", key.replace('_', "-")));
        }

        let Merging { merged, origin, notices, .. } = merging;
        let config: Config = match toml::Value::Table(merged.clone()).try_into() {
            Ok(config) => config,
            Err(whole) => return Err(culprit(&defaults, &merged, &origin).unwrap_or_else(|| invalid_as_a_whole(whole))),
        };
        config.validate(&origin)?;
        let mut config = config;
        // A node with a cache directory has a place to keep state: the digests stay with it.
        if config.digests.store.is_none() {
            config.digests.store = config.cache.dir.as_ref().map(|dir| dir.join("digests"));
        }
        Ok(Loaded { config, notices })
    }
}

/// Merges the config file at `path` over `merging`: its sections' keys, and the flat names of
/// earlier releases; an unknown key, or a key set under its old and new names, is refused.
fn merge_file(merging: &mut Merging, path: &Path) -> Result<(), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| ConfigError::File { path: path.to_owned(), message: e.to_string() })?;
    let from = format!("config file {}", path.display());
    let unknown = |key: &str| ConfigError::File { path: path.to_owned(), message: format!("unknown key {key:?}") };
    // The file's keys as written: an old name and its new one together are ambiguous.
    let mut written: BTreeMap<String, String> = BTreeMap::new();
    let mut once = |key: String, as_written: String| match written.insert(key.clone(), as_written.clone()) {
        Some(other) => Err(ConfigError::File {
            path: path.to_owned(),
            message: format!("{key} is set twice, as {other} and as {as_written}: set it once, by its new name"),
        }),
        None => Ok(()),
    };
    for (name, value) in table {
        match value {
            toml::Value::Table(keys) if merging.shape.contains_key(&name) => {
                for (key, value) in keys {
                    if merging.knows(&name, &key) {
                        once(format!("{name}.{key}"), format!("{key} in [{name}]"))?;
                        merging.set(&name, &key, Some(value), from.clone());
                        continue;
                    }
                    let used_as = format!("config key {key:?} in [{name}] ({from})");
                    let (section, new_key) = merging
                        .alias(&format!("{name}.{key}"), used_as, |section, key| format!("{key} in [{section}]"))
                        .ok_or_else(|| unknown(&format!("{name}.{key}")))?;
                    once(format!("{section}.{new_key}"), format!("{key} in [{name}]"))?;
                    merging.set(section, new_key, Some(value), from.clone());
                }
            }
            value => {
                let used_as = format!("config key {name:?} ({from})");
                let (section, key) = merging
                    .alias(&name, used_as, |section, key| format!("{key} in [{section}]"))
                    .ok_or_else(|| unknown(&name))?;
                once(format!("{section}.{key}"), format!("{name:?}"))?;
                merging.set(section, key, from_flat(&name, value), from.clone());
            }
        }
    }
    Ok(())
}

/// Merges the `ZTSERVE_*` variables of `env` over `merging`: `ZTSERVE_<SECTION>__<KEY>`, and
/// the flat names of earlier releases; other `ZTSERVE_` variables are not configuration.
fn merge_env(merging: &mut Merging, env: BTreeMap<String, String>) -> Result<(), ConfigError> {
    // Which variable set each key: an old name and its new one together are ambiguous.
    let mut set_by: BTreeMap<String, String> = BTreeMap::new();
    let keys = shape();
    let is_key = |section: &str, key: &str| {
        keys.get(section).and_then(toml::Value::as_table).is_some_and(|t| t.contains_key(key))
    };
    for (var, text) in &env {
        let name = var["ZTSERVE_".len()..].to_ascii_lowercase();
        let env_error = |section: &str, key: &str, message: String| {
            let shown = is_key(section, key) && !SECRET_KEYS.contains(&(section, key));
            ConfigError::Env { var: var.clone(), shown: shown.then(|| text.clone()), message }
        };
        let (section, key, flat) = match name.split_once("__") {
            Some((section, key)) if merging.knows(section, key) => (section.to_owned(), key.to_owned(), None),
            Some((section, key)) => match merging.alias(&format!("{section}.{key}"), var.clone(), env_name) {
                Some((section, key)) => (section.to_owned(), key.to_owned(), None),
                None => return Err(env_error(section, key, "no such configuration key".into())),
            },
            // Other ZTSERVE_ variables (the client's ZTSERVE_TOKEN, the tests' own) are not
            // configuration, unless they are an earlier release's flat names.
            None => match merging.alias(&name, var.clone(), env_name) {
                Some((section, key)) => (section.to_owned(), key.to_owned(), Some(name.clone())),
                None => continue,
            },
        };
        if let Some(other) = set_by.insert(format!("{section}.{key}"), var.clone()) {
            let message = format!("{section}.{key} is set by {other} too: set it once, by its new name");
            return Err(env_error(&section, &key, message));
        }
        let typed = &merging.shape[section.as_str()][key.as_str()];
        let value = parse_env(typed, text).map_err(|message| env_error(&section, &key, message))?;
        let value = match &flat {
            Some(flat) => from_flat(flat, value),
            None => Some(value),
        };
        merging.set(&section, &key, value, format!("environment variable {var}"));
    }
    Ok(())
}

/// The first key whose merged value alone makes the configuration fail, as that key's error
/// with where its value came from (serde's own error does not say which layer set it).
fn culprit(defaults: &toml::Table, merged: &toml::Table, origin: &BTreeMap<String, String>) -> Option<ConfigError> {
    merged.iter().find_map(|(section, keys)| {
        keys.as_table()?.iter().find_map(|(key, value)| {
            let mut alone = defaults.clone();
            alone.get_mut(section)?.as_table_mut()?.insert(key.clone(), value.clone());
            let refused = toml::Value::Table(alone).try_into::<Config>().err()?;
            let path = format!("{section}.{key}");
            let from = origin.get(&path).map_or("default", String::as_str);
            Some(ConfigError::Invalid {
                origin: format!("{path} (from {from})"),
                message: refused.message().to_owned(),
            })
        })
    })
}

fn invalid_as_a_whole(error: toml::de::Error) -> ConfigError {
    ConfigError::Invalid { origin: "configuration".into(), message: error.to_string() }
}

/// Parses an environment value as the type `typed` has: integers (or `none` where a key takes
/// it), booleans, strings, and for arrays comma-separated lists or a TOML array of strings
/// (`["a", "b"]`, as a JSON list is written too, never taken as one odd entry).
fn parse_env(typed: &toml::Value, text: &str) -> Result<toml::Value, String> {
    match typed {
        toml::Value::Integer(_) if text.trim() == "none" => Ok(toml::Value::String("none".into())),
        toml::Value::Integer(_) => {
            text.trim().parse::<i64>().map(toml::Value::Integer).map_err(|_| "expected an integer".into())
        }
        toml::Value::Boolean(_) => {
            text.trim().parse::<bool>().map(toml::Value::Boolean).map_err(|_| "expected true or false".into())
        }
        toml::Value::Array(_) if text.trim_start().starts_with('[') => {
            let written: toml::Table = toml::from_str(&format!("list = {text}"))
                .map_err(|e| format!("expected a comma-separated list or an array of strings: {e}"))?;
            match &written["list"] {
                toml::Value::Array(items) if items.iter().all(toml::Value::is_str) => Ok(written["list"].clone()),
                _ => Err("expected a comma-separated list or an array of strings".into()),
            }
        }
        toml::Value::Array(_) => Ok(toml::Value::Array(
            text.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.to_owned()))
                .collect(),
        )),
        _ => Ok(toml::Value::String(text.to_owned())),
    }
}
