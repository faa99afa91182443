//! What a subtask runs: operators and their chains, two-input functions,
//! the task that drives a chain over its inputs, sources (index and split
//! sources) and sinks, rate limits, and the errors user code returns.

pub mod async_io;
pub mod broadcast;
pub(crate) mod due_reads;
pub mod error;
pub mod operator;
pub mod rate;
pub mod sink;
pub mod source;
pub mod task;
pub mod two_input;
