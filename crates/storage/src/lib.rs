//! The IO side of checkpoints: `CheckpointStorage` over `object_store`,
//! where a job's checkpoints live and how their objects are written, read
//! and deleted, and the savepoint copier. The decisions it carries out (what
//! to write, keep, copy or delete) are made by the pure state machines of
//! [`tidemark_core::checkpoint`]. Layout under the root
//! (a local directory, an in-memory store, or an S3 bucket and prefix):
//!
//! ```text
//! <root>/<job-id>/chk-<id>/_metadata        written last, atomically
//! <root>/<job-id>/chk-<id>/<object>         state written by subtasks
//! <root>/<job-id>/shared/<object>           incremental files shared across checkpoints
//! <root>/<job-id>/merged/<object>           physical files holding merged segments
//! <root>/<job-id>/checkpoint-id-counter     next checkpoint id
//! <root>/<job-id>/_start                    where runs last started (`--restore X`)
//! <root>/<job-id>/_leases/<epoch>           the run that holds the directory
//! ```
//!
//! Paths inside the job directory are relative strings (as `StateHandle`s
//! hold them) and are validated before use, so that nothing read from a
//! checkpoint can reach outside the job's directory.

pub mod faults;
pub mod lease;
pub mod savepoint;
pub mod upload;

#[cfg(test)]
mod metadata_fuzz;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::SystemTime;
use thiserror::Error;
use tidemark_core::checkpoint::metadata::{self, MetadataError};
use tidemark_core::checkpoint::restore::RestoreFailure;
use tidemark_core::checkpoint::start::StartPoint;
use tidemark_core::checkpoint::store::CompletedCheckpointStore;
use tidemark_core::checkpoint::{
    stays_inside, CheckpointConfig, CheckpointConfigError, CompletedCheckpoint, HandleMismatch,
    StateHandle,
};
use tidemark_core::model::ids::{CheckpointId, JobId};

/// A number no other call draws, in this process or another: for telling
/// apart things of the same name written by different writers (uploads of
/// a checkpoint's attempts, runs holding a lease). The clock, the process
/// and a counter make it; the core, which reads no host fact, has none.
pub fn unique_token() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    tidemark_core::model::rng::splitmix64(
        nanos ^ u64::from(std::process::id()) << 32 ^ COUNTER.fetch_add(1, Ordering::Relaxed),
    )
}

/// The metadata file of a checkpoint or savepoint directory.
pub const METADATA: &str = "_metadata";
/// The checkpoint id counter, relative to the job directory.
pub const COUNTER: &str = "checkpoint-id-counter";
/// Where the job directory's runs last started from
/// ([`tidemark_core::checkpoint::start`]), relative to the job directory.
pub const START: &str = "_start";
/// Deletes in flight at once in [`CheckpointStorage::delete_many`].
const DELETES_IN_FLIGHT: usize = 8;

/// Why checkpoint storage could not be opened, read or written.
#[derive(Debug, Error)]
pub enum StorageError {
    /// A URL scheme other than a path, `file://`, `memory://` or `s3://`.
    #[error("unsupported checkpoint storage URL {0:?}: use a path, file://, memory://, s3://bucket/prefix or store://NAME of a registered store")]
    UnsupportedUrl(String),
    /// A supported scheme with a bad rest (no bucket, a bad prefix), or
    /// `s3://` in a build without the `s3` feature.
    #[error("invalid checkpoint storage URL {url:?}: {problem}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The store could not be opened (a local directory missing or not
    /// creatable, an S3 client that cannot be configured).
    #[error("cannot open checkpoint storage at {url}: {source}")]
    Open {
        /// The URL as given.
        url: String,
        /// The underlying error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A relative path (typically read from a checkpoint) that would leave
    /// the directory: refused before any IO.
    #[error("path {0:?} escapes the checkpoint directory")]
    EscapingPath(String),
    /// The object store failed; [`StorageError::is_not_found`] tells a
    /// missing object apart.
    #[error("checkpoint storage failed at {path}: {source}")]
    Io {
        /// The object's path in the store.
        path: String,
        /// The object store's error.
        source: object_store::Error,
    },
    /// A metadata file was read but is not valid `_metadata`.
    #[error("{path}: {source}")]
    Metadata {
        /// Where the file is.
        path: String,
        /// What is wrong with it.
        source: MetadataError,
    },
    /// This run no longer holds its job directory (see [`lease`]): it
    /// writes no `_metadata` and deletes nothing.
    #[error("{holder} no longer holds {dir}: {reason}; refusing to write metadata or delete")]
    Fenced {
        /// The job directory.
        dir: String,
        /// This run's lease.
        holder: String,
        /// Why it is lost.
        reason: String,
    },
    /// A metadata file of that name exists, written by another run or
    /// another attempt of this checkpoint: it is neither replaced nor
    /// deleted.
    #[error("{0} exists already, not written by this attempt; it is left as it is")]
    MetadataExists(String),
    /// A `_metadata` write failed and whether it landed could not be told
    /// (reading it back and deleting it failed too): the checkpoint may
    /// exist, so none of its state may be deleted.
    #[error("writing {path} failed ({write}) and whether it landed is unknown ({settle}); its checkpoint's state is kept")]
    UnknownOutcome {
        /// The metadata file.
        path: String,
        /// Why the write failed.
        write: Box<StorageError>,
        /// Why neither reading it back nor deleting it settled the outcome.
        settle: Box<StorageError>,
    },
    /// The id counter object does not hold a number.
    #[error("{path} holds {found:?}, not a checkpoint id counter")]
    Counter {
        /// Where the counter is.
        path: String,
        /// What it holds.
        found: String,
    },
    /// The record of where the directory's runs started does not decode.
    #[error("{path} does not say where the job last started ({problem}); delete it to restore from the newest checkpoint")]
    Malformed {
        /// Where it is.
        path: String,
        /// Why it does not decode.
        problem: String,
    },
}

/// Why the bytes of a state handle could not be read.
#[derive(Debug, Error)]
pub enum ReadError {
    /// The store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The object is not as long as the handle records: truncated or
    /// replaced.
    #[error(transparent)]
    Mismatch(#[from] HandleMismatch),
}

impl StorageError {
    /// The object asked for does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            StorageError::Io {
                source: object_store::Error::NotFound { .. },
                ..
            }
        )
    }

    /// What this error, met while reading a checkpoint's state, means for
    /// the restore: a missing object is damaged state, an older checkpoint
    /// may still serve; anything else (storage down) would fail it alike.
    pub fn restore_failure(&self) -> RestoreFailure {
        if self.is_not_found() {
            RestoreFailure::DamagedState
        } else {
            RestoreFailure::Other
        }
    }
}

/// What a `CheckpointStorage` and its clones did to the store.
#[derive(Debug, Default)]
pub struct StorageCounters {
    /// Objects written under a name that did not exist: every state object
    /// and `_metadata` (their names carry the checkpoint id, which never
    /// repeats), the id counter the first time only.
    pub objects_created: AtomicU64,
    /// Successful deletes. Local files report a missing object, so deleting
    /// one twice counts once there; memory and S3 do not, and count again.
    pub objects_deleted: AtomicU64,
    /// Bytes of every put, id counter included.
    pub bytes_uploaded: AtomicU64,
}

/// One object of the job directory, as a listing reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredObject {
    /// Relative to the job directory.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// When the store last wrote it; cleanup judges orphans by age.
    pub last_modified: SystemTime,
}

/// Named in-memory stores: every `memory://NAME` opened in this process
/// while one of them is still open is the same store, so that a test or an
/// embedding application can look at what a job left behind.
static MEMORY_STORES: LazyLock<Mutex<HashMap<String, Weak<InMemory>>>> =
    LazyLock::new(Mutex::default);

fn memory_store(name: &str) -> Arc<InMemory> {
    if name.is_empty() {
        return Arc::new(InMemory::new());
    }
    let mut stores = MEMORY_STORES.lock().expect("memory store registry");
    stores.retain(|_, store| store.strong_count() > 0);
    if let Some(store) = stores.get(name).and_then(Weak::upgrade) {
        return store;
    }
    let store = Arc::new(InMemory::new());
    stores.insert(name.to_owned(), Arc::downgrade(&store));
    store
}

/// Stores an embedding application (or a test) registered by name, for
/// `store://NAME/prefix` URLs.
static REGISTERED_STORES: LazyLock<Mutex<HashMap<String, Arc<dyn ObjectStore>>>> =
    LazyLock::new(Mutex::default);

/// Makes `store` the storage of every `store://NAME/prefix` URL opened in
/// this process from now on: any `object_store` implementation (a
/// [`faults::FaultyStore`], a store configured in code) serves checkpoints.
pub fn register_store(name: &str, store: Arc<dyn ObjectStore>) {
    REGISTERED_STORES
        .lock()
        .expect("store registry")
        .insert(name.to_owned(), store);
}

/// Forgets the store registered as `name`.
pub fn unregister_store(name: &str) {
    REGISTERED_STORES
        .lock()
        .expect("store registry")
        .remove(name);
}

/// A store, and its multipart uploads where they can be resumed.
type StoreAndMultipart = (Arc<dyn ObjectStore>, Option<Arc<dyn MultipartStore>>);

/// The store `bucket` on S3, with the client's settings from the usual
/// `AWS_*` environment variables (credentials, region, `AWS_ENDPOINT_URL`
/// and `AWS_ALLOW_HTTP` for a local server).
#[cfg(feature = "s3")]
fn s3_store(url: &str, bucket: &str) -> Result<StoreAndMultipart, StorageError> {
    let store = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .build()
        .map_err(|e| StorageError::Open {
            url: url.to_owned(),
            source: e.into(),
        })?;
    let store = Arc::new(store);
    Ok((store.clone(), Some(store)))
}

#[cfg(not(feature = "s3"))]
fn s3_store(url: &str, _bucket: &str) -> Result<StoreAndMultipart, StorageError> {
    Err(StorageError::InvalidUrl {
        url: url.to_owned(),
        problem: "this build of Tidemark has no S3 client; build it with the `s3` feature".into(),
    })
}

/// `create`: make the directory if it does not exist; without it, a missing
/// directory is an error and nothing is created.
fn local_store(url: &str, create: bool) -> Result<Arc<dyn ObjectStore>, StorageError> {
    let open = |e: Box<dyn std::error::Error + Send + Sync>| StorageError::Open {
        url: url.to_owned(),
        source: e,
    };
    let dir = url.strip_prefix("file://").unwrap_or(url);
    if dir.contains("://") {
        return Err(StorageError::UnsupportedUrl(url.to_owned()));
    }
    if create {
        std::fs::create_dir_all(dir).map_err(|e| open(e.into()))?;
    }
    let fs = LocalFileSystem::new_with_prefix(dir).map_err(|e| open(e.into()))?;
    // A put returns once the file and its directory entry are on disk: an
    // acknowledged state object or a completed `_metadata` survives a
    // power loss. Deleting a checkpoint's last object removes its
    // directory too.
    Ok(Arc::new(fs.with_fsync(true).with_automatic_cleanup(true)))
}

/// Refuses a savepoint directory inside job `job`'s directory of checkpoint
/// storage, where retention and cleanup would delete its savepoints. The
/// job's directory is where [`CheckpointStorage::open`] puts it; nothing is
/// opened.
pub fn check_savepoint_dir(
    settings: &CheckpointConfig,
    job: JobId,
) -> Result<(), CheckpointConfigError> {
    let job_dir = format!("{}/{job}", settings.storage_url.trim_end_matches('/'));
    match &settings.savepoint_dir {
        Some(dir) if lies_inside(dir, &job_dir) => {
            Err(CheckpointConfigError::SavepointsInsideCheckpoints {
                savepoint_dir: dir.clone(),
                job_dir,
            })
        }
        _ => Ok(()),
    }
}

/// Whether storage location `inner` lies within `outer`: local paths by
/// their absolute form with `..` resolved, URLs by prefix.
fn lies_inside(inner: &str, outer: &str) -> bool {
    let local = |s: &str| {
        let s = s.strip_prefix("file://").unwrap_or(s);
        if s.contains("://") {
            return None;
        }
        let absolute = std::path::absolute(s).ok()?;
        let mut normal = std::path::PathBuf::new();
        for part in absolute.components() {
            match part {
                std::path::Component::ParentDir => {
                    normal.pop();
                }
                part => normal.push(part),
            }
        }
        Some(normal)
    };
    match (local(inner), local(outer)) {
        (Some(inner), Some(outer)) => inner.starts_with(outer),
        (None, None) => format!("{}/", inner.trim_end_matches('/'))
            .starts_with(&format!("{}/", outer.trim_end_matches('/'))),
        _ => false,
    }
}

/// The checkpoint directory of one job on one object store.
#[derive(Clone, Debug)]
pub struct CheckpointStorage {
    store: Arc<dyn ObjectStore>,
    /// The store's own URL (local directory, `memory://NAME`,
    /// `s3://bucket`), which paths in it are relative to, for messages.
    url: Arc<str>,
    job_dir: Path,
    counters: Arc<StorageCounters>,
    /// The id counter is known to exist, so writing it creates nothing.
    counter_exists: Arc<AtomicBool>,
    /// The lease this run holds on the directory (or, in a worker process,
    /// the epoch of the run it works for), checked before every
    /// `_metadata` write, id counter write and deletion.
    fence: Option<Fence>,
}

/// What fences a run's writes to its job directory.
#[derive(Clone, Debug)]
enum Fence {
    /// The lease the run holds.
    Lease(Arc<lease::Lease>),
    /// The epoch of the lease another process of the run holds: a worker
    /// writes for its driver, until another run takes the directory over.
    Epoch(u64),
}

/// A directory of an object store, as a URL names it: where checkpoints
/// go, and where connectors read and write files.
pub struct Location {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// The directory within it.
    pub prefix: Path,
    /// The store's own URL, without the prefix.
    pub store_url: String,
    /// The same store's multipart uploads, where they can be resumed by id
    /// (S3, memory): what an exactly-once file sink keeps pending.
    pub multipart: Option<Arc<dyn MultipartStore>>,
}

impl Location {
    /// `url` as for [`CheckpointStorage::open`]. Unless `create`, a local
    /// directory must exist already.
    pub fn open(url: &str, create: bool) -> Result<Self, StorageError> {
        let invalid = |problem: String| StorageError::InvalidUrl {
            url: url.to_owned(),
            problem,
        };
        // `scheme://name/prefix`: the store's name and the prefix within it.
        let named = |scheme: &str| -> Result<Option<(String, Path)>, StorageError> {
            let Some(rest) = url.strip_prefix(scheme) else {
                return Ok(None);
            };
            let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let prefix = Path::parse(prefix.trim_end_matches('/'))
                .map_err(|e| invalid(format!("bad prefix: {e}")))?;
            Ok(Some((name.to_owned(), prefix)))
        };
        let (store, prefix, store_url, multipart): (Arc<dyn ObjectStore>, Path, String, _) =
            if let Some((name, prefix)) = named("memory://")? {
                let store = memory_store(&name);
                let multipart: Arc<dyn MultipartStore> = store.clone();
                (store, prefix, format!("memory://{name}"), Some(multipart))
            } else if let Some((name, prefix)) = named("store://")? {
                let store = REGISTERED_STORES
                    .lock()
                    .expect("store registry")
                    .get(&name)
                    .cloned()
                    .ok_or_else(|| invalid(format!("no store is registered as {name:?}")))?;
                (store, prefix, format!("store://{name}"), None)
            } else if let Some((bucket, prefix)) = named("s3://")? {
                if bucket.is_empty() {
                    return Err(invalid("no bucket name".into()));
                }
                let (store, multipart) = s3_store(url, &bucket)?;
                (store, prefix, format!("s3://{bucket}"), multipart)
            } else {
                let dir = url.trim_end_matches('/');
                (
                    local_store(url, create)?,
                    Path::default(),
                    dir.to_owned(),
                    None,
                )
            };
        Ok(Location {
            store,
            prefix,
            store_url,
            multipart,
        })
    }
}

impl CheckpointStorage {
    /// `url`: a plain path, `file://` path, `memory://` (an in-memory store
    /// that lives as long as this value and its clones), `memory://NAME[/prefix]` (the
    /// same store as every other open `memory://NAME` of this process), or
    /// `s3://bucket/prefix`.
    pub fn open(url: &str, job: JobId) -> Result<Self, StorageError> {
        let storage = Self::open_directory(url, true)?;
        storage.subdirectory(&job.to_string())
    }

    /// The directory `url` itself (URLs as for `open`): a savepoint
    /// directory, or where savepoint directories are made. Unless `create`,
    /// a local directory must exist already.
    pub fn open_directory(url: &str, create: bool) -> Result<Self, StorageError> {
        let Location {
            store,
            prefix,
            store_url,
            ..
        } = Location::open(url, create)?;
        Ok(CheckpointStorage {
            store,
            url: store_url.into(),
            job_dir: prefix,
            counters: Arc::default(),
            counter_exists: Arc::default(),
            fence: None,
        })
    }

    /// The same directory, fenced by `lease`: once the lease is lost, every
    /// `_metadata` write, id counter write and deletion fails with
    /// [`StorageError::Fenced`].
    pub fn fenced(&self, lease: Arc<lease::Lease>) -> Self {
        CheckpointStorage {
            fence: Some(Fence::Lease(lease)),
            ..self.clone()
        }
    }

    /// The same directory, written for the run that holds the lease of
    /// `epoch` from another process (a worker for its driver): objects
    /// carry that run's tag, and deletions fail once a newer run took the
    /// directory over.
    pub fn working_for(&self, epoch: u64) -> Self {
        CheckpointStorage {
            fence: Some(Fence::Epoch(epoch)),
            ..self.clone()
        }
    }

    /// The same directory without a fence (the lease's own objects).
    fn unfenced(&self) -> Self {
        CheckpointStorage {
            fence: None,
            ..self.clone()
        }
    }

    /// The epoch of the lease this storage writes under: what a worker
    /// process is told to write under.
    pub fn epoch(&self) -> u64 {
        match &self.fence {
            Some(Fence::Lease(lease)) => lease.holder().epoch,
            Some(Fence::Epoch(epoch)) => *epoch,
            None => 0,
        }
    }

    /// The run's part of the names of objects it writes (`e` and its lease's
    /// epoch), so that no two runs on the directory write one name.
    pub fn run_tag(&self) -> String {
        format!("e{}", self.epoch())
    }

    async fn check_fence(&self) -> Result<(), StorageError> {
        match &self.fence {
            Some(Fence::Lease(lease)) => lease.check().await,
            Some(Fence::Epoch(epoch)) => lease::superseded(&self.unfenced(), *epoch).await,
            None => Ok(()),
        }
    }

    /// The directory `relative` of this one, on the same store, with
    /// counters of its own.
    pub fn subdirectory(&self, relative: &str) -> Result<Self, StorageError> {
        Ok(CheckpointStorage {
            store: self.store.clone(),
            url: self.url.clone(),
            job_dir: self.resolve(relative)?,
            counters: Arc::default(),
            counter_exists: Arc::default(),
            fence: None,
        })
    }

    /// The directory as a URL or path, for people.
    pub fn directory(&self) -> String {
        self.location("")
    }

    /// `relative` as a URL or path, for people.
    pub fn location(&self, relative: &str) -> String {
        let dir = self.job_dir.to_string();
        [&*self.url, dir.as_str(), relative]
            .into_iter()
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join("/")
    }

    /// What this storage (and its clones, not its subdirectories) did.
    pub fn counters(&self) -> &StorageCounters {
        &self.counters
    }

    /// Directory of checkpoint `id`, relative to the job directory.
    pub fn checkpoint_dir(id: CheckpointId) -> String {
        format!("chk-{}", id.0)
    }

    /// Resolves a relative path read from a checkpoint. Absolute paths, `..`
    /// and empty segments are refused: a checkpoint can only name objects
    /// inside its job's directory.
    pub fn resolve(&self, relative: &str) -> Result<Path, StorageError> {
        if !stays_inside(relative) {
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

    /// Writes the object `relative` whole (an atomic put), replacing any
    /// object of that name.
    pub async fn put(&self, relative: &str, bytes: Bytes) -> Result<(), StorageError> {
        self.write(relative, bytes).await?;
        self.counters
            .objects_created
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A put that counts its bytes but leaves the caller to say whether it
    /// created an object.
    async fn write(&self, relative: &str, bytes: Bytes) -> Result<(), StorageError> {
        self.write_with(relative, bytes, PutMode::Overwrite).await
    }

    async fn write_with(
        &self,
        relative: &str,
        bytes: Bytes,
        mode: PutMode,
    ) -> Result<(), StorageError> {
        let path = self.resolve(relative)?;
        let size = bytes.len() as u64;
        let written = self
            .store
            .put_opts(&path, PutPayload::from(bytes), PutOptions::from(mode))
            .await;
        match written {
            Err(object_store::Error::AlreadyExists { .. }) => {
                return Err(StorageError::MetadataExists(self.location(relative)))
            }
            written => written.map_err(Self::io(&path))?,
        };
        self.counters
            .bytes_uploaded
            .fetch_add(size, Ordering::Relaxed);
        Ok(())
    }

    /// The bytes of the object `relative`.
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

    /// The bytes of a state object: inline ones as they are, a whole object,
    /// or only the segment of a merged file.
    pub async fn read_handle(&self, handle: &StateHandle) -> Result<Bytes, ReadError> {
        Ok(match handle {
            StateHandle::Inline(bytes) => Bytes::copy_from_slice(bytes),
            StateHandle::Object { path, .. } => handle.from_object(self.get(path).await?)?,
            StateHandle::Segment { path, .. } => {
                handle.from_range(self.get_range(path, handle.range()).await?)?
            }
        })
    }

    /// Deleting what is already gone succeeds: cleanup may be retried.
    pub async fn delete(&self, relative: &str) -> Result<(), StorageError> {
        self.check_fence().await?;
        self.delete_unfenced(relative).await
    }

    /// Deletes every one of `paths`, a few at a time, even if some fail,
    /// with the fence checked once for all of them (not once per object);
    /// what is gone already counts as deleted. Returns the paths that could
    /// not be deleted, with why; fenced, it deletes nothing.
    pub async fn delete_many(
        &self,
        paths: Vec<String>,
    ) -> Result<Vec<(String, StorageError)>, StorageError> {
        self.check_fence().await?;
        Ok(futures::stream::iter(paths)
            .map(|path| async move {
                let result = self.delete_unfenced(&path).await;
                result.err().map(|error| (path, error))
            })
            .buffer_unordered(DELETES_IN_FLIGHT)
            .filter_map(std::future::ready)
            .collect()
            .await)
    }

    async fn delete_unfenced(&self, relative: &str) -> Result<(), StorageError> {
        let path = self.resolve(relative)?;
        match self.store.delete(&path).await {
            Ok(()) => {
                self.counters
                    .objects_deleted
                    .fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(StorageError::Io {
                path: path.to_string(),
                source,
            }),
        }
    }

    /// Every object under `prefix` that lies in the job directory, with its
    /// path relative to the job directory.
    async fn objects_under(&self, prefix: &Path) -> Result<Vec<StoredObject>, StorageError> {
        let objects: Vec<object_store::ObjectMeta> = self
            .store
            .list(Some(prefix))
            .try_collect()
            .await
            .map_err(Self::io(prefix))?;
        Ok(objects
            .into_iter()
            .filter_map(|meta| {
                let parts: Vec<String> = meta
                    .location
                    .prefix_match(&self.job_dir)?
                    .map(|part| part.as_ref().to_owned())
                    .collect();
                Some(StoredObject {
                    path: parts.join("/"),
                    size: meta.size,
                    last_modified: meta.last_modified.into(),
                })
            })
            .collect())
    }

    /// Every object of the job directory.
    pub async fn objects(&self) -> Result<Vec<StoredObject>, StorageError> {
        self.objects_under(&self.job_dir).await
    }

    /// Every object under `relative` (a directory), as relative paths.
    pub async fn list(&self, relative: &str) -> Result<Vec<String>, StorageError> {
        let objects = self.objects_under(&self.resolve(relative)?).await?;
        Ok(objects.into_iter().map(|o| o.path).collect())
    }

    /// Deletes a checkpoint directory: its metadata first, so that a reader
    /// never finds metadata whose state is half gone. Returns what the
    /// listing found and was deleted; a listing that misses objects leaves
    /// them to the caller, who knows what the checkpoint referenced.
    pub async fn delete_checkpoint(&self, id: CheckpointId) -> Result<Vec<String>, StorageError> {
        let dir = Self::checkpoint_dir(id);
        self.delete(&Self::metadata_path(id)).await?;
        let objects = self.list(&dir).await?;
        match self.delete_many(objects.clone()).await?.into_iter().next() {
            Some((_, error)) => Err(error),
            None => Ok(objects),
        }
    }

    /// `_metadata` of checkpoint `id`, relative to the job directory.
    pub fn metadata_path(id: CheckpointId) -> String {
        format!("{}/{METADATA}", Self::checkpoint_dir(id))
    }

    /// Writes `_metadata` of a completed checkpoint. A put is atomic on every
    /// supported store (a local file is written aside and renamed), so no
    /// reader ever sees a partial one.
    pub async fn write_metadata(
        &self,
        checkpoint: &CompletedCheckpoint,
    ) -> Result<(), StorageError> {
        self.write_metadata_at(&Self::metadata_path(checkpoint.id), checkpoint)
            .await
    }

    /// Writes the metadata file `relative` (a checkpoint's or a savepoint's)
    /// if none of that name exists: a run fenced too late, or two runs
    /// that drew one id, cannot replace a completed checkpoint's.
    /// A failed put may still have landed (a timeout after the store
    /// applied it): the outcome is settled by reading the file back, and if
    /// that fails too by deleting it, so that the checkpoint is either
    /// complete (`Ok`) or absent (the put's error). Only if neither settles
    /// it is the error [`StorageError::UnknownOutcome`].
    pub async fn write_metadata_at(
        &self,
        relative: &str,
        checkpoint: &CompletedCheckpoint,
    ) -> Result<(), StorageError> {
        self.check_fence().await?;
        let bytes = Bytes::from(metadata::encode(checkpoint));
        let write = match self
            .write_with(relative, bytes.clone(), PutMode::Create)
            .await
        {
            Ok(()) => {
                self.counters
                    .objects_created
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Err(e @ (StorageError::Fenced { .. } | StorageError::EscapingPath(_))) => {
                return Err(e)
            }
            Err(e) => e,
        };
        // Created only, never replaced: one found with other bytes is
        // another writer's, and stays.
        match self.get(relative).await {
            Ok(found) if found == bytes => return Ok(()),
            Ok(_) => return Err(StorageError::MetadataExists(self.location(relative))),
            Err(e) if e.is_not_found() => return Err(write),
            _ => {}
        }
        match self.delete(relative).await {
            Ok(()) => Err(write),
            Err(settle) => Err(StorageError::UnknownOutcome {
                path: self.location(relative),
                write: Box::new(write),
                settle: Box::new(settle),
            }),
        }
    }

    /// The `_metadata` of checkpoint `id` of this job directory.
    pub async fn read_metadata(
        &self,
        id: CheckpointId,
    ) -> Result<CompletedCheckpoint, StorageError> {
        self.read_metadata_at(&Self::metadata_path(id)).await
    }

    /// The metadata file `relative` (a checkpoint's or a savepoint's).
    pub async fn read_metadata_at(
        &self,
        relative: &str,
    ) -> Result<CompletedCheckpoint, StorageError> {
        let bytes = self.get(relative).await?;
        metadata::decode(&bytes).map_err(|source| StorageError::Metadata {
            path: self.location(relative),
            source,
        })
    }

    /// Ids of the checkpoints whose metadata exists, in increasing order.
    pub async fn completed_ids(&self) -> Result<Vec<CheckpointId>, StorageError> {
        Ok(Self::completed_ids_in(&self.objects().await?))
    }

    /// Ids of the checkpoints whose metadata a listing holds, in increasing
    /// order.
    pub fn completed_ids_in(objects: &[StoredObject]) -> Vec<CheckpointId> {
        let mut ids: Vec<CheckpointId> = objects
            .iter()
            .filter_map(|object| {
                let dir = object.path.strip_suffix(METADATA)?.strip_suffix('/')?;
                dir.strip_prefix("chk-")?.parse().ok().map(CheckpointId)
            })
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// The checkpoints found in storage: the newest `retain` retained, whose
    /// metadata must read back (a corrupted one is an error, not a silent
    /// fallback to an older checkpoint), and the older ones subsumed, so
    /// that the registry counts what they share with the retained before
    /// they are deleted.
    pub async fn recover_store(
        &self,
        retain: usize,
    ) -> Result<CompletedCheckpointStore, StorageError> {
        let ids = self.completed_ids().await?;
        let older = ids.len().saturating_sub(retain);
        let mut found = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            match self.read_metadata(*id).await {
                Ok(checkpoint) => found.push(checkpoint),
                // Subsumed anyway, but what it references is unknown: it
                // is left as it is, for `tidemark cleanup` to show.
                Err(e) if i < older => tracing::warn!("{id} is not subsumed: {e}"),
                Err(e) => return Err(e),
            }
        }
        Ok(CompletedCheckpointStore::recovered(retain, found))
    }

    /// Where the directory's runs last started from, if a run was ever
    /// told.
    pub async fn read_start(&self) -> Result<Option<StartPoint>, StorageError> {
        let bytes = match self.get(START).await {
            Ok(bytes) => bytes,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StorageError::Malformed {
                path: self.location(START),
                problem: e.to_string(),
            })
    }

    /// Records where this run started, before its first checkpoint.
    pub async fn write_start(&self, start: &StartPoint) -> Result<(), StorageError> {
        self.check_fence().await?;
        let bytes = serde_json::to_vec_pretty(start).expect("a start is plain data");
        self.write(START, bytes.into()).await
    }

    /// `CheckpointIDCounter`: the next id to use, never below one past any
    /// checkpoint found in storage, so ids strictly increase across restarts
    /// of the coordinator and of the process.
    pub async fn next_checkpoint_id(&self) -> Result<CheckpointId, StorageError> {
        let stored = match self.get(COUNTER).await {
            Ok(bytes) => {
                self.counter_exists.store(true, Ordering::Relaxed);
                let text = String::from_utf8_lossy(&bytes).trim().to_owned();
                text.parse::<u64>().map_err(|_| StorageError::Counter {
                    path: format!("{}/{COUNTER}", self.job_dir),
                    found: text,
                })?
            }
            Err(e) if e.is_not_found() => 1,
            Err(e) => return Err(e),
        };
        let after_completed = self.completed_ids().await?.last().map_or(1, |id| id.0 + 1);
        Ok(CheckpointId(stored.max(after_completed)))
    }

    /// Persists the id counter: `next` is the lowest id a later run may use.
    /// Done before the barrier of `next - 1` goes out.
    pub async fn store_next_checkpoint_id(&self, next: CheckpointId) -> Result<(), StorageError> {
        self.check_fence().await?;
        self.write(COUNTER, Bytes::from(next.0.to_string())).await?;
        if !self.counter_exists.swap(true, Ordering::Relaxed) {
            self.counters
                .objects_created
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::testkit::checkpoint;

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
    fn foreign_and_malformed_urls_are_refused_naming_the_url() {
        assert!(matches!(
            CheckpointStorage::open("ftp://host/x", JobId(1)),
            Err(StorageError::UnsupportedUrl(_))
        ));
        for bad in [
            "s3://",
            "s3:///prefix",
            "s3://bucket/a//b",
            "s3://bucket/../x",
        ] {
            let err = CheckpointStorage::open(bad, JobId(1)).unwrap_err();
            assert!(
                matches!(err, StorageError::InvalidUrl { .. }),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn a_savepoint_directory_inside_the_job_directory_is_refused() {
        let job = JobId(1);
        let refused = |checkpoints: &str, savepoints: &str| {
            let settings = CheckpointConfig::new(checkpoints).savepoint_dir(savepoints);
            check_savepoint_dir(&settings, job).is_err()
        };
        assert!(refused("/tmp/x", &format!("/tmp/x/{job}")));
        assert!(refused("/tmp/x/", &format!("/tmp/y/../x/{job}/savepoints")));
        assert!(refused("s3://b/x/", &format!("s3://b/x/{job}/sp")));
        assert!(!refused("/tmp/x", "/tmp/x-savepoints"));
        assert!(!refused("/tmp/x", &format!("/tmp/x/{}", JobId(2))));
        assert!(!refused("s3://b/x", &format!("s3://b/x/{job}-other")));
        assert!(!refused("s3://b/x", &format!("/tmp/b/x/{job}")));
        assert!(check_savepoint_dir(&CheckpointConfig::new("/tmp/x"), job).is_ok());
    }

    #[cfg(feature = "s3")]
    #[test]
    fn an_s3_job_directory_lies_under_the_prefix() {
        let storage = CheckpointStorage::open("s3://bucket/a/b/", JobId(1)).unwrap();
        assert_eq!(
            storage.resolve("chk-1/x").unwrap().as_ref(),
            format!("a/b/{}/chk-1/x", JobId(1))
        );
    }

    #[cfg(not(feature = "s3"))]
    #[test]
    fn without_the_s3_feature_an_s3_url_is_refused_naming_the_feature() {
        let err = CheckpointStorage::open("s3://bucket/a", JobId(1)).unwrap_err();
        assert!(err.to_string().contains("`s3` feature"), "{err}");
    }

    #[tokio::test]
    async fn named_memory_stores_are_shared_while_open() {
        let first = CheckpointStorage::open("memory://shared-test", JobId(1)).unwrap();
        first
            .put("chk-1/x", Bytes::from_static(b"x"))
            .await
            .unwrap();
        let second = CheckpointStorage::open("memory://shared-test", JobId(1)).unwrap();
        assert_eq!(second.list("chk-1").await.unwrap(), ["chk-1/x"]);
        let anonymous = CheckpointStorage::open("memory://", JobId(1)).unwrap();
        assert!(anonymous.objects().await.unwrap().is_empty());
        drop((first, second));
        let reopened = CheckpointStorage::open("memory://shared-test", JobId(1)).unwrap();
        assert!(reopened.objects().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn counters_follow_what_is_created_deleted_and_uploaded() {
        let storage = CheckpointStorage::open("memory://", JobId(1)).unwrap();
        for next in [2, 3] {
            storage
                .store_next_checkpoint_id(CheckpointId(next))
                .await
                .unwrap();
        }
        storage
            .put("chk-1/a", Bytes::from_static(b"abc"))
            .await
            .unwrap();
        storage.write_metadata(&checkpoint(1)).await.unwrap();
        let metadata_size = metadata::encode(&checkpoint(1)).len() as u64;
        let counters = storage.counters();
        assert_eq!(counters.objects_created.load(Ordering::Relaxed), 3);
        assert_eq!(
            counters.bytes_uploaded.load(Ordering::Relaxed),
            1 + 1 + 3 + metadata_size
        );
        storage.delete_checkpoint(CheckpointId(1)).await.unwrap();
        assert_eq!(counters.objects_deleted.load(Ordering::Relaxed), 2);
        assert_eq!(storage.objects().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn metadata_is_created_once_and_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(dir.path().to_str().unwrap(), JobId(1)).unwrap();
        storage.write_metadata(&checkpoint(4)).await.unwrap();
        // The same bytes again (a retry whose first put landed) succeed.
        storage.write_metadata(&checkpoint(4)).await.unwrap();
        // Another writer's checkpoint 4 is refused, and the first stays.
        let mut other = checkpoint(4);
        other.timestamp += 1;
        let err = storage.write_metadata(&other).await.unwrap_err();
        assert!(matches!(err, StorageError::MetadataExists(_)), "{err}");
        assert_eq!(
            storage.read_metadata(CheckpointId(4)).await.unwrap(),
            checkpoint(4)
        );
    }

    #[tokio::test]
    async fn recovers_the_newest_from_storage_and_refuses_corrupted_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(dir.path().to_str().unwrap(), JobId(1)).unwrap();
        for id in [1, 2, 3] {
            storage.write_metadata(&checkpoint(id)).await.unwrap();
        }
        let store = storage.recover_store(2).await.unwrap();
        let ids: Vec<u64> = store.retained().map(|c| c.id.0).collect();
        assert_eq!(ids, [2, 3]);

        storage
            .put("chk-3/_metadata", bytes::Bytes::from_static(b"garbage"))
            .await
            .unwrap();
        let err = storage.recover_store(2).await.unwrap_err();
        assert!(err.to_string().contains("chk-3/_metadata"), "{err}");
    }

    #[test]
    fn a_missing_object_is_damaged_state_and_storage_down_is_not() {
        let missing = StorageError::Io {
            path: "chk-1/x".into(),
            source: object_store::Error::NotFound {
                path: "chk-1/x".into(),
                source: "gone".into(),
            },
        };
        assert_eq!(missing.restore_failure(), RestoreFailure::DamagedState);
        let down = StorageError::Io {
            path: "chk-1/x".into(),
            source: object_store::Error::Generic {
                store: "S3",
                source: "connection refused".into(),
            },
        };
        assert_eq!(down.restore_failure(), RestoreFailure::Other);
    }
}
