//! Where a file sink's part files wait between their barrier and their
//! checkpoint's completion, invisible to anyone listing the directory.
//!
//! In a local directory a part file is written under a hidden name
//! (`.inprogress-NAME`), renamed to `.pending-NAME` when sealed and to
//! `NAME` when committed. On an object store it is a multipart upload: its
//! parts are uploaded as it fills and when it is sealed, and the upload is
//! completed when it is committed. An upload cannot be listed through
//! `object_store`, so each has a record (`_tidemark-uploads/NAME`, holding
//! its path and id) from its creation until it is completed or aborted:
//! what a restore and `tidemark cleanup` find leftovers by.

use crate::io::wait;
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use tidemark_core::UserError;

/// The directory under an object store's sink directory that holds the
/// records of open uploads; `_` hides it from readers, as Flink and Spark
/// hide `_SUCCESS`.
pub const UPLOADS: &str = "_tidemark-uploads";
const IN_PROGRESS: &str = ".inprogress-";
const PENDING: &str = ".pending-";

/// A sealed part file, as a checkpoint holds it until it is committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// Where it becomes visible, relative to the sink's directory.
    pub path: String,
    /// Its multipart upload; `None` in a local directory.
    pub upload: Option<Upload>,
}

/// A multipart upload whose parts are all written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upload {
    /// The store's id of the upload.
    pub id: String,
    /// Its parts' ids, in order.
    pub parts: Vec<String>,
}

/// An open part file's bytes so far.
pub enum Stage {
    /// A hidden local file.
    Local(File),
    /// An upload, created with the first part.
    Upload {
        /// Its id, once created.
        id: Option<String>,
        /// The parts uploaded so far.
        parts: Vec<PartId>,
    },
}

/// A sink's directory: a local one, or one of an object store with
/// resumable multipart uploads.
#[derive(Clone)]
pub enum Directory {
    /// A local directory.
    Local(PathBuf),
    /// A prefix of an object store.
    Objects {
        /// The store, for upload records and checks.
        store: Arc<dyn ObjectStore>,
        /// The same store's multipart uploads.
        multipart: Arc<dyn MultipartStore>,
        /// The sink's directory in it.
        prefix: Path,
    },
}

impl Directory {
    /// The part file `path` (relative to the directory), opened.
    pub fn begin(&self, path: &str) -> Result<Stage, UserError> {
        match self {
            Directory::Local(root) => {
                let hidden = root.join(hidden(path, IN_PROGRESS));
                if let Some(parent) = hidden.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
                }
                let file = File::create(&hidden)
                    .map_err(|e| format!("cannot create {}: {e}", hidden.display()))?;
                Ok(Stage::Local(file))
            }
            Directory::Objects { .. } => Ok(Stage::Upload {
                id: None,
                parts: Vec::new(),
            }),
        }
    }

    /// Appends `bytes` to the open part file `path`: a part of its upload.
    pub fn append(&self, stage: &mut Stage, path: &str, bytes: Vec<u8>) -> Result<(), UserError> {
        match (self, stage) {
            (Directory::Local(root), Stage::Local(file)) => file
                .write_all(&bytes)
                .map_err(|e| format!("cannot write {}: {e}", root.join(path).display()).into()),
            (
                Directory::Objects {
                    store,
                    multipart,
                    prefix,
                },
                Stage::Upload { id, parts },
            ) => {
                let (store, multipart, at) =
                    (store.clone(), multipart.clone(), child(prefix, path));
                let (known, index) = (id.clone(), parts.len());
                let (record, relative) = (upload_record(prefix, path), path.to_owned());
                let (created, part) = wait(async move {
                    let id = match known {
                        Some(id) => id,
                        None => create_upload(&store, &multipart, &at, &relative, &record).await?,
                    };
                    let part = multipart
                        .put_part(&at, &id, index, PutPayload::from(bytes))
                        .await?;
                    Ok::<_, object_store::Error>((id, part))
                })?
                .map_err(|e| format!("cannot upload a part of {path}: {e}"))?;
                *id = Some(created);
                parts.push(part);
                Ok(())
            }
            _ => unreachable!("a stage belongs to its directory"),
        }
    }

    /// Writes the last `bytes` of `path` and makes it durable, invisible.
    pub fn seal(&self, mut stage: Stage, path: &str, last: Vec<u8>) -> Result<Pending, UserError> {
        if !last.is_empty() || matches!(stage, Stage::Upload { id: None, .. }) {
            self.append(&mut stage, path, last)?;
        }
        match (self, stage) {
            (Directory::Local(root), Stage::Local(file)) => {
                file.sync_all()
                    .map_err(|e| format!("cannot sync {}: {e}", root.join(path).display()))?;
                rename(
                    &root.join(hidden(path, IN_PROGRESS)),
                    &root.join(hidden(path, PENDING)),
                )?;
                Ok(Pending {
                    path: path.to_owned(),
                    upload: None,
                })
            }
            (Directory::Objects { .. }, Stage::Upload { id, parts }) => Ok(Pending {
                path: path.to_owned(),
                upload: Some(Upload {
                    id: id.expect("sealed uploads have a part"),
                    parts: parts.into_iter().map(|p| p.content_id).collect(),
                }),
            }),
            _ => unreachable!("a stage belongs to its directory"),
        }
    }

    /// Makes `pending` visible. Committing it again does nothing: a restore
    /// commits what its checkpoint pre-committed, some of which a run
    /// before it may have committed.
    pub fn commit(&self, pending: &Pending) -> Result<(), UserError> {
        match (self, &pending.upload) {
            (Directory::Local(root), None) => {
                let (from, to) = (
                    root.join(hidden(&pending.path, PENDING)),
                    root.join(&pending.path),
                );
                if from.exists() {
                    rename(&from, &to)
                } else if to.exists() {
                    Ok(())
                } else {
                    Err(format!("pre-committed file {} is missing", from.display()).into())
                }
            }
            (
                Directory::Objects {
                    store,
                    multipart,
                    prefix,
                },
                Some(upload),
            ) => {
                let (store, multipart) = (store.clone(), multipart.clone());
                let (at, record) = (
                    child(prefix, &pending.path),
                    upload_record(prefix, &pending.path),
                );
                let upload = upload.clone();
                let parts = upload
                    .parts
                    .iter()
                    .map(|id| PartId {
                        content_id: id.clone(),
                    })
                    .collect();
                wait(async move {
                    match multipart.complete_multipart(&at, &upload.id, parts).await {
                        Ok(_) => {}
                        // Completed before: the upload is gone, its file is
                        // there (no other upload writes that name).
                        Err(_) if store.head(&at).await.is_ok() => {}
                        Err(e) => return Err(e),
                    }
                    delete_if_exists(&store, &record).await
                })?
                .map_err(|e| format!("cannot commit {}: {e}", pending.path).into())
            }
            (directory, upload) => Err(format!(
                "pre-committed file {} was written {} and cannot be committed {}",
                pending.path,
                if upload.is_some() {
                    "as a multipart upload"
                } else {
                    "locally"
                },
                directory.describe()
            )
            .into()),
        }
    }

    /// Deletes every part file in progress or pending of the files named
    /// `part-{subtask}-{run}-…` or `part-{subtask}-{run}.…` (the run's
    /// later attempts): what a run wrote after the checkpoint it is
    /// restored from. Call after committing that checkpoint's files.
    pub fn abort_leftovers(&self, subtask: u32, run: &str) -> Result<usize, UserError> {
        let name = format!("part-{subtask}-{run}");
        let ours = |file: &str| of_run(file, subtask, run);
        match self {
            Directory::Local(root) => {
                let prefixes = [format!("{IN_PROGRESS}{name}"), format!("{PENDING}{name}")];
                let mut found = Vec::new();
                hidden_files(root, &prefixes, &mut found)?;
                found.retain(|file| {
                    let file = file.file_name().unwrap_or_default().to_string_lossy();
                    let visible = file
                        .strip_prefix(IN_PROGRESS)
                        .or(file.strip_prefix(PENDING));
                    visible.is_some_and(ours)
                });
                for file in &found {
                    std::fs::remove_file(file)
                        .map_err(|e| format!("cannot delete {}: {e}", file.display()))?;
                }
                Ok(found.len())
            }
            Directory::Objects { .. } => {
                let (dir, run_owned) = (self.clone(), run.to_owned());
                wait(async move {
                    let mut mine = dir.open_uploads(&name).await?;
                    let file =
                        |u: &OpenUpload| u.path.rsplit('/').next().unwrap_or_default().to_owned();
                    mine.retain(|u| of_run(&file(u), subtask, &run_owned));
                    for upload in &mine {
                        dir.abort(upload).await?;
                    }
                    Ok::<_, object_store::Error>(mine.len())
                })?
                .map_err(|e| format!("cannot abort the uploads left by run {run}: {e}").into())
            }
        }
    }

    /// The uploads held open in this directory (none in a local one) for
    /// part files whose names start with `name`, found by their records.
    /// A record deleted while they are read (its upload just completed) is
    /// skipped.
    pub async fn open_uploads(&self, name: &str) -> Result<Vec<OpenUpload>, object_store::Error> {
        let Directory::Objects { store, prefix, .. } = self else {
            return Ok(Vec::new());
        };
        let listed: Vec<_> = store
            .list(Some(&child(prefix, UPLOADS)))
            .try_collect()
            .await?;
        let mut out = Vec::new();
        for meta in listed {
            if !meta
                .location
                .filename()
                .is_some_and(|f| f.starts_with(name))
            {
                continue;
            }
            let bytes = match store.get(&meta.location).await {
                Ok(got) => got.bytes().await?,
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e),
            };
            let body: RecordBody =
                serde_json::from_slice(&bytes).map_err(|e| object_store::Error::Generic {
                    store: "tidemark",
                    source: format!("{} is not an upload record: {e}", meta.location).into(),
                })?;
            out.push(OpenUpload {
                path: body.path,
                id: body.id,
                since: meta.last_modified.into(),
                record: meta.location,
            });
        }
        Ok(out)
    }

    /// Aborts `upload` and deletes its record. An upload completed or
    /// aborted before is not an error.
    pub async fn abort(&self, upload: &OpenUpload) -> Result<(), object_store::Error> {
        let Directory::Objects {
            store,
            multipart,
            prefix,
        } = self
        else {
            return Ok(());
        };
        match multipart
            .abort_multipart(&child(prefix, &upload.path), &upload.id)
            .await
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        delete_if_exists(store, &upload.record).await
    }

    fn describe(&self) -> String {
        match self {
            Directory::Local(root) => format!("in the local directory {}", root.display()),
            Directory::Objects { prefix, .. } => format!("in the object store directory {prefix}"),
        }
    }
}

/// What an upload's record holds.
#[derive(Serialize, Deserialize)]
struct RecordBody {
    path: String,
    id: String,
}

/// A multipart upload a sink directory holds open, found by its record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenUpload {
    /// The part file's path, relative to the sink's directory.
    pub path: String,
    /// The store's id of the upload.
    pub id: String,
    /// When its record was written: when the upload began.
    pub since: std::time::SystemTime,
    /// Where its record is.
    pub record: Path,
}

/// Creates the upload of `at` (`relative` in the sink's directory) and
/// its record, before any part is written.
async fn create_upload(
    store: &Arc<dyn ObjectStore>,
    multipart: &Arc<dyn MultipartStore>,
    at: &Path,
    relative: &str,
    record: &Path,
) -> Result<String, object_store::Error> {
    let id = multipart.create_multipart(at).await?;
    let body = RecordBody {
        path: relative.to_owned(),
        id: id.clone(),
    };
    let bytes = serde_json::to_vec(&body).expect("an upload record serializes");
    store.put(record, Bytes::from(bytes).into()).await?;
    Ok(id)
}

async fn delete_if_exists(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
) -> Result<(), object_store::Error> {
    match store.delete(path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `relative` (`a/b/c`) under `prefix`.
fn child(prefix: &Path, relative: &str) -> Path {
    relative
        .split('/')
        .filter(|part| !part.is_empty())
        .fold(prefix.clone(), |path, part| path.join(part))
}

/// The record of the upload of the part file `path`: part file names are
/// unique in a sink's directory, whatever their bucket.
fn upload_record(prefix: &Path, path: &str) -> Path {
    let name = path.rsplit('/').next().unwrap_or(path);
    child(prefix, UPLOADS).join(name)
}

/// `path` with its file name hidden behind `marker`.
fn hidden(path: &str, marker: &str) -> String {
    match path.rsplit_once('/') {
        Some((bucket, name)) => format!("{bucket}/{marker}{name}"),
        None => format!("{marker}{path}"),
    }
}

/// Collects the files under `dir` whose name starts with one of `prefixes`.
fn hidden_files(
    dir: &std::path::Path,
    prefixes: &[String],
    out: &mut Vec<PathBuf>,
) -> Result<(), UserError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_dir() {
            hidden_files(&entry.path(), prefixes, out)?;
        } else if prefixes.iter().any(|p| name.starts_with(p.as_str())) {
            out.push(entry.path());
        }
    }
    Ok(())
}

/// Whether part file `name` is subtask `subtask`'s in run `run` or in a
/// later attempt's run of it (`RUN.ATTEMPT`), and not in another run whose
/// name merely starts with `run`.
fn of_run(name: &str, subtask: u32, run: &str) -> bool {
    let Some(rest) = name.strip_prefix(&format!("part-{subtask}-{run}")) else {
        return false;
    };
    match rest.strip_prefix('.') {
        None => rest.starts_with('-'),
        Some(attempt) => attempt
            .split_once('-')
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
    }
}

/// Renames `from` to `to` and syncs the directory, so that the new name
/// survives a power loss: a commit is only acknowledged once it is durable.
fn rename(from: &std::path::Path, to: &std::path::Path) -> Result<(), UserError> {
    std::fs::rename(from, to)
        .map_err(|e| format!("cannot rename {} to {}: {e}", from.display(), to.display()))?;
    let dir = to.parent().unwrap_or(std::path::Path::new("."));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("cannot sync directory {}: {e}", dir.display()).into())
}

#[cfg(test)]
mod tests {
    use super::of_run;

    #[test]
    fn a_runs_leftovers_are_its_own_and_its_later_attempts_only() {
        for ours in ["part-3-r-0.csv", "part-3-r.2-0.csv", "part-3-r.15-7"] {
            assert!(of_run(ours, 3, "r"), "{ours}");
        }
        for theirs in [
            "part-3-r2-0.csv",
            "part-3-r.x-0",
            "part-3-r.-0",
            "part-4-r-0",
            "part-3-r.2",
        ] {
            assert!(!of_run(theirs, 3, "r"), "{theirs}");
        }
    }
}
