//! Events on a channel. Barriers, cancel markers and end of partition travel
//! in the same ordered stream as the batches, so no record overtakes a barrier
//! unless the unaligned protocol moves it there on purpose. Watermarks travel
//! the same way, so a watermark never overtakes the records it follows.

use crate::model::batch::Batch;
use crate::model::ids::CheckpointId;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What a barrier takes (Flink's `SnapshotType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckpointKind {
    /// Owned by the job: retained, subsumed and deleted by it, and may be
    /// incremental.
    Checkpoint,
    /// Triggered for the user: always aligned and full, subsumes nothing, and
    /// is copied out into a self-contained directory the job never deletes.
    Savepoint,
}

/// How a subtask with several input channels handles a barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Alignment {
    /// A channel that delivered the barrier is blocked until all have; then
    /// the subtask snapshots. No channel state.
    Aligned,
    /// The first barrier triggers the snapshot and overtakes queued data;
    /// the batches it overtook are captured as channel state.
    Unaligned,
    /// Aligned until the alignment has lasted this long, then unaligned.
    AlignedWithTimeout(Duration),
}

/// How one checkpoint is taken, carried by its barrier (Flink's
/// `CheckpointOptions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointOptions {
    /// Checkpoint or savepoint.
    pub kind: CheckpointKind,
    /// The alignment every subtask uses for this checkpoint; savepoints are
    /// always aligned.
    pub alignment: Alignment,
}

/// Chandy-Lamport marker: everything before it on a channel belongs to
/// checkpoint `id`, everything after it does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Barrier {
    /// The checkpoint this barrier belongs to.
    pub id: CheckpointId,
    /// Trigger time, milliseconds since the Unix epoch.
    pub timestamp: u64,
    /// How the checkpoint is taken.
    pub options: CheckpointOptions,
}

/// What travels on a channel, in order: data and the control events that
/// must not be reordered with it.
#[derive(Clone, Debug)]
pub enum ChannelEvent {
    /// Records; the only event that takes a credit.
    Batch(Batch),
    /// Flink's `CheckpointBarrier`.
    Barrier(Barrier),
    /// Checkpoint `id` was abandoned upstream: stop waiting for its barrier.
    CancelMarker(CheckpointId),
    /// No record with a timestamp at or below this follows on the channel.
    Watermark(u64),
    /// The producer went idle or active.
    WatermarkStatus(WatermarkStatus),
    /// The producer will send nothing more on this channel.
    EndOfPartition,
}

impl From<WatermarkEvent> for ChannelEvent {
    fn from(event: WatermarkEvent) -> Self {
        match event {
            WatermarkEvent::Watermark(w) => ChannelEvent::Watermark(w),
            WatermarkEvent::Status(s) => ChannelEvent::WatermarkStatus(s),
        }
    }
}

impl ChannelEvent {
    /// Only batches take credits; control events ride free, in order.
    pub fn is_batch(&self) -> bool {
        matches!(self, ChannelEvent::Batch(_))
    }
}

/// Whether a channel's watermark holds back the subtasks downstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatermarkStatus {
    /// The producer has had no records for its idle timeout: consumers take
    /// the minimum over their other channels.
    Idle,
    /// The producer has records again.
    Active,
}

/// What a generator or a valve emits downstream, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatermarkEvent {
    /// No record with a timestamp at or below this one follows.
    Watermark(u64),
    /// The producer went idle or active.
    Status(WatermarkStatus),
}
