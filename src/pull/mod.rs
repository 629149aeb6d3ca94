//! `ztserve pull URL OUT`: copies a model from a ztserve server to local disk. The model's
//! manifest JSON lists its stored files (one, a v2 root and its shards, or a safetensors index
//! and its shards); the root file's own manifest (a safetensors file's header, each shard's
//! and the index for a checkpoint) is fetched by range from `/models/{m}/files/{name}` and
//! parsed by [`crate::format`]. The output is then either the stored files byte for byte
//! (`--raw`: the file, or a directory of every file for a model stored in several), or one file
//! rebuilt from the selected objects, their stored blobs copied as they are (so zstd frames and
//! seekable streams travel compressed and keep their digests): a 1.2 file from a 0.1 or 1.x
//! model, a single-file v2 file (shards merged) from a v2 or safetensors model (`layout`).
//! Bytes arrive by parallel ranged GETs each bound to its file's ETag ([`remote`],
//! `transfer`), land in a partial file beside the output, are recorded in a journal
//! ([`journal`]) so an interrupted pull resumes, and are checked against every declared digest
//! (over the bytes it covers, `verify`) before the partial file is renamed into place; the
//! bytes moved are shown as they go (`progress`).

pub mod journal;
mod layout;
mod progress;
pub mod remote;
mod transfer;
mod verify;

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::format::{self, FileKind, HEADER_LEN, Limits, MAX_TRAILER_LEN, Manifest, ManifestReads};
use layout::{raw_layout, rebuilt_layout, rebuilt_v2_layout, shard_layout};
use remote::{Remote, RetryPolicy};
use transfer::transfer;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// A bar when standard error is a terminal, lines otherwise.
    Auto,
    /// A line every few seconds.
    Lines,
    Quiet,
}

/// How often the partial output is synced, so the journal can vouch for what was written: a
/// power cut costs at most this much time or these many bytes fetched again.
pub const SYNC_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
pub const SYNC_BYTES: u64 = 256 << 20;

/// Everything `pull` needs.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// A model's URL: `http://host:port/models/<id>`.
    pub url: String,
    pub output: PathBuf,
    /// Download the stored file itself instead of rebuilding it.
    pub raw: bool,
    /// Ranged GETs in flight at once.
    pub concurrency: usize,
    /// Largest range one GET asks for.
    pub chunk_bytes: u64,
    pub retry: RetryPolicy,
    /// Glob patterns over object names; empty selects every object.
    pub objects: Vec<String>,
    pub token: Option<String>,
    pub progress: ProgressMode,
    pub limits: Limits,
}

/// What a pull did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullReport {
    pub output_len: u64,
    /// Bytes fetched by this run.
    pub fetched: u64,
    /// Bytes kept from an earlier, interrupted run.
    pub resumed: u64,
    pub objects: usize,
    pub components: usize,
    pub digests_verified: usize,
    /// Components that declare no digest: checked for length only.
    pub unverified: usize,
}

impl PullReport {
    /// Adds another file's figures (a `--raw` pull of a model stored in several files).
    fn add(&mut self, other: &PullReport) {
        self.output_len += other.output_len;
        self.fetched += other.fetched;
        self.resumed += other.resumed;
        self.objects = self.objects.max(other.objects);
        self.components += other.components;
        self.digests_verified += other.digests_verified;
        self.unverified += other.unverified;
    }
}

/// The model's URL in the server's own form (`/models/{id}`, the id one percent-encoded
/// segment), from the URL given. A model id may be given with its `/` percent-encoded (as the
/// server's own URLs have it) or plainly.
pub fn model_url(model_url: &str) -> anyhow::Result<reqwest::Url> {
    let mut url = reqwest::Url::parse(model_url).with_context(|| format!("{model_url:?} is not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("{model_url:?} is not an http:// or https:// URL");
    }
    let path = url.path().to_owned();
    let Some((base, id)) = path.split_once("/models/") else {
        bail!("{model_url:?} is not a model URL: expected http://HOST:PORT/models/MODEL_ID");
    };
    let id = id.trim_end_matches('/');
    let id = percent_encoding::percent_decode_str(id)
        .decode_utf8()
        .with_context(|| format!("the model id in {model_url:?} is not UTF-8"))?;
    if id.is_empty() {
        bail!("{model_url:?} names no model: expected http://HOST:PORT/models/MODEL_ID");
    }
    url.set_path(&format!("{base}{}", crate::api::model_url(&id)));
    url.set_query(None);
    url.set_fragment(None);
    Ok(url)
}

/// One of the model's stored files, fetched by ranges.
struct SourceFile {
    name: String,
    remote: Remote,
    etag: String,
    len: u64,
    head: bytes::Bytes,
}

/// Pulls a model; see the module docs.
pub async fn pull(options: &PullOptions) -> anyhow::Result<PullReport> {
    if options.concurrency == 0 || options.chunk_bytes == 0 {
        bail!("--concurrency and --chunk-size must be above 0");
    }
    let model = Remote::new(model_url(&options.url)?, options.token.clone(), options.retry, options.concurrency)?;
    let (sources, container) = source_files(&model).await?;
    let safetensors = container == Some(format::Container::Safetensors);
    let gguf = container == Some(format::Container::Gguf);
    let manifest = if safetensors {
        fetch_checkpoint(&sources).await?
    } else if gguf {
        fetch_gguf(&sources).await?
    } else {
        fetch_manifest(&sources[0], &options.limits).await?
    };
    if options.raw && sources.len() > 1 {
        // Every stored file into a directory, each as its own pull (and journal).
        if !options.objects.is_empty() {
            bail!("--objects selects objects for a rebuilt file; --raw copies the stored files");
        }
        std::fs::create_dir_all(&options.output)
            .with_context(|| format!("cannot create the directory {}", options.output.display()))?;
        let mut total = PullReport::default();
        for (index, file) in sources.iter().enumerate() {
            // A v2 shard is held to the root's shard table; a checkpoint's files (a split GGUF
            // model's parts) are copied as they are, each then parsed as what its name says.
            let (layout, check) = match index {
                _ if safetensors || gguf => {
                    (raw_layout(&manifest, index, file.len, options)?, FileKind::of(&file.name))
                }
                0 => (raw_layout(&manifest, 0, file.len, options)?, Some(FileKind::Zt)),
                _ => (shard_layout(&manifest.shards[index - 1], file.len, index), None),
            };
            let report = transfer(&sources, &layout, &options.output.join(&file.name), options, check).await?;
            total.add(&report);
        }
        return Ok(total);
    }
    let (layout, check) = if options.raw {
        (raw_layout(&manifest, 0, sources[0].len, options)?, FileKind::of(&sources[0].name))
    } else if matches!(
        manifest.container,
        format::Container::V2 | format::Container::Safetensors | format::Container::Gguf
    ) {
        (rebuilt_v2_layout(&manifest, options)?, Some(FileKind::Zt))
    } else {
        (rebuilt_layout(&manifest, options)?, Some(FileKind::Zt))
    };
    transfer(&sources, &layout, &options.output, options, check).await
}

/// The model's stored files, from its manifest JSON, each probed for its ETag and length, and
/// the container it is stored in when it is one found by name (safetensors, GGUF).
async fn source_files(model: &Remote) -> anyhow::Result<(Vec<SourceFile>, Option<format::Container>)> {
    let listing = model.json().await?;
    let container = [format::Container::Safetensors, format::Container::Gguf]
        .into_iter()
        .find(|c| listing["container"] == c.to_string().as_str());
    let files = listing["files"].as_array().filter(|files| !files.is_empty()).ok_or_else(|| {
        anyhow::anyhow!("{} answered a manifest without its files: is it a ztserve model URL?", model.url())
    })?;
    let base = model.url().path().split("/models/").next().unwrap_or("").to_owned();
    let mut sources = Vec::with_capacity(files.len());
    for file in files {
        let (Some(name), Some(path)) = (file["name"].as_str(), file["url"].as_str()) else {
            bail!("{} lists a file without its name and URL: {file}", model.url());
        };
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            bail!("{} lists a file named {name:?}, which is not a plain file name", model.url());
        }
        let mut url = model.url().clone();
        url.set_path(&format!("{base}{path}"));
        let remote = model.with_url(url);
        let probe = remote.probe(HEADER_LEN).await?;
        sources.push(SourceFile { name: name.to_owned(), remote, etag: probe.etag, len: probe.len, head: probe.head });
    }
    Ok((sources, container))
}

/// The root file's parsed manifest, from at most two more ranged GETs (its head came with the
/// probe).
async fn fetch_manifest(root: &SourceFile, limits: &Limits) -> anyhow::Result<Manifest> {
    let reads = ManifestReads::new(root.len, MAX_TRAILER_LEN);
    let etag = root.etag.as_str();
    let fetch = |range: std::ops::Range<u64>| async move {
        if range.is_empty() { Ok(Default::default()) } else { root.remote.range(range, etag).await }
    };
    let tail = fetch(reads.tail()).await?;
    let invalid = || format!("{} is not a valid .zt file", root.remote.url());
    let located = reads.locate(&root.head, &tail, limits).with_context(invalid)?;
    let missing = fetch(located.missing.clone()).await?;
    located.parse(&tail, &missing, limits).with_context(invalid)
}

/// A safetensors model's manifest: each file's header (one ranged GET, a second for a header
/// longer than the first read), and for a checkpoint its index, assembled as the server does.
async fn fetch_checkpoint(sources: &[SourceFile]) -> anyhow::Result<Manifest> {
    let root = &sources[0];
    if FileKind::of(&root.name) != Some(FileKind::SafetensorsIndex) {
        return fetch_header(root).await;
    }
    if root.len > format::safetensors::MAX_INDEX_LEN {
        bail!("{} is {} bytes, over the index limit", root.remote.url(), root.len);
    }
    let index = format::safetensors::parse_index(&root.remote.range(0..root.len, &root.etag).await?)
        .with_context(|| format!("{} is not a valid safetensors index", root.remote.url()))?;
    let mut shards = Vec::with_capacity(index.shards.len());
    for name in &index.shards {
        let file = sources[1..]
            .iter()
            .find(|f| f.name == *name)
            .ok_or_else(|| anyhow::anyhow!("the served model does not list the shard {name:?} its index names"))?;
        shards.push((name.as_str(), fetch_header(file).await?));
    }
    let borrowed: Vec<(&str, &Manifest)> = shards.iter().map(|(name, m)| (*name, m)).collect();
    Ok(format::safetensors::assemble(&index, root.len, &borrowed)?)
}

/// A GGUF model's manifest: each file's header (a prefix, grown while the header runs past
/// it), assembled as the server does for a split model.
async fn fetch_gguf(sources: &[SourceFile]) -> anyhow::Result<Manifest> {
    let mut headers = Vec::with_capacity(sources.len());
    for file in sources {
        let invalid = || format!("{} is not a valid GGUF file", file.remote.url());
        let reads = format::gguf::HeaderReads { file_len: file.len };
        let mut held = file.remote.range(reads.first(64 << 10), &file.etag).await?;
        let header = loop {
            match reads.step(&held).with_context(invalid)? {
                Ok(header) => break header,
                Err(next) => {
                    held = [held.as_ref(), file.remote.range(next, &file.etag).await?.as_ref()].concat().into()
                }
            }
        };
        headers.push((file.name.clone(), header, file.len));
    }
    Ok(format::gguf::manifest_of(headers)?)
}

/// A safetensors file's header as a manifest.
async fn fetch_header(file: &SourceFile) -> anyhow::Result<Manifest> {
    let reads = format::safetensors::HeaderReads::new(file.len, 64 << 10);
    let invalid = || format!("{} is not a valid safetensors file", file.remote.url());
    let first = file.remote.range(reads.first(), &file.etag).await?;
    let (_, missing) = reads.locate(&first).with_context(invalid)?;
    let missing = if missing.is_empty() { Default::default() } else { file.remote.range(missing, &file.etag).await? };
    reads.parse(&first, &missing).and_then(|h| h.into_manifest(file.len)).with_context(invalid)
}
