//! An exactly-once sink of files into a local directory or any object
//! store with multipart uploads (`s3://`, `memory://`), as Flink's
//! `FileSink`: CSV, JSON lines or Parquet, in buckets, rolled by size, time
//! and checkpoint.
//!
//! Records go to the open part file of their bucket (a subdirectory such
//! as `dt=2026-12-04/hour=19`). A file rolls when it reaches the roll size,
//! when it has been open for the roll interval, and at every barrier: it is
//! sealed (a local file synced under a hidden name; on an object store the
//! last part of its multipart upload written, the upload not completed)
//! and becomes pending. When the checkpoint whose barrier followed it
//! completes, it is committed (renamed into place; the upload completed).
//! A reader listing the directory sees only committed files. A restore
//! commits what the restored checkpoint pre-committed and aborts every
//! other file its run and subtask left, so each record is in exactly one
//! visible file after any failure. Names are `part-SUBTASK-RUN-N.EXT`: a
//! restored sink goes on with its checkpoint's run and numbering, so that
//! what it writes again replaces its twin instead of adding to it. A sink
//! that starts without state in a later attempt (a rescale added its
//! subtask back) names its run `RUN.ATTEMPT`, apart from the committed
//! files of the subtask of that index before.

mod encode;
#[cfg(feature = "parquet")]
mod parquet;
mod parts;
mod staging;
#[cfg(test)]
mod tests;

pub use encode::{Csv, Encoder, EncoderFactory, JsonLines};
#[cfg(feature = "parquet")]
pub use parquet::Parquet;
pub use parts::RollPolicy;
pub use staging::{OpenUpload, UPLOADS};

use super::Format;
use crate::rows::Row;
use parts::{Parts, PartsState};
use staging::{Directory, Pending, Stage};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use thiserror::Error;
use tidemark_core::model::ids::Attempt;
use tidemark_core::model::ids::CheckpointId;
use tidemark_core::{Sink, SinkContext, UserError};
use tidemark_storage::{Location, StorageError};

/// A file sink's settings that a URL or the builder give.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSinkOptions {
    /// CSV, JSON lines or Parquet (one row group per file).
    pub format: Format,
    /// CSV only: begin each file with a line of column names.
    pub header: bool,
    /// Bucket records by the time they are written (UTC), as this
    /// `strftime` pattern names it (`dt=%Y-%m-%d/hour=%H`); `None`: every
    /// file directly in the directory.
    pub bucket: Option<String>,
    /// When files roll before a barrier.
    pub roll: RollPolicy,
    /// On an object store, the bytes of each uploaded part but the last
    /// (S3 wants at least 5 MiB).
    pub part_size: usize,
}

impl Default for FileSinkOptions {
    fn default() -> Self {
        FileSinkOptions {
            format: Format::Csv,
            header: false,
            bucket: None,
            roll: RollPolicy {
                size: 128 << 20,
                interval: Duration::from_secs(60),
            },
            part_size: 8 << 20,
        }
    }
}

/// A file sink that cannot be opened.
#[derive(Debug, Error)]
pub enum FileSinkError {
    /// A setting of the URL is wrong.
    #[error("file sink {url}: {problem}")]
    Option {
        /// The sink's URL.
        url: String,
        /// What is wrong.
        problem: String,
    },
    /// The directory's store cannot be opened.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The directory's store failed.
    #[error("file sink {url}: {source}")]
    Store {
        /// The sink's directory.
        url: String,
        /// What failed.
        source: object_store::Error,
    },
}

/// Where and how a file sink writes: its directory, opened, and its
/// options; one for all of a job's sink subtasks.
#[derive(Clone)]
pub struct FileSinkConfig {
    url: String,
    dir: Directory,
    options: FileSinkOptions,
}

impl std::fmt::Debug for FileSinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSinkConfig")
            .field("url", &self.url)
            .field("options", &self.options)
            .finish()
    }
}

impl FileSinkConfig {
    /// Files under `dir`: a path or `file://` (created if missing), or
    /// `s3://bucket/prefix` or `memory://NAME/prefix`.
    pub fn new(dir: &str, options: FileSinkOptions) -> Result<Self, FileSinkError> {
        let problem = |problem: String| FileSinkError::Option {
            url: dir.to_owned(),
            problem,
        };
        if options.format == Format::Text {
            return Err(problem(
                "format=text cannot be written: use csv or jsonl".into(),
            ));
        }
        if let Some(pattern) = &options.bucket {
            check_bucket_pattern(pattern).map_err(problem)?;
        }
        if options.roll.size == 0 || options.part_size == 0 {
            return Err(problem(
                "roll-size and part-size must be at least one byte".into(),
            ));
        }
        let directory = match dir.split_once("://") {
            None | Some(("file", _)) => {
                let path = dir.strip_prefix("file://").unwrap_or(dir);
                if path.is_empty() {
                    return Err(problem("a file sink needs a directory".into()));
                }
                std::fs::create_dir_all(path)
                    .map_err(|e| problem(format!("cannot create the directory: {e}")))?;
                Directory::Local(path.into())
            }
            Some(_) => {
                let Location {
                    store,
                    prefix,
                    multipart,
                    ..
                } = Location::open(dir, true)?;
                let multipart = multipart.ok_or_else(|| {
                    problem(
                        "this store has no resumable multipart uploads to keep files pending in"
                            .into(),
                    )
                })?;
                Directory::Objects {
                    store,
                    multipart,
                    prefix,
                }
            }
        };
        Ok(FileSinkConfig {
            url: dir.to_owned(),
            dir: directory,
            options,
        })
    }

    /// A sink from a URL with its options as query parameters:
    /// `DIR?format=csv|jsonl|parquet[&header=true][&bucket=PATTERN]`
    /// `[&roll-size=BYTES][&roll-interval=1m][&part-size=BYTES]`.
    pub fn from_url(url: &str) -> Result<Self, FileSinkError> {
        let (dir, query) = url.split_once('?').unwrap_or((url, ""));
        let problem = |problem: String| FileSinkError::Option {
            url: url.to_owned(),
            problem,
        };
        let mut options = FileSinkOptions::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| problem(format!("{pair:?} is not KEY=VALUE")))?;
            let bytes = || {
                value
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| problem(format!("{key}={value}: expected bytes > 0")))
            };
            match key {
                "format" => {
                    options.format = match value {
                        "csv" => Format::Csv,
                        "jsonl" | "json" => Format::JsonLines,
                        "parquet" => Format::Parquet,
                        other => {
                            return Err(problem(format!(
                                "format={other}: expected csv, jsonl or parquet"
                            )))
                        }
                    }
                }
                "header" => {
                    options.header = value
                        .parse()
                        .map_err(|_| problem(format!("header={value}: expected true or false")))?
                }
                "bucket" => options.bucket = Some(value.to_owned()),
                "roll-size" => options.roll.size = bytes()?,
                "roll-interval" => {
                    options.roll.interval = humantime::parse_duration(value)
                        .map_err(|e| problem(format!("{key}={value}: {e}")))?
                }
                "part-size" => {
                    options.part_size = usize::try_from(bytes()?)
                        .map_err(|_| problem(format!("part-size={value} is too large")))?
                }
                other => return Err(problem(format!("unknown option {other:?}"))),
            }
        }
        Self::new(dir, options)
    }

    /// Its settings.
    pub fn options(&self) -> &FileSinkOptions {
        &self.options
    }

    /// The directory, as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The multipart uploads the directory holds open (none in a local
    /// one): those of running jobs, those a checkpoint pre-committed, and
    /// those a dead run left, which readers never see but the store keeps
    /// (and bills) until they are aborted.
    pub async fn open_uploads(&self) -> Result<Vec<OpenUpload>, FileSinkError> {
        self.dir
            .open_uploads("")
            .await
            .map_err(|source| self.store_error(source))
    }

    /// Aborts `upload` and forgets it.
    pub async fn abort(&self, upload: &OpenUpload) -> Result<(), FileSinkError> {
        self.dir
            .abort(upload)
            .await
            .map_err(|source| self.store_error(source))
    }

    fn store_error(&self, source: object_store::Error) -> FileSinkError {
        FileSinkError::Store {
            url: self.url.clone(),
            source,
        }
    }
}

/// The ids of the uploads a file sink's checkpointed `state` pre-committed,
/// which its restore will complete; `None` if `state` is not a file sink's.
pub fn pending_uploads(state: &[u8]) -> Option<Vec<String>> {
    let state: PartsState<Pending> = rmp_serde::from_slice(state).ok()?;
    Some(
        state
            .pending
            .into_iter()
            .filter_map(|(_, p)| p.upload.map(|u| u.id))
            .collect(),
    )
}

/// A `strftime` pattern that names buckets: every item known, and no
/// component that would leave the directory or hide its files.
fn check_bucket_pattern(pattern: &str) -> Result<(), String> {
    chrono::format::StrftimeItems::new(pattern)
        .parse()
        .map_err(|e| format!("bucket={pattern}: {e}"))?;
    check_bucket(pattern).map_err(|e| format!("bucket={pattern}: {e}"))
}

/// A bucket is a relative path whose components are plain names.
fn check_bucket(bucket: &str) -> Result<(), String> {
    match bucket
        .split('/')
        .find(|c| c.is_empty() || c.starts_with('.') || c.starts_with('_'))
    {
        Some(_) if bucket.is_empty() => Ok(()),
        Some(c) => Err(format!(
            "bucket {bucket:?} has the component {c:?}: empty, `.`/`_` names are hidden or leave the directory"
        )),
        None => Ok(()),
    }
}

/// Names the bucket of a record: a relative path, `""` for the sink's
/// directory itself.
pub type BucketBy<T> = Arc<dyn Fn(&T) -> String + Send + Sync>;

/// An open part file.
struct OpenFile<T> {
    path: String,
    stage: Stage,
    encoder: Box<dyn Encoder<T>>,
    /// Encoded, not yet appended.
    buffer: Vec<u8>,
}

/// The exactly-once file sink of one subtask.
pub struct FileSink<T> {
    dir: Directory,
    options: FileSinkOptions,
    subtask: u32,
    /// The job run's name, which every attempt's file names start with.
    run: String,
    encoder: EncoderFactory<T>,
    bucket_by: Option<BucketBy<T>>,
    parts: Parts<OpenFile<T>, Pending>,
}

impl<T: Row> FileSink<T> {
    /// Subtask `ctx`'s sink of records as rows in the configured format;
    /// `run` keeps the files of one run of the job apart from another's.
    pub fn new(config: &FileSinkConfig, run: &str, ctx: SinkContext) -> Self {
        let header = config.options.header;
        let encoder: EncoderFactory<T> = match config.options.format {
            Format::JsonLines => Arc::new(|| Box::new(JsonLines::new::<T>())),
            #[cfg(feature = "parquet")]
            Format::Parquet => Arc::new(|| Box::new(Parquet::new::<T>())),
            _ => Arc::new(move || Box::new(Csv::new::<T>(header))),
        };
        Self::with_encoder(config, run, ctx, encoder)
    }
}

impl<T: Send + 'static> FileSink<T> {
    /// A sink that encodes records with `encoder`'s encoders instead.
    pub fn with_encoder(
        config: &FileSinkConfig,
        run: &str,
        ctx: SinkContext,
        encoder: EncoderFactory<T>,
    ) -> Self {
        FileSink {
            dir: config.dir.clone(),
            options: config.options.clone(),
            subtask: ctx.subtask.0,
            run: run.to_owned(),
            encoder,
            bucket_by: None,
            parts: Parts::new(
                fresh_run(run, ctx.attempt),
                ctx.subtask.0,
                config.options.roll,
            ),
        }
    }

    /// Buckets records by `bucket` instead of by the time they are written.
    pub fn bucket_by(mut self, bucket: BucketBy<T>) -> Self {
        self.bucket_by = Some(bucket);
        self
    }

    fn suffix(&self) -> &'static str {
        match self.options.format {
            Format::JsonLines => ".jsonl",
            Format::Parquet => ".parquet",
            _ => ".csv",
        }
    }

    /// The bucket of every record of a batch written `now`, unless each
    /// record names its own.
    fn batch_bucket(&self, now: SystemTime) -> Option<String> {
        if self.bucket_by.is_some() {
            return None;
        }
        Some(match &self.options.bucket {
            Some(pattern) => chrono::DateTime::<chrono::Utc>::from(now)
                .format(pattern)
                .to_string(),
            None => String::new(),
        })
    }

    fn write_one(&mut self, bucket: &str, record: &T, now_ms: u64) -> Result<(), UserError> {
        if self.parts.open_file(bucket).is_none() {
            check_bucket(bucket)?;
            let name = self.parts.next_name(self.suffix());
            let path = match bucket {
                "" => name,
                bucket => format!("{bucket}/{name}"),
            };
            let file = OpenFile {
                stage: self.dir.begin(&path)?,
                path,
                encoder: (self.encoder)(),
                buffer: Vec::new(),
            };
            self.parts.opened(bucket.to_owned(), file, now_ms);
        }
        let part_size = match self.dir {
            Directory::Local(_) => 1 << 20,
            Directory::Objects { .. } => self.options.part_size,
        };
        let file = self.parts.open_file(bucket).expect("just opened");
        let before = file.buffer.len() as u64 + file.encoder.held();
        file.encoder.encode(record, &mut file.buffer)?;
        let grew = (file.buffer.len() as u64 + file.encoder.held()).saturating_sub(before);
        if file.buffer.len() >= part_size {
            let bytes = std::mem::take(&mut file.buffer);
            self.dir.append(&mut file.stage, &file.path, bytes)?;
        }
        if self.parts.wrote(bucket, grew) {
            self.roll(bucket)?;
        }
        Ok(())
    }

    fn roll(&mut self, bucket: &str) -> Result<(), UserError> {
        if let Some(file) = self.parts.roll(bucket) {
            self.seal(file)?;
        }
        Ok(())
    }

    fn roll_all(&mut self) -> Result<(), UserError> {
        for file in self.parts.roll_all() {
            self.seal(file)?;
        }
        Ok(())
    }

    /// Ends `file`'s encoding and makes it pending.
    fn seal(&mut self, mut file: OpenFile<T>) -> Result<(), UserError> {
        file.encoder.finish(&mut file.buffer)?;
        let pending = self.dir.seal(file.stage, &file.path, file.buffer)?;
        self.parts.sealed(pending);
        Ok(())
    }

    fn commit_all(&self, pending: &[Pending]) -> Result<(), UserError> {
        pending.iter().try_for_each(|p| self.dir.commit(p))
    }

    /// Commits what a checkpoint's `state` pre-committed, then aborts
    /// whatever else its run and subtask left.
    fn settle(&self, pending: &[Pending], subtask: u32, run: &str) -> Result<(), UserError> {
        self.commit_all(pending)?;
        let aborted = self.dir.abort_leftovers(subtask, run)?;
        tracing::info!(
            subtask,
            run,
            committed = pending.len(),
            aborted,
            "file sink restored"
        );
        Ok(())
    }
}

/// The run a sink without state names its files after in `attempt`.
fn fresh_run(run: &str, attempt: Attempt) -> String {
    match attempt.0 {
        0 => run.to_owned(),
        n => format!("{run}.{n}"),
    }
}

fn decode(state: &[u8]) -> Result<PartsState<Pending>, UserError> {
    rmp_serde::from_slice(state)
        .map_err(|e| format!("the file sink's checkpointed state does not decode ({e}): was it written by another sink?").into())
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl<T: Send + 'static> Sink<T> for FileSink<T> {
    fn write(&mut self, records: &mut Vec<T>) -> Result<(), UserError> {
        let now = SystemTime::now();
        let now_ms = millis(now);
        let batch_bucket = self.batch_bucket(now);
        for record in records.iter() {
            let bucket = match (&batch_bucket, &self.bucket_by) {
                (Some(bucket), _) => Cow::Borrowed(bucket.as_str()),
                (None, Some(by)) => Cow::Owned(by(record)),
                (None, None) => unreachable!("a batch bucket or one per record"),
            };
            self.write_one(&bucket, record, now_ms)?;
        }
        for bucket in self.parts.due_by_time(now_ms) {
            self.roll(&bucket)?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), UserError> {
        self.roll_all()?;
        let all = self.parts.finish();
        self.commit_all(&all)
    }

    fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<Vec<u8>, UserError> {
        self.roll_all()?;
        Ok(rmp_serde::to_vec(&self.parts.pre_commit(checkpoint))?)
    }

    fn commit(&mut self, checkpoint: CheckpointId) -> Result<(), UserError> {
        let due = self.parts.complete(checkpoint);
        self.commit_all(&due)
    }

    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), UserError> {
        let Some(bytes) = state else {
            // Whatever the subtask of this index left in any attempt of
            // the run was never committed.
            return self.settle(&[], self.subtask, &self.run);
        };
        let state = decode(bytes)?;
        if state.subtask != self.subtask {
            return Err(format!(
                "sink subtask {} was given the state of subtask {}",
                self.subtask, state.subtask
            )
            .into());
        }
        let pending = self.parts.restore(state);
        let run = self.parts.run().to_owned();
        self.settle(&pending, self.subtask, &run)
    }

    /// Commits what a subtask that a rescale removed pre-committed and
    /// aborts what it left after.
    fn adopt(&mut self, state: &[u8]) -> Result<(), UserError> {
        let state = decode(state)?;
        let pending: Vec<Pending> = state.pending.into_iter().map(|(_, p)| p).collect();
        self.settle(&pending, state.subtask, &state.run)
    }
}
