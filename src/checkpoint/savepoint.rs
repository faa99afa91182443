//! Savepoints in a self-contained, relocatable format (seed 000 §5.2). A
//! savepoint is taken like a checkpoint, into the checkpoint directory, and
//! then copied out: every state object becomes a plain object of its own in
//! `<savepoint-dir>/savepoint-<job>-<id>/`, next to a `_metadata` whose
//! references are relative to that directory. Inline bytes stay inline;
//! segments of merged files and shared incremental files are copied, so the
//! savepoint depends on nothing in the checkpoint directory, which may be
//! deleted, and the directory may be copied anywhere and restored from.
//! Savepoints are never retained checkpoints: no registry counts their
//! files and no cleanup deletes them.

use super::storage::{check_relative, CheckpointStorage, ReadError, StorageError, METADATA};
use super::{CompletedCheckpoint, SnapshotFormat, StateHandle};
use crate::ids::{CheckpointId, JobId};
use futures::stream::{self, StreamExt, TryStreamExt};
use thiserror::Error;

/// Objects copied at once.
const PARALLEL_COPIES: usize = 4;

#[derive(Debug, Error)]
pub enum SavepointError {
    #[error("{0} already holds a savepoint; nothing was written")]
    Exists(String),
    #[error("{0} is not a savepoint or checkpoint directory: it holds no {METADATA}")]
    NoMetadata(String),
    #[error("{0} is a checkpoint whose references are relative to its job's checkpoint directory, not a self-contained savepoint; restore it as <checkpoint dir>/<job>/chk-N")]
    NotSelfContained(String),
    #[error("{path} references {reference:?}, which is outside its directory; nothing was read")]
    EscapingReference { path: String, reference: String },
    #[error("{path}: {source}")]
    Read { path: String, source: ReadError },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// The directory of savepoint `id` of `job`, relative to the savepoint
/// directory.
pub fn directory_name(job: JobId, id: CheckpointId) -> String {
    format!("savepoint-{:016x}-{}", job.0, id.0)
}

/// One state object to copy into the savepoint directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Copy {
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
            let relocated = StateHandle::object(to.clone(), handle.size());
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
) -> Result<(), SavepointError> {
    for reference in checkpoint.objects() {
        check_relative(reference).map_err(|_| SavepointError::EscapingReference {
            path: path.to_owned(),
            reference: reference.to_owned(),
        })?;
    }
    Ok(())
}

/// Copies savepoint `checkpoint` out of checkpoint storage `source` into
/// its own directory under `target` and writes its `_metadata` last.
/// Returns the savepoint's location and metadata.
pub async fn write(
    source: &CheckpointStorage,
    target: &CheckpointStorage,
    job: JobId,
    checkpoint: &CompletedCheckpoint,
) -> Result<(String, CompletedCheckpoint), SavepointError> {
    let dir = target.subdirectory(&directory_name(job, checkpoint.id))?;
    let location = dir.directory();
    match dir.get(METADATA).await {
        Ok(_) => return Err(SavepointError::Exists(location)),
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e.into()),
    }
    let (savepoint, copies) = relocate(checkpoint);
    stream::iter(copies)
        .map(|copy| {
            let dir = &dir;
            async move {
                let bytes =
                    source
                        .read_handle(&copy.from)
                        .await
                        .map_err(|e| SavepointError::Read {
                            path: source.location(copy.from.physical().unwrap_or_default()),
                            source: e,
                        })?;
                dir.put(&copy.to, bytes).await?;
                Ok::<_, SavepointError>(())
            }
        })
        .buffer_unordered(PARALLEL_COPIES)
        .try_collect::<()>()
        .await?;
    dir.write_metadata_at(METADATA, &savepoint).await?;
    Ok((location, savepoint))
}

/// Opens the savepoint directory `url` and reads its metadata, refusing
/// anything but a self-contained snapshot whose references stay inside it.
/// Nothing but `_metadata` is read, and nothing is written.
pub async fn open(url: &str) -> Result<(CheckpointStorage, CompletedCheckpoint), SavepointError> {
    let dir = CheckpointStorage::open_directory(url, false)?;
    let location = dir.directory();
    let checkpoint = match dir.read_metadata_at(METADATA).await {
        Err(e) if e.is_not_found() => return Err(SavepointError::NoMetadata(location)),
        other => other?,
    };
    if checkpoint.format != SnapshotFormat::SelfContained {
        return Err(SavepointError::NotSelfContained(location));
    }
    check_references(&location, &checkpoint)?;
    Ok((dir, checkpoint))
}
