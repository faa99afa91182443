//! The simulator's checkpoint storage, in memory: what outlives every
//! crash, and the calls in flight against it, which the scheduler
//! completes (or a crash loses) one at a time.

use crate::checkpoint::store::CompletedCheckpointStore;
use crate::checkpoint::subtask::SharedBase;
use crate::checkpoint::{CompletedCheckpoint, SnapshotFormat, SubtaskState};
use crate::model::ids::{Attempt, CheckpointId};
use std::collections::BTreeMap;

/// Objects, `_metadata` files and the id counter, as a real store keeps
/// them; each call is applied whole when it completes.
#[derive(Default)]
pub(super) struct Storage {
    pub objects: BTreeMap<String, Vec<u8>>,
    pub metadata: BTreeMap<CheckpointId, CompletedCheckpoint>,
    pub next_id: Option<CheckpointId>,
    /// Savepoints whose copy landed, each in a directory of its own.
    pub savepoints: BTreeMap<CheckpointId, Savepoint>,
}

/// A self-contained savepoint: its relocated metadata and the objects of
/// its directory, which nothing of the job's deletes.
pub(super) struct Savepoint {
    pub checkpoint: CompletedCheckpoint,
    pub directory: Storage,
}

impl Storage {
    /// What a restarted driver recovers: every checkpoint whose metadata
    /// exists, the newest `retain` retained and the rest subsumed.
    pub fn recover(&self, retain: usize) -> CompletedCheckpointStore {
        CompletedCheckpointStore::recovered(retain, self.metadata.values().cloned())
    }

    /// The newest `retain` checkpoints in storage: those a restarted
    /// driver recovers.
    pub fn recoverable(&self, retain: usize) -> impl Iterator<Item = &CompletedCheckpoint> {
        self.metadata.values().rev().take(retain)
    }

    /// An object that one of `checkpoints` references and that is gone.
    pub fn missing<'a>(
        &self,
        checkpoints: impl IntoIterator<Item = &'a CompletedCheckpoint>,
    ) -> Option<(CheckpointId, String)> {
        checkpoints.into_iter().find_map(|checkpoint| {
            let states = checkpoint.subtasks.values();
            let mut paths = states.flat_map(|s| s.handles().filter_map(|h| h.physical()));
            paths
                .find(|path| !self.objects.contains_key(*path))
                .map(|path| (checkpoint.id, path.to_owned()))
        })
    }

    /// Where `checkpoint`'s objects are: a savepoint's in its own
    /// directory.
    pub fn holding(&self, checkpoint: &CompletedCheckpoint) -> &Storage {
        match checkpoint.format {
            SnapshotFormat::JobDirectory => self,
            SnapshotFormat::SelfContained => self
                .savepoints
                .get(&checkpoint.id)
                .map_or(self, |s| &s.directory),
        }
    }

    pub fn read(&self, path: &str) -> Result<&[u8], String> {
        self.objects
            .get(path)
            .map(Vec::as_slice)
            .ok_or_else(|| format!("object {path} is gone"))
    }
}

/// How an injected fault ends a `_metadata` write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WriteFault {
    /// Nothing was written.
    Failed,
    /// It was written, but the caller hears a timeout.
    WrittenButTimedOut,
}

/// A storage call in flight.
pub(super) enum Op {
    StoreId {
        checkpoint: CheckpointId,
        next_id: CheckpointId,
        fails: bool,
    },
    Metadata {
        checkpoint: Box<CompletedCheckpoint>,
        fault: Option<WriteFault>,
    },
    Delete {
        checkpoints: Vec<CheckpointId>,
        paths: Vec<String>,
    },
    /// A savepoint copied into its own directory.
    Savepoint {
        checkpoint: Box<CompletedCheckpoint>,
        fails: bool,
    },
    /// A subtask's asynchronous part: it writes `objects`, then tells its
    /// subtask the shared files it references and acknowledges.
    Upload {
        attempt: Attempt,
        task: usize,
        checkpoint: CheckpointId,
        objects: Vec<(String, Vec<u8>)>,
        shared: SharedBase,
        state: Box<SubtaskState>,
        fails: bool,
    },
}
