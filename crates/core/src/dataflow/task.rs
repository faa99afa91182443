//! The type-erased body of a subtask: a source or an input, followed by its
//! operator chain. The subtask actor drives it without knowing record types.

use crate::dataflow::async_io::AsyncRuntime;
use crate::dataflow::error::TaskError;
use crate::dataflow::operator::{Downstream, Outgoing};
use crate::dataflow::source::reader::Reader;
use crate::dataflow::source::{SourceStatus, SplitBytes};
use crate::model::batch::{Batch, BatchLimits, Data};
use crate::model::graph::Partitioner;
use crate::model::ids::{Attempt, CheckpointId, OperatorId, SubtaskIndex};
use crate::model::key_group::KeyGroupRange;
use crate::model::split::SplitPosition;
use crate::state::StateBackend;
use crate::time::split_watermarks::SplitWatermarks;
use crate::time::watermark::GeneratorState;
use crate::time::{
    Millis, TimeMetrics, Timestamped, WatermarkEvent, WatermarkGenerator, WatermarkStatus,
    WatermarkStrategy,
};
use std::sync::Arc;
use std::time::Duration;

/// Everything a subtask's chain is built from.
#[derive(Clone, Debug)]
pub struct TaskContext {
    /// The subtask's operator.
    pub operator: OperatorId,
    /// Which subtask of its operator this is.
    pub subtask: SubtaskIndex,
    /// The attempt it belongs to.
    pub attempt: Attempt,
    /// The operator's parallelism.
    pub parallelism: u32,
    /// The operator's max parallelism: the number of key groups.
    pub max_parallelism: u32,
    /// The key groups this subtask owns.
    pub key_groups: KeyGroupRange,
    /// How large the batches the chain emits may grow.
    pub batch_limits: BatchLimits,
    /// The edges this subtask feeds, by index in `JobGraph::edges`: how
    /// each routes records and where its channels are among the subtask's.
    pub outputs: Vec<(usize, OutputContext)>,
    /// Position a source resumes from: `None` on a fresh start.
    pub source_position: Option<SplitPosition>,
    /// Where a keyed operator keeps its state: the job's choice.
    pub state_backend: StateBackend,
    /// Where sources and keyed operators count what they do with time.
    pub time_metrics: Arc<TimeMetrics>,
    /// The subtask's executor, for async operators.
    pub async_runtime: AsyncRuntime,
}

/// An edge a subtask feeds, as the step writing into it needs it to route
/// records.
#[derive(Clone, Copy, Debug)]
pub struct OutputContext {
    /// How records are routed.
    pub partitioner: Partitioner,
    /// The subtask's index of the edge's first output channel.
    pub offset: usize,
    /// Number of this subtask's output channels on the edge.
    pub channels: usize,
    /// The consumer operator's parallelism.
    pub consumer_parallelism: u32,
    /// The consumer operator's max parallelism, for the key group of a
    /// hash-partitioned record.
    pub consumer_max_parallelism: u32,
}

pub use crate::checkpoint::entries::{
    is_sink_entry, sink_entry, SINK, SOURCE_EXHAUSTED, SOURCE_POSITION, SOURCE_SPLITS,
    SOURCE_WATERMARK,
};
pub use crate::state::snapshot::{
    KeyedSnapshot, NativeCheckpoint, NativeFile, PendingNative, RestoreState, TaskSnapshot,
};

impl RestoreState {
    /// The [`SOURCE_POSITION`] entry, decoded: where a source resumes.
    pub fn source_position(&self) -> Result<Option<SplitPosition>, TaskError> {
        self.operator
            .get(SOURCE_POSITION)
            .map(|bytes| {
                rmp_serde::from_slice(bytes)
                    .map_err(|e| TaskError::Protocol(format!("a malformed source position: {e}")))
            })
            .transpose()
    }
}

/// A subtask's body behind one type-erased interface, driven by the subtask
/// actor. Every error fails the subtask.
pub trait Task: Send {
    /// Sources only: read up to `max` records at processing time `now` and
    /// push them through the chain.
    fn produce(
        &mut self,
        max: usize,
        now: Millis,
        out: &mut Outgoing,
    ) -> Result<Produced, TaskError>;

    /// Subtasks with input: push one batch of input `input` (`Edge::input`)
    /// through the chain.
    fn process(&mut self, input: usize, batch: Batch, out: &mut Outgoing) -> Result<(), TaskError>;

    /// No more input will come (the source finished, or every input channel
    /// ended): emit what the chain holds back.
    fn end_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError>;

    /// Synchronous part of checkpoint `checkpoint`: flushes what precedes the
    /// barrier into `out` and captures the state.
    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
        out: &mut Outgoing,
    ) -> Result<TaskSnapshot, TaskError>;

    /// Checkpoint `checkpoint` completed: two-phase-commit sinks commit.
    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError>;

    /// Before any input: load the restored state into the chain.
    fn restore(&mut self, state: &RestoreState) -> Result<(), TaskError>;

    /// The records of `batch`, of input `input`, in key groups this subtask
    /// owns: replayed input of a rescaled hash edge holds those of other
    /// subtasks too.
    fn retain_owned(&self, input: usize, batch: Batch) -> Result<Batch, TaskError>;

    /// The subtask's watermark reached `watermark`: event-time timers up to
    /// it fire (a keyed head fires a turn of them, see
    /// [`timers_due`](Self::timers_due)); the shell forwards the watermark
    /// after `out`, or takes it from a head that holds watermarks.
    fn advance_watermark(&mut self, watermark: u64, out: &mut Outgoing) -> Result<(), TaskError>;

    /// Processing time is `now`: due processing-time timers fire. Returns
    /// when the next one is due, for the shell to come back then.
    fn advance_processing_time(
        &mut self,
        now: Millis,
        out: &mut Outgoing,
    ) -> Result<Option<Millis>, TaskError>;

    /// Sources with a watermark strategy: how often to call
    /// [`watermark_tick`](Self::watermark_tick) when no records come.
    fn watermark_interval(&self) -> Option<Duration>;

    /// Sources: the periodic check of the watermark and of idleness; a
    /// `backpressured` source (its output waits for credit) is not idle.
    fn watermark_tick(&mut self, now: Millis, backpressured: bool);

    /// Split sources: the source coordinator handed the subtask `splits`.
    fn add_splits(&mut self, splits: Vec<SplitBytes>) -> Result<(), TaskError>;

    /// Split sources: the source coordinator has no more splits for it.
    fn no_more_splits(&mut self) -> Result<(), TaskError>;

    /// The watermark events due since the last call, for the shell to send
    /// on every output channel after the batches already written out: a
    /// source's (after `produce`, a tick or the end of input), the
    /// watermarks a head let go ([`holds_watermarks`](Self::holds_watermarks)),
    /// and the status changes passed in behind them.
    fn take_watermarks(&mut self, events: &mut Vec<WatermarkEvent>);

    /// The inputs' watermark status changed: it goes on through
    /// [`take_watermarks`](Self::take_watermarks) once the watermarks before
    /// it did (a head that holds watermarks lets them go after its due
    /// timers fired, or its earlier results left), so that downstream never
    /// sees an input idle (or active) ahead of a watermark it came behind:
    /// a valve drops the watermarks of an idle channel.
    fn pass_status(&mut self, status: WatermarkStatus);

    /// An async operator's requests completed: take their results in and
    /// push what may leave through the chain (`Step::poll_async`).
    fn poll_async(&mut self, out: &mut Outgoing) -> Result<(), TaskError>;

    /// The chain takes no input for now (a full async operator).
    fn input_blocked(&self) -> bool;

    /// The end of input waits for records in flight (an async operator's).
    fn in_flight(&self) -> bool;

    /// Watermarks go on through [`take_watermarks`](Self::take_watermarks),
    /// behind what the chain held back, not as they come.
    fn holds_watermarks(&self) -> bool;

    /// Event-time timers a watermark made due have yet to fire: the shell
    /// takes no input but checkpoint barriers and cancel markers with
    /// nothing ahead of them (`BarrierHandler::poll_control`), and calls
    /// [`fire_due`](Self::fire_due) each time it has yielded its thread
    /// (`Step::timers_due`).
    fn timers_due(&self) -> bool;

    /// Fires the next turn's share of the due timers.
    fn fire_due(&mut self, out: &mut Outgoing) -> Result<(), TaskError>;
}

/// What one `produce` call read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Produced {
    /// Records read.
    pub records: usize,
    /// Whether the source has more.
    pub status: SourceStatus,
    /// A split source holds no split: ask its coordinator for one.
    pub request_split: bool,
    /// A split source holds no split and waits for its coordinator: there
    /// is nothing to read until splits come, or word that none will.
    pub awaiting_splits: bool,
}

/// The head of a source subtask's chain.
struct SourceHead<T> {
    reader: Box<dyn Reader<T>>,
    buffer: Vec<T>,
    exhausted: bool,
    watermarks: SourceWatermarks<T>,
}

/// A source's watermark generator and what it has emitted but the shell
/// has not yet sent. Every source has one: a source without timestamps
/// (`timestamp_of` is `None`) only emits the final watermark, as in Flink.
struct SourceWatermarks<T> {
    generator: WatermarkGenerator,
    timestamp_of: Option<fn(&T) -> u64>,
    /// A split source's time per split, which the generator follows.
    splits: Option<SplitWatermarks>,
    due: Vec<WatermarkEvent>,
    metrics: Arc<TimeMetrics>,
}

/// Takes a batch of one input apart and pushes its records, as the head's
/// record type, into the chain.
pub type Decoder<T> =
    Arc<dyn Fn(Batch, &mut dyn Downstream<T>) -> Result<(), TaskError> + Send + Sync>;

/// Keeps the records of a batch of one input whose key groups the subtask
/// owns.
pub type Retain = Arc<dyn Fn(Batch) -> Result<Batch, TaskError> + Send + Sync>;

/// The decoder of an input of records `I` that the head takes as `T`: one
/// input of a two-input operator wraps its records into the side they
/// came from.
pub fn decoder<I: Data, T>(wrap: impl Fn(I) -> T + Send + Sync + 'static) -> Decoder<T> {
    Arc::new(move |batch, next| {
        let mut records = batch.into_records::<I>()?.into_iter().map(&wrap).collect();
        next.push_all(&mut records);
        Ok(())
    })
}

/// Keeps the records of an input of records `I` for which `owns` holds.
pub fn retain<I: Data>(owns: impl Fn(&I) -> bool + Send + Sync + 'static) -> Retain {
    Arc::new(move |batch| {
        let mut records = batch.into_records::<I>()?;
        records.retain(|record| owns(record));
        Ok(Batch::new(records))
    })
}

fn not_a_source() -> TaskError {
    TaskError::Protocol("a subtask with input was asked to act as a source".into())
}

/// A chain fed by a source or by the subtask's input gate.
pub struct ChainTask<T> {
    source: Option<SourceHead<T>>,
    /// By input: one, or two for a two-input operator.
    decoders: Vec<Decoder<T>>,
    next: Box<dyn Downstream<T>>,
    /// By input, for keyed chains only.
    retain: Vec<Retain>,
    /// The newest watermark passed to a head that holds watermarks, until
    /// it (or a later one) went on.
    unreleased: Option<u64>,
    /// Status changes passed in, until every watermark before them went on.
    statuses: Vec<WatermarkStatus>,
}

impl<T> ChainTask<T> {
    /// A source subtask's chain: `source` feeding `next`. Its records have
    /// no timestamps: the end of its input emits the final watermark only.
    pub fn source(reader: Box<dyn Reader<T>>, next: Box<dyn Downstream<T>>) -> Self {
        ChainTask {
            source: Some(SourceHead {
                reader,
                buffer: Vec::new(),
                exhausted: false,
                watermarks: SourceWatermarks {
                    generator: WatermarkGenerator::new(
                        WatermarkStrategy::none(),
                        GeneratorState::default(),
                    ),
                    timestamp_of: None,
                    splits: None,
                    due: Vec::new(),
                    metrics: Arc::default(),
                },
            }),
            decoders: Vec::new(),
            next,
            retain: Vec::new(),
            unreleased: None,
            statuses: Vec::new(),
        }
    }

    /// A source subtask's chain whose records carry event timestamps, with
    /// watermarks after `strategy`; the newest timestamp goes to `metrics`.
    pub fn source_with_watermarks(
        reader: Box<dyn Reader<T>>,
        strategy: WatermarkStrategy,
        metrics: Arc<TimeMetrics>,
        next: Box<dyn Downstream<T>>,
    ) -> Self
    where
        T: Timestamped,
    {
        let splits = reader.held_splits().map(|_| SplitWatermarks::default());
        let mut task = Self::source(reader, next);
        if let Some(head) = &mut task.source {
            head.watermarks = SourceWatermarks {
                generator: WatermarkGenerator::new(strategy, GeneratorState::default()),
                timestamp_of: Some(T::timestamp),
                splits,
                due: Vec::new(),
                metrics,
            };
        }
        task
    }

    fn head(&mut self) -> Result<&mut SourceHead<T>, TaskError> {
        self.source.as_mut().ok_or_else(not_a_source)
    }

    fn watermarks(&mut self) -> Option<&mut SourceWatermarks<T>> {
        Some(&mut self.source.as_mut()?.watermarks)
    }

    /// A chain fed by the input gate, whose inputs `decoders` take apart;
    /// `retain` keeps the records the subtask owns, one per input for a
    /// keyed head and none otherwise.
    pub fn input(
        decoders: Vec<Decoder<T>>,
        retain: Vec<Retain>,
        next: Box<dyn Downstream<T>>,
    ) -> Self {
        ChainTask {
            source: None,
            decoders,
            next,
            retain,
            unreleased: None,
            statuses: Vec::new(),
        }
    }
}

impl<T: Data> Task for ChainTask<T> {
    fn produce(
        &mut self,
        max: usize,
        now: Millis,
        out: &mut Outgoing,
    ) -> Result<Produced, TaskError> {
        let head = self.source.as_mut().ok_or_else(not_a_source)?;
        let status = head
            .reader
            .read(&mut head.buffer, max)
            .map_err(TaskError::Source)?;
        let request_split = head.reader.take_request();
        let awaiting_splits = head.reader.awaiting_splits();
        head.exhausted = status == SourceStatus::Finished;
        let records = head.buffer.len();
        let w = &mut head.watermarks;
        if let Some(timestamp_of) = w.timestamp_of {
            let max = head.buffer.iter().map(timestamp_of).max();
            if let Some(max) = max {
                w.metrics.observe_timestamp(max);
            }
            match (&mut w.splits, head.reader.held_splits()) {
                (Some(splits), Some((held, last))) => {
                    let records = last.zip(max);
                    let current = w.generator.state().max_timestamp;
                    splits.on_read(&held, records, current, now);
                    if records.is_some() {
                        w.generator.on_activity(now, &mut w.due);
                    }
                    let idleness = w.generator.strategy().idleness;
                    w.generator.follow(splits.combined(idleness, now));
                    w.generator.on_tick(now, &mut w.due);
                }
                _ => w.generator.on_records(max, now, &mut w.due),
            }
        }
        // As in Flink, a source that has read everything releases its
        // consumers' windows at once, before the checkpoint that ends its
        // input.
        if head.exhausted {
            w.generator.on_end(&mut w.due);
        }
        self.next.push_all(&mut head.buffer);
        self.next.flush(out)?;
        Ok(Produced {
            records,
            status,
            request_split,
            awaiting_splits,
        })
    }

    fn process(&mut self, input: usize, batch: Batch, out: &mut Outgoing) -> Result<(), TaskError> {
        let decoder = self.decoders.get(input).ok_or_else(|| {
            TaskError::Protocol(format!(
                "a batch of input {input} arrived at a chain with {} inputs",
                self.decoders.len()
            ))
        })?;
        decoder(batch, self.next.as_mut())?;
        self.next.flush(out)
    }

    fn end_input(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        if let Some(w) = self.watermarks() {
            w.generator.on_end(&mut w.due);
        }
        self.next.end_input(out)
    }

    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
        out: &mut Outgoing,
    ) -> Result<TaskSnapshot, TaskError> {
        let mut snapshot = TaskSnapshot::default();
        if let Some(head) = &mut self.source {
            let watermark = rmp_serde::to_vec(&head.watermarks.generator.state()).map_err(|e| {
                TaskError::Protocol(format!("cannot encode a watermark state: {e}"))
            })?;
            snapshot.operator.insert(SOURCE_WATERMARK.into(), watermark);
            head.reader.snapshot(checkpoint, &mut snapshot.operator)?;
            if head.exhausted {
                snapshot
                    .operator
                    .insert(SOURCE_EXHAUSTED.into(), Vec::new());
            }
        }
        self.next.snapshot(checkpoint, out, &mut snapshot)?;
        Ok(snapshot)
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError> {
        if let Some(head) = &mut self.source {
            head.reader
                .notify_complete(checkpoint)
                .map_err(TaskError::Source)?;
        }
        self.next.notify_complete(checkpoint)
    }

    fn restore(&mut self, state: &RestoreState) -> Result<(), TaskError> {
        if let Some(head) = &mut self.source {
            head.reader.restore(&state.operator)?;
        }
        if let Some(w) = self.watermarks() {
            if let Some(bytes) = state.operator.get(SOURCE_WATERMARK) {
                let restored = rmp_serde::from_slice(bytes).map_err(|e| {
                    TaskError::Protocol(format!("a malformed watermark state: {e}"))
                })?;
                w.generator = WatermarkGenerator::new(*w.generator.strategy(), restored);
                // The consumers restored without it: a watermark in flight
                // at the snapshot may never have reached them.
                w.generator.resend(&mut w.due);
            }
        }
        self.next.restore(state)
    }

    fn advance_watermark(&mut self, watermark: u64, out: &mut Outgoing) -> Result<(), TaskError> {
        if self.next.holds_watermarks() {
            self.unreleased = Some(watermark);
        }
        self.next.advance_watermark(watermark, out)
    }

    fn advance_processing_time(
        &mut self,
        now: Millis,
        out: &mut Outgoing,
    ) -> Result<Option<Millis>, TaskError> {
        self.next.advance_processing_time(now, out)
    }

    fn watermark_interval(&self) -> Option<Duration> {
        let w = &self.source.as_ref()?.watermarks;
        w.timestamp_of?;
        Some(w.generator.strategy().interval)
    }

    fn watermark_tick(&mut self, now: Millis, backpressured: bool) {
        if let Some(w) = self.watermarks() {
            if backpressured {
                w.generator.on_backpressure(now);
            } else {
                if let Some(splits) = &w.splits {
                    // A split gone idle may let the others' time through.
                    let idleness = w.generator.strategy().idleness;
                    w.generator.follow(splits.combined(idleness, now));
                }
                w.generator.on_tick(now, &mut w.due);
            }
        }
    }

    fn add_splits(&mut self, splits: Vec<SplitBytes>) -> Result<(), TaskError> {
        self.head()?.reader.add_splits(splits)
    }

    fn no_more_splits(&mut self) -> Result<(), TaskError> {
        self.head()?.reader.no_more_splits()
    }

    fn take_watermarks(&mut self, events: &mut Vec<WatermarkEvent>) {
        if let Some(w) = self.watermarks() {
            events.append(&mut w.due);
        }
        let mut released = Vec::new();
        self.next.take_watermarks(&mut released);
        // Watermarks go on in order, and a head may let a newer one go in
        // place of those before it.
        let newest = released.last().copied();
        if self
            .unreleased
            .is_some_and(|held| newest.is_some_and(|newest| newest >= held))
        {
            self.unreleased = None;
        }
        events.extend(released.into_iter().map(WatermarkEvent::Watermark));
        if self.unreleased.is_none() {
            events.extend(self.statuses.drain(..).map(WatermarkEvent::Status));
        }
    }

    fn pass_status(&mut self, status: WatermarkStatus) {
        self.statuses.push(status);
    }

    fn poll_async(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.next.poll_async(out)
    }

    fn input_blocked(&self) -> bool {
        self.next.input_blocked()
    }

    fn in_flight(&self) -> bool {
        self.next.in_flight()
    }

    fn holds_watermarks(&self) -> bool {
        self.next.holds_watermarks()
    }

    fn timers_due(&self) -> bool {
        self.next.timers_due()
    }

    fn fire_due(&mut self, out: &mut Outgoing) -> Result<(), TaskError> {
        self.next.fire_due(out)
    }

    fn retain_owned(&self, input: usize, batch: Batch) -> Result<Batch, TaskError> {
        let retain = self.retain.get(input).ok_or_else(|| {
            TaskError::Protocol(
                "replayed records of a rescaled hash edge reached a chain without a key".into(),
            )
        })?;
        retain(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head that holds each watermark until its earlier results leave,
    /// as an async operator's does: here, until `poll_async`.
    #[derive(Default)]
    struct Holding {
        held: Vec<u64>,
        released: Vec<u64>,
    }

    impl Downstream<u64> for Holding {
        fn push(&mut self, _record: u64) {}
    }

    impl crate::dataflow::operator::Step for Holding {
        fn flush(&mut self, _out: &mut Outgoing) -> Result<(), TaskError> {
            Ok(())
        }

        fn end_input(&mut self, _out: &mut Outgoing) -> Result<(), TaskError> {
            Ok(())
        }

        fn snapshot(
            &mut self,
            _checkpoint: CheckpointId,
            _out: &mut Outgoing,
            _snapshot: &mut TaskSnapshot,
        ) -> Result<(), TaskError> {
            Ok(())
        }

        fn notify_complete(&mut self, _checkpoint: CheckpointId) -> Result<(), TaskError> {
            Ok(())
        }

        fn restore(&mut self, _state: &RestoreState) -> Result<(), TaskError> {
            Ok(())
        }

        fn advance_watermark(
            &mut self,
            watermark: u64,
            _out: &mut Outgoing,
        ) -> Result<(), TaskError> {
            self.held.push(watermark);
            Ok(())
        }

        fn poll_async(&mut self, _out: &mut Outgoing) -> Result<(), TaskError> {
            self.released.append(&mut self.held);
            Ok(())
        }

        fn holds_watermarks(&self) -> bool {
            true
        }

        fn take_watermarks(&mut self, watermarks: &mut Vec<u64>) {
            watermarks.append(&mut self.released);
        }
    }

    /// A status change behind a watermark that a head holds with no timers
    /// due (an async operator's, behind requests in flight) waits for it
    /// too: were it to go first, the valve downstream would take the
    /// channel for idle and drop the watermark.
    #[test]
    fn a_status_change_waits_behind_a_watermark_a_head_holds() {
        let mut task = ChainTask::input(Vec::new(), Vec::new(), Box::new(Holding::default()));
        let mut out = Vec::new();
        let mut events = Vec::new();
        task.advance_watermark(9, &mut out).unwrap();
        task.pass_status(WatermarkStatus::Idle);
        task.take_watermarks(&mut events);
        assert_eq!(events, []);
        task.poll_async(&mut out).unwrap();
        task.take_watermarks(&mut events);
        assert_eq!(
            events,
            [
                WatermarkEvent::Watermark(9),
                WatermarkEvent::Status(WatermarkStatus::Idle)
            ]
        );
        // Nothing held: at once.
        events.clear();
        task.pass_status(WatermarkStatus::Active);
        task.take_watermarks(&mut events);
        assert_eq!(events, [WatermarkEvent::Status(WatermarkStatus::Active)]);
    }
}
