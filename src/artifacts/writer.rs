//! Where uploads are written: a thread of their own each, a publisher's at a lower priority
//! than requests, and the directory sync that makes a rename durable.

use std::fs::File;
use std::path::Path;

use super::error::{ArtifactError, io_at};

/// The niceness of the threads that write uploads: a publish is background work, and when the
/// cores are short, requests go first (as databases lower their compaction threads).
pub(super) const WRITER_NICENESS: i32 = 10;

/// Whose upload a blob is: a publisher's, which waits its turn behind requests, or the bytes
/// a reader waits for (read through from the bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Priority {
    Background,
    Reader,
}

/// Runs `write` on a thread of its own (the runtime's blocking pool serves requests, and must
/// not be held by uploads), at [`WRITER_NICENESS`] for background work.
pub(super) fn spawn_writer<T: Send + 'static>(
    priority: Priority,
    write: impl FnOnce() -> T + Send + 'static,
) -> Result<tokio::sync::oneshot::Receiver<T>, ArtifactError> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("artifact-writer".into())
        .spawn(move || {
            // A thread's niceness on Linux; raising it needs no privilege.
            let niced = priority == Priority::Background;
            if let Err(e) = niced
                .then(|| rustix::process::setpriority_process(Some(rustix::thread::gettid()), WRITER_NICENESS))
                .transpose()
            {
                tracing::debug!(error = %e, "cannot lower an artifact writer's priority");
            }
            let _ = sender.send(write());
        })
        .map_err(|e| ArtifactError::Failed(format!("cannot start a thread to write the upload: {e}")))?;
    Ok(receiver)
}

/// Makes a rename or link under `path`'s directory durable.
pub(super) fn sync_dir(path: &Path) -> Result<(), ArtifactError> {
    let dir = path.parent().expect("a file in the store");
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_at(dir))
}
