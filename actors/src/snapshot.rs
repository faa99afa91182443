//! The asynchronous part of a subtask's snapshot: serialize what the
//! synchronous part copied, off the arbiter's thread, and write it to
//! checkpoint storage.

use std::time::{Duration, Instant};
use tidemark::checkpoint::storage::CheckpointStorage;
use tidemark::checkpoint::{KeyedStateHandle, StateHandle, SubtaskState};
use tidemark::ids::{CheckpointId, SubtaskId};
use tidemark::task::TaskSnapshot;

/// Writes `snapshot` under the checkpoint's directory; returns the state to
/// acknowledge and how long it took.
pub async fn write(
    storage: &CheckpointStorage,
    subtask: SubtaskId,
    checkpoint: CheckpointId,
    snapshot: TaskSnapshot,
) -> Result<(SubtaskState, Duration), String> {
    let started = Instant::now();
    let TaskSnapshot { keyed, operator } = snapshot;
    let keyed = match keyed {
        None => None,
        Some(heap) => {
            let (bytes, offsets, start_group) = tokio::task::spawn_blocking(move || {
                let mut bytes = Vec::new();
                let offsets = heap.write(&mut bytes);
                (bytes, offsets, heap.key_groups().start)
            })
            .await
            .map_err(|e| format!("serializing keyed state failed: {e}"))?;
            let path = format!(
                "{}/op-{}-{}-keyed",
                CheckpointStorage::checkpoint_dir(checkpoint),
                subtask.operator.0,
                subtask.index.0
            );
            let size = bytes.len() as u64;
            storage
                .put(&path, bytes.into())
                .await
                .map_err(|e| e.to_string())?;
            Some(KeyedStateHandle {
                start_group,
                offsets,
                handle: StateHandle { path, size },
            })
        }
    };
    Ok((SubtaskState { keyed, operator }, started.elapsed()))
}
