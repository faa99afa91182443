//! Reading one split of a line file: a task on the IO runtime fetches its
//! bytes a chunk ahead, and the subtask cuts and decodes the lines as the
//! chunks arrive, never waiting for them.

use super::lines::{Lines, Next};
use super::{FileSplit, Format, OnError};
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::de::{DeserializeOwned, IntoDeserializer};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tidemark_core::dataflow::source::{SourceStatus, SplitReader};
use tidemark_core::UserError;
use tokio::sync::mpsc;

/// Bytes fetched per request within the split.
const CHUNK: u64 = 4 << 20;
/// Bytes fetched per request past the split's end, where only the rest of
/// its last line is wanted (and for a CSV header).
const TAIL: u64 = 64 << 10;
/// Chunks fetched ahead of the reader.
const AHEAD: usize = 2;
/// The longest CSV header line read.
const MAX_HEADER: u64 = 1 << 20;

enum Fetched {
    /// A CSV file's first line, before any bytes.
    Header(Bytes),
    Bytes(Bytes),
}

/// The reader of one [`FileSplit`].
pub(super) struct FileSplitReader<T> {
    split: FileSplit,
    lines: Lines,
    fetched: mpsc::Receiver<Result<Fetched, String>>,
    format: Format,
    header: Option<csv::StringRecord>,
    on_error: OnError,
    skipped: Arc<AtomicU64>,
    records: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> FileSplitReader<T> {
    /// Starts fetching `split` from its position.
    pub fn open(
        store: Arc<dyn ObjectStore>,
        split: FileSplit,
        format: Format,
        on_error: OnError,
        skipped: Arc<AtomicU64>,
    ) -> Result<Self, UserError> {
        let (lines, from) = Lines::new(split.start, split.end, split.offset, split.size);
        let path = Path::parse(&split.path).map_err(|e| format!("a bad path in a split: {e}"))?;
        let (sender, fetched) = mpsc::channel(AHEAD);
        let header = format == Format::Csv;
        let range = Fetch {
            from,
            end: split.end,
            size: split.size,
            header,
        };
        crate::io::spawn(fetch(store, path, range, sender));
        Ok(FileSplitReader {
            split,
            lines,
            fetched,
            format,
            header: None,
            on_error,
            skipped,
            records: PhantomData,
        })
    }

    /// A malformed line at `offset`: the job's error, or skipped.
    fn malformed(&self, offset: u64, reason: String) -> Result<(), UserError> {
        match self.on_error {
            OnError::Fail => Err(format!("{}, byte {offset}: {reason}", self.split.path).into()),
            OnError::Skip => {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(file = %self.split.path, offset, %reason, "skipped a malformed line");
                Ok(())
            }
        }
    }
}

impl<T: DeserializeOwned> SplitReader<T, FileSplit> for FileSplitReader<T> {
    fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, UserError> {
        let mut read = 0;
        loop {
            while read < max {
                let (offset, decoded) = match self.lines.next_line() {
                    Next::Line {
                        offset,
                        next,
                        bytes,
                    } => {
                        self.split.offset = next;
                        if self.format == Format::Csv && offset == 0 {
                            continue;
                        }
                        (
                            offset,
                            decode::<T>(self.format, self.header.as_ref(), bytes),
                        )
                    }
                    Next::NeedMore => break,
                    Next::Done => {
                        // Whatever the fetch has ahead is not wanted.
                        self.fetched.close();
                        return Ok(SourceStatus::Finished);
                    }
                };
                match decoded {
                    Ok(Some(record)) => {
                        out.push(record);
                        read += 1;
                    }
                    Ok(None) => {}
                    Err(reason) => self.malformed(offset, reason)?,
                }
            }
            if read >= max {
                return Ok(SourceStatus::Running);
            }
            match super::received(&mut self.fetched, &self.split.path)? {
                Some(Fetched::Bytes(bytes)) => self.lines.push(&bytes),
                Some(Fetched::Header(line)) => {
                    let line = line.strip_suffix(b"\r").unwrap_or(&line);
                    let header = csv_record(line)
                        .map_err(|e| format!("{}: a malformed CSV header: {e}", self.split.path))?;
                    self.header = Some(header);
                }
                None => return Ok(SourceStatus::Running),
            }
        }
    }

    fn split(&self) -> FileSplit {
        self.split.clone()
    }
}

/// One line as a record; `None` for a blank line of JSON.
fn decode<T: DeserializeOwned>(
    format: Format,
    header: Option<&csv::StringRecord>,
    line: &[u8],
) -> Result<Option<T>, String> {
    match format {
        Format::Text => {
            let text = std::str::from_utf8(line).map_err(|e| format!("not UTF-8: {e}"))?;
            let text: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
                text.into_deserializer();
            T::deserialize(text).map(Some).map_err(|e| e.to_string())
        }
        Format::JsonLines => {
            if line.iter().all(u8::is_ascii_whitespace) {
                return Ok(None);
            }
            serde_json::from_slice(line)
                .map(Some)
                .map_err(|e| format!("not a JSON record: {e}"))
        }
        Format::Csv => {
            let record = csv_record(line)?;
            record
                .deserialize(header)
                .map(Some)
                .map_err(|e| format!("not a CSV record: {e}"))
        }
        Format::Parquet => unreachable!("the file source refuses Parquet"),
    }
}

fn csv_record(line: &[u8]) -> Result<csv::StringRecord, String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(line);
    let mut record = csv::StringRecord::new();
    reader.read_record(&mut record).map_err(|e| e.to_string())?;
    Ok(record)
}

/// What to fetch of a file.
struct Fetch {
    /// The first byte.
    from: u64,
    /// The split's end: past it, only its last line's rest is wanted.
    end: u64,
    /// The file's size.
    size: u64,
    /// Fetch the first line first, as a CSV header.
    header: bool,
}

/// Fetches `range` of `path` chunk by chunk into `sender` until the file
/// ends or the reader is gone.
async fn fetch(
    store: Arc<dyn ObjectStore>,
    path: Path,
    range: Fetch,
    sender: mpsc::Sender<Result<Fetched, String>>,
) {
    if range.header {
        let first = header(store.as_ref(), &path, range.size)
            .await
            .map(Fetched::Header);
        let failed = first.is_err();
        if sender.send(first).await.is_err() || failed {
            return;
        }
    }
    let mut at = range.from;
    while at < range.size {
        let step = if at < range.end {
            CHUNK.min(range.end - at)
        } else {
            TAIL
        };
        let to = at.saturating_add(step).min(range.size);
        let fetched = store
            .get_range(&path, at..to)
            .await
            .map(Fetched::Bytes)
            .map_err(|e| e.to_string());
        let failed = fetched.is_err();
        if sender.send(fetched).await.is_err() || failed {
            return;
        }
        at = to;
    }
}

/// The first line of a file of `size` bytes, read `TAIL` bytes at a time
/// up to `MAX_HEADER`.
async fn header(store: &dyn ObjectStore, path: &Path, size: u64) -> Result<Bytes, String> {
    let mut line = Vec::new();
    let mut at = 0;
    while at < size.min(MAX_HEADER) {
        let to = (at + TAIL).min(size).min(MAX_HEADER);
        let bytes = match store.get_range(path, at..to).await {
            Ok(bytes) => bytes,
            Err(e) => return Err(e.to_string()),
        };
        if let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&bytes[..end]);
            return Ok(line.into());
        }
        line.extend_from_slice(&bytes);
        at = to;
    }
    if size <= MAX_HEADER {
        Ok(line.into())
    } else {
        Err(format!(
            "no CSV header line in its first {MAX_HEADER} bytes"
        ))
    }
}
