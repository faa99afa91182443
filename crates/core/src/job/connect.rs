//! Two-input operators: two streams connected into one operator that reads
//! each as one of its inputs, keyed alike on both sides or not keyed.

use super::broadcast::{
    BroadcastConnectedStreams, BroadcastStream, KeyedBroadcastConnectedStreams,
};
use super::join::{IntervalJoin, JoinFunction};
use super::stream::{hash_route, owned, plain_route, KeyOf, Stream};
use super::KeyedStream;
use crate::dataflow::operator::{Collector, Stateless};
use crate::dataflow::task::{decoder, Decoder, TaskContext};
use crate::dataflow::two_input::{
    CoProcessFunction, Either, KeyedCoProcessFunction, Sides as Dispatch,
};
use crate::model::batch::Data;
use crate::model::graph::Partitioner;
use crate::state::{Key, StateRegistrar};
use crate::time::Timestamped;
use std::sync::Arc;
use std::time::Duration;

/// Two streams waiting for the function that reads both.
pub struct ConnectedStreams<L, R> {
    left: Stream<L>,
    right: Stream<R>,
}

/// What a stream of type `Left` connects with into a two-input operator:
/// another stream of its kind (both keyed alike, or neither keyed), or a
/// [`BroadcastStream`].
pub trait Connectable<Left> {
    /// The two streams, waiting for the function that reads both.
    type Connected;

    /// `left` connected with this stream.
    fn connected_to(self, left: Left) -> Self::Connected;
}

impl<L: Data, R: Data> Connectable<Stream<L>> for Stream<R> {
    type Connected = ConnectedStreams<L, R>;
    fn connected_to(self, left: Stream<L>) -> Self::Connected {
        ConnectedStreams { left, right: self }
    }
}

impl<K: Key, L: Data, R: Data> Connectable<KeyedStream<K, L>> for KeyedStream<K, R> {
    type Connected = KeyedConnectedStreams<K, L, R>;
    fn connected_to(self, left: KeyedStream<K, L>) -> Self::Connected {
        KeyedConnectedStreams { left, right: self }
    }
}

impl<L: Data, R: Data> Connectable<Stream<L>> for BroadcastStream<R> {
    type Connected = BroadcastConnectedStreams<L, R>;
    fn connected_to(self, left: Stream<L>) -> Self::Connected {
        BroadcastConnectedStreams { left, right: self }
    }
}

impl<K: Key, L: Data, R: Data> Connectable<KeyedStream<K, L>> for BroadcastStream<R> {
    type Connected = KeyedBroadcastConnectedStreams<K, L, R>;
    fn connected_to(self, left: KeyedStream<K, L>) -> Self::Connected {
        KeyedBroadcastConnectedStreams { left, right: self }
    }
}

impl<L: Data> Stream<L> {
    /// Connects this stream (the left input) with `right` into a two-input
    /// operator: another stream that is not keyed, or a broadcast stream
    /// (`Stream::broadcast_with`).
    pub fn connect<C: Connectable<Self>>(self, right: C) -> C::Connected {
        right.connected_to(self)
    }
}

impl<L: Data, R: Data> ConnectedStreams<L, R> {
    /// Runs `function` over both inputs in a new operator, fed over
    /// forward edges where the parallelism allows and rebalance otherwise.
    pub fn process<O, P>(self, name: &str, function: P) -> Stream<O>
    where
        O: Data,
        P: CoProcessFunction<L, R, O> + Clone + Sync + 'static,
    {
        let job = self.left.job.clone();
        let (op, out) = job.step_operator(name, sides::<L, R>(), move |_, next| {
            let mut f = function.clone();
            let dispatch = move |record, out: &mut Collector<'_, O>| match record {
                Either::Left(l) => f.process_left(l, out),
                Either::Right(r) => f.process_right(r, out),
            };
            Box::new(Stateless::new(dispatch, next))
        });
        job.connect_edges(&self.left.parts, op, 0, None, plain_route);
        job.connect_edges(&self.right.parts, op, 1, None, plain_route);
        out
    }
}

/// The decoders of a two-input operator's inputs, each record as the side
/// it came from.
pub(super) fn sides<L: Data, R: Data>() -> Vec<Decoder<Either<L, R>>> {
    vec![
        decoder::<L, _>(Either::Left),
        decoder::<R, _>(Either::Right),
    ]
}

/// Two streams keyed alike, waiting for the keyed function that reads both.
pub struct KeyedConnectedStreams<K, L, R> {
    left: KeyedStream<K, L>,
    right: KeyedStream<K, R>,
}

impl<K: Key, L: Data> KeyedStream<K, L> {
    /// Connects this keyed stream (the left input) with `right`: another
    /// stream keyed alike, both inputs then sharing each key's state and
    /// timers, or a broadcast stream (`Stream::broadcast_with`).
    pub fn connect<C: Connectable<Self>>(self, right: C) -> C::Connected {
        right.connected_to(self)
    }

    /// Joins this keyed stream (left) with `right` on equal keys and
    /// timestamps within an interval, set by
    /// [`between`](IntervalJoinBuilder::between).
    pub fn interval_join<R: Data>(self, right: KeyedStream<K, R>) -> IntervalJoinBuilder<K, L, R> {
        IntervalJoinBuilder {
            streams: self.connect(right),
            lower: 0,
            upper: 0,
        }
    }
}

impl<K: Key, L: Data, R: Data> KeyedConnectedStreams<K, L, R> {
    /// Runs a keyed two-input function in a new operator; `factory` builds
    /// each subtask's instance and declares its states.
    pub fn process<O, P, F>(self, name: &str, factory: F) -> Stream<O>
    where
        O: Data,
        P: KeyedCoProcessFunction<K, L, R, O> + 'static,
        F: Fn(&mut StateRegistrar<'_, K>) -> P + Send + Sync + 'static,
    {
        self.process_in_context(name, move |_, states| factory(states))
    }

    fn process_in_context<O, P, F>(self, name: &str, factory: F) -> Stream<O>
    where
        O: Data,
        P: KeyedCoProcessFunction<K, L, R, O> + 'static,
        F: Fn(&TaskContext, &mut StateRegistrar<'_, K>) -> P + Send + Sync + 'static,
    {
        let KeyedConnectedStreams { left, right } = self;
        let (key_left, key_right) = (left.key_of.clone(), right.key_of.clone());
        let key_of: KeyOf<Either<L, R>, K> = Arc::new(move |record| match record {
            Either::Left(l) => key_left(l),
            Either::Right(r) => key_right(r),
        });
        let (owner_left, owner_right) = (left.key_of.clone(), right.key_of.clone());
        let job = left.stream.job.clone();
        let (op, out) = job.keyed_operator(
            name,
            key_of,
            sides::<L, R>(),
            move |ctx| vec![owned(&owner_left, ctx), owned(&owner_right, ctx)],
            Arc::new(move |ctx, states| Box::new(Dispatch(factory(ctx, states)))),
            None,
        );
        let hash = Some(Partitioner::Hash);
        job.connect_edges(&left.stream.parts, op, 0, hash, hash_route(left.key_of));
        job.connect_edges(&right.stream.parts, op, 1, hash, hash_route(right.key_of));
        out
    }
}

/// An interval join waiting for its bounds and its join function.
pub struct IntervalJoinBuilder<K, L, R> {
    streams: KeyedConnectedStreams<K, L, R>,
    lower: i64,
    upper: i64,
}

/// Milliseconds of a duration, as a signed bound.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl<K: Key, L: Data + Timestamped, R: Data + Timestamped> IntervalJoinBuilder<K, L, R> {
    /// Pairs a left record at `t` with the right records of its key from
    /// `t - before` to `t + after`, bounds included (Flink's
    /// `between(-before, +after)`).
    pub fn between(mut self, before: Duration, after: Duration) -> Self {
        self.lower = -millis(before);
        self.upper = millis(after);
        self
    }

    /// Runs the join in a new operator; `join` emits what each pair yields.
    pub fn process<O, F>(self, name: &str, join: F) -> Stream<O>
    where
        O: Data,
        F: Fn(&L, &R, &mut Collector<'_, O>) + Send + Sync + 'static,
    {
        let (lower, upper) = (self.lower, self.upper);
        let join: JoinFunction<L, R, O> = Arc::new(join);
        self.streams.process_in_context(name, move |ctx, states| {
            IntervalJoin::open(states, lower, upper, join.clone(), ctx.time_metrics.clone())
        })
    }
}
