//! The embedded-store backend: keyed state in a [`Database`] (RocksDB,
//! from the `tidemark-rocksdb` crate) behind a write-back cache of typed
//! values.
//!
//! The cache turns a read-modify-write per record into one read per key
//! and one sorted, batched write per write-back. What the cache misses of a
//! batch's keys is read ahead, before its records run, in one sorted
//! multi-get per state that records read.
//!
//! A cache over a database that opened empty holds every value until it
//! first evicts, key groups restored into it included: a key it misses has
//! none, so nothing is read, and added values are whole. Otherwise
//! reducing states add without reading: a key the cache misses is cached with only what was added to it, written
//! back as a merge operand, and the column family's merge operator (the
//! state's reduce function)
//! combines operands and values when the store reads, flushes or compacts.
//! A record whose key is beyond the cache then costs one memtable insert
//! instead of a lookup and an insert (not with TTL: see `ttl::TtlReduce`): wordcount on RocksDB at 1,000,000
//! keys with a 65,536-value cache went from 0.48-0.57 to 0.87-1.08 M
//! records/s (six interleaved runs each).

use super::heap::{
    prefetch_lookup, read_group, table_hash, Copied, HeapSnapshot, Prefetch, SharedTable,
};
use super::snapshot::{KeyedSnapshot, NativeCheckpoint, RestoreState};
use super::store::{
    checkpoint_dir, write_key, ColumnFamily, Database, EmbeddedStore, MergeFunction, SortedWrites,
    MAX_KEY_GROUPS,
};
use super::ttl::{Form, StateTtlConfig, TtlClock};
use super::write_back::{hand_over, Away, Job, Taken};
use super::{Key, KeySlot, Reduce, ReduceFunction, StateError};
use crate::model::batch::Data;
use crate::model::ids::{CheckpointId, KeyGroup};
use crate::model::key_group::KeyGroupRange;
use crate::time::Millis;
use hashbrown::{hash_table, HashTable};
use std::any::Any;
use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;

/// A value as an entry sees it: read once from the database, changed in
/// place, written back by the cache when `dirty`.
pub(crate) struct CachedValue<S> {
    pub(crate) value: Option<S>,
    /// Not in the database as it is: the next write-back writes it.
    dirty: bool,
    /// Changed since the last checkpoint or write-back (a checkpoint in
    /// the heap format leaves values dirty): how a whole cache judges its
    /// churn.
    changed: bool,
    /// A reducing state's key whose stored value was not read: `value`
    /// holds what was added since it was cached or last written back,
    /// which is written back as a merge operand. Entries never see it:
    /// they resolve it first.
    partial: bool,
}

impl<S> CachedValue<S> {
    fn new(value: Option<S>) -> Self {
        CachedValue {
            value,
            dirty: false,
            changed: false,
            partial: false,
        }
    }

    /// The value changed (or may have: it was handed out mutably).
    pub(crate) fn mark(&mut self) {
        self.dirty = true;
        self.changed = true;
    }

    pub(crate) fn add(&mut self, value: S, reduce: &impl ReduceFunction<S>) {
        match &mut self.value {
            Some(acc) => reduce.reduce(acc, value),
            None => self.value = Some(value),
        }
        self.mark();
    }

    /// Puts what was added (if anything) on top of `stored`, the value read
    /// from the database, and whether it was stamped as it was read. A
    /// dirty result is written back whole, replacing the merge operands
    /// stored before it.
    fn resolve(&mut self, stored: Option<(S, bool)>, reduce: Option<&Reduce<S>>) {
        self.partial = false;
        let (stored, stamped) = stored.map_or((None, false), |(s, stamped)| (Some(s), stamped));
        if stamped {
            self.mark();
        }
        self.value = match (stored, self.value.take()) {
            (Some(mut stored), Some(added)) => {
                let reduce = reduce.expect("only a reducing state adds to unread values");
                reduce(&mut stored, added);
                Some(stored)
            }
            (stored, added) => stored.or(added),
        };
    }
}

struct Cached<K, S> {
    key: K,
    group: u16,
    /// Used again since the last eviction sweep: it stays.
    referenced: bool,
    cell: CachedValue<S>,
}

/// One declared state: its column family and the cached values of its keys.
trait CachedState<K>: Send {
    fn name(&self) -> &str;
    /// Its column family, with a reducing state's merge operator.
    fn column_family(&self) -> ColumnFamily;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn clear_cache(&mut self);
    /// Adds the dirty values to `writes` and marks them clean and
    /// unchanged; returns how many had changed.
    fn write_back(&mut self, writes: &mut SortedWrites) -> usize;
    /// Adds every value the state holds to `writes` and marks them clean
    /// and unchanged; returns how many had changed. Only where the cache is
    /// whole: no value is partial.
    fn write_all(&mut self, writes: &mut SortedWrites) -> usize;
    /// Copies every value the state holds into one table per key group of
    /// the `groups` from `first`, and marks them unchanged, still dirty;
    /// returns the tables and how many had changed. Only where the cache
    /// is whole.
    fn copy_out(&mut self, first: u16, groups: usize) -> (Vec<Box<dyn SharedTable>>, usize);
    /// How many values are cached.
    fn len(&self) -> usize;
    /// Drops the clean values not used since the last sweep and clears the
    /// mark of the others; returns how many are left.
    fn evict_unreferenced(&mut self) -> usize;
    /// Drops up to `n` clean values; returns how many it dropped.
    fn evict(&mut self, n: usize) -> usize;
    /// Whether a record has used this state since the database opened.
    fn used(&self) -> bool;
    /// Starts loading what a lookup of `hash` in the cache reads at `stage`.
    fn prefetch(&self, hash: u64, stage: Prefetch);
    /// Reads the values of `keys` (at `slots`) that the cache misses, at
    /// most `room` of them, in one multi-get, and caches them; returns how
    /// many it cached.
    fn read_ahead(&mut self, read: ReadAhead<'_, K>, room: usize) -> Result<usize, StateError>;
    /// Decodes the entries of one key group in the heap snapshot format and
    /// adds them to `writes`; `now` stamps values without TTL restored into
    /// a state with one.
    fn restore_group(
        &mut self,
        group: u16,
        input: &mut &[u8],
        writes: &mut SortedWrites,
        now: Millis,
    ) -> Result<(), StateError>;
    /// Decodes the state's entries of key group `group` as
    /// [`Self::restore_group`] does, into the cache, dirty; returns how
    /// many it added.
    fn restore_cached(
        &mut self,
        group: u16,
        input: &mut &[u8],
        now: Millis,
    ) -> Result<usize, StateError>;
}

struct State<K, S: Clone> {
    name: String,
    cache: HashTable<Cached<K, S>>,
    /// Some record has read it: batches read it ahead.
    used: bool,
    /// A reducing state's function.
    reduce: Option<Reduce<S>>,
    form: Form<K, S>,
    /// The backend's processing time, which the compaction filter of a
    /// state with TTL reads.
    clock: Arc<TtlClock>,
}

/// What a read-ahead of one state needs besides the state.
struct ReadAhead<'a, K> {
    /// Waited for only if some key is missed.
    db: &'a mut Db,
    keys: &'a [K],
    slots: &'a [KeySlot],
    /// Key group of slot group 0.
    first_group: u32,
}

/// A value of state `name` read from the database, decoded, and whether it
/// was stamped with the time of the restore (written without TTL, read
/// into a state with one: dirty). A value that does not decode is a fatal
/// error of the subtask.
fn decode<K, S: Clone>(
    name: &str,
    form: &Form<K, S>,
    clock: &TtlClock,
    key: &impl Debug,
    bytes: &[u8],
) -> (S, bool) {
    let value = (form.decode)(bytes, clock.restored())
        .unwrap_or_else(|e| panic!("keyed state {name:?} of {key:?} does not decode: {e}"));
    (value, (form.stamps)(bytes))
}

/// The merge operator of a reducing state: the stored value (if any) and
/// the operands, oldest first, decoded and folded with `reduce`. The store
/// calls it on its own threads, maybe through C: a value that does not
/// decode or a panicking `reduce` fails the merge (RocksDB then reports
/// corruption to the read or compaction that needed it) instead of
/// unwinding.
fn merge_function<K: Key, S: Data>(
    reduce: Reduce<S>,
    form: Form<K, S>,
    clock: Arc<TtlClock>,
) -> MergeFunction {
    Arc::new(move |stored, operands| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let restored = clock.restored();
            let decode = |bytes: &[u8]| (form.decode)(bytes, restored).ok();
            let mut acc = match stored {
                Some(bytes) => decode(bytes)?,
                None => decode(operands.next()?)?,
            };
            for operand in operands {
                reduce(&mut acc, decode(operand)?);
            }
            let mut out = Vec::new();
            (form.encode)(&mut out, &acc);
            Some(out)
        }))
        .ok()
        .flatten()
    })
}

impl<K: Key, S: Data> CachedState<K> for State<K, S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn column_family(&self) -> ColumnFamily {
        ColumnFamily {
            name: self.name.clone(),
            merge: self
                .reduce
                .clone()
                .map(|reduce| merge_function(reduce, self.form, self.clock.clone())),
            ttl: self.form.compaction_filter(&self.clock),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn clear_cache(&mut self) {
        self.cache.clear();
    }

    /// A partial value stays cached, emptied: the next add to its key
    /// finds it in place instead of inserting it again (a checkpoint
    /// writes every partial value back, so wordcount counting into a
    /// cache that holds its keys re-inserted every key after each).
    fn write_back(&mut self, writes: &mut SortedWrites) -> usize {
        let mut changed = 0;
        for cached in self.cache.iter_mut() {
            let cell = &mut cached.cell;
            changed += usize::from(std::mem::take(&mut cell.changed));
            if cell.dirty {
                // Only an add dirties a partial value, so it holds what was
                // added: an emptied one would be written as a delete.
                debug_assert!(!cell.partial || cell.value.is_some());
                cell.dirty = false;
                writes.push(
                    cached.group,
                    &cached.key,
                    cell.value.as_ref(),
                    cell.partial,
                    self.form.encode,
                );
                if cell.partial {
                    cell.value = None;
                }
            }
        }
        changed
    }

    fn write_all(&mut self, writes: &mut SortedWrites) -> usize {
        let mut changed = 0;
        for cached in self.cache.iter_mut() {
            let cell = &mut cached.cell;
            debug_assert!(!cell.partial, "a whole cache has no partial values");
            changed += usize::from(std::mem::take(&mut cell.changed));
            cell.dirty = false;
            if let Some(value) = &cell.value {
                writes.push(
                    cached.group,
                    &cached.key,
                    Some(value),
                    false,
                    self.form.encode,
                );
            }
        }
        changed
    }

    fn copy_out(&mut self, first: u16, groups: usize) -> (Vec<Box<dyn SharedTable>>, usize) {
        let mut tables: Vec<Vec<(K, S)>> = (0..groups).map(|_| Vec::new()).collect();
        let mut changed = 0;
        for cached in self.cache.iter_mut() {
            let cell = &mut cached.cell;
            debug_assert!(!cell.partial, "a whole cache has no partial values");
            changed += usize::from(std::mem::take(&mut cell.changed));
            if let Some(value) = &cell.value {
                let table = &mut tables[usize::from(cached.group - first)];
                table.push((cached.key.clone(), value.clone()));
            }
        }
        let tables = tables.into_iter().map(|t| Box::new(Copied(t)) as _);
        (tables.collect(), changed)
    }

    fn len(&self) -> usize {
        self.cache.len()
    }

    fn evict_unreferenced(&mut self) -> usize {
        self.cache.retain(|c| {
            debug_assert!(!c.cell.dirty, "written back before eviction");
            std::mem::take(&mut c.referenced)
        });
        self.cache.len()
    }

    fn evict(&mut self, mut n: usize) -> usize {
        let before = self.cache.len();
        self.cache.retain(|_| {
            if n == 0 {
                return true;
            }
            n -= 1;
            false
        });
        before - self.cache.len()
    }

    fn used(&self) -> bool {
        self.used
    }

    #[inline]
    fn prefetch(&self, hash: u64, stage: Prefetch) {
        prefetch_lookup(&self.cache, hash, stage);
    }

    fn read_ahead(&mut self, read: ReadAhead<'_, K>, room: usize) -> Result<usize, StateError> {
        // Each missed key gets its cache slot at once, empty, so that a key
        // twice in the batch is read once; the slots are filled below. A
        // reducing state's key cached without its stored value is read too.
        let mut missed = Vec::new();
        let mut encoded = Vec::new();
        let mut added = 0;
        for (key, slot) in read.keys.iter().zip(read.slots) {
            if added == room {
                break;
            }
            let hash = slot.hash;
            let group = (read.first_group as usize + slot.group) as u16;
            match self
                .cache
                .entry(hash, |c| c.key == *key, |c| table_hash(&c.key))
            {
                hash_table::Entry::Vacant(vacant) => {
                    // Read to be used soon (timers due later in the chunk
                    // of `DueReads` included): it survives the next sweep.
                    vacant.insert(Cached {
                        key: key.clone(),
                        group,
                        referenced: true,
                        cell: CachedValue::new(None),
                    });
                    added += 1;
                }
                hash_table::Entry::Occupied(cached) if cached.get().cell.partial => {
                    // Read once even if the key comes again: resolved below.
                    cached.into_mut().cell.partial = false;
                }
                hash_table::Entry::Occupied(_) => continue,
            }
            let start = encoded.len();
            write_key(&mut encoded, group, key);
            missed.push((start..encoded.len(), key, hash));
        }
        if missed.is_empty() {
            return Ok(added);
        }
        // Stores read sorted keys block by block.
        missed.sort_unstable_by(|a, b| encoded[a.0.clone()].cmp(&encoded[b.0.clone()]));
        let keys: Vec<&[u8]> = missed.iter().map(|(r, _, _)| &encoded[r.clone()]).collect();
        let mut stored: Vec<Option<(S, bool)>> = Vec::new();
        stored.resize_with(missed.len(), || None);
        let db = read.db.settled()?.expect("opened before reading ahead");
        db.multi_get(&self.name, &keys, &mut |i, bytes| {
            stored[i] = Some(decode(
                &self.name,
                &self.form,
                &self.clock,
                missed[i].1,
                bytes,
            ));
        })?;
        for ((_, key, hash), stored) in missed.iter().zip(stored) {
            self.cache
                .find_mut(*hash, |c| c.key == **key)
                .expect("cached above")
                .cell
                .resolve(stored, self.reduce.as_ref());
        }
        Ok(added)
    }

    fn restore_group(
        &mut self,
        group: u16,
        input: &mut &[u8],
        writes: &mut SortedWrites,
        now: Millis,
    ) -> Result<(), StateError> {
        let entries = self.form.decode_entries(input, now)?;
        for (key, value) in &entries {
            writes.push(group, key, Some(value), false, self.form.encode);
        }
        Ok(())
    }

    fn restore_cached(
        &mut self,
        group: u16,
        input: &mut &[u8],
        now: Millis,
    ) -> Result<usize, StateError> {
        let mut added = 0;
        for (key, value) in self.form.decode_entries(input, now)? {
            let mut cell = CachedValue::new(Some(value));
            cell.dirty = true;
            let hash = table_hash(&key);
            match self
                .cache
                .entry(hash, |c| c.key == key, |c| table_hash(&c.key))
            {
                hash_table::Entry::Occupied(mut cached) => cached.get_mut().cell = cell,
                hash_table::Entry::Vacant(vacant) => {
                    added += 1;
                    vacant.insert(Cached {
                        key,
                        group,
                        referenced: false,
                        cell,
                    });
                }
            }
        }
        Ok(added)
    }
}

/// The database as the subtask has it: open, or away with a checkpoint's
/// write-back (see [`EmbeddedKeyedStateBackend::snapshot`]). Only what
/// reads or writes the database waits for it to come back: records whose
/// keys are cached go on meanwhile.
#[derive(Default)]
struct Db {
    /// `None` until opened, while away, and once a write-back panicked
    /// (then `failed` says so).
    here: Option<Box<dyn Database>>,
    away: Option<Away>,
    /// Set once a checkpoint's write-back failed: every later use fails.
    failed: Option<StateError>,
}

impl Db {
    /// Opened, whether here or away.
    fn is_open(&self) -> bool {
        self.here.is_some() || self.away.is_some()
    }

    /// The database once back (waiting for its write-back, or making it
    /// here if it has not started), if open; an error if some write-back
    /// failed.
    fn settled(&mut self) -> Result<Option<&mut (dyn Database + 'static)>, StateError> {
        if let Some(away) = self.away.take() {
            let (db, written) = away.back();
            self.failed = match (&db, written) {
                (Some(_), Ok(())) => None,
                (_, Err(e)) => Some(StateError::WriteBackFailed(e.to_string())),
                (None, Ok(())) => unreachable!("a write-back that went in gives its database back"),
            };
            self.here = db;
        }
        match &self.failed {
            Some(failed) => Err(failed.clone()),
            None => Ok(self.here.as_deref_mut()),
        }
    }
}

impl Drop for Db {
    /// The database goes (and its working directory with it) once a
    /// checkpoint's write-back is done with it.
    fn drop(&mut self) {
        if let Some(away) = self.away.take() {
            let _ = away.back();
        }
    }
}

/// Keyed state in an embedded store's database.
///
/// In front of the database sits a write-back cache of typed values, bounded
/// by a number of entries over all states. An entry reads its value into the
/// cache once; later records of the same key find it there, deserialized.
/// When the cache is full, a record whose key is not in it first writes every
/// dirty value back, sorted by key, then evicts the values not used since
/// the last such sweep and others until the cache is half full. `AllKeys`
/// writes it back first, and a snapshot takes the dirty values to write
/// them back off the subtask's thread; both keep the values, clean (unless
/// the snapshot copies a whole cache out: see [`Self::snapshot`]). With
/// uniform keys the cache mostly batches the writes and coalesces repeated
/// updates; with skewed keys it also saves the reads of the hot ones.
/// Capacity 1 is a write-back per record.
///
/// Nothing touches the disk until the state is restored or first used: the
/// store's working directory is created then, and removed when the backend
/// is dropped.
pub struct EmbeddedKeyedStateBackend<K: Key> {
    store: Arc<dyn EmbeddedStore>,
    range: KeyGroupRange,
    max_parallelism: u32,
    label: String,
    states: Vec<Box<dyn CachedState<K>>>,
    /// Values in the cache, over all states.
    cached: usize,
    cache_capacity: usize,
    /// Some cached value may have changed since the last write-back.
    dirty: bool,
    /// The cache holds every value stored: the database was empty when it
    /// opened, and nothing has been evicted since. A miss is then a key
    /// with no value, which is not looked up, and a reducing state adds to
    /// it as to any value, not as a merge operand.
    whole: bool,
    /// Per state, how many of its values changed before the last
    /// checkpoint: where that is half of them or more, the next checkpoint
    /// of a whole cache copies it out or replaces the state's column family
    /// with every value, instead of adding the dirty ones to it (see
    /// [`Self::snapshot`]).
    churn: Vec<usize>,
    /// The last checkpoint copied the cache out, so the database lacks
    /// what changed since the native checkpoint before: where the cache
    /// is still whole, the next native one replaces every state instead
    /// of adding a run of nearly every value to the stale ones.
    copied: bool,
    /// Reused: no allocation per key once it has grown.
    key: Vec<u8>,
    writes: SortedWrites,
    db: Db,
    /// The TTL of each state, if it has one.
    ttl: Vec<Option<StateTtlConfig>>,
    /// Processing time, as the subtask last set it: shared with the
    /// compaction filters of states with TTL.
    clock: Arc<TtlClock>,
}

impl<K: Key> EmbeddedKeyedStateBackend<K> {
    /// A backend for the key groups `range` of `max_parallelism` (at most
    /// 2^15) in a database of `store` whose working directory is named
    /// after `label`, with a cache of `cache_capacity` values (at least
    /// one); nothing is created yet.
    pub fn new(
        store: Arc<dyn EmbeddedStore>,
        label: &str,
        range: KeyGroupRange,
        max_parallelism: u32,
        cache_capacity: usize,
    ) -> Self {
        assert!(
            max_parallelism <= MAX_KEY_GROUPS,
            "the {} backend supports a max parallelism up to {MAX_KEY_GROUPS}, not {max_parallelism}",
            store.name()
        );
        EmbeddedKeyedStateBackend {
            store,
            range,
            max_parallelism,
            label: label.to_owned(),
            states: Vec::new(),
            cached: 0,
            dirty: false,
            whole: true,
            churn: Vec::new(),
            copied: false,
            cache_capacity: cache_capacity.max(1),
            key: Vec::new(),
            writes: SortedWrites::default(),
            db: Db::default(),
            ttl: Vec::new(),
            clock: Arc::new(TtlClock::default()),
        }
    }

    /// The key groups it owns.
    pub fn key_groups(&self) -> KeyGroupRange {
        self.range
    }

    /// The operator's max parallelism.
    pub fn max_parallelism(&self) -> u32 {
        self.max_parallelism
    }

    /// The working directory, once the database is open and not away with
    /// a checkpoint's write-back.
    pub fn working_dir(&self) -> Option<&Path> {
        self.db.here.as_ref().map(|db| db.working_dir())
    }

    pub(super) fn register<S: Data>(
        &mut self,
        name: &str,
        reduce: Option<Reduce<S>>,
        form: Form<K, S>,
    ) -> usize {
        assert!(
            !self.states.iter().any(|s| s.name() == name),
            "keyed state {name:?} declared twice"
        );
        let state = Box::new(State::<K, S> {
            name: name.to_owned(),
            cache: HashTable::new(),
            used: false,
            reduce,
            form,
            clock: self.clock.clone(),
        });
        self.ttl.push(form.ttl);
        self.churn.push(0);
        if let Err(e) = self.settle() {
            panic!("declaring keyed state {name:?}: {e}");
        }
        if let Some(db) = &mut self.db.here {
            db.create_family(&state.column_family())
                .unwrap_or_else(|e| panic!("creating the column family of {name:?}: {e}"));
        }
        self.states.push(state);
        self.states.len() - 1
    }

    /// The TTL of state `id`.
    #[inline]
    pub(super) fn ttl(&self, id: usize) -> Option<StateTtlConfig> {
        self.ttl[id]
    }

    /// Processing time as last set: what TTL measures.
    #[inline]
    pub(super) fn now(&self) -> Millis {
        self.clock.now()
    }

    /// Processing time is `now` (never going back).
    pub(super) fn set_time(&self, now: Millis) {
        self.clock.set(now);
    }

    /// Compacts the database all the way down, so that the compaction
    /// filters of states with TTL drop what expired (tests and tools; the
    /// store compacts on its own as it is written).
    pub fn compact(&mut self) -> Result<(), StateError> {
        self.write_back()?;
        self.ensure_open()?.compact()?;
        self.clear_cache();
        Ok(())
    }

    fn families(&self) -> Vec<ColumnFamily> {
        self.states.iter().map(|s| s.column_family()).collect()
    }

    /// Opens the database: empty, or on the files of a native checkpoint.
    fn open(&mut self, native: Option<&Path>) -> Result<(), StateError> {
        debug_assert!(!self.db.is_open());
        let families = self.families();
        self.db.here = Some(
            self.store
                .open(&self.label, self.range, &families, native)?,
        );
        Ok(())
    }

    /// Takes the database back from a checkpoint's write-back, waiting for
    /// it to be done, and fails if some write-back failed.
    fn settle(&mut self) -> Result<(), StateError> {
        self.db.settled().map(|_| ())
    }

    fn ensure_open(&mut self) -> Result<&mut dyn Database, StateError> {
        if self.db.settled()?.is_none() {
            self.open(None)?;
        }
        Ok(self.db.here.as_deref_mut().expect("opened above"))
    }

    /// Opens the database unless it is open, here or away; an error once
    /// a write-back is known to have failed.
    fn ensure_opened(&mut self) -> Result<(), StateError> {
        if let Some(failed) = &self.db.failed {
            return Err(failed.clone());
        }
        if !self.db.is_open() {
            self.open(None)?;
        }
        Ok(())
    }

    /// The cached value of `key` in state `id`, read from the database if it
    /// is not cached. Database errors here are fatal to the subtask: they
    /// panic, and the panic fails the subtask.
    pub(super) fn entry<S: Data>(
        &mut self,
        id: usize,
        key: &K,
        slot: KeySlot,
    ) -> &mut CachedValue<S> {
        let group = self.make_way::<S>(id, key, slot);
        let db = &mut self.db;
        let State {
            name,
            cache,
            used,
            reduce,
            form,
            clock,
        } = state_mut::<K, S>(&mut self.states[id]);
        *used = true;
        let buffer = &mut self.key;
        let whole = self.whole;
        let mut read = || {
            if whole {
                return None;
            }
            buffer.clear();
            write_key(buffer, group, key);
            let mut stored = None;
            let read = db.settled().and_then(|db| {
                let db = db.expect("opened by make_way");
                db.get(name, buffer, &mut |bytes| {
                    stored = Some(decode(name, form, clock, key, bytes));
                })
            });
            if let Err(e) = read {
                panic!("reading keyed state {name:?} of {key:?}: {e}");
            }
            stored
        };
        match cache.entry(slot.hash, |c| c.key == *key, |c| table_hash(&c.key)) {
            hash_table::Entry::Occupied(cached) => {
                let cached = cached.into_mut();
                cached.referenced = true;
                if cached.cell.partial {
                    let stored = read();
                    cached.cell.resolve(stored, reduce.as_ref());
                }
                &mut cached.cell
            }
            hash_table::Entry::Vacant(vacant) => {
                self.cached += 1;
                let cached = Cached {
                    key: key.clone(),
                    group,
                    referenced: false,
                    cell: {
                        let mut cell = CachedValue::new(None);
                        cell.resolve(read(), None);
                        cell
                    },
                };
                &mut vacant.insert(cached).into_mut().cell
            }
        }
    }

    /// Adds `value` to the reducing state `id` of `key` without reading
    /// what is stored: a key the cache misses is cached as partial, and
    /// its additions are written back as a merge operand.
    pub(super) fn add<S: Data>(
        &mut self,
        id: usize,
        key: &K,
        slot: KeySlot,
        value: S,
        reduce: &impl ReduceFunction<S>,
    ) {
        let group = self.make_way::<S>(id, key, slot);
        let cache = &mut state_mut::<K, S>(&mut self.states[id]).cache;
        match cache.entry(slot.hash, |c| c.key == *key, |c| table_hash(&c.key)) {
            hash_table::Entry::Occupied(cached) => {
                let cached = cached.into_mut();
                cached.referenced = true;
                cached.cell.add(value, reduce);
            }
            hash_table::Entry::Vacant(vacant) => {
                self.cached += 1;
                vacant.insert(Cached {
                    key: key.clone(),
                    group,
                    referenced: false,
                    cell: CachedValue {
                        value: Some(value),
                        dirty: true,
                        changed: true,
                        partial: !self.whole,
                    },
                });
            }
        }
    }

    /// Readies the cache for a record's access to `key` in state `id`: the
    /// database open (maybe away), and room made if the key is not cached
    /// and the cache is full; returns the key's group. Database errors here
    /// are fatal to the subtask: they panic, and the panic fails the subtask.
    fn make_way<S: Data>(&mut self, id: usize, key: &K, slot: KeySlot) -> u16 {
        if let Err(e) = self.ensure_opened() {
            panic!("using the keyed state of {}: {e}", self.label);
        }
        if self.cached >= self.cache_capacity
            && state_mut::<K, S>(&mut self.states[id])
                .cache
                .find(slot.hash, |c| c.key == *key)
                .is_none()
        {
            if let Err(e) = self.make_room() {
                panic!("writing the keyed state of {}: {e}", self.label);
            }
        }
        // The access may change the value: the next write-back looks.
        self.dirty = true;
        (self.range.start as usize + slot.group) as u16
    }

    /// Whether a key the cache misses may have a value in the database:
    /// not while the cache is whole.
    pub(super) fn reads_on_miss(&self) -> bool {
        !self.whole
    }

    /// Reads into the cache what it misses of the state of a batch's `keys`
    /// (at `slots`), one multi-get per state that records use: the store
    /// looks the keys up together, block by block, instead of once per
    /// record. A full cache makes room first; a batch larger than the room
    /// reads the rest one by one, as it is processed.
    pub(super) fn read_ahead(&mut self, keys: &[K], slots: &[KeySlot]) -> Result<(), StateError> {
        self.ensure_opened()?;
        if self.whole {
            return Ok(());
        }
        let used = self.states.iter().filter(|s| s.used()).count();
        if used == 0 {
            return Ok(());
        }
        if self.cached + keys.len() * used > self.cache_capacity {
            self.make_room()?;
        }
        for state in self.states.iter_mut().filter(|s| s.used()) {
            let read = ReadAhead {
                db: &mut self.db,
                keys,
                slots,
                first_group: self.range.start,
            };
            let room = self.cache_capacity.saturating_sub(self.cached);
            self.cached += state.read_ahead(read, room)?;
        }
        // Values stamped as they were read are dirty.
        self.dirty |= self.ttl.iter().any(Option::is_some);
        Ok(())
    }

    /// Starts loading what the lookups of `slot` in the cache read at
    /// `stage`, in every state: with keys beyond the CPU's caches, a
    /// record's lookup then does not wait for memory.
    #[inline]
    pub(crate) fn prefetch(&self, slot: KeySlot, stage: Prefetch) {
        for state in &self.states {
            state.prefetch(slot.hash, stage);
        }
    }

    /// Writes every dirty cached value to the database, sorted by key; the
    /// values stay cached, clean (the partial values of reducing states
    /// emptied: they are merge operands in the database now).
    pub fn write_back(&mut self) -> Result<(), StateError> {
        self.settle()?;
        if !self.dirty {
            return Ok(());
        }
        let db = self
            .db
            .here
            .as_deref_mut()
            .expect("values are cached only once open");
        for state in &mut self.states {
            state.write_back(&mut self.writes);
            write_sorted(db, state.name(), &mut self.writes)?;
        }
        self.dirty = false;
        Ok(())
    }

    /// Makes room in a full cache: writes it back, then drops the values not
    /// used again since the last sweep, and arbitrary others until it is half
    /// full, so that a sweep is paid for by as many misses as it frees.
    fn make_room(&mut self) -> Result<(), StateError> {
        self.write_back()?;
        self.whole = false;
        let keep = self.cache_capacity / 2;
        let mut left: usize = self.states.iter_mut().map(|s| s.evict_unreferenced()).sum();
        for state in &mut self.states {
            if left <= keep {
                break;
            }
            left -= state.evict(left - keep);
        }
        self.cached = left;
        Ok(())
    }

    /// Drops every cached value; the database keeps what was written back.
    fn clear_cache(&mut self) {
        for state in &mut self.states {
            state.clear_cache();
        }
        self.cached = 0;
        self.dirty = false;
        self.whole = false;
    }

    /// The synchronous part of a checkpoint: takes the cache's dirty values
    /// as written and hands them with the database to a job that sorts
    /// them, writes them back and makes a native checkpoint of the database
    /// (for RocksDB: the memtables flushed, hard links of the SST files,
    /// copies of the small metadata files) in a new directory beside the
    /// working directory, `<working dir>-<checkpoint>`. The shell runs the
    /// job off the subtask's thread (module `write_back`). Meanwhile the subtask
    /// goes on with its cache, and so do the subtasks sharing its thread (a
    /// barrier they forward no longer waits for the write-back); its next
    /// access to the database waits for the database.
    ///
    /// Where the cache is whole and half or more of its values changed at
    /// the last checkpoint, the checkpoint copies them all out in the heap
    /// format instead (`copy_out`), and the database stays as it
    /// was. RocksDB wordcount at 1,000,000 keys with 1 s checkpoints (p=2,
    /// two interleaved runs each) then had checkpoints of 34-38 ms p50
    /// instead of 223-235 ms, kept 0.95-0.96 of its rate without
    /// checkpoints, and uploaded 7.8 MB a checkpoint instead of 5.9.
    ///
    /// Otherwise, where the cache is whole and half or more of one state's
    /// values changed at the last checkpoint, the checkpoint takes all of
    /// them, and they replace the state's column family: under such churn
    /// the values written before are mostly stale, and merging them away
    /// would be the store's compaction, which then has nothing to do. (Not
    /// a state with TTL: its compaction drops what expired.) Before the
    /// copy, this took RocksDB wordcount at 1,000,000 keys with 1 s
    /// checkpoints from 0.75-0.76 of its rate without checkpoints to
    /// 0.84-0.94, and its checkpoints from 17 MB referenced to 5.9.
    pub fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<KeyedSnapshot, StateError> {
        self.ensure_open()?;
        if self.copies_whole() {
            return Ok(KeyedSnapshot::Heap(self.copy_out()));
        }
        let dirty = std::mem::take(&mut self.dirty);
        let copied = std::mem::take(&mut self.copied);
        let writes = self
            .states
            .iter_mut()
            .zip(&mut self.churn)
            .zip(&self.ttl)
            .map(|((state, churn), ttl)| {
                let mut writes = SortedWrites::default();
                let churned = *churn > 0 && 2 * *churn >= state.len();
                let whole = dirty && self.whole && ttl.is_none() && (copied || churned);
                *churn = match (dirty, whole) {
                    (false, _) => 0,
                    (true, true) => state.write_all(&mut writes),
                    (true, false) => state.write_back(&mut writes),
                };
                Taken {
                    family: state.name().to_owned(),
                    writes,
                    whole,
                }
            })
            .collect();
        let db = self.db.here.take().expect("opened above");
        let native = NativeCheckpoint {
            dir: checkpoint_dir(db.working_dir(), checkpoint),
            key_groups: self.range,
            instance: db.instance(),
            files: Vec::new(),
        };
        let job = Job { db, writes, native };
        let (pending, away) = hand_over(job, self.store.clone());
        self.db.away = Some(away);
        Ok(KeyedSnapshot::Native(pending))
    }

    /// Whether the next checkpoint copies the cache out in the heap format:
    /// where the cache is whole, half or more of its values changed at the
    /// last checkpoint, and no state has TTL (whose compaction drops what
    /// expired). Such a checkpoint would upload every value anyway, and
    /// copying them out costs a fraction of writing them into the store.
    fn copies_whole(&self) -> bool {
        let changed: usize = self.churn.iter().sum();
        let len: usize = self.states.iter().map(|s| s.len()).sum();
        self.dirty
            && self.whole
            && self.ttl.iter().all(Option::is_none)
            && changed > 0
            && 2 * changed >= len
    }

    /// Copies every cached value into a heap snapshot, which the
    /// asynchronous part encodes and uploads. The database does not get
    /// them: they stay dirty, for the write-back that comes with the first
    /// eviction or native checkpoint.
    fn copy_out(&mut self) -> HeapSnapshot {
        let (first, groups) = (self.range.start as u16, self.range.len());
        let mut tables: Vec<Vec<Box<dyn SharedTable>>> = (0..groups).map(|_| Vec::new()).collect();
        for (state, churn) in self.states.iter_mut().zip(&mut self.churn) {
            let (copies, changed) = state.copy_out(first, groups);
            *churn = changed;
            for (group, table) in tables.iter_mut().zip(copies) {
                group.push(table);
            }
        }
        self.copied = true;
        let names = self.states.iter().map(|s| s.name().to_owned()).collect();
        HeapSnapshot::of_tables(self.range, names, tables)
    }

    /// Opens the database on `state.native` if there is one, copies in the
    /// key groups it owns from `state.imports`, then writes the key groups
    /// of `state` (heap snapshot format) into it.
    pub fn restore(&mut self, state: &RestoreState) -> Result<(), StateError> {
        self.settle()?;
        self.clock.restore(state.time);
        if let Some(native) = &state.native {
            // Whatever was there before is replaced, cache included.
            self.clear_cache();
            self.db.here = None;
            self.open(Some(native))?;
        }
        for import in &state.imports {
            self.ensure_open()?;
            self.write_back()?;
            self.clear_cache();
            let families = self.families();
            let db = self.db.here.as_deref_mut().expect("opened above");
            db.import(import, self.range, &families)?;
        }
        for (group, bytes) in &state.key_groups {
            self.restore_group(*group, bytes)?;
        }
        self.ensure_open().map(|_| ())
    }

    /// Loads one key group as `HeapSnapshot::write` wrote it.
    pub fn restore_group(&mut self, group: KeyGroup, bytes: &[u8]) -> Result<(), StateError> {
        if !self.range.contains(group) {
            return Err(StateError::ForeignKeyGroup(group));
        }
        self.ensure_open()?;
        if self.whole {
            return self.restore_cached(group, bytes);
        }
        // Cached values of the group would hide what is written here.
        self.write_back()?;
        self.clear_cache();
        let now = self.now();
        let db = self.db.here.as_deref_mut().expect("opened above");
        let (states, writes) = (&mut self.states, &mut self.writes);
        read_group(bytes, |name, entries| {
            let state = states
                .iter_mut()
                .find(|s| s.name() == name)
                .ok_or(StateError::UnknownState(name))?;
            state.restore_group(group.0 as u16, entries, writes, now)?;
            write_sorted(db, state.name(), writes)
        })
    }

    /// Loads one key group into a whole cache (the database opened empty
    /// and nothing was evicted): its values are cached, dirty, as records
    /// leave theirs, and written back as theirs are (a keyed operator
    /// writes the cache back right after its restore); a cache they
    /// overflow writes everything back and is no longer whole. They count
    /// as churn, so that the first checkpoint copies them out: a restored
    /// job checkpoints as fast as it did before.
    fn restore_cached(&mut self, group: KeyGroup, bytes: &[u8]) -> Result<(), StateError> {
        // Before any value is cached: a write-back must never pass over one.
        self.dirty = true;
        let now = self.now();
        let (states, churn, cached) = (&mut self.states, &mut self.churn, &mut self.cached);
        read_group(bytes, |name, entries| {
            let id = states
                .iter()
                .position(|s| s.name() == name)
                .ok_or(StateError::UnknownState(name))?;
            let added = states[id].restore_cached(group.0 as u16, entries, now)?;
            churn[id] += added;
            *cached += added;
            Ok(())
        })?;
        if self.cached > self.cache_capacity {
            self.make_room()?;
        }
        Ok(())
    }

    /// Every (key, value) of state `id`, key group by key group. The cache
    /// must have been written back.
    pub(super) fn entries<V: Data>(&self, id: usize) -> impl Iterator<Item = (K, V)> + '_ {
        assert!(
            !self.dirty && self.db.away.is_none(),
            "the cache is written back before reading all keys"
        );
        let state: &State<K, V> = self.states[id]
            .as_any()
            .downcast_ref()
            .expect("a state handle is only used with the backend that issued it");
        Values {
            cursor: self.db.here.as_deref().map(|db| db.scan(&state.name)),
            form: state.form,
            restored: self.clock.restored(),
        }
    }
}

/// Sorts `writes`, applies them to `family` and empties them.
fn write_sorted(
    db: &mut dyn Database,
    family: &str,
    writes: &mut SortedWrites,
) -> Result<(), StateError> {
    if writes.is_empty() {
        return Ok(());
    }
    writes.sort();
    let written = db.write(family, writes);
    writes.clear();
    written
}

fn state_mut<K: Key, S: Data>(state: &mut Box<dyn CachedState<K>>) -> &mut State<K, S> {
    state
        .as_any_mut()
        .downcast_mut()
        .expect("a state handle is only used with the backend that issued it")
}

/// Decoded entries of one column family.
struct Values<'a, K, V: Clone> {
    cursor: Option<Box<dyn super::store::Cursor + 'a>>,
    form: Form<K, V>,
    /// Stamps values written without TTL.
    restored: Millis,
}

impl<K: Key, V: Data> Iterator for Values<'_, K, V> {
    type Item = (K, V);

    fn next(&mut self) -> Option<(K, V)> {
        let (key, value) = self.cursor.as_mut()?.next_entry()?;
        Some((
            rmp_serde::from_slice(&key[2..])
                .unwrap_or_else(|e| panic!("a key of keyed state does not decode: {e}")),
            (self.form.decode)(value, self.restored)
                .unwrap_or_else(|e| panic!("a value of keyed state does not decode: {e}")),
        ))
    }
}
