//! Functions of two-input operators (Flink's `CoProcessFunction` and
//! `KeyedCoProcessFunction`). A two-input chain takes its records as
//! [`Either`] side, so that the single-input machinery — keyed state,
//! timers, snapshots, restore — serves it unchanged: the keyed function over
//! `Either<L, R>` dispatches to `process_left` and `process_right`.

use crate::dataflow::operator::{Collector, KeyedProcessFunction};
use crate::state::timers::RestoredTimers;
use crate::state::{AllKeys, Key, KeyedContext};
use serde::{Deserialize, Serialize};

/// A record of a two-input operator, by the input it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Either<L, R> {
    /// From the first input.
    Left(L),
    /// From the second input.
    Right(R),
}

/// A function over two connected streams that are not keyed.
pub trait CoProcessFunction<L, R, O>: Send {
    /// Handles a record of the first input.
    fn process_left(&mut self, record: L, out: &mut Collector<'_, O>);

    /// Handles a record of the second input.
    fn process_right(&mut self, record: R, out: &mut Collector<'_, O>);
}

/// A function over two streams keyed alike: both inputs share the state
/// and the timers of each key.
pub trait KeyedCoProcessFunction<K: Key, L, R, O>: Send {
    /// Handles a record of the first input; `ctx` holds its key's state.
    fn process_left(
        &mut self,
        record: L,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    );

    /// Handles a record of the second input; `ctx` holds its key's state.
    fn process_right(
        &mut self,
        record: R,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    );

    /// A timer of the key of `ctx` fired at `timestamp`, as for
    /// [`KeyedProcessFunction::on_timer`].
    fn on_timer(
        &mut self,
        _timestamp: u64,
        _ctx: &mut KeyedContext<'_, K>,
        _out: &mut Collector<'_, O>,
    ) {
    }

    /// After a restore: the timers its restored state implies, as for
    /// [`KeyedProcessFunction::restore_timers`].
    fn restore_timers(&mut self, _states: AllKeys<'_, K>, _timers: &mut RestoredTimers<'_, K>) {}

    /// Both inputs ended: a function that holds results back emits them.
    fn end_input(&mut self, _states: AllKeys<'_, K>, _out: &mut Collector<'_, O>) {}
}

/// A keyed two-input function as the keyed function of its `Either` chain.
pub(crate) struct Sides<P>(pub(crate) P);

impl<K, L, R, O, P> KeyedProcessFunction<K, Either<L, R>, O> for Sides<P>
where
    K: Key,
    P: KeyedCoProcessFunction<K, L, R, O>,
{
    fn process(
        &mut self,
        record: Either<L, R>,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) {
        match record {
            Either::Left(record) => self.0.process_left(record, ctx, out),
            Either::Right(record) => self.0.process_right(record, ctx, out),
        }
    }

    fn on_timer(
        &mut self,
        timestamp: u64,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) {
        self.0.on_timer(timestamp, ctx, out)
    }

    fn restore_timers(&mut self, states: AllKeys<'_, K>, timers: &mut RestoredTimers<'_, K>) {
        self.0.restore_timers(states, timers)
    }

    fn end_input(&mut self, states: AllKeys<'_, K>, out: &mut Collector<'_, O>) {
        self.0.end_input(states, out)
    }
}
