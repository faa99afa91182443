//! Reducing state: adds combine in order on every backend, whether RocksDB
//! holds them as merge operands, cached values or both, across write-backs,
//! snapshots and rescales.

use super::*;
use crate::rng::splitmix64;

/// Appends: associative but not commutative, so an operand merged out of
/// order shows.
fn append(acc: &mut String, more: String) {
    acc.push_str(&more);
}

/// Adds, reads and clears of a seeded stream of keys, against a model.
fn reducing_semantics(mut backend: KeyedStateBackend<u64>) {
    let log = StateRegistrar::new(&mut backend).reducing("log", append);
    let mut model: BTreeMap<u64, String> = BTreeMap::new();
    let mut seed = 11;
    for i in 0..6000u64 {
        seed = splitmix64(seed);
        let key = seed % 700;
        let mut ctx = KeyedContext::new(&mut backend, &key);
        let mut entry = ctx.reducing(&log);
        match i % 13 {
            0 => assert_eq!(entry.get(), model.get(&key), "key {key} at {i}"),
            1 => assert_eq!(entry.clear(), model.remove(&key), "key {key} at {i}"),
            _ => {
                entry.add(format!("{i},"));
                model.entry(key).or_default().push_str(&format!("{i},"));
                if i % 7 == 0 {
                    assert_eq!(entry.get(), model.get(&key), "key {key} at {i}");
                }
            }
        }
        if i % 1000 == 999 {
            let expected: Vec<_> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
            assert_eq!(all(&mut backend, &log), expected, "after {i}");
        }
    }
}

#[test]
fn the_heap_backend_combines_added_values_in_order() {
    reducing_semantics(heap(whole()));
}

#[cfg(feature = "rocksdb")]
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

#[cfg(feature = "rocksdb")]
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

#[cfg(feature = "rocksdb")]
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

#[cfg(feature = "rocksdb")]
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

#[cfg(feature = "rocksdb")]
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
