//! Reading what an attempt starts from: the restore plan's state objects,
//! cut into key groups per subtask, and native checkpoints downloaded for
//! the subtasks' RocksDB instances.

use crate::checkpoint::coordinator::RestoreFrom;
use crate::job::JobError;
use futures::stream::{self, StreamExt};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tidemark_core::checkpoint::restore::{self, RestoreError, RestoreFailure};
use tidemark_core::checkpoint::subtask::SharedBase;
use tidemark_core::checkpoint::{
    ends_input, ChannelState, NativeFileHandle, NativeStateHandle, StateHandle, SubtaskState,
};
use tidemark_core::dataflow::task::RestoreState;
use tidemark_core::model::batch::{Batch, EncodedBatch};
use tidemark_core::model::graph::JobGraph;
use tidemark_core::model::ids::{CheckpointId, SubtaskId};
use tidemark_storage::{CheckpointStorage, ReadError, StorageError};

/// What a subtask resumes from.
#[derive(Default)]
pub(crate) struct Restored {
    pub(crate) state: RestoreState,
    /// The shared files of a restored native checkpoint, by name.
    pub(crate) shared_base: SharedBase,
    /// The directories native checkpoints were downloaded to. The backend
    /// moves or deletes what it restores from; what a failed restore leaves
    /// goes with these.
    pub(crate) downloads: Vec<tempfile::TempDir>,
}

/// Objects a restore reads or downloads at once.
const PARALLEL_READS: usize = 4;

/// The state every subtask this process `hosts` starts from: nothing
/// without a checkpoint; otherwise the restore plan's objects, read and cut
/// into key groups, and native checkpoints downloaded under `local_dir`.
/// The plan is made and checked against the whole job even where this
/// process hosts none of it (a driver whose workers read the state).
pub(crate) async fn load(
    storage: &CheckpointStorage,
    graph: &JobGraph,
    from: Option<&RestoreFrom>,
    allow_non_restored: bool,
    local_dir: Option<&Path>,
    hosts: impl Fn(SubtaskId) -> bool,
) -> Result<Loaded, JobError> {
    let Some(
        restore_from @ RestoreFrom {
            checkpoint,
            owned,
            dir,
        },
    ) = from
    else {
        return Ok(Loaded::default());
    };
    let owned = *owned;
    let storage = dir.as_ref().unwrap_or(storage);
    let started = Instant::now();
    let plans = restore::plan(checkpoint, graph, allow_non_restored).map_err(JobError::Restore)?;
    let reads = plans.into_iter().filter(|(subtask, _)| hosts(*subtask)).map(|(subtask, plan)| {
        let storage = storage.clone();
        async move {
            let shared_base: SharedBase = plan
                .incremental_base(owned)
                .iter()
                .map(|f| (f.name.clone(), f.clone()))
                .collect();
            let mut state = RestoreState {
                operator: plan.operator,
                adopted: plan.adopted,
                filter_replay: plan.filter_replay,
                time: crate::clock::now().unix_ms,
                ..RestoreState::default()
            };
            let mut downloads = Vec::new();
            if plan.native.is_some() || !plan.imports.is_empty() {
                let Some(local_dir) = local_dir else {
                    return Err(JobError::Restore(RestoreError::Malformed {
                        subtask,
                        problem: "the checkpoint holds RocksDB state and the job runs on the heap backend".into(),
                    }));
                };
                for import in &plan.imports {
                    let dir = download(&storage, subtask, import, local_dir).await?;
                    state.imports.push(dir.path().to_path_buf());
                    downloads.push(dir);
                }
                if let Some(native) = plan.native {
                    let dir = download(&storage, subtask, &native, local_dir).await?;
                    state.native = Some(dir.path().to_path_buf());
                    downloads.push(dir);
                }
            }
            let malformed =
                |problem: String| JobError::Restore(RestoreError::Malformed { subtask, problem });
            for slices in plan.keyed {
                let bytes = read(&storage, subtask, &slices.handle).await?;
                for (group, range) in slices.groups {
                    state
                        .key_groups
                        .push((group, bytes.slice(range.start as usize..range.end as usize)));
                }
            }
            for channel in plan.channels {
                let bytes = read(&storage, subtask, &channel.handle).await?;
                let name = format!("channel state {:?} {}", channel.side, channel.channel);
                let batches: Vec<EncodedBatch> = rmp_serde::from_slice(&bytes)
                    .map_err(|e| malformed(format!("{name}: {e}")))?;
                if batches.len() != channel.batches as usize {
                    return Err(malformed(format!(
                        "{name} holds {} batches, the checkpoint recorded {}",
                        batches.len(),
                        channel.batches
                    )));
                }
                state.channels.push(ChannelState {
                    side: channel.side,
                    channel: channel.channel as usize,
                    batches: batches.into_iter().map(Batch::from).collect(),
                });
            }
            Ok::<_, JobError>((
                subtask,
                Restored {
                    state,
                    shared_base,
                    downloads,
                },
            ))
        }
    });
    // Every subtask's reads run to their end even once one failed, so that
    // no download is dropped with writes still in flight.
    let subtasks = futures::future::join_all(reads)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let bytes = checkpoint.subtasks.values().map(SubtaskState::size).sum();
    let sources: Vec<SubtaskId> = checkpoint
        .subtasks
        .keys()
        .filter(|s| graph.is_source(s.operator))
        .copied()
        .collect();
    Ok(Loaded {
        subtasks,
        from: Some(restore_from.clone()),
        restore: Some(LoadedFrom {
            checkpoint: checkpoint.id,
            started,
            bytes,
            is_savepoint: !owned,
            input_ended: ends_input(checkpoint, &sources),
            location: match dir {
                Some(dir) => dir.directory(),
                None => storage.location(&CheckpointStorage::checkpoint_dir(checkpoint.id)),
            },
        }),
    })
}

/// What `load` read for each subtask, and from where.
#[derive(Default)]
pub(crate) struct Loaded {
    pub(crate) subtasks: HashMap<SubtaskId, Restored>,
    /// The checkpoint read, for worker processes to read their share of.
    pub(crate) from: Option<RestoreFrom>,
    pub(crate) restore: Option<LoadedFrom>,
}

/// Which checkpoint a restore read, and when it started reading how many
/// bytes: a restore ends once the subtasks are built on its state.
pub(crate) struct LoadedFrom {
    pub(crate) checkpoint: CheckpointId,
    pub(crate) started: Instant,
    pub(crate) bytes: u64,
    /// Not one of the job's own checkpoints.
    pub(crate) is_savepoint: bool,
    /// It holds every source as exhausted: the job's final checkpoint.
    pub(crate) input_ended: bool,
    pub(crate) location: String,
}

/// Downloads the files of a native checkpoint into a directory of its own
/// under `local_dir`, which the state backend then takes over; dropped
/// before that, the directory is deleted.
async fn download(
    storage: &CheckpointStorage,
    subtask: SubtaskId,
    native: &NativeStateHandle,
    local_dir: &Path,
) -> Result<tempfile::TempDir, JobError> {
    let files: Vec<&NativeFileHandle> = native.shared.iter().chain(&native.private).collect();
    for file in &files {
        // A name from the metadata becomes a local path: it must stay a name.
        if file.name.is_empty() || file.name.contains(['/', '\\']) || file.name.starts_with('.') {
            return Err(JobError::Restore(RestoreError::Malformed {
                subtask,
                problem: format!("{:?} is not a database file name", file.name),
            }));
        }
    }
    let local = |e: std::io::Error| JobError::Runtime(format!("restoring {subtask}: {e}"));
    std::fs::create_dir_all(local_dir).map_err(local)?;
    // Every write holds the directory, and every file is tried even once
    // one failed: a write still running when the download is dropped ends
    // before the directory is deleted, instead of racing the deletion and
    // leaving it behind.
    let download = Arc::new(
        tempfile::Builder::new()
            .prefix(&format!("restore-{subtask}-"))
            .tempdir_in(local_dir)
            .map_err(local)?,
    );
    stream::iter(files)
        .map(|file| {
            let dir = download.clone();
            async move {
                let bytes = read(storage, subtask, &file.handle).await?;
                let name = file.name.clone();
                tokio::task::spawn_blocking(move || std::fs::write(dir.path().join(name), bytes))
                    .await
                    .map_err(|e| JobError::Runtime(e.to_string()))?
                    .map_err(local)
            }
        })
        .buffer_unordered(PARALLEL_READS)
        .collect::<Vec<Result<(), JobError>>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>, _>>()?;
    Arc::try_unwrap(download).map_err(|_| {
        JobError::Runtime(format!(
            "restoring {subtask}: a write outlived the download"
        ))
    })
}

/// What a failed restore means for trying an older checkpoint.
pub(crate) fn restore_failure(e: &JobError) -> RestoreFailure {
    match e {
        JobError::Restore(e) => RestoreFailure::of_restore(e),
        JobError::Storage(e) => e.restore_failure(),
        _ => RestoreFailure::Other,
    }
}

/// Whether a failover's restore failed on storage that may recover (an IO
/// error other than a missing object), so that another attempt may succeed.
pub(crate) fn transient(e: &JobError) -> bool {
    matches!(e, JobError::Storage(e @ StorageError::Io { .. }) if !e.is_not_found())
}

/// The bytes of the state object at `handle`: inline, or read from its
/// physical object, which must hold as many bytes as the checkpoint
/// recorded.
async fn read(
    storage: &CheckpointStorage,
    subtask: SubtaskId,
    handle: &StateHandle,
) -> Result<bytes::Bytes, JobError> {
    storage.read_handle(handle).await.map_err(|e| match e {
        ReadError::Storage(e) => JobError::Storage(e),
        ReadError::Mismatch(source) => {
            JobError::Restore(RestoreError::Corrupted { subtask, source })
        }
    })
}
