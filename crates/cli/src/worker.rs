//! `tidemark worker`: a worker process for jobs that `tidemark run
//! --workers` launches or `--worker-addrs` names.

use super::CliError;
use crate::roots::Roots;
use crate::tls::TlsFlags;
use clap::Args;
use std::net::SocketAddr;
use std::sync::Arc;
use tidemark_actors::worker::{self, WorkerConfig};

/// Arguments of `tidemark worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The gRPC control service's address; port 0 takes a free port. The
    /// first line on stdout says which.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Where peers open links; port 0 takes a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub data: SocketAddr,
    /// The host peers reach the data address at, when it is bound to a
    /// wildcard address (a pod's DNS name on Kubernetes).
    #[arg(long, value_name = "HOST")]
    pub advertise: Option<String>,
    /// Where the jobs this worker hosts may keep checkpoints, savepoints
    /// and state and write their output: a directory or a URL prefix
    /// (`s3://bucket/prefix`, `postgres://host:port/db`), repeatable. A job
    /// naming a location outside every root is refused. Without any, a
    /// worker takes every location its callers name: give roots to any
    /// worker others than you can reach.
    #[arg(long = "root", value_name = "DIR|URL")]
    pub roots: Vec<String>,
    /// Mutual TLS on both ports.
    #[command(flatten)]
    pub tls: TlsFlags,
    /// Serve beyond loopback without TLS: anyone who reaches the ports
    /// controls the worker, so only where nothing but the job's processes
    /// can reach them.
    #[arg(long)]
    pub insecure: bool,
    /// Threads for the subtasks; defaults to the cores.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Exit when stdin closes (set by the driver that launches workers).
    #[arg(long, hide = true)]
    pub exit_with_stdin: bool,
}

/// Serves until shut down.
pub fn worker(args: &WorkerArgs) -> Result<(), CliError> {
    let files = args.tls.files().map_err(|missing| CliError::Usage {
        argument: format!("--{}", missing.replace('_', "-")),
        problem: "mutual TLS needs all of --tls-cert, --tls-key and --tls-ca".into(),
    })?;
    let options = WorkerConfig {
        control: args.listen,
        data: args.data,
        advertise: args.advertise.clone(),
        threads: args
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        exit_with_stdin: args.exit_with_stdin,
        tls: TlsFlags::load(files.as_ref())?,
        insecure: args.insecure,
    };
    let roots = Roots::new(&args.roots).map_err(|e| CliError::Usage {
        argument: "--root".into(),
        problem: e.to_string(),
    })?;
    let rebuild = move |recipe: &[u8]| super::rebuild_within(recipe, &roots);
    worker::serve(options, Arc::new(rebuild)).map_err(|e| CliError::Usage {
        argument: "--listen/--data".into(),
        problem: e.to_string(),
    })
}
