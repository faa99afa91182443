//! Rescaling a running job, sans-IO, as Flink's adaptive scheduler takes
//! resource requirements: the parallelism asked for is declarative, and
//! the job gets there by the next attempt it deploys. The supervisor feeds
//! [`Rescales`] what happened and carries out what it decides; the rules,
//! each a test below:
//!
//! - Requirements name known operators, each within `1..=` its max
//!   parallelism, and keep forward edges between equal parallelisms;
//!   anything else is refused whole and changes nothing.
//! - A requirement that differs from what runs asks for a checkpoint of
//!   the running attempt; once it completes, that attempt is replaced by
//!   one at the new parallelism restored from it. Only one such checkpoint
//!   is asked for at a time; later requirements only change where it goes.
//! - Any new attempt (a failover's too) deploys at the parallelism last
//!   asked for, so a failure during a rescale does not lose it.
//! - A rescale's checkpoint that fails while the attempt goes on is asked
//!   for again (a subtask's failure may decline it before the failover
//!   that carries the rescale out); after [`CHECKPOINT_TRIES`] failures
//!   the rescale is given up: the job stays at its parallelism, and the
//!   history says why.
//! - A requirement equal to what runs while nothing is under way records
//!   nothing; one that brings a rescale under way back to what runs ends
//!   it as ignored.
//! - While a stop with a savepoint is under way, requirements are refused
//!   and no attempt is replaced; if the stop fails, the rescale asks for
//!   its checkpoint again.
//! - A rescale under way when the job ends ends with it, and so does one
//!   whose checkpoint ended the job's input.
//! - Requirements taken while a rescale deploys wait for it to run, then
//!   start a rescale of their own.
//! - The history keeps the newest rescales, each with when it was asked
//!   for, when the old attempt stopped and when the new one ran.

use crate::model::graph::{GraphError, JobGraph};
use crate::model::ids::{Attempt, OperatorId};
use std::collections::{BTreeMap, VecDeque};
use thiserror::Error;

/// Rescales kept in the history.
pub const KEPT: usize = 100;

/// Checkpoints a rescale asks for before it is given up.
pub const CHECKPOINT_TRIES: u32 = 3;

/// The parallelism asked for, by operator; operators not named keep theirs.
pub type Requirements = BTreeMap<OperatorId, u32>;

/// Why requirements were refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RescaleError {
    /// No operator of the job has this id.
    #[error("the job has no operator {0}")]
    UnknownOperator(OperatorId),
    /// The graph at the parallelism asked for does not validate.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// Without checkpoints, a new attempt would start without the state.
    #[error(
        "the job runs without checkpointing, so it cannot be rescaled without losing its state"
    )]
    NoCheckpointing,
    /// The job has ended.
    #[error("the job has ended")]
    Ended,
    /// A stop with a savepoint is under way.
    #[error("the job is stopping with a savepoint")]
    Stopping,
    /// Unaligned checkpoints capture records in flight on broadcast edges,
    /// which a restore cannot deal out to another number of consumers.
    #[error("the job takes unaligned checkpoints and has a broadcast edge, whose records in flight cannot be restored at another parallelism: take aligned checkpoints to rescale it")]
    UnalignedBroadcast,
}

/// Why a rescale began (Flink's `TriggerCause`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TriggerCause {
    /// New requirements arrived.
    UpdateRequirement,
}

/// How a rescale ended (Flink's `TerminatedReason`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RescaleEnd {
    /// The job runs at the new parallelism.
    Succeeded,
    /// Given up: the checkpoint to rescale from failed, for this reason.
    Failed(String),
    /// Requirements asked for the parallelism that runs before it was
    /// carried out.
    NoParallelismChange,
    /// The job ended before it was carried out.
    JobEnded,
}

impl RescaleEnd {
    /// Flink's `TerminalState` and `TerminatedReason`.
    pub fn flink_names(&self) -> (&'static str, &'static str) {
        match self {
            RescaleEnd::Succeeded => ("COMPLETED", "SUCCEEDED"),
            RescaleEnd::Failed(_) => ("FAILED", "EXCEPTION_OCCURRED"),
            RescaleEnd::NoParallelismChange => ("IGNORED", "NO_RESOURCES_OR_PARALLELISMS_CHANGE"),
            RescaleEnd::JobEnded => ("IGNORED", "JOB_FINISHED"),
        }
    }
}

/// One rescale of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rescale {
    /// Counts the job's rescales from 1.
    pub id: u64,
    /// Which requirements it carries out: counts them from 1.
    pub requirements: u64,
    /// Why it began.
    pub cause: TriggerCause,
    /// The parallelism of every operator before, indexed by operator.
    pub from: Vec<u32>,
    /// The parallelism asked for, indexed by operator.
    pub to: Vec<u32>,
    /// When it was asked for, in ms since the epoch.
    pub started_ms: u64,
    /// When the old attempt was told to stop.
    pub stopped_ms: Option<u64>,
    /// When it ended.
    pub ended_ms: Option<u64>,
    /// How it ended; `None` while under way.
    pub end: Option<RescaleEnd>,
}

impl Rescale {
    /// How long the job did not run: from the old attempt's stop to the
    /// new one running, in ms.
    pub fn pause_ms(&self) -> Option<u64> {
        Some(self.ended_ms?.saturating_sub(self.stopped_ms?))
    }
}

/// What the supervisor must do.
#[derive(Debug, PartialEq, Eq)]
pub enum RescaleAction {
    /// Take a checkpoint of `attempt` to rescale from; report it with
    /// [`Rescales::checkpointed`].
    Checkpoint(Attempt),
    /// Replace `attempt` by one at the new parallelism, restored from the
    /// checkpoint just completed.
    Replace(Attempt),
}

/// The parallelism a job runs at and is asked to run at, and its rescales.
#[derive(Debug, Default)]
pub struct Rescales {
    /// The graph deployed last, or about to be.
    deployed: JobGraph,
    /// The graph asked for.
    desired: JobGraph,
    /// The attempt running, if one is.
    running: Option<Attempt>,
    /// The attempt a rescale's checkpoint was asked of.
    checkpointing: Option<Attempt>,
    /// Checkpoints of the rescale under way that failed.
    failed_checkpoints: u32,
    /// A stop with a savepoint is under way.
    stopping: bool,
    /// Requirements taken so far.
    requirements: u64,
    history: VecDeque<Rescale>,
    /// Rescales so far.
    rescales: u64,
}

impl Rescales {
    /// A job about to deploy `graph`.
    pub fn new(graph: &JobGraph) -> Self {
        Rescales {
            deployed: graph.clone(),
            desired: graph.clone(),
            running: None,
            checkpointing: None,
            failed_checkpoints: 0,
            stopping: false,
            requirements: 0,
            history: VecDeque::new(),
            rescales: 0,
        }
    }

    /// The graph asked for: what the next attempt deploys.
    pub fn desired(&self) -> &JobGraph {
        &self.desired
    }

    /// The graph deployed last, or about to be.
    pub fn deployed(&self) -> &JobGraph {
        &self.deployed
    }

    /// The rescales kept, oldest first.
    pub fn history(&self) -> impl DoubleEndedIterator<Item = &Rescale> {
        self.history.iter()
    }

    /// Takes `requirements` at `now_ms`.
    pub fn require(
        &mut self,
        requirements: &Requirements,
        now_ms: u64,
    ) -> Result<Option<RescaleAction>, RescaleError> {
        if self.stopping {
            return Err(RescaleError::Stopping);
        }
        let mut desired = self.desired.clone();
        for (&operator, &parallelism) in requirements {
            desired
                .operators
                .get_mut(operator.0 as usize)
                .ok_or(RescaleError::UnknownOperator(operator))?
                .parallelism = parallelism;
        }
        desired.validate()?;
        self.requirements += 1;
        self.desired = desired;
        let to = parallelisms(&self.desired);
        let same = to == parallelisms(&self.deployed);
        let requirements_taken = self.requirements;
        match self.under_way() {
            // Deploying: the next attempt running ends it, then takes these.
            Some(open) if open.stopped_ms.is_some() => return Ok(None),
            Some(open) if same => {
                open.ended_ms = Some(now_ms);
                open.end = Some(RescaleEnd::NoParallelismChange);
                return Ok(None);
            }
            Some(open) => {
                open.to = to;
                open.requirements = requirements_taken;
            }
            None if same => return Ok(None),
            None => self.open(to, now_ms),
        }
        Ok(self.ask_for_checkpoint())
    }

    /// `attempt` runs (at the parallelism of [`Rescales::deploying`]).
    pub fn running(&mut self, attempt: Attempt, now_ms: u64) -> Option<RescaleAction> {
        self.running = Some(attempt);
        self.checkpointing = None;
        if let Some(open) = self.under_way().filter(|r| r.stopped_ms.is_some()) {
            open.ended_ms = Some(now_ms);
            open.end = Some(RescaleEnd::Succeeded);
        }
        // Requirements taken while it deployed.
        if self.under_way().is_none() && self.desired != self.deployed {
            self.open(parallelisms(&self.desired), now_ms);
        }
        self.ask_for_checkpoint()
    }

    /// The checkpoint asked of `attempt` completed, or failed with why.
    pub fn checkpointed(
        &mut self,
        attempt: Attempt,
        result: Result<(), String>,
        now_ms: u64,
    ) -> Option<RescaleAction> {
        if self.checkpointing != Some(attempt) || self.running != Some(attempt) {
            return None;
        }
        self.checkpointing = None;
        match result {
            Ok(()) if self.desired != self.deployed && !self.stopping => {
                Some(RescaleAction::Replace(attempt))
            }
            Ok(()) => None,
            Err(_) if self.failed_checkpoints + 1 < CHECKPOINT_TRIES => {
                self.failed_checkpoints += 1;
                self.ask_for_checkpoint()
            }
            Err(reason) => {
                self.desired = self.deployed.clone();
                if let Some(open) = self.under_way() {
                    open.ended_ms = Some(now_ms);
                    open.end = Some(RescaleEnd::Failed(reason));
                }
                None
            }
        }
    }

    /// The running attempt stops and the next one loads its state, after a
    /// rescale or a failure: the graph it deploys, and whether that is a
    /// new parallelism.
    pub fn deploying(&mut self, now_ms: u64) -> (&JobGraph, bool) {
        self.running = None;
        self.checkpointing = None;
        let rescaled = self.desired != self.deployed;
        if rescaled {
            self.deployed = self.desired.clone();
            if let Some(open) = self.under_way() {
                open.stopped_ms.get_or_insert(now_ms);
            }
        }
        (&self.deployed, rescaled)
    }

    /// A stop with a savepoint began.
    pub fn stop_began(&mut self) {
        self.stopping = true;
    }

    /// The stop with a savepoint failed and the job goes on: a rescale it
    /// held back asks for its checkpoint again.
    pub fn stop_failed(&mut self) -> Option<RescaleAction> {
        self.stopping = false;
        self.ask_for_checkpoint()
    }

    /// The checkpoint asked of `attempt` completed and ended the job's
    /// input: the job finishes at its parallelism, since a new attempt
    /// at another would replay its final output through other subtasks.
    pub fn input_ended(&mut self, attempt: Attempt, now_ms: u64) {
        if self.checkpointing == Some(attempt) {
            self.checkpointing = None;
            self.desired = self.deployed.clone();
            self.ended(now_ms);
        }
    }

    /// The job ended: a rescale under way never will be.
    pub fn ended(&mut self, now_ms: u64) {
        if let Some(open) = self.under_way() {
            open.ended_ms = Some(now_ms);
            open.end = Some(RescaleEnd::JobEnded);
        }
    }

    fn open(&mut self, to: Vec<u32>, now_ms: u64) {
        if self.history.len() == KEPT {
            self.history.pop_front();
        }
        self.rescales += 1;
        self.failed_checkpoints = 0;
        self.history.push_back(Rescale {
            id: self.rescales,
            requirements: self.requirements,
            cause: TriggerCause::UpdateRequirement,
            from: parallelisms(&self.deployed),
            to,
            started_ms: now_ms,
            stopped_ms: None,
            ended_ms: None,
            end: None,
        });
    }

    fn under_way(&mut self) -> Option<&mut Rescale> {
        self.history.back_mut().filter(|r| r.end.is_none())
    }

    fn ask_for_checkpoint(&mut self) -> Option<RescaleAction> {
        let running = self.running?;
        if self.checkpointing.is_some() || self.desired == self.deployed {
            return None;
        }
        self.checkpointing = Some(running);
        Some(RescaleAction::Checkpoint(running))
    }
}

fn parallelisms(graph: &JobGraph) -> Vec<u32> {
    graph.operators.iter().map(|o| o.parallelism).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::graph::{Edge, Partitioner};

    /// source → (hash) → count → (forward) → sink, all at parallelism 2.
    fn graph() -> JobGraph {
        let mut g = JobGraph::default();
        let source = g.add_operator("source", 2);
        let count = g.add_operator("count", 2);
        let sink = g.add_operator("sink", 2);
        for (from, to, partitioner) in [
            (source, count, Partitioner::Hash),
            (count, sink, Partitioner::Forward),
        ] {
            g.edges.push(Edge {
                from,
                to,
                partitioner,
                input: 0,
            });
        }
        g
    }

    fn all(parallelism: u32) -> Requirements {
        (0..3).map(|i| (OperatorId(i), parallelism)).collect()
    }

    /// A job whose attempt 0 runs.
    fn running() -> Rescales {
        let mut r = Rescales::new(&graph());
        r.deploying(0);
        assert_eq!(r.running(Attempt(0), 0), None);
        r
    }

    fn last(r: &Rescales) -> &Rescale {
        r.history().next_back().unwrap()
    }

    #[test]
    fn a_rescale_checkpoints_then_replaces_the_attempt_and_records_the_pause() {
        let mut r = running();
        let asked = r.require(&all(3), 10).unwrap();
        assert_eq!(asked, Some(RescaleAction::Checkpoint(Attempt(0))));
        assert_eq!(
            r.checkpointed(Attempt(0), Ok(()), 20),
            Some(RescaleAction::Replace(Attempt(0)))
        );
        let (graph, rescaled) = r.deploying(25);
        assert!(rescaled);
        assert!(graph.operators.iter().all(|o| o.parallelism == 3));
        assert_eq!(r.running(Attempt(1), 40), None);
        let done = last(&r);
        assert_eq!(
            (done.from.clone(), done.to.clone()),
            (vec![2; 3], vec![3; 3])
        );
        assert_eq!(done.end, Some(RescaleEnd::Succeeded));
        assert_eq!((done.started_ms, done.pause_ms()), (10, Some(15)));
    }

    #[test]
    fn refused_requirements_change_nothing() {
        let mut r = running();
        let unknown = Requirements::from([(OperatorId(7), 3)]);
        assert_eq!(
            r.require(&unknown, 1),
            Err(RescaleError::UnknownOperator(OperatorId(7)))
        );
        // count and sink are joined by a forward edge.
        let split = Requirements::from([(OperatorId(1), 3)]);
        assert!(matches!(
            r.require(&split, 1),
            Err(RescaleError::Graph(GraphError::ForwardParallelism { .. }))
        ));
        assert!(matches!(
            r.require(&all(0), 1),
            Err(RescaleError::Graph(GraphError::Parallelism { .. }))
        ));
        assert_eq!(r.desired(), &graph());
        assert_eq!(r.history().count(), 0);
    }

    #[test]
    fn one_checkpoint_at_a_time_and_the_last_requirement_wins() {
        let mut r = running();
        assert!(r.require(&all(3), 1).unwrap().is_some());
        assert_eq!(r.require(&all(4), 2).unwrap(), None);
        assert_eq!(
            r.checkpointed(Attempt(0), Ok(()), 3),
            Some(RescaleAction::Replace(Attempt(0)))
        );
        r.deploying(4);
        r.running(Attempt(1), 5);
        assert_eq!(r.history().count(), 1);
        assert_eq!(last(&r).to, vec![4; 3]);
        assert_eq!(last(&r).requirements, 2);
    }

    #[test]
    fn a_failover_during_a_rescale_deploys_the_new_parallelism() {
        let mut r = running();
        r.require(&all(1), 1).unwrap();
        // The attempt fails before its checkpoint completes: the failover
        // restarts at the parallelism asked for.
        let (graph, rescaled) = r.deploying(2);
        assert!(rescaled && graph.operators.iter().all(|o| o.parallelism == 1));
        // The checkpoint of the failed attempt is stale.
        assert_eq!(r.checkpointed(Attempt(0), Ok(()), 3), None);
        assert_eq!(r.running(Attempt(1), 4), None);
        assert_eq!(last(&r).end, Some(RescaleEnd::Succeeded));
    }

    #[test]
    fn requirements_taken_while_restarting_rescale_the_next_running_attempt() {
        let mut r = running();
        r.deploying(1);
        assert_eq!(r.require(&all(3), 2).unwrap(), None);
        assert_eq!(
            r.running(Attempt(1), 3),
            Some(RescaleAction::Checkpoint(Attempt(1)))
        );
        assert_eq!(last(&r).end, None);
    }

    #[test]
    fn failed_checkpoints_are_asked_for_again_then_give_the_rescale_up() {
        let mut r = running();
        r.require(&all(3), 1).unwrap();
        for _ in 1..CHECKPOINT_TRIES {
            assert_eq!(
                r.checkpointed(Attempt(0), Err("declined".into()), 2),
                Some(RescaleAction::Checkpoint(Attempt(0)))
            );
        }
        assert_eq!(last(&r).end, None);
        assert_eq!(r.checkpointed(Attempt(0), Err("declined".into()), 2), None);
        assert_eq!(last(&r).end, Some(RescaleEnd::Failed("declined".into())));
        assert_eq!(r.desired(), &graph());
        assert!(!r.deploying(3).1, "the next attempt keeps its parallelism");
    }

    #[test]
    fn asking_for_what_runs_records_nothing_or_ignores_the_rescale_under_way() {
        let mut r = running();
        assert_eq!(r.require(&all(2), 1).unwrap(), None);
        assert_eq!(r.history().count(), 0);
        r.require(&all(3), 2).unwrap();
        assert_eq!(r.require(&all(2), 3).unwrap(), None);
        assert_eq!(last(&r).end, Some(RescaleEnd::NoParallelismChange));
        // Its checkpoint completes with nothing left to do.
        assert_eq!(r.checkpointed(Attempt(0), Ok(()), 4), None);
        assert!(!r.deploying(5).1);
    }

    #[test]
    fn requirements_taken_while_a_rescale_deploys_start_the_next_once_it_runs() {
        let mut r = running();
        r.require(&all(3), 1).unwrap();
        r.checkpointed(Attempt(0), Ok(()), 2);
        r.deploying(3);
        assert_eq!(r.require(&all(4), 4).unwrap(), None);
        assert_eq!(
            r.running(Attempt(1), 5),
            Some(RescaleAction::Checkpoint(Attempt(1)))
        );
        let ends: Vec<_> = r.history().map(|r| (r.to.clone(), r.end.clone())).collect();
        assert_eq!(
            ends,
            [
                (vec![3; 3], Some(RescaleEnd::Succeeded)),
                (vec![4; 3], None)
            ]
        );
    }

    #[test]
    fn a_stop_with_a_savepoint_holds_rescales_back_until_it_fails() {
        let mut r = running();
        r.require(&all(3), 1).unwrap();
        r.stop_began();
        assert_eq!(r.require(&all(4), 2), Err(RescaleError::Stopping));
        // The checkpoint asked for before the stop completes meanwhile.
        assert_eq!(r.checkpointed(Attempt(0), Ok(()), 3), None);
        assert_eq!(r.stop_failed(), Some(RescaleAction::Checkpoint(Attempt(0))));
        assert_eq!(
            r.checkpointed(Attempt(0), Ok(()), 4),
            Some(RescaleAction::Replace(Attempt(0)))
        );
        assert_eq!(last(&r).to, vec![3; 3]);
    }

    #[test]
    fn a_checkpoint_that_ended_the_input_ends_the_rescale() {
        let mut r = running();
        r.require(&all(3), 1).unwrap();
        r.input_ended(Attempt(0), 2);
        assert_eq!(last(&r).end, Some(RescaleEnd::JobEnded));
        assert!(!r.deploying(3).1, "a failover after keeps the parallelism");
    }

    #[test]
    fn a_rescale_under_way_ends_with_the_job() {
        let mut r = running();
        r.require(&all(3), 1).unwrap();
        r.ended(2);
        assert_eq!(last(&r).end, Some(RescaleEnd::JobEnded));
        assert_eq!(last(&r).ended_ms, Some(2));
    }

    #[test]
    fn the_history_keeps_the_newest() {
        let mut r = running();
        for i in 0..KEPT as u64 + 5 {
            let p = 1 + (i % 2) as u32 * 2;
            r.require(&all(p), i).unwrap();
            r.checkpointed(Attempt(i as u32), Ok(()), i);
            r.deploying(i);
            r.running(Attempt(i as u32 + 1), i);
        }
        assert_eq!(r.history().count(), KEPT);
        assert_eq!(r.history().next().unwrap().id, 6);
    }
}
