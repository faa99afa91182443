//! Heap backend: typed hash tables, one per key group and state, so that a
//! snapshot or a rescale works key group by key group without touching the
//! others. Tables are addressed by the key's hash, computed once per record.

use super::Key;
use crate::batch::Data;
use crate::key_group::{key_group_for_hash, key_hash, KeyGroupRange};
use hashbrown::HashTable;
use std::any::Any;

/// Slots of one state in one key group.
pub(super) type GroupTable<K, S> = HashTable<(K, S)>;

trait StateTable: Send {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

struct Table<K, S> {
    groups: Vec<GroupTable<K, S>>,
}

impl<K: Key, S: Data> StateTable for Table<K, S> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Where a key lives: its hash in the group table and the offset of its key
/// group in the range.
#[derive(Clone, Copy, Debug)]
pub struct KeySlot {
    pub hash: u64,
    pub group: usize,
}

/// The table hash of a key. The key group is taken from the low bits of the
/// key hash, so within one group those bits are alike; the tables index by
/// low bits too, so they get the halves swapped.
pub(super) fn table_hash<K: Key>(key: &K) -> u64 {
    key_hash(key).rotate_left(32)
}

pub struct HeapKeyedStateBackend<K: Key> {
    range: KeyGroupRange,
    max_parallelism: u32,
    names: Vec<String>,
    tables: Vec<Box<dyn StateTable>>,
    _key: std::marker::PhantomData<fn() -> K>,
}

impl<K: Key> HeapKeyedStateBackend<K> {
    pub fn new(range: KeyGroupRange, max_parallelism: u32) -> Self {
        HeapKeyedStateBackend {
            range,
            max_parallelism,
            names: Vec::new(),
            tables: Vec::new(),
            _key: std::marker::PhantomData,
        }
    }

    pub fn key_groups(&self) -> KeyGroupRange {
        self.range
    }

    /// A key outside this backend's key groups was routed to the wrong
    /// subtask: that is a bug, not bad input.
    pub fn locate(&self, key: &K) -> KeySlot {
        let hash = key_hash(key);
        let group = key_group_for_hash(hash, self.max_parallelism);
        assert!(
            self.range.contains(group),
            "key {key:?} of {group} reached a subtask owning {:?}",
            self.range
        );
        KeySlot {
            hash: hash.rotate_left(32),
            group: self.range.offset(group),
        }
    }

    pub(super) fn register<S: Data>(&mut self, name: &str) -> usize {
        assert!(
            !self.names.iter().any(|n| n == name),
            "keyed state {name:?} declared twice"
        );
        self.names.push(name.to_owned());
        self.tables.push(Box::new(Table::<K, S> {
            groups: (0..self.range.len()).map(|_| HashTable::new()).collect(),
        }));
        self.tables.len() - 1
    }

    fn table<S: Data>(&self, id: usize) -> &Table<K, S> {
        self.tables[id]
            .as_any()
            .downcast_ref()
            .expect("a state handle is only used with the backend that issued it")
    }

    pub(super) fn group_mut<S: Data>(&mut self, id: usize, group: usize) -> &mut GroupTable<K, S> {
        let table: &mut Table<K, S> = self.tables[id]
            .as_any_mut()
            .downcast_mut()
            .expect("a state handle is only used with the backend that issued it");
        &mut table.groups[group]
    }

    /// Every (key, value) of a state, key group by key group.
    pub(super) fn entries<S: Data>(&self, id: usize) -> impl Iterator<Item = (&K, &S)> {
        self.table::<S>(id)
            .groups
            .iter()
            .flat_map(|g| g.iter().map(|(k, s)| (k, s)))
    }
}
