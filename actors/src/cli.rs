//! The `tidemark` command line: runs an example topology and reports on it.

use crate::runtime::{JobError, JobReport, Runtime};
use crate::wordcount::{Emit, Wordcount};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;
use tidemark::job::JobConfig;

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

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an example topology.
    Run(RunArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// Count records per key.
    Wordcount,
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
    /// Checkpoint interval; only `off` until checkpointing is enabled.
    #[arg(long, default_value = "off", value_parser = parse_checkpoint_interval)]
    pub checkpoint_interval: CheckpointInterval,
    /// Print a JSON report as the last line of stdout.
    #[arg(long)]
    pub json: bool,
}

/// `off` is the only interval this version accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointInterval {
    Off,
}

fn parse_checkpoint_interval(s: &str) -> Result<CheckpointInterval, String> {
    match (s, humantime::parse_duration(s)) {
        ("off", _) => Ok(CheckpointInterval::Off),
        (_, Ok(_)) => {
            Err("checkpointing is not available in this version; only `off` is accepted".into())
        }
        (_, Err(e)) => Err(format!("expected `off` ({e})")),
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        Ok(_) => Err("must be a positive number of records per second".into()),
        Err(e) => Err(format!("not a number: {e}")),
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
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage { .. } => 2,
            CliError::Job(_) => 1,
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
}

pub fn run(args: &RunArgs) -> Result<RunReport, CliError> {
    if let Some(dir) = &args.output {
        std::fs::create_dir_all(dir).map_err(|e| CliError::Usage {
            argument: "--output",
            problem: format!("cannot use {} as the output directory: {e}", dir.display()),
        })?;
    }
    let mut config = JobConfig::default();
    if let Some(p) = args.parallelism {
        config.parallelism = p;
    }
    config.source_rate = args.rate;
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
    let handle = Runtime::default().run(job)?;
    let metrics = handle.metrics().clone();
    let JobReport {
        records_in,
        elapsed,
    } = handle.wait()?;
    let gauges = || {
        metrics
            .channels
            .iter()
            .map(|g| g.value().clone())
            .collect::<Vec<_>>()
    };
    Ok(RunReport {
        topology: args.topology,
        records_in,
        elapsed_s: elapsed.as_secs_f64(),
        throughput_rps: records_in as f64 / elapsed.max(Duration::from_nanos(1)).as_secs_f64(),
        parallelism,
        max_output_queued: gauges()
            .iter()
            .map(|g| g.max_output_queued())
            .max()
            .unwrap_or(0),
        output_credits: channels.output_credits,
        max_input_buffered: gauges()
            .iter()
            .map(|g| g.max_input_buffered())
            .max()
            .unwrap_or(0),
        input_credits: channels.input_credits,
    })
}
