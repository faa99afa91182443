//! The RocksDB store under keyed state: the semantics every backend has,
//! native snapshots and restores (whole and rescaled), reducing states as
//! merge operands, and the working directory's lifetime.

use std::collections::BTreeMap;
use tidemark_core::dataflow::task::{KeyedSnapshot, NativeCheckpoint, RestoreState};
use tidemark_core::model::ids::CheckpointId;
use tidemark_core::model::key_group::{key_group_of, KeyGroupRange};
use tidemark_core::model::rng::splitmix64;
use tidemark_core::state::*;
use tidemark_core::testkit::state::*;
use tidemark_rocksdb::RocksDb;

fn rocks<K: Key>(dir: &tempfile::TempDir, range: KeyGroupRange) -> KeyedStateBackend<K> {
    rocks_cached(dir, range, StateBackend::DEFAULT_CACHE_ENTRIES)
}

/// RocksDB with a write-back cache of `capacity` values.
fn rocks_cached<K: Key>(
    dir: &tempfile::TempDir,
    range: KeyGroupRange,
    capacity: usize,
) -> KeyedStateBackend<K> {
    let config = RocksDb::backend(Some(dir.path().to_owned()), Some(capacity));
    KeyedStateBackend::new(&config, "op-1-0", range, MAX_P)
}

/// RocksDB with a write-back cache of one entry: every record's value goes
/// through the database.
fn rocks_uncached<K: Key>(dir: &tempfile::TempDir, range: KeyGroupRange) -> KeyedStateBackend<K> {
    rocks_cached(dir, range, 1)
}

fn native(snapshot: KeyedSnapshot) -> NativeCheckpoint {
    match snapshot {
        KeyedSnapshot::Native(pending) => pending.wait().expect("the native checkpoint is made"),
        KeyedSnapshot::Heap(_) => {
            panic!("a copy of the cache where a native checkpoint was expected")
        }
    }
}

#[test]
fn the_rocksdb_backend_keeps_value_map_and_list_semantics() {
    let dir = tempfile::tempdir().unwrap();
    value_map_and_list_semantics(rocks(&dir, whole()));
}

#[test]
fn the_rocksdb_backend_without_a_cache_keeps_value_map_and_list_semantics() {
    let dir = tempfile::tempdir().unwrap();
    value_map_and_list_semantics(rocks_uncached(&dir, whole()));
}

#[test]
fn a_native_snapshot_restores_every_state_and_key_and_is_isolated_from_later_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = rocks::<u64>(&dir, whole());
    let mut reg = StateRegistrar::new(&mut backend);
    let count = reg.value::<u64>("count");
    let names = reg.value::<String>("name");
    let history = reg.list::<u64>("history");
    let parts = reg.map::<u8, u64>("parts");
    const KEYS: u64 = 5000;
    for round in 0..2 {
        for key in 0..KEYS {
            let mut ctx = KeyedContext::new(&mut backend, &key);
            *ctx.value(&count).get_or_default() += key;
            if round == 0 {
                ctx.value(&names).set(format!("key {key}"));
            }
            ctx.list(&history).get_or_default().push(round);
            ctx.map(&parts).get_or_default().insert(round as u8, key);
        }
    }
    // A cleared key stays cleared.
    KeyedContext::new(&mut backend, &3).value(&names).clear();
    let KeyedSnapshot::Native(pending) = backend.snapshot(CheckpointId(7)).unwrap() else {
        panic!("a copy of the cache where a native checkpoint was expected");
    };
    // Writes after the synchronous part do not reach the snapshot: to a
    // cached key while the checkpoint is being made, and to a key the
    // cache misses, whose read waits for the database.
    *KeyedContext::new(&mut backend, &7)
        .value(&count)
        .get_or_default() += 100;
    *KeyedContext::new(&mut backend, &KEYS)
        .value(&count)
        .get_or_default() += 100;
    let snapshot = pending.wait().unwrap();
    backend.flush().unwrap();

    let KeyedStateBackend::Embedded(live) = &backend else {
        unreachable!()
    };
    let working = live.working_dir().unwrap();
    assert!(!snapshot.dir.starts_with(working), "{snapshot:?}");
    assert!(snapshot.dir.starts_with(dir.path()));
    assert!(snapshot.dir.to_string_lossy().ends_with("-chk-7"));
    assert_eq!(snapshot.key_groups, whole());
    let on_disk: Vec<(String, u64)> = {
        let mut files: Vec<_> = std::fs::read_dir(&snapshot.dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().unwrap().len(),
                )
            })
            .collect();
        files.sort();
        files
    };
    let listed: Vec<(String, u64)> = snapshot
        .files
        .iter()
        .map(|f| (f.name.clone(), f.size))
        .collect();
    assert_eq!(listed, on_disk);
    assert!(listed.iter().any(|(n, _)| n == "CURRENT"));
    assert!(listed.iter().any(|(n, _)| n.starts_with("MANIFEST-")));
    assert!(snapshot.files.iter().any(|f| f.is_shared() && f.size > 0));

    let mut restored = rocks::<u64>(&dir, whole());
    let mut reg = StateRegistrar::new(&mut restored);
    let count2 = reg.value::<u64>("count");
    let names2 = reg.value::<String>("name");
    let history2 = reg.list::<u64>("history");
    let parts2 = reg.map::<u8, u64>("parts");
    restored.restore(&restore_native(&snapshot.dir)).unwrap();
    assert!(!snapshot.dir.exists(), "the backend takes the files over");
    for key in 0..KEYS {
        let mut ctx = KeyedContext::new(&mut restored, &key);
        assert_eq!(ctx.value(&count2).get(), Some(&(2 * key)));
        let name = ctx.value(&names2).get().cloned();
        assert_eq!(name, (key != 3).then(|| format!("key {key}")));
        assert_eq!(ctx.list(&history2).get(), Some(&vec![0, 1]));
        let parts: BTreeMap<u8, u64> = ctx
            .map(&parts2)
            .get()
            .unwrap()
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        assert_eq!(parts, BTreeMap::from([(0, key), (1, key)]));
    }
    assert_eq!(all(&mut restored, &count2).len(), KEYS as usize);
    // The restored database goes on, and snapshots again.
    *KeyedContext::new(&mut restored, &KEYS)
        .value(&count2)
        .get_or_default() += 1;
    let again = native(restored.snapshot(CheckpointId(8)).unwrap());
    assert!(again.files.iter().any(|f| f.is_shared()));
    std::fs::remove_dir_all(&again.dir).unwrap();
    // The live database is untouched by the restore of its snapshot.
    assert_eq!(
        KeyedContext::new(&mut backend, &7).value(&count).get(),
        Some(&114)
    );
}

#[test]
fn a_native_restore_creates_missing_states_and_refuses_undeclared_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = rocks::<u64>(&dir, whole());
    let count = StateRegistrar::new(&mut backend).value::<u64>("count");
    for key in 0..100u64 {
        KeyedContext::new(&mut backend, &key).value(&count).set(key);
    }
    let first = native(backend.snapshot(CheckpointId(1)).unwrap());
    let second = native(backend.snapshot(CheckpointId(2)).unwrap());

    let mut wider = rocks::<u64>(&dir, whole());
    let mut reg = StateRegistrar::new(&mut wider);
    let count = reg.value::<u64>("count");
    let added = reg.value::<u64>("added");
    wider.restore(&restore_native(&first.dir)).unwrap();
    assert_eq!(all(&mut wider, &count).len(), 100);
    assert!(all(&mut wider, &added).is_empty());
    KeyedContext::new(&mut wider, &1).value(&added).set(5);
    assert_eq!(all(&mut wider, &added), [(1, 5)]);

    let mut narrower = rocks::<u64>(&dir, whole());
    StateRegistrar::new(&mut narrower).value::<u64>("renamed");
    assert_eq!(
        narrower.restore(&restore_native(&second.dir)),
        Err(StateError::UnknownState("count".into()))
    );
}

#[test]
fn a_native_restore_keeps_only_the_key_groups_of_the_subtask() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = rocks::<u64>(&dir, whole());
    let count = StateRegistrar::new(&mut backend).value::<u64>("count");
    for key in 0..1000u64 {
        KeyedContext::new(&mut backend, &key).value(&count).set(key);
    }
    let mut restored_keys = 0;
    for index in 0..2 {
        let snapshot = native(backend.snapshot(CheckpointId(u64::from(index))).unwrap());
        let range = half(index);
        let mut restored = rocks::<u64>(&dir, range);
        let count = StateRegistrar::new(&mut restored).value::<u64>("count");
        restored.restore(&restore_native(&snapshot.dir)).unwrap();
        for (key, value) in all(&mut restored, &count) {
            assert_eq!(key, value);
            assert!(range.contains(key_group_of(&key, MAX_P)), "key {key}");
            restored_keys += 1;
        }
    }
    assert_eq!(restored_keys, 1000);
}

#[test]
fn the_working_directory_exists_from_first_use_until_drop() {
    let dir = tempfile::tempdir().unwrap();
    let entries = || std::fs::read_dir(dir.path()).unwrap().count();
    let mut first = rocks::<u64>(&dir, half(0));
    let mut second = rocks::<u64>(&dir, half(0));
    let count = StateRegistrar::new(&mut first).value::<u64>("count");
    StateRegistrar::new(&mut second).value::<u64>("count");
    assert_eq!(entries(), 0, "nothing on disk before use");
    first.restore(&RestoreState::default()).unwrap();
    second.restore(&RestoreState::default()).unwrap();
    KeyedContext::new(&mut first, &0).value(&count).set(1);
    first.flush().unwrap();
    // Two instances of the same subtask (a restart while the old one is
    // still dropping) get directories of their own.
    assert_eq!(entries(), 2);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(name.starts_with("op-1-0-"), "{name}");
    }
    drop(first);
    assert_eq!(entries(), 1);
    drop(second);
    assert_eq!(entries(), 0);
}

/// The keys of batch `batch` of a seeded stream: batches of different
/// sizes, with repeated keys in each.
fn batch_keys(batch: usize, seed: &mut u64) -> Vec<u64> {
    (0..(batch * 37) % 300 + 1)
        .map(|_| {
            *seed = splitmix64(*seed);
            *seed % 500
        })
        .collect()
}

/// Counts a seeded stream of keys in batches, each read ahead by
/// `prepare` before its records run, as a keyed step does.
fn count_in_batches(backend: &mut KeyedStateBackend<u64>, batches: usize) -> Vec<(u64, u64)> {
    let count: ValueState<u64> = StateRegistrar::new(backend).value("count");
    let mut slots = Vec::new();
    let mut seed = 7;
    for batch in 0..batches {
        let keys = batch_keys(batch, &mut seed);
        backend.prepare(&keys, &mut slots);
        assert_eq!(slots.len(), keys.len());
        for key in &keys {
            *KeyedContext::new(backend, key)
                .value(&count)
                .get_or_default() += 1;
        }
    }
    all(backend, &count)
}

#[test]
fn batches_read_ahead_from_rocksdb_count_as_the_heap_does_whatever_the_cache_holds() {
    let expected = count_in_batches(&mut heap(whole()), 40);
    assert_eq!(expected.iter().map(|(_, c)| c).sum::<u64>(), {
        (0..40).map(|b| ((b * 37) % 300 + 1) as u64).sum::<u64>()
    });
    for capacity in [1, 3, 64, 256, StateBackend::DEFAULT_CACHE_ENTRIES] {
        let dir = tempfile::tempdir().unwrap();
        let mut backend = rocks_cached(&dir, whole(), capacity);
        assert_eq!(
            count_in_batches(&mut backend, 40),
            expected,
            "cache of {capacity}"
        );
    }
}

#[test]
fn the_rocksdb_backend_combines_added_values_in_order_whatever_the_cache_holds() {
    for capacity in [1, 2, 50, StateBackend::DEFAULT_CACHE_ENTRIES] {
        let dir = tempfile::tempdir().unwrap();
        reducing_semantics(rocks_cached(&dir, whole(), capacity));
    }
}

/// Adds each round's number to each of `keys` keys.
fn add_rounds(
    backend: &mut KeyedStateBackend<u64>,
    log: &ReducingState<String, impl ReduceFunction<String>>,
    keys: u64,
    rounds: std::ops::Range<u64>,
) {
    for round in rounds {
        for key in 0..keys {
            KeyedContext::new(backend, &key)
                .reducing(log)
                .add(format!("{round}"));
        }
    }
}

#[test]
fn merge_operands_in_a_native_checkpoint_restore_whole_and_rescaled() {
    const KEYS: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let mut backend = rocks_uncached(&dir, whole());
    let log = StateRegistrar::new(&mut backend).reducing("log", append);
    // A cache of one: each add is a merge operand in the database.
    add_rounds(&mut backend, &log, KEYS, 0..3);
    let snapshots: Vec<NativeCheckpoint> = (0..3)
        .map(|id| native(backend.snapshot(CheckpointId(id)).unwrap()))
        .collect();
    // Adds after the synchronous part do not reach the snapshot.
    add_rounds(&mut backend, &log, KEYS, 3..4);
    let at_snapshot: Vec<(u64, String)> = (0..KEYS).map(|k| (k, "012".into())).collect();

    let mut restored = rocks(&dir, whole());
    let log2 = StateRegistrar::new(&mut restored).reducing("log", append);
    restored
        .restore(&restore_native(&snapshots[0].dir))
        .unwrap();
    assert_eq!(all(&mut restored, &log2), at_snapshot);
    add_rounds(&mut restored, &log2, KEYS, 7..8);
    assert_eq!(
        KeyedContext::new(&mut restored, &5).reducing(&log2).get(),
        Some(&"0127".to_string())
    );

    // Rescaled to two subtasks: each copies its key groups out.
    let mut rescaled = Vec::new();
    for (index, snapshot) in snapshots[1..].iter().enumerate() {
        let range = half(index as u32);
        let mut part = rocks(&dir, range);
        let log = StateRegistrar::new(&mut part).reducing("log", append);
        let state = RestoreState {
            imports: vec![snapshot.dir.clone()],
            ..RestoreState::default()
        };
        part.restore(&state).unwrap();
        for (key, value) in all(&mut part, &log) {
            assert!(range.contains(key_group_of(&key, MAX_P)), "key {key}");
            rescaled.push((key, value));
        }
    }
    rescaled.sort();
    assert_eq!(rescaled, at_snapshot);
}

#[test]
fn a_value_state_restored_as_a_reducing_state_goes_on_from_its_values() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = rocks(&dir, whole());
    let count = StateRegistrar::new(&mut backend).value::<u64>("count");
    for key in 0..100u64 {
        KeyedContext::new(&mut backend, &key).value(&count).set(key);
    }
    let snapshot = native(backend.snapshot(CheckpointId(1)).unwrap());
    let mut restored = rocks_uncached(&dir, whole());
    let sum = StateRegistrar::new(&mut restored).reducing("count", |a: &mut u64, b: u64| *a += b);
    restored.restore(&restore_native(&snapshot.dir)).unwrap();
    for key in 0..100u64 {
        KeyedContext::new(&mut restored, &key)
            .reducing(&sum)
            .add(1000);
    }
    let expected: Vec<(u64, u64)> = (0..100).map(|k| (k, k + 1000)).collect();
    assert_eq!(all(&mut restored, &sum), expected);
}

/// Keys of a large write-back: more than the writes at which RocksDB takes
/// one as an SST file of its own instead of through the memtable.
const LARGE: u64 = 70_000;

/// Step `step` of a sequence of write-backs: even steps write every one of
/// `LARGE` keys, odd steps a hundred; a count is raised or deleted, a log
/// appended to (a merge operand once written back).
fn write_back_step(
    backend: &mut KeyedStateBackend<u64>,
    count: &ValueState<u64>,
    log: &ReducingState<String, impl ReduceFunction<String>>,
    step: u64,
) {
    let keys = if step.is_multiple_of(2) { LARGE } else { 100 };
    for key in 0..keys {
        let mut ctx = KeyedContext::new(backend, &key);
        if (key + step).is_multiple_of(5) {
            ctx.value(count).clear();
        } else {
            *ctx.value(count).get_or_default() += step + 1;
        }
        ctx.reducing(log).add(format!("{step},"));
    }
    backend.flush().unwrap();
}

#[test]
fn large_and_small_write_backs_of_the_same_keys_land_in_the_order_made() {
    // Large write-backs go into RocksDB as ingested SST files, small ones
    // through the memtable, which still holds the odd steps' writes when
    // the next even step's file goes in.
    let dir = tempfile::tempdir().unwrap();
    let mut model = heap(whole());
    let mut backend = rocks(&dir, whole());
    let mut states = Vec::new();
    for b in [&mut model, &mut backend] {
        let mut reg = StateRegistrar::new(b);
        states.push((reg.value::<u64>("count"), reg.reducing("log", append)));
    }
    let mut snapshot = None;
    let mut at_snapshot = None;
    for step in 0..6 {
        for (b, (count, log)) in [&mut model, &mut backend].into_iter().zip(&states) {
            write_back_step(b, count, log, step);
        }
        if step == 3 {
            snapshot = Some(native(backend.snapshot(CheckpointId(1)).unwrap()));
            let (count, log) = &states[0];
            at_snapshot = Some((all(&mut model, count), all(&mut model, log)));
        }
    }
    let (count, log) = &states[0];
    let expected = (all(&mut model, count), all(&mut model, log));
    assert_eq!(expected.0.len() as u64, LARGE * 4 / 5);
    assert_eq!(expected.1[1].1, "0,1,2,3,4,5,");
    let (count, log) = &states[1];
    assert_eq!((all(&mut backend, count), all(&mut backend, log)), expected);

    // Read back key by key, from a restore of the snapshot.
    let mut restored = rocks_uncached(&dir, whole());
    let mut reg = StateRegistrar::new(&mut restored);
    let (count, log) = (reg.value::<u64>("count"), reg.reducing("log", append));
    let native = snapshot.unwrap();
    restored.restore(&restore_native(&native.dir)).unwrap();
    let (counts, logs) = at_snapshot.unwrap();
    for (key, expected) in counts.iter().step_by(97) {
        let found = KeyedContext::new(&mut restored, key)
            .value(&count)
            .get()
            .copied();
        assert_eq!(found, Some(*expected), "count of {key}");
    }
    assert_eq!(all(&mut restored, &log), logs);
}

#[test]
fn a_panicking_reduce_in_a_merge_fails_the_read_instead_of_aborting() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = rocks_uncached(&dir, whole());
    let sum = StateRegistrar::new(&mut backend).reducing("sum", |acc: &mut u64, n: u64| {
        assert_ne!(*acc, 13, "thirteen");
        *acc += n;
    });
    for n in [13, 1] {
        // Each add is written back as a merge operand by the next.
        KeyedContext::new(&mut backend, &1).reducing(&sum).add(n);
        KeyedContext::new(&mut backend, &2).reducing(&sum).add(n);
    }
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        KeyedContext::new(&mut backend, &1)
            .reducing(&sum)
            .get()
            .copied()
    }));
    let message = read.expect_err("the merge failed");
    let message = message.downcast_ref::<String>().expect("a formatted panic");
    assert!(message.contains("reading keyed state \"sum\""), "{message}");
}

/// Counts a seeded stream of keys in batches read ahead by `prepare`, as
/// wordcount does with `Emit::Updates`: an add, then a read of the count.
fn count_updates_in_batches(backend: &mut KeyedStateBackend<u64>) -> Vec<u64> {
    let count = StateRegistrar::new(backend).reducing("count", |a: &mut u64, b: u64| *a += b);
    let (mut slots, mut seed, mut updates) = (Vec::new(), 3, Vec::new());
    for batch in 0..40 {
        let keys = batch_keys(batch, &mut seed);
        backend.prepare(&keys, &mut slots);
        for key in &keys {
            let mut ctx = KeyedContext::new(backend, key);
            let mut entry = ctx.reducing(&count);
            entry.add(1);
            // The first batches only add: reads come in later ones.
            if batch >= 3 {
                updates.push(*entry.get().unwrap());
            }
        }
    }
    updates
}

#[test]
fn reads_of_a_reducing_state_in_batches_see_every_add_whatever_the_cache_holds() {
    let expected = count_updates_in_batches(&mut heap(whole()));
    assert!(expected.iter().any(|n| *n > 5));
    for capacity in [1, 3, 64, 256, StateBackend::DEFAULT_CACHE_ENTRIES] {
        let dir = tempfile::tempdir().unwrap();
        let mut backend = rocks_cached(&dir, whole(), capacity);
        assert_eq!(
            count_updates_in_batches(&mut backend),
            expected,
            "cache of {capacity}"
        );
    }
}

#[test]
fn states_with_ttl_expire_in_rocksdb_whatever_the_cache_holds() {
    for capacity in [1, 3, StateBackend::DEFAULT_CACHE_ENTRIES] {
        let dir = tempfile::tempdir().unwrap();
        ttl_semantics(rocks_cached(&dir, whole(), capacity));
    }
}

#[test]
fn native_checkpoints_migrate_to_and_from_ttl() {
    let dir = tempfile::tempdir().unwrap();
    for capacity in [1, StateBackend::DEFAULT_CACHE_ENTRIES] {
        ttl_migrates_both_ways(&|| rocks_cached(&dir, whole(), capacity));
    }
}

#[test]
fn rocksdb_compaction_drops_expired_values_and_list_elements() {
    let dir = tempfile::tempdir().unwrap();
    compaction_drops_what_expired(rocks(&dir, whole()));
}

/// The bytes of the SST files of a native checkpoint of `backend`.
fn checkpointed_bytes(backend: &mut KeyedStateBackend<u64>, id: u64) -> u64 {
    let checkpoint = native(backend.snapshot(CheckpointId(id)).unwrap());
    let bytes = checkpoint
        .files
        .iter()
        .filter(|f| f.is_shared())
        .map(|f| f.size)
        .sum();
    std::fs::remove_dir_all(&checkpoint.dir).unwrap();
    bytes
}

/// What an incremental checkpoint references shrinks with the state as
/// compaction drops the expired values: 90 % of 200,000 keys expire.
#[test]
fn a_checkpoint_of_mostly_expired_state_shrinks_after_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = rocks::<u64>(&dir, whole());
    let count = StateRegistrar::new(&mut backend).value_with_ttl::<u64>("count", ttl_100ms());
    backend.set_time(1000);
    for key in 0..200_000u64 {
        KeyedContext::new(&mut backend, &key).value(&count).set(key);
    }
    backend.set_time(1080);
    for key in 0..20_000u64 {
        KeyedContext::new(&mut backend, &key)
            .value(&count)
            .set(key + 1);
    }
    let before = checkpointed_bytes(&mut backend, 1);
    backend.set_time(1150);
    let KeyedStateBackend::Embedded(rocks) = &mut backend else {
        unreachable!("a RocksDB backend")
    };
    rocks.compact().unwrap();
    let after = checkpointed_bytes(&mut backend, 2);
    assert!(
        after * 5 < before,
        "{after} bytes after compaction against {before} before"
    );
    assert_eq!(all(&mut backend, &count).len(), 20_000);
}

/// The names of the SST files a native checkpoint links.
fn sst_files(checkpoint: &NativeCheckpoint) -> Vec<String> {
    let files = checkpoint.files.iter().filter(|f| f.is_shared());
    files.map(|f| f.name.clone()).collect()
}

type Sum = fn(&mut u64, u64);

/// A value state and a reducing state.
fn churned_states(
    backend: &mut KeyedStateBackend<u64>,
) -> (ValueState<u64>, ReducingState<u64, Sum>) {
    let mut reg = StateRegistrar::new(backend);
    let sum: Sum = |acc, n| *acc += n;
    (reg.value("count"), reg.reducing("sum", sum))
}

/// Adds 1 to `count` and the key to `sum` for `keys`, then clears `count`
/// of the keys in `cleared`.
fn churn(
    backend: &mut KeyedStateBackend<u64>,
    (count, sum): &(ValueState<u64>, ReducingState<u64, Sum>),
    keys: std::ops::Range<u64>,
    cleared: std::ops::Range<u64>,
) {
    for key in keys {
        let mut ctx = KeyedContext::new(backend, &key);
        *ctx.value(count).get_or_default() += 1;
        ctx.reducing(sum).add(key);
    }
    for key in cleared {
        KeyedContext::new(backend, &key).value(count).clear();
    }
}

type Range = std::ops::Range<u64>;

/// The counts and sums `churn` leaves, kept beside the backend.
#[derive(Clone, Default)]
struct Churned {
    count: BTreeMap<u64, u64>,
    sum: BTreeMap<u64, u64>,
}

impl Churned {
    /// Churns the states of `backend` (with the function `churn`) and
    /// these alike.
    fn churn_in(
        &mut self,
        backend: &mut KeyedStateBackend<u64>,
        states: &(ValueState<u64>, ReducingState<u64, Sum>),
        keys: Range,
        cleared: Range,
    ) {
        churn(backend, states, keys.clone(), cleared.clone());
        self.churn(keys, cleared);
    }

    fn churn(&mut self, keys: Range, cleared: Range) {
        for key in keys {
            *self.count.entry(key).or_default() += 1;
            *self.sum.entry(key).or_default() += key;
        }
        for key in cleared {
            self.count.remove(&key);
        }
    }

    /// Whether RocksDB restored from `state` holds exactly these.
    fn restored_from(&self, dir: &tempfile::TempDir, state: &RestoreState) {
        self.restored_into(rocks::<u64>(dir, whole()), state);
    }

    /// Whether `restored`, restored from `state`, holds exactly these.
    fn restored_into(&self, mut restored: KeyedStateBackend<u64>, state: &RestoreState) {
        let (count, sum) = churned_states(&mut restored);
        restored.restore(state).unwrap();
        let expected = |m: &BTreeMap<u64, u64>| m.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>();
        assert_eq!(all(&mut restored, &count), expected(&self.count));
        assert_eq!(all(&mut restored, &sum), expected(&self.sum));
    }
}

/// A cache that holds the whole state, and whose values mostly changed at
/// the checkpoint before, copies them out in the heap format: the database
/// gets none of them, and a restore from the copy sees every value and
/// nothing cleared. The checkpoint after one that changed little is native
/// again: its write-back brings the database up to date, values only ever
/// copied out included, and the next native one adds to it. A cache that
/// evicted never copies out.
#[test]
fn a_checkpoint_under_churn_copies_the_whole_cache_and_the_database_catches_up() {
    for (capacity, copies) in [(StateBackend::DEFAULT_CACHE_ENTRIES, true), (500, false)] {
        let dir = tempfile::tempdir().unwrap();
        let mut backend = rocks_cached::<u64>(&dir, whole(), capacity);
        let states = churned_states(&mut backend);
        let mut model = Churned::default();
        let mut step = |backend: &mut KeyedStateBackend<u64>, id, keys: Range, cleared: Range| {
            model.churn_in(backend, &states, keys, cleared);
            (backend.snapshot(CheckpointId(id)).unwrap(), model.clone())
        };
        let is_copy = |snapshot: &KeyedSnapshot| matches!(snapshot, KeyedSnapshot::Heap(_));
        let linked = |a: &NativeCheckpoint, b: &NativeCheckpoint| {
            let b = sst_files(b);
            sst_files(a).iter().filter(|f| b.contains(f)).count()
        };
        let (first, _) = step(&mut backend, 1, 0..2000, 0..0);
        let first = native(first);
        // A family's writes each went through its memtable, and into one
        // SST file at the checkpoint: too few runs to compact.
        assert_eq!(sst_files(&first).len(), 2);
        let (second, at_second) = step(&mut backend, 2, 0..2000, 0..100);
        assert_eq!(is_copy(&second), copies, "capacity {capacity}");
        let second = match second {
            KeyedSnapshot::Native(pending) => {
                let second = pending.wait().unwrap();
                assert_eq!(linked(&first, &second), 2, "capacity {capacity}");
                restore_native(&second.dir)
            }
            copy => restore_from(copy),
        };
        let (third, at_third) = step(&mut backend, 3, 0..10, 0..0);
        assert_eq!(is_copy(&third), copies, "the churn before counts");
        let third = restore_from(third);
        let (fourth, at_fourth) = step(&mut backend, 4, 0..10, 0..0);
        let fourth = native(fourth);
        let (fifth, at_fifth) = step(&mut backend, 5, 0..10, 0..0);
        let fifth = native(fifth);
        if copies {
            assert_eq!(linked(&first, &fourth), 0, "what was copied replaces");
            let added = sst_files(&fourth).len();
            assert_eq!(linked(&fourth, &fifth), added, "a small change adds");
            // A copy is in the heap's format.
            at_second.restored_into(heap(whole()), &second);
        }
        at_second.restored_from(&dir, &second);
        at_third.restored_from(&dir, &third);
        at_fourth.restored_from(&dir, &restore_native(&fourth.dir));
        at_fifth.restored_from(&dir, &restore_native(&fifth.dir));
    }
}

/// Values copied out and never written are written when the cache first
/// evicts: a native checkpoint after that holds them.
#[test]
fn values_only_copied_out_are_written_back_when_the_cache_evicts() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = rocks_cached::<u64>(&dir, whole(), 5000);
    let states = churned_states(&mut backend);
    let mut model = Churned::default();
    for (id, keys) in [(1, 0..2000), (2, 0..2000)] {
        model.churn_in(&mut backend, &states, keys, 0..0);
        let snapshot = backend.snapshot(CheckpointId(id)).unwrap();
        assert_eq!(matches!(snapshot, KeyedSnapshot::Heap(_)), id == 2);
    }
    // Two values a key: 3,000 keys more overflow the cache.
    model.churn_in(&mut backend, &states, 2000..5000, 0..0);
    let evicted = native(backend.snapshot(CheckpointId(3)).unwrap());
    model.restored_from(&dir, &restore_native(&evicted.dir));
}

/// Key groups restored into an empty database stay in the cache while they
/// fit in it, which stays whole: the first checkpoint copies them out, and
/// the native one after a small change writes them all into the database.
/// Beyond the cache, the restore writes them into the database.
#[test]
fn key_groups_restore_into_a_whole_cache_while_they_fit() {
    for (capacity, copies) in [(StateBackend::DEFAULT_CACHE_ENTRIES, true), (1000, false)] {
        let dir = tempfile::tempdir().unwrap();
        let mut source = heap::<u64>(whole());
        let source_states = churned_states(&mut source);
        let mut model = Churned::default();
        model.churn_in(&mut source, &source_states, 0..2000, 0..100);
        let mut backend = rocks_cached::<u64>(&dir, whole(), capacity);
        let states = churned_states(&mut backend);
        backend.restore(&restorable(&mut source)).unwrap();
        let first = backend.snapshot(CheckpointId(1)).unwrap();
        let is_copy = matches!(first, KeyedSnapshot::Heap(_));
        assert_eq!(is_copy, copies, "capacity {capacity}");
        model.restored_from(&dir, &restore_from(first));
        model.churn_in(&mut backend, &states, 0..10, 0..0);
        let second = native(backend.snapshot(CheckpointId(2)).unwrap());
        model.restored_from(&dir, &restore_native(&second.dir));
    }
}

/// A whole cache under churn in one state only, beside a state that stays
/// as it is, replaces the churned state's column family at a native
/// checkpoint. RocksDB's default column family cannot be dropped: a state
/// of that name is replaced by deleting every key it had.
#[test]
fn a_state_named_as_the_default_family_is_replaced_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = rocks::<u64>(&dir, whole());
    let mut reg = StateRegistrar::new(&mut backend);
    let (default, still) = (reg.value::<u64>("default"), reg.value::<u64>("still"));
    for key in 0..5000u64 {
        KeyedContext::new(&mut backend, &key).value(&still).set(key);
    }
    let checkpoint = |backend: &mut KeyedStateBackend<u64>, id, values: std::ops::Range<u64>| {
        for key in 0..1000u64 {
            let mut ctx = KeyedContext::new(backend, &key);
            match values.contains(&key) {
                true => ctx.value(&default).set(key + id),
                false => drop(ctx.value(&default).clear()),
            }
        }
        backend.snapshot(CheckpointId(id)).unwrap()
    };
    native(checkpoint(&mut backend, 1, 0..1000));
    // Every value changed at the first checkpoint: the second copies out.
    let copied = checkpoint(&mut backend, 2, 100..1000);
    assert!(matches!(copied, KeyedSnapshot::Heap(_)));
    let replaced = native(checkpoint(&mut backend, 3, 200..1000));
    let mut restored = rocks::<u64>(&dir, whole());
    let mut reg = StateRegistrar::new(&mut restored);
    let (default, still) = (reg.value::<u64>("default"), reg.value::<u64>("still"));
    restored.restore(&restore_native(&replaced.dir)).unwrap();
    let expected = (200..1000).map(|k| (k, k + 3));
    assert_eq!(all(&mut restored, &default), expected.collect::<Vec<_>>());
    assert_eq!(
        all(&mut restored, &still),
        (0..5000).map(|k| (k, k)).collect::<Vec<_>>()
    );
}
