//! `SharedStateRegistry`: reference counts of the shared files of
//! incremental checkpoints (RocksDB SSTs in `shared/`), sans-IO. The
//! coordinator shell tells it which checkpoints are triggered, completed,
//! aborted and removed from the retained set, and deletes what it returns.
//!
//! A file is counted once per retained checkpoint that references it. When
//! the count reaches zero the file is only *released*: a checkpoint still in
//! flight may have been based on an older completed checkpoint and reference
//! it without having acknowledged yet. The file is deleted once every
//! checkpoint that was pending at its release has ended, if no checkpoint
//! that completed meanwhile took it up again. Checkpoints triggered after the
//! release cannot reference it: a subtask bases its next snapshot on the
//! newest checkpoint it was notified of, and the notification of the
//! checkpoint that caused the release reached it before their barriers.

use super::{CompletedCheckpoint, StateHandle};
use crate::ids::CheckpointId;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug)]
struct Shared {
    handle: StateHandle,
    /// Retained checkpoints referencing the file.
    references: usize,
    /// Checkpoints pending when the count last reached zero, still running.
    released: Option<BTreeSet<CheckpointId>>,
}

#[derive(Debug, Default)]
pub struct SharedStateRegistry {
    /// By object path.
    files: BTreeMap<String, Shared>,
    pending: BTreeSet<CheckpointId>,
}

impl SharedStateRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// The counts after a coordinator restart: the retained checkpoints'
    /// references, with nothing pending.
    pub fn rebuild<'a>(retained: impl IntoIterator<Item = &'a CompletedCheckpoint>) -> Self {
        let mut registry = Self::new();
        for checkpoint in retained {
            registry.reference(checkpoint);
        }
        registry
    }

    pub fn triggered(&mut self, checkpoint: CheckpointId) {
        self.pending.insert(checkpoint);
    }

    /// `checkpoint` joined the retained checkpoints.
    pub fn completed(&mut self, checkpoint: &CompletedCheckpoint) {
        self.reference(checkpoint);
        self.ended(checkpoint.id);
    }

    /// `checkpoint` will never complete.
    pub fn aborted(&mut self, checkpoint: CheckpointId) {
        self.ended(checkpoint);
    }

    /// Every pending checkpoint but `keep` will never complete.
    pub fn abort_all_except(&mut self, keep: &BTreeSet<CheckpointId>) {
        let ended: Vec<CheckpointId> = self.pending.difference(keep).copied().collect();
        for checkpoint in ended {
            self.ended(checkpoint);
        }
    }

    /// `checkpoint` left the retained checkpoints (subsumed or discarded).
    pub fn removed(&mut self, checkpoint: &CompletedCheckpoint) {
        for handle in shared_handles(checkpoint) {
            let Some(file) = self.files.get_mut(&handle.path) else {
                continue;
            };
            file.references = file.references.saturating_sub(1);
            if file.references == 0 {
                file.released = Some(self.pending.clone());
            }
        }
    }

    /// Files that no retained checkpoint references and no checkpoint in
    /// flight can still take up: the caller deletes them.
    pub fn take_deletable(&mut self) -> Vec<StateHandle> {
        let deletable: Vec<String> = self
            .files
            .iter()
            .filter(|(_, f)| f.references == 0 && f.released.as_ref().is_some_and(|p| p.is_empty()))
            .map(|(path, _)| path.clone())
            .collect();
        deletable
            .into_iter()
            .filter_map(|path| self.files.remove(&path))
            .map(|f| f.handle)
            .collect()
    }

    /// Whether the file at `path` is counted, referenced or released.
    pub fn contains(&self, path: &str) -> bool {
        self.files.contains_key(path)
    }

    fn reference(&mut self, checkpoint: &CompletedCheckpoint) {
        for handle in shared_handles(checkpoint) {
            let file = self.files.entry(handle.path.clone()).or_insert(Shared {
                handle: handle.clone(),
                references: 0,
                released: None,
            });
            file.references += 1;
            file.released = None;
        }
    }

    fn ended(&mut self, checkpoint: CheckpointId) {
        self.pending.remove(&checkpoint);
        for file in self.files.values_mut() {
            if let Some(pending) = &mut file.released {
                pending.remove(&checkpoint);
            }
        }
    }
}

/// Each shared file of `checkpoint` once, however many subtasks name it.
fn shared_handles(checkpoint: &CompletedCheckpoint) -> Vec<&StateHandle> {
    let mut seen = BTreeSet::new();
    checkpoint
        .subtasks
        .values()
        .flat_map(|s| s.shared_files())
        .map(|f| &f.handle)
        .filter(|h| seen.insert(h.path.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::store::CompletedCheckpointStore;
    use crate::checkpoint::{KeyedStateHandle, NativeFileHandle, NativeStateHandle, SubtaskState};
    use crate::event::CheckpointKind;
    use crate::ids::{OperatorId, SubtaskId, SubtaskIndex};
    use crate::key_group::KeyGroupRange;
    use proptest::prelude::*;

    fn handle(path: &str) -> StateHandle {
        StateHandle {
            path: path.to_owned(),
            size: 1,
        }
    }

    /// A checkpoint of one subtask whose database holds `files`, each as
    /// (path, checkpoint that uploaded it).
    fn checkpoint(id: u64, files: &[(&str, u64)]) -> CompletedCheckpoint {
        let shared = files
            .iter()
            .map(|(path, by)| NativeFileHandle {
                name: path.to_string(),
                handle: handle(path),
                uploaded_by: CheckpointId(*by),
            })
            .collect();
        let state = SubtaskState {
            keyed: Some(KeyedStateHandle::Native(NativeStateHandle {
                key_groups: KeyGroupRange { start: 0, end: 128 },
                shared,
                private: Vec::new(),
            })),
            ..SubtaskState::default()
        };
        CompletedCheckpoint {
            id: CheckpointId(id),
            kind: CheckpointKind::Checkpoint,
            timestamp: id,
            subtasks: BTreeMap::from([(
                SubtaskId {
                    operator: OperatorId(1),
                    index: SubtaskIndex(0),
                },
                state,
            )]),
            master_states: BTreeMap::new(),
        }
    }

    fn paths(handles: Vec<StateHandle>) -> Vec<String> {
        handles.into_iter().map(|h| h.path).collect()
    }

    /// The coordinator's order: count the new checkpoint, then remove what
    /// it subsumes, then delete.
    fn complete(
        registry: &mut SharedStateRegistry,
        store: &mut CompletedCheckpointStore,
        checkpoint: CompletedCheckpoint,
    ) -> Vec<String> {
        registry.completed(&checkpoint);
        for subsumed in store.add(checkpoint) {
            registry.removed(&subsumed);
        }
        paths(registry.take_deletable())
    }

    #[test]
    fn a_file_goes_when_the_last_retained_checkpoint_using_it_is_subsumed() {
        let (mut r, mut store) = (SharedStateRegistry::new(), CompletedCheckpointStore::new(2));
        r.triggered(CheckpointId(1));
        assert!(complete(&mut r, &mut store, checkpoint(1, &[("a", 1), ("b", 1)])).is_empty());
        r.triggered(CheckpointId(2));
        assert!(complete(&mut r, &mut store, checkpoint(2, &[("b", 1), ("c", 2)])).is_empty());
        r.triggered(CheckpointId(3));
        assert_eq!(
            complete(&mut r, &mut store, checkpoint(3, &[("c", 2), ("d", 3)])),
            ["a"],
            "b is still in 2, which is retained"
        );
        r.triggered(CheckpointId(4));
        assert_eq!(
            complete(&mut r, &mut store, checkpoint(4, &[("d", 3)])),
            ["b"]
        );
        assert!(r.contains("c") && r.contains("d"));
    }

    #[test]
    fn a_released_file_waits_for_the_checkpoints_that_were_in_flight() {
        let (mut r, mut store) = (SharedStateRegistry::new(), CompletedCheckpointStore::new(1));
        r.triggered(CheckpointId(1));
        complete(&mut r, &mut store, checkpoint(1, &[("a", 1)]));
        // 2 and 3 are both in flight, based on 1; 2 compacted `a` away.
        r.triggered(CheckpointId(2));
        r.triggered(CheckpointId(3));
        assert!(
            complete(&mut r, &mut store, checkpoint(2, &[("b", 2)])).is_empty(),
            "3 may still reference a"
        );
        // 3 completes referencing `a`: it is taken up again, and 2's file
        // goes with 2.
        assert_eq!(
            complete(&mut r, &mut store, checkpoint(3, &[("a", 1), ("c", 3)])),
            ["b"]
        );
        assert!(r.contains("a"), "a is referenced by the retained 3");
    }

    #[test]
    fn a_released_file_goes_once_the_pending_checkpoints_abort() {
        let (mut r, mut store) = (SharedStateRegistry::new(), CompletedCheckpointStore::new(1));
        r.triggered(CheckpointId(1));
        complete(&mut r, &mut store, checkpoint(1, &[("a", 1)]));
        r.triggered(CheckpointId(2));
        r.triggered(CheckpointId(3));
        assert!(complete(&mut r, &mut store, checkpoint(2, &[("b", 2)])).is_empty());
        r.aborted(CheckpointId(3));
        assert_eq!(paths(r.take_deletable()), ["a"]);
        assert!(r.take_deletable().is_empty(), "deleted once");
    }

    #[test]
    fn rebuilt_counts_keep_what_the_retained_checkpoints_reference() {
        let retained = [
            checkpoint(4, &[("a", 1), ("b", 4)]),
            checkpoint(5, &[("b", 4), ("c", 5)]),
        ];
        let mut r = SharedStateRegistry::rebuild(&retained);
        r.removed(&retained[0]);
        assert_eq!(paths(r.take_deletable()), ["a"]);
        r.removed(&retained[1]);
        assert_eq!(paths(r.take_deletable()), ["b", "c"]);
    }

    #[derive(Clone, Debug)]
    enum Step {
        Trigger,
        /// Complete the pending checkpoint at this index, keeping a random
        /// subset of its base's files and adding one new file.
        Complete(prop::sample::Index, u8),
        Abort(prop::sample::Index),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            Just(Step::Trigger),
            (any::<prop::sample::Index>(), any::<u8>())
                .prop_map(|(i, keep)| Step::Complete(i, keep)),
            any::<prop::sample::Index>().prop_map(Step::Abort),
        ]
    }

    proptest! {
        /// Under any interleaving of triggers, completions (each based on
        /// the newest checkpoint completed before its trigger, as a subtask
        /// is) and aborts, with retain 1..3: a deleted file is never
        /// referenced by a retained checkpoint or by one that completes
        /// later; and once nothing is in flight, every file no retained
        /// checkpoint references has been deleted.
        #[test]
        fn deletes_exactly_the_files_nothing_can_reference(
            retain in 1usize..4,
            steps in prop::collection::vec(step(), 1..60),
        ) {
            let mut r = SharedStateRegistry::new();
            let mut store = CompletedCheckpointStore::new(retain);
            let mut next = 1u64;
            // Pending checkpoints with the files of the base they saw.
            let mut pending: Vec<(u64, Vec<(String, u64)>)> = Vec::new();
            let mut newest: Vec<(String, u64)> = Vec::new();
            let mut deleted: BTreeSet<String> = BTreeSet::new();
            let mut uploaded: BTreeSet<String> = BTreeSet::new();
            for step in steps {
                match step {
                    Step::Trigger => {
                        r.triggered(CheckpointId(next));
                        pending.push((next, newest.clone()));
                        next += 1;
                    }
                    Step::Complete(i, keep) if !pending.is_empty() => {
                        let (id, base) = pending.remove(i.index(pending.len()));
                        let mut files: Vec<(String, u64)> = base
                            .into_iter()
                            .enumerate()
                            .filter(|(n, _)| keep >> (n % 8) & 1 == 1)
                            .map(|(_, f)| f)
                            .collect();
                        files.push((format!("f{id}"), id));
                        uploaded.insert(format!("f{id}"));
                        for (path, _) in &files {
                            prop_assert!(!deleted.contains(path), "{} referenced by {} after deletion", path, id);
                        }
                        let refs: Vec<(&str, u64)> = files.iter().map(|(p, b)| (p.as_str(), *b)).collect();
                        let c = checkpoint(id, &refs);
                        if store.latest().is_none_or(|l| l.id.0 < id) {
                            newest = files.clone();
                        }
                        deleted.extend(complete(&mut r, &mut store, c));
                    }
                    Step::Abort(i) if !pending.is_empty() => {
                        let (id, _) = pending.remove(i.index(pending.len()));
                        r.aborted(CheckpointId(id));
                        deleted.extend(paths(r.take_deletable()));
                    }
                    _ => {}
                }
                let live: BTreeSet<&str> = store
                    .retained()
                    .flat_map(|c| c.subtasks.values())
                    .flat_map(|s| s.shared_files())
                    .map(|f| f.handle.path.as_str())
                    .collect();
                for path in &live {
                    prop_assert!(!deleted.contains(*path), "{} deleted while retained", path);
                }
                if pending.is_empty() {
                    for path in &uploaded {
                        prop_assert_eq!(
                            live.contains(path.as_str()),
                            !deleted.contains(path),
                            "{} with nothing in flight", path
                        );
                    }
                }
            }
        }
    }
}
