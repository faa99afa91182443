//! Errors of running a task. User code reports its own errors as
//! `UserError`; the runtime wraps them with the place they came from.

use crate::batch::BatchError;
use crate::state::StateError;
use thiserror::Error;

/// An error raised by user code: a source, a sink or a function.
pub type UserError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Error)]
pub enum TaskError {
    #[error("source failed: {0}")]
    Source(UserError),
    #[error("sink failed: {0}")]
    Sink(UserError),
    #[error("user code panicked: {0}")]
    Panic(String),
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error("restoring state failed: {0}")]
    State(#[from] StateError),
    #[error("{0}")]
    Protocol(String),
}
