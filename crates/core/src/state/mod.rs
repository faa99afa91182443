//! Keyed state: value, reducing, map and list state over serde types, scoped
//! to the key of the record being processed and partitioned by key group.
//! Operator functions declare their states once, at open, and get typed
//! handles; the backend behind the handles is chosen per job
//! (`StateBackend`): typed hash tables on the heap, or one database of an
//! embedded store (RocksDB, from the `tidemark-rocksdb` crate) per subtask,
//! behind a write-back cache. The handles, the per-record `KeyedContext` and
//! its `Entry` are the same for both, and dispatch to the backend through
//! an enum, not a trait object.

pub mod broadcast;
mod cached;
mod heap;
pub mod snapshot;
pub mod store;
pub mod timers;
pub mod ttl;
mod ttl_views;
mod write_back;

pub use self::broadcast::{BroadcastContext, BroadcastStates, KeyedState, MapStateDescriptor};
pub use self::cached::EmbeddedKeyedStateBackend;
pub use self::heap::{HeapKeyedStateBackend, HeapSnapshot, KeySlot};
pub use self::store::EmbeddedStore;
pub use self::ttl::{StateTtlConfig, StateVisibility, UpdateType};
pub use self::ttl_views::{TtlList, TtlMap};

use self::cached::CachedValue;
use self::heap::{table_hash, GroupTable, Prefetch};
use self::ttl::{Form, TtlReduce, TtlValue};
use hashbrown::hash_table;

use crate::model::batch::Data;
use crate::model::ids::{CheckpointId, KeyGroup};
use crate::model::key_group::{key_group_for_hash, key_hash, KeyGroupRange};
use crate::time::timers::{KeyTimers, TimeCounters, TimeDomain};
use crate::time::Millis;
use rustc_hash::FxHashMap;
use snapshot::{KeyedSnapshot, RestoreState};
use std::fmt::Debug;
use std::hash::Hash;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use timers::TimerService;

/// How many records ahead of the one a keyed step processes the entries
/// of its batch are prefetched: far enough for a miss to memory (about
/// 100 ns) to be over when its record comes, near enough for the lines to
/// stay in the first-level cache. Their control bytes are prefetched as far
/// again ahead, so that finding the entry does not wait either.
pub(crate) const PREFETCH_DISTANCE: usize = 16;

/// `prefetch` of the control bytes of the slot `2 * PREFETCH_DISTANCE`
/// after record `i` and of the entry `PREFETCH_DISTANCE` after it (and,
/// before the first record, of the control bytes of those up to it).
#[inline(always)]
fn prefetch_slots(slots: &[KeySlot], i: usize, prefetch: impl Fn(KeySlot, Prefetch)) {
    let probe = 2 * PREFETCH_DISTANCE;
    if i == 0 {
        slots
            .iter()
            .take(probe)
            .for_each(|s| prefetch(*s, Prefetch::Probe));
    }
    if let Some(slot) = slots.get(i + probe) {
        prefetch(*slot, Prefetch::Probe);
    }
    if let Some(slot) = slots.get(i + PREFETCH_DISTANCE) {
        prefetch(*slot, Prefetch::Entry);
    }
}

/// What a key must be: hashable to a key group, and storable.
pub trait Key: Data + Hash + Eq + Debug {}
impl<K: Data + Hash + Eq + Debug> Key for K {}

/// Where the keyed state of a job lives.
#[derive(Clone, Debug, Default)]
pub enum StateBackend {
    /// Typed hash tables in memory; snapshots are full copies.
    #[default]
    Heap,
    /// One database of `store` per subtask, in a working directory of its
    /// own under the store's local directory that is removed when the
    /// subtask's instance goes away; snapshots are native checkpoints, or
    /// copies of a write-back cache that holds every value.
    /// `cache_entries` bounds the write-back cache of typed values in front
    /// of each database.
    Embedded {
        /// The kind of store: `tidemark_rocksdb::RocksDb`.
        store: Arc<dyn EmbeddedStore>,
        /// Typed values cached per subtask in front of its database.
        cache_entries: usize,
    },
}

impl StateBackend {
    /// Values the write-back cache of an embedded store holds, over all
    /// states, unless told otherwise: about 40 MiB for a `u64` key and
    /// value (a value's own heap data comes on top), next to RocksDB's 64
    /// MiB block cache and its memtables.
    pub const DEFAULT_CACHE_ENTRIES: usize = 1 << 20;

    /// Its name, as `--state` takes it: `heap` or the store's.
    pub fn name(&self) -> &'static str {
        match self {
            StateBackend::Heap => "heap",
            StateBackend::Embedded { store, .. } => store.name(),
        }
    }
}

/// Two backends are alike when they keep state the same way in the same
/// place.
impl PartialEq for StateBackend {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (StateBackend::Heap, StateBackend::Heap) => true,
            (
                StateBackend::Embedded {
                    store: a,
                    cache_entries: x,
                },
                StateBackend::Embedded {
                    store: b,
                    cache_entries: y,
                },
            ) => a.name() == b.name() && a.local_dir() == b.local_dir() && x == y,
            _ => false,
        }
    }
}

impl Eq for StateBackend {}

/// Why keyed state could not be restored, read or snapshotted.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    /// The snapshot holds a state (by name) that the operator did not
    /// declare: the job's code changed in a way the state cannot follow.
    #[error("keyed state {0:?} in the snapshot is not declared by the operator")]
    UnknownState(String),
    /// A key group handed to a subtask that does not own it: a restore
    /// planning bug.
    #[error("{0} is not owned by this subtask")]
    ForeignKeyGroup(KeyGroup),
    /// Stored bytes do not decode as the declared type.
    #[error("keyed state does not decode: {0}")]
    Decode(String),
    /// A native checkpoint offered to the heap backend (the directory
    /// holding it).
    #[error(
        "the checkpoint in {0} was taken with the RocksDB state backend (a native \
         checkpoint); the heap backend restores only key-group snapshots, so run \
         the job with the RocksDB backend"
    )]
    NativeCheckpointOnHeap(PathBuf),
    /// The embedded store returned an error (its name leads the message).
    #[error("{0}")]
    Store(String),
    /// A checkpoint's write-back into the embedded store failed: the values
    /// it took from the cache as written are lost, so once the failure is
    /// known (at the next access to the store, the next checkpoint at the
    /// latest) the state refuses every access and the subtask restores
    /// from a completed checkpoint.
    #[error("writing keyed state back for a checkpoint failed, so it can no longer be used: {0}")]
    WriteBackFailed(String),
    /// A local file or directory of the state could not be used.
    #[error("{path}: {message}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The IO error.
        message: String,
    },
}

impl StateError {
    /// A local file or directory of the state could not be used.
    pub fn io(path: &std::path::Path, error: std::io::Error) -> Self {
        StateError::Io {
            path: path.to_owned(),
            message: error.to_string(),
        }
    }
}

/// The keyed state of one subtask, in the backend the job chose.
pub enum KeyedStateBackend<K: Key> {
    /// [`StateBackend::Heap`].
    Heap(HeapKeyedStateBackend<K>),
    /// [`StateBackend::Embedded`]. Boxed: the database handle and cache
    /// are far larger than the heap backend, and only reached through the
    /// enum once per record.
    Embedded(Box<EmbeddedKeyedStateBackend<K>>),
}

impl<K: Key> KeyedStateBackend<K> {
    /// The backend `config` asks for. `label` names the subtask in the
    /// embedded store's working directory (`op-<operator>-<index>`);
    /// nothing is created on disk until the state is restored or first
    /// used.
    pub fn new(
        config: &StateBackend,
        label: &str,
        key_groups: KeyGroupRange,
        max_parallelism: u32,
    ) -> Self {
        match config {
            StateBackend::Heap => {
                KeyedStateBackend::Heap(HeapKeyedStateBackend::new(key_groups, max_parallelism))
            }
            StateBackend::Embedded {
                store,
                cache_entries,
            } => KeyedStateBackend::Embedded(Box::new(EmbeddedKeyedStateBackend::new(
                store.clone(),
                label,
                key_groups,
                max_parallelism,
                *cache_entries,
            ))),
        }
    }

    /// The key groups this subtask owns.
    pub fn key_groups(&self) -> KeyGroupRange {
        match self {
            KeyedStateBackend::Heap(b) => b.key_groups(),
            KeyedStateBackend::Embedded(b) => b.key_groups(),
        }
    }

    fn max_parallelism(&self) -> u32 {
        match self {
            KeyedStateBackend::Heap(b) => b.max_parallelism(),
            KeyedStateBackend::Embedded(b) => b.max_parallelism(),
        }
    }

    /// Where a key lives. A key outside this backend's key groups was routed
    /// to the wrong subtask: that is a bug, not bad input.
    #[inline]
    pub fn locate(&self, key: &K) -> KeySlot {
        let hash = key_hash(key);
        let group = key_group_for_hash(hash, self.max_parallelism());
        let range = self.key_groups();
        assert!(
            range.contains(group),
            "key {key:?} of {group} reached a subtask owning {range:?}",
        );
        KeySlot {
            hash: hash.rotate_left(32),
            group: range.offset(group),
        }
    }

    /// Whether readying keys ([`Self::prepare`]) may read them from a
    /// database: on an embedded backend whose cache is not whole.
    pub(crate) fn reads_on_miss(&self) -> bool {
        match self {
            KeyedStateBackend::Heap(_) => false,
            KeyedStateBackend::Embedded(b) => b.reads_on_miss(),
        }
    }

    /// Readies the state of the keys of a batch, before any of its records
    /// is processed: where each lives goes to `slots` (emptied first), and
    /// the RocksDB backend reads what its cache misses in one multi-get per
    /// state instead of a read per record.
    pub fn prepare(&mut self, keys: &[K], slots: &mut Vec<KeySlot>) {
        slots.clear();
        slots.extend(keys.iter().map(|key| self.locate(key)));
        match self {
            KeyedStateBackend::Heap(b) => b.clean_up(keys.len()),
            KeyedStateBackend::Embedded(b) => {
                if let Err(e) = b.read_ahead(keys, slots) {
                    panic!("reading the keyed state of a batch: {e}");
                }
            }
        }
    }

    /// Before the record `i` of a batch whose keys are at `slots` (from
    /// [`Self::prepare`]): starts bringing the state of the record
    /// `PREFETCH_DISTANCE` ahead (and, before the first, of those up to
    /// it) into the CPU's cache, so that its lookup does not wait for
    /// memory: the heap's tables, or the embedded store's cache.
    #[inline]
    pub fn prefetch_ahead(&self, slots: &[KeySlot], i: usize) {
        match self {
            KeyedStateBackend::Heap(b) => prefetch_slots(slots, i, |s, t| b.prefetch(s, t)),
            KeyedStateBackend::Embedded(b) => prefetch_slots(slots, i, |s, t| b.prefetch(s, t)),
        }
    }

    /// `reduce`: how values added to a reducing state combine; `form`:
    /// with or without TTL.
    fn register<S: Data>(
        &mut self,
        name: &str,
        reduce: Option<Reduce<S>>,
        form: Form<K, S>,
    ) -> usize {
        match self {
            KeyedStateBackend::Heap(b) => b.register::<S>(name, form),
            KeyedStateBackend::Embedded(b) => b.register::<S>(name, reduce, form),
        }
    }

    /// The TTL of state `id`, if it has one.
    #[inline]
    fn ttl(&self, id: usize) -> Option<StateTtlConfig> {
        match self {
            KeyedStateBackend::Heap(b) => b.ttl(id),
            KeyedStateBackend::Embedded(b) => b.ttl(id),
        }
    }

    /// Processing time as the subtask last set it: what TTL measures.
    #[inline]
    fn now(&self) -> Millis {
        match self {
            KeyedStateBackend::Heap(b) => b.now(),
            KeyedStateBackend::Embedded(b) => b.now(),
        }
    }

    /// Processing time is `now`, ms since the Unix epoch (never going
    /// back): the clock of states with TTL.
    pub fn set_time(&mut self, now: Millis) {
        match self {
            KeyedStateBackend::Heap(b) => b.set_time(now),
            KeyedStateBackend::Embedded(b) => b.set_time(now),
        }
    }

    /// The synchronous part of checkpoint `checkpoint`: the heap's tables
    /// lent to the snapshot (see `heap`), or a RocksDB native checkpoint in a
    /// fresh directory, made off the subtask's thread unless the subtask
    /// needs its database first, or a copy of a churned write-back cache
    /// that holds every value, in the heap's format.
    pub fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<KeyedSnapshot, StateError> {
        match self {
            KeyedStateBackend::Heap(b) => Ok(KeyedSnapshot::Heap(b.snapshot())),
            KeyedStateBackend::Embedded(b) => b.snapshot(checkpoint),
        }
    }

    /// Loads the keyed part of `state`: a native checkpoint (RocksDB only)
    /// and key groups in the heap snapshot format (both backends). States
    /// must have been declared (by opening the operator) first.
    pub fn restore(&mut self, state: &RestoreState) -> Result<(), StateError> {
        match self {
            KeyedStateBackend::Heap(b) => b.restore(state),
            KeyedStateBackend::Embedded(b) => b.restore(state),
        }
    }

    /// Writes back what the backend holds in front of its store, before
    /// reading every key.
    pub fn flush(&mut self) -> Result<(), StateError> {
        match self {
            KeyedStateBackend::Heap(_) => Ok(()),
            KeyedStateBackend::Embedded(b) => b.write_back(),
        }
    }
}

macro_rules! state_handle {
    ($(#[$doc:meta])* $name:ident<$($p:ident),+>) => {
        $(#[$doc])*
        pub struct $name<$($p),+> {
            id: usize,
            _types: PhantomData<fn() -> ($($p,)+)>,
        }

        impl<$($p),+> Clone for $name<$($p),+> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<$($p),+> Copy for $name<$($p),+> {}

        impl<$($p),+> $name<$($p),+> {
            fn new(id: usize) -> Self {
                $name { id, _types: PhantomData }
            }
        }
    };
}

state_handle!(
    /// One value per key.
    ValueState<V>
);
state_handle!(
    /// A map per key.
    MapState<UK, UV>
);
state_handle!(
    /// A list per key.
    ListState<V>
);
state_handle!(
    /// A list per key whose elements expire one by one (declared with
    /// [`StateRegistrar::list_with_ttl`]).
    TtlListState<V>
);
state_handle!(
    /// A map per key whose entries expire one by one (declared with
    /// [`StateRegistrar::map_with_ttl`]).
    TtlMapState<UK, UV>
);

/// How the values added to a reducing state combine (Flink's
/// `ReduceFunction`): `reduce(acc, value)` folds `value` into `acc`. It must
/// be associative: RocksDB combines added values in any grouping, before and
/// after they meet the stored value. Closures (with typed parameters:
/// `|acc: &mut u64, n: u64| *acc += n`) and functions are reduce functions;
/// a unit struct implementing this trait names one, so a job can keep the
/// state in a struct field. The handle carries it as a type, so the heap's
/// add calls it inline.
pub trait ReduceFunction<V>: Clone + Send + Sync + 'static {
    /// Folds `value` into `acc`.
    fn reduce(&self, acc: &mut V, value: V);
}

impl<V, F: Fn(&mut V, V) + Clone + Send + Sync + 'static> ReduceFunction<V> for F {
    #[inline]
    fn reduce(&self, acc: &mut V, value: V) {
        self(acc, value)
    }
}

/// A reduce function as RocksDB's merge operator and cache keep it, behind
/// the type-erased state.
pub(crate) type Reduce<V> = Arc<dyn Fn(&mut V, V) + Send + Sync>;

/// One value per key that values are added to, combined by a reduce
/// function (Flink's `ReducingState`). Adding needs no read: on RocksDB an
/// add to a key the cache misses is written as a merge operand, and RocksDB
/// combines it with the stored value when it is read or compacted.
pub struct ReducingState<V, R> {
    id: usize,
    reduce: R,
    value: PhantomData<fn() -> V>,
}

impl<V, R: Clone> Clone for ReducingState<V, R> {
    fn clone(&self) -> Self {
        ReducingState {
            id: self.id,
            reduce: self.reduce.clone(),
            value: PhantomData,
        }
    }
}

/// A state holding one value per key: what [`AllKeys::values`] reads.
pub trait SingleValue<V>: sealed::Sealed {
    #[doc(hidden)]
    fn id(&self) -> usize;
}

mod sealed {
    pub trait Sealed {}
    impl<V> Sealed for super::ValueState<V> {}
    impl<V, R> Sealed for super::ReducingState<V, R> {}
    impl<UK, UV> Sealed for super::MapState<UK, UV> {}
    impl<V> Sealed for super::ListState<V> {}
}

impl<V> SingleValue<V> for ValueState<V> {
    fn id(&self) -> usize {
        self.id
    }
}

impl<V, R> SingleValue<V> for ReducingState<V, R> {
    fn id(&self) -> usize {
        self.id
    }
}

/// Declares the states of a keyed function when a subtask opens it.
pub struct StateRegistrar<'a, K: Key> {
    backend: &'a mut KeyedStateBackend<K>,
}

impl<'a, K: Key> StateRegistrar<'a, K> {
    /// Declares states in `backend`.
    pub fn new(backend: &'a mut KeyedStateBackend<K>) -> Self {
        StateRegistrar { backend }
    }

    /// Declares value state `name`. The name is what matches the state in a
    /// snapshot, so it must be unique in the operator and stable across
    /// versions of the job.
    pub fn value<V: Data>(&mut self, name: &str) -> ValueState<V> {
        ValueState::new(
            self.backend
                .register::<V>(name, None, Form::plain::<TtlValue<V>>()),
        )
    }

    /// Declares value state `name` whose values expire `ttl` after they
    /// were last written (see [`StateTtlConfig`]). It restores from a
    /// snapshot of the same state without TTL, and the reverse.
    pub fn value_with_ttl<V: Data>(&mut self, name: &str, ttl: StateTtlConfig) -> ValueState<V> {
        ValueState::new(
            self.backend
                .register::<TtlValue<V>>(name, None, Form::stamped(ttl)),
        )
    }

    /// Declares reducing state `name` (named as for [`value`](Self::value)),
    /// whose added values combine with `reduce` (see [`ReducingState`]).
    /// Its snapshots are those of a value state of `V`: a value state may
    /// become a reducing state of the same type and keep its state (not
    /// back, on RocksDB: a native checkpoint may hold merge operands, which
    /// only the reduce function can read).
    pub fn reducing<V: Data, R: ReduceFunction<V>>(
        &mut self,
        name: &str,
        reduce: R,
    ) -> ReducingState<V, R> {
        let erased = reduce.clone();
        let erased: Reduce<V> = Arc::new(move |acc, value| erased.reduce(acc, value));
        ReducingState {
            id: self
                .backend
                .register::<V>(name, Some(erased), Form::plain::<TtlValue<V>>()),
            reduce,
            value: PhantomData,
        }
    }

    /// Declares reducing state `name` (as [`reducing`](Self::reducing))
    /// whose value expires `ttl` after it was last added to: an add to an
    /// expired value starts again from the added value.
    pub fn reducing_with_ttl<V: Data, R: ReduceFunction<V>>(
        &mut self,
        name: &str,
        reduce: R,
        ttl: StateTtlConfig,
    ) -> ReducingState<V, R> {
        let erased = TtlReduce::new(ttl, reduce.clone());
        let erased: Reduce<TtlValue<V>> = Arc::new(move |acc, value| erased.reduce(acc, value));
        ReducingState {
            id: self
                .backend
                .register::<TtlValue<V>>(name, Some(erased), Form::stamped(ttl)),
            reduce,
            value: PhantomData,
        }
    }

    /// Declares map state `name` (named as for [`value`](Self::value)). A
    /// key's whole map is one value of the backend.
    pub fn map<UK: Key, UV: Data>(&mut self, name: &str) -> MapState<UK, UV> {
        MapState::new(self.backend.register::<FxHashMap<UK, UV>>(
            name,
            None,
            Form::plain::<FxHashMap<UK, TtlValue<UV>>>(),
        ))
    }

    /// Declares map state `name` whose entries expire one by one, `ttl`
    /// after each was last written; read and written through
    /// [`KeyedContext::ttl_map`].
    pub fn map_with_ttl<UK: Key, UV: Data>(
        &mut self,
        name: &str,
        ttl: StateTtlConfig,
    ) -> TtlMapState<UK, UV> {
        TtlMapState::new(self.backend.register::<FxHashMap<UK, TtlValue<UV>>>(
            name,
            None,
            Form::stamped(ttl),
        ))
    }

    /// Declares list state `name` (named as for [`value`](Self::value)).
    pub fn list<V: Data>(&mut self, name: &str) -> ListState<V> {
        ListState::new(self.backend.register::<Vec<V>>(
            name,
            None,
            Form::plain::<Vec<TtlValue<V>>>(),
        ))
    }

    /// Declares list state `name` whose elements expire one by one, `ttl`
    /// after each was added; read and written through
    /// [`KeyedContext::ttl_list`].
    pub fn list_with_ttl<V: Data>(&mut self, name: &str, ttl: StateTtlConfig) -> TtlListState<V> {
        TtlListState::new(
            self.backend
                .register::<Vec<TtlValue<V>>>(name, None, Form::stamped(ttl)),
        )
    }
}

/// The state and timers of the current key, handed to a keyed function with
/// each record and each timer.
pub struct KeyedContext<'a, K: Key> {
    backend: &'a mut KeyedStateBackend<K>,
    key: &'a K,
    slot: KeySlot,
    timers: Option<&'a mut TimerService<K>>,
    fired: Option<TimeDomain>,
    /// The operator's broadcast states, read-only: none outside a keyed
    /// broadcast operator.
    broadcast: Option<&'a BroadcastStates>,
}

impl<'a, K: Key> KeyedContext<'a, K> {
    /// The state of `key`, without timers. Tests and benchmarks drive a
    /// backend directly with it; the runtime gives functions a context
    /// with their timers.
    #[inline]
    pub fn new(backend: &'a mut KeyedStateBackend<K>, key: &'a K) -> Self {
        let slot = backend.locate(key);
        KeyedContext {
            backend,
            key,
            slot,
            timers: None,
            fired: None,
            broadcast: None,
        }
    }

    /// The state and timers of `key`.
    pub(crate) fn with_timers(
        backend: &'a mut KeyedStateBackend<K>,
        key: &'a K,
        timers: &'a mut TimerService<K>,
        broadcast: &'a BroadcastStates,
    ) -> Self {
        let slot = backend.locate(key);
        Self::located(backend, key, slot, timers, broadcast)
    }

    /// This context is for firing a timer of `domain`.
    pub(crate) fn firing(self, domain: TimeDomain) -> Self {
        KeyedContext {
            fired: Some(domain),
            ..self
        }
    }

    /// The state and timers of a record's `key`, found at `slot` by
    /// [`KeyedStateBackend::prepare`].
    #[inline]
    pub(crate) fn located(
        backend: &'a mut KeyedStateBackend<K>,
        key: &'a K,
        slot: KeySlot,
        timers: &'a mut TimerService<K>,
        broadcast: &'a BroadcastStates,
    ) -> Self {
        KeyedContext {
            backend,
            key,
            slot,
            timers: Some(timers),
            fired: None,
            broadcast: Some(broadcast),
        }
    }

    /// The key of the record being processed.
    pub fn key(&self) -> &K {
        self.key
    }

    /// The current key's value of `state`.
    #[inline]
    pub fn value<V: Data>(&mut self, state: &ValueState<V>) -> Entry<'_, K, V> {
        self.entry(state.id)
    }

    /// The current key's map of `state`.
    pub fn map<UK: Key, UV: Data>(
        &mut self,
        state: &MapState<UK, UV>,
    ) -> Entry<'_, K, FxHashMap<UK, UV>> {
        self.entry(state.id)
    }

    /// The current key's list of `state`.
    pub fn list<V: Data>(&mut self, state: &ListState<V>) -> Entry<'_, K, Vec<V>> {
        self.entry(state.id)
    }

    /// The current key's list of `state`, whose elements expire.
    pub fn ttl_list<V: Data>(&mut self, state: &TtlListState<V>) -> TtlList<'_, K, V> {
        let (config, now) = self.ttl_of(state.id);
        TtlList::new(
            slot_of(self.backend, self.key, self.slot, state.id),
            config,
            now,
        )
    }

    /// The current key's map of `state`, whose entries expire.
    pub fn ttl_map<UK: Key, UV: Data>(
        &mut self,
        state: &TtlMapState<UK, UV>,
    ) -> TtlMap<'_, K, UK, UV> {
        let (config, now) = self.ttl_of(state.id);
        TtlMap::new(
            slot_of(self.backend, self.key, self.slot, state.id),
            config,
            now,
        )
    }

    fn ttl_of(&self, id: usize) -> (StateTtlConfig, Millis) {
        let config = self
            .backend
            .ttl(id)
            .expect("TTL handles name states with TTL");
        (config, self.backend.now())
    }

    /// The current key's value of `state`.
    #[inline]
    pub fn reducing<'s, V: Data, R: ReduceFunction<V>>(
        &'s mut self,
        state: &'s ReducingState<V, R>,
    ) -> Reducing<'s, K, V, R> {
        Reducing {
            backend: self.backend,
            key: self.key,
            slot: self.slot,
            state,
        }
    }

    #[inline]
    fn entry<S: Data>(&mut self, id: usize) -> Entry<'_, K, S> {
        entry_of(self.backend, self.key, self.slot, id)
    }

    fn timer_service(&mut self) -> &mut TimerService<K> {
        self.timers.as_deref_mut().expect(
            "timers are only available to functions the runtime runs (KeyedContext::new has none)",
        )
    }

    /// Sets a timer of the current key at `timestamp` in `domain`; a timer
    /// already set there stays one timer.
    pub fn register_timer(&mut self, domain: TimeDomain, timestamp: u64) {
        let id = self.timer_service().state().id;
        let added = entry_of::<K, KeyTimers>(self.backend, self.key, self.slot, id)
            .get_or_default()
            .insert(domain, timestamp);
        let key = self.key;
        let timers = self.timer_service();
        if added {
            timers.added(domain, timestamp, key);
            timers.counters().timers_registered += 1;
        }
    }

    /// Sets an implied event-time timer of the current key at `timestamp`:
    /// one the function's own keyed state records, so that only the timer
    /// service's index holds it; the function names it again after a
    /// restore (`KeyedProcessFunction::restore_timers`). It cannot be
    /// deleted, and a timer set twice fires twice.
    pub fn register_implied_timer(&mut self, timestamp: u64) {
        let key = self.key.clone();
        let timers = self.timer_service();
        timers.implied(timestamp, key);
        timers.counters().timers_registered += 1;
    }

    /// Whether the current key has event-time keyed timers.
    pub(crate) fn has_event_time_timers(&mut self) -> bool {
        let id = self.timer_service().state().id;
        entry_of::<K, KeyTimers>(self.backend, self.key, self.slot, id)
            .get()
            .is_some_and(|t| t.timestamps(TimeDomain::EventTime).next().is_some())
    }

    /// Deletes the current key's timer at `timestamp` in `domain`, if set.
    pub fn delete_timer(&mut self, domain: TimeDomain, timestamp: u64) {
        self.remove_timer(domain, timestamp);
    }

    /// Drops a timer from the keyed state; true if it was set.
    pub(crate) fn remove_timer(&mut self, domain: TimeDomain, timestamp: u64) -> bool {
        let id = self.timer_service().state().id;
        let removed = entry_of::<K, KeyTimers>(self.backend, self.key, self.slot, id)
            .update(|t| t.remove(domain, timestamp), |t| !t.is_empty())
            == Some(true);
        if removed {
            let key = self.key;
            self.timer_service().removed(domain, timestamp, key);
        }
        removed
    }

    /// [`register_timer`](Self::register_timer) in event time.
    pub fn register_event_time_timer(&mut self, timestamp: u64) {
        self.register_timer(TimeDomain::EventTime, timestamp)
    }

    /// [`delete_timer`](Self::delete_timer) in event time.
    pub fn delete_event_time_timer(&mut self, timestamp: u64) {
        self.delete_timer(TimeDomain::EventTime, timestamp)
    }

    /// [`register_timer`](Self::register_timer) in processing time.
    pub fn register_processing_time_timer(&mut self, timestamp: Millis) {
        self.register_timer(TimeDomain::ProcessingTime, timestamp)
    }

    /// [`delete_timer`](Self::delete_timer) in processing time.
    pub fn delete_processing_time_timer(&mut self, timestamp: Millis) {
        self.delete_timer(TimeDomain::ProcessingTime, timestamp)
    }

    /// The operator's watermark: every record with a timestamp at or below
    /// it has arrived (`None` before the first watermark).
    pub fn current_watermark(&mut self) -> Option<u64> {
        self.timer_service().watermark()
    }

    /// Processing time, ms since the Unix epoch, as of the current batch.
    pub fn current_processing_time(&mut self) -> Millis {
        self.timer_service().now()
    }

    /// The map of broadcast state `state`, read-only: in a keyed broadcast
    /// operator only its broadcast input changes it.
    pub fn broadcast_state<UK: Key, UV: Data>(
        &self,
        state: &MapStateDescriptor<UK, UV>,
    ) -> &'a rustc_hash::FxHashMap<UK, UV> {
        self.broadcast
            .expect("broadcast state is only available to the functions of broadcast operators")
            .get(state)
    }

    /// In `on_timer`: the domain of the timer firing.
    pub fn timer_domain(&self) -> Option<TimeDomain> {
        self.fired
    }

    pub(crate) fn time_counters(&mut self) -> &mut TimeCounters {
        self.timer_service().counters()
    }
}

#[inline]
fn entry_of<'e, K: Key, S: Data>(
    backend: &'e mut KeyedStateBackend<K>,
    key: &'e K,
    slot: KeySlot,
    id: usize,
) -> Entry<'e, K, S> {
    match backend.ttl(id) {
        None => Entry(Access::Plain(slot_of(backend, key, slot, id))),
        Some(config) => {
            let now = backend.now();
            let mut slot = slot_of::<K, TtlValue<S>>(backend, key, slot, id);
            let expired = slot.get().map(|t| config.expired(t.at, now));
            match expired {
                Some(true) if !config.returns_expired() => drop(slot.clear()),
                Some(false) if config.renews_on_read() => {
                    slot.get_mut().expect("found above").at = now;
                }
                _ => {}
            }
            Entry(Access::Ttl { slot, now })
        }
    }
}

/// The slot of `key` in state `id`, whose values are `T`.
#[inline]
fn slot_of<'e, K: Key, T: Data>(
    backend: &'e mut KeyedStateBackend<K>,
    key: &'e K,
    slot: KeySlot,
    id: usize,
) -> Slot<'e, K, T> {
    match backend {
        KeyedStateBackend::Heap(b) => Slot::Heap {
            table: b.group_mut::<T>(id, slot.group),
            key,
            hash: slot.hash,
        },
        KeyedStateBackend::Embedded(b) => Slot::Embedded(b.entry::<T>(id, key, slot)),
    }
}

/// One key's slot of one state, whose values are `T`.
///
/// On the heap it is the slot in the state's table. On RocksDB the value is
/// read once, when the slot is made, into the backend's write-back cache;
/// the slot works on that copy and marks it dirty when it is set, cleared or
/// handed out mutably, and the cache writes dirty values back to RocksDB in
/// batches (see `EmbeddedKeyedStateBackend`).
enum Slot<'a, K: Key, T> {
    Heap {
        table: &'a mut GroupTable<K, T>,
        key: &'a K,
        hash: u64,
    },
    Embedded(&'a mut CachedValue<T>),
}

impl<'a, K: Key, T: Data> Slot<'a, K, T> {
    fn into_value(self) -> Option<&'a T> {
        match self {
            Slot::Heap { table, key, hash } => find(table, key, hash),
            Slot::Embedded(cached) => cached.value.as_ref(),
        }
    }

    fn get(&self) -> Option<&T> {
        match self {
            Slot::Heap { table, key, hash } => find(table, key, *hash),
            Slot::Embedded(cached) => cached.value.as_ref(),
        }
    }

    fn get_mut(&mut self) -> Option<&mut T> {
        match self {
            Slot::Heap { table, key, hash } => table
                .find_mut(*hash, |(k, _)| k == *key)
                .map(|(_, value)| value),
            Slot::Embedded(cached) => {
                if cached.value.is_some() {
                    cached.mark();
                }
                cached.value.as_mut()
            }
        }
    }

    fn set(&mut self, value: T) {
        match self {
            Slot::Heap { table, key, hash } => {
                match table.entry(*hash, |(k, _)| k == *key, |(k, _)| table_hash(k)) {
                    hash_table::Entry::Occupied(mut slot) => slot.get_mut().1 = value,
                    hash_table::Entry::Vacant(slot) => {
                        slot.insert(((*key).clone(), value));
                    }
                }
            }
            Slot::Embedded(cached) => {
                cached.value = Some(value);
                cached.mark();
            }
        }
    }

    fn clear(&mut self) -> Option<T> {
        match self {
            Slot::Heap { table, key, hash } => {
                let entry = table.find_entry(*hash, |(k, _)| k == *key).ok()?;
                Some(entry.remove().0 .1)
            }
            Slot::Embedded(cached) => {
                let old = cached.value.take();
                if old.is_some() {
                    cached.mark();
                }
                old
            }
        }
    }

    fn update<R>(
        &mut self,
        f: impl FnOnce(&mut T) -> R,
        keep: impl FnOnce(&T) -> bool,
    ) -> Option<R> {
        match self {
            Slot::Heap { table, key, hash } => {
                let mut slot = table.find_entry(*hash, |(k, _)| k == *key).ok()?;
                let result = f(&mut slot.get_mut().1);
                if !keep(&slot.get().1) {
                    slot.remove();
                }
                Some(result)
            }
            Slot::Embedded(cached) => {
                let value = cached.value.as_mut()?;
                let result = f(value);
                if !keep(value) {
                    cached.value = None;
                }
                cached.mark();
                Some(result)
            }
        }
    }

    #[inline]
    fn get_or_insert_with(&mut self, make: impl FnOnce() -> T) -> &mut T {
        match self {
            Slot::Heap { table, key, hash } => {
                let key = *key;
                &mut table
                    .entry(*hash, |(k, _)| k == key, |(k, _)| table_hash(k))
                    .or_insert_with(|| (key.clone(), make()))
                    .into_mut()
                    .1
            }
            Slot::Embedded(cached) => {
                cached.mark();
                cached.value.get_or_insert_with(make)
            }
        }
    }
}

fn find<'t, K: Key, S>(table: &'t GroupTable<K, S>, key: &K, hash: u64) -> Option<&'t S> {
    table.find(hash, |(k, _)| k == key).map(|(_, s)| s)
}

/// One key's value of one state. A state with TTL keeps it stamped: what
/// had expired when the entry was made is gone (unless the state returns
/// expired values), and every write renews the timestamp.
pub struct Entry<'a, K: Key, S>(Access<'a, K, S>);

enum Access<'a, K: Key, S> {
    Plain(Slot<'a, K, S>),
    Ttl {
        slot: Slot<'a, K, TtlValue<S>>,
        now: Millis,
    },
}

impl<'a, K: Key, S: Data> Entry<'a, K, S> {
    fn into_value(self) -> Option<&'a S> {
        match self.0 {
            Access::Plain(slot) => slot.into_value(),
            Access::Ttl { slot, .. } => slot.into_value().map(|t| &t.value),
        }
    }

    /// The value, if the key has one.
    pub fn get(&self) -> Option<&S> {
        match &self.0 {
            Access::Plain(slot) => slot.get(),
            Access::Ttl { slot, .. } => slot.get().map(|t| &t.value),
        }
    }

    /// Replaces the value.
    pub fn set(&mut self, value: S) {
        match &mut self.0 {
            Access::Plain(slot) => slot.set(value),
            Access::Ttl { slot, now } => slot.set(TtlValue::new(value, *now)),
        }
    }

    /// Removes the value; returns what it was.
    pub fn clear(&mut self) -> Option<S> {
        match &mut self.0 {
            Access::Plain(slot) => slot.clear(),
            Access::Ttl { slot, .. } => slot.clear().map(|t| t.value),
        }
    }

    /// Changes the value in place with `f`, if the key has one, then
    /// removes it unless `keep` holds: one lookup.
    pub fn update<R>(
        &mut self,
        f: impl FnOnce(&mut S) -> R,
        keep: impl FnOnce(&S) -> bool,
    ) -> Option<R> {
        match &mut self.0 {
            Access::Plain(slot) => slot.update(f, keep),
            Access::Ttl { slot, now } => slot.update(
                |t| {
                    t.at = *now;
                    f(&mut t.value)
                },
                |t| keep(&t.value),
            ),
        }
    }

    /// The slot, created with `S::default()` if empty: one lookup for a
    /// read-modify-write, which is what counters and lists want.
    #[inline]
    pub fn get_or_default(&mut self) -> &mut S
    where
        S: Default,
    {
        match &mut self.0 {
            Access::Plain(slot) => slot.get_or_insert_with(S::default),
            Access::Ttl { slot, now } => {
                let stamped = slot.get_or_insert_with(|| TtlValue::new(S::default(), *now));
                stamped.at = *now;
                &mut stamped.value
            }
        }
    }
}

/// One key's value of a reducing state.
pub struct Reducing<'a, K: Key, V, R> {
    backend: &'a mut KeyedStateBackend<K>,
    key: &'a K,
    slot: KeySlot,
    state: &'a ReducingState<V, R>,
}

impl<K: Key, V: Data, R: ReduceFunction<V>> Reducing<'_, K, V, R> {
    /// Combines `value` into the key's value (or makes it the value). On
    /// RocksDB this reads nothing.
    #[inline]
    pub fn add(&mut self, value: V) {
        let ReducingState { id, reduce, .. } = self.state;
        match self.backend.ttl(*id) {
            None => add_to(self.backend, *id, self.key, self.slot, value, reduce),
            Some(config) => {
                let stamped = TtlValue::new(value, self.backend.now());
                let reduce = TtlReduce::new(config, reduce.clone());
                match &mut *self.backend {
                    KeyedStateBackend::Heap(_) => {
                        add_to(self.backend, *id, self.key, self.slot, stamped, &reduce)
                    }
                    // Whether an add starts again depends on the time of
                    // the value it meets, which adds combined before they
                    // meet it (a merge operand) would lose: read it first.
                    KeyedStateBackend::Embedded(b) => b
                        .entry::<TtlValue<V>>(*id, self.key, self.slot)
                        .add(stamped, &reduce),
                }
            }
        }
    }

    /// The key's value, everything added so far combined.
    pub fn get(&mut self) -> Option<&V> {
        entry_of(self.backend, self.key, self.slot, self.state.id).into_value()
    }

    /// Removes the value; returns what it was.
    pub fn clear(&mut self) -> Option<V> {
        entry_of(self.backend, self.key, self.slot, self.state.id).clear()
    }
}

/// Combines `value` into the value of `key` in reducing state `id`, whose
/// values are `S`.
#[inline]
fn add_to<K: Key, S: Data>(
    backend: &mut KeyedStateBackend<K>,
    id: usize,
    key: &K,
    slot: KeySlot,
    value: S,
    reduce: &impl ReduceFunction<S>,
) {
    match backend {
        KeyedStateBackend::Heap(b) => {
            match b.group_mut::<S>(id, slot.group).entry(
                slot.hash,
                |(k, _)| k == key,
                |(k, _)| table_hash(k),
            ) {
                hash_table::Entry::Occupied(mut slot) => {
                    reduce.reduce(&mut slot.get_mut().1, value)
                }
                hash_table::Entry::Vacant(slot) => {
                    slot.insert((key.clone(), value));
                }
            }
        }
        KeyedStateBackend::Embedded(b) => b.add(id, key, slot, value, reduce),
    }
}

/// Read access to every key's state, for work that is not about one record:
/// emitting final results at the end of input.
pub struct AllKeys<'a, K: Key> {
    backend: &'a KeyedStateBackend<K>,
}

impl<'a, K: Key> AllKeys<'a, K> {
    /// `backend` must have been flushed (`KeyedStateBackend::flush`).
    pub(crate) fn new(backend: &'a KeyedStateBackend<K>) -> Self {
        AllKeys { backend }
    }

    /// Every key with a value, and the value, key group by key group. A
    /// state with TTL gives the values that have not expired (or all it
    /// still has, if it returns expired values).
    pub fn values<V: Data>(
        &self,
        state: &impl SingleValue<V>,
    ) -> Box<dyn Iterator<Item = (K, V)> + 'a> {
        let id = state.id();
        let Some(config) = self.backend.ttl(id) else {
            return self.entries::<V>(id);
        };
        let now = self.backend.now();
        Box::new(
            self.entries::<TtlValue<V>>(id)
                .filter(move |(_, t)| config.returns_expired() || !config.expired(t.at, now))
                .map(|(k, t)| (k, t.value)),
        )
    }

    /// Every key and value of state `id`, whose values are `S`.
    fn entries<S: Data>(&self, id: usize) -> Box<dyn Iterator<Item = (K, S)> + 'a> {
        match self.backend {
            KeyedStateBackend::Heap(b) => {
                Box::new(b.entries::<S>(id).map(|(k, v)| (k.clone(), v.clone())))
            }
            KeyedStateBackend::Embedded(b) => Box::new(b.entries::<S>(id)),
        }
    }

    /// Every key with a value in state `id`, of values `S`.
    pub(crate) fn keys<S: Data>(&self, id: usize) -> Vec<K> {
        match self.backend.ttl(id) {
            None => self.entries::<S>(id).map(|(k, _)| k).collect(),
            Some(_) => self.entries::<TtlValue<S>>(id).map(|(k, _)| k).collect(),
        }
    }
}

#[cfg(test)]
mod tests;
