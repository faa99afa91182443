//! The rules of a file sink's part files, without IO: which file a record
//! goes to, when a file rolls, which sealed files a checkpoint pre-commits
//! and which a completed checkpoint commits, what a restore commits.
//!
//! A part file is open (receiving records), then sealed (complete but
//! invisible: pending), then committed (visible under its name). Every
//! barrier seals every open file, so a checkpoint's pending files hold
//! exactly what was written before its barrier. `O` is what the IO shell
//! keeps of an open file, `P` what it needs to commit a sealed one.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use tidemark_core::model::ids::CheckpointId;

/// When an open part file is sealed before the next barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RollPolicy {
    /// Once it holds this many bytes.
    pub size: u64,
    /// Once it has been open this long.
    pub interval: Duration,
}

/// What a sink subtask checkpoints: enough to commit what its checkpoint
/// pre-committed and to name new files as the restored run would have.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartsState<P> {
    /// The run whose files these are: part of every name.
    pub run: String,
    /// The subtask that wrote them.
    pub subtask: u32,
    /// The number of the next part file.
    pub next_part: u64,
    /// Sealed files not yet known to be committed, each with the
    /// checkpoint that pre-committed it.
    pub pending: Vec<(CheckpointId, P)>,
}

struct Open<O> {
    file: O,
    bytes: u64,
    opened_ms: u64,
}

/// One sink subtask's part files.
pub struct Parts<O, P> {
    run: String,
    subtask: u32,
    roll: RollPolicy,
    next_part: u64,
    /// The open file of each bucket.
    open: BTreeMap<String, Open<O>>,
    /// Sealed since the last barrier.
    sealed: Vec<P>,
    pending: Vec<(CheckpointId, P)>,
}

impl<O, P: Clone> Parts<O, P> {
    /// A fresh run `run` of subtask `subtask`.
    pub fn new(run: String, subtask: u32, roll: RollPolicy) -> Self {
        Parts {
            run,
            subtask,
            roll,
            next_part: 0,
            open: BTreeMap::new(),
            sealed: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// The run this subtask's files are named after.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// The open file of `bucket`, if any.
    pub fn open_file(&mut self, bucket: &str) -> Option<&mut O> {
        self.open.get_mut(bucket).map(|open| &mut open.file)
    }

    /// The name (within its bucket) of the next part file, with `suffix`:
    /// unique in the run, and the same again for a replay after a restore,
    /// so that a replayed file replaces its twin instead of adding to it.
    pub fn next_name(&mut self, suffix: &str) -> String {
        let name = format!(
            "part-{}-{}-{}{suffix}",
            self.subtask, self.run, self.next_part
        );
        self.next_part += 1;
        name
    }

    /// `file` is now `bucket`'s open file, opened at `now_ms`.
    pub fn opened(&mut self, bucket: String, file: O, now_ms: u64) {
        let open = Open {
            file,
            bytes: 0,
            opened_ms: now_ms,
        };
        assert!(
            self.open.insert(bucket, open).is_none(),
            "a bucket has one open part file"
        );
    }

    /// `bytes` more went into `bucket`'s open file; whether it is due to
    /// roll by size.
    pub fn wrote(&mut self, bucket: &str, bytes: u64) -> bool {
        let open = self.open.get_mut(bucket).expect("written files are open");
        open.bytes += bytes;
        open.bytes >= self.roll.size
    }

    /// The buckets whose open file has been open for the roll interval.
    pub fn due_by_time(&self, now_ms: u64) -> Vec<String> {
        let interval = u64::try_from(self.roll.interval.as_millis()).unwrap_or(u64::MAX);
        self.open
            .iter()
            .filter(|(_, open)| now_ms.saturating_sub(open.opened_ms) >= interval)
            .map(|(bucket, _)| bucket.clone())
            .collect()
    }

    /// Takes `bucket`'s open file out to be sealed.
    pub fn roll(&mut self, bucket: &str) -> Option<O> {
        self.open.remove(bucket).map(|open| open.file)
    }

    /// Takes every open file out to be sealed: at a barrier, at the end.
    pub fn roll_all(&mut self) -> Vec<O> {
        std::mem::take(&mut self.open)
            .into_values()
            .map(|open| open.file)
            .collect()
    }

    /// A rolled file was sealed as `pending`.
    pub fn sealed(&mut self, pending: P) {
        self.sealed.push(pending);
    }

    /// The barrier of `checkpoint` passed and every open file was sealed:
    /// the files sealed since the last barrier become its pending files.
    /// Returns the state to checkpoint.
    pub fn pre_commit(&mut self, checkpoint: CheckpointId) -> PartsState<P> {
        assert!(self.open.is_empty(), "a barrier seals every open file");
        self.pending.extend(
            std::mem::take(&mut self.sealed)
                .into_iter()
                .map(|p| (checkpoint, p)),
        );
        self.state()
    }

    /// `checkpoint` completed: the pending files to commit, those of it
    /// and of every earlier one.
    pub fn complete(&mut self, checkpoint: CheckpointId) -> Vec<P> {
        let (due, later) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(id, _)| *id <= checkpoint);
        self.pending = later;
        due.into_iter().map(|(_, p)| p).collect()
    }

    /// End of input, every open file sealed: everything to commit now.
    pub fn finish(&mut self) -> Vec<P> {
        assert!(self.open.is_empty(), "the end seals every open file");
        let mut all: Vec<P> = std::mem::take(&mut self.pending)
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        all.append(&mut self.sealed);
        all
    }

    fn state(&self) -> PartsState<P> {
        PartsState {
            run: self.run.clone(),
            subtask: self.subtask,
            next_part: self.next_part,
            pending: self.pending.clone(),
        }
    }

    /// Goes on from a checkpoint's `state`: the run and the numbering it
    /// had. Returns what that checkpoint pre-committed, which the shell
    /// commits (it may be committed already) before it aborts every other
    /// file of this run and subtask.
    pub fn restore(&mut self, state: PartsState<P>) -> Vec<P> {
        assert!(
            self.open.is_empty() && self.sealed.is_empty(),
            "a sink is restored before it writes"
        );
        self.run = state.run;
        self.next_part = state.next_part;
        self.pending.clear();
        state.pending.into_iter().map(|(_, p)| p).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLL: RollPolicy = RollPolicy {
        size: 100,
        interval: Duration::from_secs(60),
    };

    /// Opens `bucket`'s file if it has none and writes `bytes` into it, as
    /// the shell does; returns the file's name and whether it is due.
    fn write(parts: &mut Parts<String, String>, bucket: &str, bytes: u64) -> (String, bool) {
        if parts.open_file(bucket).is_none() {
            let name = parts.next_name("");
            parts.opened(bucket.into(), name, 0);
        }
        let name = parts.open_file(bucket).unwrap().clone();
        (name, parts.wrote(bucket, bytes))
    }

    fn seal_all(parts: &mut Parts<String, String>) {
        for file in parts.roll_all() {
            parts.sealed(file);
        }
    }

    #[test]
    fn a_checkpoint_commits_what_was_written_before_its_barrier() {
        let mut parts = Parts::new("r".into(), 3, ROLL);
        write(&mut parts, "a", 10);
        write(&mut parts, "b", 10);
        seal_all(&mut parts);
        parts.pre_commit(CheckpointId(1));
        write(&mut parts, "a", 10);
        seal_all(&mut parts);
        let state = parts.pre_commit(CheckpointId(2));
        assert_eq!(state.pending.len(), 3, "nothing completed yet");
        assert_eq!(
            parts.complete(CheckpointId(1)),
            ["part-3-r-0", "part-3-r-1"]
        );
        assert_eq!(parts.complete(CheckpointId(2)), ["part-3-r-2"]);
        assert!(parts.complete(CheckpointId(2)).is_empty());
    }

    #[test]
    fn files_roll_by_size_and_by_time_into_the_next_checkpoint() {
        let mut parts = Parts::new("r".into(), 0, ROLL);
        assert!(!write(&mut parts, "a", 60).1);
        assert!(write(&mut parts, "a", 40).1, "100 bytes is the roll size");
        let rolled = parts.roll("a").unwrap();
        parts.sealed(rolled);
        write(&mut parts, "a", 1);
        assert!(parts.due_by_time(59_999).is_empty());
        assert_eq!(parts.due_by_time(60_000), ["a"]);
        seal_all(&mut parts);
        parts.pre_commit(CheckpointId(7));
        assert_eq!(parts.complete(CheckpointId(7)).len(), 2);
    }

    #[test]
    fn a_restore_continues_the_run_and_numbering_of_its_checkpoint() {
        let mut crashed = Parts::new("r1".into(), 0, ROLL);
        write(&mut crashed, "", 1);
        seal_all(&mut crashed);
        let state = crashed.pre_commit(CheckpointId(1));
        let (after, _) = write(&mut crashed, "", 1);
        assert_eq!(after, "part-0-r1-1");

        let mut restored = Parts::new("r2".into(), 0, ROLL);
        assert_eq!(restored.restore(state), ["part-0-r1-0"]);
        assert_eq!(restored.run(), "r1");
        let (replayed, _) = write(&mut restored, "", 1);
        assert_eq!(replayed, after, "the replay writes the same name again");
        seal_all(&mut restored);
        assert_eq!(restored.finish(), ["part-0-r1-1"]);
    }

    #[test]
    fn the_end_commits_pending_and_sealed_files_alike() {
        let mut parts = Parts::new("r".into(), 0, ROLL);
        write(&mut parts, "", 1);
        seal_all(&mut parts);
        parts.pre_commit(CheckpointId(1));
        write(&mut parts, "", 1);
        seal_all(&mut parts);
        assert_eq!(parts.finish(), ["part-0-r-0", "part-0-r-1"]);
    }
}
