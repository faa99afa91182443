//! What a subtask's snapshot captured and what it resumes from: the
//! records between its task and the state backends, below both.

use super::{HeapSnapshot, StateError};
use crate::checkpoint::ChannelState;
use crate::model::ids::KeyGroup;
use crate::model::key_group::KeyGroupRange;
use crate::time::Millis;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

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

/// A native checkpoint being made off the subtask's thread: the cache's
/// write-back into the database, then the checkpoint. The asynchronous
/// part waits for it; dropped unwaited (a declined or aborted checkpoint),
/// it removes the checkpoint's directory once made.
pub struct PendingNative(Arc<(Mutex<Making>, Condvar)>);

enum Making {
    Waiting,
    Made(Result<NativeCheckpoint, StateError>),
    /// Taken by the waiter, or dropped by it unwaited.
    Gone,
}

/// The maker's end of a [`PendingNative`]. Dropped without having made
/// the checkpoint (its thread panicked), it fails the wait.
pub(crate) struct MakesNative(Option<Arc<(Mutex<Making>, Condvar)>>);

impl PendingNative {
    pub(crate) fn new() -> (PendingNative, MakesNative) {
        let shared = Arc::new((Mutex::new(Making::Waiting), Condvar::new()));
        (PendingNative(shared.clone()), MakesNative(Some(shared)))
    }

    /// The checkpoint, once made. Blocks: off the runtime's threads.
    pub fn wait(self) -> Result<NativeCheckpoint, StateError> {
        let (slot, made) = &*self.0;
        let slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        let mut slot = made
            .wait_while(slot, |s| matches!(s, Making::Waiting))
            .unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *slot, Making::Gone) {
            Making::Made(made) => made,
            Making::Waiting | Making::Gone => unreachable!("waited for once, until made"),
        }
    }
}

impl Drop for PendingNative {
    fn drop(&mut self) {
        let mut slot = self.0 .0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Making::Made(Ok(native)) = std::mem::replace(&mut *slot, Making::Gone) {
            let _ = std::fs::remove_dir_all(native.dir);
        }
    }
}

impl MakesNative {
    /// Hands `made` to the waiter; if it is gone, removes the checkpoint.
    pub(crate) fn made(mut self, made: Result<NativeCheckpoint, StateError>) {
        let shared = self.0.take().expect("made once");
        let (slot, waiter) = &*shared;
        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        match &*slot {
            Making::Gone => {
                if let Ok(native) = made {
                    let _ = std::fs::remove_dir_all(native.dir);
                }
            }
            _ => *slot = Making::Made(made),
        }
        waiter.notify_all();
    }
}

impl Drop for MakesNative {
    fn drop(&mut self) {
        if self.0.is_some() {
            let stopped = StateError::Store("the checkpoint's write-back stopped".into());
            MakesNative(self.0.take()).made(Err(stopped));
        }
    }
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
