//! A deterministic simulator of whole jobs, as FoundationDB's and
//! TigerBeetle's: the real core machines of a job (its checkpointing,
//! barrier handlers, credit channels, subtask checkpointers) wired in one
//! thread, under a virtual clock, with a seeded scheduler choosing which
//! message, timer or storage completion happens next, storage faults
//! (failed writes, a `_metadata` write that lands but times out, failed
//! uploads, failed deletions) and kills of a subtask, of a worker (the
//! subtasks it hosts, their uploads half written) or of the whole driver
//! (power loss: the calls in flight are lost) at any step.
//!
//! The job: two sources read 100 records each into two keyed counters,
//! which emit each key's running count into a sink that commits in two
//! phases (Flink's `TwoPhaseCommitSinkFunction`). Each seed checkpoints it
//! aligned (one or two at a time), unaligned (in-flight batches captured
//! as channel state and replayed on restore) or aligned with a timeout. After every step: no
//! object a restorable checkpoint references is gone. At every completion
//! and restore: the checkpoint holds the state at its barrier (the counts
//! of exactly the records its sources had read, with what its channel
//! state holds in flight). At the end: the committed
//! output is exactly `(key, 1..=n)` for every key's `n` records, whatever
//! failed; and once faults stop, the job finishes. A task may take a
//! checkpoint's barrier or a cancel marker with nothing ahead of it before
//! what its other channels hold (`BarrierHandler::poll_control`, which a
//! subtask firing timers calls between two turns). A seed may stop the job
//! with a savepoint: a new run resumes from the savepoint's own copy and
//! the output of both runs together is exactly once.
//!
//! Every run is a function of its seed: `cargo xtask sim --seed S` replays
//! a failure exactly, `--trace` showing every event of the driver.

mod requests;
mod storage;
mod supervisor;
mod task;
#[cfg(test)]
mod tests;

use crate::checkpoint::coordinator::{CheckpointCoordinator, Now, RequestId};
use crate::checkpoint::job_checkpoints::{
    BrokenRule, JobAction, JobCheckpoints, JobEvent, WriteFailure,
};
use crate::checkpoint::store::CompletedCheckpointStore;
use crate::checkpoint::{Ack, CheckpointMetrics, CheckpointPolicy, CompletedCheckpoint};
use crate::cluster::lifecycle::{JobLifecycle, LifeEvent};
use crate::model::channel::{CreditReceiver, CreditSender};
use crate::model::event::{Alignment, ChannelEvent, CheckpointKind};
use crate::model::ids::{Attempt, CheckpointId, SubtaskId};
use crate::model::rng::SplitMix64;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};
use storage::{Op, Storage, WriteFault};
use task::{Control, Count, Role, Task, COUNTERS, RECORDS, SINK, SOURCES};

/// Steps after the last fault within which a run must finish.
const QUIET_STEPS: u64 = 60_000;

/// Why a step failed: a broken invariant, said in words.
type Failed = String;

/// A run that broke an invariant, with what replays it.
#[derive(Debug)]
pub struct Failure {
    /// The run's seed.
    pub seed: u64,
    /// The step at which it was found.
    pub step: u64,
    /// What broke.
    pub reason: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} failed at step {}: {}",
            self.seed, self.step, self.reason
        )
    }
}

/// What a run went through, for the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Steps taken.
    pub steps: u64,
    /// Checkpoints that completed.
    pub completed: u64,
    /// Restores of a new attempt or driver.
    pub restores: u64,
    /// Faults injected: kills and failed storage calls.
    pub faults: u64,
    /// Power losses of the driver.
    pub driver_kills: u64,
    /// Workers killed with the subtasks they host.
    pub worker_kills: u64,
    /// Stops with a savepoint that a new run resumed from.
    pub stops: u64,
}

/// The faults of one run, drawn from its seed.
struct Faults {
    /// Chance per step of a kill, while kills are left.
    kill: f64,
    kills: u32,
    store_id: f64,
    metadata: f64,
    upload: f64,
    delete: f64,
    /// Faults stop after this step.
    until: u64,
    /// The tasks each of two workers hosts, killed together.
    workers: [Vec<usize>; 2],
}

/// Manual requests of a run, and what their answers may name.
#[derive(Default)]
struct Requests {
    /// Requests yet to make.
    left: u32,
    /// Virtual time of the next.
    at: u64,
    next: RequestId,
    /// Made and not answered, with what they asked for.
    open: BTreeMap<RequestId, CheckpointKind>,
    /// Stops with a savepoint, until answered.
    stops: BTreeSet<RequestId>,
    /// Checkpoints that completed.
    completed: BTreeSet<CheckpointId>,
    /// Savepoints whose copy landed.
    savepoints: BTreeSet<CheckpointId>,
}

/// How the job is checkpointed, drawn from the seed.
struct Setup {
    alignment: Alignment,
    retain: usize,
    timeout: Duration,
    max_concurrent: usize,
    broken: BrokenRule,
}

/// A message for the coordinator.
enum ToCoordinator {
    Ack(Attempt, Box<Ack>),
    Decline {
        attempt: Attempt,
        checkpoint: CheckpointId,
        subtask: SubtaskId,
        reason: String,
    },
    Exhausted {
        attempt: Attempt,
        source: SubtaskId,
    },
}

/// One credit-based link between two tasks.
struct Channel {
    sender: CreditSender,
    receiver: CreditReceiver,
    /// Events the receiver holds.
    held: usize,
}

/// What can happen next.
#[derive(Clone, Copy, Debug)]
enum Step {
    Emit(usize),
    Transmit(usize),
    Deliver(usize),
    /// The task takes what its barrier handler lets through; at times only
    /// a barrier or cancel marker with nothing ahead of it, if there is
    /// one, as a subtask firing timers between two turns does.
    Process(usize),
    Mail(usize),
    Coordinator,
    Complete(usize),
    Tick,
    /// The supervisor takes a failure the coordinator reported.
    Supervisor,
    /// A manual checkpoint or savepoint is asked for.
    Request,
}

/// A driver over the checkpoints `store` retains.
fn driver(
    storage: &Storage,
    store: CompletedCheckpointStore,
    setup: &Setup,
    now: Now,
) -> JobCheckpoints {
    let policy = CheckpointPolicy {
        interval: Some(Duration::from_millis(20)),
        timeout: setup.timeout,
        min_pause: Duration::ZERO,
        max_concurrent: setup.max_concurrent,
        tolerable_failures: 2,
        retain: setup.retain,
    };
    let subtasks = (0..=SINK).map(task::subtask_id).collect();
    let next_id = storage.next_id.unwrap_or(CheckpointId(1));
    let core = CheckpointCoordinator::new(policy, subtasks, setup.alignment, next_id, now);
    let mut driver = JobCheckpoints::new(core, store, 2.0);
    driver.break_rule(setup.broken);
    driver
}

/// Runs the job of seed `seed` to its end, with `broken` broken; `trace`
/// prints every event of the driver and what it decided.
pub fn run(seed: u64, broken: BrokenRule, trace: bool) -> Result<Report, Failure> {
    let mut sim = Sim::new(seed, broken);
    sim.trace = trace;
    let result = sim.run_to_end();
    result.map_err(|reason| Failure {
        seed,
        step: sim.report.steps,
        reason,
    })
}

struct Sim {
    rng: SplitMix64,
    faults: Faults,
    setup: Setup,
    base: Instant,
    /// Virtual milliseconds.
    t: u64,
    storage: Storage,
    driver: JobCheckpoints,
    /// The supervisor's decisions.
    life: JobLifecycle,
    /// What the attempt to deploy restores from, once loaded.
    loaded: Option<Option<CompletedCheckpoint>>,
    /// It restored a checkpoint that ended the input.
    input_ended: bool,
    /// Failures reported to the supervisor, untaken: the coordinator's
    /// (`None`: of the current attempt) and lost workers'.
    failures: VecDeque<(Option<Attempt>, String)>,
    /// Deployments so far: tells each one's files apart.
    instance: u64,
    /// The coordinator answered the job's shutdown.
    shut_down: bool,
    /// `_metadata` writes that landed but reported a failure.
    unknown_outcomes: u64,
    /// Objects the run knowingly left: failed deletions, the uploads of
    /// killed workers.
    garbage: BTreeSet<String>,
    /// The savepoint that stopped the job, for the next run to resume.
    stopped: Option<CheckpointId>,
    /// What this run restores when the job retains nothing: the savepoint
    /// it resumed from.
    started_from: Option<CompletedCheckpoint>,
    requests: Requests,
    /// Empty between attempts.
    tasks: Vec<Task>,
    channels: Vec<Channel>,
    /// The coordinator's mailbox.
    mail: VecDeque<ToCoordinator>,
    /// The coordinator's mailbox is held while the id counter is stored.
    storing_id: bool,
    ops: Vec<Op>,
    /// The sink's external system: records by transaction.
    committed: BTreeMap<u64, Vec<Count>>,
    report: Report,
    trace: bool,
}

impl Sim {
    fn new(seed: u64, broken: BrokenRule) -> Sim {
        let mut rng = SplitMix64::new(seed);
        let mut pick = |choices: &[f64]| choices[rng.next_below(choices.len() as u64) as usize];
        let mut faults = Faults {
            kill: pick(&[0.0, 0.002, 0.01]),
            kills: pick(&[0.0, 1.0, 3.0]) as u32,
            store_id: pick(&[0.0, 0.05]),
            metadata: pick(&[0.0, 0.1, 0.3]),
            upload: pick(&[0.0, 0.02]),
            delete: pick(&[0.0, 0.1, 0.5]),
            until: 200 + pick(&[0.0, 1_000.0, 3_000.0, 6_000.0]) as u64,
            workers: Default::default(),
        };
        // Short enough that some checkpoints expire behind backpressure.
        let timeout = Duration::from_millis(pick(&[300.0, 3_000.0]) as u64);
        for t in 0..=SINK {
            faults.workers[rng.next_below(2) as usize].push(t);
        }
        let alignment = match rng.next_below(3) {
            0 => Alignment::Aligned,
            1 => Alignment::Unaligned,
            _ => Alignment::AlignedWithTimeout(Duration::from_millis(rng.next_below(10))),
        };
        // Unaligned checkpoints run one at a time (as Flink's).
        let concurrent = alignment == Alignment::Aligned && rng.next_below(2) == 0;
        let setup = Setup {
            alignment,
            retain: 1 + rng.next_below(2) as usize,
            timeout,
            max_concurrent: 1 + usize::from(concurrent),
            broken,
        };
        let (requests, requests_at) = (rng.next_below(4) as u32, rng.next_below(2_000));
        let base = Instant::now();
        let storage = Storage::default();
        let now = Now {
            instant: base,
            unix_ms: 0,
        };
        let driver = driver(&storage, storage.recover(setup.retain), &setup, now);
        Sim {
            rng,
            faults,
            setup,
            base,
            t: 0,
            storage,
            driver,
            life: supervisor::lifecycle(),
            loaded: None,
            input_ended: false,
            failures: VecDeque::new(),
            instance: 0,
            shut_down: false,
            unknown_outcomes: 0,
            garbage: BTreeSet::new(),
            stopped: None,
            started_from: None,
            requests: Requests {
                left: requests,
                at: requests_at,
                ..Requests::default()
            },
            tasks: Vec::new(),
            channels: Vec::new(),
            mail: VecDeque::new(),
            storing_id: false,
            ops: Vec::new(),
            committed: BTreeMap::new(),
            report: Report::default(),
            trace: false,
        }
    }

    fn attempt(&self) -> Attempt {
        self.life.attempt()
    }

    fn now(&self) -> Now {
        Now {
            instant: self.base + Duration::from_millis(self.t),
            unix_ms: self.t,
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        let faulty = self.report.steps < self.faults.until
            && (self.rng.next_below(1_000_000) as f64) < p * 1e6;
        self.report.faults += u64::from(faulty);
        faulty
    }

    fn run_to_end(&mut self) -> Result<Report, Failed> {
        self.coordinate(JobEvent::RestoreWanted)?;
        loop {
            while !self.finished() {
                if self.report.steps >= self.faults.until + QUIET_STEPS {
                    return Err(format!(
                        "no progress: not finished {QUIET_STEPS} steps after faults stopped"
                    ));
                }
                self.report.steps += 1;
                self.t += self.rng.next_below(3);
                self.step()?;
                self.check_references()?;
            }
            if !self.resume()? {
                break;
            }
        }
        self.check_output()?;
        self.check_leaks()?;
        if let Some(request) = self.requests.open.keys().next() {
            return Err(format!("request {request} was never answered"));
        }
        Ok(self.report)
    }

    /// The job succeeded, the coordinator shut down, and nothing is left
    /// in flight.
    fn finished(&self) -> bool {
        self.shut_down && self.mail.is_empty() && self.ops.is_empty() && self.failures.is_empty()
    }

    fn step(&mut self) -> Result<(), Failed> {
        if self.kills_now() {
            let kill = self.rng.next_below(3);
            if self.trace {
                let killed = ["the driver", "a worker", "a subtask"][kill as usize];
                eprintln!(
                    "step {} at {} ms: {killed} is killed",
                    self.report.steps, self.t
                );
            }
            return match kill {
                0 => self.kill_driver(),
                1 => self.kill_worker(),
                _ => self.supervise(LifeEvent::Failed {
                    attempt: Some(self.attempt()),
                    error: "a subtask was killed".into(),
                }),
            };
        }
        let steps = self.possible();
        let Some(&step) = steps.get(self.rng.next_below(steps.len().max(1) as u64) as usize) else {
            // Nothing can happen before the clock reaches the next timer.
            match self.driver.poll_timeout() {
                Some(at) => self.t = self.t.max((at - self.base).as_millis() as u64),
                None => return Err("stuck: nothing can happen and no timer is set".into()),
            }
            return Ok(());
        };
        self.take(step)
    }

    fn kills_now(&mut self) -> bool {
        if self.faults.kills == 0 || self.tasks.is_empty() || !self.chance(self.faults.kill) {
            return false;
        }
        self.faults.kills -= 1;
        true
    }

    fn possible(&self) -> Vec<Step> {
        let mut steps = Vec::new();
        if !self.tasks.is_empty() {
            steps.extend((0..SOURCES).filter(|&s| self.can_emit(s)).map(Step::Emit));
            // A killed worker's links carry nothing more.
            let linked = self.channels.iter().enumerate().filter(|(c, _)| {
                let (from, (to, _)) = (task::channel_source(*c), task::channel_target(*c));
                !self.tasks[from].dead && !self.tasks[to].dead
            });
            for (c, channel) in linked {
                if !channel.sender.is_empty() {
                    steps.push(Step::Transmit(c));
                }
                if channel.held > 0 {
                    steps.push(Step::Deliver(c));
                }
            }
            let live = |t: &usize| !self.tasks[*t].dead;
            let room = (SOURCES..=SINK).filter(live).filter(|&t| self.has_room(t));
            steps.extend(room.map(Step::Process));
            let mail = (0..=SINK).filter(live);
            let mail = mail.filter(|&t| !self.tasks[t].mail.is_empty());
            steps.extend(mail.map(Step::Mail));
        }
        if !self.storing_id {
            if !self.mail.is_empty() {
                steps.push(Step::Coordinator);
            }
            let now = self.now().instant;
            if self.driver.poll_timeout().is_some_and(|at| at <= now) {
                steps.push(Step::Tick);
            }
        }
        steps.extend((0..self.ops.len()).map(Step::Complete));
        if !self.failures.is_empty() {
            steps.push(Step::Supervisor);
        }
        if self.can_request() {
            steps.push(Step::Request);
        }
        steps
    }

    fn take(&mut self, step: Step) -> Result<(), Failed> {
        match step {
            Step::Emit(s) => self.emit(s),
            Step::Transmit(c) => self.transmit(c)?,
            Step::Deliver(c) => {
                let now = self.now().instant;
                let channel = &mut self.channels[c];
                if let Some(event) = channel.receiver.poll_deliver() {
                    channel.held -= 1;
                    let (t, gate) = task::channel_target(c);
                    let handler = self.tasks[t].handler.as_mut().expect("a receiving task");
                    for action in handler.deliver(now, gate, event) {
                        self.barrier_action(t, action)?;
                    }
                }
            }
            Step::Process(t) => {
                if !(self.rng.next_below(4) == 0 && self.control(t)?) {
                    self.process(t)?
                }
            }
            Step::Mail(t) => self.take_mail(t)?,
            Step::Coordinator => self.coordinator_mail()?,
            Step::Complete(op) => {
                let op = self.ops.swap_remove(op);
                self.complete(op)?;
            }
            Step::Tick => self.coordinate(JobEvent::Tick)?,
            Step::Request => self.request()?,
            Step::Supervisor => {
                let (attempt, error) = self.failures.pop_front().expect("a failure to take");
                self.supervise(LifeEvent::Failed { attempt, error })?;
            }
        }
        Ok(())
    }

    /// The link of channel `c` carries its next event; an unaligned
    /// barrier overtakes what the receiving end holds, as the input
    /// endpoint does.
    fn transmit(&mut self, c: usize) -> Result<(), Failed> {
        let now = self.now().instant;
        let channel = &mut self.channels[c];
        let Some(event) = channel.sender.poll_send() else {
            return Ok(());
        };
        match event {
            ChannelEvent::Barrier(barrier) if barrier.options.alignment == Alignment::Unaligned => {
                let overtaken = channel.receiver.overtaken();
                let (t, gate) = task::channel_target(c);
                let handler = self.tasks[t].handler.as_mut().expect("a receiving task");
                for action in handler.deliver_priority(now, gate, barrier, overtaken) {
                    self.barrier_action(t, action)?;
                }
            }
            event => {
                channel.receiver.receive(event).map_err(|e| e.to_string())?;
                channel.held += 1;
            }
        }
        Ok(())
    }

    fn coordinator_mail(&mut self) -> Result<(), Failed> {
        let event = match self.mail.pop_front().expect("mail to take") {
            ToCoordinator::Ack(attempt, ack) => JobEvent::Ack { attempt, ack },
            ToCoordinator::Decline {
                attempt,
                checkpoint,
                subtask,
                reason,
            } => JobEvent::Decline {
                attempt,
                checkpoint,
                subtask,
                reason,
            },
            ToCoordinator::Exhausted { attempt, source } => {
                JobEvent::SourceExhausted { attempt, source }
            }
        };
        self.coordinate(event)
    }

    /// A storage call completes: applied whole, its outcome fed back.
    fn complete(&mut self, op: Op) -> Result<(), Failed> {
        match op {
            Op::StoreId {
                checkpoint,
                next_id,
                fails,
            } => {
                self.storing_id = false;
                if !fails {
                    self.storage.next_id = Some(next_id);
                }
                let result = if fails {
                    Err("injected".into())
                } else {
                    Ok(())
                };
                self.coordinate(JobEvent::IdStored { checkpoint, result })
            }
            Op::Metadata { checkpoint, fault } => {
                let id = checkpoint.id;
                if fault != Some(WriteFault::Failed) {
                    self.storage.metadata.insert(id, *checkpoint);
                }
                let result = match fault {
                    None => Ok(format!("chk-{}", id.0)),
                    Some(fault) => Err(WriteFailure {
                        reason: "injected".into(),
                        outcome_unknown: fault == WriteFault::WrittenButTimedOut,
                    }),
                };
                self.coordinate(JobEvent::MetadataWritten {
                    checkpoint: id,
                    result,
                })
            }
            Op::Delete { checkpoints, paths } => self.deleted(checkpoints, paths),
            Op::Savepoint { checkpoint, fails } => self.savepoint_written(*checkpoint, fails),
            Op::Upload { .. } => self.uploaded(op),
        }
    }

    /// A deletion ends, each of its deletes failed or not: as the
    /// coordinator actor, it goes on past a failed one (a `_metadata` that
    /// was not deleted included) and reports it done.
    fn deleted(
        &mut self,
        checkpoints: Vec<CheckpointId>,
        paths: Vec<String>,
    ) -> Result<(), Failed> {
        for id in checkpoints {
            if !self.chance(self.faults.delete) {
                self.storage.metadata.remove(&id);
            }
        }
        for path in paths {
            if self.chance(self.faults.delete) {
                self.garbage.insert(path);
            } else {
                self.storage.objects.remove(&path);
            }
        }
        self.coordinate(JobEvent::Deleted)
    }

    fn uploaded(&mut self, op: Op) -> Result<(), Failed> {
        let Op::Upload {
            attempt,
            task,
            checkpoint,
            objects,
            shared,
            state,
            fails,
        } = op
        else {
            unreachable!("an upload")
        };
        let subtask = task::subtask_id(task);
        if fails {
            let reason = "upload failed".into();
            let decline = ToCoordinator::Decline {
                attempt,
                checkpoint,
                subtask,
                reason,
            };
            self.mail.push_back(decline);
            return Ok(());
        }
        self.storage.objects.extend(objects);
        if attempt == self.attempt() && !self.tasks.is_empty() {
            self.tasks[task].checkpointer.uploaded(checkpoint, shared);
        }
        let ack = Ack {
            subtask,
            checkpoint,
            state: *state,
            metrics: CheckpointMetrics::default(),
        };
        self.mail
            .push_back(ToCoordinator::Ack(attempt, Box::new(ack)));
        Ok(())
    }

    /// Feeds the driver and carries out what it decides, in order.
    fn coordinate(&mut self, event: JobEvent) -> Result<(), Failed> {
        let now = self.now();
        if self.trace {
            eprintln!("step {} at {} ms: {event:?}", self.report.steps, self.t);
        }
        let actions = self.driver.handle(now, event);
        if self.trace {
            for action in &actions {
                eprintln!("  -> {action:?}");
            }
        }
        for action in actions {
            self.carry_out(action)?;
        }
        Ok(())
    }

    fn carry_out(&mut self, action: JobAction) -> Result<(), Failed> {
        let to = |tasks: &mut Vec<Task>, ids: Vec<SubtaskId>, control: &dyn Fn() -> Control| {
            if !tasks.is_empty() {
                for id in ids {
                    tasks[task::index_of(id)].mail.push_back(control());
                }
            }
        };
        match action {
            // The simulated job has no master hooks, hence no states.
            JobAction::TriggerHooks(checkpoint) => self.coordinate(JobEvent::HooksTriggered {
                checkpoint,
                result: Ok(Default::default()),
            })?,
            JobAction::StoreNextId { barrier, next_id } => {
                self.storing_id = true;
                let fails = self.chance(self.faults.store_id);
                let checkpoint = barrier.id;
                self.ops.push(Op::StoreId {
                    checkpoint,
                    next_id,
                    fails,
                });
            }
            JobAction::InjectBarrier {
                sources,
                barrier,
                suspend,
            } => to(&mut self.tasks, sources, &|| {
                Control::Inject(barrier, suspend)
            }),
            JobAction::WriteMetadata(checkpoint) => self.write_metadata(checkpoint),
            JobAction::Delete { checkpoints, paths } => {
                self.ops.push(Op::Delete { checkpoints, paths })
            }
            JobAction::Completed(checkpoint) => {
                self.report.completed += 1;
                self.requests.completed.insert(checkpoint.id);
                self.check_state_at_barrier(&checkpoint)?;
            }
            JobAction::NotifyComplete {
                checkpoint,
                subtasks,
            } => {
                for (id, rewrite) in subtasks {
                    let control = || Control::Complete(checkpoint, rewrite.clone());
                    to(&mut self.tasks, vec![id], &control);
                }
            }
            JobAction::NotifyAbort {
                checkpoint,
                subtasks,
                ..
            } => to(&mut self.tasks, subtasks, &|| Control::Abort(checkpoint)),
            JobAction::EndOfData(sources) => to(&mut self.tasks, sources, &|| Control::EndOfData),
            JobAction::FailJob(reason) => self.failures.push_back((None, reason)),
            JobAction::Restore(latest) => self.loaded(latest)?,
            JobAction::ShutDown => self.shut_down = true,
            JobAction::Resolve { request, result } => self.resolved(request, result)?,
            JobAction::WriteSavepoint { checkpoint, .. } => self.write_savepoint(checkpoint),
            JobAction::Rejected(_) | JobAction::SavepointCompleted { .. } | JobAction::Stats(_) => {
            }
        }
        Ok(())
    }

    fn write_metadata(&mut self, checkpoint: CompletedCheckpoint) {
        let fault = if self.chance(self.faults.metadata) {
            Some(match self.rng.next_below(2) {
                0 => WriteFault::Failed,
                _ => {
                    self.unknown_outcomes += 1;
                    WriteFault::WrittenButTimedOut
                }
            })
        } else {
            None
        };
        self.ops.push(Op::Metadata {
            checkpoint: Box::new(checkpoint),
            fault,
        });
    }

    /// `checkpoint`'s counters hold the counts of exactly the records its
    /// sources had read at its barrier, read back from storage.
    fn check_state_at_barrier(&self, checkpoint: &CompletedCheckpoint) -> Result<(), Failed> {
        let storage = self.storage.holding(checkpoint);
        let tasks = (0..=SINK)
            .map(|t| Task::restored(t, Some(checkpoint), storage, 0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{} does not restore: {e}", checkpoint.id))?;
        let mut expected = vec![BTreeMap::new(); COUNTERS];
        for (s, source) in tasks.iter().take(SOURCES).enumerate() {
            let Role::Source { offset, .. } = source.role else {
                unreachable!("a source")
            };
            for i in 0..offset {
                let key = task::key_of(s, i);
                *expected[task::counter_of(key)].entry(key).or_insert(0) += 1;
            }
        }
        // An unaligned checkpoint holds some of them in flight instead.
        let mut held = vec![BTreeMap::new(); COUNTERS];
        for c in 0..COUNTERS {
            let Role::Counter { counts } = &tasks[SOURCES + c].role else {
                unreachable!("a counter")
            };
            held[c].clone_from(counts);
        }
        let in_flight = task::keys_in_flight(checkpoint)
            .map_err(|e| format!("{} does not restore: {e}", checkpoint.id))?;
        for key in in_flight {
            *held[task::counter_of(key)].entry(key).or_insert(0) += 1;
        }
        for (c, (held, expected)) in held.iter().zip(&expected).enumerate() {
            if held != expected {
                return Err(format!(
                    "{} restores counter {c} (with what is in flight to it) to {held:?}, \
                     not the state at its barrier {expected:?}",
                    checkpoint.id
                ));
            }
        }
        Ok(())
    }

    /// No object that a checkpoint a restore may take references is gone:
    /// the newest retained ones in storage (what a new driver recovers)
    /// and those the driver retains.
    fn check_references(&self) -> Result<(), Failed> {
        let recoverable = self.storage.recoverable(self.setup.retain);
        if let Some((checkpoint, path)) = self.storage.missing(recoverable) {
            return Err(format!("{checkpoint} references {path}, which was deleted"));
        }
        match self.storage.missing(self.driver.store().retained()) {
            Some((id, path)) => Err(format!(
                "retained {id} references {path}, which was deleted"
            )),
            None => Ok(()),
        }
    }

    /// Once the job is over, every object left is one a checkpoint in
    /// storage references or garbage the run knowingly left, unless it lost
    /// track of some: a power loss (objects of calls in flight) or a
    /// `_metadata` write of unknown outcome (kept, since the checkpoint may
    /// exist).
    fn check_leaks(&self) -> Result<(), Failed> {
        if self.report.driver_kills > 0 || self.unknown_outcomes > 0 {
            return Ok(());
        }
        let referenced: std::collections::BTreeSet<&str> = self
            .storage
            .metadata
            .values()
            .flat_map(|c| c.subtasks.values())
            .flat_map(|s| s.handles().filter_map(|h| h.physical()))
            .collect();
        let leaked: Vec<_> = self
            .storage
            .objects
            .keys()
            .filter(|path| !referenced.contains(path.as_str()) && !self.garbage.contains(*path))
            .collect();
        if leaked.is_empty() {
            Ok(())
        } else {
            Err(format!("objects nothing references were left: {leaked:?}"))
        }
    }

    /// The committed output is every key's running count, each exactly once.
    fn check_output(&self) -> Result<(), Failed> {
        let mut totals = BTreeMap::new();
        for s in 0..SOURCES {
            for i in 0..RECORDS {
                *totals.entry(task::key_of(s, i)).or_insert(0u64) += 1;
            }
        }
        let mut expected: Vec<Count> = totals
            .into_iter()
            .flat_map(|(key, n)| (1..=n).map(move |c| (key, c)))
            .collect();
        let mut got: Vec<Count> = self.committed.values().flatten().copied().collect();
        expected.sort_unstable();
        got.sort_unstable();
        if got != expected {
            let (extra, missing) = multiset_difference(&got, &expected);
            return Err(format!(
                "committed output is not exactly once: duplicated or extra {extra:?}, missing {missing:?}"
            ));
        }
        Ok(())
    }
}

/// What `got` has beyond `expected`, and what it lacks; both sorted.
fn multiset_difference(got: &[Count], expected: &[Count]) -> (Vec<Count>, Vec<Count>) {
    let (mut extra, mut missing) = (Vec::new(), Vec::new());
    let (mut got, mut expected) = (got.iter().peekable(), expected.iter().peekable());
    loop {
        match (got.peek(), expected.peek()) {
            (Some(a), Some(b)) if a == b => {
                got.next();
                expected.next();
            }
            (Some(a), Some(b)) if a < b => extra.extend(got.next()),
            (Some(_), None) => extra.extend(got.next()),
            (_, Some(_)) => missing.extend(expected.next()),
            (None, None) => return (extra, missing),
        }
    }
}
