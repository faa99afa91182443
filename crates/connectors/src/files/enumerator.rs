//! Finding the files of a file source: a listing of its directory, against
//! the files already found.

use super::{FileSplit, Format, OnError};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tidemark_core::dataflow::source::Discovery;

/// The files a file source has found, kept bounded: every file modified
/// before `horizon` counts as found, and those modified at or after it are
/// named. The horizon trails the newest modification time found, and the
/// time of the listing, by the source's `late_files`: a file that appears
/// with an older modification time than that is not read, and a file
/// stamped in the future cannot push the horizon past files still to come.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenFiles {
    /// Milliseconds since the Unix epoch; `None` before any file.
    pub horizon: Option<i64>,
    /// The files found that were modified at or after the horizon, by path, with
    /// their modification time.
    pub recent: BTreeMap<String, i64>,
}

impl SeenFiles {
    /// Whether the file is new to it.
    fn is_new(&self, path: &str, modified: i64) -> bool {
        self.horizon.is_none_or(|h| modified >= h) && !self.recent.contains_key(path)
    }

    /// Moves the horizon up to `late` before the newest file found (but
    /// not past `late` before `now`, the listing's time in Unix
    /// milliseconds), and forgets the names below it.
    fn advance(&mut self, late: Duration, now: i64) {
        let Some(newest) = self.recent.values().copied().max() else {
            return;
        };
        let late = i64::try_from(late.as_millis()).unwrap_or(i64::MAX);
        let horizon = newest
            .min(now)
            .saturating_sub(late)
            .max(self.horizon.unwrap_or(i64::MIN));
        self.horizon = Some(horizon);
        self.recent.retain(|_, modified| *modified >= horizon);
    }
}

/// One discovery's view of the source.
pub(super) struct Listing {
    pub store: Arc<dyn ObjectStore>,
    pub prefix: Path,
    pub split_size: u64,
    pub late_files: Duration,
    pub format: Format,
    pub on_error: OnError,
    pub skipped: Arc<AtomicU64>,
}

impl Listing {
    /// The splits of the files new to `seen`, oldest file first, and what
    /// is seen after them.
    pub async fn discover(
        self,
        mut seen: SeenFiles,
    ) -> Result<Discovery<FileSplit, SeenFiles>, object_store::Error> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let listed: Vec<ObjectMeta> = self.store.list(Some(&self.prefix)).try_collect().await?;
        let mut new: Vec<(i64, String, u64)> = listed
            .into_iter()
            .filter(|meta| !self.hidden(&meta.location))
            .map(|meta| {
                let modified = meta.last_modified.timestamp_millis();
                (modified, meta.location.to_string(), meta.size)
            })
            .filter(|(modified, path, _)| seen.is_new(path, *modified))
            .collect();
        new.sort();
        let mut splits = Vec::new();
        for (modified, path, size) in new {
            seen.recent.insert(path.clone(), modified);
            if self.format == Format::Parquet {
                splits.extend(self.row_groups(&path, size).await?);
                continue;
            }
            let mut start = 0;
            while start < size {
                let end = start.saturating_add(self.split_size).min(size);
                splits.push(FileSplit {
                    path: path.clone(),
                    size,
                    start,
                    end,
                    offset: start,
                    row_group: None,
                });
                start = end;
            }
        }
        seen.advance(self.late_files, now);
        Ok(Discovery {
            splits,
            state: seen,
        })
    }

    /// The row groups of a Parquet file; none, counted as skipped, for a
    /// file that is not Parquet when the source skips what it cannot read.
    async fn row_groups(
        &self,
        path: &str,
        size: u64,
    ) -> Result<Vec<FileSplit>, object_store::Error> {
        match self.parquet_row_groups(path, size).await {
            Ok(splits) => Ok(splits),
            Err(reason) if self.on_error == OnError::Skip => {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(file = path, %reason, "skipped a file that is not Parquet");
                Ok(Vec::new())
            }
            Err(reason) => Err(object_store::Error::Generic {
                store: "parquet",
                source: format!("{path} is not a Parquet file: {reason}").into(),
            }),
        }
    }

    #[cfg(feature = "parquet")]
    async fn parquet_row_groups(&self, path: &str, size: u64) -> Result<Vec<FileSplit>, String> {
        let location = Path::parse(path).map_err(|e| e.to_string())?;
        super::parquet::row_groups(self.store.clone(), &location, size)
            .await
            .map_err(|e| e.to_string())
    }

    #[cfg(not(feature = "parquet"))]
    async fn parquet_row_groups(&self, _: &str, _: u64) -> Result<Vec<FileSplit>, String> {
        Err("this build reads no Parquet (cargo feature `parquet`)".into())
    }

    /// A file or directory under the prefix whose name starts with `.` or
    /// `_`.
    fn hidden(&self, path: &Path) -> bool {
        let Some(parts) = path.prefix_match(&self.prefix) else {
            return true;
        };
        parts
            .into_iter()
            .any(|part| part.as_ref().starts_with(['.', '_']))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(horizon: Option<i64>, recent: &[(&str, i64)]) -> SeenFiles {
        SeenFiles {
            horizon,
            recent: recent.iter().map(|(p, m)| (p.to_string(), *m)).collect(),
        }
    }

    #[test]
    fn the_horizon_trails_the_newest_file_and_the_listing_by_the_lateness() {
        let late = Duration::from_millis(10);
        let mut s = seen(None, &[("a", 100), ("b", 195), ("c", 200)]);
        s.advance(late, 1_000);
        assert_eq!(s, seen(Some(190), &[("b", 195), ("c", 200)]));
        assert!(!s.is_new("a", 100), "below the horizon: found before");
        assert!(!s.is_new("c", 200));
        assert!(s.is_new("d", 190) && s.is_new("d", 300));
        // A file stamped in the future moves the horizon only up to the
        // listing's time, so files written now are still found.
        s.recent.insert("future".into(), 1_000_000);
        s.advance(late, 1_000);
        assert_eq!(s.horizon, Some(990));
        assert!(s.is_new("e", 995));
    }
}
