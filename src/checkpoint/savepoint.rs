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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::tests::checkpoint;
    use crate::checkpoint::{KeyGroupsStateHandle, KeyedStateHandle, SubtaskState};
    use crate::ids::{OperatorId, SubtaskId, SubtaskIndex};
    use bytes::Bytes;

    fn subtask(index: u32) -> SubtaskId {
        SubtaskId {
            operator: OperatorId(1),
            index: SubtaskIndex(index),
        }
    }

    /// Keyed state of two subtasks as segments of one merged file, and
    /// channel state inline.
    fn merged() -> CompletedCheckpoint {
        let mut c = checkpoint(4);
        for (index, offset) in [(0, 0), (1, 3)] {
            let state = SubtaskState {
                keyed: Some(KeyedStateHandle::KeyGroups(KeyGroupsStateHandle {
                    start_group: index * 64,
                    offsets: vec![0],
                    handle: StateHandle::Segment {
                        path: "merged/file-1".into(),
                        offset,
                        size: 3,
                    },
                })),
                ..SubtaskState::default()
            };
            c.subtasks.insert(subtask(index), state);
        }
        c.subtasks.get_mut(&subtask(1)).unwrap().channels.push(
            crate::checkpoint::ChannelStateHandle {
                side: crate::checkpoint::ChannelSide::Input,
                channel: 0,
                batches: 1,
                handle: StateHandle::Inline(vec![7]),
            },
        );
        c
    }

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
                StateHandle::object("op-1-0-0", 3),
                StateHandle::object("op-1-1-0", 3),
                StateHandle::Inline(vec![7]),
            ]
        );
    }

    #[tokio::test]
    async fn a_savepoint_holds_every_byte_and_restores_from_its_directory_alone() {
        let source = CheckpointStorage::open("memory://", JobId(9)).unwrap();
        source
            .put("merged/file-1", Bytes::from_static(b"abcdef"))
            .await
            .unwrap();
        let target = CheckpointStorage::open_directory("memory://savepoint-test", true).unwrap();
        let (location, written) = write(&source, &target, JobId(9), &merged()).await.unwrap();
        assert_eq!(
            location,
            "memory://savepoint-test/savepoint-0000000000000009-4"
        );
        source.delete("merged/file-1").await.unwrap();

        let (dir, read) = open(&location).await.unwrap();
        assert_eq!(read, written);
        let mut bytes = Vec::new();
        for state in read.subtasks.values() {
            for handle in state.handles() {
                bytes.push(dir.read_handle(handle).await.unwrap());
            }
        }
        assert_eq!(bytes, [&b"abc"[..], b"def", &[7]]);

        let again = write(&source, &target, JobId(9), &merged()).await;
        assert!(matches!(again, Err(SavepointError::Exists(_))), "{again:?}");
    }

    #[tokio::test]
    async fn a_checkpoint_or_nothing_is_not_a_savepoint() {
        let dir = CheckpointStorage::open_directory("memory://not-a-savepoint", true).unwrap();
        let missing = open("memory://not-a-savepoint").await;
        assert!(matches!(missing, Err(SavepointError::NoMetadata(_))));
        dir.write_metadata_at(METADATA, &merged()).await.unwrap();
        let checkpoint = open("memory://not-a-savepoint").await;
        assert!(
            matches!(checkpoint, Err(SavepointError::NotSelfContained(_))),
            "{checkpoint:?}"
        );
    }
}
