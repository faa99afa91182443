//! Carries out the savepoint plan of [`tidemark_core::checkpoint::savepoint`]: copies
//! a savepoint out of checkpoint storage into its own directory, and opens
//! one for a restore.

use super::{CheckpointStorage, ReadError, StorageError, METADATA};
use futures::stream::{self, StreamExt, TryStreamExt};
use thiserror::Error;
use tidemark_core::checkpoint::savepoint::{
    check_references, directory_name, relocate, EscapingReference,
};
use tidemark_core::checkpoint::{CompletedCheckpoint, SnapshotFormat};
use tidemark_core::model::ids::JobId;

/// Objects copied at once.
const PARALLEL_COPIES: usize = 4;

/// Why a savepoint could not be written or opened.
#[derive(Debug, Error)]
pub enum SavepointError {
    /// The savepoint's directory (named) already has a `_metadata`: a
    /// savepoint is never overwritten.
    #[error("{0} already holds a savepoint; nothing was written")]
    Exists(String),
    /// The directory (named) has no `_metadata`.
    #[error("{0} is not a savepoint or checkpoint directory: it holds no {METADATA}")]
    NoMetadata(String),
    /// The directory (named) holds a checkpoint of a job directory, not a
    /// relocatable savepoint.
    #[error("{0} is a checkpoint whose references are relative to its job's checkpoint directory, not a self-contained savepoint; restore it as <checkpoint dir>/<job>/chk-N")]
    NotSelfContained(String),
    /// The metadata references something outside its directory.
    #[error(transparent)]
    EscapingReference(#[from] EscapingReference),
    /// A state object of the checkpoint could not be read for the copy.
    #[error("{path}: {source}")]
    Read {
        /// The object's location.
        path: String,
        /// Why.
        source: ReadError,
    },
    /// Storage failed otherwise.
    #[error(transparent)]
    Storage(#[from] StorageError),
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
    let written: Vec<String> = copies.iter().map(|c| c.to.clone()).collect();
    let copied = stream::iter(copies)
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
        .await;
    if let Err(e) = copied {
        // Without its `_metadata` the directory is no savepoint: what the
        // copy wrote would only be left for someone to find.
        for path in written {
            let _ = dir.delete(&path).await;
        }
        return Err(e);
    }
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
    use bytes::Bytes;
    use tidemark_core::testkit::merged;

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
