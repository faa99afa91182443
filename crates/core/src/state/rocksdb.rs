//! RocksDB backend: one database per subtask, one column family per declared
//! state (named after it), in a working directory of its own that is removed
//! with the backend.
//!
//! A key is stored as the big-endian `u16` of its key group followed by the
//! MessagePack (rmp-serde) encoding of the key, so that the keys of a key
//! group are contiguous and a key-group range can be cut out with a range
//! delete or read with one seek. A value is its MessagePack encoding; a map
//! or list state is one value per key, as on the heap.
//!
//! Tuning, for many small read-modify-writes from one thread and snapshots
//! that are native checkpoints:
//! - No write-ahead log: a checkpoint flushes the memtables, so the log would
//!   only ever protect writes that the restart discards anyway.
//! - 64 MiB write buffers, up to 4 per column family: point updates of a
//!   large key set produce many versions of the same keys, and a big memtable
//!   absorbs them before they cost a flush and a compaction; a whole-key bloom
//!   filter on the memtables, small enough to stay in cache, makes the many
//!   lookups of keys that are not in them cheap.
//! - One LRU block cache per database, shared by its column families, so that
//!   a busy state can use what an idle one does not.
//! - SST files of 16 KiB blocks, compressed with ZSTD at every level: a
//!   sorted run of wordcount's 1,000,000 keys is 6.9 MB, against 11.3 MB
//!   with LZ4 and 4 KiB blocks. (LZ4 stays linked: checkpoints written
//!   before still open.) A 10 bits/key bloom filter, except in the last
//!   level (`optimize_filters_for_hits`), where a lookup that gets that
//!   far is for a key that exists; no hash index in data blocks. Those
//!   filters and the index were 1.2 of the 12.5 bytes a key took in a run,
//!   for no throughput we could measure.
//! - Universal compaction, tuned for the two ends of churn. Under small
//!   change over a large state, an incremental checkpoint should upload
//!   about the change: recent small runs merge among themselves, at least
//!   8 at once, so that a key is rewritten about log8 (state / change)
//!   times, and the large run is rewritten only when the others add up to
//!   half of it. Under full churn (every key updated between checkpoints)
//!   every flush is a new run holding every key, and every older run is
//!   stale: compaction starts at 2 runs, so that the new run and the old
//!   one merge at once rather than piling up to 8. Measured at 1,000,000
//!   keys against the settings before (LZ4, 4 KiB blocks, compaction from
//!   8 runs at 200 % size amplification, merges at least 4 wide): the state
//!   a full-churn checkpoint references went from 35-93 MB to about 12 MB
//!   (Flink: 15 MB), and uploads at 1 % change per checkpoint from 2.90 %
//!   of a 9.0 MiB state to 2.92 % of 5.3 MiB (`benches/incremental.rs`).
//! - A write-back cache of typed values in front of the database (see
//!   `RocksDbKeyedStateBackend`), which turns a read-modify-write per record
//!   into one read per key and one sorted, batched write per write-back.
//!   What the cache misses of a batch's keys is read ahead, before its
//!   records run, in one sorted multi-get per state that records read.
//! - Reducing states add without reading: a key the cache misses is cached
//!   with only what was added to it, written back as a merge operand, and
//!   the column family's merge operator (the state's reduce function)
//!   combines operands and values when RocksDB reads, flushes or compacts.
//!   A record whose key is beyond the cache then costs one memtable insert
//!   instead of a lookup and an insert: wordcount at 1,000,000 keys with a
//!   65,536-value cache went from 0.48-0.57 to 0.87-1.08 M records/s (six
//!   interleaved runs each).

use super::heap::table_hash;
use super::{Key, KeySlot, Reduce, ReduceFunction, StateBackend, StateError};
use crate::batch::Data;
use crate::ids::{CheckpointId, KeyGroup};
use crate::key_group::KeyGroupRange;
use crate::task::{NativeCheckpoint, NativeFile, RestoreState};
use ::rocksdb::checkpoint::Checkpoint;
use ::rocksdb::merge_operator::MergeOperands;
use ::rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DBCompactionStyle,
    DBCompressionType, DBRawIteratorWithThreadMode, FlushOptions, LogLevel, Options, ReadOptions,
    UniversalCompactOptions, WriteBatch, WriteOptions, DB, DEFAULT_COLUMN_FAMILY_NAME,
};
use hashbrown::{hash_table, HashTable};
use serde::Serialize;
use std::any::Any;
use std::fmt::Debug;
use std::fs;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

/// Memtable size per column family.
const WRITE_BUFFER_BYTES: usize = 64 << 20;
/// Memtables per column family, the active one included.
const WRITE_BUFFERS: i32 = 4;
/// The memtable bloom filter's size as a share of the write buffer: 1.3 MB,
/// about 6 bits a key at the 1.5-2 M entries a full memtable holds, and
/// within a core's L2 cache (2 MiB here). At 0.1 (6.4 MB) every insert
/// missed the cache in the filter: 80 % of `MemTable::Add`'s time, 8 % of
/// wordcount's with a 65,536-value cache at 1,000,000 keys.
const MEMTABLE_BLOOM_RATIO: f64 = 0.02;
/// The block cache of one database.
const BLOCK_CACHE_BYTES: usize = 64 << 20;
/// Uncompressed size of an SST data block: larger blocks compress better.
const BLOCK_BYTES: usize = 16 << 10;
/// Key groups are written as a big-endian `u16`; Flink's bound is 2^15.
const MAX_KEY_GROUPS: u32 = 1 << 15;

/// Bytes of imported entries written at once.
const IMPORT_BATCH_BYTES: usize = 4 << 20;

/// A value as an entry sees it: read once from the database, changed in
/// place, written back by the cache when `dirty`.
pub(crate) struct CachedValue<S> {
    pub(crate) value: Option<S>,
    pub(crate) dirty: bool,
    /// A reducing state's key whose stored value was not read: `value`
    /// holds what was added since it was cached, which is written back as
    /// a merge operand (and the key dropped from the cache: it holds
    /// nothing more). Entries never see it: they resolve it first.
    partial: bool,
}

impl<S> CachedValue<S> {
    fn new(value: Option<S>) -> Self {
        CachedValue {
            value,
            dirty: false,
            partial: false,
        }
    }

    fn add(&mut self, value: S, reduce: &impl ReduceFunction<S>) {
        match &mut self.value {
            Some(acc) => reduce.reduce(acc, value),
            None => self.value = Some(value),
        }
        self.dirty = true;
    }

    /// Puts what was added (if anything) on top of `stored`, the value read
    /// from the database. A dirty result is written back whole, replacing
    /// the merge operands stored before it.
    fn resolve(&mut self, stored: Option<S>, reduce: Option<&Reduce<S>>) {
        self.partial = false;
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
trait RocksState<K>: Send {
    fn name(&self) -> &str;
    /// `base` with what the state adds: a reducing state's merge operator.
    fn column_family_options(&self, base: &Options) -> Options;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn clear_cache(&mut self);
    /// Adds the dirty values to `batch`, in key order, and marks them clean;
    /// returns how many partial values it dropped from the cache.
    fn write_back(
        &mut self,
        cf: &ColumnFamily,
        batch: &mut WriteBatch,
        buffers: &mut Buffers,
    ) -> usize;
    /// Drops the clean values not used since the last sweep and clears the
    /// mark of the others; returns how many are left.
    fn evict_unreferenced(&mut self) -> usize;
    /// Drops up to `n` clean values; returns how many it dropped.
    fn evict(&mut self, n: usize) -> usize;
    /// Whether a record has used this state since the database opened.
    fn used(&self) -> bool;
    /// Reads the values of `keys` (at `slots`) that the cache misses, at
    /// most `room` of them, in one multi-get, and caches them; returns how
    /// many it cached.
    fn read_ahead(&mut self, read: ReadAhead<'_, K>, room: usize) -> Result<usize, StateError>;
    /// Decodes the entries of one key group in the heap snapshot format and
    /// adds them to `batch`.
    fn restore_group(
        &mut self,
        cf: &ColumnFamily,
        group: u16,
        input: &mut &[u8],
        batch: &mut WriteBatch,
        buffers: &mut Buffers,
    ) -> Result<(), StateError>;
}

struct State<K, S> {
    name: String,
    cache: HashTable<Cached<K, S>>,
    /// Some record has read it: batches read it ahead.
    used: bool,
    /// A reducing state's function.
    reduce: Option<Reduce<S>>,
}

/// What a read-ahead of one state needs besides the state.
struct ReadAhead<'a, K> {
    db: &'a DB,
    cf: &'a ColumnFamily,
    options: &'a ReadOptions,
    keys: &'a [K],
    slots: &'a [KeySlot],
    /// Key group of slot group 0.
    first_group: u32,
}

/// A value read from the database, decoded; a value that does not decode
/// is a fatal error of the subtask.
fn decode<S: Data>(name: &str, key: &impl Debug, bytes: &[u8]) -> S {
    rmp_serde::from_slice(bytes)
        .unwrap_or_else(|e| panic!("keyed state {name:?} of {key:?} does not decode: {e}"))
}

/// The merge operator of a reducing state: the stored value (if any) and
/// the operands, oldest first, decoded and folded with `reduce`. RocksDB
/// calls it on its own threads, through C: a value that does not decode or
/// a panicking `reduce` fails the merge (RocksDB then reports corruption to
/// the read or compaction that needed it) instead of unwinding into C.
fn merge_operator<S: Data>(
    reduce: Reduce<S>,
) -> impl Fn(&[u8], Option<&[u8]>, &MergeOperands) -> Option<Vec<u8>> + Clone {
    move |_key, stored, operands| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut values = stored
                .into_iter()
                .chain(operands)
                .map(rmp_serde::from_slice::<S>);
            let mut acc = values.next()?.ok()?;
            for value in values {
                reduce(&mut acc, value.ok()?);
            }
            rmp_serde::to_vec(&acc).ok()
        }))
        .ok()
        .flatten()
    }
}

/// Reused encoding buffers: no allocation per key once they have grown.
#[derive(Default)]
struct Buffers {
    key: Vec<u8>,
    pending: Pending,
}

/// A database key: the big-endian key group, then the key in rmp-serde.
fn write_key<K: Serialize>(out: &mut Vec<u8>, group: u16, key: &K) {
    out.extend_from_slice(&group.to_be_bytes());
    rmp_serde::encode::write(out, key).expect("keys serialize to memory");
}

/// Encoded writes of one column family, to be sorted by key before they go
/// into a write batch: the memtable inserts of a sorted batch each start
/// where the previous one ended, instead of searching the skip list from
/// the top with a cold cache.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    writes: Vec<Write>,
}

/// One write in `Pending::bytes`.
struct Write {
    /// The key's first eight bytes, big endian and zero-padded: most
    /// comparisons of the sort end here, without reaching into `bytes`
    /// (2-3 times faster at 500,000 writes).
    prefix: u64,
    start: usize,
    key_len: usize,
    /// `None`: a delete.
    value_len: Option<usize>,
    /// A merge operand rather than a value.
    merge: bool,
}

impl Pending {
    /// `value`: `None` deletes; `merge`: the value is a merge operand.
    fn push<K: Serialize, S: Serialize>(
        &mut self,
        group: u16,
        key: &K,
        value: Option<&S>,
        merge: bool,
    ) {
        let start = self.bytes.len();
        write_key(&mut self.bytes, group, key);
        let key_len = self.bytes.len() - start;
        let mut prefix = [0u8; 8];
        let head = &self.bytes[start..][..key_len.min(8)];
        prefix[..head.len()].copy_from_slice(head);
        let value_len = value.map(|value| {
            rmp_serde::encode::write(&mut self.bytes, value).expect("values serialize to memory");
            self.bytes.len() - start - key_len
        });
        self.writes.push(Write {
            prefix: u64::from_be_bytes(prefix),
            start,
            key_len,
            value_len,
            merge,
        });
    }

    /// Adds the writes to `batch` in key order and empties itself.
    fn write_sorted(&mut self, cf: &ColumnFamily, batch: &mut WriteBatch) {
        let bytes = &self.bytes;
        let key = |write: &Write| &bytes[write.start..write.start + write.key_len];
        self.writes
            .sort_unstable_by(|a, b| a.prefix.cmp(&b.prefix).then_with(|| key(a).cmp(key(b))));
        for write in &self.writes {
            let Write {
                start,
                key_len,
                value_len,
                merge,
                ..
            } = *write;
            match value_len {
                Some(len) if merge => {
                    batch.merge_cf(cf, key(write), &bytes[start + key_len..][..len])
                }
                Some(len) => batch.put_cf(cf, key(write), &bytes[start + key_len..][..len]),
                None => batch.delete_cf(cf, key(write)),
            }
        }
        self.bytes.clear();
        self.writes.clear();
    }
}

impl Buffers {
    fn key<K: Serialize>(&mut self, group: u16, key: &K) -> &[u8] {
        self.key.clear();
        write_key(&mut self.key, group, key);
        &self.key
    }
}

impl<K: Key, S: Data> RocksState<K> for State<K, S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn column_family_options(&self, base: &Options) -> Options {
        let mut options = base.clone();
        if let Some(reduce) = &self.reduce {
            options
                .set_merge_operator_associative("tidemark.reduce", merge_operator(reduce.clone()));
        }
        options
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn clear_cache(&mut self) {
        self.cache.clear();
    }

    fn write_back(
        &mut self,
        cf: &ColumnFamily,
        batch: &mut WriteBatch,
        buffers: &mut Buffers,
    ) -> usize {
        let before = self.cache.len();
        self.cache.retain(|cached| {
            let cell = &mut cached.cell;
            if cell.dirty {
                cell.dirty = false;
                buffers
                    .pending
                    .push(cached.group, &cached.key, cell.value.as_ref(), cell.partial);
            }
            !cell.partial
        });
        buffers.pending.write_sorted(cf, batch);
        before - self.cache.len()
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
                    vacant.insert(Cached {
                        key: key.clone(),
                        group,
                        referenced: false,
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
        // RocksDB reads sorted keys block by block.
        missed.sort_unstable_by(|a, b| encoded[a.0.clone()].cmp(&encoded[b.0.clone()]));
        let values = read.db.batched_multi_get_cf_opt(
            read.cf,
            missed.iter().map(|(range, _, _)| &encoded[range.clone()]),
            true,
            read.options,
        );
        for ((_, key, hash), value) in missed.iter().zip(values) {
            let stored = value
                .map_err(rocks)?
                .map(|bytes| decode(&self.name, key, &bytes));
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
        cf: &ColumnFamily,
        group: u16,
        input: &mut &[u8],
        batch: &mut WriteBatch,
        buffers: &mut Buffers,
    ) -> Result<(), StateError> {
        let entries: Vec<(K, S)> =
            rmp_serde::from_read(input).map_err(|e| StateError::Decode(e.to_string()))?;
        for (key, value) in &entries {
            buffers.pending.push(group, key, Some(value), false);
        }
        buffers.pending.write_sorted(cf, batch);
        Ok(())
    }
}

fn rocks(error: ::rocksdb::Error) -> StateError {
    StateError::RocksDb(error.into_string())
}

/// The database and the directory it lives in. The database is declared
/// first so that it is closed before its directory is removed.
struct Open {
    db: DB,
    options: Options,
    dir: tempfile::TempDir,
    /// Tells this database's files from those of any other instance,
    /// earlier or later, that has files of the same names.
    instance: u64,
}

/// Keyed state in RocksDB.
///
/// In front of the database sits a write-back cache of typed values, bounded
/// by a number of entries over all states. An entry reads its value into the
/// cache once; later records of the same key find it there, deserialized.
/// When the cache is full, a record whose key is not in it first writes every
/// dirty value back in one write batch sorted by key, then evicts the values
/// not used since the last such sweep and others until the cache is half
/// full. Snapshots and `AllKeys` write it back first and keep the values,
/// clean. With uniform keys
/// the cache mostly batches the writes and coalesces repeated updates; with
/// skewed keys it also saves the reads of the hot ones. Capacity 1 is a
/// write-back per record.
///
/// Nothing touches the disk until the state is restored or first used: the
/// working directory `<local_dir>/<label>-<random>` and the database in its
/// `db/` are created then, and removed when the backend is dropped.
pub struct RocksDbKeyedStateBackend<K: Key> {
    range: KeyGroupRange,
    max_parallelism: u32,
    local_dir: PathBuf,
    label: String,
    states: Vec<Box<dyn RocksState<K>>>,
    /// Values in the cache, over all states.
    cached: usize,
    cache_capacity: usize,
    /// Some cached value may have changed since the last write-back.
    dirty: bool,
    buffers: Buffers,
    read: ReadOptions,
    write: WriteOptions,
    open: Option<Open>,
}

impl<K: Key> RocksDbKeyedStateBackend<K> {
    /// A backend for the key groups `range` of `max_parallelism` (at most
    /// 2^15), whose working directory will be made under `local_dir` and
    /// named after `label`; nothing is created yet.
    pub fn new(local_dir: &Path, label: &str, range: KeyGroupRange, max_parallelism: u32) -> Self {
        assert!(
            max_parallelism <= MAX_KEY_GROUPS,
            "the RocksDB backend supports a max parallelism up to {MAX_KEY_GROUPS}, not {max_parallelism}"
        );
        let mut write = WriteOptions::default();
        write.disable_wal(true);
        RocksDbKeyedStateBackend {
            range,
            max_parallelism,
            local_dir: local_dir.to_owned(),
            label: label.to_owned(),
            states: Vec::new(),
            cached: 0,
            dirty: false,
            cache_capacity: StateBackend::DEFAULT_CACHE_ENTRIES,
            buffers: Buffers::default(),
            read: ReadOptions::default(),
            write,
            open: None,
        }
    }

    /// Bounds the write-back cache (at least one entry).
    pub fn set_cache_capacity(&mut self, entries: usize) {
        self.cache_capacity = entries.max(1);
    }

    /// The key groups it owns.
    pub fn key_groups(&self) -> KeyGroupRange {
        self.range
    }

    /// The operator's max parallelism.
    pub fn max_parallelism(&self) -> u32 {
        self.max_parallelism
    }

    /// The working directory, once the database is open.
    pub fn working_dir(&self) -> Option<&Path> {
        self.open.as_ref().map(|o| o.dir.path())
    }

    pub(super) fn register<S: Data>(&mut self, name: &str, reduce: Option<Reduce<S>>) -> usize {
        assert!(
            !self.states.iter().any(|s| s.name() == name),
            "keyed state {name:?} declared twice"
        );
        let state = Box::new(State::<K, S> {
            name: name.to_owned(),
            cache: HashTable::new(),
            used: false,
            reduce,
        });
        if let Some(open) = &mut self.open {
            if open.db.cf_handle(name).is_none() {
                open.db
                    .create_cf(name, &state.column_family_options(&open.options))
                    .unwrap_or_else(|e| panic!("creating the column family of {name:?}: {e}"));
            }
        }
        self.states.push(state);
        self.states.len() - 1
    }

    /// Column families as this backend's states open them, the default one
    /// included, for each name in `names`.
    fn descriptors<'n>(
        &self,
        options: &Options,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Vec<ColumnFamilyDescriptor> {
        names
            .into_iter()
            .map(|name| {
                let state = self.states.iter().find(|s| s.name() == name);
                let options =
                    state.map_or_else(|| options.clone(), |s| s.column_family_options(options));
                ColumnFamilyDescriptor::new(name, options)
            })
            .collect()
    }

    fn options() -> Options {
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&Cache::new_lru_cache(BLOCK_CACHE_BYTES));
        table.set_block_size(BLOCK_BYTES);
        table.set_bloom_filter(10.0, false);
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        options.set_block_based_table_factory(&table);
        options.set_compression_type(DBCompressionType::Zstd);
        options.set_bottommost_compression_type(DBCompressionType::Zstd);
        options.set_optimize_filters_for_hits(true);
        options.set_write_buffer_size(WRITE_BUFFER_BYTES);
        options.set_max_write_buffer_number(WRITE_BUFFERS);
        options.set_memtable_whole_key_filtering(true);
        options.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
        // The subtask is the only writer. In-place memtable updates stay
        // off: each insert would look its key up first, and the write-back
        // in a checkpoint's synchronous part took 2-3 times as long.
        options.set_allow_concurrent_memtable_write(false);
        // See the module doc: merge 2 runs under full churn, at least 8
        // under small change.
        options.set_compaction_style(DBCompactionStyle::Universal);
        let mut universal = UniversalCompactOptions::default();
        universal.set_min_merge_width(8);
        universal.set_max_size_amplification_percent(50);
        options.set_universal_compaction_options(&universal);
        options.set_level_zero_file_num_compaction_trigger(2);
        options.set_max_background_jobs(2);
        options.set_log_level(LogLevel::Warn);
        options.set_keep_log_file_num(1);
        options
    }

    /// Creates the working directory and opens the database in it: empty,
    /// or on the files of a native checkpoint, which are moved there.
    fn open(&mut self, native: Option<&Path>) -> Result<(), StateError> {
        debug_assert!(self.open.is_none());
        fs::create_dir_all(&self.local_dir).map_err(|e| StateError::io(&self.local_dir, e))?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-", self.label))
            .tempdir_in(&self.local_dir)
            .map_err(|e| StateError::io(&self.local_dir, e))?;
        let path = dir.path().join("db");
        let options = Self::options();
        let mut names: Vec<&str> = self.states.iter().map(|s| s.name()).collect();
        if let Some(native) = native {
            take_over(native, &path)?;
            for found in DB::list_cf(&options, &path).map_err(rocks)? {
                if found != DEFAULT_COLUMN_FAMILY_NAME && !names.contains(&found.as_str()) {
                    return Err(StateError::UnknownState(found));
                }
            }
        }
        let default_is_state = names.contains(&DEFAULT_COLUMN_FAMILY_NAME);
        if !default_is_state {
            names.push(DEFAULT_COLUMN_FAMILY_NAME);
        }
        let descriptors = self.descriptors(&options, names.iter().copied());
        let db = DB::open_cf_descriptors(&options, &path, descriptors).map_err(rocks)?;
        if native.is_some() {
            let default = db
                .cf_handle(DEFAULT_COLUMN_FAMILY_NAME)
                .expect("the default column family is always open");
            if !default_is_state && !is_empty(&db, default) {
                return Err(StateError::UnknownState(DEFAULT_COLUMN_FAMILY_NAME.into()));
            }
            for name in &names {
                let cf = db.cf_handle(name).expect("opened above");
                self.clip(&db, cf)?;
            }
        }
        let instance = crate::rng::unique_token();
        self.open = Some(Open {
            db,
            options,
            dir,
            instance,
        });
        Ok(())
    }

    /// Deletes the key groups outside this subtask's range from a database
    /// restored from a checkpoint of a wider one.
    fn clip(&self, db: &DB, cf: &ColumnFamily) -> Result<(), StateError> {
        let first = group_prefix(self.range.start);
        let past = group_prefix(self.range.end + 1);
        let mut iter = db.raw_iterator_cf(cf);
        iter.seek_to_first();
        if iter.valid() && iter.key().is_some_and(|k| k < first.as_slice()) {
            db.delete_range_cf_opt(cf, [0u8, 0], first, &self.write)
                .map_err(rocks)?;
        }
        iter.seek(past);
        if iter.valid() {
            db.delete_range_cf_opt(cf, past, group_prefix(MAX_KEY_GROUPS), &self.write)
                .map_err(rocks)?;
        }
        iter.status().map_err(rocks)
    }

    fn ensure_open(&mut self) -> Result<&Open, StateError> {
        if self.open.is_none() {
            self.open(None)?;
        }
        Ok(self.open.as_ref().expect("opened above"))
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
        let db = &self.open.as_ref().expect("opened above").db;
        let State {
            name,
            cache,
            used,
            reduce,
        } = state_mut::<K, S>(&mut self.states[id]);
        *used = true;
        let read = |buffers: &mut Buffers| {
            let cf = db
                .cf_handle(name)
                .expect("a declared state has a column family");
            match db.get_pinned_cf_opt(cf, buffers.key(group, key), &self.read) {
                Ok(value) => value.map(|bytes| decode(name, key, &bytes)),
                Err(e) => panic!("reading keyed state {name:?} of {key:?}: {e}"),
            }
        };
        match cache.entry(slot.hash, |c| c.key == *key, |c| table_hash(&c.key)) {
            hash_table::Entry::Occupied(cached) => {
                let cached = cached.into_mut();
                cached.referenced = true;
                if cached.cell.partial {
                    let stored = read(&mut self.buffers);
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
                    cell: CachedValue::new(read(&mut self.buffers)),
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
                        partial: true,
                    },
                });
            }
        }
    }

    /// Readies the cache for a record's access to `key` in state `id`: the
    /// database open, and room made if the key is not cached and the cache
    /// is full; returns the key's group. Database errors here are fatal to
    /// the subtask: they panic, and the panic fails the subtask.
    fn make_way<S: Data>(&mut self, id: usize, key: &K, slot: KeySlot) -> u16 {
        if let Err(e) = self.ensure_open() {
            panic!("opening the keyed state of {}: {e}", self.label);
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

    /// Reads into the cache what it misses of the state of a batch's `keys`
    /// (at `slots`), one multi-get per state that records use: RocksDB looks
    /// the keys up together, block by block, instead of once per record.
    /// A full cache makes room first; a batch larger than the room reads
    /// the rest one by one, as it is processed.
    pub(super) fn read_ahead(&mut self, keys: &[K], slots: &[KeySlot]) -> Result<(), StateError> {
        self.ensure_open()?;
        let used = self.states.iter().filter(|s| s.used()).count();
        if used == 0 {
            return Ok(());
        }
        if self.cached + keys.len() * used > self.cache_capacity {
            self.make_room()?;
        }
        let db = &self.open.as_ref().expect("opened above").db;
        for state in self.states.iter_mut().filter(|s| s.used()) {
            let read = ReadAhead {
                db,
                cf: db.cf_handle(state.name()).expect("declared"),
                options: &self.read,
                keys,
                slots,
                first_group: self.range.start,
            };
            let room = self.cache_capacity.saturating_sub(self.cached);
            self.cached += state.read_ahead(read, room)?;
        }
        Ok(())
    }

    /// Writes every dirty cached value to the database, in one write batch
    /// sorted by key; the values stay cached, clean, but for the partial values of
    /// reducing states, which are merge operands in the database now.
    pub fn write_back(&mut self) -> Result<(), StateError> {
        if !self.dirty {
            return Ok(());
        }
        let db = &self
            .open
            .as_ref()
            .expect("values are cached only once open")
            .db;
        let mut batch = WriteBatch::default();
        for state in &mut self.states {
            let cf = db
                .cf_handle(state.name())
                .expect("a declared state has a column family");
            self.cached -= state.write_back(cf, &mut batch, &mut self.buffers);
        }
        self.dirty = false;
        if batch.is_empty() {
            return Ok(());
        }
        db.write_opt(batch, &self.write).map_err(rocks)
    }

    /// Makes room in a full cache: writes it back, then drops the values not
    /// used again since the last sweep, and arbitrary others until it is half
    /// full, so that a sweep is paid for by as many misses as it frees.
    fn make_room(&mut self) -> Result<(), StateError> {
        self.write_back()?;
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

    fn clear_cache(&mut self) {
        for state in &mut self.states {
            state.clear_cache();
        }
        self.cached = 0;
        self.dirty = false;
    }

    /// The synchronous part of a checkpoint: writes the cache back, flushes
    /// the memtables and makes a RocksDB checkpoint (hard links of the SST
    /// files, copies of the small metadata files) in a new directory beside
    /// the working directory, `<working dir>-chk-<id>`.
    pub fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<NativeCheckpoint, StateError> {
        self.ensure_open()?;
        self.write_back()?;
        let open = self.open.as_ref().expect("opened above");
        let cfs: Vec<&ColumnFamily> = self
            .states
            .iter()
            .map(|s| open.db.cf_handle(s.name()).expect("declared"))
            .collect();
        let mut flush = FlushOptions::default();
        flush.set_wait(true);
        open.db.flush_cfs_opt(&cfs, &flush).map_err(rocks)?;
        let mut name = open.dir.path().as_os_str().to_owned();
        name.push(format!("-{checkpoint}"));
        let dir = PathBuf::from(name);
        Checkpoint::new(&open.db)
            .and_then(|c| c.create_checkpoint(&dir))
            .map_err(rocks)?;
        let mut files = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| StateError::io(&dir, e))? {
            let entry = entry.map_err(|e| StateError::io(&dir, e))?;
            let meta = entry
                .metadata()
                .map_err(|e| StateError::io(&entry.path(), e))?;
            if meta.is_file() {
                files.push(NativeFile {
                    name: entry.file_name().to_string_lossy().into_owned(),
                    size: meta.len(),
                });
            }
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(NativeCheckpoint {
            dir,
            key_groups: self.range,
            instance: open.instance,
            files,
        })
    }

    /// Opens the database on `state.native` if there is one, copies in the
    /// key groups it owns from `state.imports`, then writes the key groups
    /// of `state` (heap snapshot format) into it.
    pub fn restore(&mut self, state: &RestoreState) -> Result<(), StateError> {
        if let Some(native) = &state.native {
            // Whatever was there before is replaced, cache included.
            self.clear_cache();
            self.open = None;
            self.open(Some(native))?;
        }
        for import in &state.imports {
            self.import(import)?;
        }
        for (group, bytes) in &state.key_groups {
            self.restore_group(*group, bytes)?;
        }
        self.ensure_open().map(|_| ())
    }

    /// Copies the key groups this subtask owns out of the native checkpoint
    /// in `dir` (another subtask's, before a rescale), then deletes `dir`.
    /// Keys start with their key group, big endian, so the owned ones are
    /// one contiguous run per column family.
    fn import(&mut self, dir: &Path) -> Result<(), StateError> {
        self.ensure_open()?;
        self.write_back()?;
        self.clear_cache();
        let options = Options::default();
        let found = DB::list_cf(&options, dir).map_err(rocks)?;
        // A reducing state's merge operands are combined as they are read.
        let descriptors = self.descriptors(&options, found.iter().map(String::as_str));
        let source =
            DB::open_cf_descriptors_read_only(&options, dir, descriptors, false).map_err(rocks)?;
        let db = &self.open.as_ref().expect("opened above").db;
        let (first, past) = (
            group_prefix(self.range.start),
            group_prefix(self.range.end + 1),
        );
        for name in &found {
            let from = source.cf_handle(name).expect("opened above");
            let to = match db.cf_handle(name) {
                Some(cf) if self.states.iter().any(|s| s.name() == name) => cf,
                _ if is_empty(&source, from) => continue,
                _ => return Err(StateError::UnknownState(name.clone())),
            };
            let mut iter = source.raw_iterator_cf(from);
            iter.seek(first);
            let mut batch = WriteBatch::default();
            while let Some((key, value)) = iter.item() {
                if key >= past.as_slice() {
                    break;
                }
                batch.put_cf(to, key, value);
                if batch.size_in_bytes() >= IMPORT_BATCH_BYTES {
                    db.write_opt(std::mem::take(&mut batch), &self.write)
                        .map_err(rocks)?;
                }
                iter.next();
            }
            iter.status().map_err(rocks)?;
            db.write_opt(batch, &self.write).map_err(rocks)?;
        }
        drop(source);
        fs::remove_dir_all(dir).map_err(|e| StateError::io(dir, e))
    }

    /// Loads one key group as `HeapSnapshot::write` wrote it.
    pub fn restore_group(&mut self, group: KeyGroup, mut bytes: &[u8]) -> Result<(), StateError> {
        if !self.range.contains(group) {
            return Err(StateError::ForeignKeyGroup(group));
        }
        self.ensure_open()?;
        // Cached values of the group would hide what is written here.
        self.write_back()?;
        self.clear_cache();
        let db = &self.open.as_ref().expect("opened above").db;
        let input = &mut bytes;
        let states: u32 =
            rmp_serde::from_read(&mut *input).map_err(|e| StateError::Decode(e.to_string()))?;
        let mut batch = WriteBatch::default();
        for _ in 0..states {
            let name: String =
                rmp_serde::from_read(&mut *input).map_err(|e| StateError::Decode(e.to_string()))?;
            let state = self
                .states
                .iter_mut()
                .find(|s| s.name() == name)
                .ok_or(StateError::UnknownState(name))?;
            let cf = db.cf_handle(state.name()).expect("declared");
            state.restore_group(cf, group.0 as u16, input, &mut batch, &mut self.buffers)?;
        }
        db.write_opt(batch, &self.write).map_err(rocks)
    }

    /// Every (key, value) of state `id`, key group by key group. The cache
    /// must have been written back.
    pub(super) fn entries<V: Data>(&self, id: usize) -> impl Iterator<Item = (K, V)> + '_ {
        assert!(
            !self.dirty,
            "the cache is written back before reading all keys"
        );
        let iter = self.open.as_ref().map(|open| {
            let cf = open.db.cf_handle(self.states[id].name()).expect("declared");
            let mut iter = open.db.raw_iterator_cf(cf);
            iter.seek_to_first();
            iter
        });
        Values {
            iter,
            _types: PhantomData,
        }
    }
}

fn state_mut<K: Key, S: Data>(state: &mut Box<dyn RocksState<K>>) -> &mut State<K, S> {
    state
        .as_any_mut()
        .downcast_mut()
        .expect("a state handle is only used with the backend that issued it")
}

fn group_prefix(group: u32) -> [u8; 2] {
    (group as u16).to_be_bytes()
}

fn is_empty(db: &DB, cf: &ColumnFamily) -> bool {
    let mut iter = db.raw_iterator_cf(cf);
    iter.seek_to_first();
    !iter.valid()
}

/// Moves the directory `from` to `to`: a rename, or a copy of its files
/// when they are on another file system.
fn take_over(from: &Path, to: &Path) -> Result<(), StateError> {
    if fs::rename(from, to).is_ok() {
        return Ok(());
    }
    fs::create_dir(to).map_err(|e| StateError::io(to, e))?;
    for entry in fs::read_dir(from).map_err(|e| StateError::io(from, e))? {
        let entry = entry.map_err(|e| StateError::io(from, e))?;
        fs::copy(entry.path(), to.join(entry.file_name()))
            .map_err(|e| StateError::io(&entry.path(), e))?;
    }
    fs::remove_dir_all(from).map_err(|e| StateError::io(from, e))
}

/// Decoded entries of one column family.
struct Values<'a, K, V> {
    iter: Option<DBRawIteratorWithThreadMode<'a, DB>>,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K: Key, V: Data> Iterator for Values<'_, K, V> {
    type Item = (K, V);

    fn next(&mut self) -> Option<(K, V)> {
        let iter = self.iter.as_mut()?;
        if !iter.valid() {
            if let Err(e) = iter.status() {
                panic!("reading keyed state: {e}");
            }
            return None;
        }
        let key = iter.key().expect("a valid iterator has a key");
        let value = iter.value().expect("a valid iterator has a value");
        let item = (
            rmp_serde::from_slice(&key[2..])
                .unwrap_or_else(|e| panic!("a key of keyed state does not decode: {e}")),
            rmp_serde::from_slice(value)
                .unwrap_or_else(|e| panic!("a value of keyed state does not decode: {e}")),
        );
        iter.next();
        Some(item)
    }
}
