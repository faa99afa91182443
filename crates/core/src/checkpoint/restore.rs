//! Which state each subtask of a job resumes from: the pure half of a
//! restore. It checks that the checkpoint fits the job and cuts every keyed
//! state object into the byte ranges of its key groups, so that the shell
//! only has to read objects and hand out slices.

use super::entries::{
    broadcast_state_of, is_sink_entry, SplitBytes, ASYNC_IN_FLIGHT, SOURCE_EXHAUSTED,
    SOURCE_POSITION, SOURCE_SPLITS, SOURCE_WATERMARK,
};
use super::{
    ChannelSide, ChannelStateHandle, CompletedCheckpoint, KeyGroupsStateHandle, KeyedStateHandle,
    NativeFileHandle, NativeStateHandle, StateHandle, SubtaskState,
};
use crate::model::graph::{Edge, JobGraph, OperatorSpec, Partitioner};
use crate::model::ids::{CheckpointId, KeyGroup, OperatorId, SubtaskId, SubtaskIndex};
use crate::model::key_group::{subtask_for_key_group, KeyGroupRange};
use crate::model::key_hash::KEY_HASH_VERSION;
use crate::model::split::{self, SplitPosition};
use crate::time::watermark::GeneratorState;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use thiserror::Error;

/// Why a checkpoint cannot be restored into a job. Nothing has been read or
/// started when it is returned.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RestoreError {
    /// State of an operator id the job does not have.
    #[error("the checkpoint has state for {0}, which this job does not have")]
    UnknownSubtask(SubtaskId),
    /// Channel state of a broadcast edge whose consumer was rescaled.
    #[error("checkpoint {checkpoint} is unaligned and holds in-flight records of the broadcast edge {from:?} -> {to:?}, whose consumer's parallelism changed; every consumer had read the broadcast up to another point, so they cannot be redistributed: restore at the checkpointed parallelism, or from a savepoint")]
    BroadcastRescale {
        /// The restored checkpoint.
        checkpoint: CheckpointId,
        /// The producer's name.
        from: String,
        /// The consumer's name.
        to: String,
    },
    /// An operator's max parallelism changed: its key groups do not map.
    #[error("operator {name:?} has max parallelism {checkpointed} in the checkpoint and {now} in the job; key groups cannot be mapped between them (set the job's max parallelism to {checkpointed})")]
    MaxParallelism {
        /// The operator's name.
        name: String,
        /// Its max parallelism in the checkpoint.
        checkpointed: u32,
        /// Its max parallelism in the job.
        now: u32,
    },
    /// State of an operator uid the job does not have, without
    /// `allow_non_restored`.
    #[error("the checkpoint holds state of operator uid {0:?}, which the job does not have; --allow-non-restored-state drops it")]
    NotRestored(String),
    /// An operator uid of the job without state in the checkpoint, without
    /// `allow_non_restored`.
    #[error("operator uid {0:?} of the job is not in the checkpoint; --allow-non-restored-state starts it empty")]
    NotInCheckpoint(String),
    /// Keyed state assigned to key groups with another key hash: its keys
    /// would not be found.
    #[error("checkpoint {checkpoint} assigned keys to key groups with key hash version {found}, this build uses version {expected}: its keyed state would not be found (version 0 is the unstable hash of releases before it); restore it with the build that wrote it, and take a savepoint there only if the keys can be re-read")]
    KeyHash {
        /// The restored checkpoint.
        checkpoint: CheckpointId,
        /// The checkpoint's version.
        found: u32,
        /// This build's.
        expected: u32,
    },
    /// Unaligned channel state of an operator whose edges differ from the
    /// checkpointed job's: its channels cannot be matched.
    #[error("checkpoint {checkpoint} is unaligned and holds in-flight records of operator uid {uid:?}, whose {side} edges differ from the checkpointed job's; restore it into the same topology, or from a savepoint or an aligned checkpoint")]
    ChannelLayout {
        /// The restored checkpoint.
        checkpoint: CheckpointId,
        /// The operator's uid.
        uid: String,
        /// `"input"` or `"output"`.
        side: &'static str,
    },
    /// The checkpoint contradicts itself (key groups of another subtask,
    /// offsets outside an object, channels that do not exist...).
    #[error("the state of {subtask} is malformed: {problem}")]
    Malformed {
        /// The subtask whose state is wrong (index 0 for a whole operator).
        subtask: SubtaskId,
        /// What is wrong.
        problem: String,
    },
    /// A state object does not hold what the checkpoint recorded: truncated,
    /// replaced or corrupted.
    #[error("the state of {subtask} cannot be restored: {source}")]
    Corrupted {
        /// The subtask whose state it is.
        subtask: SubtaskId,
        /// The object and what is wrong with it.
        source: super::HandleMismatch,
    },
}

/// Why restoring one checkpoint failed, as far as trying another goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreFailure {
    /// Its state is damaged or gone: an object missing, truncated or
    /// corrupted. An older checkpoint may still serve.
    DamagedState,
    /// Anything else: the checkpoint does not fit the job, or storage is
    /// down. An older one would fail alike, or restore less without a word.
    Other,
}

impl RestoreFailure {
    /// What a restore error means.
    pub fn of_restore(error: &RestoreError) -> Self {
        match error {
            RestoreError::Corrupted { .. } => RestoreFailure::DamagedState,
            _ => RestoreFailure::Other,
        }
    }
}

/// The checkpoints a start may restore from, newest first: with `--restore
/// latest` the retained ones, otherwise the one asked for. A checkpoint
/// whose state turns out damaged gives way to the one before it; any other
/// failure fails the start.
#[derive(Debug)]
pub struct RestoreCandidates<T> {
    newest_first: std::collections::VecDeque<T>,
}

impl<T> RestoreCandidates<T> {
    /// `newest_first`, tried in that order.
    pub fn new(newest_first: impl IntoIterator<Item = T>) -> Self {
        RestoreCandidates {
            newest_first: newest_first.into_iter().collect(),
        }
    }

    /// The next checkpoint to try; `None`: start without state.
    pub fn next_to_try(&mut self) -> Option<T> {
        self.newest_first.pop_front()
    }

    /// After the one tried last failed with `failure`: the one that
    /// `next_to_try` gives instead, if the failure allows falling back and
    /// one is left; `None`: the start fails.
    pub fn fall_back(&self, failure: RestoreFailure) -> Option<&T> {
        match failure {
            RestoreFailure::DamagedState => self.newest_first.front(),
            RestoreFailure::Other => None,
        }
    }
}

/// Key groups of one state object that a subtask reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedSlices {
    /// The state object, in the key-group format.
    pub handle: StateHandle,
    /// Byte ranges within the state object's bytes.
    pub groups: Vec<(KeyGroup, Range<u64>)>,
}

/// What one subtask resumes from, as references into the checkpoint; the
/// shell reads them into a `RestoreState`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestorePlan {
    /// Key groups it owns, in the key-group format, slice by slice.
    pub keyed: Vec<KeyedSlices>,
    /// Its operator state, redistributed if the parallelism changed.
    pub operator: BTreeMap<String, Vec<u8>>,
    /// Sink transactions of subtasks a rescale removed: pre-committed, to
    /// be committed by this subtask.
    pub adopted: Vec<(String, Vec<u8>)>,
    /// In-flight batches to replay, each on a channel the subtask has.
    pub channels: Vec<ChannelStateHandle>,
    /// The replayed input came over a hash edge whose consumer was rescaled:
    /// it holds records of key groups other subtasks own now, which this
    /// subtask must drop.
    pub filter_replay: bool,
    /// The native checkpoint with the most of the key groups the subtask
    /// owns, to download, open and clip to them.
    pub native: Option<NativeStateHandle>,
    /// Further native checkpoints holding key groups the subtask owns, after
    /// a rescale: their owned key groups are copied in.
    pub imports: Vec<NativeStateHandle>,
}

impl RestorePlan {
    /// The shared files the subtask's next incremental checkpoint may
    /// reference instead of uploading them again: those of its native
    /// checkpoint if the job `owned` the restored checkpoint and nothing was
    /// imported. Files the job does not own are never referenced by its
    /// checkpoints, so the first one after such a restore is full, and so is
    /// the first one after a rescale merged several.
    pub fn incremental_base(&self, owned: bool) -> &[NativeFileHandle] {
        match &self.native {
            Some(native) if owned && self.imports.is_empty() => &native.shared,
            _ => &[],
        }
    }
}

/// The byte range of each key group of `handle` in its object. Everything
/// in it comes from `_metadata`: offsets outside the object, or key groups
/// counted past `u32::MAX` from `start_group`, are malformed, not a panic.
fn ranges(
    subtask: SubtaskId,
    handle: &KeyGroupsStateHandle,
) -> Result<Vec<(KeyGroup, Range<u64>)>, RestoreError> {
    let malformed = |problem: String| RestoreError::Malformed { subtask, problem };
    let size = handle.handle.size();
    let mut out = Vec::with_capacity(handle.offsets.len());
    for (i, &start) in handle.offsets.iter().enumerate() {
        let end = handle.offsets.get(i + 1).copied().unwrap_or(size);
        if start > end || end > size {
            return Err(malformed(format!(
                "key group offsets {start}..{end} outside an object of {size} bytes"
            )));
        }
        let group = u32::try_from(i)
            .ok()
            .and_then(|i| handle.start_group.checked_add(i))
            .ok_or_else(|| {
                malformed(format!(
                    "{} key groups from {}, past the last key group",
                    handle.offsets.len(),
                    KeyGroup(handle.start_group)
                ))
            })?;
        out.push((KeyGroup(group), start..end));
    }
    Ok(out)
}

fn overlap(a: KeyGroupRange, b: KeyGroupRange) -> u32 {
    (a.end.min(b.end) + 1).saturating_sub(a.start.max(b.start))
}

/// The state of every subtask of `graph` in `checkpoint`, at the job's
/// parallelism, which may differ from the checkpoint's: key groups go to
/// the subtask that owns them now, source positions are redistributed so
/// that every record is read exactly once, the sink transactions of
/// removed subtasks go to subtask 0, and the in-flight records of an
/// unaligned checkpoint go to the consumers that may own them. Subtasks the
/// checkpoint knows nothing of start empty.
/// Operators are matched by uid, so that a job whose operators were
/// reordered or added restores; state of an operator the job lacks, and an
/// operator of the job without state in the checkpoint, are errors unless
/// `allow_non_restored` (the state is dropped, the operator starts empty).
pub fn plan(
    checkpoint: &CompletedCheckpoint,
    graph: &JobGraph,
    allow_non_restored: bool,
) -> Result<HashMap<SubtaskId, RestorePlan>, RestoreError> {
    let keyed = checkpoint.subtasks.values().any(|s| s.keyed.is_some());
    if keyed && checkpoint.key_hash != KEY_HASH_VERSION {
        return Err(RestoreError::KeyHash {
            checkpoint: checkpoint.id,
            found: checkpoint.key_hash,
            expected: KEY_HASH_VERSION,
        });
    }
    check_channel_layout(checkpoint, graph)?;
    let checkpoint = &by_uid(checkpoint, graph, allow_non_restored)?;
    for recorded in &checkpoint.operators {
        let Some(op) = graph.operators.get(recorded.id.0 as usize) else {
            continue;
        };
        if op.max_parallelism != recorded.max_parallelism {
            return Err(RestoreError::MaxParallelism {
                name: op.name.clone(),
                checkpointed: recorded.max_parallelism,
                now: op.max_parallelism,
            });
        }
    }
    let mut old: BTreeMap<OperatorId, Vec<(SubtaskIndex, &SubtaskState)>> = BTreeMap::new();
    for (subtask, state) in &checkpoint.subtasks {
        if subtask.operator.0 as usize >= graph.operators.len() {
            return Err(RestoreError::UnknownSubtask(*subtask));
        }
        old.entry(subtask.operator)
            .or_default()
            .push((subtask.index, state));
    }
    let mut checkpointed: BTreeMap<OperatorId, u32> = checkpoint
        .operators
        .iter()
        .map(|o| (o.id, o.parallelism))
        .collect();
    for (&operator, states) in &old {
        let parallelism = states
            .iter()
            .map(|(i, _)| i.0.saturating_add(1))
            .max()
            .unwrap_or(0);
        checkpointed.entry(operator).or_insert(parallelism);
    }
    if checkpoint.operators.is_empty() {
        // Numbered like the job (`by_uid`), and at its parallelism where no
        // state says otherwise.
        for op in &graph.operators {
            checkpointed.entry(op.id).or_insert(op.parallelism);
        }
    }
    for (&operator, &parallelism) in &checkpointed {
        let max = graph.operator(operator).max_parallelism;
        if parallelism == 0 || parallelism > max {
            return Err(RestoreError::Malformed {
                subtask: SubtaskId {
                    operator,
                    index: SubtaskIndex(0),
                },
                problem: format!("an operator at parallelism {parallelism}, outside 1..={max}"),
            });
        }
    }
    let mut plans = HashMap::new();
    for (&operator, states) in &old {
        plan_operator(graph, operator, checkpointed[&operator], states, &mut plans)?;
    }
    plan_channels(checkpoint.id, graph, &checkpointed, &old, &mut plans)?;
    Ok(plans)
}

/// Refuses channel state whose channels the job lays out otherwise: an
/// operator's gate and outputs are its edges in order, so in-flight records
/// only map back where those edges (by the uids at their other end, input
/// and partitioner) are the checkpointed job's. Parallelism may differ.
fn check_channel_layout(
    checkpoint: &CompletedCheckpoint,
    graph: &JobGraph,
) -> Result<(), RestoreError> {
    if checkpoint.edges.is_empty() {
        // Written before job graphs were DAGs: one linear pipeline.
        return Ok(());
    }
    let uid_in = |ops: &[OperatorSpec], id: OperatorId| {
        ops.iter().find(|o| o.id == id).map(|o| o.uid.clone())
    };
    let sides = |ops: &[OperatorSpec], edges: &[Edge], uid: &str, input: bool| {
        edges
            .iter()
            .filter(|e| uid_in(ops, if input { e.to } else { e.from }).as_deref() == Some(uid))
            .map(|e| {
                let other = uid_in(ops, if input { e.from } else { e.to });
                (other, e.input, e.partitioner)
            })
            .collect::<Vec<_>>()
    };
    for (subtask, state) in &checkpoint.subtasks {
        // State of an operator the job lacks is dropped with it.
        let Some(uid) = uid_in(&checkpoint.operators, subtask.operator)
            .filter(|uid| graph.operators.iter().any(|o| o.uid == *uid))
        else {
            continue;
        };
        for (side, input) in [(ChannelSide::Input, true), (ChannelSide::Output, false)] {
            if !state.channels.iter().any(|c| c.side == side) {
                continue;
            }
            let then = sides(&checkpoint.operators, &checkpoint.edges, &uid, input);
            let now = sides(&graph.operators, &graph.edges, &uid, input);
            if then != now {
                return Err(RestoreError::ChannelLayout {
                    checkpoint: checkpoint.id,
                    uid,
                    side: if input { "input" } else { "output" },
                });
            }
        }
    }
    Ok(())
}

/// `checkpoint` with its operators renumbered as the operators of `graph`
/// with the same uid. A checkpoint that records no operators is taken as
/// numbered like the job.
fn by_uid(
    checkpoint: &CompletedCheckpoint,
    graph: &JobGraph,
    allow_non_restored: bool,
) -> Result<CompletedCheckpoint, RestoreError> {
    let mut out = checkpoint.clone();
    if checkpoint.operators.is_empty() {
        return Ok(out);
    }
    let mut ids: BTreeMap<OperatorId, OperatorId> = BTreeMap::new();
    out.operators.clear();
    for recorded in &checkpoint.operators {
        match graph.operators.iter().find(|op| op.uid == recorded.uid) {
            Some(op) => {
                ids.insert(recorded.id, op.id);
                out.operators.push(OperatorSpec {
                    id: op.id,
                    ..recorded.clone()
                });
            }
            None if allow_non_restored => {}
            None => return Err(RestoreError::NotRestored(recorded.uid.clone())),
        }
    }
    if !allow_non_restored {
        if let Some(op) = graph
            .operators
            .iter()
            .find(|op| !ids.values().any(|id| *id == op.id))
        {
            return Err(RestoreError::NotInCheckpoint(op.uid.clone()));
        }
    }
    out.subtasks = std::mem::take(&mut out.subtasks)
        .into_iter()
        .filter_map(|(subtask, state)| {
            let operator = *ids.get(&subtask.operator)?;
            Some((
                SubtaskId {
                    operator,
                    ..subtask
                },
                state,
            ))
        })
        .collect();
    Ok(out)
}

/// Key groups, native checkpoints and operator state of one
/// operator's subtasks at `graph`'s parallelism, from `states` at
/// `checkpointed`.
fn plan_operator(
    graph: &JobGraph,
    operator: OperatorId,
    checkpointed: u32,
    states: &[(SubtaskIndex, &SubtaskState)],
    plans: &mut HashMap<SubtaskId, RestorePlan>,
) -> Result<(), RestoreError> {
    let op = graph.operator(operator);
    let id = |index| SubtaskId { operator, index };
    let mut slices: Vec<KeyedSlices> = Vec::new();
    let mut natives: Vec<&NativeStateHandle> = Vec::new();
    for &(index, state) in states {
        let subtask = id(index);
        if index.0 >= checkpointed {
            return Err(RestoreError::Malformed {
                subtask,
                problem: format!("a subtask of an operator at parallelism {checkpointed}"),
            });
        }
        let owned = KeyGroupRange::for_subtask(op.max_parallelism, checkpointed, index);
        match &state.keyed {
            None => {}
            Some(KeyedStateHandle::KeyGroups(keyed)) => {
                let groups = ranges(subtask, keyed)?;
                if let Some((group, _)) = groups.iter().find(|(g, _)| !owned.contains(*g)) {
                    return Err(RestoreError::Malformed {
                        subtask,
                        problem: format!("{group} belongs to another subtask"),
                    });
                }
                slices.push(KeyedSlices {
                    handle: keyed.handle.clone(),
                    groups,
                });
            }
            Some(KeyedStateHandle::Native(native)) => {
                if native.key_groups != owned {
                    return Err(RestoreError::Malformed {
                        subtask,
                        problem: format!(
                            "a native checkpoint of {:?} where the subtask owns {owned:?}",
                            native.key_groups
                        ),
                    });
                }
                natives.push(native);
            }
        }
    }
    let operator_states =
        operator_state(op.parallelism, checkpointed, states).map_err(|problem| {
            RestoreError::Malformed {
                subtask: id(SubtaskIndex(0)),
                problem,
            }
        })?;
    for (j, (operator_state, adopted)) in operator_states.into_iter().enumerate() {
        let index = SubtaskIndex(j as u32);
        let owned = KeyGroupRange::for_subtask(op.max_parallelism, op.parallelism, index);
        let mut plan = RestorePlan {
            operator: operator_state,
            adopted,
            ..RestorePlan::default()
        };
        for keyed in &slices {
            let groups: Vec<_> = keyed
                .groups
                .iter()
                .filter(|(g, _)| owned.contains(*g))
                .cloned()
                .collect();
            if !groups.is_empty() {
                plan.keyed.push(KeyedSlices {
                    handle: keyed.handle.clone(),
                    groups,
                });
            }
        }
        let mut overlapping: Vec<&NativeStateHandle> = natives
            .iter()
            .copied()
            .filter(|n| overlap(n.key_groups, owned) > 0)
            .collect();
        overlapping.sort_by_key(|n| std::cmp::Reverse(overlap(n.key_groups, owned)));
        let mut overlapping = overlapping.into_iter().cloned();
        plan.native = overlapping.next();
        plan.imports = overlapping.collect();
        plans.insert(id(index), plan);
    }
    Ok(())
}

/// In-flight records of an unaligned checkpoint, edge by edge. The
/// checkpoint records operators, not edges: the job's edges are taken as
/// the checkpointed job's. Where neither end of an edge changed its
/// parallelism, every channel state stays with its subtask. Otherwise all
/// of them are records on their way to a consumer: those of old channel
/// p -> c, what c had received and then what p had not yet sent, are
/// replayed in that order as input of the new consumers that may own them.
/// On a hash edge that is every new owner of a key group of old c, which
/// drops the records of key groups it does not own (Flink filters recovered
/// records the same way); on a rebalance or forward edge it is consumer
/// c mod the new parallelism; on a broadcast edge, whose consumers each had
/// read up to another point, it is c itself, and a consumer that changed its
/// parallelism is refused. They go to input channel p mod the new input
/// count, so the records of one old channel stay in order. An edge with an
/// end the checkpoint does not hold (dropped by uid) loses its channel
/// state with that end's state.
fn plan_channels(
    checkpoint: CheckpointId,
    graph: &JobGraph,
    checkpointed: &BTreeMap<OperatorId, u32>,
    old: &BTreeMap<OperatorId, Vec<(SubtaskIndex, &SubtaskState)>>,
    plans: &mut HashMap<SubtaskId, RestorePlan>,
) -> Result<(), RestoreError> {
    let was = |op: OperatorId| checkpointed.get(&op).copied();
    // By index in `graph.edges`, with the parallelism each end ran at.
    let edges: Vec<(usize, &Edge, u32, u32)> = graph
        .edges
        .iter()
        .enumerate()
        .filter_map(|(i, e)| Some((i, e, was(e.from)?, was(e.to)?)))
        .collect();
    for &(_, edge, from, to) in &edges {
        if edge.partitioner == Partitioner::Forward && from != to {
            return Err(RestoreError::Malformed {
                subtask: SubtaskId {
                    operator: edge.to,
                    index: SubtaskIndex(0),
                },
                problem: format!("a forward edge from parallelism {from} to {to}"),
            });
        }
    }
    // The checkpointed gates and outputs: the job's edges (the same as the
    // checkpointed job's around any channel state, `check_channel_layout`),
    // at the parallelism they ran at. `None`: an edge of the side has an
    // end the checkpoint does not hold.
    let old_parallelism = |op: OperatorId| was(op).unwrap_or(0);
    let channels_of = |operator: OperatorId, side: ChannelSide| {
        let input = side == ChannelSide::Input;
        let mut count = 0;
        for edge in graph.edges.iter().filter(|e| {
            if input {
                e.to == operator
            } else {
                e.from == operator
            }
        }) {
            let &(.., from, to) = edges.iter().find(|(_, e, ..)| *e == edge)?;
            count += match (edge.partitioner, input) {
                (Partitioner::Forward, _) => 1,
                (_, true) => from,
                (_, false) => to,
            };
        }
        Some(count)
    };
    for (&operator, states) in old {
        for &(index, state) in states {
            for channel in &state.channels {
                let count = channels_of(operator, channel.side);
                if count.is_some_and(|count| channel.channel >= count) {
                    return Err(RestoreError::Malformed {
                        subtask: SubtaskId { operator, index },
                        problem: format!(
                            "channel state for {:?} channel {} of {}",
                            channel.side,
                            channel.channel,
                            count.unwrap_or(0)
                        ),
                    });
                }
            }
        }
    }
    let handles = |operator: OperatorId, index: u32, side: ChannelSide, channel: u32| {
        old.get(&operator)
            .and_then(|states| states.iter().find(|(i, _)| i.0 == index))
            .into_iter()
            .flat_map(|(_, state)| state.channels.iter())
            .filter(move |c| c.side == side && c.channel == channel)
    };
    let new_parallelism = |op: OperatorId| graph.operator(op).parallelism;
    for &(index, edge, from, to) in &edges {
        let consumer = graph.operator(edge.to);
        let (new_from, new_to) = (graph.operator(edge.from).parallelism, consumer.parallelism);
        let forward = edge.partitioner == Partitioner::Forward;
        let old_in = graph.channel_offset(index, true, old_parallelism);
        let old_out = graph.channel_offset(index, false, old_parallelism);
        let new_in = graph.channel_offset(index, true, new_parallelism);
        let new_out = graph.channel_offset(index, false, new_parallelism);
        for c in 0..to {
            for (k, p) in (0..from).filter(|&p| !forward || p == c).enumerate() {
                let mut records: Vec<ChannelStateHandle> =
                    handles(edge.to, c, ChannelSide::Input, old_in + k as u32)
                        .cloned()
                        .collect();
                let outgoing: Vec<ChannelStateHandle> = handles(
                    edge.from,
                    p,
                    ChannelSide::Output,
                    old_out + if forward { 0 } else { c },
                )
                .cloned()
                .collect();
                if from == new_from && to == new_to {
                    // Other edges of the gate may have changed their width.
                    let kept = [
                        (edge.to, c, new_in + k as u32, records),
                        (
                            edge.from,
                            p,
                            new_out + if forward { 0 } else { c },
                            outgoing,
                        ),
                    ];
                    for (operator, index, channel, kept) in kept {
                        if kept.is_empty() {
                            continue;
                        }
                        plan_of(plans, operator, index).channels.extend(
                            kept.into_iter()
                                .map(|h| ChannelStateHandle { channel, ..h }),
                        );
                    }
                    continue;
                }
                records.extend(outgoing);
                if records.is_empty() {
                    continue;
                }
                let targets: Vec<u32> = match edge.partitioner {
                    // Each consumer's pending broadcast records are its own.
                    Partitioner::Broadcast if to == new_to => vec![c],
                    Partitioner::Broadcast => {
                        return Err(RestoreError::BroadcastRescale {
                            checkpoint,
                            from: graph.operator(edge.from).name.clone(),
                            to: consumer.name.clone(),
                        })
                    }
                    Partitioner::Hash => {
                        let max = consumer.max_parallelism;
                        let range = KeyGroupRange::for_subtask(max, to, SubtaskIndex(c));
                        let owner = |group| subtask_for_key_group(max, new_to, KeyGroup(group)).0;
                        (owner(range.start)..=owner(range.end)).collect()
                    }
                    Partitioner::Rebalance | Partitioner::Forward => vec![c % new_to],
                };
                let channel = new_in + if forward { 0 } else { p % new_from };
                for j in targets {
                    let plan = plan_of(plans, edge.to, j);
                    plan.filter_replay |= edge.partitioner == Partitioner::Hash && to != new_to;
                    plan.channels
                        .extend(records.iter().map(|r| ChannelStateHandle {
                            side: ChannelSide::Input,
                            channel,
                            ..r.clone()
                        }));
                }
            }
        }
    }
    Ok(())
}

fn plan_of(
    plans: &mut HashMap<SubtaskId, RestorePlan>,
    operator: OperatorId,
    index: u32,
) -> &mut RestorePlan {
    plans
        .entry(SubtaskId {
            operator,
            index: SubtaskIndex(index),
        })
        .or_default()
}

/// A new subtask's operator state, and the sink transactions it adopts.
type NewOperatorState = (BTreeMap<String, Vec<u8>>, Vec<(String, Vec<u8>)>);

/// Each new subtask's operator state and the sink transactions it adopts.
/// At the same parallelism every subtask keeps its own. Otherwise source
/// positions are redistributed, a new source is exhausted if every old one
/// was, subtask j keeps the sink transactions and other entries of old
/// subtask j, every new subtask gets a copy of the broadcast state, an
/// async operator's records are dealt out, and
/// subtask 0 adopts the sink transactions of old subtasks beyond the new
/// parallelism.
fn operator_state(
    parallelism: u32,
    checkpointed: u32,
    states: &[(SubtaskIndex, &SubtaskState)],
) -> Result<Vec<NewOperatorState>, String> {
    let of = |j: u32| {
        states
            .iter()
            .find(|(i, _)| i.0 == j)
            .map(|(_, s)| &s.operator)
    };
    let mut out: Vec<NewOperatorState> = (0..parallelism)
        .map(|j| (of(j).cloned().unwrap_or_default(), Vec::new()))
        .collect();
    if parallelism == checkpointed {
        return Ok(out);
    }
    let holds = |entry: &str| states.iter().any(|(_, s)| s.operator.contains_key(entry));
    if holds(SOURCE_POSITION) {
        let old = (0..checkpointed)
            .map(|j| match of(j).and_then(|o| o.get(SOURCE_POSITION)) {
                None => Ok(SplitPosition::start(j)),
                Some(bytes) => rmp_serde::from_slice(bytes)
                    .map_err(|e| format!("a malformed source position: {e}")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        for ((state, _), position) in out.iter_mut().zip(split::redistribute(&old, parallelism)) {
            let bytes = rmp_serde::to_vec(&position)
                .map_err(|e| format!("cannot encode a source position: {e}"))?;
            state.insert(SOURCE_POSITION.into(), bytes);
        }
    }
    if holds(SOURCE_SPLITS) {
        deal_splits(&mut out, (0..checkpointed).filter_map(of))?;
    }
    if holds(SOURCE_POSITION) || holds(SOURCE_SPLITS) {
        let exhausted =
            (0..checkpointed).all(|j| of(j).is_some_and(|o| o.contains_key(SOURCE_EXHAUSTED)));
        for (state, _) in &mut out {
            if exhausted {
                state.insert(SOURCE_EXHAUSTED.into(), Vec::new());
            } else {
                state.remove(SOURCE_EXHAUSTED);
            }
        }
    }
    if holds(SOURCE_WATERMARK) {
        // Every new subtask reads on from every old one's position, so it
        // starts from the lowest of their watermark states.
        let old = (0..checkpointed)
            .map(|j| match of(j).and_then(|o| o.get(SOURCE_WATERMARK)) {
                None => Ok(GeneratorState::default()),
                Some(bytes) => rmp_serde::from_slice(bytes)
                    .map_err(|e| format!("a malformed watermark state: {e}")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let merged = rmp_serde::to_vec(&GeneratorState::merge_for_rescale(&old))
            .map_err(|e| format!("cannot encode a watermark state: {e}"))?;
        for (state, _) in &mut out {
            state.insert(SOURCE_WATERMARK.into(), merged.clone());
        }
    }
    share_broadcast_state(&mut out, (0..checkpointed).filter_map(of));
    if holds(ASYNC_IN_FLIGHT) {
        deal_async_records(&mut out, (0..checkpointed).filter_map(of))?;
    }
    let removed = (parallelism..checkpointed)
        .filter_map(of)
        .flat_map(|state| state.iter().filter(|(e, _)| is_sink_entry(e)))
        .map(|(e, t)| (e.clone(), t.clone()));
    out[0].1.extend(removed);
    Ok(out)
}

/// Deals the records the old subtasks of an async operator held, in their
/// order, round robin to the new subtasks: each is requested again by
/// exactly one.
fn deal_async_records<'a>(
    out: &mut [NewOperatorState],
    old: impl Iterator<Item = &'a BTreeMap<String, Vec<u8>>>,
) -> Result<(), String> {
    let mut dealt: Vec<Vec<serde_bytes::ByteBuf>> = vec![Vec::new(); out.len()];
    let mut next = 0;
    for bytes in old.filter_map(|state| state.get(ASYNC_IN_FLIGHT)) {
        let records: Vec<serde_bytes::ByteBuf> = rmp_serde::from_slice(bytes)
            .map_err(|e| format!("malformed records of an async operator: {e}"))?;
        for record in records {
            dealt[next % out.len()].push(record);
            next += 1;
        }
    }
    for ((state, _), records) in out.iter_mut().zip(dealt) {
        let bytes = rmp_serde::to_vec(&records)
            .map_err(|e| format!("cannot encode records of an async operator: {e}"))?;
        state.insert(ASYNC_IN_FLIGHT.into(), bytes);
    }
    Ok(())
}

/// Gives every new subtask that lacks it the broadcast state of the first
/// old subtask that held one: every subtask's copy is the same (Flink's
/// union redistribution of broadcast state).
fn share_broadcast_state<'a>(
    out: &mut [NewOperatorState],
    mut old: impl Iterator<Item = &'a BTreeMap<String, Vec<u8>>>,
) {
    let is_broadcast = |entry: &String| broadcast_state_of(entry).is_some();
    let Some(held) = old.find(|state| state.keys().any(is_broadcast)) else {
        return;
    };
    for (state, _) in out {
        if !state.keys().any(is_broadcast) {
            let copy = held.iter().filter(|(e, _)| is_broadcast(e));
            state.extend(copy.map(|(e, b)| (e.clone(), b.clone())));
        }
    }
}

/// Deals the splits the old subtasks of a split source held, in their
/// order, round robin to the new subtasks (as Flink redistributes a
/// source's split state): each split, at its position, goes to exactly
/// one.
fn deal_splits<'a>(
    out: &mut [NewOperatorState],
    old: impl Iterator<Item = &'a BTreeMap<String, Vec<u8>>>,
) -> Result<(), String> {
    let subtasks = out.len();
    let mut dealt: Vec<Vec<SplitBytes>> = vec![Vec::new(); subtasks];
    let mut next = 0;
    for state in old {
        let Some(bytes) = state.get(SOURCE_SPLITS) else {
            continue;
        };
        let splits: Vec<SplitBytes> =
            rmp_serde::from_slice(bytes).map_err(|e| format!("malformed source splits: {e}"))?;
        for split in splits {
            dealt[next % subtasks].push(split);
            next += 1;
        }
    }
    for ((state, _), splits) in out.iter_mut().zip(dealt) {
        let bytes =
            rmp_serde::to_vec(&splits).map_err(|e| format!("cannot encode source splits: {e}"))?;
        state.insert(SOURCE_SPLITS.into(), bytes);
    }
    Ok(())
}

#[cfg(test)]
mod candidate_tests {
    use super::*;

    #[test]
    fn only_damaged_state_falls_back_and_only_to_an_older_checkpoint() {
        let mut candidates = RestoreCandidates::new([5, 4, 3]);
        assert_eq!(candidates.next_to_try(), Some(5));
        assert_eq!(candidates.fall_back(RestoreFailure::Other), None);
        assert_eq!(candidates.fall_back(RestoreFailure::DamagedState), Some(&4));
        assert_eq!(candidates.next_to_try(), Some(4));
        assert_eq!(candidates.next_to_try(), Some(3));
        assert_eq!(candidates.fall_back(RestoreFailure::DamagedState), None);
        assert_eq!(candidates.next_to_try(), None);
        assert_eq!(RestoreCandidates::<u64>::new([]).next_to_try(), None);
    }

    #[test]
    fn a_corrupted_object_is_damaged_state_and_a_misfit_is_not() {
        use crate::checkpoint::HandleMismatch;
        let subtask = SubtaskId {
            operator: OperatorId(1),
            index: SubtaskIndex(0),
        };
        let corrupted = RestoreError::Corrupted {
            subtask,
            source: HandleMismatch::Checksum {
                path: "chk-1/op-1-0-e1-keyed".into(),
                range: 0..10,
            },
        };
        assert_eq!(
            RestoreFailure::of_restore(&corrupted),
            RestoreFailure::DamagedState
        );
        let unknown = RestoreError::NotRestored("counter".into());
        assert_eq!(RestoreFailure::of_restore(&unknown), RestoreFailure::Other);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::entries::SINK;
    use crate::checkpoint::SubtaskState;
    use crate::model::event::CheckpointKind;
    use crate::model::ids::{CheckpointId, SubtaskIndex};

    fn graph(p: u32) -> JobGraph {
        let mut g = JobGraph::default();
        let a = g.add_operator("source", p);
        let b = g.add_operator("count", p);
        g.edges.push(Edge {
            from: a,
            to: b,
            partitioner: Partitioner::Hash,
            input: 0,
        });
        g
    }

    fn count(index: u32) -> SubtaskId {
        SubtaskId {
            operator: OperatorId(1),
            index: SubtaskIndex(index),
        }
    }

    fn checkpoint(p: u32) -> CompletedCheckpoint {
        let subtasks = (0..p)
            .map(|i| {
                let range = KeyGroupRange::for_subtask(128, p, SubtaskIndex(i));
                let offsets: Vec<u64> = (0..range.len() as u64).map(|g| g * 10).collect();
                let state = SubtaskState {
                    keyed: Some(KeyedStateHandle::KeyGroups(KeyGroupsStateHandle {
                        start_group: range.start,
                        offsets,
                        handle: StateHandle::object(
                            format!("chk-1/count-{i}"),
                            range.len() as u64 * 10,
                            0,
                        ),
                    })),
                    ..SubtaskState::default()
                };
                (count(i), state)
            })
            .collect();
        CompletedCheckpoint {
            id: CheckpointId(1),
            kind: CheckpointKind::Checkpoint,
            format: Default::default(),
            operators: Vec::new(),
            edges: Vec::new(),
            key_hash: crate::model::key_hash::KEY_HASH_VERSION,
            timestamp: 0,
            subtasks,
            master_states: BTreeMap::new(),
        }
    }

    #[test]
    fn every_key_group_is_read_by_its_owner_from_its_byte_range() {
        let plans = plan(&checkpoint(2), &graph(2), false).unwrap();
        let second = &plans[&count(1)].keyed[0];
        assert_eq!(second.handle.physical(), Some("chk-1/count-1"));
        assert_eq!(second.groups.len(), 64);
        assert_eq!(second.groups[0], (KeyGroup(64), 0..10));
        assert_eq!(second.groups[63], (KeyGroup(127), 630..640));
    }

    #[test]
    fn a_checkpoint_that_does_not_fit_the_job_is_refused() {
        let mut foreign = checkpoint(1);
        foreign.subtasks.insert(
            SubtaskId {
                operator: OperatorId(9),
                index: SubtaskIndex(0),
            },
            SubtaskState::default(),
        );
        assert!(matches!(
            plan(&foreign, &graph(1), false),
            Err(RestoreError::UnknownSubtask(_))
        ));
        let mut truncated = checkpoint(1);
        let Some(KeyedStateHandle::KeyGroups(keyed)) =
            &mut truncated.subtasks.get_mut(&count(0)).unwrap().keyed
        else {
            unreachable!("the test checkpoint has key groups")
        };
        keyed.handle = StateHandle::object("chk-1/count-0", 5, 0);
        assert!(matches!(
            plan(&truncated, &graph(1), false),
            Err(RestoreError::Malformed { .. })
        ));
    }

    fn source(index: u32) -> SubtaskId {
        SubtaskId {
            operator: OperatorId(0),
            index: SubtaskIndex(index),
        }
    }

    #[test]
    fn at_any_new_parallelism_every_key_group_is_read_once_by_its_new_owner() {
        for old in 1..=5 {
            for new in 1..=5 {
                let plans = plan(&checkpoint(old), &graph(new), false).unwrap();
                let mut read: Vec<(KeyGroup, String, Range<u64>)> = Vec::new();
                for j in 0..new {
                    let owned = KeyGroupRange::for_subtask(128, new, SubtaskIndex(j));
                    for slices in &plans[&count(j)].keyed {
                        for (group, range) in &slices.groups {
                            assert!(owned.contains(*group), "{old} -> {new}: {group}");
                            let path = slices.handle.physical().unwrap().to_owned();
                            read.push((*group, path, range.clone()));
                        }
                    }
                }
                read.sort_by_key(|(g, _, _)| g.0);
                assert_eq!(read.len(), 128, "{old} -> {new}");
                for (g, (group, path, range)) in read.into_iter().enumerate() {
                    assert_eq!(group, KeyGroup(g as u32));
                    let was = crate::model::key_group::subtask_for_key_group(128, old, group);
                    assert_eq!(path, format!("chk-1/count-{}", was.0));
                    let first = KeyGroupRange::for_subtask(128, old, was).start;
                    let at = u64::from(group.0 - first) * 10;
                    assert_eq!(range, at..at + 10);
                }
            }
        }
    }

    fn native(p: u32, i: u32) -> NativeStateHandle {
        NativeStateHandle {
            key_groups: KeyGroupRange::for_subtask(128, p, SubtaskIndex(i)),
            shared: Vec::new(),
            private: Vec::new(),
        }
    }

    #[test]
    fn only_an_owned_native_checkpoint_restored_alone_is_an_incremental_base() {
        let shared = NativeFileHandle {
            name: "000008.sst".into(),
            instance: 1,
            uploaded_by: CheckpointId(1),
            handle: StateHandle::object("shared/op-1-0/chk-1-000008.sst", 100, 0),
        };
        let mut c = checkpoint(2);
        for i in 0..2 {
            let mut n = native(2, i);
            n.shared = vec![shared.clone()];
            c.subtasks.get_mut(&count(i)).unwrap().keyed = Some(KeyedStateHandle::Native(n));
        }
        let same = plan(&c, &graph(2), false).unwrap();
        assert_eq!(
            same[&count(0)].incremental_base(true),
            std::slice::from_ref(&shared)
        );
        assert!(
            same[&count(0)].incremental_base(false).is_empty(),
            "not owned"
        );
        let merged = plan(&c, &graph(1), false).unwrap();
        assert!(
            merged[&count(0)].incremental_base(true).is_empty(),
            "imported"
        );
    }

    #[test]
    fn a_rescaled_subtask_opens_the_native_checkpoint_it_overlaps_most_and_imports_the_rest() {
        let mut c = checkpoint(3);
        for i in 0..3 {
            c.subtasks.get_mut(&count(i)).unwrap().keyed =
                Some(KeyedStateHandle::Native(native(3, i)));
        }
        let plans = plan(&c, &graph(2), false).unwrap();
        // New 0 owns 0..=63: old 0 (0..=42) and 21 groups of old 1 (43..=85).
        assert_eq!(plans[&count(0)].native, Some(native(3, 0)));
        assert_eq!(plans[&count(0)].imports, [native(3, 1)]);
        // New 1 owns 64..=127: 22 groups of old 1, all 42 of old 2.
        assert_eq!(plans[&count(1)].native, Some(native(3, 2)));
        assert_eq!(plans[&count(1)].imports, [native(3, 1)]);
        let plans = plan(&c, &graph(6), false).unwrap();
        for j in 0..6 {
            let p = &plans[&count(j)];
            assert_eq!(p.native, Some(native(3, j / 2)), "{j}");
            assert!(p.imports.is_empty());
        }
    }

    fn position(bytes: &[u8]) -> SplitPosition {
        rmp_serde::from_slice(bytes).unwrap()
    }

    #[test]
    fn a_rescale_redistributes_source_positions_and_hands_removed_sinks_to_subtask_0() {
        let mut c = checkpoint(3);
        for i in 0..3 {
            let at = SplitPosition {
                next: u64::from(i) + 3 * u64::from(i + 1),
                read_before: Vec::new(),
            };
            let mut operator =
                BTreeMap::from([(SOURCE_POSITION.to_owned(), rmp_serde::to_vec(&at).unwrap())]);
            if i > 0 {
                operator.insert(SOURCE_EXHAUSTED.into(), Vec::new());
            }
            c.subtasks.insert(
                source(i),
                SubtaskState {
                    operator,
                    ..SubtaskState::default()
                },
            );
            c.subtasks.get_mut(&count(i)).unwrap().operator =
                BTreeMap::from([(SINK.to_owned(), vec![i as u8])]);
        }
        let plans = plan(&c, &graph(2), false).unwrap();
        let old: Vec<SplitPosition> = (0..3)
            .map(|i| position(&c.subtasks[&source(i)].operator[SOURCE_POSITION]))
            .collect();
        for (j, expected) in split::redistribute(&old, 2).into_iter().enumerate() {
            let operator = &plans[&source(j as u32)].operator;
            assert_eq!(position(&operator[SOURCE_POSITION]), expected);
            assert!(
                !operator.contains_key(SOURCE_EXHAUSTED),
                "not every old source was"
            );
        }
        assert_eq!(plans[&count(0)].operator[SINK], [0]);
        assert_eq!(plans[&count(0)].adopted, [(SINK.to_owned(), vec![2u8])]);
        assert_eq!(plans[&count(1)].operator[SINK], [1]);
        assert!(plans[&count(1)].adopted.is_empty());

        let plans = plan(&c, &graph(4), false).unwrap();
        assert!(plans[&count(3)].operator.is_empty());
        assert!(plans.values().all(|p| p.adopted.is_empty()));
        assert!(plans[&source(3)].operator.contains_key(SOURCE_POSITION));
    }

    #[test]
    fn every_new_subtask_gets_a_copy_of_the_broadcast_state() {
        let rules = crate::checkpoint::entries::broadcast_entry("rules");
        let mut c = checkpoint(3);
        for i in 0..3 {
            c.subtasks.get_mut(&count(i)).unwrap().operator = BTreeMap::from([
                (rules.clone(), b"r1".to_vec()),
                (SINK.to_owned(), vec![i as u8]),
            ]);
        }
        for p in [1, 2, 4, 5] {
            let plans = plan(&c, &graph(p), false).unwrap();
            for j in 0..p {
                let operator = &plans[&count(j)].operator;
                assert_eq!(operator[&rules], b"r1", "p={p}, subtask {j}");
                // A new subtask's copy comes without another's transaction.
                assert_eq!(operator.get(SINK), (j < 3).then(|| vec![j as u8]).as_ref());
            }
        }
    }

    #[test]
    fn a_rescale_deals_every_split_to_exactly_one_new_subtask() {
        let split = |id: &str| SplitBytes {
            id: id.into(),
            bytes: id.as_bytes().to_vec(),
        };
        let held = [vec![split("a")], vec![split("b"), split("c")], vec![]];
        let mut c = checkpoint(3);
        for (i, splits) in held.iter().enumerate() {
            let operator = BTreeMap::from([
                (SOURCE_SPLITS.to_owned(), rmp_serde::to_vec(splits).unwrap()),
                (SOURCE_EXHAUSTED.to_owned(), Vec::new()),
            ]);
            let state = SubtaskState {
                operator,
                ..SubtaskState::default()
            };
            c.subtasks.insert(source(i as u32), state);
        }
        let dealt = |p: u32| -> Vec<Vec<String>> {
            let plans = plan(&c, &graph(p), false).unwrap();
            (0..p)
                .map(|j| {
                    let operator = &plans[&source(j)].operator;
                    assert!(operator.contains_key(SOURCE_EXHAUSTED), "every old one was");
                    let splits: Vec<SplitBytes> =
                        rmp_serde::from_slice(&operator[SOURCE_SPLITS]).unwrap();
                    splits.into_iter().map(|s| s.id).collect()
                })
                .collect()
        };
        assert_eq!(dealt(2), [vec!["a", "c"], vec!["b"]]);
        assert_eq!(dealt(4), [vec!["a"], vec!["b"], vec!["c"], vec![]]);
        assert_eq!(dealt(3), [vec!["a"], vec!["b", "c"], vec![]], "kept as is");
    }

    #[test]
    fn operators_are_matched_by_uid_and_unmatched_ones_need_the_flag() {
        let mut c = checkpoint(2);
        c.operators = graph(2).operators;
        // The job renumbered its operators: count is first now.
        let mut renumbered = graph(2);
        renumbered.operators.swap(0, 1);
        for (i, op) in renumbered.operators.iter_mut().enumerate() {
            op.id = OperatorId(i as u32);
        }
        let plans = plan(&c, &renumbered, false).unwrap();
        let moved = SubtaskId {
            operator: OperatorId(0),
            index: SubtaskIndex(1),
        };
        assert_eq!(plans[&moved].keyed[0].groups[0].0, KeyGroup(64));

        let mut lacking = graph(2);
        lacking.operators[1].uid = "renamed".into();
        let error = plan(&c, &lacking, false).unwrap_err();
        assert_eq!(error, RestoreError::NotRestored("count-1".into()));
        assert!(error.to_string().contains("--allow-non-restored-state"));
        let plans = plan(&c, &lacking, true).unwrap();
        assert!(plans.values().all(|p| p.keyed.is_empty()), "dropped");

        c.operators.pop();
        c.subtasks.clear();
        let error = plan(&c, &graph(2), false).unwrap_err();
        assert_eq!(error, RestoreError::NotInCheckpoint("count-1".into()));
        assert!(plan(&c, &graph(2), true).unwrap().is_empty());
    }

    fn channel_state(side: ChannelSide, channel: u32) -> ChannelStateHandle {
        ChannelStateHandle {
            side,
            channel,
            batches: 1,
            handle: StateHandle::object(format!("chk-1/in-{channel}"), 10, 0),
        }
    }

    #[test]
    fn channel_state_goes_to_its_subtask_and_must_name_a_channel_it_has() {
        let mut c = checkpoint(2);
        let state = c.subtasks.get_mut(&count(1)).unwrap();
        state.channels.push(channel_state(ChannelSide::Input, 1));
        let plans = plan(&c, &graph(2), false).unwrap();
        assert_eq!(
            plans[&count(1)].channels,
            [channel_state(ChannelSide::Input, 1)]
        );
        assert!(plans[&count(0)].channels.is_empty());

        for bad in [
            channel_state(ChannelSide::Input, 2),
            channel_state(ChannelSide::Output, 0),
        ] {
            let mut c = checkpoint(2);
            c.subtasks.get_mut(&count(0)).unwrap().channels.push(bad);
            assert!(matches!(
                plan(&c, &graph(2), false),
                Err(RestoreError::Malformed { .. })
            ));
        }
    }

    #[test]
    fn a_checkpointed_parallelism_beyond_the_max_parallelism_is_refused() {
        for parallelism in [0, 129] {
            let mut c = checkpoint(2);
            c.operators = graph(2).operators;
            c.operators[1].parallelism = parallelism;
            let error = plan(&c, &graph(2), false).unwrap_err();
            assert!(
                matches!(&error, RestoreError::Malformed { problem, .. } if problem.contains("outside 1..=128")),
                "{error}"
            );
        }
    }

    #[test]
    fn a_checkpoint_of_another_max_parallelism_is_refused() {
        let mut c = checkpoint(2);
        let mut other = graph(2);
        other.operators[1].max_parallelism = 256;
        c.operators = graph(2).operators;
        let error = plan(&c, &other, false).unwrap_err();
        assert_eq!(
            error,
            RestoreError::MaxParallelism {
                name: "count".into(),
                checkpointed: 128,
                now: 256
            }
        );
        assert!(error.to_string().contains("max parallelism"), "{error}");
        assert!(plan(&c, &graph(2), false).is_ok());
    }

    /// Input state of every count subtask on every channel, and output state
    /// of every source subtask on every channel, named after where they are.
    fn unaligned(p: u32) -> CompletedCheckpoint {
        let mut c = checkpoint(p);
        let handle = |side: &str, subtask: u32, channel: u32| ChannelStateHandle {
            side: if side == "in" {
                ChannelSide::Input
            } else {
                ChannelSide::Output
            },
            channel,
            batches: 1,
            handle: StateHandle::object(format!("{side}-{subtask}-{channel}"), 10, 0),
        };
        for i in 0..p {
            let inputs = (0..p).map(|ch| handle("in", i, ch)).collect();
            c.subtasks.get_mut(&count(i)).unwrap().channels = inputs;
            let outputs = (0..p).map(|ch| handle("out", i, ch)).collect();
            c.subtasks.insert(
                source(i),
                SubtaskState {
                    channels: outputs,
                    ..SubtaskState::default()
                },
            );
        }
        c
    }

    /// (channel, object) of each replayed channel state, in order.
    fn replayed(plan: &RestorePlan) -> Vec<(u32, String)> {
        plan.channels
            .iter()
            .map(|c| {
                assert_eq!(c.side, ChannelSide::Input);
                (c.channel, c.handle.physical().unwrap().to_owned())
            })
            .collect()
    }

    #[test]
    fn in_flight_records_of_a_rescaled_hash_edge_go_to_every_new_owner_of_their_key_groups() {
        let plans = plan(&unaligned(2), &graph(3), false).unwrap();
        // Old channel p -> c: what c had received, then what p had not sent,
        // on the new consumer's channel p.
        let from_old = |c: u32| -> Vec<(u32, String)> {
            (0..2)
                .flat_map(|p| [(p, format!("in-{c}-{p}")), (p, format!("out-{p}-{c}"))])
                .collect()
        };
        // Old 0 owned 0..=63 and old 1 64..=127; new 1 owns 43..=85.
        assert_eq!(replayed(&plans[&count(0)]), from_old(0));
        assert_eq!(
            replayed(&plans[&count(1)]),
            [from_old(0), from_old(1)].concat()
        );
        assert_eq!(replayed(&plans[&count(2)]), from_old(1));
        for j in 0..3 {
            assert!(plans[&count(j)].filter_replay, "{j}");
            assert!(plans[&source(j)].channels.is_empty(), "{j}");
        }

        // Every old channel's records reach exactly the new owners of the key
        // groups of its old consumer, once each and on a channel they have.
        for old in 1..=4 {
            for new in (1..=4).filter(|&new| new != old) {
                let plans = plan(&unaligned(old), &graph(new), false).unwrap();
                for j in 0..new {
                    let owned = KeyGroupRange::for_subtask(128, new, SubtaskIndex(j));
                    let got = replayed(&plans[&count(j)]);
                    let expected: Vec<String> = (0..old)
                        .filter(|&c| {
                            overlap(KeyGroupRange::for_subtask(128, old, SubtaskIndex(c)), owned)
                                > 0
                        })
                        .flat_map(|c| {
                            (0..old)
                                .flat_map(move |p| [format!("in-{c}-{p}"), format!("out-{p}-{c}")])
                        })
                        .collect();
                    let objects: Vec<String> = got.iter().map(|(_, o)| o.clone()).collect();
                    assert_eq!(objects, expected, "{old} -> {new}, subtask {j}");
                    assert!(got.iter().all(|(ch, _)| *ch < new), "{old} -> {new}");
                    assert!(plans[&count(j)].filter_replay);
                }
            }
        }
    }

    #[test]
    fn in_flight_records_of_a_rescaled_rebalance_edge_go_to_one_consumer_unfiltered() {
        let mut c = unaligned(3);
        let mut g = graph(2);
        g.edges[0].partitioner = Partitioner::Rebalance;
        c.operators = graph(3).operators;
        let plans = plan(&c, &g, false).unwrap();
        let from_old = |c: u32| -> Vec<(u32, String)> {
            (0..3)
                .flat_map(|p| {
                    [
                        (p % 2, format!("in-{c}-{p}")),
                        (p % 2, format!("out-{p}-{c}")),
                    ]
                })
                .collect()
        };
        assert_eq!(
            replayed(&plans[&count(0)]),
            [from_old(0), from_old(2)].concat()
        );
        assert_eq!(replayed(&plans[&count(1)]), from_old(1));
        assert!(!plans[&count(0)].filter_replay);
    }

    #[test]
    fn in_flight_records_of_a_broadcast_edge_stay_with_their_consumer_or_are_refused() {
        let mut g = graph(3);
        g.edges[0].partitioner = Partitioner::Broadcast;
        let error = plan(&unaligned(2), &g, false).unwrap_err();
        assert!(
            matches!(error, RestoreError::BroadcastRescale { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("broadcast edge"), "{error}");
        let mut same = graph(2);
        same.edges[0].partitioner = Partitioner::Broadcast;
        assert!(plan(&unaligned(2), &same, false).is_ok());
        // Only the producer changed: every consumer replays its own.
        let mut c = unaligned(2);
        c.operators = graph(2).operators;
        let mut producer = graph(2);
        producer.edges[0].partitioner = Partitioner::Broadcast;
        producer.operators[0].parallelism = 3;
        let plans = plan(&c, &producer, false).unwrap();
        for j in 0..2 {
            let expected: Vec<(u32, String)> = (0..2)
                .flat_map(|p| [(p, format!("in-{j}-{p}")), (p, format!("out-{p}-{j}"))])
                .collect();
            assert_eq!(replayed(&plans[&count(j)]), expected);
            assert!(!plans[&count(j)].filter_replay);
        }
    }

    #[test]
    fn in_flight_records_of_an_edge_to_a_dropped_operator_are_dropped_with_it() {
        let mut c = unaligned(2);
        c.operators = graph(2).operators;
        let mut renamed = graph(3);
        renamed.operators[1].uid = "renamed".into();
        let plans = plan(&c, &renamed, true).unwrap();
        assert!(plans.values().all(|p| p.channels.is_empty()));
        assert!(plans.values().all(|p| !p.filter_replay));
    }

    #[test]
    fn a_forward_edge_between_two_parallelisms_is_malformed() {
        let mut c = unaligned(2);
        c.operators = graph(2).operators;
        c.operators[1].parallelism = 3;
        for i in 0..2 {
            c.subtasks.get_mut(&count(i)).unwrap().keyed = None;
        }
        let mut forward = graph(2);
        forward.edges[0].partitioner = Partitioner::Forward;
        let error = plan(&c, &forward, false).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("forward edge from parallelism 2 to 3"),
            "{error}"
        );
    }

    #[test]
    fn a_subtask_index_at_the_end_of_the_range_is_malformed() {
        let mut c = checkpoint(1);
        c.subtasks.insert(count(u32::MAX), SubtaskState::default());
        assert!(matches!(
            plan(&c, &graph(1), false),
            Err(RestoreError::Malformed { .. })
        ));
    }

    #[test]
    fn channel_state_is_checked_against_the_checkpointed_topology() {
        // Channel 1 of count 0 existed at p=2, not at p=1.
        let mut c = checkpoint(2);
        c.operators = graph(2).operators;
        c.subtasks
            .get_mut(&count(0))
            .unwrap()
            .channels
            .push(channel_state(ChannelSide::Input, 1));
        let plans = plan(&c, &graph(1), false).unwrap();
        assert_eq!(replayed(&plans[&count(0)]), [(0, "chk-1/in-1".to_string())]);
        c.subtasks
            .get_mut(&count(1))
            .unwrap()
            .channels
            .push(channel_state(ChannelSide::Input, 2));
        assert!(matches!(
            plan(&c, &graph(1), false),
            Err(RestoreError::Malformed { .. })
        ));
    }

    /// left (op 0) and right (op 1) into the two inputs of join (op 2) over
    /// hash edges, at the given parallelisms.
    fn join_graph(left: u32, right: u32, join: u32) -> JobGraph {
        let mut g = JobGraph::default();
        let (l, r) = (g.add_operator("left", left), g.add_operator("right", right));
        let j = g.add_operator("join", join);
        for (from, input) in [(l, 0), (r, 1)] {
            g.edges.push(Edge {
                from,
                to: j,
                partitioner: Partitioner::Hash,
                input,
            });
        }
        g
    }

    fn subtask(operator: u32, index: u32) -> SubtaskId {
        SubtaskId {
            operator: OperatorId(operator),
            index: SubtaskIndex(index),
        }
    }

    /// An unaligned checkpoint of `join_graph(2, 2, 2)`: input state of
    /// every join subtask on each of its 4 channels (`in-c-ch`: left 0 and 1,
    /// then right 0 and 1), and output state of every left and right subtask
    /// towards each join subtask (`left-p-c`, `right-p-c`).
    fn unaligned_join() -> CompletedCheckpoint {
        let handle = |side, name: String, channel| ChannelStateHandle {
            side,
            channel,
            batches: 1,
            handle: StateHandle::object(name, 10, 0),
        };
        let mut subtasks = BTreeMap::new();
        for i in 0..2 {
            let inputs = (0..4).map(|ch| handle(ChannelSide::Input, format!("in-{i}-{ch}"), ch));
            subtasks.insert(
                subtask(2, i),
                SubtaskState {
                    channels: inputs.collect(),
                    ..SubtaskState::default()
                },
            );
            for (op, name) in [(0, "left"), (1, "right")] {
                let outputs =
                    (0..2).map(|c| handle(ChannelSide::Output, format!("{name}-{i}-{c}"), c));
                subtasks.insert(
                    subtask(op, i),
                    SubtaskState {
                        channels: outputs.collect(),
                        ..SubtaskState::default()
                    },
                );
            }
        }
        CompletedCheckpoint {
            operators: join_graph(2, 2, 2).operators,
            edges: join_graph(2, 2, 2).edges,
            key_hash: crate::model::key_hash::KEY_HASH_VERSION,
            subtasks,
            ..checkpoint(0)
        }
    }

    /// Old join c's in-flight records of `input` from producer p, replayed
    /// on new gate channel `to`: what c had received on the channel from p
    /// (old gate channel 2 * input + p), then what p had not sent.
    fn records(c: u32, input: u32, p: u32, to: u32) -> [(u32, String); 2] {
        let producer = ["left", "right"][input as usize];
        [
            (to, format!("in-{c}-{}", 2 * input + p)),
            (to, format!("{producer}-{p}-{c}")),
        ]
    }

    /// (channel, object) of each output channel state kept, in order.
    fn kept_outputs(plan: &RestorePlan) -> Vec<(u32, String)> {
        plan.channels
            .iter()
            .map(|c| {
                assert_eq!(c.side, ChannelSide::Output);
                (c.channel, c.handle.physical().unwrap().to_owned())
            })
            .collect()
    }

    /// On a rescale, the in-flight records of both inputs of a two-input
    /// operator reach the subtasks that now own their keys, each on a
    /// channel of the input it came from: input 0's channels first in the
    /// new gate, input 1's after them, at the new width of input 0.
    #[test]
    fn in_flight_records_of_both_inputs_of_a_join_land_on_their_input_after_a_rescale() {
        let c = unaligned_join();
        let join = |plans: &HashMap<SubtaskId, RestorePlan>, j| replayed(&plans[&subtask(2, j)]);

        // Join 2 -> 3: old join c's records go to every new owner of its key
        // groups (old 0 owned 0..=63, old 1 64..=127; new 1 owns 43..=85), on
        // channel p of left and 2 + p of right, and are filtered there.
        let plans = plan(&c, &join_graph(2, 2, 3), false).unwrap();
        let old = |c, input| -> Vec<(u32, String)> {
            (0..2)
                .flat_map(|p| records(c, input, p, 2 * input + p))
                .collect()
        };
        assert_eq!(join(&plans, 0), [old(0, 0), old(0, 1)].concat());
        assert_eq!(
            join(&plans, 1),
            [old(0, 0), old(1, 0), old(0, 1), old(1, 1)].concat()
        );
        assert_eq!(join(&plans, 2), [old(1, 0), old(1, 1)].concat());
        for j in 0..3 {
            assert!(plans[&subtask(2, j)].filter_replay, "{j}");
        }
        for p in 0..2 {
            assert!(plans[&subtask(0, p)].channels.is_empty(), "{p}");
            assert!(plans[&subtask(1, p)].channels.is_empty(), "{p}");
        }

        // Right 2 -> 3: input 0 keeps its channels and its producers' output
        // state; input 1's records stay with their consumer, on channel
        // 2 + p mod 3 of the wider gate, unfiltered (the keys did not move).
        let plans = plan(&c, &join_graph(2, 3, 2), false).unwrap();
        for j in 0..2 {
            let kept = [(0, format!("in-{j}-0")), (1, format!("in-{j}-1"))];
            let moved = (0..2).flat_map(|p| records(j, 1, p, 2 + p % 3));
            assert_eq!(
                join(&plans, j),
                kept.into_iter().chain(moved).collect::<Vec<_>>()
            );
            assert!(!plans[&subtask(2, j)].filter_replay);
            let left: Vec<_> = (0..2).map(|c| (c, format!("left-{j}-{c}"))).collect();
            assert_eq!(kept_outputs(&plans[&subtask(0, j)]), left);
        }
        assert!((0..3).all(|p| plans[&subtask(1, p)].channels.is_empty()));

        // Left 2 -> 3: input 1's edge changed nothing, but its channels move
        // up to the new width of input 0.
        let plans = plan(&c, &join_graph(3, 2, 2), false).unwrap();
        for j in 0..2 {
            let moved = (0..2).flat_map(|p| records(j, 0, p, p % 3));
            let kept = [(3, format!("in-{j}-2")), (4, format!("in-{j}-3"))];
            assert_eq!(join(&plans, j), moved.chain(kept).collect::<Vec<_>>());
            assert!(!plans[&subtask(2, j)].filter_replay);
            let right: Vec<_> = (0..2).map(|c| (c, format!("right-{j}-{c}"))).collect();
            assert_eq!(kept_outputs(&plans[&subtask(1, j)]), right);
        }
    }

    /// In-flight records only map back to channels of the same edges: a
    /// job whose join reads another left input (a new uid), or whose edges
    /// into the join changed, is refused rather than fed the wrong records.
    #[test]
    fn channel_state_is_refused_where_the_operators_edges_changed() {
        let c = unaligned_join();
        let mut renamed = join_graph(2, 2, 2);
        renamed.operators[0].uid = "other-left".into();
        assert!(matches!(
            plan(&c, &renamed, true),
            Err(RestoreError::ChannelLayout { side: "input", .. })
        ));
        let mut swapped = join_graph(2, 2, 2);
        swapped.edges.swap(0, 1);
        swapped.edges[0].input = 0;
        swapped.edges[1].input = 1;
        assert!(matches!(
            plan(&c, &swapped, false),
            Err(RestoreError::ChannelLayout { .. })
        ));
        let mut rebalanced = join_graph(2, 2, 2);
        rebalanced.edges[1].partitioner = Partitioner::Rebalance;
        assert!(matches!(
            plan(&c, &rebalanced, false),
            Err(RestoreError::ChannelLayout { .. })
        ));
    }

    /// Keyed state whose keys were assigned to key groups with another key
    /// hash is refused: restored, its keys would silently not be found.
    #[test]
    fn keyed_state_of_another_key_hash_is_refused() {
        let mut c = checkpoint(2);
        assert!(plan(&c, &graph(2), false).is_ok());
        c.key_hash = 0;
        assert!(matches!(
            plan(&c, &graph(2), false),
            Err(RestoreError::KeyHash {
                found: 0,
                expected: KEY_HASH_VERSION,
                ..
            })
        ));
    }
}
