//! Broadcast state, as in Flink's broadcast state pattern: maps that every
//! subtask of an operator holds alike, because only the records of its
//! broadcast input write them and those reach every subtask in the same
//! order; the operator's other input only reads them. Each subtask
//! checkpoints its copy as operator state, and a restore at another
//! parallelism gives every new subtask one of the equal copies (Flink's
//! union redistribution, `checkpoint::restore`).

use super::{entry_of, AllKeys, Entry, Key, KeyedStateBackend, ListState, MapState, ReducingState};
use super::{StateError, ValueState};
use crate::checkpoint::entries::{broadcast_entry, broadcast_state_of};
use crate::model::batch::Data;
use rustc_hash::FxHashMap;
use std::any::Any;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

/// Names a broadcast state and the types of its map (Flink's
/// `MapStateDescriptor`): passed to `Stream::broadcast_with` to declare
/// the state, and to the contexts of the functions to reach it. The name
/// matches the state in a snapshot, so it must be stable across versions
/// of the job.
pub struct MapStateDescriptor<UK, UV> {
    name: Arc<str>,
    _types: PhantomData<fn() -> (UK, UV)>,
}

impl<UK, UV> Clone for MapStateDescriptor<UK, UV> {
    fn clone(&self) -> Self {
        MapStateDescriptor {
            name: self.name.clone(),
            _types: PhantomData,
        }
    }
}

impl<UK: Key, UV: Data> MapStateDescriptor<UK, UV> {
    /// The descriptor of broadcast state `name`.
    pub fn new(name: &str) -> Self {
        MapStateDescriptor {
            name: name.into(),
            _types: PhantomData,
        }
    }

    /// The state's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The declaration an operator's subtasks create the state from.
    pub(crate) fn declare(&self) -> BroadcastDeclaration {
        BroadcastDeclaration {
            name: self.name.clone(),
            create: || Box::new(Typed::<UK, UV>(FxHashMap::default())),
        }
    }
}

/// A broadcast state as the job builder carries it: its name, and how a
/// subtask creates its empty map.
#[derive(Clone)]
pub struct BroadcastDeclaration {
    name: Arc<str>,
    create: fn() -> Box<dyn ErasedMap>,
}

/// One broadcast state's map behind its name, whatever its types.
trait ErasedMap: Send {
    fn encode(&self) -> Result<Vec<u8>, String>;
    fn decode(&mut self, bytes: &[u8]) -> Result<(), String>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

struct Typed<UK, UV>(FxHashMap<UK, UV>);

impl<UK: Key, UV: Data> ErasedMap for Typed<UK, UV> {
    fn encode(&self) -> Result<Vec<u8>, String> {
        rmp_serde::to_vec(&self.0).map_err(|e| e.to_string())
    }

    fn decode(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.0 = rmp_serde::from_slice(bytes).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        &self.0
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        &mut self.0
    }
}

/// The broadcast states of one subtask of an operator.
#[derive(Default)]
pub struct BroadcastStates {
    states: Vec<(Arc<str>, Box<dyn ErasedMap>)>,
}

impl BroadcastStates {
    /// Empty maps for `declared`.
    pub fn new(declared: &[BroadcastDeclaration]) -> Self {
        BroadcastStates {
            states: declared
                .iter()
                .map(|d| (d.name.clone(), (d.create)()))
                .collect(),
        }
    }

    fn find(&self, name: &str) -> usize {
        self.states
            .iter()
            .position(|(n, _)| &**n == name)
            .unwrap_or_else(|| {
                panic!("broadcast state {name:?} was not declared: pass its descriptor to broadcast_with")
            })
    }

    /// The map of `state`.
    pub fn get<UK: Key, UV: Data>(&self, state: &MapStateDescriptor<UK, UV>) -> &FxHashMap<UK, UV> {
        let map = self.states[self.find(&state.name)].1.as_any();
        map.downcast_ref().unwrap_or_else(|| mistyped(&state.name))
    }

    /// The map of `state`, to change: only the broadcast input may, so
    /// that every subtask's copy stays the same.
    pub fn get_mut<UK: Key, UV: Data>(
        &mut self,
        state: &MapStateDescriptor<UK, UV>,
    ) -> &mut FxHashMap<UK, UV> {
        let at = self.find(&state.name);
        let map = self.states[at].1.as_any_mut();
        map.downcast_mut().unwrap_or_else(|| mistyped(&state.name))
    }

    /// Writes every state into `operator`, the subtask's operator state.
    pub fn snapshot(&self, operator: &mut BTreeMap<String, Vec<u8>>) -> Result<(), StateError> {
        for (name, map) in &self.states {
            let bytes = map.encode().map_err(|e| {
                StateError::Decode(format!("cannot encode broadcast state {name:?}: {e}"))
            })?;
            operator.insert(broadcast_entry(name), bytes);
        }
        Ok(())
    }

    /// Loads the states `operator` holds; a state it lacks stays empty
    /// (the job declared it since), one it holds that was not declared is
    /// refused, as for keyed state.
    pub fn restore(&mut self, operator: &BTreeMap<String, Vec<u8>>) -> Result<(), StateError> {
        let held = operator
            .iter()
            .filter_map(|(entry, bytes)| Some((broadcast_state_of(entry)?, bytes)));
        for (name, bytes) in held {
            let (_, map) = self
                .states
                .iter_mut()
                .find(|(n, _)| &**n == name)
                .ok_or_else(|| StateError::UnknownState(format!("broadcast state {name}")))?;
            map.decode(bytes).map_err(|e| {
                StateError::Decode(format!("broadcast state {name:?} does not decode: {e}"))
            })?;
        }
        Ok(())
    }
}

fn mistyped(name: &str) -> ! {
    panic!("broadcast state {name:?} was declared with other types than its descriptor's")
}

/// A keyed state of any kind, as [`BroadcastContext::apply_to_keyed_state`]
/// takes it: the value it holds per key.
pub trait KeyedState: super::sealed::Sealed {
    /// What one key holds.
    type Value: Data;
    #[doc(hidden)]
    fn id(&self) -> usize;
}

impl<V: Data> KeyedState for ValueState<V> {
    type Value = V;
    fn id(&self) -> usize {
        self.id
    }
}

impl<V: Data, R> KeyedState for ReducingState<V, R> {
    type Value = V;
    fn id(&self) -> usize {
        self.id
    }
}

impl<UK: Key, UV: Data> KeyedState for MapState<UK, UV> {
    type Value = FxHashMap<UK, UV>;
    fn id(&self) -> usize {
        self.id
    }
}

impl<V: Data> KeyedState for ListState<V> {
    type Value = Vec<V>;
    fn id(&self) -> usize {
        self.id
    }
}

/// What a keyed broadcast function sees of a record of the broadcast
/// input: the broadcast state to change, and the keyed state of every key
/// of the subtask (Flink's `KeyedBroadcastProcessFunction.Context`).
pub struct BroadcastContext<'a, K: Key> {
    backend: &'a mut KeyedStateBackend<K>,
    broadcast: &'a mut BroadcastStates,
}

impl<'a, K: Key> BroadcastContext<'a, K> {
    pub(crate) fn new(
        backend: &'a mut KeyedStateBackend<K>,
        broadcast: &'a mut BroadcastStates,
    ) -> Self {
        BroadcastContext { backend, broadcast }
    }

    /// The map of broadcast state `state`.
    pub fn broadcast_state<UK: Key, UV: Data>(
        &self,
        state: &MapStateDescriptor<UK, UV>,
    ) -> &FxHashMap<UK, UV> {
        self.broadcast.get(state)
    }

    /// The map of broadcast state `state`, to change. Every subtask gets
    /// every broadcast record, in the same order, and must change its copy
    /// alike: depend on nothing but the record and the state.
    pub fn broadcast_state_mut<UK: Key, UV: Data>(
        &mut self,
        state: &MapStateDescriptor<UK, UV>,
    ) -> &mut FxHashMap<UK, UV> {
        self.broadcast.get_mut(state)
    }

    /// Calls `f` with every key of this subtask that has a value in
    /// `state`, and that value's entry to read, change or clear (Flink's
    /// `applyToKeyedState`).
    pub fn apply_to_keyed_state<S: KeyedState>(
        &mut self,
        state: &S,
        mut f: impl FnMut(&K, &mut Entry<'_, K, S::Value>),
    ) {
        if let Err(e) = self.backend.flush() {
            panic!("writing back the keyed state before reading every key: {e}");
        }
        let keys = AllKeys::new(self.backend).keys::<S::Value>(state.id());
        for key in keys {
            let slot = self.backend.locate(&key);
            f(&key, &mut entry_of(self.backend, &key, slot, state.id()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{KeyedContext, StateBackend};
    use crate::testkit::state::{heap, whole, MAX_P};

    fn rules() -> MapStateDescriptor<u64, String> {
        MapStateDescriptor::new("rules")
    }

    #[test]
    fn a_snapshot_restores_every_state_into_a_new_subtask() {
        let limits = MapStateDescriptor::<String, u64>::new("limits");
        let declared = [rules().declare(), limits.declare()];
        let mut states = BroadcastStates::new(&declared);
        states.get_mut(&rules()).insert(7, "seven".into());
        states.get_mut(&limits).insert("a".into(), 1);
        let mut operator = BTreeMap::from([("sink".to_owned(), vec![1])]);
        states.snapshot(&mut operator).unwrap();
        assert!(operator.contains_key("broadcast-state/rules"));

        let mut restored = BroadcastStates::new(&declared);
        restored.restore(&operator).unwrap();
        assert_eq!(restored.get(&rules()), states.get(&rules()));
        assert_eq!(restored.get(&limits)[&"a".to_owned()], 1);
    }

    #[test]
    fn a_state_the_job_no_longer_declares_or_that_does_not_decode_is_refused() {
        let mut states = BroadcastStates::new(&[rules().declare()]);
        let mut operator = BTreeMap::new();
        states.snapshot(&mut operator).unwrap();
        let mut other = BroadcastStates::new(&[MapStateDescriptor::<u64, u64>::new("x").declare()]);
        assert_eq!(
            other.restore(&operator),
            Err(StateError::UnknownState("broadcast state rules".into()))
        );
        operator.insert(broadcast_entry("rules"), vec![0xc1]);
        let refused = states.restore(&operator).unwrap_err().to_string();
        assert!(refused.contains("broadcast state \"rules\""), "{refused}");
    }

    /// Counts 0..100 of keys 0..100, then clears the even keys' through
    /// [`BroadcastContext::apply_to_keyed_state`]: it must have visited
    /// every key.
    fn apply_to_every_key(mut backend: KeyedStateBackend<u64>) {
        let count = crate::state::StateRegistrar::new(&mut backend).value::<u64>("count");
        for key in 0..100 {
            KeyedContext::new(&mut backend, &key).value(&count).set(key);
        }
        let mut broadcast = BroadcastStates::new(&[rules().declare()]);
        let mut ctx = BroadcastContext::new(&mut backend, &mut broadcast);
        let mut seen = Vec::new();
        ctx.apply_to_keyed_state(&count, |&key, value| {
            assert_eq!(value.get(), Some(&key));
            seen.push(key);
            if key % 2 == 0 {
                value.clear();
            }
        });
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        let left: Vec<u64> = (0..100)
            .filter(|k| {
                KeyedContext::new(&mut backend, k)
                    .value(&count)
                    .get()
                    .is_some()
            })
            .collect();
        assert_eq!(left, (1..100).step_by(2).collect::<Vec<_>>());
    }

    #[test]
    fn apply_to_keyed_state_reaches_every_key_on_both_backends() {
        apply_to_every_key(heap(whole()));
        let dir = tempfile::tempdir().unwrap();
        let embedded = StateBackend::Embedded {
            store: Arc::new(crate::testkit::store::MemoryStore::new(dir.path())),
            // Most values are in the store, not the cache.
            cache_entries: 3,
        };
        apply_to_every_key(KeyedStateBackend::new(&embedded, "op-1-0", whole(), MAX_P));
    }
}
