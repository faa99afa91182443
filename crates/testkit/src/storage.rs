//! Where a test run keeps its checkpoints (local files, memory or S3), and
//! what storage holds after the run against what the retained checkpoints'
//! metadata references, listed through object_store so that the same checks
//! hold on every store.

use std::collections::BTreeSet;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tidemark_actors::runtime::job_id;
use tidemark_cli::Topology;
use tidemark_core::checkpoint::CompletedCheckpoint;
use tidemark_storage::CheckpointStorage;

/// `s3://bucket/prefix` under which S3 test runs keep their checkpoints,
/// with the client's settings in the usual `AWS_*` variables.
const TEST_S3: &str = "TIDEMARK_TEST_S3";
/// Set (to anything but `0`) where the S3 cases must run, as in CI.
const REQUIRE_S3: &str = "TIDEMARK_REQUIRE_S3";

/// One runtime drives every storage call of the tests, so that the S3
/// client's pooled connections outlive each call.
static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
});

pub fn block_on<F: Future>(future: F) -> F::Output {
    RUNTIME.block_on(future)
}

/// A name no other run of the tests uses, on a store that may outlive them.
fn unique(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{name}-{}-{nanos}-{n}", std::process::id())
}

/// The wordcount job's directory under a checkpoint storage URL, opened as
/// the runtime opens it.
pub fn open(url: &str) -> CheckpointStorage {
    CheckpointStorage::open(url, job_id(Topology::Wordcount.job_name()))
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// Checkpoint storage for one test run: `url` goes to `--checkpoint-dir`,
/// `storage` looks at what the run left there.
pub struct TestStorage {
    pub url: String,
    pub storage: CheckpointStorage,
    _dir: Option<tempfile::TempDir>,
}

impl TestStorage {
    pub fn local() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().to_str().unwrap().to_owned();
        TestStorage {
            storage: open(&url),
            url,
            _dir: Some(dir),
        }
    }

    /// A named in-memory store, held open here so that the job's storage and
    /// this one are the same store.
    pub fn memory() -> Self {
        let url = format!("memory://{}", unique("test"));
        TestStorage {
            storage: open(&url),
            url,
            _dir: None,
        }
    }

    /// A fresh prefix under `TIDEMARK_TEST_S3`. Without it, `None` after a
    /// skip message on stderr (not captured by the test harness), unless
    /// `TIDEMARK_REQUIRE_S3` says the S3 cases must run: then the test fails,
    /// as it does when no server answers.
    pub fn s3(test: &str) -> Option<Self> {
        let required = std::env::var(REQUIRE_S3).is_ok_and(|v| !v.is_empty() && v != "0");
        let Ok(base) = std::env::var(TEST_S3) else {
            assert!(
                !required,
                "{REQUIRE_S3} is set but {TEST_S3} is not: {test} cannot run against S3"
            );
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test} against S3: set {TEST_S3}=s3://bucket/prefix and the AWS_* variables (.ci/run starts a local server)"
            );
            return None;
        };
        let url = format!("{}/{}", base.trim_end_matches('/'), unique(test));
        let storage = open(&url);
        let probe = block_on(async {
            tokio::time::timeout(Duration::from_secs(20), storage.objects()).await
        });
        match probe {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("{TEST_S3}={base}: listing through S3 failed: {e}"),
            Err(_) => panic!("{TEST_S3}={base}: no S3 server answered within 20 s"),
        }
        Some(TestStorage {
            url,
            storage,
            _dir: None,
        })
    }
}

/// The job's directory: the only entry of a local checkpoint root.
pub fn job_dir(root: &Path) -> PathBuf {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries.remove(0)
}

/// Every object of the job directory, relative to it.
pub fn objects(storage: &CheckpointStorage) -> BTreeSet<String> {
    block_on(storage.objects())
        .unwrap()
        .into_iter()
        .map(|o| o.path)
        .collect()
}

/// The completed checkpoints in the job directory, oldest first.
pub fn retained(storage: &CheckpointStorage) -> Vec<CompletedCheckpoint> {
    block_on(async {
        let mut checkpoints = Vec::new();
        for id in storage.completed_ids().await.unwrap() {
            checkpoints.push(storage.read_metadata(id).await.unwrap());
        }
        checkpoints
    })
}

/// Storage holds exactly the id counter, the retained checkpoints' metadata
/// and the objects they reference: the state of aborted, subsumed and
/// abandoned checkpoints is gone, and nothing referenced is missing.
pub fn assert_storage_is_exactly_the_retained_checkpoints(
    storage: &CheckpointStorage,
    context: &str,
) -> Vec<CompletedCheckpoint> {
    let (checkpoints, referenced) = retained_objects(storage);
    assert_eq!(objects(storage), referenced, "{context}");
    checkpoints
}

/// The retained checkpoints, and all that storage should hold for them:
/// the objects they reference, their metadata, the id counter and the
/// newest run's lease.
pub fn retained_objects(
    storage: &CheckpointStorage,
) -> (Vec<CompletedCheckpoint>, BTreeSet<String>) {
    let checkpoints = retained(storage);
    let mut referenced: BTreeSet<String> = checkpoints
        .iter()
        .flat_map(|c| c.subtasks.values())
        .flat_map(|c| c.objects())
        .map(str::to_owned)
        .collect();
    referenced.extend(
        checkpoints
            .iter()
            .map(|c| CheckpointStorage::metadata_path(c.id)),
    );
    referenced.insert(tidemark_storage::COUNTER.into());
    // Where the directory's runs last started, once a run was told.
    if block_on(storage.read_start()).unwrap().is_some() {
        referenced.insert(tidemark_storage::START.into());
    }
    let leases = block_on(storage.list(tidemark_storage::lease::LEASES)).unwrap();
    assert_eq!(leases.len(), 1, "one lease, the newest run's: {leases:?}");
    referenced.extend(leases);
    (checkpoints, referenced)
}
