//! One writer per job directory: a run holds a fenced, epoch-numbered lease
//! on its job directory, so that a second run of the same job (started by
//! mistake, or an old run still alive) can neither complete a checkpoint nor
//! delete anything there.
//!
//! A lease is the object `_leases/<epoch>` with the holder's identity and
//! when it last renewed. Taking a directory creates the next epoch's object
//! with an atomic create-if-absent (`PutMode::Create`), so of two runs
//! racing for one epoch exactly one wins. The holder renews every fifth of
//! the lease's time to live, retrying failed renewals, and is fenced,
//! refusing to write `_metadata`, the id counter or to delete, once any
//! newer epoch exists (for good) or while it has not renewed for half the
//! time to live (until a renewal lands): a run that takes an expired lease
//! over waits the whole time to live, so the old holder has stopped writing
//! by then, as long as the two clocks run at about the same speed.
//!
//! [`judge`] decides whether a directory can be taken; it is pure, so every
//! case is a plain test.

use crate::{CheckpointStorage, StorageError};
use bytes::Bytes;
use object_store::{PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use thiserror::Error;
use tidemark_core::checkpoint::lease::LeaseConfig;

/// The directory of leases, relative to the job directory.
pub const LEASES: &str = "_leases";

/// Who holds a job directory, as stored in its lease object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Strictly increases with every run that takes the directory.
    pub epoch: u64,
    /// The run's identity: host, process and a token of its own.
    pub run: String,
    /// The host the run is on.
    pub host: String,
    /// The run's process on that host.
    pub pid: u32,
    /// The process as another one on its machine can look it up; leases
    /// written before it was recorded have none, and only expire.
    #[serde(default)]
    pub process: Option<Process>,
    /// Wall-clock milliseconds since the Unix epoch of the last renewal.
    pub renewed_ms: u64,
    /// Milliseconds after a renewal at which the lease expires.
    pub ttl_ms: u64,
    /// The run ended and gave the directory up.
    pub released: bool,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "run {} (epoch {})", self.run, self.epoch)
    }
}

/// A process as its lease records it: a pid means one process only within
/// one boot of one kernel and one pid namespace, and until it is reused;
/// the start time tells a reused pid apart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// The kernel's boot (`/proc/sys/kernel/random/boot_id`).
    pub boot: String,
    /// Its pid namespace (`/proc/self/ns/pid`): containers on one kernel
    /// share the boot and often the host name, not this.
    pub namespace: String,
    /// Its pid in that namespace.
    pub pid: u32,
    /// When it started, in clock ticks since the boot (`/proc/PID/stat`).
    pub started: u64,
}

impl Process {
    /// This process, where `/proc` tells; elsewhere a lease only expires.
    pub fn current() -> Option<Process> {
        let pid = std::process::id();
        Some(Process {
            boot: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()?
                .trim()
                .to_owned(),
            namespace: std::fs::read_link("/proc/self/ns/pid")
                .ok()?
                .to_string_lossy()
                .into_owned(),
            pid,
            started: match look_up(pid) {
                Lookup::Running(started) => started,
                Lookup::Exited | Lookup::Unknown => return None,
            },
        })
    }

    /// Whether `here` can look this process up: one of the same boot and
    /// pid namespace.
    fn visible_from(&self, here: &Process) -> bool {
        self.boot == here.boot && self.namespace == here.namespace
    }
}

/// What `/proc` says of a pid of this pid namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A process runs, started at this time (clock ticks since the boot).
    Running(u64),
    /// None does, or only a zombie: the process exited.
    Exited,
    /// `/proc` does not say (hidden by `hidepid`, unreadable, unparsable):
    /// the process may run.
    Unknown,
}

/// Looks `pid` up in `/proc/PID/stat`: its state (field 3) and start time
/// (field 22), counted after the command name, which may hold spaces and
/// parentheses.
pub fn look_up(pid: u32) -> Lookup {
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Exited,
        Err(_) => return Lookup::Unknown,
    };
    let mut fields = match stat.rsplit_once(')') {
        Some((_, fields)) => fields.split_whitespace(),
        None => return Lookup::Unknown,
    };
    match (fields.next(), fields.nth(18).map(str::parse)) {
        (Some("Z" | "X"), _) => Lookup::Exited,
        (Some(_), Some(Ok(started))) => Lookup::Running(started),
        _ => Lookup::Unknown,
    }
}

/// What [`judge`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The directory can be taken at this epoch; `from` is the lease it
    /// replaces, with why it may be (released, expired, dead, taken over).
    Take {
        /// The epoch to create.
        epoch: u64,
        /// Why the previous holder no longer counts, if there was one.
        from: Option<(Holder, &'static str)>,
    },
    /// Another run holds it.
    Held(Holder),
}

/// Whether a run in process `here` at wall-clock `now_ms` may take a
/// directory whose newest lease is `newest`: yes if there is none, or it
/// was released, has expired, belongs to a process `here` can look up
/// that is gone (`look_up` says what runs at a pid), or `take_over` says
/// the user knows its run is dead.
pub fn judge(
    newest: Option<&Holder>,
    now_ms: u64,
    here: Option<&Process>,
    look_up: impl Fn(u32) -> Lookup,
    take_over: bool,
) -> Verdict {
    let Some(holder) = newest else {
        return Verdict::Take {
            epoch: 1,
            from: None,
        };
    };
    let why = if holder.released {
        Some("released")
    } else if now_ms >= holder.renewed_ms.saturating_add(holder.ttl_ms) {
        Some("expired")
    } else if gone(holder.process.as_ref(), here, look_up) {
        Some("its process is gone")
    } else if take_over {
        Some("taken over")
    } else {
        None
    };
    match why {
        Some(why) => Verdict::Take {
            epoch: holder.epoch + 1,
            from: Some((holder.clone(), why)),
        },
        None => Verdict::Held(holder.clone()),
    }
}

/// Whether `theirs` is a process `here` can look up, and it no longer
/// runs: its pid is free, a zombie's, or another process's. What `/proc`
/// does not tell counts as running.
fn gone(theirs: Option<&Process>, here: Option<&Process>, look_up: impl Fn(u32) -> Lookup) -> bool {
    match (theirs, here) {
        (Some(theirs), Some(here)) if theirs.visible_from(here) => match look_up(theirs.pid) {
            Lookup::Running(started) => started != theirs.started,
            Lookup::Exited => true,
            Lookup::Unknown => false,
        },
        _ => false,
    }
}

/// Why a directory could not be leased.
#[derive(Debug, Error)]
pub enum LeaseError {
    /// Another live run holds the directory.
    #[error("{dir} is in use by {holder} on host {host}, pid {pid}, renewed {ago:?} ago, expiring in {left:?}; a second run on one job directory is refused. If that run is dead, wait for the lease to expire or take it over (`--take-over-lease`)", host = .holder.host, pid = .holder.pid)]
    Held {
        /// The job directory.
        dir: String,
        /// Who holds it.
        holder: Box<Holder>,
        /// Since its last renewal.
        ago: Duration,
        /// Until it expires.
        left: Duration,
    },
    /// Another run took the same epoch first.
    #[error(
        "{dir} was leased by another run at the same moment (epoch {epoch}); nothing was written"
    )]
    Raced {
        /// The job directory.
        dir: String,
        /// The epoch both wanted.
        epoch: u64,
    },
    /// A lease object does not decode.
    #[error("{path} is not a lease: {problem}")]
    Malformed {
        /// The object.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A run's lease on its job directory, while it holds it.
#[derive(Debug)]
pub struct Lease {
    /// The job directory, unfenced: the lease's own objects.
    storage: CheckpointStorage,
    holder: Mutex<Holder>,
    /// When the last renewal (or the lease) was written.
    renewed: Mutex<Instant>,
}

/// Wall-clock milliseconds since the Unix epoch, as leases record them.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A name no other run has: host, process and a token of this run's.
pub fn run_identity(host: &str, pid: u32) -> String {
    format!("{host}:{pid}:{:016x}", crate::unique_token())
}

/// This machine's name, as a lease records it (in a pod, the pod's name).
pub fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Fails with [`StorageError::Fenced`] once any run newer than the one of
/// `epoch` took `storage`'s directory over: the lease objects are listed,
/// since a takeover deletes the ones before it, so after two takeovers
/// the next epoch's object may be gone while a newer one stands.
pub async fn superseded(storage: &CheckpointStorage, epoch: u64) -> Result<(), StorageError> {
    match current_epoch(storage).await? {
        Some(newer) if newer > epoch => Err(StorageError::Fenced {
            dir: storage.directory(),
            holder: format!("the run of epoch {epoch}"),
            reason: format!("another run took the directory over at epoch {newer}"),
        }),
        _ => Ok(()),
    }
}

/// The epochs of the lease objects of `storage`'s directory, in order.
async fn epochs(storage: &CheckpointStorage) -> Result<Vec<u64>, StorageError> {
    let mut epochs: Vec<u64> = storage
        .list(LEASES)
        .await?
        .iter()
        .filter_map(|p| p.strip_prefix(LEASES)?.strip_prefix('/')?.parse().ok())
        .collect();
    epochs.sort_unstable();
    Ok(epochs)
}

/// The epoch of the run that holds `storage`'s directory (or held it
/// last), if any run took it: what a worker admits attempts by.
pub async fn current_epoch(storage: &CheckpointStorage) -> Result<Option<u64>, StorageError> {
    Ok(epochs(storage).await?.last().copied())
}

fn lease_path(epoch: u64) -> String {
    format!("{LEASES}/{epoch:020}")
}

/// Tries [`Lease::acquire`] makes when storage fails on the way, the
/// first waiting 50 ms and each next twice as long.
const ACQUIRE_TRIES: u32 = 5;

impl Lease {
    /// Leases `storage`'s directory, or says who holds it. Older lease
    /// objects are deleted once the new one is written. A storage call
    /// that fails is tried again a few times: a write that failed may have
    /// landed, and a lease found of this run's own is taken as written.
    pub async fn acquire(
        storage: &CheckpointStorage,
        options: &LeaseConfig,
    ) -> Result<Lease, LeaseError> {
        let storage = storage.unfenced();
        let run = run_identity(&host(), std::process::id());
        let (mut tried, mut wait) = (1, Duration::from_millis(50));
        loop {
            match Self::take(&storage, options, &run).await {
                Err(LeaseError::Storage(e @ StorageError::Io { .. }))
                    if tried < ACQUIRE_TRIES && !e.is_not_found() =>
                {
                    let dir = storage.directory();
                    tracing::warn!("leasing {dir} failed, trying again in {wait:?}: {e}");
                    tokio::time::sleep(wait).await;
                    (tried, wait) = (tried + 1, wait * 2);
                }
                taken => return taken,
            }
        }
    }

    /// One try of [`Lease::acquire`] by `run`.
    async fn take(
        storage: &CheckpointStorage,
        options: &LeaseConfig,
        run: &str,
    ) -> Result<Lease, LeaseError> {
        let epochs = epochs(storage).await?;
        let newest = match epochs.last() {
            Some(&epoch) => Some(Self::read(storage, epoch).await?),
            None => None,
        };
        let now = now_ms();
        let process = Process::current();
        let epoch = match newest.as_ref().filter(|holder| holder.run == run) {
            // An earlier try's write landed: renewed below, as taken.
            Some(mine) => mine.epoch,
            None => Self::judged(storage, newest.as_ref(), now, process.as_ref(), options)?,
        };
        let holder = Holder {
            epoch,
            run: run.to_owned(),
            host: host(),
            pid: std::process::id(),
            process,
            renewed_ms: now,
            ttl_ms: options.ttl.as_millis().min(u128::from(u64::MAX)) as u64,
            released: false,
        };
        let lease = Lease {
            storage: storage.clone(),
            holder: Mutex::new(holder.clone()),
            renewed: Mutex::new(Instant::now()),
        };
        if newest.is_some_and(|found| found.run == run) {
            lease.write(false).await?;
        } else {
            lease.create(&holder).await?;
        }
        for old in epochs.into_iter().filter(|old| *old < epoch) {
            storage.delete(&lease_path(old)).await?;
        }
        Ok(lease)
    }

    /// The epoch to take the directory at, whose newest lease is `newest`,
    /// or who holds it.
    fn judged(
        storage: &CheckpointStorage,
        newest: Option<&Holder>,
        now: u64,
        here: Option<&Process>,
        options: &LeaseConfig,
    ) -> Result<u64, LeaseError> {
        match judge(newest, now, here, look_up, options.take_over) {
            Verdict::Held(holder) => {
                let expires = holder.renewed_ms.saturating_add(holder.ttl_ms);
                Err(LeaseError::Held {
                    dir: storage.directory(),
                    ago: Duration::from_millis(now.saturating_sub(holder.renewed_ms)),
                    left: Duration::from_millis(expires.saturating_sub(now)),
                    holder: Box::new(holder),
                })
            }
            Verdict::Take { epoch, from } => {
                if let Some((holder, why)) = from.filter(|(_, why)| *why != "released") {
                    tracing::warn!(
                        "taking {} over from {holder} on host {}: {why}",
                        storage.directory(),
                        holder.host
                    );
                }
                Ok(epoch)
            }
        }
    }

    /// Creates `holder`'s lease object, unless another run's of its epoch
    /// exists: of two runs racing for an epoch, one wins.
    async fn create(&self, holder: &Holder) -> Result<(), LeaseError> {
        let storage = &self.storage;
        let path = storage.resolve(&lease_path(holder.epoch))?;
        let create = PutOptions::from(PutMode::Create);
        let bytes = PutPayload::from(encode(holder));
        match storage.store.put_opts(&path, bytes, create).await {
            Ok(_) => {
                let created = &storage.counters.objects_created;
                created.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            // An earlier try's, whose write landed though it failed?
            Err(object_store::Error::AlreadyExists { .. }) => {
                match Self::read(storage, holder.epoch).await? {
                    found if found.run == holder.run => Ok(()),
                    _ => Err(LeaseError::Raced {
                        dir: storage.directory(),
                        epoch: holder.epoch,
                    }),
                }
            }
            Err(source) => Err(StorageError::Io {
                path: path.to_string(),
                source,
            }
            .into()),
        }
    }

    async fn read(storage: &CheckpointStorage, epoch: u64) -> Result<Holder, LeaseError> {
        let path = lease_path(epoch);
        let bytes = storage.get(&path).await?;
        serde_json::from_slice(&bytes).map_err(|e| LeaseError::Malformed {
            path: storage.location(&path),
            problem: e.to_string(),
        })
    }

    /// The holder this lease is.
    pub fn holder(&self) -> Holder {
        self.holder.lock().expect("lease").clone()
    }

    /// The lease's time to live.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.holder().ttl_ms)
    }

    /// Whether this run still holds the directory: it renewed within half
    /// the time to live, and no newer epoch exists. The error names why not.
    pub async fn check(&self) -> Result<(), StorageError> {
        let holder = self.holder();
        let fenced = |reason: String| StorageError::Fenced {
            dir: self.storage.directory(),
            holder: holder.to_string(),
            reason,
        };
        let since = self.renewed.lock().expect("lease").elapsed();
        if since > Duration::from_millis(holder.ttl_ms / 2) {
            return Err(fenced(format!(
                "its lease was last renewed {since:?} ago, past half its time to live"
            )));
        }
        superseded(&self.storage, holder.epoch)
            .await
            .map_err(|e| match e {
                StorageError::Fenced { reason, .. } => fenced(reason),
                e => e,
            })
    }

    /// Renews the lease; fails if a newer run took the directory over (the
    /// only [`StorageError::Fenced`] it returns, and a final one). A lease
    /// that went unrenewed too long, its writes slow or failing, is held
    /// again by this: no run took it meanwhile, and one that does later
    /// fences it on its next check.
    pub async fn renew(&self) -> Result<(), StorageError> {
        // Side by side, so that a renewal takes one slow call, not two. A
        // write that landed after a takeover put back a lease object the
        // taker deleted: it decides nothing, and goes again.
        let epoch = self.holder().epoch;
        let (written, taken) = futures::join!(self.write(false), superseded(&self.storage, epoch));
        if let Err(fenced) = taken {
            if written.is_ok() {
                let _ = self.storage.delete(&lease_path(epoch)).await;
            }
            return Err(fenced);
        }
        written
    }

    /// Gives the directory up: the next run takes it at once.
    pub async fn release(&self) -> Result<(), StorageError> {
        self.check().await?;
        self.write(true).await
    }

    async fn write(&self, released: bool) -> Result<(), StorageError> {
        let written = Instant::now();
        let holder = {
            let mut holder = self.holder.lock().expect("lease");
            holder.renewed_ms = now_ms();
            holder.released = released;
            holder.clone()
        };
        // A rewrite of the object `create` made: no object is created.
        self.storage
            .write(&lease_path(holder.epoch), encode(&holder))
            .await?;
        *self.renewed.lock().expect("lease") = written;
        Ok(())
    }
}

fn encode(holder: &Holder) -> Bytes {
    serde_json::to_vec_pretty(holder)
        .expect("a lease is plain data")
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tidemark_core::model::ids::JobId;

    /// Process 7 of boot `boot`, pid namespace `namespace`, started at 50.
    fn process(boot: &str, namespace: &str) -> Process {
        Process {
            boot: boot.into(),
            namespace: namespace.into(),
            pid: 7,
            started: 50,
        }
    }

    fn holder(renewed_ms: u64) -> Holder {
        Holder {
            epoch: 4,
            run: "a:7:1".into(),
            host: "a".into(),
            pid: 7,
            process: Some(process("boot", "pid:[1]")),
            renewed_ms,
            ttl_ms: 1_000,
            released: false,
        }
    }

    #[test]
    fn a_live_lease_is_held_and_anything_else_is_taken_at_the_next_epoch() {
        let here = process("boot", "pid:[1]");
        let here = Some(&here);
        let live = |_| Lookup::Running(50);
        let take = |why| Verdict::Take {
            epoch: 5,
            from: Some((holder(100), why)),
        };
        assert_eq!(
            judge(None, 0, here, live, false),
            Verdict::Take {
                epoch: 1,
                from: None
            }
        );
        assert_eq!(
            judge(Some(&holder(100)), 1_099, here, live, false),
            Verdict::Held(holder(100))
        );
        assert_eq!(
            judge(Some(&holder(100)), 1_100, None, live, false),
            take("expired")
        );
        assert_eq!(
            judge(Some(&holder(100)), 500, None, live, true),
            take("taken over")
        );
        let released = Holder {
            released: true,
            ..holder(100)
        };
        assert!(matches!(
            judge(Some(&released), 0, None, live, false),
            Verdict::Take { epoch: 5, .. }
        ));
        let forever = Holder {
            ttl_ms: u64::MAX,
            ..holder(100)
        };
        assert!(matches!(
            judge(Some(&forever), u64::MAX - 1, None, live, false),
            Verdict::Held(_)
        ));
    }

    /// A holder's process is judged gone only where its pid means it: on
    /// the same boot and in the same pid namespace, with its pid free or
    /// reused by a process that started at another time. Containers that
    /// share a kernel (and a host name) but not a pid namespace cannot
    /// see each other's processes, and wait for expiry.
    #[test]
    fn a_holder_is_gone_only_where_its_pid_can_be_looked_up() {
        let held = |here: &Process, found: Lookup| {
            judge(Some(&holder(100)), 500, Some(here), |_| found, false)
        };
        let gone = Verdict::Take {
            epoch: 5,
            from: Some((holder(100), "its process is gone")),
        };
        let same = process("boot", "pid:[1]");
        assert_eq!(held(&same, Lookup::Running(50)), Verdict::Held(holder(100)));
        assert_eq!(held(&same, Lookup::Exited), gone, "its pid is free");
        assert_eq!(held(&same, Lookup::Running(51)), gone, "its pid was reused");
        // What /proc hides (hidepid) may run.
        assert_eq!(held(&same, Lookup::Unknown), Verdict::Held(holder(100)));
        for elsewhere in [process("boot", "pid:[2]"), process("reboot", "pid:[1]")] {
            for found in [Lookup::Exited, Lookup::Running(51)] {
                assert_eq!(
                    held(&elsewhere, found),
                    Verdict::Held(holder(100)),
                    "{elsewhere:?}"
                );
            }
        }
        let unrecorded = Holder {
            process: None,
            ..holder(100)
        };
        assert_eq!(
            judge(
                Some(&unrecorded),
                500,
                Some(&same),
                |_| Lookup::Exited,
                false
            ),
            Verdict::Held(unrecorded.clone())
        );
        assert_eq!(
            judge(Some(&holder(100)), 500, None, |_| Lookup::Exited, false),
            Verdict::Held(holder(100))
        );
    }

    /// What `/proc` says of this process, of a child started after it,
    /// of that child as a zombie, and once it is reaped.
    #[test]
    fn processes_are_looked_up_by_start_time_and_exited_ones_found_gone() {
        let me = Process::current().expect("/proc on Linux");
        assert_eq!(look_up(me.pid), Lookup::Running(me.started));
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = child.id();
        let Lookup::Running(started) = look_up(pid) else {
            panic!("a running child is found");
        };
        assert!(started >= me.started, "a child starts after its parent");
        let theirs = Process {
            pid,
            started,
            ..me.clone()
        };
        assert!(!gone(Some(&theirs), Some(&me), look_up));
        let other = Process {
            started: started + 1,
            ..theirs.clone()
        };
        assert!(gone(Some(&other), Some(&me), look_up), "its pid, reused");
        // Exited but not reaped: a zombie, which is gone.
        while look_up(pid) != Lookup::Exited {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(gone(Some(&theirs), Some(&me), look_up));
        child.wait().unwrap();
        assert!(gone(Some(&theirs), Some(&me), look_up));
        // A lease written before processes were recorded still reads.
        let old = r#"{"epoch":2,"run":"h:7:1","host":"h","pid":7,"renewed_ms":5,"ttl_ms":30000,"released":false}"#;
        let holder: Holder = serde_json::from_str(old).unwrap();
        assert_eq!(holder.process, None);
    }

    #[tokio::test]
    async fn a_second_lease_is_refused_naming_the_holder_and_a_taken_over_one_is_fenced() {
        let storage = CheckpointStorage::open("memory://", JobId(3)).unwrap();
        let first = Lease::acquire(&storage, &LeaseConfig::default())
            .await
            .unwrap();
        first.renew().await.unwrap();
        let err = Lease::acquire(&storage, &LeaseConfig::default())
            .await
            .unwrap_err();
        assert!(matches!(err, LeaseError::Held { ref holder, .. } if **holder == first.holder()));
        assert!(err.to_string().contains(&first.holder().run), "{err}");

        let take_over = LeaseConfig {
            take_over: true,
            ..LeaseConfig::default()
        };
        let second = Lease::acquire(&storage, &take_over).await.unwrap();
        assert_eq!(second.holder().epoch, first.holder().epoch + 1);
        let fenced = first.check().await.unwrap_err();
        assert!(
            fenced.to_string().contains("took the directory over"),
            "{fenced}"
        );
        assert!(first.renew().await.is_err());
        assert!(first.release().await.is_err());
        second.check().await.unwrap();
        assert_eq!(
            storage.list(LEASES).await.unwrap(),
            [lease_path(second.holder().epoch)],
            "older leases are deleted"
        );

        second.release().await.unwrap();
        let third = Lease::acquire(&storage, &LeaseConfig::default())
            .await
            .unwrap();
        assert_eq!(third.holder().epoch, second.holder().epoch + 1);
    }

    #[tokio::test]
    async fn a_lease_not_renewed_for_half_its_time_to_live_is_fenced() {
        let storage = CheckpointStorage::open("memory://", JobId(3)).unwrap();
        let options = LeaseConfig {
            ttl: Duration::ZERO,
            take_over: false,
        };
        let lease = Lease::acquire(&storage, &options).await.unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let err = lease.check().await.unwrap_err();
        assert!(
            err.to_string().contains("past half its time to live"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn two_takeovers_in_a_row_still_fence_the_first_holder() {
        let storage = CheckpointStorage::open("memory://", JobId(5)).unwrap();
        let take_over = LeaseConfig {
            take_over: true,
            ..LeaseConfig::default()
        };
        let first = Lease::acquire(&storage, &LeaseConfig::default())
            .await
            .unwrap();
        let _second = Lease::acquire(&storage, &take_over).await.unwrap();
        let third = Lease::acquire(&storage, &take_over).await.unwrap();
        // The second's object, the epoch after the first's, is gone.
        assert_eq!(storage.list(LEASES).await.unwrap(), [lease_path(3)]);
        for fenced in [first.check().await, first.renew().await] {
            let err = fenced.unwrap_err();
            assert!(err.to_string().contains("at epoch 3"), "{err}");
        }
        third.check().await.unwrap();
    }

    #[tokio::test]
    async fn a_lease_unrenewed_for_too_long_holds_again_once_a_renewal_lands() {
        let storage = CheckpointStorage::open("memory://", JobId(6)).unwrap();
        let options = LeaseConfig {
            ttl: Duration::from_secs(2),
            take_over: false,
        };
        let lease = Lease::acquire(&storage, &options).await.unwrap();
        std::thread::sleep(Duration::from_millis(1_100));
        assert!(lease.check().await.is_err(), "past half its time to live");
        // No run took the directory meanwhile: the renewal holds it again.
        lease.renew().await.unwrap();
        lease.check().await.unwrap();
    }

    #[tokio::test]
    async fn a_run_that_lost_its_lease_deletes_nothing_of_a_batch() {
        let storage = CheckpointStorage::open("memory://", JobId(4)).unwrap();
        let paths: Vec<String> = (0..20).map(|i| format!("chk-1/object-{i}")).collect();
        for path in &paths {
            storage.put(path, Bytes::from_static(b"x")).await.unwrap();
        }
        let first = Arc::new(
            Lease::acquire(&storage, &LeaseConfig::default())
                .await
                .unwrap(),
        );
        let fenced = storage.fenced(first.clone());
        let (kept, gone) = paths.split_at(10);
        let failed = fenced.delete_many(gone.to_vec()).await.unwrap();
        assert!(failed.is_empty(), "{failed:?}");
        let take_over = LeaseConfig {
            take_over: true,
            ..LeaseConfig::default()
        };
        let _second = Lease::acquire(&storage, &take_over).await.unwrap();
        let err = fenced.delete_many(kept.to_vec()).await.unwrap_err();
        assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
        assert_eq!(storage.list("chk-1").await.unwrap(), kept);
    }
}
