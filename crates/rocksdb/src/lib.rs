//! Keyed state in RocksDB: the embedded store of `tidemark-core`'s
//! `EmbeddedKeyedStateBackend` (which keeps the typed write-back cache and
//! the key encoding). One database per subtask, one column family per
//! declared state (named after it), in a working directory of its own that
//! is removed with the database. A reducing state's column family has the
//! state's reduce function as its merge operator; a state with TTL's has a
//! compaction filter that drops expired values.
//!
//! ```no_run
//! use tidemark_core::job::JobConfig;
//!
//! let config = JobConfig::default().state_backend(tidemark_rocksdb::RocksDb::backend(None, None));
//! ```
//!
//! Tuning, for many small read-modify-writes from one thread and snapshots
//! that are native checkpoints:
//! - No write-ahead log: a checkpoint flushes the memtables, so the log would
//!   only ever protect writes that the restart discards anyway.
//! - A large write-back of the cache (a checkpoint's) is written as an SST
//!   file in key order and ingested, rather than inserted into the memtable
//!   key by key and flushed into such a file at the checkpoint. Wordcount
//!   at 1,000,000 keys with 1 s checkpoints went from 498-547 to 327-349 ms
//!   checkpoint p50 (`INGEST_WRITES` has more).
//! - 64 MiB write buffers, up to 4 per column family: point updates of a
//!   large key set produce many versions of the same keys, and a big memtable
//!   absorbs them before they cost a flush and a compaction; a whole-key bloom
//!   filter on the memtables, small enough to stay in cache, makes the many
//!   lookups of keys that are not in them cheap.
//! - One LRU block cache per database, shared by its column families, so that
//!   a busy state can use what an idle one does not.
//! - SST files of 16 KiB blocks, compressed with ZSTD at every level: a
//!   sorted run of wordcount's 1,000,000 keys is 6.9 MB, against 11.3 MB
//!   with LZ4 and 4 KiB blocks (LZ4 stays linked: checkpoints written
//!   before still open). A 10 bits/key bloom filter in every level: a
//!   lookup of a new key (a window's, a session's) otherwise reaches the
//!   last level and reads a block there. 10,000,000 session windows (`run
//!   windows --window session:1h --keys 1000000000 --records 10000000
//!   --parallelism 2 --state rocksdb --incremental --checkpoint-interval
//!   off`) took 79-82 s without that filter and 62-68 s with it;
//!   wordcount kept its rate and checkpoint p50, and its state grew 3-6 %.
//!   4 KiB blocks fire those sessions faster still (48-50 s: the firing
//!   reads state far beyond the block cache, and decompresses a whole
//!   block per read), but cost wordcount with `--emit updates` and a
//!   65,536-value cache, whose state stays in the block cache, 13 % of its
//!   rate (8 KiB: 51-54 s and 7 %). No hash index in data blocks: with
//!   `--emit updates` it gained no throughput and made uploads 25 %
//!   larger.
//! - Universal compaction, tuned for the two ends of churn. Under small
//!   change over a large state, an incremental checkpoint should upload
//!   about the change: recent small runs merge among themselves, at least
//!   8 at once, so that a key is rewritten about log8 (state / change)
//!   times, and the large run is rewritten only when the others add up to
//!   half of it. Under full churn (every key updated between checkpoints)
//!   every flush is a new run holding every key, and every older run is
//!   stale: compaction starts at 4 runs (`COMPACTION_RUNS`), so that they
//!   merge into one before they pile up to 8. Measured at 1,000,000 keys
//!   against the settings before (LZ4, 4 KiB blocks, compaction from 8
//!   runs at 200 % size amplification, merges at least 4 wide): the state
//!   a full-churn checkpoint references went from 35-93 MB to 10-16 MB
//!   with compaction at 2 runs (Flink: 15 MB), 14-23 MB at 4, and uploads
//!   at 1 % change per checkpoint from 2.90 % of a 9.0 MiB state to 2.92 %
//!   of 5.3 MiB (`benches/incremental.rs`). Where the write-back cache
//!   holds the whole state, full churn compacts nothing: a checkpoint
//!   replaces the column family with every value (`Database::replace`:
//!   the family dropped and created anew, its files deleted unread).

use ::rocksdb::checkpoint::Checkpoint;
use ::rocksdb::compaction_filter::{CompactionFilter as RocksFilter, Decision};
use ::rocksdb::compaction_filter_factory::{CompactionFilterContext, CompactionFilterFactory};
use ::rocksdb::merge_operator::MergeOperands;
use ::rocksdb::{
    BlockBasedOptions, BottommostLevelCompaction, Cache, ColumnFamily as Cf,
    ColumnFamilyDescriptor, CompactOptions, DBCompactionStyle, DBCompressionType,
    DBRawIteratorWithThreadMode, FlushOptions, IngestExternalFileOptions, LogLevel, Options,
    ReadOptions, SstFileWriter, UniversalCompactOptions, WriteBatch, WriteOptions, DB,
    DEFAULT_COLUMN_FAMILY_NAME,
};
use std::ffi::CStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tidemark_core::dataflow::task::NativeFile;
use tidemark_core::model::key_group::KeyGroupRange;
use tidemark_core::state::store::{
    group_prefix, ColumnFamily, Cursor, Database, EmbeddedStore, SortedWrites, Write,
    MAX_KEY_GROUPS,
};
use tidemark_core::state::ttl::{CompactionFilter, Filtered};
use tidemark_core::state::{StateBackend, StateError};

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
/// Uncompressed size of an SST data block: larger blocks compress better,
/// but a lookup beyond the block cache decompresses a whole block.
const BLOCK_BYTES: usize = 16 << 10;

/// Sorted runs at which compaction starts. Under full churn each run
/// holds every key, and merging them is most of the CPU time a checkpoint
/// costs: at 2 runs each checkpoint's new run merged with the old one at
/// once; at 4 the old one merges with three checkpoints' new ones.
/// Wordcount at 1,000,000 keys with 1 s checkpoints then took 15-24
/// CPU-seconds for 100 M records instead of 23-34 and uploaded 5.5 MB a
/// checkpoint instead of 9.7, for a referenced state of 14-23 MB instead
/// of 10-16. Under small change nothing moved (`benches/incremental.rs`).
const COMPACTION_RUNS: i32 = 4;

/// Bytes of imported entries written at once.
const IMPORT_BATCH_BYTES: usize = 4 << 20;

/// Writes at or above which a write-back reaches the database as an SST
/// file of its own, ingested, instead of through the memtable: a
/// checkpoint's, and that of a full cache unless the cache is small. At
/// 1 << 16, the write-backs of a 65,536-value cache went through the
/// memtable, which each checkpoint then flushed: wordcount with `--emit
/// updates` at 1,000,000 keys had checkpoints of 196-218 ms p50, against
/// 84-85 ms at 1 << 13 (the same throughput).
const INGEST_WRITES: usize = 1 << 13;

/// RocksDB as the embedded store of keyed state, with its databases under
/// `local_dir`.
#[derive(Debug)]
pub struct RocksDb {
    local_dir: PathBuf,
}

impl RocksDb {
    /// RocksDB with its databases under `local_dir`.
    pub fn new(local_dir: impl Into<PathBuf>) -> Self {
        RocksDb {
            local_dir: local_dir.into(),
        }
    }

    /// The state backend of RocksDB under `local_dir` (default `<temp
    /// dir>/tidemark-state`) with a write-back cache of `cache_entries`
    /// (default [`StateBackend::DEFAULT_CACHE_ENTRIES`]).
    pub fn backend(local_dir: Option<PathBuf>, cache_entries: Option<usize>) -> StateBackend {
        let local_dir = local_dir.unwrap_or_else(|| std::env::temp_dir().join("tidemark-state"));
        StateBackend::Embedded {
            store: Arc::new(RocksDb::new(local_dir)),
            cache_entries: cache_entries.unwrap_or(StateBackend::DEFAULT_CACHE_ENTRIES),
        }
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
        options.set_write_buffer_size(WRITE_BUFFER_BYTES);
        options.set_max_write_buffer_number(WRITE_BUFFERS);
        options.set_memtable_whole_key_filtering(true);
        options.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
        // One writer at a time: the subtask, or the thread of a
        // checkpoint's write-back while the subtask leaves the database to
        // it. In-place memtable updates stay off: each insert would look its
        // key up first, and a checkpoint's write-back took 2-3 times as long.
        options.set_allow_concurrent_memtable_write(false);
        // See the module doc: merge a few runs under full churn, at least
        // 8 under small change.
        options.set_compaction_style(DBCompactionStyle::Universal);
        let mut universal = UniversalCompactOptions::default();
        universal.set_min_merge_width(8);
        universal.set_max_size_amplification_percent(50);
        options.set_universal_compaction_options(&universal);
        options.set_level_zero_file_num_compaction_trigger(COMPACTION_RUNS);
        options.set_max_background_jobs(2);
        options.set_log_level(LogLevel::Warn);
        options.set_keep_log_file_num(1);
        options
    }
}

impl EmbeddedStore for RocksDb {
    fn name(&self) -> &'static str {
        "rocksdb"
    }

    fn remove_checkpoint(&self, dir: &Path) {
        let _ = fs::remove_dir_all(dir);
    }

    fn local_dir(&self) -> &Path {
        &self.local_dir
    }

    /// Creates the working directory `<local_dir>/<label>-<random>` and
    /// opens the database in its `db/`.
    fn open(
        &self,
        label: &str,
        range: KeyGroupRange,
        families: &[ColumnFamily],
        native: Option<&Path>,
    ) -> Result<Box<dyn Database>, StateError> {
        fs::create_dir_all(&self.local_dir).map_err(|e| StateError::io(&self.local_dir, e))?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{label}-"))
            .tempdir_in(&self.local_dir)
            .map_err(|e| StateError::io(&self.local_dir, e))?;
        let path = dir.path().join("db");
        let options = RocksDb::options();
        let mut names: Vec<&str> = families.iter().map(|f| f.name.as_str()).collect();
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
        let descriptors = descriptors(&options, families, names.iter().copied());
        let db = DB::open_cf_descriptors(&options, &path, descriptors).map_err(rocks)?;
        let mut write = WriteOptions::default();
        write.disable_wal(true);
        let open = Open {
            db,
            options,
            families: families.to_vec(),
            read: ReadOptions::default(),
            write,
            dir,
            instance: instance_token(),
            ingested: 0,
        };
        if native.is_some() {
            let default = open.cf(DEFAULT_COLUMN_FAMILY_NAME);
            if !default_is_state && !is_empty(&open.db, default) {
                return Err(StateError::UnknownState(DEFAULT_COLUMN_FAMILY_NAME.into()));
            }
            for name in &names {
                open.clip(open.cf(name), range)?;
            }
        }
        Ok(Box::new(open))
    }
}

/// Column families as `families` open them, the default one included, for
/// each name in `names`: a reducing state's with its merge operator, a
/// state with TTL's with its compaction filter.
fn descriptors<'n>(
    options: &Options,
    families: &[ColumnFamily],
    names: impl IntoIterator<Item = &'n str>,
) -> Vec<ColumnFamilyDescriptor> {
    names
        .into_iter()
        .map(|name| {
            let family = families.iter().find(|f| f.name == name);
            ColumnFamilyDescriptor::new(name, family_options(options, family))
        })
        .collect()
}

/// `base` with a reducing state's merge operator and a state with TTL's
/// compaction filter.
fn family_options(base: &Options, family: Option<&ColumnFamily>) -> Options {
    let mut options = base.clone();
    if let Some(merge) = family.and_then(|f| f.merge.clone()) {
        options.set_merge_operator_associative(
            "tidemark.reduce",
            move |_key: &[u8], stored: Option<&[u8]>, operands: &MergeOperands| {
                merge(stored, &mut operands.iter())
            },
        );
    }
    if let Some(filter) = family.and_then(|f| f.ttl.clone()) {
        options.set_compaction_filter_factory(TtlFilters(filter));
    }
    options
}

/// Makes a [`TtlFilter`] for each compaction: a compaction runs its filter
/// on one thread, so each has its own buffer.
struct TtlFilters(CompactionFilter);

impl CompactionFilterFactory for TtlFilters {
    type Filter = TtlFilter;

    fn create(&mut self, _: CompactionFilterContext) -> TtlFilter {
        TtlFilter {
            filter: self.0.clone(),
            changed: Vec::new(),
        }
    }

    fn name(&self) -> &CStr {
        c"tidemark.ttl"
    }
}

/// A state with TTL's compaction filter, with the buffer a changed value
/// (a list or map some of whose elements expired) is written to.
struct TtlFilter {
    filter: CompactionFilter,
    changed: Vec<u8>,
}

impl RocksFilter for TtlFilter {
    fn filter(&mut self, _level: u32, _key: &[u8], value: &[u8]) -> Decision {
        match (self.filter)(value, &mut self.changed) {
            Filtered::Keep => Decision::Keep,
            Filtered::Remove => Decision::Remove,
            // SAFETY: the `'static` is a lie the binding's signature asks
            // for: RocksDB's C shim copies the new value (`assign`) as soon
            // as this returns, before the filter runs again and the buffer
            // changes, and the filter outlives the call.
            Filtered::Change => Decision::Change(unsafe {
                std::mem::transmute::<&[u8], &'static [u8]>(self.changed.as_slice())
            }),
        }
    }

    fn name(&self) -> &CStr {
        c"tidemark.ttl"
    }
}

fn rocks(error: ::rocksdb::Error) -> StateError {
    StateError::Store(format!("RocksDB: {}", error.into_string()))
}

/// The database and the directory it lives in. The database is declared
/// first so that it is closed before its directory is removed.
struct Open {
    db: DB,
    options: Options,
    /// The declared states' families: what a replaced one is created as.
    families: Vec<ColumnFamily>,
    read: ReadOptions,
    write: WriteOptions,
    dir: tempfile::TempDir,
    instance: u64,
    /// SST files of write-backs written so far: names them.
    ingested: u64,
}

impl Open {
    fn cf(&self, name: &str) -> &Cf {
        self.db
            .cf_handle(name)
            .expect("a declared state has a column family")
    }

    /// Writes the sorted `writes` into an SST file in the working directory
    /// and moves it into the database, newer than all it holds. One
    /// sequential file replaces a skip-list insert per key and, for a
    /// checkpoint, the flush of them into a file like this one. A memtable
    /// holding keys in its range is flushed first, so that it stays older.
    fn ingest(&mut self, family: &str, writes: &SortedWrites) -> Result<(), StateError> {
        let file = self.write_file(writes)?;
        self.ingest_file(family, file)
    }

    /// Writes the sorted, non-empty `writes` into a new SST file in the
    /// working directory.
    fn write_file(&mut self, writes: &SortedWrites) -> Result<PathBuf, StateError> {
        self.ingested += 1;
        let path = self
            .dir
            .path()
            .join(format!("write-back-{}.sst", self.ingested));
        let mut file = SstFileWriter::create(&self.options);
        file.open(&path).map_err(rocks)?;
        for write in writes.iter() {
            match write {
                Write::Put(key, value) => file.put(key, value),
                Write::Merge(key, value) => file.merge(key, value),
                Write::Delete(key) => file.delete(key),
            }
            .map_err(rocks)?;
        }
        file.finish().map_err(rocks)?;
        Ok(path)
    }

    /// Moves the SST file `path` into `family`, newer than all it holds.
    fn ingest_file(&self, family: &str, path: PathBuf) -> Result<(), StateError> {
        let mut ingest = IngestExternalFileOptions::default();
        ingest.set_move_files(true);
        self.db
            .ingest_external_file_cf_opts(self.cf(family), &ingest, vec![path])
            .map_err(rocks)
    }

    /// Deletes the key groups outside `range` from a database restored
    /// from a checkpoint of a wider one.
    fn clip(&self, cf: &Cf, range: KeyGroupRange) -> Result<(), StateError> {
        let first = group_prefix(range.start);
        let past = group_prefix(range.end + 1);
        let mut iter = self.db.raw_iterator_cf(cf);
        iter.seek_to_first();
        if iter.valid() && iter.key().is_some_and(|k| k < first.as_slice()) {
            self.db
                .delete_range_cf_opt(cf, [0u8, 0], first, &self.write)
                .map_err(rocks)?;
        }
        iter.seek(past);
        if iter.valid() {
            self.db
                .delete_range_cf_opt(cf, past, group_prefix(MAX_KEY_GROUPS), &self.write)
                .map_err(rocks)?;
        }
        iter.status().map_err(rocks)
    }
}

impl Database for Open {
    fn working_dir(&self) -> &Path {
        self.dir.path()
    }

    fn instance(&self) -> u64 {
        self.instance
    }

    fn create_family(&mut self, family: &ColumnFamily) -> Result<(), StateError> {
        // Recorded even where the family exists (the default one), so that
        // a replace recreates every declared family with its options.
        if !self.families.iter().any(|f| f.name == family.name) {
            self.families.push(family.clone());
        }
        if self.db.cf_handle(&family.name).is_some() {
            return Ok(());
        }
        let options = family_options(&self.options, Some(family));
        self.db.create_cf(&family.name, &options).map_err(rocks)
    }

    fn get(
        &self,
        family: &str,
        key: &[u8],
        found: &mut dyn FnMut(&[u8]),
    ) -> Result<(), StateError> {
        let value = self
            .db
            .get_pinned_cf_opt(self.cf(family), key, &self.read)
            .map_err(rocks)?;
        if let Some(bytes) = value {
            found(&bytes);
        }
        Ok(())
    }

    fn multi_get(
        &self,
        family: &str,
        keys: &[&[u8]],
        found: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), StateError> {
        let values = self
            .db
            .batched_multi_get_cf_opt(self.cf(family), keys, true, &self.read);
        for (i, value) in values.into_iter().enumerate() {
            if let Some(bytes) = value.map_err(rocks)? {
                found(i, &bytes);
            }
        }
        Ok(())
    }

    /// A large write-back (a checkpoint's, or a full cache's) goes in as
    /// an SST file ([`Open::ingest`]); a small one through the memtable.
    fn write(&mut self, family: &str, writes: &SortedWrites) -> Result<(), StateError> {
        if writes.len() >= INGEST_WRITES {
            return self.ingest(family, writes);
        }
        let cf = self.cf(family);
        let mut batch = WriteBatch::default();
        for write in writes.iter() {
            match write {
                Write::Put(key, value) => batch.put_cf(cf, key, value),
                Write::Merge(key, value) => batch.merge_cf(cf, key, value),
                Write::Delete(key) => batch.delete_cf(cf, key),
            }
        }
        self.db.write_opt(batch, &self.write).map_err(rocks)
    }

    /// Drops the column family and creates it anew with the values in one
    /// SST file: RocksDB deletes the old family's files once no checkpoint
    /// links them, without reading them. The file is written first, so a
    /// failure to write it leaves the family as it was. The default family
    /// cannot be dropped: a state of that name has its keys range-deleted
    /// instead, and compaction drops them.
    fn replace(&mut self, family: &str, writes: &SortedWrites) -> Result<(), StateError> {
        let file = match writes.is_empty() {
            true => None,
            false => Some(self.write_file(writes)?),
        };
        if family == DEFAULT_COLUMN_FAMILY_NAME {
            let all = (group_prefix(0), group_prefix(MAX_KEY_GROUPS));
            self.db
                .delete_range_cf_opt(self.cf(family), all.0, all.1, &self.write)
                .map_err(rocks)?;
        } else {
            let declared = self.families.iter().find(|f| f.name == family);
            let options = family_options(&self.options, declared);
            self.db.drop_cf(family).map_err(rocks)?;
            self.db.create_cf(family, &options).map_err(rocks)?;
        }
        match file {
            Some(file) => self.ingest_file(family, file),
            None => Ok(()),
        }
    }

    /// Flushes the memtables and makes a RocksDB checkpoint: hard links of
    /// the SST files, copies of the small metadata files.
    fn checkpoint(
        &mut self,
        families: &[&str],
        into: &Path,
    ) -> Result<Vec<NativeFile>, StateError> {
        let cfs: Vec<&Cf> = families.iter().map(|name| self.cf(name)).collect();
        let mut flush = FlushOptions::default();
        flush.set_wait(true);
        self.db.flush_cfs_opt(&cfs, &flush).map_err(rocks)?;
        Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(into))
            .map_err(rocks)?;
        let mut files = Vec::new();
        for entry in fs::read_dir(into).map_err(|e| StateError::io(into, e))? {
            let entry = entry.map_err(|e| StateError::io(into, e))?;
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
        Ok(files)
    }

    /// Keys start with their key group, big endian, so the owned ones are
    /// one contiguous run per column family.
    fn import(
        &mut self,
        dir: &Path,
        range: KeyGroupRange,
        families: &[ColumnFamily],
    ) -> Result<(), StateError> {
        let options = Options::default();
        let found = DB::list_cf(&options, dir).map_err(rocks)?;
        // A reducing state's merge operands are combined as they are read.
        let descriptors = descriptors(&options, families, found.iter().map(String::as_str));
        let source =
            DB::open_cf_descriptors_read_only(&options, dir, descriptors, false).map_err(rocks)?;
        let (first, past) = (group_prefix(range.start), group_prefix(range.end + 1));
        for name in &found {
            let from = source.cf_handle(name).expect("opened above");
            let to = match self.db.cf_handle(name) {
                Some(cf) if families.iter().any(|f| &f.name == name) => cf,
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
                    self.db
                        .write_opt(std::mem::take(&mut batch), &self.write)
                        .map_err(rocks)?;
                }
                iter.next();
            }
            iter.status().map_err(rocks)?;
            self.db.write_opt(batch, &self.write).map_err(rocks)?;
        }
        drop(source);
        fs::remove_dir_all(dir).map_err(|e| StateError::io(dir, e))
    }

    fn scan<'a>(&'a self, family: &str) -> Box<dyn Cursor + 'a> {
        let mut iter = self.db.raw_iterator_cf(self.cf(family));
        iter.seek_to_first();
        Box::new(Entries { iter, first: true })
    }

    /// Flushes the memtables, then compacts each column family into its
    /// bottommost level, the last run included, so that compaction filters
    /// see every value.
    fn compact(&mut self) -> Result<(), StateError> {
        let names = DB::list_cf(&self.options, self.db.path()).map_err(rocks)?;
        let mut flush = FlushOptions::default();
        flush.set_wait(true);
        let mut compact = CompactOptions::default();
        compact.set_bottommost_level_compaction(BottommostLevelCompaction::Force);
        for name in &names {
            let cf = self.cf(name);
            self.db.flush_cf_opt(cf, &flush).map_err(rocks)?;
            self.db
                .compact_range_cf_opt(cf, None::<&[u8]>, None::<&[u8]>, &compact);
        }
        Ok(())
    }
}

/// The entries of one column family.
struct Entries<'a> {
    iter: DBRawIteratorWithThreadMode<'a, DB>,
    /// Positioned on the first entry, not yet returned.
    first: bool,
}

impl Cursor for Entries<'_> {
    fn next_entry(&mut self) -> Option<(&[u8], &[u8])> {
        if !std::mem::take(&mut self.first) {
            self.iter.next();
        }
        if !self.iter.valid() {
            if let Err(e) = self.iter.status() {
                panic!("reading keyed state: {e}");
            }
            return None;
        }
        self.iter.item()
    }
}

fn is_empty(db: &DB, cf: &Cf) -> bool {
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

/// Tells this opening of a database from every other, earlier or later, in
/// this process or another: the hash keys of a std `RandomState` come from
/// the operating system's randomness, and std promises that two of them are
/// unlikely to hash a value alike.
fn instance_token() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(0u8)
}
