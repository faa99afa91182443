//! The asynchronous part of a subtask's snapshot: serialize what the
//! synchronous part copied, off the arbiter's thread, and write it to
//! checkpoint storage, a bounded number of objects at a time.

use futures::stream::{self, StreamExt, TryStreamExt};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tidemark::batch::{Batch, EncodedBatch};
use tidemark::checkpoint::storage::CheckpointStorage;
use tidemark::checkpoint::{
    ChannelSide, ChannelState, ChannelStateHandle, KeyGroupsStateHandle, KeyedStateHandle,
    NativeFileHandle, NativeStateHandle, StateHandle, SubtaskState,
};
use tidemark::ids::{CheckpointId, SubtaskId};
use tidemark::task::{KeyedSnapshot, NativeCheckpoint, TaskSnapshot};

/// Objects written at once by one snapshot.
const PARALLEL_WRITES: usize = 4;

/// The shared files of the newest completed checkpoint of a subtask, by
/// name: an incremental snapshot references these instead of uploading
/// them again.
pub type SharedBase = BTreeMap<String, NativeFileHandle>;

/// Where an object's bytes come from.
enum Bytes {
    Memory(Vec<u8>),
    /// A file of a native checkpoint, read when its turn to upload comes.
    File(PathBuf),
}

/// Writes `snapshot` and the non-empty `channels` under the checkpoint's
/// directory (shared files under `shared/`); returns the state to
/// acknowledge and how long it took. With a `base`, the shared files of a
/// native checkpoint that the base holds are referenced, not uploaded. If
/// any write fails, what was written is deleted again: no acknowledgement
/// will ever name it.
pub async fn write(
    storage: &CheckpointStorage,
    subtask: SubtaskId,
    checkpoint: CheckpointId,
    snapshot: TaskSnapshot,
    channels: Vec<ChannelState>,
    base: Option<&SharedBase>,
) -> Result<(SubtaskState, Duration), String> {
    let started = Instant::now();
    let TaskSnapshot { keyed, operator } = snapshot;
    let prefix = format!(
        "{}/op-{}-{}",
        CheckpointStorage::checkpoint_dir(checkpoint),
        subtask.operator.0,
        subtask.index.0
    );
    let (heap, native) = match keyed {
        None => (None, None),
        Some(KeyedSnapshot::Heap(heap)) => (Some(heap), None),
        Some(KeyedSnapshot::Native(native)) => (None, Some(native)),
    };
    let (heap, channels) = tokio::task::spawn_blocking(move || {
        let heap = heap.map(|heap| {
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
        (heap, channels)
    })
    .await
    .map_err(|e| format!("serializing state failed: {e}"))?;

    // Everything to write, in one list, so that a failure anywhere deletes
    // everything written: the keyed state's objects first, then the
    // channels', in the order the handles are taken back out below.
    let mut objects: Vec<(String, Bytes)> = Vec::new();
    let heap = heap.map(|(bytes, offsets, start_group)| {
        objects.push((format!("{prefix}-keyed"), Bytes::Memory(bytes)));
        (offsets, start_group)
    });
    let mut native =
        native.map(|native| plan_native(native, subtask, checkpoint, &prefix, base, &mut objects));
    let channels: Vec<_> = channels
        .into_iter()
        .map(|(side, channel, batches, bytes)| {
            let name = match side {
                ChannelSide::Input => "in",
                ChannelSide::Output => "out",
            };
            objects.push((format!("{prefix}-{name}-{channel}"), Bytes::Memory(bytes)));
            (side, channel, batches)
        })
        .collect();
    let written = put_all(storage, objects).await;
    if let Some((checkpoint_files, _)) = &native {
        let dir = checkpoint_files.dir.clone();
        // The hard links are ours to remove, whatever happened.
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
    }
    let mut written = written?.into_iter();
    let mut next = || written.next().expect("one handle per object");
    let keyed = match (heap, native.as_mut()) {
        (Some((offsets, start_group)), _) => {
            Some(KeyedStateHandle::KeyGroups(KeyGroupsStateHandle {
                start_group,
                offsets,
                handle: next(),
            }))
        }
        (None, Some((_, handle))) => {
            for file in handle.private.iter_mut() {
                file.handle = next();
            }
            for file in handle.shared.iter_mut() {
                if file.uploaded_by == checkpoint {
                    file.handle = next();
                }
            }
            Some(KeyedStateHandle::Native(handle.clone()))
        }
        (None, None) => None,
    };
    let channels = channels
        .into_iter()
        .map(|(side, channel, batches)| ChannelStateHandle {
            side,
            channel: channel as u32,
            batches: batches as u32,
            handle: next(),
        })
        .collect();
    Ok((
        SubtaskState {
            keyed,
            operator,
            channels,
        },
        started.elapsed(),
    ))
}

/// The handle of a native checkpoint, and the objects to upload for it:
/// private files into the checkpoint's directory, shared files the base
/// does not hold into `shared/`. Paths of shared files name the checkpoint
/// that uploaded them, so two checkpoints never write the same object.
/// Handles of uploads are filled in once written, in the order pushed.
fn plan_native(
    native: NativeCheckpoint,
    subtask: SubtaskId,
    checkpoint: CheckpointId,
    prefix: &str,
    base: Option<&SharedBase>,
    objects: &mut Vec<(String, Bytes)>,
) -> (NativeCheckpoint, NativeStateHandle) {
    let pending = |path: &String, size| StateHandle::object(path.clone(), size);
    let mut private = Vec::new();
    let mut shared = Vec::new();
    for file in native.files.iter().filter(|f| !f.is_shared()) {
        let path = format!("{prefix}-{}", file.name);
        private.push(NativeFileHandle {
            name: file.name.clone(),
            handle: pending(&path, file.size),
            uploaded_by: checkpoint,
            instance: native.instance,
        });
        objects.push((path, Bytes::File(native.dir.join(&file.name))));
    }
    for file in native.files.iter().filter(|f| f.is_shared()) {
        match base
            .and_then(|b| b.get(&file.name))
            .filter(|f| f.handle.size() == file.size)
        {
            Some(reused) => shared.push(reused.clone()),
            None => {
                let path = format!(
                    "shared/op-{}-{}/{checkpoint}-{}",
                    subtask.operator.0, subtask.index.0, file.name
                );
                shared.push(NativeFileHandle {
                    name: file.name.clone(),
                    handle: pending(&path, file.size),
                    uploaded_by: checkpoint,
                    instance: native.instance,
                });
                objects.push((path, Bytes::File(native.dir.join(&file.name))));
            }
        }
    }
    let handle = NativeStateHandle {
        key_groups: native.key_groups,
        shared,
        private,
    };
    (native, handle)
}

/// Writes `objects`, at most `PARALLEL_WRITES` at a time, and returns their
/// handles in order; on the first failure deletes what was written.
async fn put_all(
    storage: &CheckpointStorage,
    objects: Vec<(String, Bytes)>,
) -> Result<Vec<StateHandle>, String> {
    let results: Vec<Result<StateHandle, String>> = stream::iter(objects)
        .map(|(path, bytes)| async move {
            let bytes = match bytes {
                Bytes::Memory(bytes) => bytes,
                Bytes::File(file) => tokio::task::spawn_blocking(move || {
                    std::fs::read(&file).map_err(|e| format!("reading {}: {e}", file.display()))
                })
                .await
                .map_err(|e| e.to_string())??,
            };
            let size = bytes.len() as u64;
            storage
                .put(&path, bytes.into())
                .await
                .map(|()| StateHandle::object(path, size))
                .map_err(|e| e.to_string())
        })
        .buffered(PARALLEL_WRITES)
        .collect()
        .await;
    if let Some(error) = results.iter().find_map(|r| r.as_ref().err()).cloned() {
        let written: Vec<String> = results
            .iter()
            .flatten()
            .filter_map(StateHandle::physical)
            .map(str::to_owned)
            .collect();
        let _ = stream::iter(written)
            .map(|path| async move { storage.delete(&path).await })
            .buffer_unordered(PARALLEL_WRITES)
            .try_collect::<Vec<()>>()
            .await;
        return Err(error);
    }
    Ok(results.into_iter().flatten().collect())
}
