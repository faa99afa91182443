//! `CompletedCheckpointStore`: the completed checkpoints a job keeps, newest
//! last. Adding one beyond the retained number subsumes the oldest, whose
//! objects the caller then deletes. `CheckpointStorage::recover_store`
//! rebuilds it from every checkpoint in storage; those beyond the retained
//! number (a run that retained more, a subsumption whose delete failed)
//! are subsumed on recovery, as Flink's store does.

use super::CompletedCheckpoint;
use crate::model::ids::CheckpointId;
use std::collections::VecDeque;

/// Flink's `CompletedCheckpointStore`, in memory: the retained completed
/// checkpoints in id order.
#[derive(Debug)]
pub struct CompletedCheckpointStore {
    retain: usize,
    checkpoints: VecDeque<CompletedCheckpoint>,
    /// Found in storage on recovery beyond the retained number: subsumed,
    /// for the job's checkpointing to delete.
    surplus: Vec<CompletedCheckpoint>,
}

impl CompletedCheckpointStore {
    /// An empty store keeping the newest `retain` (at least one).
    pub fn new(retain: usize) -> Self {
        assert!(retain > 0, "at least one completed checkpoint is retained");
        CompletedCheckpointStore {
            retain,
            checkpoints: VecDeque::new(),
            surplus: Vec::new(),
        }
    }

    /// The store over the checkpoints `found` in storage: the newest
    /// `retain` retained, the rest subsumed ([`Self::take_surplus`]).
    pub fn recovered(retain: usize, found: impl IntoIterator<Item = CompletedCheckpoint>) -> Self {
        let mut store = Self::new(retain);
        for checkpoint in found {
            let subsumed = store.add(checkpoint);
            store.surplus.extend(subsumed);
        }
        store
    }

    /// Subsumes the retained checkpoints older than `first` except `keep`:
    /// older runs', from before the directory's last start
    /// ([`super::start`]), which no restore may go back to.
    pub fn retire_before(&mut self, first: CheckpointId, keep: Option<CheckpointId>) {
        let (old, kept): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.checkpoints)
            .into_iter()
            .partition(|c| c.id < first && Some(c.id) != keep);
        self.checkpoints = kept;
        self.surplus.extend(old);
    }

    /// The checkpoints recovery subsumed, once: their shared files may be
    /// referenced by retained ones, so the registry must count them before
    /// their objects are deleted.
    pub fn take_surplus(&mut self) -> Vec<CompletedCheckpoint> {
        std::mem::take(&mut self.surplus)
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
    pub fn remove(&mut self, id: CheckpointId) {
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

    #[test]
    fn recovery_retains_the_newest_and_subsumes_the_rest_once() {
        let found = [3, 1, 4, 2].map(checkpoint);
        let mut store = CompletedCheckpointStore::recovered(2, found);
        let retained: Vec<u64> = store.retained().map(|c| c.id.0).collect();
        assert_eq!(retained, [3, 4]);
        let mut surplus: Vec<u64> = store.take_surplus().iter().map(|c| c.id.0).collect();
        surplus.sort();
        assert_eq!(surplus, [1, 2]);
        assert!(store.take_surplus().is_empty());
    }

    #[test]
    fn checkpoints_before_the_last_start_retire_but_the_start_itself() {
        let mut store = CompletedCheckpointStore::recovered(3, [4, 5, 6].map(checkpoint));
        store.retire_before(CheckpointId(6), Some(CheckpointId(4)));
        let retained: Vec<u64> = store.retained().map(|c| c.id.0).collect();
        assert_eq!(retained, [4, 6]);
        let surplus: Vec<u64> = store.take_surplus().iter().map(|c| c.id.0).collect();
        assert_eq!(surplus, [5]);
    }
}
