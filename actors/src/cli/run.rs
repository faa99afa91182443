//! The `tidemark` command line: runs an example topology and reports on it.

use crate::cleanup::CleanupArgs;
use crate::metrics::CheckpointStats;
use crate::runtime::{job_id, JobError, Runtime};
use crate::wordcount::{Emit, Wordcount};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use thiserror::Error;
use tidemark::checkpoint::merging::{MergingOptions, StateLayout};
use tidemark::checkpoint::{CheckpointConfig, CheckpointSettings, Restore, RestoreMode};
use tidemark::event::Alignment;
use tidemark::fault::{Fault, FaultPoint, KillSchedule, SlowSubtask};
use tidemark::ids::{CheckpointId, OperatorId, SubtaskId, SubtaskIndex};
use tidemark::job::JobConfig;
use tidemark::restart::RestartStrategy;
use tidemark::storage::METADATA;
use tidemark::storage::{StorageCounters, StorageError};
use tidemark::StateBackend;

#[derive(Debug, Parser)]
#[command(
    name = "tidemark",
    version,
    about = "Fault-tolerant stream topologies on actix"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an example topology.
    Run(RunArgs),
    /// Delete what no retained checkpoint of a job references.
    Cleanup(CleanupArgs),
    /// Show a checkpoint's or savepoint's metadata.
    Inspect(crate::inspect::InspectArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Aligned,
    Unaligned,
}

/// `--state`: where keyed state lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StateKind {
    /// Typed hash tables in memory.
    Heap,
    /// One RocksDB database per subtask, under --state-dir.
    Rocksdb,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// Count records per key.
    Wordcount,
}

impl Topology {
    /// The job's name, which also names its checkpoint directory.
    pub fn job_name(self) -> &'static str {
        match self {
            Topology::Wordcount => crate::wordcount::JOB_NAME,
        }
    }
}

#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    #[arg(value_enum)]
    pub topology: Topology,
    /// Records to generate over all sources.
    #[arg(long, default_value_t = 10_000_000)]
    pub records: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: u64,
    /// Seed of the record generator.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Subtasks per operator [default: the number of cores].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=128))]
    pub parallelism: Option<u32>,
    /// Total records per second over all sources [default: unlimited].
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// What the counting operator emits.
    #[arg(long, value_enum, default_value_t = Emit::Final)]
    pub emit: Emit,
    /// Directory for the results: committed files are those directly in it
    /// whose names do not start with `.` or `_`.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Checkpoint interval (`200ms`, `2s`), or `off`.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub checkpoint_interval: CheckpointInterval,
    /// Where keyed state lives.
    #[arg(long, value_enum, default_value_t = StateKind::Heap)]
    pub state: StateKind,
    /// Local working directories of the RocksDB backend, one per subtask
    /// instance, removed when it ends [default: <temp dir>/tidemark-state].
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Values the RocksDB backend keeps decoded in front of each database;
    /// a record whose key is cached costs no RocksDB read, and its writes
    /// reach RocksDB once per eviction or checkpoint.
    /// [default: 1048576]
    #[arg(long, value_parser = parse_cache_entries)]
    pub state_cache_entries: Option<usize>,
    /// Checkpoint storage: a path, `file://` path, `memory://` or
    /// `s3://bucket/prefix` (settings from the AWS_* environment variables).
    #[arg(long, default_value = "./tidemark-data/checkpoints")]
    pub checkpoint_dir: String,
    /// A checkpoint not complete this long after its trigger is aborted.
    #[arg(long, default_value = "10min", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Least time between the end of a checkpoint and the next trigger.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub min_pause: Duration,
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent: u32,
    /// Consecutive failed checkpoints tolerated before the job fails.
    #[arg(long, default_value_t = 0)]
    pub tolerable_failures: u32,
    /// Completed checkpoints kept.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub retain: u32,
    /// Aligned checkpoints wait for the barrier on every input; unaligned
    /// ones overtake the in-flight batches and persist them.
    #[arg(long, value_enum, default_value_t = Mode::Aligned)]
    pub mode: Mode,
    /// Aligned checkpoints whose alignment at a subtask lasts this long
    /// switch to unaligned there (`0s`: at the first barrier).
    #[arg(long, value_parser = parse_duration)]
    pub aligned_timeout: Option<Duration>,
    /// RocksDB state uploads only the files its newest completed checkpoint
    /// does not already hold.
    #[arg(long)]
    pub incremental: bool,
    /// State objects smaller than this travel inside the acknowledgement
    /// and `_metadata` instead of becoming objects (`0`: none do).
    #[arg(long, default_value = "20KiB", value_parser = parse_size)]
    pub inline_threshold: u64,
    /// A subtask writes the state objects of one checkpoint as segments of
    /// few physical files under `merged/`.
    #[arg(long)]
    pub file_merging: bool,
    /// Size at which a merged physical file is rolled over.
    #[arg(long, requires = "file_merging", value_parser = parse_size)]
    pub max_merged_file_size: Option<u64>,
    /// Merged files wasting more than this (total / live bytes) are
    /// rewritten by the next checkpoint [default: 1.5].
    #[arg(long, requires = "file_merging", value_parser = parse_amplification)]
    pub max_space_amplification: Option<f64>,
    /// Make this subtask of the counting operator slow (with --slow-ns), so
    /// that its inputs fill and its upstreams are backpressured.
    #[arg(long, requires = "slow_ns")]
    pub slow_subtask: Option<u32>,
    /// Nanoseconds the slow subtask spends per record.
    #[arg(long, requires = "slow_subtask", value_parser = clap::value_parser!(u64).range(1..))]
    pub slow_ns: Option<u64>,
    /// Start from `latest` (the newest completed checkpoint in the checkpoint
    /// directory), from a given `chk-N` of it, or from a savepoint directory
    /// (a path or URL holding `_metadata`).
    #[arg(long, value_parser = parse_restore)]
    pub restore: Option<RestoreArg>,
    /// Whether the job takes ownership of the checkpoint given to --restore
    /// (`claim`: it may delete its files once subsumed) or not (`no-claim`:
    /// it never deletes them, and its first checkpoint is a full one).
    /// Savepoints are never claimed; `latest` always continues the job's own.
    #[arg(long, value_enum, default_value_t = RestoreModeArg::NoClaim)]
    pub restore_mode: RestoreModeArg,
    /// Restore even if the checkpoint holds state of operators (by uid) the
    /// job lacks, which is dropped, or lacks operators of the job, which
    /// start empty.
    #[arg(long, requires = "restore")]
    pub allow_non_restored_state: bool,
    /// Where savepoints go, each into `savepoint-<job>-<id>/`: a path,
    /// `file://` path, `memory://NAME` or `s3://bucket/prefix`.
    #[arg(long)]
    pub savepoint_dir: Option<String>,
    /// Take one savepoint this long after the start and go on.
    #[arg(long, requires = "savepoint_dir", conflicts_with = "stop_with_savepoint_after", value_parser = parse_duration)]
    pub savepoint_after: Option<Duration>,
    /// Take a savepoint this long after the start, commit the sinks and
    /// stop: the report says where the savepoint is.
    #[arg(long, requires = "savepoint_dir", value_parser = parse_duration)]
    pub stop_with_savepoint_after: Option<Duration>,
    /// Kill a random subtask this many times at random moments (seeded by
    /// `--seed`); the job restores and goes on.
    #[arg(long, default_value_t = 0)]
    pub inject_failures: u32,
    /// A targeted fault, `POINT:CHECKPOINT:OPERATOR:SUBTASK` with POINT one of
    /// sync-snapshot, async-write, after-ack, sink-commit, or
    /// stall-after-write (the upload never acknowledges until aborted).
    #[arg(long, value_parser = parse_fault)]
    pub inject_fault: Vec<Fault>,
    /// Restarts allowed after failures [default: 10 + --inject-failures].
    #[arg(long)]
    pub max_restarts: Option<u32>,
    /// Delay before a restart.
    #[arg(long, default_value = "10ms", value_parser = parse_duration)]
    pub restart_delay: Duration,
    /// Double the restart delay after every restart, up to 1 s.
    #[arg(long)]
    pub restart_backoff: bool,
    /// Print a JSON report as the last line of stdout.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("expected a duration like 200ms or 2s ({e})"))
}

/// A checkpoint interval; `None` is `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointInterval(pub Option<Duration>);

fn parse_interval(s: &str) -> Result<CheckpointInterval, String> {
    match s {
        "off" => Ok(CheckpointInterval(None)),
        _ => match parse_duration(s)? {
            d if d.is_zero() => Err("must be positive, or `off`".into()),
            d => Ok(CheckpointInterval(Some(d))),
        },
    }
}

/// `--restore-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RestoreModeArg {
    Claim,
    NoClaim,
}

/// `--restore`: `latest`, a checkpoint directory `[PATH/]chk-N`, or a
/// savepoint directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreArg {
    Latest,
    Checkpoint {
        parent: Option<PathBuf>,
        id: CheckpointId,
    },
    Savepoint(String),
}

/// The directory `path` names: itself, or the one its `_metadata` is in.
pub(crate) fn snapshot_dir(path: &str) -> &str {
    let dir = path.trim_end_matches('/');
    dir.strip_suffix(METADATA)
        .unwrap_or(dir)
        .trim_end_matches('/')
}

/// Runs `future` to completion on a runtime of its own: what the commands
/// other than `run` need to talk to storage.
pub(crate) fn block_on<F: std::future::Future>(future: F) -> Result<F::Output, CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Runtime(e.to_string()))?;
    Ok(runtime.block_on(future))
}

fn parse_restore(s: &str) -> Result<RestoreArg, String> {
    if s == "latest" {
        return Ok(RestoreArg::Latest);
    }
    let dir = snapshot_dir(s);
    if dir.is_empty() {
        return Err(format!(
            "expected `latest`, a checkpoint directory chk-N or a savepoint directory, got {s:?}"
        ));
    }
    let path = PathBuf::from(dir);
    let id = path
        .file_name()
        .and_then(|n| n.to_str()?.strip_prefix("chk-")?.parse().ok());
    let Some(id) = id.filter(|_| !dir.contains("://")) else {
        return Ok(RestoreArg::Savepoint(dir.to_owned()));
    };
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf);
    Ok(RestoreArg::Checkpoint {
        parent,
        id: CheckpointId(id),
    })
}

fn parse_fault(s: &str) -> Result<Fault, String> {
    let usage = || format!("expected POINT:CHECKPOINT:OPERATOR:SUBTASK, got {s:?}");
    let parts: Vec<&str> = s.split(':').collect();
    let [point, checkpoint, operator, index] = parts[..] else {
        return Err(usage());
    };
    let point = match point {
        "sync-snapshot" => FaultPoint::SyncSnapshot,
        "async-write" => FaultPoint::AsyncWrite,
        "stall-after-write" => FaultPoint::StallAfterWrite,
        "after-ack" => FaultPoint::AfterAck,
        "sink-commit" => FaultPoint::SinkCommit,
        other => return Err(format!("unknown fault point {other:?}")),
    };
    let small = |v: &str| v.parse::<u32>().map_err(|_| usage());
    Ok(Fault {
        point,
        checkpoint: CheckpointId(checkpoint.parse().map_err(|_| usage())?),
        subtask: SubtaskId {
            operator: OperatorId(small(operator)?),
            index: SubtaskIndex(small(index)?),
        },
    })
}

fn parse_cache_entries(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "expected a number of entries of at least 1, got {s:?}"
        )),
    }
}

/// Bytes, with an optional unit: `4096`, `20KiB`, `32MiB`, `1GiB`.
fn parse_size(s: &str) -> Result<u64, String> {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = match &s[digits.len()..] {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("unknown unit {other:?}; use B, KiB, MiB or GiB")),
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| format!("expected a size such as 20KiB, got {s:?}"))
}

fn parse_amplification(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 1.0 => Ok(v),
        _ => Err(format!(
            "expected total / live bytes above 1 (1.5 rewrites a file a third of which is wasted), got {s:?}"
        )),
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        Ok(_) => Err("must be a positive number of records per second".into()),
        Err(e) => Err(format!("not a number: {e}")),
    }
}

impl RunArgs {
    /// Arguments as the command line would take them after `tidemark run`:
    /// for tests and benchmarks that drive the same code path.
    pub fn parse<I: IntoIterator<Item = S>, S: Into<String>>(
        args: I,
    ) -> Result<RunArgs, clap::Error> {
        let argv = ["tidemark".to_owned(), "run".to_owned()]
            .into_iter()
            .chain(args.into_iter().map(Into::into));
        match Cli::try_parse_from(argv)?.command {
            Command::Run(args) => Ok(args),
            Command::Cleanup(_) | Command::Inspect(_) => {
                unreachable!("the subcommand is `run`")
            }
        }
    }
}

#[derive(Debug, Error)]
pub enum CliError {
    /// A bad argument found after parsing: exit code 2, like clap's own.
    #[error("{argument}: {problem}")]
    Usage {
        argument: &'static str,
        problem: String,
    },
    #[error(transparent)]
    Job(#[from] JobError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("corrupted checkpoint metadata; nothing was deleted, since its checkpoint may reference any object (--ignore-corrupted-metadata sweeps it too):\n  {}", .0.join("\n  "))]
    CorruptedMetadata(Vec<String>),
    #[error("checkpoints were subsumed during each of {attempts} scans; nothing was deleted")]
    StorageChanging { attempts: usize },
    #[error("cannot start an async runtime: {0}")]
    Runtime(String),
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage { .. } => 2,
            _ => 1,
        }
    }
}

/// The `--json` report.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub topology: Topology,
    pub records_in: u64,
    pub elapsed_s: f64,
    pub throughput_rps: f64,
    pub parallelism: u32,
    /// Most batches queued in any output endpoint, and its credits.
    pub max_output_queued: u32,
    pub output_credits: u32,
    /// Most batches held by any input endpoint and its subtask, and its credits.
    pub max_input_buffered: u32,
    pub input_credits: u32,
    pub checkpoints_completed: u64,
    pub checkpoints_failed: u64,
    pub restarts: u64,
    pub checkpoint_duration_ms: Percentiles,
    pub alignment_ms: Percentiles,
    /// The whole state the last completed checkpoint references.
    pub checkpointed_bytes_full: u64,
    /// What the last completed checkpoint wrote itself, and all of them.
    pub bytes_uploaded_last: u64,
    pub bytes_uploaded_total: u64,
    pub files_uploaded_total: u64,
    /// What each completed checkpoint wrote itself.
    pub bytes_uploaded_per_checkpoint: Percentiles,
    pub mode: Mode,
    /// In-flight bytes persisted by the last completed checkpoint, and the
    /// most by any.
    pub persisted_inflight_bytes: LastMax,
    /// Most batches persisted for one channel by one checkpoint.
    pub persisted_inflight_batches_per_channel_max: u32,
    pub checkpoints_switched_to_unaligned: u64,
    /// In-flight batches that restores replayed from channel state.
    pub restored_inflight_batches: u64,
    /// From a failure to the restored attempt's deployment.
    pub recovery_ms: Percentiles,
    /// The state the last restore read (from `--restore` or a failover) and
    /// how long it took, from reading and downloading it until every
    /// subtask's state was rebuilt from it.
    pub restored_bytes: u64,
    pub restore_ms: f64,
    /// Physical objects the retained checkpoints reference, and their total
    /// over live bytes after the last completed checkpoint, and the most.
    pub physical_files_live: u64,
    pub space_amplification: f64,
    pub space_amplification_max: f64,
    /// What the run did to checkpoint storage: objects created and deleted
    /// (metadata and the id counter included) and the bytes of every put.
    pub objects_created: u64,
    pub objects_deleted: u64,
    pub bytes_uploaded: u64,
    pub savepoints_completed: u64,
    /// Trigger to the last savepoint's directory written.
    pub savepoint_ms: f64,
    /// Where the savepoint of --savepoint-after or
    /// --stop-with-savepoint-after is, if it completed.
    pub savepoint: Option<String>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct LastMax {
    pub last: u64,
    pub max: u64,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    fn of(samples: &std::sync::Mutex<Vec<f64>>) -> Self {
        let (p50, p99, max) = CheckpointStats::percentiles(samples);
        Percentiles { p50, p99, max }
    }
}

impl RunArgs {
    fn job_config(&self) -> JobConfig {
        let mut config = JobConfig::default();
        if let Some(p) = self.parallelism {
            config.parallelism = p;
        }
        config.source_rate = self.rate;
        config.state_backend = match (self.state, &self.state_dir) {
            (StateKind::Heap, _) => StateBackend::Heap,
            #[cfg(feature = "rocksdb")]
            (StateKind::Rocksdb, dir) => {
                StateBackend::rocksdb(dir.clone(), self.state_cache_entries)
            }
            #[cfg(not(feature = "rocksdb"))]
            (StateKind::Rocksdb, _) => unreachable!("validate refuses --state rocksdb"),
        };
        // Savepoints need the coordinator even without periodic checkpoints.
        let checkpointing = self.checkpoint_interval.0.is_some() || self.savepoint_dir.is_some();
        config.checkpointing =
            checkpointing
                .then_some(self.checkpoint_interval.0)
                .map(|interval| CheckpointSettings {
                    config: CheckpointConfig {
                        interval,
                        timeout: self.timeout,
                        min_pause: self.min_pause,
                        max_concurrent: self.max_concurrent as usize,
                        tolerable_failures: self.tolerable_failures,
                        retain: self.retain as usize,
                    },
                    storage_url: self.checkpoint_dir.clone(),
                    alignment: match (self.mode, self.aligned_timeout) {
                        (Mode::Unaligned, _) => Alignment::Unaligned,
                        (Mode::Aligned, None) => Alignment::Aligned,
                        (Mode::Aligned, Some(timeout)) => Alignment::AlignedWithTimeout(timeout),
                    },
                    incremental: self.incremental,
                    layout: StateLayout {
                        inline_threshold: self.inline_threshold,
                        max_merged_file_size: self.file_merging.then(|| {
                            self.max_merged_file_size
                                .unwrap_or(MergingOptions::default().max_file_size)
                        }),
                        max_space_amplification: self
                            .max_space_amplification
                            .unwrap_or(StateLayout::default().max_space_amplification),
                    },
                    restore: match &self.restore {
                        None => Restore::Fresh,
                        Some(RestoreArg::Latest) => Restore::Latest,
                        Some(RestoreArg::Checkpoint { id, .. }) => Restore::Checkpoint(*id),
                        Some(RestoreArg::Savepoint(dir)) => Restore::Savepoint(dir.clone()),
                    },
                    restore_mode: match self.restore_mode {
                        RestoreModeArg::Claim => RestoreMode::Claim,
                        RestoreModeArg::NoClaim => RestoreMode::NoClaim,
                    },
                    allow_non_restored_state: self.allow_non_restored_state,
                    savepoint_dir: self.savepoint_dir.clone(),
                });
        let max_attempts = self.max_restarts.unwrap_or(10 + self.inject_failures);
        config.restart = if self.restart_backoff {
            RestartStrategy::ExponentialBackoff {
                initial: self.restart_delay,
                max: Duration::from_secs(1),
                multiplier: 2.0,
                max_attempts,
            }
        } else {
            RestartStrategy::FixedDelay {
                delay: self.restart_delay,
                max_attempts,
            }
        };
        if self.inject_failures > 0 {
            let subtasks = 2 * config.parallelism as usize;
            config.kills = Some(KillSchedule::new(
                self.seed,
                self.inject_failures as usize,
                self.records,
                subtasks,
            ));
        }
        config.faults = self.inject_fault.clone();
        // Operator 1 is the counter, with the sink chained to it.
        config.slow = self
            .slow_subtask
            .zip(self.slow_ns)
            .map(|(index, ns_per_record)| SlowSubtask {
                subtask: SubtaskId {
                    operator: OperatorId(1),
                    index: SubtaskIndex(index),
                },
                ns_per_record,
            });
        config
    }

    /// `--savepoint-after` or `--stop-with-savepoint-after`: when, and
    /// whether to stop.
    fn timed_savepoint(&self) -> Option<(Duration, bool)> {
        self.savepoint_after
            .map(|d| (d, false))
            .or(self.stop_with_savepoint_after.map(|d| (d, true)))
    }

    fn validate(&self) -> Result<(), CliError> {
        let needs_checkpoints = |argument| CliError::Usage {
            argument,
            problem: "needs checkpointing; --checkpoint-interval is off".into(),
        };
        #[cfg(not(feature = "rocksdb"))]
        if self.state == StateKind::Rocksdb {
            return Err(CliError::Usage {
                argument: "--state",
                problem: "this tidemark was built without RocksDB (the `rocksdb` feature)".into(),
            });
        }
        if self.incremental && self.state != StateKind::Rocksdb {
            return Err(CliError::Usage {
                argument: "--incremental",
                problem: "applies to RocksDB state; add --state rocksdb".into(),
            });
        }
        if self.state_cache_entries.is_some() && self.state != StateKind::Rocksdb {
            return Err(CliError::Usage {
                argument: "--state-cache-entries",
                problem: "applies to RocksDB state; add --state rocksdb".into(),
            });
        }
        if self.mode == Mode::Unaligned && self.aligned_timeout.is_some() {
            return Err(CliError::Usage {
                argument: "--aligned-timeout",
                problem: "applies to aligned checkpoints; with --mode unaligned every checkpoint is unaligned from the start".into(),
            });
        }
        let config = self.job_config();
        if let Some(Err(e)) = config.checkpointing.as_ref().map(|c| c.validate()) {
            return Err(CliError::Usage {
                argument: "--max-concurrent",
                problem: e.to_string(),
            });
        }
        let parallelism = config.parallelism;
        if let Some(subtask) = self.slow_subtask.filter(|s| *s >= parallelism) {
            return Err(CliError::Usage {
                argument: "--slow-subtask",
                problem: format!("subtask {subtask} does not exist at parallelism {parallelism}"),
            });
        }
        if let Some(RestoreArg::Savepoint(dir)) = &self.restore {
            // A local directory is checked here, before anything starts;
            // other URLs when the job opens them.
            let local = dir.strip_prefix("file://").unwrap_or(dir);
            if !local.contains("://") && !Path::new(local).join(METADATA).is_file() {
                return Err(CliError::Usage {
                    argument: "--restore",
                    problem: format!(
                        "{dir} is not a savepoint or checkpoint directory: it holds no {METADATA}"
                    ),
                });
            }
        }
        let job_dir = format!(
            "{}/{}",
            self.checkpoint_dir.trim_end_matches('/'),
            job_id(self.topology.job_name())
        );
        if let Some(dir) = self.savepoint_dir.as_ref().filter(|d| inside(d, &job_dir)) {
            return Err(CliError::Usage {
                argument: "--savepoint-dir",
                problem: format!(
                    "{dir} lies inside the job's checkpoint directory {job_dir}, where retention and cleanup delete what no checkpoint references; choose a directory outside it"
                ),
            });
        }
        if self.checkpoint_interval.0.is_none() {
            if self.restore.is_some() && self.savepoint_dir.is_none() {
                return Err(needs_checkpoints("--restore"));
            }
            if self.inject_failures > 0 {
                return Err(needs_checkpoints("--inject-failures"));
            }
            if !self.inject_fault.is_empty() {
                return Err(needs_checkpoints("--inject-fault"));
            }
        }
        if let Some(RestoreArg::Checkpoint {
            parent: Some(parent),
            ..
        }) = &self.restore
        {
            // A checkpoint is only read from the job's own directory in the
            // checkpoint storage: a path elsewhere is refused, not followed.
            let job_dir = Path::new(job_dir.strip_prefix("file://").unwrap_or(&job_dir));
            let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            };
            if !same(parent, job_dir) {
                return Err(CliError::Usage {
                    argument: "--restore",
                    problem: format!(
                        "{} is not a checkpoint directory of this job; its checkpoints are in {}",
                        parent.display(),
                        job_dir.display()
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Whether storage location `inner` lies within `outer`: local paths by
/// their absolute form with `..` resolved, URLs by prefix.
fn inside(inner: &str, outer: &str) -> bool {
    let local = |s: &str| {
        let s = s.strip_prefix("file://").unwrap_or(s);
        if s.contains("://") {
            return None;
        }
        let absolute = std::path::absolute(s).ok()?;
        let mut normal = PathBuf::new();
        for part in absolute.components() {
            match part {
                std::path::Component::ParentDir => {
                    normal.pop();
                }
                part => normal.push(part),
            }
        }
        Some(normal)
    };
    match (local(inner), local(outer)) {
        (Some(inner), Some(outer)) => inner.starts_with(outer),
        (None, None) => format!("{}/", inner.trim_end_matches('/'))
            .starts_with(&format!("{}/", outer.trim_end_matches('/'))),
        _ => false,
    }
}

pub fn run(args: &RunArgs) -> Result<RunReport, CliError> {
    args.validate()?;
    if let Some(dir) = &args.output {
        std::fs::create_dir_all(dir).map_err(|e| CliError::Usage {
            argument: "--output",
            problem: format!("cannot use {} as the output directory: {e}", dir.display()),
        })?;
    }
    let config = args.job_config();
    let parallelism = config.parallelism;
    let channels = config.channels;
    let job = match args.topology {
        Topology::Wordcount => Wordcount {
            records: args.records,
            keys: args.keys,
            seed: args.seed,
            emit: args.emit,
            output: args.output.clone(),
        }
        .job(config),
    };
    let handle = Runtime::default().run(job).map_err(|e| match e {
        JobError::Storage(
            e @ (StorageError::UnsupportedUrl(_) | StorageError::InvalidUrl { .. }),
        ) => CliError::Usage {
            argument: "--checkpoint-dir",
            problem: e.to_string(),
        },
        e => e.into(),
    })?;
    let metrics = handle.metrics().clone();
    let storage = handle.storage().cloned();
    let (job_ended, ended) = std::sync::mpsc::channel::<()>();
    let savepoint = args.timed_savepoint().map(|(after, stop)| {
        let control = handle.control();
        std::thread::spawn(move || {
            // Woken early when the job ends first: no savepoint then.
            if ended.recv_timeout(after) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                return None;
            }
            let taken = if stop {
                control.stop_with_savepoint()
            } else {
                control.trigger_savepoint()
            };
            taken
                .inspect_err(|e| tracing::warn!(error = %e, "the savepoint failed"))
                .ok()
        })
    });
    let outcome = handle.wait();
    drop(job_ended);
    let savepoint = savepoint
        .and_then(|thread| thread.join().ok().flatten())
        .map(|s| s.location);
    let report = outcome?;
    let storage_counter = |counter: fn(&StorageCounters) -> &AtomicU64| {
        storage
            .as_ref()
            .map_or(0, |s| counter(s.counters()).load(Ordering::Relaxed))
    };
    let stats = &metrics.checkpoints;
    let gauges: Vec<_> = metrics.channels.iter().map(|g| g.value().clone()).collect();
    Ok(RunReport {
        topology: args.topology,
        records_in: report.records_in,
        elapsed_s: report.elapsed.as_secs_f64(),
        throughput_rps: report.throughput(),
        parallelism,
        max_output_queued: gauges
            .iter()
            .map(|g| g.max_output_queued())
            .max()
            .unwrap_or(0),
        output_credits: channels.output_credits,
        max_input_buffered: gauges
            .iter()
            .map(|g| g.max_input_buffered())
            .max()
            .unwrap_or(0),
        input_credits: channels.input_credits,
        checkpoints_completed: stats.completed.load(Ordering::Relaxed),
        checkpoints_failed: stats.failed.load(Ordering::Relaxed),
        restarts: stats.restarts.load(Ordering::Relaxed),
        checkpoint_duration_ms: Percentiles::of(&stats.durations_ms),
        alignment_ms: Percentiles::of(&stats.alignments_ms),
        checkpointed_bytes_full: stats.bytes_full.load(Ordering::Relaxed),
        bytes_uploaded_last: stats.bytes_uploaded_last.load(Ordering::Relaxed),
        bytes_uploaded_total: stats.bytes_uploaded_total.load(Ordering::Relaxed),
        files_uploaded_total: stats.files_uploaded_total.load(Ordering::Relaxed),
        bytes_uploaded_per_checkpoint: Percentiles::of(&stats.bytes_uploaded_samples),
        mode: args.mode,
        persisted_inflight_bytes: LastMax {
            last: stats.inflight_last.load(Ordering::Relaxed),
            max: stats.inflight_max.load(Ordering::Relaxed),
        },
        persisted_inflight_batches_per_channel_max: stats
            .inflight_batches_per_channel_max
            .load(Ordering::Relaxed),
        checkpoints_switched_to_unaligned: stats.switched_to_unaligned.load(Ordering::Relaxed),
        restored_inflight_batches: stats.restored_inflight_batches.load(Ordering::Relaxed),
        recovery_ms: Percentiles::of(&stats.recoveries_ms),
        restored_bytes: stats.restored_bytes_last.load(Ordering::Relaxed),
        restore_ms: stats.restore_us_last.load(Ordering::Relaxed) as f64 / 1e3,
        physical_files_live: stats.physical_files_live.load(Ordering::Relaxed),
        space_amplification: f64::from_bits(stats.space_amplification_last.load(Ordering::Relaxed)),
        space_amplification_max: f64::from_bits(
            stats.space_amplification_max.load(Ordering::Relaxed),
        ),
        objects_created: storage_counter(|c| &c.objects_created),
        objects_deleted: storage_counter(|c| &c.objects_deleted),
        bytes_uploaded: storage_counter(|c| &c.bytes_uploaded),
        savepoints_completed: stats.savepoints.load(Ordering::Relaxed),
        savepoint_ms: stats.savepoint_us_last.load(Ordering::Relaxed) as f64 / 1e3,
        savepoint,
    })
}
