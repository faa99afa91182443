//! Fixtures shared by the tests of this crate and of the crates above it
//! (`testkit` feature): checkpoints with known contents.

use crate::checkpoint::{
    CompletedCheckpoint, KeyGroupsStateHandle, KeyedStateHandle, StateHandle, SubtaskState,
};
use crate::model::event::CheckpointKind;
use crate::model::ids::{CheckpointId, OperatorId, SubtaskId, SubtaskIndex};
use std::collections::BTreeMap;

/// A completed checkpoint with no state, for storage tests.
pub fn checkpoint(id: u64) -> CompletedCheckpoint {
    CompletedCheckpoint {
        id: CheckpointId(id),
        kind: CheckpointKind::Checkpoint,
        format: Default::default(),
        operators: Vec::new(),
        edges: Vec::new(),
        key_hash: crate::model::key_hash::KEY_HASH_VERSION,
        timestamp: id,
        subtasks: BTreeMap::new(),
        master_states: BTreeMap::new(),
    }
}

/// RocksDB native keyed state of all key groups: `shared` files (counted
/// by the registry) and `private` ones.
pub fn native(
    shared: Vec<crate::checkpoint::NativeFileHandle>,
    private: Vec<crate::checkpoint::NativeFileHandle>,
) -> SubtaskState {
    SubtaskState {
        keyed: Some(KeyedStateHandle::Native(
            crate::checkpoint::NativeStateHandle {
                key_groups: crate::model::key_group::KeyGroupRange { start: 0, end: 128 },
                shared,
                private,
            },
        )),
        ..SubtaskState::default()
    }
}

/// Keyed state of two subtasks as segments of one merged file holding
/// `abcdef`, and channel state inline.
pub fn merged() -> CompletedCheckpoint {
    let mut c = checkpoint(4);
    for (index, offset, bytes) in [(0, 0, b"abc"), (1, 3, b"def")] {
        let state = SubtaskState {
            keyed: Some(KeyedStateHandle::KeyGroups(KeyGroupsStateHandle {
                start_group: index * 64,
                offsets: vec![0],
                handle: StateHandle::Segment {
                    path: "merged/file-1".into(),
                    offset,
                    size: 3,
                    checksum: crate::checkpoint::checksum(bytes),
                },
            })),
            ..SubtaskState::default()
        };
        c.subtasks.insert(subtask(index), state);
    }
    c.subtasks
        .get_mut(&subtask(1))
        .unwrap()
        .channels
        .push(crate::checkpoint::ChannelStateHandle {
            side: crate::checkpoint::ChannelSide::Input,
            channel: 0,
            batches: 1,
            handle: StateHandle::Inline(vec![7]),
        });
    c
}

fn subtask(index: u32) -> SubtaskId {
    SubtaskId {
        operator: OperatorId(1),
        index: SubtaskIndex(index),
    }
}
pub mod layering;
pub mod sim;
pub mod state;
pub mod store;
