//! `SharedStateRegistry`: reference counts of the physical objects of
//! retained checkpoints, sans-IO, so that an object is deleted exactly when
//! nothing can reference it any more. The coordinator shell tells it which
//! checkpoints are triggered, completed, aborted and removed from the
//! retained set, and deletes what it returns.
//!
//! Physical objects are counted, not state objects: with file merging a
//! physical file holds segments of several state objects, and it is live
//! while any retained checkpoint references any segment of it. Each physical
//! file is counted once per retained checkpoint that references it.
//!
//! Deletion is never decided while a checkpoint is half processed (seed 002
//! §2.2): `completed` and `removed` first apply every reference of the whole
//! checkpoint and only then release what ended up unreferenced. A released
//! object is deleted once every checkpoint that was pending at its release
//! has ended, if no checkpoint that completed meanwhile took it up again. A
//! checkpoint in flight may have been based on an older completed checkpoint
//! and reference it without having acknowledged yet; checkpoints triggered
//! after the release cannot: a subtask bases its next snapshot on the newest
//! checkpoint it was notified of, and the notification of the checkpoint
//! that caused the release reached it before their barriers.
//!
//! Shared files (RocksDB SSTs) are also known by key: two concurrent
//! checkpoints based on the same one upload the same new SST twice. As in
//! Flink, the checkpoint that completes second drops its own copy for one
//! already registered under the key (`completed` rewrites its handles before
//! its metadata is written). A subtask bases later snapshots on its own
//! upload, so a handle to a dropped copy may come back: it is resolved by key
//! again. Keys, like files, are released only when no retained or pending
//! checkpoint can still use them.
//!
//! Space amplification (seed 002 §2.3): bytes of a physical file that no
//! retained checkpoint references are wasted until the whole file goes. A
//! file above `max_space_amplification` (total / live bytes) is compacted:
//! `compactions` names the shared files each subtask's next snapshot must
//! upload again instead of reusing them; their new copies replace the old
//! ones under the same keys, and the old file goes once the checkpoints
//! referencing it are subsumed.

use super::{CompletedCheckpoint, NativeFileHandle, SharedKey, StateHandle, SubtaskState};
use crate::model::ids::{CheckpointId, SubtaskId};
use std::collections::{BTreeMap, BTreeSet};

/// Retained checkpoints referencing something, and the checkpoints that
/// were pending when that number last reached zero and are still running.
#[derive(Debug, Default)]
struct Count {
    references: usize,
    released: Option<BTreeSet<CheckpointId>>,
}

impl Count {
    fn take_up(&mut self) {
        self.references += 1;
        self.released = None;
    }

    fn drop_reference(&mut self) {
        self.references = self.references.saturating_sub(1);
    }

    /// Starts the wait for `pending` if nothing references it (any more).
    fn release(&mut self, pending: &BTreeSet<CheckpointId>) {
        if self.references == 0 && self.released.is_none() {
            self.released = Some(pending.clone());
        }
    }

    fn ended(&mut self, checkpoint: CheckpointId) {
        if let Some(pending) = &mut self.released {
            pending.remove(&checkpoint);
        }
    }

    fn deletable(&self) -> bool {
        self.references == 0 && self.released.as_ref().is_some_and(BTreeSet::is_empty)
    }
}

/// The handle `key` is known by that is `file`'s.
fn keyed_handle<'a>(
    keys: &'a mut BTreeMap<SharedKey, Vec<KeyedHandle>>,
    key: &SharedKey,
    file: &NativeFileHandle,
) -> Option<&'a mut KeyedHandle> {
    keys.get_mut(key)?
        .iter_mut()
        .find(|h| h.file.handle == file.handle)
}

/// What of one physical file the retained checkpoints reference.
#[derive(Debug, Default)]
struct FileReferences {
    /// By offset: length, and retained checkpoints referencing the segment.
    segments: BTreeMap<u64, (u64, usize)>,
    count: Count,
}

impl FileReferences {
    /// A file holds its segments back to back from offset 0 (a whole object
    /// is one segment), so its size is the end of the last one. After a
    /// restart only referenced segments are known: a dropped copy at the end
    /// of a file is not counted then.
    fn space(&self) -> Space {
        Space {
            total: self
                .segments
                .iter()
                .map(|(offset, (size, _))| offset + size)
                .max()
                .unwrap_or(0),
            live: self
                .segments
                .values()
                .filter(|(_, references)| *references > 0)
                .map(|(size, _)| size)
                .sum(),
        }
    }
}

/// One handle a key is known by, counted like files: a handle stays usable
/// for the key while a retained or pending checkpoint can use it.
#[derive(Debug)]
struct KeyedHandle {
    file: NativeFileHandle,
    count: Count,
}

/// Bytes stored and bytes some retained checkpoint references.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Space {
    /// Bytes stored.
    pub total: u64,
    /// Bytes some retained checkpoint references.
    pub live: u64,
}

impl Space {
    /// Total over live bytes: 1 when nothing is wasted.
    pub fn amplification(&self) -> f64 {
        match (self.total, self.live) {
            (0, _) => 1.0,
            (_, 0) => f64::INFINITY,
            (total, live) => total as f64 / live as f64,
        }
    }
}

/// Space amplification above which a merged file is compacted, by default.
pub const DEFAULT_MAX_SPACE_AMPLIFICATION: f64 = 1.5;

/// Flink's `SharedStateRegistry`, sans-IO: see the module documentation.
#[derive(Debug)]
pub struct SharedStateRegistry {
    files: BTreeMap<String, FileReferences>,
    keys: BTreeMap<SharedKey, Vec<KeyedHandle>>,
    pending: BTreeSet<CheckpointId>,
    max_space_amplification: f64,
}

impl Default for SharedStateRegistry {
    fn default() -> Self {
        SharedStateRegistry {
            files: BTreeMap::new(),
            keys: BTreeMap::new(),
            pending: BTreeSet::new(),
            max_space_amplification: DEFAULT_MAX_SPACE_AMPLIFICATION,
        }
    }
}

impl SharedStateRegistry {
    /// An empty registry with the default maximum space amplification.
    pub fn new() -> Self {
        Self::default()
    }

    /// Compacts files whose space amplification exceeds `max`.
    pub fn with_max_space_amplification(mut self, max: f64) -> Self {
        self.max_space_amplification = max;
        self
    }

    /// The counts after a coordinator restart: the retained checkpoints'
    /// references, with nothing pending. Their metadata was written after
    /// registration, so they agree on the handle of every key.
    pub fn rebuild<'a>(retained: impl IntoIterator<Item = &'a CompletedCheckpoint>) -> Self {
        let mut registry = Self::new();
        for checkpoint in retained {
            registry.reference(checkpoint);
        }
        registry
    }

    /// `checkpoint` is pending: objects released from now on wait for it to
    /// end before they are deleted.
    pub fn triggered(&mut self, checkpoint: CheckpointId) {
        self.pending.insert(checkpoint);
    }

    /// `checkpoint`, all acknowledged, joins the retained checkpoints; call
    /// it before writing its metadata, which must hold the handles as
    /// rewritten here. A shared file another checkpoint registered under
    /// the same key replaces the checkpoint's own copy (unless the
    /// registered one is being compacted away); a copy nothing references
    /// then is released once the whole checkpoint is counted, while its
    /// file lives on if another segment of it is referenced.
    pub fn completed(&mut self, checkpoint: &mut CompletedCheckpoint) {
        let id = checkpoint.id;
        let mut written = BTreeSet::new();
        for state in checkpoint.subtasks.values() {
            for handle in state.written_by(id) {
                written.extend(self.track(handle).map(|(path, _)| path));
            }
        }
        let compacted = self.compacted_files();
        for (subtask, state) in checkpoint.subtasks.iter_mut() {
            for file in state.shared_files_mut() {
                if let Some(registered) = self.resolve(*subtask, file, id, &compacted) {
                    *file = registered;
                }
            }
        }
        self.reference(checkpoint);
        for path in &written {
            if let Some(file) = self.files.get_mut(path) {
                file.count.release(&self.pending);
            }
        }
        self.ended(id);
    }

    /// `checkpoint` will never complete.
    pub fn aborted(&mut self, checkpoint: CheckpointId) {
        self.ended(checkpoint);
    }

    /// No pending checkpoint will complete (those already passed to
    /// `completed` are not pending).
    pub fn abort_all(&mut self) {
        for checkpoint in std::mem::take(&mut self.pending) {
            self.ended(checkpoint);
        }
    }

    /// `checkpoint` left the retained checkpoints (subsumed, discarded, or
    /// its metadata could not be written after `completed`).
    pub fn removed(&mut self, checkpoint: &CompletedCheckpoint) {
        let References {
            paths,
            segments,
            keyed,
        } = references(checkpoint);
        for path in &paths {
            if let Some(file) = self.files.get_mut(*path) {
                file.count.drop_reference();
            }
        }
        for (path, offset) in segments {
            if let Some((_, references)) = self
                .files
                .get_mut(path)
                .and_then(|f| f.segments.get_mut(&offset))
            {
                *references = references.saturating_sub(1);
            }
        }
        for (key, file) in &keyed {
            if let Some(handle) = keyed_handle(&mut self.keys, key, file) {
                handle.count.drop_reference();
            }
        }
        // Only now, with the whole checkpoint accounted for.
        for path in &paths {
            if let Some(file) = self.files.get_mut(*path) {
                file.count.release(&self.pending);
            }
        }
        for (key, file) in &keyed {
            if let Some(handle) = keyed_handle(&mut self.keys, key, file) {
                handle.count.release(&self.pending);
            }
        }
    }

    /// Physical objects that no retained checkpoint references and no
    /// checkpoint in flight can still take up: the caller deletes them.
    pub fn take_deletable(&mut self) -> Vec<String> {
        let deletable: Vec<String> = self
            .files
            .iter()
            .filter(|(_, f)| f.count.deletable())
            .map(|(path, _)| path.clone())
            .collect();
        for path in &deletable {
            self.files.remove(path);
        }
        for handles in self.keys.values_mut() {
            handles.retain(|h| !h.count.deletable());
        }
        self.keys.retain(|_, handles| !handles.is_empty());
        deletable
    }

    /// Physical objects that the snapshots of `checkpoint` in `states` wrote
    /// and that the registry does not count: what to delete when that
    /// checkpoint is discarded. One registered by `completed` whose metadata
    /// then failed is left to `removed`, since a checkpoint completing
    /// meanwhile may use it.
    pub fn discardable(&self, checkpoint: CheckpointId, states: &[SubtaskState]) -> Vec<String> {
        let written: BTreeSet<&str> = states
            .iter()
            .flat_map(|s| s.objects_written_by(checkpoint))
            .collect();
        written
            .into_iter()
            .filter(|path| !self.files.contains_key(*path))
            .map(str::to_owned)
            .collect()
    }

    /// Whether the object at `path` is counted, referenced or released.
    pub fn contains(&self, path: &str) -> bool {
        self.files.contains_key(path)
    }

    /// Counted physical objects that some retained checkpoint references.
    pub fn physical_files_live(&self) -> usize {
        self.files
            .values()
            .filter(|f| f.count.references > 0)
            .count()
    }

    /// Space of every counted object (released ones included until they
    /// are deleted).
    pub fn space(&self) -> Space {
        self.files
            .values()
            .map(FileReferences::space)
            .fold(Space::default(), |a, b| Space {
                total: a.total + b.total,
                live: a.live + b.live,
            })
    }

    /// Space of the counted object at `path`, if it is counted.
    pub fn file_space(&self, path: &str) -> Option<Space> {
        self.files.get(path).map(FileReferences::space)
    }

    /// Per subtask, the shared files its next snapshot must upload again
    /// rather than reuse: those that retained checkpoints reference only
    /// inside compacted files. A file is compacted once it is closed (its
    /// checkpoint completed: only then is the registry told of it) and its
    /// space amplification exceeds the maximum.
    pub fn compactions(&self) -> BTreeMap<SubtaskId, BTreeSet<SharedKey>> {
        let compacted = self.compacted_files();
        let mut out: BTreeMap<SubtaskId, BTreeSet<SharedKey>> = BTreeMap::new();
        for (key, handles) in &self.keys {
            let mut referenced = handles.iter().filter(|h| h.count.references > 0).peekable();
            if referenced.peek().is_some() && referenced.all(|h| in_any(&h.file.handle, &compacted))
            {
                out.entry(key.subtask).or_default().insert(key.clone());
            }
        }
        out
    }

    fn compacted_files(&self) -> BTreeSet<&str> {
        self.files
            .iter()
            .filter(|(_, f)| {
                f.count.references > 0 && f.space().amplification() > self.max_space_amplification
            })
            .map(|(path, _)| path.as_str())
            .collect()
    }

    /// The handle a shared file of a completing checkpoint must use instead
    /// of its own, if any: its own is kept if still usable for the key, or a
    /// fresh upload with nothing usable outside compacted files.
    fn resolve(
        &self,
        subtask: SubtaskId,
        file: &NativeFileHandle,
        checkpoint: CheckpointId,
        compacted: &BTreeSet<&str>,
    ) -> Option<NativeFileHandle> {
        let handles = self.keys.get(&SharedKey::of(subtask, file))?;
        let usable = || handles.iter().filter(|h| !h.count.deletable());
        if usable().any(|h| h.file.handle == file.handle) {
            return None;
        }
        let fresh = file.uploaded_by == checkpoint;
        usable()
            .filter(|h| !(fresh && in_any(&h.file.handle, compacted)))
            .max_by_key(|h| (h.count.references, h.file.uploaded_by))
            .map(|h| h.file.clone())
    }

    /// Knows the segment of `handle`, if it has a physical object.
    fn track(&mut self, handle: &StateHandle) -> Option<(String, u64)> {
        let path = handle.physical()?;
        let file = self.files.entry(path.to_owned()).or_default();
        let offset = handle.range().start;
        file.segments.entry(offset).or_insert((handle.size(), 0));
        Some((path.to_owned(), offset))
    }

    fn reference(&mut self, checkpoint: &CompletedCheckpoint) {
        for handle in checkpoint.subtasks.values().flat_map(SubtaskState::handles) {
            self.track(handle);
        }
        let References {
            paths,
            segments,
            keyed,
        } = references(checkpoint);
        for path in paths {
            self.files
                .get_mut(path)
                .expect("tracked above")
                .count
                .take_up();
        }
        for (path, offset) in segments {
            let file = self.files.get_mut(path).expect("tracked above");
            file.segments.get_mut(&offset).expect("tracked above").1 += 1;
        }
        for (key, file) in keyed {
            let handles = self.keys.entry(key.clone()).or_default();
            let at = match handles.iter().position(|h| h.file.handle == file.handle) {
                Some(at) => at,
                None => {
                    handles.push(KeyedHandle {
                        file: file.clone(),
                        count: Count::default(),
                    });
                    handles.len() - 1
                }
            };
            handles[at].count.take_up();
        }
    }

    fn ended(&mut self, checkpoint: CheckpointId) {
        self.pending.remove(&checkpoint);
        for file in self.files.values_mut() {
            file.count.ended(checkpoint);
        }
        for handle in self.keys.values_mut().flatten() {
            handle.count.ended(checkpoint);
        }
    }
}

fn in_any(handle: &StateHandle, files: &BTreeSet<&str>) -> bool {
    handle.physical().is_some_and(|p| files.contains(p))
}

/// What a checkpoint references, each once however many handles name it.
#[derive(Default)]
struct References<'a> {
    paths: BTreeSet<&'a str>,
    /// (physical object, offset).
    segments: BTreeSet<(&'a str, u64)>,
    keyed: BTreeMap<SharedKey, &'a NativeFileHandle>,
}

fn references(checkpoint: &CompletedCheckpoint) -> References<'_> {
    let mut out = References::default();
    for (subtask, state) in &checkpoint.subtasks {
        for handle in state.handles() {
            if let Some(path) = handle.physical() {
                out.paths.insert(path);
                out.segments.insert((path, handle.range().start));
            }
        }
        for file in state.shared_files() {
            out.keyed.insert(SharedKey::of(*subtask, file), file);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::merging::MergingConfig;
    use crate::checkpoint::store::CompletedCheckpointStore;
    use crate::model::ids::{OperatorId, SubtaskIndex};
    use crate::model::rng::SplitMix64;
    use crate::testkit::native;
    use proptest::prelude::*;

    fn subtask() -> SubtaskId {
        SubtaskId {
            operator: OperatorId(1),
            index: SubtaskIndex(0),
        }
    }

    fn segment(path: &str, offset: u64, size: u64) -> StateHandle {
        StateHandle::Segment {
            path: path.to_owned(),
            offset,
            size,
            checksum: 0,
        }
    }

    fn sst(name: &str, handle: StateHandle, uploaded_by: u64) -> NativeFileHandle {
        NativeFileHandle {
            name: name.to_owned(),
            handle,
            uploaded_by: CheckpointId(uploaded_by),
            instance: 7,
        }
    }

    fn of(id: u64, state: SubtaskState) -> CompletedCheckpoint {
        let mut checkpoint = crate::testkit::checkpoint(id);
        checkpoint.subtasks.insert(subtask(), state);
        checkpoint
    }

    /// A checkpoint of one subtask whose database holds `files`, each a
    /// whole object as (path, checkpoint that uploaded it).
    fn checkpoint(id: u64, files: &[(&str, u64)]) -> CompletedCheckpoint {
        let shared = files
            .iter()
            .map(|(path, by)| sst(path, StateHandle::object(*path, 1, 0), *by))
            .collect();
        of(id, native(shared, Vec::new()))
    }

    /// The coordinator's order: register the new checkpoint (rewriting its
    /// handles), then remove what it subsumes, then delete.
    fn complete(
        registry: &mut SharedStateRegistry,
        store: &mut CompletedCheckpointStore,
        mut checkpoint: CompletedCheckpoint,
    ) -> Vec<String> {
        registry.completed(&mut checkpoint);
        for subsumed in store.add(checkpoint) {
            registry.removed(&subsumed);
        }
        registry.take_deletable()
    }

    fn retained(store: &CompletedCheckpointStore, id: u64) -> &CompletedCheckpoint {
        store
            .retained()
            .find(|c| c.id == CheckpointId(id))
            .expect("retained")
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
        assert_eq!(r.take_deletable(), ["a"]);
        assert!(r.take_deletable().is_empty(), "deleted once");
    }

    /// Seed 002 §2.2 with max concurrent 2: chk-2 and chk-3 are both based
    /// on chk-1 and both upload 4.sst; chk-3 puts 5.sst in the same
    /// physical file as its copy. chk-2 completes first, so chk-3 drops its
    /// copy for chk-2's. Deciding at the moment that copy's count passes
    /// through zero would delete 5.sst with it.
    #[test]
    fn a_dropped_duplicate_leaves_the_segments_beside_it_alone() {
        let (mut r, mut store) = (SharedStateRegistry::new(), CompletedCheckpointStore::new(1));
        let (f1, f2, f3, f4) = (
            "merged/chk-1",
            "merged/chk-2",
            "merged/chk-3",
            "merged/chk-4",
        );
        let chk1: Vec<NativeFileHandle> = ["1.sst", "2.sst", "3.sst"]
            .iter()
            .zip(0..)
            .map(|(name, i)| sst(name, segment(f1, i * 10, 10), 1))
            .collect();
        let manifest = |id, path| sst("MANIFEST", segment(path, 0, 5), id);
        let mut deleted = Vec::new();
        r.triggered(CheckpointId(1));
        let first = native(chk1.clone(), vec![manifest(1, f1)]);
        deleted.extend(complete(&mut r, &mut store, of(1, first)));
        r.triggered(CheckpointId(2));
        r.triggered(CheckpointId(3));
        let mut second = chk1.clone();
        second.push(sst("4.sst", segment(f2, 0, 10), 2));
        let mut third = chk1.clone();
        third.push(sst("4.sst", segment(f3, 0, 10), 3));
        third.push(sst("5.sst", segment(f3, 10, 10), 3));
        deleted.extend(complete(&mut r, &mut store, of(2, native(second, vec![]))));
        deleted.extend(complete(
            &mut r,
            &mut store,
            of(3, native(third.clone(), vec![])),
        ));

        let chk3 = retained(&store, 3);
        let by_name: BTreeMap<&str, &NativeFileHandle> = chk3.subtasks[&subtask()]
            .shared_files()
            .map(|f| (f.name.as_str(), f))
            .collect();
        assert_eq!(*by_name["4.sst"], sst("4.sst", segment(f2, 0, 10), 2));
        assert_eq!(*by_name["5.sst"], sst("5.sst", segment(f3, 10, 10), 3));
        assert!(deleted.is_empty(), "{deleted:?}");
        // chk-3 restores: every object it references is still there.
        assert_eq!(chk3.objects(), BTreeSet::from([f1, f2, f3]));
        assert_eq!(
            r.file_space(f3),
            Some(Space {
                total: 20,
                live: 10
            })
        );

        // The subtask bases chk-4 on its own upload for chk-3, so the
        // dropped copy comes back; it is resolved to chk-2's again.
        r.triggered(CheckpointId(4));
        let fourth = vec![
            third[3].clone(),
            third[4].clone(),
            sst("6.sst", segment(f4, 0, 10), 4),
        ];
        deleted.extend(complete(&mut r, &mut store, of(4, native(fourth, vec![]))));
        assert_eq!(deleted, [f1], "1-3.sst were compacted away");
        let chk4 = retained(&store, 4);
        assert_eq!(chk4.objects(), BTreeSet::from([f2, f3, f4]));
        assert_eq!(r.physical_files_live(), 3);
    }

    #[test]
    fn a_dropped_duplicate_alone_in_its_file_goes_once_its_checkpoint_is_registered() {
        let (mut r, mut store) = (SharedStateRegistry::new(), CompletedCheckpointStore::new(2));
        r.triggered(CheckpointId(1));
        r.triggered(CheckpointId(2));
        let own = |id: u64| {
            of(
                id,
                native(
                    vec![sst("4.sst", segment(&format!("m{id}"), 0, 10), id)],
                    vec![],
                ),
            )
        };
        assert!(complete(&mut r, &mut store, own(1)).is_empty());
        r.triggered(CheckpointId(3));
        assert!(
            complete(&mut r, &mut store, own(2)).is_empty(),
            "3 is in flight: it cannot use 2's copy, but it is not sure yet"
        );
        r.aborted(CheckpointId(3));
        assert_eq!(r.take_deletable(), ["m2"]);
        assert_eq!(retained(&store, 2).objects(), BTreeSet::from(["m1"]));
    }

    #[test]
    fn a_checkpoint_whose_metadata_failed_leaves_its_files_to_the_registry() {
        let mut r = SharedStateRegistry::new();
        r.triggered(CheckpointId(2));
        r.triggered(CheckpointId(3));
        let own = |id: u64| {
            native(
                vec![sst("4.sst", segment(&format!("m{id}"), 0, 10), id)],
                vec![],
            )
        };
        let mut second = of(2, own(2));
        r.completed(&mut second);
        // 3 completes while 2's metadata is being written, and takes 2's copy.
        let mut third = of(3, own(3));
        r.completed(&mut third);
        assert_eq!(third.objects(), BTreeSet::from(["m2"]));
        assert_eq!(r.take_deletable(), ["m3"]);
        // 2's metadata fails: its acks must not be deleted behind the
        // registry's back, and the registry keeps what 3 uses.
        assert!(r.discardable(CheckpointId(2), &[own(2)]).is_empty());
        r.removed(&second);
        assert!(r.take_deletable().is_empty());
        assert!(r.contains("m2"));
        // A checkpoint never registered is the discarding caller's to delete.
        r.triggered(CheckpointId(4));
        r.aborted(CheckpointId(4));
        assert_eq!(r.discardable(CheckpointId(4), &[own(4)]), ["m4"]);
    }

    /// A chain of checkpoints of one subtask: each writes a file of its own
    /// holding its MANIFEST and one new SST, and keeps the two SSTs before.
    fn chain(id: u64) -> CompletedCheckpoint {
        let file = |id: u64| format!("merged/chk-{id}");
        let shared = (id.saturating_sub(2).max(1)..=id)
            .map(|n| sst(&format!("{n}.sst"), segment(&file(n), 5, 10), n))
            .collect();
        of(
            id,
            native(shared, vec![sst("MANIFEST", segment(&file(id), 0, 5), id)]),
        )
    }

    #[test]
    fn rebuilt_counts_delete_what_the_running_registry_would() {
        let mut running = SharedStateRegistry::new();
        let mut store = CompletedCheckpointStore::new(2);
        for id in 1..=5 {
            running.triggered(CheckpointId(id));
            complete(&mut running, &mut store, chain(id));
        }
        let mut rebuilt = SharedStateRegistry::rebuild(store.retained());
        let mut rebuilt_store = CompletedCheckpointStore::new(2);
        for c in store.retained() {
            rebuilt_store.add(c.clone());
        }
        assert_eq!(rebuilt.space(), running.space());
        for id in 6..=9 {
            running.triggered(CheckpointId(id));
            rebuilt.triggered(CheckpointId(id));
            let expected = complete(&mut running, &mut store, chain(id));
            assert!(!expected.is_empty());
            assert_eq!(
                complete(&mut rebuilt, &mut rebuilt_store, chain(id)),
                expected,
                "chk-{id}"
            );
            assert_eq!(rebuilt.space(), running.space());
        }
    }

    #[test]
    fn a_compacted_file_is_rewritten_by_the_next_checkpoint_and_then_goes() {
        let (mut r, mut store) = (SharedStateRegistry::new(), CompletedCheckpointStore::new(1));
        // chk-1 writes four SSTs in one file; RocksDB then compacts three of
        // them away: 40 bytes stored, 10 live.
        let four = ["1.sst", "2.sst", "3.sst", "4.sst"]
            .iter()
            .zip(0..)
            .map(|(name, i)| sst(name, segment("m1", i * 10, 10), 1))
            .collect();
        r.triggered(CheckpointId(1));
        complete(&mut r, &mut store, of(1, native(four, vec![])));
        assert!(r.compactions().is_empty());
        let kept = retained(&store, 1).subtasks[&subtask()]
            .shared_files()
            .nth(3)
            .cloned()
            .unwrap();
        r.triggered(CheckpointId(2));
        let second = vec![kept.clone(), sst("5.sst", segment("m2", 0, 30), 2)];
        assert!(complete(&mut r, &mut store, of(2, native(second, vec![]))).is_empty());
        assert_eq!(r.file_space("m1").unwrap().amplification(), 4.0);
        assert_eq!(
            r.compactions(),
            BTreeMap::from([(subtask(), BTreeSet::from([SharedKey::of(subtask(), &kept)]))])
        );
        // chk-3 uploads 4.sst again into its own file: its copy wins.
        r.triggered(CheckpointId(3));
        let third = vec![
            sst("4.sst", segment("m3", 0, 10), 3),
            sst("5.sst", segment("m2", 0, 30), 2),
        ];
        assert_eq!(
            complete(&mut r, &mut store, of(3, native(third, vec![]))),
            ["m1"]
        );
        assert_eq!(retained(&store, 3).objects(), BTreeSet::from(["m2", "m3"]));
        assert!(r.compactions().is_empty());
        assert_eq!(
            r.space(),
            Space {
                total: 40,
                live: 40
            }
        );
    }

    /// A subtask's native snapshot at the trigger of `id`, as the shell makes
    /// it: the `small` private files, the SSTs of `db` reused from `base`
    /// unless the registry asks to rewrite them, the others placed by
    /// `options` (inline below its threshold). Returns the state and the
    /// physical files it wrote.
    fn snapshot(
        r: &mut SharedStateRegistry,
        options: &MergingConfig,
        id: u64,
        base: &BTreeMap<String, NativeFileHandle>,
        small: &[(&str, u64)],
        db: &[(String, u64)],
    ) -> (SubtaskState, Vec<String>) {
        r.triggered(CheckpointId(id));
        let rewrite = r.compactions().remove(&subtask()).unwrap_or_default();
        let reused = |name: &str| {
            base.get(name)
                .filter(|f| !rewrite.contains(&SharedKey::of(subtask(), f)))
                .cloned()
        };
        let uploads: Vec<&(String, u64)> = db.iter().filter(|(n, _)| reused(n).is_none()).collect();
        let sizes: Vec<u64> = small
            .iter()
            .map(|(_, s)| *s)
            .chain(uploads.iter().map(|(_, s)| *s))
            .collect();
        let plan = options.plan(subtask(), CheckpointId(id), 0, &sizes);
        let handle = |i: usize| {
            plan.handle(i, 0)
                .unwrap_or_else(|| StateHandle::Inline(vec![0; sizes[i] as usize]))
        };
        let private = small
            .iter()
            .enumerate()
            .map(|(i, (name, _))| sst(name, handle(i), id))
            .collect();
        let mut fresh = small.len()..;
        let shared = db
            .iter()
            .map(|(name, _)| {
                reused(name)
                    .unwrap_or_else(|| sst(name, handle(fresh.next().expect("unbounded")), id))
            })
            .collect();
        let files = plan.files.iter().map(|f| f.path.clone()).collect();
        (native(shared, private), files)
    }

    /// One subtask's RocksDB over hundreds of checkpoints with retain 3:
    /// flushes add SSTs, compactions merge a few into one, the small files
    /// go inline. Returns the largest overall space amplification seen after
    /// the first 50 checkpoints.
    fn churn(max_space_amplification: f64) -> f64 {
        const KIB: u64 = 1024;
        const MIB: u64 = 1024 * KIB;
        let options = MergingConfig::default();
        let mut rng = SplitMix64::new(42);
        let mut r =
            SharedStateRegistry::new().with_max_space_amplification(max_space_amplification);
        let mut store = CompletedCheckpointStore::new(3);
        let mut db: Vec<(String, u64)> = Vec::new();
        let mut base: BTreeMap<String, NativeFileHandle> = BTreeMap::new();
        let mut max_seen: f64 = 1.0;
        for id in 1..=400u64 {
            for n in 0..3 {
                db.push((format!("{id}-{n}.sst"), MIB / 4 + rng.next_below(2 * MIB)));
            }
            if db.len() > 30 {
                let mut size = 0;
                for _ in 0..4 + rng.next_below(5) {
                    size += db.swap_remove(rng.next_below(db.len() as u64) as usize).1;
                }
                db.push((format!("{id}-c.sst"), size * 9 / 10));
            }
            let small = [
                ("MANIFEST", 4 * KIB + id * 64),
                ("OPTIONS", 7 * KIB),
                ("CURRENT", 16),
            ];
            let (state, _) = snapshot(&mut r, &options, id, &base, &small, &db);
            base = state
                .shared_files()
                .map(|f| (f.name.clone(), f.clone()))
                .collect();
            complete(&mut r, &mut store, of(id, state));
            if id > 50 {
                max_seen = max_seen.max(r.space().amplification());
            }
        }
        max_seen
    }

    #[test]
    fn compaction_keeps_steady_state_space_amplification_at_or_below_the_maximum() {
        let with = churn(DEFAULT_MAX_SPACE_AMPLIFICATION);
        let without = churn(f64::INFINITY);
        println!(
            "steady-state space amplification: max {with:.3} with compaction, {without:.3} without"
        );
        assert!(with <= DEFAULT_MAX_SPACE_AMPLIFICATION, "{with}");
        assert!(without > with, "{without} without compaction");
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
                        deleted.extend(r.take_deletable());
                    }
                    _ => {}
                }
                let live: BTreeSet<&str> = store
                    .retained()
                    .flat_map(|c| c.subtasks.values())
                    .flat_map(|s| s.shared_files())
                    .filter_map(|f| f.handle.physical())
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

    #[derive(Clone, Debug)]
    enum Op {
        /// The database flushes 1-3 new SSTs and compacts away those the
        /// mask picks, then a checkpoint is triggered (if a slot is free).
        Trigger {
            flushes: u8,
            compacted: u8,
        },
        Complete(prop::sample::Index),
        Abort(prop::sample::Index),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (any::<u8>(), any::<u8>())
                .prop_map(|(flushes, compacted)| Op::Trigger { flushes, compacted }),
            any::<prop::sample::Index>().prop_map(Op::Complete),
            any::<prop::sample::Index>().prop_map(Op::Abort),
        ]
    }

    proptest! {
        /// Merged files under max concurrent 2, as the shells run them: a
        /// subtask snapshots its database into segments of files of its
        /// own, reuses what its newest notified checkpoint uploaded (its own
        /// ack, so also copies the registry dropped), re-uploads what the
        /// registry asks to compact; checkpoints complete or abort in any
        /// order, older ones subsumed at retain 1..3. No object is deleted
        /// while a retained checkpoint references it, no completing
        /// checkpoint ends up referencing a deleted object, nothing is
        /// deleted twice, and once nothing is in flight exactly the written
        /// objects no retained checkpoint references are gone.
        #[test]
        fn merged_files_go_exactly_when_nothing_can_reference_them(
            retain in 1usize..4,
            ops in prop::collection::vec(op(), 1..80),
        ) {
            let options = MergingConfig { inline_threshold: 3, max_file_size: 30 };
            let mut r = SharedStateRegistry::new();
            let mut store = CompletedCheckpointStore::new(retain);
            let mut db: Vec<(String, u64)> = Vec::new();
            let mut base: BTreeMap<String, NativeFileHandle> = BTreeMap::new();
            let mut notified = 0;
            let mut pending: Vec<(u64, SubtaskState)> = Vec::new();
            let mut next = 1u64;
            let mut written: BTreeSet<String> = BTreeSet::new();
            let mut deleted: BTreeSet<String> = BTreeSet::new();
            for op in ops {
                let mut gone = Vec::new();
                match op {
                    Op::Trigger { flushes, compacted } if pending.len() < 2 => {
                        db = db
                            .into_iter()
                            .enumerate()
                            .filter(|(i, _)| compacted >> (i % 8) & 1 == 0)
                            .map(|(_, file)| file)
                            .collect();
                        for _ in 0..flushes % 3 + 1 {
                            db.push((format!("{next}-{}.sst", db.len()), 10));
                        }
                        let id = next;
                        next += 1;
                        // MANIFEST goes in the file, CURRENT inline.
                        let small = [("MANIFEST", 8), ("CURRENT", 2)];
                        let (state, files) = snapshot(&mut r, &options, id, &base, &small, &db);
                        written.extend(files);
                        pending.push((id, state));
                    }
                    Op::Complete(i) if !pending.is_empty() => {
                        let (id, state) = pending.remove(i.index(pending.len()));
                        let mut c = of(id, state.clone());
                        r.completed(&mut c);
                        for object in c.objects() {
                            prop_assert!(!deleted.contains(object), "{} used by {} after its deletion", object, id);
                        }
                        if id > notified {
                            notified = id;
                            base = state.shared_files().map(|f| (f.name.clone(), f.clone())).collect();
                        }
                        for subsumed in store.add(c) {
                            r.removed(&subsumed);
                        }
                        gone.extend(r.take_deletable());
                    }
                    Op::Abort(i) if !pending.is_empty() => {
                        let (id, state) = pending.remove(i.index(pending.len()));
                        r.aborted(CheckpointId(id));
                        gone.extend(r.discardable(CheckpointId(id), &[state]));
                        gone.extend(r.take_deletable());
                    }
                    _ => {}
                }
                for path in gone {
                    prop_assert!(deleted.insert(path.clone()), "{} deleted twice", path);
                }
                let live: BTreeSet<&str> = store.retained().flat_map(CompletedCheckpoint::objects).collect();
                for path in &live {
                    prop_assert!(!deleted.contains(*path), "{} deleted while retained", path);
                }
                if pending.is_empty() {
                    for path in &written {
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
