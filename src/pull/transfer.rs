//! Moving the bytes: a layout's units split into ranged GETs for what the journal lacks, run
//! in parallel, written into a partial file beside the output and journaled, each unit checked
//! as soon as its last GET lands, and the file renamed into place only when all are.

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use anyhow::{Context, bail};
use futures_util::StreamExt;
use indicatif::HumanBytes;

use super::journal::{Identity, Journal};
use super::layout::{Layout, Unit};
use super::progress::ProgressDisplay;
use super::verify::{check_unit, decode_blob};
use super::{PullOptions, PullReport, SYNC_BYTES, SYNC_EVERY, SourceFile, journal};
use crate::format::{self, FileKind};

/// One GET's worth of copying: source bytes to their place in the output.
#[derive(Debug, Clone)]
pub(super) struct Job {
    pub(super) source: Range<u64>,
    pub(super) output: Range<u64>,
    /// The component it belongs to, for digest checks once all of its jobs are done.
    pub(super) unit: usize,
}

/// Fetches a layout's bytes into a partial file beside `output`, journaled, checks them, and
/// renames it into place (after checking it parses as the kind of file `check` names).
pub(super) async fn transfer(
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

    let (mut journal, partial) = open_partial(&partial_path, &journal_path, &identity, layout.output_len)?;

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
        check_parses(&partial_path, kind, &options.limits)?;
    }
    std::fs::rename(&partial_path, output)
        .with_context(|| format!("cannot move the pulled file to {}", output.display()))?;
    if let Some(dir) = output.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    std::fs::remove_file(&journal_path).ok();
    Ok(report)
}

/// The journal of `identity`'s pull and the partial file beside the output it describes:
/// both kept from an earlier run of the same pull, or started anew.
fn open_partial(
    partial_path: &std::path::Path,
    journal_path: &std::path::Path,
    identity: &Identity,
    output_len: u64,
) -> anyhow::Result<(Journal, Arc<std::fs::File>)> {
    let (mut journal, kept) =
        Journal::open(journal_path, identity).with_context(|| format!("cannot open {}", journal_path.display()))?;
    let partial = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(!kept)
        .open(partial_path)
        .with_context(|| format!("cannot write {}", partial_path.display()))?;
    if kept && partial.metadata()?.len() != output_len {
        bail!(
            "{} does not have the length its journal implies; delete it and {} to start over",
            partial_path.display(),
            journal_path.display()
        );
    }
    partial.set_len(output_len)?;
    let partial = Arc::new(partial);
    journal.describe(Arc::clone(&partial));
    Ok((journal, partial))
}

/// Whether the pulled file at `path` parses as the kind of file `kind` is.
fn check_parses(path: &std::path::Path, kind: FileKind, limits: &format::Limits) -> anyhow::Result<()> {
    let bytes = crate::storage::mapped::MappedFile::open(path)?;
    let parsed = match kind {
        FileKind::Zt => format::parse_file(&bytes, limits).map(drop),
        FileKind::Safetensors => format::safetensors::parse_file(&bytes).map(drop),
        FileKind::SafetensorsIndex => format::safetensors::parse_index(&bytes).map(drop),
        FileKind::Gguf => format::gguf::parse_file(&bytes).map(drop),
    };
    parsed.context("the pulled file does not parse; it was not moved into place")
}

/// A unit's GETs for what the journal lacks: chunks of at most `chunk` bytes, or one GET for
/// a unit that is decoded whole (and so is either complete or fetched again).
pub(super) fn unit_jobs(index: usize, unit: &Unit, journal: &Journal, chunk: u64) -> Vec<Job> {
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

/// Fetches `job`'s range of `source` and writes it (decoded, for a unit rebuilt from a blob) at
/// its place in the partial output: the job, and how many bytes were fetched.
async fn fetch_and_write(
    job: Job,
    source: &SourceFile,
    units: Arc<Vec<Unit>>,
    partial: Arc<std::fs::File>,
) -> anyhow::Result<(Job, u64)> {
    let bytes = source.remote.range(job.source.clone(), &source.etag).await?;
    let fetched = bytes.len() as u64;
    let output = job.output.clone();
    let unit = job.unit;
    tokio::task::spawn_blocking(move || {
        let unit = &units[unit];
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
    Ok((job, fetched))
}

/// Runs the GETs, writes their bytes, journals them, and checks each unit as soon as its
/// last job lands (on the blocking pool, overlapping the GETs still in flight).
#[allow(clippy::too_many_arguments)]
pub(super) async fn copy_and_verify(
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
            let source = &sources[units[job.unit].file];
            fetch_and_write(job, source, Arc::clone(&units), Arc::clone(partial))
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
    refuse_mismatched(&mismatched, layout, journal)
}

/// Fails the pull when units `mismatched` did not match their digests, after forgetting them,
/// so the next run fetches them again instead of trusting them.
fn refuse_mismatched(mismatched: &[usize], layout: &Layout, journal: &mut Journal) -> anyhow::Result<()> {
    if mismatched.is_empty() {
        return Ok(());
    }
    for &index in mismatched {
        journal.forget(&layout.units[index].output)?;
    }
    let names: Vec<_> = mismatched.iter().map(|&i| layout.units[i].label.as_str()).collect();
    bail!("bytes received do not match their declared digest: {}", names.join(", "))
}
