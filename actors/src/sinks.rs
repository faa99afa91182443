//! Sinks that ship with Tidemark.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
#[cfg(feature = "postgres")]
use tidemark_connectors::postgres::{PostgresOptions, PostgresSink};
use tidemark_connectors::rows::Row;
use tidemark_core::ids::CheckpointId;
use tidemark_core::{Data, Job, Sink, SinkContext, Stream, UserError};

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

/// Where a topology's exactly-once files go: a directory, and the run
/// that names them (the same in every process of one run, so that a
/// relaunched worker recognises what its predecessor left).
#[derive(Clone, Debug)]
pub struct Output {
    /// The directory.
    pub dir: PathBuf,
    /// The run's part of the file names.
    pub run: String,
}

impl Output {
    /// Files in `dir`, named after a new run ([`run_name`]).
    pub fn new(dir: PathBuf) -> Self {
        Output {
            dir,
            run: run_name(),
        }
    }
}

/// Where a topology's results go (`--sink`).
#[derive(Clone, Debug, Default)]
pub enum Target {
    /// Nowhere: [`Discard`].
    #[default]
    Discard,
    /// Exactly-once files of lines ([`FileSink`]).
    Files(Output),
    /// An exactly-once PostgreSQL table ([`PostgresSink`]).
    #[cfg(feature = "postgres")]
    Postgres(Arc<PostgresOptions>),
}

impl Target {
    /// `discard`; `postgres://…?table=NAME[&mode=upsert|append]`; or a
    /// directory of CSV files, a path or `file://DIR[?format=csv]`, named
    /// after the run `run`.
    pub fn from_url(url: &str, run: &str) -> Result<Self, String> {
        if url == "discard" {
            return Ok(Target::Discard);
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            #[cfg(feature = "postgres")]
            return Ok(Target::Postgres(Arc::new(
                url.parse().map_err(|e| format!("{e}"))?,
            )));
            #[cfg(not(feature = "postgres"))]
            return Err(
                "this tidemark was built without PostgreSQL (cargo feature `postgres`)".into(),
            );
        }
        if let Some((scheme, _)) = url.split_once("://").filter(|(s, _)| *s != "file") {
            return Err(format!(
                "a sink is discard, postgres://, file:// or a directory; {scheme}:// is not supported yet"
            ));
        }
        let (path, query) = url.split_once('?').unwrap_or((url, ""));
        match query {
            "" | "format=csv" => {}
            other => {
                return Err(format!(
                    "files are written as CSV (`format=csv`), not `{other}`"
                ))
            }
        }
        let dir = path.strip_prefix("file://").unwrap_or(path);
        if dir.is_empty() {
            return Err("a file sink needs a directory".into());
        }
        Ok(Target::Files(Output {
            dir: dir.into(),
            run: run.to_owned(),
        }))
    }
}

/// Ends `stream` in `target`: the example topologies' sinks.
pub fn sink_into<T>(stream: Stream<T>, target: &Target) -> Job
where
    T: Data + Line + Row,
{
    match target {
        Target::Discard => stream.sink("discard", |_| Discard),
        Target::Files(output) => {
            let dir = Arc::new(output.dir.clone());
            let run = output.run.clone();
            stream.sink("files", move |ctx| FileSink::new(&dir, &run, ctx))
        }
        #[cfg(feature = "postgres")]
        Target::Postgres(options) => {
            let options = options.clone();
            stream.sink("postgres", move |ctx| {
                PostgresSink::new(options.clone(), ctx)
            })
        }
    }
    .build()
}

/// Names the output files of a new run after the current time, so that
/// processes writing into one directory do not collide.
pub fn run_name() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    )
}

/// A record as one line of a [`FileSink`] file.
pub trait Line {
    /// Writes the line, without its newline.
    fn line(&self, out: &mut dyn Write) -> std::io::Result<()>;
}

/// A key as a field of a [`Line`].
pub trait Field {
    /// Writes the field.
    fn field(&self, out: &mut dyn Write) -> std::io::Result<()>;
}

impl Field for u64 {
    fn field(&self, out: &mut dyn Write) -> std::io::Result<()> {
        write!(out, "{self}")
    }
}

/// Quoted as CSV quotes a field when it holds a comma, a quote or a line
/// break.
impl Field for String {
    fn field(&self, out: &mut dyn Write) -> std::io::Result<()> {
        if self.contains([',', '"', '\n', '\r']) {
            write!(out, "\"{}\"", self.replace('"', "\"\""))
        } else {
            out.write_all(self.as_bytes())
        }
    }
}

/// `key,count`.
impl<K: Field> Line for (K, u64) {
    fn line(&self, out: &mut dyn Write) -> std::io::Result<()> {
        self.0.field(out)?;
        write!(out, ",{}", self.1)
    }
}

/// Exactly-once files of lines (such as `key,count`), by two-phase commit. Records go
/// to a hidden in-progress file; at a checkpoint barrier it is flushed,
/// synced and renamed to a hidden pending name (pre-commit); when the
/// checkpoint completes the pending files are renamed to their visible names
/// (commit). A restore commits what the restored checkpoint pre-committed
/// and deletes every other hidden file of this subtask in its run: what was
/// written after that checkpoint is replayed into new files. Hidden files of
/// runs that were never restored stay behind, invisible to readers.
pub struct FileSink {
    dir: PathBuf,
    subtask: u32,
    run: String,
    writer: Option<(BufWriter<File>, PathBuf)>,
    sequence: u64,
    /// Pre-committed, not yet committed: (checkpoint, visible name).
    pending: Vec<(CheckpointId, String)>,
}

const IN_PROGRESS: &str = ".inprogress-";
const PENDING: &str = ".pending-";

impl FileSink {
    /// `run` keeps the files of one process apart from those of others
    /// writing into the same directory.
    pub fn new(dir: &Path, run: &str, ctx: SinkContext) -> Self {
        FileSink {
            dir: dir.to_path_buf(),
            subtask: ctx.subtask.0,
            run: run.to_owned(),
            writer: None,
            sequence: 0,
            pending: Vec::new(),
        }
    }

    fn writer(&mut self) -> Result<&mut BufWriter<File>, UserError> {
        if self.writer.is_none() {
            let path = self.dir.join(format!(
                "{IN_PROGRESS}{}-{}-{}",
                self.subtask, self.run, self.sequence
            ));
            self.sequence += 1;
            let file = File::create(&path)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            self.writer = Some((BufWriter::with_capacity(1 << 20, file), path));
        }
        Ok(&mut self.writer.as_mut().expect("just created").0)
    }

    /// Flushes and syncs the in-progress file and renames it to `name`.
    fn seal(&mut self, name: &str) -> Result<bool, UserError> {
        let Some((writer, path)) = self.writer.take() else {
            return Ok(false);
        };
        writer
            .into_inner()
            .map_err(|e| e.into_error())?
            .sync_all()?;
        rename(&path, &self.dir.join(name))?;
        Ok(true)
    }

    fn commit_pending(&mut self, upto: Option<CheckpointId>) -> Result<(), UserError> {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(id, _)| upto.is_none_or(|upto| *id <= upto));
        self.pending = later;
        for (_, name) in due {
            rename(
                &self.dir.join(format!("{PENDING}{name}")),
                &self.dir.join(&name),
            )?;
        }
        Ok(())
    }

    /// Commits pre-committed files of a restored checkpoint; a restore that
    /// ran before may have committed them already.
    fn commit_restored(&self, names: &[String]) -> Result<(), UserError> {
        for name in names {
            let (pending, visible) = (
                self.dir.join(format!("{PENDING}{name}")),
                self.dir.join(name),
            );
            if pending.exists() {
                rename(&pending, &visible)?;
            } else if !visible.exists() {
                return Err(format!("pre-committed file {} is missing", pending.display()).into());
            }
        }
        Ok(())
    }

    /// Hidden files of this subtask in this run.
    fn own_hidden_files(&self) -> Result<Vec<PathBuf>, UserError> {
        let prefixes = [
            format!("{IN_PROGRESS}{}-{}-", self.subtask, self.run),
            format!("{PENDING}part-{}-{}-", self.subtask, self.run),
        ];
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir)
            .map_err(|e| format!("cannot list {}: {e}", self.dir.display()))?
        {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if prefixes.iter().any(|p| name.starts_with(p.as_str())) {
                out.push(entry.path());
            }
        }
        Ok(out)
    }
}

/// Renames `from` to `to` and syncs the directory, so that the new name
/// survives a power loss: a commit is only acknowledged once it is durable.
fn rename(from: &Path, to: &Path) -> Result<(), UserError> {
    std::fs::rename(from, to)
        .map_err(|e| format!("cannot rename {} to {}: {e}", from.display(), to.display()))?;
    let dir = to.parent().unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("cannot sync directory {}: {e}", dir.display()).into())
}

impl<T: Line + Send> Sink<T> for FileSink {
    fn write(&mut self, records: &mut Vec<T>) -> Result<(), UserError> {
        let writer = self.writer()?;
        for record in records.iter() {
            record.line(writer)?;
            writer.write_all(b"\n")?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), UserError> {
        self.commit_pending(None)?;
        let name = format!("part-{}-{}-final", self.subtask, self.run);
        self.seal(&name)?;
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<Vec<u8>, UserError> {
        let name = format!("part-{}-{}-{}", self.subtask, self.run, checkpoint.0);
        if self.seal(&format!("{PENDING}{name}"))? {
            self.pending.push((checkpoint, name));
        }
        let names: Vec<&String> = self.pending.iter().map(|(_, n)| n).collect();
        Ok(rmp_serde::to_vec(&(&self.run, names))?)
    }

    fn commit(&mut self, checkpoint: CheckpointId) -> Result<(), UserError> {
        self.commit_pending(Some(checkpoint))
    }

    /// A restored sink continues the run it was restored from, so that what
    /// it writes again gets the names it had: the final file of a replayed
    /// end of input replaces itself instead of appearing twice.
    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), UserError> {
        let (run, names): (String, Vec<String>) = match state {
            Some(bytes) => rmp_serde::from_slice(bytes)?,
            None => (self.run.clone(), Vec::new()),
        };
        self.run = run;
        self.commit_restored(&names)?;
        for leftover in self.own_hidden_files()? {
            std::fs::remove_file(&leftover)
                .map_err(|e| format!("cannot delete {}: {e}", leftover.display()))?;
        }
        Ok(())
    }

    /// The files a removed subtask pre-committed; what it wrote after them
    /// stays hidden, like the files of a run that is never restored.
    fn adopt(&mut self, state: &[u8]) -> Result<(), UserError> {
        let (_, names): (String, Vec<String>) = rmp_serde::from_slice(state)?;
        self.commit_restored(&names)
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

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::ids::SubtaskIndex;

    /// A file sink of `key,count` lines.
    fn sink(dir: &Path, run: &str) -> Box<dyn Sink<(u64, u64)>> {
        Box::new(FileSink::new(
            dir,
            run,
            SinkContext {
                subtask: SubtaskIndex(0),
                parallelism: 1,
            },
        ))
    }

    fn visible(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn nothing_is_visible_before_its_checkpoint_completes() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sink(dir.path(), "r1");
        s.write(&mut vec![(1, 1)]).unwrap();
        s.pre_commit(CheckpointId(1)).unwrap();
        s.write(&mut vec![(1, 2)]).unwrap();
        s.pre_commit(CheckpointId(2)).unwrap();
        assert!(visible(dir.path()).is_empty());
        s.commit(CheckpointId(1)).unwrap();
        assert_eq!(visible(dir.path()), ["part-0-r1-1"]);
        s.commit(CheckpointId(2)).unwrap();
        assert_eq!(visible(dir.path()), ["part-0-r1-1", "part-0-r1-2"]);
    }

    #[test]
    fn restore_commits_what_the_checkpoint_pre_committed_and_drops_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let mut crashed = sink(dir.path(), "r1");
        crashed.write(&mut vec![(1, 1)]).unwrap();
        let state = crashed.pre_commit(CheckpointId(1)).unwrap();
        // Written after checkpoint 1, pre-committed for 2, never completed.
        crashed.write(&mut vec![(1, 2)]).unwrap();
        crashed.pre_commit(CheckpointId(2)).unwrap();
        crashed.write(&mut vec![(1, 3)]).unwrap();
        drop(crashed);

        let mut restored = sink(dir.path(), "r2");
        restored.restore(Some(&state)).unwrap();
        assert_eq!(visible(dir.path()), ["part-0-r1-1"]);
        let hidden = std::fs::read_dir(dir.path()).unwrap().count() - 1;
        assert_eq!(hidden, 0, "the newer transactions were aborted");
        // The restored sink goes on in the run it was restored from.
        restored.write(&mut vec![(1, 2)]).unwrap();
        restored.finish().unwrap();
        assert_eq!(visible(dir.path()), ["part-0-r1-1", "part-0-r1-final"]);
        // Restoring twice is harmless: already committed stays committed.
        sink(dir.path(), "r3").restore(Some(&state)).unwrap();
        assert_eq!(visible(dir.path()), ["part-0-r1-1", "part-0-r1-final"]);
    }

    #[test]
    fn a_restart_before_any_checkpoint_drops_what_the_failed_attempt_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let mut failed = sink(dir.path(), "r1");
        failed.write(&mut vec![(1, 1)]).unwrap();
        failed.pre_commit(CheckpointId(1)).unwrap();
        failed.write(&mut vec![(1, 2)]).unwrap();
        drop(failed);
        sink(dir.path(), "r1").restore(None).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_missing_pre_committed_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sink(dir.path(), "r1");
        s.write(&mut vec![(1, 1)]).unwrap();
        let state = s.pre_commit(CheckpointId(1)).unwrap();
        std::fs::remove_file(dir.path().join(".pending-part-0-r1-1")).unwrap();
        let err = sink(dir.path(), "r2").restore(Some(&state)).unwrap_err();
        assert!(err.to_string().contains(".pending-part-0-r1-1"), "{err}");
    }
}
