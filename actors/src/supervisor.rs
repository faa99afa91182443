//! The job supervisor: deploys the subtask and endpoint actors of a job over
//! the arbiter pool, watches them, and ends the job when every subtask has
//! finished, when one fails, or when the job is cancelled.

use crate::endpoint::{InputEndpoint, OutputEndpoint};
use crate::messages::{Cancel, ConnectUpstream, SubtaskFailed, SubtaskFinished, Wire};
use crate::metrics::JobMetrics;
use crate::runtime::{JobError, JobReport};
use crate::subtask::{panic_message, SubtaskActor, SubtaskSpec};
use actix::{Actor, Addr, AsyncContext, Context, Handler, System};
use actix_rt::ArbiterHandle;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use tidemark::error::TaskError;
use tidemark::ids::{SubtaskId, SubtaskIndex};
use tidemark::job::Job;
use tidemark::key_group::KeyGroupRange;
use tidemark::task::{OutputContext, TaskContext};

pub struct JobSupervisor {
    job: Job,
    arbiters: Vec<ArbiterHandle>,
    metrics: Arc<JobMetrics>,
    started: Instant,
    unfinished: usize,
    outcome: Option<mpsc::Sender<Result<JobReport, JobError>>>,
}

impl JobSupervisor {
    pub fn new(
        job: Job,
        arbiters: Vec<ArbiterHandle>,
        metrics: Arc<JobMetrics>,
        outcome: mpsc::Sender<Result<JobReport, JobError>>,
    ) -> Self {
        JobSupervisor {
            job,
            arbiters,
            metrics,
            started: Instant::now(),
            unfinished: 0,
            outcome: Some(outcome),
        }
    }

    fn task_context(&self, subtask: SubtaskId) -> TaskContext {
        let graph = &self.job.graph;
        let op = graph.operator(subtask.operator);
        TaskContext {
            subtask: subtask.index,
            parallelism: op.parallelism,
            max_parallelism: op.max_parallelism,
            key_groups: KeyGroupRange::for_subtask(
                op.max_parallelism,
                op.parallelism,
                subtask.index,
            ),
            batch_limits: self.job.config.batch_limits,
            output: graph.output_edge(op.id).map(|edge| {
                let consumer = graph.operator(edge.to);
                OutputContext {
                    partitioner: edge.partitioner,
                    channels: graph.output_channels(edge, subtask.index).len(),
                    consumer_parallelism: consumer.parallelism,
                    consumer_max_parallelism: consumer.max_parallelism,
                }
            }),
            source_offset: 0,
        }
    }

    fn arbiter(&self, subtask: SubtaskId) -> &ArbiterHandle {
        &self.arbiters[subtask.index.0 as usize % self.arbiters.len()]
    }

    fn deploy(&mut self, me: Addr<Self>) -> Result<(), JobError> {
        let graph = &self.job.graph;
        let config = &self.job.config;
        let mut subtasks: HashMap<SubtaskId, Addr<SubtaskActor>> = HashMap::new();
        for id in graph.subtasks().collect::<Vec<_>>() {
            let ctx = self.task_context(id);
            let factory = self.job.task_factory(id.operator).clone();
            let task = catch_unwind(AssertUnwindSafe(|| factory(&ctx))).map_err(|panic| {
                JobError::TaskFailed {
                    subtask: id,
                    error: TaskError::Panic(panic_message(panic.as_ref())),
                }
            })?;
            let input_edge = graph.input_edge(id.operator);
            let spec = SubtaskSpec {
                id,
                task,
                inputs: input_edge.map_or(0, |e| graph.input_channels(e, id.index).len()),
                outputs: ctx.output.map_or(0, |o| o.channels),
                records_per_batch: config.batch_limits.max_records,
                rate: config
                    .source_rate
                    .filter(|_| input_edge.is_none())
                    .map(|rate| rate / f64::from(ctx.parallelism)),
            };
            let (supervisor, metrics) = (me.clone(), self.metrics.clone());
            let addr = SubtaskActor::start_in_arbiter(self.arbiter(id), move |_| {
                SubtaskActor::new(spec, supervisor, metrics)
            });
            subtasks.insert(id, addr);
        }
        let mut outputs: HashMap<SubtaskId, Vec<Addr<OutputEndpoint>>> = HashMap::new();
        let mut inputs: HashMap<SubtaskId, Vec<Option<Addr<InputEndpoint>>>> = graph
            .subtasks()
            .map(|id| {
                let n = graph
                    .input_edge(id.operator)
                    .map_or(0, |e| graph.input_channels(e, id.index).len());
                (id, vec![None; n])
            })
            .collect();
        let channels = config.channels;
        for edge in &graph.edges {
            for i in 0..graph.operator(edge.from).parallelism {
                for (k, channel) in graph
                    .output_channels(edge, SubtaskIndex(i))
                    .into_iter()
                    .enumerate()
                {
                    let consumer_channel = graph
                        .input_channels(edge, channel.to.index)
                        .iter()
                        .position(|c| *c == channel)
                        .expect("both sides of an edge list the same channels");
                    let gauge = self.metrics.channel(
                        channel,
                        channels.output_credits,
                        channels.input_credits,
                    );
                    let consumer = subtasks[&channel.to].clone();
                    let supervisor = me.clone();
                    let ie_gauge = gauge.clone();
                    let ie = InputEndpoint::start_in_arbiter(self.arbiter(channel.to), move |_| {
                        InputEndpoint::new(
                            channel,
                            consumer,
                            consumer_channel,
                            channels.prefetch,
                            ie_gauge,
                            supervisor,
                        )
                    });
                    let producer = subtasks[&channel.from].clone();
                    let downstream = ie.clone();
                    let oe =
                        OutputEndpoint::start_in_arbiter(self.arbiter(channel.from), move |_| {
                            OutputEndpoint::new(producer, k, downstream, gauge)
                        });
                    ie.do_send(ConnectUpstream(oe.clone()));
                    outputs.entry(channel.from).or_default().push(oe);
                    inputs
                        .get_mut(&channel.to)
                        .expect("every subtask has an entry")[consumer_channel] = Some(ie);
                }
            }
        }
        for (id, addr) in &subtasks {
            addr.do_send(Wire {
                outputs: outputs.remove(id).unwrap_or_default(),
                inputs: inputs
                    .remove(id)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|ie| ie.expect("every input channel has an endpoint"))
                    .collect(),
            });
        }
        self.unfinished = subtasks.len();
        Ok(())
    }

    fn complete(&mut self, outcome: Result<JobReport, JobError>) {
        if let Some(tx) = self.outcome.take() {
            let _ = tx.send(outcome);
            System::current().stop();
        }
    }
}

impl Actor for JobSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.started = Instant::now();
        if let Err(e) = self.deploy(ctx.address()) {
            self.complete(Err(e));
        }
    }
}

impl Handler<SubtaskFinished> for JobSupervisor {
    type Result = ();

    fn handle(&mut self, SubtaskFinished(id): SubtaskFinished, _ctx: &mut Context<Self>) {
        tracing::debug!(subtask = %id, "finished");
        self.unfinished -= 1;
        if self.unfinished == 0 {
            let report = JobReport {
                records_in: self.metrics.records_in(),
                elapsed: self.started.elapsed(),
            };
            self.complete(Ok(report));
        }
    }
}

impl Handler<SubtaskFailed> for JobSupervisor {
    type Result = ();

    fn handle(&mut self, msg: SubtaskFailed, _ctx: &mut Context<Self>) {
        tracing::error!(subtask = %msg.subtask, error = %msg.error, "subtask failed");
        self.complete(Err(JobError::TaskFailed {
            subtask: msg.subtask,
            error: msg.error,
        }));
    }
}

impl Handler<Cancel> for JobSupervisor {
    type Result = ();

    fn handle(&mut self, _: Cancel, _ctx: &mut Context<Self>) {
        self.complete(Err(JobError::Cancelled));
    }
}
