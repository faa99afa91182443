//! Streams: where records flow between the steps the builder chains. A
//! stream is a point of an operator's chain where later steps attach, or a
//! union of such points, placed in an operator of its own by the first
//! step that reads it.

use super::{JobBuilder, TaskFactory};
use crate::dataflow::operator::{
    Collector, Downstream, KeyedFunctionFactory, KeyedProcess, KeyedProcessFunction, Output,
    OutputTag, RecordWriter, Route, SideOutputs, SideRecord, SinkWriter, Stateless,
};
use crate::dataflow::sink::{Sink, SinkContext};
use crate::dataflow::source::reader::{Indexed, Reader, SourceReader};
use crate::dataflow::source::splits::Erased;
use crate::dataflow::source::{Source, SourceContext, SplitSource};
use crate::dataflow::task::{
    decoder, retain, sink_entry, ChainTask, Decoder, OutputContext, Retain, Task, TaskContext,
};
use crate::model::batch::Data;
use crate::model::graph::{Edge, Partitioner};
use crate::model::ids::OperatorId;
use crate::model::key_group::key_group_of;
use crate::state::broadcast::BroadcastDeclaration;
use crate::state::{BroadcastStates, Key, KeyedStateBackend, StateRegistrar};
use crate::time::{Timestamped, WatermarkStrategy};
use std::sync::{Arc, Mutex};

/// Builds, for one subtask, the steps of a chain after some point.
pub(super) type BranchFactory<T> =
    Arc<dyn Fn(&TaskContext) -> Box<dyn Downstream<T>> + Send + Sync>;

/// A point of an operator's chain: the branches attached to it so far.
/// Subtasks are built after the job, so they see every branch.
pub(super) struct Node<T>(Arc<Mutex<Vec<BranchFactory<T>>>>);

impl<T> Clone for Node<T> {
    fn clone(&self) -> Self {
        Node(self.0.clone())
    }
}

impl<T: Data> Node<T> {
    pub(super) fn new() -> Self {
        Node(Arc::default())
    }

    pub(super) fn attach(&self, branch: BranchFactory<T>) {
        self.0.lock().expect("not poisoned").push(branch);
    }

    /// The rest of the chain from this point: nothing read from it drops
    /// its records, several readers each get them all.
    pub(super) fn build(&self, ctx: &TaskContext) -> Box<dyn Downstream<T>> {
        let branches = self.0.lock().expect("not poisoned");
        match branches.as_slice() {
            [one] => one(ctx),
            many => Box::new(many.iter().map(|b| b(ctx)).collect::<Vec<_>>()),
        }
    }
}

/// The branches reading the side outputs of one step, by tag.
type SideBranches = Vec<(Arc<str>, BranchFactory<SideRecord>)>;

/// The side outputs read from one step, so far.
#[derive(Clone, Default)]
pub(super) struct Sides(Arc<Mutex<SideBranches>>);

impl Sides {
    /// The output of a step whose main records go to `node`.
    pub(super) fn output<O: Data>(&self, node: &Node<O>, ctx: &TaskContext) -> Output<O> {
        let mut sides = SideOutputs::default();
        for (tag, branch) in self.0.lock().expect("not poisoned").iter() {
            sides.add(tag.clone(), branch(ctx));
        }
        Output::new(node.build(ctx), sides)
    }
}

/// A stream inside one operator: the point it leaves from, and the side
/// outputs of the step that made it, if that step runs a function.
pub(super) struct Part<T> {
    pub(super) op: OperatorId,
    pub(super) node: Node<T>,
    pub(super) sides: Option<Sides>,
}

impl<T> Clone for Part<T> {
    fn clone(&self) -> Self {
        Part {
            op: self.op,
            node: self.node.clone(),
            sides: self.sides.clone(),
        }
    }
}

/// A stream of `T`: inside the operator being built, or the union of
/// streams of several operators. Cloning it reads it twice (fan-out).
pub struct Stream<T> {
    pub(super) job: JobBuilder,
    pub(super) parts: Vec<Part<T>>,
}

impl<T> Clone for Stream<T> {
    fn clone(&self) -> Self {
        Stream {
            job: self.job.clone(),
            parts: self.parts.clone(),
        }
    }
}

/// How records leave over an edge that is not keyed.
pub(super) fn plain_route<T>(out: &OutputContext) -> Route<T> {
    match out.partitioner {
        Partitioner::Forward => Route::Forward,
        Partitioner::Broadcast => Route::Broadcast,
        Partitioner::Rebalance | Partitioner::Hash => Route::Rebalance,
    }
}

/// Opens the [`Source`] `factory` builds at the subtask's position.
fn indexed<T, S, F>(factory: F) -> impl Fn(&TaskContext) -> Box<dyn Reader<T>> + Send + Sync
where
    T: Data,
    S: Source<T> + 'static,
    F: Fn(SourceContext) -> S + Send + Sync + 'static,
{
    move |ctx| {
        Box::new(Indexed(Box::new(factory(SourceContext {
            subtask: ctx.subtask,
            parallelism: ctx.parallelism,
            start: ctx.source_position.clone(),
        }))))
    }
}

/// Builds a source subtask's task around the reader it reads from.
trait BuildHead<T>:
    Fn(Box<dyn Reader<T>>, &TaskContext, Box<dyn Downstream<T>>) -> Box<dyn Task>
    + Send
    + Sync
    + 'static
{
}

impl<T, F> BuildHead<T> for F where
    F: Fn(Box<dyn Reader<T>>, &TaskContext, Box<dyn Downstream<T>>) -> Box<dyn Task>
        + Send
        + Sync
        + 'static
{
}

/// The head of a source whose records have no timestamps.
fn plain_head<T: Data>(
    reader: Box<dyn Reader<T>>,
    _: &TaskContext,
    next: Box<dyn Downstream<T>>,
) -> Box<dyn Task> {
    Box::new(ChainTask::source(reader, next))
}

/// The head of a source with watermarks after `strategy`.
fn timestamped_head<T: Data + Timestamped>(strategy: WatermarkStrategy) -> impl BuildHead<T> {
    move |reader, ctx, next| {
        let metrics = ctx.time_metrics.clone();
        Box::new(ChainTask::source_with_watermarks(
            reader, strategy, metrics, next,
        ))
    }
}

/// The records an input takes as they are.
pub(super) fn same<T: Data>() -> Decoder<T> {
    decoder::<T, T>(|record| record)
}

impl JobBuilder {
    /// Adds a source operator; `factory` builds each subtask's source at
    /// the position it resumes from.
    pub fn source<T, S, F>(&self, name: &str, factory: F) -> Stream<T>
    where
        T: Data,
        S: Source<T> + 'static,
        F: Fn(SourceContext) -> S + Send + Sync + 'static,
    {
        self.source_task(name, indexed(factory), plain_head).1
    }

    /// Adds a source operator whose records carry event timestamps, with
    /// watermarks after `strategy` (Flink's `fromSource` with a
    /// `WatermarkStrategy`). Its watermark state is checkpointed with its
    /// position, and the end of its input emits the final watermark.
    pub fn source_with_watermarks<T, S, F>(
        &self,
        name: &str,
        strategy: WatermarkStrategy,
        factory: F,
    ) -> Stream<T>
    where
        T: Data + Timestamped,
        S: Source<T> + 'static,
        F: Fn(SourceContext) -> S + Send + Sync + 'static,
    {
        self.source_task(name, indexed(factory), timestamped_head(strategy))
            .1
    }

    /// Adds a split source (Flink's FLIP-27 `Source`): its enumerator runs
    /// beside the checkpoint coordinator and hands the splits it discovers
    /// to the subtasks, which read them.
    pub fn split_source<T, S>(&self, name: &str, source: S) -> Stream<T>
    where
        T: Data,
        S: SplitSource<T>,
    {
        self.split_source_task(name, source, plain_head)
    }

    /// [`split_source`](Self::split_source) whose records carry event
    /// timestamps, with watermarks after `strategy`.
    pub fn split_source_with_watermarks<T, S>(
        &self,
        name: &str,
        strategy: WatermarkStrategy,
        source: S,
    ) -> Stream<T>
    where
        T: Data + Timestamped,
        S: SplitSource<T>,
    {
        self.split_source_task(name, source, timestamped_head(strategy))
    }

    fn split_source_task<T, S, H>(&self, name: &str, source: S, head: H) -> Stream<T>
    where
        T: Data,
        S: SplitSource<T>,
        H: BuildHead<T>,
    {
        let source = Arc::new(source);
        let enumerator = Arc::new(Erased(source.clone()));
        let reader = move |_: &TaskContext| -> Box<dyn Reader<T>> {
            Box::new(SourceReader::new(source.clone()))
        };
        let (op, stream) = self.source_task(name, reader, head);
        self.add_split_enumerator(op, enumerator);
        stream
    }

    /// A source operator whose subtasks `head` builds around the reader
    /// `reader` opens for the subtask.
    fn source_task<T, R, H>(&self, name: &str, reader: R, head: H) -> (OperatorId, Stream<T>)
    where
        T: Data,
        R: Fn(&TaskContext) -> Box<dyn Reader<T>> + Send + Sync + 'static,
        H: BuildHead<T>,
    {
        let node = Node::new();
        let next = node.clone();
        let op = self.add_operator(
            name,
            Arc::new(move |ctx| head(reader(ctx), ctx, next.build(ctx))),
        );
        (op, self.stream(op, node, None))
    }

    pub(super) fn stream<T>(
        &self,
        op: OperatorId,
        node: Node<T>,
        sides: Option<Sides>,
    ) -> Stream<T> {
        Stream {
            job: self.clone(),
            parts: vec![Part { op, node, sides }],
        }
    }

    /// An operator fed by the input gate, whose head takes its inputs
    /// apart with `decoders` and keeps what it owns with `retain`.
    pub(super) fn input_operator<T: Data>(
        &self,
        name: &str,
        decoders: Vec<Decoder<T>>,
        retain: impl Fn(&TaskContext) -> Vec<Retain> + Send + Sync + 'static,
        head: impl Fn(&TaskContext, Box<dyn Downstream<T>>) -> Box<dyn Downstream<T>>
            + Send
            + Sync
            + 'static,
    ) -> (OperatorId, Node<T>) {
        let node = Node::new();
        let next = node.clone();
        let task: TaskFactory = Arc::new(move |ctx| {
            Box::new(ChainTask::input(
                decoders.clone(),
                retain(ctx),
                head(ctx, next.build(ctx)),
            ))
        });
        (self.add_operator(name, task), node)
    }

    /// An operator fed by the input gate, not keyed, whose head is one step
    /// that `step` builds for each subtask, feeding the output it is given:
    /// the operator and the stream of what the step emits.
    pub(super) fn step_operator<T: Data, O: Data>(
        &self,
        name: &str,
        decoders: Vec<Decoder<T>>,
        step: impl Fn(&TaskContext, Output<O>) -> Box<dyn Downstream<T>> + Send + Sync + 'static,
    ) -> (OperatorId, Stream<O>) {
        let (op, input) = self.input_operator(name, decoders, |_| Vec::new(), |_, next| next);
        let (node, sides) = (Node::new(), Sides::default());
        let (next, side) = (node.clone(), sides.clone());
        input.attach(Arc::new(move |ctx| step(ctx, side.output(&next, ctx))));
        (op, self.stream(op, node, Some(sides)))
    }

    /// Sends the records of `parts` over new edges into input `input` of
    /// operator `to`, routed by `route`.
    pub(super) fn connect_edges<T: Data>(
        &self,
        parts: &[Part<T>],
        to: OperatorId,
        input: u8,
        partitioner: Option<Partitioner>,
        route: impl Fn(&OutputContext) -> Route<T> + Send + Sync + Clone + 'static,
    ) {
        for part in parts {
            let edge = self.with(|b| {
                let index = b.graph.edges.len();
                b.graph.edges.push(Edge {
                    from: part.op,
                    to,
                    partitioner: partitioner.unwrap_or(Partitioner::Forward),
                    input,
                });
                if partitioner.is_none() {
                    b.adaptive.push(index);
                }
                index
            });
            let route = route.clone();
            part.node.attach(Arc::new(move |ctx| {
                let (_, out) = ctx
                    .outputs
                    .iter()
                    .find(|(e, _)| *e == edge)
                    .expect("a subtask is deployed with every edge it feeds");
                let per_batch = ctx.batch_limits.records_of::<T>();
                Box::new(RecordWriter::new(
                    route(out),
                    out.offset,
                    out.channels,
                    per_batch,
                ))
            }));
        }
    }
}

impl<T: Data> Stream<T> {
    /// The stream as one operator's: a union gets an operator of its own,
    /// fed over forward edges where the parallelism allows, rebalance
    /// otherwise (as Flink's union).
    fn chained(mut self) -> (JobBuilder, Part<T>) {
        if self.parts.len() == 1 {
            let part = self.parts.pop().expect("one part");
            return (self.job, part);
        }
        let (op, node) =
            self.job
                .input_operator("union", vec![same()], |_| Vec::new(), |_, next| next);
        self.job
            .connect_edges(&self.parts, op, 0, None, plain_route);
        (
            self.job,
            Part {
                op,
                node,
                sides: None,
            },
        )
    }

    fn with_operator(self, f: impl FnOnce(&mut crate::model::graph::OperatorSpec)) -> Self {
        let (job, part) = self.chained();
        job.with(|b| f(b.graph.operator_mut(part.op)));
        Stream {
            job,
            parts: vec![part],
        }
    }

    /// Names the current operator (the chain since the last shuffle).
    pub fn name(self, name: &str) -> Self {
        self.with_operator(|op| op.name = name.to_owned())
    }

    /// Sets the stable identity of the current operator.
    pub fn uid(self, uid: &str) -> Self {
        self.with_operator(|op| op.uid = uid.to_owned())
    }

    /// Sets the parallelism of the current operator, its whole chain.
    pub fn parallelism(self, parallelism: u32) -> Self {
        self.with_operator(|op| op.parallelism = parallelism)
    }

    /// Sets the current operator's number of key groups, the most subtasks
    /// its state can ever be rescaled to; it must stay the same across the
    /// runs that restore each other.
    pub fn max_parallelism(self, max_parallelism: u32) -> Self {
        self.with_operator(|op| op.max_parallelism = max_parallelism)
    }

    /// Any number of records out per record in, and records to side
    /// outputs ([`Collector::output`]), chained into the current operator
    /// (Flink's `ProcessFunction`).
    pub fn process<O, F>(self, f: F) -> Stream<O>
    where
        O: Data,
        F: FnMut(T, &mut Collector<'_, O>) + Clone + Send + Sync + 'static,
    {
        let (job, part) = self.chained();
        let (node, sides) = (Node::new(), Sides::default());
        let (next, side) = (node.clone(), sides.clone());
        part.node.attach(Arc::new(move |ctx| {
            Box::new(Stateless::new(f.clone(), side.output(&next, ctx)))
        }));
        job.stream(part.op, node, Some(sides))
    }

    /// One record out per record in, chained into the current operator.
    pub fn map<O, F>(self, mut f: F) -> Stream<O>
    where
        O: Data,
        F: FnMut(T) -> O + Clone + Send + Sync + 'static,
    {
        self.process(move |record, out| out.collect(f(record)))
    }

    /// Keeps the records `f` accepts, chained into the current operator.
    pub fn filter<F>(self, mut f: F) -> Stream<T>
    where
        F: FnMut(&T) -> bool + Clone + Send + Sync + 'static,
    {
        self.process(move |record, out| {
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
        self.process(move |record, out| {
            for o in f(record) {
                out.collect(o)
            }
        })
    }

    /// The records the step that made this stream emitted to `tag`, as a
    /// stream of their own. Panics unless that step runs a function
    /// (`process`, `map`, `filter`, `flat_map`, a keyed or two-input
    /// `process`), or if `tag` is read twice: clone the stream instead.
    pub fn side_output<X: Data>(&self, tag: &OutputTag<X>) -> Stream<X> {
        let [part] = self.parts.as_slice() else {
            panic!(
                "side output {:?} of a union: read it from each stream",
                tag.id()
            );
        };
        let sides = part.sides.as_ref().unwrap_or_else(|| {
            panic!(
                "side output {:?}: only a step that runs a function has side outputs",
                tag.id()
            )
        });
        let node = Node::<X>::new();
        let next = node.clone();
        let id: Arc<str> = tag.id().into();
        let mut sides = sides.0.lock().expect("not poisoned");
        assert!(
            sides.iter().all(|(t, _)| *t != id),
            "side output {id:?} is read twice: clone its stream instead"
        );
        let tag_id = id.clone();
        sides.push((
            id,
            Arc::new(move |ctx| {
                let tag_id = tag_id.clone();
                let unbox = move |record: SideRecord, out: &mut Collector<'_, X>| {
                    let record = record.downcast::<X>().unwrap_or_else(|_| {
                        panic!("side output {tag_id:?} is emitted with two record types")
                    });
                    out.collect(*record)
                };
                Box::new(Stateless::new(unbox, Output::from(next.build(ctx))))
            }),
        ));
        self.job.stream(part.op, node, None)
    }

    /// This stream and `others` as one: every record of each (Flink's
    /// `union`). The next step reads them all in an operator of its own.
    pub fn union(mut self, others: impl IntoIterator<Item = Stream<T>>) -> Stream<T> {
        for other in others {
            self.parts.extend(other.parts);
        }
        self
    }

    /// Ends the current operator with a record writer on a new edge per
    /// part into a new operator, which reads them all as its input 0.
    fn shuffle(self, partitioner: Partitioner, name: &str) -> Stream<T> {
        let (op, node) =
            self.job
                .input_operator(name, vec![same()], |_| Vec::new(), |_, next| next);
        self.job
            .connect_edges(&self.parts, op, 0, Some(partitioner), plain_route);
        self.job.stream(op, node, None)
    }

    /// Spreads records round robin over the next operator's subtasks.
    pub fn rebalance(self) -> Stream<T> {
        self.shuffle(Partitioner::Rebalance, "rebalance")
    }

    /// Sends every record to every subtask of the next operator.
    pub fn broadcast(self) -> Stream<T> {
        self.shuffle(Partitioner::Broadcast, "broadcast")
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

    /// Ends the stream in a sink, chained to the operator of each stream
    /// it is the union of. Returns the job's builder, to add more or
    /// [`build`](JobBuilder::build) it.
    pub fn sink<S, F>(self, name: &str, factory: F) -> JobBuilder
    where
        S: Sink<T> + 'static,
        F: Fn(SinkContext) -> S + Send + Sync + 'static,
    {
        let (job, part) = self.chained();
        let entry = job.with(|b| {
            let n = &mut b.sinks[part.op.0 as usize];
            *n += 1;
            let chain = &mut b.graph.operator_mut(part.op).name;
            *chain = format!("{chain} -> {name}");
            sink_entry(*n - 1)
        });
        part.node.attach(Arc::new(move |ctx| {
            let sink = factory(SinkContext {
                subtask: ctx.subtask,
                parallelism: ctx.parallelism,
                attempt: ctx.attempt,
            });
            Box::new(SinkWriter::new(Box::new(sink), entry.clone()))
        }));
        job
    }
}

/// Extracts the key of a record.
pub(super) type KeyOf<T, K> = Arc<dyn Fn(&T) -> K + Send + Sync>;

/// A stream partitioned by key, waiting for the keyed function that reads it.
pub struct KeyedStream<K, T> {
    pub(super) stream: Stream<T>,
    pub(super) key_of: KeyOf<T, K>,
}

/// Routes records by the key group of their key, to the consumer subtask
/// that owns it.
pub(super) fn hash_route<K: Key, T: 'static>(
    key_of: KeyOf<T, K>,
) -> impl Fn(&OutputContext) -> Route<T> + Send + Sync + Clone + 'static {
    move |out| {
        let key_of = key_of.clone();
        let max_parallelism = out.consumer_max_parallelism;
        Route::hash(
            Arc::new(move |record| key_group_of(&key_of(record), max_parallelism)),
            out.consumer_parallelism,
            max_parallelism,
        )
    }
}

/// Keeps the records of an input keyed by `key_of` that the subtask of
/// `ctx` owns.
pub(super) fn owned<K: Key, T: Data>(key_of: &KeyOf<T, K>, ctx: &TaskContext) -> Retain {
    let (key_of, owned, max_parallelism) = (key_of.clone(), ctx.key_groups, ctx.max_parallelism);
    retain::<T>(move |record| owned.contains(key_group_of(&key_of(record), max_parallelism)))
}

/// The broadcast input of a keyed broadcast operator, as its keyed step
/// takes it: the broadcast states declared, and which records came by it.
pub(super) struct BroadcastInput<T> {
    pub(super) declared: Vec<BroadcastDeclaration>,
    pub(super) keyless: fn(&T) -> bool,
}

/// Opens the keyed function of a subtask, with the state and metrics of
/// its context.
pub(super) type KeyedOpen<K, T, O> = Arc<
    dyn Fn(&TaskContext, &mut StateRegistrar<'_, K>) -> Box<dyn KeyedProcessFunction<K, T, O>>
        + Send
        + Sync,
>;

impl JobBuilder {
    /// A keyed operator: its head runs the keyed function `open` builds
    /// over records `T` keyed by `key_of`, taken apart by `decoders` and
    /// kept by `retain`.
    pub(super) fn keyed_operator<K: Key, T: Data, O: Data>(
        &self,
        name: &str,
        key_of: KeyOf<T, K>,
        decoders: Vec<Decoder<T>>,
        retain: impl Fn(&TaskContext) -> Vec<Retain> + Send + Sync + 'static,
        open: KeyedOpen<K, T, O>,
        broadcast: Option<BroadcastInput<T>>,
    ) -> (OperatorId, Stream<O>) {
        let (node, sides) = (Node::new(), Sides::default());
        let (next, side) = (node.clone(), sides.clone());
        let (op, input) = self.input_operator(name, decoders, retain, |_, next| next);
        input.attach(Arc::new(move |ctx| {
            let states = KeyedStateBackend::new(
                &ctx.state_backend,
                &format!("{}-{}", ctx.operator, ctx.subtask.0),
                ctx.key_groups,
                ctx.max_parallelism,
            );
            let (open, ctx_of) = (open.clone(), ctx.clone());
            let factory: KeyedFunctionFactory<K, T, O> = Arc::new(move |s| open(&ctx_of, s));
            let process = KeyedProcess::new(
                key_of.clone(),
                &factory,
                states,
                ctx.time_metrics.clone(),
                side.output(&next, ctx),
            );
            match &broadcast {
                None => Box::new(process),
                Some(input) => Box::new(
                    process.with_broadcast(BroadcastStates::new(&input.declared), input.keyless),
                ),
            }
        }));
        (op, self.stream(op, node, Some(sides)))
    }
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
        self.process_in_context(name, move |_, states| factory(states))
    }

    /// As [`process`](Self::process), with the subtask's context.
    pub(super) fn process_in_context<O, P, F>(self, name: &str, factory: F) -> Stream<O>
    where
        O: Data,
        P: KeyedProcessFunction<K, T, O> + 'static,
        F: Fn(&TaskContext, &mut StateRegistrar<'_, K>) -> P + Send + Sync + 'static,
    {
        let KeyedStream { stream, key_of } = self;
        let owner = key_of.clone();
        let (op, out) = stream.job.keyed_operator(
            name,
            key_of.clone(),
            vec![same()],
            move |ctx| vec![owned(&owner, ctx)],
            Arc::new(move |ctx, states| Box::new(factory(ctx, states))),
            None,
        );
        let route = hash_route(key_of);
        stream
            .job
            .connect_edges(&stream.parts, op, 0, Some(Partitioner::Hash), route);
        out
    }
}
