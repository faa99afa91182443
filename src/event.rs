//! Events on a channel. Barriers, cancel markers and end of partition travel
//! in the same ordered stream as the batches, so no record overtakes a barrier
//! unless the unaligned protocol moves it there on purpose.

use crate::batch::Batch;
use crate::ids::CheckpointId;
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckpointKind {
    Checkpoint,
    Savepoint,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Alignment {
    Aligned,
    Unaligned,
    /// Aligned until the alignment has lasted this long, then unaligned.
    AlignedWithTimeout(Duration),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointOptions {
    pub kind: CheckpointKind,
    pub alignment: Alignment,
}

/// Chandy-Lamport marker: everything before it on a channel belongs to
/// checkpoint `id`, everything after it does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Barrier {
    pub id: CheckpointId,
    /// Trigger time, milliseconds since the Unix epoch.
    pub timestamp: u64,
    pub options: CheckpointOptions,
}

#[derive(Clone, Debug)]
pub enum ChannelEvent {
    Batch(Batch),
    Barrier(Barrier),
    /// Checkpoint `id` was abandoned upstream: stop waiting for its barrier.
    CancelMarker(CheckpointId),
    /// The producer will send nothing more on this channel.
    EndOfPartition,
}

impl ChannelEvent {
    /// Only batches take credits; control events ride free, in order.
    pub fn is_batch(&self) -> bool {
        matches!(self, ChannelEvent::Batch(_))
    }
}
