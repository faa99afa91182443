//! A job as the runtime names it, and what a run of it ends with: below
//! the actors, which all report into it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;
use tidemark_core::checkpoint::coordinator::HookError;
use tidemark_core::checkpoint::restore::RestoreError;
use tidemark_core::checkpoint::CheckpointConfigError;
use tidemark_core::dataflow::error::TaskError;
use tidemark_core::job::JobConfigError;
use tidemark_core::model::graph::GraphError;
use tidemark_core::model::ids::{JobId, SubtaskId};
use tidemark_storage::lease::LeaseError;
use tidemark_storage::savepoint::SavepointError;
use tidemark_storage::StorageError;

/// A job's id follows from its name, so that a restarted process finds the
/// checkpoints of the same job in the checkpoint directory.
pub fn job_id(name: &str) -> JobId {
    JobId(tidemark_core::model::key_group::key_hash(name))
}

/// Why a job could not start or did not finish: from
/// [`Runtime::run`](crate::runtime::Runtime::run) before anything is
/// deployed, or from [`JobHandle::wait`](crate::runtime::JobHandle::wait).
#[derive(Debug, Error)]
pub enum JobError {
    /// The job graph does not validate; nothing was deployed.
    #[error("invalid job: {0}")]
    InvalidJob(#[from] GraphError),
    /// A job setting is out of range; nothing was deployed.
    #[error("invalid job settings: {0}")]
    InvalidConfig(#[from] JobConfigError),
    /// The checkpoint settings do not validate; nothing was deployed.
    #[error("invalid checkpointing: {0}")]
    InvalidCheckpointing(#[from] CheckpointConfigError),
    /// A subtask failed. Without checkpointing this ends the job at once;
    /// with it the job restarts, and this comes back inside
    /// [`JobError::RestartsExhausted`].
    #[error("subtask {subtask} failed: {error}")]
    TaskFailed {
        /// The subtask that failed.
        subtask: SubtaskId,
        /// Its error, a panic included.
        error: TaskError,
    },
    /// [`JobHandle::cancel`](crate::runtime::JobHandle::cancel) ended the job.
    #[error("the job was cancelled")]
    Cancelled,
    /// An injected fault names a subtask the job graph does not have;
    /// nothing was deployed.
    #[error("a fault is aimed at {0}, which the job does not have")]
    UnknownFaultTarget(SubtaskId),
    /// Another run holds the job directory, or it could not be leased;
    /// nothing was deployed.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The REST API would be exposed without a token.
    #[error(transparent)]
    Http(#[from] HttpTokenError),
    /// Checkpoint or savepoint storage could not be opened or read, when
    /// the job started or when it restored; the job does not restart.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The checkpoint or savepoint to restore from does not fit the job or
    /// is malformed; the job does not restart.
    #[error("cannot restore: {0}")]
    Restore(#[from] RestoreError),
    /// The savepoint or checkpoint to restore from has no `_metadata`, is
    /// not self-contained, or references objects outside its directory.
    #[error(transparent)]
    Savepoint(#[from] SavepointError),
    /// Consecutive checkpoint failures exceeded the tolerable number: the
    /// job failed over, and comes back inside
    /// [`JobError::RestartsExhausted`] once no restart is left.
    #[error("checkpointing failed: {0}")]
    Checkpointing(String),
    /// A master hook's `restore` failed, at the start or at a failover.
    #[error(transparent)]
    MasterHook(#[from] HookError),
    /// The restart strategy allows no more restarts.
    #[error("gave up after {restarts} restarts; last failure: {last}")]
    RestartsExhausted {
        /// Restarts done before giving up.
        restarts: u32,
        /// The failure that no restart followed.
        last: Box<JobError>,
    },
    /// The runtime itself broke: its thread could not start or panicked,
    /// the coordinator vanished, or a restore could not write its local
    /// files (downloaded database files).
    #[error("the runtime failed: {0}")]
    Runtime(String),
}

/// What a finished job reports.
#[derive(Clone, Debug)]
pub struct JobReport {
    /// Records read by all sources.
    pub records_in: u64,
    /// From the job's start (restore included) to its end.
    pub elapsed: Duration,
}

impl JobReport {
    /// `records_in` per second of `elapsed`.
    pub fn throughput(&self) -> f64 {
        self.records_in as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Why a token cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum HttpTokenError {
    /// The file could not be read.
    #[error("cannot read the REST API's token from {}: {source}", path.display())]
    Read {
        /// The token file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Empty, or not printable ASCII without spaces (it must fit a header).
    #[error("the REST API's token {0}: expected one line of printable ASCII without spaces")]
    Malformed(String),
    /// An address beyond loopback and no token.
    #[error("the REST API on {0} would answer anyone who can reach it: give it a token (--http-token-file, rest.auth.token-file), or bind a loopback address")]
    Unauthenticated(SocketAddr),
    /// An address beyond loopback without TLS, and not told the network
    /// is trusted.
    #[error("the REST API on {0} would take its token in the clear: give it TLS (--http-tls-cert and --http-tls-key, security.ssl.rest.*), or --insecure if only trusted hosts can reach it")]
    Plaintext(SocketAddr),
}
