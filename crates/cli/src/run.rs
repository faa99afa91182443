//! `tidemark run TOPOLOGY`: runs an example topology under the job settings
//! of its flags and `--config` file, with optional fault injection and a
//! timed savepoint, and reports on it.

use super::leader::Leadership;
use super::report::{Finished, RunReport};
use super::{Cli, CliError, Command};
use crate::config::{ConfigFile, Options, Origins, RestoreArg};
use crate::roots::Roots;
use crate::sinks::{run_name, Target};
use crate::timed::{RescaleAfter, Timed};
use crate::tls::TlsFlags;
use crate::topologies::enrich::Enrich;
use crate::topologies::join::Join;
use crate::topologies::rules::Rules;
use crate::topologies::timers::Timers;
use crate::topologies::windows::{Events, Windows};
use crate::topologies::wordcount::{Emit, Input, Keys, Wordcount};
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tidemark_actors::election::ElectionError;
use tidemark_actors::http::HttpToken;
use tidemark_actors::runtime::{job_id, JobError, Runtime};
use tidemark_actors::tls::{MutualTls, RestTls};
use tidemark_actors::{Distributed, WorkerSet};
use tidemark_core::cluster::fault::{Fault, FaultPoint, KillSchedule, SlowSubtask};
use tidemark_core::cluster::restart::RestartStrategy;
use tidemark_core::dataflow::async_io::{AsyncRetry, AsyncWait};
use tidemark_core::job::JobConfig;
use tidemark_core::model::ids::{CheckpointId, OperatorId, SubtaskId, SubtaskIndex};
use tidemark_core::time::WindowAssigner;
use tidemark_storage::{check_savepoint_dir, CheckpointStorage, StorageError, METADATA};

/// The example topologies `run` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// Count records per key.
    Wordcount,
    /// Count records per key and event-time window.
    Windows,
    /// Join two sources on key and event time within an interval.
    Join,
    /// Count records per key, and alert when a count reaches a rule
    /// broadcast to every counting subtask.
    Rules,
    /// Enrich records with an HTTP service's answers, many requests in
    /// flight (async I/O).
    Enrich,
    /// Set an event-time timer per record, a delay after its timestamp,
    /// and emit each timer that fires.
    Timers,
}

impl Topology {
    /// The job's name, which also names its checkpoint directory.
    pub fn job_name(self) -> &'static str {
        match self {
            Topology::Wordcount => crate::topologies::wordcount::JOB_NAME,
            Topology::Windows => crate::topologies::windows::JOB_NAME,
            Topology::Join => crate::topologies::join::JOB_NAME,
            Topology::Rules => crate::topologies::rules::JOB_NAME,
            Topology::Enrich => crate::topologies::enrich::JOB_NAME,
            Topology::Timers => crate::topologies::timers::JOB_NAME,
        }
    }

    /// Its keyed operator (counting or joining), with the sink chained to
    /// it: the one `--slow-subtask` slows. The sources come before it.
    pub fn keyed_operator(self) -> OperatorId {
        match self {
            Topology::Wordcount | Topology::Windows | Topology::Enrich | Topology::Timers => {
                OperatorId(1)
            }
            // After the sources, and the rules' rebalance.
            Topology::Join | Topology::Rules => OperatorId(2),
        }
    }

    /// Records all its sources read for `--records` records.
    fn records_in(self, records: u64) -> u64 {
        match self {
            Topology::Wordcount
            | Topology::Windows
            | Topology::Rules
            | Topology::Enrich
            | Topology::Timers => records,
            Topology::Join => records.saturating_mul(2),
        }
    }
}

/// The order of `enrich`'s results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Order {
    /// As the input's (Flink's `orderedWait`).
    Ordered,
    /// As their requests complete (Flink's `unorderedWait`).
    Unordered,
}

/// `tidemark run`'s arguments: the topology's own, the job settings, and
/// what this run does besides (faults, a timed savepoint, the report).
#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    /// The topology to run.
    #[arg(value_enum)]
    pub topology: Topology,
    /// Records to generate over all subtasks of each source.
    #[arg(long, default_value_t = 10_000_000)]
    pub records: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: u64,
    /// Seed of the record generator.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// What the counting operator emits (wordcount).
    #[arg(long, value_enum, default_value_t = Emit::Final)]
    pub emit: Emit,
    /// How long a key's count lives after the key was last seen
    /// (wordcount, processing time, e.g. `30s`): a key not seen for that
    /// long counts from 1 again. Counts live for ever without it.
    #[arg(long, value_name = "DURATION", value_parser = crate::config::values::state_ttl)]
    pub state_ttl: Option<Duration>,
    /// Rules broadcast over the run (rules), one every `records / rules`
    /// records.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub rules: u64,
    /// The HTTP service that enriches records (enrich), `http://HOST:PORT`,
    /// asked `GET /enrich/KEY`; by default one the process starts.
    #[arg(long, value_name = "URL")]
    pub service: Option<String>,
    /// The order of enriched records (enrich): as the input's, or as their
    /// requests complete (never across a watermark).
    #[arg(long, value_enum, default_value_t = Order::Ordered)]
    pub order: Order,
    /// Requests in flight per subtask at most (enrich).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub in_flight: u64,
    /// How long a record's request may take with its retries (enrich);
    /// then the job fails.
    #[arg(long, default_value = "10s", value_parser = crate::config::values::flag_duration)]
    pub request_timeout: Duration,
    /// Retries of a failed request, 100 ms apart (enrich).
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Records per millisecond of event time (windows, join, timers).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub events_per_ms: u64,
    /// The most a record's timestamp lags behind its place in the input
    /// (windows, join, timers); the sources' watermarks trail by as much.
    #[arg(long, default_value = "100ms", value_parser = crate::config::values::flag_duration)]
    pub max_disorder: Duration,
    /// The windows (windows): tumbling:SIZE, sliding:SIZE/SLIDE or
    /// session:GAP.
    #[arg(long, default_value = "tumbling:1s", value_parser = crate::topologies::windows::parse_window)]
    pub window: WindowAssigner,
    /// How long after a record's timestamp its timer fires (timers).
    #[arg(long, default_value = "1s", value_parser = crate::config::values::flag_duration)]
    pub timer_delay: Duration,
    /// The most the timestamps of two joined records differ by (join).
    #[arg(long, default_value = "20ms", value_parser = crate::config::values::flag_duration)]
    pub interval: Duration,
    /// Directory for the results as CSV files: committed files are those
    /// directly in it whose names do not start with `.` or `_` (`--sink DIR`).
    #[arg(long, conflicts_with = "sink", value_parser = parse_output)]
    pub output: Option<PathBuf>,
    /// Where the results go: `discard`; exactly once, a directory of files
    /// (a path, `file://DIR` or `s3://BUCKET/PREFIX`, with
    /// `?format=csv|jsonl|parquet[&header=true][&bucket=dt=%Y-%m-%d/hour=%H]
    /// [&roll-size=BYTES][&roll-interval=1m][&part-size=BYTES]`); or a
    /// PostgreSQL table,
    /// `postgres://USER@HOST:PORT/DB?table=NAME[&mode=upsert|append]
    /// [&transaction-prefix=P]` (two-phase commit: the server needs
    /// `max_prepared_transactions` > 0); or a Kafka topic,
    /// `kafka://HOST:PORT/TOPIC[?delivery=at-least-once|exactly-once]`
    /// (rows as JSON values keyed by their key).
    #[arg(long, value_name = "URL", value_parser = parse_sink)]
    pub sink: Option<String>,
    /// Where the records come from (join: its left side): `gen`, the
    /// generator; files, `DIR?format=text|jsonl|csv|parquet
    /// [&monitor-interval=1s]` with DIR a path, `file://` or `s3://` URL;
    /// or a Kafka topic, `kafka://HOST:PORT/TOPIC[?format=json|text]
    /// [&start=earliest|latest][&bounded=latest]`. Text lines are split
    /// into words; records are counted by their `key` field, and windows,
    /// join and timers take event time from `ts` (Kafka: the record's
    /// timestamp if absent).
    #[arg(long, default_value = "gen", value_name = "URL", value_parser = parse_source)]
    pub source: Input,
    /// Where the join's right side's records come from, as `--source`.
    #[arg(long, default_value = "gen", value_name = "URL", value_parser = parse_source)]
    pub right_source: Input,
    /// A YAML file of job settings, with Flink's keys (such as
    /// `execution.checkpointing.interval: 1 s`); the flags below win over
    /// it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Make this subtask of the counting or joining operator slow (with
    /// --slow-ns), so
    /// that its inputs fill and its upstreams are backpressured.
    #[arg(long, requires = "slow_ns")]
    pub slow_subtask: Option<u32>,
    /// Nanoseconds the slow subtask spends per record, up to a second.
    #[arg(long, requires = "slow_subtask", value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub slow_ns: Option<u64>,
    /// Take one savepoint this long after the start and go on.
    #[arg(long, conflicts_with = "stop_with_savepoint_after", value_parser = crate::config::values::flag_duration)]
    pub savepoint_after: Option<Duration>,
    /// Take a savepoint this long after the start, commit the sinks and
    /// stop: the report says where the savepoint is.
    #[arg(long, value_parser = crate::config::values::flag_duration)]
    pub stop_with_savepoint_after: Option<Duration>,
    /// Rescale the job at a time after its start: `6s=4` runs every
    /// operator at parallelism 4 from 6 s on (repeat for more); the report
    /// lists each rescale and how long the job paused.
    #[arg(long, value_name = "DURATION=N", value_parser = crate::timed::parse_rescale_after)]
    pub rescale_after: Vec<RescaleAfter>,
    /// Kill a random subtask this many times at random moments (seeded by
    /// `--seed`); the job restores and goes on. At most 1000. Across
    /// workers, the whole worker hosting the subtask dies.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(..=1000))]
    pub inject_failures: u32,
    /// A targeted fault, `POINT:CHECKPOINT:OPERATOR:SUBTASK` with POINT one of
    /// sync-snapshot, async-write, after-ack, sink-commit, or
    /// stall-after-write (the upload never acknowledges until aborted).
    #[arg(long, value_parser = parse_fault)]
    pub inject_fault: Vec<Fault>,
    /// Print a JSON report as the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// Serve the job's REST API (Flink's), Prometheus metrics at /metrics
    /// and a page at / on `[ADDR:]PORT`; a port alone binds to loopback.
    #[arg(long, value_name = "[ADDR:]PORT", value_parser = parse_http)]
    pub http: Option<std::net::SocketAddr>,
    /// Serve the REST API beyond loopback over plain HTTP, its token in
    /// the clear: only where nothing but trusted hosts can reach it.
    #[arg(long)]
    pub insecure: bool,
    /// Spreads the subtasks over N workers in this process, every channel
    /// between two of them over loopback TCP (a harness of the data plane
    /// between worker processes).
    #[arg(long, hide = true, value_name = "N", default_value_t = 0, conflicts_with_all = ["workers", "worker_addrs"])]
    pub local_workers: u32,
    /// Run the subtasks in N worker processes of this binary, launched
    /// here (subtask index modulo N); this process keeps the supervisor
    /// and the checkpoint coordinator. A worker that dies is relaunched
    /// and the job restores from its latest checkpoint.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        conflicts_with = "worker_addrs"
    )]
    pub workers: u32,
    /// Run the subtasks in workers started elsewhere with `tidemark
    /// worker`, at these control addresses (`HOST:PORT,...`); one that dies
    /// is asked again at each restart until it answers.
    #[arg(long, value_name = "HOST:PORT,...", value_delimiter = ',')]
    pub worker_addrs: Vec<String>,
    /// The program `--workers` launches as `PROGRAM worker`: this one
    /// unless given (tests that run jobs in their own binary name the
    /// `tidemark` binary).
    #[arg(long, hide = true, value_name = "PROGRAM")]
    pub worker_program: Option<PathBuf>,
    /// Names the output files after this run instead of a new one: what
    /// the driver tells its workers, so that they all write one run.
    #[arg(long, hide = true, value_name = "NAME")]
    pub run_name: Option<String>,
    /// The job's settings, last in the help under a heading of their own.
    #[command(flatten, next_help_heading = "Job settings (also keys of --config)")]
    pub options: Options,
    /// The flags the command line gave, by id: they win over `--config`.
    #[arg(skip)]
    pub(crate) given: BTreeSet<String>,
    /// The arguments after `run`, as given: what workers rebuild the job
    /// from.
    #[arg(skip)]
    pub(crate) argv: Vec<String>,
}

/// What a worker rebuilds a `run` job from: the arguments and the text of
/// the `--config` file, as the driver read them.
#[derive(serde::Serialize, serde::Deserialize)]
struct Recipe {
    argv: Vec<String>,
    config: Option<String>,
}

/// Rebuilds the job of a `run` recipe (a worker's [`tidemark_actors::worker::Rebuild`]).
pub fn rebuild(recipe: &[u8]) -> Result<tidemark_core::job::Job, String> {
    rebuild_within(recipe, &Roots::default())
}

/// [`rebuild`], refusing a job whose checkpoint, savepoint, restore, state
/// or output location is outside `roots` (`tidemark worker --root`).
pub fn rebuild_within(recipe: &[u8], roots: &Roots) -> Result<tidemark_core::job::Job, String> {
    let recipe: Recipe =
        rmp_serde::from_slice(recipe).map_err(|e| format!("the recipe does not decode: {e}"))?;
    let args = RunArgs::parse(recipe.argv).map_err(|e| format!("the recipe's arguments: {e}"))?;
    let file = match (&args.config, &recipe.config) {
        (Some(path), Some(text)) => Some(ConfigFile::parse(path, text).map_err(|e| e.to_string())?),
        _ => None,
    };
    let settings = args.settings_from(file).map_err(|e| e.to_string())?;
    for (flag, location) in args.locations(&settings.options) {
        roots.check(flag, &location).map_err(|e| e.to_string())?;
    }
    let run = args.run_name.clone().unwrap_or_else(run_name);
    args.job(args.job_config(&settings), &run)
        .map_err(|e| e.to_string())
}

/// `8081` is `127.0.0.1:8081`: nothing is exposed beyond this machine
/// unless an address says so.
/// Checks a `--sink` URL; the run's name is filled in later.
fn parse_sink(s: &str) -> Result<String, String> {
    Target::from_url(s, "").map(|_| s.to_owned())
}

/// Checks (and creates) an `--output` directory.
fn parse_output(s: &str) -> Result<PathBuf, String> {
    Target::from_url(s, "").map(|_| s.into())
}

fn parse_source(s: &str) -> Result<Input, String> {
    Input::from_url(s)
}

fn parse_http(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse()
        .map_err(|_| format!("expected PORT or ADDR:PORT (127.0.0.1:8081, [::1]:8081), got {s:?}"))
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

/// The options a run uses, and where each came from.
struct RunOptions {
    options: Options,
    origins: Origins,
}

impl RunOptions {
    fn usage(&self, option: &str, problem: String) -> CliError {
        CliError::Usage {
            argument: self.origins.name(option),
            problem,
        }
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
            _ => unreachable!("the subcommand is `run`"),
        }
    }

    /// The flags given, over the `--config` file, over the defaults;
    /// refused if they do not work together.
    fn settings(&self) -> Result<RunOptions, CliError> {
        self.settings_from(self.config.as_ref().map(ConfigFile::read).transpose()?)
    }

    /// The flags given, over `file`, over the defaults.
    fn settings_from(&self, file: Option<ConfigFile>) -> Result<RunOptions, CliError> {
        let mut options = self.options.clone();
        let origins = match file {
            Some(file) => file.apply(&mut options, |id| self.given.contains(id))?,
            None => Origins::default(),
        };
        let settings = RunOptions { options, origins };
        // A setting of the file is refused as `load` refuses it, naming the
        // file, line and key; one of the flags by its flag.
        settings
            .options
            .validate(&settings.origins)
            .map_err(|refusal| match settings.origins.located(refusal.option) {
                Some(_) => CliError::Config(settings.origins.refused(refusal)),
                None => settings.usage(refusal.option, refusal.problem),
            })?;
        Ok(settings)
    }

    fn job_config(&self, settings: &RunOptions) -> JobConfig {
        let mut options = settings.options.clone();
        // Each injected failure costs a restart the default must allow.
        options.max_restarts.get_or_insert(
            RestartStrategy::DEFAULT_MAX_ATTEMPTS.saturating_add(self.inject_failures),
        );
        let mut config = options.job_config();
        if self.inject_failures > 0 {
            let operators = self.topology.keyed_operator().0 as usize + 1;
            config.kills = Some(KillSchedule::new(
                self.seed,
                self.inject_failures as usize,
                self.topology.records_in(self.records),
                operators * config.parallelism as usize,
            ));
        }
        config.faults = self.inject_fault.clone();
        config.slow = self
            .slow_subtask
            .zip(self.slow_ns)
            .map(|(index, ns_per_record)| SlowSubtask {
                subtask: SubtaskId {
                    operator: self.topology.keyed_operator(),
                    index: SubtaskIndex(index),
                },
                ns_per_record,
            });
        config
    }

    /// Worker processes, if `--workers` or `--worker-addrs` asks for them,
    /// rebuilding the job from this command line at `parallelism` (which
    /// defaults to the cores of each machine otherwise), naming their files
    /// after `run`.
    fn distributed(
        &self,
        parallelism: u32,
        run: &str,
        tls: Option<MutualTls>,
    ) -> Result<Option<Distributed>, CliError> {
        let workers = if self.workers > 0 {
            let program = match &self.worker_program {
                Some(program) => program.clone(),
                None => std::env::current_exe().map_err(|e| CliError::Usage {
                    argument: "--workers".into(),
                    problem: format!("cannot tell which program to launch: {e}"),
                })?,
            };
            let mut args = vec!["worker".into(), "--exit-with-stdin".into()];
            args.extend(tls.iter().flat_map(TlsFlags::args));
            WorkerSet::Launch {
                program,
                args,
                count: self.workers,
            }
        } else if !self.worker_addrs.is_empty() {
            WorkerSet::Addresses(self.worker_addrs.clone())
        } else {
            return Ok(None);
        };
        let mut argv = self.argv.clone();
        if !self.given.contains("parallelism") {
            argv.push(format!("--parallelism={parallelism}"));
        }
        if self.run_name.is_none() {
            argv.push(format!("--run-name={run}"));
        }
        let config = match &self.config {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|source| {
                CliError::Config(crate::config::ConfigError::Read {
                    path: path.clone(),
                    source,
                })
            })?),
            None => None,
        };
        let recipe =
            rmp_serde::to_vec_named(&Recipe { argv, config }).expect("a recipe is plain data");
        Ok(Some(Distributed {
            workers,
            recipe,
            tls,
        }))
    }

    /// The topology's job under `config`, its files named after `run`.
    fn job(&self, config: JobConfig, run: &str) -> Result<tidemark_core::job::Job, CliError> {
        let events = || Events {
            keys: self.keys,
            seed: self.seed,
            events_per_ms: self.events_per_ms,
            max_disorder: u64::try_from(self.max_disorder.as_millis()).unwrap_or(u64::MAX),
        };
        let sink = self.target(run);
        Ok(match self.topology {
            Topology::Wordcount => Wordcount {
                records: self.records,
                keys: self.keys,
                seed: self.seed,
                emit: self.emit,
                state_ttl: self.state_ttl,
                sink: sink.clone(),
                input: self.source.clone(),
            }
            .job(config),
            Topology::Windows => Windows {
                records: self.records,
                events: events(),
                window: self.window,
                sink: sink.clone(),
                input: self.source.clone(),
            }
            .job(config),
            Topology::Timers => Timers {
                records: self.records,
                events: events(),
                delay: self.timer_delay,
                sink: sink.clone(),
                input: self.source.clone(),
            }
            .job(config),
            Topology::Join => Join {
                records: self.records,
                events: events(),
                interval: self.interval,
                sink,
                left: self.source.clone(),
                right: self.right_source.clone(),
            }
            .job(config),
            Topology::Enrich => {
                let settings = match self.order {
                    Order::Ordered => AsyncWait::ordered,
                    Order::Unordered => AsyncWait::unordered,
                };
                Enrich {
                    records: self.records,
                    keys: Keys {
                        keys: self.keys,
                        seed: self.seed,
                    },
                    service: self.service.clone(),
                    settings: settings(self.request_timeout, self.in_flight as usize).with_retry(
                        AsyncRetry::FixedDelay {
                            retries: self.retries,
                            delay: Duration::from_millis(100),
                        },
                    ),
                    sink,
                }
                .job(config)
                .map_err(|e| CliError::Service(e.to_string()))?
            }
            Topology::Rules => Rules {
                records: self.records,
                keys: Keys {
                    keys: self.keys,
                    seed: self.seed,
                },
                rules: self.rules,
                sink,
            }
            .job(config),
        })
    }

    /// Where the job keeps and reads state and writes its results, by the
    /// flag that names each (its key in a file has the same meaning).
    fn locations(&self, options: &Options) -> Vec<(&'static str, String)> {
        let mut found = vec![("--checkpoint-dir", options.checkpoint_dir.clone())];
        found.extend(
            options
                .savepoint_dir
                .clone()
                .map(|dir| ("--savepoint-dir", dir)),
        );
        let state = options.state_dir.as_ref();
        found.extend(state.map(|dir| ("--state-dir", dir.display().to_string())));
        match &options.restore {
            Some(RestoreArg::Savepoint(dir)) => found.push(("--restore", dir.clone())),
            Some(RestoreArg::Checkpoint {
                parent: Some(dir), ..
            }) => found.push(("--restore", dir.display().to_string())),
            _ => {}
        }
        let output = self.output.as_ref().map(|dir| dir.display().to_string());
        found.extend(output.map(|dir| ("--output", dir)));
        found.extend(
            self.sink
                .clone()
                .filter(|url| url != "discard")
                .map(|url| ("--sink", url)),
        );
        found
    }

    /// Where the results go: `--sink`, or `--output`'s files; files are
    /// named after `run`.
    fn target(&self, run: &str) -> Target {
        match (&self.sink, &self.output) {
            (Some(url), _) => Target::from_url(url, run).expect("checked when parsed"),
            (None, Some(dir)) => {
                Target::from_url(&dir.to_string_lossy(), run).expect("checked when parsed")
            }
            (None, None) => Target::Discard,
        }
    }

    /// `--savepoint-after` or `--stop-with-savepoint-after`: when, and
    /// whether to stop.
    fn timed_savepoint(&self) -> Option<(Duration, bool)> {
        self.savepoint_after
            .map(|d| (d, false))
            .or(self.stop_with_savepoint_after.map(|d| (d, true)))
    }

    /// What the job's settings cannot check alone: the run's own flags
    /// against them, and paths against the job's directory.
    fn validate(&self, settings: &RunOptions, config: &JobConfig) -> Result<(), CliError> {
        let options = &settings.options;
        let usage = |argument: &str, problem: String| CliError::Usage {
            argument: argument.to_owned(),
            problem,
        };
        if let Some(addr) = self.http {
            let tls = matches!(options.http_tls_files(&settings.origins), Ok(Some(_)));
            tidemark_actors::http::check_exposure(
                addr,
                options.http_token_file.is_some(),
                tls || self.insecure,
            )
            .map_err(|e| usage("--http", e.to_string()))?;
        }
        let records = "reads records with a key and a ts: files of format=jsonl, csv or parquet, or Kafka's JSON values";
        match self.topology {
            Topology::Wordcount | Topology::Windows | Topology::Rules | Topology::Timers
                if !matches!(self.right_source, Input::Generator) =>
            {
                return Err(usage(
                    "--right-source",
                    "only join has a second input".into(),
                ))
            }
            Topology::Rules if !matches!(self.source, Input::Generator) => {
                return Err(usage(
                    "--source",
                    "rules reads the generator only: its rules come with the generated records"
                        .into(),
                ))
            }
            Topology::Enrich if !matches!(self.source, Input::Generator) => {
                return Err(usage("--source", "enrich reads the generator only".into()))
            }
            Topology::Windows | Topology::Join | Topology::Timers if self.source.is_text() => {
                return Err(usage(
                    "--source",
                    format!("{} {records}", self.topology.job_name()),
                ))
            }
            Topology::Join if self.right_source.is_text() => {
                return Err(usage("--right-source", format!("join {records}")))
            }
            _ => {}
        }
        let parallelism = config.parallelism;
        if let Some(subtask) = self.slow_subtask.filter(|s| *s >= parallelism) {
            return Err(usage(
                "--slow-subtask",
                format!("subtask {subtask} does not exist at parallelism {parallelism}"),
            ));
        }
        if options.savepoint_dir.is_none() {
            for (flag, given) in [
                ("--savepoint-after", self.savepoint_after.is_some()),
                (
                    "--stop-with-savepoint-after",
                    self.stop_with_savepoint_after.is_some(),
                ),
            ] {
                if given {
                    return Err(usage(
                        flag,
                        format!(
                            "needs {}",
                            settings.origins.suggest(
                                "--savepoint-dir",
                                "execution.checkpointing.savepoint-dir"
                            )
                        ),
                    ));
                }
            }
        }
        if self.inject_failures > 0 && !self.worker_addrs.is_empty() {
            return Err(usage(
                "--inject-failures",
                "kills worker processes launched here (--workers); workers at --worker-addrs are not this run's to kill".into(),
            ));
        }
        if options.checkpoint_interval.0.is_none() {
            let problem = || {
                format!(
                    "needs checkpointing; {} is off",
                    settings.origins.name("checkpoint_interval")
                )
            };
            if self.inject_failures > 0 {
                return Err(usage("--inject-failures", problem()));
            }
            if !self.inject_fault.is_empty() {
                return Err(usage("--inject-fault", problem()));
            }
            if !self.rescale_after.is_empty() {
                return Err(usage("--rescale-after", problem()));
            }
        }
        if let Some(RestoreArg::Savepoint(dir)) = &options.restore {
            // A local directory is checked here, before anything starts;
            // other URLs when the job opens them.
            let local = dir.strip_prefix("file://").unwrap_or(dir);
            if !local.contains("://") && !Path::new(local).join(METADATA).is_file() {
                return Err(settings.usage(
                    "restore",
                    format!(
                        "{dir} is not a savepoint or checkpoint directory: it holds no {METADATA}"
                    ),
                ));
            }
        }
        if let Some(Err(e)) = config
            .checkpointing
            .as_ref()
            .map(|c| check_savepoint_dir(c, job_id(self.topology.job_name())))
        {
            return Err(settings.usage("savepoint_dir", e.to_string()));
        }
        if let Some(RestoreArg::Checkpoint {
            parent: Some(parent),
            ..
        }) = &options.restore
        {
            // A checkpoint is only read from the job's own directory in the
            // checkpoint storage: a path elsewhere is refused, not followed.
            let job_dir = format!(
                "{}/{}",
                options.checkpoint_dir.trim_end_matches('/'),
                job_id(self.topology.job_name())
            );
            let job_dir = Path::new(job_dir.strip_prefix("file://").unwrap_or(&job_dir));
            let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            };
            if !same(parent, job_dir) {
                return Err(settings.usage(
                    "restore",
                    format!(
                        "{} is not a checkpoint directory of this job; its checkpoints are in {}",
                        parent.display(),
                        job_dir.display()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What a run reads before anything is created or elected, and keeps:
/// its REST API's token and TLS, and its TLS with worker processes.
#[derive(Clone)]
struct Secrets {
    http_token: Option<HttpToken>,
    http_tls: Option<RestTls>,
    tls: Option<MutualTls>,
}

/// Runs the topology to its end (or its timed stop) and reports on it.
pub fn run(args: &RunArgs) -> Result<RunReport, CliError> {
    let settings = args.settings()?;
    let config = args.job_config(&settings);
    args.validate(&settings, &config)?;
    // Read before anything is created or elected.
    let http_token = HttpToken::read_optional(settings.options.http_token_file.as_deref())
        .map_err(|e| settings.usage("http_token_file", e.to_string()))?;
    let files = settings
        .options
        .tls_files(&settings.origins)
        .map_err(|refusal| settings.usage(refusal.option, refusal.problem))?;
    let http_tls = settings
        .options
        .http_tls_files(&settings.origins)
        .map_err(|refusal| settings.usage(refusal.option, refusal.problem))?
        .map(|(cert, key)| RestTls::load(&cert, &key))
        .transpose()
        .map_err(|e| settings.usage("http_tls_cert", e.to_string()))?;
    let secrets = Secrets {
        http_token,
        http_tls,
        tls: TlsFlags::load(files.as_ref())?,
    };
    if !settings.options.elects() {
        return run_job(args, &settings, config, secrets, None);
    }
    // What a new leader restores from, checked against the checkpoint
    // ZooKeeper names.
    let storage = settings
        .options
        .zookeeper_quorum
        .as_ref()
        .map(|_| {
            let job = job_id(args.topology.job_name());
            CheckpointStorage::open(&settings.options.checkpoint_dir, job)
                .map_err(|e| settings.usage("checkpoint_dir", e.to_string()))
        })
        .transpose()?;
    loop {
        let leadership = Leadership::acquire(&settings.options, storage.clone())?;
        let report = run_job(
            args,
            &settings,
            config.clone(),
            secrets.clone(),
            Some(&leadership),
        );
        let ended = match (leadership.end(report.is_ok()), report) {
            // Another leader took the job directory over: this one lost
            // the leadership too, whether or not its service said so yet.
            (
                Ok(()),
                Err(CliError::Job(JobError::Storage(fenced @ StorageError::Fenced { .. }))),
            ) => Err(CliError::Election(ElectionError::Lost {
                record: "the job directory".into(),
                why: fenced.to_string(),
            })),
            (ended, report) => ended.and(report),
        };
        match ended {
            // The job was cancelled for it: stand by for the next turn, as
            // a restarted driver would, without counting as a failure.
            Err(CliError::Election(lost @ ElectionError::Lost { .. })) => {
                eprintln!("tidemark: {lost}; standing by again");
            }
            ended => return ended,
        }
    }
}

/// Runs the job of a validated run, watched by `leadership` when it leads
/// an election.
fn run_job(
    args: &RunArgs,
    settings: &RunOptions,
    config: JobConfig,
    Secrets {
        http_token,
        http_tls,
        tls,
    }: Secrets,
    leadership: Option<&Leadership>,
) -> Result<RunReport, CliError> {
    let (parallelism, channels) = (config.parallelism, config.channels);
    let run = args.run_name.clone().unwrap_or_else(run_name);
    let job = args.job(config, &run)?;
    let sources = job
        .graph
        .operators
        .iter()
        .filter(|op| job.graph.is_source(op.id))
        .map(|op| (op.id, op.uid.clone()))
        .collect();
    let operators = job.graph.operators.iter().map(|op| op.id).collect();
    let scheme = if http_tls.is_some() { "https" } else { "http" };
    let runtime = Runtime {
        http: args.http,
        http_token,
        http_tls,
        http_insecure: args.insecure,
        local_workers: args.local_workers,
        distributed: args.distributed(parallelism, &run, tls)?,
        ..Runtime::default()
    };
    let handle = runtime.run(job).map_err(|e| match e {
        JobError::Storage(
            e @ (StorageError::UnsupportedUrl(_) | StorageError::InvalidUrl { .. }),
        ) => settings.usage("checkpoint_dir", e.to_string()),
        e => e.into(),
    })?;
    if let Some(leadership) = leadership {
        leadership.watch(handle.control(), handle.metrics().clone());
    }
    let metrics = handle.metrics().clone();
    let storage = handle.storage().cloned();
    let timed = Timed::start(
        &handle.control(),
        args.timed_savepoint(),
        &args.rescale_after,
        operators,
    );
    if let Some(addr) = handle.http_address() {
        eprintln!("tidemark: the job's REST API and page are at {scheme}://{addr}/");
    }
    let progress = super::progress::Progress::start(metrics.clone());
    let outcome = handle.wait();
    drop(progress);
    let savepoint = timed.finish();
    Ok(RunReport::new(Finished {
        topology: args.topology,
        mode: settings.options.mode,
        parallelism,
        channels,
        report: outcome?,
        metrics: &metrics,
        storage: storage.as_ref(),
        savepoint,
        sources,
    }))
}
