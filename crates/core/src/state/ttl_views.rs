//! One key's list or map of a state with TTL, whose elements (entries)
//! expire one by one, as Flink's TTL list and map states: the views
//! [`KeyedContext::ttl_list`](super::KeyedContext::ttl_list) and
//! [`ttl_map`](super::KeyedContext::ttl_map) give. Unlike the plain list
//! and map, they do not lend the whole collection: each element carries its
//! timestamp.

use super::ttl::{Expiring, StateTtlConfig, TtlValue};
use super::{Key, Slot};
use crate::model::batch::Data;
use crate::time::Millis;
use rustc_hash::FxHashMap;

/// Drops the expired parts of the value in `slot` (all of it if nothing is
/// left), unless the state returns expired values: what reading a key of a
/// state with TTL does first.
fn expire<K: Key, T: Expiring>(slot: &mut Slot<'_, K, T>, config: StateTtlConfig, now: Millis) {
    let oldest = slot
        .get()
        .and_then(|value| value.span())
        .map(|(_, oldest)| oldest);
    if config.returns_expired() || !oldest.is_some_and(|at| config.expired(at, now)) {
        return;
    }
    slot.update(
        |value| value.retain_live(|at| config.expired(at, now)),
        |value| value.span().is_some(),
    );
}

/// The current key's list of a [`TtlListState`](super::TtlListState).
pub struct TtlList<'a, K: Key, V> {
    slot: Slot<'a, K, Vec<TtlValue<V>>>,
    config: StateTtlConfig,
    now: Millis,
}

impl<'a, K: Key, V: Data> TtlList<'a, K, V> {
    pub(super) fn new(
        mut slot: Slot<'a, K, Vec<TtlValue<V>>>,
        config: StateTtlConfig,
        now: Millis,
    ) -> Self {
        expire(&mut slot, config, now);
        TtlList { slot, config, now }
    }

    /// The elements, oldest first (renewed, if the state renews on read).
    pub fn get(&mut self) -> impl Iterator<Item = &V> {
        if self.config.renews_on_read() {
            for element in self.slot.get_mut().into_iter().flatten() {
                element.at = self.now;
            }
        }
        self.slot.get().into_iter().flatten().map(|t| &t.value)
    }

    /// Appends `value`.
    pub fn add(&mut self, value: V) {
        self.slot
            .get_or_insert_with(Vec::new)
            .push(TtlValue::new(value, self.now));
    }

    /// Replaces the elements with `values`, all stamped now.
    pub fn update(&mut self, values: Vec<V>) {
        if values.is_empty() {
            self.slot.clear();
        } else {
            self.slot.set(Expiring::stamp(values, self.now));
        }
    }

    /// Removes the list.
    pub fn clear(&mut self) {
        self.slot.clear();
    }
}

/// The current key's map of a [`TtlMapState`](super::TtlMapState).
pub struct TtlMap<'a, K: Key, UK, UV> {
    slot: Slot<'a, K, FxHashMap<UK, TtlValue<UV>>>,
    config: StateTtlConfig,
    now: Millis,
}

impl<'a, K: Key, UK: Key, UV: Data> TtlMap<'a, K, UK, UV> {
    pub(super) fn new(
        mut slot: Slot<'a, K, FxHashMap<UK, TtlValue<UV>>>,
        config: StateTtlConfig,
        now: Millis,
    ) -> Self {
        expire(&mut slot, config, now);
        TtlMap { slot, config, now }
    }

    /// The value of `key` (renewed, if the state renews on read).
    pub fn get(&mut self, key: &UK) -> Option<&UV> {
        if self.config.renews_on_read() {
            let entry = self.slot.get_mut()?.get_mut(key)?;
            entry.at = self.now;
            return Some(&entry.value);
        }
        self.slot.get()?.get(key).map(|t| &t.value)
    }

    /// Whether `key` has a value; renews nothing.
    pub fn contains(&self, key: &UK) -> bool {
        self.slot.get().is_some_and(|map| map.contains_key(key))
    }

    /// Sets the value of `key`; returns the one it replaces.
    pub fn put(&mut self, key: UK, value: UV) -> Option<UV> {
        self.slot
            .get_or_insert_with(FxHashMap::default)
            .insert(key, TtlValue::new(value, self.now))
            .map(|t| t.value)
    }

    /// Removes the value of `key`, and the map if it was the last.
    pub fn remove(&mut self, key: &UK) -> Option<UV> {
        if !self.contains(key) {
            return None;
        }
        self.slot
            .update(|map| map.remove(key), |map| !map.is_empty())
            .flatten()
            .map(|t| t.value)
    }

    /// Every entry, in no order (renewed, if the state renews on read).
    pub fn iter(&mut self) -> impl Iterator<Item = (&UK, &UV)> {
        if self.config.renews_on_read() {
            for entry in self.slot.get_mut().into_iter().flat_map(|m| m.values_mut()) {
                entry.at = self.now;
            }
        }
        self.slot
            .get()
            .into_iter()
            .flatten()
            .map(|(k, t)| (k, &t.value))
    }

    /// Removes the map.
    pub fn clear(&mut self) {
        self.slot.clear();
    }
}
