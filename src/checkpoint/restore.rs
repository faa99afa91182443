//! Which state each subtask of a job resumes from: the pure half of a
//! restore. It checks that the checkpoint fits the job and cuts every keyed
//! state object into the byte ranges of its key groups, so that the shell
//! only has to read objects and hand out slices.

use super::{
    ChannelSide, ChannelStateHandle, CompletedCheckpoint, KeyGroupsStateHandle, KeyedStateHandle,
    NativeStateHandle, StateHandle,
};
use crate::graph::JobGraph;
use crate::ids::{KeyGroup, OperatorId, SubtaskId};
use crate::key_group::KeyGroupRange;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RestoreError {
    #[error("the checkpoint has state for {0}, which this job does not have")]
    UnknownSubtask(SubtaskId),
    #[error("operator {name:?} ran at parallelism {checkpointed} in the checkpoint and is {now} now; restoring at another parallelism is not supported yet")]
    Parallelism {
        name: String,
        checkpointed: u32,
        now: u32,
    },
    #[error("checkpoint {checkpoint} is unaligned and holds in-flight channel state; operator {name:?} ran at parallelism {checkpointed} in it and is {now} now, and restoring channel state at another parallelism is not supported yet")]
    UnalignedRescale {
        checkpoint: crate::ids::CheckpointId,
        name: String,
        checkpointed: u32,
        now: u32,
    },
    #[error("operator {name:?} has max parallelism {checkpointed} in the checkpoint and {now} in the job; key groups cannot be mapped between them (set the job's max parallelism to {checkpointed})")]
    MaxParallelism {
        name: String,
        checkpointed: u32,
        now: u32,
    },
    #[error("the state of {subtask} is malformed: {problem}")]
    Malformed { subtask: SubtaskId, problem: String },
}

/// Key groups of one state object that a subtask reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedSlices {
    pub handle: StateHandle,
    /// Byte ranges within the state object's bytes.
    pub groups: Vec<(KeyGroup, Range<u64>)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestorePlan {
    pub keyed: Vec<KeyedSlices>,
    pub operator: BTreeMap<String, Vec<u8>>,
    /// In-flight batches to replay, each on a channel the subtask has.
    pub channels: Vec<ChannelStateHandle>,
    /// A native checkpoint of exactly the key groups the subtask owns, to
    /// download and open.
    pub native: Option<NativeStateHandle>,
}

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
        out.push((KeyGroup(handle.start_group + i as u32), start..end));
    }
    Ok(out)
}

/// The state of every subtask of `graph` in `checkpoint`. Subtasks the
/// checkpoint knows nothing of start empty.
pub fn plan(
    checkpoint: &CompletedCheckpoint,
    graph: &JobGraph,
) -> Result<HashMap<SubtaskId, RestorePlan>, RestoreError> {
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
    let mut checkpointed: BTreeMap<OperatorId, u32> = BTreeMap::new();
    for subtask in checkpoint.subtasks.keys() {
        if subtask.operator.0 as usize >= graph.operators.len() {
            return Err(RestoreError::UnknownSubtask(*subtask));
        }
        let p = checkpointed.entry(subtask.operator).or_default();
        *p = (*p).max(subtask.index.0 + 1);
    }
    for (&operator, &parallelism) in &checkpointed {
        let op = graph.operator(operator);
        let has_channel_state = checkpoint
            .subtasks
            .values()
            .any(|state| !state.channels.is_empty());
        if op.parallelism != parallelism && has_channel_state {
            return Err(RestoreError::UnalignedRescale {
                checkpoint: checkpoint.id,
                name: op.name.clone(),
                checkpointed: parallelism,
                now: op.parallelism,
            });
        }
        if op.parallelism != parallelism {
            return Err(RestoreError::Parallelism {
                name: op.name.clone(),
                checkpointed: parallelism,
                now: op.parallelism,
            });
        }
    }
    let mut plans: HashMap<SubtaskId, RestorePlan> = HashMap::new();
    for (subtask, state) in &checkpoint.subtasks {
        let op = graph.operator(subtask.operator);
        let owned = KeyGroupRange::for_subtask(op.max_parallelism, op.parallelism, subtask.index);
        let plan = plans.entry(*subtask).or_default();
        plan.operator = state.operator.clone();
        for channel in &state.channels {
            let count = match channel.side {
                ChannelSide::Input => graph.input_count(*subtask),
                ChannelSide::Output => graph.output_count(*subtask),
            };
            if channel.channel as usize >= count {
                return Err(RestoreError::Malformed {
                    subtask: *subtask,
                    problem: format!(
                        "channel state for {:?} channel {} of {count}",
                        channel.side, channel.channel
                    ),
                });
            }
        }
        plan.channels = state.channels.clone();
        match &state.keyed {
            None => {}
            Some(KeyedStateHandle::KeyGroups(keyed)) => {
                let groups = ranges(*subtask, keyed)?;
                if let Some((group, _)) = groups.iter().find(|(g, _)| !owned.contains(*g)) {
                    return Err(RestoreError::Malformed {
                        subtask: *subtask,
                        problem: format!("{group} belongs to another subtask"),
                    });
                }
                plan.keyed.push(KeyedSlices {
                    handle: keyed.handle.clone(),
                    groups,
                });
            }
            Some(KeyedStateHandle::Native(native)) => {
                if native.key_groups != owned {
                    return Err(RestoreError::Malformed {
                        subtask: *subtask,
                        problem: format!(
                            "a native checkpoint of {:?} where the subtask owns {owned:?}",
                            native.key_groups
                        ),
                    });
                }
                plan.native = Some(native.clone());
            }
        }
    }
    Ok(plans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::SubtaskState;
    use crate::event::CheckpointKind;
    use crate::graph::{Edge, Partitioner};
    use crate::ids::{CheckpointId, SubtaskIndex};

    fn graph(p: u32) -> JobGraph {
        let mut g = JobGraph::default();
        let a = g.add_operator("source", p);
        let b = g.add_operator("count", p);
        g.edges.push(Edge {
            from: a,
            to: b,
            partitioner: Partitioner::Hash,
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
            timestamp: 0,
            subtasks,
            master_states: BTreeMap::new(),
        }
    }

    #[test]
    fn every_key_group_is_read_by_its_owner_from_its_byte_range() {
        let plans = plan(&checkpoint(2), &graph(2)).unwrap();
        let second = &plans[&count(1)].keyed[0];
        assert_eq!(second.handle.physical(), Some("chk-1/count-1"));
        assert_eq!(second.groups.len(), 64);
        assert_eq!(second.groups[0], (KeyGroup(64), 0..10));
        assert_eq!(second.groups[63], (KeyGroup(127), 630..640));
    }

    #[test]
    fn a_checkpoint_that_does_not_fit_the_job_is_refused() {
        assert_eq!(
            plan(&checkpoint(2), &graph(3)),
            Err(RestoreError::Parallelism {
                name: "count".into(),
                checkpointed: 2,
                now: 3
            })
        );
        let mut foreign = checkpoint(1);
        foreign.subtasks.insert(
            SubtaskId {
                operator: OperatorId(9),
                index: SubtaskIndex(0),
            },
            SubtaskState::default(),
        );
        assert!(matches!(
            plan(&foreign, &graph(1)),
            Err(RestoreError::UnknownSubtask(_))
        ));
        let mut truncated = checkpoint(1);
        let Some(KeyedStateHandle::KeyGroups(keyed)) =
            &mut truncated.subtasks.get_mut(&count(0)).unwrap().keyed
        else {
            unreachable!("the test checkpoint has key groups")
        };
        keyed.handle = StateHandle::object("chk-1/count-0", 5);
        assert!(matches!(
            plan(&truncated, &graph(1)),
            Err(RestoreError::Malformed { .. })
        ));
    }

    fn channel_state(side: ChannelSide, channel: u32) -> ChannelStateHandle {
        ChannelStateHandle {
            side,
            channel,
            batches: 1,
            handle: StateHandle::object(format!("chk-1/in-{channel}"), 10),
        }
    }

    #[test]
    fn channel_state_goes_to_its_subtask_and_must_name_a_channel_it_has() {
        let mut c = checkpoint(2);
        let state = c.subtasks.get_mut(&count(1)).unwrap();
        state.channels.push(channel_state(ChannelSide::Input, 1));
        let plans = plan(&c, &graph(2)).unwrap();
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
                plan(&c, &graph(2)),
                Err(RestoreError::Malformed { .. })
            ));
        }
    }

    #[test]
    fn a_checkpoint_of_another_max_parallelism_is_refused() {
        let mut c = checkpoint(2);
        let mut other = graph(2);
        other.operators[1].max_parallelism = 256;
        c.operators = graph(2).operators;
        let error = plan(&c, &other).unwrap_err();
        assert_eq!(
            error,
            RestoreError::MaxParallelism {
                name: "count".into(),
                checkpointed: 128,
                now: 256
            }
        );
        assert!(error.to_string().contains("max parallelism"), "{error}");
        assert!(plan(&c, &graph(2)).is_ok());
    }

    #[test]
    fn an_unaligned_checkpoint_is_not_rescaled() {
        let mut c = checkpoint(2);
        c.subtasks
            .get_mut(&count(0))
            .unwrap()
            .channels
            .push(channel_state(ChannelSide::Input, 0));
        let error = plan(&c, &graph(3)).unwrap_err();
        assert!(matches!(error, RestoreError::UnalignedRescale { .. }));
        assert!(error.to_string().contains("unaligned"), "{error}");
    }
}
