//! Sinks that ship with Tidemark.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tidemark::{Sink, SinkContext, UserError};

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

/// Writes `key,count` lines to a hidden in-progress file and renames it into
/// the output directory at the end of input, so a reader of the directory
/// sees a subtask's results whole or not at all.
pub struct FileSink {
    writer: Option<BufWriter<File>>,
    pending: PathBuf,
    committed: PathBuf,
}

impl FileSink {
    /// `run` distinguishes the files of successive runs into one directory.
    /// The file is created on first use, so that an error names the file.
    pub fn new(dir: &Path, run: &str, ctx: SinkContext) -> Self {
        let name = format!("part-{run}-{}", ctx.subtask.0);
        FileSink {
            writer: None,
            pending: dir.join(format!(".{name}.inprogress")),
            committed: dir.join(name),
        }
    }

    fn writer(&mut self) -> Result<&mut BufWriter<File>, UserError> {
        if self.writer.is_none() {
            let file = File::create(&self.pending)
                .map_err(|e| format!("cannot create {}: {e}", self.pending.display()))?;
            self.writer = Some(BufWriter::with_capacity(1 << 20, file));
        }
        Ok(self.writer.as_mut().expect("just created"))
    }
}

impl Sink<(u64, u64)> for FileSink {
    fn write(&mut self, records: &mut Vec<(u64, u64)>) -> Result<(), UserError> {
        let writer = self.writer()?;
        for (key, count) in records.iter() {
            writeln!(writer, "{key},{count}")?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), UserError> {
        self.writer()?;
        let writer = self.writer.take().expect("opened above");
        let file = writer.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&self.pending, &self.committed)
            .map_err(|e| format!("cannot commit {}: {e}", self.committed.display()))?;
        Ok(())
    }
}

/// Collects every record into a shared vector: for tests and for embedding
/// applications that want the results in memory.
pub struct Collect<T> {
    into: Arc<Mutex<Vec<T>>>,
}

impl<T> Collect<T> {
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
