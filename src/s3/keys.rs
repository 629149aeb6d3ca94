//! The bucket's key space: every key, sorted as S3 sorts them (by UTF-8 bytes), built once per
//! catalog. A model's keys are `{id}/{name}` for each file of its safetensors view, each stored
//! file not already in the view, and each file beside it that is not a model file (its path
//! below the model's directory); only models that serve are listed. Listing pages
//! (prefix, delimiter, start-after, continuation tokens, max-keys) run over the sorted keys,
//! filtered by what the request may read; a key is found by binary search, so no key can name
//! anything but a listed file of a listed model.

use std::sync::Arc;

use crate::catalog::{Catalog, Model};
use crate::format::Manifest;
use crate::format::view::ViewBytes;
use crate::service::{Service, companion_etag, stored_file_etag, view_file_etag};

/// What a key serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A file of the model's safetensors view, by name.
    View(String),
    /// One of the model's stored files, by name.
    Stored(String),
    /// The model's companion of this index in the catalog's list.
    Companion(usize),
}

/// One key of the bucket.
pub struct Key {
    pub key: String,
    pub model: Arc<Model>,
    pub manifest: Arc<Manifest>,
    pub target: Target,
    pub size: u64,
    pub etag: String,
}

/// Every key of one catalog, sorted.
pub struct Keys {
    catalog: Arc<Catalog>,
    sorted: Vec<Key>,
}

impl Keys {
    /// The keys of every model of `catalog` that serves.
    pub fn build(service: &Service, catalog: Arc<Catalog>) -> Keys {
        let mut sorted = Vec::new();
        for model in catalog.models() {
            for (index, companion) in catalog.companions(&model.id).iter().enumerate() {
                let Ok(manifest) = &model.state else { break };
                sorted.push(Key {
                    key: format!("{}/{}", model.id, companion.name),
                    model: Arc::clone(model),
                    manifest: Arc::clone(manifest),
                    target: Target::Companion(index),
                    size: companion.object.size,
                    etag: companion_etag(model, companion),
                });
            }
            let Ok(manifest) = &model.state else { continue };
            let view = service.view(model, manifest);
            let mut in_view = vec![false; model.files.len()];
            for file in &view.files {
                if let ViewBytes::Stored { file: index } = file.bytes {
                    in_view[index] = true;
                }
                sorted.push(Key {
                    key: format!("{}/{}", model.id, file.name),
                    model: Arc::clone(model),
                    manifest: Arc::clone(manifest),
                    target: Target::View(file.name.clone()),
                    size: file.len,
                    etag: view_file_etag(model, file),
                });
            }
            for (index, stored) in model.files.iter().enumerate().filter(|(i, _)| !in_view[*i]) {
                sorted.push(Key {
                    key: format!("{}/{}", model.id, stored.name),
                    model: Arc::clone(model),
                    manifest: Arc::clone(manifest),
                    target: Target::Stored(stored.name.clone()),
                    size: if index == 0 { manifest.file_len } else { stored.object.size },
                    etag: stored_file_etag(model, index),
                });
            }
        }
        sorted.sort_by(|a, b| a.key.cmp(&b.key));
        // Two models whose keys meet (a stored file named like a view file of a model one level
        // down) keep the first: every key names one thing.
        sorted.dedup_by(|later, first| {
            let same = later.key == first.key;
            if same {
                tracing::warn!(key = %later.key, "two files have the same S3 key; the first is served");
            }
            same
        });
        Keys { catalog, sorted }
    }

    /// Whether these are the keys of `catalog`.
    pub fn are_of(&self, catalog: &Arc<Catalog>) -> bool {
        Arc::ptr_eq(&self.catalog, catalog)
    }

    /// The catalog these keys are of.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn get(&self, key: &str) -> Option<&Key> {
        self.index_of(key).map(|i| &self.sorted[i])
    }

    pub fn index_of(&self, key: &str) -> Option<usize> {
        self.sorted.binary_search_by(|k| k.key.as_str().cmp(key)).ok()
    }

    pub fn at(&self, index: usize) -> &Key {
        &self.sorted[index]
    }

    /// One page of a listing: the keys and common prefixes after `query`'s starting point, at
    /// most `max_keys` of them together, of models `allows` accepts.
    pub fn list(&self, query: &Query, allows: impl Fn(&str) -> bool) -> Page<'_> {
        let prefix = query.prefix.as_str();
        let mut at = self.sorted.partition_point(|k| k.key.as_str() < prefix);
        let mut skip_under = None;
        match &query.after {
            Some(After::Key(key)) => at = at.max(self.sorted.partition_point(|k| k.key <= *key)),
            Some(After::Prefix(common)) => {
                at = at.max(self.sorted.partition_point(|k| k.key < *common));
                skip_under = Some(common.clone());
            }
            None => {}
        }
        let mut page = Page { contents: Vec::new(), common_prefixes: Vec::new(), next: None };
        let mut last = None;
        for key in self.sorted[at..].iter().take_while(|k| k.key.starts_with(prefix)) {
            if skip_under.as_deref().is_some_and(|common| key.key.starts_with(common)) || !allows(&key.model.id) {
                continue;
            }
            if page.contents.len() + page.common_prefixes.len() == query.max_keys {
                // Something more is listable: the page is truncated after what it holds.
                page.next = last;
                break;
            }
            let rest = &key.key[prefix.len()..];
            let common = (!query.delimiter.is_empty())
                .then(|| rest.find(&query.delimiter))
                .flatten()
                .map(|end| key.key[..prefix.len() + end + query.delimiter.len()].to_owned());
            match common {
                Some(common) => {
                    page.common_prefixes.push(common.clone());
                    skip_under = Some(common.clone());
                    last = Some(After::Prefix(common));
                }
                None => {
                    page.contents.push(key);
                    last = Some(After::Key(key.key.clone()));
                }
            }
        }
        page
    }
}

/// Where a listing resumes: after a key, or after every key under a common prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum After {
    Key(String),
    Prefix(String),
}

impl After {
    /// The opaque continuation token of this point.
    pub fn token(&self) -> String {
        use base64::Engine as _;
        let text = match self {
            After::Key(key) => format!("k{key}"),
            After::Prefix(prefix) => format!("p{prefix}"),
        };
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
    }

    /// The point a continuation token names, or `None` for a token this server did not make.
    pub fn from_token(token: &str) -> Option<After> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        match text.split_at_checked(1)? {
            ("k", key) => Some(After::Key(key.to_owned())),
            ("p", prefix) if !prefix.is_empty() => Some(After::Prefix(prefix.to_owned())),
            _ => None,
        }
    }
}

/// A listing request.
#[derive(Debug, Clone)]
pub struct Query {
    pub prefix: String,
    pub delimiter: String,
    pub after: Option<After>,
    pub max_keys: usize,
}

/// One page of a listing.
pub struct Page<'k> {
    pub contents: Vec<&'k Key>,
    pub common_prefixes: Vec<String>,
    /// Where the next page starts, when the listing is truncated.
    pub next: Option<After>,
}
