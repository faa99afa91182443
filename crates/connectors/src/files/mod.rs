//! Files on any object store. Read by a split source of the files under a
//! directory, as Flink's `FileSource`: newline-delimited JSON, CSV with a
//! header, or plain text lines. Written exactly once by [`sink::FileSink`].
//!
//! A split is a byte range of a file, aligned to its lines (a whole file
//! if it is smaller than the split size); its position is the offset of the
//! next line to read. A bounded source reads what exists when the job
//! starts; with a monitor interval it lists the directory again and reads
//! each new file once. Files and directories whose name starts with `.` or
//! `_` are skipped (files in progress, `_SUCCESS` markers), as Flink does;
//! a file must be complete when it appears under its final name.

mod enumerator;
mod lines;
#[cfg(feature = "parquet")]
mod parquet;
mod reader;
pub mod sink;

pub use enumerator::SeenFiles;

use object_store::ObjectStore;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tidemark_core::dataflow::source::{
    DiscoveryFuture, SourceSplit, SplitEnumerator, SplitReader, SplitSource,
};
use tidemark_core::UserError;
use tidemark_storage::{Location, StorageError};

/// How the lines of a file are records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Each line is a string.
    Text,
    /// Each line is a JSON value (blank lines are skipped).
    JsonLines,
    /// Each line after the header is a row, its fields named by the
    /// header's. Quoted fields must not hold a newline.
    Csv,
    /// Parquet (feature `parquet`): a split per row group, its columns
    /// the record's fields.
    Parquet,
}

/// What a line that is not a record does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    /// The job fails, naming the file, the offset and the reason.
    Fail,
    /// The line is skipped and counted ([`FileSource::skipped`]).
    Skip,
}

/// A source's settings that a URL or the builder give.
#[derive(Clone, Debug)]
pub struct FileSourceOptions {
    /// How lines are records.
    pub format: Format,
    /// List again this often for new files; `None`: bounded.
    pub monitor_interval: Option<Duration>,
    /// Files larger than this are read as several splits.
    pub split_size: u64,
    /// What a malformed line does.
    pub on_error: OnError,
    /// How much later than the newest file seen a new file's modification
    /// time may be and still be found (continuous sources only): the
    /// enumerator remembers the files of this window, not every file.
    pub late_files: Duration,
}

impl Default for FileSourceOptions {
    fn default() -> Self {
        FileSourceOptions {
            format: Format::Text,
            monitor_interval: None,
            split_size: 64 << 20,
            on_error: OnError::Fail,
            late_files: Duration::from_secs(600),
        }
    }
}

/// A file source that cannot be opened.
#[derive(Debug, Error)]
pub enum FileSourceError {
    /// A setting of the URL is wrong.
    #[error("file source {url}: {problem}")]
    Option {
        /// The source's URL.
        url: String,
        /// What is wrong.
        problem: String,
    },
    /// The directory's store cannot be opened.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Files under a directory, read as records `T`: the split source.
pub struct FileSource<T> {
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: object_store::path::Path,
    options: FileSourceOptions,
    skipped: Arc<AtomicU64>,
    records: PhantomData<fn() -> T>,
}

impl<T> Clone for FileSource<T> {
    fn clone(&self) -> Self {
        self.records()
    }
}

impl<T> FileSource<T> {
    /// The files under `dir` (a path, `file://`, `s3://bucket/prefix`,
    /// `memory://NAME/prefix` or `store://NAME/prefix`), which must exist.
    pub fn new(dir: &str, options: FileSourceOptions) -> Result<Self, FileSourceError> {
        if options.split_size == 0 {
            return Err(FileSourceError::Option {
                url: dir.to_owned(),
                problem: "the split size must be at least one byte".into(),
            });
        }
        if options.format == Format::Parquet && cfg!(not(feature = "parquet")) {
            return Err(FileSourceError::Option {
                url: dir.to_owned(),
                problem: "format=parquet needs the `parquet` feature of tidemark-connectors".into(),
            });
        }
        let Location { store, prefix, .. } = Location::open(dir, false)?;
        Ok(FileSource {
            url: dir.to_owned(),
            store,
            prefix,
            options,
            skipped: Arc::default(),
            records: PhantomData,
        })
    }

    /// A source from a URL with its options as query parameters:
    /// `DIR?format=text|jsonl|csv[&monitor-interval=1s][&split-size=BYTES]`
    /// `[&on-error=fail|skip][&late-files=10m]`.
    pub fn from_url(url: &str) -> Result<Self, FileSourceError> {
        let (dir, query) = url.split_once('?').unwrap_or((url, ""));
        let problem = |problem: String| FileSourceError::Option {
            url: url.to_owned(),
            problem,
        };
        let mut options = FileSourceOptions::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| problem(format!("{pair:?} is not KEY=VALUE")))?;
            let duration = || {
                humantime::parse_duration(value).map_err(|e| problem(format!("{key}={value}: {e}")))
            };
            match key {
                "format" => {
                    options.format = match value {
                        "text" => Format::Text,
                        "jsonl" | "json" => Format::JsonLines,
                        "csv" => Format::Csv,
                        "parquet" => Format::Parquet,
                        other => {
                            return Err(problem(format!(
                                "format={other}: expected text, jsonl, csv or parquet"
                            )))
                        }
                    }
                }
                "monitor-interval" => options.monitor_interval = Some(duration()?),
                "late-files" => options.late_files = duration()?,
                "split-size" => {
                    options.split_size =
                        value.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                            problem(format!("split-size={value}: expected bytes > 0"))
                        })?
                }
                "on-error" => {
                    options.on_error = match value {
                        "fail" => OnError::Fail,
                        "skip" => OnError::Skip,
                        other => {
                            return Err(problem(format!("on-error={other}: expected fail or skip")))
                        }
                    }
                }
                other => return Err(problem(format!("unknown option {other:?}"))),
            }
        }
        Self::new(dir, options)
    }

    /// Malformed lines skipped so far (with [`OnError::Skip`]), by every
    /// reader of this process.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Its settings.
    pub fn options(&self) -> &FileSourceOptions {
        &self.options
    }

    /// The same files, read as records `U`.
    pub fn records<U>(&self) -> FileSource<U> {
        FileSource {
            url: self.url.clone(),
            store: self.store.clone(),
            prefix: self.prefix.clone(),
            options: self.options.clone(),
            skipped: self.skipped.clone(),
            records: PhantomData,
        }
    }
}

/// A byte range of a line file, or a row group of a Parquet file, read up
/// to `offset`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSplit {
    /// The file's path within its store.
    pub path: String,
    /// Its size when it was found.
    pub size: u64,
    /// The range's first byte: the split reads the lines starting in
    /// `start..end`.
    pub start: u64,
    /// One past the range's last byte.
    pub end: u64,
    /// Where the next line to read starts (`start` before the first).
    pub offset: u64,
    /// A Parquet file's row group: then `start..end` and `offset` count
    /// its rows, not bytes.
    #[serde(default)]
    pub row_group: Option<usize>,
}

impl SourceSplit for FileSplit {
    fn split_id(&self) -> String {
        match self.row_group {
            Some(group) => format!("{}#{group}", self.path),
            None => format!("{}@{}", self.path, self.start),
        }
    }
}

impl<T: Send + 'static> SplitEnumerator for FileSource<T> {
    type Split = FileSplit;
    type State = SeenFiles;

    fn discover(
        &self,
        seen: SeenFiles,
        _parallelism: u32,
    ) -> DiscoveryFuture<FileSplit, SeenFiles> {
        let listing = enumerator::Listing {
            store: self.store.clone(),
            prefix: self.prefix.clone(),
            split_size: self.options.split_size,
            late_files: self.options.late_files,
            format: self.options.format,
            on_error: self.options.on_error,
            skipped: self.skipped.clone(),
        };
        let url = self.url.clone();
        Box::pin(async move {
            crate::io::spawn(listing.discover(seen))
                .await
                .map_err(|e| -> UserError { format!("listing {url} stopped: {e}").into() })?
                .map_err(|e| -> UserError { format!("cannot list {url}: {e}").into() })
        })
    }

    fn monitor_interval(&self) -> Option<Duration> {
        self.options.monitor_interval
    }
}

impl<T: DeserializeOwned + Send + 'static> SplitSource<T> for FileSource<T> {
    fn open(&self, split: FileSplit) -> Result<Box<dyn SplitReader<T, FileSplit>>, UserError> {
        #[cfg(feature = "parquet")]
        if split.row_group.is_some() {
            return Ok(Box::new(parquet::ParquetSplitReader::open(
                self.store.clone(),
                split,
                self.options.on_error,
                self.skipped.clone(),
            )?));
        }
        Ok(Box::new(reader::FileSplitReader::open(
            self.store.clone(),
            split,
            self.options.format,
            self.options.on_error,
            self.skipped.clone(),
        )?))
    }
}

/// The next chunk a split's fetch task sent, `None` while none has come:
/// a failed fetch, or one gone without a word, is an error naming the file.
fn received<F>(
    fetched: &mut tokio::sync::mpsc::Receiver<Result<F, String>>,
    path: &str,
) -> Result<Option<F>, UserError> {
    use tokio::sync::mpsc::error::TryRecvError;
    match fetched.try_recv() {
        Ok(Ok(chunk)) => Ok(Some(chunk)),
        Ok(Err(e)) => Err(format!("cannot read {path}: {e}").into()),
        Err(TryRecvError::Empty) => Ok(None),
        Err(TryRecvError::Disconnected) => {
            Err(format!("reading {path} stopped unexpectedly").into())
        }
    }
}

#[cfg(test)]
mod tests;
