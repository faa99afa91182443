//! Keyed-state fixtures: the behaviour every backend must have, run by the
//! heap's tests here and by the embedded stores' tests in their crates.

use crate::dataflow::task::RestoreState;
use crate::model::batch::Data;
use crate::model::ids::SubtaskIndex;
use crate::model::key_group::KeyGroupRange;
use crate::model::rng::splitmix64;
use crate::state::{
    AllKeys, Key, KeyedContext, KeyedStateBackend, SingleValue, StateBackend, StateRegistrar,
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
