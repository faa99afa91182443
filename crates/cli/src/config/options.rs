//! A job's settings as one flat set of options. Each has a flag of
//! `tidemark run` (its field name, in kebab case) and one or more keys of a
//! configuration file (see `keys.rs`); [`Options::job_config`] turns them
//! into the embedding API's [`JobConfig`].

use super::values;
use super::Origins;
use crate::tls::TlsFlags;
use clap::{ArgAction, Args, FromArgMatches, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;
use tidemark_actors::tls::TlsFiles;
use tidemark_core::checkpoint::lease::LeaseConfig;
use tidemark_core::checkpoint::merging::UploadLimits;
use tidemark_core::checkpoint::{CheckpointConfig, Restore, RestoreMode};
use tidemark_core::cluster::election::ElectionTiming;
use tidemark_core::cluster::restart::RestartStrategy;
use tidemark_core::job::JobConfig;
use tidemark_core::model::event::Alignment;
use tidemark_core::model::ids::CheckpointId;
use tidemark_core::StateBackend;

/// `--mode`: whether barriers wait for each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Barriers wait on every input.
    Aligned,
    /// Barriers overtake in-flight batches, which become channel state.
    Unaligned,
}

/// `--state`: where keyed state lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StateKind {
    /// Typed hash tables in memory (Flink's `hashmap`).
    #[value(alias = "hashmap")]
    Heap,
    /// One RocksDB database per subtask, under --state-dir.
    Rocksdb,
}

/// `high-availability.type`: which service elects the job's leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HaType {
    /// No election: this driver runs the job.
    None,
    /// A Kubernetes Lease (`--leader-lease`).
    Kubernetes,
    /// ZooKeeper (`--zookeeper-quorum`).
    ZooKeeper,
}

impl HaType {
    /// The option that names the service's election.
    fn option(self) -> Option<&'static str> {
        match self {
            HaType::None => None,
            HaType::Kubernetes => Some("leader_lease"),
            HaType::ZooKeeper => Some("zookeeper_quorum"),
        }
    }
}

impl std::fmt::Display for HaType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HaType::None => "none",
            HaType::Kubernetes => "kubernetes",
            HaType::ZooKeeper => "zookeeper",
        })
    }
}

/// A checkpoint interval; `None` is `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointInterval(pub Option<Duration>);

/// `--restore`: `latest`, a checkpoint directory `[PATH/]chk-N`, or a
/// savepoint directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreArg {
    /// The newest completed checkpoint of the job.
    Latest,
    /// A checkpoint of the job; `parent`, if given, must be the job's
    /// directory.
    Checkpoint {
        /// The directory the path names `chk-N` in, if any.
        parent: Option<PathBuf>,
        /// N.
        id: CheckpointId,
    },
    /// A self-contained savepoint directory, a path or URL.
    Savepoint(String),
}

/// A setting refused after parsing, by its option name (`Origins::name`
/// says it as a flag or as a key of the file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The option's field name.
    pub option: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

/// The options a job's settings are made of; the defaults are the flags'.
/// Boolean flags take an optional value (`--incremental=false`), so that
/// the command line can turn off what a configuration file turned on.
#[derive(Clone, Debug, Args)]
pub struct Options {
    /// Subtasks per operator [default: the number of cores].
    #[arg(long, value_parser = values::parallelism)]
    pub parallelism: Option<u32>,
    /// Total records per second over all sources [default: unlimited].
    #[arg(long, value_parser = values::rate)]
    pub rate: Option<f64>,
    /// Checkpoint interval (`200ms`, `2 s`), or `off`.
    #[arg(long, default_value = "1s", value_parser = values::flag_interval)]
    pub checkpoint_interval: CheckpointInterval,
    /// Checkpoint storage: a path, `file://` path, `memory://` or
    /// `s3://bucket/prefix` (settings from the AWS_* environment variables).
    #[arg(long, default_value = CheckpointConfig::DEFAULT_STORAGE_URL)]
    pub checkpoint_dir: String,
    /// A checkpoint not complete this long after its trigger is aborted.
    #[arg(long, default_value = "10min", value_parser = values::flag_duration)]
    pub timeout: Duration,
    /// Least time between the end of a checkpoint and the next trigger.
    #[arg(long, default_value = "0s", value_parser = values::flag_duration)]
    pub min_pause: Duration,
    /// Checkpoints in flight at once.
    #[arg(long, default_value = "1", value_parser = values::positive)]
    pub max_concurrent: u32,
    /// Consecutive failed checkpoints tolerated before the job fails.
    #[arg(long, default_value = "0", value_parser = values::count)]
    pub tolerable_failures: u32,
    /// Completed checkpoints kept.
    #[arg(long, default_value = "1", value_parser = values::positive)]
    pub retain: u32,
    /// Checkpoints the statistics keep (the REST API's history).
    #[arg(long, default_value = "100", value_parser = values::positive)]
    pub checkpoint_history: u32,
    /// Aligned checkpoints wait for the barrier on every input; unaligned
    /// ones overtake the in-flight batches and persist them.
    #[arg(long, value_enum, default_value_t = Mode::Aligned)]
    pub mode: Mode,
    /// Aligned checkpoints whose alignment at a subtask lasts this long
    /// switch to unaligned there (`0s`: at the first barrier).
    #[arg(long, value_parser = values::flag_duration)]
    pub aligned_timeout: Option<Duration>,
    /// RocksDB state uploads only the files its newest completed checkpoint
    /// does not already hold.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = values::boolean)]
    pub incremental: bool,
    /// State objects smaller than this travel inside the acknowledgement
    /// and `_metadata` instead of becoming objects (`0`: none do; at most
    /// 1MiB).
    #[arg(long, default_value = "20KiB", value_parser = values::inline_threshold)]
    pub inline_threshold: u64,
    /// A subtask writes the state objects of one checkpoint as segments of
    /// few physical files under `merged/`.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = values::boolean)]
    pub file_merging: bool,
    /// Size at which a merged physical file is rolled over [default: 32MiB].
    #[arg(long, value_parser = values::size)]
    pub max_merged_file_size: Option<u64>,
    /// Merged files wasting more than this (total / live bytes) are
    /// rewritten by the next checkpoint [default: 1.5].
    #[arg(long, value_parser = values::amplification)]
    pub max_space_amplification: Option<f64>,
    /// Physical files larger than this are written as multipart uploads,
    /// streamed part by part instead of in one put.
    #[arg(long, default_value = "16MiB", value_parser = values::size)]
    pub multipart_threshold: u64,
    /// Size of a multipart upload's parts (S3 needs at least 5MiB).
    #[arg(long, default_value = "8MiB", value_parser = values::part_size)]
    pub upload_part_size: usize,
    /// Where keyed state lives.
    #[arg(long, value_enum, default_value_t = StateKind::Heap)]
    pub state: StateKind,
    /// Local working directories of the RocksDB backend, one per subtask
    /// instance, removed when it ends [default: $TMPDIR/tidemark-state].
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Values the RocksDB backend keeps decoded in front of each database;
    /// a record whose key is cached costs no RocksDB read, and its writes
    /// reach RocksDB once per eviction or checkpoint. [default: 1048576]
    #[arg(long, value_parser = values::cache_entries)]
    pub state_cache_entries: Option<usize>,
    /// Start from `latest` (the newest completed checkpoint in the checkpoint
    /// directory), from a given `chk-N` of it, or from a savepoint directory
    /// (a path or URL holding `_metadata`).
    #[arg(long, value_parser = values::restore)]
    pub restore: Option<RestoreArg>,
    /// Whether the job takes ownership of the checkpoint given to --restore
    /// (`claim`: it may delete its files once subsumed) or not (`no-claim`:
    /// it never deletes them, and its first checkpoint is a full one).
    /// Savepoints are never claimed; `latest` always continues the job's own.
    #[arg(long, default_value = "no-claim", value_parser = values::restore_mode)]
    pub restore_mode: RestoreMode,
    /// Restore even if the checkpoint holds state of operators (by uid) the
    /// job lacks, which is dropped, or lacks operators of the job, which
    /// start empty.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = values::boolean)]
    pub allow_non_restored_state: bool,
    /// How long the run's lease on its job directory lasts without renewal
    /// (1 s to 1 d): a second run is refused while it holds; a run that died
    /// on another host blocks the directory this long.
    #[arg(long, default_value = "30s", value_parser = values::flag_lease_ttl)]
    pub lease_ttl: Duration,
    /// A file holding the token every request to the REST API (--http)
    /// must present, as `Authorization: Bearer TOKEN` or a Basic password;
    /// needed to serve beyond loopback.
    #[arg(long, value_name = "FILE")]
    pub http_token_file: Option<std::path::PathBuf>,
    /// Mutual TLS with worker processes (`security.ssl.internal.*`).
    #[command(flatten)]
    pub tls: TlsFlags,
    /// `security.ssl.internal.enabled`: TLS off even with its files given
    /// (as Flink reads it), or required to have them; only a configuration
    /// file sets it, the flags alone turn TLS on.
    #[arg(skip)]
    pub tls_enabled: Option<bool>,
    /// TLS of the REST API (--http): its certificate chain (PEM), with
    /// --http-tls-key; needed beyond loopback, unless --insecure.
    #[arg(long, value_name = "FILE")]
    pub http_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --http-tls-cert.
    #[arg(long, value_name = "FILE")]
    pub http_tls_key: Option<PathBuf>,
    /// `security.ssl.rest.enabled`, read as `security.ssl.internal.enabled`
    /// is; only a configuration file sets it.
    #[arg(skip)]
    pub http_tls_enabled: Option<bool>,
    /// Take the job directory's lease even from a run that looks alive (on
    /// another host and not yet expired): only when that run is known dead.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = values::boolean)]
    pub take_over_lease: bool,
    /// Run only while this driver leads the job's drivers through the
    /// Kubernetes Lease of this name: a standby waits, and takes over (the
    /// job directory too) once the leader is gone. Every leader restores
    /// the job's latest checkpoint (`--restore latest` is implied).
    #[arg(long, value_name = "NAME")]
    pub leader_lease: Option<String>,
    /// The Lease's namespace [default: the pod's own, elsewhere the
    /// kubeconfig's]; without --leader-lease it is not used.
    #[arg(long, value_name = "NAMESPACE")]
    pub leader_namespace: Option<String>,
    /// This driver's name in the election, unique among the drivers; a
    /// driver that finds its own name on the Lease leads at once, so give
    /// a name only one process has at a time (a pod's name) [default: host,
    /// process and a token of this run's].
    #[arg(long, value_name = "NAME")]
    pub leader_identity: Option<String>,
    /// How long the Lease lasts unrenewed before a standby takes over
    /// (whole seconds).
    #[arg(long, default_value = "15s", value_parser = values::flag_duration)]
    pub leader_lease_duration: Duration,
    /// How long a leader keeps trying to renew before it cancels the job
    /// and stops leading; under the lease duration.
    #[arg(long, default_value = "10s", value_parser = values::flag_duration)]
    pub leader_renew_deadline: Duration,
    /// Between two attempts to take or renew the Lease.
    #[arg(long, default_value = "2s", value_parser = values::flag_duration)]
    pub leader_retry_period: Duration,
    /// Run only while this driver leads the job's drivers through the
    /// ZooKeeper ensemble at these `host:port` pairs, as Flink's
    /// `high-availability.type: zookeeper`: a standby waits, and takes
    /// over (the job directory too) once the leader's session ends. Every
    /// leader restores the job's latest checkpoint, and refuses to run if
    /// it lacks the one ZooKeeper names.
    #[arg(long, value_name = "HOST:PORT,...")]
    pub zookeeper_quorum: Option<String>,
    /// The root of Tidemark's nodes in ZooKeeper.
    #[arg(long, default_value = "/tidemark", value_name = "PATH")]
    pub zookeeper_root: String,
    /// This job's nodes under the ZooKeeper root: the drivers of one job
    /// share it, and no other job's do.
    #[arg(long, default_value = "default", value_name = "ID")]
    pub cluster_id: String,
    /// How long a leader's ZooKeeper session outlives its silence: a
    /// leader paused or cut off this long is replaced (the server may
    /// bound it).
    #[arg(long, default_value = "60s", value_parser = values::flag_duration)]
    pub zookeeper_session_timeout: Duration,
    /// How long connecting to ZooKeeper may take; only a configuration
    /// file sets it.
    #[arg(skip = Duration::from_secs(15))]
    pub zookeeper_connection_timeout: Duration,
    /// `high-availability.type`; only a configuration file sets it.
    #[arg(skip)]
    pub ha_type: Option<HaType>,
    /// Where savepoints go, each into `savepoint-<job>-<id>/`: a path,
    /// `file://` path, `memory://NAME` or `s3://bucket/prefix`.
    #[arg(long)]
    pub savepoint_dir: Option<String>,
    /// Restarts allowed after failures [default: 10 + --inject-failures].
    #[arg(long, value_parser = values::count)]
    pub max_restarts: Option<u32>,
    /// Delay before a restart (the first one, with --restart-backoff).
    #[arg(long, default_value = "10ms", value_parser = values::flag_duration)]
    pub restart_delay: Duration,
    /// Double the restart delay after every restart, to at most 1 s a
    /// restart (`restart-strategy.exponential-delay.max-backoff` in
    /// --config sets another cap); the report's restart_wait_ms sums the
    /// waits.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = values::boolean)]
    pub restart_backoff: bool,
    /// The longest restart delay with --restart-backoff; only a
    /// configuration file sets it.
    #[arg(skip = Duration::from_secs(1))]
    pub max_restart_delay: Duration,
    /// Growth of the restart delay per restart with --restart-backoff;
    /// only a configuration file sets it.
    #[arg(skip = 2.0)]
    pub restart_backoff_multiplier: f64,
}

/// The flags' defaults, read from the flags' own declarations so that they
/// are written down once.
impl Default for Options {
    fn default() -> Self {
        let matches = Options::augment_args(clap::Command::new("defaults"))
            .try_get_matches_from(["defaults"])
            .expect("every option has a default");
        Options::from_arg_matches(&matches).expect("the defaults parse")
    }
}

impl Options {
    /// The embedding API's settings these options make; checkpointing is
    /// on when there is an interval or a savepoint directory, since
    /// savepoints need the coordinator too. Parallelism defaults to the
    /// host's cores, which the embedding API leaves to its caller.
    pub fn job_config(&self) -> JobConfig {
        let cores = || std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let mut config = JobConfig::default()
            .parallelism(self.parallelism.unwrap_or_else(cores))
            .restart(self.restart())
            .state_backend(self.state_backend());
        if let Some(rate) = self.rate {
            config = config.source_rate(rate);
        }
        if self.checkpointing() {
            config = config.checkpointing(self.checkpoint_settings());
        }
        config
    }

    /// Savepoints need the coordinator even without periodic checkpoints.
    fn checkpointing(&self) -> bool {
        self.checkpoint_interval.0.is_some() || self.savepoint_dir.is_some()
    }

    fn checkpoint_settings(&self) -> CheckpointConfig {
        let mut settings = CheckpointConfig::new(&self.checkpoint_dir)
            .interval(self.checkpoint_interval.0)
            .timeout(self.timeout)
            .min_pause(self.min_pause)
            .max_concurrent(self.max_concurrent as usize)
            .tolerable_failures(self.tolerable_failures)
            .retain(self.retain as usize)
            .history(self.checkpoint_history as usize)
            .alignment(self.alignment())
            .incremental(self.incremental)
            .inline_threshold(self.inline_threshold)
            .file_merging(self.file_merging)
            .upload(UploadLimits {
                multipart_threshold: self.multipart_threshold,
                part_size: self.upload_part_size,
                ..UploadLimits::default()
            })
            .restore(match &self.restore {
                // Whichever driver leads continues the job where the last
                // leader's checkpoints left it.
                None if self.elects() => Restore::Latest,
                None => Restore::Fresh,
                Some(RestoreArg::Latest) => Restore::Latest,
                Some(RestoreArg::Checkpoint { id, .. }) => Restore::Checkpoint(*id),
                Some(RestoreArg::Savepoint(dir)) => Restore::Savepoint(dir.clone()),
            })
            .restore_mode(self.restore_mode)
            .allow_non_restored_state(self.allow_non_restored_state)
            .lease(LeaseConfig {
                ttl: self.lease_ttl,
                // An elected leader takes the directory over: the election
                // says the previous leader stopped, and the epoch fences it
                // if it did not.
                take_over: self.take_over_lease || self.elects(),
            });
        if let Some(size) = self.max_merged_file_size.filter(|_| self.file_merging) {
            settings = settings.max_merged_file_size(size);
        }
        if let Some(amplification) = self.max_space_amplification {
            settings = settings.max_space_amplification(amplification);
        }
        if let Some(dir) = &self.savepoint_dir {
            settings = settings.savepoint_dir(dir);
        }
        settings
    }

    /// The election's service: the one flag or key that names it, the
    /// timings it runs by, and a build that has its client.
    fn validate_election(&self, origins: &Origins) -> Result<(), Refusal> {
        let refuse = |option, problem: String| Err(Refusal { option, problem });
        let Some(elected_by) = self.election_option() else {
            let needs = match self.ha_type {
                Some(HaType::Kubernetes) => {
                    origins.suggest("--leader-lease", "tidemark.leader-election.lease")
                }
                Some(HaType::ZooKeeper) => {
                    origins.suggest("--zookeeper-quorum", "high-availability.zookeeper.quorum")
                }
                Some(HaType::None) | None => String::new(),
            };
            if !needs.is_empty() {
                return refuse("ha_type", format!("needs {needs}"));
            }
            if self.leader_identity.is_some() {
                return refuse(
                    "leader_identity",
                    format!(
                        "applies to leader election; set {} or {}",
                        origins.suggest("--leader-lease", "tidemark.leader-election.lease"),
                        origins.suggest("--zookeeper-quorum", "high-availability.zookeeper.quorum")
                    ),
                );
            }
            return Ok(());
        };
        if self.leader_lease.is_some() && self.zookeeper_quorum.is_some() {
            return refuse(
                "zookeeper_quorum",
                format!(
                    "elects through ZooKeeper, and {} over a Kubernetes Lease: choose one",
                    origins.name("leader_lease")
                ),
            );
        }
        if let Some(ha) = self.ha_type.filter(|t| t.option() != Some(elected_by)) {
            return refuse(
                "ha_type",
                format!("is {ha}, but {} is set", origins.name(elected_by)),
            );
        }
        if matches!(
            self.restore,
            Some(RestoreArg::Checkpoint { .. } | RestoreArg::Savepoint(_))
        ) {
            return refuse(
                "restore",
                format!(
                    "with {} every leader restores the job's latest checkpoint, so a savepoint or chk-N cannot be restored: restore it once without leader election, and elect leaders from then on",
                    origins.name(elected_by)
                ),
            );
        }
        if !self.checkpointing() {
            return refuse(
                elected_by,
                format!(
                    "needs checkpointing, which a new leader restores; {} is off",
                    origins.name("checkpoint_interval")
                ),
            );
        }
        if elected_by != "leader_lease" {
            return Ok(());
        }
        use tidemark_core::cluster::election::TimingError;
        match self.election_timing().validate() {
            Err(e @ TimingError::WholeSeconds(_)) => refuse("leader_lease_duration", e.to_string()),
            Err(e @ TimingError::DeadlineNotBelowDuration { .. }) => {
                refuse("leader_renew_deadline", e.to_string())
            }
            Err(e @ (TimingError::RetryNotBelowDeadline { .. } | TimingError::ZeroRetry)) => {
                refuse("leader_retry_period", e.to_string())
            }
            Ok(()) => Ok(()),
        }
    }

    /// The option that elects this driver's leader, if one does.
    fn election_option(&self) -> Option<&'static str> {
        match (&self.leader_lease, &self.zookeeper_quorum) {
            (Some(_), _) => Some("leader_lease"),
            (None, Some(_)) => Some("zookeeper_quorum"),
            (None, None) => None,
        }
    }

    /// Whether drivers are elected: every leader then restores the job's
    /// latest checkpoint and takes its directory over.
    pub fn elects(&self) -> bool {
        self.election_option().is_some()
    }

    /// The leader election's timings.
    pub fn election_timing(&self) -> ElectionTiming {
        ElectionTiming {
            lease_duration: self.leader_lease_duration,
            renew_deadline: self.leader_renew_deadline,
            retry_period: self.leader_retry_period,
        }
    }

    fn alignment(&self) -> Alignment {
        match (self.mode, self.aligned_timeout) {
            (Mode::Unaligned, _) => Alignment::Unaligned,
            (Mode::Aligned, None) => Alignment::Aligned,
            (Mode::Aligned, Some(timeout)) => Alignment::AlignedWithTimeout(timeout),
        }
    }

    /// No restarts is one strategy, whether it is said as zero restarts or
    /// as Flink's `restart-strategy.type: none`.
    fn restart(&self) -> RestartStrategy {
        let max_attempts = self
            .max_restarts
            .unwrap_or(RestartStrategy::DEFAULT_MAX_ATTEMPTS);
        match (max_attempts, self.restart_backoff) {
            (0, _) => RestartStrategy::None,
            (_, false) => RestartStrategy::FixedDelay {
                delay: self.restart_delay,
                max_attempts,
            },
            (_, true) => RestartStrategy::ExponentialBackoff {
                initial: self.restart_delay,
                max: self.max_restart_delay,
                multiplier: self.restart_backoff_multiplier,
                max_attempts,
            },
        }
    }

    fn state_backend(&self) -> StateBackend {
        match self.state {
            StateKind::Heap => StateBackend::Heap,
            #[cfg(feature = "rocksdb")]
            StateKind::Rocksdb => {
                tidemark_rocksdb::RocksDb::backend(self.state_dir.clone(), self.state_cache_entries)
            }
            #[cfg(not(feature = "rocksdb"))]
            StateKind::Rocksdb => unreachable!("validate refuses RocksDB without the feature"),
        }
    }

    /// Refuses options that cannot work together or would be ignored;
    /// `origins` names the other options in the explanation as the user
    /// gave them.
    pub fn validate(&self, origins: &Origins) -> Result<(), Refusal> {
        let refuse = |option, problem: String| Err(Refusal { option, problem });
        let rocksdb = || {
            format!(
                "applies to RocksDB state; set {}",
                origins.suggest("--state rocksdb", "state.backend.type: rocksdb")
            )
        };
        if cfg!(not(feature = "rocksdb")) && self.state == StateKind::Rocksdb {
            return refuse(
                "state",
                "this build of Tidemark has no RocksDB; build it with the `rocksdb` feature".into(),
            );
        }
        if self.state != StateKind::Rocksdb {
            if self.incremental {
                return refuse("incremental", rocksdb());
            }
            if self.state_cache_entries.is_some() {
                return refuse("state_cache_entries", rocksdb());
            }
            if self.state_dir.is_some() {
                return refuse("state_dir", rocksdb());
            }
        }
        if self.mode == Mode::Unaligned && self.aligned_timeout.is_some() {
            return refuse(
                "aligned_timeout",
                format!(
                    "applies to aligned checkpoints; with {} every checkpoint is unaligned from the start",
                    origins.name("mode")
                ),
            );
        }
        if !self.file_merging {
            let merging = || {
                format!(
                    "applies to file merging; set {}",
                    origins.suggest(
                        "--file-merging",
                        "execution.checkpointing.file-merging.enabled: true"
                    )
                )
            };
            if self.max_merged_file_size.is_some() {
                return refuse("max_merged_file_size", merging());
            }
            if self.max_space_amplification.is_some() {
                return refuse("max_space_amplification", merging());
            }
        }
        if self.allow_non_restored_state && self.restore.is_none() && !self.elects() {
            return refuse(
                "allow_non_restored_state",
                format!(
                    "applies to a restore; set {}",
                    origins.suggest("--restore", "execution.state-recovery.path")
                ),
            );
        }
        if self.restore.is_some() && !self.checkpointing() {
            return refuse(
                "restore",
                format!(
                    "needs checkpointing; {} is off",
                    origins.name("checkpoint_interval")
                ),
            );
        }
        self.validate_election(origins)?;
        if let Some(Err(e)) = self
            .checkpointing()
            .then(|| self.checkpoint_settings().validate())
        {
            return refuse("max_concurrent", e.to_string());
        }
        self.tls_files(origins)?;
        self.http_tls_files(origins).map(drop)
    }

    /// The TLS files with worker processes, if TLS is on: all three files,
    /// which `security.ssl.internal.enabled: true` requires.
    pub fn tls_files(&self, origins: &Origins) -> Result<Option<TlsFiles>, Refusal> {
        let all = origins.suggest(
            "--tls-cert, --tls-key and --tls-ca",
            "security.ssl.internal.cert-file, key-file and ca-file",
        );
        let flags = [
            ("tls_cert", self.tls.tls_cert.is_some()),
            ("tls_key", self.tls.tls_key.is_some()),
            ("tls_ca", self.tls.tls_ca.is_some()),
        ];
        let switch = Switch {
            option: "tls_enabled",
            enabled: self.tls_enabled,
            all,
            flagged: flagged(&flags, origins),
        };
        switch.files(self.tls.files(), origins)
    }

    /// The REST API's certificate and key files, if its TLS is on.
    pub fn http_tls_files(&self, origins: &Origins) -> Result<Option<(PathBuf, PathBuf)>, Refusal> {
        let given = match (&self.http_tls_cert, &self.http_tls_key) {
            (Some(cert), Some(key)) => Ok(Some((cert.clone(), key.clone()))),
            (None, None) => Ok(None),
            (None, Some(_)) => Err("http_tls_cert"),
            (Some(_), None) => Err("http_tls_key"),
        };
        let all = origins.suggest(
            "--http-tls-cert and --http-tls-key",
            "security.ssl.rest.cert-file and key-file",
        );
        let flags = [
            ("http_tls_cert", self.http_tls_cert.is_some()),
            ("http_tls_key", self.http_tls_key.is_some()),
        ];
        let switch = Switch {
            option: "http_tls_enabled",
            enabled: self.http_tls_enabled,
            all,
            flagged: flagged(&flags, origins),
        };
        switch.files(given, origins)
    }
}

/// The first of `files` (option, given) given on the command line rather
/// than by the configuration file.
fn flagged(files: &[(&'static str, bool)], origins: &Origins) -> Option<&'static str> {
    files
        .iter()
        .find(|(option, given)| *given && origins.located(option).is_none())
        .map(|(option, _)| *option)
}

/// A TLS switch (`security.ssl.*.enabled`) and the files it governs.
struct Switch {
    /// The switch's option.
    option: &'static str,
    enabled: Option<bool>,
    /// All the files, as the user would name them.
    all: String,
    /// A file given by a flag, if any.
    flagged: Option<&'static str>,
}

impl Switch {
    /// The files if TLS is on: `false` turns it off with files of the
    /// configuration file given, as Flink reads it, but not files given by
    /// flags, which are refused; `true` requires all of them, and so does
    /// giving some.
    fn files<T>(
        &self,
        given: Result<Option<T>, &'static str>,
        origins: &Origins,
    ) -> Result<Option<T>, Refusal> {
        match (self.enabled, given) {
            (Some(false), _) => match self.flagged {
                Some(flag) => Err(Refusal {
                    option: flag,
                    problem: format!("TLS is off ({}: false)", origins.name(self.option)),
                }),
                None => Ok(None),
            },
            (_, Err(missing)) => Err(Refusal {
                option: missing,
                problem: format!("is missing: TLS needs all of {}", self.all),
            }),
            (Some(true), Ok(None)) => Err(Refusal {
                option: self.option,
                problem: format!("needs {}", self.all),
            }),
            (_, Ok(files)) => Ok(files),
        }
    }
}
