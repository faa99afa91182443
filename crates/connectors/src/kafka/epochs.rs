//! The rules of the exactly-once Kafka sink, without IO.
//!
//! librdkafka cannot resume a transaction that another producer began (Flink
//! does it for the Java client by setting the producer id and epoch by
//! reflection): a new producer's `init_transactions` aborts it. So the sink
//! writes ahead instead. The records between two barriers are an *epoch*;
//! at the barrier the epoch is sealed into the checkpoint's sink state, and
//! when the checkpoint completes each sealed epoch goes to Kafka in a
//! transaction of its own that also commits a *marker*: the checkpoint id
//! as an offset of the sink's own consumer group, together with the *run*
//! (a number each fresh start draws, which restores keep). Records and
//! marker become visible together, so after a crash the marker tells
//! exactly which epochs of the restored state Kafka already has, and the
//! others are sent again, each once. A marker of another run (an earlier
//! job under the same transactional id) says nothing of this one's. The
//! marker is one offset, run in the high 32 bits and checkpoint in the low
//! 32, because not every broker keeps an offset's metadata.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tidemark_core::model::ids::CheckpointId;
use tidemark_core::UserError;

/// One Kafka record, as the sink sends it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// The record's key: the row's key columns.
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// The record's value: the row as a JSON object.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

/// What a checkpoint holds of a sink subtask: its transactional id, its
/// run and the sealed epochs Kafka may not have yet.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkState {
    /// Names the producer and the marker's group of the subtask that
    /// sealed them.
    pub transactional_id: String,
    /// The run its markers carry.
    pub run: u32,
    /// Sealed epochs by the checkpoint whose barrier sealed them.
    pub epochs: BTreeMap<u64, Vec<Message>>,
}

/// An epoch to send: the checkpoint that sealed it, and its records.
pub type Epoch = (CheckpointId, Vec<Message>);

/// What a marker says: the checkpoint whose epoch was sent last, by which
/// run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marker {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// The run that sent it.
    pub run: u32,
}

impl Marker {
    /// As a committed offset: never negative, whatever the run.
    pub fn offset(self) -> i64 {
        (i64::from(self.run & 0x7FFF_FFFF) << 32) | (self.checkpoint.0 & 0xFFFF_FFFF) as i64
    }

    /// The marker a committed offset holds.
    pub fn from_offset(offset: i64) -> Self {
        Marker {
            checkpoint: CheckpointId((offset & 0xFFFF_FFFF) as u64),
            run: (offset >> 32) as u32,
        }
    }
}

/// One sink subtask's epochs: the open one and those sealed but not yet
/// in Kafka.
#[derive(Debug, Default)]
pub struct Epochs {
    transactional_id: String,
    run: u32,
    open: Vec<Message>,
    sealed: BTreeMap<u64, Vec<Message>>,
}

impl Epochs {
    /// The epochs of the subtask whose producer is `transactional_id`, in
    /// run `run`.
    pub fn new(transactional_id: &str, run: u32) -> Self {
        Epochs {
            transactional_id: transactional_id.to_owned(),
            run,
            ..Epochs::default()
        }
    }

    /// The run its markers carry.
    pub fn run(&self) -> u32 {
        self.run
    }

    /// A record of the open epoch.
    pub fn push(&mut self, message: Message) {
        self.open.push(message);
    }

    /// The barrier of `checkpoint`: seals the open epoch under it and
    /// returns the state that checkpoint holds.
    pub fn seal(&mut self, checkpoint: CheckpointId) -> Result<Vec<u8>, UserError> {
        // An empty epoch is sealed too: its transaction moves the marker,
        // which then always names the last checkpoint committed.
        let open = std::mem::take(&mut self.open);
        self.sealed.entry(checkpoint.0).or_default().extend(open);
        let state = SinkState {
            transactional_id: self.transactional_id.clone(),
            run: self.run,
            epochs: self.sealed.clone(),
        };
        Ok(rmp_serde::to_vec(&state)?)
    }

    /// `checkpoint` completed: the sealed epochs up to it, oldest first,
    /// which must now go to Kafka. They stay in the state of every later
    /// checkpoint until then, so none is lost if sending fails.
    pub fn due(&self, checkpoint: CheckpointId) -> Vec<CheckpointId> {
        self.sealed
            .range(..=checkpoint.0)
            .map(|(&id, _)| CheckpointId(id))
            .collect()
    }

    /// The records of sealed epoch `checkpoint`.
    pub fn messages(&self, checkpoint: CheckpointId) -> &[Message] {
        self.sealed.get(&checkpoint.0).map_or(&[], Vec::as_slice)
    }

    /// The records since the last barrier, taken out: at the end of input.
    pub fn take_open(&mut self) -> Vec<Message> {
        std::mem::take(&mut self.open)
    }

    /// Epoch `checkpoint` is in Kafka.
    pub fn sent(&mut self, checkpoint: CheckpointId) {
        self.sealed.remove(&checkpoint.0);
    }
}

/// Reads a sink state from a checkpoint.
pub fn decode(state: &[u8]) -> Result<SinkState, UserError> {
    rmp_serde::from_slice(state).map_err(|e| {
        format!("the checkpoint's Kafka sink state is not one this sink wrote: {e}").into()
    })
}

/// The epochs of a restored `state` that Kafka lacks, oldest first, given
/// the marker of its transactional id.
pub fn unsent(state: SinkState, marker: Option<Marker>) -> Vec<Epoch> {
    let sent = marker
        .filter(|m| m.run == state.run)
        .map_or(0, |m| m.checkpoint.0);
    state
        .epochs
        .into_iter()
        .filter(|&(id, _)| id > sent)
        .map(|(id, messages)| (CheckpointId(id), messages))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(n: u8) -> Message {
        Message {
            key: vec![n],
            value: vec![n, n],
        }
    }

    fn ids(epochs: &[Epoch]) -> Vec<u64> {
        epochs.iter().map(|(id, _)| id.0).collect()
    }

    #[test]
    fn an_epoch_is_due_once_its_checkpoint_completes_and_kept_until_sent() {
        let mut epochs = Epochs::new("t-0", 1);
        epochs.push(message(1));
        epochs.seal(CheckpointId(1)).unwrap();
        epochs.push(message(2));
        epochs.seal(CheckpointId(2)).unwrap();
        epochs.push(message(3));
        assert_eq!(epochs.due(CheckpointId(1)), [CheckpointId(1)]);
        assert_eq!(epochs.messages(CheckpointId(1)), [message(1)]);
        // Checkpoint 1's completion is lost; 3's barrier seals 3, and 2
        // is still to send.
        let state = decode(&epochs.seal(CheckpointId(3)).unwrap()).unwrap();
        assert_eq!((state.transactional_id.as_str(), state.run), ("t-0", 1));
        assert_eq!(state.epochs.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
        let due = epochs.due(CheckpointId(3));
        assert_eq!(due, [CheckpointId(1), CheckpointId(2), CheckpointId(3)]);
        for id in due {
            epochs.sent(id);
        }
        assert!(epochs.due(CheckpointId(9)).is_empty());
        let four = decode(&epochs.seal(CheckpointId(4)).unwrap()).unwrap();
        assert_eq!(four.epochs.keys().copied().collect::<Vec<_>>(), [4]);
    }

    #[test]
    fn a_restore_sends_only_the_epochs_after_the_marker() {
        let mut epochs = Epochs::new("t-0", 1);
        for n in 1..=3 {
            epochs.push(message(n));
            epochs.seal(CheckpointId(n.into())).unwrap();
        }
        let sealed = epochs.seal(CheckpointId(3)).unwrap();
        let state = || decode(&sealed).unwrap();
        let marker = |checkpoint, run| {
            // Through an offset, as Kafka keeps it.
            let marker = Marker {
                checkpoint: CheckpointId(checkpoint),
                run,
            };
            Some(Marker::from_offset(marker.offset()))
        };
        assert_eq!(ids(&unsent(state(), None)), [1, 2, 3]);
        assert_eq!(ids(&unsent(state(), marker(2, 1))), [3]);
        assert!(unsent(state(), marker(3, 1)).is_empty());
        // An earlier job's marker under the same id says nothing of run 1's.
        assert_eq!(ids(&unsent(state(), marker(9, 0x7FFF_FFFF))), [1, 2, 3]);
    }

    #[test]
    fn an_empty_epoch_still_moves_the_marker_and_a_foreign_state_is_refused() {
        let mut epochs = Epochs::new("t-0", 1);
        let state = decode(&epochs.seal(CheckpointId(1)).unwrap()).unwrap();
        assert_eq!(state.epochs.get(&1), Some(&Vec::new()));
        assert_eq!(epochs.due(CheckpointId(1)), [CheckpointId(1)]);
        let error = decode(b"\x01\x02not msgpack").unwrap_err().to_string();
        assert!(error.contains("not one this sink wrote"), "{error}");
    }
}
