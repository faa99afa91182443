//! Errors of running a task. User code reports its own errors as
//! `UserError`; the runtime wraps them with the place they came from.

use crate::model::batch::BatchError;
use crate::state::StateError;
use thiserror::Error;

/// An error raised by user code: a source, a sink or a function.
pub type UserError = Box<dyn std::error::Error + Send + Sync>;

/// Why a subtask failed. Any of them fails the subtask, and the job
/// supervisor restarts the job from the latest completed checkpoint.
#[derive(Debug, Error)]
pub enum TaskError {
    /// The user's `Source` returned an error.
    #[error("source failed: {0}")]
    Source(UserError),
    /// The user's `Sink` returned an error (writing, pre-committing,
    /// committing or adopting transactions).
    #[error("sink failed: {0}")]
    Sink(UserError),
    /// User code panicked; the panic message.
    #[error("user code panicked: {0}")]
    Panic(String),
    /// An async function's request failed after its retries, or its
    /// timeout handler returned an error.
    #[error("async request failed: {0}")]
    Async(UserError),
    /// A failure the job was told to inject (`--inject-failures`, a
    /// targeted fault): expected, so it is reported without a backtrace.
    #[error("injected failure: {0}")]
    Injected(String),
    /// A batch could not be built or read.
    #[error(transparent)]
    Batch(#[from] BatchError),
    /// The state backend failed, typically while restoring a snapshot.
    #[error("restoring state failed: {0}")]
    State(#[from] StateError),
    /// The runtime broke its own protocol or read malformed checkpoint data:
    /// a bug or a corrupt checkpoint, not the user's code.
    #[error("{0}")]
    Protocol(String),
    /// A subtask on a worker process failed: its error as the worker
    /// reported it.
    #[error("{0}")]
    Remote(String),
}
