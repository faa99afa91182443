//! The shell of a job's source coordinators (`tidemark_core::dataflow::source::
//! coordinator`): it feeds them the subtasks' split requests and the
//! discoveries it runs, and sends the splits they hand out.
//!
//! The host is the actor that injects the barriers, the checkpoint
//! coordinator, so that handing out a split and triggering a checkpoint
//! (its snapshot taken, its barriers sent) never interleave: that is what
//! makes a split either the coordinator's or the subtask's in a checkpoint,
//! never both or neither. A job without checkpoints has no coordinator
//! actor; its supervisor hosts them.

use crate::dataflow::subtask::SubtaskHandle;
use crate::messages::{AddSplits, NoMoreSplits, SplitRequest, SubtaskFailed};
use actix::{Actor, ActorFutureExt, AsyncContext, Context, WrapFuture};
use std::collections::HashMap;
use tidemark_core::dataflow::error::TaskError;
use tidemark_core::dataflow::source::coordinator::{
    lock, SharedSourceCoordinator, SourceAction, SourceEvent,
};
use tidemark_core::job::Job;
use tidemark_core::model::ids::{Attempt, OperatorId, SubtaskId, SubtaskIndex};

/// An actor hosting a [`SourceHost`].
pub trait HostsSources: Actor<Context = Context<Self>> {
    fn sources(&mut self) -> &mut SourceHost;

    /// A source coordinator failed: the attempt fails.
    fn source_failed(&mut self, failed: SubtaskFailed, ctx: &mut Context<Self>);
}

/// The source coordinators of a job, and the split source subtasks of its
/// current attempt. The default hosts none.
#[derive(Default)]
pub struct SourceHost {
    coordinators: HashMap<OperatorId, SharedSourceCoordinator>,
    /// The attempt started last; `None` before the first.
    attempt: Option<Attempt>,
    subtasks: HashMap<SubtaskId, SubtaskHandle>,
    /// Requests of an attempt not started here yet: its subtasks (on
    /// worker processes above all) may ask before the attempt is announced.
    early: Vec<SplitRequest>,
}

impl SourceHost {
    /// The host of `job`'s source coordinators.
    pub fn new(job: &Job) -> Self {
        SourceHost {
            coordinators: job.source_coordinators().iter().cloned().collect(),
            ..SourceHost::default()
        }
    }

    /// `attempt` runs `subtasks`: each coordinator starts it from the state
    /// restored last (or a fresh one).
    pub fn start<A: HostsSources>(
        act: &mut A,
        attempt: Attempt,
        subtasks: &[(SubtaskId, SubtaskHandle)],
        ctx: &mut Context<A>,
    ) {
        let host = act.sources();
        host.attempt = Some(attempt);
        host.subtasks = subtasks
            .iter()
            .filter(|(id, _)| host.coordinators.contains_key(&id.operator))
            .cloned()
            .collect();
        let mut started: Vec<(OperatorId, u32)> = Vec::new();
        for id in host.subtasks.keys() {
            match started.iter_mut().find(|(op, _)| *op == id.operator) {
                Some((_, parallelism)) => *parallelism += 1,
                None => started.push((id.operator, 1)),
            }
        }
        started.sort();
        for (source, parallelism) in started {
            Self::apply(act, source, SourceEvent::Started { parallelism }, ctx);
        }
        for request in std::mem::take(&mut act.sources().early) {
            Self::request(act, request, ctx);
        }
    }

    /// A subtask asks for a split: one of the current attempt is served,
    /// one of a later attempt waits for its start, and one of an earlier
    /// attempt is forgotten.
    pub fn request<A: HostsSources>(act: &mut A, request: SplitRequest, ctx: &mut Context<A>) {
        let host = act.sources();
        match host.attempt {
            Some(current) if current == request.attempt => {
                let subtask = request.subtask.index.0;
                let event = SourceEvent::SplitRequested { subtask };
                Self::apply(act, request.subtask.operator, event, ctx);
            }
            Some(current) if current > request.attempt => {}
            _ => host.early.push(request),
        }
    }

    fn apply<A: HostsSources>(
        act: &mut A,
        source: OperatorId,
        event: SourceEvent,
        ctx: &mut Context<A>,
    ) {
        let host = act.sources();
        let Some(coordinator) = host.coordinators.get(&source) else {
            return;
        };
        let handled = lock(coordinator).handle(event);
        match handled {
            Ok(actions) => {
                for action in actions {
                    Self::carry_out(act, source, action, ctx);
                }
            }
            Err(error) => {
                let failed = host.failure(source, error.to_string());
                act.source_failed(failed, ctx);
            }
        }
    }

    fn carry_out<A: HostsSources>(
        act: &mut A,
        source: OperatorId,
        action: SourceAction,
        ctx: &mut Context<A>,
    ) {
        let host = act.sources();
        let attempt = host.attempt;
        match action {
            SourceAction::Discover { state, parallelism } => {
                let discovery = lock(&host.coordinators[&source])
                    .enumerator()
                    .discover(&state, parallelism);
                ctx.spawn(discovery.into_actor(act).map(move |found, act, ctx| {
                    if act.sources().attempt != attempt {
                        return;
                    }
                    match found {
                        Ok((splits, state)) => {
                            let event = SourceEvent::Discovered { splits, state };
                            Self::apply(act, source, event, ctx);
                        }
                        Err(e) => {
                            let error = format!("split discovery failed: {e}");
                            let failed = act.sources().failure(source, error);
                            act.source_failed(failed, ctx);
                        }
                    }
                }));
            }
            SourceAction::DiscoverAfter(wait) => {
                ctx.run_later(wait, move |act, ctx| {
                    if act.sources().attempt == attempt {
                        Self::apply(act, source, SourceEvent::DiscoveryDue, ctx);
                    }
                });
            }
            SourceAction::Assign { subtask, splits } => {
                host.send(source, subtask, AddSplits(splits));
            }
            SourceAction::NoMoreSplits { subtask } => host.send(source, subtask, NoMoreSplits),
        }
    }

    fn send<M>(&self, source: OperatorId, subtask: u32, message: M)
    where
        M: crate::messages::ToSubtask,
        crate::dataflow::subtask::SubtaskActor: actix::Handler<M>,
    {
        let id = SubtaskId {
            operator: source,
            index: SubtaskIndex(subtask),
        };
        if let Some(handle) = self.subtasks.get(&id) {
            handle.send(message);
        }
    }

    /// The failure of the attempt, in the name of the source's first
    /// subtask.
    fn failure(&self, source: OperatorId, error: String) -> SubtaskFailed {
        SubtaskFailed {
            attempt: self.attempt.unwrap_or_default(),
            subtask: SubtaskId {
                operator: source,
                index: SubtaskIndex(0),
            },
            error: TaskError::Source(error.into()),
        }
    }
}
