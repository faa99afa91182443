//! Keyed-state fixtures: the behaviour every backend must have, run by the
//! heap's tests here and by the embedded stores' tests in their crates.

use crate::dataflow::task::RestoreState;
use crate::model::batch::Data;
use crate::model::ids::SubtaskIndex;
use crate::model::key_group::KeyGroupRange;
use crate::model::rng::splitmix64;
use crate::state::{
    AllKeys, Key, KeyedContext, KeyedStateBackend, SingleValue, StateBackend, StateRegistrar,
    StateTtlConfig,
};
use std::collections::BTreeMap;

/// The max parallelism of the fixtures: 128 key groups.
pub const MAX_P: u32 = 128;

/// Every key group, as one subtask owns them.
pub fn whole() -> KeyGroupRange {
    KeyGroupRange::for_subtask(MAX_P, 1, SubtaskIndex(0))
}

/// The key groups of subtask `index` of two.
pub fn half(index: u32) -> KeyGroupRange {
    KeyGroupRange::for_subtask(MAX_P, 2, SubtaskIndex(index))
}

/// A heap backend for `range`.
pub fn heap<K: Key>(range: KeyGroupRange) -> KeyedStateBackend<K> {
    KeyedStateBackend::new(&StateBackend::Heap, "test", range, MAX_P)
}

/// Every key and value of `state`, sorted by key, after a flush.
pub fn all<K: Key + Ord, V: Data>(
    backend: &mut KeyedStateBackend<K>,
    state: &impl SingleValue<V>,
) -> Vec<(K, V)> {
    backend.flush().unwrap();
    let mut all: Vec<_> = AllKeys::new(backend).values(state).collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

/// A restore from the native checkpoint in `dir` alone.
pub fn restore_native(dir: &std::path::Path) -> RestoreState {
    RestoreState {
        native: Some(dir.to_owned()),
        ..RestoreState::default()
    }
}

/// The behaviour every backend must have, run against each.
pub fn value_map_and_list_semantics(mut backend: KeyedStateBackend<String>) {
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

/// Appends: associative but not commutative, so an operand merged out of
/// order shows.
pub fn append(acc: &mut String, more: String) {
    acc.push_str(&more);
}

/// Adds, reads and clears of a seeded stream of keys, against a model.
pub fn reducing_semantics(mut backend: KeyedStateBackend<u64>) {
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

/// The TTL every fixture below declares: 100 ms, values invisible once
/// expired, renewed on write.
pub fn ttl_100ms() -> StateTtlConfig {
    StateTtlConfig::new(std::time::Duration::from_millis(100))
}

/// A sum, as a reducing state's function.
fn sum(acc: &mut u64, n: u64) {
    *acc += n;
}

/// What states with TTL must do on every backend: an expired value,
/// element or entry is never returned, a write renews it, and an add to an
/// expired reducing value starts again.
pub fn ttl_semantics(mut backend: KeyedStateBackend<u64>) {
    let mut reg = StateRegistrar::new(&mut backend);
    let value = reg.value_with_ttl::<u64>("value", ttl_100ms());
    let reducing = reg.reducing_with_ttl("reducing", sum as fn(&mut u64, u64), ttl_100ms());
    let list = reg.list_with_ttl::<u64>("list", ttl_100ms());
    let map = reg.map_with_ttl::<u64, u64>("map", ttl_100ms());
    backend.set_time(1000);
    for key in 0..10u64 {
        let mut ctx = KeyedContext::new(&mut backend, &key);
        ctx.value(&value).set(key);
        ctx.reducing(&reducing).add(key);
        ctx.ttl_list(&list).add(key);
        ctx.ttl_map(&map).put(key, key);
    }
    backend.set_time(1050);
    for key in 0..5u64 {
        let mut ctx = KeyedContext::new(&mut backend, &key);
        ctx.ttl_list(&list).add(100 + key);
        ctx.ttl_map(&map).put(100 + key, 1);
        ctx.reducing(&reducing).add(1);
    }
    *KeyedContext::new(&mut backend, &0)
        .value(&value)
        .get_or_default() += 7;
    backend.set_time(1120);
    // Stamped 1000 and 1050, then added to at 1120: the value had not
    // expired when the second add came, so the third goes on from it,
    // however the backend combines adds.
    KeyedContext::new(&mut backend, &1)
        .reducing(&reducing)
        .add(10);
    let sum = |key: u64| key + 1 + if key == 1 { 10 } else { 0 };
    for key in 0..10u64 {
        let mut ctx = KeyedContext::new(&mut backend, &key);
        let renewed = key < 5;
        let expect_value = (key == 0).then_some(7);
        assert_eq!(ctx.value(&value).get().copied(), expect_value, "key {key}");
        let expect_sum = renewed.then_some(sum(key));
        assert_eq!(
            ctx.reducing(&reducing).get().copied(),
            expect_sum,
            "key {key}"
        );
        let listed: Vec<u64> = ctx.ttl_list(&list).get().copied().collect();
        assert_eq!(listed, if renewed { vec![100 + key] } else { vec![] });
        let mut entries = ctx.ttl_map(&map);
        assert_eq!(entries.get(&key), None, "key {key}");
        assert_eq!(entries.get(&(100 + key)), renewed.then_some(&1));
        assert_eq!(entries.iter().count(), usize::from(renewed));
    }
    // An add to an expired value starts again from it.
    KeyedContext::new(&mut backend, &7)
        .reducing(&reducing)
        .add(5);
    assert_eq!(all(&mut backend, &value), vec![(0, 7)]);
    let sums: Vec<(u64, u64)> = (0..5).map(|k| (k, sum(k))).chain([(7, 5)]).collect();
    assert_eq!(all(&mut backend, &reducing), sums);
    backend.set_time(1300);
    assert_eq!(all(&mut backend, &value), vec![]);
    assert_eq!(all(&mut backend, &reducing), vec![]);
    let mut ctx = KeyedContext::new(&mut backend, &3);
    assert_eq!(ctx.ttl_list(&list).get().count(), 0);
    assert_eq!(ctx.ttl_map(&map).iter().count(), 0);
}

/// States declared by `declare` in a fresh backend from `make`, restored
/// from `state` at processing time `time`.
pub fn restored<S>(
    make: &dyn Fn() -> KeyedStateBackend<u64>,
    declare: impl FnOnce(&mut StateRegistrar<'_, u64>) -> S,
    state: &RestoreState,
    time: u64,
) -> (KeyedStateBackend<u64>, S) {
    let mut backend = make();
    let states = declare(&mut StateRegistrar::new(&mut backend));
    let state = RestoreState {
        time,
        ..state.clone()
    };
    backend.restore(&state).unwrap();
    (backend, states)
}

/// A snapshot of `backend` to restore from: its key groups for the heap,
/// its native checkpoint for an embedded store.
pub fn restorable(backend: &mut KeyedStateBackend<u64>) -> RestoreState {
    restore_from(
        backend
            .snapshot(crate::model::ids::CheckpointId(1))
            .unwrap(),
    )
}

/// What restores `snapshot`: its key groups, encoded, or its native
/// checkpoint, made.
pub fn restore_from(snapshot: crate::state::snapshot::KeyedSnapshot) -> RestoreState {
    use crate::state::snapshot::KeyedSnapshot;
    match snapshot {
        KeyedSnapshot::Heap(snapshot) => RestoreState {
            key_groups: snapshot
                .key_groups()
                .iter()
                .enumerate()
                .map(|(offset, group)| (group, snapshot.take_group(offset).into()))
                .collect(),
            ..RestoreState::default()
        },
        KeyedSnapshot::Native(pending) => {
            restore_native(&pending.wait().expect("a native checkpoint").dir)
        }
    }
}

/// A state restores from a snapshot of itself without TTL into one with
/// TTL, its values living a TTL from the restore, and back, keeping every
/// value; restored with another TTL, its values live that TTL from their
/// timestamps.
pub fn ttl_migrates_both_ways(make: &dyn Fn() -> KeyedStateBackend<u64>) {
    let keys: Vec<(u64, u64)> = (0..50).map(|k| (k, k * 3)).collect();
    let mut plain = make();
    let count = StateRegistrar::new(&mut plain).value::<u64>("count");
    for &(key, n) in &keys {
        KeyedContext::new(&mut plain, &key).value(&count).set(n);
    }
    let with_ttl = |r: &mut StateRegistrar<'_, u64>| r.value_with_ttl::<u64>("count", ttl_100ms());
    let (mut ttl, count) = restored(make, with_ttl, &restorable(&mut plain), 5000);
    ttl.set_time(5050);
    assert_eq!(all(&mut ttl, &count), keys);
    // A value read again is not stamped anew.
    ttl.set_time(5099);
    for &(key, n) in &keys {
        assert_eq!(
            KeyedContext::new(&mut ttl, &key).value(&count).get(),
            Some(&n)
        );
    }
    ttl.set_time(5100);
    assert_eq!(all(&mut ttl, &count), vec![]);

    let mut ttl = make();
    let count = with_ttl(&mut StateRegistrar::new(&mut ttl));
    ttl.set_time(1000);
    for &(key, n) in &keys {
        KeyedContext::new(&mut ttl, &key).value(&count).set(n);
    }
    let without = |r: &mut StateRegistrar<'_, u64>| r.value::<u64>("count");
    let (mut plain, count) = restored(make, without, &restorable(&mut ttl), 1_000_000);
    assert_eq!(all(&mut plain, &count), keys);

    // Another TTL applies to the timestamps the snapshot kept.
    let ten_seconds = StateTtlConfig::new(std::time::Duration::from_secs(10));
    let longer = |r: &mut StateRegistrar<'_, u64>| r.value_with_ttl::<u64>("count", ten_seconds);
    let (mut longer, count) = restored(make, longer, &restorable(&mut ttl), 1200);
    assert_eq!(all(&mut longer, &count), keys);
    longer.set_time(11_000);
    assert_eq!(all(&mut longer, &count), vec![]);
}

/// A state with TTL that returns expired values until they are cleaned up,
/// on an embedded store: its values are there until a compaction drops
/// them, and a list loses only its expired elements.
pub fn compaction_drops_what_expired(mut backend: KeyedStateBackend<u64>) {
    use crate::state::StateVisibility::ReturnExpiredIfNotCleanedUp;
    let ttl = ttl_100ms().visibility(ReturnExpiredIfNotCleanedUp);
    let mut reg = StateRegistrar::new(&mut backend);
    let count = reg.value_with_ttl::<u64>("count", ttl);
    let seen = reg.list_with_ttl::<u64>("seen", ttl);
    backend.set_time(1000);
    for key in 0..1000u64 {
        let mut ctx = KeyedContext::new(&mut backend, &key);
        ctx.value(&count).set(key);
        ctx.ttl_list(&seen).add(key);
    }
    backend.set_time(1080);
    for key in 0..100u64 {
        let mut ctx = KeyedContext::new(&mut backend, &key);
        ctx.value(&count).set(key);
        ctx.ttl_list(&seen).add(key + 1);
    }
    backend.set_time(1150);
    assert_eq!(all(&mut backend, &count).len(), 1000);
    let KeyedStateBackend::Embedded(embedded) = &mut backend else {
        panic!("compaction is an embedded store's")
    };
    embedded.compact().unwrap();
    let live: Vec<(u64, u64)> = (0..100).map(|k| (k, k)).collect();
    assert_eq!(all(&mut backend, &count), live);
    for key in [0u64, 99, 100, 999] {
        let mut ctx = KeyedContext::new(&mut backend, &key);
        let listed: Vec<u64> = ctx.ttl_list(&seen).get().copied().collect();
        assert_eq!(
            listed,
            if key < 100 { vec![key + 1] } else { vec![] },
            "key {key}"
        );
    }
}
