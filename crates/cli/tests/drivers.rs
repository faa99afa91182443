//! Drivers of one job as separate `tidemark run` processes, stopped and
//! killed as a machine would stop or kill them: elected through a real
//! ZooKeeper server (`cargo xtask test` starts one), one leading and the
//! others standing by; and without an election, a run paused past its
//! lease on the job directory.

use tidemark_testkit as common;

use common::{assert_updates_exactly_once, committed_lines, completed_checkpoints};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const RECORDS: u64 = 300_000;
const KEYS: u64 = 2_000;
const SEED: u64 = 9;

/// One `tidemark run` driver, its stderr in a file the test reads while
/// it runs.
struct Driver {
    child: Child,
    stderr: PathBuf,
    stdout: PathBuf,
}

/// One job's drivers: its nodes in ZooKeeper, and the drivers' logs.
struct Job {
    quorum: String,
    cluster: String,
    logs: tempfile::TempDir,
    /// The test's own client of the server, to read what the drivers
    /// wrote; its session lives on the runtime.
    zookeeper: zookeeper_client::Client,
    runtime: tokio::runtime::Runtime,
}

impl Job {
    /// A job no earlier run used; `None` skips the test.
    fn new(test: &str) -> Option<Job> {
        let quorum = common::zookeeper::quorum()?;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let zookeeper = runtime
            .block_on(zookeeper_client::Client::connect(&quorum))
            .unwrap();
        Some(Job {
            quorum,
            cluster: format!("{test}-{}", now.unwrap().as_nanos()),
            logs: tempfile::tempdir().unwrap(),
            zookeeper,
            runtime,
        })
    }

    /// Waits until ZooKeeper records a checkpoint of the job's, and
    /// returns the record.
    fn await_pointer(&self) -> serde_json::Value {
        let path = format!("/tidemark/{}/checkpoints/latest", self.cluster);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.runtime.block_on(self.zookeeper.get_data(&path)) {
                Ok((bytes, _)) => return serde_json::from_slice(&bytes).unwrap(),
                Err(zookeeper_client::Error::NoNode) => {
                    assert!(Instant::now() < deadline, "{path} never written");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("{path}: {e}"),
            }
        }
    }

    /// The nodes of the candidates for leading the job.
    fn candidates(&self) -> usize {
        let dir = format!("/tidemark/{}/leader", self.cluster);
        let children = self.runtime.block_on(self.zookeeper.list_children(&dir));
        children.map_or(0, |c| c.len())
    }

    /// Starts driver `identity`, with these checkpoints and output.
    fn driver(&self, identity: &str, checkpoints: &Path, output: &Path) -> Driver {
        let election = [
            "--zookeeper-session-timeout=2s".to_string(),
            format!("--zookeeper-quorum={}", self.quorum),
            format!("--cluster-id={}", self.cluster),
            format!("--leader-identity={identity}"),
        ];
        Driver::start(identity, &election, checkpoints, output, self.logs.path())
    }
}

impl Driver {
    /// Starts `tidemark run wordcount` with `extra` flags, its logs in
    /// `logs` under `name`.
    fn start(
        name: &str,
        extra: &[String],
        checkpoints: &Path,
        output: &Path,
        logs: &Path,
    ) -> Driver {
        let (stderr, stdout) = (
            logs.join(format!("{name}.err")),
            logs.join(format!("{name}.out")),
        );
        let child = Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args([
                "run",
                "wordcount",
                &format!("--records={RECORDS}"),
                &format!("--keys={KEYS}"),
                &format!("--seed={SEED}"),
                "--parallelism=2",
                "--rate=30000",
                "--emit=updates",
                "--json",
                "--checkpoint-interval=100ms",
                &format!("--checkpoint-dir={}", checkpoints.display()),
                &format!("--output={}", output.display()),
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("the binary runs");
        Driver {
            child,
            stderr,
            stdout,
        }
    }

    fn said(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits until its stderr says `words`.
    fn await_saying(&mut self, words: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.said().contains(words) {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("ended ({status}) before saying {words:?}:\n{}", self.said());
            }
            assert!(
                Instant::now() < deadline,
                "never said {words:?}:\n{}",
                self.said()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill {signal}");
    }

    /// Waits for it to end; its status and its JSON report, if it gave one.
    fn wait(mut self) -> (ExitStatus, String, Option<serde_json::Value>) {
        let status = self.child.wait().unwrap();
        let stdout = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        let report = stdout
            .lines()
            .last()
            .and_then(|l| serde_json::from_str(l).ok());
        (status, self.said(), report)
    }
}

/// The id of the newest checkpoint with `_metadata` below `dir`.
fn newest_checkpoint(dir: &Path) -> u64 {
    let mut newest = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let id = name.strip_prefix("chk-").and_then(|n| n.parse().ok());
        newest = newest.max(match id {
            Some(id) if path.join("_metadata").is_file() => id,
            _ if path.is_dir() => newest_checkpoint(&path),
            _ => 0,
        });
    }
    newest
}

/// Waits until `dir` holds output committed by a checkpoint.
fn await_committed(dir: &Path, checkpoints: &Path, driver: &mut Driver) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while committed_lines(dir).is_empty() || completed_checkpoints(checkpoints) == 0 {
        assert!(
            driver.child.try_wait().unwrap().is_none(),
            "{}",
            driver.said()
        );
        assert!(Instant::now() < deadline, "nothing committed in a minute");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_stopped_leader_is_replaced_and_once_resumed_writes_nothing() {
    let Some(job) = Job::new("stopped") else {
        return;
    };
    let (checkpoints, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let start = |identity| job.driver(identity, checkpoints.path(), output.path());
    let mut a = start("a");
    a.await_saying("a leads through");
    let mut b = start("b");
    b.await_saying("b is a candidate");
    await_committed(output.path(), checkpoints.path(), &mut a);
    assert!(
        !b.said().contains("b leads"),
        "two lead at once:\n{}",
        b.said()
    );

    // The leader stops answering past its session timeout: b leads, and
    // restores a's latest checkpoint.
    a.signal("-STOP");
    b.await_saying("b leads through");
    let taken = newest_checkpoint(checkpoints.path());
    let deadline = Instant::now() + Duration::from_secs(60);
    while newest_checkpoint(checkpoints.path()) <= taken {
        assert!(Instant::now() < deadline, "b completed no checkpoint");
        std::thread::sleep(Duration::from_millis(10));
    }
    // a resumes while b runs the job: its session is gone, its job is
    // fenced, and it stands by until b has run the job to its end.
    a.signal("-CONT");
    let (status, said, report) = b.wait();
    assert!(status.success(), "{said}");
    let report = report.expect("b's report");
    assert!(
        report["restored_checkpoint"].as_u64().is_some(),
        "b started afresh instead of restoring a's checkpoint: {report}"
    );
    let (status, said, _) = a.wait();
    assert!(status.success(), "{said}");
    assert!(said.contains("lost the leadership"), "{said}");
    assert!(
        said.contains("already ran to its end under leader b"),
        "{said}"
    );
    assert_updates_exactly_once(output.path(), RECORDS, KEYS, SEED, "a stopped leader");
}

#[test]
fn a_leader_that_lacks_the_checkpoint_zookeeper_names_refuses_to_run() {
    let Some(job) = Job::new("lacking") else {
        return;
    };
    let (checkpoints, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = job.driver("a", checkpoints.path(), output.path());
    a.await_saying("a leads through");
    await_committed(output.path(), checkpoints.path(), &mut a);
    // Once ZooKeeper has a checkpoint of a's recorded, a dies.
    let recorded = job.await_pointer();
    let named = PathBuf::from(recorded["path"].as_str().unwrap());
    let id = recorded["checkpoint"].as_u64().unwrap();
    assert!(named.ends_with(format!("chk-{id}")), "{recorded}");
    assert!(named.starts_with(checkpoints.path()), "{recorded}");
    // Completed: the newest there is it or a later one.
    assert!(id <= newest_checkpoint(checkpoints.path()), "{recorded}");
    a.signal("-KILL");
    a.wait();

    // A driver pointed at other, empty storage would start the job
    // afresh: it leads once a's session expired, and refuses.
    let (elsewhere, stray) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (status, said, _) = job.driver("b", elsewhere.path(), stray.path()).wait();
    assert!(!status.success(), "{said}");
    assert!(said.contains("as the job's latest"), "{said}");
    assert!(
        said.contains(&checkpoints.path().display().to_string()),
        "{said}"
    );
    assert!(committed_lines(stray.path()).is_empty());

    // A driver with the job's storage restores it and ends it exactly once.
    let (status, said, report) = job.driver("c", checkpoints.path(), output.path()).wait();
    assert!(status.success(), "{said}");
    assert!(report.unwrap()["restored_checkpoint"].as_u64().is_some());
    assert_updates_exactly_once(output.path(), RECORDS, KEYS, SEED, "a killed leader");

    // The job is finished: another driver does not run it again.
    let again = tempfile::tempdir().unwrap();
    let (status, said, _) = job.driver("d", checkpoints.path(), again.path()).wait();
    assert!(status.success(), "{said}");
    assert!(
        said.contains("already ran to its end under leader c"),
        "{said}"
    );
    assert!(committed_lines(again.path()).is_empty());
}

#[test]
fn a_standby_whose_session_expired_contends_again_and_takes_over() {
    let Some(job) = Job::new("standby") else {
        return;
    };
    let (checkpoints, output) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = job.driver("a", checkpoints.path(), output.path());
    a.await_saying("a leads through");
    let mut b = job.driver("b", checkpoints.path(), output.path());
    b.await_saying("b is a candidate");
    let deadline = Instant::now() + Duration::from_secs(60);
    while job.candidates() < 2 {
        assert!(Instant::now() < deadline, "b never contended");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The standby is paused until ZooKeeper expires its session and
    // deletes its node.
    b.signal("-STOP");
    while job.candidates() > 1 {
        assert!(Instant::now() < deadline, "b's session never expired");
        std::thread::sleep(Duration::from_millis(20));
    }
    b.signal("-CONT");
    b.await_saying("contending again");
    await_committed(output.path(), checkpoints.path(), &mut a);
    a.signal("-KILL");
    a.wait();
    let (status, said, report) = b.wait();
    assert!(status.success(), "{said}");
    assert!(said.contains("b leads through"), "{said}");
    assert!(report.unwrap()["restored_checkpoint"].as_u64().is_some());
    assert_updates_exactly_once(output.path(), RECORDS, KEYS, SEED, "a standby paused");
}

/// Without an election, the job directory's lease alone fences: a run
/// paused past its time to live loses the directory to a run that
/// restores its checkpoint, and once resumed writes nothing and stops at
/// once, saying why.
#[test]
fn a_run_paused_past_its_lease_is_fenced_once_resumed() {
    let (checkpoints, output, logs) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let ttl = ["--lease-ttl=2s".to_string()];
    let mut a = Driver::start("a", &ttl, checkpoints.path(), output.path(), logs.path());
    await_committed(output.path(), checkpoints.path(), &mut a);
    a.signal("-STOP");
    // Held while it lasts, though nothing renews it.
    let restore = [ttl[0].clone(), "--restore=latest".to_string()];
    let (status, said, _) = Driver::start(
        "early",
        &restore,
        checkpoints.path(),
        output.path(),
        logs.path(),
    )
    .wait();
    assert!(
        !status.success() && said.contains("is in use by run"),
        "{said}"
    );
    std::thread::sleep(Duration::from_secs(3));
    let (status, said, report) = Driver::start(
        "b",
        &restore,
        checkpoints.path(),
        output.path(),
        logs.path(),
    )
    .wait();
    assert!(status.success(), "{said}");
    assert!(said.contains("expired"), "{said}");
    assert!(report.unwrap()["restored_checkpoint"].as_u64().is_some());
    let finished = newest_checkpoint(checkpoints.path());
    a.signal("-CONT");
    let (status, said, _) = a.wait();
    assert!(!status.success(), "{said}");
    assert!(said.contains("no longer holds"), "{said}");
    // At once, not after restarts that could not mend it.
    assert!(!said.contains("gave up after"), "{said}");
    assert_eq!(
        newest_checkpoint(checkpoints.path()),
        finished,
        "a wrote a checkpoint"
    );
    assert_updates_exactly_once(output.path(), RECORDS, KEYS, SEED, "a paused run");
}
