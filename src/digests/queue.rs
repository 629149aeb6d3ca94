//! The queue of digests to compute, by file identity: each one queued by urgency (a request
//! about one file, then a listing, then a scan, then a scan's image layers) and, within one,
//! in order of arrival; moved up when a more urgent asker comes, never down; shared by every
//! asker of the same file (one entry, one job); a failed one left in place and queued again
//! when asked or rescanned; what a rescan no longer lists dropped unless it is being hashed. A
//! scan's built files (which may take decoders that requests need) are hashed one at a time.
//! It also keeps what the last scan listed of each model, for progress. Pure bookkeeping: the
//! hashing is the caller's.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::FileIdentity;

/// Who wants a file's digest, most urgent first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Urgency {
    /// A request about this one file (a HEAD with a client's short timeout).
    FileAsked,
    /// A listing of a model's files (a tree, a manifest), whose clients wait longer.
    ListingAsked,
    /// A scan.
    Scheduled,
    /// A scan, for image layers: after every file's own digest, so those are known as soon
    /// as they were before images (a layer's digest is a second SHA-256 over the same bytes).
    ScheduledImageLayers,
}

/// Where a file is in the queue: by urgency, then in order of arrival.
pub(crate) type Place = (Urgency, u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Queued(Place),
    Hashing,
    Failed,
}

/// What the queue reads of a job.
pub(crate) trait QueuedJob {
    /// Bytes to hash.
    fn size(&self) -> u64;
    /// Bytes hashed so far by the computation running now.
    fn hashed(&self) -> u64;
    /// Whether the file is built rather than stored (its bytes may need decoders).
    fn built(&self) -> bool;
    /// Called when a failed job is queued again: its askers see it running.
    fn retried(&self);
}

struct Entry<J> {
    job: Arc<J>,
    state: State,
}

/// The files of one model version, as the last scan listed them: identity and size.
#[derive(Debug, Clone, Default)]
pub(crate) struct ModelFiles {
    pub version: String,
    pub files: Vec<(FileIdentity, u64)>,
}

/// How far the hashing of one model version's files is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct DigestProgress {
    /// Whether the files were listed for hashing yet (after the scan that found them).
    pub listed: bool,
    pub files: usize,
    pub known_files: usize,
    pub bytes: u64,
    pub hashed_bytes: u64,
}

impl DigestProgress {
    pub(crate) fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "files": self.files,
            "known_files": self.known_files,
            "bytes": self.bytes,
            "hashed_bytes": self.hashed_bytes,
            "complete": self.listed && self.known_files == self.files,
        })
    }

    /// The sum of two progresses (every listed model's, all together).
    pub(crate) fn and(self, other: DigestProgress) -> DigestProgress {
        DigestProgress {
            listed: self.listed && other.listed,
            files: self.files + other.files,
            known_files: self.known_files + other.known_files,
            bytes: self.bytes + other.bytes,
            hashed_bytes: self.hashed_bytes + other.hashed_bytes,
        }
    }
}

/// The queue's counts, for its gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct QueueCounts {
    pub queued: usize,
    pub hashing: usize,
    pub failed: usize,
    pub known: usize,
    /// Bytes left to hash of every file not failed.
    pub pending_bytes: u64,
}

/// The digests to compute. See the module's doc.
pub(crate) struct Queue<J> {
    entries: HashMap<FileIdentity, Entry<J>>,
    order: BTreeSet<(Place, FileIdentity)>,
    next_arrival: u64,
    /// Workers hashing now.
    pub running: usize,
    /// Built files being hashed.
    building: usize,
    models: HashMap<String, ModelFiles>,
    /// Files of the listed models whose digest is known.
    known_files: usize,
}

impl<J> Default for Queue<J> {
    fn default() -> Queue<J> {
        Queue {
            entries: HashMap::new(),
            order: BTreeSet::new(),
            next_arrival: 0,
            running: 0,
            building: 0,
            models: HashMap::new(),
            known_files: 0,
        }
    }
}

impl<J: QueuedJob> Queue<J> {
    fn place(&mut self, urgency: Urgency) -> Place {
        self.next_arrival += 1;
        (urgency, self.next_arrival)
    }

    /// Queues `key` (already an entry) at `urgency`, or moves it up to it; a failed one is
    /// queued again.
    fn enqueue(&mut self, key: FileIdentity, urgency: Urgency) {
        let current = self.entries.get(&key).map(|e| e.state);
        match current {
            Some(State::Queued(place)) if place.0 <= urgency => {}
            Some(State::Queued(place)) => {
                self.order.remove(&(place, key));
                let place = self.place(urgency);
                self.order.insert((place, key));
                self.entries.get_mut(&key).expect("present").state = State::Queued(place);
            }
            Some(State::Failed) => {
                let place = self.place(urgency);
                self.order.insert((place, key));
                let entry = self.entries.get_mut(&key).expect("present");
                entry.state = State::Queued(place);
                entry.job.retried();
            }
            Some(State::Hashing) | None => {}
        }
    }

    /// The job computing `key`, made by `make` when there is none, moved up to `urgency` (a
    /// failed one queued again): every asker of one file shares one job.
    pub(crate) fn ask(&mut self, key: FileIdentity, urgency: Urgency, make: impl FnOnce() -> J) -> Arc<J> {
        // Entered as failed, so that `enqueue` queues it like a file to retry.
        self.entries.entry(key).or_insert_with(|| Entry { job: Arc::new(make()), state: State::Failed });
        self.enqueue(key, urgency);
        Arc::clone(&self.entries[&key].job)
    }

    /// After a scan: drops every entry `keep` does not hold (but those being hashed), then asks
    /// for each of `wanted` at its urgency (a job already entered takes the new one's input
    /// through `refresh`; a failed one is queued again), and keeps `models`, the scan's
    /// listing, and `known_files`, how many of their files' digests are known.
    pub(crate) fn reschedule(
        &mut self,
        keep: &HashSet<FileIdentity>,
        wanted: Vec<(FileIdentity, J, Urgency)>,
        refresh: impl Fn(&J, J),
        models: HashMap<String, ModelFiles>,
        known_files: usize,
    ) {
        let gone: Vec<FileIdentity> = self
            .entries
            .iter()
            .filter(|(key, entry)| !keep.contains(*key) && entry.state != State::Hashing)
            .map(|(key, _)| *key)
            .collect();
        for key in gone {
            if let Some(Entry { state: State::Queued(place), .. }) = self.entries.remove(&key) {
                self.order.remove(&(place, key));
            }
        }
        for (key, job, urgency) in wanted {
            match self.entries.get(&key) {
                Some(entry) => refresh(&entry.job, job),
                None => drop(self.entries.insert(key, Entry { job: Arc::new(job), state: State::Failed })),
            }
            self.enqueue(key, urgency);
        }
        self.models = models;
        self.known_files = known_files;
    }

    /// The next file to hash, now marked hashing: the first in order, passing over a scan's
    /// built files while one is being hashed, so background hashing never holds every decoder
    /// a request could need.
    pub(crate) fn pop(&mut self) -> Option<(FileIdentity, Arc<J>)> {
        let waits = |(place, key): &(Place, FileIdentity)| {
            place.0 >= Urgency::Scheduled && self.building > 0 && self.entries[key].job.built()
        };
        let next = *self.order.iter().find(|queued| !waits(queued))?;
        self.order.remove(&next);
        let entry = self.entries.get_mut(&next.1).expect("every queued file has an entry");
        entry.state = State::Hashing;
        self.building += usize::from(entry.job.built());
        Some((next.1, Arc::clone(&entry.job)))
    }

    /// Ends the hashing of `job`, for the counts of what runs.
    pub(crate) fn finished(&mut self, job: &J) {
        self.building -= usize::from(job.built());
    }

    /// `key`'s digest is known: its entry leaves the queue; `a_file` counts it as a file (an
    /// image layer is a second digest of one).
    pub(crate) fn known(&mut self, key: FileIdentity, a_file: bool) {
        self.entries.remove(&key);
        self.known_files += usize::from(a_file);
    }

    /// Computing `key`'s digest failed: it stays, to be queued again when asked or rescanned.
    pub(crate) fn failed(&mut self, key: FileIdentity) {
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.state = State::Failed;
        }
    }

    /// Whether a job computes `key`'s digest.
    pub(crate) fn holds(&self, key: FileIdentity) -> bool {
        self.entries.contains_key(&key)
    }

    /// Bytes left to hash before the last of `pending` is known: everything being hashed and
    /// everything queued up to the last of them; when all of them are being hashed, what is
    /// left of each.
    pub(crate) fn remaining_through(&self, pending: &[(FileIdentity, Arc<J>)]) -> u64 {
        let left = |job: &J| job.size().saturating_sub(job.hashed());
        let last = pending.iter().filter_map(|(key, _)| match self.entries.get(key)?.state {
            State::Queued(place) => Some(place),
            _ => None,
        });
        match last.max() {
            Some(last) => self
                .entries
                .values()
                .filter(|e| match e.state {
                    State::Hashing => true,
                    State::Queued(place) => place <= last,
                    State::Failed => false,
                })
                .map(|e| left(&e.job))
                .sum(),
            None => pending.iter().map(|(_, job)| left(job)).sum(),
        }
    }

    /// How far the hashing of model `id` at `version` is, as the last scan listed it (nothing
    /// known of another version); `known` says which digests are.
    pub(crate) fn progress(&self, id: &str, version: &str, known: impl Fn(FileIdentity) -> bool) -> DigestProgress {
        let Some(listed) = self.models.get(id).filter(|m| m.version == version) else {
            return DigestProgress::default();
        };
        let mut progress = DigestProgress { listed: true, files: listed.files.len(), ..DigestProgress::default() };
        for (key, size) in &listed.files {
            progress.bytes += size;
            match self.entries.get(key) {
                Some(entry) if entry.state == State::Hashing => {
                    progress.hashed_bytes += entry.job.hashed().min(*size);
                }
                Some(_) => {}
                None if known(*key) => {
                    progress.known_files += 1;
                    progress.hashed_bytes += size;
                }
                None => {}
            }
        }
        progress
    }

    /// The counts of the queue, for its gauges.
    pub(crate) fn counts(&self) -> QueueCounts {
        let mut counts = QueueCounts { known: self.known_files, ..QueueCounts::default() };
        for entry in self.entries.values() {
            match entry.state {
                State::Queued(_) => counts.queued += 1,
                State::Hashing => counts.hashing += 1,
                State::Failed => counts.failed += 1,
            }
            if entry.state != State::Failed {
                counts.pending_bytes += entry.job.size().saturating_sub(entry.job.hashed());
            }
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    /// A job as the queue sees it.
    #[derive(Default)]
    struct TestJob {
        size: u64,
        hashed: AtomicU64,
        built: bool,
        retries: AtomicUsize,
        input: Mutex<&'static str>,
    }

    impl QueuedJob for TestJob {
        fn size(&self) -> u64 {
            self.size
        }
        fn hashed(&self) -> u64 {
            self.hashed.load(Ordering::Relaxed)
        }
        fn built(&self) -> bool {
            self.built
        }
        fn retried(&self) {
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn job(size: u64) -> TestJob {
        TestJob { size, ..TestJob::default() }
    }

    fn key(n: u8) -> FileIdentity {
        [n; 16]
    }

    fn drain(queue: &mut Queue<TestJob>) -> Vec<u8> {
        let mut order = Vec::new();
        while let Some((key, job)) = queue.pop() {
            queue.finished(&job);
            order.push(key[0]);
        }
        order
    }

    #[test]
    fn the_most_urgent_asker_goes_first_and_an_asker_never_moves_a_file_down() {
        let mut queue = Queue::default();
        queue.ask(key(1), Urgency::Scheduled, || job(1));
        queue.ask(key(2), Urgency::ScheduledImageLayers, || job(1));
        queue.ask(key(3), Urgency::Scheduled, || job(1));
        queue.ask(key(4), Urgency::ListingAsked, || job(1));
        // A request about file 3 moves it to the front; a scan asking for file 4 again does not
        // move it back.
        queue.ask(key(3), Urgency::FileAsked, || unreachable!("one job per file"));
        queue.ask(key(4), Urgency::Scheduled, || unreachable!("one job per file"));
        assert_eq!(drain(&mut queue), [3, 4, 1, 2]);
    }

    #[test]
    fn every_asker_of_one_file_shares_its_one_job() {
        let mut queue = Queue::default();
        let first = queue.ask(key(1), Urgency::Scheduled, || job(10));
        let second = queue.ask(key(1), Urgency::FileAsked, || job(99));
        assert!(Arc::ptr_eq(&first, &second));
        let (popped, running) = queue.pop().unwrap();
        assert_eq!(popped, key(1));
        // Asked while it is hashed: the same job, not queued twice.
        assert!(Arc::ptr_eq(&queue.ask(key(1), Urgency::FileAsked, || job(1)), &running));
        assert!(queue.pop().is_none());
    }

    #[test]
    fn a_scans_built_files_are_hashed_one_at_a_time_but_an_asked_one_is_not_held_back() {
        let mut queue = Queue::default();
        queue.ask(key(1), Urgency::Scheduled, || TestJob { built: true, ..job(1) });
        queue.ask(key(2), Urgency::Scheduled, || TestJob { built: true, ..job(1) });
        queue.ask(key(3), Urgency::Scheduled, || job(1));
        let (first, first_job) = queue.pop().unwrap();
        assert_eq!(first, key(1));
        // The second built file waits for the first; the stored one passes.
        assert_eq!(queue.pop().map(|(k, _)| k), Some(key(3)));
        assert!(queue.pop().is_none());
        // A request about the waiting built file is not held back.
        queue.ask(key(2), Urgency::FileAsked, || unreachable!());
        assert_eq!(queue.pop().map(|(k, _)| k), Some(key(2)));
        queue.finished(&first_job);
    }

    #[test]
    fn a_failed_file_is_queued_again_when_asked_and_its_askers_see_it_running() {
        let mut queue = Queue::default();
        let job = queue.ask(key(1), Urgency::Scheduled, || job(1));
        queue.pop().unwrap();
        queue.failed(key(1));
        assert!(queue.pop().is_none(), "a failed file is not retried by itself");
        assert_eq!(queue.counts().failed, 1);
        let retries = job.retries.load(Ordering::Relaxed);
        queue.ask(key(1), Urgency::FileAsked, || unreachable!());
        assert_eq!(job.retries.load(Ordering::Relaxed), retries + 1);
        assert_eq!(queue.pop().map(|(k, _)| k), Some(key(1)));
        queue.known(key(1), true);
        assert!(!queue.holds(key(1)));
        assert_eq!(queue.counts(), QueueCounts { known: 1, ..QueueCounts::default() });
    }

    #[test]
    fn a_rescan_drops_what_is_no_longer_listed_but_what_is_hashed_and_refreshes_the_rest() {
        let mut queue = Queue::default();
        queue.ask(key(1), Urgency::Scheduled, || job(1));
        queue.ask(key(2), Urgency::Scheduled, || job(1));
        queue.ask(key(3), Urgency::Scheduled, || job(1));
        let (hashing, _) = queue.pop().unwrap();
        assert_eq!(hashing, key(1));
        let stays = queue.ask(key(3), Urgency::Scheduled, || unreachable!());
        // The rescan lists only file 3 (with new input) and a new file 4; file 1 is being hashed.
        let wanted = vec![
            (key(3), TestJob { input: Mutex::new("new"), ..job(1) }, Urgency::Scheduled),
            (key(4), job(1), Urgency::Scheduled),
        ];
        let refresh = |old: &TestJob, new: TestJob| *old.input.lock().unwrap() = *new.input.lock().unwrap();
        let keep: HashSet<FileIdentity> = [key(3), key(4)].into();
        queue.reschedule(&keep, wanted, refresh, HashMap::new(), 0);
        assert!(queue.holds(key(1)), "being hashed: kept until it ends");
        assert!(!queue.holds(key(2)), "no longer listed: dropped");
        assert_eq!(*stays.input.lock().unwrap(), "new", "an entered job takes the rescan's input");
        assert_eq!(drain(&mut queue), [3, 4]);
    }

    #[test]
    fn progress_counts_the_bytes_hashed_of_the_version_listed() {
        let mut queue = Queue::default();
        let model = ModelFiles { version: "v1".into(), files: vec![(key(1), 100), (key(2), 50), (key(3), 10)] };
        let wanted = vec![(key(2), job(50), Urgency::Scheduled), (key(3), job(10), Urgency::Scheduled)];
        let keep: HashSet<FileIdentity> = [key(1), key(2), key(3)].into();
        queue.reschedule(&keep, wanted, |_, _| {}, HashMap::from([("m".to_owned(), model)]), 1);
        let (_, hashing) = queue.pop().unwrap();
        hashing.hashed.store(20, Ordering::Relaxed);
        let known = |k: FileIdentity| k == key(1);
        let progress = queue.progress("m", "v1", known);
        assert_eq!(progress, DigestProgress { listed: true, files: 3, known_files: 1, bytes: 160, hashed_bytes: 120 });
        assert_eq!(queue.progress("m", "v2", known), DigestProgress::default(), "another version");
        // What is left before file 3 is known: the rest of file 2 (hashing) and file 3.
        let pending = vec![(key(3), queue.ask(key(3), Urgency::Scheduled, || unreachable!()))];
        assert_eq!(queue.remaining_through(&pending), 30 + 10);
        assert_eq!(queue.counts().pending_bytes, 40);
    }
}
