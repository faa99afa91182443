//! Heap backend: typed hash maps, one per key group and state, so that a
//! snapshot or a rescale works key group by key group without touching the
//! others.

use super::Key;
use crate::batch::Data;
use crate::ids::KeyGroup;
use crate::key_group::{key_group_of, KeyGroupRange};
use rustc_hash::FxHashMap;
use std::any::Any;

trait StateTable: Send {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

struct Table<K, S> {
    groups: Vec<FxHashMap<K, S>>,
}

impl<K: Key, S: Data> StateTable for Table<K, S> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
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

    /// Offset of the key's group in this backend's range. A key outside the
    /// range was routed to the wrong subtask: that is a bug, not bad input.
    pub fn group_offset(&self, key: &K) -> usize {
        let group: KeyGroup = key_group_of(key, self.max_parallelism);
        assert!(
            self.range.contains(group),
            "key {key:?} of {group} reached a subtask owning {:?}",
            self.range
        );
        self.range.offset(group)
    }

    pub(super) fn register<S: Data>(&mut self, name: &str) -> usize {
        assert!(
            !self.names.iter().any(|n| n == name),
            "keyed state {name:?} declared twice"
        );
        self.names.push(name.to_owned());
        self.tables.push(Box::new(Table::<K, S> {
            groups: (0..self.range.len()).map(|_| FxHashMap::default()).collect(),
        }));
        self.tables.len() - 1
    }

    fn table<S: Data>(&self, id: usize) -> &Table<K, S> {
        self.tables[id]
            .as_any()
            .downcast_ref()
            .expect("a state handle is only used with the backend that issued it")
    }

    pub(super) fn group_mut<S: Data>(&mut self, id: usize, group: usize) -> &mut FxHashMap<K, S> {
        let table: &mut Table<K, S> = self.tables[id]
            .as_any_mut()
            .downcast_mut()
            .expect("a state handle is only used with the backend that issued it");
        &mut table.groups[group]
    }

    /// Every (key, value) of a state, key group by key group.
    pub(super) fn entries<S: Data>(&self, id: usize) -> impl Iterator<Item = (&K, &S)> {
        self.table::<S>(id).groups.iter().flatten()
    }
}
