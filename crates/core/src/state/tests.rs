use super::*;
use crate::model::key_group::key_group_of;
use crate::testkit::state::*;

/// The embedded-store backend over sorted maps.
fn embedded<K: Key>(dir: &tempfile::TempDir, range: KeyGroupRange) -> KeyedStateBackend<K> {
    embedded_cached(dir, range, StateBackend::DEFAULT_CACHE_ENTRIES)
}

/// The same, with a write-back cache of `capacity` values.
fn embedded_cached<K: Key>(
    dir: &tempfile::TempDir,
    range: KeyGroupRange,
    capacity: usize,
) -> KeyedStateBackend<K> {
    let config = StateBackend::Embedded {
        store: Arc::new(crate::testkit::store::MemoryStore::new(dir.path())),
        cache_entries: capacity,
    };
    KeyedStateBackend::new(&config, "op-1-0", range, MAX_P)
}

#[test]
fn the_heap_backend_keeps_value_map_and_list_semantics() {
    value_map_and_list_semantics(heap(whole()));
}

#[test]
fn the_cache_in_front_of_an_embedded_store_keeps_value_map_and_list_semantics() {
    for capacity in [1, 3, StateBackend::DEFAULT_CACHE_ENTRIES] {
        let dir = tempfile::tempdir().unwrap();
        value_map_and_list_semantics(embedded_cached(&dir, whole(), capacity));
    }
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
        for mut restored in [heap::<u64>(range), embedded::<u64>(&dir, range)] {
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

    for mut other in [heap::<u64>(half(1)), embedded::<u64>(&dir, half(1))] {
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

#[test]
fn the_heap_backend_combines_added_values_in_order() {
    reducing_semantics(heap(whole()));
}

#[test]
fn the_cache_in_front_of_an_embedded_store_combines_added_values_in_order() {
    for capacity in [1, 2, 50, StateBackend::DEFAULT_CACHE_ENTRIES] {
        let dir = tempfile::tempdir().unwrap();
        reducing_semantics(embedded_cached(&dir, whole(), capacity));
    }
}

#[test]
fn states_with_ttl_expire_on_the_heap_and_in_front_of_an_embedded_store() {
    ttl_semantics(heap(whole()));
    for capacity in [1, 3, StateBackend::DEFAULT_CACHE_ENTRIES] {
        let dir = tempfile::tempdir().unwrap();
        ttl_semantics(embedded_cached(&dir, whole(), capacity));
    }
}

#[test]
fn states_migrate_to_and_from_ttl_on_the_heap_and_in_an_embedded_store() {
    ttl_migrates_both_ways(&|| heap(whole()));
    let dir = tempfile::tempdir().unwrap();
    for capacity in [1, StateBackend::DEFAULT_CACHE_ENTRIES] {
        ttl_migrates_both_ways(&|| embedded_cached(&dir, whole(), capacity));
    }
}

#[test]
fn an_embedded_store_compacts_away_what_expired() {
    let dir = tempfile::tempdir().unwrap();
    compaction_drops_what_expired(embedded(&dir, whole()));
}

/// Expired values, elements and entries are left out of a heap snapshot
/// even if nothing read them since they expired: a restore without TTL,
/// which would keep them, finds only the live ones.
#[test]
fn a_heap_snapshot_leaves_out_what_expired() {
    let mut backend = heap::<u64>(whole());
    let mut reg = StateRegistrar::new(&mut backend);
    let count = reg.value_with_ttl::<u64>("count", ttl_100ms());
    let seen = reg.list_with_ttl::<u64>("seen", ttl_100ms());
    backend.set_time(1000);
    for key in 0..100u64 {
        let mut ctx = KeyedContext::new(&mut backend, &key);
        ctx.value(&count).set(key);
        ctx.ttl_list(&seen).add(key);
    }
    backend.set_time(1060);
    for key in 0..10u64 {
        let mut ctx = KeyedContext::new(&mut backend, &key);
        ctx.value(&count).set(key);
        ctx.ttl_list(&seen).add(key + 1);
    }
    backend.set_time(1150);
    let declare =
        |r: &mut StateRegistrar<'_, u64>| (r.value::<u64>("count"), r.list::<u64>("seen"));
    let make = || heap(whole());
    let (mut plain, (count, seen)) = restored(&make, declare, &restorable(&mut backend), 0);
    assert_eq!(
        all(&mut plain, &count),
        (0..10).map(|k| (k, k)).collect::<Vec<_>>()
    );
    for key in [0u64, 9, 10, 99] {
        let listed = KeyedContext::new(&mut plain, &key)
            .list(&seen)
            .get()
            .cloned();
        assert_eq!(listed, (key < 10).then(|| vec![key + 1]), "key {key}");
    }
}

/// A heap state with TTL checks a bounded number of entries per record
/// and drops the expired ones, though no record reads them.
#[test]
fn the_heap_cleans_up_a_few_expired_entries_per_record() {
    use crate::state::StateVisibility::ReturnExpiredIfNotCleanedUp;
    let mut backend = heap::<u64>(whole());
    let ttl = ttl_100ms()
        .visibility(ReturnExpiredIfNotCleanedUp)
        .cleanup_incrementally(3);
    let count = StateRegistrar::new(&mut backend).value_with_ttl::<u64>("count", ttl);
    backend.set_time(1000);
    for key in 0..1000u64 {
        KeyedContext::new(&mut backend, &key).value(&count).set(key);
    }
    backend.set_time(1100);
    let mut slots = Vec::new();
    backend.prepare(&[5000; 50], &mut slots);
    assert_eq!(all(&mut backend, &count).len(), 1000 - 150);
    // No more than twice over the state per TTL: nothing again in the same
    // millisecond, a tenth of the entries 5 ms (a tenth of half the TTL)
    // later.
    backend.prepare(&[5000; 50], &mut slots);
    assert_eq!(all(&mut backend, &count).len(), 1000 - 150);
    backend.set_time(1105);
    backend.prepare(&[5000; 50], &mut slots);
    assert_eq!(all(&mut backend, &count).len(), 850 - 85);
    for half_ttls in 1..=6 {
        backend.set_time(1105 + 50 * half_ttls);
        backend.prepare(&[5000; 50], &mut slots);
    }
    assert_eq!(all(&mut backend, &count), vec![]);
}

/// Snapshot `checkpoint` of `backend`, waited for.
fn native(backend: &mut KeyedStateBackend<u64>, checkpoint: u64) -> Result<PathBuf, StateError> {
    match backend.snapshot(CheckpointId(checkpoint))? {
        KeyedSnapshot::Native(pending) => pending.wait().map(|native| native.dir),
        KeyedSnapshot::Heap(_) => {
            panic!("a copy of the cache where a native checkpoint was expected")
        }
    }
}

#[test]
fn a_native_checkpoint_that_cannot_be_made_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    // A cache that evicts, so that full churn is checkpointed natively.
    let mut backend = embedded_cached::<u64>(&dir, whole(), 50);
    let count = StateRegistrar::new(&mut backend).value::<u64>("count");
    let add = |backend: &mut KeyedStateBackend<u64>| {
        for key in 0..100 {
            *KeyedContext::new(backend, &key)
                .value(&count)
                .get_or_default() += 1;
        }
    };
    add(&mut backend);
    let first = native(&mut backend, 1).unwrap();
    // Where the second checkpoint would go is taken.
    let taken = PathBuf::from(first.to_string_lossy().replace("chk-1", "chk-2"));
    std::fs::create_dir(&taken).unwrap();
    add(&mut backend);
    match native(&mut backend, 2) {
        Err(StateError::Io { path, .. }) => assert_eq!(path, taken),
        other => panic!("checkpoint 2 was made: {other:?}"),
    }
    // Its write-back went in: the next checkpoint, with nothing more
    // written, holds both adds.
    let third = native(&mut backend, 3).unwrap();
    let mut restored = embedded::<u64>(&dir, whole());
    let count = StateRegistrar::new(&mut restored).value::<u64>("count");
    restored.restore(&restore_native(&third)).unwrap();
    for key in 0..100 {
        let value = KeyedContext::new(&mut restored, &key)
            .value(&count)
            .get()
            .copied();
        assert_eq!(value, Some(2), "count of {key}");
    }
}

#[test]
fn a_failed_write_back_fails_every_later_access_rather_than_lose_values() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = embedded_cached::<u64>(&dir, whole(), 1);
    // The sorted maps merge as they are written: a panicking reduce fails
    // the write.
    let sum = StateRegistrar::new(&mut backend).reducing("sum", |acc: &mut u64, n: u64| {
        assert_ne!(*acc, 13, "thirteen");
        *acc += n;
    });
    // Once the cache has evicted, adds are merge operands.
    KeyedContext::new(&mut backend, &0).reducing(&sum).add(1);
    KeyedContext::new(&mut backend, &1).reducing(&sum).add(13);
    native(&mut backend, 1).unwrap();
    KeyedContext::new(&mut backend, &1).reducing(&sum).add(1);
    let failed = native(&mut backend, 2).expect_err("the merge failed");
    assert!(matches!(failed, StateError::Store(_)), "{failed:?}");
    // The add it took as written is in no checkpoint to come.
    let next = native(&mut backend, 3).expect_err("the add is lost");
    assert!(matches!(next, StateError::WriteBackFailed(_)), "{next:?}");
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        KeyedContext::new(&mut backend, &2).reducing(&sum).add(1);
    }));
    let message = read.expect_err("the state refuses");
    let message = message.downcast_ref::<String>().expect("a formatted panic");
    assert!(message.contains("can no longer be used"), "{message}");
}
