//! Building the subtasks of an attempt: each one's task from its
//! operator's factory, restored from what the attempt starts from, with
//! the in-flight batches it replays; the same for every subtask a process
//! hosts, whoever placed it there.

use crate::checkpoint::restore::Restored;
use crate::dataflow::channels::{Channels, Wiring};
use crate::dataflow::net::{LinkActor, LinkEnds, Workers};
use crate::dataflow::subtask::{panic_message, Checkpointing, SubtaskActor, SubtaskSpec, Wire};
use crate::job::JobError;
use crate::messages::{CheckpointReports, Reports, Stop};
use crate::metrics::JobMetrics;
use actix::{Actor, Addr, Recipient};
use actix_rt::ArbiterHandle;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tidemark_core::checkpoint::ChannelSide;
use tidemark_core::dataflow::async_io::AsyncRuntime;
use tidemark_core::dataflow::error::TaskError;
use tidemark_core::dataflow::task::{OutputContext, TaskContext};
use tidemark_core::job::Job;
use tidemark_core::model::ids::{Attempt, SubtaskId};
use tidemark_core::model::key_group::KeyGroupRange;
use tidemark_core::model::split::SplitPosition;
use tidemark_storage::CheckpointStorage;

/// What starting the subtasks of an attempt that one process hosts needs.
pub(crate) struct Hosting<'a> {
    pub job: &'a Job,
    pub metrics: &'a Arc<JobMetrics>,
    pub attempt: Attempt,
    pub reports: Reports,
    /// Where checkpoint reports go, and the storage, if the job checkpoints.
    pub checkpointing: Option<(CheckpointReports, CheckpointStorage)>,
    /// A subtask runs on the arbiter of its index.
    pub arbiters: &'a [ArbiterHandle],
    pub workers: &'a Workers,
}

/// The actors of an attempt in one process: its subtasks in order, every
/// actor to stop with it, and its link ends by the worker they belong to.
pub(crate) struct Hosted {
    pub subtasks: Vec<(SubtaskId, Addr<SubtaskActor>)>,
    pub actors: Vec<Recipient<Stop>>,
    pub links: Vec<(u32, Addr<LinkActor>)>,
}

impl Hosting<'_> {
    fn arbiter(&self, subtask: SubtaskId) -> &ArbiterHandle {
        &self.arbiters[subtask.index.0 as usize % self.arbiters.len()]
    }

    /// Starts the subtasks `hosted`, each restored from its part of
    /// `restore`, and their channels, through `ends` where they cross to
    /// another worker.
    pub fn deploy(
        &self,
        hosted: &[SubtaskId],
        mut restore: HashMap<SubtaskId, Restored>,
        ends: LinkEnds,
    ) -> Result<Hosted, JobError> {
        let mut subtasks: HashMap<SubtaskId, Addr<SubtaskActor>> = HashMap::new();
        let mut actors: Vec<Recipient<Stop>> = Vec::new();
        for &id in hosted {
            let spec = subtask_spec(
                self.job,
                self.metrics,
                id,
                self.attempt,
                restore.remove(&id).unwrap_or_default(),
                self.checkpointing.clone(),
            )?;
            let (reports, metrics) = (self.reports.clone(), self.metrics.clone());
            let addr = SubtaskActor::start_in_arbiter(self.arbiter(id), move |_| {
                SubtaskActor::new(spec, reports, metrics)
            });
            actors.push(addr.clone().recipient());
            subtasks.insert(id, addr);
        }
        let arbiter = |id| self.arbiter(id);
        let wiring = Wiring {
            attempt: self.attempt,
            graph: &self.job.graph,
            config: self.job.config.channels,
            workers: self.workers,
            metrics: self.metrics,
            failures: self.reports.failed.clone(),
            arbiter: &arbiter,
        };
        let Channels {
            mut outputs,
            mut inputs,
            links,
            actors: endpoints,
        } = wiring.connect(&subtasks, ends);
        actors.extend(endpoints);
        for (id, addr) in &subtasks {
            addr.do_send(Wire {
                outputs: outputs.remove(id).unwrap_or_default(),
                inputs: inputs.remove(id).unwrap_or_default(),
            });
        }
        let mut subtasks: Vec<_> = subtasks.into_iter().collect();
        subtasks.sort_by_key(|(id, _)| *id);
        Ok(Hosted {
            subtasks,
            actors,
            links,
        })
    }
}

/// Tells every actor of an attempt to stop; resolves once each has handled
/// it (or is gone), so that what their mailboxes held before it — a sink's
/// commit above all — has been handled too. An actor stuck in user code is
/// given up on after `STOP_TIMEOUT`.
pub(crate) fn stop_all(actors: Vec<Recipient<Stop>>) -> impl std::future::Future<Output = ()> {
    const STOP_TIMEOUT: Duration = Duration::from_secs(10);
    let stops: Vec<_> = actors
        .into_iter()
        .map(|actor| actor.send(Stop).timeout(STOP_TIMEOUT))
        .collect();
    async move {
        for stopped in futures::future::join_all(stops).await {
            if let Err(actix::MailboxError::Timeout) = stopped {
                tracing::warn!("an actor of the previous attempt did not stop in time");
            }
        }
    }
}

/// The spec of subtask `id` of `attempt`: its task built and restored from
/// `restored`, replayed batches it does not own filtered out (after a
/// rescale). A task that fails or panics while built fails the attempt.
pub(crate) fn subtask_spec(
    job: &Job,
    metrics: &JobMetrics,
    id: SubtaskId,
    attempt: Attempt,
    restored: Restored,
    checkpointing: Option<(CheckpointReports, CheckpointStorage)>,
) -> Result<SubtaskSpec, JobError> {
    let graph = &job.graph;
    let config = &job.config;
    // The downloaded directories live until this returns: the backend takes
    // their files over in `task.restore` below, and what a failed restore
    // leaves is deleted with them.
    let Restored {
        mut state,
        shared_base,
        downloads: _downloads,
    } = restored;
    let mut replay = std::mem::take(&mut state.channels);
    let failed = |error| JobError::TaskFailed { subtask: id, error };
    let position = state.source_position().map_err(failed)?;
    let ctx = task_context(job, metrics, id, attempt, position);
    let gate = graph.gate(id);
    let factory = job.task_factory(id.operator).clone();
    let task = catch_unwind(AssertUnwindSafe(|| {
        let mut task = factory(&ctx);
        task.restore(&state)?;
        if state.filter_replay {
            for channel in replay.iter_mut().filter(|c| c.side == ChannelSide::Input) {
                let input = gate.get(channel.channel).map_or(0, |(_, input)| *input);
                let batches = std::mem::take(&mut channel.batches);
                for batch in batches {
                    let owned = task.retain_owned(usize::from(input), batch)?;
                    if !owned.is_empty() {
                        channel.batches.push(owned);
                    }
                }
            }
        }
        Ok(task)
    }))
    .unwrap_or_else(|panic| Err(TaskError::Panic(panic_message(panic.as_ref()))))
    .map_err(failed)?;
    let replayed: usize = replay.iter().map(|c| c.batches.len()).sum();
    metrics
        .checkpoints
        .restored_inflight_batches
        .fetch_add(replayed as u64, Ordering::Relaxed);
    let is_source = graph.is_source(id.operator);
    Ok(SubtaskSpec {
        id,
        attempt,
        task,
        async_runtime: ctx.async_runtime.clone(),
        inputs: gate.iter().map(|(_, input)| usize::from(*input)).collect(),
        outputs: ctx.outputs.iter().map(|(_, o)| o.channels).sum(),
        records_per_batch: config.batch_limits.max_records,
        replay,
        shared_base,
        ns_per_record: config
            .slow
            .filter(|s| s.subtask == id)
            .map_or(0, |s| s.ns_per_record),
        rate: config
            .source_rate
            .filter(|_| is_source)
            .map(|rate| rate / f64::from(ctx.parallelism)),
        checkpointing: checkpointing.map(|(reports, storage)| Checkpointing {
            reports,
            storage,
            incremental: config.checkpointing.as_ref().is_some_and(|c| c.incremental),
            layout: config
                .checkpointing
                .as_ref()
                .map(|c| c.layout)
                .unwrap_or_default(),
            faults: if attempt == Attempt(0) {
                config
                    .faults
                    .iter()
                    .filter(|f| f.subtask == id)
                    .copied()
                    .collect()
            } else {
                Vec::new()
            },
        }),
    })
}

/// What a subtask's task is told about its place in the job.
fn task_context(
    job: &Job,
    metrics: &JobMetrics,
    subtask: SubtaskId,
    attempt: Attempt,
    source_position: Option<SplitPosition>,
) -> TaskContext {
    let graph = &job.graph;
    let op = graph.operator(subtask.operator);
    TaskContext {
        operator: subtask.operator,
        subtask: subtask.index,
        attempt,
        parallelism: op.parallelism,
        max_parallelism: op.max_parallelism,
        key_groups: KeyGroupRange::for_subtask(op.max_parallelism, op.parallelism, subtask.index),
        batch_limits: job.config.batch_limits,
        outputs: {
            let mut offset = 0;
            graph
                .edges
                .iter()
                .enumerate()
                .filter(|(_, e)| e.from == op.id)
                .map(|(i, edge)| {
                    let consumer = graph.operator(edge.to);
                    let channels = graph.output_channels(edge, subtask.index).len();
                    offset += channels;
                    (
                        i,
                        OutputContext {
                            partitioner: edge.partitioner,
                            offset: offset - channels,
                            channels,
                            consumer_parallelism: consumer.parallelism,
                            consumer_max_parallelism: consumer.max_parallelism,
                        },
                    )
                })
                .collect()
        },
        source_position,
        state_backend: job.config.state_backend.clone(),
        time_metrics: metrics.time.clone(),
        // The subtask's arbiter runs its async operator's requests; the
        // subtask sets the waker when it starts.
        async_runtime: AsyncRuntime::new(
            |request| {
                actix_rt::spawn(request);
            },
            |delay| Box::pin(actix_rt::time::sleep(delay)),
        ),
    }
}
