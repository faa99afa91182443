//! Sinks that ship with Tidemark.

use std::sync::{Arc, Mutex};
use tidemark_core::{Sink, UserError};

/// Drops every record: for benchmarks and jobs run for their side effects.
pub struct Discard;

impl<T> Sink<T> for Discard {
    fn write(&mut self, _records: &mut Vec<T>) -> Result<(), UserError> {
        Ok(())
    }

    fn finish(&mut self) -> Result<(), UserError> {
        Ok(())
    }
}

/// Collects every record into a shared vector: for tests and for embedding
/// applications that want the results in memory.
pub struct Collect<T> {
    into: Arc<Mutex<Vec<T>>>,
}

impl<T> Collect<T> {
    /// Appends each batch to `into` as it is written, not at checkpoints:
    /// after a restart, replayed records appear again. Give every subtask a
    /// clone of the same vector to gather them all.
    pub fn new(into: Arc<Mutex<Vec<T>>>) -> Self {
        Collect { into }
    }
}

impl<T: Send> Sink<T> for Collect<T> {
    fn write(&mut self, records: &mut Vec<T>) -> Result<(), UserError> {
        self.into
            .lock()
            .map_err(|_| "the collecting vector was poisoned")?
            .append(records);
        Ok(())
    }

    fn finish(&mut self) -> Result<(), UserError> {
        Ok(())
    }
}
