//! Heap backend: typed hash tables, one per key group and state, so that a
//! snapshot or a rescale works key group by key group without touching the
//! others. Tables are addressed by the key's hash, computed once per record.

use super::{Key, StateError};
use crate::batch::Data;
use crate::ids::KeyGroup;
use crate::key_group::{key_hash, KeyGroupRange};
use crate::task::RestoreState;
use hashbrown::HashTable;
use std::any::Any;

/// Slots of one state in one key group.
pub(super) type GroupTable<K, S> = HashTable<(K, S)>;

trait StateTable: Send {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// The synchronous part of a snapshot: an owned copy, so that processing
    /// goes on while the copy is serialized elsewhere.
    fn copy(&self) -> Box<dyn TableCopy>;
    fn restore_group(&mut self, group: usize, input: &mut &[u8]) -> Result<(), StateError>;
}

/// A copied table, serialized key group by key group off the subtask.
trait TableCopy: Send {
    fn write_group(&self, group: usize, out: &mut Vec<u8>);
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
    fn copy(&self) -> Box<dyn TableCopy> {
        Box::new(Table {
            groups: self.groups.clone(),
        })
    }
    fn restore_group(&mut self, group: usize, input: &mut &[u8]) -> Result<(), StateError> {
        let entries: Vec<(K, S)> =
            rmp_serde::from_read(input).map_err(|e| StateError::Decode(e.to_string()))?;
        let table = &mut self.groups[group];
        for (key, value) in entries {
            let hash = table_hash(&key);
            table.insert_unique(hash, (key, value), |(k, _)| table_hash(k));
        }
        Ok(())
    }
}

impl<K: Key, S: Data> TableCopy for Table<K, S> {
    fn write_group(&self, group: usize, out: &mut Vec<u8>) {
        let entries: Vec<&(K, S)> = self.groups[group].iter().collect();
        rmp_serde::encode::write(out, &entries).expect("writing to a vector cannot fail");
    }
}

/// An owned copy of a backend's state, to serialize off the subtask.
pub struct HeapSnapshot {
    range: KeyGroupRange,
    names: Vec<String>,
    tables: Vec<Box<dyn TableCopy>>,
}

impl HeapSnapshot {
    /// The key groups it holds.
    pub fn key_groups(&self) -> KeyGroupRange {
        self.range
    }

    /// Key groups back to back; returns the offset of each in `out`. A key
    /// group holds, for every state, its name and its entries.
    pub fn write(&self, out: &mut Vec<u8>) -> Vec<u64> {
        let mut offsets = Vec::with_capacity(self.range.len());
        for group in 0..self.range.len() {
            offsets.push(out.len() as u64);
            rmp_serde::encode::write(out, &(self.names.len() as u32)).expect("in memory");
            for (name, table) in self.names.iter().zip(&self.tables) {
                rmp_serde::encode::write(out, name).expect("in memory");
                table.write_group(group, out);
            }
        }
        offsets
    }
}

/// Where a key lives: its hash in the group table and the offset of its key
/// group in the range.
#[derive(Clone, Copy, Debug)]
pub struct KeySlot {
    /// The key's table hash (its key hash with the halves swapped).
    pub hash: u64,
    /// Offset of its key group in the backend's range.
    pub group: usize,
}

/// The table hash of a key. The key group is taken from the low bits of the
/// key hash, so within one group those bits are alike; the tables index by
/// low bits too, so they get the halves swapped.
pub(super) fn table_hash<K: Key>(key: &K) -> u64 {
    key_hash(key).rotate_left(32)
}

/// Keyed state of one subtask on the heap: one table per state and key
/// group. Snapshots are full.
pub struct HeapKeyedStateBackend<K: Key> {
    range: KeyGroupRange,
    max_parallelism: u32,
    names: Vec<String>,
    tables: Vec<Box<dyn StateTable>>,
    _key: std::marker::PhantomData<fn() -> K>,
}

impl<K: Key> HeapKeyedStateBackend<K> {
    /// Empty state for the key groups `range` of `max_parallelism`.
    pub fn new(range: KeyGroupRange, max_parallelism: u32) -> Self {
        HeapKeyedStateBackend {
            range,
            max_parallelism,
            names: Vec::new(),
            tables: Vec::new(),
            _key: std::marker::PhantomData,
        }
    }

    /// The key groups it owns.
    pub fn key_groups(&self) -> KeyGroupRange {
        self.range
    }

    /// The operator's max parallelism.
    pub fn max_parallelism(&self) -> u32 {
        self.max_parallelism
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

    /// The synchronous part of a snapshot: an owned copy of every table.
    pub fn snapshot(&self) -> HeapSnapshot {
        HeapSnapshot {
            range: self.range,
            names: self.names.clone(),
            tables: self.tables.iter().map(|t| t.copy()).collect(),
        }
    }

    /// Loads the key groups of `state`. A native checkpoint cannot be read
    /// into the heap: it is refused rather than ignored.
    pub fn restore(&mut self, state: &RestoreState) -> Result<(), StateError> {
        if let Some(dir) = state.native.iter().chain(&state.imports).next() {
            return Err(StateError::NativeCheckpointOnHeap(dir.clone()));
        }
        for (group, bytes) in &state.key_groups {
            self.restore_group(*group, bytes)?;
        }
        Ok(())
    }

    /// Loads one key group as `HeapSnapshot::write` wrote it. States must
    /// have been declared (by opening the operator) first.
    pub fn restore_group(&mut self, group: KeyGroup, mut bytes: &[u8]) -> Result<(), StateError> {
        if !self.range.contains(group) {
            return Err(StateError::ForeignKeyGroup(group));
        }
        let offset = self.range.offset(group);
        let input = &mut bytes;
        let states: u32 =
            rmp_serde::from_read(&mut *input).map_err(|e| StateError::Decode(e.to_string()))?;
        for _ in 0..states {
            let name: String =
                rmp_serde::from_read(&mut *input).map_err(|e| StateError::Decode(e.to_string()))?;
            let id = self
                .names
                .iter()
                .position(|n| *n == name)
                .ok_or(StateError::UnknownState(name))?;
            self.tables[id].restore_group(offset, input)?;
        }
        Ok(())
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
