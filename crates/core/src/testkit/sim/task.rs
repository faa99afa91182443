//! The subtasks of the simulated job, each a step of the scheduler: two
//! sources, two keyed counters with incremental snapshots, and a sink that
//! commits in two phases. They run the real barrier handlers, credit
//! channels and subtask checkpointers.

use super::storage::{Op, Storage};
use super::{Failed, Sim, ToCoordinator};
use crate::checkpoint::barrier::{BarrierAction, BarrierHandler, Polled};
use crate::checkpoint::subtask::{SharedBase, SubtaskCheckpointer};
use crate::checkpoint::{
    checksum, ChannelSide, ChannelStateHandle, CompletedCheckpoint, KeyedStateHandle,
    NativeFileHandle, SnapshotFormat, StateHandle, SubtaskState,
};
use crate::dataflow::task::SOURCE_EXHAUSTED;
use crate::model::batch::Batch;
use crate::model::event::{Alignment, Barrier, ChannelEvent, CheckpointKind};
use crate::model::ids::{CheckpointId, OperatorId, SubtaskId, SubtaskIndex};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub(super) const SOURCES: usize = 2;
pub(super) const COUNTERS: usize = 2;
pub(super) const SINK: usize = SOURCES + COUNTERS;
/// Records each source reads.
pub(super) const RECORDS: u64 = 100;
const KEYS: u64 = 40;
/// Files a counter's state is split into: an incremental snapshot uploads
/// only those that changed.
const BUCKETS: u64 = 6;
/// What the sink receives: a key and its running count.
pub(super) type Count = (u64, u64);

/// The transaction a sink commits at the end of its input.
pub(super) const FINAL_TXN: u64 = u64::MAX;

/// The key of source `source`'s record `i`.
pub(super) fn key_of(source: usize, i: u64) -> u64 {
    crate::model::rng::splitmix64(((source as u64) << 32) | i) % KEYS
}

/// The counter a key goes to.
pub(super) fn counter_of(key: u64) -> usize {
    (key % COUNTERS as u64) as usize
}

/// The id of the task at `index` (sources, then counters, then the sink).
pub(super) fn subtask_id(index: usize) -> SubtaskId {
    let (operator, i) = match index {
        i if i < SOURCES => (0, i),
        i if i < SINK => (1, i - SOURCES),
        _ => (2, 0),
    };
    SubtaskId {
        operator: OperatorId(operator),
        index: SubtaskIndex(i as u32),
    }
}

pub(super) fn index_of(id: SubtaskId) -> usize {
    match id.operator.0 {
        0 => id.index.0 as usize,
        1 => SOURCES + id.index.0 as usize,
        _ => SINK,
    }
}

/// A message of the coordinator for a subtask.
pub(super) enum Control {
    /// Inject the barrier; `true`: emit nothing after it (a stop).
    Inject(Barrier, bool),
    Complete(CheckpointId, BTreeSet<String>),
    Abort(CheckpointId),
    EndOfData,
}

pub(super) enum Role {
    Source {
        offset: u64,
        reported: bool,
        ended: bool,
    },
    Counter {
        counts: BTreeMap<u64, u64>,
    },
    Sink {
        open: Vec<Count>,
        pending: BTreeMap<CheckpointId, Vec<Count>>,
        ended: bool,
    },
}

pub(super) struct Task {
    pub role: Role,
    /// None for sources.
    pub handler: Option<BarrierHandler>,
    /// The channel of each gate channel.
    pub inputs: Vec<usize>,
    /// Output channels; a source's by counter.
    pub outputs: Vec<usize>,
    pub checkpointer: SubtaskCheckpointer<()>,
    pub mail: VecDeque<Control>,
    /// It reported itself finished to the supervisor.
    pub finished: bool,
    /// Its worker was killed: it does nothing more.
    pub dead: bool,
    /// An unaligned snapshot waiting for its input channel state.
    pub unaligned: Option<Unaligned>,
    /// Output channel state to send again first, by output.
    pub replay: Vec<(usize, Vec<Batch>)>,
    /// Tells this deployment's files from an earlier one's of equal name.
    pub instance: u64,
}

impl Task {
    /// The task at `index`, resumed from `from`'s state.
    pub fn restored(
        index: usize,
        from: Option<&CompletedCheckpoint>,
        storage: &Storage,
        instance: u64,
    ) -> Result<Task, String> {
        let state = from.and_then(|c| c.subtasks.get(&subtask_id(index)));
        let operator = |name: &str| state.and_then(|s| s.operator.get(name));
        // A savepoint is never the job's own: no snapshot builds on it.
        let owned = from.is_some_and(|c| c.format == SnapshotFormat::JobDirectory);
        let mut base = SharedBase::new();
        let role = match index {
            i if i < SOURCES => Role::Source {
                offset: operator("offset")
                    .map(|b| decode(b))
                    .transpose()?
                    .unwrap_or(0),
                reported: false,
                ended: false,
            },
            i if i < SINK => {
                let mut counts = BTreeMap::new();
                if let Some(KeyedStateHandle::Native(native)) = state.and_then(|s| s.keyed.as_ref())
                {
                    for file in &native.shared {
                        let path = file.handle.physical().unwrap_or_default();
                        counts.extend(decode::<Vec<Count>>(storage.read(path)?)?);
                        if owned {
                            base.insert(file.name.clone(), file.clone());
                        }
                    }
                }
                Role::Counter { counts }
            }
            _ => Role::Sink {
                open: Vec::new(),
                pending: operator("txns")
                    .map(|b| decode(b))
                    .transpose()?
                    .unwrap_or_default(),
                ended: false,
            },
        };
        let (inputs, outputs) = wiring(index);
        let mut handler = (!inputs.is_empty()).then(|| BarrierHandler::new(inputs.len()));
        let mut replay = Vec::new();
        for handle in state.map(|s| s.channels.as_slice()).unwrap_or_default() {
            let i = handle.channel as usize;
            let StateHandle::Inline(bytes) = &handle.handle else {
                return Err("channel state not inline".into());
            };
            match (handle.side, handler.as_mut()) {
                (ChannelSide::Input, Some(handler)) => {
                    handler.replay(i, decode_batches(inputs[i], bytes)?)
                }
                (ChannelSide::Output, _) => replay.push((i, decode_batches(outputs[i], bytes)?)),
                (ChannelSide::Input, None) => return Err("input channel state of a source".into()),
            }
        }
        Ok(Task {
            role,
            handler,
            inputs,
            outputs,
            checkpointer: SubtaskCheckpointer::new(true, base),
            mail: VecDeque::new(),
            finished: false,
            dead: false,
            unaligned: None,
            replay,
            instance,
        })
    }
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    rmp_serde::from_slice(bytes).map_err(|e| e.to_string())
}

/// An unaligned snapshot whose input channel state is still being
/// collected.
pub(super) struct Unaligned {
    checkpoint: CheckpointId,
    state: SubtaskState,
    objects: Vec<(String, Vec<u8>)>,
    shared: SharedBase,
}

/// Whether `channel` carries keys (into a counter) rather than counts.
fn carries_keys(channel: usize) -> bool {
    channel < SOURCES * COUNTERS
}

/// Adds the batches of one channel, if any, to `state`'s channel state.
fn push_channel_state(
    state: &mut SubtaskState,
    side: ChannelSide,
    index: usize,
    channel: usize,
    batches: Vec<Batch>,
) {
    if batches.is_empty() {
        return;
    }
    let count = batches.len() as u32;
    let bytes = if carries_keys(channel) {
        encode_batches::<u64>(batches)
    } else {
        encode_batches::<Count>(batches)
    };
    state.channels.push(ChannelStateHandle {
        side,
        channel: index as u32,
        batches: count,
        handle: StateHandle::Inline(bytes),
    });
}

fn encode_batches<T: crate::model::batch::Data>(batches: Vec<Batch>) -> Vec<u8> {
    let records: Vec<Vec<T>> = batches
        .into_iter()
        .map(|b| b.into_records().expect("records of the channel's type"))
        .collect();
    rmp_serde::to_vec(&records).expect("records encode")
}

/// The batches of `channel`'s state.
fn decode_batches(channel: usize, bytes: &[u8]) -> Result<Vec<Batch>, String> {
    Ok(if carries_keys(channel) {
        let records: Vec<Vec<u64>> = decode(bytes)?;
        records.into_iter().map(Batch::new).collect()
    } else {
        let records: Vec<Vec<Count>> = decode(bytes)?;
        records.into_iter().map(Batch::new).collect()
    })
}

/// The keys in flight towards the counters that `checkpoint`'s channel
/// state holds: output state of the sources, input state of the counters.
pub(super) fn keys_in_flight(checkpoint: &CompletedCheckpoint) -> Result<Vec<u64>, String> {
    let mut keys = Vec::new();
    for (id, state) in &checkpoint.subtasks {
        let (inputs, outputs) = wiring(index_of(*id));
        for handle in &state.channels {
            let i = handle.channel as usize;
            let channel = match handle.side {
                ChannelSide::Input => inputs[i],
                ChannelSide::Output => outputs[i],
            };
            let StateHandle::Inline(bytes) = &handle.handle else {
                return Err("channel state not inline".into());
            };
            if carries_keys(channel) {
                let records: Vec<Vec<u64>> = decode(bytes)?;
                keys.extend(records.into_iter().flatten());
            }
        }
    }
    Ok(keys)
}

/// The channels into and out of task `index`: source `s` feeds counter
/// `c` on channel `s * COUNTERS + c`; counter `c` the sink on channel
/// `SOURCES * COUNTERS + c`.
fn wiring(index: usize) -> (Vec<usize>, Vec<usize>) {
    let to_sink = |c: usize| SOURCES * COUNTERS + c;
    match index {
        s if s < SOURCES => (
            Vec::new(),
            (0..COUNTERS).map(|c| s * COUNTERS + c).collect(),
        ),
        i if i < SINK => {
            let c = i - SOURCES;
            (
                (0..SOURCES).map(|s| s * COUNTERS + c).collect(),
                vec![to_sink(c)],
            )
        }
        _ => ((0..COUNTERS).map(to_sink).collect(), Vec::new()),
    }
}

/// Channels of the job.
pub(super) const CHANNELS: usize = SOURCES * COUNTERS + COUNTERS;

/// The channel's sending task.
pub(super) fn channel_source(channel: usize) -> usize {
    if channel < SOURCES * COUNTERS {
        channel / COUNTERS
    } else {
        SOURCES + channel - SOURCES * COUNTERS
    }
}

/// The channel's receiving task and its gate channel there.
pub(super) fn channel_target(channel: usize) -> (usize, usize) {
    if channel < SOURCES * COUNTERS {
        (SOURCES + channel % COUNTERS, channel / COUNTERS)
    } else {
        (SINK, channel - SOURCES * COUNTERS)
    }
}

impl Sim {
    /// Whether source `s` has something to do: records to emit with room
    /// for them, or its exhaustion to report; not after the barrier of a
    /// stopping savepoint.
    pub(super) fn can_emit(&self, s: usize) -> bool {
        let task = &self.tasks[s];
        if task.dead || task.checkpointer.suspended() {
            return false;
        }
        let Role::Source {
            offset,
            reported,
            ended,
        } = task.role
        else {
            return false;
        };
        !ended && ((offset < RECORDS && self.has_room(s)) || (offset == RECORDS && !reported))
    }

    /// Whether task `t`'s outputs can take another batch: a task whose
    /// output is full waits, as a real one does (backpressure).
    pub(super) fn has_room(&self, t: usize) -> bool {
        let outputs = self.tasks[t].outputs.iter();
        outputs
            .into_iter()
            .all(|&c| self.channels[c].sender.queued_batches() < 3)
    }

    /// Source `s` emits a batch of one to three records, or reports that
    /// it has read everything.
    pub(super) fn emit(&mut self, s: usize) {
        let size = 1 + self.rng.next_below(3);
        let attempt = self.attempt();
        let Role::Source {
            offset, reported, ..
        } = &mut self.tasks[s].role
        else {
            return;
        };
        if *offset == RECORDS {
            *reported = true;
            let source = subtask_id(s);
            self.mail
                .push_back(ToCoordinator::Exhausted { attempt, source });
            return;
        }
        let end = (*offset + size).min(RECORDS);
        let mut by_counter = vec![Vec::new(); COUNTERS];
        for i in *offset..end {
            let key = key_of(s, i);
            by_counter[counter_of(key)].push(key);
        }
        *offset = end;
        for (c, keys) in by_counter.into_iter().enumerate() {
            if !keys.is_empty() {
                let channel = self.tasks[s].outputs[c];
                self.channels[channel]
                    .sender
                    .push(ChannelEvent::Batch(Batch::new(keys)));
            }
        }
    }

    /// Task `t` takes the next thing its barrier handler lets through.
    pub(super) fn process(&mut self, t: usize) -> Result<(), Failed> {
        let now = self.now().instant;
        let Some(handler) = self.tasks[t].handler.as_mut() else {
            return Ok(());
        };
        match handler.poll(now) {
            None | Some(Polled::Watermarks(_)) => Ok(()),
            Some(Polled::Batch {
                channel,
                batch,
                credited,
            }) => {
                if credited {
                    let link = self.tasks[t].inputs[channel];
                    let channel = &mut self.channels[link];
                    let credit = channel.receiver.consumed().map_err(|e| e.to_string())?;
                    channel.sender.grant(credit);
                }
                self.records(t, batch)
            }
            Some(Polled::Actions(actions)) => {
                for action in actions {
                    self.barrier_action(t, action)?;
                }
                Ok(())
            }
        }
    }

    /// Task `t` takes a barrier or cancel marker with nothing ahead of it
    /// (`BarrierHandler::poll_control`); false if there is none.
    pub(super) fn control(&mut self, t: usize) -> Result<bool, Failed> {
        let now = self.now().instant;
        let Some(actions) = self.tasks[t]
            .handler
            .as_mut()
            .and_then(|h| h.poll_control(now))
        else {
            return Ok(false);
        };
        for action in actions {
            self.barrier_action(t, action)?;
        }
        Ok(true)
    }

    fn records(&mut self, t: usize, batch: Batch) -> Result<(), Failed> {
        match &mut self.tasks[t].role {
            Role::Counter { counts } => {
                let keys: Vec<u64> = batch.into_records().map_err(|e| e.to_string())?;
                let out: Vec<Count> = keys
                    .into_iter()
                    .map(|key| {
                        let count = counts.entry(key).or_default();
                        *count += 1;
                        (key, *count)
                    })
                    .collect();
                let channel = self.tasks[t].outputs[0];
                let event = ChannelEvent::Batch(Batch::new(out));
                self.channels[channel].sender.push(event);
            }
            Role::Sink { open, .. } => {
                open.extend(batch.into_records::<Count>().map_err(|e| e.to_string())?)
            }
            Role::Source { .. } => return Err("a source got records".into()),
        }
        Ok(())
    }

    pub(super) fn barrier_action(&mut self, t: usize, action: BarrierAction) -> Result<(), Failed> {
        if self.tasks.is_empty() {
            // An earlier action of the same poll ended the job.
            return Ok(());
        }
        match action {
            BarrierAction::Snapshot {
                barrier, unaligned, ..
            } => self.snapshot(t, barrier, unaligned, false),
            BarrierAction::ChannelState {
                checkpoint, inputs, ..
            } => {
                let task = &mut self.tasks[t];
                let pending = task.unaligned.take();
                let Some(mut pending) = pending.filter(|p| p.checkpoint == checkpoint) else {
                    return Err(format!(
                        "channel state of {checkpoint}, not being snapshotted"
                    ));
                };
                for (gate, batches) in inputs.into_iter().enumerate() {
                    let channel = task.inputs[gate];
                    push_channel_state(
                        &mut pending.state,
                        ChannelSide::Input,
                        gate,
                        channel,
                        batches,
                    );
                }
                let Unaligned {
                    state,
                    objects,
                    shared,
                    ..
                } = pending;
                self.upload(t, checkpoint, state, objects, shared);
            }
            BarrierAction::Abort { checkpoint, reason } => {
                let task = &mut self.tasks[t];
                if task
                    .unaligned
                    .as_ref()
                    .is_some_and(|p| p.checkpoint == checkpoint)
                {
                    task.unaligned = None;
                }
                self.mail.push_back(ToCoordinator::Decline {
                    attempt: self.attempt(),
                    checkpoint,
                    subtask: subtask_id(t),
                    reason: format!("{reason:?}"),
                });
                self.forward(t, ChannelEvent::CancelMarker(checkpoint));
            }
            BarrierAction::EndInput => {
                self.forward(t, ChannelEvent::EndOfPartition);
                let Role::Sink {
                    open,
                    pending,
                    ended,
                } = &mut self.tasks[t].role
                else {
                    return self.task_finished(t);
                };
                // As the bundled sinks' `finish`: the input ended by a
                // completed checkpoint, so everything pending commits, and
                // what came after the last barrier (nothing a restore
                // could not replay into this same transaction) goes into
                // the final one, which replaces itself.
                let (last, due) = (std::mem::take(open), std::mem::take(pending));
                *ended = true;
                self.commit(due)?;
                self.committed.insert(FINAL_TXN, last);
                return self.task_finished(t);
            }
        }
        Ok(())
    }

    fn forward(&mut self, t: usize, event: ChannelEvent) {
        for &c in &self.tasks[t].outputs {
            self.channels[c].sender.push(event.clone());
        }
    }

    /// The synchronous part of task `t`'s snapshot at `barrier`, which it
    /// then forwards; the asynchronous part is an upload in flight.
    /// `suspend`: the source emits nothing after it.
    pub(super) fn snapshot(&mut self, t: usize, barrier: Barrier, unaligned: bool, suspend: bool) {
        let id = barrier.id;
        let (mut state, objects, shared) = self.state_of(t, id, barrier.options.kind, suspend);
        if !unaligned {
            self.forward(t, ChannelEvent::Barrier(barrier));
            return self.upload(t, id, state, objects, shared);
        }
        // Ahead of the queued output, which becomes channel state.
        for i in 0..self.tasks[t].outputs.len() {
            let channel = self.tasks[t].outputs[i];
            let sender = &mut self.channels[channel].sender;
            let overtaken = sender.push_priority(ChannelEvent::Barrier(barrier));
            push_channel_state(&mut state, ChannelSide::Output, i, channel, overtaken);
        }
        if self.tasks[t].handler.is_none() {
            return self.upload(t, id, state, objects, shared);
        }
        // The input's channel state follows (or an abort).
        self.tasks[t].unaligned = Some(Unaligned {
            checkpoint: id,
            state,
            objects,
            shared,
        });
    }

    /// The synchronous part of task `t`'s snapshot for checkpoint `id`.
    fn state_of(
        &mut self,
        t: usize,
        id: CheckpointId,
        kind: CheckpointKind,
        suspend: bool,
    ) -> (SubtaskState, Vec<(String, Vec<u8>)>, SharedBase) {
        let task = &mut self.tasks[t];
        let base = task.checkpointer.started(id, kind, suspend, ());
        let mut state = SubtaskState::default();
        let mut objects = Vec::new();
        let mut shared = SharedBase::new();
        match &mut task.role {
            Role::Source { offset, .. } => {
                let encoded = rmp_serde::to_vec(offset).expect("an offset encodes");
                state.operator.insert("offset".into(), encoded);
                if *offset == RECORDS {
                    state.operator.insert(SOURCE_EXHAUSTED.into(), Vec::new());
                }
            }
            Role::Counter { counts } => {
                let base = base.unwrap_or_default();
                for bucket in 0..BUCKETS {
                    let entries: Vec<Count> = counts
                        .iter()
                        .filter(|(key, _)| (**key / COUNTERS as u64) % BUCKETS == bucket)
                        .map(|(k, c)| (*k, *c))
                        .collect();
                    let bytes = rmp_serde::to_vec(&entries).expect("counts encode");
                    let name = format!("b{bucket}-{:08x}", checksum(&bytes));
                    let file = base.get(&name).cloned().unwrap_or_else(|| {
                        let path = format!("shared/{t}-{}-{name}", id.0);
                        let handle = StateHandle::object(&path, bytes.len() as u64, 0);
                        objects.push((path, bytes));
                        NativeFileHandle {
                            name: name.clone(),
                            handle,
                            uploaded_by: id,
                            instance: task.instance,
                        }
                    });
                    shared.insert(name, file);
                }
                state.keyed =
                    crate::testkit::native(shared.values().cloned().collect(), Vec::new()).keyed;
            }
            Role::Sink { open, pending, .. } => {
                pending.insert(id, std::mem::take(open));
                let encoded = rmp_serde::to_vec(pending).expect("transactions encode");
                state.operator.insert("txns".into(), encoded);
            }
        }
        (state, objects, shared)
    }

    /// Starts the asynchronous part of task `t`'s snapshot.
    fn upload(
        &mut self,
        t: usize,
        checkpoint: CheckpointId,
        state: SubtaskState,
        objects: Vec<(String, Vec<u8>)>,
        shared: SharedBase,
    ) {
        let fails = self.chance(self.faults.upload);
        self.ops.push(Op::Upload {
            attempt: self.attempt(),
            task: t,
            checkpoint,
            objects,
            shared,
            state: Box::new(state),
            fails,
        });
    }

    /// Task `t` takes the next message of the coordinator.
    pub(super) fn take_mail(&mut self, t: usize) -> Result<(), Failed> {
        let Some(control) = self.tasks[t].mail.pop_front() else {
            return Ok(());
        };
        match control {
            Control::Inject(barrier, suspend) => match self.tasks[t].role {
                Role::Source { ended: false, .. } => {
                    let unaligned = barrier.options.alignment == Alignment::Unaligned;
                    self.snapshot(t, barrier, unaligned, suspend)
                }
                _ => self.mail.push_back(ToCoordinator::Decline {
                    attempt: self.attempt(),
                    checkpoint: barrier.id,
                    subtask: subtask_id(t),
                    reason: "the source has ended".into(),
                }),
            },
            Control::Complete(checkpoint, rewrite) => {
                let task = &mut self.tasks[t];
                task.checkpointer.completed(checkpoint, &rewrite);
                if let Role::Sink { pending, .. } = &mut task.role {
                    let rest = pending.split_off(&CheckpointId(checkpoint.0 + 1));
                    let due = std::mem::replace(pending, rest);
                    self.commit(due)?;
                }
            }
            Control::Abort(checkpoint) => {
                let task = &mut self.tasks[t];
                task.checkpointer.aborted(checkpoint);
                let actions = task
                    .handler
                    .as_mut()
                    .map(|h| h.abort(checkpoint))
                    .unwrap_or_default();
                for action in actions {
                    self.barrier_action(t, action)?;
                }
            }
            Control::EndOfData => {
                if let Role::Source { ended, .. } = &mut self.tasks[t].role {
                    *ended = true;
                }
                self.forward(t, ChannelEvent::EndOfPartition);
                self.task_finished(t)?;
            }
        }
        Ok(())
    }

    /// Commits transactions into the sink's external system: a commit is
    /// idempotent, and one transaction never holds two different outputs.
    pub(super) fn commit(
        &mut self,
        transactions: BTreeMap<CheckpointId, Vec<Count>>,
    ) -> Result<(), Failed> {
        for (txn, records) in transactions {
            match self.committed.get(&txn.0) {
                Some(done) if *done != records => {
                    return Err(format!("transaction {txn} committed twice, differently"))
                }
                Some(_) => {}
                None => {
                    self.committed.insert(txn.0, records);
                }
            }
        }
        Ok(())
    }
}
