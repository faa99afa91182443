//! `CheckpointStorage` over `object_store`: where a job's checkpoints live and
//! how their objects are written, read and deleted. Layout under the root:
//!
//! ```text
//! <root>/<job-id>/chk-<id>/_metadata        written last, atomically
//! <root>/<job-id>/chk-<id>/<object>         state written by subtasks
//! <root>/<job-id>/checkpoint-id-counter     next checkpoint id
//! ```
//!
//! Paths inside the job directory are relative strings (as `StateHandle`s
//! hold them) and are validated before use, so that nothing read from a
//! checkpoint can reach outside the job's directory.

use super::metadata::{self, MetadataError};
use super::CompletedCheckpoint;
use crate::ids::{CheckpointId, JobId};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::sync::Arc;
use thiserror::Error;

const METADATA: &str = "_metadata";
const COUNTER: &str = "checkpoint-id-counter";

#[derive(Debug, Error)]
pub enum StorageError {
    #[error("unsupported checkpoint storage URL {0:?}: use a path, file://, or memory://")]
    UnsupportedUrl(String),
    #[error("cannot open checkpoint storage at {url}: {source}")]
    Open {
        url: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("path {0:?} escapes the checkpoint directory")]
    EscapingPath(String),
    #[error("checkpoint storage failed at {path}: {source}")]
    Io {
        path: String,
        source: object_store::Error,
    },
    #[error("{path}: {source}")]
    Metadata { path: String, source: MetadataError },
    #[error("{path} holds {found:?}, not a checkpoint id counter")]
    Counter { path: String, found: String },
}

/// The checkpoint directory of one job on one object store.
#[derive(Clone, Debug)]
pub struct CheckpointStorage {
    store: Arc<dyn ObjectStore>,
    job_dir: Path,
}

impl CheckpointStorage {
    /// `url`: a plain path, `file://` path, or `memory://` (an in-memory store
    /// that lives as long as this value and its clones).
    pub fn open(url: &str, job: JobId) -> Result<Self, StorageError> {
        let store: Arc<dyn ObjectStore> = if url.starts_with("memory://") {
            Arc::new(InMemory::new())
        } else {
            let dir = url.strip_prefix("file://").unwrap_or(url);
            if dir.contains("://") {
                return Err(StorageError::UnsupportedUrl(url.to_owned()));
            }
            std::fs::create_dir_all(dir).map_err(|e| StorageError::Open {
                url: url.to_owned(),
                source: e.into(),
            })?;
            let fs = LocalFileSystem::new_with_prefix(dir).map_err(|e| StorageError::Open {
                url: url.to_owned(),
                source: e.into(),
            })?;
            // Deleting a checkpoint's last object removes its directory too.
            Arc::new(fs.with_automatic_cleanup(true))
        };
        Ok(CheckpointStorage {
            store,
            job_dir: Path::from(job.to_string()),
        })
    }

    /// Directory of checkpoint `id`, relative to the job directory.
    pub fn checkpoint_dir(id: CheckpointId) -> String {
        format!("chk-{}", id.0)
    }

    /// Resolves a relative path read from a checkpoint. Absolute paths, `..`
    /// and empty segments are refused: a checkpoint can only name objects
    /// inside its job's directory.
    pub fn resolve(&self, relative: &str) -> Result<Path, StorageError> {
        let escaping = relative.is_empty()
            || relative.starts_with('/')
            || relative.contains('\\')
            || relative.contains("://")
            || relative
                .split('/')
                .any(|part| part.is_empty() || part == "." || part == "..");
        if escaping {
            return Err(StorageError::EscapingPath(relative.to_owned()));
        }
        let mut path = self.job_dir.clone();
        for part in relative.split('/') {
            path = path.join(part);
        }
        Ok(path)
    }

    fn io(path: &Path) -> impl FnOnce(object_store::Error) -> StorageError + '_ {
        move |source| StorageError::Io {
            path: path.to_string(),
            source,
        }
    }

    pub async fn put(&self, relative: &str, bytes: Bytes) -> Result<(), StorageError> {
        let path = self.resolve(relative)?;
        self.store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(Self::io(&path))?;
        Ok(())
    }

    pub async fn get(&self, relative: &str) -> Result<Bytes, StorageError> {
        let path = self.resolve(relative)?;
        let result = self.store.get(&path).await.map_err(Self::io(&path))?;
        result.bytes().await.map_err(Self::io(&path))
    }

    /// The bytes `range` of an object: one segment of a merged file.
    pub async fn get_range(
        &self,
        relative: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, StorageError> {
        let path = self.resolve(relative)?;
        self.store
            .get_range(&path, range)
            .await
            .map_err(Self::io(&path))
    }

    /// Deleting what is already gone succeeds: cleanup may be retried.
    pub async fn delete(&self, relative: &str) -> Result<(), StorageError> {
        let path = self.resolve(relative)?;
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(StorageError::Io {
                path: path.to_string(),
                source,
            }),
        }
    }

    async fn objects(&self, prefix: &Path) -> Result<Vec<object_store::ObjectMeta>, StorageError> {
        self.store
            .list(Some(prefix))
            .try_collect()
            .await
            .map_err(Self::io(prefix))
    }

    /// Every object under `relative` (a directory), as relative paths.
    pub async fn list(&self, relative: &str) -> Result<Vec<String>, StorageError> {
        let objects = self.objects(&self.resolve(relative)?).await?;
        let job_dir = format!("{}/", self.job_dir);
        Ok(objects
            .into_iter()
            .filter_map(|meta| {
                meta.location
                    .as_ref()
                    .strip_prefix(&job_dir)
                    .map(str::to_owned)
            })
            .collect())
    }

    /// Deletes a checkpoint directory: its metadata first, so that a reader
    /// never finds metadata whose state is half gone.
    pub async fn delete_checkpoint(&self, id: CheckpointId) -> Result<(), StorageError> {
        let dir = Self::checkpoint_dir(id);
        self.delete(&format!("{dir}/{METADATA}")).await?;
        for object in self.list(&dir).await? {
            self.delete(&object).await?;
        }
        Ok(())
    }

    /// Writes `_metadata` of a completed checkpoint. A put is atomic on every
    /// supported store (a local file is written aside and renamed), so no
    /// reader ever sees a partial one.
    pub async fn write_metadata(
        &self,
        checkpoint: &CompletedCheckpoint,
    ) -> Result<(), StorageError> {
        let relative = format!("{}/{METADATA}", Self::checkpoint_dir(checkpoint.id));
        self.put(&relative, metadata::encode(checkpoint).into())
            .await
    }

    pub async fn read_metadata(
        &self,
        id: CheckpointId,
    ) -> Result<CompletedCheckpoint, StorageError> {
        let relative = format!("{}/{METADATA}", Self::checkpoint_dir(id));
        let bytes = self.get(&relative).await?;
        metadata::decode(&bytes).map_err(|source| StorageError::Metadata {
            path: relative,
            source,
        })
    }

    /// Ids of the checkpoints whose metadata exists, in increasing order.
    pub async fn completed_ids(&self) -> Result<Vec<CheckpointId>, StorageError> {
        let objects = self.objects(&self.job_dir).await?;
        let mut ids: Vec<CheckpointId> = objects
            .iter()
            .filter_map(|meta| {
                let mut parts = meta.location.parts();
                parts.next()?;
                let dir = parts.next()?;
                let file = parts.next()?;
                (file.as_ref() == METADATA && parts.next().is_none())
                    .then(|| dir.as_ref().strip_prefix("chk-")?.parse().ok())
                    .flatten()
                    .map(CheckpointId)
            })
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// `CheckpointIDCounter`: the next id to use, never below one past any
    /// checkpoint found in storage, so ids strictly increase across restarts
    /// of the coordinator and of the process.
    pub async fn next_checkpoint_id(&self) -> Result<CheckpointId, StorageError> {
        let stored = match self.get(COUNTER).await {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes).trim().to_owned();
                text.parse::<u64>().map_err(|_| StorageError::Counter {
                    path: format!("{}/{COUNTER}", self.job_dir),
                    found: text,
                })?
            }
            Err(StorageError::Io {
                source: object_store::Error::NotFound { .. },
                ..
            }) => 1,
            Err(e) => return Err(e),
        };
        let after_completed = self.completed_ids().await?.last().map_or(1, |id| id.0 + 1);
        Ok(CheckpointId(stored.max(after_completed)))
    }

    pub async fn store_next_checkpoint_id(&self, next: CheckpointId) -> Result<(), StorageError> {
        self.put(COUNTER, Bytes::from(next.0.to_string())).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::tests::checkpoint;

    #[tokio::test]
    async fn paths_cannot_escape_the_job_directory() {
        let storage = CheckpointStorage::open("memory://", JobId(1)).unwrap();
        for bad in [
            "../x",
            "/etc/passwd",
            "chk-1/../../x",
            "a//b",
            "",
            "s3://other/x",
            "./x",
        ] {
            assert!(
                matches!(storage.resolve(bad), Err(StorageError::EscapingPath(_))),
                "{bad}"
            );
            assert!(storage.get(bad).await.is_err());
        }
        assert!(storage.resolve("chk-1/state-0").is_ok());
    }

    #[tokio::test]
    async fn ids_continue_after_the_counter_and_the_newest_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().to_str().unwrap();
        let storage = CheckpointStorage::open(url, JobId(7)).unwrap();
        assert_eq!(storage.next_checkpoint_id().await.unwrap(), CheckpointId(1));
        storage
            .store_next_checkpoint_id(CheckpointId(5))
            .await
            .unwrap();
        storage.write_metadata(&checkpoint(9)).await.unwrap();
        // A new process opens the same directory.
        let reopened = CheckpointStorage::open(&format!("file://{url}"), JobId(7)).unwrap();
        assert_eq!(
            reopened.next_checkpoint_id().await.unwrap(),
            CheckpointId(10)
        );
        assert_eq!(
            reopened.read_metadata(CheckpointId(9)).await.unwrap(),
            checkpoint(9)
        );
        reopened.delete_checkpoint(CheckpointId(9)).await.unwrap();
        assert!(reopened.completed_ids().await.unwrap().is_empty());
    }

    #[test]
    fn foreign_urls_are_refused() {
        assert!(matches!(
            CheckpointStorage::open("ftp://host/x", JobId(1)),
            Err(StorageError::UnsupportedUrl(_))
        ));
    }
}
