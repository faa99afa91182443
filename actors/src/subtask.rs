//! The subtask actor: runs one operator chain. It pulls input from its gate
//! only while every output has room, so a slow consumer backpressures it, and
//! a source subtask stops reading. User code runs inside `catch_unwind`: a
//! panic becomes a failure message to the supervisor instead of a dead
//! mailbox.

use crate::endpoint::{InputEndpoint, OutputEndpoint};
use crate::messages::{
    Consumed, Deliver, OutputCredit, Produce, Push, SubtaskFailed, SubtaskFinished, Wire,
};
use crate::metrics::JobMetrics;
use crate::supervisor::JobSupervisor;
use actix::{Actor, Addr, AsyncContext, Context, Handler};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;
use tidemark::channel::CreditSender;
use tidemark::error::TaskError;
use tidemark::event::ChannelEvent;
use tidemark::gate::InputGate;
use tidemark::ids::SubtaskId;
use tidemark::operator::Outgoing;
use tidemark::rate::RateLimiter;
use tidemark::source::SourceStatus;
use tidemark::task::Task;

pub struct SubtaskActor {
    id: SubtaskId,
    task: Box<dyn Task>,
    is_source: bool,
    gate: InputGate,
    outputs: Vec<CreditSender>,
    output_addrs: Vec<Addr<OutputEndpoint>>,
    input_addrs: Vec<Addr<InputEndpoint>>,
    outgoing: Outgoing,
    supervisor: Addr<JobSupervisor>,
    metrics: Arc<JobMetrics>,
    records_per_batch: usize,
    limiter: Option<RateLimiter>,
    state: Phase,
    produce_scheduled: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Endpoints not wired yet.
    Waiting,
    Running,
    /// End of input processed; end of partition queued on every output.
    Draining,
    Finished,
    Failed,
}

pub struct SubtaskSpec {
    pub id: SubtaskId,
    pub task: Box<dyn Task>,
    pub inputs: usize,
    pub outputs: usize,
    pub records_per_batch: usize,
    /// Records per second for this source subtask.
    pub rate: Option<f64>,
}

impl SubtaskActor {
    pub fn new(
        spec: SubtaskSpec,
        supervisor: Addr<JobSupervisor>,
        metrics: Arc<JobMetrics>,
    ) -> Self {
        SubtaskActor {
            id: spec.id,
            is_source: spec.inputs == 0,
            task: spec.task,
            gate: InputGate::new(spec.inputs),
            outputs: (0..spec.outputs).map(|_| CreditSender::default()).collect(),
            output_addrs: Vec::new(),
            input_addrs: Vec::new(),
            outgoing: Vec::new(),
            supervisor,
            metrics,
            records_per_batch: spec.records_per_batch,
            limiter: spec
                .rate
                .map(|rate| RateLimiter::new(rate, spec.records_per_batch, Instant::now())),
            state: Phase::Waiting,
            produce_scheduled: false,
        }
    }

    /// Runs user code; a returned error or a panic fails the subtask.
    fn guarded<R>(
        &mut self,
        f: impl FnOnce(&mut dyn Task, &mut Outgoing) -> Result<R, TaskError>,
    ) -> Option<R> {
        let result = catch_unwind(AssertUnwindSafe(|| {
            f(self.task.as_mut(), &mut self.outgoing)
        }))
        .unwrap_or_else(|panic| Err(TaskError::Panic(panic_message(panic.as_ref()))));
        match result {
            Ok(r) => Some(r),
            Err(error) => {
                self.state = Phase::Failed;
                self.supervisor.do_send(SubtaskFailed {
                    subtask: self.id,
                    error,
                });
                None
            }
        }
    }

    fn send_outgoing(&mut self) {
        for (channel, batch) in self.outgoing.drain(..) {
            self.outputs[channel].push(ChannelEvent::Batch(batch));
        }
        for channel in 0..self.outputs.len() {
            self.pump(channel);
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

    /// Output held back for lack of credit: take no more input until it left.
    fn output_blocked(&self) -> bool {
        self.outputs.iter().any(|o| !o.is_empty())
    }

    fn drive(&mut self, ctx: &mut Context<Self>) {
        loop {
            if self.output_blocked() {
                return;
            }
            match self.state {
                Phase::Running => {}
                Phase::Draining => {
                    self.state = Phase::Finished;
                    self.supervisor.do_send(SubtaskFinished(self.id));
                    return;
                }
                Phase::Waiting | Phase::Finished | Phase::Failed => return,
            }
            if self.is_source {
                if !self.produce_scheduled {
                    self.produce_scheduled = true;
                    ctx.notify(Produce);
                }
                return;
            }
            let Some((channel, event)) = self.gate.poll() else {
                return;
            };
            self.on_input(channel, event);
        }
    }

    fn on_input(&mut self, channel: usize, event: ChannelEvent) {
        match event {
            ChannelEvent::Batch(batch) => {
                if self.guarded(|task, out| task.process(batch, out)).is_some() {
                    self.input_addrs[channel].do_send(Consumed);
                    self.send_outgoing();
                }
            }
            ChannelEvent::EndOfPartition => {
                if self.gate.all_ended() {
                    self.end_of_input();
                }
            }
            control @ (ChannelEvent::Barrier(_) | ChannelEvent::CancelMarker(_)) => {
                self.broadcast_event(control);
            }
        }
    }

    fn end_of_input(&mut self) {
        if self.guarded(|task, out| task.end_of_input(out)).is_some() {
            self.send_outgoing();
            self.broadcast_event(ChannelEvent::EndOfPartition);
            self.state = Phase::Draining;
        }
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
}

impl Handler<Wire> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, wire: Wire, ctx: &mut Context<Self>) {
        debug_assert_eq!(wire.outputs.len(), self.outputs.len());
        debug_assert_eq!(wire.inputs.len(), self.gate.channels());
        self.output_addrs = wire.outputs;
        self.input_addrs = wire.inputs;
        self.state = Phase::Running;
        self.drive(ctx);
    }
}

impl Handler<Deliver> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, msg: Deliver, ctx: &mut Context<Self>) {
        self.gate.push(msg.channel, msg.event);
        self.drive(ctx);
    }
}

impl Handler<OutputCredit> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, msg: OutputCredit, ctx: &mut Context<Self>) {
        self.outputs[msg.channel].grant(msg.credits);
        if !self.output_addrs.is_empty() {
            self.pump(msg.channel);
        }
        self.drive(ctx);
    }
}

impl Handler<Produce> for SubtaskActor {
    type Result = ();

    fn handle(&mut self, _: Produce, ctx: &mut Context<Self>) {
        self.produce_scheduled = false;
        if self.state != Phase::Running || self.output_blocked() {
            return;
        }
        let max = match self
            .limiter
            .as_mut()
            .map(|l| l.acquire(self.records_per_batch, Instant::now()))
        {
            None => self.records_per_batch,
            Some(Ok(granted)) => granted,
            Some(Err(wait)) => {
                self.produce_scheduled = true;
                ctx.run_later(wait, |_, ctx| ctx.notify(Produce));
                return;
            }
        };
        let Some(produced) = self.guarded(|task, out| task.produce(max, out)) else {
            return;
        };
        self.metrics.add_records_in(produced.records as u64);
        self.send_outgoing();
        if produced.status == SourceStatus::Finished {
            self.end_of_input();
        }
        self.drive(ctx);
    }
}

impl Drop for SubtaskActor {
    fn drop(&mut self) {
        if matches!(
            self.state,
            Phase::Running | Phase::Draining | Phase::Waiting
        ) {
            self.supervisor.do_send(SubtaskFailed {
                subtask: self.id,
                error: TaskError::Protocol("subtask actor stopped before its input ended".into()),
            });
        }
    }
}
