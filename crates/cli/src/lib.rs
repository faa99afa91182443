//! The `tidemark` command line: one module per command, and what they
//! share: parsing, errors and their exit codes, a runtime for storage IO;
//! the example topologies that `tidemark run` runs, and where they write.
//! The runtime itself is `tidemark-actors`; this crate only drives it.

pub mod cleanup;
pub mod client;
pub mod config;
pub mod inspect;
mod leader;
mod progress;
mod report;
pub mod rescale;
pub mod roots;
mod run;
pub mod sinks;
pub mod timed;
pub mod tls;
pub mod topologies;
pub mod worker;

pub use report::{LastMax, Percentiles, RescaleFigures, RunReport};
pub use run::{rebuild, rebuild_within, run, RunArgs, Topology};

use crate::config::ConfigError;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::collections::BTreeSet;
use std::ffi::OsString;
use thiserror::Error;
use tidemark_actors::runtime::JobError;
use tidemark_storage::StorageError;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "tidemark",
    version,
    about = "Fault-tolerant stream topologies on actix"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
// Parsed once per process: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an example topology.
    Run(RunArgs),
    /// Delete what no retained checkpoint of a job references.
    Cleanup(cleanup::CleanupArgs),
    /// Show a checkpoint's or savepoint's metadata.
    Inspect(inspect::InspectArgs),
    /// Take a savepoint of a running job over its REST API (`run --http`)
    /// and print where it is.
    Savepoint(client::SavepointArgs),
    /// Stop a running job with a savepoint over its REST API: the sinks
    /// commit it and the job ends; prints where it is.
    Stop(client::SavepointArgs),
    /// Show a running job's checkpoint history, over its REST API.
    Checkpoints(client::CheckpointsArgs),
    /// Change a running job's parallelism over its REST API: it goes on
    /// from a checkpoint at the new parallelism; prints how long it paused.
    Rescale(rescale::RescaleArgs),
    /// Host a share of the subtasks of jobs that `run --worker-addrs`
    /// drives from elsewhere.
    Worker(worker::WorkerArgs),
}

impl Cli {
    /// Parses `argv` (program name first) and remembers which `run` flags
    /// it gave, since those win over a configuration file while defaults
    /// do not. It shadows `Parser::try_parse_from`, which would not.
    pub fn try_parse_from<I, T>(argv: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
        // What follows `run`, for worker processes to parse again.
        let argv_after_run = argv
            .iter()
            .skip_while(|a| *a != "run")
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let matches = Cli::command().try_get_matches_from(argv)?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        if let (Command::Run(args), Some(("run", run))) = (&mut cli.command, matches.subcommand()) {
            args.argv = argv_after_run;
            args.given = run
                .ids()
                .map(|id| id.as_str())
                .filter(|id| run.value_source(id) == Some(ValueSource::CommandLine))
                .map(str::to_owned)
                .collect::<BTreeSet<_>>();
        }
        Ok(cli)
    }
}

/// Why a command failed.
#[derive(Debug, Error)]
pub enum CliError {
    /// A bad argument found after parsing: exit code 2, like clap's own.
    #[error("{argument}: {problem}")]
    Usage {
        /// The flag, or the key and file that set it.
        argument: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The configuration file of `--config`: exit code 2.
    #[error("--config {0}")]
    Config(#[from] ConfigError),
    /// The job failed.
    #[error(transparent)]
    Job(#[from] JobError),
    /// Checkpoint storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// `cleanup` could not lease the job directory: a run holds it.
    #[error(transparent)]
    Lease(#[from] tidemark_storage::lease::LeaseError),
    /// `cleanup` found metadata that does not decode.
    #[error("corrupted checkpoint metadata; nothing was deleted, since its checkpoint may reference any object (--ignore-corrupted-metadata sweeps it too):\n  {}", .0.join("\n  "))]
    CorruptedMetadata(Vec<String>),
    /// `cleanup` never saw storage hold still.
    #[error("checkpoints were subsumed during each of {attempts} scans; nothing was deleted")]
    StorageChanging {
        /// Scans tried.
        attempts: usize,
    },
    /// A job's REST API failed a request or could not be reached.
    #[error("{url}: {problem}")]
    Rest {
        /// The API's URL.
        url: String,
        /// What went wrong.
        problem: String,
    },
    /// Leader election refused this driver, or it lost the leadership.
    #[error(transparent)]
    Election(#[from] tidemark_actors::election::ElectionError),
    /// `run enrich` could not start its own service.
    #[error("cannot start the enrich service: {0}")]
    Service(String),
    /// No async runtime for storage IO.
    #[error("cannot start an async runtime: {0}")]
    Runtime(String),
}

impl CliError {
    /// 2 for what the user can fix in the command line, 1 for the rest.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage { .. } | CliError::Config(_) => 2,
            // A standby of a job that ran to its end has nothing to do.
            CliError::Election(tidemark_actors::election::ElectionError::Finished { .. }) => 0,
            _ => 1,
        }
    }
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
