//! `ztserve cat`: one component's decoded little-endian bytes, digest checked first, decoded
//! on one thread while another writes.

use std::io::{self, Write};
use std::path::Path;

use anyhow::{anyhow, bail};

use super::open;
use crate::format::decode::{DECODE_PIECE, decode_component, stored_bytes, verify_digest};
use crate::format::{self, DigestScope, Limits};

/// `cat`: the decoded little-endian bytes of one component, after checking its digest.
pub fn cat(
    path: &Path,
    object_name: &str,
    role: Option<&str>,
    limits: &Limits,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let opened = open(path, limits)?;
    let manifest = &opened.manifest;
    let object =
        manifest.object(object_name).ok_or_else(|| anyhow!("no object named {object_name:?} in {}", path.display()))?;
    let roles = || object.components.iter().map(|c| format!("{:?}", c.role)).collect::<Vec<_>>().join(", ");
    let component = match role {
        Some(role) => object.component(role).ok_or_else(|| {
            anyhow!("object {object_name:?} has no component {role:?}; its components are {}", roles())
        })?,
        None => match &object.components[..] {
            [only] => only,
            [] => bail!("object {object_name:?} has no components"),
            _ => bail!("object {object_name:?} has several components ({}): choose one with --component", roles()),
        },
    };
    // A component in a v2 shard is read from the shard found beside the root.
    let shard = match opened.files.get(component.file) {
        Some(_) => None,
        None => Some(super::shards_beside(path, manifest, false).swap_remove(component.file - 1)?.1),
    };
    let file = opened.files.get(component.file).or(shard.as_ref()).expect("opened or found beside");
    let stored = stored_bytes(file, &object.name, component)?;
    if component.is_verbatim() || component.digest_scope == DigestScope::Stored {
        verify_digest(&object.name, component, stored)?;
    }
    if component.is_verbatim() {
        out.write_all(stored)?;
    } else if component.digest_scope == DigestScope::Decoded && component.digest.is_some() {
        // A v2 digest covers the decoded bytes: they are checked before any is written.
        let decoded = decode_component(&object.name, component, stored)?;
        verify_digest(&object.name, component, &decoded)?;
        out.write_all(&decoded)?;
    } else {
        decode_pipelined(&object.name, component, stored, out)?;
    }
    out.flush()?;
    Ok(())
}

/// Decodes on this thread while another writes, so decoding and output overlap (as the
/// `zstd` CLI's asynchronous I/O does). Buffers circulate between the two through bounded
/// channels, so memory stays at a few pieces whatever the component's size.
fn decode_pipelined(
    object: &str,
    component: &format::Component,
    stored: &[u8],
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    const IN_FLIGHT: usize = 4;
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<(Vec<u8>, usize)>(IN_FLIGHT);
    let (empty_tx, empty_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(IN_FLIGHT);
    for _ in 0..IN_FLIGHT {
        empty_tx.send(vec![0u8; DECODE_PIECE]).expect("channel has room");
    }
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> io::Result<()> {
            for (buffer, len) in full_rx {
                out.write_all(&buffer[..len])?;
                // The decoder may have finished and dropped its receiver; nothing to recycle then.
                let _ = empty_tx.send(buffer);
            }
            Ok(())
        });
        let mut decoder = format::decode::Decoder::new(object, component)?;
        let mut input = stored;
        let decoded = loop {
            // A closed channel means the writer failed; its error is reported below.
            let Ok(mut buffer) = empty_rx.recv() else { break Ok(()) };
            let progress = match decoder.decode(input, &mut buffer) {
                Ok(p) => p,
                Err(e) => break Err(e),
            };
            input = &input[progress.consumed..];
            if progress.written > 0 && full_tx.send((buffer, progress.written)).is_err() {
                break Ok(());
            }
            if input.is_empty() && progress.written == 0 && progress.consumed == 0 {
                break decoder.finish();
            }
        };
        drop(full_tx);
        writer.join().expect("writer thread does not panic")?;
        decoded?;
        Ok(())
    })
}
