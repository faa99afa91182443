//! Savepoints in a self-contained, relocatable format (seed 000 §5.2): the
//! plan of the copy, which `tidemark_storage::savepoint` carries out. A
//! savepoint is taken like a checkpoint, into the checkpoint directory, and
//! then copied out: every state object becomes a plain object of its own in
//! `<savepoint-dir>/savepoint-<job>-<id>/`, next to a `_metadata` whose
//! references are relative to that directory. Inline bytes stay inline;
//! segments of merged files and shared incremental files are copied, so the
//! savepoint depends on nothing in the checkpoint directory, which may be
//! deleted, and the directory may be copied anywhere and restored from.
//! Savepoints are never retained checkpoints: no registry counts their
//! files and no cleanup deletes them.

use super::{stays_inside, CompletedCheckpoint, SnapshotFormat, StateHandle};
use crate::model::ids::{CheckpointId, JobId};
use thiserror::Error;

/// A reference in metadata that leaves its directory.
#[derive(Debug, Error)]
#[error("{path} references {reference:?}, which is outside its directory; nothing was read")]
pub struct EscapingReference {
    /// The metadata's location, for the message.
    pub path: String,
    /// The offending reference.
    pub reference: String,
}

/// The directory of savepoint `id` of `job`, relative to the savepoint
/// directory.
pub fn directory_name(job: JobId, id: CheckpointId) -> String {
    format!("savepoint-{:016x}-{}", job.0, id.0)
}

/// One state object to copy into the savepoint directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Copy {
    /// The object as the checkpoint references it, in the checkpoint
    /// directory.
    pub from: StateHandle,
    /// Relative to the savepoint directory.
    pub to: String,
}

/// The savepoint's metadata, self-contained, and the copies that make it
/// so: every handle that is not inline becomes an object of its own.
pub fn relocate(checkpoint: &CompletedCheckpoint) -> (CompletedCheckpoint, Vec<Copy>) {
    let mut savepoint = checkpoint.clone();
    savepoint.format = SnapshotFormat::SelfContained;
    let mut copies = Vec::new();
    for (subtask, state) in savepoint.subtasks.iter_mut() {
        for (n, handle) in state
            .handles_mut()
            .filter(|h| h.physical().is_some())
            .enumerate()
        {
            let to = format!("op-{}-{}-{n}", subtask.operator.0, subtask.index.0);
            let relocated = handle.relocated(to.clone());
            copies.push(Copy {
                from: std::mem::replace(handle, relocated),
                to,
            });
        }
    }
    (savepoint, copies)
}

/// Every reference of `checkpoint` stays inside the directory it is
/// relative to: checked before anything is read.
pub fn check_references(
    path: &str,
    checkpoint: &CompletedCheckpoint,
) -> Result<(), EscapingReference> {
    match checkpoint.objects().into_iter().find(|r| !stays_inside(r)) {
        Some(reference) => Err(EscapingReference {
            path: path.to_owned(),
            reference: reference.to_owned(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::merged;

    #[test]
    fn segments_become_objects_of_their_own_and_inline_bytes_stay() {
        let (savepoint, copies) = relocate(&merged());
        assert_eq!(savepoint.format, SnapshotFormat::SelfContained);
        assert_eq!(copies.len(), 2);
        let objects: Vec<&str> = savepoint.objects().into_iter().collect();
        assert_eq!(objects, ["op-1-0-0", "op-1-1-0"]);
        let handles: Vec<StateHandle> = savepoint
            .subtasks
            .values()
            .flat_map(|s| s.handles())
            .cloned()
            .collect();
        assert_eq!(
            handles,
            [
                StateHandle::object("op-1-0-0", 3, crate::checkpoint::checksum(b"abc")),
                StateHandle::object("op-1-1-0", 3, crate::checkpoint::checksum(b"def")),
                StateHandle::Inline(vec![7]),
            ]
        );
    }
}
