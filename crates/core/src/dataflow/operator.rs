//! Operator chains. A subtask runs a chain of operators as a push pipeline:
//! each operator hands its output to the next one, and the last one is either
//! a record writer (partitioning into output channels) or a sink. Only whole
//! batches cross channels; inside a chain records are passed one by one.

use crate::dataflow::due_reads::DueReads;
use crate::dataflow::error::TaskError;
use crate::dataflow::sink::Sink;
use crate::model::batch::{Batch, Data};
use crate::model::ids::{CheckpointId, KeyGroup};
use crate::model::key_group::subtask_for_key_group;
use crate::state::snapshot::{RestoreState, TaskSnapshot};
use crate::state::timers::{RestoredTimer, RestoredTimers, TimerService};
use crate::state::{
    AllKeys, BroadcastContext, BroadcastStates, Key, KeySlot, KeyedContext, KeyedStateBackend,
    StateRegistrar,
};
use crate::time::timers::{TimeDomain, TIMERS_STATE};
use crate::time::{Millis, TimeMetrics};
use std::sync::Arc;

/// The earlier of two optional timestamps.
pub(crate) fn earliest(a: Option<Millis>, b: Option<Millis>) -> Option<Millis> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Full batches ready to be sent, with the index of their output channel.
pub type Outgoing = Vec<(usize, Batch)>;

/// The rest of a chain, seen from the operator before it.
pub trait Downstream<T>: Step {
    /// Takes one record.
    fn push(&mut self, record: T);

    /// Takes every record of `records`, in order, leaving it empty. A keyed
    /// step looks all their keys up before its function sees the first, so
    /// that the cache misses of a large state overlap instead of queueing.
    fn push_all(&mut self, records: &mut Vec<T>) {
        for record in records.drain(..) {
            self.push(record);
        }
    }
}

/// What every step of a chain does besides taking records: the life cycle
/// the subtask drives it through. Kept apart from [`Downstream`] so that
/// branches of different record types (side outputs) are driven alike.
pub trait Step: Send {
    /// End of an input batch: write out what is buffered.
    fn flush(&mut self, out: &mut Outgoing) -> Result<(), TaskError>;

    /// No more input will come: emit what is held back, then flush.
    fn end_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError>;

    /// Synchronous part of a checkpoint: everything buffered before the
    /// barrier goes to `out`, state goes to `snapshot`.
    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
        out: &mut Outgoing,
        snapshot: &mut TaskSnapshot,
    ) -> Result<(), TaskError>;

    /// Checkpoint `checkpoint` completed (a sink commits).
    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError>;

    /// Before any input: load this step's part of the restored state.
    fn restore(&mut self, state: &RestoreState) -> Result<(), TaskError>;

    /// The watermark reached `watermark`: event-time timers up to it fire,
    /// and what they emit is written out before the watermark goes on (a
    /// keyed step fires them in turns, see [`timers_due`](Self::timers_due),
    /// and passes it on after the last). A step with a next step passes it
    /// on; the last step (the default) only flushes.
    fn advance_watermark(&mut self, _watermark: u64, out: &mut Outgoing) -> Result<(), TaskError> {
        self.flush(out)
    }

    /// Processing time is `now`: due processing-time timers fire. Returns
    /// the earliest processing-time timer left in the rest of the chain;
    /// as for [`advance_watermark`](Self::advance_watermark), the default
    /// is the last step's.
    fn advance_processing_time(
        &mut self,
        _now: Millis,
        out: &mut Outgoing,
    ) -> Result<Option<Millis>, TaskError> {
        self.flush(out)?;
        Ok(None)
    }

    /// An async operator's requests completed: take their results in. Only
    /// the head of a chain is asked; the default has nothing in flight.
    fn poll_async(&mut self, _out: &mut Outgoing) -> Result<(), TaskError> {
        Ok(())
    }

    /// The head is full: the subtask takes no more input until it polled.
    fn input_blocked(&self) -> bool {
        false
    }

    /// The head holds records whose results have not left: the end of
    /// input waits for them.
    fn in_flight(&self) -> bool {
        false
    }

    /// The head sends watermarks on itself, behind its results
    /// ([`take_watermarks`](Self::take_watermarks)), instead of the
    /// subtask sending each on as it comes.
    fn holds_watermarks(&self) -> bool {
        false
    }

    /// The head fires the event-time timers a watermark made due a turn at
    /// a time, and some have yet to: the subtask takes no input until they
    /// all fired (but checkpoint barriers and cancel markers with nothing
    /// ahead of them), and calls
    /// [`fire_due`](Self::fire_due) after yielding its thread, so that a
    /// barrier is not held up behind a watermark that makes millions due
    /// (Flink's interruptible timers).
    fn timers_due(&self) -> bool {
        false
    }

    /// Fires the next turn's share of the due timers; the watermark goes
    /// on ([`take_watermarks`](Self::take_watermarks)) after the last.
    fn fire_due(&mut self, _out: &mut Outgoing) -> Result<(), TaskError> {
        Ok(())
    }

    /// The watermarks the head let go since the last call.
    fn take_watermarks(&mut self, _watermarks: &mut Vec<u64>) {}
}

/// Hands a function's output to the rest of the chain, and to its side
/// outputs.
pub struct Collector<'a, T> {
    next: &'a mut dyn Downstream<T>,
    sides: &'a mut SideOutputs,
}

impl<T> Collector<'_, T> {
    /// Emits `record` to the next step, at once.
    pub fn collect(&mut self, record: T) {
        self.next.push(record);
    }

    /// Emits `record` to the side output `tag`; dropped if the job reads
    /// nothing from it (as in Flink).
    pub fn output<X: Send + 'static>(&mut self, tag: &OutputTag<X>, record: X) {
        self.sides.push(&tag.id, record);
    }
}

/// Names a side output and the type of its records, as Flink's
/// `OutputTag`: a function emits to it with [`Collector::output`], and
/// `Stream::side_output` reads it as a stream of its own.
pub struct OutputTag<X> {
    id: Arc<str>,
    records: std::marker::PhantomData<fn(X)>,
}

impl<X> OutputTag<X> {
    /// The tag named `id`; tags of one step need distinct names.
    pub fn new(id: &str) -> Self {
        OutputTag {
            id: id.into(),
            records: std::marker::PhantomData,
        }
    }

    /// Its name.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl<X> Clone for OutputTag<X> {
    fn clone(&self) -> Self {
        OutputTag {
            id: self.id.clone(),
            records: std::marker::PhantomData,
        }
    }
}

/// A side output record, on its way to the branch that reads its tag.
pub type SideRecord = Box<dyn std::any::Any + Send>;

/// The branches that read the side outputs of one step, by tag: each
/// takes its records boxed and unboxes them to its type, a cost only side
/// records pay.
#[derive(Default)]
pub struct SideOutputs {
    tags: Vec<Arc<str>>,
    branches: Vec<Box<dyn Downstream<SideRecord>>>,
}

impl SideOutputs {
    /// Adds the branch reading `tag`.
    pub fn add(&mut self, tag: Arc<str>, branch: Box<dyn Downstream<SideRecord>>) {
        self.tags.push(tag);
        self.branches.push(branch);
    }

    fn push<X: Send + 'static>(&mut self, tag: &str, record: X) {
        if let Some(i) = self.tags.iter().position(|t| &**t == tag) {
            self.branches[i].push(Box::new(record));
        }
    }
}

/// Where a step's function sends records: the rest of the chain, and the
/// branches reading its side outputs.
pub struct Output<O> {
    main: Box<dyn Downstream<O>>,
    sides: SideOutputs,
}

impl<O> Output<O> {
    /// Records go to `main`, side records to `sides`.
    pub fn new(main: Box<dyn Downstream<O>>, sides: SideOutputs) -> Self {
        Output { main, sides }
    }

    /// The collector a function call emits through.
    pub fn collector(&mut self) -> Collector<'_, O> {
        Collector {
            next: self.main.as_mut(),
            sides: &mut self.sides,
        }
    }
}

impl<O> From<Box<dyn Downstream<O>>> for Output<O> {
    fn from(main: Box<dyn Downstream<O>>) -> Self {
        Output::new(main, SideOutputs::default())
    }
}

impl<O: Send> Downstream<O> for Output<O> {
    fn push(&mut self, record: O) {
        self.main.push(record)
    }

    fn push_all(&mut self, records: &mut Vec<O>) {
        self.main.push_all(records)
    }
}

impl<O: Send> Step for Output<O> {
    fn flush(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.sides.branches.flush(out)?;
        self.main.flush(out)
    }

    fn end_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.sides.branches.end_input(out)?;
        self.main.end_input(out)
    }

    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
        out: &mut Outgoing,
        snapshot: &mut TaskSnapshot,
    ) -> Result<(), TaskError> {
        self.sides.branches.snapshot(checkpoint, out, snapshot)?;
        self.main.snapshot(checkpoint, out, snapshot)
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError> {
        self.sides.branches.notify_complete(checkpoint)?;
        self.main.notify_complete(checkpoint)
    }

    fn restore(&mut self, state: &RestoreState) -> Result<(), TaskError> {
        self.sides.branches.restore(state)?;
        self.main.restore(state)
    }

    fn advance_watermark(&mut self, watermark: u64, out: &mut Outgoing) -> Result<(), TaskError> {
        self.sides.branches.advance_watermark(watermark, out)?;
        self.main.advance_watermark(watermark, out)
    }

    fn advance_processing_time(
        &mut self,
        now: Millis,
        out: &mut Outgoing,
    ) -> Result<Option<Millis>, TaskError> {
        let sides = self.sides.branches.advance_processing_time(now, out)?;
        Ok(earliest(
            sides,
            self.main.advance_processing_time(now, out)?,
        ))
    }
}

/// Branches of a chain: a stream read by several consumers (fan-out), or
/// the side outputs of a step. Every branch goes through every step of
/// the life cycle.
impl<S: Step + ?Sized> Step for Vec<Box<S>> {
    fn flush(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.iter_mut().try_for_each(|b| b.flush(out))
    }

    fn end_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.iter_mut().try_for_each(|b| b.end_input(out))
    }

    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
        out: &mut Outgoing,
        snapshot: &mut TaskSnapshot,
    ) -> Result<(), TaskError> {
        self.iter_mut()
            .try_for_each(|b| b.snapshot(checkpoint, out, snapshot))
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError> {
        self.iter_mut()
            .try_for_each(|b| b.notify_complete(checkpoint))
    }

    fn restore(&mut self, state: &RestoreState) -> Result<(), TaskError> {
        self.iter_mut().try_for_each(|b| b.restore(state))
    }

    fn advance_watermark(&mut self, watermark: u64, out: &mut Outgoing) -> Result<(), TaskError> {
        self.iter_mut()
            .try_for_each(|b| b.advance_watermark(watermark, out))
    }

    fn advance_processing_time(
        &mut self,
        now: Millis,
        out: &mut Outgoing,
    ) -> Result<Option<Millis>, TaskError> {
        let mut next = None;
        for branch in self {
            next = earliest(next, branch.advance_processing_time(now, out)?);
        }
        Ok(next)
    }
}

/// A stream read by several consumers: each gets every record.
impl<T: Clone + Send> Downstream<T> for Vec<Box<dyn Downstream<T>>> {
    fn push(&mut self, record: T) {
        if let Some((last, others)) = self.split_last_mut() {
            for branch in others {
                branch.push(record.clone());
            }
            last.push(record);
        }
    }
}

/// A stateless step: map, filter and flat_map are all a function of one
/// record that collects zero or more outputs.
pub struct Stateless<F, O> {
    f: F,
    next: Output<O>,
}

impl<F, O> Stateless<F, O> {
    /// `f` feeding `next`.
    pub fn new(f: F, next: Output<O>) -> Self {
        Stateless { f, next }
    }
}

impl<I, O, F> Downstream<I> for Stateless<F, O>
where
    O: Send,
    F: FnMut(I, &mut Collector<'_, O>) + Send,
{
    fn push(&mut self, record: I) {
        (self.f)(record, &mut self.next.collector())
    }
}

impl<O, F> Step for Stateless<F, O>
where
    O: Send,
    F: Send,
{
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
        self.next.snapshot(checkpoint, out, snapshot)
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError> {
        self.next.notify_complete(checkpoint)
    }

    fn restore(&mut self, state: &RestoreState) -> Result<(), TaskError> {
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

/// A function over a keyed stream: sees one record at a time with the state
/// of its key.
pub trait KeyedProcessFunction<K: Key, I, O>: Send {
    /// Handles `record`; `ctx` holds the state of its key.
    fn process(&mut self, record: I, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>);

    /// A timer of the key of `ctx` fired at `timestamp`
    /// (`ctx.timer_domain()` says which clock); it is no longer set.
    fn on_timer(
        &mut self,
        _timestamp: u64,
        _ctx: &mut KeyedContext<'_, K>,
        _out: &mut Collector<'_, O>,
    ) {
    }

    /// After a restore: the timers its restored state implies (see
    /// [`KeyedContext::register_implied_timer`]), and keyed ones the
    /// snapshot lacks, named in `timers`.
    fn restore_timers(&mut self, _states: AllKeys<'_, K>, _timers: &mut RestoredTimers<'_, K>) {}

    /// End of input: a function that holds results back emits them here.
    fn end_input(&mut self, _states: AllKeys<'_, K>, _out: &mut Collector<'_, O>) {}

    /// Handles a record that has no key: one of the broadcast input of a
    /// keyed broadcast operator, whose function (a
    /// [`KeyedBroadcastProcessFunction`](crate::dataflow::broadcast::KeyedBroadcastProcessFunction))
    /// is the only one to get such records.
    fn process_broadcast(
        &mut self,
        _record: I,
        _ctx: &mut BroadcastContext<'_, K>,
        _out: &mut Collector<'_, O>,
    ) {
        unreachable!("a keyed function without a broadcast input got a broadcast record")
    }
}

impl<K, I, O, F> KeyedProcessFunction<K, I, O> for F
where
    K: Key,
    F: FnMut(I, &mut KeyedContext<'_, K>, &mut Collector<'_, O>) + Send,
{
    fn process(&mut self, record: I, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>) {
        self(record, ctx, out)
    }
}

/// Builds a subtask's instance of a keyed function, declaring its states.
pub type KeyedFunctionFactory<K, I, O> =
    Arc<dyn Fn(&mut StateRegistrar<'_, K>) -> Box<dyn KeyedProcessFunction<K, I, O>> + Send + Sync>;

/// A keyed step: runs a [`KeyedProcessFunction`] with the state and timers
/// of each record's key, kept in the subtask's keyed state backend, which it
/// snapshots and restores.
pub struct KeyedProcess<K: Key, I, O> {
    key_of: Arc<dyn Fn(&I) -> K + Send + Sync>,
    function: Box<dyn KeyedProcessFunction<K, I, O>>,
    states: KeyedStateBackend<K>,
    timers: TimerService<K>,
    metrics: Arc<TimeMetrics>,
    next: Output<O>,
    /// The keys of the batch being pushed, and where they live.
    keys: Vec<K>,
    slots: Vec<KeySlot>,
    /// The broadcast states of a keyed broadcast operator (none otherwise).
    broadcast: BroadcastStates,
    /// A keyed broadcast operator's test for the records of its broadcast
    /// input, which have no key.
    keyless: Option<fn(&I) -> bool>,
    /// The watermark whose event-time timers fire a turn at a time
    /// ([`Step::fire_due`]); it goes on once they all fired.
    firing_to: Option<u64>,
    /// The keys of a time taken out of the index and not all fired when
    /// the last turn ended.
    firing: Option<Firing<K>>,
    /// Watermarks whose timers all fired, for the subtask to send on.
    released: Vec<u64>,
    /// The keys of due event-time timers, read ahead of firing.
    due_reads: DueReads<K>,
}

/// The keys of one timer time taken out of the index, fired in turns.
struct Firing<K> {
    timestamp: u64,
    keys: Vec<K>,
    /// How many of `keys` fired.
    fired: usize,
    implied: bool,
}

impl<K: Key, I, O: Send> KeyedProcess<K, I, O> {
    /// Keys of one timer time readied at once: a batch's worth.
    const FIRED_PER_PREPARE: usize = 1024;

    /// Event-time timers fired in one turn: a batch's worth, well under a
    /// millisecond on the heap and some milliseconds on RocksDB, so that an
    /// unaligned barrier waits no longer than that behind them.
    pub(crate) const FIRED_PER_TURN: usize = Self::FIRED_PER_PREPARE;

    /// Opens the function `factory` builds, declaring its states and the
    /// timers' in `states`; `key_of` extracts a record's key; what it
    /// counts about time goes to `metrics`.
    pub fn new(
        key_of: Arc<dyn Fn(&I) -> K + Send + Sync>,
        factory: &KeyedFunctionFactory<K, I, O>,
        mut states: KeyedStateBackend<K>,
        metrics: Arc<TimeMetrics>,
        next: Output<O>,
    ) -> Self {
        let mut registrar = StateRegistrar::new(&mut states);
        let timers = TimerService::new(registrar.value(TIMERS_STATE));
        let function = factory(&mut registrar);
        KeyedProcess {
            key_of,
            function,
            states,
            timers,
            metrics,
            next,
            keys: Vec::new(),
            slots: Vec::new(),
            broadcast: BroadcastStates::default(),
            keyless: None,
            firing_to: None,
            firing: None,
            released: Vec::new(),
            due_reads: DueReads::new(),
        }
    }

    /// Makes this the step of a keyed broadcast operator: the records for
    /// which `keyless` holds, of its broadcast input, go to the function's
    /// `process_broadcast` with `broadcast` to change; the others read it.
    pub fn with_broadcast(mut self, broadcast: BroadcastStates, keyless: fn(&I) -> bool) -> Self {
        self.broadcast = broadcast;
        self.keyless = Some(keyless);
        self
    }

    /// Fires the timers of `domain` due at `upto`, earliest first, until
    /// `budget` keys were visited; timers they set that are due fire in the
    /// same call or a later turn. Returns whether none is left due, and the
    /// keys visited; if some are left, the rest of a time's keys wait in
    /// `self.firing` (event time only: processing time fires without a
    /// budget).
    fn fire(&mut self, domain: TimeDomain, upto: u64, budget: usize) -> (bool, usize) {
        let mut slots = std::mem::take(&mut self.slots);
        let mut visited = 0;
        let done = 'times: loop {
            let resumed = match domain {
                TimeDomain::EventTime => self.firing.take(),
                TimeDomain::ProcessingTime => None,
            };
            let popped = || {
                let (timestamp, keys, implied) = self.timers.pop_due(domain, upto)?;
                Some(Firing {
                    timestamp,
                    keys,
                    fired: 0,
                    implied,
                })
            };
            let Some(mut firing) = resumed.or_else(popped) else {
                break true;
            };
            while firing.fired < firing.keys.len() {
                if visited >= budget {
                    self.firing = Some(firing);
                    break 'times false;
                }
                let chunk = Self::FIRED_PER_PREPARE.min(budget - visited);
                let end = firing.keys.len().min(firing.fired + chunk);
                self.fire_keys(domain, &firing, end, &mut slots);
                visited += end - firing.fired;
                firing.fired = end;
            }
        };
        self.slots = slots;
        (done, visited)
    }

    /// Fires the timers of `firing`'s keys up to `end`. An indexed timer
    /// the keyed state no longer holds was deleted, or fired already. The
    /// keys are readied as a batch's are: prefetched on the heap, read
    /// ahead on RocksDB.
    fn fire_keys(
        &mut self,
        domain: TimeDomain,
        firing: &Firing<K>,
        end: usize,
        slots: &mut Vec<KeySlot>,
    ) {
        let keys = &firing.keys[firing.fired..end];
        self.states.prepare(keys, slots);
        for (i, key) in keys.iter().enumerate() {
            self.states.prefetch_ahead(slots, i);
            let mut ctx = KeyedContext::located(
                &mut self.states,
                key,
                slots[i],
                &mut self.timers,
                &self.broadcast,
            )
            .firing(domain);
            // Deleted since it was indexed, or indexed twice.
            if !firing.implied && !ctx.remove_timer(domain, firing.timestamp) {
                continue;
            }
            ctx.time_counters().timers_fired += 1;
            self.function
                .on_timer(firing.timestamp, &mut ctx, &mut self.next.collector());
        }
    }

    /// Fires the event-time timers the watermark made due, `budget` keys'
    /// worth, and sends the watermark on once none is left.
    fn fire_event_time(&mut self, budget: usize, out: &mut Outgoing) -> Result<(), TaskError> {
        let Some(watermark) = self.firing_to else {
            return Ok(());
        };
        let firing = self.firing.iter().flat_map(|f| &f.keys[f.fired..]);
        let due = firing.chain(self.timers.due_event_keys(watermark));
        self.due_reads.turn(&mut self.states, due);
        let (done, visited) = self.fire(TimeDomain::EventTime, watermark, budget);
        self.due_reads.fired(visited);
        self.publish_counters();
        if !done {
            return self.next.flush(out);
        }
        self.due_reads.clear();
        self.firing_to = None;
        self.released.push(watermark);
        self.next.advance_watermark(watermark, out)
    }

    /// Sets the timers a function named after a restore for keys the
    /// snapshot held no event-time keyed timers of, all decided before any
    /// is set. A function names a key's timers together: one read a key.
    fn set_unless_keyed(&mut self, unless_keyed: Vec<(K, u64, RestoredTimer)>) {
        let mut held: Option<(&K, bool)> = None;
        let mut unkeyed = Vec::with_capacity(unless_keyed.len());
        for (key, _, _) in &unless_keyed {
            if held.is_none_or(|(k, _)| k != key) {
                let mut ctx = KeyedContext::with_timers(
                    &mut self.states,
                    key,
                    &mut self.timers,
                    &self.broadcast,
                );
                held = Some((key, ctx.has_event_time_timers()));
            }
            unkeyed.push(held.is_some_and(|(_, keyed)| !keyed));
        }
        let named = unless_keyed.into_iter().zip(unkeyed);
        for ((key, timestamp, timer), _) in named.filter(|(_, unkeyed)| *unkeyed) {
            match timer {
                RestoredTimer::Implied => self.timers.implied(timestamp, key),
                RestoredTimer::Keyed => KeyedContext::with_timers(
                    &mut self.states,
                    &key,
                    &mut self.timers,
                    &self.broadcast,
                )
                .register_event_time_timer(timestamp),
            }
        }
    }

    fn publish_counters(&mut self) {
        let counters = self.timers.take_counters();
        if counters != Default::default() {
            self.metrics.add(&counters);
        }
    }
}

impl<K: Key, I: Send, O: Send> Downstream<I> for KeyedProcess<K, I, O> {
    fn push(&mut self, record: I) {
        let out = &mut self.next.collector();
        if self.keyless.is_some_and(|keyless| keyless(&record)) {
            let mut ctx = BroadcastContext::new(&mut self.states, &mut self.broadcast);
            return self.function.process_broadcast(record, &mut ctx, out);
        }
        let key = (self.key_of)(&record);
        let mut ctx =
            KeyedContext::with_timers(&mut self.states, &key, &mut self.timers, &self.broadcast);
        self.function.process(record, &mut ctx, out);
    }

    fn push_all(&mut self, records: &mut Vec<I>) {
        if self.keyless.is_some() {
            // A broadcast record may change what the next keyed one reads:
            // one at a time, in order.
            for record in records.drain(..) {
                self.push(record);
            }
            return;
        }
        let key_of = &self.key_of;
        // Cleared first: a batch whose function panicked left its keys.
        self.keys.clear();
        self.keys
            .extend(records.iter().map(|record| key_of(record)));
        self.states.prepare(&self.keys, &mut self.slots);
        for (i, record) in records.drain(..).enumerate() {
            self.states.prefetch_ahead(&self.slots, i);
            let mut ctx = KeyedContext::located(
                &mut self.states,
                &self.keys[i],
                self.slots[i],
                &mut self.timers,
                &self.broadcast,
            );
            self.function
                .process(record, &mut ctx, &mut self.next.collector());
        }
    }
}

impl<K: Key, I: Send, O: Send> Step for KeyedProcess<K, I, O> {
    fn flush(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.publish_counters();
        self.next.flush(out)
    }

    fn end_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        // What the last watermark made due fires before the end.
        self.fire_event_time(usize::MAX, out)?;
        self.states.flush()?;
        self.function
            .end_input(AllKeys::new(&self.states), &mut self.next.collector());
        self.publish_counters();
        self.next.end_input(out)
    }

    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
        out: &mut Outgoing,
        snapshot: &mut TaskSnapshot,
    ) -> Result<(), TaskError> {
        snapshot.keyed = Some(self.states.snapshot(checkpoint)?);
        // Implied timers taken out of the index to fire are not in it.
        let implied_firing = self
            .firing
            .as_ref()
            .filter(|f| f.implied)
            .map_or(0, |f| f.keys.len() - f.fired);
        snapshot.timers = self.timers.len() + implied_firing as u64;
        self.broadcast.snapshot(&mut snapshot.operator)?;
        self.next.snapshot(checkpoint, out, snapshot)
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError> {
        self.next.notify_complete(checkpoint)
    }

    fn restore(&mut self, state: &RestoreState) -> Result<(), TaskError> {
        self.states.restore(state)?;
        self.states.flush()?;
        self.broadcast.restore(&state.operator)?;
        for (key, timers) in AllKeys::new(&self.states).values(&self.timers.state()) {
            self.timers.restored(&key, &timers);
        }
        let mut restored = RestoredTimers::new(&mut self.timers);
        self.function
            .restore_timers(AllKeys::new(&self.states), &mut restored);
        let unless_keyed = restored.unless_keyed;
        self.set_unless_keyed(unless_keyed);
        self.next.restore(state)
    }

    fn advance_watermark(&mut self, watermark: u64, out: &mut Outgoing) -> Result<(), TaskError> {
        self.timers.set_watermark(watermark);
        self.metrics.observe_watermark(watermark);
        self.firing_to = Some(watermark);
        self.fire_event_time(Self::FIRED_PER_TURN, out)
    }

    fn timers_due(&self) -> bool {
        self.firing_to.is_some()
    }

    fn fire_due(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.fire_event_time(Self::FIRED_PER_TURN, out)
    }

    fn holds_watermarks(&self) -> bool {
        true
    }

    fn take_watermarks(&mut self, watermarks: &mut Vec<u64>) {
        watermarks.append(&mut self.released);
    }

    fn advance_processing_time(
        &mut self,
        now: Millis,
        out: &mut Outgoing,
    ) -> Result<Option<Millis>, TaskError> {
        self.timers.set_now(now);
        self.states.set_time(now);
        self.fire(TimeDomain::ProcessingTime, now, usize::MAX);
        self.publish_counters();
        let rest = self.next.advance_processing_time(now, out)?;
        Ok(earliest(self.timers.next_processing_timer(), rest))
    }
}

/// How a record writer picks the output channel of a record.
pub enum Route<T> {
    /// The single channel of a forward edge.
    Forward,
    /// Round robin over the channels.
    Rebalance,
    /// A copy to every channel.
    Broadcast,
    /// By key group, through a table from key group to consumer subtask.
    Hash {
        /// The key group of a record's key.
        key_group_of: Arc<dyn Fn(&T) -> KeyGroup + Send + Sync>,
        /// Channel (consumer subtask index) of each key group.
        channel_of_group: Vec<u32>,
    },
}

impl<T> Route<T> {
    /// `parallelism` and `max_parallelism` of the consumer.
    pub fn hash(
        key_group_of: Arc<dyn Fn(&T) -> KeyGroup + Send + Sync>,
        parallelism: u32,
        max_parallelism: u32,
    ) -> Self {
        let channel_of_group = (0..max_parallelism)
            .map(|g| subtask_for_key_group(max_parallelism, parallelism, KeyGroup(g)).0)
            .collect();
        Route::Hash {
            key_group_of,
            channel_of_group,
        }
    }
}

/// Last step of a chain that feeds an edge: partitions records into one
/// buffer per output channel and cuts them into batches.
pub struct RecordWriter<T> {
    route: Route<T>,
    buffers: Vec<Vec<T>>,
    /// The subtask's index of the edge's first output channel.
    offset: usize,
    per_batch: usize,
    next_channel: usize,
    full: Outgoing,
}

impl<T: Data> RecordWriter<T> {
    /// Routes over `channels` output channels, the subtask's from `offset`
    /// on, cutting a batch every `per_batch` records.
    pub fn new(route: Route<T>, offset: usize, channels: usize, per_batch: usize) -> Self {
        RecordWriter {
            route,
            offset,
            buffers: (0..channels)
                .map(|_| Vec::with_capacity(per_batch))
                .collect(),
            per_batch,
            next_channel: 0,
            full: Vec::new(),
        }
    }

    fn append(&mut self, channel: usize, record: T) {
        let buffer = &mut self.buffers[channel];
        buffer.push(record);
        if buffer.len() >= self.per_batch {
            let records = std::mem::replace(buffer, Vec::with_capacity(self.per_batch));
            self.full.push((self.offset + channel, Batch::new(records)));
        }
    }
}

impl<T: Data> Downstream<T> for RecordWriter<T> {
    fn push(&mut self, record: T) {
        match &self.route {
            Route::Forward => self.append(0, record),
            Route::Rebalance => {
                let channel = self.next_channel;
                self.next_channel = (channel + 1) % self.buffers.len();
                self.append(channel, record);
            }
            Route::Broadcast => {
                for channel in 1..self.buffers.len() {
                    self.append(channel, record.clone());
                }
                self.append(0, record);
            }
            Route::Hash {
                key_group_of,
                channel_of_group,
            } => {
                let channel = channel_of_group[key_group_of(&record).0 as usize];
                self.append(channel as usize, record);
            }
        }
    }
}

impl<T: Data> Step for RecordWriter<T> {
    fn flush(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        out.append(&mut self.full);
        for (channel, buffer) in self.buffers.iter_mut().enumerate() {
            if !buffer.is_empty() {
                let records = std::mem::replace(buffer, Vec::with_capacity(self.per_batch));
                out.push((self.offset + channel, Batch::new(records)));
            }
        }
        Ok(())
    }

    fn end_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.flush(out)
    }

    fn snapshot(
        &mut self,
        _checkpoint: CheckpointId,
        out: &mut Outgoing,
        _snapshot: &mut TaskSnapshot,
    ) -> Result<(), TaskError> {
        self.flush(out)
    }

    fn notify_complete(&mut self, _checkpoint: CheckpointId) -> Result<(), TaskError> {
        Ok(())
    }

    fn restore(&mut self, _state: &RestoreState) -> Result<(), TaskError> {
        Ok(())
    }
}

/// Last step of a chain that ends in a sink.
pub struct SinkWriter<T> {
    sink: Box<dyn Sink<T>>,
    /// Its operator-state entry ([`sink_entry`](crate::checkpoint::entries::sink_entry)).
    entry: String,
    buffer: Vec<T>,
}

impl<T> SinkWriter<T> {
    /// Writes into `sink`, one call per input batch; `entry` names its
    /// pre-committed transactions in the operator state.
    pub fn new(sink: Box<dyn Sink<T>>, entry: String) -> Self {
        SinkWriter {
            sink,
            entry,
            buffer: Vec::new(),
        }
    }
}

impl<T: Send> Downstream<T> for SinkWriter<T> {
    fn push(&mut self, record: T) {
        self.buffer.push(record);
    }
}

impl<T: Send> Step for SinkWriter<T> {
    fn flush(&mut self, _out: &mut Outgoing) -> Result<(), TaskError> {
        if !self.buffer.is_empty() {
            self.sink.write(&mut self.buffer).map_err(TaskError::Sink)?;
            self.buffer.clear();
        }
        Ok(())
    }

    fn end_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.flush(out)?;
        self.sink.finish().map_err(TaskError::Sink)
    }

    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
        out: &mut Outgoing,
        snapshot: &mut TaskSnapshot,
    ) -> Result<(), TaskError> {
        self.flush(out)?;
        let state = self.sink.pre_commit(checkpoint).map_err(TaskError::Sink)?;
        snapshot.operator.insert(self.entry.clone(), state);
        Ok(())
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError> {
        self.sink.commit(checkpoint).map_err(TaskError::Sink)
    }

    fn restore(&mut self, state: &RestoreState) -> Result<(), TaskError> {
        self.sink
            .restore(state.operator.get(&self.entry).map(Vec::as_slice))
            .map_err(TaskError::Sink)?;
        for (_, adopted) in state.adopted.iter().filter(|(e, _)| *e == self.entry) {
            self.sink.adopt(adopted).map_err(TaskError::Sink)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::key_group::key_group_of;

    fn records(out: Outgoing) -> Vec<(usize, Vec<u64>)> {
        out.into_iter()
            .map(|(c, b)| (c, b.into_records::<u64>().unwrap()))
            .collect()
    }

    #[test]
    fn writer_cuts_full_batches_and_flushes_the_rest() {
        let mut w = RecordWriter::<u64>::new(Route::Rebalance, 0, 2, 2);
        for n in 0..5 {
            w.push(n);
        }
        let mut out = Vec::new();
        w.flush(&mut out).unwrap();
        assert_eq!(
            records(out),
            [(0, vec![0, 2]), (1, vec![1, 3]), (0, vec![4])]
        );
    }

    #[test]
    fn hash_route_sends_each_key_to_the_owner_of_its_key_group() {
        let route = Route::hash(Arc::new(|k: &u64| key_group_of(k, 128)), 3, 128);
        let mut w = RecordWriter::new(route, 0, 3, 1000);
        for k in 0..1000u64 {
            w.push(k);
        }
        let mut out = Vec::new();
        w.end_input(&mut out).unwrap();
        for (channel, keys) in records(out) {
            for k in keys {
                let owner = crate::model::key_group::KeyGroupRange::for_subtask(
                    128,
                    3,
                    crate::model::ids::SubtaskIndex(channel as u32),
                );
                assert!(owner.contains(key_group_of(&k, 128)));
            }
        }
    }

    /// Counts records per key and emits `(key, count)` at the end.
    struct Count(crate::state::ValueState<u64>);

    impl KeyedProcessFunction<u64, u64, (u64, u64)> for Count {
        fn process(
            &mut self,
            _record: u64,
            ctx: &mut KeyedContext<'_, u64>,
            _out: &mut Collector<'_, (u64, u64)>,
        ) {
            *ctx.value(&self.0).get_or_default() += 1;
        }

        fn end_input(&mut self, states: AllKeys<'_, u64>, out: &mut Collector<'_, (u64, u64)>) {
            for (key, count) in states.values(&self.0) {
                out.collect((key, count));
            }
        }
    }

    fn counter(local_dir: &std::path::Path) -> KeyedProcess<u64, u64, (u64, u64)> {
        let config = crate::state::StateBackend::Embedded {
            store: Arc::new(crate::testkit::store::MemoryStore::new(local_dir)),
            cache_entries: crate::state::StateBackend::DEFAULT_CACHE_ENTRIES,
        };
        let range = crate::model::key_group::KeyGroupRange::for_subtask(
            128,
            1,
            crate::model::ids::SubtaskIndex(0),
        );
        let states = KeyedStateBackend::new(&config, "op-1-0", range, 128);
        let factory: KeyedFunctionFactory<u64, u64, (u64, u64)> =
            Arc::new(|states| Box::new(Count(states.value("count"))));
        let writer = RecordWriter::<(u64, u64)>::new(Route::Forward, 0, 1, 1 << 20);
        KeyedProcess::new(
            Arc::new(|k: &u64| *k),
            &factory,
            states,
            Default::default(),
            Output::from(Box::new(writer) as Box<dyn Downstream<(u64, u64)>>),
        )
    }

    fn counts(process: &mut KeyedProcess<u64, u64, (u64, u64)>) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        process.end_input(&mut out).unwrap();
        let mut counts: Vec<(u64, u64)> = out
            .into_iter()
            .flat_map(|(_, b)| b.into_records::<(u64, u64)>().unwrap())
            .collect();
        counts.sort();
        counts
    }

    #[test]
    fn a_keyed_operator_on_an_embedded_store_snapshots_natively_and_restores_from_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut process = counter(dir.path());
        process.restore(&RestoreState::default()).unwrap();
        for record in 0..10_000u64 {
            process.push(record % 1000);
        }
        let mut snapshot = TaskSnapshot::default();
        process
            .snapshot(CheckpointId(1), &mut Vec::new(), &mut snapshot)
            .unwrap();
        let Some(crate::state::snapshot::KeyedSnapshot::Native(pending)) = snapshot.keyed else {
            panic!("an operator on an embedded store took a heap snapshot");
        };
        // The records after the barrier go on while the checkpoint is made.
        for record in 0..1000u64 {
            process.push(record);
        }
        // The end of input sees the values still in the write-back cache.
        let expected: Vec<(u64, u64)> = (0..1000).map(|k| (k, 11)).collect();
        assert_eq!(counts(&mut process), expected);

        let native = pending.wait().unwrap();
        let mut restored = counter(dir.path());
        restored
            .restore(&RestoreState {
                native: Some(native.dir.clone()),
                ..RestoreState::default()
            })
            .unwrap();
        let expected: Vec<(u64, u64)> = (0..1000).map(|k| (k, 10)).collect();
        assert_eq!(counts(&mut restored), expected);
    }

    #[test]
    fn broadcast_reaches_every_channel() {
        let mut w = RecordWriter::<u64>::new(Route::Broadcast, 0, 3, 10);
        w.push(7);
        let mut out = Vec::new();
        w.flush(&mut out).unwrap();
        assert_eq!(records(out), [(0, vec![7]), (1, vec![7]), (2, vec![7])]);
    }
}
