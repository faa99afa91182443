//! The typed job builder. It checks record types at compile time, chains
//! stateless steps into the operator before them, and cuts a new operator at
//! every shuffle (`key_by`, `rebalance`, `broadcast`). What it produces, a
//! `Job`, is the untyped `JobGraph` plus one task factory per operator: the
//! runtime needs nothing else to deploy it.

use crate::batch::{BatchLimits, Data};
use crate::channel::ChannelConfig;
use crate::checkpoint::coordinator::MasterHook;
use crate::checkpoint::CheckpointSettings;
use crate::fault::{Fault, KillSchedule, SlowSubtask};
use crate::graph::{Edge, GraphError, JobGraph, Partitioner};
use crate::ids::OperatorId;
use crate::key_group::key_group_of;
use crate::operator::{
    Collector, Downstream, KeyedFunctionFactory, KeyedProcess, KeyedProcessFunction, RecordWriter,
    Route, SinkWriter, Stateless,
};
use crate::restart::RestartStrategy;
use crate::sink::{Sink, SinkContext};
use crate::source::{Source, SourceContext};
use crate::state::{Key, KeyedStateBackend, StateBackend, StateRegistrar};
use crate::task::{ChainTask, OutputContext, Task, TaskContext};
use crate::time::window::{LateData, WindowOperator, WindowSettings};
use crate::time::{AggregateFunction, TimeWindow, Timestamped, WatermarkStrategy, WindowAssigner};
use std::sync::Arc;
use std::time::Duration;

/// Builds the task of one subtask of an operator.
pub type TaskFactory = Arc<dyn Fn(&TaskContext) -> Box<dyn Task> + Send + Sync>;

/// Builds the part of a chain before a given downstream.
type ChainFactory<T> =
    Arc<dyn Fn(&TaskContext, Box<dyn Downstream<T>>) -> Box<dyn Task> + Send + Sync>;

/// Runtime settings that belong to the job rather than to one operator.
///
/// `JobConfig::default()` runs without checkpoints; the setters build the
/// rest in a few lines, and `tidemark_actors::config::load` reads the same
/// settings from a Flink-style YAML file:
///
/// ```
/// use std::time::Duration;
/// use tidemark::checkpoint::CheckpointSettings;
/// use tidemark::job::JobConfig;
/// use tidemark::restart::RestartStrategy;
///
/// let config = JobConfig::default()
///     .parallelism(4)
///     .checkpointing(CheckpointSettings::new("./tidemark-data/checkpoints").retain(3))
///     .restart(RestartStrategy::FixedDelay {
///         delay: Duration::from_secs(1),
///         max_attempts: 3,
///     });
/// assert_eq!(config.checkpointing.unwrap().config.retain, 3);
/// ```
#[derive(Clone, Debug)]
pub struct JobConfig {
    /// Parallelism of operators that do not set their own.
    pub parallelism: u32,
    /// How many records and bytes a batch carries at most.
    pub batch_limits: BatchLimits,
    /// Credits per channel, which bound the memory of in-flight batches.
    pub channels: ChannelConfig,
    /// Total records per second over all source subtasks.
    pub source_rate: Option<f64>,
    /// `None`: no checkpoints, and a failure fails the job.
    pub checkpointing: Option<CheckpointSettings>,
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
            parallelism: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
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

    /// Caps the total rate of all source subtasks, in records per second.
    pub fn source_rate(mut self, records_per_second: f64) -> Self {
        self.source_rate = Some(records_per_second);
        self
    }

    /// Turns checkpoints on.
    pub fn checkpointing(mut self, settings: CheckpointSettings) -> Self {
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
}

impl Job {
    /// Starts a job named `name`; see [`Job::name`].
    pub fn builder(name: &str) -> JobBuilder {
        JobBuilder {
            name: name.to_owned(),
            config: JobConfig::default(),
            graph: JobGraph::default(),
            tasks: Vec::new(),
            master_hooks: Vec::new(),
        }
    }

    /// The master hooks, handed once to the checkpoint coordinator.
    pub fn take_master_hooks(&mut self) -> Vec<Box<dyn MasterHook>> {
        std::mem::take(&mut self.master_hooks)
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

/// Builds a [`Job`]: the job's settings, then its sources and the operators
/// downstream of them. The settings' setters are [`JobConfig`]'s.
pub struct JobBuilder {
    name: String,
    config: JobConfig,
    graph: JobGraph,
    tasks: Vec<Option<TaskFactory>>,
    master_hooks: Vec<Box<dyn MasterHook>>,
}

impl JobBuilder {
    /// Replaces every setting, including those set before; call it first.
    pub fn config(mut self, config: JobConfig) -> Self {
        self.config = config;
        self
    }

    /// See [`JobConfig::parallelism`]; operators added afterwards get it.
    pub fn parallelism(mut self, parallelism: u32) -> Self {
        self.config = self.config.parallelism(parallelism);
        self
    }

    /// See [`JobConfig::batch_limits`].
    pub fn batch_limits(mut self, limits: BatchLimits) -> Self {
        self.config = self.config.batch_limits(limits);
        self
    }

    /// See [`JobConfig::channels`].
    pub fn channels(mut self, channels: ChannelConfig) -> Self {
        self.config = self.config.channels(channels);
        self
    }

    /// Code the checkpoint coordinator runs on every trigger and restore.
    pub fn master_hook(mut self, hook: impl MasterHook + 'static) -> Self {
        self.master_hooks.push(Box::new(hook));
        self
    }

    /// See [`JobConfig::checkpointing`].
    pub fn checkpointing(mut self, settings: CheckpointSettings) -> Self {
        self.config = self.config.checkpointing(settings);
        self
    }

    /// See [`JobConfig::source_rate`].
    pub fn source_rate(mut self, records_per_second: f64) -> Self {
        self.config = self.config.source_rate(records_per_second);
        self
    }

    /// See [`JobConfig::restart`].
    pub fn restart(mut self, strategy: RestartStrategy) -> Self {
        self.config = self.config.restart(strategy);
        self
    }

    /// See [`JobConfig::state_backend`].
    pub fn state_backend(mut self, backend: StateBackend) -> Self {
        self.config = self.config.state_backend(backend);
        self
    }

    fn add_operator(&mut self, name: &str) -> OperatorId {
        self.tasks.push(None);
        self.graph.add_operator(name, self.config.parallelism)
    }

    /// Adds a source operator; `factory` builds each subtask's source at
    /// the position it resumes from.
    pub fn source<T, S, F>(self, name: &str, factory: F) -> Stream<T>
    where
        T: Data,
        S: Source<T> + 'static,
        F: Fn(SourceContext) -> S + Send + Sync + 'static,
    {
        self.source_task(name, factory, |source, _, next| {
            Box::new(ChainTask::source(source, next))
        })
    }

    /// Adds a source operator whose records carry event timestamps, with
    /// watermarks after `strategy` (Flink's `fromSource` with a
    /// `WatermarkStrategy`). Its watermark state is checkpointed with its
    /// position, and the end of its input emits the final watermark.
    pub fn source_with_watermarks<T, S, F>(
        self,
        name: &str,
        strategy: WatermarkStrategy,
        factory: F,
    ) -> Stream<T>
    where
        T: Data + Timestamped,
        S: Source<T> + 'static,
        F: Fn(SourceContext) -> S + Send + Sync + 'static,
    {
        self.source_task(name, factory, move |source, ctx, next| {
            let metrics = ctx.time_metrics.clone();
            Box::new(ChainTask::source_with_watermarks(
                source, strategy, metrics, next,
            ))
        })
    }

    /// A source operator whose subtasks `head` builds around the source
    /// `factory` opens where the subtask resumes.
    fn source_task<T, S, F, H>(mut self, name: &str, factory: F, head: H) -> Stream<T>
    where
        T: Data,
        S: Source<T> + 'static,
        F: Fn(SourceContext) -> S + Send + Sync + 'static,
        H: Fn(Box<dyn Source<T>>, &TaskContext, Box<dyn Downstream<T>>) -> Box<dyn Task>
            + Send
            + Sync
            + 'static,
    {
        let op = self.add_operator(name);
        Stream {
            job: self,
            op,
            build: Arc::new(move |ctx, next| {
                let source = factory(SourceContext {
                    subtask: ctx.subtask,
                    parallelism: ctx.parallelism,
                    start: ctx.source_position.clone(),
                });
                head(Box::new(source), ctx, next)
            }),
        }
    }
}

/// A stream of `T` inside the operator being built.
pub struct Stream<T> {
    job: JobBuilder,
    op: OperatorId,
    build: ChainFactory<T>,
}

impl<T: Data> Stream<T> {
    /// Names the current operator (the chain since the last shuffle).
    pub fn name(mut self, name: &str) -> Self {
        self.job.graph.operator_mut(self.op).name = name.to_owned();
        self
    }

    /// Sets the stable identity of the current operator.
    pub fn uid(mut self, uid: &str) -> Self {
        self.job.graph.operator_mut(self.op).uid = uid.to_owned();
        self
    }

    /// Sets the parallelism of the current operator, its whole chain.
    pub fn parallelism(mut self, parallelism: u32) -> Self {
        self.job.graph.operator_mut(self.op).parallelism = parallelism;
        self
    }

    /// Sets the current operator's number of key groups, the most subtasks
    /// its state can ever be rescaled to; it must stay the same across the
    /// runs that restore each other.
    pub fn max_parallelism(mut self, max_parallelism: u32) -> Self {
        self.job.graph.operator_mut(self.op).max_parallelism = max_parallelism;
        self
    }

    fn then<O, F>(self, f: F) -> Stream<O>
    where
        O: Data,
        F: FnMut(T, &mut Collector<'_, O>) + Clone + Send + Sync + 'static,
    {
        let build = self.build;
        Stream {
            job: self.job,
            op: self.op,
            build: Arc::new(move |ctx, next| build(ctx, Box::new(Stateless::new(f.clone(), next)))),
        }
    }

    /// One record out per record in, chained into the current operator.
    pub fn map<O, F>(self, mut f: F) -> Stream<O>
    where
        O: Data,
        F: FnMut(T) -> O + Clone + Send + Sync + 'static,
    {
        self.then(move |record, out| out.collect(f(record)))
    }

    /// Keeps the records `f` accepts, chained into the current operator.
    pub fn filter<F>(self, mut f: F) -> Stream<T>
    where
        F: FnMut(&T) -> bool + Clone + Send + Sync + 'static,
    {
        self.then(move |record, out| {
            if f(&record) {
                out.collect(record)
            }
        })
    }

    /// Any number of records out per record in, chained into the current
    /// operator.
    pub fn flat_map<O, I, F>(self, mut f: F) -> Stream<O>
    where
        O: Data,
        I: IntoIterator<Item = O>,
        F: FnMut(T) -> I + Clone + Send + Sync + 'static,
    {
        self.then(move |record, out| {
            for o in f(record) {
                out.collect(o)
            }
        })
    }

    /// Ends the current operator with a record writer on a new edge and
    /// starts the next operator, which reads that edge.
    fn shuffle(
        mut self,
        partitioner: Partitioner,
        name: &str,
        route: impl Fn(&OutputContext) -> Route<T> + Send + Sync + 'static,
    ) -> (JobBuilder, OperatorId) {
        let build = self.build;
        let task: TaskFactory = Arc::new(move |ctx| {
            let out = ctx
                .output
                .expect("an operator that feeds an edge is deployed with its output");
            let per_batch = ctx.batch_limits.records_of::<T>();
            build(
                ctx,
                Box::new(RecordWriter::new(route(&out), out.channels, per_batch)),
            )
        });
        self.job.tasks[self.op.0 as usize] = Some(task);
        let next = self.job.add_operator(name);
        self.job.graph.edges.push(Edge {
            from: self.op,
            to: next,
            partitioner,
        });
        (self.job, next)
    }

    fn input_stream(job: JobBuilder, op: OperatorId) -> Stream<T> {
        Stream {
            job,
            op,
            build: Arc::new(|_, next| Box::new(ChainTask::input(next))),
        }
    }

    /// Spreads records round robin over the next operator's subtasks.
    pub fn rebalance(self) -> Stream<T> {
        let (job, op) = self.shuffle(Partitioner::Rebalance, "rebalance", |_| Route::Rebalance);
        Self::input_stream(job, op)
    }

    /// Sends every record to every subtask of the next operator.
    pub fn broadcast(self) -> Stream<T> {
        let (job, op) = self.shuffle(Partitioner::Broadcast, "broadcast", |_| Route::Broadcast);
        Self::input_stream(job, op)
    }

    /// Partitions by key: every record of a key reaches the same subtask,
    /// the one owning the key's key group.
    pub fn key_by<K, F>(self, key_of: F) -> KeyedStream<K, T>
    where
        K: Key,
        F: Fn(&T) -> K + Send + Sync + 'static,
    {
        KeyedStream {
            stream: self,
            key_of: Arc::new(key_of),
        }
    }

    /// Ends the job in a sink, chained to the current operator.
    pub fn sink<S, F>(mut self, name: &str, factory: F) -> Job
    where
        S: Sink<T> + 'static,
        F: Fn(SinkContext) -> S + Send + Sync + 'static,
    {
        let build = self.build;
        self.job.tasks[self.op.0 as usize] = Some(Arc::new(move |ctx| {
            let sink = factory(SinkContext {
                subtask: ctx.subtask,
                parallelism: ctx.parallelism,
            });
            build(ctx, Box::new(SinkWriter::new(Box::new(sink))))
        }));
        let name_of_chain = &mut self.job.graph.operator_mut(self.op).name;
        *name_of_chain = format!("{name_of_chain} -> {name}");
        Job {
            name: self.job.name,
            graph: self.job.graph,
            config: self.job.config,
            tasks: self
                .job
                .tasks
                .into_iter()
                .map(|t| t.expect("every operator before the sink feeds an edge"))
                .collect(),
            master_hooks: self.job.master_hooks,
        }
    }
}

/// A stream partitioned by key, waiting for the keyed function that reads it.
pub struct KeyedStream<K, T> {
    stream: Stream<T>,
    key_of: Arc<dyn Fn(&T) -> K + Send + Sync>,
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Runs a keyed function in a new operator; `factory` builds each
    /// subtask's instance and declares its states.
    pub fn process<O, P, F>(self, name: &str, factory: F) -> Stream<O>
    where
        O: Data,
        P: KeyedProcessFunction<K, T, O> + 'static,
        F: Fn(&mut StateRegistrar<'_, K>) -> P + Send + Sync + 'static,
    {
        let key_of = self.key_of;
        let route_key = key_of.clone();
        let (job, op) = self.stream.shuffle(Partitioner::Hash, name, move |out| {
            let key_of = route_key.clone();
            let max_parallelism = out.consumer_max_parallelism;
            Route::hash(
                Arc::new(move |record| key_group_of(&key_of(record), max_parallelism)),
                out.consumer_parallelism,
                max_parallelism,
            )
        });
        let factory: KeyedFunctionFactory<K, T, O> =
            Arc::new(move |states| Box::new(factory(states)));
        Stream {
            job,
            op,
            build: Arc::new(move |ctx, next| {
                let states = KeyedStateBackend::new(
                    &ctx.state_backend,
                    &format!("{op}-{}", ctx.subtask.0),
                    ctx.key_groups,
                    ctx.max_parallelism,
                );
                let process = KeyedProcess::new(
                    key_of.clone(),
                    &factory,
                    states,
                    ctx.time_metrics.clone(),
                    next,
                );
                let (key_of, owned, max_parallelism) =
                    (key_of.clone(), ctx.key_groups, ctx.max_parallelism);
                let owns = Arc::new(move |record: &T| {
                    owned.contains(key_group_of(&key_of(record), max_parallelism))
                });
                Box::new(ChainTask::keyed_input(Box::new(process), owns))
            }),
        }
    }
}

impl<K: Key, T: Data + Timestamped> KeyedStream<K, T> {
    /// Groups each key's records into the windows of `assigner`.
    pub fn window(self, assigner: WindowAssigner) -> WindowedStream<K, T> {
        WindowedStream {
            keyed: self,
            assigner,
            settings: WindowSettings::default(),
        }
    }
}

/// A keyed stream cut into windows, waiting for its aggregation.
pub struct WindowedStream<K, T> {
    keyed: KeyedStream<K, T>,
    assigner: WindowAssigner,
    settings: WindowSettings,
}

impl<K: Key, T: Data + Timestamped> WindowedStream<K, T> {
    /// Keeps event-time windows open for late records this long after their
    /// end (default 0); each late record fires its window again.
    pub fn allowed_lateness(mut self, lateness: Duration) -> Self {
        self.settings.allowed_lateness = u64::try_from(lateness.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Also fires every open event-time window every `every` of processing
    /// time (at least 1 ms), before the watermark fires it for good.
    pub fn early_firing(mut self, every: Duration) -> Self {
        self.settings.early_firing =
            Some(u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1));
        self
    }

    /// Aggregates each window with `aggregate` and emits, when it fires,
    /// what `emit` makes of the key, the window and the result. Records too
    /// late for every window are dropped and counted.
    pub fn aggregate<A, O, E>(self, name: &str, aggregate: A, emit: E) -> Stream<O>
    where
        A: AggregateFunction<T>,
        O: Data,
        E: Fn(&K, &TimeWindow, A::Result, &mut Collector<'_, O>) + Send + Sync + 'static,
    {
        self.build(name, aggregate, emit, None)
    }

    /// As [`aggregate`](Self::aggregate), with the late records handed to
    /// `late`, whose output joins the window results (a late-data output).
    pub fn aggregate_with_late_data<A, O, E, L>(
        self,
        name: &str,
        aggregate: A,
        emit: E,
        late: L,
    ) -> Stream<O>
    where
        A: AggregateFunction<T>,
        O: Data,
        E: Fn(&K, &TimeWindow, A::Result, &mut Collector<'_, O>) + Send + Sync + 'static,
        L: Fn(T, &mut Collector<'_, O>) + Send + Sync + 'static,
    {
        self.build(name, aggregate, emit, Some(Arc::new(late)))
    }

    fn build<A, O, E>(
        self,
        name: &str,
        aggregate: A,
        emit: E,
        late: Option<LateData<T, O>>,
    ) -> Stream<O>
    where
        A: AggregateFunction<T>,
        O: Data,
        E: Fn(&K, &TimeWindow, A::Result, &mut Collector<'_, O>) + Send + Sync + 'static,
    {
        let WindowedStream {
            keyed,
            assigner,
            settings,
        } = self;
        let (aggregate, emit) = (Arc::new(aggregate), Arc::new(emit));
        keyed.process(name, move |states| {
            WindowOperator::open(
                states,
                assigner,
                settings,
                aggregate.clone(),
                emit.clone(),
                late.clone(),
            )
        })
    }
}
