//! `tidemark cleanup`: finds the orphans of a job's checkpoint directory,
//! the objects no retained checkpoint references (the uploads of a process
//! that died before it could report or delete them, shared files of
//! checkpoints gone), and reports them; with `--delete` it sweeps them.
//!
//! Retained means every checkpoint whose `_metadata` is in storage. Its
//! metadata, the objects it references and the id counter are kept; so is
//! every object younger than the grace period, which covers the uploads of
//! checkpoints still in progress in a running job as long as the grace
//! period exceeds the checkpoint timeout. Only the job's directory is ever
//! listed or deleted from. A sweep that deletes holds the directory's lease
//! while it does: it is refused while a run of the job is alive, and no run
//! starts during it.
//!
//! With `--sink`, the multipart uploads a file sink's directory holds open
//! are swept too: those older than the grace period that no retained
//! checkpoint pre-committed (a run killed while writing) are aborted.

use crate::config::values;
use crate::{block_on, CliError};
use clap::Args;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tidemark_actors::runtime::job_id;
use tidemark_connectors::files::sink::{
    pending_uploads, FileSinkConfig, FileSinkError, OpenUpload,
};
use tidemark_core::checkpoint::lease::LeaseConfig;
use tidemark_core::checkpoint::{entries, CompletedCheckpoint};
use tidemark_storage::lease::{Lease, LEASES};
use tidemark_storage::{CheckpointStorage, StorageError, StoredObject, COUNTER, START};

/// `tidemark cleanup`'s arguments.
#[derive(Clone, Debug, Args)]
pub struct CleanupArgs {
    /// Checkpoint storage, as given to `run`.
    #[arg(long)]
    pub checkpoint_dir: String,
    /// Name of the job whose directory is swept.
    #[arg(long, default_value = crate::topologies::wordcount::JOB_NAME)]
    pub job: String,
    /// Delete the orphans (and abort the stale uploads) it finds; without
    /// it, cleanup only reports them.
    #[arg(long)]
    pub delete: bool,
    /// Only report, which is the default: accepted for the scripts written
    /// when cleanup deleted unless told otherwise.
    #[arg(long, hide = true, conflicts_with = "delete")]
    pub dry_run: bool,
    /// Unreferenced objects younger than this are kept; against a running
    /// job it must exceed the checkpoint timeout.
    #[arg(long, default_value = "1h", value_parser = values::flag_duration)]
    pub grace: Duration,
    /// Treat a checkpoint whose `_metadata` does not decode as not retained,
    /// so that its metadata and the objects it may reference are swept too.
    /// Without it, such metadata stops the cleanup.
    #[arg(long)]
    pub ignore_corrupted_metadata: bool,
    /// A file sink's directory (as given to `run --sink`) whose open
    /// multipart uploads are swept as well.
    #[arg(long, value_name = "URL")]
    pub sink: Option<String>,
}

/// An unreferenced object, and how long ago it was last written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orphan {
    /// Relative to the job's directory.
    pub path: String,
    /// Bytes.
    pub size: u64,
    /// Since it was last written: young ones may belong to a checkpoint in
    /// progress.
    pub age: Duration,
}

/// What a sweep found, and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sweep {
    /// The job's directory in the storage, for the reader.
    pub job_dir: String,
    /// Older than the grace period: deleted with `--delete`, `_metadata`
    /// first.
    pub orphans: Vec<Orphan>,
    /// Unreferenced but younger than the grace period: kept.
    pub young: Vec<Orphan>,
    /// Corrupted metadata swept under `--ignore-corrupted-metadata`.
    pub corrupted: Vec<String>,
    /// The `--sink` directory's open uploads older than the grace period
    /// that no retained checkpoint pre-committed: aborted with `--delete`.
    pub stale_uploads: Vec<OpenUpload>,
    /// Its other open uploads: young, or pre-committed.
    pub kept_uploads: usize,
    /// Whether the orphans were deleted, or only reported.
    pub deleted: bool,
}

/// Paths a retained checkpoint references besides its `_metadata`: the one
/// place cleanup reads state handles.
fn referenced(checkpoint: &CompletedCheckpoint) -> impl Iterator<Item = &str> {
    checkpoint.objects().into_iter()
}

/// Splits the unreferenced objects of a listing into orphans older than
/// `grace` and younger ones.
fn plan(
    objects: Vec<StoredObject>,
    retained: &[CompletedCheckpoint],
    grace: Duration,
    now: SystemTime,
) -> (Vec<Orphan>, Vec<Orphan>) {
    let mut keep: BTreeSet<&str> = retained.iter().flat_map(referenced).collect();
    let metadata: Vec<String> = retained
        .iter()
        .map(|c| CheckpointStorage::metadata_path(c.id))
        .collect();
    keep.extend(metadata.iter().map(String::as_str));
    keep.insert(COUNTER);
    keep.insert(START);
    let (mut old, young): (Vec<Orphan>, Vec<Orphan>) = objects
        .into_iter()
        .filter(|o| !keep.contains(o.path.as_str()) && !o.path.starts_with(&format!("{LEASES}/")))
        .map(|o| Orphan {
            age: now.duration_since(o.last_modified).unwrap_or_default(),
            path: o.path,
            size: o.size,
        })
        .partition(|o| o.age >= grace);
    // A reader must never find metadata whose state is half gone.
    old.sort_by_key(|o| (!o.path.ends_with("/_metadata"), o.path.clone()));
    (old, young)
}

/// Splits a sink directory's open uploads into those to abort and how many
/// to keep: young ones (a running job's) and those a retained checkpoint
/// pre-committed, which its restore completes.
fn plan_uploads(
    uploads: Vec<OpenUpload>,
    retained: &[CompletedCheckpoint],
    grace: Duration,
    now: SystemTime,
) -> (Vec<OpenUpload>, usize) {
    let pre_committed: BTreeSet<String> = retained
        .iter()
        .flat_map(|c| c.subtasks.values())
        .filter_map(|state| state.operator.get(entries::SINK))
        .filter_map(|state| pending_uploads(state))
        .flatten()
        .collect();
    let total = uploads.len();
    let stale: Vec<OpenUpload> = uploads
        .into_iter()
        .filter(|u| !pre_committed.contains(&u.id))
        .filter(|u| now.duration_since(u.since).unwrap_or_default() >= grace)
        .collect();
    let kept = total - stale.len();
    (stale, kept)
}

/// Lists the job directory and reads every checkpoint's metadata listed
/// there. A checkpoint subsumed during the scan makes its objects look
/// unreferenced while its successor's metadata may not have been listed, so
/// the scan starts over when listed metadata vanishes.
async fn scan(
    storage: &CheckpointStorage,
    ignore_corrupted: bool,
) -> Result<(Vec<StoredObject>, Vec<CompletedCheckpoint>, Vec<String>), CliError> {
    const ATTEMPTS: usize = 5;
    'scan: for _ in 0..ATTEMPTS {
        let objects = storage.objects().await?;
        let (mut retained, mut corrupted) = (Vec::new(), Vec::new());
        for id in CheckpointStorage::completed_ids_in(&objects) {
            match storage.read_metadata(id).await {
                Ok(checkpoint) => retained.push(checkpoint),
                Err(StorageError::Metadata { path, source }) => {
                    corrupted.push(format!("{path}: {source}"));
                }
                Err(e) if e.is_not_found() => continue 'scan,
                Err(e) => return Err(e.into()),
            }
        }
        if !corrupted.is_empty() && !ignore_corrupted {
            return Err(CliError::CorruptedMetadata(corrupted));
        }
        return Ok((objects, retained, corrupted));
    }
    Err(CliError::StorageChanging { attempts: ATTEMPTS })
}

/// Plans without writing anything; only a sweep with orphans to delete
/// leases the directory, and plans again under the lease, since a run may
/// have changed it in between.
async fn sweep(storage: &CheckpointStorage, args: &CleanupArgs) -> Result<Sweep, CliError> {
    let planned = sweep_with(storage, args, false).await?;
    if !args.delete || (planned.orphans.is_empty() && planned.stale_uploads.is_empty()) {
        return Ok(planned);
    }
    let lease = Arc::new(Lease::acquire(storage, &LeaseConfig::default()).await?);
    let swept = sweep_with(&storage.fenced(lease.clone()), args, true).await;
    lease.release().await?;
    swept
}

async fn sweep_with(
    storage: &CheckpointStorage,
    args: &CleanupArgs,
    delete: bool,
) -> Result<Sweep, CliError> {
    let (objects, retained, corrupted) = scan(storage, args.ignore_corrupted_metadata).await?;
    let (orphans, young) = plan(objects, &retained, args.grace, SystemTime::now());
    let (stale_uploads, kept_uploads) = match &args.sink {
        Some(url) => {
            let sink = FileSinkConfig::from_url(url).map_err(|e| CliError::Usage {
                argument: "--sink".into(),
                problem: e.to_string(),
            })?;
            let open = sink.open_uploads().await.map_err(sink_failed)?;
            let (stale, kept) = plan_uploads(open, &retained, args.grace, SystemTime::now());
            if delete {
                for upload in &stale {
                    sink.abort(upload).await.map_err(sink_failed)?;
                }
            }
            (stale, kept)
        }
        None => (Vec::new(), 0),
    };
    if delete {
        let paths = orphans.iter().map(|o| o.path.clone()).collect();
        let failed = storage.delete_many(paths).await?;
        for (path, e) in &failed {
            tracing::warn!(error = %e, path, "deleting an orphan failed");
        }
        if let Some((_, error)) = failed.into_iter().next() {
            return Err(error.into());
        }
    }
    Ok(Sweep {
        job_dir: storage.directory(),
        orphans,
        young,
        corrupted,
        stale_uploads,
        kept_uploads,
        deleted: delete,
    })
}

fn sink_failed(e: FileSinkError) -> CliError {
    CliError::Usage {
        argument: "--sink".into(),
        problem: e.to_string(),
    }
}

/// Reports what a sweep of the job's directory in the checkpoint storage
/// would delete, or with `--delete` sweeps it.
pub fn cleanup(args: &CleanupArgs) -> Result<Sweep, CliError> {
    let storage =
        CheckpointStorage::open(&args.checkpoint_dir, job_id(&args.job)).map_err(|e| {
            CliError::Usage {
                argument: "--checkpoint-dir".into(),
                problem: e.to_string(),
            }
        })?;
    block_on(sweep(&storage, args))?
}

impl fmt::Display for Sweep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for corrupted in &self.corrupted {
            writeln!(f, "ignoring corrupted metadata {corrupted}")?;
        }
        for orphan in &self.orphans {
            let age = humantime::format_duration(Duration::from_secs(orphan.age.as_secs()));
            writeln!(f, "{}\t{} bytes\t{age} old", orphan.path, orphan.size)?;
        }
        for upload in &self.stale_uploads {
            writeln!(f, "upload {}\tof {}", upload.id, upload.path)?;
        }
        let bytes: u64 = self.orphans.iter().map(|o| o.size).sum();
        let (verb, abort) = if self.deleted {
            ("deleted", "aborted")
        } else {
            ("would delete", "would abort")
        };
        if !self.stale_uploads.is_empty() || self.kept_uploads > 0 {
            writeln!(
                f,
                "sink: {abort} {} open uploads; kept {} young or pre-committed",
                self.stale_uploads.len(),
                self.kept_uploads
            )?;
        }
        write!(
            f,
            "{}: {verb} {} orphans ({bytes} bytes); kept {} unreferenced objects younger than the grace period",
            self.job_dir,
            self.orphans.len(),
            self.young.len()
        )?;
        let found = !self.orphans.is_empty() || !self.stale_uploads.is_empty();
        if found && !self.deleted {
            write!(f, "\nnothing was deleted: pass --delete to delete them")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tidemark_core::checkpoint::{
        KeyGroupsStateHandle, KeyedStateHandle, StateHandle, SubtaskState,
    };
    use tidemark_core::model::event::CheckpointKind;
    use tidemark_core::model::ids::{CheckpointId, OperatorId, SubtaskId, SubtaskIndex};

    const HOUR: Duration = Duration::from_secs(3600);

    fn object(path: &str, age: Duration, now: SystemTime) -> StoredObject {
        StoredObject {
            path: path.into(),
            size: 10,
            last_modified: now - age,
        }
    }

    fn checkpoint(id: u64, state: &[&str]) -> CompletedCheckpoint {
        let subtasks = state.iter().enumerate().map(|(i, path)| {
            let subtask = SubtaskId {
                operator: OperatorId(0),
                index: SubtaskIndex(i as u32),
            };
            let keyed = KeyedStateHandle::KeyGroups(KeyGroupsStateHandle {
                start_group: 0,
                offsets: vec![0],
                handle: StateHandle::object(*path, 10, 0),
            });
            let state = SubtaskState {
                keyed: Some(keyed),
                ..SubtaskState::default()
            };
            (subtask, state)
        });
        CompletedCheckpoint {
            id: CheckpointId(id),
            kind: CheckpointKind::Checkpoint,
            format: Default::default(),
            operators: Vec::new(),
            edges: Vec::new(),
            key_hash: tidemark_core::model::key_hash::KEY_HASH_VERSION,
            timestamp: 0,
            subtasks: subtasks.collect(),
            master_states: BTreeMap::new(),
        }
    }

    #[test]
    fn only_old_unreferenced_objects_are_orphans_metadata_first() {
        let now = SystemTime::UNIX_EPOCH + 100 * HOUR;
        let objects = vec![
            object("checkpoint-id-counter", 5 * HOUR, now),
            object("chk-3/_metadata", 5 * HOUR, now),
            object("chk-3/op-0-0", 5 * HOUR, now),
            object("shared/reused", 9 * HOUR, now),
            object("chk-2/op-0-0", 2 * HOUR, now),
            object("chk-2/_metadata", 2 * HOUR, now),
            object("chk-4/op-0-0", Duration::from_secs(60), now),
        ];
        let retained = [checkpoint(3, &["chk-3/op-0-0", "shared/reused"])];
        let (old, young) = plan(objects, &retained, HOUR, now);
        let paths = |v: &[Orphan]| v.iter().map(|o| o.path.clone()).collect::<Vec<_>>();
        assert_eq!(paths(&old), ["chk-2/_metadata", "chk-2/op-0-0"]);
        assert_eq!(old[0].age, 2 * HOUR);
        assert_eq!(paths(&young), ["chk-4/op-0-0"]);
    }

    #[test]
    fn an_object_from_a_store_clock_ahead_of_ours_is_young() {
        let now = SystemTime::UNIX_EPOCH + 100 * HOUR;
        let ahead = object("chk-9/op-0-0", Duration::ZERO, now + HOUR);
        let (old, young) = plan(vec![ahead], &[], HOUR, now);
        assert!(old.is_empty());
        assert_eq!(young[0].age, Duration::ZERO);
    }

    #[test]
    fn uploads_are_stale_when_old_and_not_pre_committed() {
        use tidemark_core::{Sink, SinkContext};
        let url = format!("memory://cleanup-uploads-{}/out", std::process::id());
        let _hold = tidemark_storage::Location::open(&url, true).unwrap();
        let config = FileSinkConfig::from_url(&format!("{url}?part-size=1")).unwrap();
        let ctx = SinkContext {
            subtask: SubtaskIndex(0),
            parallelism: 1,
            attempt: tidemark_core::model::ids::Attempt::default(),
        };
        let mut sink = tidemark_connectors::files::sink::FileSink::new(&config, "r", ctx);
        sink.write(&mut vec![(1u64, 1u64)]).unwrap();
        let state = sink.pre_commit(CheckpointId(1)).unwrap();
        sink.write(&mut vec![(2u64, 2u64)]).unwrap();
        let open = block_on(config.open_uploads()).unwrap().unwrap();
        assert_eq!(open.len(), 2);

        let mut retained = checkpoint(1, &[]);
        let mut subtask = SubtaskState::default();
        subtask.operator.insert(entries::SINK.into(), state);
        retained.subtasks.insert(
            SubtaskId {
                operator: OperatorId(3),
                index: SubtaskIndex(0),
            },
            subtask,
        );
        let later = SystemTime::now() + 2 * HOUR;
        let (stale, kept) = plan_uploads(open.clone(), &[retained.clone()], HOUR, later);
        assert_eq!(
            stale,
            [open[1].clone()],
            "the one no checkpoint pre-committed"
        );
        assert_eq!(kept, 1);
        let (stale, kept) = plan_uploads(open, &[retained], HOUR, SystemTime::now());
        assert!(stale.is_empty(), "young uploads may be a running job's");
        assert_eq!(kept, 2);
    }
}
