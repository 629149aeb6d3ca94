//! What a pull has already written, so a second run after an interruption fetches only what is
//! missing. Beside the partial output lives a journal: one JSON line naming what is being
//! pulled (server URL, the file's ETag, the output's layout), then one `START END` line per
//! byte range of the output written in full, and now and then `sync N`: the partial output was
//! fsynced after the first N range lines were written. Only ranges under a `sync` are trusted,
//! so after a power cut a range whose bytes never reached the disk is fetched again rather
//! than kept as zeros (blobs without a digest could not tell). A journal for anything else
//! (another version, another selection) is discarded, not trusted.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// What a partial output is a part of. Two pulls may share a partial only when all of it
/// is equal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub url: String,
    pub etag: String,
    pub source_len: u64,
    pub raw: bool,
    /// SHA-256 of the output's layout (its offsets and manifest), in hex.
    pub layout: String,
    pub output_len: u64,
}

/// The partial output's journal.
pub struct Journal {
    file: File,
    done: Vec<Range<u64>>,
    /// Range lines in the file, and how many of them a `sync` line covers.
    lines: u64,
    durable: u64,
    /// The partial output, synced before the journal is closed (see `Drop`).
    data: Option<Arc<File>>,
}

/// The partial output beside `output`, and its journal.
pub fn partial_paths(output: &Path) -> (PathBuf, PathBuf) {
    let name = output.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "output".into());
    let dir = output.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    (dir.join(format!(".{name}.ztserve-pull")), dir.join(format!(".{name}.ztserve-pull.journal")))
}

impl Journal {
    /// Opens the journal at `path` when it belongs to `identity`, keeping what it records;
    /// otherwise starts a new one. Returns whether anything was kept.
    pub fn open(path: &Path, identity: &Identity) -> anyhow::Result<(Journal, bool)> {
        let done = read(path, identity)?.unwrap_or_default();
        // Rewritten with only what is trusted: lines this run appends are numbered after these,
        // so a `sync` of this run never vouches for an untrusted line of the last one.
        let scratch = path.with_extension("rewrite");
        let mut file = File::create(&scratch)?;
        writeln!(file, "{}", serde_json::to_string(identity)?)?;
        for range in &done {
            writeln!(file, "{} {}", range.start, range.end)?;
        }
        let lines = done.len() as u64;
        writeln!(file, "sync {lines}")?;
        std::fs::rename(&scratch, path)?;
        let kept = !done.is_empty();
        Ok((Journal { file, done, lines, durable: lines, data: None }, kept))
    }

    /// The partial output the journal describes: `Drop` syncs it before its last `sync` line.
    pub fn describe(&mut self, data: Arc<File>) {
        self.data = Some(data);
    }

    /// Whether every byte of `range` was written by an earlier run or this one.
    pub fn covers(&self, range: &Range<u64>) -> bool {
        let at = self.done.partition_point(|r| r.end <= range.start);
        self.done.get(at).is_some_and(|r| r.start <= range.start && range.end <= r.end)
    }

    /// The parts of `range` not yet written, in order.
    pub fn missing(&self, range: &Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut at = range.start;
        for done in &self.done[self.done.partition_point(|r| r.end <= range.start)..] {
            if done.start >= range.end {
                break;
            }
            if done.start > at {
                out.push(at..done.start);
            }
            at = at.max(done.end);
        }
        if at < range.end {
            out.push(at..range.end);
        }
        out
    }

    /// Records `range` as written (trusted by later runs once a `sync` covers it).
    pub fn record(&mut self, range: Range<u64>) -> std::io::Result<()> {
        writeln!(self.file, "{} {}", range.start, range.end)?;
        self.lines += 1;
        let at = self.done.partition_point(|r| r.start < range.start);
        self.done.insert(at, range);
        self.done = merged(std::mem::take(&mut self.done));
        Ok(())
    }

    /// How many range lines are written: a sync of the data started now covers them.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// Notes that the partial output was synced after the first `lines` range lines.
    pub fn synced(&mut self, lines: u64) -> std::io::Result<()> {
        if lines > self.durable {
            writeln!(self.file, "sync {lines}")?;
            self.durable = lines;
        }
        Ok(())
    }

    /// Forgets `range` (its bytes failed their digest): later runs fetch it again.
    pub fn forget(&mut self, range: &Range<u64>) -> std::io::Result<()> {
        writeln!(self.file, "-{} {}", range.start, range.end)?;
        self.done = subtract(std::mem::take(&mut self.done), range);
        Ok(())
    }
}

impl Drop for Journal {
    /// An interrupted pull (an error, Ctrl-C) keeps everything it wrote: the data is synced,
    /// then a last `sync` line vouches for every range.
    fn drop(&mut self) {
        if let Some(data) = &self.data {
            if self.lines > self.durable && data.sync_data().is_ok() {
                let _ = self.synced(self.lines);
            }
        }
    }
}

/// The ranges recorded in the journal at `path` and covered by a `sync` line, when it exists
/// and is for `identity`.
fn read(path: &Path, identity: &Identity) -> anyhow::Result<Option<Vec<Range<u64>>>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut lines = BufReader::new(file).lines();
    let Some(Ok(first)) = lines.next() else { return Ok(None) };
    if serde_json::from_str::<Identity>(&first).ok().as_ref() != Some(identity) {
        return Ok(None);
    }
    // Each range with its line's number, so that `sync N` can vouch for the first N.
    let mut written: Vec<(u64, Range<u64>)> = Vec::new();
    let (mut lines_read, mut durable) = (0, 0);
    for line in lines {
        // A line cut short by a crash is the last one; everything before it stands.
        let Ok(line) = line else { break };
        if let Some(count) = line.strip_prefix("sync ") {
            match count.parse::<u64>() {
                Ok(n) if n <= lines_read => durable = durable.max(n),
                _ => break,
            }
            continue;
        }
        let (forget, text) = match line.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, line.as_str()),
        };
        let Some(range) = text
            .split_once(' ')
            .and_then(|(a, b)| Some(a.parse::<u64>().ok()?..b.parse::<u64>().ok()?))
            .filter(|r| r.start < r.end && r.end <= identity.output_len)
        else {
            break;
        };
        if forget {
            written = written
                .into_iter()
                .flat_map(|(n, r)| subtract(vec![r], &range).into_iter().map(move |part| (n, part)))
                .collect();
        } else {
            written.push((lines_read, range));
            lines_read += 1;
        }
    }
    Ok(Some(merged(written.into_iter().filter(|(n, _)| *n < durable).map(|(_, r)| r).collect())))
}

/// Sorted, disjoint, adjacent ranges joined.
fn merged(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match out.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => out.push(range),
        }
    }
    out
}

fn subtract(ranges: Vec<Range<u64>>, cut: &Range<u64>) -> Vec<Range<u64>> {
    let mut out = Vec::with_capacity(ranges.len() + 1);
    for r in ranges {
        if r.end <= cut.start || cut.end <= r.start {
            out.push(r);
            continue;
        }
        if r.start < cut.start {
            out.push(r.start..cut.start);
        }
        if cut.end < r.end {
            out.push(cut.end..r.end);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity {
            url: "http://h/models/m/file".into(),
            etag: "\"1\"".into(),
            source_len: 100,
            raw: false,
            layout: "ab".into(),
            output_len: 1000,
        }
    }

    /// A journal for `identity()` at `dir/j` whose lines after the identity are `body`.
    fn journal_with(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("j");
        std::fs::write(&path, format!("{}\n{body}", serde_json::to_string(&identity()).unwrap())).unwrap();
        path
    }

    #[test]
    fn a_journal_keeps_written_ranges_across_runs_and_only_for_the_same_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (mut journal, kept) = Journal::open(&path, &identity()).unwrap();
        assert!(!kept);
        journal.record(0..100).unwrap();
        journal.record(200..300).unwrap();
        journal.record(100..200).unwrap();
        journal.synced(journal.lines()).unwrap();
        journal.forget(&(250..260)).unwrap();
        drop(journal);

        let (journal, kept) = Journal::open(&path, &identity()).unwrap();
        assert!(kept);
        assert!(journal.covers(&(0..250)));
        assert!(!journal.covers(&(240..260)));
        assert!(journal.covers(&(260..300)));
        assert!(!journal.covers(&(300..301)));
        assert_eq!(journal.missing(&(0..400)), vec![250..260, 300..400]);
        assert_eq!(journal.missing(&(255..270)), vec![255..260]);
        assert_eq!(journal.missing(&(0..100)), vec![]);

        let other = Identity { etag: "\"2\"".into(), ..identity() };
        let (journal, kept) = Journal::open(&path, &other).unwrap();
        assert!(!kept);
        assert!(!journal.covers(&(0..1)));
    }

    #[test]
    fn a_line_cut_short_ends_the_journal_without_losing_earlier_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_with(dir.path(), "0 10\nsync 1\n10 2");
        let (journal, _) = Journal::open(&path, &identity()).unwrap();
        assert!(journal.covers(&(0..10)));
        assert!(!journal.covers(&(10..11)));
    }

    #[test]
    fn only_ranges_a_sync_line_covers_are_trusted_even_after_a_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        // A power cut after `20 30` was written but before any sync vouched for it.
        let path = journal_with(dir.path(), "0 10\n10 20\nsync 2\n20 30\n");
        let (mut journal, kept) = Journal::open(&path, &identity()).unwrap();
        assert!(kept);
        assert_eq!(journal.missing(&(0..40)), vec![20..40]);
        // This run's sync vouches for its own lines only, never the untrusted `20 30`.
        journal.record(30..40).unwrap();
        journal.synced(journal.lines()).unwrap();
        drop(journal);
        let (journal, _) = Journal::open(&path, &identity()).unwrap();
        assert_eq!(journal.missing(&(0..40)), vec![20..30]);
    }

    #[test]
    fn dropping_a_journal_syncs_its_data_and_vouches_for_every_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (mut journal, _) = Journal::open(&path, &identity()).unwrap();
        journal.record(0..10).unwrap();
        drop(journal);
        assert!(!Journal::open(&path, &identity()).unwrap().1, "without its data to sync, nothing is vouched for");

        let (mut journal, _) = Journal::open(&path, &identity()).unwrap();
        journal.describe(Arc::new(File::create(dir.path().join("data")).unwrap()));
        journal.record(0..10).unwrap();
        drop(journal);
        let (journal, kept) = Journal::open(&path, &identity()).unwrap();
        assert!(kept && journal.covers(&(0..10)));
    }
}
