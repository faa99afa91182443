//! `tidemark inspect PATH`: what a checkpoint's or savepoint's `_metadata`
//! holds, for people or (`--json`) for programs. Only `_metadata` is read.

use crate::config::values::snapshot_dir;
use crate::{block_on, CliError};
use clap::Args;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use tidemark_core::checkpoint::{
    metadata, ChannelSide, CompletedCheckpoint, KeyedStateHandle, SnapshotFormat, StateHandle,
    SubtaskState,
};
use tidemark_core::dataflow::task::SOURCE_WATERMARK;
use tidemark_core::model::event::CheckpointKind;
use tidemark_core::time::watermark::GeneratorState;
use tidemark_storage::{CheckpointStorage, METADATA};

/// `tidemark inspect`'s arguments.
#[derive(Clone, Debug, Args)]
pub struct InspectArgs {
    /// A checkpoint directory (`chk-N`), a savepoint directory, or the
    /// `_metadata` in one: a path or URL.
    pub path: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A checkpoint's or savepoint's metadata, as `inspect` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    /// The directory the metadata was read from.
    pub path: String,
    /// `checkpoint` or `savepoint`.
    pub kind: &'static str,
    /// `job-directory` (references relative to the job's checkpoint
    /// directory) or `self-contained` (relative to this directory).
    pub format: &'static str,
    /// The metadata format's version.
    pub format_version: u16,
    /// The checkpoint id.
    pub id: u64,
    /// Trigger time, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// The job's operators when it was taken, which a restore matches by
    /// uid.
    pub operators: Vec<OperatorView>,
    /// Every subtask's state.
    pub subtasks: Vec<SubtaskView>,
    /// Bytes of state, inline or not.
    pub state_bytes: u64,
}

/// An operator of the job the metadata records.
#[derive(Clone, Debug, Serialize)]
pub struct OperatorView {
    /// Its index in the job graph.
    pub id: u32,
    /// Its chain's name.
    pub name: String,
    /// The stable identity a restore matches it by.
    pub uid: String,
    /// Subtasks when the snapshot was taken.
    pub parallelism: u32,
    /// Key groups, which bound any later parallelism.
    pub max_parallelism: u32,
    /// Timers over its subtasks.
    pub timers: u64,
}

/// One subtask's state in the snapshot.
#[derive(Clone, Debug, Serialize)]
pub struct SubtaskView {
    /// Its operator's id.
    pub operator: u32,
    /// Its index within the operator.
    pub index: u32,
    /// `[start, end)`, if the subtask has keyed state.
    pub key_groups: Option<[u32; 2]>,
    /// What the keyed state is: `key-groups` (heap) or `native` (RocksDB).
    pub keyed: Option<&'static str>,
    /// The objects its state lives in.
    pub files: Vec<FileView>,
    /// State carried inside the metadata.
    pub inline_bytes: u64,
    /// In-flight data of an unaligned checkpoint.
    pub channels: Vec<ChannelView>,
    /// Operator state (source offsets, sink transactions): bytes by name.
    pub operator_state: BTreeMap<String, usize>,
    /// Event- and processing-time timers in its keyed state.
    pub timers: u64,
    /// A source's last emitted watermark, from its operator state.
    pub watermark: Option<u64>,
}

/// A state object: an object of its own, or a segment of a merged one.
#[derive(Clone, Debug, Serialize)]
pub struct FileView {
    /// The physical object, relative to the snapshot's directory.
    pub path: String,
    /// Where the state object starts in it: merged files hold several.
    pub offset: u64,
    /// Bytes of the state object.
    pub size: u64,
}

/// The persisted in-flight batches of one channel.
#[derive(Clone, Debug, Serialize)]
pub struct ChannelView {
    /// `input` or `output`.
    pub side: &'static str,
    /// The channel's index on that side.
    pub channel: u32,
    /// Batches persisted.
    pub batches: u32,
    /// Their bytes.
    pub bytes: u64,
    /// Whether they travel inside the metadata.
    pub inline: bool,
}

impl SubtaskView {
    fn of(operator: u32, index: u32, state: &SubtaskState) -> Self {
        let (key_groups, keyed) = match &state.keyed {
            None => (None, None),
            Some(KeyedStateHandle::KeyGroups(k)) => (
                Some([k.start_group, k.start_group + k.offsets.len() as u32]),
                Some("key-groups"),
            ),
            Some(KeyedStateHandle::Native(n)) => {
                (Some([n.key_groups.start, n.key_groups.end]), Some("native"))
            }
        };
        let mut files = Vec::new();
        let mut inline_bytes = 0;
        for handle in state.handles() {
            match handle.physical() {
                None => inline_bytes += handle.size(),
                Some(path) => files.push(FileView {
                    path: path.to_owned(),
                    offset: handle.range().start,
                    size: handle.size(),
                }),
            }
        }
        SubtaskView {
            operator,
            index,
            key_groups,
            keyed,
            files,
            inline_bytes,
            channels: state
                .channels
                .iter()
                .map(|c| ChannelView {
                    side: match c.side {
                        ChannelSide::Input => "input",
                        ChannelSide::Output => "output",
                    },
                    channel: c.channel,
                    batches: c.batches,
                    bytes: c.handle.size(),
                    inline: matches!(c.handle, StateHandle::Inline(_)),
                })
                .collect(),
            operator_state: state
                .operator
                .iter()
                .map(|(name, bytes)| (name.clone(), bytes.len()))
                .collect(),
            timers: state.timers,
            watermark: state
                .operator
                .get(SOURCE_WATERMARK)
                .and_then(|bytes| rmp_serde::from_slice::<GeneratorState>(bytes).ok())
                .and_then(|g| g.emitted),
        }
    }
}

impl Inspection {
    /// What `checkpoint`, read from `path`, shows.
    pub fn of(path: String, checkpoint: &CompletedCheckpoint) -> Self {
        Inspection {
            path,
            kind: match checkpoint.kind {
                CheckpointKind::Checkpoint => "checkpoint",
                CheckpointKind::Savepoint => "savepoint",
            },
            format: match checkpoint.format {
                SnapshotFormat::JobDirectory => "job-directory",
                SnapshotFormat::SelfContained => "self-contained",
            },
            format_version: metadata::VERSION,
            id: checkpoint.id.0,
            timestamp_ms: checkpoint.timestamp,
            operators: checkpoint
                .operators
                .iter()
                .map(|op| OperatorView {
                    id: op.id.0,
                    name: op.name.clone(),
                    uid: op.uid.clone(),
                    parallelism: op.parallelism,
                    max_parallelism: op.max_parallelism,
                    timers: checkpoint
                        .subtasks
                        .iter()
                        .filter(|(id, _)| id.operator == op.id)
                        .map(|(_, s)| s.timers)
                        .sum(),
                })
                .collect(),
            subtasks: checkpoint
                .subtasks
                .iter()
                .map(|(id, state)| SubtaskView::of(id.operator.0, id.index.0, state))
                .collect(),
            state_bytes: checkpoint.subtasks.values().map(SubtaskState::size).sum(),
        }
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} {} of {}", self.kind, self.id, self.path)?;
        writeln!(
            f,
            "format: {} (metadata version {}), taken at {} ms since the epoch, {} bytes of state",
            self.format, self.format_version, self.timestamp_ms, self.state_bytes
        )?;
        writeln!(f, "operators:")?;
        for op in &self.operators {
            writeln!(
                f,
                "  op-{} {:?} uid {:?}: parallelism {}, max parallelism {}, {} timers",
                op.id, op.name, op.uid, op.parallelism, op.max_parallelism, op.timers
            )?;
        }
        writeln!(f, "subtasks:")?;
        for s in &self.subtasks {
            write!(f, "  op-{} #{}", s.operator, s.index)?;
            if let (Some([start, end]), Some(keyed)) = (s.key_groups, s.keyed) {
                write!(f, ": {keyed} state of key groups {start}..{end}")?;
            }
            write!(f, ", {} bytes inline, {} timers", s.inline_bytes, s.timers)?;
            match s.watermark {
                Some(u64::MAX) => writeln!(f, ", watermark: end of input")?,
                Some(w) => writeln!(f, ", watermark {w}")?,
                None => writeln!(f)?,
            }
            for file in &s.files {
                writeln!(
                    f,
                    "    file {} ({} bytes at {})",
                    file.path, file.size, file.offset
                )?;
            }
            for c in &s.channels {
                writeln!(
                    f,
                    "    channel state: {} channel {}, {} batches, {} bytes{}",
                    c.side,
                    c.channel,
                    c.batches,
                    c.bytes,
                    if c.inline { " inline" } else { "" }
                )?;
            }
            for (name, bytes) in &s.operator_state {
                writeln!(f, "    operator state {name:?}: {bytes} bytes")?;
            }
        }
        Ok(())
    }
}

/// Reads the metadata `args.path` names, and nothing else.
pub fn inspect(args: &InspectArgs) -> Result<Inspection, CliError> {
    let storage = CheckpointStorage::open_directory(snapshot_dir(&args.path), false)?;
    let checkpoint = block_on(storage.read_metadata_at(METADATA))??;
    Ok(Inspection::of(storage.directory(), &checkpoint))
}
