//! A checkpoint's write-back, made off the subtask's thread: the values
//! the synchronous part took from the write-back cache, written into the
//! database, then the native checkpoint. The core starts no thread: the
//! shell runs the job on its blocking pool ([`PendingNative::job`]), and
//! whichever of the backend (which needs its database back) and the
//! asynchronous part (which needs the checkpoint) comes to it first while
//! it has not started runs it there and then. Either way it runs once.

use super::snapshot::NativeCheckpoint;
use super::store::{Database, EmbeddedStore, SortedWrites};
use super::StateError;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// The values a checkpoint took from one state's cache.
pub(super) struct Taken {
    /// The state's name: its column family.
    pub(super) family: String,
    pub(super) writes: SortedWrites,
    /// They are every value the state holds, and replace the family's.
    pub(super) whole: bool,
}

/// What the job writes and makes.
pub(super) struct Job {
    pub(super) db: Box<dyn Database>,
    /// What was taken from each state's cache.
    pub(super) writes: Vec<Taken>,
    /// The checkpoint to make, its files not yet listed.
    pub(super) native: NativeCheckpoint,
}

impl Job {
    /// Sorts and writes each state's values into its column family (or
    /// replaces the family's with them), then makes the checkpoint of every
    /// family; returns whether the writes went in, and the checkpoint.
    fn run(&mut self) -> (Result<(), StateError>, Result<NativeCheckpoint, StateError>) {
        let db = &mut *self.db;
        let written = self
            .writes
            .iter_mut()
            .filter(|taken| taken.whole || !taken.writes.is_empty())
            .try_for_each(|taken| {
                taken.writes.sort();
                match taken.whole {
                    true => db.replace(&taken.family, &taken.writes),
                    false => db.write(&taken.family, &taken.writes),
                }
            });
        let made = match &written {
            Ok(()) => {
                let families: Vec<&str> = self.writes.iter().map(|t| t.family.as_str()).collect();
                let mut native = self.native.clone();
                db.checkpoint(&families, &native.dir).map(|files| {
                    native.files = files;
                    native
                })
            }
            Err(e) => Err(e.clone()),
        };
        (written, made)
    }
}

enum Making {
    /// Not started.
    Ready(Box<Job>),
    Running,
    Done {
        /// `None` once the backend took it back, or if the job panicked.
        db: Option<Box<dyn Database>>,
        written: Result<(), StateError>,
        /// `None` once the asynchronous part took it.
        made: Option<Result<NativeCheckpoint, StateError>>,
    },
}

struct Inner {
    making: Making,
    /// The asynchronous part dropped its end unwaited (a declined or
    /// aborted checkpoint): the checkpoint made is removed.
    abandoned: bool,
}

struct Shared {
    inner: Mutex<Inner>,
    done: Condvar,
    /// Removes an abandoned checkpoint's directory.
    store: Arc<dyn EmbeddedStore>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs the job unless it has started; waits until it is done.
    fn finish(&self) -> MutexGuard<'_, Inner> {
        let mut inner = self.lock();
        match std::mem::replace(&mut inner.making, Making::Running) {
            Making::Ready(mut job) => {
                drop(inner);
                let ran = catch_unwind(AssertUnwindSafe(|| job.run()));
                inner = self.lock();
                inner.making = match ran {
                    Ok((written, made)) => {
                        // Nobody will upload it.
                        if inner.abandoned {
                            self.discard(&made);
                        }
                        Making::Done {
                            db: Some(job.db),
                            made: (!inner.abandoned).then_some(made),
                            written,
                        }
                    }
                    Err(_) => {
                        let panicked = StateError::Store("the write-back panicked".into());
                        Making::Done {
                            db: None,
                            written: Err(panicked.clone()),
                            made: Some(Err(panicked)),
                        }
                    }
                };
                self.done.notify_all();
            }
            started => inner.making = started,
        }
        self.done
            .wait_while(inner, |i| matches!(i.making, Making::Running))
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes the directory of a made checkpoint.
    fn discard(&self, made: &Result<NativeCheckpoint, StateError>) {
        if let Ok(native) = made {
            self.store.remove_checkpoint(&native.dir);
        }
    }
}

/// A native checkpoint being made: the asynchronous part waits for it.
/// Dropped unwaited, it removes the checkpoint once made.
pub struct PendingNative(Arc<Shared>);

/// The backend's end: its database, away with the job.
pub(super) struct Away(Arc<Shared>);

/// Hands `job` over: the checkpoint's end, and the backend's.
pub(super) fn hand_over(job: Job, store: Arc<dyn EmbeddedStore>) -> (PendingNative, Away) {
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            making: Making::Ready(Box::new(job)),
            abandoned: false,
        }),
        done: Condvar::new(),
        store,
    });
    (PendingNative(shared.clone()), Away(shared))
}

impl PendingNative {
    /// The job, for the shell to run off the subtask's thread (it does
    /// nothing if someone ran it already). Blocks.
    pub fn job(&self) -> impl FnOnce() + Send + 'static {
        let shared = self.0.clone();
        move || drop(shared.finish())
    }

    /// The checkpoint, once made (by running the job here if it has not
    /// started). Blocks: off the runtime's threads.
    pub fn wait(self) -> Result<NativeCheckpoint, StateError> {
        let mut inner = self.0.finish();
        match &mut inner.making {
            Making::Done { made, .. } => made.take().expect("taken once, by its waiter"),
            Making::Ready(_) | Making::Running => unreachable!("finished above"),
        }
    }
}

impl Drop for PendingNative {
    fn drop(&mut self) {
        let mut inner = self.0.lock();
        inner.abandoned = true;
        if let Making::Done { made, .. } = &mut inner.making {
            if let Some(made) = made.take() {
                self.0.discard(&made);
            }
        }
    }
}

impl Away {
    /// The database back (by running the job here if it has not started),
    /// and whether the writes went in; `None` if the job panicked.
    pub(super) fn back(self) -> (Option<Box<dyn Database>>, Result<(), StateError>) {
        let mut inner = self.0.finish();
        match &mut inner.making {
            Making::Done { db, written, .. } => (db.take(), written.clone()),
            Making::Ready(_) | Making::Running => unreachable!("finished above"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::CheckpointId;
    use crate::state::store::checkpoint_dir;
    use crate::testkit::state::whole;
    use crate::testkit::store::MemoryStore;

    /// A job of an empty database in `dir`, and its two ends.
    fn handed(dir: &tempfile::TempDir) -> (PendingNative, Away, std::path::PathBuf) {
        let store: Arc<dyn EmbeddedStore> = Arc::new(MemoryStore::new(dir.path()));
        let db = store.open("op-1-0", whole(), &[], None).unwrap();
        let native = NativeCheckpoint {
            dir: checkpoint_dir(db.working_dir(), CheckpointId(1)),
            key_groups: whole(),
            instance: db.instance(),
            files: Vec::new(),
        };
        let checkpoint = native.dir.clone();
        let job = Job {
            db,
            writes: Vec::new(),
            native,
        };
        let (pending, away) = hand_over(job, store);
        (pending, away, checkpoint)
    }

    #[test]
    fn the_job_runs_once_whoever_comes_to_it_first() {
        let dir = tempfile::tempdir().unwrap();
        // The shell's run, then the backend's and the waiter's.
        let (pending, away, checkpoint) = handed(&dir);
        pending.job()();
        assert!(checkpoint.exists());
        let (db, written) = away.back();
        assert!(db.is_some() && written.is_ok());
        // Made once: a second run would find the directory there and fail.
        assert_eq!(pending.wait().unwrap().dir, checkpoint);
        // The backend first, which runs it itself; the shell's run after
        // does nothing.
        let dir = tempfile::tempdir().unwrap();
        let (pending, away, checkpoint) = handed(&dir);
        let job = pending.job();
        assert!(away.back().1.is_ok());
        job();
        assert_eq!(pending.wait().unwrap().dir, checkpoint);
    }

    #[test]
    fn a_checkpoint_nobody_waits_for_is_removed_once_made() {
        // Dropped before the job ran: whoever runs it removes it.
        let dir = tempfile::tempdir().unwrap();
        let (pending, away, checkpoint) = handed(&dir);
        drop(pending);
        assert!(away.back().0.is_some());
        assert!(!checkpoint.exists());
        // Dropped after: the drop removes it.
        let dir = tempfile::tempdir().unwrap();
        let (pending, away, checkpoint) = handed(&dir);
        pending.job()();
        assert!(checkpoint.exists());
        drop(pending);
        assert!(!checkpoint.exists());
        assert!(away.back().0.is_some());
    }
}
