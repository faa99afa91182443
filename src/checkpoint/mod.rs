//! Checkpoints: the protocol that makes a job's state fault tolerant, as
//! sans-IO state machines (the coordinator, the barrier handler) plus the
//! formats and storage they hand their results to.

pub mod barrier;
pub mod coordinator;
pub mod input_end;
pub mod metadata;
pub mod restore;
pub mod shared;
pub mod storage;
pub mod store;

use crate::batch::Batch;
use crate::event::{Alignment, CheckpointKind};
use crate::ids::{CheckpointId, SubtaskId};
use crate::key_group::KeyGroupRange;
use crate::task::SOURCE_EXHAUSTED;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// How often and how carefully checkpoints are taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// Periodic trigger; `None` disables periodic checkpoints (manual ones
    /// still work).
    pub interval: Option<Duration>,
    /// A checkpoint not complete this long after its trigger is aborted.
    pub timeout: Duration,
    /// Least time from the end of one checkpoint to the trigger of the next.
    pub min_pause: Duration,
    pub max_concurrent: usize,
    /// Consecutive failed checkpoints tolerated; one more fails the job.
    pub tolerable_failures: u32,
    /// Completed checkpoints kept; older ones are subsumed and discarded.
    pub retain: usize,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            interval: Some(Duration::from_secs(1)),
            timeout: Duration::from_secs(600),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failures: 0,
            retain: 1,
        }
    }
}

/// Which checkpoint a job starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restore {
    Fresh,
    /// The newest completed checkpoint in the checkpoint directory, or a
    /// fresh start if there is none.
    Latest,
    Checkpoint(CheckpointId),
}

/// Everything a job needs to be checkpointed.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointSettings {
    pub config: CheckpointConfig,
    /// A path, `file://` or `memory://`.
    pub storage_url: String,
    pub alignment: Alignment,
    pub restore: Restore,
    /// RocksDB state uploads only the files the newest completed checkpoint
    /// does not already hold.
    pub incremental: bool,
}

/// Checkpoint settings that cannot work together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("unaligned checkpoints (also aligned ones with a timeout) need max concurrent checkpoints 1, not {0}: an unaligned barrier overtakes the in-flight data and with it the barrier of an older checkpoint, which then aborts")]
    UnalignedConcurrent(usize),
}

impl CheckpointSettings {
    pub fn validate(&self) -> Result<(), SettingsError> {
        match self.alignment {
            Alignment::Aligned => Ok(()),
            Alignment::Unaligned | Alignment::AlignedWithTimeout(_)
                if self.config.max_concurrent > 1 =>
            {
                Err(SettingsError::UnalignedConcurrent(
                    self.config.max_concurrent,
                ))
            }
            _ => Ok(()),
        }
    }
}

/// Whether `checkpoint` holds every source as exhausted: once it completed,
/// the sources can end their output and nothing will ever be replayed.
pub fn ends_input(checkpoint: &CompletedCheckpoint, sources: &[SubtaskId]) -> bool {
    !sources.is_empty()
        && sources.iter().all(|s| {
            checkpoint
                .subtasks
                .get(s)
                .is_some_and(|state| state.operator.contains_key(SOURCE_EXHAUSTED))
        })
}

/// Where the bytes of one state object live, relative to the job's
/// directory in checkpoint storage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHandle {
    pub path: String,
    pub size: u64,
}

/// Keyed state of one subtask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyedStateHandle {
    KeyGroups(KeyGroupsStateHandle),
    Native(NativeStateHandle),
}

/// One object holding a subtask's key groups back to back, with the offset
/// of each, so that a restore at another parallelism can read exactly the
/// key groups it owns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyGroupsStateHandle {
    pub start_group: u32,
    /// Byte offset of each key group of the range, in order, in `handle`.
    pub offsets: Vec<u64>,
    pub handle: StateHandle,
}

/// The files of a RocksDB native checkpoint of a subtask's key groups.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeStateHandle {
    pub key_groups: KeyGroupRange,
    /// SST files, in `shared/`: an incremental checkpoint references the
    /// ones an earlier checkpoint uploaded, and the `SharedStateRegistry`
    /// counts their references.
    pub shared: Vec<NativeFileHandle>,
    /// The other files (manifest, options, current), in the checkpoint's
    /// own directory.
    pub private: Vec<NativeFileHandle>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeFileHandle {
    /// The file's name in the database directory.
    pub name: String,
    pub handle: StateHandle,
    /// The checkpoint that uploaded it: if that checkpoint never completes,
    /// the object is its to delete.
    pub uploaded_by: CheckpointId,
}

/// Which end of a subtask a channel belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ChannelSide {
    /// An input channel, by its index in the subtask's input gate.
    Input,
    /// An output channel, by its index among the subtask's outputs.
    Output,
}

/// The in-flight batches of one channel of a subtask: what an unaligned
/// checkpoint captured there, and what a restore replays there first.
#[derive(Clone, Debug)]
pub struct ChannelState {
    pub side: ChannelSide,
    pub channel: usize,
    pub batches: Vec<Batch>,
}

/// The in-flight batches an unaligned checkpoint captured on one channel of a
/// subtask, as `EncodedBatch`es in rmp-serde. Channels with nothing in flight
/// have none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelStateHandle {
    pub side: ChannelSide,
    pub channel: u32,
    pub batches: u32,
    pub handle: StateHandle,
}

/// The acknowledged state of one subtask for one checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskState {
    pub keyed: Option<KeyedStateHandle>,
    /// Small operator state travelling inline: a source's offset, a sink's
    /// pre-committed transactions.
    pub operator: BTreeMap<String, Vec<u8>>,
    #[serde(default)]
    pub channels: Vec<ChannelStateHandle>,
}

impl SubtaskState {
    /// Every object this state references, shared ones included.
    pub fn handles(&self) -> impl Iterator<Item = &StateHandle> {
        let (key_groups, native) = match &self.keyed {
            None => (None, None),
            Some(KeyedStateHandle::KeyGroups(k)) => (Some(&k.handle), None),
            Some(KeyedStateHandle::Native(n)) => (None, Some(n)),
        };
        let native = native
            .into_iter()
            .flat_map(|n| n.shared.iter().chain(&n.private).map(|f| &f.handle));
        key_groups
            .into_iter()
            .chain(native)
            .chain(self.channels.iter().map(|c| &c.handle))
    }

    /// Objects the snapshot for `checkpoint` wrote itself: what to delete if
    /// that checkpoint never completes. Shared files it reused belong to the
    /// checkpoints that uploaded them.
    pub fn written_by(&self, checkpoint: CheckpointId) -> impl Iterator<Item = &StateHandle> {
        let reused: Vec<&StateHandle> = self
            .shared_files()
            .filter(|f| f.uploaded_by != checkpoint)
            .map(|f| &f.handle)
            .collect();
        self.handles().filter(move |h| !reused.contains(h))
    }

    /// Shared files, which outlive the checkpoint that uploaded them.
    pub fn shared_files(&self) -> impl Iterator<Item = &NativeFileHandle> {
        match &self.keyed {
            Some(KeyedStateHandle::Native(n)) => n.shared.iter(),
            _ => [].iter(),
        }
    }

    /// Bytes of in-flight batches this snapshot persisted.
    pub fn inflight_bytes(&self) -> u64 {
        self.channels.iter().map(|c| c.handle.size).sum()
    }

    pub fn size(&self) -> u64 {
        self.handles().map(|h| h.size).sum::<u64>()
            + self.operator.values().map(|v| v.len() as u64).sum::<u64>()
    }
}

/// What one subtask measured for one checkpoint (Flink's names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMetrics {
    /// From the first barrier of the checkpoint at this subtask to the last.
    pub alignment: Duration,
    pub bytes_during_alignment: u64,
    /// From the trigger to the first barrier reaching this subtask.
    pub start_delay: Duration,
    pub sync: Duration,
    pub async_: Duration,
    pub state_size: u64,
    /// Bytes of the in-flight batches persisted as channel state.
    pub persisted_inflight_bytes: u64,
    /// The snapshot overtook the in-flight batches instead of aligning.
    pub unaligned: bool,
    /// An aligned-with-timeout checkpoint that timed out and went unaligned.
    pub switched_to_unaligned: bool,
}

/// A subtask's acknowledgement: its state and what it measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub subtask: SubtaskId,
    pub checkpoint: CheckpointId,
    pub state: SubtaskState,
    pub metrics: CheckpointMetrics,
}

/// A checkpoint whose every subtask acknowledged, ready to be made durable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletedCheckpoint {
    pub id: CheckpointId,
    pub kind: CheckpointKind,
    /// Trigger time, milliseconds since the Unix epoch.
    pub timestamp: u64,
    pub subtasks: BTreeMap<SubtaskId, SubtaskState>,
    /// State returned by master hooks at trigger, by hook name.
    pub master_states: BTreeMap<String, Vec<u8>>,
}

/// Why a checkpoint did not complete.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointFailure {
    #[error("checkpoint {0} expired before completing")]
    Expired(CheckpointId),
    #[error("subtask {subtask} declined checkpoint {checkpoint}: {reason}")]
    Declined {
        checkpoint: CheckpointId,
        subtask: SubtaskId,
        reason: String,
    },
    #[error("checkpoint {checkpoint} could not be finalized: {reason}")]
    FinalizeFailed {
        checkpoint: CheckpointId,
        reason: String,
    },
    #[error("checkpoint {checkpoint} was aborted: {reason}")]
    Aborted {
        checkpoint: CheckpointId,
        reason: String,
    },
    #[error("checkpoint not triggered: {0}")]
    NotTriggered(String),
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A completed checkpoint with no state, for storage tests.
    pub(crate) fn checkpoint(id: u64) -> CompletedCheckpoint {
        CompletedCheckpoint {
            id: CheckpointId(id),
            kind: CheckpointKind::Checkpoint,
            timestamp: id,
            subtasks: BTreeMap::new(),
            master_states: BTreeMap::new(),
        }
    }

    #[test]
    fn input_ends_only_when_every_source_was_exhausted_in_the_checkpoint() {
        let source = |i| SubtaskId {
            operator: crate::ids::OperatorId(0),
            index: crate::ids::SubtaskIndex(i),
        };
        let exhausted = SubtaskState {
            operator: BTreeMap::from([(SOURCE_EXHAUSTED.to_owned(), Vec::new())]),
            ..SubtaskState::default()
        };
        let mut c = checkpoint(1);
        c.subtasks.insert(source(0), exhausted.clone());
        c.subtasks.insert(source(1), SubtaskState::default());
        assert!(!ends_input(&c, &[source(0), source(1)]));
        c.subtasks.insert(source(1), exhausted);
        assert!(ends_input(&c, &[source(0), source(1)]));
        assert!(!ends_input(&c, &[]));
    }
}
