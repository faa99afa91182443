//! Keyed state: value, map and list state over serde types, scoped to the key
//! of the record being processed and partitioned by key group. Operator
//! functions declare their states once, at open, and get typed handles; the
//! backend behind the handles is chosen per job.

mod heap;

pub use heap::{HeapKeyedStateBackend, HeapSnapshot, KeySlot, StateError};

use hashbrown::hash_table;
use heap::{table_hash, GroupTable};

use crate::batch::Data;
use std::fmt::Debug;
use std::hash::Hash;
use std::marker::PhantomData;

/// What a key must be: hashable to a key group, and storable.
pub trait Key: Data + Hash + Eq + Debug {}
impl<K: Data + Hash + Eq + Debug> Key for K {}

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

/// Declares the states of a keyed function when a subtask opens it.
pub struct StateRegistrar<'a, K: Key> {
    backend: &'a mut HeapKeyedStateBackend<K>,
}

impl<'a, K: Key> StateRegistrar<'a, K> {
    pub fn new(backend: &'a mut HeapKeyedStateBackend<K>) -> Self {
        StateRegistrar { backend }
    }

    pub fn value<V: Data>(&mut self, name: &str) -> ValueState<V> {
        ValueState::new(self.backend.register::<V>(name))
    }

    pub fn map<UK: Key, UV: Data>(&mut self, name: &str) -> MapState<UK, UV> {
        MapState::new(self.backend.register::<rustc_hash::FxHashMap<UK, UV>>(name))
    }

    pub fn list<V: Data>(&mut self, name: &str) -> ListState<V> {
        ListState::new(self.backend.register::<Vec<V>>(name))
    }
}

/// The state of the current key, handed to a keyed function with each record.
pub struct KeyedContext<'a, K: Key> {
    backend: &'a mut HeapKeyedStateBackend<K>,
    key: &'a K,
    slot: KeySlot,
}

impl<'a, K: Key> KeyedContext<'a, K> {
    pub(crate) fn new(backend: &'a mut HeapKeyedStateBackend<K>, key: &'a K) -> Self {
        let slot = backend.locate(key);
        KeyedContext { backend, key, slot }
    }

    pub fn key(&self) -> &K {
        self.key
    }

    pub fn value<V: Data>(&mut self, state: &ValueState<V>) -> Entry<'_, K, V> {
        self.entry(state.id)
    }

    pub fn map<UK: Key, UV: Data>(
        &mut self,
        state: &MapState<UK, UV>,
    ) -> Entry<'_, K, rustc_hash::FxHashMap<UK, UV>> {
        self.entry(state.id)
    }

    pub fn list<V: Data>(&mut self, state: &ListState<V>) -> Entry<'_, K, Vec<V>> {
        self.entry(state.id)
    }

    fn entry<S: Data>(&mut self, id: usize) -> Entry<'_, K, S> {
        Entry {
            table: self.backend.group_mut::<S>(id, self.slot.group),
            key: self.key,
            hash: self.slot.hash,
        }
    }
}

/// One key's slot of one state.
pub struct Entry<'a, K: Key, S> {
    table: &'a mut GroupTable<K, S>,
    key: &'a K,
    hash: u64,
}

impl<K: Key, S: Data> Entry<'_, K, S> {
    pub fn get(&self) -> Option<&S> {
        self.table
            .find(self.hash, |(k, _)| k == self.key)
            .map(|(_, s)| s)
    }

    pub fn set(&mut self, value: S) {
        let key = self.key;
        match self.slot() {
            hash_table::Entry::Occupied(mut slot) => slot.get_mut().1 = value,
            hash_table::Entry::Vacant(slot) => {
                slot.insert((key.clone(), value));
            }
        }
    }

    pub fn clear(&mut self) -> Option<S> {
        let entry = self
            .table
            .find_entry(self.hash, |(k, _)| k == self.key)
            .ok()?;
        Some(entry.remove().0 .1)
    }

    /// The slot, created with `S::default()` if empty: one lookup for a
    /// read-modify-write, which is what counters and lists want.
    pub fn get_or_default(&mut self) -> &mut S
    where
        S: Default,
    {
        self.get_or_insert_with(S::default)
    }

    fn get_or_insert_with(&mut self, make: impl FnOnce() -> S) -> &mut S {
        let key = self.key;
        &mut self
            .slot()
            .or_insert_with(|| (key.clone(), make()))
            .into_mut()
            .1
    }

    fn slot(&mut self) -> hash_table::Entry<'_, (K, S)> {
        let key = self.key;
        self.table
            .entry(self.hash, |(k, _)| k == key, |(k, _)| table_hash(k))
    }
}

/// Read access to every key's state, for work that is not about one record:
/// emitting final results at the end of input.
pub struct AllKeys<'a, K: Key> {
    backend: &'a HeapKeyedStateBackend<K>,
}

impl<'a, K: Key> AllKeys<'a, K> {
    pub(crate) fn new(backend: &'a HeapKeyedStateBackend<K>) -> Self {
        AllKeys { backend }
    }

    pub fn values<V: Data>(&self, state: &ValueState<V>) -> impl Iterator<Item = (&'a K, &'a V)> {
        self.backend.entries(state.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SubtaskIndex;
    use crate::key_group::KeyGroupRange;

    #[test]
    fn states_are_per_key_and_typed() {
        let range = KeyGroupRange::for_subtask(128, 1, SubtaskIndex(0));
        let mut backend = HeapKeyedStateBackend::<String>::new(range, 128);
        let mut reg = StateRegistrar::new(&mut backend);
        let count = reg.value::<u64>("count");
        let seen = reg.list::<u32>("seen");
        let by_day = reg.map::<u8, u64>("by-day");
        for (key, n) in [("a", 1u32), ("b", 2), ("a", 3)] {
            let key = key.to_string();
            let mut ctx = KeyedContext::new(&mut backend, &key);
            *ctx.value(&count).get_or_default() += 1;
            ctx.list(&seen).get_or_default().push(n);
            *ctx.map(&by_day)
                .get_or_default()
                .entry(n as u8 % 2)
                .or_default() += 1;
        }
        let key = "a".to_string();
        let mut ctx = KeyedContext::new(&mut backend, &key);
        assert_eq!(ctx.value(&count).get(), Some(&2));
        assert_eq!(ctx.list(&seen).get(), Some(&vec![1, 3]));
        assert_eq!(ctx.map(&by_day).get().unwrap()[&1], 2);
        assert_eq!(ctx.value(&count).clear(), Some(2));
        let mut all: Vec<_> = AllKeys::new(&backend).values(&count).collect();
        all.sort();
        assert_eq!(all, [(&"b".to_string(), &1)]);
    }

    #[test]
    fn a_snapshot_restores_key_group_by_key_group_and_is_isolated_from_later_writes() {
        let range = KeyGroupRange::for_subtask(128, 1, SubtaskIndex(0));
        let mut backend = HeapKeyedStateBackend::<u64>::new(range, 128);
        let count = StateRegistrar::new(&mut backend).value::<u64>("count");
        for key in 0..1000u64 {
            *KeyedContext::new(&mut backend, &key)
                .value(&count)
                .get_or_default() += key;
        }
        let snapshot = backend.snapshot();
        // Writes after the synchronous part do not reach the snapshot.
        *KeyedContext::new(&mut backend, &7)
            .value(&count)
            .get_or_default() += 100;
        let mut bytes = Vec::new();
        let offsets = snapshot.write(&mut bytes);
        assert_eq!(offsets.len(), 128);

        // Restore into two subtasks of half the range each.
        for index in 0..2 {
            let half = KeyGroupRange::for_subtask(128, 2, SubtaskIndex(index));
            let mut restored = HeapKeyedStateBackend::<u64>::new(half, 128);
            let count = StateRegistrar::new(&mut restored).value::<u64>("count");
            for group in half.iter() {
                let start = offsets[group.0 as usize] as usize;
                let end = offsets
                    .get(group.0 as usize + 1)
                    .map_or(bytes.len(), |o| *o as usize);
                restored.restore_group(group, &bytes[start..end]).unwrap();
            }
            for (key, value) in AllKeys::new(&restored).values(&count) {
                assert_eq!(*value, *key, "key {key}");
                assert!(half.contains(crate::key_group::key_group_of(key, 128)));
            }
        }
        let mut other = HeapKeyedStateBackend::<u64>::new(
            KeyGroupRange::for_subtask(128, 2, SubtaskIndex(1)),
            128,
        );
        assert_eq!(
            other.restore_group(crate::ids::KeyGroup(0), &bytes),
            Err(StateError::ForeignKeyGroup(crate::ids::KeyGroup(0)))
        );
        StateRegistrar::new(&mut other).value::<u64>("other");
        let g = crate::ids::KeyGroup(127);
        let start = offsets[127] as usize;
        assert_eq!(
            other.restore_group(g, &bytes[start..]),
            Err(StateError::UnknownState("count".into()))
        );
    }

    #[test]
    #[should_panic(expected = "declared twice")]
    fn a_state_name_is_declared_once() {
        let range = KeyGroupRange::for_subtask(128, 1, SubtaskIndex(0));
        let mut backend = HeapKeyedStateBackend::<u64>::new(range, 128);
        let mut reg = StateRegistrar::new(&mut backend);
        reg.value::<u64>("count");
        reg.value::<u64>("count");
    }
}
