//! Parquet files as splits: one per row group, its position the rows read.
//! The enumerator reads each new file's footer to cut it; a reader streams
//! its row group's record batches from the IO runtime, a batch ahead, and
//! turns their rows into records through serde (`serde_arrow`), columns
//! matched to fields by name.

use super::{FileSplit, OnError};
use arrow_array::RecordBatch;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use serde::de::DeserializeOwned;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tidemark_core::dataflow::source::{SourceStatus, SplitReader};
use tidemark_core::UserError;
use tokio::sync::mpsc;

/// Rows per record batch read.
const BATCH: usize = 8192;

/// A Parquet file of a store, of a size known from its listing.
struct StoreFile {
    store: Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
}

fn parquet_error(e: object_store::Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

impl AsyncFileReader for StoreFile {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            self.store
                .get_range(&self.path, range)
                .await
                .map_err(parquet_error)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            self.store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(parquet_error)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.size;
            let metadata = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

/// The splits of the Parquet file `path` of `size` bytes: its row groups.
pub(super) async fn row_groups(
    store: Arc<dyn ObjectStore>,
    path: &Path,
    size: u64,
) -> Result<Vec<FileSplit>, ParquetError> {
    let file = StoreFile {
        store,
        path: path.clone(),
        size,
    };
    let builder = ParquetRecordBatchStreamBuilder::new(file).await?;
    let splits = builder
        .metadata()
        .row_groups()
        .iter()
        .enumerate()
        .map(|(group, meta)| FileSplit {
            path: path.to_string(),
            size,
            start: 0,
            end: u64::try_from(meta.num_rows()).unwrap_or(0),
            offset: 0,
            row_group: Some(group),
        })
        .collect();
    Ok(splits)
}

enum Fetched {
    Batch(RecordBatch),
    End,
}

/// The reader of one row group.
pub(super) struct ParquetSplitReader<T> {
    split: FileSplit,
    fetched: mpsc::Receiver<Result<Fetched, String>>,
    decoded: VecDeque<T>,
    on_error: OnError,
    skipped: Arc<AtomicU64>,
    ended: bool,
    records: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned + Send> ParquetSplitReader<T> {
    /// Starts reading `split` from its position.
    pub fn open(
        store: Arc<dyn ObjectStore>,
        split: FileSplit,
        on_error: OnError,
        skipped: Arc<AtomicU64>,
    ) -> Result<Self, UserError> {
        let path = Path::parse(&split.path).map_err(|e| format!("a bad path in a split: {e}"))?;
        let group = split.row_group.expect("a Parquet split is a row group");
        let (sender, fetched) = mpsc::channel(1);
        let read = Read {
            size: split.size,
            group,
            from: usize::try_from(split.offset).unwrap_or(usize::MAX),
        };
        crate::io::spawn(fetch(store, path, read, sender));
        Ok(ParquetSplitReader {
            split,
            fetched,
            decoded: VecDeque::new(),
            on_error,
            skipped,
            ended: false,
            records: PhantomData,
        })
    }

    /// Turns `batch` into records, or counts them skipped.
    fn decode(&mut self, batch: &RecordBatch) -> Result<(), UserError> {
        match serde_arrow::from_record_batch::<Vec<T>>(batch) {
            Ok(records) => self.decoded.extend(records),
            Err(e) => {
                let at = self.split.offset + self.decoded.len() as u64;
                let reason = format!(
                    "{}, row group {:?}, row {at}: not a record: {e}",
                    self.split.path, self.split.row_group
                );
                match self.on_error {
                    OnError::Fail => return Err(reason.into()),
                    OnError::Skip => {
                        let rows = batch.num_rows() as u64;
                        self.skipped.fetch_add(rows, Ordering::Relaxed);
                        // Skipped rows count as read.
                        self.split.offset += rows;
                        tracing::warn!(%reason, rows, "skipped a batch of malformed rows");
                    }
                }
            }
        }
        Ok(())
    }
}

impl<T: DeserializeOwned + Send> SplitReader<T, FileSplit> for ParquetSplitReader<T> {
    fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, UserError> {
        let mut read = 0;
        loop {
            while read < max {
                let Some(record) = self.decoded.pop_front() else {
                    break;
                };
                out.push(record);
                self.split.offset += 1;
                read += 1;
            }
            if read >= max {
                return Ok(SourceStatus::Running);
            }
            if self.ended {
                return Ok(SourceStatus::Finished);
            }
            match super::received(&mut self.fetched, &self.split.path)? {
                Some(Fetched::Batch(batch)) => self.decode(&batch)?,
                Some(Fetched::End) => self.ended = true,
                None => return Ok(SourceStatus::Running),
            }
        }
    }

    fn split(&self) -> FileSplit {
        self.split.clone()
    }
}

/// What to read of a file.
struct Read {
    size: u64,
    group: usize,
    /// Rows of the group already read.
    from: usize,
}

/// Streams `read`'s batches into `sender` until the group ends or the
/// reader is gone.
async fn fetch(
    store: Arc<dyn ObjectStore>,
    path: Path,
    read: Read,
    sender: mpsc::Sender<Result<Fetched, String>>,
) {
    let opened = async {
        let file = StoreFile {
            store,
            path,
            size: read.size,
        };
        ParquetRecordBatchStreamBuilder::new(file)
            .await?
            .with_row_groups(vec![read.group])
            .with_offset(read.from)
            .with_batch_size(BATCH)
            .build()
    };
    let mut stream = match opened.await {
        Ok(stream) => stream,
        Err(e) => {
            let _ = sender.send(Err(e.to_string())).await;
            return;
        }
    };
    while let Some(batch) = stream.next().await {
        let fetched = batch.map(Fetched::Batch).map_err(|e| e.to_string());
        let failed = fetched.is_err();
        if sender.send(fetched).await.is_err() || failed {
            return;
        }
    }
    let _ = sender.send(Ok(Fetched::End)).await;
}
