//! Functions of broadcast operators (Flink's `BroadcastProcessFunction` and
//! `KeyedBroadcastProcessFunction`): a stream connected with a broadcast
//! stream, whose records reach every subtask and alone write the
//! operator's broadcast state (`state::broadcast`), which the records of
//! the other input read. Rules or configuration broadcast to every subtask
//! and applied to keyed records are the pattern.

use crate::dataflow::error::TaskError;
use crate::dataflow::operator::{Collector, Downstream, KeyedProcessFunction, Outgoing, Output};
use crate::dataflow::two_input::Either;
use crate::model::ids::CheckpointId;
use crate::state::snapshot::{RestoreState, TaskSnapshot};
use crate::state::timers::RestoredTimers;
use crate::state::{AllKeys, BroadcastContext, BroadcastStates, Key, KeyedContext};
use crate::time::Millis;

/// A function over a stream that is not keyed and a broadcast stream.
pub trait BroadcastProcessFunction<L, R, O>: Send {
    /// Handles a record of the non-broadcast input, which reads the
    /// broadcast state.
    fn process_element(
        &mut self,
        record: L,
        broadcast: &BroadcastStates,
        out: &mut Collector<'_, O>,
    );

    /// Handles a record of the broadcast input, which every subtask gets
    /// in the same order: it changes `broadcast` from the record and the
    /// state alone, so that every subtask's copy stays the same.
    fn process_broadcast_element(
        &mut self,
        record: R,
        broadcast: &mut BroadcastStates,
        out: &mut Collector<'_, O>,
    );
}

/// A function over a keyed stream and a broadcast stream.
pub trait KeyedBroadcastProcessFunction<K: Key, L, R, O>: Send {
    /// Handles a record of the keyed input; `ctx` holds its key's state and
    /// timers, and reads the broadcast state
    /// ([`KeyedContext::broadcast_state`]).
    fn process_element(
        &mut self,
        record: L,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    );

    /// Handles a record of the broadcast input: `ctx` changes the
    /// broadcast state (from the record and the state alone, as for
    /// [`BroadcastProcessFunction::process_broadcast_element`]) and
    /// reaches the keyed state of every key of the subtask.
    fn process_broadcast_element(
        &mut self,
        record: R,
        ctx: &mut BroadcastContext<'_, K>,
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

/// A keyed broadcast function as the keyed function of its `Either`
/// chain, whose right records are the broadcast input's.
pub(crate) struct KeyedSides<P>(pub(crate) P);

impl<K, L, R, O, P> KeyedProcessFunction<K, Either<L, R>, O> for KeyedSides<P>
where
    K: Key,
    P: KeyedBroadcastProcessFunction<K, L, R, O>,
{
    fn process(
        &mut self,
        record: Either<L, R>,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) {
        match record {
            Either::Left(record) => self.0.process_element(record, ctx, out),
            Either::Right(_) => unreachable!("a broadcast record was given a key"),
        }
    }

    fn process_broadcast(
        &mut self,
        record: Either<L, R>,
        ctx: &mut BroadcastContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) {
        match record {
            Either::Right(record) => self.0.process_broadcast_element(record, ctx, out),
            Either::Left(_) => unreachable!("a keyed record was taken for a broadcast one"),
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

/// Which records of a keyed broadcast operator are the broadcast input's.
pub(crate) fn is_broadcast<L, R>(record: &Either<L, R>) -> bool {
    matches!(record, Either::Right(_))
}

/// The step of a broadcast operator that is not keyed: its function, and
/// the broadcast states it snapshots and restores.
pub struct BroadcastProcess<P, O> {
    function: P,
    states: BroadcastStates,
    next: Output<O>,
}

impl<P, O> BroadcastProcess<P, O> {
    /// `function` with `states`, feeding `next`.
    pub fn new(function: P, states: BroadcastStates, next: Output<O>) -> Self {
        BroadcastProcess {
            function,
            states,
            next,
        }
    }
}

impl<L, R, O, P> Downstream<Either<L, R>> for BroadcastProcess<P, O>
where
    O: Send,
    P: BroadcastProcessFunction<L, R, O>,
{
    fn push(&mut self, record: Either<L, R>) {
        let out = &mut self.next.collector();
        match record {
            Either::Left(record) => self.function.process_element(record, &self.states, out),
            Either::Right(record) => {
                self.function
                    .process_broadcast_element(record, &mut self.states, out)
            }
        }
    }
}

impl<P: Send, O: Send> crate::dataflow::operator::Step for BroadcastProcess<P, O> {
    fn flush(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.next.flush(out)
    }

    fn end_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.next.end_input(out)
    }

    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
        out: &mut Outgoing,
        snapshot: &mut TaskSnapshot,
    ) -> Result<(), TaskError> {
        self.states.snapshot(&mut snapshot.operator)?;
        self.next.snapshot(checkpoint, out, snapshot)
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError> {
        self.next.notify_complete(checkpoint)
    }

    fn restore(&mut self, state: &RestoreState) -> Result<(), TaskError> {
        self.states.restore(&state.operator)?;
        self.next.restore(state)
    }

    fn advance_watermark(&mut self, watermark: u64, out: &mut Outgoing) -> Result<(), TaskError> {
        self.next.advance_watermark(watermark, out)
    }

    fn advance_processing_time(
        &mut self,
        now: Millis,
        out: &mut Outgoing,
    ) -> Result<Option<Millis>, TaskError> {
        self.next.advance_processing_time(now, out)
    }
}
