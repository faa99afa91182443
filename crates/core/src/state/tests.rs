use super::*;
use crate::ids::SubtaskIndex;
use crate::key_group::key_group_of;
use crate::task::NativeCheckpoint;
use std::collections::BTreeMap;

mod reducing;

const MAX_P: u32 = 128;

fn whole() -> KeyGroupRange {
    KeyGroupRange::for_subtask(MAX_P, 1, SubtaskIndex(0))
}

fn half(index: u32) -> KeyGroupRange {
    KeyGroupRange::for_subtask(MAX_P, 2, SubtaskIndex(index))
}

fn heap<K: Key>(range: KeyGroupRange) -> KeyedStateBackend<K> {
    KeyedStateBackend::new(&StateBackend::Heap, "test", range, MAX_P)
}

#[cfg(feature = "rocksdb")]
fn rocks<K: Key>(dir: &tempfile::TempDir, range: KeyGroupRange) -> KeyedStateBackend<K> {
    let config = StateBackend::RocksDb {
        local_dir: dir.path().to_owned(),
        cache_entries: StateBackend::DEFAULT_CACHE_ENTRIES,
    };
    KeyedStateBackend::new(&config, "op-1-0", range, MAX_P)
}

#[cfg(feature = "rocksdb")]
/// RocksDB with a write-back cache of `capacity` values.
fn rocks_cached<K: Key>(
    dir: &tempfile::TempDir,
    range: KeyGroupRange,
    capacity: usize,
) -> KeyedStateBackend<K> {
    let mut backend = rocks(dir, range);
    if let KeyedStateBackend::RocksDb(b) = &mut backend {
        b.set_cache_capacity(capacity);
    }
    backend
}

#[cfg(feature = "rocksdb")]
/// RocksDB with a write-back cache of one entry: every record's value goes
/// through the database.
fn rocks_uncached<K: Key>(dir: &tempfile::TempDir, range: KeyGroupRange) -> KeyedStateBackend<K> {
    rocks_cached(dir, range, 1)
}

fn all<K: Key + Ord, V: Data>(
    backend: &mut KeyedStateBackend<K>,
    state: &impl SingleValue<V>,
) -> Vec<(K, V)> {
    backend.flush().unwrap();
    let mut all: Vec<_> = AllKeys::new(backend).values(state).collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

#[cfg(feature = "rocksdb")]
fn native(snapshot: KeyedSnapshot) -> NativeCheckpoint {
    match snapshot {
        KeyedSnapshot::Native(native) => native,
        KeyedSnapshot::Heap(_) => panic!("a RocksDB backend took a heap snapshot"),
    }
}

fn restore_native(dir: &std::path::Path) -> RestoreState {
    RestoreState {
        native: Some(dir.to_owned()),
        ..RestoreState::default()
    }
}

/// The behaviour every backend must have, run against each.
fn value_map_and_list_semantics(mut backend: KeyedStateBackend<String>) {
    let mut reg = StateRegistrar::new(&mut backend);
    let count = reg.value::<u64>("count");
    let seen = reg.list::<u32>("seen");
    let by_day = reg.map::<u8, u64>("by-day");
    let last = reg.value::<String>("last");
    for (key, n) in [("a", 1u32), ("b", 2), ("a", 3), ("c", 4)] {
        let key = key.to_string();
        let mut ctx = KeyedContext::new(&mut backend, &key);
        *ctx.value(&count).get_or_default() += 1;
        ctx.list(&seen).get_or_default().push(n);
        *ctx.map(&by_day)
            .get_or_default()
            .entry(n as u8 % 2)
            .or_default() += 1;
        ctx.value(&last).set(format!("{key}{n}"));
    }

    let a = "a".to_string();
    let mut ctx = KeyedContext::new(&mut backend, &a);
    assert_eq!(ctx.key(), "a");
    assert_eq!(ctx.value(&count).get(), Some(&2));
    assert_eq!(ctx.list(&seen).get(), Some(&vec![1, 3]));
    assert_eq!(ctx.map(&by_day).get().unwrap()[&1], 2);
    assert_eq!(ctx.value(&last).get().map(String::as_str), Some("a3"));
    // Set replaces, clear returns the old value and leaves nothing.
    ctx.value(&last).set("again".into());
    assert_eq!(ctx.value(&last).get().map(String::as_str), Some("again"));
    assert_eq!(ctx.value(&count).clear(), Some(2));
    assert_eq!(ctx.value(&count).get(), None);
    assert_eq!(ctx.value(&count).clear(), None);
    // Within one entry, changes are seen at once.
    let mut entry = ctx.list(&seen);
    entry.get_or_default().push(9);
    assert_eq!(entry.get(), Some(&vec![1, 3, 9]));
    entry.clear();
    assert_eq!(entry.get(), None);

    // A key never written has nothing; reading it writes nothing.
    let d = "d".to_string();
    let mut ctx = KeyedContext::new(&mut backend, &d);
    assert_eq!(ctx.value(&count).get(), None);
    assert_eq!(ctx.map(&by_day).get(), None);

    // Other keys are untouched by what happened to "a".
    let b = "b".to_string();
    let mut ctx = KeyedContext::new(&mut backend, &b);
    assert_eq!(ctx.list(&seen).get(), Some(&vec![2]));

    assert_eq!(
        all(&mut backend, &count),
        [("b".to_string(), 1), ("c".to_string(), 1)]
    );
    assert_eq!(
        all(&mut backend, &last),
        [
            ("a".to_string(), "again".to_string()),
            ("b".to_string(), "b2".to_string()),
            ("c".to_string(), "c4".to_string()),
        ]
    );

    // Many keys, several passes: what the cache evicts comes back.
    for round in 0..3u64 {
        for key in 0..2000u64 {
            let key = format!("k{key}");
            let mut ctx = KeyedContext::new(&mut backend, &key);
            let mut entry = ctx.value(&count);
            let n = entry.get_or_default();
            assert_eq!(*n, round, "{key}");
            *n += 1;
        }
    }
    let counts = all(&mut backend, &count);
    assert_eq!(counts.len(), 2002);
    assert!(counts
        .iter()
        .all(|(k, n)| *n == if k.starts_with('k') { 3 } else { 1 }));
}

#[test]
fn the_heap_backend_keeps_value_map_and_list_semantics() {
    value_map_and_list_semantics(heap(whole()));
}

#[cfg(feature = "rocksdb")]
#[test]
fn the_rocksdb_backend_keeps_value_map_and_list_semantics() {
    let dir = tempfile::tempdir().unwrap();
    value_map_and_list_semantics(rocks(&dir, whole()));
}

#[cfg(feature = "rocksdb")]
#[test]
fn the_rocksdb_backend_without_a_cache_keeps_value_map_and_list_semantics() {
    let dir = tempfile::tempdir().unwrap();
    value_map_and_list_semantics(rocks_uncached(&dir, whole()));
}

#[test]
fn a_heap_snapshot_restores_key_group_by_key_group_and_is_isolated_from_later_writes() {
    let mut backend = heap::<u64>(whole());
    let count = StateRegistrar::new(&mut backend).value::<u64>("count");
    for key in 0..1000u64 {
        *KeyedContext::new(&mut backend, &key)
            .value(&count)
            .get_or_default() += key;
    }
    let KeyedSnapshot::Heap(snapshot) = backend.snapshot(CheckpointId(1)).unwrap() else {
        panic!("the heap backend took a native snapshot")
    };
    // Writes after the synchronous part do not reach the snapshot.
    *KeyedContext::new(&mut backend, &7)
        .value(&count)
        .get_or_default() += 100;
    let mut bytes = Vec::new();
    let offsets = snapshot.write(&mut bytes);
    assert_eq!(offsets.len(), 128);
    let group_bytes = |group: KeyGroup| {
        let start = offsets[group.0 as usize] as usize;
        let end = offsets
            .get(group.0 as usize + 1)
            .map_or(bytes.len(), |o| *o as usize);
        bytes::Bytes::copy_from_slice(&bytes[start..end])
    };

    // Restore into two subtasks of half the range each, on either backend.
    let dir = tempfile::tempdir().unwrap();
    for index in 0..2 {
        let range = half(index);
        for mut restored in [heap::<u64>(range), rocks::<u64>(&dir, range)] {
            let count = StateRegistrar::new(&mut restored).value::<u64>("count");
            let state = RestoreState {
                key_groups: range.iter().map(|g| (g, group_bytes(g))).collect(),
                ..RestoreState::default()
            };
            restored.restore(&state).unwrap();
            let values = all(&mut restored, &count);
            assert!(values.len() > 400, "{} keys", values.len());
            for (key, value) in values {
                assert_eq!(value, key, "key {key}");
                assert!(range.contains(key_group_of(&key, MAX_P)));
            }
        }
    }

    for mut other in [heap::<u64>(half(1)), rocks::<u64>(&dir, half(1))] {
        assert_eq!(
            other.restore(&RestoreState {
                key_groups: vec![(KeyGroup(0), group_bytes(KeyGroup(0)))],
                ..RestoreState::default()
            }),
            Err(StateError::ForeignKeyGroup(KeyGroup(0)))
        );
        StateRegistrar::new(&mut other).value::<u64>("other");
        assert_eq!(
            other.restore(&RestoreState {
                key_groups: vec![(KeyGroup(127), group_bytes(KeyGroup(127)))],
                ..RestoreState::default()
            }),
            Err(StateError::UnknownState("count".into()))
        );
    }
}

#[test]
#[should_panic(expected = "declared twice")]
fn a_state_name_is_declared_once() {
    let mut backend = heap::<u64>(whole());
    let mut reg = StateRegistrar::new(&mut backend);
    reg.value::<u64>("count");
    reg.value::<u64>("count");
}

#[cfg(feature = "rocksdb")]
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
    let snapshot = native(backend.snapshot(CheckpointId(7)).unwrap());
    // Writes after the synchronous part do not reach the snapshot.
    *KeyedContext::new(&mut backend, &7)
        .value(&count)
        .get_or_default() += 100;
    backend.flush().unwrap();

    let KeyedStateBackend::RocksDb(live) = &backend else {
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

#[cfg(feature = "rocksdb")]
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

#[cfg(feature = "rocksdb")]
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
fn the_heap_backend_refuses_a_native_checkpoint() {
    let mut backend = heap::<u64>(whole());
    StateRegistrar::new(&mut backend).value::<u64>("count");
    let err = backend
        .restore(&restore_native(std::path::Path::new("/tmp/chk-3")))
        .unwrap_err();
    assert_eq!(err, StateError::NativeCheckpointOnHeap("/tmp/chk-3".into()));
    assert!(err.to_string().contains("RocksDB"), "{err}");
}

#[cfg(feature = "rocksdb")]
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

/// What a restore from `groups`, every key group of a heap snapshot of
/// the whole range encoded, holds.
fn restored_values(groups: Vec<Vec<u8>>) -> Vec<(u64, u64)> {
    let mut backend = heap::<u64>(whole());
    let count = StateRegistrar::new(&mut backend).value::<u64>("count");
    let key_groups = whole()
        .iter()
        .zip(groups)
        .map(|(g, bytes)| (g, bytes::Bytes::from(bytes)))
        .collect();
    backend
        .restore(&RestoreState {
            key_groups,
            ..RestoreState::default()
        })
        .unwrap();
    all(&mut backend, &count)
}

fn heap_snapshot(backend: &mut KeyedStateBackend<u64>) -> HeapSnapshot {
    match backend.snapshot(CheckpointId(1)).unwrap() {
        KeyedSnapshot::Heap(snapshot) => snapshot,
        KeyedSnapshot::Native(_) => unreachable!("a heap backend snapshots on the heap"),
    }
}

fn encode_all(snapshot: &HeapSnapshot) -> Vec<Vec<u8>> {
    (0..snapshot.key_groups().len())
        .map(|g| snapshot.take_group(g))
        .collect()
}

#[test]
fn heap_snapshots_each_keep_their_moment_whether_written_into_before_or_after_encoding() {
    let mut backend = heap::<u64>(whole());
    let count = StateRegistrar::new(&mut backend).value::<u64>("count");
    let add = |backend: &mut KeyedStateBackend<u64>, keys: std::ops::Range<u64>, n: u64| {
        for key in keys {
            *KeyedContext::new(backend, &key)
                .value(&count)
                .get_or_default() += n;
        }
    };
    add(&mut backend, 0..1000, 1);
    let first = heap_snapshot(&mut backend);
    // Half the key groups encoded before any write, the rest after.
    let mut first_groups: Vec<Vec<u8>> = (0..64).map(|g| first.take_group(g)).collect();
    add(&mut backend, 0..500, 10);
    let second = heap_snapshot(&mut backend);
    add(&mut backend, 0..1000, 100);
    drop(heap_snapshot(&mut backend));
    add(&mut backend, 0..1000, 1000);
    first_groups.extend((64..128).map(|g| first.take_group(g)));

    let expect = |f: &dyn Fn(u64) -> u64| (0..1000).map(|k| (k, f(k))).collect::<Vec<_>>();
    assert_eq!(restored_values(first_groups), expect(&|_| 1));
    assert_eq!(
        restored_values(encode_all(&second)),
        expect(&|k| if k < 500 { 11 } else { 1 })
    );
    assert_eq!(
        all(&mut backend, &count),
        expect(&|k| if k < 500 { 1111 } else { 1101 })
    );
}

#[test]
#[should_panic(expected = "encoded twice")]
fn a_heap_snapshot_hands_each_key_group_out_once() {
    let mut backend = heap::<u64>(whole());
    let snapshot = heap_snapshot(&mut backend);
    snapshot.take_group(3);
    snapshot.take_group(3);
}

#[test]
fn a_heap_snapshot_encoded_on_another_thread_while_the_subtask_writes_keeps_its_moment() {
    let mut backend = heap::<u64>(whole());
    let count = StateRegistrar::new(&mut backend).value::<u64>("count");
    for key in 0..20_000u64 {
        *KeyedContext::new(&mut backend, &key)
            .value(&count)
            .get_or_default() = key;
    }
    let snapshot = heap_snapshot(&mut backend);
    // However the two threads interleave (a key group taken by the encoder,
    // encoded first by a write, or copied by a write while the encoder
    // holds it), the snapshot is the state at its moment.
    let encoder = std::thread::spawn(move || restored_values(encode_all(&snapshot)));
    for round in 1..=5 {
        for key in 0..20_000u64 {
            *KeyedContext::new(&mut backend, &key)
                .value(&count)
                .get_or_default() += round;
        }
    }
    let expected: Vec<(u64, u64)> = (0..20_000).map(|k| (k, k)).collect();
    assert_eq!(encoder.join().unwrap(), expected);
    let now: Vec<(u64, u64)> = (0..20_000).map(|k| (k, k + 15)).collect();
    assert_eq!(all(&mut backend, &count), now);
}

/// The keys of batch `batch` of a seeded stream: batches of different
/// sizes, with repeated keys in each.
fn batch_keys(batch: usize, seed: &mut u64) -> Vec<u64> {
    (0..(batch * 37) % 300 + 1)
        .map(|_| {
            *seed = crate::rng::splitmix64(*seed);
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

#[cfg(feature = "rocksdb")]
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
