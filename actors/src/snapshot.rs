//! The asynchronous part of a subtask's snapshot: serialize what the
//! synchronous part copied, off the arbiter's thread, and write it to
//! checkpoint storage.

use std::time::{Duration, Instant};
use tidemark::batch::{Batch, EncodedBatch};
use tidemark::checkpoint::storage::CheckpointStorage;
use tidemark::checkpoint::{
    ChannelSide, ChannelStateHandle, KeyGroupsStateHandle, KeyedStateHandle, StateHandle,
    SubtaskState,
};
use tidemark::ids::{CheckpointId, SubtaskId};
use tidemark::task::{KeyedSnapshot, TaskSnapshot};

/// In-flight batches of one channel, captured by an unaligned checkpoint.
pub struct ChannelState {
    pub side: ChannelSide,
    pub channel: usize,
    pub batches: Vec<Batch>,
}

/// Writes `snapshot` and the non-empty `channels` under the checkpoint's
/// directory; returns the state to acknowledge and how long it took.
pub async fn write(
    storage: &CheckpointStorage,
    subtask: SubtaskId,
    checkpoint: CheckpointId,
    snapshot: TaskSnapshot,
    channels: Vec<ChannelState>,
) -> Result<(SubtaskState, Duration), String> {
    let started = Instant::now();
    let TaskSnapshot { keyed, operator } = snapshot;
    let prefix = format!(
        "{}/op-{}-{}",
        CheckpointStorage::checkpoint_dir(checkpoint),
        subtask.operator.0,
        subtask.index.0
    );
    let heap = match keyed {
        None => None,
        Some(KeyedSnapshot::Heap(heap)) => Some(heap),
        Some(KeyedSnapshot::Native(native)) => {
            return Err(format!(
                "native snapshot in {} cannot be uploaded yet",
                native.dir.display()
            ))
        }
    };
    let (keyed, channels) = tokio::task::spawn_blocking(move || {
        let keyed = heap.map(|heap| {
            let mut bytes = Vec::new();
            let offsets = heap.write(&mut bytes);
            (bytes, offsets, heap.key_groups().start)
        });
        let channels: Vec<_> = channels
            .into_iter()
            .filter(|c| !c.batches.is_empty())
            .map(|c| {
                let encoded: Vec<EncodedBatch> = c.batches.iter().map(Batch::encode).collect();
                let bytes = rmp_serde::to_vec(&encoded).expect("batches serialize to memory");
                (c.side, c.channel, encoded.len(), bytes)
            })
            .collect();
        (keyed, channels)
    })
    .await
    .map_err(|e| format!("serializing state failed: {e}"))?;

    let put = |path: String, bytes: Vec<u8>| async move {
        let size = bytes.len() as u64;
        storage
            .put(&path, bytes.into())
            .await
            .map(|()| StateHandle { path, size })
            .map_err(|e| e.to_string())
    };
    let keyed = match keyed {
        None => None,
        Some((bytes, offsets, start_group)) => {
            Some(KeyedStateHandle::KeyGroups(KeyGroupsStateHandle {
                start_group,
                offsets,
                handle: put(format!("{prefix}-keyed"), bytes).await?,
            }))
        }
    };
    let channels = futures::future::try_join_all(channels.into_iter().map(
        |(side, channel, batches, bytes)| {
            let name = match side {
                ChannelSide::Input => "in",
                ChannelSide::Output => "out",
            };
            let path = format!("{prefix}-{name}-{channel}");
            async move {
                Ok::<_, String>(ChannelStateHandle {
                    side,
                    channel: channel as u32,
                    batches: batches as u32,
                    handle: put(path, bytes).await?,
                })
            }
        },
    ))
    .await?;
    Ok((
        SubtaskState {
            keyed,
            operator,
            channels,
        },
        started.elapsed(),
    ))
}
