//! A bucket's key space: every key, sorted as S3 sorts them (by UTF-8 bytes), built once per
//! catalog. A repository's keys ([`Catalog::repository_of`]: a model, or the models of one
//! directory) are `{id}/{path}` for each file the bucket holds of its models ([`Holds`]: the
//! paths the Hub API lists, companions and safetensors files; or their files as stored), so
//! a folder's files keep their paths; only models that serve are listed. Listing pages
//! (prefix, delimiter, start-after, continuation tokens, max-keys) run over the sorted keys,
//! filtered by what the request may read; a key is found by binary search, so no key can name
//! anything but a listed file of a listed model.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::Model;
use crate::format::Manifest;
use crate::service::{ListedFile, Listing, Published, PublishedFile};

/// Which of a model's files a bucket holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holds {
    /// What loaders need, as the Hub API lists it: the companions and the safetensors files
    /// (stored, or the view's). vLLM's Run:ai path fetches every key it does not take for
    /// weights, so a stored `.zt` here would be a second copy of the weights.
    Repository,
    /// The model as its source holds it: the files beside it and each stored file as it is
    /// (`.zt` files, a checkpoint's shards), for copying a model as stored.
    Stored,
}

/// One key of the bucket: a published file of a model, below its repository's id.
pub(super) struct Key {
    pub key: String,
    /// Where the file's path starts in `key`.
    pub path_start: usize,
    pub model: Arc<Model>,
    pub manifest: Arc<Manifest>,
    pub target: Published,
    pub size: u64,
    pub etag: String,
}

impl Key {
    /// The published file the key names: its path below the repository's id.
    pub(super) fn published(&self) -> PublishedFile {
        let path = self.key[self.path_start..].to_owned();
        PublishedFile { path, what: self.target.clone(), size: self.size, etag: self.etag.clone() }
    }

    /// The published file the key names, with the model version it is of.
    pub(super) fn listed(&self) -> ListedFile {
        ListedFile { model: Arc::clone(&self.model), manifest: Arc::clone(&self.manifest), file: self.published() }
    }
}

/// Every key of one catalog snapshot, sorted.
pub(super) struct Keys {
    listing: Listing,
    sorted: Vec<Key>,
}

impl Keys {
    /// The keys of what the bucket `holds` of every model of `listing` that serves.
    pub(super) fn build(listing: Listing, holds: Holds) -> Keys {
        // Each repository's members, the model named after it first (`models()` is sorted).
        let mut repositories: BTreeMap<String, Vec<&Arc<Model>>> = BTreeMap::new();
        for model in listing.models().filter(|m| m.state.is_ok()) {
            repositories.entry(listing.repository_of(model)).or_default().push(model);
        }
        let mut sorted = Vec::new();
        for (id, mut members) in repositories {
            // The Hub API refuses a repository whose named model is broken: so is it here.
            if listing.get(&id).is_some_and(|named| named.state.is_err()) {
                continue;
            }
            members.sort_by_key(|m| m.id != id);
            for model in members {
                let Ok(manifest) = &model.state else { continue };
                let files = match holds {
                    Holds::Repository if listing.shows_published_files(&id, model) => {
                        listing.repository_files(model, manifest)
                    }
                    Holds::Repository | Holds::Stored => listing.files_as_stored(model, manifest),
                };
                for ListedFile { model, manifest, file } in files {
                    sorted.push(Key {
                        key: format!("{id}/{}", file.path),
                        path_start: id.len() + 1,
                        model,
                        manifest,
                        target: file.what,
                        size: file.size,
                        etag: file.etag,
                    });
                }
            }
        }
        // Stable: of the keys that meet, the first member's comes first.
        sorted.sort_by(|a, b| a.key.cmp(&b.key));
        // Two files whose keys meet (a README beside several models of one directory, a stored
        // file named like a view file of a model one level down) keep the first: every key
        // names one thing.
        sorted.dedup_by(|later, first| {
            let same = later.key == first.key;
            if same && later.etag != first.etag {
                tracing::warn!(key = %later.key, "two files have the same S3 key; the first is served");
            }
            same
        });
        Keys { listing, sorted }
    }

    /// Whether these are the keys of `listing`'s snapshot.
    pub(super) fn are_of(&self, listing: &Listing) -> bool {
        self.listing.is_same_snapshot(listing)
    }

    /// The listing these keys are of.
    pub(super) fn listing(&self) -> &Listing {
        &self.listing
    }

    pub(super) fn index_of(&self, key: &str) -> Option<usize> {
        self.sorted.binary_search_by(|k| k.key.as_str().cmp(key)).ok()
    }

    pub(super) fn at(&self, index: usize) -> &Key {
        &self.sorted[index]
    }

    /// One page of a listing of the keys of models `allows` accepts.
    pub(super) fn list(&self, query: &Query, allows: impl Fn(&str) -> bool) -> Page<'_, Key> {
        page(&self.sorted, |k| &k.key, |k| allows(&k.model.id), query)
    }
}

/// One page of a listing of `sorted` (by the key `key_of` gives): the keys and common prefixes
/// after `query`'s starting point, at most `max_keys` of them together, of the items `listed`
/// accepts.
fn page<'k, T>(
    sorted: &'k [T],
    key_of: impl Fn(&T) -> &str,
    listed: impl Fn(&T) -> bool,
    query: &Query,
) -> Page<'k, T> {
    let prefix = query.prefix.as_str();
    let mut at = sorted.partition_point(|k| key_of(k) < prefix);
    let mut skip_under = None;
    match &query.after {
        Some(After::Key(key)) => at = at.max(sorted.partition_point(|k| key_of(k) <= key.as_str())),
        Some(After::Prefix(common)) => {
            at = at.max(sorted.partition_point(|k| key_of(k) < common.as_str()));
            skip_under = Some(common.clone());
        }
        None => {}
    }
    let mut page = Page { contents: Vec::new(), common_prefixes: Vec::new(), next: None };
    let mut last = None;
    for item in sorted[at..].iter().take_while(|k| key_of(k).starts_with(prefix)) {
        let key = key_of(item);
        if skip_under.as_deref().is_some_and(|common| key.starts_with(common)) || !listed(item) {
            continue;
        }
        if page.contents.len() + page.common_prefixes.len() == query.max_keys {
            // Something more is listable: the page is truncated after what it holds.
            page.next = last;
            break;
        }
        let rest = &key[prefix.len()..];
        let common = (!query.delimiter.is_empty())
            .then(|| rest.find(&query.delimiter))
            .flatten()
            .map(|end| key[..prefix.len() + end + query.delimiter.len()].to_owned());
        match common {
            Some(common) => {
                page.common_prefixes.push(common.clone());
                skip_under = Some(common.clone());
                last = Some(After::Prefix(common));
            }
            None => {
                page.contents.push(item);
                last = Some(After::Key(key.to_owned()));
            }
        }
    }
    page
}

/// Where a listing resumes: after a key, or after every key under a common prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum After {
    Key(String),
    Prefix(String),
}

impl After {
    /// The opaque continuation token of this point.
    pub(super) fn token(&self) -> String {
        use base64::Engine as _;
        let text = match self {
            After::Key(key) => format!("k{key}"),
            After::Prefix(prefix) => format!("p{prefix}"),
        };
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
    }

    /// The point a continuation token names, or `None` for a token this server did not make.
    pub(super) fn from_token(token: &str) -> Option<After> {
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
pub(super) struct Query {
    pub prefix: String,
    pub delimiter: String,
    pub after: Option<After>,
    pub max_keys: usize,
}

/// One page of a listing.
pub(super) struct Page<'k, T> {
    pub contents: Vec<&'k T>,
    pub common_prefixes: Vec<String>,
    /// Where the next page starts, when the listing is truncated.
    pub next: Option<After>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: [&str; 8] = [
        "a/model.safetensors",
        "b/config.json",
        "b/model.safetensors",
        "b/tok/vocab.txt",
        "c/d/model.safetensors",
        "c/e/model.safetensors",
        "hidden/model.safetensors",
        "z",
    ];

    fn query(prefix: &str, delimiter: &str, after: Option<After>, max_keys: usize) -> Query {
        Query { prefix: prefix.into(), delimiter: delimiter.into(), after, max_keys }
    }

    /// Every page of a listing, each as its keys and common prefixes, following the tokens.
    fn pages(prefix: &str, delimiter: &str, max_keys: usize) -> Vec<Vec<String>> {
        let (mut all, mut after) = (Vec::new(), None);
        loop {
            let token = after.as_ref().map(After::token);
            let after_token = token.as_deref().map(|t| After::from_token(t).expect("our own token"));
            let page =
                page(&KEYS, |k| k, |k| !k.starts_with("hidden/"), &query(prefix, delimiter, after_token, max_keys));
            let mut items: Vec<String> = page.contents.iter().map(|k| k.to_string()).collect();
            items.extend(page.common_prefixes.iter().map(|p| format!("{p}*")));
            all.push(items);
            match page.next {
                Some(next) => after = Some(next),
                None => return all,
            }
        }
    }

    #[test]
    fn listings_page_through_keys_and_common_prefixes_and_skip_what_is_not_listed() {
        assert_eq!(
            pages("", "", 1000),
            [KEYS.iter().filter(|k| !k.starts_with("hidden/")).map(|k| k.to_string()).collect::<Vec<_>>()]
        );
        assert_eq!(pages("", "/", 1000), [vec!["z", "a/*", "b/*", "c/*"]]);
        assert_eq!(pages("b/", "/", 1000), [vec!["b/config.json", "b/model.safetensors", "b/tok/*"]]);
        assert_eq!(pages("c/", "/", 1), [vec!["c/d/*"], vec!["c/e/*"]], "a common prefix is skipped whole");
        assert_eq!(pages("", "/", 2), [vec!["a/*", "b/*"], vec!["z", "c/*"]]);
        assert_eq!(pages("b", "", 2), [vec!["b/config.json", "b/model.safetensors"], vec!["b/tok/vocab.txt"]]);
        assert_eq!(pages("nothing/", "/", 10), [Vec::<String>::new()]);
        let start_after = page(&KEYS, |k| k, |_| true, &query("", "", Some(After::Key("b/z".into())), 2));
        assert_eq!(start_after.contents, [&"c/d/model.safetensors", &"c/e/model.safetensors"]);
        assert_eq!(start_after.next, Some(After::Key("c/e/model.safetensors".into())));
        assert!(page(&KEYS, |k| k, |_| true, &query("", "", None, 0)).next.is_none(), "max-keys 0: an empty page");
    }

    #[test]
    fn continuation_tokens_are_ours_or_refused() {
        for after in [After::Key("a/b".into()), After::Key(String::new()), After::Prefix("c/".into())] {
            assert_eq!(After::from_token(&after.token()), Some(after));
        }
        for token in ["", "!!", "bm90LW91cnM", "cA"] {
            assert_eq!(After::from_token(token), None, "{token}");
        }
    }
}
