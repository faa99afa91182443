//! What a subtask remembers between its snapshots (Flink's
//! `SubtaskCheckpointCoordinator`): which shared files an incremental
//! snapshot may reference instead of uploading them again, which
//! asynchronous parts are running, and whether output is suspended after
//! the barrier of a stopping savepoint.
//!
//! The rules, each a test below:
//! - Only a completed checkpoint is a base: an acknowledged one may still
//!   abort, and its files with it.
//! - A savepoint is nobody's base and has none: it is copied out of the
//!   checkpoint directory and its files there deleted.
//! - An upload that ends after its checkpoint aborted is dropped.
//! - Completing a checkpoint subsumes the acknowledged ones before it; a
//!   compaction's rewrite takes files out of the base, so that the next
//!   snapshot uploads them again into a file of its own.
//! - Aborting a checkpoint cancels its running upload and lifts the
//!   suspension it caused.
//!
//! The machine is generic over `H`, the handle the shell cancels a running
//! asynchronous part with, so that it keeps the one map of them.

use super::NativeFileHandle;
use crate::model::event::CheckpointKind;
use crate::model::ids::CheckpointId;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The shared files of the newest completed checkpoint of a subtask, by
/// name: an incremental snapshot references these instead of uploading
/// them again.
pub type SharedBase = BTreeMap<String, NativeFileHandle>;

/// A running asynchronous part.
#[derive(Debug)]
struct Running<H> {
    cancel: H,
    kind: CheckpointKind,
}

/// The checkpoint bookkeeping of one subtask.
#[derive(Debug)]
pub struct SubtaskCheckpointer<H> {
    incremental: bool,
    /// The newest completed checkpoint's shared files.
    base: Arc<SharedBase>,
    /// Shared files of acknowledged checkpoints, until they complete or
    /// abort.
    acknowledged: BTreeMap<CheckpointId, Arc<SharedBase>>,
    running: BTreeMap<CheckpointId, Running<H>>,
    /// The stopping savepoint whose barrier the subtask has passed.
    suspended: Option<CheckpointId>,
}

impl<H> SubtaskCheckpointer<H> {
    /// A subtask restored with `base`, the shared files of the checkpoint
    /// it restored from (empty on a fresh start); `incremental` snapshots
    /// reference the base's files.
    pub fn new(incremental: bool, base: SharedBase) -> Self {
        SubtaskCheckpointer {
            incremental,
            base: Arc::new(base),
            acknowledged: BTreeMap::new(),
            running: BTreeMap::new(),
            suspended: None,
        }
    }

    /// The synchronous part of `checkpoint` is taken and its asynchronous
    /// part, cancelled with `cancel`, starts; `suspend`: it is the
    /// savepoint that stops the job, after whose barrier nothing is
    /// emitted. Returns the base the asynchronous part may reference.
    pub fn started(
        &mut self,
        checkpoint: CheckpointId,
        kind: CheckpointKind,
        suspend: bool,
        cancel: H,
    ) -> Option<Arc<SharedBase>> {
        if suspend {
            self.suspended = Some(checkpoint);
        }
        self.running.insert(checkpoint, Running { cancel, kind });
        let savepoint = kind == CheckpointKind::Savepoint;
        (self.incremental && !savepoint).then(|| self.base.clone())
    }

    /// Whether output stops: the subtask has passed the barrier of the
    /// stopping savepoint, which has not aborted.
    pub fn suspended(&self) -> bool {
        self.suspended.is_some()
    }

    /// The asynchronous part of `checkpoint` uploaded its state, which
    /// references `shared`. It reports this before it acknowledges, so
    /// before the checkpoint can complete.
    pub fn uploaded(&mut self, checkpoint: CheckpointId, shared: SharedBase) {
        let Some(running) = self.running.remove(&checkpoint) else {
            // Aborted meanwhile: it will never be a base.
            return;
        };
        if running.kind != CheckpointKind::Savepoint {
            self.acknowledged.insert(checkpoint, Arc::new(shared));
        }
    }

    /// `checkpoint` completed; the files in `rewrite` are to be uploaded
    /// again (a compaction of wasteful merged files).
    pub fn completed(&mut self, checkpoint: CheckpointId, rewrite: &BTreeSet<String>) {
        if let Some(shared) = self.acknowledged.remove(&checkpoint) {
            self.base = shared;
        }
        if !rewrite.is_empty() {
            let mut base = (*self.base).clone();
            base.retain(|name, _| !rewrite.contains(name));
            self.base = Arc::new(base);
        }
        self.acknowledged.retain(|id, _| *id > checkpoint);
    }

    /// `checkpoint` aborted: returns the handle of its asynchronous part if
    /// it still runs, to cancel it.
    pub fn aborted(&mut self, checkpoint: CheckpointId) -> Option<H> {
        // Else a job whose checkpoints keep aborting would keep the shared
        // files of each until one completes.
        self.acknowledged.remove(&checkpoint);
        if self.suspended == Some(checkpoint) {
            // The stopping savepoint failed: the job goes on.
            self.suspended = None;
        }
        self.running.remove(&checkpoint).map(|r| r.cancel)
    }

    /// Shared files the next incremental checkpoint would reference.
    pub fn base(&self) -> &SharedBase {
        &self.base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::StateHandle;

    const CHECKPOINT: CheckpointKind = CheckpointKind::Checkpoint;

    fn files(names: &[&str]) -> SharedBase {
        names
            .iter()
            .map(|name| {
                let handle = NativeFileHandle {
                    name: (*name).to_owned(),
                    handle: StateHandle::Inline(name.as_bytes().to_vec()),
                    uploaded_by: CheckpointId(0),
                    instance: 1,
                };
                ((*name).to_owned(), handle)
            })
            .collect()
    }

    fn names(base: &SharedBase) -> Vec<&str> {
        base.keys().map(String::as_str).collect()
    }

    fn start(c: &mut SubtaskCheckpointer<u64>, id: u64) -> Vec<String> {
        let base = c.started(CheckpointId(id), CHECKPOINT, false, id);
        base.map_or_else(Vec::new, |b| b.keys().cloned().collect())
    }

    #[test]
    fn only_a_completed_checkpoint_becomes_the_base() {
        let mut c = SubtaskCheckpointer::new(true, files(&["restored.sst"]));
        assert_eq!(start(&mut c, 1), ["restored.sst"]);
        c.uploaded(CheckpointId(1), files(&["1.sst"]));
        // Acknowledged, not complete: the next snapshot still builds on
        // what is known to be complete.
        assert_eq!(start(&mut c, 2), ["restored.sst"]);
        c.completed(CheckpointId(1), &BTreeSet::new());
        assert_eq!(start(&mut c, 3), ["1.sst"]);
    }

    #[test]
    fn completing_a_checkpoint_subsumes_the_acknowledged_ones_before_it() {
        let mut c = SubtaskCheckpointer::new(true, SharedBase::new());
        for id in 1..=3 {
            start(&mut c, id);
            c.uploaded(CheckpointId(id), files(&[&format!("{id}.sst")]));
        }
        c.completed(CheckpointId(2), &BTreeSet::new());
        assert_eq!(names(c.base()), ["2.sst"]);
        // 1 was subsumed with its files: completing it late changes nothing.
        c.completed(CheckpointId(1), &BTreeSet::new());
        assert_eq!(names(c.base()), ["2.sst"]);
        c.completed(CheckpointId(3), &BTreeSet::new());
        assert_eq!(names(c.base()), ["3.sst"]);
    }

    #[test]
    fn a_savepoint_has_no_base_and_is_nobodys() {
        let mut c = SubtaskCheckpointer::new(true, files(&["restored.sst"]));
        let base = c.started(CheckpointId(1), CheckpointKind::Savepoint, false, 1);
        assert!(base.is_none());
        c.uploaded(CheckpointId(1), files(&["savepoint.sst"]));
        c.completed(CheckpointId(1), &BTreeSet::new());
        assert_eq!(names(c.base()), ["restored.sst"]);
    }

    #[test]
    fn a_full_snapshot_references_nothing() {
        let mut c = SubtaskCheckpointer::new(false, files(&["restored.sst"]));
        assert!(c.started(CheckpointId(1), CHECKPOINT, false, 1).is_none());
    }

    #[test]
    fn an_upload_that_ends_after_its_abort_is_dropped() {
        let mut c = SubtaskCheckpointer::new(true, SharedBase::new());
        start(&mut c, 1);
        assert_eq!(c.aborted(CheckpointId(1)), Some(1), "cancel the upload");
        c.uploaded(CheckpointId(1), files(&["1.sst"]));
        c.completed(CheckpointId(1), &BTreeSet::new());
        assert!(c.base().is_empty());
        // Nothing runs any more: a second abort cancels nothing.
        assert_eq!(c.aborted(CheckpointId(1)), None);
    }

    #[test]
    fn an_abort_after_the_upload_forgets_its_files() {
        let mut c = SubtaskCheckpointer::new(true, SharedBase::new());
        start(&mut c, 1);
        c.uploaded(CheckpointId(1), files(&["1.sst"]));
        assert_eq!(c.aborted(CheckpointId(1)), None, "nothing left to cancel");
        c.completed(CheckpointId(1), &BTreeSet::new());
        assert!(c.base().is_empty());
    }

    #[test]
    fn a_rewrite_takes_files_out_of_the_base() {
        let mut c = SubtaskCheckpointer::new(true, SharedBase::new());
        start(&mut c, 1);
        c.uploaded(CheckpointId(1), files(&["a.sst", "b.sst", "c.sst"]));
        let rewrite = BTreeSet::from(["b.sst".to_owned()]);
        c.completed(CheckpointId(1), &rewrite);
        assert_eq!(start(&mut c, 2), ["a.sst", "c.sst"]);
        // A rewrite without an upload of its own applies to the base.
        c.completed(CheckpointId(2), &BTreeSet::from(["a.sst".to_owned()]));
        assert_eq!(names(c.base()), ["c.sst"]);
    }

    #[test]
    fn a_stopping_savepoint_suspends_output_until_it_aborts() {
        let mut c = SubtaskCheckpointer::new(false, SharedBase::new());
        assert!(!c.suspended());
        start(&mut c, 1);
        assert!(!c.suspended(), "a checkpoint suspends nothing");
        c.started(CheckpointId(2), CheckpointKind::Savepoint, true, 2);
        assert!(c.suspended());
        // Another checkpoint's abort leaves the suspension.
        c.aborted(CheckpointId(1));
        assert!(c.suspended());
        c.aborted(CheckpointId(2));
        assert!(!c.suspended(), "the job goes on");
    }
}
