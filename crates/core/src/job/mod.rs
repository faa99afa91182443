//! The typed job builder. It checks record types at compile time, chains
//! stateless steps into the operator before them, and cuts a new operator at
//! every shuffle (`key_by`, `rebalance`, `broadcast`), at every union and at
//! every two-input operator. What it produces, a `Job`, is the untyped
//! `JobGraph` plus one task factory per operator: the runtime needs nothing
//! else to deploy it.
//!
//! A job is a DAG: a [`JobBuilder`] is a handle that every stream of the job
//! shares, so that sources, streams and sinks can be added in any order; a
//! stream read twice fans out (every reader gets every record).

use crate::checkpoint::coordinator::MasterHook;
use crate::checkpoint::CheckpointConfig;
use crate::cluster::fault::{Fault, KillSchedule, SlowSubtask};
use crate::cluster::restart::RestartStrategy;
use crate::dataflow::source::coordinator::{
    SharedSourceCoordinator, SourceCoordinator, SourceHook,
};
use crate::dataflow::source::splits::ErasedEnumerator;
use crate::dataflow::task::{Task, TaskContext};
use crate::model::batch::BatchLimits;
use crate::model::channel::ChannelConfig;
use crate::model::graph::{GraphError, JobGraph, Partitioner};
use crate::model::ids::OperatorId;
use crate::state::StateBackend;
use std::sync::{Arc, Mutex};
use thiserror::Error;

mod async_io;
mod broadcast;
mod connect;
pub mod join;
mod stream;
mod window;
pub mod window_operator;

pub use broadcast::{BroadcastConnectedStreams, BroadcastStream, KeyedBroadcastConnectedStreams};
pub use connect::{Connectable, ConnectedStreams, IntervalJoinBuilder, KeyedConnectedStreams};
pub use stream::{KeyedStream, Stream};
pub use window::WindowedStream;

/// Builds the task of one subtask of an operator.
pub type TaskFactory = Arc<dyn Fn(&TaskContext) -> Box<dyn Task> + Send + Sync>;

/// Runtime settings that belong to the job rather than to one operator.
///
/// `JobConfig::default()` runs without checkpoints; the setters build the
/// rest in a few lines, and `tidemark_cli::config::load` reads the same
/// settings from a Flink-style YAML file:
///
/// ```
/// use std::time::Duration;
/// use tidemark_core::checkpoint::CheckpointConfig;
/// use tidemark_core::job::JobConfig;
/// use tidemark_core::cluster::restart::RestartStrategy;
///
/// let config = JobConfig::default()
///     .parallelism(4)
///     .checkpointing(CheckpointConfig::new("./tidemark-data/checkpoints").retain(3))
///     .restart(RestartStrategy::FixedDelay {
///         delay: Duration::from_secs(1),
///         max_attempts: 3,
///     });
/// assert_eq!(config.checkpointing.unwrap().policy.retain, 3);
/// ```
#[derive(Clone, Debug)]
pub struct JobConfig {
    /// Parallelism of operators that do not set their own: 1 unless set,
    /// as Flink's `parallelism.default`; the host's cores are the caller's
    /// to read (`tidemark run` defaults to them).
    pub parallelism: u32,
    /// How many records and bytes a batch carries at most.
    pub batch_limits: BatchLimits,
    /// Credits per channel, which bound the memory of in-flight batches.
    pub channels: ChannelConfig,
    /// Total records per second over all source subtasks.
    pub source_rate: Option<f64>,
    /// `None`: no checkpoints, and a failure fails the job.
    pub checkpointing: Option<CheckpointConfig>,
    /// What the supervisor does when the job fails.
    pub restart: RestartStrategy,
    /// Seeded kills of random subtasks during the run.
    pub kills: Option<KillSchedule>,
    /// Targeted failures at given steps of given checkpoints, for tests.
    pub faults: Vec<Fault>,
    /// A subtask slowed down on purpose, to build backpressure in tests.
    pub slow: Option<SlowSubtask>,
    /// Where keyed operators keep their state.
    pub state_backend: StateBackend,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            parallelism: 1,
            batch_limits: BatchLimits::default(),
            channels: ChannelConfig::default(),
            source_rate: None,
            checkpointing: None,
            restart: RestartStrategy::default(),
            kills: None,
            faults: Vec::new(),
            slow: None,
            state_backend: StateBackend::Heap,
        }
    }
}

/// Consuming setters, so that a configuration is one expression. The
/// fault-injection fields (`kills`, `faults`, `slow`), set by tests and by
/// `tidemark run`'s failure injection, have none.
impl JobConfig {
    /// Where restores download native checkpoints: the embedded store's
    /// local directory, whose databases take the files over; none on the
    /// heap.
    pub fn local_dir(&self) -> Option<&std::path::Path> {
        match &self.state_backend {
            StateBackend::Heap => None,
            StateBackend::Embedded { store, .. } => Some(store.local_dir()),
        }
    }

    /// Whether a restore may leave state of the checkpoint unclaimed.
    pub fn allows_non_restored_state(&self) -> bool {
        self.checkpointing
            .as_ref()
            .is_some_and(|c| c.allow_non_restored_state)
    }

    /// Parallelism of operators that do not set their own.
    pub fn parallelism(mut self, parallelism: u32) -> Self {
        self.parallelism = parallelism;
        self
    }

    /// How many records and bytes a batch carries at most.
    pub fn batch_limits(mut self, limits: BatchLimits) -> Self {
        self.batch_limits = limits;
        self
    }

    /// Credits per channel.
    pub fn channels(mut self, channels: ChannelConfig) -> Self {
        self.channels = channels;
        self
    }

    /// Caps the total rate of all source subtasks, in records per second:
    /// a positive, finite number.
    pub fn source_rate(mut self, records_per_second: f64) -> Self {
        self.source_rate = Some(records_per_second);
        self
    }

    /// Turns checkpoints on.
    pub fn checkpointing(mut self, settings: CheckpointConfig) -> Self {
        self.checkpointing = Some(settings);
        self
    }

    /// What the supervisor does when the job fails.
    pub fn restart(mut self, strategy: RestartStrategy) -> Self {
        self.restart = strategy;
        self
    }

    /// Where keyed operators keep their state.
    pub fn state_backend(mut self, backend: StateBackend) -> Self {
        self.state_backend = backend;
        self
    }

    /// Refuses settings no job runs with; the parallelism is the graph's
    /// to check ([`Job::validate`]).
    pub fn validate(&self) -> Result<(), JobConfigError> {
        match self.source_rate {
            Some(rate) if !(rate.is_finite() && rate > 0.0) => {
                Err(JobConfigError::SourceRate(rate))
            }
            _ => Ok(()),
        }
    }
}

/// A [`JobConfig`] no job runs with.
#[derive(Clone, Copy, Debug, PartialEq, Error)]
pub enum JobConfigError {
    /// The source rate is not a positive, finite number.
    #[error("the source rate must be a positive number of records per second, not {0}")]
    SourceRate(f64),
}

/// A complete, deployable job.
pub struct Job {
    /// Names the job's directory in checkpoint storage, so it must stay the
    /// same across the runs that restore each other.
    pub name: String,
    /// The operators and edges, untyped: what restores and rescales match.
    pub graph: JobGraph,
    /// The job's runtime settings.
    pub config: JobConfig,
    tasks: Vec<TaskFactory>,
    master_hooks: Vec<Box<dyn MasterHook>>,
    /// The coordinators of its split sources, by operator.
    source_coordinators: Vec<(OperatorId, SharedSourceCoordinator)>,
}

impl Job {
    /// Starts a job named `name`; see [`Job::name`].
    pub fn builder(name: &str) -> JobBuilder {
        JobBuilder {
            inner: Arc::new(Mutex::new(Building {
                name: name.to_owned(),
                config: JobConfig::default(),
                graph: JobGraph::default(),
                tasks: Vec::new(),
                master_hooks: Vec::new(),
                split_enumerators: Vec::new(),
                adaptive: Vec::new(),
                sinks: Vec::new(),
            })),
        }
    }

    /// The master hooks, handed once to the coordinator actor, which runs
    /// them when the checkpoint coordinator asks.
    pub fn take_master_hooks(&mut self) -> Vec<Box<dyn MasterHook>> {
        std::mem::take(&mut self.master_hooks)
    }

    /// The coordinators of its split sources, by operator; their master
    /// hooks are among [`take_master_hooks`](Self::take_master_hooks).
    pub fn source_coordinators(&self) -> &[(OperatorId, SharedSourceCoordinator)] {
        &self.source_coordinators
    }

    /// What deploys a subtask of `operator`.
    pub fn task_factory(&self, operator: OperatorId) -> &TaskFactory {
        &self.tasks[operator.0 as usize]
    }

    /// Refuses a graph the runtime cannot deploy, before anything starts.
    pub fn validate(&self) -> Result<(), GraphError> {
        self.graph.validate()
    }
}

/// Builds a [`Job`]: the job's settings, then its sources, the operators
/// downstream of them and its sinks, then [`build`](Self::build). The
/// settings' setters are [`JobConfig`]'s. Every stream of the job holds a
/// clone of this handle.
#[derive(Clone)]
pub struct JobBuilder {
    inner: Arc<Mutex<Building>>,
}

/// The job as far as it is built.
struct Building {
    name: String,
    config: JobConfig,
    graph: JobGraph,
    tasks: Vec<TaskFactory>,
    master_hooks: Vec<Box<dyn MasterHook>>,
    /// The enumerators of its split sources, by operator.
    split_enumerators: Vec<(OperatorId, Arc<dyn ErasedEnumerator>)>,
    /// Edges (by index) that are forward if both ends end up with one
    /// parallelism and rebalance otherwise, as Flink picks for a union or
    /// a connect: the parallelism may be set after the edge is made.
    adaptive: Vec<usize>,
    /// Sinks chained into each operator so far.
    sinks: Vec<usize>,
}

impl JobBuilder {
    fn with<R>(&self, f: impl FnOnce(&mut Building) -> R) -> R {
        f(&mut self
            .inner
            .lock()
            .expect("a job builder is not shared across a panic"))
    }

    fn configure(self, f: impl FnOnce(JobConfig) -> JobConfig) -> Self {
        self.with(|b| b.config = f(b.config.clone()));
        self
    }

    /// Replaces every setting, including those set before; call it first.
    pub fn config(self, config: JobConfig) -> Self {
        self.configure(|_| config)
    }

    /// See [`JobConfig::parallelism`]; operators added afterwards get it.
    pub fn parallelism(self, parallelism: u32) -> Self {
        self.configure(|c| c.parallelism(parallelism))
    }

    /// See [`JobConfig::batch_limits`].
    pub fn batch_limits(self, limits: BatchLimits) -> Self {
        self.configure(|c| c.batch_limits(limits))
    }

    /// See [`JobConfig::channels`].
    pub fn channels(self, channels: ChannelConfig) -> Self {
        self.configure(|c| c.channels(channels))
    }

    /// Code run on every checkpoint's trigger, before its barriers go out,
    /// and on every restore.
    pub fn master_hook(self, hook: impl MasterHook + 'static) -> Self {
        self.with(|b| b.master_hooks.push(Box::new(hook)));
        self
    }

    /// See [`JobConfig::checkpointing`].
    pub fn checkpointing(self, settings: CheckpointConfig) -> Self {
        self.configure(|c| c.checkpointing(settings))
    }

    /// See [`JobConfig::source_rate`].
    pub fn source_rate(self, records_per_second: f64) -> Self {
        self.configure(|c| c.source_rate(records_per_second))
    }

    /// See [`JobConfig::restart`].
    pub fn restart(self, strategy: RestartStrategy) -> Self {
        self.configure(|c| c.restart(strategy))
    }

    /// See [`JobConfig::state_backend`].
    pub fn state_backend(self, backend: StateBackend) -> Self {
        self.configure(|c| c.state_backend(backend))
    }

    /// The job as built so far. Edges of unions and connects become
    /// forward where both ends have one parallelism, rebalance otherwise.
    /// Streams still held afterwards add nothing to it.
    pub fn build(self) -> Job {
        self.with(|b| {
            let mut graph = std::mem::take(&mut b.graph);
            for &e in &b.adaptive {
                let edge = &mut graph.edges[e];
                let (from, to) = (
                    graph.operators[edge.from.0 as usize].parallelism,
                    graph.operators[edge.to.0 as usize].parallelism,
                );
                edge.partitioner = if from == to {
                    Partitioner::Forward
                } else {
                    Partitioner::Rebalance
                };
            }
            let mut master_hooks = std::mem::take(&mut b.master_hooks);
            let mut source_coordinators = Vec::new();
            for (op, enumerator) in std::mem::take(&mut b.split_enumerators) {
                let uid = &graph.operators[op.0 as usize].uid;
                let coordinator = Arc::new(Mutex::new(SourceCoordinator::new(uid, enumerator)));
                master_hooks.push(Box::new(SourceHook::new(coordinator.clone())));
                source_coordinators.push((op, coordinator));
            }
            Job {
                name: b.name.clone(),
                graph,
                config: b.config.clone(),
                tasks: std::mem::take(&mut b.tasks),
                master_hooks,
                source_coordinators,
            }
        })
    }

    /// Registers the enumerator of the split source `op`.
    fn add_split_enumerator(&self, op: OperatorId, enumerator: Arc<dyn ErasedEnumerator>) {
        self.with(|b| b.split_enumerators.push((op, enumerator)));
    }

    /// Adds an operator whose subtasks `task` builds.
    fn add_operator(&self, name: &str, task: TaskFactory) -> OperatorId {
        self.with(|b| {
            b.tasks.push(task);
            b.sinks.push(0);
            b.graph.add_operator(name, b.config.parallelism)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_rate_must_be_positive_and_finite() {
        for rate in [0.0, -0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let refused = JobConfig::default().source_rate(rate).validate();
            assert!(
                matches!(refused, Err(JobConfigError::SourceRate(r)) if r.to_bits() == rate.to_bits()),
                "{rate}: {refused:?}"
            );
        }
        for rate in [f64::MIN_POSITIVE, 1e-300, 1.0, f64::MAX] {
            assert_eq!(JobConfig::default().source_rate(rate).validate(), Ok(()));
        }
        assert_eq!(JobConfig::default().validate(), Ok(()));
    }
}
