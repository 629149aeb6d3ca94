//! `ztserve pull URL OUT`: copies a model from a ztserve server to local disk. The model's
//! manifest JSON lists its stored files (one, a v2 root and its shards, or a safetensors index
//! and its shards); the root file's own manifest (a safetensors file's header, each shard's
//! and the index for a checkpoint) is fetched by range from `/models/{m}/files/{name}` and
//! parsed by [`crate::format`]. The output is then either the stored files byte for byte
//! (`--raw`: the file, or a directory of every file for a model stored in several), or one file
//! rebuilt from the selected objects, their stored blobs copied as they are (so zstd frames and
//! seekable streams travel compressed and keep their digests): a 1.2 file from a 0.1 or 1.x
//! model, a single-file v2 file (shards merged) from a v2 or safetensors model. Bytes arrive by
//! parallel ranged GETs each bound to its file's ETag ([`remote`]), land in a partial file
//! beside the output, are recorded in a journal ([`journal`]) so an interrupted pull resumes,
//! and are checked against every declared digest (over the bytes it covers) before the partial
//! file is renamed into place.

pub mod journal;
pub mod remote;

use std::io::IsTerminal;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::StreamExt;
use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::Digest as _;

use crate::format::decode::{Hasher, decode_component, verify_digest};
use crate::format::write::{StoredComponent, StoredObject, plan};
use crate::format::{
    self, Digest, Encoding, FileKind, HEADER_LEN, Limits, MAX_TRAILER_LEN, Manifest, ManifestReads, V1_MAGIC,
};
use journal::{Identity, Journal};
use remote::{Remote, RetryPolicy};

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

/// One GET's worth of copying: source bytes to their place in the output.
#[derive(Debug, Clone)]
struct Job {
    source: Range<u64>,
    output: Range<u64>,
    /// The component it belongs to, for digest checks once all of its jobs are done.
    unit: usize,
}

/// A span of the output checked as a whole once written: a component's blob (against its
/// digest when it has one) or, for legacy big-endian data, a blob decoded after download.
#[derive(Debug, Clone)]
struct Unit {
    label: String,
    output: Range<u64>,
    /// Which of the model's files the source bytes are in, and where.
    file: usize,
    source: Range<u64>,
    digest: Option<Digest>,
    /// Set (object name, component) for an encoded v2 part, whose digest covers its decoded
    /// bytes: it is decoded to be checked.
    decoded_check: Option<(String, format::Component)>,
    /// Set (object name, component) for blobs whose stored bytes must be decoded before they
    /// are written.
    transform: Option<(String, format::Component)>,
    /// False for the spans of a raw copy between blobs (header, padding, manifest).
    is_component: bool,
}

/// What to write: the layout, the units to fill, and the bytes the pull writes itself.
struct Layout {
    output_len: u64,
    units: Vec<Unit>,
    /// (offset, bytes) written locally: the header magic and the tail.
    local: Vec<(u64, Vec<u8>)>,
    objects: usize,
    fingerprint: String,
}

/// Pulls a model; see the module docs.
pub async fn pull(options: &PullOptions) -> anyhow::Result<PullReport> {
    if options.concurrency == 0 || options.chunk_bytes == 0 {
        bail!("--concurrency and --chunk-size must be above 0");
    }
    let model = Remote::new(model_url(&options.url)?, options.token.clone(), options.retry, options.concurrency)?;
    let (sources, safetensors) = source_files(&model).await?;
    let manifest = if safetensors {
        fetch_checkpoint(&sources).await?
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
            // A v2 shard is held to the root's shard table; a checkpoint's files are copied
            // as they are, each then parsed as what its name says it is.
            let (layout, check) = match index {
                _ if safetensors => (raw_layout(&manifest, index, file.len, options)?, FileKind::of(&file.name)),
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
    } else if matches!(manifest.container, format::Container::V2 | format::Container::Safetensors) {
        (rebuilt_v2_layout(&manifest, options)?, Some(FileKind::Zt))
    } else {
        (rebuilt_layout(&manifest, options)?, Some(FileKind::Zt))
    };
    transfer(&sources, &layout, &options.output, options, check).await
}

/// The model's stored files, from its manifest JSON, each probed for its ETag and length, and
/// whether the model is stored as safetensors.
async fn source_files(model: &Remote) -> anyhow::Result<(Vec<SourceFile>, bool)> {
    let listing = model.json().await?;
    let safetensors = listing["container"] == format::Container::Safetensors.id();
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
    Ok((sources, safetensors))
}

/// Fetches a layout's bytes into a partial file beside `output`, journaled, checks them, and
/// renames it into place (after checking it parses as the kind of file `check` names).
async fn transfer(
    sources: &[SourceFile],
    layout: &Layout,
    output: &std::path::Path,
    options: &PullOptions,
    check: Option<FileKind>,
) -> anyhow::Result<PullReport> {
    let (partial_path, journal_path) = journal::partial_paths(output);
    let identity = Identity {
        url: sources.iter().map(|f| f.remote.url().as_str()).collect::<Vec<_>>().join(" "),
        etag: sources.iter().map(|f| f.etag.as_str()).collect::<Vec<_>>().join(" "),
        source_len: sources.iter().map(|f| f.len).sum(),
        raw: options.raw,
        layout: layout.fingerprint.clone(),
        output_len: layout.output_len,
    };

    let (mut journal, kept) =
        Journal::open(&journal_path, &identity).with_context(|| format!("cannot open {}", journal_path.display()))?;
    let partial = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(!kept)
        .open(&partial_path)
        .with_context(|| format!("cannot write {}", partial_path.display()))?;
    if kept && partial.metadata()?.len() != layout.output_len {
        bail!(
            "{} does not have the length its journal implies; delete it and {} to start over",
            partial_path.display(),
            journal_path.display()
        );
    }
    partial.set_len(layout.output_len)?;
    let partial = Arc::new(partial);
    journal.describe(Arc::clone(&partial));

    let progress =
        ProgressDisplay::new(options.progress, layout.units.iter().map(|u| u.output.end - u.output.start).sum());
    let mut report = PullReport {
        output_len: layout.output_len,
        fetched: 0,
        resumed: 0,
        objects: layout.objects,
        components: layout.units.iter().filter(|u| u.is_component).count(),
        digests_verified: 0,
        unverified: layout.units.iter().filter(|u| u.is_component && u.digest.is_none()).count(),
    };
    let mut jobs = Vec::new();
    let mut pending: Vec<usize> = vec![0; layout.units.len()];
    for (index, unit) in layout.units.iter().enumerate() {
        let unit_jobs = unit_jobs(index, unit, &journal, options.chunk_bytes);
        let missing: u64 = unit_jobs.iter().map(|j| j.output.end - j.output.start).sum();
        let kept = (unit.output.end - unit.output.start) - missing;
        report.resumed += kept;
        progress.advance(kept);
        pending[index] = unit_jobs.len();
        jobs.extend(unit_jobs);
    }

    let outcome =
        copy_and_verify(sources, layout, jobs, pending, &partial, &mut journal, &progress, options, &mut report).await;
    progress.finish();
    if let Err(e) = outcome {
        return Err(e.context(format!(
            "pull stopped; {} of {} are kept in {} and a second run fetches only the rest",
            HumanBytes(report.fetched + report.resumed),
            HumanBytes(layout.output_len),
            partial_path.display()
        )));
    }
    // Units kept from an earlier run were verified above with the rest; now the local bytes.
    for (offset, bytes) in &layout.local {
        partial.write_all_at(bytes, *offset)?;
    }
    partial.sync_all()?;
    journal.synced(journal.lines())?;
    if let Some(kind) = check {
        let bytes = crate::storage::mapped::MappedFile::open(&partial_path)?;
        let parsed = match kind {
            FileKind::Zt => format::parse_file(&bytes, &options.limits).map(drop),
            FileKind::Safetensors => format::safetensors::parse_file(&bytes).map(drop),
            FileKind::SafetensorsIndex => format::safetensors::parse_index(&bytes).map(drop),
        };
        parsed.context("the pulled file does not parse; it was not moved into place")?;
    }
    std::fs::rename(&partial_path, output)
        .with_context(|| format!("cannot move the pulled file to {}", output.display()))?;
    if let Some(dir) = output.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    std::fs::remove_file(&journal_path).ok();
    Ok(report)
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

/// A safetensors file's header as a manifest.
async fn fetch_header(file: &SourceFile) -> anyhow::Result<Manifest> {
    let reads = format::safetensors::HeaderReads::new(file.len, 64 << 10);
    let invalid = || format!("{} is not a valid safetensors file", file.remote.url());
    let first = file.remote.range(reads.first(), &file.etag).await?;
    let (_, missing) = reads.locate(&first).with_context(invalid)?;
    let missing = if missing.is_empty() { Default::default() } else { file.remote.range(missing, &file.etag).await? };
    reads.parse(&first, &missing).and_then(|h| h.into_manifest(file.len)).with_context(invalid)
}

/// Compiles `--objects` patterns; `*` matches `/` too, since object names are not paths.
fn selector(patterns: &[String]) -> anyhow::Result<Option<globset::GlobSet>> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut set = globset::GlobSetBuilder::new();
    for pattern in patterns {
        set.add(
            globset::GlobBuilder::new(pattern)
                .literal_separator(false)
                .build()
                .with_context(|| format!("--objects {pattern:?}"))?,
        );
    }
    Ok(Some(set.build()?))
}

fn label(object: &format::Object, component: &format::Component) -> String {
    format!("{:?}.{:?}", object.name, component.role)
}

/// `--raw`: the output is the model's file `file`; each of its components' blobs is a unit, so
/// its digest is checked.
fn raw_layout(manifest: &Manifest, file: usize, source_len: u64, options: &PullOptions) -> anyhow::Result<Layout> {
    if !options.objects.is_empty() {
        bail!("--objects selects objects for a rebuilt file; --raw copies the whole stored file");
    }
    let mut units = Vec::new();
    let mut covered = 0u64;
    // The file's own blobs; those in other files are copied with theirs.
    let mut blobs: Vec<(&format::Object, &format::Component)> = manifest
        .objects
        .iter()
        .flat_map(|o| o.components.iter().map(move |c| (o, c)))
        .filter(|(_, c)| c.file == file)
        .collect();
    blobs.sort_by_key(|(_, c)| c.offset);
    for (object, component) in blobs {
        let blob = component.offset..component.offset + component.stored_length;
        // Bytes between blobs (header, padding) and zero-length blobs sharing an offset.
        if covered < blob.start {
            units.push(Unit {
                label: "padding".into(),
                output: covered..blob.start,
                file,
                source: covered..blob.start,
                digest: None,
                decoded_check: None,
                transform: None,
                is_component: false,
            });
        }
        if !blob.is_empty() && blob.start >= covered {
            units.push(Unit {
                label: label(object, component),
                output: blob.clone(),
                file,
                source: blob.clone(),
                digest: checkable_digest(component),
                decoded_check: decoded_check(object, component),
                transform: None,
                is_component: true,
            });
            covered = blob.end;
        }
    }
    units.push(Unit {
        label: "manifest".into(),
        output: covered..source_len,
        file,
        source: covered..source_len,
        digest: None,
        decoded_check: None,
        transform: None,
        is_component: false,
    });
    units.retain(|u| !u.output.is_empty());
    let objects = manifest.objects.len();
    Ok(Layout { output_len: source_len, units, local: Vec::new(), objects, fingerprint: "raw".into() })
}

/// A digest this pull can check (one of an algorithm it computes, over bytes it can produce).
fn checkable_digest(component: &format::Component) -> Option<Digest> {
    component.digest.clone().filter(|d| d.is_verifiable() && component.encoding.is_known())
}

/// For an encoded v2 part, whose digest covers its decoded bytes: what decodes it.
fn decoded_check(object: &format::Object, component: &format::Component) -> Option<(String, format::Component)> {
    (component.digest_scope == format::DigestScope::Decoded && component.encoding != Encoding::Raw)
        .then(|| (object.name.clone(), component.clone()))
}

/// `--raw` of a shard: the whole file, checked against the root's shard table (its size by
/// the probe, its whole-file digest here).
fn shard_layout(shard: &format::Shard, len: u64, file: usize) -> Layout {
    let unit = Unit {
        label: format!("shard {:?}", shard.name),
        output: 0..len,
        file,
        source: 0..len,
        digest: Some(shard.digest.clone()),
        decoded_check: None,
        transform: None,
        is_component: false,
    };
    let fingerprint = format!("shard {} {} {}", shard.name, shard.size, shard.digest);
    Layout { output_len: len, units: vec![unit], local: Vec::new(), objects: 0, fingerprint }
}

/// A single-file v2 file of the selected objects of a v2 model, shards merged: each part's
/// stored bytes copied as they are (seekable streams stay seekable, digests stay true since
/// they cover decoded bytes) at 64 KiB placement, the official writer's default.
fn rebuilt_v2_layout(manifest: &Manifest, options: &PullOptions) -> anyhow::Result<Layout> {
    let select = selector(&options.objects)?;
    let chosen: Vec<&format::Object> =
        manifest.objects.iter().filter(|o| select.as_ref().is_none_or(|s| s.is_match(&o.name))).collect();
    if chosen.is_empty() {
        bail!("no object matches --objects {}", options.objects.join(" "));
    }
    let planned = format::v2::plan(&chosen, manifest.attributes.as_ref(), 64 << 10);
    let mut units: Vec<Unit> = Vec::new();
    for (object, offsets) in chosen.iter().zip(&planned.offsets) {
        for (component, &offset) in object.components.iter().zip(offsets) {
            let output = offset..offset + component.stored_length;
            // Tied weights share one blob: it is copied once.
            if output.is_empty() || units.iter().any(|u| u.output == output) {
                continue;
            }
            units.push(Unit {
                label: label(object, component),
                output,
                file: component.file,
                source: component.stored_range(),
                digest: checkable_digest(component),
                decoded_check: decoded_check(object, component),
                transform: None,
                is_component: true,
            });
        }
    }
    let mut fingerprint = sha2::Sha256::new();
    for unit in &units {
        fingerprint.update(format!("{}{:?}{:?}{:?}", unit.file, unit.output, unit.source, unit.digest));
    }
    fingerprint.update(&planned.tail);
    let output_len = planned.tail_offset + planned.tail.len() as u64;
    let local = vec![(0, format::V2_MAGIC.to_vec()), (planned.tail_offset, planned.tail)];
    Ok(Layout { output_len, units, local, objects: chosen.len(), fingerprint: hex::encode(fingerprint.finalize()) })
}

/// A 1.2 file of the selected objects, each blob copied as stored (legacy big-endian blobs are
/// decoded to little-endian, since 1.2 has no byte order).
fn rebuilt_layout(manifest: &Manifest, options: &PullOptions) -> anyhow::Result<Layout> {
    let select = selector(&options.objects)?;
    let chosen: Vec<&format::Object> =
        manifest.objects.iter().filter(|o| select.as_ref().is_none_or(|s| s.is_match(&o.name))).collect();
    if chosen.is_empty() {
        bail!("no object matches --objects {}", options.objects.join(" "));
    }
    let stored_objects: Vec<StoredObject<'_>> = chosen
        .iter()
        .map(|object| StoredObject {
            name: &object.name,
            shape: &object.shape,
            format: &object.format,
            attributes: object.attributes.clone(),
            components: object
                .components
                .iter()
                .map(|c| {
                    let swapped = c.needs_swap();
                    StoredComponent {
                        role: &c.role,
                        dtype: c.dtype,
                        logical_type: c.logical_type.as_deref(),
                        encoding: if swapped { Encoding::Raw } else { c.encoding.clone() },
                        stored_length: if swapped { c.decoded_length } else { c.stored_length },
                        decoded_length: c.decoded_length,
                        // A decoded blob's digest is computed anew, with the same algorithm.
                        digest: if swapped { None } else { c.digest.clone() },
                    }
                })
                .collect(),
        })
        .collect();
    let planned = plan(&stored_objects, manifest.attributes.clone())
        .context("the served model cannot be rewritten as a 1.2 file")?;
    let mut units = Vec::new();
    for (object, offsets) in chosen.iter().zip(&planned.offsets) {
        for (component, &offset) in object.components.iter().zip(offsets) {
            let swapped = component.needs_swap();
            let written = if swapped { component.decoded_length } else { component.stored_length };
            units.push(Unit {
                label: label(object, component),
                output: offset..offset + written,
                file: 0,
                source: component.offset..component.offset + component.stored_length,
                digest: component.digest.clone(),
                decoded_check: None,
                transform: swapped.then(|| (object.name.clone(), component.clone())),
                is_component: true,
            });
        }
    }
    units.retain(|u| !u.source.is_empty());
    let mut fingerprint = sha2::Sha256::new();
    for unit in &units {
        fingerprint.update(format!("{:?}{:?}{:?}", unit.output, unit.source, unit.digest));
    }
    fingerprint.update(&planned.tail);
    let output_len = planned.tail_offset + planned.tail.len() as u64;
    let local = vec![(0, V1_MAGIC.to_vec()), (planned.tail_offset, planned.tail)];
    Ok(Layout { output_len, units, local, objects: chosen.len(), fingerprint: hex::encode(fingerprint.finalize()) })
}

/// A unit's GETs for what the journal lacks: chunks of at most `chunk` bytes, or one GET for
/// a unit that is decoded whole (and so is either complete or fetched again).
fn unit_jobs(index: usize, unit: &Unit, journal: &Journal, chunk: u64) -> Vec<Job> {
    if unit.transform.is_some() {
        return if journal.covers(&unit.output) {
            Vec::new()
        } else {
            vec![Job { source: unit.source.clone(), output: unit.output.clone(), unit: index }]
        };
    }
    let mut jobs = Vec::new();
    for missing in journal.missing(&unit.output) {
        let mut at = missing.start;
        while at < missing.end {
            let end = missing.end.min(at.saturating_add(chunk));
            let source = unit.source.start + (at - unit.output.start);
            jobs.push(Job { source: source..source + (end - at), output: at..end, unit: index });
            at = end;
        }
    }
    jobs
}

/// Runs the GETs, writes their bytes, journals them, and checks each unit as soon as its
/// last job lands (on the blocking pool, overlapping the GETs still in flight).
#[allow(clippy::too_many_arguments)]
async fn copy_and_verify(
    sources: &[SourceFile],
    layout: &Layout,
    jobs: Vec<Job>,
    mut pending: Vec<usize>,
    partial: &Arc<std::fs::File>,
    journal: &mut Journal,
    progress: &ProgressDisplay,
    options: &PullOptions,
    report: &mut PullReport,
) -> anyhow::Result<()> {
    let units = Arc::new(layout.units.clone());
    let mut checks = tokio::task::JoinSet::new();
    let schedule_check = |checks: &mut tokio::task::JoinSet<(usize, anyhow::Result<bool>)>, index: usize| {
        let (units, partial) = (units.clone(), partial.clone());
        checks.spawn_blocking(move || (index, check_unit(&partial, &units[index])));
    };
    // Units complete from an earlier run are checked too: a partial file is not trusted just
    // because a journal says it was written.
    for (index, &count) in pending.iter().enumerate() {
        if count == 0 {
            schedule_check(&mut checks, index);
        }
    }
    let mut transfers = futures_util::stream::iter(jobs)
        .map(|job| {
            let (partial, units) = (partial.clone(), units.clone());
            let source = &sources[units[job.unit].file];
            let (remote, etag) = (source.remote.clone(), source.etag.clone());
            async move {
                let bytes = remote.range(job.source.clone(), &etag).await?;
                let fetched = bytes.len() as u64;
                let output = job.output.clone();
                tokio::task::spawn_blocking(move || {
                    let unit = &units[job.unit];
                    let written = match &unit.transform {
                        Some((object, component)) => bytes::Bytes::from(decode_blob(object, component, &bytes)?),
                        None => bytes,
                    };
                    if written.len() as u64 != output.end - output.start {
                        bail!("internal error: {} bytes for the {output:?} of {}", written.len(), unit.label);
                    }
                    partial.write_all_at(&written, output.start)?;
                    anyhow::Ok(())
                })
                .await??;
                anyhow::Ok((job, fetched))
            }
        })
        .buffer_unordered(options.concurrency);
    // The partial output is synced in the background every SYNC_EVERY or SYNC_BYTES, one sync
    // at a time, and the journal then vouches for the ranges written before it began.
    let mut syncs = tokio::task::JoinSet::new();
    let (mut last_sync, mut unsynced_bytes) = (std::time::Instant::now(), 0u64);
    let mut mismatched = Vec::new();
    let mut record_check =
        |(index, verdict): (usize, anyhow::Result<bool>), report: &mut PullReport| -> anyhow::Result<()> {
            let unit = &layout.units[index];
            if verdict.with_context(|| format!("cannot read back {}", unit.label))? {
                report.digests_verified += usize::from(unit.digest.is_some());
            } else {
                mismatched.push(index);
            }
            Ok(())
        };
    loop {
        tokio::select! {
            Some(done) = transfers.next() => {
                let (job, fetched) = done?;
                journal.record(job.output.clone()).context("cannot append to the pull's journal")?;
                unsynced_bytes += job.output.end - job.output.start;
                if syncs.is_empty() && (unsynced_bytes >= SYNC_BYTES || last_sync.elapsed() >= SYNC_EVERY) {
                    let (lines, partial) = (journal.lines(), partial.clone());
                    syncs.spawn_blocking(move || partial.sync_data().map(|()| lines));
                    (last_sync, unsynced_bytes) = (std::time::Instant::now(), 0);
                }
                report.fetched += fetched;
                progress.advance(job.output.end - job.output.start);
                pending[job.unit] -= 1;
                if pending[job.unit] == 0 {
                    schedule_check(&mut checks, job.unit);
                }
            }
            Some(checked) = checks.join_next() => record_check(checked?, report)?,
            Some(synced) = syncs.join_next() => {
                let lines = synced?.context("cannot sync the partial output")?;
                journal.synced(lines).context("cannot append to the pull's journal")?;
            }
            else => break,
        }
    }
    if !mismatched.is_empty() {
        // Forgotten, so the next run fetches these again instead of trusting them.
        for &index in &mismatched {
            journal.forget(&layout.units[index].output)?;
        }
        let names: Vec<_> = mismatched.iter().map(|&i| layout.units[i].label.as_str()).collect();
        bail!("bytes received do not match their declared digest: {}", names.join(", "));
    }
    Ok(())
}

/// Decodes a legacy big-endian blob to little-endian after checking its stored digest.
fn decode_blob(object: &str, component: &format::Component, stored: &[u8]) -> anyhow::Result<Vec<u8>> {
    verify_digest(object, component, stored)?;
    Ok(decode_component(object, component, stored)?.into_owned())
}

/// Whether a unit's bytes in the partial file match its digest (true when it has none).
fn check_unit(partial: &std::fs::File, unit: &Unit) -> anyhow::Result<bool> {
    // A decoded unit's stored digest was checked before decoding (`decode_blob`).
    let Some(digest) = unit.digest.clone().filter(|_| unit.transform.is_none()) else { return Ok(true) };
    if let Some((object, component)) = &unit.decoded_check {
        // The digest covers the decoded bytes of the stored stream just written.
        let mut stored = vec![0u8; (unit.output.end - unit.output.start) as usize];
        partial.read_exact_at(&mut stored, unit.output.start)?;
        let verdict =
            decode_component(object, component, &stored).and_then(|decoded| verify_digest(object, component, &decoded));
        return Ok(verdict.is_ok());
    }
    let mut hasher = Hasher::for_digest(&digest);
    let mut buffer = vec![0u8; 1 << 20];
    let mut at = unit.output.start;
    while at < unit.output.end {
        let n = (unit.output.end - at).min(buffer.len() as u64) as usize;
        partial.read_exact_at(&mut buffer[..n], at)?;
        hasher.update(&buffer[..n]);
        at += n as u64;
    }
    Ok(hasher.finish().as_ref() == Some(&digest))
}

/// A bar on a terminal, a line every few seconds elsewhere, or nothing.
struct ProgressDisplay {
    bar: Option<ProgressBar>,
    lines: Option<std::sync::Mutex<LineState>>,
    total: u64,
}

struct LineState {
    done: u64,
    started: Instant,
    last: Instant,
}

impl ProgressDisplay {
    fn new(mode: ProgressMode, total: u64) -> ProgressDisplay {
        let terminal = std::io::stderr().is_terminal();
        match mode {
            ProgressMode::Auto if terminal => {
                let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
                bar.set_style(
                    ProgressStyle::with_template(
                        "{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
                    )
                    .expect("the template is valid"),
                );
                ProgressDisplay { bar: Some(bar), lines: None, total }
            }
            ProgressMode::Auto | ProgressMode::Lines => {
                let now = Instant::now();
                ProgressDisplay {
                    bar: None,
                    lines: Some(std::sync::Mutex::new(LineState { done: 0, started: now, last: now })),
                    total,
                }
            }
            ProgressMode::Quiet => ProgressDisplay { bar: None, lines: None, total },
        }
    }

    fn advance(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
        if let Some(lines) = &self.lines {
            let mut state = lines.lock().expect("progress lock");
            state.done += bytes;
            if state.last.elapsed() >= Duration::from_secs(2) {
                state.last = Instant::now();
                eprintln!("{}", self.line(&state));
            }
        }
    }

    fn line(&self, state: &LineState) -> String {
        let seconds = state.started.elapsed().as_secs_f64().max(1e-3);
        let percent = if self.total == 0 { 100.0 } else { state.done as f64 * 100.0 / self.total as f64 };
        format!(
            "pull: {} of {} ({percent:.0}%), {}/s",
            HumanBytes(state.done),
            HumanBytes(self.total),
            HumanBytes((state.done as f64 / seconds) as u64)
        )
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Some(lines) = &self.lines {
            eprintln!("{}", self.line(&lines.lock().expect("progress lock")));
        }
    }
}
