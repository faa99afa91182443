//! The subtask actor: runs one operator chain. It pulls input from its gate
//! only while every output has room, so a slow consumer backpressures it, and
//! a source subtask stops reading. Barriers go through the core's barrier
//! handler, which owns the gate; the synchronous part of a snapshot runs
//! here, the asynchronous part on a blocking thread. An unaligned snapshot
//! sends its barrier around the output queues and acknowledges once the
//! handler has collected the input channel state. User code runs inside
//! `catch_unwind`: a panic becomes a failure message to the supervisor
//! instead of a dead mailbox.

use crate::clock::now;
use crate::control::Commands;
use crate::dataflow::endpoint::{InputEndpoint, OutputEndpoint};
use crate::dataflow::snapshot;
use crate::messages::{
    AcknowledgeCheckpoint, AddSplits, CheckpointReports, Consumed, DeclineCheckpoint, Deliver,
    DeliverPriority, EndOfData, Kill, NoMoreSplits, NotifyCheckpointAborted,
    NotifyCheckpointComplete, OutputCredit, Produce, Push, PushPriority, Reports, SourceExhausted,
    SplitRequest, Stop, SubtaskFailed, SubtaskFinished, ToSubtask, TriggerCheckpoint,
};
use crate::metrics::{JobMetrics, SubtaskCounters};
use actix::fut::ActorFutureExt;
use actix::{Actor, ActorContext, Addr, AsyncContext, Context, Handler, Message};
use futures::future::{AbortHandle, AbortRegistration, Abortable, Either};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidemark_core::checkpoint::barrier::{BarrierAction, BarrierHandler, Polled};
use tidemark_core::checkpoint::merging::StateLayout;
use tidemark_core::checkpoint::subtask::{SharedBase, SubtaskCheckpointer};
use tidemark_core::checkpoint::{Ack, ChannelSide, ChannelState, CheckpointMetrics, SubtaskState};
use tidemark_core::cluster::fault::{Fault, FaultPoint};
use tidemark_core::dataflow::async_io::AsyncRuntime;
use tidemark_core::dataflow::error::TaskError;
use tidemark_core::dataflow::operator::Outgoing;
use tidemark_core::dataflow::rate::RateLimiter;
use tidemark_core::dataflow::source::SourceStatus;
use tidemark_core::dataflow::task::Task;
use tidemark_core::model::batch::Batch;
use tidemark_core::model::channel::CreditSender;
use tidemark_core::model::event::{Alignment, Barrier, ChannelEvent};
use tidemark_core::model::ids::{Attempt, CheckpointId, SubtaskId};
use tidemark_core::time::WatermarkEvent;
use tidemark_storage::CheckpointStorage;
use tokio::sync::oneshot;
use tracing::Instrument;

/// How long a source that had nothing to read waits before asking again.
const IDLE_SOURCE_POLL: Duration = Duration::from_millis(1);

/// What a subtask needs to take part in checkpoints.
#[derive(Clone)]
pub struct Checkpointing {
    pub reports: CheckpointReports,
    pub storage: CheckpointStorage,
    pub incremental: bool,
    pub layout: StateLayout,
    /// Targeted faults of this subtask.
    pub faults: Vec<Fault>,
}

pub struct SubtaskSpec {
    pub id: SubtaskId,
    pub attempt: Attempt,
    pub task: Box<dyn Task>,
    /// The executor of the task's async operator, which the subtask tells
    /// how to wake it.
    pub async_runtime: AsyncRuntime,
    /// Per gate channel, the input (`Edge::input`) it feeds.
    pub inputs: Vec<usize>,
    pub outputs: usize,
    pub records_per_batch: usize,
    /// Records per second for this source subtask.
    pub rate: Option<f64>,
    pub checkpointing: Option<Checkpointing>,
    /// In-flight batches of the restored checkpoint, replayed first.
    pub replay: Vec<ChannelState>,
    /// Input pause per record processed, for a subtask made slow.
    pub ns_per_record: u64,
    /// The shared files of the restored checkpoint, which an incremental
    /// snapshot references instead of uploading.
    pub shared_base: SharedBase,
}

/// Input channel state of an unaligned checkpoint, per input channel, and its
/// alignment duration (first barrier to last).
type InputChannelState = (Vec<Vec<Batch>>, Duration);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Endpoints not wired yet.
    Waiting,
    Running,
    /// A source that read everything, waiting for a checkpoint that holds
    /// its final offset before it ends its output.
    Exhausted,
    /// End of input processed, but an async operator still holds records:
    /// the end of partition waits for their results.
    Ending,
    /// End of input processed; end of partition queued on every output.
    Draining,
    Finished,
    Failed,
}

pub struct SubtaskActor {
    id: SubtaskId,
    attempt: Attempt,
    task: Box<dyn Task>,
    async_runtime: AsyncRuntime,
    is_source: bool,
    /// Per gate channel, the input it feeds.
    inputs: Vec<usize>,
    handler: BarrierHandler,
    outputs: Vec<CreditSender>,
    output_addrs: Vec<Addr<OutputEndpoint>>,
    input_addrs: Vec<Addr<InputEndpoint>>,
    outgoing: Outgoing,
    reports: Reports,
    metrics: Arc<JobMetrics>,
    checkpointing: Option<Checkpointing>,
    records_per_batch: usize,
    limiter: Option<RateLimiter>,
    phase: Phase,
    produce_scheduled: bool,
    /// A split source holds no split and waits for its coordinator: it is
    /// not asked to produce until splits come or word that none will.
    awaiting_splits: bool,
    drive_scheduled: bool,
    ns_per_record: u64,
    /// A slow subtask takes no input before then.
    resume_at: Option<Instant>,
    /// The alignment deadline a timer is armed for.
    timer: Option<Instant>,
    /// The unaligned snapshot whose asynchronous part waits for the input
    /// channel state the handler is collecting.
    collecting: Option<(CheckpointId, oneshot::Sender<InputChannelState>)>,
    /// Bases of incremental snapshots, running asynchronous parts and the
    /// suspension of a stopping savepoint: the core's rules.
    checkpointer: SubtaskCheckpointer<AbortHandle>,
    /// The processing-time timer a wake-up is armed for.
    wake_at: Option<u64>,
    counters: Arc<SubtaskCounters>,
    /// Since when output waits for credit.
    blocked_since: Option<Instant>,
}

/// The asynchronous part of a snapshot → its subtask: the shared files the
/// acknowledged state references.
#[derive(Message)]
#[rtype(result = "()")]
struct Uploaded {
    checkpoint: CheckpointId,
    shared: SharedBase,
}

/// Subtask → itself: go on with the input, after the mailbox had its turn.
#[derive(Message)]
#[rtype(result = "()")]
struct Drive;

/// Its executor → the subtask: requests of its async operator completed.
#[derive(Message)]
#[rtype(result = "()")]
struct PollAsync;

fn delay_since(barrier: &Barrier) -> Duration {
    Duration::from_millis(now().unix_ms.saturating_sub(barrier.timestamp))
}

impl SubtaskActor {
    pub fn new(spec: SubtaskSpec, reports: Reports, metrics: Arc<JobMetrics>) -> Self {
        let incremental = spec.checkpointing.as_ref().is_some_and(|c| c.incremental);
        let mut handler = BarrierHandler::new(spec.inputs.len());
        let mut outputs: Vec<CreditSender> =
            (0..spec.outputs).map(|_| CreditSender::default()).collect();
        for state in spec.replay {
            match state.side {
                ChannelSide::Input => handler.replay(state.channel, state.batches),
                ChannelSide::Output => {
                    for batch in state.batches {
                        outputs[state.channel].push(ChannelEvent::Batch(batch));
                    }
                }
            }
        }
        let counters = metrics.subtask(spec.id);
        counters.clear_input_watermark();
        SubtaskActor {
            counters,
            blocked_since: None,
            id: spec.id,
            attempt: spec.attempt,
            is_source: spec.inputs.is_empty(),
            inputs: spec.inputs,
            task: spec.task,
            async_runtime: spec.async_runtime,
            handler,
            outputs,
            output_addrs: Vec::new(),
            input_addrs: Vec::new(),
            outgoing: Vec::new(),
            reports,
            metrics,
            checkpointing: spec.checkpointing,
            records_per_batch: spec.records_per_batch,
            limiter: spec
                .rate
                .map(|rate| RateLimiter::new(rate, spec.records_per_batch, Instant::now())),
            phase: Phase::Waiting,
            produce_scheduled: false,
            awaiting_splits: false,
            drive_scheduled: false,
            ns_per_record: spec.ns_per_record,
            resume_at: None,
            timer: None,
            collecting: None,
            checkpointer: SubtaskCheckpointer::new(incremental, spec.shared_base),
            wake_at: None,
        }
    }

    /// Whether the subtask has yet to end: its death would be a failure.
    fn live(&self) -> bool {
        matches!(
            self.phase,
            Phase::Running | Phase::Ending | Phase::Draining | Phase::Waiting | Phase::Exhausted
        )
    }

    fn fail(&mut self, error: TaskError) {
        self.phase = Phase::Failed;
        self.reports.failed.do_send(SubtaskFailed {
            attempt: self.attempt,
            subtask: self.id,
            error,
        });
    }

    /// Runs user code; a returned error or a panic fails the subtask.
    fn guarded<R>(
        &mut self,
        f: impl FnOnce(&mut dyn Task, &mut Outgoing) -> Result<R, TaskError>,
    ) -> Option<R> {
        if self.phase == Phase::Failed {
            return None;
        }
        let result = catch_unwind(AssertUnwindSafe(|| {
            f(self.task.as_mut(), &mut self.outgoing)
        }))
        .unwrap_or_else(|panic| Err(TaskError::Panic(panic_message(panic.as_ref()))));
        result.map_err(|error| self.fail(error)).ok()
    }

    /// A targeted fault at `point` of `checkpoint` for this subtask.
    fn fault(&self, point: FaultPoint, checkpoint: CheckpointId) -> bool {
        self.checkpointing.as_ref().is_some_and(|c| {
            c.faults
                .iter()
                .any(|f| f.point == point && f.checkpoint == checkpoint && f.subtask == self.id)
        })
    }

    fn injected(point: FaultPoint, checkpoint: CheckpointId) -> TaskError {
        TaskError::Injected(format!("at {point:?} of {checkpoint}"))
    }

    fn send_outgoing(&mut self) {
        let mut records = 0;
        for (channel, batch) in self.outgoing.drain(..) {
            records += batch.len() as u64;
            self.outputs[channel].push(ChannelEvent::Batch(batch));
        }
        if records > 0 {
            self.counters.add_records_out(records);
        }
        for channel in 0..self.outputs.len() {
            self.pump(channel);
        }
        if self.blocked_since.is_none() && self.output_blocked() {
            self.blocked_since = Some(Instant::now());
        }
    }

    fn pump(&mut self, channel: usize) {
        while let Some(event) = self.outputs[channel].poll_send() {
            self.output_addrs[channel].do_send(Push(event));
        }
    }

    fn broadcast_event(&mut self, event: ChannelEvent) {
        for output in &mut self.outputs {
            output.push(event.clone());
        }
        for channel in 0..self.outputs.len() {
            self.pump(channel);
        }
    }

    /// Sends the watermark events the task let go (a source's generator, a
    /// head that holds watermarks until its results or timers are out, the
    /// status changes behind them), after the batches already written out.
    fn forward_watermarks(&mut self) {
        let mut events = Vec::new();
        self.task.take_watermarks(&mut events);
        for event in events {
            self.broadcast_event(event.into());
        }
    }

    /// Passes a watermark event of the inputs through the task and on;
    /// false if the task failed. A status change goes through the task too,
    /// which keeps it behind the watermarks its head still holds.
    fn pass_watermark_event(&mut self, event: WatermarkEvent, ctx: &mut Context<Self>) -> bool {
        let watermark = match event {
            WatermarkEvent::Watermark(watermark) => watermark,
            WatermarkEvent::Status(status) => {
                self.task.pass_status(status);
                self.forward_watermarks();
                return true;
            }
        };
        self.counters.set_input_watermark(watermark);
        if self
            .guarded(|task, out| task.advance_watermark(watermark, out))
            .is_none()
        {
            return false;
        }
        self.send_outgoing();
        // Timers may have set processing-time timers.
        self.advance_processing_time(ctx);
        if self.task.timers_due() {
            // The next turn after a yield.
            self.drive_after_yielding(ctx);
        }
        if self.task.holds_watermarks() {
            // Behind the results the chain held back.
            self.forward_watermarks();
        } else {
            self.broadcast_event(event.into());
        }
        true
    }

    /// Fires the processing-time timers due now and arms a wake-up for the
    /// next one, so that they fire without input too.
    fn advance_processing_time(&mut self, ctx: &mut Context<Self>) {
        let unix_ms = now().unix_ms;
        let Some(next) = self.guarded(|task, out| task.advance_processing_time(unix_ms, out))
        else {
            return;
        };
        self.send_outgoing();
        if let Some(at) = next.filter(|&at| self.wake_at.is_none_or(|armed| at < armed)) {
            self.wake_at = Some(at);
            ctx.run_later(
                Duration::from_millis(at.saturating_sub(unix_ms)),
                move |act, ctx| {
                    if act.wake_at == Some(at) {
                        act.wake_at = None;
                    }
                    if act.phase == Phase::Running {
                        act.advance_processing_time(ctx);
                        act.drive(ctx);
                    }
                },
            );
        }
    }

    /// Drives again once the arbiter's thread ran what else was ready: a
    /// notified `Drive` would run before the actors sharing the thread, and
    /// an input endpoint among them may hold an unaligned barrier.
    fn drive_after_yielding(&mut self, ctx: &mut Context<Self>) {
        if self.drive_scheduled {
            return;
        }
        self.drive_scheduled = true;
        let yielded = actix::fut::wrap_future::<_, Self>(actix_rt::task::yield_now());
        ctx.spawn(yielded.map(|(), act, ctx| {
            act.drive_scheduled = false;
            act.drive(ctx);
        }));
    }

    /// Output held back for lack of credit: take no more input until it left.
    fn output_blocked(&self) -> bool {
        self.outputs.iter().any(|o| !o.is_empty())
    }

    fn drive(&mut self, ctx: &mut Context<Self>) {
        loop {
            if self.output_blocked() {
                return;
            }
            match self.phase {
                Phase::Running => {}
                Phase::Draining => {
                    self.phase = Phase::Finished;
                    self.reports.finished.do_send(SubtaskFinished {
                        attempt: self.attempt,
                        subtask: self.id,
                    });
                    return;
                }
                Phase::Waiting
                | Phase::Exhausted
                | Phase::Ending
                | Phase::Finished
                | Phase::Failed => return,
            }
            if self.task.input_blocked() {
                // A full async operator, or one with restored records to
                // request: its completions drive again.
                if self.guarded(|task, out| task.poll_async(out)).is_none() {
                    return;
                }
                self.send_outgoing();
                self.forward_watermarks();
                if self.task.input_blocked() {
                    return;
                }
            }
            if self.task.timers_due() {
                if !self.fire_turn(ctx) {
                    return;
                }
                continue;
            }
            if self.is_source {
                if !self.produce_scheduled && !self.awaiting_splits {
                    self.produce_scheduled = true;
                    ctx.notify(Produce);
                }
                return;
            }
            if let Some(at) = self.resume_at {
                let now = Instant::now();
                if at > now {
                    if !self.drive_scheduled {
                        self.drive_scheduled = true;
                        ctx.run_later(at - now, |act, ctx| {
                            act.drive_scheduled = false;
                            act.drive(ctx);
                        });
                    }
                    return;
                }
                self.resume_at = None;
            }
            match self.handler.poll(Instant::now()) {
                None => return,
                Some(Polled::Actions(actions)) => self.apply(actions, ctx),
                Some(Polled::Watermarks(events)) => {
                    for event in events {
                        if !self.pass_watermark_event(event, ctx) {
                            return;
                        }
                    }
                }
                Some(Polled::Batch {
                    channel,
                    batch,
                    credited,
                }) => {
                    if self.ns_per_record > 0 {
                        let pause = self.ns_per_record.saturating_mul(batch.len() as u64);
                        // A pause past what `Instant` can count is none.
                        self.resume_at = Instant::now().checked_add(Duration::from_nanos(pause));
                    }
                    self.advance_processing_time(ctx);
                    self.counters.add_records_in(batch.len() as u64);
                    let input = self.inputs[channel];
                    if self
                        .guarded(|task, out| task.process(input, batch, out))
                        .is_some()
                    {
                        if credited {
                            self.input_addrs[channel].do_send(Consumed);
                        }
                        self.send_outgoing();
                        // The batch may have set processing-time timers.
                        self.advance_processing_time(ctx);
                    }
                    // One batch per turn, so that a priority barrier waiting
                    // in the mailbox is not held up behind the queued input.
                    if !self.drive_scheduled {
                        self.drive_scheduled = true;
                        ctx.notify(Drive);
                    }
                    return;
                }
            }
        }
    }

    /// One turn of the timers a watermark made due per yield of the
    /// thread, fired by the drive scheduled after it (not by every message
    /// that drives), and no input until they all fired but checkpoint
    /// barriers and cancel markers with nothing ahead of them: an aligned
    /// barrier need not wait behind the timers either. False when the
    /// drive stops here.
    fn fire_turn(&mut self, ctx: &mut Context<Self>) -> bool {
        if self.drive_scheduled {
            return false;
        }
        while self.phase == Phase::Running && !self.output_blocked() {
            let Some(actions) = self.handler.poll_control(Instant::now()) else {
                break;
            };
            self.apply(actions, ctx);
        }
        if self.phase != Phase::Running || self.output_blocked() {
            return false;
        }
        if self.guarded(|task, out| task.fire_due(out)).is_none() {
            return false;
        }
        self.send_outgoing();
        // Timers may have set processing-time timers.
        self.advance_processing_time(ctx);
        self.forward_watermarks();
        if self.task.timers_due() {
            self.drive_after_yielding(ctx);
            return false;
        }
        true
    }

    fn apply(&mut self, actions: Vec<BarrierAction>, ctx: &mut Context<Self>) {
        for action in actions {
            match action {
                BarrierAction::Snapshot {
                    barrier,
                    unaligned,
                    timed_out,
                    alignment,
                    bytes_during_alignment,
                } => {
                    let metrics = CheckpointMetrics {
                        alignment,
                        bytes_during_alignment,
                        start_delay: delay_since(&barrier).saturating_sub(alignment),
                        unaligned,
                        switched_to_unaligned: timed_out,
                        ..CheckpointMetrics::default()
                    };
                    self.snapshot(barrier, metrics, false, ctx);
                }
                BarrierAction::ChannelState {
                    checkpoint,
                    inputs,
                    alignment,
                } => {
                    if let Some((_, waiting)) = self.collecting.take_if(|(id, _)| *id == checkpoint)
                    {
                        // The asynchronous part is gone only if it failed, which it reported.
                        let _ = waiting.send((inputs, alignment));
                    }
                }
                BarrierAction::Abort { checkpoint, reason } => {
                    // Dropping the sender ends the waiting asynchronous part.
                    self.collecting.take_if(|(id, _)| *id == checkpoint);
                    if let Some(c) = &self.checkpointing {
                        c.reports.declined.do_send(DeclineCheckpoint {
                            attempt: self.attempt,
                            checkpoint,
                            subtask: self.id,
                            reason: format!("{reason:?}"),
                        });
                    }
                    self.broadcast_event(ChannelEvent::CancelMarker(checkpoint));
                }
                BarrierAction::EndInput => self.end_input(),
            }
        }
        self.arm_timer(ctx);
    }

    /// An aligned-with-timeout checkpoint switches to unaligned at its
    /// deadline even if no input arrives to poll the handler.
    fn arm_timer(&mut self, ctx: &mut Context<Self>) {
        let Some(deadline) = self.handler.deadline() else {
            return;
        };
        if self.timer == Some(deadline) {
            return;
        }
        self.timer = Some(deadline);
        ctx.run_later(
            deadline.saturating_duration_since(Instant::now()),
            |act, ctx| {
                act.timer = None;
                let actions = act.handler.on_timeout(Instant::now());
                act.apply(actions, ctx);
                act.drive(ctx);
            },
        );
    }

    /// The synchronous part here, the barrier downstream right after it, the
    /// asynchronous part off the actor; it acknowledges when done. Unaligned
    /// (`metrics.unaligned`), the barrier overtakes the output queues, whose
    /// batches become output channel state, and the acknowledgement waits
    /// for the input channel state. `suspend`: the savepoint that stops the
    /// job, after whose barrier a source emits nothing.
    fn snapshot(
        &mut self,
        barrier: Barrier,
        mut metrics: CheckpointMetrics,
        suspend: bool,
        ctx: &mut Context<Self>,
    ) {
        let Some(checkpointing) = self.checkpointing.clone() else {
            return self.fail(TaskError::Protocol(
                "a barrier reached a job without checkpointing".into(),
            ));
        };
        let id = barrier.id;
        let started = Instant::now();
        let sync_span =
            tracing::debug_span!("snapshot_sync", checkpoint = id.0, subtask = %self.id).entered();
        let sync_fault = self.fault(FaultPoint::SyncSnapshot, id);
        let Some(state) = self.guarded(|task, out| {
            if sync_fault {
                return Err(Self::injected(FaultPoint::SyncSnapshot, id));
            }
            task.snapshot(id, out)
        }) else {
            return;
        };
        let state = snapshot::start(state);
        self.send_outgoing();
        let outputs = self.send_barrier(barrier, metrics.unaligned);
        let inputs = (metrics.unaligned && self.handler.channels() > 0).then(|| {
            let (sender, receiver) = oneshot::channel();
            self.collecting = Some((id, sender));
            receiver
        });
        metrics.sync = started.elapsed();
        drop(sync_span);
        let (cancel, registration) = AbortHandle::new_pair();
        let base = self
            .checkpointer
            .started(id, barrier.options.kind, suspend, cancel);
        let part = AsyncPart {
            checkpoint: id,
            subtask: self.id,
            attempt: self.attempt,
            reports: self.reports.clone(),
            checkpointing,
            subtask_addr: ctx.address(),
            decline: self.fault(FaultPoint::AsyncWrite, id),
            stall: self.fault(FaultPoint::StallAfterWrite, id),
            fail_after_ack: self.fault(FaultPoint::AfterAck, id),
            metrics,
        };
        let async_span =
            tracing::debug_span!("snapshot_async", checkpoint = id.0, subtask = %self.id);
        snapshot::spawn(
            part.run(state, outputs, inputs, base, registration)
                .instrument(async_span),
        );
    }

    /// Sends the barrier downstream: in line with the output, or unaligned,
    /// around the queues, whose batches the returned future yields as
    /// output channel state, channel by channel (`None` if an endpoint is
    /// gone: its attempt ended).
    fn send_barrier(&mut self, barrier: Barrier, unaligned: bool) -> Option<OutputChannelState> {
        if !unaligned {
            self.broadcast_event(ChannelEvent::Barrier(barrier));
            return None;
        }
        // Batches still queued here were never pushed to the endpoint: the
        // barrier, sent straight to it, overtakes them as well.
        let queued: Vec<Vec<Batch>> = self.outputs.iter().map(CreditSender::overtaken).collect();
        let endpoints: Vec<_> = self
            .output_addrs
            .iter()
            .map(|endpoint| endpoint.send(PushPriority(barrier)))
            .collect();
        Some(Box::pin(async move {
            let from_endpoints = futures::future::join_all(endpoints).await;
            let mut channels = Vec::new();
            for (channel, (queued, endpoint)) in queued.into_iter().zip(from_endpoints).enumerate()
            {
                let mut batches = endpoint.ok()?;
                batches.extend(queued);
                channels.push(ChannelState {
                    side: ChannelSide::Output,
                    channel,
                    batches,
                });
            }
            Some(channels)
        }))
    }

    fn end_input(&mut self) {
        if self.guarded(|task, out| task.end_input(out)).is_some() {
            self.phase = Phase::Ending;
            self.end_output();
        }
    }

    /// Ends the output once the task holds nothing in flight.
    fn end_output(&mut self) {
        self.send_outgoing();
        self.forward_watermarks();
        if self.phase == Phase::Ending && !self.task.in_flight() {
            self.broadcast_event(ChannelEvent::EndOfPartition);
            self.phase = Phase::Draining;
        }
    }
}

/// The output channel state of an unaligned snapshot, once the endpoints
/// have handed their queues over.
type OutputChannelState = Pin<Box<dyn Future<Output = Option<Vec<ChannelState>>> + Send>>;

/// The asynchronous part of one snapshot and what it reports to.
struct AsyncPart {
    checkpoint: CheckpointId,
    subtask: SubtaskId,
    attempt: Attempt,
    reports: Reports,
    checkpointing: Checkpointing,
    subtask_addr: Addr<SubtaskActor>,
    /// Injected faults: decline instead of writing, stall after writing
    /// until the checkpoint aborts, fail the subtask after acknowledging.
    decline: bool,
    stall: bool,
    fail_after_ack: bool,
    metrics: CheckpointMetrics,
}

impl AsyncPart {
    /// Collects the channel state, uploads and acknowledges or declines;
    /// an abort (through `registration`) deletes what was written.
    async fn run(
        mut self,
        state: snapshot::Started,
        outputs: Option<OutputChannelState>,
        inputs: Option<oneshot::Receiver<InputChannelState>>,
        base: Option<Arc<SharedBase>>,
        registration: AbortRegistration,
    ) {
        let id = self.checkpoint;
        if self.decline {
            return self.declined(SubtaskActor::injected(FaultPoint::AsyncWrite, id).to_string());
        }
        let Some(channels) = self.channel_state(outputs, inputs).await else {
            return;
        };
        let (storage, layout) = (
            &self.checkpointing.storage.clone(),
            &self.checkpointing.layout.clone(),
        );
        let subtask = self.subtask;
        let planned = std::sync::Mutex::new(Vec::new());
        let upload = async {
            let prepared = snapshot::prepare(
                subtask,
                id,
                state,
                channels,
                base.as_deref(),
                layout,
                &storage.run_tag(),
            )
            .await?;
            *planned.lock().expect("not poisoned") = prepared.physical_files();
            prepared.upload(storage).await
        };
        // The checkpoint aborted: nothing will acknowledge what the upload
        // wrote. A put in flight is not dropped but awaited (a dropped
        // local put still lands), and then everything planned is deleted.
        let aborted = Abortable::new(futures::future::pending::<()>(), registration);
        futures::pin_mut!(upload);
        let uploaded = match futures::future::select(upload, aborted).await {
            Either::Left((uploaded, aborted)) if self.stall => {
                let _ = aborted.await;
                drop(uploaded);
                None
            }
            Either::Left((uploaded, _)) => Some(uploaded),
            Either::Right((_, upload)) => {
                let _ = upload.await;
                None
            }
        };
        match uploaded {
            None => {
                let paths = std::mem::take(&mut *planned.lock().expect("not poisoned"));
                snapshot::delete_all(storage, paths).await
            }
            Some(Ok((state, took))) => self.acknowledge(state, took),
            // As in Flink, a failed upload (which deleted what it wrote)
            // declines its checkpoint, which counts against the tolerable
            // failures, rather than failing the subtask: processing goes on.
            Some(Err(reason)) => self.declined(format!("its asynchronous part failed: {reason}")),
        }
    }

    /// The output and input channel state of an unaligned snapshot (none
    /// when aligned); `None` when the attempt ended or the handler aborted
    /// the checkpoint (and the subtask declined it) meanwhile.
    async fn channel_state(
        &mut self,
        outputs: Option<OutputChannelState>,
        inputs: Option<oneshot::Receiver<InputChannelState>>,
    ) -> Option<Vec<ChannelState>> {
        let mut channels = match outputs {
            Some(outputs) => outputs.await?,
            None => Vec::new(),
        };
        if let Some(inputs) = inputs {
            let (inputs, alignment) = inputs.await.ok()?;
            self.metrics.alignment = alignment;
            channels.extend(inputs.into_iter().enumerate().map(|(channel, batches)| {
                ChannelState {
                    side: ChannelSide::Input,
                    channel,
                    batches,
                }
            }));
        }
        Some(channels)
    }

    /// Tells the subtask which shared files the state references, then the
    /// coordinator that the subtask's part is done.
    fn acknowledge(mut self, state: SubtaskState, took: Duration) {
        let id = self.checkpoint;
        self.subtask_addr.do_send(Uploaded {
            checkpoint: id,
            shared: state
                .shared_files()
                .map(|f| (f.name.clone(), f.clone()))
                .collect(),
        });
        self.metrics.async_ = took;
        self.metrics.state_size = state.size();
        self.metrics.persisted_inflight_bytes = state.inflight_bytes();
        self.checkpointing
            .reports
            .acknowledged
            .do_send(AcknowledgeCheckpoint {
                attempt: self.attempt,
                ack: Ack {
                    subtask: self.subtask,
                    checkpoint: id,
                    state,
                    metrics: self.metrics,
                },
            });
        if self.fail_after_ack {
            self.reports.failed.do_send(SubtaskFailed {
                attempt: self.attempt,
                subtask: self.subtask,
                error: SubtaskActor::injected(FaultPoint::AfterAck, id),
            });
        }
    }

    fn declined(self, reason: String) {
        self.checkpointing
            .reports
            .declined
            .do_send(DeclineCheckpoint {
                attempt: self.attempt,
                checkpoint: self.checkpoint,
                subtask: self.subtask,
                reason,
            });
    }
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

impl Actor for SubtaskActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let addr = ctx.address();
        self.async_runtime
            .set_waker(move || addr.do_send(PollAsync));
    }
}

/// A subtask of the current attempt as the coordinator and the supervisor
/// reach it: an actor of this process, or one on a worker process, through
/// that worker's ordered commands.
#[derive(Clone)]
pub enum SubtaskHandle {
    Local(Addr<SubtaskActor>),
    Remote {
        subtask: SubtaskId,
        commands: Commands,
    },
}

impl SubtaskHandle {
    pub fn send<M: ToSubtask>(&self, message: M)
    where
        SubtaskActor: Handler<M>,
    {
        match self {
            SubtaskHandle::Local(addr) => addr.do_send(message),
            SubtaskHandle::Remote { subtask, commands } => commands.send(message.remote(*subtask)),
        }
    }
}

/// Supervisor → subtask: its endpoints exist; start.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wire {
    pub outputs: Vec<Addr<OutputEndpoint>>,
    pub inputs: Vec<Addr<InputEndpoint>>,
}

impl Handler<Wire> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, wire: Wire, ctx: &mut Context<Self>) {
        debug_assert_eq!(wire.outputs.len(), self.outputs.len());
        debug_assert_eq!(wire.inputs.len(), self.handler.channels());
        self.output_addrs = wire.outputs;
        self.input_addrs = wire.inputs;
        self.phase = Phase::Running;
        // Replayed output channel state may be waiting for credit that
        // arrived before the endpoints were wired.
        self.send_outgoing();
        // A restored source's watermark, sent again.
        self.forward_watermarks();
        if let Some(interval) = self.task.watermark_interval() {
            ctx.run_interval(interval, |act, _| {
                // Nothing after the barrier of a stopping savepoint, not
                // even a watermark that would fire windows.
                let suspended = act.checkpointer.suspended();
                if matches!(act.phase, Phase::Running | Phase::Exhausted) && !suspended {
                    let backpressured = act.output_blocked();
                    act.task.watermark_tick(now().unix_ms, backpressured);
                    act.forward_watermarks();
                }
            });
        }
        // Timers that fell due while the job was down fire now.
        self.advance_processing_time(ctx);
        self.drive(ctx);
    }
}

impl Handler<Deliver> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, msg: Deliver, ctx: &mut Context<Self>) {
        let actions = self.handler.deliver(Instant::now(), msg.channel, msg.event);
        self.apply(actions, ctx);
        self.drive(ctx);
    }
}

impl Handler<DeliverPriority> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, msg: DeliverPriority, ctx: &mut Context<Self>) {
        let actions =
            self.handler
                .deliver_priority(Instant::now(), msg.channel, msg.barrier, msg.overtaken);
        self.apply(actions, ctx);
        self.drive(ctx);
    }
}

impl Handler<Drive> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, _: Drive, ctx: &mut Context<Self>) {
        self.drive_scheduled = false;
        self.drive(ctx);
    }
}

impl Handler<PollAsync> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, _: PollAsync, ctx: &mut Context<Self>) {
        if !matches!(self.phase, Phase::Running | Phase::Ending) {
            return;
        }
        if self.guarded(|task, out| task.poll_async(out)).is_some() {
            self.end_output();
            self.drive(ctx);
        }
    }
}

impl Handler<OutputCredit> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, msg: OutputCredit, ctx: &mut Context<Self>) {
        self.outputs[msg.channel].grant(msg.credits);
        if !self.output_addrs.is_empty() {
            self.pump(msg.channel);
        }
        if !self.output_blocked() {
            if let Some(since) = self.blocked_since.take() {
                self.counters.add_backpressured(since.elapsed());
            }
        }
        self.drive(ctx);
    }
}

impl Handler<Produce> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, _: Produce, ctx: &mut Context<Self>) {
        self.produce_scheduled = false;
        if self.phase != Phase::Running || self.output_blocked() || self.checkpointer.suspended() {
            return;
        }
        let limited = self
            .limiter
            .as_mut()
            .map(|l| l.acquire(self.records_per_batch, Instant::now()));
        let max = match limited {
            None => self.records_per_batch,
            Some(Ok(granted)) => granted,
            Some(Err(wait)) => {
                self.produce_scheduled = true;
                ctx.run_later(wait, |_, ctx| ctx.notify(Produce));
                return;
            }
        };
        let unix_ms = now().unix_ms;
        let Some(produced) = self.guarded(|task, out| task.produce(max, unix_ms, out)) else {
            return;
        };
        self.metrics
            .add_records_in(self.id.operator, produced.records as u64);
        self.counters.add_records_in(produced.records as u64);
        self.send_outgoing();
        self.forward_watermarks();
        if produced.request_split {
            self.reports.split_requested.do_send(SplitRequest {
                attempt: self.attempt,
                subtask: self.id,
            });
        }
        self.awaiting_splits = produced.awaiting_splits;
        if produced.records == 0
            && produced.status == SourceStatus::Running
            && !produced.awaiting_splits
        {
            // Nothing to read yet: ask again a little later rather than at
            // once, which would spin and starve the actors sharing this
            // arbiter (their timers included).
            self.produce_scheduled = true;
            ctx.run_later(IDLE_SOURCE_POLL, |act, ctx| {
                act.produce_scheduled = false;
                act.drive(ctx);
            });
        }
        if produced.status == SourceStatus::Finished {
            match &self.checkpointing {
                Some(c) => {
                    self.phase = Phase::Exhausted;
                    c.reports.exhausted.do_send(SourceExhausted {
                        attempt: self.attempt,
                        subtask: self.id,
                    });
                }
                None => self.end_input(),
            }
        }
        self.drive(ctx);
    }
}

impl Handler<TriggerCheckpoint> for SubtaskActor {
    type Result = ();

    /// A source that is not running says nothing: it failed (the restart
    /// aborts the checkpoint) or its output ended (the job is finishing), and
    /// neither is a checkpoint failure to count.
    fn handle(
        &mut self,
        TriggerCheckpoint { barrier, suspend }: TriggerCheckpoint,
        ctx: &mut Context<Self>,
    ) {
        if matches!(self.phase, Phase::Running | Phase::Exhausted) {
            // A source has no input to align: only an unaligned checkpoint
            // changes what it does.
            let metrics = CheckpointMetrics {
                start_delay: delay_since(&barrier),
                unaligned: barrier.options.alignment == Alignment::Unaligned,
                ..CheckpointMetrics::default()
            };
            // As Flink's synchronous savepoint: with `suspend`, nothing
            // after the barrier, so that the stopped job emitted exactly
            // what the savepoint holds.
            self.snapshot(barrier, metrics, suspend, ctx);
        }
    }
}

impl Handler<Uploaded> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, msg: Uploaded, _ctx: &mut Context<Self>) {
        self.checkpointer.uploaded(msg.checkpoint, msg.shared);
    }
}

impl Handler<NotifyCheckpointComplete> for SubtaskActor {
    type Result = ();

    fn handle(
        &mut self,
        NotifyCheckpointComplete {
            checkpoint: id,
            rewrite,
        }: NotifyCheckpointComplete,
        _ctx: &mut Context<Self>,
    ) {
        self.checkpointer.completed(id, &rewrite);
        let commit_fault = self.fault(FaultPoint::SinkCommit, id);
        self.guarded(|task, _| {
            if commit_fault {
                return Err(Self::injected(FaultPoint::SinkCommit, id));
            }
            task.notify_complete(id)
        });
    }
}

impl Handler<NotifyCheckpointAborted> for SubtaskActor {
    type Result = ();

    fn handle(
        &mut self,
        NotifyCheckpointAborted(id): NotifyCheckpointAborted,
        ctx: &mut Context<Self>,
    ) {
        if let Some(upload) = self.checkpointer.aborted(id) {
            upload.abort();
        }
        let actions = self.handler.abort(id);
        self.apply(actions, ctx);
        self.drive(ctx);
    }
}

impl Handler<AddSplits> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, AddSplits(splits): AddSplits, ctx: &mut Context<Self>) {
        self.awaiting_splits = false;
        if self.guarded(|task, _| task.add_splits(splits)).is_some() {
            self.drive(ctx);
        }
    }
}

impl Handler<NoMoreSplits> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, _: NoMoreSplits, ctx: &mut Context<Self>) {
        self.awaiting_splits = false;
        if self.guarded(|task, _| task.no_more_splits()).is_some() {
            self.drive(ctx);
        }
    }
}

impl Handler<EndOfData> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, _: EndOfData, ctx: &mut Context<Self>) {
        if self.phase == Phase::Exhausted {
            self.phase = Phase::Running;
            self.end_input();
            self.drive(ctx);
        }
    }
}

impl Handler<Kill> for SubtaskActor {
    type Result = ();

    /// Dies like a crashed actor: the unwind closes the mailbox. The
    /// failure is reported first and the unwind skips the panic hook, so
    /// that an expected failure logs one line, not a panic's backtrace.
    fn handle(&mut self, kill: Kill, _ctx: &mut Context<Self>) {
        // As `Drop` judges: a subtask that had ended fails nothing.
        if self.live() {
            self.fail(TaskError::Injected(format!(
                "{} of {}, a crash of the subtask",
                kill.failure, kill.of
            )));
        }
        std::panic::resume_unwind(Box::new(kill));
    }
}

impl Handler<Stop> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        self.phase = Phase::Finished;
        ctx.stop();
    }
}

impl Drop for SubtaskActor {
    fn drop(&mut self) {
        if self.live() {
            self.fail(TaskError::Protocol(
                "subtask actor stopped before its input ended".into(),
            ));
        }
    }
}
