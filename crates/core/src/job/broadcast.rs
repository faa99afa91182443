//! Broadcast operators: a stream, keyed or not, connected with a broadcast
//! stream (Flink's broadcast state pattern). The broadcast stream's
//! records reach every subtask of the operator and write its broadcast
//! state; the other stream's records read it.

use super::connect::sides;
use super::stream::{hash_route, owned, plain_route, BroadcastInput, KeyOf, Stream};
use super::KeyedStream;
use crate::dataflow::broadcast::{
    is_broadcast, BroadcastProcess, BroadcastProcessFunction, KeyedBroadcastProcessFunction,
    KeyedSides,
};
use crate::dataflow::task::retain;
use crate::dataflow::two_input::Either;
use crate::model::batch::Data;
use crate::model::graph::Partitioner;
use crate::state::broadcast::BroadcastDeclaration;
use crate::state::{BroadcastStates, Key, MapStateDescriptor, StateRegistrar};
use std::sync::Arc;

/// A stream whose records go to every subtask of the operator it is
/// connected to, with the broadcast states they write (Flink's
/// `BroadcastStream`).
pub struct BroadcastStream<R> {
    stream: Stream<R>,
    declared: Vec<BroadcastDeclaration>,
}

impl<R: Data> Stream<R> {
    /// This stream as the broadcast input of an operator that holds
    /// broadcast state `state` (Flink's `broadcast(descriptor)`); connect
    /// a stream with it.
    pub fn broadcast_with<UK: Key, UV: Data>(
        self,
        state: &MapStateDescriptor<UK, UV>,
    ) -> BroadcastStream<R> {
        BroadcastStream {
            stream: self,
            declared: vec![state.declare()],
        }
    }
}

impl<R: Data> BroadcastStream<R> {
    /// Declares one more broadcast state.
    pub fn and<UK: Key, UV: Data>(mut self, state: &MapStateDescriptor<UK, UV>) -> Self {
        self.declared.push(state.declare());
        self
    }
}

/// A stream connected with a broadcast stream, waiting for the function
/// that reads both.
pub struct BroadcastConnectedStreams<L, R> {
    pub(super) left: Stream<L>,
    pub(super) right: BroadcastStream<R>,
}

/// A keyed stream connected with a broadcast stream, waiting for the keyed
/// function that reads both.
pub struct KeyedBroadcastConnectedStreams<K, L, R> {
    pub(super) left: KeyedStream<K, L>,
    pub(super) right: BroadcastStream<R>,
}

impl<L: Data, R: Data> BroadcastConnectedStreams<L, R> {
    /// Runs `function` over both inputs in a new operator; the first input
    /// is fed over forward edges where the parallelism allows and
    /// rebalance otherwise.
    pub fn process<O, P>(self, name: &str, function: P) -> Stream<O>
    where
        O: Data,
        P: BroadcastProcessFunction<L, R, O> + Clone + Sync + 'static,
    {
        let BroadcastConnectedStreams { left, right } = self;
        let job = left.job.clone();
        let declared = right.declared;
        let (op, out) = job.step_operator(name, sides::<L, R>(), move |_, next| {
            let states = BroadcastStates::new(&declared);
            Box::new(BroadcastProcess::new(function.clone(), states, next))
        });
        job.connect_edges(&left.parts, op, 0, None, plain_route);
        let broadcast = Some(Partitioner::Broadcast);
        job.connect_edges(&right.stream.parts, op, 1, broadcast, plain_route);
        out
    }
}

impl<K: Key, L: Data, R: Data> KeyedBroadcastConnectedStreams<K, L, R> {
    /// Runs a keyed broadcast function in a new operator; `factory` builds
    /// each subtask's instance and declares its keyed states.
    pub fn process<O, P, F>(self, name: &str, factory: F) -> Stream<O>
    where
        O: Data,
        P: KeyedBroadcastProcessFunction<K, L, R, O> + 'static,
        F: Fn(&mut StateRegistrar<'_, K>) -> P + Send + Sync + 'static,
    {
        let KeyedBroadcastConnectedStreams { left, right } = self;
        let key_left = left.key_of.clone();
        let key_of: KeyOf<Either<L, R>, K> = Arc::new(move |record| match record {
            Either::Left(l) => key_left(l),
            Either::Right(_) => unreachable!("the broadcast input's records have no key"),
        });
        let owner = left.key_of.clone();
        let job = left.stream.job.clone();
        let (op, out) = job.keyed_operator(
            name,
            key_of,
            sides::<L, R>(),
            // Every subtask gets every broadcast record, a replayed one too.
            move |ctx| vec![owned(&owner, ctx), retain::<R>(|_| true)],
            Arc::new(move |_, states| Box::new(KeyedSides(factory(states)))),
            Some(BroadcastInput {
                declared: right.declared,
                keyless: is_broadcast::<L, R>,
            }),
        );
        let hash = Some(Partitioner::Hash);
        job.connect_edges(&left.stream.parts, op, 0, hash, hash_route(left.key_of));
        let broadcast = Some(Partitioner::Broadcast);
        job.connect_edges(&right.stream.parts, op, 1, broadcast, plain_route);
        out
    }
}
