//! What a subtask's snapshot captured and what it resumes from: the
//! records between its task and the state backends, below both.

pub use super::write_back::PendingNative;
use super::HeapSnapshot;
use crate::checkpoint::ChannelState;
use crate::model::ids::KeyGroup;
use crate::model::key_group::KeyGroupRange;
use crate::time::Millis;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What the synchronous part of a snapshot captured.
#[derive(Default)]
pub struct TaskSnapshot {
    /// The keyed state of a keyed chain; `None` for a chain without one.
    pub keyed: Option<KeyedSnapshot>,
    /// Operator state by entry name (`crate::checkpoint::entries`).
    pub operator: BTreeMap<String, Vec<u8>>,
    /// Timers the keyed state holds.
    pub timers: u64,
}

/// Keyed state as the synchronous part left it for the asynchronous part.
pub enum KeyedSnapshot {
    /// An owned copy, serialized off the subtask into the key-group format.
    Heap(HeapSnapshot),
    /// A RocksDB native checkpoint, made and uploaded off the subtask.
    Native(PendingNative),
}

/// The files of a RocksDB native checkpoint: hard links in a local
/// directory of their own, which the uploader removes when it is done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NativeCheckpoint {
    /// The checkpoint's directory, beside the database's working directory.
    pub dir: PathBuf,
    /// The key groups the database held.
    pub key_groups: KeyGroupRange,
    /// The database instance's token (`NativeFileHandle::instance`).
    pub instance: u64,
    /// The files of `dir`, sorted by name.
    pub files: Vec<NativeFile>,
}

/// One file of a [`NativeCheckpoint`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NativeFile {
    /// File name inside the checkpoint's directory.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
}

impl NativeFile {
    /// SST files never change once written and keep their name for the
    /// life of the database, so checkpoints can share them.
    pub fn is_shared(&self) -> bool {
        self.name.ends_with(".sst")
    }
}

/// The state a subtask resumes from: the key groups it owns, its operator
/// state, and the in-flight batches of an unaligned checkpoint, which the
/// subtask replays on their channels ahead of anything new.
#[derive(Clone, Debug, Default)]
pub struct RestoreState {
    /// Key groups in the heap snapshot format (`HeapSnapshot::write`), to
    /// load into either backend.
    pub key_groups: Vec<(KeyGroup, Bytes)>,
    /// This subtask's operator state, by entry name (as in
    /// [`TaskSnapshot::operator`]).
    pub operator: BTreeMap<String, Vec<u8>>,
    /// Channel state of an unaligned checkpoint, to replay first.
    pub channels: Vec<ChannelState>,
    /// A local directory holding the files of a RocksDB native checkpoint,
    /// downloaded for this subtask; the backend takes them over.
    pub native: Option<PathBuf>,
    /// Local directories of further native checkpoints, after a rescale:
    /// the backend copies the key groups it owns out of them and deletes them.
    pub imports: Vec<PathBuf>,
    /// Sink transactions of subtasks a rescale removed, to commit, with
    /// the entry of the sink they belong to.
    pub adopted: Vec<(String, Vec<u8>)>,
    /// The replayed input holds records of key groups other subtasks own
    /// (`RestorePlan::filter_replay`).
    pub filter_replay: bool,
    /// Processing time of the restore: the timestamp of values restored
    /// into a state with TTL that had none (`state::ttl`).
    pub time: Millis,
}
