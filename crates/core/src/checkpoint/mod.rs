//! Checkpoints: the protocol that makes a job's state fault tolerant, the
//! pure side of it. Nothing here does IO, reads a clock or spawns a task:
//!
//! - [`coordinator`]: Flink's `CheckpointCoordinator`, a state machine from
//!   events to actions.
//! - [`barrier`]: the barrier handler of a subtask's input (aligned,
//!   unaligned, aligned with timeout), a state machine over its input gate.
//! - [`job_checkpoints`]: the checkpointing of a whole job, one machine
//!   over the coordinator, the registry, the store and the end of input,
//!   which orders every storage write, deletion and notification.
//! - [`input_end`]: when a checkpointed job takes its final checkpoint and
//!   ends its input.
//! - [`shared`]: the `SharedStateRegistry`, which decides what may be
//!   deleted.
//! - [`merging`]: the file-merging planner, where a snapshot's objects go.
//! - [`restore`]: restore planning, which state each subtask resumes from.
//! - [`metadata`]: the `_metadata` format.
//! - [`savepoint`]: the savepoint plan (relocation and reference checks).
//! - [`store`]: the in-memory `CompletedCheckpointStore`.
//!
//! This module also holds the handles and records they exchange (state
//! handles, acks, completed checkpoints) and the job's checkpoint settings.
//! The IO side, which writes, reads, copies and deletes what these decide,
//! is `tidemark-storage`'s (and the RocksDB store `tidemark-rocksdb`'s).

pub mod barrier;
pub mod coordinator;
pub mod entries;
pub mod input_end;
pub mod job_checkpoints;
pub mod lease;
pub mod merging;
pub mod metadata;
pub mod restore;
pub mod savepoint;
pub mod shared;
pub mod start;
pub mod stats;
pub mod store;
pub mod subtask;

#[cfg(test)]
mod dag_tests;
#[cfg(test)]
mod job_checkpoints_tests;

use crate::model::batch::Batch;
use crate::model::event::{Alignment, CheckpointKind};
use crate::model::graph::{Edge, OperatorSpec};
use crate::model::ids::{CheckpointId, SubtaskId};
use crate::model::key_group::KeyGroupRange;
use bytes::Bytes;
use entries::SOURCE_EXHAUSTED;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::Duration;

/// How often and how carefully checkpoints are taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// Periodic trigger; `None` disables periodic checkpoints (manual ones
    /// still work).
    pub interval: Option<Duration>,
    /// A checkpoint not complete this long after its trigger is aborted.
    pub timeout: Duration,
    /// Least time from the end of one checkpoint to the trigger of the next.
    pub min_pause: Duration,
    /// Checkpoints in flight at once; a trigger waits while this many are.
    pub max_concurrent: usize,
    /// Consecutive failed checkpoints tolerated; one more fails the job.
    pub tolerable_failures: u32,
    /// Completed checkpoints kept; older ones are subsumed and discarded.
    pub retain: usize,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy {
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Restore {
    /// No state: the job starts from the beginning of its sources.
    Fresh,
    /// The newest completed checkpoint in the checkpoint directory, or a
    /// fresh start if there is none. The job continues its own checkpoints:
    /// it always owns them, whatever the `RestoreMode`.
    Latest,
    /// A checkpoint of the job's checkpoint directory.
    Checkpoint(CheckpointId),
    /// A self-contained savepoint directory (a path or URL holding
    /// `_metadata`), anywhere.
    Savepoint(String),
}

/// Who owns the files of the checkpoint a job was restored from (Flink's
/// restore modes). A savepoint is never owned: it is the user's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RestoreMode {
    /// The job never deletes the restored checkpoint's files and never
    /// references them from its own checkpoints: its first checkpoint is a
    /// full one.
    #[default]
    NoClaim,
    /// The restored checkpoint becomes the job's: retained like its own,
    /// an incremental base for its next checkpoint, deleted once subsumed.
    Claim,
}

/// Everything a job needs to be checkpointed.
///
/// The default checkpoints every second into `./tidemark-data/checkpoints`,
/// aligned, full, retains one and starts fresh. The consuming setters are
/// named after the fields and Flink's options, so that a configuration is
/// one expression:
///
/// ```
/// use std::time::Duration;
/// use tidemark_core::checkpoint::CheckpointConfig;
///
/// let settings = CheckpointConfig::new("./tidemark-data/checkpoints")
///     .interval(Duration::from_secs(1))
///     .unaligned()
///     .retain(3);
/// assert!(settings.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointConfig {
    /// How often and how carefully checkpoints are taken.
    pub policy: CheckpointPolicy,
    /// A path, `file://`, `memory://` or `s3://`: the root under which
    /// the job's directory is.
    pub storage_url: String,
    /// Whether barriers wait for each other or overtake in-flight data.
    pub alignment: Alignment,
    /// Which checkpoint the job starts from.
    pub restore: Restore,
    /// Who owns the restored checkpoint's files.
    pub restore_mode: RestoreMode,
    /// A restore drops state of operators the job lacks and starts
    /// operators the checkpoint lacks empty instead of refusing.
    pub allow_non_restored_state: bool,
    /// Where savepoints go (a path or URL), each into a directory of its
    /// own; `None`: savepoints cannot be taken.
    pub savepoint_dir: Option<String>,
    /// RocksDB state uploads only the files the newest completed checkpoint
    /// does not already hold.
    pub incremental: bool,
    /// Inline small objects, merge the others or not.
    pub layout: merging::StateLayout,
    /// How the run leases its job directory.
    pub lease: lease::LeaseConfig,
    /// Checkpoints the statistics' history keeps (Flink's
    /// `web.checkpoints.history`).
    pub history: usize,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig::new(Self::DEFAULT_STORAGE_URL)
    }
}

/// Consuming setters.
impl CheckpointConfig {
    /// Where checkpoints go unless told otherwise: under the working
    /// directory, where a user finds them.
    pub const DEFAULT_STORAGE_URL: &'static str = "./tidemark-data/checkpoints";

    /// The defaults, with checkpoints under `storage_url`.
    pub fn new(storage_url: impl Into<String>) -> Self {
        CheckpointConfig {
            policy: CheckpointPolicy::default(),
            storage_url: storage_url.into(),
            alignment: Alignment::Aligned,
            restore: Restore::Fresh,
            restore_mode: RestoreMode::NoClaim,
            allow_non_restored_state: false,
            savepoint_dir: None,
            incremental: false,
            layout: merging::StateLayout::default(),
            lease: Default::default(),
            history: stats::DEFAULT_HISTORY,
        }
    }

    /// Checkpoints the statistics' history keeps, at least one.
    pub fn history(mut self, history: usize) -> Self {
        self.history = history;
        self
    }

    /// Periodic trigger; `None` leaves only manual checkpoints and
    /// savepoints.
    pub fn interval(mut self, interval: impl Into<Option<Duration>>) -> Self {
        self.policy.interval = interval.into();
        self
    }

    /// A checkpoint not complete this long after its trigger is aborted.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.policy.timeout = timeout;
        self
    }

    /// Least time from the end of one checkpoint to the next trigger.
    pub fn min_pause(mut self, min_pause: Duration) -> Self {
        self.policy.min_pause = min_pause;
        self
    }

    /// Checkpoints in flight at once.
    pub fn max_concurrent(mut self, max_concurrent: usize) -> Self {
        self.policy.max_concurrent = max_concurrent;
        self
    }

    /// Consecutive failed checkpoints tolerated; one more fails the job.
    pub fn tolerable_failures(mut self, tolerable_failures: u32) -> Self {
        self.policy.tolerable_failures = tolerable_failures;
        self
    }

    /// Completed checkpoints kept.
    pub fn retain(mut self, retain: usize) -> Self {
        self.policy.retain = retain;
        self
    }

    /// Aligned, unaligned, or aligned until a timeout.
    pub fn alignment(mut self, alignment: Alignment) -> Self {
        self.alignment = alignment;
        self
    }

    /// Barriers overtake in-flight data, which becomes channel state.
    pub fn unaligned(self) -> Self {
        self.alignment(Alignment::Unaligned)
    }

    /// Which checkpoint the job starts from.
    pub fn restore(mut self, restore: Restore) -> Self {
        self.restore = restore;
        self
    }

    /// Who owns the restored checkpoint's files.
    pub fn restore_mode(mut self, restore_mode: RestoreMode) -> Self {
        self.restore_mode = restore_mode;
        self
    }

    /// Whether a restore may drop state no operator claims and start
    /// operators the checkpoint lacks empty.
    pub fn allow_non_restored_state(mut self, allow: bool) -> Self {
        self.allow_non_restored_state = allow;
        self
    }

    /// Where savepoints go; without one, savepoints cannot be taken.
    pub fn savepoint_dir(mut self, dir: impl Into<String>) -> Self {
        self.savepoint_dir = Some(dir.into());
        self
    }

    /// How long the run's lease on its job directory lasts without renewal,
    /// and whether it takes the directory from a run that looks alive.
    pub fn lease(mut self, lease: lease::LeaseConfig) -> Self {
        self.lease = lease;
        self
    }

    /// Whether RocksDB state uploads only what its base does not hold.
    pub fn incremental(mut self, incremental: bool) -> Self {
        self.incremental = incremental;
        self
    }

    /// State objects smaller than this travel inline (`0`: only empty ones).
    pub fn inline_threshold(mut self, bytes: u64) -> Self {
        self.layout.inline_threshold = bytes;
        self
    }

    /// Turns file merging on, with physical files rolled over at the size
    /// already set or the default, or off.
    pub fn file_merging(mut self, enabled: bool) -> Self {
        self.layout.max_merged_file_size = enabled.then(|| {
            self.layout
                .max_merged_file_size
                .unwrap_or(merging::MergingConfig::default().max_file_size)
        });
        self
    }

    /// Turns file merging on, with physical files rolled over before they
    /// pass `bytes`.
    pub fn max_merged_file_size(mut self, bytes: u64) -> Self {
        self.layout.max_merged_file_size = Some(bytes);
        self
    }

    /// How large physical files are uploaded.
    pub fn upload(mut self, limits: merging::UploadLimits) -> Self {
        self.layout.upload = limits;
        self
    }

    /// A merged file whose total over live bytes passes this is compacted.
    pub fn max_space_amplification(mut self, amplification: f64) -> Self {
        self.layout.max_space_amplification = amplification;
        self
    }
}

/// Checkpoint settings that cannot work together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointConfigError {
    /// Unaligned barriers and concurrent checkpoints.
    #[error("unaligned checkpoints (also aligned ones with a timeout) need max concurrent checkpoints 1, not {0}: an unaligned barrier overtakes the in-flight data and with it the barrier of an older checkpoint, which then aborts")]
    UnalignedConcurrent(usize),
    /// A lease time to live outside what renewal can keep up with.
    #[error("the lease time to live must be between {min:?} and {max:?}, not {0:?}", min = lease::MIN_TTL, max = lease::MAX_TTL)]
    LeaseTtl(Duration),
    /// No completed checkpoint kept: nothing to restore from.
    #[error("at least one completed checkpoint must be retained, not 0")]
    NothingRetained,
    /// No checkpoint may ever be in flight.
    #[error("max concurrent checkpoints must be at least 1, not 0: no checkpoint or savepoint could ever be triggered")]
    NoConcurrentCheckpoint,
    /// A statistics history that keeps nothing.
    #[error("the checkpoint history must keep at least 1 checkpoint, not 0")]
    NoHistory,
    /// Savepoints where retention and cleanup would delete them.
    #[error("the savepoint directory {savepoint_dir} lies inside the job's checkpoint directory {job_dir}, where retention and cleanup delete what no checkpoint references; choose a directory outside it")]
    SavepointsInsideCheckpoints {
        /// The savepoint directory.
        savepoint_dir: String,
        /// The job's directory in checkpoint storage.
        job_dir: String,
    },
}

impl CheckpointConfig {
    /// Refuses combinations that would fail at run time.
    pub fn validate(&self) -> Result<(), CheckpointConfigError> {
        if self.policy.retain == 0 {
            return Err(CheckpointConfigError::NothingRetained);
        }
        if self.policy.max_concurrent == 0 {
            return Err(CheckpointConfigError::NoConcurrentCheckpoint);
        }
        if self.history == 0 {
            return Err(CheckpointConfigError::NoHistory);
        }
        let ttl = self.lease.ttl;
        if !(lease::MIN_TTL..=lease::MAX_TTL).contains(&ttl) {
            return Err(CheckpointConfigError::LeaseTtl(ttl));
        }
        match self.alignment {
            Alignment::Aligned => Ok(()),
            Alignment::Unaligned | Alignment::AlignedWithTimeout(_)
                if self.policy.max_concurrent > 1 =>
            {
                Err(CheckpointConfigError::UnalignedConcurrent(
                    self.policy.max_concurrent,
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

/// Whether `relative`, a path read from metadata, names an object inside the
/// directory it is relative to: absolute paths, `..`, `.`, empty segments,
/// backslashes and URLs do not.
pub fn stays_inside(relative: &str) -> bool {
    !(relative.is_empty()
        || relative.starts_with('/')
        || relative.contains('\\')
        || relative.contains("://")
        || relative
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == ".."))
}

/// The checksum a [`StateHandle`] records of a state object's bytes: CRC-32
/// (IEEE), as `_metadata`'s own.
pub fn checksum(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// [`checksum`] of bytes that come in pieces, and how many there were: a
/// state object streamed into storage is checked as it goes out.
#[derive(Default)]
pub struct Checksum {
    crc: crc32fast::Hasher,
    len: u64,
}

impl Checksum {
    /// Adds the next piece.
    pub fn update(&mut self, bytes: &[u8]) {
        self.crc.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// Bytes so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no byte came.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The checksum of every piece, back to back.
    pub fn finish(self) -> u32 {
        self.crc.finalize()
    }
}

/// Where the bytes of one state object live. Paths are relative to the
/// job's directory in checkpoint storage. Every handle to stored bytes
/// carries the CRC-32 of the state object's bytes, checked on every read:
/// a flipped byte fails the restore instead of restoring wrong values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateHandle {
    /// Bytes below the inline threshold: they travel in the ack and in
    /// `_metadata` (whose own checksum covers them), and no object exists
    /// for them.
    Inline(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A physical object of its own.
    Object {
        /// The object, relative to the job's (or savepoint's) directory.
        path: String,
        /// Its length, checked on every read.
        size: u64,
        /// CRC-32 of its bytes.
        checksum: u32,
    },
    /// `size` bytes at `offset` of a merged physical object, which holds
    /// other segments too.
    Segment {
        /// The merged object, relative to the job's directory.
        path: String,
        /// Where the segment starts in it.
        offset: u64,
        /// The segment's length.
        size: u64,
        /// CRC-32 of the segment's bytes.
        checksum: u32,
    },
}

/// A physical object that does not hold the bytes its handle says it does.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandleMismatch {
    /// Truncated or replaced: not as long as recorded.
    #[error(
        "{path} holds {found} bytes where the checkpoint recorded {expected} (bytes {range:?})"
    )]
    Length {
        /// The physical object.
        path: String,
        /// The bytes of it that were read.
        range: Range<u64>,
        /// Bytes the checkpoint recorded.
        expected: u64,
        /// Bytes the object holds there.
        found: u64,
    },
    /// As long as recorded, but other bytes: corrupted.
    #[error(
        "{path} is corrupted: bytes {range:?} do not match the checksum the checkpoint recorded"
    )]
    Checksum {
        /// The physical object.
        path: String,
        /// The bytes of it that were read.
        range: Range<u64>,
    },
}

impl StateHandle {
    /// A whole object of `size` bytes whose CRC-32 is `checksum` at `path`.
    pub fn object(path: impl Into<String>, size: u64, checksum: u32) -> Self {
        StateHandle::Object {
            path: path.into(),
            size,
            checksum,
        }
    }

    /// The same state object at another place (a savepoint's copy of it),
    /// with its size and checksum.
    pub fn relocated(&self, path: impl Into<String>) -> Self {
        match self {
            StateHandle::Inline(_) => self.clone(),
            StateHandle::Object { size, checksum, .. }
            | StateHandle::Segment { size, checksum, .. } => StateHandle::Object {
                path: path.into(),
                size: *size,
                checksum: *checksum,
            },
        }
    }

    /// The physical object holding the bytes; none for inline bytes.
    pub fn physical(&self) -> Option<&str> {
        match self {
            StateHandle::Inline(_) => None,
            StateHandle::Object { path, .. } | StateHandle::Segment { path, .. } => Some(path),
        }
    }

    /// Bytes of the state object itself, wherever they live.
    pub fn size(&self) -> u64 {
        match self {
            StateHandle::Inline(bytes) => bytes.len() as u64,
            StateHandle::Object { size, .. } | StateHandle::Segment { size, .. } => *size,
        }
    }

    /// The bytes within the physical object: the range to read.
    pub fn range(&self) -> Range<u64> {
        match self {
            StateHandle::Inline(bytes) => 0..bytes.len() as u64,
            StateHandle::Object { size, .. } => 0..*size,
            StateHandle::Segment { offset, size, .. } => *offset..offset.saturating_add(*size),
        }
    }

    /// The state object's bytes out of what a read of `self.range()` of the
    /// physical object returned (ignored for inline bytes). A short read
    /// means a truncated object, other bytes a corrupted one.
    pub fn from_range(&self, read: Bytes) -> Result<Bytes, HandleMismatch> {
        match self {
            StateHandle::Inline(bytes) => Ok(Bytes::copy_from_slice(bytes)),
            StateHandle::Object { checksum, .. } | StateHandle::Segment { checksum, .. } => {
                let found = read.len() as u64;
                if found != self.size() {
                    return Err(self.length_mismatch(found));
                }
                if self::checksum(&read) != *checksum {
                    return Err(HandleMismatch::Checksum {
                        path: self.physical().unwrap_or_default().to_owned(),
                        range: self.range(),
                    });
                }
                Ok(read)
            }
        }
    }

    /// The state object's bytes out of the whole physical object (ignored
    /// for inline bytes). A whole object must be exactly as long as
    /// recorded, a merged one at least as long as the segment's end.
    pub fn from_object(&self, object: Bytes) -> Result<Bytes, HandleMismatch> {
        match self {
            StateHandle::Segment { offset, size, .. } => {
                let range = self.range();
                if (object.len() as u64) < range.end {
                    let found = (object.len() as u64).saturating_sub(*offset);
                    return Err(self.length_mismatch(found.min(*size)));
                }
                self.from_range(object.slice(range.start as usize..range.end as usize))
            }
            _ => self.from_range(object),
        }
    }

    fn length_mismatch(&self, found: u64) -> HandleMismatch {
        HandleMismatch::Length {
            path: self.physical().unwrap_or_default().to_owned(),
            range: self.range(),
            expected: self.size(),
            found,
        }
    }
}

/// Keyed state of one subtask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyedStateHandle {
    /// The heap backend's format, which both backends restore from.
    KeyGroups(KeyGroupsStateHandle),
    /// A RocksDB native checkpoint, which only RocksDB restores from.
    Native(NativeStateHandle),
}

/// One object holding a subtask's key groups back to back, with the offset
/// of each, so that a restore at another parallelism can read exactly the
/// key groups it owns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyGroupsStateHandle {
    /// The first key group of the subtask's range.
    pub start_group: u32,
    /// Byte offset of each key group of the range, in order, in `handle`.
    pub offsets: Vec<u64>,
    /// The object holding the key groups.
    pub handle: StateHandle,
}

/// The files of a RocksDB native checkpoint of a subtask's key groups.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeStateHandle {
    /// The key groups the database held; a rescale clips it to fewer.
    pub key_groups: KeyGroupRange,
    /// SST files, in `shared/`: an incremental checkpoint references the
    /// ones an earlier checkpoint uploaded, and the `SharedStateRegistry`
    /// counts their references.
    pub shared: Vec<NativeFileHandle>,
    /// The other files (manifest, options, current), in the checkpoint's
    /// own directory.
    pub private: Vec<NativeFileHandle>,
}

/// One file of a RocksDB native checkpoint and where its bytes are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeFileHandle {
    /// The file's name in the database directory.
    pub name: String,
    /// Where the file's bytes are in checkpoint storage.
    pub handle: StateHandle,
    /// The checkpoint that uploaded it: if that checkpoint never completes,
    /// the object is its to delete.
    pub uploaded_by: CheckpointId,
    /// The database instance that created the file: a token the backend
    /// draws each time it opens a database. A file name alone is not unique:
    /// a database restored from an older checkpoint numbers its new files
    /// as the abandoned one did.
    pub instance: u64,
}

/// Identifies one shared file for the `SharedStateRegistry`: two handles
/// with the same key hold the same bytes, so a checkpoint can use either.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedKey {
    /// The subtask whose database wrote the file.
    pub subtask: SubtaskId,
    /// The database instance's token (`NativeFileHandle::instance`).
    pub instance: u64,
    /// The file's name in the database directory.
    pub name: String,
}

impl SharedKey {
    /// The key of `file`, uploaded by `subtask`.
    pub fn of(subtask: SubtaskId, file: &NativeFileHandle) -> Self {
        SharedKey {
            subtask,
            instance: file.instance,
            name: file.name.clone(),
        }
    }
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
    /// Input or output end of the subtask.
    pub side: ChannelSide,
    /// The channel's index on that side.
    pub channel: usize,
    /// The batches, oldest first.
    pub batches: Vec<Batch>,
}

/// The in-flight batches an unaligned checkpoint captured on one channel of a
/// subtask, as `EncodedBatch`es in rmp-serde. Channels with nothing in flight
/// have none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelStateHandle {
    /// Input or output end of the subtask.
    pub side: ChannelSide,
    /// The channel's index on that side.
    pub channel: u32,
    /// How many batches the object holds.
    pub batches: u32,
    /// The encoded batches.
    pub handle: StateHandle,
}

/// The acknowledged state of one subtask for one checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskState {
    /// Keyed state; none for operators without keys.
    pub keyed: Option<KeyedStateHandle>,
    /// Small operator state travelling inline: a source's offset, a sink's
    /// pre-committed transactions.
    pub operator: BTreeMap<String, Vec<u8>>,
    /// In-flight batches an unaligned checkpoint captured.
    #[serde(default)]
    pub channels: Vec<ChannelStateHandle>,
    /// Timers in the keyed state, for `inspect` and the report (the timers
    /// themselves are in the keyed state).
    #[serde(default)]
    pub timers: u64,
}

impl SubtaskState {
    /// Every state object this state references, shared ones included.
    pub fn handles(&self) -> impl Iterator<Item = &StateHandle> {
        self.exclusive_handles()
            .chain(self.shared_files().map(|f| &f.handle))
    }

    /// State objects the snapshot for `checkpoint` wrote itself: what to
    /// delete if that checkpoint never completes. Shared files it reused
    /// belong to the checkpoints that uploaded them.
    pub fn written_by(&self, checkpoint: CheckpointId) -> impl Iterator<Item = &StateHandle> {
        let uploaded = self
            .shared_files()
            .filter(move |f| f.uploaded_by == checkpoint)
            .map(|f| &f.handle);
        self.exclusive_handles().chain(uploaded)
    }

    /// Every physical object this state references, once each: what
    /// storage must hold for it to restore.
    pub fn objects(&self) -> BTreeSet<&str> {
        self.handles().filter_map(StateHandle::physical).collect()
    }

    /// Physical objects the snapshot for `checkpoint` wrote, once each.
    pub fn objects_written_by(&self, checkpoint: CheckpointId) -> BTreeSet<&str> {
        self.written_by(checkpoint)
            .filter_map(StateHandle::physical)
            .collect()
    }

    /// Every state object this state references, to relocate them.
    pub fn handles_mut(&mut self) -> impl Iterator<Item = &mut StateHandle> {
        let (key_groups, native) = match &mut self.keyed {
            Some(KeyedStateHandle::KeyGroups(k)) => (Some(&mut k.handle), None),
            Some(KeyedStateHandle::Native(n)) => (None, Some(n)),
            None => (None, None),
        };
        let files = native
            .into_iter()
            .flat_map(|n| n.shared.iter_mut().chain(n.private.iter_mut()));
        key_groups
            .into_iter()
            .chain(files.map(|f| &mut f.handle))
            .chain(self.channels.iter_mut().map(|c| &mut c.handle))
    }

    /// Shared files, which outlive the checkpoint that uploaded them.
    pub fn shared_files(&self) -> impl Iterator<Item = &NativeFileHandle> {
        self.native().into_iter().flat_map(|n| &n.shared)
    }

    /// Shared files, for the registry to replace a handle by the one it
    /// registered under the same key.
    pub fn shared_files_mut(&mut self) -> impl Iterator<Item = &mut NativeFileHandle> {
        let native = match &mut self.keyed {
            Some(KeyedStateHandle::Native(n)) => Some(n),
            _ => None,
        };
        native.into_iter().flat_map(|n| &mut n.shared)
    }

    /// Bytes of in-flight batches this snapshot persisted.
    pub fn inflight_bytes(&self) -> u64 {
        self.channels.iter().map(|c| c.handle.size()).sum()
    }

    /// Bytes the snapshot for `checkpoint` wrote itself, inline state
    /// included (Flink's checkpointed size).
    pub fn bytes_written_by(&self, checkpoint: CheckpointId) -> u64 {
        self.written_by(checkpoint)
            .map(StateHandle::size)
            .sum::<u64>()
            + self.inline_size()
    }

    fn inline_size(&self) -> u64 {
        self.operator.values().map(|v| v.len() as u64).sum()
    }

    /// Bytes of the state objects, inline ones included.
    pub fn size(&self) -> u64 {
        self.handles().map(StateHandle::size).sum::<u64>() + self.inline_size()
    }

    fn native(&self) -> Option<&NativeStateHandle> {
        match &self.keyed {
            Some(KeyedStateHandle::Native(n)) => Some(n),
            _ => None,
        }
    }

    /// Objects only this checkpoint references: key groups, private
    /// native files, channel state.
    fn exclusive_handles(&self) -> impl Iterator<Item = &StateHandle> {
        let key_groups = match &self.keyed {
            Some(KeyedStateHandle::KeyGroups(k)) => Some(&k.handle),
            _ => None,
        };
        let private = self.native().into_iter().flat_map(|n| &n.private);
        key_groups
            .into_iter()
            .chain(private.map(|f| &f.handle))
            .chain(self.channels.iter().map(|c| &c.handle))
    }
}

/// What one subtask measured for one checkpoint (Flink's names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMetrics {
    /// From the first barrier of the checkpoint at this subtask to the last.
    pub alignment: Duration,
    /// Bytes the subtask processed while aligning.
    pub bytes_during_alignment: u64,
    /// From the trigger to the first barrier reaching this subtask.
    pub start_delay: Duration,
    /// The synchronous part of the snapshot, during which the subtask
    /// processes nothing.
    pub sync: Duration,
    /// The asynchronous part: encoding and uploads off the subtask.
    pub async_: Duration,
    /// Bytes of the subtask's state in this checkpoint.
    pub state_size: u64,
    /// Bytes of the in-flight batches persisted as channel state.
    pub persisted_inflight_bytes: u64,
    /// The snapshot overtook the in-flight batches instead of aligning.
    pub unaligned: bool,
    /// An aligned-with-timeout checkpoint that timed out and went unaligned.
    pub switched_to_unaligned: bool,
}

/// A subtask's acknowledgement: its state and what it measured.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Who acknowledges.
    pub subtask: SubtaskId,
    /// Which checkpoint.
    pub checkpoint: CheckpointId,
    /// The handles of what the subtask wrote or references.
    pub state: SubtaskState,
    /// What the subtask measured.
    pub metrics: CheckpointMetrics,
}

/// What the paths of a checkpoint's handles are relative to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotFormat {
    /// Relative to the job's directory in checkpoint storage; handles may
    /// name shared and merged files that other checkpoints use too.
    #[default]
    JobDirectory,
    /// Relative to the directory holding `_metadata`, which holds every
    /// byte of state: the directory can be copied anywhere and restored.
    SelfContained,
}

/// A checkpoint whose every subtask acknowledged, ready to be made durable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletedCheckpoint {
    /// Ids strictly increase over a job's life, across restarts.
    pub id: CheckpointId,
    /// Checkpoint or savepoint.
    pub kind: CheckpointKind,
    /// What the handles' paths are relative to.
    pub format: SnapshotFormat,
    /// The operators of the job that took it, so that a restore can match
    /// its state to the job's operators by uid.
    pub operators: Vec<OperatorSpec>,
    /// The edges of the job that took it, between `operators`: where each
    /// channel of its unaligned channel state came from or went to.
    /// Empty in checkpoints of versions before job graphs were DAGs.
    #[serde(default)]
    pub edges: Vec<Edge>,
    /// The key hash its key groups were assigned with
    /// ([`KEY_HASH_VERSION`](crate::model::key_hash::KEY_HASH_VERSION)); 0 before
    /// key hashing was stable. A restore refuses keyed state of another.
    #[serde(default)]
    pub key_hash: u32,
    /// Trigger time, milliseconds since the Unix epoch.
    pub timestamp: u64,
    /// Every subtask's acknowledged state.
    pub subtasks: BTreeMap<SubtaskId, SubtaskState>,
    /// State returned by master hooks at trigger, by hook name.
    pub master_states: BTreeMap<String, Vec<u8>>,
}

impl CompletedCheckpoint {
    /// Every physical object the checkpoint references, once each: storage
    /// must hold all of them for it to restore, and an object no retained
    /// checkpoint references is garbage.
    pub fn objects(&self) -> BTreeSet<&str> {
        self.subtasks
            .values()
            .flat_map(SubtaskState::objects)
            .collect()
    }
}

/// Why a checkpoint did not complete.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointFailure {
    /// Not complete within the checkpoint timeout.
    #[error("checkpoint {0} expired before completing")]
    Expired(CheckpointId),
    /// A subtask could not take its snapshot.
    #[error("subtask {subtask} declined checkpoint {checkpoint}: {reason}")]
    Declined {
        /// The checkpoint declined.
        checkpoint: CheckpointId,
        /// The subtask that declined it.
        subtask: SubtaskId,
        /// Why, as the subtask said.
        reason: String,
    },
    /// Every subtask acknowledged, but `_metadata` could not be written.
    #[error("checkpoint {checkpoint} could not be finalized: {reason}")]
    FinalizeFailed {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The storage error.
        reason: String,
    },
    /// Not a failure: subsumed by a newer completed checkpoint, or
    /// abandoned when the job restarts, stops or ends.
    #[error("checkpoint {checkpoint} was aborted: {reason}")]
    Aborted {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// What ended it.
        reason: String,
    },
    /// Never triggered: no coordinator, the job stopping or ended, a
    /// queued request dropped at a restart, or a master hook that failed
    /// (which counts as a failed checkpoint).
    #[error("checkpoint not triggered: {0}")]
    NotTriggered(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_taken_in_pieces_is_the_checksum_of_the_whole() {
        let whole: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for cut in [0, 1, 4096, 9_999, 10_000] {
            let mut sum = Checksum::default();
            sum.update(&whole[..cut]);
            sum.update(&[]);
            sum.update(&whole[cut..]);
            assert_eq!(sum.len(), 10_000);
            assert_eq!(sum.finish(), checksum(&whole), "cut at {cut}");
        }
        assert!(Checksum::default().is_empty());
    }

    #[test]
    fn settings_that_could_never_checkpoint_or_restore_are_refused() {
        let url = "memory://";
        assert_eq!(CheckpointConfig::new(url).validate(), Ok(()));
        assert_eq!(
            CheckpointConfig::new(url).retain(0).validate(),
            Err(CheckpointConfigError::NothingRetained)
        );
        assert_eq!(
            CheckpointConfig::new(url).max_concurrent(0).validate(),
            Err(CheckpointConfigError::NoConcurrentCheckpoint)
        );
        assert_eq!(
            CheckpointConfig::new(url)
                .unaligned()
                .max_concurrent(2)
                .validate(),
            Err(CheckpointConfigError::UnalignedConcurrent(2))
        );
    }

    #[test]
    fn input_ends_only_when_every_source_was_exhausted_in_the_checkpoint() {
        let source = |i| SubtaskId {
            operator: crate::model::ids::OperatorId(0),
            index: crate::model::ids::SubtaskIndex(i),
        };
        let exhausted = SubtaskState {
            operator: BTreeMap::from([(SOURCE_EXHAUSTED.to_owned(), Vec::new())]),
            ..SubtaskState::default()
        };
        let mut c = crate::testkit::checkpoint(1);
        c.subtasks.insert(source(0), exhausted.clone());
        c.subtasks.insert(source(1), SubtaskState::default());
        assert!(!ends_input(&c, &[source(0), source(1)]));
        c.subtasks.insert(source(1), exhausted);
        assert!(ends_input(&c, &[source(0), source(1)]));
        assert!(!ends_input(&c, &[]));
    }
}
