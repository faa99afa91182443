//! The names of the operator-state entries a subtask's state holds: part
//! of the checkpoint format, read by restore planning and the end of
//! input, written by the subtask's task.

/// Operator-state entry of a source: its `SplitPosition`, MessagePack.
pub const SOURCE_POSITION: &str = "source-position";
use serde::{Deserialize, Serialize};

/// A split as the runtime carries it between the source coordinator, the
/// subtasks and checkpoints: its id, for the messages and errors that name
/// it, and its MessagePack bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitBytes {
    /// The split's `SourceSplit::split_id`.
    pub id: String,
    /// The split, MessagePack.
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

/// Operator-state entry of a split source's subtask: the splits it held,
/// at their positions, as a MessagePack list of `SplitBytes`. A rescale
/// deals the splits of all subtasks out again.
pub const SOURCE_SPLITS: &str = "source-splits";
/// Operator-state entry of a source that had read everything when the
/// snapshot was taken: once a checkpoint holding it for every source
/// completes, the input can end without anything left to replay.
pub const SOURCE_EXHAUSTED: &str = "source-exhausted";
/// Operator-state entry of a source with a watermark strategy: its
/// generator's `GeneratorState`, MessagePack.
pub const SOURCE_WATERMARK: &str = "source-watermark";
/// Operator-state entry of an operator's first sink: what its `pre_commit`
/// returned. Further sinks of the operator have their own ([`sink_entry`]).
pub const SINK: &str = "sink";

/// Operator-state entry of the `n`th sink (from 0) of an operator's chain.
pub fn sink_entry(n: usize) -> String {
    match n {
        0 => SINK.to_owned(),
        n => format!("{SINK}-{n}"),
    }
}

/// Whether an operator-state entry is a sink's ([`sink_entry`]).
pub fn is_sink_entry(entry: &str) -> bool {
    entry == SINK
        || entry
            .strip_prefix("sink-")
            .is_some_and(|n| n.parse::<usize>().is_ok())
}

/// Prefix of the operator-state entries of broadcast state: one entry per
/// state, `broadcast-state/NAME`, its map as MessagePack.
const BROADCAST_STATE: &str = "broadcast-state/";

/// Operator-state entry of broadcast state `name`.
pub fn broadcast_entry(name: &str) -> String {
    format!("{BROADCAST_STATE}{name}")
}

/// The broadcast state an operator-state entry holds, by name.
pub fn broadcast_state_of(entry: &str) -> Option<&str> {
    entry.strip_prefix(BROADCAST_STATE)
}

/// Operator-state entry of an async operator: the records whose results
/// had not left, in input order, to request again; a MessagePack list of
/// each record's own MessagePack, so that a rescale deals them out.
pub const ASYNC_IN_FLIGHT: &str = "async-in-flight";
