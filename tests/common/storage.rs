//! What checkpoint storage holds after a run, against what the retained
//! checkpoints' metadata references.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use tidemark::checkpoint::{metadata, CompletedCheckpoint};

/// The job's directory: the only entry of the checkpoint root.
pub fn job_dir(root: &Path) -> PathBuf {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries.remove(0)
}

/// Every file under `dir`, relative to it.
pub fn files(dir: &Path) -> BTreeSet<String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                let relative = path.strip_prefix(base).unwrap();
                out.insert(relative.to_str().unwrap().to_owned());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// The completed checkpoints in the job directory, oldest first.
pub fn retained(job: &Path) -> Vec<CompletedCheckpoint> {
    let mut checkpoints: Vec<CompletedCheckpoint> = files(job)
        .iter()
        .filter(|f| f.ends_with("/_metadata"))
        .map(|f| metadata::decode(&std::fs::read(job.join(f)).unwrap()).unwrap())
        .collect();
    checkpoints.sort_by_key(|c| c.id);
    checkpoints
}

/// Storage holds exactly the id counter, the retained checkpoints' metadata
/// and the objects they reference: the state of aborted, subsumed and
/// abandoned checkpoints is gone, and nothing referenced is missing.
pub fn assert_storage_is_exactly_the_retained_checkpoints(
    job: &Path,
    context: &str,
) -> Vec<CompletedCheckpoint> {
    let checkpoints = retained(job);
    let mut referenced: BTreeSet<String> = checkpoints
        .iter()
        .flat_map(|c| c.subtasks.values())
        .flat_map(|c| c.objects())
        .map(str::to_owned)
        .collect();
    referenced.extend(checkpoints.iter().map(|c| format!("{}/_metadata", c.id)));
    referenced.insert("checkpoint-id-counter".into());
    assert_eq!(files(job), referenced, "{context}");
    checkpoints
}
