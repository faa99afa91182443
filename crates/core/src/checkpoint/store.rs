//! `CompletedCheckpointStore`: the completed checkpoints a job keeps, newest
//! last. Adding one beyond the retained number subsumes the oldest, whose
//! objects the caller then deletes. `CheckpointStorage::recover_store`
//! rebuilds it from storage.

use super::CompletedCheckpoint;
use std::collections::VecDeque;

/// Flink's `CompletedCheckpointStore`, in memory: the retained completed
/// checkpoints in id order.
#[derive(Debug)]
pub struct CompletedCheckpointStore {
    retain: usize,
    checkpoints: VecDeque<CompletedCheckpoint>,
}

impl CompletedCheckpointStore {
    /// An empty store keeping the newest `retain` (at least one).
    pub fn new(retain: usize) -> Self {
        assert!(retain > 0, "at least one completed checkpoint is retained");
        CompletedCheckpointStore {
            retain,
            checkpoints: VecDeque::new(),
        }
    }

    /// Returns the checkpoints this one subsumes. Checkpoints stay in id
    /// order even if they complete out of order: an older one added after a
    /// newer one may be subsumed at once.
    pub fn add(&mut self, checkpoint: CompletedCheckpoint) -> Vec<CompletedCheckpoint> {
        let at = self.checkpoints.partition_point(|c| c.id < checkpoint.id);
        self.checkpoints.insert(at, checkpoint);
        let excess = self.checkpoints.len().saturating_sub(self.retain);
        self.checkpoints.drain(..excess).collect()
    }

    /// The newest retained checkpoint: what a restore starts from.
    pub fn latest(&self) -> Option<&CompletedCheckpoint> {
        self.checkpoints.back()
    }

    /// Forgets checkpoint `id` (one whose state turned out damaged) without
    /// subsuming anything: its objects stay for inspection and cleanup.
    pub fn remove(&mut self, id: crate::model::ids::CheckpointId) {
        self.checkpoints.retain(|c| c.id != id);
    }

    /// The retained checkpoints, oldest first.
    pub fn retained(&self) -> impl DoubleEndedIterator<Item = &CompletedCheckpoint> {
        self.checkpoints.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::CheckpointId;
    use crate::testkit::checkpoint;

    #[test]
    fn retains_the_newest_and_hands_back_the_subsumed() {
        let mut store = CompletedCheckpointStore::new(2);
        assert!(store.add(checkpoint(1)).is_empty());
        assert!(store.add(checkpoint(2)).is_empty());
        let subsumed = store.add(checkpoint(3));
        assert_eq!(subsumed.iter().map(|c| c.id.0).collect::<Vec<_>>(), [1]);
        assert_eq!(store.latest().unwrap().id, CheckpointId(3));
        assert_eq!(store.retained().count(), 2);
        // Completing out of order never makes an older checkpoint the latest.
        let subsumed = store.add(checkpoint(1));
        assert_eq!(subsumed.iter().map(|c| c.id.0).collect::<Vec<_>>(), [1]);
        assert_eq!(store.latest().unwrap().id, CheckpointId(3));
    }
}
